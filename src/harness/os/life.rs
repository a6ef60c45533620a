//! A run's proof of life that every PID namespace sees alike.
//!
//! A pid and its start time mean something only in the PID namespace that reads them: an
//! ups-doctor inside `unshare --pid` (a container started with `--cgroups=disabled` or
//! `--ipc=host`, which shares the host's cgroup tree and `/dev/shm`) is pid 1 there, and a run on
//! the host that looks for "pid 1 with that start time" finds it gone. What both share is the
//! file system object itself, so a live run holds a shared `flock` on its scenario cgroup's
//! directory and on a lock file beside its `/dev/shm` segments for as long as it runs; the kernel
//! drops the lock when the last descriptor goes, which is when ups-doctor dies however it dies
//! (the descriptors are close-on-exec, so no rank keeps them). Another run proves the owner dead
//! by taking the lock exclusively; while it cannot, the owner is alive, whatever its pid says.

use std::fs::File;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// A lock held until dropped.
#[derive(Debug)]
pub struct Held {
    _lock: Flock<File>,
}

/// What a lock says of whoever should hold it.
#[derive(Debug)]
pub enum Owner {
    /// Someone holds it: the owner runs (in this PID namespace or another).
    Alive,
    /// Nobody holds it; the caller now holds it exclusively, until the guard drops.
    Gone(Held),
    /// There is nothing to lock at that path.
    Absent,
    /// It could not be opened or locked for another reason: the owner cannot be proven dead.
    Unknown(io::Error),
}

fn open(path: &Path) -> io::Result<File> {
    // Read-only opens directories and files alike; close-on-exec keeps the lock out of ranks.
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW).open(path)
}

fn lock(file: File, how: FlockArg) -> Result<Flock<File>, Errno> {
    Flock::lock(file, how).map_err(|(_, e)| e)
}

/// Holds a shared lock on the directory or file at `path` until the guard drops.
pub fn hold(path: &Path) -> io::Result<Held> {
    let file = open(path)?;
    Ok(Held { _lock: lock(file, FlockArg::LockSharedNonblock).map_err(io::Error::from)? })
}

impl Held {
    /// Whether `path` still names what is locked: a sweep of another run (in another PID
    /// namespace) may have taken the object for a dead run's and removed it between our open and
    /// our lock, leaving the lock on a directory that no longer has a name.
    pub fn still_at(&self, path: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        let (Ok(locked), Ok(named)) = (self._lock.metadata(), std::fs::symlink_metadata(path)) else {
            return false;
        };
        (locked.dev(), locked.ino()) == (named.dev(), named.ino())
    }
}

/// Whether the owner of `path` still holds it.
pub fn owner(path: &Path) -> Owner {
    let file = match open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Owner::Absent,
        Err(e) => return Owner::Unknown(e),
    };
    match lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Owner::Gone(Held { _lock: lock }),
        Err(Errno::EWOULDBLOCK) => Owner::Alive,
        Err(e) => Owner::Unknown(e.into()),
    }
}

/// A lock file made for one run and removed when it ends.
#[derive(Debug)]
pub struct LockFile {
    path: PathBuf,
    _held: Held,
}

impl LockFile {
    /// Makes `path` already locked: the file is made and locked under a temporary name and then
    /// renamed, so that no one ever finds it at `path` unlocked.
    pub fn create(path: &Path) -> io::Result<LockFile> {
        let mut fresh = path.as_os_str().to_owned();
        fresh.push(".new");
        let fresh = PathBuf::from(fresh);
        let _ = std::fs::remove_file(&fresh);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(&fresh)?;
        match hold(&fresh).and_then(|held| std::fs::rename(&fresh, path).map(|()| held)) {
            Ok(held) => Ok(LockFile { path: path.to_path_buf(), _held: held }),
            Err(e) => {
                let _ = std::fs::remove_file(&fresh);
                Err(e)
            }
        }
    }
}

impl Drop for LockFile {
    fn drop(&mut self) {
        // Removed while still held: a prober either sees it held or does not find it.
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_on_a_directory_removed_or_replaced_under_it_is_known_not_to_name_it_any_more() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("group");
        std::fs::create_dir(&dir).unwrap();
        let held = hold(&dir).unwrap();
        assert!(held.still_at(&dir));
        std::fs::remove_dir(&dir).unwrap();
        assert!(!held.still_at(&dir), "removed");
        std::fs::create_dir(&dir).unwrap();
        assert!(!held.still_at(&dir), "another directory of the same name");
    }

    #[test]
    fn a_held_directory_is_alive_for_another_opener_and_gone_once_released() {
        let dir = tempfile::tempdir().unwrap();
        let held = hold(dir.path()).unwrap();
        assert!(matches!(owner(dir.path()), Owner::Alive));
        drop(held);
        let Owner::Gone(exclusive) = owner(dir.path()) else { panic!("not gone") };
        // While the prober holds it, a second prober does not also think it may clean up.
        assert!(matches!(owner(dir.path()), Owner::Alive));
        drop(exclusive);
    }

    #[test]
    fn a_lock_file_is_held_while_it_exists_and_removed_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.lock");
        assert!(matches!(owner(&path), Owner::Absent));
        let lock = LockFile::create(&path).unwrap();
        assert!(matches!(owner(&path), Owner::Alive));
        assert!(!dir.path().join("run.lock.new").exists());
        drop(lock);
        assert!(matches!(owner(&path), Owner::Absent));
    }

    #[test]
    fn a_link_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(matches!(owner(&link), Owner::Unknown(_)));
    }
}
