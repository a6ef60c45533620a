//! Finding a running PyTorch job from one of its processes, read from procfs only: the launcher
//! (torchrun, `python -m torch.distributed.run`, an `mp.spawn` parent, …), every rank (by the rank
//! variables of its starting environment, else `multiprocessing`'s spawn order) and every process
//! below a rank (its DataLoader workers). Nothing here writes to or signals a process.

use std::collections::BTreeMap;
use std::ffi::OsStr;

use crate::harness::os::owner::{Identity, identify};
use crate::harness::os::tree::children_of;
use crate::harness::{FoundRank, Known, auto_style, discover_ranks, rank_members_in};
use crate::probe::memory;
use crate::schema::IdentifiedBy;

/// One rank of the job and the processes below it.
#[derive(Debug, Clone, PartialEq)]
pub struct Rank {
    pub rank: u32,
    pub pid: u32,
    pub by: IdentifiedBy,
    /// Processes below it (DataLoader workers, compile workers, …), not other ranks.
    pub children: Vec<u32>,
}

/// A job as found on this machine.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// The launcher process, when the ranks have one (absent: ranks started one by one).
    pub launcher: Option<u32>,
    /// Its command line (or the first rank's when there is no launcher).
    pub command: Vec<String>,
    pub ranks: Vec<Rank>,
    /// `WORLD_SIZE` of the ranks' environments (else the ranks a spawn parent started).
    pub world_size: Option<u32>,
    /// `LOCAL_WORLD_SIZE`: the ranks this node should have.
    pub local_world_size: Option<u32>,
    /// torchrun's `GROUP_RANK` and `GROUP_WORLD_SIZE`: this node's rank among the job's nodes,
    /// and how many there are.
    pub group: (Option<u32>, Option<u32>),
    /// `MASTER_ADDR:MASTER_PORT`.
    pub master: Option<String>,
    pub run_id: Option<String>,
    /// `SLURM_JOB_ID` and `SLURM_STEP_ID` of a Slurm step's tasks.
    pub slurm_step: Option<(String, Option<String>)>,
    /// Processes whose environment could not be read (another user's): named, not skipped.
    pub unreadable: Vec<u32>,
}

impl Job {
    /// Every pid of the job: launcher, ranks, their children.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.launcher.into_iter().collect();
        for r in &self.ranks {
            pids.push(r.pid);
            pids.extend(&r.children);
        }
        pids
    }

    /// The launcher and ranks, then every process of the job, as they are now (pid and start
    /// time): what `--then stop` may signal, and only while each is still that process.
    pub fn first_seen(&self) -> (Vec<Identity>, Vec<Identity>) {
        let now = |pids: &mut dyn Iterator<Item = u32>| pids.filter_map(identify).collect::<Vec<_>>();
        let heads = now(&mut self.launcher.into_iter().chain(self.ranks.iter().map(|r| r.pid)));
        (heads, now(&mut self.pids().into_iter()))
    }

    /// For one node's share of a job on several (torchrun's `GROUP_WORLD_SIZE` above 1, or
    /// `LOCAL_WORLD_SIZE` below `WORLD_SIZE`): how to read every node's at once, with `pid`.
    pub fn several_nodes_hint(&self, pid: u32) -> Option<String> {
        let (world, local) = (self.world_size?, self.local_world_size.unwrap_or(0));
        let nodes = match self.group.1 {
            Some(n) if n > 1 => n,
            None if local > 0 && local < world => world.div_ceil(local),
            _ => return None,
        };
        let node = self.group.0.map_or("R".to_string(), |g| g.to_string());
        if let Some((job, step)) = &self.slurm_step {
            let step = step.as_ref().map(|s| format!(".{s}")).unwrap_or_default();
            return Some(format!(
                "this machine holds {} of the job's {world} ranks, on node {node} of {nodes} of Slurm job {job}: for one \
                 verdict on every rank, run `ups-doctor attach --slurm {job}{step}` where `squeue` works (a probe on \
                 each node through `srun --overlap`)",
                self.ranks.len()
            ));
        }
        Some(format!(
            "this machine holds {} of the job's {world} ranks, on node {node} of {nodes}: for one verdict on every rank, \
             run `ups-doctor attach {pid} --nodes {nodes} --node-rank {node} --coordinator NODE0:29411` here and the same \
             on each node with its own pid and node rank (NODE0: the host where node rank 0 runs it)",
            self.ranks.len()
        ))
    }

    /// The ranks this machine should have: `LOCAL_WORLD_SIZE`, else `WORLD_SIZE`.
    pub fn expected_here(&self) -> Option<u32> {
        self.local_world_size.or(self.world_size)
    }

    /// Ranks of `0..WORLD_SIZE` not found here. On a node of several (`LOCAL_WORLD_SIZE` below
    /// `WORLD_SIZE`) only the node's own range counts, from its first rank (`RANK − LOCAL_RANK`).
    pub fn missing(&self) -> Vec<u32> {
        let Some(world) = self.world_size else { return Vec::new() };
        let found: Vec<u32> = self.ranks.iter().map(|r| r.rank).collect();
        let (first, count) = match self.local_world_size {
            Some(local) if local < world => {
                let first = self.ranks.first().map_or(0, |r| r.rank - r.rank % local.max(1));
                (first, local)
            }
            _ => (0, world),
        };
        (first..first + count).filter(|r| !found.contains(r)).collect()
    }
}

/// Why no job was found.
/// No job to attach to at `pid`, and why; the message says which pids to give instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "no PyTorch job at pid {pid}: {why}. Give the launcher's pid (torchrun, `python -m torch.distributed.run`, \
     the `mp.spawn` parent) or any rank's; `ups-doctor attach --all` lists the jobs on this machine"
)]
pub struct NoJob {
    pub pid: u32,
    pub why: NoJobWhy,
}

/// Why the pid given to `attach` leads to no job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoJobWhy {
    #[error("there is no such process")]
    NoProcess,
    #[error("it has already exited (a zombie)")]
    Zombie,
    /// The environment of the process at that pid (a rank's, once walked up from a worker).
    #[error(
        "its environment `/proc/{0}/environ` cannot be read (another user's process: run as that user or as root)"
    )]
    Unreadable(u32),
    #[error(
        "it is neither a launcher nor a rank (no RANK, LOCAL_RANK, SLURM_PROCID, … in its environment, and it starts \
         no `multiprocessing` children)"
    )]
    NeitherLauncherNorRank,
    #[error("no rank process was found below it")]
    NoRanks,
}

type Env = std::collections::HashMap<std::ffi::OsString, std::ffi::OsString>;

fn var(env: &Env, key: &str) -> Option<String> {
    env.get(OsStr::new(key)).map(|v| v.to_string_lossy().trim().to_string()).filter(|v| !v.is_empty())
}

/// The rank variable of a starting environment (as the harness believes them).
fn rank_of(env: &Env) -> Option<u32> {
    IdentifiedBy::VARIABLES.iter().find_map(|by| var(env, by.variable()?)?.parse().ok())
}

/// What every rank of one job shares in its starting environment: `WORLD_SIZE`, the rendezvous
/// address and torchelastic's run id (each absent where the launcher sets none).
fn job_key(env: &Env) -> [Option<String>; 4] {
    ["WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"].map(|k| var(env, k))
}

fn is_spawn_child(pid: u32) -> bool {
    memory::cmdline(pid)
        .is_some_and(|c| c.contains("--multiprocessing-fork") && !c.contains("resource_tracker"))
}

/// Whether `child` of `parent` was started by `multiprocessing`'s spawn: a forked child (a
/// DataLoader worker of a spawned rank) has its parent's command line, `--multiprocessing-fork`
/// included, and is no spawned rank.
fn spawned_by(parent: u32, child: u32) -> bool {
    is_spawn_child(child) && memory::cmdline(child) != memory::cmdline(parent)
}

fn argv(pid: u32) -> Vec<String> {
    procfs::process::Process::new(pid as i32).and_then(|p| p.cmdline()).unwrap_or_default()
}

/// Whether the command line of `pid` is a launcher's (`torchrun`, `python …/bin/torchrun`,
/// `python -m torch.distributed.run`, a script that starts its own ranks).
fn launches_by_command(pid: u32) -> bool {
    let args = argv(pid);
    // Its relative script is read from its own folder, as it opened it.
    let cwd = procfs::process::Process::new(pid as i32).and_then(|p| p.cwd()).ok();
    let cwd = cwd.as_deref();
    auto_style(&args, cwd).0
        || args.iter().skip(1).take(2).any(|a| auto_style(std::slice::from_ref(a), cwd).0)
}

/// Whether `pid` is a process that starts ranks: a known launcher, `python -m
/// torch.distributed.run`, or a parent of `multiprocessing` spawn children.
/// torchrun's own argv is often `python …/bin/torchrun …` (its script run by the interpreter),
/// so a process whose child has a rank variable that it lacks itself is a launcher too.
fn is_launcher(pid: u32, children: &BTreeMap<u32, Vec<u32>>) -> bool {
    let mine = memory::environ(pid).and_then(|e| rank_of(&e));
    if crate::harness::plan::command::is_interactive_shell(&argv(pid)) {
        return false;
    }
    launches_by_command(pid)
        || children.get(&pid).into_iter().flatten().any(|&c| {
            spawned_by(pid, c)
                || memory::environ(c).and_then(|e| rank_of(&e)).is_some_and(|r| Some(r) != mine)
        })
}

/// Finds the job `pid` belongs to.
///
/// Long: one walk from the given pid to the whole job — a DataLoader worker to its rank, a rank
/// to its launcher, the launcher's ranks and the processes below them, the job's variables from
/// the first process that has them — where each step narrows what the next one reads.
pub fn find(pid: u32) -> Result<Job, NoJob> {
    let not_found = |why| NoJob { pid, why };
    let table = memory::processes();
    let stat = |p: u32| table.iter().find(|s| s.pid == p);
    let Some(start) = stat(pid) else { return Err(not_found(NoJobWhy::NoProcess)) };
    if start.zombie() {
        return Err(not_found(NoJobWhy::Zombie));
    }
    let children = children_of(&table);
    let ppid = |p: u32| stat(p).map_or(0, |s| s.ppid);
    // A DataLoader worker (forked: the same environment and command line as its rank) → its rank.
    let mut me = pid;
    loop {
        let up = ppid(me);
        if up <= 1 {
            break;
        }
        let same_rank = match (memory::environ(me), memory::environ(up)) {
            (Some(a), Some(b)) => rank_of(&a).is_some() && rank_of(&a) == rank_of(&b),
            _ => false,
        };
        let forked = memory::cmdline(me).is_some_and(|c| Some(c) == memory::cmdline(up));
        if same_rank || (forked && !is_launcher(up, &children)) {
            me = up;
        } else {
            break;
        }
    }
    let env = memory::environ(me);
    if env.is_none() {
        return Err(not_found(NoJobWhy::Unreadable(me)));
    }
    let env = env.unwrap_or_default();
    let up = ppid(me);
    // A rank variable makes a rank (whose DataLoader workers may be spawn children: no
    // launcher for that); a launcher's own rank variable would be inherited by its ranks.
    let root = if rank_of(&env).is_some() || is_spawn_child(me) {
        (up > 1 && is_launcher(up, &children)).then_some(up)
    } else if is_launcher(me, &children) {
        Some(me)
    } else {
        return Err(not_found(NoJobWhy::NeitherLauncherNorRank));
    };
    // Started from a rank: a parent that starts ranks of several jobs (a test runner, a workflow
    // script, a notebook kernel) is the launcher of none of them. Every rank of one job shares its
    // rendezvous variables; a rank below it with other ones is another job's.
    let from_rank = rank_of(&env).is_some().then(|| job_key(&env));
    let root = root.filter(|&r| {
        let other_job = |c: u32| {
            memory::environ(c).is_some_and(|e| rank_of(&e).is_some() && Some(job_key(&e)) != from_rank)
        };
        from_rank.is_none()
            || launches_by_command(r)
            || !children.get(&r).into_iter().flatten().any(|&c| c != me && other_job(c))
    });
    let mut unreadable = Vec::new();
    let below: Vec<u32> = match root {
        Some(root) => rank_members_in(&table, root, &[]),
        None => vec![me],
    };
    // The job's variables, from the first process below the launcher that has them.
    let envs: Vec<(u32, Env)> = below
        .iter()
        .filter_map(|&p| match memory::environ(p) {
            Some(e) => Some((p, e)),
            None => {
                unreadable.push(p);
                None
            }
        })
        .collect();
    // Only the starting rank's job: its own variables first, then its fellow ranks'.
    let envs: Vec<(u32, Env)> = std::iter::once((me, env.clone()))
        .chain(
            envs.into_iter().filter(|(p, e)| *p != me && from_rank.as_ref().is_none_or(|k| &job_key(e) == k)),
        )
        .collect();
    let first_with = |key: &str| envs.iter().find_map(|(_, e)| var(e, key));
    // Slurm's tasks carry their world as `SLURM_NTASKS` (a program sets `WORLD_SIZE` from it in
    // its own memory, which `/proc/PID/environ` does not show).
    let world_size =
        first_with("WORLD_SIZE").or_else(|| first_with("SLURM_NTASKS")).and_then(|w| w.parse().ok());
    // And their node's share as `SLURM_STEP_TASKS_PER_NODE` (`2(x3),1`: per node, in node order).
    let local_world_size = first_with("LOCAL_WORLD_SIZE").and_then(|w| w.parse().ok()).or_else(|| {
        let node = first_with("SLURM_NODEID")?.parse().ok()?;
        slurm_tasks_on(&first_with("SLURM_STEP_TASKS_PER_NODE")?, node)
    });
    let master = match (first_with("MASTER_ADDR"), first_with("MASTER_PORT")) {
        (Some(a), Some(p)) => Some(format!("{a}:{p}")),
        (None, Some(p)) => Some(format!(":{p}")),
        _ => None,
    };
    let port = first_with("MASTER_PORT").and_then(|p| p.parse().ok()).unwrap_or(0);
    let run_id = first_with("TORCHELASTIC_RUN_ID");
    let found: Vec<FoundRank> = match root {
        Some(root) => {
            let spawned = children.get(&root).into_iter().flatten().filter(|&&c| spawned_by(root, c)).count();
            let world = world_size.unwrap_or(spawned.max(1) as u32);
            // No run id of ours: these processes were never ups-doctor's.
            let ranks = discover_ranks(
                &table,
                root,
                "\u{1}not-ups-doctor",
                world,
                &Known { port, ..Known::default() },
            );
            // A rank of another job below the same parent is not this job's.
            ranks
                .into_iter()
                .filter(|f| {
                    f.pid == me
                        || from_rank
                            .as_ref()
                            .is_none_or(|k| memory::environ(f.pid).is_none_or(|e| &job_key(&e) == k))
                })
                .collect()
        }
        None => vec![FoundRank {
            rank: rank_of(&env).unwrap_or(0),
            pid: me,
            by: IdentifiedBy::VARIABLES
                .into_iter()
                .find(|by| by.variable().is_some_and(|v| var(&env, v).is_some()))
                .unwrap_or(IdentifiedBy::Rank),
        }],
    };
    let mut found = found;
    if root.is_none() {
        // Ranks started one by one (a shell, a per-rank launcher): the others share the
        // rendezvous address and have a rank variable; the topmost per rank.
        let key = (var(&env, "MASTER_ADDR"), var(&env, "MASTER_PORT"));
        for p in table.iter().filter(|p| !p.zombie() && p.pid != me) {
            let Some(e) = memory::environ(p.pid) else { continue };
            let Some(rank) = rank_of(&e) else { continue };
            if key.1.is_none() || (var(&e, "MASTER_ADDR"), var(&e, "MASTER_PORT")) != key {
                continue;
            }
            let parent_same = memory::environ(p.ppid).is_some_and(|pe| rank_of(&pe) == Some(rank));
            if !parent_same && !found.iter().any(|f| f.rank == rank) {
                found.push(FoundRank { rank, pid: p.pid, by: IdentifiedBy::Rank });
            }
        }
        found.sort_by_key(|f| f.rank);
    }
    if found.is_empty() {
        return Err(not_found(NoJobWhy::NoRanks));
    }
    let rank_pids: Vec<u32> = found.iter().map(|f| f.pid).collect();
    let ranks = found
        .iter()
        .map(|f| {
            let others: Vec<u32> = rank_pids.iter().copied().filter(|&p| p != f.pid).collect();
            let members = rank_members_in(&table, f.pid, &others);
            Rank {
                rank: f.rank,
                pid: f.pid,
                by: f.by,
                children: members.into_iter().filter(|&p| p != f.pid).collect(),
            }
        })
        .collect();
    let command = argv(root.unwrap_or(me));
    let world_size = world_size.or_else(|| root.map(|_| found.len() as u32));
    let group = (
        first_with("GROUP_RANK").or_else(|| first_with("SLURM_NODEID")).and_then(|g| g.parse().ok()),
        first_with("GROUP_WORLD_SIZE")
            .or_else(|| first_with("SLURM_STEP_NUM_NODES"))
            .or_else(|| first_with("SLURM_NNODES"))
            .and_then(|g| g.parse().ok()),
    );
    Ok(Job {
        launcher: root,
        command,
        ranks,
        world_size,
        local_world_size,
        group,
        master,
        run_id,
        slurm_step: first_with("SLURM_JOB_ID").map(|j| (j, first_with("SLURM_STEP_ID"))),
        unreadable,
    })
}

/// Every PyTorch job on this machine, each once: the pid to attach to (its launcher, else its
/// lowest rank). A rank is a process with a rank variable whose parent has no same one; an
/// `mp.spawn` job is a parent of spawn children that have libtorch loaded.
pub fn all() -> (Vec<Job>, Vec<u32>) {
    let table = memory::processes();
    let children = children_of(&table);
    let mut seeds: Vec<u32> = Vec::new();
    let mut unreadable = Vec::new();
    for p in table.iter().filter(|p| !p.zombie() && p.pid != std::process::id()) {
        match memory::environ(p.pid) {
            Some(env) => {
                if let Some(rank) = rank_of(&env) {
                    let parent_same = memory::environ(p.ppid).is_some_and(|pe| rank_of(&pe) == Some(rank));
                    if !parent_same && var(&env, "WORLD_SIZE").is_some() {
                        seeds.push(p.pid);
                    }
                } else if children
                    .get(&p.pid)
                    .into_iter()
                    .flatten()
                    .any(|&c| spawned_by(p.pid, c) && has_torch(c))
                {
                    seeds.push(p.pid);
                }
            }
            None if p.ppid > 2 => unreadable.push(p.pid),
            None => {}
        }
    }
    let mut jobs: Vec<Job> = Vec::new();
    for seed in seeds {
        if jobs.iter().any(|j| j.pids().contains(&seed)) {
            continue;
        }
        if let Ok(job) = find(seed) {
            jobs.push(job);
        }
    }
    (jobs, unreadable)
}

/// How many tasks of a step run on node `node`, from Slurm's per-node counts (`2(x3),1`: two on
/// each of the first three nodes, one on the fourth).
fn slurm_tasks_on(counts: &str, node: u32) -> Option<u32> {
    let mut seen = 0u32;
    for entry in counts.split(',') {
        let (tasks, times) = match entry.trim().split_once("(x") {
            Some((t, n)) => (t.parse::<u32>().ok()?, n.strip_suffix(')')?.parse::<u32>().ok()?),
            None => (entry.trim().parse::<u32>().ok()?, 1),
        };
        if node < seen + times {
            return Some(tasks);
        }
        seen += times;
    }
    None
}

/// Why no task of a Slurm job's step was found on this machine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoSlurmTask {
    #[error(
        "no task of {} runs on this host (a process with SLURM_JOB_ID={job}, {} and a rank variable)",
        step.as_ref().map_or("this job".to_string(), |s| format!("step {s}")),
        step.as_ref().map_or("a SLURM_STEP_ID".to_string(), |s| format!("SLURM_STEP_ID={s}"))
    )]
    None { job: String, step: Option<String> },
    #[error("steps {} of this job run here: give JOBID.STEP", .0.join(", "))]
    SeveralSteps(Vec<String>),
    #[error("its tasks here form a cycle of parents")]
    Cycle,
}

/// The task of a Slurm job's step on this machine to attach to: the lowest pid among the topmost
/// processes that carry `SLURM_JOB_ID=job`, the step's `SLURM_STEP_ID` (when no step is given,
/// any step but `not_step`, the caller's own) and a rank variable.
pub fn slurm_task(job: &str, step: Option<&str>, not_step: Option<&str>) -> Result<u32, NoSlurmTask> {
    let table = memory::processes();
    let mut tasks: Vec<(u32, u32, String)> = Vec::new();
    for p in table.iter().filter(|p| !p.zombie() && p.pid != std::process::id()) {
        let Some(env) = memory::environ(p.pid) else { continue };
        let Some(its) = var(&env, "SLURM_STEP_ID") else { continue };
        let theirs = var(&env, "SLURM_JOB_ID").as_deref() == Some(job)
            && step.is_none_or(|s| s == its)
            && not_step != Some(its.as_str())
            && rank_of(&env).is_some();
        if theirs {
            tasks.push((p.pid, p.ppid, its));
        }
    }
    let mut steps: Vec<String> = tasks.iter().map(|t| t.2.clone()).collect();
    steps.sort_unstable();
    steps.dedup();
    match steps.len() {
        0 => Err(NoSlurmTask::None { job: job.to_string(), step: step.map(str::to_string) }),
        1 => {
            let pids: Vec<u32> = tasks.iter().map(|t| t.0).collect();
            tasks.iter().filter(|t| !pids.contains(&t.1)).map(|t| t.0).min().ok_or(NoSlurmTask::Cycle)
        }
        _ => Err(NoSlurmTask::SeveralSteps(steps)),
    }
}

/// Whether `pid` has libtorch mapped (a PyTorch process), from `/proc/PID/maps`.
fn has_torch(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| m.contains("libtorch"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurms_tasks_per_node_give_each_nodes_share() {
        assert_eq!(slurm_tasks_on("1(x2)", 1), Some(1));
        assert_eq!(slurm_tasks_on("2(x3),1", 2), Some(2));
        assert_eq!(slurm_tasks_on("2(x3),1", 3), Some(1));
        assert_eq!(slurm_tasks_on("4", 0), Some(4));
        assert_eq!(slurm_tasks_on("2(x3),1", 4), None);
        assert_eq!(slurm_tasks_on("two", 0), None);
    }

    #[test]
    fn a_pid_with_no_job_says_why_and_which_pid_to_give() {
        assert_eq!(
            NoJob { pid: 7, why: NoJobWhy::Unreadable(8) }.to_string(),
            "no PyTorch job at pid 7: its environment `/proc/8/environ` cannot be read (another user's process: run \
             as that user or as root). Give the launcher's pid (torchrun, `python -m torch.distributed.run`, the \
             `mp.spawn` parent) or any rank's; `ups-doctor attach --all` lists the jobs on this machine"
        );
        assert!(
            NoJob { pid: 7, why: NoJobWhy::NeitherLauncherNorRank }.to_string().starts_with(
                "no PyTorch job at pid 7: it is neither a launcher nor a rank (no RANK, LOCAL_RANK, SLURM_PROCID, … in \
                 its environment, and it starts no `multiprocessing` children). Give"
            )
        );
        // A pid that no process has (pid_max is at most 2^22).
        assert_eq!(find(u32::MAX).unwrap_err().why, NoJobWhy::NoProcess);
    }
}
