//! A small Universal-Physics-Transformer-style neural operator.
//!
//! `encoder` (point-wise MLP on the grid, pooled into latent tokens, plus token positions) →
//! stages of transformer `blocks` grouped by `depths` (optionally windowed self-attention,
//! optionally AdaLN conditioning on viscosity) → `decoder` (perceiver cross-attention from query
//! positions to the tokens). Every part is a named unit so the harness can point at it and bisect
//! can cut it; variable paths are stable (`encoder/proj_in`, `stage0/block1/attn/qkv`, …).

use std::f64::consts::PI;

use tch::nn::{self, Module};
use tch::{Kind, Tensor};

use crate::scenario::Model as ModelConfig;

/// Fourier features of a position in [0, 1): `sin/cos(2π k x)` for k = 1..=FREQS.
const FREQS: i64 = 4;

fn fourier_features(x: &Tensor) -> Tensor {
    let k = Tensor::arange_start(1, FREQS + 1, (Kind::Float, x.device())) * (2.0 * PI);
    let arg = x.unsqueeze(-1) * k; // (..., FREQS)
    Tensor::cat(&[arg.sin(), arg.cos()], -1)
}

/// The encoder: grid values + positions → `latent_tokens` tokens of width `hidden`.
#[derive(Debug)]
pub struct Encoder {
    proj_in: nn::Linear,
    proj_out: nn::Linear,
    pos: Tensor,
    tokens: i64,
    /// A running mean of the input, kept in a frozen parameter (no gradient) and updated in place
    /// during forward; only built for the `inplace_view` fault, which performs that update.
    running_mean: Option<Tensor>,
}

impl Encoder {
    pub fn new(p: &nn::Path, cfg: &ModelConfig, running_mean: bool) -> Encoder {
        let h = cfg.hidden as i64;
        let tokens = cfg.latent_tokens as i64;
        Encoder {
            proj_in: nn::linear(p / "proj_in", 1 + 2 * FREQS, h, Default::default()),
            proj_out: nn::linear(p / "proj_out", h, h, Default::default()),
            pos: p.var("pos", &[tokens, h], nn::Init::Randn { mean: 0.0, stdev: 0.02 }),
            tokens,
            running_mean: running_mean.then(|| p.zeros_no_train("running_mean", &[1])),
        }
    }

    /// Updates the running mean of `u` in place, with autograd on, the way a component that keeps
    /// statistics in a parameter does. Fine on a frozen leaf (single, DDP); under FSDP the
    /// parameter is a view of a flat parameter that requires grad, and libtorch refuses.
    pub fn update_running_mean(&self, u: &Tensor) -> Result<(), tch::TchError> {
        // Tensor operands, not scalar ones: tch checks libtorch's error of a `*_scalar_` op only
        // after dropping the scalar, and that drop panics on it.
        if let Some(running) = &self.running_mean {
            let mut running = running.shallow_clone();
            let _ = running.f_mul_(&Tensor::from(0.9f32))?;
            let _ = running.f_add_(&(u.mean(Kind::Float) * 0.1))?;
        }
        Ok(())
    }

    /// `u`: `(B, G)` values on the grid `x`: `(G,)` → `(B, T, H)`.
    pub fn forward(&self, u: &Tensor, x: &Tensor) -> Tensor {
        let (b, g) = u.size2().expect("u is (batch, grid)");
        let feats = Tensor::cat(&[u.unsqueeze(-1), fourier_features(x).expand([b, g, 2 * FREQS], true)], -1);
        let h = self.proj_in.forward(&feats).gelu("none");
        // Supernode pooling: contiguous groups of grid points become one token each.
        let pooled = h.view([b, self.tokens, g / self.tokens, -1]).mean_dim(2, false, Kind::Float);
        self.proj_out.forward(&pooled) + &self.pos
    }
}

/// Collects a model part's parameter tensors under their variable names (`prefix.weight`, …).
type Params<'a> = Vec<(String, &'a mut Tensor)>;

fn linear_params<'a>(l: &'a mut nn::Linear, prefix: &str, out: &mut Params<'a>) {
    out.push((format!("{prefix}.weight"), &mut l.ws));
    if let Some(b) = l.bs.as_mut() {
        out.push((format!("{prefix}.bias"), b));
    }
}

fn layer_norm_params<'a>(l: &'a mut nn::LayerNorm, prefix: &str, out: &mut Params<'a>) {
    if let Some(w) = l.ws.as_mut() {
        out.push((format!("{prefix}.weight"), w));
    }
    if let Some(b) = l.bs.as_mut() {
        out.push((format!("{prefix}.bias"), b));
    }
}

/// Multi-head self-attention, optionally restricted to a periodic window of tokens.
#[derive(Debug)]
pub struct SelfAttention {
    qkv: nn::Linear,
    out: nn::Linear,
    heads: i64,
    /// Additive mask `(T, T)`: 0 inside the window, a large negative number outside.
    mask: Option<Tensor>,
}

impl SelfAttention {
    pub fn new(p: &nn::Path, cfg: &ModelConfig) -> SelfAttention {
        let h = cfg.hidden as i64;
        let t = cfg.latent_tokens as i64;
        let mask = (cfg.window > 0 && (cfg.window as i64) * 2 + 1 < t).then(|| {
            let idx = Tensor::arange(t, (Kind::Int64, p.device()));
            let d = (idx.unsqueeze(1) - idx.unsqueeze(0)).abs();
            let periodic = d.minimum(&(Tensor::from(t) - &d));
            periodic.gt(cfg.window as i64).to_kind(Kind::Float) * -1e9
        });
        SelfAttention {
            qkv: nn::linear(p / "qkv", h, 3 * h, Default::default()),
            out: nn::linear(p / "out", h, h, Default::default()),
            heads: cfg.heads as i64,
            mask,
        }
    }

    pub fn forward(&self, x: &Tensor) -> Tensor {
        let (b, t, h) = x.size3().expect("x is (batch, tokens, hidden)");
        let dh = h / self.heads;
        let qkv = self.qkv.forward(x).view([b, t, 3, self.heads, dh]).permute([2, 0, 3, 1, 4]);
        let (q, k, v) = (qkv.get(0), qkv.get(1), qkv.get(2));
        let mut scores = q.matmul(&k.transpose(-2, -1)) / (dh as f64).sqrt();
        if let Some(mask) = &self.mask {
            scores += mask;
        }
        let y = scores.softmax(-1, Kind::Float).matmul(&v); // (B, heads, T, dh)
        self.out.forward(&y.transpose(1, 2).contiguous().view([b, t, h]))
    }
}

/// LayerNorm without affine parameters, modulated by the condition when conditioning is on
/// (AdaLN: `LN(x) · (1 + scale) + shift`), otherwise with its own affine parameters.
#[derive(Debug)]
pub struct AdaNorm {
    norm: nn::LayerNorm,
    modulation: Option<nn::Linear>,
}

impl AdaNorm {
    pub fn new(p: &nn::Path, cfg: &ModelConfig) -> AdaNorm {
        let h = cfg.hidden as i64;
        let norm_cfg = nn::LayerNormConfig { elementwise_affine: !cfg.conditioning, ..Default::default() };
        AdaNorm {
            norm: nn::layer_norm(p / "norm", vec![h], norm_cfg),
            modulation: cfg.conditioning.then(|| {
                // Zero-initialised, so a conditioned block starts as an unconditioned one.
                let zero = nn::LinearConfig { ws_init: nn::Init::Const(0.0), ..Default::default() };
                nn::linear(p / "modulation", h, 2 * h, zero)
            }),
        }
    }

    /// `x`: `(B, T, H)`; `cond`: `(B, H)` when conditioning.
    pub fn forward(&self, x: &Tensor, cond: Option<&Tensor>) -> Tensor {
        let y = self.norm.forward(x);
        match (&self.modulation, cond) {
            (Some(m), Some(c)) => {
                let ss = m.forward(&c.silu()).unsqueeze(1);
                let parts = ss.chunk(2, -1);
                y * (&parts[0] + 1.0) + &parts[1]
            }
            _ => y,
        }
    }
}

/// One approximator block: `x + attn(norm(x))`, then `x + mlp(norm(x))`.
#[derive(Debug)]
pub struct Block {
    norm1: Option<AdaNorm>,
    attn: Option<SelfAttention>,
    norm2: AdaNorm,
    fc1: nn::Linear,
    fc2: nn::Linear,
}

impl Block {
    pub fn new(p: &nn::Path, cfg: &ModelConfig) -> Block {
        let h = cfg.hidden as i64;
        let inner = h * cfg.mlp_ratio as i64;
        Block {
            norm1: cfg.attention.then(|| AdaNorm::new(&(p / "norm1"), cfg)),
            attn: cfg.attention.then(|| SelfAttention::new(&(p / "attn"), cfg)),
            norm2: AdaNorm::new(&(p / "norm2"), cfg),
            fc1: nn::linear(p / "fc1", h, inner, Default::default()),
            fc2: nn::linear(p / "fc2", inner, h, Default::default()),
        }
    }

    pub fn forward(&self, x: &Tensor, cond: Option<&Tensor>) -> Tensor {
        let mut x = x.shallow_clone();
        if let (Some(norm), Some(attn)) = (&self.norm1, &self.attn) {
            x = &x + attn.forward(&norm.forward(&x, cond));
        }
        let y = self.fc2.forward(&self.fc1.forward(&self.norm2.forward(&x, cond)).gelu("none"));
        x + y
    }
}

/// Embeds the standardised log-viscosity into the condition vector.
#[derive(Debug)]
pub struct Conditioner {
    fc1: nn::Linear,
    fc2: nn::Linear,
}

impl Conditioner {
    pub fn new(p: &nn::Path, cfg: &ModelConfig) -> Conditioner {
        let h = cfg.hidden as i64;
        Conditioner {
            fc1: nn::linear(p / "fc1", 1, h, Default::default()),
            fc2: nn::linear(p / "fc2", h, h, Default::default()),
        }
    }

    /// `nu`: `(B,)` → `(B, H)`.
    pub fn forward(&self, nu: &Tensor) -> Tensor {
        self.fc2.forward(&self.fc1.forward(&nu.unsqueeze(-1)).silu())
    }
}

/// Perceiver decoder: query positions cross-attend to the tokens, then an MLP reads out u.
#[derive(Debug)]
pub struct Decoder {
    query: nn::Linear,
    norm: nn::LayerNorm,
    kv: nn::Linear,
    out: nn::Linear,
    fc1: nn::Linear,
    fc2: nn::Linear,
    heads: i64,
}

impl Decoder {
    pub fn new(p: &nn::Path, cfg: &ModelConfig) -> Decoder {
        let h = cfg.hidden as i64;
        Decoder {
            query: nn::linear(p / "query", 2 * FREQS, h, Default::default()),
            norm: nn::layer_norm(p / "norm", vec![h], Default::default()),
            kv: nn::linear(p / "kv", h, 2 * h, Default::default()),
            out: nn::linear(p / "out", h, h, Default::default()),
            fc1: nn::linear(p / "fc1", h, h, Default::default()),
            fc2: nn::linear(p / "fc2", h, 1, Default::default()),
            heads: cfg.heads as i64,
        }
    }

    /// `tokens`: `(B, T, H)`, `xq`: `(B, Q)` query positions → `(B, Q)`.
    pub fn forward(&self, tokens: &Tensor, xq: &Tensor) -> Tensor {
        let (b, t, h) = tokens.size3().expect("tokens is (batch, tokens, hidden)");
        let q_len = xq.size()[1];
        let dh = h / self.heads;
        let q = self.query.forward(&fourier_features(xq)); // (B, Q, H)
        let q_heads = q.view([b, q_len, self.heads, dh]).transpose(1, 2);
        let kv = self.kv.forward(&self.norm.forward(tokens)).view([b, t, 2, self.heads, dh]);
        let kv = kv.permute([2, 0, 3, 1, 4]);
        let (k, v) = (kv.get(0), kv.get(1));
        let attn = (q_heads.matmul(&k.transpose(-2, -1)) / (dh as f64).sqrt()).softmax(-1, Kind::Float);
        let y = attn.matmul(&v).transpose(1, 2).contiguous().view([b, q_len, h]);
        let y = &q + self.out.forward(&y);
        self.fc2.forward(&self.fc1.forward(&y).gelu("none")).squeeze_dim(-1)
    }
}

/// The whole operator, with its units in build order.
#[derive(Debug)]
pub struct Operator {
    pub encoder: Encoder,
    pub conditioner: Option<Conditioner>,
    /// `stages[s][b]`: block `b` of stage `s`.
    pub stages: Vec<Vec<Block>>,
    pub decoder: Decoder,
}

/// The names of the model's units in build order, as used in `model.build/<unit>` phases.
pub fn unit_names(cfg: &ModelConfig) -> Vec<String> {
    let mut names = vec!["encoder".to_string()];
    if cfg.conditioning {
        names.push("conditioner".into());
    }
    for (s, &depth) in cfg.depths.iter().enumerate() {
        for b in 0..depth {
            names.push(format!("stage{s}.block{b}"));
        }
    }
    names.push("decoder".into());
    names
}

impl Operator {
    /// Builds the model unit by unit; `on_unit` is called before each unit is built (the trainer
    /// emits a `model.build/<unit>` phase and fires faults there).
    /// `running_mean` adds the encoder's frozen running-mean parameter (see
    /// [`Encoder::update_running_mean`]).
    pub fn build(
        p: &nn::Path,
        cfg: &ModelConfig,
        running_mean: bool,
        mut on_unit: impl FnMut(&str, &mut dyn FnMut()),
    ) -> Operator {
        let mut encoder = None;
        on_unit("encoder", &mut || encoder = Some(Encoder::new(&(p / "encoder"), cfg, running_mean)));
        let mut conditioner = None;
        if cfg.conditioning {
            on_unit("conditioner", &mut || conditioner = Some(Conditioner::new(&(p / "conditioner"), cfg)));
        }
        let mut stages = Vec::with_capacity(cfg.depths.len());
        for (s, &depth) in cfg.depths.iter().enumerate() {
            let mut blocks = Vec::with_capacity(depth as usize);
            for b in 0..depth {
                let path = p / format!("stage{s}") / format!("block{b}");
                on_unit(&format!("stage{s}.block{b}"), &mut || blocks.push(Block::new(&path, cfg)));
            }
            stages.push(blocks);
        }
        let mut decoder = None;
        on_unit("decoder", &mut || decoder = Some(Decoder::new(&(p / "decoder"), cfg)));
        Operator {
            encoder: encoder.expect("on_unit must run the build of `encoder`"),
            conditioner,
            stages,
            decoder: decoder.expect("on_unit must run the build of `decoder`"),
        }
    }

    /// Every parameter tensor the forward pass reads, under its `VarStore` name, so FSDP can
    /// replace each with a view of its unit's gathered flat parameter.
    pub fn params_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        let mut out = Params::new();
        let e = &mut self.encoder;
        linear_params(&mut e.proj_in, "encoder.proj_in", &mut out);
        linear_params(&mut e.proj_out, "encoder.proj_out", &mut out);
        out.push(("encoder.pos".into(), &mut e.pos));
        if let Some(r) = e.running_mean.as_mut() {
            out.push(("encoder.running_mean".into(), r));
        }
        if let Some(c) = self.conditioner.as_mut() {
            linear_params(&mut c.fc1, "conditioner.fc1", &mut out);
            linear_params(&mut c.fc2, "conditioner.fc2", &mut out);
        }
        for (s, blocks) in self.stages.iter_mut().enumerate() {
            for (b, block) in blocks.iter_mut().enumerate() {
                let p = format!("stage{s}.block{b}");
                for (name, n) in [("norm1", block.norm1.as_mut()), ("norm2", Some(&mut block.norm2))] {
                    if let Some(n) = n {
                        layer_norm_params(&mut n.norm, &format!("{p}.{name}.norm"), &mut out);
                        if let Some(m) = n.modulation.as_mut() {
                            linear_params(m, &format!("{p}.{name}.modulation"), &mut out);
                        }
                    }
                }
                if let Some(a) = block.attn.as_mut() {
                    linear_params(&mut a.qkv, &format!("{p}.attn.qkv"), &mut out);
                    linear_params(&mut a.out, &format!("{p}.attn.out"), &mut out);
                }
                linear_params(&mut block.fc1, &format!("{p}.fc1"), &mut out);
                linear_params(&mut block.fc2, &format!("{p}.fc2"), &mut out);
            }
        }
        let d = &mut self.decoder;
        linear_params(&mut d.query, "decoder.query", &mut out);
        layer_norm_params(&mut d.norm, "decoder.norm", &mut out);
        linear_params(&mut d.kv, "decoder.kv", &mut out);
        linear_params(&mut d.out, "decoder.out", &mut out);
        linear_params(&mut d.fc1, "decoder.fc1", &mut out);
        linear_params(&mut d.fc2, "decoder.fc2", &mut out);
        out
    }

    /// `u`: `(B, G)` at time t on grid `x`, `nu`: `(B,)`, `xq`: `(B, Q)` → prediction `(B, Q)` at t+1.
    /// `skip_last_block` leaves the last block out (its parameters then get no gradient).
    pub fn forward(&self, u: &Tensor, x: &Tensor, nu: &Tensor, xq: &Tensor, skip_last_block: bool) -> Tensor {
        let cond = self.conditioner.as_ref().map(|c| c.forward(nu));
        let mut tokens = self.encoder.forward(u, x);
        let blocks: Vec<&Block> = self.stages.iter().flatten().collect();
        let used = if skip_last_block { blocks.len().saturating_sub(1) } else { blocks.len() };
        for block in &blocks[..used] {
            tokens = block.forward(&tokens, cond.as_ref());
        }
        self.decoder.forward(&tokens, xq)
    }
}
