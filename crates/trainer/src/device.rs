//! Which device a rank trains on: `launch.device` against what CUDA offers on this machine.
//!
//! Each rank uses the GPU of its `LOCAL_RANK`, as torchrun-launched PyTorch scripts do with
//! `torch.cuda.set_device(local_rank)`. `auto` takes the GPUs only when every rank of this
//! machine (`LOCAL_WORLD_SIZE`) gets one of its own, so that all ranks agree without talking;
//! otherwise it trains on the CPU. `cuda` where CUDA is unusable, or with more ranks than GPUs,
//! is an error that says why. With [`FORCE_GPU_ENV`] set, ranks beyond the GPU count share GPUs
//! (`LOCAL_RANK mod GPUs`, like a script that picks `cuda:{rank % n}`), which NCCL refuses with
//! its `Duplicate GPU detected` error: the reproduction of that mistake.

use tch::Device;

use crate::scenario::Device as Requested;

pub use crate::protocol::{FORCE_GPU_ENV, gpu_forced as forced};

/// What CUDA offers, as the rank sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpus {
    pub count: usize,
    /// Why there is none, when `count` is 0.
    pub why_not: Option<String>,
}

/// Why a rank cannot have the device `launch.device` asks for; the message ends with a hint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// `cuda` where CUDA is unusable; `why` as [`Gpus::why_not`] says it.
    #[error(
        "`launch.device` is `cuda`, but this rank cannot use CUDA: {}\nhint: use `device: auto` to train on the CPU \
         where there is no GPU, or run on a machine with an NVIDIA GPU and driver",
        why.as_deref().unwrap_or("CUDA sees no GPU")
    )]
    NoCuda { why: Option<String> },
    /// `cuda` for a rank whose GPU (`cuda:{rank}`) is beyond the `gpus` CUDA sees.
    #[error(
        "`launch.device` is `cuda` and this rank's GPU is cuda:{rank} (LOCAL_RANK={rank}), but CUDA sees {}: every \
         CUDA rank needs a GPU of its own (NCCL refuses two ranks on one GPU)\nhint: run at most {gpus} CUDA {} on \
         this machine, or set {FORCE_GPU_ENV}=1 to make ranks share GPUs and see NCCL's own error",
        if *gpus == 1 { "1 GPU".to_string() } else { format!("{gpus} GPUs") },
        if *gpus == 1 { "rank" } else { "ranks" }
    )]
    TooFewGpus { rank: usize, gpus: usize },
}

/// The device for a rank with `local_rank` of `local_world` ranks on this machine.
pub fn choose(
    requested: Requested,
    gpus: &Gpus,
    local_rank: u32,
    local_world: u32,
    force: bool,
) -> Result<Device, DeviceError> {
    let (rank, n) = (local_rank as usize, gpus.count);
    match requested {
        Requested::Cpu => Ok(Device::Cpu),
        Requested::Auto if n > 0 && (n >= local_world as usize || force) => Ok(Device::Cuda(rank % n)),
        Requested::Auto => Ok(Device::Cpu),
        Requested::Cuda if n == 0 => Err(DeviceError::NoCuda { why: gpus.why_not.clone() }),
        Requested::Cuda if rank >= n && !force => Err(DeviceError::TooFewGpus { rank, gpus: n }),
        Requested::Cuda => Ok(Device::Cuda(rank % n)),
    }
}

/// `cpu` or `cuda:N`, as PyTorch prints devices.
pub fn name(device: Device) -> String {
    match device {
        Device::Cuda(i) => format!("cuda:{i}"),
        Device::Cpu => "cpu".to_string(),
        other => format!("{other:?}").to_lowercase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(count: usize) -> Gpus {
        Gpus { count, why_not: (count == 0).then(|| "there is no NVIDIA driver".to_string()) }
    }

    #[test]
    fn auto_takes_the_gpus_only_when_every_local_rank_gets_one() {
        assert_eq!(choose(Requested::Auto, &gpus(0), 0, 1, false), Ok(Device::Cpu));
        assert_eq!(choose(Requested::Auto, &gpus(1), 0, 1, false), Ok(Device::Cuda(0)));
        assert_eq!(choose(Requested::Auto, &gpus(2), 1, 2, false), Ok(Device::Cuda(1)));
        // Two ranks, one GPU: both train on the CPU rather than one each.
        assert_eq!(choose(Requested::Auto, &gpus(1), 0, 2, false), Ok(Device::Cpu));
        assert_eq!(choose(Requested::Auto, &gpus(1), 1, 2, false), Ok(Device::Cpu));
        assert_eq!(choose(Requested::Cpu, &gpus(8), 0, 1, false), Ok(Device::Cpu));
    }

    #[test]
    fn cuda_without_a_gpu_says_why_and_what_to_do() {
        let err = choose(Requested::Cuda, &gpus(0), 0, 1, false).unwrap_err().to_string();
        assert_eq!(
            err,
            "`launch.device` is `cuda`, but this rank cannot use CUDA: there is no NVIDIA driver\nhint: use \
             `device: auto` to train on the CPU where there is no GPU, or run on a machine with an NVIDIA GPU \
             and driver"
        );
    }

    #[test]
    fn more_cuda_ranks_than_gpus_fail_unless_forced_to_share() {
        let err = choose(Requested::Cuda, &gpus(1), 1, 2, false).unwrap_err().to_string();
        assert!(
            err.starts_with(
                "`launch.device` is `cuda` and this rank's GPU is cuda:1 (LOCAL_RANK=1), but CUDA sees 1 GPU"
            ),
            "{err}"
        );
        assert!(err.contains("run at most 1 CUDA rank on this machine"), "{err}");
        assert_eq!(
            choose(Requested::Cuda, &gpus(2), 2, 3, false).unwrap_err().to_string(),
            "`launch.device` is `cuda` and this rank's GPU is cuda:2 (LOCAL_RANK=2), but CUDA sees 2 GPUs: every CUDA \
             rank needs a GPU of its own (NCCL refuses two ranks on one GPU)\nhint: run at most 2 CUDA ranks on this \
             machine, or set UPS_DOCTOR_FORCE_GPU=1 to make ranks share GPUs and see NCCL's own error"
        );
        assert_eq!(choose(Requested::Cuda, &gpus(1), 0, 2, false), Ok(Device::Cuda(0)));
        assert_eq!(choose(Requested::Cuda, &gpus(1), 1, 2, true), Ok(Device::Cuda(0)));
        assert_eq!(choose(Requested::Auto, &gpus(1), 1, 2, true), Ok(Device::Cuda(0)));
    }

    #[test]
    fn devices_are_named_like_pytorch() {
        assert_eq!(name(Device::Cuda(3)), "cuda:3");
        assert_eq!(name(Device::Cpu), "cpu");
    }
}
