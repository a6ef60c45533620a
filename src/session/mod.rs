//! The commands' sessions: what `main` dispatches to once the command line is plain data. Each
//! reads the machine once, checks what it can before anything runs, runs through the harness (or
//! bisect), saves as it goes and prints where the report is. Exit statuses are [`crate::exit`]'s.
//!
//! Nothing here parses flags (that is `main`'s CLI) or decides a verdict (that is `diagnose`).

mod bisect;
mod command;
mod invocation;
mod out_dir;
mod preflight;
mod run;
mod save;
mod sweep;

use std::path::Path;

pub use bisect::{BisectRequest, bisect};
pub use command::CommandOptions;
pub use out_dir::{fresh_run_dir, sanitize};
pub use run::{RunRequest, run};
pub use sweep::{SweepRequest, sweep};

use invocation::current_exe;

use crate::report;
use crate::{Error, exit};

/// `ups-doctor report DIR [--public] [--issue] [--bundle]`: re-renders the report (and
/// `trace.json`) from `result.json`; with `--issue` prints the text to paste and lists the files to
/// attach; with `--bundle` also writes them, masked, into one archive to attach.
pub fn rerender(dir: &Path, public: bool, issue: bool, bundle: bool) -> Result<u8, Error> {
    if dir.join("bisect.json").is_file() && !dir.join(report::RESULT_FILE).exists() {
        return rerender_bisect(dir, public || issue || bundle);
    }
    if dir.is_dir() && !dir.join(report::RESULT_FILE).exists() {
        let dumps = report::read_dumps(dir).map_err(|e| Error::BadInput(e.to_string()))?;
        if !dumps.is_empty() {
            return report_flight_dumps(dir, &dumps, public || issue || bundle);
        }
    }
    let path = report::rerender_masked(dir, public)?;
    if issue {
        let run = report::read_run(dir)?;
        let text = report::issue_text(&run);
        print!("{}", text.paste);
        eprintln!(
            "ups-doctor: paste the {} characters above (from {}) into the issue and attach:",
            text.paste.chars().count(),
            path.display()
        );
        for file in &text.attach {
            eprintln!("  {}", dir.join(file).display());
        }
        eprintln!(
            "or all of it and every log tail in one file: ups-doctor report {} --bundle",
            dir.display()
        );
    } else {
        println!("{}", path.display());
    }
    if bundle {
        let report::Bundle { path, files, left_out } = report::write_bundle(dir)?;
        for why in &left_out {
            eprintln!("ups-doctor: left out of the bundle: {why}");
        }
        eprintln!(
            "ups-doctor: {} files, masked, in {} — attach it to the issue",
            files.len(),
            path.display()
        );
        println!("{}", path.display());
    }
    Ok(exit::MET)
}

/// `ups-doctor report DUMPS_DIR`: PyTorch Flight Recorder dumps taken elsewhere (one per rank),
/// matched across ranks into `DIR/ups-doctor-flight.md`.
fn report_flight_dumps(dir: &Path, dumps: &[report::FlightDump], flags: bool) -> Result<u8, Error> {
    if flags {
        return Err(Error::BadInput(format!(
            "`{}` holds Flight Recorder dumps, not a run: `--public`, `--issue` and `--bundle` apply to a run \
             folder; attach `{}` as it is",
            dir.display(),
            report::FLIGHT_REPORT_FILE
        )));
    }
    let path = dir.join(report::FLIGHT_REPORT_FILE);
    report::write_text(&path, &report::render_flight_dumps(dir, dumps))?;
    println!("{}", path.display());
    Ok(exit::MET)
}

/// `ups-doctor report BISECT_DIR`: re-renders `bisect.md` from `bisect.json`.
fn rerender_bisect(dir: &Path, flags: bool) -> Result<u8, Error> {
    if flags {
        return Err(Error::BadInput(format!(
            "`{}` is a bisect's folder: `--public`, `--issue` and `--bundle` apply to a run folder; attach \
             `bisect.md` as it is (it is masked)",
            dir.display()
        )));
    }
    let path = dir.join("bisect.json");
    let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
        what: "read",
        path: path.clone(),
        source,
    })?;
    let record: crate::bisect::BisectRecord = serde_json::from_str(&text).map_err(|e| {
        Error::BadInput(format!(
            "`{}` is not a bisect record (line {}, column {}: {e})\n  hint: pass the folder `ups-doctor bisect` \
             wrote, unchanged",
            path.display(),
            e.line(),
            e.column()
        ))
    })?;
    println!("{}", report::write_bisect_md(dir, &record)?.display());
    Ok(exit::MET)
}

/// How `ups-doctor env` prints the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvFormat {
    Text,
    Json,
    Markdown,
}

/// `ups-doctor env`: every fact, the Python on `PATH` and the trainer's libtorch included.
pub fn print_env(format: EnvFormat, public: bool) -> Result<u8, Error> {
    let doctor = current_exe()?;
    let trainer = crate::harness::trainer_program(&doctor);
    let needs = crate::probe::Needs { python: true, trainer: trainer.exists().then_some(trainer) };
    let mut env = crate::probe::machine(&needs);
    if public {
        env = report::public::mask(&env, report::public::home().as_deref())
            .map_err(|e| Error::Internal(e.to_string()))?;
    }
    match format {
        EnvFormat::Json => crate::output::write_json(crate::output::Stream::Stdout, &env),
        EnvFormat::Markdown => print!("{}", report::render_env_markdown(&env)),
        EnvFormat::Text => print!("{}", report::render_env_text(&env)),
    }
    Ok(exit::MET)
}

/// `ups-doctor nvml-record`: NVML readings of every GPU as JSON lines, for test fixtures.
pub fn nvml_record(count: u32, every_ms: u64) -> Result<u8, Error> {
    let mut sampler =
        crate::probe::nvml::Sampler::new().map_err(|e| Error::BadInput(format!("no GPU to record: {e}")))?;
    let start = std::time::Instant::now();
    for _ in 0..count {
        let sample = crate::harness::GpuSample { t_s: start.elapsed().as_secs_f64(), gpus: sampler.sample() };
        println!("{}", serde_json::to_string(&sample).expect("serialises"));
        std::thread::sleep(std::time::Duration::from_millis(every_ms));
    }
    Ok(exit::MET)
}

/// `ups-doctor train ARGS…`: becomes the trainer executable with the same arguments, so that one
/// rank runs exactly as the harness would start it (by hand, under torchrun or Slurm). Returns
/// only when the trainer could not be started.
pub fn train(args: &[std::ffi::OsString]) -> Error {
    use std::os::unix::process::CommandExt;
    let trainer = match current_exe() {
        Ok(doctor) => crate::harness::trainer_program(&doctor),
        Err(e) => return e,
    };
    let e = std::process::Command::new(&trainer).arg("train").args(args).exec();
    Error::Internal(format!(
        "failed to start the trainer `{}`: {e}: {}",
        trainer.display(),
        preflight::trainer_missing_hint()
    ))
}
