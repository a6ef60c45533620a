//! What a bisect produced, as plain data: `bisect.json` is this, and `bisect.md` is rendered
//! from it.

use serde::{Deserialize, Serialize};

use crate::probe::env::EnvSummary;
use crate::scenario::Scenario;

use super::search::{BoundaryEntry, ProbeVerdict};
use super::signature::Signature;

/// The whole result of one `ups-doctor bisect`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BisectRecord {
    pub tool_version: String,
    pub started_at: String,
    pub command: Vec<String>,
    /// The scenario file bisected, and the overrides applied to it.
    pub file: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<String>,
    pub original: Scenario,
    /// Ids of the components derived from `original`, in the order the search tries them (what a
    /// one-factor-at-a-time search would run once each).
    #[serde(default)]
    pub components: Vec<String>,
    /// The failure under study; `None` when the scenario did not fail while confirming.
    pub signature: Option<Signature>,
    /// Observed failure rate of the original scenario while confirming (1.0: every run).
    pub flaky: f64,
    pub is_flaky: bool,
    /// The confidence reached for every "passes" judgement.
    pub confidence: f64,
    /// Real runs made (cached observations are free).
    pub runs: usize,
    pub budget: usize,
    pub budget_exhausted: bool,
    /// The search stopped before it ended (the user interrupted it, or a probe could not be
    /// run): what it found so far, undecided; unanswered probes were neither counted nor cached.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unknown: Vec<String>,
    /// The 1-minimal failing scenario, ready to run (its `expect` is the failure).
    pub minimal: Scenario,
    /// A command's bisect (`bisect -- CMD`): `minimal` as the command line to paste into a shell,
    /// and the boundary in the program's own flags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimal_command: Option<super::MinimalCommand>,
    /// How `minimal` differs from the original.
    pub minimal_delta: Vec<String>,
    /// Components whose removal makes the failure disappear.
    pub boundary: Vec<String>,
    pub boundary_detail: Vec<BoundaryEntry>,
    /// Cuts that made the scenario fail in another way: reported, never taken.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub different_failures: Vec<DifferentFailure>,
    pub probes: Vec<ProbeRow>,
    pub environment: EnvSummary,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DifferentFailure {
    pub delta: Vec<String>,
    pub signature: Signature,
}

/// One probe of the search, real or answered from the cache.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeRow {
    /// The search stage: confirm, ladder, ddmin, halving, verify.
    pub stage: String,
    pub delta: Vec<String>,
    pub observation: Option<Signature>,
    pub verdict: ProbeVerdict,
    pub cached: bool,
    /// Wall time of the real run; absent for cached answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_s: Option<f64>,
    /// The real run's folder, relative to the bisect folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
}
