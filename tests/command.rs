//! `ups-doctor run [OPTIONS] -- PROGRAM [ARGS…]`: a user's command as it is, no scenario file.
//! Real torchrun and PyTorch (CPU, gloo) from the test venv; the program is
//! `tests/programs/cmd_ddp.py`.

use std::path::Path;

use crate::util::{RunOutput, Sandbox, repo, venv_path};
use serde_json::Value;

fn program() -> String {
    repo().join("tests/programs/cmd_ddp.py").display().to_string()
}

/// `ups-doctor run --json --quiet ARGS…` in `sb`, with the venv's torchrun and python first.
fn run(sb: &Sandbox, args: &[&str]) -> RunOutput {
    let mut cmd = sb.cmd();
    cmd.env("PATH", venv_path());
    sb.run_with(cmd, &[], args)
}

#[test]
fn a_torchrun_command_passes_with_its_env_and_cwd_on_every_rank_and_its_scenario_json_reruns_it() {
    let sb = Sandbox::new();
    let work = sb.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let prog = program();
    let out = run(
        &sb,
        &[
            "--env",
            "CMD_TEST_VAR=from-the-flag",
            "--cwd",
            "work",
            "--expect-output",
            "^training finished",
            "--",
            "torchrun",
            "--nproc_per_node",
            "2",
            &prog,
        ],
    );
    assert_eq!(out.code(), 0, "{}\n{}", out.stderr(), out.scenario());
    let s = out.scenario();
    assert_eq!(s["outcome"], "passed", "{s}");
    assert_eq!(s["ranks"].as_array().unwrap().len(), 2, "the rank count comes from --nproc_per_node: {s}");
    for rank in 0..2 {
        let file = work.join(format!("wrote-rank{rank}.txt"));
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert_eq!(text, "from-the-flag", "rank {rank} saw --env");
        assert!(!sb.path().join(format!("wrote-rank{rank}.txt")).exists(), "not in ups-doctor's folder");
    }
    // The report names the command as typed.
    let report = std::fs::read_to_string(sb.out().join("report.md")).unwrap();
    assert!(report.contains("torchrun --nproc_per_node 2"), "{report}");
    // The run folder's scenario.json is the command as a scenario file, and re-runs it.
    let file = sb.out().join("scenario.json");
    let saved: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(saved["launch"]["env"]["CMD_TEST_VAR"], "from-the-flag", "{saved}");
    assert_eq!(saved["expect"]["completes_when"]["output"], "^training finished", "{saved}");
    for rank in 0..2 {
        std::fs::remove_file(work.join(format!("wrote-rank{rank}.txt"))).unwrap();
    }
    let again = Sandbox::new();
    let mut cmd = again.cmd();
    cmd.env("PATH", venv_path());
    let rerun = again.run_with(cmd, &[Path::new(&file)], &[]);
    assert_eq!(rerun.code(), 0, "{}", rerun.stderr());
    assert_eq!(rerun.scenario()["outcome"], "passed");
    assert!(work.join("wrote-rank1.txt").exists(), "the re-run ran in the same --cwd");
}

/// The end-of-run line is on stderr: it satisfies `--expect-output`, and a line the program never
/// prints makes the same exit 0 a false success.
#[test]
fn expect_output_reads_stderr_and_a_line_never_printed_is_a_false_success_under_python_m() {
    let prog = program();
    for (pattern, outcome, code) in
        [("finished: all-reduce", "passed", 0), ("^never printed$", "false_success", 1)]
    {
        let sb = Sandbox::new();
        let out = run(
            &sb,
            &[
                "--expect-output",
                pattern,
                "--",
                "python",
                "-m",
                "torch.distributed.run",
                "--nproc-per-node=2",
                &prog,
            ],
        );
        assert_eq!(out.code(), code, "{pattern}: {}", out.stderr());
        assert_eq!(out.scenario()["outcome"], outcome, "{pattern}: {}", out.scenario());
        assert_eq!(out.scenario()["ranks"].as_array().unwrap().len(), 2);
    }
}

#[test]
fn a_command_that_cannot_run_is_bad_input_naming_what_to_change_and_nothing_runs() {
    let sb = Sandbox::new();
    std::fs::write(sb.path().join("x.json"), "{}").unwrap();
    for (args, says) in [
        (vec!["--"], "`--` is followed by no program"),
        (vec!["x.json", "--", "true"], "both scenario files (`x.json`) and a command"),
        (
            vec!["--ranks", "4", "--", "torchrun", "--nproc_per_node", "2", "t.py"],
            "`--ranks 4` contradicts the command's own `--nproc_per_node 2` (2 ranks)",
        ),
        (vec!["--", "no-such-program-here", "--x"], "`no-such-program-here` is not a program on PATH"),
        (vec!["--env", "NOVALUE", "--", "true"], "`--env NOVALUE` has no `=`"),
        (vec!["--cwd", "missing-folder", "--", "true"], "`--cwd missing-folder` is not a folder"),
    ] {
        let mut cmd = sb.cmd();
        cmd.env("PATH", venv_path());
        let out = cmd.arg("run").arg("--out").arg(sb.out()).args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says) && stderr.contains("hint:"), "{args:?}: {stderr}");
        assert!(!sb.out().join("result.json").exists(), "{args:?}: nothing ran");
    }
}

/// Where the test venv's `accelerate` package is installed.
fn accelerate_dir() -> std::path::PathBuf {
    let out = std::process::Command::new(crate::util::venv_python())
        .args(["-c", "import accelerate, os; print(os.path.dirname(accelerate.__file__))"])
        .output()
        .expect("the venv's python runs");
    assert!(
        out.status.success(),
        "accelerate is not installed in the test venv: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Accelerate's own test script, shipped inside the package (`accelerate/test_utils/scripts/
/// test_ops.py`: gather, broadcast, pad and reduce across processes, each result asserted), as it
/// is, under `run -- torchrun`: it passes, both ranks named by `RANK` and their gloo group seen by
/// the observer. Then with rank 1's first `all_gather` skipped from outside the program (a
/// `sitecustomize` on `PYTHONPATH`): rank 1's own assertion fails first, and rank 0 is collateral.
#[test]
fn accelerates_own_test_script_passes_as_it_is_and_the_rank_that_skipped_a_gather_is_named() {
    let script = accelerate_dir().join("test_utils/scripts/test_ops.py").display().to_string();
    let argv = ["--", "torchrun", "--nproc_per_node", "2", script.as_str()];
    let sb = Sandbox::new();
    let out = run(&sb, &argv);
    let s = out.scenario();
    assert_eq!(
        (out.code(), s["outcome"].as_str()),
        (0, Some("passed")),
        "{}\n{:#}",
        out.stderr(),
        s["verdict"]
    );
    for (rank, r) in s["ranks"].as_array().unwrap().iter().enumerate() {
        assert_eq!(r["identified_by"], "RANK", "{r}");
        assert_eq!(r["observed"]["group"]["backend"], "gloo", "{r}");
        assert_eq!(r["observed"]["group"]["rank"], rank, "{r}");
    }

    let sb = Sandbox::new();
    let mut cmd = sb.cmd();
    cmd.env("PATH", venv_path())
        .env("PYTHONPATH", repo().join("tests/programs/inject"))
        .env("INJECT_SKIP_RANK", "1")
        .env("INJECT_SKIP_CALL", "1");
    let out = sb.run_with(cmd, &[], &argv);
    let s = out.scenario();
    assert_eq!(s["first_failure"], 1, "{:#}", s["verdict"]);
    assert_eq!(s["ranks"][0]["collateral"], true, "{:#}", s["ranks"][0]);
    // Rank 1 exits with status 1, or (under load) is still exiting when torchrun, seeing rank 0's
    // lost peer first, sends it SIGTERM: its own AssertionError is named either way.
    let headline = s["verdict"]["headline"].as_str().unwrap();
    assert!(
        headline.starts_with("Rank 1 exited with status 1: AssertionError")
            || headline.starts_with(
                "Rank 1 failed: AssertionError; `torchrun` then ended it with SIGTERM while it was exiting."
            ),
        "{headline}"
    );
    assert!(headline.contains("Rank 0 failed after it (collateral)"), "{headline}");
}

/// Accelerate's own test script with rank 1 made, from outside, to compute without a word before
/// its first `all_gather` until the run's time limit (`INJECT_BUSY_*`: matrix products, as a
/// rank spinning in a wait or stuck in a long computation does) while rank 0 waits in the
/// gather. Never called hung (CPU was being used), the run ends at its time limit: the verdict
/// does not say it "kept making progress", but that rank 1 went silent while using CPU and rank
/// 0 waited, and names rank 1 from the stacks as the rank outside any collective.
#[test]
fn a_rank_silent_but_busy_until_the_time_limit_is_named_with_its_cpu_not_as_slow_progress() {
    let script = accelerate_dir().join("test_utils/scripts/test_ops.py").display().to_string();
    let sb = Sandbox::new();
    let mut cmd = sb.cmd();
    cmd.env("PATH", venv_path())
        .env("PYTHONPATH", repo().join("tests/programs/inject"))
        .env("INJECT_BUSY_RANK", "1")
        .env("INJECT_BUSY_S", "3600")
        .env("INJECT_BUSY_CALL", "1");
    let argv = ["--hang-after", "10", "--timeout", "60", "--", "torchrun", "--nproc_per_node", "2", &script];
    let out = sb.run_with(cmd, &[], &argv);
    let s = out.scenario();
    let v = &s["verdict"];
    assert_eq!((s["outcome"].as_str(), s["first_failure"].as_u64()), (Some("timed_out"), Some(1)), "{v:#}");
    let share = |r: &Value| {
        let cpu = &r["silent_cpu"];
        cpu["cpu_s"].as_f64().zip(cpu["silent_s"].as_f64()).map(|(c, w)| c / w)
    };
    let (r0, r1) = (&s["ranks"][0], &s["ranks"][1]);
    assert!(share(r1).is_some_and(|x| x >= 0.25), "rank 1 computed: {r1:#}");
    assert!(share(r0).is_some_and(|x| x < 0.05), "rank 0 waited: {r0:#}");
    assert_eq!(v["pattern"], "ranks-out-of-step", "{v:#}");
    let headline = v["headline"].as_str().unwrap();
    assert!(headline.contains("rank 0 waits in `all_gather`"), "{headline}");
    assert!(headline.contains("Rank 1 is the odd one: it is stuck outside any collective"), "{headline}");
    let said = format!("{v}");
    assert!(!said.contains("kept making progress"), "{v:#}");
    let evidence: Vec<&str> = v["evidence"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(
        evidence.iter().any(|l| l.starts_with("rank 1 was silent (no marker, no output) for at least")
            && l.contains("s of CPU in that time")),
        "{evidence:#?}"
    );
    assert!(
        evidence.iter().any(|l| l.starts_with("rank 0 was silent too, using") && l.ends_with(": waiting")),
        "{evidence:#?}"
    );
}

/// Accelerate's own test script again, whole and passing, but with rank 1 made to abort as Python
/// shuts down (from outside: `INJECT_EXIT_ABORT_RANK`, a thread left in C++ at exit, as PyTorch's
/// own sometimes are: twice in 71 runs of a 2-rank DDP program here, once without
/// ups-doctor): the verdict says the crash came after the program had finished, from the
/// observer's summary at exit and C++'s own line, and whether rank 0, if torchrun then ended it,
/// had finished too.
#[test]
fn a_rank_that_aborts_as_python_shuts_down_is_named_as_crashing_after_its_program_finished() {
    let script = accelerate_dir().join("test_utils/scripts/test_ops.py").display().to_string();
    let sb = Sandbox::new();
    let mut cmd = sb.cmd();
    cmd.env("PATH", venv_path())
        .env("PYTHONPATH", repo().join("tests/programs/inject"))
        .env("INJECT_EXIT_ABORT_RANK", "1");
    let out = sb.run_with(cmd, &[], &["--", "torchrun", "--nproc_per_node", "2", script.as_str()]);
    let s = out.scenario();
    let v = &s["verdict"];
    assert_eq!((s["outcome"].as_str(), s["first_failure"].as_u64()), (Some("signaled"), Some(1)), "{v:#}");
    assert_eq!(s["ranks"][1]["signal"], "SIGABRT", "{:#}", s["ranks"][1]);
    assert_eq!(v["pattern"], "native-crash", "{v:#}");
    // Its first sentence: a second follows only where torchrun then ended rank 0 (and says whether
    // it had finished); rank 0 may have exited 0 by itself first (a fresh clone's run, 2026-12-07).
    assert_eq!(
        v["headline"].as_str().unwrap().split(". ").next().unwrap().trim_end_matches('.'),
        "Rank 1 was killed by SIGABRT after its program had finished, as Python shut down",
        "{v:#}"
    );
    let evidence: Vec<&str> = v["evidence"].as_array().unwrap().iter().filter_map(|e| e.as_str()).collect();
    let exit = s["ranks"][1]["observed"]["exiting_at_s"].as_f64().expect("rank 1's summary at exit");
    assert!(
        evidence.iter().any(|e| e.starts_with(&format!(
            "rank 1's program had finished its own code: its exit handlers ran at {exit:.2} s"
        ))),
        "{evidence:#?}"
    );
    assert!(
        evidence.contains(&"C++ printed `terminate called without an active exception` before the abort"),
        "{evidence:#?}"
    );
    assert!(v["likely_cause"].as_str().unwrap().starts_with("A crash at exit, not in training"), "{v:#}");
    // Rank 0 exited 0 first, or torchrun ended it: as it shut down too (its own summary at exit
    // came first: said), or, on a loaded machine, while it still ran its last lines (not said).
    let r0 = &s["ranks"][0];
    let r0_line = evidence.iter().find(|e| e.starts_with("collateral: rank 0"));
    match (r0["outcome"].as_str(), r0["observed"]["exiting_at_s"].as_f64()) {
        (Some("passed"), _) => assert!(r0_line.is_none(), "{evidence:#?}"),
        (_, Some(_)) => {
            assert!(r0_line.is_some_and(|e| e.contains("its program had finished too")), "{evidence:#?}")
        }
        (_, None) => assert!(r0_line.is_some_and(|e| !e.contains("finished")), "{evidence:#?}"),
    }
    assert!(
        sb.reports().contains("terminate called without an active exception\nFatal Python error: Aborted")
    );
}

/// A program that forks a helper child ending through Python's own exit (its exit handlers run
/// too), then aborts in the middle of its own code (`tests/programs/fork_then_abort.py`): the
/// child's exit is not the program's, so the abort is a native crash like any other, not one
/// "after its program had finished" (as it was called before the observer told a forked child
/// from the process it was forked from).
#[test]
fn a_forked_childs_exit_is_not_the_programs_and_a_later_abort_is_no_crash_at_exit() {
    let prog = repo().join("tests/programs/fork_then_abort.py").display().to_string();
    let sb = Sandbox::new();
    let out = run(&sb, &["--", "python", &prog]);
    let s = out.scenario();
    let v = &s["verdict"];
    assert_eq!(
        (s["outcome"].as_str(), s["ranks"][0]["signal"].as_str()),
        (Some("signaled"), Some("SIGABRT")),
        "{v:#}"
    );
    assert_eq!(v["pattern"], "native-crash", "{v:#}");
    assert!(s["ranks"][0]["observed"]["steps"].as_u64().is_some_and(|n| n >= 5), "{:#}", s["ranks"][0]);
    assert!(s["ranks"][0]["observed"]["exiting_at_s"].is_null(), "{:#}", s["ranks"][0]["observed"]);
    let said = format!("{v}");
    assert!(!said.contains("after its program had finished") && !said.contains("at exit"), "{v:#}");
}

/// A Lightning program (`Trainer(devices=2, strategy="ddp")`, which starts its second rank
/// itself) as a bare `run -- python train.py`: the command line has no rank count. `auto` sees a
/// program that starts its own ranks and runs it as a launcher, whose world grows to the process
/// group the program forms: both ranks are watched, rank 1's SIGSEGV is the first failure, and
/// the report says where the count came from. (Where the world cannot grow, several nodes or
/// more than 64 ranks, the verdict says how many ranks were not watched and names the fix:
/// `diagnose::conclude`'s unit tests.)
#[test]
fn a_lightning_command_whose_ranks_the_command_line_does_not_count_is_watched_whole() {
    let prog = repo().join("tests/programs/launchers.py").display().to_string();
    let argv = [
        "--",
        "python",
        &prog,
        "--launcher",
        "lightning",
        "--steps",
        "6",
        "--segv-rank",
        "1",
        "--segv-step",
        "4",
    ];
    let sb = Sandbox::new();
    let out = run(&sb, &argv);
    let s = out.scenario();
    assert_eq!(s["scenario"]["launch"]["world_size"], 2, "{:#}", s["scenario"]["launch"]);
    assert_eq!(s["external"]["world_size_declared"], 1, "{:#}", s["external"]);
    assert_eq!(s["first_failure"], 1, "{:#}", s["verdict"]);
    assert_eq!(s["ranks"][1]["signal"], "SIGSEGV", "{:#}", s["ranks"][1]);
    // Rank 1 finished its steps 0 to 3 and segfaulted in step 4. Its step markers may still wait
    // in the observer's queue then (sent every quarter second; by hand, all four were lost: 0
    // steps done); the count it kept in the file it maps says how far it got either way.
    assert_eq!(
        (s["ranks"][1]["steps_done"].as_u64(), s["ranks"][1]["observed"]["steps"].as_u64()),
        (Some(4), Some(4)),
        "{:#}",
        s["ranks"][1]
    );
    // Each rank's memory under its own row, rank 1's too: sampled below the launcher before
    // anything named it, placed by its pid at the end (its row was missing in 4 of 4 runs by hand
    // when only processes of known ranks were sampled).
    let memory = &s["memory"];
    for rank in 0..2 {
        let pid = &s["ranks"][rank]["pid"];
        assert!(
            memory["processes"].as_array().unwrap().iter().any(|p| p["rank"] == rank
                && p["role"] == "rank"
                && p["pid"] == *pid
                && p["peak_pss_bytes"].as_u64() > Some(0)),
            "rank {rank} (pid {pid}) has no row: {:#}",
            memory["processes"]
        );
        assert!(
            memory["series"].as_array().unwrap().iter().any(|p| p["pss_bytes"][rank].as_u64() > Some(0)),
            "rank {rank} is never in the series"
        );
    }
    let headline = s["verdict"]["headline"].as_str().unwrap();
    assert!(headline.starts_with("Rank 1 was killed by SIGSEGV"), "{headline}");
    assert!(!headline.contains("only 1 of the 2"), "{headline}");
    assert!(
        sb.reports().contains(
            "Ranks watched: 2, the process group the program formed (`init_process_group`, seen by the \
             observer); the command line said 1 (`launch.world_size`)."
        ),
        "{}",
        sb.reports()
    );

    // Told the count, the run watches it from the start and has nothing to say about it.
    let sb = Sandbox::new();
    let mut with_count = vec!["--set", "launch.world_size=2"];
    with_count.extend(argv);
    let out = run(&sb, &with_count);
    let s = out.scenario();
    assert_eq!(s["first_failure"], 1, "{:#}", s["verdict"]);
    assert!(s["external"]["world_size_declared"].is_null(), "{:#}", s["external"]);
    assert!(!sb.reports().contains("Ranks watched:"), "{}", sb.reports());
}

/// `torchrun --nnodes 2` run on one machine waits in its rendezvous for a node nobody started: no
/// rank process ever exists. The run is called hung without blaming any rank (before, every rank
/// "hung" and the others were "collateral"), and says what the launcher waits for and how to
/// start the other node or play both nodes here.
#[test]
fn torchrun_waiting_for_a_node_never_started_is_hung_and_no_rank_is_blamed() {
    let sb = Sandbox::new();
    let prog = program();
    let out =
        run(&sb, &["--hang-after", "5", "--", "torchrun", "--nnodes", "2", "--nproc_per_node", "1", &prog]);
    assert_eq!(out.code(), 1, "{}", out.stderr());
    let s = out.scenario();
    assert_eq!(s["outcome"], "hung", "{:#}", s["verdict"]);
    assert!(s["first_failure"].is_null(), "{:#}", s["verdict"]);
    for r in s["ranks"].as_array().unwrap() {
        assert!(r["pid"].is_null() && r["collateral"] == false, "{r:#}");
    }
    let headline = s["verdict"]["headline"].as_str().unwrap();
    assert!(
        headline.starts_with("No rank started: `torchrun` ran without starting any of its 2 ranks"),
        "{headline}"
    );
    assert!(headline.contains("It was started with `--nnodes 2`"), "{headline}");
    assert!(
        out.stderr()
            .contains("warning: `--nnodes 2`: the launcher starts its ranks once 2 nodes have joined"),
        "said before the wait: {}",
        out.stderr()
    );
    let md = sb.reports();
    assert!(md.contains("Ranks 0–1 never started"), "{md}");
    assert!(md.contains("`--set launch.nodes=2`"), "{md}");
}

/// A shell script that wraps torchrun, as most training jobs are started (`./train.sh`): `auto`
/// reads the script, takes it for the launcher it runs, and the run judges the ranks torchrun
/// started (before, the script was one "rank" whose failure was torchrun's `ChildFailedError`,
/// and rank 1's SIGSEGV was only quoted).
#[test]
fn a_shell_script_that_runs_torchrun_is_a_launcher_and_its_ranks_are_judged() {
    let sb = Sandbox::new();
    let prog = repo().join("tests/programs/launchers.py").display().to_string();
    let script = sb.path().join("train.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\n# the job, as a cluster user writes it\nset -e\ntorchrun --nproc_per_node 2 {prog} \
             --launcher env --steps 6 --segv-rank 1 --segv-step 4\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let script = script.display().to_string();
    let out = run(&sb, &["--", &script]);
    let s = out.scenario();
    assert_eq!(
        s["external"]["style_chosen"], "`train.sh` runs `torchrun` (line 4), a launcher: it starts the ranks",
        "{:#}",
        s["external"]
    );
    assert_eq!(s["scenario"]["launch"]["world_size"], 2, "the process group it formed");
    assert_eq!(s["first_failure"], 1, "{:#}", s["verdict"]);
    assert_eq!(s["ranks"][1]["signal"], "SIGSEGV", "{:#}", s["ranks"][1]);
    let headline = s["verdict"]["headline"].as_str().unwrap();
    assert!(headline.starts_with("Rank 1 was killed by SIGSEGV"), "{headline}");
}

/// A program that starts its own ranks (`mp.spawn`) reads its rendezvous from `MASTER_ADDR` and
/// `MASTER_PORT`, as the user exported them: ups-doctor passes them on as they are (it used to
/// remove them from a launcher's environment, so the program fell back to its own default port,
/// which another job could hold, and the verdict then blamed a port clash ups-doctor caused).
/// The ranks meet in a barrier before they part: gloo's `init_process_group` can return on rank 0
/// while rank 1 still connects, and rank 0 tearing its group down then fails rank 1's connection
/// (`connectFullMesh failed … Connection closed by peer`, seen once on a loaded machine).
#[test]
fn a_users_exported_rendezvous_reaches_a_program_that_starts_its_own_ranks() {
    let sb = Sandbox::new();
    let port = crate::util::free_port().to_string();
    let script = sb.path().join("spawned.py");
    std::fs::write(
        &script,
        "import os\nimport torch.distributed as dist\nimport torch.multiprocessing as mp\n\n\ndef work(rank):\n    \
         dist.init_process_group('gloo', rank=rank, world_size=2)\n    print(f'rank {rank} met at \
         {os.environ[\"MASTER_ADDR\"]}:{os.environ[\"MASTER_PORT\"]}', flush=True)\n    \
         dist.barrier()\n    dist.destroy_process_group()\n\n\nif __name__ == '__main__':\n    \
         mp.spawn(work, nprocs=2)\n",
    )
    .unwrap();
    let mut cmd = sb.cmd();
    cmd.env("PATH", venv_path()).env("MASTER_ADDR", "127.0.0.1").env("MASTER_PORT", &port);
    let out = sb.run_with(cmd, &[], &["--", "python", &script.display().to_string()]);
    let s = out.scenario();
    assert_eq!(s["outcome"], "passed", "{}\n{:#}", out.stderr(), s["verdict"]);
    let log = std::fs::read_dir(sb.out())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .filter_map(|e| std::fs::read_to_string(e.path().join("launcher.stdout.log")).ok())
        .collect::<String>();
    for rank in 0..2 {
        let want = format!("rank {rank} met at 127.0.0.1:{port}");
        assert!(log.contains(&want), "{want}\n{log}");
    }
}
