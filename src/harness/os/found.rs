//! Processes this run did not start itself (a launcher's ranks): whether one is still there, how
//! it ended (procfs while it is a zombie: we cannot wait for it), and a signal only after the
//! ownership check.

use crate::probe::memory;

use super::owner;
use super::process::Exit;
use crate::harness::discover::rank_members;

/// A launcher's process, from one read of its `/proc/PID/stat`: how one that is not our child
/// ended can only be read while it is a zombie (field 52, the wait status, since Linux 3.5).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FoundState {
    Running,
    /// A zombie (with its exit status), or gone (reaped by the launcher: no status left to read).
    Ended(Option<Exit>),
}

/// One launcher-started process: whether it runs or has ended, and how, from one read of a
/// descriptor opened once (see [`memory::StatReader`]), so that a watcher can poll it every few
/// milliseconds.
pub struct FoundWatch(Option<memory::StatReader>);

impl FoundWatch {
    pub fn open(pid: u32) -> FoundWatch {
        FoundWatch(memory::StatReader::open(pid))
    }

    /// Its state now, from one read (two reads, is it a zombie? is it alive?, could straddle its
    /// death and report it gone without the status it left); a process already gone when opened
    /// has ended.
    pub fn state(&mut self) -> FoundState {
        match self.0.as_mut().and_then(memory::StatReader::read) {
            None => FoundState::Ended(None),
            Some(s) if s.state == 'Z' => FoundState::Ended(s.exit_code.map(decode_wait_status)),
            Some(_) => FoundState::Running,
        }
    }
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
        for pid in members.into_iter().filter(|&p| p != who.pid) {
            if let Some(member) = owner::identify(pid) {
                let _ = run.signal(member, signal);
            }
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
        // Not reaped yet: it stays a zombie until waited for.
        let mut seen = FoundState::Running;
        for _ in 0..500 {
            seen = FoundWatch::open(pid).state();
            if seen != FoundState::Running {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(seen, FoundState::Ended(Some(Exit::Code(3))));
        drop(child.wait_with_output());
        // Reaped: gone, with no status left to read.
        assert_eq!(FoundWatch::open(pid).state(), FoundState::Ended(None));
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
