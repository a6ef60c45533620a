//! Samplers and readers of machine state. `env` says what the machine is; `memory` reads a
//! process's memory and the process table from procfs; `shm` reads `/dev/shm`; `nvml` reads the
//! GPUs through NVML, loaded at run time; `run` runs short helper programs with a time limit.
//! Probes observe; they never change what they observe (except [`shm::remove`], which the
//! harness calls on its own leftovers).

pub mod env;
pub mod gpu_env;
pub mod memory;
pub mod nvml;
pub mod run;
pub mod shm;

use std::path::PathBuf;

use crate::schema::EnvSummary;

/// The machine facts a command needs beyond [`env::collect`]'s, each of which costs a process.
#[derive(Debug, Clone, Default)]
pub struct Needs {
    /// The Python on `PATH` (a user's command runs it).
    pub python: bool,
    /// The trainer executable, for libtorch's own facts and CUDA (a built-in scenario runs it).
    pub trainer: Option<PathBuf>,
}

/// The machine once per invocation: [`env::collect`], NVML's GPUs, and what `needs` asks for.
pub fn machine(needs: &Needs) -> EnvSummary {
    let (mut env, pending) = machine_started(needs);
    pending.finish(&mut env);
    env
}

/// [`machine`] without waiting for the facts that take a process of their own: the Python on
/// `PATH` is asked on a thread while the run goes on; the trainer's libtorch and CUDA are asked by
/// [`Pending::finish`], after the first scenario ended (a libtorch process beside the ranks would
/// compete with them and sit in their process tree). What a pre-flight check needs (NVML's GPUs)
/// is here at once.
pub fn machine_started(needs: &Needs) -> (EnvSummary, Pending) {
    let mut env = env::collect();
    env.gpu = Some(gpu_env::collect(None));
    let python = needs
        .python
        .then(|| std::thread::Builder::new().name("machine-facts".into()).spawn(python_or_why).ok())
        .flatten();
    (env, Pending { python, trainer: needs.trainer.clone() })
}

/// The facts [`machine_started`] has not added yet.
pub struct Pending {
    python: Option<std::thread::JoinHandle<crate::schema::PythonEnv>>,
    trainer: Option<PathBuf>,
}

impl Pending {
    /// Waits for the Python facts, asks the trainer about libtorch and CUDA, and adds both to `env`.
    pub fn finish(self, env: &mut EnvSummary) {
        if let Some(python) = self.python.and_then(|h| h.join().ok()) {
            env.python = Some(python);
        }
        let Some(trainer) = self.trainer else { return };
        let gpu = env.gpu.get_or_insert_with(Default::default);
        match gpu_env::cuda_support(&trainer) {
            Ok(c) => {
                env.libtorch_version = c.libtorch_version.clone().unwrap_or_default();
                env.libtorch_lib = c.libtorch_lib.clone().unwrap_or_default();
                gpu.cuda = Some(c);
            }
            Err(e) => gpu.cuda_error = Some(e.to_string()),
        }
    }
}

/// The Python on `PATH`, or why there is none.
fn python_or_why() -> crate::schema::PythonEnv {
    env::probe_python().unwrap_or_else(|| crate::schema::PythonEnv {
        executable: String::new(),
        version: None,
        torch_version: None,
        start_method: None,
        problem: Some("none on PATH (neither python3 nor python)".into()),
    })
}
