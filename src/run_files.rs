//! Creating files and folders in a run folder that ups-doctor does not own alone.
//!
//! `--out` is often reused, and often under a shared `/tmp`: whoever can prepare the folder before
//! a run (another local user) could plant `rank0.stdout.log -> /etc/shadow` and have ups-doctor —
//! often root — write a rank's output through the link. So every file ups-doctor creates there
//! (logs, `scenario.json`, `sitecustomize.py`, the temporary files behind `result.json` and the
//! reports) is made by [`create`] or [`replace`]: a new file (`O_CREAT | O_EXCL | O_NOFOLLOW`),
//! or, where the name exists already (a reused `--out`, or a planted link), a new file under a
//! fresh temporary name renamed over it — `rename(2)` replaces the link itself, never its target.
//! A folder ups-doctor makes inside a run folder ([`folder`]) must be a real folder, not a link to
//! one elsewhere. `--out` itself is the user's to choose, link or not.
//!
//! This module only opens, renames and checks; what goes into the files is its callers'.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Opens `path` as a new, empty file of this process, never through a symbolic link: the file
/// is created with `O_EXCL | O_NOFOLLOW`, or, where `path` exists (as a file or a link), a new one
/// is created beside it and renamed over it.
///
/// # Errors
///
/// Any error of `open(2)` or `rename(2)` (a missing folder, a full disk, permissions).
pub fn create(path: &Path) -> io::Result<File> {
    match open_new(path) {
        Ok(file) => Ok(file),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let (file, tmp) = temporary_beside(path)?;
            fs::rename(&tmp, path).inspect_err(|_| {
                let _ = fs::remove_file(&tmp);
            })?;
            Ok(file)
        }
        Err(e) => Err(e),
    }
}

/// Writes `bytes` to a new temporary file beside `path` (never through a link), syncs it and
/// renames it over `path`: a crash leaves the old file or the new one, never a torn one.
///
/// # Errors
///
/// Any error of the create, the write, the sync or the rename; the temporary file is removed.
pub fn replace(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let (mut file, tmp) = temporary_beside(path)?;
    let written = file.write_all(bytes).and_then(|()| file.sync_all()).and_then(|()| fs::rename(&tmp, path));
    written.inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

/// Creates the folder `dir` inside a run folder (and its missing parents), and checks that `dir`
/// is a real folder: a symbolic link planted under its name is refused, never followed.
///
/// # Errors
///
/// Any error of `mkdir(2)`; [`io::ErrorKind::AlreadyExists`] with the reason when `dir` is a link
/// or not a folder.
pub fn folder(dir: &Path) -> io::Result<()> {
    match fs::create_dir(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                fs::create_dir_all(parent)?;
            }
            match fs::create_dir(dir) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let kind = fs::symlink_metadata(dir)?.file_type();
    if kind.is_dir() {
        Ok(())
    } else {
        let what = if kind.is_symlink() { "a symbolic link" } else { "not a folder" };
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "`{}` is {what}: ups-doctor writes a run only into folders it made itself; remove it or pick another `--out`",
                dir.display()
            ),
        ))
    }
}

/// The `N` of the next temporary name.
static COUNTER: AtomicU64 = AtomicU64::new(0);

fn open_new(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o644)
        .open(path)
}

/// A new file `.NAME.PID.N.tmp` beside `path`; names that exist (planted, or left by a crash)
/// are skipped, never opened.
fn temporary_beside(path: &Path) -> io::Result<(File, PathBuf)> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut last = None;
    for _ in 0..64 {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = path.with_file_name(format!(".{name}.{}.{n}.tmp", std::process::id()));
        match open_new(&tmp) {
            Ok(file) => return Ok((file, tmp)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AlreadyExists)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn a_planted_link_is_replaced_and_its_target_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("outside");
        fs::write(&target, "precious").unwrap();
        let log = dir.path().join("rank0.stdout.log");
        symlink(&target, &log).unwrap();
        let mut file = create(&log).unwrap();
        file.write_all(b"rank output").unwrap();
        assert_eq!(fs::read_to_string(&target).unwrap(), "precious");
        assert!(!fs::symlink_metadata(&log).unwrap().file_type().is_symlink());
        assert_eq!(fs::read_to_string(&log).unwrap(), "rank output");

        let result = dir.path().join("result.json");
        symlink(&target, &result).unwrap();
        replace(&result, b"{}").unwrap();
        assert_eq!(fs::read_to_string(&target).unwrap(), "precious");
        assert_eq!(fs::read_to_string(&result).unwrap(), "{}");
    }

    #[test]
    fn a_planted_temporary_name_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("outside");
        fs::write(&target, "precious").unwrap();
        let next = COUNTER.load(Ordering::Relaxed);
        for i in next..next + 8 {
            let planted = dir.path().join(format!(".report.md.{}.{i}.tmp", std::process::id()));
            symlink(&target, &planted).unwrap();
        }
        replace(&dir.path().join("report.md"), b"# report").unwrap();
        assert_eq!(fs::read_to_string(&target).unwrap(), "precious");
        assert_eq!(fs::read_to_string(dir.path().join("report.md")).unwrap(), "# report");
    }

    #[test]
    fn a_folder_that_is_a_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let link = dir.path().join("1-scenario");
        symlink(elsewhere.path(), &link).unwrap();
        let e = folder(&link).unwrap_err();
        assert!(e.to_string().contains("is a symbolic link"), "{e}");
        folder(&dir.path().join("2-scenario/python-site")).unwrap();
        folder(&dir.path().join("2-scenario/python-site")).unwrap();
    }
}
