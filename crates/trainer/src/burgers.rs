//! Pseudo-spectral solver for viscous Burgers' equation in 1D, `u_t + u u_x = ν u_xx`, periodic on
//! [0, 1): the data the operator learns from.
//!
//! Diffusion is integrated exactly (integrating factor `exp(-ν k² t)`), advection explicitly with
//! Heun's method (second-order Runge–Kutta) in conservative form `-(u²/2)_x`, with the 2/3 rule
//! against aliasing. Each sample gets its own viscosity (log-uniform) and a random smooth initial
//! condition; everything is drawn from torch's generator, so `train.seed` fixes the data set.

use std::f64::consts::PI;

use tch::{Kind, Tensor};

/// Viscosities are drawn log-uniformly from this range: wide enough to go from smooth decay to
/// steep fronts, narrow enough that the fronts stay resolved on a 64-point grid.
const NU_MIN: f64 = 3e-3;
const NU_MAX: f64 = 1e-1;
/// Simulated time span and solver step (CFL ≈ 0.13 at |u| = 1 on 128 points).
const T_END: f64 = 0.5;
const DT: f64 = 1e-3;
/// Fourier modes in the initial condition.
const INIT_MODES: i64 = 4;

/// Generated trajectories, raw, with the statistics the data loader normalises them with.
pub struct Trajectories {
    /// `(samples, timesteps, grid)`, `f32`, as solved (the loader normalises each batch).
    pub u: Tensor,
    /// Mean and (population) standard deviation of `u` over the whole set.
    pub u_mean: f64,
    pub u_std: f64,
    /// `(samples,)` standardised `log10 ν`, the conditioning input.
    pub nu_feature: Tensor,
    /// `(samples,)` raw viscosities.
    pub nu: Tensor,
}

/// The longest the solver goes without reporting progress.
pub const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// Solves `samples` trajectories on `grid` points and keeps `timesteps` snapshots of each.
/// `progress(done, total)` is called after each snapshot, and between snapshots at least every
/// [`PROGRESS_EVERY`] of wall time: a large set on a busy machine can take longer than a hang
/// limit between two snapshots, and a rank that computes must not look stuck.
pub fn generate(samples: i64, grid: i64, timesteps: i64, progress: &mut dyn FnMut(u64, u64)) -> Trajectories {
    let opts = (Kind::Double, tch::Device::Cpu);
    let x = Tensor::arange(grid, opts) / grid as f64;

    // Random smooth initial condition: a few Fourier modes with decaying amplitudes.
    let k = Tensor::arange_start(1, INIT_MODES + 1, opts); // (M,)
    let amp = Tensor::randn([samples, INIT_MODES], opts) / &k;
    let phase = Tensor::rand([samples, INIT_MODES], opts) * (2.0 * PI);
    let arg = x.view([1, 1, grid]) * k.view([1, INIT_MODES, 1]) * (2.0 * PI) + phase.unsqueeze(-1);
    let mut u = (amp.unsqueeze(-1) * arg.sin()).sum_dim_intlist(1, false, Kind::Double);
    let peak = u.abs().amax(-1, true).clamp_min(1e-6);
    u /= peak;

    let log_nu = Tensor::rand([samples], opts) * (NU_MAX.log10() - NU_MIN.log10()) + NU_MIN.log10();
    let nu = Tensor::from(10.0f64).pow(&log_nu);

    // Wavenumbers of the rfft, their square for diffusion and the 2/3 de-aliasing mask.
    let modes = grid / 2 + 1;
    let kw = Tensor::arange(modes, opts) * (2.0 * PI); // (modes,)
    let dealias = kw.le(2.0 * PI * (grid as f64) / 3.0).to_kind(Kind::Double);
    let ik = Tensor::complex(&Tensor::zeros([modes], opts), &kw);
    // Integrating factor over one half and one full step, per sample.
    let decay_full = (-(nu.view([samples, 1]) * kw.square().view([1, modes])) * DT).exp();

    let advection = |v: &Tensor| -> Tensor {
        // -(u²/2)_x in Fourier space, de-aliased.
        let flux = (v.square() * 0.5).fft_rfft(None, -1, "backward");
        -(flux * &ik) * &dealias
    };

    let total_steps = (T_END / DT).round() as i64;
    let every = (total_steps / (timesteps - 1)).max(1);
    let mut snapshots = Vec::with_capacity(timesteps as usize);
    snapshots.push(u.shallow_clone());
    let mut uh = u.fft_rfft(None, -1, "backward");
    let mut last_report = std::time::Instant::now();
    for step in 1..=every * (timesteps - 1) {
        // Heun's method on v = e^{νk²t} û: predictor, then corrector, both with the exact decay.
        let v0 = uh.fft_irfft(grid, -1, "backward");
        let n0 = advection(&v0);
        let pred = (&uh + &n0 * DT) * &decay_full;
        let v1 = pred.fft_irfft(grid, -1, "backward");
        let n1 = advection(&v1);
        uh = (&uh + &n0 * (DT / 2.0)) * &decay_full + &n1 * (DT / 2.0);
        if step % every == 0 {
            snapshots.push(uh.fft_irfft(grid, -1, "backward"));
        }
        if step % every == 0 || last_report.elapsed() >= PROGRESS_EVERY {
            progress(snapshots.len() as u64, timesteps as u64);
            last_report = std::time::Instant::now();
        }
    }
    let u = Tensor::stack(&snapshots, 1); // (S, T, G)
    // Population statistics: with a single sample the unbiased std of the viscosity is NaN, and a
    // NaN condition poisons the whole model (bisect cuts `data.samples` down to 1).
    // A spawned loader worker regenerates this set with one intra-op thread while the trainer has
    // several: the statistics are summed in a fixed order so both get the same bits.
    let (u_mean, u_std) = sequential_mean_std(&u);
    let u = u.to_kind(Kind::Float);
    let nu_feature =
        ((&log_nu - log_nu.mean(Kind::Double)) / log_nu.std(false).clamp_min(1e-8)).to_kind(Kind::Float);
    Trajectories { u, u_mean, u_std: u_std.max(1e-8), nu_feature, nu: nu.to_kind(Kind::Float) }
}

/// Mean and population standard deviation, summed left to right (independent of thread count).
fn sequential_mean_std(t: &Tensor) -> (f64, f64) {
    let values = Vec::<f64>::try_from(t.flatten(0, -1)).expect("a double tensor");
    let n = values.len().max(1) as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    (mean, var.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// libtorch's generator is process-global and tests run on parallel threads: every test that
    /// seeds it holds this lock.
    static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn same_seed_same_data_and_different_seed_different_data() {
        let _rng = RNG.lock().unwrap_or_else(|e| e.into_inner());
        tch::manual_seed(7);
        let a = generate(4, 64, 3, &mut |_, _| {});
        tch::manual_seed(7);
        let b = generate(4, 64, 3, &mut |_, _| {});
        tch::manual_seed(8);
        let c = generate(4, 64, 3, &mut |_, _| {});
        assert_eq!(a.u.size(), vec![4, 3, 64]);
        assert!(a.u.equal(&b.u));
        assert!(!a.u.equal(&c.u));
    }

    #[test]
    fn a_single_sample_gives_finite_features() {
        let _rng = RNG.lock().unwrap_or_else(|e| e.into_inner());
        tch::manual_seed(3);
        let t = generate(1, 16, 2, &mut |_, _| {});
        assert_eq!(i64::try_from(t.u.isfinite().all()).unwrap(), 1);
        assert_eq!(i64::try_from(t.nu_feature.isfinite().all()).unwrap(), 1);
    }

    #[test]
    fn viscosity_smooths_the_solution_and_mass_is_conserved() {
        // Periodic Burgers conserves the mean of u; diffusion decreases the energy.
        let _rng = RNG.lock().unwrap_or_else(|e| e.into_inner());
        tch::manual_seed(1);
        let t = generate(8, 128, 5, &mut |_, _| {});
        assert_eq!(i64::try_from(t.u.isfinite().all()).unwrap(), 1);
        let mean_per_time = t.u.mean_dim(-1, false, Kind::Double); // (S, T)
        let drift = (&mean_per_time - mean_per_time.select(1, 0).unsqueeze(1)).abs().max();
        assert!(f64::try_from(drift).unwrap() < 1e-4, "mean drifted");
        let energy = t.u.square().mean_dim(-1, false, Kind::Double); // (S, T)
        let first = energy.select(1, 0);
        let last = energy.select(1, 4);
        let grew = last.gt_tensor(&(&first + 1e-6)).any();
        assert_eq!(i64::try_from(grew).unwrap(), 0, "energy must not grow");
        let nu_min = f64::try_from(t.nu.min()).unwrap();
        let nu_max = f64::try_from(t.nu.max()).unwrap();
        assert!(nu_min >= NU_MIN * 0.999 && nu_max <= NU_MAX * 1.001);
    }
}
