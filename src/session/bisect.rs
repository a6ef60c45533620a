//! `ups-doctor bisect`: check the request, read the machine once, run the search
//! ([`crate::bisect::run_session`]) and print its conclusion.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use serde_json::json;

use super::invocation::current_exe;
use super::out_dir::{out_dir_or_fresh, sanitize};
use super::preflight::{check_gpus, check_memory_limits, check_trainer};
use crate::harness::run::interrupt::{self, INTERRUPTED};
use crate::harness::{self, ScenarioInput};
use crate::scenario::{self, Override};
use crate::{Error, exit};

/// What `ups-doctor bisect` was asked, as plain data.
pub struct BisectRequest {
    /// The scenario file; `None` with a command.
    pub scenario: Option<PathBuf>,
    /// A failing command after `--`: its command line is what is cut.
    pub command: Vec<String>,
    /// `--keep FLAG`: flags of the command (or variables of its `--env`) left as they are.
    pub keep: Vec<String>,
    /// `--cut FLAG=V1,V2`: a flag's values to try, in order.
    pub cut: Vec<String>,
    /// What `run -- CMD` takes about a command (`--env`, `--cwd`, `--ranks`, limits, …).
    pub options: super::command::CommandOptions,
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

/// A command after `--`: its scenario, its command line cut into placeholders
/// ([`super::command::decompose`]), written into the bisect's folder (which it creates, and which
/// `--out` then names); the flags each param stands for. Without a command, checks that there is
/// a scenario file and no `--keep`/`--cut`.
fn from_command(args: &mut BisectRequest) -> Result<Option<Command>, Error> {
    const FORMS: &str = "give a failing scenario file, or a command after `--`: `ups-doctor bisect -- torchrun \
                         --nproc_per_node 2 train.py --num-workers 8`";
    match (&args.scenario, args.command.is_empty()) {
        (Some(file), false) => {
            return Err(Error::BadInput(format!(
                "both a scenario file (`{}`) and a command after `--`: {FORMS}",
                file.display()
            )));
        }
        (None, true) => return Err(Error::BadInput(format!("nothing to bisect: {FORMS}"))),
        (Some(_), true) => {
            if let Some(flag) = args.keep.first().or(args.cut.first()) {
                return Err(Error::BadInput(format!(
                    "`{flag}`: `--keep` and `--cut` name flags of a command after `--`; a scenario file says \
                     its cuts in `params` (`\"cuts\": [8, 4, 0]`)"
                )));
            }
            args.options.none_given()?;
            return Ok(None);
        }
        (None, false) => {}
    }
    let mut cuts = Vec::new();
    for raw in &args.cut {
        let Some((flag, list)) = raw.split_once('=').filter(|(f, l)| f.starts_with('-') && !l.is_empty())
        else {
            return Err(Error::BadInput(format!(
                "`--cut {raw}`: expected `FLAG=V1,V2,…`, e.g. `--cut=--batch-size=64,8`"
            )));
        };
        if !args.command.iter().any(|a| a == flag || a.starts_with(&format!("{flag}="))) {
            return Err(Error::BadInput(format!("`--cut {raw}`: the command has no `{flag}`")));
        }
        cuts.push((flag.to_string(), list.split(',').map(str::to_string).collect()));
    }
    let env_names: Vec<&str> =
        args.options.env.iter().filter_map(|pair| pair.split_once('=')).map(|(n, _)| n).collect();
    let mut keep_env = Vec::new();
    for flag in &args.keep {
        if env_names.contains(&flag.as_str()) {
            keep_env.push(crate::bisect::space::env_id(flag));
        } else if !args.command.iter().any(|a| a == flag || a.starts_with(&format!("{flag}="))) {
            let or_env = if flag.starts_with('-') {
                String::new()
            } else {
                format!(", and no `--env {flag}=…` was given")
            };
            return Err(Error::BadInput(format!("`--keep {flag}`: the command has no `{flag}`{or_env}")));
        }
    }
    let mut file = super::command::scenario_file(&args.command, &args.options)?;
    let (argv, params, flags) = super::command::decompose(&args.command, &args.keep, &cuts);
    if let Some(nodes) = super::command::torchrun_nodes(&args.command) {
        // The nodes are played on this machine, one agent each, as `--set launch.nodes` does
        // for `run`: a bisect cannot wait for nodes started by hand.
        file["launch"]["nodes"] = json!(nodes);
    }
    if params.is_empty()
        && env_names.len() == keep_env.len()
        && !argv.iter().any(|a| a.contains("{world_size}") || a.contains("{nodes}"))
    {
        return Err(Error::BadInput(
            "nothing in this command line can be cut: no integer flag, list, on/off value or bare flag after \
             the script, no `--env` variable, and one rank\n  hint: name a flag's values with \
             `--cut=--flag=V1,V2`, or write a scenario file with `params`"
                .into(),
        ));
    }
    file["command"] = json!(argv);
    file["params"] = serde_json::Value::Object(params);
    let (path, out) = super::command::write_scenario(&file, args.out.clone(), "bisect")?;
    args.scenario = Some(path);
    args.out = Some(out);
    Ok(Some(Command { flags, keep: keep_env }))
}

/// What a command's bisect knows beyond its scenario file.
struct Command {
    /// The flag each param stands for.
    flags: BTreeMap<String, String>,
    /// Components the user kept (`--keep NAME` of an `--env` variable).
    keep: Vec<String>,
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
    let mut args = args;
    let command = from_command(&mut args)?;
    let file = args.scenario.clone().unwrap_or_default();
    let scenario = scenario::load_file(&file, &args.set)?;
    let input = [ScenarioInput {
        file: file.clone(),
        overrides: args.set.iter().map(|o| o.raw.clone()).collect(),
        scenario: scenario.clone(),
    }];
    let program = current_exe()?;
    check_trainer(&input, &program)?;
    let machine = crate::probe::machine(&harness::machine_needs([&scenario], &program));
    check_gpus(&input, &machine)?;
    check_memory_limits(&input)?;
    harness::limits::check_open_files(&input).map_err(|e| Error::BadInput(e.to_string()))?;
    let out_dir = out_dir_or_fresh(args.out.clone(), &format!("-bisect-{}", sanitize(&scenario.name)))?;
    if !args.quiet {
        eprintln!("bisecting {} (budget {} runs, {} in parallel)", file.display(), args.budget, args.jobs);
    }
    let request = crate::bisect::Request {
        file: file.clone(),
        overrides: args.set.iter().map(|o| o.raw.clone()).collect(),
        scenario,
        options: crate::bisect::Options {
            budget: args.budget,
            confidence: args.confidence,
            confirm_runs: args.confirm,
            strategy: args.strategy,
            keep: command.as_ref().map(|c| c.keep.clone()).unwrap_or_default(),
        },
        jobs: args.jobs,
        out_dir: out_dir.clone(),
        cache_dir: args.cache,
        show_progress: !args.quiet,
        environment: machine,
        flags: command.map(|c| c.flags),
    };
    let record = crate::bisect::run_session(&request, &program, &INTERRUPTED)?;
    let report = crate::report::write_bisect_md(&out_dir, &record)?;
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
    let summary = match &record.minimal_command {
        Some(minimal) => {
            let boundary = if minimal.passes_once.is_empty() {
                String::new()
            } else {
                format!("\npasses once {}", minimal.passes_once.join(", or once "))
            };
            format!("{summary}\nminimal failing command:\n  {}{boundary}", minimal.line)
        }
        None => summary,
    };
    let summary = crate::secrets::mask_rendered(&summary, &record);
    if args.json {
        eprintln!("{summary}\nreport: {}", report.display());
        crate::output::write_json(crate::output::Stream::Stdout, &record);
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
