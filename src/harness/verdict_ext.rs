//! The verdict for an external training command: the same shape as the built-in trainer's
//! (what failed, where, first failure vs collateral, likely cause, next step), worded for a
//! program ups-doctor did not write, with its evidence (markers or only output, where the exit
//! status came from, PyTorch's own messages). Pure.

use crate::protocol::signal_number;
use crate::scenario::{CompletesWhen, OutcomeKind, Scenario};

use super::classify::{add_collateral, location, signal_cause};
use super::quotes::loader_failure;
use super::result::{RankResult, Verdict};

/// `python train.py`: the program and its first argument, for sentences.
fn program(scenario: &Scenario) -> String {
    let argv = scenario.command.as_deref().unwrap_or_default();
    let base = |a: &String| a.rsplit('/').next().unwrap_or(a).to_string();
    let script = argv.iter().skip(1).position(|a| a.ends_with(".py")).map(|i| i + 1);
    match (argv.first(), script) {
        (Some(p), Some(1)) => format!("{} {}", base(p), base(&argv[1])),
        (Some(p), Some(i)) => format!("{} … {}", base(p), base(&argv[i])),
        (Some(p), None) => base(p),
        _ => String::new(),
    }
}

/// How the harness knows what this rank was doing: its last marker, or without markers its last
/// output.
fn last_sign(rank: &RankResult) -> String {
    match (rank.last_marker_at_s, rank.last_output_at_s) {
        (Some(t), _) => format!(
            "last marker from rank {} at {t:.2} s: {}; {} steps reported",
            rank.rank,
            location(rank).trim_start_matches("in "),
            rank.steps_done
        ),
        (None, Some(t)) => format!(
            "rank {} sent no markers (the program does not use `python/ups_doctor.py`): its last output was at {t:.2} s{}",
            rank.rank,
            rank.log_tail.last().map(|l| format!(": `{}`", l.trim())).unwrap_or_default()
        ),
        (None, None) => format!("rank {} sent no markers and wrote no output", rank.rank),
    }
}

fn exit_source(rank: &RankResult) -> Option<String> {
    rank.exit_source.as_deref().map(|source| match source {
        "procfs" => format!(
            "rank {}'s exit status was read from `/proc/{}/stat` while it was a zombie (it is the launcher's child, not ups-doctor's)",
            rank.rank,
            rank.pid.map_or("?".into(), |p| p.to_string())
        ),
        "torchrun" => format!("rank {}'s exit status is the one torchrun's error summary gives", rank.rank),
        "launcher status 0" => format!("rank {} ended while the launcher exited with status 0, which torchrun does only when every rank did", rank.rank),
        _ => format!("rank {}'s exit status was not observed (it was reaped by its launcher before ups-doctor saw it)", rank.rank),
    })
}

/// The external command's outcome, first failure and verdict.
pub fn verdict(
    scenario: &Scenario,
    ranks: &[RankResult],
    first: Option<&RankResult>,
    wall_s: f64,
) -> (OutcomeKind, Option<u32>, Verdict) {
    let program = program(scenario);
    let completion = match &scenario.expect.completes_when {
        None => "exit status 0".to_string(),
        Some(CompletesWhen::Done) => "exit status 0 and the helper's `done` marker".to_string(),
        Some(CompletesWhen::Stdout(p)) => format!("exit status 0 and a stdout line matching `{p}`"),
    };
    let Some(failed) = first else {
        let n = ranks.len();
        let steps = ranks.first().map_or(0, |r| r.steps_done);
        let steps = if steps > 0 { format!(", {steps} steps reported") } else { String::new() };
        let mut evidence = vec![format!("completion judged by {completion}")];
        if ranks.iter().all(|r| r.markers == 0) {
            evidence.push("no markers: the program does not use `python/ups_doctor.py`, so phases and steps are unknown".into());
        }
        return (
            OutcomeKind::Passed,
            None,
            Verdict {
                headline: format!(
                    "Passed: {n} {} of `{program}` finished in {wall_s:.1} s{steps}.",
                    if n == 1 { "rank" } else { "ranks" }
                ),
                evidence,
                likely_cause: None,
                next_step: None,
            },
        );
    };
    let who = format!("Rank {}", failed.rank);
    let at = if failed.markers > 0 { format!(" {}", location(failed)) } else { String::new() };
    let mut evidence = vec![last_sign(failed)];
    evidence.extend(exit_source(failed));
    let quoted = "The program's own last error lines are quoted below the verdict.";
    let (headline, likely_cause, next_step) = match failed.outcome {
        OutcomeKind::Signaled => {
            let sig = failed.signal.clone().unwrap_or_default();
            let num = signal_number(&sig).unwrap_or(0);
            evidence.push(format!(
                "killed by {sig} (torchrun prints `exitcode: -{num}` and `Signal {num} ({sig}) received by PID {}`)",
                failed.pid.map_or("?".into(), |p| p.to_string())
            ));
            if failed.quotes.iter().any(|q| q.title == "Python fault handler") {
                evidence.push("Python's fault handler printed the Python stack at the crash (quoted below)".into());
            }
            (
                format!("{who} was killed by {sig}{at}."),
                Some(signal_cause(num)),
                Some(format!(
                    "{quoted} The fault handler's stack shows the Python line that called into native code; then cut the program's params one at a time (`ups-doctor bisect`) to find what the crash needs."
                )),
            )
        }
        OutcomeKind::FalseSuccess => {
            evidence.push(format!("exit status 0, but completion is judged by {completion}, and that was not seen"));
            (
                format!("{who} exited with status 0{at} without the completion evidence: a false success."),
                Some(
                    "Something ended the program with status 0 before it finished, like a wrapper calling \
                     `os._exit(0)` or `sys.exit(0)` after catching an exception: the real error was swallowed."
                        .to_string(),
                ),
                Some(format!("Look for exception handlers that exit with 0 around the training loop. {quoted}")),
            )
        }
        OutcomeKind::Exited => {
            let mut text: Vec<String> = failed.error.iter().cloned().collect();
            text.extend(failed.quotes.iter().flat_map(|q| q.lines.iter().cloned()));
            let code = failed.exit_code.map_or("an unobserved status".to_string(), |c| format!("status {c}"));
            evidence.push(format!("exit {code}"));
            match loader_failure(&text) {
                Some(loader) => {
                    let worker = match (loader.worker, loader.pid) {
                        (Some(id), Some(pid)) => format!("DataLoader worker {id} (pid {pid})"),
                        (Some(id), None) => format!("DataLoader worker {id}"),
                        (None, Some(pid)) => format!("a DataLoader worker (pid {pid})"),
                        (None, None) => "a DataLoader worker".to_string(),
                    };
                    let r = failed.rank;
                    evidence.push(format!("culprit: {worker} of rank {r}: {}", loader.what));
                    evidence.push(format!("consequence: rank {r} re-raised it and exited with {code}"));
                    let cause = if loader.out_of_shm {
                        "Out of shared memory: DataLoader workers hand every batch to the main process through \
                         `/dev/shm`; when it is full (Docker's default is 64 MB), PyTorch cannot allocate the \
                         batch's segment (older versions die of SIGBUS instead)."
                            .to_string()
                    } else {
                        "The worker failed while building a batch; the rank only re-raises what the worker sent."
                            .to_string()
                    };
                    (
                        format!("{worker} of rank {r} failed first ({}); rank {r} exited with {code} as a consequence{at}.", loader.what),
                        Some(cause),
                        Some(if loader.out_of_shm {
                            "Give `/dev/shm` more room (Docker's `--shm-size`, `data.shm_size` here), or use fewer \
                             workers, a smaller batch or `prefetch_factor`; `ups-doctor bisect` over the params \
                             finds the boundary."
                                .to_string()
                        } else {
                            quoted.to_string()
                        }),
                    )
                }
                None => {
                    let msg = failed.error.clone().map(|e| format!(": {e}")).unwrap_or_default();
                    (
                        format!("{who} exited with {code}{at}{msg}"),
                        failed.error.as_ref().map(|_| "The program reported this error itself before exiting.".to_string()),
                        Some(quoted.to_string()),
                    )
                }
            }
        }
        OutcomeKind::Hung => {
            let silence = failed.hang_detected_after_s.unwrap_or(f64::NAN);
            evidence.push(format!(
                "no marker and no output for {silence:.1} s (limit `limits.hang_after_s` = {} s)",
                scenario.limits.hang_after_s
            ));
            let with_py_spy = failed.dumps.iter().filter(|d| d.py_spy.is_some()).count();
            evidence.push(match (failed.dumps.len(), with_py_spy) {
                (0, _) => "no process of the rank was left to look at".to_string(),
                (n, 0) => format!("{n} process(es) looked at from outside: each thread's kernel wait channel and system call (no py-spy stacks: {})", failed.dumps[0].error.as_deref().unwrap_or("py-spy failed")),
                (n, k) => format!("{n} process(es) looked at from outside: py-spy stacks of {k}, and each thread's kernel wait channel and system call"),
            });
            (
                format!("{who} hung{at}: no progress for {silence:.1} s."),
                Some(
                    "The program stopped making progress without exiting: a collective waiting for a rank that \
                     will never join, a deadlock, or a DataLoader worker that stopped."
                        .to_string(),
                ),
                Some("The stacks below show where each thread waits (`futex`: a lock or condition; `recvfrom`/`poll`: a peer).".to_string()),
            )
        }
        OutcomeKind::TimedOut => {
            evidence.push(format!("still running after `limits.timeout_s` = {} s", scenario.limits.timeout_s));
            (
                format!("{who} ran past the time limit of {} s{at}.", scenario.limits.timeout_s),
                Some("It kept making progress (markers or output), just not fast enough.".into()),
                Some("Raise `limits.timeout_s`, or make the run shorter through its params.".into()),
            )
        }
        OutcomeKind::LaunchFailed => (
            format!("{who} could not be started: {}.", failed.error.clone().unwrap_or_else(|| "unknown error".into())),
            None,
            Some("Check `command`: the program must be on `PATH` (or given by its path) and its arguments right.".into()),
        ),
        OutcomeKind::Passed => unreachable!("a passed rank is not a failure"),
    };
    let mut headline = headline;
    add_collateral(failed, ranks, &mut headline, &mut evidence);
    (failed.outcome, Some(failed.rank), Verdict { headline, evidence, likely_cause, next_step })
}

/// For an external rank that failed for lack of shared memory (PyTorch's message, or SIGBUS): the
/// `/dev/shm` figure, its peak over the run (the failed segment is gone by the time the rank ends).
pub fn shm_evidence(
    scenario: &Scenario,
    failed: &RankResult,
    memory: &super::result::MemoryReport,
) -> Option<String> {
    let mut text: Vec<String> = failed.error.iter().cloned().collect();
    text.extend(failed.quotes.iter().flat_map(|q| q.lines.iter().cloned()));
    let out_of_shm =
        loader_failure(&text).is_some_and(|l| l.out_of_shm) || failed.signal.as_deref() == Some("SIGBUS");
    if !out_of_shm {
        return None;
    }
    let (used, total) = (memory.shm.peak_used_bytes?, memory.shm.total_bytes?);
    let whose = match &scenario.data.shm_size {
        Some(size) if memory.shm.private => {
            format!("the run's private `/dev/shm` (`data.shm_size` = `{size}`)")
        }
        _ => "the machine's `/dev/shm`".to_string(),
    };
    let percent = if total > 0 { used as f64 * 100.0 / total as f64 } else { 0.0 };
    Some(format!(
        "{whose} peaked at {} ({percent:.0}%) during the run (sampled every {} ms; an allocation that failed took no room, so the segment that did not fit is not in this figure)",
        super::classify::used_of(used, total),
        (memory.interval_s * 1000.0).round()
    ))
}
