//! How one scenario differs from another, as `--set` arguments: what bisect reports of a cut and
//! what a node says when its scenario is not node 0's.

use serde_json::{Value, json};

use super::Scenario;

/// The scenario fields a run depends on, as JSON (everything but `name`, `description`, `expect`).
pub fn run_relevant(s: &Scenario) -> Value {
    let mut value = serde_json::to_value(s).unwrap_or(Value::Null);
    if let Some(object) = value.as_object_mut() {
        for ignored in ["name", "description", "expect"] {
            object.remove(ignored);
        }
    }
    value
}

/// What `candidate` changes relative to `base`, one `field=value` per changed field, written so
/// that each entry works as a `--set` argument: `["model.attention=false", "train.steps=4",
/// "model.depths=[1]"]`. Sections come in schema order, fields alphabetically within them.
pub fn describe_delta(base: &Scenario, candidate: &Scenario) -> Vec<String> {
    let (mut before, mut after) = (run_relevant(base), run_relevant(candidate));
    // `launch.nodes` is left out of the JSON at its default (1): a cut to it still reads `=1`;
    // and `launch.env` when empty: unsetting its last variable still reads `launch.env.NAME=null`.
    for (value, s) in [(&mut before, base), (&mut after, candidate)] {
        if let Some(launch) = value.get_mut("launch").and_then(Value::as_object_mut) {
            launch.insert("nodes".into(), json!(s.launch.nodes));
            launch.insert("env".into(), json!(s.launch.env));
        }
        // A param is its value, as `--set params.NAME=…` sets it (its `min`, `cuts` and `words`
        // are how it is cut and written, which no cut changes).
        if let Some(params) = value.get_mut("params").and_then(Value::as_object_mut) {
            for param in params.values_mut() {
                if let Some(v) = param.get("value").cloned() {
                    *param = v;
                }
            }
        }
    }
    let mut out = Vec::new();
    for section in ["launch", "model", "data", "train", "limits", "inject", "params"] {
        diff(
            section,
            before.get(section).unwrap_or(&Value::Null),
            after.get(section).unwrap_or(&Value::Null),
            &mut out,
        );
    }
    out
}

fn diff(path: &str, before: &Value, after: &Value, out: &mut Vec<String>) {
    if before == after {
        return;
    }
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            let keys: std::collections::BTreeSet<&String> = b.keys().chain(a.keys()).collect();
            for key in keys {
                let (x, y) = (b.get(key).unwrap_or(&Value::Null), a.get(key).unwrap_or(&Value::Null));
                diff(&format!("{path}.{key}"), x, y, out);
            }
        }
        _ => out.push(format!("{path}={}", render(after))),
    }
}

/// A value as `--set` reads it back: strings bare unless they would parse as JSON.
fn render(value: &Value) -> String {
    match value {
        Value::String(s) if serde_json::from_str::<Value>(s).is_err() && !s.is_empty() => s.clone(),
        other => other.to_string(),
    }
}
