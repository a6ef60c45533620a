//! Rank discovery for the launchers people start DDP with, each the real package from the test
//! venv (PyTorch 2.11, CPU, gloo): `torch.multiprocessing.spawn`, Lightning's own launcher and
//! `accelerate launch` and `deepspeed`, all `launch.style: launcher`. Per launcher, one `ups-doctor run` of three
//! scenarios: a 2-rank program that passes, the same with rank 1 segfaulting at step 4, and the
//! same with rank 1 skipping a gradient all-reduce (both ranks hang). The program
//! (tests/programs/launchers.py) sends no markers: ranks are judged from what any program leaves.
//! The spawn and Lightning scenarios name no `launch.style`: `auto` must take `launcher`.

mod util;

use serde_json::Value;
use util::{RunOutput, Sandbox, repo};

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
                    "limits": {{"timeout_s": 300, "hang_after_s": 20}}, "expect": {expect}}}"#
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
        .map(|s| format!("{}: {} {} {}", s["name"], s["verdict"], s["expectation_mismatches"], s["ranks"]))
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
fn torch_multiprocessing_spawn_ranks_are_found_by_spawn_order() {
    let (sb, run) = three_cases("spawn", r#""python""#, r#""--launcher", "spawn""#, "");
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

#[test]
fn lightnings_rank_0_is_the_launcher_and_rank_1_its_local_rank_child() {
    let (sb, run) = three_cases("lightning", r#""python""#, r#""--launcher", "lightning""#, "");
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
/// processes were not identified; with status 3 the launcher's exit is the failure.
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
    assert_ne!(failed["outcome"], "passed", "{}", failed["verdict"]);
    let error = failed["ranks"][0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("no process of rank 0 was identified under the launcher"), "{error}");
    assert!(error.contains("2 processes below the launcher looked like ranks"), "{error}");
    assert!(error.contains("the launcher `sh` exited with status 3"), "{error}");
    let md = sb.reports();
    assert!(
        md.contains("Ranks identified: rank 0: no process identified; rank 1: no process identified."),
        "{md}"
    );
}
