//! Patterns read from the observer in a user's Python program (`python/site/sitecustomize.py`):
//! its collective ledger (which rank issued which collective, in which order), its per-step
//! times, and the process group it formed. Each is stated only when every rank it speaks of
//! reported; otherwise the detector stays silent and the others judge.

use super::{Finding, Pattern};
use crate::diagnose::evidence::{EndedBy, Evidence, RankEvidence};
use crate::scenario::OutcomeKind;
use crate::schema::{LEDGER_KEPT, LedgerEntry, ObservedProgram};

pub const COLLECTIVE_MISMATCH: Pattern = Pattern {
    id: "collective-mismatch",
    title: "Collectives out of step",
    matches: "the observer's collective ledgers of a failed or hung run part ways: at the same sequence number \
              of a process group, one rank issued a collective another never issued (not one issued only after that \
              rank had failed: a reaction to its end, as a SIGTERM handler's broadcast), or a different one; or the \
              collective library itself said the sizes differ (gloo's `Received data size doesn't match expected \
              size. Is there a distributed collective mismatch in your code?`, often in the `what():` of the \
              exception that aborted a rank), with both sizes and, from the ledgers, what each rank issued; the rank \
              named is the one whose size at that call site changed, the odd one of three or more, or the one that \
              issued another collective where the program, after the same one before, issued what the others did, \
              or whose own count of the group passed the place where the program's call, due every few of the \
              group's collectives, came on the others (it issued something else there: that rank is the first failure \
              even if it went on to end well)",
    explanation: "Every rank of a process group must issue the same collectives in the same order. A rank that \
                  skips one (a rank-dependent `if`, an early `continue`, an exception caught on one rank) or \
                  adds one leaves the others waiting in it, or pairs it with a different collective: the run \
                  hangs until a timeout or fails with a size mismatch.",
    next_step: "Look at the named rank's code path at the call site: make every rank issue the same collectives \
                (the condition that differs between ranks is the bug). `TORCH_DISTRIBUTED_DEBUG=DETAIL` checks \
                collectives' order and shapes across ranks on the next run.",
    reference: "https://pytorch.org/docs/stable/distributed.html#debugging-torch-distributed-applications",
};

/// What a collective library says when the ranks' sizes differ (gloo: `… 16 vs 8. Received data
/// size doesn't match expected size. Is there a distributed collective mismatch in your code?`).
const SIZE_MISMATCH_WORDS: [&str; 2] = [
    "Received data size doesn't match expected size",
    "Is there a distributed collective mismatch in your code",
];

/// The line of the failed run in which the library said the collective's sizes differ: the first
/// failure's own key line (the `what():` of the exception that aborted it) or words, else any
/// rank's, else the launcher's quotes of their shared output.
fn size_mismatch_line(ev: &Evidence, first: &RankEvidence) -> Option<String> {
    let said = |line: &str| SIZE_MISMATCH_WORDS.iter().any(|w| line.contains(w));
    let in_lines = |lines: &[String]| lines.iter().find(|l| said(l)).map(|l| l.trim().to_string());
    let key = first.key.clone().or_else(|| super::fatal_key(ev, first));
    key.map(|k| k.text)
        .filter(|t| said(t))
        .or_else(|| in_lines(&first.text))
        .or_else(|| ev.ranks.iter().find_map(|r| in_lines(&r.text)))
        .or_else(|| ev.launcher.and_then(|l| l.quotes.iter().find_map(|q| in_lines(&q.lines))))
}

/// `16 vs 8` in the library's line: what it received, and what it expected.
fn sizes_in(line: &str) -> Option<(u64, u64)> {
    let words: Vec<&str> = line.split_whitespace().collect();
    words.windows(3).find_map(|w| {
        let number = |s: &str| s.trim_end_matches(['.', ',', ';']).parse::<u64>().ok();
        (w[1] == "vs").then(|| Some((number(w[0])?, number(w[2])?))).flatten()
    })
}

/// A failed run in which the collective library itself said that the ranks' sizes differ: a
/// collective mismatch in the library's words, with both sizes, and where the observer's ledgers
/// show each rank's last collective, what each issued (the rank whose size differs, where a
/// majority agrees).
pub fn size_mismatch(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    let first = first?;
    let line = size_mismatch_line(ev, first)?;
    let mut f = Finding::of(&COLLECTIVE_MISMATCH);
    let sizes = sizes_in(&line)
        .map(|(got, want)| format!(": it received {got} where it expected {want}"))
        .unwrap_or_default();
    f.evidence.push(format!("the collective library said: `{line}`"));
    // Each rank's last collective, with the one it issued before from the same call site.
    let last: Vec<(u32, &LedgerEntry, Option<&LedgerEntry>)> = ev
        .ranks
        .iter()
        .filter_map(|r| {
            let ledger = &observed(r)?.ledger;
            // The call it was in when the library aborted it (it never returned), in whichever group
            // (Lightning's first `all_reduce` goes to a group of its own); else the default group's last.
            let at = ledger
                .iter()
                .rposition(|e| e.ms.is_none())
                .or_else(|| ledger.iter().rposition(|e| e.group == "default"))?;
            let e = &ledger[at];
            let before =
                ledger[..at].iter().rfind(|p| p.group == e.group && p.op == e.op && p.site == e.site);
            Some((r.rank(), e, before))
        })
        .collect();
    let mut differ = String::new();
    if !last.is_empty() {
        f.evidence.push(format!(
            "from the observer's collective ledgers, each rank's last collective: {}",
            last.iter()
                .map(|(r, e, _)| format!("rank {r} issued {}", e.render()))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    // Ranks that issued different collectives at one place (a rank skipped one, and the library
    // paired its next with the others' skipped one, whose sizes differ): the one that left the
    // program's order, where the ledgers show what came next the time before.
    let ledgers: Vec<(u32, &ObservedProgram)> =
        ev.ranks.iter().filter_map(|r| Some((r.rank(), observed(r)?))).collect();
    if ledgers.len() == ev.ranks.len()
        && let Some(d) = the_one_that_left(&ledgers, Some(first.rank()))
    {
        f.culprit = Some(d.rank);
        f.departed = true;
        f.evidence.push(d.render());
        return Some(size_mismatch_finding(
            f,
            first,
            &sizes,
            &format!(
                " The sizes differ because the ranks issued different collectives: rank {} left the program's order.",
                d.rank
            ),
        ));
    }
    // The rank whose size at that call site changed from what it passed there before, where the
    // others' did not: it is the one that differs (a last batch of another size, a rank-dependent
    // slice), whatever the number of ranks.
    let changed: Vec<u32> = last
        .iter()
        .filter(|(_, e, before)| before.is_some_and(|b| b.shapes != e.shapes))
        .map(|(r, _, _)| *r)
        .collect();
    let steady = last.iter().filter(|(_, e, before)| before.is_some_and(|b| b.shapes == e.shapes)).count();
    let same_call =
        last.len() >= 2 && last.iter().all(|(_, e, _)| e.op == last[0].1.op && e.seq == last[0].1.seq);
    let shapes_differ = same_call && last.iter().any(|(_, e, _)| e.shapes != last[0].1.shapes);
    if shapes_differ {
        let each: Vec<String> = last
            .iter()
            .map(|(r, e, _)| format!("rank {r} {}", if e.shapes.is_empty() { "?" } else { &e.shapes }))
            .collect();
        differ = format!(
            " `{}` #{} has different sizes on the ranks ({})",
            last[0].1.op,
            last[0].1.seq,
            each.join(", ")
        );
    }
    if let [odd] = changed.as_slice()
        && steady + 1 == last.len()
        && let Some((_, e, Some(before))) = last.iter().find(|(r, _, _)| r == odd)
    {
        f.culprit = Some(*odd);
        differ.push_str(&format!(
            " Rank {odd}'s size changed at that call site: it passed {} to `{}` there before, {} now{}.",
            if before.shapes.is_empty() { "?" } else { &before.shapes },
            e.op,
            if e.shapes.is_empty() { "?" } else { &e.shapes },
            if steady > 0 { ", where every other rank's stayed the same" } else { "" },
        ));
    } else if shapes_differ {
        let odd: Vec<u32> = last
            .iter()
            .filter(|(_, e, _)| last.iter().filter(|(_, o, _)| o.shapes == e.shapes).count() == 1)
            .map(|(r, _, _)| *r)
            .collect();
        if odd.len() == 1 && last.len() >= 3 {
            f.culprit = Some(odd[0]);
            differ.push_str(&format!(": rank {} differs from every other.", odd[0]));
        } else {
            differ.push_str(": which rank's is wrong cannot be told from the sizes alone.");
        }
    }
    // The rank the library aborted only received what another sent: unless a rank's size is
    // known to have changed, which one is at fault is not claimed.
    f.undecided = f.culprit.is_none();
    if f.undecided && !differ.contains("cannot be told") {
        differ.push_str(" Which rank passed the wrong size cannot be told from what was seen.");
    }
    Some(size_mismatch_finding(f, first, &sizes, &differ))
}

/// The finding of [`size_mismatch`], with its headline: the rank the library aborted, the sizes it
/// gave (`sizes`), and what the ledgers say of them (`differ`).
fn size_mismatch_finding(mut f: Finding, first: &RankEvidence, sizes: &str, differ: &str) -> Finding {
    f.headline = Some(format!(
        "Collectives out of step: {} aborted in a collective whose sizes differ between the ranks{sizes} \
         (the library's own words: `Received data size doesn't match expected size`).{differ}",
        crate::diagnose::evidence::rank_name(first.result, "rank").replacen('r', "R", 1)
    ));
    f.next_step = Some(
        "Compare what each rank passes to that collective at its call site: a tensor whose size depends on the rank \
         (uneven last batch, a rank-dependent slice or padding), or ranks that reached different collectives. \
         `TORCH_DISTRIBUTED_DEBUG=DETAIL` checks every collective's shapes across ranks on the next run."
            .to_string(),
    );
    f
}

pub const STRAGGLER: Pattern = Pattern {
    id: "straggler",
    title: "Straggler rank",
    matches: "one rank's median step time in one phase (`DataLoader.__next__`, DDP's forward, time outside \
              collectives) is at least twice the other ranks' and at least 5 ms more, over at least 5 timed steps \
              of every rank; in a shorter run (2 to 4 timed steps), its time in `DataLoader.__next__` at least 10 \
              times the others' and 50 ms more; time outside backward and collectives only where every other rank \
              waited for at least half the gap, in its steps or, over the whole run, in collectives between them; \
              not where the kernel's account (`observed.cpu_per_step`, where no longer than twice the rank's \
              median step: else it is mostly time between steps) says the rank's main thread waited for a \
              CPU at least half the gap a step longer than every other rank's with no more time on a CPU than \
              theirs (within a quarter of it, or an eighth of the gap): a crowded machine, not the rank (unless \
              its main thread runs at a higher nice value than every other rank's, `observed.nice`: then it is \
              named, with its nice value); nor, \
              for time its main thread spent on a CPU, where the rank computes with several intra-op threads and \
              its other threads waited for a CPU longer than they ran and at least half the gap (OpenMP's threads \
              spinning for each other) while it waited for the others in backward and collectives at least half \
              the gap itself; DDP's \
              forward not where another rank was on a CPU, or outside where ranks wait (its data loading, its own \
              work), at least half the gap a step longer (the rank waited there for it, in the buffers' \
              broadcast); in a run that passed, or one the time limit ended while \
              every rank still made progress",
    explanation: "Synchronous data parallelism runs at the pace of its slowest rank: the others wait for it in \
                  every collective (DDP's gradient all-reduce), so the whole job is as slow as this rank.",
    next_step: "Find why this rank is slower in that phase: its data (uneven shards, a slow disk or worker), its \
                CPU or GPU (shared with another job, throttled, a different device), or work only it does.",
    reference: "https://pytorch.org/docs/stable/notes/ddp.html",
};

pub const NOT_DISTRIBUTED: Pattern = Pattern {
    id: "not-distributed",
    title: "Not distributed",
    matches: "more than one rank declared, but the observer saw a process train without \
              `init_process_group`, or a process group of another size formed",
    explanation: "The command did not run the distributed job it was meant to: the launcher started one \
                  ordinary process (`accelerate launch --cpu` ignores `--num_processes` without \
                  `--multi_cpu`-style configuration), or the program formed a group of a different size, so \
                  what passed is not a test of distributed training.",
    next_step: "Check the launcher's flags and configuration (`accelerate config`, `--multi_gpu`, \
                `--nproc_per_node`) and the `WORLD_SIZE` the program sees.",
    reference: "https://pytorch.org/docs/stable/elastic/run.html",
};

fn observed<'e>(r: &'e RankEvidence) -> Option<&'e ObservedProgram> {
    r.result.observed.as_ref()
}

/// `rank 1` / `ranks 1, 3`; beyond [`EACH_RANK_MAX`] ranks, runs as ranges (`ranks 0–752,
/// 754–1023`), not 4,095 numbers.
pub(super) fn ranks_list(ranks: &[u32]) -> String {
    if ranks.len() > crate::diagnose::words::EACH_RANK_MAX {
        return crate::diagnose::words::ranks_named(ranks);
    }
    let words: Vec<String> = ranks.iter().map(u32::to_string).collect();
    match words.len() {
        1 => format!("rank {}", words[0]),
        _ => format!("ranks {}", words.join(", ")),
    }
}

/// Where one rank stands in a group's ledger.
fn standing(rank: u32, e: Option<&LedgerEntry>) -> String {
    match e {
        Some(e) if e.ms.is_none() => format!("rank {rank} is in {}", e.render()),
        Some(e) => format!("rank {rank}'s last is {}, returned", e.render()),
        None => format!("rank {rank} issued none"),
    }
}

/// The ranks issued different collectives at the same sequence number `seq` of `group`: the one
/// that differs where a majority agrees, else "cannot tell".
fn ops_differ(ledgers: &[(u32, &ObservedProgram)], group: &str, seq: u64, mut f: Finding) -> Finding {
    let ops: Vec<(u32, &LedgerEntry)> =
        ledgers.iter().filter_map(|(r, o)| Some((*r, o.at(group, seq)?))).collect();
    let odd: Vec<u32> = ops
        .iter()
        .filter(|(_, e)| ops.iter().filter(|(_, x)| x.op == e.op).count() == 1)
        .map(|(r, _)| *r)
        .collect();
    let each: Vec<String> = ops.iter().map(|(r, e)| format!("rank {r} issued {}", e.render())).collect();
    if odd.len() == 1 && ops.len() > 2 {
        f.culprit = Some(odd[0]);
        f.headline = Some(format!(
            "Collectives out of step: at collective #{seq} {}; rank {} is the one that differs.",
            each.join(", "),
            odd[0]
        ));
    } else if let Some(d) = the_one_that_left(ledgers, None) {
        // No majority (two ranks): the program's own order, where the ledgers show it.
        f.culprit = Some(d.rank);
        f.departed = true;
        f.evidence.push(d.render());
        f.headline = Some(format!(
            "Collectives out of step: at collective #{seq} {}; rank {} left the program's order of collectives.",
            each.join(", "),
            d.rank
        ));
    } else {
        // Which rank's end came first (by the clock) says nothing of which diverged.
        f.undecided = true;
        f.headline = Some(format!(
            "Collectives out of step: at collective #{seq} {}. Cannot tell which rank diverged: no \
             majority among {} ranks, and nothing earlier in the ledgers shows the program's order.",
            each.join(", "),
            ops.len()
        ));
    }
    f
}

pub fn collective_mismatch(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    first?;
    if ev.ranks.len() < 2 {
        return None;
    }
    // A rank that crashed by itself has its own cause, which the crash patterns name.
    let crashed = |r: &&RankEvidence| {
        r.result.outcome == OutcomeKind::Signaled
            && matches!(r.ended_by, EndedBy::Itself | EndedBy::OomKiller)
    };
    if ev.ranks.iter().any(|r| crashed(&r)) {
        return None;
    }
    // What a rank issued once ups-doctor had begun to end the run is its reaction to the
    // teardown (Lightning's SIGTERM handler broadcasts to the other ranks), not a step of the
    // program that went wrong: the ledgers are read up to that moment.
    let cutoff = ev.teardown_began_at();
    let trimmed: Vec<(u32, ObservedProgram)> = ev
        .ranks
        .iter()
        .map(|r| {
            let mut o = observed(r)?.clone();
            if let Some(at) = cutoff {
                o.ledger.retain(|e| e.at_s.is_none_or(|t| t <= at));
            }
            Some((r.rank(), o))
        })
        .collect::<Option<_>>()?;
    let ledgers: Vec<(u32, &ObservedProgram)> = trimmed.iter().map(|(r, o)| (*r, o)).collect();
    let mut groups: Vec<&str> =
        ledgers.iter().flat_map(|(_, o)| o.ledger.iter().map(|e| e.group.as_str())).collect();
    groups.sort_unstable();
    groups.dedup();
    // Each group where the ranks diverged, with when the collective they diverged at was issued:
    // the earliest is the cause. A rank that waits in one group's collective cannot issue the
    // next of another group, so a divergence in a second group follows from the first (DeepSpeed
    // runs its gradient reductions on a group of its own beside the default one: rank 1 skipped a
    // default-group `all_gather` and went on into the other group's `all_reduce`, where rank 0,
    // stuck in that `all_gather`, never came).
    // (A group whose lacking rank was behind, outside any collective, is the stacks' to judge:
    // `None`, and when it comes first nothing is stated.)
    let found: Vec<(f64, Option<Finding>)> =
        groups.into_iter().filter_map(|group| group_divergence(ev, &ledgers, group)).collect();
    // Two groups' divergences naming two ranks: each waits where the other never came. When the
    // ranks were seen (clock order) is a race between them (under load, DeepSpeed's rank 1 that
    // skipped the default group's `all_gather` reached its next gradient `all_reduce` first, and
    // rank 0 was named); the program's own order, where the ledgers show it, is not.
    let named: Vec<u32> = found.iter().filter_map(|(_, f)| f.as_ref()?.culprit).collect();
    let two = match named[..] {
        [a, b] if a != b => Some((a, b)),
        _ => None,
    };
    if let Some(rank) = two.and_then(|(a, b)| left_the_programs_order(&ledgers, a, b)).map(|d| d.rank) {
        return found.into_iter().find_map(|(_, f)| f.filter(|f| f.culprit == Some(rank)));
    }
    let mut first = found.into_iter().min_by(|(x, _), (y, _)| x.total_cmp(y)).and_then(|(_, f)| f)?;
    if let Some((a, b)) = two {
        first.culprit = None;
        first.undecided = true;
        first.evidence.push(format!(
            "ranks {a} and {b} each wait in a collective of a group the other never reached: which left the \
             program's order cannot be told from the ledgers"
        ));
    }
    Some(first)
}

/// A rank that left the program's order of collectives ([`left_the_programs_order`]).
struct Departure<'l> {
    rank: u32,
    /// The last collective both ranks issued alike, and the one issued after the time before it.
    last: &'l LedgerEntry,
    expected: &'l LedgerEntry,
    /// What the rank that left issued next instead.
    went: Went<'l>,
}

/// What a rank that left the program's order issued where the program's next collective was due.
enum Went<'l> {
    /// Another collective of the program's.
    Issued(&'l LedgerEntry),
    /// The default group's collective `pos`, which its own count says the rank issued and its
    /// ledger does not hold: not through `torch.distributed`'s Python functions ([`off_the_stride`]).
    Unseen { pos: u64, stride: u64, other: u32, how: Passed },
}

/// How a rank whose ledger holds nothing at a place of the group's count is known to have
/// issued that place ([`off_the_stride`]).
#[derive(Clone, Copy)]
enum Passed {
    /// The group's own count it sent last had passed it.
    Count,
    /// Its collective library paired the other rank's call there with a message of another size
    /// from it; its ledger was read whole after it ended.
    Met,
}

impl Departure<'_> {
    /// `after `all_gather` #75 (…), rank 1 issued `broadcast_object_list` #76 (…), where the
    /// program issued `broadcast` (operations.py:466) the time before (#73, on both ranks)`.
    fn render(&self) -> String {
        let site =
            if self.expected.site.is_empty() { String::new() } else { format!(" ({})", self.expected.site) };
        match self.went {
            Went::Issued(went) => format!(
                "after {}, rank {} issued {} where the program issued `{}`{site} next the time before (#{}, on \
                 both ranks): it left the program's order of collectives",
                self.last.render(),
                self.rank,
                went.render(),
                self.expected.op,
                self.expected.seq,
            ),
            Went::Unseen { pos, stride, other, how } => format!(
                "the program issued `{}`{site} every {stride} of the default group's collectives (the group's \
                 collective {} was the last, on both ranks); rank {other} issued it again as the group's collective \
                 {pos}, and {} with no such call: it issued something else there (from C++, as DDP's gradient \
                 all-reduce is) and left the program's order of collectives",
                self.expected.op,
                self.last.pos.unwrap_or_default(),
                match how {
                    Passed::Count =>
                        format!("rank {}'s own count of the group's collectives passed {pos}", self.rank),
                    Passed::Met => format!(
                        "the collective library paired that call with a message of another size from rank {}, whose \
                         ledger, read whole after it ended, holds nothing after the group's collective {}",
                        self.rank,
                        self.last.pos.unwrap_or_default()
                    ),
                },
            ),
        }
    }
}

/// Of ranks `a` and `b`, the one whose next collective after the last both issued alike is not
/// what the program issued next the time before, both ranks agreeing: after DeepSpeed's
/// `all_gather_into_tensor` of group 1, the default group's `all_gather` came each step; a rank
/// that went from it to group 1's `all_reduce` skipped one; after Accelerate's `all_gather`, its
/// `broadcast` came, and a rank that issued a `broadcast_object_list` there (gloo paired it with
/// the other's `broadcast`) skipped one. `None` where no earlier time agrees, or both or neither
/// follow it.
fn left_the_programs_order<'l>(
    ledgers: &[(u32, &'l ObservedProgram)],
    a: u32,
    b: u32,
) -> Option<Departure<'l>> {
    let of = |r: u32| ledgers.iter().find(|(x, _)| *x == r).map(|(_, o)| o.ledger.as_slice());
    let (la, lb) = (of(a)?, of(b)?);
    fn key(e: &LedgerEntry) -> (&str, u64) {
        (&e.group, e.seq)
    }
    fn kind(e: &LedgerEntry) -> (&str, &str, &str) {
        (&e.group, &e.op, &e.site)
    }
    let find =
        |l: &[LedgerEntry], e: &LedgerEntry| l.iter().position(|x| key(x) == key(e) && kind(x) == kind(e));
    // The last entry both issued alike, and what each issued next.
    let (pa, pb) = la.iter().enumerate().rev().find_map(|(i, e)| Some((i, find(lb, e)?)))?;
    let (next_a, next_b) = (la.get(pa + 1)?, lb.get(pb + 1)?);
    if key(next_a) == key(next_b) && kind(next_a) == kind(next_b) {
        return None;
    }
    // The latest earlier entry like it, and what came after it on both ranks alike.
    let last = &la[pa];
    let before = la[..pa].iter().rposition(|e| kind(e) == kind(last))?;
    let after = la.get(before + 1)?;
    let after_b = lb.get(find(lb, &la[before])? + 1)?;
    if key(after) != key(after_b) || kind(after) != kind(after_b) {
        return None;
    }
    let (rank, went) = match (kind(next_a) == kind(after), kind(next_b) == kind(after)) {
        (true, false) => (b, next_b),
        (false, true) => (a, next_a),
        _ => return None,
    };
    Some(Departure { rank, last, expected: after, went: Went::Issued(went) })
}

/// How many of a call site's collectives in a row, at one distance in the default group's own
/// count on both ranks, make the program's stride ([`off_the_stride`]).
const STRIDE_SEEN: usize = 4;

/// Of ranks `a` and `b`, the one that did not issue the program's next collective where its own
/// count of the default group's collectives says it issued one. After the last collective both
/// issued alike, the program issued it every `d` collectives of the group ([`STRIDE_SEEN`] times
/// in a row, on both ranks alike: the collectives between came from C++, DDP's gradient
/// all-reduces); a rank that issued it again `d` later followed the program; a rank whose ledger
/// holds nothing after it although the group's count it sent last had passed that place (the
/// observer queues a call's entry before the call moves the count, so a count that was sent came
/// after every entry up to it) issued something else there; so did the peer of two ranks whose
/// collective library aborted the other, `met`, in that call on the sizes (the peer's message
/// for that place was not the program's call), where the peer's ledger was read whole after it
/// ended. PyTorch-Ignite's metric all-reduce, skipped once by rank 1: its next gradient
/// all-reduce met rank 0's metric all-reduce, and gloo aborted rank 0 on the sizes. `None` where
/// the stride, the count, a drop of markers or an unread ledger leaves it open.
fn off_the_stride<'l>(
    ledgers: &[(u32, &'l ObservedProgram)],
    a: u32,
    b: u32,
    met: Option<u32>,
) -> Option<Departure<'l>> {
    let of = |r: u32| ledgers.iter().find(|(x, _)| *x == r).map(|(_, o)| *o);
    let (oa, ob) = (of(a)?, of(b)?);
    let counted = |o: &'l ObservedProgram| -> Vec<&'l LedgerEntry> {
        o.ledger.iter().filter(|e| e.group == "default" && e.pos.is_some()).collect()
    };
    let (la, lb) = (counted(oa), counted(ob));
    let same = |x: &LedgerEntry, y: &LedgerEntry| x.pos == y.pos && x.op == y.op && x.site == y.site;
    let (ia, ib) =
        la.iter().enumerate().rev().find_map(|(i, e)| Some((i, lb.iter().position(|y| same(e, y))?)))?;
    let stride = |l: &[&LedgerEntry], i: usize| -> Option<u64> {
        let run = l.get((i + 1).checked_sub(STRIDE_SEEN)?..=i)?;
        let d = run[1].pos?.checked_sub(run[0].pos?)?;
        let steady = run.windows(2).all(|w| {
            w[1].op == w[0].op
                && w[1].site == w[0].site
                && w[1].pos.zip(w[0].pos).and_then(|(y, x)| y.checked_sub(x)) == Some(d)
        });
        (steady && d > 0).then_some(d)
    };
    let d = stride(&la, ia)?;
    if stride(&lb, ib)? != d {
        return None;
    }
    let last = la[ia];
    let pos = last.pos? + d;
    let follows = |l: &[&'l LedgerEntry], i: usize| {
        l.get(i + 1).copied().filter(|n| n.op == last.op && n.site == last.site && n.pos == Some(pos))
    };
    // How the rank is known to have issued the group's collective `pos`, if it is.
    let passed_without = |o: &ObservedProgram, l: &[&LedgerEntry], i: usize, other: u32, e: &LedgerEntry| {
        if l.len() != i + 1 || o.dropped > 0 {
            None
        } else if o.issued.is_some_and(|n| n >= pos) {
            Some(Passed::Count)
        } else {
            (ledgers.len() == 2 && met == Some(other) && e.ms.is_none() && o.kept).then_some(Passed::Met)
        }
    };
    let (rank, other, expected, how) = match (follows(&la, ia), follows(&lb, ib)) {
        (Some(e), None) => (b, a, e, passed_without(ob, &lb, ib, a, e)?),
        (None, Some(e)) => (a, b, e, passed_without(oa, &la, ia, b, e)?),
        _ => return None,
    };
    Some(Departure { rank, last, expected, went: Went::Unseen { pos, stride: d, other, how } })
}

/// Of every pair of ranks, the one rank that left the program's order ([`left_the_programs_order`],
/// else [`off_the_stride`]; `met`: the rank the collective library aborted on the sizes), where
/// every pair that says names the same one.
fn the_one_that_left<'l>(ledgers: &[(u32, &'l ObservedProgram)], met: Option<u32>) -> Option<Departure<'l>> {
    let mut found: Option<Departure<'l>> = None;
    for (i, (a, _)) in ledgers.iter().enumerate() {
        for (b, _) in &ledgers[i + 1..] {
            let Some(d) =
                left_the_programs_order(ledgers, *a, *b).or_else(|| off_the_stride(ledgers, *a, *b, met))
            else {
                continue;
            };
            match &found {
                Some(f) if f.rank != d.rank => return None,
                Some(_) => {}
                None => found = Some(d),
            }
        }
    }
    found
}

/// When the collective `seq` of `group` was first issued, by any rank (never: infinitely late).
fn issued_at(ledgers: &[(u32, &ObservedProgram)], group: &str, seq: u64) -> f64 {
    ledgers.iter().filter_map(|(_, o)| o.at(group, seq)?.at_s).min_by(f64::total_cmp).unwrap_or(f64::INFINITY)
}

/// Where the ranks' ledgers of `group` diverge, if they do: when the collective they diverged at
/// was issued, and what that says (`None`: it is the stacks' to judge).
fn group_divergence(
    ev: &Evidence,
    ledgers: &[(u32, &ObservedProgram)],
    group: &str,
) -> Option<(f64, Option<Finding>)> {
    let last: Vec<(u32, u64)> =
        ledgers.iter().map(|(r, o)| (*r, o.last_of(group).map_or(0, |e| e.seq))).collect();
    let lo = last.iter().map(|(_, s)| *s).min()?;
    let hi = last.iter().map(|(_, s)| *s).max()?;
    // The first sequence number where the ranks' ops differ, among those every rank holds.
    let differ_at = (lo.saturating_sub(LEDGER_KEPT as u64)..=lo).filter(|s| *s > 0).find(|s| {
        let ops: Vec<Option<&str>> =
            ledgers.iter().map(|(_, o)| o.at(group, *s).map(|e| e.op.as_str())).collect();
        ops.iter().all(Option::is_some) && ops.iter().any(|op| *op != ops[0])
    });
    let mut f = Finding::of(&COLLECTIVE_MISMATCH);
    let places = if ledgers.len() > crate::diagnose::words::EACH_RANK_MAX {
        let each: Vec<(u32, String)> = ledgers
            .iter()
            .map(|(r, o)| match o.last_of(group) {
                Some(e) if e.ms.is_none() => (*r, format!("in {}", e.render())),
                Some(e) => (*r, format!("last {}, returned", e.render())),
                None => (*r, "issued none".to_string()),
            })
            .collect();
        crate::diagnose::words::each_rank(&each, "; ")
    } else {
        ledgers.iter().map(|(r, o)| standing(*r, o.last_of(group))).collect::<Vec<_>>().join("; ")
    };
    f.evidence.push(format!("from the observer's collective ledgers: {places}"));
    f.evidence.extend(super::group_count::group_count_evidence(ev));
    if let Some(seq) = differ_at {
        return Some((issued_at(ledgers, group, seq), Some(ops_differ(ledgers, group, seq, f))));
    }
    if lo == hi {
        return None;
    }
    let seq = lo + 1;
    let havers: Vec<u32> = last.iter().filter(|(_, s)| *s >= seq).map(|(r, _)| *r).collect();
    let lackers: Vec<u32> = last.iter().filter(|(_, s)| *s < seq).map(|(r, _)| *r).collect();
    let issued = ledgers.iter().find_map(|(_, o)| o.at(group, seq))?.render();
    let waiting = ledgers
        .iter()
        .filter(|(r, _)| havers.contains(r))
        .all(|(_, o)| o.last_of(group).is_some_and(|e| e.ms.is_none()));
    let lacker_last = |r: u32| {
        ledgers
            .iter()
            .find(|(x, _)| *x == r)
            .and_then(|(_, o)| o.last_of(group))
            .map_or_else(|| "it issued none before".to_string(), |e| format!("its last was {}", e.render()))
    };
    // In a tie, the ledger shows a skip only where the ranks that lack the collective issued
    // that op from that call site before (they were on the path that issues it, then left
    // it): a rank that never issued it there may as well be where the program meant it to be
    // while the others added a collective (ran out of data, reached a barrier early), and it
    // may wait in what the ledger cannot see (DDP's gradient reductions run in C++). Then the
    // ledger cannot tell, and the stacks decide (`ranks-out-of-step`). The site matters: a
    // framework issues the same ops for itself (Lightning's setup barriers, all from the
    // program's `trainer.fit` line), which say nothing of the path the program's own takes.
    let (op, site) = ledgers
        .iter()
        .find_map(|(_, o)| o.at(group, seq))
        .map_or(("", ""), |e| (e.op.as_str(), e.site.as_str()));
    let issued_before = lackers.iter().all(|l| {
        ledgers
            .iter()
            .find(|(r, _)| r == l)
            .is_some_and(|(_, o)| o.ledger.iter().any(|e| e.group == group && e.op == op && e.site == site))
    });
    if lackers.len() == havers.len() && !issued_before {
        return None;
    }
    if issued_after_lackers_failed(ev, ledgers, group, seq, &lackers)
        || lackers.iter().any(|l| raised(ev, *l))
    {
        return None;
    }
    let when = issued_at(ledgers, group, seq);
    if lackers.len() < havers.len() || (lackers.len() == havers.len() && waiting) {
        let last = lacker_last(lackers[0]);
        let missing = Missing { lackers: &lackers, havers: &havers, waiting, issued: &issued, last: &last };
        return Some((when, never_issued(ev, f, missing)));
    } else if havers.len() < lackers.len() {
        if havers.len() == 1 {
            f.culprit = Some(havers[0]);
        }
        f.headline = Some(format!(
            "Collectives out of step: {} issued {issued}, which no other rank issued ({} did not).",
            ranks_list(&havers),
            ranks_list(&lackers),
        ));
    } else {
        f.headline = Some(format!(
            "Collectives out of step: {} issued {issued} and {} did not. Cannot tell which rank diverged.",
            ranks_list(&havers),
            ranks_list(&lackers),
        ));
    }
    Some((when, Some(f)))
}

/// Whether rank `l` raised an error of its own (an exception, its traceback in its output): a
/// rank that lacks the others' collective because of it never got there, and the error is the
/// cause, which the other patterns name, not a collective it skipped (seen with TRL's SFT script:
/// rank 1 raised at step 3 while rank 0 had already issued the next `all_gather`). So where its
/// end was not read (`torch.multiprocessing.spawn` reaped it first: PyTorch-Ignite's `Parallel`,
/// 3 of 4 runs of the accuracy matrix's Ignite × exception): its own traceback says it raised.
/// The same rule either way: what ended it was not read, not something else.
fn raised(ev: &Evidence, l: u32) -> bool {
    ev.ranks.iter().find(|r| r.rank() == l).is_some_and(|r| {
        r.result.outcome == OutcomeKind::Exited
            && matches!(r.ended_by, EndedBy::Itself | EndedBy::Unknown)
            && r.key.as_ref().is_some_and(|k| k.is_exception())
    })
}

/// Whether every rank that lacks collective `seq` of `group` had failed (it was leaving: its exit
/// handlers ran, or its process had ended) before any rank issued it. Then it never issued it
/// because it was gone, not because it went another way: the collective is the others' reaction
/// (a launcher's SIGTERM handler that broadcasts, as Lightning's does; a clean-up `barrier`),
/// and the failure itself is the cause the other patterns name.
fn issued_after_lackers_failed(
    ev: &Evidence,
    ledgers: &[(u32, &ObservedProgram)],
    group: &str,
    seq: u64,
    lackers: &[u32],
) -> bool {
    let issued_at = ledgers.iter().filter_map(|(_, o)| o.at(group, seq)?.at_s).min_by(f64::total_cmp);
    let Some(issued_at) = issued_at else { return false };
    lackers.iter().all(|l| {
        ev.ranks.iter().find(|r| r.rank() == *l).is_some_and(|r| {
            let leaving = r.result.observed.as_ref().and_then(|o| o.exiting_at_s);
            let gone = [leaving, r.result.ended_at_s].into_iter().flatten().min_by(f64::total_cmp);
            r.failed() && gone.is_some_and(|at| at < issued_at)
        })
    })
}

/// The ranks that never issued what the others issued (and wait in, when `waiting`).
struct Missing<'a> {
    lackers: &'a [u32],
    havers: &'a [u32],
    waiting: bool,
    /// The collective, rendered.
    issued: &'a str,
    /// The first lacking rank's last collective, rendered (`its last was …`).
    last: &'a str,
}

/// Where the ranks that never issued it are decides what can be said: past it in another
/// collective (they went another way); outside any (they were behind: not this pattern, the
/// stacks judge); not known (no stack: the ledger alone cannot tell a skip from a late rank).
fn never_issued(ev: &Evidence, mut f: Finding, m: Missing) -> Option<Finding> {
    let Missing { lackers, havers, waiting, issued, last } = m;
    let in_collective: Vec<bool> = lackers
        .iter()
        .filter_map(|l| {
            let rank = ev.ranks.iter().find(|r| r.rank() == *l)?;
            let thread = super::distributed::main_thread(rank)?;
            Some(super::distributed::collective_of(&thread.frames).is_some())
        })
        .collect();
    if in_collective.iter().any(|inside| !inside) {
        return None;
    }
    let seen = in_collective.len() == lackers.len();
    if lackers.len() == 1 {
        f.culprit = Some(lackers[0]);
    }
    let position = if seen {
        format!("{} had gone on past it into another collective", ranks_list(lackers))
    } else {
        format!(
            "{} had not issued it: skipped it, or was still busy elsewhere; no stack of {} was taken to tell which",
            ranks_list(lackers),
            if lackers.len() == 1 { "it" } else { "them" }
        )
    };
    f.headline = Some(format!(
        "Collectives out of step: {} never issued {issued}, which {} {}; {position} ({last}).",
        ranks_list(lackers),
        ranks_list(havers),
        match (waiting, havers.len()) {
            (true, 1) => "waits in",
            (true, _) => "wait in",
            (false, _) => "issued",
        },
    ));
    if !seen {
        f.cause = Some(format!(
            "{} had not issued the collective the others waited in: a rank-dependent path skipped it, or the rank \
             was still busy outside collectives (a long evaluation, I/O, a slow step) when the others gave up. The \
             ledger cannot tell these apart; the stacks of a hang can: with `limits.hang_after_s` below the process \
             group's timeout, ups-doctor takes every rank's stack before the group times out.",
            ranks_list(lackers).replacen('r', "R", 1)
        ));
    }
    Some(f)
}

/// A step's time where a rank may wait for the others: collectives, DDP's forward, backward.
fn waiting(o: &ObservedProgram) -> f64 {
    o.collective_ms + o.forward_ms + o.backward_ms
}

/// Whether every rank other than `rank` spent, over the whole run, at least half of `rank`'s extra
/// work (`gap` a step, over the fewest timed steps of any rank) more than `rank` waiting in
/// collectives, wherever they came: a program whose ranks meet only between steps (Accelerate's
/// test script trains with no collective in its steps and syncs its RNG and gathers its metrics
/// between them: rank 0 waited 10.9 s in them for rank 1's 300 ms steps, its own steps 0.2 ms)
/// waits for a slow rank there. Where a collective's time was not measured (0), nothing is said.
fn waited_between_steps(obs: &[(u32, &ObservedProgram)], rank: u32, gap: f64) -> bool {
    let Some(mine) = obs.iter().find(|(r, _)| *r == rank).map(|(_, o)| o.collective_total_ms) else {
        return false;
    };
    let steps = obs.iter().map(|(_, o)| o.timed_steps).min().unwrap_or(0) as f64;
    let extra = gap * steps;
    extra > 0.0
        && obs
            .iter()
            .filter(|(r, _)| *r != rank)
            .all(|(_, o)| o.collective_total_ms > 0.0 && o.collective_total_ms - mine >= extra / 2.0)
}

/// The least share of the slow rank's step a straggler's extra time must be: DeepSpeed's Trainer
/// with nothing injected had rank 1 12.2 ms in data loading against rank 0's 4.8 ms in a 108 ms
/// step on a loaded machine (the accuracy matrix, 2026-12-06), named a straggler before.
const MIN_STEP_SHARE: f64 = 0.1;

/// Fewest timed steps of every rank before step times are compared.
const TIMED_STEPS: u64 = 5;

/// Fewest timed steps of a short run (a test script's 3 steps) whose data loading is compared,
/// and only when the gap is beyond doubt: [`SHORT_RUN_RATIO`] times the others' and at least
/// [`SHORT_RUN_GAP_MS`] more, and every other rank waited in collectives for at least half of it.
const SHORT_RUN_STEPS: u64 = 2;
const SHORT_RUN_RATIO: f64 = 10.0;
const SHORT_RUN_GAP_MS: f64 = 50.0;

/// A run the time limit ended while every rank still made progress (none silent at the limit):
/// where one rank is a straggler by the account a passed run gets, the others waited for it and
/// it is the rank to look at; otherwise nothing (which rank the limit met first is no cause).
/// Seen with Ray Train's example, one rank 300 ms a batch slower in its DataLoader: both ranks
/// trained to their last step as the limit came, and rank 0 was named for ending first.
pub fn straggler_at_time_limit(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    let failing: Vec<&RankEvidence> = ev.ranks.iter().filter(|r| r.failed()).collect();
    let progressing = |r: &&RankEvidence| {
        r.result.outcome == OutcomeKind::TimedOut
            && crate::diagnose::evidence::silent_at_limit(r.result, ev.scenario).is_none()
    };
    if failing.len() < 2 || failing.len() != ev.ranks.len() || !failing.iter().all(progressing) {
        return None;
    }
    straggler(ev, first)
}

pub fn straggler(ev: &Evidence, _first: Option<&RankEvidence>) -> Option<Finding> {
    let all: Vec<(u32, &ObservedProgram)> = ev
        .ranks
        .iter()
        .map(|r| Some((r.rank(), observed(r).filter(|o| o.timed_steps >= SHORT_RUN_STEPS)?)))
        .collect::<Option<_>>()?;
    if all.len() < 2 {
        return None;
    }
    if all.iter().any(|(_, o)| o.timed_steps < TIMED_STEPS) {
        return short_run_straggler(&all);
    }
    let obs = all;
    let with_collectives = obs.iter().any(|(_, o)| o.collective_ms > 0.0);
    // A phase, how long a step spent in it, whether the others must be seen waiting for it, and
    // whether a rank can itself wait there for the others (DDP's forward broadcasts buffers).
    type Phase = (&'static str, fn(&ObservedProgram) -> f64, bool, bool);
    let mut phases: Vec<Phase> = vec![
        ("data loading (`DataLoader.__next__`)", |o| o.data_ms, false, false),
        ("DDP's forward", |o| o.forward_ms, false, true),
    ];
    if with_collectives {
        phases.push(("work outside collectives", |o| (o.step_ms - o.collective_ms).max(0.0), false, false));
    }
    // Where a rank can wait for the others: its collectives, DDP's forward (buffers broadcast)
    // and backward (the gradients' all-reduce, from C++, which the ledger does not time). Work
    // outside them that one rank does more of is that rank's own only where every other rank
    // waited in them for at least half of it (not where each rank ran at its own pace).
    if obs.iter().all(|(_, o)| o.backward_ms > 0.0) {
        phases.push((
            "work outside backward and collectives",
            |o| (o.step_ms - waiting(o)).max(0.0),
            true,
            false,
        ));
    }
    let mut best: Option<(f64, u32, &str, f64, f64, bool)> = None;
    for (name, of, must_wait, can_wait) in phases {
        let (rank, slow) = obs.iter().map(|(r, o)| (*r, of(o))).max_by(|a, b| a.1.total_cmp(&b.1))?;
        let others = obs.iter().filter(|(r, _)| *r != rank).map(|(_, o)| of(o)).fold(0.0, f64::max);
        let mine = obs.iter().find(|(r, _)| *r == rank).map_or(0.0, |(_, o)| waiting(o));
        let waited = !must_wait
            || obs
                .iter()
                .filter(|(r, _)| *r != rank)
                .all(|(_, o)| waiting(o) - mine >= (slow - others) / 2.0)
            || waited_between_steps(&obs, rank, slow - others);
        // Outside backward is the last resort: a phase that names where the time went wins.
        let better = best.is_none_or(|b| !must_wait && slow - others > b.0);
        // A gap that is a sliver of the step is noise on a shared machine, not a rank to act on.
        let step = obs.iter().find(|(r, _)| *r == rank).map_or(0.0, |(_, o)| o.step_ms);
        let felt = slow - others >= MIN_STEP_SHARE * step;
        let waited_there = can_wait
            && (another_worked(&obs, rank, slow - others)
                || another_slower_on_its_own(&obs, rank, slow - others));
        if waited && felt && !waited_there && slow >= 2.0 * others && slow - others >= 5.0 && better {
            best = Some((slow - others, rank, name, slow, others, must_wait));
        }
    }
    let (_, rank, phase, slow, others, must_wait) = best?;
    let starved = starved(&obs, rank, slow - others);
    let niced = niced_above(&obs, rank).filter(|_| starved);
    if (starved && niced.is_none()) || spun(&obs, rank, slow - others) {
        return None;
    }
    let mut f = Finding::of(&STRAGGLER);
    f.culprit = Some(rank);
    if let Some(line) = niced {
        f.evidence.push(line);
        f.next_step = Some(format!(
            "Run rank {rank} at the others' priority: no `nice` in the command that starts it, or `renice -n 0 -p \
             PID` for each of its threads (`ps -L -o tid= -p PID`; root to lower it); Ray sets its workers' with \
             `RAY_worker_niceness`."
        ));
    }
    let steps: Vec<String> = obs.iter().map(|(r, o)| format!("rank {r} {:.1} ms", o.step_ms)).collect();
    f.appendix = Some(format!(
        " Rank {rank} is a straggler: its steps spend {slow:.1} ms (median) in {phase}, the other ranks' at most \
         {others:.1} ms; the others wait for it."
    ));
    f.evidence.push(format!(
        "from the observer, median step time over the last steps: {}; in {phase}: rank {rank} {slow:.1} ms, the \
         others at most {others:.1} ms",
        steps.join(", ")
    ));
    if must_wait {
        let waits: Vec<String> = obs.iter().map(|(r, o)| format!("rank {r} {:.1} ms", waiting(o))).collect();
        f.evidence.push(format!(
            "from the observer, median time a step waited in backward (`torch.autograd.backward`, where DDP \
             all-reduces the gradients), DDP's forward and collectives: {}",
            waits.join(", ")
        ));
        whole_run_waits(&mut f, &obs);
    }
    Some(f)
}

/// Whether rank `rank`'s extra time a step (`gap` ms) was the machine's, not its own: by the
/// kernel's account its main thread waited for a CPU at least half of `gap` a step longer than
/// any other rank's, while it did no more work on a CPU than they (see `own_work` below). A rank with more
/// work of its own (a heavier batch, matrix products of its own) runs longer; one that sleeps
/// (a slow file system, a lock) neither runs nor waits longer; one that does the others' work
/// while they wait off the CPU (blocked in a collective) and the machine's other processes run
/// (DataLoader workers, other jobs) waits for a CPU: on two cores shared by two ranks, eight
/// workers and three other jobs, Hugging Face's Trainer with nothing injected had rank 1 14 ms a
/// step longer in DDP's forward (the accuracy matrix, 2026-12-06). Nothing is said where a
/// rank's kernel account is missing.
fn starved(obs: &[(u32, &ObservedProgram)], rank: u32, gap: f64) -> bool {
    let cpu = |r: u32| obs.iter().find(|(x, _)| *x == r).and_then(|(_, o)| step_account(o));
    let Some(mine) = cpu(rank) else { return false };
    let others: Option<Vec<_>> = obs.iter().filter(|(r, _)| *r != rank).map(|(r, _)| cpu(*r)).collect();
    let Some(others) = others.filter(|o| !o.is_empty()) else { return false };
    let waited = others.iter().map(|o| o.wait_ms).fold(f64::MIN, f64::max);
    let ran = others.iter().map(|o| o.run_ms).fold(f64::MIN, f64::max);
    // Its own work shows as time on a CPU, however stretched by the crowding: at ten processes
    // to a core a compute straggler's extra time is a tenth work and the rest waiting (PyTorch-
    // Ignite's rank 1 with 300 ms of matrix products a step beside three busy loops: 79 ms on a
    // CPU, 244 ms waiting, the others 3.4 ms and 4 ms). Ranks doing the same work differ by
    // noise: within a quarter of the others' time on a CPU, or an eighth of the gap.
    let own_work = ran_more(mine.run_ms, ran, gap);
    // Where every rank, this one too, waited for a CPU more than half of its step and at least the
    // gap, which phase each rank's waits fell in is the scheduler's: Lightning's LSTM demo under
    // Fabric's CLI with rank 1's fetches slowed, beside a test suite (2026-12-07, the accuracy
    // matrix), had rank 0 175 ms a step outside every waiting place and rank 1 as much more in
    // backward, each waiting for a CPU about 250 ms of a 390 ms step, rank 0 on a CPU no longer
    // than rank 1: rank 0 was named. A rank with more work of its own is still named; one that
    // slept (a slow disk) on so crowded a machine is not. (Ranks waiting a third of their step,
    // as Hugging Face's Trainer under DeepSpeed beside the suite did, are judged as before.)
    let step = |r: u32| obs.iter().find(|(x, _)| *x == r).map_or(f64::MAX, |(_, o)| o.step_ms);
    let crowded =
        obs.iter().all(|(r, _)| cpu(*r).is_some_and(|c| c.wait_ms >= gap && 2.0 * c.wait_ms > step(*r)));
    gap > 0.0 && (mine.wait_ms - waited >= gap / 2.0 || crowded) && !own_work
}

/// Where rank `rank` waited for a CPU because the kernel ranks it below the others: its main
/// thread runs at a higher nice value than every other rank's (all known). A rank that waited for
/// a CPU longer than the others with no more work of its own ([`starved`]) is the machine's doing
/// where the ranks are alike; one started with `nice` (or reniced by a scheduler) is its own:
/// every process at a lower nice value on its CPUs runs first. The evidence line, else `None`.
fn niced_above(obs: &[(u32, &ObservedProgram)], rank: u32) -> Option<String> {
    let of = |r: u32| obs.iter().find(|(x, _)| *x == r).and_then(|(_, o)| o.nice);
    let mine = of(rank)?;
    let others: Option<Vec<i32>> = obs.iter().filter(|(r, _)| *r != rank).map(|(r, _)| of(*r)).collect();
    let theirs = others?.into_iter().max()?;
    let wait =
        |r: u32| obs.iter().find(|(x, _)| *x == r).and_then(|(_, o)| o.cpu_per_step).map(|c| c.wait_ms);
    let others_wait =
        obs.iter().filter(|(r, _)| *r != rank).filter_map(|(r, _)| wait(*r)).fold(0.0, f64::max);
    (mine > theirs).then(|| {
        format!(
            "from the observer and the kernel's account: rank {rank}'s main thread runs at nice {mine}, the other \
             ranks' at {theirs} at most, and it waited for a CPU {:.1} ms a step, the others at most {others_wait:.1} \
             ms: where the CPUs are shared, every process at a lower nice value runs before it",
            wait(rank).unwrap_or(0.0)
        )
    })
}

/// The evidence, in any run that passed, that its ranks ran at a raised nice value and waited for
/// CPUs: ranks whose main thread runs above nice 0 and waited for a CPU at least a quarter of its
/// step. Every process on their CPUs at a lower nice value runs first; Ray starts its workers at
/// 15 (`RAY_worker_niceness`), so a Ray Train job beside any other work waits.
pub fn niced_ranks(ev: &Evidence) -> Option<String> {
    let obs: Vec<(u32, &ObservedProgram)> =
        ev.ranks.iter().filter_map(|r| Some((r.rank(), observed(r)?))).collect();
    let waited = |o: &ObservedProgram| {
        let c = o.cpu_per_step?;
        (o.nice? > 0 && 4.0 * c.wait_ms >= o.step_ms && c.wait_ms > 0.0)
            .then_some((o.nice?, c.wait_ms, o.step_ms))
    };
    let ranks: Vec<String> = obs
        .iter()
        .filter_map(|(r, o)| {
            let (nice, wait, step) = waited(o)?;
            Some(format!("rank {r} at nice {nice}, waiting {wait:.1} ms of a {step:.1} ms step"))
        })
        .collect();
    (!ranks.is_empty()).then(|| {
        format!(
            "from the observer and the kernel's account: ranks ran at a raised nice value and waited for a CPU ({}): \
             every process on their CPUs at a lower nice value runs first (Ray starts its workers at nice 15 unless \
             `RAY_worker_niceness` says otherwise)",
            ranks.join("; ")
        )
    })
}

/// A rank's kernel account a step (`cpu_per_step`), where it describes its steps: its main thread
/// cannot run and wait for a CPU longer than the step's wall time, so an account of more than
/// [`ACCOUNT_SLACK`] times its median step is mostly time between steps (the observer's figures are
/// means since the first timed step: a test script's other work, an evaluation). Seen with
/// Accelerate's `test_script.py`, rank 1's fetches slowed by 300 ms (the accuracy matrix,
/// 2026-12-08): rank 0's median step 0.56 ms against 249 ms on a CPU and 787 ms waiting "a step",
/// and rank 1 withheld as a crowded machine's. `None`: nothing is said from it.
fn step_account(o: &ObservedProgram) -> Option<crate::schema::CpuPerStep> {
    o.cpu_per_step.filter(|c| c.run_ms + c.wait_ms <= ACCOUNT_SLACK * o.step_ms + 1.0)
}

/// How much longer than a median step a step's kernel account may be and still be the step's: a
/// mean over steps of uneven length is longer than their median.
const ACCOUNT_SLACK: f64 = 2.0;

/// Whether a rank's main thread, `mine` ms a step on a CPU, did more work there than the others'
/// (at most `ran`) by enough to account for some of a `gap` ms longer step: ranks doing the same
/// work differ by noise, within a quarter of the others' time on a CPU or an eighth of the gap.
fn ran_more(mine: f64, ran: f64, gap: f64) -> bool {
    mine - ran > (gap / 8.0).max(0.25 * ran)
}

/// Whether rank `rank`'s extra time a step (`gap` ms), which by the kernel's account its main
/// thread spent on a CPU, may be PyTorch's intra-op threads waiting for each other rather than
/// work: the rank computes with several (OpenMP's), and its threads other than the main one
/// waited for a CPU longer than they ran and at least half of `gap` a step. OpenMP's threads spin
/// at each parallel region's barrier until the last one arrives; one waiting for a CPU keeps the
/// others spinning, and that spinning is time on a CPU the kernel cannot tell from work. Seen with
/// Lightning's LSTM demo under Fabric's CLI with nothing injected, beside a test suite (2026-12-07,
/// the accuracy matrix): two ranks of 2 intra-op threads each on 2 CPUs, rank 1 132 ms a step longer
/// in DDP's forward with 105 ms more on a CPU, its other threads waiting 412 ms a step and running
/// 181 — and rank 1 waited in backward for rank 0 636 ms a step. Spinning, like any crowding, makes
/// the ranks take turns being slow: a rank that itself waited for the others (in backward and
/// collectives) at least half of `gap` a step was as much held up as holding up. A rank with more
/// work of its own waits for nobody: the same program with rank 1 computing 300 ms more a step had
/// its other threads wait too (401 ms a step, running 228), but rank 1 waited 25 ms a step in
/// backward, rank 0 328 ms — rank 1 is named. Nothing is said where a rank's account is missing.
fn spun(obs: &[(u32, &ObservedProgram)], rank: u32, gap: f64) -> bool {
    let Some((_, o)) = obs.iter().find(|(r, _)| *r == rank) else { return false };
    let Some(mine) = step_account(o) else { return false };
    let (Some(run), Some(wait)) = (mine.others_run_ms, mine.others_wait_ms) else { return false };
    let ran = obs.iter().filter(|(r, _)| *r != rank).filter_map(|(_, o)| step_account(o).map(|c| c.run_ms));
    let ran = ran.fold(f64::MIN, f64::max);
    gap > 0.0
        && o.intra_op_threads.is_some_and(|n| n >= 2)
        && ran > f64::MIN
        && ran_more(mine.run_ms, ran, gap)
        && wait > run
        && wait >= gap / 2.0
        && o.backward_ms + o.collective_ms >= gap / 2.0
}

/// The evidence, in any run that passed, that its ranks' PyTorch threads waited for CPUs: where a
/// rank computing with several intra-op threads had its other threads wait for a CPU longer than
/// they ran and over a quarter of its step. Ranks whose threads together outnumber the CPUs they
/// share crowd each other out (torchrun sets `OMP_NUM_THREADS=1` a rank for it where it is unset),
/// and OpenMP's spinning then shows as work.
pub fn threads_waited(ev: &Evidence) -> Option<String> {
    let obs: Vec<(u32, &ObservedProgram)> =
        ev.ranks.iter().filter_map(|r| Some((r.rank(), observed(r)?))).collect();
    let waited = |o: &ObservedProgram| {
        let c = o.cpu_per_step?;
        let (run, wait) = (c.others_run_ms?, c.others_wait_ms?);
        (o.intra_op_threads? >= 2 && wait > run && 4.0 * wait > o.step_ms).then_some((run, wait))
    };
    if !obs.iter().any(|(_, o)| waited(o).is_some()) {
        return None;
    }
    let ranks: Vec<String> = obs
        .iter()
        .filter_map(|(r, o)| {
            let c = o.cpu_per_step?;
            Some(format!(
                "rank {r} {} threads on {} CPUs, its other threads waiting {:.1} ms a step and running {:.1} ms",
                o.intra_op_threads?,
                o.cpus?,
                c.others_wait_ms?,
                c.others_run_ms?
            ))
        })
        .collect();
    Some(format!(
        "from the observer and the kernel's account: the ranks' PyTorch threads waited for CPUs longer than they \
         ran ({}; intra-op threads are `torch.get_num_threads()`, set by `OMP_NUM_THREADS`): where the ranks' threads \
         outnumber the CPUs they share, OpenMP's threads spin waiting for each other, a rank's time on a CPU is not \
         its work alone, and no rank is named a straggler for time it spent on a CPU",
        ranks.join("; ")
    ))
}

/// Whether rank `rank`'s extra time a step (`gap` ms) in a phase where it can wait for the others
/// was such a wait: by the kernel's account another rank ran on a CPU at least half of `gap` a step
/// longer than it. Seen with TRL's DPO script, rank 1 computing 300 ms more before each optimizer
/// step: rank 0 spent 309 ms a step in DDP's forward, in its buffers' broadcast, waiting for rank 1
/// (rank 0 on a CPU 40 ms a step, rank 1 337 ms), and was named the straggler. Nothing is said where
/// a rank's account is missing.
fn another_worked(obs: &[(u32, &ObservedProgram)], rank: u32, gap: f64) -> bool {
    let cpu = |r: u32| obs.iter().find(|(x, _)| *x == r).and_then(|(_, o)| o.cpu_per_step);
    let Some(mine) = cpu(rank) else { return false };
    obs.iter()
        .filter(|(r, _)| *r != rank)
        .filter_map(|(r, _)| cpu(*r))
        .any(|o| gap > 0.0 && o.run_ms - mine.run_ms >= gap / 2.0)
}

/// Whether another rank than `rank` spent at least half of `gap` a step longer than it outside every
/// place where ranks wait for each other (its data loading, its own work): what `rank` waited for
/// in a phase where it can wait. TRL's DPO script with rank 1's DataLoader 300 ms a fetch slower
/// (2026-12-07, the accuracy matrix): rank 1 132 ms a step in data loading, rank 0 143 ms in DDP's
/// forward waiting for it, and the larger of the two gaps named rank 0 (both asleep: the kernel's
/// account could not tell).
fn another_slower_on_its_own(obs: &[(u32, &ObservedProgram)], rank: u32, gap: f64) -> bool {
    let own = |o: &ObservedProgram| (o.step_ms - waiting(o)).max(0.0);
    let Some(mine) = obs.iter().find(|(r, _)| *r == rank).map(|(_, o)| own(o)) else { return false };
    gap > 0.0 && obs.iter().filter(|(r, _)| *r != rank).any(|(_, o)| own(o) - mine >= gap / 2.0)
}

/// The evidence of [`waited_between_steps`], where every rank measured it.
fn whole_run_waits(f: &mut Finding, obs: &[(u32, &ObservedProgram)]) {
    if obs.iter().all(|(_, o)| o.collective_total_ms > 0.0) {
        let totals: Vec<String> =
            obs.iter().map(|(r, o)| format!("rank {r} {:.1} s", o.collective_total_ms / 1000.0)).collect();
        f.evidence.push(format!(
            "from the observer, time in collectives over the whole run (in steps and between them): {}",
            totals.join(", ")
        ));
    }
}

/// A run too short for medians to be compared (fewer than [`TIMED_STEPS`] timed steps on some
/// rank): a rank whose time in data loading, or in work outside where ranks wait for each other,
/// is far beyond the others' while every other rank spent at least half that gap more than it
/// waiting (collectives, DDP's forward, backward) — for it. A gap the others did not wait out
/// (rank 0's logging at its own pace) names nobody.
fn short_run_straggler(obs: &[(u32, &ObservedProgram)]) -> Option<Finding> {
    type Phase = (&'static str, fn(&ObservedProgram) -> f64);
    let mut phases: Vec<Phase> = vec![("data loading (`DataLoader.__next__`)", |o| o.data_ms)];
    if obs.iter().all(|(_, o)| o.backward_ms > 0.0) {
        phases.push(("work outside backward and collectives", |o| (o.step_ms - waiting(o)).max(0.0)));
    }
    let (phase, rank, slow, most) = phases.into_iter().find_map(|(name, of)| {
        let (rank, slow) = obs.iter().map(|(r, o)| (*r, of(o))).max_by(|a, b| a.1.total_cmp(&b.1))?;
        let mine = obs.iter().find(|(r, _)| *r == rank).map_or(0.0, |(_, o)| waiting(o));
        let others: Vec<&ObservedProgram> = obs.iter().filter(|(r, _)| *r != rank).map(|(_, o)| *o).collect();
        let most = others.iter().map(|o| of(o)).fold(0.0, f64::max);
        let gap = slow - most;
        let waited =
            others.iter().all(|o| waiting(o) - mine >= gap / 2.0) || waited_between_steps(obs, rank, gap);
        (slow >= SHORT_RUN_RATIO * most && gap >= SHORT_RUN_GAP_MS && waited)
            .then_some((name, rank, slow, most))
    })?;
    if starved(obs, rank, slow - most) {
        return None;
    }
    let fewest = obs.iter().map(|(_, o)| o.timed_steps).min().unwrap_or(0);
    let mut f = Finding::of(&STRAGGLER);
    f.culprit = Some(rank);
    f.appendix = Some(format!(
        " Rank {rank} is a straggler: its steps spend {slow:.1} ms in {phase}, the other ranks' at most {most:.1} \
         ms, and the others wait for it."
    ));
    let waits: Vec<String> = obs.iter().map(|(r, o)| format!("rank {r} {:.1} ms", waiting(o))).collect();
    f.evidence.push(format!(
        "from the observer, over a short run ({fewest} timed steps): in {phase} rank {rank} {slow:.1} ms, the \
         others at most {most:.1} ms; waiting in collectives, DDP's forward and backward: {}",
        waits.join(", ")
    ));
    whole_run_waits(&mut f, obs);
    Some(f)
}

pub fn not_distributed(ev: &Evidence, _first: Option<&RankEvidence>) -> Option<Finding> {
    let declared = ev.scenario.launch.world_size;
    if declared < 2 || !ev.foreign {
        return None;
    }
    let obs: Vec<(u32, &ObservedProgram)> =
        ev.ranks.iter().filter_map(|r| Some((r.rank(), observed(r)?))).collect();
    let mut f = Finding::of(&NOT_DISTRIBUTED);
    let alone: Vec<&(u32, &ObservedProgram)> =
        obs.iter().filter(|(_, o)| o.steps > 0 && !o.distributed).collect();
    if !alone.is_empty() && obs.iter().all(|(_, o)| !o.distributed) {
        let steps = alone.iter().map(|(_, o)| o.steps).max().unwrap_or(0);
        let n = alone.len();
        f.appendix = Some(format!(
            " But it was not distributed: {declared} ranks were declared, {n} {} trained ({steps} optimizer steps) \
             and none called `init_process_group`.",
            if n == 1 { "process" } else { "processes" }
        ));
        f.evidence.push(format!(
            "from the observer: {n} of {declared} declared ranks reported optimizer steps, without a process group"
        ));
        return Some(f);
    }
    let sizes: Vec<(u32, u32)> =
        obs.iter().filter_map(|(r, o)| Some((*r, o.group.as_ref()?.world_size))).collect();
    let (rank, size) = sizes.iter().find(|(_, size)| *size != declared)?;
    f.appendix = Some(format!(
        " But the process group is not the one declared: {declared} ranks were declared, rank {rank} formed a \
         group of {size}."
    ));
    f.evidence.push(format!(
        "from the observer: the groups formed: {}",
        sizes.iter().map(|(r, s)| format!("rank {r} in a group of {s}")).collect::<Vec<_>>().join(", ")
    ));
    Some(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::evidence::Observed;
    use crate::schema::{GroupFormed, Leftovers, RankResult};

    fn entry(op: &str, seq: u64, ms: Option<f64>) -> LedgerEntry {
        LedgerEntry {
            op: op.into(),
            group: "default".into(),
            seq,
            shapes: "1".into(),
            dtype: "float32".into(),
            site: "train.py:40".into(),
            ms,
            at_s: None,
            pos: None,
            span: None,
        }
    }

    /// A hung rank whose ledger holds `ops` (the last still running when `in_it`).
    fn hung(rank: u32, ops: &[&str], in_it: bool) -> RankResult {
        let mut r = crate::report::fixtures::rank(rank, 3);
        r.outcome = OutcomeKind::Hung;
        let n = ops.len();
        let ledger = ops
            .iter()
            .enumerate()
            .map(|(i, op)| entry(op, i as u64 + 1, (i + 1 < n || !in_it).then_some(1.0)))
            .collect();
        r.observed = Some(ObservedProgram {
            group: Some(GroupFormed { backend: "gloo".into(), rank, world_size: 2, store: String::new() }),
            distributed: true,
            collectives: n as u64,
            ledger,
            ..Default::default()
        });
        r
    }

    /// `f` of the evidence gathered from `ranks` of `scenario`.
    fn with_evidence<T>(
        ranks: &[RankResult],
        scenario: &crate::scenario::Scenario,
        f: impl FnOnce(&Evidence) -> T,
    ) -> T {
        let leftovers = Leftovers::default();
        f(&Evidence::gather(&observed_of(ranks, scenario, &leftovers, 1.0)))
    }

    /// What the judge reads of `ranks` alone (no memory, kernel log, cgroup or launcher).
    fn observed_of<'a>(
        ranks: &'a [RankResult],
        scenario: &'a crate::scenario::Scenario,
        leftovers: &'a Leftovers,
        wall_s: f64,
    ) -> Observed<'a> {
        Observed {
            scenario,
            ranks,
            wall_s,
            memory: None,
            leftovers,
            oom_kills: &[],
            xids: &[],
            cgroup: None,
            launcher: None,
        }
    }

    fn judge(ranks: &[RankResult], scenario: &crate::scenario::Scenario) -> Option<Finding> {
        with_evidence(ranks, scenario, |ev| {
            let first = ev.ranks.first().cloned();
            collective_mismatch(ev, first.as_ref())
        })
    }

    fn scenario(world: u32) -> crate::scenario::Scenario {
        serde_json::from_str(&format!(
            r#"{{"command": ["python", "t.py"], "launch": {{"world_size": {world}}}}}"#
        ))
        .unwrap()
    }

    /// PyTorch-Ignite's `Parallel` (`torch.multiprocessing.spawn`) with rank 1 raising at step 3
    /// (the accuracy matrix's Ignite × exception): rank 0 had already issued its next metric
    /// `all_reduce`. Rank 1 raised, it skipped nothing, whether ups-doctor read its exit status or
    /// spawn reaped it first (3 runs of 4): the same verdict either way.
    #[test]
    fn a_rank_that_raised_skipped_nothing_whether_or_not_its_end_was_read() {
        let s = scenario(2);
        let raised = |exit_code: Option<i32>| {
            let mut r = hung(1, &["all_reduce", "all_reduce", "all_reduce"], false);
            r.outcome = OutcomeKind::Exited;
            r.exit_code = exit_code;
            r.error = Some(
                "RuntimeError: injected fault on rank 1 at step 3 (ignite_trainer.py:13 in training)".into(),
            );
            r
        };
        for end in [Some(1), None] {
            let ranks = [hung(0, &["all_reduce"; 4], true), raised(end)];
            let f = judge(&ranks, &s);
            assert!(f.is_none(), "exit status {end:?}: {:?}", f.and_then(|f| f.headline));
        }
    }

    /// Rank 0 ran out of data and waits in a barrier no rank issued before; rank 1 issued no
    /// collective the observer sees (it waits in DDP's C++ all-reduce): the ledger cannot say which
    /// diverged, so the pattern is not claimed (the stacks decide).
    #[test]
    fn a_collective_the_other_rank_never_issued_at_all_is_not_called_a_skip() {
        let s = scenario(2);
        let ranks = vec![hung(0, &["barrier"], true), hung(1, &[], false)];
        assert!(judge(&ranks, &s).is_none(), "{:?}", judge(&ranks, &s).and_then(|f| f.headline));
    }

    /// A collective a rank issued once ups-doctor had declared the hang (seen with Lightning: its
    /// SIGTERM handler broadcasts as the teardown reaches the rank that slept outside any
    /// collective) is its reaction to the teardown: without it, the ledgers agree, and the
    /// stacks judge. Issued before the hang was declared, the same entry is a mismatch.
    #[test]
    fn a_collective_issued_after_the_hang_was_declared_is_no_mismatch() {
        let s = scenario(2);
        let mut ranks = vec![hung(0, &["broadcast"; 2], false), hung(1, &["broadcast"; 3], true)];
        for r in &mut ranks {
            // Declared hung at 30 s, ended by the teardown at 35 s.
            r.hung_at_s = Some(30.0);
            r.ended_at_s = Some(35.0);
            for (i, e) in r.observed.as_mut().unwrap().ledger.iter_mut().enumerate() {
                e.at_s = Some(10.0 + i as f64);
            }
        }
        ranks[1].observed.as_mut().unwrap().ledger[2].at_s = Some(32.9);
        assert!(judge(&ranks, &s).is_none(), "{:?}", judge(&ranks, &s).and_then(|f| f.headline));
        // Without the times (an older result), the entry counts as it did before.
        for r in &mut ranks {
            r.observed.as_mut().unwrap().ledger.iter_mut().for_each(|e| e.at_s = None);
        }
        assert_eq!(judge(&ranks, &s).and_then(|f| f.culprit), Some(0), "rank 0 never issued it");
    }

    /// gloo aborted rank 0 (it received more than it expected); the ledgers show rank 1 passing
    /// 15 to the all-reduce it had always passed 8 at that call site, rank 0 passing 8 as ever:
    /// rank 1 is the one that differs, however many ranks there are.
    #[test]
    fn a_size_mismatch_names_the_rank_whose_size_changed_at_that_call_site() {
        let s = scenario(2);
        let mut ranks: Vec<RankResult> = (0..2).map(|r| hung(r, &["all_reduce"; 2], true)).collect();
        ranks[1].observed.as_mut().unwrap().ledger[1].shapes = "15".into();
        ranks[0].outcome = OutcomeKind::Signaled;
        ranks[0].signal = Some(crate::schema::Signal::ABRT);
        ranks[0].log_tail = vec![
            "terminate called after throwing an instance of 'gloo::EnforceNotMet'".into(),
            "  what():  [enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:456] op.preamble.length \
             <= op.nbytes. 60 vs 32. Received data size doesn't match expected size. Is there a distributed collective \
             mismatch in your code?"
                .into(),
        ];
        let f = with_evidence(&ranks, &s, |ev| size_mismatch(ev, ev.ranks.first())).expect("a size mismatch");
        assert_eq!(f.culprit, Some(1));
        let h = f.headline.unwrap();
        assert!(h.contains("it received 60 where it expected 32"), "{h}");
        assert!(
            h.ends_with(
                "Rank 1's size changed at that call site: it passed 1 to `all_reduce` there before, 15 now, where every \
                 other rank's stayed the same."
            ),
            "{h}"
        );
        // Without a history at that call site, which rank's size is wrong is not told.
        for r in &mut ranks {
            r.observed.as_mut().unwrap().ledger.remove(0);
        }
        let f = with_evidence(&ranks, &s, |ev| size_mismatch(ev, ev.ranks.first())).expect("a size mismatch");
        assert_eq!(f.culprit, None);
        assert!(f.headline.unwrap().contains("cannot be told from the sizes alone"));
    }

    /// Accelerate's `test_script.py` in the accuracy matrix (stop 67): every sync is an
    /// `all_gather`, a `broadcast` and a `broadcast_object_list`, in that order. Rank 1 skipped a
    /// `broadcast`; its `broadcast_object_list` was paired with rank 0's `broadcast` and gloo
    /// aborted it on the sizes (`64 vs 16`). Both ledgers reach the collective each was in (the
    /// aborted rank's from the file its observer maps): after the `all_gather` both issued, the
    /// program issued the `broadcast` the time before, and rank 1 did not. Without that history,
    /// neither is named.
    #[test]
    fn a_size_mismatch_of_ranks_that_issued_different_collectives_names_the_one_that_left_the_order() {
        let s = scenario(2);
        let sync = [
            ("all_gather", "operations.py:349"),
            ("broadcast", "operations.py:466"),
            ("broadcast_object_list", "operations.py:577"),
        ];
        let ledger = |skip: bool| -> Vec<LedgerEntry> {
            let mut calls: Vec<(&str, &str)> = sync.iter().chain(&sync).chain(&sync[..2]).copied().collect();
            if skip {
                calls[7] = sync[2];
            } else {
                calls.push(sync[2]);
            }
            let n = calls.len();
            calls
                .iter()
                .enumerate()
                .map(|(i, (op, site))| {
                    let mut e = entry(op, i as u64 + 1, (i + 1 < n).then_some(0.3));
                    e.site = site.to_string();
                    e
                })
                .collect()
        };
        let mut ranks: Vec<RankResult> = (0..2).map(|r| hung(r, &[], false)).collect();
        ranks[0].observed.as_mut().unwrap().ledger = ledger(false);
        ranks[1].observed.as_mut().unwrap().ledger = ledger(true);
        ranks[1].outcome = OutcomeKind::Signaled;
        ranks[1].signal = Some(crate::schema::Signal::ABRT);
        ranks[1].log_tail = vec![
            "  what():  [enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:456] op.preamble.length \
             <= op.nbytes. 64 vs 16. Received data size doesn't match expected size. Is there a distributed collective \
             mismatch in your code?"
                .into(),
        ];
        let f = with_evidence(&ranks, &s, |ev| size_mismatch(ev, ev.ranks.iter().find(|r| r.rank() == 1)))
            .expect("a size mismatch");
        assert_eq!(f.culprit, Some(1), "{:?}", f.headline);
        let h = f.headline.unwrap();
        assert!(h.contains("it received 64 where it expected 16"), "{h}");
        assert!(h.ends_with("rank 1 left the program's order."), "{h}");
        assert!(
            f.evidence.iter().any(|e| e.contains(
                "after `all_gather` #7 (operations.py:349, 1, float32), rank 1 issued `broadcast_object_list` #8 \
                 (operations.py:577, 1, float32) where the program issued `broadcast` (operations.py:466) next the \
                 time before (#5, on both ranks)"
            )),
            "{:#?}",
            f.evidence
        );
        // Without an earlier `all_gather` in the ledgers, what came after it cannot be compared.
        for r in &mut ranks {
            r.observed.as_mut().unwrap().ledger.drain(..6);
        }
        let f = with_evidence(&ranks, &s, |ev| size_mismatch(ev, ev.ranks.iter().find(|r| r.rank() == 1)))
            .expect("a size mismatch");
        assert_eq!(f.culprit, None, "{:?}", f.headline);
        assert!(f.headline.unwrap().contains("cannot be told"));
    }

    /// PyTorch-Ignite's `Parallel` in the accuracy matrix (stop 68): each step, DDP's gradient
    /// all-reduce (from C++, not in the ledger) and the program's metric `all_reduce`, so the
    /// metric one is every 2nd collective of the group on both ranks. Rank 1 skipped one; its next
    /// gradient all-reduce met rank 0's metric all-reduce at the group's collective 24 and gloo
    /// aborted rank 0 on the sizes. Both ledgers issue the same calls in the same order, but rank
    /// 1's own count of the group had passed 24 with no call there: rank 1 left the program's
    /// order. Named whichever rank it is; a stale count, a lost marker or no steady
    /// stride leaves it open.
    #[test]
    fn a_size_mismatch_where_a_ranks_count_passed_the_programs_next_call_names_that_rank() {
        let s = scenario(2);
        let ranks = |skipper: u32, count: u64, dropped: u64, from: u64| -> Vec<RankResult> {
            (0..2)
                .map(|r| {
                    let n = if r == skipper { 9 } else { 10 };
                    let mut rank = hung(r, &vec!["all_reduce"; n], r != skipper);
                    let o = rank.observed.as_mut().unwrap();
                    for (i, e) in o.ledger.iter_mut().enumerate() {
                        e.pos = Some(from + 2 * i as u64);
                        e.site = "ignite_trainer.py:13".into();
                    }
                    if r == skipper {
                        o.issued = Some(count);
                        o.dropped = dropped;
                    } else {
                        rank.outcome = OutcomeKind::Signaled;
                        rank.signal = Some(crate::schema::Signal::ABRT);
                        rank.log_tail = vec![
                            "  what():  [enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:456] \
                             op.preamble.length <= op.nbytes. 1156 vs 8. Received data size doesn't match expected \
                             size. Is there a distributed collective mismatch in your code?"
                                .into(),
                        ];
                    }
                    rank
                })
                .collect()
        };
        let culprit = |ranks: &[RankResult], skipper: u32| {
            let aborted = ranks.iter().find(|r| r.rank != skipper).map(|r| r.rank);
            with_evidence(ranks, &s, |ev| {
                let f = size_mismatch(ev, ev.ranks.iter().find(|r| Some(r.rank()) == aborted))
                    .expect("a size mismatch");
                (f.culprit, f.evidence.join("\n"), f.headline.unwrap_or_default())
            })
        };
        for skipper in 0..2 {
            let (named, evidence, headline) = culprit(&ranks(skipper, 24, 0, 6), skipper);
            assert_eq!(named, Some(skipper), "{headline}\n{evidence}");
            assert!(headline.ends_with(&format!("rank {skipper} left the program's order.")), "{headline}");
            assert!(
                evidence.contains(&format!(
                    "the program issued `all_reduce` (ignite_trainer.py:13) every 2 of the default group's collectives \
                     (the group's collective 22 was the last, on both ranks); rank {} issued it again as the group's \
                     collective 24, and rank {skipper}'s own count of the group's collectives passed 24 with no such call",
                    1 - skipper
                )),
                "{evidence}"
            );
        }
        // The count it sent last had not reached 24: it may not have got there.
        assert_eq!(culprit(&ranks(1, 23, 0, 6), 1).0, None);
        // But gloo paired rank 0's call at 24 with a message of another size from it, the only
        // other rank, and its ledger was read whole after it ended: it was there, and not with
        // the program's call.
        let mut read = ranks(1, 23, 0, 6);
        read[1].observed.as_mut().unwrap().kept = true;
        let (named, evidence, _) = culprit(&read, 1);
        assert_eq!(named, Some(1), "{evidence}");
        assert!(
            evidence.contains(
                "rank 0 issued it again as the group's collective 24, and the collective library paired that call \
                 with a message of another size from rank 1, whose ledger, read whole after it ended, holds nothing \
                 after the group's collective 22"
            ),
            "{evidence}"
        );
        // A marker lost: its ledger may lack the call.
        assert_eq!(culprit(&ranks(1, 24, 3, 6), 1).0, None);
        // Fewer than four calls in a row at one distance: no stride to follow.
        let mut short = ranks(1, 24, 0, 6);
        for r in &mut short {
            r.observed.as_mut().unwrap().ledger.drain(..6);
        }
        assert_eq!(culprit(&short, 1).0, None);
        // Rank 1 read rank 0's 8 bytes where it expected 1156 (gloo checks only that a message
        // is not longer than expected), went on and exited 0: the failure still began with it.
        let mut ended_well = ranks(1, 24, 0, 6);
        ended_well[1].outcome = OutcomeKind::Passed;
        ended_well[1].exit_code = Some(0);
        let leftovers = Leftovers::default();
        let j = crate::diagnose::verdict::judge(&observed_of(&ended_well, &s, &leftovers, 40.0));
        assert_eq!((j.outcome, j.first_failure), (OutcomeKind::Signaled, Some(1)), "{}", j.verdict.headline);
        assert!(
            j.verdict
                .headline
                .ends_with("rank 1 left the program's order. Rank 0 failed after it (collateral)."),
            "{}",
            j.verdict.headline
        );
    }

    #[test]
    fn the_rank_that_skipped_a_collective_is_named_whichever_it_is() {
        let s = scenario(2);
        for skipper in 0..2 {
            let ranks: Vec<RankResult> = (0..2)
                .map(|r| {
                    if r == skipper {
                        hung(r, &["all_gather"; 2], false)
                    } else {
                        hung(r, &["all_gather"; 3], true)
                    }
                })
                .collect();
            let f = judge(&ranks, &s).expect("a mismatch");
            assert_eq!(f.culprit, Some(skipper));
            let h = f.headline.unwrap();
            assert!(h.contains(&format!("rank {skipper} never issued `all_gather` #3 (train.py:40")), "{h}");
        }
        let s = scenario(4);
        let ranks: Vec<RankResult> =
            (0..4)
                .map(|r| {
                    if r == 2 {
                        hung(r, &["all_gather"; 2], false)
                    } else {
                        hung(r, &["all_gather"; 3], true)
                    }
                })
                .collect();
        assert_eq!(judge(&ranks, &s).unwrap().culprit, Some(2));
        // One rank issued a collective three others did not.
        let ranks: Vec<RankResult> =
            (0..4)
                .map(|r| {
                    if r == 3 {
                        hung(r, &["all_gather"; 3], true)
                    } else {
                        hung(r, &["all_gather"; 2], false)
                    }
                })
                .collect();
        assert_eq!(judge(&ranks, &s).unwrap().culprit, Some(3));
    }

    /// DeepSpeed (ZeRO-1 under transformers' `Trainer`) reduces gradients on a group of its own
    /// (`1`) beside the default one. Rank 1 skipped its 59th collective, a default-group
    /// `all_gather` (#10) that rank 0 waits in, and went on into group 1's `all_reduce` #50, which
    /// rank 0, stuck, never issued (the ledgers as recorded). The default group's divergence came
    /// first; group 1's follows from it. Before, group `1` was looked at alone and rank 0 named.
    #[test]
    fn of_two_groups_out_of_step_the_one_that_diverged_first_names_the_rank() {
        // As recorded: both declared hung at 107.0 s, torn down by 113.9 s.
        let ranks = two_groups(include_str!("../fixtures/deepspeed_two_groups.json"), 106.98, 113.83);
        let f = judge(&ranks, &scenario(2)).expect("a mismatch");
        assert_eq!(f.culprit, Some(1), "{:?}", f.headline);
        let h = f.headline.unwrap();
        assert!(h.contains("rank 1 never issued `all_gather` #10 (hf_trainer.py:12, 1,1,1, int64)"), "{h}");
    }

    /// The same cell of the matrix on a loaded machine (stop 66): rank 1, having skipped the
    /// default group's `all_gather` #10, issued group 1's `all_reduce` #50 0.29 s before rank 0
    /// issued that `all_gather`, so the group that diverged first by the clock was group 1, and rank
    /// 0 was named. The program's order decides: after group 1's `all_gather_into_tensor` both
    /// ranks issued the default group's `all_gather` each step before; rank 1 did not this time.
    /// Without that history in the ledgers, neither rank is named.
    #[test]
    fn of_two_groups_out_of_step_the_programs_order_not_the_clock_names_the_rank() {
        let recorded = include_str!("../fixtures/deepspeed_two_groups_rank1_first.json");
        let ranks = two_groups(recorded, 122.34, 129.58);
        let f = judge(&ranks, &scenario(2)).expect("a mismatch");
        assert_eq!(f.culprit, Some(1), "{:?}", f.headline);
        let h = f.headline.unwrap();
        assert!(h.contains("rank 1 never issued `all_gather` #10 (hf_trainer.py:12, 1,1,1, int64)"), "{h}");
        // No earlier `all_gather_into_tensor` of group 1 in the ledgers: nothing to compare with.
        let mut ranks = two_groups(recorded, 122.34, 129.58);
        for r in &mut ranks {
            let ledger = &mut r.observed.as_mut().unwrap().ledger;
            let last = ledger.iter().rposition(|e| e.op == "all_gather_into_tensor").unwrap();
            let mut i = 0;
            ledger.retain(|e| {
                i += 1;
                e.op != "all_gather_into_tensor" || i - 1 == last
            });
        }
        let f = judge(&ranks, &scenario(2)).expect("a mismatch");
        assert_eq!(f.culprit, None, "{:?}", f.headline);
        assert!(f.evidence.iter().any(|e| e.contains("which left the program's order cannot be told")));
    }

    /// Ranks of a recorded DeepSpeed hang, their observers as `json` holds them.
    fn two_groups(json: &str, hung_at_s: f64, ended_at_s: f64) -> Vec<RankResult> {
        let recorded: Vec<ObservedProgram> = serde_json::from_str(json).unwrap();
        recorded
            .into_iter()
            .enumerate()
            .map(|(rank, o)| {
                let mut r = hung(rank as u32, &[], false);
                r.observed = Some(o);
                r.hung_at_s = Some(hung_at_s);
                r.ended_at_s = Some(ended_at_s);
                r
            })
            .collect()
    }

    /// Accelerate's `test_sync.py` (3 optimizer steps, 2 of them timed) with every DataLoader
    /// fetch of rank 1 300 ms slower (the accuracy matrix's slow-data fault; the observer's
    /// figures as recorded): rank 0 waited 301.8 ms a step in its collectives for rank 1's 300.7
    /// ms of data loading. Too few steps for the medians, so before no rank was named.
    #[test]
    fn a_short_run_names_the_rank_the_others_waited_for_while_it_loaded_data() {
        let passed = |rank: u32, data_ms: f64, collective_ms: f64| {
            let mut r = crate::report::fixtures::rank(rank, 3);
            r.outcome = OutcomeKind::Passed;
            r.observed = Some(ObservedProgram {
                distributed: true,
                steps: 3,
                timed_steps: 2,
                data_ms,
                step_ms: 306.0,
                forward_ms: 0.2,
                collective_ms,
                ..Default::default()
            });
            r
        };
        let s = scenario(2);
        let ranks = [passed(0, 0.214, 301.779), passed(1, 300.653, 3.7)];
        let f = with_evidence(&ranks, &s, |ev| straggler(ev, None)).expect("a straggler");
        assert_eq!(f.culprit, Some(1));
        assert!(
            f.appendix.unwrap().contains("Rank 1 is a straggler: its steps spend 300.7 ms in data loading")
        );
        // Rank 0 did not wait for it: two ranks each at its own pace, nothing to name.
        let ranks = [passed(0, 0.214, 3.0), passed(1, 300.653, 3.7)];
        assert!(with_evidence(&ranks, &s, |ev| straggler(ev, None)).is_none());
        // A gap of a few milliseconds in a short run says nothing.
        let ranks = [passed(0, 0.2, 301.0), passed(1, 20.0, 3.7)];
        assert!(with_evidence(&ranks, &s, |ev| straggler(ev, None)).is_none());
    }

    /// DDP's gradient all-reduce runs from C++ inside backward: a rank busy 300 ms outside it
    /// (before its optimizer step) holds the other in its next backward, where no collective is
    /// timed. Named only where the other waited there; each rank at its own pace names none.
    #[test]
    fn work_outside_backward_that_the_others_wait_for_in_backward_names_the_rank() {
        let passed = |rank: u32, backward_ms: f64, step_ms: f64| {
            let mut r = crate::report::fixtures::rank(rank, 20);
            r.outcome = OutcomeKind::Passed;
            r.observed = Some(ObservedProgram {
                distributed: true,
                steps: 20,
                timed_steps: 19,
                step_ms,
                forward_ms: 2.0,
                backward_ms,
                ..Default::default()
            });
            r
        };
        let s = scenario(2);
        let ranks = [passed(0, 305.0, 312.0), passed(1, 4.0, 312.5)];
        let f = with_evidence(&ranks, &s, |ev| straggler(ev, None)).expect("a straggler");
        assert_eq!(f.culprit, Some(1));
        let appendix = f.appendix.unwrap();
        assert!(
            appendix.contains(
                "Rank 1 is a straggler: its steps spend 306.5 ms (median) in work outside backward"
            ),
            "{appendix}"
        );
        assert!(
            f.evidence.iter().any(|e| e.contains("waited in backward") && e.contains("rank 0 307.0 ms")),
            "{:?}",
            f.evidence
        );
        // The same work on rank 1 with rank 0 not waiting (its own pace: a shorter step).
        let ranks = [passed(0, 4.0, 12.0), passed(1, 4.0, 312.5)];
        assert!(with_evidence(&ranks, &s, |ev| straggler(ev, None)).is_none());
        // A rank slow inside backward itself: both ranks spend it there, nothing to name.
        let ranks = [passed(0, 305.0, 312.0), passed(1, 305.0, 312.5)];
        assert!(with_evidence(&ranks, &s, |ev| straggler(ev, None)).is_none());
        // No backward timed (an older observer): the phase is not compared.
        let ranks = [passed(0, 0.0, 312.0), passed(1, 0.0, 312.5)];
        assert!(with_evidence(&ranks, &s, |ev| straggler(ev, None)).is_none());
        // DeepSpeed's Trainer with nothing injected, on a loaded machine (the accuracy matrix):
        // rank 1 12.2 ms in data loading against 4.8 ms, in a 108 ms step: a sliver, no straggler.
        let with_data = |rank: u32, data_ms: f64, collective_ms: f64, backward_ms: f64, step_ms: f64| {
            let mut r = passed(rank, backward_ms, step_ms);
            let o = r.observed.as_mut().unwrap();
            (o.data_ms, o.collective_ms, o.forward_ms) = (data_ms, collective_ms, 0.0);
            r
        };
        let ranks = [with_data(0, 4.85, 36.6, 21.7, 109.4), with_data(1, 12.2, 18.9, 24.5, 108.2)];
        assert!(with_evidence(&ranks, &s, |ev| straggler(ev, None)).is_none());
        // A short run (Accelerate's 3-step test script, 2 timed steps): the same, beyond doubt.
        let short = |mut r: RankResult| {
            r.observed.as_mut().unwrap().timed_steps = 2;
            r
        };
        let ranks = [short(passed(0, 305.0, 312.0)), short(passed(1, 4.0, 312.5))];
        let f = with_evidence(&ranks, &s, |ev| straggler(ev, None)).expect("a straggler in a short run");
        assert_eq!(f.culprit, Some(1));
        assert!(
            f.evidence.iter().any(|e| e.contains("over a short run (2 timed steps)")),
            "{:?}",
            f.evidence
        );
        // A gap of 40 ms in a short run says nothing.
        let ranks = [short(passed(0, 45.0, 52.0)), short(passed(1, 4.0, 52.0))];
        assert!(with_evidence(&ranks, &s, |ev| straggler(ev, None)).is_none());
    }

    /// Accelerate's test script with rank 1 slowed 300 ms a step (the accuracy matrix): no
    /// collective in its steps (rank 0's take 0.2 ms), while rank 0 waits for rank 1 in the syncs
    /// between them. The whole run's time in collectives shows who waited for whom; where rank 0
    /// did not wait (each rank at its own pace), nobody is named.
    #[test]
    fn a_rank_the_others_wait_for_between_steps_is_the_straggler() {
        let passed = |rank: u32, step_ms: f64, backward_ms: f64, total_ms: f64| {
            let mut r = crate::report::fixtures::rank(rank, 12);
            r.outcome = OutcomeKind::Passed;
            r.observed = Some(ObservedProgram {
                distributed: true,
                steps: 12,
                timed_steps: 11,
                step_ms,
                data_ms: 0.05,
                backward_ms,
                collective_total_ms: total_ms,
                ..Default::default()
            });
            r
        };
        let s = scenario(2);
        let ranks = [passed(0, 0.208, 0.049, 10_889.8), passed(1, 301.8, 0.284, 25.5)];
        let f = with_evidence(&ranks, &s, |ev| straggler(ev, None)).expect("a straggler");
        assert_eq!(f.culprit, Some(1));
        assert!(
            f.evidence.iter().any(|e| e.contains("over the whole run") && e.contains("rank 0 10.9 s")),
            "{:?}",
            f.evidence
        );
        // Rank 0 waited less than half of rank 1's extra 3.3 s: its own pace.
        let ranks = [passed(0, 0.208, 0.049, 1_500.0), passed(1, 301.8, 0.284, 25.5)];
        assert!(with_evidence(&ranks, &s, |ev| straggler(ev, None)).is_none());
        // Not measured (an older observer): nothing said.
        let ranks = [passed(0, 0.208, 0.049, 0.0), passed(1, 301.8, 0.284, 0.0)];
        assert!(with_evidence(&ranks, &s, |ev| straggler(ev, None)).is_none());
    }

    /// TRL's DPO script under Accelerate, rank 1 computing 300 ms more before each optimizer step (the
    /// accuracy matrix's held-out programs, 2026-12-07): rank 0 waited 309 ms a step in DDP's
    /// forward (its buffers' broadcast) for rank 1, on a CPU 40 ms a step against rank 1's 337 ms.
    /// The rank that worked is the straggler, not the one that waited in forward.
    #[test]
    fn a_rank_waiting_in_ddps_forward_for_a_rank_that_computes_is_not_the_straggler() {
        use crate::schema::CpuPerStep;
        let passed = |rank: u32, forward_ms: f64, cpu: Option<(f64, f64)>| {
            let mut r = crate::report::fixtures::rank(rank, 20);
            r.outcome = OutcomeKind::Passed;
            r.observed = Some(ObservedProgram {
                distributed: true,
                steps: 20,
                timed_steps: 19,
                step_ms: 352.8,
                forward_ms,
                backward_ms: 19.0,
                collective_ms: 7.8,
                cpu_per_step: cpu.map(|(run_ms, wait_ms)| CpuPerStep {
                    run_ms,
                    wait_ms,
                    others_run_ms: None,
                    others_wait_ms: None,
                }),
                ..Default::default()
            });
            r
        };
        let s = scenario(2);
        let ranks = [passed(0, 308.9, Some((39.6, 6.9))), passed(1, 8.3, Some((336.7, 4.7)))];
        let f = with_evidence(&ranks, &s, |ev| straggler(ev, None)).expect("a straggler");
        assert_eq!(f.culprit, Some(1), "{:?}", f.appendix);
        assert!(
            f.appendix.as_deref().is_some_and(|a| a.contains("work outside backward and collectives")),
            "{:?}",
            f.appendix
        );
        // Rank 1 asleep in its DataLoader (132 ms a step), rank 0 waiting for it in DDP's forward
        // (143 ms), neither on a CPU longer (the same program, slow data): rank 1, by its data.
        let slow_data = |rank: u32, forward_ms: f64, data_ms: f64, backward_ms: f64, run_ms: f64| {
            let mut r = passed(rank, forward_ms, Some((run_ms, 20.0)));
            let o = r.observed.as_mut().unwrap();
            (o.step_ms, o.data_ms, o.backward_ms, o.collective_ms) = (196.0, data_ms, backward_ms, 21.5);
            r
        };
        let ranks = [slow_data(0, 142.8, 2.7, 23.0, 30.1), slow_data(1, 10.0, 131.8, 25.9, 29.4)];
        let f = with_evidence(&ranks, &s, |ev| straggler(ev, None)).expect("a straggler");
        assert_eq!(f.culprit, Some(1), "{:?}", f.appendix);
        assert!(f.appendix.as_deref().is_some_and(|a| a.contains("data loading")), "{:?}", f.appendix);
        // Rank 0's forward its own work (it ran as long on a CPU, rank 1 waited for it in backward):
        // rank 0, as before.
        let mut waiter = passed(1, 8.3, Some((36.7, 4.7)));
        waiter.observed.as_mut().unwrap().backward_ms = 317.7;
        let ranks = [passed(0, 308.9, Some((339.6, 6.9))), waiter];
        let f = with_evidence(&ranks, &s, |ev| straggler(ev, None)).expect("a straggler");
        assert_eq!(f.culprit, Some(0), "{:?}", f.appendix);
    }

    /// Lightning's LSTM demo under Fabric's CLI, two ranks of 2 intra-op threads each on 2 CPUs
    /// beside a test suite (the accuracy matrix, 2026-12-07; figures of its result.json). Nothing
    /// injected: rank 1 132 ms a step longer in DDP's forward and 105 ms more on a CPU, while its
    /// other threads waited for a CPU 412 ms a step and ran 181 — OpenMP's spinning cannot be told
    /// from work, and nobody is named; the run's evidence says the threads waited. Rank 1 computing
    /// 300 ms more a step (the same program, the same machine), its extra time mostly not on a CPU:
    /// rank 1.
    #[test]
    fn a_rank_whose_intra_op_threads_waited_for_cpus_is_not_named_for_time_on_a_cpu() {
        use crate::schema::CpuPerStep;
        type Cpu = (f64, f64, f64, f64);
        let passed = |rank: u32, step: (f64, f64, f64), cpu: Cpu, threads: u32| {
            let mut r = crate::report::fixtures::rank(rank, 20);
            r.outcome = OutcomeKind::Passed;
            r.observed = Some(ObservedProgram {
                distributed: true,
                steps: 20,
                timed_steps: 19,
                step_ms: step.0,
                data_ms: 2.0,
                forward_ms: step.1,
                backward_ms: step.2,
                cpu_per_step: Some(CpuPerStep {
                    run_ms: cpu.0,
                    wait_ms: cpu.1,
                    others_run_ms: Some(cpu.2),
                    others_wait_ms: Some(cpu.3),
                }),
                intra_op_threads: Some(threads),
                cpus: Some(2),
                ..Default::default()
            });
            r
        };
        let s = scenario(2);
        let none = |threads: u32| {
            [
                passed(0, (967.0, 2.6, 740.5), (75.1, 154.2, 77.9, 176.3), threads),
                passed(1, (963.5, 135.1, 635.9), (179.9, 322.9, 181.5, 411.7), threads),
            ]
        };
        let ranks = none(2);
        assert!(with_evidence(&ranks, &s, |ev| straggler(ev, None)).is_none());
        let line = with_evidence(&ranks, &s, threads_waited).expect("the threads' wait said");
        assert!(
            line.contains("rank 1 2 threads on 2 CPUs, its other threads waiting 411.7 ms a step"),
            "{line}"
        );
        // One intra-op thread a rank: nothing spins for it, and its time on a CPU is its work.
        let ranks = none(1);
        assert_eq!(with_evidence(&ranks, &s, |ev| straggler(ev, None)).and_then(|f| f.culprit), Some(1));
        assert!(with_evidence(&ranks, &s, threads_waited).is_none());
        // Rank 1 computing 300 ms more a step, 168 ms of it on a CPU, its other threads waiting 401
        // ms a step and running 228: it waited 25 ms a step in backward, rank 0 328 ms. Rank 1.
        let ranks = [
            passed(0, (337.8, 3.4, 327.9), (53.4, 116.3, 55.2, 155.2), 2),
            passed(1, (338.1, 2.3, 24.8), (221.4, 331.5, 227.7, 400.8), 2),
        ];
        let f = with_evidence(&ranks, &s, |ev| straggler(ev, None));
        assert_eq!(f.and_then(|f| f.culprit), Some(1));
        // The compute straggler: 418 ms a step outside backward, only 36 ms more on a CPU.
        let ranks = [
            passed(0, (1036.8, 354.0, 600.8), (189.6, 383.6, 191.8, 419.4), 2),
            passed(1, (1021.1, 11.8, 591.0), (226.2, 411.6, 225.8, 534.9), 2),
        ];
        let f = with_evidence(&ranks, &s, |ev| straggler(ev, None));
        assert_eq!(f.and_then(|f| f.culprit), Some(1));
    }

    /// The shape above of a rank that waited for a CPU with no more work of its own (Hugging Face's
    /// Trainer beside other jobs), now with each rank's nice value: where rank 1's main thread runs
    /// at a higher one than rank 0's (started with `nice`, reniced), the kernel ranks it below the
    /// others on the CPUs they share, and it is named, with its nice value and the next step; where
    /// the ranks run at the same one (Ray starts every worker at 15), it is the machine's, as
    /// before, and a passed run's evidence says the ranks ran niced and waited.
    #[test]
    fn a_rank_that_waited_for_a_cpu_at_a_higher_nice_value_than_the_others_is_named() {
        use crate::schema::CpuPerStep;
        let passed = |rank: u32, forward_ms: f64, backward_ms: f64, cpu: (f64, f64), nice: i32| {
            let mut r = crate::report::fixtures::rank(rank, 40);
            r.outcome = OutcomeKind::Passed;
            r.observed = Some(ObservedProgram {
                distributed: true,
                steps: 40,
                timed_steps: 39,
                step_ms: 60.0,
                forward_ms,
                backward_ms,
                cpu_per_step: Some(CpuPerStep {
                    run_ms: cpu.0,
                    wait_ms: cpu.1,
                    others_run_ms: None,
                    others_wait_ms: None,
                }),
                nice: Some(nice),
                ..Default::default()
            });
            r
        };
        let s = scenario(2);
        let ranks = [passed(0, 8.8, 30.0, (25.0, 3.0), 0), passed(1, 22.9, 9.0, (26.0, 15.0), 19)];
        let f = with_evidence(&ranks, &s, |ev| straggler(ev, None)).expect("rank 1 named");
        assert_eq!(f.culprit, Some(1));
        assert!(
            f.evidence.iter().any(|e| e.contains(
                "rank 1's main thread runs at nice 19, the other ranks' at 0 at most, and it waited for a CPU 15.0 ms a \
                 step, the others at most 3.0 ms"
            )),
            "{:#?}",
            f.evidence
        );
        assert!(f.next_step.as_deref().is_some_and(|n| n.starts_with("Run rank 1 at the others' priority")));
        // The same nice value on every rank: the machine's.
        let ranks = [passed(0, 8.8, 30.0, (25.0, 3.0), 15), passed(1, 22.9, 9.0, (26.0, 15.0), 15)];
        assert!(with_evidence(&ranks, &s, |ev| straggler(ev, None)).is_none());
        // Waiting a quarter of its step and more at nice 15: said in a passed run.
        let line = with_evidence(&ranks, &s, niced_ranks).expect("the nice value said");
        assert!(line.contains("rank 1 at nice 15, waiting 15.0 ms of a 60.0 ms step"), "{line}");
        assert!(!line.contains("rank 0 at"), "rank 0 waited 3 ms of 60: {line}");
        let ranks = [passed(0, 8.8, 30.0, (25.0, 3.0), 0), passed(1, 22.9, 9.0, (26.0, 15.0), 0)];
        assert!(with_evidence(&ranks, &s, niced_ranks).is_none());
    }

    /// Accelerate's `test_script.py` with rank 1's fetches slowed by 300 ms (the accuracy matrix,
    /// 2026-12-08, figures of its result.json): its 12 steps are a sliver of a script that does
    /// much else, so each rank's kernel account "a step" (a mean since the first timed step) is
    /// mostly time between steps — rank 0 0.56 ms a step against 249 ms on a CPU and 787 ms
    /// waiting. Not the steps' account: rank 1 is named for its data loading, not withheld as the
    /// machine's.
    #[test]
    fn a_kernel_account_longer_than_the_steps_says_nothing_of_them() {
        use crate::schema::CpuPerStep;
        let passed = |rank: u32, step: (f64, f64, f64), cpu: (f64, f64, f64, f64), total: f64| {
            let mut r = crate::report::fixtures::rank(rank, 12);
            r.outcome = OutcomeKind::Passed;
            r.observed = Some(ObservedProgram {
                distributed: true,
                steps: 12,
                timed_steps: 11,
                step_ms: step.0,
                data_ms: step.1,
                backward_ms: step.2,
                collective_total_ms: total,
                cpu_per_step: Some(CpuPerStep {
                    run_ms: cpu.0,
                    wait_ms: cpu.1,
                    others_run_ms: Some(cpu.2),
                    others_wait_ms: Some(cpu.3),
                }),
                intra_op_threads: Some(1),
                cpus: Some(2),
                ..Default::default()
            });
            r
        };
        let s = scenario(2);
        let ranks = [
            passed(0, (0.56, 0.118, 0.104), (249.474, 787.271, 16.721, 329.291), 29544.087),
            passed(1, (301.611, 300.552, 0.286), (259.728, 714.336, 14.824, 443.1), 854.099),
        ];
        let f = with_evidence(&ranks, &s, |ev| straggler(ev, None)).expect("rank 1 named");
        assert_eq!(f.culprit, Some(1));
        assert!(f.appendix.as_deref().is_some_and(|a| a.contains("in data loading")), "{:?}", f.appendix);
    }

    /// Hugging Face's Trainer with nothing injected on two cores shared with other jobs (the
    /// accuracy matrix, 2026-12-06): rank 1 22.9 ms a step in DDP's forward, rank 0 8.8 ms, rank 0
    /// waiting for it in backward. The kernel's account says whose time it was: a rank that waited
    /// for a CPU with no more work of its own was slowed by the machine, and nobody is named; one
    /// whose time on a CPU grew (a compute straggler, its wait stretched by the same crowding) is.
    #[test]
    fn a_rank_slowed_by_waiting_for_a_cpu_is_no_straggler_one_with_more_work_is() {
        use crate::schema::CpuPerStep;
        let passed = |rank: u32, forward_ms: f64, backward_ms: f64, cpu: Option<(f64, f64)>| {
            let mut r = crate::report::fixtures::rank(rank, 40);
            r.outcome = OutcomeKind::Passed;
            r.observed = Some(ObservedProgram {
                distributed: true,
                steps: 40,
                timed_steps: 39,
                step_ms: 60.0,
                forward_ms,
                backward_ms,
                cpu_per_step: cpu.map(|(run_ms, wait_ms)| CpuPerStep {
                    run_ms,
                    wait_ms,
                    others_run_ms: None,
                    others_wait_ms: None,
                }),
                ..Default::default()
            });
            r
        };
        let s = scenario(2);
        let named =
            |ranks: &[RankResult]| with_evidence(ranks, &s, |ev| straggler(ev, None)).and_then(|f| f.culprit);
        // Without the kernel's account: named, as before.
        let ranks = [passed(0, 8.8, 30.0, None), passed(1, 22.9, 9.0, None)];
        assert_eq!(named(&ranks), Some(1));
        // Rank 1 ran as long as rank 0 and waited 12 ms a step more for a CPU: the machine's.
        let ranks = [passed(0, 8.8, 30.0, Some((25.0, 3.0))), passed(1, 22.9, 9.0, Some((26.0, 15.0)))];
        assert_eq!(named(&ranks), None);
        // Rank 1 ran 7 ms a step more (its own work) and waited 7 ms more: named.
        let ranks = [passed(0, 8.8, 30.0, Some((25.0, 3.0))), passed(1, 22.9, 9.0, Some((32.0, 10.0)))];
        assert_eq!(named(&ranks), Some(1));
        // A compute straggler on a machine crowded ten to a core (PyTorch-Ignite's, the accuracy
        // matrix's slow-step beside three busy loops): a tenth of its extra time on a CPU, the rest
        // waiting for one. Its own work: named.
        let ranks = [passed(0, 0.3, 30.0, Some((3.4, 4.0))), passed(1, 312.0, 9.0, Some((78.5, 244.1)))];
        assert_eq!(named(&ranks), Some(1));
        // Neither ran nor waited longer (it slept: a slow disk, a lock): named.
        let ranks = [passed(0, 8.8, 30.0, Some((25.0, 3.0))), passed(1, 22.9, 9.0, Some((25.0, 3.5)))];
        assert_eq!(named(&ranks), Some(1));
        // One rank's account missing: nothing is discounted.
        let ranks = [passed(0, 8.8, 30.0, None), passed(1, 22.9, 9.0, Some((26.0, 15.0)))];
        assert_eq!(named(&ranks), Some(1));
        // Every rank waited for a CPU more than half its step (60 ms) and longer than the gap, and
        // rank 1 ran no longer: where the waits fell is the crowding's, not rank 1's.
        let ranks = [passed(0, 8.8, 30.0, Some((25.0, 31.0))), passed(1, 22.9, 9.0, Some((25.0, 32.0)))];
        assert_eq!(named(&ranks), None);
        // A third of the step waiting, as a test suite beside makes it: judged as before.
        let ranks = [passed(0, 8.8, 30.0, Some((25.0, 20.0))), passed(1, 22.9, 9.0, Some((25.0, 21.0)))];
        assert_eq!(named(&ranks), Some(1));
        // The same crowding as the first, but rank 1 ran 7 ms a step more: its own work, named.
        let ranks = [passed(0, 8.8, 30.0, Some((25.0, 31.0))), passed(1, 22.9, 9.0, Some((32.0, 32.0)))];
        assert_eq!(named(&ranks), Some(1));
    }

    /// Ray Train's example with rank 1 300 ms a batch slower in its DataLoader (the accuracy
    /// matrix): the time limit came while both still trained. The straggler is named, as in a run
    /// that passed; with a rank silent at the limit, or none slower, nothing is.
    #[test]
    fn a_straggler_is_named_when_the_time_limit_ends_ranks_that_all_still_made_progress() {
        let timed_out = |rank: u32, data_ms: f64, backward_ms: f64| {
            let mut r = crate::report::fixtures::rank(rank, 375);
            r.outcome = OutcomeKind::TimedOut;
            r.observed = Some(ObservedProgram {
                distributed: true,
                steps: 375,
                timed_steps: 374,
                step_ms: 310.0,
                data_ms,
                backward_ms,
                ..Default::default()
            });
            r
        };
        let s = scenario(2);
        let named = |ranks: &[RankResult]| {
            with_evidence(ranks, &s, |ev| straggler_at_time_limit(ev, None)).and_then(|f| f.culprit)
        };
        assert_eq!(named(&[timed_out(0, 0.2, 305.0), timed_out(1, 300.5, 2.0)]), Some(1));
        assert_eq!(named(&[timed_out(0, 0.2, 3.0), timed_out(1, 0.3, 2.0)]), None, "none slower");
        let mut silent = timed_out(0, 0.2, 305.0);
        silent.silent_cpu = Some(crate::schema::SilentCpu { silent_s: 60.0, cpu_s: 40.0 });
        assert_eq!(named(&[silent, timed_out(1, 300.5, 2.0)]), None, "a rank silent at the limit");
    }

    #[test]
    fn different_ops_at_one_seq_name_the_minority_or_say_it_cannot_tell() {
        let s = scenario(2);
        let ranks = [hung(0, &["all_reduce", "barrier"], true), hung(1, &["all_reduce", "all_gather"], true)];
        let f = judge(&ranks, &s).unwrap();
        assert_eq!(f.culprit, None);
        // Undecided: the verdict then names no first failure by which rank's end came first.
        assert!(f.undecided);
        assert!(f.headline.unwrap().contains("Cannot tell which rank diverged"));
        // Two ranks, where the ledgers show what the program issued after an `all_reduce` before
        // (Accelerate's `test_script.py` in the accuracy matrix: rank 1 skipped an `all_gather`
        // and both hang, rank 0 in it, rank 1 in the `broadcast` after it): rank 1 left the order.
        let ranks = [
            hung(0, &["all_reduce", "all_gather", "broadcast", "all_reduce", "all_gather"], true),
            hung(1, &["all_reduce", "all_gather", "broadcast", "all_reduce", "broadcast"], true),
        ];
        let f = judge(&ranks, &s).unwrap();
        assert_eq!(f.culprit, Some(1), "{:?}", f.headline);
        assert!(!f.undecided);
        assert!(f.headline.unwrap().ends_with("rank 1 left the program's order of collectives."));
        let s = scenario(3);
        let ranks = [
            hung(0, &["all_reduce", "barrier"], true),
            hung(1, &["all_reduce", "all_gather"], true),
            hung(2, &["all_reduce", "barrier"], true),
        ];
        assert_eq!(judge(&ranks, &s).unwrap().culprit, Some(1));
    }

    #[test]
    fn ledgers_that_agree_or_a_rank_without_one_say_nothing() {
        let s = scenario(2);
        assert!(judge(&[hung(0, &["all_gather"; 3], true), hung(1, &["all_gather"; 3], true)], &s).is_none());
        let mut silent = hung(1, &["all_gather"; 2], false);
        silent.observed = None;
        assert!(judge(&[hung(0, &["all_gather"; 3], true), silent], &s).is_none());
    }

    /// Rank 0 waits in a `barrier` at the group's collective #9; rank 1 issued 9 (or 8), none
    /// through the Python functions (DDP's reductions, from C++).
    #[test]
    fn the_groups_own_count_says_who_issued_the_waited_collective_from_cpp_and_who_has_not_reached_it() {
        let with_count = |mut r: RankResult, n: u64, unseen: u64| {
            let o = r.observed.as_mut().unwrap();
            (o.issued, o.unseen, o.unseen_per_step) = (Some(n), Some(unseen), Some(3.0));
            if let Some(e) = o.ledger.last_mut() {
                e.pos = Some(n);
            }
            r
        };
        let lines = |ranks: &[RankResult]| {
            with_evidence(
                ranks,
                &crate::scenario::Scenario::default(),
                super::super::group_count::group_count_evidence,
            )
        };
        let barrier = with_count(hung(0, &["barrier"], true), 9, 8);
        let got = lines(&[barrier.clone(), with_count(hung(1, &[], false), 9, 9)]);
        assert_eq!(
            got,
            [
                "the process group's own count of the collectives issued on it (those from C++ included, which the \
                 ledger cannot see): rank 0 issued 9, 8 of them from C++ (3 a step: DDP's gradient reductions); rank 1 \
                 issued 9, 9 of them from C++ (3 a step: DDP's gradient reductions)",
                "at the group's collective #9, rank 0 waits in `barrier` #1 (train.py:40, 1, float32); rank 1 issued it \
                 from C++ (as DDP issues its gradient reductions)"
            ]
        );
        let got = lines(&[barrier.clone(), with_count(hung(1, &[], false), 8, 8)]);
        assert_eq!(
            got[1],
            "at the group's collective #9, rank 0 waits in `barrier` #1 (train.py:40, 1, float32); rank 1 had not \
             reached it when its count was last read (it had issued 8)"
        );
        // A rank whose kept ledger no longer reaches back to #9 (it dropped older entries) is not judged.
        let mut late = with_count(hung(1, &["all_reduce"], false), 60, 10);
        late.observed.as_mut().unwrap().collectives = 50;
        assert_eq!(lines(&[barrier.clone(), late]).len(), 1);
        // A rank whose observer kept no count: nothing.
        assert!(lines(&[barrier, hung(1, &[], false)]).is_empty());
    }
}
