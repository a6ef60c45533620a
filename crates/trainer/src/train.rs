//! The training loop: data → model → AdamW steps, with a marker at every phase and faults fired at
//! the beginning of the phase they name.

use std::time::{Duration, Instant};

use tch::nn::OptimizerConfig;
use tch::{Device, Kind, Reduction, Tensor, nn};

use crate::protocol::Marker;
use crate::scenario::{Mode, Scenario};

use super::amp;
use super::burgers;
use super::checkpoint;
use super::ddp::{Ddp, params_checksum};
use super::device;
use super::dist::{self, Collective, Store, connect_nccl, connect_tcp};
use super::faults::{Effect, Faults};
use super::fsdp::Fsdp;
use super::loader::Loader;
use super::markers::{self, Phase};
use super::model::Operator;
use super::optim::{self, AdamW};

/// Who this process is, from the torchrun environment (defaults: rank 0 of 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankEnv {
    pub rank: u32,
    pub world_size: u32,
    pub local_rank: u32,
    /// Ranks on this machine (`LOCAL_WORLD_SIZE`; `WORLD_SIZE` when unset).
    pub local_world_size: u32,
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
            local_world_size: read("LOCAL_WORLD_SIZE", read("WORLD_SIZE", 1)?)?,
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

pub use crate::error::TrainError;

/// How a finished training went.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub steps: u64,
    pub first_loss: f64,
    pub final_loss: f64,
    pub losses: Vec<f64>,
    /// Steps run by this process (fewer than `steps` after a resume).
    pub steps_run: u64,
    /// The trainer's own clock over the steps this process ran: the whole loop (first step's
    /// start to last step's end), and the parts of it spent waiting for data and computing.
    pub loop_s: f64,
    pub data_s: f64,
    pub compute_s: f64,
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

/// The collective backend of a multi-rank run whose tensors live on `device`, connected through
/// the rendezvous store.
fn init_distributed(
    scenario: &Scenario,
    env: &RankEnv,
    faults: &Faults,
    device: Device,
) -> Result<(Store, Box<dyn Collective>), TrainError> {
    let (phase, _) = enter(faults, "dist.init", None)?;
    let backend = dist::resolve(scenario.launch.backend, device);
    if backend == dist::Backend::Nccl && !device.is_cuda() {
        return Err(TrainError::Unsupported(
            "`launch.backend: nccl` needs CUDA tensors, but this rank trains on the CPU (`device: auto` \
             found no GPU for it); use `device: cuda` on a GPU machine, or `backend: tcp` or `auto`"
                .into(),
        ));
    }
    let timeout = Duration::from_secs_f64(scenario.limits.timeout_s);
    let (rank, world) = (env.rank as usize, env.world_size as usize);
    let store = Store::connect(&env.master_addr, env.master_port, env.rank == 0, world, timeout)?;
    let coll = match (backend, device) {
        (dist::Backend::Nccl, Device::Cuda(gpu)) => connect_nccl(&store, rank, world, gpu, timeout)?,
        _ => connect_tcp(&store, rank, world, &ring_host(&env.master_addr, env.master_port), timeout)?,
    };
    phase.end();
    Ok((store, coll))
}

/// The address this rank's ring listener binds and publishes: the one this host reaches
/// `MASTER_ADDR` through (on another node than rank 0's, `MASTER_ADDR` is not ours to bind);
/// `MASTER_ADDR` itself when it is a loopback address or the route cannot be found.
fn ring_host(master_addr: &str, master_port: u16) -> String {
    use std::net::{ToSocketAddrs, UdpSocket};
    let Some(master) = (master_addr, master_port).to_socket_addrs().ok().and_then(|mut a| a.next()) else {
        return master_addr.to_string();
    };
    if master.ip().is_loopback() {
        return master_addr.to_string();
    }
    // Connecting a UDP socket sends nothing; it only picks the route and so the local address.
    let any = if master.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
    UdpSocket::bind(any)
        .and_then(|s| s.connect(master).and_then(|()| s.local_addr()))
        .map_or_else(|_| master_addr.to_string(), |a| a.ip().to_string())
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

/// How this rank's parameters are shared with the others.
enum Parallel {
    /// One rank: the model's own trainable parameters, sorted by name.
    Single(Vec<(String, Tensor)>),
    Ddp(Ddp),
    Fsdp(Fsdp),
}

/// Trains the scenario's model on this rank. Markers report every phase; the caller turns an
/// error into an `error` marker and exit status 1.
///
/// Long: it reads top to bottom as the phases its markers report (start, data generation,
/// rendezvous, model build, resume, data loader, the step loop, checkpoint), and each phase's
/// state (device, collective, wrapped model, optimizer, loader, fault plan) is used by the next,
/// and the step loop (the hot path the benchmarks measure) keeps every tensor in local scope.
pub fn train(scenario: &Scenario, env: RankEnv) -> Result<Summary, TrainError> {
    let mode = scenario.launch.mode;
    if mode == Mode::Single && env.world_size > 1 {
        return Err(TrainError::Environment(format!(
            "`WORLD_SIZE={}` but the scenario's `launch.mode` is `single`; use `ddp` or `fsdp` for more than one rank",
            env.world_size
        )));
    }
    let probe = super::cuda::probe();
    let gpus = device::Gpus { count: probe.device_count, why_not: probe.why_not.clone() };
    let chosen =
        device::choose(scenario.launch.device, &gpus, env.local_rank, env.local_world_size, device::forced());
    markers::emit(&Marker::Start {
        pid: std::process::id(),
        rank: env.rank,
        world_size: env.world_size,
        device: chosen.as_ref().map_or_else(|_| "none".to_string(), |d| device::name(*d)),
        libtorch: env!("UPS_DOCTOR_LIBTORCH_VERSION").into(),
        intra_op_threads: tch::get_num_threads() as i64,
    });
    let faults = Faults::for_rank(scenario, env.rank);
    let (start, _) = enter(&faults, "start", None)?;
    let device = chosen.map_err(TrainError::Device)?;
    if let Device::Cuda(gpu) = device {
        println!("training on cuda:{gpu} ({} GPU(s) visible){}", gpus.count, amp_note(scenario));
    }
    start.end();
    let mut dist =
        if mode != Mode::Single { Some(init_distributed(scenario, &env, &faults, device)?) } else { None };

    tch::manual_seed(scenario.train.seed as i64);
    let d = &scenario.data;
    let (phase, _) = enter(&faults, "data.generate", None)?;
    let data = burgers::generate(d.samples as i64, d.grid as i64, d.timesteps as i64, &mut |done, total| {
        markers::emit(&Marker::Progress { phase: "data.generate".into(), done, total })
    });
    phase.end();

    let vs = nn::VarStore::new(device);
    let mut build_error = None;
    let running_mean = Faults::needs_running_mean(scenario);
    let mut model = Operator::build(&vs.root(), &scenario.model, running_mean, |unit, build| {
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
    let mut par = match (mode, dist.as_mut()) {
        (Mode::Ddp, Some((_, coll))) => {
            let (phase, _) = enter(&faults, "ddp.init", None)?;
            let ddp = Ddp::new(&vs, coll.as_mut(), t.find_unused_parameters)?;
            phase.end();
            Parallel::Ddp(ddp)
        }
        (Mode::Fsdp, Some((_, coll))) => {
            let (phase, _) = enter(&faults, "fsdp.init", None)?;
            let fsdp = Fsdp::new(&vs, coll.as_mut())?;
            phase.end();
            Parallel::Fsdp(fsdp)
        }
        _ => {
            let mut params: Vec<(String, Tensor)> =
                vs.variables().into_iter().filter(|(_, t)| t.requires_grad()).collect();
            params.sort_by(|a, b| a.0.cmp(&b.0));
            Parallel::Single(params)
        }
    };
    // What the optimizer updates (whole parameters, or this rank's FSDP shards) and what a
    // checkpoint of this rank holds (every variable by name, or the shards by unit).
    let opt_params: Vec<Tensor> = match &par {
        Parallel::Single(p) => p.iter().map(|(_, t)| t.shallow_clone()).collect(),
        Parallel::Ddp(ddp) => ddp.params(),
        Parallel::Fsdp(fsdp) => fsdp.shards(),
    };
    let saved: Vec<(String, Tensor)> = match &par {
        Parallel::Fsdp(fsdp) => {
            fsdp.layout().into_iter().zip(fsdp.shards()).map(|((unit, ..), t)| (unit, t)).collect()
        }
        _ => {
            let mut all: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
            all.sort_by(|a, b| a.0.cmp(&b.0));
            all
        }
    };
    let mut opt = AdamW::new(&opt_params, t.weight_decay);
    // libtorch's optimizer `zero_grad` sets `.grad` back to undefined (`set_to_none`), which tch
    // offers no other way to do; DDP's unused-parameter detection needs exactly that. This
    // optimizer is never stepped.
    let mut grad_reset = nn::Sgd::default().build(&vs, 0.0)?;

    let accum = t.accum_steps.max(1) as u64;
    let mut losses = Vec::with_capacity(t.steps as usize);
    let mut first_step = 0;
    let mut batches_drawn = 0u64;
    if let Some(from) = &t.resume {
        let (phase, _) = enter(&faults, "checkpoint.load", None)?;
        let path = checkpoint::resolve(std::path::Path::new(from))?;
        let meta = checkpoint::read_meta(&path, mode_name(mode), env.world_size)?;
        let file_rank = if mode == Mode::Fsdp { env.rank } else { 0 };
        checkpoint::read_rank_file(&path, file_rank, &saved, &mut opt)?;
        // The data order continues where it stopped: the loader replays the sampler's decisions.
        batches_drawn = meta.batches_drawn;
        first_step = meta.step;
        losses = meta.losses;
        println!("resumed from {} at step {first_step}", path.display());
        phase.end();
    }
    // The data path: the cache and the loader's workers, like a DataLoader iterator created
    // right before the loop.
    let (phase, _) = enter(&faults, "data.loader", None)?;
    let batches = t.steps * accum;
    let mut loader =
        Loader::start(scenario, env.rank, env.world_size, &data, batches, batches_drawn, device)?;
    phase.end();

    let loop_start = Instant::now();
    let mut steps_done = first_step;
    let (mut data_total_ms, mut compute_total_ms) = (0.0, 0.0);
    'training: for step in first_step..t.steps {
        let (mut data_ms, mut compute_ms, mut loss_sum) = (0.0, 0.0, 0.0);
        if let (Parallel::Fsdp(fsdp), Some((_, coll))) = (&mut par, dist.as_mut()) {
            let (phase, _) = enter(&faults, "allgather", Some(step))?;
            fsdp.gather(&mut model, coll.as_mut())?;
            compute_ms += phase.end();
        }
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
            batches_drawn += 1;
            data_ms += phase.end();

            let (phase, effect) = enter(&faults, "forward", Some(step))?;
            if let Parallel::Ddp(ddp) = &mut par {
                ddp.before_forward(env.rank as usize)?;
            }
            if effect == Effect::InplaceView {
                model.encoder.update_running_mean(&batch.u)?;
            }
            let skip_last_block = effect == Effect::UnusedParam;
            let mut loss = amp::autocast(t.amp, device, || {
                let pred = model.forward(&batch.u, loader.x(), &batch.nu, &batch.xq, skip_last_block);
                pred.f_mse_loss(&batch.target, Reduction::Mean)
            })?;
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
        let grads: Vec<Tensor> = match (&mut par, dist.as_mut()) {
            (Parallel::Single(p), _) => p.iter().map(|(_, t)| t.grad()).collect(),
            (Parallel::Ddp(ddp), Some((_, coll))) => {
                let (phase, _) = enter(&faults, "allreduce", Some(step))?;
                ddp.sync_gradients(coll.as_mut())?;
                loss = global_loss(coll.as_mut(), loss, device)?;
                compute_ms += phase.end();
                ddp.params().iter().map(Tensor::grad).collect()
            }
            (Parallel::Fsdp(fsdp), Some((_, coll))) => {
                let (phase, _) = enter(&faults, "reduce_scatter", Some(step))?;
                let grads = fsdp.shard_grads(coll.as_mut())?;
                loss = global_loss(coll.as_mut(), loss, device)?;
                compute_ms += phase.end();
                grads
            }
            _ => unreachable!("ddp and fsdp always have a collective"),
        };
        let (phase, _) = enter(&faults, "optimizer", Some(step))?;
        let mut norm_sq = optim::squared_norm(&grads)?;
        if let (Parallel::Fsdp(_), Some((_, coll))) = (&par, dist.as_mut()) {
            // Each rank holds a slice of the gradient: the global norm sums their squares. The
            // sum stays a tensor (float32 on the wire, as PyTorch's FSDP sends it); no rank reads it.
            let mut total = norm_sq.to_kind(Kind::Float).reshape([1]);
            coll.all_reduce_sum(&mut total)?;
            norm_sq = total.to_kind(Kind::Double).reshape([] as [i64; 0]);
        }
        optim::clip_to(&grads, &norm_sq.sqrt(), GRAD_CLIP_NORM)?;
        opt.step(&opt_params, &grads, t.lr * warmup_factor(step, t.steps))?;
        grad_reset.zero_grad();
        compute_ms += phase.end();

        losses.push(loss);
        steps_done = step + 1;
        data_total_ms += data_ms;
        compute_total_ms += compute_ms;
        markers::emit(&Marker::Step {
            step,
            loss,
            data_ms,
            compute_ms,
            samples: d.batch_size as u64 * accum,
        });
        if (step + 1) % (t.steps / 10).max(1) == 0 || step + 1 == t.steps {
            let rate = (step + 1 - first_step) as f64 / loop_start.elapsed().as_secs_f64();
            println!("step {}/{}  loss {loss:.5}  {rate:.1} steps/s", step + 1, t.steps);
        }
        if t.checkpoint_every > 0 && steps_done % t.checkpoint_every == 0 {
            let meta = checkpoint::Meta {
                format: checkpoint::FORMAT,
                step: steps_done,
                mode: mode_name(mode).into(),
                world_size: env.world_size,
                files: match mode {
                    Mode::Fsdp => (0..env.world_size).map(|r| format!("rank{r}.ot")).collect(),
                    _ => vec!["rank0.ot".into()],
                },
                batches_drawn,
                losses: losses.clone(),
            };
            save_checkpoint(t, &env, &faults, &meta, &saved, &opt, dist.as_mut().map(|(_, c)| c))?;
        }
    }
    let loop_s = loop_start.elapsed().as_secs_f64();
    if let Some((store, _)) = dist.as_ref() {
        end_of_training_barrier(store, env.rank, env.world_size, &faults)?;
    }
    let checksum = match (&par, dist.as_mut()) {
        (Parallel::Ddp(ddp), _) => ddp.checksum(),
        (Parallel::Fsdp(fsdp), Some((_, coll))) => fsdp.checksum(coll.as_mut())?,
        _ => params_checksum(saved.iter().map(|(_, t)| t)),
    };
    let summary = Summary {
        steps: steps_done,
        first_loss: losses.first().copied().unwrap_or(f64::NAN),
        final_loss: losses.last().copied().unwrap_or(f64::NAN),
        losses,
        steps_run: steps_done - first_step,
        loop_s,
        data_s: data_total_ms / 1e3,
        compute_s: compute_total_ms / 1e3,
    };
    markers::emit(&Marker::Done {
        steps: summary.steps,
        first_loss: summary.first_loss,
        final_loss: summary.final_loss,
        checksum: Some(checksum),
        optimizer_state_bytes: Some(opt.state_bytes()),
    });
    Ok(summary)
}

/// The scenario's `launch.mode` as written in files.
fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Single => "single",
        Mode::Ddp => "ddp",
        Mode::Fsdp => "fsdp",
    }
}

/// The mean of every rank's loss: what a one-rank run on the global batch would report.
fn global_loss(coll: &mut dyn Collective, loss: f64, device: Device) -> Result<f64, TrainError> {
    let mut global = Tensor::from_slice(&[loss as f32]).to_device(device);
    coll.all_reduce_sum(&mut global)?;
    Ok(f64::try_from(global)? / coll.world_size() as f64)
}

/// Saves a checkpoint: rank 0 (or, under FSDP, every rank) writes its file into a temporary
/// directory, every rank waits for the others, then rank 0 renames it into place.
fn save_checkpoint(
    t: &crate::scenario::Train,
    env: &RankEnv,
    faults: &Faults,
    meta: &checkpoint::Meta,
    saved: &[(String, Tensor)],
    opt: &AdamW,
    mut coll: Option<&mut Box<dyn Collective>>,
) -> Result<(), TrainError> {
    let dir = std::path::Path::new(&t.checkpoint_dir);
    let step = meta.step;
    let (phase, _) = enter(faults, "checkpoint.save", Some(step))?;
    if env.rank == 0 {
        std::fs::create_dir_all(dir)
            .map_err(|e| checkpoint::CheckpointError::Io { path: dir.into(), what: e.to_string() })?;
        checkpoint::begin_save(dir, step)?;
    }
    if let Some(coll) = coll.as_mut() {
        coll.barrier()?;
    }
    if env.rank == 0 || meta.mode == "fsdp" {
        checkpoint::write_rank_file(dir, step, env.rank, saved, opt)?;
    }
    // From here until rank 0 renames the directory, a rank that dies leaves the save incomplete:
    // the others fail in this barrier and nothing is renamed.
    let (commit, _) = enter(faults, "checkpoint.commit", Some(step))?;
    if let Some(coll) = coll.as_mut() {
        coll.barrier()?;
    }
    if env.rank == 0 {
        let done = checkpoint::commit(dir, meta)?;
        println!("checkpoint saved: {}", done.display());
    }
    commit.end();
    phase.end();
    Ok(())
}

/// `, bf16 autocast` when the scenario asks for it.
fn amp_note(scenario: &Scenario) -> &'static str {
    if scenario.train.amp { ", bf16 autocast" } else { "" }
}

#[cfg(test)]
mod ring_host_tests {
    use super::ring_host;

    #[test]
    fn the_ring_binds_loopback_as_given_and_elsewhere_an_address_of_this_host() {
        assert_eq!(ring_host("127.0.0.1", 29500), "127.0.0.1");
        assert_eq!(ring_host("localhost", 29500), "localhost");
        // A remote MASTER_ADDR: the local end of the route to it, which this host can bind (or
        // the address itself when there is no route, as before).
        let host = ring_host("192.0.2.1", 29500);
        assert!(host == "192.0.2.1" || std::net::TcpListener::bind((host.as_str(), 0)).is_ok(), "{host}");
    }
}
