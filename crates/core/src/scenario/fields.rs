//! Reading a scenario's fields by their dotted paths (`data.workers`), and fault conditions
//! (`when`) over them: what validation, loading and faults all ask.

use std::collections::BTreeMap;

use serde_json::Value;

use super::explain::{fill_absent, template_value};
use super::model::Scenario;
use super::path;

/// The value at a dotted path (`model.conditioning`, `data.workers`, `launch.mode`,
/// `inject[0].step`) of the scenario serialised to JSON; `None` if there is no such field.
/// Optional fields that are unset (`expect.signal`) give `Some(Value::Null)`.
pub fn lookup(scenario: &Scenario, dotted: &str) -> Option<Value> {
    let segments = path::parse(dotted).ok()?;
    let mut value = serde_json::to_value(scenario).ok()?;
    fill_absent(&mut value, &template_value());
    path::get(&value, &segments).cloned()
}

/// Whether a fault's `when` conditions all hold for `scenario`. Each key is a dotted field; its
/// value is either the value to match or a list of values any of which matches (for a field
/// that is itself a list, such as `model.depths`, only a list of lists is read as alternatives).
/// Numbers compare by value, so `600` matches `600.0`. An unknown field never matches.
pub fn when_matches(scenario: &Scenario, when: &BTreeMap<String, Value>) -> bool {
    when.iter().all(|(key, wanted)| match lookup(scenario, key) {
        Some(current) => when_alternatives(&current, wanted).iter().any(|alt| same_value(&current, alt)),
        None => false,
    })
}

/// The values a `when` entry accepts for a field whose current value is `current`.
pub(super) fn when_alternatives<'w>(current: &Value, wanted: &'w Value) -> Vec<&'w Value> {
    match wanted {
        Value::Array(items)
            if !current.is_array() || (!items.is_empty() && items.iter().all(Value::is_array)) =>
        {
            items.iter().collect()
        }
        Value::Array(items) if items.is_empty() => Vec::new(),
        single => vec![single],
    }
}

/// JSON equality where numbers compare by value.
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
            (Some(x), Some(y), _, _) => x == y,
            (_, _, Some(x), Some(y)) => x == y,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_value(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same_value(v, w)))
        }
        _ => a == b,
    }
}
