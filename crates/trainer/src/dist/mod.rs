//! Distributed plumbing for rank processes: rendezvous through libtorch's own `c10d::TCPStore`
//! ([`store`]), the [`Collective`] trait every backend implements ([`collective`]), the CPU
//! `tcp` backend with ring algorithms written here ([`tcp`]), the CUDA `nccl` backend over NCCL
//! ([`nccl`]), and which of the two a rank uses ([`resolve`]).
//!
//! Theory of operation: rank 0 hosts a [`Store`] on `MASTER_ADDR:MASTER_PORT` and every rank
//! connects to it, exactly as torchrun-launched PyTorch ranks do, so ranks can be launched by the
//! harness, torchrun or Slurm alike. [`connect_tcp`] then has each rank listen on an ephemeral port,
//! publish that address in the store and connect to its ring neighbours; collectives run over those
//! sockets with bounded waits, and failures read like Gloo's (`Timed out waiting …ms for recv
//! operation to complete`, `Connection closed by peer […]:…`) so users can search for them.
//!
//! This module moves bytes between ranks and nothing else: it knows nothing of models, DDP or
//! FSDP (built on top of [`Collective`]), and it emits no markers; callers wrap its calls in the
//! phases they report.

pub mod collective;
pub mod nccl;
pub mod store;
pub mod tcp;

#[cfg(test)]
mod tests;

pub use collective::{Collective, Direction, DistError};
pub use nccl::connect_nccl;
pub use store::Store;
pub use tcp::connect_tcp;

use crate::scenario::Backend as Requested;

/// The collective backend a rank uses, once `launch.backend: auto` is resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// CPU tensors over TCP sockets ([`connect_tcp`]).
    Tcp,
    /// CUDA tensors over NCCL ([`connect_nccl`]).
    Nccl,
}

/// `auto` picks by the device the rank's tensors live on, as PyTorch's default process group
/// does: `nccl` for CUDA, `tcp` otherwise. An explicit choice is kept as it is: validation
/// refuses `nccl` with `device: cpu` when the scenario is loaded, and [`connect_nccl`] refuses
/// tensors that are not on the rank's GPU.
pub fn resolve(requested: Requested, device: tch::Device) -> Backend {
    match requested {
        Requested::Tcp => Backend::Tcp,
        Requested::Nccl => Backend::Nccl,
        Requested::Auto if device.is_cuda() => Backend::Nccl,
        Requested::Auto => Backend::Tcp,
    }
}
