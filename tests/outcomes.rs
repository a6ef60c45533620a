//! Every outcome class, produced by the real trainer performing a real fault, classified by the
//! real harness, and checked in the JSON result, the exit status and the report.

use crate::util::{Sandbox, alive, tiny};

#[test]
fn a_clean_run_passes_and_exits_zero() {
    let sb = Sandbox::new();
    let file = sb.scenario("ok", &tiny(""));
    let run = sb.run(&[&file], &[]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    let s = run.scenario();
    assert_eq!(s["outcome"], "passed");
    assert_eq!(s["met_expectation"], true);
    let r = run.rank(0);
    assert_eq!(r["outcome"], "passed");
    assert_eq!(r["steps_done"], 8);
    assert_eq!(r["exit_code"], 0);
    assert!(s["steps_per_s"].as_f64().unwrap() > 0.0);
    let report = std::fs::read_to_string(sb.out().join("report.md")).unwrap();
    assert!(report.contains("Passed"), "report:\n{report}");
}

#[test]
fn segv_in_forward_is_signaled_with_phase_step_and_the_injecting_symbol() {
    let sb = Sandbox::new();
    let file = sb.scenario(
        "segv",
        &tiny(
            r#""inject": [{"fault": "segv", "phase": "forward", "step": 3}],
                 "expect": {"outcome": "signaled", "signal": "SIGSEGV", "phase": "forward", "step": 3}"#,
        ),
    );
    let run = sb.run(&[&file], &[]);
    assert_eq!(run.code(), 0, "the expectation is met; stderr:\n{}", run.stderr());
    let r = run.rank(0);
    assert_eq!(r["outcome"], "signaled");
    assert_eq!(r["signal"], "SIGSEGV");
    assert_eq!(r["last_phase"], "forward");
    assert_eq!(r["last_step"], 3);
    let frames = r["backtrace"].as_array().expect("a symbolised backtrace");
    let symbols: Vec<&str> = frames.iter().filter_map(|f| f["symbol"].as_str()).collect();
    assert!(symbols.iter().any(|s| s.contains("inject_segv")), "symbols: {symbols:#?}");
    assert!(
        symbols.iter().take(4).any(|s| s.contains("inject_segv") || s.contains("write_volatile")),
        "frame #0 should be where the signal hit, not the handler: {symbols:#?}"
    );
    let report = std::fs::read_to_string(sb.out().join("report.md")).unwrap();
    assert!(report.contains("SIGSEGV") && report.contains("inject_segv"));
}

#[test]
fn abort_is_signaled_sigabrt() {
    let sb = Sandbox::new();
    let file = sb.scenario(
        "abort",
        &tiny(
            r#""inject": [{"fault": "abort", "phase": "backward", "step": 1}],
                 "expect": {"outcome": "signaled", "signal": "SIGABRT"}"#,
        ),
    );
    let run = sb.run(&[&file], &[]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    let r = run.rank(0);
    assert_eq!(r["signal"], "SIGABRT");
    assert_eq!(r["last_phase"], "backward");
    assert_eq!(r["last_step"], 1);
    let symbols: Vec<&str> =
        r["backtrace"].as_array().unwrap().iter().filter_map(|f| f["symbol"].as_str()).collect();
    assert!(symbols.iter().any(|s| s.contains("inject_abort")), "symbols: {symbols:#?}");
}

#[test]
fn silent_exit_zero_is_a_false_success() {
    let sb = Sandbox::new();
    let file = sb.scenario(
        "exit0",
        &tiny(
            r#""inject": [{"fault": "exit0", "phase": "forward", "step": 2}],
                 "expect": {"outcome": "false_success"}"#,
        ),
    );
    let run = sb.run(&[&file], &[]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    let r = run.rank(0);
    assert_eq!(r["outcome"], "false_success");
    assert_eq!(r["exit_code"], 0);
    assert_eq!(r["last_phase"], "forward");
    assert_eq!(r["steps_done"], 2);
    assert!(run.scenario()["verdict"]["headline"].as_str().unwrap().contains("false success"));
}

#[test]
fn exit_error_is_exited_with_the_message() {
    let sb = Sandbox::new();
    let file = sb.scenario(
        "exit-error",
        &tiny(
            r#""inject": [{"fault": "exit_error", "phase": "optimizer", "step": 0}],
                 "expect": {"outcome": "exited", "exit_code": 1, "message": "injected failure"}"#,
        ),
    );
    let run = sb.run(&[&file], &[]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    let r = run.rank(0);
    assert_eq!(r["outcome"], "exited");
    assert_eq!(r["exit_code"], 1);
    let error = r["error"].as_str().unwrap();
    assert!(error.contains("injected failure") && error.contains("optimizer"), "error: {error}");
}

#[test]
fn nan_loss_stops_training_with_an_error() {
    let sb = Sandbox::new();
    let file = sb.scenario("nan", &tiny(r#""inject": [{"fault": "nan", "phase": "forward", "step": 2}]"#));
    let run = sb.run(&[&file], &[]);
    assert_eq!(run.code(), 1, "expect defaults to passed, so this is unmet");
    let r = run.rank(0);
    assert_eq!(r["outcome"], "exited");
    assert!(r["error"].as_str().unwrap().contains("non-finite"));
    assert_eq!(run.scenario()["verdict"]["pattern"], "nan-loss");
    let headline = run.scenario()["verdict"]["headline"].as_str().unwrap();
    assert!(headline.starts_with("Rank 0's loss became NaN: `loss became non-finite"), "{headline}");
    assert_eq!(run.scenario()["met_expectation"], false);
    let mismatches = run.scenario()["expectation_mismatches"].to_string();
    assert!(mismatches.contains("expected outcome `passed`, got `exited`"), "{mismatches}");
}

#[test]
fn hang_is_declared_within_hang_after_plus_two_seconds_with_every_thread_stack() {
    let sb = Sandbox::new();
    let file = sb.scenario(
        "hang",
        &tiny(
            r#""inject": [{"fault": "hang", "phase": "optimizer", "step": 2}],
                 "expect": {"outcome": "hung", "phase": "optimizer", "step": 2}"#,
        ),
    );
    // Generous: on two busy cores a healthy step can be silent for seconds, and a threshold
    // tighter than that would catch a slow phase before the fault ever fires.
    let hang_after = 10.0;
    let run = sb.run(&[&file], &["--set", &format!("limits.hang_after_s={hang_after}")]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    let r = run.rank(0);
    assert_eq!(r["outcome"], "hung");
    // Measured by the harness: silence between the last marker and the hang verdict.
    let detected = r["hang_detected_after_s"].as_f64().unwrap();
    assert!(
        (hang_after..=hang_after + 2.0).contains(&detected),
        "hang declared after {detected} s of silence"
    );
    let stacks = r["stacks"].as_array().expect("stacks of the stuck rank");
    let deadlocked = stacks
        .iter()
        .filter(|t| {
            let frames = t["frames"].to_string();
            frames.contains("inject_hang") && frames.contains("lock")
        })
        .count();
    let summary: Vec<String> = stacks
        .iter()
        .map(|t| {
            let symbols: Vec<&str> = t["frames"]
                .as_array()
                .unwrap()
                .iter()
                .take(12)
                .filter_map(|f| f["symbol"].as_str())
                .collect();
            format!("{} ({}): {}", t["thread"], t["tid"], symbols.join(" <- "))
        })
        .collect();
    assert!(deadlocked >= 1, "no thread blocked in inject_hang's lock:\n{}", summary.join("\n"));
    assert!(stacks.iter().any(|t| t["thread"] == "ups-hang-peer"), "the peer thread is dumped too");
    assert!(["SIGTERM", "SIGKILL"].contains(&r["torn_down_with"].as_str().unwrap()));
    let pid = r["pid"].as_u64().unwrap();
    assert!(!alive(pid), "the hung rank {pid} was torn down");
}

#[test]
fn when_conditions_arm_a_fault_only_for_matching_configurations() {
    let sb = Sandbox::new();
    let file = sb.scenario(
        "when",
        &tiny(r#""inject": [{"fault": "segv", "phase": "model.build/conditioner", "when": {"model.conditioning": true}}],
                 "expect": {"outcome": "signaled", "signal": "SIGSEGV", "phase": "model.build/conditioner"}"#),
    );
    let run = sb.run(&[&file], &[]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    assert_eq!(run.rank(0)["signal"], "SIGSEGV");
    // Without conditioning the fault is not armed: the run passes, which no longer meets expect.
    let off = sb.run(&[&file], &["--set", "model.conditioning=false"]);
    assert_eq!(off.rank(0)["outcome"], "passed");
    assert_eq!(off.code(), 1);
}

#[test]
fn a_missed_expectation_exits_one_and_says_why() {
    let sb = Sandbox::new();
    let file = sb.scenario(
        "wrong",
        &tiny(
            r#""inject": [{"fault": "abort", "phase": "forward", "step": 1}],
                 "expect": {"outcome": "signaled", "signal": "SIGSEGV"}"#,
        ),
    );
    let run = sb.run(&[&file], &[]);
    assert_eq!(run.code(), 1);
    assert_eq!(run.scenario()["expectation_mismatches"][0], "expected signal `SIGSEGV`, got `SIGABRT`");
}

#[test]
fn a_run_past_timeout_s_is_timed_out_and_torn_down() {
    let sb = Sandbox::new();
    // Progressing (markers every step), so not hung; far too many steps for the time limit.
    let file = sb.scenario("slow", &tiny(r#""expect": {"outcome": "timed_out"}"#));
    let run = sb.run(&[&file], &["--set", "train.steps=1000000", "--set", "limits.timeout_s=8"]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    let r = run.rank(0);
    assert_eq!(r["outcome"], "timed_out");
    // Whether it got past its first step in 8 s depends on the machine's load; that it started
    // and reported does not.
    assert!(r["markers"].as_u64().unwrap() > 0, "it started and reported");
    assert!(["SIGTERM", "SIGKILL"].contains(&r["torn_down_with"].as_str().unwrap()));
    assert!(!alive(r["pid"].as_u64().unwrap()));
    let headline = run.scenario()["verdict"]["headline"].as_str().unwrap();
    assert!(headline.contains("time limit of 8 s"), "{headline}");
}
