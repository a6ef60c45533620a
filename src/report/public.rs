//! `--public`: what identifies the machine or its user is masked in a result meant for a public
//! issue: GPU UUIDs (`GPU-…`, `MIG-…`, any `uuid` field) and the user's home folder (shown as
//! `~`). Works on the JSON form, so every field is covered, the log tails and paths included.
//! Secrets in variables are redacted always, not only here (see `probe::env::redact_variables`).

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// What a masked GPU UUID reads as.
pub const MASKED_UUID: &str = "GPU-<masked>";

/// Why a value could not be masked: nothing unmasked is handed on instead.
#[derive(Debug, thiserror::Error)]
pub enum MaskError {
    #[error("{0}")]
    Encode(#[source] serde_json::Error),
    #[error("the masked result does not read back: {0}")]
    ReadBack(#[source] serde_json::Error),
}

/// `value` with GPU UUIDs and `home` masked. Fails (rather than leaking) when the masked form does
/// not read back as a `T`.
pub fn mask<T: Serialize + DeserializeOwned>(value: &T, home: Option<&str>) -> Result<T, MaskError> {
    let mut json = serde_json::to_value(value).map_err(MaskError::Encode)?;
    let home = home.filter(|h| h.len() > 1 && h.starts_with('/'));
    walk(&mut json, home, false);
    serde_json::from_value(json).map_err(MaskError::ReadBack)
}

/// The home folder to mask: `$HOME`.
pub fn home() -> Option<String> {
    std::env::var("HOME").ok()
}

fn walk(value: &mut Value, home: Option<&str>, uuid_field: bool) {
    match value {
        Value::String(text) if uuid_field => *text = MASKED_UUID.to_string(),
        Value::String(text) => *text = mask_text(text, home),
        Value::Array(items) => items.iter_mut().for_each(|v| walk(v, home, uuid_field)),
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                walk(v, home, key.eq_ignore_ascii_case("uuid") || key.eq_ignore_ascii_case("gpu_uuid"));
            }
        }
        _ => {}
    }
}

/// `text` with every GPU or MIG UUID and every path under `home` masked.
pub fn mask_text(text: &str, home: Option<&str>) -> String {
    static UUID: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let uuid = UUID.get_or_init(|| {
        regex::Regex::new(
            r"(?:GPU|MIG)-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
        )
        .expect("a valid pattern")
    });
    let text = uuid.replace_all(text, MASKED_UUID);
    let Some(home) = home else { return text.into_owned() };
    let mut out = String::with_capacity(text.len());
    let mut rest: &str = &text;
    while let Some(at) = rest.find(home) {
        let after = &rest[at + home.len()..];
        // Only the folder itself, not `/home/ann2` for `/home/ann`.
        let whole = after.is_empty()
            || !after.starts_with(|c: char| c.is_alphanumeric() || c == '_' || c == '-' || c == '.');
        out.push_str(&rest[..at]);
        out.push_str(if whole { "~" } else { home });
        rest = after;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_and_the_home_folder_are_masked_and_nothing_else() {
        let home = Some("/home/ann");
        assert_eq!(
            mask_text("GPU-2f6c1a3e-5b7d-4c8e-9f0a-1b2c3d4e5f60 at /home/ann/runs, /home/anna", home),
            "GPU-<masked> at ~/runs, /home/anna"
        );
        let v = serde_json::json!({"gpus": [{"uuid": "GPU-1", "name": "H100"}], "file": "/home/ann/s.json"});
        let masked: Value = mask(&v, home).unwrap();
        assert_eq!(
            masked,
            serde_json::json!({"gpus": [{"uuid": "GPU-<masked>", "name": "H100"}], "file": "~/s.json"})
        );
    }
}
