//! The `ups-doctor` command line: parses arguments, dispatches, and maps every result to the
//! documented exit status ([`ups_doctor::exit`]: 0 every scenario met its `expect`, 1 some did
//! not, 2 bad input, 3 internal error, 130 interrupted), listed at the end of `--help`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use clap::{Parser, Subcommand};
use nix::sys::signal::{SigHandler, Signal, signal};

use ups_doctor::harness::{self, Progress, ProgressMode, ScenarioInput};
use ups_doctor::probe::env::EnvSummary;
use ups_doctor::probe::gpu_env::GpuEnv;
use ups_doctor::report;
use ups_doctor::scenario::{self, Override};
use ups_doctor::schema::RunResult;
use ups_doctor::trainer;
use ups_doctor::{Error, exit};

/// Finds out why distributed deep-learning training crashes, hangs or crawls.
#[derive(Parser)]
#[command(name = "ups-doctor", version, about, long_about = None, after_help = exit::HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run scenario files (or every *.json in a folder) and write a report.
    #[command(after_help = exit::HELP)]
    Run {
        /// Scenario files or folders [default: scenarios/].
        paths: Vec<PathBuf>,
        /// Override a scenario field for every scenario, e.g. `--set train.steps=20`.
        #[arg(long = "set", value_name = "PATH=VALUE")]
        set: Vec<Override>,
        /// Folder for the report [default: reports/runs/<time>].
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Print the result as JSON on stdout (the matrix goes to stderr).
        #[arg(long)]
        json: bool,
        /// No live progress.
        #[arg(long)]
        quiet: bool,
        /// Mask GPU UUIDs and your home folder in the report and result.json, for a public issue.
        #[arg(long)]
        public: bool,
        #[command(flatten)]
        nodes: NodeArgs,
    },
    /// Cut a failing scenario down to a 1-minimal configuration that still fails the same way.
    #[command(after_help = exit::HELP)]
    Bisect(BisectArgs),
    /// Re-render report.md (and each scenario's full report) from a run folder's result.json.
    #[command(after_help = exit::HELP)]
    Report {
        /// A run folder (it holds result.json).
        dir: PathBuf,
        /// Mask GPU UUIDs and your home folder (result.json is rewritten masked too).
        #[arg(long)]
        public: bool,
        /// Print the report to paste into a GitHub issue (at most 65,536 characters) on stdout,
        /// and on stderr the files to attach with it.
        #[arg(long)]
        issue: bool,
        /// Also write DIR/ups-doctor-bundle.tar.gz to attach to an issue: report, result.json,
        /// trace.json and every process's log tail, masked as --public masks.
        #[arg(long)]
        bundle: bool,
    },
    /// Describe this machine: libtorch, CPUs, memory, /dev/shm, ulimits, cgroup limits, variables.
    Env {
        #[arg(long, conflicts_with = "markdown")]
        json: bool,
        /// The report's `## Environment` section, to paste into an issue.
        #[arg(long)]
        markdown: bool,
        /// Mask GPU UUIDs and your home folder.
        #[arg(long)]
        public: bool,
    },
    /// Train one rank of a scenario: the entry point the harness launches. Also works by hand or
    /// under torchrun (reads RANK, WORLD_SIZE, LOCAL_RANK).
    Train {
        /// The scenario file.
        scenario: PathBuf,
        #[arg(long = "set", value_name = "PATH=VALUE")]
        set: Vec<Override>,
        /// Run only the data path (no model) and print its throughput: for bench/.
        #[arg(long, hide = true)]
        loader_only: bool,
    },
    /// What libtorch can do with CUDA here, as JSON: the child `run` and `env` ask (internal).
    #[command(hide = true)]
    CudaProbe,
    /// Prints NVML readings of every GPU as JSON lines, to record test fixtures (internal).
    #[command(hide = true)]
    NvmlRecord {
        /// Readings to take.
        #[arg(long, default_value_t = 20)]
        count: u32,
        /// Milliseconds between readings.
        #[arg(long, default_value_t = 200)]
        every_ms: u64,
    },
    /// A data-loader worker started by `train` with `start_method: spawn` (internal).
    #[command(hide = true)]
    LoaderWorker {
        /// The worker's configuration, as JSON.
        config: String,
    },
}

/// One node of a multi-node run (see README, "Across nodes"). Without these flags, Slurm's
/// `SLURM_NNODES`/`SLURM_NODEID`/`SLURM_JOB_NODELIST` or torchrun-style `NNODES`/`NODE_RANK`/
/// `MASTER_ADDR` place the node; with none of them the run is on this machine only.
#[derive(clap::Args, Default)]
struct NodeArgs {
    /// Nodes in the run: start the same command once per node; `launch.world_size` is the ranks
    /// of all nodes together.
    #[arg(long, value_name = "N", help_heading = "Across nodes")]
    nodes: Option<u32>,
    /// This node's rank: 0 runs the coordinator, which writes the one report.
    #[arg(long, value_name = "R", help_heading = "Across nodes")]
    node_rank: Option<u32>,
    /// Node 0's address, which every agent connects to [default: 127.0.0.1:29411].
    #[arg(long, value_name = "HOST:PORT", help_heading = "Across nodes")]
    coordinator: Option<String>,
    /// What node 0 listens on, when not the coordinator's address (`0.0.0.0:PORT`: every interface).
    #[arg(long, value_name = "ADDR:PORT", help_heading = "Across nodes")]
    listen: Option<String>,
    /// How long node 0 waits for the others to join, and they for it.
    #[arg(long, value_name = "SECS", default_value_t = 120.0, help_heading = "Across nodes")]
    join_timeout: f64,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum StrategyArg {
    Ladder,
    Ddmin,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run { paths, set, out, json, quiet, public, nodes } => {
            run(paths, set, out, json, quiet, public, nodes)
        }
        Command::Report { dir, public, issue, bundle } => {
            rerender(&dir, public, issue).and_then(|code| if bundle { write_bundle(&dir) } else { Ok(code) })
        }
        Command::Bisect(args) => bisect(args),
        Command::Env { json, markdown, public } => print_env(json, markdown, public),
        Command::CudaProbe => {
            println!("{}", serde_json::to_string(&trainer::cuda::support()).expect("serialises"));
            Ok(ExitCode::from(exit::MET))
        }
        Command::NvmlRecord { count, every_ms } => nvml_record(count, every_ms),
        Command::Train { scenario, set, loader_only } => train(&scenario, &set, loader_only),
        Command::LoaderWorker { config } => {
            trainer::prepare_process();
            Ok(ExitCode::from(trainer::loader::worker::run_spawned(&config) as u8))
        }
    };
    result.unwrap_or_else(|error| {
        eprintln!("error: {error}");
        ExitCode::from(error.exit_code())
    })
}

#[derive(clap::Args)]
struct BisectArgs {
    /// The failing scenario file.
    scenario: PathBuf,
    #[arg(long = "set", value_name = "PATH=VALUE")]
    set: Vec<Override>,
    /// Most real runs to spend (cached results are free).
    #[arg(long, default_value_t = 60)]
    budget: usize,
    /// Confidence required before a cut is believed to make a flaky failure pass.
    #[arg(long, default_value_t = 0.95)]
    confidence: f64,
    /// Runs of the original scenario that confirm the failure and estimate its rate.
    #[arg(long, default_value_t = 2)]
    confirm: usize,
    /// Independent probes run in parallel.
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// Folder for the report [default: reports/runs/<time>-bisect].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Folder of cached probe results, shared by bisects of the same scenario.
    #[arg(long, value_name = "DIR", default_value = "reports/runs/.bisect-cache")]
    cache: PathBuf,
    /// Print bisect.json on stdout.
    #[arg(long)]
    json: bool,
    /// No progress lines.
    #[arg(long)]
    quiet: bool,
    /// `ladder` (big cuts first) or `ddmin` (no ladder): for bench/, which measures the
    /// runs the ladder saves.
    #[arg(long, hide = true, value_enum, default_value_t = StrategyArg::Ladder)]
    strategy: StrategyArg,
}

fn bisect(args: BisectArgs) -> Result<ExitCode, Error> {
    install_interrupt_handler();
    if !(args.confidence > 0.0 && args.confidence < 1.0) {
        return Err(Error::BadInput(format!(
            "--confidence {} is not between 0 and 1 (exclusive); e.g. `--confidence 0.95`",
            args.confidence
        )));
    }
    for (flag, value) in [("--budget", args.budget), ("--confirm", args.confirm), ("--jobs", args.jobs)] {
        if value == 0 {
            return Err(Error::BadInput(format!("{flag} must be at least 1")));
        }
    }
    let scenario = scenario::load_file(&args.scenario, &args.set)?;
    let input = [ScenarioInput {
        file: args.scenario.clone(),
        overrides: args.set.iter().map(|o| o.raw.clone()).collect(),
        scenario: scenario.clone(),
    }];
    check_gpus(&input)?;
    check_memory_limits(&input)?;
    let out_dir = match args.out {
        Some(dir) => {
            prepare_out_dir(&dir)?;
            dir
        }
        None => fresh_run_dir(Path::new("reports/runs"), &format!("-bisect-{}", sanitize(&scenario.name)))?,
    };
    let program = current_exe()?;
    if !args.quiet {
        eprintln!(
            "bisecting {} (budget {} runs, {} in parallel)",
            args.scenario.display(),
            args.budget,
            args.jobs
        );
    }
    let request = ups_doctor::bisect::Request {
        file: args.scenario.clone(),
        overrides: args.set.iter().map(|o| o.raw.clone()).collect(),
        scenario,
        options: ups_doctor::bisect::Options {
            budget: args.budget,
            confidence: args.confidence,
            confirm_runs: args.confirm,
            strategy: match args.strategy {
                StrategyArg::Ladder => ups_doctor::bisect::Strategy::Ladder,
                StrategyArg::Ddmin => ups_doctor::bisect::Strategy::Ddmin,
            },
        },
        jobs: args.jobs,
        out_dir: out_dir.clone(),
        cache_dir: args.cache,
        show_progress: !args.quiet,
    };
    let record = ups_doctor::bisect::run_session(&request, &program, &INTERRUPTED)?;
    if INTERRUPTED.load(Ordering::SeqCst) {
        eprintln!("interrupted; partial bisect written to {}", out_dir.display());
        return Ok(ExitCode::from(exit::INTERRUPTED));
    }
    let summary = match (&record.signature, record.boundary.is_empty()) {
        (None, _) => "the scenario did not fail: nothing to bisect".to_string(),
        (Some(sig), true) => format!(
            "{} still happens with [{}]; no remaining component can be cut further (each is at its minimum, or cutting it makes the scenario invalid)",
            sig.describe(),
            record.minimal_delta.join(", ")
        ),
        (Some(sig), false) => format!(
            "{} still happens with [{}]; passes when any of [{}] is cut",
            sig.describe(),
            record.minimal_delta.join(", "),
            record.boundary.join(", ")
        ),
    };
    let report = out_dir.join("bisect.md");
    if args.json {
        eprintln!("{summary}\nreport: {}", report.display());
        println!("{}", serde_json::to_string_pretty(&record).expect("records serialise"));
    } else {
        println!(
            "{summary}\n{} real runs, confidence {:.2}\nreport: {}",
            record.runs,
            record.confidence,
            report.display()
        );
    }
    Ok(ExitCode::from(if record.signature.is_some() && !record.budget_exhausted {
        exit::MET
    } else {
        exit::NOT_MET
    }))
}

fn rerender(dir: &Path, public: bool, issue: bool) -> Result<ExitCode, Error> {
    let path = report::rerender_masked(dir, public)?;
    if issue {
        let run = report::read_run(dir)?;
        let text = report::issue_text(&run);
        print!("{}", text.paste);
        eprintln!(
            "ups-doctor: paste the {} characters above (from {}) into the issue and attach:",
            text.paste.chars().count(),
            path.display()
        );
        for file in &text.attach {
            eprintln!("  {}", dir.join(file).display());
        }
        eprintln!(
            "or all of it and every log tail in one file: ups-doctor report {} --bundle",
            dir.display()
        );
    } else {
        println!("{}", path.display());
    }
    Ok(ExitCode::from(exit::MET))
}

fn write_bundle(dir: &Path) -> Result<ExitCode, Error> {
    let (path, files) = report::write_bundle(dir)?;
    eprintln!("ups-doctor: {} files, masked, in {} — attach it to the issue", files.len(), path.display());
    println!("{}", path.display());
    Ok(ExitCode::from(exit::MET))
}

fn train(file: &Path, set: &[Override], loader_only: bool) -> Result<ExitCode, Error> {
    // Before anything else: the crash handlers and the stack-dump thread must exist before tch
    // starts threads (they inherit the signal mask).
    trainer::prepare_process();
    let scenario = scenario::load_file(file, set)?;
    let status = if loader_only { trainer::run_loader_only(&scenario) } else { trainer::run_rank(&scenario) };
    Ok(ExitCode::from(status as u8))
}

/// The machine, with its GPUs (NVML here, libtorch's CUDA through a child `cuda-probe`).
fn collect_env() -> EnvSummary {
    let mut env = EnvSummary::collect();
    if let Ok(program) = std::env::current_exe() {
        env.gpu = Some(GpuEnv::collect(&program));
    }
    env
}

fn nvml_record(count: u32, every_ms: u64) -> Result<ExitCode, Error> {
    let mut sampler = ups_doctor::probe::nvml::Sampler::new()
        .map_err(|e| Error::BadInput(format!("no GPU to record: {e}")))?;
    let start = std::time::Instant::now();
    for _ in 0..count {
        let sample = harness::GpuSample { t_s: start.elapsed().as_secs_f64(), gpus: sampler.sample() };
        println!("{}", serde_json::to_string(&sample).expect("serialises"));
        std::thread::sleep(std::time::Duration::from_millis(every_ms));
    }
    Ok(ExitCode::from(exit::MET))
}

/// Scenarios that ask for CUDA ranks must find a GPU for each of them before anything runs
/// (unless `UPS_DOCTOR_FORCE_GPU` asks to launch anyway). The machine is asked once, through a
/// child `cuda-probe`, and only when some scenario needs it.
fn check_gpus(inputs: &[ScenarioInput]) -> Result<(), Error> {
    let cuda: Vec<&ScenarioInput> =
        inputs.iter().filter(|i| i.scenario.launch.device == scenario::Device::Cuda).collect();
    if cuda.is_empty() || trainer::device::forced() {
        return Ok(());
    }
    let program = current_exe()?;
    let support = ups_doctor::probe::gpu_env::cuda_support(&program).map_err(Error::Internal)?;
    let force = trainer::device::FORCE_GPU_ENV;
    let errors: Vec<String> = cuda
        .iter()
        .filter_map(|i| {
            let file = i.file.display();
            let n = support.device_count;
            let ranks = i.scenario.launch.world_size as usize;
            if n == 0 {
                Some(format!(
                    "{file}: `launch.device`: `cuda`, but this machine has no GPU CUDA can use: {}\n  hint: use \
                     `device: auto` to train on the CPU where there is no GPU, or run it on a machine with an \
                     NVIDIA GPU ({force}=1 launches anyway, and each rank fails at start)",
                    support.why_not.as_deref().unwrap_or("CUDA sees no GPU")
                ))
            } else if ranks > n {
                Some(format!(
                    "{file}: `launch.world_size`: {ranks} CUDA ranks, but this machine has {n} GPU{}: every CUDA \
                     rank needs a GPU of its own (NCCL refuses two ranks on one GPU)\n  hint: use `world_size: {n}` \
                     or fewer, or `device: cpu` ranks ({force}=1 launches anyway, ranks sharing GPUs, to see \
                     NCCL's own `Duplicate GPU detected` error)",
                    if n == 1 { "" } else { "s" }
                ))
            } else {
                None
            }
        })
        .collect();
    if errors.is_empty() { Ok(()) } else { Err(Error::BadInput(errors.join("\nerror: "))) }
}

/// Scenarios with `launch.memory_limit` need a memory cgroup: one is made and removed before
/// anything runs, so a machine that cannot make one is bad input (exit 2) that names the field,
/// not a failure halfway through the run.
fn check_memory_limits(inputs: &[ScenarioInput]) -> Result<(), Error> {
    let errors: Vec<String> = inputs
        .iter()
        .filter_map(|i| {
            let limit = i.scenario.launch.memory_limit.as_ref()?;
            let bytes = scenario::parse_size(limit).ok()?;
            let why = harness::os::cgroup::check_memory_limit(bytes).err()?;
            let field = "launch.memory_limit";
            let at = match i.overrides.iter().rev().find(|o| o.starts_with(&format!("{field}="))) {
                Some(raw) => format!("{}: --set {raw}", i.file.display()),
                None => scenario::field_location(&i.file, field),
            };
            Some(format!(
                "{at}: `{field}`: cannot limit the scenario's memory to {limit} here: {why}\n  hint: a memory limit \
                 needs a cgroup ups-doctor can create: run as root where cgroup v1's memory controller is mounted, \
                 or in a cgroup v2 group delegated to you with the memory controller (`systemd-run --user --scope \
                 -p Delegate=yes ups-doctor run …`); or remove `memory_limit`"
            ))
        })
        .collect();
    if errors.is_empty() { Ok(()) } else { Err(Error::BadInput(errors.join("\nerror: "))) }
}

fn print_env(json: bool, markdown: bool, public: bool) -> Result<ExitCode, Error> {
    let mut env = collect_env();
    if public {
        env = report::public::mask(&env, report::public::home().as_deref()).map_err(Error::Internal)?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&env).expect("env serialises"));
    } else if markdown {
        print!("{}", report::render_env_markdown(&env));
    } else {
        print!("{}", report::render_env_text(&env));
    }
    Ok(ExitCode::from(exit::MET))
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
static INTERRUPTS: AtomicUsize = AtomicUsize::new(0);
/// When the first interrupt arrived (`CLOCK_MONOTONIC`, nanoseconds).
static FIRST_INTERRUPT_NS: AtomicU64 = AtomicU64::new(0);
/// A second signal this soon after the first is the same request (GNU `timeout` signals
/// ups-doctor, then its whole process group; a terminal's Ctrl-C reaches the group as well): it
/// does not cut the orderly stop short.
const INTERRUPT_GRACE_NS: u64 = 1_000_000_000;

extern "C" fn on_interrupt(_sig: i32) {
    // Async-signal-safe: nix calls clock_gettime and allocates nothing.
    let now = ups_doctor::protocol::monotonic_ns().unwrap_or(0);
    INTERRUPTED.store(true, Ordering::SeqCst);
    // Async-signal-safe: a byte into a pipe wakes a supervisor asleep until its next deadline.
    harness::run::interrupt::notify();
    match INTERRUPTS.fetch_add(1, Ordering::SeqCst) {
        0 => FIRST_INTERRUPT_NS.store(now, Ordering::SeqCst),
        1 if now.saturating_sub(FIRST_INTERRUPT_NS.load(Ordering::SeqCst)) <= INTERRUPT_GRACE_NS => {}
        // A third signal, or a second one after the grace: the user insists. Leave now; ranks
        // die with us (PR_SET_PDEATHSIG); results of finished scenarios are already on disk.
        // `exit_now` is async-signal-safe and runs no destructor or atexit handler of the
        // interrupted code.
        _ => harness::os::sys::exit_now(exit::INTERRUPTED as i32),
    }
}

/// SIGINT, SIGTERM (Slurm, Kubernetes, `timeout`) and SIGHUP all start the same orderly stop.
/// Installed before anything else a command does, so that no signal finds the default action.
fn install_interrupt_handler() {
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler is async-signal-safe: it only touches atomics, reads the clock and
        // calls _exit.
        let _ = unsafe { signal(sig, SigHandler::Handler(on_interrupt)) };
    }
}

/// Creates `--out` (or checks it) before anything runs: a folder that cannot be written is the
/// user's to fix, found now rather than after the first scenario.
fn prepare_out_dir(dir: &Path) -> Result<(), Error> {
    let bad = |e: std::io::Error| {
        Error::BadInput(format!(
            "`--out {}` cannot be written: {e}\n  hint: pick a folder you can write to, with some free space",
            dir.display()
        ))
    };
    std::fs::create_dir_all(dir).map_err(bad)?;
    let probe = dir.join(format!(".ups-doctor-write-test.{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(bad)?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

fn run(
    paths: Vec<PathBuf>,
    set: Vec<Override>,
    out: Option<PathBuf>,
    json: bool,
    quiet: bool,
    public: bool,
    node_args: NodeArgs,
) -> Result<ExitCode, Error> {
    install_interrupt_handler();
    let flags = ups_doctor::nodes::config::NodeFlags {
        nodes: node_args.nodes,
        node_rank: node_args.node_rank,
        coordinator: node_args.coordinator,
        listen: node_args.listen,
        join_timeout_s: Some(node_args.join_timeout),
    };
    let node = ups_doctor::nodes::NodeConfig::resolve(&flags, &|name| std::env::var(name).ok())
        .map_err(|e| Error::BadInput(e.to_string()))?;
    let paths = if paths.is_empty() { vec![PathBuf::from("scenarios")] } else { paths };
    let files = scenario::scenario_files(&paths)?;
    // Validate everything before running anything: a typo in the fifth file must not cost the
    // time of the first four.
    let mut inputs = Vec::new();
    let mut errors = Vec::new();
    for file in files {
        match scenario::load_file(&file, &set) {
            Ok(scenario) => inputs.push(ScenarioInput {
                file,
                overrides: set.iter().map(|o| o.raw.clone()).collect(),
                scenario,
            }),
            Err(e) => errors.push(e),
        }
    }
    if !errors.is_empty() {
        return Err(Error::Scenarios(errors));
    }
    check_gpus(&inputs)?;
    check_memory_limits(&inputs)?;
    if node.is_some() && inputs.len() != 1 {
        return Err(Error::BadInput(format!(
            "a multi-node run runs one scenario; {} were given: run each with its own `ups-doctor run FILE --nodes …`",
            inputs.len()
        )));
    }
    if let (Some(config), [input]) = (&node, inputs.as_slice())
        && ![1, config.nodes].contains(&input.scenario.launch.nodes)
    {
        return Err(Error::BadInput(format!(
            "{}: `launch.nodes` is {}, but this agent was placed as one of {} nodes ({}): give every node the same count",
            input.file.display(),
            input.scenario.launch.nodes,
            config.nodes,
            config.source
        )));
    }

    let out_dir = match out {
        Some(dir) => {
            prepare_out_dir(&dir)?;
            dir
        }
        None => fresh_run_dir(Path::new("reports/runs"), "")?,
    };
    let program = current_exe()?;
    let mode = if quiet { ProgressMode::Quiet } else { ProgressMode::detect() };
    let mut progress = Progress::new(mode);
    let mut result = RunResult {
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        started_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        command: std::env::args().collect(),
        environment: collect_env(),
        scenarios: Vec::new(),
        not_run: Vec::new(),
        interrupted: false,
        stopped_by: None,
    };
    let home = report::public::home();
    let shown = |result: &RunResult| -> Result<RunResult, Error> {
        if public {
            report::public::mask(result, home.as_deref())
                .map_err(|e| Error::Internal(format!("--public: {e}")))
        } else {
            Ok(result.clone())
        }
    };
    let save = |result: &RunResult| save_honestly(&out_dir, &shown(result)?);
    let width = inputs.len().to_string().len();
    let mut node_done: Option<Box<dyn FnOnce(bool, &str)>> = None;
    let mut agent_verdict = None;
    if let Some(config) = &node {
        let input = &inputs[0];
        let rel = format!("1-{}", sanitize(&input.scenario.name));
        let request = ups_doctor::nodes::run::NodeRequest {
            config,
            input,
            program: &program,
            out_dir: &out_dir,
            rel: &rel,
            progress: &mut progress,
            interrupted: &INTERRUPTED,
        };
        use ups_doctor::nodes::net::NodeError;
        use ups_doctor::nodes::run::Finished;
        match ups_doctor::nodes::run::run_node(request) {
            Err(NodeError::BadInput(m)) => return Err(Error::BadInput(m)),
            Err(NodeError::Internal(m)) => {
                result.stopped_by = Some(m.clone());
                result.not_run = vec![input.scenario.name.clone()];
                save(&result)?;
                return Err(Error::Internal(m));
            }
            Ok(Finished::Coordinator { result: merged, coordinator }) => {
                result.interrupted = merged.interrupted;
                result.scenarios.push(merged);
                node_done = Some(Box::new(move |met, report| {
                    ups_doctor::nodes::run::finish(&coordinator, met, report)
                }));
            }
            Ok(Finished::Agent { result: own, met, report }) => {
                result.interrupted = own.interrupted;
                result.scenarios.push(own);
                agent_verdict = Some((met, report));
            }
        }
        save(&result)?;
    }
    for (i, input) in inputs.iter().enumerate().filter(|_| node.is_none()) {
        if INTERRUPTED.load(Ordering::SeqCst) {
            result.interrupted = true;
            result.not_run = inputs[i..].iter().map(|s| s.scenario.name.clone()).collect();
            save(&result)?;
            break;
        }
        let rel = format!("{:0width$}-{}", i + 1, sanitize(&input.scenario.name));
        let outcome = if input.scenario.launch.nodes > 1 {
            // Every node on this machine: node agents on loopback.
            ups_doctor::nodes::local::run_local(input, &program, &out_dir, &rel, &mut progress, &INTERRUPTED)
                .map_err(|e| e.into_message())
        } else {
            harness::run_scenario(input, &program, &out_dir.join(&rel), &rel, &mut progress, &INTERRUPTED)
                .map_err(|e| e.to_string())
        };
        let scenario_result = match outcome {
            Ok(r) => r,
            Err(e) => {
                // What is on disk must say the run stopped here, and why.
                result.stopped_by = Some(e.clone());
                result.not_run = inputs[i..].iter().map(|s| s.scenario.name.clone()).collect();
                save(&result)?;
                return Err(Error::Internal(e));
            }
        };
        if mode != ProgressMode::Quiet {
            let width = harness::os::sys::terminal_columns().unwrap_or(usize::MAX);
            eprintln!("{}", report::render_verdict_lines(&scenario_result, width));
        }
        let cut_short = scenario_result.interrupted;
        result.scenarios.push(scenario_result);
        if cut_short {
            result.interrupted = true;
            result.not_run = inputs[i + 1..].iter().map(|s| s.scenario.name.clone()).collect();
        }
        save(&result)?;
        if cut_short {
            break;
        }
    }
    let met = result.scenarios.iter().all(|s| s.met_expectation);
    if let Some(done) = node_done {
        done(met, &out_dir.join(report::REPORT_FILE).display().to_string());
    }
    if let Some((met, report)) = agent_verdict {
        // This node's own view is in its --out; the one report of the run is node 0's.
        let report_path = out_dir.join(report::REPORT_FILE);
        return match met {
            Some(met) => {
                println!(
                    "node {}: the run's report is on node 0: {}
this node's own view: {}",
                    node.as_ref().map_or(0, |n| n.node),
                    report.unwrap_or_default(),
                    report_path.display()
                );
                Ok(ExitCode::from(if result.interrupted {
                    exit::INTERRUPTED
                } else if met {
                    exit::MET
                } else {
                    exit::NOT_MET
                }))
            }
            None => Err(Error::Internal(format!(
                "node 0 (the coordinator) went away before it wrote the run's report; this node's own view: {}",
                report_path.display()
            ))),
        };
    }
    let color =
        !json && std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let matrix = match harness::os::sys::terminal_columns() {
        Some(width) => report::render_matrix_fit(&result, color, width),
        None => report::render_matrix(&result, color),
    };
    let report_path = out_dir.join(report::REPORT_FILE);
    if json {
        eprintln!("{matrix}");
        eprintln!("report: {}", report_path.display());
        println!("{}", serde_json::to_string_pretty(&shown(&result)?).expect("results serialise"));
    } else {
        println!("{matrix}");
        println!("report: {}", report_path.display());
    }
    Ok(ExitCode::from(if result.interrupted {
        exit::INTERRUPTED
    } else if result.scenarios.iter().all(|s| s.met_expectation) {
        exit::MET
    } else {
        exit::NOT_MET
    }))
}

/// Writes `result.json` and `report.md` (each to a temporary file, then renamed). When that
/// fails (a full disk), it does not leave an earlier `result.json` claiming the run ended there:
/// it makes room by cutting this run's largest logs (each ends with a note), then by removing the
/// stale `report.md` (rendered again from the result) and the stale `result.json` (the new one
/// holds all it held) before writing. If the result still cannot be written, the earlier one is
/// kept as `result.stale.json`, and the error names the path and the cause.
fn save_honestly(dir: &Path, run: &RunResult) -> Result<(), Error> {
    if report::write_run(dir, run).is_ok() {
        return Ok(());
    }
    let json = serde_json::to_string_pretty(run).expect("results serialise") + "\n";
    let result_path = dir.join(report::RESULT_FILE);
    let report_path = dir.join(report::REPORT_FILE);
    let write_result = || report::write_atomic(&result_path, json.as_bytes());
    let mut cut_logs = false;
    let mut written = with_room(dir, &mut cut_logs, write_result);
    if written.is_err() {
        let _ = std::fs::remove_file(&report_path);
        written = write_result();
    }
    if written.is_err() {
        let old = std::fs::read(&result_path).ok();
        let _ = std::fs::remove_file(&result_path);
        written = write_result();
        if written.is_err()
            && let Some(old) = old
        {
            let _ = std::fs::write(dir.join("result.stale.json"), old);
        }
    }
    if let Err(e) = written {
        let _ = std::fs::remove_file(&report_path);
        let kept = if dir.join("result.stale.json").exists() {
            "; the earlier result, which does not tell the whole run, is kept as `result.stale.json`"
        } else {
            ""
        };
        return Err(Error::Internal(format!("failed to write the result: {e}{kept}")));
    }
    let rendered = with_room(dir, &mut cut_logs, || report::rerender(dir));
    if cut_logs {
        eprintln!(
            "ups-doctor: warning: the disk of `{}` was full: the largest logs were cut (each ends with a note) to make room for the result",
            dir.display()
        );
    }
    rendered.map(|_| ()).map_err(|e| {
        let _ = std::fs::remove_file(&report_path);
        Error::Internal(format!(
            "wrote `{}`, but not the report: {e}; render it later with `ups-doctor report {}`",
            result_path.display(),
            dir.display()
        ))
    })
}

/// `attempt`, again after cutting this run's largest logs each time it fails, while that frees
/// anything (each round halves the largest logs, so a few rounds at most).
fn with_room<T, E>(dir: &Path, cut: &mut bool, mut attempt: impl FnMut() -> Result<T, E>) -> Result<T, E> {
    let mut outcome = attempt();
    // Each pass halves the largest logs; keep cutting while that frees anything (a run of several
    // scenarios writes a report per scenario besides the result), so the loop ends by itself.
    loop {
        if outcome.is_ok() || harness::make_room(dir, 1 << 20) == 0 {
            break;
        }
        *cut = true;
        outcome = attempt();
    }
    outcome
}

/// The running binary, which the harness launches as every rank.
fn current_exe() -> Result<PathBuf, Error> {
    std::env::current_exe()
        .map_err(|e| Error::Internal(format!("failed to locate the ups-doctor binary: {e}")))
}

/// `reports/runs/2026-11-20T23-40-12Z<suffix>`, with `-2`, `-3`, … when that exists already.
fn fresh_run_dir(parent: &Path, suffix: &str) -> Result<PathBuf, Error> {
    let io = |source| Error::Io { what: "create a folder under", path: parent.to_path_buf(), source };
    std::fs::create_dir_all(parent).map_err(io)?;
    let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string().replace(':', "-")
        + suffix;
    for n in 1.. {
        let dir = if n == 1 { parent.join(&stamp) } else { parent.join(format!("{stamp}-{n}")) };
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io(e)),
        }
    }
    unreachable!("the loop returns")
}

/// A scenario name as a folder name.
fn sanitize(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect()
}
