//! NVML through `nvml-wrapper`: GPU facts for `ups-doctor env` and the samples the harness takes
//! during a run. The binary never links `libnvidia-ml.so.1`; nvml-wrapper opens it at run time
//! (libloading), so ups-doctor runs on machines without an NVIDIA driver, where [`Nvml::get`] says
//! why there is no NVML.
//!
//! Theory of operation: the library is opened and initialised once per process (`nvmlInit_v2`)
//! and never shut down (NVML counts initialisations; the process's exit releases it). A
//! [`Sampler`] holds the device handles and, on GPUs that have them (Hopper and newer), the
//! previous GPM sample per GPU: each [`Sampler::sample`] takes a new GPM sample and asks NVML for
//! the metrics between it and the previous one, so SM activity covers exactly the time between two
//! samples. The legacy "utilization" counter only says whether *a* kernel was running in NVML's
//! own sampling window (1/6 s to 1 s), so a kernel that spins (an NCCL collective waiting for a
//! peer) reads as 100 % busy; GPM's SM activity is the share of SMs that were busy.
//!
//! Running processes are read with the first-generation call
//! (`nvmlDeviceGetComputeRunningProcesses`, 16-byte records) through `nvml-wrapper-sys`: the
//! wrapper only offers `_v3` (and `_v2` behind a feature), and `_v3` changed its record size
//! between driver releases without a version bump (see nvitop #79 and #226).
//!
//! Everything here only reads; nothing changes GPU state.

use std::ffi::OsStr;
use std::sync::OnceLock;

use nvml_wrapper::Device;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError as Raw;
use nvml_wrapper::gpm::{GpmSample, gpm_metrics_get};
use nvml_wrapper_sys::bindings::{
    nvmlProcessInfo_v1_t, nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE, nvmlReturn_enum_NVML_SUCCESS,
};
use serde::{Deserialize, Serialize};
pub use ups_doctor_core::schema::{DriverInfo, GpuInfo};

/// Names the NVML library to open instead of `libnvidia-ml.so.1` (a full path).
pub const NVML_LIB_ENV: &str = "UPS_DOCTOR_NVML_LIB";
/// The driver's own name for NVML. nvml-wrapper's default, `libnvidia-ml.so`, is the development
/// symlink, which a machine with only the driver installed does not have.
const SONAME: &str = "libnvidia-ml.so.1";

/// The GPM metrics read, in the order [`read_gpm`] stores them.
const GPM_METRICS: [GpmMetricId; 4] =
    [GpmMetricId::SmUtil, GpmMetricId::SmOccupancy, GpmMetricId::AnyTensorUtil, GpmMetricId::DramBwUtil];

/// Why there is no NVML to read, or no GPU to sample: each message says which library was tried
/// and what it answered. Clone, because [`Nvml::get`] keeps the outcome for the whole process;
/// the library's own errors are not, so their words are kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NvmlError {
    /// The library the user named in [`NVML_LIB_ENV`] does not load.
    #[error("{NVML_LIB_ENV}=`{name}` cannot be loaded: {why}")]
    NamedNotLoaded { name: String, why: String },
    /// The driver's library is not on this machine.
    #[error("{SONAME} not found: no NVIDIA driver on this machine ({why})")]
    NoDriver { why: String },
    /// A library that loads but is no NVML; `named` when the user named it.
    #[error("{} is not a usable NVML: it has no `nvmlInit_v2` ({why})", library(.name, *.named))]
    NotNvml { name: String, named: bool, why: String },
    /// NVML loads but `nvmlInit_v2` fails (a driver/library mismatch, no permission).
    #[error("NVML cannot be initialised: {why} (nvmlInit_v2 failed)")]
    Init { why: String },
    /// NVML cannot count the GPUs.
    #[error("nvmlDeviceGetCount_v2: {why}")]
    Count { why: String },
    /// NVML works but there is no GPU to sample.
    #[error("NVML sees no GPU")]
    NoGpu,
}

/// How a message names the library: as the user named it, or by its own name.
fn library(name: &str, named: bool) -> String {
    if named { format!("{NVML_LIB_ENV}=`{name}`") } else { name.to_string() }
}

/// The process's NVML, opened and initialised.
pub struct Nvml {
    nvml: nvml_wrapper::Nvml,
}

/// One GPU at one moment. Every field NVML could not give is `None`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuReading {
    pub index: u32,
    /// Percent of NVML's last sampling window in which a kernel ran.
    pub util_percent: Option<u32>,
    /// Percent of that window in which device memory was read or written.
    pub memory_util_percent: Option<u32>,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub sm_clock_mhz: Option<u32>,
    pub power_mw: Option<u32>,
    pub temperature_c: Option<u32>,
    /// `nvmlClocksEventReasons` bit mask (why clocks are below their maximum).
    pub clock_reasons: Option<u64>,
    /// GPM, since the previous sample: percent of SMs busy.
    pub sm_active_percent: Option<f64>,
    pub sm_occupancy_percent: Option<f64>,
    pub tensor_active_percent: Option<f64>,
    pub dram_bw_percent: Option<f64>,
    /// Compute processes on this GPU and the memory each holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<GpuProcess>,
}

/// A process using a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    pub pid: u32,
    /// `None` where the driver does not say (NVML's "not available").
    pub memory_bytes: Option<u64>,
}

impl Nvml {
    /// The process's NVML, opened and initialised on first use; the error says why there is none
    /// (no driver, no permission, …). The outcome is kept for the life of the process.
    pub fn get() -> Result<&'static Nvml, NvmlError> {
        static NVML: OnceLock<Result<Nvml, NvmlError>> = OnceLock::new();
        NVML.get_or_init(|| match std::env::var(NVML_LIB_ENV) {
            Ok(path) if !path.is_empty() => Nvml::open(&path, true),
            _ => Nvml::open(SONAME, false),
        })
        .as_ref()
        .map_err(Clone::clone)
    }

    /// Opens and initialises the NVML at `name`; `explicit` when the user named it.
    fn open(name: &str, explicit: bool) -> Result<Nvml, NvmlError> {
        match nvml_wrapper::Nvml::builder().lib_path(OsStr::new(name)).init() {
            Ok(nvml) => Ok(Nvml { nvml }),
            Err(Raw::LibloadingError(e)) => {
                let why = e.to_string();
                Err(if explicit {
                    NvmlError::NamedNotLoaded { name: name.to_string(), why }
                } else {
                    // libloading's message starts with the name, which the message already says.
                    let why = why.strip_prefix(&format!("{name}: ")).unwrap_or(&why).to_string();
                    NvmlError::NoDriver { why }
                })
            }
            Err(Raw::FailedToLoadSymbol(why)) => {
                Err(NvmlError::NotNvml { name: name.to_string(), named: explicit, why })
            }
            Err(e) => Err(NvmlError::Init { why: e.to_string() }),
        }
    }

    fn devices(&self) -> Result<Vec<(u32, Device<'_>)>, NvmlError> {
        let count = self.nvml.device_count().map_err(|e| NvmlError::Count { why: e.to_string() })?;
        Ok((0..count).filter_map(|i| Some((i, self.nvml.device_by_index(i).ok()?))).collect())
    }

    /// The driver, the CUDA version it provides and its GPUs.
    pub fn driver_info(&self) -> Result<DriverInfo, NvmlError> {
        let driver_version = self.nvml.sys_driver_version().unwrap_or_else(|e| format!("unknown ({e})"));
        let cuda_driver_version =
            self.nvml.sys_cuda_driver_version().ok().map(|v| format!("{}.{}", v / 1000, v % 1000 / 10));
        let gpus = self
            .devices()?
            .into_iter()
            .map(|(index, dev)| GpuInfo {
                index,
                name: dev.name().unwrap_or_default(),
                uuid: dev.uuid().unwrap_or_default(),
                memory_total_bytes: dev.memory_info().map_or(0, |m| m.total),
            })
            .collect();
        Ok(DriverInfo { driver_version, cuda_driver_version, gpus })
    }
}

/// Why GPM metrics are missing, or `None` when the GPU has them.
fn gpm_support(dev: &Device<'_>) -> Option<String> {
    match dev.gpm_support() {
        Ok(true) => None,
        Ok(false) => Some("this GPU has no GPM counters (they need Hopper or newer)".into()),
        Err(Raw::FailedToLoadSymbol(_)) => {
            Some("this NVML has no GPM entry points (driver older than R520)".into())
        }
        Err(e) => Some(format!("nvmlGpmQueryDeviceSupport: {e}")),
    }
}

struct SampledGpu {
    index: u32,
    device: Device<'static>,
    /// `Some` on a GPU with GPM counters: the previous sample, once one was taken.
    gpm: Option<Option<GpmSample<'static>>>,
}

/// Samples every GPU NVML sees. Dropping it frees the GPM samples.
pub struct Sampler {
    nvml: &'static Nvml,
    gpus: Vec<SampledGpu>,
    /// Why SM activity is not measured, per GPU index (GPM unsupported), for the report.
    pub gpm_missing: Vec<(u32, String)>,
}

impl Sampler {
    /// A sampler over every GPU; the error says why there is none to sample.
    pub fn new() -> Result<Sampler, NvmlError> {
        let nvml = Nvml::get()?;
        let mut gpm_missing = Vec::new();
        let gpus = nvml
            .devices()?
            .into_iter()
            .map(|(index, device)| {
                let gpm = match gpm_support(&device) {
                    None => Some(None),
                    Some(why) => {
                        gpm_missing.push((index, why));
                        None
                    }
                };
                SampledGpu { index, device, gpm }
            })
            .collect::<Vec<_>>();
        if gpus.is_empty() {
            return Err(NvmlError::NoGpu);
        }
        Ok(Sampler { nvml, gpus, gpm_missing })
    }

    /// NVML indexes of the GPUs sampled.
    pub fn indexes(&self) -> Vec<u32> {
        self.gpus.iter().map(|g| g.index).collect()
    }

    /// One reading of every GPU.
    pub fn sample(&mut self) -> Vec<GpuReading> {
        let nvml = self.nvml;
        self.gpus.iter_mut().map(|g| read_gpu(nvml, g)).collect()
    }
}

fn read_gpu(nvml: &'static Nvml, g: &mut SampledGpu) -> GpuReading {
    let dev = &g.device;
    let mut r = GpuReading { index: g.index, ..GpuReading::default() };
    if let Ok(util) = dev.utilization_rates() {
        r.util_percent = Some(util.gpu);
        r.memory_util_percent = Some(util.memory);
    }
    if let Ok(mem) = dev.memory_info() {
        r.memory_used_bytes = Some(mem.used);
        r.memory_total_bytes = Some(mem.total);
    }
    r.sm_clock_mhz = dev.clock_info(Clock::SM).ok();
    r.power_mw = dev.power_usage().ok();
    r.temperature_c = dev.temperature(TemperatureSensor::Gpu).ok();
    r.clock_reasons = dev.current_throttle_reasons().ok().map(|reasons| reasons.bits());
    r.processes = running_processes(nvml, dev);
    if let Some(prev) = g.gpm.as_mut() {
        read_gpm(nvml, dev, prev, &mut r);
    }
    r
}

/// The compute processes on `dev` through `nvmlDeviceGetComputeRunningProcesses` (v1, 16-byte
/// records); empty when the driver lacks it or fails. A raw call through nvml-wrapper-sys: the
/// wrapper offers only `_v3`, whose record size changed between drivers (see the module's comment).
fn running_processes(nvml: &Nvml, dev: &Device<'_>) -> Vec<GpuProcess> {
    let Ok(list) = nvml.nvml.lib().nvmlDeviceGetComputeRunningProcesses.as_ref() else {
        return Vec::new();
    };
    // SAFETY: only reads the handle; `dev` outlives its use below, within NVML's lifetime.
    let handle = unsafe { dev.handle() };
    let empty = nvmlProcessInfo_v1_t { pid: 0, usedGpuMemory: 0 };
    let mut infos = vec![empty; 64];
    for _ in 0..3 {
        let mut count = infos.len() as u32;
        // SAFETY: the v1 entry point with its nvml.h signature (nvml-wrapper-sys's binding), a live
        // device handle, and `infos` holding `count` records of the v1 layout.
        let rc = unsafe { list(handle, &mut count, infos.as_mut_ptr()) };
        #[expect(non_upper_case_globals, reason = "bindgen's names for nvml.h's constants")]
        match rc {
            nvmlReturn_enum_NVML_SUCCESS => {
                return infos[..(count as usize).min(infos.len())]
                    .iter()
                    .map(|p| GpuProcess {
                        pid: p.pid,
                        // NVML_VALUE_NOT_AVAILABLE is all ones.
                        memory_bytes: (p.usedGpuMemory != u64::MAX).then_some(p.usedGpuMemory),
                    })
                    .collect();
            }
            nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE => infos = vec![empty; count as usize + 16],
            _ => return Vec::new(),
        }
    }
    Vec::new()
}

fn read_gpm(
    nvml: &'static Nvml,
    dev: &Device<'static>,
    prev: &mut Option<GpmSample<'static>>,
    r: &mut GpuReading,
) {
    let Ok(next) = dev.gpm_sample() else {
        return;
    };
    if let Some(before) = prev.as_ref() {
        if let Ok(results) = gpm_metrics_get(&nvml.nvml, before, &next, &GPM_METRICS) {
            let value = |i: usize| results.get(i)?.as_ref().ok().map(|m| m.value).filter(|v| v.is_finite());
            r.sm_active_percent = value(0);
            r.sm_occupancy_percent = value(1);
            r.tensor_active_percent = value(2);
            r.dram_bw_percent = value(3);
        }
    }
    // The previous sample is freed here (GpmSample's Drop); the new one is the next baseline.
    *prev = Some(next);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v1_process_record_is_nvml_hs_16_bytes() {
        assert_eq!(std::mem::size_of::<nvmlProcessInfo_v1_t>(), 16);
    }

    #[test]
    fn without_a_driver_nvml_says_which_library_is_missing() {
        match Nvml::get() {
            // A GPU machine: the driver answers.
            Ok(nvml) => assert!(!nvml.driver_info().unwrap().driver_version.is_empty()),
            Err(why) => {
                let why = why.to_string();
                assert!(why.contains("libnvidia-ml.so.1") || why.contains(NVML_LIB_ENV), "{why}");
                assert!(Sampler::new().is_err());
            }
        }
    }

    #[test]
    fn a_named_library_that_is_missing_or_not_nvml_is_refused_with_its_name() {
        let Err(why) = Nvml::open("/nonexistent/libnvidia-ml.so.1", true) else {
            panic!("a missing file loaded");
        };
        let why = why.to_string();
        assert!(
            why.starts_with(&format!("{NVML_LIB_ENV}=`/nonexistent/libnvidia-ml.so.1` cannot be loaded: ")),
            "{why}"
        );
        // A real shared library without NVML's entry points (the C library every process has).
        let Err(why) = Nvml::open("libc.so.6", true) else {
            panic!("libc passed for NVML");
        };
        let why = why.to_string();
        assert!(why.contains("`libc.so.6` is not a usable NVML: it has no `nvmlInit_v2`"), "{why}");
    }
}
