//! The verdict a reader sees first.

use serde::{Deserialize, Serialize};

/// The verdict a reader sees first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// One sentence: what happened, where.
    pub headline: String,
    /// The evidence behind it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
    /// What this pattern usually means.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub likely_cause: Option<String>,
    /// What to try next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_step: Option<String>,
    /// The known failure pattern the evidence established (its stable id, listed in
    /// `docs/patterns.md`), absent when none did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// The culprit's key error line, with the innermost frame in the program's own code:
    /// `ValueError: bad sample (train.py:66 in __getitem__)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_line: Option<String>,
    /// The PyTorch document or issue that explains the pattern.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
}

impl Verdict {
    /// What a result holds until the judge concludes it: empty. Only a caller that hands the
    /// result to `diagnose::conclude` in the same function uses it (`tests/architecture.rs`).
    pub fn unjudged() -> Verdict {
        Verdict::default()
    }
}
