//! Picks the culprit, the collateral and the pattern, and words the verdict: one path for the
//! built-in trainer and for a user's own program (whose texts never speak of markers it does not
//! send or of a trainer it does not have). Pure.

use crate::scenario::{CompletesWhen, OutcomeKind, Scenario};
use crate::schema::{ExitSource, LauncherEnd, QuoteKind, RankResult, Signal, Verdict};

use super::catalog::{self, Finding};
use super::evidence::{
    BUSY_SILENCE_SHARE, EndedBy, Evidence, IDLE_SILENCE_SHARE, Observed, RankEvidence, failure_time,
    location, rank_name, rank_unknown, silent_at_limit, stopped_by_launcher_unobserved,
    stopped_by_launcher_while_running,
};
use super::words::{EACH_RANK_MAX, rank_ranges, ranks_named};

/// The scenario's outcome (the culprit's, or passed), the culprit, and the verdict.
#[derive(Debug, Clone)]
pub struct Judgement {
    pub outcome: OutcomeKind,
    pub first_failure: Option<u32>,
    pub verdict: Verdict,
    /// Failed ranks that are not collateral of the first failure: those that failed with its own
    /// error each by itself, those hung together with it, and those a timed-out collective of it
    /// waited for.
    pub same_failure: Vec<u32>,
}

/// Judges one scenario from what was observed.
pub fn judge(o: &Observed) -> Judgement {
    let mut judged = judge_watched(o);
    if judged.outcome != OutcomeKind::Passed {
        // Where the ranks' collectives part ways, C++ ones included: said first, whatever the
        // pattern, since it is what the ranks themselves recorded.
        let flight = catalog::flight_lines(&Evidence::gather(o));
        judged.verdict.evidence.splice(0..0, flight);
    }
    match o.launcher.filter(|l| !l.restarted.is_empty()) {
        Some(launcher) if judged.outcome != OutcomeKind::Passed => {
            after_restart(judged, launcher, o.scenario)
        }
        _ => judged,
    }
}

/// The launcher started ranks again (an elastic restart: torchrun's `--max-restarts`) after the
/// processes ups-doctor watched for them ended. What was judged is that first attempt; the job's
/// end is the launcher's, which a later attempt decided. Said first, so that a failure the restart
/// recovered from is not the verdict of a job that passed, nor the first attempt's failure the
/// cause of a later one's.
fn after_restart(j: Judgement, launcher: &LauncherEnd, scenario: &Scenario) -> Judgement {
    let mut ranks: Vec<u32> = launcher.restarted.iter().map(|r| r.rank).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let which = if ranks.len() == 1 { "rank" } else { "ranks" };
    let started = format!("started {which} {} again", rank_ranges(&ranks));
    let name = program(scenario);
    let first = j.verdict.headline.trim_end_matches('.').to_string();
    let pids: Vec<String> =
        launcher.restarted.iter().map(|r| format!("rank {} pid {}", r.rank, r.pid)).collect();
    let mut verdict = j.verdict;
    verdict.evidence.insert(
        0,
        format!(
            "`{name}` {started} after the processes watched for them ended (an elastic restart; {}): the new \
             processes were not watched, and the ranks' figures here are their first processes'",
            pids.join(", ")
        ),
    );
    if launcher.exit_code == Some(0) {
        verdict.headline = format!(
            "Passed after a restart: `{name}` exited with status 0 once it had {started}. The attempt ups-doctor \
             watched failed: {first}."
        );
        verdict.pattern = None;
        verdict.reference = None;
        verdict.key_line = None;
        verdict.likely_cause = Some(format!(
            "The first attempt failed and the launcher's restart recovered from it; a failure a restart hides comes \
             back (and costs the restart's time): the first attempt's evidence is below. {}",
            verdict.likely_cause.unwrap_or_default()
        ));
        return Judgement {
            outcome: OutcomeKind::Passed,
            first_failure: None,
            verdict,
            same_failure: Vec::new(),
        };
    }
    let end = match (launcher.exit_code, launcher.signal) {
        (Some(c), _) => format!("exited with status {c}"),
        (_, Some(s)) => format!("was killed by {s}"),
        _ => "ended".to_string(),
    };
    verdict.headline = format!(
        "`{name}` {end} after it had {started}; the later attempt's end is in its own output (not watched). \
         The attempt ups-doctor watched: {first}."
    );
    Judgement { verdict, ..j }
}

/// Judges what ups-doctor watched: the ranks' first processes.
fn judge_watched(o: &Observed) -> Judgement {
    let ev = Evidence::gather(o);
    let failing: Vec<&RankEvidence> = ev.ranks.iter().filter(|r| r.failed()).collect();
    // A rank that only lost its peer, or that its launcher stopped with nothing else seen of its
    // end, is collateral whenever another failed for its own reason.
    let own: Vec<&RankEvidence> = failing
        .iter()
        .copied()
        .filter(|r| {
            !catalog::lost_its_peer(r)
                && !stopped_by_launcher_unobserved(r, ev.launcher)
                && !stopped_by_launcher_while_running(r)
        })
        .collect();
    // A rank its launcher says it stopped, with no error of its own, is not the first failure
    // where another rank has one: the launcher stops ranks only once one has failed, whatever the
    // clocks say (mp.spawn's rank 0, stopped as its wrapper exited, ended 0.05 s after the rank
    // that raised; under load the order flipped).
    let by_launcher = |r: &RankEvidence| matches!(r.ended_by, EndedBy::Launcher { .. } | EndedBy::Cluster);
    let worded = |r: &&RankEvidence| r.key.is_some() && !by_launcher(r);
    let own: Vec<&RankEvidence> = if own.iter().any(worded) {
        own.into_iter().filter(|r| !(by_launcher(r) && r.key.is_none())).collect()
    } else {
        own
    };
    let pool = if own.is_empty() { failing } else { own };
    let mut first = pool.into_iter().min_by(|a, b| failure_time(a.result).total_cmp(&failure_time(b.result)));
    // Ranks that raised the same exception, each ending by itself: which ended first is a race of
    // milliseconds, not evidence; the lowest-numbered is named first, so that the same program and
    // fault get the same verdict.
    if let Some(f) = first.filter(|f| f.key.as_ref().is_some_and(|k| k.is_exception())) {
        // (Also one whose launcher's SIGTERM reached it as it exited after its traceback: whether
        // it had exited by then is the same race.)
        let lowest = same_failure(&ev, f).into_iter().min();
        if let Some(low) = lowest.filter(|low| *low < f.rank()) {
            first = ev.rank(low);
        }
    }
    // Ranks stuck out of step: the odd rank is known by where it waits, not by whose last marker
    // happened to arrive first (that is scheduling).
    if let Some(odd) = catalog::odd_rank_by_markers(o.ranks) {
        first = ev.rank(odd.rank);
    }
    if let Some(busy) = busy_among_waiting(&ev) {
        first = Some(busy);
    }
    let finding = catalog::find(&ev, first);
    if let Some(c) = finding.as_ref().and_then(|f| f.culprit)
        && let Some(r) = ev.rank(c).filter(|r| r.failed())
    {
        first = Some(r);
    }
    // A rank that left the program's order and then ended well: where the failure began (the
    // outcome stays the failed rank's).
    let departed = finding
        .as_ref()
        .filter(|f| f.departed && !f.undecided)
        .and_then(|f| ev.rank(f.culprit?))
        .filter(|r| !r.failed() && first.is_some());
    let Some(failed) = first else {
        return Judgement {
            outcome: OutcomeKind::Passed,
            first_failure: None,
            verdict: passed(&ev, o.wall_s, finding),
            same_failure: Vec::new(),
        };
    };
    if let Some(launcher) = ev.launcher
        && ev.ranks.iter().all(|r| r.result.outcome == OutcomeKind::LaunchFailed && r.result.pid.is_none())
    {
        return launcher_alone(&ev, launcher, finding);
    }
    if let Some(launcher) = ev.launcher
        && ev.ranks.iter().all(|r| {
            r.result.pid.is_none() && matches!(r.result.outcome, OutcomeKind::Hung | OutcomeKind::TimedOut)
        })
    {
        return launcher_waited(&ev, launcher, failed.result.outcome, finding);
    }
    let (headline, evidence, likely_cause, next_step) = failure(&ev, failed);
    let mut verdict = Verdict { headline, evidence, likely_cause, next_step, ..Default::default() };
    let stopped_alone = finding.is_none() && stopped_by_its_launcher_alone(&ev, failed, &mut verdict);
    let together = none_first(&ev, failed, finding.as_ref(), &mut verdict);
    // Ranks the finding names for what they were (those a timed-out collective waited for).
    let mut named = finding.as_ref().map(|f| f.named.clone()).unwrap_or_default();
    // A finding that cannot tell which rank caused it: none is the first failure, none collateral.
    let undecided = finding.as_ref().is_some_and(|f| f.undecided);
    if undecided {
        named.extend(
            ev.ranks.iter().filter(|r| r.failed() && r.rank() != failed.rank()).map(RankEvidence::rank),
        );
    }
    if let Some(f) = finding {
        apply(&mut verdict, f);
    }
    let mut same = same_failure(&ev, failed);
    same.retain(|r| !named.contains(r));
    named.extend(&together);
    add_collateral(&ev, departed.unwrap_or(failed), &same, &named, &mut verdict);
    same.extend(&named);
    for line in catalog::shm_evidence(&ev, Some(failed)) {
        push_new(&mut verdict.evidence, line);
    }
    // A rank that died of a fatal signal without a word of its own: the dump in the launcher's
    // output is its (the only such rank), and its line is the key one.
    let key = failed.key.clone().or_else(|| catalog::fatal_key(&ev, failed));
    verdict.key_line = key.map(|k| k.render());
    Judgement {
        outcome: outcome_of(failed),
        // Ranks hung together, or a finding that cannot tell: none failed first.
        first_failure: (together.is_empty() && !undecided && !stopped_alone)
            .then_some(departed.unwrap_or(failed).rank()),
        verdict,
        same_failure: same,
    }
}

/// The run's outcome from its first failure: how that rank ended, except for a rank that failed
/// with an exception of its own and that its launcher or cluster then signalled as it exited. It
/// ended by its error: whether it had exited by then is the launcher's race (Lightning under
/// torchrun, rank 1 raising at step 3, 1 run in 5 beside a fresh-clone test run: torchrun saw rank
/// 0's lost peer first and sent rank 1 SIGTERM), so the outcome is `exited` every time, as the
/// headline names the error every time.
fn outcome_of(failed: &RankEvidence) -> OutcomeKind {
    let by_its_error = matches!(failed.ended_by, EndedBy::Launcher { .. } | EndedBy::Cluster)
        && failed.key.as_ref().is_some_and(|k| k.is_exception());
    if by_its_error { OutcomeKind::Exited } else { failed.result.outcome }
}

/// The only failed rank is one its launcher stopped with no error of its own (torchrun and
/// `torch.multiprocessing.spawn` stop ranks only once another of their processes has failed):
/// the process that failed was never found as a rank (it ended during its imports, under
/// `ddp_spawn` before the group formed). It is not the first failure; the launcher's own words
/// about which of its processes ended are quoted. Returns whether it was so.
fn stopped_by_its_launcher_alone(ev: &Evidence, failed: &RankEvidence, verdict: &mut Verdict) -> bool {
    let lone = ev.ranks.iter().filter(|r| r.failed()).count() == 1;
    if !lone
        || !(stopped_by_launcher_while_running(failed) || stopped_by_launcher_unobserved(failed, ev.launcher))
    {
        return false;
    }
    let said = ev.launcher.into_iter().flat_map(|l| l.log_tail.iter()).rfind(|l| {
        l.contains(" terminated with ") && (l.contains("process ") || l.contains("Child process with PID"))
    });
    let launcher = program(ev.scenario).split(' ').next().unwrap_or_default().to_string();
    verdict.headline = match said {
        Some(line) => format!(
            "The launcher `{launcher}` stopped {} after another of its processes failed, which was not found as a \
             rank; the launcher said: `{}`.",
            rank_name(failed.result, "rank"),
            line.trim()
        ),
        None => format!(
            "The launcher `{launcher}` stopped {}, which it does once another of its processes has failed; that \
             process was not found as a rank.",
            rank_name(failed.result, "rank")
        ),
    };
    verdict.evidence.push(format!(
        "{} showed no error of its own: its launcher stopped it, so it is not named the first failure",
        rank_name(failed.result, "rank")
    ));
    true
}

/// At the time limit, every rank silent past `limits.hang_after_s` and exactly one of them busy
/// (`BUSY_SILENCE_SHARE` of a core over its silence) while every other waited: the
/// busy one is what the others wait for, as far as CPU can tell. With two or more busy ranks (a
/// CUDA synchronize spins while it waits, on every rank), none is picked.
fn busy_among_waiting<'a>(ev: &'a Evidence) -> Option<&'a RankEvidence<'a>> {
    let silent: Vec<(&RankEvidence, f64)> = ev
        .ranks
        .iter()
        .map(|r| silent_at_limit(r.result, ev.scenario).map(|s| (r, s.share())))
        .collect::<Option<_>>()?;
    let mut busy = silent.iter().filter(|(_, share)| *share >= BUSY_SILENCE_SHARE);
    let (culprit, _) = busy.next()?;
    let others_wait =
        silent.iter().all(|(r, share)| r.rank() == culprit.rank() || *share < IDLE_SILENCE_SHARE);
    (busy.next().is_none() && others_wait && silent.len() > 1).then_some(*culprit)
}

/// The other hung ranks whose silence cannot be told apart from the first one's: under a
/// launcher, ranks without markers share its output, so each one's last sign of life is the same
/// line, and which stopped first (if either did before the other) is not known. Timing would
/// pick the lowest rank as the culprit and call the rest collateral, on nothing. Only when no
/// pattern named a culprit from the stacks.
fn hung_together(ev: &Evidence, failed: &RankEvidence) -> Vec<u32> {
    let silent_alike = |r: &RankResult| {
        r.outcome == OutcomeKind::Hung
            && r.last_marker_at_s.is_none()
            && r.last_output_at_s == failed.result.last_output_at_s
    };
    if ev.launcher.is_none() || !silent_alike(failed.result) {
        return Vec::new();
    }
    (ev.ranks.iter())
        .filter(|r| r.rank() != failed.rank() && silent_alike(r.result))
        .map(RankEvidence::rank)
        .collect()
}

/// Ranks of which none failed first, the verdict saying so: hung together, or every rank still
/// progressing at the time limit. Empty where a finding, or the evidence, names one.
fn none_first(
    ev: &Evidence,
    failed: &RankEvidence,
    finding: Option<&Finding>,
    verdict: &mut Verdict,
) -> Vec<u32> {
    if finding.is_some() {
        return Vec::new();
    }
    let together = hung_together(ev, failed);
    if !together.is_empty() {
        say_hung_together(failed, &together, verdict);
        return together;
    }
    let at_limit = progressing_at_limit(ev, failed);
    if !at_limit.is_empty() {
        say_progressing_at_limit(ev, failed, &at_limit, verdict);
    }
    at_limit
}

/// At the time limit, every rank still making progress: each timed out with its last marker or
/// line less than `limits.hang_after_s` before its end, and none silent past it. The order in which
/// ups-doctor's teardown ended them is no cause: none is the first failure, none collateral. (A
/// straggler, or one rank silent while the others progressed, is named by a finding or the
/// silence before this is asked.)
fn progressing_at_limit(ev: &Evidence, failed: &RankEvidence) -> Vec<u32> {
    let hang_after = ev.scenario.limits.hang_after_s;
    let progressing = |r: &RankResult| {
        let last = r
            .last_marker_at_s
            .into_iter()
            .chain(r.last_output_at_s)
            .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.max(t))));
        r.outcome == OutcomeKind::TimedOut
            && silent_at_limit(r, ev.scenario).is_none()
            && last.zip(r.ended_at_s).is_some_and(|(last, end)| end - last < hang_after)
    };
    if ev.ranks.len() < 2 || !ev.ranks.iter().all(|r| progressing(r.result)) {
        return Vec::new();
    }
    ev.ranks.iter().filter(|r| r.rank() != failed.rank()).map(RankEvidence::rank).collect()
}

/// The headline and evidence of ranks [`progressing_at_limit`]: named together, none first.
fn say_progressing_at_limit(ev: &Evidence, failed: &RankEvidence, others: &[u32], verdict: &mut Verdict) {
    let mut all = vec![failed.rank()];
    all.extend(others);
    all.sort_unstable();
    verdict.headline = format!(
        "Ranks {} were all still making progress at the run's time limit of {} s: the run is slower than the \
         limit allows, and no rank is behind the others.",
        rank_ranges(&all),
        ev.scenario.limits.timeout_s
    );
    verdict.evidence.push(format!(
        "every rank's last marker or line came less than `limits.hang_after_s` = {} s before ups-doctor ended it at \
         the limit: none is named first and none collateral (the teardown's order is no cause)",
        ev.scenario.limits.hang_after_s
    ));
}

/// The headline and evidence of ranks [`hung_together`]: named together, none first.
fn say_hung_together(failed: &RankEvidence, together: &[u32], verdict: &mut Verdict) {
    let mut all = vec![failed.rank()];
    all.extend(together);
    all.sort_unstable();
    let silence = failed.result.hang_detected_after_s.unwrap_or(f64::NAN);
    verdict.headline = format!(
        "Ranks {} hung together: no progress for {silence:.1} s; which of them stopped first cannot be told.",
        rank_ranges(&all)
    );
    let last = match failed.result.last_output_at_s {
        Some(t) => format!("whose last line came at {t:.2} s"),
        None => "which printed nothing".to_string(),
    };
    verdict.evidence.push(format!(
        "ranks {} sent no markers and share the launcher's output, {last}: their silences began at the same \
         moment as far as can be seen, so none is named first and none collateral; the stacks below show where \
         each waits",
        rank_ranges(&all)
    ));
}

/// The other ranks that ended by themselves with the first failure's own error (its key line,
/// numbers aside: pids, worker ids, ranks): each failed for the same reason on its own (every
/// rank out of `/dev/shm`, no driver on any), which timing alone cannot turn into a culprit and
/// collateral. A rank torn down, hung, or that lost its peer is not one of them.
fn same_failure(ev: &Evidence, failed: &RankEvidence) -> Vec<u32> {
    // Ranks sharing a launcher's output have no key line of their own; where every rank a fatal
    // signal ended left a dump without a Python frame there, each crashed as it shut down.
    let crashed_itself = |r: &RankEvidence| {
        r.result.outcome == OutcomeKind::Signaled
            && r.result.signal.is_some_and(|s| catalog::CRASH_SIGNALS.contains(&s))
            && matches!(r.ended_by, EndedBy::Itself)
            && r.key.is_none()
    };
    if crashed_itself(failed) && catalog::all_crashed_at_exit(ev) > 0 {
        return ev
            .ranks
            .iter()
            .filter(|r| {
                r.rank() != failed.rank() && crashed_itself(r) && r.result.signal == failed.result.signal
            })
            .map(RankEvidence::rank)
            .collect();
    }
    let shape = |r: &RankEvidence| {
        r.key
            .as_ref()
            .map(|k| k.text.chars().map(|c| if c.is_ascii_digit() { '#' } else { c }).collect::<String>())
    };
    let Some(own) = shape(failed) else { return Vec::new() };
    let by_itself = |r: &RankEvidence| {
        matches!(r.result.outcome, OutcomeKind::Exited | OutcomeKind::Signaled)
            && r.result.torn_down_with.is_none()
            && matches!(r.ended_by, EndedBy::Itself)
            && !catalog::lost_its_peer(r)
    };
    // A rank whose uncaught exception's traceback is in its output had failed before anything
    // stopped it: Python prints it before the exit handlers run, and a signal that came later (its
    // launcher's SIGTERM to the ranks still alive, ups-doctor's teardown) only cut its exit short.
    // Whether it had exited by then is a race of milliseconds, not evidence: alike for the rank
    // named first (the lowest of those that raised) and for the others.
    // So is one whose end its launcher reaped before ups-doctor read it (spawn's ranks): its own
    // error says it raised.
    let raised_before_stopped = |r: &RankEvidence| {
        matches!(
            r.ended_by,
            EndedBy::Launcher { .. } | EndedBy::Cluster | EndedBy::Teardown { .. } | EndedBy::Unknown
        ) && r.key.as_ref().is_some_and(|k| k.is_exception())
            && !catalog::lost_its_peer(r)
    };
    if !by_itself(failed) && !raised_before_stopped(failed) {
        return Vec::new();
    }
    ev.ranks
        .iter()
        .filter(|r| {
            r.rank() != failed.rank()
                && (by_itself(r) || raised_before_stopped(r))
                && shape(r).as_deref() == Some(own.as_str())
        })
        .map(RankEvidence::rank)
        .collect()
}

/// A launcher that ended before any process of a rank was found under it: the failure is the
/// launcher's (its own error line says why), and no rank failed, first or collateral.
fn launcher_alone(ev: &Evidence, launcher: &LauncherEnd, finding: Option<Finding>) -> Judgement {
    let name = program(ev.scenario).split(' ').next().unwrap_or_default().to_string();
    let how = match (launcher.exit_code, launcher.signal, &launcher.launch_error) {
        (_, _, Some(e)) => format!("could not be started: {e}"),
        (Some(c), _, _) => format!("exited with status {c}"),
        (_, Some(s), _) => format!("was killed by {s}"),
        _ => "ended".to_string(),
    };
    let key = super::evidence::key_line(&launcher.log_tail);
    let said = key.as_ref().map(|k| format!(": {}", k.render())).unwrap_or_default();
    let n = ev.ranks.len();
    let mut verdict = Verdict {
        headline: format!("`{name}` {how} before any of its {n} ranks started{said}."),
        evidence: vec![
            "no process of any rank was found under the launcher: the program never ran".to_string(),
            format!("the launcher's output: `{}`", launcher.stderr_log),
        ],
        likely_cause: Some("The launcher itself failed (its arguments, its rendezvous, its environment) before it started the program.".into()),
        next_step: Some("Read the launcher's own error above: fix its flags or what it names, then run again.".into()),
        key_line: key.map(|k| k.render()),
        ..Default::default()
    };
    if let Some(f) = finding {
        apply(&mut verdict, f);
    }
    Judgement { outcome: OutcomeKind::LaunchFailed, first_failure: None, verdict, same_failure: Vec::new() }
}

/// A launcher still running when the run was called hung (or timed out) that never started a
/// process of any rank: nothing of the program ran, so no rank hung, first or after another. When
/// its own flags ask for several nodes and this run started it on one, that is what it waits for.
fn launcher_waited(
    ev: &Evidence,
    launcher: &LauncherEnd,
    outcome: OutcomeKind,
    finding: Option<Finding>,
) -> Judgement {
    let name = program(ev.scenario).split(' ').next().unwrap_or_default().to_string();
    let n = ev.ranks.len();
    let limits = &ev.scenario.limits;
    let how_long = match outcome {
        OutcomeKind::TimedOut => {
            format!("until the run's time limit, {:.0} s (`limits.timeout_s`)", limits.timeout_s)
        }
        _ => format!("and without a word for {:.0} s (`limits.hang_after_s`)", limits.hang_after_s),
    };
    let argv = ev.scenario.command.as_deref().unwrap_or_default();
    let nodes = crate::scenario::declared_nodes(argv).filter(|_| ev.scenario.launch.nodes <= 1);
    let mut headline =
        format!("No rank started: `{name}` ran without starting any of its {n} ranks, {how_long}.");
    if let Some((count, flag)) = &nodes {
        headline.push_str(&format!(
            " It was started with `{flag}`: it starts its ranks once {count} nodes have joined its rendezvous, and \
             this run started it on this machine only."
        ));
    }
    let ended = match (launcher.signal, launcher.exit_code) {
        (Some(sig), _) => format!("ups-doctor's teardown ended it ({sig})"),
        (None, Some(code)) => format!("it then exited with status {code}"),
        _ => "it was then ended".to_string(),
    };
    let last = launcher.log_tail.iter().rev().find(|l| !l.trim().is_empty());
    let mut evidence = vec![
        "no process of any rank was found under the launcher: the program never ran, so no rank hung or failed"
            .to_string(),
        format!(
            "the launcher was still running when the run was called {}; {ended}",
            if outcome == OutcomeKind::TimedOut { "timed out" } else { "hung" }
        ),
    ];
    evidence.extend(last.map(|l| format!("the launcher's last line: `{}`", l.trim())));
    evidence.push(format!("the launcher's output: `{}`", launcher.stderr_log));
    let (likely_cause, next_step) = match &nodes {
        Some((count, flag)) => (
            format!("`{name}` waits in its rendezvous for the other nodes `{flag}` asks for, and none was started."),
            format!(
                "Start the same command on each of the {count} nodes with its own node rank (`--node_rank R`), each under \
                 `ups-doctor run --nodes {count} --node-rank R --coordinator HOST:PORT -- …` for one report; or play every \
                 node on this machine with `--set launch.nodes={count}`."
            ),
        ),
        // What the launcher of the table waits on (torchrun: its rendezvous; srun: its allocation;
        // Ray: its cluster's head); a command of none the table knows, in its own words only.
        None => match launcher.kind.as_deref().and_then(crate::scenario::launcher::named) {
            Some(l) => {
                let runs = if l.name == name { String::new() } else { format!(" (it runs {})", l.name) };
                (
                    format!("`{name}`{runs} waits before it starts its ranks: {}.", l.waits_for.0),
                    format!("Read the launcher's output above. {}", l.waits_for.1),
                )
            }
            None => (
                format!("`{name}` waits before it starts its ranks; what for, its output above may say."),
                "Read the launcher's output above; a stack of it (`py-spy dump --pid PID`) shows where it waits."
                    .to_string(),
            ),
        },
    };
    let key = super::evidence::key_line(&launcher.log_tail);
    let mut verdict = Verdict {
        headline,
        evidence,
        likely_cause: Some(likely_cause),
        next_step: Some(next_step),
        key_line: key.map(|k| k.render()),
        ..Default::default()
    };
    if let Some(f) = finding {
        apply(&mut verdict, f);
    }
    Judgement { outcome, first_failure: None, verdict, same_failure: Vec::new() }
}

fn push_new(lines: &mut Vec<String>, line: String) {
    if !lines.contains(&line) {
        lines.push(line);
    }
}

/// The pattern's id, headline, evidence, explanation, next step and reference.
fn apply(verdict: &mut Verdict, f: Finding) {
    verdict.pattern = Some(f.pattern.id.to_string());
    verdict.reference = Some(f.pattern.reference.to_string());
    if let Some(h) = f.headline {
        verdict.headline = h;
    }
    if let Some(a) = f.appendix {
        verdict.headline.push_str(&a);
    }
    for line in f.evidence {
        push_new(&mut verdict.evidence, line);
    }
    verdict.likely_cause = Some(f.cause.unwrap_or_else(|| f.pattern.explanation.to_string()));
    verdict.next_step = Some(f.next_step.unwrap_or_else(|| f.pattern.next_step.to_string()));
}

/// `python train.py`: the program and its first argument, for sentences.
fn program(scenario: &Scenario) -> String {
    let argv = scenario.command.as_deref().unwrap_or_default();
    let base = |a: &String| a.rsplit('/').next().unwrap_or(a).to_string();
    let script = argv.iter().skip(1).position(|a| a.ends_with(".py")).map(|i| i + 1);
    match (argv.first(), script) {
        (Some(p), Some(1)) => format!("{} {}", base(p), base(&argv[1])),
        (Some(p), Some(i)) => format!("{} … {}", base(p), base(&argv[i])),
        (Some(p), None) => base(p),
        _ => String::new(),
    }
}

fn completion(scenario: &Scenario) -> String {
    match &scenario.expect.completes_when {
        None => "exit status 0".to_string(),
        Some(CompletesWhen::Done) => "exit status 0 and the helper's `done` marker".to_string(),
        Some(CompletesWhen::Stdout(p)) => format!("exit status 0 and a stdout line matching `{p}`"),
        Some(CompletesWhen::Output(p)) => {
            format!("exit status 0 and an output line (stdout or stderr) matching `{p}`")
        }
    }
}

fn passed(ev: &Evidence, wall_s: f64, finding: Option<Finding>) -> Verdict {
    let ranks: Vec<&RankResult> = ev.ranks.iter().map(|r| r.result).collect();
    let n = ranks.len();
    let noun = if n == 1 { "rank" } else { "ranks" };
    let steps = ranks.first().map_or(0, |r| r.steps_done);
    let mut verdict = if ev.foreign {
        let steps = if steps > 0 { format!(", {steps} steps reported") } else { String::new() };
        let mut evidence = vec![format!("completion judged by {}", completion(ev.scenario))];
        if ranks.iter().all(|r| r.markers == 0) {
            evidence.push(
                "no markers: the program does not use `python/ups_doctor.py`, so phases and steps are unknown".into(),
            );
        } else if ranks.iter().all(|r| r.last_phase.is_none()) && ranks.iter().any(|r| r.steps_done > 0) {
            evidence.push(
                "steps counted by ups-doctor's observer (the optimizer's step hook), with each step's time in \
                 `DataLoader.__next__` and DDP's forward; the timeline's other phases (backward, the optimizer) \
                 need `python/ups_doctor.py`'s markers"
                    .into(),
            );
        }
        Verdict {
            headline: format!(
                "Passed: {n} {noun} of `{}` finished in {wall_s:.1} s{steps}.",
                program(ev.scenario)
            ),
            evidence,
            ..Default::default()
        }
    } else {
        let loss = match ranks.first().and_then(|r| Some((r.first_loss?, r.final_loss?))) {
            Some((a, b)) => format!(", loss {a:.4} → {b:.4}"),
            None => String::new(),
        };
        Verdict {
            headline: format!("Passed: {n} {noun} trained {steps} steps in {wall_s:.1} s{loss}."),
            ..Default::default()
        }
    };
    if let Some(f) = finding {
        verdict.pattern = Some(f.pattern.id.to_string());
        verdict.reference = Some(f.pattern.reference.to_string());
        verdict.headline.push_str(f.appendix.as_deref().unwrap_or_default());
        verdict.evidence.extend(f.evidence);
        verdict.likely_cause = f.cause;
        verdict.next_step = Some(f.next_step.unwrap_or_else(|| f.pattern.next_step.to_string()));
    }
    for line in catalog::shm_evidence(ev, None).into_iter().chain(catalog::threads_evidence(ev)) {
        push_new(&mut verdict.evidence, line);
    }
    verdict
}

/// How the judge knows what a program's rank was doing: its last marker, or without markers its
/// last output.
fn last_sign(ev: &Evidence, rank: &RankResult) -> String {
    if !ev.foreign {
        return match rank.last_marker_at_s {
            Some(t) => format!(
                "last marker from rank {} at {t:.2} s: {}; {} of {} steps done",
                rank.rank,
                location(rank).trim_start_matches("in "),
                rank.steps_done,
                ev.scenario.train.steps
            ),
            None => format!("rank {} sent no marker at all", rank.rank),
        };
    }
    match (rank.last_marker_at_s, rank.last_output_at_s) {
        // The observer's markers name no phase: only where the program's own markers do.
        (Some(t), _) => format!(
            "last marker from rank {} at {t:.2} s{}; {} steps reported",
            rank.rank,
            rank.last_phase
                .as_ref()
                .map(|_| format!(": {}", location(rank).trim_start_matches("in ")))
                .unwrap_or_default(),
            rank.steps_done
        ),
        (None, Some(t)) => format!(
            "rank {} sent no markers (the program does not use `python/ups_doctor.py`): its last output was at {t:.2} s{}",
            rank.rank,
            rank.log_tail.last().map(|l| format!(": `{}`", l.trim())).unwrap_or_default()
        ),
        (None, None) => format!("rank {} sent no markers and wrote no output", rank.rank),
    }
}

/// `; 2 processes below the launcher look like ranks; their rank numbers are unknown` for `count`
/// such processes, or nothing: the one wording of it, for the harness's messages, the verdict and
/// the report.
pub fn looked_like_ranks(count: u32) -> String {
    match count {
        0 => String::new(),
        1 => "; 1 process below the launcher looks like a rank; its rank number is unknown".to_string(),
        n => format!("; {n} processes below the launcher look like ranks; their rank numbers are unknown"),
    }
}

/// `the launcher exited with status 1` / `was killed by SIGKILL`.
fn launcher_ended(launcher: Option<&LauncherEnd>) -> String {
    match launcher {
        Some(LauncherEnd { exit_code: Some(c), .. }) => format!("the launcher exited with status {c}"),
        Some(LauncherEnd { signal: Some(s), .. }) => format!("the launcher was killed by {s}"),
        _ => "the launcher's end was not observed".to_string(),
    }
}

fn exit_source(rank: &RankResult, launcher: Option<&LauncherEnd>) -> Option<String> {
    let looked = looked_like_ranks(launcher.map_or(0, |l| l.unidentified_processes));
    rank.exit_source.map(|source| match source {
        ExitSource::Procfs => format!(
            "rank {}'s exit status was read from `/proc/{}/stat` while it was a zombie (it is the launcher's child, not ups-doctor's)",
            rank.rank,
            rank.pid.map_or("?".into(), |p| p.to_string())
        ),
        ExitSource::Torchrun => format!("rank {}'s exit status is the one torchrun's error summary gives", rank.rank),
        ExitSource::Spawn => format!(
            "rank {}'s exit status is the one `torch.multiprocessing.spawn` gives (it reaped process {} before ups-doctor could read it)",
            rank.rank,
            rank.pid.map_or("?".into(), |p| p.to_string())
        ),
        ExitSource::Srun => format!(
            "rank {}'s end is the one `srun` reports for its task (slurmstepd reaped process {} before ups-doctor could read it)",
            rank.rank,
            rank.pid.map_or("?".into(), |p| p.to_string())
        ),
        ExitSource::Launcher => format!("rank {} is the launcher process itself: its exit status is the launcher's", rank.rank),
        ExitSource::NotIdentified => format!(
            "rank {}'s process was never identified{}; the launcher exited with status 0",
            rank.rank,
            looked
        ),
        ExitSource::ProcfsRankUnknown => format!(
            "process {} is below the launcher, but no signal gave its rank number{}; {}: it is listed as rank {} \
             only by the order the processes that failed started; its exit status was read from `/proc/{}/stat` while \
             it was a zombie",
            rank.pid.map_or("?".into(), |p| p.to_string()),
            looked,
            launcher_ended(launcher),
            rank.rank,
            rank.pid.map_or("?".into(), |p| p.to_string()),
        ),
        ExitSource::LauncherStatus => format!(
            "rank {}'s process was never identified{}; {}: its outcome is the launcher's",
            rank.rank,
            looked,
            launcher_ended(launcher)
        ),
        ExitSource::LauncherStatus0 => format!("rank {} ended while the launcher exited with status 0, which torchrun does only when every rank did", rank.rank),
        ExitSource::TorchrunNotFailed => format!("rank {}'s exit status was not read (torchrun reaped it first); torchrun's failure summary does not list it and torchrun sent it no signal: it exited with status 0 by itself", rank.rank),
        ExitSource::Cluster => format!(
            "rank {}'s process {} is a cluster's worker, which the cluster ends as the job ends: {}, and the cluster did not name rank {} as failed",
            rank.rank,
            rank.pid.map_or("?".into(), |p| p.to_string()),
            launcher_ended(launcher),
            rank.rank
        ),
        ExitSource::ClusterAfterError => format!(
            "rank {}'s process {} is a cluster's worker: the cluster relayed its error as the rank's, then ended the \
             worker{} as it ends a failed job's workers",
            rank.rank,
            rank.pid.map_or("?".into(), |p| p.to_string()),
            rank.signal.map(|s| format!(" with {s}")).unwrap_or_default()
        ),
        ExitSource::Unknown => format!("rank {}'s exit status was not observed (it was reaped by its launcher before ups-doctor saw it)", rank.rank),
    })
}

/// What is known about OOM kills, for a SIGKILL that has none recorded.
fn no_oom_event(ev: &Evidence) -> &'static str {
    if ev.cgroup.is_some() {
        "no OOM event was recorded (the scenario's memory cgroup counted no OOM kill)"
    } else {
        "no OOM event was recorded"
    }
}

fn signal_cause(ev: &Evidence, signal: i32) -> String {
    match Signal::from_number(signal) {
        Signal::SEGV => "An invalid memory access in native code (libtorch, a CUDA/NCCL library, an extension, \
                          or memory shared between processes). Python prints no traceback for it and torchrun \
                          only reports `exitcode: -11`."
            .into(),
        Signal::BUS => "A memory-mapped page could not be backed, most often because `/dev/shm` is full \
                         (Docker's default is 64 MB) while data-loader workers pass batches through shared memory."
            .into(),
        Signal::ABRT => "`abort()`: a failed assertion or an uncaught C++ exception (look for \
                          `terminate called after throwing` in the log tail)."
            .into(),
        Signal::KILL => format!(
            "Killed with SIGKILL by something other than ups-doctor, and {}: the evidence does not show an OOM \
             kill. A job scheduler, a watchdog, a person or the OOM killer (when its event could not be seen) can \
             send SIGKILL; `dmesg` shows whether the kernel did.",
            no_oom_event(ev)
        ),
        Signal::FPE => "An arithmetic trap in native code, such as an integer division by zero.".into(),
        Signal::ILL => "An illegal instruction: code built for a newer CPU than this one, or a corrupted binary.".into(),
        _ => format!("The process was ended by {}.", Signal::from_number(signal)),
    }
}

/// The time limit ended a rank that had been silent past `limits.hang_after_s`: it was never
/// called hung because CPU kept being used (its own, or another rank's), so it did not "keep
/// making progress". Says how much of a core it used over the silence, and the others' too.
fn silent_at_time_limit(
    ev: &Evidence,
    r: &RankResult,
    silent: crate::schema::SilentCpu,
    who: &str,
    at: &str,
    mut evidence: Vec<String>,
) -> (String, Vec<String>, Option<String>, Option<String>) {
    let limits = &ev.scenario.limits;
    let pct = |s: crate::schema::SilentCpu| format!("{:.0}% of a core", s.share() * 100.0);
    let busy = silent.share() >= BUSY_SILENCE_SHARE;
    evidence.push(format!(
        "rank {} was silent (no marker, no output) for at least {:.1} s before the time limit, and its process and its \
         DataLoader workers used {:.1} s of CPU in that time ({}): a rank silent for `limits.hang_after_s` = {} s is called hung only once \
         no rank uses CPU any more",
        r.rank,
        silent.silent_s,
        silent.cpu_s,
        pct(silent),
        limits.hang_after_s
    ));
    for other in ev.ranks.iter().filter(|o| o.rank() != r.rank) {
        if let Some(s) = silent_at_limit(other.result, ev.scenario) {
            let what = if s.share() >= BUSY_SILENCE_SHARE {
                "busy too"
            } else if s.share() < IDLE_SILENCE_SHARE {
                "waiting"
            } else {
                "partly busy"
            };
            evidence.push(format!(
                "rank {} was silent too, using {} over {:.1} s: {what}",
                other.rank(),
                pct(s),
                s.silent_s
            ));
        }
    }
    let limit = limits.timeout_s;
    let also_busy: Vec<u32> = (ev.ranks.iter())
        .filter(|o| o.rank() != r.rank && busy_at_limit(ev, o.result))
        .map(RankEvidence::rank)
        .collect();
    if !busy {
        return (
            format!(
                "{who} was silent{at}, using {}, until the run's time limit of {limit} s: not called hung because CPU \
                 was still being used in the run.",
                pct(silent)
            ),
            evidence,
            Some(
                "Something of the run kept using CPU (another rank, or a process below the launcher) while this rank \
                 waited: ups-doctor calls a rank hung only once CPU use stops too, so the run ran to its time limit."
                    .into(),
            ),
            Some("The stacks below show what each rank was in when it was stopped.".into()),
        );
    }
    let headline = if also_busy.is_empty() {
        format!(
            "{who} went silent{at} but kept a core busy ({}) until the run's time limit of {limit} s: busy, not hung.",
            pct(silent)
        )
    } else {
        let mut all = vec![r.rank];
        all.extend(&also_busy);
        format!(
            "Ranks {} went silent but kept their cores busy until the run's time limit of {limit} s: busy, not hung; \
             CPU time cannot tell which of them the others wait for.",
            rank_ranges(&all)
        )
    };
    let whose =
        if also_busy.is_empty() { format!("rank {}'s stack", r.rank) } else { "their stacks".to_string() };
    (
        headline,
        evidence,
        Some(
            "A rank silent while it uses CPU is computing for long without a word (a long validation, a compile, data \
             preparation) or waiting by spinning: a busy-wait or retry loop, or a CUDA synchronize spinning on a \
             kernel that never finishes (a stuck NCCL collective). CPU time alone cannot tell which; the stacks \
             below show where it was."
                .into(),
        ),
        Some(format!(
            "Read {whose} below. If it is work that should take this long, have it print progress (or raise \
             `limits.hang_after_s`); if it spins waiting, what it waits for is the culprit."
        )),
    )
}

/// A rank the time limit ended while it was silent and busy (`BUSY_SILENCE_SHARE` of a core
/// over its silence).
fn busy_at_limit(ev: &Evidence, r: &RankResult) -> bool {
    silent_at_limit(r, ev.scenario).is_some_and(|s| s.share() >= BUSY_SILENCE_SHARE)
}

/// Headline, evidence, cause and next step for the culprit's outcome, before any pattern.
///
/// Long: one arm per failing outcome class (the match is exhaustive over `OutcomeKind`), each
/// writing its own headline, evidence, cause and next step; kept together so that the wording of
/// every class reads side by side and a new class cannot be left without one.
fn failure(ev: &Evidence, failed: &RankEvidence) -> (String, Vec<String>, Option<String>, Option<String>) {
    let r = failed.result;
    let scenario = ev.scenario;
    let who = rank_name(r, "Rank");
    let at = if ev.foreign && r.last_phase.is_none() { String::new() } else { format!(" {}", location(r)) };
    let mut evidence = vec![last_sign(ev, r)];
    // How the exit status was read matters only where the rank ended by itself: one ups-doctor
    // tore down (hung, out of time) ended by ups-doctor's own signal, whose status says nothing.
    let torn_down =
        r.torn_down_with.is_some() || matches!(r.outcome, OutcomeKind::Hung | OutcomeKind::TimedOut);
    if ev.foreign {
        evidence.extend(exit_source(r, ev.launcher).filter(|_| !torn_down));
        evidence.extend(ev.launcher_summary());
    }
    let quoted = "The program's own last error lines are quoted below the verdict.";
    match r.outcome {
        OutcomeKind::Signaled => {
            let sig = r.signal.map_or(String::new(), Signal::name);
            let num = r.signal.map_or(0, Signal::number);
            evidence.push(format!(
                "killed by {sig} (torchrun would print `exitcode: -{num}` and `Signal {num} ({sig}) received by PID {}`)",
                r.pid.map_or("?".into(), |p| p.to_string())
            ));
            if !r.backtrace.is_empty() {
                evidence.push(format!(
                    "native backtrace of {} frames captured by the crash handler; frame #0: `{}`",
                    r.backtrace.len(),
                    r.backtrace[0].symbol.as_deref().unwrap_or(&r.backtrace[0].addr)
                ));
            }
            if r.quotes.iter().any(|q| q.title == QuoteKind::FaultHandler) {
                evidence.push(
                    "Python's fault handler printed the Python stack at the crash (quoted below)".into(),
                );
            }
            let headline = match &failed.ended_by {
                EndedBy::Outside { signal: Signal::KILL } => {
                    format!("{who} was killed by SIGKILL from outside{at}; {}.", no_oom_event(ev))
                }
                EndedBy::Outside { signal } => {
                    format!("{who} was killed by {signal} from outside{at} (not sent by ups-doctor).")
                }
                EndedBy::Launcher { signal } => {
                    let program = program(ev.scenario);
                    let launcher = program.split(' ').next().unwrap_or_default();
                    match &failed.key {
                        // It had already failed on its own: the signal only cut its exit short.
                        Some(k) => format!(
                            "{who} failed{at}: {}; `{launcher}` then ended it with {signal} while it was exiting.",
                            k.text
                        ),
                        None => format!("{who} was ended by its launcher `{launcher}` with {signal}{at}."),
                    }
                }
                // A cluster's worker (Ray Train's) that failed with the error the cluster relayed,
                // then ended by the cluster's teardown of its workers (under load Ray's SIGKILL can
                // reach it before it has exited by itself).
                EndedBy::Cluster => match &failed.key {
                    Some(k) => {
                        format!("{who} failed{at}: {}; its cluster then ended its worker with {sig}.", k.text)
                    }
                    None => format!("{who}'s worker was ended by its cluster with {sig}{at}."),
                },
                _ => format!("{who} was killed by {sig}{at}."),
            };
            let cause = match (&failed.ended_by, &failed.key) {
                (EndedBy::Cluster, Some(_)) => format!(
                    "The rank's own error (quoted below), which its cluster relayed; the {sig} is how the \
                     cluster ends a failed job's workers, not a cause."
                ),
                _ => signal_cause(ev, num),
            };
            let next = if ev.foreign {
                format!(
                    "{quoted} The fault handler's stack shows the Python line that called into native code; then cut \
                     the program's params one at a time (`ups-doctor bisect`) to find what the crash needs."
                )
            } else {
                "Read the backtrace below from the top: the first frame in your own code is where to look. Then \
                 remove components one at a time (e.g. `--set model.attention=false`, a smaller `model.depths`) to \
                 find the one the crash needs."
                    .to_string()
            };
            (headline, evidence, Some(cause), Some(next))
        }
        OutcomeKind::FalseSuccess => {
            evidence.push(if ev.foreign {
                format!(
                    "exit status 0, but completion is judged by {}, and that was not seen",
                    completion(scenario)
                )
            } else {
                "exit status 0, but no `done` marker: training never reported completion".into()
            });
            let headline = if ev.foreign {
                format!("{who} exited with status 0{at} without the completion evidence: a false success.")
            } else {
                format!("{who} exited with status 0{at} without finishing training: a false success.")
            };
            (headline, evidence, None, None)
        }
        OutcomeKind::Exited => {
            let code = r.exit_code.map_or("an unobserved status".to_string(), |c| format!("status {c}"));
            evidence.push(format!("exit {code}"));
            let msg = failed.key.as_ref().map(|k| format!(": {}", k.render())).unwrap_or_default();
            let next = if ev.foreign {
                quoted.to_string()
            } else {
                "The error message and the log tail below say what went wrong.".to_string()
            };
            let lost =
                failed.key.is_none() && failed.text.iter().any(|l| l.trim() == super::evidence::LOST_STDERR);
            if lost {
                evidence.push(format!(
                    "its stderr ends in Python's `{}`: it began a traceback and could not finish writing it, so \
                     the error it exited with is not in its log",
                    super::evidence::LOST_STDERR
                ));
            }
            let cause = failed
                .key
                .as_ref()
                .map(|_| "The process reported this error itself before exiting.".to_string());
            (format!("{who} exited with {code}{at}{msg}"), evidence, cause, Some(next))
        }
        OutcomeKind::Hung => {
            let silence = r.hang_detected_after_s.unwrap_or(f64::NAN);
            if ev.foreign {
                evidence.push(format!(
                    "no marker and no output for {silence:.1} s (limit `limits.hang_after_s` = {} s)",
                    scenario.limits.hang_after_s
                ));
                let with_py_spy = r.dumps.iter().filter(|d| d.py_spy.is_some()).count();
                let rank = r.rank;
                let its = match r.dumps.len() {
                    1 => format!("rank {rank}'s process"),
                    n => format!("rank {rank}'s {n} processes"),
                };
                evidence.push(match (r.dumps.len(), with_py_spy) {
                    (0, _) => "no process of the rank was left to look at".to_string(),
                    (_, 0) => format!(
                        "{its} looked at from outside: each thread's kernel wait channel and system call (no py-spy stacks: {})",
                        r.dumps[0].error.as_deref().unwrap_or("py-spy failed")
                    ),
                    (1, _) => format!(
                        "{its} looked at from outside: its py-spy stacks, and each thread's kernel wait channel and system call"
                    ),
                    (_, k) => format!(
                        "{its} looked at from outside: py-spy stacks of {k}, and each thread's kernel wait channel and system call"
                    ),
                });
            } else {
                evidence.push(format!(
                    "no marker for {silence:.1} s (limit `limits.hang_after_s` = {} s)",
                    scenario.limits.hang_after_s
                ));
                if !r.stacks.is_empty() {
                    evidence.push(format!(
                        "stacks of {} dumped from inside the process",
                        match r.stacks.len() {
                            1 => "1 thread".to_string(),
                            n => format!("{n} threads"),
                        }
                    ));
                }
                if let Some(how) = &r.torn_down_with {
                    evidence.push(format!("torn down with {how} after the stack dump"));
                }
            }
            let cause = if ev.foreign {
                "The program stopped making progress without exiting: a collective waiting for a rank that will \
                 never join, a deadlock, or a DataLoader worker that stopped."
                    .to_string()
            } else {
                hang_cause(failed)
            };
            let next = if ev.foreign {
                "The stacks below show where each thread waits (`futex`: a lock or condition; `recvfrom`/`poll`: a peer)."
            } else {
                "The thread stacks below show where each thread waits; a thread holding a lock while waiting for \
                 another is the usual culprit."
            };
            (
                format!("{who} hung{at}: no progress for {silence:.1} s."),
                evidence,
                Some(cause),
                Some(next.to_string()),
            )
        }
        OutcomeKind::TimedOut => {
            evidence
                .push(format!("still running after `limits.timeout_s` = {} s", scenario.limits.timeout_s));
            if let Some(silent) = silent_at_limit(r, scenario) {
                return silent_at_time_limit(ev, r, silent, &who, &at, evidence);
            }
            let (cause, next) = if ev.foreign {
                (
                    "It kept making progress (markers or output), just not fast enough.",
                    "Raise `limits.timeout_s`, or make the run shorter through its params.",
                )
            } else {
                (
                    "It kept making progress, just not fast enough: the run is slower than the limit assumes.",
                    "Raise `limits.timeout_s` or reduce `train.steps`; compare steps/s with a known-good run.",
                )
            };
            (
                format!("{who} ran past the time limit of {} s{at}.", scenario.limits.timeout_s),
                evidence,
                Some(cause.into()),
                Some(next.into()),
            )
        }
        OutcomeKind::LaunchFailed => {
            let why = r.error.clone().unwrap_or_else(|| "unknown error".into());
            let next = if why.contains("(os error 24)") || why.contains("(os error 23)") {
                "ups-doctor ran out of open files starting the ranks (not the program's fault): raise the \
                 hard open-file limit (`ulimit -Hn` as root, `LimitNOFILE=` under systemd, `--ulimit nofile=` \
                 for docker; ups-doctor raises its soft limit to the hard one itself), or use fewer ranks."
            } else if ev.foreign {
                "Check `command`: the program must be on `PATH` (or given by its path) and its arguments right."
            } else {
                "Check that the ups-doctor binary and libtorch are installed (see the README's set-up)."
            };
            (format!("{who} could not be started: {why}"), Vec::new(), None, Some(next.into()))
        }
        OutcomeKind::Passed => unreachable!("a passed rank is not a failure"),
    }
}

/// The built-in trainer's stuck rank, from its in-process stacks.
fn hang_cause(rank: &RankEvidence) -> String {
    let waiting_on_lock = rank
        .threads
        .iter()
        .filter(|t| {
            t.frames.iter().take(8).any(|f| {
                f.function.contains("futex")
                    || f.function.contains("Mutex")
                    || f.function.contains("mutex")
                    || f.function.contains("lock_contended")
            })
        })
        .count();
    let in_gomp =
        rank.threads.iter().any(|t| t.frames.iter().any(|f| f.mentions("gomp_") || f.mentions("libgomp")));
    if waiting_on_lock >= 2 {
        format!(
            "{waiting_on_lock} threads are blocked acquiring locks: a deadlock, typically two threads taking \
             the same locks in opposite order."
        )
    } else if in_gomp {
        "Threads are waiting in an OpenMP barrier: typical of a process forked after libtorch's thread pool \
         started (fork after multi-threaded work deadlocks; use `spawn` or one thread in the child)."
            .into()
    } else {
        "A call that never returns: a deadlock, a collective waiting for a peer that is gone, or blocking I/O."
            .into()
    }
}

/// Names the ranks that failed after the culprit (collateral) in the headline and evidence.
fn add_collateral(
    ev: &Evidence,
    failed: &RankEvidence,
    same: &[u32],
    together: &[u32],
    verdict: &mut Verdict,
) {
    let first_at = failure_time(failed.result);
    if !same.is_empty() {
        if !verdict.headline.ends_with('.') {
            verdict.headline.push('.');
        }
        let list = same.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
        verdict.headline.push_str(&if same.len() == 1 {
            format!(" Rank {list} failed the same way on its own (not collateral).")
        } else {
            format!(" Ranks {list} failed the same way, each on its own (not collateral).")
        });
        for r in ev.ranks.iter().filter(|r| same.contains(&r.rank())) {
            let key = match (&r.key, r.result.signal) {
                (Some(k), _) => k.render(),
                (None, Some(sig)) => {
                    format!("killed by {sig} as it shut down (its dump shows no Python frame)")
                }
                (None, None) => String::new(),
            };
            verdict.evidence.push(match r.ended_by {
                EndedBy::Launcher { signal } | EndedBy::Teardown { signal } => format!(
                    "rank {} raised the same error before it was stopped (the {signal} came after its traceback): {key}",
                    r.rank()
                ),
                _ => format!("rank {} ended by itself with the same error: {key}", r.rank()),
            });
        }
    }
    let mut collateral: Vec<&RankEvidence> = ev
        .ranks
        .iter()
        .filter(|r| r.rank() != failed.rank() && r.failed() && !same.contains(&r.rank()))
        .filter(|r| !together.contains(&r.rank()))
        // Busy and silent at the time limit beside the first: named with it, not after it.
        .filter(|r| !(busy_at_limit(ev, failed.result) && busy_at_limit(ev, r.result)))
        .collect();
    collateral.sort_by(|a, b| failure_time(a.result).total_cmp(&failure_time(b.result)));
    // Ranks that could not be started, one line per cause (a thousand ranks stopped by one
    // `EMFILE` are one line, not a thousand).
    let mut not_started: Vec<(String, Vec<u32>)> = Vec::new();
    let mut lines = Vec::new();
    for other in &collateral {
        let o = other.result;
        if o.outcome == OutcomeKind::LaunchFailed && !rank_unknown(o) {
            let error = o.error.clone().unwrap_or_default();
            match not_started.iter_mut().find(|(e, _)| *e == error) {
                Some((_, ranks)) => ranks.push(o.rank),
                None => not_started.push((error, vec![o.rank])),
            }
            continue;
        }
        let how = match (o.outcome, &o.torn_down_with) {
            (_, Some(sent)) if o.outcome != OutcomeKind::Hung => format!("was torn down with {sent}"),
            (OutcomeKind::Signaled, _) => {
                format!("was killed by {}", o.signal.map_or("a signal".to_string(), Signal::name))
            }
            (OutcomeKind::Exited, _) => match o.exit_code {
                Some(code) => format!("exited with status {code}"),
                None => "ended (its exit status was not observed)".to_string(),
            },
            (kind, _) => kind.as_str().replace('_', " "),
        };
        let later = Some(failure_time(o) - first_at).filter(|l| l.is_finite() && *l >= 0.0);
        let error = match &other.key {
            Some(k) if ev.foreign => format!(": {}", k.text),
            _ => o.error.as_deref().map(|e| format!(": {e}")).unwrap_or_default(),
        };
        let at =
            if ev.foreign && o.last_phase.is_none() { String::new() } else { format!(" {}", location(o)) };
        // Its program had returned before it was ended: it lost nothing of its work. (Exit
        // handlers run after an uncaught exception too: then it had raised, not finished.)
        let raised = other.key.as_ref().is_some_and(|k| k.is_exception());
        let finished = match o.observed.as_ref().and_then(|obs| obs.exiting_at_s) {
            Some(t) if !raised && o.ended_at_s.is_none_or(|end| t <= end) => {
                format!(" (its program had finished too: its exit handlers ran at {t:.2} s)")
            }
            _ => String::new(),
        };
        lines.push(CollateralLine {
            who: rank_name(o, "rank"),
            rank: o.rank,
            how: format!("{how}{at}"),
            later,
            rest: format!("{error}{finished}"),
        });
    }
    verdict.evidence.extend(collateral_lines(lines));
    for (error, ranks) in not_started {
        let error = if error.is_empty() { String::new() } else { format!(": {error}") };
        let which = if ranks.len() == 1 { "rank" } else { "ranks" };
        verdict
            .evidence
            .push(format!("collateral: {which} {} could not be started{error}", rank_ranges(&ranks)));
    }
    if !collateral.is_empty() && !verdict.headline.ends_with('.') {
        verdict.headline.push('.');
    }
    let (known, unknown): (Vec<&RankResult>, Vec<&RankResult>) =
        collateral.iter().map(|r| r.result).partition(|r| rank_name(r, "Rank") == format!("Rank {}", r.rank));
    if !known.is_empty() {
        let ranks: Vec<u32> = known.iter().map(|r| r.rank).collect();
        // A short list keeps the order the ranks failed in; a long one is summed up in ranges.
        let list = if ranks.len() <= SHORT_LIST {
            ranks.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
        } else {
            rank_ranges(&ranks)
        };
        verdict.headline.push_str(&format!(
            " {} {list} failed after it (collateral).",
            if ranks.len() == 1 { "Rank" } else { "Ranks" },
        ));
    }
    for r in unknown {
        let lead = if rank_unknown(r) { "The" } else { "Rank" };
        verdict.headline.push_str(&format!(" {} failed after it (collateral).", rank_name(r, lead)));
    }
}

/// One collateral rank's line of evidence, in parts: what it did and where, how long after the
/// first failure, and its error.
struct CollateralLine {
    who: String,
    rank: u32,
    how: String,
    later: Option<f64>,
    rest: String,
}

/// `collateral: rank 0 was torn down with SIGTERM in `backward` at step 3 0.03 s later: …`, one a
/// rank, in the order they failed. Beyond [`EACH_RANK_MAX`] ranks, the ranks that ended the same
/// way are one line with the span of their times (`ranks 0–752, 754–1023 … 0.01–0.05 s later`):
/// 4,095 lines that say one thing bury the one that differs.
fn collateral_lines(lines: Vec<CollateralLine>) -> Vec<String> {
    let later = |l: Option<f64>| l.map(|l| format!(" {l:.2} s later")).unwrap_or_default();
    if lines.len() <= EACH_RANK_MAX {
        return lines
            .into_iter()
            .map(|l| format!("collateral: {} {}{}{}", l.who, l.how, later(l.later), l.rest))
            .collect();
    }
    // (how, the rest, its ranks, their times, the first rank's name)
    type Class = (String, String, Vec<u32>, Vec<f64>, String);
    let mut classes: Vec<Class> = Vec::new();
    let mut index: std::collections::HashMap<(String, String), usize> = std::collections::HashMap::new();
    for l in lines {
        let i = *index.entry((l.how.clone(), l.rest.clone())).or_insert_with(|| {
            classes.push((l.how, l.rest, Vec::new(), Vec::new(), l.who));
            classes.len() - 1
        });
        classes[i].2.push(l.rank);
        classes[i].3.extend(l.later);
    }
    classes
        .into_iter()
        .map(|(how, rest, ranks, times, who)| {
            let lo = times.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = times.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let when = match times.len() {
                0 => String::new(),
                _ if format!("{lo:.2}") == format!("{hi:.2}") => later(Some(lo)),
                _ => format!(" {lo:.2}–{hi:.2} s later"),
            };
            match ranks.as_slice() {
                [_] => format!("collateral: {who} {how}{when}{rest}"),
                _ => format!("collateral: {}, each {how}{when}{rest}", ranks_named(&ranks)),
            }
        })
        .collect()
}

/// Collateral ranks named one by one in the headline, in the order they failed; more are summed
/// up as ranges ([`rank_ranges`]).
const SHORT_LIST: usize = 4;

#[cfg(test)]
mod tests;
