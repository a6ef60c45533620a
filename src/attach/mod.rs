//! `ups-doctor attach`: diagnoses a PyTorch job that is already running and was never started
//! under ups-doctor, read-only. From one pid it finds the job ([`job`]: launcher, ranks, their
//! DataLoader workers), watches every process over a short window ([`watch`]: state, CPU time,
//! wait channels, Python stacks by `py-spy dump --nonblocking`, memory, `/dev/shm`; [`gpu`]:
//! NVML's readings of every GPU and each process's GPU memory), judges it
//! ([`judge`], through the one judge of [`crate::diagnose`]) and writes the same run folder as
//! `run` (`result.json`, `report.md`) plus `attach.json`.
//!
//! It must never change the job: no signal is sent to any of its processes and nothing is written
//! into them (py-spy's `--nonblocking` reads memory without stopping the process; `--native`
//! needs a ptrace stop and is only taken when asked for).

pub mod gpu;
pub mod job;
pub mod judge;
mod machine;
pub mod nodes;
pub mod slurm;
pub mod stop;
pub mod tcp;
pub mod watch;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::{Error, exit};

use judge::State;
use machine::{Judging, Local, stop_and_record, tell, write_attach};

/// `ups-doctor attach`'s flags.
#[derive(clap::Args, Debug)]
pub struct AttachArgs {
    /// The job's launcher (torchrun, `python -m torch.distributed.run`, the `mp.spawn` parent) or
    /// any of its ranks; several pids: one report each.
    #[arg(value_name = "PID", required_unless_present_any = ["all", "slurm", "slurm_probe"])]
    pub pids: Vec<u32>,
    /// List the PyTorch jobs on this machine, each with the pid to attach to.
    #[arg(long, conflicts_with_all = ["out", "watch"])]
    pub all: bool,
    /// Folder for the report [default: reports/runs/<time>-attach].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Seconds to watch the job: stacks are read several times over it, so a thread that moves is
    /// told from one that is stuck.
    #[arg(long, value_name = "SECONDS", default_value_t = 3.0)]
    pub watch: f64,
    /// Native frames too (`py-spy dump --native`): pauses each process while its stack is read
    /// (a ptrace stop; still no signal). Without it the job never stops.
    #[arg(long)]
    pub native: bool,
    /// What to do with the job once its evidence is written: `stop` ends it in order (SIGTERM to
    /// the launcher and ranks, SIGKILL 10 s later to what is left). Without it nothing is
    /// signalled.
    #[arg(long, value_name = "ACTION", value_parser = ["stop"], conflicts_with = "all")]
    pub then: Option<String>,
    /// Nodes the job runs on: start `ups-doctor attach PID --nodes N --node-rank R --coordinator
    /// HOST:PORT` on each, with a pid of the job there; node 0 writes the one report.
    #[arg(
        long,
        value_name = "N",
        help_heading = "Across nodes",
        conflicts_with = "all",
        requires = "node_rank"
    )]
    pub nodes: Option<u32>,
    /// This node's rank: 0 gathers the others and judges every rank.
    #[arg(long, value_name = "R", help_heading = "Across nodes", requires = "nodes")]
    pub node_rank: Option<u32>,
    /// Node 0's address, which every other node connects to [default: 127.0.0.1:29411].
    #[arg(long, value_name = "HOST:PORT", help_heading = "Across nodes", requires = "nodes")]
    pub coordinator: Option<String>,
    /// What node 0 listens on, when not the coordinator's address (`0.0.0.0:PORT`: every interface).
    #[arg(long, value_name = "ADDR:PORT", help_heading = "Across nodes", requires = "nodes")]
    pub listen: Option<String>,
    /// How long node 0 waits for the others to join, and they for it.
    #[arg(long, value_name = "SECS", default_value_t = 120.0, help_heading = "Across nodes")]
    pub join_timeout: f64,
    /// A whole Slurm job (or one step of it), from a login or batch host: a read-only probe on each
    /// of its nodes through `srun --jobid JOBID --overlap`, node 0's report under `--out`/node0
    /// (a folder the nodes share). Nothing is signalled.
    #[arg(
        long,
        value_name = "JOBID[.STEP]",
        help_heading = "Across nodes",
        conflicts_with_all = ["pids", "all", "nodes", "node_rank", "coordinator", "listen"]
    )]
    pub slurm: Option<String>,
    /// One probe of `--slurm`, started on each node by its srun.
    #[arg(long, value_name = "JOBID[.STEP]", hide = true, conflicts_with_all = ["pids", "all", "slurm", "nodes"])]
    pub slurm_probe: Option<String>,
}

/// Runs `ups-doctor attach`.
pub fn command(args: AttachArgs) -> Result<u8, Error> {
    if args.all {
        return list();
    }
    if !(args.watch.is_finite() && args.watch >= 0.5 && args.watch <= 3600.0) {
        return Err(Error::BadInput(format!(
            "--watch {} is not between 0.5 and 3600 seconds; e.g. `--watch 3`",
            args.watch
        )));
    }
    let slurm_options = || slurm::Options {
        out: args.out.clone(),
        watch: args.watch,
        native: args.native,
        join_timeout: args.join_timeout,
        stop: args.then.is_some(),
    };
    if let Some(job) = &args.slurm {
        return slurm::command(job, &slurm_options());
    }
    if let Some(job) = &args.slurm_probe {
        let placed = slurm::probe(job, &slurm_options())?;
        let part = nodes::Part {
            pid: placed.pid,
            out: &placed.out,
            window: placed.window,
            native: args.native,
            stop: false,
        };
        return match placed.config {
            Some(config) => Ok(if nodes::attach(part, config)? { exit::MET } else { exit::NOT_MET }),
            None => attach_one(placed.pid, &placed.out, placed.window, args.native, false)
                .map(|state| if state == State::Running { exit::MET } else { exit::NOT_MET }),
        };
    }
    // Only the flags place a node: an attach started inside a Slurm allocation or beside
    // torchrun's variables is still on this machine alone unless it says otherwise.
    let flags = crate::nodes::config::NodeFlags {
        nodes: args.nodes,
        node_rank: args.node_rank,
        coordinator: args.coordinator.clone(),
        listen: args.listen.clone(),
        join_timeout_s: Some(args.join_timeout),
    };
    let port_only =
        |name: &str| (name == crate::nodes::config::PORT_ENV).then(|| std::env::var(name).ok()).flatten();
    let config = crate::nodes::NodeConfig::resolve(&flags, &port_only).map_err(|e| Error::BadInput(e.0))?;
    if let Some(config) = config.filter(|c| c.nodes > 1) {
        let [pid] = args.pids[..] else {
            return Err(Error::BadInput(format!(
                "`--nodes {}` attaches to one job: give one pid (this node's launcher or one of its ranks), not {}",
                config.nodes,
                args.pids.len()
            )));
        };
        let out = match &args.out {
            Some(dir) => dir.clone(),
            None => crate::session::fresh_run_dir(Path::new("reports/runs"), &format!("-attach-{pid}"))?,
        };
        let part = nodes::Part {
            pid,
            out: &out,
            window: Duration::from_secs_f64(args.watch),
            native: args.native,
            stop: args.then.as_deref() == Some("stop"),
        };
        return Ok(if nodes::attach(part, config)? { exit::MET } else { exit::NOT_MET });
    }
    let mut worst = exit::MET;
    for (i, &pid) in args.pids.iter().enumerate() {
        let out = match (&args.out, args.pids.len()) {
            (Some(dir), 1) => dir.clone(),
            (Some(dir), _) => dir.join(pid.to_string()),
            (None, _) => crate::session::fresh_run_dir(Path::new("reports/runs"), &format!("-attach-{pid}"))?,
        };
        if i > 0 {
            eprintln!();
        }
        let stop = args.then.as_deref() == Some("stop");
        let state = attach_one(pid, &out, Duration::from_secs_f64(args.watch), args.native, stop)?;
        if state != State::Running {
            worst = exit::NOT_MET;
        }
    }
    Ok(worst)
}

fn attach_one(pid: u32, out: &Path, window: Duration, native: bool, stop: bool) -> Result<State, Error> {
    let job = job::find(pid).map_err(|e| Error::BadInput(e.to_string()))?;
    // The values of its secret flags (`--api-key X`) are masked wherever they appear (its stacks,
    // its output), not only after the flag.
    crate::secrets::learn(&serde_json::json!(job.command));
    // Who is signalled if the job is to be stopped: as first seen, before the window.
    let (heads, everyone) = job.first_seen();
    let local = Local::observe(pid, job, window, native);
    let mut judging = Judging::alone(&local);
    let several = local.job.several_nodes_hint(pid);
    judging.front.extend(several.clone());
    let (state, mut run, mut attach) = local.judge(judging);
    let mut report = write_attach(out, &run, &attach)?;
    if stop {
        report = stop_and_record(out, &mut run, &mut attach, &heads, &everyone)?;
    }
    tell(&run, &local.views, &report);
    if let Some(hint) = several {
        eprintln!("hint: {hint}");
    }
    Ok(state)
}

/// `ups-doctor attach --all`: the PyTorch jobs on this machine.
fn list() -> Result<u8, Error> {
    let (jobs, unreadable) = job::all();
    if jobs.is_empty() {
        println!(
            "no PyTorch job found on this machine (no process with RANK/LOCAL_RANK and WORLD_SIZE, no `mp.spawn` parent with PyTorch loaded)"
        );
    }
    // CPU over half a second, every rank at once.
    let ticks = |pid: u32| {
        procfs::process::Process::new(pid as i32)
            .and_then(|p| p.stat())
            .ok()
            .map(|s| (s.utime + s.stime, s.state))
    };
    let before: Vec<Vec<Option<(u64, char)>>> =
        jobs.iter().map(|j| j.ranks.iter().map(|r| ticks(r.pid)).collect()).collect();
    let pause = Duration::from_millis(500);
    if !jobs.is_empty() {
        std::thread::sleep(pause);
    }
    let hz = procfs::ticks_per_second() as f64;
    let boot = procfs::boot_time_secs().unwrap_or(0);
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    for (j, first) in jobs.iter().zip(before) {
        let attach_to = j.launcher.unwrap_or(j.ranks[0].pid);
        let since = crate::probe::memory::read_stat(attach_to)
            .map(|s| now.saturating_sub(boot + (s.start_ticks as f64 / hz) as u64))
            .map_or("?".to_string(), |s| humantime::format_duration(Duration::from_secs(s)).to_string());
        let cpu: Vec<String> = j
            .ranks
            .iter()
            .zip(first)
            .map(|(r, a)| match (a, ticks(r.pid)) {
                (Some((a, _)), Some((b, state))) => {
                    format!("{}:{state} {:.0}%", r.rank, (b - a) as f64 / hz / pause.as_secs_f64() * 100.0)
                }
                _ => format!("{}:gone", r.rank),
            })
            .collect();
        let found: Vec<u32> = j.ranks.iter().map(|r| r.rank).collect();
        let of = j.world_size.map(|w| format!(" of {w}")).unwrap_or_default();
        let argv: Vec<&str> = j.command.iter().map(|a| a.rsplit('/').next().unwrap_or(a)).collect();
        println!(
            "pid {attach_to}: {}\n  {}{of}, running for {since}, CPU {}\n  ups-doctor attach {attach_to}",
            argv.join(" "),
            judge::ranks_text(&found),
            cpu.join(", ")
        );
        if let Some(hint) = j.several_nodes_hint(attach_to) {
            println!("  ({hint})");
        }
    }
    if !unreadable.is_empty() {
        println!(
            "{} process(es) of other users could not be read (run as root to list their jobs)",
            unreadable.len()
        );
    }
    Ok(exit::MET)
}
