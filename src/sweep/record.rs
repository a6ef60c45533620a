//! What `sweep.json` holds: every point with every run's figures, each point's summary over its
//! runs, and the verdict. Plain serde data; [`summarise_run`] reads one run's figures out of its
//! [`ScenarioResult`].

use serde::{Deserialize, Serialize};

use crate::scenario::OutcomeKind;
use crate::schema::{DatasetSharing, ProcessRole, ScenarioResult};

/// One `ups-doctor sweep`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepRecord {
    pub tool_version: String,
    pub started_at: String,
    pub command: Vec<String>,
    /// The scenario file every point starts from, as given.
    pub scenario_file: String,
    pub scenario_name: String,
    /// The `--set` overrides every point shares.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<String>,
    /// Each `--vary` as written.
    pub vary: Vec<String>,
    pub runs_per_point: usize,
    /// Thrown-away runs made before the first measured one of this invocation.
    pub warmup_runs: usize,
    /// Most real runs this invocation may make (warm-up included).
    pub budget: usize,
    /// Real runs this invocation made (warm-up included); cached runs are free.
    pub real_runs: usize,
    /// The budget ran out before every point had its runs.
    pub budget_exhausted: bool,
    /// The user stopped the sweep.
    pub interrupted: bool,
    /// The disk of the sweep's folder filled: the sweep stopped there, keeping what it had.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_full: Option<DiskFull>,
    pub points: Vec<PointRecord>,
    pub verdict: SweepVerdict,
}

/// Where a sweep's disk filled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiskFull {
    /// The sweep's folder, on the disk that filled.
    pub folder: String,
    /// The file or folder that could not be written, where it is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The error, in the system's words (`No space left on device (os error 28)`).
    pub error: String,
}

/// One configuration of the grid.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointRecord {
    /// 1-based, in grid order.
    pub index: usize,
    /// Its settings, `data.workers=2 data.start_method=spawn`.
    pub label: String,
    /// The same, one `path=value` each.
    pub settings: Vec<String>,
    /// `launch.world_size` of the point (for scaling).
    pub world_size: u32,
    /// The configuration hash its runs are cached under (`cache/HASH.json`).
    pub hash: String,
    pub runs: Vec<PointRun>,
    pub summary: PointSummary,
    /// Fields of the configuration left at their defaults at this point because they do not
    /// apply there, each with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped: Vec<String>,
}

/// One real run of a point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointRun {
    /// Its run folder (`result.json`, `report.md`, the scenario's logs), relative to the sweep's.
    pub dir: String,
    /// Made by an earlier invocation and read from the cache.
    #[serde(default)]
    pub cached: bool,
    pub outcome: OutcomeKind,
    pub met_expectation: bool,
    /// The failure pattern the judge established, when it failed with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    pub headline: String,
    pub wall_s: f64,
    pub steps_per_s: Option<f64>,
    pub samples_per_s: Option<f64>,
    /// The ranks' mean share of step time spent waiting for data.
    pub data_wait_fraction: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<PointMemory>,
    /// Each GPU the run used (NVML), over the readings in which a process of the run held it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<PointGpu>,
}

/// One GPU of one run: utilisation and SM activity (median and peak over the readings in which
/// the run held it) and the peak memory used on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointGpu {
    pub index: u32,
    pub util_median: Option<f64>,
    pub util_peak: Option<f64>,
    /// GPM SM activity; absent on GPUs without GPM counters (before Hopper).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_active_median: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_used_peak_bytes: Option<u64>,
}

/// One GPU over a point's passing runs: the runs' utilisation medians as a range, the highest
/// peak, and the SM activity medians.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuRange {
    pub index: u32,
    pub util_percent: Option<Range>,
    pub util_peak: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_active_percent: Option<Range>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_used_peak_bytes: Option<u64>,
}

/// A run's memory: the tree's peak PSS, each process's peak, the dataset's sharing, `/dev/shm`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointMemory {
    /// The highest sum of PSS over every process of every rank at one sample.
    pub tree_peak_pss_bytes: u64,
    pub processes: Vec<ProcessPeak>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub datasets: Vec<DatasetSharing>,
    pub shm_peak_used_bytes: Option<u64>,
    /// The most this run's own `/dev/shm` segments held at once.
    pub shm_peak_ours_bytes: u64,
}

/// One process's peak, PSS against USS.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessPeak {
    pub rank: u32,
    pub role: ProcessRole,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<u32>,
    pub peak_pss_bytes: u64,
    pub peak_uss_bytes: u64,
}

/// Smallest, median and largest value over a point's runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Range {
    pub min: f64,
    pub median: f64,
    pub max: f64,
    pub n: usize,
}

impl Range {
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Range> {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Some(Range { min: v[0], median, max: v[n - 1], n })
    }

    /// Whether the two ranges share a value: the measurements cannot order them.
    pub fn overlaps(&self, other: &Range) -> bool {
        self.min <= other.max && other.min <= self.max
    }
}

/// A point over its runs. Throughput, data waits and memory are over the runs that passed
/// only: a failed run's figures are never mixed into a passing one's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PointSummary {
    pub runs: usize,
    pub passed_runs: usize,
    /// The first failed run's outcome, pattern and headline, when any run failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<FailureSeen>,
    pub steps_per_s: Option<Range>,
    pub samples_per_s: Option<Range>,
    pub data_wait_fraction: Option<Range>,
    pub tree_peak_pss_bytes: Option<Range>,
    pub shm_peak_ours_bytes: Option<Range>,
    /// The largest per-process peak PSS of a worker, of a rank (over the passing runs).
    pub worker_peak_pss_bytes: Option<u64>,
    pub worker_peak_uss_bytes: Option<u64>,
    pub rank_peak_pss_bytes: Option<u64>,
    /// The dataset cache as the last passing run with one saw it (every rank together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<DatasetStory>,
    /// Each GPU the passing runs used, by index.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuRange>,
}

/// How a point failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureSeen {
    pub outcome: OutcomeKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    pub headline: String,
    pub failed_runs: usize,
}

/// The dataset cache of a point, every rank together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetStory {
    pub cache: String,
    pub bytes: u64,
    pub workers: u32,
    pub private_copies: u32,
    pub duplicated_bytes: u64,
    pub shared_bytes: u64,
    /// Whether USS could tell (the cache is large enough next to a worker's own memory).
    pub judged: bool,
}

/// What the sweep found, point numbers 1-based as in [`PointRecord::index`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SweepVerdict {
    pub fastest: Option<Fastest>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scaling: Vec<Scaling>,
    pub memory: MemoryStory,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<Failed>,
    /// Some measured point has a single run: its noise is unknown.
    pub noise_unknown: bool,
    /// Points with no run yet (budget or interrupt).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unmeasured: Vec<usize>,
}

/// The passing point with the highest median samples/s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fastest {
    pub point: usize,
    pub samples_per_s: Range,
    /// Its median over the first point's median, when the first point passed.
    pub ratio_to_first: Option<f64>,
    /// Passing points whose samples/s range overlaps the fastest's: no winner between them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub within_noise_of: Vec<usize>,
}

/// A point with more ranks against the same configuration with the fewest ranks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scaling {
    pub point: usize,
    pub baseline: usize,
    pub ranks: u32,
    pub baseline_ranks: u32,
    /// Median samples/s (all ranks) over the baseline's median.
    pub speedup: f64,
    /// `speedup / (ranks / baseline_ranks)`.
    pub efficiency: f64,
    /// The ranks' median share of step time waiting for data at this point.
    pub data_wait_fraction: Option<f64>,
    /// The two samples/s ranges overlap: no speed-up the measurements support.
    pub within_noise: bool,
}

/// Memory across the points that passed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryStory {
    /// (point, median peak PSS of the whole tree) with the least and the most.
    pub smallest: Option<(usize, u64)>,
    pub largest: Option<(usize, u64)>,
    /// Points whose workers held private copies of the dataset cache.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub duplicated: Vec<usize>,
    /// Points whose workers shared the cache (judged, no private copy).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared: Vec<usize>,
}

/// A point where some run failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failed {
    pub point: usize,
    pub outcome: OutcomeKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    pub headline: String,
    pub failed_runs: usize,
    pub runs: usize,
}

/// One run's figures, read from its result.
pub fn summarise_run(result: &ScenarioResult, dir: String) -> PointRun {
    let waits: Vec<f64> = result.ranks.iter().filter_map(|r| r.data_wait_fraction).collect();
    let memory = result.memory.as_ref().map(|m| PointMemory {
        tree_peak_pss_bytes: m.series.iter().map(|p| p.pss_bytes.iter().sum::<u64>()).max().unwrap_or_else(
            || {
                // No series point (a run shorter than one sample): the processes' own peaks.
                m.processes.iter().map(|p| p.peak_pss_bytes).sum()
            },
        ),
        processes: m
            .processes
            .iter()
            .map(|p| ProcessPeak {
                rank: p.rank,
                role: p.role,
                worker: p.worker,
                peak_pss_bytes: p.peak_pss_bytes,
                peak_uss_bytes: p.peak_uss_bytes,
            })
            .collect(),
        datasets: m.datasets.clone(),
        shm_peak_used_bytes: m.shm.peak_used_bytes,
        shm_peak_ours_bytes: m.shm.peak_ours_bytes,
    });
    PointRun {
        dir,
        cached: false,
        outcome: result.outcome,
        met_expectation: result.met_expectation,
        pattern: result.verdict.pattern.clone(),
        headline: result.verdict.headline.clone(),
        wall_s: result.wall_s,
        steps_per_s: result.steps_per_s,
        samples_per_s: result.samples_per_s,
        data_wait_fraction: (!waits.is_empty()).then(|| waits.iter().sum::<f64>() / waits.len() as f64),
        memory,
        gpus: result.gpu.as_ref().map_or_else(Vec::new, |g| {
            g.gpus
                .iter()
                .filter(|g| g.used_by_run)
                .map(|g| PointGpu {
                    index: g.index,
                    util_median: g.util_percent.map(|u| u.median),
                    util_peak: g.util_percent.map(|u| u.peak),
                    sm_active_median: g.sm_active_percent.map(|u| u.median),
                    memory_used_peak_bytes: g.memory_used_peak_bytes,
                })
                .collect()
        }),
    }
}

/// Each GPU over the passing runs, by index.
fn gpu_ranges(passed: &[&PointRun]) -> Vec<GpuRange> {
    let mut indices: Vec<u32> = passed.iter().flat_map(|r| r.gpus.iter().map(|g| g.index)).collect();
    indices.sort_unstable();
    indices.dedup();
    indices
        .into_iter()
        .map(|index| {
            let of = || passed.iter().flat_map(|r| r.gpus.iter()).filter(move |g| g.index == index);
            GpuRange {
                index,
                util_percent: Range::of(of().filter_map(|g| g.util_median)),
                util_peak: of().filter_map(|g| g.util_peak).reduce(f64::max),
                sm_active_percent: Range::of(of().filter_map(|g| g.sm_active_median)),
                memory_used_peak_bytes: of().filter_map(|g| g.memory_used_peak_bytes).max(),
            }
        })
        .collect()
}

/// A point's summary over its runs.
pub fn summarise_point(runs: &[PointRun]) -> PointSummary {
    let passed: Vec<&PointRun> = runs.iter().filter(|r| r.outcome == OutcomeKind::Passed).collect();
    let failed: Vec<&PointRun> = runs.iter().filter(|r| r.outcome != OutcomeKind::Passed).collect();
    let failure = failed.first().map(|f| FailureSeen {
        outcome: f.outcome,
        pattern: f.pattern.clone(),
        headline: f.headline.clone(),
        failed_runs: failed.len(),
    });
    let mems: Vec<&PointMemory> = passed.iter().filter_map(|r| r.memory.as_ref()).collect();
    let peak = |role: ProcessRole, f: fn(&ProcessPeak) -> u64| {
        mems.iter().flat_map(|m| m.processes.iter()).filter(|p| p.role == role).map(f).max()
    };
    let dataset = mems.iter().rev().find(|m| !m.datasets.is_empty()).map(|m| {
        let d = &m.datasets;
        DatasetStory {
            cache: d[0].cache.clone(),
            bytes: d.iter().map(|x| x.bytes).sum(),
            workers: d.iter().map(|x| x.workers).sum(),
            private_copies: d.iter().map(|x| x.private_copies).sum(),
            duplicated_bytes: d.iter().map(|x| x.duplicated_bytes).sum(),
            shared_bytes: d.iter().map(|x| x.shared_bytes).sum(),
            judged: d.iter().all(|x| x.judged),
        }
    });
    PointSummary {
        runs: runs.len(),
        passed_runs: passed.len(),
        failure,
        steps_per_s: Range::of(passed.iter().filter_map(|r| r.steps_per_s)),
        samples_per_s: Range::of(passed.iter().filter_map(|r| r.samples_per_s)),
        data_wait_fraction: Range::of(passed.iter().filter_map(|r| r.data_wait_fraction)),
        tree_peak_pss_bytes: Range::of(mems.iter().map(|m| m.tree_peak_pss_bytes as f64)),
        shm_peak_ours_bytes: Range::of(mems.iter().map(|m| m.shm_peak_ours_bytes as f64)),
        worker_peak_pss_bytes: peak(ProcessRole::Worker, |p| p.peak_pss_bytes),
        worker_peak_uss_bytes: peak(ProcessRole::Worker, |p| p.peak_uss_bytes),
        rank_peak_pss_bytes: peak(ProcessRole::Rank, |p| p.peak_pss_bytes),
        dataset,
        gpus: gpu_ranges(&passed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_take_the_median_and_overlap_when_they_share_a_value() {
        let a = Range::of([3.0, 1.0, 2.0]).unwrap();
        assert_eq!((a.min, a.median, a.max, a.n), (1.0, 2.0, 3.0, 3));
        let b = Range::of([2.5, 4.0]).unwrap();
        assert_eq!(b.median, 3.25);
        assert!(a.overlaps(&b));
        assert!(!a.overlaps(&Range::of([3.5]).unwrap()));
        assert!(Range::of([f64::NAN]).is_none());
    }

    /// The H200 recording (scripts/gpu-check.sh) folded the way a run folds it: a sweep point
    /// keeps each used GPU's figures, and a point's summary ranges them over its passing runs
    /// only.
    #[test]
    fn a_point_keeps_the_gpu_figures_of_its_passing_runs() {
        use crate::report::fixtures;
        let mut s = fixtures::passing();
        s.gpu = Some(fixtures::h200_gpu_report());
        let run = summarise_run(&s, "1-a".into());
        assert_eq!(run.gpus.len(), 1);
        let g = &run.gpus[0];
        assert_eq!((g.index, g.util_median, g.util_peak), (0, Some(21.0), Some(27.0)));
        assert_eq!(g.memory_used_peak_bytes, Some(1_070_399_488));
        assert!((g.sm_active_median.unwrap() - 4.9156).abs() < 1e-3);

        let mut other = run.clone();
        other.gpus[0].util_median = Some(25.0);
        other.gpus[0].util_peak = Some(31.0);
        let mut failed = run.clone();
        failed.outcome = OutcomeKind::Exited;
        failed.gpus[0].util_median = Some(99.0);
        let summary = summarise_point(&[run.clone(), other, failed]);
        let r = &summary.gpus[0];
        let util = r.util_percent.unwrap();
        assert_eq!((util.min, util.median, util.max, util.n), (21.0, 23.0, 25.0, 2));
        assert_eq!(r.util_peak, Some(31.0));

        // A run on the CPU (no GPU report, or a GPU it never used) has no GPU figures.
        s.gpu = Some(fixtures::h200_gpu_report());
        s.gpu.as_mut().unwrap().gpus[0].used_by_run = false;
        assert!(summarise_run(&s, "1-b".into()).gpus.is_empty());
        s.gpu = None;
        assert!(summarise_point(&[summarise_run(&s, "1-c".into())]).gpus.is_empty());
    }
}
