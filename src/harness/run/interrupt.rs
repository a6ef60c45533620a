//! Wakes a sleeping run loop when the user interrupts. `main`'s signal handler records the
//! interrupt in an atomic and calls [`notify`], which writes one byte into a pipe (the only
//! async-signal-safe way to wake a thread); a thread forwards it to the run loop of the moment
//! as [`Event::Interrupt`]. Without it a loop asleep until a distant deadline would not notice.

use std::os::fd::{BorrowedFd, IntoRawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, OnceLock};

use nix::fcntl::OFlag;

use crate::harness::process::{Event, Sink};

/// The pipe's write end; -1 until [`listen`] first ran.
static WRITE_FD: AtomicI32 = AtomicI32::new(-1);
/// The run loop to wake, while one runs.
static CURRENT: Mutex<Option<Sink>> = Mutex::new(None);
static STARTED: OnceLock<()> = OnceLock::new();

/// Async-signal-safe: wakes the run loop (if any) to look at the interrupt flag.
pub fn notify() {
    let fd = WRITE_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: the write end is never closed once published (see `listen`).
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
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
                if let Some(sink) = CURRENT.lock().ok().and_then(|c| c.clone()) {
                    sink.send(Event::Interrupt);
                }
            }
        };
        if std::thread::Builder::new().name("interrupts".into()).spawn(forward).is_ok() {
            // Published for the process's lifetime: the handler may use it at any moment.
            WRITE_FD.store(write.into_raw_fd(), Ordering::SeqCst);
        }
    });
    if let Ok(mut current) = CURRENT.lock() {
        *current = Some(sink);
    }
    Registration
}

/// While held, interrupts wake the run loop it was made for.
pub struct Registration;

impl Drop for Registration {
    fn drop(&mut self) {
        if let Ok(mut current) = CURRENT.lock() {
            *current = None;
        }
    }
}
