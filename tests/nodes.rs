//! Across nodes: the real binary started once per "node" (agents on 127.0.0.1, each with its own
//! `--out`), node 0 the coordinator. Real ranks, real signals, real sockets between agents.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::util::{Sandbox, eventually, free_port};
use serde_json::Value;

/// `ups-doctor run FILE --nodes N --node-rank R --coordinator 127.0.0.1:PORT --out OUT/nodeR`.
fn agent(sb: &Sandbox, file: &Path, node: u32, nodes: u32, port: u16, extra: &[&str]) -> Command {
    let mut cmd = sb.cmd();
    cmd.arg("run")
        .arg(file)
        .args(["--nodes", &nodes.to_string(), "--node-rank", &node.to_string()])
        .args(["--coordinator", &format!("127.0.0.1:{port}")])
        .arg("--out")
        .arg(out_of(sb, node))
        .args(if extra.contains(&"--join-timeout") { &[][..] } else { &["--join-timeout", "60"][..] })
        .args(["--json", "--quiet"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn out_of(sb: &Sandbox, node: u32) -> PathBuf {
    sb.path().join(format!("node{node}"))
}

/// Every agent's output, by node.
struct Nodes {
    outputs: Vec<Output>,
}

impl Nodes {
    fn code(&self, node: usize) -> i32 {
        self.outputs[node].status.code().unwrap_or(-1)
    }

    fn stderr(&self, node: usize) -> String {
        String::from_utf8_lossy(&self.outputs[node].stderr).into_owned()
    }

    /// Node 0's merged scenario result (its `--json` output).
    fn merged(&self) -> Value {
        let v: Value = serde_json::from_slice(&self.outputs[0].stdout).unwrap_or_else(|_| {
            panic!("no result from node 0; stderr:\n{}\nnode 1:\n{}", self.stderr(0), self.stderr(1))
        });
        v["scenarios"][0].clone()
    }
}

/// One multi-node run at a time: each starts 4 ranks and 2 agents, and stacks taken from
/// debug-built ranks need the cores (the tests assert on stacks, never on timing).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Starts the other nodes first (they wait for node 0), then node 0, and waits for all.
fn run_nodes(sb: &Sandbox, file: &Path, nodes: u32, extra: &[&str], env: &[(u32, &str, &str)]) -> Nodes {
    let _one = serial();
    let port = free_port();
    let start = |node: u32| -> Child {
        let mut cmd = agent(sb, file, node, nodes, port, extra);
        for (n, k, v) in env {
            if *n == node {
                cmd.env(k, v);
            }
        }
        cmd.spawn().expect("ups-doctor starts")
    };
    let others: Vec<Child> = (1..nodes).map(start).collect();
    let zero = start(0);
    let mut outputs = vec![zero.wait_with_output().unwrap()];
    outputs.extend(others.into_iter().map(|c| c.wait_with_output().unwrap()));
    Nodes { outputs }
}

/// DDP over 4 CPU ranks, 2 per node, 8 steps.
fn ddp(sb: &Sandbox, name: &str, extra: &str) -> PathBuf {
    crate::util::ddp_four_ranks(sb, name, 180, 90, extra)
}

fn ranks(s: &Value) -> &Vec<Value> {
    s["ranks"].as_array().unwrap()
}

fn per_node(s: &Value) -> &Vec<Value> {
    s["nodes"]["per_node"].as_array().unwrap()
}

#[test]
fn ddp_on_two_nodes_passes_with_one_report_and_identical_parameters_on_all_four_ranks() {
    let sb = Sandbox::new();
    let file = ddp(&sb, "ddp-2x2", "");
    // Each node with a /dev/shm of its own (its own mount namespace), as on separate hosts.
    let run = run_nodes(&sb, &file, 2, &["--set", "data.shm_size=64m"], &[]);
    assert_eq!(run.code(0), 0, "node 0:\n{}", run.stderr(0));
    assert_eq!(run.code(1), 0, "node 1:\n{}", run.stderr(1));
    let s = run.merged();
    assert_eq!(s["outcome"], "passed", "{}", s["verdict"]);
    let r = ranks(&s);
    assert_eq!(r.iter().map(|r| r["rank"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 1, 2, 3]);
    let sum = &r[0]["params_checksum"];
    assert!(sum.is_string(), "rank 0 reported its parameters: {}", r[0]);
    for rank in r {
        assert_eq!(rank["outcome"], "passed");
        assert_eq!(rank["steps_done"], 8);
        assert_eq!(&rank["params_checksum"], sum, "parameters bit-identical on every rank of both nodes");
    }
    let nodes = per_node(&s);
    assert_eq!(nodes.len(), 2);
    assert_eq!(nodes[0]["ranks"], serde_json::json!([0, 1]));
    assert_eq!(nodes[1]["ranks"], serde_json::json!([2, 3]));
    for n in nodes {
        assert!(!n["host"].as_str().unwrap().is_empty());
        assert!(
            n["memory"]["processes"].as_array().is_some_and(|p| p.len() == 2),
            "each node's own memory: {n}"
        );
        let shm = &n["memory"]["shm"];
        assert_eq!(
            (shm["private"].as_bool(), shm["total_bytes"].as_u64()),
            (Some(true), Some(64 << 20)),
            "{shm}"
        );
    }
    // The processes each node sampled are its own ranks, by global number.
    let ranks_of = |n: &Value| {
        n["memory"]["processes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["rank"].as_u64().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!((ranks_of(&nodes[0]), ranks_of(&nodes[1])), (vec![0, 1], vec![2, 3]));
    // Node 1's clock was calibrated at both ends; on one machine the true offset is 0.
    let clock = &nodes[1]["clock"];
    for at in ["start", "end"] {
        let (offset, u) =
            (clock[at]["offset_ms"].as_f64().unwrap(), clock[at]["uncertainty_ms"].as_f64().unwrap());
        assert!(u > 0.0 && offset.abs() <= u + 1e-3, "{at}: offset {offset} ms ± {u} ms");
    }
    // One report, node 0's; node 1 keeps its own view (local rank numbers) in its folder.
    let report = std::fs::read_to_string(out_of(&sb, 0).join("report.md")).unwrap();
    assert!(report.contains("### Nodes"), "{report}");
    assert!(report.contains("2 nodes × 2 ranks"), "{report}");
    assert!(report.contains("### Node 1 ("), "per-node evidence: {report}");
    let own: Value =
        serde_json::from_str(&std::fs::read_to_string(out_of(&sb, 1).join("result.json")).unwrap()).unwrap();
    assert_eq!(own["scenarios"][0]["ranks"].as_array().unwrap().len(), 2);
    let stdout1 = String::from_utf8_lossy(&run.outputs[1].stdout);
    assert!(stdout1.contains("the run's report is on node 0"), "{stdout1}");
}

/// Rank 3 (node 1) crashes in forward at step 3 while the other ranks are stuck in that step (as
/// NCCL ranks wait for a dead peer, instead of seeing its connection close).
const SEGV_WHILE_PEERS_WAIT: &str = r#""inject": [
    { "fault": "segv", "phase": "forward", "step": 3, "rank": 3 },
    { "fault": "hang", "phase": "forward", "step": 3, "rank": 0 },
    { "fault": "hang", "phase": "forward", "step": 3, "rank": 1 },
    { "fault": "hang", "phase": "forward", "step": 3, "rank": 2 }
  ],
  "expect": { "outcome": "signaled", "signal": "SIGSEGV", "rank": 3, "phase": "forward", "step": 3 }"#;

/// Rank 3 (node 1) crashes: every other node takes stacks of its ranks before teardown.
#[test]
fn a_segfault_on_node_1_is_the_first_failure_and_every_other_rank_is_looked_at_before_teardown() {
    let sb = Sandbox::new();
    let file = ddp(&sb, "segv-node1", SEGV_WHILE_PEERS_WAIT);
    let run = run_nodes(&sb, &file, 2, &[], &[]);
    assert_eq!(run.code(0), 0, "expectation met; node 0:\n{}", run.stderr(0));
    assert_eq!(run.code(1), 0, "node 1 follows node 0's verdict:\n{}", run.stderr(1));
    let s = run.merged();
    assert_eq!(s["first_failure"], 3);
    let first = &s["nodes"]["first_failure"];
    assert_eq!(
        (first["node"].as_u64(), first["rank"].as_u64(), first["local_rank"].as_u64()),
        (Some(1), Some(3), Some(1))
    );
    assert!(!first["host"].as_str().unwrap().is_empty());
    let r = ranks(&s);
    eprintln!("node 0 saw: {}", per_node(&s)[0]["remote_failure"]);
    assert_eq!(r[3]["signal"], "SIGSEGV");
    for rank in &r[..3] {
        assert_eq!(rank["collateral"], true, "{rank}");
        // Stacks came from the rank itself, in answer to the request, before SIGTERM.
        let threads = rank["stacks"].as_array().map_or(0, Vec::len);
        assert!(threads > 0, "rank {} has its stacks: {rank}", rank["rank"]);
        assert_eq!(rank["torn_down_with"], "SIGTERM", "{rank}");
        // And the snapshot taken the moment its node knew, before anything was torn down.
        let dumps = rank["dumps"].as_array().unwrap();
        assert!(
            dumps
                .iter()
                .any(|d| d["taken"].as_str().is_some_and(|t| t.starts_with("the moment rank 3 on node 1"))
                    && !d["threads"].as_array().unwrap().is_empty()),
            "{rank}"
        );
    }
    let nodes = per_node(&s);
    let seen = &nodes[0]["remote_failure"];
    assert!(seen["what"].as_str().unwrap().starts_with("rank 3 on node 1"), "{seen}");
    assert_eq!(seen["stacks_requested"], serde_json::json!([0, 1]));
    assert_eq!(seen["stacks_answered"], true, "{seen}");
    let (known, torn) = (seen["known_at_s"].as_f64().unwrap(), seen["torn_down_at_s"].as_f64().unwrap());
    let died = r[3]["ended_at_s"].as_f64().unwrap();
    assert!(died <= known + 0.001 && known < torn, "death {died} s, known {known} s, teardown {torn} s");
    let snap = nodes[0]["snapshot"]["at_s"].as_f64().unwrap();
    assert!(snap < torn, "looked at {snap} s, before the teardown at {torn} s");
    eprintln!("death on node 1 → node 0 knew: {:.1} ms", (known - died) * 1e3);
    let report = std::fs::read_to_string(out_of(&sb, 0).join("report.md")).unwrap();
    assert!(report.contains("**First failure across nodes:** node 1, rank 3 (local rank 1)"), "{report}");
    assert!(report.contains("Node 0 learnt at"), "{report}");
}

/// Without hanging peers the other ranks see rank 3's connection close and end on their own,
/// often before any request could reach them: each was looked at while it ran, or had ended
/// before its node knew.
#[test]
fn a_plain_segfault_on_node_1_makes_every_other_rank_collateral() {
    let sb = Sandbox::new();
    let file = ddp(
        &sb,
        "plain-segv",
        r#""inject": [{ "fault": "segv", "phase": "forward", "step": 3, "rank": 3 }],
  "expect": { "outcome": "signaled", "signal": "SIGSEGV", "rank": 3 }"#,
    );
    let run = run_nodes(&sb, &file, 2, &[], &[]);
    assert_eq!(run.code(0), 0, "node 0:\n{}", run.stderr(0));
    let s = run.merged();
    assert_eq!(s["nodes"]["first_failure"]["node"], 1);
    assert_eq!(s["nodes"]["first_failure"]["rank"], 3);
    let nodes = per_node(&s);
    for rank in &ranks(&s)[..3] {
        assert_eq!(rank["collateral"], true, "{rank}");
        let node = &nodes[rank["rank"].as_u64().unwrap() as usize / 2];
        let snap = node["snapshot"]["at_s"].as_f64().expect("every node looked when it knew");
        let looked = rank["dumps"].as_array().is_some_and(|d| !d.is_empty());
        let ended = rank["ended_at_s"].as_f64().unwrap();
        assert!(
            looked || ended <= snap,
            "rank {} ran past {snap} s (ended {ended} s) and was not looked at",
            rank["rank"]
        );
    }
}

/// The ranks of `node`'s agent (its children), once each is inside the injected deadlock (its
/// `ups-hang-peer` thread exists): none is waiting on a peer, so only ups-doctor can end them.
fn deadlocked_ranks(agent: u32, ranks: usize) -> Option<Vec<u32>> {
    let children = crate::util::children_of(agent);
    let in_hang = |pid: &u32| {
        std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|d| {
            d.flatten().any(|t| {
                std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "ups-hang-peer")
            })
        })
    };
    (children.len() == ranks && children.iter().all(in_hang)).then_some(children)
}

/// The agent of node 1 is SIGKILLed mid-run: node 0 reports it lost, looks at its own ranks and
/// tears them down, and no process of either "node" survives.
#[test]
fn a_lost_node_is_reported_as_lost_and_nothing_survives() {
    let sb = Sandbox::new();
    // Node 0's ranks deadlock at step 2 (they would wait for node 1 forever otherwise anyway);
    // node 1's ranks wait for them in the all-reduce.
    let file = ddp(
        &sb,
        "lost",
        r#""inject": [
    { "fault": "hang", "phase": "forward", "step": 2, "rank": 0 },
    { "fault": "hang", "phase": "forward", "step": 2, "rank": 1 }
  ]"#,
    );
    let _one = serial();
    let port = free_port();
    let mut one = agent(&sb, &file, 1, 2, port, &[]).spawn().unwrap();
    let zero = agent(&sb, &file, 0, 2, port, &[]).spawn().unwrap();
    let (agent0, agent1) = (zero.id(), one.id());
    assert!(
        eventually(Duration::from_secs(150), || deadlocked_ranks(agent0, 2).is_some()),
        "node 0's ranks reached the injected deadlock"
    );
    let ranks1 = crate::util::children_of(agent1);
    assert_eq!(ranks1.len(), 2, "node 1's ranks run");
    one.kill().unwrap(); // SIGKILL: no goodbye, no teardown by the agent itself
    one.wait().unwrap();
    let out = zero.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "a lost node does not meet the expectation:\n{stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("node 0 wrote its result");
    let s = &v["scenarios"][0];
    let lost = &per_node(s)[1]["lost"];
    assert!(lost["how"].as_str().unwrap().contains("connection closed"), "{lost}");
    let headline = s["verdict"]["headline"].as_str().unwrap();
    assert!(
        headline.starts_with("Node 1 (")
            && headline.contains(" lost at ")
            && headline.contains("its ranks 2–3 were not observed"),
        "{headline}"
    );
    assert_ne!(s["outcome"], "hung", "a lost node is not a hang of everything");
    assert!(
        s["expectation_mismatches"].to_string().contains("node 1 lost"),
        "{}",
        s["expectation_mismatches"]
    );
    assert_eq!(ranks(s).len(), 2, "only node 0's ranks were observed");
    for rank in ranks(s) {
        assert_eq!(rank["torn_down_with"], "SIGTERM", "{rank}");
        assert!(rank["stacks"].as_array().is_some_and(|t| !t.is_empty()), "stacks before teardown: {rank}");
    }
    assert!(s["leftovers"]["processes"].as_array().is_none_or(Vec::is_empty), "{}", s["leftovers"]);
    // Node 1's ranks die with their agent (PR_SET_PDEATHSIG): no orphan on either node.
    for pid in ranks1 {
        assert!(
            eventually(Duration::from_secs(30), || !crate::util::alive(u64::from(pid))),
            "rank pid {pid} of node 1 outlived its agent"
        );
    }
    for pid in ranks(s).iter().filter_map(|r| r["pid"].as_u64()) {
        assert!(!crate::util::alive(pid), "rank pid {pid} of node 0 outlived the run");
    }
}

/// Node 1's clock is a minute ahead (a test mode adds it to every time its agent reads): the
/// calibration finds the offset within its stated uncertainty, and the timeline still puts rank
/// 3's death before the teardown of the others (uncalibrated it would come a minute later).
#[test]
fn a_skewed_clock_is_calibrated_out_and_the_deaths_are_ordered_right() {
    let sb = Sandbox::new();
    let file = ddp(&sb, "skewed", SEGV_WHILE_PEERS_WAIT);
    let run = run_nodes(&sb, &file, 2, &[], &[(1, "UPS_DOCTOR_NODE_CLOCK_SKEW_MS", "60000")]);
    assert_eq!(run.code(0), 0, "node 0:\n{}", run.stderr(0));
    let s = run.merged();
    let clock = &per_node(&s)[1]["clock"];
    for at in ["start", "end"] {
        let (offset, u) =
            (clock[at]["offset_ms"].as_f64().unwrap(), clock[at]["uncertainty_ms"].as_f64().unwrap());
        // Both agents read the same clock, so the true offset is exactly −60 000 ms.
        assert!((offset + 60_000.0).abs() <= u + 1e-3, "{at}: offset {offset} ms ± {u} ms");
    }
    assert_eq!(s["nodes"]["first_failure"]["rank"], 3);
    let r = ranks(&s);
    let died = r[3]["ended_at_s"].as_f64().unwrap();
    for rank in &r[..3] {
        assert!(rank["ended_at_s"].as_f64().unwrap() > died, "rank 3 died at {died} s, before {rank}");
    }
    let u = s["nodes"]["first_failure"]["uncertainty_ms"].as_f64().unwrap();
    assert!(u > 0.0);
    let report = std::fs::read_to_string(out_of(&sb, 0).join("report.md")).unwrap();
    let row = report.lines().find(|l| l.starts_with("| 1 | `")).unwrap_or_default();
    assert!(row.contains("−60000") && row.contains(" ± "), "the offset and its uncertainty: {row}");
    eprintln!(
        "loopback calibration: ± {:.4} ms at the start, ± {:.4} ms at the end",
        clock["start"]["uncertainty_ms"], clock["end"]["uncertainty_ms"]
    );
}

#[test]
fn a_node_with_another_scenario_is_refused_on_both_sides() {
    let sb = Sandbox::new();
    let file = ddp(&sb, "mismatch", "");
    let port = free_port();
    let one = agent(&sb, &file, 1, 2, port, &["--set", "train.steps=9"]).spawn().unwrap();
    let zero = agent(&sb, &file, 0, 2, port, &[]).output().unwrap();
    let one = one.wait_with_output().unwrap();
    let (e0, e1) = (String::from_utf8_lossy(&zero.stderr), String::from_utf8_lossy(&one.stderr));
    assert_eq!(zero.status.code(), Some(2), "{e0}");
    assert_eq!(one.status.code(), Some(2), "{e1}");
    assert!(
        e0.contains("node 1 (") && e0.contains("runs a different scenario") && e0.contains("same `--set`s"),
        "{e0}"
    );
    assert!(
        e1.contains("node 0 refused node 1: node 1 (") && e1.contains("runs a different scenario"),
        "{e1}"
    );
    assert!(!out_of(&sb, 0).join("1-mismatch").exists(), "no rank started");
    redacted(|| insta::assert_snapshot!(format!("node 0:\n{e0}\nnode 1:\n{e1}")));
}

/// Ports, hosts, hashes and versions out of a message, for its snapshot.
fn redacted(check: impl FnOnce()) {
    let mut settings = insta::Settings::clone_current();
    settings.add_filter(r"127\.0\.0\.1:\d+", "127.0.0.1:[port]");
    settings.add_filter(r"node (\d) \([^)]*\)", "node $1 ([host])");
    settings.add_filter(r"hash [0-9a-f]{16}", "hash [hash]");
    settings.add_filter(r"ups-doctor \d+\.\d+\.\d+", "ups-doctor [version]");
    settings.bind(check);
}

#[test]
fn an_agent_that_cannot_reach_the_coordinator_says_so() {
    let sb = Sandbox::new();
    let file = ddp(&sb, "alone", "");
    // Nobody hosts the coordinator: its port refuses connections for the whole test.
    let (_held, port) = crate::util::refused_port();
    let out = agent(&sb, &file, 1, 2, port, &["--join-timeout", "1"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("node 1: cannot reach the coordinator at 127.0.0.1:")
            && stderr.contains("within 1 s"),
        "{stderr}"
    );
    assert!(
        stderr.contains("hint: node 0's agent (`ups-doctor run SCENARIO --nodes 2 --node-rank 0"),
        "{stderr}"
    );
    // And node 0 without its agents.
    let out = agent(&sb, &file, 0, 2, free_port(), &["--join-timeout", "1"]).output().unwrap();
    let alone = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{alone}");
    assert!(alone.contains("node 1 did not join within 1 s"), "{alone}");
    redacted(|| insta::assert_snapshot!(format!("node 1:\n{stderr}\nnode 0:\n{alone}")));
}

/// The user's own DDP program under torchrun, one torchrun per node (ups-doctor gives it
/// `--nnodes 2 --node-rank R` and node 0's c10d rendezvous), CPU gloo; rank 3 segfaults.
#[test]
fn a_two_node_torchrun_program_with_a_crashing_rank_is_attributed_the_same_way() {
    let sb = Sandbox::new();
    let file = crate::util::torchrun_rank_3_segfaults(&sb, "torchrun-2x2");
    let path = crate::util::venv_path().to_string_lossy().into_owned();
    let run = run_nodes(&sb, &file, 2, &[], &[(0, "PATH", &path), (1, "PATH", &path)]);
    assert_eq!(run.code(0), 0, "node 0:\n{}", run.stderr(0));
    assert_eq!(run.code(1), 0, "node 1:\n{}", run.stderr(1));
    let s = run.merged();
    let argv = s["external"]["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect::<Vec<_>>()
        .join(" ");
    assert!(argv.starts_with("torchrun --nnodes 2 --node-rank 0 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:"), "{argv}");
    let own: Value =
        serde_json::from_str(&std::fs::read_to_string(out_of(&sb, 1).join("result.json")).unwrap()).unwrap();
    assert!(
        own["scenarios"][0]["external"]["argv"].to_string().contains(r#""--node-rank","1""#),
        "{}",
        own["scenarios"][0]["external"]
    );
    assert_eq!(s["first_failure"], 3, "{}", s["verdict"]);
    // Which node ran rank 3 is the rendezvous's choice: torchrun's `c10d` orders the nodes by host
    // and agent pid, not by `--node-rank`, so on one host node 0 runs ranks 2-3 whenever node 1's
    // torchrun got the lower pid. torchrun's own failure summary on that node names it.
    let hosted = crate::util::node_of_rank_3(|n| out_of(&sb, n as u32), "torchrun-2x2") as u64;
    assert_eq!(s["nodes"]["first_failure"]["node"], hosted, "{}", s["nodes"]["first_failure"]);
    assert_eq!(s["nodes"]["first_failure"]["local_rank"], 1);
    let ran = &s["nodes"]["per_node"][hosted as usize]["ranks"];
    assert_eq!(ran, &serde_json::json!([2, 3]), "{}", s["nodes"]["per_node"]);
    let r = ranks(&s);
    assert_eq!(r[3]["signal"], "SIGSEGV");
    for rank in r {
        assert_eq!(rank["identified_by"], "RANK", "torchrun's own ranks, found by their global RANK: {rank}");
    }
    for rank in &r[..3] {
        assert_eq!(rank["collateral"], true, "{rank}");
    }
    // Markers came through each node's FIFO under their global rank.
    assert!(r[3]["last_phase"] == "forward" && r[3]["last_step"] == 3, "{}", r[3]);
}

/// Through real `srun` of the one-host Slurm cluster: two tasks are the two "nodes". Each finds
/// its place from Slurm's variables (`SLURM_JOB_NODELIST`'s first host is the coordinator);
/// `SLURM_NNODES` and `SLURM_NODEID` are set per task to what `srun -N2 --ntasks-per-node=1`
/// sets on two hosts, since one host is one node here.
#[test]
fn two_agents_started_by_srun_place_themselves_from_slurms_variables() {
    let Some(conf) = crate::util::slurm::cluster("nodes through srun") else { return };
    let _one = serial();
    let sb = Sandbox::new();
    let file = ddp(&sb, "srun-2x2", "");
    let port = free_port();
    let script = format!(
        "SLURM_NNODES=2 SLURM_NODEID=$SLURM_PROCID exec {} run {} --out node$SLURM_PROCID --quiet --join-timeout 60",
        crate::util::bin().display(),
        file.display()
    );
    let out = Command::new("srun")
        .args(["-N", "1", "-n", "2", "-J", &format!("ups-doctor-nodes-{port}"), "sh", "-c", &script])
        .current_dir(sb.path())
        .env("SLURM_CONF", &conf)
        .env("UPS_DOCTOR_COORDINATOR_PORT", port.to_string())
        .env("NO_COLOR", "1")
        .output()
        .expect("srun starts");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "srun: {:?}\n{stderr}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(out_of(&sb, 0).join("result.json")).unwrap()).unwrap();
    let s = &v["scenarios"][0];
    assert_eq!(s["outcome"], "passed", "{}", s["verdict"]);
    let sum = &ranks(s)[0]["params_checksum"];
    assert!(sum.is_string() && ranks(s).iter().all(|r| &r["params_checksum"] == sum), "{s}");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string();
    assert_eq!(s["nodes"]["coordinator"].as_str().unwrap().rsplit_once(':').unwrap().1, port.to_string());
    assert!(per_node(s).iter().all(|n| n["host"] == host.as_str()), "{}", s["nodes"]);
}

/// Node 0's agent (the coordinator) is SIGKILLed mid-run: node 1 looks at its ranks, tears them
/// down, keeps its own view and says the run's report was never written.
#[test]
fn an_agent_whose_coordinator_vanishes_tears_down_and_keeps_its_own_view() {
    let sb = Sandbox::new();
    let file = ddp(
        &sb,
        "no-coordinator",
        r#""inject": [
    { "fault": "hang", "phase": "forward", "step": 2, "rank": 2 },
    { "fault": "hang", "phase": "forward", "step": 2, "rank": 3 }
  ]"#,
    );
    let _one = serial();
    let port = free_port();
    let one = agent(&sb, &file, 1, 2, port, &[]).spawn().unwrap();
    let mut zero = agent(&sb, &file, 0, 2, port, &[]).spawn().unwrap();
    let agent1 = one.id();
    assert!(
        eventually(Duration::from_secs(150), || deadlocked_ranks(agent1, 2).is_some()),
        "node 1's ranks reached the injected deadlock"
    );
    zero.kill().unwrap();
    zero.wait().unwrap();
    let out = one.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("node 0 (the coordinator) went away before it wrote the run's report"),
        "{stderr}"
    );
    let own: Value =
        serde_json::from_str(&std::fs::read_to_string(out_of(&sb, 1).join("result.json")).unwrap()).unwrap();
    for rank in ranks(&own["scenarios"][0]) {
        assert_eq!(rank["torn_down_with"], "SIGTERM", "{rank}");
        assert!(rank["stacks"].as_array().is_some_and(|t| !t.is_empty()), "stacks before teardown: {rank}");
        assert!(!crate::util::alive(rank["pid"].as_u64().unwrap()));
    }
}

/// A scenario that says `launch.nodes: 2` runs as two local agents; `bisect` cuts the nodes to
/// one first (here the crash needs no node boundary, so it stays).
#[test]
fn bisect_of_a_multi_node_scenario_cuts_to_one_node_first() {
    let sb = Sandbox::new();
    let file = ddp(
        &sb,
        "bisect-nodes",
        r#""inject": [{ "fault": "segv", "phase": "forward", "step": 3, "rank": 3 }]"#,
    );
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace(r#""world_size": 4"#, r#""world_size": 4, "nodes": 2"#);
    std::fs::write(&file, text).unwrap();
    let _one = serial();
    let out = sb
        .cmd()
        .arg("bisect")
        .arg(&file)
        .args(["--budget", "2", "--confirm", "1", "--json", "--quiet", "--out"])
        .arg(sb.path().join("bisect"))
        .arg("--cache")
        .arg(sb.path().join("cache"))
        .output()
        .unwrap();
    let record: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!("bisect.json on stdout; stderr:\n{}", String::from_utf8_lossy(&out.stderr))
    });
    let probes = record["probes"].as_array().unwrap();
    assert_eq!(probes.len(), 2, "{record}");
    assert_eq!(probes[0]["delta"], serde_json::json!([]), "the original first");
    assert_eq!(probes[1]["delta"], serde_json::json!(["launch.nodes=1"]), "then one node");
    assert_eq!(probes[1]["verdict"], "same", "{}", probes[1]);
    // The original ran on two agents: node 1's own view is in the probe's folder.
    let probe = sb.path().join("bisect").join(probes[0]["dir"].as_str().unwrap());
    assert!(probe.join("node1").is_dir(), "node 1's agent ran in {}", probe.display());
    assert_eq!(record["components"][0], "launch.nodes", "{}", record["components"]);
}
