//! Terminal output: the matrix printed at the end of `ups-doctor run` (comfy-table) and the
//! machine description printed by `ups-doctor env`.

use std::fmt::Write;

use comfy_table::{CellAlignment, Color, ContentArrangement, Table, presets};

use crate::probe::env::EnvSummary;
use crate::schema::RunResult;

use super::environment;
use super::markup::Align;
use super::matrix::{self, Tone};
use super::text::NONE;

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
