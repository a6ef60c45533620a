//! "Did you mean …?" for misspelt field names, values, phases and paths.

/// Edit distance (insertions, deletions, substitutions) between two strings, by characters.
pub(crate) fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        current[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

/// The candidate closest to `name` (ignoring case), if it is close enough to be a likely typo:
/// at most `max(2, len / 3)` edits away. Ties go to the earlier candidate.
pub(crate) fn closest<'c, S: AsRef<str>>(name: &str, candidates: &'c [S]) -> Option<&'c str> {
    let lower = name.to_lowercase();
    let limit = 2.max(lower.chars().count() / 3);
    candidates
        .iter()
        .map(|c| (levenshtein(&lower, &c.as_ref().to_lowercase()), c.as_ref()))
        .filter(|&(distance, _)| distance <= limit)
        .min_by_key(|&(distance, _)| distance)
        .map(|(_, c)| c)
}

/// `` `a`, `b`, `c` `` for hints.
pub(crate) fn list<S: AsRef<str>>(names: &[S]) -> String {
    names.iter().map(|n| format!("`{}`", n.as_ref())).collect::<Vec<_>>().join(", ")
}

/// "did you mean `x`?" when a candidate is close, else "`what` is one of …".
pub(crate) fn hint<S: AsRef<str>>(name: &str, candidates: &[S], what: &str) -> Option<String> {
    if let Some(close) = closest(name, candidates) {
        return Some(format!("did you mean `{close}`?"));
    }
    match candidates.len() {
        0 => None,
        1 => Some(format!("{what} is `{}`", candidates[0].as_ref())),
        _ => Some(format!("{what} is one of {}", list(candidates))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levenshtein_counts_edits() {
        assert_eq!(levenshtein("", ""), 0);
        assert_eq!(levenshtein("worker", "workers"), 1);
        assert_eq!(levenshtein("kitten", "sitting"), 3);
        assert_eq!(levenshtein("abc", ""), 3);
        assert_eq!(levenshtein("", "ab"), 2);
    }

    #[test]
    fn closest_suggests_only_likely_typos() {
        let fields = ["samples", "grid", "workers", "start_method"];
        assert_eq!(closest("worker", &fields), Some("workers"));
        assert_eq!(closest("strat_method", &fields), Some("start_method"));
        assert_eq!(closest("GRID", &fields), Some("grid"));
        assert_eq!(closest("resolution", &fields), None);
    }

    #[test]
    fn hint_falls_back_to_listing_the_names() {
        let modes = ["single", "ddp", "fsdp"];
        assert_eq!(hint("dpp", &modes, "it").as_deref(), Some("did you mean `ddp`?"));
        assert_eq!(
            hint("horovod", &modes, "`launch.mode`").as_deref(),
            Some("`launch.mode` is one of `single`, `ddp`, `fsdp`")
        );
        assert_eq!(hint("x", &[] as &[&str], "it"), None);
    }
}
