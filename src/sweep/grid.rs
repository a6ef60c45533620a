//! `--vary path=v1,v2,…` parsed into axes, and the grid of points they span (the first axis
//! varies slowest, like nested loops written in the order of the flags).

use crate::scenario::Override;

/// One `--vary`: a scenario field and the values it takes, in the order given.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    /// The dotted field, e.g. `data.workers`.
    pub path: String,
    /// Each value as one `path=value` override.
    pub values: Vec<Override>,
    /// The flag's argument as written.
    pub raw: String,
}

/// Parses one `--vary` argument: `path=v1,v2,…`. Commas inside `[…]` or `{…}` belong to the
/// value (`model.depths=[1],[1,1]`).
pub fn parse_vary(raw: &str) -> Result<Axis, String> {
    const USAGE: &str = "expected `path=value1,value2,…`, e.g. `--vary data.workers=0,2,4`";
    let Some((path, list)) = raw.split_once('=') else {
        return Err(format!("`--vary {raw}`: no `=`: {USAGE}"));
    };
    let path = path.trim();
    let mut values = Vec::new();
    for text in split_top_level(list) {
        let text = text.trim();
        if text.is_empty() {
            return Err(format!("`--vary {raw}`: an empty value in `{list}`: {USAGE}"));
        }
        let o: Override = format!("{path}={text}").parse().map_err(|e| format!("`--vary {raw}`: {e}"))?;
        if values.iter().any(|v: &Override| v.value == o.value) {
            return Err(format!("`--vary {raw}`: the value `{text}` is given twice: give each value once"));
        }
        values.push(o);
    }
    if values.len() < 2 {
        return Err(format!(
            "`--vary {raw}`: one value is not a sweep: give two or more (`{path}=a,b`), or use `--set {path}=…`"
        ));
    }
    Ok(Axis { path: path.to_string(), values, raw: raw.to_string() })
}

fn split_top_level(list: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' | '{' => depth += 1,
            ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&list[start..]);
    parts
}

/// Checks the axes against each other and against `--set`: a field varied twice, or both varied
/// and set, has no one meaning.
pub fn check_axes(axes: &[Axis], set: &[Override]) -> Result<(), String> {
    if axes.is_empty() {
        return Err(
            "nothing to sweep: give at least one `--vary path=v1,v2`, e.g. `--vary data.workers=0,2`"
                .to_string(),
        );
    }
    for (i, a) in axes.iter().enumerate() {
        if let Some(b) = axes[..i].iter().find(|b| b.path == a.path) {
            return Err(format!(
                "`--vary {}` and `--vary {}` both vary `{}`: give its values in one `--vary`",
                b.raw, a.raw, a.path
            ));
        }
        if let Some(s) = set.iter().find(|s| s.path == a.path) {
            return Err(format!(
                "`--vary {}` and `--set {}` both decide `{}`: drop the `--set`",
                a.raw, s.raw, a.path
            ));
        }
    }
    Ok(())
}

/// Every point of the grid, as the overrides that make it; the first axis varies slowest.
pub fn points(axes: &[Axis]) -> Vec<Vec<Override>> {
    let mut out: Vec<Vec<Override>> = vec![Vec::new()];
    for axis in axes {
        out = out
            .into_iter()
            .flat_map(|prefix| {
                axis.values.iter().map(move |v| {
                    let mut p = prefix.clone();
                    p.push(v.clone());
                    p
                })
            })
            .collect();
    }
    out
}

/// A point's name: its settings, `data.workers=2 data.start_method=spawn`.
pub fn label(settings: &[Override]) -> String {
    settings.iter().map(|o| o.raw.as_str()).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_span_the_grid_first_axis_slowest() {
        let a = parse_vary("data.workers=0,2").unwrap();
        let b = parse_vary("data.start_method=fork,spawn").unwrap();
        let labels: Vec<String> = points(&[a, b]).iter().map(|p| label(p)).collect();
        assert_eq!(
            labels,
            [
                "data.workers=0 data.start_method=fork",
                "data.workers=0 data.start_method=spawn",
                "data.workers=2 data.start_method=fork",
                "data.workers=2 data.start_method=spawn"
            ]
        );
    }

    #[test]
    fn commas_inside_brackets_belong_to_the_value() {
        let a = parse_vary("model.depths=[1],[1,1]").unwrap();
        assert_eq!(a.values.len(), 2);
        assert_eq!(a.values[1].value, serde_json::json!([1, 1]));
    }

    #[test]
    fn bad_vary_arguments_name_the_flag_and_the_fix() {
        for (raw, says) in [
            ("data.workers", "no `=`"),
            ("data.workers=2", "one value is not a sweep"),
            ("data.workers=0,,2", "an empty value"),
            ("data.workers=2,2", "given twice"),
            ("=1,2", "no field path"),
        ] {
            let e = parse_vary(raw).unwrap_err();
            assert!(e.contains(&format!("--vary {raw}")) && e.contains(says), "{raw}: {e}");
        }
        let a = parse_vary("data.workers=0,2").unwrap();
        let set: Vec<Override> = vec!["data.workers=4".parse().unwrap()];
        assert!(check_axes(std::slice::from_ref(&a), &set).unwrap_err().contains("drop the `--set`"));
        assert!(check_axes(&[a.clone(), a], &[]).unwrap_err().contains("in one `--vary`"));
        assert!(check_axes(&[], &[]).unwrap_err().contains("nothing to sweep"));
    }
}
