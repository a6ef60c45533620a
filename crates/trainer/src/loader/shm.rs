//! Shared memory and file mappings: the ring of batch slots and the dataset cache.
//!
//! Segments are plain files in `/dev/shm` (what `shm_open` creates) named
//! `ups-doctor-<run id>-r<rank>-<what>`, so the harness can find leftovers of a crashed run by
//! prefix. The creator removes its file when the owning guard drops, on every normal and error
//! path, and from its SIGTERM and fatal-signal handlers (the harness tears a hung rank down with
//! SIGTERM). The loader removes the names of its ring and cache even earlier, as soon as every
//! worker has them open, so not even a SIGKILLed rank leaves those behind.

use std::ffi::{CStr, c_char};
use std::fs::OpenOptions;
use std::io;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering};

use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};
use nix::sys::signal::{SigHandler, Signal, raise, signal};
use nix::unistd::{SysconfVar, getpid, sysconf, unlink};

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
        let prot = if writable { ProtFlags::PROT_READ | ProtFlags::PROT_WRITE } else { ProtFlags::PROT_READ };
        let size = NonZeroUsize::new(len.max(1)).expect("at least 1");
        // SAFETY: a new shared mapping of `len` bytes of an open file at an address the kernel
        // picks, so it overlaps no memory Rust knows of; what is read or written through it is the
        // slot protocol's business (see `Mapping`'s users).
        let ptr = unsafe { mmap(None, size, prot, MapFlags::MAP_SHARED, file, 0)? };
        Ok(Mapping { ptr: ptr.as_ptr().cast(), len })
    }

    /// Writes one byte into every page (volatile: each write reaches the mapping), so that every
    /// page is backed now; where `/dev/shm` cannot back one, the write raises SIGBUS, as a
    /// PyTorch worker's first write into a full `/dev/shm` does.
    pub fn touch_every_page(&self) {
        let page = sysconf(SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .and_then(|p| usize::try_from(p).ok())
            .unwrap_or(4096);
        for offset in (0..self.len).step_by(page) {
            // SAFETY: `offset` lies inside the mapping, which lives as long as `self`; a volatile
            // byte write creates no reference that other processes' writes could invalidate.
            unsafe { self.ptr.add(offset).write_volatile(1) };
        }
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
        if let Some(ptr) = NonNull::new(self.ptr.cast()) {
            // SAFETY: unmaps exactly what `map` mapped; no view of it outlives the mapping.
            let _ = unsafe { munmap(ptr, self.len.max(1)) };
        }
    }
}

/// Removes a file when dropped: the creator's guard for a segment or cache file. While it
/// lives, the file is also removed if the creating process is terminated by a signal.
pub struct Unlink(PathBuf, usize);

impl Unlink {
    pub fn new(path: PathBuf) -> Unlink {
        let slot = register(&path);
        Unlink(path, slot)
    }
}

impl Drop for Unlink {
    fn drop(&mut self) {
        if let Some(cell) = REGISTERED.get(self.1) {
            let ptr = cell.swap(std::ptr::null_mut(), Ordering::SeqCst);
            if !ptr.is_null() {
                // SAFETY: the pointer came from CString::into_raw in `register`.
                drop(unsafe { std::ffi::CString::from_raw(ptr) });
            }
        }
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Paths to remove if this process dies by a signal, for [`unlink_registered`] (a signal
/// handler cannot take a lock or allocate, so it is a fixed table of C strings).
static REGISTERED: [AtomicPtr<c_char>; 8] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 8];
/// The process that registered them: a forked worker inherits the table but must never remove
/// the trainer's files when it dies.
static OWNER: AtomicI32 = AtomicI32::new(0);

fn register(path: &Path) -> usize {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return usize::MAX;
    };
    OWNER.store(getpid().as_raw(), Ordering::SeqCst);
    install_sigterm_cleanup();
    let raw = c.into_raw();
    for (i, cell) in REGISTERED.iter().enumerate() {
        if cell.compare_exchange(std::ptr::null_mut(), raw, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            return i;
        }
    }
    // SAFETY: `raw` came from into_raw just above and was not stored.
    drop(unsafe { std::ffi::CString::from_raw(raw) });
    usize::MAX
}

/// Removes every registered file. Async-signal-safe (getpid and unlink only).
pub fn unlink_registered() {
    if OWNER.load(Ordering::SeqCst) != getpid().as_raw() {
        return;
    }
    for cell in &REGISTERED {
        let ptr = cell.load(Ordering::SeqCst);
        if !ptr.is_null() {
            // SAFETY: a NUL-terminated path leaked by `register`, never freed while registered.
            let _ = unlink(unsafe { CStr::from_ptr(ptr) });
        }
    }
}

fn install_sigterm_cleanup() {
    extern "C" fn on_sigterm(_sig: i32) {
        unlink_registered();
        // Die by SIGTERM as before (signal(2) and raise(3) are async-signal-safe).
        // SAFETY: restores the default action, which runs no Rust code.
        let _ = unsafe { signal(Signal::SIGTERM, SigHandler::SigDfl) };
        let _ = raise(Signal::SIGTERM);
    }
    // SAFETY: installs a handler that only calls async-signal-safe functions.
    let _ = unsafe { signal(Signal::SIGTERM, SigHandler::Handler(on_sigterm)) };
}
