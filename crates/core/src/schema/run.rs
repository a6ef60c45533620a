//! One invocation's result and each scenario's in it: the top of `result.json`.

use serde::{Deserialize, Serialize};

use super::env::EnvSummary;
use super::gpu::GpuReport;
use super::memory::{CgroupReport, GpuXid, Leftovers, MemoryReport, OomKill};
use super::process::{ExternalRun, RankResult};
use super::verdict::Verdict;
use crate::scenario::{OutcomeKind, Scenario};

/// Everything one `ups-doctor run` invocation produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    pub tool_version: String,
    /// Wall-clock start, RFC 3339 (display only).
    pub started_at: String,
    /// The command line, for re-running.
    pub command: Vec<String>,
    pub environment: EnvSummary,
    /// One entry per scenario, written as each one ends.
    pub scenarios: Vec<ScenarioResult>,
    /// Scenarios that were planned but not run because the user interrupted the run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_run: Vec<String>,
    #[serde(default)]
    pub interrupted: bool,
    /// ups-doctor itself could not go on (a scenario's folder could not be prepared: disk full,
    /// …): why, in one line. The scenarios after it are in `not_run`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<String>,
    /// Logs of this run that ups-doctor cut to make room for this result on a full disk (never a
    /// file that was in `--out` before the run).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logs_cut: Vec<LogCut>,
}

/// One log of the run cut short to make room for the result on a full disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogCut {
    /// Relative to the run folder.
    pub path: String,
    /// Its length when first cut.
    pub from_bytes: u64,
    /// Its length now (a note saying so included).
    pub to_bytes: u64,
}

/// One scenario's end: its outcome, the verdict, and every rank's evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScenarioResult {
    pub name: String,
    /// The scenario file, as given on the command line.
    pub file: String,
    /// The `--set` overrides applied on top of the file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<String>,
    /// The fully resolved scenario that ran.
    pub scenario: Scenario,
    /// The first failure's outcome, or `passed`.
    pub outcome: OutcomeKind,
    pub met_expectation: bool,
    /// The user stopped it (Ctrl-C, SIGTERM) before it ended on its own: what it had by then is
    /// kept, but it is neither a pass nor a failure of its `expect`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
    /// Why the outcome did not meet `expect`, one line per differing field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expectation_mismatches: Vec<String>,
    pub verdict: Verdict,
    /// The rank that failed first, if any failed.
    pub first_failure: Option<u32>,
    pub ranks: Vec<RankResult>,
    pub wall_s: f64,
    /// Optimizer steps per second over the training loop (rank 0), when it trained.
    pub steps_per_s: Option<f64>,
    /// Samples per second over the training loop, all ranks together.
    pub samples_per_s: Option<f64>,
    /// Memory and `/dev/shm` sampled through the run (absent in results of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryReport>,
    /// `/dev/shm` files and processes the run left behind, and what ups-doctor did about them.
    #[serde(default)]
    pub leftovers: Leftovers,
    /// GPU activity sampled through the run (NVML), or why it could not be; absent when the
    /// scenario's ranks train on the CPU by choice (`device: cpu`) or sampling is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuReport>,
    /// An external command's run: the argv and how it launched (absent for the built-in trainer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<ExternalRun>,
    /// The cgroup the scenario's processes ran in, with its memory limit and OOM-kill counter;
    /// absent where none could be made (and none was asked for) or in results of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<CgroupReport>,
    /// Processes of the scenario the kernel's OOM killer ended, as the cgroup and the kernel log
    /// recorded them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub oom_kills: Vec<OomKill>,
    /// Xids the NVIDIA driver wrote to the kernel log while the scenario ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xids: Vec<GpuXid>,
    /// Why the scenario's processes ran without a cgroup of their own (no cgroup hierarchy this
    /// process may write to): teardown then finds them by process group and run id only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_unavailable: Option<String>,
    /// A multi-node run: every node, its host, clock and own evidence (ranks above are global).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<super::NodesReport>,
}
