//! `ups-doctor report DIR --bundle`: a real run, then the real binary writing the archive, read
//! back with `tar`: every file an issue needs is in it, and the home folder is masked in all of
//! them as `--public` masks it.

use std::process::Command;

use crate::util::{Sandbox, tiny};

#[test]
fn the_bundle_holds_report_result_trace_and_every_log_tail_masked() {
    let sb = Sandbox::new();
    let body = tiny(
        r#""launch": {"mode": "ddp", "world_size": 2},
           "inject": [{"fault": "exit_error", "phase": "forward", "step": 2, "rank": 1}],
           "expect": {"outcome": "exited", "rank": 1}"#,
    );
    let file = sb.scenario("exit", &body);
    // The sandbox plays the user's home folder: every path of the run lies under it.
    let home = sb.path().canonicalize().unwrap();
    let run = sb.run(&[&file], &[]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    let raw = std::fs::read_to_string(sb.out().join("result.json")).unwrap();
    assert!(raw.contains(home.to_str().unwrap()), "the unmasked result names the home folder");

    let out = sb.cmd().env("HOME", &home).arg("report").arg(sb.out()).arg("--bundle").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bundle = sb.out().join("ups-doctor-bundle.tar.gz");
    // stdout: the re-rendered report's path, then the bundle's.
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().last(), bundle.to_str());

    let list = Command::new("tar").arg("-tzf").arg(&bundle).output().expect("tar runs");
    assert!(list.status.success(), "{}", String::from_utf8_lossy(&list.stderr));
    let names: Vec<String> = String::from_utf8_lossy(&list.stdout).lines().map(str::to_string).collect();
    for want in ["report.md", "result.json", "trace.json"] {
        assert!(names.iter().any(|n| n == &format!("ups-doctor-out/{want}")), "{want} missing: {names:#?}");
    }
    for rank in 0..2 {
        let log = run.rank(rank)["stderr_log"].as_str().unwrap().to_string();
        let rel = log.strip_prefix(sb.out().to_str().unwrap()).unwrap_or(&log).trim_start_matches('/');
        assert!(
            names.iter().any(|n| n.ends_with(rel)),
            "rank {rank}'s log `{log}` is not in the bundle: {names:#?}"
        );
    }

    // Unpacked, nothing names the home folder; result.json says `~` instead.
    let unpacked = sb.path().join("unpacked");
    std::fs::create_dir_all(&unpacked).unwrap();
    let x = Command::new("tar").arg("-xzf").arg(&bundle).arg("-C").arg(&unpacked).status().unwrap();
    assert!(x.success());
    let mut masked_seen = false;
    for name in &names {
        let path = unpacked.join(name);
        if !path.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(home.to_str().unwrap()), "{name} names the home folder");
        masked_seen |= text.contains("~/");
    }
    assert!(masked_seen, "no masked path in the bundle");
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(unpacked.join("ups-doctor-out/result.json")).unwrap())
            .unwrap();
    assert_eq!(result["scenarios"][0]["ranks"][1]["outcome"], "exited");
}
