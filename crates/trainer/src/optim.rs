//! AdamW and global-norm gradient clipping over plain tensors, written out here rather than taken
//! from tch: the optimizer must run on FSDP's flat shards as well as on whole parameters, and its
//! state (moments and step count) must be saved in checkpoints, which tch does not expose.
//!
//! The update is PyTorch's `torch.optim.AdamW` (decoupled weight decay, bias-corrected moments,
//! `eps` added after the square root), and clipping is `clip_grad_norm_` (`max / (norm + 1e-6)`,
//! only ever scaling down).
//!
//! Both run over all parameters at once, as PyTorch's own do, through libtorch's multi-tensor ops
//! (`csrc/optim_shim.cpp`: tch binds none of them): the update is `_fused_adamw_`, what
//! `AdamW(fused=True)` runs, one pass over each parameter instead of ten tensor ops a parameter
//! (measured: the optimizer phase was a fifth of the default model's CPU step); the norm is
//! `_foreach_norm`, and the clipping coefficient stays a tensor that `_foreach_mul_` scales by, so
//! nothing in a step is read back to the host (on a GPU every read waits for the queue to drain).

use std::ffi::{CStr, c_char};

use tch::{Device, Kind, TchError, Tensor};
use torch_sys::C_tensor;

unsafe extern "C" {
    fn ups_fused_adamw(
        params: *const *const C_tensor,
        grads: *const *const C_tensor,
        exp_avgs: *const *const C_tensor,
        exp_avg_sqs: *const *const C_tensor,
        step: *const C_tensor,
        n: i64,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
        err: *mut *mut c_char,
    ) -> i32;
    fn ups_foreach_norm(
        tensors: *const *const C_tensor,
        n: i64,
        out: *mut *mut C_tensor,
        err: *mut *mut c_char,
    ) -> i32;
    fn ups_foreach_mul_(
        tensors: *const *const C_tensor,
        n: i64,
        factor: *const C_tensor,
        err: *mut *mut c_char,
    ) -> i32;
    fn ups_optim_free_string(s: *mut c_char);
}

/// The shim's status as a `Result`, releasing its message.
fn checked(status: i32, err: *mut c_char) -> Result<(), TchError> {
    if status == 0 {
        return Ok(());
    }
    if err.is_null() {
        return Err(TchError::Torch(
            "unknown error (the optimizer shim could not allocate its message)".into(),
        ));
    }
    // SAFETY: on failure the shim sets `err` to a NUL-terminated string it malloc'd, released here once.
    let message = unsafe { CStr::from_ptr(err) }.to_string_lossy().into_owned();
    unsafe { ups_optim_free_string(err) };
    Err(TchError::Torch(message))
}

/// tch's handles of `tensors`, for the shim, valid while `tensors` lives.
fn handles<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) -> Vec<*const C_tensor> {
    tensors.into_iter().map(Tensor::as_ptr).collect()
}

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
    /// `step` where the fused kernel reads it: a float32 scalar on the parameters' device, as
    /// `AdamW(fused=True)` keeps it. Set from `step` by a fill before each update (a kernel with
    /// the value as its argument, not a copy from the host), so a resumed count is what it reads.
    step_on_device: Tensor,
}

impl AdamW {
    /// State for tensors shaped like `params`, all zero.
    pub fn new(params: &[Tensor], weight_decay: f64) -> AdamW {
        let zeros = || params.iter().map(|p| p.zeros_like().detach()).collect::<Vec<_>>();
        let device = params.first().map_or(Device::Cpu, Tensor::device);
        AdamW {
            weight_decay,
            betas: (0.9, 0.999),
            eps: 1e-8,
            step: 0,
            exp_avg: zeros(),
            exp_avg_sq: zeros(),
            step_on_device: Tensor::zeros([], (Kind::Float, device)),
        }
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
    pub fn step(&mut self, params: &[Tensor], grads: &[Tensor], lr: f64) -> Result<(), TchError> {
        assert_eq!(params.len(), self.exp_avg.len(), "AdamW was built for another parameter list");
        assert_eq!(params.len(), grads.len(), "one gradient per parameter");
        self.step += 1;
        let with_grad: Vec<usize> = (0..params.len()).filter(|&i| grads[i].defined()).collect();
        if with_grad.is_empty() {
            return Ok(());
        }
        let pick = |list: &[Tensor]| handles(with_grad.iter().map(|&i| &list[i]));
        let (p, g, m, v) = (pick(params), pick(grads), pick(&self.exp_avg), pick(&self.exp_avg_sq));
        let (b1, b2) = self.betas;
        tch::no_grad(|| {
            let _ = self.step_on_device.f_fill_(self.step as f64)?;
            let mut err = std::ptr::null_mut();
            // SAFETY: every handle points at a tensor borrowed for this call; the shim reads the
            // lists and updates the tensors in place, keeping no pointer.
            let status = unsafe {
                ups_fused_adamw(
                    p.as_ptr(),
                    g.as_ptr(),
                    m.as_ptr(),
                    v.as_ptr(),
                    self.step_on_device.as_ptr(),
                    p.len() as i64,
                    lr,
                    b1,
                    b2,
                    self.weight_decay,
                    self.eps,
                    &mut err,
                )
            };
            checked(status, err)
        })
    }
}

/// The squared L2 norm of the defined gradients, summed in f64 (stable across many tensors and
/// ranks), as a 0-dim tensor on their device: never read back here.
pub fn squared_norm(grads: &[Tensor]) -> Result<Tensor, TchError> {
    let defined = handles(grads.iter().filter(|g| g.defined()));
    let Some(first) = grads.iter().find(|g| g.defined()) else {
        return Ok(Tensor::zeros([], (Kind::Double, Device::Cpu)));
    };
    let mut norms = std::ptr::null_mut();
    let mut err = std::ptr::null_mut();
    // SAFETY: the handles point at tensors borrowed for this call; on success `norms` is a new
    // `at::Tensor*` whose ownership passes to the `Tensor` made from it.
    let status = unsafe { ups_foreach_norm(defined.as_ptr(), defined.len() as i64, &mut norms, &mut err) };
    checked(status, err)?;
    let norms = unsafe { Tensor::from_ptr(norms) };
    debug_assert_eq!(norms.device(), first.device());
    Ok(norms.to_kind(Kind::Double).square().sum(Kind::Double))
}

/// Scales `grads` in place so that their global norm (`total_norm`, a 0-dim tensor, possibly
/// computed across ranks) is at most `max_norm`, as `torch.nn.utils.clip_grad_norm_` does: every
/// defined gradient is multiplied by `min(max_norm / (total_norm + 1e-6), 1)`, computed where the
/// norm is, so a step that needs no clipping multiplies by exactly 1.
pub fn clip_to(grads: &[Tensor], total_norm: &Tensor, max_norm: f64) -> Result<(), TchError> {
    let defined = handles(grads.iter().filter(|g| g.defined()));
    let Some(first) = grads.iter().find(|g| g.defined()) else {
        return Ok(());
    };
    // `max / t` is `t.reciprocal() * max` in PyTorch too (`Tensor.__rtruediv__`); the coefficient
    // takes the gradients' dtype and device, as `clip_grad_norm_`'s does.
    let coef = ((total_norm + 1e-6).reciprocal() * max_norm)
        .clamp_max(1.0)
        .to_device(first.device())
        .to_kind(first.kind());
    let mut err = std::ptr::null_mut();
    tch::no_grad(|| {
        // SAFETY: the handles point at tensors borrowed for this call; the shim scales them in place.
        let status =
            unsafe { ups_foreach_mul_(defined.as_ptr(), defined.len() as i64, coef.as_ptr(), &mut err) };
        checked(status, err)
    })
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
            mine.step(std::slice::from_ref(&ours), &[grad], 1e-2).unwrap();
        }
        let diff = f64::try_from((&w - &ours).abs().max()).unwrap();
        assert!(diff < 1e-6, "ours and libtorch's AdamW drifted apart by {diff}");
        assert_eq!(mine.state_bytes(), 2 * 15 * 4);
    }

    /// Several parameters in one fused update, one of them (odd-sized, so not a whole number of
    /// vector lanes) among them, follow libtorch's AdamW; a parameter without a gradient is
    /// skipped by both: its value and its moments stay as they were.
    #[test]
    fn a_multi_tensor_step_matches_libtorch_and_skips_a_parameter_without_gradient() {
        tch::manual_seed(11);
        let vs = nn::VarStore::new(Device::Cpu);
        let root = vs.root();
        let theirs_p = [root.randn("a", &[5, 3], 0.0, 1.0), root.randn("b", &[7], 0.0, 1.0)];
        let frozen = root.randn("c", &[4, 4], 0.0, 1.0);
        let ours: Vec<Tensor> = theirs_p.iter().chain([&frozen]).map(|t| t.detach().copy()).collect();
        let mut theirs = nn::AdamW { wd: 0.01, ..Default::default() }.build(&vs, 1e-2).unwrap();
        let mut mine = AdamW::new(&ours, 0.01);
        for step in 0..20 {
            let target = step as f64 * 0.1;
            theirs.zero_grad();
            theirs_p.iter().map(|w| (w - target).square().sum(Kind::Float)).sum::<Tensor>().backward();
            theirs.step();
            let grads = [(&ours[0] - target) * 2.0, (&ours[1] - target) * 2.0, Tensor::new()];
            mine.step(&ours, &grads, 1e-2).unwrap();
        }
        for (w, o) in theirs_p.iter().zip(&ours) {
            let diff = f64::try_from((w - o).abs().max()).unwrap();
            assert!(diff < 1e-6, "ours and libtorch's AdamW drifted apart by {diff}");
        }
        assert!(frozen.equal(&ours[2]), "a parameter without gradient must not move");
        assert_eq!(f64::try_from(mine.exp_avg[2].abs().sum(Kind::Double)).unwrap(), 0.0);
        assert_eq!(f64::try_from(mine.exp_avg_sq[2].abs().sum(Kind::Double)).unwrap(), 0.0);
    }

    fn norm(grads: &[Tensor]) -> f64 {
        f64::try_from(squared_norm(grads).unwrap().sqrt()).unwrap()
    }

    #[test]
    fn clipping_scales_down_to_the_limit_and_never_up() {
        let g = [Tensor::from_slice(&[3.0f32, 4.0])];
        clip_to(&g, &squared_norm(&g).unwrap().sqrt(), 1.0).unwrap();
        let n = norm(&g);
        assert!((n - 1.0).abs() < 1e-5, "norm after clipping is {n}");
        clip_to(&g, &Tensor::from(n), 10.0).unwrap();
        assert!((norm(&g) - n).abs() < 1e-9);
    }

    /// The norm is global over every defined gradient, and each is scaled by the same factor; an
    /// undefined gradient is neither counted nor touched.
    #[test]
    fn clipping_spans_every_defined_gradient_and_skips_undefined_ones() {
        let g = [Tensor::from_slice(&[3.0f32, 4.0]), Tensor::new(), Tensor::from_slice(&[12.0f32])];
        let total = squared_norm(&g).unwrap();
        assert_eq!(f64::try_from(&total).unwrap(), 169.0);
        clip_to(&g, &total.sqrt(), 1.0).unwrap();
        let n = norm(&g);
        assert!((n - 1.0).abs() < 1e-5, "norm after clipping is {n}");
        let scaled = Vec::<f32>::try_from(Tensor::cat(&[&g[0], &g[2]], 0)).unwrap();
        for (x, want) in scaled.iter().zip([3.0f32, 4.0, 12.0]) {
            assert!((x * 13.0 - want).abs() < 1e-5, "{scaled:?} is not [3, 4, 12] / 13");
        }
        assert!(!g[1].defined());
    }
}
