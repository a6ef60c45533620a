//! The supervisor's one event stream: what the loop saw and did, as [`RunEvent`]s, published to
//! every listener alike (nextest's runner → reporter): the live line on the terminal, and on one
//! node of several the link to the other nodes; each takes what it needs, and is ticked with the
//! ranks' states at the pace it asks for. A [`Listener`] may also ask the loop to stop (a failure
//! on another node: the loop then takes stacks of its ranks and tears them down, as on an
//! interrupt).

use std::time::Duration;

use crate::harness::RankState;

/// What the loop saw and did; times are seconds since the scenario started on this node, ranks
/// are this node's (local) ranks.
#[derive(Debug)]
pub enum RunEvent<'a> {
    /// The scenario's supervision began: its name, ranks on this node, the steps it trains (0: not
    /// known, a command's own program) and the seconds of silence after which a rank is declared
    /// hung (`limits.hang_after_s`).
    ScenarioStarted { name: &'a str, ranks: u32, steps: u64, hang_after_s: f64 },
    /// The supervision loop ended (teardown done; the result is judged next).
    ScenarioFinished { at_s: f64 },
    /// The ranks were started (pids by local rank; `None` where one failed to start); `start` is
    /// the instant every `at_s` counts from.
    Started { start: std::time::Instant, pids: Vec<Option<u32>> },
    /// At the pace the listener asked for ([`Listener::tick_every`]; the loop cannot be woken by a
    /// listener, so it reads it at this pace): rank states so far, and the pids of ranks still
    /// running (by local rank).
    Tick { at_s: f64, states: &'a [&'a RankState], pids: &'a [Option<u32>] },
    /// A rank ended; `failed` when it failed on its own.
    RankEnded { rank: u32, at_s: f64, failed: bool, how: String },
    /// These ranks were found hung.
    Hung { at_s: f64, ranks: Vec<u32> },
    /// Stacks were asked of these ranks after [`Listener::stop_request`].
    StacksRequested { at_s: f64, ranks: Vec<u32> },
    /// The launcher's rendezvous numbered this node's ranks from `first_rank`, not from the node
    /// × ranks per node that was expected (torchrun's `c10d` orders nodes by host and agent pid).
    Placed { at_s: f64, first_rank: u32 },
    /// SIGTERM went to what was left.
    TearingDown { at_s: f64, stacks_answered: bool },
}

/// One who listens to the loop: told every event, asked after each of its ticks whether to stop.
/// The live output is one (`report::live`), the node link of a multi-node run another.
pub trait Listener {
    /// A failure elsewhere (on another node) that this run must act on: what happened, once; the
    /// loop then takes stacks and tears down.
    fn stop_request(&mut self) -> Option<String> {
        None
    }
    /// How often this listener wants a [`RunEvent::Tick`] (`None`: never).
    fn tick_every(&self) -> Option<Duration> {
        None
    }
    /// Something the loop observed or did.
    fn event(&mut self, event: RunEvent);
}

/// A listener that hears nothing: bisect's probes and node agents' quiet runs.
pub struct Silent;

impl Listener for Silent {
    fn event(&mut self, _: RunEvent) {}
}
