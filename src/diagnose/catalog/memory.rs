//! The kernel's OOM killer, judged only from an OOM event the cgroup or the kernel log recorded.

use super::{Finding, Pattern};
use crate::diagnose::evidence::{Evidence, RankEvidence};
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
        .map(|r| match r.result.exit_code {
            Some(c) => format!("; rank {} exited with status {c} as a consequence", r.rank()),
            None => format!("; rank {} failed as a consequence", r.rank()),
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
        f.evidence.push(format!("{} OOM kills in all; the first is named above", ev.oom_kills.len()));
    }
    Some(f)
}
