//! Terminal output: the matrix printed at the end of `ups-doctor run` (comfy-table) and the
//! machine description printed by `ups-doctor env`.

use std::fmt::Write;

use comfy_table::{CellAlignment, Color, ContentArrangement, Table, presets};

use crate::probe::env::EnvSummary;
use crate::schema::{RunResult, ScenarioResult};

use super::environment;
use super::markup::Align;
use super::matrix::{self, Tone};
use super::text::{self, NONE};

/// The terminal matrix: one row per scenario with its mode, ranks, outcome, where it failed
/// (`forward @ 3`), steps/s, wall time and whether it met its expectation (`met` / `NOT MET`);
/// scenarios left out by an interrupt follow as `not run`.
///
/// With `color`, the outcome cell is green for `passed` and red otherwise, and `NOT MET` is red;
/// pass `false` when `NO_COLOR` is set or the output is not a terminal. The text carries no
/// trailing newline.
pub fn render_matrix(run: &RunResult, color: bool) -> String {
    let mut table = Table::new();
    table
        .load_preset(presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(matrix::header(run));
    if color {
        table.enforce_styling();
    } else {
        table.force_no_tty();
    }
    for row in matrix::rows(run) {
        table.add_row(row.into_iter().map(|cell| {
            let styled = comfy_table::Cell::new(cell.text);
            match (color, cell.tone) {
                (true, Tone::Good) => styled.fg(Color::Green),
                (true, Tone::Bad) => styled.fg(Color::Red),
                _ => styled,
            }
        }));
    }
    for (i, align) in matrix::align(run).iter().enumerate() {
        if let (Some(column), Align::Right) = (table.column_mut(i), align) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    table.to_string()
}

/// [`render_matrix`] for a terminal `width` columns wide: the table when it fits, else the narrow
/// layout, two lines per scenario that never pass `width` (the scenario and its outcome, then
/// where, speed, wall time and the expectation, indented), cut with `…` where a value is longer.
pub fn render_matrix_fit(run: &RunResult, color: bool, width: usize) -> String {
    let table = render_matrix(run, false);
    if table.lines().all(|l| l.chars().count() <= width) {
        return if color { render_matrix(run, true) } else { table };
    }
    render_narrow(run, color, width)
}

/// The narrow layout of the matrix (see [`render_matrix_fit`]).
pub fn render_narrow(run: &RunResult, color: bool, width: usize) -> String {
    let header = matrix::header(run);
    let col = |name: &str| header.iter().position(|h| *h == name);
    let width = width.max(20);
    let paint = |text: String, tone: Tone| match (color, tone) {
        (true, Tone::Good) => format!("\u{1b}[32m{text}\u{1b}[0m"),
        (true, Tone::Bad) => format!("\u{1b}[31m{text}\u{1b}[0m"),
        _ => text,
    };
    let rows = matrix::rows(run);
    let len = |name: &str| {
        let i = col(name);
        rows.iter().filter_map(|r| i.map(|i| r[i].text.chars().count())).max().unwrap_or(0)
    };
    // The outcome keeps its room (up to 40 columns); the names share one column, cut to fit.
    let outcome_w = len("outcome").min(40).min(width / 2);
    let name_w = len("scenario").min(width.saturating_sub(outcome_w + 2)).max(8);
    let mut out = Vec::new();
    for row in &rows {
        let cell = |name: &str| col(name).map(|i| row[i].clone());
        let (Some(name), Some(outcome)) = (cell("scenario"), cell("outcome")) else { continue };
        let name_text = text::truncate(&name.text, name_w);
        let pad = name_w + 2 - name_text.chars().count();
        let outcome_text = text::truncate(&outcome.text, width.saturating_sub(name_w + 2));
        out.push(format!("{name_text}{}{}", " ".repeat(pad), paint(outcome_text, outcome.tone)));
        let mut facts: Vec<String> = Vec::new();
        for key in ["mode", "ranks", "where", "steps/s", GPU_COLUMN, "wall"] {
            let Some(c) = cell(key) else { continue };
            if c.text == NONE {
                continue;
            }
            facts.push(match key {
                "ranks" => format!("{} rank{}", c.text, if c.text == "1" { "" } else { "s" }),
                "where" => format!("at {}", c.text),
                "steps/s" => format!("{} steps/s", c.text),
                GPU_COLUMN => format!("GPU {}", c.text),
                _ => c.text,
            });
        }
        let expect = cell("expect").map(|c| (format!("expect {}", c.text), c.tone));
        let line = format!("  {}", facts.join(" · "));
        let expect_len = expect.as_ref().map_or(0, |(t, _)| t.chars().count() + 3);
        let line = text::truncate(&line, width.saturating_sub(expect_len));
        out.push(match expect {
            Some((t, tone)) => format!("{line} · {}", paint(t, tone)),
            None => line,
        });
    }
    out.join("\n")
}

/// The GPU column's title in [`matrix::header`].
const GPU_COLUMN: &str = matrix::GPU_TITLE;

/// The lines printed as each scenario ends: `✗ name: headline [pattern]`, then, for one that
/// failed or missed its expectation, its key line and the next step, indented; each line cut to
/// `width` columns.
pub fn render_verdict_lines(s: &ScenarioResult, width: usize) -> String {
    let mark = if s.interrupted {
        "-"
    } else if s.met_expectation {
        "✓"
    } else {
        "✗"
    };
    let headline = if s.verdict.headline.trim().is_empty() {
        text::scenario_outcome(s)
    } else {
        s.verdict.headline.clone()
    };
    let pattern = s.verdict.pattern.as_deref().map(|p| format!(" [{p}]")).unwrap_or_default();
    let mut lines = vec![format!("  {mark} {}: {headline}{pattern}", s.name)];
    let failed = s.outcome != crate::scenario::OutcomeKind::Passed || !s.met_expectation;
    if failed {
        if let Some(key) = &s.verdict.key_line {
            lines.push(format!("      key line: {}", text::strip_control(key).replace('\n', " ")));
        }
        if let Some(next) = &s.verdict.next_step {
            lines.push(format!(
                "      next step: {}",
                next.replace('`', "").split_whitespace().collect::<Vec<_>>().join(" ")
            ));
        }
    }
    lines.iter().map(|l| text::truncate(l, width.max(20))).collect::<Vec<_>>().join("\n")
}

/// What `ups-doctor env` prints: one `label  value` line per fact, then the relevant variables,
/// ending in a newline. Plain text, for reading and for pasting.
pub fn render_env_text(env: &EnvSummary) -> String {
    let rows = environment::rows(env);
    let width = rows.iter().map(|(label, _)| label.chars().count()).max().unwrap_or(0);
    let mut out = String::new();
    for (label, value) in rows {
        let value = value.unwrap_or_else(|| NONE.to_string());
        let _ = writeln!(out, "{label:<width$}  {value}");
    }
    if env.variables.is_empty() {
        let _ = writeln!(out, "\nvariables: none of {} is set", environment::VARIABLE_FAMILIES);
    } else {
        let _ = writeln!(out, "\nvariables");
        for (name, value) in &env.variables {
            let _ = writeln!(out, "  {name}={value}");
        }
    }
    out
}
