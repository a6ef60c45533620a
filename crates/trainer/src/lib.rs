//! The tch training core that runs inside each rank process: Burgers data, the UPT-style
//! operator, the training loop, injected faults and the in-process crash forensics.
//!
//! This is the only crate that uses tch, and `ups-doctor-trainer` the only executable that loads
//! libtorch. It reports to the harness exclusively through [`protocol`] markers, and behaves the
//! same without a harness (markers are then dropped), so `ups-doctor train` (which starts this
//! executable) can be run by hand or under torchrun.

pub use ups_doctor_core::{protocol, scenario};

pub mod amp;
pub mod burgers;
pub mod checkpoint;
pub mod crash;
pub mod cuda;
pub mod ddp;
pub mod device;
pub mod dist;
pub mod error;
pub mod faults;
pub mod fsdp;
pub mod loader;
pub mod loader_only;
pub mod markers;
pub mod model;
pub mod optim;
pub mod os;
pub mod train;

use crate::protocol::Marker;
use crate::scenario::Scenario;

/// Installs forensics and the marker sink. Must run before tch creates any thread.
pub fn prepare_process() {
    markers::init_from_env();
    crash::install();
}

/// Runs one rank of the scenario and returns the process exit status: 0 when training completed,
/// 1 when it stopped with an error (reported as an `error` marker and on stderr).
pub fn run_rank(scenario: &Scenario) -> i32 {
    // Before tch is asked about CUDA: registers libtorch's CUDA hooks when libtorch_cuda.so loads.
    cuda::probe();
    let result = train::RankEnv::from_env().and_then(|env| train::train(scenario, env));
    match result {
        Ok(summary) => {
            // The trainer's own timing, so a run by hand and one under the harness (whose
            // stdout goes to the rank's log) can be compared on the same clock (bench/).
            println!(
                "done: {} steps, loss {:.5} -> {:.5}; {} steps in {:.3} s, {:.3} steps/s (data {:.3} s, compute {:.3} s)",
                summary.steps,
                summary.first_loss,
                summary.final_loss,
                summary.steps_run,
                summary.loop_s,
                summary.steps_run as f64 / summary.loop_s.max(1e-9),
                summary.data_s,
                summary.compute_s
            );
            0
        }
        Err(e) => {
            markers::emit(&Marker::Error { message: e.to_string() });
            eprintln!("error: {e}");
            // Stacks asked of this rank as it failed are sent before it exits.
            crash::wait_for_stack_dump(std::time::Duration::from_secs(20));
            1
        }
    }
}

/// Runs only the scenario's data path (`train --loader-only`, for bench/) and prints what it
/// measured on one line; returns the process exit status like [`run_rank`].
pub fn run_loader_only(scenario: &Scenario) -> i32 {
    match train::RankEnv::from_env().and_then(|env| loader_only::run(scenario, env)) {
        Ok(s) => {
            println!(
                "loader-only: {} batches of {} samples in {:.3} s, first batch after {:.3} s, \
                 {:.1} samples/s after the first {} batches; dataset checksum {:#018x}",
                s.batches,
                s.batch_size,
                s.total_s,
                s.first_batch_s,
                s.steady_samples_per_s(),
                s.warm,
                s.checksum
            );
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    }
}
