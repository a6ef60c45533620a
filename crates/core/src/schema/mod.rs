//! The result types every later stage reads: what a run produced, as plain data with its serde
//! form. `result.json` is these types serialised, and the source of truth every report is
//! rendered from (`docs/result-json.md` describes the format). The harness produces them;
//! `report`, `bisect` and `diagnose` read them from here, never from the harness's internals.
//!
//! Pure data: no IO, no processes, and nothing here imports the modules that produce or read it
//! (only the scenario model, the marker protocol and the environment summary it embeds). A value
//! with a fixed set of forms is an enum whose serde form is a readable word (`"SIGSEGV"`,
//! `"per_rank"`, `"procfs"`), never a free string compared against literals.

mod env;
mod gpu;
mod memory;
mod nodes;
mod observed;
mod process;
mod run;
mod signal;
mod verdict;

pub use crate::scenario::OutcomeKind;
pub use env::{CudaSupport, DriverInfo, EnvSummary, GpuEnv, GpuInfo, PythonEnv};
pub use gpu::{ClockReason, GpuPoint, GpuPointValues, GpuProcessPeak, GpuReport, GpuSummary, Stat};
pub use memory::{
    CgroupReport, CgroupVersion, DatasetSharing, GpuXid, LeftoverProcess, LeftoverSegment, Leftovers,
    MemoryPoint, MemoryReport, OomKill, OomSource, ProcessMemory, ProcessRole, ShmAt, ShmUsage,
};
pub use nodes::{
    Calibration, FirstFailure, LostNode, NodeSection, NodesReport, Offset, RemoteFailureSeen, Snapshot,
};
pub use observed::{
    CpuPerStep, FLIGHT_KEPT, FlightEntry, FlightRecord, GroupFormed, LEDGER_KEPT, LedgerEntry,
    ObservedProgram, StartedProcesses, TorchFacts,
};
pub use process::{
    ExitSource, ExternalRun, ExternalStyle, IdentifiedBy, KernelThread, LauncherEnd, PhaseSpan, PortInUse,
    ProcessDump, Quote, QuoteKind, RankResult, RestartedRank, SilentCpu, TAKEN_AT_SIGTERM, ThreadStack,
    WorkerInfo, is_signal_notice, port_in_use_line,
};
pub use run::{LogCut, RunResult, ScenarioResult};
pub use signal::Signal;
pub use verdict::Verdict;

/// A run folder's data, the source of truth every report is rendered from.
pub const RESULT_FILE: &str = "result.json";
/// The markdown report rendered from [`RESULT_FILE`].
pub const REPORT_FILE: &str = "report.md";
