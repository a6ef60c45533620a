//! Killing a run's processes without defeating the processes whose work is to clean up after the
//! others.
//!
//! Python's `multiprocessing` registers every named semaphore (`/dev/shm/sem.mp-*`: a spawn- or
//! forkserver-context `Queue`, `Lock` or `Event`, as a DataLoader's iterator makes under
//! `mp.spawn`, Lightning's `ddp_spawn` or Ignite's `idist.Parallel`) and every `SharedMemory`
//! segment with its *resource tracker*, a process of its own (`python -c 'from
//! multiprocessing.resource_tracker import main;main(FD)'`) in the same process group, which
//! ignores SIGINT and SIGTERM and unlinks whatever is still registered once the last process that
//! could write to it is gone. PyTorch's `torch_shm_manager` does the same for the `file_system`
//! sharing strategy. SIGKILLing a whole group at once kills the tracker with the rest, before it
//! has cleaned up: measured on Ignite's `idist.Parallel` with 2 ranks × 4 DataLoader workers, a
//! rank's segfault left 28 semaphores in `/dev/shm` under ups-doctor and none without it (the
//! orphaned workers noticed their rank was gone, exited, and the tracker unlinked them).
//! So a kill goes to the others first, the helpers get a moment to do their work, and whatever
//! is left is killed after it.

use std::time::{Duration, Instant};

/// How long cleanup helpers get, once the processes they serve are killed, to exit by themselves.
pub const HELPER_GRACE: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(20);

/// Whether `pid` is a process whose work is to clean up after the others (see the module's
/// comment), from its command line.
pub fn is_cleanup_helper(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|raw| {
        let args: Vec<&[u8]> = raw.split(|&b| b == 0).collect();
        helper_command(&args)
    })
}

fn helper_command(args: &[&[u8]]) -> bool {
    let program = args.first().map(|a| a.rsplit(|&b| b == b'/').next().unwrap_or(a));
    program == Some(b"torch_shm_manager".as_slice())
        || args
            .windows(2)
            .any(|w| w[0] == b"-c" && w[1].starts_with(b"from multiprocessing.resource_tracker import"))
}

/// SIGKILLs `members`, cleanup helpers last: first every other one (`kill(pid)`, which proves the
/// process ours and sends), then, once the helpers have exited by themselves or
/// [`HELPER_GRACE`] has passed, whatever helper is left (`alive(pid)`: still running and ours).
/// Returns whether any process got the signal.
pub fn kill_helpers_last(
    members: &[u32],
    mut kill: impl FnMut(u32) -> bool,
    alive: impl Fn(u32) -> bool,
) -> bool {
    let (helpers, others): (Vec<u32>, Vec<u32>) = members.iter().partition(|&&pid| is_cleanup_helper(pid));
    let mut sent = false;
    for &pid in &others {
        sent |= kill(pid);
    }
    if !helpers.is_empty() {
        let deadline = Instant::now() + HELPER_GRACE;
        while Instant::now() < deadline && helpers.iter().any(|&pid| alive(pid)) {
            std::thread::sleep(POLL);
        }
        for &pid in helpers.iter().filter(|&&pid| alive(pid)) {
            sent |= kill(pid);
        }
    }
    sent
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<&[u8]> {
        line.split('\0').map(str::as_bytes).collect()
    }

    #[test]
    fn pythons_resource_tracker_and_torchs_shm_manager_are_cleanup_helpers() {
        // Python 3.11's `resource_tracker.ensure_running` (`spawnv_passfds` of the interpreter with
        // its flags), and the tracker as a `-B` interpreter starts it.
        assert!(helper_command(&args(
            "/usr/bin/python3\0-c\0from multiprocessing.resource_tracker import main;main(7)"
        )));
        assert!(helper_command(&args(
            "/venv/bin/python\0-B\0-c\0from multiprocessing.resource_tracker import main;main(3)"
        )));
        assert!(helper_command(&args("/venv/lib/python3.11/site-packages/torch/bin/torch_shm_manager\0")));
        // A spawned DataLoader worker or rank is not one, nor a program that mentions the tracker.
        assert!(!helper_command(&args(
            "/venv/bin/python\0-c\0from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=4, \
             pipe_handle=21)\0--multiprocessing-fork"
        )));
        assert!(!helper_command(&args(
            "python\0train.py\0--note\0from multiprocessing.resource_tracker import"
        )));
    }

    #[test]
    fn a_helper_is_killed_after_the_others_and_only_if_it_did_not_exit_by_itself() {
        let tracker = std::process::Command::new("python3")
            .args(["-c", "from multiprocessing.resource_tracker import main;import time;time.sleep(60)"])
            .spawn()
            .expect("python3 (the project's Python programs need it)");
        let mut tracker = tracker;
        let mut other = std::process::Command::new("sleep").arg("60").spawn().unwrap();
        let (t, o) = (tracker.id(), other.id());
        // Until the interpreter has exec'd, its command line is still the test's.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !is_cleanup_helper(t) && Instant::now() < deadline {
            std::thread::sleep(POLL);
        }
        assert!(is_cleanup_helper(t));
        let order = std::cell::RefCell::new(Vec::new());
        let kill = |pid: u32| {
            order.borrow_mut().push(pid);
            // SAFETY: kill(2) of this test's own children.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) == 0 }
        };
        // A helper that never exits by itself is killed once the grace has passed, after the other.
        let alive = |pid: u32| crate::probe::memory::read_stat(pid).is_some_and(|s| !s.zombie());
        assert!(kill_helpers_last(&[t, o], kill, alive));
        assert_eq!(*order.borrow(), [o, t]);
        tracker.wait().unwrap();
        other.wait().unwrap();
    }
}
