//! Rank discovery for the launchers people start DDP with, each the real package from the test
//! venv (PyTorch 2.11, CPU, gloo): torchrun, `python -m torch.distributed.run`,
//! `torch.multiprocessing.spawn`, Lightning's own launcher, `accelerate launch`, `deepspeed` and a
//! home-made `subprocess` launcher, all `launch.style: launcher` (srun: tests/slurm.rs). Per
//! launcher, one `ups-doctor run` of three scenarios: a 2-rank program that passes, the same with
//! rank 1 segfaulting at step 4, and the same with rank 1 skipping a gradient all-reduce (both
//! ranks hang). The program (tests/programs/launchers.py) sends no markers unless `--helper`:
//! ranks are judged from what any program leaves. Scenarios that name no `launch.style` must get
//! `launcher` from `auto`. The signals that stand in for a rank variable (spawn order, the
//! rendezvous port, the launcher as rank 0, the helper's markers) are tested with the observer off
//! (`launch.observe: false`, as for a program that never imports torch): with it on, the process
//! group each process formed names it (the last two tests).

use std::time::Duration;

use crate::util::{RunOutput, Sandbox, alive, children_of, eventually, repo, venv_path};
use serde_json::Value;

fn scenarios(run: &RunOutput) -> &Vec<Value> {
    run.result["scenarios"].as_array().unwrap_or_else(|| panic!("no result; stderr:\n{}", run.stderr()))
}

/// Runs the pass, crash and hang scenarios of one launcher; `command` is the argv before the
/// program's own arguments (JSON strings), `program_args` the mode of launchers.py.
fn three_cases(launcher: &str, command: &str, program_args: &str, style: &str) -> (Sandbox, RunOutput) {
    let sb = Sandbox::new();
    let program = repo().join("tests/programs/launchers.py").display().to_string();
    let scenario = |name: &str, extra: &str, expect: &str| {
        sb.scenario(
            &format!("{launcher}-{name}"),
            &format!(
                r#"{{"command": [{command}, "{program}", {program_args}, "--steps", "6"{extra}],
                    "launch": {{"world_size": 2{style}}},
                    "limits": {{"timeout_s": 300, "hang_after_s": 10}}, "expect": {expect}}}"#
            ),
        )
    };
    let pass = scenario("pass", "", r#"{"completes_when": {"stdout": "^training finished$"}}"#);
    let segv = scenario(
        "segv",
        r#", "--segv-rank", "1", "--segv-step", "4""#,
        r#"{"outcome": "signaled", "signal": "SIGSEGV", "rank": 1}"#,
    );
    let hang = scenario("hang", r#", "--hang-rank", "1", "--hang-step", "4""#, r#"{"outcome": "hung"}"#);
    let run = sb.run_in_venv(&[&pass, &segv, &hang]);
    (sb, run)
}

/// What the three scenarios must show, with `identified` the signal that found each rank.
fn check(run: &RunOutput, identified: [&str; 2]) {
    let summary: Vec<String> = scenarios(run)
        .iter()
        .map(|s| {
            // Short enough to survive a CI log's cuts: the headline, what was not met, and per
            // rank how it was found and how its end was read.
            let ranks: Vec<String> = (s["ranks"].as_array().into_iter().flatten())
                .map(|r| {
                    format!("{}:{}/{}/{}", r["rank"], r["identified_by"], r["outcome"], r["exit_source"])
                })
                .collect();
            format!(
                "{}: {} {} [{}]",
                s["name"],
                s["verdict"]["headline"],
                s["expectation_mismatches"],
                ranks.join(" ")
            )
        })
        .collect();
    assert_eq!(run.code(), 0, "every scenario meets its expectation:\n{}", summary.join("\n"));
    let [pass, segv, hang] = &scenarios(run)[..] else { panic!("three scenarios: {summary:?}") };
    for s in [pass, segv, hang] {
        assert_eq!(s["external"]["style"], "launcher");
        for (r, by) in s["ranks"].as_array().unwrap().iter().zip(identified) {
            assert_eq!(r["identified_by"], by, "{}: {r}", s["name"]);
            assert!(r["pid"].is_u64(), "{r}");
        }
    }
    assert_eq!(pass["outcome"], "passed", "{}", pass["verdict"]);
    for r in pass["ranks"].as_array().unwrap() {
        assert_eq!(r["outcome"], "passed", "{r}");
    }

    assert_eq!(segv["first_failure"], 1, "{}", segv["verdict"]);
    let r1 = &segv["ranks"][1];
    assert_eq!((r1["outcome"].as_str(), r1["signal"].as_str()), (Some("signaled"), Some("SIGSEGV")), "{r1}");
    let r0 = &segv["ranks"][0];
    assert_eq!(r0["collateral"], true, "{r0}");
    assert_ne!(r0["outcome"], "passed");
    let headline = segv["verdict"]["headline"].as_str().unwrap();
    assert!(
        headline.contains("Rank 1") && headline.contains("Rank 0 failed after it (collateral)"),
        "{headline}"
    );

    assert_eq!(hang["outcome"], "hung", "{}", hang["verdict"]);
    for r in hang["ranks"].as_array().unwrap() {
        assert_eq!(r["outcome"], "hung", "{r}");
        // Its last sign of life came before the silence of `hang_after_s` (10 s) that ended it,
        // not from the launcher's answer to the teardown (torchrun's traceback as it is stopped).
        if let (Some(last), Some(ended)) = (r["last_output_at_s"].as_f64(), r["ended_at_s"].as_f64()) {
            assert!(last < ended - 5.0, "rank {}: last output at {last} s, ended at {ended} s", r["rank"]);
        }
        let dumps = r["dumps"].as_array().unwrap();
        let own = dumps
            .iter()
            .find(|d| d["pid"] == r["pid"])
            .unwrap_or_else(|| panic!("rank {}'s own process was dumped: {dumps:#?}", r["rank"]));
        let stack = own["py_spy"].as_str().unwrap_or_else(|| panic!("py-spy read rank {}: {own}", r["rank"]));
        assert!(stack.contains("launchers.py"), "rank {}'s stack is in the program:\n{stack}", r["rank"]);
        // The other rank is not listed as this one's worker.
        let other = &hang["ranks"][1 - r["rank"].as_u64().unwrap() as usize]["pid"];
        assert!(dumps.iter().all(|d| &d["pid"] != other), "{dumps:#?}");
    }
}

#[test]
fn torchrun_ranks_are_found_by_rank() {
    let (_sb, run) =
        three_cases("torchrun", r#""torchrun", "--nproc_per_node", "2""#, r#""--launcher", "env""#, "");
    check(&run, ["RANK", "RANK"]);
}

#[test]
fn python_m_torch_distributed_run_ranks_are_found_by_rank() {
    let command = r#""python", "-m", "torch.distributed.run", "--nproc_per_node", "2""#;
    let (_sb, run) = three_cases("distributed-run", command, r#""--launcher", "env""#, "");
    check(&run, ["RANK", "RANK"]);
    let chosen = scenarios(&run)[0]["external"]["style_chosen"].as_str().unwrap_or_default();
    assert!(chosen.contains("`python -m torch.distributed.run` is torchrun"), "{chosen}");
}

/// `mp.spawn` ranks that import the helper, each reading through a DataLoader with two forked
/// workers: the helper's markers name each rank (after `init_process_group`, from
/// `torch.distributed.get_rank()`), confirming the spawn order found first; the workers, in the
/// launcher's process group like the ranks, are each rank's own.
#[test]
fn spawned_ranks_that_import_the_helper_are_found_by_its_markers_with_their_workers() {
    let (sb, run) = three_cases(
        "spawn-helper",
        r#""python""#,
        r#""--launcher", "spawn", "--helper", "--workers", "2""#,
        r#", "observe": false"#,
    );
    check(&run, ["markers", "markers"]);
    let [pass, _, hang] = &scenarios(&run)[..] else { unreachable!() };
    for r in pass["ranks"].as_array().unwrap() {
        assert_eq!(r["steps_done"], 6, "every step came through the helper: {r}");
        assert_eq!(r["workers"].as_array().map(Vec::len), Some(2), "{r}");
    }
    for r in hang["ranks"].as_array().unwrap() {
        let dumps = r["dumps"].as_array().unwrap();
        let workers: Vec<&Value> = dumps.iter().filter(|d| d["role"] == "child").collect();
        assert!(
            workers.len() >= 2,
            "rank {}'s DataLoader workers were dumped with it: {dumps:#?}",
            r["rank"]
        );
        assert!(
            dumps.iter().all(|d| d["rank"] == r["rank"]),
            "every dump is rank {}'s: {dumps:#?}",
            r["rank"]
        );
    }
    let md = sb.reports();
    assert!(
        md.contains("Ranks identified: rank 0 by the helper's markers (the process reported rank 0); rank 1 by the helper's markers (the process reported rank 1)."),
        "{md}"
    );
}

/// A home-made launcher (`subprocess`, the rank only an argument) whose ranks meet at
/// ups-doctor's port: the process listening on it is rank 0, the other one connected to it rank 1.
#[test]
fn a_home_made_launchers_ranks_are_found_by_the_rendezvous_port() {
    let (sb, run) = three_cases(
        "popen",
        r#""python""#,
        r#""--launcher", "popen""#,
        r#", "style": "launcher", "observe": false"#,
    );
    check(&run, ["rendezvous_port_listens", "rendezvous_port_connected"]);
    let md = sb.reports();
    assert!(md.contains("rank 0 by the rendezvous port (the process listens on it: the c10d store)"), "{md}");
}

#[test]
fn torch_multiprocessing_spawn_ranks_are_found_by_spawn_order() {
    let (sb, run) = three_cases(
        "spawn",
        r#""python""#,
        r#""--launcher", "spawn", "--port-from", "own""#,
        r#", "observe": false"#,
    );
    check(&run, ["spawn_order", "spawn_order"]);
    let chosen = scenarios(&run)[0]["external"]["style_chosen"].as_str().unwrap_or_default();
    assert!(chosen.contains("it calls `torch.multiprocessing.spawn`"), "{chosen}");
    let md = sb.reports();
    assert!(
        md.contains("Command (launcher, chosen by `launch.style: auto`: `launchers.py` starts its own ranks"),
        "{md}"
    );
    assert!(
        md.contains("Ranks identified: rank 0 by spawn order (the launcher's child started first)"),
        "{md}"
    );
}

/// Ranks forked by `torch.multiprocessing.start_processes(…, start_method="fork")`: each is a
/// fork of the launcher, its command line the launcher's, its rank only an argument. `auto`
/// takes the script for a launcher (it calls `start_processes`), and the observer names each
/// forked rank by the process group it forms; before, `auto` ran it as one rank and the
/// launcher's `ProcessExitedException` was reported as rank 0's own exit.
#[test]
fn ranks_forked_by_start_processes_are_found_by_the_process_group_each_forms() {
    let (sb, run) = three_cases("fork", r#""python""#, r#""--launcher", "fork""#, "");
    check(&run, ["process_group", "process_group"]);
    let s = &scenarios(&run)[0];
    let chosen = s["external"]["style_chosen"].as_str().unwrap_or_default();
    assert!(chosen.contains("`launchers.py` starts its own ranks"), "{chosen}");
    for r in s["ranks"].as_array().unwrap() {
        assert_ne!(r["pid"], s["external"]["launcher"]["pid"], "a forked rank is not the launcher: {r}");
    }
    let md = sb.reports();
    assert!(
        md.contains("Ranks identified: rank 0 by the process group it formed (`init_process_group` gave it rank 0, seen by the observer); rank 1 by the process group it formed"),
        "{md}"
    );
}

#[test]
fn lightnings_rank_0_is_the_launcher_and_rank_1_its_local_rank_child() {
    let (sb, run) =
        three_cases("lightning", r#""python""#, r#""--launcher", "lightning""#, r#", "observe": false"#);
    check(&run, ["launcher_process", "LOCAL_RANK"]);
    let pass = &scenarios(&run)[0];
    assert_eq!(pass["ranks"][0]["pid"], pass["external"]["launcher"]["pid"]);
    let md = sb.reports();
    assert!(
        md.contains("Ranks identified: rank 0 is the launcher process itself; rank 1 by `LOCAL_RANK=1`."),
        "{md}"
    );
}

#[test]
fn accelerate_launch_ranks_are_found_by_rank_below_its_torchrun() {
    let command = r#""accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "{master_port}""#;
    let (_sb, run) = three_cases("accelerate", command, r#""--launcher", "env""#, r#", "style": "launcher""#);
    check(&run, ["RANK", "RANK"]);
}

#[test]
fn deepspeeds_launcher_ranks_are_found_by_rank() {
    let command = r#""deepspeed", "--num_gpus", "2", "--master_port", "{master_port}""#;
    let (_sb, run) = three_cases("deepspeed", command, r#""--launcher", "env""#, r#", "style": "launcher""#);
    check(&run, ["RANK", "RANK"]);
}

/// A launcher whose children carry no rank signal: two plain processes below it. With the
/// launcher's status 0 the ranks pass on it (never `launch_failed`) and the report says their
/// processes were not identified; with status 3 the launcher's exit is the failure, still not a
/// failed launch: the processes ran, and exited 0.
#[test]
fn ranks_no_signal_identifies_are_judged_by_the_launchers_exit_status() {
    let sb = Sandbox::new();
    let scenario = |name: &str, status: u32| {
        sb.scenario(
            name,
            &format!(
                r#"{{"command": ["sh", "-c", "sleep 2 & sleep 2 & wait; exit {status}"],
                    "launch": {{"world_size": 2, "style": "launcher"}},
                    "limits": {{"timeout_s": 120, "hang_after_s": 60}}}}"#
            ),
        )
    };
    let clean = scenario("unidentified-clean", 0);
    let failed = scenario("unidentified-failed", 3);
    let run = sb.run(&[&clean, &failed], &[]);
    let [clean, failed] = &scenarios(&run)[..] else { panic!("two scenarios: {}", run.stderr()) };
    assert_eq!(clean["outcome"], "passed", "{}", clean["verdict"]);
    for r in clean["ranks"].as_array().unwrap() {
        assert_eq!(r["outcome"], "passed", "{r}");
        assert!(r["identified_by"].is_null(), "{r}");
        assert_eq!(r["exit_source"], "not_identified", "{r}");
    }
    assert_eq!(clean["external"]["launcher"]["unidentified_processes"], 2, "{}", clean["external"]);
    assert_eq!(
        (failed["outcome"].as_str(), failed["ranks"][0]["exit_code"].as_u64()),
        (Some("exited"), Some(3)),
        "{}",
        failed["verdict"]
    );
    for r in failed["ranks"].as_array().unwrap() {
        assert_ne!(r["outcome"], "launch_failed", "{r}");
        assert_eq!(r["exit_source"], "launcher_status", "{r}");
    }
    let launcher = &failed["external"]["launcher"];
    assert_eq!(
        (launcher["unidentified_processes"].as_u64(), launcher["exit_code"].as_u64()),
        (Some(2), Some(3)),
        "{launcher}"
    );
    let evidence = failed["verdict"]["evidence"].to_string();
    assert!(
        evidence.contains("2 processes below the launcher look like ranks; their rank numbers are unknown; the launcher exited with status 3"),
        "{evidence}"
    );
    let md = sb.reports();
    assert!(
        md.contains("Ranks identified: rank 0: no process identified; rank 1: no process identified. 2 processes below the launcher look like ranks; their rank numbers are unknown."),
        "{md}"
    );
}

/// A launcher with a rank 0 (by `RANK`) and a child no signal identifies, silent until the hang
/// is declared: the child ups-doctor's teardown ends is no rank that failed by itself. (Ray's driver
/// with its daemons as children: a daemon killed in the teardown of a hang was taken for rank 1,
/// "killed by SIGKILL", the culprit of a run where no rank was seen to fail.)
#[test]
fn children_of_a_launcher_that_its_teardown_ended_are_no_ranks_that_failed() {
    let sb = Sandbox::new();
    let hung = sb.scenario(
        "unidentified-hung",
        r#"{"command": ["sh", "-c", "RANK=0 sleep 600 & sleep 600 & wait"],
            "launch": {"world_size": 2, "style": "launcher", "observe": false},
            "limits": {"timeout_s": 300, "hang_after_s": 5}}"#,
    );
    let run = sb.run(&[&hung], &[]);
    let [hung] = &scenarios(&run)[..] else { panic!("one scenario: {}", run.stderr()) };
    assert_eq!(hung["outcome"], "hung", "{}", hung["verdict"]);
    assert_eq!(hung["external"]["launcher"]["unidentified_processes"], 1, "{}", hung["external"]);
    assert_eq!(hung["ranks"][0]["identified_by"], "RANK", "{}", hung["ranks"][0]);
    let unfound = &hung["ranks"][1];
    assert_ne!(unfound["exit_source"], "procfs_rank_unknown", "{unfound}");
    assert!(unfound["pid"].is_null(), "{unfound}");
    let headline = hung["verdict"]["headline"].as_str().unwrap_or_default();
    assert!(!headline.contains("SIGKILL") && !headline.contains("SIGTERM"), "{headline}");
}

/// A home-made launcher whose ranks meet at a port of their own (nothing outside knows it), the
/// observer off: no signal gives a rank number. Rank 1 segfaulting at step 4 makes the launcher SIGTERM the other
/// and exit 1: the processes are judged as processes, the one killed by SIGSEGV first, named by
/// its pid and not by a rank number nobody knows; a clean run passes on the launcher's status.
#[test]
fn processes_whose_rank_is_unknown_are_judged_by_what_they_did() {
    let sb = Sandbox::new();
    let program = repo().join("tests/programs/launchers.py").display().to_string();
    let scenario = |name: &str, extra: &str, expect: &str| {
        sb.scenario(
            name,
            &format!(
                r#"{{"command": ["python", "{program}", "--launcher", "popen", "--port-from", "own", "--steps", "6"{extra}],
                    "launch": {{"world_size": 2, "style": "launcher", "observe": false}},
                    "limits": {{"timeout_s": 300, "hang_after_s": 30}}, "expect": {expect}}}"#
            ),
        )
    };
    let pass = scenario("unknown-pass", "", r#"{"completes_when": {"stdout": "^training finished$"}}"#);
    let segv = scenario(
        "unknown-segv",
        r#", "--segv-rank", "1", "--segv-step", "4""#,
        r#"{"outcome": "signaled", "signal": "SIGSEGV"}"#,
    );
    let run = sb.run_in_venv(&[&pass, &segv]);
    let summary: Vec<String> =
        scenarios(&run).iter().map(|s| format!("{}: {} {}", s["name"], s["verdict"], s["ranks"])).collect();
    assert_eq!(run.code(), 0, "every scenario meets its expectation:\n{}", summary.join("\n"));
    let [pass, segv] = &scenarios(&run)[..] else { panic!("two scenarios") };
    for r in pass["ranks"].as_array().unwrap() {
        assert_eq!((r["outcome"].as_str(), r["identified_by"].as_str()), (Some("passed"), None), "{r}");
    }
    let first = segv["first_failure"].as_u64().unwrap() as usize;
    let culprit = &segv["ranks"][first];
    assert_eq!(culprit["signal"], "SIGSEGV", "{culprit}");
    assert_eq!(culprit["exit_source"], "procfs_rank_unknown", "{culprit}");
    let pid = culprit["pid"].as_u64().unwrap();
    let headline = segv["verdict"]["headline"].as_str().unwrap();
    assert!(
        headline.starts_with(&format!(
            "The process {pid} below the launcher (rank number unknown) was killed by SIGSEGV"
        )),
        "{headline}"
    );
    let other = &segv["ranks"][1 - first];
    assert_eq!(other["collateral"], true, "{other}");
    assert!(headline.contains("failed after it (collateral)"), "{headline}");
    for r in segv["ranks"].as_array().unwrap() {
        assert_ne!(r["outcome"], "launch_failed", "{r}");
        assert!(r["identified_by"].is_null(), "{r}");
    }
    let md = sb.reports();
    assert!(
        md.contains("2 processes below the launcher look like ranks; their rank numbers are unknown."),
        "{md}"
    );
}

/// The launchers no outside signal can read (a home-made one whose ranks meet at their own port,
/// `mp.spawn`), with the observer on as by default: each process is the rank its
/// `init_process_group` formed, so the segfaulting rank is named by number, not by pid.
#[test]
fn the_observer_names_ranks_by_the_process_group_they_formed() {
    let (sb, run) = three_cases(
        "observed-popen",
        r#""python""#,
        r#""--launcher", "popen", "--port-from", "own""#,
        r#", "style": "launcher""#,
    );
    check(&run, ["process_group", "process_group"]);
    let md = sb.reports();
    assert!(
        md.contains("Ranks identified: rank 0 by the process group it formed (`init_process_group` gave it rank 0, seen by the observer); rank 1 by the process group it formed"),
        "{md}"
    );
    let (_sb, run) =
        three_cases("observed-spawn", r#""python""#, r#""--launcher", "spawn", "--port-from", "own""#, "");
    check(&run, ["process_group", "process_group"]);
}

/// Resumes a stopped process when dropped, so that a failing test never leaves ups-doctor frozen.
struct Stopped(u32);

impl Stopped {
    fn stop(pid: u32) -> Stopped {
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::SIGSTOP).expect("ups-doctor is ours to stop");
        Stopped(pid.as_raw() as u32)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0 as i32), nix::sys::signal::SIGCONT);
    }
}

/// `torch.multiprocessing.spawn` reaps a process the moment it ends, so on a busy machine
/// ups-doctor can find the rank already gone, its status unread (seen once in CI: "Rank 1 exited
/// with an unobserved status" for a segfault). Made certain here from outside: ups-doctor is
/// frozen (SIGSTOP) while rank 1 segfaults and the launcher reaps it, tears rank 0 down and exits;
/// after SIGCONT the status is spawn's own account of it.
#[test]
fn a_rank_mp_spawn_reaped_before_ups_doctor_looked_ends_as_spawns_exception_says() {
    let sb = Sandbox::new();
    let program = repo().join("tests/programs/launchers.py").display().to_string();
    let wait = sb.path().join("segv");
    let scenario = sb.scenario(
        "reaped",
        &format!(
            r#"{{"command": ["python", "{program}", "--launcher", "spawn", "--port-from", "own", "--steps", "6",
                             "--segv-rank", "1", "--segv-step", "4", "--segv-wait", "{}"],
                "launch": {{"world_size": 2}},
                "limits": {{"timeout_s": 300, "hang_after_s": 120}},
                "expect": {{"outcome": "signaled", "signal": "SIGSEGV", "rank": 1}}}}"#,
            wait.display()
        ),
    );
    let out = sb.out();
    let mut cmd = sb.cmd();
    cmd.env("PATH", venv_path()).arg("run").arg(&scenario).arg("--out").arg(&out).args(["--json", "--quiet"]);
    let child =
        cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let doctor = child.id();
    let waiting = wait.with_extension("waiting");
    assert!(eventually(Duration::from_secs(240), || waiting.exists()), "rank 1 reached its segfault");
    let launcher = children_of(doctor)
        .into_iter()
        .find(|&p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.windows(12).any(|w| w == b"launchers.py"))
        })
        .expect("the launcher is ups-doctor's child");
    let frozen = Stopped::stop(doctor);
    std::fs::write(wait.with_extension("go"), b"").unwrap();
    // spawn reaps rank 1, tears rank 0 down and raises; the launcher then ends (a zombie of
    // ups-doctor's, which cannot reap it while frozen).
    assert!(
        eventually(Duration::from_secs(240), || !alive(launcher as u64)),
        "the launcher ended while ups-doctor was frozen"
    );
    drop(frozen);
    let output = child.wait_with_output().unwrap();
    let run = RunOutput { result: serde_json::from_slice(&output.stdout).unwrap_or(Value::Null), output };
    let found = crate::consistency::check_run_dir(&out);
    assert!(found.is_empty(), "the report contradicts its result.json:\n{}", found.join("\n"));
    let s = &scenarios(&run)[0];
    assert_eq!(run.code(), 0, "the expectation is met: {}", s["verdict"]["headline"]);
    let rank1 = &s["ranks"][1];
    assert_eq!(
        (&rank1["outcome"], &rank1["signal"]),
        (&Value::from("signaled"), &Value::from("SIGSEGV")),
        "{rank1}"
    );
    assert_eq!(rank1["exit_source"], "spawn", "{rank1}");
    assert_eq!(rank1["identified_by"], "process_group", "{rank1}");
    let headline = s["verdict"]["headline"].as_str().unwrap();
    assert!(headline.starts_with("Rank 1 was killed by SIGSEGV"), "{headline}");
    let md = sb.reports();
    assert!(md.contains("rank 1's exit status is the one `torch.multiprocessing.spawn` gives"), "{md}");
    assert!(md.contains("ProcessExitedException: process 1 terminated with signal SIGSEGV"), "{md}");
}

/// The same rank's exception where the launcher never prints spawn's `ProcessRaisedException`
/// (here it exits 1 quietly; in the accuracy matrix Lightning's `ddp_spawn` launcher was torn
/// down before it raised, under load): the rank's own words come from the rank itself, its
/// observer reading them in spawn's wrapper, not from the launcher's output.
#[test]
fn a_ranks_exception_in_mp_spawn_is_its_own_error_when_the_launcher_never_prints_it() {
    let (s, error) = raised_in_spawn(&["--quiet-launcher"], "");
    assert_eq!(s["ranks"][1]["error"], error.as_str(), "{}", s["ranks"][1]);
    let headline = s["verdict"]["headline"].as_str().unwrap();
    assert!(headline.starts_with("Rank 1 exited with "), "{headline}");
    assert!(headline.contains("ValueError: bad shard on rank 1"), "{headline}");
}

/// `torch.multiprocessing.spawn`'s wrapper catches a rank's exception in the child (no
/// `sys.excepthook` sees it), relays the traceback to the launcher, which prints it in its
/// `ProcessRaisedException`, and reaps the process at once. The rank's error is that relayed
/// traceback's: the exception and the program's own line, not "an unobserved status" alone.
#[test]
fn a_ranks_exception_relayed_by_mp_spawn_is_that_ranks_error_with_the_programs_line() {
    let expect =
        r#", "expect": {"outcome": "exited", "rank": 1, "message": "ValueError: bad shard on rank 1"}"#;
    let (s, error) = raised_in_spawn(&[], expect);
    assert_eq!(s["ranks"][1]["error"], error.as_str(), "{}", s["ranks"][1]);
    let headline = s["verdict"]["headline"].as_str().unwrap();
    assert!(headline.starts_with("Rank 1 exited with "), "{headline}");
    assert!(headline.contains("ValueError: bad shard on rank 1"), "{headline}");
    let at = error.split_once(" (").map(|(_, at)| at.trim_end_matches(')')).unwrap();
    assert!(headline.contains(at), "{headline}");
    assert_eq!(s["ranks"][0]["collateral"], true, "{}", s["ranks"][0]);
}

/// `launchers.py --launcher spawn` whose rank 1 raises `ValueError` at step 3, with `extra`
/// arguments and `expect` (a scenario's `, "expect": …` or nothing; when given, it must be met):
/// the scenario's result, and the rank's error as its own words give it, at the program's line.
fn raised_in_spawn(extra: &[&str], expect: &str) -> (Value, String) {
    let sb = Sandbox::new();
    let path = repo().join("tests/programs/launchers.py");
    let program = path.display().to_string();
    let extra: String = extra.iter().map(|a| format!(", \"{a}\"")).collect();
    let scenario = sb.scenario(
        "raised",
        &format!(
            r#"{{"command": ["python", "{program}", "--launcher", "spawn", "--port-from", "own", "--steps", "6",
                             "--raise-rank", "1", "--raise-step", "3"{extra}],
                "launch": {{"world_size": 2}},
                "limits": {{"timeout_s": 300, "hang_after_s": 120}}{expect}}}"#
        ),
    );
    let run = sb.run_in_venv(&[&scenario]);
    let s = scenarios(&run)[0].clone();
    if !expect.is_empty() {
        assert_eq!(run.code(), 0, "the expectation is met: {}", s["verdict"]);
    }
    let source = std::fs::read_to_string(&path).unwrap();
    let line = source.lines().position(|l| l.contains("raise ValueError(f\"bad shard")).unwrap() + 1;
    (s, format!("ValueError: bad shard on rank 1 (launchers.py:{line} in faults)"))
}

/// A script that starts its ranks itself by means `auto` cannot read in its source (a library's
/// helper, here a named `per_rank` style standing in for it) runs as one rank whose process is
/// really the launcher: what its processes did reaches ups-doctor only through its own output
/// (`process 1 terminated with signal SIGSEGV`), and before, rank 0 was named for rank 1's
/// crash. The observer in the watched process says it starts processes of its own, and the verdict
/// names no rank first, says what was seen and why, and how to watch each.
#[test]
fn a_per_rank_process_that_starts_the_ranks_itself_is_named_a_launcher_and_no_rank_is_blamed() {
    let sb = Sandbox::new();
    let program = repo().join("tests/programs/launchers.py").display().to_string();
    let scenario = sb.scenario(
        "own-ranks",
        &format!(
            r#"{{"command": ["python", "{program}", "--launcher", "spawn", "--port-from", "own", "--steps", "6",
                             "--segv-rank", "1", "--segv-step", "3"],
                "launch": {{"world_size": 1, "style": "per_rank"}},
                "limits": {{"timeout_s": 300, "hang_after_s": 120}}}}"#
        ),
    );
    let run = sb.run_in_venv(&[&scenario]);
    let s = &scenarios(&run)[0];
    let started = &s["ranks"][0]["observed"]["started"];
    assert_eq!(
        (&started["nprocs"], &started["start_method"]),
        (&Value::from(2), &Value::from("spawn")),
        "{s}"
    );
    assert!(s["first_failure"].is_null(), "no rank is named first: {}", s["first_failure"]);
    let verdict = &s["verdict"];
    let headline = verdict["headline"].as_str().unwrap();
    assert!(
        headline.starts_with(
            "Which rank failed first cannot be told: rank 0's process started 2 processes of its own \
             (torch.multiprocessing, `spawn`): it was a launcher"
        ),
        "{headline}"
    );
    assert!(verdict["next_step"].as_str().unwrap().contains("--style launcher"), "{verdict}");
}

/// A program that starts its own ranks (Lightning's launcher: `devices=2`), run as one copy with
/// torchrun's variables (style `per_rank`, as `auto` takes a command it finds no launcher in:
/// litgpt's CLI, 2026-12-07, before `auto` read a subcommand's module): Lightning takes
/// `LOCAL_RANK` for a launcher's, starts no rank 1, and rank 0 waits for it in
/// `init_process_group`. The hang is ups-doctor's doing, and the verdict says so, names nobody
/// and gives the style that runs it; with that style the same command passes.
#[test]
fn a_program_that_starts_its_own_ranks_run_as_copies_is_said_to_hang_by_ups_doctors_doing() {
    let sb = Sandbox::new();
    let program = repo().join("tests/programs/launchers.py").display().to_string();
    let scenario = |name: &str, style: &str| {
        sb.scenario(
            name,
            &format!(
                r#"{{"command": ["python", "{program}", "--launcher", "lightning", "--steps", "4"],
                    "launch": {{"world_size": 1, "style": "{style}"}},
                    "limits": {{"timeout_s": 300, "hang_after_s": 30}}}}"#
            ),
        )
    };
    let copies = scenario("copies", "per_rank");
    let launcher = scenario("launcher", "launcher");
    let run = sb.run_in_venv(&[&copies, &launcher]);
    let s = &scenarios(&run)[0];
    assert_eq!(s["outcome"], "hung", "{s}");
    assert_eq!(s["ranks"][0]["observed"]["joining_world_size"], 2, "{s}");
    assert!(s["first_failure"].is_null(), "no rank is named first: {}", s["first_failure"]);
    let verdict = &s["verdict"];
    let headline = verdict["headline"].as_str().unwrap();
    assert!(
        headline.starts_with(
            "The rendezvous never completed because of how ups-doctor ran `python`: it started one copy itself"
        ),
        "{headline}"
    );
    assert!(verdict["likely_cause"].as_str().unwrap().contains("named the style `per_rank`"), "{verdict}");
    assert!(verdict["next_step"].as_str().unwrap().contains("--style launcher"), "{verdict}");
    assert_eq!(scenarios(&run)[1]["outcome"], "passed", "{}", scenarios(&run)[1]);
}
