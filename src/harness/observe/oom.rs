//! OOM evidence for one scenario: which of its processes the kernel's OOM killer ended. Each
//! kill is established by the kernel log (`/dev/kmsg`, whose `oom-kill:` line names the memory
//! cgroup, so a kill is counted only when it happened in the scenario's own group) or, where the
//! log cannot be read, by the group's `oom_kill` counter when exactly one process of the
//! scenario died of a SIGKILL nobody here sent. A SIGKILL from anywhere else (`kill -9`, a
//! rank killing its worker, the teardown) raises no counter and writes no such line, so it is
//! never recorded as an OOM kill.

use std::collections::BTreeMap;

use crate::protocol::Signal;

use super::memory::ProcSample;
use crate::harness::classify::RankEnd;
use crate::harness::os::cgroup::ScenarioCgroup;
use crate::harness::os::kmsg::{KernelLog, OomRecord, oom_kills_in, xids_in};
use crate::harness::os::process::Exit;
use crate::schema::{CgroupReport, GpuXid, OomKill, OomSource};

/// Watches one scenario for OOM kills, from its start to its end.
pub struct OomWatch {
    kmsg: Option<KernelLog>,
    /// The kernel log's clock (µs since boot, `CLOCK_MONOTONIC`) when the scenario started.
    start_us: u64,
    /// Every process seen in a memory sample, with its rank: a worker's pid may be known only
    /// from there once it is dead.
    seen: BTreeMap<u32, u32>,
}

impl OomWatch {
    /// Starts watching (the kernel log is opened at its end now) when there is a cgroup.
    pub fn start(cgroup: Option<&ScenarioCgroup>) -> OomWatch {
        OomWatch {
            kmsg: cgroup.and_then(|_| KernelLog::open_at_end().ok()),
            start_us: monotonic_us(),
            seen: BTreeMap::new(),
        }
    }

    /// Remembers which rank each sampled process belonged to.
    pub fn saw(&mut self, procs: &[ProcSample]) {
        for p in procs {
            if let Some(rank) = p.rank {
                self.seen.insert(p.pid, rank);
            }
        }
    }

    /// The cgroup's figures and the OOM kills, once every process of the scenario has ended.
    pub fn finish(
        mut self,
        cgroup: Option<&ScenarioCgroup>,
        ends: &[RankEnd],
    ) -> (Option<CgroupReport>, Vec<OomKill>, Vec<GpuXid>) {
        let Some(cgroup) = cgroup else {
            return (None, Vec::new(), Vec::new());
        };
        let report = cgroup.report();
        let log = self.kmsg.as_mut().map(KernelLog::read_new);
        let records = log.as_deref().map(oom_kills_in);
        let who = |pid: u32| attribute(pid, ends, &self.seen);
        // The driver's Xids of the run's time: any GPU's, named with the rank whose process it
        // names (a GPU fault of another job on a shared machine is said as the machine's).
        let xids = log
            .as_deref()
            .map(xids_in)
            .unwrap_or_default()
            .into_iter()
            .map(|x| GpuXid {
                code: x.code,
                rank: x.pid.and_then(|p| who(p).0),
                pid: x.pid,
                pci: x.pci,
                at_s: x.ts_us.saturating_sub(self.start_us) as f64 / 1e6,
                line: x.text,
            })
            .collect();
        let kills = match records {
            Some(records) => from_kernel_log(&records, cgroup.kernel_path(), ends, &self.seen)
                .into_iter()
                .map(|r| {
                    let (rank, worker) = who(r.pid);
                    OomKill {
                        pid: r.pid,
                        rank,
                        worker,
                        at_s: Some(r.ts_us.saturating_sub(self.start_us) as f64 / 1e6),
                        source: OomSource::Kmsg,
                        process_name: Some(r.command).filter(|c| !c.is_empty()),
                        anon_rss_bytes: r.anon_rss_bytes,
                    }
                })
                .collect(),
            None => from_counter(report.oom_kills, ends)
                .into_iter()
                .map(|pid| {
                    let (rank, worker) = who(pid);
                    OomKill {
                        pid,
                        rank,
                        worker,
                        at_s: None,
                        source: OomSource::Cgroup,
                        process_name: None,
                        anon_rss_bytes: None,
                    }
                })
                .collect(),
        };
        (Some(report), kills, xids)
    }
}

/// The kernel log's OOM kills that happened in the scenario's cgroup: by the `oom-kill:` line's
/// memory cgroup where the kernel wrote one, else by the pid being one the harness knew.
fn from_kernel_log(
    records: &[OomRecord],
    group: Option<&str>,
    ends: &[RankEnd],
    seen: &BTreeMap<u32, u32>,
) -> Vec<OomRecord> {
    let in_group = |path: &str| group.is_some_and(|g| path == g || path.starts_with(&format!("{g}/")));
    records
        .iter()
        .filter(|r| match (&r.oom_memcg, &r.task_memcg) {
            (None, None) => attribute(r.pid, ends, seen) != (None, None),
            (o, t) => o.as_deref().is_some_and(in_group) || t.as_deref().is_some_and(in_group),
        })
        .cloned()
        .collect()
}

/// Without the kernel log: the pid the counter stands for, when the counter rose by one and
/// exactly one process of the scenario died of a SIGKILL the harness did not send (a rank that
/// was not torn down, or a worker its rank reported killed).
fn from_counter(count: u64, ends: &[RankEnd]) -> Vec<u32> {
    let mut candidates: Vec<u32> = ends
        .iter()
        .filter(|e| {
            e.torn_down_with.is_none()
                && matches!(e.exit, Some(Exit::Signal { signal, .. }) if signal == Signal::SIGKILL as i32)
        })
        .filter_map(|e| e.pid)
        .collect();
    candidates.extend(ends.iter().flat_map(|e| e.stderr_tail.iter()).filter_map(|l| killed_worker_pid(l)));
    candidates.sort_unstable();
    candidates.dedup();
    if count == 1 && candidates.len() == 1 { candidates } else { Vec::new() }
}

/// The pid in PyTorch's `DataLoader worker (pid 123) is killed by signal: Killed.`
fn killed_worker_pid(line: &str) -> Option<u32> {
    let rest = line.split_once("DataLoader worker (pid ")?.1;
    let (pid, after) = rest.split_once(')')?;
    after.contains("is killed by signal: Killed").then(|| pid.parse().ok()).flatten()
}

/// The rank and worker a pid was: a rank's own pid, a worker its rank reported, or a process
/// seen in the rank's process group.
fn attribute(pid: u32, ends: &[RankEnd], seen: &BTreeMap<u32, u32>) -> (Option<u32>, Option<u32>) {
    if let Some(e) = ends.iter().find(|e| e.pid == Some(pid)) {
        return (Some(e.rank), None);
    }
    for e in ends {
        if let Some(w) = e.state.workers.iter().find(|w| w.pid == pid) {
            return (Some(e.rank), Some(w.id));
        }
    }
    (seen.get(&pid).copied(), None)
}

/// `CLOCK_MONOTONIC` in µs: the clock `/dev/kmsg` stamps its records with.
fn monotonic_us() -> u64 {
    crate::protocol::monotonic_ns().expect("CLOCK_MONOTONIC always exists") / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(rank: u32, pid: u32, exit: Option<Exit>) -> RankEnd {
        RankEnd { rank, pid: Some(pid), exit, ..Default::default() }
    }

    fn record(pid: u32, memcg: Option<&str>) -> OomRecord {
        OomRecord {
            pid,
            ts_us: 0,
            command: "x".into(),
            anon_rss_bytes: None,
            oom_memcg: memcg.map(str::to_string),
            task_memcg: memcg.map(str::to_string),
        }
    }

    #[test]
    fn a_kill_in_another_cgroup_is_not_ours_even_with_a_known_pid() {
        let ends = [end(0, 10, None)];
        let records = [record(10, Some("/other")), record(11, Some("/job/ups-doctor.1.2.0"))];
        let ours = from_kernel_log(&records, Some("/job/ups-doctor.1.2.0"), &ends, &BTreeMap::new());
        assert_eq!(ours.iter().map(|r| r.pid).collect::<Vec<_>>(), [11]);
    }

    #[test]
    fn the_counter_names_a_pid_only_when_one_sigkill_is_unexplained() {
        let killed = Some(Exit::Signal { signal: Signal::SIGKILL as i32, core_dumped: false });
        let mut torn = end(1, 21, killed);
        torn.torn_down_with = Some(crate::schema::Signal::KILL);
        assert_eq!(from_counter(1, &[end(0, 20, killed), torn.clone()]), [20]);
        assert_eq!(from_counter(0, &[end(0, 20, killed)]), Vec::<u32>::new());
        assert_eq!(from_counter(1, &[end(0, 20, killed), end(1, 22, killed)]), Vec::<u32>::new());
        let mut rank = end(0, 20, Some(Exit::Code(1)));
        rank.stderr_tail =
            vec!["RuntimeError: DataLoader worker (pid 31) is killed by signal: Killed.".into()];
        assert_eq!(from_counter(1, &[rank]), [31]);
    }
}
