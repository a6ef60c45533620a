//! What a scenario will start, decided before anything starts: per process its program, argv,
//! environment, logs and marker channel; for the scenario its style (one process per rank or one
//! launcher), completion evidence (the stdout pattern, compiled here once), private `/dev/shm`
//! size, cgroup memory limit and timings; on one node of several, its ranks' global numbers and
//! torchrun's per-node form. Pure: the facts it needs from the machine (a free port, which
//! variables ups-doctor's own environment sets, what `auto` makes of a command) are handed in, so
//! every decision here is unit-tested without a process. Every later stage reads the
//! [`Plan`]; nothing is parsed twice.

pub mod command;
mod entry;
mod placement;
pub mod torchrun;

pub use placement::NodePlacement;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::protocol::{MARKER_PATH_ENV, RUN_ID_ENV};
use crate::scenario::{CompletesWhen, Device, LaunchStyle, Scenario};

/// How long stuck ranks get to answer a stack-dump request.
pub const STACK_DUMP_WAIT: Duration = Duration::from_secs(5);
/// How long ranks get to answer a stack-dump request after a failure on another node: they are
/// torn down as soon as they answered, and on a loaded machine a debug build's first symbolised
/// stack takes seconds.
pub const REMOTE_DUMP_WAIT: Duration = Duration::from_secs(15);
/// How long a rank gets between SIGTERM and SIGKILL.
pub const TERM_GRACE: Duration = Duration::from_secs(3);
/// How long a launcher gets between SIGTERM and SIGKILL (its ranks get [`TERM_GRACE`]): once
/// they are gone it still has to end its own way, and killed too early it leaves things behind
/// (`srun` killed before slurmstepd reports its tasks' end leaves the job's allocation running).
pub const LAUNCHER_TERM_GRACE: Duration = Duration::from_secs(15);
pub const LAUNCHER_INTERRUPT_TERM_GRACE: Duration = Duration::from_secs(5);
/// After a Ctrl-C or SIGTERM: how long ranks get between SIGTERM and SIGKILL, and to answer a
/// stack-dump request.
pub const INTERRUPT_TERM_GRACE: Duration = Duration::from_secs(1);
pub const INTERRUPT_DUMP_WAIT: Duration = Duration::from_secs(3);
/// After the first rank fails, how long the others get to notice and end on their own (their
/// own error is the collateral evidence) before they are asked for stacks and torn down.
pub const COLLATERAL_GRACE: Duration = Duration::from_secs(5);
/// How long after a rank's exit we keep waiting for markers still in its pipe (a grandchild that
/// holds the pipe open must not stall the run).
pub const PIPE_DRAIN_WAIT: Duration = Duration::from_secs(2);
/// How often memory and `/dev/shm` are sampled.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(250);

/// The machine facts a plan depends on, gathered by the caller.
pub struct Facts<'a> {
    /// The `ups-doctor-trainer` executable that runs `train` for each rank of a built-in scenario.
    pub trainer: &'a Path,
    /// The resolved scenario file handed to each rank.
    pub resolved_file: &'a Path,
    /// Where logs (and a launcher's marker FIFO) go.
    pub log_dir: &'a Path,
    /// Unique to this scenario run (see [`RUN_ID_ENV`]).
    pub run_id: &'a str,
    /// The scenario file's folder, absolute (`{scenario_dir}` in a command).
    pub scenario_dir: &'a Path,
    /// A port that was free a moment ago, for the rendezvous store (on one node of several: the
    /// run's, from node 0).
    pub master_port: u16,
    /// This node's place in a multi-node run (none on one machine).
    pub node: Option<&'a NodePlacement>,
    /// Whether ups-doctor's own environment sets a variable (a user's choice is never overridden).
    pub env_has: &'a dyn Fn(&str) -> bool,
    /// ups-doctor's own `PYTHONPATH`, which a command's processes keep after [`Facts::python_site`].
    pub pythonpath: Option<String>,
    /// The absolute folder a command's Python processes read their `sitecustomize` from
    /// (`python/site/sitecustomize.py`: line-buffered output), in the scenario's log folder.
    pub python_site: &'a Path,
    /// What `launch.style: auto` makes of a command: launcher or not, and why (it may read the
    /// script; see [`crate::harness::plan::command::auto_style`]).
    pub auto_style: &'a dyn Fn(&[String], Option<&Path>) -> (bool, String),
}

/// A scenario that cannot be planned. Validation refuses these first; a value that slipped past
/// it is refused here, never dropped.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("`expect.completes_when.stdout` is not a valid regular expression: {0}")]
    Pattern(#[from] regex::Error),
    #[error("`data.shm_size` `{size}` is not a size: {why}")]
    ShmSize {
        size: String,
        #[source]
        why: crate::scenario::SizeError,
    },
    #[error("`launch.memory_limit` `{limit}` is not a size: {why}")]
    MemoryLimit {
        limit: String,
        #[source]
        why: crate::scenario::SizeError,
    },
}

/// How the processes of an external command are started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// One process per rank, each with torchrun's environment (the built-in trainer too).
    PerRank,
    /// The command once; it starts the ranks, which are found in its process tree.
    Launcher,
}

impl Style {
    /// How `result.json` names it.
    pub fn external(self) -> crate::schema::ExternalStyle {
        match self {
            Style::PerRank => crate::schema::ExternalStyle::PerRank,
            Style::Launcher => crate::schema::ExternalStyle::Launcher,
        }
    }
}

/// What says that a process finished its work.
#[derive(Debug, Clone)]
pub enum Completion {
    /// Its exit status alone (an external command without `expect.completes_when`).
    ExitStatus,
    /// The `done` marker (the built-in trainer always; an external command when asked).
    Done,
    /// A stdout line matching the pattern.
    Stdout(regex::Regex),
    /// A line of stdout or stderr matching the pattern.
    Output(regex::Regex),
}

impl Completion {
    /// An exit status of 0 without the `done` marker is a failure (a false success).
    pub fn needs_done(&self) -> bool {
        matches!(self, Completion::Done)
    }

    /// How `result.json` names it.
    pub fn describe(&self) -> String {
        match self {
            Completion::ExitStatus => "exit status".to_string(),
            Completion::Done => "done marker".to_string(),
            Completion::Stdout(p) => format!("stdout matches `{}`", p.as_str()),
            Completion::Output(p) => format!("stdout or stderr matches `{}`", p.as_str()),
        }
    }

    /// The pattern a process's stdout and its stderr are watched for.
    pub fn patterns(&self) -> (Option<&regex::Regex>, Option<&regex::Regex>) {
        match self {
            Completion::Stdout(p) => (Some(p), None),
            Completion::Output(p) => (Some(p), Some(p)),
            Completion::ExitStatus | Completion::Done => (None, None),
        }
    }
}

/// One process to start.
#[derive(Debug, Clone)]
pub struct ProcessPlan {
    /// Its rank; a launcher gets [`LAUNCHER_NUMBER`] (past any rank, however many the run grows to).
    pub rank: u32,
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// Set on top of ups-doctor's own environment.
    pub env: Vec<(String, String)>,
    /// Not passed on from ups-doctor's own environment.
    pub env_remove: Vec<String>,
    pub stdout_log: PathBuf,
    pub stderr_log: PathBuf,
    /// A marker pipe of its own (`UPS_DOCTOR_MARKER_FD`); a launcher's ranks use the FIFO.
    pub marker_pipe: bool,
    /// Its output counts as a sign of life (programs that may send no markers).
    pub report_output: bool,
    /// Its output is matched against the completion pattern ([`Completion::patterns`]).
    pub watch_stdout: bool,
    /// The folder it starts in (`launch.cwd`); `None`: ups-doctor's own.
    pub cwd: Option<PathBuf>,
}

/// When the supervisor acts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// A live rank silent this long is hung.
    pub hang_after: Duration,
    /// The whole scenario's limit.
    pub timeout: Duration,
    pub collateral_grace: Duration,
    pub stack_dump_wait: Duration,
    pub term_grace: Duration,
    pub interrupt_dump_wait: Duration,
    pub interrupt_term_grace: Duration,
    pub remote_dump_wait: Duration,
    pub launcher_term_grace: Duration,
    pub launcher_interrupt_term_grace: Duration,
    pub pipe_drain_wait: Duration,
}

impl Timing {
    pub fn of(scenario: &Scenario) -> Timing {
        Timing {
            hang_after: Duration::from_secs_f64(scenario.limits.hang_after_s),
            timeout: Duration::from_secs_f64(scenario.limits.timeout_s),
            collateral_grace: COLLATERAL_GRACE,
            stack_dump_wait: STACK_DUMP_WAIT,
            term_grace: TERM_GRACE,
            interrupt_dump_wait: INTERRUPT_DUMP_WAIT,
            interrupt_term_grace: INTERRUPT_TERM_GRACE,
            remote_dump_wait: REMOTE_DUMP_WAIT,
            launcher_term_grace: LAUNCHER_TERM_GRACE,
            launcher_interrupt_term_grace: LAUNCHER_INTERRUPT_TERM_GRACE,
            pipe_drain_wait: PIPE_DRAIN_WAIT,
        }
    }
}

/// Everything a scenario run will start and how it will be watched.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The ranks this node runs (every rank on one machine).
    pub world: u32,
    /// This node's first global rank (0 on one machine): a launcher's ranks carry global numbers
    /// (`RANK`, the markers' ranks), the supervisor numbers them from 0. For a launcher on one
    /// node of several this is the expectation (node × ranks per node): the launcher's own
    /// rendezvous may place the node elsewhere, and the supervisor then follows the ranks.
    pub offset: u32,
    /// The whole run's ranks, over every node (`world` on one machine).
    pub global_world: u32,
    /// A launcher on one machine: the process group its program forms may grow the world up to
    /// this many ranks (a script that starts its own ranks, whose command line says not how
    /// many); `None`: the world is fixed.
    pub grow_to: Option<u32>,
    /// The rendezvous port (rank 0 binds it; a launcher's ranks are found by it too).
    pub master_port: u16,
    /// The external command, rendered; empty for the built-in trainer.
    pub argv: Vec<String>,
    pub style: Style,
    /// The launcher of the table whose ranks these are, where the command names one (its program,
    /// or its Python program's source): how its workers' output and relayed errors read.
    pub launcher: Option<&'static crate::scenario::launcher::Launcher>,
    /// Why `auto` chose [`Plan::style`] (`None` when the scenario named it, or for the built-in
    /// trainer).
    pub style_chosen: Option<String>,
    /// In start order: `world` ranks, or the one launcher.
    pub processes: Vec<ProcessPlan>,
    /// The FIFO a launcher's ranks write their markers to.
    pub marker_fifo: Option<PathBuf>,
    /// Where `python/site/sitecustomize.py` goes before anything starts (a command's processes
    /// have it first on `PYTHONPATH`); none for the built-in trainer, or when the user set
    /// `PYTHONUNBUFFERED` and the observer is off.
    pub python_site: Option<PathBuf>,
    /// Where each observed rank writes its Python stacks as SIGTERM stops it
    /// (`UPS_DOCTOR_STOP_STACKS`, one `PID.txt` a rank); read into the rank's dumps after the run
    /// and removed. Only with the observer.
    pub stop_stacks: Option<PathBuf>,
    pub completion: Completion,
    pub timing: Timing,
    /// Bytes of the private `/dev/shm` every process joins (`data.shm_size`), with its label.
    pub private_shm: Option<(u64, String)>,
    /// `launch.memory_limit` in bytes, for the scenario's cgroup.
    pub memory_limit: Option<u64>,
    pub sample_every: Duration,
    /// How often GPUs are sampled; `None` on `device: cpu` or with `limits.gpu_sample_ms: 0`.
    pub gpu_every: Option<Duration>,
    pub run_id: String,
}

impl Plan {
    /// What its launcher's output says of its ranks, where they are a cluster's workers (Ray
    /// Train's): see [`crate::scenario::launcher::RankProcesses`].
    pub fn cluster_workers(&self) -> Option<&'static crate::scenario::launcher::ClusterWorkers> {
        match self.launcher.map(|l| &l.ranks) {
            Some(crate::scenario::launcher::RankProcesses::ClusterWorkers(w)) => Some(w),
            _ => None,
        }
    }

    pub fn is_external(&self) -> bool {
        !self.argv.is_empty()
    }
}

/// The variable that tells the observer where a rank's stacks go as SIGTERM stops it.
pub const STOP_STACKS_ENV: &str = "UPS_DOCTOR_STOP_STACKS";

/// The variables that size PyTorch's Flight Recorder (the first is ups-doctor's choice; the
/// second is NCCL's older name): either set by the user is kept as it is.
pub const FLIGHT_ENV: [&str; 2] = ["TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"];

/// Entries the Flight Recorder keeps per process: a few hundred bytes each; enough for the last
/// steps of a DDP job with dozens of gradient buckets a step.
pub const FLIGHT_ENTRIES: u32 = 2000;

/// The number a launcher's events carry: past every rank, also those of a grown world.
pub use crate::harness::os::process::LAUNCHER_NUMBER;

/// The most ranks a launcher's world grows to from the process group its program forms: beyond,
/// the command line must say (a one-machine group of more is unlikely, and each rank found is
/// watched by a thread of its own).
pub const MAX_GROWN_WORLD: u32 = 64;

/// Plans one scenario.
pub fn plan(scenario: &Scenario, facts: &Facts) -> Result<Plan, PlanError> {
    let world = facts.node.map_or(scenario.launch.world_size, |n| n.local_world);
    let external = scenario.is_external();
    let argv = if external {
        crate::harness::plan::command::argv(scenario, facts.scenario_dir, facts.master_port)
    } else {
        Vec::new()
    };
    // On one node of several: torchrun's per-node form; a launcher's ranks carry global numbers.
    let (argv, offset) = match facts.node {
        Some(n) => (torchrun::per_node(&argv, n), n.global_rank(0)),
        None => (argv, 0),
    };
    // The scenario's own folder, for every process it starts.
    let cwd = crate::harness::plan::command::cwd(scenario, facts.scenario_dir);
    let (style, style_chosen) = match scenario.launch.style {
        _ if !external => (Style::PerRank, None),
        LaunchStyle::Auto => {
            let (launcher, why) = (facts.auto_style)(&argv, cwd.as_deref());
            (if launcher { Style::Launcher } else { Style::PerRank }, Some(why))
        }
        LaunchStyle::Launcher => (Style::Launcher, None),
        LaunchStyle::PerRank => (Style::PerRank, None),
    };
    let completion = match &scenario.expect.completes_when {
        _ if !external => Completion::Done,
        None => Completion::ExitStatus,
        Some(CompletesWhen::Done) => Completion::Done,
        Some(CompletesWhen::Stdout(p)) => Completion::Stdout(regex::Regex::new(p)?),
        Some(CompletesWhen::Output(p)) => Completion::Output(regex::Regex::new(p)?),
    };
    let watch_stdout = matches!(completion, Completion::Stdout(_) | Completion::Output(_));
    let PythonEnv { env: python_env, site: python_site, stop_stacks } = python_env(scenario, facts);
    let (processes, marker_fifo) = match style {
        Style::Launcher => {
            let fifo = facts.log_dir.join("markers.fifo");
            (vec![launcher_process(&argv, &fifo, python_env, watch_stdout, facts)], Some(fifo))
        }
        Style::PerRank => {
            let ranks = (0..world)
                .map(|rank| rank_process(rank, world, &argv, &python_env, watch_stdout, facts))
                .collect();
            (ranks, None)
        }
    };
    // The scenario's own variables, for every process it starts (the user's `env` comes last: it
    // wins over ups-doctor's defaults such as `OMP_NUM_THREADS`).
    // A `PYTHONPATH` of the user's (a checkout's own folders) comes after ups-doctor's site
    // folder, never instead of it: replaced, Python never reads the observer's sitecustomize and
    // every verdict that needs it is lost without a word.
    let user_env = scenario.launch.env.iter().map(|(k, v)| match &python_site {
        Some(site) if k == "PYTHONPATH" => {
            let path = std::iter::once(site.display().to_string()).chain((!v.is_empty()).then(|| v.clone()));
            (k.clone(), path.collect::<Vec<_>>().join(":"))
        }
        _ => (k.clone(), v.clone()),
    });
    let user_env: Vec<(String, String)> = user_env.collect();
    let mut processes = processes;
    let launcher = (style == Style::Launcher)
        .then(|| crate::harness::plan::command::launcher_of(&argv, cwd.as_deref()))
        .flatten();
    // The variables a launcher of the table runs best under, unless the user set them (theirs,
    // from the scenario, come next and win).
    if let Some(l) = launcher {
        for p in &mut processes {
            let unset = l.env().iter().filter(|(k, _)| !(facts.env_has)(k));
            p.env.extend(unset.map(|(k, v)| (k.to_string(), v.to_string())));
        }
    }
    for p in &mut processes {
        for (k, v) in &user_env {
            match p.env.iter_mut().find(|(name, _)| name == k) {
                Some(slot) => slot.1 = v.clone(),
                None => p.env.push((k.clone(), v.clone())),
            }
        }
        p.cwd = cwd.clone();
    }
    let private_shm = match &scenario.data.shm_size {
        Some(label) => {
            let bytes = crate::scenario::parse_size(label)
                .map_err(|why| PlanError::ShmSize { size: label.clone(), why })?;
            Some((bytes, label.clone()))
        }
        None => None,
    };
    let memory_limit = match &scenario.launch.memory_limit {
        Some(limit) => Some(
            crate::scenario::parse_size(limit)
                .map_err(|why| PlanError::MemoryLimit { limit: limit.clone(), why })?,
        ),
        None => None,
    };
    let gpu_ms = scenario.limits.gpu_sample_ms;
    Ok(Plan {
        world,
        offset,
        global_world: facts.node.map_or(world, |n| n.world()),
        grow_to: (style == Style::Launcher && facts.node.is_none() && scenario.launch.nodes <= 1)
            .then_some(MAX_GROWN_WORLD.max(world)),
        master_port: facts.master_port,
        launcher,
        argv,
        style,
        style_chosen,
        processes,
        marker_fifo,
        python_site,
        stop_stacks,
        completion,
        timing: Timing::of(scenario),
        private_shm,
        memory_limit,
        sample_every: SAMPLE_INTERVAL,
        gpu_every: (scenario.launch.device != Device::Cpu && gpu_ms > 0)
            .then(|| Duration::from_millis(gpu_ms)),
        run_id: facts.run_id.to_string(),
    })
}

/// What a command's Python processes get from ups-doctor: variables, the folder of the
/// `sitecustomize` put first on their `PYTHONPATH`, and the observer's folder for each rank's
/// stacks at SIGTERM.
struct PythonEnv {
    env: Vec<(String, String)>,
    site: Option<PathBuf>,
    stop_stacks: Option<PathBuf>,
}

fn python_env(scenario: &Scenario, facts: &Facts) -> PythonEnv {
    let external = scenario.is_external();
    let mut env: Vec<(String, String)> = crate::harness::plan::command::PYTHON_ENV
        .iter()
        .filter(|(k, _)| external && !(facts.env_has)(k))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    // The sitecustomize goes first on the path where ups-doctor made the output unbuffered, and
    // for the observer it carries. Wherever it is, it makes the output line-buffered (one write a
    // line), whoever set `PYTHONUNBUFFERED` (ups-doctor, or the user, as most ML container images
    // do): unbuffered alone writes `print`'s text and its newline apart, and ranks sharing a
    // launcher's stdout split each other's lines, which hid completion patterns. Each line still
    // goes out at once.
    let ours_unbuffered = env.iter().any(|(k, _)| k == "PYTHONUNBUFFERED");
    let observe = external && scenario.launch.observe;
    let python_site = (ours_unbuffered || observe).then(|| facts.python_site.to_path_buf());
    if python_site.is_some() {
        env.push(("UPS_DOCTOR_LINE_BUFFERED".into(), "1".into()));
    }
    if python_site.is_some() && !observe {
        env.push(("UPS_DOCTOR_OBSERVE".into(), "0".into()));
    }
    let stop_stacks = observe.then(|| facts.log_dir.join("stop-stacks"));
    if let Some(folder) = &stop_stacks {
        env.push((STOP_STACKS_ENV.into(), folder.display().to_string()));
        // PyTorch's Flight Recorder, on for every process group the ranks make (gloo records
        // into it as NCCL does, when this is set before the group is made), unless the user set
        // its size: the observer hands its entries over when ups-doctor asks.
        let set_by_user = |k: &str| (facts.env_has)(k) || scenario.launch.env.contains_key(k);
        if !FLIGHT_ENV.iter().any(|k| set_by_user(k)) {
            env.push((FLIGHT_ENV[0].into(), FLIGHT_ENTRIES.to_string()));
        }
    }
    if let Some(site) = &python_site {
        let path = std::iter::once(site.display().to_string())
            .chain(facts.pythonpath.clone().filter(|p| !p.is_empty()));
        env.push(("PYTHONPATH".into(), path.collect::<Vec<_>>().join(":")));
    }
    PythonEnv { env, site: python_site, stop_stacks }
}

/// The launcher of a `launcher`-style command (torchrun): started once, without a rank's
/// environment; its ranks find the marker FIFO through `UPS_DOCTOR_MARKER_PATH`.
fn launcher_process(
    argv: &[String],
    fifo: &Path,
    python_env: Vec<(String, String)>,
    watch_stdout: bool,
    facts: &Facts,
) -> ProcessPlan {
    let mut env = vec![
        (RUN_ID_ENV.to_string(), facts.run_id.to_string()),
        (MARKER_PATH_ENV.to_string(), fifo.display().to_string()),
    ];
    // torchrun's `--master-port` defaults to 29500, which two runs at once (or anything else on
    // the machine) would share: a free port, through the variable torchrun reads its default
    // from, unless the user chose one.
    if !(facts.env_has)("PET_MASTER_PORT") {
        env.push(("PET_MASTER_PORT".to_string(), facts.master_port.to_string()));
    }
    env.extend(python_env);
    ProcessPlan {
        rank: LAUNCHER_NUMBER,
        program: PathBuf::from(argv.first().map_or("", String::as_str)),
        args: argv.iter().skip(1).map(OsString::from).collect(),
        env,
        env_remove: crate::harness::plan::command::RANK_ENV.iter().map(|v| v.to_string()).collect(),
        stdout_log: facts.log_dir.join("launcher.stdout.log"),
        stderr_log: facts.log_dir.join("launcher.stderr.log"),
        marker_pipe: false,
        report_output: true,
        watch_stdout,
        cwd: None,
    }
}

/// One rank: `ups-doctor train` with the resolved scenario, or a copy of the external command
/// (`argv`, already rendered), with torchrun's environment.
fn rank_process(
    rank: u32,
    world: u32,
    argv: &[String],
    python_env: &[(String, String)],
    watch_stdout: bool,
    facts: &Facts,
) -> ProcessPlan {
    let external = !argv.is_empty();
    let (program, args) = if external {
        (PathBuf::from(&argv[0]), argv[1..].iter().map(OsString::from).collect())
    } else {
        let file = facts.resolved_file.as_os_str().to_owned();
        (facts.trainer.to_path_buf(), vec![OsString::from("train"), file])
    };
    let (global, all, node, master) = facts.node.map_or((rank, world, 0, "127.0.0.1".into()), |n| {
        (n.global_rank(rank), n.world(), n.node, n.master_addr.clone())
    });
    let mut env: Vec<(String, String)> = vec![
        ("RANK".into(), global.to_string()),
        ("LOCAL_RANK".into(), rank.to_string()),
        ("GROUP_RANK".into(), node.to_string()),
        ("WORLD_SIZE".into(), all.to_string()),
        ("LOCAL_WORLD_SIZE".into(), world.to_string()),
        ("MASTER_ADDR".into(), master),
        ("MASTER_PORT".into(), facts.master_port.to_string()),
        (RUN_ID_ENV.into(), facts.run_id.to_string()),
    ];
    // Like torchrun: several ranks on one machine each get one intra-op thread unless the user
    // chose otherwise; OpenMP's spinning barriers collapse when ranks oversubscribe the cores.
    if world > 1 && !(facts.env_has)("OMP_NUM_THREADS") {
        env.push(("OMP_NUM_THREADS".into(), "1".into()));
    }
    env.extend(python_env.iter().cloned());
    ProcessPlan {
        rank,
        program,
        args,
        env,
        env_remove: Vec::new(),
        stdout_log: facts.log_dir.join(format!("rank{rank}.stdout.log")),
        stderr_log: facts.log_dir.join(format!("rank{rank}.stderr.log")),
        marker_pipe: true,
        report_output: external,
        watch_stdout,
        cwd: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(json: &str) -> Scenario {
        serde_json::from_str(json).unwrap()
    }

    fn planned(s: &Scenario, env: &[&str], auto_launcher: bool) -> Result<Plan, PlanError> {
        planned_on(s, env, auto_launcher, None)
    }

    fn planned_on(
        s: &Scenario,
        env: &[&str],
        auto_launcher: bool,
        node: Option<&NodePlacement>,
    ) -> Result<Plan, PlanError> {
        let env_has = |name: &str| env.contains(&name);
        let auto = |argv: &[String], _: Option<&Path>| (auto_launcher, format!("chosen for `{}`", argv[0]));
        plan(
            s,
            &Facts {
                trainer: Path::new("/bin/ups-doctor-trainer"),
                resolved_file: Path::new("/runs/a/scenario.json"),
                log_dir: Path::new("/runs/a"),
                run_id: "77-0-abc",
                scenario_dir: Path::new("/scenarios"),
                master_port: 29611,
                node,
                env_has: &env_has,
                pythonpath: env.contains(&"PYTHONPATH").then(|| "/home/u/lib".to_string()),
                python_site: Path::new("/runs/a/python-site"),
                auto_style: &auto,
            },
        )
    }

    fn env<'a>(p: &'a ProcessPlan, name: &str) -> Option<&'a str> {
        p.env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// A Ray Train program's launcher runs with Ray's line deduplication off (each worker's lines
    /// whole and its own), unless the user set it; other launchers get nothing of it.
    #[test]
    fn a_cluster_launcher_gets_its_variables_unless_the_user_set_them() {
        let ray = scenario(
            r#"{"command": ["python", "-c", "from ray.train.torch import TorchTrainer; TorchTrainer(f).fit()"]}"#,
        );
        let p = planned(&ray, &[], true).unwrap();
        assert_eq!(p.launcher.map(|l| l.name), Some("Ray Train"));
        assert_eq!(env(&p.processes[0], "RAY_DEDUP_LOGS"), Some("0"));
        let theirs = planned(&ray, &["RAY_DEDUP_LOGS"], true).unwrap();
        assert_eq!(env(&theirs.processes[0], "RAY_DEDUP_LOGS"), None, "the user's own value is left alone");
        let torchrun = scenario(r#"{"command": ["torchrun", "--nproc_per_node", "2", "t.py"]}"#);
        let p = planned(&torchrun, &[], true).unwrap();
        assert_eq!(p.launcher.map(|l| l.name), Some("torchrun"));
        assert_eq!(env(&p.processes[0], "RAY_DEDUP_LOGS"), None);
        // A node of a Ray cluster of several hosts: `ray start` itself, or the job script that
        // starts the head and then the driver; `ray status` starts no node.
        for command in [
            r#"["ray", "start", "--address", "node1:6379", "--block"]"#,
            r#"["bash", "-c", "ray start --head --port 6379 && python train.py"]"#,
        ] {
            let node = scenario(&format!(r#"{{"command": {command}, "launch": {{"style": "launcher"}}}}"#));
            let p = planned(&node, &[], true).unwrap();
            assert_eq!(p.launcher.map(|l| l.name), Some("Ray Train"), "{command}");
            assert_eq!(env(&p.processes[0], "RAY_DEDUP_LOGS"), Some("0"), "{command}");
        }
        let status = scenario(r#"{"command": ["ray", "status"], "launch": {"style": "launcher"}}"#);
        assert_eq!(planned(&status, &[], true).unwrap().launcher, None);
    }

    #[test]
    fn the_builtin_trainer_gets_one_process_per_rank_with_torchruns_environment() {
        let s = scenario(r#"{"launch": {"mode": "ddp", "world_size": 2}}"#);
        let p = planned(&s, &[], false).unwrap();
        assert_eq!((p.style, p.style_chosen.as_deref(), p.is_external()), (Style::PerRank, None, false));
        assert_eq!(p.grow_to, None, "ranks it starts itself are as many as it starts");
        assert_eq!(p.processes.len(), 2);
        let r1 = &p.processes[1];
        assert_eq!(r1.program, Path::new("/bin/ups-doctor-trainer"));
        assert_eq!(r1.args, [OsString::from("train"), OsString::from("/runs/a/scenario.json")]);
        for (k, v) in [("RANK", "1"), ("LOCAL_RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "29611")] {
            assert_eq!(env(r1, k), Some(v), "{k}");
        }
        assert_eq!(env(r1, RUN_ID_ENV), Some("77-0-abc"));
        assert_eq!(env(r1, "OMP_NUM_THREADS"), Some("1"), "several ranks get one thread each");
        assert_eq!(env(r1, "PYTHONUNBUFFERED"), None, "the trainer is no Python program");
        assert_eq!(r1.stderr_log, Path::new("/runs/a/rank1.stderr.log"));
        assert!(r1.marker_pipe && !r1.report_output && !r1.watch_stdout);
        assert!(p.completion.needs_done());
        assert_eq!(p.marker_fifo, None);
    }

    /// A command's processes get the sitecustomize (line-buffered output) first on their path, the
    /// user's `PYTHONPATH` after it; the built-in trainer gets none.
    #[test]
    fn a_commands_python_reads_ups_doctors_sitecustomize_first_and_the_users_path_after() {
        let s = scenario(r#"{"launch": {"mode": "ddp", "world_size": 2}, "command": ["python", "t.py"]}"#);
        let p = planned(&s, &["PYTHONPATH"], false).unwrap();
        assert_eq!(p.python_site.as_deref(), Some(Path::new("/runs/a/python-site")));
        assert_eq!(env(&p.processes[1], "PYTHONPATH"), Some("/runs/a/python-site:/home/u/lib"));
        let launcher = scenario(r#"{"launch": {"world_size": 2}, "command": ["torchrun", "t.py"]}"#);
        let p = planned(&launcher, &[], true).unwrap();
        assert_eq!(env(&p.processes[0], "PYTHONPATH"), Some("/runs/a/python-site"));
        let trainer =
            planned(&scenario(r#"{"launch": {"mode": "ddp", "world_size": 2}}"#), &[], false).unwrap();
        assert_eq!((env(&trainer.processes[0], "PYTHONPATH"), trainer.python_site), (None, None));
    }

    /// The scenario's own `PYTHONPATH` (`--env PYTHONPATH=…`, `launch.env`) replaces ups-doctor's
    /// environment's, and comes after the site folder: replacing that too would drop the observer.
    #[test]
    fn a_pythonpath_of_the_scenarios_own_keeps_the_sitecustomize_first() {
        for (style, world) in [("per_rank", 2), ("launcher", 1)] {
            let s = scenario(&format!(
                r#"{{"launch": {{"world_size": {world}, "style": "{style}", "env": {{"PYTHONPATH": "/src/repo"}}}},
                    "command": ["python", "t.py"]}}"#
            ));
            let p = planned(&s, &["PYTHONPATH"], false).unwrap();
            for process in &p.processes {
                let paths: Vec<_> = process.env.iter().filter(|(k, _)| k == "PYTHONPATH").collect();
                assert_eq!(paths.len(), 1, "{style}: one PYTHONPATH, {paths:?}");
                assert_eq!(paths[0].1, "/runs/a/python-site:/src/repo", "{style}");
            }
        }
        let empty = scenario(r#"{"launch": {"env": {"PYTHONPATH": ""}}, "command": ["python", "t.py"]}"#);
        assert_eq!(
            env(&planned(&empty, &[], false).unwrap().processes[0], "PYTHONPATH"),
            Some("/runs/a/python-site")
        );
        let trainer = scenario(r#"{"launch": {"env": {"PYTHONPATH": "/src/repo"}}}"#);
        let p = planned(&trainer, &[], false).unwrap();
        assert_eq!(
            env(&p.processes[0], "PYTHONPATH"),
            Some("/src/repo"),
            "no site folder: the user's as it is"
        );
    }

    #[test]
    fn a_variable_the_user_set_is_left_alone() {
        let s = scenario(r#"{"launch": {"mode": "ddp", "world_size": 2}, "command": ["python", "t.py"]}"#);
        let p = planned(&s, &["OMP_NUM_THREADS", "PYTHONUNBUFFERED"], false).unwrap();
        let r0 = &p.processes[0];
        assert_eq!(env(r0, "OMP_NUM_THREADS"), None);
        assert_eq!(env(r0, "PYTHONUNBUFFERED"), None);
        assert_eq!(env(r0, "PYTHONFAULTHANDLER"), Some("1"));
        assert_eq!(env(r0, "UPS_DOCTOR_LINE_BUFFERED"), Some("1"), "whole lines, whoever chose unbuffered");
        assert_eq!(env(r0, "PYTHONPATH"), Some("/runs/a/python-site"), "the observer's sitecustomize");
        let unobserved = scenario(
            r#"{"launch": {"mode": "ddp", "world_size": 2, "observe": false}, "command": ["python", "t.py"]}"#,
        );
        let p = planned(&unobserved, &["PYTHONUNBUFFERED"], false).unwrap();
        assert_eq!(
            (env(&p.processes[0], "PYTHONPATH"), &p.python_site),
            (None, &None),
            "nothing asked for: the user's buffering, no observer"
        );
        let p = planned(&unobserved, &[], false).unwrap();
        assert_eq!(env(&p.processes[0], "UPS_DOCTOR_OBSERVE"), Some("0"));
        let single = planned(&scenario(r#"{}"#), &[], false).unwrap();
        assert_eq!(env(&single.processes[0], "OMP_NUM_THREADS"), None, "one rank keeps every core");
    }

    #[test]
    fn auto_takes_the_launchers_choice_and_keeps_its_reason() {
        let s = scenario(
            r#"{"launch": {"world_size": 2}, "command": ["torchrun", "--nproc_per_node", "{world_size}", "t.py"]}"#,
        );
        let p = planned(&s, &[], true).unwrap();
        assert_eq!(p.style, Style::Launcher);
        assert_eq!(p.style_chosen.as_deref(), Some("chosen for `torchrun`"));
        assert_eq!(p.processes.len(), 1, "the launcher starts the ranks");
        let l = &p.processes[0];
        assert_eq!(l.rank, LAUNCHER_NUMBER, "a launcher's number is past the ranks");
        assert_eq!(
            p.grow_to,
            Some(MAX_GROWN_WORLD),
            "a launcher on one machine may grow to its program's group"
        );
        assert_eq!(l.args[1], OsString::from("2"));
        assert_eq!(env(l, "PET_MASTER_PORT"), Some("29611"));
        assert_eq!(env(l, MARKER_PATH_ENV), Some("/runs/a/markers.fifo"));
        assert_eq!(env(l, "RANK"), None);
        assert!(l.env_remove.iter().any(|v| v == "RANK"), "a stray RANK would make it look like a rank");
        assert!(
            !l.env_remove.iter().any(|v| v == "MASTER_PORT" || v == "MASTER_ADDR"),
            "the user's rendezvous stands for a program that starts its own ranks"
        );
        assert!(!l.marker_pipe && l.report_output);
        assert_eq!(p.marker_fifo.as_deref(), Some(Path::new("/runs/a/markers.fifo")));
        let own_port = planned(&s, &["PET_MASTER_PORT"], true).unwrap();
        assert_eq!(env(&own_port.processes[0], "PET_MASTER_PORT"), None, "the user's port stands");
        assert_eq!(
            env(&own_port.processes[0], "TORCH_FR_BUFFER_SIZE"),
            Some("2000"),
            "the Flight Recorder on"
        );
        let own_recorder = planned(&s, &["PET_MASTER_PORT", "TORCH_NCCL_TRACE_BUFFER_SIZE"], true).unwrap();
        assert_eq!(
            env(&own_recorder.processes[0], "TORCH_FR_BUFFER_SIZE"),
            None,
            "the user's recorder size stands"
        );
        assert_eq!(
            own_port.processes[0].env.len(),
            8,
            "run id, FIFO, two Python variables, UPS_DOCTOR_LINE_BUFFERED, UPS_DOCTOR_STOP_STACKS, TORCH_FR_BUFFER_SIZE, PYTHONPATH"
        );
        assert_eq!(env(&own_port.processes[0], STOP_STACKS_ENV), Some("/runs/a/stop-stacks"));
        assert_eq!(own_port.stop_stacks.as_deref(), Some(Path::new("/runs/a/stop-stacks")));

        let named = scenario(r#"{"launch": {"style": "per_rank"}, "command": ["torchrun", "t.py"]}"#);
        let p = planned(&named, &[], true).unwrap();
        assert_eq!((p.style, p.style_chosen), (Style::PerRank, None), "a named style is not second-guessed");
    }

    #[test]
    fn the_stdout_pattern_is_compiled_once_and_its_error_surfaces() {
        let s = scenario(
            r#"{"command": ["python", "t.py"], "expect": {"completes_when": {"stdout": "^finished \\d+"}}}"#,
        );
        let p = planned(&s, &[], false).unwrap();
        match &p.completion {
            Completion::Stdout(re) => assert!(re.is_match("finished 12")),
            other => panic!("{other:?}"),
        }
        assert!(p.processes[0].watch_stdout);
        assert_eq!(p.completion.describe(), "stdout matches `^finished \\d+`");

        let mut bad = s.clone();
        bad.expect.completes_when = Some(CompletesWhen::Stdout("(unclosed".into()));
        let err = planned(&bad, &[], false).unwrap_err();
        assert!(
            err.to_string().contains("`expect.completes_when.stdout` is not a valid regular expression"),
            "{err}"
        );
    }

    #[test]
    fn on_node_1_of_2_the_ranks_are_the_nodes_own_with_global_numbers_and_node_0s_rendezvous() {
        let node = NodePlacement {
            node: 1,
            nodes: 2,
            local_world: 2,
            master_addr: "10.0.0.7".into(),
            master_port: 29611,
            first_rank: None,
        };
        let s = scenario(r#"{"launch": {"mode": "ddp", "world_size": 4}}"#);
        let p = planned_on(&s, &[], false, Some(&node)).unwrap();
        assert_eq!((p.world, p.offset, p.processes.len()), (2, 2, 2), "this node's two ranks, from 2");
        assert_eq!(p.global_world, 4);
        let r1 = &p.processes[1];
        for (k, v) in [
            ("RANK", "3"),
            ("LOCAL_RANK", "1"),
            ("GROUP_RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "10.0.0.7"),
        ] {
            assert_eq!(env(r1, k), Some(v), "{k}");
        }
        assert_eq!(r1.stdout_log, Path::new("/runs/a/rank1.stdout.log"), "logs are numbered locally");

        let torchrun = scenario(
            r#"{"launch": {"world_size": 4}, "command": ["torchrun", "--standalone", "--nproc_per_node", "{world_size}", "t.py"]}"#,
        );
        let p = planned_on(&torchrun, &[], true, Some(&node)).unwrap();
        assert_eq!(p.style, Style::Launcher);
        assert_eq!(p.processes[0].rank, LAUNCHER_NUMBER, "the launcher's number is past this node's ranks");
        assert_eq!(p.grow_to, None, "one node of several: the world is the nodes' together, fixed");
        let argv = p.argv.join(" ");
        assert!(argv.contains("--node-rank 1") && argv.contains("--nproc-per-node 2"), "{argv}");
        assert!(!argv.contains("--standalone"), "{argv}");
    }

    #[test]
    fn sizes_limits_and_sampling_come_from_the_scenario() {
        let s = scenario(
            r#"{"data": {"shm_size": "64m"}, "launch": {"memory_limit": "2g", "device": "cpu"},
                "limits": {"hang_after_s": 7, "timeout_s": 30}}"#,
        );
        let p = planned(&s, &[], false).unwrap();
        assert_eq!(p.private_shm, Some((64 << 20, "64m".to_string())));
        assert_eq!(p.memory_limit, Some(2 << 30));
        assert_eq!(p.gpu_every, None, "device: cpu samples no GPU");
        assert_eq!(p.timing.hang_after, Duration::from_secs(7));
        assert_eq!(p.timing.timeout, Duration::from_secs(30));
        assert_eq!(p.sample_every, SAMPLE_INTERVAL);
        let auto = planned(&scenario(r#"{"limits": {"gpu_sample_ms": 100}}"#), &[], false).unwrap();
        assert_eq!(auto.gpu_every, Some(Duration::from_millis(100)));

        let mut bad = s.clone();
        bad.launch.memory_limit = Some("lots".into());
        assert!(matches!(planned(&bad, &[], false), Err(PlanError::MemoryLimit { .. })));
    }
}
