//! The report's memory sections: peaks per process, `/dev/shm` during the run, whether the
//! dataset cache is shared or duplicated across workers, and what the run left behind. Pure.

use crate::diagnose::used_of;
use crate::scenario::human_bytes;
use crate::schema::{DatasetSharing, Leftovers, MemoryReport, ProcessMemory, ProcessRole, ScenarioResult};

use super::markup::{self, Align, code, fence};
use super::mermaid;
use super::text::{count, plural};

/// The `### Memory` blocks, when the run was sampled.
pub(crate) fn memory_blocks(s: &ScenarioResult) -> Vec<String> {
    let Some(m) = &s.memory else {
        return Vec::new();
    };
    let mut blocks = vec!["### Memory".to_string()];
    blocks.push(format!(
        "Sampled every {} s ({}) for every process of every rank. PSS shares each page among the \
         processes that map it, so it adds up across processes; RSS counts shared pages in every \
         one; USS is what only that process holds.",
        m.interval_s,
        plural(m.samples as usize, "sample")
    ));
    if m.processes.is_empty() {
        blocks.push("No process was sampled: the ranks ended before the first sample.".to_string());
    } else {
        blocks.push(peak_table(&m.processes));
    }
    blocks.push(shm_line(s, m));
    blocks.extend(cgroup_line(s));
    for d in &m.datasets {
        blocks.push(format!("**Dataset:** {}", dataset_line(d)));
    }
    if let Some(chart) = mermaid::memory_chart(m, s.ranks.len()) {
        blocks.push(fence("mermaid", &chart.source));
        let mut caption = format!("Lines: {}.", mermaid::legend(&chart.lines));
        let (first, last) = (m.series[0].t_s, m.series[m.series.len() - 1].t_s);
        if chart.window != (first, last) {
            caption.push_str(&format!(
                " Drawn from {} to {}, while the ranks' processes existed.",
                super::text::secs(chart.window.0),
                super::text::secs(chart.window.1)
            ));
        }
        if chart.shm.is_none() && m.series.iter().any(|p| p.shm_used_bytes.is_some()) {
            caption.push_str(" `/dev/shm` stayed empty, so it has no chart.");
        }
        blocks.push(caption);
        if let Some(shm) = &chart.shm {
            blocks.push(fence("mermaid", shm));
        }
    }
    blocks
}

fn who(p: &ProcessMemory) -> String {
    match (p.role, p.worker) {
        (ProcessRole::Rank, _) => format!("rank {}", p.rank),
        (_, Some(id)) => format!("rank {} · worker {id}", p.rank),
        _ => format!("rank {} · child {}", p.rank, code(&p.command)),
    }
}

fn peak_table(processes: &[ProcessMemory]) -> String {
    let rows: Vec<Vec<String>> = processes
        .iter()
        .map(|p| {
            vec![
                who(p),
                p.pid.to_string(),
                human_bytes(p.peak_rss_bytes),
                human_bytes(p.peak_pss_bytes),
                human_bytes(p.peak_uss_bytes),
                human_bytes(p.peak_shared_bytes),
            ]
        })
        .collect();
    markup::table(
        &["process", "pid", "peak RSS", "peak PSS", "peak USS", "peak shared"],
        &[Align::Left, Align::Right, Align::Right, Align::Right, Align::Right, Align::Right],
        &rows,
    )
}

/// The memory limit and what the OOM killer did under it, or why the scenario had no cgroup;
/// nothing for an unlimited scenario in a cgroup that saw no OOM kill.
fn cgroup_line(s: &ScenarioResult) -> Option<String> {
    if let Some(why) = &s.cgroup_unavailable {
        return Some(format!(
            "**No cgroup:** the scenario's processes ran without a cgroup of their own ({}); teardown \
             found them by process group and run id only.",
            markup::text(why)
        ));
    }
    let cg = s.cgroup.as_ref()?;
    if cg.limit_bytes.is_none() && s.oom_kills.is_empty() && cg.oom_kills == 0 {
        return None;
    }
    let mut line = match cg.limit_bytes {
        Some(limit) => format!("**Memory limit:** {} for all the scenario's processes", human_bytes(limit)),
        None => "**Memory:** no limit".to_string(),
    };
    if let Some(peak) = cg.peak_bytes {
        line.push_str(&format!("; their cgroup's peak was {}", human_bytes(peak)));
    }
    let killed: Vec<String> = s
        .oom_kills
        .iter()
        .map(|k| {
            let who = match (k.rank, k.worker) {
                (Some(r), Some(w)) => format!("worker {w} of rank {r}"),
                (Some(r), None) => format!("rank {r}"),
                _ => "a process".to_string(),
            };
            let mut what = vec![format!("pid {}", k.pid)];
            what.extend(k.process_name.as_ref().map(|n| code(n)));
            what.extend(k.anon_rss_bytes.map(|b| format!("{} anonymous RSS", human_bytes(b))));
            format!("{who} ({})", what.join(", "))
        })
        .collect();
    match (cg.oom_kills, killed.is_empty()) {
        (0, _) => line.push_str("; the OOM killer ended none of them."),
        (n, true) => line.push_str(&format!(
            "; the cgroup counted {} by the OOM killer, which could not be tied to a process of the scenario.",
            plural(n as usize, "kill")
        )),
        (n, false) => line.push_str(&format!(
            "; the OOM killer ended {}: {}.",
            count(n as usize, "process", "processes"),
            killed.join("; ")
        )),
    }
    Some(line)
}

fn shm_line(s: &ScenarioResult, m: &MemoryReport) -> String {
    let which = match (&s.scenario.data.shm_size, m.shm.private) {
        (Some(size), true) => format!("the run's own, `data.shm_size` = {}", code(size)),
        _ => "the machine's".to_string(),
    };
    let peak = match (m.shm.peak_used_bytes, m.shm.total_bytes) {
        (Some(used), Some(total)) if total > 0 => {
            format!("at most {} ({:.0}%) in use", used_of(used, total), used as f64 / total as f64 * 100.0)
        }
        _ => "its use could not be read".to_string(),
    };
    let ours = match m.shm.peak_ours_bytes {
        0 => "this run created no segment of its own".to_string(),
        b => format!("this run's own segments held at most {}", human_bytes(b)),
    };
    format!("**`/dev/shm`** ({which}): {peak}; {ours}.")
}

/// "4 workers each hold a private copy of the 120.0 MiB cache: 480.0 MiB duplicated".
pub(crate) fn dataset_line(d: &DatasetSharing) -> String {
    let cache = format!("the {} cache ({})", human_bytes(d.bytes), code(&format!("cache: {}", d.cache)));
    let uss: Vec<String> = d.worker_peak_uss_bytes.iter().map(|b| human_bytes(*b)).collect();
    let uss = format!("peak USS of the workers: {}", uss.join(", "));
    match (d.workers, d.private_copies) {
        (0, _) => format!("rank {}: {cache} lives in the rank itself (no workers).", d.rank),
        (w, _) if !d.judged => format!(
            "rank {}: {cache} is too small next to a worker's own memory to tell from USS whether it is \
             shared by its {} ({uss}).",
            d.rank,
            count(w as usize, "worker", "workers")
        ),
        (w, c) if c == w => format!(
            "rank {}: {} each hold a private copy of {cache}: {} duplicated ({uss}).",
            d.rank,
            count(w as usize, "worker", "workers"),
            human_bytes(d.duplicated_bytes)
        ),
        (w, 0) => format!(
            "rank {}: {cache} is shared by its {}: none of them holds a private copy, nothing is \
             duplicated ({uss}).",
            d.rank,
            count(w as usize, "worker", "workers")
        ),
        (w, c) => format!(
            "rank {}: {c} of {w} workers hold a private copy of {cache}: {} duplicated; the other {} \
             share it ({uss}).",
            d.rank,
            human_bytes(d.duplicated_bytes),
            w - c
        ),
    }
}

/// The `### Leftovers` blocks: for sampled runs always (saying "nothing" is a finding), for
/// older results only when they list something.
pub(crate) fn leftover_blocks(s: &ScenarioResult) -> Vec<String> {
    let l: &Leftovers = &s.leftovers;
    if s.memory.is_none() && l.is_empty() {
        return Vec::new();
    }
    let mut blocks = vec!["### Leftovers".to_string()];
    if l.is_empty() {
        blocks.push(
            "Nothing was left behind: no new file in `/dev/shm`, no process of the run alive after its \
             rank ended."
                .to_string(),
        );
        return blocks;
    }
    let private = s.memory.as_ref().is_some_and(|m| m.shm.private);
    let mut lines = Vec::new();
    for seg in &l.shm {
        let size = if seg.allocated_bytes == seg.size_bytes {
            human_bytes(seg.size_bytes)
        } else {
            format!("{} long, {} in memory", human_bytes(seg.size_bytes), human_bytes(seg.allocated_bytes))
        };
        let what = if seg.earlier_run {
            "left by an earlier ups-doctor run that ended without cleaning up".to_string()
        } else if seg.ours {
            "created by this run and not removed by it".to_string()
        } else {
            "created during the run by a process that does not name its segments like ups-doctor".to_string()
        };
        let fate = match (&seg.error, seg.ours, seg.removed) {
            (Some(e), _, _) => format!("**could not be removed**: {}", markup::text(e)),
            (None, true, true) => "**removed by ups-doctor**".to_string(),
            (None, false, true) if seg.earlier_run => "**removed by ups-doctor**".to_string(),
            (None, false, true) if private => "discarded with the run's private `/dev/shm`".to_string(),
            _ => "left in place".to_string(),
        };
        lines.push(format!("- {} ({size}): {what}; {fate}.", code(&format!("/dev/shm/{}", seg.name))));
    }
    for p in &l.processes {
        let whose = match (p.rank, p.worker) {
            (Some(r), Some(w)) => format!(", rank {r} · worker {w}"),
            (Some(r), None) => format!(", rank {r}"),
            _ => String::new(),
        };
        let what = if p.earlier_run {
            "was left running by an earlier ups-doctor run that was killed; found in its cgroup"
        } else {
            "was still alive after its rank ended"
        };
        lines.push(format!(
            "- process {} ({}{whose}) {what}: {}.",
            p.pid,
            code(&p.command),
            if p.killed { "**killed by ups-doctor**" } else { "**could not be killed**" }
        ));
    }
    blocks.push(lines.join("\n"));
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures;
    use crate::schema::{CgroupReport, CgroupVersion, OomKill, OomSource};

    #[test]
    fn the_memory_limit_line_names_each_oom_kill_and_a_missing_cgroup() {
        let mut s = fixtures::passing();
        let mib = 1u64 << 20;
        let mut lines = vec![format!("{:?}", cgroup_line(&s))];
        s.cgroup = Some(CgroupReport {
            path: "/sys/fs/cgroup/memory/ups-doctor.1.2.0".into(),
            version: CgroupVersion::V1,
            limit_bytes: Some(640 * mib),
            peak_bytes: Some(640 * mib),
            oom_kills: 1,
        });
        s.oom_kills = vec![OomKill {
            pid: 41007,
            rank: Some(0),
            worker: Some(1),
            at_s: Some(8.1),
            source: OomSource::Kmsg,
            process_name: Some("loader-w1".into()),
            anon_rss_bytes: Some(289 * mib),
        }];
        lines.extend(cgroup_line(&s));
        s.oom_kills.clear();
        lines.extend(cgroup_line(&s));
        s.cgroup.as_mut().unwrap().oom_kills = 0;
        lines.extend(cgroup_line(&s));
        s.cgroup = None;
        s.cgroup_unavailable = Some("`/tmp/x` is not in a cgroup file system".into());
        lines.extend(cgroup_line(&s));
        insta::assert_snapshot!(lines.join("\n\n"));
    }
}
