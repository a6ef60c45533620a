//! Where each rank stands in its default process group's own count of collectives: the group
//! counts every collective issued on it (its sequence number), those DDP issues from C++ for its
//! gradient reductions included, which the observer's ledger of Python collectives cannot see.
//! Evidence for the hang patterns (`collective-mismatch`, `ranks-out-of-step`), not a pattern.

use crate::diagnose::evidence::Evidence;
use crate::diagnose::words::each_rank;
use crate::schema::ObservedProgram;

/// Where each rank stands in the default group's own count of collectives (the process group
/// keeps it; it counts those issued from C++, as DDP's gradient reductions are, which the ledger
/// cannot see), where every rank's observer read it: one line with each rank's count, and one
/// with the first collective a rank waits in that another rank either has not reached or
/// issued from C++. Empty where a rank's count is missing.
pub fn group_count_evidence(ev: &Evidence) -> Vec<String> {
    let Some(counts) = ev
        .ranks
        .iter()
        .map(|r| {
            let o = r.result.observed.as_ref()?;
            Some((r.rank(), o, o.issued?))
        })
        .collect::<Option<Vec<(u32, &ObservedProgram, u64)>>>()
    else {
        return Vec::new();
    };
    if counts.len() < 2 {
        return Vec::new();
    }
    let each: Vec<(u32, String)> = counts
        .iter()
        .map(|(r, o, n)| {
            let cpp = match (o.unseen, o.unseen_per_step) {
                (Some(u), Some(per)) if u > 0 => {
                    format!(", {u} of them from C++ ({per} a step: DDP's gradient reductions)")
                }
                (Some(u), None) if u > 0 => format!(", {u} of them from C++"),
                _ => String::new(),
            };
            (*r, format!("issued {n}{cpp}"))
        })
        .collect();
    let mut lines = vec![format!(
        "the process group's own count of the collectives issued on it (those from C++ included, which the ledger \
         cannot see): {}",
        each_rank(&each, "; ")
    )];
    // The first place a rank waits in that the others did not meet with the same collective
    // (not one it issued once ups-doctor had begun to end the run: a reaction to that).
    let cutoff = ev.teardown_began_at();
    let before_teardown =
        |e: &&crate::schema::LedgerEntry| e.at_s.is_none_or(|t| cutoff.is_none_or(|c| t <= c));
    let open = counts
        .iter()
        .filter_map(|(r, o, _)| {
            let e = o.last_of("default").filter(|e| e.ms.is_none()).filter(before_teardown)?;
            Some((*r, e, e.pos?))
        })
        .min_by_key(|(_, _, pos)| *pos);
    if let Some((waiter, entry, pos)) = open {
        let others: Vec<(u32, String)> = counts
            .iter()
            .filter(|(r, _, _)| *r != waiter)
            .filter_map(|(r, o, n)| {
                if *n < pos {
                    // Read every 0.25 s while it moves, and at exit: on a hang, its count then.
                    return Some((
                        *r,
                        format!("had not reached it when its count was last read (it had issued {n})"),
                    ));
                }
                // Only where its kept ledger reaches back that far (it dropped none, or its oldest
                // kept entry of the group is no later), and no entry of it is there.
                let kept_from = o.ledger.iter().find(|e| e.group == "default").and_then(|e| e.pos);
                let reaches = o.collectives as usize == o.ledger.len() || kept_from.is_some_and(|k| k <= pos);
                let from_cpp = reaches && !o.ledger.iter().any(|e| e.group == "default" && e.holds(pos));
                from_cpp
                    .then(|| (*r, "issued it from C++ (as DDP issues its gradient reductions)".to_string()))
            })
            .collect();
        if !others.is_empty() {
            lines.push(format!(
                "at the group's collective #{pos}, rank {waiter} waits in {}; {}",
                entry.render(),
                each_rank(&others, "; ")
            ));
        }
    }
    lines
}
