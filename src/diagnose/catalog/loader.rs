//! DataLoader workers and `/dev/shm`: a worker's exception, a worker killed by a signal, shared
//! memory exhausted or left behind, and an input-bound run.

use super::{Finding, Pattern};
use crate::diagnose::evidence::{Evidence, RankEvidence, location};
use crate::scenario::human_bytes;
use crate::scenario::{OutcomeKind, Scenario};
use crate::schema::{MemoryReport, RankResult, ShmAt, Signal};

pub const DATALOADER_WORKER_EXCEPTION: Pattern = Pattern {
    id: "dataloader-worker-exception",
    title: "DataLoader worker exception",
    matches: "`Caught <Error> in DataLoader worker process N.` and the worker's `Original Traceback`: the \
              key line is the dataset's own error with its file:line (and the sample index when the message \
              shows it)",
    explanation: "The dataset's code raised while a worker built a batch; the worker sent the exception to the \
                  main process, which re-raised it: the rank's error is the worker's.",
    next_step: "Fix the dataset at the line named; `num_workers=0` runs the dataset in the main process, where \
                a debugger can stop at the failing sample.",
    reference: "https://pytorch.org/docs/stable/data.html#multi-process-data-loading",
};

pub const WORKER_KILLED_BY_SIGNAL: Pattern = Pattern {
    id: "worker-killed-by-signal",
    title: "DataLoader worker killed by a signal, or gone without saying how",
    matches: "`DataLoader worker (pid N) is killed by signal: …` or `DataLoader worker (pid(s) N) exited \
              unexpectedly` without an OOM kill or a full `/dev/shm` recorded for it; or the rank's traceback \
              through `rebuild_storage_fd` ending in `ConnectionResetError`, `ConnectionRefusedError`, \
              `EOFError` or `FileNotFoundError` (the worker that sent a batch was gone when the rank asked it for the \
              batch's shared memory)",
    explanation: "A worker process died without raising an exception: a crash in native code, or a signal from \
                  outside (SIGKILL). PyTorch's DataLoader only sees that the worker is gone and fails the rank; \
                  its shorter words (`exited unexpectedly`, no status) do not say whether a signal ended it.",
    next_step: "The signal says which: `Segmentation fault` is a native crash in the dataset's code or a \
                library it calls; `Killed` is a SIGKILL from outside (the OOM killer, a job scheduler, a \
                person): check the memory figures and the kernel log (`dmesg`).",
    reference: "https://pytorch.org/docs/stable/data.html#multi-process-data-loading",
};

pub const WORKER_EXITED: Pattern = Pattern {
    id: "worker-exited",
    title: "DataLoader worker exited with a status of its own",
    matches: "`DataLoader worker (pid N) exited unexpectedly with exit code K.` (K a number: the worker \
              called exit, it was not killed by a signal)",
    explanation: "The worker ended itself with a non-zero status without handing an exception to the main \
                  process (a Python exception in a worker is re-raised in the rank): a call to `exit` or \
                  `os._exit` in the dataset's code or a library, or a runtime that ends the process on its \
                  own error (a Rust panic exits with 101). What it printed before, if anything, is in the \
                  rank's stderr, which workers share.",
    next_step: "Read the worker's last lines in the rank's stderr (quoted in the evidence where found); \
                `num_workers=0` runs the same code in the rank, where the error surfaces with its traceback.",
    reference: "https://pytorch.org/docs/stable/data.html#multi-process-data-loading",
};

pub const SHM_EXHAUSTED: Pattern = Pattern {
    id: "shm-exhausted",
    title: "/dev/shm exhausted",
    matches: "SIGBUS in a rank or worker while `/dev/shm` was full, a rank's SIGSEGV while `/dev/shm` was full at \
              the moment it died (native code that maps shared memory without checking it got the room), or PyTorch's `unable to allocate shared \
              memory(shm)` / `Unexpected bus error encountered in worker`; also a hang after a worker's process \
              printed `unable to allocate shared memory(shm)` (multiprocessing's queue thread drops the batch \
              and raises nothing), each rank named by its worker's pid in the segment's name; or `No space left on \
              device` raised where multiprocessing makes what it keeps in `/dev/shm` (a `SemLock` semaphore, as a \
              DataLoader's iterator makes its queues; a `SharedMemory` segment; a heap arena)",
    explanation: "DataLoader workers hand every batch to the main process through `/dev/shm`; when it is full \
                  (Docker's default is 64 MB) PyTorch cannot allocate the batch's segment, or a page written \
                  to one cannot be backed and the kernel sends SIGBUS.",
    next_step: "Give `/dev/shm` more room (Docker's `--shm-size`, a Kubernetes `emptyDir` with `medium: \
                Memory`, `data.shm_size` here), or use fewer workers, a smaller batch or `prefetch_factor`.",
    reference: "https://github.com/pytorch/pytorch#docker-image",
};

pub const LEAKED_SHM: Pattern = Pattern {
    id: "leaked-shm",
    title: "Leaked /dev/shm segments",
    matches: "files the run created in `/dev/shm` were still there after every rank ended",
    explanation: "Shared-memory segments outlive the processes that made them unless unlinked: a crashed \
                  worker, a killed rank or a missing cleanup leaves them, and each holds memory until removed \
                  (Python warns `There appear to be N leaked shared_memory objects`).",
    next_step: "Unlink segments once both sides have opened them (`SharedMemory.unlink()`), and clean up in a \
                `finally`; ups-doctor removes its own run's leftovers and lists them in the report.",
    reference: "https://docs.python.org/3/library/multiprocessing.shared_memory.html",
};

pub const INPUT_BOUND: Pattern = Pattern {
    id: "input-bound",
    title: "Input-bound",
    matches: "the ranks spent at least half of their step time waiting for data (from the `data_ms` and \
              `compute_ms` of step markers, e.g. `ups_doctor.step(step, data_ms=…, compute_ms=…)`, over at \
              least 3 steps of a rank; phase markers alone do not count)",
    explanation: "The ranks wait for batches more than they compute: the data pipeline, not the model, sets \
                  the speed, and a bigger batch only makes each wait longer.",
    next_step: "Try more workers (`num_workers`, `data.workers`), a larger prefetch, or a faster cache \
                (in memory or `/dev/shm` instead of disk).",
    reference: "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html",
};

/// The fewest steps a rank's share of time waiting for data is judged over: one step's wait is
/// the workers' start-up (a single step was called 100% input-bound).
pub const INPUT_BOUND_MIN_STEPS: u64 = 3;
/// A run spending at least this share of its step time waiting for data is input-bound.
pub const INPUT_BOUND_SHARE: f64 = 0.5;
/// `/dev/shm` this full (used / total) counts as full when a bus error is judged.
pub const SHM_FULL_SHARE: f64 = 0.95;

/// `78% of step time waiting for data` (all ranks together), when that is at least
/// [`INPUT_BOUND_SHARE`].
pub fn input_bound(ranks: &[RankResult]) -> Option<String> {
    // The first batches wait for the workers to start: a share over fewer steps than this says
    // more about start-up than about the pipeline.
    // Where the observer timed a program's steps, the medians of its steady state say it (a sum
    // is ruled by the first batches' wait for the workers to start: 83% of a test script's step
    // time by the sum, 0.04 of 0.19 ms by the medians).
    let share = |r: &RankResult| match r.observed.as_ref() {
        Some(o) if o.timed_steps >= INPUT_BOUND_MIN_STEPS && o.step_ms > 0.0 => Some(o.data_ms / o.step_ms),
        _ => r.data_wait_fraction,
    };
    let shares: Vec<f64> =
        ranks.iter().filter(|r| r.steps_done >= INPUT_BOUND_MIN_STEPS).filter_map(share).collect();
    if shares.is_empty() {
        return None;
    }
    let share = shares.iter().sum::<f64>() / shares.len() as f64;
    (share >= INPUT_BOUND_SHARE).then(|| format!("{:.0}% of step time waiting for data", share * 100.0))
}

pub fn input_bound_run(ev: &Evidence, _: Option<&RankEvidence>) -> Option<Finding> {
    let ranks: Vec<RankResult> = ev.ranks.iter().map(|r| r.result.clone()).collect();
    let line = input_bound(&ranks)?;
    let mut f = Finding::of(&INPUT_BOUND);
    f.appendix = Some(format!(" Input-bound: {line}."));
    f.cause = None;
    f.next_step = Some(if ev.scenario.is_external() {
        // A command's program has its own DataLoader, not the built-in trainer's `data` fields.
        "The ranks wait for batches more than they compute: give the DataLoader more workers \
         (`num_workers`) or a larger `prefetch_factor`, or make each sample cheaper to load (decode or \
         augment once, cache it); a bigger batch only makes each wait longer."
            .into()
    } else {
        "The ranks wait for batches more than they compute: try more workers (`data.workers`), a larger \
         `data.prefetch`, or a faster cache (`data.cache`); a bigger batch only makes each wait longer."
            .into()
    });
    Some(f)
}

pub fn leaked_shm(ev: &Evidence, _: Option<&RankEvidence>) -> Option<Finding> {
    ev.leftovers.shm.iter().any(|s| s.ours).then(|| {
        let mut f = Finding::of(&LEAKED_SHM);
        f.cause = Some(LEAKED_SHM.explanation.to_string());
        f
    })
}

/// `8.0 of 64.0 MiB`: both figures in the unit that suits the total.
pub fn used_of(used: u64, total: u64) -> String {
    let (div, unit) = if total >= 10 << 30 {
        ((1u64 << 30) as f64, "GiB")
    } else if total >= 1 << 20 {
        ((1u64 << 20) as f64, "MiB")
    } else {
        // A tiny /dev/shm (`--shm-size 16k`) reads `16.0 of 16.0 KiB`, not `0.0 of 0.0 MiB`.
        (1024.0, "KiB")
    };
    let digits = if unit == "GiB" { 2 } else { 1 };
    format!("{:.digits$} of {:.digits$} {unit}", used as f64 / div, total as f64 / div)
}

/// A failed DataLoader worker, as PyTorch's messages (and the built-in trainer's tag
/// `[data-loader worker ID of rank R, METHOD]`) name it.
#[derive(Debug, Clone, PartialEq)]
pub struct LoaderFailure {
    /// `Caught RuntimeError in DataLoader worker process 1.`, or the built-in trainer's tag.
    pub worker: Option<u32>,
    /// `DataLoader worker (pid 1234) …`, or the pid in a `/torch_<pid>_…` shared-memory file.
    pub pid: Option<u32>,
    /// What happened, in PyTorch's words (`unable to allocate shared memory(shm) for file
    /// </torch_1234_…>: …`, `is killed by signal: Bus error.`).
    pub what: String,
    /// The failure was shared memory running out.
    pub out_of_shm: bool,
    /// The worker died (a signal, an unexpected exit) rather than raising an exception.
    pub died: bool,
}

fn number_after(line: &str, label: &str) -> Option<u32> {
    let rest = &line[line.find(label)? + label.len()..];
    rest.trim_start_matches(|c: char| !c.is_ascii_digit())
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// The DataLoader worker failure in `text` (a rank's error message, or its output), if any.
pub fn loader_failure(text: &[String]) -> Option<LoaderFailure> {
    let worker = text.iter().rev().find_map(|l| {
        number_after(l, "in DataLoader worker process ").or_else(|| number_after(l, "[data-loader worker "))
    });
    let shm = text.iter().rev().find(|l| l.contains("unable to allocate shared memory(shm)"));
    let killed = text
        .iter()
        .rev()
        .find(|l| l.contains("DataLoader worker (pid") && l.contains("is killed by signal"))
        .or_else(|| text.iter().rev().find(|l| l.contains("DataLoader worker (pid")));
    let bus = text
        .iter()
        .any(|l| l.contains("Unexpected bus error encountered in worker") || l.contains("Bus error"));
    let (what, pid, died) = if let Some(line) = shm {
        let what = line[line.find("unable to allocate").unwrap_or(0)..].trim().to_string();
        let pid = line.split("/torch_").nth(1).and_then(|rest| rest.split('_').next()?.parse().ok());
        (what, pid, false)
    } else if let Some(line) = killed {
        let rest = &line[line.find("DataLoader worker (pid").unwrap_or(0)..];
        let pid = number_after(rest, "(pid");
        // After the parenthesis that holds the pid: `(pid 12)` or `(pid(s) 12, 13)`.
        let digits = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(0);
        let what = rest[digits..].split_once(") ").map_or(rest, |(_, how)| how);
        let what = what.split(" [").next().unwrap_or(what);
        // PyTorch's advice after the fact is not what happened.
        let what =
            what.split(" Details are lost due to multiprocessing.").next().unwrap_or(what).trim().to_string();
        (what, pid, true)
    } else if worker.is_some() {
        let last = text.iter().rev().find(|l| !l.trim().is_empty()).cloned().unwrap_or_default();
        (last.trim().to_string(), None, false)
    } else if let Some(error) = batch_from_a_gone_worker(text) {
        (
            format!(
                "was gone before the rank could take the batch it had sent: `{error}` in PyTorch's \
                 `rebuild_storage_fd`, asking the worker for the batch's shared memory"
            ),
            None,
            true,
        )
    } else {
        return None;
    };
    Some(LoaderFailure { worker, pid, out_of_shm: shm.is_some() || bus, what, died })
}

/// The error that ends a traceback through PyTorch's `rebuild_storage_fd`, when it says the
/// process on the other end is gone: a batch a worker put on the queue is taken out by asking that
/// worker for its shared memory's file descriptor (multiprocessing's `resource_sharer`), and a
/// worker that has exited meanwhile answers with a reset or refused connection, an end of file,
/// or its socket is gone. PyTorch then never says the worker died: the rank fails with that
/// error (seen with `patterns.py --case worker_exit`, a worker calling `sys.exit(3)`, in a
/// fresh-clone run of the CI command and in 4 of 30 runs by hand).
///
/// The traceback's `File "…/reductions.py", line 540, in rebuild_storage_fd` is read from the
/// rank's stderr; where Python lost stderr while printing it, the observer's error marker says the
/// same (`… (train.py:12 in <module>; raised in torch's `rebuild_storage_fd`)`).
fn batch_from_a_gone_worker(text: &[String]) -> Option<String> {
    let through = text.iter().rposition(|l| l.contains("rebuild_storage_fd"))?;
    let error = text[through..].iter().map(|l| l.trim()).find(|l| {
        ["ConnectionResetError", "ConnectionRefusedError", "FileNotFoundError", "EOFError"].iter().any(|e| {
            l.strip_prefix(e)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(':') || rest.starts_with(" ("))
        })
    })?;
    // The observer's frames in parentheses are not the error's words.
    Some(match error.rfind(" (").filter(|_| error.ends_with(')') && error.contains("rebuild_storage_fd")) {
        Some(cut) => error[..cut].to_string(),
        None => error.to_string(),
    })
}

/// `DataLoader worker 1 (pid 42)`, as far as it is known.
fn worker_name(l: &LoaderFailure) -> String {
    match (l.worker, l.pid) {
        (Some(id), Some(pid)) => format!("DataLoader worker {id} (pid {pid})"),
        (Some(id), None) => format!("DataLoader worker {id}"),
        (None, Some(pid)) => format!("a DataLoader worker (pid {pid})"),
        (None, None) => "a DataLoader worker".to_string(),
    }
}

/// `exited with status 1`, and ` in `data.next` at step 4` where markers can say where.
fn consequence(r: &RankResult, foreign: bool) -> (String, String) {
    let code = r
        .exit_code
        .map_or("exited with an unobserved status".to_string(), |c| format!("exited with status {c}"));
    let at = if foreign && r.last_phase.is_none() { String::new() } else { format!(" {}", location(r)) };
    (code, at)
}

fn worker_headline(l: &LoaderFailure, r: &RankResult, foreign: bool) -> String {
    let (code, at) = consequence(r, foreign);
    let rank = r.rank;
    format!(
        "{} of rank {rank} failed first ({}); rank {rank} {code} as a consequence{at}.",
        worker_name(l).replacen("a DataLoader", "A DataLoader", 1),
        l.what
    )
}

pub fn worker_exception(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    let first = first?;
    let l = loader_failure(&first.text)?;
    if l.died || l.out_of_shm {
        return None;
    }
    let key = first.key.as_ref()?;
    let mut f = Finding::of(&DATALOADER_WORKER_EXCEPTION);
    let index = number_after(&key.text, "index ").map(|i| format!(", sample index {i}")).unwrap_or_default();
    let at = key.at.as_ref().map(|a| format!(" at `{a}`")).unwrap_or_default();
    let (code, loc) = consequence(first.result, ev.foreign);
    let r = first.rank();
    f.headline = Some(format!(
        "{} of rank {r} raised `{}` in the dataset{at}{index}; rank {r} {code} as a consequence{loc}.",
        worker_name(&l),
        key.text
    ));
    f.evidence.push(format!("culprit: {} of rank {r}: `{}`", worker_name(&l), key.render()));
    Some(f)
}

pub fn worker_killed(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    let first = first?;
    let l = loader_failure(&first.text)?;
    if !l.died || l.out_of_shm {
        return None;
    }
    let r = first.rank();
    let own_status =
        number_after(&l.what, "with exit code ").filter(|_| l.what.contains("exited unexpectedly"));
    let mut f = Finding::of(if own_status.is_some() { &WORKER_EXITED } else { &WORKER_KILLED_BY_SIGNAL });
    f.culprit = Some(r);
    f.headline = Some(worker_headline(&l, first.result, ev.foreign));
    f.evidence.push(format!("culprit: {} of rank {r} {}", worker_name(&l), l.what));
    let (code, _) = consequence(first.result, ev.foreign);
    f.evidence.push(format!("consequence: rank {r} noticed at once and {code}"));
    if !first.result.backtrace.is_empty() {
        f.evidence.push("the native backtrace below is the worker's, written by its crash handler".into());
    }
    let own_words = l.pid.and_then(|pid| worker_own_error(&first.text, pid, l.worker));
    if let Some(words) = &own_words {
        f.evidence.push(format!("the worker's last words in the rank's stderr: `{words}`"));
    } else if own_status.is_some() {
        // Workers share the rank's stderr, whose tail may have kept a sibling's words and not the
        // culprit's: quoted as the sibling's, never as the culprit's.
        let sibling = first
            .result
            .workers
            .iter()
            .filter(|w| Some(w.pid) != l.pid)
            .find_map(|w| worker_own_error(&first.text, w.pid, Some(w.id)).map(|words| (w, words)));
        if let Some((w, words)) = sibling {
            f.evidence.push(format!(
                "another worker of rank {r}, worker {} (pid {}), ended with: `{words}`",
                w.id, w.pid
            ));
        }
    }
    let how = l.what.as_str();
    f.cause = Some(if let Some(status) = own_status {
        format!(
            "The worker exited by itself with status {status}: it was not killed by a signal, and no exception \
             reached the rank.{}",
            match &own_words {
                Some(words) => format!(" Its last words: `{words}`."),
                None if status == 101 =>
                    " Status 101 is what a Rust panic exits with; no line of the worker's is \
                                          left in the rank's stderr tail."
                        .to_string(),
                None => " No line of the worker's is left in the rank's stderr tail.".to_string(),
            }
        )
    } else if how.contains("Killed") || how.contains("exited unexpectedly") || how.starts_with("was gone") {
        let no_oom = match ev.cgroup {
            Some(_) => "no OOM event was recorded for it (the scenario's memory cgroup counted no OOM kill)"
                .to_string(),
            None => {
                "no OOM event was recorded for it (the scenario ran without a memory cgroup of its own, so \
                     only the kernel log could have shown one)"
                    .to_string()
            }
        };
        if how.contains("Killed") {
            format!(
                "The worker ended without an exception, killed by SIGKILL; {no_oom}. Something outside the \
                 program sent it SIGKILL: an OOM kill is not established by the evidence here."
            )
        } else {
            // `(pid(s) N) exited unexpectedly`, or a batch that could not be taken from a worker
            // gone meanwhile: PyTorch saw it gone, not how.
            format!(
                "The worker ended without an exception reaching the rank, and PyTorch's words do not say how: a \
                 signal (a kill from outside, a crash) or an exit with a status of its own; {no_oom}, so an OOM \
                 kill is not established by the evidence here."
            )
        }
    } else if how.contains("signal") {
        "The worker crashed in native code while building a batch; the rank only sees that its worker is gone."
            .into()
    } else {
        "The worker exited on its own (an error in the dataset code, or a swallowed exception); its message is \
         in the log tail."
            .into()
    });
    f.next_step = Some(if ev.foreign {
        "The worker's own output is in the rank's stderr (workers share it); `num_workers=0` shows whether the \
         failure needs worker processes."
            .into()
    } else {
        "The worker's log lines are in the rank's stderr (workers share it); `--set data.workers=0` shows whether \
         the failure needs worker processes."
            .into()
    });
    Some(f)
}

/// What the worker with this pid said last before it ended, where the rank's stderr kept it: a
/// panic's message (`thread 'main' (PID) panicked at …` and the line after it), else the last
/// `error:` line that names the worker (`pid N`, or the built-in trainer's `worker ID:`). Cut to
/// 300 characters.
fn worker_own_error(text: &[String], pid: u32, id: Option<u32>) -> Option<String> {
    let tag = format!("({pid}) panicked at");
    let words = match text.iter().position(|l| l.contains(&tag)) {
        Some(i) => {
            text.get(i + 1).filter(|next| !next.trim().is_empty()).unwrap_or(&text[i]).trim().to_string()
        }
        None => {
            let pid = format!("pid {pid}");
            let id = id.map(|id| format!("data-loader worker {id}:"));
            let names =
                |l: &String| l.contains(&pid) || id.as_ref().is_some_and(|id| l.contains(id.as_str()));
            // The rank's own account of the worker's end ("… exited unexpectedly …") is not the
            // worker's words.
            let own = |l: &&String| {
                l.trim_start().starts_with("error:") && names(l) && !l.contains("exited unexpectedly")
            };
            text.iter().rev().find(own)?.trim().to_string()
        }
    };
    Some(match words.char_indices().nth(300) {
        Some((cut, _)) => format!("{}…", &words[..cut]),
        None => words,
    })
}

/// For a rank killed by SIGBUS, or one whose data-loader worker was: the `/dev/shm` figure at
/// that moment (evidence), and when `/dev/shm` was full, PyTorch's diagnosis and what to do.
fn bus_error_cause(
    scenario: &Scenario,
    failed: &RankResult,
    memory: &MemoryReport,
) -> Option<(String, Option<String>, String)> {
    let worker_pid = failed.error.as_deref().and_then(bus_error_worker_pid);
    if failed.signal != Some(Signal::BUS) && worker_pid.is_none() {
        return None;
    }
    let at_end: &ShmAt = memory.shm.at_rank_end.iter().find(|a| a.rank == failed.rank)?;
    // The rank measures `/dev/shm` the moment it notices a dead worker, before it removes its
    // ring: that figure, not the one after the rank cleaned up, is the one at the failure.
    let noticed = failed.error.as_deref().and_then(shm_held_when_noticed);
    let at = &match noticed {
        Some((used, total)) => ShmAt { used_bytes: used, total_bytes: total, ..at_end.clone() },
        None => at_end.clone(),
    };
    let who = match worker_pid {
        Some(pid) => {
            let id = memory.processes.iter().find(|p| p.pid == pid).and_then(|p| p.worker);
            match id {
                Some(id) => format!("worker {id} of rank {} (pid {pid})", failed.rank),
                None => format!("a data-loader worker of rank {} (pid {pid})", failed.rank),
            }
        }
        None => format!("rank {}", failed.rank),
    };
    let whose = whose_shm(scenario, memory);
    let percent = if at.total_bytes > 0 { at.used_bytes as f64 / at.total_bytes as f64 } else { 0.0 };
    let evidence = format!(
        "{whose} was at {} ({:.0}%) when {who} was killed by SIGBUS at {:.2} s",
        used_of(at.used_bytes, at.total_bytes),
        percent * 100.0,
        at.t_s
    );
    let next = "Give `/dev/shm` more room: raise `data.shm_size` here, Docker's `--shm-size` (its default \
                is 64 MB) or a Kubernetes `emptyDir` with `medium: Memory`; or keep the dataset cache out \
                of shared memory (`data.cache: disk`), or use fewer `data.workers` or a smaller \
                `data.prefetch`."
        .to_string();
    let cause = (percent >= SHM_FULL_SHARE).then(|| {
        format!(
            "Out of shared memory: {whose} was full ({}) and the next page written to a shared \
             segment could not be backed, so the kernel sent SIGBUS to {who}. PyTorch reports the same \
             situation as \"DataLoader worker (pid N) is killed by signal: Bus error. It is possible that \
             dataloader's workers are out of shared memory. Please try to raise your shared memory limit.\"",
            used_of(at.used_bytes, at.total_bytes)
        )
    });
    Some((evidence, cause, next))
}

fn whose_shm(scenario: &Scenario, memory: &MemoryReport) -> String {
    match &scenario.data.shm_size {
        Some(size) if memory.shm.private => {
            format!("the run's private `/dev/shm` (`data.shm_size` = `{size}`)")
        }
        _ => "the machine's `/dev/shm`".to_string(),
    }
}

/// `(used, total)` from the rank's `… /dev/shm held USED of TOTAL bytes]` tag.
fn shm_held_when_noticed(error: &str) -> Option<(u64, u64)> {
    let rest = &error[error.find(crate::protocol::SHM_HELD)? + crate::protocol::SHM_HELD.len()..];
    let mut words = rest.split_whitespace();
    let used = words.next()?.parse().ok()?;
    (words.next()? == "of").then_some(())?;
    let total = words.next()?.parse().ok()?;
    Some((used, total))
}

/// The worker pid in PyTorch's `DataLoader worker (pid N) is killed by signal: Bus error.`
fn bus_error_worker_pid(error: &str) -> Option<u32> {
    if !error.contains("Bus error") {
        return None;
    }
    number_after(error, "worker (pid ")
}

/// For a program's rank that failed for lack of shared memory (PyTorch's message, or SIGBUS): the
/// `/dev/shm` figure, its peak over the run (the failed segment is gone by the time the rank ends).
fn peak_shm_line(ev: &Evidence, failed: &RankEvidence, memory: &MemoryReport) -> Option<(String, f64)> {
    let out_of_shm = loader_failure(&failed.text).is_some_and(|l| l.out_of_shm)
        || failed.result.signal == Some(Signal::BUS)
        || shm_full_in_its_words(ev, failed).is_some()
        || full_when_it_died(ev, failed).is_some();
    if !out_of_shm {
        return None;
    }
    let (used, total) = (memory.shm.peak_used_bytes?, memory.shm.total_bytes?);
    let percent = if total > 0 { used as f64 / total as f64 } else { 0.0 };
    Some((
        format!(
            "{} peaked at {} ({:.0}%) during the run (sampled every {} ms; an allocation that failed took no room, \
             so the segment that did not fit is not in this figure)",
            whose_shm(ev.scenario, memory),
            used_of(used, total),
            percent * 100.0,
            (memory.interval_s * 1000.0).round()
        ),
        percent,
    ))
}

pub fn shm_exhausted(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    let first = first?;
    let mut f = Finding::of(&SHM_EXHAUSTED);
    if !ev.foreign {
        let (evidence, cause, next) = bus_error_cause(ev.scenario, first.result, ev.memory?)?;
        let cause = cause?;
        f.evidence.push(evidence);
        f.cause = Some(cause);
        f.next_step = Some(next);
        if let Some(l) = loader_failure(&first.text).filter(|l| l.died) {
            f.headline = Some(worker_headline(&l, first.result, ev.foreign));
        }
        return Some(f);
    }
    let peak = ev.memory.and_then(|m| peak_shm_line(ev, first, m));
    let loader = loader_failure(&first.text).filter(|l| l.out_of_shm);
    match (loader, shm_full_in_its_words(ev, first), full_when_it_died(ev, first)) {
        (Some(l), _, _) => {
            f.headline = Some(worker_headline(&l, first.result, ev.foreign));
            f.evidence.push(format!("culprit: {} of rank {}: {}", worker_name(&l), first.rank(), l.what));
        }
        (None, Some((error, object)), _) => {
            f.headline = Some(format!(
                "Rank {} could not create {object} in /dev/shm: `{error}`. /dev/shm is full (or too small for \
                 what the program needs).",
                first.rank()
            ));
            f.evidence.push(format!(
                "rank {}'s traceback ends in {object}, which lives in /dev/shm, with `{error}`",
                first.rank()
            ));
        }
        // A SIGBUS alone is shared memory only when the figure shows it full.
        (None, None, _)
            if first.result.signal == Some(Signal::BUS)
                && peak.as_ref().is_some_and(|(_, p)| *p >= SHM_FULL_SHARE) => {}
        // A SIGSEGV only when /dev/shm was full at the moment the rank died: native code that maps
        // a file of /dev/shm without checking that it got the room (DeepSpeed's shared-memory
        // all-reduce on a 16 KiB /dev/shm) touches memory it does not have.
        (None, None, Some((used, total))) => {
            f.headline = Some(format!(
                "Rank {} was killed by SIGSEGV while /dev/shm was full ({} when it died): native code that \
                 found no room for its shared memory crashed instead of raising an error.",
                first.rank(),
                used_of(used, total)
            ));
        }
        (None, None, _) => return None,
    }
    f.evidence.extend(peak.map(|(line, _)| line));
    Some(f)
}

/// `(used, total)` of `/dev/shm` at the moment a rank killed by SIGSEGV was seen to end, when it
/// was full then.
fn full_when_it_died(ev: &Evidence, rank: &RankEvidence) -> Option<(u64, u64)> {
    if rank.result.signal != Some(Signal::SEGV) {
        return None;
    }
    let at = ev.memory?.shm.at_rank_end.iter().find(|a| a.rank == rank.rank())?;
    let full = at.total_bytes > 0 && at.used_bytes as f64 >= SHM_FULL_SHARE * at.total_bytes as f64;
    full.then_some((at.used_bytes, at.total_bytes))
}

/// [`posix_shm_full`] in what the rank printed, or, for a rank whose own error is `No space left
/// on device` under a launcher (whose ranks share one output, so the traceback is the launcher's,
/// not the rank's: `spawn`'s ranks, torchrun's), in the launcher's quoted traceback and log tail.
fn shm_full_in_its_words(ev: &Evidence, rank: &RankEvidence) -> Option<(String, &'static str)> {
    posix_shm_full(&rank.text).or_else(|| {
        let error = rank.result.error.as_deref()?;
        let launcher = ev.launcher.filter(|_| error.contains("No space left on device"))?;
        let quoted: Vec<String> = launcher.quotes.iter().flat_map(|q| q.lines.iter().cloned()).collect();
        posix_shm_full(&quoted).or_else(|| posix_shm_full(&launcher.log_tail))
    })
}

/// The error and what could not be made, where a traceback ends in `No space left on device`
/// (`ENOSPC`) raised by what Python's multiprocessing keeps in `/dev/shm`: a semaphore
/// (`_multiprocessing.SemLock`, under every `Lock`, `Event` and `Queue`; a DataLoader with workers
/// makes several as its iterator starts), a `SharedMemory` segment, or a heap arena. On Linux each
/// is a file in `/dev/shm`, so the error says `/dev/shm` is full, whoever filled it.
fn posix_shm_full(text: &[String]) -> Option<(String, &'static str)> {
    let at = text.iter().rposition(|l| l.contains("No space left on device") && l.contains("Error"))?;
    let error = text[at].trim().to_string();
    let frames: Vec<&String> =
        text[..at].iter().rev().filter(|l| l.trim_start().starts_with("File \"")).take(2).collect();
    let innermost = frames.first()?;
    let object = if innermost.contains("multiprocessing/synchronize.py") {
        "a semaphore (multiprocessing's `SemLock`)"
    } else if innermost.contains("multiprocessing/shared_memory.py") {
        "a shared memory segment (multiprocessing's `SharedMemory`)"
    } else if innermost.contains("multiprocessing/heap.py") {
        "a shared memory arena (multiprocessing's heap)"
    } else {
        return None;
    };
    Some((error, object))
}

/// A run whose ranks stopped making progress after a DataLoader worker's process printed that it
/// could not put a batch into `/dev/shm`: multiprocessing's queue thread (`_feed`) moves a batch to
/// shared memory as it sends it, and when that fails it prints the traceback and drops the batch,
/// raising nothing, so the rank waits for it forever. The workers are named by the pid in the
/// segment's name (`/torch_<pid>_…`), and their ranks by the run's own process table.
pub fn shm_before_hang(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    let first = first?;
    if !matches!(first.result.outcome, OutcomeKind::Hung | OutcomeKind::TimedOut) {
        return None;
    }
    let printed = ev
        .ranks
        .iter()
        .flat_map(|r| r.text.iter())
        .chain(ev.launcher.into_iter().flat_map(|l| l.quotes.iter().flat_map(|q| q.lines.iter())))
        .chain(ev.launcher.into_iter().flat_map(|l| l.log_tail.iter()));
    let lines: Vec<&String> =
        printed.filter(|l| l.contains("unable to allocate shared memory(shm)")).collect();
    let line = lines.first()?;
    let pid_of =
        |l: &str| l.split("/torch_").nth(1).and_then(|rest| rest.split('_').next()?.parse::<u32>().ok());
    let processes = ev.memory.map(|m| m.processes.as_slice()).unwrap_or_default();
    let mut ranks: Vec<u32> = lines
        .iter()
        .filter_map(|l| pid_of(l))
        .filter_map(|pid| processes.iter().find(|p| p.pid == pid).map(|p| p.rank))
        .collect();
    ranks.sort_unstable();
    ranks.dedup();
    let mut f = Finding::of(&SHM_EXHAUSTED);
    let waiting = match ranks.as_slice() {
        [] => "The ranks stopped".to_string(),
        [one] => format!("Rank {one} stopped"),
        many => format!("Ranks {} stopped", many.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")),
    };
    f.headline = Some(format!(
        "{waiting} waiting for batches that never came: a DataLoader worker could not put a batch into /dev/shm \
         (`unable to allocate shared memory(shm)`), printed by the worker's queue thread, which raises nothing."
    ));
    if let Some((&low, rest)) = ranks.split_first() {
        f.culprit = Some(low);
        f.named = rest.to_vec();
    }
    f.evidence.push(format!(
        "printed before progress stopped, {} time(s), by {}: `{}`",
        lines.len(),
        if ranks.is_empty() {
            "a process this run could not place (no process of a rank had the pid in the segment's name)"
                .to_string()
        } else {
            format!("DataLoader workers of {}", super::observed::ranks_list(&ranks))
        },
        line.trim()
    ));
    if let Some(m) = ev.memory
        && let (Some(used), Some(total)) = (m.shm.peak_used_bytes, m.shm.total_bytes)
    {
        let percent = if total > 0 { used as f64 / total as f64 * 100.0 } else { 0.0 };
        f.evidence.push(format!(
            "{} peaked at {} ({percent:.0}%) during the run; the batch that did not fit took no room",
            whose_shm(ev.scenario, m),
            used_of(used, total)
        ));
    }
    f.cause = Some(format!(
        "{} The batch's segment could not be made as the worker sent it, so multiprocessing printed the error and \
         dropped the batch: nothing raises it, and without a DataLoader `timeout` the rank waits forever.",
        SHM_EXHAUSTED.explanation
    ));
    Some(f)
}

/// Evidence about `/dev/shm` for any verdict: the figure behind a bus error, what the run left
/// behind.
pub fn shm_lines(ev: &Evidence, failed: Option<&RankEvidence>) -> Vec<String> {
    let mut out = Vec::new();
    if let (Some(failed), Some(memory)) = (failed, ev.memory) {
        let line = if ev.foreign {
            peak_shm_line(ev, failed, memory).map(|(l, _)| l)
        } else {
            bus_error_cause(ev.scenario, failed.result, memory).map(|(l, _, _)| l)
        };
        out.extend(line);
    }
    let ours: Vec<_> = ev.leftovers.shm.iter().filter(|s| s.ours).collect();
    if !ours.is_empty() {
        let bytes: u64 = ours.iter().map(|s| s.allocated_bytes).sum();
        let removed = ours.iter().all(|s| s.removed);
        out.push(format!(
            "left {} in `/dev/shm` ({}){}",
            if ours.len() == 1 { "1 segment".to_string() } else { format!("{} segments", ours.len()) },
            human_bytes(bytes),
            if removed { ", removed by ups-doctor" } else { "; ups-doctor could not remove all of them" }
        ));
    }
    // Processes of an earlier, dead run (killed in its orphaned cgroup) are not this run's.
    let procs: Vec<_> = ev.leftovers.processes.iter().filter(|p| !p.earlier_run).collect();
    if !procs.is_empty() {
        let n = procs.len();
        out.push(format!(
            "{} of the run {} still alive after the ranks ended: {}",
            if n == 1 { "1 process".to_string() } else { format!("{n} processes") },
            if n == 1 { "was" } else { "were" },
            if procs.iter().all(|p| p.killed) { "killed by ups-doctor" } else { "not all could be killed" }
        ));
    }
    let ranks: Vec<RankResult> = ev.ranks.iter().map(|r| r.result.clone()).collect();
    if let Some(line) = input_bound(&ranks) {
        let fields = if ev.scenario.is_external() {
            "the DataLoader's `num_workers` or `prefetch_factor`"
        } else {
            "more workers (`data.workers`) or a larger `data.prefetch`"
        };
        out.push(format!("input-bound: {line}; try {fields}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(String::from).collect()
    }

    #[test]
    fn pytorchs_worker_messages_name_the_worker_its_pid_and_what_happened() {
        let shm = lines(
            "RuntimeError: Caught RuntimeError in DataLoader worker process 1.\nOriginal Traceback (most recent call last):\n\
             RuntimeError: unable to allocate shared memory(shm) for file </torch_4242_1827363_0>: Resource exhausted (12)",
        );
        let l = loader_failure(&shm).unwrap();
        assert_eq!((l.worker, l.pid, l.out_of_shm, l.died), (Some(1), Some(4242), true, false));
        let killed = lines(
            "RuntimeError: DataLoader worker (pid 11292) is killed by signal: Killed. \n\nTraceback (most recent call last):\n\
             RuntimeError: DataLoader worker (pid(s) 11292) exited unexpectedly",
        );
        let l = loader_failure(&killed).unwrap();
        assert_eq!(
            (l.worker, l.pid, l.died, l.what.as_str()),
            (None, Some(11292), true, "is killed by signal: Killed.")
        );
        let built_in = lines(
            "DataLoader worker (pid 7) exited unexpectedly with exit code 1. [data-loader worker 3 of rank 0, spawn]",
        );
        let l = loader_failure(&built_in).unwrap();
        assert_eq!(
            (l.worker, l.pid, l.what.as_str()),
            (Some(3), Some(7), "exited unexpectedly with exit code 1.")
        );
        assert!(loader_failure(&lines("Traceback (most recent call last):\nValueError: x")).is_none());
    }
}
