//! The supervisor's decisions as a state machine, pure: no process, no clock, no signal.
//!
//! # Theory of operation
//!
//! The run loop ([`super::supervise`]) owns the processes. Whenever something happens (a process
//! exited, markers or output arrived, a deadline passed, the user interrupted, a peer node
//! failed) it folds the news into per-rank facts, hands the machine a [`View`] of them with the
//! time since the start, and carries out the [`Action`]s it gets back. Between events it sleeps
//! until [`Machine::next_deadline`]: the earliest moment at which the machine would decide
//! something without news (a silent rank reaching the hang threshold, the scenario's timeout, the
//! end of a grace period). There is no fixed tick.
//!
//! ```text
//!   Running ──a rank failed on its own──▶ Failing (the others get COLLATERAL_GRACE to end)
//!      │                                     │
//!      ├──hung / timed out / grace over / peer failed / interrupt──┐
//!      ▼                                                           ▼
//!   DumpingStacks (ask stuck ranks for stacks; wait until answered or the wait is over, and
//!      │           at least until the next step: the grace below counts from SIGTERM itself)
//!      ▼
//!   Terminating (SIGTERM sent; the grace before SIGKILL)
//!      ▼
//!   Killing (SIGKILL sent)  ──every rank finished (from any state)──▶ Done
//! ```
//!
//! A launcher (torchrun, srun) gets SIGTERM with the ranks but SIGKILL only after a grace of its
//! own, counted from the SIGTERM ([`Teardown::KillLauncher`]): once its ranks are gone it still has
//! to end its own way.
//!
//! A second interrupt is not an input here: `main` ignores one within a second and exits on a
//! third, so the machine sees at most one.

use std::time::Duration;

use crate::harness::plan::Timing;

/// Where the supervisor is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Phase {
    Running,
    /// A rank failed on its own; the others get until `until` to end by themselves.
    Failing {
        until: Duration,
    },
    /// Stacks were asked for; SIGTERM once they are in, or at `until`.
    DumpingStacks {
        until: Duration,
    },
    /// SIGTERM went out at `since`.
    Terminating {
        since: Duration,
    },
    /// SIGKILL went out.
    Killing,
    /// Every process has ended and its output is in.
    Done,
}

/// What ended the run early, when something did.
#[derive(Debug, Clone, PartialEq)]
pub enum Cause {
    /// Ranks went silent past `limits.hang_after_s`.
    Hang,
    /// The scenario ran past `limits.timeout_s`.
    Timeout,
    /// A rank failed and the others did not end within the grace.
    Failure,
    /// The user interrupted (Ctrl-C, SIGTERM, SIGHUP).
    Interrupt,
    /// Another node of the run failed: our ranks are collateral of it.
    PeerFailed { what: String },
}

/// What woke the run loop. Exits, markers and output reach the machine through the [`View`];
/// the input says only that something changed.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// A process exited, markers or output arrived.
    Changed,
    /// A deadline from [`Machine::next_deadline`] passed.
    Timer,
    /// The user asked ups-doctor to stop.
    Interrupt,
    /// Another node reported a failure (see [`Cause::PeerFailed`]).
    PeerFailed { what: String },
}

/// One rank as the run loop sees it at this moment.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RankView {
    pub rank: u32,
    /// Its process runs (or a launcher's rank has not been seen to end).
    pub live: bool,
    /// A launcher's rank whose process was never identified: as far as anyone knows it runs as
    /// long as its launcher does.
    pub unfound: bool,
    /// It ended by itself in a way that is not a success (or could not start).
    pub failed: bool,
    /// The last sign of life (marker; output too for an external program), since the start; the
    /// start itself when there was none.
    pub last_activity: Duration,
}

/// The facts the machine decides on.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    pub ranks: &'a [RankView],
    /// A launcher runs.
    pub launcher_live: bool,
    /// Launcher style and no rank of it found yet: the launcher itself may be what hangs.
    pub no_rank_found: bool,
    /// The last moment a live rank's own process was seen using CPU (a tenth of a core or
    /// more), or, while no rank of a launcher is found, the launcher with what runs below it: a
    /// run with a busy rank is not hung, though its other ranks may wait for it silently.
    pub busy_at: Option<Duration>,
    /// Every process asked for stacks has answered.
    pub stacks_answered: bool,
    /// A process asked for stacks and not done has used CPU since it was asked: it is answering
    /// (the trainer symbolises each thread's stack, seconds on a loaded machine).
    pub stacks_coming: bool,
    /// Every process has ended and its markers and output are in.
    pub finished: bool,
}

/// Teardown signals, in escalating order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Teardown {
    /// SIGTERM to every live rank and the launcher.
    Term,
    /// SIGKILL to every live rank.
    Kill,
    /// SIGKILL to the launcher, after its own grace.
    KillLauncher,
}

/// Why stacks are asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// Stuck ranks (hang, timeout) or the survivors of a failure: every process of each, from
    /// outside (py-spy) for an external program.
    Stuck,
    /// The user interrupted: only ranks that answer fast (the built-in trainer's handler).
    Interrupt,
    /// Another node failed: as for an interrupt, with a longer wait.
    Peer,
}

/// What the run loop must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Record that `rank` was silent for `silence_s` and is stuck.
    MarkHung { rank: u32, silence_s: f64 },
    /// Record that `rank` was still running at the scenario's timeout.
    MarkTimedOut { rank: u32 },
    /// Ask these live ranks' processes for their stacks (look before killing). On an interrupt or
    /// a peer's failure, only ranks that answer fast are asked (the built-in trainer's handler;
    /// never py-spy).
    DumpStacks { ranks: Vec<u32>, look: Look },
    /// Signal every live rank and/or the launcher.
    Signal(Teardown),
    /// Stop supervising: collect and classify.
    Finish,
}

/// The supervisor's state.
#[derive(Debug, Clone)]
pub struct Machine {
    timing: Timing,
    /// External programs have no stack-dump handler: their stacks are taken from outside (py-spy)
    /// while the loop waits, so there is nothing to wait for afterwards.
    external: bool,
    phase: Phase,
    cause: Option<Cause>,
    interrupted: bool,
    first_failure_at: Option<Duration>,
    /// When SIGTERM went out (the launcher's grace counts from it).
    term_at: Option<Duration>,
    launcher_killed: bool,
    /// The latest a look may be waited for while its ranks still answer (see [`Machine::dump`]
    /// and [`Machine::quick_dump`]).
    quick_until: Option<Duration>,
}

/// How often a quick look whose ranks are still answering is looked at again.
const STACKS_COMING_LOOK: Duration = Duration::from_millis(250);

impl Machine {
    pub fn new(timing: Timing, external: bool) -> Machine {
        Machine {
            timing,
            external,
            phase: Phase::Running,
            cause: None,
            interrupted: false,
            first_failure_at: None,
            term_at: None,
            launcher_killed: false,
            quick_until: None,
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// What ended the run early (the first cause wins).
    pub fn cause(&self) -> Option<&Cause> {
        self.cause.as_ref()
    }

    pub fn interrupted(&self) -> bool {
        self.interrupted
    }

    /// When the first rank was seen to fail on its own.
    pub fn first_failure_at(&self) -> Option<Duration> {
        self.first_failure_at
    }

    /// Takes one input at `now` (since the run's start) and returns what to do, in order.
    pub fn step(&mut self, input: Input, now: Duration, view: &View) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.phase == Phase::Done {
            return actions;
        }
        if self.first_failure_at.is_none() && view.ranks.iter().any(|r| r.failed) {
            self.first_failure_at = Some(now);
            if self.phase == Phase::Running {
                self.phase = Phase::Failing { until: now + self.timing.collateral_grace };
            }
        }
        if view.finished {
            self.phase = Phase::Done;
            actions.push(Action::Finish);
            return actions;
        }
        let watching = matches!(self.phase, Phase::Running | Phase::Failing { .. });
        match input {
            Input::Interrupt if !self.interrupted => {
                // An orderly stop that keeps what the scenario had: stacks first (the run a user
                // interrupts is often the one that hangs), then SIGTERM, then SIGKILL, each with
                // a short wait.
                self.interrupted = true;
                self.cause.get_or_insert(Cause::Interrupt);
                if watching {
                    self.quick_dump(now, live(view), Look::Interrupt, &mut actions);
                }
                return actions;
            }
            Input::PeerFailed { what } if watching => {
                // A failure elsewhere: look at where our ranks are before taking them down, as
                // on an interrupt (the ranks that answer fast), with a longer wait.
                self.cause.get_or_insert(Cause::PeerFailed { what });
                self.quick_dump(now, live(view), Look::Peer, &mut actions);
                return actions;
            }
            _ => {}
        }
        let asked_before = matches!(self.phase, Phase::DumpingStacks { .. });
        if matches!(self.phase, Phase::Running | Phase::Failing { .. }) {
            self.watch(now, view, &mut actions);
        }
        // `stacks_answered` is about requests made before this step: stacks asked for just now
        // are waited for (until answered, at the next step, or until the wait is over).
        // A quick look (interrupt, peer) that the ranks are still answering gets more time, up to
        // the full wait of a hang's look: a stack is what a user interrupts a stuck run for.
        if let (Phase::DumpingStacks { until }, Some(longest)) = (self.phase, self.quick_until)
            && now >= until
            && now < longest
            && view.stacks_coming
            && !view.stacks_answered
        {
            self.phase = Phase::DumpingStacks { until: (now + STACKS_COMING_LOOK).min(longest) };
        }
        // Never in the step that asks for stacks: taking them from outside (py-spy, one process
        // after another) is done before the next step and takes seconds on a busy machine, and
        // the grace before SIGKILL counts from this step's time. A SIGTERM sent in the same step
        // went out after the stacks, with its grace already spent, and SIGKILL followed at once.
        let asking_now =
            actions.iter().any(|a| matches!(a, Action::DumpStacks { ranks, .. } if !ranks.is_empty()));
        if let Phase::DumpingStacks { until } = self.phase
            && !asking_now
            && ((asked_before && view.stacks_answered) || now >= until)
        {
            actions.push(Action::Signal(Teardown::Term));
            self.phase = Phase::Terminating { since: now };
            self.term_at = Some(now);
        }
        if let Phase::Terminating { since } = self.phase
            && now >= since + self.term_grace()
        {
            actions.push(Action::Signal(Teardown::Kill));
            self.phase = Phase::Killing;
        }
        if let Some(at) = self.launcher_kill_at(view)
            && now >= at
        {
            actions.push(Action::Signal(Teardown::KillLauncher));
            self.launcher_killed = true;
        }
        actions
    }

    /// When the launcher gets SIGKILL, while it runs and has not had it.
    fn launcher_kill_at(&self, view: &View) -> Option<Duration> {
        let grace = if self.interrupted {
            self.timing.launcher_interrupt_term_grace
        } else {
            self.timing.launcher_term_grace
        };
        self.term_at.filter(|_| view.launcher_live && !self.launcher_killed).map(|t| t + grace)
    }

    /// Hang, timeout and the end of the grace after a failure.
    fn watch(&mut self, now: Duration, view: &View, actions: &mut Vec<Action>) {
        // Hang: a live rank silent for `hang_after`. Silence counts from the start until the first
        // sign of life, so a rank stuck before it reports anything is caught too.
        // Only once no rank has used CPU for as long: a rank that computes without a word (a long
        // validation, a compile, rank 0 preparing the data while the others wait in a barrier, its
        // DataLoader workers decoding a slow first batch: a rank's CPU is its workers' too) is
        // busy, not hung. A rank that spins while it waits is caught by the timeout.
        let limit = self.timing.hang_after;
        let silence = |r: &RankView| now.saturating_sub(r.last_activity);
        let idle = view.busy_at.is_none_or(|b| now.saturating_sub(b) >= limit);
        let mut stuck = idle && view.ranks.iter().any(|r| r.live && silence(r) >= limit);
        let mut marked = Vec::new();
        if view.no_rank_found && !stuck {
            // Nothing found: the launcher (or what runs below it unidentified) may be what hangs,
            // silent as every rank's output is the launcher's.
            stuck = idle && view.launcher_live && view.ranks.iter().all(|r| silence(r) >= limit);
            if stuck {
                for r in view.ranks {
                    actions.push(Action::MarkHung { rank: r.rank, silence_s: silence(r).as_secs_f64() });
                }
            }
        }
        if stuck {
            self.cause.get_or_insert(Cause::Hang);
            // Ranks get stuck together (one waits for another in a collective) but cross the
            // limit at different moments: once one is hung, every rank silent for half the limit
            // is stuck as well. Ranks still reporting are torn down as collateral.
            for r in view.ranks.iter().filter(|r| r.live && silence(r) >= limit / 2) {
                actions.push(Action::MarkHung { rank: r.rank, silence_s: silence(r).as_secs_f64() });
                marked.push(r.rank);
            }
        }
        if !stuck && now >= self.timing.timeout {
            stuck = true;
            self.cause.get_or_insert(Cause::Timeout);
            for r in view.ranks.iter().filter(|r| r.live || r.unfound) {
                actions.push(Action::MarkTimedOut { rank: r.rank });
                marked.push(r.rank);
            }
        }
        // A rank failed and the grace for the others is over: dump whoever is left (the stacks
        // show where a collateral rank was waiting), then tear down.
        let grace_over = matches!(self.phase, Phase::Failing { until } if now >= until);
        if grace_over {
            self.cause.get_or_insert(Cause::Failure);
        }
        if stuck || grace_over {
            let ranks = view
                .ranks
                .iter()
                .filter(|r| r.live && (grace_over || marked.contains(&r.rank)))
                .map(|r| r.rank)
                .collect();
            self.dump(now, ranks, actions);
        }
    }

    /// A hang's (or an overrun's) look: the ranks asked get the stack-dump wait, and while one
    /// still answers (its CPU rising: the built-in trainer symbolises each thread's stack, many
    /// seconds of a debug build on a loaded machine), up to the remote wait. At load 14 a DDP
    /// hang's rank 0 had no stack after the 5 s (`distributed::ranks_out_of_step_hang_…`).
    fn dump(&mut self, now: Duration, ranks: Vec<u32>, actions: &mut Vec<Action>) {
        let wait = if self.external { Duration::ZERO } else { self.timing.stack_dump_wait };
        actions.push(Action::DumpStacks { ranks, look: Look::Stuck });
        if !self.external {
            self.quick_until = Some(now + wait.max(self.timing.remote_dump_wait));
        }
        self.phase = Phase::DumpingStacks { until: now + wait };
    }

    /// Asks the ranks that answer fast: the built-in trainer's (an external program has no
    /// handler for the signal, and py-spy is too slow here). The wait ends early once every
    /// process asked has answered, at once when none was asked.
    fn quick_dump(&mut self, now: Duration, ranks: Vec<u32>, look: Look, actions: &mut Vec<Action>) {
        let wait = match look {
            _ if self.external => Duration::ZERO,
            Look::Peer => self.timing.remote_dump_wait,
            _ => self.timing.interrupt_dump_wait,
        };
        if !self.external {
            actions.push(Action::DumpStacks { ranks, look });
            self.quick_until = Some(now + wait.max(self.timing.stack_dump_wait));
        }
        self.phase = Phase::DumpingStacks { until: now + wait };
    }

    fn term_grace(&self) -> Duration {
        if self.interrupted { self.timing.interrupt_term_grace } else { self.timing.term_grace }
    }

    /// The earliest moment at which the machine would act without news: the run loop sleeps
    /// until then (or until news arrives). `None`: only news can change anything.
    pub fn next_deadline(&self, view: &View) -> Option<Duration> {
        let phase = self.phase_deadline(view);
        [phase, self.launcher_kill_at(view)].into_iter().flatten().min()
    }

    fn phase_deadline(&self, view: &View) -> Option<Duration> {
        match self.phase {
            Phase::Running | Phase::Failing { .. } => {
                let hang = view
                    .ranks
                    .iter()
                    .filter(|r| r.live)
                    .map(|r| r.last_activity + self.timing.hang_after)
                    .min();
                // With no rank found, the launcher hangs once every rank's silence is long enough.
                let all_silent = (view.no_rank_found && view.launcher_live)
                    .then(|| view.ranks.iter().map(|r| r.last_activity + self.timing.hang_after).max())
                    .flatten();
                let hang = [hang, all_silent].into_iter().flatten().min();
                let hang = hang.map(|h| view.busy_at.map_or(h, |b| h.max(b + self.timing.hang_after)));
                let grace = match self.phase {
                    Phase::Failing { until } => Some(until),
                    _ => None,
                };
                [hang, Some(self.timing.timeout), grace].into_iter().flatten().min()
            }
            Phase::DumpingStacks { until } => Some(until),
            Phase::Terminating { since } => Some(since + self.term_grace()),
            Phase::Killing | Phase::Done => None,
        }
    }
}

fn live(view: &View) -> Vec<u32> {
    view.ranks.iter().filter(|r| r.live).map(|r| r.rank).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn timing() -> Timing {
        Timing {
            hang_after: S(10),
            timeout: S(100),
            collateral_grace: S(5),
            stack_dump_wait: S(5),
            term_grace: S(3),
            interrupt_dump_wait: S(3),
            interrupt_term_grace: S(1),
            remote_dump_wait: S(15),
            launcher_term_grace: S(15),
            launcher_interrupt_term_grace: S(5),
            pipe_drain_wait: S(2),
        }
    }

    fn rank(rank: u32, last_activity: u64) -> RankView {
        RankView { rank, live: true, unfound: false, failed: false, last_activity: S(last_activity) }
    }

    fn view(ranks: &[RankView]) -> View<'_> {
        View {
            ranks,
            launcher_live: false,
            no_rank_found: false,
            busy_at: None,
            stacks_answered: false,
            stacks_coming: false,
            finished: false,
        }
    }

    #[test]
    fn a_healthy_run_sleeps_until_the_first_rank_could_hang_and_ends_when_all_finish() {
        let mut m = Machine::new(timing(), false);
        let ranks = [rank(0, 4), rank(1, 7)];
        assert_eq!(m.step(Input::Changed, S(8), &view(&ranks)), []);
        assert_eq!(m.next_deadline(&view(&ranks)), Some(S(14)), "rank 0's last marker + hang_after");
        assert_eq!(m.step(Input::Timer, S(13), &view(&ranks)), [], "early wake-ups decide nothing");
        let done = View { finished: true, ..view(&ranks) };
        assert_eq!(m.step(Input::Changed, S(20), &done), [Action::Finish]);
        assert_eq!((m.phase(), m.cause()), (Phase::Done, None));
    }

    #[test]
    fn no_rank_is_hung_while_a_rank_of_the_run_uses_cpu_and_one_is_once_the_cpu_has_stopped_too() {
        let mut m = Machine::new(timing(), false);
        // Rank 0 computes without a word; rank 1 waits for it in a barrier.
        let ranks = [rank(0, 1), rank(1, 2)];
        let busy = |at| View { busy_at: Some(S(at)), ..view(&ranks) };
        assert_eq!(m.step(Input::Timer, S(11), &busy(9)), [], "rank 0 used CPU 2 s ago");
        assert_eq!(m.next_deadline(&busy(9)), Some(S(19)), "the last CPU use + hang_after");
        assert_eq!(m.step(Input::Timer, S(18), &busy(9)), []);
        let actions = m.step(Input::Timer, S(19), &busy(9));
        assert_eq!(
            actions,
            [
                Action::MarkHung { rank: 0, silence_s: 18.0 },
                Action::MarkHung { rank: 1, silence_s: 17.0 },
                Action::DumpStacks { ranks: vec![0, 1], look: Look::Stuck },
            ],
            "the silence is the markers' (what the report says), the decision the CPU's too"
        );
        assert_eq!(m.cause(), Some(&Cause::Hang));
    }

    #[test]
    fn a_hang_marks_every_rank_silent_for_half_the_limit_then_dumps_terminates_and_kills() {
        let mut m = Machine::new(timing(), false);
        let ranks = [rank(0, 0), rank(1, 4), rank(2, 9)];
        // Nobody had been asked yet, so "every asked process answered" holds vacuously: the
        // stacks asked for now are still waited for.
        let actions = m.step(Input::Timer, S(10), &View { stacks_answered: true, ..view(&ranks) });
        assert_eq!(
            actions,
            [
                Action::MarkHung { rank: 0, silence_s: 10.0 },
                Action::MarkHung { rank: 1, silence_s: 6.0 },
                Action::DumpStacks { ranks: vec![0, 1], look: Look::Stuck },
            ],
            "rank 2 reported a second ago: collateral, not hung"
        );
        assert_eq!(m.cause(), Some(&Cause::Hang));
        assert_eq!(m.next_deadline(&view(&ranks)), Some(S(15)));
        assert_eq!(m.step(Input::Changed, S(12), &view(&ranks)), [], "stacks still coming");
        let answered = View { stacks_answered: true, ..view(&ranks) };
        assert_eq!(m.step(Input::Changed, S(13), &answered), [Action::Signal(Teardown::Term)]);
        assert_eq!(m.next_deadline(&answered), Some(S(16)));
        assert_eq!(m.step(Input::Timer, S(16), &answered), [Action::Signal(Teardown::Kill)]);
        assert_eq!(m.next_deadline(&answered), None, "only the processes' ends can move it now");
        assert_eq!(m.step(Input::Changed, S(17), &View { finished: true, ..answered }), [Action::Finish]);
    }

    #[test]
    fn stacks_that_never_come_are_waited_for_only_until_the_dump_wait() {
        let mut m = Machine::new(timing(), false);
        let ranks = [rank(0, 0)];
        m.step(Input::Timer, S(10), &view(&ranks));
        assert_eq!(m.step(Input::Timer, S(15), &view(&ranks)), [Action::Signal(Teardown::Term)]);
    }

    #[test]
    fn a_failure_gives_the_others_a_grace_then_dumps_whoever_is_left() {
        let mut m = Machine::new(timing(), false);
        let failed = RankView { live: false, failed: true, ..rank(0, 3) };
        let ranks = [failed, rank(1, 3)];
        assert_eq!(m.step(Input::Changed, S(3), &view(&ranks)), []);
        assert_eq!(m.phase(), Phase::Failing { until: S(8) });
        assert_eq!(m.first_failure_at(), Some(S(3)));
        assert_eq!(m.next_deadline(&view(&ranks)), Some(S(8)));
        assert_eq!(
            m.step(Input::Timer, S(8), &view(&ranks)),
            [Action::DumpStacks { ranks: vec![1], look: Look::Stuck }]
        );
        assert_eq!(m.cause(), Some(&Cause::Failure));
    }

    #[test]
    fn the_timeout_marks_every_live_rank() {
        let mut m = Machine::new(timing(), false);
        let ranks = [rank(0, 99), RankView { live: false, ..rank(1, 50) }];
        assert_eq!(m.next_deadline(&view(&ranks)), Some(S(100)));
        assert_eq!(
            m.step(Input::Timer, S(100), &view(&ranks)),
            [Action::MarkTimedOut { rank: 0 }, Action::DumpStacks { ranks: vec![0], look: Look::Stuck }]
        );
        assert_eq!(m.cause(), Some(&Cause::Timeout));
    }

    #[test]
    fn an_interrupt_waits_longer_for_stacks_the_ranks_are_still_answering_but_not_for_ever() {
        let mut m = Machine::new(timing(), false);
        let ranks = [rank(0, 1)];
        m.step(Input::Interrupt, S(2), &view(&ranks));
        let coming = View { stacks_coming: true, ..view(&ranks) };
        assert_eq!(m.step(Input::Timer, S(5), &coming), [], "the rank is symbolising its stacks");
        assert_eq!(m.next_deadline(&coming), Some(S(5) + STACKS_COMING_LOOK));
        assert_eq!(m.step(Input::Timer, S(6), &coming), []);
        let answered = View { stacks_answered: true, ..view(&ranks) };
        assert_eq!(m.step(Input::Changed, S(7), &answered), [Action::Signal(Teardown::Term)]);
        // Still answering at the full wait of a hang's look: torn down all the same.
        let mut m = Machine::new(timing(), false);
        m.step(Input::Interrupt, S(2), &view(&ranks));
        let longest = S(2) + timing().stack_dump_wait.max(timing().interrupt_dump_wait);
        assert_eq!(m.step(Input::Timer, longest - S(1), &coming), []);
        assert_eq!(m.step(Input::Timer, longest, &coming), [Action::Signal(Teardown::Term)]);
    }

    #[test]
    fn a_hangs_look_waits_for_stacks_the_ranks_are_still_answering_up_to_the_remote_wait() {
        let mut m = Machine::new(timing(), false);
        let ranks = [rank(0, 1), rank(1, 1)];
        let asked = m.step(Input::Timer, S(11), &view(&ranks));
        assert!(asked.iter().any(|a| matches!(a, Action::DumpStacks { look: Look::Stuck, .. })), "{asked:?}");
        let coming = View { stacks_coming: true, ..view(&ranks) };
        assert_eq!(m.step(Input::Timer, S(16), &coming), [], "still symbolising at the 5 s wait");
        assert_eq!(m.step(Input::Timer, S(20), &coming), []);
        let answered = View { stacks_answered: true, ..view(&ranks) };
        assert_eq!(m.step(Input::Changed, S(21), &answered), [Action::Signal(Teardown::Term)]);
        // Nothing coming at the wait: torn down then.
        let mut m = Machine::new(timing(), false);
        m.step(Input::Timer, S(11), &view(&ranks));
        assert_eq!(m.step(Input::Timer, S(16), &view(&ranks)), [Action::Signal(Teardown::Term)]);
        // Still answering at the remote wait: torn down all the same.
        let mut m = Machine::new(timing(), false);
        m.step(Input::Timer, S(11), &view(&ranks));
        assert_eq!(m.step(Input::Timer, S(25), &coming), []);
        assert_eq!(m.step(Input::Timer, S(26), &coming), [Action::Signal(Teardown::Term)]);
    }

    #[test]
    fn an_interrupt_asks_for_stacks_then_tears_down_with_short_waits() {
        let mut m = Machine::new(timing(), false);
        let ranks = [rank(0, 1), rank(1, 1)];
        assert_eq!(
            m.step(Input::Interrupt, S(2), &view(&ranks)),
            [Action::DumpStacks { ranks: vec![0, 1], look: Look::Interrupt }]
        );
        assert!(m.interrupted());
        assert_eq!(m.next_deadline(&view(&ranks)), Some(S(5)), "the interrupt's dump wait");
        assert_eq!(m.step(Input::Timer, S(5), &view(&ranks)), [Action::Signal(Teardown::Term)]);
        assert_eq!(m.step(Input::Timer, S(6), &view(&ranks)), [Action::Signal(Teardown::Kill)], "1 s, not 3");
        assert_eq!(m.cause(), Some(&Cause::Interrupt));
    }

    #[test]
    fn an_interrupt_during_teardown_only_shortens_the_grace() {
        let mut m = Machine::new(timing(), false);
        let ranks = [rank(0, 0)];
        m.step(Input::Timer, S(10), &view(&ranks));
        m.step(Input::Timer, S(15), &view(&ranks));
        assert_eq!(m.phase(), Phase::Terminating { since: S(15) });
        assert_eq!(m.step(Input::Interrupt, S(15), &view(&ranks)), [], "no second round of stacks");
        assert_eq!(m.cause(), Some(&Cause::Hang), "what ended the run stays the hang");
        assert_eq!(m.next_deadline(&view(&ranks)), Some(S(16)));
    }

    #[test]
    fn an_external_programs_stacks_are_taken_from_outside_so_sigterm_follows_at_once() {
        let mut m = Machine::new(timing(), true);
        let ranks = [rank(0, 0)];
        assert_eq!(
            m.step(Input::Timer, S(10), &view(&ranks)),
            [
                Action::MarkHung { rank: 0, silence_s: 10.0 },
                Action::DumpStacks { ranks: vec![0], look: Look::Stuck }
            ]
        );
        // No wait for an answer: the next step comes as soon as py-spy is done.
        assert_eq!(m.next_deadline(&view(&ranks)), Some(S(10)));
        // py-spy took 4 s (a busy machine): SIGTERM now, and its grace counts from now. Sent in
        // the asking step, at 10 s, its 3 s would have been over before it went out.
        assert_eq!(m.step(Input::Timer, S(14), &view(&ranks)), [Action::Signal(Teardown::Term)]);
        assert_eq!(m.next_deadline(&view(&ranks)), Some(S(17)));
        assert_eq!(m.step(Input::Timer, S(16), &view(&ranks)), []);
        assert_eq!(m.step(Input::Timer, S(17), &view(&ranks)), [Action::Signal(Teardown::Kill)]);
        let mut m = Machine::new(timing(), true);
        assert_eq!(m.step(Input::Interrupt, S(1), &view(&ranks)), [], "py-spy is too slow for an interrupt");
        assert_eq!(m.step(Input::Changed, S(1), &view(&ranks)), [Action::Signal(Teardown::Term)]);
    }

    #[test]
    fn a_launcher_that_shows_no_rank_is_what_hangs_once_its_output_stops() {
        let mut m = Machine::new(timing(), true);
        let unfound = |r, at| RankView { live: false, unfound: true, ..rank(r, at) };
        // The launcher's output is every rank's: its last line was at 4 s.
        let ranks = [unfound(0, 4), unfound(1, 4)];
        let v = View { launcher_live: true, no_rank_found: true, ..view(&ranks) };
        assert_eq!(m.next_deadline(&v), Some(S(14)));
        assert_eq!(m.step(Input::Timer, S(13), &v), []);
        assert_eq!(
            m.step(Input::Timer, S(14), &v),
            [
                Action::MarkHung { rank: 0, silence_s: 10.0 },
                Action::MarkHung { rank: 1, silence_s: 10.0 },
                Action::DumpStacks { ranks: vec![], look: Look::Stuck },
                Action::Signal(Teardown::Term),
            ],
            "nothing to look at: SIGTERM to the launcher at once"
        );
        assert_eq!(m.cause(), Some(&Cause::Hang));
        // Its ranks get SIGKILL after 3 s; the launcher only after its own 15 s.
        assert_eq!(m.step(Input::Timer, S(17), &v), [Action::Signal(Teardown::Kill)]);
        assert_eq!(m.next_deadline(&v), Some(S(29)));
        assert_eq!(m.step(Input::Timer, S(29), &v), [Action::Signal(Teardown::KillLauncher)]);
        assert_eq!(m.next_deadline(&v), None);
    }

    #[test]
    fn a_launcher_whose_ranks_were_never_found_times_out_with_them() {
        let mut m = Machine::new(timing(), true);
        let unfound = RankView { live: false, unfound: true, ..rank(1, 99) };
        let ranks = [rank(0, 99), unfound];
        let v = View { launcher_live: true, ..view(&ranks) };
        assert_eq!(
            m.step(Input::Timer, S(100), &v),
            [
                Action::MarkTimedOut { rank: 0 },
                Action::MarkTimedOut { rank: 1 },
                Action::DumpStacks { ranks: vec![0], look: Look::Stuck },
            ]
        );
        assert_eq!(m.step(Input::Timer, S(100), &v), [Action::Signal(Teardown::Term)]);
        // Interrupted during the teardown: the launcher's grace is the short one.
        assert_eq!(m.step(Input::Interrupt, S(101), &v), []);
        assert_eq!(m.next_deadline(&v), Some(S(101)), "the ranks' SIGKILL, 1 s after SIGTERM");
        assert_eq!(m.step(Input::Timer, S(101), &v), [Action::Signal(Teardown::Kill)]);
        assert_eq!(m.next_deadline(&v), Some(S(105)));
    }

    #[test]
    fn a_peer_failure_looks_at_our_ranks_first_and_is_not_an_interrupt() {
        let mut m = Machine::new(timing(), false);
        let ranks = [rank(0, 1), rank(1, 1)];
        let peer = Input::PeerFailed { what: "rank 3 on node 1 was killed by SIGSEGV".into() };
        assert_eq!(
            m.step(peer, S(2), &view(&ranks)),
            [Action::DumpStacks { ranks: vec![0, 1], look: Look::Peer }]
        );
        assert!(!m.interrupted());
        assert!(matches!(m.cause(), Some(Cause::PeerFailed { what }) if what.contains("node 1")));
        assert_eq!(m.next_deadline(&view(&ranks)), Some(S(17)), "the remote dump wait");
        let answered = View { stacks_answered: true, ..view(&ranks) };
        assert_eq!(m.step(Input::Changed, S(3), &answered), [Action::Signal(Teardown::Term)]);
        assert_eq!(m.next_deadline(&answered), Some(S(6)), "the full SIGTERM grace: no interrupt");
    }

    #[test]
    fn a_run_that_finishes_while_tearing_down_is_done() {
        let mut m = Machine::new(timing(), false);
        let ranks = [rank(0, 0)];
        m.step(Input::Timer, S(10), &view(&ranks));
        let finished = View { finished: true, ..view(&ranks) };
        assert_eq!(m.step(Input::Changed, S(11), &finished), [Action::Finish]);
        assert_eq!(m.step(Input::Timer, S(30), &finished), [], "done stays done");
    }
}
