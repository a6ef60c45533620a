//! PyTorch's Flight Recorder matched across ranks: per process group, the first sequence id at
//! which the ranks' collectives part ways — a rank that never issued it, a different op, other
//! sizes or element types — with what each rank issued there and its last collective. Every
//! collective is in it, those issued from C++ too (DDP's gradient all-reduces, FSDP's
//! all-gathers), which the observer's ledger only counts. Ranks are aligned by sequence id, not
//! by position, so a ring that wrapped still matches. Pure.

use crate::diagnose::words::ranks_text;
use crate::schema::{FlightEntry, FlightRecord};

use super::super::evidence::Evidence;

/// Where the ranks' collectives part ways in one process group.
#[derive(Debug, Clone, PartialEq)]
pub struct Divergence {
    pub group: String,
    pub seq: u64,
    /// What each rank with a record did there: its entry, or `None` where it never issued it.
    pub at: Vec<(u32, Option<FlightEntry>)>,
    /// Each rank's last entry in the group.
    pub last: Vec<(u32, FlightEntry)>,
}

impl Divergence {
    /// The ranks that issued nothing at the divergence.
    #[cfg(test)]
    pub fn missing(&self) -> Vec<u32> {
        self.at.iter().filter(|(_, e)| e.is_none()).map(|(r, _)| *r).collect()
    }

    /// The sentence that says it: `At collective #57 of group default_pg the ranks part ways:
    /// rank 0 issued `gloo:all_reduce` of [577] Float; rank 1 never issued it (its last: #56, …)`.
    pub fn sentence(&self) -> String {
        let mut said: Vec<String> = Vec::new();
        // Ranks that did the same thing are said together.
        let mut done: Vec<u32> = Vec::new();
        for (rank, entry) in &self.at {
            if done.contains(rank) {
                continue;
            }
            let same: Vec<u32> = self
                .at
                .iter()
                .filter(|(_, e)| match (e, entry) {
                    (Some(a), Some(b)) => a.agrees(b),
                    (None, None) => true,
                    _ => false,
                })
                .map(|(r, _)| *r)
                .collect();
            done.extend(&same);
            let who = if same.len() == 1 {
                format!("rank {}", same[0])
            } else {
                format!("ranks {}", ranks_text(&same))
            };
            said.push(match entry {
                Some(e) => format!("{who} issued {}", e.render()),
                None => {
                    let lasts: Vec<String> = same
                        .iter()
                        .filter_map(|r| self.last.iter().find(|(l, _)| l == r))
                        .map(|(_, e)| format!("#{} {}", e.seq, e.render()))
                        .collect();
                    let last = if lasts.is_empty() {
                        String::new()
                    } else {
                        format!(" (its last: {})", lasts.join("; "))
                    };
                    format!("{who} never issued it{last}")
                }
            });
        }
        let kind = self.kind();
        format!(
            "Flight Recorder (every collective, C++ ones included): at collective #{} of group `{}` the ranks part \
             ways{kind}: {}",
            self.seq,
            self.group,
            said.join("; ")
        )
    }

    /// ` (different sizes)`, ` (different ops)`, or nothing where a rank is missing.
    fn kind(&self) -> &'static str {
        let present: Vec<&FlightEntry> = self.at.iter().filter_map(|(_, e)| e.as_ref()).collect();
        let Some(first) = present.first() else { return "" };
        if present.iter().any(|e| e.op != first.op) {
            " (different ops)"
        } else if present.iter().any(|e| e.sizes != first.sizes) {
            " (different sizes)"
        } else if present.iter().any(|e| e.dtypes != first.dtypes) {
            " (different element types)"
        } else {
            ""
        }
    }
}

/// The first divergence of the ranks' Flight Recorders: in the default group first, then in the
/// others by name; `None` with fewer than two records, or where every group agrees throughout.
pub fn divergence(records: &[(u32, &FlightRecord)]) -> Option<Divergence> {
    if records.len() < 2 {
        return None;
    }
    let mut groups: Vec<&str> = records
        .iter()
        .flat_map(|(_, r)| r.entries.iter().filter(|e| !e.p2p).map(|e| e.group.as_str()))
        .collect();
    groups.sort_by_key(|g| (*g != "default_pg" && *g != "0", *g));
    groups.dedup();
    groups.into_iter().find_map(|g| in_group(records, g))
}

fn in_group(records: &[(u32, &FlightRecord)], group: &str) -> Option<Divergence> {
    let of = |r: &FlightRecord| -> Vec<FlightEntry> {
        r.entries.iter().filter(|e| !e.p2p && e.group == group).cloned().collect()
    };
    let ranks: Vec<(u32, Vec<FlightEntry>)> = records.iter().map(|(rank, r)| (*rank, of(r))).collect();
    // Only ranks that issued something in the group take part; each ring's window starts where
    // its oldest kept entry is, and the comparison starts where every window has begun.
    let ranks: Vec<(u32, Vec<FlightEntry>)> = ranks.into_iter().filter(|(_, e)| !e.is_empty()).collect();
    if ranks.len() < 2 {
        return None;
    }
    let from = ranks.iter().map(|(_, e)| e[0].seq).max()?;
    let to = ranks.iter().map(|(_, e)| e[e.len() - 1].seq).max()?;
    for seq in from..=to {
        let at: Vec<(u32, Option<FlightEntry>)> =
            ranks.iter().map(|(rank, e)| (*rank, e.iter().find(|x| x.seq == seq).cloned())).collect();
        let present: Vec<&FlightEntry> = at.iter().filter_map(|(_, e)| e.as_ref()).collect();
        let parted = present.len() < at.len() || present.iter().any(|e| !e.agrees(present[0]));
        if parted {
            let last = ranks.iter().map(|(rank, e)| (*rank, e[e.len() - 1].clone())).collect();
            return Some(Divergence { group: group.to_string(), seq, at, last });
        }
    }
    None
}

/// The ranks' Flight Recorders that hold entries, by rank.
fn records<'e>(ev: &'e Evidence) -> Vec<(u32, &'e FlightRecord)> {
    ev.ranks
        .iter()
        .filter_map(|r| Some((r.rank(), r.result.observed.as_ref()?.flight.as_ref()?)))
        .filter(|(_, f)| !f.entries.is_empty())
        .collect()
}

/// The one rank that is behind where the recorders part ways: it never issued a collective that
/// every other rank issued alike (same op, sizes and types), so they wait in it for that rank.
/// `None` where the ranks differ in what they issued (a mismatch, not a rank behind), or where
/// more than one rank is missing or none is.
pub fn behind(ev: &Evidence) -> Option<(u32, Divergence)> {
    let d = divergence(&records(ev))?;
    let issued: Vec<&FlightEntry> = d.at.iter().filter_map(|(_, e)| e.as_ref()).collect();
    let missing: Vec<u32> = d.at.iter().filter(|(_, e)| e.is_none()).map(|(r, _)| *r).collect();
    let alike = issued.first().is_some_and(|first| issued.iter().all(|e| e.agrees(first)));
    match missing[..] {
        [rank] if alike => Some((rank, d)),
        _ => None,
    }
}

/// The evidence lines of the ranks' Flight Recorders on a failed or hung run: where they part
/// ways, or that they agree to their last collective; and which ranks handed none over.
pub fn lines(ev: &Evidence) -> Vec<String> {
    let records: Vec<(u32, &FlightRecord)> = ev
        .ranks
        .iter()
        .filter_map(|r| Some((r.rank(), r.result.observed.as_ref()?.flight.as_ref()?)))
        .collect();
    if records.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let with: Vec<(u32, &FlightRecord)> =
        records.iter().filter(|(_, r)| !r.entries.is_empty()).copied().collect();
    match divergence(&with) {
        Some(d) => out.push(d.sentence()),
        None if with.len() >= 2 => {
            let lasts: Vec<String> = with
                .iter()
                .filter_map(|(rank, r)| {
                    r.entries
                        .iter()
                        .rfind(|e| !e.p2p)
                        .map(|e| format!("rank {rank} #{} {}", e.seq, e.render()))
                })
                .collect();
            out.push(format!(
                "Flight Recorder (every collective, C++ ones included): the ranks issued the same collectives in \
                 every group; the last of each: {}",
                lasts.join("; ")
            ));
        }
        None => {}
    }
    for (rank, r) in &records {
        if let Some(e) = &r.error {
            out.push(format!("Flight Recorder of rank {rank}: not available ({e})"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: u64, op: &str, size: i64) -> FlightEntry {
        FlightEntry {
            group: "default_pg".into(),
            seq,
            p2p: false,
            op: op.into(),
            sizes: vec![vec![size]],
            dtypes: vec!["Float".into()],
            state: "scheduled".into(),
            created_ns: None,
            ms: None,
            at_s: None,
        }
    }

    fn record(entries: Vec<FlightEntry>) -> FlightRecord {
        FlightRecord { entries, error: None }
    }

    #[test]
    fn a_rank_that_never_issued_a_collective_is_named_with_what_the_others_issued_and_its_last() {
        let r0 = record((1..=6).map(|s| entry(s, "gloo:all_reduce", 577)).collect());
        let r1 = record((1..=5).map(|s| entry(s, "gloo:all_reduce", 577)).collect());
        let d = divergence(&[(0, &r0), (1, &r1)]).unwrap();
        assert_eq!((d.seq, d.missing()), (6, vec![1]));
        assert_eq!(
            d.sentence(),
            "Flight Recorder (every collective, C++ ones included): at collective #6 of group `default_pg` the ranks \
             part ways: rank 0 issued `gloo:all_reduce` of [577] Float; rank 1 never issued it (its last: #5 \
             `gloo:all_reduce` of [577] Float)"
        );
    }

    #[test]
    fn different_sizes_and_ops_are_said_as_such_and_agreeing_ranks_together() {
        let same = |last: FlightEntry| {
            let mut e: Vec<FlightEntry> = (1..=3).map(|s| entry(s, "gloo:broadcast", 10)).collect();
            e.push(last);
            record(e)
        };
        let (a, b, c) = (
            same(entry(4, "gloo:all_reduce", 16)),
            same(entry(4, "gloo:all_reduce", 16)),
            same(entry(4, "gloo:all_reduce", 8)),
        );
        let d = divergence(&[(0, &a), (1, &b), (2, &c)]).unwrap();
        assert_eq!(d.seq, 4);
        assert!(d.sentence().contains("part ways (different sizes): ranks 0–1 issued `gloo:all_reduce` of [16] Float; rank 2 issued `gloo:all_reduce` of [8] Float"), "{}", d.sentence());
        let e = same(entry(4, "gloo:barrier", 0));
        assert!(divergence(&[(0, &a), (1, &e)]).unwrap().sentence().contains("(different ops)"));
    }

    #[test]
    fn rings_that_wrapped_are_aligned_by_sequence_id_not_position() {
        // Rank 0 kept #40–#103, rank 1 #38–#100: they agree up to #100, and rank 1 is missing #101.
        let r0 = record((40..=103).map(|s| entry(s, "gloo:all_reduce", 577)).collect());
        let r1 = record((38..=100).map(|s| entry(s, "gloo:all_reduce", 577)).collect());
        let d = divergence(&[(0, &r0), (1, &r1)]).unwrap();
        assert_eq!((d.seq, d.missing()), (101, vec![1]));
        // Agreeing rings that start apart: no divergence.
        let r2 = record((30..=103).map(|s| entry(s, "gloo:all_reduce", 577)).collect());
        assert_eq!(divergence(&[(0, &r0), (2, &r2)]), None);
    }

    #[test]
    fn the_default_group_is_read_before_a_later_group() {
        let mut r0 = record((1..=4).map(|s| entry(s, "gloo:all_reduce", 4)).collect());
        let mut r1 = record((1..=3).map(|s| entry(s, "gloo:all_reduce", 4)).collect());
        for (r, size) in [(&mut r0, 1), (&mut r1, 2)] {
            r.entries.push(FlightEntry { group: "1".into(), ..entry(1, "gloo:all_gather", size) });
        }
        let d = divergence(&[(0, &r0), (1, &r1)]).unwrap();
        assert_eq!((d.group.as_str(), d.seq), ("default_pg", 4));
    }

    #[test]
    fn a_real_dump_is_read_and_each_groups_newest_entries_kept() {
        // The shape of `_dump_fr_trace_json(True, False)` of torch 2.11 with gloo (one rank, DDP's
        // set-up, one backward, an all_reduce of its own), trimmed to the fields read.
        let text = r#"{"version": "2.10", "entries": [
            {"collective_seq_id": 1, "p2p_seq_id": 0, "is_p2p": false, "pg_id": 0, "process_group": ["0", "default_pg"], "profiling_name": "gloo:all_gather", "input_sizes": [[1]], "input_dtypes": ["Long"], "state": "scheduled"},
            {"collective_seq_id": 4, "p2p_seq_id": 0, "is_p2p": false, "pg_id": 0, "process_group": ["0", "default_pg"], "profiling_name": "gloo:all_reduce", "input_sizes": [[10]], "input_dtypes": ["Float"], "state": "scheduled"}
        ]}"#;
        let r = FlightRecord::from_dump(text).unwrap();
        assert_eq!(r.entries.len(), 2);
        assert_eq!(r.entries[1].render(), "`gloo:all_reduce` of [10] Float");
        let failed =
            FlightRecord::from_dump(r#"{"error": "AttributeError: no _dump_fr_trace_json"}"#).unwrap();
        assert!(failed.entries.is_empty() && failed.error.is_some());
        let many: Vec<String> = (1..=200)
            .map(|s| format!(r#"{{"collective_seq_id": {s}, "is_p2p": false, "pg_id": 0, "process_group": ["0", "default_pg"], "profiling_name": "gloo:all_reduce", "input_sizes": [[3]], "input_dtypes": ["Float"], "state": "scheduled"}}"#))
            .collect();
        let r = FlightRecord::from_dump(&format!(r#"{{"entries": [{}]}}"#, many.join(","))).unwrap();
        assert_eq!(r.entries.len(), crate::schema::FLIGHT_KEPT);
        assert_eq!(r.entries.last().unwrap().seq, 200);
    }
}
