//! What a run produced, as plain data: the source of truth written to `result.json`, from which
//! every report is rendered. Nothing here does IO.

use serde::{Deserialize, Serialize};

use crate::probe::env::EnvSummary;
use crate::protocol::Frame;
use crate::scenario::{OutcomeKind, Scenario};

/// Everything one `ups-doctor run` invocation produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    pub tool_version: String,
    /// Wall-clock start, RFC 3339 (display only).
    pub started_at: String,
    /// The command line, for re-running.
    pub command: Vec<String>,
    pub environment: EnvSummary,
    /// One entry per scenario, written as each one ends.
    pub scenarios: Vec<ScenarioResult>,
    /// Scenarios that were planned but not run because the user interrupted the run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_run: Vec<String>,
    #[serde(default)]
    pub interrupted: bool,
    /// ups-doctor itself could not go on (a scenario's folder could not be prepared: disk full,
    /// …): why, in one line. The scenarios after it are in `not_run`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<String>,
}

/// One scenario's end: its outcome, the verdict, and every rank's evidence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScenarioResult {
    pub name: String,
    /// The scenario file, as given on the command line.
    pub file: String,
    /// The `--set` overrides applied on top of the file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<String>,
    /// The fully resolved scenario that ran.
    pub scenario: Scenario,
    /// The first failure's outcome, or `passed`.
    pub outcome: OutcomeKind,
    pub met_expectation: bool,
    /// The user stopped it (Ctrl-C, SIGTERM) before it ended on its own: what it had by then is
    /// kept, but it is neither a pass nor a failure of its `expect`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
    /// Why the outcome did not meet `expect`, one line per differing field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expectation_mismatches: Vec<String>,
    pub verdict: Verdict,
    /// The rank that failed first, if any failed.
    pub first_failure: Option<u32>,
    pub ranks: Vec<RankResult>,
    pub wall_s: f64,
    /// Optimizer steps per second over the training loop (rank 0), when it trained.
    pub steps_per_s: Option<f64>,
    /// Samples per second over the training loop, all ranks together.
    pub samples_per_s: Option<f64>,
    /// Memory and `/dev/shm` sampled through the run (absent in results of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryReport>,
    /// `/dev/shm` files and processes the run left behind, and what ups-doctor did about them.
    #[serde(default)]
    pub leftovers: Leftovers,
    /// GPU activity sampled through the run (NVML), or why it could not be; absent when the
    /// scenario's ranks train on the CPU by choice (`device: cpu`) or sampling is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<super::gpu::GpuReport>,
    /// An external command's run: the argv and how it launched (absent for the built-in trainer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<ExternalRun>,
    /// The cgroup the scenario's processes ran in, with its memory limit and OOM-kill counter;
    /// absent where none could be made (and none was asked for) or in results of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<CgroupReport>,
    /// Processes of the scenario the kernel's OOM killer ended, as the cgroup and the kernel log
    /// recorded them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub oom_kills: Vec<OomKill>,
    /// Why the scenario's processes ran without a cgroup of their own (no cgroup hierarchy this
    /// process may write to): teardown then finds them by process group and run id only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup_unavailable: Option<String>,
    /// A multi-node run: every node, its host, clock and own evidence (ranks above are global).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<crate::nodes::NodesReport>,
}

/// Which cgroup hierarchy the scenario's cgroup lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CgroupVersion {
    /// cgroup v1's memory controller (`memory.limit_in_bytes`, `memory.oom_control`).
    V1,
    /// cgroup v2's unified hierarchy (`memory.max`, `memory.events`).
    V2,
}

/// The cgroup made for one scenario: every process of the scenario runs in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CgroupReport {
    /// Its path under the cgroup mount, e.g. `/sys/fs/cgroup/memory/ups-doctor/<run id>`.
    pub path: String,
    pub version: CgroupVersion,
    /// `launch.memory_limit` in bytes, when the scenario set one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<u64>,
    /// The highest memory use the cgroup recorded (v1 `memory.max_usage_in_bytes`, v2
    /// `memory.peak`), when the kernel keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_bytes: Option<u64>,
    /// How many processes the OOM killer ended in this cgroup during the scenario (v1
    /// `memory.oom_control` `oom_kill`, v2 `memory.events` `oom_kill`).
    pub oom_kills: u64,
}

/// Where an OOM kill was seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OomSource {
    /// The kernel log (`/dev/kmsg`) named the pid: `Killed process PID (comm) … anon-rss:…`.
    Kmsg,
    /// The cgroup's `oom_kill` counter rose while this SIGKILLed process was its only candidate;
    /// the kernel log was not readable or did not name it.
    Cgroup,
}

/// One process of the scenario ended by the OOM killer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OomKill {
    pub pid: u32,
    /// The rank it belonged to (itself or one of its workers), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// The data-loader worker it was, when it was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<u32>,
    /// Seconds since the scenario started, when the kill was seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_s: Option<f64>,
    pub source: OomSource,
    /// The process name the kernel printed (`comm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_name: Option<String>,
    /// Its anonymous resident memory when killed, as the kernel printed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anon_rss_bytes: Option<u64>,
}

/// How an external command ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExternalRun {
    /// The argv with placeholders filled in.
    pub argv: Vec<String>,
    /// `per_rank` or `launcher`.
    pub style: String,
    /// Why `launch.style: auto` took `style` (absent when the scenario named a style).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub style_chosen: Option<String>,
    /// Whether any rank sent a marker (through `python/ups_doctor.py` or its own writer).
    pub markers_seen: bool,
    /// How completion was judged: `exit status`, `done marker`, or `stdout matches …`.
    pub completion: String,
    /// The launcher process of a `launcher` run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launcher: Option<LauncherEnd>,
    /// Where py-spy was found (absent: not installed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub py_spy: Option<String>,
}

/// The launcher process (torchrun) of a `launcher` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LauncherEnd {
    pub pid: Option<u32>,
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_error: Option<String>,
    pub stdout_log: String,
    pub stderr_log: String,
    /// Its own last error lines (torchrun's "Root Cause (first observed failure)" block, the
    /// ranks' tracebacks, which share its output).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quotes: Vec<Quote>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub log_tail: Vec<String>,
}

/// Lines quoted verbatim from a program's output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Quote {
    /// What they are: `Python traceback`, `DataLoader`, `torchrun: Root Cause`, `Python fault handler`.
    pub title: String,
    pub lines: Vec<String>,
}

/// What one process of a stuck external rank was doing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessDump {
    pub pid: u32,
    /// `rank 0`, `rank 0, worker process`.
    pub role: String,
    /// `py-spy dump --native` output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub py_spy: Option<String>,
    /// Why there is no py-spy output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub threads: Vec<KernelThread>,
}

/// A thread as the kernel sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelThread {
    pub tid: u32,
    pub name: String,
    /// `/proc/PID/task/TID/wchan`: where in the kernel it sleeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wchan: Option<String>,
    /// `/proc/PID/task/TID/syscall`: the system call it is in (`202 (futex)`), or `running`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syscall: Option<String>,
}

/// The verdict a reader sees first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// One sentence: what happened, where.
    pub headline: String,
    /// The evidence behind it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
    /// What this pattern usually means.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub likely_cause: Option<String>,
    /// What to try next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_step: Option<String>,
    /// The known failure pattern the evidence established (its stable id, listed in
    /// `docs/patterns.md`), absent when none did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// The culprit's key error line, with the innermost frame in the program's own code:
    /// `ValueError: bad sample (train.py:66 in __getitem__)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_line: Option<String>,
    /// The PyTorch document or issue that explains the pattern.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
}

/// One rank's end and the evidence gathered about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankResult {
    pub rank: u32,
    pub pid: Option<u32>,
    /// The device the rank trained on (`cpu`, `cuda:0`; `none` when it found none it could use).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    pub outcome: OutcomeKind,
    /// Signal name (`SIGSEGV`) when killed by a signal.
    pub signal: Option<String>,
    pub exit_code: Option<i32>,
    /// The last phase this rank began (from its markers).
    pub last_phase: Option<String>,
    pub last_step: Option<u64>,
    /// The error the rank reported, or the last error-looking line of its stderr.
    pub error: Option<String>,
    /// Symbolised backtrace written by the crash handler.
    pub backtrace: Vec<Frame>,
    /// Raw return addresses written first by the crash handler (kept when symbolising failed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub raw_backtrace: Vec<String>,
    /// Stacks of every thread, dumped on request when the rank was stuck.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stacks: Vec<ThreadStack>,
    /// Seconds since the scenario started: when the process ended (or was torn down).
    pub ended_at_s: Option<f64>,
    /// Seconds since the scenario started: when its last marker arrived.
    pub last_marker_at_s: Option<f64>,
    /// For a hung rank: seconds of silence when the hang was declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hang_detected_after_s: Option<f64>,
    /// Failed only after another rank failed first (a peer gone, a collective broken), or was
    /// torn down because of it: a consequence, not the cause.
    #[serde(default)]
    pub collateral: bool,
    /// How the harness ended the process, when it had to (`SIGTERM`, `SIGKILL`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torn_down_with: Option<String>,
    pub steps_done: u64,
    /// Hash of the rank's parameters after training (equal on every rank when DDP kept them in
    /// sync).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params_checksum: Option<String>,
    /// Bytes of optimizer state the rank held (FSDP: its shard's only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer_state_bytes: Option<u64>,
    pub first_loss: Option<f64>,
    pub final_loss: Option<f64>,
    /// Fraction of step time spent waiting for data.
    pub data_wait_fraction: Option<f64>,
    /// Loss per step (thinned to at most a few hundred points).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub losses: Vec<(u64, f64)>,
    /// Phases in order with their begin/end times, per-step phases folded into one `train` span.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<PhaseSpan>,
    pub stdout_log: String,
    pub stderr_log: String,
    /// The last lines of stderr (and stdout if stderr is empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub log_tail: Vec<String>,
    /// Markers received, and lines that were not valid markers.
    pub markers: u64,
    #[serde(default)]
    pub bad_markers: u64,
    /// Pids that `worker` markers claimed but that were not processes of this run: counted in
    /// `bad_markers`, never signalled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub foreign_pids: Vec<u32>,
    /// Its log files that could not be written in full (disk full, …): each cut with a note.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub log_errors: Vec<String>,
    /// Data-loader worker processes the rank started, in start order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<super::state::WorkerInfo>,
    /// External commands: where the exit status came from when the rank was not ups-doctor's own
    /// child (a launcher's rank): `procfs` (read while it was a zombie), `torchrun` (its error
    /// summary) or `unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_source: Option<String>,
    /// External commands started by a launcher: which signal identified the rank's process: a
    /// variable in its starting environment (`RANK`, `LOCAL_RANK`, `SLURM_PROCID`,
    /// `OMPI_COMM_WORLD_RANK`, `PMI_RANK`), `launcher process` (the launcher is the rank, as
    /// Lightning's rank 0) or `spawn order` (`torch.multiprocessing.spawn`'s i-th child).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identified_by: Option<String>,
    /// External commands: seconds since the scenario started when the rank last wrote output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_output_at_s: Option<f64>,
    /// External commands: the program's own last error lines (traceback tail, DataLoader
    /// messages, Python's fault handler), quoted next to the verdict.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quotes: Vec<Quote>,
    /// External commands: what each process of a stuck rank was doing (py-spy, procfs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dumps: Vec<ProcessDump>,
}

/// One thread's stack from a stack dump.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadStack {
    pub tid: i64,
    pub thread: String,
    pub frames: Vec<Frame>,
}

/// A phase on a rank's timeline, in seconds since the scenario started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseSpan {
    pub phase: String,
    pub start_s: f64,
    /// Absent when the phase never ended.
    pub end_s: Option<f64>,
}

/// Memory and `/dev/shm`, sampled through the run for every rank and worker.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryReport {
    /// Seconds between samples.
    pub interval_s: f64,
    pub samples: u64,
    /// Peak figures of every process of the run, rank by rank, the rank first.
    pub processes: Vec<ProcessMemory>,
    /// Totals over time, thinned to at most [`MemoryReport::MAX_POINTS`] (each point the
    /// largest value of the samples it stands for).
    pub series: Vec<MemoryPoint>,
    pub shm: ShmUsage,
    /// For each rank that reported its dataset cache: how much is shared and how much duplicated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub datasets: Vec<DatasetSharing>,
}

impl MemoryReport {
    pub const MAX_POINTS: usize = 100;
}

/// One process's peak memory, in bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessMemory {
    pub rank: u32,
    /// `rank` (the rank process), `worker` (a data-loader worker it reported) or `child`
    /// (another process in its process group).
    pub role: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<u32>,
    pub pid: u32,
    pub command: String,
    pub peak_rss_bytes: u64,
    pub peak_pss_bytes: u64,
    pub peak_uss_bytes: u64,
    pub peak_shared_bytes: u64,
}

/// Totals at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryPoint {
    /// Seconds since the scenario started.
    pub t_s: f64,
    /// PSS of each rank together with its workers, indexed by rank.
    pub pss_bytes: Vec<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_used_bytes: Option<u64>,
}

/// `/dev/shm` during the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ShmUsage {
    /// The run had a `/dev/shm` of its own (`data.shm_size`).
    pub private: bool,
    pub total_bytes: Option<u64>,
    pub peak_used_bytes: Option<u64>,
    /// The most memory this run's own segments (`ups-doctor-<run id>-…`) held at once.
    pub peak_ours_bytes: u64,
    /// `/dev/shm` at the moment each rank was seen to end.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub at_rank_end: Vec<ShmAt>,
}

/// `/dev/shm` use at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShmAt {
    pub rank: u32,
    pub t_s: f64,
    pub used_bytes: u64,
    pub total_bytes: u64,
}

/// A rank's dataset cache against its workers' private memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetSharing {
    pub rank: u32,
    pub bytes: u64,
    /// `memory`, `disk` or `shm`.
    pub cache: String,
    pub workers: u32,
    /// Workers whose private memory (USS) is large enough to hold their own copy of the cache.
    pub private_copies: u32,
    /// Bytes held more than once: one cache per private copy.
    pub duplicated_bytes: u64,
    /// Bytes of the cache that workers share (copy-on-write after fork, or in `/dev/shm`).
    pub shared_bytes: u64,
    pub worker_peak_uss_bytes: Vec<u64>,
    /// False when the cache is too small next to a worker's own memory to tell from USS whether
    /// it is shared (the three counts above are then 0).
    #[serde(default = "judged_default")]
    pub judged: bool,
}

fn judged_default() -> bool {
    true
}

/// What the run left behind, found after every rank ended.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Leftovers {
    /// Files created in `/dev/shm` during the run and still there at its end.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shm: Vec<LeftoverSegment>,
    /// Processes of the run still alive after their rank ended.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<LeftoverProcess>,
}

impl Leftovers {
    pub fn is_empty(&self) -> bool {
        self.shm.is_empty() && self.processes.is_empty()
    }
}

/// A `/dev/shm` file left behind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeftoverSegment {
    pub name: String,
    pub size_bytes: u64,
    pub allocated_bytes: u64,
    /// Named `ups-doctor-<run id>-…`: created by this run's ranks or workers.
    pub ours: bool,
    /// Left by an earlier ups-doctor run whose process is gone (its run id names a dead pid);
    /// found and removed when this run started.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub earlier_run: bool,
    /// ups-doctor removed it (ours), or it went with the run's private `/dev/shm`.
    pub removed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A process of the run still alive after its rank ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeftoverProcess {
    pub pid: u32,
    pub command: String,
    /// The rank whose process group or run id it carries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<u32>,
    pub killed: bool,
    /// Left by an earlier ups-doctor run that is gone (found in its orphaned cgroup and killed
    /// when this run started), not by this run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub earlier_run: bool,
}
