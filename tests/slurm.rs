//! `srun` under the harness: a real one-host Slurm cluster (scripts/slurm-one-host.sh, started by
//! `./x test` when it runs as root with apt) runs a real 2-task PyTorch program
//! (tests/programs/srun_ddp.py → ddp.py, CPU, gloo) whose tasks are started by slurmstepd, not by srun:
//! they are no descendants of the command ups-doctor started and carry their rank only as
//! `SLURM_PROCID`.
//!
//! Without a cluster that answers, each test says why and returns; when `./x test` started the
//! cluster (`UPS_DOCTOR_SLURM=1`) a cluster that does not answer fails the test instead.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::util::slurm::cluster;
use crate::util::{RunOutput, Sandbox, eventually, free_port, repo};
use serde_json::Value;

/// A scenario whose command is `srun -N 1 -n 2 -J JOB python srun_ddp.py --port PORT ARGS`.
fn srun_scenario(sb: &Sandbox, name: &str, job: &str, args: &str, rest: &str) -> PathBuf {
    let program = repo().join("tests/programs/srun_ddp.py");
    let port = free_port();
    sb.scenario(
        name,
        &format!(
            r#"{{"command": ["srun", "-N", "1", "-n", "2", "-J", "{job}", "python", "{}", "--port", "{port}"{args}],
                "launch": {{"world_size": 2, "style": "launcher"}}, {rest}}}"#,
            program.display()
        ),
    )
}

fn run(sb: &Sandbox, conf: &OsString, file: &Path) -> RunOutput {
    sb.run_in_venv_with_env(&[file], &[("SLURM_CONF", conf.as_os_str())])
}

fn scenario(run: &RunOutput) -> &Value {
    run.result["scenarios"]
        .as_array()
        .and_then(|s| s.first())
        .unwrap_or_else(|| panic!("no result; stderr:\n{}", run.stderr()))
}

/// Nothing of the run is left: no Slurm job by this name (Slurm ends a step's tasks when its
/// srun is gone, within its own timeouts: the limit is generous) and no task process.
fn assert_nothing_left(conf: &OsString, job: &str) {
    let jobs = || {
        let out = Command::new("squeue").args(["-h", "-n", job]).env("SLURM_CONF", conf).output().unwrap();
        assert!(out.status.success(), "squeue: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert!(
        eventually(Duration::from_secs(60), || jobs().is_empty()),
        "job {job} is still there: {}",
        jobs()
    );
    let marker = format!("SLURM_JOB_NAME={job}");
    let tasks: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            crate::util::alive(u64::from(*pid))
                && std::fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == marker.as_bytes()))
        })
        .collect();
    assert!(tasks.is_empty(), "tasks of job {job} outlived the run: {tasks:?}");
}

const LIMITS: &str = r#""limits": {"timeout_s": 300, "hang_after_s": 120}"#;

#[test]
fn a_two_task_srun_program_passes_with_both_ranks_found_by_slurm_procid() {
    let Some(conf) = cluster("srun pass") else { return };
    let sb = Sandbox::new();
    let job = "ups-doctor-test-pass";
    let file = srun_scenario(
        &sb,
        "srun-pass",
        job,
        r#", "--steps", "6""#,
        &format!(r#"{LIMITS}, "expect": {{"completes_when": {{"stdout": "^training finished$"}}}}"#),
    );
    let run = run(&sb, &conf, &file);
    let s = scenario(&run);
    assert_eq!(run.code(), 0, "{}\nstderr:\n{}", s["verdict"], run.stderr());
    assert_eq!(s["outcome"], "passed", "{}", s["verdict"]);
    assert_eq!(s["external"]["launcher"]["exit_code"], 0);
    let ranks = s["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2);
    for (i, r) in ranks.iter().enumerate() {
        assert_eq!(r["rank"], i);
        assert_eq!(r["outcome"], "passed", "{r}");
        assert_eq!(r["steps_done"], 6, "rank {i} reported every step through the helper");
    }
    // The ranks are slurmstepd's children, not srun nor anything below it.
    let pids: Vec<u64> = ranks.iter().map(|r| r["pid"].as_u64().unwrap()).collect();
    assert_ne!(pids[0], pids[1]);
    assert!(!pids.contains(&s["external"]["launcher"]["pid"].as_u64().unwrap()));
    let md = sb.reports();
    assert!(md.contains("SLURM_PROCID"), "the report says how the ranks were identified:\n{md}");
    assert_nothing_left(&conf, job);
}

#[test]
fn an_srun_task_segfaulting_is_the_first_failure_and_the_other_rank_collateral() {
    let Some(conf) = cluster("srun segfault") else { return };
    let sb = Sandbox::new();
    let job = "ups-doctor-test-segv";
    let file = srun_scenario(
        &sb,
        "srun-segv",
        job,
        r#", "--segv-rank", "1", "--segv-step", "4""#,
        &format!(
            r#"{LIMITS}, "expect": {{"outcome": "signaled", "signal": "SIGSEGV", "rank": 1, "phase": "forward", "step": 4}}"#
        ),
    );
    let run = run(&sb, &conf, &file);
    let s = scenario(&run);
    assert_eq!(
        run.code(),
        0,
        "the expectation is met: {} {}\n{}",
        s["verdict"],
        s["expectation_mismatches"],
        s["ranks"]
    );
    assert_eq!(s["first_failure"], 1, "{}", s["verdict"]);
    let r1 = &s["ranks"][1];
    assert_eq!((r1["outcome"].as_str(), r1["signal"].as_str()), (Some("signaled"), Some("SIGSEGV")), "{r1}");
    let r0 = &s["ranks"][0];
    assert_eq!(r0["collateral"], true, "{r0}");
    assert_ne!(r0["outcome"], "passed");
    assert!(
        s["verdict"]["headline"].as_str().unwrap().contains("Rank 0 failed after it (collateral)"),
        "{}",
        s["verdict"]
    );
    // srun's own summary: its exit status is the segfaulted task's.
    assert_eq!(s["external"]["launcher"]["exit_code"], 139, "{}", s["external"]["launcher"]);
    assert_nothing_left(&conf, job);
}

#[test]
fn an_srun_task_skipping_a_collective_is_hung_with_stacks_of_both_ranks() {
    let Some(conf) = cluster("srun hang") else { return };
    let sb = Sandbox::new();
    let job = "ups-doctor-test-hang";
    let file = srun_scenario(
        &sb,
        "srun-hang",
        job,
        r#", "--skip-rank", "0", "--skip-step", "3""#,
        r#""limits": {"timeout_s": 300, "hang_after_s": 30}, "expect": {"outcome": "hung"}"#,
    );
    let run = run(&sb, &conf, &file);
    let s = scenario(&run);
    assert_eq!(
        run.code(),
        0,
        "the expectation is met: {} {}\n{}",
        s["verdict"],
        s["expectation_mismatches"],
        s["ranks"]
    );
    assert_eq!(s["outcome"], "hung");
    for r in s["ranks"].as_array().unwrap() {
        let dumps = r["dumps"].as_array().unwrap_or_else(|| panic!("rank {} has stacks: {r}", r["rank"]));
        let py_spy =
            dumps.first().and_then(|d| d["py_spy"].as_str()).unwrap_or_else(|| panic!("py-spy ran: {r}"));
        assert!(py_spy.contains(" (ddp.py:"), "rank {}'s stack reaches the program:\n{py_spy}", r["rank"]);
    }
    // Both tasks were torn down by ups-doctor itself: the second task sits in the first one's
    // process group (slurmstepd's choice), and passes the ownership checks as a found rank.
    for r in s["ranks"].as_array().unwrap() {
        assert_eq!(r["torn_down_with"], "SIGTERM", "{r}");
    }
    // srun was given the time to end the step its own way (killed, it would leave the job's
    // allocation behind: assert_nothing_left below).
    assert_eq!(s["external"]["launcher"]["exit_code"], 143, "{}", s["external"]["launcher"]);
    let stacks = |rank: usize| s["ranks"][rank]["dumps"][0]["py_spy"].as_str().unwrap().to_string();
    assert!(stacks(0).contains("barrier"), "rank 0 waits in the barrier it took instead:\n{}", stacks(0));
    assert!(stacks(1).contains("backward"), "rank 1 waits in the gradient all-reduce:\n{}", stacks(1));
    assert_nothing_left(&conf, job);
}
