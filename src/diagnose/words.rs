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

/// `2–3`, or `2, 5` when not consecutive.
pub fn ranks_text(ranks: &[u32]) -> String {
    match ranks {
        [] => "none".into(),
        [one] => one.to_string(),
        [a, .., b] if (*b - *a) as usize + 1 == ranks.len() => format!("{a}–{b}"),
        _ => ranks.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
    }
}
