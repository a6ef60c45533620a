//! Bad input through the real binary: exit status 2, nothing run, and a message that names the
//! file, line:column, field and fix. Messages are snapshot-tested as the user sees them.

use crate::util::Sandbox;

/// Runs `ups-doctor run scenarios/<name>.json ARGS` in a sandbox holding `body`, expects exit 2
/// and returns stderr.
fn rejected(name: &str, body: &str, args: &[&str]) -> String {
    let sb = Sandbox::new();
    sb.scenario(name, body);
    let out = sb.cmd().arg("run").arg(format!("scenarios/{name}.json")).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "stderr:\n{stderr}");
    assert!(out.stdout.is_empty(), "nothing runs on bad input");
    assert!(!sb.path().join("reports").exists(), "no report folder for a run that never started");
    stderr
}

#[test]
fn unknown_field_with_a_did_you_mean() {
    let stderr = rejected("typo", "{\n  \"data\": {\n    \"worker\": 4\n  }\n}\n", &[]);
    insta::assert_snapshot!(stderr);
}

#[test]
fn wrong_type() {
    let stderr = rejected("type", r#"{ "train": { "steps": "ten" } }"#, &[]);
    insta::assert_snapshot!(stderr);
}

#[test]
fn impossible_value() {
    let stderr = rejected("heads", "{\n  \"model\": { \"hidden\": 60, \"heads\": 8 }\n}\n", &[]);
    insta::assert_snapshot!(stderr);
}

#[test]
fn empty_depths() {
    let stderr = rejected("depths", "{\n  \"model\": { \"depths\": [] }\n}\n", &[]);
    insta::assert_snapshot!(stderr);
}

#[test]
fn a_cuda_cache_on_cpu_ranks() {
    let stderr =
        rejected("cache", r#"{ "launch": { "device": "cpu" }, "data": { "cache_device": "cuda" } }"#, &[]);
    insta::assert_snapshot!(stderr);
}

#[test]
fn bad_override() {
    let stderr = rejected("ok", "{}", &["--set", "data.workes=2"]);
    insta::assert_snapshot!(stderr);
}

#[test]
fn every_bad_file_is_reported_before_anything_runs() {
    let sb = Sandbox::new();
    sb.scenario("a-good", "{}");
    sb.scenario("b-bad", r#"{ "modle": {} }"#);
    sb.scenario("c-bad", r#"{ "expect": { "outcome": "crashed" } }"#);
    let out = sb.cmd().args(["run", "scenarios"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("b-bad.json") && stderr.contains("c-bad.json"), "{stderr}");
    assert!(!stderr.contains("a-good.json"), "{stderr}");
}

#[test]
fn a_missing_path_is_bad_input() {
    let sb = Sandbox::new();
    let out = sb.cmd().args(["run", "nope.json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    insta::assert_snapshot!(String::from_utf8_lossy(&out.stderr));
}

/// An option that describes a command (`--env`, `--cwd`, …) given with a scenario file would be
/// dropped without a word: refused, naming it and where a file says it.
#[test]
fn a_commands_option_with_a_scenario_file_is_refused_not_dropped() {
    let err = rejected("plain", &crate::util::tiny(""), &["--env", "A=1"]);
    assert!(err.contains("`--env` describes a command after `--`") && err.contains("`launch.env`"), "{err}");
}

/// Absurd numbers are refused at load time, with the field and a sane example, before any rank
/// starts (they used to panic the supervisor, abort the trainer, or start 41 of 100000 ranks).
#[test]
fn absurd_numbers_are_refused_before_anything_runs() {
    let body = "{\n  \"launch\": { \"mode\": \"ddp\", \"world_size\": 100000 }\n}\n";
    let mut all = rejected("huge", body, &[]);
    for set in ["limits.timeout_s=1e300", "limits.hang_after_s=1e300", "train.steps=4294967295"] {
        all.push_str(&rejected("ok", "{}", &["--set", set]));
    }
    insta::assert_snapshot!(all);
}

/// Every `params` error has a position: an empty key, and a file that is not UTF-8.
#[test]
fn an_empty_params_key_and_invalid_utf8_are_positioned() {
    let mut all = rejected(
        "params",
        "{\n  \"command\": [\"echo\", \"{x}\"],\n  \"params\": { \"x\": 1, \"\": 2 }\n}\n",
        &[],
    );
    let sb = Sandbox::new();
    let file = sb.scenario("latin1", "");
    std::fs::write(&file, b"{\n  \"command\": [\"echo\", \"caf\xe9\"]\n}\n").unwrap();
    let out = sb.cmd().arg("run").arg("scenarios/latin1.json").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    all.push_str(&String::from_utf8_lossy(&out.stderr));
    insta::assert_snapshot!(all);
}

/// An `--out` that cannot be written is the user's to fix (exit 2), found before anything runs.
#[test]
fn an_unwritable_out_folder_is_bad_input() {
    let sb = Sandbox::new();
    sb.scenario("ok", "{}");
    let blocker = sb.path().join("a-file");
    std::fs::write(&blocker, "").unwrap();
    let out =
        sb.cmd().arg("run").arg("scenarios/ok.json").arg("--out").arg(blocker.join("out")).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).replace(&sb.path().display().to_string(), "[sandbox]");
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    insta::assert_snapshot!(stderr);
}

/// `--help` ends with the exit statuses, as `ups_doctor::exit` defines them; so do the help of
/// `run`, `bisect` and `report`.
#[test]
fn help_lists_the_exit_statuses() {
    let sb = Sandbox::new();
    let help = |args: &[&str]| {
        // clap wraps help to `COLUMNS` when set: the snapshot is of a 100-column help.
        let out = sb.cmd().args(args).env("COLUMNS", "100").output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let top = help(&["--help"]);
    insta::assert_snapshot!(top);
    for command in ["run", "bisect", "report"] {
        let text = help(&[command, "--help"]);
        assert!(text.ends_with(&format!("{}\n", ups_doctor::exit::HELP)), "{command} --help:\n{text}");
    }
}
