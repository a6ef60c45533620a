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

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

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
    if matches!(source.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES)) {
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
    holder: libc::pid_t,
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
        let tmpfs = CString::new("tmpfs").expect("no NUL");
        let target = CString::new("/dev/shm").expect("no NUL");
        let root = CString::new("/").expect("no NUL");
        let options = CString::new(format!("size={bytes},mode=1777")).expect("no NUL");
        let mut fds = [0; 2];
        // SAFETY: valid out-array of two ints.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(fail("pipe2", io::Error::last_os_error()));
        }
        // SAFETY: both fds were just created and are owned here.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the child runs only async-signal-safe system calls (prctl, close_range,
        // unshare, mount, write, pause, _exit) and never returns into Rust code.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(fail("fork", io::Error::last_os_error()));
        }
        if pid == 0 {
            // SAFETY: see above; every pointer was prepared before the fork.
            unsafe { holder(parent, write.as_raw_fd(), &tmpfs, &target, &root, &options) }
        }
        drop(write);
        let mut report = [0u8; 5];
        let n = read_full(read.as_raw_fd(), &mut report);
        let reap = || {
            // SAFETY: our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
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
        let path = CString::new(format!("/proc/{pid}/ns/mnt")).expect("no NUL");
        // SAFETY: a valid path; the fd is owned below.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            reap();
            return Err(fail("open /proc/<holder>/ns/mnt", e));
        }
        // SAFETY: just opened, owned here.
        Ok(PrivateShm { holder: pid, ns: unsafe { OwnedFd::from_raw_fd(fd) } })
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
        // SAFETY: our own child.
        unsafe {
            libc::kill(self.holder, libc::SIGKILL);
            libc::waitpid(self.holder, std::ptr::null_mut(), 0);
        }
    }
}

fn read_full(fd: RawFd, buf: &mut [u8]) -> usize {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: writes at most the remaining length into `buf`.
        let n = unsafe { libc::read(fd, buf[got..].as_mut_ptr().cast(), buf.len() - got) };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        if n <= 0 {
            break;
        }
        got += n as usize;
    }
    got
}

/// The holder's life after fork. Never returns.
///
/// # Safety
/// Call only in the child of `fork`, with pointers prepared before it.
unsafe fn holder(
    parent: libc::pid_t,
    report: RawFd,
    tmpfs: &CString,
    target: &CString,
    root: &CString,
    options: &CString,
) -> ! {
    let tell = |step: u8, errno: i32| {
        let e = errno.to_ne_bytes();
        let msg = [step, e[0], e[1], e[2], e[3]];
        // SAFETY: a valid buffer and our pipe's write end.
        unsafe { libc::write(report, msg.as_ptr().cast(), msg.len()) };
    };
    let errno = || io::Error::last_os_error().raw_os_error().unwrap_or(0);
    // SAFETY: plain system calls on values prepared before the fork.
    unsafe {
        // Die with ups-doctor even when it is SIGKILLed: the namespace must not outlive the run.
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() != parent {
            libc::_exit(1);
        }
        // Hold no other file of the harness (a rank's pipe held here would never reach EOF).
        if report > 3 {
            libc::syscall(libc::SYS_close_range, 3u32, (report - 1) as u32, 0u32);
        }
        libc::syscall(libc::SYS_close_range, (report + 1) as u32, u32::MAX, 0u32);
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            tell(1, errno());
            libc::_exit(1);
        }
        if libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            tell(2, errno());
            libc::_exit(1);
        }
        let flags = libc::MS_NOSUID | libc::MS_NODEV;
        if libc::mount(tmpfs.as_ptr(), target.as_ptr(), tmpfs.as_ptr(), flags, options.as_ptr().cast()) != 0 {
            tell(3, errno());
            libc::_exit(1);
        }
        tell(0, 0);
        libc::close(report);
        loop {
            libc::pause();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_says_what_is_needed() {
        let e = NamespaceError {
            size: "64m".into(),
            step: "unshare(CLONE_NEWNS)",
            source: io::Error::from_raw_os_error(libc::EPERM),
        };
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
            Err(e) if matches!(e.source.raw_os_error(), Some(libc::EPERM)) => return,
            Err(e) => panic!("{e}"),
        };
        let usage = crate::probe::shm::usage(&shm.dir()).expect("statvfs through /proc/<holder>/root");
        assert_eq!(usage.total, 8 << 20);
        let machine = crate::probe::shm::usage(std::path::Path::new("/dev/shm"));
        assert_ne!(machine.map(|u| u.total), Some(8 << 20), "the machine's /dev/shm is untouched");
    }
}
