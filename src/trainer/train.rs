//! The training loop: data → model → AdamW steps, with a marker at every phase and faults fired at
//! the beginning of the phase they name.

use std::time::Instant;

use tch::nn::OptimizerConfig;
use tch::{Device, Kind, Reduction, Tensor, nn};

use crate::protocol::Marker;
use crate::scenario::Scenario;

use super::burgers::{self, Trajectories};
use super::faults::{Effect, Faults};
use super::markers::{self, Phase};
use super::model::Operator;

/// Who this process is, from the torchrun environment (defaults: rank 0 of 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankEnv {
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: u32,
}

impl RankEnv {
    pub fn from_env() -> Result<RankEnv, TrainError> {
        let read = |name: &str, default: u32| -> Result<u32, TrainError> {
            match std::env::var(name) {
                Ok(v) => v.trim().parse().map_err(|_| {
                    TrainError::Environment(format!(
                        "`{name}={v}` is not a whole number; torchrun sets it to the process's rank"
                    ))
                }),
                Err(_) => Ok(default),
            }
        };
        let env = RankEnv {
            rank: read("RANK", 0)?,
            world_size: read("WORLD_SIZE", 1)?,
            local_rank: read("LOCAL_RANK", 0)?,
        };
        if env.rank >= env.world_size {
            return Err(TrainError::Environment(format!(
                "`RANK={}` is not below `WORLD_SIZE={}`",
                env.rank, env.world_size
            )));
        }
        Ok(env)
    }
}

/// Why training stopped early. Each becomes an `error` marker and exit status 1.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("injected failure: fault `exit_error` at phase `{phase}` step {step}")]
    Injected { phase: String, step: u64 },
    #[error("loss became non-finite ({loss}) at step {step}; training cannot recover from this")]
    NonFiniteLoss { step: u64, loss: f64 },
    #[error("bad rank environment: {0}")]
    Environment(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("libtorch error: {0}")]
    Torch(#[from] tch::TchError),
}

/// How a finished training went.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub steps: u64,
    pub first_loss: f64,
    pub final_loss: f64,
    pub losses: Vec<f64>,
}

/// One batch: inputs on the whole grid, targets at the query points.
struct Batch {
    u: Tensor,
    nu: Tensor,
    xq: Tensor,
    target: Tensor,
}

/// Draws random `(trajectory, time)` pairs and random query points.
struct Sampler {
    /// `(samples * timesteps, grid)`.
    frames: Tensor,
    nu: Tensor,
    x: Tensor,
    samples: i64,
    timesteps: i64,
    batch: i64,
    queries: i64,
}

impl Sampler {
    fn new(data: &Trajectories, batch: i64, queries: i64) -> Sampler {
        let (samples, timesteps, grid) = data.u.size3().expect("u is (S, T, G)");
        Sampler {
            frames: data.u.reshape([samples * timesteps, grid]),
            nu: data.nu_feature.shallow_clone(),
            x: Tensor::arange(grid, (Kind::Float, Device::Cpu)) / grid as f64,
            samples,
            timesteps,
            batch,
            queries,
        }
    }

    fn next(&self) -> Batch {
        let opts = (Kind::Int64, Device::Cpu);
        let pairs = self.samples * (self.timesteps - 1);
        let pick = Tensor::randint(pairs, [self.batch], opts);
        let s = pick.divide_scalar_mode(self.timesteps - 1, "floor");
        let t = pick.remainder(self.timesteps - 1);
        let row = &s * self.timesteps + &t;
        let u = self.frames.index_select(0, &row);
        let next = self.frames.index_select(0, &(&row + 1));
        let grid = self.x.size()[0];
        let q = Tensor::rand([self.batch, grid], (Kind::Float, Device::Cpu)).argsort(-1, false).narrow(
            1,
            0,
            self.queries,
        );
        Batch {
            target: next.gather(1, &q, false),
            xq: self.x.expand([self.batch, grid], true).gather(1, &q, false),
            nu: self.nu.index_select(0, &s),
            u,
        }
    }
}

/// Global gradient-norm limit: transformer blocks' first AdamW steps overshoot without it.
const GRAD_CLIP_NORM: f64 = 1.0;

/// Linear learning-rate warm-up over the first tenth of training (at most 50 steps).
fn warmup_factor(step: u64, steps: u64) -> f64 {
    let warmup = (steps / 10).clamp(1, 50);
    ((step + 1) as f64 / warmup as f64).min(1.0)
}

/// Enters a phase: emits `begin`, then fires any fault scheduled there.
fn enter(faults: &Faults, name: &str, step: Option<u64>) -> Result<(Phase, bool), TrainError> {
    let phase = Phase::begin(name, step);
    match faults.at(name, step.unwrap_or(0)) {
        Effect::None => Ok((phase, false)),
        Effect::NanLoss => Ok((phase, true)),
        Effect::ExitError => Err(TrainError::Injected { phase: name.to_string(), step: step.unwrap_or(0) }),
    }
}

/// Trains the scenario's model on this rank. Markers report every phase; the caller turns an
/// error into an `error` marker and exit status 1.
pub fn train(scenario: &Scenario, env: RankEnv) -> Result<Summary, TrainError> {
    if env.world_size > 1 {
        return Err(TrainError::Unsupported(format!(
            "`WORLD_SIZE={}`: multi-rank training is not supported yet (distributed training arrives with issue #3)",
            env.world_size
        )));
    }
    markers::emit(&Marker::Start {
        pid: std::process::id(),
        rank: env.rank,
        world_size: env.world_size,
        device: "cpu".into(),
        libtorch: env!("UPS_DOCTOR_LIBTORCH_VERSION").into(),
        intra_op_threads: tch::get_num_threads() as i64,
    });
    let faults = Faults::for_rank(scenario, env.rank);
    let (start, _) = enter(&faults, "start", None)?;
    start.end();

    tch::manual_seed(scenario.train.seed as i64);
    let d = &scenario.data;
    let (phase, _) = enter(&faults, "data.generate", None)?;
    let data = burgers::generate(d.samples as i64, d.grid as i64, d.timesteps as i64, &mut |done, total| {
        markers::emit(&Marker::Progress { phase: "data.generate".into(), done, total })
    });
    phase.end();
    let sampler = Sampler::new(&data, d.batch_size as i64, d.queries as i64);

    let vs = nn::VarStore::new(Device::Cpu);
    let mut build_error = None;
    let model = Operator::build(&vs.root(), &scenario.model, |unit, build| {
        if build_error.is_some() {
            return build();
        }
        match enter(&faults, &format!("model.build/{unit}"), None) {
            Ok((phase, _)) => {
                build();
                phase.end();
            }
            Err(e) => {
                build_error = Some(e);
                build();
            }
        }
    });
    if let Some(e) = build_error {
        return Err(e);
    }
    let t = &scenario.train;
    let mut opt = nn::AdamW { wd: t.weight_decay, ..Default::default() }.build(&vs, t.lr)?;

    let accum = t.accum_steps.max(1) as u64;
    let mut losses = Vec::with_capacity(t.steps as usize);
    let loop_start = Instant::now();
    for step in 0..t.steps {
        let (mut data_ms, mut compute_ms, mut loss_sum) = (0.0, 0.0, 0.0);
        for _ in 0..accum {
            let (phase, _) = enter(&faults, "data.next", Some(step))?;
            let batch = sampler.next();
            data_ms += phase.end();

            let (phase, nan) = enter(&faults, "forward", Some(step))?;
            let pred = model.forward(&batch.u, &sampler.x, &batch.nu, &batch.xq);
            let mut loss = pred.f_mse_loss(&batch.target, Reduction::Mean)?;
            if nan {
                loss *= f64::NAN;
            }
            let value = f64::try_from(&loss)?;
            compute_ms += phase.end();
            if !value.is_finite() {
                return Err(TrainError::NonFiniteLoss { step, loss: value });
            }
            loss_sum += value;

            let (phase, _) = enter(&faults, "backward", Some(step))?;
            (loss / accum as f64).f_backward()?;
            compute_ms += phase.end();
        }
        let (phase, _) = enter(&faults, "optimizer", Some(step))?;
        opt.set_lr(t.lr * warmup_factor(step, t.steps));
        opt.clip_grad_norm(GRAD_CLIP_NORM);
        opt.step();
        opt.zero_grad();
        compute_ms += phase.end();

        let loss = loss_sum / accum as f64;
        losses.push(loss);
        markers::emit(&Marker::Step {
            step,
            loss,
            data_ms,
            compute_ms,
            samples: d.batch_size as u64 * accum,
        });
        if (step + 1) % (t.steps / 10).max(1) == 0 || step + 1 == t.steps {
            let rate = (step + 1) as f64 / loop_start.elapsed().as_secs_f64();
            println!("step {}/{}  loss {loss:.5}  {rate:.1} steps/s", step + 1, t.steps);
        }
    }
    let summary = Summary {
        steps: t.steps,
        first_loss: losses.first().copied().unwrap_or(f64::NAN),
        final_loss: losses.last().copied().unwrap_or(f64::NAN),
        losses,
    };
    markers::emit(&Marker::Done {
        steps: summary.steps,
        first_loss: summary.first_loss,
        final_loss: summary.final_loss,
    });
    Ok(summary)
}
