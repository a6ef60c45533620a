//! One rank's end and the evidence about it; an external command's launch and its launcher.

use serde::{Deserialize, Serialize};

use super::{ProcessRole, Signal};
use crate::protocol::Frame;
use crate::scenario::OutcomeKind;

/// How an external command ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExternalRun {
    /// The argv with placeholders filled in.
    pub argv: Vec<String>,
    /// How its ranks were started.
    pub style: ExternalStyle,
    /// Why `launch.style: auto` took `style` (absent when the scenario named a style).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub style_chosen: Option<String>,
    /// Whether any rank sent a marker (through `python/ups_doctor.py` or its own writer).
    pub markers_seen: bool,
    /// The observer was on, and no process of the command sent anything of it: none imported
    /// torch, or Python never read ups-doctor's `sitecustomize` (`python -I`/`-S`/`-E`, a
    /// `sys.path` of the program's own), so the process group, steps and collectives are unknown.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub observer_silent: bool,
    /// How completion was judged, in words for the report: `exit status`, `done marker`, or
    /// ``stdout matches `…` `` (the rule itself is the scenario's `expect.completes_when`).
    pub completion: String,
    /// The launcher process of a `launcher` run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launcher: Option<LauncherEnd>,
    /// Where py-spy was found (absent: not installed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub py_spy: Option<String>,
    /// The ranks the scenario said (`launch.world_size`, 1 when the command line gave no count),
    /// when the program formed a larger process group and the run watched that many instead (the
    /// result's `scenario.launch.world_size` is the group's); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size_declared: Option<u32>,
}

/// The launcher process (torchrun) of a `launcher` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LauncherEnd {
    /// The launcher of ups-doctor's table it was run as (`torchrun`, `Ray Train`: the table's
    /// name), where the command named one, directly or in the script or program it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub pid: Option<u32>,
    pub exit_code: Option<i32>,
    pub signal: Option<Signal>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_error: Option<String>,
    pub stdout_log: String,
    pub stderr_log: String,
    /// Processes below it that looked like ranks but whose rank number was never found (no rank
    /// variable, no spawn order).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unidentified_processes: u32,
    /// Its own last error lines (torchrun's "Root Cause (first observed failure)" block, the
    /// ranks' tracebacks, which share its output).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quotes: Vec<Quote>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub log_tail: Vec<String>,
    /// The port its output said was already in use (`EADDRINUSE`), and the process that listened
    /// on it when the launcher ended, when one could be found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_in_use: Option<PortInUse>,
    /// Ranks it started again after the process ups-doctor watched for them ended: an elastic
    /// restart (torchrun's `--max-restarts`), told by `TORCHELASTIC_RESTART_COUNT`. The new
    /// processes were not watched: the ranks' results are their first processes'.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restarted: Vec<RestartedRank>,
    /// Every line of its output in which it said it signalled a process ([`is_signal_notice`]),
    /// wherever it came: often long before its last lines, which the ranks' tracebacks fill.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub signalled: Vec<String>,
}

/// Whether a launcher's line says it sent a signal to a process: torchrun's elastic agent
/// (`Sending process 798 closing signal SIGTERM`) and `torch.multiprocessing.spawn`
/// (`Terminating process 798 via signal SIGTERM`).
pub fn is_signal_notice(line: &str) -> bool {
    (line.contains("Sending process ") && line.contains(" closing signal "))
        || (line.contains("Terminating process ") && line.contains(" via signal "))
}

/// A rank its launcher started again, and the new process's pid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartedRank {
    pub rank: u32,
    pub pid: u32,
}

/// A rendezvous port another process held.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PortInUse {
    pub port: u16,
    /// The process listening on it (read from `/proc`, never signalled), and its command line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_command: Option<String>,
}

/// The port an `EADDRINUSE` line names (`… port: 29500, useIpv6: false, code: -98, name:
/// EADDRINUSE …`), when a line says so.
pub fn port_in_use_line(lines: &[String]) -> Option<(u16, &str)> {
    let line = lines
        .iter()
        .find(|l| l.contains("EADDRINUSE") || l.to_ascii_lowercase().contains("address already in use"))?;
    let port = line.split("port").skip(1).find_map(|rest| {
        let digits: String =
            rest.trim_start_matches([':', ' ', '=']).chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u16>().ok()
    })?;
    Some((port, line.as_str()))
}

/// Lines quoted verbatim from a program's output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Quote {
    /// What they are.
    pub title: QuoteKind,
    pub lines: Vec<String>,
}

/// What a quote is. Its serde form is the heading the report shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum QuoteKind {
    /// torchrun's "Root Cause (first observed failure)" block.
    #[serde(rename = "torchrun: Root Cause (first observed failure)")]
    TorchrunRootCause,
    /// PyTorch DataLoader's messages about its workers.
    #[serde(rename = "DataLoader")]
    DataLoader,
    /// The tail of the last Python traceback.
    #[serde(rename = "Python traceback (tail)")]
    PythonTraceback,
    /// Python's `faulthandler` dump after a fatal signal.
    #[serde(rename = "Python fault handler")]
    FaultHandler,
}

impl QuoteKind {
    /// The heading the report shows, which is also the serde form.
    pub fn as_str(self) -> &'static str {
        match self {
            QuoteKind::TorchrunRootCause => "torchrun: Root Cause (first observed failure)",
            QuoteKind::DataLoader => "DataLoader",
            QuoteKind::PythonTraceback => "Python traceback (tail)",
            QuoteKind::FaultHandler => "Python fault handler",
        }
    }
}

impl std::fmt::Display for QuoteKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a dump a rank wrote itself as SIGTERM stopped it is labelled (`taken`): it received
/// SIGTERM (`rank 1, as SIGTERM stopped it`).
pub const TAKEN_AT_SIGTERM: &str = "as SIGTERM stopped it";

/// What one process of a stuck external rank was doing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "DumpWire")]
pub struct ProcessDump {
    pub pid: u32,
    /// The rank it belongs to.
    pub rank: u32,
    /// `rank` (the rank's own process) or `child` (a process below it: a DataLoader worker, …).
    pub role: ProcessRole,
    /// When it was read, for a dump taken at another moment than the hang or the teardown: `the
    /// moment rank 3 on node 1 (node-b) was killed by SIGSEGV` (a multi-node run's snapshot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken: Option<String>,
    /// `py-spy dump --native` output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub py_spy: Option<String>,
    /// Why there is no py-spy output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Python's own dump of its threads (`faulthandler`), written by the process itself as a
    /// signal stopped it (`taken` says which): where a rank was when its launcher stopped it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
    pub threads: Vec<KernelThread>,
}

impl ProcessDump {
    /// How the report names it: `rank 0`, `rank 0, child process (DataLoader worker?)`, `rank 0,
    /// the moment rank 3 on node 1 (node-b) was killed by SIGSEGV`.
    pub fn label(&self) -> String {
        let who = match self.role {
            ProcessRole::Rank => format!("rank {}", self.rank),
            _ => format!("rank {}, child process (DataLoader worker?)", self.rank),
        };
        match &self.taken {
            Some(moment) => format!("{who}, {moment}"),
            None => who,
        }
    }
}

/// A [`ProcessDump`] as stored, also in the earlier form whose `role` was its label
/// (`"rank 0, child process (DataLoader worker?)"`) and which had no `rank`.
#[derive(Deserialize)]
struct DumpWire {
    pid: u32,
    #[serde(default)]
    rank: Option<u32>,
    role: String,
    #[serde(default)]
    taken: Option<String>,
    #[serde(default)]
    py_spy: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    python: Option<String>,
    threads: Vec<KernelThread>,
}

impl From<DumpWire> for ProcessDump {
    fn from(w: DumpWire) -> ProcessDump {
        let role = match w.role.as_str() {
            "rank" => ProcessRole::Rank,
            "worker" => ProcessRole::Worker,
            "child" => ProcessRole::Child,
            label if label.contains("child") || label.contains("worker") => ProcessRole::Child,
            _ => ProcessRole::Rank,
        };
        let rank = w.rank.unwrap_or_else(|| {
            let digits = w.role.trim_start_matches("rank ").split(|c: char| !c.is_ascii_digit()).next();
            digits.and_then(|d| d.parse().ok()).unwrap_or(0)
        });
        let earlier = w.role.split_once(", the moment ").map(|(_, moment)| format!("the moment {moment}"));
        let taken = w.taken.or(earlier);
        ProcessDump {
            pid: w.pid,
            rank,
            role,
            taken,
            py_spy: w.py_spy,
            error: w.error,
            python: w.python,
            threads: w.threads,
        }
    }
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

/// A rank's CPU time over its last silence: `cpu_s` used in `silent_s` of wall (measured from the
/// first CPU reading after its last sign of life, so up to a second short of the whole silence) by
/// its process and its DataLoader workers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SilentCpu {
    pub silent_s: f64,
    pub cpu_s: f64,
}

impl SilentCpu {
    /// The share of one core it used over the silence.
    pub fn share(&self) -> f64 {
        if self.silent_s > 0.0 { self.cpu_s / self.silent_s } else { 0.0 }
    }
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
    /// The signal that killed it, when one did.
    pub signal: Option<Signal>,
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
    /// Seconds since the scenario started: when its last marker was written (the writer's stamp,
    /// else when the harness read it).
    pub last_marker_at_s: Option<f64>,
    /// For a hung rank: seconds of silence when the hang was declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hang_detected_after_s: Option<f64>,
    /// For a hung rank: seconds since the scenario started when the hang was declared (what it
    /// did after, as ups-doctor took its stacks and tore it down, is a reaction to that).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hung_at_s: Option<f64>,
    /// For a rank the run's time limit ended: what its own process did over its last silence
    /// (no marker, no output), as read once a second until then. A rank silent past
    /// `hang_after_s` that kept using CPU was busy (spinning or computing without a word), which
    /// is why it was never called hung.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silent_cpu: Option<SilentCpu>,
    /// Failed only after another rank failed first (a peer gone, a collective broken), or was
    /// torn down because of it: a consequence, not the cause.
    #[serde(default)]
    pub collateral: bool,
    /// How the harness ended the process, when it had to (`SIGTERM`, `SIGKILL`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torn_down_with: Option<Signal>,
    pub steps_done: u64,
    /// What the observer in a user's Python program saw of this rank (`None` for the built-in
    /// trainer, with `--no-observe`, or when it reported nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<super::ObservedProgram>,
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
    /// When each optimizer step ended: (step, seconds since the scenario started), thinned like
    /// `losses` (absent in results of older versions).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub step_ends_s: Vec<(u64, f64)>,
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
    /// Markers dropped unread because they came faster than ups-doctor could fold them in (its
    /// queue is bounded).
    #[serde(default, skip_serializing_if = "crate::protocol::is_zero_u64")]
    pub dropped_markers: u64,
    /// Pids that `worker` markers claimed but that were not processes of this run: counted in
    /// `bad_markers`, never signalled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub foreign_pids: Vec<u32>,
    /// Its log files that could not be written in full (disk full, …): each cut with a note.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub log_errors: Vec<String>,
    /// Data-loader worker processes the rank started, in start order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<WorkerInfo>,
    /// External commands: where the exit status came from when the rank was not ups-doctor's own
    /// child (a launcher's rank).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_source: Option<ExitSource>,
    /// External commands started by a launcher: how the rank's process was found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identified_by: Option<IdentifiedBy>,
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

/// A data-loader worker process of a rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerInfo {
    pub id: u32,
    pub pid: u32,
    /// `fork`, `spawn` or `forkserver`, as the worker reported it (an external program's marker
    /// may name any method Python has).
    pub start_method: String,
    /// Seconds since the scenario started.
    pub started_at_s: f64,
}

/// How an external command's ranks were started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExternalStyle {
    /// ups-doctor started one copy of the command per rank, with torchrun's variables.
    PerRank,
    /// ups-doctor started the command once (torchrun, `srun`, …) and it started the ranks.
    Launcher,
}

impl ExternalStyle {
    /// The form `result.json` and `launch.style` use: `per_rank`, `launcher`.
    pub fn as_str(self) -> &'static str {
        match self {
            ExternalStyle::PerRank => "per_rank",
            ExternalStyle::Launcher => "launcher",
        }
    }
}

impl std::fmt::Display for ExternalStyle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where the exit status of a launcher's rank came from, when the rank was not ups-doctor's own
/// child. Earlier results spelled two of these in words (`launcher status 0`, `launcher status 0,
/// rank not identified…`); they still load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", try_from = "String")]
pub enum ExitSource {
    /// Read from `/proc/PID/stat` while it was a zombie (the launcher's child, not ours).
    Procfs,
    /// The exit status torchrun's error summary gives.
    Torchrun,
    /// The exit status `torch.multiprocessing.spawn` gives in its `ProcessExitedException` (it
    /// reaps its processes at once, before `/proc` could be read on a busy machine).
    Spawn,
    /// The end `srun` reports for the task (`srun: error: HOST: task 1: Segmentation fault`):
    /// slurmstepd reaps its tasks at once, before `/proc` could be read on a busy machine.
    Srun,
    /// The rank is the launcher process itself: its exit status is the launcher's.
    Launcher,
    /// Not observed, but the launcher exited with status 0, which torchrun does only when every
    /// rank did.
    #[serde(rename = "launcher_status_0")]
    LauncherStatus0,
    /// Not observed; torchrun's failure summary does not list it and torchrun sent it no
    /// signal: it exited with status 0 by itself.
    TorchrunNotFailed,
    /// The rank's process was never identified; the launcher exited with status 0.
    NotIdentified,
    /// The rank's process was never identified; its outcome is the launcher's (a non-zero status,
    /// a signal, or a teardown for a hang or the time limit).
    LauncherStatus,
    /// A process below the launcher that looked like a rank but whose rank number no signal gave,
    /// and that failed: it takes an unidentified rank's place in the order the failed processes
    /// started; its exit status was read from `/proc/PID/stat` while it was a zombie.
    ProcfsRankUnknown,
    /// A cluster's worker (Ray Train's): the cluster ends its workers as the job ends, so the
    /// status is the job's driver's where it exited 0, and otherwise the worker's as read (or the
    /// driver's, where it was not read) for a rank the cluster did not name as failed.
    Cluster,
    /// A cluster's worker the cluster named as failed (it relayed the rank's error), then ended
    /// with SIGKILL or SIGTERM as it ends a failed job's workers: the signal is the cluster's,
    /// the error the rank's.
    ClusterAfterError,
    /// Not observed: its launcher reaped it before ups-doctor saw it.
    Unknown,
}

impl TryFrom<String> for ExitSource {
    type Error = String;

    fn try_from(text: String) -> Result<ExitSource, String> {
        Ok(match text.as_str() {
            "procfs" => ExitSource::Procfs,
            "torchrun" => ExitSource::Torchrun,
            "spawn" => ExitSource::Spawn,
            "srun" => ExitSource::Srun,
            "launcher" => ExitSource::Launcher,
            "launcher_status_0" | "launcher status 0" => ExitSource::LauncherStatus0,
            "torchrun_not_failed" => ExitSource::TorchrunNotFailed,
            "not_identified" => ExitSource::NotIdentified,
            old if old.starts_with("launcher status 0, rank not identified") => ExitSource::NotIdentified,
            "launcher_status" => ExitSource::LauncherStatus,
            "procfs_rank_unknown" => ExitSource::ProcfsRankUnknown,
            "cluster" => ExitSource::Cluster,
            "cluster_after_error" => ExitSource::ClusterAfterError,
            "unknown" => ExitSource::Unknown,
            _ => {
                return Err(format!(
                    "unknown exit source `{text}` (expected `procfs`, `torchrun`, `spawn`, `srun`, `launcher`, `launcher_status_0`, \
                     `torchrun_not_failed`, `not_identified`, `launcher_status`, `procfs_rank_unknown`, `cluster`, `cluster_after_error` or `unknown`)"
                ));
            }
        })
    }
}

/// How a launcher's rank process was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String")]
pub enum IdentifiedBy {
    /// A rank variable in the process's starting environment.
    #[serde(rename = "RANK")]
    Rank,
    #[serde(rename = "SLURM_PROCID")]
    SlurmProcid,
    #[serde(rename = "OMPI_COMM_WORLD_RANK")]
    OmpiCommWorldRank,
    #[serde(rename = "PMI_RANK")]
    PmiRank,
    /// `LOCAL_RANK`, which counts only on node 0.
    #[serde(rename = "LOCAL_RANK")]
    LocalRank,
    /// The launcher is the rank (Lightning's rank 0).
    #[serde(rename = "launcher_process")]
    LauncherProcess,
    /// `torch.multiprocessing.spawn`'s i-th child is rank i.
    #[serde(rename = "spawn_order")]
    SpawnOrder,
    /// The rank the process itself reported through the helper's markers (`RANK`, or
    /// `torch.distributed.get_rank()` once the process group is up), with the writer's pid.
    #[serde(rename = "markers")]
    Markers,
    /// The rank the process formed in `init_process_group`, as ups-doctor's observer recorded it
    /// inside the process (no code change): the writer's pid with the group's rank.
    #[serde(rename = "process_group")]
    ProcessGroup,
    /// The process listening on the rendezvous port: the c10d store's server, rank 0 outside
    /// torchrun (whose agent hosts the store itself).
    #[serde(rename = "rendezvous_port_listens")]
    RendezvousListens,
    /// The one process connected to the rendezvous port when one rank is left.
    #[serde(rename = "rendezvous_port_connected")]
    RendezvousConnected,
}

impl IdentifiedBy {
    /// The rank variables, in the order they are believed.
    pub const VARIABLES: [IdentifiedBy; 5] = [
        IdentifiedBy::Rank,
        IdentifiedBy::SlurmProcid,
        IdentifiedBy::OmpiCommWorldRank,
        IdentifiedBy::PmiRank,
        IdentifiedBy::LocalRank,
    ];

    /// The environment variable that gave the rank number, when one did.
    pub fn variable(self) -> Option<&'static str> {
        match self {
            IdentifiedBy::Rank => Some("RANK"),
            IdentifiedBy::SlurmProcid => Some("SLURM_PROCID"),
            IdentifiedBy::OmpiCommWorldRank => Some("OMPI_COMM_WORLD_RANK"),
            IdentifiedBy::PmiRank => Some("PMI_RANK"),
            IdentifiedBy::LocalRank => Some("LOCAL_RANK"),
            IdentifiedBy::LauncherProcess
            | IdentifiedBy::SpawnOrder
            | IdentifiedBy::Markers
            | IdentifiedBy::ProcessGroup
            | IdentifiedBy::RendezvousListens
            | IdentifiedBy::RendezvousConnected => None,
        }
    }

    /// How much an identification proves: a rank variable in the starting environment most, then
    /// the rank the process itself reported through the helper, then its role at the rendezvous
    /// port, then the launcher-as-rank-0 and spawn-order inferences. A stronger signal replaces a
    /// weaker one found earlier (spawn order is known before the ranks reach the rendezvous).
    pub fn strength(self) -> u8 {
        match self {
            IdentifiedBy::SpawnOrder => 0,
            IdentifiedBy::LauncherProcess => 1,
            IdentifiedBy::RendezvousConnected => 2,
            IdentifiedBy::RendezvousListens => 3,
            IdentifiedBy::Markers | IdentifiedBy::ProcessGroup => 4,
            IdentifiedBy::Rank
            | IdentifiedBy::SlurmProcid
            | IdentifiedBy::OmpiCommWorldRank
            | IdentifiedBy::PmiRank
            | IdentifiedBy::LocalRank => 5,
        }
    }
}

impl TryFrom<String> for IdentifiedBy {
    type Error = String;

    /// Also the earlier spellings in words (`launcher process`, `spawn order`).
    fn try_from(text: String) -> Result<IdentifiedBy, String> {
        if let Some(by) = IdentifiedBy::VARIABLES.into_iter().find(|by| by.variable() == Some(text.as_str()))
        {
            return Ok(by);
        }
        match text.as_str() {
            "launcher_process" | "launcher process" => Ok(IdentifiedBy::LauncherProcess),
            "spawn_order" | "spawn order" => Ok(IdentifiedBy::SpawnOrder),
            "markers" => Ok(IdentifiedBy::Markers),
            "process_group" => Ok(IdentifiedBy::ProcessGroup),
            "rendezvous_port_listens" | "rendezvous port (listens)" => Ok(IdentifiedBy::RendezvousListens),
            "rendezvous_port_connected" | "rendezvous port (connected)" => {
                Ok(IdentifiedBy::RendezvousConnected)
            }
            _ => Err(format!(
                "unknown `identified_by` `{text}` (expected a rank variable such as `RANK`, `launcher_process`, \
                 `spawn_order`, `markers`, `process_group`, `rendezvous_port_listens` or `rendezvous_port_connected`)"
            )),
        }
    }
}

/// For `skip_serializing_if` (the protocol's `Marker` uses it too).

fn is_zero(n: &u32) -> bool {
    *n == 0
}
