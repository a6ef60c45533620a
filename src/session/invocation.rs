//! What every session shares: the run folder and whether what is written there is masked, and
//! where the running binary is.

use std::path::{Path, PathBuf};

use crate::Error;
use crate::report;
use crate::schema::RunResult;

/// The run folder of an invocation, and whether what is written there is masked for a public issue.
pub(super) struct Invocation {
    pub(super) out_dir: PathBuf,
    public: bool,
    home: Option<String>,
}

impl Invocation {
    pub(super) fn new(out_dir: &Path, public: bool) -> Invocation {
        Invocation { out_dir: out_dir.to_path_buf(), public, home: report::public::home() }
    }

    /// The result as it is written and printed: masked with `--public`.
    pub(super) fn shown(&self, result: &RunResult) -> Result<RunResult, Error> {
        if self.public {
            report::public::mask(result, self.home.as_deref())
                .map_err(|e| Error::Internal(format!("--public: {e}")))
        } else {
            Ok(result.clone())
        }
    }
}

/// The running `ups-doctor` binary: node agents are started as it, ranks of a built-in scenario
/// as the trainer beside it ([`crate::harness::trainer_program`]).
pub(super) fn current_exe() -> Result<PathBuf, Error> {
    std::env::current_exe()
        .map_err(|e| Error::Internal(format!("failed to locate the ups-doctor binary: {e}")))
}
