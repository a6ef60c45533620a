//! The kernel seam of the harness: code here talks to the kernel directly (spawn, process groups,
//! signals and `waitid` in `process`, ownership checks in `owner`, the private `/dev/shm` mount
//! namespace in `namespace`, cgroupfs, pidfds, `/dev/kmsg`); everything above it works on plain
//! data. It must not decide what an
//! observation means: it reports what the kernel says.

use std::os::fd::AsRawFd;

pub mod cgroup;
pub mod kmsg;
pub(crate) mod namespace;
pub(crate) mod owner;
pub mod pidfd;
pub(crate) mod process;
pub mod tcp;

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
