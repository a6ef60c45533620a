//! Plain-text formatting shared by every renderer: counts, durations, rates, losses, outcome
//! phrases and shell quoting. Nothing here knows about markdown or terminals.

use crate::scenario::{Expect, Mode, OutcomeKind};
use crate::schema::{RankResult, ScenarioResult};

/// Stands in for a value that is absent.
pub(crate) const NONE: &str = "—";

/// `1 scenario`, `2 scenarios`: the count and the word in the right number.
pub(crate) fn count(n: usize, singular: &str, plural: &str) -> String {
    format!("{n} {}", if n == 1 { singular } else { plural })
}

/// [`count`] for words whose plural adds an `s`.
pub(crate) fn plural(n: usize, singular: &str) -> String {
    count(n, singular, &format!("{singular}s"))
}

/// Seconds for people: `0.35 s`, `4.2 s`, `2 min 05 s`, `1 h 02 min`.
pub(crate) fn secs(s: f64) -> String {
    if !s.is_finite() || s < 0.0 {
        return NONE.to_string();
    }
    if s < 1.0 {
        format!("{s:.2} s")
    } else if s < 60.0 {
        format!("{s:.1} s")
    } else if s < 3600.0 {
        let whole = s.round() as u64;
        format!("{} min {:02} s", whole / 60, whole % 60)
    } else {
        let mins = (s / 60.0).round() as u64;
        format!("{} h {:02} min", mins / 60, mins % 60)
    }
}

/// A number with `digits` significant digits, without trailing zeros: `2.303`, `0.0412`, `1.2e-5`.
pub(crate) fn sig(v: f64, digits: usize) -> String {
    if v.is_nan() {
        return "NaN".to_string();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.to_string();
    }
    if v == 0.0 {
        return "0".to_string();
    }
    let magnitude = v.abs().log10().floor() as i32;
    if !(-4..6).contains(&magnitude) {
        return format!("{v:.prec$e}", prec = digits.saturating_sub(1));
    }
    let decimals = (digits as i32 - 1 - magnitude).max(0) as usize;
    let text = format!("{v:.decimals$}");
    if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.').to_string() } else { text }
}

/// A loss value, or [`NONE`].
pub(crate) fn loss(v: Option<f64>) -> String {
    v.map_or_else(|| NONE.to_string(), |v| sig(v, 4))
}

/// A fraction as a percentage: `12%`, `0.5%`.
pub(crate) fn percent(fraction: f64) -> String {
    let p = fraction * 100.0;
    if p != 0.0 && p.abs() < 1.0 { format!("{p:.1}%") } else { format!("{p:.0}%") }
}

/// Cuts `s` to at most `max` characters, ending in `…` when it was longer.
pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Removes terminal control sequences (ANSI colours, OSC strings with their payload) and control
/// characters other than tab and newline: the one implementation, [`crate::secrets::strip_controls`].
pub(crate) fn strip_control(s: &str) -> String {
    crate::secrets::strip_controls(s, false).into_owned()
}

pub(crate) use crate::scenario::shell_line;

/// An argument longer than this is shown cut in a report's command lines.
const LONG_ARG: usize = 240;

/// A command line as a report shows it: [`shell_line`], with each argument over [`LONG_ARG`]
/// characters cut to its start and its length (one pasted config or prompt of 66,000 characters
/// filled the report past a GitHub comment's size, and the cut left only the title). The whole
/// command stays in `result.json` and `scenario.json`, which re-runs it.
pub(crate) fn display_line<S: AsRef<str>>(args: &[S]) -> String {
    let shown: Vec<String> = args
        .iter()
        .map(|a| {
            let a = a.as_ref();
            match a.char_indices().nth(LONG_ARG) {
                Some(_) => {
                    let head: String = a.chars().take(80).collect();
                    format!("{head}…[{} characters in all]", a.chars().count())
                }
                None => a.to_string(),
            }
        })
        .collect();
    shell_line(&shown)
}

/// How to run a scenario again: `ups-doctor run FILE --set a=b …`; for a command typed after
/// `--`, `ups-doctor run scenario.json` (the run folder's, with the `--set`s applied).
pub(crate) fn rerun_command(s: &ScenarioResult) -> String {
    if s.file == crate::scenario::COMMAND_LINE {
        return "ups-doctor run scenario.json".to_string();
    }
    let mut args = vec!["ups-doctor".to_string(), "run".to_string(), s.file.clone()];
    for o in &s.overrides {
        args.push("--set".to_string());
        args.push(o.clone());
    }
    shell_line(&args)
}

/// The launch mode as written in scenario files.
pub(crate) fn mode(m: Mode) -> &'static str {
    match m {
        Mode::Single => "single",
        Mode::Ddp => "ddp",
        Mode::Fsdp => "fsdp",
    }
}

/// The matrix's `mode` cell: the built-in trainer's mode, or how a command was launched
/// (`per_rank`, `launcher`).
pub(crate) fn launch_label(s: &crate::scenario::Scenario) -> &'static str {
    match (s.is_external(), s.launch.style) {
        (false, _) => mode(s.launch.mode),
        (true, crate::scenario::LaunchStyle::Auto) => "auto",
        (true, crate::scenario::LaunchStyle::PerRank) => "per_rank",
        (true, crate::scenario::LaunchStyle::Launcher) => "launcher",
    }
}

/// A short label for an outcome kind, for table cells next to a signal / exit-code column.
pub(crate) fn kind_label(kind: OutcomeKind) -> &'static str {
    match kind {
        OutcomeKind::Passed => "passed",
        OutcomeKind::FalseSuccess => "false success",
        OutcomeKind::Exited => "exited",
        OutcomeKind::Signaled => "killed by signal",
        OutcomeKind::Hung => "hung",
        OutcomeKind::TimedOut => "timed out",
        OutcomeKind::LaunchFailed => "failed to launch",
    }
}

/// An outcome as a phrase that names the signal or exit code: `killed by SIGSEGV`.
pub(crate) fn outcome_phrase(kind: OutcomeKind, signal: Option<&str>, exit_code: Option<i32>) -> String {
    match (kind, signal, exit_code) {
        (OutcomeKind::Signaled, Some(sig), _) => format!("killed by {sig}"),
        (OutcomeKind::Exited, _, Some(code)) => format!("exited with code {code}"),
        (OutcomeKind::Exited, _, None) => "exited with an error".to_string(),
        (OutcomeKind::FalseSuccess, _, _) => "false success".to_string(),
        (kind, _, _) => kind_label(kind).to_string(),
    }
}

/// Clock slack between a marker's writer and the harness, in seconds.
const CLOCK_SLACK_S: f64 = 0.05;

/// When the hang of rank `r` was declared (its last marker plus the silence that made it a hang),
/// in seconds since the scenario started, or `None` when the result does not tell it consistently:
/// results written before stack-dump markers stopped counting as progress have a last marker
/// after the hang was declared, and that sum lands after the rank ended (`ddp-uneven-steps` of
/// the examples: "no marker for 5.0 s (last marker at 7.8 s)" in a 7.86 s run). A moment after
/// the rank's end is never drawn or stated.
pub(crate) fn hang_declared_at(r: &RankResult, wall_s: f64) -> Option<f64> {
    let at = r.last_marker_at_s? + r.hang_detected_after_s?;
    let end = r.ended_at_s.map_or(wall_s, |e| e.min(wall_s));
    (at <= end + CLOCK_SLACK_S).then_some(at)
}

/// The rank that failed first, when there is one and it is among the results.
pub(crate) fn first_failed_rank(s: &ScenarioResult) -> Option<&RankResult> {
    let first = s.first_failure?;
    s.ranks.iter().find(|r| r.rank == first)
}

/// A scenario's outcome as a phrase, with the first failing rank's signal or exit code.
/// A run the user interrupted with no failure of its own is `interrupted`: its ranks' ends were
/// ups-doctor's teardown.
pub(crate) fn scenario_outcome(s: &ScenarioResult) -> String {
    if s.interrupted && s.first_failure.is_none() && s.outcome != OutcomeKind::Passed {
        return "interrupted".to_string();
    }
    let rank = first_failed_rank(s);
    let signal = rank.and_then(|r| r.signal).map(|s| s.name());
    outcome_phrase(s.outcome, signal.as_deref(), rank.and_then(|r| r.exit_code))
}

/// Where a rank stopped: `forward @ 3`, `dist.init`, or `None` without any phase.
pub(crate) fn rank_site(r: &RankResult) -> Option<String> {
    let phase = r.last_phase.as_deref()?;
    Some(match r.last_step {
        Some(step) => format!("{phase} @ {step}"),
        None => phase.to_string(),
    })
}

/// Where the scenario failed (the first failing rank's site), `None` when nothing failed.
pub(crate) fn failure_site(s: &ScenarioResult) -> Option<String> {
    if s.outcome == OutcomeKind::Passed {
        return None;
    }
    first_failed_rank(s).and_then(rank_site)
}

/// `met` or `NOT MET`, as the matrix and headings say it.
pub(crate) fn expectation_word(met: bool) -> &'static str {
    if met { "met" } else { "NOT MET" }
}

/// [`expectation_word`] of a scenario: one the user interrupted was neither.
pub(crate) fn expectation_of(s: &ScenarioResult) -> &'static str {
    if s.interrupted { "interrupted" } else { expectation_word(s.met_expectation) }
}

/// The expectation in words, with inline markdown code spans produced by `code`:
/// `killed by SIGSEGV, first on rank 1, in `forward` at step 3`.
pub(crate) fn describe_expect(e: &Expect, code: impl Fn(&str) -> String) -> String {
    let mut parts = vec![outcome_phrase(e.outcome, e.signal.as_deref(), e.exit_code)];
    if let Some(rank) = e.rank {
        parts.push(format!("first on rank {rank}"));
    }
    match (&e.phase, e.step) {
        (Some(phase), Some(step)) => parts.push(format!("in {} at step {step}", code(phase))),
        (Some(phase), None) => parts.push(format!("in {}", code(phase))),
        (None, Some(step)) => parts.push(format!("at step {step}")),
        (None, None) => {}
    }
    if let Some(message) = &e.message {
        parts.push(format!("with an error containing {}", code(message)));
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::shell_quote;

    #[test]
    fn count_uses_the_right_number() {
        assert_eq!(plural(0, "scenario"), "0 scenarios");
        assert_eq!(plural(1, "scenario"), "1 scenario");
        assert_eq!(plural(2, "scenario"), "2 scenarios");
        assert_eq!(count(1, "CPU", "CPUs"), "1 CPU");
    }

    #[test]
    fn seconds_read_naturally() {
        assert_eq!(secs(0.345), "0.34 s");
        assert_eq!(secs(4.25), "4.2 s");
        assert_eq!(secs(125.4), "2 min 05 s");
        assert_eq!(secs(3725.0), "1 h 02 min");
        assert_eq!(secs(f64::NAN), NONE);
    }

    #[test]
    fn significant_digits_drop_trailing_zeros() {
        assert_eq!(sig(1.234_567, 4), "1.235");
        assert_eq!(sig(0.041234, 4), "0.04123");
        assert_eq!(sig(1.5, 4), "1.5");
        assert_eq!(sig(1234.0, 4), "1234");
        assert_eq!(sig(0.0000123, 4), "1.230e-5");
        assert_eq!(sig(f64::NAN, 4), "NaN");
    }

    #[test]
    fn truncate_counts_characters_not_bytes() {
        assert_eq!(truncate("äöü", 3), "äöü");
        assert_eq!(truncate("äöüß", 3), "äö…");
    }

    #[test]
    fn control_characters_and_colours_are_removed() {
        assert_eq!(strip_control("\u{1b}[31merror\u{1b}[0m: x\r"), "error: x");
    }

    #[test]
    fn shell_quoting_leaves_plain_words_alone() {
        assert_eq!(shell_quote("train.steps=10"), "train.steps=10");
        assert_eq!(shell_quote("data.shm_size=\"64m\""), "'data.shm_size=\"64m\"'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
