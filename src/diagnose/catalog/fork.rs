//! What goes wrong in a process forked from one whose runtimes had started: OpenMP's thread pool
//! and CUDA.

use super::{Finding, Pattern};
use crate::diagnose::evidence::{Evidence, RankEvidence, StackFrame, Thread};
use crate::scenario::StartMethod;

pub const FORK_AFTER_THREADS: Pattern = Pattern {
    id: "fork-after-threads",
    title: "Fork after threads (OpenMP deadlock)",
    matches: "a forked child (a DataLoader worker, an `os.fork()` child, a `multiprocessing` fork) stuck with \
              GNU OpenMP frames (`libgomp`, `GOMP_parallel`, `gomp_team_barrier_wait_end`, an `_omp_fn`) on \
              its stack",
    explanation: "libtorch's intra-op thread pool is GNU OpenMP. A process forked after the pool had run \
                  inherits its state but not its threads, so the child's first parallel operation (a large \
                  matmul, an element-wise op on a big tensor) waits for threads that do not exist: a deadlock.",
    next_step: "Use the `spawn` (or `forkserver`) start method (`multiprocessing_context='spawn'` for a \
                DataLoader), or call `torch.set_num_threads(1)` first thing in the child (a \
                `worker_init_fn`), or fork before any multi-threaded work.",
    reference: "https://pytorch.org/docs/stable/notes/multiprocessing.html",
};

pub const CUDA_IN_FORKED_CHILD: Pattern = Pattern {
    id: "cuda-in-forked-child",
    title: "CUDA initialised in a forked child",
    matches: "`Cannot re-initialize CUDA in forked subprocess` (PyTorch), or libtorch's `CUDA error: \
              initialization error` in a forked DataLoader worker",
    explanation: "CUDA cannot be used in a process forked from one that already initialised it. PyTorch says: \
                  `Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must \
                  use the 'spawn' start method`.",
    next_step: "Use the `spawn` start method, or keep the dataset on the CPU in workers and move each batch to \
                the GPU in the main process (pinned memory, `non_blocking=True`).",
    reference: "https://pytorch.org/docs/stable/notes/multiprocessing.html#cuda-in-multiprocessing",
};

/// What libtorch says when a forked child touches CUDA that its parent had initialised.
pub const CUDA_AFTER_FORK: &str = "CUDA error: initialization error";
/// PyTorch's words for the same situation, which users search for.
pub const PYTORCH_FORK_TEXT: &str = "Cannot re-initialize CUDA in forked subprocess";

fn in_openmp(f: &StackFrame) -> bool {
    f.mentions("libgomp")
        || f.function.starts_with("GOMP_")
        || f.function.starts_with("gomp_")
        || f.function.contains("_omp_fn")
}

pub fn fork_after_threads(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    first?;
    let (rank, thread): (&RankEvidence, &Thread) = ev.ranks.iter().filter(|r| r.failed()).find_map(|r| {
        r.threads.iter().find(|t| t.in_child && t.frames.iter().any(in_openmp)).map(|t| (r, t))
    })?;
    let mut f = Finding::of(&FORK_AFTER_THREADS);
    f.culprit = Some(rank.rank());
    // A frame in libgomp itself reads best (`GOMP_parallel`, `gomp_team_barrier_wait_end`).
    let frame = thread
        .frames
        .iter()
        .find(|fr| fr.mentions("libgomp"))
        .or_else(|| thread.frames.iter().find(|fr| in_openmp(fr)))
        .expect("found above");
    let place = frame.place.as_deref().map(|p| format!(" ({p})")).unwrap_or_default();
    let own = thread
        .frames
        .iter()
        .find(|fr| fr.place.as_deref().is_some_and(|p| p.contains(".py:") && !p.contains("site-packages")))
        .map(|fr| format!(", called from `{} ({})`", fr.function, fr.place.as_deref().unwrap_or_default()))
        .unwrap_or_default();
    let who = match thread.pid {
        Some(pid) => format!("a child process of rank {} (pid {pid})", rank.rank()),
        None => format!("data-loader worker `{}` of rank {}", thread.name, rank.rank()),
    };
    f.headline =
        Some(format!("Fork after threads: {who} deadlocked in OpenMP at `{}`{place}{own}.", frame.function));
    f.evidence.push(format!(
        "{who}: thread `{}` waits in `{}`{place}; the stack has {} frames, innermost first",
        thread.name,
        frame.function,
        thread.frames.len()
    ));
    f.cause = Some(if ev.foreign {
        FORK_AFTER_THREADS.explanation.to_string()
    } else {
        format!(
            "Data-loader worker `{}` is stuck in an OpenMP (libgomp) barrier: it was forked after the trainer's \
             intra-op thread pool had run, and the pool's threads do not exist in the child, so its first \
             parallel op waits for them forever (fork after multi-threaded work deadlocks). Call \
             `torch.set_num_threads(1)` first in the worker (`data.worker_threads: one`), or use \
             `start_method: spawn`.",
            thread.name
        )
    });
    Some(f)
}

pub fn cuda_in_forked_child(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    first?;
    let forked = ev.scenario.data.workers > 0 && ev.scenario.data.start_method == StartMethod::Fork;
    let (rank, line) = ev.ranks.iter().filter(|r| r.failed()).find_map(|r| {
        r.line_with(PYTORCH_FORK_TEXT)
            .or_else(|| (forked && !ev.foreign).then(|| r.line_with(CUDA_AFTER_FORK)).flatten())
            .map(|l| (r, l))
    })?;
    let mut f = Finding::of(&CUDA_IN_FORKED_CHILD);
    f.culprit = Some(rank.rank());
    f.evidence.push(if ev.foreign {
        format!("rank {}: `{}`", rank.rank(), line.trim())
    } else {
        format!(
            "rank {}'s data-loader worker failed with libtorch's `{CUDA_AFTER_FORK}`: it was forked after the \
             rank had initialised CUDA, and it touched CUDA (`data.cache_device: {}`)",
            rank.rank(),
            if ev.scenario.data.cache_device == crate::scenario::CacheDevice::Cuda { "cuda" } else { "cpu" }
        )
    });
    if !ev.foreign {
        f.next_step = Some(
            "use `data.start_method: spawn`, or keep the dataset on the CPU (`data.cache_device: cpu`) and let \
             the rank move each batch to the GPU (pinned memory, non-blocking copy)"
                .into(),
        );
    }
    Some(f)
}
