//! The kernel's OOM killer, judged only from an OOM event the cgroup or the kernel log recorded.

use super::{Finding, Pattern};
use crate::diagnose::evidence::{Evidence, RankEvidence};
use crate::diagnose::words::ms;
use crate::scenario::OutcomeKind;
use crate::scenario::human_bytes;
use crate::schema::{OomKill, OomSource};

/// `2.0 GiB`, `1.98 GiB`: sizes near a limit need the second digit.
fn size(bytes: u64) -> String {
    if bytes < 1 << 30 {
        return human_bytes(bytes);
    }
    let two = format!("{:.2}", bytes as f64 / (1u64 << 30) as f64);
    format!("{} GiB", two.strip_suffix('0').unwrap_or(&two))
}

pub const OOM_KILL: Pattern = Pattern {
    id: "oom-kill",
    title: "Killed by the OOM killer",
    matches: "an OOM kill recorded for a process of the scenario: the kernel log (`/dev/kmsg`: `Killed process \
              PID`) or the scenario's memory cgroup's `oom_kill` counter. A SIGKILL without such a record is \
              never called an OOM kill",
    explanation: "The processes of the scenario together used more memory than their limit (the cgroup's, a \
                  container's `--memory`, or the machine's), and the kernel killed the one it scored worst. \
                  DataLoader workers each holding their own copy of a dataset are the usual reason: copy-on-write \
                  pages of a forked worker become private as Python touches them.",
    next_step: "Read who held the memory (PSS per process): keep datasets in shared memory or memory-mapped \
                files instead of one copy per worker, use fewer workers, or raise the limit.",
    reference: "https://pytorch.org/docs/stable/data.html#multi-process-data-loading",
};

fn who(k: &OomKill, ev: &Evidence) -> String {
    let pid = k.pid;
    match (k.worker, k.rank) {
        (Some(w), Some(r)) => format!("DataLoader worker {w} (pid {pid}) of rank {r}"),
        (None, Some(r)) if ev.rank(r).and_then(|e| e.result.pid) == Some(pid) => {
            format!("Rank {r} (pid {pid})")
        }
        (None, Some(r)) => format!("A process of rank {r} (pid {pid})"),
        (_, None) => format!("Process {pid} of the scenario"),
    }
}

pub fn oom_kill(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    first?;
    let kill = ev
        .oom_kills
        .iter()
        .min_by(|a, b| a.at_s.unwrap_or(f64::INFINITY).total_cmp(&b.at_s.unwrap_or(f64::INFINITY)))?;
    let mut f = Finding::of(&OOM_KILL);
    f.culprit = kill.rank;
    let limit = ev.cgroup.and_then(|c| c.limit_bytes);
    let held_pss: u64 = ev.memory.map_or(0, |m| m.processes.iter().map(|p| p.peak_pss_bytes).sum());
    let held = ev.cgroup.and_then(|c| c.peak_bytes).or((held_pss > 0).then_some(held_pss));
    let figures = match (limit, held) {
        (Some(l), Some(h)) => {
            format!(": cgroup limit {}, the scenario's processes held {}", size(l), size(h))
        }
        (Some(l), None) => format!(": cgroup limit {}", size(l)),
        (None, Some(h)) => {
            format!(" (no memory limit of ups-doctor's; the scenario's processes held {})", size(h))
        }
        (None, None) => String::new(),
    };
    let consequence = kill
        .rank
        .and_then(|r| ev.rank(r))
        .filter(|r| kill.worker.is_some() && r.result.outcome != OutcomeKind::Passed)
        .map(|r| {
            // The kernel may pick the rank itself next, before it saw its worker die: then it did
            // not fail "as a consequence", it was killed too.
            let itself = ev.oom_kills.iter().find(|k| k.pid != kill.pid && r.result.pid == Some(k.pid));
            match (itself, r.result.exit_code) {
                (Some(k), _) => format!(
                    "; rank {} (pid {}) was killed by it too{}",
                    r.rank(),
                    k.pid,
                    match (kill.at_s, k.at_s) {
                        (Some(a), Some(b)) if b >= a => format!(", {} later", ms((b - a) * 1000.0)),
                        _ => String::new(),
                    }
                ),
                (None, Some(c)) => format!("; rank {} exited with status {c} as a consequence", r.rank()),
                (None, None) => format!("; rank {} failed as a consequence", r.rank()),
            }
        })
        .unwrap_or_default();
    f.headline = Some(format!("{} was killed by the OOM killer{figures}{consequence}.", who(kill, ev)));
    f.evidence.push(match kill.source {
        OomSource::Kmsg => format!(
            "the kernel log: `Killed process {}{}`{}",
            kill.pid,
            kill.process_name.as_deref().map(|n| format!(" ({n})")).unwrap_or_default(),
            kill.anon_rss_bytes.map(|b| format!(", anon-rss {}", human_bytes(b))).unwrap_or_default()
        ),
        OomSource::Cgroup => format!(
            "the cgroup's `oom_kill` counter rose{} while pid {} was the process SIGKILLed (the kernel log did not \
             name it)",
            ev.cgroup.map(|c| format!(" to {}", c.oom_kills)).unwrap_or_default(),
            kill.pid
        ),
    });
    if let Some(m) = ev.memory {
        let mut holders: Vec<_> = m.processes.iter().filter(|p| p.peak_pss_bytes > 0).collect();
        holders.sort_by_key(|p| std::cmp::Reverse(p.peak_pss_bytes));
        let top: Vec<String> = holders
            .iter()
            .take(4)
            .map(|p| {
                let role = match p.worker {
                    Some(w) => format!("rank {} worker {w}", p.rank),
                    None => format!("rank {} {}", p.rank, p.role),
                };
                format!("{role} (pid {}) {}", p.pid, human_bytes(p.peak_pss_bytes))
            })
            .collect();
        if !top.is_empty() {
            f.evidence.push(format!("who held the memory (peak PSS): {}", top.join(", ")));
        }
    }
    if ev.oom_kills.len() > 1 {
        let mut kills: Vec<&OomKill> = ev.oom_kills.iter().collect();
        kills.sort_by(|a, b| a.at_s.unwrap_or(f64::INFINITY).total_cmp(&b.at_s.unwrap_or(f64::INFINITY)));
        let each: Vec<String> = kills
            .iter()
            .map(|k| {
                let at = k.at_s.map(|t| format!(" at {t:.3} s")).unwrap_or_default();
                let mut name = who(k, ev);
                if !name.starts_with("DataLoader")
                    && let Some(first) = name.get(..1)
                {
                    name = first.to_lowercase() + &name[1..];
                }
                format!("{name}{at}")
            })
            .collect();
        f.evidence.push(format!("{} OOM kills in all: {}", ev.oom_kills.len(), each.join(", ")));
    }
    Some(f)
}
