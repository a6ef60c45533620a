//! A collective that timed out: NCCL's watchdog, gloo's wait for a peer. The rank that timed out is
//! the one that waited; the cause is the rank it waited for. That rank is named from the process
//! group's own count of collectives (the observer reads it on every rank; it counts DDP's gradient
//! reductions, issued from C++, too): a rank that had issued fewer had not reached the collective.
//! Without every rank's count, or where the counts agree, the verdict says it cannot tell, and
//! calls no rank collateral: the first to time out is the one that waited longest, not a cause.

use super::observed::ranks_list;
use super::{Finding, Pattern};
use crate::diagnose::evidence::{EndedBy, Evidence, RankEvidence};

pub const NCCL_WATCHDOG_TIMEOUT: Pattern = Pattern {
    id: "nccl-watchdog-timeout",
    title: "NCCL watchdog timeout",
    matches: "`Watchdog caught collective operation timeout: WorkNCCL(SeqNum=…, OpType=…, …)` in a rank's \
              output; the rank it waited for is named as for `collective-timeout`, from the process group's own \
              count of collectives",
    explanation: "A NCCL collective did not complete within the process group's timeout (10 minutes by \
                  default): another rank never joined it (ranks out of step, a rank stuck or gone), so the \
                  watchdog aborted the communicator and the process.",
    next_step: "Find the rank that did not reach the collective with this SeqNum: the others' last steps and \
                stacks say where each waited. `TORCH_NCCL_TRACE_BUFFER_SIZE` enables the NCCL flight recorder \
                for the next run.",
    reference: "https://pytorch.org/docs/stable/torch_nccl_environment_variables.html",
};

pub const COLLECTIVE_TIMEOUT: Pattern = Pattern {
    id: "collective-timeout",
    title: "A collective timed out",
    matches: "the first rank to fail gave up waiting in a collective: gloo's `Timed out waiting 8000ms for recv \
              operation to complete` (or `send`). The rank it waited for is named only where every rank's \
              observer read the process group's own count of collectives (DDP's gradient reductions, issued from \
              C++, included) and a rank had issued fewer than the one that timed out: it had not reached the \
              collective. Otherwise the verdict says which rank was waited for cannot be told, and calls none \
              collateral",
    explanation: "A collective waits for every rank of its group; when one has not joined it within the group's \
                  `timeout` (gloo's default is 30 minutes; `init_process_group(timeout=…)` sets it) the rank \
                  waiting gives up with this error, and its launcher then stops the others. The rank that timed out \
                  is the one that waited, not the cause: the cause is the rank that had not arrived, still busy \
                  outside collectives (a long evaluation or checkpoint on one rank, a slow disk, a stall), stuck, \
                  or on a path that skipped the collective.",
    next_step: "Look at what the rank it waited for was doing instead: its last output, its last step. Work that \
                one rank does alone (saving, evaluating) must finish within the group's timeout, or the others \
                must wait for it outside collectives; a rank-dependent path that skips a collective must not. \
                With `limits.hang_after_s` below the group's timeout, ups-doctor takes every rank's stack while \
                they wait, before the group gives up.",
    reference: "https://pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group",
};

/// gloo's `Timed out waiting 8000ms for recv operation to complete` → 8000.
fn gloo_timeout_ms(line: &str) -> Option<u64> {
    const LEAD: &str = "Timed out waiting ";
    let rest = &line[line.find(LEAD)? + LEAD.len()..];
    let (ms, after) = rest.split_once("ms for ")?;
    (after.starts_with("recv operation") || after.starts_with("send operation")).then_some(())?;
    ms.trim().parse().ok()
}

/// `8000` → `8 s`; `1800000` → `30 min`.
fn duration(ms: u64) -> String {
    if ms >= 120_000 && ms.is_multiple_of(60_000) {
        format!("{} min", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

/// Every rank's count of the collectives issued on its default group, where every rank's
/// observer read it.
fn counts(ev: &Evidence) -> Option<Vec<(u32, u64)>> {
    let counts: Vec<(u32, u64)> = ev
        .ranks
        .iter()
        .map(|r| Some((r.rank(), r.result.observed.as_ref()?.issued?)))
        .collect::<Option<_>>()?;
    (counts.len() >= 2).then_some(counts)
}

/// What is known of the ranks waited for, against the collective the waiting rank gave up in:
/// the ranks behind it in the group's count (each with its count) and the evidence lines.
struct WaitedFor {
    behind: Vec<(u32, u64)>,
    /// Why no rank can be named, where none is behind.
    unknown: Option<String>,
    evidence: Vec<String>,
}

/// The ranks that had not reached the waiting rank's collective `reached` (its place in the
/// group's count): those whose count is lower.
fn waited_for(ev: &Evidence, waiter: &RankEvidence, reached: Option<u64>) -> WaitedFor {
    let mut evidence = Vec::new();
    let Some(counts) = counts(ev) else {
        return WaitedFor {
            behind: Vec::new(),
            unknown: Some(
                "the observer did not read every rank's count of collectives (it is off with `--no-observe`, and \
                 reads none before a process group forms)"
                    .into(),
            ),
            evidence,
        };
    };
    let own = counts.iter().find(|(r, _)| *r == waiter.rank()).map(|(_, n)| *n);
    let Some(reached) = reached.or(own) else {
        return WaitedFor {
            behind: Vec::new(),
            unknown: Some("its own count is not known".into()),
            evidence,
        };
    };
    let behind: Vec<(u32, u64)> =
        counts.iter().filter(|(r, n)| *r != waiter.rank() && *n < reached).copied().collect();
    let each: Vec<String> = counts.iter().map(|(r, n)| format!("rank {r} {n}")).collect();
    evidence.push(format!(
        "the process group's own count of the collectives each rank issued (DDP's, from C++, included): {}; \
         rank {} gave up in #{reached}",
        each.join(", "),
        waiter.rank()
    ));
    let gave_up_at = waiter.result.ended_at_s;
    for (rank, n) in &behind {
        let Some(r) = ev.rank(*rank) else { continue };
        let res = r.result;
        let last = match res.last_marker_at_s {
            Some(t) => {
                let before =
                    gave_up_at.map(|g| format!(", {:.1} s before rank {} gave up", g - t, waiter.rank()));
                format!(
                    "; the last it reported ({} steps) came at {t:.2} s{}",
                    res.steps_done,
                    before.unwrap_or_default()
                )
            }
            None => String::new(),
        };
        let then = match (&r.ended_by, res.ended_at_s) {
            (EndedBy::Launcher { signal }, Some(t)) => {
                format!("; its launcher then stopped it with {} at {t:.2} s", signal.name())
            }
            (EndedBy::Teardown { signal }, Some(t)) => {
                format!("; ups-doctor then stopped it with {} at {t:.2} s", signal.name())
            }
            _ => String::new(),
        };
        evidence.push(format!("rank {rank} had issued {n}: it had not reached #{reached}{last}{then}"));
    }
    let unknown = behind.is_empty().then(|| {
        format!(
            "every rank had issued at least as many collectives ({reached}) as rank {}, so each had reached that \
             place (in the same collective, or in another)",
            waiter.rank()
        )
    });
    WaitedFor { behind, unknown, evidence }
}

/// The other failed ranks that their launcher or ups-doctor stopped after the waiting rank gave
/// up: not collateral of a cause nobody can name.
fn stopped_after(ev: &Evidence, waiter: u32) -> Vec<u32> {
    ev.ranks
        .iter()
        .filter(|r| r.rank() != waiter && r.failed())
        .filter(|r| matches!(r.ended_by, EndedBy::Launcher { .. } | EndedBy::Teardown { .. }))
        .map(RankEvidence::rank)
        .collect()
}

pub fn collective_timeout(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    let first = first?;
    let line = (first.key.iter().map(|k| k.text.as_str()))
        .chain(first.text.iter().map(String::as_str))
        .find(|l| gloo_timeout_ms(l).is_some())?;
    let ms = gloo_timeout_ms(line)?;
    let w = waited_for(ev, first, None);
    let mut f = Finding::of(&COLLECTIVE_TIMEOUT);
    let said = &line[line.find("Timed out waiting").unwrap_or(0)..];
    let rank = first.rank();
    let behind: Vec<u32> = w.behind.iter().map(|(r, _)| *r).collect();
    f.headline = Some(match &w.unknown {
        None => format!(
            "Rank {rank} gave up after {} waiting in a collective that {} had not reached (gloo: `{}`): it was \
             waiting for {}.",
            duration(ms),
            ranks_list(&behind),
            said.trim(),
            ranks_list(&behind),
        ),
        Some(why) => format!(
            "Rank {rank} gave up after {} waiting in a collective that another rank did not join (gloo: `{}`); \
             which rank it waited for cannot be told: {why}.",
            duration(ms),
            said.trim(),
        ),
    });
    f.evidence = w.evidence;
    f.waited_for = if w.unknown.is_none() {
        behind.into_iter().filter(|r| ev.rank(*r).is_some_and(RankEvidence::failed)).collect()
    } else {
        stopped_after(ev, rank)
    };
    Some(f)
}

pub fn nccl_watchdog(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    let first = first?;
    let (waiter, line) = std::iter::once(first).chain(ev.ranks.iter()).find_map(|r| {
        r.line_with("Watchdog caught collective operation timeout").map(|l| (r, l.to_string()))
    })?;
    let field = |name: &str| {
        let rest = &line[line.find(&format!("{name}="))? + name.len() + 1..];
        Some(rest.split([',', ')']).next()?.trim().to_string())
    };
    let mut f = Finding::of(&NCCL_WATCHDOG_TIMEOUT);
    let op = field("OpType").unwrap_or_else(|| "a collective".into());
    let seq_num = field("SeqNum").and_then(|s| s.parse::<u64>().ok());
    let seq = seq_num.map(|s| format!(" (SeqNum={s})")).unwrap_or_default();
    let ms = field("Timeout(ms)").map(|t| format!(" after {t} ms")).unwrap_or_default();
    let rank = waiter.rank();
    let w = waited_for(ev, waiter, seq_num);
    let who = match &w.unknown {
        None => {
            let behind: Vec<u32> = w.behind.iter().map(|(r, _)| *r).collect();
            f.waited_for =
                behind.iter().copied().filter(|r| ev.rank(*r).is_some_and(RankEvidence::failed)).collect();
            format!(
                "{} never joined that collective (it had not reached it in the group's count).",
                ranks_list(&behind)
            )
        }
        Some(why) => {
            f.waited_for = stopped_after(ev, rank);
            format!("another rank never joined that collective; which one cannot be told: {why}.")
        }
    };
    f.headline = Some(format!("Rank {rank}'s NCCL watchdog timed out in {op}{seq}{ms}: {who}"));
    f.evidence.push(format!("rank {rank}: `{}`", line.trim()));
    f.evidence.extend(w.evidence);
    Some(f)
}
