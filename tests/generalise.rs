//! The classes of wrong verdicts that real third-party programs found (issue 56), each on a real
//! PyTorch 2.11 program (CPU, gloo) under `ups-doctor run -- …`, with the fault injected from
//! outside the program (`tests/programs/inject/`, a `sitecustomize` on `PYTHONPATH`) or made by
//! the world around it (a small `/dev/shm`, a relative path): what was wrong, and what each must
//! say now. The accuracy matrix over programs this project did not write is `bench/accuracy`.

use crate::util::{RunOutput, Sandbox, evidence_of as evidence, repo, venv_path};
use serde_json::Value;

/// `ups-doctor run --json --quiet ARGS…` in `sb`, with the venv's torchrun and python first.
fn run(sb: &Sandbox, args: &[&str]) -> RunOutput {
    let mut cmd = sb.cmd();
    cmd.env("PATH", venv_path());
    sb.run_with(cmd, &[], args)
}

fn program(name: &str) -> String {
    repo().join("tests/programs").join(name).display().to_string()
}

/// `ups-doctor run --env PYTHONPATH=<the injector> --env FAULT… --hang-after H -- torchrun
/// --nproc_per_node 2 observed_ddp.py --steps STEPS`: the fault given to the command as a user
/// gives a checkout's own path.
fn injected(sb: &Sandbox, faults: &[&str], hang_after: &str, steps: &str) -> RunOutput {
    let inject = repo().join("tests/programs/inject").display().to_string();
    let path = format!("PYTHONPATH={inject}");
    let prog = program("observed_ddp.py");
    let mut args: Vec<&str> = vec!["--env", &path];
    for f in faults {
        args.extend(["--env", f]);
    }
    args.extend(["--hang-after", hang_after, "--timeout", "180", "--", "torchrun", "--nproc_per_node", "2"]);
    args.extend([prog.as_str(), "--steps", steps]);
    run(sb, &args)
}

fn verdict<'v>(s: &'v Value, field: &str) -> &'v str {
    s["verdict"][field].as_str().unwrap_or_else(|| panic!("no verdict.{field}: {:#}", s["verdict"]))
}

/// Class 1: `--env PYTHONPATH=…` (a checkout's own folder, here the injector's) replaced the path
/// that put ups-doctor's `sitecustomize` first: the observer never loaded, the skipped collective
/// was never seen, and nothing said so. Now the observer loads after and before the user's path
/// alike; and a Python that never reads it (`python -I`) is said to have sent nothing.
#[test]
fn a_pythonpath_given_to_the_command_keeps_the_observer_and_a_python_without_it_is_told() {
    let sb = Sandbox::new();
    let out = injected(&sb, &["INJECT_SKIP_RANK=1", "INJECT_SKIP_CALL=5"], "10", "20");
    let s = out.scenario();
    assert_eq!(verdict(s, "pattern"), "collective-mismatch", "{}\n{:#}", out.stderr(), s["verdict"]);
    assert_eq!(s["first_failure"], 1, "{:#}", s["verdict"]);
    for rank in 0..2 {
        let group = &s["ranks"][rank]["observed"]["group"];
        assert_eq!(
            (group["backend"].as_str(), group["world_size"].as_u64()),
            (Some("gloo"), Some(2)),
            "{group}"
        );
    }
    assert_eq!(s["external"]["observer_silent"], Value::Null, "the observer was heard");

    let sb = Sandbox::new();
    let out = run(&sb, &["--", "python", "-I", "-c", "import torch; print(torch.ones(2).sum())"]);
    assert_eq!(out.scenario()["outcome"], "passed", "{}", out.stderr());
    assert_eq!(out.scenario()["external"]["observer_silent"], true);
    let report = std::fs::read_to_string(sb.out().join("report.md")).unwrap();
    assert!(report.contains("**the observer reported nothing** from any process"), "{report}");
}

/// Class 2: a relative script was read from ups-doctor's own folder, not `--cwd`: a program that
/// starts its own ranks (`mp.spawn`) was taken for a plain script and run once per rank, and its
/// copies collided on their port. Now the script is read where the command runs, and a script
/// that cannot be read is said to be a guess.
#[test]
fn a_relative_script_is_read_from_the_commands_folder_and_an_unreadable_one_is_said_to_be_a_guess() {
    let sb = Sandbox::new();
    let programs = repo().join("tests/programs").display().to_string();
    let out = run(
        &sb,
        &[
            "--cwd",
            &programs,
            "--hang-after",
            "20",
            "--timeout",
            "180",
            "--",
            "python",
            "launchers.py",
            "--launcher",
            "spawn",
            "--segv-rank",
            "1",
            "--segv-step",
            "3",
        ],
    );
    let s = out.scenario();
    let chosen = s["external"]["style_chosen"].as_str().unwrap_or_default();
    assert_eq!(s["external"]["style"], "launcher", "{chosen}");
    assert!(chosen.starts_with("`launchers.py` starts its own ranks"), "{chosen}");
    assert_eq!(verdict(s, "pattern"), "native-crash", "{:#}", s["verdict"]);
    assert_eq!(s["first_failure"], 1, "{:#}", s["verdict"]);
    assert_eq!(s["ranks"].as_array().unwrap().len(), 2, "the two ranks spawn started, not copies of it");

    let sb = Sandbox::new();
    let empty = sb.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = run(&sb, &["--cwd", "empty", "--", "python", "train.py"]);
    let chosen = out.scenario()["external"]["style_chosen"].as_str().unwrap_or_default().to_string();
    assert!(
        chosen.starts_with("`train.py` could not be read")
            && chosen.contains(&empty.join("train.py").display().to_string())
            && chosen.contains("--style launcher"),
        "{chosen}"
    );
    let report = std::fs::read_to_string(sb.out().join("report.md")).unwrap();
    assert!(
        report.contains("`train.py` could not be read"),
        "the report says the style was a guess: {report}"
    );
}

/// Classes 3 and 6: a rank aborted by an uncaught C++ exception (gloo's, thrown in its own thread
/// when the ranks' sizes of one all-reduce differ) got a key-line-less "native crash", whose dump
/// "named no frame of the program's own code" although it ended in the program's file. Now the
/// `what():` is the key line, at the program's frame of the main thread, and the library's own
/// words make it a collective mismatch, whose culprit the sizes alone cannot tell.
#[test]
fn an_abort_by_the_collective_librarys_size_mismatch_is_a_collective_mismatch_at_the_programs_line() {
    let sb = Sandbox::new();
    let out = injected(&sb, &["INJECT_SIZE_RANK=1", "INJECT_SIZE_CALL=3"], "20", "10");
    let s = out.scenario();
    assert_eq!(verdict(s, "pattern"), "collective-mismatch", "{}\n{:#}", out.stderr(), s["verdict"]);
    let key = verdict(s, "key_line");
    assert!(key.contains("Received data size doesn't match expected size"), "{key}");
    let source = std::fs::read_to_string(repo().join("tests/programs/observed_ddp.py")).unwrap();
    let gather = source.lines().position(|l| l.contains("dist.all_gather(")).unwrap() + 1;
    assert!(
        key.contains("16 vs 8") && key.ends_with(&format!("(observed_ddp.py:{gather} in main)")),
        "{key}"
    );
    let headline = verdict(s, "headline");
    assert!(
        headline.contains("sizes differ between the ranks: it received 16 where it expected 8"),
        "{headline}"
    );
    // The rank gloo aborted only received what the other sent; no rank's size is known to have
    // changed at that call site (the metric is all-reduced once), so none is claimed as the first
    // failure, and none is called collateral.
    assert_eq!(s["first_failure"], Value::Null, "{:#}", s["verdict"]);
    assert!(headline.contains("cannot be told"), "{headline}");
    assert!(!headline.contains("collateral"), "{headline}");
    let aborted = s["ranks"].as_array().unwrap().iter().filter(|r| r["signal"] == "SIGABRT").count();
    assert_eq!(aborted, 1, "{:#}", s["ranks"]);
    // Each rank's ledger ends in the all-reduce it was in, with the size it passed: the aborted
    // rank's too, which gloo aborted before its observer sent it (the file the observer maps
    // kept it).
    let last: Vec<(&str, &str, bool)> = s["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let e =
                r["observed"]["ledger"].as_array().and_then(|l| l.last()).unwrap_or_else(|| panic!("{r:#}"));
            (e["op"].as_str().unwrap(), e["shapes"].as_str().unwrap(), r["signal"] == "SIGABRT")
        })
        .collect();
    assert_eq!(last, [("all_reduce", "8", true), ("all_reduce", "16", false)], "{:#}", s["ranks"]);
    assert!(!evidence(s).iter().any(|e| e.contains("named no frame")), "{:#?}", evidence(s));
}

/// Class 4: a DataLoader worker's queue thread printed that it could not allocate `/dev/shm` for a
/// batch and dropped it, raising nothing; the ranks then waited forever, and the verdict said a
/// rank hung, the other collateral, never naming `/dev/shm`. Class 7: ranks ups-doctor tore down
/// had their exit status "read while it was a zombie".
#[test]
fn a_hang_after_a_worker_printed_it_could_not_allocate_dev_shm_names_dev_shm() {
    let sb = Sandbox::new();
    let prog = program("shm_feeder.py");
    let out = run(
        &sb,
        &[
            "--shm-size",
            "6m",
            "--hang-after",
            "15",
            "--timeout",
            "180",
            "--",
            "torchrun",
            "--nproc_per_node",
            "2",
            &prog,
        ],
    );
    let s = out.scenario();
    assert_eq!(s["outcome"], "hung", "{}\n{:#}", out.stderr(), s["verdict"]);
    assert_eq!(verdict(s, "pattern"), "shm-exhausted", "{:#}", s["verdict"]);
    let headline = verdict(s, "headline");
    assert!(
        headline.contains("waiting for batches that never came")
            && headline
                .contains("could not put a batch into /dev/shm (`unable to allocate shared memory(shm)`)"),
        "{headline}"
    );
    assert!(evidence(s).iter().any(|e| e.contains("by DataLoader workers of rank")), "{:#?}", evidence(s));
    assert!(!evidence(s).iter().any(|e| e.contains("zombie")), "{:#?}", evidence(s));
}

/// Class 5: every rank raised the same error within milliseconds; whether one had exited before
/// torchrun's SIGTERM reached it decided "each on its own" or "collateral". The same program and
/// fault must get the same verdict every time: the lowest rank first, the other on its own.
#[test]
fn ranks_that_all_raise_the_same_error_get_the_same_verdict_every_time() {
    let mut headlines = Vec::new();
    for _ in 0..3 {
        let sb = Sandbox::new();
        let out = injected(&sb, &["INJECT_RAISE_RANKS=all", "INJECT_RAISE_STEP=3"], "20", "10");
        let s = out.scenario();
        assert_eq!(s["first_failure"], 0, "{}\n{:#}", out.stderr(), s["verdict"]);
        assert_eq!(s["ranks"][1]["collateral"], false, "{:#}", s["verdict"]);
        let headline = verdict(s, "headline");
        assert!(
            headline.starts_with("Rank 0 ")
                && headline.contains("ValueError: injected: bad batch at step 3")
                && headline.ends_with("Rank 1 failed the same way on its own (not collateral)."),
            "{headline}"
        );
        // What each rank's process did after its traceback (exited, or was stopped by torchrun as
        // it exited) differs from run to run; the verdict does not.
        headlines.push((s["verdict"]["pattern"].clone(), verdict(s, "key_line").to_string()));
    }
    assert!(headlines.iter().all(|h| *h == headlines[0]), "{headlines:#?}");
}
