//! Writes markers to the pipe the harness handed down (`UPS_DOCTOR_MARKER_FD`).
//!
//! Without that variable (a rank started by hand, torchrun or Slurm) markers are dropped, so the
//! trainer behaves the same with or without a harness. A harness that went away (EPIPE) is not an
//! error for training either: markers are evidence, never control flow.

use std::fs::File;
use std::io::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Instant;

use nix::fcntl::{FcntlArg, FdFlag, fcntl};

use crate::os;
use crate::protocol::{self, MARKER_FD_ENV, Marker};

/// The raw marker fd, for the crash handler, which cannot take the mutex.
static RAW_FD: AtomicI32 = AtomicI32::new(-1);
/// The marker pipe and the buffer each line is encoded into (kept, so that sending a marker
/// allocates nothing once the buffer has grown).
static SINK: Mutex<Option<(File, Vec<u8>)>> = Mutex::new(None);

/// Opens the marker pipe named by the environment, once, at start-up.
pub fn init_from_env() {
    let Some(fd) = std::env::var(MARKER_FD_ENV).ok().and_then(|v| v.parse::<i32>().ok()) else {
        return;
    };
    let Some(file) = os::adopt_inherited_fd(fd) else { return };
    // Children we start later (loader workers, a shell) must not inherit the rank's pipe.
    let _ = fcntl(&file, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
    RAW_FD.store(fd, Ordering::SeqCst);
    *SINK.lock().unwrap_or_else(|e| e.into_inner()) = Some((file, Vec::with_capacity(4096)));
}

/// The marker fd for async-signal-safe writers, or -1.
pub fn raw_fd() -> i32 {
    RAW_FD.load(Ordering::SeqCst)
}

/// Sends one marker; silently does nothing without a harness.
pub fn emit(marker: &Marker) {
    let mut sink = SINK.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((file, line)) = sink.as_mut() {
        // One write per line: pipe writes up to PIPE_BUF are atomic, so lines never interleave
        // with the stack-dump thread's. Stamped with the time of writing: the harness reads its
        // pipes in batches, so the time it reads a line at is not when the line was written.
        line.clear();
        marker.write_line(line, protocol::monotonic_ns());
        let _ = file.write_all(line);
    }
}

/// A phase in progress: emits `begin` now and `end` with the duration when finished.
pub struct Phase {
    name: String,
    step: Option<u64>,
    started: Instant,
}

impl Phase {
    pub fn begin(name: impl Into<String>, step: Option<u64>) -> Phase {
        let name = name.into();
        emit(&Marker::Begin { phase: name.clone(), step });
        Phase { name, step, started: Instant::now() }
    }

    /// Ends the phase and returns its duration in milliseconds.
    pub fn end(self) -> f64 {
        let ms = self.started.elapsed().as_secs_f64() * 1e3;
        emit(&Marker::End { phase: self.name, step: self.step, ms });
        ms
    }
}
