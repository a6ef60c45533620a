//! Folds NVML samples into what the report shows: per GPU the median and peak utilisation, SM
//! activity (GPM), memory, clocks, power, temperature and why clocks were held down; per process
//! of the run the GPU memory it held; a thinned series for the charts (the verdict's GPU notes are
//! [`crate::diagnose`]'s). Pure: the NVML calls happen in [`crate::probe::nvml`], driven by
//! `supervise`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::probe::nvml::{GpuInfo, GpuReading};

use super::state::RankState;
use crate::schema::{
    ClockReason, GpuPoint, GpuPointValues, GpuProcessPeak, GpuReport, GpuSummary, ProcessRole, Stat,
};

/// NVML's clock event reasons (`nvmlClocksEventReason…`), bit and name.
pub const CLOCK_REASONS: [(u64, &str); 9] = [
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
];

/// The names of the reasons set in `mask`, in bit order; unknown bits as `0x…`.
pub fn clock_reason_names(mask: u64) -> Vec<String> {
    let mut names: Vec<String> =
        CLOCK_REASONS.iter().filter(|(bit, _)| mask & bit != 0).map(|(_, n)| n.to_string()).collect();
    let known: u64 = CLOCK_REASONS.iter().map(|(b, _)| b).sum();
    if mask & !known != 0 {
        names.push(format!("{:#x}", mask & !known));
    }
    names
}

/// A sample as taken: when, and every GPU's reading.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuSample {
    pub t_s: f64,
    pub gpus: Vec<GpuReading>,
}

/// What a process on a GPU is to the run: its role, its rank, its worker id.
pub type Label = (ProcessRole, Option<u32>, Option<u32>);

/// Accumulates samples during a run; [`GpuRecorder::finish`] makes the report.
#[derive(Debug)]
pub struct GpuRecorder {
    interval_s: f64,
    info: Vec<GpuInfo>,
    gpm_missing: Vec<(u32, String)>,
    samples: Vec<GpuSample>,
}

impl GpuRecorder {
    pub fn new(interval_s: f64, info: Vec<GpuInfo>, gpm_missing: Vec<(u32, String)>) -> GpuRecorder {
        GpuRecorder { interval_s, info, gpm_missing, samples: Vec::new() }
    }

    pub fn record(&mut self, sample: GpuSample) {
        self.samples.push(sample);
    }

    /// The report, with processes labelled from the ranks' pids (`rank_pids[r]`) and the workers
    /// their markers reported.
    pub fn finish(self, ranks: &[&RankState], rank_pids: &[Option<u32>]) -> GpuReport {
        self.finish_labelled(|pid: u32| -> Label {
            if let Some(r) = rank_pids.iter().position(|p| *p == Some(pid)) {
                return (ProcessRole::Rank, Some(r as u32), None);
            }
            for (r, state) in ranks.iter().enumerate() {
                if let Some(w) = state.workers.iter().find(|w| w.pid == pid) {
                    return (ProcessRole::Worker, Some(r as u32), Some(w.id));
                }
            }
            (ProcessRole::Other, None, None)
        })
    }

    /// The report, with each process on a GPU labelled by `label` (role, rank, worker id);
    /// readings count where a process not labelled `Other` held the GPU.
    pub fn finish_labelled(self, label: impl Fn(u32) -> Label) -> GpuReport {
        let of_run = |pid: u32| label(pid).0 != ProcessRole::Other;
        let indexes: Vec<u32> = match self.samples.first() {
            Some(s) => s.gpus.iter().map(|g| g.index).collect(),
            None => self.info.iter().map(|g| g.index).collect(),
        };
        let mut peaks: BTreeMap<(u32, u32), Option<u64>> = BTreeMap::new();
        for s in &self.samples {
            for g in &s.gpus {
                for p in &g.processes {
                    let peak = peaks.entry((g.index, p.pid)).or_insert(None);
                    *peak = match (*peak, p.memory_bytes) {
                        (Some(a), Some(b)) => Some(a.max(b)),
                        (a, b) => a.or(b),
                    };
                }
            }
        }
        let gpus = indexes
            .iter()
            .map(|&index| {
                let readings: Vec<&GpuReading> =
                    self.samples.iter().filter_map(|s| s.gpus.iter().find(|g| g.index == index)).collect();
                let used: Vec<&GpuReading> =
                    readings.iter().copied().filter(|r| r.processes.iter().any(|p| of_run(p.pid))).collect();
                let counted = if used.is_empty() { readings.clone() } else { used.clone() };
                let stat = |f: &dyn Fn(&GpuReading) -> Option<f64>| {
                    Stat::of(&counted.iter().filter_map(|r| f(r)).collect::<Vec<_>>())
                };
                let info = self.info.iter().find(|i| i.index == index);
                let n = counted.len().max(1) as f64;
                let clock_reasons = CLOCK_REASONS
                    .iter()
                    .filter_map(|(bit, name)| {
                        let hits =
                            counted.iter().filter(|r| r.clock_reasons.is_some_and(|m| m & bit != 0)).count();
                        (hits > 0).then(|| ClockReason { reason: name.to_string(), share: hits as f64 / n })
                    })
                    .collect();
                let sm_active = stat(&|r| r.sm_active_percent);
                GpuSummary {
                    index,
                    name: info.map(|i| i.name.clone()).unwrap_or_default(),
                    memory_total_bytes: info
                        .map(|i| i.memory_total_bytes)
                        .or_else(|| readings.iter().find_map(|r| r.memory_total_bytes))
                        .unwrap_or(0),
                    used_by_run: !used.is_empty(),
                    samples_counted: counted.len() as u64,
                    util_percent: stat(&|r| r.util_percent.map(f64::from)),
                    sm_active_percent: sm_active,
                    tensor_active_percent: stat(&|r| r.tensor_active_percent),
                    sm_activity_missing: match sm_active {
                        Some(_) => None,
                        None => Some(
                            self.gpm_missing
                                .iter()
                                .find(|(i, _)| *i == index)
                                .map(|(_, why)| why.clone())
                                .unwrap_or_else(|| "NVML returned no GPM metrics".to_string()),
                        ),
                    },
                    memory_used_peak_bytes: readings.iter().filter_map(|r| r.memory_used_bytes).max(),
                    sm_clock_mhz: stat(&|r| r.sm_clock_mhz.map(f64::from)),
                    power_w: stat(&|r| r.power_mw.map(|mw| f64::from(mw) / 1000.0)),
                    temperature_peak_c: readings.iter().filter_map(|r| r.temperature_c).max(),
                    clock_reasons,
                }
            })
            .collect();
        let processes = peaks
            .into_iter()
            .map(|((gpu, pid), peak)| {
                let (role, rank, worker) = label(pid);
                GpuProcessPeak { gpu, pid, role, rank, worker, peak_memory_bytes: peak }
            })
            .collect();
        let points: Vec<GpuPoint> = self
            .samples
            .iter()
            .map(|s| GpuPoint {
                t_s: s.t_s,
                gpus: indexes
                    .iter()
                    .map(|&i| {
                        let r = s.gpus.iter().find(|g| g.index == i);
                        GpuPointValues {
                            util_percent: r.and_then(|r| r.util_percent).map(f64::from),
                            sm_active_percent: r.and_then(|r| r.sm_active_percent),
                            memory_used_bytes: r.and_then(|r| r.memory_used_bytes),
                        }
                    })
                    .collect(),
            })
            .collect();
        GpuReport {
            unavailable: None,
            interval_s: self.interval_s,
            samples: self.samples.len() as u64,
            gpus,
            processes,
            series: thin(points, GpuReport::MAX_POINTS),
        }
    }
}

/// At most `max` points; each keeps the largest values of the samples it stands for, at the time
/// of the last of them.
fn thin(points: Vec<GpuPoint>, max: usize) -> Vec<GpuPoint> {
    if points.len() <= max {
        return points;
    }
    let chunk = points.len().div_ceil(max);
    let fmax = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    points
        .chunks(chunk)
        .map(|c| {
            let last = c.last().expect("chunks are not empty");
            let gpus = (0..last.gpus.len())
                .map(|i| {
                    c.iter().filter_map(|p| p.gpus.get(i)).fold(GpuPointValues::default(), |acc, v| {
                        GpuPointValues {
                            util_percent: fmax(acc.util_percent, v.util_percent),
                            sm_active_percent: fmax(acc.sm_active_percent, v.sm_active_percent),
                            memory_used_bytes: acc.memory_used_bytes.max(v.memory_used_bytes),
                        }
                    })
                })
                .collect();
            GpuPoint { t_s: last.t_s, gpus }
        })
        .collect()
}

/// The real H200 recording, for the tests of every module that folds NVML readings.
#[cfg(test)]
pub(crate) mod h200 {
    use super::{GpuRecorder, GpuSample};
    use crate::probe::nvml::GpuInfo;

    /// Recorded, not written: `ups-doctor nvml-record --count 100 --every-ms 200` on an H200 while
    /// `scenarios/gpu/single-cuda.json` trained beside it (rank pid 789; scripts/gpu-check.sh,
    /// 2026-11-27).
    pub(crate) fn recording() -> Vec<GpuSample> {
        include_str!("fixtures/nvml-h200-single-cuda.jsonl")
            .lines()
            .map(|l| serde_json::from_str(l).expect("a recorded line parses"))
            .collect()
    }

    pub(crate) fn h200() -> Vec<GpuInfo> {
        vec![GpuInfo {
            index: 0,
            name: "NVIDIA H200".into(),
            uuid: "GPU-0".into(),
            memory_total_bytes: 150_754_820_096,
        }]
    }

    /// A recorder at 200 ms over `samples`, the H200 described.
    pub(crate) fn h200_recorder(samples: Vec<GpuSample>, missing: Vec<(u32, String)>) -> GpuRecorder {
        let mut rec = GpuRecorder::new(0.2, h200(), missing);
        for s in samples {
            rec.record(s);
        }
        rec
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::nvml::GpuProcess;
    use crate::schema::WorkerInfo;

    const GIB: u64 = 1 << 30;

    /// An H100 under a training loop: hand-written readings shaped like NVML's (utilisation in
    /// whole percent, power in mW, GPM SM activity below utilisation because kernels do not fill
    /// every SM). Kept beside the real H200 recording below for what that one never showed: a
    /// power cap holding clocks down, and a process of another program on the GPU.
    fn fixture() -> Vec<GpuSample> {
        let text = include_str!("fixtures/nvml-h100-training.json");
        serde_json::from_str(text).expect("the fixture parses")
    }

    use super::h200::{h200, h200_recorder, recording};

    fn h100() -> Vec<GpuInfo> {
        vec![GpuInfo {
            index: 0,
            name: "NVIDIA H100 80GB HBM3".into(),
            uuid: "GPU-0".into(),
            memory_total_bytes: 80 * GIB,
        }]
    }

    fn recorder(samples: Vec<GpuSample>) -> GpuRecorder {
        let mut rec = GpuRecorder::new(0.2, h100(), Vec::new());
        for s in samples {
            rec.record(s);
        }
        rec
    }

    #[test]
    fn statistics_count_only_samples_in_which_the_run_held_the_gpu() {
        let rank = RankState::default();
        let report = recorder(fixture()).finish(&[&rank], &[Some(4242)]);
        let g = &report.gpus[0];
        assert!(g.used_by_run);
        // 12 samples, of which the first 2 (the rank still generating data on the CPU) and the
        // last (after exit) have no process of the run on the GPU.
        assert_eq!((report.samples, g.samples_counted), (12, 9));
        let util = g.util_percent.unwrap();
        assert_eq!((util.median, util.peak), (91.0, 100.0));
        let sm = g.sm_active_percent.unwrap();
        assert_eq!((sm.median, sm.peak), (42.5, 61.0));
        assert_eq!(g.memory_used_peak_bytes, Some(3_221_225_472));
        assert_eq!(g.temperature_peak_c, Some(41));
        assert_eq!(g.power_w.unwrap().peak, 312.5);
        assert_eq!(g.sm_activity_missing, None);
        // sw_power_cap in 3 of the 9 counted samples; the idle bit only outside them.
        assert_eq!(g.clock_reasons, [ClockReason { reason: "sw_power_cap".into(), share: 3.0 / 9.0 }]);
        assert_eq!(
            report.processes,
            [
                GpuProcessPeak {
                    gpu: 0,
                    pid: 999,
                    role: ProcessRole::Other,
                    rank: None,
                    worker: None,
                    peak_memory_bytes: Some(512 << 20)
                },
                GpuProcessPeak {
                    gpu: 0,
                    pid: 4242,
                    role: ProcessRole::Rank,
                    rank: Some(0),
                    worker: None,
                    peak_memory_bytes: Some(2_684_354_560)
                },
            ]
        );
    }

    /// The figures below were computed from the recording by a separate script, and match what
    /// that run's own sampler put in its result.json (utilisation median 21 %, peak 27 %, the
    /// rank's peak 1061158912 bytes).
    #[test]
    fn a_real_h200_recording_counts_the_samples_the_rank_held_the_gpu() {
        let report = h200_recorder(recording(), Vec::new()).finish(&[&RankState::default()], &[Some(789)]);
        let g = &report.gpus[0];
        assert!(g.used_by_run);
        // 100 readings over 20 s; the rank held the GPU in 47 of them (1.2 s to 10.4 s).
        assert_eq!((report.samples, g.samples_counted), (100, 47));
        let util = g.util_percent.unwrap();
        assert_eq!((util.median, util.peak), (21.0, 27.0));
        let sm = g.sm_active_percent.unwrap();
        assert!((sm.median - 4.9156).abs() < 1e-3 && (sm.peak - 6.2668).abs() < 1e-3, "{sm:?}");
        assert_eq!(g.memory_used_peak_bytes, Some(1_070_399_488));
        assert_eq!(g.temperature_peak_c, Some(39));
        assert_eq!(g.power_w.unwrap().peak, 141.46);
        // No clock reason was set while the rank held the GPU (no power cap, no throttling).
        assert!(g.clock_reasons.is_empty(), "{:?}", g.clock_reasons);
        assert_eq!(g.sm_activity_missing, None);
        let rank = report.processes.iter().find(|p| p.pid == 789).unwrap();
        assert_eq!(
            (rank.role, rank.rank, rank.peak_memory_bytes),
            (ProcessRole::Rank, Some(0), Some(1_061_158_912))
        );
        assert_eq!(report.processes.len(), 1, "{:?}", report.processes);
    }

    #[test]
    fn medians_of_even_counts_average_the_middle_pair() {
        assert_eq!(Stat::of(&[1.0, 3.0, 2.0, 10.0]).unwrap(), Stat { median: 2.5, peak: 10.0, mean: 4.0 });
        assert_eq!(Stat::of(&[]), None);
    }

    #[test]
    fn clock_reasons_decode_every_known_bit_and_show_the_rest() {
        assert_eq!(clock_reason_names(0x1 | 0x4), ["gpu_idle", "sw_power_cap"]);
        assert_eq!(clock_reason_names(0x40 | 0x1000), ["hw_thermal_slowdown", "0x1000"]);
        assert!(clock_reason_names(0).is_empty());
    }

    #[test]
    fn without_gpm_the_report_says_why_sm_activity_is_missing() {
        let mut samples = recording();
        for s in &mut samples {
            for g in &mut s.gpus {
                g.sm_active_percent = None;
                g.tensor_active_percent = None;
            }
        }
        let rec = h200_recorder(
            samples,
            vec![(0, "this GPU has no GPM counters (they need Hopper or newer)".into())],
        );
        let g = &rec.finish(&[&RankState::default()], &[Some(789)]).gpus[0];
        assert_eq!(g.sm_active_percent, None);
        assert_eq!(
            g.sm_activity_missing.as_deref(),
            Some("this GPU has no GPM counters (they need Hopper or newer)")
        );
    }

    #[test]
    fn workers_are_labelled_and_a_run_never_on_the_gpu_counts_every_sample() {
        // The recording's rank (pid 789) becomes a process of another program, and one reading
        // gains a worker of this run's rank.
        let mut samples = recording();
        for s in &mut samples {
            for g in &mut s.gpus {
                for p in &mut g.processes {
                    if p.pid == 789 {
                        p.pid = 5000;
                    }
                }
            }
        }
        samples[30].gpus[0].processes.push(GpuProcess { pid: 5001, memory_bytes: Some(600 << 20) });
        let mut rank = RankState::default();
        rank.workers.push(WorkerInfo { id: 1, pid: 5001, start_method: "spawn".into(), started_at_s: 1.0 });
        let report = h200_recorder(samples.clone(), Vec::new()).finish(&[&rank], &[Some(789)]);
        let w = report.processes.iter().find(|p| p.pid == 5001).unwrap();
        assert_eq!((w.role.as_str(), w.rank, w.worker), ("worker", Some(0), Some(1)));
        let other = report.processes.iter().find(|p| p.pid == 5000).unwrap();
        assert_eq!((other.role, other.rank), (ProcessRole::Other, None));
        // The worker was on the GPU in one reading: that one counts.
        assert_eq!(report.gpus[0].samples_counted, 1);
        let none = h200_recorder(samples, Vec::new()).finish(&[&RankState::default()], &[Some(1)]);
        assert!(!none.gpus[0].used_by_run);
        assert_eq!(none.gpus[0].samples_counted, 100);
    }

    #[test]
    fn long_series_are_thinned_keeping_peaks() {
        let base = recording();
        let mut rec = GpuRecorder::new(0.2, h200(), Vec::new());
        for i in 0..1000 {
            let mut s = base[i % base.len()].clone();
            s.t_s = i as f64 * 0.2;
            if i == 777 {
                s.gpus[0].util_percent = Some(100);
            }
            rec.record(s);
        }
        let report = rec.finish(&[&RankState::default()], &[Some(4242)]);
        assert!(report.series.len() <= GpuReport::MAX_POINTS);
        assert!(report.series.iter().any(|p| p.gpus[0].util_percent == Some(100.0)));
        assert_eq!(report.series.last().unwrap().t_s, 999.0 * 0.2);
    }
}
