//! The rank processes a launcher starts, found from the process tree: by the rank variables in
//! their environment, by the helper's markers, by the rendezvous port they connect to, or by the
//! order `torch.multiprocessing.spawn` starts them; a node's first global rank; the processes
//! that belong to a rank (its DataLoader workers). Decides nothing about teardown.
//!
//! The decision is a pure core, [`find_ranks`], over what a [`ProcessView`] says of the machine
//! (the process table, each process's rank variable, run id, command line, start time and
//! rendezvous sockets); [`Procfs`] is the view of the real `/proc`, and the tests give made-up
//! process trees of every launcher.

use std::collections::BTreeMap;

use crate::probe::memory;

use super::os::tcp;
use super::os::tree::children_of;
pub use super::os::tree::{rank_members, rank_members_in};
use crate::schema::IdentifiedBy;

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
    /// A run whose world may grow (a launcher that forms its group itself), up to this many
    /// ranks: a process whose starting environment declares a larger `WORLD_SIZE` than the run
    /// watches is a rank of that world (Lightning's own launcher starts rank 1 with
    /// `WORLD_SIZE=2` before any group is formed).
    pub grow_to: Option<u32>,
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
pub fn node_first_rank(table: &[memory::ProcStat], root: u32, local: u32, world: u32) -> Option<u32> {
    let children = children_of(table);
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

/// Whether a command line is that of a child Python's `multiprocessing` started with the `spawn`
/// or `forkserver` method (`torch.multiprocessing.spawn`'s ranks are).
fn is_spawn_child(cmdline: Option<String>) -> bool {
    cmdline.is_some_and(|text| text.contains("--multiprocessing-fork") && !text.contains("resource_tracker"))
}

/// What rank discovery reads of the machine: the process table and, per process, what procfs
/// says of it. [`Procfs`] reads the real `/proc`; the tests give made-up process trees.
pub trait ProcessView {
    /// Every process (zombies included).
    fn table(&self) -> Vec<memory::ProcStat>;
    /// The rank its starting environment gives ([`env_rank`]).
    fn env_rank(&self, pid: u32) -> Option<(u32, IdentifiedBy)>;
    /// Whether it carries this run's id in its environment.
    fn ours(&self, pid: u32) -> bool;
    fn cmdline(&self, pid: u32) -> Option<String>;
    /// When it started, in clock ticks since boot (`u64::MAX` when unknown).
    fn start_ticks(&self, pid: u32) -> u64;
    /// The rendezvous ports its starting environment names (`MASTER_PORT`, `PET_MASTER_PORT`).
    fn env_ports(&self, pid: u32) -> Vec<u16>;
    /// `WORLD_SIZE` of its starting environment.
    fn env_world(&self, pid: u32) -> Option<u32>;
    /// Among `candidates`, those that listen on one of `ports` and those connected to one (see
    /// [`at_rendezvous`]).
    fn at_rendezvous(
        &self,
        root: u32,
        candidates: &[u32],
        parent: &BTreeMap<u32, u32>,
        ports: &[u16],
    ) -> (Vec<u32>, Vec<u32>);
}

/// The real machine's `/proc`, for the run `run_id`: the processes of `table`, and what procfs
/// says of each.
pub struct Procfs<'a> {
    pub run_id: &'a str,
    pub table: &'a [memory::ProcStat],
}

impl ProcessView for Procfs<'_> {
    fn table(&self) -> Vec<memory::ProcStat> {
        self.table.to_vec()
    }
    fn env_rank(&self, pid: u32) -> Option<(u32, IdentifiedBy)> {
        env_rank(pid)
    }
    fn ours(&self, pid: u32) -> bool {
        memory::environ_has(pid, crate::protocol::RUN_ID_ENV, self.run_id)
    }
    fn cmdline(&self, pid: u32) -> Option<String> {
        memory::cmdline(pid)
    }
    fn start_ticks(&self, pid: u32) -> u64 {
        memory::read_stat(pid).map_or(u64::MAX, |s| s.start_ticks)
    }
    fn env_ports(&self, pid: u32) -> Vec<u16> {
        ["MASTER_PORT", "PET_MASTER_PORT"]
            .into_iter()
            .filter_map(|var| memory::environ_var(pid, var)?.trim().parse::<u16>().ok())
            .collect()
    }
    fn env_world(&self, pid: u32) -> Option<u32> {
        memory::environ_var(pid, "WORLD_SIZE")?.trim().parse().ok()
    }
    fn at_rendezvous(
        &self,
        root: u32,
        candidates: &[u32],
        parent: &BTreeMap<u32, u32>,
        ports: &[u16],
    ) -> (Vec<u32>, Vec<u32>) {
        at_rendezvous(root, candidates, parent, ports)
    }
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
///
/// `table` is the processes to look among ([`memory::processes`] for the whole machine): a rank
/// outside it is not found.
pub fn discover_ranks(
    table: &[memory::ProcStat],
    root: u32,
    run_id: &str,
    world: u32,
    known: &Known,
) -> Vec<FoundRank> {
    find_ranks(&Procfs { run_id, table }, root, world, known)
}

/// [`discover_ranks`] over what `view` says of the machine: the pure core.
pub fn find_ranks(view: &impl ProcessView, root: u32, world: u32, known: &Known) -> Vec<FoundRank> {
    let table = view.table();
    let parent: BTreeMap<u32, u32> = table.iter().map(|p| (p.pid, p.ppid)).collect();
    let children = children_of(&table);
    let ours = |pid: u32| view.ours(pid);
    let env_rank = |pid: u32| view.env_rank(pid);
    let mut found: Vec<FoundRank> = Vec::new();
    let add = |found: &mut Vec<FoundRank>, rank: u32, pid: u32, by: IdentifiedBy| {
        // A rank beyond the world watched, of a world its environment declares and the run may
        // grow to: the caller grows the run to it.
        let declared =
            || known.grow_to.is_some_and(|cap| view.env_world(pid).is_some_and(|w| rank < w && w <= cap));
        if (rank < world || declared()) && !found.iter().any(|f| f.rank == rank || f.pid == pid) {
            found.push(FoundRank { rank, pid, by });
        }
    };
    let claimed = |pid: u32, ppid: u32| said_rank(view, &table, known, root, (pid, ppid));
    let mut below = vec![root];
    let mut queue = vec![root];
    while let Some(pid) = queue.pop() {
        for &child in children.get(&pid).into_iter().flatten() {
            // A process that said its rank is one before any process below it whose starting
            // environment has a rank variable: a library that spawns its ranks and sets `RANK` in
            // each only once it runs (PyTorch-Ignite's `Parallel`) gives it to the workers the rank
            // starts later, never to the rank's own starting environment.
            match env_rank(child).or_else(|| claimed(child, pid).map(|r| (r, IdentifiedBy::Markers))) {
                // Nor is a process with the variable whose parent `multiprocessing` started below the
                // launcher: that parent is a spawned rank that has not said so yet, and this is its
                // worker. Taken for the rank, the worker's end was the rank's (Ignite × skip-coll in
                // the accuracy matrix: rank 1 "passed" as its worker exited 0, while the rank was
                // stopped in a collective); left alone, the rank is found once it says so.
                Some((_, by))
                    if by != IdentifiedBy::Markers && pid != root && is_spawn_child(view.cmdline(pid)) =>
                {
                    below.push(child)
                }
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
    // (that would make them a rank's workers). Only those started since the launcher can carry
    // this run's id: the environment of the machine's older processes (most of its hundred or
    // more) is not read, each round of a launcher's start-up, every 50 ms.
    let since = table.iter().find(|p| p.pid == root).map_or(0, |p| p.start_ticks);
    for p in table
        .iter()
        .filter(|p| !p.zombie() && p.pid != root && p.start_ticks >= since && !below.contains(&p.pid))
    {
        if found.iter().any(|f| f.pid == p.pid) || !ours(p.pid) {
            continue;
        }
        let Some((rank, by)) = env_rank(p.pid) else { continue };
        let ppid = parent.get(&p.pid).copied().unwrap_or(0);
        if !(ours(ppid) && (env_rank(ppid).is_some() || known.claims.contains_key(&ppid))) {
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
    claims.sort_by_key(|&(pid, _)| (view.start_ticks(pid), pid));
    for (pid, rank) in claims {
        let ppid = parent.get(&pid).copied().unwrap_or(0);
        if claimed(pid, ppid).is_some() && !under_a_rank(&found, pid) {
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
        ports.extend(view.env_ports(pid));
    }
    ports.sort_unstable();
    ports.dedup();
    let (listeners, connected) = view.at_rendezvous(root, &candidates, &parent, &ports);
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
        for (rank, pid) in
            by_spawn_order(view, children.get(&root).map_or(&[][..], Vec::as_slice), world, known)
        {
            add(&mut found, rank, pid, IdentifiedBy::SpawnOrder);
        }
    }
    found.sort_by_key(|f| f.rank);
    found
}

/// The rank a live process of this run (`pid`, child of `ppid`) said it is through the observer's
/// markers, unless it is a forked child of a process of the run other than the launcher `root`: a
/// DataLoader worker, whose parent has not reported yet, has its parent's command line.
fn said_rank(
    view: &impl ProcessView,
    table: &[memory::ProcStat],
    known: &Known,
    root: u32,
    (pid, ppid): (u32, u32),
) -> Option<u32> {
    let rank = *known.claims.get(&pid)?;
    let alive = table.iter().any(|p| p.pid == pid && !p.zombie());
    let forked =
        ppid != root && view.ours(ppid) && view.cmdline(ppid).is_some_and(|c| Some(c) == view.cmdline(pid));
    (alive && view.ours(pid) && !forked).then_some(rank)
}

/// `multiprocessing` spawn children of the launcher (`children`) numbered in the order they
/// started, skipping the ranks and processes already found: `(rank, pid)`.
fn by_spawn_order(view: &impl ProcessView, children: &[u32], world: u32, known: &Known) -> Vec<(u32, u32)> {
    let mut spawned: Vec<u32> =
        children.iter().copied().filter(|&c| is_spawn_child(view.cmdline(c))).collect();
    spawned.sort_by_key(|&pid| (view.start_ticks(pid), pid));
    let taken = |pid: u32| known.found.values().any(|&k| k == pid);
    let free = (0..world).filter(|r| !known.found.contains_key(r));
    free.zip(spawned.into_iter().filter(|&p| !taken(p))).collect()
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

/// Processes below the launcher `root` that look like ranks but whose rank is not known:
/// its children that are not found ranks, not `multiprocessing`'s resource tracker and not
/// zombies.
pub fn unidentified_children(table: &[memory::ProcStat], root: u32, found: &[u32]) -> Vec<u32> {
    table
        .iter()
        .filter(|p| p.ppid == root && !p.zombie() && !found.contains(&p.pid))
        .filter(|p| memory::cmdline(p.pid).is_some_and(|text| !text.contains("resource_tracker")))
        .map(|p| p.pid)
        .collect()
}

/// The processes `torch.multiprocessing.spawn` (or any `multiprocessing` spawn) started directly
/// below `root`: their command lines carry `--multiprocessing-fork`.
pub fn spawn_children(table: &[memory::ProcStat], root: u32) -> Vec<u32> {
    table
        .iter()
        .filter(|p| p.ppid == root && !p.zombie() && is_spawn_child(memory::cmdline(p.pid)))
        .map(|p| p.pid)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A made-up machine: each process with its parent, rank variable, run id, command line,
    /// start time and rendezvous socket.
    #[derive(Default)]
    struct Fake(Vec<P>, std::cell::RefCell<std::collections::BTreeSet<u32>>);

    #[derive(Clone, Default)]
    struct P {
        pid: u32,
        ppid: u32,
        rank: Option<(u32, IdentifiedBy)>,
        /// `WORLD_SIZE` of its environment.
        world: Option<u32>,
        ours: bool,
        cmd: &'static str,
        start: u64,
        listens: bool,
        connects: bool,
        zombie: bool,
    }

    impl Fake {
        fn with(mut self, p: P) -> Fake {
            self.0.push(P { start: if p.start == 0 { u64::from(p.pid) } else { p.start }, ..p });
            self
        }
        fn get(&self, pid: u32) -> Option<&P> {
            self.0.iter().find(|p| p.pid == pid)
        }
    }

    impl ProcessView for Fake {
        fn table(&self) -> Vec<memory::ProcStat> {
            self.0
                .iter()
                .map(|p| memory::ProcStat {
                    pid: p.pid,
                    command: p.cmd.split(' ').next().unwrap_or_default().to_string(),
                    state: if p.zombie { 'Z' } else { 'S' },
                    ppid: p.ppid,
                    pgid: p.pid,
                    start_ticks: p.start,
                    exit_code: None,
                    exiting: false,
                    cpu_ticks: 0,
                })
                .collect()
        }
        fn env_rank(&self, pid: u32) -> Option<(u32, IdentifiedBy)> {
            self.get(pid)?.rank
        }
        fn ours(&self, pid: u32) -> bool {
            self.1.borrow_mut().insert(pid);
            self.get(pid).is_some_and(|p| p.ours)
        }
        fn cmdline(&self, pid: u32) -> Option<String> {
            self.get(pid).map(|p| p.cmd.to_string())
        }
        fn start_ticks(&self, pid: u32) -> u64 {
            self.get(pid).map_or(u64::MAX, |p| p.start)
        }
        fn env_ports(&self, _: u32) -> Vec<u16> {
            Vec::new()
        }
        fn env_world(&self, pid: u32) -> Option<u32> {
            self.get(pid)?.world
        }
        fn at_rendezvous(
            &self,
            _: u32,
            candidates: &[u32],
            _: &BTreeMap<u32, u32>,
            _: &[u16],
        ) -> (Vec<u32>, Vec<u32>) {
            let with = |f: fn(&P) -> bool| {
                candidates.iter().copied().filter(|c| self.get(*c).is_some_and(f)).collect()
            };
            (with(|p| p.listens), with(|p| p.connects))
        }
    }

    fn found(view: &Fake, world: u32, known: &Known) -> Vec<(u32, u32, IdentifiedBy)> {
        find_ranks(view, 10, world, known).into_iter().map(|f| (f.rank, f.pid, f.by)).collect()
    }

    const RANK: IdentifiedBy = IdentifiedBy::Rank;
    const LOCAL: IdentifiedBy = IdentifiedBy::LocalRank;

    /// torchrun (pid 10) → its agent's children carry `RANK`; each rank's DataLoader worker
    /// inherits the same variables and is no rank.
    #[test]
    fn torchruns_ranks_are_the_topmost_processes_with_a_rank_variable() {
        let ours = true;
        let view = Fake::default()
            .with(P { pid: 10, ppid: 1, ours, cmd: "torchrun", ..P::default() })
            .with(P { pid: 12, ppid: 10, rank: Some((1, RANK)), ours, cmd: "python t.py", ..P::default() })
            .with(P { pid: 11, ppid: 10, rank: Some((0, RANK)), ours, cmd: "python t.py", ..P::default() })
            .with(P { pid: 13, ppid: 11, rank: Some((0, RANK)), ours, cmd: "python t.py", ..P::default() })
            .with(P { pid: 14, ppid: 10, rank: Some((5, RANK)), ours, cmd: "python t.py", ..P::default() });
        assert_eq!(
            found(&view, 2, &Known::default()),
            [(0, 11, RANK), (1, 12, RANK)],
            "rank 5 is beyond the world"
        );
    }

    /// Lightning runs rank 0 in the launcher process and starts the others with `LOCAL_RANK`.
    #[test]
    fn lightnings_launcher_is_rank_0_when_the_others_have_only_local_rank() {
        let view = Fake::default()
            .with(P { pid: 10, ppid: 1, ours: true, cmd: "python train.py", ..P::default() })
            .with(P {
                pid: 11,
                ppid: 10,
                rank: Some((1, LOCAL)),
                ours: true,
                cmd: "python train.py",
                ..P::default()
            });
        assert_eq!(
            found(&view, 2, &Known::default()),
            [(0, 10, IdentifiedBy::LauncherProcess), (1, 11, LOCAL)]
        );
    }

    /// A run watched as one rank until its program forms a group (`ups-doctor run -- python
    /// train.py` with Lightning's own launcher): rank 1, started with `WORLD_SIZE=2`, is found
    /// before any group is formed (it may exit before one is), where the world may grow that far.
    #[test]
    fn a_rank_beyond_the_world_watched_is_found_where_its_environment_declares_a_world_the_run_may_grow_to() {
        let view = Fake::default()
            .with(P { pid: 10, ppid: 1, ours: true, cmd: "python train.py", ..P::default() })
            .with(P {
                pid: 11,
                ppid: 10,
                rank: Some((1, LOCAL)),
                world: Some(2),
                ours: true,
                cmd: "python train.py",
                ..P::default()
            });
        let growing = Known { grow_to: Some(64), ..Known::default() };
        assert_eq!(found(&view, 1, &growing), [(0, 10, IdentifiedBy::LauncherProcess), (1, 11, LOCAL)]);
        // A world that may not grow, or not that far: rank 1 is no rank of it.
        assert_eq!(found(&view, 1, &Known::default()), []);
        assert_eq!(found(&view, 1, &Known { grow_to: Some(1), ..Known::default() }), []);
    }

    /// `mp.spawn`'s ranks carry no rank variable: numbered in the order they started, the
    /// resource tracker left out, ranks already found kept.
    #[test]
    fn spawn_children_are_numbered_in_the_order_they_started() {
        let spawn = "python -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5) --multiprocessing-fork";
        let view = Fake::default()
            .with(P { pid: 10, ppid: 1, ours: true, cmd: "python train.py", ..P::default() })
            .with(P {
                pid: 11,
                ppid: 10,
                ours: true,
                cmd: "python -c from multiprocessing.resource_tracker import main",
                start: 1,
                ..P::default()
            })
            .with(P { pid: 13, ppid: 10, ours: true, cmd: spawn, start: 20, ..P::default() })
            .with(P { pid: 12, ppid: 10, ours: true, cmd: spawn, start: 30, ..P::default() });
        let order = |f: &[(u32, u32, IdentifiedBy)]| f.iter().map(|(r, p, _)| (*r, *p)).collect::<Vec<_>>();
        assert_eq!(order(&found(&view, 2, &Known::default())), [(0, 13), (1, 12)]);
        let known = Known { found: BTreeMap::from([(0, 13)]), ..Known::default() };
        assert_eq!(order(&found(&view, 2, &known)), [(1, 12)], "rank 0 is kept, the next one is rank 1");
    }

    /// srun's tasks are slurmstepd's children, not srun's: found anywhere by this run's id; a
    /// task's own child with the same variables (its worker) is no rank; another run's task is
    /// not ours. The machine's processes that started before srun are not asked (their
    /// environment is not read), whatever their pid.
    #[test]
    fn tasks_elsewhere_on_the_machine_are_found_by_the_runs_id() {
        let proc_id = IdentifiedBy::SlurmProcid;
        let mut view = Fake::default()
            .with(P { pid: 10, ppid: 1, ours: true, cmd: "srun", start: 100, ..P::default() })
            .with(P { pid: 2, ppid: 1, cmd: "sshd", ..P::default() })
            .with(P { pid: 900, ppid: 1, cmd: "jupyter", start: 40, ..P::default() })
            .with(P { pid: 50, ppid: 1, cmd: "slurmstepd", ..P::default() })
            .with(P {
                pid: 51,
                ppid: 50,
                rank: Some((0, proc_id)),
                ours: true,
                cmd: "python t.py",
                ..P::default()
            })
            .with(P {
                pid: 52,
                ppid: 50,
                rank: Some((1, proc_id)),
                ours: true,
                cmd: "python t.py",
                ..P::default()
            })
            .with(P {
                pid: 53,
                ppid: 51,
                rank: Some((0, proc_id)),
                ours: true,
                cmd: "python t.py",
                ..P::default()
            })
            .with(P {
                pid: 60,
                ppid: 50,
                rank: Some((1, proc_id)),
                ours: false,
                cmd: "python t.py",
                ..P::default()
            });
        for p in view.0.iter_mut().filter(|p| (50..=60).contains(&p.pid)) {
            p.start += 100;
        }
        assert_eq!(found(&view, 2, &Known::default()), [(0, 51, proc_id), (1, 52, proc_id)]);
        let asked = view.1.borrow();
        assert!(asked.contains(&51) && asked.contains(&60), "{asked:?}");
        assert!(!asked.contains(&2) && !asked.contains(&900), "older than srun: {asked:?}");
    }

    /// The helper's markers: a live process of this run that said its rank, parents first; a
    /// forked worker (its parent's command line) that says the same rank is no rank, nor is a
    /// process of another run or one that is gone.
    #[test]
    fn a_rank_the_markers_claim_is_taken_but_not_a_forked_worker_nor_another_runs_process() {
        let view = Fake::default()
            .with(P { pid: 10, ppid: 1, ours: true, cmd: "launcher", ..P::default() })
            .with(P { pid: 11, ppid: 10, ours: true, cmd: "python a.py", ..P::default() })
            .with(P { pid: 12, ppid: 11, ours: true, cmd: "python a.py", ..P::default() })
            .with(P { pid: 13, ppid: 10, ours: false, cmd: "python b.py", ..P::default() })
            .with(P { pid: 14, ppid: 10, ours: true, cmd: "python c.py", zombie: true, ..P::default() });
        let known =
            Known { claims: BTreeMap::from([(11, 1), (12, 1), (13, 0), (14, 0)]), ..Known::default() };
        assert_eq!(found(&view, 2, &known), [(1, 11, IdentifiedBy::Markers)]);
    }

    /// PyTorch-Ignite's `Parallel` spawns its ranks with no rank variable and sets `RANK` in each
    /// once it runs: the DataLoader workers a rank starts after that carry `RANK` from their start
    /// (spawned, or named `pt_data_worker`), the rank itself does not. The rank is the process that
    /// said so through its markers, not its worker (named rank 0 before, and its exit, 0, was
    /// taken for the rank's while the rank had failed).
    #[test]
    fn a_rank_that_said_so_is_the_rank_not_its_worker_that_carries_the_variable() {
        let ours = true;
        let view = Fake::default()
            .with(P { pid: 10, ppid: 1, ours, cmd: "python ignite_trainer.py", ..P::default() })
            .with(P { pid: 11, ppid: 10, ours, cmd: SPAWNED, ..P::default() })
            .with(P { pid: 12, ppid: 10, ours, cmd: SPAWNED, ..P::default() })
            .with(P { pid: 13, ppid: 11, rank: Some((0, RANK)), ours, cmd: "pt_data_worker", ..P::default() })
            .with(P {
                pid: 14,
                ppid: 12,
                rank: Some((1, RANK)),
                ours,
                cmd: "pt_data_worker",
                ..P::default()
            });
        let known = Known { claims: BTreeMap::from([(11, 0), (12, 1)]), ..Known::default() };
        assert_eq!(found(&view, 2, &known), [(0, 11, IdentifiedBy::Markers), (1, 12, IdentifiedBy::Markers)]);
        // Before any rank said so, a worker is still no rank (before, the workers were taken for
        // the ranks, and kept): the spawned processes are, in the order they started, until they
        // say so.
        let spawned = IdentifiedBy::SpawnOrder;
        assert_eq!(found(&view, 2, &Known::default()), [(0, 11, spawned), (1, 12, spawned)]);
        // One rank said so, the other not yet: that one's worker is not taken for it.
        let known = Known { claims: BTreeMap::from([(11, 0)]), ..Known::default() };
        assert_eq!(found(&view, 2, &known), [(0, 11, IdentifiedBy::Markers)]);
        // A spawned worker (its command line `multiprocessing`'s too) is no rank either.
        let view =
            view.with(P { pid: 15, ppid: 12, rank: Some((1, RANK)), ours, cmd: SPAWNED, ..P::default() });
        assert_eq!(found(&view, 2, &known), [(0, 11, IdentifiedBy::Markers)]);
    }

    /// A process `multiprocessing` started (spawn or forkserver), as `/proc/PID/cmdline` shows it.
    const SPAWNED: &str = "python -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=9) --multiprocessing-fork";

    /// A home-made launcher's children without variables or markers: the one listening on the
    /// rendezvous port is rank 0, and the one other process connected to it the last rank left.
    #[test]
    fn the_rendezvous_port_names_rank_0_and_the_last_rank_left() {
        let view = Fake::default()
            .with(P { pid: 10, ppid: 1, ours: true, cmd: "python launch.py", ..P::default() })
            .with(P { pid: 11, ppid: 10, ours: true, cmd: "python w.py", connects: true, ..P::default() })
            .with(P { pid: 12, ppid: 10, ours: true, cmd: "python w.py", listens: true, ..P::default() });
        assert_eq!(
            found(&view, 2, &Known::default()),
            [(0, 12, IdentifiedBy::RendezvousListens), (1, 11, IdentifiedBy::RendezvousConnected)]
        );
        assert_eq!(
            found(&view, 3, &Known::default()),
            [(0, 12, IdentifiedBy::RendezvousListens)],
            "two left: no guess"
        );
    }

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
            first = node_first_rank(&memory::processes(), root, 2, 4);
            std::thread::yield_now();
        }
        let too_small = node_first_rank(&memory::processes(), root, 2, 3);
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
}
