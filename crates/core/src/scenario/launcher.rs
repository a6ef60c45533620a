//! Every launcher ups-doctor knows, in one table ([`LAUNCHERS`]): how it is recognised (its
//! program, its `python -m` module, the words a shell script runs it by, what in a Python program
//! says the program starts its ranks this way), its flags for ranks and nodes, and where its own
//! flags end and its program begins. Everything else asks the table: adding a launcher is one
//! entry here and its tests. Pure.

use std::path::Path;

/// One way users start the ranks of a job.
#[derive(Debug, PartialEq, Eq)]
pub struct Launcher {
    /// Its name, as users say it.
    pub name: &'static str,
    /// Program names (the file name of `argv[0]`) that are this launcher.
    pub programs: &'static [&'static str],
    /// Its subcommand, when it has one (`accelerate launch`).
    pub subcommand: Option<&'static str>,
    /// `python -m` modules that are this launcher.
    pub modules: &'static [&'static str],
    /// The words a shell script runs it by, each found as a whole word.
    pub in_shell: &'static [&'static str],
    /// What in a Python program's source says that the program starts its ranks this way, with
    /// the words for why.
    pub in_source: &'static [(&'static str, &'static str)],
    /// Its flags for ranks per node and for nodes.
    pub rank_flags: &'static [&'static str],
    pub node_flags: &'static [&'static str],
    /// Whether its ranks are its children that read their rank from the environment torchrun's
    /// way (`RANK`, `LOCAL_RANK`): then ups-doctor can give each node torchrun's per-node form.
    pub torchrun_form: bool,
    /// Whether the launcher is itself a Python program (`torchrun`, `accelerate`): its command
    /// runs Python whatever it starts.
    pub is_python: bool,
    /// Whose processes its ranks are: started for the job below the launcher, or a cluster's.
    pub ranks: RankProcesses,
    /// What it waits for before it starts any rank (said where it never did: "… waits before it
    /// starts its ranks: {0}."), and what to check.
    pub waits_for: (&'static str, &'static str),
}

/// What a launcher that runs the program's own code before its ranks start waits on.
const OWN_CODE_CHECK: &str =
    "Read its output above; a stack of the program (`py-spy dump --pid PID`) shows where it waits.";

/// Whose processes a launcher's ranks are.
#[derive(Debug, PartialEq, Eq)]
pub enum RankProcesses {
    /// Processes started for the job (by the launcher, or by the program itself): each ends when
    /// its rank does, and how it ended is the rank's end.
    Started,
    /// A cluster's pooled worker processes, started by its daemon and handed the job's training
    /// function: the cluster ends them as the job ends, so a worker's exit status is the
    /// cluster's, not the rank's (Ray Train's `RayTrainWorker`s).
    ClusterWorkers(&'static ClusterWorkers),
}

/// What a cluster's launcher says of its workers, in its own output.
#[derive(Debug, PartialEq, Eq)]
pub struct ClusterWorkers {
    /// The word before a worker's pid in the prefix the launcher gives each line a worker
    /// printed: Ray's `(RayTrainWorker pid=4242)`, `(RayTrainWorker pid=4242, ip=10.0.0.2)`.
    pub pid_word: &'static str,
    /// The word before the host's address in that prefix, for a worker on another host than the
    /// launcher's: Ray's `ip=` (its own host's workers have none).
    pub host_word: &'static str,
    /// How the launcher heads the error it relays for one rank, around the rank's number: Ray
    /// Train's `[Rank 1 Error Snippet]:`.
    pub relay: (&'static str, &'static str),
    /// Variables the launcher gets unless the user set them: those that keep each worker's lines
    /// whole, in order and its own (Ray prints a line that several workers printed alike once,
    /// later, marked `[repeated 2x across cluster]`, and so moved one rank's traceback after
    /// another's and cut its error off the block).
    pub env: &'static [(&'static str, &'static str)],
}

impl Launcher {
    /// The variables it runs under unless the user set them (see [`ClusterWorkers::env`]).
    pub fn env(&self) -> &'static [(&'static str, &'static str)] {
        match self.ranks {
            RankProcesses::ClusterWorkers(w) => w.env,
            RankProcesses::Started => &[],
        }
    }
}

const STARTED: RankProcesses = RankProcesses::Started;

impl ClusterWorkers {
    /// The worker a line of the launcher's output came from, by the pid its prefix names, and
    /// the line as the worker printed it (`\x1b[36m(RayTrainWorker pid=4242)\x1b[0m Error in
    /// training function:` is worker 4242's `Error in training function:`). `None` for a line
    /// without such a prefix: the launcher's own.
    pub fn worker_line<'a>(&self, line: &'a str) -> Option<(u32, &'a str)> {
        let line = skip_colours(line);
        let close = line.strip_prefix('(')?.find(')')? + 1;
        let head = &line[1..close];
        let word = head.find(self.pid_word)?;
        // One name, then the pid: `RayTrainWorker pid=4242` (an `, ip=…` may follow).
        if word == 0 || head[..word].trim_end().contains([' ', '(']) || !head[..word].ends_with(' ') {
            return None;
        }
        let digits = head[word + self.pid_word.len()..].split(|c: char| !c.is_ascii_digit()).next()?;
        let pid = digits.parse().ok()?;
        let rest = skip_colours(&line[close + 1..]);
        Some((pid, rest.strip_prefix(' ').unwrap_or(rest)))
    }

    /// The host a worker's line names in its prefix (`10.0.0.2` of `(RayTrainWorker pid=4242,
    /// ip=10.0.0.2)`): a worker on another host than the launcher's. `None` for the launcher's own
    /// lines and its own host's workers'.
    pub fn host_of_line<'a>(&self, line: &'a str) -> Option<&'a str> {
        self.worker_line(line)?;
        let line = skip_colours(line);
        let head = &line[1..line.find(')')?];
        let at = head.find(&format!(" {}", self.host_word))? + 1 + self.host_word.len();
        let host = head[at..].split([',', ' ']).next()?;
        (!host.is_empty()).then_some(host)
    }

    /// The errors the launcher relays for ranks, by rank: each header (`[Rank 1 Error Snippet]:`)
    /// and the lines after it from the same origin (the launcher's own lines, or one process's),
    /// up to the next header; the longest block where one rank's is relayed more than once (Ray
    /// prints it from its controller and again in the driver's traceback).
    pub fn relayed(&self, lines: &[String]) -> Vec<(u32, Vec<String>)> {
        let (open, close) = self.relay;
        let mut blocks: Vec<(u32, Vec<String>)> = Vec::new();
        let mut current: Option<(u32, Option<u32>, Vec<String>)> = None;
        let mut finish = |block: Option<(u32, Option<u32>, Vec<String>)>| {
            let Some((rank, _, lines)) = block else { return };
            match blocks.iter_mut().find(|(r, _)| *r == rank) {
                Some((_, kept)) if kept.len() >= lines.len() => {}
                Some((_, kept)) => *kept = lines,
                None => blocks.push((rank, lines)),
            }
        };
        for line in lines {
            let (origin, text) = match self.worker_line(line) {
                Some((pid, text)) => (Some(pid), text),
                None => (None, skip_colours(line)),
            };
            let header = text.trim().strip_prefix(open).and_then(|t| t.strip_suffix(close));
            if let Some(rank) = header.and_then(|n| n.trim().parse::<u32>().ok()) {
                finish(current.take());
                current = Some((rank, origin, Vec::new()));
                continue;
            }
            match &mut current {
                Some((_, from, block)) if *from == origin && block.len() < RELAY_LINES => {
                    block.push(text.trim_end().to_string())
                }
                Some((_, from, _)) if *from != origin => finish(current.take()),
                _ => {}
            }
        }
        finish(current);
        blocks.sort_by_key(|(rank, _)| *rank);
        blocks
    }
}

/// The most lines of one relayed error kept.
const RELAY_LINES: usize = 80;

/// `line` without the terminal colour codes at its start (`\x1b[36m`).
fn skip_colours(mut line: &str) -> &str {
    while let Some(rest) = line.strip_prefix("\x1b[") {
        match rest.find(|c: char| !(c.is_ascii_digit() || c == ';')) {
            Some(end) if rest[end..].starts_with('m') => line = &rest[end + 1..],
            _ => break,
        }
    }
    line
}

pub const TORCHRUN: Launcher = Launcher {
    name: "torchrun",
    programs: &["torchrun"],
    subcommand: None,
    modules: &["torch.distributed.run", "torch.distributed.launch"],
    in_shell: &["torchrun", "torch.distributed.run", "torch.distributed.launch"],
    in_source: &[
        (
            "elastic_launch(",
            "it runs torchrun's agent in its own process (`elastic_launch`), which starts the ranks",
        ),
        (
            "from torch.distributed.run import",
            "it runs torchrun in its own process (`torch.distributed.run`)",
        ),
        ("import torch.distributed.run", "it runs torchrun in its own process (`torch.distributed.run`)"),
        (
            "from torch.distributed import run",
            "it runs torchrun in its own process (`torch.distributed.run`)",
        ),
    ],
    rank_flags: &["--nproc_per_node", "--nproc-per-node"],
    node_flags: &["--nnodes"],
    is_python: true,
    torchrun_form: true,
    ranks: STARTED,
    waits_for: (
        "for its rendezvous store (`--rdzv-endpoint`, `--master_addr`, `--master_port`) or for the other nodes of its rendezvous (`--nnodes`)",
        "Check that its rendezvous endpoint is reachable from this machine and that every node it waits for was started.",
    ),
};

pub const ACCELERATE: Launcher = Launcher {
    name: "accelerate",
    programs: &["accelerate"],
    subcommand: Some("launch"),
    modules: &[],
    in_shell: &["accelerate launch"],
    in_source: &[(
        "launch_command(",
        "it runs `accelerate launch` in its own process (`launch_command`), which starts the ranks",
    )],
    rank_flags: &["--num_processes", "--num-processes"],
    node_flags: &[],
    is_python: true,
    torchrun_form: false,
    ranks: STARTED,
    waits_for: (
        "for its rendezvous store (`--main_process_ip`, `--main_process_port`) or for the other machines of its rendezvous (`--num_machines`)",
        "Check that the main process's address and port are reachable from this machine and that every machine it waits for was started.",
    ),
};

pub const DEEPSPEED: Launcher = Launcher {
    name: "deepspeed",
    programs: &["deepspeed"],
    subcommand: None,
    modules: &[],
    in_shell: &["deepspeed"],
    in_source: &[],
    rank_flags: &["--num_gpus", "--num-gpus"],
    node_flags: &["--num_nodes", "--num-nodes"],
    is_python: true,
    torchrun_form: false,
    ranks: STARTED,
    waits_for: (
        "for its rendezvous store (`--master_addr`, `--master_port`), or, with a hostfile, for the hosts it starts through ssh or pdsh",
        "Check that the master address is reachable from this machine and, with a hostfile, that each host answers ssh without a prompt (`ssh HOST true`).",
    ),
};

pub const SRUN: Launcher = Launcher {
    name: "srun",
    programs: &["srun"],
    subcommand: None,
    modules: &[],
    in_shell: &["srun"],
    in_source: &[],
    rank_flags: &["-n", "--ntasks"],
    node_flags: &[],
    is_python: false,
    torchrun_form: false,
    ranks: STARTED,
    waits_for: (
        "for its allocation: a step starts once Slurm gives it the nodes and CPUs it asks for (`srun: job N queued and waiting for resources`)",
        "Look at the job with `squeue -j JOBID` (its reason: Resources, Priority, a node down) and compare what the step asks for (`-N`, `-n`, `--gres`) with the partition (`sinfo`).",
    ),
};

pub const MPIRUN: Launcher = Launcher {
    name: "mpirun",
    programs: &["mpirun", "mpiexec"],
    subcommand: None,
    modules: &[],
    in_shell: &["mpirun", "mpiexec"],
    in_source: &[],
    rank_flags: &["-np", "-n"],
    node_flags: &[],
    is_python: false,
    torchrun_form: false,
    ranks: STARTED,
    waits_for: (
        "for its daemons on the other hosts (`--host`, a hostfile), which it starts through ssh",
        "Check that each host answers ssh without a prompt (`ssh HOST true`) and runs the same MPI.",
    ),
};

pub const LIGHTNING: Launcher = Launcher {
    name: "lightning",
    programs: &["lightning"],
    subcommand: None,
    modules: &[],
    in_shell: &[],
    in_source: &[
        ("import lightning", "it uses Lightning, whose `Trainer` starts the ranks"),
        ("from lightning", "it uses Lightning, whose `Trainer` starts the ranks"),
        ("pytorch_lightning", "it uses Lightning, whose `Trainer` starts the ranks"),
    ],
    rank_flags: &[],
    node_flags: &[],
    is_python: true,
    torchrun_form: false,
    ranks: STARTED,
    waits_for: (
        "in the program's own code, before the `Trainer` starts the other ranks (imports, data preparation, `prepare_data`)",
        OWN_CODE_CHECK,
    ),
};

/// Ray Train: the program (Ray's "driver") starts or joins a Ray cluster and hands a training
/// function to `TorchTrainer`, which runs it in pooled worker processes (`ray::RayTrainWorker`)
/// that the cluster's daemon (the raylet) starts, not the program: they are found by the process
/// group each forms, and the cluster's daemons and idle workers are never ranks. A node of a
/// cluster of several (`ray start`, alone or in the job script that also runs the driver on the
/// head) is the same launcher: its raylet's workers are that node's ranks.
pub const RAY_TRAIN: Launcher = Launcher {
    name: "Ray Train",
    programs: &["ray"],
    subcommand: Some("start"),
    modules: &[],
    in_shell: &["ray start"],
    in_source: &[("TorchTrainer(", "it starts Ray Train's `TorchTrainer`, whose workers are the ranks")],
    rank_flags: &[],
    node_flags: &[],
    is_python: true,
    torchrun_form: false,
    ranks: RankProcesses::ClusterWorkers(&ClusterWorkers {
        pid_word: "pid=",
        host_word: "ip=",
        relay: ("[Rank ", " Error Snippet]:"),
        env: &[("RAY_DEDUP_LOGS", "0")],
    }),
    waits_for: (
        "for its Ray cluster: the head's GCS server (`ray start --address`, `ray.init(address=…)`), or free CPUs and GPUs for the workers its `ScalingConfig` asks for",
        "Check that the head at that address is up and reachable from this host (`ray status --address HOST:6379`) and that the cluster has the CPUs and GPUs the `ScalingConfig` asks for.",
    ),
};

/// `torch.multiprocessing`'s `spawn` and `start_processes`, called by the program itself.
pub const MP_SPAWN: Launcher = Launcher {
    name: "torch.multiprocessing",
    programs: &[],
    subcommand: None,
    modules: &[],
    in_shell: &[],
    in_source: &[
        ("multiprocessing.spawn(", "it calls `torch.multiprocessing.spawn`"),
        ("mp.spawn(", "it calls `torch.multiprocessing.spawn`"),
        // `start_method="fork"` too (Lightning's `ddp_fork` and notebooks): forked ranks are
        // found by the process group each forms, seen by the observer.
        ("start_processes(", "it calls `torch.multiprocessing.start_processes`"),
    ],
    rank_flags: &[],
    node_flags: &[],
    is_python: true,
    torchrun_form: false,
    ranks: STARTED,
    waits_for: (
        "in the program's own code, before it calls `torch.multiprocessing`'s `spawn`",
        OWN_CODE_CHECK,
    ),
};

/// A library's launcher called by the program, known by the word every such launcher takes for
/// how many processes to start: PyTorch-Ignite's `idist.Parallel(nproc_per_node=2)`,
/// Accelerate's `notebook_launcher(f, num_processes=2)`, torch_xla's `xmp.spawn(f, nprocs=8)`,
/// and the next library's, whose name no table can list in advance. Each is found as a keyword
/// argument (`nprocs =`, not `nprocs ==` nor `my_nprocs=`). Taken for a launcher where it is not
/// one (an f-string that prints it), the one process is still watched as the one rank; missed,
/// every rank the program starts is run once per rank and cannot be watched.
pub const PROCESS_COUNT: Launcher = Launcher {
    name: "a library's launcher",
    programs: &[],
    subcommand: None,
    modules: &[],
    in_shell: &[],
    in_source: &[
        ("nproc_per_node=", "a call in it says how many processes to start: `nproc_per_node=`"),
        ("num_processes=", "a call in it says how many processes to start: `num_processes=`"),
        ("nprocs=", "a call in it says how many processes to start: `nprocs=`"),
    ],
    rank_flags: &[],
    node_flags: &[],
    is_python: true,
    torchrun_form: false,
    ranks: STARTED,
    waits_for: ("in the program's own code, before its library's launcher starts the ranks", OWN_CODE_CHECK),
};

/// Every launcher, in the order a command is matched against them (Ray Train first of the
/// programs that start their own ranks: Ray runs Lightning or Accelerate inside its workers, where
/// they start none; `torch.multiprocessing`
/// before Lightning: a program that calls `mp.spawn` itself says so even where it also imports
/// Lightning; a process count last, as the least specific).
pub const LAUNCHERS: &[&Launcher] =
    &[&TORCHRUN, &ACCELERATE, &DEEPSPEED, &SRUN, &MPIRUN, &RAY_TRAIN, &MP_SPAWN, &LIGHTNING, &PROCESS_COUNT];

fn file_name(a: &str) -> String {
    Path::new(a).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// The `python -m` module `argv` runs, if it runs one (`python -u -m torch.distributed.run …`).
fn python_module(argv: &[String]) -> Option<&str> {
    if !file_name(argv.first()?).starts_with("python") {
        return None;
    }
    let mut args = argv.iter().skip(1).skip_while(|a| a.starts_with('-') && a.as_str() != "-m");
    (args.next()?.as_str() == "-m").then(|| args.next().map(String::as_str)).flatten()
}

/// The launcher `argv` starts with: its program (`torchrun`, `/venv/bin/accelerate`) followed
/// by its subcommand where it has one (`ray start`, not `ray status`), or `python -m` one of its
/// modules.
pub fn of_command(argv: &[String]) -> Option<&'static Launcher> {
    let program = file_name(argv.first()?);
    let module = python_module(argv);
    let runs = |l: &Launcher| {
        l.programs.contains(&program.as_str())
            && l.subcommand.is_none_or(|sub| argv.get(1).is_some_and(|a| a == sub))
    };
    LAUNCHERS.iter().copied().find(|l| runs(l) || module.is_some_and(|m| l.modules.contains(&m)))
}

/// The launcher a shell script runs by `word` (one of [`shell_words`]).
/// The launcher of the table named `name` ([`Launcher::name`]), as a result records it.
pub fn named(name: &str) -> Option<&'static Launcher> {
    LAUNCHERS.iter().copied().find(|l| l.name == name)
}

pub fn of_shell_word(word: &str) -> Option<&'static Launcher> {
    LAUNCHERS.iter().copied().find(|l| l.in_shell.contains(&word))
}

/// The launcher whose program is `name` (a process's command name), if any.
pub fn of_program(name: &str) -> Option<&'static Launcher> {
    LAUNCHERS.iter().copied().find(|l| l.programs.contains(&name))
}

/// The launcher a Python program's source says it starts its ranks with, and why.
/// A needle that ends in `=` is a keyword argument: a whole word, spaces allowed before the `=`,
/// and no second `=` after it.
pub fn in_program_source(source: &str) -> Option<(&'static Launcher, &'static str)> {
    LAUNCHERS.iter().copied().find_map(|l| {
        l.in_source.iter().find(|(needle, _)| found_in(source, needle)).map(|(_, why)| (l, *why))
    })
}

fn found_in(source: &str, needle: &str) -> bool {
    let Some(word) = needle.strip_suffix('=') else { return source.contains(needle) };
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    source.match_indices(word).any(|(at, _)| {
        let after = source[at + word.len()..].trim_start_matches([' ', '\t']);
        !source[..at].chars().next_back().is_some_and(ident)
            && after.starts_with('=')
            && !after.starts_with("==")
    })
}

/// Every word a shell script may run a launcher by.
pub fn shell_words() -> impl Iterator<Item = &'static str> {
    LAUNCHERS.iter().flat_map(|l| l.in_shell.iter().copied())
}

/// Where the launcher's own flags end and its program begins: the first argument after them that
/// is a Python program (`train.py`, `python`, the module after `-m`), so that a flag of the
/// program's own (`gnn.py --nnodes 3`) is never read as the launcher's. The whole argv where it
/// names none.
pub fn options_end(argv: &[String]) -> usize {
    let start = python_module(argv).map_or(1, |_| argv.iter().position(|a| a == "-m").map_or(1, |m| m + 2));
    argv.iter()
        .enumerate()
        .skip(start)
        .find(|(i, a)| {
            a.ends_with(".py")
                || file_name(a).starts_with("python")
                || argv.get(i.wrapping_sub(1)).is_some_and(|prev| prev == "-m" || prev == "--module")
        })
        .map_or(argv.len(), |(i, _)| i)
}

/// The ranks a launcher's own flags declare, with the flag that says so: torchrun's (and
/// `python -m torch.distributed.run`'s) `--nproc_per_node` × `--nnodes`, `accelerate launch
/// --num_processes`, `deepspeed --num_gpus` × `--num_nodes`, `srun -n`/`--ntasks`, `mpirun
/// -np`/`-n`. `None` where the command names none (a plain script, Lightning, `mp.spawn`).
pub fn declared_ranks(argv: &[String]) -> Option<(u32, String)> {
    let (per, nodes) = rank_flags(argv)?;
    let own = &argv[..options_end(argv)];
    let (count, flag) = flag_value(own, per)?;
    let count: u32 = count.parse().ok()?;
    let nodes = flag_value(own, nodes).and_then(|(v, _)| v.parse::<u32>().ok()).unwrap_or(1);
    Some((count * nodes, flag))
}

/// The value of the launcher's per-node rank flag as written (`{ranks}` in `--nproc_per_node
/// {ranks}`), where the command has one.
pub fn rank_flag_value(argv: &[String]) -> Option<String> {
    let (per, _) = rank_flags(argv)?;
    flag_value(&argv[..options_end(argv)], per).map(|(value, _)| value)
}

/// The launcher's flags for ranks per node and for nodes.
pub fn rank_flags(argv: &[String]) -> Option<(&'static [&'static str], &'static [&'static str])> {
    let l = of_command(argv).filter(|l| !l.rank_flags.is_empty())?;
    Some((l.rank_flags, l.node_flags))
}

/// The value of the first of `flags` in `argv` (`--flag V` or `--flag=V`), and how it was written.
pub fn flag_value(argv: &[String], flags: &[&str]) -> Option<(String, String)> {
    for (i, arg) in argv.iter().enumerate() {
        for flag in flags {
            if arg == flag {
                let value = argv.get(i + 1)?.clone();
                return Some((value.clone(), format!("{flag} {value}")));
            }
            if let Some(value) = arg.strip_prefix(&format!("{flag}=")) {
                return Some((value.to_string(), arg.clone()));
            }
        }
    }
    None
}

/// The nodes a launcher's own flags say it waits for, when more than one, with the flag as
/// written: torchrun's `--nnodes N` (an elastic `MIN:MAX`, its minimum), `deepspeed --num_nodes N`.
pub fn declared_nodes(argv: &[String]) -> Option<(u32, String)> {
    let (_, nodes) = rank_flags(argv)?;
    let (value, flag) = flag_value(&argv[..options_end(argv)], nodes)?;
    let min: u32 = value.split(':').next()?.parse().ok()?;
    (min > 1).then_some((min, flag))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        line.split(' ').map(String::from).collect()
    }

    /// Lines as Ray 2.60 prints them (a local cluster, `TorchTrainer` with two workers, rank 1's
    /// training function raised; copied from a run's driver output here, colours included).
    const RAY: &str = "\x1b[36m(RayTrainWorker pid=13708)\x1b[0m Setting up process group for: env:// [rank=0, world_size=2]
\x1b[36m(RayTrainWorker pid=13790)\x1b[0m Error in training function:
\x1b[36m(RayTrainWorker pid=13790)\x1b[0m Traceback (most recent call last):
\x1b[36m(RayTrainWorker pid=13790)\x1b[0m ValueError: injected: bad batch at step 50
\x1b[36m(TrainController pid=13608)\x1b[0m Error: Training failed due to worker errors:
\x1b[36m(TrainController pid=13608)\x1b[0m [Rank 1 Error Snippet]:
\x1b[36m(TrainController pid=13608)\x1b[0m ray.train.WorkerGroupError: Training failed due to worker errors:
(PlacementGroupCleaner pid=13678) Failed to query Ray Train Controller actor state.
Traceback (most recent call last):
ray.train.WorkerGroupError: Training failed due to worker errors:
[Rank 1 Error Snippet]:
Traceback (most recent call last):
  File \"/tmp/t/torch_linear_example.py\", line 41, in train_epoch
ValueError: injected: bad batch at step 50
\x1b[36m(RayTrainWorker pid=15621, ip=10.0.0.2)\x1b[0m Reporting training result 3";

    fn ray() -> &'static ClusterWorkers {
        match RAY_TRAIN.ranks {
            RankProcesses::ClusterWorkers(w) => w,
            RankProcesses::Started => unreachable!("Ray Train's workers are a cluster's"),
        }
    }

    #[test]
    fn a_cluster_launchers_line_is_the_worker_its_prefix_names() {
        let lines = words_of_lines(RAY);
        let said: Vec<Option<(u32, &str)>> = lines.iter().map(|l| ray().worker_line(l)).collect();
        assert_eq!(said[1], Some((13790, "Error in training function:")));
        assert_eq!(said[3], Some((13790, "ValueError: injected: bad batch at step 50")));
        assert_eq!(said[7], Some((13678, "Failed to query Ray Train Controller actor state.")));
        assert_eq!(said[8], None, "the driver's own line");
        assert_eq!(said[14], Some((15621, "Reporting training result 3")), "another host's worker");
        let hosts: Vec<Option<&str>> = lines.iter().map(|l| ray().host_of_line(l)).collect();
        assert_eq!(hosts[14], Some("10.0.0.2"), "another host's worker");
        assert!(hosts[..14].iter().all(Option::is_none), "{hosts:?}");
        for not in ["(pid=12) x", "(a b pid=12) x", "(Worker pid=) x", "ValueError: (Worker pid=3) x"] {
            assert_eq!(ray().worker_line(not), None, "{not}");
        }
    }

    #[test]
    fn a_cluster_launchers_relayed_error_is_its_ranks_with_the_lines_after_it() {
        let relayed = ray().relayed(&words_of_lines(RAY));
        assert_eq!(relayed.len(), 1);
        let (rank, block) = &relayed[0];
        assert_eq!(*rank, 1);
        // The driver's copy (four lines) is longer than the controller's (one): it is the one kept,
        // and it ends where another origin's line begins.
        assert_eq!(block.first().map(String::as_str), Some("Traceback (most recent call last):"));
        assert_eq!(block.last().map(String::as_str), Some("ValueError: injected: bad batch at step 50"));
        assert_eq!(block.len(), 3);
    }

    fn words_of_lines(text: &str) -> Vec<String> {
        text.lines().map(String::from).collect()
    }

    #[test]
    fn the_launchers_own_flags_give_the_rank_count() {
        for (line, want) in [
            ("torchrun --nproc_per_node 2 train.py", Some(2)),
            ("torchrun --nproc-per-node=4 --nnodes 2 train.py", Some(8)),
            ("python -m torch.distributed.run --nproc_per_node=3 t.py", Some(3)),
            ("accelerate launch --num_processes 2 t.py", Some(2)),
            ("deepspeed --num_gpus 2 --num_nodes 1 t.py", Some(2)),
            ("srun -n 4 python t.py", Some(4)),
            ("mpirun -np 2 python t.py", Some(2)),
            ("python train.py --nproc_per_node 9", None),
            ("torchrun --nproc_per_node gpu train.py", None),
            // The program's own flags are not the launcher's (issue 57).
            ("torchrun --nproc_per_node 2 gnn.py --nnodes 3", Some(2)),
            ("python -m torch.distributed.run --nproc_per_node 2 -m pkg.train --nnodes 3", Some(2)),
            ("srun -n 2 python t.py -n 8", Some(2)),
        ] {
            assert_eq!(declared_ranks(&words(line)).map(|(n, _)| n), want, "{line}");
        }
        assert_eq!(
            declared_ranks(&words("torchrun --nproc-per-node=4 t.py")).unwrap().1,
            "--nproc-per-node=4"
        );
    }

    #[test]
    fn the_launchers_own_flags_give_the_nodes_it_waits_for() {
        for (line, want) in [
            ("torchrun --nnodes 2 --nproc_per_node 2 t.py", Some(2)),
            ("torchrun --nnodes=2:4 t.py", Some(2)),
            ("torchrun --nnodes 1 t.py", None),
            ("deepspeed --num_nodes 3 t.py", Some(3)),
            ("python t.py --nnodes 2", None),
            ("torchrun --nproc_per_node 2 gnn.py --nnodes 3", None),
        ] {
            assert_eq!(declared_nodes(&words(line)).map(|(n, _)| n), want, "{line}");
        }
        assert_eq!(declared_nodes(&words("torchrun --nnodes=2:4 t.py")).unwrap().1, "--nnodes=2:4");
    }

    #[test]
    fn every_launcher_is_found_by_its_program_its_module_and_its_source() {
        assert_eq!(of_command(&words("/venv/bin/torchrun --standalone t.py")), Some(&TORCHRUN));
        assert_eq!(of_command(&words("python3 -u -m torch.distributed.launch t.py")), Some(&TORCHRUN));
        assert_eq!(of_command(&words("mpiexec -n 2 python t.py")), Some(&MPIRUN));
        assert_eq!(of_command(&words("python -m mypkg.train")), None);
        assert_eq!(of_command(&words("python train.py")), None);
        let (l, why) =
            in_program_source("import torch.multiprocessing as mp\nmp.spawn(f, nprocs=2)").unwrap();
        assert_eq!((l.name, why), ("torch.multiprocessing", "it calls `torch.multiprocessing.spawn`"));
        assert_eq!(in_program_source("from lightning import Trainer").map(|(l, _)| l), Some(&LIGHTNING));
        // A library's launcher, by the process count it is called with: a keyword argument only.
        for (source, found) in [
            ("with idist.Parallel(backend=\"gloo\", nproc_per_node=2) as p:", true),
            ("notebook_launcher(train, args, num_processes = 2)", true),
            ("xmp.spawn(_mp_fn, args=(), nprocs=8)", true),
            ("if state.num_processes == 2:", false),
            ("run(my_nprocs=2)", false),
            ("parser.add_argument(\"--nproc_per_node\", type=int)", false),
        ] {
            let got = in_program_source(source);
            assert_eq!(got.is_some(), found, "{source}: {got:?}");
        }
        assert_eq!(in_program_source("Parallel(nproc_per_node=2)").map(|(l, _)| l), Some(&PROCESS_COUNT));
        assert!(shell_words().any(|w| w == "accelerate launch"));
        assert_eq!(options_end(&words("torchrun --nproc_per_node 2 gnn.py --nnodes 3")), 3);
        assert_eq!(options_end(&words("srun -N 2 --ntasks-per-node 1 python t.py")), 5);
    }
}
