//! Reliability and safety through the real binary: ups-doctor signals only its own processes,
//! and an interruption or a hostile input never loses or falsifies a result.

mod util;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use util::{Sandbox, alive, eventually, repo, venv_python};

/// `setsid sleep 600`: a process of nobody's run. Killed and reaped on drop.
struct Unrelated(Child);

impl Unrelated {
    fn start() -> Unrelated {
        Unrelated(
            Command::new("setsid")
                .args(["sleep", "600"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("setsid sleep starts"),
        )
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Starts one on exactly `pid` (a recycled pid), through `ns_last_pid`; other processes
    /// being created at the same moment can take it first, so this tries again until it lands.
    fn start_on(pid: u32) -> Unrelated {
        for _ in 0..200 {
            std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string())
                .expect("root may set ns_last_pid");
            let u = Unrelated::start();
            if u.pid() == pid {
                return u;
            }
        }
        panic!("could not start a process on pid {pid}");
    }
}

impl Drop for Unrelated {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn forged_worker_markers_never_get_an_unrelated_process_killed() {
    let sb = Sandbox::new();
    let bystander = Unrelated::start();
    let handshake = sb.path().join("handshake");
    std::fs::create_dir_all(&handshake).unwrap();
    let python = venv_python();
    let forge = repo().join("tests/programs/forge_markers.py");
    let file = sb.scenario(
        "forger",
        &format!(
            r#"{{"command": ["{}", "{}", "{}", "{}"], "limits": {{"timeout_s": 300, "hang_after_s": 200}},
                "expect": {{"completes_when": "done"}}}}"#,
            python.display(),
            forge.display(),
            bystander.pid(),
            handshake.display()
        ),
    );
    let run = sb
        .cmd()
        .arg("run")
        .arg(&file)
        .arg("--out")
        .arg(sb.out())
        .args(["--json", "--quiet"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let recycled_file = handshake.join("recycled_pid");
    assert!(eventually(Duration::from_secs(120), || recycled_file.exists()), "the forger never got going");
    let recycled: u32 = std::fs::read_to_string(&recycled_file).unwrap().trim().parse().unwrap();
    let impostor = Unrelated::start_on(recycled);
    std::fs::write(handshake.join("go"), "").unwrap();
    let output = run.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(alive(bystander.pid() as u64), "the process a forged marker named was killed:\n{stderr}");
    assert!(alive(impostor.pid() as u64), "the process on a worker's recycled pid was killed:\n{stderr}");
    let result: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("no result ({e}); stderr:\n{stderr}"));
    let scenario = &result["scenarios"][0];
    let leftovers = scenario["leftovers"]["processes"].as_array().cloned().unwrap_or_default();
    assert!(
        leftovers.iter().all(|p| p["pid"] != bystander.pid() && p["pid"] != impostor.pid()),
        "a foreign process was reported as a leftover of the run: {leftovers:?}"
    );
    let rank = &scenario["ranks"][0];
    assert_eq!(rank["foreign_pids"], serde_json::json!([bystander.pid()]), "rank: {rank}");
    assert!(rank["bad_markers"].as_u64() >= Some(1));
    let report = std::fs::read_to_string(sb.out().join("report.md")).unwrap();
    assert!(
        report.contains(&format!("claimed process {} as its data-loader worker", bystander.pid())),
        "report:\n{report}"
    );
}
