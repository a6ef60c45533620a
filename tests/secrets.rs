//! Issue 57: the same planted secrets through every output ups-doctor writes (the terminal,
//! `result.json`, `report.md`, `trace.json`, `report --issue --public`, `report --bundle`, a sweep,
//! `attach PID` and `attach --all`), and none of them may appear anywhere: every byte of stdout
//! and stderr and every file written is searched. The rank logs (the program's own records) and
//! `scenario.json` (what runs again) are the documented exceptions (`src/secrets.rs`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::util::{Sandbox, eventually, files_under, unpack_bundle, venv_path};

/// A secret given with `--env`, under a name that says so.
const ENV_SECRET: &str = "s3cr3tvalue123";
/// Exported in ups-doctor's own environment (the user's shell), inherited by the program; short
/// enough not to be token-shaped (`hf_` and 20 characters), so only its name gives it away.
const HF_TOKEN: &str = "hf_sh0rtT0ken";
const WANDB_KEY: &str = "wandb0secret0value";
/// A URL password holding `/` and `+` (AWS secret keys and base64 do).
const URL_PASSWORD: &str = "abc/def+g==";
/// The payload of an OSC 52 clipboard write and an OSC 0 title.
const CLIPBOARD: &str = "c2VjcmV0Y2xpcA==";
const TITLE: &str = "pwned-title";
/// The value after `--api-key` in an attached job's command line.
const API_KEY: &str = "ak-planted-9731";

/// Every planted value, and the escape bytes that must never be written raw.
fn planted() -> Vec<&'static str> {
    vec![
        ENV_SECRET,
        HF_TOKEN,
        WANDB_KEY,
        URL_PASSWORD,
        "def+g==",
        CLIPBOARD,
        TITLE,
        API_KEY,
        "\u{1b}",
        "\u{7}",
    ]
}

/// The program: prints its token and a URL with a password, writes OSC sequences, then raises
/// an error quoting all of them (its key line).
const PROGRAM: &str = r#"
import base64, os, sys
E, B = chr(27), chr(7)
# Built here, so that the traceback's quote of this source does not hold them.
clip = base64.b64encode(b"secretclip").decode()
title = "pwned" + "-title"
osc = E + "]52;c;" + clip + B + " " + E + "]0;" + title + B + " " + E + "[31mred" + E + "[0m"
tok = os.environ["API_TOKEN"]
print("token is", tok, flush=True)
print("connecting to https://user:abc/def+g==@host/path", flush=True)
sys.stderr.write(osc + "\n")
raise RuntimeError("auth failed for " + tok + " hf " + os.environ["HF_TOKEN"] + " wandb " + os.environ["WANDB_API_KEY"] + " at https://user:abc/def+g==@host/path " + osc)
"#;

/// ups-doctor as the user's shell runs it: the tokens exported, the venv first on `PATH`.
fn doctor(sb: &Sandbox) -> Command {
    let mut cmd = sb.cmd();
    cmd.env("PATH", venv_path()).env("HF_TOKEN", HF_TOKEN).env("WANDB_API_KEY", WANDB_KEY);
    cmd
}

/// Where each planted value was found, as `what: value`.
fn leaks(what: &str, bytes: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes);
    planted().into_iter().filter(|p| text.contains(p)).map(|p| format!("{what}: {p:?}")).collect()
}

fn output_leaks(what: &str, out: &Output) -> Vec<String> {
    let mut found = leaks(&format!("{what} stdout"), &out.stdout);
    found.extend(leaks(&format!("{what} stderr"), &out.stderr));
    found
}

/// The documented exceptions: the program's own records and what runs again.
fn exception(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name == "scenario.json" || name.ends_with(".log") || name == "sitecustomize.py"
}

/// Every file under `dir` but the exceptions.
fn files(dir: &Path) -> Vec<PathBuf> {
    files_under(dir).into_iter().filter(|f| !exception(f)).collect()
}

fn file_leaks(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for f in files(dir) {
        // The bundle is unpacked and read file by file below.
        if f.extension().is_some_and(|e| e == "gz") {
            continue;
        }
        found.extend(leaks(&f.display().to_string(), &std::fs::read(&f).unwrap()));
    }
    found
}

#[test]
fn planted_secrets_appear_in_no_output_of_run_report_bundle_sweep_and_attach() {
    let sb = Sandbox::new();
    let program = sb.path().join("leaky.py");
    std::fs::write(&program, PROGRAM).unwrap();
    let mut found = Vec::new();

    // A real run: the headline, the key line, result.json, report.md, trace.json.
    let run = doctor(&sb)
        .args(["run", "--out"])
        .arg(sb.out())
        .args(["--env", &format!("API_TOKEN={ENV_SECRET}"), "--"])
        .arg("python")
        .arg(&program)
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(1), "the run fails: {}", String::from_utf8_lossy(&run.stderr));
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(err.contains("✗") && err.contains("key line:"), "the verdict is printed:\n{err}");
    if !err.contains("<redacted>") {
        found.push("run stderr: what the verdict quotes is not masked".to_string());
    }
    found.extend(output_leaks("run", &run));
    // The rank log is the program's own record: the values are there, as it wrote them.
    let logs: String =
        files_with_logs(&sb.out()).iter().map(|f| std::fs::read_to_string(f).unwrap()).collect();
    assert!(logs.contains(ENV_SECRET) && logs.contains(URL_PASSWORD), "the rank logs are left as written");

    // report --issue --public, then the bundle, unpacked.
    let issue = doctor(&sb).args(["report", "--issue", "--public"]).arg(sb.out()).output().unwrap();
    assert!(issue.status.success(), "{}", String::from_utf8_lossy(&issue.stderr));
    found.extend(output_leaks("report --issue --public", &issue));
    let bundle = doctor(&sb).args(["report", "--bundle"]).arg(sb.out()).output().unwrap();
    assert!(bundle.status.success(), "{}", String::from_utf8_lossy(&bundle.stderr));
    found.extend(output_leaks("report --bundle", &bundle));
    // In the bundle, log tails are masked too: no exception there.
    for f in unpack_bundle(&sb.out(), &sb.path().join("unpacked")) {
        found.extend(leaks(&format!("bundle {}", f.display()), &std::fs::read(&f).unwrap()));
    }
    found.extend(file_leaks(&sb.out()));

    // A tiny sweep of the same program: sweep.md, sweep.json, the cache, its `Failed:` line.
    let sweep_out = sb.path().join("sweep");
    let sweep = doctor(&sb)
        .args(["sweep", "--out"])
        .arg(&sweep_out)
        .args(["--warmup", "0", "--env", &format!("API_TOKEN={ENV_SECRET}"), "-L", "n", "1,2", "--"])
        .arg("python")
        .arg(&program)
        .arg("{n}")
        .output()
        .unwrap();
    assert!(sweep_out.join("sweep.json").is_file(), "{}", String::from_utf8_lossy(&sweep.stderr));
    found.extend(output_leaks("sweep", &sweep));
    found.extend(file_leaks(&sweep_out));

    // attach --all and attach PID of a running job whose argv holds the key and a URL password.
    // A launcher and its one rank, both with the key and the URL in their command lines.
    let launcher = "import os, subprocess, sys\n\
        env = dict(os.environ, RANK='0', LOCAL_RANK='0', WORLD_SIZE='1')\n\
        subprocess.run([sys.executable, '-c', 'import time; time.sleep(120)'] + sys.argv[1:], env=env)";
    let mut job = Command::new("python")
        .args(["-c", launcher, "--api-key", API_KEY])
        .arg(format!("https://user:{URL_PASSWORD}@host/path"))
        .env("PATH", venv_path())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let listed = eventually(Duration::from_secs(20), || {
        let all = doctor(&sb).args(["attach", "--all"]).output().unwrap();
        let seen = String::from_utf8_lossy(&all.stdout).contains(&format!("pid {}:", job.id()));
        if seen {
            found.extend(output_leaks("attach --all", &all));
        }
        seen
    });
    let attach_out = sb.path().join("attach");
    let attached = doctor(&sb)
        .args(["attach", &job.id().to_string(), "--watch", "1", "--out"])
        .arg(&attach_out)
        .output();
    let _ = job.kill();
    let _ = job.wait();
    assert!(listed, "attach --all lists the job");
    let attached = attached.unwrap();
    assert!(attach_out.join("attach.json").is_file(), "{}", String::from_utf8_lossy(&attached.stderr));
    found.extend(output_leaks("attach PID", &attached));
    found.extend(file_leaks(&attach_out));

    assert!(found.is_empty(), "planted secrets or escape bytes written:\n{}", found.join("\n"));
}

/// The rank and launcher logs of a run folder.
fn files_with_logs(dir: &Path) -> Vec<PathBuf> {
    files_under(dir).into_iter().filter(|f| f.extension().is_some_and(|e| e == "log")).collect()
}
