//! Memory, `/dev/shm`, cgroup and OOM evidence of a scenario, and what it left behind.

use serde::{Deserialize, Serialize};

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

/// An Xid the NVIDIA driver wrote to the kernel log during the scenario: a GPU fault, of the
/// hardware (79: fallen off the bus; 48, 63, 64, 94, 95: ECC; 74: NVLink; 119, 120: GSP) or of
/// the program's kernels (13, 31, 43).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuXid {
    pub code: u32,
    /// The GPU's PCI address.
    pub pci: String,
    /// The process the driver named, and the rank it belonged to (itself or a worker of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// Seconds since the scenario started.
    pub at_s: f64,
    /// The record as the driver wrote it.
    pub line: String,
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
    /// `rank`, `worker` (a data-loader worker it reported) or `child` (another process in its
    /// process group).
    pub role: ProcessRole,
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

/// What a process of the run was to its rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessRole {
    /// The rank process itself.
    Rank,
    /// A data-loader worker the rank reported.
    Worker,
    /// Another process in the rank's process group.
    Child,
    /// Not a process of this run (a GPU's other users).
    Other,
}

impl ProcessRole {
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessRole::Rank => "rank",
            ProcessRole::Worker => "worker",
            ProcessRole::Child => "child",
            ProcessRole::Other => "other",
        }
    }
}

impl std::fmt::Display for ProcessRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
