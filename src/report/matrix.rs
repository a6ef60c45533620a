//! The scenario matrix: one row per scenario (and per scenario that did not run), as plain text
//! cells with a tone. The terminal renders it with comfy-table, the markdown report as a table,
//! so both always show the same columns.

use crate::scenario::OutcomeKind;
use crate::schema::RunResult;

use super::markup::Align;
use super::text::{self, NONE};

/// How a cell should stand out where colour is available.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tone {
    Plain,
    Good,
    Bad,
}

/// One cell: plain text (not markdown) and its tone.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cell {
    pub text: String,
    pub tone: Tone,
}

impl Cell {
    fn plain(text: impl Into<String>) -> Cell {
        Cell { text: text.into(), tone: Tone::Plain }
    }
}

/// Column titles of the matrix.
pub(crate) const HEADER: [&str; 8] =
    ["scenario", "mode", "ranks", "outcome", "where", "steps/s", "wall", "expect"];

/// Column alignment: numbers to the right.
pub(crate) const ALIGN: [Align; 8] = [
    Align::Left,
    Align::Left,
    Align::Right,
    Align::Left,
    Align::Left,
    Align::Right,
    Align::Right,
    Align::Left,
];

/// Title of the column added when some scenario sampled a GPU: median and peak utilisation.
pub(crate) const GPU_TITLE: &str = "GPU util (median / peak)";
/// Where it goes: after `steps/s`.
const GPU_AT: usize = 6;

/// Whether the matrix has the GPU column: only runs that sampled a GPU show it.
fn gpu_column(run: &RunResult) -> bool {
    run.scenarios
        .iter()
        .any(|s| s.gpu.as_ref().is_some_and(|g| g.main_gpu().is_some_and(|m| m.util_percent.is_some())))
}

/// Column titles of this run's matrix.
pub(crate) fn header(run: &RunResult) -> Vec<&'static str> {
    let mut h = HEADER.to_vec();
    if gpu_column(run) {
        h.insert(GPU_AT, GPU_TITLE);
    }
    h
}

/// Column alignment of this run's matrix.
pub(crate) fn align(run: &RunResult) -> Vec<Align> {
    let mut a = ALIGN.to_vec();
    if gpu_column(run) {
        a.insert(GPU_AT, Align::Right);
    }
    a
}

/// `91% / 100%`: the main GPU's median and peak utilisation.
fn gpu_cell(s: &crate::schema::ScenarioResult) -> String {
    s.gpu
        .as_ref()
        .and_then(|g| g.main_gpu())
        .and_then(|m| m.util_percent)
        .map_or_else(|| NONE.to_string(), |u| format!("{:.0}% / {:.0}%", u.median, u.peak))
}

/// The rows of the matrix, in run order, then the scenarios that did not run.
pub(crate) fn rows(run: &RunResult) -> Vec<Vec<Cell>> {
    let gpu = gpu_column(run);
    let mut rows: Vec<Vec<Cell>> = run
        .scenarios
        .iter()
        .map(|s| {
            let outcome_tone = if s.outcome == OutcomeKind::Passed { Tone::Good } else { Tone::Bad };
            let mut row = vec![
                Cell::plain(&s.name),
                // The style a command ran with (`auto` resolved), else as the file says.
                Cell::plain(
                    s.external.as_ref().map_or(text::launch_label(&s.scenario), |e| e.style.as_str()),
                ),
                Cell::plain(s.scenario.launch.world_size.to_string()),
                Cell { text: text::scenario_outcome(s), tone: outcome_tone },
                Cell::plain(text::failure_site(s).unwrap_or_else(|| NONE.to_string())),
                Cell::plain(s.steps_per_s.map_or_else(|| NONE.to_string(), |v| format!("{v:.2}"))),
                Cell::plain(text::secs(s.wall_s)),
                Cell {
                    text: text::expectation_of(s).to_string(),
                    tone: if s.met_expectation || s.interrupted { Tone::Plain } else { Tone::Bad },
                },
            ];
            if gpu {
                row.insert(GPU_AT, Cell::plain(gpu_cell(s)));
            }
            row
        })
        .collect();
    for name in &run.not_run {
        let mut row = vec![Cell::plain(name)];
        row.extend([NONE, NONE, "not run", NONE, NONE, NONE, NONE].map(Cell::plain));
        if gpu {
            row.insert(GPU_AT, Cell::plain(NONE));
        }
        rows.push(row);
    }
    rows
}
