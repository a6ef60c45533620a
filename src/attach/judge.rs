//! What the window showed, judged: each rank moving, busy or stuck; ranks grouped into classes by
//! where their main thread is; the job `running`, `hung` or `failed`; and the rank the others wait
//! for, named only when the evidence separates it (through [`crate::diagnose::judge`], the one
//! judge). Pure: watched processes in, verdict out.

use crate::diagnose::evidence::{StackFrame, py_spy_threads};
use crate::diagnose::{Observed, collective_of, judge};
use crate::scenario::{OutcomeKind, Scenario};
use serde::{Deserialize, Serialize};

use crate::schema::{KernelThread, Leftovers, ProcessDump, ProcessRole, RankResult, Verdict};

use super::watch::Watched;

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
    pub fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Hung => "hung",
            State::Failed => "failed",
        }
    }
}

/// A CPU share below this over the window is waiting, not computing.
const IDLE_SHARE: f64 = 0.05;

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

/// Views each rank of `ranks` (rank, pid) from what was watched over `window_s`.
pub fn view(ranks: &[(u32, u32)], watched: &[Watched], window_s: f64) -> Vec<RankView> {
    ranks
        .iter()
        .map(|&(rank, pid)| {
            let w = watched.iter().find(|w| w.pid == pid);
            let looks = w.map(|w| w.looks.as_slice()).unwrap_or_default();
            let gone = looks.last().is_none_or(|l| matches!(l.state, None | Some('Z' | 'X')));
            let stacks: Vec<(&str, Vec<StackFrame>)> = looks
                .iter()
                .filter_map(|l| l.py_spy.as_deref())
                .map(|t| (t, main_frames(t, pid)))
                .filter(|(_, f)| !f.is_empty())
                .collect();
            let cpu_s = w.and_then(Watched::cpu_used_s);
            let moved = stacks.windows(2).any(|p| p[0].1 != p[1].1);
            let idle = cpu_s.is_some_and(|c| c < IDLE_SHARE * window_s);
            let motion = if gone {
                Motion::Gone
            } else if stacks.len() < 2 {
                Motion::Unread
            } else if moved {
                Motion::Moving
            } else if idle {
                Motion::Stuck
            } else {
                Motion::Busy
            };
            let last = stacks.last();
            RankView {
                rank,
                pid,
                motion,
                cpu_s,
                looks: stacks.len(),
                frames: last.map(|(_, f)| f.clone()).unwrap_or_default(),
                py_spy: last.map(|(t, _)| t.to_string()),
                error: looks.iter().rev().find_map(|l| l.error.clone()),
                threads: looks.last().map(|l| l.threads.clone()).unwrap_or_default(),
            }
        })
        .collect()
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

/// Judges the job: `views` of its ranks, `missing` ranks of `WORLD_SIZE` not found `scope`
/// ([`HERE`], or on every node of a multi-node attach), `children` dumps of processes below
/// ranks (rank, dump).
///
/// Long: one headline per job state (running; failed; hung with the rank the others wait for;
/// hung with another pattern the judge established; hung and cannot tell), each from the same
/// classes and the judge's account, kept side by side so that their wording agrees.
pub fn conclude(
    scenario: &Scenario,
    views: &[RankView],
    missing: &[u32],
    world: Option<u32>,
    children: &[(u32, ProcessDump)],
    window_s: f64,
    scope: &str,
) -> Judged {
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
    verdict.evidence = evidence;
    let outcome = match state {
        State::Running => OutcomeKind::Passed,
        State::Hung => OutcomeKind::Hung,
        State::Failed => OutcomeKind::Exited,
    };
    Judged { state, outcome, culprit: odd, verdict, ranks: results }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attach::watch::Look;

    fn look(at_s: f64, cpu_s: f64, text: &str) -> Look {
        Look {
            at_s,
            state: Some('S'),
            cpu_s: Some(cpu_s),
            py_spy: Some(text.to_string()),
            error: None,
            threads: Vec::new(),
        }
    }

    fn dump(pid: u32, frames: &[&str]) -> String {
        let mut t = format!("Process {pid}: python\n\nThread {pid} (idle): \"MainThread\"\n");
        for f in frames {
            t.push_str(&format!("    {f}\n"));
        }
        t
    }

    const BACKWARD: [&str; 4] = [
        "_engine_run_backward (torch/autograd/graph.py:869)",
        "backward (torch/autograd/__init__.py:381)",
        "Tensor.backward (torch/_tensor.py:631)",
        "<module> (ddp.py:52)",
    ];
    const BARRIER: [&str; 3] = [
        "barrier (torch/distributed/distributed_c10d.py:5037)",
        "_exception_logger.<locals>.wrapper (torch/distributed/c10d_logger.py:83)",
        "<module> (ddp.py:48)",
    ];
    const SLEEP: [&str; 2] = ["slow_hook (stall.py:9)", "<module> (ddp.py:50)"];

    fn still(pid: u32, frames: &[&str], cpu: f64) -> Watched {
        let text = dump(pid, frames);
        Watched {
            pid,
            looks: (0..3).map(|i| look(f64::from(i), cpu * f64::from(i), &text)).collect(),
            memory: None,
        }
    }

    fn scenario() -> Scenario {
        Scenario { command: Some(vec!["torchrun".into(), "ddp.py".into()]), ..Scenario::default() }
    }

    #[test]
    fn a_rank_stuck_outside_any_collective_is_named_and_the_job_is_hung() {
        let watched = [still(10, &BACKWARD, 0.0), still(11, &SLEEP, 0.0)];
        let views = view(&[(0, 10), (1, 11)], &watched, 3.0);
        assert!(views.iter().all(|v| v.motion == Motion::Stuck), "{views:?}");
        let j = conclude(&scenario(), &views, &[], Some(2), &[], 3.0, HERE);
        assert_eq!(j.state, State::Hung);
        assert_eq!(j.culprit, Some(1), "{:?}", j.verdict);
        assert!(j.verdict.headline.starts_with("Hung: rank 1 is the one"), "{}", j.verdict.headline);
    }

    #[test]
    fn a_rank_in_barrier_while_the_other_waits_in_backward_is_named() {
        let watched = [still(10, &BACKWARD, 0.0), still(11, &BARRIER, 0.0)];
        let views = view(&[(0, 10), (1, 11)], &watched, 3.0);
        let j = conclude(&scenario(), &views, &[], Some(2), &[], 3.0, HERE);
        assert_eq!(j.culprit, Some(1), "{:?}", j.verdict);
    }

    #[test]
    fn two_ranks_in_two_different_training_collectives_cannot_be_told_apart() {
        let other = ["all_reduce (torch/distributed/distributed_c10d.py:2900)", "<module> (t.py:20)"];
        let watched = [still(10, &BACKWARD, 0.0), still(11, &other, 0.0)];
        let views = view(&[(0, 10), (1, 11)], &watched, 3.0);
        let j = conclude(&scenario(), &views, &[], Some(2), &[], 3.0, HERE);
        assert_eq!(j.state, State::Hung);
        assert_eq!(j.culprit, None);
        assert!(j.verdict.headline.starts_with("Hung: cannot tell which rank"), "{}", j.verdict.headline);
        assert!(j.verdict.headline.contains("rank 0 in `_engine_run_backward`"), "{}", j.verdict.headline);
    }

    #[test]
    fn ranks_whose_stacks_move_with_cpu_rising_are_running() {
        let moving = |pid: u32| Watched {
            pid,
            looks: vec![
                look(0.0, 1.0, &dump(pid, &BACKWARD)),
                look(
                    1.5,
                    2.4,
                    &dump(pid, &["forward (torch/nn/modules/linear.py:125)", "<module> (ddp.py:45)"]),
                ),
                look(3.0, 3.9, &dump(pid, &BACKWARD)),
            ],
            memory: None,
        };
        let views = view(&[(0, 10), (1, 11)], &[moving(10), moving(11)], 3.0);
        let j = conclude(&scenario(), &views, &[], Some(2), &[], 3.0, HERE);
        assert_eq!(j.state, State::Running, "{views:?}");
        assert_eq!(j.outcome, OutcomeKind::Passed);
        assert!(j.verdict.headline.starts_with("Running: ranks 0, 1 of 2"), "{}", j.verdict.headline);
    }

    #[test]
    fn a_missing_rank_of_world_size_makes_the_job_failed() {
        let watched = [still(10, &BACKWARD, 0.0)];
        let views = view(&[(0, 10)], &watched, 3.0);
        let j = conclude(&scenario(), &views, &[1], Some(2), &[], 3.0, HERE);
        assert_eq!(j.state, State::Failed);
        assert!(j.verdict.headline.starts_with("Failed: rank 1 gone"), "{}", j.verdict.headline);
        assert!(
            j.verdict.evidence.iter().any(|l| l.contains("rank 1 of WORLD_SIZE 2 not found")),
            "{:?}",
            j.verdict.evidence
        );
    }

    #[test]
    fn with_native_frames_a_rank_is_placed_by_its_innermost_python_frame() {
        let text = dump(
            10,
            &[
                "0x7f22fdca3f16 (libc.so.6)",
                "c10d::Reducer::finalize_backward (libtorch_cpu.so)",
                "_engine_run_backward (torch/autograd/graph.py:869)",
                "<module> (ddp.py:52)",
            ],
        );
        let frames = main_frames(&text, 10);
        assert_eq!(place(&frames), "`_engine_run_backward` (torch/autograd/graph.py:869) ← ddp.py:52");
        assert_eq!(place(&frames[..2]), "`c10d::Reducer::finalize_backward` (libtorch_cpu.so)");
    }

    #[test]
    fn ranks_whose_stacks_cannot_be_read_and_that_use_no_cpu_are_not_called_running() {
        let unread = |pid: u32, cpu: f64| Watched {
            pid,
            looks: (0..3)
                .map(|i| Look {
                    at_s: f64::from(i),
                    state: Some('S'),
                    cpu_s: Some(cpu * f64::from(i)),
                    py_spy: None,
                    error: Some("`py-spy dump --nonblocking --pid 10` failed: Permission denied".into()),
                    threads: Vec::new(),
                })
                .collect(),
            memory: None,
        };
        let views = view(&[(0, 10), (1, 11)], &[unread(10, 0.0), unread(11, 0.0)], 3.0);
        assert!(views.iter().all(|v| v.motion == Motion::Unread), "{views:?}");
        let j = conclude(&scenario(), &views, &[], Some(2), &[], 3.0, HERE);
        assert_eq!(j.state, State::Hung);
        assert_eq!(j.culprit, None);
        assert!(j.verdict.headline.contains("ranks 0, 1 in no readable stack"), "{}", j.verdict.headline);
        let views = view(&[(0, 10), (1, 11)], &[unread(10, 1.0), unread(11, 1.0)], 3.0);
        assert_eq!(conclude(&scenario(), &views, &[], Some(2), &[], 3.0, HERE).state, State::Running);
    }

    #[test]
    fn a_busy_rank_with_the_same_stack_is_busy_not_stuck() {
        let watched = [still(10, &BACKWARD, 0.0), still(11, &SLEEP, 1.0)];
        let views = view(&[(0, 10), (1, 11)], &watched, 3.0);
        assert_eq!(views[1].motion, Motion::Busy);
        let j = conclude(&scenario(), &views, &[], Some(2), &[], 3.0, HERE);
        assert_eq!(j.culprit, Some(1), "{:?}", j.verdict);
        assert!(j.verdict.headline.contains("It is busy"), "{}", j.verdict.headline);
    }
}
