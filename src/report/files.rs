//! The file edge of the report: `result.json`, `report.md` and `trace.json` in a run folder, each written to a
//! temporary file in the same folder, synced and renamed over the old one, so a crash or Ctrl-C
//! leaves either the old file or the new one, never a torn one.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::schema::RunResult;

use super::markdown::{is_summary, render_markdown, render_scenario_markdown, scenario_report_path};

pub use crate::schema::{REPORT_FILE, RESULT_FILE};

/// What can go wrong reading or writing a run folder.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The run folder, or the `result.json` in it, does not exist.
    #[error("`{}` not found: pass the folder of a run (it holds {RESULT_FILE} and {REPORT_FILE})", path.display())]
    NotFound { path: PathBuf },
    /// A file was given where the run folder was expected.
    #[error("`{}` is a file: pass the folder that holds it (`{}`)", path.display(), folder(path))]
    NotAFolder { path: PathBuf },
    /// The run folder could not be created.
    #[error("could not create the run folder `{}`: {source}: check its parent exists and is writable", path.display())]
    CreateDir { path: PathBuf, source: io::Error },
    /// A file could not be read.
    #[error("could not read `{}`: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    /// A file could not be written (or renamed into place).
    #[error("could not write `{}`: {source}: check the folder is writable and the disk not full", path.display())]
    Write { path: PathBuf, source: io::Error },
    /// `result.json` is not valid JSON or not a run result.
    #[error(
        "`{}:{line}:{column}`: not a valid run result{}: {message}{}",
        path.display(),
        if field.is_empty() || field == "." { String::new() } else { format!(" at `{field}`") },
        hint.as_deref().map(|h| format!("\nhint: {h}")).unwrap_or_default()
    )]
    InvalidJson {
        path: PathBuf,
        line: usize,
        column: usize,
        /// The JSON path of the offending value (`scenarios[0].outcome`), when known.
        field: String,
        /// serde's message, without its position.
        message: String,
        /// What to do about it, when there is something specific to say.
        hint: Option<String>,
    },
    /// The result could not be turned into JSON.
    #[error("could not encode the run result as JSON: {0}")]
    Encode(#[source] serde_json::Error),
}

fn folder(path: &Path) -> String {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| ".".to_string(), |p| p.display().to_string())
}

/// Writes `result.json` (pretty), `report.md` and `trace.json` into `dir`, creating it if missing, and returns
/// the path of `report.md`.
///
/// The report is rendered from the JSON just written, read back, so that it shows exactly what
/// `ups-doctor report` would render from the folder later.
///
/// # Errors
///
/// [`ReportError::CreateDir`] when the folder cannot be created, [`ReportError::Write`] when a
/// file cannot be written or renamed into place, [`ReportError::Encode`] when the result cannot
/// be encoded.
pub fn write_run(dir: &Path, run: &RunResult) -> Result<PathBuf, ReportError> {
    fs::create_dir_all(dir).map_err(|source| ReportError::CreateDir { path: dir.to_path_buf(), source })?;
    let json = result_json(run).map_err(ReportError::Encode)?;
    write_text_as_is(&dir.join(RESULT_FILE), &json)?;
    // JSON cannot hold every value a run may carry (a NaN loss is written as `null`); when the
    // text does not read back, the report still shows what the run had.
    match serde_json::from_str::<RunResult>(&json) {
        Ok(saved) => write_reports(dir, &saved),
        Err(_) => write_reports(dir, run),
    }
}

/// `result.json`'s text for `run` (pretty, ending in a newline), with every secret masked by the
/// one rule of [`crate::secrets`]: what is written to the run folder and printed by `--json`.
///
/// # Errors
///
/// The result cannot be encoded as JSON.
pub fn result_json(run: &RunResult) -> Result<String, serde_json::Error> {
    json_text(run, true)
}

pub use crate::secrets::json_text;

/// Writes the outgoing JSON document `doc` to `path` ([`json_text`], then [`write_atomic`]): the
/// file sink of every JSON record ups-doctor writes for a reader (`result.json`, `trace.json`,
/// `sweep.json`, the sweep's cache, `bisect.json`, `attach.json`).
///
/// # Errors
///
/// [`ReportError::Encode`] when it does not encode, [`ReportError::Write`] as [`write_atomic`].
pub fn write_json(path: &Path, doc: &impl serde::Serialize, pretty: bool) -> Result<(), ReportError> {
    write_text_as_is(path, &json_text(doc, pretty).map_err(ReportError::Encode)?)
}

/// Writes outgoing text (a report, a table) to `path` through the one rule for secrets
/// ([`crate::secrets::scrub`]): the file sink of every markdown file ups-doctor writes.
///
/// # Errors
///
/// As [`write_atomic`].
pub fn write_text(path: &Path, text: &str) -> Result<(), ReportError> {
    write_text_as_is(path, &crate::secrets::scrub(text))
}

/// Text that went through the rule already ([`json_text`]).
fn write_text_as_is(path: &Path, text: &str) -> Result<(), ReportError> {
    write_atomic(path, text.as_bytes())
}

/// `report.md` and, when it is a summary, each scenario's full report in its own folder.
/// Rendered from a masked result; the text is masked again (a result that did not read back is
/// rendered as it is): the secret values of `run` are learnt first ([`crate::secrets::learn`]).
fn write_reports(dir: &Path, run: &RunResult) -> Result<PathBuf, ReportError> {
    if let Ok(doc) = serde_json::to_value(run) {
        crate::secrets::learn(&doc);
    }
    if is_summary(run) {
        for i in 0..run.scenarios.len() {
            let path = dir.join(scenario_report_path(run, i));
            if let Some(parent) = path.parent() {
                crate::run_files::folder(parent)
                    .map_err(|source| ReportError::CreateDir { path: parent.to_path_buf(), source })?;
            }
            write_text(&path, &render_scenario_markdown(run, i))?;
        }
    }
    write_json(&dir.join(super::trace::TRACE_FILE), &super::trace::trace_value(run), false)?;
    let report = dir.join(REPORT_FILE);
    write_text(&report, &render_markdown(run))?;
    Ok(report)
}

/// What `ups-doctor report DIR --issue` shows: the text to paste (the run's `report.md`, never
/// longer than one GitHub comment) and the files to attach, relative to the run folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssueText {
    pub paste: String,
    pub attach: Vec<String>,
}

/// The text to paste into an issue for the run in `dir` and the files to attach with it: each
/// failed scenario's full report (when `report.md` is a summary), `result.json` and `trace.json`.
pub fn issue_text(run: &RunResult) -> IssueText {
    let mut attach = Vec::new();
    if is_summary(run) {
        for (i, s) in run.scenarios.iter().enumerate() {
            if !s.met_expectation || s.outcome != crate::scenario::OutcomeKind::Passed {
                attach.push(scenario_report_path(run, i));
            }
        }
    }
    attach.push(RESULT_FILE.to_string());
    attach.push(super::trace::TRACE_FILE.to_string());
    // Printed: the terminal's sink masks it ([`crate::output::write`]); masked here too for
    // callers that keep the text.
    IssueText { paste: crate::secrets::mask_rendered(&render_markdown(run), run).into_owned(), attach }
}

/// `ups-doctor report DIR`: reads `DIR/result.json`, re-renders `DIR/report.md` and returns its
/// path.
///
/// # Errors
///
/// [`ReportError::NotFound`] when the folder or its `result.json` is missing,
/// [`ReportError::NotAFolder`] when `dir` is a file, [`ReportError::Read`] or
/// [`ReportError::InvalidJson`] when `result.json` cannot be read or is not a run result,
/// [`ReportError::Write`] when `report.md` cannot be written.
pub fn rerender(dir: &Path) -> Result<PathBuf, ReportError> {
    rerender_masked(dir, false)
}

/// [`rerender`], with `--public` masking ([`super::public`]) when `public`: `result.json` is
/// rewritten masked too, so that the folder can be attached to an issue as it is. Secrets in
/// variables are redacted either way (a result of an older version may hold them).
pub fn rerender_masked(dir: &Path, public: bool) -> Result<PathBuf, ReportError> {
    let mut run = read_run(dir)?;
    if public {
        let path = dir.join(RESULT_FILE);
        run = super::public::mask(&run, super::public::home().as_deref())
            .map_err(|e| ReportError::Write { path, source: io::Error::other(e) })?;
        return write_run(dir, &run);
    }
    write_reports(dir, &run)
}

/// Reads and parses `DIR/result.json` (secrets in its variables redacted).
///
/// # Errors
///
/// As [`rerender`], less the write.
pub fn read_run(dir: &Path) -> Result<RunResult, ReportError> {
    if !dir.exists() {
        return Err(ReportError::NotFound { path: dir.to_path_buf() });
    }
    if !dir.is_dir() {
        return Err(ReportError::NotAFolder { path: dir.to_path_buf() });
    }
    let path = dir.join(RESULT_FILE);
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(ReportError::NotFound { path });
        }
        Err(source) => return Err(ReportError::Read { path, source }),
    };
    let text = String::from_utf8(bytes).map_err(|e| {
        let (line, column) = crate::scenario::invalid_utf8_position(&e);
        ReportError::InvalidJson {
            path: path.clone(),
            line,
            column,
            field: String::new(),
            message: "the file is not valid UTF-8 text".to_string(),
            hint: Some(format!("the file was damaged; run the scenarios again to get a new {RESULT_FILE}")),
        }
    })?;
    let mut run = parse(&path, &text)?;
    crate::probe::env::redact_variables(&mut run.environment.variables);
    // A result written by an older version may hold secrets the rule masks now.
    if let Ok(mut value) = serde_json::to_value(&run) {
        crate::secrets::mask_json(&mut value);
        if let Ok(masked) = serde_json::from_value(value) {
            run = masked;
        }
    }
    Ok(run)
}

fn parse(path: &Path, text: &str) -> Result<RunResult, ReportError> {
    let de = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner();
        let (line, column) = (inner.line(), inner.column());
        let full = inner.to_string();
        let suffix = format!(" at line {line} column {column}");
        let message = full.strip_suffix(&suffix).unwrap_or(&full).to_string();
        ReportError::InvalidJson {
            path: path.to_path_buf(),
            line,
            column,
            field,
            message,
            hint: version_hint(text, inner.is_syntax() || inner.is_eof()),
        }
    })
}

/// Says why a result may not read: a different ups-doctor wrote it, or the file was cut short.
fn version_hint(text: &str, broken_syntax: bool) -> Option<String> {
    if broken_syntax {
        return Some(format!(
            "the file is not complete JSON; if the run was cut short, run the scenarios again \
             to get a new {RESULT_FILE}"
        ));
    }
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    let written_by = value.get("tool_version")?.as_str()?;
    let this = env!("CARGO_PKG_VERSION");
    (written_by != this).then(|| {
        format!("it was written by ups-doctor {written_by}; this is {this}: re-render it with that version")
    })
}

/// Writes `bytes` to a new temporary file next to `path` (never through a link planted in a
/// reused folder: [`crate::run_files::replace`]), syncs it and renames it over `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    crate::run_files::replace(path, bytes)
        .map_err(|source| ReportError::Write { path: path.to_path_buf(), source })
}
