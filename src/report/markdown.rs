//! The markdown report, written to be pasted into a GitHub issue: verdict first, then the
//! per-rank evidence, charts, logs and the scenario in collapsed sections, then the environment.
//!
//! The document is a list of blocks joined by blank lines, so every table, fence and `<details>`
//! gets the blank lines GitHub needs around it.

use crate::probe::env::EnvSummary;
use crate::protocol::Frame;
use crate::scenario::human_bytes;
use crate::schema::{RankResult, RunResult, ScenarioResult, ThreadStack};

mod classes;
mod doc;
mod external;
pub(crate) mod flight;
mod nodes;

pub(crate) use doc::Doc;

use super::environment;
use super::gpu;
use super::markup::{self, Align, DETAILS_CLOSE, code, details_open, fence, html_code};
use super::matrix;
use super::memory;
use super::mermaid;
use super::stack;
use super::text::{self, NONE, count, plural};

/// Longest text kept in a table cell.
const CELL_MAX: usize = 120;
/// Longest top-frame symbol shown in a stack's one-line summary.
const SUMMARY_MAX: usize = 100;
/// Longest quoted program text (an error message) kept in verdict text; the rank table, the log
/// tail and `result.json` have it whole.
const QUOTE_MAX: usize = 300;
/// Most characters GitHub accepts in an issue or comment body.
const GITHUB_BODY_MAX: usize = 65_536;

/// The markdown report for one invocation, ending in a newline: what `report.md` holds and what
/// a user pastes into an issue, so never longer than one GitHub comment (65,536 characters).
///
/// With one scenario it is that scenario's full report (collapsed sections left out first if it
/// would not fit). With several it is a summary: the matrix, then the verdict and evidence of
/// every scenario that failed or missed its expectation, each pointing to its full report
/// ([`render_scenario_markdown`], written to [`scenario_report_path`]).
///
/// Pure: the same [`RunResult`] always gives the same text, so `ups-doctor report` re-renders a
/// saved run exactly. Verdict text is written by the harness: its code spans are kept and
/// everything else, quoted program text included, is escaped here; every other value is escaped
/// too.
pub fn render_markdown(run: &RunResult) -> String {
    if !is_summary(run) {
        return match run.scenarios.first() {
            Some(_) => fit(full_report(run, 0), RESULT_FILE_NOTE),
            None => {
                let mut doc = header_blocks(run);
                environment_section(&mut doc, &run.environment, None);
                fit(doc, RESULT_FILE_NOTE)
            }
        };
    }
    let mut doc = header_blocks(run);
    let rows: Vec<Vec<String>> = matrix::rows(run)
        .into_iter()
        .map(|row| row.into_iter().map(|c| markup::text(&c.text)).collect())
        .collect();
    doc.push(markup::table(&matrix::header(run), &matrix::align(run), &rows));
    let notable: Vec<usize> = (0..run.scenarios.len())
        .filter(|&i| {
            let s = &run.scenarios[i];
            !s.met_expectation || s.outcome != crate::scenario::OutcomeKind::Passed
        })
        .collect();
    doc.push(format!(
        "Each scenario's full report (ranks, backtraces, charts, memory, log tails) is in its own \
         file next to this one, `N-name/report.md`{}.",
        if notable.is_empty() {
            String::new()
        } else {
            "; the scenarios that failed are summed up below".into()
        }
    ));
    for &i in &notable {
        let s = &run.scenarios[i];
        scenario_heading(&mut doc, s);
        verdict(&mut doc, s);
        doc.push(format!("Full report: {}", code(&scenario_report_path(run, i))));
    }
    if !run.scenarios.is_empty() {
        doc.push(TIMELINE_LINE);
    }
    environment_section(&mut doc, &run.environment, program_torch(run.scenarios.iter()));
    fit(doc, RESULT_FILE_NOTE)
}

/// The full report of scenario `index` of `run`, for its own file: every section, nothing left
/// out.
pub fn render_scenario_markdown(run: &RunResult, index: usize) -> String {
    full_report(run, index).finish()
}

/// Whether `report.md` is a summary with one full report per scenario beside it.
pub fn is_summary(run: &RunResult) -> bool {
    run.scenarios.len() + run.not_run.len() > 1
}

/// Where the full report of scenario `index` goes, relative to the run folder: in the scenario's
/// own folder (the one its rank logs are in), as `report.md`.
pub fn scenario_report_path(run: &RunResult, index: usize) -> String {
    let log_folder = |s: &ScenarioResult| {
        s.ranks.iter().flat_map(|r| [&r.stdout_log, &r.stderr_log]).find_map(|log| {
            let parent = std::path::Path::new(log.as_str()).parent()?;
            (!parent.as_os_str().is_empty() && parent.is_relative()).then(|| parent.display().to_string())
        })
    };
    let s = &run.scenarios[index];
    // The logs' folder when it is this scenario's alone; else the name `run` gives it.
    let own = log_folder(s).filter(|f| {
        run.scenarios.iter().enumerate().all(|(i, other)| i == index || log_folder(other).as_ref() != Some(f))
    });
    let folder = own.unwrap_or_else(|| {
        let width = run.scenarios.len().to_string().len();
        let name: String = s
            .name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
            .collect();
        format!("{:0width$}-{name}", index + 1)
    });
    format!("{folder}/report.md")
}

fn header_blocks(run: &RunResult) -> Doc {
    let mut doc = Doc::default();
    doc.push("# ups-doctor report");
    doc.push(summary_line(run));
    interruption(&mut doc, run);
    logs_cut(&mut doc, run);
    doc
}

/// The logs of this run cut to make room for the result on a full disk, and by how much.
fn logs_cut(doc: &mut Doc, run: &RunResult) {
    if run.logs_cut.is_empty() {
        return;
    }
    let mut lines = vec![
        "> [!WARNING]".to_string(),
        "> The disk was full: to make room for this result, ups-doctor cut logs of this run (each ends \
         with a note saying where; no file that was in the folder before the run was touched):"
            .to_string(),
    ];
    for cut in &run.logs_cut {
        lines.push(format!("> - {}: {} → {} bytes", code(&cut.path), cut.from_bytes, cut.to_bytes));
    }
    doc.push(lines.join("\n"));
}

fn full_report(run: &RunResult, index: usize) -> Doc {
    let mut doc = if is_summary(run) { scenario_header(run, index) } else { header_blocks(run) };
    scenario(&mut doc, &run.scenarios[index]);
    environment_section(&mut doc, &run.environment, program_torch(run.scenarios[index..=index].iter()));
    doc
}

/// Where the run's timeline is, and what opens it.
const TIMELINE_LINE: &str = "Timeline: `trace.json` beside this report (every rank and worker, phases, \
     deaths with their stacks, memory) — open it in <https://ui.perfetto.dev>.";

/// What a report cut to fit a comment points to.
const RESULT_FILE_NOTE: &str = "the run folder's `result.json` and the full reports next to it";

/// `doc` as text of at most [`GITHUB_BODY_MAX`] characters, by construction: when it is longer,
/// collapsed sections (log tails, stacks, the scenario) are emptied, largest first, each saying
/// so; if that is not enough, the blocks at the end are left out and a note says where they are.
fn fit(mut doc: Doc, whole: &str) -> String {
    let len = |blocks: &[String]| blocks.iter().map(|b| b.chars().count() + 2).sum::<usize>();
    let original = len(&doc.blocks);
    if original <= GITHUB_BODY_MAX {
        return doc.finish();
    }
    // Each block's size, counted once and kept up to date: counting the whole document again
    // after each section emptied took 97 s for a report of 4,096 ranks.
    let mut sizes: Vec<usize> = doc.blocks.iter().map(|b| b.chars().count() + 2).collect();
    let mut total = original;
    // Collapsed sections: (index of `<details>`, index of its close, characters inside).
    let mut sections: Vec<(usize, usize, usize)> = Vec::new();
    let mut open = None;
    for (i, b) in doc.blocks.iter().enumerate() {
        if b.starts_with("<details>") {
            open = Some(i);
        } else if b == DETAILS_CLOSE
            && let Some(o) = open.take()
        {
            sections.push((o, i, sizes[o + 1..i].iter().sum()));
        }
    }
    sections.sort_by_key(|&(_, _, size)| std::cmp::Reverse(size));
    let left_out = format!("Left out here to fit one GitHub comment: it is in {whole}.");
    for (o, close, _) in sections {
        if total <= GITHUB_BODY_MAX {
            break;
        }
        for (block, size) in doc.blocks[o + 1..close].iter_mut().zip(&mut sizes[o + 1..close]) {
            block.clear();
            total = total - *size + 2;
            *size = 2;
        }
        doc.blocks[o + 1] = left_out.clone();
        total = total - sizes[o + 1] + left_out.chars().count() + 2;
        sizes[o + 1] = left_out.chars().count() + 2;
    }
    doc.blocks.retain(|b| !b.is_empty());
    if len(&doc.blocks) > GITHUB_BODY_MAX {
        let note = |n: usize| {
            format!(
                "> [!NOTE]\n> The last {n} characters of this report are left out to fit one GitHub \
                 comment ({GITHUB_BODY_MAX} at most); they are in {whole}."
            )
        };
        let budget = GITHUB_BODY_MAX - note(original).chars().count() - 2;
        let mut kept = 0;
        let mut used = 0;
        for b in &doc.blocks {
            let size = b.chars().count() + 2;
            if used + size > budget {
                break;
            }
            used += size;
            kept += 1;
        }
        let cut = len(&doc.blocks[kept..]);
        doc.blocks.truncate(kept);
        // A `<details>` left open would swallow the note: end before it.
        let mut depth_open = None;
        for (i, b) in doc.blocks.iter().enumerate() {
            if b.starts_with("<details>") {
                depth_open = Some(i);
            } else if b == DETAILS_CLOSE {
                depth_open = None;
            }
        }
        let cut = cut + depth_open.map_or(0, |o| len(&doc.blocks[o..]));
        if let Some(o) = depth_open {
            doc.blocks.truncate(o);
        }
        doc.push(note(cut));
    }
    doc.finish()
}

/// The header of one scenario's own report in a run of several: it speaks of that scenario, not
/// of the run's count ("Ran 27 scenarios" above a report of one).
fn scenario_header(run: &RunResult, index: usize) -> Doc {
    let mut doc = Doc::default();
    doc.push("# ups-doctor report");
    let s = &run.scenarios[index];
    let met = if s.interrupted {
        "it was interrupted"
    } else if s.met_expectation {
        "it met its expectation"
    } else {
        "it did **not** meet its expectation"
    };
    doc.push(format!(
        "Scenario {} of {} of one run: {met}. {}",
        index + 1,
        run.scenarios.len() + run.not_run.len(),
        started(run)
    ));
    interruption(&mut doc, run);
    doc
}

/// `Started AT with `CMD` (ups-doctor V).`
fn started(run: &RunResult) -> String {
    let command = if run.command.is_empty() {
        String::new()
    } else {
        format!(" with {}", code(&text::display_line(&run.command)))
    };
    format!(
        "Started {}{command} (ups-doctor {}).",
        markup::text(&run.started_at),
        markup::text(&run.tool_version)
    )
}

fn summary_line(run: &RunResult) -> String {
    let total = run.scenarios.len();
    let met = run.scenarios.iter().filter(|s| s.met_expectation).count();
    let outcome = match (total, met) {
        (0, _) => "No scenario finished.".to_string(),
        (1, 1) => "Ran 1 scenario: it met its expectation.".to_string(),
        (1, _) => "Ran 1 scenario: it did **not** meet its expectation.".to_string(),
        (n, m) if n == m => format!("Ran {n} scenarios: all met their expectation."),
        (n, 0) => format!("Ran {n} scenarios: **none** met its expectation."),
        (n, m) => format!(
            "Ran {n} scenarios: {m} met {}, **{}** did not.",
            if m == 1 { "its expectation" } else { "their expectation" },
            n - m
        ),
    };
    format!("{outcome} {}", started(run))
}

fn interruption(doc: &mut Doc, run: &RunResult) {
    if !run.interrupted && run.not_run.is_empty() && run.stopped_by.is_none() {
        return;
    }
    let mut lines = vec!["> [!WARNING]".to_string()];
    if run.interrupted {
        lines.push(
            "> The run was interrupted before it finished; the results below are those of the \
             scenarios that ran (one cut short is marked interrupted)."
                .to_string(),
        );
    }
    if let Some(why) = &run.stopped_by {
        lines.push(format!("> ups-doctor stopped before the end: {}", markup::text(why)));
    }
    if !run.not_run.is_empty() {
        let names: Vec<String> = run.not_run.iter().map(|n| code(n)).collect();
        lines.push(format!(
            "> {} did not run: {}.",
            count(run.not_run.len(), "scenario", "scenarios"),
            names.join(", ")
        ));
    }
    doc.push(lines.join("\n"));
}

/// `## name: outcome`. Whether it met its `expect` is said once, on the **Expected** line of the
/// verdict: in a heading, "NOT MET" on a user's own program read as if ups-doctor had failed.
fn scenario_heading(doc: &mut Doc, s: &ScenarioResult) {
    doc.push(format!("## {}: {}", markup::text(&s.name), markup::text(&text::scenario_outcome(s))));
}

fn scenario(doc: &mut Doc, s: &ScenarioResult) {
    scenario_heading(doc, s);
    verdict(doc, s);
    nodes::overview(doc, s);
    external::program_words(doc, s);
    doc.push(rank_table(s));
    doc.push(TIMELINE_LINE);
    if let Some(notes) = rank_notes(s) {
        doc.push(notes);
    }
    doc.push(speed_line(s));
    if let Some(line) = parameters_line(s) {
        doc.push(line);
    }
    let backtrace_of = |r: &RankResult| (frames(&r.backtrace), r.raw_backtrace.clone());
    let has_backtrace = |r: &RankResult| !(r.backtrace.is_empty() && r.raw_backtrace.is_empty());
    per_rank(doc, s, has_backtrace, backtrace_of, backtrace, "backtraces");
    let stacks_of =
        |r: &RankResult| r.stacks.iter().map(|t| (t.thread.clone(), frames(&t.frames))).collect::<Vec<_>>();
    per_rank(doc, s, |r| !r.stacks.is_empty(), stacks_of, stacks, "stacks");
    flight::collectives(doc, s);
    per_rank(doc, s, |r| !r.dumps.is_empty(), external::dump_key, external::dumps, "stacks from outside");
    if let Some(gantt) = mermaid::timeline(s) {
        doc.push(fence("mermaid", &gantt));
    }
    let first = s.ranks.iter().min_by_key(|r| r.rank);
    if let Some(chart) = first.and_then(mermaid::loss_chart) {
        doc.push(fence("mermaid", &chart));
    } else if let Some(line) = first.and_then(mermaid::loss_line) {
        doc.push(line);
    }
    if s.nodes.is_some() {
        nodes::per_node_evidence(doc, s);
    } else {
        for block in gpu::gpu_blocks(s) {
            doc.push(block);
        }
        for block in memory::memory_blocks(s).into_iter().chain(memory::leftover_blocks(s)) {
            doc.push(block);
        }
    }
    external::launcher_log_tail(doc, s);
    per_rank(doc, s, |r| !r.log_tail.is_empty(), |r| r.log_tail.clone(), log_tail, "log tails");
    scenario_details(doc, s);
}

/// Each rank's `section` (for the ranks that `has` one), or above [`classes::GROUP_ABOVE`] ranks
/// one per class of ranks whose section says the same (`key`): the odd ones first, at most
/// [`classes::CLASSES_SHOWN`], then how many ranks' `what` are left to `result.json`.
fn per_rank<K: Eq + std::hash::Hash>(
    doc: &mut Doc,
    s: &ScenarioResult,
    has: impl Fn(&RankResult) -> bool,
    key: impl Fn(&RankResult) -> K,
    section: fn(&mut Doc, &RankResult, &[u32]),
    what: &str,
) {
    if s.ranks.len() <= classes::GROUP_ABOVE {
        for r in s.ranks.iter().filter(|r| has(r)) {
            section(doc, r, &[r.rank]);
        }
        return;
    }
    let (shown, left) = classes::shown(classes::group(s.ranks.iter().filter(|r| has(r)), key));
    for c in &shown {
        section(doc, c.first, &c.ranks);
    }
    if left > 0 {
        doc.push(format!(
            "The {what} of {} more ranks, in classes of their own, are in `result.json`.",
            classes::thousands(left)
        ));
    }
}

/// Under a class's heading: whose is shown, where it stands for several ranks.
fn shown_for(doc: &mut Doc, r: &RankResult, ranks: &[u32]) {
    if ranks.len() > 1 {
        doc.push(format!(
            "The same on each of these ranks but for process and thread ids; rank {}'s shown.",
            r.rank
        ));
    }
}

fn verdict(doc: &mut Doc, s: &ScenarioResult) {
    let v = &s.verdict;
    // Verdicts quote program text (error messages with C++ signatures, paths, `<…>`): escaped
    // here, whatever the judge wrote, so that GitHub shows it as it is.
    let quotes: Vec<&str> = s.ranks.iter().filter_map(|r| r.error.as_deref()).collect();
    let inline = |t: &str| markup::harness(t, &quotes, QUOTE_MAX);
    let headline = if v.headline.trim().is_empty() {
        markup::text(&text::scenario_outcome(s))
    } else {
        inline(&v.headline)
    };
    doc.push(format!("**{headline}**"));
    if let Some(key) = &v.key_line {
        doc.push(format!("**Key line:** {}", code(&text::strip_control(key))));
    }
    if let Some(pattern) = &v.pattern {
        let reference = v.reference.as_deref().map(|r| format!(" — see <{r}>")).unwrap_or_default();
        // Named with its title and, when the verdict has no cause of its own, its explanation,
        // so that the line reads wherever the report is pasted (no link into this project).
        let known = crate::diagnose::PATTERNS.iter().find(|p| p.id == pattern);
        let what = match known {
            Some(p) if v.likely_cause.is_none() => {
                format!("{} ({}): {}", p.title, code(pattern), p.explanation)
            }
            Some(p) => format!("{} ({})", p.title, code(pattern)),
            None => code(pattern),
        };
        doc.push(format!("**Pattern:** {what}{reference}"));
    }
    if let Some(cause) = &v.likely_cause {
        doc.push(format!("**Likely cause:** {}", inline(cause)));
    }
    if let Some(next) = &v.next_step {
        doc.push(format!("**Next step:** {}", inline(next)));
    }
    if !v.evidence.is_empty() {
        doc.push("Evidence:");
        doc.push(bullets(v.evidence.iter().map(|e| inline(e))));
    }
    let expected = text::describe_expect(&s.scenario.expect, code);
    if s.met_expectation {
        doc.push(format!("**Expected:** {expected} — met."));
    } else if s.expectation_mismatches.is_empty() {
        doc.push(format!("**Expected:** {expected} — **not met**."));
    } else {
        doc.push(format!("**Expected:** {expected} — **not met**:"));
        doc.push(bullets(s.expectation_mismatches.iter().map(|m| inline(m))));
    }
}

/// Harness-written markdown on one line, so it cannot end a list item or a paragraph early.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn bullets(items: impl Iterator<Item = String>) -> String {
    items.map(|i| format!("- {i}")).collect::<Vec<_>>().join("\n")
}

/// One row per rank, or above [`classes::GROUP_ABOVE`] ranks one row per class of ranks whose
/// row is the same but for the rank, pid and node (STAT's equivalence classes: `ranks 0–1776,
/// 1778–4095 (4,095 ranks)` in one row, rank 1777 in its own). Columns that no rank has a value
/// for are left out, and outcome with status and phase with step share a column, so the table
/// fits GitHub's comment column.
fn rank_table(s: &ScenarioResult) -> String {
    const HEADER: [&str; 8] =
        ["node", "rank", "pid", "outcome", "where", "steps done", "loss first → final", "error"];
    const ALIGN: [Align; 8] = [
        Align::Left,
        Align::Right,
        Align::Right,
        Align::Left,
        Align::Left,
        Align::Right,
        Align::Left,
        Align::Left,
    ];
    // Each rank's node, found once: a search of every node's ranks for each rank was quadratic.
    let nodes: std::collections::HashMap<u32, &crate::schema::NodeSection> = s
        .nodes
        .iter()
        .flat_map(|n| n.per_node.iter().rev())
        .flat_map(|p| p.ranks.iter().map(move |r| (*r, p)))
        .collect();
    let mark = |r: &RankResult| {
        if s.first_failure == Some(r.rank) && s.ranks.len() > 1 {
            " (first failure)"
        } else if r.collateral {
            " (collateral)"
        } else {
            ""
        }
    };
    let cells = |r: &RankResult| -> Vec<String> {
        let loss = match (r.first_loss, r.final_loss) {
            (None, None) => NONE.to_string(),
            (first, last) => format!("{} → {}", text::loss(first), text::loss(last)),
        };
        let place = match (r.last_phase.as_deref(), r.last_step) {
            (Some(phase), Some(step)) => format!("{} @ {step}", code(phase)),
            (Some(phase), None) => code(phase),
            (None, Some(step)) => format!("step {step}"),
            (None, None) => NONE.to_string(),
        };
        vec![
            format!("{} ({})", text::kind_label(r.outcome), markup::text(&end_status(r))),
            place,
            // No marker at all: how many steps it did is unknown, not 0.
            if r.markers == 0 && r.steps_done == 0 { NONE.to_string() } else { r.steps_done.to_string() },
            loss,
            r.error.as_deref().map_or_else(
                || NONE.to_string(),
                |e| code(&text::truncate(&text::strip_control(e), CELL_MAX)),
            ),
        ]
    };
    let node_cell = |ranks: &[u32]| {
        let mut on: Vec<&crate::schema::NodeSection> =
            ranks.iter().filter_map(|r| nodes.get(r).copied()).collect();
        on.sort_by_key(|p| p.node);
        on.dedup_by_key(|p| p.node);
        match on.as_slice() {
            [] => NONE.to_string(),
            [p] => format!("{} ({})", p.node, code(&p.host)),
            _ => format!("{} nodes", classes::thousands(on.len())),
        }
    };
    let rows: Vec<Vec<String>> = if s.ranks.len() > classes::GROUP_ABOVE {
        classes::group(s.ranks.iter(), |r| (mark(r), cells(r)))
            .into_iter()
            .map(|c| {
                let r = c.first;
                let rank = match (mark(r), c.ranks.as_slice()) {
                    (" (first failure)", _) => format!("**{}** (first failure)", r.rank),
                    (m, [_]) => format!("{}{m}", r.rank),
                    (m, ranks) => format!("{}{m}", classes::who(ranks)),
                };
                let pid = if c.ranks.len() == 1 { opt(r.pid) } else { NONE.to_string() };
                [node_cell(&c.ranks), rank, pid].into_iter().chain(cells(r)).collect()
            })
            .collect()
    } else {
        s.ranks
            .iter()
            .map(|r| {
                let rank = match mark(r) {
                    " (first failure)" => format!("**{}** (first failure)", r.rank),
                    m => format!("{}{m}", r.rank),
                };
                [node_cell(&[r.rank]), rank, opt(r.pid)].into_iter().chain(cells(r)).collect()
            })
            .collect()
    };
    if rows.is_empty() {
        return "No rank was started.".to_string();
    }
    let keep: Vec<usize> =
        (0..HEADER.len()).filter(|&c| (1..4).contains(&c) || rows.iter().any(|r| r[c] != NONE)).collect();
    let header: Vec<&str> = keep.iter().map(|&c| HEADER[c]).collect();
    let align: Vec<Align> = keep.iter().map(|&c| ALIGN[c]).collect();
    let rows: Vec<Vec<String>> =
        rows.into_iter().map(|r| keep.iter().map(|&c| r[c].clone()).collect()).collect();
    markup::table(&header, &align, &rows)
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| NONE.to_string(), |v| v.to_string())
}

/// `SIGSEGV`, `exit 1`, `SIGKILL from ups-doctor`.
fn end_status(r: &RankResult) -> String {
    let status = match (r.signal, r.exit_code) {
        (Some(sig), _) => sig.name(),
        (None, Some(code)) => format!("exit {code}"),
        (None, None) => NONE.to_string(),
    };
    match r.torn_down_with {
        Some(sent) if r.signal == Some(sent) => format!("{sent} from ups-doctor"),
        // Its own end was not seen (a launcher's rank): only what ups-doctor sent is known.
        Some(sent) if r.signal.is_none() && r.exit_code.is_none() => format!("{sent} sent by ups-doctor"),
        Some(sent) => format!("{status} (after {sent} from ups-doctor)"),
        None => status,
    }
}

/// What the table cannot show: hangs, ranks that never spoke, unreadable markers.
fn rank_notes(s: &ScenarioResult) -> Option<String> {
    let mut notes = Vec::new();
    // A program's own ranks have no trainer and may send no markers at all: their silence is
    // judged by output too, and said once in the command line.
    let foreign = s.external.is_some();
    // A launcher's ranks of which no process was ever found did not hang: they never started.
    let unstarted: Vec<u32> = s
        .ranks
        .iter()
        .filter(|r| foreign && r.pid.is_none() && r.hang_detected_after_s.is_some())
        .map(|r| r.rank)
        .collect();
    if let Some(silent) =
        s.ranks.iter().find_map(|r| r.hang_detected_after_s).filter(|_| !unstarted.is_empty())
    {
        notes.push(format!(
            "{} {} never started: no process of {} was found under the launcher before the run was called hung, \
             after {} without a word.",
            if unstarted.len() == 1 { "Rank" } else { "Ranks" },
            crate::diagnose::words::ranks_text(&unstarted),
            if unstarted.len() == 1 { "it" } else { "them" },
            text::secs(silent)
        ));
    }
    // Each rank's notes with `\u{1}` for its name, said once per class below.
    let mut each: Vec<(u32, String)> = Vec::new();
    for r in s.ranks.iter().filter(|r| !unstarted.contains(&r.rank)) {
        let mut note = |n: String| each.push((r.rank, n));
        if let Some(silent) = r.hang_detected_after_s {
            // The last marker only where it is before the hang was declared (see
            // `text::hang_declared_at`): a later one would contradict the silence.
            let last = r
                .last_marker_at_s
                .filter(|_| text::hang_declared_at(r, s.wall_s).is_some())
                .map(|t| format!(" (last marker at {})", text::secs(t)))
                .unwrap_or_default();
            let output = if foreign { " and wrote no output" } else { "" };
            note(format!(
                "\u{1} sent no marker{output} for {}{last} and was declared hung.",
                text::secs(silent)
            ));
        }
        if !foreign && r.markers == 0 && r.outcome != crate::scenario::OutcomeKind::Passed {
            note(
                "\u{1} sent no marker at all: it ended before the trainer started (see its log tail)."
                    .to_string(),
            );
        }
        if r.bad_markers > 0 {
            note(format!(
                "\u{1}: {} on the marker pipe {} not valid markers (of {}).",
                plural(r.bad_markers as usize, "line"),
                if r.bad_markers == 1 { "was" } else { "were" },
                r.markers + r.bad_markers
            ));
        }
        if r.dropped_markers > 0 {
            note(format!(
                "\u{1}: {} dropped unread: they came faster than ups-doctor could take them in \
                 (its marker queue is bounded); the counts and the timeline miss them.",
                plural(r.dropped_markers as usize, "marker"),
            ));
        }
        for error in &r.log_errors {
            note(format!(
                "\u{1}: {}; the log ends with a note where it was cut, and its last lines are above.",
                markup::text(error)
            ));
        }
        for pid in &r.foreign_pids {
            note(format!(
                "\u{1}: a marker claimed process {pid} as its data-loader worker, but it is not a \
                 process of this run (no run id, another process group, or a recycled pid); it was \
                 not signalled."
            ));
        }
    }
    notes.extend(named_notes(each, s.ranks.len() > classes::GROUP_ABOVE));
    (!notes.is_empty()).then(|| bullets(notes.into_iter()))
}

/// Notes with `\u{1}` for the rank they are about, named: `Rank 3`; grouped, the ranks with the
/// same note are one (`Ranks 0–1776, 1778–4095 (4,095 ranks) each sent no marker …`), in the order
/// of their first rank.
fn named_notes(each: Vec<(u32, String)>, grouped: bool) -> Vec<String> {
    if !grouped {
        return each.into_iter().map(|(r, n)| n.replace('\u{1}', &format!("Rank {r}"))).collect();
    }
    let mut classes: Vec<(String, Vec<u32>)> = Vec::new();
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (r, n) in each {
        let i = *index.entry(n.clone()).or_insert_with(|| {
            classes.push((n, Vec::new()));
            classes.len() - 1
        });
        classes[i].1.push(r);
    }
    classes
        .into_iter()
        .map(|(n, ranks)| {
            let name = match ranks.as_slice() {
                [one] => format!("Rank {one}"),
                _ => format!("R{} each", &classes::who(&ranks)[1..]),
            };
            n.replace('\u{1}', &name)
        })
        .collect()
}

fn speed_line(s: &ScenarioResult) -> String {
    let mut parts = Vec::new();
    if let Some(v) = s.steps_per_s {
        parts.push(format!("{v:.2} steps/s"));
    }
    if let Some(v) = s.samples_per_s {
        parts.push(format!("{v:.1} samples/s"));
    }
    parts.push(format!("wall time {}", text::secs(s.wall_s)));
    let waits: Vec<String> = if s.ranks.len() > classes::GROUP_ABOVE {
        // One entry per share, with the ranks that had it.
        classes::group(s.ranks.iter().filter(|r| r.data_wait_fraction.is_some()), |r| {
            text::percent(r.data_wait_fraction.unwrap_or_default())
        })
        .into_iter()
        .take(classes::CLASSES_SHOWN)
        .map(|c| {
            format!(
                "{} ({})",
                text::percent(c.first.data_wait_fraction.unwrap_or_default()),
                classes::who(&c.ranks)
            )
        })
        .collect()
    } else {
        s.ranks
            .iter()
            .filter_map(|r| r.data_wait_fraction.map(|f| (r.rank, f)))
            .map(|(rank, f)| {
                if s.ranks.len() == 1 {
                    text::percent(f)
                } else {
                    format!("{} (rank {rank})", text::percent(f))
                }
            })
            .collect()
    };
    if !waits.is_empty() {
        parts.push(format!("waiting for data {} of step time", waits.join(", ")));
    }
    if let Some(waited) = collective_time(s) {
        parts.push(waited);
    }
    format!("**Speed:** {}", parts.join(" · "))
}

/// Each rank's time in collectives over the whole run, as its observer timed them (in steps and
/// between them), where more than one rank timed any: what "two GPUs, no speed-up" asks first,
/// how long each rank waited for the others. Over 8 ranks, the least, the median and the most.
fn collective_time(s: &ScenarioResult) -> Option<String> {
    let mut each: Vec<(u32, f64)> =
        s.ranks.iter().filter_map(|r| Some((r.rank, r.observed.as_ref()?.collective_total_ms))).collect();
    if each.len() < 2 || each.iter().all(|(_, ms)| *ms <= 0.0) {
        return None;
    }
    let secs = |ms: f64| text::secs(ms / 1000.0);
    let text = if each.len() <= 8 {
        each.iter().map(|(rank, ms)| format!("rank {rank} {}", secs(*ms))).collect::<Vec<_>>().join(", ")
    } else {
        each.sort_by(|a, b| a.1.total_cmp(&b.1));
        let (least, most) = (each[0], each[each.len() - 1]);
        format!(
            "least {} (rank {}), median {}, most {} (rank {})",
            secs(least.1),
            least.0,
            secs(each[each.len() / 2].1),
            secs(most.1),
            most.0
        )
    };
    Some(format!("in collectives over the whole run: {text}"))
}

/// Multi-rank runs: whether the ranks ended with the same parameters, and the optimizer state
/// each held (FSDP shards it, so it is about 1/world of DDP's).
fn parameters_line(s: &ScenarioResult) -> Option<String> {
    let mut parts = Vec::new();
    let sums: Vec<(u32, &str)> =
        s.ranks.iter().filter_map(|r| r.params_checksum.as_deref().map(|c| (r.rank, c))).collect();
    if s.ranks.len() > 1 && sums.len() == s.ranks.len() {
        if sums.iter().all(|(_, c)| *c == sums[0].1) {
            parts.push(format!("identical on all {} ranks (checksum `{}`)", s.ranks.len(), sums[0].1));
        } else {
            let each: Vec<(u32, String)> = sums.iter().map(|(r, c)| (*r, format!("`{c}`"))).collect();
            parts
                .push(format!("**differ across ranks**: {}", crate::diagnose::words::each_rank(&each, ", ")));
        }
    }
    let states: Vec<(u32, u64)> =
        s.ranks.iter().filter_map(|r| r.optimizer_state_bytes.map(|b| (r.rank, b))).collect();
    if !states.is_empty() {
        let first = states[0].1;
        let state = if states.iter().all(|(_, b)| *b == first) {
            let per = if s.ranks.len() > 1 { " per rank" } else { "" };
            format!("optimizer state {}{per}", human_bytes(first))
        } else {
            let each: Vec<String> =
                states.iter().map(|(r, b)| format!("{} (rank {r})", human_bytes(*b))).collect();
            format!("optimizer state {}", each.join(", "))
        };
        parts.push(state);
    }
    (!parts.is_empty()).then(|| format!("**Parameters:** {}", parts.join(" · ")))
}

fn backtrace(doc: &mut Doc, r: &RankResult, ranks: &[u32]) {
    if r.backtrace.is_empty() && r.raw_backtrace.is_empty() {
        return;
    }
    let (owner, signal) = stack::backtrace_owner(r);
    doc.push(format!("### Backtrace of {} ({})", markup::text(&owner), markup::text(&signal)));
    if ranks.len() > 1 {
        doc.push(format!("The same frames on {}.", classes::who(ranks)));
    }
    if r.backtrace.is_empty() {
        doc.push(
            "Symbolisation failed in the crash handler; these are the raw return addresses, \
             innermost first:",
        );
        let lines: Vec<String> = r.raw_backtrace.iter().map(|a| a.trim().to_string()).collect();
        doc.push(fence("text", &numbered(lines)));
    } else {
        doc.push(fence("text", &frames(&r.backtrace)));
    }
}

/// `#0  symbol  (location)`, one frame per line, demangled, the machinery every stack shares
/// folded ([`stack::lines`]); `result.json` keeps every frame.
fn frames(frames: &[Frame]) -> String {
    stack::lines(frames).iter().map(|l| text::strip_control(l)).collect::<Vec<_>>().join("\n")
}

fn numbered(lines: Vec<String>) -> String {
    let width = lines.len().saturating_sub(1).to_string().len();
    lines
        .iter()
        .enumerate()
        .map(|(i, l)| format!("#{i:<width$}  {}", text::strip_control(l)))
        .collect::<Vec<_>>()
        .join("\n")
}

fn stacks(doc: &mut Doc, r: &RankResult, ranks: &[u32]) {
    if r.stacks.is_empty() {
        return;
    }
    doc.push(format!("### Stacks of {} at the hang", classes::who(ranks)));
    shown_for(doc, r, ranks);
    doc.push(format!(
        "{} dumped when the hang was declared, innermost frame first:",
        count(r.stacks.len(), "thread", "threads")
    ));
    for t in &r.stacks {
        doc.push(details_open(&stack_summary(t)));
        doc.push(if t.frames.is_empty() {
            "No frames were captured for this thread.".to_string()
        } else {
            fence("text", &frames(&t.frames))
        });
        doc.push(DETAILS_CLOSE);
    }
}

/// `thread main (tid 7): top frame`, and when the top frame is a wait in libc or std, the first
/// frame of the caller's own code, which is what tells two waiting threads apart.
fn stack_summary(t: &ThreadStack) -> String {
    let name = if t.thread.is_empty() { "(unnamed)" } else { &t.thread };
    let shown = |f: &Frame| {
        let what = f.symbol.as_deref().map_or_else(|| f.addr.clone(), stack::demangle);
        html_code(&text::truncate(&what, SUMMARY_MAX))
    };
    let top = match t.frames.first() {
        None => "no frames".to_string(),
        Some(first) if is_runtime_frame(first) => {
            match t.frames.iter().skip(1).find(|f| !is_runtime_frame(f)) {
                Some(own) => format!("{} from {}", shown(first), shown(own)),
                None => shown(first),
            }
        }
        Some(first) => shown(first),
    };
    format!("thread {} (tid {}): {top}", html_code(name), t.tid)
}

/// A frame of libc, the Rust standard library or a lock implementation rather than of the code
/// that called it. Frames without a symbol count as runtime frames.
fn is_runtime_frame(f: &Frame) -> bool {
    const PREFIXES: [&str; 16] = [
        "__",
        "std::",
        "core::",
        "alloc::",
        "<std::",
        "<core::",
        "<alloc::",
        "parking_lot",
        "pthread_",
        "syscall",
        "futex",
        "epoll_",
        "poll",
        "nanosleep",
        "clock_nanosleep",
        "sem_",
    ];
    f.symbol.as_deref().is_none_or(|s| PREFIXES.iter().any(|p| s.starts_with(p)))
}

fn log_tail(doc: &mut Doc, r: &RankResult, ranks: &[u32]) {
    if r.log_tail.is_empty() {
        return;
    }
    doc.push(details_open(&format!(
        "Log tail of {} ({})",
        classes::who(ranks),
        count(r.log_tail.len(), "line", "lines")
    )));
    shown_for(doc, r, ranks);
    let files: Vec<String> =
        [&r.stderr_log, &r.stdout_log].into_iter().filter(|f| !f.is_empty()).map(|f| code(f)).collect();
    if !files.is_empty() {
        doc.push(format!("Full logs: {}", files.join(", ")));
    }
    let lines: Vec<String> = r.log_tail.iter().map(|l| text::strip_control(l)).collect();
    doc.push(fence("text", &once(&lines).join("\n")));
    doc.push(DETAILS_CLOSE);
}

/// `lines` with each run of identical lines written once, with how often it came
/// (`… [the line above, 3 times in all]`): several workers print the same sentence as they die.
fn once(lines: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(lines.len());
    let mut i = 0;
    while i < lines.len() {
        let n = lines[i..].iter().take_while(|l| **l == lines[i]).count();
        out.push(lines[i].clone());
        if n > 1 && !lines[i].trim().is_empty() {
            out.push(format!("… [the line above, {n} times in all]"));
        } else {
            out.extend(lines[i + 1..i + n].iter().cloned());
        }
        i += n;
    }
    out
}

fn scenario_details(doc: &mut Doc, s: &ScenarioResult) {
    let rerun = text::rerun_command(s);
    doc.push(details_open(&format!("Scenario {} (re-run with {})", html_code(&s.name), html_code(&rerun))));
    if !s.scenario.description.trim().is_empty() {
        doc.push(format!("> {}", one_line(&markup::text(&s.scenario.description))));
    }
    if s.file == crate::scenario::COMMAND_LINE {
        doc.push(
            "Re-run it from this report's folder: `scenario.json` there is the command as a scenario \
             (options and `--set` applied):",
        );
    } else {
        doc.push("Re-run it from the same checkout:");
    }
    doc.push(fence("sh", &rerun));
    doc.push(
        "Or save the resolved scenario below (overrides applied) as a `.json` file and pass it \
         to `ups-doctor run`:",
    );
    // A command's scenario without the built-in trainer's fields, which it never used.
    doc.push(fence("json", &s.scenario.file_json()));
    doc.push(DETAILS_CLOSE);
}

/// `ups-doctor env --markdown`: the report's `## Environment` section on its own, to paste into
/// an issue.
pub fn render_env_markdown(env: &EnvSummary) -> String {
    let mut doc = Doc { blocks: Vec::new() };
    environment_section(&mut doc, env, None);
    doc.finish()
}

/// The Python and PyTorch a user's program ran, as the observer read them inside its first rank
/// that reported them.
fn program_torch<'r>(
    mut scenarios: impl Iterator<Item = &'r crate::schema::ScenarioResult>,
) -> Option<&'r crate::schema::TorchFacts> {
    scenarios.find_map(|s| s.ranks.iter().find_map(|r| r.observed.as_ref().and_then(|o| o.torch.as_ref())))
}

/// `ups-doctor env`'s facts; a user's program's own Python and PyTorch first, where the observer
/// read them (the bundled libtorch is only the built-in trainer's).
fn environment_section(doc: &mut Doc, env: &EnvSummary, program: Option<&crate::schema::TorchFacts>) {
    doc.push("## Environment");
    if let Some(t) = program {
        let mut facts = vec![
            format!("Python {} ({})", markup::text(&t.python), code(&t.executable)),
            format!("torch {}", code(&t.version)),
            match &t.cuda {
                Some(c) => format!("built with CUDA {}", markup::text(c)),
                None => "a CPU build (no CUDA)".to_string(),
            },
        ];
        if let Some(n) = &t.nccl {
            facts.push(format!("NCCL {}", markup::text(n)));
        }
        if let Some(m) = env.python.as_ref().and_then(|p| p.start_method.as_ref()) {
            facts.push(format!("start method {}", markup::text(m)));
        }
        doc.push(format!("**Your program ran:** {}.", facts.join(" · ")));
    }
    let line: Vec<String> = environment::headline(env).iter().map(|p| markup::text(p)).collect();
    doc.push(line.join(" · "));
    doc.push(details_open("Full environment"));
    let rows: Vec<Vec<String>> = environment::rows(env)
        .into_iter()
        .map(|(label, value)| {
            vec![markup::text(label), value.as_deref().map_or_else(|| NONE.to_string(), code)]
        })
        .collect();
    doc.push(markup::table(&["what", "value"], &[Align::Left, Align::Left], &rows));
    if env.variables.is_empty() {
        let families: Vec<String> = environment::VARIABLE_FAMILIES.split(", ").map(code).collect();
        doc.push(format!("No {} variable was set.", families.join(", ")));
    } else {
        let rows: Vec<Vec<String>> = env.variables.iter().map(|(k, v)| vec![code(k), code(v)]).collect();
        doc.push(markup::table(&["variable", "value"], &[Align::Left, Align::Left], &rows));
    }
    doc.push(DETAILS_CLOSE);
}

#[cfg(test)]
mod startup_frames {
    use super::*;

    fn frame(symbol: &str) -> Frame {
        Frame { addr: "0x1".into(), symbol: Some(symbol.into()), location: None }
    }

    #[test]
    fn main_thread_start_up_is_folded_after_the_programs_main() {
        let fs: Vec<Frame> = [
            "inject_segv",
            "train",
            "ups_doctor::main",
            "core::ops::function::FnOnce::call_once",
            "main",
            "_start",
        ]
        .map(frame)
        .to_vec();
        let text = frames(&fs);
        assert!(text.contains("#2  ups_doctor::main"), "{text}");
        assert!(!text.contains("_start") && !text.contains("call_once"), "{text}");
        assert!(text.ends_with("…   3 frames of the runtime (call shims, catch_unwind, start-up)"), "{text}");
    }

    #[test]
    fn spawned_thread_start_up_is_folded_at_begin_short_backtrace() {
        let fs: Vec<Frame> = [
            "futex_wait",
            "inject_hang::{{closure}}",
            "std::sys::backtrace::__rust_begin_short_backtrace",
            "start_thread",
            "clone3",
        ]
        .map(frame)
        .to_vec();
        let text = frames(&fs);
        assert!(text.contains("#1  inject_hang::{{closure}}") && !text.contains("clone3"), "{text}");
    }

    #[test]
    fn a_repeated_log_line_is_written_once_with_its_count() {
        let lines: Vec<String> = ["a", "shm!", "shm!", "shm!", "", "", "b"].map(String::from).to_vec();
        assert_eq!(once(&lines), ["a", "shm!", "… [the line above, 3 times in all]", "", "", "b"]);
    }

    #[test]
    fn a_backtrace_without_start_up_frames_is_kept_whole() {
        let fs: Vec<Frame> = ["a", "b"].map(frame).to_vec();
        assert_eq!(frames(&fs), "#0  a\n#1  b");
    }
}
