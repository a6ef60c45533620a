//! The command line: clap's types, and their conversion into the plain requests of
//! [`ups_doctor::session`]. Nothing here runs anything.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use ups_doctor::exit;
use ups_doctor::nodes::config::NodeFlags;
use ups_doctor::scenario::Override;
use ups_doctor::session::{BisectRequest, RunRequest, SweepRequest};

/// Finds out why distributed deep-learning training crashes, hangs or crawls.
#[derive(Parser)]
#[command(name = "ups-doctor", version, about, long_about = None, after_help = exit::HELP)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run scenario files (or every *.json in a folder), or your own command after `--`, and
    /// write a report.
    #[command(after_help = exit::HELP, long_about = RUN_ABOUT)]
    Run(RunArgs),
    /// Cut a failing scenario down to a 1-minimal configuration that still fails the same way.
    #[command(after_help = exit::HELP, long_about = BISECT_ABOUT)]
    Bisect(BisectArgs),
    /// Run a grid of configurations of one scenario: speed, memory, data waits and failures per
    /// point, a verdict first.
    #[command(after_help = exit::HELP, long_about = SWEEP_ABOUT)]
    Sweep(SweepArgs),
    /// Diagnose a PyTorch job that is already running (never started under ups-doctor), read-only.
    #[command(after_help = exit::HELP)]
    Attach(ups_doctor::attach::AttachArgs),
    /// Re-render report.md (and each scenario's full report) from a run folder's result.json.
    ///
    /// trace.json (the run's timeline for Perfetto) is written again beside it. Given a folder of
    /// PyTorch Flight Recorder dumps (one file per rank, as TORCH_NCCL_DUMP_ON_TIMEOUT writes them),
    /// it writes where the ranks' collectives part ways in DIR/ups-doctor-flight.md.
    #[command(after_help = exit::HELP)]
    Report {
        /// A run folder (it holds result.json), a bisect's folder (it holds bisect.json), or a
        /// folder of Flight Recorder dumps.
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
}

/// `ups-doctor run`'s flags.
#[derive(clap::Args)]
pub struct RunArgs {
    /// Scenario files or folders [default: scenarios/].
    pub paths: Vec<PathBuf>,
    /// Override a scenario field for every scenario, e.g. `--set train.steps=20`.
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub set: Vec<Override>,
    /// Folder for the report [default: reports/runs/<time>].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Print the result as JSON on stdout (the matrix goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// No live progress.
    #[arg(long)]
    pub quiet: bool,
    /// Mask GPU UUIDs and your home folder in the report and result.json, for a public issue.
    #[arg(long)]
    pub public: bool,
    /// Do not observe a command's Python processes (same as `--set launch.observe=false`).
    #[arg(long)]
    pub no_observe: bool,
    #[command(flatten)]
    pub nodes: NodeArgs,
    #[command(flatten)]
    pub command_options: CommandArgs,
    /// Your training command, after `--`, exactly as you would run it: it is the scenario.
    #[arg(last = true, value_name = "PROGRAM [ARGS]")]
    pub command: Vec<String>,
}

/// `run --help`'s description, with an example of each form.
const RUN_ABOUT: &str =
    "Run scenario files (or every *.json in a folder), or your own command after `--`, and \
write a report.

Examples:
  ups-doctor run -- torchrun --nproc_per_node 2 train.py --epochs 3
  ups-doctor run --ranks 2 --env OMP_NUM_THREADS=1 --cwd runs/ -- python train.py
  ups-doctor run --expect-output 'Trainer.fit. stopped' -- python lightning_train.py
  ups-doctor run scenarios/ddp-rank1-segv.json
  ups-doctor run scenarios/ --set train.steps=20";

/// `bisect --help`'s description, with an example of each form.
const BISECT_ABOUT: &str = "Cut a failing scenario, or your own failing command line, down to a 1-minimal \
configuration that still fails the same way, and say where the failure starts.

Examples:
  ups-doctor bisect -- python train.py --num-workers 8 --batch-size 32 --pin-memory
  ups-doctor bisect --keep --data --cut=--batch-size=64,8 -- torchrun --nproc_per_node 4 train.py --batch-size 256
  ups-doctor bisect --env NCCL_P2P_DISABLE=1 --env OMP_NUM_THREADS=4 -- python train.py --depths 2,2,2
  ups-doctor bisect scenarios/segv-needs-conditioning.json";

/// `sweep --help`'s description, with an example of each form.
const SWEEP_ABOUT: &str = "Run a grid of configurations (of a scenario, or of your own command's \
placeholders): speed, memory, data waits and failures per point, a verdict first.

Examples:
  ups-doctor sweep -L workers 0,2,4 -- python train.py --num-workers {workers}
  ups-doctor sweep -L ranks 1,2 -- torchrun --nproc_per_node {ranks} train.py
  ups-doctor sweep scenarios/train-cpu.json --vary data.workers=0,2 --vary data.start_method=fork,spawn";

/// What a scenario file says about a command, as options of `run -- CMD`.
#[derive(clap::Args, Default)]
pub struct CommandArgs {
    /// Ranks to start: copies of the command with torchrun's environment (a plain script), or the
    /// ranks a launcher starts [default: the launcher's own flag, e.g. `--nproc_per_node`, else 1].
    #[arg(long, value_name = "N", help_heading = "Your command")]
    pub ranks: Option<u32>,
    /// `auto` (a known launcher starts its own ranks), `per_rank` or `launcher`.
    #[arg(long, value_name = "STYLE", help_heading = "Your command")]
    pub style: Option<String>,
    /// A rank silent this long (no marker, no output) is hung.
    #[arg(long, value_name = "SECS", help_heading = "Your command")]
    pub hang_after: Option<f64>,
    /// The whole run's time limit.
    #[arg(long, value_name = "SECS", help_heading = "Your command")]
    pub timeout: Option<f64>,
    /// A memory limit for all the command's processes together, like `docker run --memory` (`8g`).
    #[arg(long, value_name = "SIZE", help_heading = "Your command")]
    pub memory_limit: Option<String>,
    /// A private `/dev/shm` of this size, like Docker's (`64m`).
    #[arg(long, value_name = "SIZE", help_heading = "Your command")]
    pub shm_size: Option<String>,
    /// A variable for every process of the command (repeatable).
    #[arg(long = "env", value_name = "NAME=VALUE", help_heading = "Your command")]
    pub env: Vec<String>,
    /// The folder the command runs in [default: this folder].
    #[arg(long, value_name = "DIR", help_heading = "Your command")]
    pub cwd: Option<PathBuf>,
    /// A line the program prints (stdout or stderr) only when it finished: exit 0 without it is a
    /// false success.
    #[arg(long, value_name = "REGEX", help_heading = "Your command")]
    pub expect_output: Option<String>,
    /// The scenario's name in the report [default: the script's name].
    #[arg(long, value_name = "NAME", help_heading = "Your command")]
    pub name: Option<String>,
}

/// One node of a multi-node run (see docs/slurm-and-nodes.md, "Across nodes"). Without these flags, Slurm's
/// `SLURM_NNODES`/`SLURM_NODEID`/`SLURM_JOB_NODELIST` or torchrun-style `NNODES`/`NODE_RANK`/
/// `MASTER_ADDR` place the node; with none of them the run is on this machine only.
#[derive(clap::Args, Default)]
pub struct NodeArgs {
    /// Nodes in the run: start the same command once per node; `launch.world_size` is the ranks
    /// of all nodes together.
    #[arg(long, value_name = "N", help_heading = "Across nodes")]
    pub nodes: Option<u32>,
    /// This node's rank: 0 runs the coordinator, which writes the one report.
    #[arg(long, value_name = "R", help_heading = "Across nodes")]
    pub node_rank: Option<u32>,
    /// Node 0's address, which every agent connects to [default: 127.0.0.1:29411].
    #[arg(long, value_name = "HOST:PORT", help_heading = "Across nodes")]
    pub coordinator: Option<String>,
    /// What node 0 listens on, when not the coordinator's address (`0.0.0.0:PORT`: every interface).
    #[arg(long, value_name = "ADDR:PORT", help_heading = "Across nodes")]
    pub listen: Option<String>,
    /// How long node 0 waits for the others to join, and they for it.
    #[arg(long, value_name = "SECS", default_value_t = 120.0, help_heading = "Across nodes")]
    pub join_timeout: f64,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum StrategyArg {
    Ladder,
    Ddmin,
}

#[derive(clap::Args)]
pub struct BisectArgs {
    /// The failing scenario file (or a command after `--`).
    pub scenario: Option<PathBuf>,
    /// With a command: a flag (or an `--env` variable) bisect leaves as it is (repeatable), e.g.
    /// `--keep --data`, `--keep PYTHONPATH`.
    #[arg(long, value_name = "FLAG", allow_hyphen_values = true)]
    pub keep: Vec<String>,
    /// With a command: the values to try for a flag, in order, e.g. `--cut=--batch-size=64,8`.
    #[arg(long, value_name = "FLAG=V1,V2,…", allow_hyphen_values = true)]
    pub cut: Vec<String>,
    /// Your own failing command: its flags are what bisect cuts
    /// (`ups-doctor bisect -- torchrun --nproc_per_node 2 train.py --num-workers 8 --pin-memory`).
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
    /// What a scenario file would say about the command; each `--env` variable is also cut
    /// (unset) unless kept.
    #[command(flatten)]
    pub command_options: CommandArgs,
    /// Override a field of the scenario (or of a command's), e.g. `--set limits.timeout_s=60`.
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub set: Vec<Override>,
    /// Most real runs to spend (cached results are free).
    #[arg(long, default_value_t = 60)]
    pub budget: usize,
    /// Confidence required before a cut is believed to make a flaky failure pass.
    #[arg(long, default_value_t = 0.95)]
    pub confidence: f64,
    /// Runs of the original scenario that confirm the failure and estimate its rate.
    #[arg(long, default_value_t = 2)]
    pub confirm: usize,
    /// Independent probes run in parallel.
    #[arg(long, default_value_t = 1)]
    pub jobs: usize,
    /// Folder for the report [default: reports/runs/<time>-bisect].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Folder of cached probe results, shared by bisects of the same scenario.
    #[arg(long, value_name = "DIR", default_value = "reports/runs/.bisect-cache")]
    pub cache: PathBuf,
    /// Print bisect.json on stdout.
    #[arg(long)]
    pub json: bool,
    /// No progress lines.
    #[arg(long)]
    pub quiet: bool,
    /// `ladder` (big cuts first) or `ddmin` (no ladder): for bench/, which measures the
    /// runs the ladder saves.
    #[arg(long, hide = true, value_enum, default_value_t = StrategyArg::Ladder)]
    pub strategy: StrategyArg,
}

/// `ups-doctor sweep`'s flags.
#[derive(clap::Args)]
pub struct SweepArgs {
    /// The scenario file every point starts from (or a command after `--`).
    pub scenario: Option<PathBuf>,
    /// A field and the values it takes, e.g. `--vary data.workers=0,2,4`; several `--vary` span
    /// a grid (the first varies slowest).
    #[arg(long = "vary", value_name = "PATH=V1,V2,…")]
    pub vary: Vec<String>,
    /// A placeholder of the command after `--` and its values, hyperfine's way:
    /// `-L workers 0,2,4 -- python train.py --workers {workers}`. `-L ranks 1,2` with
    /// `--nproc_per_node {ranks}` also sets the rank count.
    #[arg(short = 'L', long = "parameter-list", num_args = 2, value_names = ["NAME", "V1,V2,…"])]
    pub list: Vec<String>,
    /// Your own command, its `{NAME}` placeholders filled in per point from `-L`.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
    /// What a scenario file would say about the command, for every point.
    #[command(flatten)]
    pub command_options: CommandArgs,
    /// Override a scenario field for every point, e.g. `--set train.steps=20`.
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub set: Vec<Override>,
    /// Runs of each point, interleaved (round after round over every point).
    #[arg(long, default_value_t = 1)]
    pub runs: usize,
    /// Runs thrown away before the first measured one (they count against --budget).
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Most real runs to spend (cached runs are free); the same command resumes the rest.
    #[arg(long, default_value_t = 100)]
    pub budget: usize,
    /// Folder for the sweep [default: reports/runs/<time>-sweep-<name>]; finished runs are
    /// cached there, so the same --out resumes an interrupted sweep.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Print sweep.json on stdout (the table goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// No progress lines.
    #[arg(long)]
    pub quiet: bool,
}

impl From<SweepArgs> for SweepRequest {
    fn from(a: SweepArgs) -> SweepRequest {
        SweepRequest {
            scenario: a.scenario,
            set: a.set,
            vary: a.vary,
            lists: a.list.chunks(2).map(|p| (p[0].clone(), p.get(1).cloned().unwrap_or_default())).collect(),
            command: a.command,
            options: a.command_options.into(),
            runs: a.runs,
            warmup: a.warmup,
            budget: a.budget,
            out: a.out,
            json: a.json,
            quiet: a.quiet,
        }
    }
}

impl From<NodeArgs> for NodeFlags {
    fn from(a: NodeArgs) -> NodeFlags {
        NodeFlags {
            nodes: a.nodes,
            node_rank: a.node_rank,
            coordinator: a.coordinator,
            listen: a.listen,
            join_timeout_s: Some(a.join_timeout),
        }
    }
}

impl RunArgs {
    /// The request; `dashdash` says whether the command line had a `--` (clap drops it).
    pub fn into_request(self, dashdash: bool) -> RunRequest {
        let RunArgs {
            paths,
            mut set,
            out,
            json,
            quiet,
            public,
            no_observe,
            nodes,
            command_options: c,
            command,
        } = self;
        if no_observe {
            set.push("launch.observe=false".parse().expect("a valid override"));
        }
        let options = c.into();
        RunRequest {
            paths,
            set,
            out,
            json,
            quiet,
            public,
            node: nodes.into(),
            dashdash: dashdash || !command.is_empty(),
            command,
            options,
        }
    }
}

impl From<CommandArgs> for ups_doctor::session::CommandOptions {
    fn from(c: CommandArgs) -> ups_doctor::session::CommandOptions {
        ups_doctor::session::CommandOptions {
            ranks: c.ranks,
            style: c.style,
            hang_after_s: c.hang_after,
            timeout_s: c.timeout,
            memory_limit: c.memory_limit,
            shm_size: c.shm_size,
            env: c.env,
            cwd: c.cwd,
            expect_output: c.expect_output,
            name: c.name,
        }
    }
}

impl From<BisectArgs> for BisectRequest {
    fn from(a: BisectArgs) -> BisectRequest {
        BisectRequest {
            scenario: a.scenario,
            command: a.command,
            keep: a.keep,
            cut: a.cut,
            options: a.command_options.into(),
            set: a.set,
            budget: a.budget,
            confidence: a.confidence,
            confirm: a.confirm,
            jobs: a.jobs,
            out: a.out,
            cache: a.cache,
            json: a.json,
            quiet: a.quiet,
            strategy: match a.strategy {
                StrategyArg::Ladder => ups_doctor::bisect::Strategy::Ladder,
                StrategyArg::Ddmin => ups_doctor::bisect::Strategy::Ddmin,
            },
        }
    }
}
