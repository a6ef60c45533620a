//! `/dev/shm` as the run sees it: its size and use (statvfs) and the files in it. With a private
//! `/dev/shm` the folder is reached through the namespace holder's `/proc/<pid>/root`.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Size and use of a filesystem, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub total: u64,
    pub used: u64,
}

/// One file in `/dev/shm`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub name: String,
    /// Its length (`st_size`).
    pub size: u64,
    /// The memory it holds (`st_blocks`): less than `size` when sparse or cut short.
    pub allocated: u64,
    pub inode: u64,
}

/// `statvfs` of `dir`: total and used bytes.
pub fn usage(dir: &Path) -> Option<Usage> {
    let st = nix::sys::statvfs::statvfs(dir).ok()?;
    let frsize = st.fragment_size() as u64;
    let total = st.blocks() as u64 * frsize;
    Some(Usage { total, used: total.saturating_sub(st.blocks_free() as u64 * frsize) })
}

/// The start of the name of a run's lock file in `/dev/shm` (`crate::harness::os::life`): not a
/// segment, never listed as one.
const LOCK_PREFIX: &str = ".ups-doctor-";

/// The lock file that a live run holds beside its segments in `dir`.
pub fn lock_path(dir: &Path, run_id: &str) -> std::path::PathBuf {
    dir.join(format!("{LOCK_PREFIX}{run_id}.lock"))
}

/// The runs' lock files in `dir`.
pub fn lock_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(LOCK_PREFIX) && n.ends_with(".lock"))
        })
        .collect()
}

/// The regular files directly in `dir`, sorted by name (nothing when it cannot be read), the
/// runs' lock files left out.
pub fn segments(dir: &Path) -> Vec<Segment> {
    segments_named(dir, "")
}

/// The regular files directly in `dir` whose names start with `prefix`, sorted by name: only
/// those are `stat`ed (the sampler asks four times a second for one run's own segments, and a
/// shared machine's `/dev/shm` may hold thousands of others).
pub fn segments_named(dir: &Path, prefix: &str) -> Vec<Segment> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<Segment> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().as_encoded_bytes().starts_with(prefix.as_bytes()))
        .filter(|e| !e.file_name().as_encoded_bytes().starts_with(LOCK_PREFIX.as_bytes()))
        .filter_map(|e| {
            let meta = e.metadata().ok().filter(|m| m.is_file())?;
            Some(Segment {
                name: e.file_name().to_string_lossy().into_owned(),
                size: meta.len(),
                allocated: meta.blocks() * 512,
                inode: meta.ino(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Removes `dir/name`.
pub fn remove(dir: &Path, name: &str) -> std::io::Result<()> {
    fs::remove_file(dir.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_in_a_folder_is_listed_with_its_sizes() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("b"), vec![1u8; 10_000]).unwrap();
        fs::create_dir(dir.path().join("sub")).unwrap();
        let list = segments(dir.path());
        assert_eq!(list.len(), 1);
        assert_eq!((list[0].name.as_str(), list[0].size), ("b", 10_000));
        assert!(list[0].allocated >= 10_000);
        let u = usage(dir.path()).unwrap();
        assert!(u.total >= u.used && u.total > 0);
        remove(dir.path(), "b").unwrap();
        assert!(segments(dir.path()).is_empty());
    }
}
