//! `ups-doctor train --loader-only` (hidden): the data path of a scenario without the model, to
//! measure the data loader on its own against PyTorch's DataLoader (bench/). It generates the
//! data exactly as training does, starts the same loader (workers, start method, cache) and
//! draws every batch training would draw, then prints one summary line on stdout.

use std::time::Instant;

use crate::scenario::Scenario;

use super::burgers;
use super::device;
use super::loader::{Loader, cache};
use super::train::{RankEnv, TrainError};

/// What a loader-only run measured, on the process's own clock.
#[derive(Debug, Clone, PartialEq)]
pub struct LoaderSummary {
    pub batches: u64,
    pub batch_size: u64,
    /// From the start of the loader (cache built, workers started) to the first batch in hand.
    pub first_batch_s: f64,
    /// From the start of the loader to the last batch in hand.
    pub total_s: f64,
    /// Batches drawn before the steady-state clock starts: every worker's prefetch once.
    pub warm: u64,
    /// From batch `warm` in hand to the last batch in hand.
    pub steady_s: f64,
    /// [`cache::checksum`] of the generated data.
    pub checksum: u64,
}

impl LoaderSummary {
    /// Samples per second after the warm-up batches.
    pub fn steady_samples_per_s(&self) -> f64 {
        ((self.batches - self.warm) * self.batch_size) as f64 / self.steady_s.max(1e-9)
    }
}

/// Runs the scenario's data path for `train.steps × train.accum_steps` batches.
pub fn run(scenario: &Scenario, env: RankEnv) -> Result<LoaderSummary, TrainError> {
    // Batches go to the device training would use, so a GPU rank's copy to it is measured too.
    let probe = super::cuda::probe();
    let gpus = device::Gpus { count: probe.device_count, why_not: probe.why_not.clone() };
    let on =
        device::choose(scenario.launch.device, &gpus, env.local_rank, env.local_world_size, device::forced())
            .map_err(TrainError::Device)?;
    tch::manual_seed(scenario.train.seed as i64);
    let d = &scenario.data;
    let data = burgers::generate(d.samples as i64, d.grid as i64, d.timesteps as i64, &mut |_, _| {});
    let checksum = cache::checksum(&data);
    let batches = scenario.train.steps * u64::from(scenario.train.accum_steps.max(1));
    let warm = (u64::from(d.workers) * u64::from(d.prefetch)).clamp(1, batches.saturating_sub(1).max(1));
    let start = Instant::now();
    let mut loader = Loader::start(scenario, env.rank, env.world_size, &data, batches, 0, on)?;
    let (mut first, mut warm_at) = (None, None);
    for k in 1..=batches {
        drop(loader.next_batch()?);
        let now = Instant::now();
        first.get_or_insert(now);
        if k == warm {
            warm_at = Some(now);
        }
    }
    let end = Instant::now();
    let since = |t: Option<Instant>| t.map_or(0.0, |t| t.duration_since(start).as_secs_f64());
    Ok(LoaderSummary {
        batches,
        batch_size: d.batch_size.into(),
        first_batch_s: since(first),
        total_s: end.duration_since(start).as_secs_f64(),
        warm,
        steady_s: warm_at.map_or(0.0, |w| end.duration_since(w).as_secs_f64()),
        checksum,
    })
}
