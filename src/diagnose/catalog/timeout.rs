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
    /// The waiting rank's place in the group's count: the collective it gave up in.
    reached: Option<u64>,
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
            reached: None,
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
            reached: None,
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
            (EndedBy::Cluster, Some(t)) => format!("; its cluster then ended its worker at {t:.2} s"),
            _ => String::new(),
        };
        evidence.push(format!(
            "rank {rank} had issued {n}: it had not reached #{reached}{last}{then}{}",
            whereabouts(r)
        ));
    }
    let unknown = behind.is_empty().then(|| {
        format!(
            "every rank had issued at least as many collectives ({reached}) as rank {}, so each had reached that \
             place (in the same collective, or in another)",
            waiter.rank()
        )
    });
    WaitedFor { behind, reached: Some(reached), unknown, evidence }
}

/// Where a rank's own stacks (taken as it was stopped) place its main thread: `; its stack then:
/// in `all_reduce`, at `main (train.py:41)`` or `; its stack then: outside any collective, at …`.
fn whereabouts(r: &RankEvidence) -> String {
    let Some(thread) = super::distributed::main_thread(r) else { return String::new() };
    let inside = match super::distributed::collective_of(&thread.frames) {
        Some(c) => format!("in {c}"),
        None => "outside any collective".to_string(),
    };
    let at =
        super::distributed::program_frame(&thread.frames).map(|f| format!(", at `{f}`")).unwrap_or_default();
    format!("; its stack then: {inside}{at}")
}

/// The ranks the verdict names beside the one that gave up first, none of them collateral: those
/// it waited for (or, where those cannot be told, those stopped after it gave up) and the others
/// that gave up waiting too (`gave_up` finds a rank's line saying so). Returns the sentence that
/// names the latter, for the headline.
fn name_the_others(
    ev: &Evidence,
    waiter: u32,
    w: &WaitedFor,
    gave_up: impl Fn(&RankEvidence) -> Option<String>,
    f: &mut Finding,
) -> String {
    let failed_rank = |r: &u32| ev.rank(*r).is_some_and(RankEvidence::failed);
    f.named = match w.unknown {
        None => w.behind.iter().map(|(r, _)| *r).filter(failed_rank).collect(),
        // Stopped after it gave up: not collateral of a cause nobody can name.
        Some(_) => (ev.ranks.iter())
            .filter(|r| r.rank() != waiter && r.failed())
            .filter(|r| {
                matches!(r.ended_by, EndedBy::Launcher { .. } | EndedBy::Cluster | EndedBy::Teardown { .. })
            })
            .map(RankEvidence::rank)
            .collect(),
    };
    let mut too = Vec::new();
    for r in ev.ranks.iter().filter(|r| r.rank() != waiter && r.failed()) {
        if let Some(line) = gave_up(r) {
            f.evidence.push(format!("rank {} gave up waiting too: `{}`", r.rank(), line.trim()));
            too.push(r.rank());
            if !f.named.contains(&r.rank()) {
                f.named.push(r.rank());
            }
        }
    }
    match too.len() {
        0 => String::new(),
        1 => format!(" Rank {} gave up waiting too.", too[0]),
        _ => format!(" {} gave up waiting too.", ranks_list(&too).replacen('r', "R", 1)),
    }
}

/// The line of a rank's output where gloo gave up waiting.
fn gloo_line<'r>(r: &'r RankEvidence) -> Option<&'r str> {
    (r.key.iter().map(|k| k.text.as_str()))
        .chain(r.text.iter().map(String::as_str))
        .find(|l| gloo_timeout_ms(l).is_some())
}

pub fn collective_timeout(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    let first = first?;
    let line = gloo_line(first)?;
    let ms = gloo_timeout_ms(line)?;
    let w = waited_for(ev, first, None);
    let mut f = Finding::of(&COLLECTIVE_TIMEOUT);
    let said = |l: &str| l[l.find("Timed out waiting").unwrap_or(0)..].trim().to_string();
    let rank = first.rank();
    let behind: Vec<u32> = w.behind.iter().map(|(r, _)| *r).collect();
    // The one rank it waited for, where its own stack placed it as it was stopped.
    let then = match behind.as_slice() {
        [one] => ev.rank(*one).map(whereabouts).and_then(|w| {
            let w = w.strip_prefix("; its stack then: ")?.to_string();
            Some(format!(", {w} when it was stopped"))
        }),
        _ => None,
    };
    // The collective itself, where the ledger holds it (a Python call; DDP's are not in it).
    let open = (first.result.observed.as_ref())
        .and_then(|o| o.last_of("default"))
        .filter(|e| e.ms.is_none() && w.reached.is_some_and(|n| e.holds(n)))
        .map_or_else(|| "a collective".to_string(), |e| e.render());
    let headline = match &w.unknown {
        None => format!(
            "Rank {rank} gave up after {} waiting in {open}, which {} had not reached (gloo: `{}`): it was \
             waiting for {}{}.",
            duration(ms),
            ranks_list(&behind),
            said(line),
            ranks_list(&behind),
            then.unwrap_or_default(),
        ),
        Some(why) => format!(
            "Rank {rank} gave up after {} waiting in a collective that another rank did not join (gloo: `{}`); \
             which rank it waited for cannot be told: {why}.",
            duration(ms),
            said(line),
        ),
    };
    f.evidence.extend(w.evidence.iter().cloned());
    let too = name_the_others(ev, rank, &w, |r| gloo_line(r).map(said), &mut f);
    f.headline = Some(headline + &too);
    Some(f)
}

const WATCHDOG: &str = "Watchdog caught collective operation timeout";

pub fn nccl_watchdog(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    let first = first?;
    let (waiter, line) = std::iter::once(first)
        .chain(ev.ranks.iter())
        .find_map(|r| r.line_with(WATCHDOG).map(|l| (r, l.to_string())))?;
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
        None => format!(
            "{} never joined that collective (it had not reached it in the group's count).",
            ranks_list(&w.behind.iter().map(|(r, _)| *r).collect::<Vec<_>>())
        ),
        Some(why) => format!("another rank never joined that collective; which one cannot be told: {why}."),
    };
    f.evidence.push(format!("rank {rank}: `{}`", line.trim()));
    f.evidence.extend(w.evidence.iter().cloned());
    let too = name_the_others(ev, rank, &w, |r| r.line_with(WATCHDOG).map(String::from), &mut f);
    f.headline = Some(format!("Rank {rank}'s NCCL watchdog timed out in {op}{seq}{ms}: {who}{too}"));
    Some(f)
}
