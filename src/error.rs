//! ups-doctor's own failures, as one error type, each mapped to an exit status of [`crate::exit`].
//! A rank's failure is not here: it is an outcome in the result (see [`crate::schema`]), and
//! decides only between [`crate::exit::MET`] and [`crate::exit::NOT_MET`].

use std::path::PathBuf;

use crate::bisect::SessionError;
use crate::exit;
use crate::harness::HarnessError;
use crate::report::{ReportError, SaveError};
use crate::scenario::ScenarioError;

/// Everything that can stop an `ups-doctor` command, with the exit status it maps to.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// One scenario file or `--set` that does not load.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    /// Every scenario file of the invocation that does not load, reported together.
    #[error("{}", join(.0))]
    Scenarios(Vec<ScenarioError>),
    /// Input refused before anything ran: a flag's value, `--out`, a scenario this machine
    /// cannot run. The message says what to change.
    #[error("{0}")]
    BadInput(String),
    /// The harness could not prepare or contain a scenario.
    #[error(transparent)]
    Harness(#[from] HarnessError),
    /// A run folder could not be read (the user's input) or written (ours).
    #[error(transparent)]
    Report(#[from] ReportError),
    /// A run's result or report could not be saved, even after making room.
    #[error(transparent)]
    Save(#[from] SaveError),
    /// The bisect machinery failed.
    #[error(transparent)]
    Bisect(#[from] SessionError),
    /// A file or folder ups-doctor needed could not be made or used.
    #[error("failed to {what} `{}`: {source}", path.display())]
    Io { what: &'static str, path: PathBuf, source: std::io::Error },
    /// Any other failure of ups-doctor itself, in words.
    #[error("{0}")]
    Internal(String),
}

fn join(errors: &[ScenarioError]) -> String {
    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("\nerror: ")
}

impl Error {
    /// The exit status this error ends the command with: [`exit::BAD_INPUT`] for the user's input
    /// (a run folder that is missing or not a result is input too), [`exit::INTERNAL`] otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Scenario(_) | Error::Scenarios(_) | Error::BadInput(_) => exit::BAD_INPUT,
            Error::Report(
                ReportError::Write { .. } | ReportError::CreateDir { .. } | ReportError::Encode(_),
            ) => exit::INTERNAL,
            Error::Report(_) => exit::BAD_INPUT,
            Error::Harness(_) | Error::Save(_) | Error::Bisect(_) | Error::Io { .. } | Error::Internal(_) => {
                exit::INTERNAL
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_users_input_is_exit_2_and_our_own_failures_exit_3() {
        let scenario = ScenarioError {
            file: "s.json".into(),
            line: Some(3),
            column: Some(5),
            field: Some("train.steps".into()),
            message: "expected an integer".into(),
            hint: None,
            from_override: None,
        };
        assert_eq!(Error::from(scenario.clone()).exit_code(), exit::BAD_INPUT);
        let both = Error::Scenarios(vec![scenario.clone(), scenario]);
        assert_eq!(both.exit_code(), exit::BAD_INPUT);
        assert_eq!(both.to_string().matches("\nerror: ").count(), 1, "{both}");
        let missing = Error::from(ReportError::NotFound { path: "runs/x".into() });
        assert_eq!(missing.exit_code(), exit::BAD_INPUT);
        let unwritable = Error::from(ReportError::Write {
            path: "runs/x/report.md".into(),
            source: std::io::Error::from(std::io::ErrorKind::StorageFull),
        });
        assert_eq!(unwritable.exit_code(), exit::INTERNAL);
        let unsaved = Error::from(SaveError::Result {
            source: Box::new(ReportError::Write {
                path: "runs/x/result.json".into(),
                source: std::io::Error::from(std::io::ErrorKind::StorageFull),
            }),
            stale_kept: true,
        });
        assert_eq!(unsaved.exit_code(), exit::INTERNAL);
        assert!(unsaved.to_string().ends_with("is kept as `result.stale.json`"), "{unsaved}");
        let io = Error::Io {
            what: "create",
            path: "reports/runs".into(),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        };
        assert_eq!(io.exit_code(), exit::INTERNAL);
        assert!(io.to_string().starts_with("failed to create `reports/runs`: "), "{io}");
    }

    #[test]
    fn the_help_table_lists_every_exit_status() {
        for code in [exit::MET, exit::NOT_MET, exit::BAD_INPUT, exit::INTERNAL, exit::INTERRUPTED] {
            assert!(exit::HELP.lines().any(|l| l.trim_start().starts_with(&format!("{code} "))), "{code}");
        }
    }
}
