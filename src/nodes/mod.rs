//! Multi-node runs: the same `ups-doctor run SCENARIO` runs once per node as a *node agent* that
//! supervises its node's ranks; node 0's agent is also the *coordinator*. Agents join over one
//! TCP connection each ([`wire`]), calibrate their clocks against the coordinator's ([`clock`]),
//! stream what their supervision loop sees (its [`RunEvent`]s, as a [`Listener`]) so that a death on one node makes every
//! other node take stacks before teardown, and send their node's result at the end; the
//! coordinator merges them into one result and one report ([`merge`]).
//!
//! Layout: [`config`] finds who this node is (flags, Slurm, torchrun variables); [`wire`],
//! [`clock`], [`merge`] and [`cluster`] (a cluster's workers' ends, told by node 0's driver) are pure (torchrun's per-node command is planned in
//! `harness::plan::torchrun`); [`net`] is the sockets; [`simulate`] makes a job of
//! thousands of ranks from one node's recorded result (the scale benchmark); [`run`] drives one
//! node's run; [`local`] plays every node of a `launch.nodes` scenario on this machine.

pub mod clock;
pub mod cluster;
pub mod config;
pub mod local;
pub mod merge;
pub mod net;
pub mod run;
pub mod simulate;
pub mod wire;

use serde::{Deserialize, Serialize};

pub use crate::harness::plan::NodePlacement;
pub use crate::harness::run::events::{Listener, RunEvent};
pub use config::{NodeConfig, NodeConfigError};

pub use crate::schema::{FirstFailure, LostNode, NodeSection, NodesReport, RemoteFailureSeen, Snapshot};
use crate::schema::{ProcessDump, ScenarioResult};

/// What one agent sends the coordinator at the end: its node's result as it would write it on
/// its own (ranks numbered locally), with what places it on the run's timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRun {
    pub node: u32,
    pub host: String,
    pub agent_pid: u32,
    pub local_world: u32,
    /// The node's first global rank where the launcher's rendezvous placed it elsewhere than node ×
    /// `local_world`; its result numbers the ranks from 0 either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_rank: Option<u32>,
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

//END
