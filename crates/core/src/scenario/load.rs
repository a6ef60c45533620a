//! Strict loading of scenario files, `--set` overrides and validation.
//!
//! The pipeline of [`load_str`]:
//! 1. deserialise the text strictly (unknown fields, wrong types, unknown values and JSON syntax
//!    errors are errors), tracking the dotted path serde was at;
//! 2. default `name` to the file's stem;
//! 3. apply the `--set` overrides to the scenario as JSON and deserialise again, just as strictly;
//! 4. [`validate`] what serde cannot check.
//!
//! Every error is a [`ScenarioError`] whose `Display` is the whole message a user sees: the file,
//! the line:column where the field is written (or the `--set` that caused it), the dotted field,
//! what is wrong, and a hint with a concrete fix. serde's messages are reworded here; their wording
//! is stable (`unknown field `x`, expected one of …`) and parsed, never shown raw.
//!
//! No processes, no output: this module only reads the files it is asked to.

#![expect(
    clippy::result_large_err,
    reason = "ScenarioError's fields are the public API; it is built once per failed load"
)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde_json::Value;

use super::explain::{
    Anchor, ONE_OBJECT, Problem, Source, explain, list_for_object, parent, strict_from_value, variants_at,
};
use super::locate::{self, Position};
use super::model::Scenario;
use super::path::{self, Segment};
use super::{rules, suggest};

/// A `--set path=value` override. The value is parsed as JSON when it is valid JSON (`4`,
/// `false`, `[1,1]`, `"x"`), else taken as a string (`64m`, `ddp`).
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// The dotted field path, e.g. `data.workers` or `inject[0].step`.
    pub path: String,
    /// The value to set.
    pub value: Value,
    /// The argument as written, `path=value`; error messages quote it as `--set {raw}`.
    pub raw: String,
}

impl FromStr for Override {
    type Err = String;

    fn from_str(raw: &str) -> Result<Override, String> {
        const USAGE: &str = "expected `path=value`, e.g. `data.workers=4`";
        let Some((path, text)) = raw.split_once('=') else {
            return Err(format!("no `=` in `{raw}`: {USAGE}"));
        };
        let path = path.trim();
        if path.is_empty() {
            return Err(format!("no field path before `=` in `{raw}`: {USAGE}"));
        }
        path::parse(path).map_err(|why| format!("{why}: {USAGE}"))?;
        let value = serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()));
        Ok(Override { path: path.to_string(), value, raw: raw.to_string() })
    }
}

/// Error for bad scenario input. `Display` is the complete user-facing message: one line
/// (`file:line:column: `field`: message`, or `file: --set raw: `field`: message`) and an
/// optional `  hint: …` line.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}", self.render())]
pub struct ScenarioError {
    /// The scenario file (as given, not canonicalised).
    pub file: PathBuf,
    /// 1-based line in the file where the problem is written.
    pub line: Option<usize>,
    /// 1-based column (in characters) on that line.
    pub column: Option<usize>,
    /// The dotted field at fault (`data.workers`, `inject[1].step`).
    pub field: Option<String>,
    /// What is wrong: a lowercase fragment, values in backticks.
    pub message: String,
    /// A concrete fix.
    pub hint: Option<String>,
    /// The `--set` argument (`path=value`) that caused the problem.
    pub from_override: Option<String>,
}

impl ScenarioError {
    fn new(file: &Path, problem: Problem) -> ScenarioError {
        ScenarioError {
            file: file.to_path_buf(),
            line: None,
            column: None,
            field: problem.field,
            message: problem.message,
            hint: problem.hint,
            from_override: None,
        }
    }

    fn at(mut self, position: Option<Position>) -> ScenarioError {
        self.line = position.map(|p| p.line);
        self.column = position.map(|p| p.column);
        self
    }

    fn by(mut self, culprit: Option<&Override>) -> ScenarioError {
        self.from_override = culprit.map(|o| o.raw.clone());
        self
    }

    fn render(&self) -> String {
        let mut out = self.file.display().to_string();
        if let Some(line) = self.line {
            let _ = write!(out, ":{line}");
            if let Some(column) = self.column {
                let _ = write!(out, ":{column}");
            }
        }
        out.push_str(": ");
        if let Some(raw) = &self.from_override {
            let _ = write!(out, "--set {raw}: ");
        }
        if let Some(field) = &self.field {
            let _ = write!(out, "`{field}`: ");
        }
        out.push_str(&self.message);
        if let Some(hint) = &self.hint {
            let _ = write!(out, "\n  hint: {hint}");
        }
        out
    }
}

/// Line and column (1-based, columns in characters) of the first byte of `bytes` that is not
/// UTF-8, for messages about files that must be text.
pub fn invalid_utf8_position(err: &std::string::FromUtf8Error) -> (usize, usize) {
    let p = Position::of_invalid_utf8(err);
    (p.line, p.column)
}

/// `file:line:col` of where the scenario file `file` writes the dotted `field` (just `file` when
/// it does not), for errors found after loading, such as a pre-flight check of the machine.
pub fn field_location(file: &Path, field: &str) -> String {
    let position =
        std::fs::read_to_string(file).ok().and_then(|source| position_of(&source, Some(field), false));
    match position {
        Some(p) => format!("{}:{}:{}", file.display(), p.line, p.column),
        None => file.display().to_string(),
    }
}

/// Reads and loads one scenario file; see [`load_str`].
pub fn load_file(path: &Path, overrides: &[Override]) -> Result<Scenario, ScenarioError> {
    let bytes = std::fs::read(path).map_err(|err| {
        let hint = (err.kind() == std::io::ErrorKind::NotFound)
            .then(|| "check the path; a folder runs every `*.json` scenario in it".to_string());
        ScenarioError::new(path, Problem::new(None, format!("cannot read file: {}", io_reason(&err)), hint))
    })?;
    let source = String::from_utf8(bytes).map_err(|err| {
        ScenarioError::new(
            path,
            Problem::new(
                None,
                "the file is not valid UTF-8 text".to_string(),
                Some("save the file as UTF-8 (JSON text is UTF-8)".to_string()),
            ),
        )
        .at(Some(Position::of_invalid_utf8(&err)))
    })?;
    load_str(&source, path, overrides)
}

/// Loads a scenario from `source`, the text of the file `origin` (used for messages and the
/// default `name`): strict deserialisation, then `overrides` in order, then [`validate`].
pub fn load_str(source: &str, origin: &Path, overrides: &[Override]) -> Result<Scenario, ScenarioError> {
    // Some editors save a byte-order mark; it is invisible, so dropping it shifts no column.
    let source = source.strip_prefix('\u{feff}').unwrap_or(source);
    let mut scenario = parse_source(source, origin)?;
    if scenario.name.is_empty() {
        scenario.name = origin.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    }
    let scenario = apply_overrides(scenario, origin, overrides)?;
    rules::check(&scenario).map_err(|invalid| blame(invalid, source, origin, overrides))?;
    Ok(scenario)
}

/// Expands directories to the `*.json` files directly in them (sorted); files pass through.
/// Errors name a path that does not exist, or a directory without scenario files.
pub fn scenario_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, ScenarioError> {
    let failed = |path: &Path, message: String, hint: &str| {
        ScenarioError::new(path, Problem::new(None, message, Some(hint.to_string())))
    };
    let mut files = Vec::new();
    for path in paths {
        let metadata = std::fs::metadata(path).map_err(|err| {
            failed(
                path,
                format!("cannot open: {}", io_reason(&err)),
                "give a scenario file or a folder of them",
            )
        })?;
        if !metadata.is_dir() {
            files.push(path.clone());
            continue;
        }
        let entries = std::fs::read_dir(path).map_err(|err| {
            failed(path, format!("cannot list folder: {}", io_reason(&err)), "check the folder's permissions")
        })?;
        let mut found: Vec<PathBuf> = entries
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|ext| ext == "json") && p.is_file())
            .collect();
        if found.is_empty() {
            return Err(failed(
                path,
                "no `*.json` scenario files in this folder".to_string(),
                "scenario files end in `.json`; give a file, or a folder that holds some",
            ));
        }
        found.sort();
        files.extend(found);
    }
    Ok(files)
}

/// Checks values that serde cannot (called by [`load_str`]; public so that a scenario edited in
/// code can be checked again). Returns the first problem as (dotted field, message, hint).
pub fn validate(scenario: &Scenario) -> Result<(), (String, String, Option<String>)> {
    rules::check(scenario).map_err(|invalid| (invalid.field, invalid.message, invalid.hint))
}

/// Step 1: strict deserialisation of the file text.
fn parse_source(source: &str, origin: &Path) -> Result<Scenario, ScenarioError> {
    // Plain JSON first: a syntax error stops serde's typed pass wherever it was, with a path
    // that means little; this pass gives it a position and no misleading field.
    let document: Value = serde_json::from_str(source).map_err(|err| syntax_error(&err, source, origin))?;
    let typed = match list_for_object(&document) {
        Some((at, message)) => Err((at, message, None)),
        None => {
            let mut de = serde_json::Deserializer::from_str(source);
            serde_path_to_error::deserialize::<_, Scenario>(&mut de).map_err(|err| {
                let inner = err.inner();
                let reported = (inner.line() > 0)
                    .then(|| Position { line: inner.line(), column: inner.column().max(1) });
                (err.path().to_string(), inner.to_string(), Some((inner.classify(), reported)))
            })
        }
    };
    let (at, message, serde) = match typed {
        Ok(scenario) => return Ok(scenario),
        Err(failure) => failure,
    };
    let mut problem = match serde {
        // The text is valid JSON, so this "expected value" is a number or `null` where an
        // enum's string belongs.
        Some((serde_json::error::Category::Syntax, _)) => {
            let found = path::parse(&at).ok().and_then(|s| path::get(&document, &s).cloned());
            enum_needs_string(&at, found.as_ref())
        }
        _ => explain(&at, &strip_position(&message), Source::File),
    };
    if problem.field.is_none() && problem.hint.is_none() {
        problem.hint = Some(ONE_OBJECT.to_string());
    }
    let field = problem.field.as_deref();
    let position = match problem.anchor {
        Anchor::Value => position_of(source, field, false),
        Anchor::Key => position_of(source, field, true),
        Anchor::Parent => field.and_then(|f| position_of(source, Some(&parent(f)), false)),
        Anchor::Reported => None,
    }
    .or(serde.and_then(|(_, reported)| reported));
    Err(ScenarioError::new(origin, problem).at(position))
}

/// serde_json's "expected value" for a non-string where a string enum value belongs.
fn enum_needs_string(at: &str, found: Option<&Value>) -> Problem {
    let found = found.map_or_else(|| "something else".to_string(), |v| format!("`{v}`"));
    match variants_at(at) {
        Some(variants) => Problem::new(
            Some(at.to_string()),
            format!("expected one of {}, found {found}", suggest::list(&variants)),
            Some(format!("write the value as a string in quotes, e.g. `\"{}\"`", variants[0])),
        ),
        None => Problem::new(Some(at.to_string()), format!("unexpected value {found}"), None),
    }
}

/// Where `field` is written: its key (for an unknown or misplaced key) or its value.
fn position_of(source: &str, field: Option<&str>, key: bool) -> Option<Position> {
    let field = field?;
    // An empty key (`params.""`) has no dotted form of its own: its parent's path, then `""`.
    let segments = match field.strip_suffix('.') {
        Some(parent) => {
            let mut segments = path::parse(parent).ok()?;
            segments.push(path::Segment::Key(String::new()));
            segments
        }
        None => path::parse(field).ok()?,
    };
    let located = locate::locate(source, &segments)?;
    if key { located.key.or(Some(located.value)) } else { Some(located.value) }
}

/// A JSON syntax error, with serde_json's position and a reworded message.
fn syntax_error(err: &serde_json::Error, source: &str, origin: &Path) -> ScenarioError {
    let raw = strip_position(&err.to_string());
    let position = (err.line() > 0).then(|| Position { line: err.line(), column: err.column().max(1) });
    let at_slash = position.is_some_and(|p| {
        let line = source.lines().nth(p.line - 1).unwrap_or_default();
        line.chars().nth(p.column - 1) == Some('/')
    });
    if at_slash {
        let problem = Problem::new(
            None,
            "JSON has no comments".to_string(),
            Some("remove the comment; `description` can hold notes".to_string()),
        );
        return ScenarioError::new(origin, problem).at(position);
    }
    let (message, hint): (&str, &str) = match raw.as_str() {
        "trailing comma" => {
            ("trailing comma", "JSON allows no comma after the last item of an object or list; remove it")
        }
        "EOF while parsing an object" => ("the file ends inside an object", "close every `{` with a `}`"),
        "EOF while parsing a list" => ("the file ends inside a list", "close every `[` with a `]`"),
        "EOF while parsing a string" => {
            ("the file ends inside a string", "a string is missing its closing `\"`")
        }
        "EOF while parsing a value" => ("the file ends before a value", ONE_OBJECT),
        "expected `,` or `}`" => {
            ("expected `,` or `}`", "separate fields with `,` and close the object with `}`")
        }
        "expected `,` or `]`" => {
            ("expected `,` or `]`", "separate items with `,` and close the list with `]`")
        }
        "expected `:`" => ("expected `:`", "write each field as `\"key\": value`"),
        "key must be a string" => ("key must be a string", "put the key in double quotes: `\"key\": value`"),
        "expected value" => {
            ("expected a value", "write a number, `true`, `false`, `null`, a \"string\", a list or an object")
        }
        "expected ident" => {
            ("invalid literal", "write `true`, `false` or `null`, or put text in double quotes")
        }
        "control character (\\u0000-\\u001F) found while parsing a string" => (
            "line break inside a string",
            "a string is missing its closing `\"`, or needs `\\n` instead of a line break",
        ),
        "trailing characters" => {
            ("text after the scenario object", "a scenario file holds exactly one JSON object")
        }
        "invalid escape" => ("invalid escape in a string", "write a backslash as `\\\\`"),
        _ => ("", ""),
    };
    let problem = if message.is_empty() {
        Problem::new(None, raw, None)
    } else {
        Problem::new(None, message.to_string(), Some(hint.to_string()))
    };
    ScenarioError::new(origin, problem).at(position)
}

/// serde_json's message without its ` at line L column C` suffix.
fn strip_position(message: &str) -> String {
    if let Some(at) = message.rfind(" at line ") {
        let tail: Vec<&str> = message[at + 9..].split(' ').collect();
        if let [line, "column", column] = tail.as_slice() {
            if line.parse::<usize>().is_ok() && column.parse::<usize>().is_ok() {
                return message[..at].to_string();
            }
        }
    }
    message.to_string()
}

/// The reason of an IO error without Rust's ` (os error N)` suffix.
fn io_reason(err: &std::io::Error) -> String {
    let text = err.to_string();
    match text.rfind(" (os error ") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

/// Step 3: the overrides, applied to the scenario as JSON and deserialised strictly again.
fn apply_overrides(
    scenario: Scenario,
    origin: &Path,
    overrides: &[Override],
) -> Result<Scenario, ScenarioError> {
    if overrides.is_empty() {
        return Ok(scenario);
    }
    let mut value = serde_json::to_value(&scenario).map_err(|err| {
        let message = format!("cannot apply `--set`: {err}");
        ScenarioError::new(origin, Problem::new(None, message, None))
    })?;
    for o in overrides {
        let segments = path::parse(&o.path).map_err(|why| {
            let hint = Some("write a dotted path such as `data.workers` or `inject[0].step`".to_string());
            ScenarioError::new(origin, Problem::new(None, why.to_string(), hint)).by(Some(o))
        })?;
        let segments = param_value_path(&value, segments, &o.value);
        path::set(&mut value, &segments, o.value.clone()).map_err(|(field, message, hint)| {
            ScenarioError::new(origin, Problem::new(Some(field), message, hint)).by(Some(o))
        })?;
    }
    strict_from_value(value).map_err(|(at, message)| {
        let problem = explain(&at, &strip_position(&message), Source::Override);
        let culprit = problem.field.as_deref().and_then(|f| override_of(f, overrides)).or(overrides.last());
        ScenarioError::new(origin, problem).by(culprit)
    })
}

/// `--set params.NAME=VALUE` on a param written as an object (`{"value": 8, "cuts": […]}`) sets
/// its `value`, so its `min` or `cuts` survive; an object value replaces the whole param.
fn param_value_path(scenario: &Value, segments: Vec<Segment>, new: &Value) -> Vec<Segment> {
    let is_param = matches!(segments.as_slice(), [Segment::Key(p), Segment::Key(_)] if p == "params");
    let object_now = path::get(scenario, &segments).is_some_and(Value::is_object);
    if is_param && object_now && !new.is_object() {
        let mut segments = segments;
        segments.push(Segment::Key("value".to_string()));
        return segments;
    }
    segments
}

/// The last override that set `field`, a field inside it, or a section containing it.
fn override_of<'o>(field: &str, overrides: &'o [Override]) -> Option<&'o Override> {
    let field = path::parse(field).ok()?;
    overrides.iter().rev().find(|o| path::parse(&o.path).is_ok_and(|p| path::related(&p, &field)))
}

/// Step 4's error. The value in effect is the last override's, so an override that set the
/// field (or, failing that, another field the rule read) is blamed first; else where the file
/// writes the field (or the other field); else nothing.
fn blame(invalid: rules::Invalid, source: &str, origin: &Path, overrides: &[Override]) -> ScenarioError {
    let rules::Invalid { field, message, hint, related, at_key } = invalid;
    let fields = || std::iter::once(field.as_str()).chain(related.iter().map(String::as_str));
    let culprit = fields().find_map(|f| override_of(f, overrides));
    let position = if culprit.is_some() {
        None
    } else {
        position_of(source, Some(&field), at_key)
            .or_else(|| related.iter().find_map(|other| position_of(source, Some(other), false)))
    };
    ScenarioError::new(origin, Problem::new(Some(field.clone()), message, hint)).at(position).by(culprit)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::scenario::{Cache, Mode};
    use crate::scenario::{lookup, when_matches};
    use std::collections::BTreeMap;

    fn origin() -> &'static Path {
        Path::new("scenarios/bad.json")
    }

    fn set(arg: &str) -> Override {
        arg.parse().unwrap()
    }

    /// The full message for loading `source` with `overrides`.
    fn error(source: &str, overrides: &[&str]) -> String {
        let overrides: Vec<Override> = overrides.iter().map(|o| set(o)).collect();
        load_str(source, origin(), &overrides).expect_err("loading should fail").to_string()
    }

    fn load(source: &str, overrides: &[&str]) -> Scenario {
        let overrides: Vec<Override> = overrides.iter().map(|o| set(o)).collect();
        load_str(source, origin(), &overrides).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn override_values_are_json_when_they_parse_and_strings_otherwise() {
        assert_eq!(set("data.workers=4").value, json!(4));
        assert_eq!(set("model.attention=false").value, json!(false));
        assert_eq!(set("model.depths=[1,1]").value, json!([1, 1]));
        assert_eq!(set("name=\"x\"").value, json!("x"));
        assert_eq!(set("data.shm_size=64m").value, json!("64m"));
        assert_eq!(set("launch.mode=ddp").value, json!("ddp"));
        assert_eq!(set("description=a=b").value, json!("a=b"));
        assert_eq!(set("data.shm_size=").value, json!(""));
        let o = set("inject[0].step=3");
        assert_eq!((o.path.as_str(), o.raw.as_str()), ("inject[0].step", "inject[0].step=3"));
    }

    #[test]
    fn override_needs_a_path_and_an_equals_sign() {
        assert_eq!(
            "data.workers".parse::<Override>().unwrap_err(),
            "no `=` in `data.workers`: expected `path=value`, e.g. `data.workers=4`"
        );
        assert_eq!(
            "=4".parse::<Override>().unwrap_err(),
            "no field path before `=` in `=4`: expected `path=value`, e.g. `data.workers=4`"
        );
        assert!("data..workers=4".parse::<Override>().is_err());
    }

    #[test]
    fn an_empty_object_is_the_default_scenario_named_after_the_file() {
        let s = load("{}", &[]);
        assert_eq!(s, Scenario { name: "bad".to_string(), ..Scenario::default() });
        assert_eq!(load(r#"{"name": "mine"}"#, &[]).name, "mine");
    }

    #[test]
    fn overrides_apply_in_order_and_are_validated() {
        let s = load(r#"{"model": {"hidden": 32}}"#, &["model.hidden=48", "model.heads=6", "data.grid=64"]);
        assert_eq!((s.model.hidden, s.model.heads, s.data.grid), (48, 6, 64));
        let s = load("{}", &["model.depths=[3]", "model.depths[0]=2", "name=x"]);
        assert_eq!((s.model.depths, s.name), (vec![2], "x".to_string()));
        let s = load(r#"{"inject": [{"fault": "nan", "phase": "forward"}]}"#, &["inject[0].step=5"]);
        assert_eq!(s.inject[0].step, 5);
        let s = load(
            r#"{"inject": [{"fault": "nan", "phase": "forward"}]}"#,
            &["inject[0].when.model.conditioning=false"],
        );
        assert_eq!(s.inject[0].when.get("model.conditioning"), Some(&json!(false)));
    }

    #[test]
    fn unknown_fields_name_the_full_path_and_position() {
        let e = load_str("{\n  \"data\": {\n    \"worker\": 4\n  }\n}", origin(), &[]).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("data.worker"));
        assert_eq!((e.line, e.column), (Some(3), Some(5)));
        assert_eq!(e.hint.as_deref(), Some("did you mean `workers`?"));
        let e =
            load_str(r#"{"inject": [{"fault": "nan", "phase": "x", "stp": 1}]}"#, origin(), &[]).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("inject[0].stp"));
        assert_eq!(e.hint.as_deref(), Some("did you mean `step`?"));
    }

    #[test]
    fn a_misplaced_field_is_pointed_to_its_section() {
        let e = load_str(r#"{"workers": 2}"#, origin(), &[]).unwrap_err();
        assert_eq!(e.hint.as_deref(), Some("`workers` belongs in `data`: write it inside `\"data\": {…}`"));
    }

    #[test]
    fn wrong_types_say_what_was_expected_and_found() {
        let e = load_str(r#"{"data": {"workers": "4"}}"#, origin(), &[]).unwrap_err();
        assert_eq!(e.message, "expected a non-negative integer, found the string `\"4\"`");
        assert_eq!(e.hint.as_deref(), Some("write `4` without quotes"));
        assert_eq!((e.line, e.column), (Some(1), Some(22)));
        let e = load_str(r#"{"data": {"workers": -1}}"#, origin(), &[]).unwrap_err();
        assert_eq!(e.message, "`-1` is out of range: expected an integer from 0 to 4294967295");
        let e = load_str(r#"{"model": {"depths": 3}}"#, origin(), &[]).unwrap_err();
        assert_eq!(e.message, "expected a list, found `3`");
        assert_eq!(e.hint.as_deref(), Some("e.g. `[1, 1]`"));
        let e = load_str(r#"{"name": 5}"#, origin(), &[]).unwrap_err();
        assert_eq!(e.hint.as_deref(), Some("put the value in double quotes: `\"5\"`"));
        let e = load_str(r#"{"launch": {"mode": 3}}"#, origin(), &[]).unwrap_err();
        assert_eq!(e.message, "expected one of `single`, `ddp`, `fsdp`, found `3`");
        assert_eq!(e.field.as_deref(), Some("launch.mode"));
        let e = load_str(r#"{"data": 5}"#, origin(), &[]).unwrap_err();
        assert_eq!(e.message, "expected an object, found `5`");
    }

    #[test]
    fn a_struct_written_as_a_list_is_refused() {
        // serde would take `["ddp", 2]` as the fields of `launch` in order.
        let e = load_str(r#"{"launch": ["ddp", 2]}"#, origin(), &[]).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("launch"));
        assert_eq!(e.message, "expected an object, found a list");
        assert_eq!(e.column, Some(12));
        let e = load_str(r#"{"inject": [["segv", "forward"]]}"#, origin(), &[]).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("inject[0]"));
        let e = load_str("[]", origin(), &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("scenarios/bad.json: expected an object, found a list\n  hint: {ONE_OBJECT}")
        );
        let e = load_str("{}", origin(), &[set("train=[5]")]).unwrap_err();
        assert_eq!(e.from_override.as_deref(), Some("train=[5]"));
    }

    #[test]
    fn comments_and_byte_order_marks() {
        let e = load_str("{\n  // a note\n  \"name\": \"x\"\n}", origin(), &[]).unwrap_err();
        assert_eq!((e.line, e.column, e.message.as_str()), (Some(2), Some(3), "JSON has no comments"));
        assert_eq!(load("\u{feff}{\"name\": \"x\"}", &[]).name, "x");
    }

    #[test]
    fn missing_and_duplicate_fields_are_named() {
        let e = load_str(r#"{"inject": [{"fault": "nan"}]}"#, origin(), &[]).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("inject[0].phase"));
        assert_eq!(e.message, "missing required field `phase`");
        assert_eq!(e.hint.as_deref(), Some("add it, e.g. `\"phase\": \"forward\"`"));
        assert_eq!((e.line, e.column), (Some(1), Some(13)));
        let e = load_str("{\"train\": {\"steps\": 1,\n \"steps\": 2}}", origin(), &[]).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("train.steps"));
        assert_eq!(e.line, Some(2));
    }

    #[test]
    fn syntax_errors_have_a_position_and_no_field() {
        let e = load_str("{\n  \"name\": \"x\",\n}", origin(), &[]).unwrap_err();
        assert_eq!((e.line, e.column, e.field.as_deref()), (Some(3), Some(1), None));
        assert_eq!(e.message, "trailing comma");
        let e = load_str("{} {}", origin(), &[]).unwrap_err();
        assert_eq!(e.message, "text after the scenario object");
        let e = load_str("", origin(), &[]).unwrap_err();
        assert_eq!(e.message, "the file ends before a value");
        let e = load_str(r#"{"launch": {"mode": }}"#, origin(), &[]).unwrap_err();
        assert_eq!((e.message.as_str(), e.field.as_deref()), ("expected a value", None));
    }

    #[test]
    fn validation_errors_point_at_the_value_in_the_file() {
        let e = load_str("{\"model\": {\n  \"hidden\": 60, \"heads\": 8}}", origin(), &[]).unwrap_err();
        assert_eq!((e.line, e.column, e.from_override), (Some(2), Some(13), None));
        // Only `heads` is written: the rule's other field is pointed at.
        let e = load_str("{\"model\": {\n  \"heads\": 7}}", origin(), &[]).unwrap_err();
        assert_eq!((e.field.as_deref(), e.line, e.column), (Some("model.hidden"), Some(2), Some(12)));
        // Neither is written: no position.
        let e = load_str("{}", origin(), &[set("model.hidden=60"), set("model.heads=8")]).unwrap_err();
        assert_eq!((e.line, e.from_override.as_deref()), (None, Some("model.hidden=60")));
        let e = load_str(
            "{\"inject\": [\n {\"fault\": \"nan\", \"phase\": \"forward\"},\n {\"fault\": \"nan\", \"phase\": \"forward\", \"step\": 999}]}",
            origin(),
            &[],
        )
        .unwrap_err();
        assert_eq!((e.field.as_deref(), e.line, e.column), (Some("inject[1].step"), Some(3), Some(47)));
    }

    #[test]
    fn validation_errors_blame_the_override_that_set_the_value() {
        let e = load_str(r#"{"model": {"hidden": 64, "heads": 8}}"#, origin(), &[set("model.hidden=60")])
            .unwrap_err();
        assert_eq!((e.line, e.from_override.as_deref()), (None, Some("model.hidden=60")));
        // The override changed a field the rule read: it is blamed, not the file's valid value.
        let e = load_str(r#"{"model": {"hidden": 64}}"#, origin(), &[set("model.heads=7")]).unwrap_err();
        assert_eq!((e.line, e.from_override.as_deref()), (None, Some("model.heads=7")));
        assert_eq!(e.field.as_deref(), Some("model.hidden"));
    }

    #[test]
    fn override_errors_name_the_override() {
        let e = load_str("{}", origin(), &[set("data.workers=0"), set("data.worker=4")]).unwrap_err();
        assert_eq!(e.from_override.as_deref(), Some("data.worker=4"));
        assert_eq!((e.line, e.column), (None, None));
        let e = load_str("{}", origin(), &[set("data.workers.count=4")]).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("data.workers"));
        let e = load_str("{}", origin(), &[set("inject[0].step=4")]).unwrap_err();
        assert_eq!(e.message, "`inject` has 0 items, so there is no item 0");
        let e = load_str("{}", origin(), &[set("name=123")]).unwrap_err();
        assert_eq!(e.hint.as_deref(), Some("quote the value so it stays a string: `--set 'name=\"123\"'`"));
        let e = load_str("{}", origin(), &[set("workers=2")]).unwrap_err();
        assert_eq!(e.hint.as_deref(), Some("did you mean `data.workers`?"));
    }

    #[test]
    fn set_on_an_object_param_keeps_its_cuts() {
        let file = r#"{"command": ["python", "t.py", "{workers}", "{pin}"],
                       "params": {"workers": {"value": 8, "cuts": [8, 4, 1, 0]}, "pin": true}}"#;
        let overrides: Vec<Override> = ["params.workers=4", "params.pin=false"].map(set).to_vec();
        let s = load_str(file, origin(), &overrides).unwrap();
        assert_eq!(s.params["workers"].value, crate::scenario::ParamValue::Int(4));
        assert_eq!(s.params["workers"].cuts.as_ref().map(Vec::len), Some(4));
        let mut value: Value = serde_json::from_str(file).unwrap();
        for o in &overrides {
            let segments = param_value_path(&value, path::parse(&o.path).unwrap(), &o.value);
            path::set(&mut value, &segments, o.value.clone()).unwrap();
        }
        assert_eq!(value["params"], json!({"workers": {"value": 4, "cuts": [8, 4, 1, 0]}, "pin": false}));
    }

    #[test]
    fn lookup_reads_dotted_paths_including_unset_options() {
        let mut s = Scenario::default();
        s.launch.mode = Mode::Ddp;
        s.data.cache = Cache::Shm;
        assert_eq!(lookup(&s, "launch.mode"), Some(json!("ddp")));
        assert_eq!(lookup(&s, "data.cache"), Some(json!("shm")));
        assert_eq!(lookup(&s, "model.conditioning"), Some(json!(true)));
        assert_eq!(lookup(&s, "model.depths"), Some(json!([1, 1])));
        assert_eq!(lookup(&s, "data.workers"), Some(json!(0)));
        assert_eq!(lookup(&s, "expect.signal"), Some(Value::Null));
        assert_eq!(lookup(&s, "data.shm_size"), Some(Value::Null));
        assert_eq!(lookup(&s, "data.worker"), None);
        assert_eq!(lookup(&s, "inject[0].step"), None);
        assert_eq!(lookup(&s, "a..b"), None);
    }

    #[test]
    fn validate_returns_field_message_and_hint() {
        let mut s = Scenario::default();
        assert_eq!(validate(&s), Ok(()));
        s.model.depths.clear();
        let (field, message, hint) = validate(&s).unwrap_err();
        assert_eq!(field, "model.depths");
        assert_eq!(message, "the model needs at least one stage, found `[]`");
        assert!(hint.is_some());
    }

    #[test]
    fn when_conditions_match_values_or_lists_of_values() {
        let s = Scenario::default();
        let when = |pairs: &[(&str, Value)]| -> BTreeMap<String, Value> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
        };
        assert!(when_matches(&s, &when(&[])));
        assert!(when_matches(&s, &when(&[("launch.mode", json!("single"))])));
        assert!(when_matches(&s, &when(&[("launch.mode", json!(["ddp", "single"]))])));
        assert!(!when_matches(&s, &when(&[("launch.mode", json!("ddp"))])));
        assert!(when_matches(&s, &when(&[("limits.timeout_s", json!(600))])));
        assert!(when_matches(&s, &when(&[("model.depths", json!([1, 1]))])));
        assert!(when_matches(&s, &when(&[("model.depths", json!([[2], [1, 1]]))])));
        assert!(when_matches(&s, &when(&[("data.shm_size", json!(null))])));
        assert!(!when_matches(&s, &when(&[("data.worker", json!(0))])));
        assert!(!when_matches(&s, &when(&[("data.workers", json!(0)), ("model.attention", json!(false))])));
    }

    #[test]
    fn scenario_files_expands_folders_to_sorted_json_files() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["b.json", "a.json", "notes.md"] {
            std::fs::write(dir.path().join(name), "{}").unwrap();
        }
        std::fs::create_dir(dir.path().join("nested.json")).unwrap();
        let single = dir.path().join("notes.md");
        let files = scenario_files(&[dir.path().to_path_buf(), single.clone()]).unwrap();
        assert_eq!(files, vec![dir.path().join("a.json"), dir.path().join("b.json"), single]);

        let empty = tempfile::tempdir().unwrap();
        let e = scenario_files(&[empty.path().to_path_buf()]).unwrap_err();
        assert_eq!(e.message, "no `*.json` scenario files in this folder");
        let e = scenario_files(&[dir.path().join("missing.json")]).unwrap_err();
        assert_eq!(e.message, "cannot open: No such file or directory");
    }

    #[test]
    fn load_file_names_a_file_it_cannot_read() {
        let e = load_file(Path::new("scenarios/does-not-exist.json"), &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "scenarios/does-not-exist.json: cannot read file: No such file or directory\n  \
             hint: check the path; a folder runs every `*.json` scenario in it"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("smoke.json");
        std::fs::write(&file, r#"{"train": {"steps": 5}}"#).unwrap();
        let s = load_file(&file, &[set("train.lr=0.01")]).unwrap();
        assert_eq!((s.name.as_str(), s.train.steps, s.train.lr), ("smoke", 5, 0.01));
    }

    mod snapshots {
        use super::*;

        #[test]
        fn unknown_top_level_field() {
            insta::assert_snapshot!(error("{\n  \"name\": \"x\",\n  \"trian\": {\"steps\": 3}\n}", &[]));
        }

        #[test]
        fn unknown_top_level_field_without_a_close_name() {
            insta::assert_snapshot!(error("{\"resolution\": 3}", &[]));
        }

        #[test]
        fn unknown_nested_field_with_suggestion() {
            insta::assert_snapshot!(error(
                "{\n  \"data\": {\n    \"samples\": 8,\n    \"worker\": 4\n  }\n}",
                &[]
            ));
        }

        #[test]
        fn unknown_field_in_a_fault() {
            insta::assert_snapshot!(error(
                "{\n  \"inject\": [\n    {\"fault\": \"segv\", \"phase\": \"forward\", \"stp\": 3}\n  ]\n}",
                &[]
            ));
        }

        #[test]
        fn wrong_type() {
            insta::assert_snapshot!(error("{\n  \"data\": {\"workers\": \"4\"}\n}", &[]));
        }

        #[test]
        fn wrong_type_list() {
            insta::assert_snapshot!(error("{\n  \"model\": {\"depths\": 2}\n}", &[]));
        }

        #[test]
        fn unknown_enum_variant_with_suggestion() {
            insta::assert_snapshot!(error("{\n  \"launch\": {\n    \"mode\": \"dpp\"\n  }\n}", &[]));
        }

        #[test]
        fn unknown_enum_variant_without_a_close_name() {
            insta::assert_snapshot!(error(
                "{\"inject\": [{\"fault\": \"explode\", \"phase\": \"forward\"}]}",
                &[]
            ));
        }

        #[test]
        fn missing_fault_phase() {
            insta::assert_snapshot!(error("{\"inject\": [\n  {\"fault\": \"segv\"}\n]}", &[]));
        }

        #[test]
        fn json_syntax_error_trailing_comma() {
            insta::assert_snapshot!(error("{\n  \"name\": \"x\",\n  \"data\": {\"workers\": 0,}\n}", &[]));
        }

        #[test]
        fn json_syntax_error_missing_quote() {
            insta::assert_snapshot!(error("{\n  \"name\": \"x,\n  \"data\": {}\n}", &[]));
        }

        #[test]
        fn empty_depths() {
            insta::assert_snapshot!(error("{\n  \"model\": {\"depths\": []}\n}", &[]));
        }

        #[test]
        fn hidden_not_divisible_by_heads() {
            insta::assert_snapshot!(error(
                "{\n  \"model\": {\n    \"hidden\": 60,\n    \"heads\": 8\n  }\n}",
                &[]
            ));
        }

        #[test]
        fn unknown_inject_phase() {
            insta::assert_snapshot!(error(
                "{\n  \"inject\": [\n    {\"fault\": \"segv\", \"phase\": \"forwad\", \"step\": 3}\n  ]\n}",
                &[]
            ));
        }

        #[test]
        fn inject_step_past_the_end() {
            insta::assert_snapshot!(error(
                "{\n  \"train\": {\"steps\": 10},\n  \"inject\": [{\"fault\": \"nan\", \"phase\": \"backward\", \"step\": 10}]\n}",
                &[]
            ));
        }

        #[test]
        fn unknown_when_path() {
            insta::assert_snapshot!(error(
                "{\n  \"inject\": [{\n    \"fault\": \"segv\", \"phase\": \"forward\",\n    \"when\": {\"model.conditionin\": true}\n  }]\n}",
                &[]
            ));
        }

        #[test]
        fn impossible_when_value() {
            insta::assert_snapshot!(error(
                "{\n  \"inject\": [{\n    \"fault\": \"segv\", \"phase\": \"forward\",\n    \"when\": {\"launch.mode\": [\"single\", \"dpp\"]}\n  }]\n}",
                &[]
            ));
        }

        #[test]
        fn bad_set_path() {
            insta::assert_snapshot!(error("{}", &["data.worker=4"]));
        }

        #[test]
        fn set_into_a_number() {
            insta::assert_snapshot!(error("{}", &["data.workers.count=4"]));
        }

        #[test]
        fn set_with_a_bad_value() {
            insta::assert_snapshot!(error("{}", &["data.batch_size=big"]));
        }

        #[test]
        fn set_with_an_unknown_value() {
            insta::assert_snapshot!(error("{}", &["launch.device=gpu"]));
        }

        #[test]
        fn set_that_fails_validation() {
            insta::assert_snapshot!(error("{\"model\": {\"hidden\": 64}}", &["model.heads=6"]));
        }

        #[test]
        fn cuda_cache_on_cpu_ranks() {
            insta::assert_snapshot!(error(
                "{\n  \"launch\": {\"device\": \"cpu\"},\n  \"data\": {\"cache_device\": \"cuda\"}\n}",
                &[]
            ));
        }

        #[test]
        fn worker_threads_inherit_without_workers_by_set() {
            insta::assert_snapshot!(error("{}", &["data.worker_threads=inherit"]));
        }

        #[test]
        fn external_command_with_an_unknown_placeholder() {
            insta::assert_snapshot!(error(
                "{\n  \"command\": [\"python\", \"train.py\",\n    \"--workers\", \"{wokers}\"],\n  \"params\": {\"workers\": 2}\n}",
                &[]
            ));
        }

        #[test]
        fn external_param_declared_but_unused() {
            insta::assert_snapshot!(error(
                "{\n  \"command\": [\"python\", \"train.py\"],\n  \"params\": {\n    \"pin_memory\": true\n  }\n}",
                &[]
            ));
        }

        #[test]
        fn external_param_object_with_a_misspelt_field() {
            insta::assert_snapshot!(error(
                "{\n  \"command\": [\"python\", \"train.py\", \"{workers}\"],\n  \"params\": {\"workers\": {\"valu\": 8, \"cuts\": [8, 4]}}\n}",
                &[]
            ));
        }

        #[test]
        fn external_command_with_a_built_in_trainer_field() {
            insta::assert_snapshot!(error(
                "{\n  \"command\": [\"python\", \"train.py\"],\n  \"model\": {\"depths\": [2]}\n}",
                &[]
            ));
        }

        #[test]
        fn unknown_signal() {
            insta::assert_snapshot!(error(
                "{\"expect\": {\"outcome\": \"signaled\", \"signal\": \"SIGSEG\"}}",
                &[]
            ));
        }
    }
}
