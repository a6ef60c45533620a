//! Folds memory samples into per-process peaks and a thinned series, judges whether a dataset
//! cache is shared or duplicated across workers, and sorts `/dev/shm` files into leftovers.
//! Pure: the procfs and `/dev/shm` reads happen in [`crate::probe`], driven by `supervise`.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use crate::probe::memory::Rollup;
use crate::probe::shm::{Segment, Usage};

use super::state::RankState;
use crate::schema::{DatasetSharing, MemoryPoint, MemoryReport, ProcessMemory, ProcessRole, ShmAt, ShmUsage};

/// A worker whose private memory reaches this share of the dataset holds a copy of its own.
const PRIVATE_COPY_SHARE: f64 = 0.8;
/// Smallest cache whose sharing USS can show: a worker that loaded libtorch holds about 60 MiB of
/// its own (measured: 58 MiB USS for a spawned worker of the debug build), so a smaller cache is
/// lost in it and a worker would look like it held a private copy whatever it did.
const MIN_JUDGED_BYTES: u64 = 64 << 20;

/// One process's memory at one sample.
#[derive(Debug, Clone)]
pub struct ProcSample {
    pub pid: u32,
    /// The process's start time (`/proc/PID/stat` field 22): a pid used again is another process.
    pub start_ticks: u64,
    /// Its rank as the run knows it when sampled; `None` for a process of a launcher's tree while
    /// ranks are still to be found (it may turn out to be one: see [`MemoryRecorder::finish`]).
    pub rank: Option<u32>,
    pub ppid: u32,
    pub command: String,
    pub mem: Rollup,
}

/// `/dev/shm` at one sample: the filesystem, and what this run's own segments hold.
#[derive(Debug, Clone, Copy, Default)]
pub struct ShmSample {
    pub usage: Option<Usage>,
    pub ours: u64,
}

/// One process's entry in [`MemoryRecorder`].
#[derive(Debug)]
struct Peak {
    rank: Option<u32>,
    ppid: u32,
    command: String,
    peak: Rollup,
}

/// Accumulates samples during a run; [`MemoryRecorder::finish`] makes the report.
#[derive(Debug)]
pub struct MemoryRecorder {
    world: u32,
    interval_s: f64,
    samples: u64,
    /// Keyed by (pid, start time): the rank the run last placed the process under, its command
    /// and its peaks. One entry per process even when its rank became known only later (the ranks
    /// below a launcher are counted as the launcher's until each names its own rank): a process
    /// listed under two ranks would be two rows with one pid in the report. The rank is `None`
    /// while no sample placed the process; its parent's pid places it at the end.
    peaks: BTreeMap<(u32, u64), Peak>,
    points: Vec<MemoryPoint>,
    /// The PSS of processes sampled before any rank was theirs: (the sample's index in `points`,
    /// the process, its PSS then), added to the rank the end places it under.
    unplaced: Vec<(usize, (u32, u64), u64)>,
    shm: ShmUsage,
}

impl MemoryRecorder {
    pub fn new(world: u32, interval_s: f64, private_shm: bool) -> MemoryRecorder {
        MemoryRecorder {
            world,
            interval_s,
            samples: 0,
            peaks: BTreeMap::new(),
            points: Vec::new(),
            unplaced: Vec::new(),
            shm: ShmUsage { private: private_shm, ..ShmUsage::default() },
        }
    }

    /// Adds one sample of every process of the run and of `/dev/shm`, taken at `t_s`.
    pub fn record(&mut self, t_s: f64, procs: &[ProcSample], shm: ShmSample) {
        self.samples += 1;
        // A run whose program formed a larger process group watches more ranks from then on: the
        // earlier samples had none of theirs.
        if let Some(world) = procs.iter().filter_map(|p| p.rank).map(|r| r + 1).max() {
            self.grow(world);
        }
        let mut pss = vec![0u64; self.world as usize];
        for p in procs {
            let key = (p.pid, p.start_ticks);
            match p.rank {
                Some(rank) => pss[rank as usize] += p.mem.pss,
                None => self.unplaced.push((self.points.len(), key, p.mem.pss)),
            }
            let entry = self.peaks.entry(key).or_insert_with(|| Peak {
                rank: None,
                ppid: p.ppid,
                command: String::new(),
                peak: Rollup::default(),
            });
            // Once placed, a process stays under the rank of its last placement.
            entry.rank = p.rank.or(entry.rank);
            entry.command.clone_from(&p.command);
            let peak = &mut entry.peak;
            peak.rss = peak.rss.max(p.mem.rss);
            peak.pss = peak.pss.max(p.mem.pss);
            peak.uss = peak.uss.max(p.mem.uss);
            peak.shared = peak.shared.max(p.mem.shared);
        }
        self.note_shm(shm);
        self.points.push(MemoryPoint { t_s, pss_bytes: pss, shm_used_bytes: shm.usage.map(|u| u.used) });
    }

    /// Widens the per-rank totals to `world` ranks (earlier samples had none of the new ones').
    fn grow(&mut self, world: u32) {
        if world > self.world {
            self.world = world;
            self.points.iter_mut().for_each(|p| p.pss_bytes.resize(world as usize, 0));
        }
    }

    /// Places the processes no sample placed: a rank's own process by the pids the run settled
    /// at its end (a launcher's rank whose markers named it only after it died), then, as often as
    /// that places more, a child under its parent's rank. What stays unplaced (the launcher
    /// itself, say) is left out, as a process of no rank is everywhere else.
    fn place(&mut self, rank_pids: &[Option<u32>]) {
        loop {
            let placed: BTreeMap<u32, u32> =
                self.peaks.iter().filter_map(|(&(pid, _), e)| Some((pid, e.rank?))).collect();
            let mut changed = false;
            for (&(pid, _), entry) in self.peaks.iter_mut().filter(|(_, e)| e.rank.is_none()) {
                let own = rank_pids.iter().position(|p| *p == Some(pid)).map(|r| r as u32);
                entry.rank = own.or_else(|| placed.get(&entry.ppid).copied());
                changed |= entry.rank.is_some();
            }
            if !changed {
                break;
            }
        }
        self.peaks.retain(|_, e| e.rank.is_some());
        if let Some(world) = self.peaks.values().filter_map(|e| e.rank).map(|r| r + 1).max() {
            self.grow(world);
        }
        for (point, key, pss) in std::mem::take(&mut self.unplaced) {
            if let Some(rank) = self.peaks.get(&key).and_then(|e| e.rank) {
                self.points[point].pss_bytes[rank as usize] += pss;
            }
        }
    }

    /// Records `/dev/shm` at the moment `rank` was seen to end: the figure a bus error is
    /// judged by.
    pub fn rank_ended(&mut self, rank: u32, t_s: f64, shm: ShmSample) {
        self.note_shm(shm);
        if let Some(u) = shm.usage {
            self.shm.at_rank_end.push(ShmAt { rank, t_s, used_bytes: u.used, total_bytes: u.total });
        }
    }

    fn note_shm(&mut self, shm: ShmSample) {
        if let Some(u) = shm.usage {
            self.shm.total_bytes = Some(u.total);
            self.shm.peak_used_bytes = Some(self.shm.peak_used_bytes.unwrap_or(0).max(u.used));
        }
        self.shm.peak_ours_bytes = self.shm.peak_ours_bytes.max(shm.ours);
    }

    /// The report, with every process labelled from its rank's markers (`ranks[r]` is rank r).
    pub fn finish(mut self, ranks: &[&RankState], rank_pids: &[Option<u32>]) -> MemoryReport {
        self.place(rank_pids);
        let mut processes: Vec<ProcessMemory> = self
            .peaks
            .into_iter()
            .filter_map(|((pid, _), Peak { rank, command, peak, .. })| Some((pid, rank?, command, peak)))
            .map(|(pid, rank, command, peak)| {
                let state = ranks.get(rank as usize);
                let worker = state.and_then(|s| s.workers.iter().find(|w| w.pid == pid)).map(|w| w.id);
                let is_rank = rank_pids.get(rank as usize).copied().flatten() == Some(pid);
                let role = if is_rank {
                    ProcessRole::Rank
                } else if worker.is_some() {
                    ProcessRole::Worker
                } else {
                    ProcessRole::Child
                };
                ProcessMemory {
                    rank,
                    role,
                    worker,
                    pid,
                    command,
                    peak_rss_bytes: peak.rss,
                    peak_pss_bytes: peak.pss,
                    peak_uss_bytes: peak.uss,
                    peak_shared_bytes: peak.shared,
                }
            })
            .collect();
        let order =
            |p: &ProcessMemory| (p.rank, p.role != ProcessRole::Rank, p.worker.unwrap_or(u32::MAX), p.pid);
        processes.sort_by_key(order);
        let datasets = ranks
            .iter()
            .enumerate()
            .filter_map(|(rank, state)| {
                let dataset = state.dataset.as_ref()?;
                let uss: Vec<u64> = state
                    .workers
                    .iter()
                    .map(|w| processes.iter().find(|p| p.pid == w.pid).map_or(0, |p| p.peak_uss_bytes))
                    .collect();
                Some(dataset_sharing(rank as u32, dataset.bytes, &dataset.cache, uss))
            })
            .collect();
        MemoryReport {
            interval_s: self.interval_s,
            samples: self.samples,
            processes,
            series: thin(self.points, MemoryReport::MAX_POINTS),
            shm: self.shm,
            datasets,
        }
    }
}

/// When a process's `smaps_rollup` is read again. It is the one costly read of a sample: the
/// kernel walks every page the process maps (0.67 ms for a 150 MiB rank, measured; 9 ms of CPU
/// for a 700 MiB one) while holding its memory map's lock, which the rank's own `mmap` and
/// `munmap` wait for. Its resident size (`statm`, read in microseconds) is read every sample; the
/// full figures are read again once the last reading is [`ROLLUP_EVERY`] old, or
/// [`ROLLUP_COST_FACTOR`] times the CPU time it took if that is longer (at most a quarter of a
/// percent of a core for each process), and sooner when the resident size rose a sixteenth above
/// the largest any reading found, or fell a sixteenth below the last reading's, though not before
/// that same multiple of its cost (at once for a process read in under 0.6 ms, every 3.6 s for a
/// 700 MiB rank): a rising peak is followed as closely as the cost allows, and a size that swings
/// between steps is read at its top and its bottom, not at every swing. A process that lost half
/// its resident size is read at once.
/// A process whose sharing came out the same (what its resident size holds beyond its PSS, and
/// beyond its USS, within a sixteenth of it) is read half as often each time, down to once every
/// [`ROLLUP_BACKOFF_MAX`] intervals; its own pages may swing with each step's tensors meanwhile.
/// Sharing that moved (pages copied on write make the USS grow, the resident size not), and a
/// process joining the run (a forked worker halves what its parent's shared pages count for),
/// bring the interval back to one.
///
/// Why so sparingly: on a machine the ranks fill, the sampler's CPU is taken from them. With one
/// percent of a core for each process, and every move of a sixteenth read at the next sample, the
/// readings of two 700 MiB ranks were the sampler's 170–210 ms in a 14 s 2-rank DDP run on two
/// cores, most of ups-doctor's own CPU (`bench/own_cpu.py`); this way, 80 ms (BENCHMARKS.md).
///
/// While memory is nearly used up ([`RollupCadence::near_limit`]) a process read before is not
/// read in full again: reading `smaps_rollup` takes a reference on the process's memory for the
/// whole walk, and a process the OOM killer ends meanwhile has its memory freed only when the
/// reader lets go, by the low-priority sampler on a busy machine; the group stayed at its limit
/// and the OOM killer took a second process (`loader-spawn-memory-cache-oom` under load: the rank
/// killed 28 ms after its worker in 5 of 16 runs; 0 of 16 without the full readings). Its
/// figures then follow its resident size ([`Rollup::moved_to`]).
#[derive(Debug, Default)]
pub struct RollupCadence {
    /// By (pid, start time): its last full reading.
    last: BTreeMap<(u32, u64), Reading>,
    /// Whether this sample is taken with memory nearly used up.
    pub near_limit: bool,
}

/// A process's last full reading, for [`RollupCadence`].
#[derive(Debug, Clone, Copy)]
struct Reading {
    rollup: Rollup,
    /// When it was taken, and the CPU time it took.
    at: Instant,
    took: Duration,
    /// How many intervals the next waits for (1, doubling while the figures stay the same).
    times: u32,
    /// The largest resident size any full reading of the process found.
    high: u64,
}

/// The longest a process's PSS, USS and shared figures go unread while its resident size is flat.
pub const ROLLUP_EVERY: Duration = Duration::from_secs(1);
/// A reading waits at least this many times the CPU time the last one took (a quarter of a
/// percent of a core for each process).
pub const ROLLUP_COST_FACTOR: u32 = 400;
/// The most intervals a process whose full figures stay the same waits between readings.
pub const ROLLUP_BACKOFF_MAX: u32 = 8;

impl RollupCadence {
    /// The memory of process (`pid`, `start_ticks`) whose resident size is `rss` now: a fresh full
    /// reading from `read` (which returns it and the CPU time it took) when one is due, else the last
    /// one with the resident size of now. `None` when a due reading fails.
    pub fn memory(
        &mut self,
        (pid, start_ticks): (u32, u64),
        rss: u64,
        now: Instant,
        read: impl FnOnce() -> Option<(Rollup, Duration)>,
    ) -> Option<Rollup> {
        let key = (pid, start_ticks);
        let previous = self.last.get(&key).copied();
        if let Some(last) = previous {
            if self.near_limit {
                return Some(last.rollup.moved_to(rss));
            }
            let age = now.saturating_duration_since(last.at);
            let wait = last.took * ROLLUP_COST_FACTOR;
            let every = ROLLUP_EVERY.max(wait) * last.times;
            // Due sooner when the resident size rose a sixteenth above the largest any reading
            // found, or fell a sixteenth below the last reading's, as often as the last reading's
            // cost allows. Measured from wherever the last reading caught it, a 700 MiB rank's
            // swing of 7 % between steps was read each time that wait (3.6 s) passed, for as long
            // as it ran; from the highest reading, a swing is read at its top and its bottom, and
            // a new peak still is. A process that lost half its pages is read at once: a spawned
            // worker read between its fork and its `exec` shows the parent's pages, 1 GiB shared
            // and a USS of 0.6 MiB; kept after the `exec`, that USS hid the worker's own
            // libtorch, seen in a fresh-clone run of the CI command.
            let last_rss = last.rollup.rss;
            let moved = (rss > last.high + last.high / 16 || rss < last_rss - last_rss / 16) && age >= wait;
            if age < every && !moved && rss >= last_rss / 2 {
                return Some(Rollup { rss, ..last.rollup });
            }
        }
        let (rollup, took) = read()?;
        // The same sharing: what the resident pages are beyond its PSS and its USS (pages shared
        // with other processes) stays within a sixteenth of its resident size. A resident size
        // that swings with the tensors of each step, its USS with it, is no change of sharing;
        // compared figure by figure, a 7 % swing kept such a rank read every 3.6 s for as long
        // as it ran.
        let shared = |r: &Rollup| (r.rss.saturating_sub(r.pss), r.rss.saturating_sub(r.uss));
        let same = |a: u64, b: u64| a.abs_diff(b) <= rollup.rss / 16;
        let flat = previous.is_some_and(|b| {
            let ((pss_now, uss_now), (pss_then, uss_then)) = (shared(&rollup), shared(&b.rollup));
            same(pss_now, pss_then) && same(uss_now, uss_then)
        });
        let times = match previous {
            Some(p) if flat => (p.times * 2).min(ROLLUP_BACKOFF_MAX),
            _ => 1,
        };
        // A process now under half the largest reading starts its peak afresh: a spawned worker
        // read between its fork and its `exec` had its parent's size as its largest, and loading
        // libtorch after the `exec` was never a rise above it; read again only once a second, a
        // worker that lived under a second was left with its USS from before libtorch (seen in
        // the suite on two busy cores: 8 MiB).
        let high = match previous {
            Some(p) if rollup.rss >= p.high / 2 => p.high.max(rollup.rss),
            _ => rollup.rss,
        };
        self.last.insert(key, Reading { rollup, at: now, took, times, high });
        Some(rollup)
    }

    /// A process joined the run: every process is read again after one interval (what its
    /// parent's shared pages count for has changed).
    pub fn joined(&mut self) {
        for entry in self.last.values_mut() {
            entry.times = 1;
        }
    }

    /// The next sample reads every process in full, however recent or costly its last full
    /// reading: the peaks it keeps stay (they are the recorder's), only when to read again is
    /// forgotten.
    /// Not while memory is nearly used up: see [`RollupCadence`].
    pub fn read_all_afresh(&mut self) {
        if !self.near_limit {
            self.last.clear();
        }
    }

    /// Forgets processes not in `live` (pid, start time).
    pub fn keep_only(&mut self, live: &HashSet<(u32, u64)>) {
        self.last.retain(|key, _| live.contains(key));
    }
}

/// Whether each worker holds a private copy of a `bytes` dataset, from its peak USS: a worker
/// that only reads pages it shares (copy-on-write after fork, or a cache in `/dev/shm`) has a
/// USS far below the dataset's size.
pub fn dataset_sharing(rank: u32, bytes: u64, cache: &str, worker_uss: Vec<u64>) -> DatasetSharing {
    let workers = worker_uss.len() as u32;
    let judged = bytes >= MIN_JUDGED_BYTES;
    let copies = if bytes == 0 || !judged {
        0
    } else {
        worker_uss.iter().filter(|&&u| u as f64 >= bytes as f64 * PRIVATE_COPY_SHARE).count() as u32
    };
    DatasetSharing {
        rank,
        bytes,
        cache: cache.to_string(),
        workers,
        private_copies: copies,
        duplicated_bytes: u64::from(copies) * bytes,
        shared_bytes: if judged && workers > copies { bytes } else { 0 },
        worker_peak_uss_bytes: worker_uss,
        judged,
    }
}

/// At most `max` points; each stands for a run of consecutive samples and keeps their largest
/// values (a short spike must stay visible), at the time of the run's last sample.
fn thin(points: Vec<MemoryPoint>, max: usize) -> Vec<MemoryPoint> {
    if points.len() <= max {
        return points;
    }
    let chunk = points.len().div_ceil(max);
    points
        .chunks(chunk)
        .map(|c| {
            let last = c.last().expect("chunks are not empty");
            let width = last.pss_bytes.len();
            MemoryPoint {
                t_s: last.t_s,
                pss_bytes: (0..width).map(|i| c.iter().map(|p| p.pss_bytes[i]).max().unwrap_or(0)).collect(),
                shm_used_bytes: c.iter().filter_map(|p| p.shm_used_bytes).max(),
            }
        })
        .collect()
}

/// The prefix of every `/dev/shm` name this run creates.
pub fn segment_prefix(run_id: &str) -> String {
    format!("ups-doctor-{run_id}-")
}

/// Bytes held by this run's own segments.
pub fn ours_bytes(segments: &[Segment], run_id: &str) -> u64 {
    let prefix = segment_prefix(run_id);
    segments.iter().filter(|s| s.name.starts_with(&prefix)).map(|s| s.allocated).sum()
}

/// Files in `/dev/shm` at the end that were not there at the start, each with whether it is
/// this run's own: ups-doctor's (this run id), or PyTorch's named after a process of this run
/// (`torch_<pid>_…`, the segments its `file_system` sharing and its workers' batches make), made
/// while the run went on by a process that was the run's: proven the run's, not guessed.
/// Segments of other ups-doctor runs (another run id) are theirs to clean up and are left out.
pub fn new_segments(
    before: &[Segment],
    after: &[Segment],
    run_id: &str,
    run_pids: &[u32],
) -> Vec<(Segment, bool)> {
    let known: HashSet<(&str, u64)> = before.iter().map(|s| (s.name.as_str(), s.inode)).collect();
    let prefix = segment_prefix(run_id);
    let torch_of_ours = |name: &str| {
        let pid = name.strip_prefix("torch_").and_then(|rest| rest.split('_').next()?.parse::<u32>().ok());
        pid.is_some_and(|pid| run_pids.contains(&pid))
    };
    after
        .iter()
        .filter(|s| !known.contains(&(s.name.as_str(), s.inode)))
        .filter_map(|s| {
            let ours = s.name.starts_with(&prefix) || torch_of_ours(&s.name);
            (ours || !s.name.starts_with("ups-doctor-")).then(|| (s.clone(), ours))
        })
        .collect()
}

/// The run id and the harness's pid in a segment's name: run ids start with the harness's pid
/// and are three parts long (`ups-doctor-<pid>-<n>-<nanos>-…`, see `new_run_id`).
pub fn run_of(name: &str) -> Option<(&str, u32)> {
    let rest = name.strip_prefix("ups-doctor-")?;
    let mut ends = rest.match_indices('-').map(|(i, _)| i);
    let (first, third) = (ends.next()?, ends.nth(1)?);
    Some((&rest[..third], rest[..first].parse().ok()?))
}

/// Segments of earlier ups-doctor runs that are gone, by run: `gone(run id, harness pid)` is
/// asked once per run, and only a run it proves gone has its segments listed.
pub fn orphaned_segments<T>(
    segments: &[Segment],
    mut gone: impl FnMut(&str, u32) -> Option<T>,
) -> Vec<(T, Vec<&Segment>)> {
    let mut runs: Vec<(&str, Option<T>, Vec<&Segment>)> = Vec::new();
    for seg in segments {
        let Some((run, pid)) = run_of(&seg.name) else { continue };
        match runs.iter_mut().find(|(r, _, _)| *r == run) {
            Some((_, _, segs)) => segs.push(seg),
            None => runs.push((run, gone(run, pid), vec![seg])),
        }
    }
    runs.into_iter().filter_map(|(_, proof, segs)| Some((proof?, segs))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::observe::state::DatasetInfo;
    use crate::schema::WorkerInfo;

    const MIB: u64 = 1 << 20;

    fn mem(rss: u64, pss: u64, uss: u64) -> Rollup {
        Rollup { rss: rss * MIB, pss: pss * MIB, uss: uss * MIB, shared: (rss - uss) * MIB }
    }

    fn sample(pid: u32, rank: u32, m: Rollup) -> ProcSample {
        ProcSample { pid, start_ticks: 1, rank: Some(rank), ppid: 1, command: "ups-doctor".into(), mem: m }
    }

    fn shm(used: u64, ours: u64) -> ShmSample {
        ShmSample { usage: Some(Usage { total: 64 * MIB, used: used * MIB }), ours: ours * MIB }
    }

    #[test]
    fn peaks_are_per_process_and_totals_per_rank() {
        let mut rec = MemoryRecorder::new(2, 0.25, true);
        rec.record(0.25, &[sample(10, 0, mem(100, 80, 60)), sample(20, 1, mem(90, 70, 50))], shm(1, 0));
        rec.record(
            0.5,
            &[
                sample(10, 0, mem(120, 90, 70)),
                sample(11, 0, mem(40, 20, 10)),
                sample(20, 1, mem(80, 60, 40)),
            ],
            shm(9, 8),
        );
        rec.rank_ended(1, 0.6, shm(64, 63));
        let mut rank0 = RankState::default();
        rank0.workers.push(WorkerInfo { id: 0, pid: 11, start_method: "fork".into(), started_at_s: 0.3 });
        let rank1 = RankState::default();
        let report = rec.finish(&[&rank0, &rank1], &[Some(10), Some(20)]);
        assert_eq!(report.samples, 2);
        let roles: Vec<(u32, &str, Option<u32>, u64)> = report
            .processes
            .iter()
            .map(|p| (p.pid, p.role.as_str(), p.worker, p.peak_pss_bytes / MIB))
            .collect();
        assert_eq!(roles, [(10, "rank", None, 90), (11, "worker", Some(0), 20), (20, "rank", None, 70)]);
        assert_eq!(report.series[1].pss_bytes, [110 * MIB, 60 * MIB]);
        assert_eq!(report.shm.peak_used_bytes, Some(64 * MIB));
        assert_eq!(report.shm.peak_ours_bytes, 63 * MIB);
        assert_eq!(
            report.shm.at_rank_end,
            [ShmAt { rank: 1, t_s: 0.6, used_bytes: 64 * MIB, total_bytes: 64 * MIB }]
        );
        assert!(report.shm.private);
    }

    /// Below a launcher a rank is counted as the launcher's (rank 0) until it names its own rank:
    /// it stays one process, under the rank it named, with its peak over both (the CI run of
    /// stop 39 listed pid 4658 twice, as `rank 0 · child` and as `rank 1`).
    #[test]
    fn a_process_placed_under_another_rank_later_is_one_row_under_the_later_rank() {
        let mut rec = MemoryRecorder::new(1, 0.25, true);
        rec.record(0.25, &[sample(10, 0, mem(30, 30, 30)), sample(11, 0, mem(200, 150, 100))], shm(0, 0));
        rec.record(0.5, &[sample(10, 0, mem(30, 30, 30)), sample(11, 1, mem(120, 90, 60))], shm(0, 0));
        // The same pid, another process (a new start time): its own row.
        rec.record(0.75, &[ProcSample { start_ticks: 2, ..sample(11, 0, mem(10, 10, 10)) }], shm(0, 0));
        let (rank0, rank1) = (RankState::default(), RankState::default());
        let report = rec.finish(&[&rank0, &rank1], &[Some(10), Some(11)]);
        let rows: Vec<(u32, u32, &str, u64)> = report
            .processes
            .iter()
            .map(|p| (p.rank, p.pid, p.role.as_str(), p.peak_pss_bytes / MIB))
            .collect();
        assert_eq!(rows, [(0, 10, "rank", 30), (0, 11, "child", 10), (1, 11, "rank", 150)]);
        assert_eq!(report.series[0].pss_bytes, [180 * MIB, 0], "a sample's totals stay as they were taken");
        assert_eq!(report.series[1].pss_bytes, [30 * MIB, 90 * MIB]);
    }

    /// A launcher's tree sampled before its ranks are found: the process that turns out to be rank
    /// 1 (named by its markers only as it died), and its worker, are placed at the end by the
    /// pids the run settled, their earlier PSS added to rank 1's totals; the launcher, no rank's,
    /// is left out (Lightning's rank 1, segfaulting in step 4, had no row at all).
    #[test]
    fn processes_sampled_before_their_rank_was_known_are_placed_by_the_settled_pids() {
        let unplaced = |pid: u32, ppid: u32, m: Rollup| ProcSample { rank: None, ppid, ..sample(pid, 0, m) };
        let mut rec = MemoryRecorder::new(1, 0.25, false);
        rec.record(0.25, &[unplaced(5, 1, mem(50, 50, 50)), sample(10, 0, mem(100, 80, 60))], shm(0, 0));
        rec.record(
            0.5,
            &[
                unplaced(5, 1, mem(50, 50, 50)),
                sample(10, 0, mem(100, 80, 60)),
                unplaced(20, 5, mem(300, 200, 150)),
                unplaced(21, 20, mem(40, 30, 20)),
            ],
            shm(0, 0),
        );
        rec.record(0.75, &[sample(10, 0, mem(100, 80, 60))], shm(0, 0));
        let mut rank1 = RankState::default();
        rank1.workers.push(WorkerInfo { id: 0, pid: 21, start_method: "fork".into(), started_at_s: 0.4 });
        let report = rec.finish(&[&RankState::default(), &rank1], &[Some(10), Some(20)]);
        let rows: Vec<(u32, u32, &str, u64)> = report
            .processes
            .iter()
            .map(|p| (p.rank, p.pid, p.role.as_str(), p.peak_pss_bytes / MIB))
            .collect();
        assert_eq!(rows, [(0, 10, "rank", 80), (1, 20, "rank", 200), (1, 21, "worker", 30)]);
        let series: Vec<Vec<u64>> =
            report.series.iter().map(|p| p.pss_bytes.iter().map(|b| b / MIB).collect()).collect();
        assert_eq!(series, [vec![80, 0], vec![80, 230], vec![80, 0]]);
    }

    #[test]
    fn a_flat_process_is_read_in_full_once_a_second_and_a_moving_one_as_often_as_its_cost_allows() {
        let mut cadence = RollupCadence::default();
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let quick = Duration::from_micros(500);
        let mut reads = 0;
        let mut at = |c: &mut RollupCadence, t: Instant, rss: u64, full: Rollup, took: Duration| {
            c.memory((10, 5), rss * MIB, t, || {
                reads += 1;
                Some((full, took))
            })
        };
        assert_eq!(at(&mut cadence, ms(0), 100, mem(100, 80, 60), quick), Some(mem(100, 80, 60)));
        // Flat: the last full figures, with the resident size of now.
        let same = at(&mut cadence, ms(250), 101, mem(0, 0, 0), quick).unwrap();
        assert_eq!((same.rss, same.pss, same.uss), (101 * MIB, 80 * MIB, 60 * MIB));
        at(&mut cadence, ms(750), 100, mem(0, 0, 0), quick);
        // A second after the last reading: read again.
        assert_eq!(at(&mut cadence, ms(1000), 100, mem(100, 85, 65), quick), Some(mem(100, 85, 65)));
        // Grown by a sixteenth, 250 ms after a reading of 0.5 ms (400 times its cost: 200 ms):
        // read at once.
        assert_eq!(at(&mut cadence, ms(1250), 107, mem(107, 92, 72), quick), Some(mem(107, 92, 72)));
        // Shrunk by a sixteenth: the same.
        assert_eq!(at(&mut cadence, ms(1500), 100, mem(100, 85, 65), quick), Some(mem(100, 85, 65)));
        drop(at);
        assert_eq!(reads, 4);
    }

    /// A large process (a rank of 700 MiB took 9 ms of CPU a reading here) whose resident size
    /// moves is read again once its last reading is 400 times its cost old: its resident size
    /// follows every sample meanwhile, its PSS and USS the last reading. One that lost half of
    /// its resident size is read at once (a spawned worker's `exec` after a reading of the
    /// parent's pages it was forked with).
    #[test]
    fn a_large_moving_process_is_read_once_its_last_reading_is_four_hundred_times_its_cost_old() {
        let mut cadence = RollupCadence::default();
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let costly = Duration::from_millis(9);
        let reads = std::cell::RefCell::new(Vec::new());
        let at = |c: &mut RollupCadence, t: u64, rss: u64, full: Rollup| {
            c.memory((10, 5), rss * MIB, ms(t), || {
                reads.borrow_mut().push(t);
                Some((full, costly))
            })
        };
        at(&mut cadence, 0, 400, mem(400, 300, 200));
        let grown = at(&mut cadence, 250, 500, mem(500, 400, 300)).unwrap();
        assert_eq!((grown.rss, grown.pss, grown.uss), (500 * MIB, 300 * MIB, 200 * MIB));
        at(&mut cadence, 3500, 700, mem(700, 600, 500));
        assert_eq!(at(&mut cadence, 3600, 800, mem(800, 700, 600)), Some(mem(800, 700, 600)));
        // Lost half: read at once, however costly the last reading was.
        assert_eq!(at(&mut cadence, 3850, 30, mem(30, 20, 10)), Some(mem(30, 20, 10)));
        assert_eq!(*reads.borrow(), [0, 3600, 3850]);
    }

    /// A large rank whose resident size swings by 7 % between steps (measured: a 700 MiB rank of
    /// the benchmark's DDP program) is read at the top and the bottom of its swing, then only as
    /// a flat process is; a new peak, a sixteenth above the largest reading, is read again.
    #[test]
    fn a_large_process_swinging_between_steps_is_read_at_its_top_and_bottom_then_only_for_a_new_peak() {
        let mut cadence = RollupCadence::default();
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let costly = Duration::from_millis(9);
        let reads = std::cell::RefCell::new(Vec::new());
        let at = |c: &mut RollupCadence, t: u64, rss: u64| {
            c.memory((10, 5), rss * MIB, ms(t), || {
                reads.borrow_mut().push(t);
                // Its own pages swing; the 200 MiB it shares do not.
                Some((mem(rss, rss - 100, rss - 200), costly))
            })
        };
        // 700 and 650 MiB by turns, a sample every 250 ms, for 12 s: read at the first sample;
        // at the first bottom 3.6 s later (a fall of a sixteenth below the last reading); then,
        // the sharing the same, at the flat cadence doubled to 7.2 s, at a top. The rise from
        // the bottom's reading back to 700 MiB is no new peak.
        for i in 0..48u64 {
            at(&mut cadence, i * 250, if i % 2 == 0 { 700 } else { 650 });
        }
        assert_eq!(
            *reads.borrow(),
            [0, 3750, 11_000],
            "a swing of 7 % read at its bottom, then as a flat process"
        );
        // A new peak: 750 MiB, more than a sixteenth above the largest reading; read once the
        // cost's wait has passed since the last reading.
        at(&mut cadence, 12_000, 750);
        at(&mut cadence, 15_750, 750);
        assert_eq!(reads.borrow()[3..], [15_750]);
    }

    /// A spawned worker read between its fork and its `exec` (its parent's 500 MiB), read at once
    /// after the `exec` (10 MiB), then growing as it loads libtorch: each rise of a sixteenth is
    /// read at the next sample, not a second later, measured from its own size since the `exec`.
    #[test]
    fn a_process_that_lost_half_its_pages_measures_its_rises_from_its_new_size() {
        let mut cadence = RollupCadence::default();
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let cheap = Duration::from_micros(200);
        let reads = std::cell::RefCell::new(Vec::new());
        let at = |c: &mut RollupCadence, t: u64, rss: u64, uss: u64| {
            c.memory((30, 2), rss * MIB, ms(t), || {
                reads.borrow_mut().push(t);
                Some((mem(rss, uss, uss), cheap))
            })
        };
        at(&mut cadence, 0, 500, 1);
        at(&mut cadence, 250, 10, 8);
        at(&mut cadence, 500, 120, 60);
        let last = at(&mut cadence, 750, 200, 90).unwrap();
        assert_eq!(*reads.borrow(), [0, 250, 500, 750]);
        assert_eq!(last.uss, 90 * MIB, "its libtorch is its own");
    }

    #[test]
    fn a_process_whose_full_figures_stay_the_same_is_read_half_as_often_each_time_until_they_move() {
        let mut cadence = RollupCadence::default();
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let quick = Duration::from_micros(700);
        let mut reads = Vec::new();
        let mut at = |c: &mut RollupCadence, t: u64, full: Rollup| {
            c.memory((10, 5), 100 * MIB, s(t), || {
                reads.push(t);
                Some((full, quick))
            })
        };
        // Flat at 1 s, then 2 s, 4 s and 8 s apart, and no further apart than that.
        for t in 0..47 {
            at(&mut cadence, t, mem(100, 80, 60));
        }
        // The figures moved (USS grew, the resident size did not: pages copied on write): seen
        // at the next reading, and read again a second later.
        at(&mut cadence, 47, mem(100, 90, 70));
        at(&mut cadence, 48, mem(100, 90, 70));
        // Same again: two seconds, unless a process joins the run: back to one.
        at(&mut cadence, 49, mem(100, 90, 70));
        cadence.joined();
        at(&mut cadence, 49, mem(100, 90, 70));
        assert_eq!(reads, [0, 1, 3, 7, 15, 23, 31, 39, 47, 48, 49]);
    }

    #[test]
    fn near_the_limit_a_process_read_before_is_not_read_again_and_its_growth_counts_as_its_own() {
        let mut cadence = RollupCadence::default();
        let t0 = Instant::now();
        let quick = Duration::from_micros(700);
        cadence.memory((10, 5), 100 * MIB, t0, || Some((mem(100, 80, 60), quick)));
        cadence.near_limit = true;
        let later = t0 + Duration::from_secs(5);
        let grown = cadence.memory((10, 5), 300 * MIB, later, || panic!("not read near the limit")).unwrap();
        assert_eq!((grown.rss, grown.pss, grown.uss), (300 * MIB, 280 * MIB, 260 * MIB));
        let shrunk = cadence.memory((10, 5), 90 * MIB, later, || panic!("not read near the limit")).unwrap();
        assert_eq!((shrunk.pss, shrunk.uss), (70 * MIB, 50 * MIB));
        // A process never read is read: there is nothing to follow.
        assert_eq!(cadence.memory((11, 1), MIB, later, || Some((mem(1, 1, 1), quick))), Some(mem(1, 1, 1)));
        cadence.near_limit = false;
        assert_eq!(
            cadence.memory((10, 5), 300 * MIB, later, || Some((mem(300, 1, 1), quick))).unwrap().pss,
            MIB
        );
    }

    #[test]
    fn a_slow_reading_waits_four_hundred_times_its_cost_and_a_new_process_is_read_at_once() {
        let mut cadence = RollupCadence::default();
        let t0 = Instant::now();
        let slow = Duration::from_millis(30);
        let read = |full: Rollup, took| move || Some((full, took));
        cadence.memory((10, 5), 100 * MIB, t0, read(mem(100, 80, 60), slow));
        let later = t0 + Duration::from_millis(11_500);
        let kept = cadence.memory((10, 5), 100 * MIB, later, read(mem(100, 1, 1), slow)).unwrap();
        assert_eq!(kept.pss, 80 * MIB, "12 s between readings of 30 ms");
        let at_12s = t0 + Duration::from_secs(12);
        assert_eq!(cadence.memory((10, 5), 100 * MIB, at_12s, read(mem(100, 1, 1), slow)).unwrap().pss, MIB);
        // The same pid started anew is another process.
        assert_eq!(
            cadence.memory((10, 6), 100 * MIB, at_12s, read(mem(100, 2, 2), slow)).unwrap().pss,
            2 * MIB
        );
        // A failed reading of a due process is no figure.
        assert_eq!(cadence.memory((11, 1), MIB, at_12s, || None), None);
        cadence.keep_only(&HashSet::from([(10, 6)]));
        assert_eq!(cadence.last.len(), 1);
    }

    #[test]
    fn long_series_are_thinned_keeping_the_spikes() {
        let mut rec = MemoryRecorder::new(1, 0.25, false);
        for i in 0..1000u64 {
            let spike = if i == 501 { 500 } else { 100 };
            rec.record(i as f64 * 0.25, &[sample(10, 0, mem(spike, spike, spike))], shm(i % 7, 0));
        }
        let report = rec.finish(&[&RankState::default()], &[Some(10)]);
        assert!(report.series.len() <= MemoryReport::MAX_POINTS, "{}", report.series.len());
        assert!(report.series.iter().any(|p| p.pss_bytes[0] == 500 * MIB));
        assert_eq!(report.series.last().unwrap().t_s, 999.0 * 0.25);
        assert_eq!(report.processes[0].peak_rss_bytes, 500 * MIB);
    }

    #[test]
    fn workers_with_their_own_copy_duplicate_the_cache() {
        let d = dataset_sharing(0, 120 * MIB, "memory", vec![125 * MIB, 124 * MIB, 126 * MIB, 123 * MIB]);
        assert_eq!((d.private_copies, d.duplicated_bytes, d.shared_bytes), (4, 480 * MIB, 0));
        let shared = dataset_sharing(0, 120 * MIB, "shm", vec![3 * MIB, 2 * MIB]);
        assert_eq!((shared.private_copies, shared.duplicated_bytes, shared.shared_bytes), (0, 0, 120 * MIB));
        // 16 KiB against a worker's ~58 MiB of its own: nothing can be told either way.
        let tiny = dataset_sharing(0, 16 << 10, "shm", vec![58 * MIB, 59 * MIB]);
        assert!(!tiny.judged);
        assert_eq!((tiny.private_copies, tiny.duplicated_bytes, tiny.shared_bytes), (0, 0, 0));
        let none = dataset_sharing(0, 120 * MIB, "memory", Vec::new());
        assert_eq!((none.workers, none.duplicated_bytes, none.shared_bytes), (0, 0, 0));
    }

    #[test]
    fn the_dataset_marker_and_worker_uss_make_the_sharing_line() {
        let mut rec = MemoryRecorder::new(1, 0.25, false);
        rec.record(0.25, &[sample(10, 0, mem(300, 200, 150)), sample(11, 0, mem(130, 125, 121))], shm(0, 0));
        let mut rank0 = RankState::default();
        rank0.dataset = Some(DatasetInfo { bytes: 120 * MIB, cache: "memory".into() });
        rank0.workers.push(WorkerInfo { id: 0, pid: 11, start_method: "spawn".into(), started_at_s: 0.1 });
        let report = rec.finish(&[&rank0], &[Some(10)]);
        assert_eq!(report.datasets[0].private_copies, 1);
        assert_eq!(report.datasets[0].worker_peak_uss_bytes, [121 * MIB]);
    }

    #[test]
    fn only_segments_of_runs_proven_gone_are_orphans_and_each_run_is_asked_once() {
        let all = [
            seg("ups-doctor-100-0-ab-leak-0", 1),
            seg("ups-doctor-100-0-ab-r1-cache", 2),
            seg("ups-doctor-200-1-cd-ring", 3),
            seg("ups-doctor-manual-7-r0-cache", 4),
            seg("torch_5", 5),
        ];
        let mut asked = Vec::new();
        let orphans = orphaned_segments(&all, |run, pid| {
            asked.push((run.to_string(), pid));
            (pid != 200).then_some(run.to_string())
        });
        assert_eq!(asked, [("100-0-ab".to_string(), 100), ("200-1-cd".to_string(), 200)]);
        let names: Vec<_> = orphans.iter().flat_map(|(_, s)| s.iter().map(|s| s.name.as_str())).collect();
        assert_eq!(names, ["ups-doctor-100-0-ab-leak-0", "ups-doctor-100-0-ab-r1-cache"]);
        assert_eq!(orphans[0].0, "100-0-ab");
    }

    fn seg(name: &str, inode: u64) -> Segment {
        Segment { name: name.into(), size: MIB, allocated: MIB, inode }
    }

    #[test]
    fn new_segments_are_ours_by_run_id_and_others_runs_are_left_out() {
        let before = [seg("old", 1), seg("reused", 2)];
        let after = [
            seg("old", 1),
            seg("reused", 3),
            seg("ups-doctor-7-0-ab-leak-0", 4),
            seg("ups-doctor-9-0-cd-ring", 5),
            seg("torch_123", 6),
            seg("torch_4242_1917215306_0", 7),
            seg("torch_99_1917215306_0", 8),
        ];
        let segments = new_segments(&before, &after, "7-0-ab", &[4242, 4243]);
        let found: Vec<(&str, bool)> = segments.iter().map(|(s, o)| (s.name.as_str(), *o)).collect();
        assert_eq!(
            found,
            [
                ("reused", false),
                ("ups-doctor-7-0-ab-leak-0", true),
                ("torch_123", false),
                ("torch_4242_1917215306_0", true),
                ("torch_99_1917215306_0", false),
            ],
            "PyTorch's, named after a process of the run, made during it"
        );
        let before_too = [seg("torch_4242_1917215306_0", 7)];
        assert!(
            new_segments(&before_too, &after[5..6], "7-0-ab", &[4242]).is_empty(),
            "there before: not the run's"
        );
        assert_eq!(ours_bytes(&after, "7-0-ab"), MIB);
    }
}
