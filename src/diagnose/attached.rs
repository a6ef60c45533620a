//! A job read from outside (`ups-doctor attach`), judged: each rank moving, busy or stuck over the
//! window (its [`RankView`], which `attach` builds from what it watched); ranks grouped into
//! classes by where their main thread is; the job `running`, `hung` or `failed`; and the rank the
//! others wait for, named only when the evidence separates it, through [`super::judge`], the one
//! judge. What attach knows that a run does not (nothing was signalled, the job still runs) is part
//! of its evidence here. Pure: views in, verdict out.

use super::evidence::{StackFrame, py_spy_threads};
use super::verdict::judge;
use super::{Observed, collective_of};
use crate::scenario::{OutcomeKind, Scenario};
use serde::{Deserialize, Serialize};

use crate::schema::{KernelThread, Leftovers, ProcessDump, ProcessRole, RankResult, Verdict};

/// A rank's main thread over the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Motion {
    /// Its stack changed between looks: it makes progress.
    Moving,
    /// The same stack at every look but CPU time rising: computing (or spinning) in one place.
    Busy,
    /// The same stack at every look and (almost) no CPU time: waiting.
    Stuck,
    /// No stack could be read; CPU time alone says nothing about where it is.
    Unread,
    /// It ended before or during the window.
    Gone,
}

impl Motion {
    pub fn as_str(self) -> &'static str {
        match self {
            Motion::Moving => "moving",
            Motion::Busy => "busy",
            Motion::Stuck => "stuck",
            Motion::Unread => "stack unreadable",
            Motion::Gone => "gone",
        }
    }
}

/// The job's state, as `attach` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Running,
    Hung,
    Failed,
}

impl State {
    /// The state a judged outcome stands for: passed is running, hung is hung, anything else failed.
    pub fn of(outcome: OutcomeKind) -> State {
        match outcome {
            OutcomeKind::Passed => State::Running,
            OutcomeKind::Hung => State::Hung,
            _ => State::Failed,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Hung => "hung",
            State::Failed => "failed",
        }
    }
}

/// A CPU share below this over the window is waiting, not computing.
pub const IDLE_SHARE: f64 = 0.05;

/// One rank as the window showed it. Sent between the nodes of a multi-node attach: `frames` are
/// not, they are read again from `py_spy` ([`RankView::reread`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankView {
    pub rank: u32,
    pub pid: u32,
    pub motion: Motion,
    pub cpu_s: Option<f64>,
    /// Readable looks of its stack.
    pub looks: usize,
    /// The main thread's frames at the last readable look, innermost first.
    #[serde(skip)]
    pub frames: Vec<StackFrame>,
    /// The last readable `py-spy` text, and why a look failed.
    pub py_spy: Option<String>,
    pub error: Option<String>,
    /// Each thread's kernel state at the last look.
    pub threads: Vec<KernelThread>,
}

/// How a dump taken by `attach` says when it was taken (the report reads the `attach` prefix).
pub const TAKEN: &str = "attach: read at the end of the window, without stopping the process";

impl RankView {
    /// The main thread's frames again from the last `py_spy` text, after the view came over the
    /// wire without them.
    pub fn reread(&mut self) {
        self.frames = self.py_spy.as_deref().map(|t| main_frames(t, self.pid)).unwrap_or_default();
    }

    /// Where the main thread is: `` `barrier` (torch/distributed/distributed_c10d.py:5037) ← ddp.py:48 ``.
    pub fn place(&self) -> String {
        place(&self.frames)
    }
}

/// The main thread's frames of a py-spy text: the thread whose id is the process's, else the one
/// named `MainThread`, else the first.
pub fn main_frames(text: &str, pid: u32) -> Vec<StackFrame> {
    let threads = py_spy_threads(text);
    let pick = threads
        .iter()
        .find(|(tid, _, _)| *tid == Some(pid))
        .or_else(|| threads.iter().find(|(_, name, _)| name == "MainThread"))
        .or(threads.first());
    pick.map(|(_, _, frames)| frames.clone()).unwrap_or_default()
}

/// Whether a frame is in the user's own code (not PyTorch's, not the standard library's).
fn own_code(f: &StackFrame) -> bool {
    let place = f.place.as_deref().unwrap_or_default();
    place.contains(".py")
        && !(place.starts_with("torch/")
            || place.contains("site-packages")
            || place.contains("/lib/python")
            || place.starts_with("<")
            || ["threading.py", "multiprocessing/", "selectors.py", "queue.py", "socket.py", "runpy.py"]
                .iter()
                .any(|s| place.starts_with(s)))
}

/// `` `fn` (place) ← own.py:12 ``: the innermost frame, and the innermost frame of the user's own
/// code when that is another.
pub fn place(frames: &[StackFrame]) -> String {
    // With native frames (`--native`) the innermost ones are anonymous addresses in libc, which
    // differ between processes: a rank is placed by its innermost Python frame, else its innermost
    // named one.
    let python = frames.iter().find(|f| f.place.as_deref().is_some_and(|p| p.contains(".py:")));
    let named = || frames.iter().find(|f| !f.function.starts_with("0x"));
    let Some(top) = python.or_else(named).or(frames.first()) else { return "no Python frame".to_string() };
    let at = |f: &StackFrame| match &f.place {
        Some(p) => format!("`{}` ({p})", f.function),
        None => format!("`{}`", f.function),
    };
    match frames.iter().find(|f| own_code(f)) {
        Some(own) if own != top => format!("{} ← {}", at(top), own.place.as_deref().unwrap_or(&own.function)),
        _ => at(top),
    }
}

/// Ranks grouped by where their main thread is at the end of the window, largest class first:
/// (ranks, place, motion of its ranks).
pub fn classes(views: &[RankView]) -> Vec<(Vec<u32>, String, String)> {
    let mut out: Vec<(Vec<u32>, String, String)> = Vec::new();
    for v in views.iter().filter(|v| v.motion != Motion::Gone) {
        let key = if v.frames.is_empty() { "no readable stack".to_string() } else { v.place() };
        match out.iter_mut().find(|(_, k, _)| *k == key) {
            Some((ranks, _, motions)) => {
                ranks.push(v.rank);
                if !motions.contains(v.motion.as_str()) {
                    motions.push_str(", ");
                    motions.push_str(v.motion.as_str());
                }
            }
            None => out.push((vec![v.rank], key, v.motion.as_str().to_string())),
        }
    }
    out.sort_by_key(|(ranks, _, _)| std::cmp::Reverse(ranks.len()));
    out
}

/// `ranks 0, 2` / `rank 1`.
pub fn ranks_text(ranks: &[u32]) -> String {
    let list: Vec<String> = ranks.iter().map(u32::to_string).collect();
    format!("{} {}", if ranks.len() == 1 { "rank" } else { "ranks" }, list.join(", "))
}

fn class_lines(classes: &[(Vec<u32>, String, String)]) -> Vec<String> {
    classes
        .iter()
        .map(|(ranks, place, motion)| format!("{} in {place} ({motion})", ranks_text(ranks)))
        .collect()
}

/// Whether `odd` stands apart from every other live rank by evidence, not by a rule of thumb: it
/// is alone in its class and either waits in no collective while every other waits in one, or
/// waits in `dist.barrier()` (it left its loop) while the others wait together in one training
/// collective, or two or more others all share one class.
pub fn separated(odd: u32, views: &[RankView]) -> bool {
    let live: Vec<&RankView> = views.iter().filter(|v| v.motion != Motion::Gone).collect();
    let Some(me) = live.iter().find(|v| v.rank == odd) else { return false };
    let others: Vec<&&RankView> = live.iter().filter(|v| v.rank != odd).collect();
    if others.is_empty() || me.frames.is_empty() || others.iter().any(|o| o.frames.is_empty()) {
        return false;
    }
    if others.iter().any(|o| o.place() == me.place()) {
        return false;
    }
    let mine = collective_of(&me.frames);
    let theirs: Vec<Option<&str>> = others.iter().map(|o| collective_of(&o.frames)).collect();
    let all_in_one = theirs.iter().all(|c| c.is_some() && *c == theirs[0]);
    (mine.is_none() && theirs.iter().all(Option::is_some))
        || (mine == Some("`dist.barrier()`") && all_in_one && theirs[0] != mine)
        || (others.len() >= 2 && others.iter().all(|o| o.place() == others[0].place()))
}

/// The verdict on a job, and its state.
pub struct Judged {
    pub state: State,
    pub outcome: OutcomeKind,
    pub culprit: Option<u32>,
    pub verdict: Verdict,
    pub ranks: Vec<RankResult>,
}

/// A rank's result as the judge reads it: `outcome`, and its last stack as a dump.
fn rank_result(v: &RankView, outcome: OutcomeKind, children: &[(u32, ProcessDump)]) -> RankResult {
    let mut dumps = vec![ProcessDump {
        pid: v.pid,
        rank: v.rank,
        role: ProcessRole::Rank,
        taken: Some(TAKEN.to_string()),
        py_spy: v.py_spy.clone(),
        error: if v.py_spy.is_none() { v.error.clone() } else { None },
        python: None,
        threads: v.threads.clone(),
    }];
    dumps.extend(children.iter().filter(|(r, _)| *r == v.rank).map(|(_, d)| d.clone()));
    RankResult {
        rank: v.rank,
        pid: Some(v.pid),
        device: None,
        outcome,
        signal: None,
        exit_code: None,
        last_phase: None,
        last_step: None,
        error: None,
        backtrace: Vec::new(),
        raw_backtrace: Vec::new(),
        stacks: Vec::new(),
        ended_at_s: None,
        last_marker_at_s: None,
        hang_detected_after_s: None,
        hung_at_s: None,
        silent_cpu: None,
        collateral: false,
        torn_down_with: None,
        steps_done: 0,
        params_checksum: None,
        optimizer_state_bytes: None,
        first_loss: None,
        final_loss: None,
        data_wait_fraction: None,
        losses: Vec::new(),
        step_ends_s: Vec::new(),
        timeline: Vec::new(),
        stdout_log: String::new(),
        stderr_log: String::new(),
        log_tail: Vec::new(),
        markers: 0,
        bad_markers: 0,
        dropped_markers: 0,
        observed: None,
        foreign_pids: Vec::new(),
        log_errors: Vec::new(),
        workers: Vec::new(),
        exit_source: None,
        identified_by: None,
        last_output_at_s: None,
        quotes: Vec::new(),
        dumps,
    }
}

fn seconds(s: Option<f64>) -> String {
    s.map_or("?".to_string(), |s| format!("{s:.2} s"))
}

/// Where ranks not found were looked for, on one machine.
pub const HERE: &str = "on this machine";

/// A job read from outside over a window, as the judge is given it.
#[derive(Debug, Clone, Copy)]
pub struct Window<'a> {
    /// Each rank found, as the window showed it.
    pub views: &'a [RankView],
    /// Ranks of `WORLD_SIZE` not found `scope` ([`HERE`], or on every node of a multi-node attach).
    pub missing: &'a [u32],
    /// The job's `WORLD_SIZE`, when its ranks said it.
    pub world: Option<u32>,
    /// Dumps of processes below ranks: (rank, dump).
    pub children: &'a [(u32, ProcessDump)],
    /// Where ranks not found were looked for.
    pub scope: &'a str,
    /// What `attach` read before the judge's evidence (how the job was found, memory, `/dev/shm`,
    /// connections): the verdict's first lines.
    pub front: &'a [String],
}

/// Judges the job over a window of `window_s` seconds ([`super::conclude`]'s `Seen::Attached`).
///
/// Long: one headline per job state (running; failed; hung with the rank the others wait for;
/// hung with another pattern the judge established; hung and cannot tell), each from the same
/// classes and the judge's account, kept side by side so that their wording agrees.
pub(super) fn conclude(scenario: &Scenario, window: &Window, window_s: f64) -> Judged {
    let Window { views, missing, world, children, scope, front } = *window;
    let live: Vec<&RankView> = views.iter().filter(|v| v.motion != Motion::Gone).collect();
    let gone: Vec<u32> = views
        .iter()
        .filter(|v| v.motion == Motion::Gone)
        .map(|v| v.rank)
        .chain(missing.iter().copied())
        .collect();
    // A rank whose stack could not be read but that used no CPU shows no progress either.
    let idle = |v: &RankView| v.cpu_s.is_some_and(|c| c < IDLE_SHARE * window_s);
    let stuck = live.iter().any(|v| v.motion == Motion::Stuck || (v.motion == Motion::Unread && idle(v)));
    let state = if !gone.is_empty() {
        State::Failed
    } else if stuck {
        State::Hung
    } else {
        State::Running
    };
    let classes = classes(views);
    let mut evidence: Vec<String> = Vec::new();
    for v in views {
        let cpu = match v.cpu_s {
            Some(c) => format!("CPU {c:.2} s of the {window_s:.1} s window"),
            None => "CPU time unreadable".to_string(),
        };
        let stack = match (v.motion, v.looks) {
            (Motion::Gone, _) => "it ended".to_string(),
            (Motion::Unread, _) => {
                format!("stack unreadable: {}", v.error.as_deref().unwrap_or("no Python frames"))
            }
            (Motion::Moving, n) => format!("stack changed between {n} looks; last at {}", v.place()),
            (_, n) => format!("the same stack at all {n} looks: {}", v.place()),
        };
        evidence.push(format!("rank {} (pid {}): {}; {cpu}; {stack}", v.rank, v.pid, v.motion.as_str()));
    }
    if !missing.is_empty() {
        let of = world.map(|w| format!(" of WORLD_SIZE {w}")).unwrap_or_default();
        evidence.push(format!(
            "{}{of} not found {scope}: exited before the window (or never started)",
            ranks_text(missing)
        ));
    }
    let results: Vec<RankResult> = views
        .iter()
        .map(|v| {
            let outcome = match (state, v.motion) {
                (_, Motion::Gone) => OutcomeKind::Exited,
                (State::Running, _) => OutcomeKind::Passed,
                _ => OutcomeKind::Hung,
            };
            rank_result(v, outcome, children)
        })
        .collect();
    let judged_ranks: Vec<RankResult> =
        results.iter().filter(|r| r.outcome != OutcomeKind::Exited).cloned().collect();
    let leftovers = Leftovers::default();
    let o = Observed {
        scenario,
        ranks: &judged_ranks,
        wall_s: window_s,
        memory: None,
        leftovers: &leftovers,
        oom_kills: &[],
        xids: &[],
        cgroup: None,
        launcher: None,
    };
    let j = judge(&o);
    let class_text = class_lines(&classes).join("; ");
    let odd = (j.verdict.pattern.as_deref() == Some("ranks-out-of-step"))
        .then_some(j.first_failure)
        .flatten()
        .filter(|&r| separated(r, views));
    let mut verdict = Verdict::default();
    let n = views.len() + missing.len();
    let headline = match state {
        State::Running => format!(
            "Running: {} of {}, each moving or using CPU over the {window_s:.1} s window ({class_text}).",
            ranks_text(&live.iter().map(|v| v.rank).collect::<Vec<_>>()),
            world.map_or(n.to_string(), |w| w.to_string())
        ),
        State::Failed => {
            let waiting = if live.is_empty() {
                "no rank is left".to_string()
            } else {
                format!("the others: {class_text}")
            };
            format!("Failed: {} gone before or during the window; {waiting}.", ranks_text(&gone))
        }
        State::Hung => match odd {
            Some(r) => {
                let v = views.iter().find(|v| v.rank == r);
                let busy = v
                    .filter(|v| v.motion == Motion::Busy)
                    .map(|v| format!(" It is busy, not waiting: CPU {} in the window.", seconds(v.cpu_s)))
                    .unwrap_or_default();
                // The judge's account, without its sentence on collateral: a rank that waits
                // has not failed.
                let account: Vec<&str> = j
                    .verdict
                    .headline
                    .trim_start_matches("Ranks out of step: ")
                    .split_inclusive(". ")
                    .filter(|s| !s.contains("(collateral)"))
                    .collect();
                format!(
                    "Hung: rank {r} is the one the others wait for: {}{busy}",
                    account.concat().trim_end()
                )
            }
            // Another pattern the judge established (a worker deadlocked after fork, …).
            None if j.verdict.pattern.as_deref().is_some_and(|p| p != "ranks-out-of-step") => {
                format!("Hung: {}", j.verdict.headline)
            }
            None if live.len() == 1 => {
                format!("Hung: no progress over the {window_s:.1} s window: {class_text}.")
            }
            None => format!("Hung: cannot tell which rank the others wait for; the classes: {class_text}."),
        },
    };
    verdict.headline = headline;
    evidence.extend(class_lines(&classes).into_iter().map(|c| format!("class: {c}")));
    if matches!(state, State::Hung | State::Failed) {
        for line in &j.verdict.evidence {
            // The judge's account of a named rank stands only where the rank was separated.
            if odd.is_some() || !line.starts_with("from py-spy stacks") {
                // Lines about markers, output and collateral speak of a run ups-doctor started.
                let of_a_run = ["rank ", "no marker", "collateral:"];
                if !evidence.contains(line)
                    && !of_a_run
                        .iter()
                        .any(|p| line.starts_with(p) || line.contains("looked at from outside"))
                {
                    evidence.push(line.clone());
                }
            }
        }
        if j.verdict.pattern.is_some()
            && (odd.is_some() || j.verdict.pattern.as_deref() != Some("ranks-out-of-step"))
        {
            verdict.pattern = j.verdict.pattern.clone();
            verdict.reference = j.verdict.reference.clone();
            verdict.likely_cause = j.verdict.likely_cause.clone();
            verdict.next_step = j.verdict.next_step.clone();
        }
    }
    if state == State::Hung && odd.is_none() {
        verdict.next_step = Some(
            "Attach again with a longer `--watch` to see whether a class moves; `--native` adds native frames (it \
             pauses each process briefly while reading it)."
                .to_string(),
        );
    }
    if state == State::Failed && verdict.next_step.is_none() {
        verdict.next_step = Some(
            "The rank that is gone ended first: its own output (the launcher's log, torchrun's error summary) says \
             why; the others wait for it until their collective's timeout."
                .to_string(),
        );
    }
    verdict.evidence = front.iter().cloned().chain(evidence).collect();
    let outcome = match state {
        State::Running => OutcomeKind::Passed,
        State::Hung => OutcomeKind::Hung,
        State::Failed => OutcomeKind::Exited,
    };
    Judged { state, outcome, culprit: odd, verdict, ranks: results }
}
