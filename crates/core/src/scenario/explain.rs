//! What a scenario problem means to the user: serde's stable messages (unknown field, wrong type,
//! unknown variant, missing field) reworded with the field, what is allowed, and a hint written
//! for where the value came from (the file or a `--set`). Loading and validation both use it.

use std::collections::BTreeMap;

use serde_json::Value;

use super::model::{CompletesWhen, Expect, Fault, FaultKind, LaunchStyle, OutcomeKind, Scenario};
use super::path::{self, Segment};
use super::suggest;

/// A problem before it is tied to a file position or an override.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Problem {
    pub field: Option<String>,
    pub message: String,
    pub hint: Option<String>,
    /// What in the file to point at.
    pub anchor: Anchor,
}

impl Problem {
    pub(super) fn new(field: Option<String>, message: String, hint: Option<String>) -> Problem {
        Problem { field, message, hint, anchor: Anchor::Value }
    }

    fn anchored(self, anchor: Anchor) -> Problem {
        Problem { anchor, ..self }
    }
}

/// Which position in the file a problem with a field points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Anchor {
    /// Where the field's value starts.
    Value,
    /// Where the field's key starts (an unknown field).
    Key,
    /// Where the enclosing object starts (a missing field).
    Parent,
    /// Where serde stopped (a duplicate key: the locator would find the first one).
    Reported,
}

/// Where a value came from, which decides how a hint tells the user to write it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    File,
    Override,
}

/// Deserialises a scenario from JSON as strictly as from a file; the error is (dotted path,
/// serde's message).
pub(super) fn strict_from_value(value: Value) -> Result<Scenario, (String, String)> {
    if let Some(refused) = list_for_object(&value) {
        return Err(refused);
    }
    serde_path_to_error::deserialize(value).map_err(|err| (err.path().to_string(), err.inner().to_string()))
}

/// Rewords one of serde's messages about the field at `at` (a path as serde_path_to_error
/// prints it; `.` or `?` when unknown) into a problem with a hint.
pub(super) fn explain(at: &str, message: &str, source: Source) -> Problem {
    let segments = path::parse(at).ok();
    let field = segments.as_ref().map(|_| at.to_string());
    let problem = Problem::new;

    if let Some(rest) = message.strip_prefix("unknown field `") {
        let name = match segments.as_deref() {
            Some([.., Segment::Key(key)]) => key.clone(),
            _ => rest.split('`').next().unwrap_or_default().to_string(),
        };
        let expected = backticked(rest.split_once(", ").map_or("", |(_, e)| e));
        let field = field.unwrap_or_else(|| name.clone());
        let hint = unknown_field_hint(&field, &name, &expected, source);
        return problem(Some(field), format!("unknown field `{name}`"), hint).anchored(Anchor::Key);
    }
    if let Some(rest) = message.strip_prefix("unknown variant `") {
        let value = rest.split('`').next().unwrap_or_default();
        let expected = backticked(rest.split_once(", ").map_or("", |(_, e)| e));
        let allowed = format!("`{at}` is one of {}", suggest::list(&expected));
        let hint = match suggest::closest(value, &expected) {
            Some(close) => format!("did you mean `{close}`? {allowed}"),
            None => allowed,
        };
        return problem(field, format!("unknown value `{value}`"), Some(hint));
    }
    if let Some(rest) = message.strip_prefix("missing field `") {
        let name = rest.split('`').next().unwrap_or_default();
        let full = if at == "." || at.is_empty() { name.to_string() } else { format!("{at}.{name}") };
        let hint = example_at(&full).map(|e| match source {
            Source::File => format!("add it, e.g. `\"{name}\": {e}`"),
            Source::Override => format!("set it, e.g. `--set {full}={}`", bare(&e)),
        });
        return problem(Some(full), format!("missing required field `{name}`"), hint)
            .anchored(Anchor::Parent);
    }
    if let Some(rest) = message.strip_prefix("duplicate field `") {
        let name = rest.split('`').next().unwrap_or_default();
        let full = if at == "." || at.is_empty() { name.to_string() } else { format!("{at}.{name}") };
        return problem(
            Some(full),
            format!("`{name}` is written twice"),
            Some("keep one of them".to_string()),
        )
        .anchored(Anchor::Reported);
    }
    for (prefix, out_of_range) in [("invalid type: ", false), ("invalid value: ", true)] {
        let Some(rest) = message.strip_prefix(prefix) else { continue };
        let Some((unexpected, expected)) = rest.rsplit_once(", expected ") else { continue };
        let wanted = describe_expected(expected, at);
        if out_of_range {
            if let Some(range) = integer_range(expected) {
                let found = describe_unexpected(unexpected);
                let hint = example_at(at).map(|e| example_hint(at, &e, source));
                return problem(
                    field,
                    format!("{found} is out of range: expected an integer from {range}"),
                    hint,
                );
            }
        }
        let hint = wrong_type_hint(at, unexpected, expected, source);
        return problem(field, format!("expected {wanted}, found {}", describe_unexpected(unexpected)), hint);
    }
    problem(field, message.to_string(), None)
}

/// Names in backticks, in order: `` `a`, `b` `` → `a`, `b`.
pub(super) fn backticked(text: &str) -> Vec<String> {
    text.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

/// "did you mean" among the allowed fields, else the field where a key of that name belongs,
/// else the allowed fields.
pub(super) fn unknown_field_hint(
    field: &str,
    name: &str,
    expected: &[String],
    source: Source,
) -> Option<String> {
    if let Some(close) = suggest::closest(name, expected) {
        return Some(format!("did you mean `{close}`?"));
    }
    let here = parent(field);
    let elsewhere: Vec<String> = known_fields()
        .into_iter()
        .filter(|k| k.rsplit('.').next() == Some(name) && parent(k) != here)
        .collect();
    if let [only] = elsewhere.as_slice() {
        let section = parent(only);
        return Some(match source {
            Source::File => {
                format!("`{name}` belongs in `{section}`: write it inside `\"{section}\": {{…}}`")
            }
            Source::Override => format!("did you mean `{only}`?"),
        });
    }
    let owner = if here.is_empty() { "a scenario".to_string() } else { format!("`{here}`") };
    match expected.len() {
        0 => Some(format!("{owner} has no fields")),
        _ => Some(format!("{owner} has the fields {}", suggest::list(expected))),
    }
}

/// serde's "expected …" in words a scenario author knows.
pub(super) fn describe_expected(expected: &str, at: &str) -> String {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "usize" => "a non-negative integer".to_string(),
        "i8" | "i16" | "i32" | "i64" | "isize" => "an integer".to_string(),
        "f32" | "f64" => "a number".to_string(),
        "a sequence" => "a list".to_string(),
        "a boolean" => "`true` or `false`".to_string(),
        "string or map" | "variant identifier" => match variants_at(at) {
            Some(variants) => format!("one of {}", suggest::list(&variants)),
            None => "a string".to_string(),
        },
        other if other.starts_with("struct ") || other == "a map" || other == "map" => {
            "an object".to_string()
        }
        other => other.to_string(),
    }
}

/// The range of an integer type serde names, for "out of range" messages.
pub(super) fn integer_range(expected: &str) -> Option<String> {
    let range = match expected {
        "u8" => (0, u8::MAX as i128),
        "u16" => (0, u16::MAX as i128),
        "u32" => (0, u32::MAX as i128),
        "u64" => (0, u64::MAX as i128),
        "i32" => (i32::MIN as i128, i32::MAX as i128),
        "i64" => (i64::MIN as i128, i64::MAX as i128),
        _ => return None,
    };
    Some(format!("{} to {}", range.0, range.1))
}

/// serde's "unexpected" part (`string "4"`, `integer `3``, `map`) as it reads in a message.
pub(super) fn describe_unexpected(unexpected: &str) -> String {
    if let Some(text) = unexpected.strip_prefix("string ") {
        return format!("the string `{text}`");
    }
    for prefix in ["integer ", "floating point ", "boolean "] {
        if let Some(value) = unexpected.strip_prefix(prefix) {
            return value.to_string();
        }
    }
    match unexpected {
        "null" => "`null`".to_string(),
        "map" => "an object".to_string(),
        "sequence" => "a list".to_string(),
        other => other.to_string(),
    }
}

/// The fix for a value of the wrong type: unquote a quoted number, quote a bare string, or an
/// example of the right type.
pub(super) fn wrong_type_hint(at: &str, unexpected: &str, expected: &str, source: Source) -> Option<String> {
    let numeric = |e: &str| e.starts_with('u') || e.starts_with('i') || e.starts_with('f');
    if let Some(quoted) = unexpected.strip_prefix("string ") {
        let inner: Option<String> = serde_json::from_str(quoted).ok();
        let inner_json = inner.as_deref().and_then(|t| serde_json::from_str::<Value>(t).ok());
        let fits = match (&inner_json, expected) {
            (Some(Value::Number(_)), e) => numeric(e),
            (Some(Value::Bool(_)), "a boolean") => true,
            (Some(Value::Array(_)), "a sequence") => true,
            _ => false,
        };
        if fits {
            return inner.map(|t| format!("write `{t}` without quotes"));
        }
    }
    if expected == "a string" && !unexpected.starts_with("map") && !unexpected.starts_with("sequence") {
        let text = unexpected.split('`').nth(1).unwrap_or(unexpected);
        return Some(match source {
            Source::File => format!("put the value in double quotes: `\"{text}\"`"),
            Source::Override => {
                format!("quote the value so it stays a string: `--set '{at}=\"{text}\"'`")
            }
        });
    }
    example_at(at).map(|e| example_hint(at, &e, source))
}

/// "e.g. `4`" in the form the source takes.
pub(super) fn example_hint(at: &str, example: &str, source: Source) -> String {
    match source {
        Source::File => format!("e.g. `{example}`"),
        Source::Override => format!("e.g. `--set {at}={}`", bare(example)),
    }
}

/// A JSON example as a `--set` value: strings need no quotes unless they would parse as JSON.
pub(super) fn bare(example: &str) -> String {
    match serde_json::from_str::<Value>(example) {
        Ok(Value::String(text)) if serde_json::from_str::<Value>(&text).is_err() => text,
        _ => example.to_string(),
    }
}

/// The allowed values of the enum field at `at`, found by asking serde about a value no enum has.
pub(super) fn variants_at(at: &str) -> Option<Vec<String>> {
    let segments = first_items(&path::parse(at).ok()?);
    let mut probe = template_value();
    path::set(&mut probe, &segments, Value::String("\u{0}".to_string())).ok()?;
    let (_, message) = strict_from_value(probe).err()?;
    let rest = message.strip_prefix("unknown variant `")?;
    let variants = backticked(rest.split_once(", ").map_or("", |(_, e)| e));
    (!variants.is_empty()).then_some(variants)
}

/// An example value for the field at `at`, as compact JSON (the default where there is one).
pub(super) fn example_at(at: &str) -> Option<String> {
    let segments = first_items(&path::parse(at).ok()?);
    path::get(&template_value(), &segments).filter(|v| !v.is_null()).map(show)
}

/// Compact JSON as people write it: `[1, 1]`, `{"a": 1}`.
pub(super) fn show(value: &Value) -> String {
    match value {
        Value::Array(items) => {
            format!("[{}]", items.iter().map(show).collect::<Vec<_>>().join(", "))
        }
        Value::Object(fields) => {
            let fields: Vec<String> =
                fields.iter().map(|(k, v)| format!("{}: {}", Value::from(k.as_str()), show(v))).collect();
            format!("{{{}}}", fields.join(", "))
        }
        scalar => scalar.to_string(),
    }
}

/// The same path with every list index 0, to read the template (which has one fault).
pub(super) fn first_items(segments: &[Segment]) -> Vec<Segment> {
    segments
        .iter()
        .map(|s| match s {
            Segment::Index(_) => Segment::Index(0),
            key => key.clone(),
        })
        .collect()
}

/// A scenario with every optional field set and one fault: the shape of every field there is,
/// and an example value for each (the defaults, where there are defaults).
pub(super) fn template() -> Scenario {
    let mut scenario = Scenario {
        name: "my-scenario".to_string(),
        description: "what this scenario shows".to_string(),
        ..Scenario::default()
    };
    scenario.data.shm_size = Some("64m".to_string());
    scenario.expect = Expect {
        outcome: OutcomeKind::Passed,
        signal: Some("SIGSEGV".to_string()),
        exit_code: Some(1),
        rank: Some(0),
        phase: Some("forward".to_string()),
        step: Some(3),
        message: Some("text of the error".to_string()),
        completes_when: Some(CompletesWhen::Stdout("^training finished".to_string())),
    };
    scenario.launch.style = LaunchStyle::Launcher;
    scenario.launch.env = BTreeMap::from([("OMP_NUM_THREADS".to_string(), "1".to_string())]);
    scenario.launch.cwd = Some("{scenario_dir}".to_string());
    scenario.inject = vec![Fault {
        fault: FaultKind::Segv,
        phase: "forward".to_string(),
        step: 3,
        rank: Some(0),
        when: BTreeMap::new(),
        probability: 1.0,
        size: None,
    }];
    scenario
}

pub(super) fn template_value() -> Value {
    serde_json::to_value(template()).unwrap_or(Value::Null)
}

/// Inserts `null` for every field of `template` that `value` lacks (unset optional fields are
/// not serialised); list items are filled from the template's first item.
pub(super) fn fill_absent(value: &mut Value, template: &Value) {
    match (value, template) {
        (Value::Object(fields), Value::Object(shape)) => {
            for (key, sub) in shape {
                match fields.get_mut(key) {
                    Some(existing) => fill_absent(existing, sub),
                    None => {
                        fields.insert(key.clone(), Value::Null);
                    }
                }
            }
        }
        (Value::Array(items), Value::Array(shape)) => {
            if let Some(first) = shape.first() {
                items.iter_mut().for_each(|item| fill_absent(item, first));
            }
        }
        _ => {}
    }
}

/// Dotted paths of every scenario field a `when` condition may name (faults excluded).
pub(super) fn known_fields() -> Vec<String> {
    fn walk(prefix: &str, value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(fields) => {
                for (key, sub) in fields {
                    let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
                    walk(&path, sub, out);
                }
            }
            _ => out.push(prefix.to_string()),
        }
    }
    let mut out = Vec::new();
    if let Value::Object(mut fields) = template_value() {
        fields.remove("inject");
        // A command's argv and params are the user's own, not fields a condition can name.
        fields.remove("command");
        fields.remove("params");
        walk("", &Value::Object(fields), &mut out);
    }
    out
}

/// The hint for a file that is not one JSON object.
pub(super) const ONE_OBJECT: &str = "a scenario file holds one JSON object; `{}` runs the defaults";

/// serde accepts a struct written as a list of its fields in order (`"launch": ["ddp", 2]`).
/// Scenario files must name their fields, so a list where an object belongs is refused: this
/// returns its path and serde's wording for it.
pub(super) fn list_for_object(document: &Value) -> Option<(String, String)> {
    fn walk(value: &Value, shape: &Value, at: &mut Vec<Segment>) -> bool {
        match (value, shape) {
            (Value::Array(_), Value::Object(_)) => true,
            (Value::Object(fields), Value::Object(shape)) => fields.iter().any(|(key, sub)| {
                let Some(sub_shape) = shape.get(key) else { return false };
                at.push(Segment::Key(key.clone()));
                let found = walk(sub, sub_shape, at);
                if !found {
                    at.pop();
                }
                found
            }),
            (Value::Array(items), Value::Array(shape)) => match shape.first() {
                Some(item_shape) => items.iter().enumerate().any(|(index, item)| {
                    at.push(Segment::Index(index));
                    let found = walk(item, item_shape, at);
                    if !found {
                        at.pop();
                    }
                    found
                }),
                None => false,
            },
            _ => false,
        }
    }
    let mut at = Vec::new();
    if !walk(document, &template_value(), &mut at) {
        return None;
    }
    let at = if at.is_empty() { ".".to_string() } else { path::render(&at) };
    Some((at, "invalid type: sequence, expected a map".to_string()))
}

/// The path one level up (`inject[1]` for `inject[1].phase`; `` for a top-level field).
pub(super) fn parent(field: &str) -> String {
    match path::parse(field) {
        Ok(segments) if segments.len() > 1 => path::render(&segments[..segments.len() - 1]),
        _ => String::new(),
    }
}
