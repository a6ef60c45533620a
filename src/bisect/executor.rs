//! The oracle that runs candidates for real: each probe is a full supervised scenario run (real
//! ranks, real faults, real classification), in a folder of its own so its logs stay inspectable.
//! Independent probes run in parallel on up to `jobs` threads.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::harness::ScenarioInput;
use crate::harness::run::events::Silent;
use crate::scenario::Scenario;
use crate::schema::ScenarioResult;

use super::search::{Cache, Oracle};
use super::signature::{Observation, Signature};
use super::space::config_hash;
use crate::scenario::describe_delta;

/// What one real run of a candidate produced, for the probe table.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RunRecord {
    pub index: usize,
    pub hash: String,
    pub delta: Vec<String>,
    pub observation: Observation,
    pub headline: String,
    pub wall_s: f64,
    /// The probe's folder, relative to the bisect folder.
    pub dir: String,
}

/// Why a probe's run does not count.
#[derive(Debug, thiserror::Error)]
enum NotCounted {
    /// The user interrupted it: it says nothing about the candidate.
    #[error("interrupted")]
    Interrupted,
    /// It could not be run: ups-doctor's own failure, which the bisect reports.
    #[error(transparent)]
    Failed(#[from] crate::nodes::local::RunError),
}

/// Where a worker thread leaves one candidate's run.
type Slot = Mutex<Option<Result<(ScenarioResult, f64), NotCounted>>>;

/// Runs candidates as real supervised scenarios.
pub struct ProcessOracle<'a> {
    program: PathBuf,
    /// The bisected scenario's file: a command's `{scenario_dir}` is its folder for every probe.
    file: PathBuf,
    base: Scenario,
    dir: PathBuf,
    jobs: usize,
    budget: usize,
    interrupted: &'a AtomicBool,
    pub records: Vec<RunRecord>,
    /// Set when a probe could not even be prepared (disk full, …): the search then sees failures
    /// of kind `launch_failed`, and the caller reports this error.
    pub internal_error: Option<String>,
    show_progress: bool,
    /// The cache file, kept up to date after every probe, and what it holds.
    cache: Option<(PathBuf, Mutex<Cache>)>,
    /// The first failure to write the cache file.
    pub cache_error: Mutex<Option<String>>,
}

impl<'a> ProcessOracle<'a> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        program: &Path,
        file: &Path,
        base: &Scenario,
        dir: &Path,
        jobs: usize,
        budget: usize,
        show_progress: bool,
        interrupted: &'a AtomicBool,
    ) -> ProcessOracle<'a> {
        ProcessOracle {
            program: program.to_path_buf(),
            file: file.to_path_buf(),
            base: base.clone(),
            dir: dir.to_path_buf(),
            jobs: jobs.max(1),
            budget,
            interrupted,
            records: Vec::new(),
            internal_error: None,
            show_progress,
            cache: None,
            cache_error: Mutex::new(None),
        }
    }

    /// Keeps the cache on disk after every probe, so that a bisect stopped at any moment
    /// (even by a SIGKILL) resumes with every probe that finished.
    pub fn save_cache_to(&mut self, path: &Path, cache: &Cache) {
        self.cache = Some((path.to_path_buf(), Mutex::new(cache.clone())));
    }

    /// Every observation the cache file holds: what the search was handed, plus every probe that
    /// finished (also those after one that did not, which the search never saw).
    pub fn saved_cache(&self) -> Option<Cache> {
        self.cache.as_ref().map(|(_, c)| c.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    fn checkpoint(&self, candidate: &Scenario, observation: Observation) {
        let Some((path, cache)) = &self.cache else { return };
        let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.record(&config_hash(candidate), observation);
        // Masked by the one rule, as every file ups-doctor writes (key lines quote the program).
        let text = crate::secrets::json_text(&*cache, false).expect("the cache serialises");
        if let Some(parent) = path.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        if let Err(e) = crate::run_files::replace(path, text.as_bytes()) {
            self.cache_error.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e.to_string());
        }
    }

    fn run_one(&self, index: usize, candidate: &Scenario) -> Result<(ScenarioResult, f64), NotCounted> {
        let rel = format!("probes/{index:03}");
        let input =
            ScenarioInput { file: self.file.clone(), overrides: Vec::new(), scenario: candidate.clone() };
        let started = Instant::now();
        let mut quiet = Silent;
        let result = crate::nodes::local::run_scenario(
            &input,
            &self.program,
            &self.dir,
            &rel,
            &mut quiet,
            self.interrupted,
        )?;
        // A probe cut short by the user says nothing about the candidate: never an observation.
        if result.interrupted {
            return Err(NotCounted::Interrupted);
        }
        Ok((result, started.elapsed().as_secs_f64()))
    }
}

impl Oracle for ProcessOracle<'_> {
    /// Runs the candidates (in parallel on `jobs` threads) and answers for the longest prefix of
    /// them that completed. At the user's interrupt, or when a probe cannot be run, no further
    /// probe starts; a probe cut short is neither an observation nor cached.
    fn run(&mut self, candidates: &[Scenario]) -> Vec<Observation> {
        let first = self.records.len() + 1;
        let slots: Vec<Slot> = candidates.iter().map(|_| Mutex::new(None)).collect();
        let next = Mutex::new(0usize);
        let failed = AtomicBool::new(false);
        std::thread::scope(|scope| {
            for _ in 0..self.jobs.min(candidates.len()) {
                scope.spawn(|| {
                    loop {
                        let i = {
                            let mut n = next.lock().unwrap_or_else(|e| e.into_inner());
                            let i = *n;
                            *n += 1;
                            i
                        };
                        if i >= candidates.len()
                            || self.interrupted.load(Ordering::SeqCst)
                            || failed.load(Ordering::SeqCst)
                        {
                            return;
                        }
                        let out = self.run_one(first + i, &candidates[i]);
                        match &out {
                            Ok((result, _)) => self.checkpoint(&candidates[i], Signature::of(result)),
                            Err(_) => failed.store(true, Ordering::SeqCst),
                        }
                        *slots[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(out);
                    }
                });
            }
        });
        let mut observations = Vec::with_capacity(candidates.len());
        for (i, (candidate, slot)) in candidates.iter().zip(slots).enumerate() {
            let index = first + i;
            let delta = describe_delta(&self.base, candidate);
            let what = if delta.is_empty() { "the original scenario".to_string() } else { delta.join(", ") };
            let (result, wall_s) = match slot.into_inner().unwrap_or_else(|e| e.into_inner()) {
                Some(Ok(done)) => done,
                stopped => {
                    if let Some(Err(NotCounted::Failed(e))) = &stopped {
                        self.internal_error.get_or_insert(e.to_string());
                    }
                    if self.show_progress {
                        let why = match &stopped {
                            Some(Err(e)) => e.to_string(),
                            _ => "not started".to_string(),
                        };
                        eprintln!("  run {index:>3}/{}  {what}  →  not counted: {why}", self.budget);
                    }
                    // Answer for the prefix only: what came after is not lost (each finished
                    // probe is in the cache file already) but the search stops here.
                    break;
                }
            };
            let observation = Signature::of(&result);
            if self.show_progress {
                let seen = observation.as_ref().map_or("passed".to_string(), Signature::describe);
                eprintln!("  run {index:>3}/{}  {what}  →  {seen}  ({wall_s:.1} s)", self.budget);
            }
            self.records.push(RunRecord {
                index,
                hash: config_hash(candidate),
                delta,
                observation: observation.clone(),
                headline: result.verdict.headline.clone(),
                wall_s,
                dir: format!("probes/{index:03}"),
            });
            observations.push(observation);
        }
        observations
    }
}
