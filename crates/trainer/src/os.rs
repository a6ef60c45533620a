//! The trainer's few system calls that no crate wraps safely, each behind a safe function:
//! `strsignal(3)` (PyTorch words a worker's death with it), `_exit(2)` (a forked child or an
//! injected fault leaves without running the parent's destructors or atexit handlers), taking
//! ownership of a descriptor the process inherited (the harness's marker pipe) and a deliberate
//! write to an unmapped page (the `segv` fault). nix covers the rest (fork, pipes, poll, waitpid,
//! prctl, mmap); what stays `unsafe` elsewhere in the trainer is memory shared with libtorch or
//! other processes (the c10d and NCCL shims, the loader's ring and cache, CUDA and autocast
//! calls) and the crash handler, not calls.

use std::collections::BTreeSet;
use std::fs::File;
use std::os::fd::FromRawFd;
use std::sync::Mutex;

use nix::sys::signal::Signal;

/// The descriptors [`adopt_inherited_fd`] handed out: each gets one owner.
static ADOPTED: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

/// The descriptor `fd`, which this process inherited open from whoever started it (a number
/// passed in the environment), as a file that owns it and closes it when dropped. None if the
/// process has no such descriptor open (`/proc/self/fd`), or if it was adopted before: a
/// descriptor has one owner. Meant for start-up, before the process opens files of its own.
pub fn adopt_inherited_fd(fd: i32) -> Option<File> {
    if fd < 0 || procfs::process::Process::myself().and_then(|me| me.fd_from_fd(fd)).is_err() {
        return None;
    }
    if !ADOPTED.lock().unwrap_or_else(|e| e.into_inner()).insert(fd) {
        return None;
    }
    // SAFETY: the descriptor is open (checked above), was inherited for this process to use, and
    // no other `File` owns it: this function adopts each number once (the set above).
    Some(unsafe { File::from_raw_fd(fd) })
}

/// The C library's description of `sig`: `Killed`, `Segmentation fault`, `Bus error`.
pub fn signal_description(sig: Signal) -> String {
    // SAFETY: strsignal(3) returns a pointer to a NUL-terminated string that stays valid until
    // the next strsignal call on this thread; it is copied out at once.
    let text = unsafe { libc::strsignal(sig as i32) };
    if text.is_null() {
        return sig.as_str().to_string();
    }
    // SAFETY: non-null and NUL-terminated (see above).
    unsafe { std::ffi::CStr::from_ptr(text) }.to_string_lossy().into_owned()
}

/// Ends this process at once with `code`: no destructor, atexit handler or stdio flush runs
/// (the state they would touch belongs to the parent a forked child was copied from, or is what an
/// injected fault must not tidy). Async-signal-safe.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit(2) has no preconditions and never returns; nix has no wrapper for it.
    unsafe { libc::_exit(code) }
}

/// Writes to an address that is never mapped: the kernel delivers a genuine SIGSEGV
/// (SEGV_MAPERR), as a rank's native bug would.
#[inline(never)]
pub fn write_to_unmapped_page() -> ! {
    // The first page is never mapped on Linux (vm.mmap_min_addr), so this faults every time.
    let bad = std::hint::black_box(0x10usize) as *mut u64;
    // SAFETY: deliberately unsound; the resulting SIGSEGV is the point of this fault.
    unsafe { bad.write_volatile(0xdead) };
    unreachable!("the write to {bad:?} should have faulted")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_are_described_as_the_c_library_does() {
        assert_eq!(signal_description(Signal::SIGKILL), "Killed");
        assert_eq!(signal_description(Signal::SIGSEGV), "Segmentation fault");
        assert_eq!(signal_description(Signal::SIGBUS), "Bus error");
    }

    #[test]
    fn an_inherited_descriptor_gets_one_owner_which_closes_it() {
        use std::io::{Read, Write};
        use std::os::fd::IntoRawFd;
        let (read, write) = nix::unistd::pipe().expect("pipe");
        let fd = write.into_raw_fd();
        let mut file = adopt_inherited_fd(fd).expect("an open descriptor is adopted");
        assert!(adopt_inherited_fd(fd).is_none(), "a second owner of the same descriptor");
        assert!(adopt_inherited_fd(-1).is_none());
        file.write_all(b"marker").expect("write");
        drop(file);
        // The owner closed the only write end: the reader sees the bytes, then end-of-file.
        let mut got = Vec::new();
        File::from(read).read_to_end(&mut got).expect("read");
        assert_eq!(got, b"marker");
    }
}
