//! The environment a run happened in, as `ups-doctor env --json` and every result's
//! `environment` show it: the machine, the Python a command ran with, the driver, its GPUs and what
//! libtorch can do with them. Only the types: `probe` (in the doctor) collects them, the trainer
//! answers `cuda-probe` with a [`CudaSupport`].

use serde::{Deserialize, Serialize};

/// A snapshot of the environment a run happened in.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EnvSummary {
    pub tool_version: String,
    pub hostname: String,
    pub os: String,
    pub kernel: String,
    pub arch: String,
    pub cpus: usize,
    pub memory_total_bytes: Option<u64>,
    pub libtorch_version: String,
    pub libtorch_lib: String,
    /// `/dev/shm` size and use in bytes, when it is mounted.
    pub shm_total_bytes: Option<u64>,
    pub shm_used_bytes: Option<u64>,
    /// `ulimit -n` (soft).
    pub open_files_limit: Option<String>,
    /// Locked-memory limit (soft and hard, `ulimit -l`), which pinned host memory needs.
    pub locked_memory_limit: Option<String>,
    /// cgroup v2 `memory.max` and `cpu.max` of this process's cgroup.
    pub cgroup_memory_max: Option<String>,
    pub cgroup_cpu_max: Option<String>,
    /// Container runtime detected (docker, podman, kubernetes), if any.
    pub container: Option<String>,
    /// `NCCL_*`, `TORCH_*`, `CUDA_*`, `OMP_*`, `MKL_*`, `GLOO_*`, `UPS_DOCTOR_*` as set.
    pub variables: Vec<(String, String)>,
    /// Driver, CUDA, NCCL and GPUs (the GPU facts); filled by the commands that can ask a
    /// child process about libtorch's CUDA, absent in results of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuEnv>,
    /// The Python on `PATH` (what a training command's `python` runs); `None` when there is none.
    #[serde(default)]
    pub python: Option<PythonEnv>,
}

/// What PyTorch's `collect_env` reports about Python, plus what decides DataLoader workers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PythonEnv {
    /// The interpreter as found on `PATH` (`python3`, else `python`).
    pub executable: String,
    pub version: Option<String>,
    /// The installed `torch` distribution's version (`2.11.0+cu130`); `None` when not installed.
    pub torch_version: Option<String>,
    /// `multiprocessing`'s default start method there: what a DataLoader uses for its workers
    /// unless given a `multiprocessing_context` (`fork` on Linux before Python 3.14).
    pub start_method: Option<String>,
    /// Why the facts above are missing, when the interpreter could not be asked.
    pub problem: Option<String>,
}

/// What libtorch, as this binary loads it, can do with CUDA: the output of `ups-doctor
/// cuda-probe`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CudaSupport {
    /// The libtorch the trainer runs (`2.11.0+cu130`) and the folder of its libraries: the trainer
    /// answers for itself, since the supervising `ups-doctor` never loads libtorch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub libtorch_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub libtorch_lib: Option<String>,
    /// The `libtorch_cuda.so` that was loaded, when one was.
    pub libtorch_cuda: Option<String>,
    /// GPUs CUDA sees (0 when CUDA is unusable).
    pub device_count: usize,
    /// Why CUDA is unusable.
    pub why_not: Option<String>,
    /// The CUDA runtime libtorch was built with and loads (`libcudart`), e.g. `13.0`.
    pub cuda_runtime: Option<String>,
    /// NCCL as the `nccl` backend would load it, e.g. `2.28.9`, or why it cannot.
    pub nccl_version: Option<String>,
    pub nccl_error: Option<String>,
}

/// The GPU facts of this machine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuEnv {
    /// The driver and its GPUs, from NVML.
    pub driver: Option<DriverInfo>,
    /// Why NVML could not be used (no driver, …).
    pub nvml_error: Option<String>,
    /// libtorch's side, from `ups-doctor cuda-probe`.
    pub cuda: Option<CudaSupport>,
    /// Why that probe gave no answer.
    pub cuda_error: Option<String>,
}

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
