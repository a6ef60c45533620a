//! External training commands at the OS edge: the argv and environment a command runs with,
//! where its program and `py-spy` are, the rank processes a launcher starts (found by the `RANK`
//! in their environment), how a process we cannot wait for ended (procfs while it is a zombie),
//! and what a stuck process is doing (py-spy, each thread's wait channel and system call).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use procfs::process::Syscall;

use crate::probe::{memory, run};
use crate::scenario::{Scenario, render_with};

use super::os::owner;
use super::os::process::Exit;
use super::os::tcp;
use crate::schema::{IdentifiedBy, KernelThread, ProcessDump, ProcessRole};

/// The command's argv with every placeholder filled in; `master_port` is the run's free port.
pub fn argv(scenario: &Scenario, scenario_dir: &Path, master_port: u16) -> Vec<String> {
    let command = scenario.command.as_deref().unwrap_or_default();
    render_with(command, |name| match name {
        "world_size" => Some(scenario.launch.world_size.to_string()),
        "master_port" => Some(master_port.to_string()),
        "scenario_dir" => Some(scenario_dir.display().to_string()),
        _ => scenario.params.get(name).map(|p| p.value.render()),
    })
}

/// Variables set for every process of a command unless the user set them: unbuffered Python
/// output (so the last lines before a crash are not lost in a buffer, and output shows activity),
/// and Python's fault handler (a Python stack on SIGSEGV, SIGBUS, SIGABRT).
pub const PYTHON_ENV: [(&str, &str); 2] = [("PYTHONUNBUFFERED", "1"), ("PYTHONFAULTHANDLER", "1")];

/// Line-buffered output for a command's Python processes, where ups-doctor chose unbuffered: see
/// the file itself for why (a launcher's ranks share one stdout).
pub const SITECUSTOMIZE: &str = include_str!("../../python/site/sitecustomize.py");

/// The torchrun variables a launcher must not inherit from ups-doctor's own environment (its
/// ranks get their own from it; a stray `RANK` would also make the launcher look like a rank).
pub const RANK_ENV: [&str; 8] = [
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
];

/// Programs that start the ranks themselves: `launch.style: auto` starts them once.
const LAUNCHERS: [&str; 7] =
    ["torchrun", "accelerate", "deepspeed", "srun", "mpirun", "mpiexec", "lightning"];

/// What `launch.style: auto` takes for `argv`: launcher (true) or per rank, and why, in words.
/// A launcher is a known launcher program, `python -m torch.distributed.run` (or `.launch`), or
/// a Python script whose source starts its own ranks (`torch.multiprocessing.spawn`, `mp.spawn`,
/// Lightning's `Trainer`).
pub fn auto_style(argv: &[String]) -> (bool, String) {
    let name =
        |s: &str| Path::new(s).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let program = argv.first().map(|p| name(p)).unwrap_or_default();
    if LAUNCHERS.contains(&program.as_str()) {
        return (true, format!("`{program}` is a launcher (it starts the ranks)"));
    }
    if program.starts_with("python") {
        let mut args = argv.iter().skip(1).skip_while(|a| a.starts_with('-') && a.as_str() != "-m");
        match args.next().map(String::as_str) {
            Some("-m") => {
                let module = args.next().cloned().unwrap_or_default();
                if matches!(module.as_str(), "torch.distributed.run" | "torch.distributed.launch") {
                    return (true, format!("`python -m {module}` is torchrun (it starts the ranks)"));
                }
            }
            Some(script) => {
                let source = std::fs::read_to_string(script).unwrap_or_default();
                let starts_ranks = [
                    ("multiprocessing.spawn(", "it calls `torch.multiprocessing.spawn`"),
                    ("mp.spawn(", "it calls `torch.multiprocessing.spawn`"),
                    ("import lightning", "it uses Lightning, whose `Trainer` starts the ranks"),
                    ("from lightning", "it uses Lightning, whose `Trainer` starts the ranks"),
                    ("pytorch_lightning", "it uses Lightning, whose `Trainer` starts the ranks"),
                ];
                if let Some((_, why)) = starts_ranks.iter().find(|(needle, _)| source.contains(needle)) {
                    return (true, format!("`{}` starts its own ranks ({why})", name(script)));
                }
            }
            None => {}
        }
    }
    (false, format!("`{program}` is not a known launcher: one copy per rank, each with torchrun's variables"))
}

/// Where `program` is: itself when it names a path, else the first executable of that name on
/// `PATH` (as `execvp` would pick it).
pub fn find_program(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        let path = PathBuf::from(program);
        return path.is_file().then_some(path);
    }
    run::find_on_path(program)
}

/// `py-spy`: on `PATH`, or next to the command's program (a venv's `bin/python` or
/// `bin/torchrun` has its `bin/py-spy` beside it).
pub fn find_py_spy(program: Option<&Path>) -> Option<PathBuf> {
    find_program("py-spy").or_else(|| {
        let beside = program?.parent()?.join("py-spy");
        run::is_executable(&beside).then_some(beside)
    })
}

/// How long one `py-spy dump` may take.
const PY_SPY_TIMEOUT: Duration = Duration::from_secs(20);

/// Every thread of `pid` as py-spy sees it (Python and native frames), or why not.
pub fn py_spy_dump(py_spy: Option<&Path>, pid: u32, rank: u32, role: ProcessRole) -> ProcessDump {
    let threads = kernel_threads(pid);
    let (text, error) = match py_spy {
        None => (
            None,
            Some("py-spy is not installed (not on `PATH`, not next to the program): `pip install py-spy` for Python stacks".to_string()),
        ),
        Some(py_spy) => {
            match run::bounded(Command::new(py_spy).args(["dump", "--native", "--pid", &pid.to_string()]), PY_SPY_TIMEOUT)
            {
                Ok(Some(done)) if done.status.success() => (Some(done.stdout), None),
                Ok(Some(done)) => {
                    let why = format!("{}\n{}", done.stdout.trim(), done.stderr.trim()).trim().to_string();
                    (None, Some(format!("`py-spy dump --native --pid {pid}` failed: {why}")))
                }
                Ok(None) => (
                    None,
                    Some(format!(
                        "`py-spy dump --native --pid {pid}` did not answer within {}",
                        humantime::format_duration(PY_SPY_TIMEOUT)
                    )),
                ),
                Err(e) => (None, Some(format!("cannot run `{}`: {e}", py_spy.display()))),
            }
        }
    };
    ProcessDump { pid, rank, role, taken: None, py_spy: text, error, threads }
}

/// Each thread's name, kernel wait channel and current system call, from procfs.
pub fn kernel_threads(pid: u32) -> Vec<KernelThread> {
    let Some(tasks) =
        i32::try_from(pid).ok().and_then(|p| procfs::process::Process::new(p).ok()?.tasks().ok())
    else {
        return Vec::new();
    };
    let mut threads: Vec<KernelThread> = tasks
        .filter_map(Result::ok)
        .map(|task| {
            // procfs has no reader for a task's `wchan` (only the process's): read it as text.
            let wchan = std::fs::read_to_string(format!("/proc/{pid}/task/{}/wchan", task.tid))
                .ok()
                .map(|w| w.trim().to_string())
                .filter(|w| !w.is_empty() && w != "0");
            KernelThread {
                tid: task.tid as u32,
                name: task.stat().map(|s| s.comm).unwrap_or_default(),
                wchan,
                syscall: task.syscall().ok().map(|s| describe_syscall(&s)),
            }
        })
        .collect();
    threads.sort_unstable_by_key(|t| t.tid);
    threads
}

/// `/proc/PID/task/TID/syscall` in words: `202 (futex)` (the number is this architecture's),
/// `running`, or `-1` when the thread is blocked outside a system call.
fn describe_syscall(syscall: &Syscall) -> String {
    match *syscall {
        Syscall::Running => "running".to_string(),
        Syscall::Blocked { syscall_number: n, .. } => match syscall_name(n) {
            Some(name) => format!("{n} ({name})"),
            None => n.to_string(),
        },
        // `Syscall` is non-exhaustive: a form a later procfs learns to read.
        ref other => format!("{other:?}"),
    }
}

/// Names of the system calls a blocked training process usually sits in. The numbers are this
/// architecture's (libc's `SYS_*` constants differ between x86-64, aarch64, …); a call the
/// architecture lacks (aarch64 has no `poll`, `select` or `epoll_wait`) is simply not listed.
fn syscall_name(n: i64) -> Option<&'static str> {
    const NAMES: &[(libc::c_long, &str)] = &[
        (libc::SYS_read, "read"),
        (libc::SYS_write, "write"),
        #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
        (libc::SYS_poll, "poll"),
        #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
        (libc::SYS_select, "select"),
        #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
        (libc::SYS_nanosleep, "nanosleep"),
        (libc::SYS_accept, "accept"),
        (libc::SYS_recvfrom, "recvfrom"),
        (libc::SYS_sendto, "sendto"),
        (libc::SYS_recvmsg, "recvmsg"),
        (libc::SYS_wait4, "wait4"),
        (libc::SYS_waitid, "waitid"),
        (libc::SYS_futex, "futex"),
        (libc::SYS_clock_nanosleep, "clock_nanosleep"),
        #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
        (libc::SYS_epoll_wait, "epoll_wait"),
        (libc::SYS_pselect6, "pselect6"),
        (libc::SYS_ppoll, "ppoll"),
        (libc::SYS_epoll_pwait, "epoll_pwait"),
        (libc::SYS_accept4, "accept4"),
    ];
    NAMES.iter().find(|(num, _)| i64::from(*num) == n).map(|(_, name)| *name)
}

/// A launcher's process, from one read of its `/proc/PID/stat`: how one that is not our child
/// ended can only be read while it is a zombie (field 52, the wait status, since Linux 3.5).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FoundState {
    Running,
    /// A zombie (with its exit status), or gone (reaped by the launcher: no status left to read).
    Ended(Option<Exit>),
}

/// Whether `pid` runs or has ended, and how, from one read: two reads (is it a zombie? is it
/// alive?) can straddle its death and report it gone without the status it left.
pub fn found_state(pid: u32) -> FoundState {
    match memory::read_stat(pid) {
        None => FoundState::Ended(None),
        Some(s) if s.state == 'Z' => FoundState::Ended(s.exit_code.map(decode_wait_status)),
        Some(_) => FoundState::Running,
    }
}

/// A raw wait status as [`Exit`].
pub fn decode_wait_status(status: i32) -> Exit {
    if status & 0x7f == 0 {
        Exit::Code((status >> 8) & 0xff)
    } else {
        Exit::Signal { signal: status & 0x7f, core_dumped: status & 0x80 != 0 }
    }
}

/// Sends `signal` to a rank a launcher started, `who` as first found, and to every process below
/// it that is not another rank (`others`): its workers, whatever their process group (torchrun
/// starts each rank in a session of its own, slurmstepd puts a step's tasks in the first task's
/// group, `mp.spawn`'s ranks share the launcher's). Each one only after [`owner::Run::check`].
/// Returns whether the rank itself got it.
pub fn signal_found(run: &owner::Run, who: owner::Identity, others: &[u32], signal: i32) -> bool {
    let members = rank_members(who.pid, others);
    let sent = run.signal(who, signal).is_ok();
    if sent {
        for pid in members.into_iter().filter(|&p| p != who.pid) {
            if let Some(member) = owner::identify(pid) {
                let _ = run.signal(member, signal);
            }
        }
    }
    sent
}

/// A rank process found for a launcher-style run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundRank {
    pub rank: u32,
    pub pid: u32,
    /// How it was found: a rank variable, the launcher itself, or a spawn order.
    pub by: IdentifiedBy,
}

/// What rank discovery knows besides the process table.
#[derive(Debug, Default)]
pub struct Known {
    /// Ranks already found (rank → pid): a spawn order keeps them.
    pub found: BTreeMap<u32, u32>,
    /// What the helper's markers said (pid → rank).
    pub claims: BTreeMap<u32, u32>,
    /// The run's rendezvous port (the one ups-doctor picked); `MASTER_PORT` and `PET_MASTER_PORT`
    /// of the launcher's and its processes' starting environments are looked at too.
    pub port: u16,
}

/// The rank number a process's starting environment gives, and the variable that gave it.
/// `LOCAL_RANK` counts only on node 0 (`NODE_RANK` unset or 0): elsewhere it is not the rank.
/// The environment is read once: a launcher's child read between its fork and its exec shows the
/// launcher's environment, and reading `RANK` then and `LOCAL_RANK` after the exec named a
/// DeepSpeed rank by `LOCAL_RANK` (seen in the full suite under load).
fn env_rank(pid: u32) -> Option<(u32, IdentifiedBy)> {
    let env = memory::environ(pid)?;
    let var = |key: &str| env.get(std::ffi::OsStr::new(key)).map(|v| v.to_string_lossy().into_owned());
    IdentifiedBy::VARIABLES.into_iter().find_map(|by| {
        let value: u32 = var(by.variable()?)?.trim().parse().ok()?;
        if by == IdentifiedBy::LocalRank && var("NODE_RANK").is_some_and(|n| n.trim() != "0") {
            return None;
        }
        Some((value, by))
    })
}

/// Where a launcher placed its node in the world: `RANK − LOCAL_RANK` of the first process below
/// `root` whose starting environment has both (torchrun and DeepSpeed set both), when that leaves
/// room for the node's `local` ranks in a world of `world`. torchrun's `c10d` rendezvous numbers
/// the nodes by host name and agent pid, not by `--node-rank` (`dynamic_rendezvous.py` sorts its
/// participants), so node R's ranks are R × `local` only when the hosts happen to sort that way;
/// two nodes on one host swap whenever node 1's torchrun got the lower pid. Both variables come
/// from one read of the environment (see [`env_rank`] on the exec window).
pub fn node_first_rank(root: u32, local: u32, world: u32) -> Option<u32> {
    let table = memory::processes();
    let children = children_of(&table);
    let first_of = |pid: u32| {
        let env = memory::environ(pid)?;
        let number = |key: &str| env.get(std::ffi::OsStr::new(key))?.to_str()?.trim().parse::<u32>().ok();
        number("RANK")?.checked_sub(number("LOCAL_RANK")?)
    };
    let mut queue = vec![root];
    while let Some(pid) = queue.pop() {
        for &child in children.get(&pid).into_iter().flatten() {
            match first_of(child) {
                Some(first) if first + local <= world => return Some(first),
                _ => queue.push(child),
            }
        }
    }
    None
}

/// Whether `pid` is a child that Python's `multiprocessing` started with the `spawn` or
/// `forkserver` method (`torch.multiprocessing.spawn`'s ranks are), from its command line.
fn is_spawn_child(pid: u32) -> bool {
    memory::cmdline(pid)
        .is_some_and(|text| text.contains("--multiprocessing-fork") && !text.contains("resource_tracker"))
}

/// When `pid` started, in clock ticks since boot (field 22 of `/proc/PID/stat`).
fn start_ticks(pid: u32) -> u64 {
    memory::read_stat(pid).map_or(u64::MAX, |s| s.start_ticks)
}

/// The rank processes of a launcher-style run whose launcher is `root`, by every signal there
/// is, in this order:
/// - a rank variable in the starting environment ([`IdentifiedBy::VARIABLES`]) of a process below the launcher,
///   or of a process anywhere on the machine that carries this run's id (`srun`'s tasks are
///   slurmstepd's children, not the launcher's): the topmost such process per rank (its
///   DataLoader workers, below it, inherit the same variables);
/// - the helper's markers: a process of this run that reported its rank (topmost per rank: a
///   forked worker reports its rank's number too);
/// - the rendezvous port: below the launcher, the process that listens on it is rank 0, and when
///   one rank is left, the one other process connected to it is that rank;
/// - the launcher itself as rank 0, when ranks were found by `LOCAL_RANK` and none is rank 0
///   (Lightning runs rank 0 in the launcher process and starts the others with `LOCAL_RANK`);
/// - `multiprocessing` spawn children of the launcher numbered in the order they started
///   (`torch.multiprocessing.spawn(fn, nprocs=N)` starts rank i as its i-th child), when no
///   other signal found a rank.
pub fn discover_ranks(root: u32, run_id: &str, world: u32, known: &Known) -> Vec<FoundRank> {
    let table = memory::processes();
    let parent: BTreeMap<u32, u32> = table.iter().map(|p| (p.pid, p.ppid)).collect();
    let children = children_of(&table);
    let ours = |pid: u32| memory::environ_has(pid, crate::protocol::RUN_ID_ENV, run_id);
    let mut found: Vec<FoundRank> = Vec::new();
    let add = |found: &mut Vec<FoundRank>, rank: u32, pid: u32, by: IdentifiedBy| {
        if rank < world && !found.iter().any(|f| f.rank == rank || f.pid == pid) {
            found.push(FoundRank { rank, pid, by });
        }
    };
    let mut below = vec![root];
    let mut queue = vec![root];
    while let Some(pid) = queue.pop() {
        for &child in children.get(&pid).into_iter().flatten() {
            match env_rank(child) {
                // A rank's own subtree is its workers, not more ranks.
                Some((rank, by)) => add(&mut found, rank, child, by),
                None => {
                    below.push(child);
                    queue.push(child)
                }
            }
        }
    }
    // Elsewhere on the machine: this run's processes whose parent is not one of them with a rank
    // (that would make them a rank's workers).
    for p in table.iter().filter(|p| !p.zombie() && p.pid != root && !below.contains(&p.pid)) {
        if found.iter().any(|f| f.pid == p.pid) || !ours(p.pid) {
            continue;
        }
        let Some((rank, by)) = env_rank(p.pid) else { continue };
        let ppid = parent.get(&p.pid).copied().unwrap_or(0);
        if !(ours(ppid) && env_rank(ppid).is_some()) {
            add(&mut found, rank, p.pid, by);
        }
    }
    // Whether `pid` is below a rank found so far (its worker): then it is no rank itself.
    let under_a_rank = |found: &[FoundRank], pid: u32| {
        let mut p = parent.get(&pid).copied().unwrap_or(0);
        for _ in 0..64 {
            if p <= 1 {
                return false;
            }
            if found.iter().any(|f| f.pid == p && f.pid != root) {
                return true;
            }
            p = parent.get(&p).copied().unwrap_or(0);
        }
        false
    };
    // The helper's markers, parents before children (a forked worker reports its rank's number).
    let mut claims: Vec<(u32, u32)> = known.claims.iter().map(|(&pid, &rank)| (pid, rank)).collect();
    claims.sort_by_key(|&(pid, _)| (start_ticks(pid), pid));
    for (pid, rank) in claims {
        let alive = table.iter().any(|p| p.pid == pid && !p.zombie());
        // A forked child of a process of the run other than the launcher (a DataLoader worker,
        // whose parent has not reported yet) has its parent's command line: not a rank.
        let ppid = parent.get(&pid).copied().unwrap_or(0);
        let forked = ppid != root
            && ours(ppid)
            && memory::cmdline(ppid).is_some_and(|c| Some(c) == memory::cmdline(pid));
        if alive && ours(pid) && !forked && !under_a_rank(&found, pid) {
            add(&mut found, rank, pid, IdentifiedBy::Markers);
        }
    }
    let candidates: Vec<u32> = below
        .iter()
        .copied()
        .filter(|&p| p != root && !found.iter().any(|f| f.pid == p) && !under_a_rank(&found, p))
        .collect();
    let mut ports: Vec<u16> = vec![known.port];
    for pid in std::iter::once(root).chain(candidates.iter().copied()) {
        for var in ["MASTER_PORT", "PET_MASTER_PORT"] {
            ports.extend(memory::environ_var(pid, var).and_then(|v| v.trim().parse::<u16>().ok()));
        }
    }
    ports.sort_unstable();
    ports.dedup();
    let (listeners, connected) = at_rendezvous(root, &candidates, &parent, &ports);
    if let [rank0] = listeners[..] {
        add(&mut found, 0, rank0, IdentifiedBy::RendezvousListens);
    }
    let left: Vec<u32> = (0..world).filter(|r| !found.iter().any(|f| f.rank == *r)).collect();
    let others: Vec<u32> = connected.into_iter().filter(|p| !found.iter().any(|f| f.pid == *p)).collect();
    if let ([rank], [pid]) = (&left[..], &others[..]) {
        add(&mut found, *rank, *pid, IdentifiedBy::RendezvousConnected);
    }
    if !found.is_empty()
        && found.iter().all(|f| f.by == IdentifiedBy::LocalRank)
        && !found.iter().any(|f| f.rank == 0)
    {
        add(&mut found, 0, root, IdentifiedBy::LauncherProcess);
    }
    if found.is_empty() {
        let mut spawned: Vec<u32> =
            children.get(&root).into_iter().flatten().copied().filter(|&c| is_spawn_child(c)).collect();
        spawned.sort_by_key(|&pid| (start_ticks(pid), pid));
        let mut next = (0..world).filter(|r| !known.found.contains_key(r));
        for pid in spawned {
            if known.found.values().any(|&k| k == pid) {
                continue;
            }
            match next.next() {
                Some(rank) => add(&mut found, rank, pid, IdentifiedBy::SpawnOrder),
                None => break,
            }
        }
    }
    found.sort_by_key(|f| f.rank);
    found
}

fn children_of(table: &[memory::ProcStat]) -> BTreeMap<u32, Vec<u32>> {
    table.iter().filter(|p| !p.zombie()).fold(BTreeMap::new(), |mut map, p| {
        map.entry(p.ppid).or_default().push(p.pid);
        map
    })
}

/// Among `candidates`, the processes that listen on one of `ports` and those connected to one
/// (the c10d store's clients). A socket counts for the topmost process that holds it: a forked
/// child (a DataLoader worker, or a launcher's child between fork and exec) holds its parent's
/// sockets too.
fn at_rendezvous(
    root: u32,
    candidates: &[u32],
    parent: &BTreeMap<u32, u32>,
    ports: &[u16],
) -> (Vec<u32>, Vec<u32>) {
    if candidates.is_empty() {
        return (Vec::new(), Vec::new());
    }
    let table = tcp::sockets(root);
    let inodes = |pid: u32| -> Vec<tcp::Socket> {
        let held = tcp::socket_inodes(pid);
        table.iter().filter(|s| held.contains(&s.inode)).copied().collect()
    };
    let mut listeners = Vec::new();
    let mut connected = Vec::new();
    for &pid in candidates {
        let held = inodes(pid);
        let ppid = parent.get(&pid).copied().unwrap_or(0);
        let from_parent = if ppid == root || candidates.contains(&ppid) {
            tcp::socket_inodes(ppid)
        } else {
            Default::default()
        };
        let own = |s: &&tcp::Socket| !from_parent.contains(&s.inode);
        if held.iter().filter(own).any(|s| s.listening && ports.contains(&s.local_port)) {
            listeners.push(pid);
        } else if held.iter().filter(own).any(|s| s.established && ports.contains(&s.remote_port)) {
            connected.push(pid);
        }
    }
    (listeners, connected)
}

/// The process `pid` and everything below it, except other ranks (`others`) and what is below
/// them: a rank's own processes (its DataLoader workers), whatever their process group.
pub fn rank_members(pid: u32, others: &[u32]) -> Vec<u32> {
    rank_members_in(&memory::processes(), pid, others)
}

/// [`rank_members`] in a process table already read.
pub fn rank_members_in(table: &[memory::ProcStat], pid: u32, others: &[u32]) -> Vec<u32> {
    let children = children_of(table);
    let mut members = vec![pid];
    let mut queue = vec![pid];
    while let Some(p) = queue.pop() {
        for &child in children.get(&p).into_iter().flatten() {
            if !others.contains(&child) {
                members.push(child);
                queue.push(child);
            }
        }
    }
    members.sort_unstable();
    members
}

/// Processes below the launcher `root` that look like ranks but whose rank is not known:
/// its children that are not found ranks, not `multiprocessing`'s resource tracker and not
/// zombies.
pub fn unidentified_children(root: u32, found: &[u32]) -> Vec<u32> {
    memory::processes()
        .into_iter()
        .filter(|p| p.ppid == root && !p.zombie() && !found.contains(&p.pid))
        .filter(|p| memory::cmdline(p.pid).is_some_and(|text| !text.contains("resource_tracker")))
        .map(|p| p.pid)
        .collect()
}

/// One failed rank in torchrun's error summary.
#[derive(Debug, Clone, PartialEq)]
pub struct TorchrunFailure {
    pub rank: u32,
    pub exit: Exit,
    pub pid: Option<u32>,
    /// Listed under "Root Cause (first observed failure)".
    pub root_cause: bool,
}

/// The failures torchrun's elastic agent lists in its summary (`Root Cause (first observed
/// failure):` and `Failures:` blocks, each entry with `rank : R (local_rank: L)` and
/// `exitcode : -11 (pid: N)`).
pub fn torchrun_failures(lines: &[String]) -> Vec<TorchrunFailure> {
    let mut out: Vec<TorchrunFailure> = Vec::new();
    let mut root_cause = false;
    let mut rank: Option<u32> = None;
    for line in lines {
        let text = line.trim();
        if text.starts_with("Root Cause") {
            root_cause = true;
        } else if text.starts_with("Failures:") {
            root_cause = false;
        }
        let Some((key, value)) = text.split_once(':') else { continue };
        match key.trim() {
            "rank" => rank = value.split_whitespace().next().and_then(|r| r.parse().ok()),
            "exitcode" => {
                let Some(r) = rank.take() else { continue };
                let mut words = value.split_whitespace();
                let Some(code) = words.next().and_then(|c| c.parse::<i32>().ok()) else { continue };
                let pid = value
                    .split("pid:")
                    .nth(1)
                    .and_then(|p| p.trim().trim_end_matches(')').trim().parse().ok());
                let exit = if code < 0 {
                    Exit::Signal { signal: -code, core_dumped: false }
                } else {
                    Exit::Code(code)
                };
                if !out.iter().any(|f| f.rank == r) {
                    out.push(TorchrunFailure { rank: r, exit, pid, root_cause });
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A launcher (`sh`) whose two children carry `RANK` 3 and 2 with `LOCAL_RANK` 1 and 0: the
    /// node runs ranks from 2. A world too small for that is no placement.
    #[test]
    fn a_nodes_first_rank_is_rank_less_local_rank_of_a_process_below_its_launcher() {
        let mut launcher = std::process::Command::new("sh")
            .args(["-c", "RANK=3 LOCAL_RANK=1 sleep 60 & RANK=2 LOCAL_RANK=0 sleep 60 & wait"])
            .spawn()
            .expect("sh starts");
        let root = launcher.id();
        // The children show their variables once they have exec'd `sleep`.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut first = None;
        while first.is_none() && std::time::Instant::now() < deadline {
            first = node_first_rank(root, 2, 4);
            std::thread::yield_now();
        }
        let too_small = node_first_rank(root, 2, 3);
        for child in memory::processes().iter().filter(|p| p.ppid == root) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.pid as i32),
                nix::sys::signal::SIGKILL,
            );
        }
        let _ = launcher.kill();
        let _ = launcher.wait();
        assert_eq!(first, Some(2));
        assert_eq!(too_small, None, "ranks 2-3 do not fit a world of 3");
    }

    #[test]
    fn wait_statuses_decode_like_waitpid() {
        assert_eq!(decode_wait_status(0), Exit::Code(0));
        assert_eq!(decode_wait_status(1 << 8), Exit::Code(1));
        assert_eq!(decode_wait_status(11), Exit::Signal { signal: 11, core_dumped: false });
        assert_eq!(decode_wait_status(0x80 | 6), Exit::Signal { signal: 6, core_dumped: true });
    }

    #[test]
    fn torchruns_summary_gives_each_failed_ranks_exit() {
        let text = "\
[W ... torch/distributed/elastic/multiprocessing/api.py:908] Sending process 1001 closing signal SIGTERM
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/x/train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-01-01_00:00:01
  host      : box
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 1001)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 1001
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-01-01_00:00:00
  host      : box
  rank      : 1 (local_rank: 1)
  exitcode  : -11 (pid: 1002)
  error_file: <N/A>
  traceback : Signal 11 (SIGSEGV) received by PID 1002
============================================================";
        let lines: Vec<String> = text.lines().map(String::from).collect();
        let failures = torchrun_failures(&lines);
        assert_eq!(
            failures,
            vec![
                TorchrunFailure {
                    rank: 0,
                    exit: Exit::Signal { signal: 15, core_dumped: false },
                    pid: Some(1001),
                    root_cause: false
                },
                TorchrunFailure {
                    rank: 1,
                    exit: Exit::Signal { signal: 11, core_dumped: false },
                    pid: Some(1002),
                    root_cause: true
                },
            ]
        );
    }

    #[test]
    fn a_command_renders_params_and_built_in_placeholders() {
        let s: Scenario = serde_json::from_value(serde_json::json!({
            "command": ["torchrun", "--nproc_per_node", "{world_size}", "{scenario_dir}/t.py", "--d={depths}", "{pin}"],
            "params": {"depths": [2, 2], "pin": {"value": false}},
            "launch": {"world_size": 2, "style": "launcher"}
        }))
        .unwrap();
        assert_eq!(
            argv(&s, Path::new("/s"), 29501),
            ["torchrun", "--nproc_per_node", "2", "/s/t.py", "--d=2,2", "false"]
        );
    }

    #[test]
    fn auto_takes_launcher_for_launchers_and_programs_that_start_their_own_ranks() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let programs = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/programs");
        let launchers = programs.join("launchers.py").display().to_string();
        let plain = programs.join("ddp.py").display().to_string();
        for (argv, launcher, why) in [
            (args(&["torchrun", "--nproc_per_node", "2", "t.py"]), true, "`torchrun` is a launcher"),
            (args(&["/venv/bin/accelerate", "launch", "t.py"]), true, "`accelerate` is a launcher"),
            (
                args(&["python", "-u", "-m", "torch.distributed.run", "t.py"]),
                true,
                "`python -m torch.distributed.run` is torchrun",
            ),
            (args(&["python3", &launchers]), true, "`launchers.py` starts its own ranks"),
            (args(&["python", &plain]), false, "`python` is not a known launcher"),
            (args(&["python", "-m", "mypkg.train"]), false, "`python` is not a known launcher"),
            (args(&["./train.sh"]), false, "`train.sh` is not a known launcher"),
        ] {
            let (is_launcher, text) = auto_style(&argv);
            assert_eq!(is_launcher, launcher, "{argv:?}: {text}");
            assert!(text.starts_with(why), "{argv:?}: {text}");
        }
    }

    #[test]
    fn programs_are_found_on_path_or_by_their_path() {
        assert!(find_program("sh").is_some());
        assert_eq!(find_program("/bin/sh"), Some(PathBuf::from("/bin/sh")));
        assert_eq!(find_program("ups-doctor-no-such-program"), None);
    }

    #[test]
    fn a_live_process_has_threads_with_a_syscall_and_this_one_is_no_zombie() {
        // A thread of our own that waits in the kernel until told to go. (Other tests' threads in
        // this process come and go while it is read, so only this one is judged.)
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let (tell, tid) = std::sync::mpsc::channel();
        let parked = std::thread::spawn(move || {
            tell.send(nix::unistd::gettid().as_raw() as u32).unwrap();
            wait.recv().ok();
        });
        let tid = tid.recv().unwrap();
        let me = std::process::id();
        let threads = kernel_threads(me);
        let thread = threads.iter().find(|t| t.tid == tid).expect("the parked thread is listed");
        assert!(thread.syscall.is_some(), "{thread:?}");
        go.send(()).unwrap();
        parked.join().unwrap();
        assert_eq!(found_state(me), FoundState::Running);
    }

    #[test]
    fn a_zombies_exit_status_is_read_from_procfs() {
        let child = Command::new("sh").args(["-c", "exit 3"]).spawn().unwrap();
        let pid = child.id();
        // Not reaped yet: it stays a zombie until waited for.
        let mut seen = FoundState::Running;
        for _ in 0..500 {
            seen = found_state(pid);
            if seen != FoundState::Running {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(seen, FoundState::Ended(Some(Exit::Code(3))));
        drop(child.wait_with_output());
        // Reaped: gone, with no status left to read.
        assert_eq!(found_state(pid), FoundState::Ended(None));
    }
}
