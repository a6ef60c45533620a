//! Ranks that do not meet: out of step in their collectives, a peer gone, a rendezvous that never
//! completed, two ranks on one GPU. (A collective that timed out: `timeout.rs`.)

use super::{Finding, Pattern};
use crate::diagnose::evidence::{EndedBy, Evidence, RankEvidence, Thread, failure_time, location};
use crate::scenario::OutcomeKind;
use crate::schema::RankResult;

pub const RANKS_OUT_OF_STEP: Pattern = Pattern {
    id: "ranks-out-of-step",
    title: "Ranks out of step",
    matches: "every failing rank hung, waiting in different collectives: from markers (one rank in \
              `dist.barrier` after its last step, another in step N's all-reduce) or from stacks (`barrier`, \
              `all_reduce`, `broadcast`, DDP's `Reducer::finalize_backward`, NCCL/gloo waits); from stacks \
              also when the time limit ended ranks that had all been silent past `limits.hang_after_s` (not \
              called hung because one kept using CPU: it spins or computes outside any collective); the rank \
              named is the one stuck outside any collective, else in `dist.barrier`, else the only one whose \
              collective no other rank is in, else the one the Flight Recorder shows never issued what every \
              other rank issued alike; none where two or more ranks each wait in a collective of their own",
    explanation: "Each rank waits for a collective the others will never join, so all block until a timeout \
                  (NCCL's watchdog fires after 10 minutes, gloo's after 30). A rank ran fewer steps or skipped \
                  a collective: uneven data shards, an early `break`/`continue` on one rank, or a condition that \
                  differs between ranks.",
    next_step: "Make every rank run the same number of steps and the same collectives: equal shards \
                (`DistributedSampler(drop_last=True)`), no rank-dependent `break`, or DDP's `join()` context \
                manager for uneven inputs.",
    reference: "https://pytorch.org/docs/stable/distributed.algorithms.join.html",
};

pub const PEER_LOST: Pattern = Pattern {
    id: "peer-lost",
    title: "Peer lost (collateral)",
    matches: "a rank's error is `Connection reset by peer` or `Connection closed by peer` after another rank \
              ended: that rank is collateral, the one that ended first is the culprit",
    explanation: "The rank's collective failed because the process at the other end of the connection was \
                  gone: its error is a consequence, not the cause.",
    next_step: "Look at the rank that ended first: its own end (signal, exit status, error) is the cause.",
    reference: "https://pytorch.org/docs/stable/distributed.html#debugging-torch-distributed-applications",
};

pub const RANK_LEFT_EARLY: Pattern = Pattern {
    id: "rank-left-early",
    title: "A rank left early",
    matches: "a rank exited with status 0 while another still expected it in a collective, which then failed \
              with `Connection closed by peer` or `Connection reset by peer`: the rank that left is the cause, the \
              one that lost it only noticed",
    explanation: "Every rank must run the same collectives. A rank that finished its loop sooner (a shorter data \
                  shard, a rank-dependent `break` or `return`, an early `sys.exit(0)`) left while another still \
                  expected it in its next collective, which failed when the connection closed.",
    next_step: "Make every rank run the same number of steps: equal shards (`DistributedSampler(drop_last=True)`), \
                no rank-dependent `break` or `exit`, or DDP's `join()` context manager for uneven inputs; compare \
                the steps each rank reported.",
    reference: "https://pytorch.org/docs/stable/distributed.algorithms.join.html",
};

pub const RENDEZVOUS_INCOMPLETE: Pattern = Pattern {
    id: "rendezvous-incomplete",
    title: "Rendezvous never completed",
    matches: "a rank failed or hung in `init_process_group` (a store timeout such as `Timed out after N \
              seconds waiting for clients. 1/2 clients joined.`, `DistStoreError`, `The client socket has timed \
              out`, stacks in the rendezvous, the built-in trainer's `dist.init` phase, or its own stack, written \
              as its launcher stopped it, inside `init_process_group`) while another rank had exited or never \
              started, or was still alive outside it (a rank that never reached it: still importing, waiting for a \
              lock, starved of a CPU; named with where its stack had it)",
    explanation: "`init_process_group` waits until all `WORLD_SIZE` ranks have joined the store; a rank that \
                  exited before it, never started, or was given another world size or address leaves the \
                  others waiting until the store's timeout (30 minutes by default).",
    next_step: "Find why the missing rank left or never arrived (its own output comes first); check that every \
                rank gets the same `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT`. A short `timeout=` in \
                `init_process_group` makes the wait fail fast.",
    reference: "https://pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group",
};

pub const RENDEZVOUS_PORT_IN_USE: Pattern = Pattern {
    id: "rendezvous-port-in-use",
    title: "Rendezvous port already in use",
    matches: "`EADDRINUSE` or `address already in use` with the port, in the launcher's or a rank's output \
              (`DistNetworkError: The server socket has failed to listen on any local network address. port: \
              29500, …, name: EADDRINUSE`); the process listening on it is named when it can be found",
    explanation: "The process that hosts the rendezvous store (torchrun's agent, or rank 0) could not listen \
                  on `MASTER_PORT`: another process holds it — a job still running, the leftover of an \
                  earlier run, or a second job given the same port — so the group could not form.",
    next_step: "Stop the process holding the port if it is a leftover of yours, or give this job another \
                port (`--master_port`, `MASTER_PORT`; torchrun's `--rdzv-endpoint localhost:0` or \
                `--standalone` picks a free one).",
    reference: "https://pytorch.org/docs/stable/elastic/run.html",
};

pub const DUPLICATE_GPU: Pattern = Pattern {
    id: "duplicate-gpu",
    title: "Two ranks on one GPU",
    matches: "NCCL's `Duplicate GPU detected : rank 1 and rank 0 both on CUDA device …`",
    explanation: "Two ranks were given the same GPU: NCCL needs one GPU per rank (`world_size` exceeds the GPUs \
                  of this machine, or `LOCAL_RANK` does not pick a GPU of its own).",
    next_step: "Run at most one CUDA rank per GPU (`world_size` ≤ GPUs; `torch.cuda.set_device(LOCAL_RANK)`), \
                or use CPU ranks (gloo) for a multi-rank reproduction on one GPU.",
    reference: "https://pytorch.org/docs/stable/notes/ddp.html",
};

/// The other collectives of `torch.distributed`, by the Python function a stack shows.
const OTHER_COLLECTIVES: [&str; 14] = [
    "all_gather_into_tensor",
    "all_gather_object",
    "broadcast_object_list",
    "reduce",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "monitored_barrier",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "send",
    "recv",
];

/// Which collective a stack waits in, innermost frame first.
pub fn collective_of(frames: &[crate::diagnose::evidence::StackFrame]) -> Option<&'static str> {
    frames
        .iter()
        .find_map(|f| {
            let func = f.function.as_str();
            Some(if func.contains("finalize_backward") {
                "DDP's gradient all-reduce (`Reducer::finalize_backward`, inside `loss.backward()`)"
            } else if func == "barrier" || func.ends_with("::barrier") {
                "`dist.barrier()`"
            } else if func == "all_reduce" || func.contains("allreduce") {
                "`all_reduce`"
            } else if func == "broadcast" || func.contains("::broadcast") {
                "`broadcast`"
            } else if func == "all_gather" || func.contains("allgather") {
                "`all_gather`"
            } else if func.contains("reduce_scatter") {
                "`reduce_scatter`"
            } else if func == "_engine_run_backward" {
                // Python frames only (`py-spy dump --nonblocking`, as `attach` takes them): DDP's
                // all-reduce runs inside the autograd engine, under this frame.
                "`loss.backward()` (DDP's gradient all-reduce waits inside it)"
            } else if func.contains("ProcessGroupNCCL") || func.contains("gloo::") {
                "a NCCL/gloo wait"
            } else if OTHER_COLLECTIVES.contains(&func)
                && f.place.as_deref().is_some_and(|p| p.contains("torch/distributed/"))
            {
                // Only torch's own: `gather` and `reduce` are common names (Accelerate's `gather`
                // computes before it calls torch's).
                "a `torch.distributed` collective"
            } else {
                return None;
            })
        })
        // The wait for a collective's work, whatever issued it (DeepSpeed's ZeRO gathers), where no
        // frame says which collective.
        .or_else(|| {
            frames
                .iter()
                .any(|f| f.function.contains("c10d::Work::wait"))
                .then_some("a collective's wait (`c10d::Work::wait`)")
        })
}

/// The rank's own main thread (not a child's), as the stacks show it.
pub(super) fn main_thread<'e>(rank: &'e RankEvidence) -> Option<&'e Thread> {
    let own: Vec<&Thread> = rank.threads.iter().filter(|t| !t.in_child).collect();
    own.iter().find(|t| t.name == "MainThread" || t.name == "main").or(own.first()).copied()
}

/// Phases where a stuck rank waits for the other ranks.
const COLLECTIVE_PHASES: [&str; 5] =
    ["dist.init", "dist.barrier", "allreduce", "allgather", "reduce_scatter"];

/// The only rank of `picked`, if there is exactly one.
fn alone(picked: Vec<&RankResult>) -> Option<&RankResult> {
    if picked.len() == 1 { picked.first().copied() } else { None }
}

/// From markers: when every failing rank hung and they wait in different places, the one that
/// caused it: the only rank stuck outside a collective (it holds the others up), else the only
/// rank furthest along, out of the training loop (`dist.barrier`, after its last step) or in a
/// later step's collective. `None` when no single rank stands out.
pub fn odd_rank_by_markers(ranks: &[RankResult]) -> Option<&RankResult> {
    let failed: Vec<&RankResult> = ranks.iter().filter(|r| r.outcome != OutcomeKind::Passed).collect();
    if failed.len() < 2 || failed.iter().any(|r| r.outcome != OutcomeKind::Hung || r.last_phase.is_none()) {
        return None;
    }
    let waits = |r: &RankResult| r.last_phase.as_deref().is_some_and(|p| COLLECTIVE_PHASES.contains(&p));
    let outside: Vec<&RankResult> = failed.iter().copied().filter(|r| !waits(r)).collect();
    if !outside.is_empty() {
        return alone(outside);
    }
    let along = |r: &RankResult| (r.last_phase.as_deref() == Some("dist.barrier"), r.last_step.unwrap_or(0));
    let furthest = failed.iter().map(|r| along(r)).max()?;
    if failed.iter().all(|r| along(r) == furthest) {
        return None;
    }
    alone(failed.into_iter().filter(|r| along(r) == furthest).collect())
}

/// What the stacks of hung ranks show: the odd rank, each rank's collective, and where the
/// kernel has each main thread.
struct StackWaits {
    /// `None` where every rank waits in a collective of its own (two ranks, each in another):
    /// the stacks show that they parted ways, not which of them left the program's order.
    odd: Option<u32>,
    waits: Vec<(u32, Option<&'static str>)>,
    kernel: Vec<String>,
}

/// From stacks: each hung rank's collective; the odd one is the rank whose wait no other rank
/// shares, `dist.barrier()` first (it left its loop early), or the one waiting in none. A rank
/// the time limit ended after it had been silent past `limits.hang_after_s` is stuck as a hung
/// one is (it was not called hung only because CPU was still used: a rank spinning, say).
fn odd_rank_by_stacks(ev: &Evidence) -> Option<StackWaits> {
    let hung: Vec<&RankEvidence> = ev.ranks.iter().filter(|r| r.failed()).collect();
    let stuck = |r: &RankEvidence| {
        r.result.outcome == OutcomeKind::Hung
            || crate::diagnose::evidence::silent_at_limit(r.result, ev.scenario).is_some()
    };
    if hung.len() < 2 || !hung.iter().all(|r| stuck(r)) {
        return None;
    }
    let waits: Vec<(u32, Option<&'static str>)> =
        hung.iter().map(|r| (r.rank(), main_thread(r).and_then(|t| collective_of(&t.frames)))).collect();
    let kernel: Vec<String> = hung
        .iter()
        .filter_map(|r| {
            Some(format!("rank {}'s main thread sits in {}", r.rank(), main_thread(r)?.wait.as_deref()?))
        })
        .collect();
    if waits.iter().filter(|(_, c)| c.is_some()).count() < 1 || waits.iter().all(|(_, c)| *c == waits[0].1) {
        return None;
    }
    let count = |c: Option<&str>| waits.iter().filter(|(_, o)| *o == c).count();
    let unique: Vec<&(u32, Option<&str>)> = waits.iter().filter(|(_, c)| count(*c) == 1).collect();
    let outside_or_barrier = unique
        .iter()
        .find(|(_, c)| c.is_none())
        .or_else(|| unique.iter().find(|(_, c)| *c == Some("`dist.barrier()`")));
    // The odd one is the only rank whose wait no other shares; where two or more waits are each
    // their own (two ranks, each in another collective), the one listed first is no odder than
    // the others (a rank that skipped a collective and one that waits in it look the same).
    let odd = match (outside_or_barrier, unique.as_slice()) {
        (Some(o), _) => Some(o.0),
        (None, [only]) => Some(only.0),
        _ => None,
    };
    Some(StackWaits { odd, waits: waits.clone(), kernel })
}

pub fn ranks_out_of_step(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    first?;
    let mut f = Finding::of(&RANKS_OUT_OF_STEP);
    let ranks: Vec<RankResult> = ev.ranks.iter().map(|r| r.result.clone()).collect();
    if let Some(odd) = odd_rank_by_markers(&ranks) {
        let stuck: Vec<&RankResult> = ranks.iter().filter(|r| r.outcome == OutcomeKind::Hung).collect();
        let places: Vec<String> = stuck
            .iter()
            .map(|r| format!("rank {} after {} steps {}", r.rank, r.steps_done, location(r)))
            .collect();
        f.culprit = Some(odd.rank);
        f.cause = Some(format!(
            "The ranks are out of step: {}. {} Rank {} stopped first.",
            places.join("; "),
            RANKS_OUT_OF_STEP.explanation,
            odd.rank
        ));
        return Some(f);
    }
    let Some(StackWaits { odd, waits, kernel }) = odd_rank_by_stacks(ev) else {
        return behind_by_recorder(ev, f);
    };
    let places: Vec<String> = waits
        .iter()
        .map(|(r, c)| match c {
            Some(c) => format!("rank {r} waits in {c}"),
            None => format!("rank {r} waits in no collective"),
        })
        .collect();
    let Some(odd) = odd else {
        return behind_by_recorder(ev, f.clone()).or_else(|| Some(parted_ways(ev, f, &places, &kernel)));
    };
    f.culprit = Some(odd);
    f.headline = Some(format!(
        "Ranks out of step: {}. Rank {odd} is the odd one: it {}.",
        places.join(", "),
        match waits.iter().find(|(r, _)| *r == odd).and_then(|(_, c)| *c) {
            Some("`dist.barrier()`") => in_barrier(ev, odd),
            Some(_) => "waits in a collective no other rank is in".to_string(),
            None => "is stuck outside any collective and holds the others up".to_string(),
        }
    ));
    f.evidence.push(format!("from py-spy stacks of each rank's main thread: {}", places.join("; ")));
    f.evidence.extend(super::group_count::group_count_evidence(ev));
    if !kernel.is_empty() {
        f.evidence.push(format!("the kernel: {}", kernel.join("; ")));
    }
    let outside = waits.iter().find(|(r, _)| *r == odd).is_some_and(|(_, c)| c.is_none());
    f.cause = Some(if outside {
        // Not a collective the others will never join: the rank has not come to it yet.
        let at = ev
            .ranks
            .iter()
            .find(|r| r.rank() == odd)
            .and_then(main_thread)
            .and_then(|t| program_frame(&t.frames))
            .map(|at| format!(", at `{at}` when its stack was taken"))
            .unwrap_or_default();
        format!(
            "The ranks are out of step: {}. Rank {odd} is behind, in its own work outside any collective{at}: a long \
             evaluation, I/O, a slow step, or a lock it waits on. The others wait in their collective until it comes, \
             or until the process group's timeout.",
            places.join("; ")
        )
    } else {
        format!("The ranks are out of step: {}. {}", places.join("; "), RANKS_OUT_OF_STEP.explanation)
    });
    Some(f)
}

/// Every stuck rank waits in a collective no other rank is in: they parted ways, and nothing here
/// says which rank left the program's order (one that skipped a collective waits in the next one,
/// as one that added a collective waits in that). No rank is named first.
fn parted_ways(ev: &Evidence, mut f: Finding, places: &[String], kernel: &[String]) -> Finding {
    f.undecided = true;
    f.headline = Some(format!(
        "Ranks out of step: {}. Each waits in a collective no other rank is in; which of them left the program's \
         order the stacks cannot tell.",
        places.join(", ")
    ));
    f.evidence.push(format!("from py-spy stacks of each rank's main thread: {}", places.join("; ")));
    f.evidence.extend(super::group_count::group_count_evidence(ev));
    if !kernel.is_empty() {
        f.evidence.push(format!("the kernel: {}", kernel.join("; ")));
    }
    f.cause = Some(format!(
        "The ranks are out of step: {}. One of them skipped a collective the others issued, or issued one they did \
         not: a condition that differs between ranks (a rank-dependent `if`, an early `continue`, uneven data).",
        places.join("; ")
    ));
    f.next_step = Some(
        "Run again with `TORCH_DISTRIBUTED_DEBUG=DETAIL`, which checks the collectives' order and shapes across ranks \
         and names the call where they differ; then look for the condition that differs between ranks on that path."
            .to_string(),
    );
    f
}

/// From the Flight Recorder, where neither markers nor stacks single a rank out: every failing
/// rank stuck, and one rank never issued the collective every other rank issued alike and waits
/// in (DDP's gradient all-reduce from C++ included): that rank is behind.
fn behind_by_recorder(ev: &Evidence, mut f: Finding) -> Option<Finding> {
    let stuck = |r: &RankEvidence| {
        r.result.outcome == OutcomeKind::Hung
            || crate::diagnose::evidence::silent_at_limit(r.result, ev.scenario).is_some()
    };
    let failing: Vec<&RankEvidence> = ev.ranks.iter().filter(|r| r.failed()).collect();
    if failing.len() < 2 || !failing.iter().all(|r| stuck(r)) {
        return None;
    }
    let (odd, d) = super::flight::behind(ev)?;
    let waiting: Vec<u32> = d.at.iter().filter(|(_, e)| e.is_some()).map(|(r, _)| *r).collect();
    let op = d.at.iter().find_map(|(_, e)| e.as_ref()).map(|e| e.render()).unwrap_or_default();
    f.culprit = Some(odd);
    let who = match waiting[..] {
        [one] => format!("rank {one} issued and waits in"),
        _ => format!("ranks {} issued and wait in", crate::diagnose::words::ranks_text(&waiting)),
    };
    f.headline = Some(format!(
        "Ranks out of step: rank {odd} never issued collective #{} of group `{}` ({op}), which {who}: rank {odd} \
         is behind and holds the others up.",
        d.seq, d.group,
    ));
    f.evidence.extend(super::group_count::group_count_evidence(ev));
    f.cause = Some(format!(
        "The ranks are out of step: the Flight Recorder of each rank (every collective, those DDP issues from C++ \
         included) shows rank {odd} never issued collective #{} that the others wait in. Rank {odd} is behind: in \
         its own work outside any collective (a long evaluation, I/O, a slow step, a lock), or it skipped a \
         collective the others issued. Its stack says which, where it can be taken (py-spy).",
        d.seq
    ));
    Some(f)
}

/// Why rank `odd` waits in `dist.barrier()` while the others wait in another collective, as far
/// as the step counts tell: fewer steps done than every other rank, it left its loop early. As
/// many as they, the counts cannot tell: a rank at a barrier after its last step and ranks inside
/// one more step (their gradient all-reduce comes before the step ends) count the same as a rank
/// that issued a barrier inside the step the others are in; where it waits is said instead. Counts
/// unknown, the old guess, said as one.
fn in_barrier(ev: &Evidence, odd: u32) -> String {
    let steps = |r: &RankEvidence| r.result.steps_done;
    let Some(mine) = ev.ranks.iter().find(|r| r.rank() == odd) else { return String::new() };
    let others: Vec<u64> = ev.ranks.iter().filter(|r| r.rank() != odd && r.failed()).map(steps).collect();
    let (done, known) = (steps(mine), !others.is_empty() && steps(mine) > 0);
    if known && others.iter().all(|o| done < *o) {
        let theirs: Vec<String> = others.iter().map(u64::to_string).collect();
        return format!(
            "left its training loop early: it had done {done} steps, the others {}",
            theirs.join(", ")
        );
    }
    if known && others.iter().all(|o| done == *o) {
        let at = main_thread(mine)
            .and_then(|t| program_frame(&t.frames))
            .map(|at| format!(" at `{at}`"))
            .unwrap_or_default();
        return format!(
            "waits in a `dist.barrier()`{at} that no other rank is in, with as many steps done as they ({done}): \
             a barrier after its last step while they are in one more, or one they did not issue there"
        );
    }
    "left its training loop early (a step fewer?) while the others still train".to_string()
}

/// The innermost frame of the program's own code (`<module> (slow.py:6)`): not torch's, the
/// standard library's or an installed package's.
pub(super) fn program_frame(frames: &[crate::diagnose::evidence::StackFrame]) -> Option<String> {
    frames.iter().find_map(|f| {
        let place = f.place.as_deref()?;
        // py-spy may print torch's files relative to site-packages (`torch/_tensor.py:630`).
        let torch = place.starts_with("torch/") || place.contains("/torch/");
        let own = place.contains(".py:") && !torch && crate::diagnose::evidence::is_user_path(place);
        own.then(|| format!("{} ({place})", f.function))
    })
}

/// The rank's line saying its peer went away.
pub fn lost_peer_line<'e>(rank: &'e RankEvidence) -> Option<&'e str> {
    // NCCL's own words for it too (`ncclRemoteError`, nvidia-nccl-cu13 2.28.9's `libnccl.so.2`).
    const NEEDLES: [&str; 4] = [
        "Connection reset by peer",
        "Connection closed by peer",
        "connection closed by peer",
        "remote process exited or there was a network error",
    ];
    let key = rank.key.as_ref().map(|k| k.text.as_str()).or(rank.result.error.as_deref())?;
    NEEDLES.iter().any(|n| key.contains(n)).then_some(key)
}

pub fn peer_lost(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    let first = first?;
    let lost: Vec<&RankEvidence> =
        ev.ranks.iter().filter(|r| r.rank() != first.rank() && lost_peer_line(r).is_some()).collect();
    if lost.is_empty() {
        return None;
    }
    let mut f = Finding::of(&PEER_LOST);
    for r in &lost {
        f.evidence.push(format!(
            "rank {} lost its peer: `{}`: collateral of rank {}'s end",
            r.rank(),
            lost_peer_line(r).unwrap_or_default(),
            first.rank()
        ));
    }
    let names: Vec<String> = lost.iter().map(|r| r.rank().to_string()).collect();
    f.cause = Some(format!(
        "Rank {}'s error is only the loss of its peer: the connection to rank {} closed when rank {} ended. {}",
        names.join(", "),
        first.rank(),
        first.rank(),
        PEER_LOST.next_step
    ));
    Some(f)
}

/// Every rank that failed only lost its peer, and a rank exited with status 0: that rank left
/// early. Not by timing (a rank's sockets close before its interpreter is done, so either end can
/// be seen first), but because no rank failed for a reason of its own.
pub fn left_early(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    let first = first?;
    let line = lost_peer_line(first)?;
    if ev.ranks.iter().any(|r| r.failed() && lost_peer_line(r).is_none()) {
        return None;
    }
    let left = ev
        .ranks
        .iter()
        .filter(|r| r.result.outcome == OutcomeKind::Passed && r.result.exit_code == Some(0))
        .min_by(|a, b| {
            let end = |r: &RankEvidence| r.result.ended_at_s.unwrap_or(f64::INFINITY);
            end(a).total_cmp(&end(b))
        })?;
    let counted = |r: &RankEvidence| r.result.observed.is_some() || r.result.markers > 0;
    let steps = |r: &RankEvidence, how: &str, after: &str| {
        let n = r.result.steps_done;
        if counted(r) {
            format!("{how}{n} step{}{after}", if n == 1 { "" } else { "s" })
        } else {
            String::new()
        }
    };
    let mut f = Finding::of(&RANK_LEFT_EARLY);
    f.headline = Some(format!(
        "Rank {} left early: it exited with status 0{} while rank {}{} still expected it in a collective, which \
         failed when the connection closed (`{}`).",
        left.rank(),
        steps(left, " after ", ""),
        first.rank(),
        steps(first, " (", " done)"),
        short(line)
    ));
    let at = |t: Option<f64>| t.map(|t| format!(" at {t:.2} s")).unwrap_or_default();
    f.evidence.push(format!(
        "rank {} exited with status 0{}{}",
        left.rank(),
        at(left.result.ended_at_s),
        steps(left, ", ", " reported")
    ));
    f.evidence.push(format!(
        "rank {} failed{} only because its peer was gone: `{}`; no rank failed for a reason of its own",
        first.rank(),
        at(first.result.ended_at_s),
        line.trim()
    ));
    Some(f)
}

/// A lost-peer error without gloo's source path: `Connection closed by peer [127.0.0.1]:25742`.
fn short(line: &str) -> &str {
    ["Connection closed by peer", "Connection reset by peer", "connection closed by peer"]
        .iter()
        .find_map(|n| line.find(n).map(|at| line[at..].trim()))
        .unwrap_or(line)
}

/// `1/2 clients joined` → (1, 2).
fn clients_joined(text: &str) -> Option<(u32, u32)> {
    let before = text.split(" clients joined").next()?;
    let frac = before.rsplit(' ').next()?;
    let (a, b) = frac.split_once('/')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

fn at_rendezvous(rank: &RankEvidence) -> bool {
    const NEEDLES: [&str; 5] = [
        "waiting for clients",
        "clients joined",
        "DistStoreError",
        "The client socket has timed out",
        "Socket Timeout",
    ];
    let said = rank.key.as_ref().is_some_and(|k| NEEDLES.iter().any(|n| k.text.contains(n)));
    // A rank whose markers place it past `dist.init` has joined: a store frame then belongs to a
    // later wait (the built-in trainer's `dist.barrier` goes through the same TCPStore), so only
    // Python's own `init_process_group` frame still says rendezvous.
    let past_init = rank.result.last_phase.as_deref().is_some_and(|p| p != "dist.init");
    let in_init = main_thread(rank).is_some_and(|t| {
        t.frames.iter().any(|f| {
            f.function.contains("init_process_group")
                || (!past_init && (f.function.contains("rendezvous") || f.function.contains("TCPStore")))
        })
    });
    let stuck = rank.result.outcome == OutcomeKind::Hung
        && (in_init || rank.result.last_phase.as_deref() == Some("dist.init"));
    said || stuck || stopped_in_init(rank)
}

/// A rank that someone else stopped (its launcher, ups-doctor, a signal from outside) while its
/// own stack, written as the signal came, shows it inside `init_process_group` (or, killed
/// without one, its observer saw it enter and never return): it was waiting
/// for the group to form, not failing by itself. Python's own `init_process_group` frame only:
/// a store frame may be a later wait.
fn stopped_in_init(rank: &RankEvidence) -> bool {
    let stopped = matches!(
        rank.ended_by,
        EndedBy::Launcher { .. } | EndedBy::Cluster | EndedBy::Teardown { .. } | EndedBy::Outside { .. }
    );
    // Its stack as the signal came, or (a SIGKILL writes none) its observer: it entered
    // `init_process_group` and never returned from it.
    let never_returned = rank.result.observed.as_ref().is_some_and(|o| o.joining && o.group.is_none());
    stopped
        && rank.key.is_none()
        && (never_returned
            || main_thread(rank).is_some_and(|t| t.frames.iter().any(|f| f.function == "init_process_group")))
}

pub fn rendezvous_incomplete(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    first?;
    let waiting = ev.ranks.iter().find(|r| r.failed() && at_rendezvous(r))?;
    let waited_until = failure_time(waiting.result);
    let absent: Vec<&RankEvidence> = ev
        .ranks
        .iter()
        .filter(|r| {
            r.rank() != waiting.rank()
                && (r.result.outcome == OutcomeKind::LaunchFailed
                    || (r.result.ended_at_s.is_some_and(|t| t <= waited_until) && !at_rendezvous(r)))
        })
        .collect();
    // Ranks alive when the hang was declared (their process known) that never entered
    // `init_process_group`: they hold the rendezvous up, still starting (a slow import, a lock
    // another job holds, a download, a CPU they wait for). Seen: a rank started at nice 19 beside a busy loop on its CPU was still
    // importing torch 60 s on, and the verdict said "the one that did not come ended before it
    // was found" of a rank whose stack it held.
    let late: Vec<&RankEvidence> = ev
        .ranks
        .iter()
        .filter(|r| {
            r.rank() != waiting.rank()
                && r.result.outcome == OutcomeKind::Hung
                && r.result.pid.is_some()
                && !at_rendezvous(r)
                && r.result.observed.as_ref().is_none_or(|o| !o.joining && o.group.is_none())
        })
        .collect();
    let mut f = Finding::of(&RENDEZVOUS_INCOMPLETE);
    let mut gone: Vec<String> = absent
        .iter()
        .map(|r| {
            let res = r.result;
            let how = match (res.outcome, res.exit_code, res.signal) {
                (OutcomeKind::LaunchFailed, _, _) => "never started".to_string(),
                (_, Some(c), _) => format!("exited with status {c}"),
                (_, _, Some(s)) => format!("was killed by {s}"),
                _ => "ended".to_string(),
            };
            let at = res.ended_at_s.map(|t| format!(" at {t:.1} s")).unwrap_or_default();
            format!("rank {} {how}{at} without joining", r.rank())
        })
        .collect();
    gone.extend(late.iter().map(|r| {
        format!(
            "rank {} had not entered `init_process_group` when the hang was declared: it was still {}",
            r.rank(),
            where_it_was(r)
        )
    }));
    let joined = waiting.key.as_ref().and_then(|k| clients_joined(&k.text));
    if let Some((n, m)) = joined {
        f.evidence.push(format!("the store saw {n} of {m} ranks join"));
    }
    let said = waiting.key.as_ref().map(|k| format!(": `{}`", k.text)).unwrap_or_default();
    if let Some(f) = copies_that_start_their_own_ranks(ev, waiting) {
        return Some(f);
    }
    let why = if !gone.is_empty() {
        gone.join("; ")
    } else if stopped_in_init(waiting) && joined.is_none() {
        "no rank of this run was seen to leave: the one that did not come ended before it was found"
            .to_string()
    } else if let Some((n, m)) = joined {
        format!(
            "only {n} of {m} ranks joined, and no rank of this run left early: a rank may have been given another world size or address"
        )
    } else {
        "no other rank is known to have left: check `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT` on every rank".to_string()
    };
    f.culprit = absent.iter().find(|r| r.failed()).map(|r| r.rank());
    if f.culprit.is_none()
        && let [one] = late[..]
    {
        f.culprit = Some(one.rank());
    }
    // A rank that left raising an exception of its own (a module missing on its node, a bad
    // config) failed for that reason: its error is the verdict, not the rendezvous it never
    // reached (the generic failure headline leads with it, and the waiting rank is collateral).
    if absent.iter().any(|r| r.failed() && r.key.as_ref().is_some_and(|k| k.is_exception())) {
        return None;
    }
    // A rank its launcher stopped while it waited, with no rank of the run seen to leave: the one
    // that did not come ended before it was found (a launcher's rank that exited during its
    // imports). Nobody is the first failure; the launcher's own words, where it said which of its
    // processes ended, are quoted.
    if f.culprit.is_none() && stopped_in_init(waiting) {
        f.undecided = true;
        let said = ev.launcher.into_iter().flat_map(|l| l.log_tail.iter()).rfind(|l| {
            l.contains(" terminated with ")
                && (l.contains("process ") || l.contains("Child process with PID"))
        });
        if let Some(line) = said {
            f.evidence.push(format!("the launcher said: `{}`", line.trim()));
        }
    }
    f.headline = Some(format!(
        "The rendezvous never completed: {why}; rank {} waited in `init_process_group` and {}{said}.",
        waiting.rank(),
        if waiting.result.outcome == OutcomeKind::Hung {
            "was stopped"
        } else if stopped_in_init(waiting) {
            "was stopped there"
        } else {
            "gave up"
        },
    ));
    Some(f)
}

/// Where a rank that never reached `init_process_group` was, by its main thread's stack: the
/// program's own line (`in <module> (train.py:16)`), else its innermost Python frame, else the
/// system call the kernel had it in (a program that is not Python: `flock` waiting for a lock).
fn where_it_was(rank: &RankEvidence) -> String {
    let frames = main_thread(rank).map(|t| t.frames.as_slice()).unwrap_or_default();
    let python = frames.iter().find(|f| f.place.as_deref().is_some_and(|p| p.contains(".py:")));
    let inner = python.map(|f| format!("`{}` ({})", f.function, f.place.as_deref().unwrap_or_default()));
    // Its main thread as the kernel had it, where no Python stack was read (a program that is
    // not Python): its system call and wait channel.
    let kernel = || {
        let dump = rank.result.dumps.iter().find(|d| d.role == crate::schema::ProcessRole::Rank)?;
        let t = dump.threads.iter().find(|t| t.tid == dump.pid)?;
        let wait = match (&t.syscall, &t.wchan) {
            (Some(call), Some(chan)) => format!("system call {call}, waiting in `{chan}`"),
            (Some(call), None) => format!("system call {call}"),
            (None, Some(chan)) => format!("kernel, waiting in `{chan}`"),
            (None, None) => return None,
        };
        Some(format!("in the {wait} (its process `{}`)", t.name))
    };
    match (program_frame(frames), inner) {
        (Some(own), Some(inner)) if !inner.contains(own.split_once(" (").map_or("", |(_, p)| p)) => {
            format!("in {own}, inside {inner}")
        }
        (Some(own), _) => format!("in {own}"),
        (None, Some(inner)) => format!("in {inner}"),
        (None, None) => kernel().unwrap_or_else(|| "starting (no stack of it was taken)".to_string()),
    }
}

/// A rendezvous that could not complete because of how ups-doctor ran the command: it started one
/// copy per rank itself, each with torchrun's variables (`LOCAL_RANK`, `WORLD_SIZE`), and a copy
/// entered `init_process_group` for a larger world than the copies started. The program starts
/// its own ranks (ups-doctor found no launcher in what it read of it), and those variables told it
/// they had been started already: it waited for ranks nobody started. Seen with litgpt's CLI
/// (`litgpt finetune_lora … --devices 2`, Fabric inside a subcommand's module), which under
/// ups-doctor waited forever and alone trains: the run's hang is ups-doctor's, said as such.
fn copies_that_start_their_own_ranks(ev: &Evidence, waiting: &RankEvidence) -> Option<Finding> {
    let started = ev.ranks.len() as u32;
    let wanted = waiting.result.observed.as_ref()?.joining_world_size?;
    if !ev.foreign || ev.launcher.is_some() || wanted <= started {
        return None;
    }
    let program = ev
        .scenario
        .command
        .as_deref()
        .and_then(|c| c.first())
        .map_or("the command", |c| c.rsplit('/').next().unwrap_or(c));
    let copies = if started == 1 { "one copy".to_string() } else { format!("{started} copies") };
    let mut f = Finding::of(&RENDEZVOUS_INCOMPLETE);
    f.undecided = true;
    f.headline = Some(format!(
        "The rendezvous never completed because of how ups-doctor ran `{program}`: it started {copies} itself, \
         each with torchrun's variables (`LOCAL_RANK`, `WORLD_SIZE`), and rank {} entered `init_process_group` \
         for a world of {wanted}: the program starts its own ranks, and those variables told it they were \
         started already.",
        waiting.rank()
    ));
    f.evidence.push(format!(
        "from the observer: rank {} entered `init_process_group` for a world of {wanted}; ups-doctor started \
         {copies} of the command (style `per_rank`)",
        waiting.rank()
    ));
    let chosen = match ev.scenario.launch.style {
        crate::scenario::LaunchStyle::Auto => {
            "`launch.style: auto` found no launcher in what it read of the command (its script, or a console \
             script, its entry module and its subcommand's module), so it ran the command as one copy per rank"
        }
        _ => "the run named the style `per_rank`, one copy of the command per rank",
    };
    f.cause = Some(format!(
        "ups-doctor's doing, not the program's: {chosen}; a program that starts its ranks itself (Lightning's and \
         Fabric's launcher) then takes those variables for a launcher's and starts none."
    ));
    f.next_step = Some(
        "Run it again with `--style launcher` (`launch.style: launcher`): ups-doctor then starts the command once \
         and finds the ranks it starts."
            .into(),
    );
    Some(f)
}

pub fn duplicate_gpu(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    first?;
    let line = ev.ranks.iter().find_map(|r| r.line_with("Duplicate GPU detected"))?;
    let mut f = Finding::of(&DUPLICATE_GPU);
    f.evidence.push(format!("NCCL: `{}`", line.trim()));
    Some(f)
}

/// A store that could not listen on its port: the launcher's output (no rank started), or the
/// rank whose output says so.
pub fn port_in_use(ev: &Evidence, _first: Option<&RankEvidence>) -> Option<Finding> {
    let from_launcher = ev.launcher.and_then(|l| {
        let held = l.port_in_use.clone();
        crate::schema::port_in_use_line(&l.log_tail).map(|(port, line)| (port, line.to_string(), held))
    });
    let from_rank = ev.ranks.iter().find_map(|r| {
        crate::schema::port_in_use_line(&r.text).map(|(port, line)| (r.rank(), port, line.to_string()))
    });
    let mut f = Finding::of(&RENDEZVOUS_PORT_IN_USE);
    let held_by = |held: Option<&crate::schema::PortInUse>| match held {
        Some(crate::schema::PortInUse { holder_pid: Some(pid), holder_command, .. }) => {
            let cmd = holder_command.as_deref().unwrap_or_default();
            let cmd: String = cmd.chars().take(80).collect();
            format!(", held by process {pid} (`{cmd}`)")
        }
        _ => String::new(),
    };
    match (from_launcher, from_rank) {
        (Some((port, line, held)), _) => {
            let started = ev.ranks.iter().any(|r| r.result.pid.is_some());
            let launcher = ev
                .scenario
                .command
                .as_deref()
                .and_then(|c| c.first())
                .map_or("the launcher", |c| c.rsplit('/').next().unwrap_or(c));
            f.headline = Some(format!(
                "The rendezvous port {port} was already in use (`EADDRINUSE`){}: `{launcher}` could not open its \
                 store{}.",
                held_by(held.as_ref()),
                if started { "" } else { ", and no rank started" }
            ));
            f.evidence.push(format!("the launcher said: `{}`", line.trim()));
            if held.as_ref().is_some_and(|h| h.holder_pid.is_none()) {
                f.evidence.push(format!("no process was listening on port {port} when the launcher ended: it was freed since, or held in another network namespace"));
            }
        }
        (None, Some((rank, port, line))) => {
            f.culprit = Some(rank);
            f.headline = Some(format!(
                "Rank {rank} could not open the rendezvous store: port {port} was already in use (`EADDRINUSE`)."
            ));
            f.evidence.push(format!("rank {rank} said: `{}`", line.trim()));
        }
        (None, None) => return None,
    }
    Some(f)
}
