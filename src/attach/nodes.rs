//! `ups-doctor attach` on several nodes (`--nodes N --node-rank R --coordinator HOST:PORT` on
//! each): every node attaches to its share of the job over the same window. Node 0 gathers the
//! others over the wire of a multi-node run ([`crate::nodes::net`]), places their windows on its
//! own clock (each agent calibrates before and after its window) and judges every rank at once.
//! The others send what their window saw, keep their own report, and end with node 0's verdict.
//! Nothing is signalled here either: a node signals only its own job, and only with `--then stop`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::Error;
use crate::nodes::NodeConfig;
use crate::nodes::clock::{self, Calibration};
use crate::nodes::net::{Agent, Coordinator, Inbound, JoinTerms, NodeError};
use crate::nodes::wire::{self, Message};
use crate::scenario::Scenario;
use crate::schema::{IdentifiedBy, LostNode, NodeSection, NodesReport, ProcessDump};

use super::job;
use super::judge::{self, RankView, State};
use super::machine::{Judging, Local, stop_and_record, tell, write_attach};

/// How long node 0 waits for the others' findings once its own window is over (theirs began
/// within a few milliseconds of its own).
const FINDINGS_WAIT: Duration = Duration::from_secs(60);
/// What each node runs, for the hint of a failed join.
const EACH_NODE_RUNS: &str = "ups-doctor attach PID";

/// What one node's window saw, as it goes to node 0.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Findings {
    pub node: u32,
    pub host: String,
    /// The `ups-doctor attach` process there.
    pub agent_pid: u32,
    pub attached_to: u32,
    /// Its own copy of the report, on its host.
    pub out_dir: String,
    /// When its window began, on its own clock (ns since the Unix epoch).
    pub window_start_ns: i64,
    pub window_s: f64,
    /// Its clock against node 0's, before and after its window.
    pub clock: Option<Calibration>,
    pub world_size: Option<u32>,
    pub master: Option<String>,
    pub run_id: Option<String>,
    pub views: Vec<RankView>,
    /// How each of its ranks was told (`RANK`, spawn order, …).
    pub identified: Vec<(u32, IdentifiedBy)>,
    pub children: Vec<(u32, ProcessDump)>,
    /// Its evidence before the judge's: how it read the job, memory, `/dev/shm`, connections.
    pub front: Vec<String>,
    /// Its own verdict, as if it had attached alone.
    pub own_headline: String,
    /// Its `attach.json`.
    pub record: serde_json::Value,
}

/// Every node's ranks together, for the one judge.
#[derive(Debug)]
pub struct Merged {
    pub views: Vec<RankView>,
    pub children: Vec<(u32, ProcessDump)>,
    /// Ranks of `WORLD_SIZE` no node found; none are counted while a node is lost (its ranks
    /// were not read).
    pub missing: Vec<u32>,
    pub world: Option<u32>,
    pub front: Vec<String>,
}

/// Why the nodes' findings are not one job's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    /// `node` read another job than node `first`: its `what` is `there`, node `first`'s `here`.
    #[error(
        "node {node} ({host}) attached to another job than node {first}: {what} `{there}` there, `{here}` on node \
         {first}; give each node a pid of the same job (`ups-doctor attach --all` lists the jobs on a machine)"
    )]
    OtherJob { node: u32, host: String, first: u32, what: &'static str, there: String, here: String },
    #[error(
        "rank {rank} was found on node {first} and on node {second}: not one job, or a node attached twice to the \
         same machine's job; give each node a pid of its own share of the job"
    )]
    RankTwice { rank: u32, first: u32, second: u32 },
}

/// The nodes' findings (node 0's first) judged as one job; `lost` are the nodes that sent none,
/// with how. Refused when the nodes did not attach to one job: another `TORCHELASTIC_RUN_ID`,
/// rendezvous or `WORLD_SIZE`, or a rank found on two nodes.
pub fn merge(all: &[Findings], lost: &[(u32, String)]) -> Result<Merged, MergeError> {
    let first = &all[0];
    for f in &all[1..] {
        let differs = [
            ("TORCHELASTIC_RUN_ID", &first.run_id, &f.run_id),
            ("MASTER_ADDR:PORT", &first.master, &f.master),
            ("WORLD_SIZE", &first.world_size.map(|w| w.to_string()), &f.world_size.map(|w| w.to_string())),
        ]
        .into_iter()
        .find_map(|(what, here, there)| match (here, there) {
            (Some(here), Some(there)) if here != there => Some(MergeError::OtherJob {
                node: f.node,
                host: f.host.clone(),
                first: first.node,
                what,
                there: there.clone(),
                here: here.clone(),
            }),
            _ => None,
        });
        if let Some(refused) = differs {
            return Err(refused);
        }
    }
    let mut owner: BTreeMap<u32, u32> = BTreeMap::new();
    for f in all {
        for v in &f.views {
            if let Some(other) = owner.insert(v.rank, f.node) {
                return Err(MergeError::RankTwice { rank: v.rank, first: other, second: f.node });
            }
        }
    }
    let world = all.iter().find_map(|f| f.world_size);
    let mut views: Vec<RankView> = all.iter().flat_map(|f| f.views.iter().cloned()).collect();
    views.sort_by_key(|v| v.rank);
    for v in &mut views {
        v.reread();
    }
    let children = all.iter().flat_map(|f| f.children.iter().cloned()).collect();
    let not_found: Vec<u32> =
        world.map(|w| (0..w).filter(|r| !owner.contains_key(r)).collect()).unwrap_or_default();
    let mut front = Vec::new();
    for f in all {
        front.extend(f.front.iter().map(|line| format!("node {} ({}): {line}", f.node, f.host)));
    }
    for (node, how) in lost {
        front.push(format!("node {node}: sent nothing ({how}); its ranks were not read"));
    }
    let missing = if lost.is_empty() {
        not_found
    } else {
        if !not_found.is_empty() {
            front.push(format!(
                "{} not found on the nodes that answered: not judged gone, as they may be the lost node's",
                judge::ranks_text(&not_found)
            ));
        }
        Vec::new()
    };
    Ok(Merged { views, children, missing, world, front })
}

/// What every node's attach joins with: the same for all, so the join compares only the count.
fn join_scenario(nodes: u32) -> Scenario {
    let mut s =
        Scenario { name: "attach".into(), command: Some(vec!["attach".into()]), ..Scenario::default() };
    s.launch.nodes = nodes;
    s
}

fn node_error(e: NodeError) -> Error {
    match e {
        NodeError::BadInput(m) => Error::BadInput(m),
        NodeError::Internal(m) => Error::Internal(m),
    }
}

/// How one node takes part.
pub struct Part<'a> {
    pub pid: u32,
    pub out: &'a Path,
    pub window: Duration,
    pub native: bool,
    pub stop: bool,
}

/// One node's part of a multi-node attach; whether the job is running (the verdict node 0
/// merged, on every node).
pub fn attach(part: Part, mut config: NodeConfig) -> Result<bool, Error> {
    config.each_node_runs = EACH_NODE_RUNS;
    let job = job::find(part.pid).map_err(|e| Error::BadInput(e.to_string()))?;
    if config.node == 0 { coordinate(part, &config, job) } else { join(part, &config, job) }
}

/// Node 0: gathers the others, watches its own share, merges, judges, writes the one report.
fn coordinate(part: Part, config: &NodeConfig, job: job::Job) -> Result<bool, Error> {
    let (heads, everyone) = job.first_seen();
    let scenario = join_scenario(config.nodes);
    let hash = wire::scenario_hash(&scenario);
    let terms = JoinTerms {
        nodes: config.nodes,
        scenario: &scenario,
        scenario_hash: &hash,
        scenario_name: "attach",
        master_addr: "",
        master_port: 0,
        run_id: "attach",
    };
    eprintln!(
        "node 0 of {}: waiting for `{EACH_NODE_RUNS} --nodes {} --node-rank R --coordinator {}` on the others",
        config.nodes, config.nodes, config.coordinator
    );
    let coordinator = Coordinator::gather(config, &terms).map_err(node_error)?;
    let local = Local::observe(part.pid, job, part.window, part.native);
    let (_, own, own_record) = local.judge(Judging::alone(&local));
    let mine = findings(&local, 0, part.out, None, own.scenarios[0].verdict.headline.clone(), own_record);
    let (theirs, lost) = gather_findings(&coordinator, config.nodes);
    let mut all = vec![mine];
    all.extend(theirs);
    let lost_how: Vec<(u32, String)> = lost.iter().map(|(n, how, _)| (*n, how.clone())).collect();
    let merged = match merge(&all, &lost_how) {
        Ok(m) => m,
        Err(why) => {
            coordinator.broadcast(&Message::Refused { reason: why.to_string() }, None);
            return Err(Error::BadInput(why.to_string()));
        }
    };
    let hosts: BTreeMap<u32, String> = coordinator.agents.iter().map(|a| (a.node, a.host.clone())).collect();
    let per_node = sections(&all, &lost, &hosts, local.started_ns);
    let n = config.nodes;
    let report = NodesReport {
        nodes: n,
        ranks_per_node: all.iter().map(|f| f.views.len() as u32).max().unwrap_or(0),
        coordinator: coordinator.address.clone(),
        first_failure: None,
        order_note: None,
        per_node,
        attached: true,
    };
    let views = merged.views.clone();
    let judging = Judging {
        views: merged.views,
        children: merged.children,
        missing: merged.missing,
        identified: all.iter().flat_map(|f| f.identified.iter().copied()).collect(),
        world: merged.world,
        scope: format!("on any of the {n} nodes"),
        front: merged.front,
        nodes: Some(report),
    };
    let (state, mut run, mut record) = local.judge(judging);
    record["nodes"] = json!(all.iter().map(|f| &f.record).collect::<Vec<_>>());
    record["nodes_lost"] = json!(lost_how);
    let mut path = write_attach(part.out, &run, &record)?;
    let met = state == State::Running;
    let shown = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
    coordinator.broadcast(&Message::Done { met, report: shown.display().to_string() }, None);
    if part.stop {
        path = stop_and_record(part.out, &mut run, &mut record, &heads, &everyone)?;
    }
    tell(&run, &views, &path);
    Ok(met)
}

/// What a node's window saw, ready to send (or, for node 0, to merge with the others').
fn findings(
    local: &Local,
    node: u32,
    out: &Path,
    clock: Option<Calibration>,
    own_headline: String,
    record: serde_json::Value,
) -> Findings {
    Findings {
        node,
        host: crate::nodes::run::host_name(),
        agent_pid: std::process::id(),
        attached_to: local.pid,
        out_dir: out.display().to_string(),
        window_start_ns: local.started_ns,
        window_s: local.window_s,
        clock,
        world_size: local.job.world_size,
        master: local.job.master.clone(),
        run_id: local.job.run_id.clone(),
        views: local.views.clone(),
        identified: local.identified(),
        children: local.children.clone(),
        front: local.front(),
        own_headline,
        record,
    }
}

/// The others' findings, and the nodes lost: (node, how, when on node 0's clock).
type Gathered = (Vec<Findings>, Vec<(u32, String, i64)>);

fn gather_findings(coordinator: &Coordinator, nodes: u32) -> Gathered {
    let deadline = Instant::now() + FINDINGS_WAIT;
    let mut got: Vec<Findings> = Vec::new();
    let mut lost: Vec<(u32, String, i64)> = Vec::new();
    let answered = |got: &[Findings], lost: &[(u32, String, i64)], node: u32| {
        got.iter().any(|f| f.node == node) || lost.iter().any(|l| l.0 == node)
    };
    while (got.len() + lost.len()) < (nodes - 1) as usize {
        match coordinator.inbox.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(Inbound::Message { node, at_ns, message: Message::Findings { findings, .. } }) => {
                match serde_json::from_value::<Findings>(*findings) {
                    Ok(f) if f.node == node => got.push(f),
                    Ok(f) => lost.push((node, format!("its findings say node {}", f.node), at_ns)),
                    Err(e) => lost.push((node, format!("its findings could not be read: {e}"), at_ns)),
                }
            }
            Ok(Inbound::Message { .. }) => {}
            Ok(Inbound::Closed { node, at_ns, how }) => {
                if !answered(&got, &lost, node) {
                    lost.push((node, how, at_ns));
                }
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
        }
    }
    for node in 1..nodes {
        if !answered(&got, &lost, node) {
            let how = format!("no findings within {} s of node 0's window", FINDINGS_WAIT.as_secs());
            lost.push((node, how, clock::now_ns()));
        }
    }
    got.sort_by_key(|f| f.node);
    lost.sort_by_key(|l| l.0);
    (got, lost)
}

/// One section per node for the report: its host, ranks, clock, window and own verdict; node 0's
/// window (which began at `start_ns`) is the timeline.
fn sections(
    all: &[Findings],
    lost: &[(u32, String, i64)],
    hosts: &BTreeMap<u32, String>,
    start_ns: i64,
) -> Vec<NodeSection> {
    let on_timeline = |ns: i64| (ns - start_ns) as f64 / 1e9;
    let mut out: Vec<NodeSection> = all
        .iter()
        .map(|f| {
            let started = match (f.node, &f.clock) {
                (0, _) => Some(0.0),
                (_, Some(c)) => Some(on_timeline(c.to_coordinator_ns(f.window_start_ns))),
                (_, None) => None,
            };
            NodeSection {
                agent_pid: Some(f.agent_pid),
                clock: f.clock,
                started_at_s: started,
                own_headline: Some(f.own_headline.clone()),
                wall_s: Some(f.window_s),
                out_dir: Some(f.out_dir.clone()),
                ..NodeSection::new(f.node, f.host.clone(), f.views.iter().map(|v| v.rank).collect())
            }
        })
        .collect();
    out.extend(lost.iter().map(|(node, how, at_ns)| NodeSection {
        lost: Some(LostNode { at_s: on_timeline(*at_ns), how: how.clone(), last_steps: Vec::new() }),
        ..NodeSection::new(*node, hosts.get(node).cloned().unwrap_or_else(|| "?".into()), Vec::new())
    }));
    out.sort_by_key(|s| s.node);
    out
}

/// Any other node: joins node 0, watches its own share, writes its own report, sends its
/// findings and waits for node 0's verdict.
fn join(part: Part, config: &NodeConfig, job: job::Job) -> Result<bool, Error> {
    let (heads, everyone) = job.first_seen();
    let scenario = join_scenario(config.nodes);
    let hello = Message::Join {
        node: config.node,
        nodes: config.nodes,
        host: crate::nodes::run::host_name(),
        pid: std::process::id(),
        scenario_hash: wire::scenario_hash(&scenario),
        scenario_name: scenario.name.clone(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        scenario: None,
    };
    let mut agent = Agent::join(config, hello).map_err(node_error)?;
    let start = agent.calibrate(&mut |_| {});
    let local = Local::observe(part.pid, job, part.window, part.native);
    let end = agent.calibrate(&mut |_| {});
    let clock = start.map(|start| Calibration { start, end });
    // Its own report first: what this node saw stays on its host whatever node 0 does.
    let (own, mut run, mut record) = local.judge(Judging::alone(&local));
    let mut path = write_attach(part.out, &run, &record)?;
    let headline = run.scenarios[0].verdict.headline.clone();
    let mine = findings(&local, config.node, part.out, clock, headline, record.clone());
    let sent =
        serde_json::to_value(&mine).map_err(|e| Error::Internal(format!("findings: {e}"))).and_then(|v| {
            agent
                .send(&Message::Findings { node: config.node, findings: Box::new(v) })
                .map_err(|e| Error::Internal(format!("sending the findings to node 0: {e}")))
        });
    let verdict = sent.map(|()| wait_for_verdict(&mut agent));
    if part.stop {
        path = stop_and_record(part.out, &mut run, &mut record, &heads, &everyone)?;
    }
    eprint!("this node alone: ");
    tell(&run, &local.views, &path);
    match verdict.map_err(|e| e.to_string()).and_then(|v| v) {
        Ok((met, report)) => {
            eprintln!("node 0 judged every node's ranks together: {report} (on node 0)");
            Ok(met)
        }
        Err(why) => {
            eprintln!("warning: {why}; this node's own report stands");
            Ok(own == State::Running)
        }
    }
}

/// Node 0's verdict on the merged job (`met`, its report's path there), or why there is none:
/// node 0 refused to merge (the nodes read different jobs), closed the connection, or said
/// nothing in time.
fn wait_for_verdict(agent: &mut Agent) -> Result<(bool, String), String> {
    let deadline = Instant::now() + FINDINGS_WAIT;
    loop {
        match agent.next(deadline.saturating_duration_since(Instant::now())) {
            Ok(Some(Message::Done { met, report })) => return Ok((met, report)),
            Ok(Some(Message::Refused { reason })) => return Err(format!("node 0 did not merge: {reason}")),
            Ok(Some(_)) => {}
            Ok(None) if Instant::now() < deadline => {}
            Ok(None) => return Err(format!("node 0 gave no verdict within {} s", FINDINGS_WAIT.as_secs())),
            Err(()) => return Err("node 0 closed the connection before its verdict".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attach::judge::Motion;

    fn view(rank: u32, motion: Motion) -> RankView {
        RankView {
            rank,
            pid: 100 + rank,
            motion,
            cpu_s: Some(0.0),
            looks: 4,
            frames: Vec::new(),
            py_spy: Some(format!("Thread {} (idle): \"MainThread\"\n    barrier (ddp.py:48)\n", 100 + rank)),
            error: None,
            threads: Vec::new(),
        }
    }

    fn node(n: u32, ranks: &[u32]) -> Findings {
        Findings {
            node: n,
            host: format!("h{n}"),
            agent_pid: 1,
            attached_to: 2,
            out_dir: "/o".into(),
            window_start_ns: 0,
            window_s: 3.0,
            clock: None,
            world_size: Some(4),
            master: Some("10.0.0.1:29500".into()),
            run_id: Some("job".into()),
            views: ranks.iter().map(|&r| view(r, Motion::Stuck)).collect(),
            identified: Vec::new(),
            children: Vec::new(),
            front: vec!["read".into()],
            own_headline: "Hung".into(),
            record: json!({}),
        }
    }

    #[test]
    fn every_nodes_ranks_are_judged_together_and_a_rank_no_node_found_is_missing() {
        let m = merge(&[node(0, &[0, 1]), node(1, &[3])], &[]).unwrap();
        assert_eq!(m.views.iter().map(|v| v.rank).collect::<Vec<_>>(), [0, 1, 3]);
        assert_eq!(m.missing, [2]);
        assert!(!m.views[2].frames.is_empty(), "frames are read again from the py-spy text");
        assert_eq!(m.front, ["node 0 (h0): read", "node 1 (h1): read"]);
        // While a node is lost, a rank not found may be its own: not judged gone.
        let m = merge(&[node(0, &[0, 1])], &[(1, "its connection closed".into())]).unwrap();
        assert!(m.missing.is_empty());
        assert!(
            m.front.iter().any(|l| l.starts_with("ranks 2, 3 not found on the nodes that answered")),
            "{:?}",
            m.front
        );
    }

    #[test]
    fn nodes_attached_to_different_jobs_are_refused_naming_what_differs() {
        let mut other = node(1, &[2, 3]);
        other.run_id = Some("another".into());
        let why = merge(&[node(0, &[0, 1]), other], &[]).unwrap_err().to_string();
        assert_eq!(
            why,
            "node 1 (h1) attached to another job than node 0: TORCHELASTIC_RUN_ID `another` there, `job` on node 0; \
             give each node a pid of the same job (`ups-doctor attach --all` lists the jobs on a machine)"
        );
        let why = merge(&[node(0, &[0, 1]), node(1, &[1, 2])], &[]).unwrap_err().to_string();
        assert_eq!(
            why,
            "rank 1 was found on node 0 and on node 1: not one job, or a node attached twice to the same machine's \
             job; give each node a pid of its own share of the job"
        );
    }
}
