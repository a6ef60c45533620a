//! Interrupts: [`install_handler`] makes SIGINT, SIGTERM and SIGHUP start one orderly stop, and
//! wakes a sleeping run loop. The handler records the interrupt in [`INTERRUPTED`] and calls
//! [`notify`], which writes one byte into a pipe (the only
//! async-signal-safe way to wake a thread); a thread forwards it to the run loop of the moment
//! as [`Event::Interrupt`], and to every other one that runs at the time (`bisect` runs several
//! scenarios at once, on threads of its own). Without it a loop asleep until a distant deadline
//! would not notice.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use nix::fcntl::OFlag;
use nix::sys::signal::{SigHandler, Signal, signal};

use crate::harness::os::process::{Event, Sink};

/// The pipe's write end, once [`listen`] first ran; never closed after (the handler may use it at
/// any moment).
static WRITER: OnceLock<OwnedFd> = OnceLock::new();
/// The run loops to wake, while they run, each under the number of its registration.
static CURRENT: Mutex<Vec<(u64, Sink)>> = Mutex::new(Vec::new());
static NEXT: AtomicU64 = AtomicU64::new(0);
static STARTED: OnceLock<()> = OnceLock::new();

/// Async-signal-safe: wakes the run loop (if any) to look at the interrupt flag.
/// (`OnceLock::get` is one atomic load, and `write` a bare syscall.)
pub fn notify() {
    if let Some(fd) = WRITER.get() {
        // Non-blocking: a full pipe already holds a wake-up.
        let _ = nix::unistd::write(fd, b"!");
    }
}

/// Routes interrupts to `sink` until [`Registration`] is dropped.
pub fn listen(sink: Sink) -> Registration {
    STARTED.get_or_init(|| {
        let Ok((read, write)) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK) else { return };
        // The read end blocks: the forwarding thread sleeps in it.
        let _ = nix::fcntl::fcntl(&read, nix::fcntl::FcntlArg::F_SETFL(OFlag::empty()));
        let forward = move || {
            let mut byte = [0u8; 16];
            while nix::unistd::read(&read, &mut byte).is_ok_and(|n| n > 0) {
                let sinks: Vec<Sink> =
                    CURRENT.lock().map(|c| c.iter().map(|(_, s)| s.clone()).collect()).unwrap_or_default();
                for sink in sinks {
                    sink.send(Event::Interrupt);
                }
            }
        };
        if std::thread::Builder::new().name("interrupts".into()).spawn(forward).is_ok() {
            // Published for the process's lifetime: the handler may use it at any moment.
            let _ = WRITER.set(write);
        }
    });
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    if let Ok(mut current) = CURRENT.lock() {
        current.push((id, sink));
    }
    Registration(id)
}

/// While held, interrupts wake the run loop it was made for.
pub struct Registration(u64);

impl Drop for Registration {
    fn drop(&mut self) {
        if let Ok(mut current) = CURRENT.lock() {
            current.retain(|(id, _)| *id != self.0);
        }
    }
}

/// Set once the user interrupted (SIGINT, SIGTERM, SIGHUP): every run loop and session reads it.
pub static INTERRUPTED: AtomicBool = AtomicBool::new(false);
static INTERRUPTS: AtomicUsize = AtomicUsize::new(0);
/// When the first interrupt arrived (`CLOCK_MONOTONIC`, nanoseconds).
static FIRST_INTERRUPT_NS: AtomicU64 = AtomicU64::new(0);
/// A second signal this soon after the first is the same request (GNU `timeout` signals
/// ups-doctor, then its whole process group; a terminal's Ctrl-C reaches the group as well): it
/// does not cut the orderly stop short.
const INTERRUPT_GRACE_NS: u64 = 1_000_000_000;

extern "C" fn on_interrupt(_sig: i32) {
    // Async-signal-safe: nix calls clock_gettime and allocates nothing.
    let now = crate::protocol::monotonic_ns().unwrap_or(0);
    INTERRUPTED.store(true, Ordering::SeqCst);
    // Async-signal-safe: a byte into a pipe wakes a supervisor asleep until its next deadline.
    notify();
    match INTERRUPTS.fetch_add(1, Ordering::SeqCst) {
        0 => FIRST_INTERRUPT_NS.store(now, Ordering::SeqCst),
        1 if now.saturating_sub(FIRST_INTERRUPT_NS.load(Ordering::SeqCst)) <= INTERRUPT_GRACE_NS => {}
        // A third signal, or a second one after the grace: the user insists. Leave now; ranks
        // die with us (PR_SET_PDEATHSIG); results of finished scenarios are already on disk.
        // `exit_now` is async-signal-safe and runs no destructor or atexit handler of the
        // interrupted code.
        _ => crate::harness::os::sys::exit_now(crate::exit::INTERRUPTED as i32),
    }
}

/// SIGINT, SIGTERM (Slurm, Kubernetes, `timeout`) and SIGHUP all start the same orderly stop.
/// Installed before anything else a command does, so that no signal finds the default action.
pub fn install_handler() {
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler is async-signal-safe: it only touches atomics, reads the clock and
        // calls _exit.
        let _ = unsafe { signal(sig, SigHandler::Handler(on_interrupt)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_interrupt_wakes_every_run_loop_registered_and_none_after_it_ended() {
        let (first, first_queue, first_wakes) = Sink::new();
        let (second, second_queue, second_wakes) = Sink::new();
        let a = listen(first);
        let b = listen(second);
        notify();
        let wait = Duration::from_secs(30);
        assert!(first_wakes.recv_timeout(wait).is_ok() && second_wakes.recv_timeout(wait).is_ok());
        assert!(matches!(first_queue.try_recv(), Ok(Event::Interrupt)));
        assert!(matches!(second_queue.try_recv(), Ok(Event::Interrupt)));
        drop(a);
        notify();
        assert!(second_wakes.recv_timeout(wait).is_ok());
        assert!(first_wakes.try_recv().is_err(), "the first loop has ended");
        drop(b);
    }
}
