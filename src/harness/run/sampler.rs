//! Sampling off the trainer's critical path: memory of every process of the run, `/dev/shm`
//! and GPUs, taken in a thread of its own at a low priority (nice 10), so that on a busy machine
//! a sample rarely preempts a rank, yet still gets taken. It sleeps until the next sample is due
//! (or a message arrives); nothing else wakes it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::harness::observe::gpu::{GpuRecorder, GpuSample};
use crate::harness::observe::memory::{
    MemoryRecorder, ProcSample, RollupCadence, ShmSample, ours_bytes, segment_prefix,
};
use crate::harness::observe::oom::OomWatch;
use crate::harness::observe::state::RankState;
use crate::probe::nvml::{Nvml, NvmlError, Sampler as NvmlSampler};
use crate::probe::{memory, shm};
use crate::schema::GpuReport;

use super::teardown::Membership;

/// What the run loop tells the sampler.
enum Message {
    /// A rank ended at `t_s` with `/dev/shm` as it was then.
    RankEnded {
        rank: u32,
        t_s: f64,
        shm: ShmSample,
    },
    /// A process joined the run that may not live until the next sample (a DataLoader worker
    /// lives as long as one epoch's loader, often well under a second): sample now.
    SampleNow,
    /// The run's newest workers have served their first batches: read every process in full now,
    /// whatever its last full reading cost. A worker read only before its `exec` finished loading
    /// libtorch (or before it built what it serves) would keep that reading's USS until it next
    /// rose by a sixteenth and the cost wait passed; a worker that lives a second on a busy
    /// machine was left at a USS of 4.7 MiB in a fresh-clone run of the suite.
    Settle,
    Stop,
}

/// GPU sampling for one scenario, as it ended.
pub enum GpuOutcome {
    /// The ranks train on the CPU by choice (`device: cpu`), or `limits.gpu_sample_ms` is 0.
    Off,
    /// Why NVML cannot be used.
    Unavailable(NvmlError),
    On(GpuRecorder),
}

impl GpuOutcome {
    pub fn finish(self, states: &[&RankState], pids: &[Option<u32>]) -> Option<GpuReport> {
        match self {
            GpuOutcome::Off => None,
            GpuOutcome::Unavailable(why) => Some(GpuReport::unavailable(why.to_string())),
            GpuOutcome::On(recorder) => Some(recorder.finish(states, pids)),
        }
    }
}

/// What sampling gathered.
pub struct Sampled {
    pub memory: MemoryRecorder,
    pub oom: OomWatch,
    pub gpu: GpuOutcome,
}

/// Where and how often to sample.
pub struct Setup {
    pub start: Instant,
    pub every: Duration,
    pub gpu_every: Option<Duration>,
    pub shm_dir: PathBuf,
    pub run_id: String,
    pub members: Arc<Mutex<Membership>>,
    /// The scenario's cgroup's directory, where it has one: its members are the processes to
    /// sample, read instead of all of `/proc` (see [`process_table`]).
    pub cgroup: Option<PathBuf>,
    pub memory: MemoryRecorder,
    pub oom: OomWatch,
    pub pressure: MemoryPressure,
}

/// Whether the run's memory is nearly used up: its cgroup's use at 7/8 of its limit or more, or
/// the machine's available memory under 1/16 of its total (see [`RollupCadence`] for why it
/// matters).
#[derive(Debug, Default)]
pub struct MemoryPressure {
    /// The cgroup's usage file and limit.
    pub cgroup: Option<(PathBuf, u64)>,
}

impl MemoryPressure {
    fn near(&self) -> bool {
        let cgroup = self.cgroup.as_ref().is_some_and(|(file, limit)| {
            let used = std::fs::read_to_string(file).ok().and_then(|t| t.trim().parse::<u64>().ok());
            used.is_some_and(|u| u >= limit - limit / 8)
        });
        cgroup || memory::available().is_some_and(|(available, total)| available < total / 16)
    }
}

/// The sampling thread of one scenario.
pub struct SamplerThread {
    tx: Sender<Message>,
    handle: Option<JoinHandle<Sampled>>,
    shm_dir: PathBuf,
    run_id: String,
}

/// `/dev/shm` now: the filesystem's use and this run's own segments.
pub fn shm_now(dir: &std::path::Path, run_id: &str) -> ShmSample {
    let ours = shm::segments_named(dir, &segment_prefix(run_id));
    ShmSample { usage: shm::usage(dir), ours: ours_bytes(&ours, run_id) }
}

impl SamplerThread {
    pub fn start(setup: Setup) -> std::io::Result<SamplerThread> {
        let (tx, rx) = mpsc::channel();
        let (shm_dir, run_id) = (setup.shm_dir.clone(), setup.run_id.clone());
        let handle = std::thread::Builder::new().name("sampler".into()).spawn(move || {
            lower_priority();
            let Setup {
                start,
                every,
                gpu_every,
                shm_dir,
                run_id,
                members,
                cgroup,
                mut memory,
                mut oom,
                pressure,
            } = setup;
            let since = |at: Instant| at.duration_since(start).as_secs_f64();
            // NVML is set up here, in the thread that samples it.
            let mut gpu = match gpu_every {
                None => (GpuOutcome::Off, None),
                Some(every) => match NvmlSampler::new() {
                    Err(why) => (GpuOutcome::Unavailable(why), None),
                    Ok(sampler) => {
                        let info =
                            Nvml::get().and_then(Nvml::driver_info).map(|d| d.gpus).unwrap_or_default();
                        let recorder =
                            GpuRecorder::new(every.as_secs_f64(), info, sampler.gpm_missing.clone());
                        (GpuOutcome::On(recorder), Some((sampler, every, start)))
                    }
                },
            };
            let mut next_memory = start;
            let mut cadence = RollupCadence::default();
            loop {
                let now = Instant::now();
                if now >= next_memory {
                    cadence.near_limit = pressure.near();
                    let sampled = sample_processes(
                        &members.lock().map(|m| m.clone()).unwrap_or_default(),
                        cgroup.as_deref(),
                        &mut cadence,
                    );
                    oom.saw(&sampled);
                    memory.record(since(now), &sampled, shm_now(&shm_dir, &run_id));
                    next_memory = now + every;
                }
                if let (GpuOutcome::On(recorder), Some((sampler, every, next))) = &mut gpu
                    && now >= *next
                {
                    recorder.record(GpuSample { t_s: since(now), gpus: sampler.sample() });
                    *next = now + *every;
                }
                let next = gpu.1.as_ref().map_or(next_memory, |(_, _, g)| next_memory.min(*g));
                match rx.recv_timeout(next.saturating_duration_since(Instant::now())) {
                    Ok(Message::RankEnded { rank, t_s, shm }) => memory.rank_ended(rank, t_s, shm),
                    Ok(Message::SampleNow) => {
                        cadence.joined();
                        next_memory = Instant::now();
                    }
                    Ok(Message::Settle) => {
                        cadence.read_all_afresh();
                        next_memory = Instant::now();
                    }
                    Ok(Message::Stop) | Err(RecvTimeoutError::Disconnected) => break,
                    Err(RecvTimeoutError::Timeout) => {}
                }
            }
            Sampled { memory, oom, gpu: gpu.0 }
        })?;
        Ok(SamplerThread { tx, handle: Some(handle), shm_dir, run_id })
    }

    /// Records a rank's end, with `/dev/shm` read now (by the caller, at once: what a dying rank
    /// left there is the evidence).
    pub fn rank_ended(&self, rank: u32, t_s: f64) {
        let shm = shm_now(&self.shm_dir, &self.run_id);
        let _ = self.tx.send(Message::RankEnded { rank, t_s, shm });
    }

    /// Takes the next memory sample now rather than when it is due: the run has a new process
    /// that may be gone by then.
    pub fn sample_now(&self) {
        let _ = self.tx.send(Message::SampleNow);
    }

    /// Takes the next memory sample now, reading every process in full: the run's newest workers
    /// have been seen at work (see [`Message::Settle`]).
    pub fn settle(&self) {
        let _ = self.tx.send(Message::Settle);
    }

    /// Stops sampling and hands back what it gathered.
    pub fn finish(mut self) -> Option<Sampled> {
        let _ = self.tx.send(Message::Stop);
        self.handle.take()?.join().ok()
    }
}

/// Memory of every live process of every rank, from one read of the process table: the resident
/// size of now, and the full figures as often as `cadence` says.
fn sample_processes(
    members: &Membership,
    cgroup: Option<&Path>,
    cadence: &mut RollupCadence,
) -> Vec<ProcSample> {
    let table = process_table(members, cgroup);
    let below = members.below(&table);
    let unplaced = members.launcher_tree(&table);
    let now = Instant::now();
    let sampled: Vec<ProcSample> = table
        .iter()
        .filter(|p| !p.zombie())
        .filter_map(|p| {
            let rank = members.rank_of(&below, p);
            if rank.is_none() && !unplaced.contains(&p.pid) {
                return None;
            }
            let rss = memory::read_rss(p.pid)?;
            let mem = cadence
                .memory((p.pid, p.start_ticks), rss, now, || memory::read_smaps_rollup_timed(p.pid))?;
            let (pid, start_ticks, ppid, command) = (p.pid, p.start_ticks, p.ppid, p.command.clone());
            Some(ProcSample { pid, start_ticks, rank, ppid, command, mem })
        })
        .collect();
    cadence.keep_only(&table.iter().map(|p| (p.pid, p.start_ticks)).collect());
    sampled
}

/// The processes a sample looks at: the members of the scenario's cgroup (`cgroup`, its
/// directory), which every process the run starts joins before `exec`, while every running rank
/// a launcher's tree was found to hold is among them; else every process on the machine. A rank
/// outside the group (srun's tasks, which slurmstepd starts) and what is below it are only found
/// in the whole table. The whole table is read four times a second and its cost grows with the
/// machine's processes (about 1 ms for 70 here; a GPU node runs hundreds); the group holds a
/// handful.
fn process_table(members: &Membership, cgroup: Option<&Path>) -> Vec<memory::ProcStat> {
    let group: Option<BTreeSet<u32>> =
        cgroup.and_then(crate::harness::os::cgroup::read_members).map(|m| m.into_iter().collect());
    match group {
        Some(group) if members.found.iter().filter(|f| f.2).all(|(_, pid, _)| group.contains(pid)) => {
            memory::processes_among(group)
        }
        _ => memory::processes(),
    }
}

/// Lowers the calling thread to nice 10 (Linux nice values are per thread): a sample then rarely
/// preempts a rank's thread when it wakes, and gets a small share of a saturated machine. Not
/// `SCHED_IDLE`: measured on two cores under a load of 20, an idle-class sampler got 14 of 165
/// samples, so memory peaks and the processes an OOM kill hit would go unseen exactly when a
/// machine is busiest. Failure leaves the thread as it was.
fn lower_priority() {
    crate::harness::os::sys::set_thread_nice(NICE);
}

/// The sampling thread's nice value.
const NICE: i32 = 10;

#[cfg(test)]
mod tests {
    use super::*;

    /// The group's members alone while every running found rank is one of them; the whole table
    /// once a running rank is not (srun's tasks), or when the group cannot be read.
    #[test]
    fn a_sample_reads_the_cgroups_members_unless_a_running_rank_is_outside_it() {
        let dir = tempfile::tempdir().unwrap();
        let procs = dir.path().to_path_buf();
        let me = std::process::id();
        std::fs::write(procs.join("cgroup.procs"), format!("{me}\n")).unwrap();
        let pids = |members: &Membership, procs: Option<&Path>| -> BTreeSet<u32> {
            process_table(members, procs).iter().map(|p| p.pid).collect()
        };
        let mut members = Membership { found: vec![(0, me, true), (1, 1, false)], ..Default::default() };
        assert_eq!(pids(&members, Some(&procs)), BTreeSet::from([me]), "a rank that ended is not looked for");
        members.found[1].2 = true;
        let whole = pids(&members, Some(&procs));
        assert!(whole.contains(&1) && whole.contains(&me), "{whole:?}");
        members.found.pop();
        let unreadable = pids(&members, Some(&dir.path().join("gone")));
        assert!(unreadable.contains(&1), "{unreadable:?}");
        assert!(pids(&members, None).contains(&1));
    }
}
