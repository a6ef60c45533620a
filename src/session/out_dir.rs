//! The run folder: `--out` checked before anything runs, or a fresh `reports/runs/<UTC time>`
//! made for the invocation; scenario names as folder names.

use std::path::{Path, PathBuf};

use crate::Error;

/// Creates `--out` (or checks it) before anything runs: a folder that cannot be written is the
/// user's to fix, found now rather than after the first scenario.
pub fn prepare_out_dir(dir: &Path) -> Result<(), Error> {
    let bad = |e: std::io::Error| {
        Error::BadInput(format!(
            "`--out {}` cannot be written: {e}\n  hint: pick a folder you can write to, with some free space",
            dir.display()
        ))
    };
    std::fs::create_dir_all(dir).map_err(bad)?;
    let probe = dir.join(format!(".ups-doctor-write-test.{}", std::process::id()));
    crate::run_files::create(&probe).map_err(bad)?;
    let _ = std::fs::remove_file(&probe);
    hold(dir)
}

/// The `--out` folders this invocation holds, each locked until it exits.
static HELD: std::sync::Mutex<Vec<(PathBuf, crate::harness::os::life::Held)>> =
    std::sync::Mutex::new(Vec::new());

/// Holds `dir` for this invocation: a second ups-doctor given the same `--out` while this one
/// runs would overwrite its result, logs and report (a failed run's folder then said "Passed"),
/// so it is refused instead. The lock is the folder's own (`flock`), which every PID namespace sees
/// alike and the kernel drops when this process ends, however it ends.
fn hold(dir: &Path) -> Result<(), Error> {
    use crate::harness::os::life::{Owner, owner};
    let key = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    if held.iter().any(|(p, _)| *p == key) {
        return Ok(());
    }
    match owner(&key) {
        Owner::Gone(lock) => {
            held.push((key, lock));
            Ok(())
        }
        Owner::Alive => Err(Error::BadInput(format!(
            "`--out {}` is the folder of another ups-doctor run that is still running: this run would \
             overwrite its result, logs and report\n  hint: give this run a folder of its own (`--out`), or wait for \
             that one to end",
            dir.display()
        ))),
        // A file system without locks: nothing to prove, nothing lost by going on.
        Owner::Absent | Owner::Unknown(_) => Ok(()),
    }
}

/// `--out` checked, or a fresh folder under `reports/runs` named by the time and `suffix`.
pub fn out_dir_or_fresh(out: Option<PathBuf>, suffix: &str) -> Result<PathBuf, Error> {
    match out {
        Some(dir) => {
            prepare_out_dir(&dir)?;
            Ok(dir)
        }
        None => fresh_run_dir(Path::new("reports/runs"), suffix),
    }
}

/// `reports/runs/2026-11-20T23-40-12Z<suffix>`, with `-2`, `-3`, … when that exists already.
pub fn fresh_run_dir(parent: &Path, suffix: &str) -> Result<PathBuf, Error> {
    let io = |source| Error::Io { what: "create a folder under", path: parent.to_path_buf(), source };
    std::fs::create_dir_all(parent).map_err(io)?;
    let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string().replace(':', "-")
        + suffix;
    for n in 1.. {
        let dir = if n == 1 { parent.join(&stamp) } else { parent.join(format!("{stamp}-{n}")) };
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io(e)),
        }
    }
    unreachable!("the loop returns")
}

/// A scenario name as a folder name.
pub fn sanitize(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect()
}
