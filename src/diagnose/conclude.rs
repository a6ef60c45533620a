//! The one entrance to the judge, for every caller alike — a run on one node, the merge of
//! several nodes, a job read from outside (`attach`), a bisect probe, a sweep point: [`conclude`]
//! reads a [`ScenarioResult`] (what `result.json` keeps: every rank's end, the run's memory,
//! leftovers, OOM kills, GPU, its nodes) and writes into it the outcome, the first failure and its
//! collateral, the verdict (the GPU's notes, lost nodes and an interrupt's wording included) and
//! how it compares with the scenario's `expect`. What the judge reads is what the result keeps,
//! so a result judged again is judged the same.

use crate::scenario::{CacheDevice, Expect, OutcomeKind, Scenario, human_bytes};
use crate::schema::{
    GpuProcessPeak, GpuReport, ProcessRole, RankResult, ScenarioResult, Signal, StartedProcesses, Verdict,
};

use super::attached::{self, Window};
use super::evidence::Observed;
use super::nodes::{Clocks, Unobserved};
use super::verdict::{Judgement, judge};

/// How what the judge reads was seen.
#[derive(Debug, Clone, Copy)]
pub enum Seen<'a> {
    /// ups-doctor started the ranks (on one node, or merged from several) and saw each one end
    /// or tore it down: the result holds every rank's end.
    Ran,
    /// A job read from outside over a window (`attach`): nothing was signalled, the job may
    /// still be running; what each rank did in the window is the evidence, and the judge
    /// decides each rank's outcome from it (the result's `ranks` are written by the judge).
    Attached(&'a Window<'a>),
}

/// Judges `result` and writes the conclusion into it: `outcome`, `first_failure`, each rank's
/// `collateral`, `verdict`, `expectation_mismatches`, `met_expectation`, and for a merged run
/// its nodes' first failure and order note. The one place a verdict comes from.
pub fn conclude(result: &mut ScenarioResult, seen: Seen) {
    if let Seen::Attached(window) = seen {
        let judged = attached::conclude(&result.scenario, window, result.wall_s);
        result.outcome = judged.outcome;
        result.first_failure = judged.culprit;
        result.met_expectation = judged.state == attached::State::Running;
        result.expectation_mismatches = Vec::new();
        result.verdict = judged.verdict;
        result.ranks = judged.ranks;
        return;
    }
    let clocks = Clocks::of(result.nodes.as_ref());
    let (conclusion, first_across, order_note) = {
        let observed = Observed::of(result);
        let unobserved = clocks.as_ref().map(Clocks::unobserved).unwrap_or_default();
        let circumstances =
            Circumstances { interrupted: result.interrupted, gpu: gpu_of(result), unobserved: &unobserved };
        let judged = judge(&observed);
        let (judged, order_note) = match &clocks {
            Some(c) => c.order(&observed, judged),
            None => (judged, None),
        };
        let mut conclusion = settle(judged, &observed, &circumstances);
        let failed = conclusion.first_failure.and_then(|f| result.ranks.iter().find(|r| r.rank == f));
        let first_across = clocks.as_ref().zip(failed).map(|(c, f)| c.first_failure(f));
        if let Some(f) = &first_across {
            conclusion.verdict.evidence.insert(
                0,
                format!("First failure across nodes: node {}, rank {} (host {})", f.node, f.rank, f.host),
            );
        }
        if let Some(line) = clocks.as_ref().and_then(Clocks::placement_note) {
            conclusion.verdict.evidence.push(line);
        }
        (conclusion, first_across, order_note)
    };
    conclusion.mark(&mut result.ranks);
    let Conclusion { outcome, first_failure, verdict, mismatches, met, .. } = conclusion;
    result.outcome = outcome;
    result.first_failure = first_failure;
    result.verdict = verdict;
    result.expectation_mismatches = mismatches;
    result.met_expectation = met;
    if let Some(nodes) = result.nodes.as_mut().filter(|n| !n.attached) {
        nodes.first_failure = first_across;
        nodes.order_note = order_note;
    }
}

/// The GPU report whose notes the verdict carries: the run's own, or for a run merged from
/// several nodes (which has none of its own) the coordinator's node's.
fn gpu_of(result: &ScenarioResult) -> Option<&GpuReport> {
    result.gpu.as_ref().or_else(|| {
        let nodes = result.nodes.as_ref().filter(|n| !n.attached)?;
        nodes.per_node.iter().find(|s| s.node == 0)?.gpu.as_ref()
    })
}

/// What surrounds the observation: how the run ended and what the judge did not see itself.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Circumstances<'a> {
    /// The user interrupted the run: neither a pass nor a failure of `expect`.
    pub interrupted: bool,
    /// The run's GPU activity (NVML), when it was sampled.
    pub gpu: Option<&'a GpuReport>,
    /// Parts of the run that were not observed to their end (a lost node), each with the line
    /// that says so.
    pub unobserved: &'a [Unobserved],
}

/// The conclusion of a scenario, before it is written into its result.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Conclusion {
    pub outcome: OutcomeKind,
    pub first_failure: Option<u32>,
    /// Ranks that failed after the first failure, because of it.
    pub collateral: Vec<u32>,
    pub verdict: Verdict,
    /// How the outcome differs from `expect` (empty: met, unless interrupted).
    pub mismatches: Vec<String>,
    /// Whether the scenario met its `expect`.
    pub met: bool,
}

impl Conclusion {
    /// Marks each rank's `collateral` as concluded.
    fn mark(&self, ranks: &mut [RankResult]) {
        // A set: thousands of collateral ranks looked up for each of thousands of ranks is
        // quadratic.
        let collateral: std::collections::HashSet<u32> = self.collateral.iter().copied().collect();
        for r in ranks {
            r.collateral = collateral.contains(&r.rank);
        }
    }
}

/// The conclusion from a judgement: unobserved parts said first, the GPU's notes, collateral,
/// the expectation check, and an interrupt's wording.
pub(super) fn settle(j: Judgement, observed: &Observed, c: &Circumstances) -> Conclusion {
    let Judgement { outcome, mut first_failure, mut verdict, same_failure } = j;
    let ranks = observed.ranks;
    // Interrupted while its ranks were running: every end ups-doctor's own teardown signals made
    // is no failure, and naming one "first" would name whichever the signals reached first.
    let stopped = c.interrupted.then(|| stopped_at_interrupt(ranks)).flatten();
    if let Some(lines) = &stopped {
        first_failure = None;
        verdict = Verdict { evidence: lines.clone(), ..Verdict::default() };
    }
    let failed = first_failure.and_then(|f| ranks.iter().find(|r| r.rank == f));
    for part in c.unobserved {
        verdict.evidence.insert(0, part.line.clone());
        // Nothing failed of its own accord before it: the lost part is the headline.
        if failed.is_none_or(|r| r.torn_down_with.is_some()) {
            verdict.headline = format!("{}; the other nodes' ranks were torn down after it", part.line);
        }
    }
    annotate_gpu(&mut verdict, observed.scenario, c.gpu);
    let unwatched = unwatched_ranks(observed);
    if let Some((told, formed)) = unwatched {
        let missed = if formed - told == 1 {
            format!("rank {told} was")
        } else {
            format!("ranks {told}–{} were", formed - 1)
        };
        let line = format!(
            "The program formed a process group of {formed} ranks, but this run watched {told} (the \
             command line has no rank count ups-doctor reads): {missed} not watched, and what failed \
             first may be among them. Run again with `--set launch.world_size={formed}`"
        );
        verdict.evidence.insert(0, line);
        if outcome != OutcomeKind::Passed {
            verdict.headline = format!(
                "{} But only {told} of the {formed} ranks the program started {} watched: what failed \
                 first may be a rank that was not (run again with `--set launch.world_size={formed}`)",
                verdict.headline.trim_end_matches('.').to_string() + ".",
                if told == 1 { "was" } else { "were" }
            );
        }
    }
    if let Some((rank, started)) = launcher_rank(ranks) {
        own_ranks_unwatched(&mut verdict, outcome, rank, started);
        first_failure = None;
    }
    let collateral = ranks
        .iter()
        .filter(|r| first_failure.is_some_and(|f| f != r.rank) && r.outcome != OutcomeKind::Passed)
        .filter(|r| !same_failure.contains(&r.rank))
        .map(|r| r.rank)
        .collect();
    let mut mismatches = check_expectation(&observed.scenario.expect, outcome, failed);
    // A launcher's ranks share its output, and a rank's own error line may be empty while the
    // verdict's key line (or another rank's, or the launcher's) holds the text: `message` is met
    // by any of them.
    if let Some(want) = &observed.scenario.expect.message {
        let said = |l: &String| l.contains(want.as_str());
        let anywhere = verdict.key_line.iter().any(said)
            || ranks.iter().any(|r| r.error.iter().any(said) || r.log_tail.iter().any(said))
            || observed.launcher.is_some_and(|l| l.log_tail.iter().any(said));
        if anywhere {
            mismatches.retain(|m| !m.starts_with("expected the error to contain"));
        }
    }
    if let Some((told, formed)) = unwatched {
        mismatches.push(format!("only {told} of the program's {formed} ranks watched"));
    }
    if !c.unobserved.is_empty() {
        let parts: Vec<&str> = c.unobserved.iter().map(|u| u.part.as_str()).collect();
        mismatches.push(format!("{} lost: its ranks were not observed", parts.join(", ")));
    }
    if c.interrupted {
        // Cut short: neither a pass nor a failure of `expect`; what was seen stays as evidence.
        mismatches.clear();
        if stopped.is_none() {
            verdict.evidence.insert(0, format!("Before the interrupt: {}", verdict.headline));
        }
        verdict.headline = format!(
            "Interrupted by the user after {:.1} s, before the scenario ended on its own",
            observed.wall_s
        );
        if stopped.is_some() {
            verdict
                .headline
                .push_str(": nothing had failed; ups-doctor stopped the ranks that were still running");
            verdict.next_step = Some(
                "Nothing failed before the interrupt. Let it run to its end (or give it `--timeout`, \
                 to have ups-doctor stop it and say where each rank was) to see how it ends."
                    .to_string(),
            );
        }
    }
    let met = mismatches.is_empty() && !c.interrupted;
    Conclusion { outcome, first_failure, collateral, verdict, mismatches, met }
}

/// For a run the user interrupted: when every rank that did not pass was ended by ups-doctor's
/// own teardown after the interrupt (none crashed, exited with an error, hung or ran out of time
/// before it), one line per such rank saying so, in rank order; else `None`.
fn stopped_at_interrupt(ranks: &[RankResult]) -> Option<Vec<String>> {
    let ended: Vec<&RankResult> = ranks.iter().filter(|r| r.outcome != OutcomeKind::Passed).collect();
    let ours = |r: &&RankResult| {
        r.torn_down_with.is_some() && matches!(r.outcome, OutcomeKind::Signaled | OutcomeKind::Exited)
    };
    if ended.is_empty() || !ended.iter().all(ours) {
        return None;
    }
    let mut ended = ended;
    ended.sort_by_key(|r| r.rank);
    let lines = ended
        .iter()
        .map(|r| {
            let sent = r.torn_down_with.unwrap_or(Signal::TERM);
            let how = match (sent, r.outcome, r.exit_code) {
                (Signal::KILL, _, _) => {
                    "it did not end on SIGTERM and was stopped with SIGKILL (ups-doctor's teardown: \
                     SIGTERM, then SIGKILL)"
                        .to_string()
                }
                (_, OutcomeKind::Exited, Some(code)) => {
                    format!("it exited with status {code} on ups-doctor's {sent}")
                }
                _ => format!("stopped by ups-doctor with {sent}"),
            };
            format!("rank {}: still running at the interrupt; {how}", r.rank)
        })
        .collect();
    Some(lines)
}

/// The first rank whose process started processes of its own through `torch.multiprocessing`
/// (its observer's `starts` marker, sent only by a per-rank run's rank): it was a launcher, and
/// its processes, not watched one by one, were the ranks.
fn launcher_rank(ranks: &[RankResult]) -> Option<(u32, &StartedProcesses)> {
    ranks.iter().find_map(|r| Some((r.rank, r.observed.as_ref()?.started.as_ref()?)))
}

/// The verdict of a per-rank run one of whose ranks started the ranks itself: what it said stays
/// as what was seen, but no rank is named first (every failure of its processes reached
/// ups-doctor as its own), and the next step is the launcher style, which watches each.
fn own_ranks_unwatched(verdict: &mut Verdict, outcome: OutcomeKind, rank: u32, started: &StartedProcesses) {
    let what = format!(
        "rank {rank}'s process started {} processes of its own (torch.multiprocessing, `{}`): it was a \
         launcher, and the ranks were those processes, which this per-rank run did not watch one by one",
        started.nprocs, started.start_method
    );
    verdict.evidence.insert(0, format!("{}{what}.", what[..1].to_uppercase()));
    verdict.next_step = Some(
        "Run again with `--style launcher` (`launch.style: launcher`): ups-doctor then watches each \
         process of the group the program forms as a rank of its own."
            .to_string(),
    );
    if outcome != OutcomeKind::Passed {
        verdict.headline = format!(
            "Which rank failed first cannot be told: {what}. What it ended with: {}",
            verdict.headline
        );
    }
}

/// `(watched, formed)` when a watched rank's process formed a process group larger than the ranks
/// this run was told to watch (a command whose launcher starts its ranks itself, with no rank
/// count on its command line: Lightning's `devices=2`, `mp.spawn(nprocs=…)`).
fn unwatched_ranks(observed: &Observed) -> Option<(u32, u32)> {
    let told = observed.scenario.launch.world_size;
    let formed = observed
        .ranks
        .iter()
        .filter_map(|r| r.observed.as_ref()?.group.as_ref().map(|g| g.world_size))
        .max()?;
    (formed > told).then_some((told, formed))
}

/// How the outcome differs from `expect`, one line per differing field (empty: met).
pub fn check_expectation(expect: &Expect, outcome: OutcomeKind, failed: Option<&RankResult>) -> Vec<String> {
    let mut out = Vec::new();
    if expect.outcome != outcome {
        out.push(format!("expected outcome `{}`, got `{}`", expect.outcome.as_str(), outcome.as_str()));
    }
    let Some(r) = failed else {
        for (field, set) in [
            ("signal", expect.signal.is_some()),
            ("exit_code", expect.exit_code.is_some()),
            ("rank", expect.rank.is_some()),
            ("phase", expect.phase.is_some()),
            ("step", expect.step.is_some()),
            ("message", expect.message.is_some()),
        ] {
            if set && expect.outcome != OutcomeKind::Passed {
                out.push(format!("expected `{field}` of a failing rank, but no rank failed"));
            }
        }
        return out;
    };
    if let Some(want) = &expect.signal {
        if Signal::parse(want) != r.signal {
            let got = r.signal.map_or("none".to_string(), |s| s.name());
            out.push(format!("expected signal `{want}`, got `{got}`"));
        }
    }
    if let Some(want) = expect.exit_code
        && r.exit_code != Some(want)
    {
        out.push(format!(
            "expected exit code {want}, got {}",
            r.exit_code.map_or("none".into(), |c| c.to_string())
        ));
    }
    if let Some(want) = expect.rank
        && r.rank != want
    {
        out.push(format!("expected rank {want} to fail first, got rank {}", r.rank));
    }
    if let Some(want) = &expect.phase
        && r.last_phase.as_deref() != Some(want.as_str())
    {
        out.push(format!("expected phase `{want}`, got `{}`", r.last_phase.as_deref().unwrap_or("none")));
    }
    if let Some(want) = expect.step
        && r.last_step != Some(want)
    {
        out.push(format!(
            "expected step {want}, got {}",
            r.last_step.map_or("none".into(), |s| s.to_string())
        ));
    }
    if let Some(want) = &expect.message {
        let in_error = r.error.as_deref().is_some_and(|e| e.contains(want.as_str()));
        let in_log = r.log_tail.iter().any(|l| l.contains(want.as_str()));
        if !in_error && !in_log {
            out.push(format!("expected the error to contain `{want}`"));
        }
    }
    out
}

/// Adds to the verdict what the GPU side shows: loader workers that hold GPU memory of their own.
/// (A worker that touched CUDA after fork and ranks that shared a GPU are patterns of
/// this judge's catalogue.)
fn annotate_gpu(verdict: &mut Verdict, scenario: &Scenario, gpu: Option<&GpuReport>) {
    let Some(gpu) = gpu else {
        return;
    };
    let workers: Vec<&GpuProcessPeak> =
        gpu.processes.iter().filter(|p| p.role == ProcessRole::Worker).collect();
    if !workers.is_empty() {
        let each: Vec<String> = workers
            .iter()
            .map(|p| {
                format!(
                    "rank {} · worker {} {}",
                    p.rank.unwrap_or(0),
                    p.worker.unwrap_or(0),
                    p.peak_memory_bytes.map_or_else(|| "(size not reported)".to_string(), human_bytes)
                )
            })
            .collect();
        let why = if scenario.data.cache_device == CacheDevice::Cuda {
            " because the dataset cache lives on the GPU (`data.cache_device: cuda`): each spawned worker \
             initialised CUDA, holds a context and its own copy of the cache there, and copies every batch back \
             to host memory for the rank to copy to the GPU again (REFERENCE.md failure 2, a \
             \"CUDA-contaminated cache\")"
        } else {
            ""
        };
        verdict.evidence.push(format!(
            "{} held GPU memory{why}: {}",
            if workers.len() == 1 { "a data-loader worker" } else { "data-loader workers" },
            each.join(", ")
        ));
        if verdict.next_step.is_none() {
            verdict.next_step = Some(
                "keep the dataset cache on the CPU (`data.cache_device: cpu`, or `cache: shm` to share it) so \
                 workers never touch CUDA; the rank moves batches to the GPU"
                    .to_string(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{Leftovers, ProcessRole};

    fn rank(rank: u32, outcome: OutcomeKind) -> RankResult {
        RankResult { rank, outcome, ..crate::report::fixtures::rank(rank, 3) }
    }

    fn verdict() -> Verdict {
        Verdict { headline: "rank 0 exited".into(), ..Default::default() }
    }

    fn observed<'a>(s: &'a Scenario, ranks: &'a [RankResult], leftovers: &'a Leftovers) -> Observed<'a> {
        Observed {
            scenario: s,
            ranks,
            wall_s: 7.5,
            memory: None,
            leftovers,
            oom_kills: &[],
            xids: &[],
            cgroup: None,
            launcher: None,
        }
    }

    fn judged(first: Option<u32>) -> Judgement {
        Judgement {
            outcome: OutcomeKind::Exited,
            first_failure: first,
            verdict: verdict(),
            same_failure: Vec::new(),
        }
    }

    #[test]
    fn ranks_that_failed_after_the_first_are_collateral_and_passed_ones_are_not() {
        let s = Scenario::default();
        let ranks =
            [rank(0, OutcomeKind::Exited), rank(1, OutcomeKind::Signaled), rank(2, OutcomeKind::Passed)];
        let leftovers = Leftovers::default();
        let c = settle(judged(Some(1)), &observed(&s, &ranks, &leftovers), &Circumstances::default());
        assert_eq!(c.collateral, [0]);
        let mut marked = ranks.clone();
        c.mark(&mut marked);
        assert_eq!(marked.iter().map(|r| r.collateral).collect::<Vec<_>>(), [true, false, false]);
    }

    #[test]
    fn expect_message_is_met_by_the_verdicts_key_line_or_any_ranks_output_not_only_the_first_ones_error() {
        let s: Scenario = serde_json::from_value(
            serde_json::json!({"expect": {"outcome": "exited", "message": "EADDRINUSE"}}),
        )
        .unwrap();
        let ranks = [RankResult { error: None, log_tail: Vec::new(), ..rank(0, OutcomeKind::Exited) }];
        let leftovers = Leftovers::default();
        let unmet = settle(judged(Some(0)), &observed(&s, &ranks, &leftovers), &Circumstances::default());
        assert_eq!(unmet.mismatches, ["expected the error to contain `EADDRINUSE`"]);
        let mut j = judged(Some(0));
        j.verdict.key_line =
            Some("DistNetworkError: … name: EADDRINUSE, message: address already in use".into());
        let met = settle(j, &observed(&s, &ranks, &leftovers), &Circumstances::default());
        assert!(met.met, "{:?}", met.mismatches);
        let other = [
            RankResult { error: None, log_tail: Vec::new(), ..rank(0, OutcomeKind::Exited) },
            RankResult {
                log_tail: vec!["code: -98, name: EADDRINUSE".into()],
                ..rank(1, OutcomeKind::Exited)
            },
        ];
        assert!(settle(judged(Some(0)), &observed(&s, &other, &leftovers), &Circumstances::default()).met);
    }

    #[test]
    fn an_interrupt_clears_the_expectation_and_says_so_first_on_one_node_as_on_several() {
        let s = Scenario::default();
        let ranks = [rank(0, OutcomeKind::Exited)];
        let leftovers = Leftovers::default();
        let lost = [Unobserved { line: "Node 1 (b) lost at 2.0 s (gone)".into(), part: "node 1".into() }];
        for unobserved in [&[][..], &lost[..]] {
            let c = Circumstances { interrupted: true, unobserved, ..Default::default() };
            let done = settle(judged(Some(0)), &observed(&s, &ranks, &leftovers), &c);
            assert!(done.mismatches.is_empty() && !done.met);
            assert_eq!(
                done.verdict.headline,
                "Interrupted by the user after 7.5 s, before the scenario ended on its own"
            );
            assert!(
                done.verdict.evidence[0].starts_with("Before the interrupt: "),
                "{:?}",
                done.verdict.evidence
            );
        }
    }

    #[test]
    fn an_interrupt_whose_ranks_ups_doctor_stopped_names_no_failure_and_a_crash_before_it_stays() {
        let s = Scenario::default();
        let leftovers = Leftovers::default();
        let stopped = |r: u32, sig: Signal| RankResult {
            signal: Some(sig),
            torn_down_with: Some(sig),
            ..rank(r, OutcomeKind::Signaled)
        };
        // Whichever rank the judge took for first, the conclusion is the same.
        let ranks = [stopped(1, Signal::KILL), stopped(0, Signal::TERM)];
        let c = Circumstances { interrupted: true, ..Default::default() };
        let done: Vec<Conclusion> =
            [0, 1].map(|f| settle(judged(Some(f)), &observed(&s, &ranks, &leftovers), &c)).into();
        assert_eq!(done[0], done[1]);
        let done = &done[0];
        assert_eq!((done.first_failure, done.collateral.as_slice(), done.met), (None, &[][..], false));
        assert!(
            done.verdict
                .headline
                .ends_with("nothing had failed; ups-doctor stopped the ranks that were still running")
        );
        assert_eq!(
            done.verdict.evidence,
            [
                "rank 0: still running at the interrupt; stopped by ups-doctor with SIGTERM",
                "rank 1: still running at the interrupt; it did not end on SIGTERM and was stopped with SIGKILL \
                 (ups-doctor's teardown: SIGTERM, then SIGKILL)",
            ]
        );
        assert!(done.verdict.likely_cause.is_none() && done.verdict.pattern.is_none());
        // A rank that crashed on its own before the interrupt is still the first failure.
        let crashed = [rank(0, OutcomeKind::Signaled), stopped(1, Signal::TERM)];
        let done = settle(judged(Some(0)), &observed(&s, &crashed, &leftovers), &c);
        assert_eq!(done.first_failure, Some(0));
        assert!(done.verdict.evidence[0].starts_with("Before the interrupt: "));
    }

    #[test]
    fn a_lost_node_is_the_headline_when_nothing_failed_before_it_and_a_mismatch() {
        let s = Scenario::default();
        let ranks = [rank(0, OutcomeKind::Passed)];
        let leftovers = Leftovers::default();
        let lost = [Unobserved { line: "Node 1 (b) lost at 2.0 s (gone)".into(), part: "node 1".into() }];
        let c = Circumstances { unobserved: &lost, ..Default::default() };
        let done = settle(judged(None), &observed(&s, &ranks, &leftovers), &c);
        assert_eq!(
            done.verdict.headline,
            "Node 1 (b) lost at 2.0 s (gone); the other nodes' ranks were torn down after it"
        );
        assert!(
            done.mismatches.iter().any(|m| m == "node 1 lost: its ranks were not observed"),
            "{:?}",
            done.mismatches
        );
        assert!(!done.met);
    }

    #[test]
    fn expectation_mismatches_are_listed_field_by_field() {
        let r = RankResult {
            last_phase: Some("backward".into()),
            last_step: Some(2),
            signal: Some(Signal::ABRT),
            ..rank(0, OutcomeKind::Signaled)
        };
        let expect = Expect {
            outcome: OutcomeKind::Signaled,
            signal: Some("SIGSEGV".into()),
            phase: Some("forward".into()),
            step: Some(2),
            ..Default::default()
        };
        let diff = check_expectation(&expect, OutcomeKind::Signaled, Some(&r));
        assert_eq!(
            diff,
            vec!["expected signal `SIGSEGV`, got `SIGABRT`", "expected phase `forward`, got `backward`"]
        );
        let met =
            Expect { outcome: OutcomeKind::Signaled, signal: Some("abrt".into()), ..Default::default() };
        assert!(check_expectation(&met, OutcomeKind::Signaled, Some(&r)).is_empty());
    }

    #[test]
    fn workers_holding_gpu_memory_point_at_the_cuda_cache() {
        let mut s = Scenario::default();
        (s.data.workers, s.data.start_method, s.data.cache_device) =
            (2, crate::scenario::StartMethod::Spawn, CacheDevice::Cuda);
        let gpu = GpuReport {
            processes: vec![GpuProcessPeak {
                gpu: 0,
                pid: 8,
                role: ProcessRole::Worker,
                rank: Some(0),
                worker: Some(1),
                peak_memory_bytes: Some(520 << 20),
            }],
            ..GpuReport::default()
        };
        let mut v = verdict();
        annotate_gpu(&mut v, &s, Some(&gpu));
        assert!(
            v.evidence[0].starts_with(
                "a data-loader worker held GPU memory because the dataset cache lives on the GPU"
            ),
            "{}",
            v.evidence[0]
        );
        assert!(v.evidence[0].ends_with("rank 0 · worker 1 520.0 MiB"), "{}", v.evidence[0]);
        assert!(v.next_step.is_some());
    }
}
