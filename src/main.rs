//! The `ups-doctor` command line: parses arguments ([`cli`]), dispatches to a session of
//! [`ups_doctor::session`], and maps every result to the documented exit status
//! ([`ups_doctor::exit`]: 0 every scenario met its `expect`, 1 some did not, 2 bad input, 3 internal
//! error, 130 interrupted), listed at the end of `--help`.
//!
//! This binary never loads libtorch: ranks of the built-in scenarios run `ups-doctor-trainer`.

mod cli;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command};
use ups_doctor::session::{self, EnvFormat};
// Printing that survives a reader who left (`| head -1`): see ups_doctor::output.
use ups_doctor::eprintln;

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Run(args) => {
            // clap drops a bare `--`; `run --` with nothing after it is still a command (missing).
            let dashdash = std::env::args().skip_while(|a| a != "run").any(|a| a == "--");
            session::run(args.into_request(dashdash))
        }
        Command::Bisect(args) => session::bisect(args.into()),
        Command::Sweep(args) => session::sweep(args.into()),
        Command::Attach(args) => ups_doctor::attach::command(args),
        Command::Report { dir, public, issue, bundle } => session::rerender(&dir, public, issue, bundle),
        Command::Env { json, markdown, public } => {
            let format = if json {
                EnvFormat::Json
            } else if markdown {
                EnvFormat::Markdown
            } else {
                EnvFormat::Text
            };
            session::print_env(format, public)
        }
        Command::NvmlRecord { count, every_ms } => session::nvml_record(count, every_ms),
        Command::Train { scenario, set, loader_only } => {
            let mut args: Vec<OsString> = vec![scenario.into()];
            for o in set {
                args.extend(["--set".into(), o.raw.into()]);
            }
            if loader_only {
                args.push("--loader-only".into());
            }
            Err(session::train(&args))
        }
    };
    match result {
        Ok(status) => ExitCode::from(status),
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}
