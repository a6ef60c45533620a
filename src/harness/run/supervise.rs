//! The run loop for one scenario: start what the [`Plan`] says, fold what the processes report
//! into per-rank state, hand the [`Machine`] a view of it whenever something happens or a
//! deadline passes, and carry out its decisions (stack dumps, SIGTERM, SIGKILL); then collect
//! every rank's end and sweep leftovers. Returns what was observed; deciding what it means is
//! [`crate::harness::classify`]'s job.
//!
//! The loop sleeps until news that matters ([`Event::urgent`]) or the next deadline: the
//! machine's (hang threshold, timeout, grace ends), a pipe's drain limit after an exit, the next
//! progress line, the next look for a launcher's ranks, or (on one node of several) the next look
//! at the link to the other nodes. Memory, `/dev/shm` and GPU samples are taken in a thread of
//! their own ([`super::sampler`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::events::{Listener, RunEvent};
use crate::harness::classify::{Intervention, RankEnd};
use crate::harness::observe::memory::MemoryRecorder;
use crate::harness::observe::oom::OomWatch;
use crate::harness::observe::quotes;
use crate::harness::observe::state::RankState;
use crate::harness::os::cgroup::ScenarioCgroup;
use crate::harness::os::namespace::PrivateShm;
use crate::harness::os::owner::{self, Identity};
use crate::harness::os::process::{self, Event, Queue, RankProcess, RankSpec, Sink};
use crate::harness::plan::{Completion, Plan, ProcessPlan, Style};
use crate::probe::shm;
use crate::protocol::signal_name;
use crate::scenario::Scenario;
use crate::scenario::launcher::ClusterWorkers;
use crate::schema::{
    CgroupReport, ExitSource, ExternalRun, GpuReport, IdentifiedBy, LauncherEnd, LeftoverProcess, Leftovers,
    MemoryReport, OomKill, ProcessRole, RestartedRank, Signal,
};

use super::machine::{Action, Input, Look, Machine, Phase, RankView, Teardown, View};
use super::sampler::{Sampled, SamplerThread, Setup};
use super::teardown::{self, Membership};

/// How often a launcher's process tree is searched for ranks not found yet.
const DISCOVER_EVERY: Duration = Duration::from_millis(50);
/// Of rounds of rank discovery, every this many reads the whole machine (see [`discovery_table`]):
/// a rank outside the scenario's cgroup is found within half a second.
const WHOLE_MACHINE_EVERY: u32 = 10;
/// How often, once every rank is found, discovery runs again while a weak identification (spawn
/// order) may still be confirmed or corrected by the markers or the port.
const REDISCOVER_EVERY: Duration = Duration::from_millis(250);
/// How often a launcher's rank is looked for in `/proc` while it is exiting, or all along where
/// there are no thread pidfds to sleep on (see [`watch_found`]).
const ZOMBIE_POLL: Duration = Duration::from_millis(2);
/// How often a rank's exit watcher sleeping on its pidfds wakes to look whether the run still
/// wants it (and for threads to sleep on, when the rank had few).
const STOP_LOOK: Duration = Duration::from_millis(200);
/// CPU time a rank asked for stacks must have used since, to count as answering.
const DUMPING_CPU_S: f64 = 0.05;

/// The CPU time of `pids` together, in seconds (those gone count nothing).
fn cpu_of(pids: &[u32]) -> f64 {
    pids.iter().filter_map(|&pid| crate::probe::memory::cpu_seconds(pid)).sum()
}

/// How often the ranks' CPU time is read, for [`CpuWatch`].
const CPU_EVERY: Duration = Duration::from_secs(1);
/// The share of one core over [`CPU_EVERY`] above which a rank counts as busy: a rank waiting in
/// a gloo collective or a store uses well under 1 %.
const BUSY_SHARE: f64 = 0.1;
/// Bytes a launcher's tree must read over [`CPU_EVERY`] (by system calls or page faults) to count
/// as busy before any of its ranks is found: far more than the few a process waiting in a
/// rendezvous store reads, far less than an `import torch` reads a second on the slowest disk.
const READING_BYTES: u64 = 256 * 1024;

/// Whether a rank of the run is computing: its own process's CPU time, read once a second; and,
/// while no rank of a launcher is found yet, whether the launcher is (with everything below it).
struct CpuWatch {
    /// Per slot: when its CPU time was read, and what it was.
    last: Vec<Option<(Instant, u32, f64)>>,
    /// Per slot: its CPU time over its current silence ([`Quiet`]).
    quiet: Vec<Option<Quiet>>,
    /// The launcher's tree while no rank is found: when it was read, the launcher's pid, the CPU
    /// time of the processes in it then, and the bytes they had read.
    tree: Option<(Instant, u32, f64, u64)>,
    busy_at: Option<Instant>,
    next: Instant,
    /// Workers found ended (or their pid taken by another process): not read again, so that a
    /// long run that starts new workers every epoch does not read every old one each second.
    gone: std::collections::HashSet<Identity>,
}

/// A rank's CPU time since its last sign of life: the first reading after it (`from`, `cpu_from`)
/// and the latest (`at`, `cpu_at`), of the process `pid`.
#[derive(Debug, Clone, Copy)]
struct Quiet {
    activity: Duration,
    pid: u32,
    from: Instant,
    cpu_from: f64,
    at: Instant,
    cpu_at: f64,
}

impl CpuWatch {
    fn new(ranks: usize, start: Instant) -> CpuWatch {
        CpuWatch {
            last: vec![None; ranks],
            quiet: vec![None; ranks],
            tree: None,
            busy_at: None,
            next: start,
            gone: std::collections::HashSet::new(),
        }
    }

    /// What slot `i`'s process did over its silence so far, once two readings span it.
    fn silent_cpu(&self, i: usize) -> Option<crate::schema::SilentCpu> {
        let q = self.quiet.get(i).copied().flatten()?;
        let silent_s = q.at.duration_since(q.from).as_secs_f64();
        (silent_s > 0.0)
            .then(|| crate::schema::SilentCpu { silent_s, cpu_s: (q.cpu_at - q.cpu_from).max(0.0) })
    }

    /// Reads the CPU time of every live rank's process (`pids`, by slot), and of the launcher
    /// `tree` (its pid, while no rank is found), once [`CPU_EVERY`] has passed since the last read.
    ///
    /// The launcher's tree counts so that a launcher that computes before it starts its ranks or
    /// before they can be told apart (torchrun importing torch on a loaded machine, seconds
    /// without a word) is not taken for a launcher that hangs.
    ///
    /// `pids` comes with each rank's last sign of life: the CPU time since it is kept
    /// ([`CpuWatch::silent_cpu`]) for a rank the time limit ends.
    ///
    /// A rank's CPU time is its process's and its DataLoader workers' (`workers`, those its
    /// markers named and that were checked to be this run's): a rank waiting in
    /// `DataLoader.__next__` while its workers decode a slow first batch is busy, not hung. Other
    /// processes below a rank do not count: a child forked after OpenMP's threads deadlocks
    /// spinning in libgomp, and must still be called hung. A worker that ended takes its CPU
    /// time with it, so the sum can fall: only a rise counts as busy.
    fn read(
        &mut self,
        now: Instant,
        pids: impl Iterator<Item = (Option<u32>, Duration, Vec<Identity>)>,
        tree: Option<u32>,
    ) {
        if now < self.next {
            return;
        }
        self.next = now + CPU_EVERY;
        let gone = &mut self.gone;
        let mut cpu_of = |pid: u32, workers: &[Identity]| {
            let own = crate::probe::memory::cpu_seconds(pid)?;
            let workers: Vec<Identity> = workers.iter().filter(|w| !gone.contains(w)).copied().collect();
            let live = crate::probe::memory::processes_among(workers.iter().map(|w| w.pid));
            let mut theirs = 0;
            for w in workers {
                match live.iter().find(|p| p.pid == w.pid && p.start_ticks == w.start_ticks && !p.zombie()) {
                    Some(p) => theirs += p.cpu_ticks,
                    None => {
                        gone.insert(w);
                    }
                }
            }
            Some(own + crate::probe::memory::ticks_to_seconds(theirs))
        };
        let busy = |then: Instant, before: f64, cpu: f64| {
            let wall = now.duration_since(then).as_secs_f64();
            wall > 0.0 && (cpu - before) / wall >= BUSY_SHARE
        };
        for ((last, quiet), (pid, activity, workers)) in
            self.last.iter_mut().zip(self.quiet.iter_mut()).zip(pids)
        {
            let read = pid.and_then(|p| Some((now, p, cpu_of(p, &workers)?)));
            if let Some((_, pid, cpu)) = read {
                match quiet {
                    Some(q) if q.activity == activity && q.pid == pid => (q.at, q.cpu_at) = (now, cpu),
                    _ => {
                        *quiet = Some(Quiet { activity, pid, from: now, cpu_from: cpu, at: now, cpu_at: cpu })
                    }
                }
            }
            if let (Some((then, was, before)), Some((_, pid, cpu))) = (*last, read)
                && was == pid
                && busy(then, before, cpu)
            {
                self.busy_at = Some(now);
            }
            *last = read;
        }
        let read = tree.map(|root| {
            let members = crate::harness::discover::rank_members(root, &[]);
            let cpu = members.iter().copied().filter_map(crate::probe::memory::cpu_seconds).sum::<f64>();
            let bytes = members.into_iter().filter_map(crate::probe::memory::bytes_read).sum::<u64>();
            (now, root, cpu, bytes)
        });
        // A process of the tree that ended takes its CPU time with it: only a rise counts. Reading
        // counts too: a launcher importing torch from a slow or busy disk (a network filesystem, a
        // machine building beside it) waits on the disk more than it computes, and is starting,
        // not hung; one blocked on a filesystem that no longer answers reads nothing.
        if let (Some((then, was, before, read_before)), Some((_, root, cpu, bytes))) = (self.tree, read)
            && was == root
            && (busy(then, before, cpu) || bytes.saturating_sub(read_before) >= READING_BYTES)
        {
            self.busy_at = Some(now);
        }
        self.tree = read;
    }
}

/// What the run owns besides the plan: the scenario (for its name and step count), its private
/// `/dev/shm` and its cgroup.
pub struct Resources<'a> {
    pub scenario: &'a Scenario,
    /// The scenario's private `/dev/shm` (`data.shm_size`), which every process joins.
    pub private_shm: Option<&'a PrivateShm>,
    /// The scenario's cgroup, which every process it starts joins (none where none can be made).
    pub cgroup: Option<&'a ScenarioCgroup>,
}

/// A run id unique on this machine: the harness's pid, a per-process counter and the time.
pub fn new_run_id() -> String {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("{}-{n}-{nanos:08x}", std::process::id())
}

/// A port that was free a moment ago, for the rendezvous store (rank 0 binds it), else torchrun's
/// default. The race with other programs is the same one torchrun's `--master-port 0` accepts.
pub fn free_port() -> u16 {
    crate::harness::os::tcp::free_port().unwrap_or(29500)
}

/// What supervision observed.
pub struct Supervised {
    pub ends: Vec<RankEnd>,
    /// When supervision started: the scenario's second 0, which every `_s` time counts from.
    pub start: Instant,
    pub wall_s: f64,
    pub interrupted: bool,
    pub memory: MemoryReport,
    pub leftovers: Leftovers,
    pub external: Option<ExternalRun>,
    pub gpu: Option<GpuReport>,
    pub cgroup: Option<CgroupReport>,
    pub oom_kills: Vec<OomKill>,
    pub xids: Vec<crate::schema::GpuXid>,
}

struct Slot {
    end: RankEnd,
    process: Option<RankProcess>,
    exited_at: Option<Instant>,
    markers_closed: bool,
    /// A stack dump was requested from this rank.
    dump_requested: bool,
    /// How many processes of its group (the rank and its loader workers) were asked.
    dumps_requested: u32,
    /// The processes asked for their stacks (the rank and its loader workers) and their CPU time
    /// together then (seconds).
    dump_cpu: Option<(Vec<u32>, f64)>,
    /// A launcher's rank, found in its process tree: the pid, not our child.
    found: Option<u32>,
    /// The found rank as first seen: what a signal to it is checked against.
    found_id: Option<Identity>,
    /// The found rank is gone (a zombie, or no longer in /proc).
    found_gone: bool,
    /// When the process was seen to exit, by the thread waiting for it.
    exit_seen_at: Option<f64>,
    /// A rank the run began to watch only when the program formed a larger process group
    /// ([`Event::WorldGrew`]): when (seconds), its silence counted from then.
    added_at: Option<f64>,
    /// Workers its `worker` markers named that were checked to be this run's when the marker
    /// arrived ([`owner::Run::claim`]).
    verified_workers: Vec<Identity>,
    /// The found rank's `TORCHELASTIC_RESTART_COUNT` (torchrun's count of its restarts).
    restart_count: Option<u32>,
}

impl Slot {
    fn new(rank: u32, process: &ProcessPlan) -> Slot {
        Slot {
            end: RankEnd {
                rank,
                stdout_log: file_name(&process.stdout_log),
                stderr_log: file_name(&process.stderr_log),
                ..Default::default()
            },
            process: None,
            exited_at: None,
            markers_closed: false,
            dump_requested: false,
            dumps_requested: 0,
            dump_cpu: None,
            found: None,
            found_id: None,
            found_gone: false,
            exit_seen_at: None,
            added_at: None,
            verified_workers: Vec::new(),
            restart_count: None,
        }
    }

    fn live(&self) -> bool {
        (self.process.is_some() && self.end.exit.is_none()) || (self.found.is_some() && !self.found_gone)
    }

    /// Ended, with its markers in (or given up on: see [`crate::harness::plan::PIPE_DRAIN_WAIT`]).
    fn finished(&self, now: Instant, drain: Duration) -> bool {
        if self.found.is_some() {
            return self.found_gone;
        }
        match (&self.process, self.exited_at) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(_), Some(at)) => self.markers_closed || now.duration_since(at) >= drain,
        }
    }

    /// When its pipe stops being waited for.
    fn drain_deadline(&self, drain: Duration) -> Option<Instant> {
        match (&self.process, self.exited_at) {
            (Some(_), Some(at)) if self.found.is_none() && !self.markers_closed => Some(at + drain),
            _ => None,
        }
    }

    fn weakly_identified(&self) -> bool {
        self.end.identified_by.is_some_and(|b| b.strength() < IdentifiedBy::Markers.strength())
    }
}

/// The launcher of a `launcher`-style run and what watches its ranks.
struct Launcher {
    process: Option<RankProcess>,
    launch_error: Option<String>,
    exit: Option<process::Exit>,
    /// When its exit was seen (by the thread waiting for it).
    exited_at: Option<Instant>,
    /// Exits of the processes below it that are watched (found ranks, processes that looked like
    /// ranks): the status if it was read, and when.
    exits: BTreeMap<u32, (Option<process::Exit>, Instant)>,
    /// Pids a watcher runs for.
    watching: BTreeSet<u32>,
    /// Tells the watchers to stop.
    stop: Arc<AtomicBool>,
    fifo: PathBuf,
    /// Processes seen below the launcher that looked like ranks but whose rank number no signal
    /// gave, as first seen, in the order they were seen (their exits are watched too).
    unidentified: Vec<Identity>,
    /// The processes `torch.multiprocessing.spawn` started below it, as first seen: sorted by
    /// start time they are its process indices, which its `ProcessExitedException` names.
    spawned: Vec<Identity>,
    /// Which writer of the marker FIFO is which rank, and this node's first global rank: the
    /// plan's expectation until the ranks say where the launcher's rendezvous placed the node
    /// (see [`process::PidRanks`], [`crate::harness::discover::node_first_rank`]).
    pid_ranks: Arc<Mutex<process::PidRanks>>,
    /// Whether the ranks said where the node is (looked for only on one node of several, until they do).
    placed: bool,
    /// When rank discovery runs next.
    next_discovery: Instant,
    /// Rounds of rank discovery so far (see [`discovery_table`]).
    rounds: u32,
    stdout_log: PathBuf,
    stderr_log: PathBuf,
    /// Ranks it started again after their watched process ended (rank, new pid): an elastic
    /// restart, told by `TORCHELASTIC_RESTART_COUNT` above the ended process's. Not watched.
    restarted: Vec<RestartedRank>,
}

impl Launcher {
    /// This node's first global rank, as the marker reader also numbers by it.
    fn first(&self) -> u32 {
        self.pid_ranks.lock().unwrap_or_else(|e| e.into_inner()).first
    }

    fn live(&self) -> bool {
        self.process.is_some() && self.exit.is_none()
    }

    /// Watches `pid` for its end, once.
    fn watch(&mut self, pid: u32, sink: &Sink) {
        if self.watching.insert(pid) {
            let (sink, stop) = (sink.clone(), self.stop.clone());
            let _ = std::thread::Builder::new()
                .name(format!("watch-{pid}"))
                .spawn(move || watch_found(pid, sink, stop));
        }
    }
}

/// Watches a process a launcher started (not our child, so not ours to wait for) for its exit
/// status, which only `/proc` shows, and only while it is a zombie: until the launcher reaps it
/// (torchrun polls every 0.1 s; `torch.multiprocessing.spawn` waits for it and reaps at once).
/// It sleeps until a thread of the process exits ([`FoundWatch`] says why that wins the race
/// against spawn where a pidfd of the whole process does not), and reads every [`ZOMBIE_POLL`]
/// while the process is exiting, or all along where there are no thread pidfds (Linux before
/// 6.9; that poll took 0.2–0.3 s of CPU a rank in a 14 s DDP run). Stops at `stop`, or once the
/// process is gone.
fn watch_found(pid: u32, sink: Sink, stop: Arc<AtomicBool>) {
    use crate::harness::os::found::{FoundState, FoundWatch, Slept};
    let mut watch = FoundWatch::open(pid);
    while !stop.load(Ordering::Relaxed) {
        match watch.state() {
            FoundState::Ended(exit) => {
                sink.send(Event::FoundExited { pid, exit, at: Instant::now() });
                return;
            }
            FoundState::Running if watch.sleep(STOP_LOOK) != Slept::Cannot => {}
            FoundState::Running | FoundState::Exiting => std::thread::sleep(ZOMBIE_POLL),
        }
    }
}

/// Sends `signal` to whatever the slot runs: its own process group (led by our unreaped child),
/// or a launcher's rank and the processes below it, checked against what each was when first
/// seen. `others` are the other found ranks' pids. Returns whether the rank got it (a process
/// that no longer passes the ownership checks does not).
fn signal_slot(slot: &Slot, run: &owner::Run, others: &[u32], signal: i32) -> bool {
    if let Some(p) = slot.process.as_ref() {
        p.signal_group(signal);
        true
    } else if let Some(who) = slot.found_id.filter(|_| !slot.found_gone) {
        crate::harness::os::found::signal_found(run, who, others, signal)
    } else {
        false
    }
}

/// The live processes of a slot: its group (rank and loader workers), or for a launcher's rank,
/// the rank and what is below it but the other ranks (its workers, whatever their process group:
/// `mp.spawn`'s ranks share the launcher's, srun's tasks the first task's).
fn slot_members(slot: &Slot, others: &[u32]) -> Vec<u32> {
    if let Some(p) = slot.process.as_ref() {
        return p.live_group_members();
    }
    let Some(pid) = slot.found else { return Vec::new() };
    crate::harness::discover::rank_members(pid, others)
}

/// The exit status `torch.multiprocessing.spawn` gives for the process it names in its
/// `ProcessExitedException`, for the rank that process was found to be when its own status was
/// not read (spawn reaps at once: on a busy machine before the watcher looked). The index is
/// spawn's: its processes in the order they started.
/// `failure`: spawn's `process i terminated …` among `lines`, read by the caller.
fn spawns_account(
    slots: &mut [Slot],
    l: &Launcher,
    lines: &[String],
    failure: Option<crate::harness::observe::spawn::SpawnFailure>,
    start: Instant,
) {
    let mut spawned = l.spawned.clone();
    spawned.sort_by_key(|who| (who.start_ticks, who.pid));
    // A rank's own exception, relayed by `spawn` (its wrapper caught it in the child): the rank's
    // own output, where nothing of it was attributed to the rank (they share the launcher's).
    if let Some((index, block)) = crate::harness::observe::spawn::spawn_raised(lines)
        && let Some(who) = spawned.get(index as usize)
        && let Some(slot) = slots.iter_mut().find(|s| s.found_id == Some(*who))
        && slot.end.stderr_tail.is_empty()
        && slot.end.state.error.is_none()
    {
        // As the observer's own `error` marker says it: the exception and the program's line.
        slot.end.state.error = crate::diagnose::key_line(&block).map(|k| match k.at {
            Some(at) => format!("{} ({at})", k.text),
            None => k.text,
        });
        slot.end.stderr_tail = block;
    }
    let Some(failure) = failure else { return };
    let Some(who) = spawned.get(failure.index as usize) else { return };
    if let Some(slot) = slots.iter_mut().find(|s| s.found_id == Some(*who) && s.end.exit.is_none()) {
        slot.end.exit = Some(failure.exit);
        slot.end.exit_source = Some(ExitSource::Spawn);
        return;
    }
    // The process it names was never matched to a rank (it ended before it said which it was):
    // `spawn` starts rank i as its i-th process, so it is that rank's, where that rank has none.
    let taken = slots.iter().any(|s| s.found == Some(who.pid));
    if let Some(slot) = slots.get_mut(failure.index as usize).filter(|s| s.found.is_none() && !taken) {
        slot.found = Some(who.pid);
        slot.found_id = Some(*who);
        slot.end.pid = Some(who.pid);
        slot.end.identified_by = Some(IdentifiedBy::SpawnOrder);
        slot.end.exit = Some(failure.exit);
        slot.end.exit_source = Some(ExitSource::Spawn);
        if let Some(&(_, at)) = l.exits.get(&who.pid) {
            slot.found_gone = true;
            slot.end.ended_at_s = Some(at.duration_since(start).as_secs_f64());
        }
    }
}

/// A cluster's account of its workers (Ray Train's): a rank's own lines are those the launcher's
/// output prefixes with its worker's pid, and an error the launcher relays for a rank
/// (`[Rank 1 Error Snippet]:`) is that rank's. The cluster ends every worker as the job ends, so
/// a worker's exit status is the rank's own end only where the cluster named the rank as failed;
/// the others' is the cluster's ([`ExitSource::Cluster`]): 0 where the job's driver exited 0.
/// Ranks ups-doctor stopped (a hang, the time limit) keep that end.
fn cluster_account(
    slots: &mut [Slot],
    workers: &ClusterWorkers,
    (err, out): (&[String], &[String]),
    driver: Option<process::Exit>,
    offset: u32,
) {
    let relayed = workers.relayed(&[err, out].concat());
    for slot in slots.iter_mut() {
        let Some(pid) = slot.found else { continue };
        let own = |lines: &[String]| -> Vec<String> {
            let of_worker = lines.iter().filter_map(|l| workers.worker_line(l));
            of_worker.filter(|(p, _)| *p == pid).map(|(_, text)| text.to_string()).collect()
        };
        let relay = relayed.iter().find(|(rank, _)| *rank == slot.end.rank + offset).map(|(_, block)| block);
        let mut tail = own(err);
        tail.extend(relay.into_iter().flatten().cloned());
        slot.end.quotes = quotes::output_quotes(&tail, &own(out));
        slot.end.stderr_tail = tail;
        if slot.end.intervention.is_some() {
            continue;
        }
        match driver {
            Some(process::Exit::Code(0)) => {
                slot.end.exit = Some(process::Exit::Code(0));
                slot.end.exit_source = Some(ExitSource::Cluster);
            }
            // Named by the cluster: its own end, as read (or not read: the relayed error says it),
            // unless it is the signal the cluster ends a worker with after its error.
            Some(_) if relay.is_some() => {
                let by_cluster = |s: i32| s == libc::SIGKILL || s == libc::SIGTERM;
                if matches!(slot.end.exit, Some(process::Exit::Signal { signal, .. }) if by_cluster(signal)) {
                    slot.end.exit_source = Some(ExitSource::ClusterAfterError);
                }
            }
            Some(e) => {
                slot.end.exit.get_or_insert(e);
                slot.end.exit_source = Some(ExitSource::Cluster);
            }
            None => {}
        }
    }
}

/// srun's own account of how each task ended, for a found rank whose exit was not read: slurmstepd
/// reaps its tasks at once, and on a busy machine before ups-doctor reads the zombie. Task numbers
/// are `SLURM_PROCID`, the global rank.
fn srun_account(slots: &mut [Slot], l: &Launcher, lines: &[String]) {
    for (task, exit) in crate::harness::observe::spawn::srun_ends(lines) {
        let Some(slot) = task.checked_sub(l.first()).and_then(|i| slots.get_mut(i as usize)) else {
            continue;
        };
        if slot.found.is_some()
            && slot.end.exit.is_none()
            && slot.end.identified_by == Some(IdentifiedBy::SlurmProcid)
        {
            slot.end.exit = Some(exit);
            slot.end.exit_source = Some(ExitSource::Srun);
        }
    }
}

/// A rank found by a weaker signal whose process then reported that same rank through the
/// helper's markers is identified by them (it may have ended since: a short run's markers can
/// come between two rounds of discovery).
fn confirm_by_markers(l: &Launcher, slots: &mut [Slot]) {
    let claims = l.pid_ranks.lock().map(|r| r.claimed.clone()).unwrap_or_default();
    let first = l.first();
    for slot in slots.iter_mut() {
        let claimed = slot.found.and_then(|pid| claims.get(&pid)) == Some(&(slot.end.rank + first));
        if claimed && slot.weakly_identified() {
            slot.end.identified_by = Some(IdentifiedBy::Markers);
        }
    }
}

/// A process below the launcher that no round of discovery matched while it lived, but whose
/// own markers named its rank (the observer's `group` marker, the helper's `start`): that rank's
/// process, by its own word, with the exit read while it was a zombie. Seen on a busy machine: a
/// Lightning rank that segfaulted soon after `init_process_group` had its `group` marker read
/// after it died, and was then listed only "by the order the processes that failed started".
fn claim_by_markers(slots: &mut [Slot], l: &Launcher, start: Instant) {
    let claims = l.pid_ranks.lock().map(|r| r.claimed.clone()).unwrap_or_default();
    let first = l.first();
    for u in &l.unidentified {
        let Some(rank) = claims.get(&u.pid).and_then(|r| r.checked_sub(first)) else { continue };
        let Some(slot) = slots.get_mut(rank as usize) else { continue };
        if slot.found.is_some() {
            continue;
        }
        slot.found = Some(u.pid);
        slot.found_id = Some(*u);
        slot.end.pid = Some(u.pid);
        slot.end.identified_by = Some(IdentifiedBy::Markers);
        if let Some(&(exit, at)) = l.exits.get(&u.pid) {
            slot.found_gone = true;
            slot.end.exit = exit;
            slot.end.exit_source =
                Some(if exit.is_some() { ExitSource::Procfs } else { ExitSource::Unknown });
            slot.end.ended_at_s = Some(at.duration_since(start).as_secs_f64());
        }
    }
}

/// The processes round `round` of rank discovery looks among: the members of the scenario's
/// cgroup (`cgroup`, its directory), which every process the run starts joins before `exec`, and
/// every [`WHOLE_MACHINE_EVERY`]th round (the first included), or where there is no group, every
/// process on the machine: srun's tasks are slurmstepd's children, outside the group, and found
/// only there. A launcher's start-up (torchrun importing torch, then its ranks) takes a few
/// seconds of 50 ms rounds, each of which had read the whole of `/proc` three times (about 7,700
/// `stat` files in a 14 s 2-rank torchrun run on a machine of 70 processes, most of ups-doctor's
/// CPU while the launcher starts); the group holds a handful.
fn discovery_table(cgroup: Option<&Path>, round: u32) -> Vec<crate::probe::memory::ProcStat> {
    let group = cgroup
        .filter(|_| !round.is_multiple_of(WHOLE_MACHINE_EVERY))
        .and_then(crate::harness::os::cgroup::read_members);
    match group {
        Some(group) => crate::probe::memory::processes_among(group),
        None => crate::probe::memory::processes(),
    }
}

/// The process spec the OS edge needs: the plan's, with the namespace and cgroup this run holds.
fn spec(p: &ProcessPlan, plan: &Plan, res: &Resources) -> RankSpec {
    RankSpec {
        rank: p.rank,
        program: p.program.clone(),
        args: p.args.clone(),
        env: p.env.clone(),
        stdout_log: p.stdout_log.clone(),
        stderr_log: p.stderr_log.clone(),
        mount_ns: mount_ns(res, p.cwd.as_deref()),
        marker_pipe: p.marker_pipe,
        env_remove: p.env_remove.clone(),
        report_output: p.report_output,
        output_origin: match plan.cluster_workers() {
            Some(workers) if p.rank == process::LAUNCHER_NUMBER => {
                Some(crate::harness::os::capture::Origin(Arc::new(|line: &str| {
                    workers.worker_line(line).map(|(pid, _)| pid)
                })))
            }
            _ => None,
        },
        stdout_pattern: plan.completion.patterns().0.filter(|_| p.watch_stdout).cloned(),
        stderr_pattern: plan.completion.patterns().1.filter(|_| p.watch_stdout).cloned(),
        cwd: p.cwd.as_ref().map(|c| std::path::absolute(c).unwrap_or_else(|_| c.clone())),
        cgroup: res.cgroup.map(|c| c.procs_file().to_owned()),
    }
}

/// The scenario's private `/dev/shm` namespace to join, with the directory to return to.
fn mount_ns(res: &Resources, cwd: Option<&Path>) -> Option<(std::os::fd::RawFd, std::ffi::CString)> {
    res.private_shm.map(|shm| {
        use std::os::unix::ffi::OsStrExt;
        let here = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        let cwd = cwd.map_or(here.clone(), |c| here.join(c));
        (shm.ns_fd(), std::ffi::CString::new(cwd.as_os_str().as_bytes()).unwrap_or_default())
    })
}

/// One scenario's supervision in progress.
/// How many steps after a worker's announcement every process is read in full: the first batch
/// may come from another worker, the second has come from each of two.
const SETTLE_AFTER_STEPS: u8 = 2;

struct Supervisor<'p, 'l> {
    plan: &'p Plan,
    res: &'p Resources<'p>,
    start: Instant,
    slots: Vec<Slot>,
    launcher: Option<Launcher>,
    sink: Sink,
    ownership: owner::Run,
    members: Arc<Mutex<Membership>>,
    machine: Machine,
    py_spy: Option<PathBuf>,
    sampler: Option<SamplerThread>,
    /// A worker was announced since the sampler last heard of it (see [`SamplerThread::sample_now`]).
    new_worker: bool,
    /// Steps still to come after the newest worker was announced, at each of which every process
    /// is read in full (see [`SamplerThread::settle`]): by then the worker has served batches.
    settle_steps: u8,
    settle_due: bool,
    /// Who listens to the run's one event stream (the live line, the link to the other nodes of
    /// a multi-node run), each told every event and ticked at its own pace.
    listeners: Vec<Listening<'l>>,
    /// Which ranks' ends the stream has told.
    ended_told: Vec<bool>,
    /// A listener asked the run to stop (a failure on another node): asked once only.
    remote_failed: bool,
    cpu: CpuWatch,
    /// The ranks the run watched before the program's process group grew it (see [`Self::grow`]).
    grown_from: Option<u32>,
    /// When ups-doctor began to tear the ranks down (its SIGTERM), in seconds since the start:
    /// a marker written after it answers the teardown (see [`RankState::apply_answering_teardown`]).
    tearing_down_at: Option<f64>,
}

/// A listener of the run's event stream, and when it is next due a [`RunEvent::Tick`].
struct Listening<'l> {
    listener: &'l mut (dyn Listener + 'l),
    every: Option<Duration>,
    next_tick: Instant,
}

/// Runs the scenario's processes to their end, publishing what it sees and does as one stream of
/// [`RunEvent`]s to every one of `listeners` (the live line; on one node of several, the link to
/// the others: see [`crate::nodes`]).
pub fn supervise<'p, 'l>(
    plan: &'p Plan,
    res: &'p Resources<'p>,
    listeners: Vec<&'l mut (dyn Listener + 'l)>,
    interrupted: &AtomicBool,
) -> Supervised {
    let start = Instant::now();
    let shm_dir = res.private_shm.map_or_else(|| PathBuf::from("/dev/shm"), PrivateShm::dir);
    let swept = teardown::sweep_orphaned_segments();
    // Held until the run's segments are gone: tells a sweep in any PID namespace this run lives.
    let alive =
        crate::harness::os::life::LockFile::create(&shm::lock_path(Path::new("/dev/shm"), &plan.run_id));
    if let Err(e) = &alive {
        eprintln!(
            "ups-doctor: warning: cannot make this run's lock file in `/dev/shm` ({e}): a run in another PID \
             namespace cannot tell it is alive, and may take its segments for a dead run's"
        );
    }
    let shm_before = shm::segments(&shm_dir);
    let (sink, queue, wakes) = Sink::new();
    let _interrupts = super::interrupt::listen(sink.clone());
    let program_path = plan.argv.first().and_then(|p| crate::harness::os::stacks::find_program(p));
    let mut s = Supervisor {
        plan,
        res,
        start,
        slots: Vec::new(),
        launcher: None,
        sink,
        ownership: owner::Run { run_id: plan.run_id.clone(), groups: Vec::new(), ranks: Vec::new() },
        members: Arc::default(),
        machine: Machine::new(plan.timing, plan.is_external()),
        py_spy: crate::harness::os::stacks::find_py_spy(program_path.as_deref()),
        sampler: None,
        new_worker: false,
        settle_steps: 0,
        settle_due: false,
        listeners: listeners
            .into_iter()
            .map(|listener| Listening { every: listener.tick_every(), listener, next_tick: start })
            .collect(),
        ended_told: vec![false; plan.world as usize],
        grown_from: None,
        tearing_down_at: None,
        remote_failed: false,
        cpu: CpuWatch::new(plan.world as usize, start),
    };
    s.publish(|_| RunEvent::ScenarioStarted {
        name: &res.scenario.name,
        ranks: plan.world,
        // A command's program says nothing of its total (`train.steps` is the built-in trainer's).
        steps: if res.scenario.is_external() { 0 } else { res.scenario.train.steps },
        hang_after_s: res.scenario.limits.hang_after_s,
    });
    s.spawn_all();
    s.sampler = SamplerThread::start(Setup {
        start,
        every: plan.sample_every,
        gpu_every: plan.gpu_every,
        shm_dir: shm_dir.clone(),
        run_id: plan.run_id.clone(),
        members: s.members.clone(),
        cgroup: res.cgroup.map(|c| c.dir().to_path_buf()),
        memory: MemoryRecorder::new(plan.world, plan.sample_every.as_secs_f64(), res.private_shm.is_some()),
        oom: OomWatch::start(res.cgroup),
        pressure: super::sampler::MemoryPressure { cgroup: res.cgroup.and_then(|c| c.usage_file()) },
    })
    .ok();
    s.run(interrupted, &queue, &wakes);
    s.publish(|at_s| RunEvent::ScenarioFinished { at_s });
    let supervised = s.finish(&queue, swept, &shm_dir, &shm_before);
    drop(alive);
    supervised
}

impl Supervisor<'_, '_> {
    fn since(&self, at: Instant) -> f64 {
        at.duration_since(self.start).as_secs_f64()
    }

    /// The loop: look, let the machine decide, act, sleep until news or the next deadline.
    fn run(&mut self, interrupted: &AtomicBool, queue: &Queue, wakes: &Receiver<()>) {
        let mut input = Input::Changed;
        loop {
            let now = Instant::now();
            if interrupted.load(Ordering::SeqCst) && !self.machine.interrupted() {
                input = Input::Interrupt;
            }
            self.note_exits(now);
            if self.launcher.as_ref().is_some_and(|l| now >= l.next_discovery) {
                self.discover(now);
            }
            self.share_membership();
            if std::mem::take(&mut self.new_worker)
                && let Some(sampler) = self.sampler.as_ref()
            {
                sampler.sample_now();
            }
            if std::mem::take(&mut self.settle_due)
                && let Some(sampler) = self.sampler.as_ref()
            {
                sampler.settle();
            }
            self.tell_ended(now);
            if let Some(what) = self.tick_due(now, true)
                && input != Input::Interrupt
            {
                input = Input::PeerFailed { what };
            }
            let peer = matches!(input, Input::PeerFailed { .. });
            let watching = matches!(self.machine.phase(), Phase::Running | Phase::Failing { .. });
            let views = self.rank_views();
            if watching {
                let pids: Vec<(Option<u32>, Duration, Vec<Identity>)> = (self.slots.iter().zip(&views))
                    .map(|(s, v)| {
                        (s.end.pid.filter(|_| s.live()), v.last_activity, s.verified_workers.clone())
                    })
                    .collect();
                let tree = self.launcher.as_ref().filter(|l| l.live()).and_then(|l| l.process.as_ref());
                let tree = tree.map(|p| p.pid).filter(|_| self.no_rank_found());
                self.cpu.read(now, pids.into_iter(), tree);
            }
            let view = self.view(&views, now);
            let actions = self.machine.step(input, now.duration_since(self.start), &view);
            let finish = actions.contains(&Action::Finish);
            let asked = actions.iter().any(|a| matches!(a, Action::DumpStacks { .. }));
            if actions.iter().any(|a| matches!(a, Action::MarkHung { .. })) {
                let ranks: Vec<u32> = self.slots.iter().filter(|s| s.live()).map(|s| s.end.rank).collect();
                self.publish(|at_s| RunEvent::Hung { at_s, ranks: ranks.clone() });
            }
            for action in actions {
                self.act(action);
            }
            if peer && watching && !finish {
                let ranks: Vec<u32> =
                    self.slots.iter().filter(|s| s.dump_requested).map(|s| s.end.rank).collect();
                self.publish(|at_s| RunEvent::StacksRequested { at_s, ranks: ranks.clone() });
            }
            if finish {
                break;
            }
            if asked {
                // Stacks asked for just now may all be in already (or none was asked): look again
                // at once rather than at the end of the wait.
                input = Input::Changed;
                continue;
            }
            let views = self.rank_views();
            let view = self.view(&views, Instant::now());
            let drain = self.plan.timing.pipe_drain_wait;
            let deadline = [
                self.machine.next_deadline(&view).map(|d| self.start + d),
                self.slots.iter().filter_map(|slot| slot.drain_deadline(drain)).min(),
                self.launcher.as_ref().filter(|_| self.looking_for_ranks()).map(|l| l.next_discovery),
                self.listeners.iter().filter(|l| l.every.is_some()).map(|l| l.next_tick).min(),
                watching.then_some(self.cpu.next),
            ]
            .into_iter()
            .flatten()
            .min();
            input = self.wait(queue, wakes, deadline);
        }
        // Where every rank ended up, to every listener that takes ticks.
        let now = Instant::now();
        for l in &mut self.listeners {
            l.next_tick = now;
        }
        self.tick_due(now, false);
    }

    /// Tells the stream of each rank that ended since it was last told (how, and whether it
    /// failed on its own).
    fn tell_ended(&mut self, now: Instant) {
        let needs_done = self.plan.completion.needs_done();
        // A cluster's worker that ended is no failure by itself (see `rank_views`): on a node of
        // several, where the job's driver runs elsewhere, each worker ends as the job does.
        let cluster = self.plan.cluster_workers().is_some();
        let at_s = self.since(now);
        let mut ended = Vec::new();
        for s in self.slots.iter().filter(|s| s.end.exit.is_some() || s.end.launch_error.is_some()) {
            if !std::mem::replace(&mut self.ended_told[s.end.rank as usize], true) {
                let how = s.end.exit.map_or_else(|| "failed to start".into(), describe_exit);
                ended.push((
                    s.end.rank,
                    s.end.ended_at_s.unwrap_or(at_s),
                    !cluster && failed_on_its_own(s, needs_done),
                    how,
                ));
            }
        }
        for (rank, at_s, failed, how) in ended {
            self.publish(|_| RunEvent::RankEnded { rank, at_s, failed, how: how.clone() });
        }
    }

    /// Ticks each listener whose pace is due with where every rank is now, and (`ask`) asks it
    /// whether the run must stop: a failure elsewhere (on another node), taken once.
    fn tick_due(&mut self, now: Instant, ask: bool) -> Option<String> {
        let at_s = self.since(now);
        let states: Vec<&RankState> = self.slots.iter().map(|s| &s.end.state).collect();
        let pids: Vec<Option<u32>> = self.slots.iter().map(|s| s.end.pid.filter(|_| s.live())).collect();
        let mut stop = None;
        for l in &mut self.listeners {
            let Some(every) = l.every.filter(|_| now >= l.next_tick) else { continue };
            l.next_tick = now + every;
            l.listener.event(RunEvent::Tick { at_s, states: &states, pids: &pids });
            if ask && stop.is_none() && !self.remote_failed {
                stop = l.listener.stop_request();
                self.remote_failed = stop.is_some();
            }
        }
        stop
    }

    /// Publishes `event`, made with the time since the start, to every listener.
    fn publish<'e>(&mut self, event: impl Fn(f64) -> RunEvent<'e>) {
        let at_s = self.since(Instant::now());
        for l in &mut self.listeners {
            l.listener.event(event(at_s));
        }
    }

    /// Starts every process of the plan.
    fn spawn_all(&mut self) {
        let plan = self.plan;
        match plan.style {
            Style::Launcher => self.spawn_launcher(),
            Style::PerRank => {
                for p in &plan.processes {
                    let mut slot = Slot::new(p.rank, p);
                    match process::spawn_rank(&spec(p, plan, self.res), self.sink.clone()) {
                        Ok(child) => {
                            slot.end.pid = Some(child.pid);
                            self.ownership.groups.push(child.pid);
                            slot.process = Some(child);
                        }
                        Err(e) => {
                            slot.end.launch_error = Some(if plan.is_external() {
                                launch_error_text(&plan.argv, &e)
                            } else {
                                format!("failed to start `{}`: {e}", p.program.display())
                            })
                        }
                    }
                    self.slots.push(slot);
                }
            }
        }
        let pids: Vec<Option<u32>> = self.slots.iter().map(|s| s.end.pid).collect();
        let start = self.start;
        self.publish(|_| RunEvent::Started { start, pids: pids.clone() });
    }

    /// Starts a launcher-style command: the marker FIFO and its reader, then the launcher.
    fn spawn_launcher(&mut self) {
        let plan = self.plan;
        let p = &plan.processes[0];
        let fifo = plan.marker_fifo.clone().unwrap_or_default();
        let mut l = Launcher {
            process: None,
            launch_error: None,
            exit: None,
            exited_at: None,
            exits: BTreeMap::new(),
            watching: BTreeSet::new(),
            stop: Arc::default(),
            fifo: fifo.clone(),
            unidentified: Vec::new(),
            spawned: Vec::new(),
            pid_ranks: Arc::new(Mutex::new(process::PidRanks { first: plan.offset, ..Default::default() })),
            placed: plan.global_world == plan.world,
            next_discovery: self.start,
            rounds: 0,
            stdout_log: p.stdout_log.clone(),
            stderr_log: p.stderr_log.clone(),
            restarted: Vec::new(),
        };
        match process::open_marker_fifo(&fifo) {
            Ok(file) => {
                let (events, ranks) = (self.sink.clone(), l.pid_ranks.clone());
                let worlds = (plan.global_world, plan.world, plan.grow_to);
                let _ = std::thread::Builder::new()
                    .name("markers-fifo".into())
                    .spawn(move || process::read_tagged_markers(file, worlds, ranks, events));
            }
            Err(e) => {
                l.launch_error = Some(format!("cannot create the marker FIFO `{}`: {e}", fifo.display()))
            }
        }
        if l.launch_error.is_none() {
            match process::spawn_rank(&spec(p, plan, self.res), self.sink.clone()) {
                Ok(child) => {
                    self.ownership.groups.push(child.pid);
                    l.process = Some(child);
                }
                Err(e) => l.launch_error = Some(launch_error_text(&plan.argv, &e)),
            }
        }
        self.launcher = Some(l);
        self.slots = (0..plan.world).map(|rank| Slot::new(rank, p)).collect();
    }

    /// Sleeps until an urgent event or `deadline`, then folds every queued event in. Returns
    /// what woke it.
    fn wait(&mut self, queue: &Queue, wakes: &Receiver<()>, deadline: Option<Instant>) -> Input {
        let timeout =
            deadline.map_or(Duration::from_secs(3600), |d| d.saturating_duration_since(Instant::now()));
        let input = match wakes.recv_timeout(timeout) {
            Ok(()) => Input::Changed,
            Err(RecvTimeoutError::Timeout) => Input::Timer,
            // Every sender is gone: nothing will change but the clock.
            Err(RecvTimeoutError::Disconnected) => {
                std::thread::sleep(timeout);
                Input::Timer
            }
        };
        while let Ok(event) = queue.try_recv() {
            self.apply(event);
        }
        self.count_dropped_markers();
        input
    }

    /// Markers the bounded queue dropped (see [`Sink`]), counted on their ranks.
    fn count_dropped_markers(&mut self) {
        for (rank, n) in self.sink.take_dropped() {
            if let Some(slot) = self.slots.get_mut(rank as usize) {
                slot.end.state.dropped_markers += n;
            }
        }
    }

    /// Folds one event into the slots.
    fn apply(&mut self, event: Event) {
        match event {
            Event::Marker { rank, at, marker } => {
                let t = self.since(at);
                let Some(slot) = self.slots.get_mut(rank as usize) else { return };
                // A worker marker is a claim on a process: checked now, while the worker runs.
                if let crate::protocol::Marker::Worker { pid, .. } = &marker {
                    match self.ownership.claim(*pid) {
                        Ok(Some(who)) => {
                            slot.verified_workers.push(who);
                            self.new_worker = true;
                            self.settle_steps = SETTLE_AFTER_STEPS;
                        }
                        Ok(None) => {}
                        Err(_) => {
                            slot.end.state.apply_bad(t);
                            slot.end.state.foreign_pids.push(*pid);
                            return;
                        }
                    }
                }
                if matches!(marker, crate::protocol::Marker::Step { .. }) && self.settle_steps > 0 {
                    self.settle_steps -= 1;
                    self.settle_due = true;
                }
                match self.tearing_down_at {
                    Some(term) if t >= term => slot.end.state.apply_answering_teardown(t, marker),
                    _ => slot.end.state.apply(t, marker),
                }
            }
            Event::BadMarker { rank, at } => {
                let t = self.since(at);
                if let Some(slot) = self.slots.get_mut(rank as usize) {
                    slot.end.state.apply_bad(t);
                }
            }
            Event::MarkersClosed { rank } => {
                if let Some(slot) = self.slots.get_mut(rank as usize) {
                    slot.markers_closed = true;
                }
            }
            Event::Exited { rank, at } => {
                let t = self.since(at);
                match self.slots.get_mut(rank as usize) {
                    Some(slot) => {
                        slot.exit_seen_at.get_or_insert(t);
                    }
                    // The launcher's own exit (its number is past the ranks).
                    None => {
                        if let Some(l) = self.launcher.as_mut() {
                            l.exited_at.get_or_insert(at);
                        }
                    }
                }
            }
            // A launcher's output (its rank number is past the ranks) is every rank's: they share it.
            // Not a rank's once ups-doctor declared it hung or out of time: what the launcher prints
            // then answers the teardown (torchrun's `SignalException` traceback), and as the rank's
            // "last output" it would come after the silence the verdict reports.
            // A cluster's launcher relays its workers' lines, each named by the worker's pid: a line
            // is then that worker's rank's alone, and the cluster's daemons' and the driver's own
            // lines are no found rank's (before a rank is found, the launcher is all there is to
            // hear from: every line counts for the ranks not found yet).
            Event::Output { rank, at, from } => {
                let t = self.since(at);
                let cluster = self.plan.cluster_workers().is_some();
                match self.slots.get_mut(rank as usize) {
                    Some(slot) => slot.end.last_output_at = Some(t),
                    None => (self.slots.iter_mut())
                        .filter(|slot| slot.end.intervention.is_none())
                        .filter(|slot| {
                            !cluster || slot.found.is_none() || from.is_some_and(|p| slot.found == Some(p))
                        })
                        .for_each(|slot| slot.end.last_output_at = Some(t)),
                }
            }
            Event::FoundExited { pid, exit, at } => {
                if let Some(l) = self.launcher.as_mut() {
                    l.exits.entry(pid).or_insert((exit, at));
                }
            }
            // The flag is read at the top of the loop.
            Event::Interrupt => {}
            Event::WorldGrew { world, at } => {
                let t = self.since(at);
                self.grow(world, t);
            }
        }
    }

    /// The program formed a process group of `world` ranks, more than the run watched: a slot for
    /// each new rank (found by discovery from now on, silent from `t` on), and the result says
    /// the count came from the program.
    fn grow(&mut self, world: u32, t: f64) {
        let from = self.slots.len() as u32;
        let Some(p) = self.plan.processes.first().filter(|_| world > from) else { return };
        for rank in from..world {
            let mut slot = Slot::new(rank, p);
            slot.added_at = Some(t);
            self.slots.push(slot);
        }
        self.ended_told.resize(world as usize, false);
        self.cpu.last.resize(world as usize, None);
        self.cpu.quiet.resize(world as usize, None);
        self.grown_from.get_or_insert(from);
    }

    /// Takes the exit status of every process whose exit was announced.
    fn note_exits(&mut self, now: Instant) {
        let mut ended = Vec::new();
        for slot in
            self.slots.iter_mut().filter(|s| s.live() && s.process.is_some() && s.exit_seen_at.is_some())
        {
            if let Some(exit) = slot.process.as_ref().and_then(RankProcess::peek_exit) {
                let at = slot.exit_seen_at.unwrap_or(0.0);
                slot.end.exit = Some(exit);
                slot.end.ended_at_s = Some(at);
                slot.exited_at = Some(now);
                ended.push((slot.end.rank, at));
            }
        }
        if let Some(l) = self.launcher.as_mut() {
            if l.live()
                && l.exited_at.is_some()
                && let Some(exit) = l.process.as_ref().and_then(RankProcess::peek_exit)
            {
                l.exit = Some(exit);
            }
            let launcher_pid = l.process.as_ref().map(|p| p.pid);
            let launcher_exit = l.exit.map(|e| (Some(e), l.exited_at.unwrap_or(now)));
            for slot in self.slots.iter_mut().filter(|s| s.found.is_some() && !s.found_gone) {
                let pid = slot.found.unwrap_or(0);
                // The launcher as a rank (Lightning's rank 0) is our own child: its exit is ours.
                let seen = if Some(pid) == launcher_pid { launcher_exit } else { l.exits.get(&pid).copied() };
                let Some((exit, at)) = seen else { continue };
                slot.found_gone = true;
                slot.end.exit = exit;
                slot.end.exit_source = Some(match (exit.is_some(), Some(pid) == launcher_pid) {
                    (true, true) => ExitSource::Launcher,
                    (true, false) => ExitSource::Procfs,
                    _ => ExitSource::Unknown,
                });
                let t = at.duration_since(self.start).as_secs_f64();
                slot.end.ended_at_s = Some(t);
                slot.exited_at = Some(now);
                ended.push((slot.end.rank, t));
            }
        }
        if let Some(sampler) = self.sampler.as_ref() {
            for (rank, at_s) in ended {
                sampler.rank_ended(rank, at_s);
            }
        }
    }

    /// Hands the sampler which process is which rank's, when that changed.
    fn share_membership(&self) {
        let members = Membership {
            groups: self
                .slots
                .iter()
                .filter(|s| s.process.is_some() || s.found.is_some())
                .filter_map(|s| Some((s.end.rank, s.end.pid?)))
                .collect(),
            found: self.slots.iter().filter_map(|s| Some((s.end.rank, s.found?, !s.found_gone))).collect(),
            workers: self
                .slots
                .iter()
                .flat_map(|s| s.verified_workers.iter().map(|w| (s.end.rank, *w)))
                .collect(),
            unfound_below: self
                .launcher
                .as_ref()
                .filter(|l| l.live() && self.slots.iter().any(|s| s.found.is_none()))
                .and_then(|l| Some(l.process.as_ref()?.pid)),
        };
        if let Ok(mut m) = self.members.lock()
            && *m != members
        {
            *m = members;
        }
    }

    /// Whether rank discovery has work: a rank not found yet, or a weak identification (spawn
    /// order) the markers or the port may still confirm or correct, while the launcher runs.
    fn looking_for_ranks(&self) -> bool {
        self.launcher.as_ref().is_some_and(Launcher::live)
            && (self.slots.iter().any(|s| s.found.is_none() || s.weakly_identified() || self.may_restart(s))
                || self.world_undeclared())
    }

    /// A run whose world may still grow and which no rank has told yet (no process group
    /// formed, no larger world found): a rank of a larger world may appear (and exit) before it
    /// forms its group, found only by looking.
    fn world_undeclared(&self) -> bool {
        self.plan.grow_to.is_some()
            && self.grown_from.is_none()
            && self.slots.iter().all(|s| s.end.state.observed.as_ref().is_none_or(|o| o.group.is_none()))
    }

    /// Whether the launcher may still start `slot`'s rank again (torchrun's `--max-restarts`): its
    /// watched process ended while the launcher runs, and no new one was seen yet.
    fn may_restart(&self, slot: &Slot) -> bool {
        let Some(l) = self.launcher.as_ref() else { return false };
        slot.found_gone && !l.restarted.iter().any(|r| r.rank == slot.end.rank + l.first())
    }

    /// One round of rank discovery below the launcher (see [`crate::harness::discover::discover_ranks`]): new
    /// ranks take their slots (their pid watched for its exit, their identity recorded for
    /// ownership checks); a rank first found by a weak signal (spawn order) takes the stronger
    /// one's word when it comes, the same process or not, as long as nothing was sent to it yet.
    /// Discovery sees global rank numbers (`RANK`, the markers' ranks); slots are numbered from 0.
    fn discover(&mut self, now: Instant) {
        let looking = self.looking_for_ranks();
        let missing = self.slots.iter().any(|s| s.found.is_none());
        let Some(l) = self.launcher.as_mut() else { return };
        l.next_discovery = now + if missing { DISCOVER_EVERY } else { REDISCOVER_EVERY };
        if !looking {
            return;
        }
        confirm_by_markers(l, &mut self.slots);
        let Some(root) = l.process.as_ref().map(|p| p.pid) else { return };
        let table = discovery_table(self.res.cgroup.map(|c| c.dir()), l.rounds);
        l.rounds += 1;
        let world = self.slots.len() as u32;
        if !l.placed && self.slots.iter().all(|s| s.found.is_none()) {
            let said = || l.pid_ranks.lock().ok().and_then(|r| r.said_first);
            if let Some(first) =
                crate::harness::discover::node_first_rank(&table, root, world, self.plan.global_world)
                    .or_else(said)
            {
                l.placed = true;
                l.pid_ranks.lock().unwrap_or_else(|e| e.into_inner()).first = first;
                if first != self.plan.offset {
                    self.publish(|at_s| RunEvent::Placed { at_s, first_rank: first });
                }
            }
        }
        let Some(l) = self.launcher.as_mut() else { return };
        let offset = l.first();
        let known = crate::harness::discover::Known {
            found: self.slots.iter().filter_map(|s| Some((s.end.rank + offset, s.found?))).collect(),
            claims: l.pid_ranks.lock().map(|r| r.claimed.clone()).unwrap_or_default(),
            port: self.plan.master_port,
            grow_to: self.plan.grow_to,
        };
        let found =
            crate::harness::discover::discover_ranks(&table, root, &self.plan.run_id, offset + world, &known);
        // A rank of a world its environment declares, larger than the one watched: the run grows
        // to it as it does when the program forms its group, and its lines are routed from now on.
        if let Some(beyond) = found.iter().map(|f| f.rank + 1 - offset).filter(|&w| w > world).max() {
            self.grow(beyond, self.since(now));
            if let Some(l) = self.launcher.as_mut()
                && let Ok(mut r) = l.pid_ranks.lock()
            {
                r.declared_world = r.declared_world.max(beyond + offset);
            }
        }
        let undeclared = self.world_undeclared();
        let Some(l) = self.launcher.as_mut() else { return };
        for crate::harness::discover::FoundRank { rank, pid, by } in found {
            let Some(rank) = rank.checked_sub(offset) else { continue };
            let Some(slot) = self.slots.get_mut(rank as usize) else { continue };
            let had = slot.end.identified_by.map_or(0, IdentifiedBy::strength);
            let stronger = slot.found.is_some() && by.strength() > had;
            if slot.found == Some(pid) {
                if stronger {
                    slot.end.identified_by = Some(by);
                }
                continue;
            }
            let untouched = slot.end.torn_down_with.is_none() && !slot.dump_requested && !slot.found_gone;
            if slot.found_gone && restart_count(pid).is_some_and(|n| n > slot.restart_count.unwrap_or(0)) {
                // The launcher started this rank again (an elastic restart): said, not watched.
                if !l.restarted.iter().any(|r| r.pid == pid) {
                    l.restarted.push(RestartedRank { rank: rank + offset, pid });
                    if let Ok(mut r) = l.pid_ranks.lock() {
                        r.restarted.insert(pid);
                    }
                }
                continue;
            }
            if slot.found.is_some() && !(stronger && untouched) {
                continue;
            }
            let Some(who) = owner::identify(pid) else { continue };
            slot.found = Some(pid);
            slot.found_id = Some(who);
            slot.restart_count = restart_count(pid);
            slot.end.identified_by = Some(by);
            slot.end.pid = Some(pid);
            self.ownership.ranks.push(who);
            if Some(pid) != l.process.as_ref().map(|p| p.pid) {
                l.watch(pid, &self.sink);
            }
            if let Ok(mut r) = l.pid_ranks.lock() {
                r.found.insert(pid, rank + offset);
            }
            // A spawn-order guess that named this process for another rank is void.
            for other in self.slots.iter_mut().filter(|s| s.end.rank != rank && s.found == Some(pid)) {
                other.found = None;
                other.found_id = None;
                other.end.pid = None;
                other.end.identified_by = None;
            }
        }
        for pid in crate::harness::discover::spawn_children(&table, root) {
            if !l.spawned.iter().any(|s| s.pid == pid)
                && let Some(who) = owner::identify(pid)
            {
                l.spawned.push(who);
            }
        }
        let found: Vec<u32> = self.slots.iter().filter_map(|s| s.found).collect();
        // Where the world may still grow, a process below the launcher may be a rank of the larger
        // one: kept (and its exit watched) so that its own markers can name it after it ended
        // (`claim_by_markers`); mp.spawn's rank 1 segfaulted before the group markers told the
        // world, and was never matched.
        if found.len() < self.slots.len() || undeclared {
            for pid in crate::harness::discover::unidentified_children(&table, root, &found) {
                if !l.unidentified.iter().any(|u| u.pid == pid)
                    && let Some(who) = owner::identify(pid)
                {
                    l.unidentified.push(who);
                    l.watch(pid, &self.sink);
                }
            }
        }
    }

    fn rank_views(&self) -> Vec<RankView> {
        let external = self.plan.is_external();
        let needs_done = self.plan.completion.needs_done();
        let launcher = self.plan.style == Style::Launcher;
        // A cluster's worker that ended is no failure by itself: the cluster ends its workers as
        // the job ends, and where one failed its driver says so and ends (the run ends with it).
        // Counted as one, a clean job's first worker to be shut down started the others' grace,
        // and on a loaded machine ups-doctor stopped the driver while it was still shutting down
        // its cluster (a clean Ray Train run judged failed, in the suite under load).
        let cluster = self.plan.cluster_workers().is_some();
        self.slots
            .iter()
            .map(|s| {
                // An external program may send no markers: its output counts as a sign of life.
                let marker = s.end.state.last_marker_at.unwrap_or(0.0);
                let last = if external { marker.max(s.end.last_output_at.unwrap_or(0.0)) } else { marker };
                let last = last.max(s.added_at.unwrap_or(0.0));
                RankView {
                    rank: s.end.rank,
                    live: s.live(),
                    unfound: launcher && s.found.is_none(),
                    failed: !cluster && failed_on_its_own(s, needs_done),
                    last_activity: Duration::from_secs_f64(last.max(0.0)),
                }
            })
            .collect()
    }

    /// Launcher style, and no rank of it found yet.
    fn no_rank_found(&self) -> bool {
        self.plan.style == Style::Launcher && self.slots.iter().all(|s| s.found.is_none())
    }

    fn view<'v>(&self, ranks: &'v [RankView], now: Instant) -> View<'v> {
        let drain = self.plan.timing.pipe_drain_wait;
        View {
            ranks,
            launcher_live: self.launcher.as_ref().is_some_and(Launcher::live),
            busy_at: self.cpu.busy_at.map(|b| b.saturating_duration_since(self.start)),
            no_rank_found: self.no_rank_found(),
            stacks_answered: self.stacks_answered(),
            stacks_coming: self.stacks_coming(),
            finished: !self.launcher.as_ref().is_some_and(Launcher::live)
                && self.slots.iter().all(|s| s.finished(now, drain)),
        }
    }

    /// A live rank asked for stacks that has not answered has used CPU since, in any process
    /// asked (a dump thread symbolising: seconds on a loaded machine; a stuck loader worker's
    /// answers while its rank, which has answered, sits idle). Read only while such a rank waits.
    fn stacks_coming(&self) -> bool {
        self.slots
            .iter()
            .filter(|s| s.live() && s.dump_requested)
            .filter(|s| !(s.end.state.stacks_complete && s.end.state.stack_ends >= s.dumps_requested))
            .any(|s| s.dump_cpu.as_ref().is_some_and(|(pids, then)| cpu_of(pids) - then >= DUMPING_CPU_S))
    }

    /// Every live rank asked for stacks has answered, from every process asked.
    fn stacks_answered(&self) -> bool {
        self.slots
            .iter()
            .filter(|s| s.live() && s.dump_requested)
            .all(|s| s.end.state.stacks_complete && s.end.state.stack_ends >= s.dumps_requested)
    }

    /// Carries out one of the machine's decisions.
    fn act(&mut self, action: Action) {
        match action {
            Action::MarkHung { rank, silence_s } => {
                let at_s = self.since(Instant::now());
                if let Some(slot) = self.slots.get_mut(rank as usize) {
                    slot.end.intervention = Some(Intervention::Hung { silence_s, at_s });
                }
            }
            Action::MarkTimedOut { rank } => {
                let silent_cpu = self.cpu.silent_cpu(rank as usize);
                if let Some(slot) = self.slots.get_mut(rank as usize) {
                    slot.end.intervention = Some(Intervention::TimedOut);
                    slot.end.silent_cpu = silent_cpu;
                }
            }
            Action::DumpStacks { ranks, look: Look::Stuck } => self.dump_stacks(&ranks),
            Action::DumpStacks { ranks, look: Look::Interrupt | Look::Peer } => {
                // The built-in trainer answers from its own handler, fast; an external program has
                // none, and py-spy is too slow here.
                let ownership = &self.ownership;
                for slot in self
                    .slots
                    .iter_mut()
                    .filter(|s| s.live() && ranks.contains(&s.end.rank) && s.process.is_some())
                {
                    let members = slot_members(slot, &[]);
                    slot.dump_cpu = Some((members.clone(), cpu_of(&members)));
                    slot.dumps_requested = teardown::request_stacks(&members, ownership);
                    slot.dump_requested = slot.dumps_requested > 0;
                }
            }
            Action::Signal(Teardown::Term) => {
                self.tearing_down_at.get_or_insert(self.start.elapsed().as_secs_f64());
                let answered = self.stacks_answered();
                self.signal_ranks(libc::SIGTERM);
                self.signal_launcher(libc::SIGTERM);
                self.publish(|at_s| RunEvent::TearingDown { at_s, stacks_answered: answered });
            }
            Action::Signal(Teardown::Kill) => self.signal_ranks(libc::SIGKILL),
            Action::Signal(Teardown::KillLauncher) => self.signal_launcher(libc::SIGKILL),
            Action::Finish => {}
        }
    }

    /// Signals every live rank. A launcher's rank is torn down only by what reached it (its
    /// launcher may end it).
    fn signal_ranks(&mut self, signal: i32) {
        let found: Vec<(u32, u32)> = self.slots.iter().filter_map(|s| Some((s.end.rank, s.found?))).collect();
        for slot in self.slots.iter_mut().filter(|s| s.live()) {
            let others: Vec<u32> =
                found.iter().filter(|(r, _)| *r != slot.end.rank).map(|(_, p)| *p).collect();
            if signal_slot(slot, &self.ownership, &others, signal) {
                slot.end.torn_down_with = Some(Signal::from_number(signal));
            }
        }
    }

    /// Signals the launcher's process group while the launcher runs (its group is ours: its
    /// leader is our unreaped child).
    fn signal_launcher(&self, signal: i32) {
        if let Some(p) = self.launcher.as_ref().filter(|l| l.live()).and_then(|l| l.process.as_ref()) {
            p.signal_group(signal);
        }
    }

    /// Looks before killing: asks the ranks' processes for their stacks (the built-in trainer's
    /// handler), or takes them from outside (py-spy) for an external program.
    fn dump_stacks(&mut self, ranks: &[u32]) {
        // The launcher can be a rank itself (Lightning's rank 0): the other ranks in its process
        // group are not its workers.
        let found: Vec<(u32, u32)> = self.slots.iter().filter_map(|s| Some((s.end.rank, s.found?))).collect();
        let external = self.plan.is_external();
        for slot in self.slots.iter_mut().filter(|s| s.live() && ranks.contains(&s.end.rank)) {
            let others: Vec<u32> =
                found.iter().filter(|(r, _)| *r != slot.end.rank).map(|(_, p)| *p).collect();
            let members = slot_members(slot, &others);
            if external {
                // A foreign program has no handler for our stack-dump signal (SIGUSR1 would kill
                // it): look from outside instead.
                let rank_pid = slot.end.pid;
                slot.end.dumps = members
                    .iter()
                    .map(|&pid| {
                        let role = if Some(pid) == rank_pid { ProcessRole::Rank } else { ProcessRole::Child };
                        crate::harness::os::stacks::py_spy_dump(
                            self.py_spy.as_deref(),
                            pid,
                            slot.end.rank,
                            role,
                        )
                    })
                    .collect();
            } else if slot.process.is_some() {
                slot.dump_cpu = Some((members.clone(), cpu_of(&members)));
                slot.dumps_requested = teardown::request_stacks(&members, &self.ownership);
            }
            slot.dump_requested = true;
        }
    }

    /// Stops sampling, collects every end and sweeps what outlived the ranks.
    fn finish(
        mut self,
        queue: &Queue,
        swept: Vec<crate::schema::LeftoverSegment>,
        shm_dir: &Path,
        shm_before: &[shm::Segment],
    ) -> Supervised {
        let plan = self.plan;
        // Exits the watchers saw since the loop last looked (what ran below a launcher that
        // looked like a rank is judged by them).
        while let Ok(event) = queue.try_recv() {
            if let Event::FoundExited { .. } = event {
                self.apply(event);
            }
        }
        self.count_dropped_markers();
        let Sampled { memory: recorder, oom, gpu } =
            self.sampler.take().and_then(SamplerThread::finish).unwrap_or_else(|| Sampled {
                memory: MemoryRecorder::new(
                    plan.world,
                    plan.sample_every.as_secs_f64(),
                    self.res.private_shm.is_some(),
                ),
                oom: OomWatch::start(None),
                gpu: super::sampler::GpuOutcome::Off,
            });
        let interrupted = self.machine.interrupted();
        let (start, res) = (self.start, self.res);
        let (ends, external, processes) = self.collect();
        // With the pids the launcher's end settled (a rank its markers named only after it died
        // has its process from there).
        let states: Vec<&RankState> = ends.iter().map(|e| &e.state).collect();
        let pids: Vec<Option<u32>> = ends.iter().map(|e| e.pid).collect();
        let memory = recorder.finish(&states, &pids);
        let gpu = gpu.finish(&states, &pids);
        let mut shm = swept;
        // Every process of the run that was seen: its ranks, their workers and children.
        let mut run_pids: Vec<u32> = pids.iter().flatten().copied().collect();
        run_pids.extend(memory.processes.iter().map(|p| p.pid));
        shm.extend(teardown::remove_leftover_segments(
            shm_dir,
            shm_before,
            &plan.run_id,
            &run_pids,
            res.private_shm.is_some(),
        ));
        let (cgroup, oom_kills, xids) = oom.finish(res.cgroup, &ends);
        Supervised {
            cgroup,
            oom_kills,
            xids,
            ends,
            start,
            wall_s: start.elapsed().as_secs_f64(),
            interrupted,
            memory,
            leftovers: Leftovers { shm, processes },
            external,
            gpu,
        }
    }

    /// The steps each rank's observer counted in the file it maps, read once its process has
    /// ended: a rank that died before its last step markers went out (a segfault, a SIGKILL, within
    /// the quarter second the observer's sending thread waits) still says how far it got.
    fn read_step_counters(&mut self) {
        let Some(folder) = &self.plan.stop_stacks else { return };
        let start = self.start;
        for slot in &mut self.slots {
            let Some(pid) = slot.end.pid else { continue };
            let Some((steps, stamp)) = crate::harness::os::stacks::step_counter(folder, pid) else {
                continue;
            };
            // However long ago: the stamp is from this run's own folder, and a rank may have hung
            // for longer than a marker's stamp is believed.
            let at = crate::harness::os::process::stamp_instant(stamp, Duration::MAX)
                .and_then(|at| at.checked_duration_since(start))
                .map(|d| d.as_secs_f64());
            slot.end.state.counted_steps(steps, at);
        }
    }

    /// The collectives each rank's observer kept in the file it maps, read once its process has
    /// ended: a rank gloo aborted (or one killed) in a collective within the quarter second the
    /// observer's sending thread waits still says which it was in, and what it issued before.
    fn read_collective_tails(&mut self) {
        let Some(folder) = &self.plan.stop_stacks else { return };
        let start = self.start;
        for slot in &mut self.slots {
            let Some(pid) = slot.end.pid else { continue };
            let tail = crate::harness::os::stacks::collective_tail(folder, pid);
            let read = !tail.is_empty();
            for (marker, stamp) in tail {
                let Some(at) = crate::harness::os::process::stamp_instant(stamp, Duration::MAX)
                    .and_then(|at| at.checked_duration_since(start))
                    .map(|d| d.as_secs_f64())
                else {
                    continue;
                };
                slot.end.state.kept_collective(at, &marker);
            }
            if read {
                slot.end.state.kept_read();
            }
        }
    }

    /// Reaps the launcher of a `launcher`-style run and reads its output: which ranks torchrun
    /// says failed and how (for ranks whose end was not seen), the lines to quote per rank, and
    /// whether its stdout matched the completion pattern; then settles the ranks no process of
    /// which was identified.
    fn launcher_end(&mut self) -> Option<(LauncherEnd, bool)> {
        let mut l = self.launcher.take()?;
        l.stop.store(true, Ordering::Relaxed);
        let offset = l.first();
        let (exit, stdout, stderr) = match l.process.take() {
            Some(p) => {
                let pid = p.pid;
                let (exit, stdout, stderr, _) = p.reap();
                (Some((pid, l.exit.unwrap_or(exit))), stdout, stderr)
            }
            None => (None, Default::default(), Default::default()),
        };
        let matched = stdout.matched || stderr.matched;
        let (err, out) = (stderr.last_lines(400), stdout.last_lines(100));
        let lines: Vec<String> = err.iter().chain(&out).cloned().collect();
        let failures = crate::harness::observe::torchrun::torchrun_failures(&lines);
        // Every line of the launcher's stderr is in `err` (none dropped, none cut from its start).
        let whole = stderr.total_bytes as usize <= stderr.tail.len()
            && stderr.tail.lines().filter(|l| !l.trim().is_empty()).count() <= err.len();
        for slot in &mut self.slots {
            let rank = slot.end.rank + offset;
            slot.end.quotes =
                quotes::output_quotes(&quotes::rank_lines(&err, rank), &quotes::rank_lines(&out, rank));
        }
        let launcher_name = self.plan.argv.first().cloned().unwrap_or_default();
        for slot in &mut self.slots {
            let from_torchrun = failures.iter().find(|f| f.rank == slot.end.rank + offset);
            match (slot.found, slot.end.exit, from_torchrun) {
                (Some(_), None, Some(f)) => {
                    slot.end.exit = Some(f.exit);
                    slot.end.exit_source = Some(ExitSource::Torchrun);
                }
                (Some(_), None, None) if exit.is_some_and(|(_, e)| e == process::Exit::Code(0)) => {
                    // torchrun ends with status 0 only when every rank did.
                    slot.end.exit = Some(process::Exit::Code(0));
                    slot.end.exit_source = Some(ExitSource::LauncherStatus0);
                }
                (Some(pid), None, None)
                    if crate::harness::observe::torchrun::exited_zero(
                        &lines,
                        &failures,
                        slot.end.rank + offset,
                        pid,
                        whole,
                    ) =>
                {
                    slot.end.exit = Some(process::Exit::Code(0));
                    slot.end.exit_source = Some(ExitSource::TorchrunNotFailed);
                }
                _ => {}
            }
        }
        // `spawn` names the process that failed by its index, which is its rank: a rank beyond
        // the world watched (one that exited before any rank formed the group and told the world)
        // is that many ranks, where the run may grow and the launcher did start that process.
        let failure = crate::harness::observe::spawn::spawn_failure(&lines);
        if let Some(f) = &failure
            && self.plan.grow_to.is_some_and(|cap| f.index < cap)
            && (f.index as usize) < l.spawned.len()
        {
            self.grow(f.index + 1, self.start.elapsed().as_secs_f64());
        }
        spawns_account(&mut self.slots, &l, &lines, failure, self.start);
        srun_account(&mut self.slots, &l, &lines);
        confirm_by_markers(&l, &mut self.slots);
        claim_by_markers(&mut self.slots, &l, self.start);
        if let Some(workers) = self.plan.cluster_workers() {
            cluster_account(&mut self.slots, workers, (&err, &out), exit.map(|(_, e)| e), offset);
        }
        let torn_down = self.tearing_down_at.map(|t| self.start + Duration::from_secs_f64(t));
        settle_unidentified(&mut self.slots, &l, exit, &launcher_name, (self.start, torn_down), offset);
        let _ = std::fs::remove_file(&l.fifo);
        let end = LauncherEnd {
            kind: self.plan.launcher.map(|l| l.name.to_string()),
            pid: exit.map(|(pid, _)| pid),
            exit_code: exit.and_then(|(_, e)| match e {
                process::Exit::Code(c) => Some(c),
                _ => None,
            }),
            signal: exit.and_then(|(_, e)| match e {
                process::Exit::Signal { signal, .. } => Some(Signal::from_number(signal)),
                _ => None,
            }),
            launch_error: l.launch_error.clone(),
            stdout_log: file_name(&l.stdout_log),
            stderr_log: file_name(&l.stderr_log),
            unidentified_processes: l
                .unidentified
                .iter()
                .filter(|u| !self.slots.iter().any(|s| s.found == Some(u.pid)))
                .count() as u32,
            quotes: quotes::output_quotes(&err, &out),
            log_tail: if stderr.tail.trim().is_empty() {
                stdout.last_lines(40)
            } else {
                stderr.last_lines(40)
            },
            port_in_use: crate::schema::port_in_use_line(&lines).map(|(port, _)| {
                let holder = crate::harness::os::tcp::listener_of(port);
                crate::schema::PortInUse {
                    port,
                    holder_pid: holder.as_ref().map(|h| h.0),
                    holder_command: holder.map(|h| h.1),
                }
            }),
            restarted: l.restarted.clone(),
            signalled: lines
                .iter()
                .filter(|l| crate::schema::is_signal_notice(l))
                .take(64)
                .cloned()
                .collect(),
        };
        Some((end, matched))
    }

    /// Reaps every process, gathers their output and the launcher's, and sweeps what outlived
    /// the ranks.
    fn collect(mut self) -> (Vec<RankEnd>, Option<ExternalRun>, Vec<LeftoverProcess>) {
        let plan = self.plan;
        let is_external = plan.is_external();
        let pattern_matched = std::cell::Cell::new(false);
        let launcher_end = self.launcher_end().map(|(end, matched)| {
            pattern_matched.set(matched);
            end
        });
        // After the launcher's end settled which process each rank was: a rank whose own markers
        // named it only after it died (`claim_by_markers`) has its pid from then on. Read before,
        // its counter was never looked for: Lightning's rank 1, segfaulting in step 4, reported 0
        // steps in 6 of 8 runs by hand and in a fresh-clone CI run.
        self.read_step_counters();
        self.read_collective_tails();
        self.share_membership();
        let members = self.members.lock().map(|m| m.clone()).unwrap_or_default();
        let worker_ids: Vec<(u32, u32)> =
            self.slots.iter().flat_map(|s| s.end.state.workers.iter().map(|w| (w.pid, w.id))).collect();
        let mut processes = teardown::kill_leftover_processes(&members, &worker_ids, &self.ownership);
        processes.extend(teardown::kill_cgroup_leftovers(self.res.cgroup, &members));

        let tail_lines = if is_external { 400 } else { 40 };
        let mut ends: Vec<RankEnd> = self
            .slots
            .into_iter()
            .map(|mut slot| {
                if let Some(process) = slot.process.take() {
                    let (exit, stdout, stderr, _leftovers) = process.reap();
                    slot.end.exit.get_or_insert(exit);
                    slot.end
                        .log_errors
                        .extend([&stdout, &stderr].into_iter().filter_map(|c| c.write_error.clone()));
                    pattern_matched.set(pattern_matched.get() || stdout.matched || stderr.matched);
                    if is_external {
                        slot.end.quotes =
                            quotes::output_quotes(&stderr.last_lines(tail_lines), &stdout.last_lines(100));
                    }
                    slot.end.stdout_tail = stdout.last_lines(tail_lines);
                    slot.end.stderr_tail = stderr.last_lines(tail_lines);
                }
                slot.end
            })
            .collect();
        if is_external {
            for end in &mut ends {
                end.completed = Some(match &plan.completion {
                    Completion::ExitStatus => true,
                    Completion::Done => end.state.done,
                    Completion::Stdout(_) | Completion::Output(_) => pattern_matched.get(),
                });
            }
        }
        let external_run = is_external.then(|| ExternalRun {
            argv: plan.argv.clone(),
            style: plan.style.external(),
            style_chosen: plan.style_chosen.clone(),
            markers_seen: ends.iter().any(|e| e.state.markers > 0),
            observer_silent: plan.stop_stacks.is_some() && ends.iter().all(|e| e.state.observed.is_none()),
            completion: plan.completion.describe(),
            launcher: launcher_end,
            py_spy: self.py_spy.as_ref().map(|p| p.display().to_string()),
            world_size_declared: self.grown_from,
        });
        (ends, external_run, processes)
    }
}

/// The ranks of a launcher whose process no signal identified, once the launcher has ended:
/// - the launcher exited 0: each passes on that status (a clean run is never a failed launch);
/// - it could not start, or ended with no process below it that looked like a rank: the rank was
///   never started as far as anyone can tell (`launch_failed`, with the launcher's exit);
/// - else the processes below it that looked like ranks are judged as processes: those that
///   failed (a signal, a non-zero status) take the unidentified ranks' places in the order the
///   processes started, each with its own exit (`rank number unknown`), so first failure and
///   collateral come from what they did; the other ranks take the launcher's status. A process
///   that ended once ups-doctor began its teardown (`torn_down`) ended by its doing, not its own:
///   a Ray daemon killed as the run was torn down for a hang was taken for a rank that failed.
fn settle_unidentified(
    slots: &mut [Slot],
    l: &Launcher,
    exit: Option<(u32, process::Exit)>,
    launcher_name: &str,
    (start, torn_down): (Instant, Option<Instant>),
    offset: u32,
) {
    let found: Vec<u32> = slots.iter().filter_map(|s| s.found).collect();
    let looked: Vec<Identity> = l.unidentified.iter().copied().filter(|u| !found.contains(&u.pid)).collect();
    let unknown = crate::diagnose::looked_like_ranks(looked.len() as u32);
    let mut failed = looked
        .iter()
        .filter_map(|u| match l.exits.get(&u.pid) {
            Some(&(Some(e), at)) => Some((u.pid, e, at)),
            _ => None,
        })
        .filter(|(_, e, at)| *e != process::Exit::Code(0) && torn_down.is_none_or(|t| *at < t));
    let launcher_exit = exit.map(|(_, e)| e);
    for slot in slots.iter_mut().filter(|s| s.found.is_none()) {
        // What the launcher's output prefixes with `[rankN]:` is rank N's by PyTorch's numbering,
        // not this slot's process's: it stays quoted as the launcher's output only.
        slot.end.quotes.clear();
        match (launcher_exit, &l.launch_error) {
            // The launcher never started: that is the whole story, no rank could.
            (_, Some(e)) => slot.end.launch_error = Some(e.clone()),
            // Torn down for a hang or the time limit: that is the outcome, whatever ran below.
            (Some(e), None) if slot.end.intervention.is_some() => {
                slot.end.exit = Some(e);
                slot.end.exit_source = Some(ExitSource::LauncherStatus);
            }
            (Some(process::Exit::Code(0)), None) => {
                slot.end.exit = Some(process::Exit::Code(0));
                slot.end.exit_source = Some(ExitSource::NotIdentified);
            }
            (Some(e), None) if !looked.is_empty() => {
                if let Some((pid, exit, at)) = failed.next() {
                    slot.end.pid = Some(pid);
                    slot.end.exit = Some(exit);
                    slot.end.ended_at_s = Some(at.duration_since(start).as_secs_f64());
                    slot.end.exit_source = Some(ExitSource::ProcfsRankUnknown);
                } else {
                    slot.end.exit = Some(e);
                    slot.end.ended_at_s = l.exited_at.map(|at| at.duration_since(start).as_secs_f64());
                    slot.end.exit_source = Some(ExitSource::LauncherStatus);
                }
            }
            (Some(e), None) => {
                let how = format!("the launcher `{launcher_name}` {}", describe_exit(e));
                slot.end.launch_error = Some(not_identified(slot.end.rank + offset, &unknown, &how));
            }
            (None, None) => {
                let how = format!("the launcher `{launcher_name}` did not run");
                slot.end.launch_error = Some(not_identified(slot.end.rank + offset, &unknown, &how));
            }
        }
    }
}

fn not_identified(rank: u32, unknown: &str, how: &str) -> String {
    format!(
        "no process of rank {rank} was identified under the launcher (by `RANK`, `LOCAL_RANK`, `SLURM_PROCID`, `OMPI_COMM_WORLD_RANK`, `PMI_RANK`, the helper's markers, the rendezvous port, the launcher itself or a spawn order){unknown}; {how}"
    )
}

/// `exited with status 1`, `was killed by SIGKILL`.
fn describe_exit(exit: process::Exit) -> String {
    match exit {
        process::Exit::Code(c) => format!("exited with status {c}"),
        process::Exit::Signal { signal, .. } => format!("was killed by {}", signal_name(signal)),
    }
}

/// A command that could not start, with the fix for the usual cause.
fn launch_error_text(argv: &[String], err: &std::io::Error) -> String {
    let program = argv.first().map_or("", String::as_str);
    if err.kind() == std::io::ErrorKind::NotFound && !program.contains('/') {
        format!(
            "failed to start `{program}`: not found on `PATH`; put the folder that holds it (e.g. your venv's `bin`) on `PATH`, or give its path in `command`"
        )
    } else {
        format!("failed to start `{program}`: {err}")
    }
}

/// Whether this rank has ended by itself in a way that is not a success. An exit status of 0
/// counts as one only where completion is the `done` marker (an output pattern is judged once
/// all output is in).
fn failed_on_its_own(slot: &Slot, needs_done: bool) -> bool {
    if slot.end.launch_error.is_some() {
        return true;
    }
    match slot.end.exit {
        Some(process::Exit::Code(0)) => needs_done && !slot.end.state.done,
        Some(_) => slot.end.torn_down_with.is_none(),
        None => false,
    }
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// torchrun's count of the restarts of its worker group, as the process `pid` started with
/// (`TORCHELASTIC_RESTART_COUNT`; its DataLoader workers inherit it).
fn restart_count(pid: u32) -> Option<u32> {
    crate::probe::memory::environ_var(pid, "TORCHELASTIC_RESTART_COUNT")?.trim().parse().ok()
}
