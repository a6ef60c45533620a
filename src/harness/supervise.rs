//! The supervising loop for one scenario: start the ranks, fold their markers into state, notice
//! exits, hangs and overruns, ask stuck ranks for stack dumps, then tear down with escalation
//! (SIGTERM to the process group, then SIGKILL). Returns what was observed; deciding what it
//! means is [`super::classify`]'s job.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::probe::nvml::{Nvml, Sampler};
use crate::probe::{memory, shm};
use crate::protocol::{MARKER_PATH_ENV, RUN_ID_ENV, STACK_DUMP_SIGNAL, signal_name};
use crate::scenario::{CompletesWhen, LaunchStyle, Scenario};

use super::classify::{Intervention, RankEnd};
use super::gpu::{GpuRecorder, GpuSample};
use super::memory::{MemoryRecorder, ProcSample, ShmSample, new_segments, orphaned_segments, ours_bytes};
use super::namespace::PrivateShm;
use super::oom::OomWatch;
use super::os::cgroup::ScenarioCgroup;
use super::owner::{self, Identity};
use super::process::{self, Event, RankProcess, RankSpec};
use super::progress::Progress;
use super::state::RankState;
use super::{external, quotes};
use crate::nodes::{LocalEvent, NodeLink};
use crate::schema::{
    CgroupReport, ExitSource, ExternalRun, ExternalStyle, GpuReport, IdentifiedBy, LauncherEnd,
    LeftoverProcess, LeftoverSegment, Leftovers, MemoryReport, OomKill, ProcessRole, Signal,
};

/// How long stuck ranks get to answer a stack-dump request.
const STACK_DUMP_WAIT: Duration = Duration::from_secs(5);
/// How long ranks get to answer a stack-dump request after a failure on another node: they are
/// torn down as soon as they answered, and on a loaded machine a debug build's first symbolised
/// stack takes seconds.
const REMOTE_DUMP_WAIT: Duration = Duration::from_secs(15);
/// How long a rank gets between SIGTERM and SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(3);
/// After a Ctrl-C or SIGTERM: how long ranks get between SIGTERM and SIGKILL, and to answer a
/// stack-dump request.
const INTERRUPT_TERM_GRACE: Duration = Duration::from_secs(1);
const INTERRUPT_DUMP_WAIT: Duration = Duration::from_secs(3);
/// How long a launcher gets between SIGTERM and SIGKILL (its ranks get [`TERM_GRACE`]): once
/// they are gone it still has to end its own way, and killed too early it leaves things behind
/// (`srun` killed before slurmstepd reports its tasks' end leaves the job's allocation running).
const LAUNCHER_TERM_GRACE: Duration = Duration::from_secs(15);
const LAUNCHER_INTERRUPT_TERM_GRACE: Duration = Duration::from_secs(5);
/// After the first rank fails, how long the others get to notice and end on their own (their
/// own error is the collateral evidence) before they are asked for stacks and torn down.
const COLLATERAL_GRACE: Duration = Duration::from_secs(5);
/// How long after a rank's exit we keep waiting for markers still in its pipe (a grandchild that
/// holds the pipe open must not stall the run).
const PIPE_DRAIN_WAIT: Duration = Duration::from_secs(2);
/// Poll interval of the loop; bounds how late an exit, hang or timeout is noticed.
const TICK: Duration = Duration::from_millis(50);
/// How often memory and `/dev/shm` are sampled.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(250);
/// How long killed leftover processes get to disappear before they are reported as surviving.
const LEFTOVER_KILL_WAIT: Duration = Duration::from_secs(2);

/// What to run for one scenario.
pub struct ScenarioPlan<'a> {
    pub scenario: &'a Scenario,
    /// The `ups-doctor` binary that runs `train`.
    pub program: PathBuf,
    /// The resolved scenario file handed to each rank.
    pub resolved_file: PathBuf,
    /// Where per-rank logs go.
    pub log_dir: PathBuf,
    /// Unique to this scenario run (see [`RUN_ID_ENV`]); from [`new_run_id`].
    pub run_id: String,
    /// The scenario's private `/dev/shm` (`data.shm_size`), which every rank joins.
    pub private_shm: Option<&'a PrivateShm>,
    /// The scenario file's folder, absolute (`{scenario_dir}` in a command).
    pub scenario_dir: PathBuf,
    /// The scenario's cgroup, which every process it starts joins (none where none can be made).
    pub cgroup: Option<&'a ScenarioCgroup>,
    /// This node's place in a multi-node run (none on one machine).
    pub node: Option<&'a crate::nodes::NodePlacement>,
}

/// A run id unique on this machine: the harness's pid, a per-process counter and the time.
pub fn new_run_id() -> String {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("{}-{n}-{nanos:08x}", std::process::id())
}

/// What supervision observed.
pub struct Supervised {
    pub ends: Vec<RankEnd>,
    pub wall_s: f64,
    pub interrupted: bool,
    pub memory: MemoryReport,
    pub leftovers: Leftovers,
    pub external: Option<ExternalRun>,
    pub gpu: Option<GpuReport>,
    pub cgroup: Option<CgroupReport>,
    pub oom_kills: Vec<OomKill>,
}

/// GPU sampling for one scenario.
enum GpuWatch {
    /// The ranks train on the CPU by choice (`device: cpu`), or `limits.gpu_sample_ms` is 0.
    Off,
    /// Why NVML cannot be used.
    Unavailable(String),
    On {
        sampler: Sampler,
        recorder: GpuRecorder,
        every: Duration,
        next: Instant,
    },
}

impl GpuWatch {
    fn start(scenario: &Scenario, now: Instant) -> GpuWatch {
        let ms = scenario.limits.gpu_sample_ms;
        if scenario.launch.device == crate::scenario::Device::Cpu || ms == 0 {
            return GpuWatch::Off;
        }
        match Sampler::new() {
            Err(why) => GpuWatch::Unavailable(why),
            Ok(sampler) => {
                let every = Duration::from_millis(ms);
                let info = Nvml::get().and_then(Nvml::driver_info).map(|d| d.gpus).unwrap_or_default();
                let recorder = GpuRecorder::new(every.as_secs_f64(), info, sampler.gpm_missing.clone());
                GpuWatch::On { sampler, recorder, every, next: now }
            }
        }
    }

    fn tick(&mut self, now: Instant, t_s: f64) {
        if let GpuWatch::On { sampler, recorder, every, next } = self
            && now >= *next
        {
            recorder.record(GpuSample { t_s, gpus: sampler.sample() });
            *next = now + *every;
        }
    }

    fn finish(self, states: &[&RankState], pids: &[Option<u32>]) -> Option<GpuReport> {
        match self {
            GpuWatch::Off => None,
            GpuWatch::Unavailable(why) => Some(GpuReport::unavailable(why)),
            GpuWatch::On { recorder, .. } => Some(recorder.finish(states, pids)),
        }
    }
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
    /// A launcher's rank, found in its process tree: the pid, not our child.
    found: Option<u32>,
    /// The found rank as first seen: what a signal to it is checked against.
    found_id: Option<Identity>,
    /// The found rank is gone (a zombie, or no longer in /proc).
    found_gone: bool,
    /// When the process was seen to exit, by the thread waiting for it.
    exit_seen_at: Option<f64>,
    /// Workers its `worker` markers named that were checked to be this run's when the marker
    /// arrived ([`owner::Run::claim`]).
    verified_workers: Vec<Identity>,
}

impl Slot {
    fn live(&self) -> bool {
        (self.process.is_some() && self.end.exit.is_none()) || (self.found.is_some() && !self.found_gone)
    }

    fn finished(&self) -> bool {
        if self.found.is_some() {
            return self.found_gone;
        }
        match (&self.process, self.exited_at) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(_), Some(at)) => self.markers_closed || at.elapsed() >= PIPE_DRAIN_WAIT,
        }
    }
}

/// How often the exit of a launcher's rank is looked for in procfs: it is a zombie only until
/// the launcher reaps it (torchrun polls its workers every 0.1 s).
const ZOMBIE_POLL: Duration = Duration::from_millis(2);

/// The launcher of a `launcher`-style run and what watches its ranks.
struct Launcher {
    process: Option<RankProcess>,
    launch_error: Option<String>,
    exit: Option<process::Exit>,
    exited_at: Option<Instant>,
    /// Rank pids whose exit the zombie poller watches, and what it saw.
    watched: Arc<Mutex<Vec<u32>>>,
    exits: Arc<Mutex<BTreeMap<u32, (process::Exit, Instant)>>>,
    stop: Arc<AtomicBool>,
    fifo: PathBuf,
    /// Processes seen below the launcher that looked like ranks but whose rank number no signal
    /// gave, as first seen, in the order they were seen (their exits are watched too).
    unidentified: Vec<Identity>,
    /// Which writer of the marker FIFO is which rank (see [`process::PidRanks`]).
    pid_ranks: Arc<Mutex<process::PidRanks>>,
    /// When rank discovery runs next once every rank is found (a stronger signal may still come).
    next_discovery: Instant,
    stdout_log: PathBuf,
    stderr_log: PathBuf,
}

impl Launcher {
    fn live(&self) -> bool {
        self.process.is_some() && self.exit.is_none()
    }
}

/// Reads the exit status of watched processes while they are zombies, and when it was first
/// seen (which rank ended first is decided by these times), until `stop`.
fn poll_zombies(
    watched: Arc<Mutex<Vec<u32>>>,
    exits: Arc<Mutex<BTreeMap<u32, (process::Exit, Instant)>>>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Relaxed) {
        let pids: Vec<u32> = watched.lock().map(|w| w.clone()).unwrap_or_default();
        for pid in pids {
            if let Some(exit) = external::zombie_exit(pid) {
                if let Ok(mut exits) = exits.lock() {
                    exits.entry(pid).or_insert((exit, Instant::now()));
                }
                if let Ok(mut w) = watched.lock() {
                    w.retain(|&p| p != pid);
                }
            }
        }
        std::thread::sleep(ZOMBIE_POLL);
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
        external::signal_found(run, who, others, signal)
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
    external::rank_members(pid, others)
}

/// Signals the launcher's process group while the launcher runs (its group is ours: its leader
/// is our unreaped child).
fn signal_launcher(launcher: &Option<Launcher>, signal: i32) {
    if let Some(p) = launcher.as_ref().filter(|l| l.live()).and_then(|l| l.process.as_ref()) {
        p.signal_group(signal);
    }
}

/// A rank found by a weaker signal whose process then reported that same rank through the
/// helper's markers is identified by them (it may have ended since: a short run's markers can
/// come between two rounds of discovery).
fn confirm_by_markers(l: &Launcher, slots: &mut [Slot]) {
    let claims = l.pid_ranks.lock().map(|r| r.claimed.clone()).unwrap_or_default();
    for slot in slots.iter_mut() {
        let claimed = slot.found.and_then(|pid| claims.get(&pid)) == Some(&slot.end.rank);
        let weaker = slot.end.identified_by.is_some_and(|b| b.strength() < IdentifiedBy::Markers.strength());
        if claimed && weaker {
            slot.end.identified_by = Some(IdentifiedBy::Markers);
        }
    }
}

/// The pids of the found ranks other than `rank`.
fn other_ranks(slots: &[Slot], rank: u32) -> Vec<u32> {
    slots.iter().filter(|s| s.end.rank != rank).filter_map(|s| s.found).collect()
}

/// One round of rank discovery below the launcher `l` (see [`external::discover_ranks`]): new
/// ranks take their slots (their pid watched for its exit, their identity recorded for
/// ownership checks); a rank first found by a weak signal (spawn order) takes the stronger one's
/// word when it comes, the same process or not, as long as nothing was sent to it yet.
///
/// `offset` is this node's first global rank in a multi-node run (0 on one machine): discovery
/// sees global rank numbers (`RANK`, the markers' ranks), slots are numbered from 0.
fn discover(
    l: &mut Launcher,
    slots: &mut [Slot],
    ownership: &mut owner::Run,
    run_id: &str,
    port: u16,
    offset: u32,
) {
    confirm_by_markers(l, slots);
    let Some(root) = l.process.as_ref().map(|p| p.pid) else { return };
    let world = slots.len() as u32;
    let known = external::Known {
        found: slots.iter().filter_map(|s| Some((s.end.rank + offset, s.found?))).collect(),
        claims: l
            .pid_ranks
            .lock()
            .map(|r| r.claimed.iter().map(|(&pid, &rank)| (pid, rank + offset)).collect())
            .unwrap_or_default(),
        port,
    };
    for external::FoundRank { rank, pid, by } in
        external::discover_ranks(root, run_id, offset + world, &known)
    {
        let Some(rank) = rank.checked_sub(offset) else { continue };
        let Some(slot) = slots.get_mut(rank as usize) else { continue };
        let had = slot.end.identified_by.map_or(0, IdentifiedBy::strength);
        let stronger = slot.found.is_some() && by.strength() > had;
        if slot.found == Some(pid) {
            if stronger {
                slot.end.identified_by = Some(by);
            }
            continue;
        }
        let untouched = slot.end.torn_down_with.is_none() && !slot.dump_requested && !slot.found_gone;
        if slot.found.is_some() && !(stronger && untouched) {
            continue;
        }
        let Some(who) = owner::identify(pid) else { continue };
        slot.found = Some(pid);
        slot.found_id = Some(who);
        slot.end.identified_by = Some(by);
        slot.end.pid = Some(pid);
        ownership.ranks.push(who);
        if let Ok(mut w) = l.watched.lock() {
            w.push(pid);
        }
        if let Ok(mut r) = l.pid_ranks.lock() {
            r.found.insert(pid, rank);
        }
        // A spawn-order guess that named this process for another rank is void.
        for other in slots.iter_mut().filter(|s| s.end.rank != rank && s.found == Some(pid)) {
            other.found = None;
            other.found_id = None;
            other.end.pid = None;
            other.end.identified_by = None;
        }
    }
    let found: Vec<u32> = slots.iter().filter_map(|s| s.found).collect();
    if found.len() < slots.len() {
        for pid in external::unidentified_children(root, &found) {
            if !l.unidentified.iter().any(|u| u.pid == pid)
                && let Some(who) = owner::identify(pid)
            {
                l.unidentified.push(who);
                if let Ok(mut w) = l.watched.lock() {
                    w.push(pid);
                }
            }
        }
    }
}

/// Runs the scenario's ranks to their end.
pub fn supervise(
    plan: &ScenarioPlan,
    progress: &mut Progress,
    interrupted: &AtomicBool,
    mut link: Option<&mut dyn NodeLink>,
) -> Supervised {
    let scenario = plan.scenario;
    let world = plan.node.map_or(scenario.launch.world_size, |n| n.local_world);
    let is_external = scenario.is_external();
    let master_port = plan.node.map_or_else(free_port, |n| n.master_port);
    let argv =
        if is_external { external::argv(scenario, &plan.scenario_dir, master_port) } else { Vec::new() };
    // On one node of several: torchrun's per-node form; a launcher's ranks carry global numbers.
    let (argv, offset) = match plan.node {
        Some(n) => (crate::nodes::torchrun::per_node(&argv, n), n.global_rank(0)),
        None => (argv, 0),
    };
    let (launcher_style, style_chosen) = match scenario.launch.style {
        LaunchStyle::Auto if is_external => {
            let (launcher, why) = external::auto_style(&argv);
            (launcher, Some(why))
        }
        style => (is_external && style == LaunchStyle::Launcher, None),
    };
    let program_path = argv.first().and_then(|p| external::find_program(p));
    let py_spy = external::find_py_spy(program_path.as_deref());
    let start = Instant::now();
    let shm_dir = plan.private_shm.map_or_else(|| PathBuf::from("/dev/shm"), PrivateShm::dir);
    let swept = sweep_orphaned_segments();
    let shm_before = shm::segments(&shm_dir);
    let shm_sample = || {
        let ours = ours_bytes(&shm::segments(&shm_dir), &plan.run_id);
        ShmSample { usage: shm::usage(&shm_dir), ours }
    };
    let mut recorder = MemoryRecorder::new(world, SAMPLE_INTERVAL.as_secs_f64(), plan.private_shm.is_some());
    let mut next_sample = start;
    let mut gpu = GpuWatch::start(scenario, start);
    let mut oom = OomWatch::start(plan.cgroup);
    let (tx, rx) = mpsc::channel();
    let new_slot = |rank: u32, stdout: &std::path::Path, stderr: &std::path::Path| Slot {
        end: RankEnd {
            rank,
            stdout_log: file_name(stdout),
            stderr_log: file_name(stderr),
            ..Default::default()
        },
        process: None,
        exited_at: None,
        markers_closed: false,
        dump_requested: false,
        dumps_requested: 0,
        found: None,
        found_id: None,
        found_gone: false,
        exit_seen_at: None,
        verified_workers: Vec::new(),
    };
    let mut launcher: Option<Launcher> = None;
    let mut slots: Vec<Slot> = if launcher_style {
        let spec = launcher_spec(plan, &argv, master_port);
        let fifo = plan.log_dir.join("markers.fifo");
        let mut l = Launcher {
            process: None,
            launch_error: None,
            exit: None,
            exited_at: None,
            watched: Arc::default(),
            exits: Arc::default(),
            stop: Arc::default(),
            fifo: fifo.clone(),
            unidentified: Vec::new(),
            pid_ranks: Arc::default(),
            next_discovery: Instant::now(),
            stdout_log: spec.stdout_log.clone(),
            stderr_log: spec.stderr_log.clone(),
        };
        match process::open_marker_fifo(&fifo) {
            Ok(file) => {
                let events = tx.clone();
                let ranks = l.pid_ranks.clone();
                let _ = std::thread::Builder::new()
                    .name("markers-fifo".into())
                    .spawn(move || process::read_tagged_markers(file, offset..offset + world, ranks, events));
            }
            Err(e) => {
                l.launch_error = Some(format!("cannot create the marker FIFO `{}`: {e}", fifo.display()))
            }
        }
        if l.launch_error.is_none() {
            match process::spawn_rank(&spec, tx.clone()) {
                Ok(p) => l.process = Some(p),
                Err(e) => l.launch_error = Some(launch_error_text(&argv, &e)),
            }
        }
        let (watched, exits, stop) = (l.watched.clone(), l.exits.clone(), l.stop.clone());
        let _ = std::thread::Builder::new()
            .name("zombies".into())
            .spawn(move || poll_zombies(watched, exits, stop));
        launcher = Some(l);
        (0..world).map(|rank| new_slot(rank, &spec.stdout_log, &spec.stderr_log)).collect()
    } else {
        (0..world)
            .map(|rank| {
                let spec = rank_spec(plan, rank, world, master_port, &argv);
                let mut slot = new_slot(rank, &spec.stdout_log, &spec.stderr_log);
                match process::spawn_rank(&spec, tx.clone()) {
                    Ok(p) => {
                        slot.end.pid = Some(p.pid);
                        slot.process = Some(p);
                    }
                    Err(e) => {
                        slot.end.launch_error = Some(if is_external {
                            launch_error_text(&argv, &e)
                        } else {
                            format!("failed to start `{}`: {e}", spec.program.display())
                        })
                    }
                }
                slot
            })
            .collect()
    };
    drop(tx);
    progress.scenario_started(&scenario.name, world);

    let since = |at: Instant| at.duration_since(start).as_secs_f64();
    if let Some(l) = link.as_deref_mut() {
        l.event(LocalEvent::Started {
            at_s: since(Instant::now()),
            pids: slots.iter().map(|s| s.end.pid).collect(),
        });
    }
    let (mut ended_told, mut remote_failed) = (vec![false; slots.len()], false);
    let hang_after = Duration::from_secs_f64(scenario.limits.hang_after_s);
    let timeout = Duration::from_secs_f64(scenario.limits.timeout_s);
    let mut stack_deadline: Option<Instant> = None;
    let mut term_sent: Option<Instant> = None;
    let mut kill_sent = false;
    let mut was_interrupted = false;
    let mut first_failure_at: Option<Instant> = None;
    let needs_done = !is_external || scenario.expect.completes_when == Some(CompletesWhen::Done);
    let mut ownership = owner::Run {
        run_id: plan.run_id.clone(),
        groups: slots
            .iter()
            .filter_map(|s| s.process.as_ref().map(|p| p.pid))
            .chain(launcher.as_ref().and_then(|l| l.process.as_ref()).map(|p| p.pid))
            .collect(),
        ranks: Vec::new(),
    };
    let signal_all = |slots: &mut [Slot], launcher: &Option<Launcher>, run: &owner::Run, signal: i32| {
        let found: Vec<(u32, u32)> = slots.iter().filter_map(|s| Some((s.end.rank, s.found?))).collect();
        for slot in slots.iter_mut().filter(|s| s.live()) {
            let others: Vec<u32> =
                found.iter().filter(|(r, _)| *r != slot.end.rank).map(|(_, p)| *p).collect();
            // A launcher's rank is torn down only by what reached it (its launcher may end it).
            if signal_slot(slot, run, &others, signal) {
                slot.end.torn_down_with = Some(Signal::from_number(signal));
            }
        }
        // The launcher's SIGKILL comes later, on its own (see LAUNCHER_TERM_GRACE).
        if signal != libc::SIGKILL {
            signal_launcher(launcher, signal);
        }
    };
    let mut launcher_kill_sent = false;

    loop {
        if let Ok(event) = rx.recv_timeout(TICK) {
            apply(&mut slots, event, &since, &ownership);
            while let Ok(event) = rx.try_recv() {
                apply(&mut slots, event, &since, &ownership);
            }
        }
        let now = Instant::now();
        for slot in slots.iter_mut().filter(|s| s.live() && s.process.is_some()) {
            if let Some(exit) = slot.process.as_ref().and_then(RankProcess::peek_exit) {
                let at = slot.exit_seen_at.unwrap_or(since(now));
                slot.end.exit = Some(exit);
                slot.end.ended_at_s = Some(at);
                slot.exited_at = Some(now);
                recorder.rank_ended(slot.end.rank, at, shm_sample());
            }
        }
        if let Some(l) = launcher.as_mut() {
            if l.live()
                && let Some(exit) = l.process.as_ref().and_then(RankProcess::peek_exit)
            {
                l.exit = Some(exit);
                l.exited_at = Some(now);
            }
            // Every tick while a rank is missing; then now and then while a weak identification
            // (spawn order) may still be confirmed or corrected by the markers or the port.
            let weak = slots.iter().any(|s| {
                s.end.identified_by.is_some_and(|b| b.strength() < IdentifiedBy::Markers.strength())
            });
            let missing = slots.iter().any(|s| s.found.is_none());
            if l.live() && (missing || (weak && now >= l.next_discovery)) {
                discover(l, &mut slots, &mut ownership, &plan.run_id, master_port, offset);
                l.next_discovery = now + SAMPLE_INTERVAL;
            }
            let exits = l.exits.lock().map(|e| e.clone()).unwrap_or_default();
            let launcher_pid = l.process.as_ref().map(|p| p.pid);
            let launcher_exit = l.exit.map(|e| (e, l.exited_at.unwrap_or(now)));
            for slot in slots.iter_mut().filter(|s| s.found.is_some() && !s.found_gone) {
                let pid = slot.found.unwrap_or(0);
                // The launcher as a rank (Lightning's rank 0) is our own child: its exit is ours.
                let seen = if Some(pid) == launcher_pid {
                    launcher_exit
                } else {
                    exits.get(&pid).copied().or_else(|| external::zombie_exit(pid).map(|exit| (exit, now)))
                };
                if Some(pid) == launcher_pid && seen.is_none() {
                    continue;
                }
                if seen.is_some() || !external::alive(pid) {
                    let at = seen.map_or(now, |(_, at)| at);
                    slot.found_gone = true;
                    slot.end.exit = seen.map(|(exit, _)| exit);
                    slot.end.exit_source = Some(match (seen.is_some(), Some(pid) == launcher_pid) {
                        (true, true) => ExitSource::Launcher,
                        (true, false) => ExitSource::Procfs,
                        _ => ExitSource::Unknown,
                    });
                    slot.end.ended_at_s = Some(since(at));
                    slot.exited_at = Some(now);
                    recorder.rank_ended(slot.end.rank, since(at), shm_sample());
                }
            }
        }
        if now >= next_sample {
            let procs = sample_processes(&slots);
            oom.saw(&procs);
            recorder.record(since(now), &procs, shm_sample());
            next_sample = now + SAMPLE_INTERVAL;
        }
        gpu.tick(now, since(now));
        if first_failure_at.is_none() && slots.iter().any(|s| failed_on_its_own(s, needs_done)) {
            first_failure_at = Some(now);
        }
        let states: Vec<&RankState> = slots.iter().map(|s| &s.end.state).collect();
        progress.update(&scenario.name, start.elapsed(), scenario.train.steps, &states);
        if let Some(l) = link.as_deref_mut() {
            let pids: Vec<Option<u32>> = slots.iter().map(|s| s.end.pid.filter(|_| s.live())).collect();
            l.event(LocalEvent::Tick { at_s: since(now), states: &states, pids: &pids });
            for s in slots.iter().filter(|s| s.end.exit.is_some() || s.end.launch_error.is_some()) {
                if !std::mem::replace(&mut ended_told[s.end.rank as usize], true) {
                    let how = s.end.exit.map_or_else(|| "failed to start".into(), describe_exit);
                    let (at_s, failed) =
                        (s.end.ended_at_s.unwrap_or(since(now)), failed_on_its_own(s, needs_done));
                    l.event(LocalEvent::RankEnded { rank: s.end.rank, at_s, failed, how });
                }
            }
        }
        let launcher_done = launcher.as_ref().is_none_or(|l| !l.live());
        if launcher_done && slots.iter().all(Slot::finished) {
            break;
        }

        if interrupted.load(Ordering::SeqCst) && !was_interrupted {
            // Ctrl-C or SIGTERM: an orderly stop that keeps what the scenario had. Ranks are asked
            // for their stacks first (the run a user interrupts is often the one that hangs),
            // then SIGTERM, then SIGKILL, each with a short wait.
            was_interrupted = true;
            if stack_deadline.is_none() && term_sent.is_none() {
                stack_deadline = Some(request_stacks_on_interrupt(&mut slots, &ownership, is_external));
            }
            continue;
        }
        // A failure on another node: look before kill, as on an interrupt.
        if !remote_failed
            && let Some(l) = link.as_deref_mut()
            && l.remote_failure().is_some()
        {
            remote_failed = true;
            if stack_deadline.is_none() && term_sent.is_none() {
                let asked = request_stacks_on_interrupt(&mut slots, &ownership, is_external) > now;
                stack_deadline = Some(if asked { now + REMOTE_DUMP_WAIT } else { now });
                let ranks = slots.iter().filter(|s| s.dump_requested).map(|s| s.end.rank).collect();
                l.event(LocalEvent::StacksRequested { at_s: since(now), ranks });
            }
            continue;
        }

        if stack_deadline.is_none() && term_sent.is_none() {
            // Hang: a live rank silent for `hang_after_s`. Silence counts from the spawn until
            // the first marker, so a rank stuck before it reports anything is caught too. An
            // external program may send no markers: its output counts as a sign of life too.
            let silence = |slot: &Slot| {
                let last = slot.end.state.last_marker_at.unwrap_or(0.0);
                let last = if is_external { last.max(slot.end.last_output_at.unwrap_or(0.0)) } else { last };
                since(now) - last
            };
            let limit = hang_after.as_secs_f64();
            let mut stuck = slots.iter().any(|s| s.live() && silence(s) >= limit);
            if launcher_style && !stuck && slots.iter().all(|s| s.found.is_none()) {
                // Nothing found: the launcher (or what runs below it unidentified) may be what
                // hangs, silent as every rank's output is the launcher's.
                stuck =
                    launcher.as_ref().is_some_and(|l| l.live()) && slots.iter().all(|s| silence(s) >= limit);
                if stuck {
                    for slot in slots.iter_mut() {
                        slot.end.intervention = Some(Intervention::Hung { silence_s: silence(slot) });
                    }
                }
            }
            if stuck && let Some(l) = link.as_deref_mut() {
                l.event(LocalEvent::Hung {
                    at_s: since(now),
                    ranks: slots.iter().filter(|s| s.live()).map(|s| s.end.rank).collect(),
                });
            }
            if stuck {
                // Ranks get stuck together (one waits for another in a collective) but cross the
                // limit at different moments: once one is hung, every rank silent for half the
                // limit is stuck as well. Ranks still reporting are torn down as collateral.
                for slot in slots.iter_mut().filter(|s| s.live()) {
                    let quiet = silence(slot);
                    if quiet >= limit / 2.0 {
                        slot.end.intervention = Some(Intervention::Hung { silence_s: quiet });
                    }
                }
            }
            if !stuck && now.duration_since(start) >= timeout {
                stuck = true;
                // A rank whose process was never identified runs, as far as anyone knows, as long
                // as its launcher does.
                for slot in slots.iter_mut().filter(|s| s.live() || (launcher_style && s.found.is_none())) {
                    slot.end.intervention = Some(Intervention::TimedOut);
                }
            }
            // A rank failed and the grace for the others is over: dump whoever is left (the
            // stacks show where a collateral rank was waiting), then tear down.
            let grace_over = first_failure_at.is_some_and(|t| now.duration_since(t) >= COLLATERAL_GRACE);
            if stuck || grace_over {
                // The launcher can be a rank itself (Lightning's rank 0): the other ranks in its
                // process group are not its workers.
                let found: Vec<(u32, u32)> =
                    slots.iter().filter_map(|s| Some((s.end.rank, s.found?))).collect();
                for slot in
                    slots.iter_mut().filter(|s| s.live() && (grace_over || s.end.intervention.is_some()))
                {
                    let other_ranks: Vec<u32> =
                        found.iter().filter(|(r, _)| *r != slot.end.rank).map(|(_, p)| *p).collect();
                    let members = slot_members(slot, &other_ranks);
                    if is_external {
                        // A foreign program has no handler for our stack-dump signal (SIGUSR1
                        // would kill it): look from outside instead.
                        let rank_pid = slot.end.pid;
                        slot.end.dumps = members
                            .iter()
                            .map(|&pid| {
                                let role = if Some(pid) == rank_pid {
                                    ProcessRole::Rank
                                } else {
                                    ProcessRole::Child
                                };
                                external::py_spy_dump(py_spy.as_deref(), pid, slot.end.rank, role)
                            })
                            .collect();
                    } else if slot.process.is_some() {
                        slot.dumps_requested = request_stacks(&members, &ownership);
                    }
                    slot.dump_requested = true;
                }
                stack_deadline = Some(if is_external { now } else { now + STACK_DUMP_WAIT });
            }
        }

        if let Some(deadline) = stack_deadline
            && term_sent.is_none()
        {
            let answered = slots
                .iter()
                .filter(|s| s.live() && s.dump_requested)
                .all(|s| s.end.state.stacks_complete && s.end.state.stack_ends >= s.dumps_requested);
            if answered || now >= deadline {
                signal_all(&mut slots, &launcher, &ownership, libc::SIGTERM);
                term_sent = Some(now);
                if let Some(l) = link.as_deref_mut() {
                    l.event(LocalEvent::TearingDown { at_s: since(now), stacks_answered: answered });
                }
            }
        }
        if let Some(sent) = term_sent
            && !kill_sent
            && now.duration_since(sent) >= if was_interrupted { INTERRUPT_TERM_GRACE } else { TERM_GRACE }
        {
            signal_all(&mut slots, &launcher, &ownership, libc::SIGKILL);
            kill_sent = true;
        }
        if let Some(sent) = term_sent
            && !launcher_kill_sent
            && now.duration_since(sent)
                >= if was_interrupted { LAUNCHER_INTERRUPT_TERM_GRACE } else { LAUNCHER_TERM_GRACE }
        {
            signal_launcher(&launcher, libc::SIGKILL);
            launcher_kill_sent = true;
        }
    }
    progress.scenario_finished();
    let states: Vec<&RankState> = slots.iter().map(|s| &s.end.state).collect();
    let pids: Vec<Option<u32>> = slots.iter().map(|s| s.end.pid).collect();
    let memory = recorder.finish(&states, &pids);
    let gpu = gpu.finish(&states, &pids);

    let pattern_matched = std::cell::Cell::new(false);
    let mut launcher_end = None;
    if let Some(mut l) = launcher.take() {
        l.stop.store(true, Ordering::Relaxed);
        let (exit, stdout, stderr) = match l.process.take() {
            Some(p) => {
                let pid = p.pid;
                let (exit, stdout, stderr, _) = p.reap();
                (Some((pid, l.exit.unwrap_or(exit))), stdout, stderr)
            }
            None => (None, Default::default(), Default::default()),
        };
        pattern_matched.set(stdout.matched);
        let mut lines = stderr.last_lines(400);
        lines.extend(stdout.last_lines(100));
        let failures = external::torchrun_failures(&lines);
        for slot in &mut slots {
            slot.end.quotes = quotes::program_quotes(&quotes::rank_lines(&lines, slot.end.rank + offset));
        }
        let launcher_name = argv.first().cloned().unwrap_or_default();
        for slot in &mut slots {
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
                _ => {}
            }
        }
        confirm_by_markers(&l, &mut slots);
        settle_unidentified(&mut slots, &l, exit, &launcher_name, start, offset);
        let _ = std::fs::remove_file(&l.fifo);
        launcher_end = Some(LauncherEnd {
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
                .filter(|u| !slots.iter().any(|s| s.found == Some(u.pid)))
                .count() as u32,
            quotes: quotes::program_quotes(&lines),
            log_tail: if stderr.tail.trim().is_empty() {
                stdout.last_lines(40)
            } else {
                stderr.last_lines(40)
            },
        });
    }
    let mut processes = kill_leftover_processes(&slots, &ownership);
    processes.extend(kill_cgroup_leftovers(plan.cgroup, &slots));

    let tail_lines = if is_external { 400 } else { 40 };
    let mut ends: Vec<RankEnd> = slots
        .into_iter()
        .map(|mut slot| {
            if let Some(process) = slot.process.take() {
                let (exit, stdout, stderr, _leftovers) = process.reap();
                slot.end.exit.get_or_insert(exit);
                slot.end
                    .log_errors
                    .extend([&stdout, &stderr].into_iter().filter_map(|c| c.write_error.clone()));
                pattern_matched.set(pattern_matched.get() || stdout.matched);
                if is_external {
                    let mut lines = stderr.last_lines(tail_lines);
                    lines.extend(stdout.last_lines(100));
                    slot.end.quotes = quotes::program_quotes(&lines);
                }
                slot.end.stdout_tail = stdout.last_lines(tail_lines);
                slot.end.stderr_tail = stderr.last_lines(tail_lines);
            }
            slot.end
        })
        .collect();
    if is_external {
        for end in &mut ends {
            end.completed = Some(match &scenario.expect.completes_when {
                None => true,
                Some(CompletesWhen::Done) => end.state.done,
                Some(CompletesWhen::Stdout(_)) => pattern_matched.get(),
            });
        }
    }
    let external_run = is_external.then(|| ExternalRun {
        argv: argv.clone(),
        style: if launcher_style { ExternalStyle::Launcher } else { ExternalStyle::PerRank },
        style_chosen,
        markers_seen: ends.iter().any(|e| e.state.markers > 0),
        completion: match &scenario.expect.completes_when {
            None => "exit status".to_string(),
            Some(CompletesWhen::Done) => "done marker".to_string(),
            Some(CompletesWhen::Stdout(p)) => format!("stdout matches `{p}`"),
        },
        launcher: launcher_end,
        py_spy: py_spy.as_ref().map(|p| p.display().to_string()),
    });
    let mut shm = swept;
    shm.extend(remove_leftover_segments(&shm_dir, &shm_before, &plan.run_id, plan.private_shm.is_some()));
    let (cgroup, oom_kills) = oom.finish(plan.cgroup, &ends);
    Supervised {
        cgroup,
        oom_kills,
        ends,
        wall_s: start.elapsed().as_secs_f64(),
        interrupted: was_interrupted,
        memory,
        leftovers: Leftovers { shm, processes },
        external: external_run,
        gpu,
    }
}

/// Asks every process in `members` that is this run's and has a handler for the stack-dump
/// signal for a stack dump; returns how many were asked. Every process of a rank's group: a rank
/// often waits on a stuck worker. (One without the handler yet, a rank still starting or a
/// `spawn` worker between exec and its set-up, would be killed by the signal instead.)
fn request_stacks(members: &[u32], run: &owner::Run) -> u32 {
    members
        .iter()
        .filter(|&&pid| catches(pid, STACK_DUMP_SIGNAL))
        .filter_map(|&pid| owner::identify(pid))
        .filter(|&who| run.signal(who, STACK_DUMP_SIGNAL).is_ok())
        .count() as u32
}

/// Whether `signal` cannot kill `pid`: it has a handler for it or blocks it (the trainer blocks
/// the stack-dump signal in every thread and takes it with `sigwait`), from `SigCgt` and `SigBlk`
/// of `/proc/PID/status`.
fn catches(pid: u32, signal: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
        let mask = |field: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
                .unwrap_or(0)
        };
        (mask("SigCgt:") | mask("SigBlk:")) & (1 << (signal - 1)) != 0
    })
}

/// On the user's interrupt: asks every live rank of the built-in trainer for its stacks (an
/// external program has no handler for the signal, and py-spy is too slow for an interrupt), so
/// that the result shows where each one was, stuck or not. Returns until when to wait for the
/// answers.
fn request_stacks_on_interrupt(slots: &mut [Slot], run: &owner::Run, is_external: bool) -> Instant {
    let mut asked = false;
    if !is_external {
        for slot in slots.iter_mut().filter(|s| s.live() && s.process.is_some()) {
            slot.dumps_requested = request_stacks(&slot_members(slot, &[]), run);
            slot.dump_requested = slot.dumps_requested > 0;
            asked |= slot.dump_requested;
        }
    }
    Instant::now() + if asked { INTERRUPT_DUMP_WAIT } else { Duration::ZERO }
}

/// `exited with status 1`, `was killed by SIGKILL`.
fn describe_exit(exit: process::Exit) -> String {
    match exit {
        process::Exit::Code(c) => format!("exited with status {c}"),
        process::Exit::Signal { signal, .. } => format!("was killed by {}", signal_name(signal)),
    }
}

/// The ranks of a launcher whose process no signal identified, once the launcher has ended:
/// - the launcher exited 0: each passes on that status (a clean run is never a failed launch);
/// - it could not start, or ended with no process below it that looked like a rank: the rank was
///   never started as far as anyone can tell (`launch_failed`, with the launcher's exit);
/// - else the processes below it that looked like ranks are judged as processes: those that
///   failed (a signal, a non-zero status) take the unidentified ranks' places in the order the
///   processes started, each with its own exit (`rank number unknown`), so first failure and
///   collateral come from what they did; the other ranks take the launcher's status.
fn settle_unidentified(
    slots: &mut [Slot],
    l: &Launcher,
    exit: Option<(u32, process::Exit)>,
    launcher_name: &str,
    start: Instant,
    offset: u32,
) {
    let found: Vec<u32> = slots.iter().filter_map(|s| s.found).collect();
    let looked: Vec<Identity> = l.unidentified.iter().copied().filter(|u| !found.contains(&u.pid)).collect();
    let unknown = match looked.len() {
        0 => String::new(),
        1 => "; 1 process below the launcher looks like a rank; its rank number is unknown".to_string(),
        n => format!("; {n} processes below the launcher look like ranks; their rank numbers are unknown"),
    };
    let exits = l.exits.lock().map(|e| e.clone()).unwrap_or_default();
    let mut failed = looked
        .iter()
        .filter_map(|u| exits.get(&u.pid).map(|&(e, at)| (u.pid, e, at)))
        .filter(|(_, e, _)| *e != process::Exit::Code(0));
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

/// The rank a process belongs to: by being below a launcher's rank (`below`, from
/// [`found_members`]), by process group (a rank leads its own), or because its rank reported it
/// as a worker.
fn rank_of(slots: &[Slot], below: &BTreeMap<u32, u32>, p: &memory::ProcStat) -> Option<u32> {
    below
        .get(&p.pid)
        .copied()
        .or_else(|| {
            slots
                .iter()
                .find(|s| (s.process.is_some() || s.found.is_some()) && s.end.pid == Some(p.pgid))
                .map(|s| s.end.rank)
        })
        .or_else(|| {
            slots.iter().find(|s| s.verified_workers.iter().any(|w| w.pid == p.pid)).map(|s| s.end.rank)
        })
}

/// Every process below a launcher's found rank (the rank itself included), pid → rank.
fn found_members(slots: &[Slot]) -> BTreeMap<u32, u32> {
    let mut below = BTreeMap::new();
    for slot in slots.iter().filter(|s| s.found.is_some() && !s.found_gone) {
        for pid in slot_members(slot, &other_ranks(slots, slot.end.rank)) {
            below.insert(pid, slot.end.rank);
        }
    }
    below
}

/// Memory of every live process of every rank.
fn sample_processes(slots: &[Slot]) -> Vec<ProcSample> {
    let below = found_members(slots);
    memory::processes()
        .into_iter()
        .filter(|p| !p.zombie())
        .filter_map(|p| {
            let rank = rank_of(slots, &below, &p)?;
            let mem = memory::read_smaps_rollup(p.pid)?;
            Some(ProcSample { pid: p.pid, rank, command: p.command, mem })
        })
        .collect()
}

/// Processes of the run still alive once every rank has ended (a worker that outlived its
/// rank, a child that left the process group but kept the run id): killed, and reported. Only
/// processes that pass [`owner::Run::check`] are candidates; what markers said plays no part.
fn kill_leftover_processes(slots: &[Slot], run: &owner::Run) -> Vec<LeftoverProcess> {
    let me = std::process::id();
    let below = found_members(slots);
    let mut found: Vec<(LeftoverProcess, Identity)> = memory::processes()
        .into_iter()
        .filter(|p| !p.zombie() && p.pid != me)
        .filter_map(|p| {
            let who = owner::identify(p.pid)?;
            run.check(who).ok()?;
            let rank = rank_of(slots, &below, &p);
            let worker = slots
                .iter()
                .flat_map(|s| s.end.state.workers.iter())
                .find(|w| w.pid == p.pid && slots.iter().any(|s| s.verified_workers.contains(&who)))
                .map(|w| w.id);
            let leftover = LeftoverProcess {
                pid: p.pid,
                command: p.command,
                rank,
                worker,
                killed: false,
                earlier_run: false,
            };
            Some((leftover, who))
        })
        .collect();
    for (_, who) in &found {
        let _ = run.signal(*who, libc::SIGKILL);
    }
    let deadline = Instant::now() + LEFTOVER_KILL_WAIT;
    loop {
        for (p, who) in &mut found {
            p.killed = owner::identify(who.pid) != Some(*who);
        }
        if found.iter().all(|(p, _)| p.killed) || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(TICK);
    }
    found.into_iter().map(|(p, _)| p).collect()
}

/// Teardown through the scenario's cgroup: whatever is still in it once every rank has ended
/// and the process-group and run-id search has run (a process that left its session and
/// process group and dropped the run id from its environment) is killed and reported. Only
/// members of the scenario's own cgroup are signalled (see [`ScenarioCgroup::kill_all`]).
fn kill_cgroup_leftovers(cgroup: Option<&ScenarioCgroup>, slots: &[Slot]) -> Vec<LeftoverProcess> {
    let Some(cgroup) = cgroup else {
        return Vec::new();
    };
    let table = memory::processes();
    let below = found_members(slots);
    let left: Vec<LeftoverProcess> = cgroup
        .members()
        .into_iter()
        .filter_map(|pid| table.iter().find(|p| p.pid == pid && !p.zombie()))
        .map(|p| LeftoverProcess {
            pid: p.pid,
            command: p.command.clone(),
            rank: rank_of(slots, &below, p),
            worker: None,
            killed: false,
            earlier_run: false,
        })
        .collect();
    if left.is_empty() {
        return left;
    }
    let signalled = cgroup.kill_all();
    let deadline = Instant::now() + LEFTOVER_KILL_WAIT;
    while Instant::now() < deadline && left.iter().any(|p| cgroup.members().contains(&p.pid)) {
        std::thread::sleep(TICK);
    }
    let still = cgroup.members();
    left.into_iter()
        .map(|p| LeftoverProcess { killed: signalled.contains(&p.pid) && !still.contains(&p.pid), ..p })
        .collect()
}

/// Removes the machine's `/dev/shm` segments of ups-doctor runs whose harness died before it
/// could clean up (killed with SIGKILL, say), so that none outlives the next run.
fn sweep_orphaned_segments() -> Vec<LeftoverSegment> {
    let dir = std::path::Path::new("/dev/shm");
    let all = shm::segments(dir);
    let alive = |pid: u32| std::path::Path::new(&format!("/proc/{pid}")).exists();
    orphaned_segments(&all, alive)
        .into_iter()
        .map(|seg| {
            let error = shm::remove(dir, &seg.name).err().map(|e| e.to_string());
            LeftoverSegment {
                name: seg.name.clone(),
                size_bytes: seg.size,
                allocated_bytes: seg.allocated,
                ours: false,
                earlier_run: true,
                removed: error.is_none(),
                error,
            }
        })
        .collect()
}

/// Files created in `/dev/shm` during the run: this run's own are removed, others reported.
fn remove_leftover_segments(
    dir: &std::path::Path,
    before: &[shm::Segment],
    run_id: &str,
    private: bool,
) -> Vec<LeftoverSegment> {
    new_segments(before, &shm::segments(dir), run_id)
        .into_iter()
        .map(|(seg, ours)| {
            let (removed, error) = if ours {
                match shm::remove(dir, &seg.name) {
                    Ok(()) => (true, None),
                    Err(e) => (false, Some(e.to_string())),
                }
            } else {
                // A private /dev/shm is discarded with the run, whoever wrote into it.
                (private, None)
            };
            LeftoverSegment {
                name: seg.name,
                size_bytes: seg.size,
                allocated_bytes: seg.allocated,
                ours,
                earlier_run: false,
                removed,
                error,
            }
        })
        .collect()
}

fn apply(slots: &mut [Slot], event: Event, since: &impl Fn(Instant) -> f64, run: &owner::Run) {
    match event {
        Event::Marker { rank, at, marker } => {
            if let Some(slot) = slots.get_mut(rank as usize) {
                // A worker marker is a claim on a process: checked now, while the worker runs.
                if let crate::protocol::Marker::Worker { pid, .. } = &marker {
                    match run.claim(*pid) {
                        Ok(Some(who)) => slot.verified_workers.push(who),
                        Ok(None) => {}
                        Err(_) => {
                            slot.end.state.apply_bad(since(at));
                            slot.end.state.foreign_pids.push(*pid);
                            return;
                        }
                    }
                }
                slot.end.state.apply(since(at), marker);
            }
        }
        Event::BadMarker { rank, at } => {
            if let Some(slot) = slots.get_mut(rank as usize) {
                slot.end.state.apply_bad(since(at));
            }
        }
        Event::MarkersClosed { rank } => {
            if let Some(slot) = slots.get_mut(rank as usize) {
                slot.markers_closed = true;
            }
        }
        Event::Exited { rank, at } => {
            if let Some(slot) = slots.get_mut(rank as usize) {
                slot.exit_seen_at.get_or_insert(since(at));
            }
        }
        // A launcher's output (its rank number is past the ranks) is every rank's: they share it.
        Event::Output { rank, at } => match slots.get_mut(rank as usize) {
            Some(slot) => slot.end.last_output_at = Some(since(at)),
            None => slots.iter_mut().for_each(|slot| slot.end.last_output_at = Some(since(at))),
        },
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

/// A port that was free a moment ago, for the rendezvous store (rank 0 binds it). The race with
/// other programs is the same one torchrun's `--master-port 0` accepts.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_or(29500, |a| a.port())
}

/// How one rank is started: `ups-doctor train` with the resolved scenario, or a copy of the
/// external command (`argv`, already rendered).
fn rank_spec(plan: &ScenarioPlan, rank: u32, world: u32, master_port: u16, argv: &[String]) -> RankSpec {
    let mut env: Vec<(String, String)> = Vec::new();
    // Like torchrun: several ranks on one machine each get one intra-op thread unless the user
    // chose otherwise; OpenMP's spinning barriers collapse when ranks oversubscribe the cores.
    if world > 1 && std::env::var_os("OMP_NUM_THREADS").is_none() {
        env.push(("OMP_NUM_THREADS".into(), "1".into()));
    }
    let external = !argv.is_empty();
    let (program, args) = if external {
        env.extend(external::python_env());
        (PathBuf::from(&argv[0]), argv[1..].iter().map(OsString::from).collect())
    } else {
        (plan.program.clone(), vec![OsString::from("train"), plan.resolved_file.clone().into_os_string()])
    };
    let (global, all, node, master) = plan.node.map_or((rank, world, 0, "127.0.0.1".into()), |n| {
        (n.global_rank(rank), n.world(), n.node, n.master_addr.clone())
    });
    RankSpec {
        rank,
        program,
        args,
        env: vec![
            ("RANK".into(), global.to_string()),
            ("LOCAL_RANK".into(), rank.to_string()),
            ("GROUP_RANK".into(), node.to_string()),
            ("WORLD_SIZE".into(), all.to_string()),
            ("LOCAL_WORLD_SIZE".into(), world.to_string()),
            ("MASTER_ADDR".into(), master),
            ("MASTER_PORT".into(), master_port.to_string()),
            (RUN_ID_ENV.into(), plan.run_id.clone()),
        ]
        .into_iter()
        .chain(env)
        .collect(),
        stdout_log: plan.log_dir.join(format!("rank{rank}.stdout.log")),
        stderr_log: plan.log_dir.join(format!("rank{rank}.stderr.log")),
        mount_ns: mount_ns(plan),
        marker_pipe: true,
        env_remove: Vec::new(),
        report_output: external,
        stdout_pattern: if external { stdout_pattern(plan.scenario) } else { None },
        cgroup: plan.cgroup.map(|c| c.procs_file().to_owned()),
    }
}

/// How a launcher-style command (torchrun) is started: once, without a rank's environment; its
/// ranks find the marker FIFO through `UPS_DOCTOR_MARKER_PATH`.
fn launcher_spec(plan: &ScenarioPlan, argv: &[String], master_port: u16) -> RankSpec {
    let mut env = vec![
        (RUN_ID_ENV.to_string(), plan.run_id.clone()),
        (MARKER_PATH_ENV.to_string(), plan.log_dir.join("markers.fifo").display().to_string()),
    ];
    // torchrun's `--master-port` defaults to 29500, which two runs at once (or anything else on
    // the machine) would share: a free port, through the variable torchrun reads its default
    // from, unless the user chose one.
    if std::env::var_os("PET_MASTER_PORT").is_none() {
        env.push(("PET_MASTER_PORT".to_string(), master_port.to_string()));
    }
    env.extend(external::python_env());
    RankSpec {
        rank: plan.scenario.launch.world_size,
        program: PathBuf::from(argv.first().map_or("", String::as_str)),
        args: argv.iter().skip(1).map(OsString::from).collect(),
        env,
        stdout_log: plan.log_dir.join("launcher.stdout.log"),
        stderr_log: plan.log_dir.join("launcher.stderr.log"),
        mount_ns: mount_ns(plan),
        marker_pipe: false,
        env_remove: external::RANK_ENV.iter().map(|v| v.to_string()).collect(),
        report_output: true,
        stdout_pattern: stdout_pattern(plan.scenario),
        cgroup: plan.cgroup.map(|c| c.procs_file().to_owned()),
    }
}

fn stdout_pattern(scenario: &Scenario) -> Option<regex::Regex> {
    match &scenario.expect.completes_when {
        Some(CompletesWhen::Stdout(p)) => regex::Regex::new(p).ok(),
        _ => None,
    }
}

/// The scenario's private `/dev/shm` namespace to join, with the directory to return to.
fn mount_ns(plan: &ScenarioPlan) -> Option<(std::os::fd::RawFd, std::ffi::CString)> {
    plan.private_shm.map(|shm| {
        use std::os::unix::ffi::OsStrExt;
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        (shm.ns_fd(), std::ffi::CString::new(cwd.as_os_str().as_bytes()).unwrap_or_default())
    })
}

fn file_name(path: &std::path::Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}
