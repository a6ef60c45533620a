//! The tch training core that runs inside each rank process: Burgers data, the UPT-style
//! operator, the training loop, injected faults and the in-process crash forensics.
//!
//! This is the only module that uses tch. It reports to the harness exclusively through
//! [`crate::protocol`] markers, and behaves the same without a harness (markers are then
//! dropped), so `ups-doctor train` can be run by hand or under torchrun.

pub mod amp;
pub mod burgers;
pub mod checkpoint;
pub mod crash;
pub mod cuda;
pub mod ddp;
pub mod device;
pub mod dist;
pub mod faults;
pub mod fsdp;
pub mod loader;
pub mod markers;
pub mod model;
pub mod optim;
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
            println!(
                "done: {} steps, loss {:.5} -> {:.5}",
                summary.steps, summary.first_loss, summary.final_loss
            );
            0
        }
        Err(e) => {
            markers::emit(&Marker::Error { message: e.to_string() });
            eprintln!("error: {e}");
            1
        }
    }
}
