//! Renders a [`crate::schema::RunResult`]: the markdown report for a GitHub issue, the terminal
//! matrix, and the run folder (`result.json` + `report.md`); also the terminal description of the
//! machine for `ups-doctor env`.
//!
//! Renderers are pure functions from data to text ([`render_markdown`], [`render_matrix`],
//! [`render_env_text`]); the
//! only IO is the file edge ([`write_run`], [`rerender`]). `result.json` is the source of truth:
//! the markdown is always rendered from what it holds, so `ups-doctor report DIR` reproduces it.
//! This module never runs processes and never uses tch.
//!
//! Layout: `text` formats values (counts, durations, outcomes), `markup` escapes them for
//! markdown and HTML, `matrix` is the one table shape that the terminal (`terminal`) and the
//! markdown report (`markdown`) both show, `environment` is the same for the machine, `memory`
//! writes the memory and leftovers sections, `mermaid` draws the charts, `files` reads and writes
//! the run folder; `trace` writes the run's timeline for Perfetto (`trace.json`).

mod bisect;
mod bundle;
mod environment;
mod files;
mod flight_dumps;
mod gpu;
pub mod live;
mod markdown;
mod markup;
mod matrix;
mod memory;
mod mermaid;
mod save;
mod stack;
mod sweep;
mod terminal;
mod text;
mod trace;

#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod schema_doc_tests;
#[cfg(test)]
mod tests;

pub mod public;
pub use bisect::{render_bisect, write_bisect_md};
pub use bundle::{BUNDLE_FILE, Bundle, write_bundle};
pub use files::{
    IssueText, REPORT_FILE, RESULT_FILE, ReportError, issue_text, json_text, read_run, rerender,
    rerender_masked, result_json, write_atomic, write_json, write_run, write_text,
};
pub use flight_dumps::{Dump as FlightDump, FLIGHT_REPORT_FILE, read_dumps, render as render_flight_dumps};
pub use markdown::{
    is_summary, render_env_markdown, render_markdown, render_scenario_markdown, scenario_report_path,
};
pub use save::{SaveError, remove_own_sites, save_honestly};
pub use sweep::{render_sweep, render_sweep_table, verdict_lines};
pub use terminal::{render_env_text, render_matrix, render_matrix_fit, render_narrow, render_verdict_lines};
pub use trace::{TRACE_FILE, render_trace};
