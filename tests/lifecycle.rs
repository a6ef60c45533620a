//! The run as a whole: report folders, re-rendering, `--json`, running a rank by hand, and that no
//! rank outlives ups-doctor whether it is interrupted or killed.

use std::process::{Child, Stdio};
use std::time::Duration;

use crate::util::{Sandbox, alive, children_of as children, eventually, tiny};

/// Starts `ups-doctor run` on a scenario that hangs for good, and waits until its rank is stuck
/// in the fault. Returns the ups-doctor child and the rank's pid.
fn start_hung_run(sb: &Sandbox) -> (Child, u32) {
    let file = sb.scenario("stuck", &tiny(r#""inject": [{"fault": "hang", "phase": "forward", "step": 1}]"#));
    let stderr = std::fs::File::create(sb.path().join("ups-doctor.stderr")).unwrap();
    let mut child = sb
        .cmd()
        .arg("run")
        .arg(&file)
        .args(["--set", "limits.hang_after_s=600", "--set", "limits.timeout_s=900", "--out"])
        .arg(sb.out())
        .arg("--quiet")
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let log = sb.out().join("1-stuck/rank0.stderr.log");
    let reached = eventually(Duration::from_secs(60), || {
        if let Ok(Some(status)) = child.try_wait() {
            let err = std::fs::read_to_string(sb.path().join("ups-doctor.stderr")).unwrap_or_default();
            panic!("ups-doctor ended early with {status}:\n{err}");
        }
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("injecting fault"))
    });
    assert!(reached, "the rank never reached its fault");
    let ranks = children(child.id());
    assert_eq!(ranks.len(), 1, "one rank process under ups-doctor");
    (child, ranks[0])
}

#[test]
fn ctrl_c_tears_down_the_rank_and_keeps_what_the_interrupted_scenario_had() {
    let sb = Sandbox::new();
    let (mut child, rank) = start_hung_run(&sb);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(eventually(Duration::from_secs(10), || !alive(rank as u64)), "rank {rank} survived Ctrl-C");
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(sb.out().join("result.json")).unwrap()).unwrap();
    assert_eq!(result["interrupted"], true);
    assert!(result["not_run"].as_array().is_none_or(Vec::is_empty), "{result:#}");
    // The scenario it interrupted is kept, marked so: where the rank was, and its stacks, taken
    // before teardown (it was stuck).
    let scenario = &result["scenarios"][0];
    assert_eq!(scenario["interrupted"], true, "{scenario:#}");
    assert_eq!(scenario["met_expectation"], false);
    assert_eq!(scenario["ranks"][0]["last_phase"], "forward", "{scenario:#}");
    assert_eq!(scenario["ranks"][0]["last_step"], 1);
    assert!(
        scenario["ranks"][0]["stacks"].as_array().is_some_and(|s| !s.is_empty()),
        "no stacks of the stuck rank: {scenario:#}"
    );
    let report = std::fs::read_to_string(sb.out().join("report.md")).unwrap();
    assert!(report.contains("Interrupted by the user"), "{report}");
}

#[test]
fn ranks_die_with_ups_doctor_even_when_it_is_sigkilled() {
    let sb = Sandbox::new();
    let (mut child, rank) = start_hung_run(&sb);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        eventually(Duration::from_secs(10), || !alive(rank as u64)),
        "rank {rank} outlived a SIGKILLed ups-doctor"
    );
}

#[test]
fn report_rerenders_the_same_markdown_from_result_json() {
    let sb = Sandbox::new();
    let file = sb.scenario(
        "segv",
        &tiny(r#""inject": [{"fault": "segv", "phase": "backward", "step": 1}], "expect": {"outcome": "signaled"}"#),
    );
    let run = sb.run(&[&file], &[]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    let report = sb.out().join("report.md");
    let original = std::fs::read_to_string(&report).unwrap();
    std::fs::remove_file(&report).unwrap();
    let out = sb.cmd().arg("report").arg(sb.out()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(&report).unwrap(), original);
    // The logs the report points at are there.
    for log in ["rank0.stdout.log", "rank0.stderr.log", "scenario.json"] {
        assert!(sb.out().join("1-segv").join(log).exists(), "{log} missing");
    }
}

#[test]
fn report_of_a_folder_without_result_json_is_bad_input() {
    let sb = Sandbox::new();
    let out = sb.cmd().arg("report").arg(sb.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("result.json"), "{stderr}");
}

#[test]
fn default_report_folder_is_under_reports_runs() {
    let sb = Sandbox::new();
    sb.scenario("ok", &tiny(""));
    // No paths: the `scenarios/` folder of the working directory.
    let out = sb.cmd().args(["run", "--quiet"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let runs: Vec<_> = std::fs::read_dir(sb.path().join("reports/runs")).unwrap().collect();
    assert_eq!(runs.len(), 1);
    let run = runs[0].as_ref().unwrap().path();
    assert!(run.join("report.md").exists() && run.join("result.json").exists());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("passed") && stdout.contains("report: reports/runs/"), "{stdout}");
}

#[test]
fn train_runs_by_hand_without_a_harness() {
    let sb = Sandbox::new();
    let file = sb.scenario("ok", &tiny(""));
    let out = sb.cmd().arg("train").arg(&file).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("done: 8 steps"), "{stdout}");
}
