//! The trainer's few system calls that no crate wraps safely, each behind a safe function:
//! `strsignal(3)` (PyTorch words a worker's death with it), `_exit(2)` (a forked child or an
//! injected fault leaves without running the parent's destructors or atexit handlers) and a
//! deliberate write to an unmapped page (the `segv` fault). nix covers the rest (fork, pipes,
//! poll, waitpid, prctl, mmap); what stays `unsafe` elsewhere in the trainer is memory shared
//! with libtorch or other processes (the c10d and NCCL shims, the loader's ring), the crash
//! handler, and taking ownership of the inherited marker descriptor, not calls.

use nix::sys::signal::Signal;

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
}
