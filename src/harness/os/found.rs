//! Processes this run did not start itself (a launcher's ranks): whether one is still there, how
//! it ended (procfs while it is a zombie: we cannot wait for it), and a signal only after the
//! ownership check.

use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::probe::memory;

use super::process::Exit;
use super::tree::rank_members;
use super::{owner, sys};

/// A launcher's process, from one read of its `/proc/PID/stat`: how one that is not our child
/// ended can only be read while it is a zombie (field 52, the wait status, since Linux 3.5).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FoundState {
    Running,
    /// Its first thread has begun to exit: a zombie within milliseconds.
    Exiting,
    /// A zombie (with its exit status), or gone (reaped by the launcher: no status left to read).
    Ended(Option<Exit>),
}

/// One launcher-started process: whether it runs or has ended, and how, from one read of a
/// descriptor opened once (see [`memory::StatReader`]), and a way to sleep until it may have
/// ended ([`FoundWatch::sleep`]).
///
/// Its exit status is there to read only between the moment it is a zombie and the moment its
/// launcher reaps it, which for a launcher blocked in `wait` (`torch.multiprocessing.spawn`) is
/// at once. A multi-threaded process (every rank that imported torch) shows as a zombie with its
/// status as soon as its first thread has exited, while its other threads are still being torn
/// down; the launcher is told only when the last one has. A pidfd of the whole process turns
/// readable at that last moment, with the launcher: measured, it lost the race to spawn in 6 of
/// 10 runs of a segfaulting rank. So the watch sleeps on pidfds of a few of the process's other
/// threads (`PIDFD_THREAD`, Linux 6.9+), which turn readable as each exits, and on the whole
/// process's pidfd for the end of a process with no other thread; once the first thread shows
/// [`FoundState::Exiting`] the caller reads every few milliseconds until the zombie appears.
/// Without thread pidfds it cannot sleep: [`FoundWatch::sleep`] says so and the caller reads
/// every few milliseconds all along.
pub struct FoundWatch {
    pid: u32,
    stat: Option<memory::StatReader>,
    /// The whole process's pidfd, `None` without thread pidfds (then nothing is slept on).
    process: Option<OwnedFd>,
    /// Pidfds of up to [`EARLY_THREADS`] of its other threads (by thread id), each dropped once
    /// readable.
    threads: Vec<(u32, OwnedFd)>,
}

/// How many of a process's threads other than its first are slept on: any one of them exiting
/// wakes the watch, and in a process's exit they go in no fixed order.
const EARLY_THREADS: usize = 4;

impl FoundWatch {
    pub fn open(pid: u32) -> FoundWatch {
        // The stat first: it stays bound to this process, so pidfds opened after it for a pid
        // already reused are never slept on (the stat reads the first process gone).
        let stat = memory::StatReader::open(pid);
        let thread_pidfds = sys::pidfd_open_thread(pid).is_ok();
        let process = thread_pidfds.then(|| sys::pidfd_open(pid).ok()).flatten();
        FoundWatch { pid, stat, process, threads: Vec::new() }
    }

    /// Its state now, from one read (two reads, is it a zombie? is it alive?, could straddle its
    /// death and report it gone without the status it left); a process already gone when opened
    /// has ended.
    pub fn state(&mut self) -> FoundState {
        match self.stat.as_mut().and_then(memory::StatReader::read) {
            None => FoundState::Ended(None),
            Some(s) if s.state == 'Z' => FoundState::Ended(s.exit_code.map(decode_wait_status)),
            Some(s) if s.exiting => FoundState::Exiting,
            Some(_) => FoundState::Running,
        }
    }

    /// Sleeps until one of the process's threads exits or `timeout` passes; at once
    /// [`Slept::Cannot`] where there is nothing to sleep on (no thread pidfds: Linux before 6.9),
    /// for the caller to poll.
    pub fn sleep(&mut self, timeout: Duration) -> Slept {
        let Some(process) = self.process.as_ref() else { return Slept::Cannot };
        if self.threads.len() < EARLY_THREADS {
            let armed: Vec<u32> = self.threads.iter().map(|(tid, _)| *tid).collect();
            let more = other_threads(self.pid).into_iter().filter(|tid| !armed.contains(tid));
            let more: Vec<(u32, OwnedFd)> = more
                .filter_map(|tid| Some((tid, sys::pidfd_open_thread(tid).ok()?)))
                .take(EARLY_THREADS - armed.len())
                .collect();
            self.threads.extend(more);
        }
        let mut fds: Vec<PollFd> = std::iter::once(process)
            .chain(self.threads.iter().map(|(_, fd)| fd))
            .map(|fd| PollFd::new(fd.as_fd(), PollFlags::POLLIN))
            .collect();
        let timeout = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
        match poll(&mut fds, timeout) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => Slept::TimedOut,
            Ok(_) => {
                let ended: Vec<bool> =
                    fds[1..].iter().map(|f| f.revents().is_some_and(|r| !r.is_empty())).collect();
                let mut ended = ended.into_iter();
                self.threads.retain(|_| !ended.next().unwrap_or(false));
                Slept::Woke
            }
            Err(_) => Slept::Cannot,
        }
    }
}

/// How [`FoundWatch::sleep`] ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Slept {
    /// A thread of the process, or the process, exited.
    Woke,
    TimedOut,
    /// Nothing to sleep on: read the state every few milliseconds instead.
    Cannot,
}

/// The process's threads other than its first, oldest first (lowest thread id: a thread pool
/// made at start outlives the short threads made later).
fn other_threads(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    let mut tids: Vec<u32> =
        dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).filter(|&tid| tid != pid).collect();
    tids.sort_unstable();
    tids
}

/// A raw wait status as [`Exit`].
pub fn decode_wait_status(status: i32) -> Exit {
    if status & 0x7f == 0 {
        Exit::Code((status >> 8) & 0xff)
    } else {
        Exit::Signal { signal: status & 0x7f, core_dumped: status & 0x80 != 0 }
    }
}

/// Sends `signal` to a rank a launcher started, `who` as first found, and to every process below
/// it that is not another rank (`others`): its workers, whatever their process group (torchrun
/// starts each rank in a session of its own, slurmstepd puts a step's tasks in the first task's
/// group, `mp.spawn`'s ranks share the launcher's). Each one only after [`owner::Run::check`].
/// Returns whether the rank itself got it.
pub fn signal_found(run: &owner::Run, who: owner::Identity, others: &[u32], signal: i32) -> bool {
    let members = rank_members(who.pid, others);
    let sent = run.signal(who, signal).is_ok();
    if sent {
        let below: Vec<u32> = members.into_iter().filter(|&p| p != who.pid).collect();
        let send = |pid: u32| owner::identify(pid).is_some_and(|member| run.signal(member, signal).is_ok());
        if signal == libc::SIGKILL {
            // Cleanup helpers last (see `super::cleanup`).
            let alive = |pid: u32| owner::identify(pid).is_some_and(|member| run.check(member).is_ok());
            super::cleanup::kill_helpers_last(&below, send, alive);
        } else {
            below.into_iter().for_each(|pid| {
                send(pid);
            });
        }
    }
    sent
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;
    use std::time::Duration;

    #[test]
    fn wait_statuses_decode_like_waitpid() {
        assert_eq!(decode_wait_status(0), Exit::Code(0));
        assert_eq!(decode_wait_status(1 << 8), Exit::Code(1));
        assert_eq!(decode_wait_status(11), Exit::Signal { signal: 11, core_dumped: false });
        assert_eq!(decode_wait_status(0x80 | 6), Exit::Signal { signal: 6, core_dumped: true });
    }

    #[test]
    fn a_zombies_exit_status_is_read_from_procfs() {
        let child = Command::new("sh").args(["-c", "exit 3"]).spawn().unwrap();
        let pid = child.id();
        // Not reaped yet: it stays a zombie until waited for. Read until it is one: caught
        // mid-exit, it shows `Exiting` first (a fresh clone's unit tests on a loaded machine).
        let mut seen = FoundState::Running;
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while std::time::Instant::now() < deadline {
            seen = FoundWatch::open(pid).state();
            if matches!(seen, FoundState::Ended(_)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(seen, FoundState::Ended(Some(Exit::Code(3))));
        drop(child.wait_with_output());
        // Reaped: gone, with no status left to read.
        assert_eq!(FoundWatch::open(pid).state(), FoundState::Ended(None));
    }

    /// The watch wakes when one of the process's other threads exits, while the process runs
    /// on: how it hears of a rank's end before the rank's launcher does (see [`FoundWatch`]).
    #[test]
    fn a_watch_wakes_when_a_thread_of_the_process_exits_before_the_process_has() {
        use std::io::Write;
        let mut child = Command::new("python3")
            .args(["-c", "import sys, threading, time\nt = threading.Thread(target=sys.stdin.readline)\nt.start(); t.join(); time.sleep(600)"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        for _ in 0..3000 {
            if other_threads(pid).len() == 1 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(other_threads(pid).len(), 1, "the child's second thread started");
        let mut watch = FoundWatch::open(pid);
        if sys::pidfd_open_thread(std::process::id()).is_err() {
            // A kernel before 6.9: the caller polls.
            assert_eq!(watch.sleep(Duration::from_millis(1)), Slept::Cannot);
        } else {
            // Armed on the thread, which still waits for its line.
            assert_eq!(watch.sleep(Duration::from_millis(1)), Slept::TimedOut);
            child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
            assert_eq!(watch.sleep(Duration::from_secs(600)), Slept::Woke);
            assert_eq!(watch.state(), FoundState::Running, "the process itself runs on");
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(watch.state(), FoundState::Ended(None));
    }

    /// The watcher's descriptor, opened while the process runs, reads it running, then its
    /// zombie's status, then nothing once it is reaped.
    #[test]
    fn a_watch_opened_once_sees_running_the_zombies_status_and_then_gone() {
        let mut child = Command::new("sh")
            .args(["-c", "read line; exit 5"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut watch = FoundWatch::open(child.id());
        assert_eq!(watch.state(), FoundState::Running);
        assert_eq!(watch.state(), FoundState::Running, "read again from the same descriptor");
        drop(child.stdin.take());
        let mut seen = FoundState::Running;
        for _ in 0..500 {
            seen = watch.state();
            if seen != FoundState::Running {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(seen, FoundState::Ended(Some(Exit::Code(5))));
        let _ = child.wait();
        assert_eq!(watch.state(), FoundState::Ended(None));
        assert_eq!(FoundWatch::open(child.id()).state(), FoundState::Ended(None));
    }
}
