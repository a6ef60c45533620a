//! Distributed data parallel, like `torch.nn.parallel.DistributedDataParallel`: rank 0's
//! parameters are broadcast at start (after checking that every rank built the same model),
//! gradients are averaged over ranks in ~25 MB buckets after backward, and a parameter that got no
//! gradient fails the way PyTorch's Reducer does: on the *next* forward, with its indices.

use tch::{Kind, Tensor, nn};

use super::dist::{Collective, DistError};
use crate::error::TrainError;

/// PyTorch's default bucket size (`bucket_cap_mb=25`).
const BUCKET_BYTES: usize = 25 << 20;

/// The model's parameters in a stable order (sorted by name) and the gradient reducer.
pub struct Ddp {
    /// The parameters that require grad, by name.
    params: Vec<(String, Tensor)>,
    /// Every variable, frozen ones included, for the end-of-training checksum.
    checksum_over: Vec<Tensor>,
    find_unused: bool,
    /// Indices of parameters that got no gradient in the last iteration, when that is an error.
    unused_last_iteration: Option<Vec<usize>>,
}

impl Ddp {
    /// Checks that every rank has the same parameters, then makes them rank 0's. Only parameters
    /// that require grad take part in gradient reduction, as in PyTorch.
    pub fn new(vs: &nn::VarStore, coll: &mut dyn Collective, find_unused: bool) -> Result<Ddp, TrainError> {
        let mut all: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        verify_and_broadcast(&all, coll)?;
        let checksum_over = all.iter().map(|(_, t)| t.shallow_clone()).collect();
        let params = all.into_iter().filter(|(_, t)| t.requires_grad()).collect();
        Ok(Ddp { params, checksum_over, find_unused, unused_last_iteration: None })
    }

    /// The parameters that are reduced and optimised, sorted by name.
    pub fn params(&self) -> Vec<Tensor> {
        self.params.iter().map(|(_, t)| t.shallow_clone()).collect()
    }

    /// Called before each forward: raises the Reducer's error if the last iteration left
    /// parameters without gradients.
    pub fn before_forward(&mut self, rank: usize) -> Result<(), TrainError> {
        let Some(unused) = self.unused_last_iteration.take() else {
            return Ok(());
        };
        let indices: Vec<String> = unused.iter().map(|i| i.to_string()).collect();
        let names: Vec<&str> = unused.iter().map(|&i| self.params[i].0.as_str()).collect();
        Err(TrainError::Ddp(format!(
            "Expected to have finished reduction in the prior iteration before starting a new one. This error \
             indicates that your module has parameters that were not used in producing loss. You can enable unused \
             parameter detection by setting `train.find_unused_parameters` to true (PyTorch: passing the keyword \
             argument `find_unused_parameters=True` to `torch.nn.parallel.DistributedDataParallel`), and by making \
             sure all `forward` function outputs participate in calculating loss. Parameter indices which did not \
             receive grad for rank {rank}: {} (names: {})",
            indices.join(" "),
            names.join(", ")
        )))
    }

    /// Averages gradients over ranks, bucket by bucket, in reverse parameter order (the order
    /// backward produces them). Parameters without a gradient are reduced as zeros when
    /// `find_unused_parameters` is on; otherwise the iteration's reduction is left unfinished and
    /// the next forward fails, as in PyTorch.
    pub fn sync_gradients(&mut self, coll: &mut dyn Collective) -> Result<(), TrainError> {
        let unused: Vec<usize> =
            (0..self.params.len()).filter(|&i| !self.params[i].1.grad().defined()).collect();
        if !unused.is_empty() && !self.find_unused {
            self.unused_last_iteration = Some(unused);
            return Ok(());
        }
        if !unused.is_empty() {
            // find_unused_parameters: this rank contributes zeros for them. A zero-weighted sum's
            // backward defines their gradients as zeros (tch has no setter for `.grad`).
            let zero: Tensor = unused.iter().map(|&i| (&self.params[i].1 * 0.0).sum(Kind::Float)).sum();
            zero.f_backward().map_err(TrainError::Torch)?;
        }
        let world = coll.world_size() as f64;
        let mut bucket: Vec<Tensor> = Vec::new();
        let mut bytes = 0usize;
        for i in (0..self.params.len()).rev() {
            let grad = self.params[i].1.grad();
            bytes += grad.numel() * 4;
            bucket.push(grad);
            if bytes >= BUCKET_BYTES {
                reduce_bucket(coll, &bucket, world)?;
                bucket.clear();
                bytes = 0;
            }
        }
        if !bucket.is_empty() {
            reduce_bucket(coll, &bucket, world)?;
        }
        Ok(())
    }

    /// A checksum of every parameter's bytes, to compare ranks after training.
    pub fn checksum(&self) -> String {
        params_checksum(self.checksum_over.iter())
    }
}

/// Checks that every rank built the same model (PyTorch's texts on a mismatch), then
/// overwrites every rank's parameters with rank 0's. `params` is sorted by name.
pub(crate) fn verify_and_broadcast(
    params: &[(String, Tensor)],
    coll: &mut dyn Collective,
) -> Result<(), TrainError> {
    let describe = |ps: &[(String, Tensor)]| -> String {
        ps.iter().map(|(name, t)| format!("{name}:{:?}", t.size())).collect::<Vec<_>>().join(";")
    };
    let all = coll.all_gather_bytes(describe(params).as_bytes())?;
    let rank = coll.rank();
    let counts: Vec<usize> =
        all.iter().map(|b| if b.is_empty() { 0 } else { b.split(|&c| c == b';').count() }).collect();
    if let Some(other) = counts.iter().position(|&c| c != counts[rank]) {
        return Err(TrainError::Ddp(format!(
            "DDP expects same model across all ranks, but Rank {rank} has {} params, while rank {other} has inconsistent {} params.",
            counts[rank], counts[other]
        )));
    }
    if let Some(other) = all.iter().position(|b| b != &all[rank]) {
        let mine = String::from_utf8_lossy(&all[rank]).into_owned();
        let theirs = String::from_utf8_lossy(&all[other]).into_owned();
        let (a, b) = mine
            .split(';')
            .zip(theirs.split(';'))
            .find(|(a, b)| a != b)
            .map_or((mine.clone(), theirs.clone()), |(a, b)| (a.to_string(), b.to_string()));
        return Err(TrainError::Ddp(format!(
            "DDP expects same model across all ranks, but rank {rank}'s parameter `{a}` does not match rank {other}'s `{b}`."
        )));
    }
    for (_, p) in params {
        let mut data = p.detach();
        coll.broadcast(&mut data, 0)?;
    }
    Ok(())
}

/// All-reduces one bucket of gradients as one flat buffer, averaged, and writes it back.
fn reduce_bucket(coll: &mut dyn Collective, grads: &[Tensor], world: f64) -> Result<(), DistError> {
    let mut flat =
        Tensor::cat(&grads.iter().map(|g| g.reshape([-1])).collect::<Vec<_>>(), 0).to_kind(Kind::Float);
    coll.all_reduce_sum(&mut flat)?;
    let flat = flat / world;
    let mut offset = 0;
    tch::no_grad(|| {
        for g in grads {
            let n = g.numel() as i64;
            let mut g = g.shallow_clone();
            g.copy_(&flat.narrow(0, offset, n).view_as(&g));
            offset += n;
        }
    });
    Ok(())
}

/// FNV-1a over the raw bytes of the tensors, in order, as hex.
pub fn params_checksum<'a>(tensors: impl Iterator<Item = &'a Tensor>) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for t in tensors {
        let t = t.detach().to_kind(Kind::Float).contiguous();
        let n = t.numel();
        let mut values = vec![0f32; n];
        t.copy_data(&mut values, n);
        for v in values {
            for b in v.to_le_bytes() {
                hash ^= u64::from(b);
                hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
    }
    format!("{hash:016x}")
}
