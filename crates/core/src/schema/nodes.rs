//! A multi-node run's part of a scenario result: every node, its host, clock and own evidence,
//! and where the first failure was across nodes (`crate::nodes` produces it).

use serde::{Deserialize, Serialize};

use super::{GpuReport, Leftovers, MemoryReport};

/// The agent's clock against the coordinator's at one moment: `coordinator = agent + offset`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Offset {
    /// Coordinator's clock minus the agent's, milliseconds.
    pub offset_ms: f64,
    /// Half the shortest round trip, milliseconds: the true offset lies within ± this.
    pub uncertainty_ms: f64,
    /// When it was measured, on the agent's clock (ns since the Unix epoch).
    pub at_ns: i64,
    /// Round trips taken (the shortest one counts).
    pub samples: u32,
}

/// An agent's clock over a run: calibrated at the start and (when it got that far) at the end.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    pub start: Offset,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<Offset>,
}

impl Calibration {
    /// The node that is the coordinator: its clock is the timeline.
    pub fn identity(at_ns: i64) -> Calibration {
        let zero = Offset { offset_ms: 0.0, uncertainty_ms: 0.0, at_ns, samples: 0 };
        Calibration { start: zero, end: Some(zero) }
    }

    /// How far the offset moved between the two calibrations, milliseconds.
    pub fn drift_ms(&self) -> Option<f64> {
        self.end.map(|e| e.offset_ms - self.start.offset_ms)
    }

    /// The offset at `at_ns` (agent clock): interpolated between the two calibrations, the start
    /// one alone when there is no end one.
    pub fn offset_at(&self, at_ns: i64) -> f64 {
        match self.end {
            Some(end) if end.at_ns > self.start.at_ns => {
                let f = ((at_ns - self.start.at_ns) as f64 / (end.at_ns - self.start.at_ns) as f64)
                    .clamp(0.0, 1.0);
                self.start.offset_ms + f * (end.offset_ms - self.start.offset_ms)
            }
            _ => self.start.offset_ms,
        }
    }

    /// The uncertainty of a time placed with [`Self::offset_at`]: the larger of the two
    /// calibrations' (interpolation between two bounded estimates is bounded by the larger), and
    /// without an end calibration nothing bounds the drift since the start: the start's alone,
    /// which the report says is a lower bound.
    pub fn uncertainty_ms(&self) -> f64 {
        self.end.map_or(self.start.uncertainty_ms, |e| e.uncertainty_ms.max(self.start.uncertainty_ms))
    }

    /// `agent_ns` (agent clock) on the coordinator's clock.
    pub fn to_coordinator_ns(&self, agent_ns: i64) -> i64 {
        agent_ns + (self.offset_at(agent_ns) * 1e6).round() as i64
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
    /// `ups-doctor attach` on each node to a job already running: ranks are numbered by the job's
    /// own `RANK` variables, each node's `started_at_s` is when its window began, and its own
    /// verdict uses the same global rank numbers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub attached: bool,
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
    pub clock: Option<Calibration>,
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

impl NodeSection {
    /// A node with its host and ranks, and nothing yet of what it saw.
    pub fn new(node: u32, host: String, ranks: Vec<u32>) -> NodeSection {
        NodeSection {
            node,
            host,
            ranks,
            agent_pid: None,
            clock: None,
            started_at_s: None,
            lost: None,
            remote_failure: None,
            snapshot: None,
            own_headline: None,
            wall_s: None,
            out_dir: None,
            memory: None,
            leftovers: Leftovers::default(),
            gpu: None,
        }
    }
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
