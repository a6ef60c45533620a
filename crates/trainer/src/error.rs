//! Why a rank's training stopped early: one error type that the loop, DDP, FSDP, the collectives,
//! checkpoints and the data loader all return, so none of them imports the training loop.

use crate::checkpoint;
use crate::dist::DistError;
use crate::loader::LoaderError;

/// Why training stopped early. Each becomes an `error` marker and exit status 1.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("injected failure: fault `exit_error` at phase `{phase}` step {step}")]
    Injected { phase: String, step: u64 },
    #[error("loss became non-finite ({loss}) at step {step}; training cannot recover from this")]
    NonFiniteLoss { step: u64, loss: f64 },
    #[error("bad rank environment: {0}")]
    Environment(String),
    #[error("{0}")]
    Unsupported(String),
    #[error(transparent)]
    Device(#[from] crate::device::DeviceError),
    #[error("libtorch error: {0}")]
    Torch(#[from] tch::TchError),
    #[error("{0}")]
    Dist(#[from] DistError),
    #[error("{0}")]
    Ddp(String),
    #[error("{0}")]
    Checkpoint(#[from] checkpoint::CheckpointError),
    #[error("{0}")]
    Loader(#[from] LoaderError),
}
