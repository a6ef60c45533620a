//! External training commands: the `params` a scenario declares, the `{name}` placeholders of its
//! `command`, and how values are written into the argv. Pure: no processes, no files.
//!
//! A param is written either bare (`"workers": 4`) or as an object that also says how bisect may
//! cut it (`"workers": {"value": 8, "cuts": [8, 4, 1, 0]}`, `"depth": {"value": 4, "min": 1}`).
//! Both forms load into the same [`Param`]; a param without `min` and `cuts` is written back bare.
//!
//! In an argument, `{name}` is replaced by the value of param `name` or of a built-in placeholder
//! ([`BUILTIN_PLACEHOLDERS`]); `{{name}}` gives a literal `{name}`; every other brace is kept as it
//! is (`--config={"a": 1}` passes through). Values are written as: booleans `true` / `false`,
//! numbers as JSON writes them (`4`, `0.5`), strings as they are, lists of numbers comma-joined
//! (`[2, 2]` → `2,2`; `[]` → the empty string).

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Number;

/// Placeholders every command may use besides its params: `{world_size}` (`launch.world_size`,
/// e.g. for `torchrun --nproc_per_node {world_size}`), `{nodes}` (`launch.nodes`) and
/// `{ranks_per_node}` (`world_size / nodes`), for `torchrun --nnodes {nodes} --nproc_per_node
/// {ranks_per_node}`, `{scenario_dir}` (the absolute folder of the scenario file, to name a
/// program next to it) and `{master_port}` (a free TCP port picked for the run's rendezvous, for
/// launchers that take it as an argument: `deepspeed --master_port {master_port}`, `accelerate
/// launch --main_process_port {master_port}`).
pub const BUILTIN_PLACEHOLDERS: [&str; 5] =
    ["world_size", "nodes", "ranks_per_node", "scenario_dir", "master_port"];

/// One user knob of an external command.
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    pub value: ParamValue,
    /// The smallest value bisect may lower a number to; for a list, the fewest items it may keep.
    pub min: Option<f64>,
    /// The values bisect tries, in order, instead of its own ladder (`[8, 4, 1, 0]`).
    pub cuts: Option<Vec<ParamValue>>,
    /// A list written as separate words (`--gpus 0 1`, argparse's `nargs="+"`): the argument
    /// that is its placeholder alone becomes one argument per item.
    pub words: bool,
}

impl Param {
    /// A param with a value and no cutting rules of its own.
    pub fn new(value: ParamValue) -> Param {
        Param { value, min: None, cuts: None, words: false }
    }

    /// What the param's placeholder is filled with.
    pub fn fill(&self) -> Fill {
        match &self.value {
            ParamValue::List(items) if self.words => {
                Fill::Words(items.iter().map(Number::to_string).collect())
            }
            value => Fill::Text(value.render()),
        }
    }
}

/// What a placeholder is filled with.
#[derive(Debug, Clone, PartialEq)]
pub enum Fill {
    /// Text, in the argument where the placeholder is.
    Text(String),
    /// Arguments of their own, in place of the argument that is the placeholder alone (a list
    /// written as separate words); inside a longer argument, the words joined by commas.
    Words(Vec<String>),
}

/// The value of a param.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamValue {
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(String),
    /// A list of numbers (`[2, 2]`); integers stay integers.
    List(Vec<Number>),
}

impl ParamValue {
    /// How the value is written into an argument of the command.
    pub fn render(&self) -> String {
        match self {
            ParamValue::Bool(b) => b.to_string(),
            ParamValue::Int(i) => i.to_string(),
            ParamValue::Float(f) => Number::from_f64(*f).map_or_else(|| f.to_string(), |n| n.to_string()),
            ParamValue::Text(t) => t.clone(),
            ParamValue::List(items) => items.iter().map(Number::to_string).collect::<Vec<_>>().join(","),
        }
    }

    /// The kind, as messages name it.
    pub fn kind(&self) -> &'static str {
        match self {
            ParamValue::Bool(_) => "a boolean",
            ParamValue::Int(_) => "an integer",
            ParamValue::Float(_) => "a number",
            ParamValue::Text(_) => "a string",
            ParamValue::List(_) => "a list of numbers",
        }
    }

    /// The value as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

impl fmt::Display for ParamValue {
    /// As JSON (`true`, `4`, `"bf16"`, `[2, 2]`), for messages and reports.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamValue::List(items) => {
                let items: Vec<String> = items.iter().map(Number::to_string).collect();
                write!(f, "[{}]", items.join(", "))
            }
            other => write!(f, "{}", other.to_json()),
        }
    }
}

impl Serialize for ParamValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ParamValue::Bool(b) => s.serialize_bool(*b),
            ParamValue::Int(i) => s.serialize_i64(*i),
            ParamValue::Float(f) => s.serialize_f64(*f),
            ParamValue::Text(t) => s.serialize_str(t),
            ParamValue::List(items) => items.serialize(s),
        }
    }
}

/// What a param value may be, as serde's "expected …" (the loader words messages with it).
const VALUE_FORMS: &str = "`true`/`false`, a number, a string or a list of numbers";

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = ParamValue;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(VALUE_FORMS)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<ParamValue, E> {
        Ok(ParamValue::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<ParamValue, E> {
        Ok(ParamValue::Int(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<ParamValue, E> {
        i64::try_from(v)
            .map(ParamValue::Int)
            .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<ParamValue, E> {
        Ok(ParamValue::Float(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<ParamValue, E> {
        Ok(ParamValue::Text(v.to_string()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ParamValue, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<ListItem>()? {
            items.push(item.0);
        }
        Ok(ParamValue::List(items))
    }
}

/// One number of a list param, with an "expected" that says what the list may hold.
struct ListItem(Number);

impl<'de> Deserialize<'de> for ListItem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ListItem, D::Error> {
        struct ItemVisitor;
        impl Visitor<'_> for ItemVisitor {
            type Value = ListItem;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number (a list param holds numbers only)")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ListItem, E> {
                Ok(ListItem(v.into()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ListItem, E> {
                Ok(ListItem(v.into()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<ListItem, E> {
                Number::from_f64(v).map(ListItem).ok_or_else(|| E::custom("a list item is not finite"))
            }
        }
        d.deserialize_any(ItemVisitor)
    }
}

impl<'de> Deserialize<'de> for ParamValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ParamValue, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

/// The object form of a param.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ParamObject {
    value: ParamValue,
    #[serde(default)]
    min: Option<f64>,
    #[serde(default)]
    cuts: Option<Vec<ParamValue>>,
    #[serde(default)]
    words: bool,
}

struct ParamVisitor;

impl<'de> Visitor<'de> for ParamVisitor {
    type Value = Param;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{VALUE_FORMS}, or an object with `value`")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Param, E> {
        ValueVisitor.visit_bool(v).map(Param::new)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Param, E> {
        ValueVisitor.visit_i64(v).map(Param::new)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Param, E> {
        ValueVisitor.visit_u64(v).map(Param::new)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Param, E> {
        ValueVisitor.visit_f64(v).map(Param::new)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Param, E> {
        ValueVisitor.visit_str(v).map(Param::new)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Param, A::Error> {
        ValueVisitor.visit_seq(seq).map(Param::new)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Param, A::Error> {
        // Through the caller's MapAccess, so that a path-tracking deserializer still knows where
        // an unknown or missing field is (`params.workers.valu`).
        let object = ParamObject::deserialize(de::value::MapAccessDeserializer::new(map))?;
        Ok(Param { value: object.value, min: object.min, cuts: object.cuts, words: object.words })
    }
}

impl<'de> Deserialize<'de> for Param {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Param, D::Error> {
        d.deserialize_any(ParamVisitor)
    }
}

impl Serialize for Param {
    /// Bare when the param has no cutting rules, so a file round-trips as it was written.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        if self.min.is_none() && self.cuts.is_none() && !self.words {
            return self.value.serialize(s);
        }
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("value", &self.value)?;
        if let Some(min) = self.min {
            // An integral minimum is written as an integer (`0`, not `0.0`).
            match Number::from_f64(min) {
                Some(_) if min.fract() == 0.0 && min.abs() < 9.0e15 => {
                    map.serialize_entry("min", &(min as i64))?
                }
                _ => map.serialize_entry("min", &min)?,
            }
        }
        if let Some(cuts) = &self.cuts {
            map.serialize_entry("cuts", cuts)?;
        }
        if self.words {
            map.serialize_entry("words", &true)?;
        }
        map.end()
    }
}

/// One piece of a command argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    /// `{name}`, at this byte offset of the argument.
    Placeholder {
        name: String,
        at: usize,
    },
}

/// Splits an argument into text and placeholders (`{{name}}` is the text `{name}`).
pub fn pieces(arg: &str) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut text = String::new();
    let bytes = arg.as_bytes();
    let mut i = 0;
    while i < arg.len() {
        if bytes[i] == b'{' {
            if let Some(len) = escaped_placeholder(&arg[i..]) {
                // `{{name}}`: keep `{name}` literally.
                text.push_str(&arg[i + 1..i + len - 1]);
                i += len;
                continue;
            }
            if let Some(name) = placeholder_at(&arg[i..]) {
                if !text.is_empty() {
                    out.push(Piece::Text(std::mem::take(&mut text)));
                }
                out.push(Piece::Placeholder { name: name.to_string(), at: i });
                i += name.len() + 2;
                continue;
            }
        }
        let ch = arg[i..].chars().next().unwrap_or('{');
        text.push(ch);
        i += ch.len_utf8();
    }
    if !text.is_empty() {
        out.push(Piece::Text(text));
    }
    out
}

/// `{name}` at the start of `s`: the name.
fn placeholder_at(s: &str) -> Option<&str> {
    let rest = s.strip_prefix('{')?;
    let end = rest.find('}')?;
    let name = &rest[..end];
    is_identifier(name).then_some(name)
}

/// `{{name}}` at the start of `s`: its length in bytes.
fn escaped_placeholder(s: &str) -> Option<usize> {
    let inner = s.strip_prefix('{')?;
    let name = placeholder_at(inner)?;
    inner[name.len() + 2..].starts_with('}').then_some(name.len() + 4)
}

/// A param name that can be a placeholder: a letter or `_`, then letters, digits, `_`.
pub fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The placeholder names used in `command`, with the index of the argument each is in.
pub fn placeholders(command: &[String]) -> Vec<(usize, String)> {
    command
        .iter()
        .enumerate()
        .flat_map(|(index, arg)| {
            pieces(arg).into_iter().filter_map(move |p| match p {
                Piece::Placeholder { name, .. } => Some((index, name)),
                Piece::Text(_) => None,
            })
        })
        .collect()
}

/// The argv with every placeholder replaced: a built-in one by `builtin`'s text, a param by its
/// [`Param::fill`] (one unknown to both is left as written, which validation rules out).
/// An argument that is one placeholder alone whose value is empty is left out (a bare flag
/// `bisect -- CMD` removes, `{pin_memory}` = `""`), not passed as an empty argument; one that is
/// a list written as separate words becomes its words.
pub fn render_with(
    command: &[String],
    params: &BTreeMap<String, Param>,
    builtin: impl Fn(&str) -> Option<String>,
) -> Vec<String> {
    let fill = |name: &str| builtin(name).map(Fill::Text).or_else(|| params.get(name).map(Param::fill));
    command
        .iter()
        .flat_map(|arg| {
            let pieces = pieces(arg);
            if let [Piece::Placeholder { name, .. }] = pieces.as_slice()
                && let Some(Fill::Words(words)) = fill(name)
            {
                return words;
            }
            let alone = matches!(pieces.as_slice(), [Piece::Placeholder { .. }]);
            let rendered: String = pieces
                .into_iter()
                .map(|piece| match piece {
                    Piece::Text(text) => text,
                    Piece::Placeholder { name, .. } => match fill(&name) {
                        Some(Fill::Text(text)) => text,
                        Some(Fill::Words(words)) => words.join(","),
                        None => format!("{{{name}}}"),
                    },
                })
                .collect();
            if alone && rendered.is_empty() { Vec::new() } else { vec![rendered] }
        })
        .collect()
}

/// The `file` of a scenario that is a command typed after `--` (`ups-doctor run -- CMD`): its
/// scenario file is written into the run folder as `scenario.json`.
pub const COMMAND_LINE: &str = "(the command line)";

/// Quotes one argument for a POSIX shell, leaving plain words as they are.
pub fn shell_quote(arg: &str) -> String {
    let plain = !arg.is_empty() && arg.chars().all(|c| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c));
    if plain { arg.to_string() } else { format!("'{}'", arg.replace('\'', r"'\''")) }
}

/// A command line that can be pasted into a POSIX shell.
pub fn shell_line<S: AsRef<str>>(args: &[S]) -> String {
    args.iter().map(|a| shell_quote(a.as_ref())).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    fn param(v: serde_json::Value) -> Param {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn params_load_bare_or_as_objects_and_write_back_the_same_way() {
        assert_eq!(param(json!(true)), Param::new(ParamValue::Bool(true)));
        assert_eq!(param(json!(4)), Param::new(ParamValue::Int(4)));
        assert_eq!(param(json!(0.5)), Param::new(ParamValue::Float(0.5)));
        assert_eq!(param(json!("bf16")), Param::new(ParamValue::Text("bf16".into())));
        assert_eq!(param(json!([2, 2])), Param::new(ParamValue::List(vec![2.into(), 2.into()])));
        let cut = param(json!({"value": 8, "cuts": [8, 4, 1, 0]}));
        assert_eq!(cut.value, ParamValue::Int(8));
        assert_eq!(cut.cuts.as_ref().map(Vec::len), Some(4));
        let min = param(json!({"value": 4, "min": 0}));
        assert_eq!((min.value.clone(), min.min, min.cuts.clone()), (ParamValue::Int(4), Some(0.0), None));
        for v in [
            json!(true),
            json!(4),
            json!([2, 0.5]),
            json!({"value": 4, "min": 0}),
            json!({"value": 8, "cuts": [8, 4]}),
            json!({"value": [0, 1], "words": true}),
        ] {
            assert_eq!(serde_json::to_value(param(v.clone())).unwrap(), v);
        }
    }

    #[test]
    fn params_refuse_what_cannot_go_into_an_argument() {
        let err = |v: serde_json::Value| serde_json::from_value::<Param>(v).unwrap_err().to_string();
        assert!(err(json!(null)).contains("expected `true`/`false`, a number"), "{}", err(json!(null)));
        assert!(err(json!(["a"])).contains("a list param holds numbers only"));
        assert!(err(json!({"valu": 4})).contains("unknown field `valu`"));
        assert!(err(json!({"min": 4})).contains("missing field `value`"));
        assert!(err(json!({"value": {"value": 1}})).contains("invalid type: map"));
    }

    #[test]
    fn values_render_as_documented() {
        assert_eq!(ParamValue::Bool(false).render(), "false");
        assert_eq!(ParamValue::Int(-3).render(), "-3");
        assert_eq!(ParamValue::Float(0.001).render(), "0.001");
        assert_eq!(ParamValue::Text("a b".into()).render(), "a b");
        assert_eq!(ParamValue::List(vec![2.into(), Number::from_f64(0.5).unwrap()]).render(), "2,0.5");
        assert_eq!(ParamValue::List(vec![]).render(), "");
        assert_eq!(ParamValue::List(vec![1.into(), 2.into()]).to_string(), "[1, 2]");
        assert_eq!(ParamValue::Text("x".into()).to_string(), "\"x\"");
    }

    #[test]
    fn placeholders_are_whole_or_inside_arguments_and_other_braces_stay() {
        let argv: Vec<String> = [
            "train.py",
            "--workers",
            "{workers}",
            "--depths={depths}",
            "{{workers}}",
            "--cfg={\"a\": 1}",
            "${HOME}",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            placeholders(&argv),
            vec![(2, "workers".to_string()), (3, "depths".to_string()), (6, "HOME".to_string())]
        );
        let none = BTreeMap::new();
        let values = BTreeMap::from([("workers", "4"), ("depths", "2,2"), ("HOME", "h")]);
        assert_eq!(
            render_with(&argv, &none, |n| values.get(n).map(|v| v.to_string())),
            ["train.py", "--workers", "4", "--depths=2,2", "{workers}", "--cfg={\"a\": 1}", "$h"]
        );
        // A placeholder alone that renders empty is no argument at all; inside text it is text.
        let flags = ["t.py", "{pin}", "--x={pin}"].map(String::from).to_vec();
        assert_eq!(render_with(&flags, &none, |_| Some(String::new())), ["t.py", "--x="]);
        // A list written as separate words is as many arguments, none when it is empty; a
        // built-in placeholder comes before a param.
        let gpus = |items: &[u64]| Param {
            words: true,
            ..Param::new(ParamValue::List(items.iter().map(|&i| i.into()).collect()))
        };
        let argv = ["t.py", "--gpus", "{gpus}", "--n={gpus}", "{world_size}"].map(String::from).to_vec();
        let params =
            BTreeMap::from([("gpus".to_string(), gpus(&[0, 1])), ("world_size".to_string(), gpus(&[9]))]);
        let builtin = |n: &str| (n == "world_size").then(|| "2".to_string());
        assert_eq!(render_with(&argv, &params, builtin), ["t.py", "--gpus", "0", "1", "--n=0,1", "2"]);
        let params = BTreeMap::from([("gpus".to_string(), gpus(&[]))]);
        assert_eq!(render_with(&argv, &params, builtin), ["t.py", "--gpus", "--n=", "2"]);
        assert_eq!(
            pieces("a{b c}{x}"),
            vec![Piece::Text("a{b c}".into()), Piece::Placeholder { name: "x".into(), at: 6 }]
        );
        assert!(
            is_identifier("pin_memory") && is_identifier("_x1") && !is_identifier("1x") && !is_identifier("")
        );
    }
}
