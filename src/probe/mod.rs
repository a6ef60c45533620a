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
