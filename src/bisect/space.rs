//! The search space: what bisect can take away from a scenario, and how a configuration (one
//! setting per component) becomes a runnable scenario.
//!
//! Components are derived from the scenario itself ([`derive()`]), never listed per scenario: a
//! field is a component only when its current value differs from what cutting it would set. The
//! faults in `inject`, the `expect`ation, the `limits` and the `name` are never touched.
//!
//! [`apply`] keeps every candidate valid: numeric domains are chosen so that relations between
//! fields hold (`model.heads` takes divisors of its original value and `model.hidden` multiples of
//! the original `heads`, so `hidden` stays divisible by `heads`; `train.steps` never drops below
//! the last step an injected per-step fault needs), and the few relations left are resolved after
//! the cut. Values that the schema knows but the tool cannot run yet are not refused here: the
//! ladder exists to cut exactly those.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::scenario::{
    self, Backend, Cache, Device, Mode, PER_STEP_PHASES, ParamValue, Scenario, StartMethod,
};

/// One thing bisect can take away from the scenario.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Component {
    /// The dotted field it changes (`model.attention`, `model.depths[1]`), or `model.stages[i]`
    /// for a whole stage of blocks.
    pub id: String,
    /// How it is cut.
    pub kind: Kind,
}

/// How a [`Component`] is cut.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Kind {
    /// A big cut, tried first and in ladder order: set every dotted field of `sets` to its value
    /// (`launch.mode` → `single` also sets `launch.world_size` → 1).
    Ladder { sets: Vec<(String, Value)> },
    /// An on/off feature: cutting sets `field` to `off`.
    Toggle { field: String, off: Value },
    /// An integer field that can be lowered from `from` down to `min`.
    Numeric { field: String, from: u64, min: u64 },
    /// Stage `index` of `model.depths` (never the first): cutting removes the stage.
    Stage { index: usize },
    /// The depth of stage `index`, from `from` blocks down to 1.
    StageDepth { index: usize, from: u64 },
    /// A list param (`params.depths`): cutting keeps only its first items, down to `min` of them.
    Prefix { field: String, items: Vec<Value>, min: u64 },
    /// A param with its own ladder (`"cuts": [8, 4, 1, 0]`): `values[0]` is the original value,
    /// then each cut in the order given; the last is the full cut.
    Choices { field: String, values: Vec<Value> },
    /// A variable of the command's `launch.env`: cutting unsets it (the command then sees
    /// whatever ups-doctor's own environment has, as when the user had not set it).
    Unset { name: String },
}

/// A configuration: for each component id, its setting. A missing id means [`Setting::Original`].
pub type Assignment = BTreeMap<String, Setting>;

/// The setting of one component in a configuration.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Setting {
    /// As in the original scenario.
    Original,
    /// Cut: ladder and toggle values set, stage removed, numeric at its minimum.
    Cut,
    /// A numeric component (or a stage's depth) at this value.
    Value(u64),
}

impl Component {
    /// The setting that cuts this component as far as it goes.
    pub fn cut_setting(&self) -> Setting {
        match &self.kind {
            Kind::Numeric { min, .. } | Kind::Prefix { min, .. } => Setting::Value(*min),
            Kind::StageDepth { .. } => Setting::Value(1),
            Kind::Choices { .. } => Setting::Value(0),
            Kind::Ladder { .. } | Kind::Toggle { .. } | Kind::Stage { .. } | Kind::Unset { .. } => {
                Setting::Cut
            }
        }
    }

    /// Whether the component can be lowered in steps (and so is searched by halving).
    pub fn is_numeric(&self) -> bool {
        matches!(
            self.kind,
            Kind::Numeric { .. } | Kind::StageDepth { .. } | Kind::Prefix { .. } | Kind::Choices { .. }
        )
    }

    /// The value a numeric component has under `setting` (`None` for on/off components). For a
    /// list param it is the number of items kept; for a param with its own cuts, how many cuts
    /// are left to take (0: the last cut, `values.len() - 1`: the original).
    pub fn value(&self, setting: &Setting) -> Option<u64> {
        let (from, min) = match &self.kind {
            Kind::Numeric { from, min, .. } => (*from, *min),
            Kind::StageDepth { from, .. } => (*from, 1),
            Kind::Prefix { items, min, .. } => (items.len() as u64, *min),
            Kind::Choices { values, .. } => (values.len().saturating_sub(1) as u64, 0),
            Kind::Ladder { .. } | Kind::Toggle { .. } | Kind::Stage { .. } | Kind::Unset { .. } => {
                return None;
            }
        };
        Some(match setting {
            Setting::Original => from,
            Setting::Cut => min,
            Setting::Value(v) => *v,
        })
    }

    /// Whether `setting` already cuts this component as far as it goes.
    pub fn is_at_minimum(&self, setting: &Setting) -> bool {
        match self.value(setting) {
            Some(v) => v <= self.domain().map_or(v, |d| d.value(0)),
            None => *setting == Setting::Cut,
        }
    }

    /// The values a numeric component may take, ascending (`None` for on/off components).
    pub(crate) fn domain(&self) -> Option<Domain> {
        match &self.kind {
            Kind::Numeric { field, from, min } if field == "model.heads" => {
                Some(Domain::List((*min..=*from).filter(|d| *d > 0 && from % d == 0).collect()))
            }
            Kind::Numeric { field, from, min } if field == "model.hidden" => {
                Some(Domain::Multiples { of: (*min).max(1), max: *from })
            }
            Kind::Numeric { from, min, .. } => Some(Domain::Range { min: *min, max: *from }),
            Kind::StageDepth { from, .. } => Some(Domain::Range { min: 1, max: *from }),
            Kind::Prefix { items, min, .. } => Some(Domain::Range { min: *min, max: items.len() as u64 }),
            Kind::Choices { values, .. } => {
                Some(Domain::Range { min: 0, max: values.len().saturating_sub(1) as u64 })
            }
            Kind::Ladder { .. } | Kind::Toggle { .. } | Kind::Stage { .. } | Kind::Unset { .. } => None,
        }
    }

    /// The setting one step further down from `setting`: the next lower value of a numeric
    /// component, the cut of an on/off one; `None` when it is already at its minimum.
    pub fn step_down(&self, setting: &Setting) -> Option<Setting> {
        if self.is_at_minimum(setting) {
            return None;
        }
        match (self.value(setting), self.domain()) {
            (Some(v), Some(domain)) => {
                let index = domain.floor_index(v);
                let below = if domain.value(index) < v { index } else { index.checked_sub(1)? };
                Some(Setting::Value(domain.value(below)))
            }
            _ => Some(Setting::Cut),
        }
    }
}

/// The ascending values a numeric component may take, without listing ranges out.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Domain {
    /// Every integer in `min..=max`.
    Range { min: u64, max: u64 },
    /// `of`, `2 * of`, … up to `max`.
    Multiples { of: u64, max: u64 },
    /// Exactly these values (ascending, non-empty).
    List(Vec<u64>),
}

impl Domain {
    /// How many values there are (at least 1).
    pub(crate) fn len(&self) -> usize {
        let n = match self {
            Domain::Range { min, max } => max.saturating_sub(*min).saturating_add(1),
            Domain::Multiples { of, max } => (max / of).max(1),
            Domain::List(values) => values.len() as u64,
        };
        usize::try_from(n).unwrap_or(usize::MAX).max(1)
    }

    /// The value at `index` (clamped into the domain).
    pub(crate) fn value(&self, index: usize) -> u64 {
        let index = index.min(self.len() - 1) as u64;
        match self {
            Domain::Range { min, .. } => min + index,
            Domain::Multiples { of, .. } => of * (index + 1),
            Domain::List(values) => values.get(index as usize).copied().unwrap_or(1),
        }
    }

    /// The index of the largest value at most `v` (0 when `v` is below every value).
    pub(crate) fn floor_index(&self, v: u64) -> usize {
        let index = match self {
            Domain::Range { min, .. } => v.saturating_sub(*min),
            Domain::Multiples { of, .. } => (v / of).saturating_sub(1),
            Domain::List(values) => values.iter().filter(|x| **x <= v).count().saturating_sub(1) as u64,
        };
        usize::try_from(index).unwrap_or(usize::MAX).min(self.len() - 1)
    }
}

/// The components of `scenario`, in the order bisect tries them: the ladder (in ladder order),
/// then on/off features, then stages and their depths, then numeric sizes. Only components whose
/// cut changes the scenario and keeps it valid are listed.
pub fn derive(scenario: &Scenario) -> Vec<Component> {
    let mut all = Vec::new();
    let ladder = |id: &str, sets: Vec<(&str, Value)>| Component {
        id: id.to_string(),
        kind: Kind::Ladder { sets: sets.into_iter().map(|(f, v)| (f.to_string(), v)).collect() },
    };
    if scenario.is_external() {
        return derive_external(scenario);
    }
    let (launch, data, model, train) = (&scenario.launch, &scenario.data, &scenario.model, &scenario.train);
    // Nodes first: a failure that needs no node boundary is bisected on one machine from then on.
    if launch.nodes > 1 {
        all.push(ladder("launch.nodes", vec![("launch.nodes", json!(1))]));
    }
    if launch.mode != Mode::Single {
        let mut sets = vec![("launch.mode", json!("single")), ("launch.world_size", json!(1))];
        if launch.nodes > 1 {
            sets.push(("launch.nodes", json!(1)));
        }
        if launch.backend != Backend::Auto {
            // One rank has no collective backend to choose.
            sets.push(("launch.backend", json!("auto")));
        }
        all.push(ladder("launch.mode", sets));
        if launch.world_size != 1 {
            let mut sets = vec![("launch.world_size", json!(1))];
            if launch.nodes > 1 {
                sets.push(("launch.nodes", json!(1)));
            }
            all.push(ladder("launch.world_size", sets));
        }
    }
    if data.workers != 0 {
        all.push(ladder("data.workers", vec![("data.workers", json!(0))]));
        // The start method only matters while there are workers to start.
        if data.start_method == StartMethod::Fork {
            all.push(ladder("data.start_method", vec![("data.start_method", json!("spawn"))]));
        }
    }
    if data.cache != Cache::Memory {
        all.push(ladder("data.cache", vec![("data.cache", json!("memory"))]));
    }
    // `auto` is the CPU on every machine the tool runs scenarios on today, so only an explicit
    // `cuda` is cut.
    if launch.device == Device::Cuda {
        all.push(ladder("launch.device", vec![("launch.device", json!("cpu"))]));
    }
    if train.amp {
        all.push(ladder("train.amp", vec![("train.amp", json!(false))]));
    }
    if data.shm_size.is_some() {
        all.push(ladder("data.shm_size", vec![("data.shm_size", Value::Null)]));
    }

    let toggle = |field: &str, off: Value| Component {
        id: field.to_string(),
        kind: Kind::Toggle { field: field.to_string(), off },
    };
    if model.attention {
        all.push(toggle("model.attention", json!(false)));
    }
    if model.conditioning {
        all.push(toggle("model.conditioning", json!(false)));
    }
    if model.window != 0 {
        all.push(toggle("model.window", json!(0)));
    }
    if train.accum_steps != 1 {
        all.push(toggle("train.accum_steps", json!(1)));
    }

    for index in 1..model.depths.len() {
        all.push(Component { id: format!("model.stages[{index}]"), kind: Kind::Stage { index } });
    }
    for (index, depth) in model.depths.iter().enumerate() {
        if *depth > 1 {
            all.push(Component {
                id: format!("model.depths[{index}]"),
                kind: Kind::StageDepth { index, from: u64::from(*depth) },
            });
        }
    }

    // A per-step fault must still get to its step, or the scenario is invalid.
    let last_fault_step = scenario
        .inject
        .iter()
        .filter(|f| PER_STEP_PHASES.contains(&f.phase.as_str()))
        .map(|f| f.step.saturating_add(1))
        .max()
        .unwrap_or(1);
    let numeric = |field: &str, from: u64, min: u64| Component {
        id: field.to_string(),
        kind: Kind::Numeric { field: field.to_string(), from, min },
    };
    let numerics = [
        numeric("train.steps", train.steps, last_fault_step.max(1)),
        numeric("data.batch_size", data.batch_size.into(), 1),
        numeric("data.samples", data.samples.into(), 1),
        numeric("data.timesteps", data.timesteps.into(), 2),
        numeric("data.queries", data.queries.into(), 1),
        numeric("data.augment_passes", data.augment_passes.into(), 0),
        numeric("model.hidden", model.hidden.into(), model.heads.max(1).into()),
        numeric("model.heads", model.heads.into(), 1),
        numeric("model.mlp_ratio", model.mlp_ratio.into(), 1),
    ];
    all.extend(
        numerics.into_iter().filter(|c| matches!(c.kind, Kind::Numeric { from, min, .. } if from > min)),
    );

    keep_valid_cuts(scenario, all)
}

/// A cut that is invalid even on its own can never be taken.
fn keep_valid_cuts(scenario: &Scenario, mut all: Vec<Component>) -> Vec<Component> {
    all.retain(|c| {
        let alone = Assignment::from([(c.id.clone(), c.cut_setting())]);
        apply(scenario, std::slice::from_ref(c), &alone).is_ok_and(|s| s != *scenario)
    });
    all
}

/// The components of a scenario that runs the user's `command`: one rank instead of several and
/// the machine's `/dev/shm` instead of a small one (the ladder), then the program's own `params`
/// in name order, then each variable of `launch.env` (unset). A param is cut by its own `cuts`
/// when it gives them; otherwise a boolean that is on switches off, an integer halves down to
/// its `min` (default 0) and a list of numbers keeps fewer of its first items, down to `min` of
/// them (default 1). Strings, numbers with a fraction and booleans that are off are left alone
/// unless they give `cuts`.
fn derive_external(scenario: &Scenario) -> Vec<Component> {
    let mut all = Vec::new();
    let nodes = scenario.launch.nodes;
    if nodes > 1 {
        all.push(Component {
            id: "launch.nodes".into(),
            kind: Kind::Ladder { sets: vec![("launch.nodes".into(), json!(1))] },
        });
    }
    if scenario.launch.world_size > 1 {
        let mut sets = vec![("launch.world_size".into(), json!(1))];
        if nodes > 1 {
            sets.push(("launch.nodes".into(), json!(1)));
        }
        all.push(Component { id: "launch.world_size".into(), kind: Kind::Ladder { sets } });
    }
    if scenario.data.shm_size.is_some() {
        all.push(Component {
            id: "data.shm_size".into(),
            kind: Kind::Ladder { sets: vec![("data.shm_size".into(), Value::Null)] },
        });
    }
    for (name, param) in &scenario.params {
        let field = format!("params.{name}");
        let kind = match (&param.cuts, &param.value) {
            (Some(cuts), value) => {
                let original = value.to_json();
                let mut values = vec![original.clone()];
                values.extend(cuts.iter().map(ParamValue::to_json).filter(|v| *v != original));
                if values.len() < 2 {
                    continue;
                }
                Kind::Choices { field: field.clone(), values }
            }
            (None, ParamValue::Bool(true)) => Kind::Toggle { field: field.clone(), off: json!(false) },
            (None, ParamValue::Int(v)) => {
                let min = param.min.unwrap_or(0.0);
                let (Ok(from), true) = (u64::try_from(*v), min >= 0.0 && min.fract() == 0.0) else {
                    continue;
                };
                if from <= min as u64 {
                    continue;
                }
                Kind::Numeric { field: field.clone(), from, min: min as u64 }
            }
            (None, ParamValue::List(items)) => {
                let min = param.min.filter(|m| *m >= 0.0).map_or(1, |m| m.ceil() as u64);
                if items.len() as u64 <= min {
                    continue;
                }
                Kind::Prefix {
                    field: field.clone(),
                    items: items.iter().cloned().map(Value::Number).collect(),
                    min,
                }
            }
            (None, ParamValue::Bool(false) | ParamValue::Float(_) | ParamValue::Text(_)) => continue,
        };
        all.push(Component { id: field, kind });
    }
    for name in scenario.launch.env.keys() {
        all.push(Component { id: env_id(name), kind: Kind::Unset { name: name.clone() } });
    }
    keep_valid_cuts(scenario, all)
}

/// Why an assignment makes no candidate: it names what is not in the space, or the cut scenario
/// is not a valid one. The search skips such an assignment; the messages are for tests and bugs.
#[derive(Debug, thiserror::Error)]
pub enum CutError {
    #[error("no component `{0}` in this search space")]
    UnknownComponent(String),
    #[error("`{0}` is on/off and takes no value")]
    TakesNoValue(String),
    #[error("no field `{0}` in the scenario")]
    NoField(String),
    #[error("no stage {0} in `model.depths`")]
    NoStage(usize),
    #[error("no variable `{0}` in `launch.env`")]
    NoVariable(String),
    #[error("depth {depth} of stage {stage} is too large")]
    DepthTooLarge { depth: u64, stage: usize },
    #[error("cannot serialise the scenario: {0}")]
    Serialise(#[source] serde_json::Error),
    #[error("the cut does not fit the schema: {0}")]
    Schema(#[source] serde_json::Error),
    /// The cut scenario breaks a rule of the scenario model.
    #[error("`{field}`: {message}")]
    Invalid { field: String, message: String },
}

/// Builds the candidate scenario for `assignment` (ids not in it stay original). Relations a cut
/// can break are resolved (`hidden` is rounded up to a multiple of `heads`, `queries` capped at
/// `grid`, `window` at `latent_tokens`); anything still invalid is an error. Only the "not
/// supported yet" refusals are let through: the ladder is there to cut those values.
pub fn apply(
    base: &Scenario,
    components: &[Component],
    assignment: &Assignment,
) -> Result<Scenario, CutError> {
    if let Some(unknown) = assignment.keys().find(|id| !components.iter().any(|c| &c.id == *id)) {
        return Err(CutError::UnknownComponent(unknown.clone()));
    }
    let mut value = serde_json::to_value(base).map_err(CutError::Serialise)?;
    let mut removed_stages = Vec::new();
    let mut depths: Vec<u64> = base.model.depths.iter().map(|d| u64::from(*d)).collect();
    for component in components {
        let setting = assignment.get(&component.id).unwrap_or(&Setting::Original);
        if *setting == Setting::Original {
            continue;
        }
        let wrong_setting = || CutError::TakesNoValue(component.id.clone());
        match &component.kind {
            Kind::Ladder { sets } => {
                let Setting::Cut = setting else { return Err(wrong_setting()) };
                for (field, to) in sets {
                    set_field(&mut value, field, to.clone())?;
                }
            }
            Kind::Toggle { field, off } => {
                let Setting::Cut = setting else { return Err(wrong_setting()) };
                set_field(&mut value, field, off.clone())?;
            }
            Kind::Numeric { field, .. } => {
                let v = component.value(setting).unwrap_or_default();
                set_field(&mut value, field, json!(v))?;
            }
            Kind::Stage { index } => {
                let Setting::Cut = setting else { return Err(wrong_setting()) };
                removed_stages.push(*index);
            }
            Kind::StageDepth { index, .. } => {
                let v = component.value(setting).unwrap_or_default();
                let slot = depths.get_mut(*index).ok_or(CutError::NoStage(*index))?;
                *slot = v;
            }
            Kind::Prefix { field, items, .. } => {
                let keep = component.value(setting).unwrap_or_default() as usize;
                set_field(&mut value, field, Value::Array(items[..keep.min(items.len())].to_vec()))?;
            }
            Kind::Choices { field, values } => {
                let left = component.value(setting).unwrap_or_default() as usize;
                let at = values.len().saturating_sub(1).saturating_sub(left);
                set_field(&mut value, field, values[at].clone())?;
            }
            Kind::Unset { name } => {
                let Setting::Cut = setting else { return Err(wrong_setting()) };
                value
                    .pointer_mut("/launch/env")
                    .and_then(Value::as_object_mut)
                    .and_then(|env| env.remove(name))
                    .ok_or_else(|| CutError::NoVariable(name.clone()))?;
            }
        }
    }
    let mut candidate: Scenario = serde_json::from_value(value).map_err(CutError::Schema)?;
    let kept: Result<Vec<u32>, CutError> = depths
        .iter()
        .enumerate()
        .filter(|(i, _)| !removed_stages.contains(i))
        .map(|(stage, &depth)| u32::try_from(depth).map_err(|_| CutError::DepthTooLarge { depth, stage }))
        .collect();
    candidate.model.depths = kept?;

    let model = &mut candidate.model;
    if model.heads > 0 && model.hidden % model.heads != 0 {
        model.hidden = model.hidden.div_ceil(model.heads).saturating_mul(model.heads);
    }
    model.window = model.window.min(model.latent_tokens);
    candidate.data.queries = candidate.data.queries.min(candidate.data.grid);

    match scenario::validate(&candidate) {
        Ok(()) => Ok(candidate),
        Err((_, message, _)) if message.contains("not supported yet") => Ok(candidate),
        Err((field, message, _)) => Err(CutError::Invalid { field, message }),
    }
}

/// The id of the component that unsets variable `name` of `launch.env`.
pub fn env_id(name: &str) -> String {
    format!("launch.env.{name}")
}

/// Sets the dotted object path `field` (`model.attention`) of `value`; the field must exist. A
/// param's cutting rules (`min`, `cuts`) go with its old value, but a list written as separate
/// words stays one: `words` says how it is written into the command.
fn set_field(value: &mut Value, field: &str, to: Value) -> Result<(), CutError> {
    let mut at = value;
    for key in field.split('.') {
        at = at
            .as_object_mut()
            .and_then(|object| object.get_mut(key))
            .ok_or_else(|| CutError::NoField(field.to_string()))?;
    }
    match at.as_object_mut().filter(|param| param.get("words") == Some(&Value::Bool(true))) {
        Some(param) => {
            param.insert("value".into(), to);
        }
        None => *at = to,
    }
    Ok(())
}

/// A stable hash of everything that affects a run (the scenario minus `name`, `description` and
/// `expect`; faults and limits included), as 32 lowercase hex digits: FNV-1a, 128 bits, over the
/// canonical JSON (object keys sorted).
pub fn config_hash(s: &Scenario) -> String {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    let mut canonical = String::new();
    write_canonical(&crate::scenario::run_relevant(s), &mut canonical);
    let hash = canonical.bytes().fold(OFFSET, |h, b| (h ^ u128::from(b)).wrapping_mul(PRIME));
    format!("{hash:032x}")
}

/// JSON with object keys sorted, whatever map type serde_json was built with.
fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(object) => {
            let mut entries: Vec<(&String, &Value)> = object.iter().collect();
            entries.sort_by(|x, y| x.0.cmp(y.0));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{}:", Value::String(key.clone()));
                write_canonical(item, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}
