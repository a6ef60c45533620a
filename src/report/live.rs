//! Live progress on the terminal while ranks run: a [`Listener`] of the supervisor's events.
//!
//! On a terminal: one status line, redrawn at most ten times a second, with each rank's phase,
//! step and loss, and for a rank silent a while how long and when that becomes a hang. Otherwise
//! (CI logs, pipes): a plain line every tenth of the steps, and every rank's state at least every
//! 5 s. Nothing is coloured, so `NO_COLOR` holds trivially; the final matrix decides colour on its
//! own.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use crate::harness::RankState;
use crate::harness::run::events::{Listener, RunEvent};

/// How often the status line (or a plain line's check) is refreshed.
const EVERY: Duration = Duration::from_millis(250);

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// Redrawn status line (stderr is a terminal).
    Live,
    /// Plain lines.
    Plain,
    /// Nothing.
    Quiet,
}

impl ProgressMode {
    /// Live on a terminal, plain otherwise.
    pub fn detect() -> ProgressMode {
        if std::io::stderr().is_terminal() { ProgressMode::Live } else { ProgressMode::Plain }
    }
}

pub struct Progress {
    mode: ProgressMode,
    last_draw: Option<Instant>,
    reported_steps: Vec<u64>,
    /// The scenario being shown and the steps it trains.
    name: String,
    steps: u64,
    /// Seconds of silence after which a rank is declared hung (`limits.hang_after_s`).
    hang_after_s: Option<f64>,
    /// Plain mode: when (seconds into the scenario) the last line was printed.
    last_plain_s: f64,
}

/// Plain mode prints every rank's state at least this often, progress or not: a run that is
/// silent (starting, stuck) still shows it is alive, and how long it has been quiet.
const PLAIN_EVERY_S: f64 = 5.0;

/// A rank silent this long gets `silent N s, hang at H s` on the status line.
const SHOW_SILENCE_AFTER_S: f64 = 2.0;

impl Listener for Progress {
    fn tick_every(&self) -> Option<Duration> {
        (self.mode != ProgressMode::Quiet).then_some(EVERY)
    }

    fn event(&mut self, event: RunEvent) {
        match event {
            RunEvent::ScenarioStarted { name, ranks, steps, hang_after_s } => {
                (self.name, self.steps) = (name.to_string(), steps);
                self.scenario_started(name, ranks);
                self.hang_after_s = Some(hang_after_s);
            }
            RunEvent::Tick { at_s, states, .. } => {
                let name = std::mem::take(&mut self.name);
                self.update(&name, Duration::from_secs_f64(at_s), self.steps, states);
                self.name = name;
            }
            RunEvent::ScenarioFinished { .. } => self.scenario_finished(),
            // Declared: the threshold is no longer ahead, and a silent rank is not "not hung".
            RunEvent::Hung { .. } => self.hang_after_s = None,
            _ => {}
        }
    }
}

impl Progress {
    pub fn new(mode: ProgressMode) -> Progress {
        Progress {
            mode,
            last_draw: None,
            reported_steps: Vec::new(),
            name: String::new(),
            steps: 0,
            hang_after_s: None,
            last_plain_s: 0.0,
        }
    }

    pub fn mode(&self) -> ProgressMode {
        self.mode
    }

    fn scenario_started(&mut self, name: &str, ranks: u32) {
        self.reported_steps = vec![0; ranks as usize];
        self.last_draw = None;
        self.last_plain_s = 0.0;
        self.hang_after_s = None;
        if self.mode != ProgressMode::Quiet {
            eprintln!("▶ {name}: {ranks} {}", if ranks == 1 { "rank" } else { "ranks" });
        }
    }

    fn update(&mut self, name: &str, elapsed: Duration, total_steps: u64, ranks: &[&RankState]) {
        match self.mode {
            ProgressMode::Quiet => {}
            ProgressMode::Live => {
                if self.last_draw.is_some_and(|t| t.elapsed() < Duration::from_millis(100)) {
                    return;
                }
                self.last_draw = Some(Instant::now());
                let line = live_line(
                    name,
                    elapsed.as_secs_f64(),
                    total_steps,
                    ranks,
                    self.hang_after_s,
                    terminal_width(),
                );
                crate::output::write_styled(crate::output::Stream::Stderr, &format!("\r\x1b[K{line}"));
            }
            ProgressMode::Plain => {
                let now = elapsed.as_secs_f64();
                // Unknown total: only the time-based lines.
                let every = if total_steps == 0 { u64::MAX } else { (total_steps / 10).max(1) };
                let due = now - self.last_plain_s >= PLAIN_EVERY_S;
                // Ranks the run began to watch when the program formed a larger group.
                if self.reported_steps.len() < ranks.len() {
                    eprintln!(
                        "  {name} {now:>5.1}s  the program formed a process group of {} ranks: watching all {0}",
                        ranks.len()
                    );
                    self.reported_steps.resize(ranks.len(), 0);
                }
                for (i, r) in ranks.iter().enumerate() {
                    let Some(reported) = self.reported_steps.get_mut(i) else { continue };
                    if r.steps_done >= reported.saturating_add(every) || due {
                        *reported = (*reported).max(r.steps_done);
                        self.last_plain_s = now;
                        eprintln!(
                            "  {name} {now:>5.1}s  rank {i}: {}{}",
                            describe(r, total_steps),
                            silence(r, now, self.hang_after_s)
                        );
                    }
                }
            }
        }
    }

    fn scenario_finished(&mut self) {
        if self.mode == ProgressMode::Live {
            crate::output::write_styled(crate::output::Stream::Stderr, "\r\x1b[K");
        }
    }
}

/// A rank's phase, step and loss: `forward step 3/8 loss 0.4123`; `step 20` where the total is
/// not known (`total_steps` 0: a command's own program) or no phase is (the observer counts
/// steps but names no phase); `starting` before either.
fn describe(r: &RankState, total_steps: u64) -> String {
    let loss = r.last_loss.map(|l| format!(" loss {l:.4}")).unwrap_or_default();
    let step = match total_steps {
        0 => format!("step {}", r.steps_done),
        total => format!("step {}/{total}", r.steps_done),
    };
    match r.phase.as_deref() {
        Some(phase) => format!("{phase} {step}{loss}"),
        None if r.steps_done > 0 => format!("{step}{loss}"),
        None => format!("starting{loss}"),
    }
}

/// The live status line: each rank's phase, step and loss, and for a rank silent a while how long
/// and when that becomes a hang; cut to `width` columns.
pub fn live_line(
    name: &str,
    elapsed_s: f64,
    total_steps: u64,
    ranks: &[&RankState],
    hang_after_s: Option<f64>,
    width: usize,
) -> String {
    let parts: Vec<String> = ranks
        .iter()
        .enumerate()
        .map(|(i, r)| format!("r{i} {}{}", describe(r, total_steps), silence(r, elapsed_s, hang_after_s)))
        .collect();
    let line = format!("  {name} {elapsed_s:>5.1}s  {}", parts.join(" | "));
    line.chars().take(width.saturating_sub(1)).collect()
}

/// `, silent 3 s, hang at 60 s` for a rank whose last marker is that old; empty otherwise. Past
/// the threshold with no hang declared, CPU is still being used in the run (a rank is called hung
/// only once that stops too), and the line says so instead of a threshold already behind it.
fn silence(r: &RankState, now_s: f64, hang_after_s: Option<f64>) -> String {
    let Some(last) = r.last_marker_at else { return String::new() };
    let quiet = now_s - last;
    if quiet < SHOW_SILENCE_AFTER_S {
        return String::new();
    }
    match hang_after_s {
        Some(limit) if quiet >= limit => format!(", silent {quiet:.0} s, CPU in use: not hung"),
        Some(limit) => format!(", silent {quiet:.0} s, hang at {limit:.0} s"),
        None => format!(", silent {quiet:.0} s"),
    }
}

fn terminal_width() -> usize {
    crate::harness::os::terminal_columns().unwrap_or(100)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Marker;

    #[test]
    fn the_live_line_during_a_hang_shows_the_silence_and_the_threshold() {
        let mut stuck = RankState::default();
        stuck.apply(1.0, Marker::Begin { phase: "optimizer".into(), step: Some(2) });
        stuck.steps_done = 2;
        let mut busy = RankState::default();
        busy.apply(13.9, Marker::Begin { phase: "forward".into(), step: Some(5) });
        let line = live_line("hang-deadlock", 14.2, 8, &[&stuck, &busy], Some(60.0), 200);
        insta::assert_snapshot!(line, @"  hang-deadlock  14.2s  r0 optimizer step 2/8, silent 13 s, hang at 60 s | r1 forward step 0/8");
        assert!(live_line("hang-deadlock", 14.2, 8, &[&stuck, &busy], Some(60.0), 80).chars().count() < 80);
        // Past the threshold and not declared hung: CPU is in use in the run.
        let line = live_line("hang-deadlock", 14.2, 8, &[&stuck, &busy], Some(10.0), 200);
        insta::assert_snapshot!(line, @"  hang-deadlock  14.2s  r0 optimizer step 2/8, silent 13 s, CPU in use: not hung | r1 forward step 0/8");
    }

    #[test]
    fn a_commands_ranks_show_their_step_without_an_invented_total_or_phase() {
        let mut observed = RankState::default();
        observed.steps_done = 20;
        let waiting = RankState::default();
        let line = live_line("train", 4.0, 0, &[&observed, &waiting], None, 200);
        insta::assert_snapshot!(line, @"  train   4.0s  r0 step 20 | r1 starting");
    }
}
