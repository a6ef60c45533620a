//! Turns what was observed about each rank into outcomes, a verdict and the expectation check.
//! Pure functions over data: every rule here is unit-tested without processes.

use crate::protocol::{signal_name, signal_number};
use crate::scenario::{Expect, OutcomeKind, Scenario};

use super::process::Exit;
use super::result::{RankResult, ThreadStack, Verdict};
use super::state::RankState;

/// Why the harness ended a rank itself.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Intervention {
    /// No marker for `silence_s` seconds (≥ `hang_after_s`).
    Hung { silence_s: f64 },
    /// The scenario ran past `timeout_s`.
    TimedOut,
}

/// Everything observed about one rank once it is gone.
#[derive(Debug, Clone, Default)]
pub struct RankEnd {
    pub rank: u32,
    pub pid: Option<u32>,
    pub exit: Option<Exit>,
    pub launch_error: Option<String>,
    pub intervention: Option<Intervention>,
    pub torn_down_with: Option<String>,
    pub ended_at_s: Option<f64>,
    pub state: RankState,
    pub stdout_log: String,
    pub stderr_log: String,
    pub stderr_tail: Vec<String>,
    pub stdout_tail: Vec<String>,
}

/// Classifies one rank's end.
pub fn classify_rank(end: &RankEnd) -> RankResult {
    let s = &end.state;
    let (outcome, signal, exit_code) = match (&end.launch_error, end.intervention, end.exit) {
        (Some(_), _, _) => (OutcomeKind::LaunchFailed, None, None),
        (None, Some(Intervention::Hung { .. }), _) => (OutcomeKind::Hung, None, None),
        (None, Some(Intervention::TimedOut), _) => (OutcomeKind::TimedOut, None, None),
        (None, None, Some(Exit::Code(0))) if s.done => (OutcomeKind::Passed, None, Some(0)),
        (None, None, Some(Exit::Code(0))) => (OutcomeKind::FalseSuccess, None, Some(0)),
        (None, None, Some(Exit::Code(c))) => (OutcomeKind::Exited, None, Some(c)),
        (None, None, Some(Exit::Signal { signal, .. })) => {
            (OutcomeKind::Signaled, Some(signal_name(signal)), None)
        }
        (None, None, None) => (OutcomeKind::LaunchFailed, None, None),
    };
    let error =
        end.launch_error.clone().or_else(|| s.error.clone()).or_else(|| {
            (outcome != OutcomeKind::Passed).then(|| last_error_line(&end.stderr_tail)).flatten()
        });
    let log_tail = if end.stderr_tail.is_empty() { end.stdout_tail.clone() } else { end.stderr_tail.clone() };
    RankResult {
        rank: end.rank,
        pid: end.pid.or(s.pid),
        outcome,
        signal,
        exit_code,
        last_phase: s.phase.clone(),
        last_step: s.step,
        error,
        backtrace: s.backtrace.clone(),
        raw_backtrace: if s.backtrace.is_empty() { s.raw_backtrace.clone() } else { Vec::new() },
        stacks: s.stacks.clone(),
        ended_at_s: end.ended_at_s,
        last_marker_at_s: s.last_marker_at,
        hang_detected_after_s: match end.intervention {
            Some(Intervention::Hung { silence_s }) => Some(silence_s),
            _ => None,
        },
        torn_down_with: end.torn_down_with.clone(),
        collateral: false,
        steps_done: s.steps_done,
        params_checksum: s.checksum.clone(),
        first_loss: s.first_loss,
        final_loss: s.last_loss,
        data_wait_fraction: s.data_wait_fraction(),
        losses: s.losses.clone(),
        timeline: s.timeline.clone(),
        stdout_log: end.stdout_log.clone(),
        stderr_log: end.stderr_log.clone(),
        log_tail,
        markers: s.markers,
        bad_markers: s.bad_markers,
        workers: s.workers.clone(),
    }
}

/// The last stderr line that looks like an error message.
fn last_error_line(lines: &[String]) -> Option<String> {
    const NEEDLES: [&str; 7] =
        ["error", "exception", "panicked", "terminate called", "what():", "fatal", "traceback"];
    lines
        .iter()
        .rev()
        .find(|l| {
            let lower = l.to_ascii_lowercase();
            NEEDLES.iter().any(|n| lower.contains(n))
        })
        .cloned()
}

/// `in `forward` at step 3`, `in `model.build/encoder``, or `before its first marker`.
fn location(rank: &RankResult) -> String {
    match (&rank.last_phase, rank.last_step) {
        (Some(p), Some(s)) => format!("in `{p}` at step {s}"),
        (Some(p), None) => format!("in `{p}`"),
        (None, _) => "before its first marker".to_string(),
    }
}

/// The scenario's outcome (the first failure's, or passed), which rank failed first, and the
/// verdict a reader sees first.
pub fn verdict(
    scenario: &Scenario,
    ranks: &[RankResult],
    wall_s: f64,
) -> (OutcomeKind, Option<u32>, Verdict) {
    let first = ranks
        .iter()
        .filter(|r| r.outcome != OutcomeKind::Passed)
        .min_by(|a, b| failure_time(a).total_cmp(&failure_time(b)));
    let Some(failed) = first else {
        let r0 = ranks.first();
        let steps = r0.map_or(0, |r| r.steps_done);
        let loss = match r0.and_then(|r| Some((r.first_loss?, r.final_loss?))) {
            Some((a, b)) => format!(", loss {a:.4} → {b:.4}"),
            None => String::new(),
        };
        return (
            OutcomeKind::Passed,
            None,
            Verdict {
                headline: format!(
                    "Passed: {} {} trained {steps} steps in {wall_s:.1} s{loss}.",
                    ranks.len(),
                    if ranks.len() == 1 { "rank" } else { "ranks" }
                ),
                evidence: Vec::new(),
                likely_cause: None,
                next_step: None,
            },
        );
    };
    let who = format!("Rank {}", failed.rank);
    let at = location(failed);
    let mut evidence = vec![match failed.last_marker_at_s {
        Some(t) => format!(
            "last marker from rank {} at {t:.2} s: {}; {} of {} steps done",
            failed.rank,
            at.trim_start_matches("in "),
            failed.steps_done,
            scenario.train.steps
        ),
        None => format!("rank {} sent no marker at all", failed.rank),
    }];
    let (headline, likely_cause, next_step) = match failed.outcome {
        OutcomeKind::Signaled => {
            let sig = failed.signal.clone().unwrap_or_default();
            let num = signal_number(&sig).unwrap_or(0);
            evidence.push(format!(
                "killed by {sig} (torchrun would print `exitcode: -{num}` and `Signal {num} ({sig}) received by PID {}`)",
                failed.pid.map_or("?".into(), |p| p.to_string())
            ));
            if !failed.backtrace.is_empty() {
                evidence.push(format!(
                    "native backtrace of {} frames captured by the crash handler; frame #0: `{}`",
                    failed.backtrace.len(),
                    failed.backtrace[0].symbol.as_deref().unwrap_or(&failed.backtrace[0].addr)
                ));
            }
            (
                format!("{who} was killed by {sig} {at}."),
                Some(signal_cause(num)),
                Some(
                    "Read the backtrace below from the top: the first frame in your own code is where to look. \
                     Then remove components one at a time (e.g. `--set model.attention=false`, a smaller \
                     `model.depths`) to find the one the crash needs."
                        .to_string(),
                ),
            )
        }
        OutcomeKind::FalseSuccess => {
            evidence.push("exit status 0, but no `done` marker: training never reported completion".into());
            (
                format!("{who} exited with status 0 {at} without finishing training: a false success."),
                Some(
                    "Something ended the process with status 0 before training completed, like a wrapper \
                     calling `os._exit(0)` or `sys.exit(0)` after catching an exception: the real error \
                     was swallowed."
                        .to_string(),
                ),
                Some(
                    "Look for exception handlers that exit with 0 around the training loop; the log tail \
                     below shows the last output before the exit."
                        .to_string(),
                ),
            )
        }
        OutcomeKind::Exited if failed.error.as_deref().and_then(worker_death).is_some() => {
            let death = failed.error.as_deref().and_then(worker_death).expect("checked by the guard");
            let code = failed.exit_code.unwrap_or(-1);
            let r = failed.rank;
            evidence.push(format!(
                "culprit: data-loader worker {} (pid {}) of rank {r} {}",
                death.id, death.pid, death.how
            ));
            evidence.push(format!(
                "consequence: rank {r} noticed at once and exited with status {code}: {}",
                failed.error.as_deref().unwrap_or_default()
            ));
            if !failed.backtrace.is_empty() {
                evidence
                    .push("the native backtrace below is the worker's, written by its crash handler".into());
            }
            (
                format!(
                    "Data-loader worker {} (pid {}) of rank {r} died first ({}); rank {r} failed as a consequence {at}.",
                    death.id, death.pid, death.how
                ),
                Some(worker_death_cause(&death.how)),
                Some(
                    "The worker's log lines are in the rank's stderr (workers share it); `--set data.workers=0` \
                     shows whether the failure needs worker processes."
                        .to_string(),
                ),
            )
        }
        OutcomeKind::Exited => {
            let code = failed.exit_code.unwrap_or(-1);
            let msg = failed.error.clone().map(|e| format!(": {e}")).unwrap_or_default();
            evidence.push(format!("exit status {code}"));
            (
                format!("{who} exited with status {code} {at}{msg}"),
                failed
                    .error
                    .as_ref()
                    .map(|_| "The process reported this error itself before exiting.".to_string()),
                Some("The error message and the log tail below say what went wrong.".to_string()),
            )
        }
        OutcomeKind::Hung => {
            let silence = failed.hang_detected_after_s.unwrap_or(f64::NAN);
            evidence.push(format!(
                "no marker for {silence:.1} s (limit `limits.hang_after_s` = {} s)",
                scenario.limits.hang_after_s
            ));
            if !failed.stacks.is_empty() {
                evidence.push(format!(
                    "stacks of {} threads dumped from inside the process",
                    failed.stacks.len()
                ));
            }
            if let Some(how) = &failed.torn_down_with {
                evidence.push(format!("torn down with {how} after the stack dump"));
            }
            (
                format!("{who} hung {at}: no progress for {silence:.1} s."),
                Some(out_of_step(failed, ranks).unwrap_or_else(|| hang_cause(failed))),
                Some(
                    "The thread stacks below show where each thread waits; a thread holding a lock while \
                     waiting for another is the usual culprit."
                        .to_string(),
                ),
            )
        }
        OutcomeKind::TimedOut => {
            evidence
                .push(format!("still running after `limits.timeout_s` = {} s", scenario.limits.timeout_s));
            (
                format!("{who} ran past the time limit of {} s {at}.", scenario.limits.timeout_s),
                Some("It kept making progress, just not fast enough: the run is slower than the limit assumes.".into()),
                Some("Raise `limits.timeout_s` or reduce `train.steps`; compare steps/s with a known-good run.".into()),
            )
        }
        OutcomeKind::LaunchFailed => (
            format!(
                "{who} could not be started: {}",
                failed.error.clone().unwrap_or_else(|| "unknown error".into())
            ),
            None,
            Some(
                "Check that the ups-doctor binary and libtorch are installed (see the README's set-up)."
                    .into(),
            ),
        ),
        OutcomeKind::Passed => unreachable!("a passed rank is not a failure"),
    };
    let mut headline = headline;
    let first_at = failure_time(failed);
    let mut collateral: Vec<&RankResult> =
        ranks.iter().filter(|r| r.rank != failed.rank && r.outcome != OutcomeKind::Passed).collect();
    collateral.sort_by(|a, b| failure_time(a).total_cmp(&failure_time(b)));
    for other in &collateral {
        let how = match (other.outcome, &other.torn_down_with) {
            (_, Some(sent)) if other.outcome != OutcomeKind::Hung => format!("was torn down with {sent}"),
            (OutcomeKind::Signaled, _) => {
                format!("was killed by {}", other.signal.as_deref().unwrap_or("a signal"))
            }
            (OutcomeKind::Exited, _) => format!("exited with status {}", other.exit_code.unwrap_or(-1)),
            (kind, _) => kind.as_str().replace('_', " "),
        };
        let later = failure_time(other) - first_at;
        let later =
            if later.is_finite() && later >= 0.0 { format!(" {later:.2} s later") } else { String::new() };
        let error = other.error.as_deref().map(|e| format!(": {e}")).unwrap_or_default();
        evidence.push(format!("collateral: rank {} {how} {}{later}{error}", other.rank, location(other)));
    }
    if !collateral.is_empty() {
        let ranks: Vec<String> = collateral.iter().map(|r| r.rank.to_string()).collect();
        headline.push_str(&format!(
            " {} {} failed after it (collateral).",
            if ranks.len() == 1 { "Rank" } else { "Ranks" },
            ranks.join(", ")
        ));
    }
    (failed.outcome, Some(failed.rank), Verdict { headline, evidence, likely_cause, next_step })
}

/// A data-loader worker's death as the rank reported it (PyTorch's DataLoader wording, then
/// `[data-loader worker ID of rank R, METHOD]`).
struct WorkerDeath {
    id: u32,
    pid: u32,
    /// `is killed by signal: Killed.` or `exited unexpectedly with exit code 1.`
    how: String,
}

fn worker_death(error: &str) -> Option<WorkerDeath> {
    let rest = &error[error.find("DataLoader worker (pid ")? + "DataLoader worker (pid ".len()..];
    let (pid, rest) = rest.split_once(") ")?;
    let how = rest.split(['.', '[']).next()?.trim().to_string() + ".";
    let tag = &error[error.find("[data-loader worker ")? + "[data-loader worker ".len()..];
    let id = tag.split_whitespace().next()?.parse().ok()?;
    Some(WorkerDeath { id, pid: pid.parse().ok()?, how })
}

fn worker_death_cause(how: &str) -> String {
    if how.contains("Bus error") {
        "A worker touched a page of shared memory that could not be backed: `/dev/shm` is full or too small \
         (Docker's default is 64 MB) for the batches in flight (`workers × prefetch` slots) or the dataset cache."
            .into()
    } else if how.contains("Killed") {
        "The worker was killed with SIGKILL from outside, most often by the kernel's OOM killer (each worker's \
         memory counts, including a duplicated dataset) or a cgroup limit; PyTorch's DataLoader raises the same \
         error in the main process."
            .into()
    } else if how.contains("signal") {
        "The worker crashed in native code while building a batch; the rank only sees that its worker is gone."
            .into()
    } else {
        "The worker exited on its own (an error in the dataset code, or a swallowed exception); its message is in \
         the log tail."
            .into()
    }
}

fn failure_time(rank: &RankResult) -> f64 {
    match rank.outcome {
        OutcomeKind::Hung => rank.last_marker_at_s.unwrap_or(0.0),
        _ => rank.ended_at_s.or(rank.last_marker_at_s).unwrap_or(f64::INFINITY),
    }
}

fn signal_cause(signal: i32) -> String {
    match signal {
        libc::SIGSEGV => "An invalid memory access in native code (libtorch, a CUDA/NCCL library, an extension, \
                          or memory shared between processes). Python prints no traceback for it and torchrun \
                          only reports `exitcode: -11`."
            .into(),
        libc::SIGBUS => "A memory-mapped page could not be backed, most often because `/dev/shm` is full \
                         (Docker's default is 64 MB) while data-loader workers pass batches through shared memory."
            .into(),
        libc::SIGABRT => "`abort()`: a failed assertion or an uncaught C++ exception (look for \
                          `terminate called after throwing` in the log tail)."
            .into(),
        libc::SIGKILL => "Killed from outside, most often by the kernel's OOM killer or a cgroup memory limit \
                          (check `dmesg` and the memory limit in the environment section)."
            .into(),
        libc::SIGFPE => "An arithmetic trap in native code, such as an integer division by zero.".into(),
        libc::SIGILL => "An illegal instruction: code built for a newer CPU than this one, or a corrupted binary.".into(),
        _ => format!("The process was ended by {}.", signal_name(signal)),
    }
}

/// When stuck ranks wait in different places (one at the end of training, another in a
/// collective of step N), they are out of step: one rank ran fewer steps or skipped a collective.
fn out_of_step(failed: &RankResult, ranks: &[RankResult]) -> Option<String> {
    let stuck: Vec<&RankResult> = ranks.iter().filter(|r| r.outcome == OutcomeKind::Hung).collect();
    let differs = stuck
        .iter()
        .any(|r| (r.last_phase.as_ref(), r.steps_done) != (failed.last_phase.as_ref(), failed.steps_done));
    if stuck.len() < 2 || !differs {
        return None;
    }
    let places: Vec<String> = stuck
        .iter()
        .map(|r| format!("rank {} after {} steps {}", r.rank, r.steps_done, location(r)))
        .collect();
    Some(format!(
        "The ranks are out of step: {}. Each waits for a collective the others will never join, so all \
         block until a timeout (NCCL's watchdog would fire after 10 minutes). A rank ran fewer steps or \
         skipped a collective: uneven data shards, an early `break`/`continue` on one rank, or a condition \
         that differs between ranks. Rank {} stopped first.",
        places.join("; "),
        failed.rank
    ))
}

fn hang_cause(rank: &RankResult) -> String {
    let waiting_on_lock = rank
        .stacks
        .iter()
        .filter(|t| {
            t.frames.iter().take(8).any(|f| {
                f.symbol.as_deref().is_some_and(|s| {
                    s.contains("futex")
                        || s.contains("Mutex")
                        || s.contains("mutex")
                        || s.contains("lock_contended")
                })
            })
        })
        .count();
    let gomp = |t: &&ThreadStack| {
        t.frames
            .iter()
            .any(|f| f.symbol.as_deref().is_some_and(|s| s.contains("gomp_") || s.contains("libgomp")))
    };
    let in_gomp = rank.stacks.iter().any(|t| gomp(&t));
    // Loader workers' main threads are named `loader-w<id>`; the rank's own idle OpenMP threads
    // also wait in libgomp, so only a worker there points at fork.
    if let Some(worker) = rank.stacks.iter().filter(|t| t.thread.starts_with("loader-w")).find(gomp) {
        return format!(
            "Data-loader worker `{}` (tid {}) is stuck in an OpenMP (libgomp) barrier: it was forked after the \
             trainer's intra-op thread pool had run, and the pool's threads do not exist in the child, so its \
             first parallel op waits for them forever (fork after multi-threaded work deadlocks). Call \
             `torch.set_num_threads(1)` first in the worker (`data.worker_threads: one`), or use \
             `start_method: spawn`.",
            worker.thread, worker.tid
        );
    }
    if waiting_on_lock >= 2 {
        format!(
            "{waiting_on_lock} threads are blocked acquiring locks: a deadlock, typically two threads taking \
             the same locks in opposite order."
        )
    } else if in_gomp {
        "Threads are waiting in an OpenMP barrier: typical of a process forked after libtorch's thread pool \
         started (fork after multi-threaded work deadlocks; use `spawn` or one thread in the child)."
            .into()
    } else {
        "A call that never returns: a deadlock, a collective waiting for a peer that is gone, or blocking I/O."
            .into()
    }
}

/// How the outcome differs from `expect`, one line per differing field (empty: met).
pub fn check_expectation(expect: &Expect, outcome: OutcomeKind, failed: Option<&RankResult>) -> Vec<String> {
    let mut out = Vec::new();
    if expect.outcome != outcome {
        out.push(format!("expected outcome `{}`, got `{}`", expect.outcome.as_str(), outcome.as_str()));
    }
    let Some(r) = failed else {
        for (field, set) in [
            ("signal", expect.signal.is_some()),
            ("exit_code", expect.exit_code.is_some()),
            ("rank", expect.rank.is_some()),
            ("phase", expect.phase.is_some()),
            ("step", expect.step.is_some()),
            ("message", expect.message.is_some()),
        ] {
            if set && expect.outcome != OutcomeKind::Passed {
                out.push(format!("expected `{field}` of a failing rank, but no rank failed"));
            }
        }
        return out;
    };
    if let Some(want) = &expect.signal {
        let got = r.signal.as_deref().and_then(signal_number);
        if signal_number(want) != got {
            out.push(format!("expected signal `{want}`, got `{}`", r.signal.as_deref().unwrap_or("none")));
        }
    }
    if let Some(want) = expect.exit_code
        && r.exit_code != Some(want)
    {
        out.push(format!(
            "expected exit code {want}, got {}",
            r.exit_code.map_or("none".into(), |c| c.to_string())
        ));
    }
    if let Some(want) = expect.rank
        && r.rank != want
    {
        out.push(format!("expected rank {want} to fail first, got rank {}", r.rank));
    }
    if let Some(want) = &expect.phase
        && r.last_phase.as_deref() != Some(want.as_str())
    {
        out.push(format!("expected phase `{want}`, got `{}`", r.last_phase.as_deref().unwrap_or("none")));
    }
    if let Some(want) = expect.step
        && r.last_step != Some(want)
    {
        out.push(format!(
            "expected step {want}, got {}",
            r.last_step.map_or("none".into(), |s| s.to_string())
        ));
    }
    if let Some(want) = &expect.message {
        let in_error = r.error.as_deref().is_some_and(|e| e.contains(want.as_str()));
        let in_log = r.log_tail.iter().any(|l| l.contains(want.as_str()));
        if !in_error && !in_log {
            out.push(format!("expected the error to contain `{want}`"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Frame;

    fn end(exit: Option<Exit>) -> RankEnd {
        RankEnd { exit, ..Default::default() }
    }

    #[test]
    fn exit_zero_without_done_is_a_false_success() {
        assert_eq!(classify_rank(&end(Some(Exit::Code(0)))).outcome, OutcomeKind::FalseSuccess);
        let mut done = end(Some(Exit::Code(0)));
        done.state.done = true;
        assert_eq!(classify_rank(&done).outcome, OutcomeKind::Passed);
    }

    #[test]
    fn signals_codes_and_interventions_map_to_outcomes() {
        let r = classify_rank(&end(Some(Exit::Signal { signal: libc::SIGSEGV, core_dumped: false })));
        assert_eq!((r.outcome, r.signal.as_deref()), (OutcomeKind::Signaled, Some("SIGSEGV")));
        let mut e = end(Some(Exit::Code(1)));
        e.stderr_tail = vec!["noise".into(), "error: injected failure".into(), "bye".into()];
        let r = classify_rank(&e);
        assert_eq!((r.outcome, r.exit_code), (OutcomeKind::Exited, Some(1)));
        assert_eq!(r.error.as_deref(), Some("error: injected failure"));
        let mut h = end(Some(Exit::Signal { signal: libc::SIGTERM, core_dumped: false }));
        h.intervention = Some(Intervention::Hung { silence_s: 3.2 });
        let r = classify_rank(&h);
        assert_eq!((r.outcome, r.hang_detected_after_s), (OutcomeKind::Hung, Some(3.2)));
        let mut l = end(None);
        l.launch_error = Some("No such file".into());
        assert_eq!(classify_rank(&l).outcome, OutcomeKind::LaunchFailed);
    }

    #[test]
    fn verdict_names_the_signal_phase_and_step() {
        let mut e = end(Some(Exit::Signal { signal: libc::SIGSEGV, core_dumped: false }));
        e.state.phase = Some("forward".into());
        e.state.step = Some(3);
        e.state.backtrace =
            vec![Frame { addr: "0x1".into(), symbol: Some("inject_segv".into()), location: None }];
        let ranks = vec![classify_rank(&e)];
        let (outcome, first, v) = verdict(&Scenario::default(), &ranks, 1.0);
        assert_eq!((outcome, first), (OutcomeKind::Signaled, Some(0)));
        assert_eq!(v.headline, "Rank 0 was killed by SIGSEGV in `forward` at step 3.");
        assert!(v.likely_cause.unwrap().contains("exitcode: -11"));
    }

    #[test]
    fn the_first_failure_is_the_culprit_and_later_failures_are_collateral() {
        let mut culprit = end(Some(Exit::Signal { signal: libc::SIGSEGV, core_dumped: false }));
        culprit.rank = 1;
        culprit.ended_at_s = Some(2.0);
        culprit.state.phase = Some("forward".into());
        culprit.state.step = Some(3);
        let mut peer = end(Some(Exit::Code(1)));
        peer.rank = 0;
        peer.ended_at_s = Some(2.4);
        peer.state.phase = Some("allreduce".into());
        peer.state.step = Some(3);
        peer.state.error = Some("Connection closed by peer [127.0.0.1]:4000".into());
        let ranks = vec![classify_rank(&peer), classify_rank(&culprit)];
        let (outcome, first, v) = verdict(&Scenario::default(), &ranks, 3.0);
        assert_eq!((outcome, first), (OutcomeKind::Signaled, Some(1)));
        assert_eq!(
            v.headline,
            "Rank 1 was killed by SIGSEGV in `forward` at step 3. Rank 0 failed after it (collateral)."
        );
        let line = v.evidence.iter().find(|e| e.starts_with("collateral")).unwrap();
        assert_eq!(
            line,
            "collateral: rank 0 exited with status 1 in `allreduce` at step 3 0.40 s later: Connection closed by peer [127.0.0.1]:4000"
        );
    }

    #[test]
    fn a_dead_worker_is_the_culprit_and_the_rank_error_its_consequence() {
        let mut e = end(Some(Exit::Code(1)));
        e.rank = 1;
        e.state.phase = Some("data.next".into());
        e.state.step = Some(4);
        e.state.error = Some(
            "DataLoader worker (pid 4242) is killed by signal: Killed. [data-loader worker 0 of rank 1, fork]".into(),
        );
        let (outcome, first, v) = verdict(&Scenario::default(), &[classify_rank(&e)], 2.0);
        assert_eq!((outcome, first), (OutcomeKind::Exited, Some(1)));
        assert_eq!(
            v.headline,
            "Data-loader worker 0 (pid 4242) of rank 1 died first (is killed by signal: Killed.); rank 1 failed as \
             a consequence in `data.next` at step 4."
        );
        assert!(
            v.evidence.iter().any(|l| l.starts_with("culprit: data-loader worker 0 (pid 4242) of rank 1"))
        );
        assert!(v.likely_cause.unwrap().contains("OOM killer"));
        let exited = worker_death(
            "DataLoader worker (pid 7) exited unexpectedly with exit code 1. [data-loader worker 3 of rank 0, spawn]",
        )
        .unwrap();
        assert_eq!(
            (exited.id, exited.pid, exited.how.as_str()),
            (3, 7, "exited unexpectedly with exit code 1.")
        );
    }

    #[test]
    fn expectation_mismatches_are_listed_field_by_field() {
        let mut e = end(Some(Exit::Signal { signal: libc::SIGABRT, core_dumped: false }));
        e.state.phase = Some("backward".into());
        e.state.step = Some(2);
        let r = classify_rank(&e);
        let expect = Expect {
            outcome: OutcomeKind::Signaled,
            signal: Some("SIGSEGV".into()),
            phase: Some("forward".into()),
            step: Some(2),
            ..Default::default()
        };
        let diff = check_expectation(&expect, OutcomeKind::Signaled, Some(&r));
        assert_eq!(
            diff,
            vec!["expected signal `SIGSEGV`, got `SIGABRT`", "expected phase `forward`, got `backward`"]
        );
        let met =
            Expect { outcome: OutcomeKind::Signaled, signal: Some("abrt".into()), ..Default::default() };
        assert!(check_expectation(&met, OutcomeKind::Signaled, Some(&r)).is_empty());
    }
}
