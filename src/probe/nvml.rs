//! NVML, loaded at run time: GPU facts for `ups-doctor env` and the samples the harness takes
//! during a run. The binary never links `libnvidia-ml.so.1`; it opens it with `dlopen`, so it runs
//! on machines without an NVIDIA driver, where [`Nvml::get`] says why there is no NVML.
//!
//! Theory of operation: the library is opened and initialised once per process (`nvmlInit_v2`)
//! and never shut down (NVML counts initialisations; the process's exit releases it). A
//! [`Sampler`] holds the device handles and, on GPUs that have them (Hopper and newer), two GPM
//! sample buffers per GPU: each [`Sampler::sample`] takes a new GPM sample and asks NVML for the
//! metrics between it and the previous one, so SM activity covers exactly the time between two
//! samples. The legacy "utilization" counter only says whether *a* kernel was running in NVML's
//! own sampling window (1/6 s to 1 s), so a kernel that spins (an NCCL collective waiting for a
//! peer) reads as 100 % busy; GPM's SM activity is the share of SMs that were busy.
//!
//! Struct layouts follow `nvml.h`. Running processes are read with the first-generation call
//! (`nvmlDeviceGetComputeRunningProcesses`, 16-byte records), because its `_v3` successor changed
//! its record size between driver releases without a version bump (see nvitop #79 and #226).
//!
//! Everything here only reads; nothing changes GPU state.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_ulonglong, c_void};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// Names the NVML library to open instead of `libnvidia-ml.so.1` (a full path).
pub const NVML_LIB_ENV: &str = "UPS_DOCTOR_NVML_LIB";
const SONAME: &str = "libnvidia-ml.so.1";

const NVML_SUCCESS: u32 = 0;
const NVML_ERROR_INSUFFICIENT_SIZE: u32 = 7;
const NVML_CLOCK_SM: c_uint = 1;
const NVML_TEMPERATURE_GPU: c_uint = 0;
const NVML_GPM_METRICS_GET_VERSION: c_uint = 1;
const NVML_GPM_SUPPORT_VERSION: c_uint = 1;
/// `NVML_GPM_METRIC_MAX`: the length of `nvmlGpmMetricsGet_t.metrics`.
const GPM_METRIC_MAX: usize = 98;
/// `NVML_GPM_METRIC_SM_UTIL`: percentage of SMs that were busy.
const GPM_SM_UTIL: c_uint = 2;
/// `NVML_GPM_METRIC_SM_OCCUPANCY`: active warps against the theoretical maximum.
const GPM_SM_OCCUPANCY: c_uint = 3;
/// `NVML_GPM_METRIC_ANY_TENSOR_UTIL`: share of time the SMs ran any tensor-core operation.
const GPM_TENSOR_UTIL: c_uint = 5;
/// `NVML_GPM_METRIC_DRAM_BW_UTIL`: DRAM bandwidth used against the theoretical maximum.
const GPM_DRAM_BW_UTIL: c_uint = 10;

type Device = *mut c_void;
type GpmSample = *mut c_void;

#[repr(C)]
#[derive(Default)]
struct Memory {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

#[repr(C)]
#[derive(Default)]
struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct ProcessInfoV1 {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
}

#[repr(C)]
struct GpmSupport {
    version: c_uint,
    is_supported_device: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct GpmMetricInfo {
    short_name: *const c_char,
    long_name: *const c_char,
    unit: *const c_char,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct GpmMetric {
    metric_id: c_uint,
    nvml_return: u32,
    value: f64,
    info: GpmMetricInfo,
}

#[repr(C)]
struct GpmMetricsGet {
    version: c_uint,
    num_metrics: c_uint,
    sample1: GpmSample,
    sample2: GpmSample,
    metrics: [GpmMetric; GPM_METRIC_MAX],
}

/// The entry points used, resolved from one loaded library.
pub struct Nvml {
    error_string: unsafe extern "C" fn(u32) -> *const c_char,
    driver_version: unsafe extern "C" fn(*mut c_char, c_uint) -> u32,
    cuda_driver_version: unsafe extern "C" fn(*mut c_int) -> u32,
    device_count: unsafe extern "C" fn(*mut c_uint) -> u32,
    handle_by_index: unsafe extern "C" fn(c_uint, *mut Device) -> u32,
    name: unsafe extern "C" fn(Device, *mut c_char, c_uint) -> u32,
    uuid: unsafe extern "C" fn(Device, *mut c_char, c_uint) -> u32,
    memory: unsafe extern "C" fn(Device, *mut Memory) -> u32,
    utilization: unsafe extern "C" fn(Device, *mut Utilization) -> u32,
    clock: unsafe extern "C" fn(Device, c_uint, *mut c_uint) -> u32,
    power: unsafe extern "C" fn(Device, *mut c_uint) -> u32,
    temperature: unsafe extern "C" fn(Device, c_uint, *mut c_uint) -> u32,
    clock_reasons: Option<unsafe extern "C" fn(Device, *mut c_ulonglong) -> u32>,
    processes: Option<unsafe extern "C" fn(Device, *mut c_uint, *mut ProcessInfoV1) -> u32>,
    gpm: Option<GpmApi>,
}

struct GpmApi {
    query_support: unsafe extern "C" fn(Device, *mut GpmSupport) -> u32,
    sample_alloc: unsafe extern "C" fn(*mut GpmSample) -> u32,
    sample_free: unsafe extern "C" fn(GpmSample) -> u32,
    sample_get: unsafe extern "C" fn(Device, GpmSample) -> u32,
    metrics_get: unsafe extern "C" fn(*mut GpmMetricsGet) -> u32,
}

// SAFETY: the struct holds only function pointers into a library that is never unloaded; NVML's
// entry points are thread-safe.
unsafe impl Send for Nvml {}
// SAFETY: as above.
unsafe impl Sync for Nvml {}

/// One GPU as NVML describes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// NVML's index (the order of `nvidia-smi`, not necessarily CUDA's).
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub memory_total_bytes: u64,
}

/// The driver and its GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriverInfo {
    pub driver_version: String,
    /// The CUDA driver API version the driver provides, e.g. `13.0`.
    pub cuda_driver_version: Option<String>,
    pub gpus: Vec<GpuInfo>,
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

fn symbol(handle: *mut c_void, name: &str) -> Option<*mut c_void> {
    let c = CString::new(name).ok()?;
    // SAFETY: `handle` is a live dlopen handle and `c` a NUL-terminated name.
    let ptr = unsafe { libc::dlsym(handle, c.as_ptr()) };
    (!ptr.is_null()).then_some(ptr)
}

/// Transmutes a resolved symbol into a function pointer of type `F`.
///
/// # Safety
/// `F` must be the symbol's real C signature.
unsafe fn func<F: Copy>(ptr: *mut c_void) -> F {
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: guaranteed by the caller.
    unsafe { std::mem::transmute_copy(&ptr) }
}

fn c_text(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

impl Nvml {
    /// The process's NVML, opened and initialised on first use; the error says why there is none
    /// (no driver, no permission, …). The outcome is kept for the life of the process.
    pub fn get() -> Result<&'static Nvml, String> {
        static NVML: OnceLock<Result<Nvml, String>> = OnceLock::new();
        NVML.get_or_init(Nvml::open).as_ref().map_err(Clone::clone)
    }

    fn open() -> Result<Nvml, String> {
        let (name, explicit) = match std::env::var(NVML_LIB_ENV) {
            Ok(path) if !path.is_empty() => (path, true),
            _ => (SONAME.to_string(), false),
        };
        let c_name = CString::new(name.clone()).map_err(|_| format!("`{name}` contains a NUL byte"))?;
        // SAFETY: dlopen of a NUL-terminated name; NVML's initialisers are safe to run.
        let handle = unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            // SAFETY: dlerror returns a thread-local message or null.
            let why = unsafe {
                let e = libc::dlerror();
                if e.is_null() { String::new() } else { CStr::from_ptr(e).to_string_lossy().into_owned() }
            };
            return Err(if explicit {
                format!("{NVML_LIB_ENV}=`{name}` cannot be loaded: {why}")
            } else {
                let why = why.strip_prefix(&format!("{name}: ")).unwrap_or(&why).to_string();
                format!("{SONAME} not found: no NVIDIA driver on this machine ({why})")
            });
        }
        let need = |name: &str| symbol(handle, name).ok_or_else(|| format!("{SONAME} has no `{name}`"));
        // SAFETY (all `func` calls): each type is the entry point's signature in nvml.h.
        let nvml = unsafe {
            let init: unsafe extern "C" fn() -> u32 = func(need("nvmlInit_v2")?);
            let error_string: unsafe extern "C" fn(u32) -> *const c_char = func(need("nvmlErrorString")?);
            let rc = init();
            if rc != NVML_SUCCESS {
                let text = CStr::from_ptr(error_string(rc)).to_string_lossy().into_owned();
                return Err(format!("NVML cannot be initialised: {text} (nvmlInit_v2 returned {rc})"));
            }
            let gpm = (|| {
                Some(GpmApi {
                    query_support: func(symbol(handle, "nvmlGpmQueryDeviceSupport")?),
                    sample_alloc: func(symbol(handle, "nvmlGpmSampleAlloc")?),
                    sample_free: func(symbol(handle, "nvmlGpmSampleFree")?),
                    sample_get: func(symbol(handle, "nvmlGpmSampleGet")?),
                    metrics_get: func(symbol(handle, "nvmlGpmMetricsGet")?),
                })
            })();
            Nvml {
                error_string,
                driver_version: func(need("nvmlSystemGetDriverVersion")?),
                cuda_driver_version: func(
                    symbol(handle, "nvmlSystemGetCudaDriverVersion_v2")
                        .map_or_else(|| need("nvmlSystemGetCudaDriverVersion"), Ok)?,
                ),
                device_count: func(need("nvmlDeviceGetCount_v2")?),
                handle_by_index: func(need("nvmlDeviceGetHandleByIndex_v2")?),
                name: func(need("nvmlDeviceGetName")?),
                uuid: func(need("nvmlDeviceGetUUID")?),
                memory: func(need("nvmlDeviceGetMemoryInfo")?),
                utilization: func(need("nvmlDeviceGetUtilizationRates")?),
                clock: func(need("nvmlDeviceGetClockInfo")?),
                power: func(need("nvmlDeviceGetPowerUsage")?),
                temperature: func(need("nvmlDeviceGetTemperature")?),
                clock_reasons: symbol(handle, "nvmlDeviceGetCurrentClocksEventReasons")
                    .or_else(|| symbol(handle, "nvmlDeviceGetCurrentClocksThrottleReasons"))
                    .map(|p| func(p)),
                processes: symbol(handle, "nvmlDeviceGetComputeRunningProcesses").map(|p| func(p)),
                gpm,
            }
        };
        Ok(nvml)
    }

    fn error(&self, rc: u32) -> String {
        // SAFETY: nvmlErrorString returns a static string for any code.
        let p = unsafe { (self.error_string)(rc) };
        if p.is_null() {
            return format!("NVML error {rc}");
        }
        // SAFETY: non-null, NUL-terminated, static.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    fn handles(&self) -> Result<Vec<(u32, Device)>, String> {
        let mut count: c_uint = 0;
        // SAFETY: valid out-pointer.
        let rc = unsafe { (self.device_count)(&mut count) };
        if rc != NVML_SUCCESS {
            return Err(format!("nvmlDeviceGetCount_v2: {}", self.error(rc)));
        }
        let mut out = Vec::new();
        for i in 0..count {
            let mut dev: Device = std::ptr::null_mut();
            // SAFETY: valid out-pointer; `i` is below the count.
            let rc = unsafe { (self.handle_by_index)(i, &mut dev) };
            if rc == NVML_SUCCESS {
                out.push((i, dev));
            }
        }
        Ok(out)
    }

    /// The driver, the CUDA version it provides and its GPUs.
    pub fn driver_info(&self) -> Result<DriverInfo, String> {
        let mut buf = [0 as c_char; 96];
        // SAFETY: the buffer is as long as announced.
        let rc = unsafe { (self.driver_version)(buf.as_mut_ptr(), buf.len() as c_uint) };
        let driver_version =
            if rc == NVML_SUCCESS { c_text(&buf) } else { format!("unknown ({})", self.error(rc)) };
        let mut cuda: c_int = 0;
        // SAFETY: valid out-pointer.
        let cuda_driver_version = (unsafe { (self.cuda_driver_version)(&mut cuda) } == NVML_SUCCESS)
            .then(|| format!("{}.{}", cuda / 1000, cuda % 1000 / 10));
        let gpus = self
            .handles()?
            .into_iter()
            .map(|(index, dev)| {
                let mut name = [0 as c_char; 96];
                let mut uuid = [0 as c_char; 96];
                let mut mem = Memory::default();
                // SAFETY: buffers as long as announced; valid out-pointers; a live handle.
                unsafe {
                    (self.name)(dev, name.as_mut_ptr(), name.len() as c_uint);
                    (self.uuid)(dev, uuid.as_mut_ptr(), uuid.len() as c_uint);
                    (self.memory)(dev, &mut mem);
                }
                GpuInfo { index, name: c_text(&name), uuid: c_text(&uuid), memory_total_bytes: mem.total }
            })
            .collect();
        Ok(DriverInfo { driver_version, cuda_driver_version, gpus })
    }
}

/// Why GPM metrics are missing, or `None` when the GPU has them.
fn gpm_support(nvml: &Nvml, dev: Device) -> Option<String> {
    let Some(gpm) = &nvml.gpm else {
        return Some("this NVML has no GPM entry points (driver older than R520)".into());
    };
    let mut support = GpmSupport { version: NVML_GPM_SUPPORT_VERSION, is_supported_device: 0 };
    // SAFETY: valid out-pointer with its version set, a live handle.
    let rc = unsafe { (gpm.query_support)(dev, &mut support) };
    if rc != NVML_SUCCESS {
        return Some(format!("nvmlGpmQueryDeviceSupport: {}", nvml.error(rc)));
    }
    (support.is_supported_device == 0)
        .then(|| "this GPU has no GPM counters (they need Hopper or newer)".into())
}

/// GPM state of one GPU: the previous sample and a buffer for the next.
struct Gpm {
    prev: GpmSample,
    next: GpmSample,
    primed: bool,
}

struct SampledGpu {
    index: u32,
    handle: Device,
    gpm: Option<Gpm>,
}

/// Samples every GPU NVML sees. Dropping it frees the GPM buffers.
pub struct Sampler {
    nvml: &'static Nvml,
    gpus: Vec<SampledGpu>,
    /// Why SM activity is not measured, per GPU index (GPM unsupported), for the report.
    pub gpm_missing: Vec<(u32, String)>,
}

impl Sampler {
    /// A sampler over every GPU; the error says why there is none to sample.
    pub fn new() -> Result<Sampler, String> {
        let nvml = Nvml::get()?;
        let mut gpm_missing = Vec::new();
        let gpus = nvml
            .handles()?
            .into_iter()
            .map(|(index, handle)| {
                let gpm = match (gpm_support(nvml, handle), &nvml.gpm) {
                    (None, Some(api)) => {
                        let (mut prev, mut next): (GpmSample, GpmSample) =
                            (std::ptr::null_mut(), std::ptr::null_mut());
                        // SAFETY: valid out-pointers.
                        let ok = unsafe {
                            (api.sample_alloc)(&mut prev) == NVML_SUCCESS
                                && (api.sample_alloc)(&mut next) == NVML_SUCCESS
                        };
                        if ok {
                            Some(Gpm { prev, next, primed: false })
                        } else {
                            gpm_missing.push((index, "nvmlGpmSampleAlloc failed".to_string()));
                            None
                        }
                    }
                    (why, _) => {
                        gpm_missing.push((index, why.unwrap_or_else(|| "GPM is not available".into())));
                        None
                    }
                };
                SampledGpu { index, handle, gpm }
            })
            .collect::<Vec<_>>();
        if gpus.is_empty() {
            return Err("NVML sees no GPU".to_string());
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

impl Drop for Sampler {
    fn drop(&mut self) {
        if let Some(api) = &self.nvml.gpm {
            for g in &self.gpus {
                if let Some(gpm) = &g.gpm {
                    // SAFETY: both buffers came from nvmlGpmSampleAlloc and are freed once.
                    unsafe {
                        (api.sample_free)(gpm.prev);
                        (api.sample_free)(gpm.next);
                    }
                }
            }
        }
    }
}

fn read_gpu(nvml: &Nvml, g: &mut SampledGpu) -> GpuReading {
    let dev = g.handle;
    let mut r = GpuReading { index: g.index, ..GpuReading::default() };
    let ok = |rc: u32| rc == NVML_SUCCESS;
    // SAFETY (every call below): valid out-pointers and a live handle.
    unsafe {
        let mut util = Utilization::default();
        if ok((nvml.utilization)(dev, &mut util)) {
            r.util_percent = Some(util.gpu);
            r.memory_util_percent = Some(util.memory);
        }
        let mut mem = Memory::default();
        if ok((nvml.memory)(dev, &mut mem)) {
            r.memory_used_bytes = Some(mem.used);
            r.memory_total_bytes = Some(mem.total);
        }
        let mut v: c_uint = 0;
        if ok((nvml.clock)(dev, NVML_CLOCK_SM, &mut v)) {
            r.sm_clock_mhz = Some(v);
        }
        if ok((nvml.power)(dev, &mut v)) {
            r.power_mw = Some(v);
        }
        if ok((nvml.temperature)(dev, NVML_TEMPERATURE_GPU, &mut v)) {
            r.temperature_c = Some(v);
        }
        if let Some(reasons) = nvml.clock_reasons {
            let mut mask: c_ulonglong = 0;
            if ok(reasons(dev, &mut mask)) {
                r.clock_reasons = Some(mask);
            }
        }
        if let Some(list) = nvml.processes {
            r.processes = running_processes(list, dev);
        }
    }
    if let (Some(gpm), Some(api)) = (g.gpm.as_mut(), nvml.gpm.as_ref()) {
        read_gpm(api, dev, gpm, &mut r);
    }
    r
}

/// # Safety
/// `list` is `nvmlDeviceGetComputeRunningProcesses` and `dev` a live handle.
unsafe fn running_processes(
    list: unsafe extern "C" fn(Device, *mut c_uint, *mut ProcessInfoV1) -> u32,
    dev: Device,
) -> Vec<GpuProcess> {
    let mut infos = vec![ProcessInfoV1::default(); 64];
    for _ in 0..3 {
        let mut count = infos.len() as c_uint;
        // SAFETY: `infos` holds `count` records.
        let rc = unsafe { list(dev, &mut count, infos.as_mut_ptr()) };
        match rc {
            NVML_SUCCESS => {
                return infos[..(count as usize).min(infos.len())]
                    .iter()
                    .map(|p| GpuProcess {
                        pid: p.pid,
                        // NVML_VALUE_NOT_AVAILABLE is all ones.
                        memory_bytes: (p.used_gpu_memory != u64::MAX).then_some(p.used_gpu_memory),
                    })
                    .collect();
            }
            NVML_ERROR_INSUFFICIENT_SIZE => infos = vec![ProcessInfoV1::default(); count as usize + 16],
            _ => return Vec::new(),
        }
    }
    Vec::new()
}

fn read_gpm(api: &GpmApi, dev: Device, gpm: &mut Gpm, r: &mut GpuReading) {
    // SAFETY: a live handle and a buffer from nvmlGpmSampleAlloc.
    if unsafe { (api.sample_get)(dev, gpm.next) } != NVML_SUCCESS {
        return;
    }
    if gpm.primed {
        let empty = GpmMetric {
            metric_id: 0,
            nvml_return: 0,
            value: 0.0,
            info: GpmMetricInfo {
                short_name: std::ptr::null(),
                long_name: std::ptr::null(),
                unit: std::ptr::null(),
            },
        };
        let ids = [GPM_SM_UTIL, GPM_SM_OCCUPANCY, GPM_TENSOR_UTIL, GPM_DRAM_BW_UTIL];
        let mut get = Box::new(GpmMetricsGet {
            version: NVML_GPM_METRICS_GET_VERSION,
            num_metrics: ids.len() as c_uint,
            sample1: gpm.prev,
            sample2: gpm.next,
            metrics: [empty; GPM_METRIC_MAX],
        });
        for (slot, id) in get.metrics.iter_mut().zip(ids) {
            slot.metric_id = id;
        }
        // SAFETY: a fully initialised request whose two samples are distinct, filled buffers.
        if unsafe { (api.metrics_get)(&mut *get) } == NVML_SUCCESS {
            let value = |i: usize| {
                let m = &get.metrics[i];
                (m.nvml_return == NVML_SUCCESS && m.value.is_finite()).then_some(m.value)
            };
            r.sm_active_percent = value(0);
            r.sm_occupancy_percent = value(1);
            r.tensor_active_percent = value(2);
            r.dram_bw_percent = value(3);
        }
    }
    std::mem::swap(&mut gpm.prev, &mut gpm.next);
    gpm.primed = true;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_layouts_match_nvml_h() {
        assert_eq!(std::mem::size_of::<ProcessInfoV1>(), 16);
        assert_eq!(std::mem::size_of::<GpmMetric>(), 40);
        assert_eq!(std::mem::size_of::<GpmMetricsGet>(), 4 + 4 + 8 + 8 + 98 * 40);
        assert_eq!(std::mem::size_of::<Memory>(), 24);
    }

    #[test]
    fn without_a_driver_nvml_says_which_library_is_missing() {
        match Nvml::get() {
            // A GPU machine: the driver answers.
            Ok(nvml) => assert!(!nvml.driver_info().unwrap().driver_version.is_empty()),
            Err(why) => {
                assert!(why.contains("libnvidia-ml.so.1") || why.contains(NVML_LIB_ENV), "{why}");
                assert!(Sampler::new().is_err());
            }
        }
    }
}
