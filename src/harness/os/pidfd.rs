//! pidfds (Linux 5.3+): a handle on one process that a recycled pid cannot redirect, so that a
//! process checked to be ours is the one that gets the signal. Raw system calls: neither nix nor
//! std wraps pidfd_open(2) or pidfd_send_signal(2).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A pidfd for `pid`; `ENOSYS` where the kernel has none.
pub fn open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open(2) with no flags; the fd returned is owned below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_long, 0 as libc::c_long) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd from the kernel, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Sends `signal` to the process `fd` names (nothing when it has ended, even if its pid is reused).
pub fn send_signal(fd: &OwnedFd, signal: i32) -> io::Result<()> {
    // SAFETY: pidfd_send_signal(2) on an owned pidfd, no siginfo, no flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd() as libc::c_long,
            signal as libc::c_long,
            std::ptr::null::<libc::siginfo_t>(),
            0 as libc::c_long,
        )
    };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}
