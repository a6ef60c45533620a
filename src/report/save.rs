//! Saving a run's `result.json` and `report.md` when the disk is full: a result is never left
//! claiming more or less than happened, and room is made only from this run's own logs.

use std::path::{Path, PathBuf};

use crate::schema::RunResult;

use super::ReportError;
use super::files::{REPORT_FILE, RESULT_FILE, rerender, write_atomic, write_run};

/// What [`save_honestly`] could not write, after making what room it could. The report's error
/// is boxed: its largest form (an invalid `result.json`, read back) would make every `Result` of a
/// save as large.
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    /// `result.json` itself; `stale_kept` when the earlier one was kept as `result.stale.json`.
    #[error("failed to write the result: {source}{}", if *.stale_kept { STALE_KEPT } else { "" })]
    Result { source: Box<ReportError>, stale_kept: bool },
    /// The reports rendered from the result that was written (`result`, in `dir`).
    #[error(
        "wrote `{}`, but not the report: {source}; render it later with `ups-doctor report {}`",
        result.display(),
        dir.display()
    )]
    Report { result: PathBuf, dir: PathBuf, source: Box<ReportError> },
}

impl SaveError {
    /// The file system's error under the report's, when there is one (a full disk's `ENOSPC`).
    pub fn io(&self) -> Option<&std::io::Error> {
        match self {
            SaveError::Result { source, .. } | SaveError::Report { source, .. } => match &**source {
                ReportError::Write { source, .. }
                | ReportError::CreateDir { source, .. }
                | ReportError::Read { source, .. } => Some(source),
                _ => None,
            },
        }
    }
}

const STALE_KEPT: &str =
    "; the earlier result, which does not tell the whole run, is kept as `result.stale.json`";

/// Writes `result.json` and `report.md` (each to a temporary file, then renamed). When that
/// fails (a full disk), it does not leave an earlier `result.json` claiming the run ended there:
/// it makes room by cutting this run's largest logs (each ends with a note; files that were in
/// the folder before the run are never touched), then by removing the stale `report.md` (rendered
/// again from the result) and the stale `result.json` (the new one holds all it held) before
/// writing. The result lists every log cut (`logs_cut`: which, and from and to how many bytes).
/// If the result still cannot be written, the earlier one is kept as `result.stale.json`.
///
/// # Errors
///
/// What could not be written, with the path and the cause.
pub fn save_honestly(dir: &Path, run: &RunResult) -> Result<(), SaveError> {
    let mut run = run.clone();
    run.logs_cut = crate::harness::logs_cut(dir);
    if write_run(dir, &run).is_ok() {
        return Ok(());
    }
    let result_path = dir.join(RESULT_FILE);
    let report_path = dir.join(REPORT_FILE);
    // The list of cuts is taken again before each attempt, so that the result says all of them.
    let write_result = || {
        let mut run = run.clone();
        run.logs_cut = crate::harness::logs_cut(dir);
        let json = super::files::result_json(&run).expect("results serialise");
        write_atomic(&result_path, json.as_bytes())
    };
    let mut cut_logs = false;
    let mut written = with_room(dir, &mut cut_logs, write_result);
    if written.is_err() {
        let _ = std::fs::remove_file(&report_path);
        written = write_result();
    }
    if written.is_err() {
        let old = std::fs::read(&result_path).ok();
        let _ = std::fs::remove_file(&result_path);
        written = write_result();
        if written.is_err()
            && let Some(old) = old
        {
            let _ = crate::run_files::replace(&dir.join("result.stale.json"), &old);
        }
    }
    if let Err(source) = written {
        let _ = std::fs::remove_file(&report_path);
        let stale_kept = dir.join("result.stale.json").exists();
        return Err(SaveError::Result { source: Box::new(source), stale_kept });
    }
    // The result just written lists the cuts made so far.
    let mut listed = crate::harness::logs_cut(dir);
    let mut rendered = with_room(dir, &mut cut_logs, || rerender(dir));
    // Room made for the reports (report.md, trace.json, each scenario's report) cut more logs: the
    // result is written again to list them, and the reports rendered from it, with room made the
    // same way; each round only cuts what the last one could not hold, so this ends.
    while rendered.is_ok() && crate::harness::logs_cut(dir) != listed {
        listed = crate::harness::logs_cut(dir);
        rendered = with_room(dir, &mut cut_logs, || write_result().and_then(|()| rerender(dir)));
    }
    let cuts = crate::harness::logs_cut(dir);
    if cut_logs {
        let list: Vec<String> =
            cuts.iter().map(|c| format!("`{}` ({} → {} bytes)", c.path, c.from_bytes, c.to_bytes)).collect();
        eprintln!(
            "ups-doctor: warning: the disk of `{}` was full: this run's largest logs were cut (each ends with a note) to make room for the result: {}",
            dir.display(),
            list.join(", ")
        );
    }
    rendered.map(|_| ()).map_err(|source| {
        let _ = std::fs::remove_file(&report_path);
        SaveError::Report { result: result_path, dir: dir.to_path_buf(), source: Box::new(source) }
    })
}

/// `attempt`, again after cutting this run's largest logs each time it fails, while that frees
/// anything (each round halves the largest logs, so a few rounds at most).
fn with_room<T, E>(dir: &Path, cut: &mut bool, mut attempt: impl FnMut() -> Result<T, E>) -> Result<T, E> {
    let mut outcome = attempt();
    // ups-doctor's own files go before any of the program's output.
    if outcome.is_err() && remove_own_sites(dir) > 0 {
        outcome = attempt();
    }
    // Each pass halves the largest logs; keep cutting while that frees anything (a run of several
    // scenarios writes a report per scenario besides the result), so the loop ends by itself.
    loop {
        if outcome.is_ok() || crate::harness::make_room(dir, 1 << 20) == 0 {
            break;
        }
        *cut = true;
        outcome = attempt();
    }
    outcome
}

/// Removes the copies of ups-doctor's own `sitecustomize.py` that the run's scenarios put first
/// on their `PYTHONPATH` (the run's `python-site/`, and `N-name/python-site/` of runs made before
/// the scenarios shared one): needed only while a scenario ran, a copy of a file built into this
/// binary, about 56 KB each. Only a regular file identical to that copy goes (then its folder, if
/// empty). The bytes freed.
pub fn remove_own_sites(dir: &Path) -> u64 {
    let ours = crate::harness::plan::command::SITECUSTOMIZE.as_bytes();
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut freed = 0;
    let folders = std::iter::once(dir.to_path_buf()).chain(entries.flatten().map(|e| e.path()));
    for folder in folders {
        let site = folder.join("python-site");
        let file = site.join("sitecustomize.py");
        let is_file = std::fs::symlink_metadata(&file).is_ok_and(|m| m.file_type().is_file());
        let is_folder = std::fs::symlink_metadata(&site).is_ok_and(|m| m.file_type().is_dir());
        if is_folder
            && is_file
            && std::fs::read(&file).is_ok_and(|b| b == ours)
            && std::fs::remove_file(&file).is_ok()
        {
            freed += ours.len() as u64;
            let _ = std::fs::remove_dir(&site);
        }
    }
    freed
}
