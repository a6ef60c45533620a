//! The environment as rows of plain text, shared by the markdown report's `## Environment` and
//! the terminal output of `ups-doctor env`, so both list the same facts in the same order.

use crate::probe::env::{EnvSummary, PythonEnv};
use crate::probe::gpu_env::{self, GpuEnv};
use crate::scenario::human_bytes;

use super::text::count;

/// The variable families [`EnvSummary::variables`] collects, for saying that none was set.
pub(crate) const VARIABLE_FAMILIES: &str =
    "NCCL_*, TORCH_*, PYTORCH_*, CUDA_*, OMP_*, MKL_*, GLOO_*, UPS_DOCTOR_*";

/// `(label, value)` for every fact; `None` where the machine did not say.
pub(crate) fn rows(env: &EnvSummary) -> Vec<(&'static str, Option<String>)> {
    let mut rows = vec![
        ("ups-doctor", Some(env.tool_version.clone())),
        ("host", Some(env.hostname.clone()).filter(|h| !h.is_empty())),
        ("OS", Some(env.os.clone())),
        ("kernel", Some(env.kernel.clone()).filter(|k| !k.is_empty())),
        ("architecture", Some(env.arch.clone())),
        ("CPUs", Some(env.cpus.to_string())),
        ("memory", env.memory_total_bytes.map(human_bytes)),
        ("libtorch", Some(env.libtorch_version.clone()).filter(|v| !v.is_empty())),
        ("libtorch library", Some(env.libtorch_lib.clone()).filter(|v| !v.is_empty())),
        ("/dev/shm", Some(shm(env).unwrap_or_else(|| "not mounted".into()))),
        ("open files (ulimit -n)", env.open_files_limit.clone()),
        ("locked memory (ulimit -l)", env.locked_memory_limit.clone()),
        ("cgroup memory.max", env.cgroup_memory_max.clone()),
        ("cgroup cpu.max", env.cgroup_cpu_max.clone()),
        ("container", Some(env.container.clone().unwrap_or_else(|| "none detected".into()))),
    ];
    // Asked only where a command of the user's ran (the built-in trainer needs no Python).
    if let Some(p) = &env.python {
        rows.extend([
            ("Python", Some(python(p))),
            ("Python torch", p.problem.is_none().then(|| p.torch_version.clone().unwrap_or_else(|| "not installed".into()))),
            ("Python start method", p.start_method.as_ref().map(|m| {
                format!("{m} (multiprocessing's default: DataLoader workers use it unless given a multiprocessing_context)")
            })),
        ]);
    }
    if let Some(gpu) = &env.gpu {
        rows.extend(gpu_rows(gpu));
    }
    rows
}

/// The GPU facts: NVML and the driver, the GPUs, libtorch's CUDA and NCCL.
fn gpu_rows(gpu: &GpuEnv) -> Vec<(&'static str, Option<String>)> {
    let driver = gpu.driver.as_ref();
    let cuda = gpu.cuda.as_ref();
    let gpus = driver.map(|d| {
        if d.gpus.is_empty() {
            return "none".to_string();
        }
        let each: Vec<String> = d
            .gpus
            .iter()
            .map(|g| format!("{}: {} ({})", g.index, g.name, human_bytes(g.memory_total_bytes)))
            .collect();
        each.join("; ")
    });
    vec![
        (
            "NVML",
            Some(match &gpu.nvml_error {
                Some(e) => format!("unavailable: {e}"),
                None => "available".to_string(),
            }),
        ),
        ("NVIDIA driver", driver.map(|d| d.driver_version.clone())),
        ("CUDA (driver API)", driver.and_then(|d| d.cuda_driver_version.clone())),
        ("GPUs (NVML)", gpus),
        ("CUDA (libtorch build)", cuda.and_then(|c| c.cuda_runtime.clone())),
        (
            "GPUs CUDA sees (libtorch)",
            Some(match (cuda, &gpu.cuda_error) {
                (Some(c), _) if c.device_count > 0 => c.device_count.to_string(),
                (Some(c), _) => format!("0: {}", c.why_not.as_deref().unwrap_or("no GPU")),
                (None, Some(e)) => format!("unknown: {e}"),
                (None, None) => "unknown".to_string(),
            }),
        ),
        (
            "NCCL",
            cuda.map(|c| match (&c.nccl_version, &c.nccl_error) {
                (Some(v), _) => v.clone(),
                (None, Some(e)) => format!("unavailable: {e}"),
                (None, None) => "unknown".to_string(),
            }),
        ),
    ]
}

/// `3.11.7 (/usr/bin/python3)`, or why there is no answer.
fn python(p: &PythonEnv) -> String {
    match (&p.version, &p.problem) {
        (_, Some(problem)) if p.executable.is_empty() => problem.clone(),
        (_, Some(problem)) => format!("{}: {problem}", p.executable),
        (Some(v), None) => format!("{v} ({})", p.executable),
        (None, None) => p.executable.clone(),
    }
}

/// `/dev/shm` use: `1.5 MiB used of 64.0 MiB`, or `None` when it is not mounted.
pub(crate) fn shm(env: &EnvSummary) -> Option<String> {
    match (env.shm_used_bytes, env.shm_total_bytes) {
        (Some(used), Some(total)) => Some(format!("{} used of {}", human_bytes(used), human_bytes(total))),
        (None, Some(total)) => Some(human_bytes(total)),
        _ => None,
    }
}

/// The facts asked for first in an issue, as short phrases for one line.
pub(crate) fn headline(env: &EnvSummary) -> Vec<String> {
    vec![
        env.os.clone(),
        format!("kernel {}", env.kernel),
        env.arch.clone(),
        count(env.cpus, "CPU", "CPUs"),
        env.memory_total_bytes
            .map_or_else(|| "memory unknown".to_string(), |b| format!("{} memory", human_bytes(b))),
        // Only where the built-in trainer ran: a user's program brings its own PyTorch.
        if env.libtorch_version.is_empty() {
            String::new()
        } else {
            format!("libtorch {}", env.libtorch_version)
        },
        format!("/dev/shm {}", shm(env).unwrap_or_else(|| "not mounted".into())),
        match &env.container {
            Some(c) => format!("container: {c}"),
            None => "no container detected".to_string(),
        },
    ]
    .into_iter()
    .chain(env.gpu.as_ref().map(gpu_env::headline))
    .filter(|phrase| !phrase.is_empty())
    .collect()
}
