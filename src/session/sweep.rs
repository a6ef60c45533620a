//! `ups-doctor sweep SCENARIO --vary path=v1,v2 …`: load every point before any runs (a bad
//! value is exit 2, naming the `--vary` and the fix), read the machine once, then run the
//! points under the same harness as `run`: round after round (interleaved, so that a drift of
//! the machine spreads over every point), after a thrown-away warm-up, within `--budget`. Each
//! run keeps its own run folder; each finished run is cached in the out folder by configuration
//! hash, so the same command resumes an interrupted sweep. `sweep.json` and `sweep.md` are
//! rewritten after every run.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::invocation::current_exe;
use super::out_dir::{out_dir_or_fresh, sanitize};
use super::preflight::{check_gpus, check_memory_limits, check_trainer};
use super::save::save_honestly;
use crate::harness::run::events::Silent;
use crate::harness::run::interrupt::{self, INTERRUPTED};
use crate::harness::{self, ScenarioInput};
use crate::scenario::{self, Override, ScenarioError};
use crate::schema::{EnvSummary, RunResult, ScenarioResult};
use crate::sweep::{self, PointRecord, PointRun, SweepRecord};
use crate::{Error, exit, report};

/// What `ups-doctor sweep` was asked, as plain data.
pub struct SweepRequest {
    /// The scenario file; `None` with a command.
    pub scenario: Option<PathBuf>,
    pub set: Vec<Override>,
    /// Each `--vary` as written.
    pub vary: Vec<String>,
    /// Each `-L NAME V1,V2` as (NAME, V1,V2).
    pub lists: Vec<(String, String)>,
    /// The command after `--`, placeholders and all.
    pub command: Vec<String>,
    /// What `run -- CMD` takes about a command (`--env`, `--cwd`, limits, …), for every point.
    pub options: super::command::CommandOptions,
    pub runs: usize,
    pub warmup: usize,
    pub budget: usize,
    pub out: Option<PathBuf>,
    pub json: bool,
    pub quiet: bool,
}

/// One point of the grid, ready to run.
struct Point {
    settings: Vec<Override>,
    input: ScenarioInput,
    hash: String,
    /// `points/NN-name`, relative to the sweep folder.
    dir: String,
    runs: Vec<PointRun>,
    /// Fields of the configuration left at their defaults at this point, where they do not apply,
    /// and why (`data.worker_threads`: `inherit` only matters with `start_method: fork`).
    dropped: Vec<String>,
}

/// Runs the sweep; the exit status as [`exit`] documents it (0: every point met its `expect`).
pub fn sweep(mut args: SweepRequest) -> Result<u8, Error> {
    interrupt::install_handler();
    for (flag, value) in [("--runs", args.runs), ("--budget", args.budget)] {
        if value == 0 {
            return Err(Error::BadInput(format!("`{flag} 0`: must be at least 1")));
        }
    }
    let mut axes: Vec<sweep::Axis> = args
        .vary
        .iter()
        .map(|raw| sweep::parse_vary(raw))
        .collect::<Result<_, _>>()
        .map_err(|e: sweep::GridError| Error::BadInput(e.to_string()))?;
    let lists = from_command(&mut args)?;
    args.vary = lists.iter().map(|a| a.raw.clone()).chain(args.vary.iter().cloned()).collect();
    axes.splice(0..0, lists);
    sweep::check_axes(&axes, &args.set).map_err(|e| Error::BadInput(e.to_string()))?;
    let base = scenario::load_file(args.file(), &args.set)?;
    let mut points = load_points(&args, &axes)?;
    let inputs: Vec<ScenarioInput> = points.iter().map(|p| p.input.clone()).collect();
    let program = current_exe()?;
    check_trainer(&inputs, &program)?;
    let machine =
        crate::probe::machine(&harness::machine_needs(inputs.iter().map(|i| &i.scenario), &program));
    check_gpus(&inputs, &machine)?;
    check_memory_limits(&inputs)?;
    harness::limits::check_open_files(&inputs).map_err(|e| Error::BadInput(e.to_string()))?;
    let out_dir = out_dir_or_fresh(args.out.clone(), &format!("-sweep-{}", sanitize(&base.name)))?;
    for p in &mut points {
        p.runs = read_cache(&out_dir, &p.hash);
    }
    let mut sweep = Sweep {
        out_dir,
        program,
        machine,
        quiet: args.quiet,
        record: SweepRecord {
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            started_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            command: std::env::args().collect(),
            scenario_file: args.file().display().to_string(),
            scenario_name: base.name.clone(),
            set: args.set.iter().map(|o| o.raw.clone()).collect(),
            vary: args.vary.clone(),
            runs_per_point: args.runs,
            warmup_runs: 0,
            budget: args.budget,
            real_runs: 0,
            budget_exhausted: false,
            interrupted: false,
            disk_full: None,
            points: Vec::new(),
            verdict: Default::default(),
        },
    };
    let cached: usize = points.iter().map(|p| p.runs.len().min(args.runs)).sum();
    if !args.quiet {
        eprintln!(
            "sweeping {} over {} ({} each, budget {} runs{})",
            args.file().display(),
            plural_points(points.len()),
            if args.runs == 1 { "1 run".to_string() } else { format!("{} runs", args.runs) },
            args.budget,
            if cached > 0 {
                format!("; {cached} cached from an earlier sweep in this folder")
            } else {
                String::new()
            }
        );
    }
    sweep.run_rounds(&mut points, args.runs, args.warmup, args.budget)?;
    let saved = match sweep.save_kept(&points) {
        Ok(()) => true,
        Err(_) if sweep.record.disk_full.is_some() => false,
        Err(e) => return Err(e),
    };
    sweep.print(args.json, saved)
}

/// The disk of the sweep's folder filled, as the error says it: `ENOSPC` or `EDQUOT`, with the
/// file it names. A failure of the run's own saving is kept in its own words (`failed to write
/// the result: … (os error 28)`); a run that could not even start says it in words only, and is
/// read by the system's error number in them.
fn disk_full(e: &Error, folder: &Path) -> Option<sweep::DiskFull> {
    const FULL: [i32; 2] = [libc::ENOSPC, libc::EDQUOT];
    let full = |io: &std::io::Error| io.raw_os_error().is_some_and(|n| FULL.contains(&n));
    let (path, error) = match e {
        Error::Io { path, source, .. }
        | Error::Report(
            report::ReportError::Write { path, source } | report::ReportError::CreateDir { path, source },
        ) if full(source) => (Some(path.display().to_string()), source.to_string()),
        Error::Save(saving) if saving.io().is_some_and(full) => (None, saving.to_string()),
        Error::Internal(text) if FULL.iter().any(|n| text.contains(&format!("(os error {n})"))) => {
            (None, text.clone())
        }
        _ => return None,
    };
    Some(sweep::DiskFull { folder: folder.display().to_string(), path, error })
}

impl SweepRequest {
    /// The scenario file every point starts from (a command's is written by [`from_command`]).
    fn file(&self) -> &Path {
        self.scenario.as_deref().unwrap_or(Path::new(super::command::ORIGIN))
    }
}

/// A command after `--`: its scenario file, written into the sweep's folder (which it creates,
/// and which `--out` then names), and an axis per `-L NAME V1,V2` over `params.NAME`, which fills
/// the command's `{NAME}`. An `-L` that fills the launcher's rank flag (`--nproc_per_node
/// {ranks}`) sets `launch.world_size` with it. Without a command, checks that there is a scenario
/// and no `-L`.
fn from_command(args: &mut SweepRequest) -> Result<Vec<sweep::Axis>, Error> {
    const FORMS: &str = "give a scenario file and `--vary PATH=V1,V2`, or a command: `ups-doctor sweep -L \
                         workers 0,2 -- python train.py --num-workers {workers}`";
    match (&args.scenario, args.command.is_empty()) {
        (Some(file), false) => {
            return Err(Error::BadInput(format!(
                "both a scenario file (`{}`) and a command after `--`: {FORMS}",
                file.display()
            )));
        }
        (None, true) => return Err(Error::BadInput(format!("nothing to sweep: {FORMS}"))),
        (Some(_), true) => {
            if let Some((name, list)) = args.lists.first() {
                return Err(Error::BadInput(format!(
                    "`-L {name} {list}` fills a placeholder of a command, and there is none after `--`: for a \
                     scenario file use `--vary params.{name}={list}` (or any field), else {FORMS}"
                )));
            }
            args.options.none_given()?;
            return Ok(Vec::new());
        }
        (None, false) => {}
    }
    if args.lists.is_empty() && args.vary.is_empty() {
        return Err(Error::BadInput(format!("nothing to sweep over: {FORMS}")));
    }
    let argv = args.command.clone();
    let mut file = super::command::scenario_file(&argv, &args.options)?;
    let rank_flag = super::command::rank_flag_value(&argv);
    let mut axes = Vec::new();
    for (name, list) in &args.lists {
        let mut axis = sweep::parse_list(name, list).map_err(|e| Error::BadInput(e.to_string()))?;
        let placeholder = format!("{{{name}}}");
        if !argv.iter().any(|a| a.contains(&placeholder)) {
            return Err(Error::BadInput(format!(
                "`-L {name} {list}`: the command has no `{placeholder}`\n  hint: put `{placeholder}` where the value \
                 goes, e.g. `--num-workers {placeholder}`"
            )));
        }
        file["params"][name.as_str()] = axis.values[0].value.clone();
        if rank_flag.as_deref() == Some(placeholder.as_str()) {
            axis.also.push("launch.world_size".to_string());
            file["launch"]["world_size"] = axis.values[0].value.clone();
        }
        axes.push(axis);
    }
    let (path, out) = super::command::write_scenario(&file, args.out.clone(), "sweep")?;
    args.scenario = Some(path);
    args.out = Some(out);
    Ok(axes)
}

fn plural_points(n: usize) -> String {
    if n == 1 { "1 point".to_string() } else { format!("{n} points") }
}

/// Every point loaded and validated before anything runs; every bad one reported at once.
fn load_points(args: &SweepRequest, axes: &[sweep::Axis]) -> Result<Vec<Point>, Error> {
    let grid = sweep::points(axes);
    let width = grid.len().to_string().len();
    let mut points = Vec::new();
    let mut failed: Vec<(usize, Vec<Override>, ScenarioError)> = Vec::new();
    for (i, settings) in grid.into_iter().enumerate() {
        let all: Vec<Override> = args.set.iter().chain(&settings).cloned().collect();
        match scenario::load_file(args.file(), &all) {
            Ok(s) => points.push(point(args, i, width, settings, all, s, Vec::new())),
            Err(e) => failed.push((i, settings, e)),
        }
    }
    // A field of the configuration (not of the grid) that a point's values make meaningless
    // (`worker_threads: inherit` at `start_method: spawn`) is left at its default there, with a
    // note, where it stands at other points: the grid still asks its question. A field no point
    // takes is the user's to fix.
    let varied = |field: &str| axes.iter().any(|a| a.values.iter().any(|v| v.path == field));
    let mut errors: Vec<ScenarioError> = Vec::new();
    for (i, settings, mut e) in failed {
        let from_grid = e.from_override.as_ref().is_none_or(|raw| settings.iter().any(|o| &o.raw == raw));
        let field = e.field.clone().filter(|f| !points.is_empty() && !varied(f) && from_grid);
        let default = field.as_deref().and_then(|f| {
            let value = scenario::lookup(&scenario::Scenario::default(), f)?;
            let text = value.as_str().map_or_else(|| value.to_string(), str::to_string);
            Some(Override { path: f.to_string(), raw: format!("{f}={text}"), value })
        });
        if let Some(default) = default {
            let mut all: Vec<Override> = args.set.iter().chain(&settings).cloned().collect();
            all.push(default.clone());
            if let Ok(s) = scenario::load_file(args.file(), &all) {
                let why = format!("`{}` left at its default here: {}", default.raw, e.message);
                points.push(point(args, i, width, settings, all, s, vec![why]));
                continue;
            }
        }
        // The value came from a `--vary`: say so, not `--set`, which the user never wrote.
        if let Some(axis) = e
            .from_override
            .as_ref()
            .and_then(|raw| axes.iter().find(|a| a.values.iter().any(|v| &v.raw == raw)))
        {
            let value = e.from_override.take().unwrap_or_default();
            e.message = format!("`--vary {}` gives `{value}`: {}", axis.raw, e.message);
        }
        if !errors.contains(&e) {
            errors.push(e);
        }
    }
    points.sort_by_key(|p| p.dir.clone());
    if errors.is_empty() { Ok(points) } else { Err(Error::Scenarios(errors)) }
}

/// Point `i` of the grid: its `settings`, every override it loads with (`all`) and its scenario.
fn point(
    args: &SweepRequest,
    i: usize,
    width: usize,
    settings: Vec<Override>,
    all: Vec<Override>,
    s: scenario::Scenario,
    dropped: Vec<String>,
) -> Point {
    let name: Vec<String> = settings
        .iter()
        .map(|o| {
            let field = o.path.rsplit('.').next().unwrap_or(&o.path);
            let value = o.raw.split_once('=').map_or("", |(_, v)| v);
            format!("{field}-{value}")
        })
        .collect();
    Point {
        hash: crate::bisect::config_hash(&s),
        dir: format!("points/{:0width$}-{}", i + 1, sanitize(&name.join("_"))),
        input: ScenarioInput {
            file: args.file().to_path_buf(),
            overrides: all.iter().map(|o| o.raw.clone()).collect(),
            scenario: s,
        },
        settings,
        runs: Vec::new(),
        dropped,
    }
}

/// The runs of one configuration that earlier sweeps in this folder finished.
fn read_cache(out_dir: &Path, hash: &str) -> Vec<PointRun> {
    let text = std::fs::read_to_string(cache_file(out_dir, hash)).ok();
    let mut runs: Vec<PointRun> = text.and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default();
    for r in &mut runs {
        r.cached = true;
    }
    runs
}

fn cache_file(out_dir: &Path, hash: &str) -> PathBuf {
    out_dir.join("cache").join(format!("{hash}.json"))
}

/// One sweep's state while its points run.
struct Sweep {
    out_dir: PathBuf,
    program: PathBuf,
    machine: EnvSummary,
    quiet: bool,
    record: SweepRecord,
}

impl Sweep {
    /// Round `r` gives every point its `r`-th run (points cached that far are skipped); the
    /// warm-up goes before the first real run. Stops at the budget or an interrupt.
    fn run_rounds(
        &mut self,
        points: &mut [Point],
        runs: usize,
        warmup: usize,
        budget: usize,
    ) -> Result<(), Error> {
        let total = points.len();
        for round in 0..runs {
            for i in 0..total {
                if points[i].runs.len() > round {
                    continue;
                }
                if INTERRUPTED.load(Ordering::SeqCst) {
                    self.record.interrupted = true;
                    return Ok(());
                }
                while self.record.warmup_runs < warmup && self.record.real_runs < budget {
                    let rel = format!("warmup/run-{}", self.record.warmup_runs + 1);
                    let r = match self.run_once(&points[i].input, &rel) {
                        Ok(r) => r,
                        Err(e) => return self.stop_if_disk_full(e),
                    };
                    self.record.real_runs += 1;
                    self.record.warmup_runs += 1;
                    if !self.quiet {
                        eprintln!(
                            "  warm-up  {}  →  {} (thrown away)",
                            sweep::label(&points[i].settings),
                            r.outcome.as_str()
                        );
                    }
                    if r.interrupted {
                        self.record.interrupted = true;
                        return Ok(());
                    }
                }
                if self.record.real_runs >= budget {
                    self.record.budget_exhausted = true;
                    return Ok(());
                }
                let rel = next_run_dir(&self.out_dir, &points[i].dir);
                let result = match self.run_once(&points[i].input, &rel) {
                    Ok(result) => result,
                    Err(e) => return self.stop_if_disk_full(e),
                };
                self.record.real_runs += 1;
                if result.interrupted {
                    // Cut short by the user: says nothing about the configuration, never cached.
                    self.record.interrupted = true;
                    return Ok(());
                }
                let run = sweep::summarise_run(&result, rel);
                if !self.quiet {
                    eprintln!(
                        "  point {}/{total} run {}/{runs}  {}  →  {}{}  ({:.1} s)",
                        i + 1,
                        round + 1,
                        sweep::label(&points[i].settings),
                        result.outcome.as_str(),
                        result.samples_per_s.map_or(String::new(), |s| format!(", {s:.1} samples/s")),
                        result.wall_s
                    );
                }
                points[i].runs.push(run);
                if let Err(e) = self.cache(&points[i]).and_then(|()| self.save(points)) {
                    return self.stop_if_disk_full(e);
                }
            }
        }
        Ok(())
    }

    /// A full disk stops the sweep where it is (recorded, said in `sweep.md` and on the
    /// terminal, what ran kept); any other failure is ups-doctor's own error.
    fn stop_if_disk_full(&mut self, e: Error) -> Result<(), Error> {
        let full = disk_full(&e, &self.out_dir).ok_or(e)?;
        self.record.disk_full.get_or_insert(full);
        Ok(())
    }

    /// [`Sweep::save`], and on a full disk again after making room as a run does for its result:
    /// ups-doctor's own copies of `sitecustomize.py` in the run folders first, then this sweep's
    /// own largest logs halved (each ends with a note saying so). A `sweep.md` that could not be
    /// written again is removed, so that none is left saying the sweep ended another way.
    fn save_kept(&mut self, points: &[Point]) -> Result<(), Error> {
        let mut saved = self.save(points);
        let mut sites_removed = false;
        loop {
            let Err(e) = &saved else { return saved };
            let Some(full) = disk_full(e, &self.out_dir) else { return saved };
            self.record.disk_full.get_or_insert(full);
            if !sites_removed {
                sites_removed = true;
                for dir in run_folders(&self.out_dir) {
                    report::remove_own_sites(&dir);
                }
            } else if crate::harness::make_room(&self.out_dir, 1 << 20) == 0 {
                break;
            }
            saved = self.save(points);
        }
        let _ = std::fs::remove_file(self.out_dir.join("sweep.md"));
        saved
    }

    /// One supervised run in its own run folder (`result.json`, `report.md`, the logs).
    fn run_once(&self, input: &ScenarioInput, rel: &str) -> Result<ScenarioResult, Error> {
        let dir = self.out_dir.join(rel);
        std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
            what: "create",
            path: dir.clone(),
            source,
        })?;
        let scenario_rel = format!("1-{}", sanitize(&input.scenario.name));
        let result = crate::nodes::local::run_scenario(
            input,
            &self.program,
            &dir,
            &scenario_rel,
            &mut Silent,
            &INTERRUPTED,
        )
        // Internal whatever the cause, and in words: `disk_full` reads a full disk from them.
        .map_err(|e| Error::Internal(e.to_string()))?;
        let run = RunResult {
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            started_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            command: std::env::args().collect(),
            environment: self.machine.clone(),
            scenarios: vec![result.clone()],
            not_run: Vec::new(),
            interrupted: result.interrupted,
            stopped_by: None,
            logs_cut: Vec::new(),
        };
        save_honestly(&dir, &run)?;
        Ok(result)
    }

    fn cache(&self, p: &Point) -> Result<(), Error> {
        let path = cache_file(&self.out_dir, &p.hash);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| Error::Io {
                what: "create",
                path: parent.to_path_buf(),
                source,
            })?;
        }
        // Masked as the outputs are: the headlines quote the program, which may print a secret the
        // sweep's command line holds (learnt as each point's scenario started).
        report::write_json(&path, &p.runs, true)?;
        Ok(())
    }

    /// `sweep.json` and `sweep.md` as things stand.
    fn save(&mut self, points: &[Point]) -> Result<(), Error> {
        self.record.points = points
            .iter()
            .enumerate()
            .map(|(i, p)| PointRecord {
                index: i + 1,
                label: sweep::label(&p.settings),
                settings: p.settings.iter().map(|o| o.raw.clone()).collect(),
                world_size: p.input.scenario.launch.world_size,
                hash: p.hash.clone(),
                summary: sweep::summarise_point(&p.runs),
                runs: p.runs.clone(),
                dropped: p.dropped.clone(),
            })
            .collect();
        self.record.verdict = sweep::judge(&self.record.points);
        // Masked as every output is: both may be pasted into an issue.
        report::write_json(&self.out_dir.join("sweep.json"), &self.record, true)?;
        report::write_text(&self.out_dir.join("sweep.md"), &report::render_sweep(&self.record))?;
        Ok(())
    }

    /// The verdict, the table and where the report is (stderr with `--json`, which prints
    /// `sweep.json` instead).
    fn print(&self, json: bool, saved: bool) -> Result<u8, Error> {
        let report = if saved {
            self.out_dir.join("sweep.md").display().to_string()
        } else {
            "none: the disk is full (what ran is in its run folders and `cache/`)".to_string()
        };
        let text = format!(
            "{}\n{}\nreport: {report}",
            report::verdict_lines(&self.record, false).join("\n"),
            report::render_sweep_table(&self.record),
        );
        if json {
            eprintln!("{text}");
            crate::output::write_json(crate::output::Stream::Stdout, &self.record);
        } else {
            println!("{text}");
        }
        let met =
            self.record.points.iter().all(|p| !p.runs.is_empty() && p.runs.iter().all(|r| r.met_expectation));
        Ok(if self.record.interrupted {
            exit::INTERRUPTED
        } else if self.record.disk_full.is_some() {
            // A folder ups-doctor could not write: the sweep did not end, and no point failed.
            exit::INTERNAL
        } else if met && !self.record.budget_exhausted {
            exit::MET
        } else {
            exit::NOT_MET
        })
    }
}

/// `points/NN-name/run-K` with the first K whose folder does not exist (a run cut short by an
/// interrupt left its folder, but no cache entry).
fn next_run_dir(out_dir: &Path, point_dir: &str) -> String {
    (1..).map(|k| format!("{point_dir}/run-{k}")).find(|rel| !out_dir.join(rel).exists()).expect("unbounded")
}

/// The run folders of a sweep: `points/NN-name/run-K/` and `warmup/run-K/` (real folders only).
fn run_folders(out_dir: &Path) -> Vec<PathBuf> {
    let folders = |dir: &Path| -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
        entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()).collect()
    };
    let points = folders(&out_dir.join("points")).into_iter().flat_map(|p| folders(&p));
    points.chain(folders(&out_dir.join("warmup"))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_whose_result_could_not_be_saved_on_a_full_disk_stops_the_sweep_in_its_own_words() {
        let save = |errno: i32| {
            Error::Save(report::SaveError::Result {
                source: Box::new(report::ReportError::Write {
                    path: "out/1/result.json".into(),
                    source: std::io::Error::from_raw_os_error(errno),
                }),
                stale_kept: false,
            })
        };
        let full = disk_full(&save(libc::ENOSPC), Path::new("out")).expect("a full disk");
        assert_eq!(full.path, None);
        assert_eq!(full.error, save(libc::ENOSPC).to_string());
        assert!(full.error.starts_with("failed to write the result: could not write `out/1/result.json`: "));
        assert!(disk_full(&save(libc::EACCES), Path::new("out")).is_none());
    }
}
