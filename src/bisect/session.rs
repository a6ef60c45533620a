//! One `ups-doctor bisect`: load the result cache, search with real runs, save everything.
//! The IO edge around the pure search.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use crate::scenario::{Expect, Scenario};
use crate::schema::Signal;

use super::executor::ProcessOracle;
use super::record::{BisectRecord, DifferentFailure, ProbeRow};
use super::search::{self, Cache, Options};
use super::space::config_hash;

/// What to bisect and how.
pub struct Request {
    pub file: PathBuf,
    pub overrides: Vec<String>,
    pub scenario: Scenario,
    pub options: Options,
    pub jobs: usize,
    /// The bisect's report folder.
    pub out_dir: PathBuf,
    /// Where cached observations live between bisects.
    pub cache_dir: PathBuf,
    pub show_progress: bool,
    /// The machine, read once by the session before anything ran.
    pub environment: crate::schema::EnvSummary,
    /// A command's bisect: the flag each param stands for (`num_workers` → `--num-workers`), so
    /// that the result is said as a command line.
    pub flags: Option<std::collections::BTreeMap<String, String>>,
}

/// Errors of the bisect machinery itself.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("failed to write `{path}`: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("a probe could not be run: {0}")]
    Probe(String),
}

/// Names the cache files of this version's signatures: observations of versions whose signatures
/// lacked what the judge saw (pattern, exception, key line) would read as different failures.
const CACHE_PREFIX: &str = "sig2-";

/// Runs the bisect and writes `bisect.json` and `minimal.json` into the out folder (the session
/// renders `bisect.md` from the record).
pub fn run(
    request: &Request,
    program: &Path,
    interrupted: &AtomicBool,
) -> Result<BisectRecord, SessionError> {
    let base = &request.scenario;
    let cache_file = request.cache_dir.join(format!("{CACHE_PREFIX}{}.json", config_hash(base)));
    let mut cache: Cache = std::fs::read_to_string(&cache_file)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default();
    let mut oracle = ProcessOracle::new(
        program,
        &request.file,
        base,
        &request.out_dir,
        request.jobs,
        request.options.budget,
        request.show_progress,
        interrupted,
    );
    oracle.save_cache_to(&cache_file, &cache);
    let outcome = search::bisect(base, &mut oracle, &mut cache, &request.options);
    // The oracle saved the cache after every probe; once more here (every probe that finished,
    // also those the search never saw because an earlier one was interrupted), so that even a
    // failed report leaves a cache a re-run resumes from.
    let saved = oracle.saved_cache().unwrap_or(cache);
    write(&cache_file, crate::secrets::json_text(&saved, false).expect("the cache serialises").trim_end())?;
    if let Some(e) = oracle.cache_error.lock().unwrap_or_else(|e| e.into_inner()).take() {
        return Err(SessionError::Probe(format!("failed to save the probe cache: {e}")));
    }
    if let Some(e) = oracle.internal_error.take() {
        return Err(SessionError::Probe(e));
    }

    let mut real_runs = oracle.records.iter();
    let probes = outcome
        .probes
        .iter()
        .map(|p| {
            let run = if p.cached { None } else { real_runs.next() };
            ProbeRow {
                stage: p.phase.to_string(),
                delta: p.delta.clone(),
                observation: p.observation.clone(),
                verdict: p.verdict,
                cached: p.cached,
                wall_s: run.map(|r| r.wall_s),
                dir: run.map(|r| r.dir.clone()),
            }
        })
        .collect();

    let mut minimal = outcome.minimal.clone();
    if let Some(sig) = &outcome.signature {
        minimal.name = format!("{}-minimal", base.name);
        minimal.description = format!(
            "1-minimal reproduction found by `ups-doctor bisect` of `{}`: {}.",
            request.file.display(),
            sig.describe()
        );
        minimal.expect = Expect {
            outcome: sig.outcome,
            signal: sig.signal.map(Signal::name),
            exit_code: sig.exit_code,
            phase: sig.phase.clone(),
            // A program's exception is part of its failure: `exit 1` alone is any error at all.
            message: sig.exception.clone(),
            // What "finished" means for an external program is part of the failure's definition.
            completes_when: base.expect.completes_when.clone(),
            ..Expect::default()
        };
    }
    // `minimal.json` lives in the bisect's folder: a command's `{scenario_dir}` must still name
    // the original scenario's folder when it is run from there.
    if let Some(command) = minimal.command.as_mut() {
        let dir =
            std::env::current_dir().unwrap_or_default().join(request.file.parent().unwrap_or(Path::new(".")));
        for arg in command.iter_mut().filter(|a| !a.contains("{{")) {
            *arg = arg.replace("{scenario_dir}", &dir.display().to_string());
        }
    }
    let record = BisectRecord {
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        started_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        command: std::env::args().collect(),
        file: request.file.display().to_string(),
        overrides: request.overrides.clone(),
        original: base.clone(),
        components: outcome.components.iter().map(|c| c.id.clone()).collect(),
        signature: outcome.signature.clone(),
        flaky: outcome.failure_rate,
        is_flaky: outcome.flaky,
        confidence: outcome.confidence,
        runs: outcome.runs,
        budget: request.options.budget,
        budget_exhausted: outcome.budget_exhausted,
        interrupted: outcome.stopped,
        unknown: outcome.unknown.clone(),
        minimal_command: match (&request.flags, &outcome.signature) {
            (Some(flags), Some(_)) => {
                Some(super::command_line::minimal_command(&minimal, &outcome.boundary, flags))
            }
            _ => None,
        },
        minimal,
        minimal_delta: outcome.minimal_delta.clone(),
        boundary: outcome.boundary.iter().filter(|b| b.passes).map(|b| b.component.clone()).collect(),
        boundary_detail: outcome.boundary.clone(),
        different_failures: outcome
            .different_failures
            .iter()
            .map(|(delta, signature)| DifferentFailure { delta: delta.clone(), signature: signature.clone() })
            .collect(),
        probes,
        environment: request.environment.clone(),
    };
    let dir = &request.out_dir;
    // Masked as every output is (issue text is pasted from it); minimal.json is a scenario to run
    // and keeps what it needs to run.
    let masked = crate::secrets::json_text(&record, true).expect("records serialise");
    write(&dir.join("bisect.json"), masked.trim_end())?;
    write(&dir.join("minimal.json"), &record.minimal.file_json())?;
    Ok(record)
}

/// Writes then renames, so a crash never leaves a torn file.
fn write(path: &Path, text: &str) -> Result<(), SessionError> {
    let err = |source| SessionError::Write { path: path.to_path_buf(), source };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(err)?;
    }
    crate::run_files::replace(path, format!("{text}\n").as_bytes()).map_err(err)
}
