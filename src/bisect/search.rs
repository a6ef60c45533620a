//! The search: from a failing scenario to a 1-minimal configuration that still fails the same
//! way, through an [`Oracle`] that runs candidates. No processes, no IO here.
//!
//! Theory of operation (DESIGN decision 11):
//!
//! 1. **Confirm.** The original runs `confirm_runs` times. The most common failing
//!    [`Signature`] is *the* failure; a configuration that has shown it at least once
//!    "reproduces". The failure rate `p` is estimated over every run of every configuration that
//!    reproduced (the original included) and is re-estimated as runs come in.
//! 2. **Judging a candidate.** It reproduces as soon as one run shows the signature. It passes
//!    only after `n = ⌈ln(1 − confidence) / ln(1 − p)⌉` runs without it (`p = 1` → 1 run;
//!    `p = 0.5` at 95 % → 5). A failure never seen to pass has `p = 1`; once one is, `p` is the
//!    lower end of its Wilson interval (one standard error), never below `1 / (runs + 1)`, so that
//!    a rate known from few runs asks for more passes and `n` stays finite. A run that fails with
//!    another signature makes the candidate "different": the cut is not taken and the failure is
//!    reported. Repeats of one candidate are asked for in growing batches (1, 2, 4, …), so a
//!    reproduction stops the spending early and a pass needs few round trips.
//! 3. **Ladder.** Each big cut (mode → single, world → 1, workers → 0, …) is tried alone on top of
//!    what has been cut so far, in ladder order, and kept if it reproduces.
//! 4. **Delta debugging** over the other components, "cut" meaning off, removed or at the minimum.
//!    Everything cut is tried first (a failure that needs none of them ends the search at once).
//!    Then the set of components that must stay is isolated by Zeller's `dd` recursion: split the
//!    candidates in two halves and run "keep only this half" for both halves in one batch; follow
//!    a half that reproduces; when neither does, the cause spans both (interference), so minimise
//!    the first half while keeping the second, then the second while keeping what the first
//!    needed. Every configuration it ends on has been seen to fail. This costs about
//!    `2·⌈log₂ n⌉` runs for one cause among `n` components and about twice that per extra
//!    component of an interaction, where complement-based `ddmin` spends `O(n)` per level.
//!    Neither half reproducing is also how a flaky failure that failed every confirm run looks,
//!    so while the failure is believed deterministic the configuration both came from runs a
//!    second time; a pass there makes it flaky and the halves are judged again.
//! 5. **Halving.** Each numeric component that had to stay is binary-searched for the smallest
//!    value that still fails ("only with 2+ blocks in a stage" ends at exactly 2).
//! 6. **Verify 1-minimality.** Every component not at its minimum is moved one step further down
//!    (one batch); all must pass or fail differently. One that still reproduces is taken (a
//!    numeric one is halved again) and verification starts over.
//!
//! The budget counts real runs (the confirm runs included); observations already in the
//! [`Cache`] count toward every judgement but cost nothing. When the budget runs out the search
//! stops and returns the smallest configuration seen failing, with the undecided components.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use super::signature::{Observation, Signature};
use super::space::{Assignment, Component, Kind, Setting, apply, config_hash, derive};
use crate::scenario::Scenario;
use crate::scenario::describe_delta;

/// Runs candidate scenarios. The product runs real processes; tests script outcomes.
pub trait Oracle {
    /// Runs each candidate once and returns one observation per candidate, in order. May run them
    /// in parallel: the search batches independent probes (both halves of a split, the
    /// 1-minimality checks, repeats of one candidate) into one call. Returns fewer (a prefix)
    /// when it had to stop (the user interrupted, a probe could not be run): the search then
    /// issues no more probes, and the runs it got no answer for are neither counted nor cached.
    fn run(&mut self, candidates: &[Scenario]) -> Vec<Observation>;
}

/// How far the search may go and what it must be sure of.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// The most real runs, the confirm runs included.
    pub budget: usize,
    /// How sure a "passes" must be, for a flaky failure (0.95: a 5 % chance that a cut that
    /// still fails was judged to pass).
    pub confidence: f64,
    /// Runs of the original scenario before searching, to pick the signature and estimate how
    /// flaky it is. Honoured exactly (observations already in the cache count).
    pub confirm_runs: usize,
    /// Whether big cuts go first on a ladder (the product) or join delta debugging (to measure
    /// what the ladder saves; bench/).
    pub strategy: Strategy,
    /// Ids of components the user asked to keep as they are (`--keep NAME` of an `--env`
    /// variable): never cut.
    pub keep: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            budget: 60,
            confidence: 0.95,
            confirm_runs: 3,
            strategy: Strategy::Ladder,
            keep: Vec::new(),
        }
    }
}

/// How the big cuts (mode, world size, workers, …) are searched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Strategy {
    /// Each alone, first, in ladder order; then delta debugging over the rest.
    #[default]
    Ladder,
    /// No ladder: they are components of delta debugging like any on/off feature.
    Ddmin,
}

/// One observation the search used, in the order it was made or found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Probe {
    /// The candidate relative to the original ([`describe_delta`]).
    pub delta: Vec<String>,
    /// The candidate's [`config_hash`].
    pub hash: String,
    pub observation: Observation,
    /// The observation compared with the failure being bisected.
    pub verdict: ProbeVerdict,
    /// `confirm`, `ladder`, `ddmin`, `halving` or `verify`.
    pub phase: &'static str,
    /// Taken from the cache handed in, not run by this search.
    pub cached: bool,
}

/// One observation compared with the failure being bisected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeVerdict {
    /// The same signature: the candidate reproduces.
    Same,
    /// The run passed.
    Passed,
    /// It failed with another signature.
    Different,
}

/// A component of the minimal configuration and what cutting it one step further did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BoundaryEntry {
    /// The component's id (`model.conditioning`).
    pub component: String,
    /// The cut that was tried, relative to the minimal configuration (`train.steps=3`).
    pub cut: String,
    /// `true`: it passed (as often as the confidence needs); `false`: it failed differently.
    pub passes: bool,
    /// The runs this judgement rests on (cached ones included).
    pub runs: usize,
}

/// What the search found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    /// The failure bisected; `None` when the original did not fail in confirm (nothing to do).
    pub signature: Option<Signature>,
    /// Share of runs that showed the signature, over every configuration that reproduced it
    /// (and every one that keeps at least all of such a configuration); 0 with no signature.
    pub failure_rate: f64,
    /// `failure_rate` is below 1: a configuration that reproduces has also passed.
    pub flaky: bool,
    /// Real runs made (cached observations not counted).
    pub runs: usize,
    /// The smallest configuration seen failing with the signature (the original when nothing
    /// was cut).
    pub minimal: Scenario,
    /// `minimal` relative to the original.
    pub minimal_delta: Vec<String>,
    /// Every component still present in `minimal` with what cutting it one step further did:
    /// each passes (or fails differently), which is what makes `minimal` 1-minimal.
    pub boundary: Vec<BoundaryEntry>,
    /// The joint confidence of the "passes" of `boundary`: the product over them of
    /// `1 − (1 − p)^runs`, with the failure rate pass judgements assume (1 for a deterministic
    /// failure, else the low estimate described in the module documentation); 1 with no such
    /// claim, 0 with no signature. At least the requested confidence when the search completed.
    pub confidence: f64,
    /// The budget ran out before the search ended.
    pub budget_exhausted: bool,
    /// The oracle stopped answering (interrupted, or a probe could not be run): the search ended
    /// there, undecided.
    pub stopped: bool,
    /// Ids of the components whose cut was still undecided when the budget ran out.
    pub unknown: Vec<String>,
    /// Cuts that failed with another signature (delta relative to the original), not taken.
    pub different_failures: Vec<(Vec<String>, Signature)>,
    /// Every observation used, in order.
    pub probes: Vec<Probe>,
    /// The components derived from the original.
    pub components: Vec<Component>,
    /// The setting of every component in `minimal`.
    pub assignment: Assignment,
}

/// Observations by [`config_hash`]: every observation ever made, several for a configuration run
/// more than once. Persist it between bisects and a re-run resumes where the last one stopped.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Cache {
    observations: BTreeMap<String, Vec<Observation>>,
}

impl Cache {
    /// An empty cache.
    pub fn new() -> Cache {
        Cache::default()
    }

    /// Every observation of the configuration with this hash, oldest first.
    pub fn get(&self, hash: &str) -> &[Observation] {
        self.observations.get(hash).map_or(&[], Vec::as_slice)
    }

    /// Adds one observation of the configuration with this hash.
    pub fn record(&mut self, hash: &str, observation: Observation) {
        self.observations.entry(hash.to_string()).or_default().push(observation);
    }

    /// How many configurations have observations.
    pub fn len(&self) -> usize {
        self.observations.len()
    }

    /// Whether nothing has been observed.
    pub fn is_empty(&self) -> bool {
        self.observations.is_empty()
    }
}

/// Cuts `base` down to a 1-minimal configuration that fails with the same signature; see the
/// module documentation for the algorithm.
pub fn bisect(base: &Scenario, oracle: &mut dyn Oracle, cache: &mut Cache, opts: &Options) -> Outcome {
    let mut components = derive(base);
    components.retain(|c| !opts.keep.contains(&c.id));
    let current: Assignment = components.iter().map(|c| (c.id.clone(), Setting::Original)).collect();
    let mut search = Search {
        base,
        components,
        oracle,
        cache,
        opts,
        signature: None,
        runs: 0,
        probes: Vec::new(),
        reported: HashMap::new(),
        reproducing: BTreeSet::new(),
        judged: Vec::new(),
        different: Vec::new(),
        current,
        boundary: Vec::new(),
        exhausted: false,
        stopped: false,
        claim_confidence: opts.confidence,
    };
    if !search.confirm() {
        return search.finish(false);
    }
    let completed = search.search().is_ok();
    search.finish(completed)
}

/// The budget ran out; the search stops where it is.
struct Exhausted;

/// A configuration ready to run.
#[derive(Debug, Clone)]
struct Candidate {
    scenario: Scenario,
    hash: String,
}

/// What the observations of one configuration say, at the current failure rate.
#[derive(Debug, Clone, PartialEq)]
enum Status {
    Same,
    Different(Signature),
    Passed,
    /// This many more passing runs are needed.
    Need(usize),
}

/// The judgement of one candidate.
#[derive(Debug, Clone, PartialEq)]
enum Verdict {
    Same,
    Passed,
    Different,
    /// The cut makes the scenario invalid; nothing was run.
    Invalid,
    /// Not decided: the budget ran out, or another candidate of the batch reproduced first.
    Unknown,
}

struct Search<'a> {
    base: &'a Scenario,
    components: Vec<Component>,
    oracle: &'a mut dyn Oracle,
    cache: &'a mut Cache,
    opts: &'a Options,
    signature: Option<Signature>,
    runs: usize,
    probes: Vec<Probe>,
    /// Observations per hash already turned into probes.
    reported: HashMap<String, usize>,
    /// Hashes of configurations seen reproducing.
    reproducing: BTreeSet<String>,
    /// Every configuration judged, with its hash.
    judged: Vec<(Assignment, String)>,
    different: Vec<(Vec<String>, Signature)>,
    /// The smallest configuration seen failing with the signature.
    current: Assignment,
    boundary: Vec<(usize, BoundaryEntry)>,
    exhausted: bool,
    /// The oracle answered for fewer runs than asked: no more probes.
    stopped: bool,
    /// The confidence one "passes" judgement needs: the requested one, except while verifying,
    /// where the boundary's claims must hold together (see [`Search::verify`]).
    claim_confidence: f64,
}

impl Search<'_> {
    fn budget_left(&self) -> usize {
        if self.stopped {
            return 0;
        }
        self.opts.budget.saturating_sub(self.runs)
    }

    fn candidate(&self, assignment: &Assignment) -> Result<Candidate, super::space::CutError> {
        let scenario = apply(self.base, &self.components, assignment)?;
        let hash = config_hash(&scenario);
        Ok(Candidate { scenario, hash })
    }

    fn remember(&mut self, assignment: &Assignment, hash: &str) {
        if !self.judged.iter().any(|(_, h)| h == hash) {
            self.judged.push((assignment.clone(), hash.to_string()));
        }
    }

    fn is_same(&self, observation: &Observation) -> bool {
        observation.is_some() && observation.as_ref() == self.signature.as_ref()
    }

    fn verdict_of(&self, observation: &Observation) -> ProbeVerdict {
        match observation {
            None => ProbeVerdict::Passed,
            Some(_) if self.is_same(observation) => ProbeVerdict::Same,
            Some(_) => ProbeVerdict::Different,
        }
    }

    /// Turns observations of `candidate` not yet reported into probes (from `fresh_from` on they
    /// were run by this search, before that they came from the cache handed in).
    fn report(&mut self, candidate: &Candidate, phase: &'static str, fresh_from: usize) {
        let seen = self.reported.get(&candidate.hash).copied().unwrap_or(0);
        let observations = self.cache.get(&candidate.hash).to_vec();
        if seen >= observations.len() {
            return;
        }
        let delta = describe_delta(self.base, &candidate.scenario);
        for (index, observation) in observations.into_iter().enumerate().skip(seen) {
            if self.is_same(&observation) {
                self.reproducing.insert(candidate.hash.clone());
            }
            let verdict = self.verdict_of(&observation);
            self.probes.push(Probe {
                delta: delta.clone(),
                hash: candidate.hash.clone(),
                observation,
                verdict,
                phase,
                cached: index < fresh_from,
            });
        }
        self.reported.insert(candidate.hash.clone(), self.cache.get(&candidate.hash).len());
    }

    /// Runs the batch (already within the budget) and records every observation; returns how
    /// many observations the oracle gave back.
    fn execute(&mut self, batch: &[&Candidate], phase: &'static str) -> usize {
        if batch.is_empty() {
            return 0;
        }
        let scenarios: Vec<Scenario> = batch.iter().map(|c| c.scenario.clone()).collect();
        let observations = self.oracle.run(&scenarios);
        let mut recorded = 0;
        for (candidate, observation) in batch.iter().zip(observations) {
            self.cache.record(&candidate.hash, observation);
            let fresh_from = self.cache.get(&candidate.hash).len().saturating_sub(1);
            self.report(candidate, phase, fresh_from);
            recorded += 1;
        }
        // Only answered runs count; an oracle that answered fewer has stopped.
        self.runs += recorded;
        self.stopped |= recorded < batch.len();
        recorded
    }

    /// Runs the original `confirm_runs` times (minus what the cache holds) and picks the
    /// signature. Returns whether there is a failure to bisect.
    fn confirm(&mut self) -> bool {
        let original = match self.candidate(&self.current) {
            Ok(candidate) => candidate,
            Err(_) => Candidate { scenario: self.base.clone(), hash: config_hash(self.base) },
        };
        let everything = self.current.clone();
        self.remember(&everything, &original.hash);
        let known = self.cache.get(&original.hash).len();
        let wanted = self.opts.confirm_runs.saturating_sub(known);
        let allowed = wanted.min(self.budget_left());
        if allowed < wanted {
            self.exhausted = true;
        }
        if allowed > 0 {
            let scenarios = vec![original.scenario.clone(); allowed];
            let observations = self.oracle.run(&scenarios);
            let answered = observations.len().min(allowed);
            self.runs += answered;
            self.stopped |= answered < allowed;
            for observation in observations.into_iter().take(allowed) {
                self.cache.record(&original.hash, observation);
            }
        }
        let observations = self.cache.get(&original.hash);
        let mut counts: Vec<(&Signature, usize)> = Vec::new();
        for signature in observations.iter().flatten() {
            match counts.iter_mut().find(|(s, _)| *s == signature) {
                Some((_, n)) => *n += 1,
                None => counts.push((signature, 1)),
            }
        }
        // The most common failure; on a tie, the one seen first.
        let best = counts.iter().fold(None::<(&Signature, usize)>, |best, &(s, n)| match best {
            Some((_, m)) if m >= n => best,
            _ => Some((s, n)),
        });
        self.signature = best.map(|(s, _)| s.clone());
        self.report(&original, "confirm", known);
        self.signature.is_some() && !self.stopped
    }

    /// The configurations whose runs estimate the failure rate: those seen reproducing, and
    /// those that keep at least everything of one seen reproducing. Under a deterministic
    /// failure the latter fail too, so a pass of one of them is a flaky pass, not evidence about
    /// the cut: this is how a failure that failed every confirm run is still found to be flaky.
    fn rate_pool(&self) -> BTreeSet<&str> {
        let reproduced: Vec<&Assignment> =
            self.judged.iter().filter(|(_, h)| self.reproducing.contains(h)).map(|(a, _)| a).collect();
        let mut pool: BTreeSet<&str> = self.reproducing.iter().map(String::as_str).collect();
        for (assignment, hash) in &self.judged {
            if !pool.contains(hash.as_str()) && reproduced.iter().any(|r| self.contains(assignment, r)) {
                pool.insert(hash);
            }
        }
        pool
    }

    /// Whether configuration `a` keeps at least as much of every component as `b`.
    fn contains(&self, a: &Assignment, b: &Assignment) -> bool {
        let rank = |c: &Component, s: Option<&Setting>| -> u64 {
            let s = s.unwrap_or(&Setting::Original);
            c.value(s).unwrap_or(u64::from(*s == Setting::Original))
        };
        self.components.iter().all(|c| rank(c, a.get(&c.id)) >= rank(c, b.get(&c.id)))
    }

    /// The failure rate over the configurations of [`Self::rate_pool`], and the runs it rests on.
    fn failure_rate(&self) -> (f64, usize) {
        let (mut same, mut total) = (0usize, 0usize);
        for hash in self.rate_pool() {
            for observation in self.cache.get(hash) {
                total += 1;
                if self.is_same(observation) {
                    same += 1;
                }
            }
        }
        if total == 0 {
            return (1.0, 0);
        }
        (same as f64 / total as f64, total)
    }

    /// The failure rate pass judgements assume. A failure never seen to pass is deterministic
    /// (1). Otherwise the rate is uncertain, so a low estimate is used: the lower end of the
    /// Wilson score interval at one standard error (one-sided 84 %), which makes a pass need
    /// more runs while few runs are known; and never below `1 / (runs + 1)`, so that the runs a
    /// pass needs stay finite.
    fn judging_rate(&self) -> f64 {
        let (p, total) = self.failure_rate();
        if p >= 1.0 || total == 0 {
            return 1.0;
        }
        let t = total as f64;
        let z = 1.0_f64;
        let centre = p + z * z / (2.0 * t);
        let spread = z * (p * (1.0 - p) / t + z * z / (4.0 * t * t)).sqrt();
        let wilson_low = (centre - spread) / (1.0 + z * z / t);
        wilson_low.max(1.0 / (t + 1.0)).min(1.0)
    }

    /// Passing runs needed before "passes" is believed.
    fn needed_passes(&self) -> usize {
        let p = self.judging_rate();
        let confidence = self.claim_confidence.clamp(0.0, 0.999_999);
        if p >= 1.0 || confidence <= 0.0 {
            return 1;
        }
        let n = ((1.0 - confidence).ln() / (1.0 - p).ln()).ceil();
        if n.is_finite() && n >= 1.0 { n as usize } else { 1 }
    }

    fn status(&self, hash: &str) -> Status {
        let observations = self.cache.get(hash);
        if observations.iter().any(|o| self.is_same(o)) {
            return Status::Same;
        }
        if let Some(other) = observations.iter().flatten().next() {
            return Status::Different(other.clone());
        }
        let passes = observations.len();
        let needed = self.needed_passes();
        if passes >= needed { Status::Passed } else { Status::Need(needed - passes) }
    }

    /// Judges the assignments as one batch of rounds. With `first`, stops as soon as one of them
    /// reproduces (the others may stay `Unknown`); otherwise judges every one (unless the budget
    /// runs out, when the undecided stay `Unknown` and `exhausted` is set).
    fn judge(&mut self, assignments: &[Assignment], phase: &'static str, first: bool) -> Vec<Verdict> {
        let candidates: Vec<Option<Candidate>> = assignments.iter().map(|a| self.candidate(a).ok()).collect();
        for (assignment, candidate) in assignments.iter().zip(&candidates) {
            if let Some(candidate) = candidate {
                self.remember(assignment, &candidate.hash);
            }
        }
        let mut unique: Vec<Candidate> = Vec::new();
        for candidate in candidates.iter().flatten() {
            if !unique.iter().any(|u| u.hash == candidate.hash) {
                unique.push(candidate.clone());
            }
        }
        for candidate in &unique {
            let known = self.cache.get(&candidate.hash).len();
            self.report(candidate, phase, known);
        }
        let mut rounds: HashMap<String, u32> = HashMap::new();
        loop {
            let statuses: Vec<Status> = unique.iter().map(|c| self.status(&c.hash)).collect();
            if first && statuses.contains(&Status::Same) {
                break;
            }
            let mut batch: Vec<&Candidate> = Vec::new();
            let mut wanted_any = false;
            for (candidate, status) in unique.iter().zip(&statuses) {
                let Status::Need(more) = status else { continue };
                wanted_any = true;
                let round = rounds.entry(candidate.hash.clone()).or_insert(0);
                let repeats = (1usize << (*round).min(16)).min(*more);
                *round += 1;
                let allowed = repeats.min(self.budget_left().saturating_sub(batch.len()));
                batch.extend(std::iter::repeat_n(candidate, allowed));
            }
            if !wanted_any {
                break;
            }
            if batch.is_empty() {
                self.exhausted = true;
                break;
            }
            let batch: Vec<Candidate> = batch.into_iter().cloned().collect();
            let refs: Vec<&Candidate> = batch.iter().collect();
            if self.execute(&refs, phase) == 0 {
                // An oracle that answers nothing would be asked forever.
                self.exhausted = true;
                break;
            }
        }
        candidates
            .iter()
            .map(|candidate| {
                let Some(candidate) = candidate else { return Verdict::Invalid };
                match self.status(&candidate.hash) {
                    Status::Same => Verdict::Same,
                    Status::Passed => Verdict::Passed,
                    Status::Need(_) => Verdict::Unknown,
                    Status::Different(signature) => {
                        let delta = describe_delta(self.base, &candidate.scenario);
                        if !self.different.iter().any(|(d, s)| *d == delta && *s == signature) {
                            self.different.push((delta, signature));
                        }
                        Verdict::Different
                    }
                }
            })
            .collect()
    }

    /// Judges one assignment, stopping at its first reproduction.
    fn judge_one(&mut self, assignment: &Assignment, phase: &'static str) -> Result<Verdict, Exhausted> {
        let verdict =
            self.judge(std::slice::from_ref(assignment), phase, true).pop().unwrap_or(Verdict::Unknown);
        if verdict == Verdict::Unknown { Err(Exhausted) } else { Ok(verdict) }
    }

    fn with(&self, index: usize, setting: Setting) -> Assignment {
        let mut assignment = self.current.clone();
        if let Some(component) = self.components.get(index) {
            assignment.insert(component.id.clone(), setting);
        }
        assignment
    }

    fn setting(&self, index: usize) -> Setting {
        self.components.get(index).and_then(|c| self.current.get(&c.id)).cloned().unwrap_or(Setting::Original)
    }

    /// Whether component `index` takes part in the current configuration (a removed stage's
    /// depth does not).
    fn present(&self, index: usize) -> bool {
        let Some(Component { kind: Kind::StageDepth { index: stage, .. }, .. }) = self.components.get(index)
        else {
            return true;
        };
        !self.components.iter().any(|c| {
            matches!(c.kind, Kind::Stage { index } if index == *stage)
                && self.current.get(&c.id) == Some(&Setting::Cut)
        })
    }

    fn search(&mut self) -> Result<(), Exhausted> {
        if self.exhausted {
            return Err(Exhausted);
        }
        if self.opts.strategy == Strategy::Ladder {
            self.ladder()?;
        }
        self.delta_debug()?;
        for index in 0..self.components.len() {
            self.halve(index)?;
        }
        self.verify()
    }

    fn ladder(&mut self) -> Result<(), Exhausted> {
        for index in 0..self.components.len() {
            if !matches!(self.components[index].kind, Kind::Ladder { .. })
                || self.setting(index) != Setting::Original
            {
                continue;
            }
            let assignment = self.with(index, Setting::Cut);
            let (Ok(now), Ok(cut)) = (self.candidate(&self.current), self.candidate(&assignment)) else {
                continue;
            };
            if now.hash == cut.hash || self.irrelevant(index, &now.scenario) {
                continue;
            }
            if self.judge_one(&assignment, "ladder")? == Verdict::Same {
                self.current = assignment;
            }
        }
        Ok(())
    }

    /// Whether component `index` has no effect on `scenario`: with no workers, there is
    /// nothing for a start method to start.
    fn irrelevant(&self, index: usize, scenario: &Scenario) -> bool {
        self.components[index].id == "data.start_method" && scenario.data.workers == 0
    }

    /// The current configuration with only the `kept` ones of `pool` at their original setting
    /// and the rest of `pool` cut to the minimum.
    /// A stage's depth only exists with its stage, so keeping the depth keeps the stage.
    fn keeping(&self, pool: &[usize], kept: &[usize]) -> Assignment {
        let stages_of_kept_depths: Vec<usize> = kept
            .iter()
            .filter_map(|&i| match self.components[i].kind {
                Kind::StageDepth { index, .. } => Some(index),
                _ => None,
            })
            .collect();
        let mut assignment = self.current.clone();
        for &index in pool {
            let component = &self.components[index];
            let implied =
                matches!(component.kind, Kind::Stage { index } if stages_of_kept_depths.contains(&index));
            let setting =
                if kept.contains(&index) || implied { Setting::Original } else { component.cut_setting() };
            assignment.insert(component.id.clone(), setting);
        }
        assignment
    }

    fn delta_debug(&mut self) -> Result<(), Exhausted> {
        let ladder = self.opts.strategy == Strategy::Ladder;
        let pool: Vec<usize> = (0..self.components.len())
            .filter(|&i| !(ladder && matches!(self.components[i].kind, Kind::Ladder { .. })))
            .filter(|&i| !self.components[i].is_at_minimum(&self.setting(i)))
            .collect();
        if pool.is_empty() {
            return Ok(());
        }
        let everything_cut = self.keeping(&pool, &[]);
        if self.judge_one(&everything_cut, "ddmin")? == Verdict::Same {
            self.current = everything_cut;
            return Ok(());
        }
        let kept = self.dd(&pool, pool.clone(), Vec::new())?;
        self.current = self.keeping(&pool, &kept);
        Ok(())
    }

    /// Zeller's `dd`: a subset `x` of `changes` such that keeping `x ∪ rest` fails, given that
    /// keeping `changes ∪ rest` has been seen to fail. The rest of `pool` is cut.
    fn dd(&mut self, pool: &[usize], changes: Vec<usize>, rest: Vec<usize>) -> Result<Vec<usize>, Exhausted> {
        if changes.len() <= 1 {
            return Ok(changes);
        }
        let (first, second) = changes.split_at(changes.len().div_ceil(2));
        let (first, second) = (first.to_vec(), second.to_vec());
        let union = |a: &[usize], b: &[usize]| -> Vec<usize> { a.iter().chain(b).copied().collect() };
        let halves = [self.keeping(pool, &union(&first, &rest)), self.keeping(pool, &union(&second, &rest))];
        let mut verdicts = self.judge(&halves, "ddmin", true);
        // Neither half reproducing is what an interaction looks like, and also what a flaky
        // failure looks like when it failed every confirm run and is believed deterministic. So
        // under that belief the configuration both halves came from runs once more: if it passes
        // now, the failure is flaky and the halves are judged again with the runs that needs.
        if !verdicts.contains(&Verdict::Same) && !self.exhausted && self.judging_rate() >= 1.0 {
            let parent = self.keeping(pool, &union(&changes, &rest));
            if self.run_again(&parent) && self.judging_rate() < 1.0 {
                verdicts = self.judge(&halves, "ddmin", true);
            }
        }
        if let Some(which) = verdicts.iter().position(|v| *v == Verdict::Same) {
            let [a, b] = halves;
            self.current = if which == 0 { a } else { b };
            let half = if which == 0 { first } else { second };
            return self.dd(pool, half, rest);
        }
        if self.exhausted {
            return Err(Exhausted);
        }
        // Neither half alone: the cause needs something of each.
        let from_first = self.dd(pool, first, union(&second, &rest))?;
        let from_second = self.dd(pool, second, union(&from_first, &rest))?;
        Ok(union(&from_first, &from_second))
    }

    /// Runs a configuration seen failing only once a second time; returns whether it ran.
    /// (One seen failing more often, like the original after confirm, has been checked; so has
    /// one whose second run is in the cache, which keeps a resumed bisect free.)
    fn run_again(&mut self, assignment: &Assignment) -> bool {
        let Ok(candidate) = self.candidate(assignment) else { return false };
        if self.cache.get(&candidate.hash).len() != 1 {
            return false;
        }
        if self.budget_left() == 0 {
            self.exhausted = true;
            return false;
        }
        self.execute(&[&candidate], "ddmin") > 0
    }

    /// Binary search for the smallest value of numeric component `index` that still fails.
    fn halve(&mut self, index: usize) -> Result<(), Exhausted> {
        let component = self.components[index].clone();
        let setting = self.setting(index);
        let (Some(domain), Some(value)) = (component.domain(), component.value(&setting)) else {
            return Ok(());
        };
        if !self.present(index) || component.is_at_minimum(&setting) {
            return Ok(());
        }
        let (mut low, mut high) = (0, domain.floor_index(value));
        while low < high {
            let middle = low + (high - low) / 2;
            let assignment = self.with(index, Setting::Value(domain.value(middle)));
            if self.judge_one(&assignment, "halving")? == Verdict::Same {
                high = middle;
                self.current = assignment;
            } else {
                low = middle + 1;
            }
        }
        Ok(())
    }

    /// Every component one step further down must pass (or fail differently); one that still
    /// reproduces is taken and verification starts over.
    fn verify(&mut self) -> Result<(), Exhausted> {
        loop {
            self.boundary.clear();
            let now = self.candidate(&self.current).ok();
            let steps: Vec<(usize, Assignment)> = (0..self.components.len())
                .filter(|&i| self.present(i))
                .filter(|&i| !now.as_ref().is_some_and(|now| self.irrelevant(i, &now.scenario)))
                .filter_map(|i| self.components[i].step_down(&self.setting(i)).map(|s| (i, self.with(i, s))))
                .collect();
            let assignments: Vec<Assignment> = steps.iter().map(|(_, a)| a.clone()).collect();
            // The boundary is one claim made of `m` "passes": each must hold at c^(1/m) (Šidák)
            // for all of them together to hold at the requested confidence c. Judgements made
            // at the per-step level during the search are topped up with more runs here.
            let m = steps.len().max(1) as f64;
            self.claim_confidence = self.opts.confidence.powf(1.0 / m);
            let verdicts = self.judge(&assignments, "verify", true);
            self.claim_confidence = self.opts.confidence;
            if let Some(taken) = verdicts.iter().position(|v| *v == Verdict::Same) {
                let (index, assignment) = steps[taken].clone();
                self.current = assignment;
                self.halve(index)?;
                continue;
            }
            for ((index, assignment), verdict) in steps.iter().zip(&verdicts) {
                if !matches!(verdict, Verdict::Passed | Verdict::Different) {
                    continue;
                }
                let Ok(cut) = self.candidate(assignment) else { continue };
                let delta =
                    now.as_ref().map_or_else(Vec::new, |now| describe_delta(&now.scenario, &cut.scenario));
                let entry = BoundaryEntry {
                    component: self.components[*index].id.clone(),
                    cut: delta.join(", "),
                    passes: *verdict == Verdict::Passed,
                    runs: self.cache.get(&cut.hash).len(),
                };
                self.boundary.push((*index, entry));
            }
            return if verdicts.contains(&Verdict::Unknown) { Err(Exhausted) } else { Ok(()) };
        }
    }

    fn finish(self, completed: bool) -> Outcome {
        let minimal = apply(self.base, &self.components, &self.current).unwrap_or_else(|_| self.base.clone());
        let minimal_delta = describe_delta(self.base, &minimal);
        let (rate, _) = self.failure_rate();
        let judging = self.judging_rate();
        let decided: BTreeSet<usize> = self.boundary.iter().map(|(i, _)| *i).collect();
        let unknown = if completed || self.signature.is_none() {
            Vec::new()
        } else {
            (0..self.components.len())
                .filter(|&i| self.present(i) && !decided.contains(&i))
                .filter(|&i| !self.components[i].is_at_minimum(&self.setting(i)))
                .map(|i| self.components[i].id.clone())
                .collect()
        };
        let confidence = if self.signature.is_none() {
            0.0
        } else {
            self.boundary
                .iter()
                .filter(|(_, entry)| entry.passes)
                .map(|(_, entry)| 1.0 - (1.0 - judging).powi(i32::try_from(entry.runs).unwrap_or(i32::MAX)))
                .product()
        };
        let failure_rate = if self.signature.is_none() { 0.0 } else { rate };
        Outcome {
            signature: self.signature,
            failure_rate,
            flaky: failure_rate > 0.0 && failure_rate < 1.0,
            runs: self.runs,
            minimal,
            minimal_delta,
            boundary: self.boundary.into_iter().map(|(_, entry)| entry).collect(),
            confidence,
            budget_exhausted: self.exhausted && !self.stopped,
            stopped: self.stopped,
            unknown,
            different_failures: self.different,
            probes: self.probes,
            components: self.components,
            assignment: self.current,
        }
    }
}
