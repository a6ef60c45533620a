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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodes::merge::{MergeInput, merge};
    use crate::schema::RunResult;

    /// A real `ups-doctor run -- torchrun --nproc_per_node 2 tests/programs/ddp.py --steps 6
    /// --skip-rank 1 --skip-step 3`: rank 0 waits in DDP's all-reduce, rank 1 in a barrier.
    const HANG: &str = include_str!("../../bench/scale/hang-2rank.json");
    /// Node 1 of a real torchrun 2 × 2 run whose rank 3 (its local rank 1) was killed by SIGSEGV.
    const CRASH: &str =
        include_str!("../../reports/examples/run-nodes/2-torchrun-2x2-rank3-segv/node1/result.json");

    /// `recorded`'s run with its one scenario replaced by `job` merged (and so judged).
    fn simulated(recorded: &str, job: &Job) -> RunResult {
        let mut run: RunResult = serde_json::from_str(recorded).unwrap();
        let template = run.scenarios.remove(0);
        let mut scenario = template.scenario.clone();
        scenario.launch.world_size = job.world();
        let merged = merge(MergeInput {
            cluster: None,
            scenario: &scenario,
            file: template.file.clone(),
            overrides: Vec::new(),
            coordinator: "10.0.0.1:29411".into(),
            ranks_per_node: job.ranks_per_node,
            nodes: nodes(&template, job),
        });
        run.scenarios = vec![merged];
        run
    }

    fn job() -> Job {
        Job { nodes: 128, ranks_per_node: 8, common: 0, odd: vec![(753, 1)] }
    }

    /// 1,024 ranks hung on 128 nodes, rank 753 in a barrier while the others wait in DDP's
    /// all-reduce: the report says so in classes (one row, one stack for the 1,023 that wait
    /// alike; rank 753 on its own) and fits one GitHub comment whole, its end included.
    #[test]
    fn a_thousand_hung_ranks_are_reported_as_classes_with_the_odd_rank_named_alone() {
        let run = simulated(HANG, &job());
        let s = &run.scenarios[0];
        assert_eq!(s.first_failure, Some(753), "{}", s.verdict.headline);
        assert!(s.verdict.headline.len() < 1_000, "{}", s.verdict.headline);
        let longest = s.verdict.evidence.iter().map(String::len).max().unwrap();
        assert!(longest < 1_000, "{:#?}", s.verdict.evidence);
        let report = crate::report::render_markdown(&run);
        assert!(report.chars().count() <= 65_536, "{} characters", report.chars().count());
        assert!(!report.contains("of this report are left out"), "cut at the end");
        assert!(report.contains("## Environment"), "whole, to its last section");
        let others = "ranks 0–752, 754–1023 (1,023 ranks)";
        assert!(report.contains(&format!("| {others} (collateral) |")), "one row for the 1,023");
        assert!(report.contains("| **753** (first failure) |"), "the odd rank in a row of its own");
        assert!(report.contains(&format!("### What {others} were doing when they were stopped")));
        assert!(report.contains("### What rank 753 was doing when it was stopped"));
        assert!(!report.contains("| 754 "), "no row of its own for a rank like the others");
    }

    /// The same crash, 4,096 ranks on 512 nodes: rank 1777's SIGSEGV is named, the 4,095 torn
    /// down after it are one line of evidence and one row, and the nodes one table that fits.
    #[test]
    fn four_thousand_ranks_torn_down_after_one_crash_fit_one_comment() {
        let run = simulated(CRASH, &Job { nodes: 512, ranks_per_node: 8, common: 0, odd: vec![(1777, 1)] });
        let s = &run.scenarios[0];
        assert_eq!(s.first_failure, Some(1777));
        let collateral: Vec<&String> =
            s.verdict.evidence.iter().filter(|e| e.starts_with("collateral:")).collect();
        assert_eq!(collateral.len(), 1, "{collateral:#?}");
        assert!(
            collateral[0].starts_with("collateral: ranks 0–1776, 1778–4095, each was killed"),
            "{}",
            collateral[0]
        );
        let report = crate::report::render_markdown(&run);
        assert!(report.chars().count() <= 65_536, "{} characters", report.chars().count());
        assert!(report.contains("## Environment"), "whole, to its last section");
        assert!(report.contains("| ranks 0–1776, 1778–4095 (4,095 ranks) (collateral) |"));
        assert!(report.contains("| **1777** (first failure) |"));
    }
}
