//! Bounded capture of a child's stdout/stderr into a file.
//!
//! A reader thread drains the pipe continuously, so a noisy rank never blocks on a full pipe.
//! The file keeps the first [`HEAD_LIMIT`] bytes; past that, bytes are counted and only the last
//! [`TAIL_LIMIT`] are kept in memory and appended at the end, so a flood can neither fill the disk
//! nor exhaust memory, and the beginning and the end (where the error usually is) both survive.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::thread::JoinHandle;

/// Bytes written to the log file before it switches to keeping only the tail.
pub const HEAD_LIMIT: u64 = 8 << 20;
/// Bytes of the most recent output always kept in memory.
pub const TAIL_LIMIT: usize = 64 << 10;

/// What was captured from one stream.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Captured {
    pub total_bytes: u64,
    pub dropped_bytes: u64,
    /// The last [`TAIL_LIMIT`] bytes, lossily decoded.
    pub tail: String,
    /// A line matched the watched pattern.
    pub matched: bool,
    /// The log file could not be written (in full): `could not write `PATH`: CAUSE`; the file
    /// then ends with a note saying where it was cut.
    pub write_error: Option<String>,
}

impl Captured {
    /// The last `n` non-empty lines of the tail.
    pub fn last_lines(&self, n: usize) -> Vec<String> {
        let lines: Vec<&str> = self.tail.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(n)..].iter().map(|l| l.to_string()).collect()
    }
}

/// What to watch for while draining, besides keeping the bytes.
#[derive(Default)]
pub struct Watch {
    /// Called when output arrives, at most every [`ACTIVITY_EVERY`] (output counts as a sign of
    /// life for programs without markers): with the process a line came from where
    /// [`Watch::origin`] is given (`None` for a line that names none), per line.
    pub on_output: Option<Box<dyn FnMut(Option<u32>) + Send>>,
    /// A line matching this sets [`Captured::matched`] (`expect.completes_when.stdout`).
    pub pattern: Option<regex::Regex>,
    /// Which process a line of the stream is from, where the stream relays several (a cluster's
    /// launcher prefixes each worker's line with the worker's pid).
    pub origin: Option<Origin>,
}

/// Which process a line of a stream came from.
#[derive(Clone)]
pub struct Origin(pub std::sync::Arc<dyn Fn(&str) -> Option<u32> + Send + Sync>);

impl std::fmt::Debug for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Origin(…)")
    }
}

/// The least time between two activity reports of one stream.
pub const ACTIVITY_EVERY: std::time::Duration = std::time::Duration::from_millis(200);
/// The longest line the pattern is tried on; longer lines are cut.
const MAX_WATCHED_LINE: usize = 64 << 10;

/// Starts draining `stream` into `path`, reporting activity and pattern matches.
pub fn drain_watching(
    stream: impl Read + Send + 'static,
    path: PathBuf,
    watch: Watch,
) -> JoinHandle<Captured> {
    std::thread::spawn(move || drain_blocking_watching(stream, path, watch))
}

#[cfg(test)]
fn drain_blocking(stream: impl Read, path: PathBuf) -> Captured {
    drain_blocking_watching(stream, path, Watch::default())
}

fn drain_blocking_watching(mut stream: impl Read, path: PathBuf, mut watch: Watch) -> Captured {
    let mut matched = false;
    let mut line: Vec<u8> = Vec::new();
    let mut reported: Option<std::time::Instant> = None;
    let mut reported_from: std::collections::HashMap<u32, std::time::Instant> = Default::default();
    let mut log = Log::create(path);
    let mut tail: VecDeque<u8> = VecDeque::with_capacity(TAIL_LIMIT);
    let mut total = 0u64;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let chunk = &buf[..n];
        if let Some(report) = watch.on_output.as_mut().filter(|_| watch.origin.is_none())
            && reported.is_none_or(|at| at.elapsed() >= ACTIVITY_EVERY)
        {
            report(None);
            reported = Some(std::time::Instant::now());
        }
        let by_line = watch.origin.is_some() && watch.on_output.is_some();
        if by_line || (watch.pattern.is_some() && !matched) {
            for &byte in chunk {
                if byte != b'\n' {
                    if line.len() < MAX_WATCHED_LINE {
                        line.push(byte);
                    }
                    continue;
                }
                let text = String::from_utf8_lossy(&line);
                let text = text.trim_end_matches('\r');
                if let Some(pattern) = watch.pattern.as_ref().filter(|_| !matched) {
                    matched |= pattern.is_match(text);
                }
                if let (Some(origin), Some(report)) = (watch.origin.as_ref(), watch.on_output.as_mut()) {
                    let from = (origin.0)(text);
                    // A line that names no process is the stream's own (`u32::MAX` in the throttle).
                    let key = from.unwrap_or(u32::MAX);
                    if reported_from.get(&key).is_none_or(|at| at.elapsed() >= ACTIVITY_EVERY) {
                        report(from);
                        reported_from.insert(key, std::time::Instant::now());
                    }
                }
                line.clear();
            }
        }
        if total < HEAD_LIMIT {
            let room = (HEAD_LIMIT - total).min(n as u64) as usize;
            log.write(&chunk[..room]);
        }
        total += n as u64;
        tail.extend(chunk);
        let excess = tail.len().saturating_sub(TAIL_LIMIT);
        tail.drain(..excess);
    }
    if let Some(pattern) = watch.pattern.as_ref().filter(|_| !matched && !line.is_empty()) {
        matched = pattern.is_match(String::from_utf8_lossy(&line).trim_end_matches('\r'));
    }
    let dropped = total.saturating_sub(HEAD_LIMIT);
    let tail_bytes: Vec<u8> = tail.into_iter().collect();
    if dropped > 0 {
        let kept = (tail_bytes.len() as u64).min(dropped) as usize;
        log.write(
            format!(
                "\n[ups-doctor: output exceeded {HEAD_LIMIT} bytes; {} bytes not kept; the last {kept} bytes follow]\n",
                dropped - kept as u64
            )
            .as_bytes(),
        );
        log.write(&tail_bytes[tail_bytes.len() - kept..]);
    }
    let write_error = log.finish();
    Captured {
        total_bytes: total,
        dropped_bytes: dropped,
        tail: String::from_utf8_lossy(&tail_bytes).into_owned(),
        matched,
        write_error,
    }
}

/// A log this process created ([`Log::create`]), known by its file (device and inode), so that
/// [`make_room`] cuts only this run's own logs: never a file that was in `--out` before the run,
/// nor one put in a log's place since.
struct OwnLog {
    path: PathBuf,
    dev: u64,
    ino: u64,
    /// Its length when first cut, once cut.
    cut_from: Option<u64>,
    /// Its length after the last cut.
    cut_to: u64,
}

static OWN_LOGS: std::sync::Mutex<Vec<OwnLog>> = std::sync::Mutex::new(Vec::new());

fn own_logs() -> std::sync::MutexGuard<'static, Vec<OwnLog>> {
    OWN_LOGS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes room in a run folder whose disk is full, so that its result can still be written: cuts
/// the largest logs this process created under `dir` to half (each ends with a note saying so),
/// largest first, until `wanted` bytes are freed. Returns the bytes freed. Files it did not
/// create (a user's own `*.log` in a reused `--out`) are never touched.
pub fn make_room(dir: &std::path::Path, wanted: u64) -> u64 {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut logs = own_logs();
    let mut found: Vec<(u64, usize)> = logs
        .iter()
        .enumerate()
        .filter(|(_, log)| log.path.starts_with(&dir))
        .filter_map(|(i, log)| {
            let meta = std::fs::symlink_metadata(&log.path).ok()?;
            (meta.is_file() && meta.dev() == log.dev && meta.ino() == log.ino).then_some((meta.len(), i))
        })
        .collect();
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    let mut freed = 0;
    for (len, i) in found {
        if freed >= wanted || len <= 2 * NOTE_ROOM {
            break;
        }
        let log = &mut logs[i];
        let keep = len / 2;
        let Ok(mut file) =
            std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NOFOLLOW).open(&log.path)
        else {
            continue;
        };
        // The name may have been given to another file since it was checked.
        if !file.metadata().is_ok_and(|m| m.dev() == log.dev && m.ino() == log.ino) {
            continue;
        }
        if file.set_len(keep.saturating_sub(NOTE_ROOM)).is_err() {
            continue;
        }
        use std::io::Seek;
        let _ = file.seek(std::io::SeekFrom::End(0));
        let _ = write!(
            file,
            "\n[ups-doctor: log cut here to {keep} of {len} bytes: the disk was full and the run's result needed the room]\n"
        );
        log.cut_from.get_or_insert(len);
        log.cut_to = file.metadata().map_or(keep, |m| m.len());
        freed += len.saturating_sub(log.cut_to);
    }
    freed
}

/// The logs under `dir` that [`make_room`] has cut, with paths relative to `dir`, in the order
/// they were created.
pub fn logs_cut(dir: &std::path::Path) -> Vec<crate::schema::LogCut> {
    let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    own_logs()
        .iter()
        .filter_map(|log| {
            Some(crate::schema::LogCut {
                path: log.path.strip_prefix(&dir).ok()?.display().to_string(),
                from_bytes: log.cut_from?,
                to_bytes: log.cut_to,
            })
        })
        .collect()
}

/// A log file that stops at its first failed write (a full disk) and then ends with a note
/// saying so, room for which is made by cutting its last bytes: truncated, never silently short.
struct Log {
    path: PathBuf,
    file: Option<File>,
    written: u64,
    error: Option<std::io::Error>,
}

/// Bytes given up at the end of a log, on a failed write, to make room for the note.
const NOTE_ROOM: u64 = 512;

impl Log {
    fn create(path: PathBuf) -> Log {
        // Never through a link planted under the log's name (see `crate::run_files`).
        match crate::run_files::create(&path) {
            Ok(file) => {
                if let Ok(meta) = file.metadata() {
                    use std::os::unix::fs::MetadataExt;
                    own_logs().push(OwnLog {
                        path: std::path::absolute(&path).unwrap_or_else(|_| path.clone()),
                        dev: meta.dev(),
                        ino: meta.ino(),
                        cut_from: None,
                        cut_to: 0,
                    });
                }
                Log { path, file: Some(file), written: 0, error: None }
            }
            Err(e) => Log { path, file: None, written: 0, error: Some(e) },
        }
    }

    fn write(&mut self, bytes: &[u8]) {
        let Some(file) = self.file.as_mut() else { return };
        // `write_all` by hand, counting what lands: a full disk takes part of a write first.
        let mut rest = bytes;
        let outcome = loop {
            if rest.is_empty() {
                break Ok(());
            }
            match file.write(rest) {
                Ok(0) => break Err(std::io::Error::from(std::io::ErrorKind::WriteZero)),
                Ok(n) => {
                    self.written += n as u64;
                    rest = &rest[n..];
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        match outcome {
            Ok(()) => {}
            Err(e) => {
                // Cut back to make room for the note.
                let keep = self.written.saturating_sub(NOTE_ROOM);
                let note = format!(
                    "\n[ups-doctor: log cut here after {keep} bytes: could not write more: {e}; its last lines are in result.json]\n"
                );
                let _ = file.set_len(keep);
                use std::io::Seek;
                let _ = file.seek(std::io::SeekFrom::Start(keep));
                let _ = file.write_all(note.as_bytes());
                eprintln!(
                    "ups-doctor: warning: could not write `{}`: {e}; the log is cut there",
                    self.path.display()
                );
                self.file = None;
                self.error = Some(e);
            }
        }
    }

    fn finish(self) -> Option<String> {
        self.error.map(|e| format!("could not write `{}`: {e}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_keeps_head_and_tail_and_bounds_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.log");
        let total = HEAD_LIMIT as usize + 3 * TAIL_LIMIT;
        let mut data = vec![b'a'; total - 4];
        data.extend_from_slice(b"END\n");
        let captured = drain_blocking(std::io::Cursor::new(data), path.clone());
        assert_eq!(captured.total_bytes, total as u64);
        assert_eq!(captured.dropped_bytes, 3 * TAIL_LIMIT as u64);
        assert!(captured.tail.ends_with("END\n"));
        let written = std::fs::metadata(&path).unwrap().len();
        assert!(written < HEAD_LIMIT + TAIL_LIMIT as u64 + 200, "file is bounded: {written}");
        let text = std::fs::read(&path).unwrap();
        assert!(text.ends_with(b"END\n"), "the tail is appended to the file");
    }

    #[test]
    fn a_watched_pattern_matches_whole_lines_across_reads_and_activity_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counter = seen.clone();
        let watch = |pattern: &str| Watch {
            on_output: None,
            pattern: Some(regex::Regex::new(pattern).unwrap()),
            origin: None,
        };
        let input = || Chunks(vec![b"step 1\ntraining fin", b"ished in 3 s\r\n", b"tail without newline"]);
        let path = dir.path().join("a.log");
        assert!(
            drain_blocking_watching(input(), path.clone(), watch("^training finished in \\d+ s$")).matched
        );
        assert!(drain_blocking_watching(input(), path.clone(), watch("^tail without")).matched);
        assert!(!drain_blocking_watching(input(), path.clone(), watch("^finished")).matched);
        let activity = Watch {
            on_output: Some(Box::new(move |_| {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            })),
            pattern: None,
            origin: None,
        };
        drain_blocking_watching(input(), path, activity);
        assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 1, "throttled to one report");
    }

    /// A stream that yields these chunks, one a read.
    struct Chunks(Vec<&'static [u8]>);

    impl Read for Chunks {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.0.is_empty() {
                return Ok(0);
            }
            let chunk = self.0.remove(0);
            buf[..chunk.len()].copy_from_slice(chunk);
            Ok(chunk.len())
        }
    }

    /// A stream that relays several processes' lines (a cluster's launcher) is each named
    /// process's sign of life, once per line and process within the throttle; a line that names
    /// none is reported as the stream's own.
    #[test]
    fn a_relayed_line_is_the_sign_of_life_of_the_process_it_names_only() {
        let dir = tempfile::tempdir().unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let said = seen.clone();
        let origin = Origin(std::sync::Arc::new(|line: &str| {
            line.strip_prefix("pid=")?.split(' ').next()?.parse().ok()
        }));
        let watch = Watch {
            on_output: Some(Box::new(move |from| said.lock().unwrap().push(from))),
            pattern: None,
            origin: Some(origin),
        };
        let input =
            Chunks(vec![&b"daemon line\npid=7 step"[..], b" 1\npid=9 x\npid=7 y\n", b"daemon again\n"]);
        drain_blocking_watching(input, dir.path().join("a.log"), watch);
        assert_eq!(*seen.lock().unwrap(), [None, Some(7), Some(9)], "each once within the throttle");
    }

    #[test]
    fn last_lines_skips_blank_lines() {
        let c = Captured { tail: "a\n\nb\nc\n\n".into(), ..Default::default() };
        assert_eq!(c.last_lines(2), vec!["b".to_string(), "c".to_string()]);
    }
}
