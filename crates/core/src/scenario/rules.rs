//! The checks serde cannot make: ranges, relations between fields, fault phases and conditions,
//! and values the schema knows but the tool cannot run yet ([`not_supported_yet`]).
//!
//! Each rule reports the first problem as an [`Invalid`]: the dotted field to blame, a message
//! that reads after that field, a concrete fix, and the other fields the rule read (so that a
//! `--set` of one of those can be blamed when it caused the problem).

use serde::Serialize;
use serde_json::Value;

use super::command::{self, BUILTIN_PLACEHOLDERS, Param, ParamValue};
use super::explain::{self, Source};
use super::fields;
use super::model::{
    Backend, CHECKPOINT_PHASES, Cache, CacheDevice, Data, Device, Expect, Fault, FaultKind, Launch, Limits,
    Mode, Model, ONE_OFF_PHASES, OutcomeKind, PER_STEP_PHASES, Scenario, StartMethod, Train, WORKER_PHASES,
    WorkerThreads,
};
use super::model::{CompletesWhen, LaunchStyle};
use super::size::{SIZE_FORMS, parse_size};
use super::{path, suggest};
use crate::protocol::{signal_name, signal_number};

/// A value that serde accepted but that cannot run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Invalid {
    pub field: String,
    pub message: String,
    pub hint: Option<String>,
    /// Other fields the rule read.
    pub related: Vec<String>,
    /// The problem is the key itself (an unknown `when` path), not its value.
    pub at_key: bool,
}

impl Invalid {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Invalid {
        Invalid {
            field: field.into(),
            message: message.into(),
            hint: None,
            related: Vec::new(),
            at_key: false,
        }
    }

    fn hint(mut self, hint: impl Into<String>) -> Invalid {
        self.hint = Some(hint.into());
        self
    }

    fn hint_opt(mut self, hint: Option<String>) -> Invalid {
        self.hint = hint;
        self
    }

    fn related(mut self, fields: &[&str]) -> Invalid {
        self.related = fields.iter().map(|f| f.to_string()).collect();
        self
    }
}

type Checked = Result<(), Invalid>;

/// Every rule, in the order a user should fix things: shapes and ranges first, then relations,
/// then faults and expectations, and only then what is not supported yet.
pub(crate) fn check(s: &Scenario) -> Checked {
    if s.is_external() {
        return check_external(s);
    }
    check_builtin_has_no_command_fields(s)?;
    check_model(&s.model)?;
    check_data(&s.data)?;
    check_shm_size(&s.data)?;
    check_model_fits_data(&s.model, &s.data)?;
    check_train(&s.train)?;
    check_limits(&s.limits)?;
    check_launch(&s.launch)?;
    check_memory_limit(&s.launch)?;
    check_env_and_cwd(&s.launch)?;
    check_cache_device(&s.data, &s.launch)?;
    check_expect(&s.expect)?;
    for (index, fault) in s.inject.iter().enumerate() {
        check_fault(s, index, fault)?;
    }
    not_supported_yet(s)
}

/// `field` must be at most `max`: beyond it a value is a typo or an attack, not a configuration
/// (it would exhaust memory, processes or time before anything useful happened).
fn at_most(field: &str, value: u64, max: u64, why: &str) -> Checked {
    if value <= max {
        return Ok(());
    }
    Err(Invalid::new(field, format!("must be at most {max}, found `{value}`")).hint(why.to_string()))
}

/// Longest `limits.timeout_s` / `hang_after_s`: a week.
const MAX_LIMIT_S: f64 = 7.0 * 24.0 * 3600.0;
/// Most ranks ups-doctor starts on one machine.
const MAX_WORLD_SIZE: u64 = 1024;
/// Most training steps: the trainer keeps per-step records.
const MAX_STEPS: u64 = 10_000_000;

/// `field` must be at least `min`.
fn at_least(field: &str, value: u64, min: u64, example: &str) -> Checked {
    if value >= min {
        return Ok(());
    }
    Err(Invalid::new(field, format!("must be at least {min}, found `{value}`"))
        .hint(format!("e.g. `{example}`")))
}

/// `field` must be a finite number above zero (or at least zero with `allow_zero`).
fn positive(field: &str, value: f64, allow_zero: bool, example: &str) -> Checked {
    let ok = value.is_finite() && (value > 0.0 || (allow_zero && value == 0.0));
    if ok {
        return Ok(());
    }
    let bound = if allow_zero { "zero or more" } else { "more than zero" };
    Err(Invalid::new(field, format!("must be a finite number {bound}, found `{value}`"))
        .hint(format!("e.g. `{example}`")))
}

fn check_model(m: &Model) -> Checked {
    if m.depths.is_empty() {
        return Err(Invalid::new("model.depths", "the model needs at least one stage, found `[]`")
            .hint("list the blocks per stage, e.g. `\"depths\": [1, 1]` for two stages of one block"));
    }
    if let Some(stage) = m.depths.iter().position(|&d| d == 0) {
        return Err(Invalid::new(format!("model.depths[{stage}]"), format!("stage {stage} has 0 blocks"))
            .hint("give every stage at least 1 block, or remove the stage from the list"));
    }
    at_most("model.depths", m.depths.len() as u64, 64, "at most 64 stages; e.g. `[2, 2]`")?;
    if let Some(stage) = m.depths.iter().position(|&d| d > 1024) {
        at_most(&format!("model.depths[{stage}]"), m.depths[stage].into(), 1024, "e.g. `2`")?;
    }
    at_least("model.hidden", m.hidden.into(), 1, "64")?;
    at_most("model.hidden", m.hidden.into(), 65_536, "e.g. `64`")?;
    at_least("model.heads", m.heads.into(), 1, "4")?;
    at_most("model.heads", m.heads.into(), 1024, "e.g. `4`")?;
    if m.hidden % m.heads != 0 {
        let below = m.hidden / m.heads * m.heads;
        let above = below + m.heads;
        let choices =
            if below == 0 { format!("`hidden` {above}") } else { format!("`hidden` {below} or {above}") };
        return Err(Invalid::new(
            "model.hidden",
            format!("`hidden` {} is not divisible by `heads` {}", m.hidden, m.heads),
        )
        .hint(format!(
            "use {choices} (multiples of `heads` {}), or a `heads` that divides {}",
            m.heads, m.hidden
        ))
        .related(&["model.heads"]));
    }
    at_least("model.latent_tokens", m.latent_tokens.into(), 1, "16")?;
    at_most("model.latent_tokens", m.latent_tokens.into(), 1 << 20, "e.g. `16`")?;
    at_most("model.window", m.window.into(), 1 << 20, "e.g. `4`, or 0 for global attention")?;
    at_least("model.mlp_ratio", m.mlp_ratio.into(), 1, "2")?;
    at_most("model.mlp_ratio", m.mlp_ratio.into(), 64, "e.g. `4`")
}

fn check_data(d: &Data) -> Checked {
    at_least("data.samples", d.samples.into(), 1, "64")?;
    at_most("data.samples", d.samples.into(), 10_000_000, "e.g. `256`")?;
    at_most("data.grid", d.grid.into(), 1 << 20, "e.g. `128`")?;
    at_most("data.timesteps", d.timesteps.into(), 100_000, "e.g. `10`")?;
    if d.grid < 8 || d.grid % 2 != 0 {
        return Err(Invalid::new(
            "data.grid",
            format!("must be an even number of at least 8, found `{}`", d.grid),
        )
        .hint(format!("e.g. `{}`", d.grid.max(8).div_ceil(2) * 2)));
    }
    at_least("data.timesteps", d.timesteps.into(), 2, "10").map_err(|e| Invalid {
        message: format!("{} (training pairs are consecutive snapshots)", e.message),
        ..e
    })?;
    at_least("data.queries", d.queries.into(), 1, "64")?;
    if d.queries > d.grid {
        return Err(Invalid::new(
            "data.queries",
            format!("{} queries are more than the {} points of `grid`", d.queries, d.grid),
        )
        .hint(format!("use at most {} queries, or a larger `grid`", d.grid))
        .related(&["data.grid"]));
    }
    if d.augment_passes > MAX_AUGMENT_PASSES {
        return Err(Invalid::new(
            "data.augment_passes",
            format!("must be at most {MAX_AUGMENT_PASSES}, found `{}`", d.augment_passes),
        )
        .hint("a few dozen passes already make batch building dominate a step; e.g. `32`"));
    }
    at_least("data.batch_size", d.batch_size.into(), 1, "16")?;
    at_most("data.batch_size", d.batch_size.into(), 1 << 20, "e.g. `16`")?;
    at_least("data.prefetch", d.prefetch.into(), 1, "2")?;
    at_most("data.prefetch", d.prefetch.into(), 1024, "e.g. `2`")?;
    check_workers(d)
}

/// Most augmentation passes per sample: beyond that a run measures nothing but FFTs.
const MAX_AUGMENT_PASSES: u32 = 1024;

/// Most data-loader workers per rank: each is a process with its own slots in the ring.
const MAX_WORKERS: u32 = 64;

fn check_workers(d: &Data) -> Checked {
    if d.workers > MAX_WORKERS {
        return Err(Invalid::new(
            "data.workers",
            format!("{} workers per rank is more than the {MAX_WORKERS} ups-doctor starts", d.workers),
        )
        .hint("use at most 64; a handful per rank is what saturates a CPU input pipeline"));
    }
    if d.worker_threads == WorkerThreads::Inherit {
        if d.workers == 0 {
            return Err(Invalid::new(
                "data.worker_threads",
                "`inherit` is about worker processes, but `workers` is 0 (batches are built in the trainer)",
            )
            .hint("set `workers` to 1 or more, or remove `worker_threads`")
            .related(&["data.workers"]));
        }
        if d.start_method == StartMethod::Spawn {
            return Err(Invalid::new(
                "data.worker_threads",
                "`inherit` only matters with `start_method: fork` (a spawned worker inherits no thread pool)",
            )
            .hint("use `start_method: fork` to reproduce the fork-after-threads deadlock, or remove `worker_threads`")
            .related(&["data.start_method"]));
        }
    }
    Ok(())
}

/// `data.shm_size` must be a size Docker's `--shm-size` would take.
fn check_shm_size(d: &Data) -> Checked {
    let Some(size) = &d.shm_size else {
        return Ok(());
    };
    parse_size(size).map(|_| ()).map_err(|why| {
        Invalid::new("data.shm_size", why.to_string())
            .hint(format!("write {SIZE_FORMS}; or remove `shm_size` to use the machine's `/dev/shm`"))
    })
}

fn check_model_fits_data(m: &Model, d: &Data) -> Checked {
    if d.grid % m.latent_tokens != 0 {
        // Bounded by `grid` (itself bounded): a huge `latent_tokens` must not loop for minutes.
        let below = (1..m.latent_tokens.min(d.grid.saturating_add(1))).rev().find(|t| d.grid % t == 0);
        let above = (m.latent_tokens.saturating_add(1)..=d.grid).find(|t| d.grid % t == 0);
        let choices: Vec<String> = below.into_iter().chain(above).map(|t| t.to_string()).collect();
        return Err(Invalid::new(
            "model.latent_tokens",
            format!("`data.grid` {} is not divisible by `latent_tokens` {}", d.grid, m.latent_tokens),
        )
        .hint(format!("use a divisor of {} such as {}", d.grid, choices.join(" or ")))
        .related(&["data.grid"]));
    }
    if m.window > m.latent_tokens {
        return Err(Invalid::new(
            "model.window",
            format!("`window` {} is larger than `latent_tokens` {}", m.window, m.latent_tokens),
        )
        .hint(format!("use a `window` of at most {}, or 0 for global attention", m.latent_tokens))
        .related(&["model.latent_tokens"]));
    }
    Ok(())
}

fn check_train(t: &Train) -> Checked {
    at_least("train.steps", t.steps, 1, "60")?;
    at_most(
        "train.steps",
        t.steps,
        MAX_STEPS,
        "e.g. `60`; a reproduction rarely needs more than a few thousand",
    )?;
    positive("train.lr", t.lr, false, "0.003")?;
    positive("train.weight_decay", t.weight_decay, true, "0.01")?;
    at_least("train.accum_steps", t.accum_steps.into(), 1, "1")?;
    at_most("train.accum_steps", t.accum_steps.into(), 1024, "e.g. `2`")
}

fn check_limits(l: &Limits) -> Checked {
    positive("limits.timeout_s", l.timeout_s, false, "600")?;
    positive("limits.hang_after_s", l.hang_after_s, false, "60")?;
    for (field, value, example) in
        [("limits.timeout_s", l.timeout_s, "600"), ("limits.hang_after_s", l.hang_after_s, "60")]
    {
        if value > MAX_LIMIT_S {
            return Err(Invalid::new(
                field,
                format!("must be at most {MAX_LIMIT_S} seconds (a week), found `{value:?}`"),
            )
            .hint(format!("e.g. `{example}`")));
        }
    }
    if l.gpu_sample_ms != 0 && !(MIN_GPU_SAMPLE_MS..=MAX_GPU_SAMPLE_MS).contains(&l.gpu_sample_ms) {
        return Err(Invalid::new(
            "limits.gpu_sample_ms",
            format!(
                "must be 0 (no GPU sampling) or between {MIN_GPU_SAMPLE_MS} and {MAX_GPU_SAMPLE_MS}, found `{}`",
                l.gpu_sample_ms
            ),
        )
        .hint("e.g. `200`: NVML refreshes utilisation about every 1/6 s, so faster sampling repeats readings"));
    }
    Ok(())
}

/// Fastest GPU sampling: each sample is a round of NVML calls per GPU in the harness's loop.
const MIN_GPU_SAMPLE_MS: u64 = 20;
/// Slowest GPU sampling that still draws a useful chart of a minutes-long run.
const MAX_GPU_SAMPLE_MS: u64 = 60_000;

/// A dataset cache on the GPU needs a rank that can have a GPU and tensors in process memory.
fn check_cache_device(d: &Data, l: &Launch) -> Checked {
    if d.cache_device != CacheDevice::Cuda {
        return Ok(());
    }
    if l.device == Device::Cpu {
        return Err(Invalid::new(
            "data.cache_device",
            "`cuda` puts the dataset cache on the rank's GPU, but `launch.device` is `cpu`",
        )
        .hint("use `device: cuda` (or `auto`), or `cache_device: cpu`")
        .related(&["launch.device"]));
    }
    if d.cache != Cache::Memory {
        let kind = json_name(&d.cache);
        return Err(Invalid::new(
            "data.cache_device",
            format!("`cuda` keeps the cache in GPU memory, but `cache: {kind}` keeps it in a host file"),
        )
        .hint("use `cache: memory` with `cache_device: cuda`, or `cache_device: cpu`")
        .related(&["data.cache"]));
    }
    Ok(())
}

fn check_world_size(l: &Launch, example: &str) -> Checked {
    at_least("launch.world_size", l.world_size.into(), 1, example)?;
    at_most(
        "launch.world_size",
        l.world_size.into(),
        MAX_WORLD_SIZE,
        "ranks are processes on this machine; for more, run ups-doctor on each node under torchrun or Slurm",
    )?;
    at_least("launch.nodes", l.nodes.into(), 1, "1")?;
    if l.world_size % l.nodes != 0 {
        return Err(Invalid::new(
            "launch.nodes",
            format!(
                "{} ranks do not divide over {} nodes: every node runs `world_size / nodes` ranks",
                l.world_size, l.nodes
            ),
        )
        .hint("make `world_size` a multiple of `nodes`")
        .related(&["launch.world_size"]));
    }
    Ok(())
}

fn check_launch(l: &Launch) -> Checked {
    check_world_size(l, "1")?;
    if l.mode == Mode::Single && l.world_size != 1 {
        return Err(Invalid::new(
            "launch.world_size",
            format!("`mode: single` runs one rank, but `world_size` is {}", l.world_size),
        )
        .hint("use `world_size: 1`, or `mode: ddp` or `fsdp` for more ranks")
        .related(&["launch.mode"]));
    }
    if l.backend == Backend::Nccl && l.device == Device::Cpu {
        return Err(Invalid::new(
            "launch.backend",
            "`nccl` needs CUDA tensors, but `device` is `cpu`: NCCL cannot reduce CPU memory",
        )
        .hint("use `backend: tcp` (or `auto`, which picks `tcp` for CPU ranks)")
        .related(&["launch.device"]));
    }
    Ok(())
}

/// The smallest `launch.memory_limit`: below it a rank cannot even load libtorch.
pub const MIN_MEMORY_LIMIT: u64 = 64 << 20;

/// `launch.memory_limit` must be a size `docker run --memory` would take, and enough to start.
fn check_memory_limit(l: &Launch) -> Checked {
    let Some(limit) = &l.memory_limit else {
        return Ok(());
    };
    let bytes = parse_size(limit).map_err(|why| {
        Invalid::new("launch.memory_limit", why.to_string())
            .hint(format!("write {SIZE_FORMS}, like `docker run --memory`; or remove it for no limit"))
    })?;
    if bytes < MIN_MEMORY_LIMIT {
        return Err(Invalid::new(
            "launch.memory_limit",
            format!("`{limit}` is less than 64 MiB, too little for a rank to start"),
        )
        .hint("use at least `\"64m\"`; a few hundred MiB per rank is typical for small scenarios"));
    }
    Ok(())
}

/// Conventional names of the signals ups-doctor knows, for suggestions.
fn signal_names() -> Vec<String> {
    (1..32).map(signal_name).filter(|n| !n[3..].starts_with(|c: char| c.is_ascii_digit())).collect()
}

fn check_expect(e: &Expect) -> Checked {
    if let Some(signal) = &e.signal {
        if signal_number(signal).is_none() {
            let names = signal_names();
            let upper = signal.to_ascii_uppercase();
            let full = if upper.starts_with("SIG") { upper } else { format!("SIG{upper}") };
            return Err(Invalid::new("expect.signal", format!("unknown signal `{signal}`"))
                .hint_opt(suggest::hint(&full, &names, "a signal name")));
        }
        if e.outcome != OutcomeKind::Signaled {
            return Err(Invalid::new(
                "expect.signal",
                format!(
                    "`signal` applies only to `outcome: signaled`, but `outcome` is `{}`",
                    e.outcome.as_str()
                ),
            )
            .hint("set `outcome` to `signaled`, or remove `signal`")
            .related(&["expect.outcome"]));
        }
    }
    if e.exit_code.is_some() && e.outcome != OutcomeKind::Exited {
        return Err(Invalid::new(
            "expect.exit_code",
            format!(
                "`exit_code` applies only to `outcome: exited`, but `outcome` is `{}`",
                e.outcome.as_str()
            ),
        )
        .hint("set `outcome` to `exited`, or remove `exit_code`")
        .related(&["expect.outcome"]));
    }
    Ok(())
}

/// Every phase a fault may name, `model.build/<component>` aside.
fn known_phases() -> Vec<&'static str> {
    PER_STEP_PHASES.into_iter().chain(ONE_OFF_PHASES).chain(CHECKPOINT_PHASES).chain(WORKER_PHASES).collect()
}

fn check_fault(s: &Scenario, index: usize, fault: &Fault) -> Checked {
    let at = |field: &str| format!("inject[{index}].{field}");
    let phases = known_phases();
    let component = fault.phase.strip_prefix("model.build/").is_some_and(|c| !c.is_empty());
    if !component && !phases.contains(&fault.phase.as_str()) {
        let hint = match suggest::closest(&fault.phase, &phases) {
            Some(close) => format!("did you mean `{close}`?"),
            None => format!("a phase is one of {}, or `model.build/<component>`", suggest::list(&phases)),
        };
        return Err(Invalid::new(at("phase"), format!("unknown phase `{}`", fault.phase)).hint(hint));
    }
    let per_step =
        PER_STEP_PHASES.contains(&fault.phase.as_str()) || WORKER_PHASES.contains(&fault.phase.as_str());
    if per_step && fault.step >= s.train.steps {
        return Err(Invalid::new(
            at("step"),
            format!(
                "step {} never runs: `train.steps` is {} and steps count from 0",
                fault.step, s.train.steps
            ),
        )
        .hint(format!("use a step from 0 to {}, or raise `train.steps`", s.train.steps - 1))
        .related(&["train.steps"]));
    }
    if let Some(rank) = fault.rank {
        if rank >= s.launch.world_size {
            let ranks = match s.launch.world_size {
                1 => "rank 0".to_string(),
                n => format!("a rank from 0 to {}", n - 1),
            };
            return Err(Invalid::new(
                at("rank"),
                format!("rank {rank} does not exist: `launch.world_size` is {}", s.launch.world_size),
            )
            .hint(format!("use {ranks}, or remove `rank` to fault on every rank"))
            .related(&["launch.world_size"]));
        }
    }
    check_loader_fault(s, index, fault)?;
    if fault.fault == FaultKind::Oom && s.launch.memory_limit.is_none() {
        // Without a limit it would take the whole machine's memory before anything stopped it.
        return Err(Invalid::new(at("fault"), "fault `oom` allocates until the OOM killer stops it, but `launch.memory_limit` is not set")
            .hint("set `launch.memory_limit` (e.g. `\"512m\"`) so that only the scenario's cgroup runs out of memory")
            .related(&["launch.memory_limit"]));
    }
    let acts_in = match fault.fault {
        FaultKind::UnevenSteps | FaultKind::WorkerKill => Some("data.next"),
        FaultKind::UnusedParam | FaultKind::InplaceView => Some("forward"),
        _ => None,
    };
    if let Some(only) = acts_in
        && fault.phase != only
    {
        return Err(Invalid::new(
            at("phase"),
            format!("fault `{}` acts in phase `{only}`, not `{}`", json_name(&fault.fault), fault.phase),
        )
        .hint(format!("use `\"phase\": \"{only}\"` with the step where it should happen")));
    }
    if let Some(size) = &fault.size {
        if fault.fault != FaultKind::LeakShm {
            return Err(Invalid::new(
                at("size"),
                format!("`size` applies only to `leak_shm`, not `{}`", json_name(&fault.fault)),
            )
            .hint("remove `size`, or use `\"fault\": \"leak_shm\"`"));
        }
        if let Err(why) = parse_size(size) {
            return Err(Invalid::new(at("size"), why.to_string()).hint(format!("write {SIZE_FORMS}")));
        }
    }
    if !(fault.probability > 0.0 && fault.probability <= 1.0) {
        return Err(Invalid::new(
            at("probability"),
            format!("probability {} is not in (0, 1]", fault.probability),
        )
        .hint("use e.g. `0.5` for a fault that fires in about half the runs, or leave it out (1)"));
    }
    for (key, wanted) in &fault.when {
        check_condition(s, &at(&format!("when.{key}")), key, wanted)?;
    }
    Ok(())
}

/// Faults that need data-loader workers, and what a worker can do.
fn check_loader_fault(s: &Scenario, index: usize, fault: &Fault) -> Checked {
    let at = |field: &str| format!("inject[{index}].{field}");
    let in_worker = WORKER_PHASES.contains(&fault.phase.as_str());
    if (in_worker || fault.fault == FaultKind::WorkerKill) && s.data.workers == 0 {
        let what = if in_worker {
            format!("phase `{}` happens in data-loader workers", fault.phase)
        } else {
            "fault `worker_kill` kills a data-loader worker".to_string()
        };
        return Err(Invalid::new(at("fault"), format!("{what}, but `data.workers` is 0"))
            .hint("set `data.workers` to 1 or more")
            .related(&["data.workers"]));
    }
    let worker_can = [
        FaultKind::Segv,
        FaultKind::Abort,
        FaultKind::Exit0,
        FaultKind::ExitError,
        FaultKind::Hang,
        FaultKind::Oom,
    ];
    if in_worker && !worker_can.contains(&fault.fault) {
        let names: Vec<String> = worker_can.iter().map(json_name).collect();
        return Err(Invalid::new(
            at("fault"),
            format!(
                "fault `{}` cannot happen in a worker (phase `{}`)",
                json_name(&fault.fault),
                fault.phase
            ),
        )
        .hint(format!("in `{}` use one of {}", fault.phase, names.join(", "))));
    }
    Ok(())
}

/// One `when` entry: the key must name a scenario field, and every value it lists must be a
/// value that field can have (else the condition silently never holds).
fn check_condition(s: &Scenario, field: &str, key: &str, wanted: &Value) -> Checked {
    let Some(current) = fields::lookup(s, key).filter(|_| !key.starts_with("inject")) else {
        let known = explain::known_fields();
        let last = key.rsplit('.').next().unwrap_or(key);
        let same_name: Vec<&String> = known.iter().filter(|k| k.rsplit('.').next() == Some(last)).collect();
        let hint = match (same_name.as_slice(), suggest::closest(key, &known)) {
            ([only], _) => Some(format!("did you mean `{only}`?")),
            (_, Some(close)) => Some(format!("did you mean `{close}`?")),
            _ => Some("name a scenario field by its dotted path, e.g. `\"data.workers\": 2`".to_string()),
        };
        let mut invalid = Invalid::new(field, format!("unknown scenario field `{key}`")).hint_opt(hint);
        invalid.at_key = true;
        return Err(invalid);
    };
    if current.is_object() {
        let known = explain::known_fields();
        let prefix = format!("{key}.");
        let example = known.iter().find(|k| k.starts_with(&prefix)).map_or(key, |k| k.as_str());
        return Err(Invalid::new(field, format!("`{key}` is a section, not a field"))
            .hint(format!("name one of its fields, e.g. `{example}`")));
    }
    let alternatives = fields::when_alternatives(&current, wanted);
    if alternatives.is_empty() {
        return Err(Invalid::new(field, "an empty list of values never matches")
            .hint("give one value, or a list of the values to match"));
    }
    let Ok(segments) = path::parse(key) else {
        return Ok(());
    };
    let Ok(scenario_value) = serde_json::to_value(s) else {
        return Ok(());
    };
    for candidate in alternatives {
        let mut probe = scenario_value.clone();
        if path::set(&mut probe, &segments, candidate.clone()).is_err() {
            continue;
        }
        if let Err((at, message)) = explain::strict_from_value(probe) {
            let problem = explain::explain(&at, &message, Source::File);
            return Err(Invalid::new(
                field,
                format!("`{key}` can never be `{candidate}`: {}", problem.message),
            )
            .hint_opt(problem.hint));
        }
    }
    Ok(())
}

/// A scenario with `command`: the built-in trainer's fields must stay unset, the command and its
/// params must fit together, and the launch, limits and expectation must make sense.
fn check_external(s: &Scenario) -> Checked {
    check_builtin_fields_unset(s)?;
    check_shm_size(&s.data)?;
    check_limits(&s.limits)?;
    check_world_size(&s.launch, "2")?;
    check_memory_limit(&s.launch)?;
    check_env_and_cwd(&s.launch)?;
    check_expect(&s.expect)?;
    check_completes_when(s)?;
    check_command(s)
}

/// With `command`, the fields only the built-in trainer reads are refused (not ignored), so a
/// scenario never looks like it configures something that does not happen. `data.shm_size` is
/// the exception: the private `/dev/shm` is the harness's, and works for any program.
fn check_builtin_fields_unset(s: &Scenario) -> Checked {
    let defaults = Scenario::default();
    let hint = "remove it: your program's own settings go into `params`, substituted into `command`";
    let sections: [(&str, Value, Value); 3] = [
        ("model", to_json(&s.model), to_json(&defaults.model)),
        ("data", to_json(&s.data), to_json(&defaults.data)),
        ("train", to_json(&s.train), to_json(&defaults.train)),
    ];
    for (section, ours, default) in sections {
        if let Some(field) = first_difference(section, &ours, &default, &["data.shm_size"]) {
            return Err(Invalid::new(
                field.clone(),
                "only the built-in trainer reads this, and it does not run when `command` is given",
            )
            .hint(hint));
        }
    }
    let launch = [
        (
            "launch.mode",
            s.launch.mode != defaults.launch.mode,
            "the ranks of a command are `launch.world_size` copies (or what its launcher starts); there is no mode to pick",
        ),
        ("launch.device", s.launch.device != defaults.launch.device, "a command picks its own device"),
        (
            "launch.backend",
            s.launch.backend != defaults.launch.backend,
            "a command picks its own process-group backend",
        ),
    ];
    if let Some((field, _, why)) = launch.into_iter().find(|(_, set, _)| *set) {
        return Err(Invalid::new(field, format!("`{field}` is for the built-in trainer: {why}"))
            .hint("remove it; set `launch.world_size` and, for torchrun, `launch.style: launcher`"));
    }
    if !s.inject.is_empty() {
        return Err(Invalid::new(
            "inject",
            "faults are injected by the built-in trainer, which does not run when `command` is given",
        )
        .hint("remove `inject`; run your program the way it fails, or give it a param that makes it fail"));
    }
    Ok(())
}

fn to_json<T: Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// The first dotted field (under `prefix`) where `ours` differs from `default`, skipping `except`.
fn first_difference(prefix: &str, ours: &Value, default: &Value, except: &[&str]) -> Option<String> {
    match (ours, default) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            keys.into_iter().find_map(|key| {
                let field = format!("{prefix}.{key}");
                if except.contains(&field.as_str()) {
                    return None;
                }
                let null = Value::Null;
                first_difference(&field, a.get(key).unwrap_or(&null), b.get(key).unwrap_or(&null), except)
            })
        }
        (a, b) if a == b => None,
        _ => Some(prefix.to_string()),
    }
}

/// The built-in trainer's scenarios must not carry what only a command uses.
fn check_builtin_has_no_command_fields(s: &Scenario) -> Checked {
    const ADD: &str = "add `command` (the program and its arguments, e.g. `[\"python\", \"train.py\"]`)";
    if let Some(name) = s.params.keys().next() {
        return Err(Invalid::new(
            format!("params.{name}"),
            "`params` are substituted into `command`, but there is no `command` (the built-in trainer runs)",
        )
        .hint(format!("{ADD}, or remove `params`")));
    }
    if s.launch.style == LaunchStyle::Launcher {
        return Err(Invalid::new(
            "launch.style",
            "`launcher` starts a `command` that starts the ranks, but there is no `command`",
        )
        .hint(format!("{ADD}, or remove `style`")));
    }
    if s.expect.completes_when.is_some() {
        return Err(Invalid::new(
            "expect.completes_when",
            "the built-in trainer always reports completion with its `done` marker; `completes_when` is for a `command`",
        )
        .hint("remove `completes_when`"));
    }
    Ok(())
}

fn check_completes_when(s: &Scenario) -> Checked {
    let (field, pattern) = match &s.expect.completes_when {
        Some(CompletesWhen::Stdout(p)) => ("expect.completes_when.stdout", p),
        Some(CompletesWhen::Output(p)) => ("expect.completes_when.output", p),
        _ => return Ok(()),
    };
    if let Err(err) = regex::Regex::new(pattern) {
        let why = err.to_string();
        let last = why.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
        return Err(Invalid::new(
            field,
            format!("`{pattern}` is not a regular expression: {}", last.trim_start_matches("error: ")),
        )
        .hint("write a regular expression (Rust `regex` syntax) such as `\"^training finished\"`; escape `\\\\`, `(` and `[` with `\\\\`"));
    }
    if pattern.is_empty() {
        return Err(Invalid::new(field, "an empty pattern matches any output")
            .hint("give a line your program prints only when it finished, e.g. `\"^training finished\"`"));
    }
    Ok(())
}

/// `launch.env`'s names are variable names; `launch.cwd` is not empty.
fn check_env_and_cwd(launch: &Launch) -> Checked {
    for name in launch.env.keys() {
        let ok = !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            return Err(Invalid::new(
                format!("launch.env.{name}"),
                format!("`{name}` is not a variable name"),
            )
            .hint("a name is letters, digits and `_`, not starting with a digit, e.g. `\"OMP_NUM_THREADS\": \"1\"`"));
        }
    }
    if launch.cwd.as_deref().is_some_and(|c| c.trim().is_empty()) {
        return Err(Invalid::new("launch.cwd", "is empty")
            .hint("give a folder, e.g. `\"{scenario_dir}\"`, or remove `cwd` to run where ups-doctor runs"));
    }
    Ok(())
}

/// The argv, its placeholders and the params.
fn check_command(s: &Scenario) -> Checked {
    let argv = s.command.as_deref().unwrap_or_default();
    if argv.is_empty() {
        return Err(Invalid::new("command", "the command is empty")
            .hint("give the program and its arguments as a list, e.g. `[\"python\", \"train.py\"]`"));
    }
    if argv[0].trim().is_empty() {
        return Err(Invalid::new("command[0]", "the program name is empty").hint(
            "name the program first, e.g. `\"python\"` or `\"torchrun\"` (found on `PATH`) or a path",
        ));
    }
    for (name, param) in &s.params {
        check_param(name, param)?;
    }
    let mut known: Vec<String> = s.params.keys().cloned().collect();
    known.extend(BUILTIN_PLACEHOLDERS.iter().map(|b| b.to_string()));
    for (index, name) in command::placeholders(argv) {
        if known.contains(&name) {
            continue;
        }
        let field = format!("command[{index}]");
        let arg = &argv[index];
        let hint = if arg.contains(&format!("${{{name}}}")) {
            format!(
                "the command is not run by a shell, so no environment variable is expanded: declare `{name}` in `params`, or write the value itself"
            )
        } else if let Some(close) = suggest::closest(&name, &known) {
            format!("did you mean `{{{close}}}`?")
        } else {
            format!(
                "declare it in `params` (e.g. `\"params\": {{\"{name}\": 4}}`), or write `{{{{{name}}}}}` for a literal `{{{name}}}`; built-in placeholders are {}",
                suggest::list(&BUILTIN_PLACEHOLDERS.map(|b| format!("{{{b}}}")))
            )
        };
        return Err(Invalid::new(field, format!("unknown placeholder `{{{name}}}` in `{arg}`")).hint(hint));
    }
    for (index, name) in command::placeholders(argv) {
        let alone = matches!(command::pieces(&argv[index]).as_slice(), [command::Piece::Placeholder { .. }]);
        if !alone && s.params.get(&name).is_some_and(|p| p.words) {
            return Err(Invalid::new(
                format!("command[{index}]"),
                format!("`{{{name}}}` stands for separate arguments (`words`), so it cannot be part of `{}`", argv[index]),
            )
            .hint(format!("give `{{{name}}}` an argument of its own, e.g. `\"--{}\", \"{{{name}}}\"`, or remove `words` to join the list with commas", name.replace('_', "-"))));
        }
    }
    let used: Vec<String> = command::placeholders(argv).into_iter().map(|(_, n)| n).collect();
    if let Some(name) = s.params.keys().find(|n| !used.contains(n)) {
        let mut invalid = Invalid::new(
            format!("params.{name}"),
            format!("param `{name}` is not used: no `{{{name}}}` in `command`"),
        )
        .hint(format!(
            "pass it to the program, e.g. `\"--{}\", \"{{{name}}}\"` in `command`, or remove the param",
            name.replace('_', "-")
        ));
        invalid.at_key = true;
        return Err(invalid);
    }
    Ok(())
}

/// A param's name, and its `min` and `cuts` against its value.
fn check_param(name: &str, param: &Param) -> Checked {
    let field = format!("params.{name}");
    if !command::is_identifier(name) {
        let what = if name.is_empty() { "an empty key".to_string() } else { format!("`{name}`") };
        let mut invalid = Invalid::new(field, format!("{what} cannot be a placeholder name"))
            .hint("use letters, digits and `_`, starting with a letter or `_` (e.g. `pin_memory`)");
        invalid.at_key = true;
        return Err(invalid);
    }
    if BUILTIN_PLACEHOLDERS.contains(&name) {
        let mut invalid = Invalid::new(field, format!("`{{{name}}}` is a built-in placeholder"))
            .hint("give the param another name");
        invalid.at_key = true;
        return Err(invalid);
    }
    if param.words && !matches!(param.value, ParamValue::List(_)) {
        return Err(Invalid::new(
            format!("{field}.words"),
            format!(
                "`words` writes a list as separate arguments, but the value `{}` is {}",
                param.value,
                param.value.kind()
            ),
        )
        .hint("give the value as a list of numbers, e.g. `[0, 1]`, or remove `words`"));
    }
    if param.min.is_some() && param.cuts.is_some() {
        return Err(Invalid::new(format!("{field}.min"), "a param has either `min` or `cuts`, not both")
            .hint("keep `cuts` to list every value bisect may try, or `min` to let it halve down to that"));
    }
    if let Some(min) = param.min {
        let at = format!("{field}.min");
        match &param.value {
            ParamValue::Int(value) => {
                if min.fract() != 0.0 || !min.is_finite() {
                    return Err(Invalid::new(
                        at,
                        format!("`min` of an integer param must be an integer, found `{min}`"),
                    )
                    .hint(format!("e.g. `\"min\": {}`", min.floor().max(0.0))));
                }
                if min > *value as f64 {
                    return Err(Invalid::new(at, format!("`min` {min} is above the value {value}"))
                        .hint(format!("use a `min` of at most {value}")));
                }
            }
            ParamValue::Float(value) => {
                if !min.is_finite() || min > *value {
                    return Err(Invalid::new(at, format!("`min` {min} is above the value {value}"))
                        .hint(format!("use a `min` of at most {value}")));
                }
            }
            ParamValue::List(items) => {
                if min.fract() != 0.0 || !(0.0..=items.len() as f64).contains(&min) {
                    return Err(Invalid::new(
                        at,
                        format!("`min` of a list param is the fewest items to keep: an integer from 0 to {}, found `{min}`", items.len()),
                    )
                    .hint("e.g. `\"min\": 1`"));
                }
            }
            other => {
                return Err(Invalid::new(
                    at,
                    format!("`min` applies to numbers and lists, not to {}", other.kind()),
                )
                .hint(match other {
                    ParamValue::Bool(_) => "remove `min`: bisect cuts a boolean by switching it off",
                    _ => "remove `min`, or list the values bisect may try in `cuts`",
                }));
            }
        }
    }
    if let Some(cuts) = &param.cuts {
        let at = format!("{field}.cuts");
        if matches!(param.value, ParamValue::Bool(_)) {
            return Err(Invalid::new(at, "a boolean param has no `cuts`: bisect switches it off")
                .hint("remove `cuts`"));
        }
        if cuts.is_empty() {
            return Err(Invalid::new(at, "an empty list of cuts gives bisect nothing to try")
                .hint("list the values to try in order, e.g. `[8, 4, 1, 0]`, or remove `cuts`"));
        }
        for (index, cut) in cuts.iter().enumerate() {
            let fits = matches!(
                (&param.value, cut),
                (ParamValue::Int(_), ParamValue::Int(_))
                    | (ParamValue::Float(_), ParamValue::Float(_) | ParamValue::Int(_))
                    | (ParamValue::Text(_), ParamValue::Text(_))
                    | (ParamValue::List(_), ParamValue::List(_))
            );
            if !fits {
                return Err(Invalid::new(
                    format!("{at}[{index}]"),
                    format!(
                        "`{cut}` is {}, but the param's value `{}` is {}",
                        cut.kind(),
                        param.value,
                        param.value.kind()
                    ),
                )
                .hint(format!("give every cut as {}", param.value.kind())));
            }
        }
    }
    Ok(())
}

/// The name a unit enum variant has in scenario files (`ddp`).
fn json_name<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(name)) => name,
        Ok(other) => other.to_string(),
        Err(_) => String::from("?"),
    }
}

/// Schema values that later work implements. They are refused rather than ignored, so a
/// scenario never silently runs something other than what it says. Each check names the issue
/// that lifts it: delete its lines when that work lands.
pub(crate) fn not_supported_yet(_s: &Scenario) -> Checked {
    // Issue #6 lifted the last refusals (`launch.device: cuda`, `train.amp`): whether a GPU is
    // really there is a fact of the machine, checked before launch (`ups-doctor run`) and by
    // each rank, not a property of the file.
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::scenario::FaultKind;

    fn fault(phase: &str, step: u64) -> Fault {
        Fault {
            fault: FaultKind::Segv,
            phase: phase.to_string(),
            step,
            rank: None,
            when: BTreeMap::new(),
            probability: 1.0,
            size: None,
        }
    }

    /// The field a scenario changed by `edit` is blamed on, with the message.
    fn problem(edit: impl FnOnce(&mut Scenario)) -> (String, String) {
        let mut s = Scenario::default();
        edit(&mut s);
        let invalid = check(&s).expect_err("the scenario should be invalid");
        (invalid.field, invalid.message)
    }

    fn field(edit: impl FnOnce(&mut Scenario)) -> String {
        problem(edit).0
    }

    #[test]
    fn the_default_scenario_is_valid() {
        assert_eq!(check(&Scenario::default()), Ok(()));
    }

    #[test]
    fn model_depths_must_be_non_empty_with_blocks_in_every_stage() {
        assert_eq!(field(|s| s.model.depths.clear()), "model.depths");
        assert_eq!(
            problem(|s| s.model.depths = vec![2, 0]),
            ("model.depths[1]".into(), "stage 1 has 0 blocks".into())
        );
    }

    #[test]
    fn model_widths_must_be_positive_and_divisible() {
        assert_eq!(field(|s| s.model.hidden = 0), "model.hidden");
        assert_eq!(field(|s| s.model.heads = 0), "model.heads");
        let mut s = Scenario::default();
        s.model.hidden = 60;
        s.model.heads = 8;
        let invalid = check(&s).unwrap_err();
        assert_eq!(invalid.message, "`hidden` 60 is not divisible by `heads` 8");
        assert_eq!(
            invalid.hint.as_deref(),
            Some("use `hidden` 56 or 64 (multiples of `heads` 8), or a `heads` that divides 60")
        );
        assert_eq!(invalid.related, ["model.heads"]);
        assert_eq!(field(|s| s.model.mlp_ratio = 0), "model.mlp_ratio");
    }

    #[test]
    fn latent_tokens_must_divide_the_grid_and_bound_the_window() {
        assert_eq!(field(|s| s.model.latent_tokens = 0), "model.latent_tokens");
        let mut s = Scenario::default();
        s.model.latent_tokens = 12;
        let invalid = check(&s).unwrap_err();
        assert_eq!(invalid.message, "`data.grid` 128 is not divisible by `latent_tokens` 12");
        assert_eq!(invalid.hint.as_deref(), Some("use a divisor of 128 such as 8 or 16"));
        assert_eq!(
            problem(|s| s.model.window = 17),
            ("model.window".into(), "`window` 17 is larger than `latent_tokens` 16".into())
        );
        assert_eq!(
            check(&Scenario { model: Model { window: 16, ..Model::default() }, ..Scenario::default() }),
            Ok(())
        );
    }

    #[test]
    fn data_sizes_must_be_in_range() {
        assert_eq!(field(|s| s.data.samples = 0), "data.samples");
        assert_eq!(field(|s| s.data.grid = 6), "data.grid");
        assert_eq!(field(|s| s.data.grid = 127), "data.grid");
        assert_eq!(field(|s| s.data.timesteps = 1), "data.timesteps");
        assert_eq!(field(|s| s.data.queries = 0), "data.queries");
        assert_eq!(field(|s| s.data.augment_passes = 1025), "data.augment_passes");
        assert_eq!(
            problem(|s| s.data.queries = 129),
            ("data.queries".into(), "129 queries are more than the 128 points of `grid`".into())
        );
        assert_eq!(field(|s| s.data.batch_size = 0), "data.batch_size");
        assert_eq!(field(|s| s.data.prefetch = 0), "data.prefetch");
    }

    #[test]
    fn training_and_limits_must_be_positive_and_finite() {
        assert_eq!(field(|s| s.train.steps = 0), "train.steps");
        assert_eq!(field(|s| s.train.lr = 0.0), "train.lr");
        assert_eq!(field(|s| s.train.lr = f64::NAN), "train.lr");
        assert_eq!(field(|s| s.train.weight_decay = -0.1), "train.weight_decay");
        assert_eq!(field(|s| s.train.weight_decay = f64::INFINITY), "train.weight_decay");
        assert_eq!(field(|s| s.train.accum_steps = 0), "train.accum_steps");
        assert_eq!(field(|s| s.limits.timeout_s = 0.0), "limits.timeout_s");
        assert_eq!(field(|s| s.limits.hang_after_s = f64::INFINITY), "limits.hang_after_s");
        let mut s = Scenario::default();
        s.train.weight_decay = 0.0;
        assert_eq!(check(&s), Ok(()));
    }

    #[test]
    fn the_ranks_divide_over_the_nodes() {
        let ddp = |s: &mut Scenario| {
            s.launch.mode = Mode::Ddp;
            s.launch.world_size = 4;
        };
        assert_eq!(field(|s| s.launch.nodes = 0), "launch.nodes");
        assert_eq!(
            problem(|s| {
                ddp(s);
                s.launch.nodes = 3;
            }),
            (
                "launch.nodes".into(),
                "4 ranks do not divide over 3 nodes: every node runs `world_size / nodes` ranks".into()
            )
        );
        let mut s = Scenario::default();
        ddp(&mut s);
        s.launch.nodes = 2;
        assert_eq!(check(&s), Ok(()));
    }

    #[test]
    fn single_mode_needs_exactly_one_rank() {
        assert_eq!(field(|s| s.launch.world_size = 0), "launch.world_size");
        assert_eq!(
            problem(|s| s.launch.world_size = 2),
            ("launch.world_size".into(), "`mode: single` runs one rank, but `world_size` is 2".into())
        );
    }

    #[test]
    fn expected_signal_must_be_known_and_go_with_signaled() {
        let mut s = Scenario::default();
        s.expect.outcome = OutcomeKind::Signaled;
        s.expect.signal = Some("SIGSEG".into());
        let invalid = check(&s).unwrap_err();
        assert_eq!(
            (invalid.field.as_str(), invalid.hint.as_deref()),
            ("expect.signal", Some("did you mean `SIGSEGV`?"))
        );
        s.expect.signal = Some("segv".into());
        assert_eq!(check(&s), Ok(()));
        s.expect.outcome = OutcomeKind::Exited;
        assert_eq!(check(&s).unwrap_err().related, ["expect.outcome"]);
    }

    #[test]
    fn expected_exit_code_goes_with_exited() {
        let mut s = Scenario::default();
        s.expect.exit_code = Some(1);
        assert_eq!(check(&s).unwrap_err().field, "expect.exit_code");
        s.expect.outcome = OutcomeKind::Exited;
        assert_eq!(check(&s), Ok(()));
    }

    #[test]
    fn fault_phases_must_be_known() {
        for ok in ["forward", "data.next", "start", "model.build", "model.build/encoder"] {
            let mut s = Scenario::default();
            s.inject.push(fault(ok, 0));
            assert_eq!(check(&s), Ok(()), "{ok}");
        }
        let mut s = Scenario { inject: vec![fault("forward", 0), fault("forwad", 0)], ..Scenario::default() };
        let invalid = check(&s).unwrap_err();
        assert_eq!(invalid.field, "inject[1].phase");
        assert_eq!(invalid.hint.as_deref(), Some("did you mean `forward`?"));
        s.inject = vec![fault("model.build/", 0)];
        assert_eq!(check(&s).unwrap_err().field, "inject[0].phase");
    }

    #[test]
    fn per_step_faults_must_fire_within_the_run() {
        let mut s = Scenario::default();
        s.train.steps = 60;
        s.inject.push(fault("backward", 60));
        let invalid = check(&s).unwrap_err();
        assert_eq!(invalid.field, "inject[0].step");
        assert_eq!(invalid.message, "step 60 never runs: `train.steps` is 60 and steps count from 0");
        // One-off phases ignore the step.
        s.inject = vec![fault("start", 60)];
        assert_eq!(check(&s), Ok(()));
    }

    #[test]
    fn fault_rank_must_exist() {
        let mut s = Scenario::default();
        s.inject.push(Fault { rank: Some(1), ..fault("forward", 0) });
        let invalid = check(&s).unwrap_err();
        assert_eq!(invalid.field, "inject[0].rank");
        assert_eq!(invalid.related, ["launch.world_size"]);
    }

    #[test]
    fn when_keys_must_be_scenario_fields() {
        let mut s = Scenario::default();
        let mut f = fault("forward", 0);
        f.when.insert("model.conditionin".into(), json!(true));
        s.inject.push(f);
        let invalid = check(&s).unwrap_err();
        assert_eq!(invalid.field, "inject[0].when.model.conditionin");
        assert!(invalid.at_key);
        assert_eq!(invalid.hint.as_deref(), Some("did you mean `model.conditioning`?"));

        s.inject[0].when = BTreeMap::from([("workers".to_string(), json!(0))]);
        assert_eq!(check(&s).unwrap_err().hint.as_deref(), Some("did you mean `data.workers`?"));
        s.inject[0].when = BTreeMap::from([("model".to_string(), json!({}))]);
        assert_eq!(check(&s).unwrap_err().message, "`model` is a section, not a field");
    }

    #[test]
    fn when_values_must_be_possible_values_of_the_field() {
        let mut s = Scenario::default();
        let mut f = fault("forward", 0);
        f.when.insert("launch.mode".into(), json!(["single", "dpp"]));
        s.inject.push(f);
        let invalid = check(&s).unwrap_err();
        assert_eq!(invalid.message, "`launch.mode` can never be `\"dpp\"`: unknown value `dpp`");
        assert_eq!(
            invalid.hint.as_deref(),
            Some("did you mean `ddp`? `launch.mode` is one of `single`, `ddp`, `fsdp`")
        );

        for ok in [json!("single"), json!(["single", "ddp"])] {
            s.inject[0].when = BTreeMap::from([("launch.mode".to_string(), ok.clone())]);
            assert_eq!(check(&s), Ok(()), "{ok}");
        }
        s.inject[0].when = BTreeMap::from([("launch.mode".to_string(), json!(null))]);
        assert!(check(&s).is_err());
        s.inject[0].when = BTreeMap::from([("data.shm_size".to_string(), json!(null))]);
        assert_eq!(check(&s), Ok(()));
        s.inject[0].when = BTreeMap::from([("model.depths".to_string(), json!([[1, 1], [2]]))]);
        assert_eq!(check(&s), Ok(()));
        s.inject[0].when = BTreeMap::from([("data.workers".to_string(), json!([]))]);
        assert_eq!(check(&s).unwrap_err().message, "an empty list of values never matches");
        s.inject[0].when = BTreeMap::from([("data.workers".to_string(), json!("2"))]);
        assert_eq!(check(&s).unwrap_err().hint.as_deref(), Some("write `2` without quotes"));
    }

    #[test]
    fn shm_size_must_be_a_docker_style_size() {
        for ok in ["64m", "1g", "67108864", "8M"] {
            let mut s = Scenario::default();
            s.data.shm_size = Some(ok.into());
            assert_eq!(check(&s), Ok(()), "{ok}");
        }
        let mut s = Scenario::default();
        s.data.shm_size = Some("64 megs".into());
        let invalid = check(&s).unwrap_err();
        assert_eq!(invalid.field, "data.shm_size");
        assert_eq!(invalid.message, "unknown unit `megs` in `64 megs`");
        assert!(invalid.hint.unwrap().contains("`\"64m\"`"));
    }

    #[test]
    fn fault_size_is_for_leak_shm_only() {
        let mut s = Scenario::default();
        s.inject.push(Fault { fault: FaultKind::LeakShm, size: Some("16m".into()), ..fault("start", 0) });
        assert_eq!(check(&s), Ok(()));
        s.inject[0].size = Some("lots".into());
        assert_eq!(check(&s).unwrap_err().field, "inject[0].size");
        s.inject[0] = Fault { size: Some("16m".into()), ..fault("start", 0) };
        assert_eq!(check(&s).unwrap_err().message, "`size` applies only to `leak_shm`, not `segv`");
    }

    #[test]
    fn ddp_over_tcp_is_accepted() {
        let mut s = Scenario::default();
        s.launch.mode = Mode::Ddp;
        s.launch.world_size = 2;
        s.launch.backend = Backend::Tcp;
        assert_eq!(check(&s), Ok(()));
    }

    #[test]
    fn nccl_on_cpu_ranks_is_refused_naming_the_backend_and_the_fix() {
        let mut s = Scenario::default();
        s.launch.mode = Mode::Ddp;
        s.launch.world_size = 2;
        s.launch.backend = Backend::Nccl;
        s.launch.device = Device::Cpu;
        let invalid = check(&s).unwrap_err();
        assert_eq!(invalid.field, "launch.backend");
        assert_eq!(
            invalid.message,
            "`nccl` needs CUDA tensors, but `device` is `cpu`: NCCL cannot reduce CPU memory"
        );
        assert_eq!(
            invalid.hint.as_deref(),
            Some("use `backend: tcp` (or `auto`, which picks `tcp` for CPU ranks)")
        );
        assert_eq!(invalid.related, ["launch.device"]);
        // The device is decided on the machine (`auto`): the NCCL backend itself is no longer later work.
        s.launch.device = Device::Auto;
        assert_eq!(check(&s), Ok(()));
        assert_eq!(not_supported_yet(&s), Ok(()));
    }

    #[test]
    fn cuda_ranks_and_amp_are_accepted_in_files() {
        let mut s = Scenario::default();
        s.launch.device = Device::Cuda;
        s.train.amp = true;
        assert_eq!(check(&s), Ok(()));
        // More ranks are refused only by `mode: single` (a plain rule), not as later work.
        s.launch.world_size = 2;
        assert_eq!(check(&s).unwrap_err().field, "launch.world_size");
        s.launch.mode = Mode::Ddp;
        assert_eq!(check(&s), Ok(()));
    }

    #[test]
    fn a_cuda_cache_needs_a_gpu_rank_and_the_memory_cache() {
        use crate::scenario::Cache;
        let mut s = Scenario::default();
        s.data.cache_device = CacheDevice::Cuda;
        assert_eq!(check(&s), Ok(()), "`device: auto` may have a GPU");
        s.launch.device = Device::Cpu;
        let invalid = check(&s).unwrap_err();
        assert_eq!(
            (invalid.field.as_str(), invalid.related.as_slice()),
            ("data.cache_device", &["launch.device".to_string()][..])
        );
        s.launch.device = Device::Cuda;
        s.data.cache = Cache::Shm;
        let invalid = check(&s).unwrap_err();
        assert_eq!(
            invalid.message,
            "`cuda` keeps the cache in GPU memory, but `cache: shm` keeps it in a host file"
        );
        assert_eq!(invalid.related, ["data.cache"]);
    }

    #[test]
    fn gpu_sampling_is_off_or_a_sensible_interval() {
        assert_eq!(check(&Scenario::default()), Ok(()));
        let mut s = Scenario::default();
        s.limits.gpu_sample_ms = 0;
        assert_eq!(check(&s), Ok(()));
        for bad in [1, 19, 60_001] {
            s.limits.gpu_sample_ms = bad;
            assert_eq!(check(&s).unwrap_err().field, "limits.gpu_sample_ms", "{bad}");
        }
    }

    #[test]
    fn loader_workers_caches_and_start_methods_are_accepted() {
        use crate::scenario::Cache;
        for cache in [Cache::Memory, Cache::Disk, Cache::Shm] {
            for method in [StartMethod::Fork, StartMethod::Spawn] {
                let mut s = Scenario::default();
                (s.data.workers, s.data.cache, s.data.start_method) = (2, cache, method);
                assert_eq!(check(&s), Ok(()), "{cache:?} {method:?}");
            }
        }
        assert_eq!(field(|s| s.data.workers = 65), "data.workers");
    }

    #[test]
    fn inherited_worker_threads_need_forked_workers() {
        let (field, message) = problem(|s| s.data.worker_threads = WorkerThreads::Inherit);
        assert_eq!(field, "data.worker_threads");
        assert!(message.contains("`workers` is 0"), "{message}");
        let spawn = problem(|s| {
            (s.data.workers, s.data.start_method, s.data.worker_threads) =
                (2, StartMethod::Spawn, WorkerThreads::Inherit)
        });
        assert!(spawn.1.contains("only matters with `start_method: fork`"), "{}", spawn.1);
        let mut s = Scenario::default();
        (s.data.workers, s.data.worker_threads) = (1, WorkerThreads::Inherit);
        assert_eq!(check(&s), Ok(()));
    }

    #[test]
    fn loader_faults_need_workers_and_a_phase_they_act_in() {
        let mut s = Scenario::default();
        s.inject.push(Fault { fault: FaultKind::WorkerKill, ..fault("data.next", 3) });
        let invalid = check(&s).unwrap_err();
        assert_eq!(
            (invalid.field.as_str(), invalid.related.as_slice()),
            ("inject[0].fault", &["data.workers".to_string()][..])
        );
        s.data.workers = 2;
        assert_eq!(check(&s), Ok(()));
        s.inject[0].phase = "forward".into();
        assert_eq!(
            check(&s).unwrap_err().message,
            "fault `worker_kill` acts in phase `data.next`, not `forward`"
        );
        s.inject = vec![fault("worker.batch", 2)];
        assert_eq!(check(&s), Ok(()));
        s.inject[0].fault = FaultKind::Nan;
        assert_eq!(
            check(&s).unwrap_err().message,
            "fault `nan` cannot happen in a worker (phase `worker.batch`)"
        );
        s.inject = vec![fault("worker.batch", 200)];
        assert_eq!(check(&s).unwrap_err().field, "inject[0].step");
        s.data.workers = 0;
        s.inject = vec![fault("worker.batch", 2)];
        assert!(check(&s).unwrap_err().message.contains("happens in data-loader workers"));
    }

    fn external(command: &[&str], params: serde_json::Value) -> Scenario {
        Scenario {
            command: Some(command.iter().map(|a| a.to_string()).collect()),
            params: serde_json::from_value(params).unwrap(),
            ..Scenario::default()
        }
    }

    /// The first problem of an external scenario, past the placeholder/param checks.
    fn external_problem(s: &Scenario) -> Invalid {
        check(s).unwrap_err()
    }

    #[test]
    fn a_command_with_used_params_passes_every_check() {
        let s = external(
            &[
                "python",
                "{scenario_dir}/train.py",
                "--workers={workers}",
                "--depths",
                "{depths}",
                "--nproc={world_size}",
            ],
            json!({"workers": {"value": 8, "cuts": [8, 4, 1, 0]}, "depths": {"value": [2, 2], "min": 1}}),
        );
        assert_eq!(check(&s), Ok(()));
    }

    #[test]
    fn unknown_placeholders_are_named_with_a_fix() {
        let s = external(&["python", "train.py", "--workers", "{wokers}"], json!({"workers": 2}));
        let invalid = external_problem(&s);
        assert_eq!(invalid.field, "command[3]");
        assert_eq!(invalid.message, "unknown placeholder `{wokers}` in `{wokers}`");
        assert_eq!(invalid.hint.as_deref(), Some("did you mean `{workers}`?"));
        let s = external(&["python", "${HOME}/train.py"], json!({}));
        assert!(external_problem(&s).hint.unwrap().contains("no environment variable is expanded"));
        let s = external(&["python", "train.py", "{{literal}}"], json!({}));
        assert_eq!(check(&s), Ok(()));
    }

    #[test]
    fn declared_params_must_be_used() {
        let s = external(&["python", "train.py"], json!({"pin_memory": true}));
        let invalid = external_problem(&s);
        assert_eq!((invalid.field.as_str(), invalid.at_key), ("params.pin_memory", true));
        assert_eq!(invalid.message, "param `pin_memory` is not used: no `{pin_memory}` in `command`");
        assert!(invalid.hint.unwrap().contains("`\"--pin-memory\", \"{pin_memory}\"`"));
    }

    #[test]
    fn param_names_min_and_cuts_are_checked_against_the_value() {
        let cases = [
            (json!({"a-b": 1}), "params.a-b", "`a-b` cannot be a placeholder name"),
            (json!({"world_size": 1}), "params.world_size", "`{world_size}` is a built-in placeholder"),
            (json!({"w": {"value": 4, "min": 5}}), "params.w.min", "`min` 5 is above the value 4"),
            (
                json!({"w": {"value": 4, "min": 0.5}}),
                "params.w.min",
                "`min` of an integer param must be an integer, found `0.5`",
            ),
            (
                json!({"w": {"value": true, "min": 0}}),
                "params.w.min",
                "`min` applies to numbers and lists, not to a boolean",
            ),
            (
                json!({"w": {"value": [1, 2], "min": 3}}),
                "params.w.min",
                "`min` of a list param is the fewest items to keep: an integer from 0 to 2, found `3`",
            ),
            (
                json!({"w": {"value": 4, "min": 0, "cuts": [0]}}),
                "params.w.min",
                "a param has either `min` or `cuts`, not both",
            ),
            (
                json!({"w": {"value": 8, "cuts": [4, "1"]}}),
                "params.w.cuts[1]",
                "`\"1\"` is a string, but the param's value `8` is an integer",
            ),
            (
                json!({"w": {"value": 8, "cuts": []}}),
                "params.w.cuts",
                "an empty list of cuts gives bisect nothing to try",
            ),
            (
                json!({"w": {"value": false, "cuts": [true]}}),
                "params.w.cuts",
                "a boolean param has no `cuts`: bisect switches it off",
            ),
            (
                json!({"w": {"value": 4, "words": true}}),
                "params.w.words",
                "`words` writes a list as separate arguments, but the value `4` is an integer",
            ),
        ];
        for (params, field, message) in cases {
            let name = params.as_object().unwrap().keys().next().unwrap().clone();
            let s = external(&["python", "train.py", &format!("{{{name}}}")], params);
            let invalid = external_problem(&s);
            assert_eq!((invalid.field.as_str(), invalid.message.as_str()), (field, message));
        }
        let s = external(&["python", "{lr}"], json!({"lr": {"value": 0.5, "cuts": [0.1, 0]}}));
        assert_eq!(check(&s), Ok(()), "integer cuts of a float param are numbers");
        // A list written as separate words is an argument of its own.
        let gpus = json!({"gpus": {"value": [0, 1], "words": true}});
        assert_eq!(check(&external(&["python", "t.py", "--gpus", "{gpus}"], gpus.clone())), Ok(()));
        let invalid = external_problem(&external(&["python", "t.py", "--gpus={gpus}"], gpus));
        assert_eq!(
            (invalid.field.as_str(), invalid.message.as_str()),
            (
                "command[2]",
                "`{gpus}` stands for separate arguments (`words`), so it cannot be part of `--gpus={gpus}`"
            )
        );
        assert!(invalid.hint.unwrap().contains("`\"--gpus\", \"{gpus}\"`"));
    }

    #[test]
    fn the_built_in_trainers_fields_are_refused_with_a_command() {
        type Edit = Box<dyn Fn(&mut Scenario)>;
        let edits: Vec<(&str, Edit)> = vec![
            ("model.depths", Box::new(|s| s.model.depths = vec![2])),
            ("data.workers", Box::new(|s| s.data.workers = 2)),
            ("train.steps", Box::new(|s| s.train.steps = 5)),
            ("launch.mode", Box::new(|s| s.launch.mode = Mode::Ddp)),
            ("launch.backend", Box::new(|s| s.launch.backend = Backend::Tcp)),
            ("inject", Box::new(|s| s.inject.push(fault("forward", 0)))),
        ];
        for (field, edit) in edits {
            let mut s = external(&["python", "train.py"], json!({}));
            edit(&mut s);
            assert_eq!(external_problem(&s).field, field);
        }
        // The private /dev/shm and several ranks work for any program.
        let mut s = external(&["python", "train.py"], json!({}));
        s.data.shm_size = Some("16m".into());
        s.launch.world_size = 2;
        assert_eq!(check(&s), Ok(()));
        s.command = Some(vec![]);
        assert_eq!(check(&s).unwrap_err().field, "command");
        s.command = Some(vec![" ".into()]);
        assert_eq!(check(&s).unwrap_err().field, "command[0]");
    }

    #[test]
    fn command_fields_without_a_command_are_refused() {
        use crate::scenario::{CompletesWhen, LaunchStyle};
        let s = Scenario { params: serde_json::from_value(json!({"x": 1})).unwrap(), ..Scenario::default() };
        assert_eq!(check(&s).unwrap_err().field, "params.x");
        let mut s = Scenario::default();
        s.launch.style = LaunchStyle::Launcher;
        assert_eq!(check(&s).unwrap_err().field, "launch.style");
        let mut s = Scenario::default();
        s.expect.completes_when = Some(CompletesWhen::Done);
        assert_eq!(check(&s).unwrap_err().field, "expect.completes_when");
    }

    #[test]
    fn completes_when_stdout_must_be_a_regular_expression() {
        use crate::scenario::CompletesWhen;
        let mut s = external(&["python", "train.py"], json!({}));
        s.expect.completes_when = Some(CompletesWhen::Stdout("finished (".into()));
        let invalid = external_problem(&s);
        assert_eq!(invalid.field, "expect.completes_when.stdout");
        assert!(
            invalid.message.starts_with("`finished (` is not a regular expression: "),
            "{}",
            invalid.message
        );
        s.expect.completes_when = Some(CompletesWhen::Stdout("^finished \\d+ steps".into()));
        assert_eq!(check(&s), Ok(()));
    }
}
