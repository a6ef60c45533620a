//! Watching a job's processes over a short window, read-only: each process's state and CPU time
//! (`/proc/PID/stat`), each thread's wait channel and system call, Python stacks by `py-spy dump
//! --nonblocking` (it reads the process's memory without stopping it; `--native` needs a stop, so
//! native frames are taken only when asked), memory (`smaps_rollup`) and `/dev/shm`. No signal is
//! sent, nothing is written into the processes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::kernel_threads;
use crate::probe::{memory, run, shm};
use crate::schema::KernelThread;

/// What one look at one process found.
#[derive(Debug, Clone, PartialEq)]
pub struct Look {
    /// Seconds since the window began.
    pub at_s: f64,
    /// `R`, `S`, `D`, `Z`; `None`: gone.
    pub state: Option<char>,
    /// User + system CPU time so far, seconds.
    pub cpu_s: Option<f64>,
    pub py_spy: Option<String>,
    pub error: Option<String>,
    pub threads: Vec<KernelThread>,
}

/// One process over the window.
#[derive(Debug, Clone, PartialEq)]
pub struct Watched {
    pub pid: u32,
    pub looks: Vec<Look>,
    pub memory: Option<memory::Rollup>,
}

impl Watched {
    /// CPU seconds used between the first and the last look that read it.
    pub fn cpu_used_s(&self) -> Option<f64> {
        let read: Vec<f64> = self.looks.iter().filter_map(|l| l.cpu_s).collect();
        Some(read.last()? - read.first()?)
    }
}

/// How to watch.
#[derive(Debug, Clone)]
pub struct Options {
    pub window: Duration,
    /// Looks over the window (at least 2: its start and its end).
    pub looks: u32,
    /// `py-spy dump --native`: pauses each process while its stack is read (ptrace; no signal).
    pub native: bool,
    pub py_spy: Option<PathBuf>,
}

/// `/dev/shm` as seen at the end of the window.
#[derive(Debug, Clone, Default)]
pub struct Shm {
    pub used: u64,
    pub total: u64,
    pub segments: Vec<shm::Segment>,
}

/// How long one `py-spy dump` may take.
const PY_SPY_TIMEOUT: Duration = Duration::from_secs(10);

fn cpu_and_state(pid: u32) -> (Option<char>, Option<f64>) {
    match procfs::process::Process::new(pid as i32).and_then(|p| p.stat()) {
        Ok(s) => (Some(s.state), Some((s.utime + s.stime) as f64 / procfs::ticks_per_second() as f64)),
        Err(_) => (None, None),
    }
}

fn dump(py_spy: Option<&Path>, pid: u32, native: bool) -> (Option<String>, Option<String>) {
    let Some(py_spy) = py_spy else {
        return (None, Some("py-spy is not installed (not on `PATH`, not next to the job's Python or ups-doctor): `pip install py-spy` for Python stacks".into()));
    };
    let mut cmd = Command::new(py_spy);
    cmd.arg("dump");
    cmd.arg(if native { "--native" } else { "--nonblocking" });
    cmd.args(["--pid", &pid.to_string()]);
    let shown = format!("py-spy dump {} --pid {pid}", if native { "--native" } else { "--nonblocking" });
    match run::bounded(&mut cmd, PY_SPY_TIMEOUT) {
        Ok(Some(done)) if done.status.success() => (Some(done.stdout), None),
        Ok(Some(done)) => {
            let why = format!("{}\n{}", done.stdout.trim(), done.stderr.trim()).trim().to_string();
            (None, Some(format!("`{shown}` failed: {why}")))
        }
        Ok(None) => (
            None,
            Some(format!("`{shown}` did not answer within {}", humantime::format_duration(PY_SPY_TIMEOUT))),
        ),
        Err(e) => (None, Some(format!("cannot run `{}`: {e}", py_spy.display()))),
    }
}

fn look(pid: u32, at: Instant, options: &Options) -> Look {
    let (state, cpu_s) = cpu_and_state(pid);
    let threads = kernel_threads(pid);
    let (py_spy, error) = match state {
        Some('Z') | None => (None, Some("the process has exited".to_string())),
        _ => dump(options.py_spy.as_deref(), pid, options.native),
    };
    Look { at_s: at.elapsed().as_secs_f64(), state, cpu_s, py_spy, error, threads }
}

/// Watches `pids` over the window: `looks` evenly spaced looks, every process read in parallel at
/// each.
pub fn watch(pids: &[u32], options: &Options) -> Vec<Watched> {
    let start = Instant::now();
    let looks = options.looks.max(2);
    let mut out: Vec<Watched> =
        pids.iter().map(|&pid| Watched { pid, looks: Vec::new(), memory: None }).collect();
    for i in 0..looks {
        let due = options.window.mul_f64(f64::from(i) / f64::from(looks - 1));
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        let taken: Vec<Look> = std::thread::scope(|s| {
            let handles: Vec<_> =
                pids.iter().map(|&pid| s.spawn(move || look(pid, start, options))).collect();
            handles.into_iter().map(|h| h.join().expect("a look does not panic")).collect()
        });
        for (w, l) in out.iter_mut().zip(taken) {
            w.looks.push(l);
        }
    }
    for w in &mut out {
        w.memory = memory::read_smaps_rollup(w.pid);
    }
    out
}

/// `/dev/shm` now.
pub fn dev_shm() -> Shm {
    let dir = Path::new("/dev/shm");
    let usage = shm::usage(dir);
    Shm {
        used: usage.as_ref().map_or(0, |u| u.used),
        total: usage.as_ref().map_or(0, |u| u.total),
        segments: shm::segments(dir),
    }
}

/// The program a process runs, as its command line names it (`/venv/bin/python`): where
/// [`crate::harness::find_py_spy`] looks beside.
pub fn program_of(pid: u32) -> Option<PathBuf> {
    procfs::process::Process::new(pid as i32)
        .and_then(|p| p.cmdline())
        .ok()
        .and_then(|argv| argv.first().cloned())
        .map(PathBuf::from)
}
