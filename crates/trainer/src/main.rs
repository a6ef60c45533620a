//! `ups-doctor-trainer`: the executable the harness starts for each rank of a built-in scenario,
//! and each data-loader worker started with `spawn` re-executes. It is the only executable that
//! loads libtorch; users reach it through `ups-doctor train`, which parses the same arguments and
//! executes this program (so `train` works by hand and under torchrun or Slurm).
//!
//! ```text
//! ups-doctor-trainer train SCENARIO [--set PATH=VALUE]… [--loader-only]
//! ups-doctor-trainer loader-worker CONFIG_JSON      (started by a rank, not by hand)
//! ups-doctor-trainer cuda-probe                     (prints CudaSupport as JSON)
//! ```
//!
//! The arguments are parsed by hand: `ups-doctor train` has already checked them with clap, and
//! this process starts once per rank and worker.

use std::path::Path;
use std::process::ExitCode;

use ups_doctor_core::scenario::{self, Override};
use ups_doctor_trainer as trainer;

/// Exit status for arguments this program does not understand (`ups-doctor`'s bad input).
const BAD_INPUT: u8 = 2;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["train", rest @ ..] => train(rest),
        ["loader-worker", config] => {
            trainer::prepare_process();
            ExitCode::from(trainer::loader::worker::run_spawned(config) as u8)
        }
        ["cuda-probe"] => {
            println!("{}", serde_json::to_string(&cuda_support()).expect("serialises"));
            ExitCode::SUCCESS
        }
        ["--version"] => {
            println!(
                "ups-doctor-trainer {} (libtorch {})",
                env!("CARGO_PKG_VERSION"),
                env!("UPS_DOCTOR_LIBTORCH_VERSION")
            );
            ExitCode::SUCCESS
        }
        _ => usage(&format!("unexpected arguments {args:?}")),
    }
}

fn usage(problem: &str) -> ExitCode {
    eprintln!(
        "error: {problem}\n  usage: ups-doctor-trainer train SCENARIO [--set PATH=VALUE]… [--loader-only]\n  hint: \
         `ups-doctor train --help` describes the arguments; this program is started by ups-doctor"
    );
    ExitCode::from(BAD_INPUT)
}

/// `train SCENARIO [--set PATH=VALUE]… [--loader-only]`, in any order after `train`.
fn train(args: &[&str]) -> ExitCode {
    // Before anything else: the crash handlers and the stack-dump thread must exist before tch
    // starts threads (they inherit the signal mask).
    trainer::prepare_process();
    let mut file = None;
    let mut set = Vec::new();
    let mut loader_only = false;
    let mut rest = args.iter();
    while let Some(&arg) = rest.next() {
        let value = match arg {
            "--loader-only" => {
                loader_only = true;
                continue;
            }
            "--set" => match rest.next() {
                Some(v) => *v,
                None => return usage("`--set` needs PATH=VALUE"),
            },
            a if a.starts_with("--set=") => &a["--set=".len()..],
            a if a.starts_with('-') => return usage(&format!("unknown option `{a}`")),
            a if file.is_none() => {
                file = Some(a);
                continue;
            }
            a => return usage(&format!("a second scenario file `{a}`")),
        };
        match value.parse::<Override>() {
            Ok(o) => set.push(o),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(BAD_INPUT);
            }
        }
    }
    let Some(file) = file else { return usage("no scenario file") };
    let scenario = match scenario::load_file(Path::new(file), &set) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(BAD_INPUT);
        }
    };
    let status = if loader_only { trainer::run_loader_only(&scenario) } else { trainer::run_rank(&scenario) };
    ExitCode::from(status as u8)
}

/// What `ups-doctor-trainer cuda-probe` reports: the probe, libtorch's CUDA runtime and NCCL.
fn cuda_support() -> ups_doctor_core::schema::CudaSupport {
    let p = trainer::cuda::probe();
    let nccl = trainer::dist::nccl::NcclLib::get();
    ups_doctor_core::schema::CudaSupport {
        libtorch_version: Some(env!("UPS_DOCTOR_LIBTORCH_VERSION").to_string()),
        libtorch_lib: Some(env!("UPS_DOCTOR_LIBTORCH_LIB").to_string()),
        libtorch_cuda: p.libtorch_cuda.as_ref().map(|l| l.display().to_string()),
        device_count: p.device_count,
        why_not: p.why_not.clone(),
        cuda_runtime: trainer::cuda::runtime_version(),
        nccl_version: nccl.as_ref().ok().map(|l| l.version_text()),
        nccl_error: nccl.err(),
    }
}
