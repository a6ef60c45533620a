//! The end of a run: stack-dump requests (look before killing), and the sweep for what outlived
//! the ranks (processes of the run, members of its cgroup, `/dev/shm` segments), each killed or
//! removed only once it is proven ours.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::harness::observe::memory::{new_segments, orphaned_segments};
use crate::harness::os::cgroup::ScenarioCgroup;
use crate::harness::os::cleanup;
use crate::harness::os::life;
use crate::harness::os::owner::{self, Identity};
use crate::probe::{memory, shm};
use crate::protocol::STACK_DUMP_SIGNAL;
use crate::schema::{LeftoverProcess, LeftoverSegment};

/// How long killed leftover processes get to disappear before they are reported as surviving.
const LEFTOVER_KILL_WAIT: Duration = Duration::from_secs(2);
/// How often a killed leftover is looked for while it disappears.
const LEFTOVER_POLL: Duration = Duration::from_millis(50);

/// Which rank each process of the run belongs to: by being below a launcher's rank, by process
/// group (a rank leads its own), or because its rank reported it as a worker that was checked to
/// be this run's. The run loop keeps it current for the sampler and the final sweep.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Membership {
    /// (rank, its pid): the process group a rank's own process leads.
    pub groups: Vec<(u32, u32)>,
    /// (rank, pid, still running) of a launcher's ranks as found.
    pub found: Vec<(u32, u32, bool)>,
    /// (rank, a verified worker of it).
    pub workers: Vec<(u32, Identity)>,
    /// A launcher's pid while a rank of it has no process found yet: what is below it is sampled
    /// unplaced, to be placed once the run knows whose it was (a rank that names itself only as
    /// it dies, or after).
    pub unfound_below: Option<u32>,
}

impl Membership {
    /// Every process below a launcher's running rank (the rank itself included), pid → rank, in
    /// `table` (the process table, read once by the caller). Another rank and what is below it are
    /// not this rank's (`mp.spawn`'s ranks share the launcher's process group, srun's tasks the
    /// first task's).
    pub fn below(&self, table: &[memory::ProcStat]) -> BTreeMap<u32, u32> {
        let mut below = BTreeMap::new();
        for &(rank, pid, _) in self.found.iter().filter(|f| f.2) {
            let others: Vec<u32> = self.found.iter().filter(|f| f.0 != rank).map(|f| f.1).collect();
            for member in crate::harness::discover::rank_members_in(table, pid, &others) {
                below.insert(member, rank);
            }
        }
        below
    }

    /// The launcher's tree while it has ranks not found yet (see [`Membership::unfound_below`]),
    /// in `table`; empty otherwise.
    pub fn launcher_tree(&self, table: &[memory::ProcStat]) -> std::collections::BTreeSet<u32> {
        self.unfound_below
            .map(|root| crate::harness::discover::rank_members_in(table, root, &[]).into_iter().collect())
            .unwrap_or_default()
    }

    /// The rank a process belongs to; `below` from [`Membership::below`].
    pub fn rank_of(&self, below: &BTreeMap<u32, u32>, p: &memory::ProcStat) -> Option<u32> {
        below
            .get(&p.pid)
            .copied()
            .or_else(|| self.groups.iter().find(|(_, pgid)| *pgid == p.pgid).map(|(rank, _)| *rank))
            .or_else(|| self.workers.iter().find(|(_, w)| w.pid == p.pid).map(|(rank, _)| *rank))
    }
}

/// Asks every process in `members` that is this run's and has a handler for the stack-dump
/// signal for a stack dump; returns how many were asked. Every process of a rank's group: a rank
/// often waits on a stuck worker. (One without the handler yet, a rank still starting or a
/// `spawn` worker between exec and its set-up, would be killed by the signal instead.)
pub fn request_stacks(members: &[u32], run: &owner::Run) -> u32 {
    members
        .iter()
        .filter(|&&pid| catches(pid, STACK_DUMP_SIGNAL))
        .filter_map(|&pid| owner::identify(pid))
        .filter(|&who| run.signal(who, STACK_DUMP_SIGNAL).is_ok())
        .count() as u32
}

/// Whether `signal` cannot kill `pid`: it has a handler for it or blocks it (the trainer blocks
/// the stack-dump signal in every thread and takes it with `sigwait`), from `SigCgt` and `SigBlk`
/// of `/proc/PID/status`.
fn catches(pid: u32, signal: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
        let mask = |field: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
                .unwrap_or(0)
        };
        (mask("SigCgt:") | mask("SigBlk:")) & (1 << (signal - 1)) != 0
    })
}

/// Processes of the run still alive once every rank has ended (a worker that outlived its
/// rank, a child that left the process group but kept the run id): killed, and reported. Only
/// processes that pass [`owner::Run::check`] are candidates; what markers said plays no part.
pub fn kill_leftover_processes(
    members: &Membership,
    worker_ids: &[(u32, u32)],
    run: &owner::Run,
) -> Vec<LeftoverProcess> {
    let me = std::process::id();
    let table = memory::processes();
    let below = members.below(&table);
    let mut found: Vec<(LeftoverProcess, Identity)> = table
        .into_iter()
        .filter(|p| !p.zombie() && p.pid != me)
        .filter_map(|p| {
            let who = owner::identify(p.pid)?;
            run.check(who).ok()?;
            let rank = members.rank_of(&below, &p);
            let verified = members.workers.iter().any(|(_, w)| *w == who);
            let worker = worker_ids.iter().find(|(pid, _)| *pid == p.pid && verified).map(|(_, id)| *id);
            let leftover = LeftoverProcess {
                pid: p.pid,
                command: p.command,
                rank,
                worker,
                killed: false,
                earlier_run: false,
            };
            Some((leftover, who))
        })
        .collect();
    // Adopted by ups-doctor (its parent is gone: see `sys::become_child_subreaper`), and no
    // process ups-doctor started itself (those lead a group of the run, and are waited for by
    // their own handles): reaped here once killed, by pid.
    let me = std::process::id();
    let adopted: Vec<u32> = found
        .iter()
        .map(|(p, _)| p.pid)
        .filter(|&pid| !run.groups.contains(&pid) && memory::read_stat(pid).is_some_and(|s| s.ppid == me))
        .collect();
    // Cleanup helpers last (see `cleanup`): a resource tracker that outlived its rank unlinks
    // what the killed processes registered.
    let pids: Vec<u32> = found.iter().map(|(p, _)| p.pid).collect();
    let who_is = |pid: u32| found.iter().find(|(p, _)| p.pid == pid).map(|(_, who)| *who);
    cleanup::kill_helpers_last(
        &pids,
        |pid| who_is(pid).is_some_and(|who| run.signal(who, libc::SIGKILL).is_ok()),
        |pid| who_is(pid).is_some_and(|who| owner::identify(pid) == Some(who)),
    );
    let deadline = Instant::now() + LEFTOVER_KILL_WAIT;
    loop {
        for (p, who) in &mut found {
            p.killed = owner::identify(who.pid) != Some(*who);
            if p.killed && adopted.contains(&p.pid) {
                crate::harness::os::sys::reap_if_ended(p.pid);
            }
        }
        if found.iter().all(|(p, _)| p.killed) || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(LEFTOVER_POLL);
    }
    found.into_iter().map(|(p, _)| p).collect()
}

/// Teardown through the scenario's cgroup: whatever is still in it once every rank has ended
/// and the process-group and run-id search has run (a process that left its session and
/// process group and dropped the run id from its environment) is killed and reported. Only
/// members of the scenario's own cgroup that started after it was made and descend from
/// ups-doctor are signalled (see [`ScenarioCgroup::is_ours`]); any other was moved in from
/// outside and is left alone.
pub fn kill_cgroup_leftovers(cgroup: Option<&ScenarioCgroup>, members: &Membership) -> Vec<LeftoverProcess> {
    let Some(cgroup) = cgroup else {
        return Vec::new();
    };
    let table = memory::processes();
    let below = members.below(&table);
    let (ours, foreign): (Vec<&memory::ProcStat>, Vec<&memory::ProcStat>) = cgroup
        .members()
        .into_iter()
        .filter_map(|pid| table.iter().find(|p| p.pid == pid && !p.zombie()))
        .partition(|p| cgroup.is_ours(p.pid, p.start_ticks));
    for p in foreign {
        let why = if cgroup.spawned_since_created(p.start_ticks) {
            "it does not descend from ups-doctor, which every process the run started does"
        } else {
            "it started before the cgroup was made"
        };
        eprintln!(
            "ups-doctor: warning: left alone process {} (`{}`) in the scenario's cgroup: {why}, so the run did \
             not start it (something moved it in)",
            p.pid, p.command
        );
    }
    let left: Vec<LeftoverProcess> = ours
        .into_iter()
        .map(|p| LeftoverProcess {
            pid: p.pid,
            command: p.command.clone(),
            rank: members.rank_of(&below, p),
            worker: None,
            killed: false,
            earlier_run: false,
        })
        .collect();
    if left.is_empty() {
        return left;
    }
    let signalled = cgroup.kill_all();
    let deadline = Instant::now() + LEFTOVER_KILL_WAIT;
    while Instant::now() < deadline && left.iter().any(|p| cgroup.members().contains(&p.pid)) {
        std::thread::sleep(LEFTOVER_POLL);
    }
    let still = cgroup.members();
    left.into_iter()
        .map(|p| LeftoverProcess { killed: signalled.contains(&p.pid) && !still.contains(&p.pid), ..p })
        .collect()
}

/// Removes the machine's `/dev/shm` segments of ups-doctor runs whose harness died before it
/// could clean up (killed with SIGKILL, say), so that none outlives the next run. A run is gone
/// when nobody holds its lock file ([`shm::lock_path`]), which holds across PID namespaces; only a
/// run without one (an older ups-doctor) is judged by its pid. The lock files of gone runs go too.
pub fn sweep_orphaned_segments() -> Vec<LeftoverSegment> {
    let dir = std::path::Path::new("/dev/shm");
    let all = shm::segments(dir);
    let gone = |run: &str, pid: u32| match life::owner(&shm::lock_path(dir, run)) {
        life::Owner::Gone(held) => Some(Some(held)),
        life::Owner::Absent => (!std::path::Path::new(&format!("/proc/{pid}")).exists()).then_some(None),
        life::Owner::Alive | life::Owner::Unknown(_) => None,
    };
    let mut swept = Vec::new();
    // Each gone run's lock stays held (`_held`) until its segments are removed.
    for (_held, segs) in orphaned_segments(&all, gone) {
        swept.extend(segs.into_iter().map(|seg| {
            let error = shm::remove(dir, &seg.name).err().map(|e| e.to_string());
            LeftoverSegment {
                name: seg.name.clone(),
                size_bytes: seg.size,
                allocated_bytes: seg.allocated,
                ours: false,
                earlier_run: true,
                removed: error.is_none(),
                error,
            }
        }));
    }
    for lock in shm::lock_files(dir) {
        if let life::Owner::Gone(_held) = life::owner(&lock) {
            let _ = std::fs::remove_file(&lock);
        }
    }
    swept
}

/// Files created in `/dev/shm` during the run: this run's own are removed, others reported.
pub fn remove_leftover_segments(
    dir: &std::path::Path,
    before: &[shm::Segment],
    run_id: &str,
    run_pids: &[u32],
    private: bool,
) -> Vec<LeftoverSegment> {
    new_segments(before, &shm::segments(dir), run_id, run_pids)
        .into_iter()
        .map(|(seg, ours)| {
            let (removed, error) = if ours {
                match shm::remove(dir, &seg.name) {
                    Ok(()) => (true, None),
                    Err(e) => (false, Some(e.to_string())),
                }
            } else {
                // A private /dev/shm is discarded with the run, whoever wrote into it.
                (private, None)
            };
            LeftoverSegment {
                name: seg.name,
                size_bytes: seg.size,
                allocated_bytes: seg.allocated,
                ours,
                earlier_run: false,
                removed,
                error,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(pid: u32, pgid: u32) -> memory::ProcStat {
        memory::ProcStat {
            pid,
            command: "x".into(),
            state: 'S',
            ppid: 1,
            pgid,
            start_ticks: 7,
            exit_code: None,
            exiting: false,
            cpu_ticks: 0,
        }
    }

    #[test]
    fn a_process_belongs_to_the_rank_whose_group_it_is_in_or_that_claimed_it_as_a_worker() {
        let members = Membership {
            groups: vec![(0, 100), (1, 200)],
            found: Vec::new(),
            workers: vec![(1, Identity { pid: 333, start_ticks: 7 })],
            ..Default::default()
        };
        let below = BTreeMap::from([(555, 1)]);
        assert_eq!(members.rank_of(&below, &stat(100, 100)), Some(0));
        assert_eq!(members.rank_of(&below, &stat(101, 100)), Some(0), "a fork worker stays in the group");
        assert_eq!(members.rank_of(&below, &stat(333, 333)), Some(1), "a worker in a session of its own");
        assert_eq!(members.rank_of(&below, &stat(555, 100)), Some(1), "below a launcher's rank 1");
        assert_eq!(members.rank_of(&below, &stat(444, 444)), None);
    }
}
