//! The trainer executable on its own, with no harness: `ups-doctor-trainer train` trains a tiny
//! scenario to a falling loss, and refuses arguments it does not understand. (Being an
//! integration test of this package, it also makes `cargo test` build the executable that the
//! doctor's integration tests start for every built-in rank.)

use std::process::Command;

fn trainer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ups-doctor-trainer"))
}

#[test]
fn a_tiny_scenario_trains_without_a_harness_and_its_loss_falls() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tiny.json");
    std::fs::write(
        &file,
        r#"{"name": "tiny", "model": {"depths": [1], "hidden": 32, "heads": 2}, "data": {"samples": 64, "grid": 64, "batch_size": 8}, "train": {"steps": 30, "lr": 0.003}}"#,
    )
    .unwrap();
    let out = trainer().arg("train").arg(&file).current_dir(dir.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    // Without a harness the trainer prints its summary: `done: 30 steps, loss FIRST -> LAST; …`.
    let summary = stdout
        .lines()
        .chain(stderr.lines())
        .find(|l| l.starts_with("done: "))
        .unwrap_or_else(|| panic!("no summary line:\n{stdout}\n{stderr}"));
    let losses: Vec<f64> = summary
        .split("loss ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .map(|pair| pair.split(" -> ").filter_map(|v| v.trim().parse().ok()).collect())
        .unwrap_or_default();
    let [first, last] = losses[..] else { panic!("no `loss A -> B` in {summary:?}") };
    assert!(last <= 0.5 * first, "loss fell from {first} to {last}, less than half: {summary}");
}

#[test]
fn arguments_it_does_not_understand_are_bad_input_with_the_usage() {
    let out = trainer().args(["train", "x.json", "--no-such-flag"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown option `--no-such-flag`") && stderr.contains("usage:"), "{stderr}");
}
