//! Live progress on the terminal while ranks run: a [`Listener`] of the supervisor's events.
//!
//! On a terminal: one status line, redrawn at most ten times a second, with each rank's phase,
//! step and loss. Otherwise (CI logs, pipes): a plain line every tenth of the steps. Nothing is
//! coloured, so `NO_COLOR` holds trivially; the final matrix decides colour on its own.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use crate::harness::RankState;
use crate::harness::run::events::{Listener, RunEvent};
use crate::schema::ScenarioResult;

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
}

impl Listener for Progress {
    fn tick_every(&self) -> Option<Duration> {
        (self.mode != ProgressMode::Quiet).then_some(EVERY)
    }

    fn event(&mut self, event: RunEvent) {
        match event {
            RunEvent::ScenarioStarted { name, ranks, steps } => {
                (self.name, self.steps) = (name.to_string(), steps);
                self.scenario_started(name, ranks);
            }
            RunEvent::Tick { at_s, states, .. } => {
                let name = std::mem::take(&mut self.name);
                self.update(&name, Duration::from_secs_f64(at_s), self.steps, states);
                self.name = name;
            }
            RunEvent::ScenarioFinished { .. } => self.scenario_finished(),
            _ => {}
        }
    }
}

impl Progress {
    pub fn new(mode: ProgressMode) -> Progress {
        Progress { mode, last_draw: None, reported_steps: Vec::new(), name: String::new(), steps: 0 }
    }

    pub fn mode(&self) -> ProgressMode {
        self.mode
    }

    fn scenario_started(&mut self, name: &str, ranks: u32) {
        self.reported_steps = vec![0; ranks as usize];
        self.last_draw = None;
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
                let parts: Vec<String> = ranks
                    .iter()
                    .enumerate()
                    .map(|(i, r)| format!("r{i} {}", describe(r, total_steps)))
                    .collect();
                let line = format!("  {name} {:>5.1}s  {}", elapsed.as_secs_f64(), parts.join(" | "));
                let width = terminal_width();
                let line: String = line.chars().take(width.saturating_sub(1)).collect();
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[K{line}");
                let _ = err.flush();
            }
            ProgressMode::Plain => {
                let every = (total_steps / 10).max(1);
                for (i, r) in ranks.iter().enumerate() {
                    let Some(reported) = self.reported_steps.get_mut(i) else { continue };
                    if r.steps_done >= *reported + every {
                        *reported = r.steps_done;
                        eprintln!(
                            "  {name} {:>5.1}s  rank {i}: {}",
                            elapsed.as_secs_f64(),
                            describe(r, total_steps)
                        );
                    }
                }
            }
        }
    }

    fn scenario_finished(&mut self) {
        if self.mode == ProgressMode::Live {
            eprint!("\r\x1b[K");
        }
    }
}

fn describe(r: &RankState, total_steps: u64) -> String {
    let phase = r.phase.as_deref().unwrap_or("starting");
    let loss = r.last_loss.map(|l| format!(" loss {l:.4}")).unwrap_or_default();
    format!("{phase} step {}/{total_steps}{loss}", r.steps_done)
}

fn terminal_width() -> usize {
    crate::harness::os::terminal_columns().unwrap_or(100)
}

/// `  ✓ name: headline [pattern]`, printed as each scenario ends.
pub fn scenario_line(r: &ScenarioResult) -> String {
    let mark = if r.interrupted {
        "-"
    } else if r.met_expectation {
        "✓"
    } else {
        "✗"
    };
    let pattern = r.verdict.pattern.as_deref().map(|p| format!(" [{p}]")).unwrap_or_default();
    format!("  {mark} {}: {}{pattern}", r.name, r.verdict.headline)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scenario_line_carries_the_mark_headline_and_pattern() {
        let mut r = crate::report::fixtures::segv();
        r.met_expectation = false;
        r.interrupted = false;
        let line = scenario_line(&r);
        assert!(line.starts_with("  ✗ "), "{line}");
        assert!(line.contains(&r.verdict.headline), "{line}");
    }
}
