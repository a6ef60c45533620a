//! The search against scripted oracles: closures over the candidate scenario, or a simulation of
//! the trainer's fault injection (`when`, `step`, `probability`) that reads the scenario's own
//! `inject`. Every oracle checks that each candidate it is handed is a valid scenario.

use serde_json::json;

use super::*;
use crate::scenario::{Fault, OutcomeKind, PER_STEP_PHASES, Scenario, lookup, validate, when_matches};
use crate::schema::{ProcessRole, Signal};

/// Counts runs and batches, and refuses invalid candidates.
struct Scripted<F: FnMut(&Scenario) -> Observation> {
    decide: F,
    runs: usize,
    batches: Vec<usize>,
}

impl<F: FnMut(&Scenario) -> Observation> Scripted<F> {
    fn new(decide: F) -> Self {
        Scripted { decide, runs: 0, batches: Vec::new() }
    }
}

impl<F: FnMut(&Scenario) -> Observation> Oracle for Scripted<F> {
    fn run(&mut self, candidates: &[Scenario]) -> Vec<Observation> {
        self.runs += candidates.len();
        self.batches.push(candidates.len());
        candidates
            .iter()
            .map(|candidate| {
                assert_valid(candidate);
                (self.decide)(candidate)
            })
            .collect()
    }
}

fn assert_valid(s: &Scenario) {
    if let Err((field, message, _)) = validate(s) {
        assert!(message.contains("not supported yet"), "invalid candidate: `{field}`: {message}");
    }
}

fn signature(outcome: OutcomeKind, signal: Option<&str>, phase: &str) -> Signature {
    Signature {
        outcome,
        signal: signal.map(|s| Signal::parse(s).expect("a signal name")),
        exit_code: (outcome == OutcomeKind::Exited).then_some(1),
        role: ProcessRole::Rank,
        phase: Some(phase.to_string()),
        pattern: None,
        died_first: None,
        exception: None,
        key: None,
    }
}

fn segv(phase: &str) -> Signature {
    signature(OutcomeKind::Signaled, Some("SIGSEGV"), phase)
}

fn hang(phase: &str) -> Signature {
    signature(OutcomeKind::Hung, None, phase)
}

fn fault(value: serde_json::Value) -> Fault {
    serde_json::from_value(value).expect("a valid fault")
}

/// xorshift64*: a seeded stand-in for the kernel randomness the trainer uses.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// What the trainer would do with the scenario's faults: the first armed fault that gets to run
/// decides the failure.
fn simulate(s: &Scenario, rng: &mut Rng) -> Observation {
    for f in &s.inject {
        let reached = !PER_STEP_PHASES.contains(&f.phase.as_str()) || f.step < s.train.steps;
        let fires = f.probability >= 1.0 || rng.unit() < f.probability;
        if reached && when_matches(s, &f.when) && fires {
            let kind = serde_json::to_value(f.fault).unwrap_or_default();
            return Some(match kind.as_str() {
                Some("segv") => segv(&f.phase),
                Some("abort") => signature(OutcomeKind::Signaled, Some("SIGABRT"), &f.phase),
                Some("hang") => hang(&f.phase),
                Some("exit0") => signature(OutcomeKind::FalseSuccess, None, &f.phase),
                _ => signature(OutcomeKind::Exited, None, &f.phase),
            });
        }
    }
    None
}

/// The default scenario with two stages of two blocks: 14 components.
fn roomy() -> Scenario {
    let model = crate::scenario::Model { depths: vec![2, 2], ..Default::default() };
    Scenario { name: "roomy".into(), model, ..Default::default() }
}

fn with_faults(mut s: Scenario, faults: Vec<serde_json::Value>) -> Scenario {
    s.inject = faults.into_iter().map(fault).collect();
    s
}

fn run(base: &Scenario, opts: &Options, decide: impl FnMut(&Scenario) -> Observation) -> (Outcome, usize) {
    let mut oracle = Scripted::new(decide);
    let outcome = bisect(base, &mut oracle, &mut Cache::new(), opts);
    assert_eq!(outcome.runs, oracle.runs, "the outcome counts the oracle's runs");
    (outcome, oracle.runs)
}

fn simulated(base: &Scenario, opts: &Options, seed: u64) -> (Outcome, usize) {
    let mut rng = Rng(seed.max(1));
    run(base, opts, move |s| simulate(s, &mut rng))
}

/// The value of a component in a scenario: `Some(true)` when it is at its original setting.
fn at_original(base: &Scenario, s: &Scenario, component: &Component) -> bool {
    match &component.kind {
        Kind::Ladder { sets } => sets.iter().all(|(field, _)| lookup(s, field) == lookup(base, field)),
        Kind::Toggle { field, .. } | Kind::Numeric { field, .. } => lookup(s, field) == lookup(base, field),
        Kind::Stage { index } => s.model.depths.len() > *index,
        Kind::StageDepth { index, from } => s.model.depths.get(*index).map(|d| u64::from(*d)) == Some(*from),
        Kind::Prefix { field, .. } | Kind::Choices { field, .. } => lookup(s, field) == lookup(base, field),
        Kind::Unset { name } => s.launch.env.get(name) == base.launch.env.get(name),
    }
}

/// Property: `outcome.minimal` reproduces under `decide`, and each component cut one step further
/// does not.
fn assert_one_minimal(base: &Scenario, outcome: &Outcome, mut decide: impl FnMut(&Scenario) -> Observation) {
    let Some(signature) = &outcome.signature else { panic!("nothing was bisected") };
    assert_eq!(
        decide(&outcome.minimal).as_ref(),
        Some(signature),
        "the minimal configuration must fail the same way"
    );
    for component in &outcome.components {
        let setting = outcome.assignment.get(&component.id).cloned().unwrap_or(Setting::Original);
        let Some(step) = component.step_down(&setting) else { continue };
        let mut further = outcome.assignment.clone();
        further.insert(component.id.clone(), step);
        let Ok(candidate) = apply(base, &outcome.components, &further) else { continue };
        if candidate == outcome.minimal {
            continue;
        }
        assert_ne!(
            decide(&candidate).as_ref(),
            Some(signature),
            "cutting `{}` one step further still fails: {:?}",
            component.id,
            describe_delta(&outcome.minimal, &candidate)
        );
    }
}

fn ids(components: &[Component]) -> Vec<&str> {
    components.iter().map(|c| c.id.as_str()).collect()
}

// ---------------------------------------------------------------------------------------------
// The search space

#[test]
fn derive_lists_every_cuttable_part_of_the_default_scenario() {
    let components = derive(&Scenario::default());
    assert_eq!(
        ids(&components),
        [
            "model.attention",
            "model.conditioning",
            "model.window",
            "model.stages[1]",
            "train.steps",
            "data.batch_size",
            "data.samples",
            "data.timesteps",
            "data.queries",
            "model.hidden",
            "model.heads",
            "model.mlp_ratio",
        ]
    );
    assert_eq!(components[0].kind, Kind::Toggle { field: "model.attention".into(), off: json!(false) });
    assert_eq!(components[3].kind, Kind::Stage { index: 1 });
    assert_eq!(components[4].kind, Kind::Numeric { field: "train.steps".into(), from: 200, min: 1 });
    assert_eq!(components[7].kind, Kind::Numeric { field: "data.timesteps".into(), from: 10, min: 2 });
    assert_eq!(components[9].kind, Kind::Numeric { field: "model.hidden".into(), from: 64, min: 4 });
    assert_eq!(components[10].kind, Kind::Numeric { field: "model.heads".into(), from: 4, min: 1 });
    assert!(components.len() >= 8);

    let roomy = derive(&roomy());
    assert_eq!(ids(&roomy)[3..6], ["model.stages[1]", "model.depths[0]", "model.depths[1]"]);
    assert_eq!(roomy[4].kind, Kind::StageDepth { index: 0, from: 2 });
}

#[test]
fn derive_puts_the_ladder_first_in_ladder_order() {
    let mut s = Scenario::default();
    s.launch.mode = crate::scenario::Mode::Ddp;
    s.launch.world_size = 4;
    s.launch.backend = crate::scenario::Backend::Tcp;
    s.launch.device = crate::scenario::Device::Cuda;
    s.data.workers = 2;
    s.data.cache = crate::scenario::Cache::Shm;
    s.data.shm_size = Some("64m".into());
    s.train.amp = true;
    s.train.accum_steps = 4;
    let components = derive(&s);
    assert_eq!(
        ids(&components)[..8],
        [
            "launch.mode",
            "launch.world_size",
            "data.workers",
            "data.start_method",
            "data.cache",
            "launch.device",
            "train.amp",
            "data.shm_size",
        ]
    );
    assert_eq!(
        components[0].kind,
        Kind::Ladder {
            sets: vec![
                ("launch.mode".into(), json!("single")),
                ("launch.world_size".into(), json!(1)),
                ("launch.backend".into(), json!("auto")),
            ]
        }
    );
    assert!(ids(&components).contains(&"train.accum_steps"));
    // `auto` runs on the CPU today: not a cut.
    s.launch.device = crate::scenario::Device::Auto;
    assert!(!ids(&derive(&s)).contains(&"launch.device"));
}

#[test]
fn a_multi_node_scenario_is_cut_to_one_node_first() {
    let mut s = Scenario::default();
    s.launch.mode = crate::scenario::Mode::Ddp;
    s.launch.world_size = 4;
    s.launch.nodes = 2;
    let components = derive(&s);
    assert_eq!(ids(&components)[..3], ["launch.nodes", "launch.mode", "launch.world_size"]);
    assert_eq!(components[0].kind, Kind::Ladder { sets: vec![("launch.nodes".into(), json!(1))] });
    // One rank cannot be spread over two nodes: the rank cuts take the nodes along.
    let one = apply(&s, &components, &[("launch.world_size".to_string(), Setting::Cut)].into()).unwrap();
    assert_eq!((one.launch.world_size, one.launch.nodes), (1, 1));
    let cut = apply(&s, &components, &[("launch.nodes".to_string(), Setting::Cut)].into()).unwrap();
    assert_eq!(describe_delta(&s, &cut), ["launch.nodes=1"]);
}

#[test]
fn derive_keeps_steps_above_the_last_per_step_fault() {
    let s = with_faults(roomy(), vec![json!({ "fault": "segv", "phase": "forward", "step": 3 })]);
    let steps = derive(&s).into_iter().find(|c| c.id == "train.steps").expect("train.steps");
    assert_eq!(steps.kind, Kind::Numeric { field: "train.steps".into(), from: 200, min: 4 });
    // A fault at a one-off phase ignores the step.
    let s = with_faults(roomy(), vec![json!({ "fault": "segv", "phase": "start", "step": 30 })]);
    let steps = derive(&s).into_iter().find(|c| c.id == "train.steps").expect("train.steps");
    assert_eq!(steps.kind, Kind::Numeric { field: "train.steps".into(), from: 200, min: 1 });
}

#[test]
fn apply_keeps_every_combination_of_cuts_valid() {
    let mut base = roomy();
    base.model.depths = vec![3, 2, 4];
    base.model.hidden = 48;
    base.model.heads = 6;
    base.train.accum_steps = 2;
    let base = with_faults(base, vec![json!({ "fault": "abort", "phase": "backward", "step": 5 })]);
    let components = derive(&base);
    let mut rng = Rng(7);
    for _ in 0..2000 {
        let assignment: Assignment = components
            .iter()
            .map(|c| {
                let setting = match (c.domain(), rng.unit()) {
                    (_, r) if r < 0.3 => Setting::Original,
                    (Some(domain), r) => Setting::Value(domain.value((r * domain.len() as f64) as usize)),
                    (None, _) => Setting::Cut,
                };
                (c.id.clone(), setting)
            })
            .collect();
        let candidate = apply(&base, &components, &assignment).expect("a valid candidate");
        assert_valid(&candidate);
        assert_eq!(candidate.model.hidden % candidate.model.heads, 0);
        assert_eq!(candidate.inject, base.inject, "faults are never cut");
        assert_eq!((&candidate.limits, &candidate.name), (&base.limits, &base.name));
    }
    let everything: Assignment = components.iter().map(|c| (c.id.clone(), c.cut_setting())).collect();
    let cut = apply(&base, &components, &everything).expect("everything cut is valid");
    assert_eq!(
        describe_delta(&base, &cut),
        [
            "model.attention=false",
            "model.conditioning=false",
            "model.depths=[1]",
            "model.heads=1",
            "model.hidden=6",
            "model.mlp_ratio=1",
            "model.window=0",
            "data.batch_size=1",
            "data.queries=1",
            "data.samples=1",
            "data.timesteps=2",
            "train.accum_steps=1",
            "train.steps=6",
        ]
    );
    assert!(apply(&base, &components, &Assignment::from([("nope".to_string(), Setting::Cut)])).is_err());
}

#[test]
fn heads_take_divisors_and_hidden_takes_multiples_of_the_original_heads() {
    let mut base = Scenario::default();
    base.model.hidden = 48;
    base.model.heads = 6;
    let components = derive(&base);
    let find = |id: &str| components.iter().find(|c| c.id == id).cloned().expect(id);
    let (heads, hidden) = (find("model.heads"), find("model.hidden"));
    assert_eq!(heads.step_down(&Setting::Original), Some(Setting::Value(3)));
    assert_eq!(heads.step_down(&Setting::Value(2)), Some(Setting::Value(1)));
    assert_eq!(heads.step_down(&Setting::Value(1)), None);
    assert_eq!(hidden.step_down(&Setting::Original), Some(Setting::Value(42)));
    assert_eq!(hidden.step_down(&Setting::Value(6)), None);
    let steps = find("train.steps");
    assert_eq!(steps.step_down(&Setting::Value(4)), Some(Setting::Value(3)));
}

#[test]
fn delta_reads_as_set_arguments_and_the_hash_ignores_only_names_and_expectations() {
    let base = Scenario::default();
    let mut other = base.clone();
    other.model.depths = vec![1];
    other.launch.mode = crate::scenario::Mode::Ddp;
    other.data.shm_size = Some("64m".into());
    other.train.steps = 4;
    assert_eq!(
        describe_delta(&base, &other),
        ["launch.mode=ddp", "model.depths=[1]", "data.shm_size=64m", "train.steps=4"]
    );
    assert!(describe_delta(&base, &base).is_empty());

    let hash = config_hash(&base);
    assert_eq!(hash.len(), 32);
    assert!(hash.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    let mut renamed = base.clone();
    renamed.name = "other".into();
    renamed.description = "words".into();
    renamed.expect.outcome = OutcomeKind::Hung;
    assert_eq!(config_hash(&renamed), hash);
    let mut limited = base.clone();
    limited.limits.timeout_s = 5.0;
    assert_ne!(config_hash(&limited), hash);
    let faulty = with_faults(base.clone(), vec![json!({ "fault": "segv", "phase": "start" })]);
    assert_ne!(config_hash(&faulty), hash);
    let flaky =
        with_faults(base.clone(), vec![json!({ "fault": "segv", "phase": "start", "probability": 0.5 })]);
    assert_ne!(config_hash(&flaky), config_hash(&faulty));
    // Pinned, so that a persisted cache keeps working across builds.
    assert_eq!(config_hash(&base), config_hash(&Scenario::default()));
}

// ---------------------------------------------------------------------------------------------
// The search

/// The probes a binary search over a numeric component's values can take (0 for on/off ones).
fn halving_cost(component: &Component) -> usize {
    component.domain().map_or(0, |d| d.len().next_power_of_two().trailing_zeros() as usize)
}

#[test]
fn a_single_cause_is_found_within_twelve_runs_whichever_component_it_is() {
    let base = roomy();
    let components = derive(&base);
    assert_eq!(components.len(), 14);
    let (mut worst_on_off, mut worst_numeric) = (0, 0);
    for confirm_runs in [3, 1] {
        let opts = Options { confirm_runs, ..Options::default() };
        for cause in &components {
            let fails = |s: &Scenario| at_original(&base, s, cause).then(|| segv("forward"));
            let (outcome, runs) = run(&base, &opts, fails);
            // A numeric cause that fails only at its original value also pays a full halving.
            let bound = 12 - (3 - confirm_runs) + halving_cost(cause);
            assert!(runs <= bound, "`{}`, confirm {confirm_runs}: {runs} runs", cause.id);
            if confirm_runs == 3 {
                if cause.is_numeric() {
                    worst_numeric = worst_numeric.max(runs);
                } else {
                    worst_on_off = worst_on_off.max(runs);
                }
            }
            assert!(!outcome.budget_exhausted);
            assert_eq!(outcome.signature, Some(segv("forward")));
            assert_eq!(outcome.failure_rate, 1.0);
            assert!(!outcome.flaky);
            assert_eq!(outcome.confidence, 1.0);
            // Everything else is cut as far as it goes.
            for other in &components {
                let setting = &outcome.assignment[&other.id];
                let stage_of_cause = matches!(
                    (&cause.kind, &other.kind),
                    (Kind::StageDepth { index, .. }, Kind::Stage { index: stage }) if index == stage
                );
                let kept = other.id == cause.id || stage_of_cause;
                assert_eq!(!other.is_at_minimum(setting), kept, "cause `{}`, `{}`", cause.id, other.id);
            }
            assert_one_minimal(&base, &outcome, fails);
        }
    }
    eprintln!(
        "single cause among {} components, confirm 3: on/off at most {worst_on_off} runs, numeric at its original value at most {worst_numeric}",
        components.len()
    );
}

#[test]
fn a_fault_that_needs_conditioning_is_cut_down_to_conditioning() {
    let base = with_faults(
        roomy(),
        vec![
            json!({ "fault": "segv", "phase": "model.build/conditioner", "when": { "model.conditioning": true } }),
        ],
    );
    let (outcome, runs) = simulated(&base, &Options::default(), 1);
    assert!(runs <= 12, "{runs} runs");
    assert_eq!(outcome.signature, Some(segv("model.build/conditioner")));
    assert!(outcome.minimal.model.conditioning);
    assert_eq!(outcome.minimal.model.depths, [1]);
    assert_eq!(
        outcome.minimal_delta,
        [
            "model.attention=false",
            "model.depths=[1]",
            "model.heads=1",
            "model.hidden=4",
            "model.mlp_ratio=1",
            "model.window=0",
            "data.batch_size=1",
            "data.queries=1",
            "data.samples=1",
            "data.timesteps=2",
            "train.steps=1",
        ]
    );
    assert_eq!(
        outcome.boundary,
        [BoundaryEntry {
            component: "model.conditioning".into(),
            cut: "model.conditioning=false".into(),
            passes: true,
            runs: 1,
        }]
    );
    assert_eq!(outcome.probes[0].phase, "confirm");
    assert!(outcome.probes.iter().all(|p| !p.cached));
    eprintln!("segv needs conditioning: {runs} runs");
}

#[test]
fn a_two_component_interaction_is_found_within_twenty_five_runs_for_every_pair() {
    let base = roomy();
    let components = derive(&base);
    let (mut worst, mut worst_numeric) = (0, 0);
    for (i, a) in components.iter().enumerate() {
        for b in &components[i + 1..] {
            let fails = |s: &Scenario| {
                (at_original(&base, s, a) && at_original(&base, s, b)).then(|| segv("forward"))
            };
            let (outcome, runs) = run(&base, &Options::default(), fails);
            if a.is_numeric() || b.is_numeric() {
                worst_numeric = worst_numeric.max(runs);
            } else {
                worst = worst.max(runs);
            }
            let bound = 25 + halving_cost(a) + halving_cost(b);
            assert!(runs <= bound, "`{}` + `{}`: {runs} runs", a.id, b.id);
            assert!(!outcome.budget_exhausted, "`{}` + `{}`", a.id, b.id);
            assert!(!a.is_at_minimum(&outcome.assignment[&a.id]));
            assert!(!b.is_at_minimum(&outcome.assignment[&b.id]));
            assert_one_minimal(&base, &outcome, fails);
        }
    }
    eprintln!(
        "two-component interaction among {} components: on/off pairs at most {worst} runs, pairs with a numeric at its original value at most {worst_numeric}",
        components.len()
    );
}

#[test]
fn an_interaction_written_as_a_fault_condition_keeps_both_features() {
    let base = with_faults(
        roomy(),
        vec![json!({
            "fault": "abort", "phase": "backward", "step": 0,
            "when": { "model.conditioning": true, "model.attention": true }
        })],
    );
    let (outcome, runs) = simulated(&base, &Options::default(), 1);
    assert!(runs <= 25, "{runs} runs");
    assert!(outcome.minimal.model.conditioning && outcome.minimal.model.attention);
    let boundary: Vec<&str> = outcome.boundary.iter().map(|b| b.cut.as_str()).collect();
    assert_eq!(boundary, ["model.attention=false", "model.conditioning=false"]);
    eprintln!("attention × conditioning: {runs} runs");
}

#[test]
fn a_stage_depth_threshold_is_cut_to_exactly_the_threshold() {
    let mut base = Scenario::default();
    base.model.depths = vec![4, 3];
    let fails = |s: &Scenario| s.model.depths.iter().any(|d| *d >= 2).then(|| segv("forward"));
    let (outcome, runs) = run(&base, &Options::default(), fails);
    let mut depths = outcome.minimal.model.depths.clone();
    depths.sort_unstable();
    assert_eq!(*depths.last().expect("a stage"), 2, "{:?}", outcome.minimal.model.depths);
    assert!(depths.iter().rev().skip(1).all(|d| *d == 1), "{:?}", outcome.minimal.model.depths);
    assert!(outcome.boundary.iter().any(|b| b.cut.starts_with("model.depths=") && b.passes));
    assert_one_minimal(&base, &outcome, fails);
    eprintln!("stage depth ≥ 2 from [4, 3]: {runs} runs, ended at {:?}", outcome.minimal.model.depths);
}

#[test]
fn a_step_threshold_is_cut_to_exactly_the_step_after_the_fault() {
    // Scripted: the fault at step 3 fires only when a fourth step runs.
    let base = roomy();
    let fails = |s: &Scenario| (s.train.steps >= 4).then(|| segv("forward"));
    let (outcome, runs) = run(&base, &Options::default(), fails);
    assert_eq!(outcome.minimal.train.steps, 4);
    assert!(outcome.boundary.contains(&BoundaryEntry {
        component: "train.steps".into(),
        cut: "train.steps=3".into(),
        passes: true,
        runs: 1,
    }));
    assert_one_minimal(&base, &outcome, fails);
    eprintln!("train.steps ≥ 4: {runs} runs");

    // Written as a real fault, validation itself keeps the steps at 4 or more.
    let base = with_faults(roomy(), vec![json!({ "fault": "segv", "phase": "forward", "step": 3 })]);
    let (outcome, runs) = simulated(&base, &Options::default(), 1);
    assert_eq!(outcome.minimal.train.steps, 4);
    assert!(outcome.boundary.is_empty(), "{:?}", outcome.boundary);
    assert!(runs <= 6, "{runs} runs");
}

#[test]
fn a_cut_that_fails_differently_is_reported_and_not_taken() {
    let base = roomy();
    // A segfault that needs conditioning; without attention the run hangs instead.
    let fails = |s: &Scenario| {
        if !s.model.attention {
            return Some(hang("data.next"));
        }
        s.model.conditioning.then(|| segv("forward"))
    };
    let (outcome, runs) = run(&base, &Options::default(), fails);
    assert_eq!(outcome.signature, Some(segv("forward")));
    assert!(outcome.minimal.model.attention && outcome.minimal.model.conditioning);
    assert!(outcome.boundary.contains(&BoundaryEntry {
        component: "model.attention".into(),
        cut: "model.attention=false".into(),
        passes: false,
        runs: 1,
    }));
    assert!(outcome.different_failures.iter().any(|(delta, sig)| {
        *sig == hang("data.next") && delta.contains(&"model.attention=false".to_string())
    }));
    assert!(outcome.probes.iter().any(|p| p.verdict == ProbeVerdict::Different));
    assert_one_minimal(&base, &outcome, fails);
    eprintln!("different failure on a cut: {runs} runs");
}

#[test]
fn a_flaky_fault_is_found_with_its_rate_and_the_stated_confidence() {
    let base = with_faults(
        roomy(),
        vec![json!({
            "fault": "segv", "phase": "forward", "step": 0, "probability": 0.5,
            "when": { "model.conditioning": true }
        })],
    );
    for confirm_runs in [3, 6] {
        let opts = Options { budget: 80, confidence: 0.95, confirm_runs, ..Options::default() };
        let (mut found, mut most, mut rates) = (0, 0, Vec::new());
        for seed in 1..=40 {
            let (outcome, runs) = simulated(&base, &opts, seed);
            most = most.max(runs);
            let Some(signature) = &outcome.signature else { continue };
            assert_eq!(*signature, segv("forward"));
            rates.push(outcome.failure_rate);
            let ok = outcome.minimal.model.conditioning
                && outcome.minimal.model.depths == [1]
                && !outcome.minimal.model.attention
                && outcome.flaky
                && outcome.confidence >= 0.95
                && !outcome.budget_exhausted;
            if !ok {
                eprintln!(
                    "seed {seed}: {runs} runs, rate {:.2}, confidence {:.3}, exhausted {}, delta {:?}, boundary {:?}",
                    outcome.failure_rate,
                    outcome.confidence,
                    outcome.budget_exhausted,
                    outcome.minimal_delta,
                    outcome.boundary
                );
            }
            if outcome.minimal.model.conditioning
                && outcome.minimal.model.depths == [1]
                && !outcome.minimal.model.attention
                && outcome.flaky
                && outcome.confidence >= 0.95
                && !outcome.budget_exhausted
            {
                found += 1;
                let pass = &outcome.boundary[0];
                assert_eq!(pass.component, "model.conditioning");
                assert!(pass.passes, "{pass:?}");
            }
        }
        let mean = rates.iter().sum::<f64>() / rates.len() as f64;
        eprintln!(
            "p = 0.5, confirm {confirm_runs}: cause found with confidence ≥ 0.95 in {found}/40 seeds, at most {most} runs, mean rate {mean:.2}"
        );
        // The misses are the runs of bad luck confirm cannot see through: all its runs passing
        // (nothing to bisect, p^k) or all failing (taken as deterministic at first).
        assert!(found >= 32, "found in {found}/40");
        assert!((0.35..=0.65).contains(&mean), "mean failure rate {mean}");
        assert!(most <= 80);
    }
}

#[test]
fn a_pass_of_a_flaky_failure_needs_the_runs_its_rate_asks_for() {
    // Every other run with conditioning fails: confirm sees 4 of 8, p = 0.5. From 8 runs the
    // Wilson low end is 1/3, so a pass needs ⌈ln 0.05 / ln (2/3)⌉ = 8 runs, asked for as 1, 2, 4, 1.
    let base = roomy();
    let mut seen = 0;
    let mut oracle = Scripted::new(move |s: &Scenario| {
        if !s.model.conditioning {
            return None;
        }
        seen += 1;
        (seen % 2 == 1).then(|| segv("forward"))
    });
    let opts = Options { budget: 16, confidence: 0.95, confirm_runs: 8, ..Options::default() };
    let outcome = bisect(&base, &mut oracle, &mut Cache::new(), &opts);
    assert_eq!(outcome.failure_rate, 0.5);
    assert!(outcome.flaky);
    assert_eq!(oracle.batches, [8, 1, 2, 4, 1]);
    let everything_cut: Vec<&Probe> = outcome.probes.iter().filter(|p| p.phase == "ddmin").collect();
    assert_eq!(everything_cut.len(), 8);
    assert!(everything_cut.iter().all(|p| p.verdict == ProbeVerdict::Passed));
    // Nothing left for the halves.
    assert!(outcome.budget_exhausted);
    assert_eq!(outcome.minimal, base);
    assert_eq!(outcome.unknown.len(), derive(&base).len());
}

#[test]
fn a_spent_budget_returns_the_best_failing_configuration_and_what_is_undecided() {
    let base = roomy();
    let fails = |s: &Scenario| (s.model.conditioning && s.model.attention).then(|| segv("forward"));
    let opts = Options { budget: 7, ..Options::default() };
    let (outcome, runs) = run(&base, &opts, fails);
    assert_eq!(runs, 7);
    assert!(outcome.budget_exhausted);
    assert!(!outcome.unknown.is_empty());
    assert!(outcome.unknown.iter().any(|id| id == "model.conditioning"), "{:?}", outcome.unknown);
    assert!(fails(&outcome.minimal).is_some(), "the returned configuration was seen failing");
    assert!(outcome.minimal_delta.len() < derive(&base).len());

    // Not even enough for confirm.
    let opts = Options { budget: 2, ..Options::default() };
    let (outcome, runs) = run(&base, &opts, fails);
    assert_eq!(runs, 2);
    assert!(outcome.budget_exhausted);
    assert_eq!(outcome.minimal, base);
}

#[test]
fn a_second_bisect_with_the_same_cache_runs_nothing() {
    let base = with_faults(
        roomy(),
        vec![
            json!({ "fault": "hang", "phase": "optimizer", "step": 2, "when": { "model.depths": [[2, 2], [2, 1]] } }),
        ],
    );
    let mut cache = Cache::new();
    let mut rng = Rng(3);
    let mut first = Scripted::new(|s: &Scenario| simulate(s, &mut rng));
    let before = bisect(&base, &mut first, &mut cache, &Options::default());
    assert!(before.runs > 0);
    assert_eq!(before.minimal.model.depths, [2, 1]);

    // Persisted and read back, as between two invocations.
    let text = serde_json::to_string(&cache).expect("serialisable");
    let mut cache: Cache = serde_json::from_str(&text).expect("deserialisable");
    let mut second = Scripted::new(|_: &Scenario| -> Observation { panic!("nothing should run") });
    let after = bisect(&base, &mut second, &mut cache, &Options::default());
    assert_eq!(after.runs, 0);
    assert_eq!(second.runs, 0);
    assert_eq!(after.minimal, before.minimal);
    assert_eq!(after.boundary, before.boundary);
    assert!(after.probes.iter().all(|p| p.cached));
    assert_eq!(after.probes.len(), before.probes.len());
}

#[test]
fn an_original_that_passes_has_nothing_to_bisect() {
    let base = roomy();
    let (outcome, runs) = run(&base, &Options { confirm_runs: 2, ..Options::default() }, |_| None);
    assert_eq!(runs, 2);
    assert_eq!(outcome.signature, None);
    assert_eq!(outcome.minimal, base);
    assert!(outcome.boundary.is_empty() && !outcome.budget_exhausted);
    assert_eq!(outcome.probes.len(), 2);
    assert!(outcome.probes.iter().all(|p| p.verdict == ProbeVerdict::Passed && p.phase == "confirm"));
}

#[test]
fn the_most_common_failure_of_confirm_is_the_one_bisected() {
    let base = roomy();
    let mut seen = 0;
    let fails = move |s: &Scenario| {
        seen += 1;
        if seen == 1 {
            return Some(hang("forward"));
        }
        s.model.conditioning.then(|| segv("forward"))
    };
    let (outcome, _) = run(&base, &Options::default(), fails);
    assert_eq!(outcome.signature, Some(segv("forward")));
    assert!((outcome.failure_rate - 2.0 / 3.0).abs() < 0.2, "{}", outcome.failure_rate);
}

#[test]
fn independent_probes_are_batched() {
    let base = roomy();
    let mut oracle =
        Scripted::new(|s: &Scenario| (s.model.conditioning && s.data.samples >= 8).then(|| segv("forward")));
    let outcome = bisect(&base, &mut oracle, &mut Cache::new(), &Options::default());
    assert_eq!(outcome.minimal.data.samples, 8);
    // Confirm repeats in one call, then both halves of each split together, then the
    // 1-minimality checks (conditioning and samples) together.
    assert_eq!(oracle.batches[0], 3);
    assert!(oracle.batches.contains(&2));
    let verify = outcome.probes.iter().filter(|p| p.phase == "verify" && !p.cached).count();
    assert_eq!(oracle.batches.last().copied(), Some(verify));
}

#[test]
fn the_ladder_takes_big_cuts_that_keep_the_failure_and_leaves_the_others() {
    let mut base = roomy();
    base.launch.mode = crate::scenario::Mode::Ddp;
    base.launch.world_size = 4;
    base.launch.device = crate::scenario::Device::Cuda;
    base.data.workers = 2;
    base.train.amp = true;
    let base = with_faults(
        base,
        vec![json!({ "fault": "segv", "phase": "data.next", "step": 1, "when": { "data.workers": 2 } })],
    );
    let (outcome, runs) = simulated(&base, &Options::default(), 1);
    let ladder: Vec<&Probe> = outcome.probes.iter().filter(|p| p.phase == "ladder").collect();
    // mode → single, workers → 0 (passes: not taken), start method → spawn, device → cpu, amp off.
    assert_eq!(ladder.len(), 5, "{:#?}", ladder.iter().map(|p| &p.delta).collect::<Vec<_>>());
    assert_eq!(outcome.minimal.launch.mode, crate::scenario::Mode::Single);
    assert_eq!(outcome.minimal.launch.world_size, 1);
    assert_eq!(outcome.minimal.data.workers, 2);
    assert_eq!(outcome.minimal.launch.device, crate::scenario::Device::Cpu);
    assert!(!outcome.minimal.train.amp);
    assert!(
        outcome
            .boundary
            .iter()
            .any(|b| b.component == "data.workers" && b.cut == "data.workers=0" && b.passes)
    );
    assert!(runs <= 20, "{runs} runs");
    eprintln!("ladder case: {runs} runs");
}

#[test]
fn without_the_ladder_big_cuts_are_delta_debugged_to_the_same_minimal_configuration() {
    let mut base = roomy();
    base.launch.mode = crate::scenario::Mode::Ddp;
    base.launch.world_size = 4;
    base.data.workers = 2;
    let base = with_faults(
        base,
        vec![json!({ "fault": "segv", "phase": "data.next", "step": 1, "when": { "data.workers": 2 } })],
    );
    let decide = |s: &Scenario| simulate(s, &mut Rng(1));
    let (laddered, _) = simulated(&base, &Options::default(), 1);
    let opts = Options { strategy: Strategy::Ddmin, ..Options::default() };
    let (plain, _) = simulated(&base, &opts, 1);
    assert!(plain.probes.iter().all(|p| p.phase != "ladder"), "no ladder probes without the ladder");
    assert!(laddered.probes.iter().any(|p| p.phase == "ladder"));
    assert_eq!(plain.minimal, laddered.minimal);
    assert_eq!(plain.minimal.launch.mode, crate::scenario::Mode::Single);
    assert_eq!(plain.minimal.data.workers, 2);
    assert_one_minimal(&base, &plain, decide);
}

#[test]
fn the_outcome_serialises_for_the_report() {
    let base = roomy();
    let (outcome, _) = run(&base, &Options::default(), |s| s.model.conditioning.then(|| segv("forward")));
    let value = serde_json::to_value(&outcome).expect("serialisable");
    assert_eq!(value["probes"][0]["verdict"], json!("same"));
    assert_eq!(value["probes"][0]["phase"], json!("confirm"));
    assert_eq!(value["components"][0]["kind"]["type"], json!("toggle"));
    assert_eq!(value["boundary"][0]["passes"], json!(true));
}

// ---------------------------------------------------------------------------------------------
// External commands: bisect over `params`

/// A torchrun-launched program with the knobs of a typical training script.
fn external(params: serde_json::Value) -> Scenario {
    let names: Vec<String> =
        params.as_object().expect("an object").keys().map(|k| format!("--{k}={{{k}}}")).collect();
    let mut command = vec!["python".to_string(), "train.py".to_string()];
    command.extend(names);
    serde_json::from_value(json!({
        "name": "external",
        "launch": { "world_size": 2 },
        "command": command,
        "params": params,
    }))
    .expect("a scenario with a command")
}

/// The param `name` of a candidate, as JSON (bare, whatever form the original used).
fn param(s: &Scenario, name: &str) -> serde_json::Value {
    s.params.get(name).map(|p| p.value.to_json()).unwrap_or_default()
}

#[test]
fn params_become_components_by_their_type_and_their_own_cuts() {
    let s = external(json!({
        "pin_memory": true,
        "amp": false,
        "workers": 4,
        "batch": { "value": 64, "min": 8 },
        "depths": [2, 2, 6],
        "precision": { "value": "bf16", "cuts": ["fp32"] },
        "prefetch": { "value": 8, "cuts": [8, 4, 1, 0] },
        "lr": 0.5,
        "negative": -3,
    }));
    let components = derive(&s);
    assert_eq!(
        ids(&components),
        [
            "launch.world_size",
            "params.batch",
            "params.depths",
            "params.pin_memory",
            "params.precision",
            "params.prefetch",
            "params.workers",
        ],
        "the built-in trainer's fields are no components of a command; off booleans, plain floats \
         and negative numbers are left alone"
    );
    let kind = |id: &str| components.iter().find(|c| c.id == id).map(|c| c.kind.clone()).unwrap();
    assert_eq!(kind("params.batch"), Kind::Numeric { field: "params.batch".into(), from: 64, min: 8 });
    assert_eq!(kind("params.workers"), Kind::Numeric { field: "params.workers".into(), from: 4, min: 0 });
    assert_eq!(
        kind("params.pin_memory"),
        Kind::Toggle { field: "params.pin_memory".into(), off: json!(false) }
    );
    assert_eq!(
        kind("params.prefetch"),
        Kind::Choices {
            field: "params.prefetch".into(),
            values: vec![json!(8), json!(4), json!(1), json!(0)]
        }
    );

    // Each cut, alone, writes the param's cut value; the rest keep theirs.
    let cut = |id: &str, setting: Setting| {
        let candidate = apply(&s, &components, &Assignment::from([(id.to_string(), setting)])).unwrap();
        assert_valid(&candidate);
        candidate
    };
    let all_cut = |id: &str| cut(id, components.iter().find(|c| c.id == id).unwrap().cut_setting());
    assert_eq!(param(&all_cut("params.depths"), "depths"), json!([2]));
    assert_eq!(param(&cut("params.depths", Setting::Value(2)), "depths"), json!([2, 2]));
    assert_eq!(param(&all_cut("params.prefetch"), "prefetch"), json!(0));
    assert_eq!(param(&cut("params.prefetch", Setting::Value(2)), "prefetch"), json!(4));
    assert_eq!(param(&all_cut("params.precision"), "precision"), json!("fp32"));
    assert_eq!(param(&all_cut("params.batch"), "batch"), json!(8));
    let one_rank = all_cut("launch.world_size");
    assert_eq!((one_rank.launch.world_size, param(&one_rank, "batch")), (1, json!(64)));
    assert_eq!(
        describe_delta(&s, &all_cut("params.pin_memory")),
        ["params.pin_memory=false"],
        "a delta reads as a --set argument"
    );
}

#[test]
fn a_failure_that_needs_workers_and_pinned_memory_is_cut_to_exactly_those() {
    // The program fails only when it has loader workers and pins memory, whatever else it does.
    let s = external(json!({
        "pin_memory": true,
        "workers": 8,
        "persistent_workers": true,
        "depths": [2, 2],
        "batch": { "value": 32, "min": 1 },
        "compile": true,
    }));
    let decide = |c: &Scenario| {
        let workers = param(c, "workers").as_u64().unwrap_or(0);
        (workers > 0 && param(c, "pin_memory") == json!(true)).then(|| segv("data.next"))
    };
    let (outcome, runs) = run(&s, &Options::default(), decide);
    assert_one_minimal(&s, &outcome, decide);
    assert_eq!(
        outcome.minimal_delta,
        [
            "launch.world_size=1",
            "params.batch=1",
            "params.compile=false",
            "params.depths=[2]",
            "params.persistent_workers=false",
            "params.workers=1"
        ]
    );
    let boundary: Vec<&str> = outcome.boundary.iter().map(|b| b.cut.as_str()).collect();
    assert_eq!(boundary, ["params.pin_memory=false", "params.workers=0"]);
    assert!(runs <= 25, "{runs} runs");
}

#[test]
fn a_commands_variables_are_unset_one_by_one_and_a_kept_one_is_never_touched() {
    // The program fails only while `KERNEL=fast` is set and it has workers.
    let mut s = external(json!({"workers": 4}));
    s.launch.env = [("KERNEL", "fast"), ("OMP_NUM_THREADS", "1"), ("TRAIN_LOG", "debug")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let ids: Vec<String> = derive(&s).into_iter().map(|c| c.id).collect();
    assert_eq!(
        ids,
        [
            "launch.world_size",
            "params.workers",
            "launch.env.KERNEL",
            "launch.env.OMP_NUM_THREADS",
            "launch.env.TRAIN_LOG"
        ]
    );
    let decide = |c: &Scenario| {
        let workers = param(c, "workers").as_u64().unwrap_or(0);
        (workers > 0 && c.launch.env.get("KERNEL").is_some_and(|v| v == "fast")).then(|| segv("data.next"))
    };
    let (outcome, _) = run(&s, &Options::default(), decide);
    assert_one_minimal(&s, &outcome, decide);
    assert_eq!(
        outcome.minimal.launch.env.keys().collect::<Vec<_>>(),
        ["KERNEL"],
        "{:?}",
        outcome.minimal_delta
    );
    assert!(
        outcome.minimal_delta.contains(&"launch.env.TRAIN_LOG=null".to_string()),
        "{:?}",
        outcome.minimal_delta
    );
    let boundary: Vec<&str> = outcome.boundary.iter().map(|b| b.cut.as_str()).collect();
    assert_eq!(boundary, ["params.workers=0", "launch.env.KERNEL=null"]);

    let keep = Options { keep: vec!["launch.env.TRAIN_LOG".into()], ..Options::default() };
    let (kept, _) = run(&s, &keep, decide);
    assert_eq!(kept.minimal.launch.env.keys().collect::<Vec<_>>(), ["KERNEL", "TRAIN_LOG"]);
    assert!(!kept.components.iter().any(|c| c.id == "launch.env.TRAIN_LOG"));
}

#[test]
fn a_saved_external_scenario_leaves_out_the_built_in_trainers_fields_and_loads_back() {
    let s = external(json!({"workers": 2}));
    let saved: serde_json::Value = serde_json::from_str(&s.file_json()).unwrap();
    assert!(["model", "data", "train"].iter().all(|k| saved.get(k).is_none()), "{saved:#}");
    assert_eq!(saved["launch"], json!({"world_size": 2}));
    let back: Scenario = serde_json::from_value(saved).unwrap();
    assert_eq!(back, s);
    let whole = Scenario::default().file_json();
    assert!(
        whole.starts_with("{\n  \"name\"") && whole.contains("\"model\""),
        "built-in scenarios stay whole"
    );
}

#[test]
fn a_list_written_as_separate_words_keeps_fewer_words_and_stays_separate() {
    let s: Scenario = serde_json::from_value(json!({
        "name": "words",
        "command": ["python", "t.py", "--gpus", "{gpus}", "--steps", "{steps}"],
        "params": {"gpus": {"value": [0, 1, 2], "words": true}, "steps": 4},
    }))
    .unwrap();
    let components = derive(&s);
    assert_eq!(ids(&components), ["params.gpus", "params.steps"]);
    let gpus = components.iter().find(|c| c.id == "params.gpus").unwrap();
    let keep = |n: u64| {
        let candidate =
            apply(&s, &components, &Assignment::from([("params.gpus".to_string(), Setting::Value(n))]))
                .unwrap();
        assert_valid(&candidate);
        candidate
    };
    let argv = |c: &Scenario| crate::harness::plan::command::argv(c, std::path::Path::new("/"), 0);
    assert_eq!(argv(&keep(2)), ["python", "t.py", "--gpus", "0", "1", "--steps", "4"]);
    let cut = apply(&s, &components, &Assignment::from([(gpus.id.clone(), gpus.cut_setting())])).unwrap();
    assert_eq!(argv(&cut), ["python", "t.py", "--gpus", "0", "--steps", "4"]);
    assert!(cut.params["gpus"].words, "the cut list is still written as words");
    assert_eq!(describe_delta(&s, &keep(2)), ["params.gpus=[0,1]"], "a delta names the param, not its parts");
}
