//! The report's memory sections: peaks per process, `/dev/shm` during the run, whether the
//! dataset cache is shared or duplicated across workers, and what the run left behind. Pure.

use crate::harness::{DatasetSharing, Leftovers, MemoryReport, ProcessMemory, ScenarioResult, used_of};
use crate::probe::env::human_bytes;

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
        if !chart.lines.iter().any(|l| l.contains("/dev/shm"))
            && m.series.iter().any(|p| p.shm_used_bytes.is_some())
        {
            caption.push_str(" `/dev/shm` stayed empty, so it has no line.");
        }
        blocks.push(caption);
    }
    blocks
}

fn who(p: &ProcessMemory) -> String {
    match (p.role.as_str(), p.worker) {
        ("rank", _) => format!("rank {}", p.rank),
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
