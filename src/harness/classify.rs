//! Turns what was observed about each rank into its outcome. Pure functions over data; judging
//! the outcomes (culprit, pattern, verdict, `expect`) is [`crate::diagnose`]'s job.

use crate::diagnose::key_line;
use crate::scenario::OutcomeKind;
use crate::schema::{ExitSource, IdentifiedBy, ObservedProgram, ProcessDump, Quote, RankResult, Signal};

use super::observe::state::RankState;
use super::os::process::Exit;

/// The error a process printed: the exception line of its last traceback (or the first line of
/// a C++ exception), not a hint printed after it.
fn error_line(lines: &[String]) -> Option<String> {
    key_line(lines).map(|k| k.text)
}

/// Why the harness ended a rank itself.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Intervention {
    /// No marker for `silence_s` seconds (≥ `hang_after_s`).
    Hung { silence_s: f64, at_s: f64 },
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
    pub torn_down_with: Option<Signal>,
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
    pub exit_source: Option<ExitSource>,
    /// A launcher's rank: how its process was found.
    pub identified_by: Option<IdentifiedBy>,
    pub quotes: Vec<Quote>,
    pub dumps: Vec<ProcessDump>,
    /// Ended by the time limit: its CPU time over its last silence.
    pub silent_cpu: Option<crate::schema::SilentCpu>,
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
            (OutcomeKind::Signaled, Some(Signal::from_number(signal)), None)
        }
        // A launcher's rank that ended unseen: it ran, but how it ended is unknown.
        (None, None, None) if end.pid.is_some() && end.exit_source.is_some() => {
            (OutcomeKind::Exited, None, None)
        }
        (None, None, None) => (OutcomeKind::LaunchFailed, None, None),
    };
    let error = end
        .launch_error
        .clone()
        .or_else(|| s.error.clone())
        .or_else(|| (outcome != OutcomeKind::Passed).then(|| error_line(&end.stderr_tail)).flatten());
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
            Some(Intervention::Hung { silence_s, .. }) => Some(silence_s),
            _ => None,
        },
        hung_at_s: match end.intervention {
            Some(Intervention::Hung { at_s, .. }) => Some(at_s),
            _ => None,
        },
        silent_cpu: end.silent_cpu.filter(|_| outcome == OutcomeKind::TimedOut),
        torn_down_with: end.torn_down_with,
        collateral: false,
        steps_done: s.steps_done,
        observed: s.observed.clone(),
        params_checksum: s.checksum.clone(),
        optimizer_state_bytes: s.optimizer_state_bytes,
        first_loss: s.first_loss,
        final_loss: s.last_loss,
        data_wait_fraction: s.data_wait_fraction(),
        losses: s.losses.clone(),
        step_ends_s: s.step_ends.clone(),
        timeline: closed_when_passed(&s.timeline, outcome, s.last_step_at),
        stdout_log: end.stdout_log.clone(),
        stderr_log: end.stderr_log.clone(),
        log_tail,
        markers: s.markers,
        bad_markers: s.bad_markers,
        dropped_markers: s.dropped_markers,
        foreign_pids: s.foreign_pids.clone(),
        log_errors: end.log_errors.clone(),
        workers: s.workers.clone(),
        exit_source: end.exit_source,
        identified_by: by_process_group(end.identified_by, s.observed.as_ref(), end.rank),
        last_output_at_s: end.last_output_at,
        quotes: end.quotes.clone(),
        dumps: end.dumps.clone(),
    }
}

/// A rank the process itself reported is credited to the process group it formed when the
/// observer saw `init_process_group` give it that rank: the program's own word, whoever sent the
/// first marker (the helper and the observer may both write).
fn by_process_group(
    by: Option<IdentifiedBy>,
    observed: Option<&ObservedProgram>,
    rank: u32,
) -> Option<IdentifiedBy> {
    let formed = observed.and_then(|o| o.group.as_ref()).is_some_and(|g| g.rank == rank);
    match by {
        Some(IdentifiedBy::Markers) if formed => Some(IdentifiedBy::ProcessGroup),
        other => other,
    }
}

/// A rank that passed finished training at its last step, even when a per-step phase began after
/// it (a program whose loop asks its data loader once more before it stops): `train` reopens on a
/// step's first phase so that a rank dying or hanging inside a step shows it never ended, and only
/// a rank that did not pass keeps it open.
fn closed_when_passed(
    timeline: &[crate::schema::PhaseSpan],
    outcome: OutcomeKind,
    last_step_at: Option<f64>,
) -> Vec<crate::schema::PhaseSpan> {
    let mut timeline = timeline.to_vec();
    if outcome == OutcomeKind::Passed
        && let Some(span) = timeline.iter_mut().rev().find(|p| p.phase == "train" && p.end_s.is_none())
    {
        span.end_s = last_step_at.or(Some(span.start_s));
    }
    timeline
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn train_stays_open_only_for_a_rank_that_did_not_pass() {
        use crate::schema::PhaseSpan;
        let open = [PhaseSpan { phase: "train".into(), start_s: 1.0, end_s: None }];
        assert_eq!(closed_when_passed(&open, OutcomeKind::Passed, Some(3.0))[0].end_s, Some(3.0));
        assert_eq!(closed_when_passed(&open, OutcomeKind::Hung, Some(3.0))[0].end_s, None);
    }

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
        let r = classify_rank(&end(Some(Exit::Signal { signal: Signal::SEGV.number(), core_dumped: false })));
        assert_eq!((r.outcome, r.signal), (OutcomeKind::Signaled, Some(Signal::SEGV)));
        let mut e = end(Some(Exit::Code(1)));
        e.stderr_tail = vec!["noise".into(), "error: injected failure".into(), "bye".into()];
        let r = classify_rank(&e);
        assert_eq!((r.outcome, r.exit_code), (OutcomeKind::Exited, Some(1)));
        assert_eq!(r.error.as_deref(), Some("error: injected failure"));
        let mut h = end(Some(Exit::Signal { signal: Signal::TERM.number(), core_dumped: false }));
        h.intervention = Some(Intervention::Hung { silence_s: 3.2, at_s: 9.5 });
        let r = classify_rank(&h);
        assert_eq!((r.outcome, r.hang_detected_after_s), (OutcomeKind::Hung, Some(3.2)));
        let mut l = end(None);
        l.launch_error = Some("No such file".into());
        assert_eq!(classify_rank(&l).outcome, OutcomeKind::LaunchFailed);
    }
}
