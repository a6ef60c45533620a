//! `train.amp`: the forward pass in bfloat16 autocast on the rank's device, as
//! `torch.autocast(device_type, dtype=torch.bfloat16)` runs it. Matmuls and linear layers run in
//! bf16, reductions and losses (`mse_loss`, `softmax`) stay in float32; the backward pass runs
//! outside the region and gradients land in the parameters' own dtype (float32), so no gradient
//! scaler is needed (bf16 has float32's exponent range).
//!
//! tch's `autocast` cannot do this: it only enables CUDA autocast with libtorch's default CUDA
//! dtype (float16) and does nothing on the CPU, so the state is set through a small C++ shim
//! (`csrc/autocast_shim.cpp`).

use tch::Device;

unsafe extern "C" {
    fn ups_autocast_enter(cuda: i32) -> i32;
    fn ups_autocast_exit(cuda: i32, previous: i32);
    fn ups_autocast_enabled(cuda: i32) -> i32;
}

/// Runs `f` in bf16 autocast on `device` when `enabled`, else runs it as it is.
pub fn autocast<T>(enabled: bool, device: Device, f: impl FnOnce() -> T) -> T {
    if !enabled {
        return f();
    }
    let cuda = i32::from(device.is_cuda());
    // SAFETY: the shim only flips libtorch's thread-local autocast flags.
    let previous = unsafe { ups_autocast_enter(cuda) };
    // Leave the region on unwind too: a panic in a tch op must not leave autocast on.
    struct Exit(i32, i32);
    impl Drop for Exit {
        fn drop(&mut self) {
            // SAFETY: as above; pairs with the enter call.
            unsafe { ups_autocast_exit(self.0, self.1) };
        }
    }
    let _exit = Exit(cuda, previous);
    f()
}

/// Whether autocast is on for `device` in this thread.
pub fn enabled(device: Device) -> bool {
    // SAFETY: reads a thread-local flag.
    unsafe { ups_autocast_enabled(i32::from(device.is_cuda())) != 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Kind, Tensor};

    #[test]
    fn cpu_autocast_runs_matmuls_in_bf16_and_ends_with_the_region() {
        let a = Tensor::ones([4, 4], (Kind::Float, Device::Cpu));
        let (product, inside) = autocast(true, Device::Cpu, || (a.matmul(&a), enabled(Device::Cpu)));
        assert!(inside);
        assert_eq!(product.kind(), Kind::BFloat16);
        assert!(!enabled(Device::Cpu), "the region must end");
        assert_eq!(a.matmul(&a).kind(), Kind::Float);
        // Losses stay in float32 inside the region, as in PyTorch.
        let loss = autocast(true, Device::Cpu, || a.matmul(&a).mse_loss(&a, tch::Reduction::Mean));
        assert_eq!(loss.kind(), Kind::Float);
        assert_eq!(autocast(false, Device::Cpu, || a.matmul(&a)).kind(), Kind::Float);
    }
}
