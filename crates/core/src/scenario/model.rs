//! The scenario schema: plain serde data with documented defaults. No IO here.
//!
//! Every struct denies unknown fields; [`super::load`] turns serde's messages into errors that
//! name the file, line:column, field and a suggestion. Defaults are the README's table.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use super::command::{Param, ParamValue};

/// A training configuration plus how to launch it and what outcome it should have.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[derive(Default)]
pub struct Scenario {
    /// Defaults to the file's stem.
    pub name: String,
    pub description: String,
    pub launch: Launch,
    pub model: Model,
    pub data: Data,
    pub train: Train,
    pub limits: Limits,
    pub expect: Expect,
    pub inject: Vec<Fault>,
    /// An external training program (argv, never a shell string) run instead of the built-in
    /// trainer; `{name}` placeholders in its arguments are replaced by `params` (see
    /// [`super::command`]). Absent: the built-in trainer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// The external program's own knobs, substituted into `command`; bisect cuts them.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, Param>,
}

impl Scenario {
    /// Whether the ranks run the user's `command` rather than the built-in trainer.
    pub fn is_external(&self) -> bool {
        self.command.is_some()
    }

    /// The value of a built-in placeholder that follows from `launch`: `world_size`, `nodes` and
    /// `ranks_per_node` (the ranks each node starts); `None` for any other name.
    pub fn launch_placeholder(&self, name: &str) -> Option<String> {
        let launch = &self.launch;
        match name {
            "world_size" => Some(launch.world_size.to_string()),
            "nodes" => Some(launch.nodes.to_string()),
            "ranks_per_node" => Some((launch.world_size / launch.nodes.max(1)).to_string()),
            _ => None,
        }
    }

    /// The scenario as a file would say it, pretty JSON: for a `command`, the built-in trainer's
    /// fields that are at their defaults (all of them, once loaded) are left out, so a saved
    /// scenario shows what the program runs with and nothing that does not apply (its keys are
    /// then in alphabetical order). Built-in scenarios are written whole, in schema order.
    pub fn file_json(&self) -> String {
        if !self.is_external() {
            return serde_json::to_string_pretty(self).unwrap_or_default();
        }
        let mut value = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        let defaults = serde_json::to_value(Scenario::default()).unwrap_or(serde_json::Value::Null);
        if let Some(object) = value.as_object_mut() {
            for section in ["launch", "model", "data", "train"] {
                let Some(fields) = object.get_mut(section).and_then(|v| v.as_object_mut()) else { continue };
                fields.retain(|k, v| k == "world_size" || defaults[section].get(k) != Some(v));
                if fields.is_empty() {
                    object.remove(section);
                }
            }
        }
        serde_json::to_string_pretty(&value).unwrap_or_default()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Launch {
    pub mode: Mode,
    pub world_size: u32,
    pub device: Device,
    pub backend: Backend,
    /// How an external `command` is started: one copy per rank, or once as a launcher (torchrun)
    /// that starts the ranks itself. Only with `command`.
    #[serde(skip_serializing_if = "LaunchStyle::is_auto")]
    pub style: LaunchStyle,
    /// Memory limit for all the scenario's processes together (`"2g"`, like `docker run
    /// --memory`): they run in a memory cgroup with this limit and no swap, so the kernel's OOM
    /// killer ends one of them when they exceed it, as in a container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<String>,
    /// Nodes the ranks are spread over (`world_size / nodes` each). Run as it is, ups-doctor
    /// plays every node with a node agent on this machine (loopback); on a real cluster each
    /// node's `ups-doctor run --nodes N --node-rank R` places it (see `crate::nodes`).
    #[serde(skip_serializing_if = "is_one")]
    pub nodes: u32,
    /// Variables set for every process of the scenario (each rank, a launcher and what it
    /// starts), on top of ups-doctor's own environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The folder every process starts in (`{scenario_dir}` is the scenario file's folder).
    /// Absent: the folder ups-doctor was started in, as if the command were run there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Whether the observer in the `sitecustomize` ups-doctor puts first on a command's
    /// `PYTHONPATH` records the program's process group, steps, data waits and collectives
    /// (`--no-observe` sets it to `false`). Only with `command`.
    #[serde(skip_serializing_if = "is_true")]
    pub observe: bool,
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

fn is_true(b: &bool) -> bool {
    *b
}

impl Default for Launch {
    fn default() -> Self {
        Launch {
            mode: Mode::Single,
            world_size: 1,
            device: Device::Auto,
            backend: Backend::Auto,
            style: LaunchStyle::Auto,
            memory_limit: None,
            nodes: 1,
            env: BTreeMap::new(),
            cwd: None,
            observe: true,
        }
    }
}

/// How an external command becomes ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LaunchStyle {
    /// `launcher` when the command's program is a known launcher (torchrun, `python -m
    /// torch.distributed.run`, accelerate, deepspeed, srun, mpirun) or a Python program that starts
    /// its own ranks (it calls `torch.multiprocessing.spawn` or uses Lightning), else `per_rank`;
    /// the result says which was taken and why.
    #[default]
    Auto,
    /// The harness starts `world_size` copies of `command`, each with torchrun's environment
    /// (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, …), exactly as it starts the built-in trainer.
    PerRank,
    /// The harness starts `command` once (`torchrun --nproc_per_node 2 train.py`) and finds the
    /// rank processes it starts (see `harness::external::discover_ranks`).
    Launcher,
}

impl LaunchStyle {
    fn is_auto(&self) -> bool {
        *self == LaunchStyle::Auto
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Single,
    Ddp,
    Fsdp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Device {
    Auto,
    Cpu,
    Cuda,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    Auto,
    Tcp,
    Nccl,
}

/// The UPT-style operator: encoder → stages of transformer blocks → perceiver decoder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Model {
    /// Blocks per stage; `[2, 2]` is two stages of two blocks.
    pub depths: Vec<u32>,
    pub hidden: u32,
    pub heads: u32,
    /// Latent tokens the encoder pools the grid into; must divide `data.grid`.
    pub latent_tokens: u32,
    /// Self-attention window in tokens (each token sees `window` neighbours each side); 0 = global.
    pub window: u32,
    /// Self-attention in the approximator blocks; off leaves MLP-only blocks.
    pub attention: bool,
    /// AdaLN conditioning of every block on the sample's viscosity.
    pub conditioning: bool,
    /// Hidden width of block MLPs as a multiple of `hidden`.
    pub mlp_ratio: u32,
}

impl Default for Model {
    fn default() -> Self {
        Model {
            depths: vec![1, 1],
            hidden: 64,
            heads: 4,
            latent_tokens: 16,
            window: 4,
            attention: true,
            conditioning: true,
            mlp_ratio: 2,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Data {
    /// Burgers trajectories generated (each with a viscosity of its own).
    pub samples: u32,
    /// Points of the periodic grid on [0, 1).
    pub grid: u32,
    /// Snapshots per trajectory; training pairs are consecutive snapshots.
    pub timesteps: u32,
    /// Query points the decoder is asked for per sample (a random subset of the grid).
    pub queries: u32,
    /// Augmentation passes per sample: each translates input and target by a random sub-grid
    /// amount through an FFT pair (Burgers on a periodic grid is translation-equivariant). The
    /// knob that makes building batches as costly as a real input pipeline.
    pub augment_passes: u32,
    pub cache: Cache,
    /// Data-loader worker processes; 0 loads in the trainer.
    pub workers: u32,
    pub start_method: StartMethod,
    pub batch_size: u32,
    /// Batches in flight per worker.
    pub prefetch: u32,
    /// Size of a private `/dev/shm` for the run (e.g. `"64m"`); absent = the machine's.
    pub shm_size: Option<String>,
    /// Intra-op threads of a worker: `one` (set first thing, the fix) or `inherit` (keep the
    /// trainer's: a forked worker then deadlocks in libgomp, REFERENCE.md).
    pub worker_threads: WorkerThreads,
    /// Where the `memory` cache's tensors live: `cpu`, or `cuda` (the rank's GPU; workers then
    /// build batches from GPU memory, REFERENCE.md failure 2's "CUDA-contaminated cache").
    pub cache_device: CacheDevice,
}

impl Default for Data {
    fn default() -> Self {
        Data {
            samples: 64,
            grid: 128,
            timesteps: 10,
            queries: 64,
            augment_passes: 0,
            cache: Cache::Memory,
            workers: 0,
            start_method: StartMethod::Fork,
            batch_size: 16,
            prefetch: 2,
            shm_size: None,
            worker_threads: WorkerThreads::One,
            cache_device: CacheDevice::Cpu,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cache {
    Memory,
    Disk,
    Shm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartMethod {
    Fork,
    Spawn,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheDevice {
    Cpu,
    Cuda,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerThreads {
    One,
    Inherit,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Train {
    /// Optimizer steps.
    pub steps: u64,
    pub lr: f64,
    pub weight_decay: f64,
    /// bf16 autocast for the forward pass, on the rank's device (CUDA, or the CPU).
    pub amp: bool,
    /// Micro-batches accumulated per optimizer step.
    pub accum_steps: u32,
    pub seed: u64,
    /// DDP: reduce parameters that got no gradient as zeros instead of failing like PyTorch's
    /// Reducer does without `find_unused_parameters=True`.
    pub find_unused_parameters: bool,
    /// Save a checkpoint after every this many steps (0: never).
    pub checkpoint_every: u64,
    /// Where checkpoints go; relative paths are taken from the scenario's run directory (the
    /// working directory under `ups-doctor train`).
    pub checkpoint_dir: String,
    /// A checkpoint to resume from: one `step-N` directory, or a checkpoint directory (its latest
    /// complete checkpoint). Relative like `checkpoint_dir`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<String>,
}

impl Default for Train {
    fn default() -> Self {
        Train {
            steps: 200,
            lr: 2e-3,
            weight_decay: 0.01,
            amp: false,
            accum_steps: 1,
            seed: 0,
            find_unused_parameters: false,
            checkpoint_every: 0,
            checkpoint_dir: "checkpoints".into(),
            resume: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Wall-clock limit for the whole scenario.
    pub timeout_s: f64,
    /// A rank that sends no marker for this long is hung.
    pub hang_after_s: f64,
    /// Milliseconds between NVML samples of the GPUs; 0 turns GPU sampling off.
    pub gpu_sample_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { timeout_s: 600.0, hang_after_s: 60.0, gpu_sample_ms: 200 }
    }
}

/// How a rank or run ended, as a plain kind (the detail lives in the result).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeKind {
    Passed,
    FalseSuccess,
    Exited,
    Signaled,
    Hung,
    TimedOut,
    LaunchFailed,
}

impl OutcomeKind {
    pub const ALL: [OutcomeKind; 7] = [
        OutcomeKind::Passed,
        OutcomeKind::FalseSuccess,
        OutcomeKind::Exited,
        OutcomeKind::Signaled,
        OutcomeKind::Hung,
        OutcomeKind::TimedOut,
        OutcomeKind::LaunchFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeKind::Passed => "passed",
            OutcomeKind::FalseSuccess => "false_success",
            OutcomeKind::Exited => "exited",
            OutcomeKind::Signaled => "signaled",
            OutcomeKind::Hung => "hung",
            OutcomeKind::TimedOut => "timed_out",
            OutcomeKind::LaunchFailed => "launch_failed",
        }
    }
}

/// The outcome a scenario should have. Unset fields are not checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Expect {
    pub outcome: OutcomeKind,
    /// Signal name such as `SIGSEGV`, for `signaled`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// Exit code, for `exited`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The rank that fails first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// The failing rank's last phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The failing rank's last step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// Text the failing rank's error message must contain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// External commands: what shows that the program really finished, so that an exit status
    /// of 0 without it is `false_success`. Absent: the exit status alone decides.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completes_when: Option<CompletesWhen>,
}

/// The evidence that an external program finished its work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum CompletesWhen {
    /// Every rank sent the helper's `done` marker (`ups_doctor.done()`).
    Done,
    /// A line of the program's standard output matches this regular expression (any rank's
    /// output; under a launcher, the launcher's output, which its ranks share).
    Stdout(String),
    /// A line of the program's output, standard output or standard error, matches this regular
    /// expression (Lightning, for one, prints its end-of-fit line on stderr).
    Output(String),
}

impl Default for Expect {
    fn default() -> Self {
        Expect {
            outcome: OutcomeKind::Passed,
            signal: None,
            exit_code: None,
            rank: None,
            phase: None,
            step: None,
            message: None,
            completes_when: None,
        }
    }
}

/// A fault the trainer performs for real at a phase and step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    pub fault: FaultKind,
    /// Phase at whose beginning the fault fires (`forward`, `backward`, `optimizer`, `data.next`,
    /// `model.build`, `model.build/encoder`, `data.generate`, `start`).
    pub phase: String,
    /// Step (0-based) for per-step phases; ignored by one-off phases.
    #[serde(default)]
    pub step: u64,
    /// Only this rank; every rank when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// Only when these dotted scenario fields have the given value; a list gives alternatives
    /// (for a list-valued field such as `model.depths`, a list of lists).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub when: BTreeMap<String, serde_json::Value>,
    /// Chance that the fault fires in a given run, decided once per process from the operating
    /// system's randomness (never from `train.seed`): a flaky failure.
    #[serde(default = "always", skip_serializing_if = "is_always")]
    pub probability: f64,
    /// Size of the segment `leak_shm` creates (`"16m"`, like `data.shm_size`); 32 MiB when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
}

fn always() -> f64 {
    1.0
}

fn is_always(p: &f64) -> bool {
    *p == 1.0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// An invalid memory access (a real SIGSEGV).
    Segv,
    /// `abort()` (SIGABRT).
    Abort,
    /// Silent `_exit(0)` before training ends (a swallowed exception).
    Exit0,
    /// Prints an error and exits with status 1.
    ExitError,
    /// Two threads deadlock on two locks; the process blocks forever.
    Hang,
    /// The loss becomes NaN.
    Nan,
    /// The forward skips the last block on this step, so its parameters get no gradient (DDP's
    /// "parameters that were not used in producing loss").
    UnusedParam,
    /// This rank stops one step early (at `step`) and waits for the others at the end: ranks out
    /// of step, so the others block in a collective.
    UnevenSteps,
    /// The encoder keeps a running mean of its input in a frozen parameter and updates it in
    /// place during forward at this step: allowed on a plain parameter (single, DDP), refused by
    /// libtorch when the parameter is a view of an FSDP flat parameter.
    InplaceView,
    /// Creates a `/dev/shm` segment of `size`, writes every page and never removes it: a leaked
    /// segment, and a real SIGBUS when `/dev/shm` is too small for it.
    LeakShm,
    // Data-loader faults (issue #4).
    /// At the beginning of `data.next`, the trainer sends SIGKILL to its worker 0 (as the OOM
    /// killer would).
    WorkerKill,
    /// Allocates memory and writes every page, 16 MiB at a time, until the kernel ends the rank
    /// (needs `launch.memory_limit`, whose OOM killer it meets).
    Oom,
}

/// Size of a `leak_shm` segment when the fault names none.
pub const DEFAULT_LEAK_SIZE: u64 = 32 << 20;

/// Phases a fault may name. Per-step phases fire at `step`; the others fire once.
pub const PER_STEP_PHASES: [&str; 4] = ["data.next", "forward", "backward", "optimizer"];
pub const ONE_OFF_PHASES: [&str; 3] = ["start", "data.generate", "model.build"];
/// Checkpoint phases fire at the step being saved: `checkpoint.save` begins the save,
/// `checkpoint.commit` begins once this rank's file is written, before the ranks agree that the
/// save is complete and rank 0 renames it into place.
pub const CHECKPOINT_PHASES: [&str; 2] = ["checkpoint.save", "checkpoint.commit"];
/// Phases inside data-loader workers: `worker.batch` fires in the worker building the batch of
/// `step` (segv, abort, exit0, exit_error, hang).
pub const WORKER_PHASES: [&str; 1] = ["worker.batch"];
