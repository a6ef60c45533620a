//! The environment as rows of plain text, shared by the markdown report's `## Environment` and
//! the terminal output of `ups-doctor env`, so both list the same facts in the same order.

use crate::probe::env::{EnvSummary, human_bytes};

use super::text::count;

/// The variable families [`EnvSummary::variables`] collects, for saying that none was set.
pub(crate) const VARIABLE_FAMILIES: &str =
    "NCCL_*, TORCH_*, PYTORCH_*, CUDA_*, OMP_*, MKL_*, GLOO_*, UPS_DOCTOR_*";

/// `(label, value)` for every fact; `None` where the machine did not say.
pub(crate) fn rows(env: &EnvSummary) -> Vec<(&'static str, Option<String>)> {
    vec![
        ("ups-doctor", Some(env.tool_version.clone())),
        ("host", Some(env.hostname.clone()).filter(|h| !h.is_empty())),
        ("OS", Some(env.os.clone())),
        ("kernel", Some(env.kernel.clone()).filter(|k| !k.is_empty())),
        ("architecture", Some(env.arch.clone())),
        ("CPUs", Some(env.cpus.to_string())),
        ("memory", env.memory_total_bytes.map(human_bytes)),
        ("libtorch", Some(env.libtorch_version.clone())),
        ("libtorch library", Some(env.libtorch_lib.clone())),
        ("/dev/shm", Some(shm(env).unwrap_or_else(|| "not mounted".into()))),
        ("open files (ulimit -n)", env.open_files_limit.clone()),
        ("locked memory (ulimit -l)", env.locked_memory_limit.clone()),
        ("cgroup memory.max", env.cgroup_memory_max.clone()),
        ("cgroup cpu.max", env.cgroup_cpu_max.clone()),
        ("container", Some(env.container.clone().unwrap_or_else(|| "none detected".into()))),
        ("Python", Some(python(env))),
        ("Python torch", env.python.as_ref().and_then(|p| p.problem.is_none().then(|| {
            p.torch_version.clone().unwrap_or_else(|| "not installed".into())
        }))),
        ("Python start method", env.python.as_ref().and_then(|p| p.start_method.as_ref()).map(|m| {
            format!("{m} (multiprocessing's default: DataLoader workers use it unless given a multiprocessing_context)")
        })),
    ]
}

/// `3.11.7 (/usr/bin/python3)`, or why there is no answer.
fn python(env: &EnvSummary) -> String {
    match &env.python {
        None => "none on PATH (neither python3 nor python)".into(),
        Some(p) => match (&p.version, &p.problem) {
            (_, Some(problem)) => format!("{}: {problem}", p.executable),
            (Some(v), None) => format!("{v} ({})", p.executable),
            (None, None) => p.executable.clone(),
        },
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
        format!("libtorch {}", env.libtorch_version),
        format!("/dev/shm {}", shm(env).unwrap_or_else(|| "not mounted".into())),
        match &env.container {
            Some(c) => format!("container: {c}"),
            None => "no container detected".to_string(),
        },
    ]
}
