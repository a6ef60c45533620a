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
    Ok(())
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
