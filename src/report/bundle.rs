//! `ups-doctor report DIR --bundle`: one `.tar.gz` to attach to an issue: the report (and each
//! scenario's full report when it is a summary), `result.json`, `trace.json` and the tail of every
//! process's logs, all masked as `--public` masks ([`super::public`]: GPU UUIDs and the home
//! folder) and by the one rule for secrets ([`crate::secrets`]), the log tails included.
//!
//! What goes in is decided by [`contents`], pure over the run and the log text it is handed; the
//! archive is written by [`write_bundle`], the file edge. A log goes in only as a regular file
//! inside the run folder, opened without following a link ([`read_log`]): a link planted in place
//! of a rank log, a name in `result.json` that is absolute or climbs out with `..`, or one that
//! reaches outside through a linked folder is left out, and the bundle says so (`left-out.txt` in
//! it, and a line on stderr for each).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::schema::RunResult;

use super::files::{REPORT_FILE, RESULT_FILE, ReportError, read_run, result_json, write_atomic};
use super::markdown::{is_summary, render_markdown, render_scenario_markdown, scenario_report_path};
use super::public::{home, mask, mask_text};
use super::trace::{TRACE_FILE, trace_value};

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
/// masked, and what was left out, each as `NAME: why`. `read_log` returns the text of a log file
/// named as `result.json` names it (relative to the run folder), `Ok(None)` when it is gone, or
/// why it may not go in; its last [`LOG_TAIL_LINES`] lines go in, masked with `home`, else (when
/// it is gone) the tail `result.json` kept.
pub fn contents(
    run: &RunResult,
    home: Option<&str>,
    known: &[String],
    read_log: impl Fn(&str) -> Result<Option<String>, String>,
) -> (Vec<Entry>, Vec<String>) {
    let mut out = vec![
        Entry { path: REPORT_FILE.into(), text: render_markdown(run) },
        Entry { path: RESULT_FILE.into(), text: result_json(run).expect("a run result always encodes") },
        Entry {
            path: TRACE_FILE.into(),
            text: super::files::json_text(&trace_value(run), false).expect("a trace always encodes"),
        },
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
    let mut left_out = Vec::new();
    for (name, kept) in logs {
        if name.is_empty() || !seen.insert(name.clone()) {
            continue;
        }
        let text = match read_log(&name) {
            Ok(Some(text)) => tail(&text, LOG_TAIL_LINES),
            Err(why) => {
                left_out.push(format!("{name}: {why}"));
                continue;
            }
            Ok(None) => match kept {
                Some(lines) if !lines.is_empty() => {
                    format!("(the log file is gone; its tail as result.json kept it)\n{}\n", lines.join("\n"))
                }
                _ => continue,
            },
        };
        out.push(Entry { path: format!("logs/{}", archive_name(&name)), text: mask_text(&text, home) });
    }
    for e in out.iter_mut().filter(|e| e.path != RESULT_FILE && e.path != TRACE_FILE) {
        // result.json and trace.json are masked field by field by `json_text`.
        if let std::borrow::Cow::Owned(masked) = crate::secrets::mask_text_knowing(&e.text, known) {
            e.text = masked;
        }
    }
    if !left_out.is_empty() {
        let text = format!(
            "Left out of this bundle (only regular files inside the run folder go in):\n{}\n",
            left_out.iter().map(|l| format!("- {l}")).collect::<Vec<_>>().join("\n")
        );
        out.push(Entry { path: LEFT_OUT_FILE.into(), text: mask_text(&text, home) });
    }
    (out, left_out)
}

/// The bundle's list of what it left out, and why.
pub const LEFT_OUT_FILE: &str = "left-out.txt";

/// The text of the log `name` (as `result.json` names it) of the run folder `dir`: `Ok(None)` when
/// it is gone, or why it may not go into a bundle: an absolute name or one with `..`, a symbolic
/// link (opened with `O_NOFOLLOW`, never followed), anything but a regular file, or a file whose
/// real path is not inside the run folder (a linked folder on the way).
fn read_log(dir: &Path, name: &str) -> Result<Option<String>, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let rel = Path::new(name);
    if rel.is_absolute() {
        return Err("an absolute path, outside the run folder".into());
    }
    if rel.components().any(|c| !matches!(c, std::path::Component::Normal(_) | std::path::Component::CurDir))
    {
        return Err("a path with `..`, outside the run folder".into());
    }
    let path = dir.join(rel);
    let mut file = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err("a symbolic link, not followed".into());
        }
        Err(e) => return Err(format!("could not be opened: {e}")),
    };
    let meta = file.metadata().map_err(|e| format!("could not be read: {e}"))?;
    if !meta.file_type().is_file() {
        return Err("not a regular file".into());
    }
    let inside = match (path.canonicalize(), dir.canonicalize()) {
        (Ok(real), Ok(top)) => real.starts_with(&top),
        _ => false,
    };
    if !inside {
        return Err("its real path is outside the run folder (a linked folder on the way)".into());
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(|e| format!("could not be read: {e}"))?;
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
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

/// What [`write_bundle`] wrote: the archive, the names of the files in it, and the logs it left
/// out, each as `NAME: why`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    pub path: PathBuf,
    pub files: Vec<String>,
    pub left_out: Vec<String>,
}

/// Writes `DIR/ups-doctor-bundle.tar.gz` from the run in `dir`, masked.
///
/// # Errors
///
/// As [`read_run`]; [`ReportError::Write`] when the archive cannot be written.
pub fn write_bundle(dir: &Path) -> Result<Bundle, ReportError> {
    let path = dir.join(BUNDLE_FILE);
    let home = home();
    let run = read_run(dir)?;
    let run = mask(&run, home.as_deref())
        .map_err(|e| ReportError::Write { path: path.clone(), source: io::Error::other(e) })?;
    let (entries, left_out) =
        contents(&run, home.as_deref(), &known_secrets(dir), |name| read_log(dir, name));
    let top = dir
        .canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "run".into());
    let bytes = archive(&format!("ups-doctor-{top}"), &entries)
        .map_err(|source| ReportError::Write { path: path.clone(), source })?;
    write_atomic(&path, &bytes)?;
    Ok(Bundle { path, files: entries.into_iter().map(|e| e.path).collect(), left_out })
}

/// The entries as a gzip-compressed tar under the folder `top`: the bundle's file sink, where
/// each text entry passes the one rule for secrets ([`crate::secrets::scrub`]; the JSON ones,
/// made by [`super::files::json_text`], passed it as documents).
fn archive(top: &str, entries: &[Entry]) -> io::Result<Vec<u8>> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let mtime = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    for e in entries {
        let text =
            if e.path.ends_with(".json") { e.text.as_str().into() } else { crate::secrets::scrub(&e.text) };
        let mut header = tar::Header::new_gnu();
        header.set_size(text.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(mtime);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, format!("{top}/{}", e.path), text.as_bytes())?;
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
        let (entries, left_out) = contents(&run, Some("/home/ann"), &[], |name| {
            Ok((name == "1-segv/rank0.stderr").then(|| long.clone()))
        });
        assert!(left_out.is_empty(), "{left_out:?}");
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

    /// Issue 57, defect 4: only regular files inside the run folder are read, never through a link.
    #[test]
    fn logs_outside_the_run_folder_links_and_other_files_are_refused_with_why() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("run");
        fs::create_dir_all(dir.join("1-a")).unwrap();
        fs::write(dir.join("1-a/rank0.stderr.log"), "fine\n").unwrap();
        fs::write(top.path().join("key"), "PRIVATE KEY\n").unwrap();
        std::os::unix::fs::symlink(top.path().join("key"), dir.join("1-a/rank1.stderr.log")).unwrap();
        std::os::unix::fs::symlink(top.path(), dir.join("up")).unwrap();
        let fifo = std::ffi::CString::new(dir.join("1-a/fifo").to_str().unwrap()).unwrap();
        // SAFETY: a plain mkfifo(3) call on a path this test owns.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert_eq!(read_log(&dir, "1-a/rank0.stderr.log"), Ok(Some("fine\n".to_string())));
        assert_eq!(read_log(&dir, "1-a/gone.log"), Ok(None));
        for (name, why) in [
            ("1-a/rank1.stderr.log", "symbolic link"),
            ("/etc/passwd", "absolute path"),
            ("../key", "`..`"),
            ("1-a/../../key", "`..`"),
            ("up/key", "outside the run folder"),
            ("1-a/fifo", "not a regular file"),
        ] {
            let got = read_log(&dir, name);
            assert!(got.as_ref().is_err_and(|e| e.contains(why)), "{name}: {got:?}");
        }
    }
}
