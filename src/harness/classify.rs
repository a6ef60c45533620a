//! Turns what was observed about each rank into outcomes, a verdict and the expectation check.
//! Pure functions over data: every rule here is unit-tested without processes.

use crate::protocol::{signal_name, signal_number};
use crate::scenario::{Expect, OutcomeKind, Scenario};

use crate::probe::env::human_bytes;

use super::process::Exit;
use super::result::{Leftovers, MemoryReport, RankResult, ShmAt, ThreadStack, Verdict};
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
    /// Log files that could not be written in full (`could not write `PATH`: CAUSE`).
    pub log_errors: Vec<String>,
    /// External commands: whether the completion evidence (`expect.completes_when`) was seen;
    /// `None` for the built-in trainer, whose evidence is its `done` marker.
    pub completed: Option<bool>,
    /// External commands: when the rank last wrote output.
    pub last_output_at: Option<f64>,
    /// Where the exit status came from, when the rank was not our child.
    pub exit_source: Option<String>,
    pub quotes: Vec<super::result::Quote>,
    pub dumps: Vec<super::result::ProcessDump>,
}

/// Classifies one rank's end.
pub fn classify_rank(end: &RankEnd) -> RankResult {
    let s = &end.state;
    let completed = end.completed.unwrap_or(s.done);
    let (outcome, signal, exit_code) = match (&end.launch_error, end.intervention, end.exit) {
        (Some(_), _, _) => (OutcomeKind::LaunchFailed, None, None),
        (None, Some(Intervention::Hung { .. }), _) => (OutcomeKind::Hung, None, None),
        (None, Some(Intervention::TimedOut), _) => (OutcomeKind::TimedOut, None, None),
        (None, None, Some(Exit::Code(0))) if completed => (OutcomeKind::Passed, None, Some(0)),
        (None, None, Some(Exit::Code(0))) => (OutcomeKind::FalseSuccess, None, Some(0)),
        (None, None, Some(Exit::Code(c))) => (OutcomeKind::Exited, None, Some(c)),
        (None, None, Some(Exit::Signal { signal, .. })) => {
            (OutcomeKind::Signaled, Some(signal_name(signal)), None)
        }
        // A launcher's rank that ended unseen: it ran, but how it ended is unknown.
        (None, None, None) if end.pid.is_some() && end.exit_source.is_some() => {
            (OutcomeKind::Exited, None, None)
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
        device: s.device.clone(),
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
        optimizer_state_bytes: s.optimizer_state_bytes,
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
        foreign_pids: s.foreign_pids.clone(),
        log_errors: end.log_errors.clone(),
        workers: s.workers.clone(),
        exit_source: end.exit_source.clone(),
        last_output_at_s: end.last_output_at,
        quotes: end.quotes.clone(),
        dumps: end.dumps.clone(),
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
pub(super) fn location(rank: &RankResult) -> String {
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
    // Ranks stuck out of step: the odd rank is known by where it waits, not by whose last marker
    // happened to arrive first (that is scheduling).
    let first = odd_rank_of_a_hang(ranks).or(first);
    if scenario.is_external() {
        return super::verdict_ext::verdict(scenario, ranks, first, wall_s);
    }
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
    add_collateral(failed, ranks, &mut headline, &mut evidence);
    (failed.outcome, Some(failed.rank), Verdict { headline, evidence, likely_cause, next_step })
}

/// Names the ranks that failed after the first one (collateral) in the headline and evidence.
pub(super) fn add_collateral(
    failed: &RankResult,
    ranks: &[RankResult],
    headline: &mut String,
    evidence: &mut Vec<String>,
) {
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
            (OutcomeKind::Exited, _) => match other.exit_code {
                Some(code) => format!("exited with status {code}"),
                None => "ended (its exit status was not observed)".to_string(),
            },
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
}

/// A run spending at least this share of its step time waiting for data is input-bound.
pub const INPUT_BOUND_SHARE: f64 = 0.5;
/// `/dev/shm` this full (used / total) counts as full when a bus error is judged.
const SHM_FULL_SHARE: f64 = 0.95;

/// What the memory samples and the leftovers add to a verdict: the `/dev/shm` figure behind a
/// bus error, an input-bound run, and what the run left behind.
pub fn annotate(
    verdict: &mut Verdict,
    scenario: &Scenario,
    ranks: &[RankResult],
    first_failure: Option<u32>,
    memory: Option<&MemoryReport>,
    leftovers: &Leftovers,
) {
    let failed = first_failure.and_then(|f| ranks.iter().find(|r| r.rank == f));
    if scenario.is_external()
        && let (Some(failed), Some(memory)) = (failed, memory)
        && let Some(line) = super::verdict_ext::shm_evidence(scenario, failed, memory)
    {
        verdict.evidence.push(line);
    } else if let (Some(failed), Some(memory)) = (failed, memory)
        && let Some((evidence, cause, next)) = bus_error_cause(scenario, failed, memory)
    {
        verdict.evidence.push(evidence);
        if let Some(cause) = cause {
            verdict.likely_cause = Some(cause);
            verdict.next_step = Some(next);
        }
    }
    if let Some(line) = input_bound(ranks) {
        if first_failure.is_none() {
            verdict.headline.push_str(&format!(" Input-bound: {line}."));
            verdict.next_step.get_or_insert_with(|| INPUT_BOUND_ADVICE.to_string());
        }
        verdict.evidence.push(format!("input-bound: {line}; {INPUT_BOUND_ADVICE_SHORT}"));
    }
    let ours: Vec<_> = leftovers.shm.iter().filter(|s| s.ours).collect();
    if !ours.is_empty() {
        let bytes: u64 = ours.iter().map(|s| s.allocated_bytes).sum();
        let removed = ours.iter().all(|s| s.removed);
        verdict.evidence.push(format!(
            "left {} in `/dev/shm` ({}){}",
            if ours.len() == 1 { "1 segment".to_string() } else { format!("{} segments", ours.len()) },
            human_bytes(bytes),
            if removed { ", removed by ups-doctor" } else { "; ups-doctor could not remove all of them" }
        ));
    }
    // Processes of an earlier, dead run (killed in its orphaned cgroup) are not this run's.
    let of_this_run: Vec<_> = leftovers.processes.iter().filter(|p| !p.earlier_run).collect();
    if !of_this_run.is_empty() {
        let n = of_this_run.len();
        verdict.evidence.push(format!(
            "{} of the run {} still alive after the ranks ended: {}",
            if n == 1 { "1 process".to_string() } else { format!("{n} processes") },
            if n == 1 { "was" } else { "were" },
            if of_this_run.iter().all(|p| p.killed) {
                "killed by ups-doctor"
            } else {
                "not all could be killed"
            }
        ));
    }
}

const INPUT_BOUND_ADVICE_SHORT: &str = "try more workers (`data.workers`) or a larger `data.prefetch`";
const INPUT_BOUND_ADVICE: &str = "The ranks wait for batches more than they compute: try more workers \
     (`data.workers`), a larger `data.prefetch`, or a faster cache (`data.cache`); a bigger batch only \
     makes each wait longer.";

/// `78% of step time waiting for data` (all ranks together), when that is at least
/// [`INPUT_BOUND_SHARE`].
pub fn input_bound(ranks: &[RankResult]) -> Option<String> {
    let shares: Vec<f64> = ranks.iter().filter_map(|r| r.data_wait_fraction).collect();
    if shares.is_empty() {
        return None;
    }
    let share = shares.iter().sum::<f64>() / shares.len() as f64;
    (share >= INPUT_BOUND_SHARE).then(|| format!("{:.0}% of step time waiting for data", share * 100.0))
}

/// For a rank killed by SIGBUS, or one whose data-loader worker was: the `/dev/shm` figure at
/// that moment (evidence), and when `/dev/shm` was full, PyTorch's diagnosis and what to do.
fn bus_error_cause(
    scenario: &Scenario,
    failed: &RankResult,
    memory: &MemoryReport,
) -> Option<(String, Option<String>, String)> {
    let worker_pid = failed.error.as_deref().and_then(bus_error_worker_pid);
    if failed.signal.as_deref() != Some("SIGBUS") && worker_pid.is_none() {
        return None;
    }
    let at_end: &ShmAt = memory.shm.at_rank_end.iter().find(|a| a.rank == failed.rank)?;
    // The rank measures `/dev/shm` the moment it notices a dead worker, before it removes its
    // ring: that figure, not the one after the rank cleaned up, is the one at the failure.
    let noticed = failed.error.as_deref().and_then(shm_held_when_noticed);
    let at = &match noticed {
        Some((used, total)) => ShmAt { used_bytes: used, total_bytes: total, ..at_end.clone() },
        None => at_end.clone(),
    };
    let who = match worker_pid {
        Some(pid) => {
            let id = memory.processes.iter().find(|p| p.pid == pid).and_then(|p| p.worker);
            match id {
                Some(id) => format!("worker {id} of rank {} (pid {pid})", failed.rank),
                None => format!("a data-loader worker of rank {} (pid {pid})", failed.rank),
            }
        }
        None => format!("rank {}", failed.rank),
    };
    let whose = match &scenario.data.shm_size {
        Some(size) if memory.shm.private => {
            format!("the run's private `/dev/shm` (`data.shm_size` = `{size}`)")
        }
        _ => "the machine's `/dev/shm`".to_string(),
    };
    let percent = if at.total_bytes > 0 { at.used_bytes as f64 / at.total_bytes as f64 } else { 0.0 };
    let evidence = format!(
        "{whose} was at {} ({:.0}%) when {who} was killed by SIGBUS at {:.2} s",
        used_of(at.used_bytes, at.total_bytes),
        percent * 100.0,
        at.t_s
    );
    let next = "Give `/dev/shm` more room: raise `data.shm_size` here, Docker's `--shm-size` (its default \
                is 64 MB) or a Kubernetes `emptyDir` with `medium: Memory`; or keep the dataset cache out \
                of shared memory (`data.cache: disk`), or use fewer `data.workers` or a smaller \
                `data.prefetch`."
        .to_string();
    let cause = (percent >= SHM_FULL_SHARE).then(|| {
        format!(
            "Out of shared memory: {whose} was full ({}) and the next page written to a shared \
             segment could not be backed, so the kernel sent SIGBUS to {who}. PyTorch reports the same \
             situation as \"DataLoader worker (pid N) is killed by signal: Bus error. It is possible that \
             dataloader's workers are out of shared memory. Please try to raise your shared memory limit.\"",
            used_of(at.used_bytes, at.total_bytes)
        )
    });
    Some((evidence, cause, next))
}

/// `(used, total)` from the rank's `… /dev/shm held USED of TOTAL bytes]` tag.
fn shm_held_when_noticed(error: &str) -> Option<(u64, u64)> {
    let rest = &error[error.find(crate::protocol::SHM_HELD)? + crate::protocol::SHM_HELD.len()..];
    let mut words = rest.split_whitespace();
    let used = words.next()?.parse().ok()?;
    (words.next()? == "of").then_some(())?;
    let total = words.next()?.parse().ok()?;
    Some((used, total))
}

/// The worker pid in PyTorch's `DataLoader worker (pid N) is killed by signal: Bus error.`
fn bus_error_worker_pid(error: &str) -> Option<u32> {
    if !error.contains("Bus error") {
        return None;
    }
    let rest = &error[error.find("worker (pid ")? + "worker (pid ".len()..];
    rest[..rest.find(')')?].trim().parse().ok()
}

/// `8.0 of 64.0 MiB`: both figures in the unit that suits the total.
pub fn used_of(used: u64, total: u64) -> String {
    let (div, unit) =
        if total >= 10 << 30 { ((1u64 << 30) as f64, "GiB") } else { ((1u64 << 20) as f64, "MiB") };
    let digits = if unit == "GiB" { 2 } else { 1 };
    format!("{:.digits$} of {:.digits$} {unit}", used as f64 / div, total as f64 / div)
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

pub(super) fn failure_time(rank: &RankResult) -> f64 {
    match rank.outcome {
        OutcomeKind::Hung => rank.last_marker_at_s.unwrap_or(0.0),
        _ => rank.ended_at_s.or(rank.last_marker_at_s).unwrap_or(f64::INFINITY),
    }
}

pub(super) fn signal_cause(signal: i32) -> String {
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

/// The only rank of `picked`, if there is exactly one.
fn alone(picked: Vec<&RankResult>) -> Option<&RankResult> {
    if picked.len() == 1 { picked.first().copied() } else { None }
}

/// Phases where a stuck rank waits for the other ranks.
const COLLECTIVE_PHASES: [&str; 5] =
    ["dist.init", "dist.barrier", "allreduce", "allgather", "reduce_scatter"];

/// When every failing rank hung and they wait in different places, the one that caused it: the
/// only rank stuck outside a collective (it holds the others up), else the only rank furthest
/// along, out of the training loop (`dist.barrier`, after its last step) or in a later step's
/// collective: it ran fewer steps or skipped a collective, and the others wait for it in one it
/// never joins. `None` when no single rank stands out.
fn odd_rank_of_a_hang(ranks: &[RankResult]) -> Option<&RankResult> {
    let failed: Vec<&RankResult> = ranks.iter().filter(|r| r.outcome != OutcomeKind::Passed).collect();
    if failed.len() < 2 || failed.iter().any(|r| r.outcome != OutcomeKind::Hung) {
        return None;
    }
    let waits = |r: &RankResult| r.last_phase.as_deref().is_some_and(|p| COLLECTIVE_PHASES.contains(&p));
    let outside: Vec<&RankResult> = failed.iter().copied().filter(|r| !waits(r)).collect();
    if !outside.is_empty() {
        return alone(outside);
    }
    let along = |r: &RankResult| (r.last_phase.as_deref() == Some("dist.barrier"), r.last_step.unwrap_or(0));
    let furthest = failed.iter().map(|r| along(r)).max()?;
    if failed.iter().all(|r| along(r) == furthest) {
        return None;
    }
    alone(failed.into_iter().filter(|r| along(r) == furthest).collect())
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

    fn hung_at(rank: u32, phase: &str, step: u64, last_marker_at_s: f64) -> RankResult {
        let mut e = end(Some(Exit::Signal { signal: libc::SIGKILL, core_dumped: false }));
        e.rank = rank;
        e.intervention = Some(Intervention::Hung { silence_s: 10.0 });
        e.state.phase = Some(phase.into());
        e.state.step = Some(step);
        e.state.last_marker_at = Some(last_marker_at_s);
        classify_rank(&e)
    }

    #[test]
    fn the_odd_rank_of_an_out_of_step_hang_is_named_by_where_it_waits_whoever_spoke_last() {
        // Rank 1 ran fewer steps and waits in the final barrier; rank 0 waits in step 4's
        // all-reduce. Which last marker arrived first is scheduling: both orders name rank 1.
        for (barrier_at, allreduce_at) in [(1.00, 1.02), (1.02, 1.00)] {
            let ranks =
                vec![hung_at(0, "allreduce", 4, allreduce_at), hung_at(1, "dist.barrier", 3, barrier_at)];
            let (outcome, first, v) = verdict(&Scenario::default(), &ranks, 12.0);
            assert_eq!((outcome, first), (OutcomeKind::Hung, Some(1)), "{barrier_at} vs {allreduce_at}");
            assert!(v.likely_cause.unwrap().contains("Rank 1 stopped first"));
        }
        // A rank that skipped a collective is a step ahead of the others.
        let ranks = vec![
            hung_at(0, "allreduce", 4, 1.0),
            hung_at(1, "allreduce", 5, 1.1),
            hung_at(2, "allreduce", 4, 1.2),
        ];
        assert_eq!(verdict(&Scenario::default(), &ranks, 12.0).1, Some(1));
        // A rank stuck by itself (outside any collective) holds the others up.
        let ranks = vec![hung_at(0, "allreduce", 4, 1.0), hung_at(1, "data.next", 4, 1.5)];
        assert_eq!(verdict(&Scenario::default(), &ranks, 12.0).1, Some(1));
        // Nobody stands out: the earliest last marker decides, as for any failure.
        let ranks = vec![hung_at(0, "allreduce", 4, 1.3), hung_at(1, "allreduce", 4, 1.1)];
        assert_eq!(verdict(&Scenario::default(), &ranks, 12.0).1, Some(1));
    }

    fn memory_at_end(rank: u32, used: u64, total: u64) -> MemoryReport {
        let mut m = MemoryReport::default();
        m.shm.private = true;
        m.shm.at_rank_end.push(ShmAt { rank, t_s: 2.02, used_bytes: used, total_bytes: total });
        m
    }

    #[test]
    fn a_bus_error_with_dev_shm_full_is_out_of_shared_memory() {
        let mut e = end(Some(Exit::Signal { signal: libc::SIGBUS, core_dumped: false }));
        e.state.phase = Some("forward".into());
        e.state.step = Some(2);
        let ranks = vec![classify_rank(&e)];
        let mut scenario = Scenario::default();
        scenario.data.shm_size = Some("8m".into());
        let (_, first, mut v) = verdict(&scenario, &ranks, 2.1);
        annotate(
            &mut v,
            &scenario,
            &ranks,
            first,
            Some(&memory_at_end(0, 8 << 20, 8 << 20)),
            &Leftovers::default(),
        );
        assert!(v.evidence.contains(
            &"the run's private `/dev/shm` (`data.shm_size` = `8m`) was at 8.0 of 8.0 MiB (100%) when rank 0 \
              was killed by SIGBUS at 2.02 s"
                .to_string()
        ), "{:#?}", v.evidence);
        let cause = v.likely_cause.unwrap();
        assert!(cause.starts_with("Out of shared memory"), "{cause}");
        assert!(cause.contains("Please try to raise your shared memory limit."), "{cause}");
        assert!(v.next_step.unwrap().contains("raise `data.shm_size`"));

        // Room left in /dev/shm: the figure is evidence, the generic SIGBUS cause stays.
        let (_, first, mut v) = verdict(&scenario, &ranks, 2.1);
        let before = v.likely_cause.clone();
        annotate(
            &mut v,
            &scenario,
            &ranks,
            first,
            Some(&memory_at_end(0, 1 << 20, 8 << 20)),
            &Leftovers::default(),
        );
        assert_eq!(v.likely_cause, before);
        assert!(v.evidence.iter().any(|e| e.contains("at 1.0 of 8.0 MiB (12%)")));
    }

    #[test]
    fn a_worker_bus_error_names_the_worker() {
        let mut e = end(Some(Exit::Code(1)));
        e.state.error = Some(
            "DataLoader worker (pid 4242) is killed by signal: Bus error. It is possible that dataloader's \
             workers are out of shared memory."
                .into(),
        );
        let ranks = vec![classify_rank(&e)];
        let mut memory = memory_at_end(0, 64 << 20, 64 << 20);
        memory.shm.private = false;
        memory.processes.push(crate::harness::ProcessMemory {
            rank: 0,
            role: "worker".into(),
            worker: Some(3),
            pid: 4242,
            command: "ups-doctor".into(),
            peak_rss_bytes: 0,
            peak_pss_bytes: 0,
            peak_uss_bytes: 0,
            peak_shared_bytes: 0,
        });
        let (_, first, mut v) = verdict(&Scenario::default(), &ranks, 2.1);
        annotate(&mut v, &Scenario::default(), &ranks, first, Some(&memory), &Leftovers::default());
        assert!(v.likely_cause.unwrap().contains("SIGBUS to worker 3 of rank 0 (pid 4242)"));
        assert!(v.evidence.iter().any(|e| e.starts_with("the machine's `/dev/shm` was at 64.0 of 64.0 MiB")));
    }

    #[test]
    fn a_run_waiting_mostly_for_data_is_input_bound() {
        let mut e = end(Some(Exit::Code(0)));
        e.state.done = true;
        e.state.data_ms = 78.0;
        e.state.compute_ms = 22.0;
        let ranks = vec![classify_rank(&e)];
        let (_, first, mut v) = verdict(&Scenario::default(), &ranks, 1.0);
        annotate(&mut v, &Scenario::default(), &ranks, first, None, &Leftovers::default());
        assert!(v.headline.ends_with(" Input-bound: 78% of step time waiting for data."), "{}", v.headline);
        assert!(v.next_step.unwrap().contains("more workers"));
        let mut quick = e.clone();
        quick.state.data_ms = 10.0;
        assert_eq!(input_bound(&[classify_rank(&quick)]), None);
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
