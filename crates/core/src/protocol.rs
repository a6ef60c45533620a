//! The marker wire format shared by the trainer (writer) and the harness (reader).
//!
//! Each rank or worker writes one JSON object per line to an inherited pipe whose file descriptor
//! number is in [`MARKER_FD_ENV`]. A line may carry the moment it was written, [`STAMP_KEY`]
//! (`CLOCK_MONOTONIC` in nanoseconds: one clock for every process of a machine); the harness
//! takes that as the marker's time, else the moment it read the line. It reads its pipes in
//! batches (to wake less often beside the trainer), so the writer's stamp is the exact one.
//!
//! This module owns only the format: no tch, no IO policy. The crash handler writes the
//! [`Marker::CrashRaw`] form by hand (it cannot allocate); [`write_crash_raw`] is that encoder, kept
//! here so the format stays in one place.

use serde::{Deserialize, Serialize};

/// Environment variable naming the marker pipe's file descriptor in a child process.
pub const MARKER_FD_ENV: &str = "UPS_DOCTOR_MARKER_FD";

/// Environment variable with the inode of the marker pipe named by [`MARKER_FD_ENV`]: a process
/// that inherited the variable but not the fd (a `spawn`ed worker, a child started with
/// `close_fds`) finds another file or none under that number, and must not write to it.
pub const MARKER_INO_ENV: &str = "UPS_DOCTOR_MARKER_INO";

/// Environment variable naming a FIFO that every process of a launcher-style run writes its
/// markers to (a launcher such as torchrun closes inherited fds in its ranks). Each line then
/// carries the writer's `rank` (and `pid`), which the harness reads to route it.
pub const MARKER_PATH_ENV: &str = "UPS_DOCTOR_MARKER_PATH";

/// Environment variable carrying the scenario's run id to every rank and worker. Every
/// `/dev/shm` segment a run creates is named `ups-doctor-<run id>-…`, so the harness can find and
/// remove them after the run, crashed or not.
pub const RUN_ID_ENV: &str = "UPS_DOCTOR_RUN_ID";

/// Set (to anything but `0` or empty) to skip the harness's GPU checks before launch and to let
/// ranks share GPUs (read by both the harness and the trainer).
pub const FORCE_GPU_ENV: &str = "UPS_DOCTOR_FORCE_GPU";

/// Whether [`FORCE_GPU_ENV`] is set.
pub fn gpu_forced() -> bool {
    std::env::var(FORCE_GPU_ENV).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Words before the `/dev/shm` figure (`USED of TOTAL bytes`) that a rank appends to a dead
/// worker's error message: it measures the moment it notices, before removing its ring, and the
/// harness reads the figure back for the bus-error verdict.
pub const SHM_HELD: &str = "/dev/shm held";

/// Signal the harness sends to a stuck process to ask it for a stack dump of every thread.
pub const STACK_DUMP_SIGNAL: i32 = Signal::SIGUSR1 as i32;

/// Longest marker line the harness accepts; longer lines are cut and flagged.
pub const MAX_MARKER_LINE: usize = 1 << 20;

/// The key of a marker line's write time: `CLOCK_MONOTONIC` in nanoseconds (Python:
/// `time.monotonic_ns()`). Optional; not part of [`Marker`], which ignores it.
pub const STAMP_KEY: &str = "mono_ns";

/// The write time a marker line carries ([`STAMP_KEY`]), found in its text without decoding it
/// again: the key at an object's key position (after `{` or `,`; inside a JSON string a quote is
/// always escaped, so the text there cannot match), followed by an unsigned integer.
pub fn stamp_of(line: &str) -> Option<u64> {
    let key = "\"mono_ns\":";
    let mut from = 0;
    while let Some(pos) = line[from..].find(key).map(|p| p + from) {
        let before = line[..pos].trim_end();
        if before.ends_with('{') || before.ends_with(',') {
            let rest = line[pos + key.len()..].trim_start();
            let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
            return rest[..digits].parse().ok();
        }
        from = pos + key.len();
    }
    None
}

/// `CLOCK_MONOTONIC` now, in nanoseconds: the clock of [`STAMP_KEY`]. Async-signal-safe.
pub fn monotonic_ns() -> Option<u64> {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).ok()?;
    Some(u64::try_from(now.tv_sec()).ok()? * 1_000_000_000 + u64::try_from(now.tv_nsec()).ok()?)
}

/// One event reported by a rank or worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Marker {
    /// The process is up and knows who it is. The Python helper (`python/ups_doctor.py`) sends
    /// what it knows; `device`, `libtorch` and the thread count may be missing there.
    Start {
        pid: u32,
        rank: u32,
        world_size: u32,
        #[serde(default)]
        device: String,
        #[serde(default)]
        libtorch: String,
        #[serde(default)]
        intra_op_threads: i64,
    },
    /// A phase begins (`model.build/encoder`, `data.next`, `forward`, …). Per-step phases carry the
    /// step number (0-based).
    Begin {
        phase: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<u64>,
    },
    /// A phase ends, with its duration measured in the process.
    End {
        phase: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<u64>,
        ms: f64,
    },
    /// A long phase is still making progress (`done` of `total` units), so silence from it is
    /// not mistaken for a hang. Not a heartbeat: only the working code path sends it.
    Progress { phase: String, done: u64, total: u64 },
    /// One optimizer step finished.
    /// Fields other than `step` may be absent (an external program that reports only its step):
    /// the loss is then not a number and is not kept.
    Step {
        step: u64,
        #[serde(default = "not_a_number", deserialize_with = "number_or_null")]
        loss: f64,
        /// Time spent waiting for the batch.
        #[serde(default)]
        data_ms: f64,
        /// Time in forward, backward and the optimizer.
        #[serde(default)]
        compute_ms: f64,
        #[serde(default)]
        samples: u64,
    },
    /// Training finished normally: without this marker an exit status of 0 is a false success.
    Done {
        #[serde(default)]
        steps: u64,
        #[serde(default = "not_a_number", deserialize_with = "number_or_null")]
        first_loss: f64,
        #[serde(default = "not_a_number", deserialize_with = "number_or_null")]
        final_loss: f64,
        /// A hash of every parameter's bytes: equal on all ranks when DDP kept them in sync.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        checksum: Option<String>,
        /// Bytes of optimizer state this rank holds (FSDP: its shard's only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        optimizer_state_bytes: Option<u64>,
    },
    /// The process is about to exit with an error it caught itself.
    Error { message: String },
    /// Written first by the crash handler, without allocating: the raw return addresses.
    CrashRaw { signal: i32, addrs: Vec<String> },
    /// Written second by the crash handler: the symbolised backtrace.
    Crash { signal: i32, frames: Vec<Frame> },
    /// One thread's stack, in answer to [`STACK_DUMP_SIGNAL`].
    Stack { tid: i64, thread: String, frames: Vec<Frame> },
    /// All threads have answered a stack-dump request.
    StackEnd { threads: u32 },
    /// The rank started data-loader worker `id` as process `pid` (`fork` or `spawn`).
    Worker { id: u32, pid: u32, start_method: String },
    /// The dataset cache is ready: its size and where it lives (`memory`, `disk`, `shm`).
    Dataset { bytes: u64, cache: String },
    /// From the observer in a user's Python program (`python/site/sitecustomize.py`): the process
    /// group `init_process_group` formed, as the program formed it.
    /// From the observer, as `init_process_group` is entered (before the rendezvous): the rank
    /// and world size it was given (its arguments, else `RANK` and `WORLD_SIZE`), where known. A
    /// rank that sent this and no `group` never returned from it: it ended waiting there.
    Joining {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rank: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        world_size: Option<u32>,
    },
    Group {
        backend: String,
        rank: u32,
        world_size: u32,
        #[serde(default)]
        store: String,
        /// The process's `LOCAL_RANK` when it formed the group (its place on its node), where
        /// its launcher set one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        local_rank: Option<u32>,
    },
    /// From the observer in a process ups-doctor started as one rank of a per-rank run: the
    /// process starts `nprocs` processes of its own through `torch.multiprocessing`
    /// (`start_processes`, which `spawn` calls) by `start_method`. It is a launcher, and the ranks
    /// are those processes, which its marker pipe does not reach.
    Starts {
        nprocs: u32,
        #[serde(default)]
        start_method: String,
    },
    /// From the observer, once torch is imported: the Python and the PyTorch the program runs
    /// (what it was built with, read from `torch.version`; nothing that touches CUDA).
    Torch {
        version: String,
        #[serde(default)]
        cuda: Option<String>,
        #[serde(default)]
        nccl: Option<String>,
        #[serde(default)]
        python: String,
        #[serde(default)]
        executable: String,
    },
    /// From the observer: a `torch.distributed` collective the program issued (`ms` absent) or
    /// that returned after `ms`; `seq` counts the collectives of its `group` from 1. On the
    /// default group, `pos` is its place in the group's own count (which counts the collectives
    /// issued from C++ too: DDP's), and `span` how many of them it issued once it returned.
    Collective {
        op: String,
        group: String,
        seq: u64,
        #[serde(default)]
        shapes: String,
        #[serde(default)]
        dtype: String,
        /// The program's own call site, `train.py:40`.
        #[serde(default)]
        site: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ms: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pos: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        span: Option<u64>,
        /// Collectives issued before this one that returned and were counted but not sent (the
        /// observer sends a batch's newest [`crate::schema::LEDGER_KEPT`] only).
        #[serde(default, skip_serializing_if = "is_zero_u64")]
        skipped: u64,
    },
    /// From the observer, whenever it moved (read every 0.25 s): the default group's own count of
    /// the collectives issued on it since it formed (`n`, the group's sequence number), and how
    /// many of them were `unseen` by the ledger: issued from C++, as DDP's gradient reductions are.
    Issued { n: u64, unseen: u64 },
    /// From the observer, at most once a second and at exit: optimizer steps, the median time of
    /// a step and of its parts, whether the process formed a group, and markers it dropped.
    Observer {
        steps: u64,
        #[serde(default)]
        timed_steps: u64,
        #[serde(default)]
        step_ms: f64,
        #[serde(default)]
        data_ms: f64,
        #[serde(default)]
        forward_ms: f64,
        #[serde(default)]
        collective_ms: f64,
        /// The median time a step spent in `torch.autograd.backward` (where a DDP rank waits for
        /// the others' gradients).
        #[serde(default, skip_serializing_if = "is_zero_f64")]
        backward_ms: f64,
        /// Every timed collective's time since the process started, in steps and between them.
        #[serde(default, skip_serializing_if = "is_zero_f64")]
        collective_total_ms: f64,
        #[serde(default)]
        distributed: bool,
        #[serde(default)]
        dropped: u64,
        /// The median of the collectives a step issued from C++ (DDP's gradient reductions).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        unseen_per_step: Option<f64>,
        /// The main thread's mean time a step on a CPU and runnable but waiting for one (the
        /// kernel's `schedstat`), in ms, since its first summary after steps were timed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cpu_run_ms: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cpu_wait_ms: Option<f64>,
        /// The same summed over the process's other threads (PyTorch's intra-op threads, gloo's,
        /// the observer's own).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        threads_run_ms: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        threads_wait_ms: Option<f64>,
        /// `torch.get_num_threads()`: the intra-op threads PyTorch computes with on the CPU.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        intra_op_threads: Option<u32>,
        /// The CPUs the process may run on (its affinity mask).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cpus: Option<u32>,
        /// The main thread's nice value.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        nice: Option<i32>,
        /// Sent from the process's exit handlers (`atexit`): the program's own code had finished
        /// (returned, or called `sys.exit`) and Python was about to shut down.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        exiting: bool,
        /// Sent by a process forked from the one that made the observer (a helper child ending
        /// through `sys.exit`): its figures are its parent's at the fork.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        forked: bool,
    },
}

/// For serde's `skip_serializing_if`: a count of zero is left out. (The protocol's own: the
/// result types import the protocol, not the other way round.)
pub(crate) fn is_zero_f64(n: &f64) -> bool {
    *n == 0.0
}

pub(crate) fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

fn not_a_number() -> f64 {
    f64::NAN
}

/// JSON has no NaN: a writer without a value sends `null` (or leaves the field out).
fn number_or_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// One frame of a native backtrace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Frame {
    pub addr: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symbol: Option<String>,
    /// `file:line` where debug info has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
}

impl Marker {
    /// Encodes the marker as one line, newline included.
    pub fn to_line(&self) -> String {
        self.line_with(None)
    }

    /// Encodes the marker as one line stamped with its write time `mono_ns` ([`STAMP_KEY`]).
    pub fn to_line_at(&self, mono_ns: u64) -> String {
        self.line_with(Some(mono_ns))
    }

    /// Encodes the marker as one line stamped with the time now ([`STAMP_KEY`]); unstamped if the
    /// clock cannot be read.
    pub fn to_stamped_line(&self) -> String {
        self.line_with(monotonic_ns())
    }

    fn line_with(&self, mono_ns: Option<u64>) -> String {
        let mut line = Vec::with_capacity(128);
        self.write_line(&mut line, mono_ns);
        String::from_utf8(line).expect("serde_json writes UTF-8")
    }

    /// Appends the marker as one line, stamped with `mono_ns` when given, to `out`: a writer that
    /// keeps `out` allocates nothing per marker once it has grown (a trainer sends about ten a
    /// step, between libtorch's own allocations).
    pub fn write_line(&self, out: &mut Vec<u8>, mono_ns: Option<u64>) {
        use std::io::Write;
        serde_json::to_writer(&mut *out, self).expect("markers always serialise");
        if let Some(ns) = mono_ns {
            // A marker is a JSON object: the stamp goes in before its closing brace.
            out.pop();
            let _ = write!(out, ",\"{STAMP_KEY}\":{ns}}}");
        }
        out.push(b'\n');
    }

    /// Decodes one line (without its newline).
    pub fn parse(line: &str) -> Result<Marker, serde_json::Error> {
        serde_json::from_str(line)
    }
}

/// Encodes a [`Marker::CrashRaw`] line into `buf` without allocating, for use in a signal
/// handler. Returns the number of bytes written; frames that do not fit are dropped.
pub fn write_crash_raw(buf: &mut [u8], signal: i32, mono_ns: Option<u64>, addrs: &[usize]) -> usize {
    let mut w = SliceWriter { buf, len: 0 };
    w.put(b"{\"t\":\"crash_raw\",\"signal\":");
    w.put_dec(signal as i64);
    if let Some(ns) = mono_ns {
        w.put(b",\"mono_ns\":");
        w.put_dec(ns as i64);
    }
    w.put(b",\"addrs\":[");
    for (i, &a) in addrs.iter().enumerate() {
        // Keep room for the closing `]}\n` and one more entry.
        if w.buf.len() - w.len < 24 + 4 {
            break;
        }
        if i > 0 {
            w.put(b",");
        }
        w.put(b"\"0x");
        w.put_hex(a);
        w.put(b"\"");
    }
    w.put(b"]}\n");
    w.len
}

struct SliceWriter<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl SliceWriter<'_> {
    fn put(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    fn put_dec(&mut self, mut v: i64) {
        if v < 0 {
            self.put(b"-");
            v = -v;
        }
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.put(&digits[i..]);
    }

    fn put_hex(&mut self, v: usize) {
        let mut digits = [0u8; 16];
        let mut i = digits.len();
        let mut v = v;
        loop {
            i -= 1;
            digits[i] = b"0123456789abcdef"[v & 0xf];
            v >>= 4;
            if v == 0 {
                break;
            }
        }
        self.put(&digits[i..]);
    }
}

/// Signals by name and number, as nix knows them for this platform (the numbers differ between
/// architectures, so nothing here spells one out). Re-exported so that pure modules (`diagnose`)
/// can match on signals without importing an OS crate.
pub use nix::sys::signal::Signal;

/// The conventional name of a signal number (`SIGSEGV`), or `SIG<n>` for others (real-time
/// signals, numbers the platform does not define).
pub fn signal_name(sig: i32) -> String {
    match Signal::try_from(sig) {
        Ok(s) => s.as_str().to_string(),
        Err(_) => format!("SIG{sig}"),
    }
}

/// The signal number for a name such as `SIGSEGV` or `segv` (any case); `None` if unknown.
pub fn signal_number(name: &str) -> Option<i32> {
    let upper = name.to_ascii_uppercase();
    let full = if upper.starts_with("SIG") { upper } else { format!("SIG{upper}") };
    full.parse::<Signal>().ok().map(|s| s as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_raw_encoding_parses_as_a_marker() {
        let mut buf = [0u8; 256];
        let n = write_crash_raw(&mut buf, 11, Some(123_456_789_012), &[0x1234, 0xdead_beef]);
        let line = std::str::from_utf8(&buf[..n]).unwrap();
        assert!(line.ends_with('\n'));
        assert_eq!(stamp_of(line), Some(123_456_789_012));
        let marker = Marker::parse(line.trim_end()).unwrap();
        assert_eq!(
            marker,
            Marker::CrashRaw { signal: 11, addrs: vec!["0x1234".into(), "0xdeadbeef".into()] }
        );
    }

    #[test]
    fn crash_raw_encoding_drops_frames_that_do_not_fit_but_stays_valid() {
        let mut buf = [0u8; 96];
        let addrs: Vec<usize> = (0..50).map(|i| 0x7fff_0000_0000 + i).collect();
        let n = write_crash_raw(&mut buf, 6, None, &addrs);
        let marker = Marker::parse(std::str::from_utf8(&buf[..n]).unwrap().trim_end()).unwrap();
        match marker {
            Marker::CrashRaw { signal, addrs } => {
                assert_eq!(signal, 6);
                assert!(!addrs.is_empty() && addrs.len() < 50);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn markers_round_trip_through_lines() {
        let m = Marker::Step { step: 3, loss: 0.5, data_ms: 1.0, compute_ms: 2.0, samples: 16 };
        assert_eq!(Marker::parse(m.to_line().trim_end()).unwrap(), m);
        assert_eq!(stamp_of(&m.to_line()), None);
        let stamped = m.to_line_at(42_000_000_001);
        assert!(stamped.ends_with(",\"mono_ns\":42000000001}\n"), "{stamped}");
        assert_eq!(Marker::parse(stamped.trim_end()).unwrap(), m, "the stamp is no field of the marker");
        assert_eq!(stamp_of(&stamped), Some(42_000_000_001));
        let now = monotonic_ns().unwrap();
        assert!(stamp_of(&m.to_stamped_line()).is_some_and(|ns| ns >= now));
    }

    #[test]
    fn a_stamp_is_found_only_where_it_is_a_key() {
        // Any place among the keys, with the spaces other writers (Python's `json.dumps`) put.
        assert_eq!(stamp_of(r#"{"mono_ns": 17, "t":"progress","phase":"x","done":1,"total":2}"#), Some(17));
        assert_eq!(stamp_of(r#"{"t":"error" , "mono_ns":5,"message":"m"}"#), Some(5));
        // The same text inside a string value is escaped there, so it is no stamp.
        assert_eq!(stamp_of(r#"{"t":"error","message":"a,\"mono_ns\":9"}"#), None);
        assert_eq!(stamp_of(r#"{"t":"error","message":"a,\"mono_ns\":9","mono_ns":10}"#), Some(10));
        assert_eq!(stamp_of(r#"{"t":"error","mono_ns":-3}"#), None);
        assert_eq!(stamp_of(r#"{"t":"error","mono_ns":"3"}"#), None);
        assert_eq!(stamp_of("not json"), None);
    }

    #[test]
    fn signal_names_round_trip() {
        assert_eq!(signal_name(Signal::SIGSEGV as i32), "SIGSEGV");
        assert_eq!(signal_number("segv"), Some(Signal::SIGSEGV as i32));
        assert_eq!(signal_number("SIGABRT"), Some(Signal::SIGABRT as i32));
        assert_eq!(signal_number("nope"), None);
        assert_eq!(signal_number("SIG"), None);
        // Every number the platform names round-trips; an unnamed one keeps its number.
        for s in Signal::iterator() {
            assert_eq!(signal_number(&signal_name(s as i32)), Some(s as i32));
        }
        assert_eq!(signal_name(40), "SIG40");
    }
}
