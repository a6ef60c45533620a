//! `ups-doctor attach`: diagnoses a PyTorch job that is already running and was never started
//! under ups-doctor, read-only. From one pid it finds the job ([`job`]: launcher, ranks, their
//! DataLoader workers), watches every process over a short window ([`watch`]: state, CPU time,
//! wait channels, Python stacks by `py-spy dump --nonblocking`, memory, `/dev/shm`), judges it
//! ([`judge`], through the one judge of [`crate::diagnose`]) and writes the same run folder as
//! `run` (`result.json`, `report.md`) plus `attach.json`.
//!
//! It must never change the job: no signal is sent to any of its processes and nothing is written
//! into them (py-spy's `--nonblocking` reads memory without stopping the process; `--native`
//! needs a ptrace stop and is only taken when asked for).

pub mod job;
pub mod judge;
pub mod nodes;
pub mod stop;
pub mod tcp;
pub mod watch;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::json;

use crate::scenario::{LaunchStyle, Scenario};
use crate::schema::{ExternalRun, ExternalStyle, ProcessDump, ProcessRole, RunResult, ScenarioResult};
use crate::{Error, exit};

use judge::{Motion, State};

/// `ups-doctor attach`'s flags.
#[derive(clap::Args, Debug)]
pub struct AttachArgs {
    /// The job's launcher (torchrun, `python -m torch.distributed.run`, the `mp.spawn` parent) or
    /// any of its ranks; several pids: one report each.
    #[arg(value_name = "PID", required_unless_present = "all")]
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

/// Whether a py-spy error is a refusal to read the process (ptrace permission).
fn refused(error: &str) -> bool {
    ["Permission denied", "Operation not permitted", "EPERM", "ptrace"].iter().any(|n| error.contains(n))
}

/// The one message for stacks that cannot be read, with the fix.
fn ptrace_hint(pids: &[u32]) -> String {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .map(|s| format!("`kernel.yama.ptrace_scope` is {} here", s.trim()))
        .unwrap_or_else(|_| "this kernel has no Yama ptrace_scope".to_string());
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    format!(
        "stacks cannot be read: py-spy was refused access to pid {} (reading another process's memory needs ptrace \
         permission; {scope}). Fix: run `ups-doctor attach` as the job's user or as root; or `sudo sysctl \
         kernel.yama.ptrace_scope=0`; in a container start it with `--cap-add SYS_PTRACE`",
        list.join(", ")
    )
}

fn size(bytes: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    if bytes as f64 >= 1024.0 * MIB {
        format!("{:.2} GiB", bytes as f64 / (1024.0 * MIB))
    } else {
        format!("{:.1} MiB", bytes as f64 / MIB)
    }
}

/// The last look at every process below a rank (its DataLoader workers), as dumps of that rank.
fn child_dumps(job: &job::Job, watched: &[watch::Watched]) -> Vec<(u32, ProcessDump)> {
    job.ranks
        .iter()
        .flat_map(|r| r.children.iter().map(move |&c| (r.rank, c)))
        .filter_map(|(rank, c)| {
            let w = watched.iter().find(|w| w.pid == c)?;
            let last = w.looks.last()?;
            Some((
                rank,
                ProcessDump {
                    pid: c,
                    rank,
                    role: ProcessRole::Child,
                    taken: Some(judge::TAKEN.to_string()),
                    py_spy: last.py_spy.clone(),
                    error: last.error.clone(),
                    threads: last.threads.clone(),
                },
            ))
        })
        .collect()
}

/// What an attach saw, for the evidence it puts before the judge's.
struct Seen<'a> {
    pid: u32,
    job: &'a job::Job,
    watched: &'a [watch::Watched],
    started_at: &'a str,
    window_s: f64,
    looks: u32,
    native: bool,
}

impl Seen<'_> {
    /// When and how the job was read, what was found, what could not be read, memory and
    /// `/dev/shm`: the lines before the judge's evidence.
    fn evidence(&self, found: &[u32], of: &str, refused_pids: &[u32], shm: &watch::Shm) -> Vec<String> {
        let mut front = vec![format!(
            "attached at {} to a job already running (not started under ups-doctor), found from pid {}; \
             watched {:.1} s, {} looks at each of its {} processes; read-only: no signal sent, nothing written \
             into its processes; stacks by {}",
            self.started_at,
            self.pid,
            self.window_s,
            self.looks,
            self.watched.len(),
            if self.native {
                "`py-spy dump --native` (each process paused while read)"
            } else {
                "`py-spy dump --nonblocking` (never stopped)"
            }
        )];
        front.push(format!(
            "the job: {}{}; {}{of} found here{}",
            match self.job.launcher {
                Some(l) => format!("launcher pid {l}"),
                None => "no launcher (ranks started one by one)".to_string(),
            },
            self.job.master.as_ref().map(|m| format!(", MASTER_ADDR:PORT {m}")).unwrap_or_default(),
            judge::ranks_text(found),
            self.job.run_id.as_ref().map(|r| format!(", TORCHELASTIC_RUN_ID {r}")).unwrap_or_default()
        ));
        if !refused_pids.is_empty() {
            let hint = ptrace_hint(refused_pids);
            eprintln!("warning: {hint}");
            front.push(hint);
        }
        if !self.job.unreadable.is_empty() {
            front.push(format!(
                "environments not readable (another user's processes), so not judged as ranks: pid {}",
                self.job.unreadable.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
            ));
        }
        for r in &self.job.ranks {
            let mem = |p: u32| self.watched.iter().find(|w| w.pid == p).and_then(|w| w.memory);
            if let Some(m) = mem(r.pid) {
                let kids: Vec<_> = r.children.iter().filter_map(|&c| mem(c)).collect();
                let workers = if kids.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; {} process(es) below it (DataLoader workers?) PSS {} together",
                        kids.len(),
                        size(kids.iter().map(|k| k.pss).sum())
                    )
                };
                front.push(format!(
                    "rank {} memory: PSS {}, USS {}{workers}",
                    r.rank,
                    size(m.pss),
                    size(m.uss)
                ));
            }
        }
        front.push(format!(
            "/dev/shm: {} of {} used, {} file(s)",
            size(shm.used),
            size(shm.total),
            shm.segments.len()
        ));
        front
    }

    /// `attach.json`: the state, every process as seen (state at the first and last look, CPU used,
    /// memory, py-spy's refusals), the ranks' classes and what nothing was sent to.
    #[expect(
        clippy::too_many_arguments,
        reason = "the parts of one attach's findings, each computed once by attach_one"
    )]
    fn record(
        &self,
        state: State,
        culprit: Option<u32>,
        found: &[u32],
        missing: &[u32],
        views: &[judge::RankView],
        refused_pids: &[u32],
        shm: &watch::Shm,
    ) -> serde_json::Value {
        let processes: Vec<serde_json::Value> = self
            .watched
            .iter()
            .map(|w| {
                let role = if Some(w.pid) == self.job.launcher {
                    json!({"role": "launcher"})
                } else if let Some(r) = self.job.ranks.iter().find(|r| r.pid == w.pid) {
                    json!({"role": "rank", "rank": r.rank})
                } else {
                    let r = self.job.ranks.iter().find(|r| r.children.contains(&w.pid)).map(|r| r.rank);
                    json!({"role": "child", "rank": r})
                };
                json!({
                    "pid": w.pid,
                    "who": role,
                    "state_first": w.looks.first().and_then(|l| l.state).map(String::from),
                    "state_last": w.looks.last().and_then(|l| l.state).map(String::from),
                    "cpu_used_s": w.cpu_used_s(),
                    "pss": w.memory.map(|m| m.pss),
                    "uss": w.memory.map(|m| m.uss),
                    "py_spy_errors": w.looks.iter().filter_map(|l| l.error.clone()).collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({
            "attached_to": self.pid,
            "state": state.as_str(),
            "attached_at": self.started_at,
            "window_s": self.window_s,
            "looks": self.looks,
            "native": self.native,
            "signalled": [],
            "launcher": self.job.launcher,
            "command": self.job.command,
            "world_size": self.job.world_size,
            "local_world_size": self.job.local_world_size,
            "master": self.job.master,
            "torchelastic_run_id": self.job.run_id,
            "ranks_found": found,
            "ranks_missing": missing,
            "culprit": culprit,
            "ranks": views.iter().map(|v| json!({
                "rank": v.rank, "pid": v.pid, "motion": v.motion.as_str(), "cpu_used_s": v.cpu_s,
                "place": v.place(), "stack_looks": v.looks,
            })).collect::<Vec<_>>(),
            "classes": judge::classes(views).iter().map(|(ranks, place, motion)| json!({
                "ranks": ranks, "place": place, "motion": motion,
            })).collect::<Vec<_>>(),
            "unreadable": self.job.unreadable,
            "stacks_refused": refused_pids,
            "dev_shm": {"used": shm.used, "total": shm.total, "files": shm.segments.len()},
            "processes": processes,
        })
    }
}

fn attach_one(pid: u32, out: &Path, window: Duration, native: bool, stop: bool) -> Result<State, Error> {
    let job = job::find(pid).map_err(Error::BadInput)?;
    // Who is signalled if the job is to be stopped: as first seen, before the window.
    let (heads, everyone) = job.first_seen();
    let local = Local::observe(pid, job, window, native);
    let missing = local.job.missing();
    let judging = Judging {
        views: local.views.clone(),
        children: local.children.clone(),
        missing,
        world: local.job.world_size,
        scope: judge::HERE.to_string(),
        front: local.front(),
        nodes: None,
    };
    let (judged, mut run, mut attach) = local.judge(judging);
    let mut report = write_attach(out, &run, &attach)?;
    if stop {
        report = stop_and_record(out, &mut run, &mut attach, &heads, &everyone)?;
    }
    tell(&judged, &local.views, &report);
    Ok(judged.state)
}

/// What one machine's window saw of the job, before it is judged.
struct Local {
    pid: u32,
    job: job::Job,
    started_at: String,
    /// When the window began (ns since the Unix epoch, this machine's clock).
    started_ns: i64,
    window_s: f64,
    looks: u32,
    native: bool,
    py_spy: Option<PathBuf>,
    watched: Vec<watch::Watched>,
    shm: watch::Shm,
    views: Vec<judge::RankView>,
    children: Vec<(u32, ProcessDump)>,
    refused_pids: Vec<u32>,
    connections: tcp::Connections,
}

/// What the judge is given: one machine's ranks, or every node's.
struct Judging {
    views: Vec<judge::RankView>,
    children: Vec<(u32, ProcessDump)>,
    missing: Vec<u32>,
    world: Option<u32>,
    /// Where ranks not found were looked for (`on this machine`).
    scope: String,
    /// The evidence before the judge's.
    front: Vec<String>,
    nodes: Option<crate::schema::NodesReport>,
}

impl Local {
    /// Watches every process of `job` over `window`, read-only.
    fn observe(pid: u32, job: job::Job, window: Duration, native: bool) -> Local {
        let started = SystemTime::now();
        let started_ns = crate::nodes::clock::now_ns();
        let started_at = humantime::format_rfc3339_seconds(started).to_string();
        let py_spy = watch::find_py_spy(job.ranks[0].pid);
        let found: Vec<u32> = job.ranks.iter().map(|r| r.rank).collect();
        let of = job.world_size.map(|w| format!(" of WORLD_SIZE {w}")).unwrap_or_default();
        eprintln!(
            "attaching to {} (pid {}): {}{of}; watching {:.1} s, read-only",
            job.command.iter().map(|a| a.rsplit('/').next().unwrap_or(a)).collect::<Vec<_>>().join(" "),
            job.launcher.unwrap_or(job.ranks[0].pid),
            judge::ranks_text(&found),
            window.as_secs_f64()
        );
        let options = watch::Options { window, looks: 4, native, py_spy: py_spy.clone() };
        let watched = watch::watch(&job.pids(), &options);
        let shm = watch::dev_shm();
        let window_s = window.as_secs_f64();
        let rank_pids: Vec<(u32, u32)> = job.ranks.iter().map(|r| (r.rank, r.pid)).collect();
        let views = judge::view(&rank_pids, &watched, window_s);
        let children = child_dumps(&job, &watched);
        // What the window could not read: named, with the fix once.
        let refused_pids: Vec<u32> = watched
            .iter()
            .filter(|w| w.looks.iter().any(|l| l.error.as_deref().is_some_and(refused)))
            .map(|w| w.pid)
            .collect();
        let connections = tcp::read(&job);
        Local {
            pid,
            job,
            started_at,
            started_ns,
            window_s,
            looks: options.looks,
            native,
            py_spy,
            watched,
            shm,
            views,
            children,
            refused_pids,
            connections,
        }
    }

    fn found(&self) -> Vec<u32> {
        self.job.ranks.iter().map(|r| r.rank).collect()
    }

    fn seen(&self) -> Seen<'_> {
        Seen {
            pid: self.pid,
            job: &self.job,
            watched: &self.watched,
            started_at: &self.started_at,
            window_s: self.window_s,
            looks: self.looks,
            native: self.native,
        }
    }

    /// This machine's evidence before the judge's: how the job was read, memory, `/dev/shm`,
    /// its connections.
    fn front(&self) -> Vec<String> {
        let found = self.found();
        let of = self.job.world_size.map(|w| format!(" of WORLD_SIZE {w}")).unwrap_or_default();
        let mut front = self.seen().evidence(&found, &of, &self.refused_pids, &self.shm);
        let expected: Vec<u32> = found.iter().chain(&self.job.missing()).copied().collect();
        front.extend(self.connections.sentence(&expected));
        front
    }

    /// The job as a scenario: its command, its world, its launch style.
    fn scenario(&self, world: Option<u32>, nodes: u32) -> Scenario {
        Scenario {
            name: format!("attach-{}", self.pid),
            command: Some(self.job.command.clone()),
            launch: crate::scenario::Launch {
                world_size: world.unwrap_or(self.job.ranks.len() as u32),
                nodes,
                style: if self.job.launcher.is_some() { LaunchStyle::Launcher } else { LaunchStyle::PerRank },
                ..Default::default()
            },
            ..Scenario::default()
        }
    }

    /// Judges `what` (this machine's ranks, or every node's) and makes the run's result and
    /// `attach.json`.
    fn judge(&self, what: Judging) -> (judge::Judged, RunResult, serde_json::Value) {
        let Judging { views, children, missing, world, scope, front, nodes } = what;
        let scenario = self.scenario(world, nodes.as_ref().map_or(1, |n| n.nodes));
        let window_s = self.window_s;
        let mut judged = judge::conclude(&scenario, &views, &missing, world, &children, window_s, &scope);
        let mut evidence = front;
        evidence.append(&mut judged.verdict.evidence);
        judged.verdict.evidence = evidence;
        let pid = self.pid;
        let external = ExternalRun {
            argv: self.job.command.clone(),
            style: if self.job.launcher.is_some() { ExternalStyle::Launcher } else { ExternalStyle::PerRank },
            style_chosen: Some(format!(
                "attached to a running job from pid {pid}: ups-doctor did not start it"
            )),
            markers_seen: false,
            completion: format!("attached read-only for {window_s:.1} s (state {})", judged.state.as_str()),
            launcher: None,
            py_spy: self.py_spy.as_ref().map(|p| p.display().to_string()),
            world_size_declared: None,
        };
        for r in &mut judged.ranks {
            r.identified_by = self.job.ranks.iter().find(|k| k.rank == r.rank).map(|k| k.by);
        }
        let result = ScenarioResult {
            name: scenario.name.clone(),
            file: format!("(attached to pid {pid})"),
            overrides: Vec::new(),
            scenario,
            outcome: judged.outcome,
            met_expectation: judged.state == State::Running,
            interrupted: false,
            expectation_mismatches: Vec::new(),
            verdict: judged.verdict.clone(),
            first_failure: judged.culprit,
            ranks: judged.ranks.clone(),
            wall_s: window_s,
            steps_per_s: None,
            samples_per_s: None,
            memory: None,
            leftovers: Default::default(),
            gpu: None,
            external: Some(external),
            cgroup: None,
            oom_kills: Vec::new(),
            cgroup_unavailable: None,
            nodes,
        };
        let run = RunResult {
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            started_at: self.started_at.clone(),
            command: std::env::args().collect(),
            environment: crate::probe::machine(&crate::probe::Needs { python: true, trainer: None }),
            scenarios: vec![result],
            not_run: Vec::new(),
            interrupted: false,
            stopped_by: None,
            logs_cut: Vec::new(),
        };
        let found: Vec<u32> = views.iter().map(|v| v.rank).collect();
        let mut attach = self.seen().record(
            judged.state,
            judged.culprit,
            &found,
            &missing,
            &views,
            &self.refused_pids,
            &self.shm,
        );
        attach["tcp"] = json!(self.connections);
        (judged, run, attach)
    }
}

/// The headline, the ranks of `views` whose stacks could not be read, and where the report is.
fn tell(judged: &judge::Judged, views: &[judge::RankView], report: &Path) {
    eprintln!("{}", judged.verdict.headline);
    for v in views.iter().filter(|v| v.motion == Motion::Unread) {
        eprintln!("  rank {} (pid {}): stack unreadable", v.rank, v.pid);
    }
    eprintln!("report: {}", report.display());
}

/// `--then stop`, once the evidence is on disk (whatever stopping does, it stays): stops the job
/// and writes the run folder again with what was sent to whom.
fn stop_and_record(
    out: &Path,
    run: &mut RunResult,
    attach: &mut serde_json::Value,
    heads: &[crate::harness::os::owner::Identity],
    everyone: &[crate::harness::os::owner::Identity],
) -> Result<PathBuf, Error> {
    let stopped = stop::stop(heads, everyone, stop::TERM_GRACE);
    eprintln!("{}", stopped.sentence());
    run.scenarios[0].verdict.evidence.push(stopped.sentence());
    attach["signalled"] = json!(stopped.termed.iter().chain(&stopped.killed).collect::<Vec<_>>());
    attach["stopped"] = json!({
        "sigterm": stopped.termed, "sigkill": stopped.killed, "survivors": stopped.survivors,
        "took_s": stopped.took_s,
    });
    write_attach(out, run, attach)
}

/// Writes the run folder (result.json, report.md, trace.json) and attach.json; the report's path.
fn write_attach(out: &Path, run: &RunResult, attach: &serde_json::Value) -> Result<PathBuf, Error> {
    let report = crate::report::write_run(out, run)?;
    let mut attach = attach.clone();
    crate::secrets::mask_json(&mut attach);
    let text = serde_json::to_string_pretty(&attach).expect("serialises") + "\n";
    crate::report::write_atomic(&out.join("attach.json"), text.as_bytes())?;
    Ok(report)
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
    }
    if !unreadable.is_empty() {
        println!(
            "{} process(es) of other users could not be read (run as root to list their jobs)",
            unreadable.len()
        );
    }
    Ok(exit::MET)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn py_spys_refusals_give_one_message_with_the_fix() {
        assert!(refused("Error: Permission denied (os error 13)"));
        assert!(refused("Error: Operation not permitted (os error 1)"));
        assert!(!refused("Error: Failed to find python version from target process"));
        let hint = ptrace_hint(&[12, 34]);
        assert!(hint.starts_with("stacks cannot be read: py-spy was refused access to pid 12, 34"), "{hint}");
        assert!(hint.contains("--cap-add SYS_PTRACE") && hint.contains("kernel.yama.ptrace_scope"), "{hint}");
    }
}
