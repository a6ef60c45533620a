//! External training commands under the harness: real Python programs with real PyTorch 2.11
//! (CPU, gloo) from the test venv, started per rank or by torchrun, with markers through
//! `python/ups_doctor.py`, real signals, a real private `/dev/shm` and real py-spy.

use std::path::Path;

use crate::util::{RunOutput, Sandbox, repo, venv_path};
use serde_json::Value;

/// `ups-doctor run` with the venv's `bin` first on `PATH`.
fn run(sb: &Sandbox, files: &[&Path]) -> RunOutput {
    sb.run_in_venv(files)
}

fn program(name: &str) -> String {
    repo().join("tests/programs").join(name).display().to_string()
}

fn scenarios(run: &RunOutput) -> &Vec<Value> {
    run.result["scenarios"].as_array().unwrap_or_else(|| panic!("no result; stderr:\n{}", run.stderr()))
}

fn report(sb: &Sandbox) -> String {
    sb.reports()
}

const LIMITS: &str = r#""limits": {"timeout_s": 300, "hang_after_s": 120}"#;

#[test]
fn a_two_rank_ddp_program_passes_per_rank_and_under_torchrun_with_markers_from_every_rank() {
    let sb = Sandbox::new();
    let ddp = program("ddp.py");
    let per_rank = sb.scenario(
        "ddp-per-rank",
        &format!(
            r#"{{"command": ["python", "{ddp}", "--steps", "{{steps}}"], "params": {{"steps": 6}},
                "launch": {{"world_size": 2}}, {LIMITS}, "expect": {{"completes_when": "done"}}}}"#
        ),
    );
    let torchrun = sb.scenario(
        "ddp-torchrun",
        &format!(
            r#"{{"command": ["torchrun", "--nproc_per_node", "{{world_size}}", "{ddp}", "--steps", "{{steps}}"],
                "params": {{"steps": 6}}, "launch": {{"world_size": 2, "style": "launcher"}}, {LIMITS},
                "expect": {{"completes_when": {{"stdout": "^training finished$"}}}}}}"#
        ),
    );
    let run = run(&sb, &[&per_rank, &torchrun]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    for s in scenarios(&run) {
        assert_eq!(s["outcome"], "passed", "{}", s["verdict"]);
        for r in s["ranks"].as_array().unwrap() {
            assert_eq!(r["outcome"], "passed");
            assert_eq!(r["steps_done"], 6, "rank {} reported every step through the helper", r["rank"]);
            assert!(r["markers"].as_u64().unwrap() > 20, "{}", r["markers"]);
            let phases: Vec<&str> =
                r["timeline"].as_array().unwrap().iter().filter_map(|p| p["phase"].as_str()).collect();
            assert!(phases.contains(&"dist.init") && phases.contains(&"train"), "{phases:?}");
        }
    }
    let launcher = &scenarios(&run)[1];
    assert_eq!(launcher["external"]["style"], "launcher");
    assert_eq!(launcher["external"]["launcher"]["exit_code"], 0);
    // The ranks were torchrun's children, found by RANK in their environment: not the launcher.
    let pids: Vec<u64> =
        launcher["ranks"].as_array().unwrap().iter().map(|r| r["pid"].as_u64().unwrap()).collect();
    assert!(!pids.contains(&launcher["external"]["launcher"]["pid"].as_u64().unwrap()));
    assert_ne!(pids[0], pids[1]);
}

#[test]
fn rank_1_segfaulting_is_the_first_failure_and_rank_0_collateral_per_rank_and_under_torchrun() {
    let sb = Sandbox::new();
    let ddp = program("ddp.py");
    let expect =
        r#""expect": {"outcome": "signaled", "signal": "SIGSEGV", "rank": 1, "phase": "forward", "step": 3}"#;
    let per_rank = sb.scenario(
        "segv-per-rank",
        &format!(
            r#"{{"command": ["python", "{ddp}", "--segv-rank", "1", "--segv-step", "3"],
                "launch": {{"world_size": 2}}, {LIMITS}, {expect}}}"#
        ),
    );
    let torchrun = sb.scenario(
        "segv-torchrun",
        &format!(
            r#"{{"command": ["torchrun", "--nproc_per_node", "2", "{ddp}", "--segv-rank", "1", "--segv-step", "3"],
                "launch": {{"world_size": 2, "style": "launcher"}}, {LIMITS}, {expect}}}"#
        ),
    );
    let run = run(&sb, &[&per_rank, &torchrun]);
    let summary: Vec<String> = scenarios(&run)
        .iter()
        .map(|s| format!("{}: {} {} {}", s["name"], s["verdict"], s["expectation_mismatches"], s["ranks"]))
        .collect();
    assert_eq!(run.code(), 0, "both meet their expectation:\n{}", summary.join("\n"));
    for s in scenarios(&run) {
        assert_eq!(s["first_failure"], 1, "{}", s["verdict"]);
        let r1 = &s["ranks"][1];
        assert_eq!((r1["outcome"].as_str(), r1["signal"].as_str()), (Some("signaled"), Some("SIGSEGV")));
        let r0 = &s["ranks"][0];
        assert_eq!(r0["collateral"], true, "{r0}");
        assert_ne!(r0["outcome"], "passed");
        assert!(s["verdict"]["headline"].as_str().unwrap().contains("Rank 0 failed after it (collateral)"));
    }
    let per_rank = &scenarios(&run)[0];
    assert_eq!(per_rank["verdict"]["pattern"], "native-crash");
    let key = per_rank["verdict"]["key_line"].as_str().unwrap_or_default();
    assert!(key.starts_with("Fatal Python error: Segmentation fault (ddp.py:"), "{key}");
    let fault = per_rank["ranks"][1]["quotes"].as_array().unwrap();
    assert!(
        fault.iter().any(|q| q["title"] == "Python fault handler"
            && q["lines"].as_array().unwrap().iter().any(|l| l.as_str().unwrap().contains("ddp.py"))),
        "faulthandler's stack names the program's line: {fault:#?}"
    );
    let torchrun = &scenarios(&run)[1];
    let evidence = torchrun["verdict"]["evidence"].to_string();
    assert!(
        evidence.contains("torchrun's summary names rank 1 (local_rank: 1) as the root cause (first observed failure), exitcode -11"),
        "{evidence}"
    );
    // The fault handler's stack is in torchrun's shared output, not the rank's own: the one rank
    // a fatal signal ended owns it, and its frame is the program's line, as the quote shows.
    assert!(
        evidence.contains("first frame in the program's own code: `ddp.py:44 in <module>`, from Python's fault handler in the launcher's output"),
        "{evidence}"
    );
    assert!(!evidence.contains("named no frame"), "{evidence}");
    let source = torchrun["ranks"][1]["exit_source"].as_str().unwrap();
    assert!(source == "procfs" || source == "torchrun", "{source}");
    let quotes = torchrun["external"]["launcher"]["quotes"].as_array().unwrap();
    let root = quotes
        .iter()
        .find(|q| q["title"] == "torchrun: Root Cause (first observed failure)")
        .unwrap_or_else(|| panic!("torchrun's summary is quoted: {quotes:#?}"));
    let root: Vec<&str> = root["lines"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(root.iter().any(|l| l.contains("rank      : 1 (local_rank: 1)")), "{root:?}");
    assert!(root.iter().any(|l| l.contains("exitcode  : -11")), "{root:?}");
    let md = report(&sb);
    assert!(md.contains("Launcher output, torchrun: Root Cause (first observed failure):"), "{md}");
}

#[test]
fn a_dataloader_worker_out_of_a_16m_private_dev_shm_is_named_with_its_rank_and_pytorchs_words() {
    let sb = Sandbox::new();
    let loader = program("shm_loader.py");
    let file = sb.scenario(
        "shm",
        &format!(
            r#"{{"command": ["python", "{loader}", "--big-rank", "1", "--sample-mib", "5", "--batch", "4"],
                "launch": {{"world_size": 2}}, "data": {{"shm_size": "16m"}}, {LIMITS},
                "expect": {{"outcome": "exited", "rank": 1, "message": "unable to allocate shared memory(shm)"}}}}"#
        ),
    );
    // A big batch is 20 MiB, more than the whole 16 MiB /dev/shm: the kernel refuses it before
    // taking any room. (One of exactly 16 MiB was refused only after filling /dev/shm for a
    // moment, and rank 0's small batches, in the same /dev/shm, then failed too now and then.)
    let run = run(&sb, &[&file]);
    if run.code() == 3 && run.stderr().contains("Operation not permitted") {
        eprintln!("skipped: this machine does not permit mount namespaces:\n{}", run.stderr());
        return;
    }
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    let s = run.scenario();
    assert_eq!(s["ranks"][0]["outcome"], "passed", "rank 0's small samples fit");
    let r1 = &s["ranks"][1];
    // Worker 1 builds batch 1, the first big one; its pid is in PyTorch's shm file name and in
    // the helper's `worker` marker.
    let worker1 = r1["workers"].as_array().unwrap().iter().find(|w| w["id"] == 1).expect("worker 1 reported");
    let pid = worker1["pid"].as_u64().unwrap();
    let headline = s["verdict"]["headline"].as_str().unwrap();
    assert_eq!(s["verdict"]["pattern"], "shm-exhausted");
    assert!(
        headline.starts_with(&format!("DataLoader worker 1 (pid {pid}) of rank 1 failed first")),
        "{headline}"
    );
    assert!(
        headline.contains(&format!("unable to allocate shared memory(shm) for file </torch_{pid}_")),
        "{headline}"
    );
    let evidence = s["verdict"]["evidence"].to_string();
    assert!(
        evidence.contains("the run's private `/dev/shm` (`data.shm_size` = `16m`) peaked at"),
        "{evidence}"
    );
    assert!(evidence.contains("of 16.0 MiB"), "{evidence}");
    let md = report(&sb);
    assert!(md.contains("Rank 1, DataLoader:"), "{md}");
    assert!(md.contains("Caught RuntimeError in DataLoader worker process 1."), "{md}");
}

/// A command's unbuffered output is line-buffered by ups-doctor's sitecustomize (one write a line,
/// so ranks sharing a launcher's stdout cannot split each other's lines), which runs the user's
/// own sitecustomize after it; the same when the user set `PYTHONUNBUFFERED` (as most ML
/// container images do: two ranks' lines ran together under torchrun, `rank 1 step 2rank 0 step
/// 2`) and the observer's sitecustomize is there. With the observer off and the user's own
/// `PYTHONUNBUFFERED`, nothing is put in: the output stays as the user made it.
#[test]
fn a_commands_python_writes_whole_lines_and_still_runs_the_users_sitecustomize() {
    let sb = Sandbox::new();
    let user = sb.path().join("user-site");
    std::fs::create_dir_all(&user).unwrap();
    std::fs::write(user.join("sitecustomize.py"), "print('user sitecustomize ran', flush=True)\n").unwrap();
    let file = sb.scenario(
        "buffering",
        r#"{"command": ["python", "-c", "import sys; print('line_buffering', sys.stdout.line_buffering, 'write_through', sys.stdout.write_through)"],
            "expect": {"completes_when": {"stdout": "^line_buffering True write_through False$"}}}"#,
    );
    let path = std::ffi::OsString::from(&user);
    let run = sb.run_in_venv_with_env(&[&file], &[("PYTHONPATH", &path)]);
    assert_eq!(run.code(), 0, "line-buffered; stderr:\n{}", run.stderr());
    let out = std::fs::read_to_string(sb.out().join("1-buffering/rank0.stdout.log")).unwrap();
    assert!(out.starts_with("user sitecustomize ran\n"), "{out}");
    assert!(sb.out().join("python-site/sitecustomize.py").is_file(), "one copy for the run's scenarios");

    let theirs = Sandbox::new();
    let file = theirs.scenario(
        "buffering",
        r#"{"command": ["python", "-c", "import sys; print('line_buffering', sys.stdout.line_buffering, 'write_through', sys.stdout.write_through)"],
            "expect": {"completes_when": {"stdout": "^line_buffering True write_through False$"}}}"#,
    );
    let unobserved = theirs.scenario(
        "buffering-unobserved",
        r#"{"command": ["python", "-c", "import sys; print('line_buffering', sys.stdout.line_buffering, 'write_through', sys.stdout.write_through)"],
            "launch": {"observe": false},
            "expect": {"completes_when": {"stdout": "^line_buffering False write_through True$"}}}"#,
    );
    let run = theirs
        .run_in_venv_with_env(&[&file, &unobserved], &[("PYTHONUNBUFFERED", std::ffi::OsStr::new("1"))]);
    assert_eq!(run.code(), 0, "the user's unbuffered output, line-buffered; stderr:\n{}", run.stderr());
    // One copy for the run (the first scenario's observer needs it); the second scenario's
    // processes are not given it: their expectation, met above, is Python's own unbuffered output.
    assert!(theirs.out().join("python-site/sitecustomize.py").is_file(), "the observer's");
    assert!(!theirs.out().join("2-buffering-unobserved/python-site").exists());
}

#[test]
fn without_markers_output_decides_false_success_and_a_hang_is_looked_at_with_py_spy() {
    let sb = Sandbox::new();
    let plain = program("plain.py");
    let swallow = sb.scenario(
        "swallow",
        &format!(
            r#"{{"command": ["python", "{plain}", "--mode", "swallow"],
                "expect": {{"outcome": "false_success", "completes_when": {{"stdout": "^training finished"}}}}}}"#
        ),
    );
    let finish = sb.scenario(
        "finish",
        &format!(
            r#"{{"command": ["python", "{plain}", "--mode", "{{mode}}"], "params": {{"mode": "finish"}},
                "launch": {{"world_size": 2}}, "expect": {{"completes_when": {{"stdout": "^training finished"}}}}}}"#
        ),
    );
    let deadlock = sb.scenario(
        "deadlock",
        &format!(
            r#"{{"command": ["python", "{plain}", "--mode", "deadlock"],
                "limits": {{"hang_after_s": 4}}, "expect": {{"outcome": "hung"}}}}"#
        ),
    );
    let run = run(&sb, &[&swallow, &finish, &deadlock]);
    assert_eq!(run.code(), 0, "every expectation met; stderr:\n{}", run.stderr());
    let s = scenarios(&run);
    assert_eq!(s[0]["ranks"][0]["exit_code"], 0);
    assert_eq!(s[0]["verdict"]["pattern"], "false-success");
    assert_eq!(s[1]["outcome"], "passed");
    assert_eq!(s[1]["external"]["markers_seen"], false);
    let dumps = s[2]["ranks"][0]["dumps"].as_array().unwrap();
    assert_eq!(dumps.len(), 1);
    let py_spy = dumps[0]["py_spy"].as_str().unwrap_or_else(|| panic!("py-spy ran: {}", dumps[0]));
    assert!(py_spy.contains("plain.py:"), "the stack reaches the program's line:\n{py_spy}");
    let main = &dumps[0]["threads"][0];
    assert_eq!(main["syscall"].as_str().map(|s| s.contains("futex")), Some(true), "{main}");
    let md = report(&sb);
    assert!(md.contains("**markers were absent**"), "{md}");
    assert!(md.contains("### What rank 0 was doing when it was stopped"), "{md}");
}

#[test]
fn an_unknown_placeholder_is_bad_input_naming_file_field_and_fix() {
    let sb = Sandbox::new();
    let file = sb.scenario(
        "typo",
        "{\n  \"command\": [\"python\", \"train.py\", \"{wokers}\"],\n  \"params\": {\"workers\": 2}\n}",
    );
    let run = run(&sb, &[&file]);
    assert_eq!(run.code(), 2);
    let stderr = run.stderr();
    assert!(stderr.contains("typo.json:2:37: `command[2]`: unknown placeholder `{wokers}`"), "{stderr}");
    assert!(stderr.contains("did you mean `{workers}`?"), "{stderr}");
}

#[test]
fn a_program_not_on_path_fails_to_launch_with_the_fix() {
    let sb = Sandbox::new();
    let file = sb.scenario(
        "missing",
        r#"{"command": ["ups-doctor-no-such-python", "train.py"], "expect": {"outcome": "launch_failed"}}"#,
    );
    // A launcher that is not there: its ranks never started, and that is said first (not that
    // no rank process was identified below a launcher that never ran).
    let launcher = sb.scenario(
        "missing-launcher",
        r#"{"command": ["ups-doctor-no-such-launcher", "train.py"], "launch": {"world_size": 2, "style": "launcher"},
            "expect": {"outcome": "launch_failed"}}"#,
    );
    let run = run(&sb, &[&file, &launcher]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    let error = scenarios(&run)[0]["ranks"][0]["error"].as_str().unwrap().to_string();
    assert!(error.contains("not found on `PATH`"), "{error}");
    for r in scenarios(&run)[1]["ranks"].as_array().unwrap() {
        let error = r["error"].as_str().unwrap_or_default();
        assert!(
            error.starts_with("failed to start `ups-doctor-no-such-launcher`: not found on `PATH`"),
            "{r}"
        );
    }
}

#[test]
fn the_shipped_external_scenarios_meet_their_expectations() {
    let sb = Sandbox::new();
    let folder = repo().join("scenarios/external");
    let run = run(&sb, &[&folder]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    assert!(scenarios(&run).len() >= 3);
}

#[test]
fn bisect_over_params_finds_that_only_workers_with_pinned_memory_fail_and_is_one_minimal() {
    let sb = Sandbox::new();
    // The program sits next to the scenario and is named through `{scenario_dir}`, so the
    // probes (run from the bisect's folder) and minimal.json must all resolve it there.
    let dir = sb.path().join("scenarios");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(program("flaky_pin.py"), dir.join("flaky_pin.py")).unwrap();
    let helper = repo().join("python");
    let file = sb.scenario(
        "pin",
        &format!(
            r#"{{"command": ["python", "{{scenario_dir}}/flaky_pin.py", "--workers", "{{workers}}",
                             "--pin-memory", "{{pin_memory}}", "--depths", "{{depths}}", "--steps", "{{steps}}"],
                "params": {{"workers": 4, "pin_memory": true, "depths": [2, 2, 1], "steps": {{"value": 4, "min": 1}}}},
                {LIMITS},
                "expect": {{"outcome": "exited", "completes_when": {{"stdout": "^training finished"}}}}}}"#
        ),
    );
    let out = sb
        .cmd()
        .env("PATH", venv_path())
        .env("PYTHONPATH", &helper)
        .arg("bisect")
        .arg(&file)
        .arg("--out")
        .arg(sb.out())
        .args(["--json", "--quiet", "--cache"])
        .arg(sb.path().join("cache"))
        .output()
        .expect("ups-doctor starts");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let record: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    let found = crate::consistency::check_bisect_dir(&sb.out());
    assert!(found.is_empty(), "bisect.md contradicts bisect.json:\n{}", found.join("\n"));
    assert_eq!(record["signature"]["outcome"], "exited", "{record:#}");
    // 1-minimal: one worker, pinning on, everything else at its minimum...
    let params = &record["minimal"]["params"];
    assert_eq!(
        (&params["workers"], &params["pin_memory"], &params["depths"], &params["steps"]),
        (&Value::from(1), &Value::from(true), &serde_json::json!([2]), &Value::from(1)),
        "{record:#}"
    );
    // ...and cutting either of the two makes it pass.
    let boundary: Vec<&str> =
        record["boundary"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(boundary, ["params.pin_memory", "params.workers"], "{record:#}");
    let cuts: Vec<&str> =
        record["boundary_detail"].as_array().unwrap().iter().filter_map(|b| b["cut"].as_str()).collect();
    assert_eq!(cuts, ["params.pin_memory=false", "params.workers=0"]);
    assert!(record["runs"].as_u64().unwrap() <= 25, "{}", record["runs"]);

    // minimal.json, in the bisect's folder, reproduces the failure and meets its expect.
    let rerun = sb
        .cmd()
        .env("PATH", venv_path())
        .env("PYTHONPATH", &helper)
        .arg("run")
        .arg(sb.out().join("minimal.json"))
        .args(["--out"])
        .arg(sb.path().join("rerun"))
        .args(["--json", "--quiet"])
        .output()
        .unwrap();
    assert_eq!(rerun.status.code(), Some(0), "{}", String::from_utf8_lossy(&rerun.stderr));
}
