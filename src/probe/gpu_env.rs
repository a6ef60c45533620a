//! The GPU part of `ups-doctor env` and of every report's environment: the NVIDIA driver and the
//! CUDA version it provides, its GPUs with their memory (NVML, read here), and what libtorch can
//! do with them: its CUDA build, the GPUs CUDA sees, NCCL (a [`CudaSupport`] measured by a child
//! `ups-doctor cuda-probe`, because only the trainer side may load libtorch's CUDA libraries; the
//! harness stays free of them).
//!
//! Kept apart from [`super::env::EnvSummary`]'s other facts, which it joins as `gpu`.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

pub use ups_doctor_core::schema::{CudaSupport, GpuEnv};

use super::nvml::Nvml;

/// How long the child probe may take: loading libtorch's CUDA libraries and creating a context
/// takes seconds on a GPU machine.
const PROBE_LIMIT: Duration = Duration::from_secs(120);

/// Reads NVML here and, given the trainer, asks `ups-doctor-trainer cuda-probe` about libtorch's
/// CUDA (a process that loads libtorch: only for commands that run the built-in trainer).
pub fn collect(trainer: Option<&Path>) -> GpuEnv {
    let (driver, nvml_error) = match Nvml::get().and_then(Nvml::driver_info) {
        Ok(d) => (Some(d), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let (cuda, cuda_error) = match trainer.map(cuda_support) {
        Some(Ok(c)) => (Some(c), None),
        Some(Err(e)) => (None, Some(e.to_string())),
        None => (None, None),
    };
    GpuEnv { driver, nvml_error, cuda, cuda_error }
}

/// Why the trainer's `cuda-probe` gave no answer about libtorch's CUDA.
#[derive(Debug, thiserror::Error)]
pub enum CudaProbeError {
    #[error("failed to start `{} cuda-probe`: {source}", program.display())]
    Start { program: PathBuf, source: std::io::Error },
    #[error("`cuda-probe` did not answer within {} s", limit.as_secs())]
    Timeout { limit: Duration },
    /// It exited unsuccessfully; `stderr` is what it said, trimmed.
    #[error("`cuda-probe` failed ({status}): {stderr}")]
    Failed { status: ExitStatus, stderr: String },
    #[error("`cuda-probe` answered something unreadable ({source}): {stdout}")]
    Unreadable { source: serde_json::Error, stdout: String },
}

/// Runs `trainer cuda-probe` and reads its answer.
pub fn cuda_support(program: &Path) -> Result<CudaSupport, CudaProbeError> {
    let done = super::run::bounded(Command::new(program).arg("cuda-probe"), PROBE_LIMIT)
        .map_err(|source| CudaProbeError::Start { program: program.to_path_buf(), source })?
        .ok_or(CudaProbeError::Timeout { limit: PROBE_LIMIT })?;
    if !done.status.success() {
        return Err(CudaProbeError::Failed { status: done.status, stderr: done.stderr.trim().to_string() });
    }
    serde_json::from_str(&done.stdout)
        .map_err(|source| CudaProbeError::Unreadable { source, stdout: done.stdout })
}

/// One line about the machine's GPUs for the report's headline: `1 GPU (NVIDIA H100 80GB HBM3,
/// 79.6 GiB), driver 580.65.06` or `no NVIDIA driver`.
pub fn headline(gpu: &GpuEnv) -> String {
    match &gpu.driver {
        Some(d) if !d.gpus.is_empty() => {
            let names: Vec<String> = d
                .gpus
                .iter()
                .map(|g| format!("{}, {}", g.name, crate::scenario::human_bytes(g.memory_total_bytes)))
                .collect();
            let count =
                if d.gpus.len() == 1 { "1 GPU".to_string() } else { format!("{} GPUs", d.gpus.len()) };
            format!("{count} ({}), driver {}", names.join("; "), d.driver_version)
        }
        Some(d) => format!("no GPU, driver {}", d.driver_version),
        None => "no NVIDIA driver".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::nvml::{DriverInfo, GpuInfo};

    #[test]
    fn the_headline_names_gpus_and_driver_or_says_there_is_none() {
        let mut env = GpuEnv::default();
        assert_eq!(headline(&env), "no NVIDIA driver");
        env.driver = Some(DriverInfo {
            driver_version: "580.65.06".into(),
            cuda_driver_version: Some("13.0".into()),
            gpus: vec![GpuInfo {
                index: 0,
                name: "NVIDIA H100 80GB HBM3".into(),
                uuid: "GPU-1".into(),
                memory_total_bytes: 85_520_809_984,
            }],
        });
        assert_eq!(headline(&env), "1 GPU (NVIDIA H100 80GB HBM3, 79.6 GiB), driver 580.65.06");
    }
}
