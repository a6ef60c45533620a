//! The sockets: node 0 listens and gathers the agents ([`Coordinator`]); every other node
//! connects and joins ([`Agent`]). One TCP connection per agent, [`super::wire`] messages on it.
//! The coordinator answers clock pings on each connection's reader thread, so that the answer
//! does not wait for the supervision loop.

use std::io::BufReader;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::clock::{self, Sample};
use super::config::{NodeConfig, split_host_port};
use super::wire::{self, Message};

/// How long a joining agent gets to say who it is.
const JOIN_READ_WAIT: Duration = Duration::from_secs(10);
/// An agent that sends nothing for this long while its node runs is lost (agents send progress
/// about once a second; a host that vanished closes nothing).
pub const SILENCE_LOST: Duration = Duration::from_secs(30);
/// How often an agent says it is alive (well inside [`SILENCE_LOST`]).
const HEARTBEAT_EVERY: Duration = Duration::from_secs(2);
/// Round trips per calibration (the shortest one counts).
const CALIBRATION_SAMPLES: usize = 16;

/// Why a node could not take part: `BadInput` is the user's to fix (exit 2), `Internal` ours.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("{0}")]
    BadInput(String),
    #[error("{0}")]
    Internal(String),
}

impl NodeError {
    /// The message, whichever kind.
    pub fn into_message(self) -> String {
        match self {
            NodeError::BadInput(m) | NodeError::Internal(m) => m,
        }
    }
}

/// One joined agent, as node 0 sees it.
pub struct Joined {
    pub node: u32,
    pub host: String,
    pub pid: u32,
    writer: Arc<Mutex<TcpStream>>,
}

impl Joined {
    /// Sends a message; a failure means the agent is gone, which its reader reports.
    pub fn send(&self, m: &Message) {
        if let Ok(mut w) = self.writer.lock() {
            let _ = wire::send(&mut *w, m);
        }
    }
}

/// What node 0 hears from its agents.
#[derive(Debug)]
pub enum Inbound {
    Message {
        node: u32,
        at_ns: i64,
        message: Message,
    },
    /// The connection ended (or fell silent) before the agent said goodbye.
    Closed {
        node: u32,
        at_ns: i64,
        how: String,
    },
}

/// Node 0's side: the joined agents and what they send.
pub struct Coordinator {
    pub agents: Vec<Joined>,
    pub inbox: Receiver<Inbound>,
    pub address: String,
}

/// What an agent must match to join.
pub struct JoinTerms<'a> {
    pub nodes: u32,
    pub scenario: &'a crate::scenario::Scenario,
    pub scenario_hash: &'a str,
    pub scenario_name: &'a str,
    pub master_addr: &'a str,
    pub master_port: u16,
    pub run_id: &'a str,
}

/// The address node 0 listens on: `--listen`, else the coordinator's address. Every interface
/// (`0.0.0.0`, `::`) only when `--listen` asks for it.
fn listen_address(config: &NodeConfig) -> Result<SocketAddr, NodeError> {
    let text = config.listen.as_deref().unwrap_or(&config.coordinator);
    let bad = |why: String| NodeError::BadInput(format!("cannot listen for node agents on `{text}`: {why}"));
    let (host, port) = split_host_port(text).ok_or_else(|| bad("not HOST:PORT".into()))?;
    let addr = (host, port)
        .to_socket_addrs()
        .map_err(|e| bad(e.to_string()))?
        .next()
        .ok_or_else(|| bad("the host resolves to no address".into()))?;
    if addr.ip().is_unspecified() && config.listen.is_none() {
        return Err(NodeError::BadInput(format!(
            "`--coordinator {}` is every interface: agents need node 0's own address to connect to; give it, \
             and add `--listen {}` if node 0 should listen on every interface",
            config.coordinator, config.coordinator
        )));
    }
    Ok(addr)
}

impl Coordinator {
    /// Listens, and waits until every other node's agent joined (or `config.join_timeout`).
    /// An agent with another scenario, node count or a duplicate node rank is refused, and so is
    /// the run: every joined agent is told why.
    ///
    /// Long: the join protocol in one loop over the listener: every refusal (another scenario,
    /// node count or node rank, a timeout) is answered to every agent already joined before the
    /// run is refused, which needs the listener, the joined agents and the deadline together.
    pub fn gather(config: &NodeConfig, terms: &JoinTerms) -> Result<Coordinator, NodeError> {
        let addr = listen_address(config)?;
        let listener = TcpListener::bind(addr).map_err(|e| {
            NodeError::BadInput(format!(
                "cannot listen for node agents on {addr}: {e}\n  hint: another run may hold the port; pick another with \
                 `--coordinator HOST:PORT` on every node (or `UPS_DOCTOR_COORDINATOR_PORT`)"
            ))
        })?;
        listener.set_nonblocking(true).map_err(|e| NodeError::Internal(e.to_string()))?;
        let deadline = Instant::now() + config.join_timeout;
        let mut joined: Vec<(Joined, BufReader<TcpStream>)> = Vec::new();
        while (joined.len() as u32) < terms.nodes - 1 {
            let stream = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing: Vec<String> = (1..terms.nodes)
                            .filter(|n| !joined.iter().any(|(j, _)| j.node == *n))
                            .map(|n| n.to_string())
                            .collect();
                        let why = format!(
                            "node{} {} did not join within {:.0} s: start `{} --nodes {} --node-rank R \
                             --coordinator {}` on each other node{}",
                            if missing.len() == 1 { "" } else { "s" },
                            missing.join(", "),
                            config.join_timeout.as_secs_f64(),
                            config.each_node_runs,
                            terms.nodes,
                            config.coordinator,
                            if config.each_node_runs == super::config::RUN_ON_EACH_NODE {
                                " (the same scenario file and `--set`s)"
                            } else {
                                ""
                            }
                        );
                        refuse_all(&joined, &format!("the run was called off: {why}"));
                        return Err(NodeError::BadInput(why));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                Err(e) => return Err(NodeError::Internal(format!("accepting a node agent: {e}"))),
            };
            let _ = stream.set_nonblocking(false);
            let _ = stream.set_nodelay(true);
            let _ = stream.set_read_timeout(Some(JOIN_READ_WAIT));
            let peer = stream.peer_addr().map_or_else(|_| "?".into(), |a| a.to_string());
            let mut reader = BufReader::new(match stream.try_clone() {
                Ok(s) => s,
                Err(_) => continue,
            });
            let first = wire::receive(&mut reader);
            let Ok(Some(Message::Join {
                node,
                nodes,
                host,
                pid,
                scenario_hash,
                scenario_name,
                version,
                scenario,
            })) = first
            else {
                // Not an agent (a port scan, a stray client): not ours to judge, keep waiting.
                let mut s = stream;
                let _ = wire::send(
                    &mut s,
                    &Message::Refused { reason: "expected a `join` message first".into() },
                );
                continue;
            };
            let problem = if nodes != terms.nodes {
                Some(format!(
                    "node {node} ({host}) was started with `--nodes {nodes}`, node 0 with `--nodes {}`",
                    terms.nodes
                ))
            } else if scenario_hash != terms.scenario_hash {
                let fields = scenario.as_deref().map(|theirs| {
                    let quote =
                        |d: Vec<String>| d.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>().join(", ");
                    let (there, here) = (
                        crate::scenario::describe_delta(terms.scenario, theirs),
                        crate::scenario::describe_delta(theirs, terms.scenario),
                    );
                    if there.is_empty() {
                        String::new()
                    } else {
                        format!(": node {node} has {} where node 0 has {}", quote(there), quote(here))
                    }
                });
                Some(format!(
                    "node {node} ({host}) runs a different scenario{} (`{scenario_name}` with hash {scenario_hash}, node 0 `{}` \
                     with hash {}; ups-doctor {version} there): every node must run the same scenario file with the same `--set`s",
                    fields.unwrap_or_default(),
                    terms.scenario_name,
                    terms.scenario_hash
                ))
            } else if node == 0 || node >= terms.nodes {
                Some(format!(
                    "an agent at {peer} says it is node {node}, but node ranks of the others are 1..{}",
                    terms.nodes - 1
                ))
            } else if joined.iter().any(|(j, _)| j.node == node) {
                Some(format!(
                    "two agents say they are node {node} ({peer} and an earlier one): give each node its own `--node-rank`"
                ))
            } else {
                None
            };
            if let Some(why) = problem {
                let mut s = stream;
                let _ = wire::send(&mut s, &Message::Refused { reason: why.clone() });
                refuse_all(&joined, &format!("the run was called off: {why}"));
                return Err(NodeError::BadInput(why));
            }
            let _ = stream.set_read_timeout(Some(SILENCE_LOST));
            let writer = Arc::new(Mutex::new(stream));
            joined.push((Joined { node, host, pid, writer }, reader));
        }
        let (tx, inbox) = mpsc::channel();
        let mut agents = Vec::new();
        for (agent, reader) in joined {
            agent.send(&Message::Welcome {
                master_addr: terms.master_addr.to_string(),
                master_port: terms.master_port,
                run_id: terms.run_id.to_string(),
            });
            let (node, writer, tx) = (agent.node, agent.writer.clone(), tx.clone());
            let _ = std::thread::Builder::new()
                .name(format!("node{node}"))
                .spawn(move || read_agent(node, reader, writer, tx));
            agents.push(agent);
        }
        Ok(Coordinator { agents, inbox, address: addr.to_string() })
    }

    pub fn broadcast(&self, m: &Message, except: Option<u32>) {
        for a in self.agents.iter().filter(|a| Some(a.node) != except) {
            a.send(m);
        }
    }
}

fn refuse_all(joined: &[(Joined, BufReader<TcpStream>)], reason: &str) {
    for (j, _) in joined {
        j.send(&Message::Refused { reason: reason.to_string() });
    }
}

/// One agent's connection: answers pings at once, passes everything else on.
fn read_agent(
    node: u32,
    mut reader: BufReader<TcpStream>,
    writer: Arc<Mutex<TcpStream>>,
    tx: Sender<Inbound>,
) {
    loop {
        match wire::receive(&mut reader) {
            Ok(Some(Message::Ping { t0 })) => {
                let tc = clock::now_ns();
                if let Ok(mut w) = writer.lock() {
                    let _ = wire::send(&mut *w, &Message::Pong { t0, tc });
                }
            }
            Ok(Some(Message::Heartbeat)) => {}
            Ok(Some(message)) => {
                let last = matches!(message, Message::Result { .. } | Message::Findings { .. });
                if tx.send(Inbound::Message { node, at_ns: clock::now_ns(), message }).is_err() || last {
                    return;
                }
            }
            Ok(None) => {
                let _ = tx.send(Inbound::Closed {
                    node,
                    at_ns: clock::now_ns(),
                    how: "its connection closed".into(),
                });
                return;
            }
            Err(e) => {
                let how = if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
                {
                    format!("no word from it for {} s", SILENCE_LOST.as_secs())
                } else {
                    format!("its connection failed: {e}")
                };
                let _ = tx.send(Inbound::Closed { node, at_ns: clock::now_ns(), how });
                return;
            }
        }
    }
}

/// An agent's side: its connection to node 0.
pub struct Agent {
    /// Shared with the heartbeat thread: one message at a time on the wire.
    writer: Arc<Mutex<TcpStream>>,
    /// Ends the heartbeat thread (on drop).
    beating: Arc<std::sync::atomic::AtomicBool>,
    inbox: Receiver<Option<Message>>,
    pub welcome: (String, u16, String),
}

impl Agent {
    /// Connects (retrying until `config.join_timeout`: node 0 may start later) and joins.
    pub fn join(config: &NodeConfig, join: Message) -> Result<Agent, NodeError> {
        let deadline = Instant::now() + config.join_timeout;
        let (host, port) = split_host_port(&config.coordinator).ok_or_else(|| {
            NodeError::BadInput(format!("`--coordinator {}` is not HOST:PORT", config.coordinator))
        })?;
        let unreachable = |why: String| {
            NodeError::BadInput(format!(
                "node {}: cannot reach the coordinator at {} within {:.0} s: {why}\n  hint: node 0's agent (`{} \
                 --nodes {} --node-rank 0 --coordinator {}`) must be running, and `{host}` must name node 0 from this host",
                config.node,
                config.coordinator,
                config.join_timeout.as_secs_f64(),
                config.each_node_runs,
                config.nodes,
                config.coordinator
            ))
        };
        let stream = loop {
            let attempt = (host, port)
                .to_socket_addrs()
                .map_err(|e| e.to_string())
                .and_then(|mut a| a.next().ok_or_else(|| "the host resolves to no address".to_string()))
                .and_then(|a| {
                    TcpStream::connect_timeout(&a, Duration::from_secs(2)).map_err(|e| e.to_string())
                });
            match attempt {
                Ok(s) => break s,
                Err(why) if Instant::now() >= deadline => return Err(unreachable(why)),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        };
        let _ = stream.set_nodelay(true);
        let mut writer = stream.try_clone().map_err(|e| NodeError::Internal(e.to_string()))?;
        wire::send(&mut writer, &join).map_err(|e| unreachable(e.to_string()))?;
        let mut reader = BufReader::new(stream);
        // The welcome comes once every node joined: wait as long as joining may take.
        let _ = reader.get_ref().set_read_timeout(Some(config.join_timeout + Duration::from_secs(5)));
        let welcome = match wire::receive(&mut reader) {
            Ok(Some(Message::Welcome { master_addr, master_port, run_id })) => {
                (master_addr, master_port, run_id)
            }
            Ok(Some(Message::Refused { reason })) => {
                return Err(NodeError::BadInput(format!("node 0 refused node {}: {reason}", config.node)));
            }
            Ok(other) => {
                return Err(NodeError::Internal(format!(
                    "node 0 at {} answered the join with {other:?} instead of a welcome",
                    config.coordinator
                )));
            }
            Err(e) => return Err(unreachable(format!("no welcome: {e}"))),
        };
        let _ = reader.get_ref().set_read_timeout(None);
        let (tx, inbox) = mpsc::channel();
        let _ = std::thread::Builder::new().name("coordinator".into()).spawn(move || {
            loop {
                match wire::receive(&mut reader) {
                    Ok(Some(m)) => {
                        if tx.send(Some(m)).is_err() {
                            return;
                        }
                    }
                    _ => {
                        let _ = tx.send(None);
                        return;
                    }
                }
            }
        });
        let writer = Arc::new(Mutex::new(writer));
        let beating = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (w, on) = (writer.clone(), beating.clone());
        // A heartbeat of its own, so that a supervision loop busy for long (py-spy of many
        // processes) never reads as a lost node.
        let _ = std::thread::Builder::new().name("heartbeat".into()).spawn(move || {
            while on.load(std::sync::atomic::Ordering::Relaxed) {
                let sent =
                    w.lock().map(|mut w| wire::send(&mut *w, &Message::Heartbeat).is_ok()).unwrap_or(false);
                if !sent {
                    return;
                }
                std::thread::sleep(HEARTBEAT_EVERY);
            }
        });
        Ok(Agent { writer, beating, inbox, welcome })
    }

    pub fn send(&mut self, m: &Message) -> std::io::Result<()> {
        let mut w = self.writer.lock().map_err(|_| std::io::Error::other("the writer's lock is poisoned"))?;
        wire::send(&mut *w, m)
    }

    /// The next message from node 0 within `wait`: `Ok(None)` on timeout, `Err` once the
    /// connection closed.
    pub fn next(&mut self, wait: Duration) -> Result<Option<Message>, ()> {
        match self.inbox.recv_timeout(wait) {
            Ok(Some(m)) => Ok(Some(m)),
            Ok(None) | Err(RecvTimeoutError::Disconnected) => Err(()),
            Err(RecvTimeoutError::Timeout) => Ok(None),
        }
    }

    /// Round trips to node 0; other messages that arrive meanwhile go to `other`.
    pub fn calibrate(&mut self, other: &mut dyn FnMut(Option<Message>)) -> Option<clock::Offset> {
        let mut samples = Vec::new();
        for _ in 0..CALIBRATION_SAMPLES {
            let t0 = clock::now_ns();
            if self.send(&Message::Ping { t0 }).is_err() {
                break;
            }
            let until = Instant::now() + Duration::from_secs(5);
            loop {
                match self.inbox.recv_timeout(until.saturating_duration_since(Instant::now())) {
                    Ok(Some(Message::Pong { t0: back, tc })) if back == t0 => {
                        samples.push(Sample { t0, tc, t1: clock::now_ns() });
                        break;
                    }
                    Ok(Some(m)) => other(Some(m)),
                    Ok(None) => {
                        other(None);
                        return clock::estimate(&samples);
                    }
                    Err(_) => return clock::estimate(&samples),
                }
            }
        }
        clock::estimate(&samples)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.beating.store(false, std::sync::atomic::Ordering::Relaxed);
    }
}
