//! What a user already has is never lost (issue 57): a second run given the folder of a run that
//! is still going is refused before it writes anything, and the first run's result stays its own.

use std::process::Stdio;
use std::time::Duration;

use crate::util::{Sandbox, eventually};

/// Two runs at once with the same `--out`: the failed run lost its result and logs, and the
/// folder said "Passed". Now the second is refused (exit 2, naming the folder and the fix) while
/// the first runs, and the first's result is its own.
#[test]
fn a_second_run_into_the_folder_of_a_live_run_is_refused_and_the_first_keeps_its_result() {
    let sb = Sandbox::new();
    let out = sb.out();
    let gate = sb.path().join("go");
    // The first run's program waits for the test's word, then fails with status 3.
    let program = format!(
        "import os, sys, time\nwhile not os.path.exists({gate:?}):\n    time.sleep(0.05)\nsys.exit(3)\n",
        gate = gate.display().to_string()
    );
    let mut first = sb
        .cmd()
        .args(["run", "--quiet", "--timeout", "120", "--out"])
        .arg(&out)
        .args(["--", "python3", "-c", &program])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = eventually(Duration::from_secs(60), || out.join("scenario.json").is_file());
    assert!(started, "the first run never wrote its scenario.json");
    let second = sb.cmd().args(["run", "--quiet", "--out"]).arg(&out).args(["--", "true"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "`--out {}` is the folder of another ups-doctor run that is still running",
            out.display()
        )) && stderr.contains("give this run a folder of its own"),
        "{stderr}"
    );
    std::fs::write(&gate, "").unwrap();
    assert_eq!(first.wait().unwrap().code(), Some(1), "the first run failed its expectation");
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("result.json")).unwrap()).unwrap();
    let s = &result["scenarios"][0];
    assert_eq!(
        (s["outcome"].as_str(), s["ranks"][0]["exit_code"].as_i64()),
        (Some("exited"), Some(3)),
        "{s:#}"
    );
    // Once it has ended, the folder is free again.
    let third = sb.cmd().args(["run", "--quiet", "--out"]).arg(&out).args(["--", "true"]).output().unwrap();
    assert_eq!(third.status.code(), Some(0), "{}", String::from_utf8_lossy(&third.stderr));
}

/// One argument of about 66,000 characters or more emptied `report.md` to its title and a note
/// (it was cut to fit a GitHub comment, and the command line filled it). Now the report shows such
/// an argument cut, with its length, and keeps its verdict; `scenario.json` keeps it whole.
#[test]
fn a_huge_argument_leaves_the_report_its_verdict_and_scenario_json_the_whole_command() {
    let sb = Sandbox::new();
    let huge = "x".repeat(70_000);
    let out = sb.run(&[], &["--", "python3", "-c", "import sys; sys.exit(2)", &huge]);
    assert_eq!(out.code(), 1, "{}", out.stderr());
    let report = std::fs::read_to_string(sb.out().join("report.md")).unwrap();
    assert!(report.len() < 65_536, "{} bytes", report.len());
    assert!(report.contains("exited with status 2"), "the verdict is in the report:\n{report}");
    assert!(report.contains("…[70000 characters in all]"), "{report}");
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(sb.out().join("scenario.json")).unwrap()).unwrap();
    assert_eq!(saved["command"][3].as_str().map(str::len), Some(70_000), "scenario.json re-runs it whole");
}
