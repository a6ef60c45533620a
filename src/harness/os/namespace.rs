//! The OS edge for `data.shm_size`: a private `/dev/shm` of a given size, shared by every rank
//! and worker of one scenario, like a container's.
//!
//! Theory of operation: a *holder* process is forked from the harness. It unshares its mount
//! namespace, makes every mount private (so nothing leaks back to the machine), mounts a tmpfs
//! of the requested size on `/dev/shm`, reports success through a pipe and then waits to be
//! killed. Each rank joins that namespace in its `pre_exec` with `setns` (see
//! [`super::process`]), so ranks and the workers they start see one small `/dev/shm`, while the
//! harness reaches it from outside as `/proc/<holder>/root/dev/shm`. The namespace lives exactly
//! as long as its processes: when the holder is killed (on drop, or by `PR_SET_PDEATHSIG` when
//! ups-doctor itself dies) and the ranks are gone, the kernel unmounts the tmpfs and every
//! segment in it goes too. No mount is ever added to the machine's own namespace.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};
use nix::sys::prctl::set_pdeathsig;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::waitpid;
use nix::unistd::{ForkResult, Pid, fork, getpid, getppid, pause, pipe2, write};

/// Why a private `/dev/shm` could not be made.
#[derive(Debug, thiserror::Error)]
#[error(
    "failed to give the scenario a private /dev/shm of `{size}` (`data.shm_size`): `{step}` failed: {source}{}",
    hint(source)
)]
pub struct NamespaceError {
    pub size: String,
    pub step: &'static str,
    pub source: io::Error,
}

fn hint(source: &io::Error) -> &'static str {
    if matches!(source.raw_os_error().map(Errno::from_raw), Some(Errno::EPERM | Errno::EACCES)) {
        "\nhint: `data.shm_size` runs the scenario in a private mount namespace, which needs root or \
         CAP_SYS_ADMIN (in a container: `--cap-add SYS_ADMIN` or `--privileged`); run ups-doctor as \
         root, or remove `data.shm_size` and give the container a small /dev/shm with `--shm-size`"
    } else {
        ""
    }
}

/// A tmpfs of a fixed size on `/dev/shm` inside a mount namespace of its own.
#[derive(Debug)]
pub struct PrivateShm {
    holder: Pid,
    ns: OwnedFd,
}

/// What the holder reports: 0 for ready, else the failed step's number and errno.
const STEPS: [&str; 4] =
    ["ready", "unshare(CLONE_NEWNS)", "mount --make-rprivate /", "mount -t tmpfs /dev/shm"];

impl PrivateShm {
    /// Makes the namespace; `label` is the size as the user wrote it (for messages).
    pub fn create(bytes: u64, label: &str) -> Result<PrivateShm, NamespaceError> {
        let fail =
            |step: &'static str, source: io::Error| NamespaceError { size: label.to_string(), step, source };
        // Everything the child needs is prepared here: after fork it may not allocate.
        let options = CString::new(format!("size={bytes},mode=1777")).expect("no NUL");
        let (read, write) = pipe2(OFlag::O_CLOEXEC).map_err(|e| fail("pipe2", e.into()))?;
        let parent = getpid();
        // SAFETY: the child runs only async-signal-safe system calls (prctl, getppid, close_range,
        // unshare, mount, write, pause, _exit; nix's wrappers of them allocate nothing for these
        // C-string arguments) and never returns into the caller's code.
        let pid = match unsafe { fork() } {
            Ok(ForkResult::Child) => holder(parent, &write, &options),
            Ok(ForkResult::Parent { child }) => child,
            Err(e) => return Err(fail("fork", e.into())),
        };
        drop(write);
        let mut report = [0u8; 5];
        let n = read_full(&File::from(read), &mut report);
        // Our own child, not yet reaped: its pid cannot have been reused.
        let reap = || {
            let _ = kill(pid, Signal::SIGKILL);
            let _ = waitpid(pid, None);
        };
        if n != report.len() {
            reap();
            return Err(fail("fork", io::Error::other("the namespace holder died before it reported")));
        }
        if report[0] != 0 {
            reap();
            let errno = i32::from_ne_bytes([report[1], report[2], report[3], report[4]]);
            let step = STEPS.get(report[0] as usize).copied().unwrap_or("setup");
            return Err(fail(step, io::Error::from_raw_os_error(errno)));
        }
        match File::open(format!("/proc/{pid}/ns/mnt")) {
            Ok(ns) => Ok(PrivateShm { holder: pid, ns: ns.into() }),
            Err(e) => {
                reap();
                Err(fail("open /proc/<holder>/ns/mnt", e))
            }
        }
    }

    /// The namespace to join (`setns(fd, CLONE_NEWNS)`) before exec.
    pub fn ns_fd(&self) -> RawFd {
        self.ns.as_raw_fd()
    }

    /// The private `/dev/shm` as the harness, outside the namespace, reaches it.
    pub fn dir(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root/dev/shm", self.holder))
    }
}

impl Drop for PrivateShm {
    /// Kills and reaps the holder; the namespace and its tmpfs go with the last of the ranks.
    fn drop(&mut self) {
        // Our own child, reaped only here: its pid names it until then.
        let _ = kill(self.holder, Signal::SIGKILL);
        let _ = waitpid(self.holder, None);
    }
}

fn read_full(mut from: &File, buf: &mut [u8]) -> usize {
    let mut got = 0;
    while got < buf.len() {
        match from.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    got
}

/// The holder's life after fork, in the child only: it turns the calling process into the
/// namespace's holder and never returns.
fn holder(parent: Pid, report: &OwnedFd, options: &CStr) -> ! {
    let tell = |step: u8, errno: Errno| {
        let e = (errno as i32).to_ne_bytes();
        let _ = write(report, &[step, e[0], e[1], e[2], e[3]]);
    };
    let exit = || -> ! { super::sys::exit_now(1) };
    // Die with ups-doctor even when it is SIGKILLed: the namespace must not outlive the run.
    let _ = set_pdeathsig(Signal::SIGKILL);
    if getppid() != parent {
        exit();
    }
    // Hold no other file of the harness (a rank's pipe held here would never reach EOF).
    let keep = report.as_raw_fd() as u32;
    super::sys::close_fds_except(keep);
    if let Err(e) = unshare(CloneFlags::CLONE_NEWNS) {
        tell(1, e);
        exit();
    }
    if let Err(e) =
        mount(None::<&CStr>, c"/", None::<&CStr>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&CStr>)
    {
        tell(2, e);
        exit();
    }
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if let Err(e) = mount(Some(c"tmpfs"), c"/dev/shm", Some(c"tmpfs"), flags, Some(options)) {
        tell(3, e);
        exit();
    }
    tell(0, Errno::from_raw(0));
    loop {
        pause();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_says_what_is_needed() {
        let e =
            NamespaceError { size: "64m".into(), step: "unshare(CLONE_NEWNS)", source: Errno::EPERM.into() };
        let text = e.to_string();
        assert!(
            text.starts_with(
                "failed to give the scenario a private /dev/shm of `64m` (`data.shm_size`): \
                 `unshare(CLONE_NEWNS)` failed: Operation not permitted"
            ),
            "{text}"
        );
        assert!(text.contains("\nhint: `data.shm_size` runs the scenario in a private mount namespace, which needs root or CAP_SYS_ADMIN"), "{text}");
    }

    #[test]
    fn a_private_shm_has_the_size_asked_for_where_permitted() {
        let shm = match PrivateShm::create(8 << 20, "8m") {
            Ok(shm) => shm,
            // Not root here: the refusal is the expected, explained outcome.
            Err(e) if e.source.raw_os_error() == Some(Errno::EPERM as i32) => return,
            Err(e) => panic!("{e}"),
        };
        let usage = crate::probe::shm::usage(&shm.dir()).expect("statvfs through /proc/<holder>/root");
        assert_eq!(usage.total, 8 << 20);
        let machine = crate::probe::shm::usage(std::path::Path::new("/dev/shm"));
        assert_ne!(machine.map(|u| u.total), Some(8 << 20), "the machine's /dev/shm is untouched");
    }
}
