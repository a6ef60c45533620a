//! `### Collectives where the ranks part ways (Flight Recorder)`: each rank's collectives around
//! the first sequence id at which they differ, side by side, from the entries each rank's observer
//! handed over (`observed.flight`); the judge's match (`diagnose::flight_divergence`) says where.

use crate::schema::{FlightEntry, FlightRecord, ScenarioResult};

use super::super::markup::{self, Align};
use super::classes::{GROUP_ABOVE, who};
use super::doc::Doc;

/// Sequence ids shown before the divergence.
const BEFORE: u64 = 3;

pub(super) fn collectives(doc: &mut Doc, s: &ScenarioResult) {
    let records: Vec<(u32, &FlightRecord)> = s
        .ranks
        .iter()
        .filter_map(|r| Some((r.rank, r.observed.as_ref()?.flight.as_ref()?)))
        .filter(|(_, f)| !f.entries.is_empty())
        .collect();
    table(doc, &records);
}

/// The table of `records` around their divergence, when they part ways: a column a rank, or
/// above [`GROUP_ABOVE`] ranks a column a class of ranks whose collectives there are the same
/// (`ranks 0–1776, 1778–4095 (4,095 ranks)` beside `rank 1777`).
pub(crate) fn table(doc: &mut Doc, records: &[(u32, &FlightRecord)]) {
    let Some(d) = crate::diagnose::flight_divergence(&records) else { return };
    let cell = |rec: &FlightRecord, seq: u64| -> String {
        let at = rec.entries.iter().find(|e| !e.p2p && e.group == d.group && e.seq == seq);
        at.map_or("—".to_string(), FlightEntry::render)
    };
    let last = records
        .iter()
        .filter_map(|(_, r)| r.entries.iter().filter(|e| !e.p2p && e.group == d.group).map(|e| e.seq).max())
        .max()
        .unwrap_or(d.seq);
    let seqs: Vec<u64> = (d.seq.saturating_sub(BEFORE).max(1)..=last.min(d.seq + 1)).collect();
    let columns: Vec<(u32, Vec<String>)> =
        records.iter().map(|(rank, rec)| (*rank, seqs.iter().map(|seq| cell(rec, *seq)).collect())).collect();
    let mut classes: Vec<(Vec<u32>, &Vec<String>)> = Vec::new();
    if records.len() > GROUP_ABOVE {
        let mut index: std::collections::HashMap<&Vec<String>, usize> = std::collections::HashMap::new();
        for (rank, cells) in &columns {
            let i = *index.entry(cells).or_insert_with(|| {
                classes.push((Vec::new(), cells));
                classes.len() - 1
            });
            classes[i].0.push(*rank);
        }
    } else {
        classes = columns.iter().map(|(rank, cells)| (vec![*rank], cells)).collect();
    }
    let header: Vec<String> =
        std::iter::once("#".to_string()).chain(classes.iter().map(|(ranks, _)| who(ranks))).collect();
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let align: Vec<Align> = header.iter().map(|_| Align::Left).collect();
    let rows: Vec<Vec<String>> = seqs
        .iter()
        .enumerate()
        .map(|(i, &seq)| {
            let mark = if seq == d.seq { format!("**{seq}**") } else { seq.to_string() };
            std::iter::once(mark).chain(classes.iter().map(|(_, cells)| cells[i].clone())).collect()
        })
        .collect();
    doc.push(format!(
        "### Collectives where the ranks part ways (Flight Recorder, group `{}`)",
        markup::text(&d.group)
    ));
    doc.push(markup::table(&header, &align, &rows));
}
