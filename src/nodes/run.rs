//! One node's part of a multi-node run. Node 0 gathers the agents, runs its own ranks while it
//! relays failures between nodes, then merges every node's result; any other node joins, runs
//! its ranks, and sends its result.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use crate::harness::{self, HarnessError, ScenarioInput};
use crate::scenario::launcher::ClusterWorkers;
use crate::schema::{ProcessDump, ProcessRole, ScenarioResult};

use super::clock::{self, Calibration};
use super::cluster;
use super::merge::{self, MergeInput, NodeOutcome};
use super::net::{Agent, Coordinator, Inbound, JoinTerms, NodeError};
use super::wire::{self, Message, NodeEvent};
use super::{LostNode, NodeConfig, NodePlacement, NodeRun, RemoteFailureLocal};
use crate::harness::run::events::{Listener, RunEvent};

/// How long node 0 waits for the others' results once its own ranks ended, beyond what their
/// scenario may still take (an agent told of a failure ends within its teardown).
const RESULT_WAIT: Duration = Duration::from_secs(60);
/// How often an agent tells node 0 its ranks' steps (also its heartbeat).
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// How often a node's link is told where its ranks are and asked whether another node failed:
/// it has no way to wake the supervision loop, which reads it at this pace.
const LINK_EVERY: Duration = Duration::from_millis(50);

/// What one node's run needs.
pub struct NodeRequest<'a> {
    pub config: &'a NodeConfig,
    pub input: &'a ScenarioInput,
    pub program: &'a Path,
    /// The run's folder (`--out`) and the scenario's folder in it.
    pub out_dir: &'a Path,
    pub rel: &'a str,
    pub progress: &'a mut dyn Listener,
    pub interrupted: &'a AtomicBool,
}

/// How a node's run ended.
pub enum Finished {
    /// Node 0: the merged result; call [`Coordinator::finish`]-style [`finish`] once it is saved.
    Coordinator { result: ScenarioResult, coordinator: Coordinator },
    /// Another node: its own result (local rank numbers) and node 0's verdict (`None` when node
    /// 0 went away before it gave one).
    Agent { result: ScenarioResult, met: Option<bool>, report: Option<String> },
}

/// Tells every agent the merged result is written (`met`: against `expect`).
pub fn finish(coordinator: &Coordinator, met: bool, report: &str) {
    coordinator.broadcast(&Message::Done { met, report: report.to_string() }, None);
}

/// This machine's host name, as the nodes of a run name each other.
pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_or_else(|_| "localhost".into(), |h| h.trim().to_string())
}

/// This node's ranks, supervised as on one machine with `link` to the others.
fn run_here(
    req: &mut NodeRequest,
    placement: &NodePlacement,
    link: &mut dyn Listener,
) -> Result<ScenarioResult, NodeError> {
    let dir = req.out_dir.join(req.rel);
    harness::run_scenario_on_node(
        req.input,
        req.program,
        &dir,
        req.rel,
        req.progress,
        req.interrupted,
        Some((placement, link)),
    )
    .map_err(|e: HarnessError| NodeError::Internal(e.to_string()))
}

/// Ranks per node, or why the world does not divide.
fn ranks_per_node(input: &ScenarioInput, nodes: u32) -> Result<u32, NodeError> {
    let world = input.scenario.launch.world_size;
    if world % nodes != 0 || world < nodes {
        return Err(NodeError::BadInput(format!(
            "{}: `launch.world_size`: {world} ranks do not divide over {nodes} nodes: with `--nodes {nodes}` the world size \
             is the ranks of all nodes together, each node runs `world_size / nodes` of them; use a multiple of {nodes}",
            input.file.display()
        )));
    }
    Ok(world / nodes)
}

/// What a node records about a failure (elsewhere, or the first one of its own), from its
/// link's events, and the snapshot of its live ranks taken the moment it knew.
#[derive(Default)]
struct RemoteRecord {
    known: Option<(String, i64)>,
    stacks_requested: Vec<u32>,
    torn_down_ns: Option<i64>,
    stacks_answered: bool,
    started_ns: Option<i64>,
    /// Pids of the ranks running at the last tick, by local rank.
    live: Vec<Option<u32>>,
    /// py-spy, for an external program's ranks.
    py_spy: Option<std::path::PathBuf>,
    external: bool,
    snapshots: Vec<(u32, ProcessDump)>,
    snapshot_ns: Option<i64>,
}

impl RemoteRecord {
    fn new(input: &ScenarioInput) -> RemoteRecord {
        let external = input.scenario.is_external();
        let program =
            input.scenario.command.as_ref().and_then(|c| c.first()).and_then(|p| harness::find_program(p));
        RemoteRecord {
            external,
            py_spy: external.then(|| harness::find_py_spy(program.as_deref())).flatten(),
            ..Default::default()
        }
    }

    /// Look before kill: what every rank still running is doing, the moment a failure is known
    /// (threads as the kernel sees them, instantly; py-spy's Python stacks for a program's ranks).
    /// The in-process stack request that follows may lose the race with ranks that end on their
    /// own (a peer's closed connection ends them within a second); this does not.
    fn snapshot(&mut self, why: &str, placement: &NodePlacement, except: Option<u32>) {
        if self.snapshot_ns.is_some() {
            return;
        }
        self.snapshot_ns = Some(clock::now_ns());
        let live: Vec<(u32, u32)> = self
            .live
            .iter()
            .enumerate()
            .filter_map(|(l, pid)| Some((l as u32, (*pid)?)))
            .filter(|(l, _)| Some(*l) != except)
            .collect();
        for (l, pid) in live {
            let (rank, role) = (placement.global_rank(l), ProcessRole::Rank);
            let mut dump = if self.external {
                harness::py_spy_dump(self.py_spy.as_deref(), pid, rank, role)
            } else {
                let threads = harness::kernel_threads(pid);
                ProcessDump { pid, rank, role, taken: None, py_spy: None, error: None, python: None, threads }
            };
            dump.taken = Some(format!("the moment {why}"));
            if !dump.threads.is_empty() {
                self.snapshots.push((l, dump));
            }
        }
    }

    fn note(&mut self, event: &RunEvent, placement: &NodePlacement, host: &str) {
        match event {
            RunEvent::Started { start, .. } => self.started_ns = Some(clock::wall_ns_of(*start)),
            RunEvent::Tick { pids, .. } => self.live = pids.to_vec(),
            RunEvent::RankEnded { rank, failed: true, how, .. } => {
                let why = format!(
                    "rank {} on node {} ({host}) {how}",
                    placement.global_rank(*rank),
                    placement.node
                );
                self.snapshot(&why, placement, Some(*rank));
            }
            RunEvent::StacksRequested { ranks, .. } => self.stacks_requested = ranks.clone(),
            RunEvent::TearingDown { stacks_answered, .. }
                if self.known.is_some() && self.torn_down_ns.is_none() =>
            {
                self.torn_down_ns = Some(clock::now_ns());
                self.stacks_answered = *stacks_answered;
            }
            _ => {}
        }
    }

    fn local(&self) -> Option<RemoteFailureLocal> {
        let (what, known_ns) = self.known.clone()?;
        Some(RemoteFailureLocal {
            what,
            known_ns,
            stacks_requested: self.stacks_requested.clone(),
            torn_down_ns: self.torn_down_ns,
            stacks_answered: self.stacks_answered,
        })
    }

    /// Marks the failure elsewhere known now, with its snapshot.
    fn learn(&mut self, what: &str, placement: &NodePlacement) {
        self.known = Some((what.to_string(), clock::now_ns()));
        self.snapshot(what, placement, None);
    }
}

/// The events worth streaming, with global ranks.
fn wire_event(event: &RunEvent, p: &NodePlacement) -> Option<NodeEvent> {
    let g = |l: &u32| p.global_rank(*l);
    Some(match event {
        RunEvent::Started { pids, .. } => {
            NodeEvent::Started { ranks: (0..pids.len() as u32).map(|l| g(&l)).collect(), pids: pids.clone() }
        }
        RunEvent::RankEnded { rank, failed, how, .. } => {
            NodeEvent::RankEnded { rank: g(rank), failed: *failed, how: how.clone() }
        }
        RunEvent::Hung { ranks, .. } => NodeEvent::Hung { ranks: ranks.iter().map(g).collect() },
        RunEvent::StacksRequested { ranks, .. } => {
            NodeEvent::StacksRequested { ranks: ranks.iter().map(g).collect() }
        }
        RunEvent::TearingDown { stacks_answered, .. } => {
            NodeEvent::TearingDown { stacks_answered: *stacks_answered }
        }
        RunEvent::Tick { .. }
        | RunEvent::Placed { .. }
        | RunEvent::ScenarioStarted { .. }
        | RunEvent::ScenarioFinished { .. } => return None,
    })
}

fn steps_of(event: &RunEvent, p: &NodePlacement) -> Option<Vec<(u32, u64)>> {
    match event {
        RunEvent::Tick { states, .. } => {
            Some(states.iter().enumerate().map(|(l, s)| (p.global_rank(l as u32), s.steps_done)).collect())
        }
        _ => None,
    }
}

/// Runs this node's part.
pub fn run_node(req: NodeRequest) -> Result<Finished, NodeError> {
    let config = req.config;
    let local_world = ranks_per_node(req.input, config.nodes)?;
    if config.node == 0 { coordinate(req, local_world) } else { take_part(req, local_world) }
}

// ---------------------------------------------------------------------------------------------
// Node 0

struct CoordinatorLink<'a> {
    coordinator: &'a Coordinator,
    placement: NodePlacement,
    host: String,
    results: BTreeMap<u32, NodeRun>,
    lost: BTreeMap<u32, (i64, String)>,
    last_steps: BTreeMap<u32, Vec<(u32, u64)>>,
    told: bool,
    pending: Option<String>,
    record: RemoteRecord,
}

impl CoordinatorLink<'_> {
    fn host_of(&self, node: u32) -> String {
        self.coordinator.agents.iter().find(|a| a.node == node).map_or_else(String::new, |a| a.host.clone())
    }

    /// Takes in what an agent sent; a failure there is relayed to every other agent (once) and
    /// kept for node 0's own loop.
    fn absorb(&mut self, inbound: Inbound) {
        let failure = match inbound {
            Inbound::Message { node, message, .. } => match message {
                Message::Event { event: NodeEvent::RankEnded { rank, failed: true, how }, .. } => {
                    Some((node, format!("rank {rank} on node {node} ({}) {how}", self.host_of(node))))
                }
                Message::Event { event: NodeEvent::Progress { steps }, .. } => {
                    self.last_steps.insert(node, steps);
                    None
                }
                Message::Result { run } => {
                    self.results.insert(node, *run);
                    None
                }
                _ => None,
            },
            Inbound::Closed { node, at_ns, how } => {
                if self.results.contains_key(&node) {
                    None
                } else {
                    self.lost.insert(node, (at_ns, how.clone()));
                    Some((node, format!("node {node} ({}) was lost: {how}", self.host_of(node))))
                }
            }
        };
        if let Some((node, what)) = failure {
            self.relay(&what, Some(node));
            if self.pending.is_none() && self.record.known.is_none() {
                self.pending = Some(what);
            }
        }
    }

    fn relay(&mut self, what: &str, except: Option<u32>) {
        if !self.told {
            self.told = true;
            self.coordinator.broadcast(&Message::PeerFailed { what: what.to_string() }, except);
        }
    }

    fn drain(&mut self) {
        while let Ok(inbound) = self.coordinator.inbox.try_recv() {
            self.absorb(inbound);
        }
    }
}

impl Listener for CoordinatorLink<'_> {
    fn tick_every(&self) -> Option<Duration> {
        Some(LINK_EVERY)
    }

    fn stop_request(&mut self) -> Option<String> {
        self.drain();
        let what = self.pending.take()?;
        self.record.learn(&what, &self.placement);
        Some(what)
    }

    fn event(&mut self, event: RunEvent) {
        self.placement.follow(&event);
        // The other nodes first: the snapshot here may take a while (py-spy).
        if let RunEvent::RankEnded { rank, failed: true, how, .. } = &event {
            let what = format!("rank {} on node 0 ({}) {how}", self.placement.global_rank(*rank), self.host);
            self.relay(&what, None);
        }
        self.record.note(&event, &self.placement, &self.host);
    }
}

fn coordinate(mut req: NodeRequest, local_world: u32) -> Result<Finished, NodeError> {
    let config = req.config;
    let host = host_name();
    let master_addr = config.coordinator_host();
    let master_port = std::net::TcpListener::bind((master_addr.as_str(), 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| {
            NodeError::BadInput(format!(
                "cannot open a port for the ranks' rendezvous on `{master_addr}`: {e}"
            ))
        })?;
    let hash = wire::scenario_hash(&req.input.scenario);
    let run_id = format!("ups-doctor-{}-{}", std::process::id(), clock::now_ns());
    let terms = JoinTerms {
        nodes: config.nodes,
        scenario: &req.input.scenario,
        scenario_hash: &hash,
        scenario_name: &req.input.scenario.name,
        master_addr: &master_addr,
        master_port,
        run_id: &run_id,
    };
    let coordinator = Coordinator::gather(config, &terms)?;
    let placement = NodePlacement {
        node: 0,
        nodes: config.nodes,
        local_world,
        master_addr,
        master_port,
        first_rank: None,
    };
    let mut link = CoordinatorLink {
        coordinator: &coordinator,
        placement: placement.clone(),
        host: host.clone(),
        results: BTreeMap::new(),
        lost: BTreeMap::new(),
        last_steps: BTreeMap::new(),
        told: false,
        pending: None,
        record: RemoteRecord::new(req.input),
    };
    let own_calibration = Calibration::identity(clock::now_ns());
    let local = run_here(&mut req, &placement, &mut link)?;
    if local.interrupted {
        link.relay("node 0 was interrupted (Ctrl-C or SIGTERM)", None);
    }
    let cluster = cluster_driver(req.input, &local, &req.out_dir.join(req.rel));
    if let Some((_, driver)) = &cluster {
        coordinator.broadcast(&job_ended(driver, &link.host), None);
    }
    // The others' results: they end soon after a failure was relayed, else when their ranks do.
    let wait = RESULT_WAIT + Duration::from_secs_f64(req.input.scenario.limits.timeout_s);
    let deadline = Instant::now() + wait;
    while link.results.len() + link.lost.len() < coordinator.agents.len() {
        match coordinator.inbox.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(inbound) => link.absorb(inbound),
            Err(_) => {
                let now = clock::now_ns();
                for a in &coordinator.agents {
                    if !link.results.contains_key(&a.node) && !link.lost.contains_key(&a.node) {
                        link.lost.insert(
                            a.node,
                            (now, format!("no result within {:.0} s of node 0's end", wait.as_secs_f64())),
                        );
                    }
                }
                break;
            }
        }
    }
    let started_ns = link.record.started_ns.unwrap_or(own_calibration.start.at_ns);
    let mut nodes = vec![NodeOutcome::Reported(Box::new(NodeRun {
        node: 0,
        host,
        agent_pid: std::process::id(),
        local_world,
        first_rank: link.placement.first_rank,
        started_ns,
        calibration: own_calibration,
        remote_failure: link.record.local(),
        snapshots: std::mem::take(&mut link.record.snapshots),
        snapshot_ns: link.record.snapshot_ns,
        out_dir: req.out_dir.display().to_string(),
        result: local,
    }))];
    for a in &coordinator.agents {
        if let Some(run) = link.results.remove(&a.node) {
            nodes.push(NodeOutcome::Reported(Box::new(run)));
        } else {
            let (at_ns, how) =
                link.lost.get(&a.node).cloned().unwrap_or((clock::now_ns(), "no result".into()));
            nodes.push(NodeOutcome::Lost {
                node: a.node,
                host: a.host.clone(),
                agent_pid: Some(a.pid),
                calibration: None,
                lost: LostNode {
                    at_s: (at_ns - started_ns) as f64 / 1e9,
                    how,
                    last_steps: link.last_steps.get(&a.node).cloned().unwrap_or_default(),
                },
            });
        }
    }
    let result = merge::merge(MergeInput {
        scenario: &req.input.scenario,
        file: req.input.file.display().to_string(),
        overrides: req.input.overrides.clone(),
        coordinator: coordinator.address.clone(),
        ranks_per_node: local_world,
        nodes,
        cluster,
    });
    drop(link);
    Ok(Finished::Coordinator { result, coordinator })
}

/// Where node 0's launcher is a cluster's (Ray Train's driver): what the cluster says of its
/// workers, and how the driver ended with what it printed (the last [`DRIVER_BYTES`] of each of
/// its logs), for the other nodes' ranks.
/// Its logs are named relative to `dir`, the scenario's folder of the run.
fn cluster_driver(
    input: &ScenarioInput,
    local: &ScenarioResult,
    dir: &Path,
) -> Option<(&'static ClusterWorkers, cluster::DriverOutput)> {
    let external = local.external.as_ref()?;
    let workers = harness::cluster_workers(input, &external.argv)?;
    let launcher = external.launcher.as_ref()?;
    let lines = |path: &str| {
        let bytes = tail_of(&dir.join(path), DRIVER_BYTES).unwrap_or_default();
        String::from_utf8_lossy(&bytes).lines().map(str::to_string).collect::<Vec<_>>()
    };
    let driver = cluster::DriverOutput {
        exit_code: launcher.exit_code,
        signal: launcher.signal,
        stderr: lines(&launcher.stderr_log),
        stdout: lines(&launcher.stdout_log),
    };
    Some((workers, driver))
}

/// What node 0 tells the other agents as the job's driver (a cluster's, on `host`) ended.
fn job_ended(driver: &cluster::DriverOutput, host: &str) -> Message {
    let how = match (driver.exit_code, driver.signal) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by {signal}"),
        (None, None) => "ended".to_string(),
    };
    let how = format!("the job's driver on node 0 ({host}) {how}");
    Message::JobEnded { how, exit_code: driver.exit_code, signal: driver.signal }
}

/// A node whose ranks are a cluster's workers, ended because the job's driver on node 0 did: its
/// own view judged by how the driver ended (its workers end with the job, and its own launcher,
/// the node's `ray start`, was ended by ups-doctor because the job was over), as node 0 judges
/// them in the merged result.
fn judge_as_the_job_ended(input: &ScenarioInput, local: &mut ScenarioResult, driver: &cluster::DriverOutput) {
    let argv = local.external.as_ref().map(|e| e.argv.clone()).unwrap_or_default();
    let Some(workers) = harness::cluster_workers(input, &argv) else { return };
    cluster::account(&mut local.ranks, |_| true, workers, driver);
    crate::diagnose::conclude(local, crate::diagnose::Seen::Ran);
}

/// How much of the end of each of the driver's logs node 0 reads for the other nodes' workers.
const DRIVER_BYTES: u64 = 4 << 20;

/// The last `bytes` of a file, from the start of a line.
fn tail_of(path: &Path, bytes: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(bytes)))?;
    let mut text = Vec::new();
    file.read_to_end(&mut text)?;
    if len > bytes {
        let line = text.iter().position(|b| *b == b'\n').map_or(text.len(), |i| i + 1);
        text.drain(..line);
    }
    Ok(text)
}

// ---------------------------------------------------------------------------------------------
// Other nodes

struct AgentLink<'a> {
    agent: &'a mut Agent,
    placement: NodePlacement,
    host: String,
    peer_failed: Option<String>,
    /// The job ended on node 0 (a cluster's workers): this node's part ends too. How it ended,
    /// and whether that was told to the run here yet.
    job_ended: Option<(String, cluster::DriverOutput, bool)>,
    gone: bool,
    done: Option<(bool, String)>,
    last_progress: Option<Instant>,
    record: RemoteRecord,
}

impl AgentLink<'_> {
    fn take(&mut self, m: Option<Message>) {
        match m {
            Some(Message::PeerFailed { what }) => {
                self.peer_failed.get_or_insert(what);
            }
            Some(Message::JobEnded { how, exit_code, signal }) => {
                let driver = cluster::DriverOutput { exit_code, signal, ..Default::default() };
                self.job_ended.get_or_insert((how, driver, false));
            }
            Some(Message::Done { met, report }) => self.done = Some((met, report)),
            Some(_) => {}
            None => self.gone = true,
        }
    }

    fn send_event(&mut self, event: NodeEvent) {
        let m = Message::Event { node: self.placement.node, at_ns: clock::now_ns(), event };
        if self.agent.send(&m).is_err() {
            self.gone = true;
        }
    }
}

impl Listener for AgentLink<'_> {
    fn tick_every(&self) -> Option<Duration> {
        Some(LINK_EVERY)
    }

    fn stop_request(&mut self) -> Option<String> {
        if self.record.known.is_some() {
            return None;
        }
        while !self.gone {
            match self.agent.next(Duration::ZERO) {
                Ok(Some(m)) => self.take(Some(m)),
                Ok(None) => break,
                Err(()) => self.take(None),
            }
        }
        let what = self.peer_failed.clone().or_else(|| {
            self.gone.then(|| "node 0's agent (the coordinator) went away: its connection closed".to_string())
        });
        let Some(what) = what else {
            // Not a failure here or elsewhere: the job is over, and its end is told by node 0.
            let (how, _, told) = self.job_ended.as_mut()?;
            return (!std::mem::replace(told, true)).then(|| how.clone());
        };
        self.record.learn(&what, &self.placement);
        Some(what)
    }

    fn event(&mut self, event: RunEvent) {
        self.placement.follow(&event);
        if let Some(steps) = steps_of(&event, &self.placement) {
            if self.last_progress.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) {
                self.last_progress = Some(Instant::now());
                self.send_event(NodeEvent::Progress { steps });
            }
        } else if let Some(e) = wire_event(&event, &self.placement) {
            self.send_event(e);
        }
        // After node 0 heard of it: the snapshot here may take a while (py-spy).
        self.record.note(&event, &self.placement, &self.host);
    }
}

fn take_part(mut req: NodeRequest, local_world: u32) -> Result<Finished, NodeError> {
    let config = req.config;
    let host = host_name();
    let join = Message::Join {
        node: config.node,
        nodes: config.nodes,
        host: host.clone(),
        pid: std::process::id(),
        scenario_hash: wire::scenario_hash(&req.input.scenario),
        scenario_name: req.input.scenario.name.clone(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        scenario: Some(Box::new(req.input.scenario.clone())),
    };
    let mut agent = Agent::join(config, join)?;
    let (master_addr, master_port, _run_id) = agent.welcome.clone();
    let placement = NodePlacement {
        node: config.node,
        nodes: config.nodes,
        local_world,
        master_addr,
        master_port,
        first_rank: None,
    };
    let mut early: Vec<Option<Message>> = Vec::new();
    let start = agent
        .calibrate(&mut |m| early.push(m))
        .ok_or_else(|| NodeError::Internal(format!("node {}: node 0 answered no clock ping", config.node)))?;
    let mut link = AgentLink {
        agent: &mut agent,
        placement: placement.clone(),
        host: host.clone(),
        peer_failed: None,
        job_ended: None,
        gone: false,
        done: None,
        last_progress: None,
        record: RemoteRecord::new(req.input),
    };
    for m in early {
        link.take(m);
    }
    let local = run_here(&mut req, &placement, &mut link)?;
    // Node 0 is sent what this node saw, and judges it with the driver's output; this node's own
    // view is judged by how the driver ended.
    let mut own_view = local.clone();
    if let Some((_, driver, _)) = link.job_ended.take() {
        judge_as_the_job_ended(req.input, &mut own_view, &driver);
    }
    let (mut record, mut gone, mut done) = (std::mem::take(&mut link.record), link.gone, link.done.take());
    let first_rank = link.placement.first_rank;
    drop(link);
    let mut late: Vec<Option<Message>> = Vec::new();
    let end = if gone { None } else { agent.calibrate(&mut |m| late.push(m)) };
    for m in late {
        match m {
            Some(Message::Done { met, report }) => done = Some((met, report)),
            None => gone = true,
            _ => {}
        }
    }
    let run = NodeRun {
        node: config.node,
        host,
        agent_pid: std::process::id(),
        local_world,
        first_rank,
        started_ns: record.started_ns.unwrap_or(start.at_ns),
        calibration: Calibration { start, end },
        remote_failure: record.local(),
        snapshots: std::mem::take(&mut record.snapshots),
        snapshot_ns: record.snapshot_ns,
        out_dir: req.out_dir.display().to_string(),
        result: local,
    };
    if !gone && agent.send(&Message::Result { run: Box::new(run) }).is_err() {
        gone = true;
    }
    // Node 0 merges once its own ranks and every node ended.
    let wait = RESULT_WAIT + Duration::from_secs_f64(req.input.scenario.limits.timeout_s);
    let deadline = Instant::now() + wait;
    while done.is_none() && !gone && Instant::now() < deadline {
        match agent.next(Duration::from_millis(200)) {
            Ok(Some(Message::Done { met, report })) => done = Some((met, report)),
            Ok(_) => {}
            Err(()) => gone = true,
        }
    }
    let (met, report) = done.map_or((None, None), |(m, r)| (Some(m), Some(r)));
    Ok(Finished::Agent { result: own_view, met, report })
}
