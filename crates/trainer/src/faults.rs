//! Injected faults, performed for real by the rank process: a real invalid memory access, a real
//! `abort()`, a real deadlock between two threads. They exist to prove the harness and bisect
//! right and to demonstrate failure patterns; nothing here is mocked.

use std::sync::{Arc, Barrier, Mutex};

use nix::fcntl::{Flock, FlockArg};

use crate::protocol::RUN_ID_ENV;
use crate::scenario::{
    DEFAULT_LEAK_SIZE, Fault, FaultKind, ONE_OFF_PHASES, Scenario, parse_size, when_matches,
};

/// What the training loop must do after a fault that does not end the process by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    None,
    /// Make this step's loss NaN.
    NanLoss,
    /// Exit with an error carrying this description.
    ExitError,
    /// Skip the last block in this forward.
    UnusedParam,
    /// Stop the training loop here and go to the end-of-training barrier.
    StopEarly,
    /// Update the encoder's running-mean parameter in place during this forward.
    InplaceView,
    /// Send SIGKILL to data-loader worker 0.
    KillWorker,
}

impl Faults {
    /// Whether any fault of the scenario (on any rank: every rank must build the same model)
    /// needs the encoder's running-mean parameter.
    pub fn needs_running_mean(scenario: &Scenario) -> bool {
        scenario.inject.iter().any(|f| f.fault == FaultKind::InplaceView)
    }
}

/// The faults that apply to this rank, filtered by `rank` and `when` once at start-up.
pub struct Faults {
    armed: Vec<Fault>,
    rank: u32,
    /// `launch.memory_limit`, for the `oom` fault's safety stop.
    limit: Option<String>,
}

impl Faults {
    pub fn for_rank(scenario: &Scenario, rank: u32) -> Faults {
        let armed = scenario
            .inject
            .iter()
            .filter(|f| f.rank.is_none_or(|r| r == rank))
            .filter(|f| when_matches(scenario, &f.when))
            .filter(|f| f.probability >= 1.0 || draw() < f.probability)
            .cloned()
            .collect();
        Faults { armed, rank, limit: scenario.launch.memory_limit.clone() }
    }

    /// Called at the beginning of every phase; performs a matching fault. Segv, abort, exit0
    /// and hang never return.
    pub fn at(&self, phase: &str, step: u64) -> Effect {
        let mut effect = Effect::None;
        for fault in &self.armed {
            let phase_matches =
                fault.phase == phase || (fault.phase == "model.build" && phase.starts_with("model.build/"));
            let one_off =
                ONE_OFF_PHASES.contains(&fault.phase.as_str()) || fault.phase.starts_with("model.build/");
            if !phase_matches || (!one_off && fault.step != step) {
                continue;
            }
            eprintln!("ups-doctor: injecting fault `{:?}` at {phase} step {step}", fault.fault);
            match fault.fault {
                FaultKind::Segv => inject_segv(),
                FaultKind::Abort => inject_abort(),
                FaultKind::Exit0 => inject_exit0(),
                FaultKind::Hang => inject_hang(),
                FaultKind::Nan => effect = Effect::NanLoss,
                FaultKind::ExitError => effect = Effect::ExitError,
                FaultKind::UnusedParam => effect = Effect::UnusedParam,
                FaultKind::UnevenSteps => effect = Effect::StopEarly,
                FaultKind::InplaceView => effect = Effect::InplaceView,
                FaultKind::LeakShm => {
                    let size =
                        fault.size.as_deref().and_then(|s| parse_size(s).ok()).unwrap_or(DEFAULT_LEAK_SIZE);
                    if let Err(e) = inject_leak_shm(self.rank, size) {
                        eprintln!("ups-doctor: leak_shm could not create its segment: {e}");
                        effect = Effect::ExitError;
                    }
                }
                FaultKind::WorkerKill => effect = Effect::KillWorker,
                FaultKind::Oom => inject_oom(scenario_limit(&self.limit)),
            }
        }
        effect
    }
}

/// Environment variable naming a counter file: when set, each draw takes the next number of a
/// fixed pseudo-random sequence shared by every process using that file, so a test of a flaky
/// failure sees the same coin flips every time (the failure is still flaky from one run to the
/// next). Unset, draws come from the kernel.
pub const FAULT_SEQUENCE_ENV: &str = "UPS_DOCTOR_FAULT_SEQUENCE";

/// A uniform number in [0, 1) deciding whether a fault with a probability fires in this run.
fn draw() -> f64 {
    std::env::var_os(FAULT_SEQUENCE_ENV)
        .and_then(|path| next_in_sequence(std::path::Path::new(&path)).ok())
        .map(|n| (splitmix64(n) >> 11) as f64 / (1u64 << 53) as f64)
        .unwrap_or_else(os_random_unit)
}

/// Takes the next counter value from `path` under an exclusive lock.
fn next_in_sequence(path: &std::path::Path) -> std::io::Result<u64> {
    use std::io::{Read, Seek, Write};
    let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
    // Released when the file closes, at the end of this function.
    let mut file = Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| std::io::Error::from(e))?;
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    let n: u64 = text.trim().parse().unwrap_or(0);
    file.set_len(0)?;
    file.rewind()?;
    write!(file, "{}", n + 1)?;
    Ok(n)
}

/// SplitMix64: a well-mixed 64-bit value for each counter value.
fn splitmix64(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform number in [0, 1) from the kernel's randomness: a flaky fault must not follow
/// `train.seed`, or every run with the same seed would fail the same way.
fn os_random_unit() -> f64 {
    use std::io::Read;
    let mut bytes = [0u8; 8];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if read.is_err() {
        // No kernel randomness: fall back to the clock's nanoseconds, still independent of the seed.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        return f64::from(nanos % 1_000_000) / 1_000_000.0;
    }
    (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64
}

/// A write to an unmapped address: the kernel delivers a genuine SIGSEGV (SEGV_MAPERR).
#[inline(never)]
pub fn inject_segv() -> ! {
    super::os::write_to_unmapped_page()
}

#[inline(never)]
pub fn inject_abort() -> ! {
    std::process::abort()
}

/// Like Python's `os._exit(0)` in a wrapper that swallowed an exception: exit status 0, no
/// completion, no flush, no destructors.
#[inline(never)]
pub fn inject_exit0() -> ! {
    super::os::exit_now(0)
}

fn scenario_limit(limit: &Option<String>) -> Option<u64> {
    limit.as_deref().and_then(|l| parse_size(l).ok())
}

/// Allocates 16 MiB at a time and writes every page (so the memory is really resident, not just
/// reserved) until the kernel's OOM killer ends the process. A safety stop: once it holds twice
/// the scenario's memory limit (it is not in the limited cgroup, e.g. a rank started by hand),
/// it gives up with an error instead of taking the machine's memory.
#[inline(never)]
pub fn inject_oom(limit: Option<u64>) -> ! {
    const CHUNK: usize = 16 << 20;
    let stop = limit.map_or(0, |l| l.saturating_mul(2));
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut total: u64 = 0;
    while total < stop {
        let mut chunk = vec![0u8; CHUNK];
        // One write per page makes each page resident (calloc'd pages would stay shared zeros).
        for page in chunk.chunks_mut(4096) {
            page[0] = 1;
        }
        held.push(std::hint::black_box(chunk));
        total += CHUNK as u64;
    }
    eprintln!(
        "ups-doctor: fault `oom` holds {} MiB, twice `launch.memory_limit`, and was not killed: this process is not in the scenario's memory cgroup",
        total >> 20
    );
    super::os::exit_now(1)
}

/// Creates `/dev/shm/ups-doctor-<run id>-leak-<rank>` of `size` bytes, writes one byte into every
/// page through a shared mapping, and never unlinks it. When `/dev/shm` cannot back a page the
/// write raises a genuine SIGBUS, exactly as a data-loader worker's does in a 64 MB container.
#[inline(never)]
pub fn inject_leak_shm(rank: u32, size: u64) -> std::io::Result<()> {
    let run_id = std::env::var(RUN_ID_ENV).unwrap_or_else(|_| format!("pid{}", std::process::id()));
    let path = std::path::PathBuf::from(format!("/dev/shm/ups-doctor-{run_id}-leak-{rank}"));
    let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path)?;
    // Sparse: the size costs nothing until the pages are written below.
    file.set_len(size)?;
    drop(file);
    // A page tmpfs cannot back faults with SIGBUS here: the point.
    super::loader::shm::Mapping::open(&path, true)?.touch_every_page();
    eprintln!("ups-doctor: leaked {size} bytes in `{}`", path.display());
    Ok(())
}

/// A lock-order inversion between two threads: each holds one lock and waits for the other,
/// forever. Stack dumps show both threads blocked in the futex wait of a mutex.
#[inline(never)]
pub fn inject_hang() -> ! {
    static FIRST: Mutex<()> = Mutex::new(());
    static SECOND: Mutex<()> = Mutex::new(());
    let both_hold_one = Arc::new(Barrier::new(2));
    let peer_barrier = Arc::clone(&both_hold_one);
    let peer = std::thread::Builder::new().name("ups-hang-peer".into()).spawn(move || {
        let _second = SECOND.lock();
        peer_barrier.wait();
        let _first = FIRST.lock();
    });
    if peer.is_err() {
        // Without a peer thread the deadlock cannot be built; block on our own lock instead.
        let _first = FIRST.lock();
        let _again = FIRST.lock();
    }
    let _first = FIRST.lock();
    both_hold_one.wait();
    let _second = SECOND.lock();
    unreachable!("the two threads should have deadlocked")
}
