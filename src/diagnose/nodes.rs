//! What the judge reads of a run merged from several nodes (its [`NodesReport`]): each node's
//! clock uncertainty, which node ran which ranks, and which nodes were lost. Two deaths on
//! different nodes closer than their clocks can tell apart are ordered by causal evidence (a rank
//! that lost its peer, or that ups-doctor tore down, followed the other), else named by timestamp
//! only and said to be so; a lost node's ranks were not observed to their end. Pure.

use crate::scenario::OutcomeKind;
use crate::schema::{FirstFailure, NodesReport, RankResult};

use super::catalog;
use super::evidence::{Evidence, Observed, failure_time};
use super::verdict::{Judgement, judge};
use super::words::{ms, ranks_text};

/// A part of the run whose ranks were not observed to their end.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Unobserved {
    /// `Node 1 (host) lost at 3.2 s (…): its ranks 2–3 were not observed to their end`.
    pub line: String,
    /// What the expectation check names (`node 1`).
    pub part: String,
}

/// Where a rank ran and how well its node's clock is known.
pub(super) struct Clocks<'a> {
    report: &'a NodesReport,
    /// Each rank's node, read once: looking it up in every node's list for every rank was
    /// quadratic in the ranks (4,096 ranks on 512 nodes).
    node_by_rank: std::collections::HashMap<u32, u32>,
}

impl<'a> Clocks<'a> {
    /// The clocks of a run merged from several nodes; `None` for one node's run and for an
    /// attach (whose nodes' windows are not ordered against each other).
    pub(super) fn of(report: Option<&'a NodesReport>) -> Option<Clocks<'a>> {
        report.filter(|n| !n.attached).map(|report| Clocks {
            report,
            // Reversed: where two nodes claim a rank, the first one's claim is the one kept.
            node_by_rank: report
                .per_node
                .iter()
                .rev()
                .flat_map(|s| s.ranks.iter().map(|r| (*r, s.node)))
                .collect(),
        })
    }

    fn node_of(&self, rank: u32) -> u32 {
        let lw = self.report.ranks_per_node.max(1);
        self.node_by_rank.get(&rank).copied().unwrap_or(rank / lw)
    }

    fn host_of(&self, node: u32) -> String {
        self.report.per_node.iter().find(|s| s.node == node).map_or_else(String::new, |s| s.host.clone())
    }

    /// Its clock against the coordinator's, milliseconds (node 0 is the timeline: 0).
    fn uncertainty_ms(&self, node: u32) -> f64 {
        self.report
            .per_node
            .iter()
            .find(|s| s.node == node && s.lost.is_none())
            .and_then(|s| s.clock)
            .map_or(0.0, |c| c.uncertainty_ms())
    }

    fn first_rank_of(&self, node: u32) -> u32 {
        let lw = self.report.ranks_per_node;
        self.report
            .per_node
            .iter()
            .find(|s| s.node == node)
            .and_then(|s| s.ranks.first().copied())
            .unwrap_or(node * lw)
    }

    /// The parts of the run not observed to their end: each lost node, with the line that says so.
    pub(super) fn unobserved(&self) -> Vec<Unobserved> {
        self.report
            .per_node
            .iter()
            .filter_map(|s| {
                let lost = s.lost.as_ref()?;
                Some(Unobserved {
                    line: format!(
                        "Node {} ({}) lost at {:.1} s ({}): its ranks {} were not observed to their end",
                        s.node,
                        s.host,
                        lost.at_s,
                        lost.how,
                        ranks_text(&s.ranks)
                    ),
                    part: format!("node {}", s.node),
                })
            })
            .collect()
    }

    /// Where the first failure was: its node, host, local rank, time and the clock's uncertainty.
    pub(super) fn first_failure(&self, f: &RankResult) -> FirstFailure {
        let node = self.node_of(f.rank);
        FirstFailure {
            node,
            host: self.host_of(node),
            rank: f.rank,
            local_rank: f.rank - self.first_rank_of(node),
            at_s: Some(failure_time(f)).filter(|t| t.is_finite()),
            uncertainty_ms: self.uncertainty_ms(node),
        }
    }

    /// When a node's ranks are not node × ranks per node, the line that says where they were.
    pub(super) fn placement_note(&self) -> Option<String> {
        let lw = self.report.ranks_per_node;
        let sections = &self.report.per_node;
        if sections.iter().all(|s| s.ranks.first() == Some(&(s.node * lw))) {
            return None;
        }
        let placed: Vec<String> = sections
            .iter()
            .map(|s| format!("node {} ({}) ran ranks {}", s.node, s.host, ranks_text(&s.ranks)))
            .collect();
        Some(format!(
            "The launcher numbered the nodes its own way: {} (torchrun's `c10d` rendezvous orders nodes by host and agent pid, Ray Train its workers' nodes in an order of its own, neither by `--node-rank`; ups-doctor followed the ranks' `RANK` and `LOCAL_RANK`)",
            placed.join(", ")
        ))
    }

    /// The first failure across nodes: two deaths on different nodes closer than their clocks
    /// can tell apart are said to be so, and decided by causal evidence (a rank that lost its
    /// peer, or that ups-doctor tore down, followed the other) or else named by timestamp only;
    /// the note is the verdict's first line. Where the causal evidence names the other rank, the
    /// ranks are judged with its death first (the clocks could not order them; the evidence did).
    pub(super) fn order(&self, observed: &Observed, judged: Judgement) -> (Judgement, Option<String>) {
        let ev = Evidence::gather(observed);
        let cause_rank = |r: &RankResult| -> u8 {
            let e = ev.rank(r.rank);
            if r.torn_down_with.is_some() {
                2
            } else if e.is_some_and(catalog::lost_its_peer) {
                1
            } else {
                0
            }
        };
        let ranks = observed.ranks;
        let Some(f) = judged.first_failure.and_then(|f| ranks.iter().find(|r| r.rank == f)) else {
            return (judged, None);
        };
        let fnode = self.node_of(f.rank);
        let tf = failure_time(f);
        let u = |rank: u32| self.uncertainty_ms(self.node_of(rank));
        let rivals: Vec<&RankResult> = ranks
            .iter()
            .filter(|r| r.outcome != OutcomeKind::Passed && self.node_of(r.rank) != fnode)
            .filter(|r| (failure_time(r) - tf).abs() * 1e3 <= u(f.rank) + u(r.rank))
            .collect();
        let Some(rival) = rivals.iter().min_by(|a, b| failure_time(a).total_cmp(&failure_time(b))) else {
            return (judged, None);
        };
        let within = u(f.rank) + u(rival.rank);
        let mut candidates = [f, *rival];
        candidates.sort_by(|a, b| {
            cause_rank(a).cmp(&cause_rank(b)).then(failure_time(a).total_cmp(&failure_time(b)))
        });
        let [chosen, other] = candidates;
        let decided = if cause_rank(chosen) < cause_rank(other) {
            format!(
                "rank {} {}: rank {} is the first failure by causal evidence",
                other.rank,
                if cause_rank(other) == 2 { "was torn down by ups-doctor" } else { "lost its peer" },
                chosen.rank
            )
        } else {
            format!(
                "no causal evidence tells them apart: rank {} is named by its timestamp only",
                chosen.rank
            )
        };
        let note = format!(
            "rank {} on {} and rank {} on {} died within ±{} of each other: order not determined; {decided}",
            f.rank,
            self.host_of(fnode),
            rival.rank,
            self.host_of(self.node_of(rival.rank)),
            ms(within),
        );
        let mut judged = if chosen.rank != f.rank {
            let again = judge(&Observed { ranks: &first_to_die(ranks, chosen.rank), ..*observed });
            Judgement { first_failure: Some(chosen.rank), ..again }
        } else {
            judged
        };
        judged.verdict.evidence.insert(0, capitalise(&note));
        (judged, Some(note))
    }
}

/// The ranks with `first` made the earliest to fail (the judge orders by time).
fn first_to_die(ranks: &[RankResult], first: u32) -> Vec<RankResult> {
    let earliest = ranks.iter().map(failure_time).fold(f64::INFINITY, f64::min);
    ranks
        .iter()
        .map(|r| {
            let mut r = r.clone();
            if r.rank == first {
                r.ended_at_s = Some(earliest - 1e-6);
            }
            r
        })
        .collect()
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_uppercase().collect::<String>() + c.as_str()).unwrap_or_default()
}
