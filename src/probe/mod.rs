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
    let mut env = env::collect();
    if needs.python {
        env.python = Some(env::probe_python().unwrap_or_else(|| crate::schema::PythonEnv {
            executable: String::new(),
            version: None,
            torch_version: None,
            start_method: None,
            problem: Some("none on PATH (neither python3 nor python)".into()),
        }));
    }
    let gpu = gpu_env::collect(needs.trainer.as_deref());
    if let Some(cuda) = &gpu.cuda {
        env.libtorch_version = cuda.libtorch_version.clone().unwrap_or_default();
        env.libtorch_lib = cuda.libtorch_lib.clone().unwrap_or_default();
    }
    env.gpu = Some(gpu);
    env
}
