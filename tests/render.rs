//! Reports rendered the way GitHub shows them, in a real browser: real runs of shipped scenarios
//! with failures (among them `fsdp-inplace-view`, whose verdict quotes libtorch's C++ text), an
//! external run with real PyTorch under torchrun, and a real bisect, plus the committed examples,
//! are rendered by `tests/render/render.mjs` (GitHub-flavoured markdown through micromark, every
//! mermaid block through mermaid 10 and 11, light and dark theme, in Debian's chromium, with the
//! viewer in `Africa/Monrovia`, whose offset at the epoch was -0:44:30). It fails on any mermaid
//! error, raw HTML GitHub would strip, broken emphasis, a chart line under 3:1 contrast, a gantt
//! bar that does not show or an axis label that misreads the time, and a report meant for pasting
//! longer than one GitHub comment.
//!
//! `./x test` installs what it needs (`apt-get install chromium`, `npm ci` in `tests/render/`).
//! `UPS_DOCTOR_RENDER_SHOTS=DIR` also writes screenshots of every report and chart into DIR.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{Sandbox, repo, venv_path};

fn render_dir() -> PathBuf {
    repo().join("tests/render")
}

/// Runs render.mjs on `files`; `paste` are those meant to be pasted whole into an issue.
fn render(files: &[PathBuf], paste: &[PathBuf]) -> (bool, String) {
    let dir = render_dir();
    assert!(
        dir.join("node_modules/puppeteer-core").is_dir() && dir.join("node_modules/mermaid11").is_dir(),
        "the render test's npm packages are not installed in {}: run ./x test (it runs `npm ci` there)",
        dir.display()
    );
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&chromium).exists(),
        "no chromium at {chromium}: run ./x test (apt-get install chromium)"
    );
    let mut cmd = Command::new("node");
    cmd.current_dir(&dir).arg("render.mjs").args(["--tz", "Africa/Monrovia"]).env("CHROMIUM", &chromium);
    if let Some(shots) = std::env::var_os("UPS_DOCTOR_RENDER_SHOTS") {
        cmd.arg("--screenshots").arg(shots);
    }
    for p in paste {
        cmd.arg("--paste").arg(p);
    }
    cmd.args(files);
    let out = cmd.output().expect("node runs (apt-get install nodejs)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.code().is_some_and(|c| c < 2), "render.mjs could not run:\n{text}");
    (out.status.success(), text)
}

/// Every `.md` under `dir`.
fn markdown_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(markdown_files(&path));
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
    out.sort();
    out
}

#[test]
fn real_reports_render_on_github_without_a_defect() {
    let sb = Sandbox::new();
    let scenarios = repo().join("scenarios");
    // Shipped scenarios with failures, one passing: several, so report.md is a summary.
    let shipped = sb.path().join("shipped");
    let run = sb
        .cmd()
        .arg("run")
        .args(
            ["fsdp-inplace-view", "ddp-rank1-segv", "loader-worker-killed", "train-cpu"]
                .map(|n| scenarios.join(format!("{n}.json"))),
        )
        .arg("--out")
        .arg(&shipped)
        .arg("--quiet")
        .output()
        .unwrap();
    assert_eq!(
        run.status.code(),
        Some(0),
        "every expectation is met:\n{}",
        String::from_utf8_lossy(&run.stderr)
    );

    // What a user pastes: report.md itself, with the failed scenarios' full reports to attach.
    let issue = sb.cmd().arg("report").arg(&shipped).arg("--issue").output().unwrap();
    assert_eq!(issue.status.code(), Some(0), "{}", String::from_utf8_lossy(&issue.stderr));
    let summary = std::fs::read_to_string(shipped.join("report.md")).unwrap();
    assert_eq!(String::from_utf8_lossy(&issue.stdout), summary);
    let told = String::from_utf8_lossy(&issue.stderr);
    for attach in [
        "1-fsdp-inplace-view/report.md",
        "2-ddp-rank1-segv/report.md",
        "3-loader-worker-killed/report.md",
        "result.json",
    ] {
        assert!(told.contains(&shipped.join(attach).display().to_string()), "{attach} to attach:\n{told}");
        assert!(shipped.join(attach).is_file(), "{attach}");
    }
    assert!(!told.contains("4-train-cpu"), "a passing scenario is not attached:\n{told}");
    assert!(shipped.join("4-train-cpu/report.md").is_file());
    assert!(
        summary.contains("Output 0 of ViewBackward0"),
        "the summary holds the failing verdicts:\n{summary}"
    );

    // An external program with real PyTorch under torchrun.
    let external = sb.path().join("external");
    let run = sb
        .cmd()
        .env("PATH", venv_path())
        .arg("run")
        .arg(scenarios.join("external/ddp-torchrun-rank1-segv.json"))
        .arg("--out")
        .arg(&external)
        .arg("--quiet")
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(0), "{}", String::from_utf8_lossy(&run.stderr));

    // A bisect.
    let bisect = sb.path().join("bisect");
    let run = sb
        .cmd()
        .arg("bisect")
        .arg(scenarios.join("segv-needs-conditioning.json"))
        .arg("--out")
        .arg(&bisect)
        .arg("--cache")
        .arg(sb.path().join("cache"))
        .args(["--quiet", "--confirm", "1"])
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(0), "{}", String::from_utf8_lossy(&run.stderr));

    // A sweep of two points: its table and its bar charts.
    let sweep = sb.path().join("sweep");
    let file = sb.scenario("sweep", &crate::util::tiny(""));
    let run = sb
        .cmd()
        .arg("sweep")
        .arg(&file)
        .args(["--vary", "data.workers=0,1", "--runs", "1", "--warmup", "0", "--quiet", "--out"])
        .arg(&sweep)
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(0), "{}", String::from_utf8_lossy(&run.stderr));
    let sweep_md = std::fs::read_to_string(sweep.join("sweep.md")).unwrap();
    assert!(sweep_md.contains("## Charts") && sweep_md.matches("xychart-beta").count() == 2, "{sweep_md}");

    let paste = vec![
        shipped.join("report.md"),
        external.join("report.md"),
        bisect.join("bisect.md"),
        sweep.join("sweep.md"),
    ];
    let mut files = markdown_files(&shipped);
    files.extend(markdown_files(&external));
    files.push(bisect.join("bisect.md"));
    files.push(sweep.join("sweep.md"));
    // The committed examples, as they are (re-generated with the reports they show).
    let examples = repo().join("reports/examples");
    let example_files = markdown_files(&examples);
    let example_paste: Vec<PathBuf> = example_files
        .iter()
        .filter(|p| {
            let rel = p.strip_prefix(&examples).unwrap();
            rel.components().count() == 2 // <example>/report.md or <example>/bisect.md
        })
        .cloned()
        .collect();
    files.extend(example_files);
    let all_paste: Vec<PathBuf> = paste.into_iter().chain(example_paste).collect();
    let (ok, text) = render(&files, &all_paste);
    assert!(ok, "GitHub would show these reports wrong:\n{text}");
}
