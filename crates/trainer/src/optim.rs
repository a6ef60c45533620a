//! AdamW and global-norm gradient clipping over plain tensors, written out here rather than taken
//! from tch: the optimizer must run on FSDP's flat shards as well as on whole parameters, and its
//! state (moments and step count) must be saved in checkpoints, which tch does not expose.
//!
//! The update is PyTorch's `torch.optim.AdamW` (decoupled weight decay, bias-corrected moments,
//! `eps` added after the square root), and clipping is `clip_grad_norm_` (`max / (norm + 1e-6)`,
//! only ever scaling down).

use tch::{Kind, Tensor};

/// AdamW's state for a fixed list of tensors: first and second moments and the step count.
#[derive(Debug)]
pub struct AdamW {
    pub weight_decay: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    /// Steps taken so far (PyTorch's per-parameter `step`, shared because all update together).
    pub step: i64,
    pub exp_avg: Vec<Tensor>,
    pub exp_avg_sq: Vec<Tensor>,
}

impl AdamW {
    /// State for tensors shaped like `params`, all zero.
    pub fn new(params: &[Tensor], weight_decay: f64) -> AdamW {
        let zeros = || params.iter().map(|p| p.zeros_like().detach()).collect::<Vec<_>>();
        AdamW { weight_decay, betas: (0.9, 0.999), eps: 1e-8, step: 0, exp_avg: zeros(), exp_avg_sq: zeros() }
    }

    /// Bytes of optimizer state: what sharding divides by the world size.
    pub fn state_bytes(&self) -> u64 {
        self.exp_avg
            .iter()
            .chain(&self.exp_avg_sq)
            .map(|t| (t.numel() * t.kind().elt_size_in_bytes()) as u64)
            .sum()
    }

    /// One update of `params` (in place) from `grads`. A parameter whose gradient is undefined is
    /// skipped, as PyTorch skips parameters whose `.grad` is `None`.
    pub fn step(&mut self, params: &[Tensor], grads: &[Tensor], lr: f64) {
        assert_eq!(params.len(), self.exp_avg.len(), "AdamW was built for another parameter list");
        let (b1, b2) = self.betas;
        self.step += 1;
        let bias1 = 1.0 - b1.powi(self.step as i32);
        let bias2 = 1.0 - b2.powi(self.step as i32);
        tch::no_grad(|| {
            for (i, (p, g)) in params.iter().zip(grads).enumerate() {
                if !g.defined() {
                    continue;
                }
                // PyTorch's single-tensor AdamW, in place where it is (lerp_, addcmul_,
                // addcdiv_): 10 kernels a parameter rather than 13, which on a GPU, where a small
                // model's step is bound by launches, is time (gpu-check on an H200).
                let mut p = p.shallow_clone();
                let _ = p.g_mul_scalar_(1.0 - lr * self.weight_decay);
                let m = &mut self.exp_avg[i];
                let _ = m.lerp_(g, 1.0 - b1);
                let v = &mut self.exp_avg_sq[i];
                let _ = v.g_mul_scalar_(b2);
                let _ = v.addcmul_(g, &(g * (1.0 - b2)));
                let mut denom = v.sqrt();
                let _ = denom.g_div_scalar_(bias2.sqrt());
                let _ = denom.g_add_scalar_(self.eps);
                // p += m / (denom · −bias1/lr), i.e. p −= lr/bias1 · m / denom.
                let _ = denom.g_mul_scalar_(-bias1 / lr);
                let _ = p.addcdiv_(m, &denom);
            }
        });
    }
}

/// The squared L2 norm of the defined gradients, summed (f64 for a stable sum across ranks).
/// One number read back to the host, not one per gradient: on a GPU each read waits for the queue
/// to drain.
pub fn squared_norm(grads: &[Tensor]) -> f64 {
    let parts: Vec<Tensor> = grads
        .iter()
        .filter(|g| g.defined())
        .map(|g| g.to_kind(Kind::Float).square().sum(Kind::Double))
        .collect();
    if parts.is_empty() {
        return 0.0;
    }
    f64::try_from(Tensor::stack(&parts, 0).sum(Kind::Double)).unwrap_or(f64::NAN)
}

/// Scales `grads` in place so that their global norm (`total_norm`, possibly computed across
/// ranks) is at most `max_norm`, as `torch.nn.utils.clip_grad_norm_` does.
pub fn clip_to(grads: &[Tensor], total_norm: f64, max_norm: f64) {
    let coef = max_norm / (total_norm + 1e-6);
    if coef >= 1.0 {
        return;
    }
    tch::no_grad(|| {
        for g in grads.iter().filter(|g| g.defined()) {
            let _ = g.shallow_clone().g_mul_scalar_(coef);
        }
    });
}

#[cfg(test)]
mod tests {
    use tch::nn::OptimizerConfig;
    use tch::{Device, nn};

    use super::*;

    /// The hand-written update follows libtorch's own AdamW step for step.
    #[test]
    fn adamw_matches_libtorch_adamw() {
        tch::manual_seed(7);
        let vs = nn::VarStore::new(Device::Cpu);
        let w = vs.root().randn("w", &[5, 3], 0.0, 1.0);
        let ours = w.detach().copy();
        let mut theirs = nn::AdamW { wd: 0.01, ..Default::default() }.build(&vs, 1e-2).unwrap();
        let mut mine = AdamW::new(std::slice::from_ref(&ours), 0.01);
        for step in 0..20 {
            let target = Tensor::full([5, 3], step as f64 * 0.1, (Kind::Float, Device::Cpu));
            theirs.zero_grad();
            (&w - &target).square().sum(Kind::Float).backward();
            theirs.step();
            let grad = (&ours - &target) * 2.0;
            mine.step(std::slice::from_ref(&ours), &[grad], 1e-2);
        }
        let diff = f64::try_from((&w - &ours).abs().max()).unwrap();
        assert!(diff < 1e-6, "ours and libtorch's AdamW drifted apart by {diff}");
        assert_eq!(mine.state_bytes(), 2 * 15 * 4);
    }

    #[test]
    fn clipping_scales_down_to_the_limit_and_never_up() {
        let g = [Tensor::from_slice(&[3.0f32, 4.0])];
        clip_to(&g, squared_norm(&g).sqrt(), 1.0);
        let n = squared_norm(&g).sqrt();
        assert!((n - 1.0).abs() < 1e-5, "norm after clipping is {n}");
        clip_to(&g, n, 10.0);
        assert!((squared_norm(&g).sqrt() - n).abs() < 1e-9);
    }
}
