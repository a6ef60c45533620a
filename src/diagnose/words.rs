//! Numbers and lists as the verdict and the report word them, shared by every place that writes
//! evidence (the judge, the merge of nodes) and the report that shows it.

/// Milliseconds as the report writes them: `12 ms`, `2.0 ms`, `0.012 ms`.
pub fn ms(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0} ms")
    } else if v >= 0.1 {
        format!("{v:.1} ms")
    } else {
        format!("{v:.3} ms")
    }
}

/// `2–3`, or `2, 5` when not consecutive; an ascending list with runs of three or more as ranges
/// ([`rank_ranges`]: `0–752, 754–1023`), so that a class of thousands of ranks is a few words.
pub fn ranks_text(ranks: &[u32]) -> String {
    match ranks {
        [] => "none".into(),
        [one] => one.to_string(),
        // `b >= a` first: a list in falling order overflowed the subtraction (a panic in a
        // debug build).
        [a, .., b] if b >= a && (*b - *a) as usize + 1 == ranks.len() => format!("{a}–{b}"),
        _ if ranks.is_sorted() => rank_ranges(ranks),
        _ => ranks.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
    }
}

/// Rank numbers in ascending order, runs of three or more as ranges: `3–1023`, `1, 3–5, 9`.
pub fn rank_ranges(ranks: &[u32]) -> String {
    let mut sorted = ranks.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        match j - i {
            0 => parts.push(sorted[i].to_string()),
            1 => parts.push(format!("{}, {}", sorted[i], sorted[j])),
            _ => parts.push(format!("{}–{}", sorted[i], sorted[j])),
        }
        i = j + 1;
    }
    parts.join(", ")
}

/// Most ranks a list of what each rank did names one by one ([`each_rank`]).
pub const EACH_RANK_MAX: usize = 8;

/// What each rank did, as `rank 0 issued 9; rank 1 issued 8` (joined by `sep`) for up to
/// [`EACH_RANK_MAX`] ranks. Beyond that, the ranks that did the same are one entry, in the order
/// their first rank came (`ranks 0–752, 754–1023 issued 9; rank 753 issued 8`): at 4,096 ranks
/// one entry a rank made a verdict of megabytes that said two things. At most
/// [`EACH_RANK_MAX`] entries are kept, then how many ranks are left out (`result.json` has them).
pub fn each_rank(items: &[(u32, String)], sep: &str) -> String {
    if items.len() <= EACH_RANK_MAX {
        return items.iter().map(|(r, w)| format!("rank {r} {w}")).collect::<Vec<_>>().join(sep);
    }
    let mut classes: Vec<(&str, Vec<u32>)> = Vec::new();
    let mut index: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (r, w) in items {
        let i = *index.entry(w.as_str()).or_insert_with(|| {
            classes.push((w.as_str(), Vec::new()));
            classes.len() - 1
        });
        classes[i].1.push(*r);
    }
    let mut said: Vec<String> =
        classes.iter().take(EACH_RANK_MAX).map(|(w, ranks)| format!("{} {w}", ranks_named(ranks))).collect();
    let left: usize = classes.iter().skip(EACH_RANK_MAX).map(|(_, r)| r.len()).sum();
    if left > 0 {
        said.push(format!("{left} more ranks each otherwise (in `result.json`)"));
    }
    said.join(sep)
}

/// `rank 3`, `ranks 0–752, 754–1023`.
pub fn ranks_named(ranks: &[u32]) -> String {
    match ranks {
        [one] => format!("rank {one}"),
        _ => format!("ranks {}", ranks_text(ranks)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_each_rank_did_is_said_one_by_one_up_to_eight_ranks_then_once_per_class() {
        let few: Vec<(u32, String)> = (0..3).map(|r| (r, format!("issued {}", 9 - r / 2))).collect();
        assert_eq!(each_rank(&few, "; "), "rank 0 issued 9; rank 1 issued 9; rank 2 issued 8");
        let many: Vec<(u32, String)> =
            (0..4096).map(|r| (r, if r == 1777 { "issued 8" } else { "issued 9" }.to_string())).collect();
        assert_eq!(each_rank(&many, "; "), "ranks 0–1776, 1778–4095 issued 9; rank 1777 issued 8");
        // Every rank its own: the first eight said, the rest counted.
        let distinct: Vec<(u32, String)> = (0..20).map(|r| (r, format!("{r}.0 ms"))).collect();
        assert!(
            each_rank(&distinct, ", ")
                .ends_with("rank 7 7.0 ms, 12 more ranks each otherwise (in `result.json`)")
        );
    }

    #[test]
    fn an_ascending_list_of_ranks_is_written_with_ranges() {
        assert_eq!(ranks_text(&[2, 5]), "2, 5");
        assert_eq!(ranks_text(&[0, 1, 2, 4]), "0–2, 4");
        assert_eq!(ranks_text(&[3, 1]), "3, 1", "an order that says something is kept");
        let all_but_one: Vec<u32> = (0..4096).filter(|r| *r != 1777).collect();
        assert_eq!(ranks_text(&all_but_one), "0–1776, 1778–4095");
    }
}
