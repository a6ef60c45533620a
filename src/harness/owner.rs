//! Ownership before any signal. A process is this run's only when it is provably so:
//! - it carries the run id ([`RUN_ID_ENV`]) in the environment it started with
//!   (`/proc/PID/environ`, which a process cannot rewrite for another);
//! - its process group is one ups-doctor created (a rank's or the launcher's), or one led by a
//!   process that itself carries the run id (torchrun starts each rank in a session of its own);
//! - its start time (`/proc/PID/stat` field 22) is the one recorded when it was first seen, so a
//!   pid that was recycled since is someone else.
//!
//! The signal goes through a pidfd opened *before* the checks: if the pid is recycled between the
//! checks and the signal, the pidfd still names the process that was checked (and that is gone),
//! so the signal reaches nobody. Without pidfds (Linux < 5.3) it falls back to `kill(2)` right
//! after the checks.
//!
//! What a marker says (a `worker` marker's `pid`) is never a reason to signal anything: it is a
//! claim, checked here at arrival, and a claim on a foreign process is a bad marker.
//!
//! The other signal call sites own their target differently and say so where they are: a rank's
//! process group whose leader is our own unreaped child (`process.rs`), the namespace holder
//! (`namespace.rs`), a rank's own unreaped loader workers (`trainer/loader`), the crash
//! handler's `tgkill` to its own threads (`trainer/crash.rs`).

use std::io;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::protocol::RUN_ID_ENV;

use crate::probe::memory;

use super::os::pidfd;

/// A process as first seen: its pid and the kernel's start time for it (clock ticks since boot),
/// which no later process with the same pid shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub pid: u32,
    pub start_ticks: u64,
}

/// Why a process is not this run's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotOurs {
    /// No such process (or only a zombie).
    Gone,
    /// Its environment lacks this run's id.
    NoRunId,
    /// Its process group is not one of this run's.
    ForeignGroup,
    /// The pid now belongs to a process that started later than the one first seen.
    Recycled,
}

impl std::fmt::Display for NotOurs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NotOurs::Gone => "no such process",
            NotOurs::NoRunId => "it does not carry this run's id",
            NotOurs::ForeignGroup => "its process group is not one of this run's",
            NotOurs::Recycled => "its pid was reused by a later process",
        })
    }
}

/// This run, as ownership checks need it.
#[derive(Debug, Clone)]
pub struct Run {
    pub run_id: String,
    /// Process groups ups-doctor created: each rank's (led by the rank, our child) and the
    /// launcher's.
    pub groups: Vec<u32>,
}

/// `pid` as it is now, unless it is gone or a zombie.
pub fn identify(pid: u32) -> Option<Identity> {
    if pid == 0 || pid > i32::MAX as u32 {
        return None;
    }
    let stat = memory::read_stat(pid).filter(|s| !s.zombie())?;
    Some(Identity { pid, start_ticks: stat.start_ticks })
}

impl Run {
    /// Whether `who` is still the process first seen, and this run's.
    pub fn check(&self, who: Identity) -> Result<(), NotOurs> {
        // One handle for both reads: the environment read is of the process whose start time
        // was just checked, or it fails.
        let process = memory::ProcHandle::open(who.pid).ok_or(NotOurs::Gone)?;
        let stat = process.stat().filter(|s| !s.zombie()).ok_or(NotOurs::Gone)?;
        if stat.start_ticks != who.start_ticks {
            return Err(NotOurs::Recycled);
        }
        if !process.environ_has(RUN_ID_ENV, &self.run_id) {
            return Err(NotOurs::NoRunId);
        }
        let pgid = stat.pgid;
        let group_of_run =
            self.groups.contains(&pgid) || (pgid != 0 && memory::environ_has(pgid, RUN_ID_ENV, &self.run_id));
        if !group_of_run {
            return Err(NotOurs::ForeignGroup);
        }
        Ok(())
    }

    /// Whether a process a marker names can be taken as this run's: it must be alive and pass
    /// [`Run::check`] now. `Ok(None)` when it is already gone (a worker that ended before its
    /// marker was read): then it cannot be proved either way, and it is never signalled.
    pub fn claim(&self, pid: u32) -> Result<Option<Identity>, NotOurs> {
        let Some(who) = identify(pid) else { return Ok(None) };
        match self.check(who) {
            Ok(()) => Ok(Some(who)),
            Err(NotOurs::Gone) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Sends `signal` to `who` if, and only if, it is still the process first seen and this
    /// run's.
    pub fn signal(&self, who: Identity, signal: i32) -> Result<(), SignalError> {
        let pidfd = pidfd::open(who.pid);
        // The pidfd (when there is one) was opened first: the checks below are about the process
        // it names, or, if the pid was recycled in between, they fail on the newcomer.
        self.check(who).map_err(SignalError::NotOurs)?;
        let sent = match &pidfd {
            Ok(fd) => pidfd::send_signal(fd, signal),
            Err(e) if e.raw_os_error() == Some(Errno::ENOSYS as i32) => {
                // kill(2) on a process just checked to be this run's.
                Signal::try_from(signal)
                    .and_then(|signal| kill(Pid::from_raw(who.pid as i32), signal))
                    .map_err(io::Error::from)
            }
            Err(e) => Err(io::Error::from_raw_os_error(e.raw_os_error().unwrap_or(Errno::ESRCH as i32))),
        };
        sent.map_err(SignalError::Os)
    }
}

/// Why a signal was not sent.
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    #[error("not a process of this run: {0}")]
    NotOurs(NotOurs),
    #[error("failed to signal: {0}")]
    Os(io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    fn sleeper(run_id: Option<&str>) -> std::process::Child {
        let mut cmd = Command::new("sleep");
        cmd.arg("600").stdin(Stdio::null());
        cmd.env_remove(RUN_ID_ENV);
        if let Some(id) = run_id {
            cmd.env(RUN_ID_ENV, id);
        }
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
        let child = cmd.spawn().unwrap();
        // `/proc/PID/environ` is the new program's only once exec is done.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while memory::cmdline(child.id()).is_some_and(|c| !c.starts_with("sleep"))
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child
    }

    #[test]
    fn a_process_of_the_run_in_its_group_is_ours_and_can_be_signalled() {
        let mut child = sleeper(Some("owner-test-1"));
        let run = Run { run_id: "owner-test-1".into(), groups: vec![child.id()] };
        let who = identify(child.id()).unwrap();
        assert_eq!(run.check(who), Ok(()));
        run.signal(who, Signal::SIGKILL as i32).unwrap();
        assert!(child.wait().unwrap().code().is_none());
    }

    #[test]
    fn a_recycled_pid_a_foreign_environment_or_group_is_not_ours() {
        let mut ours = sleeper(Some("owner-test-2"));
        let mut foreign = sleeper(None);
        let run = Run { run_id: "owner-test-2".into(), groups: vec![ours.id(), foreign.id()] };
        let who = identify(ours.id()).unwrap();
        // What a pid reused since it was first seen looks like: the same pid, another start time.
        let earlier = Identity { pid: who.pid, start_ticks: who.start_ticks.wrapping_sub(1) };
        assert_eq!(run.check(earlier), Err(NotOurs::Recycled));
        assert!(matches!(
            run.signal(earlier, Signal::SIGKILL as i32),
            Err(SignalError::NotOurs(NotOurs::Recycled))
        ));
        let stranger = identify(foreign.id()).unwrap();
        assert!(matches!(
            run.signal(stranger, Signal::SIGKILL as i32),
            Err(SignalError::NotOurs(NotOurs::NoRunId))
        ));
        let other_groups = Run { run_id: "owner-test-2".into(), groups: vec![] };
        // Its group is led by itself, and it carries the run id: a group of the run.
        assert_eq!(other_groups.check(who), Ok(()));
        assert_eq!(Run { run_id: "another-run".into(), groups: vec![] }.check(who), Err(NotOurs::NoRunId));
        for c in [&mut ours, &mut foreign] {
            assert!(c.try_wait().unwrap().is_none(), "a refused signal was sent anyway");
            c.kill().unwrap();
            c.wait().unwrap();
        }
        assert_eq!(run.claim(ours.id()), Ok(None));
    }
}
