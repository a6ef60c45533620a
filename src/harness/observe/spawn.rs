//! A launcher's own account of how its ranks ended, for those whose status ups-doctor could not
//! read: `srun`'s per-task lines ([`srun_ends`]), and `torch.multiprocessing.spawn`'s, as follows.
//! `torch.multiprocessing.spawn`'s own account of a failure: the `ProcessExitedException` it
//! raises in the launcher when one of its processes ended with a non-zero status or a signal
//! (`process 1 terminated with signal SIGSEGV`, `process 0 terminated with exit code 1`). It
//! reaps its processes as soon as they end, so ups-doctor, which may read a status only while
//! the process is a zombie, can miss it on a busy machine; this is then the status the launcher
//! itself saw. Pure over its output lines.

use crate::harness::os::process::Exit;
use crate::schema::Signal;

/// The process `spawn` names (its index among the processes it started, in the order it started
/// them) and how it ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpawnFailure {
    pub index: u32,
    pub exit: Exit,
}

/// The failure in the last `ProcessExitedException` line of `lines`, if any. A process that
/// raised a Python exception is reported otherwise (`ProcessRaisedException`, with its
/// traceback): its exit status is no part of that text, and nothing is taken from it.
pub fn spawn_failure(lines: &[String]) -> Option<SpawnFailure> {
    lines.iter().rev().find_map(|line| {
        let (_, text) = line.split_once("ProcessExitedException: process ")?;
        let (index, how) = text.split_once(" terminated with ")?;
        let index = index.trim().parse().ok()?;
        let exit = if let Some(name) = how.strip_prefix("signal ") {
            Exit::Signal { signal: Signal::parse(name.trim())?.number(), core_dumped: false }
        } else {
            let code: i32 = how.strip_prefix("exit code ")?.trim().parse().ok()?;
            Exit::Code(code)
        };
        Some(SpawnFailure { index, exit })
    })
}

/// The process a `ProcessRaisedException` names and the traceback it relays (`-- Process 1
/// terminated with the following error:` and the lines after it, to the first blank one): the
/// rank's own exception, which `spawn`'s wrapper caught in the child (so no `sys.excepthook` saw
/// it) and sent to the launcher to print. Its exit status is not in it.
pub fn spawn_raised(lines: &[String]) -> Option<(u32, Vec<String>)> {
    const LEAD: &str = "-- Process ";
    let at =
        lines.iter().rposition(|l| l.contains(LEAD) && l.contains("terminated with the following error"))?;
    let line = &lines[at];
    let index = line[line.find(LEAD)? + LEAD.len()..].split_whitespace().next()?.parse().ok()?;
    let all: Vec<&String> = lines[at + 1..].iter().take_while(|l| !l.trim().is_empty()).collect();
    // A long traceback (a framework's, 80 lines and more) keeps its first line and its end: the
    // exception is its last line.
    let block: Vec<String> = if all.len() > MAX_RAISED_LINES {
        let tail = &all[all.len() - (MAX_RAISED_LINES - 2)..];
        let mut block = vec![all[0].clone(), format!("  … {} lines …", all.len() - 1 - tail.len())];
        block.extend(tail.iter().map(|l| (*l).clone()));
        block
    } else {
        all.into_iter().cloned().collect()
    };
    (!block.is_empty()).then_some((index, block))
}

/// The ends `srun` reports for its tasks (`srun: error: vm: task 1: Segmentation fault`, `… task
/// 0: Exited with exit code 1`): the task number (`SLURM_PROCID`) and how it ended, for the
/// signals a training process dies of and exit codes; other lines give nothing.
pub fn srun_ends(lines: &[String]) -> Vec<(u32, Exit)> {
    const SIGNALS: [(&str, Signal); 8] = [
        ("Segmentation fault", Signal::SEGV),
        ("Bus error", Signal::BUS),
        ("Aborted", Signal::ABRT),
        ("Killed", Signal::KILL),
        ("Terminated", Signal::TERM),
        ("Floating point exception", Signal::FPE),
        ("Illegal instruction", Signal::ILL),
        ("Interrupt", Signal::INT),
    ];
    lines
        .iter()
        .filter_map(|line| {
            let rest = &line[line.find("srun: error: ")?..];
            let rest = &rest[rest.find(": task ")? + ": task ".len()..];
            let (task, how) = rest.split_once(": ")?;
            let task = task.trim().parse().ok()?;
            let how = how.trim();
            let exit = match how.strip_prefix("Exited with exit code ") {
                Some(code) => Exit::Code(code.trim().parse().ok()?),
                None => {
                    let (_, signal) = SIGNALS.iter().find(|(name, _)| how.starts_with(name))?;
                    Exit::Signal { signal: signal.number(), core_dumped: how.contains("core dumped") }
                }
            };
            Some((task, exit))
        })
        .collect()
}

/// The most lines of a relayed traceback kept.
const MAX_RAISED_LINES: usize = 80;

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_string).collect()
    }

    #[test]
    fn spawns_exception_gives_the_index_and_the_signal_or_the_code() {
        // As torch 2.11 prints it (tests/programs/launchers.py, rank 1 segfaulting).
        let text = "\
  File \"/venv/lib/python3.11/site-packages/torch/multiprocessing/spawn.py\", line 192, in join
    raise ProcessExitedException(
torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal SIGSEGV
rank 0 step 3 loss 6.9526";
        assert_eq!(
            spawn_failure(&lines(text)),
            Some(SpawnFailure {
                index: 1,
                exit: Exit::Signal { signal: Signal::SEGV.number(), core_dumped: false }
            })
        );
        let code =
            "torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with exit code 3";
        assert_eq!(spawn_failure(&lines(code)), Some(SpawnFailure { index: 0, exit: Exit::Code(3) }));
    }

    #[test]
    fn a_raised_exception_gives_its_process_and_the_traceback_spawn_relayed() {
        // As torch 2.11 printed it (`mp.spawn`, rank 1 raising `ValueError` in its function).
        let text = "\
torch.multiprocessing.spawn.ProcessRaisedException: \n\
-- Process 1 terminated with the following error:
Traceback (most recent call last):
  File \"/v/lib/python3.11/site-packages/torch/multiprocessing/spawn.py\", line 87, in _wrap
    fn(i, *args)
  File \"/tmp/s49/spawnfail.py\", line 8, in work
    raise ValueError(\"bad shard on rank 1\")
ValueError: bad shard on rank 1

rank 0 step 3";
        let (index, block) = spawn_raised(&lines(text)).unwrap();
        assert_eq!(index, 1);
        assert_eq!(block.first().map(String::as_str), Some("Traceback (most recent call last):"));
        assert_eq!(block.last().map(String::as_str), Some("ValueError: bad shard on rank 1"));
        assert_eq!(
            spawn_raised(&lines(
                "torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with exit code 3"
            )),
            None
        );
    }

    /// Lightning's `ddp_spawn`, rank 1 gone (`os._exit(0)`) at step 3: rank 0's relayed traceback
    /// is 85 lines long (recorded). Its first 80 lines held no exception, so the rank's error was
    /// read as `Traceback (most recent call last):` and its lost peer was never seen.
    #[test]
    fn a_long_relayed_traceback_keeps_its_exception_line() {
        let text = include_str!("fixtures/spawn_relayed_long.txt");
        let (index, block) = spawn_raised(&lines(text)).unwrap();
        assert_eq!(index, 0);
        assert!(block.len() <= MAX_RAISED_LINES, "{}", block.len());
        assert_eq!(block.first().map(String::as_str), Some("Traceback (most recent call last):"));
        assert_eq!(
            block.last().map(String::as_str),
            Some(
                "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:538] Read error \
                 [127.0.0.1]:20906: Connection reset by peer"
            )
        );
        assert_eq!(block[1], "  … 6 lines …");
    }

    #[test]
    fn sruns_account_of_its_tasks_gives_each_tasks_signal_or_code() {
        // As srun 23.11 printed it on the one-host cluster (tests/slurm.rs, task 1 segfaulting).
        let text = "srun: error: vm: task 1: Segmentation fault\nsrun: error: vm: task 0: Exited with exit code 1\n\
                    srun: error: node-b: task 3: Bus error (core dumped)\nsrun: error: vm: task 2: Something else\n\
                    rank 1: task 1: Segmentation fault";
        assert_eq!(
            srun_ends(&lines(text)),
            [
                (1, Exit::Signal { signal: Signal::SEGV.number(), core_dumped: false }),
                (0, Exit::Code(1)),
                (3, Exit::Signal { signal: Signal::BUS.number(), core_dumped: true }),
            ]
        );
    }

    #[test]
    fn a_raised_exception_an_unknown_signal_or_other_text_gives_nothing() {
        let raised = "\
torch.multiprocessing.spawn.ProcessRaisedException:

-- Process 1 terminated with the following error:
Traceback (most recent call last):
RuntimeError: boom";
        assert_eq!(spawn_failure(&lines(raised)), None);
        let odd = "torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal <Unknown signal 99>";
        assert_eq!(spawn_failure(&lines(odd)), None);
        assert_eq!(spawn_failure(&lines("rank 1: process 1 terminated with signal SIGSEGV")), None);
    }
}
