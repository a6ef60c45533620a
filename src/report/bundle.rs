//! `ups-doctor report DIR --bundle`: one `.tar.gz` to attach to an issue: the report (and each
//! scenario's full report when it is a summary), `result.json`, `trace.json` and the tail of every
//! process's logs, all masked as `--public` masks ([`super::public`]: GPU UUIDs and the home
//! folder) and by the one rule for secrets ([`crate::secrets`]), the log tails included.
//!
//! What goes in is decided by [`contents`], pure over the run and the log text it is handed; the
//! archive is written by [`write_bundle`], the file edge.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::schema::RunResult;

use super::files::{REPORT_FILE, RESULT_FILE, ReportError, read_run, result_json, write_atomic};
use super::markdown::{is_summary, render_markdown, render_scenario_markdown, scenario_report_path};
use super::public::{home, mask, mask_text};
use super::trace::{TRACE_FILE, render_trace};

/// The archive's name, in the run folder.
pub const BUNDLE_FILE: &str = "ups-doctor-bundle.tar.gz";
/// Lines kept from the end of each log file.
pub const LOG_TAIL_LINES: usize = 200;

/// One file of the bundle: its path inside the archive and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub path: String,
    pub text: String,
}

/// The files of the bundle of `run` (already masked), in archive order, each with its secrets
/// masked. `read_log` returns the text of a log file named as `result.json` names it (relative to
/// the run folder), or `None` when it is gone; its last [`LOG_TAIL_LINES`] lines go in, masked
/// with `home`, else the tail `result.json` kept.
pub fn contents(
    run: &RunResult,
    home: Option<&str>,
    known: &[String],
    read_log: impl Fn(&str) -> Option<String>,
) -> Vec<Entry> {
    let mut out = vec![
        Entry { path: REPORT_FILE.into(), text: render_markdown(run) },
        Entry { path: RESULT_FILE.into(), text: result_json(run).expect("a run result always encodes") },
        Entry { path: TRACE_FILE.into(), text: render_trace(run) },
    ];
    if is_summary(run) {
        for i in 0..run.scenarios.len() {
            out.push(Entry { path: scenario_report_path(run, i), text: render_scenario_markdown(run, i) });
        }
    }
    let mut logs: Vec<(String, Option<&[String]>)> = Vec::new();
    for s in &run.scenarios {
        for r in &s.ranks {
            logs.push((r.stdout_log.clone(), None));
            logs.push((r.stderr_log.clone(), Some(&r.log_tail)));
        }
        if let Some(l) = s.external.as_ref().and_then(|e| e.launcher.as_ref()) {
            logs.push((l.stdout_log.clone(), None));
            logs.push((l.stderr_log.clone(), Some(&l.log_tail)));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for (name, kept) in logs {
        if name.is_empty() || !seen.insert(name.clone()) {
            continue;
        }
        let text = match read_log(&name) {
            Some(text) => tail(&text, LOG_TAIL_LINES),
            None => match kept {
                Some(lines) if !lines.is_empty() => {
                    format!("(the log file is gone; its tail as result.json kept it)\n{}\n", lines.join("\n"))
                }
                _ => continue,
            },
        };
        out.push(Entry { path: format!("logs/{}", archive_name(&name)), text: mask_text(&text, home) });
    }
    for e in out.iter_mut().filter(|e| e.path != RESULT_FILE) {
        // result.json is masked field by field by `result_json`.
        if let std::borrow::Cow::Owned(masked) = crate::secrets::mask_text_knowing(&e.text, known) {
            e.text = masked;
        }
    }
    out
}

/// The secret values the run's scenarios were given (each scenario folder's `scenario.json` keeps
/// them to run again; `result.json` has them masked): a program that printed one put it in its
/// logs, whose tails go into the bundle.
fn known_secrets(dir: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(dir) else { return Vec::new() };
    let mut known: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|e| fs::read_to_string(e.path().join("scenario.json")).ok())
        .filter_map(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .flat_map(|doc| crate::secrets::secret_values(&doc))
        .collect();
    known.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    known.dedup();
    known
}

/// The last `n` lines of `text`, with a first line saying how many were left out.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() <= n {
        return text.to_string();
    }
    let cut = lines.len() - n;
    format!(
        "(… {cut} earlier lines left out: the full log is in the run folder)\n{}\n",
        lines[cut..].join("\n")
    )
}

/// A log's path inside `logs/`: relative, without `..`, the folders kept (`1-ddp/rank0.stderr`).
fn archive_name(log: &str) -> String {
    let parts: Vec<&str> = Path::new(log)
        .components()
        .filter_map(|c| match c {
            std::path::Component::Normal(p) => p.to_str(),
            _ => None,
        })
        .collect();
    if parts.is_empty() { "log".into() } else { parts.join("/") }
}

/// Writes `DIR/ups-doctor-bundle.tar.gz` from the run in `dir`, masked, and returns its path and
/// the names of the files in it.
///
/// # Errors
///
/// As [`read_run`]; [`ReportError::Write`] when the archive cannot be written.
pub fn write_bundle(dir: &Path) -> Result<(PathBuf, Vec<String>), ReportError> {
    let path = dir.join(BUNDLE_FILE);
    let home = home();
    let run = read_run(dir)?;
    let run = mask(&run, home.as_deref())
        .map_err(|e| ReportError::Write { path: path.clone(), source: io::Error::other(e) })?;
    let read_log = |name: &str| {
        let p = Path::new(name);
        let p = if p.is_absolute() { p.to_path_buf() } else { dir.join(p) };
        fs::read(p).ok().map(|b| String::from_utf8_lossy(&b).into_owned())
    };
    let entries = contents(&run, home.as_deref(), &known_secrets(dir), read_log);
    let top = dir
        .canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "run".into());
    let bytes = archive(&format!("ups-doctor-{top}"), &entries)
        .map_err(|source| ReportError::Write { path: path.clone(), source })?;
    write_atomic(&path, &bytes)?;
    Ok((path, entries.into_iter().map(|e| e.path).collect()))
}

/// The entries as a gzip-compressed tar under the folder `top`.
fn archive(top: &str, entries: &[Entry]) -> io::Result<Vec<u8>> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let mtime = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    for e in entries {
        let mut header = tar::Header::new_gnu();
        header.set_size(e.text.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(mtime);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, format!("{top}/{}", e.path), e.text.as_bytes())?;
    }
    tar.into_inner()?.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures;

    #[test]
    fn logs_are_cut_to_their_tail_masked_and_a_missing_one_falls_back_to_the_kept_tail() {
        let mut run = fixtures::run(vec![fixtures::segv()]);
        run.scenarios[0].ranks[0].stderr_log = "1-segv/rank0.stderr".into();
        run.scenarios[0].ranks[1].stderr_log = "../elsewhere/rank1.stderr".into();
        run.scenarios[0].ranks[1].log_tail = vec!["kept line".into()];
        let long: String = (0..250)
            .map(|i| {
                format!("line {i} /home/ann/x GPU-2f6c1a3e-5b7d-4c8e-9f0a-1b2c3d4e5f60 HF_TOKEN=hf_abc{i}\n")
            })
            .collect();
        let entries = contents(&run, Some("/home/ann"), &[], |name| {
            (name == "1-segv/rank0.stderr").then(|| long.clone())
        });
        let names: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(&names[..3], ["report.md", "result.json", "trace.json"]);
        let r0 = entries.iter().find(|e| e.path == "logs/1-segv/rank0.stderr").expect("rank 0's log");
        assert!(r0.text.starts_with("(… 50 earlier lines left out"), "{}", &r0.text[..80]);
        assert!(r0.text.contains("line 249 ~/x GPU-<masked>") && !r0.text.contains("line 49 "));
        assert!(
            r0.text.contains("HF_TOKEN=<redacted>") && !r0.text.contains("hf_abc"),
            "{}",
            &r0.text[..200]
        );
        let r1 =
            entries.iter().find(|e| e.path == "logs/elsewhere/rank1.stderr").expect("rank 1's kept tail");
        assert!(r1.text.ends_with("kept line\n"));
    }
}
