//! Data-loader workers: real forked and spawned processes, a real /dev/shm ring, real SIGKILL,
//! the real fork-after-libgomp deadlock, all through the real binary.

use std::path::Path;
use std::process::Stdio;

use crate::util::{RunOutput, Sandbox, alive, tiny};
use serde_json::Value;

/// `ups-doctor run` whose pid is known: every run id, hence every segment name, starts with it.
fn run_with_pid(sb: &Sandbox, files: &[&Path], args: &[&str]) -> (RunOutput, u32) {
    let child = sb
        .cmd()
        .arg("run")
        .args(files)
        .arg("--out")
        .arg(sb.out())
        .args(["--json", "--quiet"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ups-doctor starts");
    let pid = child.id();
    let output = child.wait_with_output().expect("ups-doctor finishes");
    let result = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    (RunOutput { output, result }, pid)
}

/// Files of this harness's runs still in /dev/shm or the temporary folder.
fn leftovers(harness_pid: u32) -> Vec<String> {
    let prefix = format!("ups-doctor-{harness_pid}-");
    [Path::new("/dev/shm").to_path_buf(), std::env::temp_dir()]
        .iter()
        .filter_map(|dir| std::fs::read_dir(dir).ok())
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with(&prefix))
        .collect()
}

/// Pids of the workers rank 0 reported.
fn worker_pids(rank: &Value) -> Vec<u64> {
    rank["workers"]
        .as_array()
        .map(|w| w.iter().filter_map(|w| w["pid"].as_u64()).collect())
        .unwrap_or_default()
}

fn with_data(extra_data: &str, rest: &str) -> String {
    tiny(rest).replace(r#""batch_size": 8 }"#, &format!(r#""batch_size": 8, {extra_data} }}"#))
}

#[test]
fn forked_and_spawned_workers_train_bit_identical_parameters_to_none() {
    let sb = Sandbox::new();
    let none = sb.scenario("w0", &tiny(""));
    let fork = sb.scenario("w2-fork", &with_data(r#""workers": 2, "start_method": "fork""#, ""));
    let spawn =
        sb.scenario("w2-spawn", &with_data(r#""workers": 2, "start_method": "spawn", "cache": "shm""#, ""));
    let (run, pid) = run_with_pid(&sb, &[&none, &fork, &spawn], &[]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    let scenarios = run.result["scenarios"].as_array().unwrap();
    let rank0 = |i: usize| &scenarios[i]["ranks"][0];
    let checksum = rank0(0)["params_checksum"].as_str().expect("a checksum").to_string();
    for (i, scenario) in scenarios.iter().enumerate().skip(1) {
        assert_eq!(rank0(i)["outcome"], "passed");
        assert_eq!(rank0(i)["params_checksum"], checksum.as_str(), "{} differs", scenario["name"]);
        assert_eq!(rank0(i)["final_loss"], rank0(0)["final_loss"]);
        let pids = worker_pids(rank0(i));
        assert_eq!(pids.len(), 2, "two workers reported");
        assert!(pids.iter().all(|&p| !alive(p)), "no worker outlives the run: {pids:?}");
    }
    assert_eq!(rank0(1)["workers"][0]["start_method"], "fork");
    assert_eq!(rank0(2)["workers"][1]["start_method"], "spawn");
    assert_eq!(leftovers(pid), Vec::<String>::new());
}

#[test]
fn a_killed_worker_fails_the_rank_with_pytorchs_text_naming_its_pid_and_id() {
    let sb = Sandbox::new();
    let file = sb.scenario(
        "killed",
        &with_data(
            r#""workers": 2, "cache": "disk""#,
            r#""inject": [{"fault": "worker_kill", "phase": "data.next", "step": 3}],
               "expect": {"outcome": "exited", "exit_code": 1}"#,
        ),
    );
    let (run, pid) = run_with_pid(&sb, &[&file], &[]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    let r = run.rank(0);
    let pids = worker_pids(r);
    let error = r["error"].as_str().unwrap();
    assert_eq!(
        error,
        format!(
            "DataLoader worker (pid {}) is killed by signal: Killed. [data-loader worker 0 of rank 0, fork]",
            pids[0]
        )
    );
    let headline = run.scenario()["verdict"]["headline"].as_str().unwrap();
    assert!(
        headline.starts_with(&format!("DataLoader worker 0 (pid {}) of rank 0 failed first", pids[0])),
        "{headline}"
    );
    // Killed with SIGKILL by the fault, not by the kernel: never called an OOM kill.
    assert_eq!(run.scenario()["verdict"]["pattern"], "worker-killed-by-signal");
    assert!(!headline.contains("OOM"), "{headline}");
    assert!(pids.iter().all(|&p| !alive(p)), "no worker outlives the run: {pids:?}");
    assert_eq!(leftovers(pid), Vec::<String>::new());
}

#[test]
fn a_worker_that_exits_is_reported_with_its_exit_code() {
    let sb = Sandbox::new();
    let file = sb.scenario(
        "worker-exit",
        &with_data(
            r#""workers": 2, "start_method": "spawn""#,
            r#""inject": [{"fault": "exit_error", "phase": "worker.batch", "step": 2}],
               "expect": {"outcome": "exited", "message": "exited unexpectedly with exit code 1."}"#,
        ),
    );
    let (run, pid) = run_with_pid(&sb, &[&file], &[]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    let error = run.rank(0)["error"].as_str().unwrap();
    assert!(error.contains("[data-loader worker 0 of rank 0, spawn]"), "{error}");
    // It exited by itself: not called a signal, and its own last words are quoted.
    let v = &run.scenario()["verdict"];
    assert_eq!(v["pattern"], "worker-exited", "{v:#}");
    let cause = v["likely_cause"].as_str().unwrap();
    assert!(
        cause.starts_with("The worker exited by itself with status 1: it was not killed by a signal"),
        "{cause}"
    );
    assert!(
        cause.contains(
            "Its last words: `error: data-loader worker 0: injected failure: fault `exit_error` at phase `worker.batch` \
             step 2`."
        ),
        "{cause}"
    );
    assert_eq!(leftovers(pid), Vec::<String>::new());
}

/// REFERENCE.md "fork after libtorch threads": the trainer's 2-thread pool ran (data
/// generation, the cache), the worker keeps the inherited thread count and its first parallel
/// op (a 64 × 1024 index_select) waits in libgomp forever.
const DEADLOCK: &str = r#"{
  "model": { "depths": [1], "hidden": 32, "heads": 2, "latent_tokens": 8, "window": 2 },
  "data": { "samples": 8, "grid": 1024, "timesteps": 10, "queries": 32, "batch_size": 64,
            "workers": 1, "start_method": "fork", "worker_threads": "inherit" },
  "train": { "steps": 4 },
  "limits": { "timeout_s": 120, "hang_after_s": 8 },
  "expect": { "outcome": "hung" }
}"#;

#[test]
fn a_worker_forked_with_inherited_threads_deadlocks_in_libgomp() {
    let sb = Sandbox::new();
    let file = sb.scenario("deadlock", DEADLOCK);
    let (run, pid) = run_with_pid(&sb, &[&file], &[]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    let r = run.rank(0);
    assert_eq!(r["outcome"], "hung");
    let stacks = r["stacks"].as_array().expect("stacks");
    let worker = stacks.iter().find(|t| t["thread"] == "loader-w0").expect("the worker's stack was dumped");
    let frames = worker["frames"].to_string();
    assert!(frames.contains("libgomp"), "worker frames: {frames}");
    let cause = run.scenario()["verdict"]["likely_cause"].as_str().unwrap();
    assert!(cause.contains("loader-w0") && cause.contains("libgomp"), "{cause}");
    assert_eq!(run.scenario()["verdict"]["pattern"], "fork-after-threads");
    let pids = worker_pids(r);
    assert!(pids.iter().all(|&p| !alive(p)), "no worker outlives the run: {pids:?}");
    assert_eq!(leftovers(pid), Vec::<String>::new());

    // The fix: one thread in the worker, set first thing.
    let (fixed, _) = run_with_pid(&sb, &[&file], &["--set", "data.worker_threads=one"]);
    assert_eq!(fixed.rank(0)["outcome"], "passed", "stderr:\n{}", fixed.stderr());
}

#[test]
fn loader_worker_refuses_to_run_by_hand() {
    let out = std::process::Command::new(crate::util::trainer_bin())
        .args(["loader-worker", "{}"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("started by `ups-doctor train`"));
}
