//! A job of thousands of ranks made from one node's recorded result, for the scale benchmark
//! (`bench/scale.rs`) and the tests that the merge, the judge and the report stay usable at the
//! size real jobs reach (issue 59). No cluster of 512 nodes is at hand, but what each node sends
//! the coordinator is data ([`NodeRun`]): a recorded node's ranks, copied with distinct rank
//! numbers, pids, hosts and clock offsets, are what the merge would receive from a real one.
//! Pure: no IO.

use crate::schema::{RankResult, ScenarioResult};

use super::NodeRun;
use super::clock::{Calibration, Offset};
use super::merge::NodeOutcome;

/// Node 0's start on its own clock (ns since the Unix epoch): any moment will do.
const BASE_NS: i64 = 1_800_000_000_000_000_000;

/// The shape of a simulated job.
#[derive(Debug, Clone)]
pub struct Job {
    pub nodes: u32,
    pub ranks_per_node: u32,
    /// Index into the recorded node's ranks of the rank every other rank is a copy of.
    pub common: usize,
    /// Global ranks that are copies of another recorded rank instead: (global rank, index).
    pub odd: Vec<(u32, usize)>,
}

impl Job {
    /// Every rank of the world.
    pub fn world(&self) -> u32 {
        self.nodes * self.ranks_per_node
    }
}

/// Each node of `job` as the coordinator would receive it: `recorded`'s ranks copied to
/// `ranks_per_node` local ranks each (pid and logs their own), on a host of its own (`node-007`),
/// its clock up to ±200 ms off node 0's and known to ±0.05 ms, as calibration finds it.
///
/// Panics when `job.common` or an odd rank's index is not one of `recorded`'s ranks.
pub fn nodes(recorded: &ScenarioResult, job: &Job) -> Vec<NodeOutcome> {
    (0..job.nodes)
        .map(|node| {
            let first = node * job.ranks_per_node;
            let ranks =
                (0..job.ranks_per_node).map(|local| rank(recorded, job, first + local, local)).collect();
            // A skew that differs from node to node but is the same every run.
            let skew_ms = if node == 0 { 0.0 } else { f64::from((node * 7919) % 401) - 200.0 };
            let offset = Offset { offset_ms: -skew_ms, uncertainty_ms: 0.05, at_ns: BASE_NS, samples: 16 };
            let host = format!("node-{node:03}");
            NodeOutcome::Reported(Box::new(NodeRun {
                node,
                host: host.clone(),
                agent_pid: 100_000 + node,
                local_world: job.ranks_per_node,
                first_rank: None,
                started_ns: BASE_NS + (skew_ms * 1e6) as i64,
                calibration: if node == 0 {
                    Calibration::identity(BASE_NS)
                } else {
                    Calibration { start: offset, end: Some(offset) }
                },
                remote_failure: None,
                snapshots: Vec::new(),
                snapshot_ns: None,
                out_dir: format!("/tmp/{host}"),
                result: ScenarioResult { ranks, ..recorded.clone() },
            }))
        })
        .collect()
}

/// Global rank `global`'s copy, numbered `local` on its node as its agent numbers it.
fn rank(recorded: &ScenarioResult, job: &Job, global: u32, local: u32) -> RankResult {
    let which = job.odd.iter().find(|(g, _)| *g == global).map_or(job.common, |&(_, i)| i);
    let mut r = recorded.ranks[which].clone();
    r.rank = local;
    r.pid = Some(200_000 + global);
    for d in &mut r.dumps {
        d.pid = 200_000 + global;
        d.rank = local;
    }
    r.stdout_log = format!("logs/rank{local}.stdout");
    r.stderr_log = format!("logs/rank{local}.stderr");
    r
}

