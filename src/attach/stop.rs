//! `attach --then stop`: ends the job in order once its evidence is written, as `run` ends its
//! ranks: SIGTERM to the launcher and every rank (a launcher passes it on; a rank's handlers run),
//! a grace, then SIGKILL to whatever of the job is left, its DataLoader workers included.
//!
//! Only the processes of the job as first seen are signalled: each was identified (pid and start
//! time) before the window, and a signal goes through a pidfd opened before that identity is
//! checked again ([`owner::signal_as_first_seen`]), so a process that ended and whose pid was
//! reused is never hit.

use std::time::{Duration, Instant};

use crate::harness::os::owner::{self, Identity};

/// How long the job gets to end after SIGTERM before what is left is killed.
pub const TERM_GRACE: Duration = Duration::from_secs(10);
/// How long killed processes get to disappear before they are named as survivors.
const KILL_WAIT: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(50);

/// What stopping did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stopped {
    /// Pids sent SIGTERM.
    pub termed: Vec<u32>,
    /// Pids still there after the grace, sent SIGKILL.
    pub killed: Vec<u32>,
    /// Pids still there after SIGKILL (a process in uninterruptible sleep, say).
    pub survivors: Vec<u32>,
    /// Seconds from SIGTERM until the last process of the job was gone (or gave up).
    pub took_s: f64,
    /// The grace between SIGTERM and SIGKILL, in seconds.
    pub grace_s: f64,
}

impl Stopped {
    /// One sentence for the report's evidence.
    pub fn sentence(&self) -> String {
        let list = |p: &[u32]| p.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
        let mut text = format!(
            "then stopped as asked (`--then stop`), after the stacks were read: SIGTERM to pid {}",
            list(&self.termed)
        );
        if self.killed.is_empty() {
            text += &format!("; every process of the job had ended {:.1} s later", self.took_s);
        } else {
            text +=
                &format!("; SIGKILL {:.0} s later to pid {}, still there", self.grace_s, list(&self.killed));
        }
        if !self.survivors.is_empty() {
            text += &format!("; pid {} outlived SIGKILL (uninterruptible sleep?)", list(&self.survivors));
        }
        text
    }
}

fn there(who: &Identity) -> bool {
    owner::identify(who.pid) == Some(*who)
}

fn wait_gone(all: &[Identity], limit: Duration) -> Vec<Identity> {
    let until = Instant::now() + limit;
    loop {
        let left: Vec<Identity> = all.iter().copied().filter(there).collect();
        if left.is_empty() || Instant::now() >= until {
            return left;
        }
        std::thread::sleep(POLL);
    }
}

/// Stops the job: `first` (launcher and ranks) get SIGTERM, and after `grace` ([`TERM_GRACE`])
/// whatever of `all` is still the process first seen gets SIGKILL.
pub fn stop(first: &[Identity], all: &[Identity], grace: Duration) -> Stopped {
    let start = Instant::now();
    let mut stopped = Stopped { grace_s: grace.as_secs_f64(), ..Stopped::default() };
    for who in first {
        if owner::signal_as_first_seen(*who, libc::SIGTERM).is_ok() {
            stopped.termed.push(who.pid);
        }
    }
    let left = wait_gone(all, grace);
    for who in &left {
        if owner::signal_as_first_seen(*who, libc::SIGKILL).is_ok() {
            stopped.killed.push(who.pid);
        }
    }
    if !left.is_empty() {
        stopped.survivors = wait_gone(&left, KILL_WAIT).iter().map(|w| w.pid).collect();
    }
    stopped.took_s = start.elapsed().as_secs_f64();
    stopped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_that_ignores_sigterm_is_killed_after_the_grace_and_a_gone_one_is_not_signalled() {
        let dir = tempfile::tempdir().unwrap();
        let trapped = dir.path().join("trapped");
        let script = format!("trap '' TERM; touch {}; while :; do sleep 0.1; done", trapped.display());
        let mut stubborn = std::process::Command::new("sh").args(["-c", &script]).spawn().unwrap();
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let gone_id = Identity { pid: gone.id(), start_ticks: 0 };
        gone.wait().unwrap();
        // The shell must have set its trap before it is signalled.
        while !trapped.exists() {
            std::thread::sleep(POLL);
        }
        let who = owner::identify(stubborn.id()).unwrap();
        let stopped = stop(&[who, gone_id], &[who, gone_id], Duration::from_secs(1));
        let _ = stubborn.wait();
        assert_eq!(stopped.termed, [who.pid]);
        assert_eq!(stopped.killed, [who.pid]);
        assert!(stopped.survivors.is_empty());
        assert!(stopped.sentence().contains(&format!("SIGKILL 1 s later to pid {}", who.pid)));
    }
}
