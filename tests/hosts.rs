//! Across hosts of their own (scripts/hosts.sh, issue 59): each node agent runs on a host with its
//! own network namespace (an address on a private bridge), host name, PID namespace, `/dev/shm`
//! and `/tmp`, so that an agent sees its own host's processes only and reaches the others over
//! the network, as on a real cluster. The scenario and the report folders are on the shared file
//! system (a folder under cargo's target directory, the same on every host).
//!
//! Slurm across the hosts: slurmctld on node1, one slurmd per host; `srun -N 2 --ntasks-per-node 1
//! ups-doctor run …` places one agent on each host, and the agents find their places from Slurm's
//! variables (node 0 the coordinator at `SLURM_JOB_NODELIST`'s first host, resolved by the hosts'
//! `/etc/hosts`). Without root the tests say why and pass without running.

use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::Duration;

use crate::util::hosts::Hosts;
use crate::util::{Sandbox, bin, eventually, repo, venv_path};
use serde_json::Value;

/// One run across hosts at a time: each starts 4 ranks and 2 agents on 2 cores. Taken before its
/// hosts are made, so that no group of hosts waits, made, for another test to end.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// DDP of the built-in trainer over 4 CPU ranks, 2 per host, 8 steps.
fn ddp(sb: &Sandbox, name: &str, extra: &str) -> PathBuf {
    crate::util::ddp_four_ranks(sb, name, 240, 30, extra)
}

/// `srun -N 2 --ntasks-per-node 1` on node1 of the hosts, each task `ups-doctor run FILE --out
/// nodeN` (N = `SLURM_NODEID`) in the sandbox.
fn srun_agents(hosts: &Hosts, sb: &Sandbox, file: &Path, job: &str) -> Output {
    let agent = format!(
        "exec {} run {} --out node$SLURM_NODEID --quiet --join-timeout 90",
        bin().display(),
        file.display()
    );
    hosts
        .on("node1", "srun")
        .args(["-N", "2", "--ntasks-per-node", "1", "-J", job, "sh", "-c", &agent])
        .current_dir(sb.path())
        .env("SLURM_CONF", hosts.slurm_conf.as_ref().unwrap())
        .env("NO_COLOR", "1")
        .env_remove("PYTHONUNBUFFERED")
        .output()
        .expect("srun starts on node1")
}

fn merged(sb: &Sandbox, out: &Output) -> Value {
    let text = std::fs::read_to_string(sb.path().join("node0/result.json")).unwrap_or_else(|e| {
        panic!(
            "no result.json from node 0 ({e}); srun {:?}\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let v: Value = serde_json::from_str(&text).unwrap();
    let found = crate::consistency::check_run_dir(&sb.path().join("node0"));
    assert!(found.is_empty(), "the report contradicts its result.json:\n{}", found.join("\n"));
    v["scenarios"][0].clone()
}

fn per_node(s: &Value) -> &Vec<Value> {
    s["nodes"]["per_node"].as_array().unwrap()
}

fn ranks(s: &Value) -> &Vec<Value> {
    s["ranks"].as_array().unwrap()
}

/// Nothing of the run is left on any host but Slurm's own daemons.
fn assert_nothing_left(hosts: &Hosts) {
    let daemons = ["slurmd", "slurmctld", "slurmscriptd", "munged"];
    for i in 1..=hosts.count {
        let host = format!("node{i}");
        let left = || {
            hosts
                .processes(&host)
                .into_iter()
                .filter(|(_, c)| !daemons.contains(&c.as_str()))
                .collect::<Vec<_>>()
        };
        assert!(eventually(Duration::from_secs(60), || left().is_empty()), "left on {host}: {:?}", left());
    }
}

/// The clock offset a node measured against the coordinator, and its uncertainty, at both ends.
fn offsets(s: &Value, node: usize) -> Vec<(f64, f64)> {
    let clock = &per_node(s)[node]["clock"];
    ["start", "end"]
        .iter()
        .map(|at| (clock[at]["offset_ms"].as_f64().unwrap(), clock[at]["uncertainty_ms"].as_f64().unwrap()))
        .collect()
}

#[test]
fn ddp_across_two_hosts_under_srun_passes_with_each_hosts_name_and_a_clock_offset_that_contains_zero() {
    let _one = serial();
    let Some(hosts) = Hosts::up("srun across hosts", 2, true) else { return };
    let sb = Sandbox::shared();
    let file = ddp(&sb, "hosts-pass", "");
    let out = srun_agents(&hosts, &sb, &file, "hosts-pass");
    assert!(out.status.success(), "srun: {:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let s = merged(&sb, &out);
    assert_eq!(s["outcome"], "passed", "{}", s["verdict"]);
    let sum = &ranks(&s)[0]["params_checksum"];
    assert!(sum.is_string() && ranks(&s).iter().all(|r| &r["params_checksum"] == sum), "{s}");
    let nodes = per_node(&s);
    assert_eq!(nodes[0]["host"], "node1", "{}", s["nodes"]);
    assert_eq!(nodes[1]["host"], "node2", "{}", s["nodes"]);
    assert_eq!(nodes[1]["ranks"], serde_json::json!([2, 3]));
    // The coordinator is the first host of the job's node list, reached at its own address.
    assert!(s["nodes"]["coordinator"].as_str().unwrap().starts_with("10.251.0.11:"), "{}", s["nodes"]);
    // Both hosts read one kernel clock: the true offset is 0, inside the calibration's uncertainty.
    for (offset, u) in offsets(&s, 1) {
        assert!(offset.abs() <= u + 1e-3, "offset {offset} ms ± {u} ms does not contain 0");
    }
    let report = std::fs::read_to_string(sb.path().join("node0/report.md")).unwrap();
    assert!(report.contains("`node2`"), "the report names the second host:\n{report}");
    assert_nothing_left(&hosts);
}

/// Rank 3 (local rank 1 of the second host) crashes in forward at step 3 while the other ranks
/// are stuck in that step: the first failure is on node2, the first host's ranks are collateral
/// and were looked at (stacks) by their own host's agent before teardown.
#[test]
fn a_segfault_on_the_second_host_is_the_first_failure_and_the_first_hosts_ranks_are_collateral_with_stacks() {
    let _one = serial();
    let Some(hosts) = Hosts::up("srun crash across hosts", 2, true) else { return };
    let sb = Sandbox::shared();
    let file = ddp(
        &sb,
        "hosts-segv",
        r#""inject": [
    { "fault": "segv", "phase": "forward", "step": 3, "rank": 3 },
    { "fault": "hang", "phase": "forward", "step": 3, "rank": 0 },
    { "fault": "hang", "phase": "forward", "step": 3, "rank": 1 },
    { "fault": "hang", "phase": "forward", "step": 3, "rank": 2 }
  ],
  "expect": { "outcome": "signaled", "signal": "SIGSEGV", "rank": 3, "phase": "forward", "step": 3 }"#,
    );
    let out = srun_agents(&hosts, &sb, &file, "hosts-segv");
    assert!(
        out.status.success(),
        "the expectation is met: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let s = merged(&sb, &out);
    let first = &s["nodes"]["first_failure"];
    assert_eq!(
        (
            first["node"].as_u64(),
            first["rank"].as_u64(),
            first["local_rank"].as_u64(),
            first["host"].as_str()
        ),
        (Some(1), Some(3), Some(1), Some("node2")),
        "{first}"
    );
    let r = ranks(&s);
    assert_eq!(r[3]["signal"], "SIGSEGV");
    for rank in &r[..3] {
        assert_eq!(rank["collateral"], true, "{rank}");
        let threads = rank["stacks"].as_array().map_or(0, Vec::len);
        assert!(threads > 0, "rank {} has its stacks: {rank}", rank["rank"]);
    }
    let report = std::fs::read_to_string(sb.path().join("node0/report.md")).unwrap();
    assert!(report.contains("**First failure across nodes:** node 1"), "{report}");
    assert_nothing_left(&hosts);
}

/// Rank 2 (the second host) hangs in forward at step 3; the others wait for it in the gradient
/// all-reduce. The run is hung, rank 2 the culprit, and every rank on both hosts has its stacks.
#[test]
fn a_hang_across_two_hosts_is_named_with_stacks_taken_on_both() {
    let _one = serial();
    let Some(hosts) = Hosts::up("srun hang across hosts", 2, true) else { return };
    let sb = Sandbox::shared();
    let file = ddp(
        &sb,
        "hosts-hang",
        r#""inject": [{ "fault": "hang", "phase": "forward", "step": 3, "rank": 2 }],
  "expect": { "outcome": "hung" }"#,
    );
    let out = srun_agents(&hosts, &sb, &file, "hosts-hang");
    assert!(
        out.status.success(),
        "the expectation is met: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let s = merged(&sb, &out);
    assert_eq!(s["outcome"], "hung", "{}", s["verdict"]);
    assert_eq!(s["first_failure"], 2, "{}", s["verdict"]);
    for rank in ranks(&s) {
        let threads = rank["stacks"].as_array().map_or(0, Vec::len);
        assert!(threads > 0, "rank {} was looked at on its own host: {rank}", rank["rank"]);
    }
    assert_eq!(per_node(&s)[1]["host"], "node2");
    assert_nothing_left(&hosts);
}

/// The user's own DDP program under torchrun across two hosts (an agent on each, `--nodes 2
/// --node-rank R --coordinator node1:PORT`; ups-doctor gives torchrun node 0's c10d rendezvous);
/// rank 3 segfaults. The second host's agent runs with its clock shifted by a minute
/// (`UPS_DOCTOR_NODE_CLOCK_SKEW_MS`): the calibration finds exactly that shift.
#[test]
fn torchrun_on_two_hosts_by_two_ranks_names_the_crashing_rank_its_host_and_the_collateral() {
    let _one = serial();
    let Some(hosts) = Hosts::up("torchrun across hosts", 2, false) else { return };
    let sb = Sandbox::shared();
    let file = crate::util::torchrun_rank_3_segfaults(&sb, "torchrun-hosts");
    let agent = |node: u32| -> Child {
        let mut cmd = hosts.on(&format!("node{}", node + 1), bin());
        cmd.arg("run")
            .arg(&file)
            .args(["--nodes", "2", "--node-rank", &node.to_string(), "--coordinator", "node1:29411"])
            .args(["--out", &format!("node{node}"), "--join-timeout", "90", "--json", "--quiet"])
            .current_dir(sb.path())
            .env("PATH", venv_path())
            .env("NO_COLOR", "1")
            .env_remove("PYTHONUNBUFFERED")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if node == 1 {
            cmd.env("UPS_DOCTOR_NODE_CLOCK_SKEW_MS", "60000");
        }
        cmd.spawn().expect("ups-doctor starts on its host")
    };
    let second = agent(1);
    let first = agent(0);
    let outs = [first.wait_with_output().unwrap(), second.wait_with_output().unwrap()];
    for (node, out) in outs.iter().enumerate() {
        assert!(
            out.status.success(),
            "node {node}: {:?}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let s = merged(&sb, &outs[0]);
    assert_eq!(s["first_failure"], 3, "{}", s["verdict"]);
    // Which host ran rank 3 is the rendezvous's choice; that host's torchrun names it in its
    // failure summary.
    let hosted = crate::util::node_of_rank_3(|n| sb.path().join(format!("node{n}")), "torchrun-hosts");
    let first_failure = &s["nodes"]["first_failure"];
    assert_eq!(first_failure["node"], hosted, "{first_failure}");
    assert_eq!(first_failure["host"], format!("node{}", hosted + 1), "{first_failure}");
    assert_eq!(per_node(&s)[hosted]["ranks"], serde_json::json!([2, 3]), "{}", s["nodes"]["per_node"]);
    let r = ranks(&s);
    assert_eq!(r[3]["signal"], "SIGSEGV");
    for rank in &r[..3] {
        assert_eq!(rank["collateral"], true, "{rank}");
        assert_eq!(rank["identified_by"], "RANK", "{rank}");
    }
    // The true offset of the shifted agent is exactly −60 000 ms: inside the uncertainty.
    for (offset, u) in offsets(&s, 1) {
        assert!((offset + 60_000.0).abs() <= u + 1e-3, "offset {offset} ms ± {u} ms");
    }
    assert_nothing_left(&hosts);
}

/// `attach --slurm JOBID` from the first host (where `squeue` works, as on a login node) of a hung
/// two-host Slurm job that ups-doctor did not start: `srun -N 2 --ntasks-per-node 1 python
/// srun_ddp.py` whose rank 0 takes a barrier where rank 1 runs its backward. A probe on each host
/// (`srun --overlap`) reads its host's rank; node 0 judges both: hung, rank 0 out of step, the stack
/// of each rank read on its own host. The job runs on, untouched.
#[test]
fn attach_slurm_reads_every_rank_of_a_hung_job_on_both_hosts_and_leaves_it_running() {
    let _one = serial();
    let Some(hosts) = Hosts::up("attach --slurm across hosts", 2, true) else { return };
    let sb = Sandbox::shared();
    let conf = hosts.slurm_conf.clone().unwrap();
    let job_name = "hung-across-hosts";
    let program = repo().join("tests/programs/srun_ddp.py");
    let mut job = hosts
        .on("node1", "srun")
        .args(["-N", "2", "--ntasks-per-node", "1", "-J", job_name, "python"])
        .arg(&program)
        .args([
            "--port",
            "29500",
            "--master-addr",
            "node1",
            "--steps",
            "1000",
            "--skip-rank",
            "0",
            "--skip-step",
            "3",
        ])
        .current_dir(sb.path())
        .env("SLURM_CONF", &conf)
        .env("PATH", venv_path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("srun starts the job");
    // Each host's rank, as this test sees it (pid and start time), once it waits where it hangs.
    let rank_on = |host: &str| {
        hosts.processes(host).into_iter().find_map(|(pid, comm)| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            (comm.starts_with("python") && String::from_utf8_lossy(&cmdline).contains("srun_ddp.py"))
                .then_some(pid)
        })
    };
    let py_spy = crate::util::venv_python().with_file_name("py-spy");
    let stack = |pid: u32| {
        std::process::Command::new(&py_spy)
            .args(["dump", "--nonblocking", "--pid", &pid.to_string()])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    let waiting = || {
        let (Some(a), Some(b)) = (rank_on("node1"), rank_on("node2")) else { return false };
        stack(a).contains("barrier") && stack(b).contains("backward")
    };
    assert!(eventually(Duration::from_secs(180), waiting), "the job's two ranks reach their hang");
    let ranks = [rank_on("node1").unwrap(), rank_on("node2").unwrap()];
    let started = |pid: u32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        stat.rsplit_once(") ").map(|(_, rest)| rest.split_whitespace().nth(19).unwrap_or("").to_string())
    };
    let before: Vec<_> = ranks.iter().map(|&p| started(p)).collect();
    let squeue = || {
        let out = hosts
            .on("node1", "squeue")
            .args(["-h", "-n", job_name, "-o", "%i %T"])
            .env("SLURM_CONF", &conf)
            .output();
        String::from_utf8_lossy(&out.unwrap().stdout).trim().to_string()
    };
    let queued = squeue();
    let (id, state) = queued.split_once(' ').unwrap_or_else(|| panic!("squeue: {queued:?}"));
    assert_eq!(state, "RUNNING");
    let out_dir = sb.path().join("attach");
    let attach = hosts
        .on("node1", bin())
        .args(["attach", "--slurm", id, "--out"])
        .arg(&out_dir)
        .args(["--watch", "3", "--join-timeout", "90"])
        .current_dir(sb.path())
        .env("SLURM_CONF", &conf)
        .env("PATH", venv_path())
        .env("NO_COLOR", "1")
        .output()
        .expect("ups-doctor attach starts");
    let stderr = String::from_utf8_lossy(&attach.stderr);
    assert_eq!(attach.status.code(), Some(1), "hung is exit 1:\n{stderr}");
    let read = |p: &str| -> Value {
        serde_json::from_str(
            &std::fs::read_to_string(out_dir.join(p)).unwrap_or_else(|e| panic!("{p}: {e}\n{stderr}")),
        )
        .unwrap()
    };
    let a = read("node0/attach.json");
    assert_eq!(a["state"], "hung", "{a:#}");
    assert_eq!(a["ranks_found"], serde_json::json!([0, 1]), "{a:#}");
    assert_eq!(a["culprit"], 0, "rank 0 took a barrier where rank 1 runs its backward: {a:#}");
    let s = &read("node0/result.json")["scenarios"][0];
    let hosts_of: Vec<(String, Value)> = per_node(s)
        .iter()
        .map(|n| (n["host"].as_str().unwrap_or("").to_string(), n["ranks"].clone()))
        .collect();
    assert_eq!(
        hosts_of,
        [("node1".to_string(), serde_json::json!([0])), ("node2".to_string(), serde_json::json!([1]))],
        "{}",
        s["nodes"]
    );
    let stacks = |rank: usize| s["ranks"][rank]["dumps"][0]["py_spy"].as_str().unwrap_or("").to_string();
    assert!(stacks(0).contains("barrier") && stacks(0).contains("ddp.py"), "rank 0 on node1:\n{}", stacks(0));
    assert!(
        stacks(1).contains("backward") && stacks(1).contains("ddp.py"),
        "rank 1 on node2:\n{}",
        stacks(1)
    );
    let found = crate::consistency::check_run_dir(&out_dir.join("node0"));
    assert!(found.is_empty(), "the report contradicts its result.json:\n{}", found.join("\n"));
    // Untouched: the same processes, the job still running, its srun still waiting.
    let after: Vec<_> = ranks.iter().map(|&p| started(p)).collect();
    assert_eq!(before, after, "the job's ranks are the same processes");
    for pid in ranks {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        assert!(
            status.contains("TracerPid:\t0") && !status.contains("State:\tT"),
            "rank pid {pid}: {status}"
        );
    }
    assert_eq!(squeue(), format!("{id} RUNNING"));
    assert!(job.try_wait().unwrap().is_none(), "the job's srun still runs");
    // The test ends the job itself.
    let _ = hosts.on("node1", "scancel").arg(id).env("SLURM_CONF", &conf).status();
    let _ = job.wait();
    assert_nothing_left(&hosts);
}

/// A job of both hosts whose batch script runs its program on one of them (`srun -N 1`): `attach
/// --slurm JOBID` places its probe where that step runs, and node 0 reports at once, not after
/// waiting `--join-timeout` for a probe on the host where the job has no task (which, before,
/// exited saying so and was then reported lost).
#[test]
fn attach_slurm_of_a_job_whose_step_runs_on_one_of_its_hosts_probes_only_there() {
    let _one = serial();
    let Some(hosts) = Hosts::up("attach --slurm of a one-host step", 2, true) else { return };
    let sb = Sandbox::shared();
    let conf = hosts.slurm_conf.clone().unwrap();
    let job_name = "step-on-one-host";
    let program = "import time\nfor _ in range(600): time.sleep(1)";
    let wrap = format!("srun -N 1 -n 1 python -c '{program}'");
    let submitted = hosts
        .on("node1", "sbatch")
        .args(["-N", "2", "-J", job_name, "--parsable", "-o", "/dev/null", "--wrap", &wrap])
        .current_dir(sb.path())
        .env("SLURM_CONF", &conf)
        .env("PATH", venv_path())
        .output()
        .expect("sbatch runs");
    let id = String::from_utf8_lossy(&submitted.stdout).trim().to_string();
    assert!(submitted.status.success() && !id.is_empty(), "sbatch: {submitted:?}");
    let running =
        || (1..=2).any(|i| hosts.processes(&format!("node{i}")).iter().any(|(_, c)| c.starts_with("python")));
    assert!(eventually(Duration::from_secs(120), running), "the job's step starts");
    let out_dir = sb.path().join("attach");
    let attach = hosts
        .on("node1", bin())
        .args(["attach", "--slurm", &id, "--out"])
        .arg(&out_dir)
        .args(["--watch", "3", "--join-timeout", "90"])
        .current_dir(sb.path())
        .env("SLURM_CONF", &conf)
        .env("PATH", venv_path())
        .env("NO_COLOR", "1")
        .output()
        .expect("ups-doctor attach starts");
    let stderr = String::from_utf8_lossy(&attach.stderr);
    assert!(stderr.contains("runs on 1 node(s) (node1)"), "{stderr}");
    let a: Value = serde_json::from_str(
        &std::fs::read_to_string(out_dir.join("node0/attach.json"))
            .unwrap_or_else(|e| panic!("{e}\n{stderr}")),
    )
    .unwrap();
    assert_eq!(a["ranks_found"], serde_json::json!([0]), "{a:#}");
    assert!(!out_dir.join("node1").exists(), "no probe on the host where the job has no task:\n{stderr}");
    let _ = hosts.on("node1", "scancel").arg(&id).env("SLURM_CONF", &conf).status();
    assert_nothing_left(&hosts);
}

/// The sbatch script of docs/slurm-and-nodes.md ("On Slurm, one agent per node"), as it is there
/// but for the venv (this machine's, on `PATH`), the cores (2 here, not 16) and the folders: `sbatch
/// --wait` of two hosts, one agent per node started by the script's `srun`, each starting torchrun
/// on its node for the user's DDP program (`tests/programs/ddp.py`, 2 ranks a node). Node 0's
/// report in `reports/runs/slurm-JOBID/node0` judges all four ranks on both hosts.
#[test]
fn the_documented_sbatch_script_runs_one_agent_per_host_and_node_0_reports_every_rank() {
    let _one = serial();
    let Some(hosts) = Hosts::up("sbatch across hosts", 2, true) else { return };
    let sb = Sandbox::shared();
    let program = repo().join("tests/programs/ddp.py");
    std::fs::write(
        sb.path().join("scenario.json"),
        format!(
            r#"{{"command": ["torchrun", "--nproc_per_node", "2", "{}", "--steps", "6"],
                "launch": {{"world_size": 4, "style": "launcher"}},
                "limits": {{"timeout_s": 300, "hang_after_s": 150}}}}"#,
            program.display()
        ),
    )
    .unwrap();
    let venv_bin = crate::util::venv_python().parent().unwrap().display().to_string();
    let script = format!(
        r#"#!/bin/bash
#SBATCH --job-name=ups-doctor
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=2
#SBATCH --time=00:10:00
#SBATCH --output=ups-doctor-%j.out
export PATH="{venv_bin}:{bin_dir}:$PATH"
export UPS_DOCTOR_COORDINATOR_PORT=29411
srun bash -c 'exec ups-doctor run scenario.json --out "reports/runs/slurm-$SLURM_JOB_ID/node$SLURM_NODEID"'
"#,
        bin_dir = bin().parent().unwrap().display()
    );
    std::fs::write(sb.path().join("job.sh"), script).unwrap();
    let out = hosts
        .on("node1", "sbatch")
        .args(["--wait", "--parsable", "job.sh"])
        .current_dir(sb.path())
        .env("SLURM_CONF", hosts.slurm_conf.as_ref().unwrap())
        .env("NO_COLOR", "1")
        .output()
        .expect("sbatch runs");
    let id = String::from_utf8_lossy(&out.stdout).trim().split(';').next().unwrap_or("").to_string();
    let log = std::fs::read_to_string(sb.path().join(format!("ups-doctor-{id}.out"))).unwrap_or_default();
    assert!(
        out.status.success(),
        "sbatch --wait: {:?}\n{}\n{log}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let folder = sb.path().join(format!("reports/runs/slurm-{id}/node0"));
    let v: Value = serde_json::from_str(
        &std::fs::read_to_string(folder.join("result.json"))
            .unwrap_or_else(|e| panic!("node 0's result: {e}\n{log}")),
    )
    .unwrap();
    let s = &v["scenarios"][0];
    assert_eq!(s["outcome"], "passed", "{}\n{log}", s["verdict"]);
    assert_eq!(ranks(s).len(), 4, "{}", s["ranks"]);
    let hosts_seen: Vec<&str> = per_node(s).iter().map(|n| n["host"].as_str().unwrap_or("")).collect();
    assert_eq!(hosts_seen, ["node1", "node2"], "{}", s["nodes"]);
    let found = crate::consistency::check_run_dir(&folder);
    assert!(found.is_empty(), "the report contradicts its result.json:\n{}", found.join("\n"));
    assert!(
        sb.path().join(format!("reports/runs/slurm-{id}/node1/report.md")).is_file(),
        "node 1's own view"
    );
    assert_nothing_left(&hosts);
}

/// A Ray cluster across the two hosts, started the way a job script of several nodes starts one
/// (Ray's own guide for Slurm): the head and then the driver on node1, a worker node on node2,
/// one CPU each so that Ray Train's two workers land one on each host. The driver is Ray's own
/// `torch_linear_example.py` (the pinned `ray[train]`), one epoch (125 steps a worker).
const RAY_JOB: &str = r#"# One Ray node per host; node1 is the head and runs the driver.
HEAD=$(getent hosts node1 | cut -d' ' -f1)
if [ "$(hostname)" = node1 ]; then
  ray start --head --port 6379 --num-cpus 1 --node-ip-address "$HEAD" --include-dashboard=false --disable-usage-stats
  exec python "$EXAMPLE" --address "$HEAD:6379" --epochs 1
else
  exec ray start --address "$HEAD:6379" --num-cpus 1 --node-ip-address "$(hostname -i)" --block --disable-usage-stats
fi
"#;

/// One `ups-doctor run -- bash ray-job.sh` agent per host, with `fault` (the accuracy matrix's
/// injector's `ACC_*` variables) in their environment: node 0's merged result, and the host
/// (`node1`, `node2`) of each world rank as Ray's controller announced it in the driver's output.
fn ray_across_hosts(
    hosts: &Hosts,
    sb: &Sandbox,
    fault: &[(&str, &str)],
) -> (Value, [Output; 2], Vec<String>) {
    let python = crate::ray::ray_python();
    let example = crate::ray::example(&python);
    std::fs::write(sb.path().join("ray-job.sh"), RAY_JOB).unwrap();
    let home = sb.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let path = crate::ray::ray_path(&python);
    let agent = |node: u32| -> Child {
        let mut cmd = hosts.on(&format!("node{}", node + 1), bin());
        cmd.arg("run")
            .args(["--nodes", "2", "--node-rank", &node.to_string(), "--coordinator", "node1:29411"])
            .args(["--ranks", "2", "--hang-after", "20", "--timeout", "300", "--join-timeout", "90"])
            .args(["--out", &format!("node{node}"), "--quiet", "--", "bash", "ray-job.sh"])
            .current_dir(sb.path())
            .env("PATH", &path)
            .env("HOME", &home)
            .env("EXAMPLE", &example)
            .env(crate::ray::WORKER_START.0, crate::ray::WORKER_START.1)
            .env(crate::ray::NICENESS.0, crate::ray::NICENESS.1)
            .env("PYTHONPATH", repo().join("bench/accuracy/inject"))
            .env("NO_COLOR", "1")
            .env_remove("PYTHONUNBUFFERED")
            .envs(fault.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd.spawn().expect("ups-doctor starts on its host")
    };
    let first = agent(0);
    let second = agent(1);
    let outs = [first.wait_with_output().unwrap(), second.wait_with_output().unwrap()];
    let s = merged(&sb, &outs[0]);
    // `- (ip=10.251.0.12, pid=96) world_rank=0, local_rank=0, node_rank=0`: hosts' addresses are
    // 10.251.0.1N for nodeN.
    let driver =
        std::fs::read_to_string(sb.path().join("node0/1-bash/launcher.stderr.log")).unwrap_or_default();
    let mut hosted = vec![String::new(); 2];
    for line in driver.lines() {
        let Some((ip, rest)) =
            line.split_once("(ip=10.251.0.1").map(|(_, r)| r).and_then(|r| r.split_once(','))
        else {
            continue;
        };
        let rank =
            rest.split_once("world_rank=").and_then(|(_, r)| r.split(',').next()?.parse::<usize>().ok());
        if let Some(slot) = rank.and_then(|r| hosted.get_mut(r)) {
            *slot = format!("node{ip}");
        }
    }
    assert!(hosted.iter().all(|h| !h.is_empty()), "Ray's controller placed no worker:\n{driver}");
    (s, outs, hosted)
}

/// The host a rank ran on, as the merged result's Nodes section says.
fn host_of_rank(s: &Value, rank: u64) -> String {
    let node = per_node(s).iter().find(|n| n["ranks"].as_array().is_some_and(|r| r.contains(&rank.into())));
    node.and_then(|n| n["host"].as_str()).unwrap_or_default().to_string()
}

#[test]
fn ray_train_across_two_hosts_passes_with_each_worker_a_rank_on_its_own_host() {
    let _one = serial();
    let Some(hosts) = Hosts::up("ray across hosts", 2, false) else { return };
    let sb = Sandbox::shared();
    let (s, outs, hosted) = ray_across_hosts(&hosts, &sb, &[]);
    for (node, out) in outs.iter().enumerate() {
        assert!(
            out.status.success(),
            "node {node}: {:?}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(s["outcome"], "passed", "{}", s["verdict"]["headline"]);
    assert_eq!(ranks(&s).len(), 2, "two workers, not the driver nor Ray's daemons: {:#?}", ranks(&s));
    for (rank, r) in ranks(&s).iter().enumerate() {
        assert_eq!(r["identified_by"], "process_group", "{r:#}");
        assert_eq!(
            (r["outcome"].as_str(), r["exit_source"].as_str()),
            (Some("passed"), Some("cluster")),
            "{r:#}"
        );
        assert!(r["steps_done"].as_u64().unwrap_or(0) >= 100, "{r:#}");
        // Where Ray placed each rank (it numbers the nodes its own way), the report says.
        assert_eq!(host_of_rank(&s, rank as u64), hosted[rank], "{}", s["nodes"]["per_node"]);
    }
    assert_nothing_left(&hosts);
}

/// World rank 1's training function raises at its 50th step, on whichever host Ray placed it:
/// the culprit with its own error (Ray prints a remote worker's lines, and relays its error, in
/// the driver's output on node1), rank 0 collateral.
#[test]
fn a_ray_worker_that_raised_on_either_host_is_the_culprit_with_its_error_and_its_host() {
    let _one = serial();
    let Some(hosts) = Hosts::up("ray raise across hosts", 2, false) else { return };
    let sb = Sandbox::shared();
    let (s, _, hosted) =
        ray_across_hosts(&hosts, &sb, &[("ACC_FAULT", "exception"), ("ACC_RANK", "1"), ("ACC_STEP", "50")]);
    let headline = s["verdict"]["headline"].as_str().unwrap_or_default();
    assert_eq!(s["first_failure"], 1, "{headline}");
    assert!(headline.contains("accuracy-bench injected fault on rank 1"), "{headline}");
    assert_eq!(s["nodes"]["first_failure"]["host"], hosted[1].as_str(), "{}", s["nodes"]["first_failure"]);
    assert_eq!(ranks(&s)[0]["collateral"], true, "{:#}", ranks(&s)[0]);
    assert_nothing_left(&hosts);
}

/// World rank 0 sleeps at its 50th step outside any collective; rank 1, on the other host, waits
/// in the next gradient all-reduce: rank 0 is named from the Flight Recorder of both, with the
/// stacks its own host's agent took.
#[test]
fn a_ray_worker_that_stopped_on_either_host_is_named_in_the_hang_with_its_stacks() {
    let _one = serial();
    let Some(hosts) = Hosts::up("ray hang across hosts", 2, false) else { return };
    let sb = Sandbox::shared();
    let (s, _, hosted) =
        ray_across_hosts(&hosts, &sb, &[("ACC_FAULT", "hang"), ("ACC_RANK", "0"), ("ACC_STEP", "50")]);
    let headline = s["verdict"]["headline"].as_str().unwrap_or_default();
    assert_eq!(s["outcome"], "hung", "{headline}");
    assert_eq!(s["first_failure"], 0, "{headline}");
    assert_eq!(s["verdict"]["pattern"], "ranks-out-of-step", "{headline}");
    assert_eq!(s["nodes"]["first_failure"]["host"], hosted[0].as_str(), "{}", s["nodes"]["first_failure"]);
    let dumps = ranks(&s)[0]["dumps"].as_array().cloned().unwrap_or_default();
    assert!(dumps.iter().any(|d| d["py_spy"].as_str().is_some_and(|t| t.contains("_on_step"))), "{dumps:#?}");
    assert_nothing_left(&hosts);
}
