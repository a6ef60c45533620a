//! The system calls of the harness that neither nix nor std wraps safely, each behind a safe
//! function: pidfds (Linux 5.3+: a handle on one process that a recycled pid cannot redirect, so
//! that a process checked to be ours is the one that gets the signal), a thread's nice value, the
//! terminal's width, `_exit`, `close_range` and a child's death signal set between fork and exec.
//! Together with spawning ranks (`process`), forking the `/dev/shm` holder (`namespace`), NVML
//! (`probe::nvml`) and installing the interrupt handler (`main.rs`), this is all of the harness's
//! `unsafe` (`scripts/unsafe-count.sh`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;

/// Makes this process the *child subreaper* of everything it starts (`PR_SET_CHILD_SUBREAPER`,
/// Linux 3.4+): a process of a run whose parent exits (a daemon's double fork after `setsid`, a
/// worker whose rank died) is reparented to ups-doctor instead of to init, so every process a
/// run started still descends from ups-doctor while it lives, and can be proved the run's by
/// that and by the run id it carries. Nothing is reaped by this: ups-doctor waits only for the
/// pids it knows ([`super::process`]'s ranks by their own handles, and at teardown the adopted
/// processes it has just killed, by pid), never for any child, so no watcher loses a status.
pub fn become_child_subreaper() -> io::Result<()> {
    // SAFETY: prctl(2) with an integer option and argument; no pointers.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reaps `pid` if it is this process's child and has ended; `true` when it was reaped.
pub fn reap_if_ended(pid: u32) -> bool {
    // SAFETY: waitid(2) for one pid with WNOHANG; `info` is a zeroed siginfo_t the kernel fills.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let rc =
        unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOHANG) };
    // SAFETY: si_pid is set by waitid when a child was reaped, 0 otherwise (WNOHANG).
    rc == 0 && unsafe { info.si_pid() } != 0
}

/// A pidfd for `pid`; `ENOSYS` where the kernel has none.
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    pidfd_open_flags(pid, 0)
}

/// A pidfd for the thread `pid` alone (`PIDFD_THREAD`, Linux 6.9+; `EINVAL` before): it turns
/// readable when that thread exits, not when the last thread of its process has. For a process's
/// first thread, that is when `/proc/PID/stat` starts to show it a zombie with its exit status,
/// while its other threads are still being torn down and before its parent can reap it.
pub fn pidfd_open_thread(pid: u32) -> io::Result<OwnedFd> {
    // PIDFD_THREAD is O_EXCL (include/uapi/linux/pidfd.h).
    pidfd_open_flags(pid, libc::O_EXCL as libc::c_uint)
}

fn pidfd_open_flags(pid: u32, flags: libc::c_uint) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open(2) with plain flags; the fd returned is owned below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_long, flags as libc::c_long) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd from the kernel, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Sends `signal` to the process `fd` names (nothing when it has ended, even if its pid is reused).
pub fn pidfd_send_signal(fd: &OwnedFd, signal: i32) -> io::Result<()> {
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

/// Sets the calling thread's nice value (Linux nice values are per thread); a failure leaves it
/// as it was. nix has no `setpriority`.
pub fn set_thread_nice(nice: i32) {
    // SAFETY: plain syscalls without pointers; `gettid` names the calling thread.
    let _ = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
}

// nix has no safe wrapper for TIOCGWINSZ; its macro declares the (unsafe) ioctl.
nix::ioctl_read_bad!(tiocgwinsz, nix::libc::TIOCGWINSZ, nix::pty::Winsize);

/// The width of the terminal on stderr, in columns; `None` when stderr is no terminal.
pub fn terminal_columns() -> Option<usize> {
    let mut ws = nix::pty::Winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer, which is valid for it; the fd is
    // stderr's, which outlives the call.
    let got = unsafe { tiocgwinsz(std::io::stderr().as_raw_fd(), &mut ws) };
    (got.is_ok() && ws.ws_col > 0).then_some(ws.ws_col as usize)
}

/// Ends the process at once with `code`: no destructor, atexit handler or stdio flush runs (std's
/// `exit` would run them: wrong in a forked child and in a signal handler). Async-signal-safe.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit(2) has no preconditions and never returns; nix has no wrapper for it.
    unsafe { libc::_exit(code) }
}

/// Closes every descriptor from 3 on but `keep`. Only for a forked child that holds no Rust
/// object of those descriptors it would use again (the `/dev/shm` holder: it never returns into
/// the code that owns them). nix has no `close_range`.
pub fn close_fds_except(keep: u32) {
    // SAFETY: close_range(2) takes no pointers; closing descriptors that Rust objects of this
    // process own is harmless in the one caller, which never returns to them (see above).
    unsafe {
        if keep > 3 {
            libc::syscall(libc::SYS_close_range, 3u32, keep - 1, 0u32);
        }
        libc::syscall(libc::SYS_close_range, keep + 1, u32::MAX, 0u32);
    }
}

/// Makes the child `cmd` will start die with SIGKILL when ups-doctor dies, even when
/// ups-doctor is SIGKILLed itself.
pub fn die_with_parent(cmd: &mut std::process::Command) {
    // SAFETY: the closure only calls prctl(2), which is async-signal-safe, as required between
    // fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}
