//! The training loop: data → model → AdamW steps, with a marker at every phase and faults fired at
//! the beginning of the phase they name.

use std::time::{Duration, Instant};

use tch::nn::OptimizerConfig;
use tch::{Device, Reduction, Tensor, nn};

use crate::protocol::Marker;
use crate::scenario::{Mode, Scenario};

use super::burgers;
use super::ddp::{Ddp, params_checksum};
use super::dist::{Collective, DistError, Store, connect_tcp};
use super::faults::{Effect, Faults};
use super::loader::{Loader, LoaderError};
use super::markers::{self, Phase};
use super::model::Operator;

/// Who this process is, from the torchrun environment (defaults: rank 0 of 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankEnv {
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: u32,
    /// The rendezvous store's address (`MASTER_ADDR`, `MASTER_PORT`; torchrun's defaults).
    pub master_addr: String,
    pub master_port: u16,
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
            master_addr: std::env::var("MASTER_ADDR").unwrap_or_else(|_| "127.0.0.1".into()),
            master_port: read("MASTER_PORT", 29500)?.try_into().map_err(|_| {
                TrainError::Environment("`MASTER_PORT` is not a port number (1-65535)".into())
            })?,
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
    #[error("{0}")]
    Dist(#[from] DistError),
    #[error("{0}")]
    Ddp(String),
    #[error("{0}")]
    Loader(#[from] LoaderError),
}

/// How a finished training went.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub steps: u64,
    pub first_loss: f64,
    pub final_loss: f64,
    pub losses: Vec<f64>,
}

/// Global gradient-norm limit: transformer blocks' first AdamW steps overshoot without it.
const GRAD_CLIP_NORM: f64 = 1.0;

/// Linear learning-rate warm-up over the first tenth of training (at most 50 steps).
fn warmup_factor(step: u64, steps: u64) -> f64 {
    let warmup = (steps / 10).clamp(1, 50);
    ((step + 1) as f64 / warmup as f64).min(1.0)
}

/// Enters a phase: emits `begin`, then fires any fault scheduled there. Exit faults never
/// return; `exit_error` becomes an error; other effects are returned for the loop to perform.
fn enter(faults: &Faults, name: &str, step: Option<u64>) -> Result<(Phase, Effect), TrainError> {
    let phase = Phase::begin(name, step);
    match faults.at(name, step.unwrap_or(0)) {
        Effect::ExitError => Err(TrainError::Injected { phase: name.to_string(), step: step.unwrap_or(0) }),
        effect => Ok((phase, effect)),
    }
}

/// The collective backend of a multi-rank run, connected through the rendezvous store.
fn init_distributed(
    scenario: &Scenario,
    env: &RankEnv,
    faults: &Faults,
) -> Result<(Store, Box<dyn Collective>), TrainError> {
    let (phase, _) = enter(faults, "dist.init", None)?;
    let timeout = Duration::from_secs_f64(scenario.limits.timeout_s);
    let store =
        Store::connect(&env.master_addr, env.master_port, env.rank == 0, env.world_size as usize, timeout)?;
    let coll = connect_tcp(&store, env.rank as usize, env.world_size as usize, &env.master_addr, timeout)?;
    phase.end();
    Ok((store, coll))
}

/// Waits until every rank has reached the end of training (through the store, like torch's
/// store-based barrier), so a rank that finished early waits for the others instead of
/// breaking their collectives by leaving. Rank 0 hosts the store, so it leaves last: only once
/// every other rank has said it is past the barrier.
fn end_of_training_barrier(store: &Store, rank: u32, world: u32, faults: &Faults) -> Result<(), TrainError> {
    let (phase, _) = enter(faults, "dist.barrier", None)?;
    let wait_for = |key: &str| -> Result<(), TrainError> {
        while store.add(key, 0)? < i64::from(world) {
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    };
    store.add("ups-doctor/finished", 1)?;
    wait_for("ups-doctor/finished")?;
    store.add("ups-doctor/departed", 1)?;
    if rank == 0 {
        wait_for("ups-doctor/departed")?;
    }
    phase.end();
    Ok(())
}

/// Trains the scenario's model on this rank. Markers report every phase; the caller turns an
/// error into an `error` marker and exit status 1.
pub fn train(scenario: &Scenario, env: RankEnv) -> Result<Summary, TrainError> {
    let mode = scenario.launch.mode;
    if mode == Mode::Single && env.world_size > 1 {
        return Err(TrainError::Environment(format!(
            "`WORLD_SIZE={}` but the scenario's `launch.mode` is `single`; use `ddp` for more than one rank",
            env.world_size
        )));
    }
    if mode == Mode::Fsdp {
        return Err(TrainError::Unsupported("`launch.mode: fsdp` is not supported yet".into()));
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
    let mut dist = if mode == Mode::Ddp { Some(init_distributed(scenario, &env, &faults)?) } else { None };

    tch::manual_seed(scenario.train.seed as i64);
    let d = &scenario.data;
    let (phase, _) = enter(&faults, "data.generate", None)?;
    let data = burgers::generate(d.samples as i64, d.grid as i64, d.timesteps as i64, &mut |done, total| {
        markers::emit(&Marker::Progress { phase: "data.generate".into(), done, total })
    });
    phase.end();
    // The data path: the cache and the loader's workers (started before the model is built, like
    // a DataLoader iterator created up front; they prefetch while the model is built).
    let (phase, _) = enter(&faults, "data.loader", None)?;
    let batches = scenario.train.steps * u64::from(scenario.train.accum_steps.max(1));
    let mut loader = Loader::start(scenario, env.rank, env.world_size, &data, batches)?;
    phase.end();

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
    let mut ddp = match dist.as_mut() {
        Some((_, coll)) => {
            let (phase, _) = enter(&faults, "ddp.init", None)?;
            let ddp = Ddp::new(&vs, coll.as_mut(), t.find_unused_parameters)?;
            phase.end();
            Some(ddp)
        }
        None => None,
    };
    let mut opt = nn::AdamW { wd: t.weight_decay, ..Default::default() }.build(&vs, t.lr)?;

    let accum = t.accum_steps.max(1) as u64;
    let mut losses = Vec::with_capacity(t.steps as usize);
    let loop_start = Instant::now();
    let mut steps_done = 0;
    'training: for step in 0..t.steps {
        let (mut data_ms, mut compute_ms, mut loss_sum) = (0.0, 0.0, 0.0);
        for _ in 0..accum {
            let (phase, effect) = enter(&faults, "data.next", Some(step))?;
            if effect == Effect::StopEarly {
                phase.end();
                break 'training;
            }
            if effect == Effect::KillWorker {
                loader.kill_worker(0);
            }
            let batch = loader.next_batch()?;
            data_ms += phase.end();

            let (phase, effect) = enter(&faults, "forward", Some(step))?;
            if let Some(ddp) = ddp.as_mut() {
                ddp.before_forward(env.rank as usize)?;
            }
            let skip_last_block = effect == Effect::UnusedParam;
            let pred = model.forward(&batch.u, loader.x(), &batch.nu, &batch.xq, skip_last_block);
            let mut loss = pred.f_mse_loss(&batch.target, Reduction::Mean)?;
            if effect == Effect::NanLoss {
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
        let mut loss = loss_sum / accum as f64;
        if let (Some(ddp), Some((_, coll))) = (ddp.as_mut(), dist.as_mut()) {
            let (phase, _) = enter(&faults, "allreduce", Some(step))?;
            ddp.sync_gradients(coll.as_mut())?;
            // Report the global loss, as a one-rank run on the global batch would.
            let mut global = Tensor::from_slice(&[loss as f32]);
            coll.all_reduce_sum(&mut global)?;
            loss = f64::try_from(global)? / f64::from(env.world_size);
            compute_ms += phase.end();
        }
        let (phase, _) = enter(&faults, "optimizer", Some(step))?;
        opt.set_lr(t.lr * warmup_factor(step, t.steps));
        opt.clip_grad_norm(GRAD_CLIP_NORM);
        opt.step();
        opt.zero_grad();
        compute_ms += phase.end();

        losses.push(loss);
        steps_done = step + 1;
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
    if let Some((store, _)) = dist.as_ref() {
        end_of_training_barrier(store, env.rank, env.world_size, &faults)?;
    }
    let checksum = match &ddp {
        Some(ddp) => ddp.checksum(),
        None => params_checksum(vs.trainable_variables().iter()),
    };
    let summary = Summary {
        steps: steps_done,
        first_loss: losses.first().copied().unwrap_or(f64::NAN),
        final_loss: losses.last().copied().unwrap_or(f64::NAN),
        losses,
    };
    markers::emit(&Marker::Done {
        steps: summary.steps,
        first_loss: summary.first_loss,
        final_loss: summary.final_loss,
        checksum: Some(checksum),
    });
    Ok(summary)
}
