//! The parts of a scenario's section that only multi-node runs have: the nodes with their hosts
//! and clocks, where the first failure was, what each node saw and did about a failure elsewhere
//! (look before kill), and each node's own memory, `/dev/shm` and GPU evidence.

use crate::diagnose::words::{ms, ranks_text};
use crate::nodes::{NodeSection, NodesReport};
use crate::schema::ScenarioResult;

use super::super::markup::{self, Align, code};
use super::super::text::{NONE, secs};
use super::super::{gpu, memory};
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
    for node in &n.per_node {
        lines.extend(what_it_saw(node));
    }
    doc.push(lines.into_iter().map(|l| format!("- {l}")).collect::<Vec<_>>().join("\n"));
}

fn table(n: &NodesReport) -> String {
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
    let rows: Vec<Vec<String>> = n
        .per_node
        .iter()
        .map(|s| {
            let clock = match (s.node, &s.clock) {
                (0, _) => "— (the timeline)".to_string(),
                (_, Some(c)) => format!("{} ± {}", signed_ms(c.start.offset_ms), ms(c.uncertainty_ms())),
                (_, None) => NONE.to_string(),
            };
            let drift = s
                .clock
                .and_then(|c| c.drift_ms())
                .filter(|_| s.node != 0)
                .map_or(NONE.to_string(), signed_ms);
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
        })
        .collect();
    markup::table(&header, &align, &rows)
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
    for node in &n.per_node {
        doc.push(format!("### Node {} ({}): memory, `/dev/shm`, GPU", node.node, code(&node.host)));
        if node.lost.is_some() {
            doc.push("Lost before it sent its evidence.".to_string());
            continue;
        }
        if let Some(dir) = &node.out_dir {
            doc.push(format!("Its own logs and view of the run: {} on {}.", code(dir), code(&node.host)));
        }
        let mut one = s.clone();
        one.nodes = None;
        one.memory = node.memory.clone().map(|mut m| {
            // The chart draws one line per rank of the whole run; a node's own is in its folder.
            m.series.clear();
            m
        });
        one.leftovers = node.leftovers.clone();
        one.gpu = node.gpu.clone();
        one.ranks.retain(|r| node.ranks.contains(&r.rank));
        for block in gpu::gpu_blocks(&one)
            .into_iter()
            .chain(memory::memory_blocks(&one))
            .chain(memory::leftover_blocks(&one))
        {
            doc.push(block);
        }
    }
}
