//! A cluster's workers on several nodes (Ray Train across hosts): each node's agent finds the
//! workers its node's raylet started (its ranks) and reads how each process ended, but what a
//! worker printed and whether it failed are said only where the job's driver runs, node 0: Ray
//! prints every worker's lines into the driver's output, a remote one's prefixed with its pid and
//! host (`(RayTrainWorker pid=96, ip=10.0.0.2)`), and relays a failed rank's error
//! (`[Rank 1 Error Snippet]:`). Node 0 reads that output once its run ended and gives each other
//! node's rank its own lines and the end the cluster gave it, as one node does for its own
//! ranks. Pure.

use crate::harness::output_quotes;
use crate::scenario::OutcomeKind;
use crate::scenario::launcher::ClusterWorkers;
use crate::schema::{ExitSource, RankResult, Signal};

/// The job's driver on node 0 (the launcher's process there): how it ended and what it printed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DriverOutput {
    pub exit_code: Option<i32>,
    pub signal: Option<Signal>,
    pub stderr: Vec<String>,
    pub stdout: Vec<String>,
}

/// The lines of the other nodes' workers the driver's output holds: at most this many of a rank's
/// last ones are kept as its output.
const TAIL_LINES: usize = 60;

/// Gives each rank for which `remote` holds (a rank of another node than the driver's) the lines
/// the driver's output carries for its pid from another host, the error relayed for its rank,
/// and the end the cluster gave it: passed where the driver exited 0; its own where the cluster
/// named it failed; else ended with the job. A rank ups-doctor stopped (a hang, the time limit)
/// keeps that end. Where two remote ranks had the same pid (hosts of their own number processes
/// alike) neither is given lines: a pid is no name then.
pub fn account(
    ranks: &mut [RankResult],
    remote: impl Fn(u32) -> bool,
    workers: &ClusterWorkers,
    driver: &DriverOutput,
) {
    let elsewhere = |lines: &[String], pid: u32| -> Vec<String> {
        let of = lines.iter().filter(|l| workers.host_of_line(l).is_some());
        of.filter_map(|l| workers.worker_line(l))
            .filter(|(p, _)| *p == pid)
            .map(|(_, t)| t.to_string())
            .collect()
    };
    let relayed = workers.relayed(&[driver.stderr.as_slice(), driver.stdout.as_slice()].concat());
    let pids: Vec<u32> = ranks.iter().filter(|r| remote(r.rank)).filter_map(|r| r.pid).collect();
    for r in ranks.iter_mut().filter(|r| remote(r.rank)) {
        let unique = r.pid.filter(|p| pids.iter().filter(|q| *q == p).count() == 1);
        let (mut err, out) = unique.map_or_else(Default::default, |pid| {
            (elsewhere(&driver.stderr, pid), elsewhere(&driver.stdout, pid))
        });
        let relay = relayed.iter().find(|(rank, _)| *rank == r.rank).map(|(_, block)| block);
        err.extend(relay.into_iter().flatten().cloned());
        if !err.is_empty() || !out.is_empty() {
            r.quotes = output_quotes(&err, &out);
            let tail = if err.is_empty() { &out } else { &err };
            r.log_tail = tail[tail.len().saturating_sub(TAIL_LINES)..].to_vec();
        }
        if r.torn_down_with.is_some() || r.hung_at_s.is_some() {
            continue;
        }
        match (driver.exit_code, driver.signal) {
            (Some(0), None) => {
                (r.exit_code, r.signal, r.outcome) = (Some(0), None, OutcomeKind::Passed);
                r.exit_source = Some(ExitSource::Cluster);
            }
            // Named by the cluster: its own end, as read, unless it is the signal the cluster ends
            // a worker with after its error (Ray's SIGKILL of the worker group).
            _ if relay.is_some() => {
                if matches!(r.signal, Some(Signal::KILL | Signal::TERM)) {
                    r.exit_source = Some(ExitSource::ClusterAfterError);
                }
            }
            (code, signal) => {
                if r.exit_code.is_none() && r.signal.is_none() {
                    (r.exit_code, r.signal) = (code, signal);
                }
                r.exit_source = Some(ExitSource::Cluster);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::launcher::{RAY_TRAIN, RankProcesses};

    fn ray() -> &'static ClusterWorkers {
        match RAY_TRAIN.ranks {
            RankProcesses::ClusterWorkers(w) => w,
            RankProcesses::Started => unreachable!("Ray Train's workers are a cluster's"),
        }
    }

    fn rank(rank: u32, pid: u32, exit_code: Option<i32>, signal: Option<Signal>) -> RankResult {
        let mut r = crate::report::fixtures::rank(rank, 0);
        r.outcome = if signal.is_some() { OutcomeKind::Signaled } else { OutcomeKind::Exited };
        (r.pid, r.exit_code, r.signal, r.log_tail) = (Some(pid), exit_code, signal, Vec::new());
        r
    }

    /// The driver's output of a two-host run as Ray 2.60 prints it (the shape of a real run's
    /// here: node1 the driver's host, world rank 1 on 10.251.0.12 with pid 96, rank 0 on node1
    /// with pid 96 too, each host numbering its own processes).
    fn driver(exit_code: i32, relayed: bool) -> DriverOutput {
        let mut stderr = vec![
            "\x1b[36m(RayTrainWorker pid=96)\x1b[0m Moving model to device: cpu".to_string(),
            "\x1b[36m(RayTrainWorker pid=96, ip=10.251.0.12)\x1b[0m Error in training function:".to_string(),
            "\x1b[36m(RayTrainWorker pid=96, ip=10.251.0.12)\x1b[0m ValueError: bad batch".to_string(),
        ];
        if relayed {
            stderr.extend(
                [
                    "ray.train.WorkerGroupError: Training failed due to worker errors:",
                    "[Rank 1 Error Snippet]:",
                    "Traceback (most recent call last):",
                    "  File \"/t/torch_linear_example.py\", line 41, in train_epoch",
                    "ValueError: bad batch",
                ]
                .map(String::from),
            );
        }
        DriverOutput { exit_code: Some(exit_code), signal: None, stderr, stdout: Vec::new() }
    }

    #[test]
    fn a_clean_jobs_remote_workers_pass_whatever_status_the_cluster_ended_them_with() {
        let mut ranks = [rank(0, 96, Some(1), None), rank(1, 96, Some(1), None)];
        account(&mut ranks, |r| r == 1, ray(), &driver(0, false));
        assert_eq!(
            (ranks[1].outcome, ranks[1].exit_code, ranks[1].exit_source),
            (OutcomeKind::Passed, Some(0), Some(ExitSource::Cluster))
        );
        // Its own lines are those of its pid from another host, not the driver host's pid 96.
        assert_eq!(ranks[1].log_tail, ["Error in training function:", "ValueError: bad batch"]);
        assert_eq!(ranks[0].exit_code, Some(1), "node 0's own ranks are judged on node 0");
    }

    #[test]
    fn a_remote_worker_the_cluster_named_failed_keeps_its_end_and_gets_the_relayed_error() {
        for (signal, source) in [
            (None, None),
            (Some(Signal::KILL), Some(ExitSource::ClusterAfterError)),
            (Some(Signal::SEGV), None),
        ] {
            let code = signal.is_none().then_some(1);
            let mut ranks = [rank(0, 50, Some(1), None), rank(1, 96, code, signal)];
            account(&mut ranks, |r| r == 1, ray(), &driver(1, true));
            assert_eq!((ranks[1].exit_code, ranks[1].signal, ranks[1].exit_source), (code, signal, source));
            assert!(
                ranks[1].quotes.iter().any(|q| q.lines.iter().any(|l| l.contains("ValueError: bad batch"))),
                "{:?}",
                ranks[1].quotes
            );
        }
        // Not named: ended with the job.
        let mut ranks = [rank(0, 50, Some(1), None), rank(1, 96, None, None)];
        account(&mut ranks, |r| r == 1, ray(), &driver(1, false));
        assert_eq!((ranks[1].exit_code, ranks[1].exit_source), (Some(1), Some(ExitSource::Cluster)));
    }

    #[test]
    fn two_remote_workers_with_one_pid_are_given_no_lines() {
        let mut ranks = [rank(0, 50, Some(1), None), rank(1, 96, Some(1), None), rank(2, 96, Some(1), None)];
        account(&mut ranks, |r| r > 0, ray(), &driver(0, false));
        assert!(ranks[1].log_tail.is_empty() && ranks[2].log_tail.is_empty());
        assert_eq!(ranks[2].outcome, OutcomeKind::Passed);
    }
}
