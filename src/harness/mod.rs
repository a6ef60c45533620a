//! Launches ranks, reads their markers, watches for hangs and overruns, tears processes down and
//! classifies how each ended into a [`ScenarioResult`]. Talks to ranks only through processes and
//! [`crate::protocol`]; never uses tch.
//!
//! Layout, in the order data flows: [`plan`] turns a scenario into what will be started (pure,
//! unit-tested); [`run`] starts it and drives the supervisor's state machine ([`run::machine`],
//! pure); `observe` folds what the processes say and use (markers, output, memory, `/dev/shm`,
//! GPUs, OOM kills) into per-process state; [`os`] is the kernel seam (spawn, signals, wait,
//! ownership, namespaces, pidfds, cgroups); `classify` is pure (state → outcomes and verdict);
//! `result` is the data written to `result.json`.

mod classify;
mod discover;
pub mod limits;
mod observe;
pub mod os;
pub mod plan;
pub mod result;
pub mod run;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

pub use classify::{Intervention, RankEnd, classify_rank};
pub use discover::{FoundRank, Known, discover_ranks, rank_members_in};
#[cfg(test)]
pub(crate) use observe::gpu::h200 as gpu_h200;
pub use observe::gpu::{GpuRecorder, GpuSample, Label as GpuLabel, clock_reason_names};
pub use observe::quotes::output_quotes;
pub use observe::state::RankState;
pub use os::capture::{logs_cut, make_room};
use os::namespace;
pub use os::process::Exit;
pub use os::stacks::{find_program, find_py_spy, kernel_threads, ptrace_fix, ptrace_refused, py_spy_dump};
pub use plan::command::auto_style;

use crate::scenario::OutcomeKind;
use crate::scenario::Scenario;
use crate::schema::{FlightRecord, LeftoverProcess, RankResult, ScenarioResult, Verdict};

/// One scenario to run, as loaded from the command line.
#[derive(Debug, Clone)]
pub struct ScenarioInput {
    pub file: PathBuf,
    pub overrides: Vec<String>,
    pub scenario: Scenario,
}

/// Errors of the harness itself (not of the ranks, whose failures are outcomes).
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("failed to prepare `{path}`: {source}")]
    Prepare { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    PrivateShm(#[from] namespace::NamespaceError),
    #[error("failed to give `{file}` its `launch.memory_limit` of {limit}: {why}")]
    MemoryLimit {
        file: PathBuf,
        limit: String,
        #[source]
        why: LimitError,
    },
    #[error("failed to plan `{file}`: {source}")]
    Plan { file: PathBuf, source: plan::PlanError },
}

/// Why `launch.memory_limit` cannot be given: it is no size, or no cgroup can hold it.
#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    #[error(transparent)]
    Size(#[from] crate::scenario::SizeError),
    #[error(transparent)]
    Cgroup(#[from] os::cgroup::CgroupError),
}

/// Where a scenario's processes are contained.
struct Containment {
    /// Its cgroup, with `launch.memory_limit` when set.
    cgroup: Option<os::cgroup::ScenarioCgroup>,
    /// Why there is none.
    unavailable: Option<os::cgroup::CgroupError>,
    /// Processes of earlier, dead ups-doctor runs found in their orphaned cgroups and killed.
    orphans: Vec<LeftoverProcess>,
}

/// The scenario's cgroup, sweeping orphaned ones on the way. Without a limit a cgroup that
/// cannot be made is not an error: the scenario runs without one, and the reason is kept.
fn scenario_cgroup(input: &ScenarioInput, bytes: Option<u64>) -> Result<Containment, HarnessError> {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let limit = input.scenario.launch.memory_limit.as_ref();
    let refuse = |why: os::cgroup::CgroupError| HarnessError::MemoryLimit {
        file: input.file.clone(),
        limit: limit.cloned().unwrap_or_default(),
        why: why.into(),
    };
    let parent = match os::cgroup::parent() {
        Ok(p) => p,
        Err(why) if bytes.is_none() => {
            return Ok(Containment { cgroup: None, unavailable: Some(why), orphans: Vec::new() });
        }
        Err(why) => return Err(refuse(why)),
    };
    let sweep = os::cgroup::sweep_orphans(&parent);
    for (dir, why) in &sweep.spared {
        eprintln!("ups-doctor: note: left alone the cgroup `{}` of another run: {why}", dir.display());
    }
    let orphans = sweep
        .orphans
        .into_iter()
        .map(|o| LeftoverProcess {
            pid: o.pid,
            command: o.command,
            rank: None,
            worker: None,
            killed: o.killed,
            earlier_run: true,
        })
        .collect();
    let tag = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed).to_string();
    match os::cgroup::ScenarioCgroup::create(&parent, bytes, &tag) {
        Ok(cg) => Ok(Containment { cgroup: Some(cg), unavailable: None, orphans }),
        Err(why) if bytes.is_none() => Ok(Containment { cgroup: None, unavailable: Some(why), orphans }),
        Err(why) => Err(refuse(why)),
    }
}

/// What a cluster's launcher says of its workers, where the command `argv` (as it ran, for
/// `input`, from this folder) is one whose ranks are a cluster's (Ray Train's driver, a node's
/// `ray start`), as its plan found it.
pub fn cluster_workers(
    input: &ScenarioInput,
    argv: &[String],
) -> Option<&'static crate::scenario::launcher::ClusterWorkers> {
    let here = std::env::current_dir().ok()?;
    let scenario_dir = here.join(input.file.parent().unwrap_or(Path::new(".")));
    let cwd = plan::command::cwd(&input.scenario, &scenario_dir);
    match &plan::command::launcher_of(argv, cwd.as_deref())?.ranks {
        crate::scenario::launcher::RankProcesses::ClusterWorkers(w) => Some(w),
        crate::scenario::launcher::RankProcesses::Started => None,
    }
}

/// The plan of a scenario, with the facts of this machine: a free port (node 0's on a node of
/// several), a new run id, ups-doctor's own environment, what `auto` makes of the command.
fn plan_on_this_machine(
    input: &ScenarioInput,
    program: &Path,
    resolved_file: &Path,
    dir: &Path,
    here: &Path,
    placement: Option<&crate::harness::plan::NodePlacement>,
) -> Result<plan::Plan, HarnessError> {
    let run_id = run::supervise::new_run_id();
    let scenario_dir = here.join(input.file.parent().unwrap_or(Path::new(".")));
    let env_has = |name: &str| std::env::var_os(name).is_some();
    // One copy for the whole run, beside its scenarios' folders (the same file for each of them:
    // a sweep of fifty points kept fifty copies of it), written only where it differs.
    let scenario_folder = here.join(dir);
    let python_site = scenario_folder.parent().unwrap_or(&scenario_folder).join("python-site");
    let trainer = trainer_program(program);
    // Absolute: a command in another folder (`launch.cwd`) still finds the marker FIFO, its logs
    // and the resolved scenario.
    let log_dir = here.join(dir);
    let resolved_file = here.join(resolved_file);
    let facts = plan::Facts {
        trainer: &trainer,
        resolved_file: &resolved_file,
        log_dir: &log_dir,
        run_id: &run_id,
        scenario_dir: &scenario_dir,
        master_port: placement.map_or_else(run::supervise::free_port, |n| n.master_port),
        node: placement,
        env_has: &env_has,
        pythonpath: std::env::var_os("PYTHONPATH").map(|p| p.to_string_lossy().into_owned()),
        python_site: &python_site,
        auto_style: &crate::harness::plan::command::auto_style,
    };
    plan::plan(&input.scenario, &facts).map_err(|e| refused(input, e))
}

/// A scenario the plan refuses, as the error the same value got before planning existed: a bad
/// size names its field and value, a bad pattern its field.
fn refused(input: &ScenarioInput, e: plan::PlanError) -> HarnessError {
    match e {
        plan::PlanError::ShmSize { size, why } => HarnessError::PrivateShm(namespace::NamespaceError {
            size,
            step: "parse",
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, why),
        }),
        plan::PlanError::MemoryLimit { limit, why } => {
            HarnessError::MemoryLimit { file: input.file.clone(), limit, why: why.into() }
        }
        e @ plan::PlanError::Pattern(_) => HarnessError::Plan { file: input.file.clone(), source: e },
    }
}

/// The scenario the ranks get: checkpoints go under the scenario's own folder unless the file
/// gave an absolute `checkpoint_dir`, and a relative `resume` is taken from where ups-doctor was
/// started (the user typed it there).
fn with_absolute_paths(s: &Scenario, cwd: &Path, scenario_dir: &Path) -> Scenario {
    let mut s = s.clone();
    let t = &mut s.train;
    if t.checkpoint_every > 0 || t.resume.is_some() {
        t.checkpoint_dir = scenario_dir.join(&t.checkpoint_dir).to_string_lossy().into_owned();
    }
    if let Some(resume) = t.resume.as_mut() {
        *resume = cwd.join(&*resume).to_string_lossy().into_owned();
    }
    s
}

/// Where the built-in trainer's executable is: `UPS_DOCTOR_TRAINER` when set, else
/// `ups-doctor-trainer` beside the running `ups-doctor` (cargo builds both into one folder).
pub fn trainer_program(doctor: &Path) -> PathBuf {
    match std::env::var_os(TRAINER_ENV) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => doctor.with_file_name("ups-doctor-trainer"),
    }
}

/// The machine facts a run of `scenarios` needs: Python for a user's command, libtorch's (from the
/// trainer) for a built-in scenario.
pub fn machine_needs<'a>(
    scenarios: impl IntoIterator<Item = &'a Scenario>,
    doctor: &Path,
) -> crate::probe::Needs {
    let mut needs = crate::probe::Needs::default();
    for s in scenarios {
        if let Some(argv) = &s.command {
            needs.python |= runs_python(argv);
        } else {
            needs.trainer = Some(trainer_program(doctor));
        }
    }
    needs
}

/// Whether a command runs Python, as far as its words tell: an interpreter (`python3`, `srun
/// python …`), a Python launcher (`torchrun`, `accelerate`, `deepspeed`, `lightning`) or a `.py`
/// file anywhere in it (`bash -c 'exec torchrun … train.py'` too). Only such a command makes the
/// run ask the Python on `PATH` for its facts (a process of its own, through pyenv's shims ~30).
pub fn runs_python(argv: &[String]) -> bool {
    argv.iter().flat_map(|a| a.split_whitespace()).any(|word| {
        let name = Path::new(word).file_name().and_then(|n| n.to_str()).unwrap_or(word);
        name.starts_with("python")
            || name == "ipython"
            || crate::scenario::launcher::of_program(name).is_some_and(|l| l.is_python)
            || name.ends_with(".py")
    })
}

/// Names the trainer executable, for a binary moved away from it (see [`trainer_program`]).
pub const TRAINER_ENV: &str = "UPS_DOCTOR_TRAINER";

/// Runs one scenario under supervision. `dir` is the scenario's own folder for logs and the
/// resolved scenario file; `rel` is how that folder is named relative to the report.
/// When the user interrupted it, the result is marked `interrupted` and keeps what the ranks had
/// (phases, steps, stacks taken before teardown).
pub fn run_scenario(
    input: &ScenarioInput,
    program: &Path,
    dir: &Path,
    rel: &str,
    progress: &mut dyn run::events::Listener,
    interrupted: &AtomicBool,
) -> Result<ScenarioResult, HarnessError> {
    run_scenario_on_node(input, program, dir, rel, progress, interrupted, None)
}

/// [`run_scenario`] for one node of a multi-node run: `input` holds this node's ranks only, the
/// placement gives them their global environment, and the link carries failures between nodes
/// (see [`crate::nodes`]).
/// Where each rank its launcher (or anyone) stopped with SIGTERM was, in its own words: into its
/// dumps, unless py-spy already read that process (a hang: ups-doctor looks before it stops a
/// rank); and the Flight Recorder entries each handed over when asked, each one's wall-clock
/// creation time put on the scenario's timeline (which began at `start`). Then the folder goes;
/// a failure to remove it leaves a few text files in the run's own folder.
fn read_stop_stacks(folder: &Path, ends: &mut [RankEnd], start: std::time::Instant) {
    for end in ends {
        let Some(pid) = end.pid else { continue };
        let read = end.dumps.iter().any(|d| d.pid == pid && d.py_spy.is_some());
        if let Some(dump) = os::stacks::stack_at_sigterm(folder, pid, end.rank).filter(|_| !read) {
            end.dumps.push(dump);
        }
        if let Some(mut record) =
            os::stacks::flight_dump(folder, pid).and_then(|t| FlightRecord::from_dump(&t))
        {
            for e in &mut record.entries {
                e.at_s = e
                    .created_ns
                    .and_then(os::process::wall_instant)
                    .and_then(|at| at.checked_duration_since(start))
                    .map(|d| d.as_secs_f64());
            }
            end.state.observed.get_or_insert_with(Default::default).flight = Some(record);
        }
    }
    let _ = std::fs::remove_dir_all(folder);
}

/// Asks the observed ranks for their Flight Recorder entries as soon as one fails on its own or
/// the ranks are found hung (then the others are still in the collective they wait in): a
/// listener of the run's event stream.
struct FlightRequest {
    folder: PathBuf,
    asked: bool,
}

impl run::events::Listener for FlightRequest {
    fn event(&mut self, event: run::events::RunEvent) {
        use run::events::RunEvent;
        let now = matches!(
            event,
            RunEvent::Hung { .. }
                | RunEvent::RankEnded { failed: true, .. }
                | RunEvent::StacksRequested { .. }
        );
        if now && !std::mem::replace(&mut self.asked, true) {
            os::stacks::ask_for_flight(&self.folder);
        }
    }
}

pub fn run_scenario_on_node(
    input: &ScenarioInput,
    program: &Path,
    dir: &Path,
    rel: &str,
    progress: &mut dyn run::events::Listener,
    interrupted: &AtomicBool,
    node: Option<(&crate::harness::plan::NodePlacement, &mut dyn crate::harness::run::events::Listener)>,
) -> Result<ScenarioResult, HarnessError> {
    let (placement, link) = node.map_or((None, None), |(p, l)| (Some(p), Some(l)));
    let prepare = |path: &Path, source| HarnessError::Prepare { path: path.to_path_buf(), source };
    // Files of the run are created new, never through a link planted in a reused `--out`.
    crate::run_files::folder(dir).map_err(|e| prepare(dir, e))?;
    let resolved_file = dir.join("scenario.json");
    let here = std::env::current_dir().map_err(|e| prepare(Path::new("."), e))?;
    let resolved = with_absolute_paths(&input.scenario, &here, &here.join(dir));
    // Its secret values are masked in every output from now on, lines printed before its
    // result.json included (`crate::secrets`); scenario.json keeps them, to run again.
    if let Ok(doc) = serde_json::to_value(&input.scenario) {
        crate::secrets::learn(&doc);
    }
    let json = serde_json::to_string_pretty(&resolved).expect("scenarios always serialise");
    crate::run_files::replace(&resolved_file, (json + "\n").as_bytes())
        .map_err(|e| prepare(&resolved_file, e))?;

    let plan = plan_on_this_machine(input, program, &resolved_file, dir, &here, placement)?;
    if let Some(site) = &plan.python_site {
        let file = site.join("sitecustomize.py");
        let text = crate::harness::plan::command::SITECUSTOMIZE.as_bytes();
        crate::run_files::folder(site).map_err(|e| prepare(site, e))?;
        // Read only where it is a regular file (a planted FIFO would block the read; a link is
        // replaced, never written through).
        let regular = std::fs::symlink_metadata(&file).is_ok_and(|m| m.file_type().is_file());
        if !(regular && std::fs::read(&file).is_ok_and(|b| b == text)) {
            crate::run_files::replace(&file, text).map_err(|e| prepare(&file, e))?;
        }
    }
    if let Some(folder) = &plan.stop_stacks {
        crate::run_files::folder(folder).map_err(|e| prepare(folder, e))?;
    }
    // Validation has checked the sizes; a value that slipped past it is refused by the plan.
    let private_shm = match &plan.private_shm {
        Some((bytes, label)) => Some(namespace::PrivateShm::create(*bytes, label)?),
        None => None,
    };
    let Containment { cgroup, unavailable: cgroup_unavailable, orphans } =
        scenario_cgroup(input, plan.memory_limit)?;
    let resources = run::supervise::Resources {
        scenario: &input.scenario,
        private_shm: private_shm.as_ref(),
        cgroup: cgroup.as_ref(),
    };
    let mut ask = plan.stop_stacks.clone().map(|folder| FlightRequest { folder, asked: false });
    let mut listeners: Vec<&mut dyn run::events::Listener> = vec![progress];
    if let Some(ask) = ask.as_mut() {
        listeners.push(ask);
    }
    if let Some(link) = link {
        listeners.push(link);
    }
    let mut observed = run::supervise::supervise(&plan, &resources, listeners, interrupted);
    // The namespace holder goes now; the private /dev/shm goes with it. The cgroup goes too,
    // with anything still in it.
    drop(private_shm);
    drop(cgroup);
    observed.leftovers.processes.extend(orphans);
    if let Some(folder) = &plan.stop_stacks {
        read_stop_stacks(folder, &mut observed.ends, observed.start);
    }
    // The program formed a larger process group than the scenario said: the run watched that
    // many ranks, and the result's scenario says so (`external.world_size_declared` keeps what was
    // said).
    let grown;
    let scenario = match observed.external.as_ref().and_then(|e| e.world_size_declared) {
        Some(_) => {
            let mut s = input.scenario.clone();
            s.launch.world_size = u32::try_from(observed.ends.len()).unwrap_or(u32::MAX);
            grown = s;
            &grown
        }
        None => &input.scenario,
    };
    let mut ranks: Vec<RankResult> = observed.ends.iter().map(classify_rank).collect();
    for r in &mut ranks {
        r.stdout_log = format!("{rel}/{}", r.stdout_log);
        r.stderr_log = format!("{rel}/{}", r.stderr_log);
    }
    let rank0 = observed.ends.first().map(|e| &e.state);
    let mut result = ScenarioResult {
        name: input.scenario.name.clone(),
        file: input.file.display().to_string(),
        overrides: input.overrides.clone(),
        scenario: scenario.clone(),
        // Written by the judge below.
        outcome: OutcomeKind::Passed,
        met_expectation: false,
        interrupted: observed.interrupted,
        expectation_mismatches: Vec::new(),
        verdict: Verdict::unjudged(),
        first_failure: None,
        wall_s: observed.wall_s,
        steps_per_s: rank0.and_then(RankState::steps_per_s),
        samples_per_s: {
            let rates: Vec<f64> = observed.ends.iter().filter_map(|e| e.state.samples_per_s()).collect();
            (!rates.is_empty()).then(|| rates.iter().sum())
        },
        memory: Some(observed.memory),
        leftovers: observed.leftovers,
        external: observed.external,
        gpu: observed.gpu,
        cgroup: observed.cgroup,
        oom_kills: observed.oom_kills,
        xids: observed.xids,
        cgroup_unavailable: cgroup_unavailable.map(|why| why.to_string()),
        nodes: None,
        ranks,
    };
    crate::diagnose::conclude(&mut result, crate::diagnose::Seen::Ran);
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::runs_python;
    use crate::harness::run::events::{Listener, RunEvent};

    /// Records the name of every event it is told, ticked every 20 ms.
    #[derive(Default)]
    struct Recorder(Vec<&'static str>);

    impl Listener for Recorder {
        fn tick_every(&self) -> Option<std::time::Duration> {
            Some(std::time::Duration::from_millis(20))
        }
        fn event(&mut self, event: RunEvent) {
            self.0.push(match event {
                RunEvent::ScenarioStarted { .. } => "started scenario",
                RunEvent::ScenarioFinished { .. } => "finished scenario",
                RunEvent::Started { .. } => "started ranks",
                RunEvent::Tick { .. } => "tick",
                RunEvent::RankEnded { .. } => "rank ended",
                RunEvent::Hung { .. } => "hung",
                RunEvent::StacksRequested { .. } => "stacks requested",
                RunEvent::Placed { .. } => "placed",
                RunEvent::TearingDown { .. } => "tearing down",
            });
        }
    }

    /// A run on one node publishes one stream: a listener that is not a node's link (the live
    /// line is one) hears the ranks start, the hang, the teardown and each rank's end, as the link
    /// of a multi-node run does, and two listeners hear the same events.
    #[test]
    fn a_run_publishes_one_stream_that_every_listener_hears_whole() {
        let dir = tempfile::tempdir().unwrap();
        let scenario: crate::scenario::Scenario = serde_json::from_value(serde_json::json!({
            "name": "stream",
            "command": ["sh", "-c", "sleep 60"],
            "limits": { "timeout_s": 120, "hang_after_s": 1 },
            "expect": { "outcome": "hung" }
        }))
        .unwrap();
        let input =
            super::ScenarioInput { file: dir.path().join("stream.json"), overrides: Vec::new(), scenario };
        let (mut first, mut second) = (Recorder::default(), Recorder::default());
        let interrupted = std::sync::atomic::AtomicBool::new(false);
        let placement = crate::harness::plan::NodePlacement {
            node: 0,
            nodes: 1,
            local_world: 1,
            master_addr: "127.0.0.1".into(),
            master_port: 29400,
            first_rank: None,
        };
        let result = super::run_scenario_on_node(
            &input,
            std::path::Path::new("/nonexistent-trainer"),
            &dir.path().join("run"),
            "run",
            &mut first,
            &interrupted,
            Some((&placement, &mut second)),
        )
        .unwrap();
        assert_eq!(result.outcome, crate::scenario::OutcomeKind::Hung, "{:?}", result.verdict);
        let told = |r: &Recorder| -> Vec<&'static str> {
            let mut said: Vec<&'static str> = r.0.iter().copied().filter(|e| *e != "tick").collect();
            said.dedup();
            said
        };
        assert_eq!(
            told(&first),
            ["started scenario", "started ranks", "hung", "tearing down", "rank ended", "finished scenario"],
            "{:?}",
            first.0
        );
        assert_eq!(
            first.0.iter().filter(|e| **e != "tick").collect::<Vec<_>>(),
            second.0.iter().filter(|e| **e != "tick").collect::<Vec<_>>()
        );
        assert!(first.0.contains(&"tick") && second.0.contains(&"tick"));
    }

    fn words(line: &str) -> Vec<String> {
        line.split(' ').map(str::to_string).collect()
    }

    #[test]
    fn a_command_runs_python_when_its_words_name_an_interpreter_a_launcher_or_a_script() {
        for yes in [
            "python3 train.py",
            "/usr/bin/python3.11 -m torch.distributed.run --nproc_per_node 2 t.py",
            "torchrun --nproc_per_node 2 train.py",
            "accelerate launch train.py",
            "srun -n 2 ./train.py",
        ] {
            assert!(runs_python(&words(yes)), "{yes}");
        }
        assert!(runs_python(&["bash".into(), "-c".into(), "export X=1; exec torchrun t.py".into()]));
        for no in ["true", "sleep 1", "./a.out --steps 3", "ups-doctor-trainer train s.json"] {
            assert!(!runs_python(&words(no)), "{no}");
        }
    }
}
