//! What a batch is and how it is made.
//!
//! The trainer decides every batch — which training pairs, and a seed for its query points —
//! the way PyTorch's DataLoader samples indices in the main process ([`Sampler`]). Building the
//! batch ([`make_batch`]) is a pure function of (dataset, [`BatchSpec`]): the trainer itself,
//! a forked worker and a spawned worker all produce the same bits, so the worker count and start
//! method never change the loss curve.

use tch::{Kind, Tensor};

use crate::scenario::Data;

/// The data's shape, as the loader needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Dims {
    pub samples: i64,
    pub timesteps: i64,
    pub grid: i64,
    pub queries: i64,
    /// Samples per batch on this rank.
    pub batch: i64,
    /// Augmentation passes per sample (`data.augment_passes`).
    pub augment: i64,
}

impl Dims {
    pub fn of(d: &Data) -> Dims {
        Dims {
            samples: d.samples.into(),
            timesteps: d.timesteps.into(),
            grid: d.grid.into(),
            queries: d.queries.into(),
            batch: d.batch_size.into(),
            augment: d.augment_passes.into(),
        }
    }

    /// Floats of the cached trajectories `(S·T·G)` and of the viscosity feature `(S)`.
    pub fn cache_floats(&self) -> (usize, usize) {
        ((self.samples * self.timesteps * self.grid) as usize, self.samples as usize)
    }

    /// Floats of one batch: `u (B, G)`, `nu (B)`, `xq (B, Q)`, `target (B, Q)`.
    pub fn batch_floats(&self) -> [usize; 4] {
        let (b, g, q) = (self.batch as usize, self.grid as usize, self.queries as usize);
        [b * g, b, b * q, b * q]
    }
}

/// One batch: inputs on the whole grid, targets at the query points.
pub struct Batch {
    pub u: Tensor,
    pub nu: Tensor,
    pub xq: Tensor,
    pub target: Tensor,
}

/// Everything that decides a batch; decided by the trainer, built anywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchSpec {
    /// Position in this rank's stream of batches (0-based).
    pub seq: u64,
    /// The optimizer step that consumes it (`seq / accum_steps`).
    pub step: u64,
    /// Seed of the global batch's query points.
    pub seed: u64,
    /// Index of this rank's first sample within the global batch.
    pub first: u64,
    /// Training pairs `sample · (timesteps − 1) + time`, this rank's slice.
    pub pairs: Vec<i64>,
}

/// The cached dataset as tensors: raw trajectories and the statistics to normalise them.
pub struct DatasetView {
    /// `(samples · timesteps, grid)`, raw `f32`.
    pub frames: Tensor,
    /// `(samples,)` standardised `log10 ν`.
    pub nu: Tensor,
    pub mean: f64,
    pub std: f64,
}

/// SplitMix64: small, fast, and the same on every process and machine.
#[derive(Debug, Clone)]
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (multiply-high; the bias is below 2⁻⁴⁰ for the sizes used here).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// Decides batches epoch by epoch.
///
/// Every rank draws the same global batch (`batch × world` pairs from the same seeded epoch
/// permutation, last incomplete batch dropped, like `DistributedSampler` with `drop_last`) and
/// keeps its own contiguous slice: within an epoch no two ranks see the same pair, and a run on
/// `world` ranks sees exactly the batches of a one-rank run with a `world` times larger batch.
/// Query points are drawn per sample from the global batch's seed and the sample's index in the
/// global batch, so that holds for them too. The generator is the sampler's own (not libtorch's):
/// batches decided ahead for prefetching never shift the random numbers of the training step.
pub struct Sampler {
    dims: Dims,
    rank: i64,
    world: i64,
    accum: u64,
    rng: SplitMix,
    /// This epoch's permutation of the pairs, and how far it has been consumed.
    order: Vec<i64>,
    cursor: usize,
    seq: u64,
}

impl Sampler {
    pub fn new(dims: Dims, rank: u32, world: u32, seed: u64, accum: u32) -> Sampler {
        Sampler {
            dims,
            rank: rank.into(),
            world: world.into(),
            accum: u64::from(accum.max(1)),
            rng: SplitMix(seed ^ 0x5eed_da7a_10ad_e400),
            order: Vec::new(),
            cursor: 0,
            seq: 0,
        }
    }

    pub fn next_spec(&mut self) -> BatchSpec {
        let pairs = self.dims.samples * (self.dims.timesteps - 1);
        let global = (self.dims.batch * self.world) as usize;
        let seed = self.rng.next_u64();
        let picks: Vec<i64> = if pairs as usize >= global {
            if self.cursor + global > self.order.len() {
                // A new epoch: Fisher–Yates over every pair.
                self.order = (0..pairs).collect();
                for i in (1..self.order.len()).rev() {
                    let j = self.rng.below(i as u64 + 1) as usize;
                    self.order.swap(i, j);
                }
                self.cursor = 0;
            }
            let pick = self.order[self.cursor..self.cursor + global].to_vec();
            self.cursor += global;
            pick
        } else {
            // Fewer pairs than one global batch: draw with replacement.
            (0..global).map(|_| self.rng.below(pairs as u64) as i64).collect()
        };
        let first = (self.rank * self.dims.batch) as usize;
        let spec = BatchSpec {
            seq: self.seq,
            step: self.seq / self.accum,
            seed,
            first: first as u64,
            pairs: picks[first..first + self.dims.batch as usize].to_vec(),
        };
        self.seq += 1;
        spec
    }
}

/// Query points of the sample at `index` in the global batch: `queries` distinct grid points,
/// a partial Fisher–Yates shuffle driven by the batch seed and the index.
fn query_points(seed: u64, index: u64, grid: i64, queries: i64, out: &mut Vec<i64>) {
    let mut rng = SplitMix(seed ^ SplitMix(index).next_u64());
    let mut points: Vec<i64> = (0..grid).collect();
    for k in 0..queries as usize {
        let r = k + rng.below((grid as usize - k) as u64) as usize;
        points.swap(k, r);
    }
    out.extend_from_slice(&points[..queries as usize]);
}

/// Translates every row of `x (n, G)` by `shift (n,)` grid points (fractional) around the
/// periodic grid, exactly, through the Fourier series: `x(· − s)`.
fn translate(x: &Tensor, shift: &Tensor) -> Tensor {
    let g = x.size()[1];
    let k = Tensor::arange(g / 2 + 1, (Kind::Float, x.device()));
    let angle = shift.unsqueeze(1) * k.unsqueeze(0) * (-2.0 * std::f64::consts::PI / g as f64);
    let phase = Tensor::polar(&angle.ones_like(), &angle);
    (x.fft_rfft(None, -1, "backward") * phase).fft_irfft(g, -1, "backward")
}

/// Random sub-grid translations of the sample at `index` in the global batch, one per pass, in
/// grid points.
fn augment_shifts(seed: u64, index: u64, grid: i64, passes: i64, out: &mut Vec<f32>) {
    let mut rng = SplitMix(seed ^ SplitMix(index ^ 0xa116_0000_0000_0000).next_u64());
    for _ in 0..passes {
        out.push((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * grid as f32);
    }
}

/// Builds one batch: samples query points, gathers inputs and targets, normalises them.
///
/// With `augment` passes, each pass translates the sample's input and next snapshot by the same
/// random sub-grid amount (through an rfft/irfft pair). Burgers' equation on a periodic grid is
/// translation-equivariant, so every translated pair is as true as the original; the passes are
/// there to make building a batch as costly as a real input pipeline's augmentations.
pub fn make_batch(data: &DatasetView, dims: &Dims, spec: &BatchSpec) -> Batch {
    let n = spec.pairs.len() as i64;
    let mut q = Vec::with_capacity((n * dims.queries) as usize);
    for i in 0..n as u64 {
        query_points(spec.seed, spec.first + i, dims.grid, dims.queries, &mut q);
    }
    // Indices live where the data does (a `cache_device: cuda` cache is on the GPU).
    let on = data.frames.device();
    let q = Tensor::from_slice(&q).view([n, dims.queries]).to_device(on);
    let pick = Tensor::from_slice(&spec.pairs).to_device(on);
    let s = pick.divide_scalar_mode(dims.timesteps - 1, "floor");
    let row = &s * dims.timesteps + pick.remainder(dims.timesteps - 1);
    let mut now = data.frames.index_select(0, &row);
    let mut next = data.frames.index_select(0, &(&row + 1));
    if dims.augment > 0 {
        let mut shifts = Vec::with_capacity((n * dims.augment) as usize);
        for i in 0..n as u64 {
            augment_shifts(spec.seed, spec.first + i, dims.grid, dims.augment, &mut shifts);
        }
        let shifts = Tensor::from_slice(&shifts).view([n, dims.augment]);
        for p in 0..dims.augment {
            let shift = shifts.select(1, p);
            now = translate(&now, &shift);
            next = translate(&next, &shift);
        }
    }
    let u = (now - data.mean) / data.std;
    let next = next.gather(1, &q, false);
    Batch {
        target: (next - data.mean) / data.std,
        xq: q.to_kind(Kind::Float) / dims.grid as f64,
        nu: data.nu.index_select(0, &s),
        u,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(batch: i64) -> Dims {
        Dims { samples: 6, timesteps: 4, grid: 16, queries: 5, batch, augment: 0 }
    }

    #[test]
    fn ranks_split_the_global_batch_like_one_rank_with_a_larger_batch() {
        let mut one = Sampler::new(dims(4), 0, 1, 3, 1);
        let mut r0 = Sampler::new(dims(2), 0, 2, 3, 1);
        let mut r1 = Sampler::new(dims(2), 1, 2, 3, 1);
        for _ in 0..10 {
            let (a, b, c) = (one.next_spec(), r0.next_spec(), r1.next_spec());
            assert_eq!([b.pairs.clone(), c.pairs.clone()].concat(), a.pairs);
            assert_eq!((b.seed, c.seed, c.first), (a.seed, a.seed, 2));
        }
    }

    #[test]
    fn an_epoch_visits_every_pair_once() {
        // 6 samples × 3 pairs = 18 pairs, batches of 6: three batches make one epoch.
        let mut s = Sampler::new(dims(6), 0, 1, 9, 2);
        let mut seen: Vec<i64> = (0..3).flat_map(|_| s.next_spec().pairs).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..18).collect::<Vec<_>>());
        assert_eq!(s.next_spec().step, 1, "accumulation: two batches per step");
    }

    #[test]
    fn query_points_are_distinct_grid_points() {
        let mut q = Vec::new();
        query_points(42, 7, 16, 16, &mut q);
        q.sort_unstable();
        assert_eq!(q, (0..16).collect::<Vec<_>>());
    }

    #[test]
    fn a_batch_is_a_pure_function_of_the_spec() {
        let d = dims(3);
        let frames = Tensor::arange(d.samples * d.timesteps * d.grid, (Kind::Float, tch::Device::Cpu))
            .view([d.samples * d.timesteps, d.grid]);
        let view = DatasetView {
            frames,
            nu: Tensor::zeros([6], (Kind::Float, tch::Device::Cpu)),
            mean: 1.0,
            std: 2.0,
        };
        let spec = Sampler::new(d, 0, 1, 1, 1).next_spec();
        let (a, b) = (make_batch(&view, &d, &spec), make_batch(&view, &d, &spec));
        assert!(a.u.equal(&b.u) && a.target.equal(&b.target) && a.xq.equal(&b.xq));
        assert_eq!(a.u.size(), [3, 16]);
        assert_eq!(a.target.size(), [3, 5]);
        // The target is the next snapshot at the query points, normalised.
        let pair = spec.pairs[0];
        let row = pair / 3 * 4 + pair % 3;
        let x = (f64::try_from(a.xq.get(0).get(0)).unwrap() * 16.0).round() as i64;
        let want = (((row + 1) * 16 + x) as f64 - 1.0) / 2.0;
        assert_eq!(f64::try_from(a.target.get(0).get(0)).unwrap(), want);
    }

    #[test]
    fn a_whole_grid_translation_is_a_roll() {
        let x = Tensor::randn([3, 16], (Kind::Float, tch::Device::Cpu));
        let moved = translate(&x, &Tensor::from_slice(&[1f32, 5.0, 16.0]));
        for (i, by) in [1, 5, 16].into_iter().enumerate() {
            let want = x.get(i as i64).roll([by], [0]);
            assert!(moved.get(i as i64).allclose(&want, 1e-5, 1e-5, false), "shift {by}");
        }
        // Fractional shifts compose: a half step twice is one step (for a signal without a
        // Nyquist component, which a fractional shift cannot keep real).
        let grid = Tensor::arange(16, (Kind::Float, tch::Device::Cpu)) * (2.0 * std::f64::consts::PI / 16.0);
        let smooth = Tensor::stack(&[grid.sin(), (&grid * 3.0).cos(), (&grid * 7.0).sin() + 0.5], 0);
        let half = Tensor::from_slice(&[0.5f32, 0.5, 0.5]);
        let twice = translate(&translate(&smooth, &half), &half);
        assert!(twice.allclose(&smooth.roll([1], [1]), 1e-4, 1e-4, false));
    }

    #[test]
    fn augmented_batches_stay_a_pure_function_of_the_spec_and_translate_input_and_target_together() {
        let d = Dims { augment: 3, ..dims(3) };
        // Every frame is the same smooth wave moved one point per snapshot.
        let x = Tensor::arange(d.grid, (Kind::Float, tch::Device::Cpu)) * (2.0 * std::f64::consts::PI / 16.0);
        let frames = Tensor::stack(
            &(0..d.samples * d.timesteps)
                .map(|r| (&x - r as f64 * 2.0 * std::f64::consts::PI / 16.0).sin())
                .collect::<Vec<_>>(),
            0,
        );
        let view = DatasetView {
            frames,
            nu: Tensor::zeros([6], (Kind::Float, tch::Device::Cpu)),
            mean: 0.0,
            std: 1.0,
        };
        let spec = Sampler::new(d, 0, 1, 1, 1).next_spec();
        let (a, b) = (make_batch(&view, &d, &spec), make_batch(&view, &d, &spec));
        assert!(a.u.equal(&b.u) && a.target.equal(&b.target));
        let plain = make_batch(&view, &Dims { augment: 0, ..d }, &spec);
        assert!(!a.u.allclose(&plain.u, 1e-3, 1e-3, false), "the passes moved the input");
        // The pair still obeys the data's law: the target is the input moved one point.
        let idx = (&a.xq * d.grid as f64).round().to_kind(Kind::Int64);
        let expect = a.u.roll([1], [1]).gather(1, &idx, false);
        assert!(a.target.allclose(&expect, 1e-4, 1e-4, false));
    }
}
