//! Saving a run's result as it goes, honestly: on a full disk, room is made from this run's own
//! logs, and an earlier `result.json` is never left claiming the run ended there.

use std::path::Path;

use crate::Error;
use crate::harness;
use crate::report;
use crate::schema::RunResult;

/// Writes `result.json` and `report.md` (each to a temporary file, then renamed). When that
/// fails (a full disk), it does not leave an earlier `result.json` claiming the run ended there:
/// it makes room by cutting this run's largest logs (each ends with a note), then by removing the
/// stale `report.md` (rendered again from the result) and the stale `result.json` (the new one
/// holds all it held) before writing. If the result still cannot be written, the earlier one is
/// kept as `result.stale.json`, and the error names the path and the cause.
pub fn save_honestly(dir: &Path, run: &RunResult) -> Result<(), Error> {
    if report::write_run(dir, run).is_ok() {
        return Ok(());
    }
    let json = serde_json::to_string_pretty(run).expect("results serialise") + "\n";
    let result_path = dir.join(report::RESULT_FILE);
    let report_path = dir.join(report::REPORT_FILE);
    let write_result = || report::write_atomic(&result_path, json.as_bytes());
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
            let _ = std::fs::write(dir.join("result.stale.json"), old);
        }
    }
    if let Err(e) = written {
        let _ = std::fs::remove_file(&report_path);
        let kept = if dir.join("result.stale.json").exists() {
            "; the earlier result, which does not tell the whole run, is kept as `result.stale.json`"
        } else {
            ""
        };
        return Err(Error::Internal(format!("failed to write the result: {e}{kept}")));
    }
    let rendered = with_room(dir, &mut cut_logs, || report::rerender(dir));
    if cut_logs {
        eprintln!(
            "ups-doctor: warning: the disk of `{}` was full: the largest logs were cut (each ends with a note) to make room for the result",
            dir.display()
        );
    }
    rendered.map(|_| ()).map_err(|e| {
        let _ = std::fs::remove_file(&report_path);
        Error::Internal(format!(
            "wrote `{}`, but not the report: {e}; render it later with `ups-doctor report {}`",
            result_path.display(),
            dir.display()
        ))
    })
}

/// `attempt`, again after cutting this run's largest logs each time it fails, while that frees
/// anything (each round halves the largest logs, so a few rounds at most).
fn with_room<T, E>(dir: &Path, cut: &mut bool, mut attempt: impl FnMut() -> Result<T, E>) -> Result<T, E> {
    let mut outcome = attempt();
    // Each pass halves the largest logs; keep cutting while that frees anything (a run of several
    // scenarios writes a report per scenario besides the result), so the loop ends by itself.
    loop {
        if outcome.is_ok() || harness::make_room(dir, 1 << 20) == 0 {
            break;
        }
        *cut = true;
        outcome = attempt();
    }
    outcome
}
