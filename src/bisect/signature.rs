//! What "the same failure" means to bisect.
//!
//! A cut is only taken when the cut-down scenario fails *the same way* as the original: the same
//! outcome class, the same signal or exit code, in a process of the same role, in the same phase.
//! "Any failure" is not enough: a cut that turns a segfault in `forward` into a hang in
//! `data.next` has found a different bug, and is reported as such instead of being followed.

use serde::{Deserialize, Serialize};

use crate::scenario::OutcomeKind;
use crate::schema::{ProcessRole, Signal};

/// The identity of a failure, as far as bisect compares failures.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Signature {
    /// How the failing process ended.
    pub outcome: OutcomeKind,
    /// The signal (`SIGSEGV`), for `signaled`.
    pub signal: Option<Signal>,
    /// The exit status, for `exited`.
    pub exit_code: Option<i32>,
    /// The role of the failing process: `rank` today, `worker` once data-loader workers land.
    pub role: ProcessRole,
    /// The failing process's last phase (`forward`, `model.build/conditioner`).
    pub phase: Option<String>,
}

impl Signature {
    /// One line for reports: "signaled SIGSEGV in a rank at `forward`",
    /// "exited with code 1 in a rank at `backward`", "hung in a worker". Which rank is not part of
    /// the failure's identity: a cut of the rank count moves it.
    pub fn describe(&self) -> String {
        let mut out = match self.outcome {
            OutcomeKind::FalseSuccess => "false success".to_string(),
            OutcomeKind::TimedOut => "timed out".to_string(),
            OutcomeKind::LaunchFailed => "launch failed".to_string(),
            other => other.as_str().to_string(),
        };
        if let Some(signal) = self.signal {
            out.push(' ');
            out.push_str(&signal.name());
        }
        if let Some(code) = self.exit_code {
            out.push_str(&format!(" with code {code}"));
        }
        match self.role {
            ProcessRole::Other => out.push_str(" in a process"),
            role => out.push_str(&format!(" in a {role}")),
        }
        if let Some(phase) = &self.phase {
            out.push_str(&format!(" at `{phase}`"));
        }
        out
    }
}

/// What one run of a candidate showed: `None` means the run passed, `Some` the failure it had.
pub type Observation = Option<Signature>;

#[cfg(test)]
mod tests {
    use super::*;

    fn signature(outcome: OutcomeKind) -> Signature {
        Signature { outcome, signal: None, exit_code: None, role: ProcessRole::Rank, phase: None }
    }

    #[test]
    fn describe_reads_as_one_phrase() {
        let segv = Signature {
            signal: Some(Signal::SEGV),
            phase: Some("forward".into()),
            ..signature(OutcomeKind::Signaled)
        };
        assert_eq!(segv.describe(), "signaled SIGSEGV in a rank at `forward`");
        let exited = Signature {
            exit_code: Some(1),
            phase: Some("backward".into()),
            ..signature(OutcomeKind::Exited)
        };
        assert_eq!(exited.describe(), "exited with code 1 in a rank at `backward`");
        assert_eq!(signature(OutcomeKind::TimedOut).describe(), "timed out in a rank");
        assert_eq!(
            Signature { role: ProcessRole::Worker, ..signature(OutcomeKind::Hung) }.describe(),
            "hung in a worker"
        );
        let other = Signature { role: ProcessRole::Other, ..signature(OutcomeKind::Exited) };
        assert_eq!(other.describe(), "exited in a process");
    }

    #[test]
    fn signatures_that_differ_in_any_part_are_different_failures() {
        let a = Signature { phase: Some("forward".into()), ..signature(OutcomeKind::Hung) };
        let b = Signature { phase: Some("backward".into()), ..signature(OutcomeKind::Hung) };
        assert_ne!(a, b);
        assert_ne!(a, Signature { role: ProcessRole::Worker, ..a.clone() });
        assert_eq!(a, a.clone());
    }
}
