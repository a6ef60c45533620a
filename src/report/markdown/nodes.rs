//! The parts of a scenario's section that only multi-node runs have: the nodes with their hosts
//! and clocks, where the first failure was, what each node saw and did about a failure elsewhere
//! (look before kill), and each node's own memory, `/dev/shm` and GPU evidence.

use crate::diagnose::words::{ms, rank_ranges, ranks_text};
use crate::nodes::{NodeSection, NodesReport};
use crate::schema::ScenarioResult;

use super::super::markup::{self, Align, code};
use super::super::text::{NONE, secs};
use super::super::{gpu, memory};
use super::classes::GROUP_ABOVE;
use super::doc::Doc;

/// `### Nodes`: one row per node, then the first failure across nodes and what each node saw.
pub(super) fn overview(doc: &mut Doc, s: &ScenarioResult) {
    let Some(n) = &s.nodes else { return };
    doc.push("### Nodes".to_string());
    if n.attached {
        doc.push(format!(
            "{} nodes, `ups-doctor attach` on each to the job already running there; ranks as the job's own `RANK` \
             variables number them; coordinator (node 0) at {}. A node's window start is on node 0's clock, placed \
             through its calibrated offset (± half the shortest round trip).",
            n.nodes,
            code(&n.coordinator)
        ));
    } else {
        doc.push(format!(
        "{} nodes × {} ranks; global rank = node × {} + local rank; coordinator (node 0) at {}. Times are on node 0's \
         clock, each node's placed through its calibrated offset (± half the shortest round trip).",
            n.nodes,
            n.ranks_per_node,
            n.ranks_per_node,
            code(&n.coordinator)
        ));
    }
    doc.push(table(n));
    let mut lines = Vec::new();
    if let Some(f) = &n.first_failure {
        lines.push(format!(
            "**First failure across nodes:** node {}, rank {} (local rank {}) on host {}{}.",
            f.node,
            f.rank,
            f.local_rank,
            code(&f.host),
            f.at_s.map(|t| format!(", at {} ± {}", secs(t), ms(f.uncertainty_ms))).unwrap_or_default()
        ));
    }
    if let Some(note) = &n.order_note {
        lines.push(format!("**Order:** {}.", markup::text(note)));
    }
    if n.per_node.len() > GROUP_ABOVE {
        lines.extend(saw_grouped(&n.per_node));
    } else {
        for node in &n.per_node {
            lines.extend(what_it_saw(node));
        }
    }
    doc.push(lines.into_iter().map(|l| format!("- {l}")).collect::<Vec<_>>().join("\n"));
}

/// [`what_it_saw`] of many nodes: nodes whose lines say the same but for the node's number, its
/// host and its ranks are one line (`Nodes 1–93, 95–511 (510 nodes) each learnt at …`).
fn saw_grouped(nodes: &[NodeSection]) -> Vec<String> {
    let mut classes: Vec<(String, Vec<&NodeSection>)> = Vec::new();
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for node in nodes {
        for line in what_it_saw(node) {
            let key = key_of(&line, node);
            let i = *index.entry(key.clone()).or_insert_with(|| {
                classes.push((key, Vec::new()));
                classes.len() - 1
            });
            classes[i].1.push(node);
        }
    }
    classes
        .into_iter()
        .map(|(key, on)| match on.as_slice() {
            [one] => what_it_saw(one).into_iter().find(|l| key_of(l, one) == key).unwrap_or(key),
            _ => {
                let numbers: Vec<u32> = on.iter().map(|s| s.node).collect();
                key.replace(
                    '\u{1}',
                    &format!("Nodes {} ({} nodes) each", rank_ranges(&numbers), numbers.len()),
                )
            }
        })
        .collect()
}

fn key_of(line: &str, node: &NodeSection) -> String {
    line.replacen(&format!("Node {} ({})", node.node, code(&node.host)), "\u{1}", 1)
        .replacen(&format!("Node {}", node.node), "\u{1}", 1)
        .replace(&ranks_named(&node.ranks), "its ranks")
}

/// One row per node; above [`GROUP_ABOVE`] nodes, node 0, the first failure's node and every
/// lost node have their own rows and the others one row per verdict of their own (a table of 512
/// rows alone is longer than a GitHub comment).
fn table(n: &NodesReport) -> String {
    if n.per_node.len() <= GROUP_ABOVE {
        return table_of(n, &n.per_node.iter().map(|s| vec![s]).collect::<Vec<_>>());
    }
    let own = |s: &NodeSection| {
        s.node == 0 || s.lost.is_some() || n.first_failure.as_ref().is_some_and(|f| f.node == s.node)
    };
    let mut rows: Vec<Vec<&NodeSection>> = Vec::new();
    let mut index: std::collections::HashMap<Option<&str>, usize> = std::collections::HashMap::new();
    for s in &n.per_node {
        if own(s) {
            rows.push(vec![s]);
            continue;
        }
        let i = *index.entry(s.own_headline.as_deref()).or_insert_with(|| {
            rows.push(Vec::new());
            rows.len() - 1
        });
        rows[i].push(s);
    }
    table_of(n, &rows)
}

/// The table with one row per group of nodes (most groups are one node).
fn table_of(n: &NodesReport, groups: &[Vec<&NodeSection>]) -> String {
    let header = [
        "node",
        "host",
        "ranks",
        "clock offset to node 0",
        "drift",
        if n.attached { "window from" } else { "started" },
        if n.attached { "its own verdict" } else { "its own verdict (local rank numbers)" },
    ];
    let align = [Align::Right, Align::Left, Align::Left, Align::Left, Align::Left, Align::Left, Align::Left];
    let rows: Vec<Vec<String>> = groups
        .iter()
        .map(|g| match g.as_slice() {
            [s] => row(s),
            _ => grouped_row(g),
        })
        .collect();
    markup::table(&header, &align, &rows)
}

/// The row of several nodes that said the same of themselves: their numbers, hosts and ranks as
/// ranges, the span of their clock offsets and start times.
fn grouped_row(g: &[&NodeSection]) -> Vec<String> {
    let numbers: Vec<u32> = g.iter().map(|s| s.node).collect();
    let ranks: Vec<u32> = g.iter().flat_map(|s| s.ranks.iter().copied()).collect();
    let span = |v: Vec<f64>, each: &dyn Fn(f64) -> String| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if v.is_empty() {
            NONE.to_string()
        } else if lo == hi {
            each(lo)
        } else {
            format!("{} … {}", each(lo), each(hi))
        }
    };
    let offsets: Vec<f64> = g.iter().filter_map(|s| s.clock).map(|c| c.start.offset_ms).collect();
    let most_uncertain = g.iter().filter_map(|s| s.clock).map(|c| c.uncertainty_ms()).fold(0.0, f64::max);
    let drifts: Vec<f64> = g.iter().filter_map(|s| s.clock.and_then(|c| c.drift_ms())).collect();
    let starts: Vec<f64> = g.iter().filter_map(|s| s.started_at_s).collect();
    let verdict = g[0].own_headline.as_deref().map_or(NONE.to_string(), |h| markup::harness(h, &[], 300));
    vec![
        format!("{} ({} nodes)", rank_ranges(&numbers), numbers.len()),
        format!("{} … {}", code(&g[0].host), code(&g[g.len() - 1].host)),
        ranks_text(&ranks),
        format!("{} ± {} at most", span(offsets, &signed_ms), ms(most_uncertain)),
        span(drifts, &signed_ms),
        span(starts, &secs),
        verdict,
    ]
}

/// One node's row.
fn row(s: &NodeSection) -> Vec<String> {
    let clock = match (s.node, &s.clock) {
        (0, _) => "— (the timeline)".to_string(),
        (_, Some(c)) => format!("{} ± {}", signed_ms(c.start.offset_ms), ms(c.uncertainty_ms())),
        (_, None) => NONE.to_string(),
    };
    let drift =
        s.clock.and_then(|c| c.drift_ms()).filter(|_| s.node != 0).map_or(NONE.to_string(), signed_ms);
    let verdict = match (&s.lost, &s.own_headline) {
        (Some(l), _) => format!("**lost** at {}: {}", secs(l.at_s), markup::text(&l.how)),
        // Harness-written, like every verdict: its code spans are kept, the rest escaped
        // (escaping it whole showed the backticks literally).
        (None, Some(h)) => markup::harness(h, &[], 300),
        (None, None) => NONE.to_string(),
    };
    vec![
        s.node.to_string(),
        code(&s.host),
        ranks_text(&s.ranks),
        clock,
        drift,
        s.started_at_s.map_or(NONE.to_string(), secs),
        verdict,
    ]
}

/// `rank 2`, `ranks 0–1`.
fn ranks_named(ranks: &[u32]) -> String {
    format!("{} {}", if ranks.len() == 1 { "rank" } else { "ranks" }, ranks_text(ranks))
}

fn signed_ms(v: f64) -> String {
    format!("{}{}", if v >= 0.0 { "+" } else { "−" }, ms(v.abs()))
}

/// What one node knew of the first failure and what it did before teardown.
fn what_it_saw(s: &NodeSection) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(l) = &s.lost {
        let steps = if l.last_steps.is_empty() {
            String::new()
        } else {
            let each: Vec<String> =
                l.last_steps.iter().map(|(r, st)| format!("rank {r} at step {st}")).collect();
            format!("; last heard: {}", each.join(", "))
        };
        lines.push(format!(
            "Node {} ({}) lost at {}: {}; its ranks {} were not observed to their end{steps}.",
            s.node,
            code(&s.host),
            secs(l.at_s),
            markup::text(&l.how),
            ranks_text(&s.ranks)
        ));
    }
    if let Some(f) = &s.remote_failure {
        let asked = if f.stacks_requested.is_empty() {
            "none of its ranks was still running to be asked for stacks".to_string()
        } else {
            format!("stacks asked of {}", ranks_named(&f.stacks_requested))
        };
        let torn = f.torn_down_at_s.map_or_else(
            || "; its ranks ended on their own".to_string(),
            |t| format!("; teardown (SIGTERM) at {}", secs(t)),
        );
        lines.push(format!(
            "Node {} learnt at {} that {}: {asked}{torn}.",
            s.node,
            secs(f.known_at_s),
            markup::text(&f.what)
        ));
    }
    if let Some(snap) = &s.snapshot
        && !snap.ranks.is_empty()
    {
        lines.push(format!(
            "Node {} looked at its running {} at {}, before any teardown (threads below, under \"What rank N was doing\").",
            s.node,
            ranks_named(&snap.ranks),
            secs(snap.at_s)
        ));
    }
    lines
}

/// Each node's own memory, `/dev/shm`, leftovers and GPU sections.
pub(super) fn per_node_evidence(doc: &mut Doc, s: &ScenarioResult) {
    let Some(n) = &s.nodes else { return };
    // Above GROUP_ABOVE nodes, node 0's, the first failure's node's and each lost node's: 512
    // sections of memory tables alone are longer than a GitHub comment.
    let shown = |node: &NodeSection| {
        n.per_node.len() <= GROUP_ABOVE
            || node.node == 0
            || node.lost.is_some()
            || n.first_failure.as_ref().is_some_and(|f| f.node == node.node)
    };
    // The scenario without its ranks, cloned once: cloning it whole for each node was quadratic
    // in the ranks (512 clones of 4,096 ranks).
    let bare = ScenarioResult { ranks: Vec::new(), nodes: None, ..s.clone() };
    let left = n.per_node.iter().filter(|node| !shown(node)).count();
    for node in n.per_node.iter().filter(|node| shown(node)) {
        doc.push(format!("### Node {} ({}): memory, `/dev/shm`, GPU", node.node, code(&node.host)));
        if node.lost.is_some() {
            doc.push("Lost before it sent its evidence.".to_string());
            continue;
        }
        if let Some(dir) = &node.out_dir {
            doc.push(format!("Its own logs and view of the run: {} on {}.", code(dir), code(&node.host)));
        }
        let mut one = bare.clone();
        one.memory = node.memory.clone().map(|mut m| {
            // The chart draws one line per rank of the whole run; a node's own is in its folder.
            m.series.clear();
            m
        });
        one.leftovers = node.leftovers.clone();
        one.gpu = node.gpu.clone();
        one.ranks = s.ranks.iter().filter(|r| node.ranks.contains(&r.rank)).cloned().collect();
        for block in gpu::gpu_blocks(&one)
            .into_iter()
            .chain(memory::memory_blocks(&one))
            .chain(memory::leftover_blocks(&one))
        {
            doc.push(block);
        }
    }
    if left > 0 {
        doc.push(format!(
            "The memory, `/dev/shm` and GPU evidence of the other {left} nodes is in `result.json` \
             (`nodes.per_node`) and in each node's own folder."
        ));
    }
}
