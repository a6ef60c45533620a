//! Launches ranks, reads their markers, watches for hangs and overruns, tears processes down and
//! classifies how each ended into a [`ScenarioResult`]. Talks to ranks only through processes and
//! [`crate::protocol`]; never uses tch.
//!
//! Layout: `process` and `capture` are the OS edge (spawn, signals, wait, pipes); `supervise` is
//! the loop that drives them; `state` and `classify` are pure (markers → state → outcomes and
//! verdict); `result` is the data written to `result.json`.

mod capture;
mod classify;
mod external;
mod gpu;
mod memory;
mod namespace;
mod owner;
mod process;
mod progress;
mod quotes;
mod result;
mod state;
mod supervise;
mod verdict_ext;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

pub use capture::make_room;
pub use classify::{
    Intervention, RankEnd, annotate, check_expectation, classify_rank, input_bound, used_of, verdict,
};
pub use gpu::{
    ClockReason, GpuPoint, GpuPointValues, GpuProcessPeak, GpuRecorder, GpuReport, GpuSample, GpuSummary,
    Stat, annotate_gpu, clock_reason_names,
};
pub use progress::{Progress, ProgressMode};
pub use result::*;
pub use state::RankState;

use crate::scenario::{OutcomeKind, Scenario};

/// One scenario to run, as loaded from the command line.
#[derive(Debug, Clone)]
pub struct ScenarioInput {
    pub file: PathBuf,
    pub overrides: Vec<String>,
    pub scenario: Scenario,
}

/// Errors of the harness itself (not of the ranks, whose failures are outcomes).
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("failed to prepare `{path}`: {source}")]
    Prepare { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    PrivateShm(#[from] namespace::NamespaceError),
}

/// The scenario the ranks get: checkpoints go under the scenario's own folder unless the file
/// gave an absolute `checkpoint_dir`, and a relative `resume` is taken from where ups-doctor was
/// started (the user typed it there).
fn with_absolute_paths(s: &Scenario, cwd: &Path, scenario_dir: &Path) -> Scenario {
    let mut s = s.clone();
    let t = &mut s.train;
    if t.checkpoint_every > 0 || t.resume.is_some() {
        t.checkpoint_dir = scenario_dir.join(&t.checkpoint_dir).to_string_lossy().into_owned();
    }
    if let Some(resume) = t.resume.as_mut() {
        *resume = cwd.join(&*resume).to_string_lossy().into_owned();
    }
    s
}

/// Runs one scenario under supervision. `dir` is the scenario's own folder for logs and the
/// resolved scenario file; `rel` is how that folder is named relative to the report.
/// When the user interrupted it, the result is marked `interrupted` and keeps what the ranks had
/// (phases, steps, stacks taken before teardown).
pub fn run_scenario(
    input: &ScenarioInput,
    program: &Path,
    dir: &Path,
    rel: &str,
    progress: &mut Progress,
    interrupted: &AtomicBool,
) -> Result<ScenarioResult, HarnessError> {
    let prepare = |path: &Path, source| HarnessError::Prepare { path: path.to_path_buf(), source };
    std::fs::create_dir_all(dir).map_err(|e| prepare(dir, e))?;
    let resolved_file = dir.join("scenario.json");
    let here = std::env::current_dir().map_err(|e| prepare(Path::new("."), e))?;
    let resolved = with_absolute_paths(&input.scenario, &here, &here.join(dir));
    let json = serde_json::to_string_pretty(&resolved).expect("scenarios always serialise");
    std::fs::write(&resolved_file, json + "\n").map_err(|e| prepare(&resolved_file, e))?;

    // Validation has checked the size; a value that slipped past it is refused here too.
    let private_shm = match &input.scenario.data.shm_size {
        Some(label) => {
            let bytes = crate::scenario::parse_size(label).map_err(|why| namespace::NamespaceError {
                size: label.clone(),
                step: "parse",
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, why),
            })?;
            Some(namespace::PrivateShm::create(bytes, label)?)
        }
        None => None,
    };
    let plan = supervise::ScenarioPlan {
        scenario: &input.scenario,
        program: program.to_path_buf(),
        resolved_file,
        log_dir: dir.to_path_buf(),
        run_id: supervise::new_run_id(),
        private_shm: private_shm.as_ref(),
        scenario_dir: here.join(input.file.parent().unwrap_or(Path::new("."))),
    };
    let observed = supervise::supervise(&plan, progress, interrupted);
    // The namespace holder goes now; the private /dev/shm goes with it.
    drop(private_shm);
    let mut ranks: Vec<RankResult> = observed.ends.iter().map(classify_rank).collect();
    for r in &mut ranks {
        r.stdout_log = format!("{rel}/{}", r.stdout_log);
        r.stderr_log = format!("{rel}/{}", r.stderr_log);
    }
    let (outcome, first_failure, mut verdict) = verdict(&input.scenario, &ranks, observed.wall_s);
    annotate(
        &mut verdict,
        &input.scenario,
        &ranks,
        first_failure,
        Some(&observed.memory),
        &observed.leftovers,
    );
    annotate_gpu(&mut verdict, &input.scenario, &ranks, observed.gpu.as_ref());
    for r in &mut ranks {
        r.collateral = first_failure.is_some_and(|f| f != r.rank) && r.outcome != OutcomeKind::Passed;
    }
    let failed = first_failure.and_then(|f| ranks.iter().find(|r| r.rank == f));
    let mut mismatches = check_expectation(&input.scenario.expect, outcome, failed);
    if observed.interrupted {
        // Cut short: neither a pass nor a failure of `expect`; what was seen stays as evidence.
        mismatches.clear();
        verdict.evidence.insert(0, format!("Before the interrupt: {}", verdict.headline));
        verdict.headline = format!(
            "Interrupted by the user after {:.1} s, before the scenario ended on its own",
            observed.wall_s
        );
    }
    let rank0 = observed.ends.first().map(|e| &e.state);
    Ok(ScenarioResult {
        name: input.scenario.name.clone(),
        file: input.file.display().to_string(),
        overrides: input.overrides.clone(),
        scenario: input.scenario.clone(),
        outcome,
        met_expectation: mismatches.is_empty() && !observed.interrupted,
        interrupted: observed.interrupted,
        expectation_mismatches: mismatches,
        verdict,
        first_failure,
        wall_s: observed.wall_s,
        steps_per_s: rank0.and_then(RankState::steps_per_s),
        samples_per_s: {
            let rates: Vec<f64> = observed.ends.iter().filter_map(|e| e.state.samples_per_s()).collect();
            (!rates.is_empty()).then(|| rates.iter().sum())
        },
        memory: Some(observed.memory),
        leftovers: observed.leftovers,
        external: observed.external,
        gpu: observed.gpu,
        cgroup: None,
        oom_kills: Vec::new(),
        ranks,
    })
}
