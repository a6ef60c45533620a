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
    /// Other fields that take the same value at every point (`-L ranks 1,2` with
    /// `--nproc_per_node {ranks}` also sets `launch.world_size`).
    pub also: Vec<String>,
}

/// What `--vary` expects, said after each of its problems.
const USAGE: &str = "expected `path=value1,value2,…`, e.g. `--vary data.workers=0,2,4`";

/// A `--vary` or `-L` that makes no axis, or axes that contradict each other or a `--set`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GridError {
    /// One flag's argument; `flag` as written (`--vary data.workers=2`, `-L workers 2`).
    #[error("`{flag}`: {problem}")]
    Axis { flag: String, problem: AxisProblem },
    #[error("nothing to sweep: give at least one `--vary path=v1,v2`, e.g. `--vary data.workers=0,2`")]
    NoAxis,
    /// Two `--vary` of one field (each as written).
    #[error("`--vary {first}` and `--vary {second}` both vary `{path}`: give its values in one `--vary`")]
    VariedTwice { first: String, second: String, path: String },
    #[error("`--vary {vary}` and `--set {set}` both decide `{path}`: drop the `--set`")]
    VariedAndSet { vary: String, set: String, path: String },
}

/// What is wrong with one `--vary` or `-L` argument.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AxisProblem {
    #[error("no `=`: {USAGE}")]
    NoEquals,
    #[error("an empty value in `{list}`: {USAGE}")]
    EmptyValue { list: String },
    /// A value that makes no `path=value` override, in [`Override`]'s words.
    #[error("{0}")]
    NotAnOverride(String),
    #[error("the value `{0}` is given twice: give each value once")]
    Twice(String),
    /// One value; `in_command` when it came from `-L` (its fix is a fixed value in the command,
    /// not a `--set`).
    #[error(
        "one value is not a sweep: give two or more (`{path}=a,b`), or use {}",
        if *.in_command { "a fixed value in the command".to_string() } else { format!("`--set {path}=…`") }
    )]
    OneValue { path: String, in_command: bool },
    #[error(
        "`{0}` is not a placeholder name: use letters, digits and `_` (e.g. `-L workers 0,2,4` with `{{workers}}` in \
         the command)"
    )]
    NotAName(String),
}

/// Parses one `--vary` argument: `path=v1,v2,…`. Commas inside `[…]` or `{…}` belong to the
/// value (`model.depths=[1],[1,1]`).
pub fn parse_vary(raw: &str) -> Result<Axis, GridError> {
    let bad = |problem| GridError::Axis { flag: format!("--vary {raw}"), problem };
    let Some((path, list)) = raw.split_once('=') else {
        return Err(bad(AxisProblem::NoEquals));
    };
    let path = path.trim();
    let mut values = Vec::new();
    for text in split_top_level(list) {
        let text = text.trim();
        if text.is_empty() {
            return Err(bad(AxisProblem::EmptyValue { list: list.to_string() }));
        }
        let o: Override = format!("{path}={text}").parse().map_err(|e| bad(AxisProblem::NotAnOverride(e)))?;
        if values.iter().any(|v: &Override| v.value == o.value) {
            return Err(bad(AxisProblem::Twice(text.to_string())));
        }
        values.push(o);
    }
    if values.len() < 2 {
        return Err(bad(AxisProblem::OneValue { path: path.to_string(), in_command: false }));
    }
    Ok(Axis { path: path.to_string(), values, raw: raw.to_string(), also: Vec::new() })
}

/// Parses one `-L NAME V1,V2,…` (hyperfine's parameter list): the values of the command's
/// `{NAME}` placeholder, as the scenario's `params.NAME`.
pub fn parse_list(name: &str, list: &str) -> Result<Axis, GridError> {
    let flag = format!("-L {name} {list}");
    let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(GridError::Axis { flag, problem: AxisProblem::NotAName(name.to_string()) });
    }
    let mut axis = parse_vary(&format!("params.{name}={list}")).map_err(|e| match e {
        // Said of the `-L` as the user wrote it, whose fixed value goes in the command.
        GridError::Axis { problem, .. } => GridError::Axis {
            flag: flag.clone(),
            problem: match problem {
                AxisProblem::OneValue { path, .. } => AxisProblem::OneValue { path, in_command: true },
                other => other,
            },
        },
        other => other,
    })?;
    axis.raw = flag;
    Ok(axis)
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
pub fn check_axes(axes: &[Axis], set: &[Override]) -> Result<(), GridError> {
    if axes.is_empty() {
        return Err(GridError::NoAxis);
    }
    for (i, a) in axes.iter().enumerate() {
        if let Some(b) = axes[..i].iter().find(|b| b.path == a.path) {
            return Err(GridError::VariedTwice {
                first: b.raw.clone(),
                second: a.raw.clone(),
                path: a.path.clone(),
            });
        }
        if let Some(s) = set.iter().find(|s| s.path == a.path) {
            return Err(GridError::VariedAndSet {
                vary: a.raw.clone(),
                set: s.raw.clone(),
                path: a.path.clone(),
            });
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
                    let value = v.raw.split_once('=').map_or("", |(_, value)| value);
                    p.extend(axis.also.iter().filter_map(|path| format!("{path}={value}").parse().ok()));
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
    fn a_parameter_list_is_the_commands_placeholder_and_may_set_linked_fields() {
        let mut ranks = parse_list("ranks", "1,2").unwrap();
        assert_eq!(ranks.path, "params.ranks");
        ranks.also.push("launch.world_size".into());
        let labels: Vec<String> = points(&[ranks]).iter().map(|p| label(p)).collect();
        assert_eq!(labels, ["params.ranks=1 launch.world_size=1", "params.ranks=2 launch.world_size=2"]);
        for (name, list, says) in [
            ("num-workers", "0,2", "not a placeholder name"),
            ("workers", "2", "one value is not a sweep"),
            ("workers", "0,0", "given twice"),
        ] {
            let e = parse_list(name, list).unwrap_err().to_string();
            assert!(e.starts_with(&format!("`-L {name} {list}`: ")) && e.contains(says), "{e}");
        }
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
            let e = parse_vary(raw).unwrap_err().to_string();
            assert!(e.contains(&format!("--vary {raw}")) && e.contains(says), "{raw}: {e}");
        }
        let a = parse_vary("data.workers=0,2").unwrap();
        let set: Vec<Override> = vec!["data.workers=4".parse().unwrap()];
        assert!(
            check_axes(std::slice::from_ref(&a), &set).unwrap_err().to_string().contains("drop the `--set`")
        );
        assert!(check_axes(&[a.clone(), a], &[]).unwrap_err().to_string().contains("in one `--vary`"));
        assert!(check_axes(&[], &[]).unwrap_err().to_string().contains("nothing to sweep"));
    }
}
