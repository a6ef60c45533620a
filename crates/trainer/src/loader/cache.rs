//! The dataset cache: the generated trajectories, where `data.cache` says.
//!
//! - `memory`: tensors in the trainer's heap. Forked workers read them through copy-on-write
//!   pages; spawned workers cannot reach them and build a copy each (REFERENCE.md failure 5).
//!   With `data.cache_device: cuda` the tensors live on the rank's GPU instead: the trainer
//!   builds batches there, a forked worker that touches them fails (CUDA cannot be used in a
//!   child forked after CUDA was initialised), and each spawned worker initialises CUDA and puts a
//!   copy of its own on the GPU (REFERENCE.md failure 2's "CUDA-contaminated cache").
//! - `disk`: a file in the temporary folder, mapped by the trainer and every worker.
//! - `shm`: one `/dev/shm` segment, written once by the trainer and mapped read-only by every
//!   worker: one copy for all.
//!
//! A file holds the raw trajectories `(S·T·G)` and then the viscosity feature `(S)`, as `f32`.

use std::io;
use std::path::PathBuf;

use tch::{Device, Kind, Tensor};

use crate::burgers::Trajectories;
use crate::scenario::Cache as CacheKind;

use super::batch::{DatasetView, Dims};
use super::shm::{self, Mapping, Unlink};

/// The cache as the trainer holds it. The view built on it must be dropped first.
pub enum Cache {
    Memory,
    /// The mapping, the guard that removes the file's name (until [`Cache::unlink_name`]), and
    /// an open descriptor of it that spawned workers inherit and map.
    File {
        map: Mapping,
        name: Option<Unlink>,
        path: PathBuf,
        fd: std::fs::File,
    },
}

impl Cache {
    /// Removes the file's name once every process that maps it has it (the trainer and its
    /// workers): the memory stays until the last mapping goes, and nothing is left in `/dev/shm`
    /// or the temporary folder even if every process of the run is SIGKILLed.
    pub fn unlink_name(&mut self) {
        if let Cache::File { name, .. } = self {
            name.take();
        }
    }
}

/// A view of the dataset arrays laid out in a cache file.
///
/// # Safety
/// `ptr` must point to `cache_floats()` floats of trajectories followed by those of the
/// viscosity feature, alive for as long as the view.
pub unsafe fn view_of(ptr: *const u8, dims: Dims, mean: f64, std: f64) -> DatasetView {
    let (u_floats, _) = dims.cache_floats();
    let rows = dims.samples * dims.timesteps;
    // SAFETY: guaranteed by the caller.
    unsafe {
        DatasetView {
            frames: Tensor::from_blob(ptr, &[rows, dims.grid], &[dims.grid, 1], Kind::Float, Device::Cpu),
            nu: Tensor::from_blob(ptr.add(4 * u_floats), &[dims.samples], &[1], Kind::Float, Device::Cpu),
            mean,
            std,
        }
    }
}

/// Puts the generated data where `kind` says; returns the cache, a view of it and its size.
/// `on` is where a `memory` cache's tensors live (`data.cache_device`: the CPU, or the rank's GPU).
pub fn build(
    kind: CacheKind,
    data: &Trajectories,
    dims: Dims,
    rank: u32,
    on: Device,
) -> io::Result<(Cache, DatasetView, u64)> {
    let (u_floats, nu_floats) = dims.cache_floats();
    let bytes = 4 * (u_floats + nu_floats);
    let path = match kind {
        CacheKind::Memory => {
            let view = DatasetView {
                frames: data.u.view([dims.samples * dims.timesteps, dims.grid]).to_device(on),
                nu: data.nu_feature.to_device(on),
                mean: data.u_mean,
                std: data.u_std,
            };
            return Ok((Cache::Memory, view, bytes as u64));
        }
        CacheKind::Shm => shm::segment_path(rank, "cache"),
        CacheKind::Disk => std::env::temp_dir().join(format!("ups-doctor-{}-r{rank}-cache", shm::run_id())),
    };
    let map = Mapping::create(&path, bytes)?;
    let guard = Unlink::new(path.clone());
    let fd = std::fs::File::open(&path)?;
    // SAFETY: the mapping is `bytes` long, exactly the two arrays.
    let mut view = unsafe { view_of(map.ptr(), dims, data.u_mean, data.u_std) };
    view.frames.copy_(&data.u.view([dims.samples * dims.timesteps, dims.grid]));
    view.nu.copy_(&data.nu_feature);
    Ok((Cache::File { map, name: Some(guard), path, fd }, view, bytes as u64))
}

/// A fingerprint of the cache's contents: its 32-bit words (the `f32` bits of the trajectories,
/// then of the viscosity feature, in file order) weighted by `2·i + 1`, summed mod 2⁶⁴. Exact and
/// position-dependent, and cheap to compute with numpy too, so a Python peer can show it holds
/// the same samples (bench/peers/upsdata.py).
pub fn checksum(data: &Trajectories) -> u64 {
    let words = |t: &Tensor| Vec::<f32>::try_from(t.flatten(0, -1)).expect("the cache holds f32 tensors");
    let (u, nu) = (words(&data.u), words(&data.nu_feature));
    u.iter()
        .chain(&nu)
        .enumerate()
        .fold(0u64, |sum, (i, v)| sum.wrapping_add(u64::from(v.to_bits()).wrapping_mul(2 * i as u64 + 1)))
}
