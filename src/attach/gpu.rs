//! GPU activity over the attach window: NVML's readings of every GPU (utilisation, SM activity,
//! memory, clocks) and the GPU memory of each process on it, taken on a thread of its own beside
//! the watch, then labelled with the job's ranks and their children. Read-only: NVML asks the
//! driver; nothing reaches the job's processes.

use std::time::{Duration, Instant};

use crate::harness::{GpuLabel, GpuRecorder, GpuSample};
use crate::probe::nvml::{Nvml, NvmlError, Sampler};
use crate::schema::{GpuReport, ProcessRole};

use super::job::Job;

/// A reading every this often, as `run` samples by default (`limits.gpu_sample_ms`).
const EVERY: Duration = Duration::from_millis(200);

/// Why the window has no GPU readings.
#[derive(Debug, thiserror::Error)]
pub enum Unwatched {
    /// No NVML, or no GPU.
    #[error(transparent)]
    Nvml(#[from] NvmlError),
    #[error("no thread to sample GPUs: {0}")]
    NoThread(#[source] std::io::Error),
    #[error("the GPU sampling thread panicked")]
    Panicked,
}

/// Readings of every GPU from now until `window` has passed (the first at once, the last at
/// its end); the error says why there are none (no driver, no GPU).
pub fn watch(window: Duration) -> Result<GpuRecorder, NvmlError> {
    let mut sampler = Sampler::new()?;
    let info = Nvml::get().and_then(Nvml::driver_info).map(|d| d.gpus).unwrap_or_default();
    let mut recorder = GpuRecorder::new(EVERY.as_secs_f64(), info, sampler.gpm_missing.clone());
    let start = Instant::now();
    loop {
        let t = start.elapsed();
        recorder.record(GpuSample { t_s: t.as_secs_f64(), gpus: sampler.sample() });
        if t >= window {
            return Ok(recorder);
        }
        std::thread::sleep(EVERY.min(window - t));
    }
}

/// The window's GPU report, each process labelled as the job's rank, a rank's child, or not of
/// the job.
pub fn report(watched: Result<GpuRecorder, Unwatched>, job: &Job) -> GpuReport {
    match watched {
        Err(why) => GpuReport::unavailable(why.to_string()),
        Ok(recorder) => recorder.finish_labelled(|pid| label(job, pid)),
    }
}

fn label(job: &Job, pid: u32) -> GpuLabel {
    for r in &job.ranks {
        if r.pid == pid {
            return (ProcessRole::Rank, Some(r.rank), None);
        }
        if r.children.contains(&pid) {
            return (ProcessRole::Child, Some(r.rank), None);
        }
    }
    if job.launcher == Some(pid) {
        return (ProcessRole::Child, None, None);
    }
    (ProcessRole::Other, None, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attach::job::Rank;
    use crate::schema::IdentifiedBy;

    /// The H200 recording (scripts/gpu-check.sh: rank pid 789 training, 100 readings) as an
    /// attach window over a job whose rank 0 is that pid: the rank's GPU memory and the GPU's
    /// utilisation while it held it, and another program's process kept apart.
    #[test]
    fn the_window_labels_the_jobs_processes_on_the_gpu() {
        let job = Job {
            launcher: Some(700),
            command: vec!["torchrun".into()],
            ranks: vec![Rank { rank: 0, pid: 789, by: IdentifiedBy::Rank, children: vec![800] }],
            world_size: Some(1),
            local_world_size: Some(1),
            group: (None, None),
            master: None,
            run_id: None,
            slurm_step: None,
            unreadable: Vec::new(),
        };
        use crate::harness::gpu_h200;
        let mut samples = gpu_h200::recording();
        let procs = &mut samples[20].gpus[0].processes;
        procs.push(crate::probe::nvml::GpuProcess { pid: 800, memory_bytes: Some(600 << 20) });
        procs.push(crate::probe::nvml::GpuProcess { pid: 4242, memory_bytes: Some(1 << 30) });
        let report = report(Ok(gpu_h200::h200_recorder(samples, Vec::new())), &job);
        let g = &report.gpus[0];
        assert!(g.used_by_run);
        assert_eq!(g.util_percent.unwrap().median, 21.0);
        let roles: Vec<(u32, ProcessRole, Option<u32>)> =
            report.processes.iter().map(|p| (p.pid, p.role, p.rank)).collect();
        assert_eq!(
            roles,
            [
                (789, ProcessRole::Rank, Some(0)),
                (800, ProcessRole::Child, Some(0)),
                (4242, ProcessRole::Other, None)
            ]
        );
        assert_eq!(report.processes[0].peak_memory_bytes, Some(1_061_158_912));

        let none = super::report(Err(NvmlError::NoDriver { why: "no such file".into() }.into()), &job);
        assert_eq!(
            none.unavailable.as_deref(),
            Some("libnvidia-ml.so.1 not found: no NVIDIA driver on this machine (no such file)")
        );
    }
}
