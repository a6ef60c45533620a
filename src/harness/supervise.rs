//! The supervising loop for one scenario: start the ranks, fold their markers into state, notice
//! exits, hangs and overruns, ask stuck ranks for stack dumps, then tear down with escalation
//! (SIGTERM to the process group, then SIGKILL). Returns what was observed; deciding what it
//! means is [`super::classify`]'s job.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::probe::nvml::{Nvml, Sampler};
use crate::probe::{memory, shm};
use crate::protocol::{RUN_ID_ENV, STACK_DUMP_SIGNAL};
use crate::scenario::Scenario;

use super::classify::{Intervention, RankEnd};
use super::gpu::{GpuRecorder, GpuReport, GpuSample};
use super::memory::{MemoryRecorder, ProcSample, ShmSample, new_segments, orphaned_segments, ours_bytes};
use super::namespace::PrivateShm;
use super::process::{self, Event, RankProcess, RankSpec};
use super::progress::Progress;
use super::result::{LeftoverProcess, LeftoverSegment, Leftovers, MemoryReport};
use super::state::RankState;

/// How long stuck ranks get to answer a stack-dump request.
const STACK_DUMP_WAIT: Duration = Duration::from_secs(5);
/// How long a rank gets between SIGTERM and SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(3);
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
    pub gpu: Option<GpuReport>,
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
}

impl Slot {
    fn live(&self) -> bool {
        self.process.is_some() && self.end.exit.is_none()
    }

    fn finished(&self) -> bool {
        match (&self.process, self.exited_at) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(_), Some(at)) => self.markers_closed || at.elapsed() >= PIPE_DRAIN_WAIT,
        }
    }
}

/// Runs the scenario's ranks to their end.
pub fn supervise(plan: &ScenarioPlan, progress: &mut Progress, interrupted: &AtomicBool) -> Supervised {
    let scenario = plan.scenario;
    let world = scenario.launch.world_size;
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
    let (tx, rx) = mpsc::channel();
    let master_port = free_port();
    let mut slots: Vec<Slot> = (0..world)
        .map(|rank| {
            let spec = rank_spec(plan, rank, world, master_port);
            let mut end = RankEnd {
                rank,
                stdout_log: file_name(&spec.stdout_log),
                stderr_log: file_name(&spec.stderr_log),
                ..Default::default()
            };
            let process = match process::spawn_rank(&spec, tx.clone()) {
                Ok(p) => {
                    end.pid = Some(p.pid);
                    Some(p)
                }
                Err(e) => {
                    end.launch_error = Some(format!("failed to start `{}`: {e}", spec.program.display()));
                    None
                }
            };
            Slot {
                end,
                process,
                exited_at: None,
                markers_closed: false,
                dump_requested: false,
                dumps_requested: 0,
            }
        })
        .collect();
    drop(tx);
    progress.scenario_started(&scenario.name, world);

    let since = |at: Instant| at.duration_since(start).as_secs_f64();
    let hang_after = Duration::from_secs_f64(scenario.limits.hang_after_s);
    let timeout = Duration::from_secs_f64(scenario.limits.timeout_s);
    let mut stack_deadline: Option<Instant> = None;
    let mut term_sent: Option<Instant> = None;
    let mut kill_sent = false;
    let mut was_interrupted = false;
    let mut first_failure_at: Option<Instant> = None;

    loop {
        if let Ok(event) = rx.recv_timeout(TICK) {
            apply(&mut slots, event, &since);
            while let Ok(event) = rx.try_recv() {
                apply(&mut slots, event, &since);
            }
        }
        let now = Instant::now();
        for slot in slots.iter_mut().filter(|s| s.live()) {
            if let Some(exit) = slot.process.as_ref().and_then(RankProcess::peek_exit) {
                slot.end.exit = Some(exit);
                slot.end.ended_at_s = Some(since(now));
                slot.exited_at = Some(now);
                recorder.rank_ended(slot.end.rank, since(now), shm_sample());
            }
        }
        if now >= next_sample {
            recorder.record(since(now), &sample_processes(&slots), shm_sample());
            next_sample = now + SAMPLE_INTERVAL;
        }
        gpu.tick(now, since(now));
        if first_failure_at.is_none() && slots.iter().any(failed_on_its_own) {
            first_failure_at = Some(now);
        }
        let states: Vec<&RankState> = slots.iter().map(|s| &s.end.state).collect();
        progress.update(&scenario.name, start.elapsed(), scenario.train.steps, &states);
        if slots.iter().all(Slot::finished) {
            break;
        }

        if interrupted.load(Ordering::SeqCst) && !kill_sent {
            // Ctrl-C: no dumps, no grace; the user wants their terminal back.
            was_interrupted = true;
            for slot in slots.iter_mut().filter(|s| s.live()) {
                slot.process.as_ref().map(|p| p.signal_group(libc::SIGKILL));
                slot.end.torn_down_with = Some("SIGKILL".into());
            }
            kill_sent = true;
            continue;
        }

        if stack_deadline.is_none() && term_sent.is_none() {
            // Hang: a live rank silent for `hang_after_s`. Silence counts from the spawn until
            // the first marker, so a rank stuck before it reports anything is caught too.
            let silence = |slot: &Slot| since(now) - slot.end.state.last_marker_at.unwrap_or(0.0);
            let limit = hang_after.as_secs_f64();
            let mut stuck = slots.iter().any(|s| s.live() && silence(s) >= limit);
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
                for slot in slots.iter_mut().filter(|s| s.live()) {
                    slot.end.intervention = Some(Intervention::TimedOut);
                }
            }
            // A rank failed and the grace for the others is over: dump whoever is left (the
            // stacks show where a collateral rank was waiting), then tear down.
            let grace_over = first_failure_at.is_some_and(|t| now.duration_since(t) >= COLLATERAL_GRACE);
            if stuck || grace_over {
                for slot in
                    slots.iter_mut().filter(|s| s.live() && (grace_over || s.end.intervention.is_some()))
                {
                    // Every process of the rank's group: a rank often waits on a stuck worker.
                    if let Some(p) = slot.process.as_ref() {
                        let members = p.live_group_members();
                        slot.dumps_requested =
                            members.iter().filter(|&&pid| p.signal_member(pid, STACK_DUMP_SIGNAL)).count()
                                as u32;
                    }
                    slot.dump_requested = true;
                }
                stack_deadline = Some(now + STACK_DUMP_WAIT);
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
                for slot in slots.iter_mut().filter(|s| s.live()) {
                    slot.process.as_ref().map(|p| p.signal_group(libc::SIGTERM));
                    slot.end.torn_down_with = Some("SIGTERM".into());
                }
                term_sent = Some(now);
            }
        }
        if let Some(sent) = term_sent
            && !kill_sent
            && now.duration_since(sent) >= TERM_GRACE
        {
            for slot in slots.iter_mut().filter(|s| s.live()) {
                slot.process.as_ref().map(|p| p.signal_group(libc::SIGKILL));
                slot.end.torn_down_with = Some("SIGKILL".into());
            }
            kill_sent = true;
        }
    }
    progress.scenario_finished();
    let states: Vec<&RankState> = slots.iter().map(|s| &s.end.state).collect();
    let pids: Vec<Option<u32>> = slots.iter().map(|s| s.end.pid).collect();
    let memory = recorder.finish(&states, &pids);
    let gpu = gpu.finish(&states, &pids);
    let processes = kill_leftover_processes(&slots, &plan.run_id);

    let ends = slots
        .into_iter()
        .map(|mut slot| {
            if let Some(process) = slot.process.take() {
                let (exit, stdout, stderr, _leftovers) = process.reap();
                slot.end.exit.get_or_insert(exit);
                slot.end.stdout_tail = stdout.last_lines(40);
                slot.end.stderr_tail = stderr.last_lines(40);
            }
            slot.end
        })
        .collect();
    let mut shm = swept;
    shm.extend(remove_leftover_segments(&shm_dir, &shm_before, &plan.run_id, plan.private_shm.is_some()));
    Supervised {
        ends,
        wall_s: start.elapsed().as_secs_f64(),
        interrupted: was_interrupted,
        memory,
        leftovers: Leftovers { shm, processes },
        gpu,
    }
}

/// The rank a process belongs to: by process group (a rank leads its own), or because its rank
/// reported it as a worker.
fn rank_of(slots: &[Slot], p: &memory::ProcStat) -> Option<u32> {
    slots
        .iter()
        .find(|s| s.process.is_some() && s.end.pid == Some(p.pgid))
        .or_else(|| slots.iter().find(|s| s.end.state.workers.iter().any(|w| w.pid == p.pid)))
        .map(|s| s.end.rank)
}

/// Memory of every live process of every rank.
fn sample_processes(slots: &[Slot]) -> Vec<ProcSample> {
    memory::processes()
        .into_iter()
        .filter(|p| !p.zombie())
        .filter_map(|p| {
            let rank = rank_of(slots, &p)?;
            let mem = memory::read_smaps_rollup(p.pid)?;
            Some(ProcSample { pid: p.pid, rank, command: p.command, mem })
        })
        .collect()
}

/// Processes of the run still alive once every rank has ended (a worker that outlived its
/// rank, a child that left the process group but kept the run id): killed, and reported.
fn kill_leftover_processes(slots: &[Slot], run_id: &str) -> Vec<LeftoverProcess> {
    let me = std::process::id();
    let mut found: Vec<LeftoverProcess> = memory::processes()
        .into_iter()
        .filter(|p| !p.zombie() && p.pid != me)
        .filter_map(|p| {
            let rank = rank_of(slots, &p);
            if rank.is_none() && !memory::environ_has(p.pid, RUN_ID_ENV, run_id) {
                return None;
            }
            let worker =
                slots.iter().flat_map(|s| s.end.state.workers.iter()).find(|w| w.pid == p.pid).map(|w| w.id);
            Some(LeftoverProcess { pid: p.pid, command: p.command, rank, worker, killed: false })
        })
        .collect();
    for p in &found {
        // SAFETY: kill(2) on a process of this run.
        unsafe { libc::kill(p.pid as i32, libc::SIGKILL) };
    }
    let deadline = Instant::now() + LEFTOVER_KILL_WAIT;
    loop {
        let table = memory::processes();
        for p in &mut found {
            p.killed = table.iter().find(|t| t.pid == p.pid).is_none_or(memory::ProcStat::zombie);
        }
        if found.iter().all(|p| p.killed) || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(TICK);
    }
    found
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

fn apply(slots: &mut [Slot], event: Event, since: &impl Fn(Instant) -> f64) {
    match event {
        Event::Marker { rank, at, marker } => slots[rank as usize].end.state.apply(since(at), marker),
        Event::BadMarker { rank, at } => slots[rank as usize].end.state.apply_bad(since(at)),
        Event::MarkersClosed { rank } => slots[rank as usize].markers_closed = true,
    }
}

/// Whether this rank has ended by itself in a way that is not a success.
fn failed_on_its_own(slot: &Slot) -> bool {
    if slot.end.launch_error.is_some() {
        return true;
    }
    match slot.end.exit {
        Some(process::Exit::Code(0)) => !slot.end.state.done,
        Some(_) => slot.end.torn_down_with.is_none(),
        None => false,
    }
}

/// A port that was free a moment ago, for the rendezvous store (rank 0 binds it). The race with
/// other programs is the same one torchrun's `--master-port 0` accepts.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_or(29500, |a| a.port())
}

fn rank_spec(plan: &ScenarioPlan, rank: u32, world: u32, master_port: u16) -> RankSpec {
    let mut env: Vec<(String, String)> = Vec::new();
    // Like torchrun: several ranks on one machine each get one intra-op thread unless the user
    // chose otherwise; OpenMP's spinning barriers collapse when ranks oversubscribe the cores.
    if world > 1 && std::env::var_os("OMP_NUM_THREADS").is_none() {
        env.push(("OMP_NUM_THREADS".into(), "1".into()));
    }
    RankSpec {
        rank,
        program: plan.program.clone(),
        args: vec![OsString::from("train"), plan.resolved_file.clone().into_os_string()],
        env: vec![
            ("RANK".into(), rank.to_string()),
            ("LOCAL_RANK".into(), rank.to_string()),
            ("WORLD_SIZE".into(), world.to_string()),
            ("LOCAL_WORLD_SIZE".into(), world.to_string()),
            ("MASTER_ADDR".into(), "127.0.0.1".into()),
            ("MASTER_PORT".into(), master_port.to_string()),
            (RUN_ID_ENV.into(), plan.run_id.clone()),
        ]
        .into_iter()
        .chain(env)
        .collect(),
        stdout_log: plan.log_dir.join(format!("rank{rank}.stdout.log")),
        stderr_log: plan.log_dir.join(format!("rank{rank}.stderr.log")),
        mount_ns: plan.private_shm.map(|shm| {
            use std::os::unix::ffi::OsStrExt;
            let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
            (shm.ns_fd(), std::ffi::CString::new(cwd.as_os_str().as_bytes()).unwrap_or_default())
        }),
    }
}

fn file_name(path: &std::path::Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}
