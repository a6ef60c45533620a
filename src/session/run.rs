//! `ups-doctor run`: load and check every scenario, read the machine once, run each scenario on
//! this node or as one node of several, save the result as each ends, and print the matrix.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use super::invocation::{Invocation, current_exe};
use super::out_dir::{out_dir_or_fresh, sanitize};
use super::preflight::{check_gpus, check_memory_limits, check_trainer};
use super::save::save_honestly;
use crate::harness::run::interrupt::{self, INTERRUPTED};
use crate::harness::{self, ScenarioInput};
use crate::nodes::NodeConfig;
use crate::nodes::config::NodeFlags;
use crate::output::Stream;
use crate::report::live::{Progress, ProgressMode};
use crate::scenario::{self, Override};
use crate::schema::RunResult;
use crate::{Error, exit, report};

/// What `ups-doctor run` was asked, as plain data (the CLI converts its flags into this).
pub struct RunRequest {
    /// Scenario files or folders; empty means `scenarios/`.
    pub paths: Vec<PathBuf>,
    pub set: Vec<Override>,
    pub out: Option<PathBuf>,
    pub json: bool,
    pub quiet: bool,
    pub public: bool,
    pub node: NodeFlags,
    /// The user's command, after `--` (`dashdash`: a `--` was given, even with nothing after it).
    pub command: Vec<String>,
    pub dashdash: bool,
    pub options: super::command::CommandOptions,
}

/// Runs the request; the exit status as [`exit`] documents it.
pub fn run(request: RunRequest) -> Result<u8, Error> {
    interrupt::install_handler();
    let node = NodeConfig::resolve(&request.node, &|name| std::env::var(name).ok())
        .map_err(|e| Error::BadInput(e.to_string()))?;
    let inputs = if request.dashdash {
        if !request.paths.is_empty() {
            return Err(Error::BadInput(format!(
                "`ups-doctor run` was given both scenario files ({}) and a command after `--`\n  hint: run one \
                 or the other: the command is the scenario (its options: `ups-doctor run --help`)",
                request.paths.iter().map(|p| format!("`{}`", p.display())).collect::<Vec<_>>().join(", ")
            )));
        }
        let scenario = super::command::scenario(&request.command, &request.options, &request.set)?;
        if node.is_none()
            && scenario.launch.nodes <= 1
            && let Some((count, flag)) = crate::scenario::declared_nodes(&request.command)
        {
            // Said before the wait, not only in the verdict after it.
            eprintln!(
                "warning: `{flag}`: the launcher starts its ranks once {count} nodes have joined its rendezvous, and \
                 this run starts it on this machine only; start it on the other nodes too (each under \
                 `ups-doctor run --nodes {count} --node-rank R --coordinator HOST:PORT -- …` for one report), or \
                 play every node here with `--set launch.nodes={count}`"
            );
        }
        vec![ScenarioInput {
            file: PathBuf::from(super::command::ORIGIN),
            overrides: request.set.iter().map(|o| o.raw.clone()).collect(),
            scenario,
        }]
    } else {
        request.options.none_given()?;
        load_all(&request.paths, &request.set)?
    };
    let program = current_exe()?;
    check_trainer(&inputs, &program)?;
    // The facts that take a process of their own are asked while the run goes on.
    let (machine, pending) =
        crate::probe::machine_started(&harness::machine_needs(inputs.iter().map(|i| &i.scenario), &program));
    check_gpus(&inputs, &machine)?;
    check_memory_limits(&inputs)?;
    harness::limits::check_open_files(&inputs).map_err(|e| Error::BadInput(e.to_string()))?;
    check_node_placement(node.as_ref(), &inputs)?;
    let out_dir = out_dir_or_fresh(request.out.clone(), "")?;
    if request.dashdash {
        // The equivalent scenario file: `ups-doctor run OUT/scenario.json` runs the command again.
        let file = out_dir.join("scenario.json");
        crate::run_files::replace(&file, (inputs[0].scenario.file_json() + "\n").as_bytes())
            .map_err(|source| Error::Io { what: "write", path: file.clone(), source })?;
    }
    let mode = if request.quiet { ProgressMode::Quiet } else { ProgressMode::detect() };
    let mut session = Session {
        invocation: Invocation::new(&out_dir, request.public),
        progress: Progress::new(mode),
        program,
        pending: Some(pending),
        result: RunResult {
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            started_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            command: std::env::args().collect(),
            environment: machine,
            scenarios: Vec::new(),
            not_run: Vec::new(),
            interrupted: false,
            stopped_by: None,
            logs_cut: Vec::new(),
        },
    };
    if let Some(config) = &node {
        return session.run_as_node(config, &inputs[0], request.json);
    }
    session.run_here(&inputs, mode)?;
    session.print(request.json)
}

/// Loads every scenario before running any: a typo in the fifth file must not cost the time of
/// the first four, and every bad file is reported at once.
fn load_all(paths: &[PathBuf], set: &[Override]) -> Result<Vec<ScenarioInput>, Error> {
    let paths = if paths.is_empty() { vec![PathBuf::from("scenarios")] } else { paths.to_vec() };
    let mut inputs = Vec::new();
    let mut errors = Vec::new();
    for file in scenario::scenario_files(&paths)? {
        match scenario::load_file(&file, set) {
            Ok(scenario) => inputs.push(ScenarioInput {
                file,
                overrides: set.iter().map(|o| o.raw.clone()).collect(),
                scenario,
            }),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() { Ok(inputs) } else { Err(Error::Scenarios(errors)) }
}

/// A node of several runs exactly one scenario, with the same node count as its peers.
fn check_node_placement(node: Option<&NodeConfig>, inputs: &[ScenarioInput]) -> Result<(), Error> {
    let Some(config) = node else { return Ok(()) };
    if inputs.len() != 1 {
        return Err(Error::BadInput(format!(
            "a multi-node run runs one scenario; {} were given: run each with its own `ups-doctor run FILE --nodes …`",
            inputs.len()
        )));
    }
    let input = &inputs[0];
    if ![1, config.nodes].contains(&input.scenario.launch.nodes) {
        return Err(Error::BadInput(format!(
            "{}: `launch.nodes` is {}, but this agent was placed as one of {} nodes ({}): give every node the same count",
            input.file.display(),
            input.scenario.launch.nodes,
            config.nodes,
            config.source
        )));
    }
    Ok(())
}

/// One invocation's state while its scenarios run.
struct Session {
    invocation: Invocation,
    progress: Progress,
    /// The `ups-doctor` binary (node agents are started as it; ranks as the trainer beside it).
    program: PathBuf,
    /// The machine facts still being asked for: added before the result is first saved.
    pending: Option<crate::probe::Pending>,
    result: RunResult,
}

impl Session {
    fn save(&mut self) -> Result<(), Error> {
        if let Some(pending) = self.pending.take() {
            pending.finish(&mut self.result.environment);
        }
        save_honestly(&self.invocation.out_dir, &self.invocation.shown(&self.result)?)
    }

    /// Every scenario on this machine (a multi-node one through local node agents), in order,
    /// saving after each; an interrupt stops before the next.
    fn run_here(&mut self, inputs: &[ScenarioInput], mode: ProgressMode) -> Result<(), Error> {
        let width = inputs.len().to_string().len();
        let out_dir = self.invocation.out_dir.clone();
        for (i, input) in inputs.iter().enumerate() {
            if INTERRUPTED.load(Ordering::SeqCst) {
                self.result.interrupted = true;
                self.result.not_run = names(&inputs[i..]);
                self.save()?;
                break;
            }
            let rel = format!("{:0width$}-{}", i + 1, sanitize(&input.scenario.name));
            let outcome = crate::nodes::local::run_scenario(
                input,
                &self.program,
                &out_dir,
                &rel,
                &mut self.progress,
                &INTERRUPTED,
            );
            let scenario_result = match outcome {
                Ok(r) => r,
                Err(e) => {
                    let e = e.to_string();
                    // What is on disk must say the run stopped here, and why.
                    self.result.stopped_by = Some(e.clone());
                    self.result.not_run = names(&inputs[i..]);
                    self.save()?;
                    return Err(Error::Internal(e));
                }
            };
            if mode != ProgressMode::Quiet {
                let width = harness::os::terminal_columns().unwrap_or(usize::MAX);
                eprintln!("{}", report::render_verdict_lines(&scenario_result, width));
            }
            let cut_short = scenario_result.interrupted;
            self.result.scenarios.push(scenario_result);
            if cut_short {
                self.result.interrupted = true;
                self.result.not_run = names(&inputs[i + 1..]);
            }
            self.save()?;
            if cut_short {
                break;
            }
        }
        Ok(())
    }

    /// This machine as one node of several: node 0 coordinates and writes the run's one report;
    /// another node keeps its own view and points at node 0's.
    fn run_as_node(mut self, config: &NodeConfig, input: &ScenarioInput, json: bool) -> Result<u8, Error> {
        use crate::nodes::net::NodeError;
        use crate::nodes::run::{Finished, NodeRequest, finish, run_node};
        let out_dir = self.invocation.out_dir.clone();
        let rel = format!("1-{}", sanitize(&input.scenario.name));
        let request = NodeRequest {
            config,
            input,
            program: &self.program,
            out_dir: &out_dir,
            rel: &rel,
            progress: &mut self.progress,
            interrupted: &INTERRUPTED,
        };
        match run_node(request) {
            Err(NodeError::BadInput(m)) => Err(Error::BadInput(m)),
            Err(NodeError::Internal(m)) => {
                self.result.stopped_by = Some(m.clone());
                self.result.not_run = vec![input.scenario.name.clone()];
                self.save()?;
                Err(Error::Internal(m))
            }
            Ok(Finished::Coordinator { result: merged, coordinator }) => {
                self.result.interrupted = merged.interrupted;
                self.result.scenarios.push(merged);
                self.save()?;
                let met = self.result.scenarios.iter().all(|s| s.met_expectation);
                finish(&coordinator, met, &out_dir.join(report::REPORT_FILE).display().to_string());
                self.print(json)
            }
            Ok(Finished::Agent { result: own, met, report }) => {
                self.result.interrupted = own.interrupted;
                self.result.scenarios.push(own);
                self.save()?;
                // This node's own view is in its --out; the one report of the run is node 0's.
                let report_path = out_dir.join(report::REPORT_FILE);
                let Some(met) = met else {
                    return Err(Error::Internal(format!(
                        "node 0 (the coordinator) went away before it wrote the run's report; this node's own view: {}",
                        report_path.display()
                    )));
                };
                println!(
                    "node {}: the run's report is on node 0: {}\nthis node's own view: {}",
                    config.node,
                    report.unwrap_or_default(),
                    report_path.display()
                );
                Ok(status(self.result.interrupted, met))
            }
        }
    }

    /// The matrix and the report's path (stderr with `--json`, which prints the result instead).
    fn print(&self, json: bool) -> Result<u8, Error> {
        let color = !json
            && std::io::stdout().is_terminal()
            && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        let matrix = match harness::os::terminal_columns() {
            Some(width) => report::render_matrix_fit(&self.result, color, width),
            None => report::render_matrix(&self.result, color),
        };
        let report_path = self.invocation.out_dir.join(report::REPORT_FILE);
        if json {
            crate::output::write_styled(Stream::Stderr, &format!("{matrix}\n"));
            eprintln!("report: {}", report_path.display());
            crate::output::write_json(Stream::Stdout, &self.invocation.shown(&self.result)?);
        } else {
            crate::output::write_styled(Stream::Stdout, &format!("{matrix}\n"));
            println!("report: {}", report_path.display());
        }
        Ok(status(self.result.interrupted, self.result.scenarios.iter().all(|s| s.met_expectation)))
    }
}

fn names(inputs: &[ScenarioInput]) -> Vec<String> {
    inputs.iter().map(|s| s.scenario.name.clone()).collect()
}

/// The exit status of a run that ended (interrupted wins over met).
fn status(interrupted: bool, met: bool) -> u8 {
    if interrupted {
        exit::INTERRUPTED
    } else if met {
        exit::MET
    } else {
        exit::NOT_MET
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interrupted_run_exits_130_whether_or_not_it_met() {
        assert_eq!(status(true, true), exit::INTERRUPTED);
        assert_eq!(status(true, false), exit::INTERRUPTED);
        assert_eq!(status(false, true), exit::MET);
        assert_eq!(status(false, false), exit::NOT_MET);
    }
}
