//! Dotted field paths (`data.workers`, `inject[1].step`, `inject[0].when.launch.mode`) and how to
//! read and write them in a `serde_json::Value`.
//!
//! A fault's `when` map has dotted paths as its keys, so everything after a `when` segment is one
//! key: `inject[0].when.launch.mode` is `inject`, `[0]`, `when`, `launch.mode`. The same parse
//! serves `--set` paths, the paths serde reports, and the source locator.

use serde_json::Value;

/// One step of a dotted path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    /// A field of an object (`workers`), or a whole `when` key (`launch.mode`).
    Key(String),
    /// An item of a list (`[1]`).
    Index(usize),
}

/// The field whose keys are dotted paths themselves.
const WHEN: &str = "when";

/// What is wrong with a dotted path; `path` is the whole path as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PathError {
    #[error("the path is empty")]
    Empty,
    #[error("`[` without `]` in `{path}`")]
    Unclosed { path: String },
    #[error("`[{index}]` in `{path}` is not a list index")]
    NotAnIndex { index: String, path: String },
    #[error("`{path}` is not a dotted field path")]
    NotDotted { path: String },
}

/// Splits a dotted path into segments; the error says what is wrong with it.
pub(crate) fn parse(path: &str) -> Result<Vec<Segment>, PathError> {
    let mut segments = Vec::new();
    let mut rest = path;
    let not_dotted = || PathError::NotDotted { path: path.to_string() };
    if rest.is_empty() {
        return Err(PathError::Empty);
    }
    loop {
        if let Some(after) = rest.strip_prefix('[') {
            let Some(close) = after.find(']') else {
                return Err(PathError::Unclosed { path: path.to_string() });
            };
            let index = after[..close].parse::<usize>().map_err(|_| PathError::NotAnIndex {
                index: after[..close].to_string(),
                path: path.to_string(),
            })?;
            segments.push(Segment::Index(index));
            rest = &after[close + 1..];
        } else {
            let after_when = matches!(segments.last(), Some(Segment::Key(k)) if k == WHEN);
            let end = if after_when { rest.len() } else { rest.find(['.', '[']).unwrap_or(rest.len()) };
            let key = &rest[..end];
            if key.is_empty() || key.contains(']') {
                return Err(not_dotted());
            }
            segments.push(Segment::Key(key.to_string()));
            rest = &rest[end..];
        }
        if rest.is_empty() {
            return Ok(segments);
        }
        if let Some(after) = rest.strip_prefix('.') {
            if after.is_empty() || after.starts_with(['.', '[']) {
                return Err(not_dotted());
            }
            rest = after;
        } else if !rest.starts_with('[') {
            return Err(not_dotted());
        }
    }
}

/// Writes segments back as a dotted path (the inverse of [`parse`]).
pub(crate) fn render(segments: &[Segment]) -> String {
    let mut out = String::new();
    for segment in segments {
        match segment {
            Segment::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Index(index) => out.push_str(&format!("[{index}]")),
        }
    }
    out
}

/// Whether one path lies inside the other (or they are equal): `data` and `data.workers` are
/// related, `data.workers` and `data.worker` are not.
pub(crate) fn related(a: &[Segment], b: &[Segment]) -> bool {
    a.iter().zip(b).all(|(x, y)| x == y)
}

/// The value at `segments`, if there is one.
pub(crate) fn get<'v>(root: &'v Value, segments: &[Segment]) -> Option<&'v Value> {
    segments.iter().try_fold(root, |value, segment| match segment {
        Segment::Key(key) => value.as_object()?.get(key),
        Segment::Index(index) => value.as_array()?.get(*index),
    })
}

/// Sets the value at `segments`. A missing object field is created (strict deserialisation
/// then rejects it if the schema has no such field); the error says which part of the path
/// cannot hold fields or items, as `(path of that part, message, hint)`.
pub(crate) fn set(
    root: &mut Value,
    segments: &[Segment],
    new: Value,
) -> Result<(), (String, String, Option<String>)> {
    let Some((last, parents)) = segments.split_last() else {
        *root = new;
        return Ok(());
    };
    let mut value = root;
    for (depth, segment) in parents.iter().enumerate() {
        let here = &segments[..depth + 1];
        value = step_mut(value, segment, here, true)?;
    }
    if let Segment::Key(key) = last {
        return match value {
            Value::Object(map) => {
                map.insert(key.clone(), new);
                Ok(())
            }
            other => Err(not_a_container(parents, other, last)),
        };
    }
    *step_mut(value, last, segments, false)? = new;
    Ok(())
}

/// One step down for [`set`]; `create` inserts an empty object for a missing field.
fn step_mut<'v>(
    value: &'v mut Value,
    segment: &Segment,
    here: &[Segment],
    create: bool,
) -> Result<&'v mut Value, (String, String, Option<String>)> {
    let parent = &here[..here.len() - 1];
    match (segment, value) {
        (Segment::Key(key), Value::Object(map)) => {
            if create {
                Ok(map.entry(key.clone()).or_insert_with(|| Value::Object(Default::default())))
            } else {
                map.get_mut(key).ok_or_else(|| (render(here), "no such field".to_string(), None))
            }
        }
        (Segment::Index(index), Value::Array(items)) => {
            let len = items.len();
            items.get_mut(*index).ok_or_else(|| {
                let items_word = if len == 1 { "item" } else { "items" };
                (
                    render(here),
                    format!("`{}` has {len} {items_word}, so there is no item {index}", render(parent)),
                    Some(format!("set the whole list instead, e.g. `--set '{}=[…]'`", render(parent))),
                )
            })
        }
        (segment, other) => Err(not_a_container(parent, other, segment)),
    }
}

/// The error for stepping into a value that has no fields or items.
fn not_a_container(parent: &[Segment], value: &Value, segment: &Segment) -> (String, String, Option<String>) {
    let parent = render(parent);
    let (wanted, step) = match segment {
        Segment::Key(key) => ("an object", format!("field `{key}`")),
        Segment::Index(index) => ("a list", format!("item `[{index}]`")),
    };
    (
        parent.clone(),
        format!("{} has no {step}; only {wanted} has", kind_of(value)),
        Some(format!("set `{parent}` itself, e.g. `--set {parent}=…`")),
    )
}

/// "a number", "a string", … for messages.
pub(crate) fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(k: &str) -> Segment {
        Segment::Key(k.to_string())
    }

    #[test]
    fn parses_fields_indices_and_when_keys() {
        assert_eq!(parse("data.workers").unwrap(), vec![key("data"), key("workers")]);
        assert_eq!(parse("inject[1].step").unwrap(), vec![key("inject"), Segment::Index(1), key("step")]);
        assert_eq!(
            parse("inject[0].when.launch.mode").unwrap(),
            vec![key("inject"), Segment::Index(0), key("when"), key("launch.mode")]
        );
        assert_eq!(parse("model.depths[0]").unwrap(), vec![key("model"), key("depths"), Segment::Index(0)]);
    }

    #[test]
    fn rejects_malformed_paths() {
        for bad in ["", ".a", "a.", "a..b", "a[", "a[x]", "a[-1]", "a]b", "a.[0]", "a[0]b"] {
            assert!(parse(bad).is_err(), "{bad:?} should be rejected");
        }
        let said = |bad: &str| parse(bad).unwrap_err().to_string();
        assert_eq!(said(""), "the path is empty");
        assert_eq!(said("a["), "`[` without `]` in `a[`");
        assert_eq!(said("a[x]"), "`[x]` in `a[x]` is not a list index");
        assert_eq!(said("a..b"), "`a..b` is not a dotted field path");
    }

    #[test]
    fn render_is_the_inverse_of_parse() {
        for path in ["data.workers", "inject[1].step", "inject[0].when.launch.mode", "a[0][1]"] {
            assert_eq!(render(&parse(path).unwrap()), path);
        }
    }

    #[test]
    fn related_means_one_path_contains_the_other() {
        let p = |s| parse(s).unwrap();
        assert!(related(&p("data"), &p("data.workers")));
        assert!(related(&p("data.workers"), &p("data.workers")));
        assert!(!related(&p("data.worker"), &p("data.workers")));
        assert!(!related(&p("inject[0]"), &p("inject[1].step")));
    }

    #[test]
    fn set_creates_missing_fields_and_replaces_items() {
        let mut v = json!({"data": {"workers": 0}, "inject": [{"step": 1}]});
        set(&mut v, &parse("data.workers").unwrap(), json!(4)).unwrap();
        set(&mut v, &parse("data.extra.deep").unwrap(), json!(true)).unwrap();
        set(&mut v, &parse("inject[0].step").unwrap(), json!(7)).unwrap();
        assert_eq!(v, json!({"data": {"workers": 4, "extra": {"deep": true}}, "inject": [{"step": 7}]}));
        assert_eq!(get(&v, &parse("inject[0].step").unwrap()), Some(&json!(7)));
        assert_eq!(get(&v, &parse("inject[1].step").unwrap()), None);
    }

    #[test]
    fn set_refuses_to_step_into_scalars_or_past_the_end() {
        let mut v = json!({"data": {"workers": 0}, "inject": []});
        let (field, message, _) = set(&mut v, &parse("data.workers.x").unwrap(), json!(1)).unwrap_err();
        assert_eq!(field, "data.workers");
        assert_eq!(message, "a number has no field `x`; only an object has");
        let (field, message, _) = set(&mut v, &parse("inject[2].step").unwrap(), json!(1)).unwrap_err();
        assert_eq!(field, "inject[2]");
        assert_eq!(message, "`inject` has 0 items, so there is no item 2");
        assert!(set(&mut v, &parse("inject[0]").unwrap(), json!(1)).is_err());
    }
}
