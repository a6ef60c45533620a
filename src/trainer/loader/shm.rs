//! Shared memory and file mappings: the ring of batch slots and the dataset cache.
//!
//! Segments are plain files in `/dev/shm` (what `shm_open` creates) named
//! `ups-doctor-<run id>-r<rank>-<what>`, so the harness can find leftovers of a crashed run by
//! prefix. The creator removes its file when the owning guard drops, on every normal and error
//! path; a rank killed by a signal leaves it for the harness.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::protocol::RUN_ID_ENV;

/// This run's id from the harness, or one made up from the pid for a rank started by hand.
pub fn run_id() -> String {
    std::env::var(RUN_ID_ENV)
        .ok()
        .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        .unwrap_or_else(|| format!("manual-{}", std::process::id()))
}

/// `/dev/shm/ups-doctor-<run id>-r<rank>-<what>`.
pub fn segment_path(rank: u32, what: &str) -> PathBuf {
    PathBuf::from(format!("/dev/shm/ups-doctor-{}-r{rank}-{what}", run_id()))
}

/// A `MAP_SHARED` mapping of a whole file.
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory; who writes where is the slot protocol's business.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Creates `path` (it must not exist) with `len` bytes and maps it read-write. Pages are
    /// backed on first touch, like PyTorch's shared-memory tensors: a full `/dev/shm` shows up as
    /// SIGBUS in whoever writes first, not here.
    pub fn create(path: &Path, len: usize) -> io::Result<Mapping> {
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(path)?;
        file.set_len(len as u64)?;
        Mapping::map(&file, len, true)
    }

    /// Maps an existing file whole.
    pub fn open(path: &Path, writable: bool) -> io::Result<Mapping> {
        let file = OpenOptions::new().read(true).write(writable).open(path)?;
        let len = file.metadata()?.len() as usize;
        Mapping::map(&file, len, writable)
    }

    fn map(file: &std::fs::File, len: usize, writable: bool) -> io::Result<Mapping> {
        let prot = if writable { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
        // SAFETY: maps `len` bytes of an open file; the kernel validates the arguments.
        let ptr = unsafe {
            libc::mmap(std::ptr::null_mut(), len.max(1), prot, libc::MAP_SHARED, file.as_raw_fd(), 0)
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr: ptr.cast(), len })
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `map` mapped.
        unsafe { libc::munmap(self.ptr.cast(), self.len.max(1)) };
    }
}

/// Removes a file when dropped: the creator's guard for a segment or cache file.
pub struct Unlink(pub PathBuf);

impl Drop for Unlink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
