//! Multi-node runs: the same `ups-doctor run SCENARIO` runs once per node as a *node agent* that
//! supervises its node's ranks; node 0's agent is also the *coordinator*. Agents join over one
//! TCP connection each ([`wire`]), calibrate their clocks against the coordinator's ([`clock`]),
//! stream what their supervision loop sees ([`link`]) so that a death on one node makes every
//! other node take stacks before teardown, and send their node's result at the end; the
//! coordinator merges them into one result and one report ([`merge`]).
//!
//! Layout: [`config`] finds who this node is (flags, Slurm, torchrun variables); [`wire`],
//! [`clock`], [`merge`] and [`torchrun`] are pure; [`net`] is the sockets; [`run`] drives one
//! node's run; [`local`] plays every node of a `launch.nodes` scenario on this machine.

pub mod clock;
pub mod config;
pub mod link;
pub mod local;
pub mod merge;
pub mod net;
pub mod run;
pub mod torchrun;
pub mod wire;

use serde::{Deserialize, Serialize};

pub use config::{NodeConfig, NodeConfigError};
pub use link::{LocalEvent, NodeLink};

use crate::harness::{GpuReport, Leftovers, MemoryReport, ProcessDump, ScenarioResult};

/// Where this node's ranks sit in the world, for their environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePlacement {
    pub node: u32,
    pub nodes: u32,
    /// Ranks per node.
    pub local_world: u32,
    /// Node 0's address: the ranks' rendezvous (`MASTER_ADDR`).
    pub master_addr: String,
    pub master_port: u16,
}

impl NodePlacement {
    pub fn global_rank(&self, local: u32) -> u32 {
        self.node * self.local_world + local
    }

    pub fn world(&self) -> u32 {
        self.nodes * self.local_world
    }
}

/// What a node saw of a failure elsewhere, and what it did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RemoteFailureSeen {
    /// What failed, as the coordinator said.
    pub what: String,
    /// When the node learnt of it, seconds on the run's timeline.
    pub known_at_s: f64,
    /// Its ranks still running then, whose stacks were asked for (global ranks).
    #[serde(default)]
    pub stacks_requested: Vec<u32>,
    /// When SIGTERM went to what was left, seconds on the run's timeline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torn_down_at_s: Option<f64>,
    /// Every rank asked answered with its stacks before teardown.
    #[serde(default)]
    pub stacks_answered: bool,
}

/// When a node looked at its ranks after the first failure (here or elsewhere).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// On the run's timeline.
    pub at_s: f64,
    /// Ranks whose threads were read then (each rank's `dumps` holds them).
    pub ranks: Vec<u32>,
}

/// What one agent sends the coordinator at the end: its node's result as it would write it on
/// its own (ranks numbered locally), with what places it on the run's timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRun {
    pub node: u32,
    pub host: String,
    pub agent_pid: u32,
    pub local_world: u32,
    /// When supervision started, on the agent's clock (ns since the Unix epoch).
    pub started_ns: i64,
    pub calibration: clock::Calibration,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_failure: Option<RemoteFailureLocal>,
    /// What its ranks still running were doing the moment the node knew of the first failure
    /// (here or elsewhere), by local rank.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<(u32, ProcessDump)>,
    /// When that snapshot was taken, on the agent's clock (ns).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_ns: Option<i64>,
    /// Where the agent wrote its own copy (logs, its node's result), on its host.
    pub out_dir: String,
    pub result: ScenarioResult,
}

/// [`RemoteFailureSeen`] as the agent records it: local ranks, times on its own clock (ns).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RemoteFailureLocal {
    pub what: String,
    pub known_ns: i64,
    pub stacks_requested: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torn_down_ns: Option<i64>,
    pub stacks_answered: bool,
}

/// The multi-node part of a merged scenario result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodesReport {
    pub nodes: u32,
    pub ranks_per_node: u32,
    /// The coordinator's address.
    pub coordinator: String,
    /// The first failure across nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failure: Option<FirstFailure>,
    /// When the order of first deaths on different nodes is within the clocks' uncertainty: the
    /// sentence that says so, and what decided instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order_note: Option<String>,
    /// Every node, by node rank.
    pub per_node: Vec<NodeSection>,
}

/// Where the first failure was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FirstFailure {
    pub node: u32,
    pub host: String,
    pub rank: u32,
    pub local_rank: u32,
    /// On the run's timeline (node 0's clock, seconds since its start), ± the node's clock
    /// uncertainty.
    pub at_s: Option<f64>,
    pub uncertainty_ms: f64,
}

/// One node: its host, ranks, clock and its own evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeSection {
    pub node: u32,
    pub host: String,
    /// Global ranks of this node.
    pub ranks: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_pid: Option<u32>,
    /// Its clock against the coordinator's (absent for node 0, which is the timeline, and for a
    /// node lost before it calibrated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<clock::Calibration>,
    /// When its supervision started, on the run's timeline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at_s: Option<f64>,
    /// The agent vanished: when and how it was noticed; its ranks were not observed to the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<LostNode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_failure: Option<RemoteFailureSeen>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<Snapshot>,
    /// The node's own verdict headline, as if it had run alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own_headline: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_s: Option<f64>,
    /// Where the agent wrote its own copy (logs), on its host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out_dir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryReport>,
    #[serde(default)]
    pub leftovers: Leftovers,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuReport>,
}

/// A node whose agent went away before it sent its result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LostNode {
    /// When the coordinator noticed, on the run's timeline.
    pub at_s: f64,
    /// How: `its connection closed`, `no word for 15 s`, ….
    pub how: String,
    /// The last steps its ranks reported before (global rank, step).
    #[serde(default)]
    pub last_steps: Vec<(u32, u64)>,
}
