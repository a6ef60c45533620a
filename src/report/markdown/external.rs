//! The parts of a scenario's section that only external commands have: the command that ran, the
//! program's own last error lines next to the verdict, what stuck processes were doing (py-spy,
//! kernel wait channels) and the launcher's log.

use crate::schema::{ExitSource, ExternalRun, IdentifiedBy, LauncherEnd, RankResult, ScenarioResult};

use super::super::markup::{DETAILS_CLOSE, code, details_open, fence};
use super::super::text::{count, strip_control};
use super::doc::Doc;

/// The command line, how completion was judged, whether markers came, and the program's own
/// error lines (per rank, then the launcher's), quoted verbatim.
pub(super) fn program_words(doc: &mut Doc, s: &ScenarioResult) {
    let Some(ext) = &s.external else { return };
    doc.push(command_line(ext));
    if ext.launcher.is_some() {
        doc.push(identified_line(&s.ranks, ext.launcher.as_ref()));
    }
    if let Some(said) = ext.world_size_declared {
        doc.push(format!(
            "Ranks watched: {}, the process group the program formed (`init_process_group`, seen by the \
             observer); the command line said {said} (`launch.world_size`).",
            s.scenario.launch.world_size
        ));
    }
    // The same lines quoted by several ranks (each rank's copy of one peer's error) are shown
    // once, naming every rank that wrote them.
    let mut shown: Vec<(&crate::schema::Quote, Vec<u32>)> = Vec::new();
    for r in &s.ranks {
        for q in &r.quotes {
            match shown.iter_mut().find(|(seen, _)| seen.title == q.title && seen.lines == q.lines) {
                Some((_, ranks)) => ranks.push(r.rank),
                None => shown.push((q, vec![r.rank])),
            }
        }
    }
    for (q, ranks) in &shown {
        let who = match ranks.as_slice() {
            [one] => format!("Rank {one}"),
            many if many.len() > super::classes::GROUP_ABOVE => {
                format!("R{} (the same lines)", &super::classes::who(many)[1..])
            }
            [rest @ .., last] => format!(
                "Ranks {} and {last} (the same lines)",
                rest.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
            ),
            [] => unreachable!("a quote is shown for the rank that wrote it"),
        };
        doc.push(format!("{who}, {}:", q.title));
        doc.push(quote_fence(&q.lines));
    }
    if let Some(l) = &ext.launcher {
        for q in &l.quotes {
            let same = shown.iter().find(|(seen, _)| seen.lines == q.lines).map(|(_, ranks)| ranks[0]);
            match same {
                Some(rank) => doc.push(format!(
                    "Launcher output, {}: the same lines as rank {rank}'s above (the ranks share its output).",
                    q.title
                )),
                None => {
                    doc.push(format!("Launcher output, {}:", q.title));
                    doc.push(quote_fence(&q.lines));
                }
            }
        }
    }
}

/// How each rank's process was found below the launcher, or that it was not (and how many
/// processes below it looked like ranks without a rank number).
fn identified_line(ranks: &[RankResult], launcher: Option<&LauncherEnd>) -> String {
    let each: Vec<String> = if ranks.len() > super::classes::GROUP_ABOVE {
        identified_classes(ranks)
    } else {
        ranks.iter().map(identified).collect()
    };
    // "2 processes below the launcher look like ranks; their rank numbers are unknown", said
    // only when a rank was left without a process.
    let looked = match launcher.map_or(0, |l| l.unidentified_processes) {
        n if n > 0 && ranks.iter().any(|r| r.identified_by.is_none()) => {
            let words = crate::diagnose::looked_like_ranks(n);
            let words = words.trim_start_matches("; ");
            format!(" {}{}.", words[..1].to_uppercase(), &words[1..])
        }
        _ => String::new(),
    };
    format!("Ranks identified: {}.{looked}", each.join("; "))
}

/// Above [`super::classes::GROUP_ABOVE`] ranks, one entry per way of finding them (`ranks
/// 0–4095 (4,096 ranks) by `RANK``), the ranks each found in no way named as ranges.
fn identified_classes(ranks: &[RankResult]) -> Vec<String> {
    let how = |r: &RankResult| match &r.identified_by {
        Some(by) if by.variable().is_some() => format!("by {}", code(by.variable().unwrap_or_default())),
        Some(_) => identified(r).split_once(" by ").map(|(_, how)| format!("by {how}")).unwrap_or_default(),
        None => "no process identified".to_string(),
    };
    super::classes::group(ranks.iter(), how)
        .into_iter()
        .map(|c| match c.ranks.as_slice() {
            [_] => identified(c.first),
            many => format!("{} {}", super::classes::who(many), how(c.first)),
        })
        .collect()
}

/// How one rank's process was found.
fn identified(r: &RankResult) -> String {
    match &r.identified_by {
        Some(IdentifiedBy::LauncherProcess) => format!("rank {} is the launcher process itself", r.rank),
        Some(IdentifiedBy::SpawnOrder) => {
            format!("rank {} by spawn order (the launcher's child started {})", r.rank, ordinal(r.rank))
        }
        Some(IdentifiedBy::Markers) => {
            format!("rank {} by the helper's markers (the process reported rank {0})", r.rank)
        }
        Some(IdentifiedBy::ProcessGroup) => format!(
            "rank {} by the process group it formed (`init_process_group` gave it rank {0}, seen by the observer)",
            r.rank
        ),
        Some(IdentifiedBy::RendezvousListens) => {
            format!("rank {} by the rendezvous port (the process listens on it: the c10d store)", r.rank)
        }
        Some(IdentifiedBy::RendezvousConnected) => {
            format!("rank {} by the rendezvous port (the one other process connected to it)", r.rank)
        }
        Some(by) => {
            let var = by.variable().unwrap_or_default();
            format!("rank {} by {}", r.rank, code(&format!("{var}={}", r.rank)))
        }
        None => match (r.pid, r.exit_source) {
            (Some(pid), Some(ExitSource::ProcfsRankUnknown)) => {
                format!("rank {}: process {pid}, whose rank number is unknown (it failed)", r.rank)
            }
            _ => format!("rank {}: no process identified", r.rank),
        },
    }
}

fn ordinal(rank: u32) -> String {
    match rank {
        0 => "first".into(),
        1 => "second".into(),
        2 => "third".into(),
        n => format!("{}th", n + 1),
    }
}

fn quote_fence(lines: &[String]) -> String {
    let lines: Vec<String> = lines.iter().map(|l| strip_control(l)).collect();
    fence("text", &lines.join("\n"))
}

fn command_line(ext: &ExternalRun) -> String {
    let style = match &ext.style_chosen {
        Some(why) => format!("{}, chosen by `launch.style: auto`: {why}", ext.style),
        None => ext.style.to_string(),
    };
    let mut line = format!("Command ({style}): {}", code(&crate::report::text::display_line(&ext.argv)));
    line.push_str(&format!("; completion judged by {}", ext.completion));
    if !ext.markers_seen {
        line.push_str(
            "; **markers were absent** (the program does not use `python/ups_doctor.py`): phases and steps are \
             unknown, and hangs are judged by output activity",
        );
    }
    if ext.observer_silent {
        line.push_str(
            "; **the observer reported nothing** from any process: none imported torch, or Python did not read \
             ups-doctor's `sitecustomize` (`python -I`, `-S` or `-E`, or a `sys.path` of the program's own), so the \
             process group, steps and collectives it formed are unknown",
        );
    }
    if let Some(l) = &ext.launcher {
        let how = match (&l.launch_error, l.exit_code, &l.signal) {
            (Some(e), _, _) => format!("could not start: {e}"),
            (None, Some(c), _) => format!("exited with status {c}"),
            (None, None, Some(sig)) => format!("was killed by {sig}"),
            (None, None, None) => "did not end".to_string(),
        };
        line.push_str(&format!("; the launcher (pid {}) {how}", l.pid.map_or("?".into(), |p| p.to_string())));
    }
    line.push('.');
    line
}

/// What [`dumps`] shows of a rank but for its process and thread ids: ranks stuck in the same
/// place have the same.
pub(super) fn dump_key(r: &RankResult) -> Vec<String> {
    r.dumps
        .iter()
        .flat_map(|d| {
            let threads = d.threads.iter().map(|t| {
                format!(
                    "{} {} {}",
                    t.name,
                    t.wchan.as_deref().unwrap_or("-"),
                    t.syscall.as_deref().unwrap_or("-")
                )
            });
            [
                format!("{:?} {:?}", d.role, d.taken),
                d.py_spy.as_deref().map(super::classes::without_ids).unwrap_or_default(),
                d.python.as_deref().map(super::classes::without_ids).unwrap_or_default(),
                d.error.clone().unwrap_or_default(),
            ]
            .into_iter()
            .chain(threads)
        })
        .collect()
}

/// py-spy's stacks and each thread's kernel state, for every process of a stuck rank (`ranks`:
/// the class of ranks it stands for).
pub(super) fn dumps(doc: &mut Doc, r: &RankResult, ranks: &[u32]) {
    if r.dumps.is_empty() {
        return;
    }
    // `ups-doctor attach` reads a running job without stopping it: its dumps say when.
    let attached = r.dumps.iter().all(|d| d.taken.as_deref().is_some_and(|t| t.starts_with("attach")));
    let (when, verb) = match (attached, ranks.len()) {
        (true, 1) => ("", "was doing"),
        (true, _) => ("", "were doing"),
        (false, 1) => (" when it was stopped", "was doing"),
        (false, _) => (" when they were stopped", "were doing"),
    };
    doc.push(format!("### What {} {verb}{when}", super::classes::who(ranks)));
    if ranks.len() > 1 {
        doc.push(format!(
            "The same on each of these ranks but for process and thread ids; rank {}'s shown.",
            r.rank
        ));
    }
    for d in &r.dumps {
        let what = if d.threads.is_empty() && d.python.is_some() {
            "its Python stacks".to_string()
        } else {
            count(d.threads.len(), "thread", "threads")
        };
        doc.push(details_open(&format!("{} (pid {}): {what}", d.label(), d.pid)));
        match (&d.py_spy, &d.error, &d.python) {
            (Some(text), _, _) => doc.push(fence("text", &strip_control(text))),
            (None, _, Some(text)) => {
                doc.push("Python's own dump of its threads (`faulthandler`), written by the rank as the signal came:");
                doc.push(fence("text", &strip_control(text)));
            }
            (None, Some(why), None) => {
                doc.push(format!("No Python stacks: {}", why.lines().next().unwrap_or("")))
            }
            (None, None, None) => {}
        }
        if d.threads.is_empty() {
            doc.push(DETAILS_CLOSE);
            continue;
        }
        let rows: Vec<String> = d
            .threads
            .iter()
            .map(|t| {
                format!(
                    "{} {} wchan={} syscall={}",
                    t.tid,
                    t.name,
                    t.wchan.as_deref().unwrap_or("-"),
                    t.syscall.as_deref().unwrap_or("-")
                )
            })
            .collect();
        doc.push("Threads (tid, name, kernel wait channel, system call) from `/proc/PID/task`:");
        doc.push(fence("text", &rows.join("\n")));
        doc.push(DETAILS_CLOSE);
    }
}

/// The launcher's own log tail (its ranks share its output).
pub(super) fn launcher_log_tail(doc: &mut Doc, s: &ScenarioResult) {
    let Some(l) = s.external.as_ref().and_then(|e| e.launcher.as_ref()) else { return };
    if l.log_tail.is_empty() {
        return;
    }
    doc.push(details_open(&format!(
        "Log tail of the launcher ({})",
        count(l.log_tail.len(), "line", "lines")
    )));
    doc.push(format!("Full logs: {}, {}", code(&l.stderr_log), code(&l.stdout_log)));
    let lines: Vec<String> = l.log_tail.iter().map(|x| strip_control(x)).collect();
    doc.push(fence("text", &lines.join("\n")));
    doc.push(DETAILS_CLOSE);
}

#[cfg(test)]
mod tests {
    use crate::report::fixtures;
    use crate::report::render_markdown;
    use crate::schema::{ExternalRun, ExternalStyle, Quote, QuoteKind};

    #[test]
    fn the_same_quote_from_several_ranks_is_shown_once_naming_them() {
        let mut s = fixtures::segv();
        s.external = Some(ExternalRun {
            argv: vec!["python".into(), "train.py".into()],
            style: ExternalStyle::PerRank,
            style_chosen: None,
            markers_seen: false,
            observer_silent: false,
            completion: "exit status".into(),
            launcher: None,
            py_spy: None,
            world_size_declared: None,
        });
        let peer = Quote {
            title: QuoteKind::PythonTraceback,
            lines: vec!["RuntimeError: Connection closed by peer [127.0.0.1]:29500".into()],
        };
        let own = Quote { title: QuoteKind::PythonTraceback, lines: vec!["ValueError: bad sample".into()] };
        s.ranks[0].quotes = vec![peer.clone()];
        s.ranks[1].quotes = vec![own];
        let mut third = s.ranks[0].clone();
        third.rank = 2;
        s.ranks.push(third);
        let md = render_markdown(&fixtures::run(vec![s]));
        assert_eq!(
            md.matches("RuntimeError: Connection closed by peer [127.0.0.1]:29500").count(),
            1,
            "{md}"
        );
        assert!(md.contains("Ranks 0 and 2 (the same lines), Python traceback (tail):"), "{md}");
        assert!(md.contains("Rank 1, Python traceback (tail):"), "{md}");
    }
}
