//! A multi-node scenario (`launch.nodes` > 1) run on this machine: node 0's agent is this
//! process, every other node's agent a child `ups-doctor run --nodes N --node-rank R` on
//! loopback, each with its own ranks, `/dev/shm` namespace (`data.shm_size`) and cgroup. How a
//! user reproduces a multi-node layout on one machine, and how `bisect` runs a multi-node probe.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use crate::harness::run::events::Listener;
use crate::harness::{HarnessError, ScenarioInput};
use crate::schema::ScenarioResult;

use super::NodeConfig;
use super::net::NodeError;
use super::run::{Finished, NodeRequest, finish, run_node};

/// How long the local agents get to join (they start in a moment, on a busy machine slower).
const JOIN_WAIT: Duration = Duration::from_secs(120);
/// How long an agent gets to end after node 0 told it the run is over.
const AGENT_END_WAIT: Duration = Duration::from_secs(30);

/// Why a scenario could not be run: ups-doctor's own failure on this machine, or of its local
/// nodes (a rank's failure is an outcome in the result, not this).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Harness(#[from] HarnessError),
    #[error(transparent)]
    Nodes(#[from] NodeError),
}

/// Runs one scenario wherever its nodes are: on this machine alone, or (`launch.nodes` > 1)
/// as every node's agent on loopback. The one entry point `run`, `bisect` and `sweep` use;
/// `out_dir/rel` is the scenario's folder.
pub fn run_scenario(
    input: &ScenarioInput,
    program: &Path,
    out_dir: &Path,
    rel: &str,
    progress: &mut dyn Listener,
    interrupted: &AtomicBool,
) -> Result<ScenarioResult, RunError> {
    if input.scenario.launch.nodes > 1 {
        Ok(run_local(input, program, out_dir, rel, progress, interrupted)?)
    } else {
        Ok(crate::harness::run_scenario(input, program, &out_dir.join(rel), rel, progress, interrupted)?)
    }
}

/// Runs `input` over `launch.nodes` local agents; `dir` is the scenario's folder (`out/rel`).
pub fn run_local(
    input: &ScenarioInput,
    program: &Path,
    out_dir: &Path,
    rel: &str,
    progress: &mut dyn Listener,
    interrupted: &AtomicBool,
) -> Result<ScenarioResult, NodeError> {
    let nodes = input.scenario.launch.nodes;
    let dir = out_dir.join(rel);
    // The agents load the scenario from the run's folder: `{scenario_dir}` must still be the
    // original file's folder, for node 0 as for them.
    let mut input = input.clone();
    let here = std::env::current_dir().unwrap_or_default();
    let scenario_dir = here.join(input.file.parent().unwrap_or(Path::new(".")));
    for arg in input.scenario.command.iter_mut().flatten().filter(|a| !a.contains("{{scenario_dir}}")) {
        *arg = arg.replace("{scenario_dir}", &scenario_dir.display().to_string());
    }
    let input = &input;
    let internal = |what: &str, e: std::io::Error| NodeError::Internal(format!("{what}: {e}"));
    std::fs::create_dir_all(&dir).map_err(|e| internal(&format!("create `{}`", dir.display()), e))?;
    // The other agents load the scenario as this one runs it (overrides applied, or a bisect
    // candidate), so that their hashes match.
    let file = dir.join("nodes-scenario.json");
    let json = serde_json::to_string_pretty(&input.scenario).expect("scenarios serialise");
    crate::run_files::replace(&file, json.as_bytes())
        .map_err(|e| internal(&format!("write `{}`", file.display()), e))?;
    let port =
        crate::harness::os::tcp::free_port().map_err(|e| internal("find a free port on 127.0.0.1", e))?;
    let coordinator = format!("127.0.0.1:{port}");
    let mut agents: Vec<(u32, Child)> = Vec::new();
    for node in 1..nodes {
        let log = crate::run_files::create(&dir.join(format!("node{node}.log")))
            .map_err(|e| internal("create an agent's log", e))?;
        let mut cmd = Command::new(program);
        cmd.arg("run")
            .arg(&file)
            .args([
                "--nodes",
                &nodes.to_string(),
                "--node-rank",
                &node.to_string(),
                "--coordinator",
                &coordinator,
            ])
            .arg("--out")
            .arg(dir.join(format!("node{node}")))
            .args(["--quiet", "--join-timeout", &JOIN_WAIT.as_secs().to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| internal("open an agent's log", e))?)
            .stderr(log);
        // The agent (and so its ranks) dies with us.
        crate::harness::os::sys::die_with_parent(&mut cmd);
        let child = cmd.spawn().map_err(|e| internal(&format!("start `{}`", program.display()), e))?;
        agents.push((node, child));
    }
    let config = NodeConfig {
        nodes,
        node: 0,
        coordinator: coordinator.clone(),
        listen: None,
        join_timeout: JOIN_WAIT,
        source: "launch.nodes",
        each_node_runs: super::config::RUN_ON_EACH_NODE,
    };
    let request = NodeRequest { config: &config, input, program, out_dir, rel, progress, interrupted };
    let outcome = run_node(request);
    let result = match outcome {
        Ok(Finished::Coordinator { result, coordinator }) => {
            finish(
                &coordinator,
                result.met_expectation,
                &out_dir.join(crate::schema::REPORT_FILE).display().to_string(),
            );
            Ok(result)
        }
        Ok(Finished::Agent { .. }) => unreachable!("node 0 coordinates"),
        Err(e) => Err(e),
    };
    let deadline = Instant::now() + AGENT_END_WAIT;
    for (node, child) in &mut agents {
        while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if child.try_wait().ok().flatten().is_none() {
            eprintln!("ups-doctor: the agent of node {node} did not end after the run; killing it");
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    result.map_err(|e| {
        let tails: String = agents
            .iter()
            .map(|(n, _)| {
                let log = std::fs::read_to_string(dir.join(format!("node{n}.log"))).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                format!(
                    "\n  node {n}'s agent said: {}",
                    tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
                )
            })
            .collect();
        NodeError::Internal(format!(
            "the local nodes of `{}` did not run: {}{tails}",
            input.scenario.name,
            e.into_message()
        ))
    })
}
