//! Fully sharded data parallel in the style of PyTorch's FSDP1 (`use_orig_params=False`): each
//! unit of the model (the encoder, the conditioner, every block, the decoder) owns one flat
//! parameter, padded to a multiple of the world size and sharded across ranks. Before a step the
//! shards are all-gathered and the model's parameters become views into the gathered flat
//! parameter (`split` then `view`, as FSDP1 does); after backward the flat gradient is
//! reduce-scattered, averaged, and the optimizer updates only this rank's shard, so its state is
//! 1/world of DDP's.
//!
//! Because the parameters are views of one tensor that requires grad, an in-place update of one
//! of them raises libtorch's own "Output 0 of ViewBackward0 is a view and is being modified
//! inplace…" error, which is how FSDP users meet it.
//!
//! Memory profile: the flat parameters stay gathered from the start of a step's forward to the
//! end of its backward (like `ShardingStrategy.SHARD_GRAD_OP`); gradients and optimizer state are
//! sharded.

use std::collections::HashMap;

use tch::{Device, Kind, Tensor, nn};

use super::ddp::{params_checksum, verify_and_broadcast};
use super::dist::Collective;
use super::model::Operator;
use crate::error::TrainError;

/// The FSDP unit a variable belongs to: `stage0.block1` for a block's variables, else the first
/// path component (`encoder`, `conditioner`, `decoder`).
pub fn unit_of(name: &str) -> &str {
    let mut parts = name.splitn(3, '.');
    let first = parts.next().unwrap_or(name);
    match (first.starts_with("stage"), parts.next()) {
        (true, Some(block)) => &name[..first.len() + 1 + block.len()],
        _ => first,
    }
}

/// One unit's flat parameter.
struct Unit {
    name: String,
    /// Variable names and shapes, in flat order.
    members: Vec<(String, Vec<i64>)>,
    /// Element count of each member, then the padding when there is any (`split` sizes).
    sizes: Vec<i64>,
    numel: i64,
    padded: i64,
    /// This rank's chunk of the flat parameter: the tensor the optimizer updates.
    shard: Tensor,
    /// The gathered flat parameter of the current step, a leaf that requires grad (undefined
    /// before the first gather).
    flat: Tensor,
}

pub struct Fsdp {
    units: Vec<Unit>,
    world: i64,
    /// Where the parameters live (the rank's device); gathered and reduced buffers go there too.
    device: Device,
}

impl Fsdp {
    /// Checks that every rank built the same model, makes the parameters rank 0's
    /// (`sync_module_states`), and keeps this rank's shard of each unit.
    pub fn new(vs: &nn::VarStore, coll: &mut dyn Collective) -> Result<Fsdp, TrainError> {
        let mut params: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        params.sort_by(|a, b| a.0.cmp(&b.0));
        verify_and_broadcast(&params, coll)?;
        let world = coll.world_size() as i64;
        let rank = coll.rank() as i64;
        let device = params.first().map_or(Device::Cpu, |(_, t)| t.device());
        let mut units: Vec<Unit> = Vec::new();
        for (name, t) in &params {
            let unit = unit_of(name);
            if units.last().is_none_or(|u| u.name != unit) {
                units.push(Unit {
                    name: unit.to_string(),
                    members: Vec::new(),
                    sizes: Vec::new(),
                    numel: 0,
                    padded: 0,
                    shard: Tensor::new(),
                    flat: Tensor::new(),
                });
            }
            let u = units.last_mut().expect("just pushed");
            u.members.push((name.clone(), t.size()));
            u.sizes.push(t.numel() as i64);
            u.numel += t.numel() as i64;
        }
        let by_name: HashMap<&str, &Tensor> = params.iter().map(|(n, t)| (n.as_str(), t)).collect();
        for u in &mut units {
            u.padded = (u.numel + world - 1) / world * world;
            let mut pieces: Vec<Tensor> =
                u.members.iter().map(|(n, _)| by_name[n.as_str()].detach().reshape([-1])).collect();
            if u.padded > u.numel {
                u.sizes.push(u.padded - u.numel);
                pieces.push(Tensor::zeros([u.padded - u.numel], (Kind::Float, device)));
            }
            let chunk = u.padded / world;
            u.shard = Tensor::cat(&pieces, 0).narrow(0, rank * chunk, chunk).copy();
        }
        Ok(Fsdp { units, world, device })
    }

    /// All-gathers every unit's flat parameter and points the model's parameters at views of it.
    pub fn gather(&mut self, model: &mut Operator, coll: &mut dyn Collective) -> Result<(), TrainError> {
        let mut views: HashMap<String, Tensor> = HashMap::new();
        for u in &mut self.units {
            let mut full = Tensor::empty([u.padded], (Kind::Float, self.device));
            coll.all_gather(&u.shard, &mut full)?;
            u.flat = full.set_requires_grad(true);
            for ((name, shape), part) in u.members.iter().zip(u.flat.split_with_sizes(&u.sizes, 0)) {
                views.insert(name.clone(), part.view(shape.as_slice()));
            }
        }
        for (name, slot) in model.params_mut() {
            *slot = views.remove(&name).ok_or_else(|| {
                TrainError::Ddp(format!("FSDP: the model reads `{name}`, which no FSDP unit holds"))
            })?;
        }
        if let Some(name) = views.keys().next() {
            return Err(TrainError::Ddp(format!("FSDP: unit variable `{name}` is not read by the model")));
        }
        Ok(())
    }

    /// Reduce-scatters each unit's flat gradient into this rank's shard gradient, averaged over
    /// ranks. A unit that got no gradient contributes zeros.
    pub fn shard_grads(&mut self, coll: &mut dyn Collective) -> Result<Vec<Tensor>, TrainError> {
        let mut grads = Vec::with_capacity(self.units.len());
        for u in &self.units {
            let g = u.flat.grad();
            let g = if g.defined() {
                g.contiguous()
            } else {
                Tensor::zeros([u.padded], (Kind::Float, self.device))
            };
            let mut out = Tensor::zeros([u.padded / self.world], (Kind::Float, self.device));
            coll.reduce_scatter_sum(&g, &mut out)?;
            grads.push(out / self.world as f64);
        }
        Ok(grads)
    }

    /// The shards the optimizer updates, in unit order.
    pub fn shards(&self) -> Vec<Tensor> {
        self.units.iter().map(|u| u.shard.shallow_clone()).collect()
    }

    /// `(unit name, elements, padded elements)` per unit, for the report and for checkpoints.
    pub fn layout(&self) -> Vec<(String, i64, i64)> {
        self.units.iter().map(|u| (u.name.clone(), u.numel, u.padded)).collect()
    }

    /// A checksum of the whole (gathered, unpadded) parameters: equal on every rank when the
    /// shards stayed consistent.
    pub fn checksum(&self, coll: &mut dyn Collective) -> Result<String, TrainError> {
        let mut full = Vec::with_capacity(self.units.len());
        for u in &self.units {
            let mut t = Tensor::empty([u.padded], (Kind::Float, self.device));
            coll.all_gather(&u.shard, &mut t)?;
            full.push(t.narrow(0, 0, u.numel));
        }
        Ok(params_checksum(full.iter()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Model as ModelConfig;

    #[test]
    fn variables_group_into_blocks_and_top_level_parts() {
        assert_eq!(unit_of("stage0.block1.attn.qkv.weight"), "stage0.block1");
        assert_eq!(unit_of("stage12.block3.fc1.bias"), "stage12.block3");
        assert_eq!(unit_of("encoder.pos"), "encoder");
        assert_eq!(unit_of("decoder.kv.weight"), "decoder");
    }

    /// Every variable in the store is a parameter the forward pass reads, and vice versa: FSDP's
    /// rebinding would otherwise leave a stale leaf behind.
    #[test]
    fn the_model_exposes_exactly_its_store_variables() {
        for (conditioning, attention) in [(true, true), (false, true), (true, false)] {
            let cfg = ModelConfig { conditioning, attention, depths: vec![2, 1], ..Default::default() };
            let vs = nn::VarStore::new(Device::Cpu);
            let mut model = Operator::build(&vs.root(), &cfg, true, |_, build| build());
            let mut exposed: Vec<String> = model.params_mut().into_iter().map(|(n, _)| n).collect();
            let mut stored: Vec<String> = vs.variables().into_keys().collect();
            exposed.sort();
            stored.sort();
            assert_eq!(exposed, stored, "conditioning {conditioning}, attention {attention}");
        }
    }

    /// The failure FSDP users meet: an in-place update of a parameter that is a view of a flat
    /// parameter, while the same update of a plain frozen parameter is allowed.
    #[test]
    fn in_place_update_of_a_flat_parameter_view_raises_libtorchs_error() {
        let frozen = Tensor::zeros([2], (Kind::Float, Device::Cpu));
        let mut plain = frozen.shallow_clone();
        assert!(plain.f_mul_(&Tensor::from(0.5f32)).is_ok());

        let flat = Tensor::zeros([6], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let parts = flat.split_with_sizes([4, 2], 0);
        let mut view = parts[1].view([2]);
        let err = view.f_mul_(&Tensor::from(0.5f32)).expect_err("libtorch must refuse").to_string();
        assert!(
            err.contains("Output 0 of ViewBackward0 is a view and is being modified inplace. This view is the output of a function that returns multiple views."),
            "{err}"
        );
    }
}
