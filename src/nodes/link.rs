//! The supervision loop's one hook into multi-node runs: it polls for a failure elsewhere (then
//! takes stacks of its ranks and tears them down, as on an interrupt) and reports what it acts
//! on. Single-node runs pass no link.

use crate::harness::RankState;

/// What the loop saw and did; times are seconds since the scenario started on this node, ranks
/// are this node's (local) ranks.
#[derive(Debug)]
pub enum LocalEvent<'a> {
    /// The ranks were started (pids by local rank; `None` where one failed to start).
    Started { at_s: f64, pids: Vec<Option<u32>> },
    /// Every 50 ms while a link is given (the link cannot wake the loop, so the loop reads it at
    /// this pace): rank states so far, and the pids of ranks still running (by local rank).
    Tick { at_s: f64, states: &'a [&'a RankState], pids: &'a [Option<u32>] },
    /// A rank ended; `failed` when it failed on its own.
    RankEnded { rank: u32, at_s: f64, failed: bool, how: String },
    /// These ranks were found hung.
    Hung { at_s: f64, ranks: Vec<u32> },
    /// Stacks were asked of these ranks after [`NodeLink::remote_failure`].
    StacksRequested { at_s: f64, ranks: Vec<u32> },
    /// The launcher's rendezvous numbered this node's ranks from `first_rank`, not from the node
    /// × ranks per node that was expected (torchrun's `c10d` orders nodes by host and agent pid).
    Placed { at_s: f64, first_rank: u32 },
    /// SIGTERM went to what was left.
    TearingDown { at_s: f64, stacks_answered: bool },
}

/// A node's connection to the others, as the supervision loop sees it.
pub trait NodeLink {
    /// A failure on another node (or of the run's other nodes) that this node must act on:
    /// what happened, once; the loop then takes stacks and tears down.
    fn remote_failure(&mut self) -> Option<String>;
    /// Something the loop observed or did.
    fn event(&mut self, event: LocalEvent);
}
