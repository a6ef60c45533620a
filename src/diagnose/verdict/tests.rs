//! The verdict from fixtures: culprit, collateral, pattern and wording, for the built-in trainer
//! and for a program's own output (PyTorch's recorded texts).

use super::*;
use crate::diagnose::evidence::Observed;
use crate::harness::Exit;
use crate::harness::{Intervention, RankEnd, classify_rank};
use crate::protocol::Frame;
use crate::schema::{
    CgroupReport, CgroupVersion, Leftovers, MemoryReport, OomKill, OomSource, ProcessMemory, ProcessRole,
    ShmAt, Signal, WorkerInfo,
};

fn end(exit: Option<Exit>) -> RankEnd {
    RankEnd { exit, ..Default::default() }
}

struct Case {
    scenario: Scenario,
    ranks: Vec<RankResult>,
    memory: Option<MemoryReport>,
    leftovers: Leftovers,
    oom_kills: Vec<OomKill>,
    cgroup: Option<CgroupReport>,
}

impl Case {
    fn new(ranks: Vec<RankResult>) -> Self {
        Case {
            scenario: Scenario::default(),
            ranks,
            memory: None,
            leftovers: Leftovers::default(),
            oom_kills: Vec::new(),
            cgroup: None,
        }
    }

    fn judge(&self) -> (OutcomeKind, Option<u32>, Verdict) {
        let j = self.judgement();
        (j.outcome, j.first_failure, j.verdict)
    }

    fn judgement(&self) -> Judgement {
        judge(&Observed {
            scenario: &self.scenario,
            ranks: &self.ranks,
            wall_s: 2.0,
            memory: self.memory.as_ref(),
            leftovers: &self.leftovers,
            oom_kills: &self.oom_kills,
            xids: &[],
            cgroup: self.cgroup.as_ref(),
            launcher: None,
        })
    }
}

fn verdict(ranks: &[RankResult]) -> (OutcomeKind, Option<u32>, Verdict) {
    Case::new(ranks.to_vec()).judge()
}

/// A program's rank (no markers) that exited with `code` after printing `stderr`.
fn program_rank(rank: u32, exit: Exit, ended_at: f64, stderr: &str) -> RankResult {
    let mut e = end(Some(exit));
    e.rank = rank;
    e.pid = Some(1000 + rank);
    e.ended_at_s = Some(ended_at);
    e.completed = Some(true);
    e.last_output_at = Some(ended_at);
    e.stderr_tail = stderr.lines().map(String::from).collect();
    classify_rank(&e)
}

/// A launcher (pid 77) that exited with `code`, its output ending in `tail`.
fn torchrun_end(code: i32, tail: &[&str]) -> LauncherEnd {
    LauncherEnd {
        kind: Some("torchrun".into()),
        pid: Some(77),
        exit_code: Some(code),
        signal: None,
        launch_error: None,
        stdout_log: "launcher.stdout.log".into(),
        stderr_log: "launcher.stderr.log".into(),
        unidentified_processes: 0,
        quotes: Vec::new(),
        log_tail: tail.iter().map(|l| l.to_string()).collect(),
        port_in_use: None,
        restarted: Vec::new(),
        signalled: Vec::new(),
    }
}

/// The judgement of `ranks` under `launcher`, which ended as it says.
fn judge_under(scenario: &Scenario, ranks: &[RankResult], launcher: &LauncherEnd) -> Judgement {
    judge(&Observed {
        scenario,
        ranks,
        wall_s: 9.0,
        memory: None,
        leftovers: &Leftovers::default(),
        oom_kills: &[],
        xids: &[],
        cgroup: None,
        launcher: Some(launcher),
    })
}

fn external() -> Scenario {
    serde_json::from_value(
        serde_json::json!({"command": ["python", "train.py"], "launch": {"world_size": 2}}),
    )
    .unwrap()
}

#[test]
fn verdict_names_the_signal_phase_and_step() {
    let mut e = end(Some(Exit::Signal { signal: Signal::SEGV.number(), core_dumped: false }));
    e.state.phase = Some("forward".into());
    e.state.step = Some(3);
    e.state.backtrace =
        vec![Frame { addr: "0x1".into(), symbol: Some("inject_segv".into()), location: None }];
    let (outcome, first, v) = verdict(&[classify_rank(&e)]);
    assert_eq!((outcome, first), (OutcomeKind::Signaled, Some(0)));
    assert_eq!(v.headline, "Rank 0 was killed by SIGSEGV in `forward` at step 3.");
    assert_eq!(v.pattern.as_deref(), Some("native-crash"));
    assert!(v.likely_cause.unwrap().contains("exitcode: -11"));
}

#[test]
fn the_first_failure_is_the_culprit_and_later_failures_are_collateral() {
    let mut culprit = end(Some(Exit::Signal { signal: Signal::SEGV.number(), core_dumped: false }));
    culprit.rank = 1;
    culprit.ended_at_s = Some(2.0);
    culprit.state.phase = Some("forward".into());
    culprit.state.step = Some(3);
    let mut peer = end(Some(Exit::Code(1)));
    peer.rank = 0;
    peer.ended_at_s = Some(2.4);
    peer.state.phase = Some("allreduce".into());
    peer.state.step = Some(3);
    peer.state.error = Some("Connection closed by peer [127.0.0.1]:4000".into());
    let ranks = vec![classify_rank(&peer), classify_rank(&culprit)];
    let (outcome, first, v) = verdict(&ranks);
    assert_eq!((outcome, first), (OutcomeKind::Signaled, Some(1)));
    assert_eq!(
        v.headline,
        "Rank 1 was killed by SIGSEGV in `forward` at step 3. Rank 0 failed after it (collateral)."
    );
    let line = v.evidence.iter().find(|e| e.starts_with("collateral")).unwrap();
    assert_eq!(
        line,
        "collateral: rank 0 exited with status 1 in `allreduce` at step 3 0.40 s later: Connection closed by peer [127.0.0.1]:4000"
    );
}

#[test]
fn a_rank_that_only_lost_its_peer_is_collateral_even_when_it_ended_first() {
    // Rank 0 noticed the closed connection before rank 1's end was seen: still collateral.
    let lost = program_rank(
        0,
        Exit::Code(1),
        1.0,
        "Traceback (most recent call last):\n  File \"/t/train.py\", line 9, in <module>\nRuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4000",
    );
    let killed = program_rank(1, Exit::Signal { signal: Signal::KILL.number(), core_dumped: false }, 1.2, "");
    let mut case = Case::new(vec![lost, killed]);
    case.scenario = external();
    let (_, first, v) = case.judge();
    assert_eq!(first, Some(1));
    assert_eq!(v.pattern.as_deref(), Some("peer-lost"));
    assert!(
        v.headline.starts_with("Rank 1 was killed by SIGKILL from outside; no OOM event was recorded."),
        "{}",
        v.headline
    );
    assert!(!v.headline.contains("OOM killer"), "{}", v.headline);
    assert!(v.evidence.iter().any(|e| e.starts_with("rank 0 lost its peer")), "{:#?}", v.evidence);
    assert!(
        v.evidence.contains(&"collateral: rank 0 exited with status 1: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4000".to_string()),
        "{:#?}",
        v.evidence
    );
    assert!(!v.headline.contains("marker"), "no trainer texts for a program: {}", v.headline);
}

fn hung_at(rank: u32, phase: &str, step: u64, last_marker_at_s: f64) -> RankResult {
    let mut e = end(Some(Exit::Signal { signal: Signal::KILL.number(), core_dumped: false }));
    e.rank = rank;
    e.intervention = Some(Intervention::Hung { silence_s: 10.0, at_s: 12.0 });
    e.state.phase = Some(phase.into());
    e.state.step = Some(step);
    e.state.last_marker_at = Some(last_marker_at_s);
    e.state.markers = 10;
    classify_rank(&e)
}

#[test]
fn the_odd_rank_of_an_out_of_step_hang_is_named_by_where_it_waits_whoever_spoke_last() {
    // Rank 1 ran fewer steps and waits in the final barrier; rank 0 waits in step 4's
    // all-reduce. Which last marker arrived first is scheduling: both orders name rank 1.
    for (barrier_at, allreduce_at) in [(1.00, 1.02), (1.02, 1.00)] {
        let ranks = vec![hung_at(0, "allreduce", 4, allreduce_at), hung_at(1, "dist.barrier", 3, barrier_at)];
        let (outcome, first, v) = verdict(&ranks);
        assert_eq!((outcome, first), (OutcomeKind::Hung, Some(1)), "{barrier_at} vs {allreduce_at}");
        assert_eq!(v.pattern.as_deref(), Some("ranks-out-of-step"));
        assert!(v.likely_cause.unwrap().contains("Rank 1 stopped first"));
    }
    // A rank that skipped a collective is a step ahead of the others.
    let ranks = vec![
        hung_at(0, "allreduce", 4, 1.0),
        hung_at(1, "allreduce", 5, 1.1),
        hung_at(2, "allreduce", 4, 1.2),
    ];
    assert_eq!(verdict(&ranks).1, Some(1));
    // A rank stuck by itself (outside any collective) holds the others up.
    let ranks = vec![hung_at(0, "allreduce", 4, 1.0), hung_at(1, "data.next", 4, 1.5)];
    assert_eq!(verdict(&ranks).1, Some(1));
    // Nobody stands out: the earliest last marker decides, as for any failure, and no pattern
    // is claimed.
    let ranks = vec![hung_at(0, "allreduce", 4, 1.3), hung_at(1, "allreduce", 4, 1.1)];
    let (_, first, v) = verdict(&ranks);
    assert_eq!(first, Some(1));
    assert_eq!(v.pattern, None);
}

#[test]
fn a_built_in_rank_waiting_in_its_barrier_through_the_store_is_out_of_step_not_at_the_rendezvous() {
    // The built-in trainer's `dist.barrier` waits in c10d's TCPStore, like a rendezvous does;
    // its markers say it joined long ago (regression: this run was once called
    // `rendezvous-incomplete`, depending on where the stack dump caught the barrier).
    let store = |symbol: &str| crate::protocol::Frame {
        addr: "0x1".into(),
        symbol: Some(symbol.into()),
        location: None,
    };
    let mut barrier = hung_at(1, "dist.barrier", 5, 7.3);
    barrier.stacks.push(crate::schema::ThreadStack {
        tid: 1,
        thread: "ups-doctor".into(),
        frames: vec![
            store("__libc_recv"),
            store("_ZN4c10d6detail9TCPClient12receiveValueIlEET_v"),
            store("_ZN4c10d8TCPStore3addERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEEl"),
        ],
    });
    let (outcome, first, v) = verdict(&[hung_at(0, "allreduce", 5, 7.6), barrier]);
    assert_eq!((outcome, first), (OutcomeKind::Hung, Some(1)));
    assert_eq!(v.pattern.as_deref(), Some("ranks-out-of-step"), "{v:#?}");
}

/// A program's hung rank with a py-spy dump of its main thread.
fn hung_with_stack(rank: u32, frames: &str) -> RankResult {
    let mut r =
        program_rank(rank, Exit::Signal { signal: Signal::TERM.number(), core_dumped: false }, 30.0, "");
    r.outcome = OutcomeKind::Hung;
    r.hang_detected_after_s = Some(20.0);
    r.torn_down_with = Some(Signal::TERM);
    r.dumps.push(crate::schema::ProcessDump {
        pid: 1000 + rank,
        rank,
        role: ProcessRole::Rank,
        taken: None,
        py_spy: Some(format!(
            "Process {}: python t.py\n\nThread 1 (idle): \"MainThread\"\n{frames}",
            1000 + rank
        )),
        error: None,
        python: None,
        threads: vec![crate::schema::KernelThread {
            tid: 1,
            name: "python".into(),
            wchan: Some("futex_wait_queue".into()),
            syscall: Some("202 (futex)".into()),
        }],
    });
    r
}

/// DeepSpeed's ZeRO gathers wait in `c10d::Work::wait` under `all_gather_into_tensor` (seen in the
/// accuracy matrix: rank 1 asleep in the optimizer step, rank 0 waiting there): a collective wait,
/// so rank 1, outside any, is the odd one.
#[test]
fn a_rank_waiting_in_a_collectives_work_is_in_a_collective() {
    let gather = "    pthread_cond_wait (libc.so.6)\n    c10d::Work::wait (libtorch_cpu.so)\n    \
                  all_gather_into_tensor (torch/distributed/distributed_c10d.py:4179)\n    \
                  DeepSpeedZeroOptimizer.step (deepspeed/runtime/zero/stage_1_and_2.py:2088)\n    <module> (t.py:12)\n";
    let asleep = "    clock_nanosleep (libc.so.6)\n    time_sleep (libpython3.11.so.1.0)\n    \
                  _on_step (sitecustomize.py:138)\n    Optimizer.profile_hook_step.<locals>.wrapper (torch/optim/optimizer.py:523)\n    \
                  <module> (t.py:12)\n";
    let mut case = Case::new(vec![hung_with_stack(0, gather), hung_with_stack(1, asleep)]);
    case.scenario = external();
    let (outcome, first, v) = case.judge();
    assert_eq!((outcome, first), (OutcomeKind::Hung, Some(1)), "{}", v.headline);
    assert_eq!(v.pattern.as_deref(), Some("ranks-out-of-step"), "{}", v.headline);
}

#[test]
fn ranks_out_of_step_are_named_from_py_spy_stacks_without_markers() {
    let barrier = "    futex_wait (libc.so.6)\n    c10d::Work::wait (libtorch_cpu.so)\n    barrier (torch/distributed/distributed_c10d.py:4881)\n    <module> (t.py:60)\n";
    let backward = "    futex_wait (libc.so.6)\n    c10d::Reducer::finalize_backward (libtorch_cpu.so)\n    backward (torch/_tensor.py:630)\n    train (t.py:54)\n";
    let mut case = Case::new(vec![hung_with_stack(0, barrier), hung_with_stack(1, backward)]);
    case.scenario = external();
    let (outcome, first, v) = case.judge();
    assert_eq!((outcome, first), (OutcomeKind::Hung, Some(0)));
    assert_eq!(v.pattern.as_deref(), Some("ranks-out-of-step"));
    assert!(v.headline.contains("rank 0 waits in `dist.barrier()`"), "{}", v.headline);
    assert!(
        v.headline.contains("rank 1 waits in DDP's gradient all-reduce (`Reducer::finalize_backward`"),
        "{}",
        v.headline
    );
    assert!(!format!("{v:?}").contains("trainer"), "no trainer texts for a program: {v:#?}");
    assert!(
        v.evidence.contains(
            &"the kernel: rank 0's main thread sits in 202 (futex); rank 1's main thread sits in 202 (futex)"
                .to_string()
        ),
        "{:#?}",
        v.evidence
    );
}

/// Two ranks, each waiting in a collective the other is not in (seen in TRL's DPO script under
/// Accelerate: rank 1 skipped an `all_gather` and went on to DDP's `broadcast`; rank 0 waits in the
/// `all_gather`): a rank that skipped one and a rank that added one look the same, so no rank is
/// named, where before the one listed first was called "the odd one".
#[test]
fn ranks_each_in_a_collective_of_its_own_name_no_rank() {
    let gather = "    pthread_cond_wait (libc.so.6)\n    all_gather (torch/distributed/distributed_c10d.py:3813)\n    \
                  gather (accelerate/utils/operations.py:349)\n    <module> (t.py:12)\n";
    let broadcast = "    pthread_cond_wait (libc.so.6)\n    broadcast (torch/distributed/distributed_c10d.py:2730)\n    \
                     _sync_buffers (torch/nn/parallel/distributed.py:1600)\n    <module> (t.py:9)\n";
    for ranks in [[(0, gather), (1, broadcast)], [(0, broadcast), (1, gather)]] {
        let mut case = Case::new(ranks.iter().map(|(r, f)| hung_with_stack(*r, f)).collect());
        case.scenario = external();
        let (outcome, first, v) = case.judge();
        assert_eq!((outcome, first), (OutcomeKind::Hung, None), "{}", v.headline);
        assert_eq!(v.pattern.as_deref(), Some("ranks-out-of-step"), "{}", v.headline);
        assert!(
            v.headline.contains("which of them left the program's order the stacks cannot tell"),
            "{}",
            v.headline
        );
        assert!(!v.headline.contains("odd one") && !v.headline.contains("collateral"), "{}", v.headline);
    }
    // Of four, two in `all_reduce` and the two others each in a collective of its own: neither of
    // those two is odder than the other. One alone in its own, the two others alike: it is.
    let reduce = "    pthread_cond_wait (libc.so.6)\n    all_reduce (torch/distributed/distributed_c10d.py:2950)\n    \
                  <module> (t.py:11)\n";
    let judge_four = |frames: [&str; 4]| {
        let mut case =
            Case::new(frames.iter().enumerate().map(|(r, f)| hung_with_stack(r as u32, f)).collect());
        case.scenario = external();
        case.judge()
    };
    let (_, first, v) = judge_four([reduce, reduce, gather, broadcast]);
    assert_eq!(first, None, "{}", v.headline);
    let (_, first, v) = judge_four([reduce, reduce, reduce, broadcast]);
    assert_eq!(first, Some(3), "{}", v.headline);
}

/// Under a launcher, ranks without markers share its output: two hung ranks whose stacks are alike
/// (both in `DataLoader.__next__`) went silent at the same moment as far as can be seen, so
/// neither is first and neither collateral. Stacks that tell them apart still name the odd one;
/// ranks that print their own output (per rank) are still ordered by it.
#[test]
fn ranks_hung_at_the_same_moment_of_a_launchers_shared_output_are_named_together_none_first() {
    let waiting = "    poll (libc.so.6)\n    _MultiProcessingDataLoaderIter._try_get_data (torch/utils/data/dataloader.py:1310)\n    _BaseDataLoaderIter.__next__ (torch/utils/data/dataloader.py:741)\n    <module> (t.py:16)\n";
    let ranks = || {
        (0..2)
            .map(|rank| {
                let mut r = hung_with_stack(rank, waiting);
                r.last_output_at_s = Some(11.91);
                r
            })
            .collect::<Vec<_>>()
    };
    let observed = |ranks: &[RankResult], scenario: &Scenario, launcher: Option<&LauncherEnd>| {
        judge(&Observed {
            scenario,
            ranks,
            wall_s: 20.0,
            memory: None,
            leftovers: &Leftovers::default(),
            oom_kills: &[],
            xids: &[],
            cgroup: None,
            launcher,
        })
    };
    let scenario = external();
    let launcher = torchrun_end(1, &[]);
    let together = ranks();
    let j = observed(&together, &scenario, Some(&launcher));
    assert_eq!((j.outcome, j.first_failure), (OutcomeKind::Hung, None), "{:#?}", j.verdict);
    assert_eq!(j.same_failure, [1]);
    assert!(
        j.verdict.headline.starts_with(
            "Ranks 0, 1 hung together: no progress for 20.0 s; which of them stopped first cannot be told."
        ),
        "{}",
        j.verdict.headline
    );
    assert!(!j.verdict.headline.contains("collateral"), "{}", j.verdict.headline);
    assert!(
        j.verdict.evidence.iter().any(|l| l.starts_with(
            "ranks 0, 1 sent no markers and share the launcher's output, whose last line came at 11.91 s"
        )),
        "{:#?}",
        j.verdict.evidence
    );
    // Each rank with output of its own (no launcher): ordered by it, as before.
    let mut apart = ranks();
    apart[1].last_output_at_s = Some(12.5);
    let j = observed(&apart, &scenario, None);
    assert_eq!(j.first_failure, Some(0), "{:#?}", j.verdict);
    assert!(j.verdict.headline.contains("Rank 1 failed after it (collateral)"), "{}", j.verdict.headline);
    // A marker from rank 1 tells its silence apart: the first to go silent is first.
    let mut marked = ranks();
    marked[1].last_marker_at_s = Some(9.0);
    let j = observed(&marked, &scenario, Some(&launcher));
    assert!(j.first_failure.is_some(), "{:#?}", j.verdict);
    assert!(!j.verdict.headline.contains("hung together"), "{}", j.verdict.headline);
}

/// A program's rank the time limit (40 s, `hang_after_s` 10) ended after its last output at
/// `last_s`, its process having used `cpu_s` of CPU over the `silent_s` read of its silence.
fn timed_out(rank: u32, last_s: f64, silent: Option<(f64, f64)>) -> RankResult {
    let mut r =
        program_rank(rank, Exit::Signal { signal: Signal::TERM.number(), core_dumped: false }, 41.0, "");
    r.outcome = OutcomeKind::TimedOut;
    r.signal = None;
    r.torn_down_with = Some(Signal::TERM);
    r.last_output_at_s = Some(last_s);
    r.silent_cpu = silent.map(|(silent_s, cpu_s)| crate::schema::SilentCpu { silent_s, cpu_s });
    r
}

fn time_limited(ranks: Vec<RankResult>) -> Case {
    let mut case = Case::new(ranks);
    case.scenario = external();
    case.scenario.limits.timeout_s = 40.0;
    case.scenario.limits.hang_after_s = 10.0;
    case
}

#[test]
fn a_silent_rank_that_keeps_a_core_busy_to_the_time_limit_is_named_busy_not_making_progress() {
    // Rank 1 spins (27 s of CPU in 28 s of silence) while rank 0 waits (0.1 s of CPU): rank 1 is
    // the one, whichever the teardown reached first.
    let (outcome, first, v) =
        time_limited(vec![timed_out(0, 11.0, Some((28.0, 0.1))), timed_out(1, 11.5, Some((28.0, 27.0)))])
            .judge();
    assert_eq!((outcome, first), (OutcomeKind::TimedOut, Some(1)), "{v:#?}");
    assert!(
        v.headline.starts_with(
            "Rank 1 went silent but kept a core busy (96% of a core) until the run's time limit of 40 s: busy, not hung."
        ),
        "{}",
        v.headline
    );
    assert!(!format!("{v:?}").contains("kept making progress"), "{v:#?}");
    let said = v.evidence.join("\n");
    assert!(said.contains("rank 1 was silent (no marker, no output) for at least 28.0 s before the time limit, and its process and its DataLoader workers used 27.0 s of CPU in that time (96% of a core)"), "{said}");
    assert!(said.contains("rank 0 was silent too, using 0% of a core over 28.0 s: waiting"), "{said}");
    assert!(v.next_step.as_deref().is_some_and(|n| n.starts_with("Read rank 1's stack below.")), "{v:#?}");

    // Both busy (a CUDA synchronize spins while it waits): no rank is picked out, none collateral.
    let (_, _, v) =
        time_limited(vec![timed_out(0, 11.0, Some((28.0, 26.0))), timed_out(1, 11.5, Some((28.0, 27.0)))])
            .judge();
    assert!(
        v.headline.starts_with("Ranks 0, 1 went silent but kept their cores busy until the run's time limit of 40 s: busy, not hung; CPU time cannot tell which of them the others wait for."),
        "{}",
        v.headline
    );
    assert!(!v.headline.contains("collateral"), "{}", v.headline);

    // Silent for less than `hang_after_s` (both were still printing): not busy-silent; the ranks
    // were progressing (see the test below: none named).
    let (_, _, v) =
        time_limited(vec![timed_out(0, 38.0, Some((1.5, 1.4))), timed_out(1, 38.0, Some((1.5, 1.4)))])
            .judge();
    assert!(v.headline.contains("still making progress at the run's time limit of 40 s"), "{}", v.headline);
    assert!(v.likely_cause.as_deref().is_some_and(|c| c.contains("kept making progress")), "{v:#?}");
}

#[test]
fn ranks_all_still_making_progress_at_the_time_limit_name_no_culprit_and_no_collateral() {
    // Both ranks printed until 38 s of a 40 s limit, and the teardown ended rank 0 a moment before
    // rank 1: a tie at teardown is no cause. No straggler stands out (no step times to compare).
    let (outcome, first, v) =
        time_limited(vec![timed_out(0, 38.0, Some((1.5, 1.4))), timed_out(1, 38.0, Some((1.5, 1.4)))])
            .judge();
    assert_eq!((outcome, first), (OutcomeKind::TimedOut, None), "{v:#?}");
    assert!(
        v.headline.starts_with("Ranks 0, 1 were all still making progress at the run's time limit of 40 s"),
        "{}",
        v.headline
    );
    assert!(!v.headline.contains("collateral"), "{}", v.headline);
    // One rank silent and idle since long before the limit while the other still printed: not a
    // tie; a rank is named (the silence accounts decide which).
    let (_, first, v) =
        time_limited(vec![timed_out(0, 38.0, Some((1.5, 1.4))), timed_out(1, 12.0, Some((28.0, 0.1)))])
            .judge();
    assert!(first.is_some() && !v.headline.contains("all still making progress"), "{v:#?}");
}

#[test]
fn an_unused_ddp_parameter_quotes_the_exception_not_the_hint_and_says_find_unused_parameters() {
    let text = include_str!("../fixtures/ddp_unused.txt");
    let mut case = Case::new(vec![
        program_rank(0, Exit::Code(1), 3.0, text),
        program_rank(1, Exit::Code(1), 3.1, &text.replace("[rank0]", "[rank1]")),
    ]);
    case.scenario = external();
    let (_, first, v) = case.judge();
    assert_eq!(first, Some(0));
    assert_eq!(v.pattern.as_deref(), Some("ddp-unused-parameters"));
    assert!(
        v.headline
            .starts_with("DDP found unused parameters: rank 0 raised `Expected to have finished reduction"),
        "{}",
        v.headline
    );
    assert!(v.headline.contains("parameter indices without a gradient: 2 3"), "{}", v.headline);
    assert!(v.next_step.as_deref().unwrap().contains("find_unused_parameters=True"));
    let key = v.key_line.unwrap();
    assert!(key.starts_with("RuntimeError: Expected to have finished reduction"), "{key}");
    assert!(key.ends_with("(patterns.py:53 in train)"), "{key}");
    assert!(!v.headline.contains("In addition, you can set"), "the trailing hint is not the error");
}

#[test]
fn a_rank_gone_before_the_rendezvous_is_named_with_the_survivors_store_timeout() {
    let survivor = program_rank(0, Exit::Code(1), 11.0, include_str!("../fixtures/rendezvous_timeout.txt"));
    let gone = program_rank(1, Exit::Code(0), 2.0, "");
    let mut case = Case::new(vec![survivor, gone]);
    case.scenario = external();
    let (outcome, first, v) = case.judge();
    assert_eq!((outcome, first), (OutcomeKind::Exited, Some(0)));
    assert_eq!(v.pattern.as_deref(), Some("rendezvous-incomplete"));
    assert_eq!(
        v.headline,
        "The rendezvous never completed: rank 1 exited with status 0 at 2.0 s without joining; rank 0 waited in \
         `init_process_group` and gave up: `torch.distributed.DistStoreError: Timed out after 9 seconds waiting for \
         clients. 1/2 clients joined.`."
    );
    assert!(v.evidence.contains(&"the store saw 1 of 2 ranks join".to_string()));
}

/// Rank 1 exited with status 3 as it called `init_process_group` (the accuracy matrix's
/// exit-rdzv fault under torchrun, Lightning's Trainer); torchrun then stopped rank 0, whose own
/// stack at the SIGTERM (the observer's, written by Python's fault handler; recorded) shows it
/// inside `init_process_group`: the rendezvous never completed, and rank 1 is why. Before, with
/// nothing to say where rank 0 was, the verdict named no pattern.
#[test]
fn a_rank_its_launcher_stopped_inside_init_process_group_waited_for_the_one_that_exited_before_joining() {
    let mut waiting =
        program_rank(0, Exit::Signal { signal: Signal::TERM.number(), core_dumped: false }, 11.35, "");
    waiting.dumps.push(crate::schema::ProcessDump {
        pid: 1000,
        rank: 0,
        role: ProcessRole::Rank,
        taken: None,
        py_spy: None,
        error: None,
        python: Some(include_str!("../fixtures/stopped_in_rendezvous.txt").to_string()),
        threads: Vec::new(),
    });
    let gone = program_rank(1, Exit::Code(3), 11.30, "");
    let launcher = torchrun_end(
        1,
        &[
            "W1206 04:49:48.815000 18446 torch/distributed/elastic/multiprocessing/api.py:1012] Sending process 1000 \
           closing signal SIGTERM",
        ],
    );
    let j = judge_under(&external(), &[waiting, gone], &launcher);
    assert_eq!((j.outcome, j.first_failure), (OutcomeKind::Exited, Some(1)), "{:#?}", j.verdict);
    assert_eq!(j.verdict.pattern.as_deref(), Some("rendezvous-incomplete"), "{:#?}", j.verdict);
    assert_eq!(
        j.verdict.headline,
        "The rendezvous never completed: rank 1 exited with status 3 at 11.3 s without joining; rank 0 waited in \
         `init_process_group` and was stopped there. Rank 0 failed after it (collateral)."
    );

    // The same rank stopped after the group formed (its stack elsewhere) says nothing of a
    // rendezvous.
    let mut later =
        program_rank(0, Exit::Signal { signal: Signal::TERM.number(), core_dumped: false }, 11.35, "");
    let training = include_str!("../fixtures/stopped_in_rendezvous.txt")
        .lines()
        .filter(|l| !l.contains("init_process_group"))
        .collect::<Vec<_>>()
        .join("\n");
    later.dumps.push(crate::schema::ProcessDump {
        pid: 1000,
        rank: 0,
        role: ProcessRole::Rank,
        taken: None,
        py_spy: None,
        error: None,
        python: Some(training),
        threads: Vec::new(),
    });
    let j = judge_under(&external(), &[later, program_rank(1, Exit::Code(3), 11.30, "")], &launcher);
    assert_eq!(j.first_failure, Some(1));
    assert_eq!(j.verdict.pattern, None, "{:#?}", j.verdict);
}

/// Lightning's own launcher: rank 1 (its child) exited with status 3 as it called
/// `init_process_group`; Lightning then SIGKILLed every process, rank 0 (the launcher process
/// itself) included, which writes no stack. Its observer said it entered `init_process_group`
/// and never returned: the rendezvous never completed, and rank 1 is why. Lightning's `ddp_spawn`
/// the same way: spawn reaped rank 0 before its end was read, but it wrote its stack as SIGTERM
/// came, inside `init_process_group`.
#[test]
fn a_rank_killed_or_reaped_inside_init_process_group_without_a_stack_or_an_end_waited_for_the_one_that_left()
{
    let joining = || crate::schema::ObservedProgram { joining: true, ..Default::default() };
    let mut killed =
        program_rank(0, Exit::Signal { signal: Signal::KILL.number(), core_dumped: false }, 7.6, "");
    killed.observed = Some(joining());
    let gone = program_rank(1, Exit::Code(3), 7.3, "");
    let lightning = torchrun_end(
        1,
        &[
            "[rank: 0] Child process with PID 1001 terminated with code 3. Forcefully terminating all other processes to avoid zombies 🧟",
        ],
    );
    let j = judge_under(&external(), &[killed.clone(), gone.clone()], &lightning);
    assert_eq!(j.first_failure, Some(1), "{:#?}", j.verdict);
    assert_eq!(j.verdict.pattern.as_deref(), Some("rendezvous-incomplete"), "{:#?}", j.verdict);
    // Returned from it (a group formed): a later SIGKILL says nothing of a rendezvous.
    let mut formed = killed.clone();
    formed.observed.as_mut().unwrap().group = Some(crate::schema::GroupFormed {
        backend: "gloo".into(),
        rank: 0,
        world_size: 2,
        store: String::new(),
    });
    let j = judge_under(&external(), &[formed, gone.clone()], &lightning);
    assert_ne!(j.verdict.pattern.as_deref(), Some("rendezvous-incomplete"), "{:#?}", j.verdict);

    // Reaped by spawn before its end was read, its stack written as SIGTERM came.
    // As the harness leaves it: found, gone, its status never read.
    let mut reaped = reaped_at_sigterm(7.6, include_str!("../fixtures/stopped_in_rendezvous.txt"));
    let spawn = torchrun_end(
        1,
        &["torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with exit code 3"],
    );
    let j = judge_under(&external(), &[reaped.clone(), gone.clone()], &spawn);
    assert_eq!(j.first_failure, Some(1), "{:#?}", j.verdict);
    assert_eq!(j.verdict.pattern.as_deref(), Some("rendezvous-incomplete"), "{:#?}", j.verdict);
    // Without the stack written at SIGTERM, its end is unknown: no rendezvous is claimed.
    reaped.dumps[0].taken = None;
    let j = judge_under(&external(), &[reaped, gone], &spawn);
    assert_ne!(j.verdict.pattern.as_deref(), Some("rendezvous-incomplete"), "{:#?}", j.verdict);
}

/// Lightning's `ddp_spawn` with rank 1 exiting as it called `init_process_group`: its process
/// ended before it was found, so the run knows only rank 0, which `torch.multiprocessing.spawn`
/// stopped while it waited there (its stack recorded), and spawn's own words. Rank 0 is no culprit
/// (before, it was named the first failure); which rank did not come is not claimed.
#[test]
fn a_rank_stopped_in_the_rendezvous_with_nobody_seen_to_leave_is_no_culprit() {
    let mut waiting =
        program_rank(0, Exit::Signal { signal: Signal::TERM.number(), core_dumped: false }, 47.3, "");
    waiting.dumps.push(crate::schema::ProcessDump {
        pid: 1000,
        rank: 0,
        role: ProcessRole::Rank,
        taken: None,
        py_spy: None,
        error: None,
        python: Some(include_str!("../fixtures/stopped_in_rendezvous.txt").to_string()),
        threads: Vec::new(),
    });
    let launcher = torchrun_end(
        1,
        &[
            "W1206 05:00:48.779000 7343 torch/multiprocessing/spawn.py:165] Terminating process 1000 via signal SIGTERM",
            "torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with exit code 3",
        ],
    );
    let mut scenario = external();
    scenario.launch.world_size = 1;
    let j = judge_under(&scenario, &[waiting], &launcher);
    assert_eq!(j.first_failure, None, "{:#?}", j.verdict);
    assert_eq!(j.verdict.pattern.as_deref(), Some("rendezvous-incomplete"), "{:#?}", j.verdict);
    assert!(
        j.verdict.headline.starts_with(
            "The rendezvous never completed: no rank of this run was seen to leave: the one that did not come ended \
             before it was found; rank 0 waited in `init_process_group` and was stopped there."
        ),
        "{}",
        j.verdict.headline
    );
    assert!(
        j.verdict.evidence.contains(
            &"the launcher said: `torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with exit \
              code 3`"
                .to_string()
        ),
        "{:#?}",
        j.verdict.evidence
    );
}

/// The same, with rank 0 stopped before it reached `init_process_group` (no stack of it): all
/// the run knows is that spawn stopped rank 0 and said process 1 had exited. Rank 0, with no error
/// of its own, is no culprit (before, "Rank 0 was ended by its launcher" named it the first failure).
#[test]
fn the_only_rank_known_stopped_by_its_launcher_with_no_error_of_its_own_is_no_culprit() {
    let waiting =
        program_rank(0, Exit::Signal { signal: Signal::TERM.number(), core_dumped: false }, 11.6, "");
    let launcher = torchrun_end(
        1,
        &[
            "W1206 05:54:12.050000 19544 torch/multiprocessing/spawn.py:165] Terminating process 1000 via signal SIGTERM",
            "torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with exit code 3",
        ],
    );
    let mut scenario = external();
    scenario.launch.world_size = 1;
    let j = judge_under(&scenario, &[waiting], &launcher);
    assert_eq!(j.first_failure, None, "{:#?}", j.verdict);
    assert_eq!(
        j.verdict.headline,
        "The launcher `python` stopped rank 0 after another of its processes failed, which was not found as a rank; \
         the launcher said: `torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with exit code \
         3`."
    );
}

/// PyTorch-Ignite's `Parallel` × kill-worker (the accuracy matrix): rank 1's DataLoader worker was
/// killed, rank 1 raised (spawn reaped it before its status was read), and spawn stopped rank 0
/// with SIGTERM 0.2 ms before rank 1's end was seen. Spawn said so at the top of its output, above
/// the ranks' tracebacks, out of its last lines: before, rank 0's SIGTERM was "from outside", and
/// rank 0, ended first, was named.
#[test]
fn a_rank_its_launcher_said_it_stopped_far_above_its_last_lines_is_not_the_first_failure() {
    let error = "RuntimeError: DataLoader worker (pid(s) 12535) exited unexpectedly (ignite_trainer.py:13 in training)";
    let stopped =
        program_rank(0, Exit::Signal { signal: Signal::TERM.number(), core_dumped: false }, 21.3825, "");
    let mut raised = program_rank(1, Exit::Code(1), 21.3827, "");
    raised.exit_code = None;
    raised.error = Some(error.to_string());
    let tail: Vec<String> =
        (0..40).map(|i| format!("  File \"/site-packages/ignite/engine.py\", line {i}")).collect();
    let tail: Vec<&str> = tail.iter().map(String::as_str).collect();
    let mut launcher = torchrun_end(1, &tail);
    launcher.signalled =
        vec!["W1206 17:54:46.841000 12432 torch/multiprocessing/spawn.py:165] Terminating process 1000 via signal SIGTERM".into()];
    let j = judge_under(&external(), &[stopped.clone(), raised.clone()], &launcher);
    assert_eq!(j.first_failure, Some(1), "{:#?}", j.verdict);
    assert!(
        j.verdict.headline.starts_with("A DataLoader worker (pid 12535) of rank 1 failed first"),
        "{}",
        j.verdict.headline
    );
    assert!(j.verdict.headline.ends_with("Rank 0 failed after it (collateral)."), "{}", j.verdict.headline);
}

/// Rank 0 (pid 1000) as the harness leaves one its launcher reaped: found, gone, its status never
/// read, its Python stack (`python`) written as SIGTERM came.
fn reaped_at_sigterm(ended_at: f64, python: &str) -> RankResult {
    let mut reaped = program_rank(0, Exit::Code(0), ended_at, "");
    (reaped.outcome, reaped.exit_code, reaped.exit_source) =
        (OutcomeKind::Exited, None, Some(crate::schema::ExitSource::Unknown));
    reaped.dumps.push(crate::schema::ProcessDump {
        pid: 1000,
        rank: 0,
        role: ProcessRole::Rank,
        taken: Some(crate::schema::TAKEN_AT_SIGTERM.into()),
        py_spy: None,
        error: None,
        python: Some(python.to_string()),
        threads: Vec::new(),
    });
    reaped
}

/// `launchers::a_rank_mp_spawn_reaped…` (failed in a full run on a loaded machine): spawn reaped
/// rank 0 before its end was read, rank 0 wrote its stack as spawn's SIGTERM came, and spawn said
/// it sent it; rank 1's SIGSEGV is spawn's own account, read 0.3 ms after rank 0's end. Rank 0,
/// stopped by its launcher with no error of its own, is not the first failure (before, its
/// SIGTERM was "from outside" and rank 0 was named).
#[test]
fn a_reaped_rank_that_wrote_its_stack_at_its_launchers_sigterm_is_collateral() {
    let reaped = reaped_at_sigterm(
        8.1602,
        "Thread 0x1 (most recent call first):\n  File \"launchers.py\", line 90 in train",
    );
    let segv =
        program_rank(1, Exit::Signal { signal: Signal::SEGV.number(), core_dumped: false }, 8.1605, "");
    let mut spawn = torchrun_end(
        1,
        &["torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal SIGSEGV"],
    );
    spawn.signalled =
        vec!["W1206 torch/multiprocessing/spawn.py:165] Terminating process 1000 via signal SIGTERM".into()];
    let j = judge_under(&external(), &[reaped.clone(), segv.clone()], &spawn);
    assert_eq!(j.first_failure, Some(1), "{:#?}", j.verdict);
    assert!(j.verdict.headline.starts_with("Rank 1 was killed by SIGSEGV"), "{}", j.verdict.headline);
}

/// transformers' `Trainer` with DataLoader workers and a 16 KiB `/dev/shm` (the accuracy
/// matrix's small-shm fault; rank 0's traceback recorded): the DataLoader's iterator could not
/// make its semaphores, `OSError: [Errno 28] No space left on device` from multiprocessing's
/// `SemLock`, on every rank. No worker ever started, so nothing said "shared memory" or "worker";
/// before, the verdict quoted the error and named no pattern and not `/dev/shm`.
#[test]
fn no_space_left_for_a_multiprocessing_semaphore_is_dev_shm_exhausted() {
    let text = include_str!("../fixtures/semlock_enospc.txt");
    let first = program_rank(0, Exit::Code(1), 23.2, text);
    let second = program_rank(1, Exit::Code(1), 23.4, text);
    let mut case = Case::new(vec![first, second]);
    case.scenario = external();
    let (outcome, first, v) = case.judge();
    assert_eq!((outcome, first), (OutcomeKind::Exited, Some(0)));
    assert_eq!(v.pattern.as_deref(), Some("shm-exhausted"), "{v:#?}");
    assert!(
        v.headline.starts_with(
            "Rank 0 could not create a semaphore (multiprocessing's `SemLock`) in /dev/shm: `OSError: [Errno 28] No \
             space left on device`."
        ),
        "{}",
        v.headline
    );

    // The same error from writing a file (a checkpoint on a full disk) is not about /dev/shm.
    let disk = "Traceback (most recent call last):\n  File \"/work/train.py\", line 9, in <module>\n    \
                torch.save(model.state_dict(), path)\n  File \"/usr/lib/python3.11/site-packages/torch/serialization.py\", \
                line 943, in save\n    with _open_zipfile_writer(f) as opened_zipfile:\nOSError: [Errno 28] No space left \
                on device";
    let mut case = Case::new(vec![program_rank(0, Exit::Code(1), 3.0, disk)]);
    case.scenario = external();
    let (_, _, v) = case.judge();
    assert_eq!(v.pattern, None, "{v:#?}");
}

/// The same under a launcher whose ranks share its output (PyTorch-Ignite's `Parallel`, spawn's
/// ranks; the accuracy matrix's ignite × small-shm): each rank's own words are its observer's
/// error line, the traceback is the launcher's. Before, the rank's error was quoted and neither a
/// pattern nor `/dev/shm` named.
#[test]
fn no_space_left_for_a_semaphore_in_a_launchers_shared_traceback_is_dev_shm_exhausted() {
    let error = "OSError: [Errno 28] No space left on device (ignite_trainer.py:13 in training)";
    let rank = |r: u32, at: f64| {
        let mut rank = program_rank(r, Exit::Code(1), at, "");
        rank.error = Some(error.to_string());
        rank
    };
    let traceback: Vec<&str> = include_str!("../fixtures/semlock_enospc.txt").lines().collect();
    let launcher = torchrun_end(1, &traceback);
    let j = judge_under(&external(), &[rank(0, 15.6), rank(1, 15.8)], &launcher);
    assert_eq!(j.verdict.pattern.as_deref(), Some("shm-exhausted"), "{:#?}", j.verdict);
    assert!(j.verdict.headline.contains("in /dev/shm"), "{}", j.verdict.headline);
    // Both raised it on their own, and spawn reaped both before their statuses were read: which
    // ended first is a race, so the lowest rank is named and the other failed the same way on its
    // own (before, whichever ended first was named and the other called collateral).
    let unread = |r: u32, at: f64| RankResult { exit_code: None, ..rank(r, at) };
    let j = judge_under(&external(), &[unread(0, 15.8), unread(1, 15.6)], &launcher);
    assert_eq!((j.first_failure, j.same_failure.as_slice()), (Some(0), &[1][..]), "{:#?}", j.verdict);
    assert_eq!(j.verdict.pattern.as_deref(), Some("shm-exhausted"), "{:#?}", j.verdict);
    // A rank whose own error is another one is not read into the launcher's words.
    let mut other = rank(0, 15.6);
    other.error = Some("ValueError: bad sample (train.py:9 in <module>)".to_string());
    let j = judge_under(&external(), &[other], &launcher);
    assert_ne!(j.verdict.pattern.as_deref(), Some("shm-exhausted"), "{:#?}", j.verdict);
}

#[test]
fn a_dataloader_workers_exception_names_the_dataset_line_and_index() {
    let mut case =
        Case::new(vec![program_rank(0, Exit::Code(1), 3.0, include_str!("../fixtures/dataset_error.txt"))]);
    case.scenario = external();
    let (_, _, v) = case.judge();
    assert_eq!(v.pattern.as_deref(), Some("dataloader-worker-exception"));
    assert_eq!(
        v.headline,
        "DataLoader worker 0 of rank 0 raised `ValueError: corrupt sample at index 5` in the dataset at \
         `patterns.py:66 in __getitem__`, sample index 5; rank 0 exited with status 1 as a consequence."
    );
}

/// NCCL's and PyTorch's texts for the GPU-only patterns, as REFERENCE.md records them.
#[test]
fn gpu_only_patterns_are_recognised_from_pytorchs_recorded_texts() {
    let cases = [
        (
            "[rank0]:[E1124 05:00:00.000000 1 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600100 milliseconds before timing out.",
            "nccl-watchdog-timeout",
            "Rank 0's NCCL watchdog timed out in ALLREDUCE (SeqNum=12) after 600000 ms",
        ),
        (
            "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, invalid usage\nncclInvalidUsage: This usually reflects invalid usage of NCCL library.\nLast error:\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA device 1a000",
            "duplicate-gpu",
            "",
        ),
        (
            "RuntimeError: Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n  File \"/t/train.py\", line 20, in __getitem__\n    x = self.data[i].cuda()\nRuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use the 'spawn' start method",
            "cuda-in-forked-child",
            "",
        ),
    ];
    for (text, id, headline) in cases {
        let mut case = Case::new(vec![program_rank(0, Exit::Code(1), 3.0, text)]);
        case.scenario = external();
        let (_, _, v) = case.judge();
        assert_eq!(v.pattern.as_deref(), Some(id), "{text}");
        assert!(v.headline.starts_with(headline), "{}", v.headline);
        assert!(v.reference.as_deref().is_some_and(|r| r.starts_with("https://")));
    }
}

#[test]
fn ranks_that_built_different_models_are_named_from_ddps_check() {
    let text = "Traceback (most recent call last):\n  File \"/t/train.py\", line 30, in <module>\n    \
                model = DistributedDataParallel(net)\nRuntimeError: DDP expects same model across all ranks, but Rank 1 \
                has 4 params, while rank 0 has inconsistent 6 params.";
    let mut case =
        Case::new(vec![program_rank(0, Exit::Code(0), 9.0, ""), program_rank(1, Exit::Code(1), 2.0, text)]);
    case.scenario = external();
    let (_, first, v) = case.judge();
    assert_eq!(first, Some(1));
    assert_eq!(v.pattern.as_deref(), Some("ddp-model-mismatch"));
    assert!(v.key_line.unwrap().ends_with("inconsistent 6 params. (train.py:30 in <module>)"));
}

fn memory_at_end(rank: u32, used: u64, total: u64) -> MemoryReport {
    let mut m = MemoryReport::default();
    m.shm.private = true;
    m.shm.at_rank_end.push(ShmAt { rank, t_s: 2.02, used_bytes: used, total_bytes: total });
    m
}

#[test]
fn a_bus_error_with_dev_shm_full_is_out_of_shared_memory() {
    let mut e = end(Some(Exit::Signal { signal: Signal::BUS.number(), core_dumped: false }));
    e.state.phase = Some("forward".into());
    e.state.step = Some(2);
    let mut case = Case::new(vec![classify_rank(&e)]);
    case.scenario.data.shm_size = Some("8m".into());
    case.memory = Some(memory_at_end(0, 8 << 20, 8 << 20));
    let (_, _, v) = case.judge();
    assert!(
        v.evidence.contains(
            &"the run's private `/dev/shm` (`data.shm_size` = `8m`) was at 8.0 of 8.0 MiB (100%) when rank 0 \
              was killed by SIGBUS at 2.02 s"
                .to_string()
        ),
        "{:#?}",
        v.evidence
    );
    assert_eq!(v.pattern.as_deref(), Some("shm-exhausted"));
    let cause = v.likely_cause.unwrap();
    assert!(cause.starts_with("Out of shared memory"), "{cause}");
    assert!(cause.contains("Please try to raise your shared memory limit."), "{cause}");
    assert!(v.next_step.unwrap().contains("raise `data.shm_size`"));

    // Room left in /dev/shm: the figure is evidence, and no shm pattern is claimed.
    case.memory = Some(memory_at_end(0, 1 << 20, 8 << 20));
    let (_, _, v) = case.judge();
    assert_eq!(v.pattern.as_deref(), Some("native-crash"));
    assert!(v.evidence.iter().any(|e| e.contains("at 1.0 of 8.0 MiB (12%)")));
}

fn process(rank: u32, worker: Option<u32>, pid: u32, pss: u64) -> ProcessMemory {
    ProcessMemory {
        rank,
        role: if worker.is_some() { ProcessRole::Worker } else { ProcessRole::Rank },
        worker,
        pid,
        command: "python".into(),
        peak_rss_bytes: pss,
        peak_pss_bytes: pss,
        peak_uss_bytes: pss,
        peak_shared_bytes: 0,
    }
}

/// DeepSpeed's shared-memory all-reduce on a 16 KiB `/dev/shm` (the accuracy matrix's small-shm
/// fault under the `deepspeed` launcher): rank 1 was killed by SIGSEGV as DeepSpeed set up its
/// buffers (its dump, in the launcher's output, recorded), with `/dev/shm` full at that moment.
/// Before, a native crash; a SIGSEGV with room left in `/dev/shm` still is one.
#[test]
fn a_segfault_while_dev_shm_was_full_is_shm_exhausted() {
    let segv = Exit::Signal { signal: Signal::SEGV.number(), core_dumped: false };
    let term = Exit::Signal { signal: Signal::TERM.number(), core_dumped: false };
    let dump: Vec<&str> = include_str!("../fixtures/deepspeed_shm_segv.txt").lines().collect();
    let launcher = torchrun_end(1, &dump);
    for (used, pattern) in [(16384, "shm-exhausted"), (4096, "native-crash")] {
        let ranks = [program_rank(0, term, 63.9, ""), program_rank(1, segv, 63.4, "")];
        let mut memory = memory_at_end(1, used, 16384);
        memory.shm.at_rank_end.push(ShmAt { rank: 0, t_s: 63.9, used_bytes: used, total_bytes: 16384 });
        let j = judge(&Observed {
            scenario: &external(),
            ranks: &ranks,
            wall_s: 64.0,
            memory: Some(&memory),
            leftovers: &Leftovers::default(),
            oom_kills: &[],
            xids: &[],
            cgroup: None,
            launcher: Some(&launcher),
        });
        assert_eq!(j.first_failure, Some(1), "{:#?}", j.verdict);
        assert_eq!(j.verdict.pattern.as_deref(), Some(pattern), "{:#?}", j.verdict);
        if used == 16384 {
            assert!(
                j.verdict.headline.starts_with(
                    "Rank 1 was killed by SIGSEGV while /dev/shm was full (16.0 of 16.0 KiB when it died)"
                ),
                "{}",
                j.verdict.headline
            );
        }
    }
}

#[test]
fn a_worker_bus_error_names_the_worker() {
    let mut e = end(Some(Exit::Code(1)));
    e.state.error = Some(
        "DataLoader worker (pid 4242) is killed by signal: Bus error. It is possible that dataloader's \
         workers are out of shared memory."
            .into(),
    );
    let mut memory = memory_at_end(0, 64 << 20, 64 << 20);
    memory.shm.private = false;
    memory.processes.push(process(0, Some(3), 4242, 0));
    let mut case = Case::new(vec![classify_rank(&e)]);
    case.memory = Some(memory);
    let (_, _, v) = case.judge();
    assert_eq!(v.pattern.as_deref(), Some("shm-exhausted"));
    assert!(v.likely_cause.unwrap().contains("SIGBUS to worker 3 of rank 0 (pid 4242)"));
    assert!(v.evidence.iter().any(|e| e.starts_with("the machine's `/dev/shm` was at 64.0 of 64.0 MiB")));
}

#[test]
fn a_run_waiting_mostly_for_data_is_input_bound() {
    let mut e = end(Some(Exit::Code(0)));
    e.state.done = true;
    e.state.steps_done = 20;
    e.state.data_ms = 78.0;
    e.state.compute_ms = 22.0;
    let (_, _, v) = verdict(&[classify_rank(&e)]);
    assert!(v.headline.ends_with(" Input-bound: 78% of step time waiting for data."), "{}", v.headline);
    assert_eq!(v.pattern.as_deref(), Some("input-bound"));
    assert!(v.next_step.unwrap().contains("more workers"));
    let mut quick = e.clone();
    quick.state.data_ms = 10.0;
    let (_, _, v) = verdict(&[classify_rank(&quick)]);
    assert_eq!(v.pattern, None);
    // After one step, the wait is the workers' start-up: not a pipeline's pace (issue 56).
    let mut one = e.clone();
    one.state.steps_done = 1;
    one.state.data_ms = 100.0;
    one.state.compute_ms = 0.0;
    let (_, _, v) = verdict(&[classify_rank(&one)]);
    assert_eq!(v.pattern, None, "{}", v.headline);
    assert!(!v.headline.contains("Input-bound"), "{}", v.headline);
}

#[test]
fn a_worker_killed_by_hand_is_not_called_an_oom_kill() {
    let mut e = end(Some(Exit::Code(1)));
    e.rank = 1;
    e.state.phase = Some("data.next".into());
    e.state.step = Some(4);
    e.state.error = Some(
        "DataLoader worker (pid 4242) is killed by signal: Killed. [data-loader worker 0 of rank 1, fork]"
            .into(),
    );
    let (outcome, first, v) = verdict(&[classify_rank(&e)]);
    assert_eq!((outcome, first), (OutcomeKind::Exited, Some(1)));
    assert_eq!(v.pattern.as_deref(), Some("worker-killed-by-signal"));
    assert_eq!(
        v.headline,
        "DataLoader worker 0 (pid 4242) of rank 1 failed first (is killed by signal: Killed.); rank 1 exited with \
         status 1 as a consequence in `data.next` at step 4."
    );
    assert!(v.evidence.iter().any(|l| l.starts_with("culprit: DataLoader worker 0 (pid 4242) of rank 1")));
    let cause = v.likely_cause.unwrap();
    assert!(cause.contains("no OOM event was recorded"), "{cause}");
    assert!(!v.headline.contains("OOM"), "{}", v.headline);
}

fn oom_case(kill: OomKill) -> Case {
    let mut e = end(Some(Exit::Code(1)));
    e.pid = Some(500);
    e.ended_at_s = Some(4.0);
    e.state.error = Some("DataLoader worker (pid 502) is killed by signal: Killed.".into());
    let mut killed_rank = end(Some(Exit::Signal { signal: Signal::KILL.number(), core_dumped: false }));
    killed_rank.rank = 1;
    killed_rank.pid = Some(600);
    killed_rank.ended_at_s = Some(4.5);
    let mut case = Case::new(vec![classify_rank(&e), classify_rank(&killed_rank)]);
    case.memory = Some(MemoryReport {
        processes: vec![
            process(0, None, 500, 300 << 20),
            process(0, Some(0), 501, 520 << 20),
            process(0, Some(2), 502, 700 << 20),
            process(1, None, 600, 500 << 20),
        ],
        ..Default::default()
    });
    case.cgroup = Some(CgroupReport {
        path: "/sys/fs/cgroup/memory/ups-doctor/x".into(),
        version: CgroupVersion::V1,
        limit_bytes: Some(2 << 30),
        peak_bytes: Some(2_126_008_812),
        oom_kills: 1,
    });
    case.oom_kills = vec![kill];
    case
}

#[test]
fn an_oom_killed_worker_and_an_oom_killed_rank_are_named_with_the_cgroup_figures() {
    let worker = OomKill {
        pid: 502,
        rank: Some(0),
        worker: Some(2),
        at_s: Some(3.9),
        source: OomSource::Kmsg,
        process_name: Some("pt_data_worker".into()),
        anon_rss_bytes: Some(690 << 20),
    };
    let (_, first, v) = oom_case(worker).judge();
    assert_eq!(first, Some(0));
    assert_eq!(v.pattern.as_deref(), Some("oom-kill"));
    assert!(
        v.headline.starts_with(
            "DataLoader worker 2 (pid 502) of rank 0 was killed by the OOM killer: cgroup limit 2.0 GiB, the \
             scenario's processes held 1.98 GiB; rank 0 exited with status 1 as a consequence."
        ),
        "{}",
        v.headline
    );
    assert!(
        v.evidence.contains(
            &"the kernel log: `Killed process 502 (pt_data_worker)`, anon-rss 690.0 MiB".to_string()
        ),
        "{:#?}",
        v.evidence
    );
    let holders = v.evidence.iter().find(|e| e.starts_with("who held the memory")).unwrap();
    assert!(
        holders.starts_with(
            "who held the memory (peak PSS): rank 0 worker 2 (pid 502) 700.0 MiB, rank 0 worker 0"
        ),
        "{holders}"
    );

    let rank = OomKill {
        pid: 600,
        rank: Some(1),
        worker: None,
        at_s: Some(4.4),
        source: OomSource::Cgroup,
        process_name: None,
        anon_rss_bytes: None,
    };
    let (_, first, v) = oom_case(rank).judge();
    assert_eq!(first, Some(1));
    assert!(
        v.headline.starts_with("Rank 1 (pid 600) was killed by the OOM killer: cgroup limit 2.0 GiB"),
        "{}",
        v.headline
    );
    assert!(
        v.evidence.iter().any(|e| e.starts_with("the cgroup's `oom_kill` counter rose to 1 while pid 600"))
    );

    // The same SIGKILLs with no OOM event recorded: never called an OOM kill.
    let mut none = oom_case(OomKill {
        pid: 1,
        rank: None,
        worker: None,
        at_s: None,
        source: OomSource::Cgroup,
        process_name: None,
        anon_rss_bytes: None,
    });
    none.oom_kills.clear();
    none.cgroup.as_mut().unwrap().oom_kills = 0;
    let (_, _, v) = none.judge();
    assert_ne!(v.pattern.as_deref(), Some("oom-kill"));
    assert!(!v.headline.contains("OOM killer"), "{}", v.headline);
    assert!(
        v.likely_cause
            .unwrap()
            .contains("no OOM event was recorded for it (the scenario's memory cgroup counted no OOM kill)")
    );
}

/// The kernel killed a worker, then the rank itself 11 ms later, before the rank saw its worker
/// die (seen in a loaded rehearsal): the rank did not fail "as a consequence", it was killed too.
#[test]
fn a_rank_oom_killed_after_its_worker_is_named_as_killed_too_not_as_a_consequence() {
    let kmsg = |pid, worker, at_s, name: &str| OomKill {
        pid,
        rank: Some(0),
        worker,
        at_s: Some(at_s),
        source: OomSource::Kmsg,
        process_name: Some(name.into()),
        anon_rss_bytes: Some(200 << 20),
    };
    let mut case = oom_case(kmsg(502, Some(2), 3.9, "loader-w2"));
    // Rank 0 ended by that SIGKILL, not with an exit status of its own.
    let mut e = end(Some(Exit::Signal { signal: Signal::KILL.number(), core_dumped: false }));
    e.pid = Some(500);
    e.ended_at_s = Some(3.95);
    case.ranks[0] = classify_rank(&e);
    case.oom_kills.push(kmsg(500, None, 3.911, "ups-doctor-trai"));
    case.cgroup.as_mut().unwrap().oom_kills = 2;
    let (_, first, v) = case.judge();
    assert_eq!(first, Some(0));
    assert_eq!(v.pattern.as_deref(), Some("oom-kill"));
    assert!(
        v.headline.starts_with(
            "DataLoader worker 2 (pid 502) of rank 0 was killed by the OOM killer: cgroup limit 2.0 GiB, the \
             scenario's processes held 1.98 GiB; rank 0 (pid 500) was killed by it too, 11 ms later."
        ) && !v.headline.contains("consequence"),
        "{}",
        v.headline
    );
    assert!(
        v.evidence.contains(
            &"2 OOM kills in all: DataLoader worker 2 (pid 502) of rank 0 at 3.900 s, rank 0 (pid 500) at 3.911 s"
                .to_string()
        ),
        "{:#?}",
        v.evidence
    );
}

#[test]
fn a_program_that_swallowed_its_error_is_a_false_success_in_its_own_words() {
    let mut r = program_rank(0, Exit::Code(0), 1.0, "wrapper: ignoring the dataset path does not exist");
    r.outcome = OutcomeKind::FalseSuccess;
    let mut case = Case::new(vec![r]);
    case.scenario = external();
    let (_, _, v) = case.judge();
    assert_eq!(v.pattern.as_deref(), Some("false-success"));
    assert_eq!(v.headline, "Rank 0 exited with status 0 without the completion evidence: a false success.");
}

#[test]
fn leftovers_and_quotes_of_a_passed_run() {
    let mut e = end(Some(Exit::Code(0)));
    e.state.done = true;
    let mut case = Case::new(vec![classify_rank(&e)]);
    case.leftovers.shm.push(crate::schema::LeftoverSegment {
        name: "ups-doctor-1-x".into(),
        size_bytes: 4096,
        allocated_bytes: 4096,
        ours: true,
        earlier_run: false,
        removed: true,
        error: None,
    });
    let (outcome, _, v) = case.judge();
    assert_eq!(outcome, OutcomeKind::Passed);
    assert_eq!(v.pattern.as_deref(), Some("leaked-shm"));
    assert!(
        v.evidence.iter().any(|l| l == "left 1 segment in `/dev/shm` (4.0 KiB), removed by ups-doctor"),
        "{:#?}",
        v.evidence
    );
}

#[test]
fn the_built_in_trainers_gpu_patterns_are_named_too() {
    let mut e = end(Some(Exit::Code(1)));
    e.state.error = Some(
        "Caught an error in DataLoader worker process 0 (pid 77): CUDA error: initialization error \
         [data-loader worker 0 of rank 0, fork]"
            .into(),
    );
    let mut case = Case::new(vec![classify_rank(&e)]);
    (case.scenario.data.workers, case.scenario.data.cache_device) = (2, crate::scenario::CacheDevice::Cuda);
    let (_, _, v) = case.judge();
    assert_eq!(v.pattern.as_deref(), Some("cuda-in-forked-child"));
    assert!(v.likely_cause.as_deref().unwrap().contains("Cannot re-initialize CUDA in forked subprocess"));
    assert!(v.next_step.as_deref().unwrap().starts_with("use `data.start_method: spawn`"));
    assert!(v.evidence.iter().any(|e| e.contains("`data.cache_device: cuda`")), "{:?}", v.evidence);

    let mut e = end(Some(Exit::Code(1)));
    e.state.error = Some(
        "NCCL error in ncclCommInitRankConfig on rank 1 (cuda:0): invalid usage\nLast error:\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000"
            .into(),
    );
    let (_, _, v) = verdict(&[classify_rank(&e)]);
    assert_eq!(v.pattern.as_deref(), Some("duplicate-gpu"));
    assert!(v.likely_cause.unwrap().starts_with("Two ranks were given the same GPU"));
}

#[test]
fn rank_ranges_sum_up_runs() {
    assert_eq!(super::rank_ranges(&(3..1024).collect::<Vec<_>>()), "3–1023");
    assert_eq!(super::rank_ranges(&[9, 1, 3, 4, 5]), "1, 3–5, 9");
    assert_eq!(super::rank_ranges(&[2, 3]), "2, 3");
    assert_eq!(super::rank_ranges(&[7]), "7");
}

#[test]
fn ranks_out_of_open_files_are_summed_up_and_not_sent_to_path() {
    let ranks: Vec<RankResult> = (0..1024)
        .map(|rank| {
            let mut e = end(None);
            e.rank = rank;
            if rank == 0 {
                e.exit = Some(Exit::Code(1));
                e.ended_at_s = Some(1.0);
            } else if rank >= 3 {
                e.launch_error = Some("failed to start `python`: Too many open files (os error 24)".into());
                e.ended_at_s = Some(0.5);
            } else {
                e.exit = Some(Exit::Code(0));
                e.completed = Some(true);
            }
            classify_rank(&e)
        })
        .collect();
    let mut case = Case::new(ranks);
    case.scenario = external();
    let (_, first, v) = case.judge();
    assert_eq!(first, Some(3), "{v:#?}");
    assert!(v.headline.contains("Ranks 0, 4–1023 failed after it"), "{}", v.headline);
    assert!(v.headline.len() < 400, "{}", v.headline);
    let launch_lines: Vec<&String> =
        v.evidence.iter().filter(|e| e.contains("could not be started")).collect();
    assert_eq!(launch_lines.len(), 1, "{:#?}", v.evidence);
    assert!(launch_lines[0].contains("ranks 4–1023"), "{}", launch_lines[0]);
    let next = v.next_step.as_deref().unwrap_or_default();
    assert!(!next.contains("PATH"), "{next}");
    assert!(next.contains("open-file limit"), "{next}");
}

#[test]
fn ranks_that_fail_with_the_same_error_each_by_itself_are_not_collateral() {
    let shm = |rank: u32, at: f64, pid: u32| {
        program_rank(
            rank,
            Exit::Code(1),
            at,
            &format!(
                "Traceback (most recent call last):\n  File \"/t/train.py\", line 9, in <module>\n    next(it)\n\
                 RuntimeError: unable to allocate shared memory(shm) for file </torch_{pid}_1827363_0>: Resource exhausted (12)"
            ),
        )
    };
    let mut case = Case::new(vec![shm(0, 3.00, 4242), shm(1, 3.01, 4243)]);
    case.scenario = external();
    let j = judge(&Observed {
        scenario: &case.scenario,
        ranks: &case.ranks,
        wall_s: 4.0,
        memory: None,
        leftovers: &case.leftovers,
        oom_kills: &[],
        xids: &[],
        cgroup: None,
        launcher: None,
    });
    assert_eq!(j.first_failure, Some(0));
    assert_eq!(j.same_failure, [1]);
    assert!(!j.verdict.headline.contains("failed after it"), "{}", j.verdict.headline);
    // A different error on the other rank keeps it collateral.
    let other = program_rank(1, Exit::Code(1), 3.5, "RuntimeError: Connection closed by peer");
    let (_, first, v) = Case { scenario: external(), ..Case::new(vec![shm(0, 3.0, 4242), other]) }.judge();
    assert_eq!(first, Some(0));
    assert!(v.headline.contains("Rank 1 failed after it (collateral)"), "{}", v.headline);
}

#[test]
fn a_launcher_that_ended_before_any_rank_is_the_failure_and_no_rank_is() {
    let never = |rank: u32| {
        let mut e = end(None);
        e.rank = rank;
        e.launch_error = Some(format!("no process of rank {rank} was identified under the launcher"));
        classify_rank(&e)
    };
    let ranks = vec![never(0), never(1)];
    let scenario: Scenario = serde_json::from_value(serde_json::json!({
        "command": ["torchrun", "--nproc_per_node", "2", "train.py"], "launch": {"world_size": 2, "style": "launcher"}
    }))
    .unwrap();
    let launcher = torchrun_end(
        2,
        &["usage: torchrun [-h]", "torchrun: error: argument --master_port: expected one argument"],
    );
    let j = judge(&Observed {
        scenario: &scenario,
        ranks: &ranks,
        wall_s: 1.0,
        memory: None,
        leftovers: &Leftovers::default(),
        oom_kills: &[],
        xids: &[],
        cgroup: None,
        launcher: Some(&launcher),
    });
    assert_eq!((j.outcome, j.first_failure), (OutcomeKind::LaunchFailed, None));
    assert!(
        j.verdict.headline.starts_with("`torchrun` exited with status 2 before any of its 2 ranks started"),
        "{}",
        j.verdict.headline
    );
    assert!(!j.verdict.headline.contains("collateral"), "{}", j.verdict.headline);
}

/// torchrun started with `--nnodes 2` on one machine waits in its rendezvous for a node that was
/// never started: the run is called hung with no rank process ever found. No rank hung, first or
/// collateral; the verdict says what the launcher waits for and how to start the other node.
#[test]
fn a_launcher_that_waited_for_its_other_nodes_started_no_rank_and_none_is_blamed() {
    let waiting = |rank: u32| {
        let mut e = end(None);
        e.rank = rank;
        let mut r = classify_rank(&e);
        r.outcome = OutcomeKind::Hung;
        r.pid = None;
        r.hang_detected_after_s = Some(8.0);
        r
    };
    let ranks = vec![waiting(0), waiting(1), waiting(2), waiting(3)];
    let scenario = |argv: &[&str]| -> Scenario {
        serde_json::from_value(serde_json::json!({
            "command": argv, "launch": {"world_size": 4, "style": "launcher"}, "limits": {"hang_after_s": 8}
        }))
        .unwrap()
    };
    let mut launcher = torchrun_end(0, &["W1127 torch/distributed/run.py:851] *****"]);
    (launcher.exit_code, launcher.signal) = (None, Some(Signal::TERM));
    let judged_with = |s: &Scenario, launcher: &LauncherEnd| {
        judge(&Observed {
            scenario: s,
            ranks: &ranks,
            wall_s: 9.0,
            memory: None,
            leftovers: &Leftovers::default(),
            oom_kills: &[],
            xids: &[],
            cgroup: None,
            launcher: Some(launcher),
        })
    };
    let judged = |s: &Scenario| judged_with(s, &launcher);
    let two = scenario(&["torchrun", "--nnodes", "2", "--nproc_per_node", "2", "train.py"]);
    let j = judged(&two);
    assert_eq!((j.outcome, j.first_failure), (OutcomeKind::Hung, None));
    let h = &j.verdict.headline;
    assert!(h.starts_with("No rank started: `torchrun` ran without starting any of its 4 ranks"), "{h}");
    assert!(
        h.contains("It was started with `--nnodes 2`: it starts its ranks once 2 nodes have joined"),
        "{h}"
    );
    assert!(!h.contains("collateral") && !h.contains("Rank 0"), "{h}");
    assert!(j.verdict.next_step.as_deref().is_some_and(|n| n.contains("--set launch.nodes=2")));
    // One node asked for: it waits for its store, not for nodes.
    let j = judged(&scenario(&["torchrun", "--nproc_per_node", "4", "train.py"]));
    assert!(!j.verdict.headline.contains("--nnodes"), "{}", j.verdict.headline);
    assert!(j.verdict.likely_cause.as_deref().is_some_and(|c| c.contains("rendezvous store")));
    // What it waits for is the launcher's own, from the table (srun's line: its words for a job
    // that waits, Slurm's `allocate.c`): srun for its allocation, a job
    // script that runs `ray start` for its cluster's head; a command the table does not know, in
    // no launcher's words (before: torchrun's rendezvous store for each of them).
    let waits = |kind: Option<&str>, argv: &[&str], line: &str| {
        let mut l = launcher.clone();
        l.kind = kind.map(String::from);
        l.log_tail = vec![line.to_string()];
        let j = judged_with(&scenario(argv), &l);
        assert_eq!((j.outcome, j.first_failure), (OutcomeKind::Hung, None));
        (
            j.verdict.likely_cause.unwrap_or_default(),
            j.verdict.next_step.unwrap_or_default(),
            j.verdict.evidence,
        )
    };
    let (cause, next, _) = waits(
        Some("srun"),
        &["srun", "-n", "4", "python", "train.py"],
        "srun: job 7 queued and waiting for resources",
    );
    assert!(cause.starts_with("`srun` waits before it starts its ranks: for its allocation"), "{cause}");
    assert!(next.contains("squeue -j JOBID") && !cause.contains("rendezvous"), "{next}");
    // Ray 2.60's `ray start --address` to a port nothing listens on (run here, 2026-12-07).
    let gcs = "[2026-12-07 12:46:41,780 W 5153 5153] gcs_client.cc:210: Failed to get cluster ID from GCS server: \
               TimedOut: Timed out while waiting for GCS to become available.";
    let (cause, next, evidence) = waits(Some("Ray Train"), &["bash", "ray-job.sh"], gcs);
    assert!(
        cause.starts_with("`bash` (it runs Ray Train) waits before it starts its ranks: for its Ray cluster"),
        "{cause}"
    );
    assert!(next.contains("ray status --address") && !cause.contains("rendezvous"), "{next}");
    assert!(evidence.iter().any(|e| e.contains("Failed to get cluster ID from GCS server")), "{evidence:?}");
    let (cause, _, _) = waits(None, &["bash", "job.sh"], "starting");
    assert_eq!(cause, "`bash` waits before it starts its ranks; what for, its output above may say.");
}

/// torchrun's agent SIGTERMs a rank that had already raised (it was exiting when rank 0, which
/// lost its peer, failed first in torchrun's eyes): the headline leads with the rank's own error
/// and says who sent the signal, not "from outside".
#[test]
fn a_rank_the_launcher_says_it_sigtermed_after_its_own_error_is_named_with_that_error() {
    let raised = program_rank(
        1,
        Exit::Signal { signal: Signal::TERM.number(), core_dumped: false },
        1.0,
        "Traceback (most recent call last):\n  File \"/t/test_ops.py\", line 40, in test_gather\nAssertionError",
    );
    let lost = program_rank(
        0,
        Exit::Code(1),
        0.9,
        "Traceback (most recent call last):\n  File \"/t/test_ops.py\", line 38, in test_gather\nRuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4000",
    );
    let scenario: Scenario = serde_json::from_value(serde_json::json!({
        "command": ["torchrun", "--nproc_per_node", "2", "test_ops.py"], "launch": {"world_size": 2, "style": "launcher"}
    }))
    .unwrap();
    let launcher = torchrun_end(
        1,
        &[
            "W1127 07:33:05.456000 764 torch/distributed/elastic/multiprocessing/api.py:1012] Sending process 1001 closing signal SIGTERM",
        ],
    );
    let ranks = vec![lost, raised];
    let j = judge(&Observed {
        scenario: &scenario,
        ranks: &ranks,
        wall_s: 1.2,
        memory: None,
        leftovers: &Leftovers::default(),
        oom_kills: &[],
        xids: &[],
        cgroup: None,
        launcher: Some(&launcher),
    });
    assert_eq!(j.first_failure, Some(1), "{}", j.verdict.headline);
    assert!(
        j.verdict.headline.starts_with(
            "Rank 1 failed: AssertionError; `torchrun` then ended it with SIGTERM while it was exiting."
        ),
        "{}",
        j.verdict.headline
    );
    assert!(!j.verdict.headline.contains("from outside"), "{}", j.verdict.headline);
    // Its end is its error, as when it exits with status 1 before the SIGTERM comes.
    assert_eq!(j.outcome, OutcomeKind::Exited);
}

/// Seen in `tests/resources.rs` under load: both ranks raised the same error; rank 1 exited first
/// and torchrun SIGTERMed rank 0 as it exited after its traceback. Rank 0 is named first (the
/// lowest of those that raised, whichever exit the clock saw first), and rank 1 failed the same way
/// on its own: it is not rank 0's collateral. The same verdict as when rank 0 exited by itself.
#[test]
fn the_lowest_rank_named_first_after_the_launchers_sigterm_leaves_the_others_not_collateral() {
    let error = "Traceback (most recent call last):\n  File \"/t/checkpoint.py\", line 31, in <module>\n\
                 RuntimeError: Error(s) in loading state_dict for Sequential:";
    let scenario: Scenario = serde_json::from_value(serde_json::json!({
        "command": ["torchrun", "--nproc_per_node", "2", "checkpoint.py"],
        "launch": {"world_size": 2, "style": "launcher"}
    }))
    .unwrap();
    let launcher = torchrun_end(
        1,
        &[
            "W1206 05:31:05.456000 764 torch/distributed/elastic/multiprocessing/api.py:1012] Sending process 1000 \
           closing signal SIGTERM",
        ],
    );
    let sigterm = Exit::Signal { signal: Signal::TERM.number(), core_dumped: false };
    for rank0_exit in [sigterm, Exit::Code(1)] {
        let ranks = [program_rank(0, rank0_exit, 7.60, error), program_rank(1, Exit::Code(1), 7.58, error)];
        let j = judge_under(&scenario, &ranks, &launcher);
        assert_eq!(j.first_failure, Some(0), "{rank0_exit:?}: {}", j.verdict.headline);
        assert_eq!(j.same_failure, [1], "{rank0_exit:?}: {}", j.verdict.headline);
        assert!(
            !j.verdict.evidence.iter().any(|e| e.starts_with("collateral")),
            "{rank0_exit:?}: {:?}",
            j.verdict.evidence
        );
    }
}

/// Seen in a rehearsal of the suite (`observe::a_ranks_uncaught_exception_under_torchrun…`, a
/// loaded machine): rank 1 failed at import before ups-doctor found its process, so its end is
/// known only from torchrun's summary, read after rank 0's end; rank 0, which torchrun then
/// stopped with SIGTERM while it ran (no error, not exiting), looked first by the clock. A rank
/// its launcher stopped while running is collateral of one that failed by itself.
#[test]
fn a_rank_the_launcher_stopped_while_running_is_collateral_of_one_whose_end_was_read_later() {
    let mut stopped =
        program_rank(0, Exit::Signal { signal: Signal::TERM.number(), core_dumped: false }, 6.018, "");
    stopped.exit_source = Some(ExitSource::Procfs);
    let mut failed = program_rank(
        1,
        Exit::Code(1),
        6.021,
        "Traceback (most recent call last):\n  File \"/t/observed_ddp.py\", line 16, in <module>\nModuleNotFoundError: \
         No module named 'torch.utils.data.distributed'",
    );
    failed.exit_source = Some(ExitSource::Torchrun);
    let scenario: Scenario = serde_json::from_value(serde_json::json!({
        "command": ["torchrun", "--nproc_per_node", "2", "observed_ddp.py"],
        "launch": {"world_size": 2, "style": "launcher"}
    }))
    .unwrap();
    let launcher = torchrun_end(
        1,
        &[
            "W1129 16:09:05.456000 764 torch/distributed/elastic/multiprocessing/api.py:1012] Sending process 1000 \
           closing signal SIGTERM",
        ],
    );
    let j = judge_under(&scenario, &[stopped.clone(), failed.clone()], &launcher);
    assert_eq!(j.first_failure, Some(1), "{}", j.verdict.headline);
    assert!(j.verdict.headline.starts_with("Rank 1 exited with status 1"), "{}", j.verdict.headline);

    // Had rank 0 an error of its own, the clock still decides.
    stopped.error = Some("RuntimeError: bad input on rank 0".into());
    let j = judge_under(&scenario, &[stopped, failed], &launcher);
    assert_eq!(j.first_failure, Some(0), "{}", j.verdict.headline);
}

/// `torch.multiprocessing.spawn` (seen in the fresh-clone CI under load): rank 1 raised; spawn
/// stopped rank 0 as its wrapper exited (its exit handlers had run), and rank 0's end was seen
/// 0.05 s *before* rank 1's. The launcher's word and rank 1's own error decide, not the clocks.
#[test]
fn a_rank_its_launcher_stopped_without_a_word_of_its_own_is_not_first_where_another_raised() {
    let mut stopped =
        program_rank(0, Exit::Signal { signal: Signal::TERM.number(), core_dumped: false }, 10.70, "");
    stopped.observed =
        Some(crate::schema::ObservedProgram { exiting_at_s: Some(10.18), ..Default::default() });
    let raised = program_rank(
        1,
        Exit::Code(1),
        10.75,
        "Traceback (most recent call last):\nValueError: bad shard on rank 1",
    );
    let scenario: Scenario = serde_json::from_value(serde_json::json!({
        "command": ["python", "train.py"], "launch": {"world_size": 2, "style": "launcher"}
    }))
    .unwrap();
    let launcher = torchrun_end(
        1,
        &[
            "W1202 02:06:51.056000 6017 torch/multiprocessing/spawn.py:165] Terminating process 1000 via signal SIGTERM",
        ],
    );
    let j = judge_under(&scenario, &[stopped, raised], &launcher);
    assert_eq!(j.first_failure, Some(1), "{}", j.verdict.headline);
    assert!(j.verdict.headline.contains("ValueError: bad shard on rank 1"), "{}", j.verdict.headline);
}

/// `torch.multiprocessing.spawn` reaped both ranks before ups-doctor read either status (seen
/// with ups-doctor frozen): each end was noticed at about the same moment, rank 0's a little
/// first. spawn's account names process 1's SIGSEGV, and its log says it then stopped rank 0's
/// process: rank 0, of whose end nothing else is known, is collateral, not the first failure.
#[test]
fn a_rank_the_launcher_stopped_whose_end_was_not_seen_is_never_the_first_failure() {
    let mut stopped = end(None);
    stopped.rank = 0;
    stopped.pid = Some(1000);
    stopped.ended_at_s = Some(2.0);
    stopped.exit_source = Some(ExitSource::Unknown);
    let stopped = classify_rank(&stopped);
    let mut segv = program_rank(
        1,
        Exit::Signal { signal: Signal::SEGV.number(), core_dumped: false },
        2.001,
        "Fatal Python error: Segmentation fault",
    );
    segv.exit_source = Some(ExitSource::Spawn);
    let scenario: Scenario = serde_json::from_value(serde_json::json!({
        "command": ["python", "train.py"], "launch": {"world_size": 2, "style": "launcher"}
    }))
    .unwrap();
    let ranks = vec![stopped, segv];
    let judged = |tail: &[&str]| {
        let launcher = torchrun_end(1, tail);
        judge(&Observed {
            scenario: &scenario,
            ranks: &ranks,
            wall_s: 3.0,
            memory: None,
            leftovers: &Leftovers::default(),
            oom_kills: &[],
            xids: &[],
            cgroup: None,
            launcher: Some(&launcher),
        })
    };
    let said = judged(&[
        "W1128 13:27:51.056000 6017 torch/multiprocessing/spawn.py:165] Terminating process 1000 via signal SIGTERM",
        "torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal SIGSEGV",
    ]);
    assert_eq!(said.first_failure, Some(1), "{}", said.verdict.headline);
    assert!(said.verdict.headline.starts_with("Rank 1 was killed by SIGSEGV"), "{}", said.verdict.headline);
    // Without the launcher's word, the earlier end is all there is to go by.
    let unsaid = judged(&[
        "torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal SIGSEGV",
    ]);
    assert_eq!(unsaid.first_failure, Some(0), "{}", unsaid.verdict.headline);
}

/// A rank whose loop ended sooner exits 0; the other's next all-reduce fails with `Connection
/// closed by peer`: the rank that left is named, not the one that only noticed. Without a rank
/// that ended first, the lost peer stays what it was.
#[test]
fn a_rank_that_exited_0_before_its_peer_lost_it_is_the_one_that_left_early() {
    let lost = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:547] Connection closed by peer [127.0.0.1]:4000";
    let left = program_rank(1, Exit::Code(0), 4.6, "rank 1 done");
    let noticed = program_rank(0, Exit::Code(1), 5.0, lost);
    let (outcome, first, v) = Case { scenario: external(), ..Case::new(vec![noticed.clone(), left]) }.judge();
    assert_eq!((outcome, first), (OutcomeKind::Exited, Some(0)));
    assert_eq!(v.pattern.as_deref(), Some("rank-left-early"));
    assert!(
        v.headline.starts_with(
            "Rank 1 left early: it exited with status 0 while rank 0 still expected it in a collective, which failed \
             when the connection closed (`Connection closed by peer [127.0.0.1]:4000`)."
        ),
        "{}",
        v.headline
    );
    assert!(v.evidence.contains(&"rank 1 exited with status 0 at 4.60 s".to_string()), "{:?}", v.evidence);
    // Seen to end after the failure it still left first: its sockets closed before its
    // interpreter was done.
    let later = program_rank(1, Exit::Code(0), 5.5, "rank 1 done");
    let (_, _, v) = Case { scenario: external(), ..Case::new(vec![noticed.clone(), later]) }.judge();
    assert_eq!(v.pattern.as_deref(), Some("rank-left-early"), "{}", v.headline);
    // A rank that failed for its own reason is the cause, whoever else exited 0.
    let mut three = external();
    three.launch.world_size = 3;
    let crashed =
        program_rank(2, Exit::Signal { signal: Signal::SEGV.number(), core_dumped: false }, 4.8, "");
    let done = program_rank(1, Exit::Code(0), 4.6, "rank 1 done");
    let (_, first, v) = Case { scenario: three, ..Case::new(vec![noticed, done, crashed]) }.judge();
    assert_ne!(v.pattern.as_deref(), Some("rank-left-early"), "{}", v.headline);
    assert_eq!(first, Some(2), "{}", v.headline);
}

/// Recorded on an H200 (scripts/gpu-check.sh): spawned workers whose dataset cache was on the GPU
/// panicked (libtorch's CUDA part was not loaded in them) and exited with Rust's status 101. The
/// rank's stderr tail kept worker 0's panic, not that of worker 2, the one the rank named.
fn worker_exit_101(tail: &[&str]) -> RankResult {
    let mut e = end(Some(Exit::Code(1)));
    e.state.phase = Some("data.next".into());
    e.state.step = Some(0);
    e.state.error = Some(
        "DataLoader worker (pid 1592) exited unexpectedly with exit code 101. [data-loader worker 2 of rank 0, spawn]"
            .into(),
    );
    e.stderr_tail = tail.iter().map(|l| l.to_string()).collect();
    let mut r = classify_rank(&e);
    r.workers = (0..4)
        .map(|id| WorkerInfo { id, pid: 1590 + id, start_method: "spawn".into(), started_at_s: 1.2 })
        .collect();
    r
}

#[test]
fn a_worker_that_exits_with_a_status_of_its_own_is_not_called_killed_and_its_words_are_quoted() {
    let panic = "called `Result::unwrap()` on an `Err` value: Torch(\"Could not run 'aten::empty_strided' with \
                 arguments from the 'CUDA' backend.\")";
    let sibling = worker_exit_101(&[
        "   7: core::ops::function::FnOnce::call_once",
        "thread 'main' (1590) panicked at tch-0.24.0/src/wrappers/tensor_generated.rs:18501:27:",
        panic,
        "stack backtrace:",
    ]);
    let (outcome, first, v) = verdict(std::slice::from_ref(&sibling));
    assert_eq!((outcome, first), (OutcomeKind::Exited, Some(0)));
    assert_eq!(v.pattern.as_deref(), Some("worker-exited"));
    let cause = v.likely_cause.clone().unwrap();
    assert!(
        cause.starts_with("The worker exited by itself with status 101: it was not killed by a signal"),
        "{cause}"
    );
    assert!(cause.contains("Rust panic") && !cause.contains("SIGKILL") && !cause.contains("OOM"), "{cause}");
    let quoted = format!("another worker of rank 0, worker 0 (pid 1590), ended with: `{panic}`");
    assert!(v.evidence.contains(&quoted), "{:?}", v.evidence);
    assert!(
        v.headline.starts_with("DataLoader worker 2 (pid 1592) of rank 0 failed first"),
        "{}",
        v.headline
    );

    // The culprit's own panic, when the tail kept it, is its last words.
    let own = worker_exit_101(&["thread 'main' (1592) panicked at src/loader/worker.rs:9:5:", panic]);
    let (_, _, v) = verdict(&[own]);
    assert!(v.likely_cause.unwrap().contains(&format!("Its last words: `{panic}`.")));
    assert!(!v.evidence.iter().any(|l| l.starts_with("another worker")), "{:?}", v.evidence);

    // PyTorch's words for a signal stay the signal pattern.
    let mut killed = worker_exit_101(&[]);
    killed.error = Some("DataLoader worker (pid 1592) is killed by signal: Killed.".into());
    let (_, _, v) = verdict(&[killed]);
    assert_eq!(v.pattern.as_deref(), Some("worker-killed-by-signal"));
}

/// Recorded on an H200 after a first fix: each spawned worker said why before it exited with 1.
#[test]
fn a_worker_that_exits_after_an_error_line_of_its_own_is_quoted() {
    let mut r = worker_exit_101(&[
        "error: data-loader worker 0: the dataset cache is on cuda:0, but CUDA is unusable in this worker: \
         libtorch_cuda.so and the NVIDIA driver are loaded, but CUDA sees no GPU",
        "error: data-loader worker 3: the dataset cache is on cuda:0, but CUDA is unusable in this worker: …",
        "error: DataLoader worker (pid 1590) exited unexpectedly with exit code 1. [data-loader worker 0 of rank 0, spawn]",
    ]);
    r.error = Some(
        "DataLoader worker (pid 1590) exited unexpectedly with exit code 1. [data-loader worker 0 of rank 0, spawn]"
            .into(),
    );
    let (_, _, v) = verdict(&[r]);
    assert_eq!(v.pattern.as_deref(), Some("worker-exited"));
    let cause = v.likely_cause.unwrap();
    assert!(cause.starts_with("The worker exited by itself with status 1"), "{cause}");
    assert!(
        cause.contains("Its last words: `error: data-loader worker 0: the dataset cache is on cuda:0"),
        "{cause}"
    );
}

/// Recorded from `tests/programs/patterns.py --case worker_exit` run bare (1 run in 6): a
/// DataLoader worker exited with status 3 and the main process, interrupted while printing its
/// traceback, lost stderr. Python's account of that failed write is not the rank's error.
#[test]
fn a_traceback_cut_off_by_lost_stderr_gives_no_key_line_and_says_so() {
    let r = program_rank(
        0,
        Exit::Code(1),
        2.0,
        "error: sample 5 is unreadable, giving up\nTraceback (most recent call last):\nobject address  : \
         0x7f663a9e60c0\nobject refcount : 2\nobject type     : 0x7f66f9850f20\nobject type name: \
         ConnectionResetError\nobject repr     : ConnectionResetError(104, 'Connection reset by peer')\nlost \
         sys.stderr",
    );
    let mut case = Case::new(vec![r]);
    case.scenario = external();
    case.scenario.launch.world_size = 1;
    let (outcome, _, v) = case.judge();
    assert_eq!(outcome, OutcomeKind::Exited);
    assert_eq!(v.headline, "Rank 0 exited with status 1", "{v:?}");
    assert!(v.key_line.is_none(), "{v:?}");
    assert!(v.likely_cause.is_none(), "{v:?}");
    assert!(v.evidence.iter().any(|l| l.contains("`lost sys.stderr`")), "{:?}", v.evidence);
    assert!(!format!("{v:?}").contains("object address"), "{v:?}");
}

/// PyTorch's two words for a worker gone: `(pid 12) exited unexpectedly with exit code 3.
/// Details are lost …` and `(pid(s) 12) exited unexpectedly`; both name the pid and what
/// happened, without PyTorch's advice.
#[test]
fn both_forms_of_a_vanished_worker_name_its_pid_and_what_happened() {
    for (error, what) in [
        (
            "RuntimeError: DataLoader worker (pid 14501) exited unexpectedly with exit code 3. Details are lost due \
             to multiprocessing. Rerunning with num_workers=0 may give better error trace.",
            "exited unexpectedly with exit code 3.",
        ),
        ("RuntimeError: DataLoader worker (pid(s) 14501) exited unexpectedly", "exited unexpectedly"),
    ] {
        let r =
            program_rank(0, Exit::Code(1), 2.0, &format!("Traceback (most recent call last):\n  x\n{error}"));
        let mut case = Case::new(vec![r]);
        case.scenario = external();
        case.scenario.launch.world_size = 1;
        let (_, _, v) = case.judge();
        assert!(
            v.headline
                .starts_with(&format!("A DataLoader worker (pid 14501) of rank 0 failed first ({what});")),
            "{}",
            v.headline
        );
    }
}

/// Recorded in a fresh-clone CI rehearsal (stop 40) from `patterns.py --case worker_exit`: a
/// worker printed its own error and called `sys.exit(3)` after it had put a batch on the queue;
/// the rank, taking that batch, asked the worker for its shared memory and got a reset
/// connection. PyTorch never said a worker died: the verdict says a worker was gone, and not how.
#[test]
fn a_batch_from_a_worker_gone_meanwhile_names_the_worker_gone_and_not_how() {
    let tail = "error: sample 5 is unreadable, giving up\nTraceback (most recent call last):\n  File \
                \"/w/patterns.py\", line 125, in <module>\n    for batch in loader:\n  File \
                \"/v/torch/utils/data/dataloader.py\", line 1310, in _try_get_data\n    data = \
                self._data_queue.get(timeout=timeout)\n  File \"/v/torch/multiprocessing/reductions.py\", line \
                540, in rebuild_storage_fd\n    fd = df.detach()\n  File \
                \"/p/multiprocessing/resource_sharer.py\", line 86, in get_connection\n  File \
                \"/p/multiprocessing/connection.py\", line 395, in _recv\n    chunk = read(handle, remaining)\n\
                ConnectionResetError: [Errno 104] Connection reset by peer";
    let mut r = program_rank(0, Exit::Code(1), 2.0, tail);
    r.workers = (0..2)
        .map(|id| WorkerInfo { id, pid: 29987 + id, start_method: "fork".into(), started_at_s: 1.3 })
        .collect();
    let mut case = Case::new(vec![r]);
    case.scenario = external();
    case.scenario.launch.world_size = 1;
    let (outcome, first, v) = case.judge();
    assert_eq!((outcome, first), (OutcomeKind::Exited, Some(0)));
    assert_eq!(v.pattern.as_deref(), Some("worker-killed-by-signal"), "{v:?}");
    assert!(
        v.headline.starts_with(
            "A DataLoader worker of rank 0 failed first (was gone before the rank could take the batch it had \
             sent: `ConnectionResetError: [Errno 104] Connection reset by peer` in PyTorch's `rebuild_storage_fd`"
        ),
        "{}",
        v.headline
    );
    let cause = v.likely_cause.unwrap();
    assert!(cause.contains("PyTorch's words do not say how"), "{cause}");
    assert!(!cause.contains("SIGKILL from outside") && !cause.contains("by itself"), "{cause}");

    // Python lost stderr while printing that traceback (seen by hand, 1 run in 14): the observer's
    // error marker names torch's frame, and the verdict is the same.
    let mut lost = program_rank(
        0,
        Exit::Code(1),
        2.0,
        "error: sample 5 is unreadable, giving up\nTraceback (most recent call last):\nobject type name: \
         ConnectionResetError\nlost sys.stderr",
    );
    lost.error = Some(
        "ConnectionResetError: [Errno 104] Connection reset by peer (patterns.py:125 in <module>; raised in \
         torch's `rebuild_storage_fd`)"
            .into(),
    );
    let mut case = Case::new(vec![lost]);
    case.scenario = external();
    case.scenario.launch.world_size = 1;
    let (_, _, v) = case.judge();
    assert_eq!(v.pattern.as_deref(), Some("worker-killed-by-signal"), "{v:?}");
    assert!(
        v.headline.contains(
            "(was gone before the rank could take the batch it had sent: `ConnectionResetError: \
             [Errno 104] Connection reset by peer` in PyTorch's"
        ),
        "{}",
        v.headline
    );

    // Seen by hand too (3 runs in 30): the connection ended with no reset, an `EOFError` with no
    // message.
    let mut eof = program_rank(0, Exit::Code(1), 2.0, "error: sample 5 is unreadable, giving up");
    eof.error = Some("EOFError (patterns.py:125 in <module>; raised in torch's `rebuild_storage_fd`)".into());
    let mut case = Case::new(vec![eof]);
    case.scenario = external();
    case.scenario.launch.world_size = 1;
    let (_, _, v) = case.judge();
    assert!(v.headline.contains("it had sent: `EOFError` in PyTorch's"), "{}", v.headline);

    // The same error anywhere else is the program's own, not a worker's.
    let own = program_rank(
        0,
        Exit::Code(1),
        2.0,
        "Traceback (most recent call last):\n  File \"/w/client.py\", line 3, in fetch\nConnectionResetError: \
         [Errno 104] Connection reset by peer",
    );
    let mut case = Case::new(vec![own]);
    case.scenario = external();
    case.scenario.launch.world_size = 1;
    let (_, _, v) = case.judge();
    assert_ne!(v.pattern.as_deref(), Some("worker-killed-by-signal"), "{v:?}");
}

/// `ledger` of `n` returned `all_reduce`s at slow.py:7, the last still running when `in_it`.
fn with_ledger(mut r: RankResult, n: u64, in_it: bool) -> RankResult {
    let ledger = (1..=n)
        .map(|seq| crate::schema::LedgerEntry {
            op: "all_reduce".into(),
            group: "default".into(),
            seq,
            shapes: "4".into(),
            dtype: "float32".into(),
            site: "slow.py:7".into(),
            ms: (seq < n || !in_it).then_some(1.0),
            at_s: None,
            pos: None,
            span: None,
        })
        .collect();
    r.observed = Some(crate::schema::ObservedProgram {
        group: Some(crate::schema::GroupFormed {
            backend: "gloo".into(),
            rank: r.rank,
            world_size: 2,
            store: String::new(),
        }),
        distributed: true,
        collectives: n,
        ledger,
        ..Default::default()
    });
    r
}

/// Recorded by hand under torchrun (slow.py, gloo timeout 8 s): rank 1 sleeps 30 s before its
/// 4th `all_reduce`; rank 0 times out in it and torchrun ends rank 1. Rank 1 never issued #4,
/// but it had not gone past it: without a stack, which of skip or late cannot be told, and the
/// verdict says so. With a stack outside any collective it is not called a mismatch at all; with
/// one inside another collective, it had gone on past it.
#[test]
fn a_rank_behind_in_the_ledger_is_not_said_to_have_gone_past_without_a_stack_showing_it() {
    let timeout = "Traceback (most recent call last):\n  File \"/tmp/u/slow.py\", line 7, in <module>\nRuntimeError: \
                   [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 8000ms for \
                   recv operation to complete";
    let rank0 = with_ledger(program_rank(0, Exit::Code(1), 9.0, timeout), 4, true);
    let mut rank1 = with_ledger(
        program_rank(1, Exit::Signal { signal: Signal::TERM.number(), core_dumped: false }, 9.05, ""),
        3,
        false,
    );
    rank1.torn_down_with = None;
    let mut case = Case::new(vec![rank0, rank1]);
    case.scenario = external();
    let (_, _, v) = case.judge();
    assert_eq!(v.pattern.as_deref(), Some("collective-mismatch"), "{v:?}");
    assert!(!v.headline.contains("gone on past"), "{}", v.headline);
    assert!(
        v.headline.contains(
            "rank 1 had not issued it: skipped it, or was still busy elsewhere; no stack of it was taken"
        ),
        "{}",
        v.headline
    );
    let cause = v.likely_cause.unwrap();
    assert!(cause.starts_with("Rank 1 had not issued the collective the others waited in"), "{cause}");

    // Caught as a hang, with stacks: rank 1 in `time.sleep` is outside any collective (not a
    // mismatch; the stacks judge), and rank 1 in DDP's all-reduce had gone past it.
    let in_all_reduce = "    futex_wait (libc.so.6)\n    all_reduce (torch/distributed/distributed_c10d.py:2900)\n    <module> (slow.py:7)\n";
    let sleeping = "    <module> (slow.py:6)\n";
    let backward = "    futex_wait (libc.so.6)\n    c10d::Reducer::finalize_backward (libtorch_cpu.so)\n    backward (torch/_tensor.py:630)\n    <module> (slow.py:9)\n";
    for (frames, past) in [(sleeping, None), (backward, Some(true))] {
        let mut case = Case::new(vec![
            with_ledger(hung_with_stack(0, in_all_reduce), 4, true),
            with_ledger(hung_with_stack(1, frames), 3, false),
        ]);
        case.scenario = external();
        let (_, first, v) = case.judge();
        match past {
            None => {
                assert_eq!(v.pattern.as_deref(), Some("ranks-out-of-step"), "{v:?}");
                assert_eq!(first, Some(1), "{v:?}");
                let cause = v.likely_cause.unwrap();
                assert!(
                    cause.contains(
                        "Rank 1 is behind, in its own work outside any collective, at `<module> (slow.py:6)`"
                    ),
                    "{cause}"
                );
                assert!(!cause.contains("will never join"), "{cause}");
            }
            Some(_) => assert!(
                v.headline.contains("rank 1 had gone on past it into another collective"),
                "{}",
                v.headline
            ),
        }
    }
}

/// Recorded by hand (a Lightning program under torchrun, 2 ranks): rank 0 raised at step 3 and
/// left; torchrun stopped rank 1, whose SIGTERM handler (Lightning's) broadcast to rank 0, which
/// was gone. That broadcast is rank 1's reaction to rank 0's end, not a collective rank 0
/// skipped: rank 0's own error is the verdict. Issued while rank 0 still ran, it is still no
/// skip of rank 0's (issue 56's accuracy matrix, TRL's SFT script: the rank that raised never got
/// there because it raised); the same ledgers where rank 0 ended without an exception of its own
/// are a mismatch.
#[test]
fn a_collective_issued_after_the_lacking_rank_had_failed_is_not_a_mismatch() {
    let raised = "Traceback (most recent call last):\nValueError: bad shard on rank 0";
    let judged = |issued_at: f64, said: &str| {
        let mut rank0 = with_ledger(program_rank(0, Exit::Code(1), 6.51, said), 9, false);
        rank0.observed.as_mut().unwrap().exiting_at_s = Some(5.52);
        let mut rank1 = with_ledger(
            program_rank(
                1,
                Exit::Code(1),
                7.43,
                "RuntimeError: [gloo/transport/tcp/pair.cc:547] Connection closed by peer",
            ),
            10,
            true,
        );
        rank1.observed.as_mut().unwrap().ledger.last_mut().unwrap().at_s = Some(issued_at);
        let mut case = Case::new(vec![rank0, rank1]);
        case.scenario = external();
        case.judge().2
    };
    for issued_at in [6.52, 5.0] {
        let v = judged(issued_at, raised);
        assert_ne!(v.pattern.as_deref(), Some("collective-mismatch"), "{v:?}");
        assert!(
            v.headline.starts_with("Rank 0 exited with status 1:")
                && v.headline.contains("ValueError: bad shard on rank 0"),
            "{}",
            v.headline
        );
    }
    // Issued before rank 0 began to leave (5.52 s), and rank 0 ended without an exception of its
    // own: rank 0 never issued what rank 1 waits in.
    let v = judged(5.0, "training step 3");
    assert_eq!(v.pattern.as_deref(), Some("collective-mismatch"), "{v:?}");
    assert!(v.headline.contains("rank 0 never issued `all_reduce` #10"), "{}", v.headline);
}

/// A rank that aborted after its program had returned (what PyTorch 2.11 printed when a thread
/// was still in C++ as Python shut down): the observer's summary at exit dates the end of the
/// program's own code, so the verdict says the crash came at exit, not in training; without that
/// summary the rank's own fault-handler dump can (no thread with a Python frame left), and
/// otherwise it says only what it saw.
#[test]
fn a_crash_after_the_programs_exit_handlers_ran_is_called_a_crash_at_exit() {
    let aborted = |exiting: Option<f64>, stderr: &str| {
        let mut r =
            program_rank(0, Exit::Signal { signal: Signal::ABRT.number(), core_dumped: false }, 5.3, stderr);
        r.observed =
            Some(crate::schema::ObservedProgram { steps: 200, exiting_at_s: exiting, ..Default::default() });
        r
    };
    let printed = "training finished\nterminate called without an active exception\nFatal Python error: Aborted\n\n\
                   Current thread 0x00007fe6cda126c0 (most recent call first):\n  <no Python frame>\n";
    let mut case = Case::new(vec![aborted(Some(5.12), printed)]);
    case.scenario = external();
    let (outcome, first, v) = case.judge();
    assert_eq!((outcome, first), (OutcomeKind::Signaled, Some(0)));
    assert_eq!(v.pattern.as_deref(), Some("native-crash"));
    assert_eq!(
        v.headline,
        "Rank 0 was killed by SIGABRT after its program had finished, as Python shut down (200 optimizer steps done)."
    );
    assert!(
        v.evidence.iter().any(|e| e
            == "rank 0's program had finished its own code: its exit handlers ran at 5.12 s (the observer's summary \
                at exit), and it was killed by SIGABRT by 5.30 s"),
        "{:#?}",
        v.evidence
    );
    assert!(
        v.evidence.iter().any(|e| e.contains("C++ printed `terminate called without an active exception`"))
    );
    let cause = v.likely_cause.unwrap();
    assert!(
        cause.starts_with("A crash at exit, not in training: a thread was still running native code"),
        "{cause}"
    );
    assert!(
        v.next_step.unwrap().starts_with("The program's own work ran to its end (200 optimizer steps done)")
    );

    // Under torchrun, which then ends the other rank with SIGTERM as it too shuts down: that one
    // lost nothing, and the evidence says so.
    let mut ended =
        program_rank(1, Exit::Signal { signal: Signal::TERM.number(), core_dumped: false }, 5.4, "");
    ended.observed =
        Some(crate::schema::ObservedProgram { steps: 200, exiting_at_s: Some(5.11), ..Default::default() });
    let mut case = Case::new(vec![aborted(Some(5.12), printed), ended]);
    case.scenario = external();
    let (_, first, v) = case.judge();
    assert_eq!(first, Some(0));
    assert!(
        v.evidence.iter().any(|e| e
            == "collateral: rank 1 was killed by SIGTERM 0.10 s later (its program had finished too: its exit \
                handlers ran at 5.11 s)"),
        "{:#?}",
        v.evidence
    );

    // Another crash at exit, without C++'s line: the shutdown is named, no thread is.
    let mut case = Case::new(vec![aborted(Some(5.12), "Fatal Python error: Aborted\n")]);
    case.scenario = external();
    let v = case.judge().2;
    assert!(v.headline.contains("after its program had finished"), "{}", v.headline);
    assert!(
        v.likely_cause
            .unwrap()
            .starts_with("A crash at exit, not in training: it came during Python's shutdown")
    );
    assert!(!v.evidence.iter().any(|e| e.contains("terminate called")), "{:#?}", v.evidence);

    // No summary at exit (the observer off): the rank's own fault-handler dump, where no thread
    // has a Python frame left (the main thread's `<module>` frame is gone once the program's code
    // has returned), dates the crash at exit. What a bare torchrun rank printed here
    // (PyTorch 2.11, gloo, two runs at once on 2 cores; gdb put the abort in `pt_gloo_runloop`).
    let bare = "training finished\nterminate called without an active exception\nFatal Python error: Aborted\n\n\
                Thread 0x00007fcef59cbb80 (most recent call first):\n  <no Python frame>\n\n\
                Extension modules: numpy._core._multiarray_umath, torch._C (total: 2)\n";
    let mut unobserved = aborted(None, bare);
    unobserved.observed = None;
    let mut case = Case::new(vec![unobserved]);
    case.scenario = external();
    let v = case.judge().2;
    assert_eq!(v.pattern.as_deref(), Some("native-crash"));
    assert_eq!(
        v.headline,
        "Rank 0 was killed by SIGABRT after its program had finished, as Python shut down."
    );
    assert!(
        v.evidence.iter().any(|e| e
            == "rank 0's program had finished its own code: Python's fault handler shows no thread running \
                Python code (`<no Python frame>` for every thread it lists; the main thread holds the program's \
                frames while its code runs), and it was killed by SIGABRT by 5.30 s"),
        "{:#?}",
        v.evidence
    );
    assert!(
        v.likely_cause.unwrap().starts_with("A crash at exit, not in training: a thread was still running")
    );

    // A crash in training: the main thread is in the program's code. Nothing about an exit,
    // whichever thread faulted; nor where the dump's end is not seen (cut by another line).
    let in_training = "terminate called without an active exception\nFatal Python error: Aborted\n\n\
                       Thread 0x00007fe6cda126c0 (most recent call first):\n  <no Python frame>\n\n\
                       Thread 0x00007fcef59cbb80 (most recent call first):\n  \
                       File \"/w/train.py\", line 40 in main\n  File \"/w/train.py\", line 52 in <module>\n";
    let cut = "Fatal Python error: Aborted\n\nThread 0x00007fe6cda126c0 (most recent call first):\n  \
               <no Python frame>\nstep 41 loss 0.2\n";
    for stderr in [in_training, cut, "Fatal Python error: Aborted\n"] {
        let mut case = Case::new(vec![aborted(None, stderr)]);
        case.scenario = external();
        let v = case.judge().2;
        assert_eq!(v.pattern.as_deref(), Some("native-crash"));
        assert!(v.headline.starts_with("Rank 0 was killed by SIGABRT"), "{}", v.headline);
        let said = format!("{} {:?} {:?} {:?}", v.headline, v.evidence, v.likely_cause, v.next_step);
        assert!(!said.contains("finished") && !said.contains("at exit"), "{said}");
    }
}

/// Both ranks of a torchrun run aborted as they shut down, without the observer (seen here in a
/// benchmark: PyTorch 2.11, gloo, `--no-observe`): the launcher's output holds a dump for each,
/// neither with a Python frame. Each crashed at exit on its own; neither is the other's
/// collateral. Where one dump shows a frame, nothing is said of an exit and the later rank is
/// collateral, as before.
#[test]
fn two_ranks_whose_dumps_show_no_python_frame_each_crashed_at_exit_on_its_own() {
    let abort = Exit::Signal { signal: Signal::ABRT.number(), core_dumped: false };
    let dump = |thread: &str, frame: &str| {
        vec![
            "terminate called without an active exception".to_string(),
            "Fatal Python error: Aborted".to_string(),
            String::new(),
            format!("Thread 0x{thread} (most recent call first):"),
            format!("  {frame}"),
            String::new(),
        ]
    };
    let judged = |first_frame: &str| {
        let mut launcher =
            torchrun_end(1, &["torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"]);
        launcher.quotes = vec![crate::schema::Quote {
            title: QuoteKind::FaultHandler,
            lines: [dump("00007fcef59cbb80", first_frame), dump("00007f77aedc9b80", "<no Python frame>")]
                .concat(),
        }];
        let ranks = [program_rank(0, abort, 14.01, ""), program_rank(1, abort, 14.0, "")];
        judge_under(&external(), &ranks, &launcher)
    };
    let j = judged("<no Python frame>");
    assert_eq!(j.verdict.pattern.as_deref(), Some("native-crash"));
    assert_eq!(
        j.verdict.headline,
        "Rank 1 was killed by SIGABRT after its program had finished, as Python shut down. Rank 0 failed the \
         same way on its own (not collateral)."
    );
    assert!(
        j.verdict.evidence.iter().any(|e| e.starts_with(
            "rank 1's program had finished its own code: each of the 2 dumps of Python's fault handler in the \
             launcher's output, one for every rank a fatal signal ended, shows no thread running Python code"
        )),
        "{:#?}",
        j.verdict.evidence
    );
    assert!(
        j.verdict.evidence.iter().any(|e| e
            == "rank 0 ended by itself with the same error: killed by SIGABRT as it shut down (its dump shows no \
                Python frame)"),
        "{:#?}",
        j.verdict.evidence
    );

    let j = judged("File \"/w/train.py\", line 40 in main");
    assert!(j.verdict.headline.starts_with("Rank 1 was killed by SIGABRT."), "{}", j.verdict.headline);
    assert!(j.verdict.headline.ends_with("Rank 0 failed after it (collateral)."), "{}", j.verdict.headline);
    let said = format!("{} {:?}", j.verdict.headline, j.verdict.evidence);
    assert!(!said.contains("shut down") && !said.contains("on its own"), "{said}");
}

/// `r` with an observer that saw a gloo group of `world` form and read its count of collectives
/// at `issued` (`None`: never read), with an empty ledger: DDP issues its reductions from C++.
fn with_count(mut r: RankResult, world: u32, issued: Option<u64>) -> RankResult {
    r.observed = Some(crate::schema::ObservedProgram {
        group: Some(crate::schema::GroupFormed {
            backend: "gloo".into(),
            rank: r.rank,
            world_size: world,
            store: String::new(),
        }),
        distributed: true,
        steps: 10,
        issued,
        unseen: issued,
        ..Default::default()
    });
    r
}

const GLOO_TIMEOUT: &str = "Traceback (most recent call last):\n  File \"/tmp/s49/gloo_timeout.py\", line 14, in \
                            <module>\n    opt.zero_grad(); loss.backward(); opt.step()\nRuntimeError: \
                            [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting \
                            8000ms for recv operation to complete";

/// Recorded by hand under torchrun (a DDP program, gloo timeout 8 s): rank 1 computes 25 s on its
/// own at step 10; rank 0 waits in DDP's gradient all-reduce, gives up after 8 s, and torchrun
/// stops rank 1. Rank 0 failed first, because it waited: it is not the cause, and rank 1 is not
/// its collateral. The group's count (16 against 15) names rank 1.
#[test]
fn a_collective_that_timed_out_names_the_rank_it_waited_for_not_the_first_to_fail() {
    let sigterm = Exit::Signal { signal: Signal::TERM.number(), core_dumped: false };
    let mut rank1 = with_count(program_rank(1, sigterm, 17.2, ""), 2, Some(15));
    rank1.last_marker_at_s = Some(9.2);
    rank1.steps_done = 10;
    let mut case =
        Case::new(vec![with_count(program_rank(0, Exit::Code(1), 17.1, GLOO_TIMEOUT), 2, Some(16)), rank1]);
    case.scenario = external();
    let j = case.judgement();
    let v = &j.verdict;
    assert_eq!(v.pattern.as_deref(), Some("collective-timeout"), "{v:?}");
    assert_eq!(
        v.headline,
        "Rank 0 gave up after 8 s waiting in a collective, which rank 1 had not reached (gloo: `Timed out waiting \
         8000ms for recv operation to complete`): it was waiting for rank 1."
    );
    assert_eq!((j.outcome, j.first_failure), (OutcomeKind::Exited, Some(0)));
    assert_eq!(j.same_failure, [1], "rank 1 is not collateral");
    assert!(!v.evidence.iter().any(|e| e.starts_with("collateral")), "{:?}", v.evidence);
    assert!(
        v.evidence.contains(
            &"rank 1 had issued 15: it had not reached #16; the last it reported (10 steps) came at 9.20 s, 7.9 s \
              before rank 0 gave up"
                .to_string()
        ),
        "{:?}",
        v.evidence
    );
    assert!(v.key_line.as_deref().is_some_and(|k| k.contains("Timed out waiting 8000ms")), "{v:?}");

    // Four ranks, as recorded by hand (rank 2 computing alone): ranks 1 and 3 time out too, rank 3
    // in a send and stopped by torchrun as its exit handlers ran; rank 2 is behind. None of them
    // is collateral, and ranks 1 and 3 are named as having given up too, not "the same way".
    let send = GLOO_TIMEOUT.replace("recv operation", "send operation");
    let ranks = vec![
        with_count(program_rank(0, Exit::Code(1), 17.10, GLOO_TIMEOUT), 4, Some(11)),
        with_count(program_rank(1, Exit::Code(1), 17.12, GLOO_TIMEOUT), 4, Some(11)),
        with_count(program_rank(2, sigterm, 17.20, ""), 4, Some(10)),
        with_count(program_rank(3, sigterm, 17.17, &send), 4, Some(11)),
    ];
    let mut case = Case::new(ranks);
    case.scenario = external();
    case.scenario.launch.world_size = 4;
    let j = case.judgement();
    assert_eq!(j.first_failure, Some(0));
    assert_eq!(
        j.verdict.headline,
        "Rank 0 gave up after 8 s waiting in a collective, which rank 2 had not reached (gloo: `Timed out waiting \
         8000ms for recv operation to complete`): it was waiting for rank 2. Ranks 1, 3 gave up waiting too."
    );
    let mut not_collateral = j.same_failure.clone();
    not_collateral.sort_unstable();
    assert_eq!(not_collateral, [1, 2, 3]);
    assert!(
        j.verdict.evidence.contains(
            &"rank 3 gave up waiting too: `Timed out waiting 8000ms for send operation to complete`"
                .to_string()
        ),
        "{:?}",
        j.verdict.evidence
    );
}

/// Where the counts cannot name the rank waited for, the verdict says so and calls no rank
/// collateral: not where every rank had reached the same count, and not without the observer.
#[test]
fn a_timed_out_collective_without_a_rank_behind_in_the_count_names_no_culprit_and_no_collateral() {
    let sigterm = Exit::Signal { signal: Signal::TERM.number(), core_dumped: false };
    for (counts, why) in [
        ([Some(16), Some(16)], "every rank had issued at least as many collectives (16) as rank 0"),
        ([None, None], "the observer did not read every rank's count of collectives"),
    ] {
        let mut rank1 = with_count(program_rank(1, sigterm, 17.2, ""), 2, counts[1]);
        rank1.torn_down_with = Some(Signal::TERM);
        let mut case = Case::new(vec![
            with_count(program_rank(0, Exit::Code(1), 17.1, GLOO_TIMEOUT), 2, counts[0]),
            rank1,
        ]);
        case.scenario = external();
        let (_, first, v) = case.judge();
        assert_eq!(v.pattern.as_deref(), Some("collective-timeout"), "{v:?}");
        assert_eq!(first, Some(0));
        assert!(
            v.headline.starts_with(
                "Rank 0 gave up after 8 s waiting in a collective that another rank did not join (gloo: `Timed out \
                 waiting 8000ms for recv operation to complete`); which rank it waited for cannot be told: "
            ),
            "{}",
            v.headline
        );
        assert!(v.headline.contains(why), "{}", v.headline);
        assert!(!v.headline.contains("collateral"), "{}", v.headline);
    }
}

/// NCCL's watchdog names the collective's SeqNum: a rank whose group count is below it never
/// joined it.
#[test]
fn an_nccl_watchdog_timeout_names_the_rank_whose_count_is_below_its_seqnum() {
    let watchdog = "[rank0]:[E1124 05:00:00.000000 1 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog caught collective \
                    operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, \
                    Timeout(ms)=600000) ran for 600100 milliseconds before timing out.";
    let abort = Exit::Signal { signal: Signal::ABRT.number(), core_dumped: false };
    let sigterm = Exit::Signal { signal: Signal::TERM.number(), core_dumped: false };
    let mut case = Case::new(vec![
        with_count(program_rank(0, abort, 610.0, watchdog), 2, Some(13)),
        with_count(program_rank(1, sigterm, 610.2, ""), 2, Some(11)),
    ]);
    case.scenario = external();
    let (_, first, v) = case.judge();
    assert_eq!(v.pattern.as_deref(), Some("nccl-watchdog-timeout"), "{v:?}");
    assert_eq!(first, Some(0));
    assert_eq!(
        v.headline,
        "Rank 0's NCCL watchdog timed out in ALLREDUCE (SeqNum=12) after 600000 ms: rank 1 never joined that \
         collective (it had not reached it in the group's count)."
    );
}

/// torchrun with `--max-restarts 1`: rank 1's first process failed (recorded: a module missing on
/// the first attempt only), torchrun started both ranks again, and the job's end is torchrun's.
/// What ups-doctor watched is said as the first attempt, not as the job's outcome.
#[test]
fn a_launchers_restart_makes_the_first_attempts_failure_an_attempt_not_the_jobs_outcome() {
    let missing = "Traceback (most recent call last):\n  File \"/t/observed_ddp.py\", line 16, in <module>\n\
                   ModuleNotFoundError: No module named 'torch.utils.data.distributed'";
    let sigterm = Exit::Signal { signal: Signal::TERM.number(), core_dumped: false };
    let mut scenario: Scenario = serde_json::from_value(serde_json::json!({
        "command": ["torchrun", "--nproc_per_node", "2", "--max-restarts", "1", "observed_ddp.py"],
        "launch": {"world_size": 2}
    }))
    .unwrap();
    scenario.name = "restart".into();
    let ranks = vec![program_rank(0, sigterm, 4.5, ""), program_rank(1, Exit::Code(1), 4.4, missing)];
    for (code, passed) in [(0, true), (1, false)] {
        let mut launcher = torchrun_end(code, &[]);
        launcher.restarted = vec![
            crate::schema::RestartedRank { rank: 0, pid: 25834 },
            crate::schema::RestartedRank { rank: 1, pid: 25835 },
        ];
        let j = judge_under(&scenario, &ranks, &launcher);
        let first = "Rank 1 exited with status 1: ModuleNotFoundError: No module named 'torch.utils.data.distributed' \
                     (observed_ddp.py:16 in <module>)";
        assert!(
            j.verdict.evidence[0].starts_with(
                "`torchrun … observed_ddp.py` started ranks 0, 1 again after the processes watched for them ended \
                 (an elastic restart; rank 0 pid 25834, rank 1 pid 25835)"
            ),
            "{:?}",
            j.verdict.evidence
        );
        if passed {
            assert_eq!((j.outcome, j.first_failure), (OutcomeKind::Passed, None));
            assert!(
                j.verdict.headline.starts_with(&format!(
                    "Passed after a restart: `torchrun … observed_ddp.py` exited with status 0 once it had started \
                     ranks 0, 1 again. The attempt ups-doctor watched failed: {first}"
                )),
                "{}",
                j.verdict.headline
            );
            assert_eq!((j.verdict.pattern, j.verdict.key_line), (None, None));
        } else {
            assert_eq!((j.outcome, j.first_failure), (OutcomeKind::Exited, Some(1)));
            assert!(
                j.verdict.headline.starts_with(&format!(
                    "`torchrun … observed_ddp.py` exited with status 1 after it had started ranks 0, 1 again; the \
                     later attempt's end is in its own output (not watched). The attempt ups-doctor watched: {first}"
                )),
                "{}",
                j.verdict.headline
            );
        }
    }
}

/// A program's rank that hung (no phases, no stacks), with the Flight Recorder's all-reduces up to
/// `last` in the default group (as Ray Train's DDP workers left them: each step's gradient
/// all-reduce from C++).
fn hung_program_rank(rank: u32, last_marker_at_s: f64, last: u64) -> RankResult {
    let mut e = end(Some(Exit::Signal { signal: Signal::KILL.number(), core_dumped: false }));
    e.rank = rank;
    e.pid = Some(1000 + rank);
    e.intervention = Some(Intervention::Hung { silence_s: 20.0, at_s: 70.0 });
    e.state.last_marker_at = Some(last_marker_at_s);
    e.state.markers = 10;
    let mut r = classify_rank(&e);
    let entries = (1..=last)
        .map(|seq| crate::schema::FlightEntry {
            group: "default_pg".into(),
            seq,
            p2p: false,
            op: "gloo:all_reduce".into(),
            sizes: vec![vec![2]],
            dtypes: vec!["Float".into()],
            state: if seq == last { "started" } else { "completed" }.into(),
            created_ns: None,
            ms: None,
            at_s: None,
        })
        .collect();
    r.observed = Some(crate::schema::ObservedProgram {
        distributed: true,
        flight: Some(crate::schema::FlightRecord { entries, error: None }),
        ..Default::default()
    });
    r
}

/// Seen with Ray Train (no py-spy in the cluster's venv): rank 0 slept before its step's
/// optimizer step, rank 1 went on into the next step's gradient all-reduce. Which of the two went
/// silent first is scheduling (rank 1's last marker came 0.1 s before rank 0's); the recorders
/// say rank 0 never issued the all-reduce rank 1 waits in, and both orders name rank 0. Where the
/// ranks issued different things there, the recorder names nobody behind.
#[test]
fn the_rank_the_flight_recorder_shows_behind_is_named_whoever_went_silent_first() {
    for (r0, r1) in [(50.6, 50.5), (50.5, 50.6)] {
        let mut case = Case::new(vec![hung_program_rank(0, r0, 55), hung_program_rank(1, r1, 56)]);
        case.scenario = external();
        let (outcome, first, v) = case.judge();
        assert_eq!((outcome, first), (OutcomeKind::Hung, Some(0)), "{r0} vs {r1}: {}", v.headline);
        assert_eq!(v.pattern.as_deref(), Some("ranks-out-of-step"));
        assert!(v.headline.contains("rank 0 never issued collective #56"), "{}", v.headline);
        assert!(v.headline.contains("rank 1 issued and waits in"), "{}", v.headline);
    }
    let mut other = hung_program_rank(1, 50.5, 56);
    if let Some(f) = other.observed.as_mut().and_then(|o| o.flight.as_mut()) {
        f.entries[54].sizes = vec![vec![3]];
    }
    let mut case = Case::new(vec![hung_program_rank(0, 50.6, 55), other]);
    case.scenario = external();
    let (_, _, v) = case.judge();
    assert!(!v.headline.contains("never issued"), "{}", v.headline);
}

/// Ray Train across two hosts, rank 1's training function raised at step 50 (a fresh-clone test
/// run under load, 2026-12-07): Ray relayed its error, then ended its worker group with SIGKILL
/// before rank 1's worker had exited by itself. The verdict is the error, not "killed by SIGKILL
/// by something other than ups-doctor".
#[test]
fn a_cluster_worker_that_failed_and_was_then_ended_by_its_cluster_is_named_by_its_error() {
    let error = "RuntimeError: accuracy-bench injected fault on rank 1 at step 50";
    let mut killed = program_rank(
        1,
        Exit::Signal { signal: Signal::KILL.number(), core_dumped: false },
        34.9,
        &format!("Traceback (most recent call last):\n  File \"train.py\", line 41, in train_epoch\n{error}"),
    );
    killed.exit_source = Some(ExitSource::ClusterAfterError);
    let mut other = program_rank(0, Exit::Code(1), 34.8, "");
    other.exit_source = Some(ExitSource::Cluster);
    let mut launcher =
        torchrun_end(1, &["ray.train.WorkerGroupError: Training failed due to worker errors:"]);
    launcher.kind = Some("Ray Train".into());
    let j = judge_under(&external(), &[other, killed], &launcher);
    assert_eq!(j.first_failure, Some(1), "{:#?}", j.verdict);
    assert!(
        j.verdict
            .headline
            .starts_with(&format!("Rank 1 failed: {error}; its cluster then ended its worker with SIGKILL.")),
        "{}",
        j.verdict.headline
    );
    assert!(
        !j.verdict.likely_cause.as_deref().unwrap_or_default().contains("something other than"),
        "{:#?}",
        j.verdict
    );
    assert_eq!(j.outcome, OutcomeKind::Exited);
    // Its evidence says the cluster named it, not the opposite.
    assert!(
        !j.verdict.evidence.iter().any(|e| e.contains("did not name rank 1")),
        "{:#?}",
        j.verdict.evidence
    );
    assert!(j.verdict.evidence.iter().any(|e| e.contains("relayed its error")), "{:#?}", j.verdict.evidence);
}
