//! `ups-doctor report DIR --bundle`: a real run, then the real binary writing the archive, read
//! back with `tar`: every file an issue needs is in it, and the home folder is masked in all of
//! them as `--public` masks it.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{RunOutput, Sandbox, tiny, unpack_bundle};

/// Two DDP ranks, rank 1 exiting with an error as expected: a run folder with logs to bundle.
fn exit_run(sb: &Sandbox) -> RunOutput {
    let body = tiny(
        r#""launch": {"mode": "ddp", "world_size": 2},
           "inject": [{"fault": "exit_error", "phase": "forward", "step": 2, "rank": 1}],
           "expect": {"outcome": "exited", "rank": 1}"#,
    );
    let file = sb.scenario("exit", &body);
    let run = sb.run(&[&file], &[]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    run
}

#[test]
fn the_bundle_holds_report_result_trace_and_every_log_tail_masked() {
    let sb = Sandbox::new();
    // The sandbox plays the user's home folder: every path of the run lies under it.
    let home = sb.path().canonicalize().unwrap();
    let run = exit_run(&sb);
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

/// Issue 57: a link planted in place of a rank log, and `result.json` log paths that are absolute
/// or climb out with `..`, put none of what they point at into the bundle; the bundle says what it
/// left out and why.
#[test]
fn the_bundle_takes_only_regular_files_inside_the_run_folder_and_says_what_it_left_out() {
    let sb = Sandbox::new();
    let run = exit_run(&sb);
    let key = "-----BEGIN OPENSSH PRIVATE KEY----- planted";
    let private = sb.path().join("id_ed25519");
    std::fs::write(&private, format!("{key}\n")).unwrap();
    let outside = sb.path().join("outside.txt");
    std::fs::write(&outside, "planted-outside-content\n").unwrap();
    // Rank 0's stderr log becomes a link to the key; rank 1's logs point outside the folder.
    let name0 = run.rank(0)["stderr_log"].as_str().unwrap().to_string();
    let log0 = if Path::new(&name0).is_absolute() { PathBuf::from(&name0) } else { sb.out().join(&name0) };
    std::fs::remove_file(&log0).unwrap();
    std::os::unix::fs::symlink(&private, &log0).unwrap();
    let result_path = sb.out().join("result.json");
    let mut result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&result_path).unwrap()).unwrap();
    result["scenarios"][0]["ranks"][1]["stdout_log"] = "/etc/passwd".into();
    result["scenarios"][0]["ranks"][1]["stderr_log"] = "../outside.txt".into();
    std::fs::write(&result_path, serde_json::to_string_pretty(&result).unwrap()).unwrap();

    let out = sb.cmd().arg("report").arg(sb.out()).arg("--bundle").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let mut texts = String::new();
    for f in unpack_bundle(&sb.out(), &sb.path().join("unpacked")) {
        let kind = std::fs::symlink_metadata(&f).unwrap().file_type();
        assert!(kind.is_file(), "{} is not a regular file", f.display());
        texts.push_str(&std::fs::read_to_string(&f).unwrap());
    }
    assert!(!texts.contains("PRIVATE KEY"), "the planted link's target is in the bundle");
    assert!(!texts.contains("root:x:0:0"), "/etc/passwd is in the bundle");
    assert!(!texts.contains("planted-outside-content"), "a file outside the run folder is in the bundle");
    // Said on stderr, each with why.
    for (what, why) in [(name0.as_str(), "link"), ("/etc/passwd", "outside"), ("../outside.txt", "outside")] {
        let said = stderr.lines().any(|l| l.contains("left out") && l.contains(what) && l.contains(why));
        assert!(said, "`{what}` ({why}) is not said to be left out:\n{stderr}");
    }
    // What it left out is listed in the bundle too.
    assert!(texts.contains("Left out of this bundle"), "{texts}");
}
