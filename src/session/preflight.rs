//! Checks made before anything runs, from the invocation's one reading of the machine: a scenario
//! this machine cannot run is bad input (exit 2) naming the file and the field, not a failure
//! halfway through the run.

use std::path::Path;

use crate::Error;
use crate::harness::{self, ScenarioInput};
use crate::scenario;
use crate::schema::EnvSummary;

/// Scenarios that ask for CUDA ranks must find a GPU for each of them before anything runs
/// (unless `UPS_DOCTOR_FORCE_GPU` asks to launch anyway). The GPUs are the driver's, from the
/// invocation's one reading of the machine (NVML): `ups-doctor` never loads libtorch's CUDA.
pub fn check_gpus(inputs: &[ScenarioInput], machine: &EnvSummary) -> Result<(), Error> {
    let cuda: Vec<&ScenarioInput> =
        inputs.iter().filter(|i| i.scenario.launch.device == scenario::Device::Cuda).collect();
    if cuda.is_empty() || crate::protocol::gpu_forced() {
        return Ok(());
    }
    let gpu = machine.gpu.as_ref();
    let (gpus, why_not) = match gpu.and_then(|g| g.driver.as_ref()) {
        Some(driver) => (driver.gpus.len(), None),
        None => (0, gpu.and_then(|g| g.nvml_error.clone())),
    };
    let force = crate::protocol::FORCE_GPU_ENV;
    let errors: Vec<String> = cuda
        .iter()
        .filter_map(|i| {
            let file = i.file.display();
            let n = gpus;
            let ranks = i.scenario.launch.world_size as usize;
            if n == 0 {
                Some(format!(
                    "{file}: `launch.device`: `cuda`, but this machine has no GPU CUDA can use: {}\n  hint: use \
                     `device: auto` to train on the CPU where there is no GPU, or run it on a machine with an \
                     NVIDIA GPU ({force}=1 launches anyway, and each rank fails at start)",
                    why_not.as_deref().unwrap_or("the NVIDIA driver lists no GPU")
                ))
            } else if ranks > n {
                Some(format!(
                    "{file}: `launch.world_size`: {ranks} CUDA ranks, but this machine has {n} GPU{}: every CUDA \
                     rank needs a GPU of its own (NCCL refuses two ranks on one GPU)\n  hint: use `world_size: {n}` \
                     or fewer, or `device: cpu` ranks ({force}=1 launches anyway, ranks sharing GPUs, to see \
                     NCCL's own `Duplicate GPU detected` error)",
                    if n == 1 { "" } else { "s" }
                ))
            } else {
                None
            }
        })
        .collect();
    if errors.is_empty() { Ok(()) } else { Err(Error::BadInput(errors.join("\nerror: "))) }
}

/// A built-in scenario needs the trainer executable beside `ups-doctor` (or named by
/// `UPS_DOCTOR_TRAINER`): missing (an `ups-doctor` installed from its wheel or by `cargo install`
/// has none), it is said before anything runs: what the trainer is, that a user's own command does
/// not need it, and the one command that builds it.
pub fn check_trainer(inputs: &[ScenarioInput], doctor: &Path) -> Result<(), Error> {
    let Some(input) = inputs.iter().find(|i| i.scenario.command.is_none()) else { return Ok(()) };
    let trainer = harness::trainer_program(doctor);
    if crate::probe::run::is_executable(&trainer) {
        return Ok(());
    }
    Err(Error::BadInput(format!(
        "{}: a built-in scenario, and the built-in trainer `{}` is not there: {}",
        input.file.display(),
        trainer.display(),
        trainer_missing_hint()
    )))
}

/// What the built-in trainer is and how to get it, for every place that needs it and finds none.
pub fn trainer_missing_hint() -> String {
    format!(
        "the ranks of a built-in scenario (`scenarios/…`) run ups-doctor's own training core, the \
         `ups-doctor-trainer` executable (Rust and libtorch; the `ups-doctor` wheel and `cargo install` \
         carry only `ups-doctor`)\n  note: your own training command needs no trainer: `ups-doctor run -- \
         torchrun --nproc_per_node 2 train.py`\n  hint: build the trainer in a clone of ups-doctor with \
         `./x trainer` (installs libtorch 2.11.0 once, ~540 MB) and set the {}=PATH it prints \
         (a `cargo build` or `./x build` puts it beside its own target/debug/ups-doctor)",
        harness::TRAINER_ENV
    )
}
/// Scenarios with `launch.memory_limit` need a memory cgroup: one is made and removed before
/// anything runs, so a machine that cannot make one is bad input (exit 2) that names the field,
/// not a failure halfway through the run.
pub fn check_memory_limits(inputs: &[ScenarioInput]) -> Result<(), Error> {
    let errors: Vec<String> = inputs
        .iter()
        .filter_map(|i| {
            let limit = i.scenario.launch.memory_limit.as_ref()?;
            let bytes = scenario::parse_size(limit).ok()?;
            let why = harness::os::cgroup::check_memory_limit(bytes).err()?;
            let field = "launch.memory_limit";
            let at = match i.overrides.iter().rev().find(|o| o.starts_with(&format!("{field}="))) {
                Some(raw) => format!("{}: --set {raw}", i.file.display()),
                None => scenario::field_location(&i.file, field),
            };
            Some(format!(
                "{at}: `{field}`: cannot limit the scenario's memory to {limit} here: {why}\n  hint: a memory limit \
                 needs a cgroup ups-doctor can create: run as root where cgroup v1's memory controller is mounted, \
                 or in a cgroup v2 group delegated to you with the memory controller (`systemd-run --user --scope \
                 -p Delegate=yes ups-doctor run …`); or remove `memory_limit`"
            ))
        })
        .collect();
    if errors.is_empty() { Ok(()) } else { Err(Error::BadInput(errors.join("\nerror: "))) }
}
