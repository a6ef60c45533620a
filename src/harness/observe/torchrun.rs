//! torchrun's own account of a failure: the ranks it names in its `ChildFailedError` summary,
//! with their exit codes. Pure over its output lines.

use crate::harness::os::process::Exit;

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

/// Whether torchrun's output says `rank` (its process `pid`) exited with status 0 by itself, where
/// ups-doctor did not read its status (torchrun reaped it first, on a busy machine): torchrun's
/// summary (`failures`, non-empty) lists every rank that did not exit 0, the ones it stopped
/// included (`exitcode : -15`), and it logs every signal it sends a worker (`Sending process PID
/// closing signal SIGTERM`). Only over the whole of its output (`whole`): a window that lost its
/// start may have lost that line.
pub fn exited_zero(lines: &[String], failures: &[TorchrunFailure], rank: u32, pid: u32, whole: bool) -> bool {
    let signalled = format!("Sending process {pid} closing signal");
    whole
        && !failures.is_empty()
        && !failures.iter().any(|f| f.rank == rank)
        && !lines.iter().any(|l| l.contains(&signalled))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rank 1 left with `os._exit(0)`; rank 0 then failed on the lost peer and is the summary's
    /// only failure: rank 1 exited 0. Not so for a rank torchrun stopped, one it lists, or where
    /// the output was cut.
    #[test]
    fn a_rank_neither_listed_nor_signalled_by_torchrun_exited_zero() {
        let text = "\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 1001)";
        let lines: Vec<String> = text.lines().map(String::from).collect();
        let failures = torchrun_failures(&lines);
        assert!(exited_zero(&lines, &failures, 1, 1002, true));
        assert!(!exited_zero(&lines, &failures, 0, 1001, true), "listed");
        assert!(!exited_zero(&lines, &failures, 1, 1002, false), "the output was cut");
        let mut stopped = lines.clone();
        stopped.insert(0, "W1206 api.py:908] Sending process 1002 closing signal SIGTERM".into());
        assert!(!exited_zero(&stopped, &failures, 1, 1002, true), "torchrun stopped it");
        assert!(!exited_zero(&[], &[], 1, 1002, true), "no summary");
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
}
