//! Samplers and readers of machine state. `env` says what the machine is; `memory` reads a
//! process's memory and the process table from procfs; `shm` reads `/dev/shm`.
//! Probes observe; they never change what they observe (except [`shm::remove`], which the
//! harness calls on its own leftovers).

pub mod env;
pub mod memory;
pub mod shm;
