//! The worker side: start a worker by `fork` or `spawn`, and the loop it runs.
//!
//! A worker reads tasks ([`BatchSpec`]s and the slot to fill) from its task pipe, builds the
//! batch with [`make_batch`], writes it into its slot of the ring and answers on its done pipe.
//! It holds the only write end of that pipe, so the trainer sees end-of-file the moment the
//! worker dies, however it dies. A worker exits when its task pipe closes, and dies with the
//! rank (`PR_SET_PDEATHSIG`).
//!
//! First thing, a worker sets one intra-op thread (libgomp deadlocks in a child forked after
//! the parent's thread pool ran; see REFERENCE.md), unless `data.worker_threads` is `inherit`.
//! It touches CUDA only when the dataset cache lives there (`data.cache_device: cuda`). When
//! building a batch fails (a libtorch error, such as CUDA's in a forked child), the worker sends
//! the error on its done pipe before it exits, and the rank raises it as PyTorch re-raises a
//! worker's exception. Forked workers get the stack-dump thread back (fork copies only the
//! calling thread), so a stuck worker can be asked for its stack like a rank.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{BorrowedFd, FromRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use nix::fcntl::{FcntlArg, FdFlag, fcntl};
use nix::sys::prctl;
use nix::sys::signal::Signal;
use nix::unistd::{ForkResult, Pid, close, fork, getpid, getppid};
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::faults::{Effect, Faults};
use crate::scenario::{Scenario, WorkerThreads};
use crate::{burgers, crash, markers, os};

use super::batch::{BatchSpec, DatasetView, Dims, make_batch};
use super::shm::Mapping;

/// Bytes of a task header: seq, step, seed, first (u64 each), slot, n (u32 each).
const TASK_HEADER: usize = 40;
/// Bytes of a done record: seq (u64), slot (u32), padding.
pub const DONE_RECORD: usize = 16;
/// The seq of an error record: its slot field is the length of the UTF-8 message that follows.
pub const ERROR_SEQ: u64 = u64::MAX;
/// Bytes before a slot's payload: the seq it holds, padded to a cache line.
const SLOT_HEADER: usize = 64;

/// Where the payload of each slot lives in the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotLayout {
    pub dims: Dims,
    pub slot_bytes: usize,
}

impl SlotLayout {
    pub fn new(dims: Dims) -> SlotLayout {
        let payload: usize = dims.batch_floats().iter().sum::<usize>() * 4;
        SlotLayout { dims, slot_bytes: (SLOT_HEADER + payload).div_ceil(64) * 64 }
    }

    /// The four batch tensors of slot `slot`, as views of the ring (no copy).
    ///
    /// # Safety
    /// `ring` must map at least `(slot + 1) · slot_bytes` bytes and outlive the tensors.
    pub unsafe fn views(&self, ring: *mut u8, slot: u32) -> [Tensor; 4] {
        let d = self.dims;
        let shapes: [Vec<i64>; 4] =
            [vec![d.batch, d.grid], vec![d.batch], vec![d.batch, d.queries], vec![d.batch, d.queries]];
        // SAFETY: guaranteed by the caller.
        let base = unsafe { ring.add(slot as usize * self.slot_bytes + SLOT_HEADER) };
        let mut offset = 0;
        shapes.map(|shape| {
            let numel: i64 = shape.iter().product();
            let strides: Vec<i64> = if shape.len() == 2 { vec![shape[1], 1] } else { vec![1] };
            // SAFETY: the slot's payload holds the four tensors back to back.
            let t =
                unsafe { Tensor::from_blob(base.add(offset), &shape, &strides, Kind::Float, Device::Cpu) };
            offset += numel as usize * 4;
            t
        })
    }

    /// The batch number a worker wrote into slot `slot` of `ring`, and the slot's four tensors
    /// copied out of it: into pinned memory for a CUDA `device`, so nothing refers to the ring
    /// after the call. Panics if the slot lies beyond the ring.
    pub fn copy_out(&self, ring: &Mapping, slot: u32, device: Device) -> (u64, [Tensor; 4]) {
        assert!(
            (slot as usize + 1) * self.slot_bytes <= ring.len(),
            "slot {slot} lies beyond the ring's {} bytes",
            ring.len()
        );
        // SAFETY: the slot lies inside `ring` (checked above), which is borrowed for the call; the
        // views are dropped once copied, before it returns. The worker finished writing the slot
        // before it reported it done.
        unsafe {
            let seq = self.seq_cell(ring.ptr(), slot).read_volatile();
            let views = self.views(ring.ptr(), slot);
            (seq, views.map(|t| if device.is_cuda() { t.pin_memory(device) } else { t.copy() }))
        }
    }

    /// The seq number written in the slot's header.
    ///
    /// # Safety
    /// As for [`SlotLayout::views`].
    pub unsafe fn seq_cell(&self, ring: *mut u8, slot: u32) -> *mut u64 {
        // SAFETY: guaranteed by the caller; slots are 64-byte aligned in a page-aligned mapping.
        unsafe { ring.add(slot as usize * self.slot_bytes).cast() }
    }
}

/// Where a spawned worker finds the dataset.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum CacheSource {
    /// `cache: memory`: the trainer's copy is in its own memory, out of reach: build another.
    Regenerate,
    /// `cache: memory` with `cache_device: cuda`: build another and put it on this GPU.
    RegenerateOnGpu(usize),
    /// `cache: disk` or `shm`: map this file read-only, through the inherited descriptor `fd`
    /// (the name may already be gone; `path` is for messages).
    File { path: PathBuf, fd: RawFd },
}

/// Everything a spawned worker needs, passed as JSON on its command line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerConfig {
    pub id: u32,
    pub rank: u32,
    pub scenario: Scenario,
    pub layout: SlotLayout,
    /// The ring's name, for messages; the worker maps it through the inherited `ring_fd`.
    pub ring: PathBuf,
    pub ring_fd: RawFd,
    pub cache: CacheSource,
    pub mean: f64,
    pub std: f64,
    pub task_fd: RawFd,
    pub done_fd: RawFd,
}

/// Encodes a task for the worker's pipe.
pub fn encode_task(spec: &BatchSpec, slot: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(TASK_HEADER + 8 * spec.pairs.len());
    for v in [spec.seq, spec.step, spec.seed, spec.first] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&slot.to_le_bytes());
    out.extend_from_slice(&(spec.pairs.len() as u32).to_le_bytes());
    for p in &spec.pairs {
        out.extend_from_slice(&p.to_le_bytes());
    }
    out
}

/// Reads one task; `None` at end of file (the trainer is done with us).
fn read_task(pipe: &mut File) -> io::Result<Option<(BatchSpec, u32)>> {
    let mut header = [0u8; TASK_HEADER];
    match pipe.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let u64_at = |i: usize| u64::from_le_bytes(header[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    let u32_at = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().expect("4 bytes"));
    let (slot, n) = (u32_at(32), u32_at(36) as usize);
    let mut raw = vec![0u8; 8 * n];
    pipe.read_exact(&mut raw)?;
    let pairs = raw.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
    Ok(Some((BatchSpec { seq: u64_at(0), step: u64_at(1), seed: u64_at(2), first: u64_at(3), pairs }, slot)))
}

/// The worker's loop. Returns the exit status.
fn serve(
    id: u32,
    faults: &Faults,
    view: &DatasetView,
    layout: &SlotLayout,
    ring: *mut u8,
    fds: (RawFd, RawFd),
) -> i32 {
    // SAFETY: the two pipe ends were handed to this worker alone.
    let (mut tasks, mut done) = unsafe { (File::from_raw_fd(fds.0), File::from_raw_fd(fds.1)) };
    loop {
        let (spec, slot) = match read_task(&mut tasks) {
            Ok(Some(task)) => task,
            Ok(None) => return 0,
            Err(e) => {
                eprintln!("ups-doctor: data-loader worker {id}: reading its task pipe failed: {e}");
                return 1;
            }
        };
        if faults.at("worker.batch", spec.step) == Effect::ExitError {
            eprintln!(
                "error: data-loader worker {id}: injected failure: fault `exit_error` at phase `worker.batch` step {}",
                spec.step
            );
            return 1;
        }
        let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let batch = make_batch(view, &layout.dims, &spec);
            // SAFETY: the trainer gave this slot to this task alone; the ring outlives the loop.
            let [u, nu, xq, target] = unsafe { layout.views(ring, slot) };
            for (mut dst, src) in [(u, &batch.u), (nu, &batch.nu), (xq, &batch.xq), (target, &batch.target)] {
                dst.copy_(src);
            }
        }));
        if let Err(payload) = built {
            let text = panic_text(payload.as_ref());
            eprintln!("error: data-loader worker {id} failed to build batch {}: {text}", spec.seq);
            let _ = done.write_all(&error_record(&text));
            return 1;
        }
        // SAFETY: as above; the pipe write below publishes the slot.
        unsafe { layout.seq_cell(ring, slot).write_volatile(spec.seq) };
        let mut record = [0u8; DONE_RECORD];
        record[..8].copy_from_slice(&spec.seq.to_le_bytes());
        record[8..12].copy_from_slice(&slot.to_le_bytes());
        if done.write_all(&record).is_err() {
            return 1; // the trainer is gone
        }
    }
}

/// An error record for the done pipe.
pub fn error_record(text: &str) -> Vec<u8> {
    let text = &text.as_bytes()[..text.len().min(4096)];
    let mut out = vec![0u8; DONE_RECORD];
    out[..8].copy_from_slice(&ERROR_SEQ.to_le_bytes());
    out[8..12].copy_from_slice(&(text.len() as u32).to_le_bytes());
    out.extend_from_slice(text);
    out
}

/// The message of a panic: libtorch's own text when a tch call failed (`Torch("…")`), without
/// its C++ backtrace.
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    let raw = payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".to_string());
    let Some(start) = raw.find("Torch(\"") else {
        return raw;
    };
    let inner = &raw[start + 7..];
    let inner = inner.rfind("\")").map_or(inner, |end| &inner[..end]);
    let text = inner.replace("\\n", "\n").replace("\\\"", "\"");
    text.lines().next().unwrap_or_default().trim().to_string()
}

/// What every worker does first: die with the rank, one intra-op thread, a recognisable name.
fn become_worker(id: u32, threads: WorkerThreads, parent: Pid) {
    let _ = prctl::set_pdeathsig(Signal::SIGKILL);
    if getppid() != parent {
        os::exit_now(1); // the rank died before we could tie ourselves to it
    }
    if threads == WorkerThreads::One {
        tch::set_num_threads(1);
    }
    let name = std::ffi::CString::new(format!("loader-w{id}")).expect("no NUL");
    let _ = prctl::set_name(&name);
    crash::become_loader_worker();
}

/// Everything a forked worker shares with the trainer: the dataset view and the ring mapping.
pub struct ForkContext<'a> {
    pub scenario: &'a Scenario,
    pub rank: u32,
    pub view: &'a DatasetView,
    pub layout: SlotLayout,
    pub ring: *mut u8,
}

/// Forks worker `id`. The child serves through `fds` (task read end, done write end) and never
/// returns into the trainer's code.
pub fn fork_worker(ctx: &ForkContext, id: u32, fds: (RawFd, RawFd)) -> io::Result<u32> {
    let parent = getpid();
    // SAFETY: fork(2), as PyTorch's fork start method does. The child only runs the worker loop and
    // leaves with _exit, so none of the trainer's destructors or atexit handlers run twice.
    match unsafe { fork() } {
        Err(e) => Err(e.into()),
        Ok(ForkResult::Child) => {
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                become_worker(id, ctx.scenario.data.worker_threads, parent);
                close_fds_except(&[0, 1, 2, markers::raw_fd(), fds.0, fds.1]);
                let faults = Faults::for_rank(ctx.scenario, ctx.rank);
                serve(id, &faults, ctx.view, &ctx.layout, ctx.ring, fds)
            }))
            .unwrap_or(101);
            os::exit_now(code)
        }
        Ok(ForkResult::Parent { child }) => Ok(child.as_raw() as u32),
    }
}

/// A forked child holds copies of every descriptor of the trainer: the other workers' pipe ends
/// (which would hide their deaths), sockets to other ranks. It keeps only its own.
fn close_fds_except(keep: &[RawFd]) {
    let fds: Vec<RawFd> = procfs::process::Process::myself()
        .and_then(|me| me.fd())
        .map(|fds| fds.filter_map(|fd| Some(fd.ok()?.fd)).collect())
        .unwrap_or_default();
    // Closing a descriptor this process owns (or an already closed one: EBADF); no Rust object of
    // the forked child uses them (it never returns into the trainer's code).
    for fd in fds.into_iter().filter(|fd| !keep.contains(fd)) {
        let _ = close(fd);
    }
}

/// Starts worker `id` as a new `ups-doctor loader-worker` process.
pub fn spawn_worker(config: &WorkerConfig) -> io::Result<u32> {
    let program = std::env::current_exe()?;
    let parent = getpid();
    let cache_fd = match config.cache {
        CacheSource::File { fd, .. } => fd,
        _ => -1,
    };
    let inherit = [config.task_fd, config.done_fd, markers::raw_fd(), config.ring_fd, cache_fd];
    let json = serde_json::to_string(config).map_err(io::Error::other)?;
    let mut cmd = std::process::Command::new(program);
    cmd.args([OsString::from("loader-worker"), OsString::from(json)]).stdin(std::process::Stdio::null());
    // SAFETY: only async-signal-safe calls (prctl, getppid, fcntl, _exit) between fork and exec;
    // the descriptors are the trainer's, open until the spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            let _ = prctl::set_pdeathsig(Signal::SIGKILL);
            if getppid() != parent {
                os::exit_now(1);
            }
            for fd in inherit.into_iter().filter(|&fd| fd >= 0) {
                fcntl(BorrowedFd::borrow_raw(fd), FcntlArg::F_SETFD(FdFlag::empty()))?;
            }
            Ok(())
        });
    }
    Ok(cmd.spawn()?.id())
}

/// A path that opens the file behind an inherited descriptor, whether or not it still has a name.
fn inherited(fd: RawFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{fd}"))
}

/// The `ups-doctor loader-worker` entry point. Returns the exit status.
pub fn run_spawned(config_json: &str) -> i32 {
    let config: WorkerConfig = match serde_json::from_str(config_json) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: `loader-worker` is started by `ups-doctor train`, not by hand ({e})");
            return 2;
        }
    };
    become_worker(config.id, config.scenario.data.worker_threads, getppid());
    let ring = match Mapping::open(&inherited(config.ring_fd), true) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: data-loader worker {}: cannot map `{}`: {e}", config.id, config.ring.display());
            return 1;
        }
    };
    let dims = config.layout.dims;
    let (u_floats, nu_floats) = dims.cache_floats();
    // The mapping (or the regenerated set) must outlive the view built on it.
    let mut _cache_map = None;
    let view = match &config.cache {
        CacheSource::Regenerate | CacheSource::RegenerateOnGpu(_) => {
            // With `cache_device: cuda` the copy goes to the GPU: this worker initialises CUDA
            // and holds a context and a dataset of its own there.
            let on = match config.cache {
                CacheSource::RegenerateOnGpu(gpu) => {
                    // A spawned worker is a fresh process: libtorch's CUDA part must be loaded here
                    // too, and before any other libtorch call (`manual_seed` below asks for the
                    // CUDA hooks, and libtorch keeps the first answer: "no CUDA"). Seen on an
                    // H200 (scripts/gpu-check.sh): without it the copy failed with "Could not run
                    // 'aten::empty_strided' with arguments from the 'CUDA' backend", and with it
                    // after `manual_seed`, CUDA saw no GPU.
                    let cuda = crate::cuda::probe();
                    if !cuda.available() {
                        eprintln!(
                            "error: data-loader worker {}: the dataset cache is on cuda:{gpu}, but CUDA is unusable \
                             in this worker: {}",
                            config.id,
                            cuda.why_not.as_deref().unwrap_or("no GPU")
                        );
                        return 1;
                    }
                    Device::Cuda(gpu)
                }
                _ => Device::Cpu,
            };
            // REFERENCE.md failure 5: with the cache in the trainer's memory, every spawned
            // worker holds a full copy of the dataset of its own.
            let d = &config.scenario.data;
            tch::manual_seed(config.scenario.train.seed as i64);
            let data = burgers::generate(d.samples.into(), d.grid.into(), d.timesteps.into(), &mut |_, _| {});
            DatasetView {
                frames: data.u.view([dims.samples * dims.timesteps, dims.grid]).to_device(on),
                nu: data.nu_feature.to_device(on),
                mean: data.u_mean,
                std: data.u_std,
            }
        }
        CacheSource::File { path, fd } => {
            let map = match Mapping::open(&inherited(*fd), false) {
                Ok(m) if m.len() >= 4 * (u_floats + nu_floats) => m,
                Ok(m) => {
                    eprintln!("error: dataset cache `{}` holds {} bytes, too few", path.display(), m.len());
                    return 1;
                }
                Err(e) => {
                    eprintln!(
                        "error: data-loader worker {}: cannot map `{}`: {e}",
                        config.id,
                        path.display()
                    );
                    return 1;
                }
            };
            // SAFETY: the mapping holds both arrays and lives until the end of this function.
            let view = unsafe { super::cache::view_of(map.ptr(), dims, config.mean, config.std) };
            _cache_map = Some(map);
            view
        }
    };
    let faults = Faults::for_rank(&config.scenario, config.rank);
    serve(config.id, &faults, &view, &config.layout, ring.ptr(), (config.task_fd, config.done_fd))
}

#[cfg(test)]
mod error_tests {
    use super::*;

    #[test]
    fn a_tch_panic_becomes_libtorchs_first_line() {
        let payload: Box<dyn std::any::Any + Send> = Box::new(
            "called `Result::unwrap()` on an `Err` value: Torch(\"CUDA error: initialization error\\nCUDA kernel \
             errors might be asynchronously reported\\nException raised from ...\")"
                .to_string(),
        );
        assert_eq!(panic_text(payload.as_ref()), "CUDA error: initialization error");
        let plain: Box<dyn std::any::Any + Send> = Box::new("boom");
        assert_eq!(panic_text(plain.as_ref()), "boom");
    }

    #[test]
    fn an_error_record_carries_its_length_after_the_error_seq() {
        let r = error_record("bad");
        assert_eq!(u64::from_le_bytes(r[..8].try_into().unwrap()), ERROR_SEQ);
        assert_eq!(u32::from_le_bytes(r[8..12].try_into().unwrap()), 3);
        assert_eq!(&r[DONE_RECORD..], b"bad");
    }
}
