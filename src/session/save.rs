//! Saving a run's result as it goes, honestly: on a full disk, room is made from this run's own
//! logs, and an earlier `result.json` is never left claiming the run ended there.

use std::path::Path;

use crate::Error;
use crate::report;
use crate::schema::RunResult;

/// Writes `result.json` and `report.md`, making room on a full disk from this run's own logs
/// ([`report::save_honestly`]).
pub fn save_honestly(dir: &Path, run: &RunResult) -> Result<(), Error> {
    Ok(report::save_honestly(dir, run)?)
}
