//! `ups-doctor bisect`: check the request, read the machine once, run the search
//! ([`crate::bisect::run_session`]) and print its conclusion.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use super::invocation::current_exe;
use super::out_dir::{out_dir_or_fresh, sanitize};
use super::preflight::{check_gpus, check_memory_limits, check_trainer};
use crate::harness::run::interrupt::{self, INTERRUPTED};
use crate::harness::{self, ScenarioInput};
use crate::scenario::{self, Override};
use crate::{Error, exit};

/// What `ups-doctor bisect` was asked, as plain data.
pub struct BisectRequest {
    pub scenario: PathBuf,
    pub set: Vec<Override>,
    pub budget: usize,
    pub confidence: f64,
    pub confirm: usize,
    pub jobs: usize,
    pub out: Option<PathBuf>,
    pub cache: PathBuf,
    pub json: bool,
    pub quiet: bool,
    pub strategy: crate::bisect::Strategy,
}

/// Runs the bisect; the exit status as [`exit`] documents it for `bisect`.
pub fn bisect(args: BisectRequest) -> Result<u8, Error> {
    interrupt::install_handler();
    if !(args.confidence > 0.0 && args.confidence < 1.0) {
        return Err(Error::BadInput(format!(
            "--confidence {} is not between 0 and 1 (exclusive); e.g. `--confidence 0.95`",
            args.confidence
        )));
    }
    for (flag, value) in [("--budget", args.budget), ("--confirm", args.confirm), ("--jobs", args.jobs)] {
        if value == 0 {
            return Err(Error::BadInput(format!("{flag} must be at least 1")));
        }
    }
    let scenario = scenario::load_file(&args.scenario, &args.set)?;
    let input = [ScenarioInput {
        file: args.scenario.clone(),
        overrides: args.set.iter().map(|o| o.raw.clone()).collect(),
        scenario: scenario.clone(),
    }];
    let program = current_exe()?;
    check_trainer(&input, &program)?;
    let machine = crate::probe::machine(&harness::machine_needs([&scenario], &program));
    check_gpus(&input, &machine)?;
    check_memory_limits(&input)?;
    harness::limits::check_open_files(&input).map_err(Error::BadInput)?;
    let out_dir = out_dir_or_fresh(args.out.clone(), &format!("-bisect-{}", sanitize(&scenario.name)))?;
    if !args.quiet {
        eprintln!(
            "bisecting {} (budget {} runs, {} in parallel)",
            args.scenario.display(),
            args.budget,
            args.jobs
        );
    }
    let request = crate::bisect::Request {
        file: args.scenario.clone(),
        overrides: args.set.iter().map(|o| o.raw.clone()).collect(),
        scenario,
        options: crate::bisect::Options {
            budget: args.budget,
            confidence: args.confidence,
            confirm_runs: args.confirm,
            strategy: args.strategy,
        },
        jobs: args.jobs,
        out_dir: out_dir.clone(),
        cache_dir: args.cache,
        show_progress: !args.quiet,
        environment: machine,
    };
    let record = crate::bisect::run_session(&request, &program, &INTERRUPTED)?;
    let report = out_dir.join("bisect.md");
    crate::report::write_atomic(&report, (crate::report::render_bisect(&record) + "\n").as_bytes())?;
    if INTERRUPTED.load(Ordering::SeqCst) {
        eprintln!("interrupted; partial bisect written to {}", out_dir.display());
        return Ok(exit::INTERRUPTED);
    }
    let summary = match (&record.signature, record.boundary.is_empty()) {
        (None, _) => "the scenario did not fail: nothing to bisect".to_string(),
        (Some(sig), true) => format!(
            "{} still happens with [{}]; no remaining component can be cut further (each is at its minimum, or cutting it makes the scenario invalid)",
            sig.describe(),
            record.minimal_delta.join(", ")
        ),
        (Some(sig), false) => format!(
            "{} still happens with [{}]; passes when any of [{}] is cut",
            sig.describe(),
            record.minimal_delta.join(", "),
            record.boundary.join(", ")
        ),
    };
    if args.json {
        eprintln!("{summary}\nreport: {}", report.display());
        println!("{}", serde_json::to_string_pretty(&record).expect("records serialise"));
    } else {
        println!(
            "{summary}\n{} real runs, confidence {:.2}\nreport: {}",
            record.runs,
            record.confidence,
            report.display()
        );
    }
    Ok(if record.signature.is_some() && !record.budget_exhausted { exit::MET } else { exit::NOT_MET })
}
