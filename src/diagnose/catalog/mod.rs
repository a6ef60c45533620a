//! The known failure patterns, one family per file. Each [`Pattern`] has a stable id (the
//! verdict's `pattern` in `result.json`), what it matches, the explanation, the next step and a
//! reference; `docs/patterns.md` lists them all for users and a test keeps the two in step. A
//! detector states its pattern only when the evidence establishes it. Pure.

mod compile;
mod crash;
mod ddp;
mod distributed;
mod flight;
mod fork;
mod gpu;
mod group_count;
mod loader;
mod memory;
mod numeric;
mod observed;
mod pattern;
mod resources;
mod scheduler;
mod timeout;

use super::evidence::{Evidence, RankEvidence};

pub use crash::{CRASH_SIGNALS, all_crashed_at_exit, fatal_key};
pub use distributed::{collective_of, odd_rank_by_markers};
pub use flight::{Divergence, divergence as flight_divergence, lines as flight_lines};
pub use loader::{SHM_FULL_SHARE, input_bound, used_of};
use pattern::erring;
pub use pattern::{Finding, Pattern};

/// Every pattern, in the order `docs/patterns.md` lists them.
pub const ALL: &[&Pattern] = &[
    &crash::NATIVE_CRASH,
    &crash::FALSE_SUCCESS,
    &memory::OOM_KILL,
    &resources::CUDA_OOM,
    &gpu::CUDA_DEVICE_ASSERT,
    &gpu::CUDA_ILLEGAL_ACCESS,
    &gpu::INVALID_DEVICE_ORDINAL,
    &gpu::NCCL_ERROR,
    &gpu::GPU_XID,
    &scheduler::SCHEDULER_ENDED,
    &observed::COLLECTIVE_MISMATCH,
    &distributed::RANKS_OUT_OF_STEP,
    &distributed::PEER_LOST,
    &distributed::RANK_LEFT_EARLY,
    &distributed::RENDEZVOUS_INCOMPLETE,
    &distributed::RENDEZVOUS_PORT_IN_USE,
    &timeout::NCCL_WATCHDOG_TIMEOUT,
    &timeout::COLLECTIVE_TIMEOUT,
    &distributed::DUPLICATE_GPU,
    &ddp::DDP_UNUSED_PARAMETERS,
    &ddp::DDP_MODEL_MISMATCH,
    &ddp::DDP_READY_TWICE,
    &ddp::FSDP_INPLACE_VIEW,
    &resources::STATE_DICT_MISMATCH,
    &resources::TOO_MANY_OPEN_FILES,
    &compile::COMPILE_FAILED,
    &loader::DATALOADER_WORKER_EXCEPTION,
    &loader::WORKER_KILLED_BY_SIGNAL,
    &loader::WORKER_EXITED,
    &loader::SHM_EXHAUSTED,
    &fork::FORK_AFTER_THREADS,
    &fork::CUDA_IN_FORKED_CHILD,
    &numeric::NAN_LOSS,
    &observed::STRAGGLER,
    &observed::NOT_DISTRIBUTED,
    &loader::INPUT_BOUND,
    &loader::LEAKED_SHM,
];

/// A detector: the evidence and the provisional culprit (the first rank to fail, if any).
type Detector = fn(&Evidence, Option<&RankEvidence>) -> Option<Finding>;

/// Detectors of a failed run, most specific first: the first that matches names the pattern.
const FAILURE_DETECTORS: &[Detector] = &[
    gpu::xid,
    memory::oom_kill,
    resources::cuda_oom,
    gpu::device_assert,
    gpu::illegal_access,
    gpu::invalid_ordinal,
    scheduler::scheduler_ended,
    distributed::port_in_use,
    distributed::duplicate_gpu,
    fork::cuda_in_forked_child,
    timeout::nccl_watchdog,
    gpu::nccl_error,
    ddp::unused_parameters,
    ddp::model_mismatch,
    ddp::ready_twice,
    ddp::fsdp_inplace_view,
    resources::state_dict_mismatch,
    resources::too_many_open_files,
    compile::compile_failed,
    loader::shm_exhausted,
    loader::shm_before_hang,
    loader::worker_exception,
    loader::worker_killed,
    fork::fork_after_threads,
    distributed::rendezvous_incomplete,
    distributed::left_early,
    observed::size_mismatch,
    observed::collective_mismatch,
    timeout::collective_timeout,
    observed::straggler_at_time_limit,
    distributed::ranks_out_of_step,
    crash::native_crash,
    crash::false_success,
    numeric::nan_loss,
    distributed::peer_lost,
];

/// Detectors of a run where every rank passed.
const PASSED_DETECTORS: &[Detector] = &[
    numeric::nan_loss,
    observed::not_distributed,
    observed::straggler,
    loader::input_bound_run,
    loader::leaked_shm,
];

/// The pattern the evidence establishes, if any.
pub fn find(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    let detectors = if first.is_some() { FAILURE_DETECTORS } else { PASSED_DETECTORS };
    detectors.iter().find_map(|detect| detect(ev, first))
}

/// Whether a rank's failure is only the loss of a peer (`Connection reset by peer`): collateral
/// whenever another rank failed for a reason of its own.
pub fn lost_its_peer(rank: &RankEvidence) -> bool {
    distributed::lost_peer_line(rank).is_some()
}

/// Evidence lines about `/dev/shm` and leftovers that belong in any verdict (not a pattern).
pub fn shm_evidence(ev: &Evidence, failed: Option<&RankEvidence>) -> Vec<String> {
    loader::shm_lines(ev, failed)
}

/// The evidence lines, in a run that passed, that its ranks' PyTorch threads waited for CPUs,
/// and that ranks at a raised nice value did.
pub fn threads_evidence(ev: &Evidence) -> Vec<String> {
    observed::threads_waited(ev).into_iter().chain(observed::niced_ranks(ev)).collect()
}

#[cfg(test)]
mod tests;
