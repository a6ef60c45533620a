//! Ownership before any signal. A process is this run's only when it is provably so:
//! - it carries the run id ([`RUN_ID_ENV`]) in the environment it started with
//!   (`/proc/PID/environ`, which a process cannot rewrite for another);
//! - its process group is one ups-doctor created (a rank's or the launcher's), or one led by a
//!   process that itself carries the run id (torchrun starts each rank in a session of its own),
//!   or it is (or descends from) a rank this run found below its launcher, checked against the
//!   start time recorded when it was found (`srun`'s second task sits in the first task's group,
//!   which outlives neither that task nor slurmstepd's choice of groups);
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

use super::sys;

/// A process as first seen: its pid and the kernel's start time for it (clock ticks since boot),
/// which no later process with the same pid shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Identity {
    pub pid: u32,
    pub start_ticks: u64,
}

/// Why a process is not this run's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotOurs {
    /// No such process (or only a zombie).
    Gone,
    /// It is exiting: its memory is already released (reading its environment then fails with
    /// ESRCH while `stat` still shows it running, until it is a zombie), so nothing of it can be
    /// proved, and there is nothing to signal.
    Exiting,
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
            NotOurs::Exiting => "it is exiting (its memory is already released)",
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
    /// Ranks found below a launcher, as first seen (each carried the run id then): they and
    /// their descendants are this run's whatever their process group.
    pub ranks: Vec<Identity>,
}

/// Whether `pid` descends from this ups-doctor process (with `through`, only through processes
/// that carry that run id: each a process of the run). ups-doctor is the child subreaper of what
/// it starts (`sys::become_child_subreaper`), so a process of a run whose parent is gone (a
/// daemon's double fork after `setsid`, whose process group's leader has exited) is reparented to
/// it, not to init: with the run id in its environment, that is proof it is the run's; and a
/// member of a scenario's cgroup that does not descend from it was moved in from outside.
pub fn below_us(pid: u32, through: Option<&str>) -> bool {
    let me = std::process::id();
    let mut pid = pid;
    // Bounded: a process tree is not deeper than this, and a cycle cannot hold us.
    for _ in 0..64 {
        let Some(stat) = memory::read_stat(pid) else { return false };
        if stat.ppid == me {
            return true;
        }
        if stat.ppid <= 1 || through.is_some_and(|id| !memory::environ_has(stat.ppid, RUN_ID_ENV, id)) {
            return false;
        }
        pid = stat.ppid;
    }
    false
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
        match process.environ_holds(RUN_ID_ENV, &self.run_id) {
            Some(true) => {}
            Some(false) => return Err(NotOurs::NoRunId),
            None => return Err(NotOurs::Exiting),
        }
        let pgid = stat.pgid;
        let group_of_run =
            self.groups.contains(&pgid) || (pgid != 0 && memory::environ_has(pgid, RUN_ID_ENV, &self.run_id));
        if !group_of_run && !self.below_a_rank(who.pid) && !below_us(who.pid, Some(&self.run_id)) {
            return Err(NotOurs::ForeignGroup);
        }
        Ok(())
    }

    /// Whether `pid` is a found rank or descends from one, each still the process first seen.
    fn below_a_rank(&self, pid: u32) -> bool {
        let mut pid = pid;
        // Bounded: a process tree is not deeper than this, and a cycle cannot hold us.
        for _ in 0..64 {
            let Some(stat) = memory::read_stat(pid) else { return false };
            if self.ranks.iter().any(|r| r.pid == pid && r.start_ticks == stat.start_ticks) {
                return true;
            }
            if stat.ppid <= 1 {
                return false;
            }
            pid = stat.ppid;
        }
        false
    }

    /// Whether a process a marker names can be taken as this run's: it must be alive and pass
    /// [`Run::check`] now. `Ok(None)` when it is already gone or exiting (a worker killed before
    /// its marker was read: seen in the suite, where a SIGKILLed worker whose environment could
    /// no longer be read was called "not a process of this run"): then it cannot be proved either way, and it is never
    /// signalled.
    pub fn claim(&self, pid: u32) -> Result<Option<Identity>, NotOurs> {
        let Some(who) = identify(pid) else { return Ok(None) };
        match self.check(who) {
            Ok(()) => Ok(Some(who)),
            Err(NotOurs::Gone | NotOurs::Exiting) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Sends `signal` to `who` if, and only if, it is still the process first seen and this
    /// run's.
    pub fn signal(&self, who: Identity, signal: i32) -> Result<(), SignalError> {
        send_checked(who, signal, || self.check(who))
    }
}

/// Sends `signal` to `who` if, and only if, it is still the process first seen (its pid and start
/// time): for a job the user named and asked to stop (`attach --then stop`), which carries no run
/// id of ours.
pub fn signal_as_first_seen(who: Identity, signal: i32) -> Result<(), SignalError> {
    send_checked(who, signal, || match identify(who.pid) {
        None => Err(NotOurs::Gone),
        Some(now) if now != who => Err(NotOurs::Recycled),
        Some(_) => Ok(()),
    })
}

/// Opens a pidfd, then runs `check`, then signals through the pidfd.
fn send_checked(
    who: Identity,
    signal: i32,
    check: impl FnOnce() -> Result<(), NotOurs>,
) -> Result<(), SignalError> {
    let pidfd = sys::pidfd_open(who.pid);
    // The pidfd (when there is one) was opened first: the checks below are about the process it
    // names, or, if the pid was recycled in between, they fail on the newcomer.
    check().map_err(SignalError::NotOurs)?;
    let sent = match &pidfd {
        Ok(fd) => sys::pidfd_send_signal(fd, signal),
        Err(e) if e.raw_os_error() == Some(Errno::ENOSYS as i32) => {
            // kill(2) on a process just checked.
            Signal::try_from(signal)
                .and_then(|signal| kill(Pid::from_raw(who.pid as i32), signal))
                .map_err(io::Error::from)
        }
        Err(e) => Err(io::Error::from_raw_os_error(e.raw_os_error().unwrap_or(Errno::ESRCH as i32))),
    };
    sent.map_err(SignalError::Os)
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
        let run = Run { run_id: "owner-test-1".into(), groups: vec![child.id()], ranks: vec![] };
        let who = identify(child.id()).unwrap();
        assert_eq!(run.check(who), Ok(()));
        run.signal(who, Signal::SIGKILL as i32).unwrap();
        assert!(child.wait().unwrap().code().is_none());
    }

    #[test]
    fn a_recycled_pid_a_foreign_environment_or_group_is_not_ours() {
        let mut ours = sleeper(Some("owner-test-2"));
        let mut foreign = sleeper(None);
        let run = Run { run_id: "owner-test-2".into(), groups: vec![ours.id(), foreign.id()], ranks: vec![] };
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
        let other_groups = Run { run_id: "owner-test-2".into(), groups: vec![], ranks: vec![] };
        // Its group is led by itself, and it carries the run id: a group of the run.
        assert_eq!(other_groups.check(who), Ok(()));
        assert_eq!(
            Run { run_id: "another-run".into(), groups: vec![], ranks: vec![] }.check(who),
            Err(NotOurs::NoRunId)
        );
        for c in [&mut ours, &mut foreign] {
            assert!(c.try_wait().unwrap().is_none(), "a refused signal was sent anyway");
            c.kill().unwrap();
            c.wait().unwrap();
        }
        assert_eq!(run.claim(ours.id()), Ok(None));
    }

    #[test]
    fn a_process_below_us_through_processes_of_the_run_only_is_ours_by_ancestry() {
        // sh (no run id) → sleep: below us, but not through processes of the run.
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "env UPS_DOCTOR_RUN_ID=owner-test-4 sleep 600 & wait"]).stdin(Stdio::null());
        cmd.env_remove(RUN_ID_ENV);
        let mut shell = cmd.spawn().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let sleep = loop {
            let found = memory::processes()
                .into_iter()
                .find(|p| p.ppid == shell.id() && memory::environ_has(p.pid, RUN_ID_ENV, "owner-test-4"));
            if let Some(p) = found {
                break p.pid;
            }
            assert!(std::time::Instant::now() < deadline, "the sleep started");
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert!(below_us(shell.id(), None) && below_us(sleep, None));
        assert!(below_us(shell.id(), Some("owner-test-4")), "our own child");
        assert!(!below_us(sleep, Some("owner-test-4")), "its parent is no process of the run");
        assert!(!below_us(1, None), "init is no descendant");
        let none = Run { run_id: "owner-test-4".into(), groups: vec![], ranks: vec![] };
        assert_eq!(none.check(identify(sleep).unwrap()), Err(NotOurs::ForeignGroup));
        let _ = nix::sys::signal::kill(Pid::from_raw(sleep as i32), Signal::SIGKILL);
        shell.wait().unwrap();
    }

    #[test]
    fn a_found_rank_in_a_foreign_group_and_its_children_are_ours_only_as_first_seen() {
        // A leader without the run id (slurmstepd's first task, say) whose child carries it (the
        // second task, in the first one's group), and that child's own child (its worker).
        let mut leader = Command::new("sh");
        leader
            .args(["-c", "env UPS_DOCTOR_RUN_ID=owner-test-3 sh -c 'sleep 600 & wait' & wait"])
            .stdin(Stdio::null())
            .env_remove(RUN_ID_ENV);
        use std::os::unix::process::CommandExt;
        leader.process_group(0);
        let mut leader = leader.spawn().unwrap();
        // A process in the middle of its exec already has its new command name but not yet its
        // new environment (the kernel sets the name before it lays out the new stack): started
        // means both are there.
        let started = |p: &memory::ProcStat| memory::environ(p.pid).is_some_and(|env| !env.is_empty());
        let below =
            |pid: u32| memory::processes().into_iter().find(|p| p.ppid == pid && !p.zombie()).filter(started);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let (task, worker) = loop {
            // The task is the leader's child once `env` has become `sh`; the worker is its `sleep`.
            let task = below(leader.id()).filter(|t| t.command == "sh");
            let worker = task.as_ref().and_then(|t| below(t.pid)).filter(|w| w.command == "sleep");
            if let (Some(t), Some(w)) = (task, worker) {
                break (t.pid, w.pid);
            }
            assert!(std::time::Instant::now() < deadline, "the task and its worker started");
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        let task = identify(task).unwrap();
        let worker = identify(worker).unwrap();
        let none = Run { run_id: "owner-test-3".into(), groups: vec![], ranks: vec![] };
        assert_eq!(none.check(task), Err(NotOurs::ForeignGroup));
        let found = Run { ranks: vec![task], ..none.clone() };
        assert_eq!(found.check(task), Ok(()));
        assert_eq!(found.check(worker), Ok(()));
        // The rank as it would be had its pid been reused since it was found.
        let stale = Identity { pid: task.pid, start_ticks: task.start_ticks.wrapping_sub(1) };
        let recycled = Run { ranks: vec![stale], ..none.clone() };
        assert_eq!(recycled.check(worker), Err(NotOurs::ForeignGroup));
        // The leader never carried the run id: being above a rank proves nothing.
        let leader_id = identify(leader.id()).unwrap();
        assert_eq!(found.check(leader_id), Err(NotOurs::NoRunId));
        // Signal 0: the checks and the permission, nothing delivered.
        found.signal(worker, 0).unwrap();
        found.signal(task, 0).unwrap();
        assert!(matches!(none.signal(task, 0), Err(SignalError::NotOurs(NotOurs::ForeignGroup))));
        // The leader's group is our own child's, made for this test.
        nix::sys::signal::killpg(Pid::from_raw(leader.id() as i32), Signal::SIGKILL).unwrap();
        leader.wait().unwrap();
    }
}
