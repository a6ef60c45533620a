//! GPU activity during a scenario (NVML), summarised per GPU and per process, or why there is none.

use serde::{Deserialize, Serialize};

use super::ProcessRole;

/// GPU activity during a scenario, or why there is none.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuReport {
    /// Why the GPUs were not sampled (no NVIDIA driver, …); everything else is empty then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
    /// Seconds between samples.
    pub interval_s: f64,
    pub samples: u64,
    pub gpus: Vec<GpuSummary>,
    /// GPU memory of every process NVML listed, the run's labelled by rank and worker.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<GpuProcessPeak>,
    /// At most [`GpuReport::MAX_POINTS`] points; each the largest values of the samples it stands for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub series: Vec<GpuPoint>,
}

impl GpuReport {
    pub const MAX_POINTS: usize = 100;

    /// A report that says why there are no GPU metrics.
    pub fn unavailable(why: impl Into<String>) -> GpuReport {
        GpuReport { unavailable: Some(why.into()), ..GpuReport::default() }
    }

    /// The GPU the summary line talks about: the first one a process of the run used, else the
    /// first one.
    pub fn main_gpu(&self) -> Option<&GpuSummary> {
        self.gpus.iter().find(|g| g.used_by_run).or(self.gpus.first())
    }
}

/// Median, peak and mean of a quantity over the samples that count.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Stat {
    pub median: f64,
    pub peak: f64,
    pub mean: f64,
}

impl Stat {
    /// `None` for no values.
    pub fn of(values: &[f64]) -> Option<Stat> {
        if values.is_empty() {
            return None;
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 { sorted[n / 2] } else { (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0 };
        Some(Stat { median, peak: sorted[n - 1], mean: sorted.iter().sum::<f64>() / n as f64 })
    }
}

/// One GPU over the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuSummary {
    pub index: u32,
    pub name: String,
    pub memory_total_bytes: u64,
    /// A process of the run held memory on this GPU in at least one sample.
    pub used_by_run: bool,
    /// Samples the statistics below are over: those in which a process of the run was on this GPU
    /// (all samples when none was).
    pub samples_counted: u64,
    /// NVML "utilization": percent of time a kernel was running.
    pub util_percent: Option<Stat>,
    /// GPM: percent of SMs busy, where the GPU has GPM.
    pub sm_active_percent: Option<Stat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_active_percent: Option<Stat>,
    /// Why there is no SM activity (the GPU has no GPM counters, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_activity_missing: Option<String>,
    pub memory_used_peak_bytes: Option<u64>,
    pub sm_clock_mhz: Option<Stat>,
    pub power_w: Option<Stat>,
    pub temperature_peak_c: Option<u32>,
    /// Why clocks were held below their maximum, with the share of counted samples.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clock_reasons: Vec<ClockReason>,
}

/// A reason NVML gave for clocks below their maximum, and how often.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClockReason {
    /// NVML's name without prefix, e.g. `sw_power_cap`.
    pub reason: String,
    /// Share of the counted samples (0–1) that had it.
    pub share: f64,
}

/// A process's peak GPU memory on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuProcessPeak {
    pub gpu: u32,
    pub pid: u32,
    /// `rank`, `worker` (a data-loader worker of `rank`) or `other` (not a process of this run).
    pub role: ProcessRole,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<u32>,
    pub peak_memory_bytes: Option<u64>,
}

/// All GPUs at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuPoint {
    /// Seconds since the scenario started.
    pub t_s: f64,
    /// In the order of [`GpuReport::gpus`].
    pub gpus: Vec<GpuPointValues>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuPointValues {
    pub util_percent: Option<f64>,
    pub sm_active_percent: Option<f64>,
    pub memory_used_bytes: Option<u64>,
}
