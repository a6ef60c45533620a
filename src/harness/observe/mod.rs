//! What the harness observes of running processes, as plain data: per-rank state folded from
//! markers ([`state`]), captured output ([`capture`]) and the error lines worth quoting
//! ([`quotes`]), memory and `/dev/shm` samples ([`memory`]), GPU samples ([`gpu`]), OOM kills
//! ([`oom`]), and a launcher's own account of how its ranks ended ([`torchrun`], [`spawn`]). It decides nothing about teardown (that is
//! `run`'s) and sends no signal.

pub mod gpu;
pub mod memory;
pub mod oom;
pub mod quotes;
pub mod spawn;
pub mod state;
pub mod torchrun;
