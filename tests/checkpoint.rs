//! Checkpoints with the real trainer: a resumed run continues with the same losses and ends with
//! the same parameters; a rank killed mid-save leaves no checkpoint that looks complete.

use std::path::{Path, PathBuf};

use crate::util::{Sandbox, tiny};
use serde_json::Value;

fn launch(mode: &str) -> String {
    let world = if mode == "single" { 1 } else { 2 };
    tiny(&format!(r#""launch": {{"mode": "{mode}", "world_size": {world}}}"#))
}

/// `ups-doctor run FILE --out OUT --json --quiet ARGS`, with its own output folder.
fn run(sb: &Sandbox, file: &Path, out: &str, args: &[&str]) -> Value {
    let output = sb
        .cmd()
        .arg("run")
        .arg(file)
        .args(["--out", out, "--json", "--quiet"])
        .args(args)
        .output()
        .expect("ups-doctor starts");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "stderr:\n{stderr}");
    let result: Value = serde_json::from_slice(&output.stdout).expect("json result");
    result["scenarios"][0].clone()
}

fn losses(rank: &Value) -> Vec<(u64, f64)> {
    rank["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap()))
        .collect()
}

fn checkpoints(sb: &Sandbox, out: &str) -> PathBuf {
    sb.path().join(out).join("1-ckpt").join("checkpoints")
}

#[test]
fn a_resumed_run_continues_with_the_same_losses_and_parameters() {
    for mode in ["single", "fsdp"] {
        let sb = Sandbox::new();
        let file = sb.scenario("ckpt", &launch(mode));
        let whole =
            run(&sb, &file, "whole", &["--set", "train.steps=12", "--set", "train.checkpoint_every=6"]);
        let saved = checkpoints(&sb, "whole").join("step-000006");
        assert!(saved.join("meta.json").is_file(), "{mode}: {}", saved.display());
        let files: Vec<&str> = if mode == "fsdp" { vec!["rank0.ot", "rank1.ot"] } else { vec!["rank0.ot"] };
        for f in files {
            assert!(saved.join(f).is_file(), "{mode}: {f} in {}", saved.display());
        }
        let timeline = whole["ranks"][0]["timeline"].to_string();
        assert!(timeline.contains("checkpoint.save"), "{mode}: saves show in the timeline: {timeline}");

        // Relative to where ups-doctor starts, as a user would type it.
        let resume = "train.resume=whole/1-ckpt/checkpoints/step-000006";
        let resumed = run(&sb, &file, "resumed", &["--set", "train.steps=12", "--set", resume]);
        let all = losses(&whole["ranks"][0]);
        let tail = losses(&resumed["ranks"][0]);
        assert_eq!(tail.first().map(|p| p.0), Some(6), "{mode}: resumed at step 6");
        assert_eq!(&all[6..], &tail[..], "{mode}: the same loss trajectory, bit for bit");
        let sums = |s: &Value| -> Vec<Value> {
            s["ranks"].as_array().unwrap().iter().map(|r| r["params_checksum"].clone()).collect()
        };
        assert_eq!(sums(&whole), sums(&resumed), "{mode}: the same parameters at the end");
        let timeline = resumed["ranks"][0]["timeline"].to_string();
        assert!(timeline.contains("checkpoint.load"), "{mode}: {timeline}");
    }
}

#[test]
fn a_rank_killed_mid_save_leaves_the_previous_checkpoint_as_the_latest() {
    let sb = Sandbox::new();
    let file = sb.scenario("ckpt", &launch("fsdp"));
    let killed = run(
        &sb,
        &file,
        "killed",
        &[
            "--set",
            "train.steps=12",
            "--set",
            "train.checkpoint_every=4",
            "--set",
            r#"inject=[{"fault": "segv", "phase": "checkpoint.commit", "step": 8, "rank": 1}]"#,
            "--set",
            "expect.outcome=signaled",
        ],
    );
    assert_eq!(killed["ranks"][1]["outcome"], "signaled");
    assert_eq!(killed["ranks"][1]["last_phase"], "checkpoint.commit");
    assert_eq!(killed["ranks"][0]["collateral"], true, "rank 0 lost its peer while waiting to commit");
    let dir = checkpoints(&sb, "killed");
    assert!(dir.join("step-000004").join("meta.json").is_file());
    assert!(!dir.join("step-000008").exists(), "an interrupted save never looks complete");
    assert!(dir.join(".step-000008.tmp").is_dir(), "the interrupted save stays aside");

    // Resuming from the directory takes its latest complete checkpoint.
    let resume = "train.resume=killed/1-ckpt/checkpoints";
    let resumed = run(&sb, &file, "resumed", &["--set", "train.steps=12", "--set", resume]);
    assert_eq!(resumed["ranks"][0]["outcome"], "passed");
    assert_eq!(losses(&resumed["ranks"][0]).first().map(|p| p.0), Some(4));
}

#[test]
fn a_checkpoint_from_another_kind_of_run_is_refused_with_both_shapes_named() {
    let sb = Sandbox::new();
    let fsdp = sb.scenario("ckpt", &launch("fsdp"));
    run(&sb, &fsdp, "fsdp", &["--set", "train.steps=4", "--set", "train.checkpoint_every=4"]);
    let ddp = sb.scenario("ckpt", &launch("ddp"));
    let output = sb
        .cmd()
        .arg("run")
        .arg(&ddp)
        .args(["--out", "ddp", "--json", "--quiet", "--set", "train.resume=fsdp/1-ckpt/checkpoints"])
        .output()
        .unwrap();
    let result: Value = serde_json::from_slice(&output.stdout).expect("json result");
    let r0 = &result["scenarios"][0]["ranks"][0];
    assert_eq!(r0["outcome"], "exited");
    assert_eq!(r0["last_phase"], "checkpoint.load");
    let error = r0["error"].as_str().unwrap();
    assert!(
        error.contains(
            "does not fit this run: saved by `mode: fsdp` with `world_size: 2`, but this run is `mode: ddp`"
        ),
        "{error}"
    );
}
