//! The wire between node agents and the coordinator: one TCP connection per agent carrying
//! JSON objects, one per line (`{"type": "join", …}\n`). Plain text, so that `nc` and a log
//! show what went across; every message is small except an agent's final result.

use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

use super::NodeRun;
use crate::scenario::Scenario;

/// Messages of the protocol, tagged by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    /// Agent → coordinator, first: who it is and which scenario it runs.
    Join {
        node: u32,
        nodes: u32,
        host: String,
        pid: u32,
        /// [`scenario_hash`] of the scenario as loaded (with `--set` overrides).
        scenario_hash: String,
        scenario_name: String,
        version: String,
        /// The scenario itself, so that a mismatch can be shown field by field.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scenario: Option<Box<Scenario>>,
    },
    /// Coordinator → agent: joined; where the ranks' rendezvous is.
    Welcome { master_addr: String, master_port: u16, run_id: String },
    /// Coordinator → agent: not joined, and why (the agent prints it and exits with status 2).
    Refused { reason: String },
    /// Agent → coordinator: a clock sample's request, `t0` on the agent's clock (ns).
    Ping { t0: i64 },
    /// Coordinator → agent: the answer, `tc` on the coordinator's clock (ns).
    Pong { t0: i64, tc: i64 },
    /// Agent → coordinator: something its supervision loop saw, on the agent's clock (ns).
    Event { node: u32, at_ns: i64, event: NodeEvent },
    /// Coordinator → agent: a rank on another node failed (or a node was lost): take stacks of
    /// your ranks, then tear them down.
    PeerFailed { what: String },
    /// Coordinator → agent: the job's driver ended on node 0 (`how`), where the ranks are a
    /// cluster's workers (Ray Train): the other nodes' cluster daemons never end on their own, so
    /// each agent ends its node's part (stacks of any rank still running first), as Ray's own
    /// job end leaves its workers.
    JobEnded {
        how: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<crate::schema::Signal>,
    },
    /// Agent → coordinator, every 2 s from a thread of its own: alive (a host that vanished
    /// closes no connection; silence does the telling).
    Heartbeat,
    /// Agent → coordinator, last: everything its node saw.
    Result { run: Box<NodeRun> },
    /// Agent → coordinator, last, for `ups-doctor attach` on several nodes: what its window saw
    /// of the job there (the attach's own record, carried as it is).
    Findings { node: u32, findings: Box<serde_json::Value> },
    /// Coordinator → agent: the merged result is written; `met` is the run's verdict against
    /// `expect` (the agent's exit status follows it).
    Done { met: bool, report: String },
}

/// What an agent streams while the run goes on. Ranks are global.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NodeEvent {
    /// The node's ranks were started (pids in local-rank order).
    Started { ranks: Vec<u32>, pids: Vec<Option<u32>> },
    /// Steps done so far, per rank (sent about once a second: it is also the agent's heartbeat).
    Progress { steps: Vec<(u32, u64)> },
    /// A rank ended; `failed` when it failed on its own (not torn down by us).
    RankEnded { rank: u32, failed: bool, how: String },
    /// The agent found these ranks hung.
    Hung { ranks: Vec<u32> },
    /// Stacks were asked of these ranks (after a failure elsewhere, or an interrupt).
    StacksRequested { ranks: Vec<u32> },
    /// Teardown began (SIGTERM to what is left); `stacks_answered` when every rank asked answered.
    TearingDown { stacks_answered: bool },
}

/// Writes one message as one line.
pub fn send(out: &mut impl Write, message: &Message) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    line.push(b'\n');
    out.write_all(&line)?;
    out.flush()
}

/// Reads the next message; `Ok(None)` at the end of the stream.
pub fn receive(input: &mut impl BufRead) -> std::io::Result<Option<Message>> {
    let mut line = String::new();
    loop {
        line.clear();
        if input.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        if !line.trim().is_empty() {
            break;
        }
    }
    serde_json::from_str(&line).map(Some).map_err(|e| {
        let shown: String = line.chars().take(80).collect();
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not an ups-doctor node message ({e}): `{}`", shown.trim_end()),
        )
    })
}

/// A digest of the scenario as loaded: agents whose scenario differs are refused at join. FNV-1a
/// (64 bits) of its canonical JSON (keys sorted), in hex: for telling files apart, not security.
pub fn scenario_hash(scenario: &Scenario) -> String {
    let value = serde_json::to_value(scenario).expect("scenarios serialise");
    let text = value.to_string();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_go_across_as_one_json_line_each() {
        let msgs = vec![
            Message::Ping { t0: 42 },
            Message::Event {
                node: 1,
                at_ns: 7,
                event: NodeEvent::RankEnded { rank: 3, failed: true, how: "was killed by SIGSEGV".into() },
            },
            Message::PeerFailed { what: "rank 3 on node 1 (b) was killed by SIGSEGV".into() },
        ];
        let mut buf = Vec::new();
        for m in &msgs {
            send(&mut buf, m).unwrap();
        }
        let text = String::from_utf8(buf.clone()).unwrap();
        assert_eq!(text.lines().count(), 3);
        assert!(text.starts_with(r#"{"type":"ping","t0":42}"#), "{text}");
        let mut input = std::io::Cursor::new(buf);
        for m in &msgs {
            assert_eq!(receive(&mut input).unwrap().as_ref(), Some(m));
        }
        assert_eq!(receive(&mut input).unwrap(), None);
    }

    #[test]
    fn a_stranger_on_the_port_is_named_not_trusted() {
        let mut input = std::io::Cursor::new(b"GET / HTTP/1.1\r\n".to_vec());
        let err = receive(&mut input).unwrap_err();
        assert!(err.to_string().contains("not an ups-doctor node message"), "{err}");
        assert!(err.to_string().contains("GET / HTTP/1.1"), "{err}");
    }

    #[test]
    fn the_hash_tells_scenarios_apart() {
        let a: Scenario = serde_json::from_str(r#"{"name": "a", "launch": {"world_size": 2}}"#).unwrap();
        let mut b = a.clone();
        assert_eq!(scenario_hash(&a), scenario_hash(&b));
        b.train.steps += 1;
        assert_ne!(scenario_hash(&a), scenario_hash(&b));
    }
}
