//! One result from every node's: ranks renumbered globally (`node × ranks per node + local
//! rank`), every time placed on node 0's timeline through each node's clock calibration, judged
//! once over all ranks, and each node's own evidence kept in its section. Pure: no IO.

use crate::scenario::launcher::ClusterWorkers;
use crate::scenario::{OutcomeKind, Scenario};
use crate::schema::{GpuXid, Leftovers, MemoryReport, OomKill, RankResult, ScenarioResult, Verdict};

use super::clock::Calibration;
use super::{LostNode, NodeRun, NodeSection, NodesReport, RemoteFailureSeen, Snapshot};

/// What the coordinator has of one node at the end.
#[derive(Debug, Clone)]
pub enum NodeOutcome {
    /// Its agent sent its result.
    Reported(Box<NodeRun>),
    /// Its agent went away first.
    Lost { node: u32, host: String, agent_pid: Option<u32>, calibration: Option<Calibration>, lost: LostNode },
}

impl NodeOutcome {
    fn node(&self) -> u32 {
        match self {
            NodeOutcome::Reported(r) => r.node,
            NodeOutcome::Lost { node, .. } => *node,
        }
    }
}

/// Everything the merge needs.
pub struct MergeInput<'a> {
    /// The scenario as the user wrote it (its `world_size` is the whole world).
    pub scenario: &'a Scenario,
    pub file: String,
    pub overrides: Vec<String>,
    pub coordinator: String,
    pub ranks_per_node: u32,
    /// Every node; node 0 (the coordinator's own) must be reported.
    pub nodes: Vec<NodeOutcome>,
    /// Where the ranks are a cluster's workers (Ray Train): what the cluster says of them, and the
    /// job's driver on node 0, which says what the other nodes' workers printed and how they ended.
    pub cluster: Option<(&'static ClusterWorkers, super::cluster::DriverOutput)>,
}

/// A time on a node's clock (seconds since its start) moved onto the run's timeline.
struct Placement {
    shift_s: f64,
}

impl Placement {
    fn of(run: &NodeRun, base_ns: i64) -> Placement {
        let start = run.calibration.to_coordinator_ns(run.started_ns);
        Placement { shift_s: (start - base_ns) as f64 / 1e9 }
    }

    fn at(&self, t: Option<f64>) -> Option<f64> {
        t.map(|t| t + self.shift_s)
    }

    fn ns(&self, run: &NodeRun, base_ns: i64, agent_ns: i64) -> f64 {
        (run.calibration.to_coordinator_ns(agent_ns) - base_ns) as f64 / 1e9
    }
}

/// Every node's ranks (numbered globally), OOM kills, leftovers and section, on node 0's timeline.
#[derive(Default)]
struct Gathered {
    ranks: Vec<RankResult>,
    oom_kills: Vec<OomKill>,
    xids: Vec<GpuXid>,
    leftovers: Leftovers,
    sections: Vec<NodeSection>,
    wall_s: f64,
    interrupted: bool,
}

/// Places what every node reported (and what is known of a lost one) on node 0's timeline and
/// the world's rank numbers.
fn gather(nodes: &[NodeOutcome], base_ns: i64, lw: u32, first_of: &dyn Fn(u32) -> u32) -> Gathered {
    let mut g = Gathered::default();
    for n in nodes {
        match n {
            NodeOutcome::Reported(run) => {
                let first = first_of(run.node);
                let p = Placement::of(run, base_ns);
                let r = &run.result;
                g.interrupted |= r.interrupted;
                g.wall_s = g.wall_s.max(p.shift_s + r.wall_s);
                for rank in &r.ranks {
                    let mut global = rank.clone();
                    global.rank = first + rank.rank;
                    global.collateral = false;
                    global.ended_at_s = p.at(global.ended_at_s);
                    global.last_marker_at_s = p.at(global.last_marker_at_s);
                    global.last_output_at_s = p.at(global.last_output_at_s);
                    for span in &mut global.timeline {
                        span.start_s += p.shift_s;
                        span.end_s = p.at(span.end_s);
                    }
                    for entry in global.observed.iter_mut().flat_map(|o| o.ledger.iter_mut()) {
                        entry.at_s = p.at(entry.at_s);
                    }
                    let flight = global.observed.iter_mut().filter_map(|o| o.flight.as_mut());
                    for entry in flight.flat_map(|f| f.entries.iter_mut()) {
                        entry.at_s = p.at(entry.at_s);
                    }
                    global.dumps.extend(
                        run.snapshots.iter().filter(|(l, _)| *l == rank.rank).map(|(_, d)| d.clone()),
                    );
                    if run.node != 0 {
                        global.stdout_log = format!("{}:{}/{}", run.host, run.out_dir, rank.stdout_log);
                        global.stderr_log = format!("{}:{}/{}", run.host, run.out_dir, rank.stderr_log);
                    }
                    g.ranks.push(global);
                }
                for k in &r.oom_kills {
                    g.oom_kills.push(OomKill {
                        rank: k.rank.map(|l| first + l),
                        at_s: p.at(k.at_s),
                        ..k.clone()
                    });
                }
                for x in &r.xids {
                    g.xids.push(GpuXid {
                        rank: x.rank.map(|l| first + l),
                        at_s: p.at(Some(x.at_s)).unwrap_or(x.at_s),
                        ..x.clone()
                    });
                }
                g.leftovers.shm.extend(r.leftovers.shm.iter().cloned());
                g.leftovers.processes.extend(r.leftovers.processes.iter().cloned().map(|mut lp| {
                    lp.rank = lp.rank.map(|l| first + l);
                    lp
                }));
                g.sections.push(NodeSection {
                    node: run.node,
                    host: run.host.clone(),
                    ranks: (0..run.local_world).map(|l| first + l).collect(),
                    agent_pid: Some(run.agent_pid),
                    clock: (run.node != 0).then_some(run.calibration),
                    started_at_s: Some(p.shift_s),
                    lost: None,
                    remote_failure: run.remote_failure.as_ref().map(|f| RemoteFailureSeen {
                        what: f.what.clone(),
                        known_at_s: p.ns(run, base_ns, f.known_ns),
                        stacks_requested: f.stacks_requested.iter().map(|l| first + l).collect(),
                        // SIGTERM went out only if some rank was still there to receive it.
                        torn_down_at_s: f
                            .torn_down_ns
                            .filter(|_| r.ranks.iter().any(|x| x.torn_down_with.is_some()))
                            .map(|t| p.ns(run, base_ns, t)),
                        // Answered means stacks arrived, not merely that nobody was left to ask.
                        stacks_answered: !f.stacks_requested.is_empty()
                            && f.stacks_requested
                                .iter()
                                .all(|l| r.ranks.iter().any(|x| x.rank == *l && !x.stacks.is_empty())),
                    }),
                    snapshot: run.snapshot_ns.map(|t| Snapshot {
                        at_s: p.ns(run, base_ns, t),
                        ranks: run.snapshots.iter().map(|(l, _)| first + l).collect(),
                    }),
                    own_headline: Some(r.verdict.headline.clone()),
                    wall_s: Some(r.wall_s),
                    out_dir: Some(run.out_dir.clone()),
                    memory: r.memory.clone().map(|m| global_memory(m, first)),
                    leftovers: r.leftovers.clone(),
                    gpu: r.gpu.clone(),
                });
            }
            NodeOutcome::Lost { node, host, agent_pid, calibration, lost } => {
                g.sections.push(NodeSection {
                    agent_pid: *agent_pid,
                    clock: *calibration,
                    lost: Some(lost.clone()),
                    ..NodeSection::new(*node, host.clone(), (0..lw).map(|l| first_of(*node) + l).collect())
                });
            }
        }
    }
    g
}

/// Merges the nodes' results into one scenario result with its [`NodesReport`].
pub fn merge(input: MergeInput) -> ScenarioResult {
    let mut nodes = input.nodes;
    nodes.sort_by_key(NodeOutcome::node);
    let base = nodes
        .iter()
        .find_map(|n| match n {
            NodeOutcome::Reported(r) if r.node == 0 => Some(r.clone()),
            _ => None,
        })
        .expect("node 0 is the coordinator and always reports");
    let base_ns = base.started_ns;
    let lw = input.ranks_per_node;
    let firsts = first_ranks(&nodes, lw);
    let first_of = |node: u32| firsts.get(&node).copied().unwrap_or(node * lw);
    let Gathered { mut ranks, oom_kills, xids, leftovers, sections, wall_s, interrupted } =
        gather(&nodes, base_ns, lw, &first_of);
    ranks.sort_by_key(|r| r.rank);
    if let Some((workers, driver)) = &input.cluster {
        let own = first_of(0)..first_of(0) + lw;
        super::cluster::account(&mut ranks, |rank| !own.contains(&rank), workers, driver);
    }

    let scenario = input.scenario;
    let b = &base.result;
    let mut result = ScenarioResult {
        name: b.name.clone(),
        file: input.file,
        overrides: input.overrides,
        scenario: scenario.clone(),
        // Written by the judge below.
        outcome: OutcomeKind::Passed,
        met_expectation: false,
        interrupted,
        expectation_mismatches: Vec::new(),
        verdict: Verdict::unjudged(),
        first_failure: None,
        wall_s,
        steps_per_s: b.steps_per_s,
        samples_per_s: None,
        memory: None,
        leftovers,
        gpu: None,
        external: b.external.clone(),
        cgroup: None,
        oom_kills,
        xids,
        cgroup_unavailable: None,
        nodes: Some(NodesReport {
            nodes: sections.len() as u32,
            ranks_per_node: lw,
            coordinator: input.coordinator,
            first_failure: None,
            order_note: None,
            per_node: sections,
            attached: false,
        }),
        ranks,
    };
    // One judgement over every node's ranks: the nodes' clocks and lost nodes are its evidence.
    crate::diagnose::conclude(&mut result, crate::diagnose::Seen::Ran);
    result
}

/// Where each node's ranks start in the world: node × `lw`, unless its launcher's rendezvous
/// numbered it otherwise (a reported [`NodeRun::first_rank`]; torchrun's `c10d` orders nodes by
/// host and agent pid). Those are taken only when they are whole blocks that do not overlap; a
/// lost node gets the lowest block no reported node holds.
fn first_ranks(nodes: &[NodeOutcome], lw: u32) -> std::collections::BTreeMap<u32, u32> {
    let world = nodes.len() as u32 * lw;
    let said: Vec<(u32, u32)> = nodes
        .iter()
        .filter_map(|n| match n {
            NodeOutcome::Reported(r) => Some((r.node, r.first_rank.unwrap_or(r.node * lw))),
            NodeOutcome::Lost { .. } => None,
        })
        .collect();
    let mut starts: Vec<u32> = said.iter().map(|&(_, f)| f).collect();
    starts.sort_unstable();
    starts.dedup();
    let whole =
        starts.len() == said.len() && starts.iter().all(|&f| lw > 0 && f % lw == 0 && f + lw <= world);
    if !whole {
        return nodes.iter().map(|n| (n.node(), n.node() * lw)).collect();
    }
    let mut firsts: std::collections::BTreeMap<u32, u32> = said.into_iter().collect();
    for n in nodes.iter().filter(|n| matches!(n, NodeOutcome::Lost { .. })) {
        let free = (0..nodes.len() as u32).map(|k| k * lw).find(|b| !firsts.values().any(|f| f == b));
        firsts.insert(n.node(), free.unwrap_or(n.node() * lw));
    }
    firsts
}

/// A node's memory report with global rank numbers. Its series stays indexed by local rank (its
/// section's `ranks` say which global rank each is): padded to global indices, every node's
/// series held a zero for each rank of the nodes before it, and `result.json` grew with nodes ×
/// ranks (913 MB at 4,096 ranks on 512 nodes).
fn global_memory(mut m: MemoryReport, offset: u32) -> MemoryReport {
    m.processes.iter_mut().for_each(|p| p.rank += offset);
    m.shm.at_rank_end.iter_mut().for_each(|a| a.rank += offset);
    m.datasets.iter_mut().for_each(|d| d.rank += offset);
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodes::clock::{Calibration, Offset};
    use crate::report::fixtures;
    use crate::scenario::Expect;

    const MS: i64 = 1_000_000;
    /// Node 0's start on its own clock (ns since the epoch): any moment will do.
    const BASE: i64 = 1_800_000_000_000 * MS;

    fn scenario(world: u32) -> Scenario {
        let mut s = fixtures::passing().scenario;
        s.name = "ddp-2x2".into();
        s.launch.world_size = world;
        s.expect = Expect { outcome: OutcomeKind::Signaled, rank: Some(3), ..Expect::default() };
        s
    }

    fn died(local: u32, at_s: f64, signal: Option<&str>, error: Option<&str>) -> RankResult {
        let mut r = fixtures::rank(local, 3);
        r.outcome = if signal.is_some() { OutcomeKind::Signaled } else { OutcomeKind::Exited };
        r.signal = signal.and_then(crate::schema::Signal::parse);
        r.exit_code = if signal.is_some() { None } else { Some(1) };
        r.error = error.map(Into::into);
        r.ended_at_s = Some(at_s);
        r.last_marker_at_s = Some(at_s - 0.01);
        r
    }

    const LOST_PEER: &str = "Connection closed by peer [127.0.0.1]:4000 (rank 0 receiving from rank 3 in all_reduce_sum, collective #53)";

    /// A node's report: its ranks (local numbers, local times) with its clock: `skew_ms` ahead of
    /// node 0's, known to ± `u_ms`, and started `late_ms` after node 0 (true time).
    fn node(
        node: u32,
        host: &str,
        ranks: Vec<RankResult>,
        skew_ms: f64,
        u_ms: f64,
        late_ms: i64,
    ) -> NodeOutcome {
        let offset = Offset { offset_ms: -skew_ms, uncertainty_ms: u_ms, at_ns: BASE, samples: 16 };
        let mut result = fixtures::passing();
        result.ranks = ranks;
        NodeOutcome::Reported(Box::new(NodeRun {
            node,
            host: host.into(),
            agent_pid: 100 + node,
            local_world: 2,
            first_rank: None,
            started_ns: BASE + late_ms * MS + (skew_ms * 1e6) as i64,
            calibration: if node == 0 {
                Calibration::identity(BASE)
            } else {
                Calibration { start: offset, end: Some(offset) }
            },
            remote_failure: None,
            snapshots: Vec::new(),
            snapshot_ns: None,
            out_dir: format!("/tmp/{host}"),
            result,
        }))
    }

    fn merged(nodes: Vec<NodeOutcome>) -> ScenarioResult {
        merge(MergeInput {
            cluster: None,
            scenario: &scenario(4),
            file: "ddp-2x2.json".into(),
            overrides: Vec::new(),
            coordinator: "127.0.0.1:29411".into(),
            ranks_per_node: 2,
            nodes,
        })
    }

    #[test]
    fn ranks_are_numbered_globally_and_placed_on_node_0s_timeline_through_the_calibration() {
        // Node 1's clock is 5 s ahead: uncalibrated, its rank 3 would seem to die 5 s after the
        // ranks it took down. Calibrated, it died first, at 2.000 s.
        let s = merged(vec![
            node(
                0,
                "node-a",
                vec![died(0, 2.100, None, Some(LOST_PEER)), died(1, 2.150, None, Some(LOST_PEER))],
                0.0,
                0.0,
                0,
            ),
            node(
                1,
                "node-b",
                vec![died(0, 2.090, None, Some(LOST_PEER)), died(1, 1.990, Some("SIGSEGV"), None)],
                5000.0,
                0.05,
                10,
            ),
        ]);
        assert_eq!(s.ranks.iter().map(|r| r.rank).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert_eq!(s.first_failure, Some(3));
        assert!((s.ranks[3].ended_at_s.unwrap() - 2.000).abs() < 1e-6, "{:?}", s.ranks[3].ended_at_s);
        assert!(s.ranks[..3].iter().all(|r| r.collateral));
        let n = s.nodes.as_ref().unwrap();
        let f = n.first_failure.as_ref().unwrap();
        assert_eq!(
            (f.node, f.host.as_str(), f.rank, f.local_rank, f.uncertainty_ms),
            (1, "node-b", 3, 1, 0.05)
        );
        assert_eq!(n.order_note, None, "100 ms apart: the clocks can tell");
        assert_eq!(n.per_node[1].ranks, [2, 3]);
        assert_eq!(s.ranks[2].stdout_log, "node-b:/tmp/node-b/logs/rank0.stdout");
        assert!(s.met_expectation, "{:?}", s.expectation_mismatches);
        assert_eq!(s.verdict.evidence[0], "First failure across nodes: node 1, rank 3 (host node-b)");
        // The memory of node 1 speaks of global ranks.
        let m = n.per_node[1].memory.as_ref().unwrap();
        assert_eq!(m.processes[0].rank, 2);
        assert_eq!(m.series[0].pss_bytes.len(), 1, "indexed by local rank: no zeros for node 0's ranks");
    }

    /// torchrun's `c10d` rendezvous gave node 0 (`node-a`) ranks 2–3 and node 1 ranks 0–1; node 0's
    /// local rank 1 crashed. The crash is global rank 3 on node 0, and the report says how the
    /// nodes were numbered.
    #[test]
    fn a_node_the_rendezvous_placed_elsewhere_keeps_its_ranks_global_numbers() {
        let placed = |n: NodeOutcome, first: u32| match n {
            NodeOutcome::Reported(mut r) => {
                r.first_rank = Some(first);
                NodeOutcome::Reported(r)
            }
            lost => lost,
        };
        // Node 0's local rank 1 crashed; the others lost their peer after it.
        let run = |first_a: u32, first_b: u32| {
            merged(vec![
                placed(
                    node(
                        0,
                        "node-a",
                        vec![died(0, 2.1, None, Some(LOST_PEER)), died(1, 2.0, Some("SIGSEGV"), None)],
                        0.0,
                        0.0,
                        0,
                    ),
                    first_a,
                ),
                placed(
                    node(
                        1,
                        "node-b",
                        vec![died(0, 2.2, None, Some(LOST_PEER)), died(1, 2.3, None, Some(LOST_PEER))],
                        0.0,
                        0.05,
                        0,
                    ),
                    first_b,
                ),
            ])
        };
        let s = run(2, 0);
        assert_eq!(s.first_failure, Some(3));
        assert_eq!(s.ranks[3].signal, crate::schema::Signal::parse("SIGSEGV"));
        let n = s.nodes.as_ref().unwrap();
        let f = n.first_failure.as_ref().unwrap();
        assert_eq!((f.node, f.host.as_str(), f.rank, f.local_rank), (0, "node-a", 3, 1));
        assert_eq!((n.per_node[0].ranks.clone(), n.per_node[1].ranks.clone()), (vec![2, 3], vec![0, 1]));
        assert!(
            s.verdict
                .evidence
                .iter()
                .any(|e| e.contains("node 0 (node-a) ran ranks 2–3, node 1 (node-b) ran ranks 0–1")),
            "{:?}",
            s.verdict.evidence
        );
        // Places that overlap are not believed: node × ranks per node stands, and nothing is said.
        let s = run(2, 2);
        assert_eq!(s.first_failure, Some(1));
        assert!(!s.verdict.evidence.iter().any(|e| e.contains("numbered the nodes")));
    }

    #[test]
    fn deaths_closer_than_the_clocks_can_tell_say_so_and_causal_evidence_decides() {
        // Rank 0 on node-a lost its peer 1 ms *before* rank 3 on node-b crashed, by the clocks,
        // but node-b's clock is known to ± 2 ms only: the crash is the cause.
        let s = merged(vec![
            node(
                0,
                "node-a",
                vec![died(0, 2.000, None, Some(LOST_PEER)), died(1, 2.300, None, Some(LOST_PEER))],
                0.0,
                0.0,
                0,
            ),
            node(
                1,
                "node-b",
                vec![died(0, 2.200, None, Some(LOST_PEER)), died(1, 2.001, Some("SIGSEGV"), None)],
                0.0,
                2.0,
                0,
            ),
        ]);
        assert_eq!(s.first_failure, Some(3));
        let note = s.nodes.as_ref().unwrap().order_note.clone().unwrap();
        assert_eq!(
            note,
            "rank 3 on node-b and rank 0 on node-a died within ±2.0 ms of each other: order not determined; rank 0 lost its peer: rank 3 is the first failure by causal evidence"
        );
        assert!(
            s.verdict
                .evidence
                .iter()
                .any(|e| e.starts_with("Rank 3 on node-b and rank 0 on node-a died within ±2.0 ms"))
        );
    }

    #[test]
    fn two_crashes_within_the_uncertainty_are_named_by_timestamp_only_and_said_to_be() {
        let s = merged(vec![
            node(
                0,
                "node-a",
                vec![died(0, 2.0000, Some("SIGSEGV"), None), died(1, 2.300, None, Some(LOST_PEER))],
                0.0,
                0.0,
                0,
            ),
            node(
                1,
                "node-b",
                vec![died(0, 2.200, None, Some(LOST_PEER)), died(1, 2.0015, Some("SIGABRT"), None)],
                0.0,
                2.0,
                0,
            ),
        ]);
        assert_eq!(s.first_failure, Some(0));
        let note = s.nodes.as_ref().unwrap().order_note.clone().unwrap();
        assert!(note.starts_with("rank 0 on node-a and rank 3 on node-b died within ±2.0 ms of each other: order not determined"), "{note}");
        assert!(
            note.ends_with("no causal evidence tells them apart: rank 0 is named by its timestamp only"),
            "{note}"
        );
        // 1.5 ms apart with clocks known to ± 0.5 ms: the order is known.
        let s = merged(vec![
            node(
                0,
                "node-a",
                vec![died(0, 2.0000, Some("SIGSEGV"), None), died(1, 2.300, None, Some(LOST_PEER))],
                0.0,
                0.0,
                0,
            ),
            node(
                1,
                "node-b",
                vec![died(0, 2.200, None, Some(LOST_PEER)), died(1, 2.0015, Some("SIGABRT"), None)],
                0.0,
                0.5,
                0,
            ),
        ]);
        assert_eq!(s.nodes.as_ref().unwrap().order_note, None);
    }

    #[test]
    fn a_lost_node_is_not_a_hang_of_everything() {
        let torn = |local: u32| {
            let mut r = died(local, 9.5, Some("SIGTERM"), None);
            r.torn_down_with = Some(crate::schema::Signal::TERM);
            r
        };
        let s = merged(vec![
            node(0, "node-a", vec![torn(0), torn(1)], 0.0, 0.0, 0),
            NodeOutcome::Lost {
                node: 1,
                host: "node-b".into(),
                agent_pid: Some(101),
                calibration: None,
                lost: LostNode {
                    at_s: 8.25,
                    how: "its connection closed".into(),
                    last_steps: vec![(2, 40), (3, 41)],
                },
            },
        ]);
        assert_eq!(s.ranks.len(), 2);
        assert_eq!(
            s.verdict.headline,
            "Node 1 (node-b) lost at 8.2 s (its connection closed): its ranks 2–3 were not observed to their end; the other nodes' ranks were torn down after it"
        );
        assert!(!s.met_expectation);
        assert!(s.expectation_mismatches.iter().any(|m| m == "node 1 lost: its ranks were not observed"));
        assert_eq!(
            s.nodes.as_ref().unwrap().per_node[1].lost.as_ref().unwrap().last_steps,
            [(2, 40), (3, 41)]
        );
    }

    /// The report of a 2 × 2 run whose rank 3 crashed on node-b: the Nodes section, the node
    /// column of the rank table, the snapshot node-a took and each node's own evidence.
    #[test]
    fn the_report_of_a_crash_on_node_b() {
        let mut a = node(
            0,
            "node-a",
            vec![died(0, 2.100, None, Some(LOST_PEER)), died(1, 2.150, None, Some(LOST_PEER))],
            0.0,
            0.0,
            0,
        );
        if let NodeOutcome::Reported(run) = &mut a {
            run.remote_failure = Some(crate::nodes::RemoteFailureLocal {
                what: "rank 3 on node 1 (node-b) was killed by SIGSEGV".into(),
                known_ns: BASE + 2_007 * MS,
                stacks_requested: vec![0, 1],
                torn_down_ns: None,
                stacks_answered: false,
            });
            run.snapshot_ns = Some(BASE + 2_007 * MS);
            let threads = vec![crate::schema::KernelThread {
                tid: 41000,
                name: "ups-doctor".into(),
                wchan: Some("sk_wait_data".into()),
                syscall: Some("45 (recvfrom)".into()),
            }];
            run.snapshots = vec![(
                0,
                crate::schema::ProcessDump {
                    pid: 41000,
                    rank: 0,
                    role: crate::schema::ProcessRole::Rank,
                    taken: Some("the moment rank 3 on node 1 (node-b) was killed by SIGSEGV".into()),
                    py_spy: None,
                    error: None,
                    python: None,
                    threads,
                },
            )];
        }
        let s = merged(vec![
            a,
            node(
                1,
                "node-b",
                vec![died(0, 2.090, None, Some(LOST_PEER)), died(1, 1.990, Some("SIGSEGV"), None)],
                5000.0,
                0.05,
                10,
            ),
        ]);
        insta::assert_snapshot!(crate::report::render_markdown(&fixtures::run(vec![s])));
    }
}
