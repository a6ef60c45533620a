//! Ranks grouped by what the report shows of them, the way LLNL's STAT groups the stacks of a
//! hung job: above [`GROUP_ABOVE`] ranks, ranks whose table row, stacks, dump or log tail are the
//! same are one class, shown once with the ranks it holds, and a rank that differs is a class of
//! its own, named alone. One row or section a rank made the report of 4,096 ranks megabytes long,
//! cut to fit one GitHub comment before it reached what mattered; classes keep it whole.

use std::collections::HashMap;
use std::hash::Hash;

use crate::diagnose::words::rank_ranges;
use crate::schema::RankResult;

/// Most ranks a report shows one by one; beyond, they are grouped into classes. Runs of up to 16
/// ranks (two nodes of eight GPUs) read as they always did.
pub(super) const GROUP_ABOVE: usize = 16;

/// Most classes a per-rank section (stacks, dumps, log tails) shows; the rest are counted.
pub(super) const CLASSES_SHOWN: usize = 8;

/// Ranks that share one key, with the first of them to show.
pub(super) struct Class<'a> {
    pub ranks: Vec<u32>,
    pub first: &'a RankResult,
}

/// `ranks` grouped by `key`, in the order of their first rank.
pub(super) fn group<'a, K: Eq + Hash>(
    ranks: impl Iterator<Item = &'a RankResult>,
    key: impl Fn(&RankResult) -> K,
) -> Vec<Class<'a>> {
    let mut classes: Vec<Class<'a>> = Vec::new();
    let mut index: HashMap<K, usize> = HashMap::new();
    for r in ranks {
        let i = *index.entry(key(r)).or_insert_with(|| {
            classes.push(Class { ranks: Vec::new(), first: r });
            classes.len() - 1
        });
        classes[i].ranks.push(r.rank);
    }
    classes
}

/// The classes of a per-rank section: the smallest first (the odd ranks are what a reader looks
/// for), at most [`CLASSES_SHOWN`]; and how many ranks the classes left out hold.
pub(super) fn shown(mut classes: Vec<Class<'_>>) -> (Vec<Class<'_>>, usize) {
    classes.sort_by_key(|c| (c.ranks.len(), c.ranks[0]));
    let left: usize = classes.iter().skip(CLASSES_SHOWN).map(|c| c.ranks.len()).sum();
    classes.truncate(CLASSES_SHOWN);
    (classes, left)
}

/// Most pieces (single ranks or ranges) a class's rank list shows.
const PIECES_MAX: usize = 12;

/// `rank 3`, `ranks 0–752, 754–1023 (1,023 ranks)`: ranges for runs, the list cut after
/// [`PIECES_MAX`] pieces, the count always there.
pub(super) fn who(ranks: &[u32]) -> String {
    match ranks {
        [one] => format!("rank {one}"),
        _ => {
            let text = rank_ranges(ranks);
            let pieces: Vec<&str> = text.split(", ").collect();
            let list = if pieces.len() > PIECES_MAX {
                format!("{}, …", pieces[..PIECES_MAX].join(", "))
            } else {
                text.clone()
            };
            format!("ranks {list} ({} ranks)", thousands(ranks.len()))
        }
    }
}

/// `4,095`.
pub(super) fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Text with the numbers of the lines that name a process or a thread (`Process 19662:`,
/// `Thread 19662 (idle)`) made one: py-spy's dumps of two ranks stuck in the same place differ
/// only in those.
pub(super) fn without_ids(text: &str) -> String {
    text.lines()
        .map(|l| {
            let t = l.trim_start();
            if t.starts_with("Process ") || t.starts_with("Thread ") {
                l.chars().map(|c| if c.is_ascii_digit() { '#' } else { c }).collect()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_names_its_ranks_as_ranges_with_their_count() {
        let ranks: Vec<u32> = (0..4096).filter(|r| *r != 1777).collect();
        assert_eq!(who(&ranks), "ranks 0–1776, 1778–4095 (4,095 ranks)");
        assert_eq!(who(&[1777]), "rank 1777");
        let every_other: Vec<u32> = (0..64).step_by(2).collect();
        assert_eq!(who(&every_other), "ranks 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, … (32 ranks)");
    }
}
