//! `sweep.md` and the terminal table of `ups-doctor sweep`: the verdict first (fastest passing
//! configuration, scaling, memory, failures, noise), then one row per point, then each point's
//! processes and run folders. Rendered from [`SweepRecord`], the content of `sweep.json`. Pure.

use comfy_table::{CellAlignment, ContentArrangement, Table, presets};

use crate::scenario::human_bytes;
use crate::sweep::{PointRecord, Range, SweepRecord};

use super::markup::{self, Align, code};
use super::text::{NONE, kind_label, percent, plural, sig};

/// A value with its spread: `12.3` for one run, `12.3 (11.9–12.8)` for several.
fn range(r: Option<Range>, f: impl Fn(f64) -> String) -> String {
    match r {
        None => NONE.to_string(),
        Some(r) if r.n == 1 || r.min == r.max => f(r.median),
        Some(r) => format!("{} ({}–{})", f(r.median), f(r.min), f(r.max)),
    }
}

fn rate(v: f64) -> String {
    sig(v, 3)
}

fn bytes(v: f64) -> String {
    human_bytes(v as u64)
}

/// The outcome cell: `passed`, `hung: fork-after-threads`, `1 of 3 hung: …`.
fn outcome(p: &PointRecord) -> String {
    let s = &p.summary;
    if s.runs == 0 {
        return "not run".to_string();
    }
    let Some(f) = &s.failure else { return "passed".to_string() };
    let what = match &f.pattern {
        Some(pattern) => format!("{}: {pattern}", kind_label(f.outcome)),
        None => kind_label(f.outcome).to_string(),
    };
    if f.failed_runs == s.runs { what } else { format!("{} of {} {what}", f.failed_runs, s.runs) }
}

fn dataset(p: &PointRecord) -> String {
    match &p.summary.dataset {
        None => NONE.to_string(),
        Some(d) if d.workers == 0 => format!("{} in the rank", d.cache),
        Some(d) if !d.judged => format!("{}: too small to tell", d.cache),
        Some(d) if d.private_copies > 0 => {
            format!(
                "{}: {} private copies, {} duplicated",
                d.cache,
                d.private_copies,
                human_bytes(d.duplicated_bytes)
            )
        }
        Some(d) => format!("{}: shared by {}", d.cache, plural(d.workers as usize, "worker")),
    }
}

/// Whole percent, as NVML reports utilisation.
fn pct(v: f64) -> String {
    format!("{v:.0}%")
}

/// The GPU cell: `21% (19–25%)` for one GPU, `GPU 0 21%, GPU 1 20%` for several (medians of
/// the runs' utilisation medians, over the passing runs).
fn gpu_cell(p: &PointRecord) -> String {
    match p.summary.gpus.as_slice() {
        [] => NONE.to_string(),
        [one] => range(one.util_percent, pct),
        many => many
            .iter()
            .map(|g| format!("GPU {} {}", g.index, range(g.util_percent, pct)))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// Whether any point measured a GPU: only then does the table have a GPU column.
fn has_gpu(r: &SweepRecord) -> bool {
    r.points.iter().any(|p| !p.summary.gpus.is_empty())
}

/// The header and alignment of the table; the GPU column only where a GPU was measured.
fn columns(gpu: bool) -> (Vec<&'static str>, Vec<Align>) {
    let mut header = HEADER.to_vec();
    let mut align = ALIGN.to_vec();
    if gpu {
        header.insert(GPU_AT, "GPU util");
        align.insert(GPU_AT, Align::Right);
    }
    (header, align)
}

/// Where the GPU column goes: after the data wait, which it is read against.
const GPU_AT: usize = 6;

/// The cells of one point's row, in [`columns`]' order.
fn row(p: &PointRecord, gpu: bool) -> Vec<String> {
    let s = &p.summary;
    let worker = match (s.worker_peak_pss_bytes, s.worker_peak_uss_bytes) {
        (Some(pss), Some(uss)) => format!("{} / {}", human_bytes(pss), human_bytes(uss)),
        _ => NONE.to_string(),
    };
    let mut cells = vec![
        p.index.to_string(),
        p.label.clone(),
        outcome(p),
        range(s.steps_per_s, rate),
        range(s.samples_per_s, rate),
        range(s.data_wait_fraction, percent),
        range(s.tree_peak_pss_bytes, bytes),
        worker,
        dataset(p),
        range(s.shm_peak_ours_bytes, bytes),
        s.runs.to_string(),
    ];
    if gpu {
        cells.insert(GPU_AT, gpu_cell(p));
    }
    cells
}

const HEADER: [&str; 11] = [
    "#",
    "configuration",
    "outcome",
    "steps/s",
    "samples/s",
    "data wait",
    "peak PSS (tree)",
    "worker PSS / USS",
    "dataset cache",
    "/dev/shm peak",
    "runs",
];
const ALIGN: [Align; 11] = [
    Align::Right,
    Align::Left,
    Align::Left,
    Align::Right,
    Align::Right,
    Align::Right,
    Align::Right,
    Align::Right,
    Align::Left,
    Align::Right,
    Align::Right,
];

/// The first verdict line of a sweep its full disk stopped: where, what failed, and the fix.
fn disk_full_line(r: &SweepRecord, markdown: bool) -> Option<String> {
    let name = |s: &str| if markdown { code(s) } else { s.to_string() };
    let free = |s: &str| if markdown { markup::text(s) } else { s.to_string() };
    let full = r.disk_full.as_ref()?;
    let what = full.path.as_deref().map_or(String::new(), |p| format!(" (could not write {}", name(p)));
    let close = if what.is_empty() { "" } else { ")" };
    let folder = name(&full.folder);
    let df = name(&format!("df -h {}", full.folder));
    Some(format!(
        "Stopped: the disk of {folder} filled{what}: {}{close} after {} this time; what was measured is \
         kept. To go on, free space on that disk ({df} shows it), or move the folder to a larger disk and \
         give {} the new place; then run the same command again: the finished runs are cached in its {} \
         and are not run again.",
        free(&full.error),
        plural(r.real_runs, "real run"),
        name("--out"),
        name("cache/")
    ))
}

/// The verdict as sentences, for markdown (configurations as code, free text escaped) or plain.
pub fn verdict_lines(r: &SweepRecord, markdown: bool) -> Vec<String> {
    let name = |s: &str| if markdown { code(s) } else { s.to_string() };
    let free = |s: &str| if markdown { markup::text(s) } else { s.to_string() };
    let v = &r.verdict;
    let label = |i: usize| {
        r.points
            .get(i.wrapping_sub(1))
            .map_or_else(|| format!("point {i}"), |p| format!("{i} ({})", name(&p.label)))
    };
    let mut out = Vec::new();
    out.extend(disk_full_line(r, markdown));
    match &v.fastest {
        None => out.push("No configuration passed with a throughput to compare.".to_string()),
        Some(f) => {
            let mut line = format!(
                "Fastest passing configuration: {}, {} samples/s",
                label(f.point),
                range(Some(f.samples_per_s), rate)
            );
            match f.ratio_to_first {
                Some(x) if f.point != 1 => line.push_str(&format!(", {}× the first point", sig(x, 3))),
                _ if f.point == 1 => line.push_str(" (the first point itself)"),
                _ => line.push_str(" (the first point did not pass: no ratio)"),
            }
            line.push('.');
            if !f.within_noise_of.is_empty() {
                let others: Vec<String> = f.within_noise_of.iter().map(|i| label(*i)).collect();
                line.push_str(&format!(
                    " Within noise of {}: their samples/s ranges overlap, so no winner among them.",
                    others.join(", ")
                ));
            }
            out.push(line);
        }
    }
    if v.noise_unknown {
        out.push(format!(
            "One run per point ({} each): no measure of noise, so small differences may be chance; \
             rerun with `--runs 3` before trusting them.",
            plural(r.runs_per_point, "run")
        ));
    }
    for s in &v.scaling {
        let mut line = format!(
            "{} ranks ({}): {}× the samples/s of {} ({}), ideal {}×: scaling efficiency {}",
            s.ranks,
            label(s.point),
            sig(s.speedup, 3),
            plural(s.baseline_ranks as usize, "rank"),
            label(s.baseline),
            sig(f64::from(s.ranks) / f64::from(s.baseline_ranks), 3),
            percent(s.efficiency)
        );
        if s.within_noise {
            line.push_str(" (within noise: the ranges overlap)");
        }
        if let Some(w) = s.data_wait_fraction {
            line.push_str(&format!("; each rank waits {} of its step for data", percent(w)));
            if w >= 0.5 {
                line.push_str(" — input-bound");
            }
        }
        line.push('.');
        out.push(line);
    }
    out.extend(gpu_line(r, &label));
    let m = &v.memory;
    if let (Some(small), Some(large)) = (m.smallest, m.largest)
        && small.0 != large.0
    {
        out.push(format!(
            "Memory: peak PSS of the whole tree from {} at {} to {} at {}.",
            human_bytes(small.1),
            label(small.0),
            human_bytes(large.1),
            label(large.0)
        ));
    }
    for i in &m.duplicated {
        if let Some(d) = r.points.get(i - 1).and_then(|p| p.summary.dataset.as_ref()) {
            out.push(format!(
                "Duplicated at {}: {} of {} each hold a private copy of the {} `{}` cache ({} duplicated).",
                label(*i),
                d.private_copies,
                plural(d.workers as usize, "worker"),
                human_bytes(d.bytes),
                d.cache,
                human_bytes(d.duplicated_bytes)
            ));
        }
    }
    if !m.shared.is_empty() {
        let shared: Vec<String> = m.shared.iter().map(|i| label(*i)).collect();
        out.push(format!("Shared, nothing duplicated: {}.", shared.join(", ")));
    }
    for f in &v.failed {
        let how = match &f.pattern {
            Some(p) => format!("{} (pattern `{p}`)", kind_label(f.outcome)),
            None => kind_label(f.outcome).to_string(),
        };
        out.push(format!(
            "Failed: {} — {how} in {} of {}: {}",
            label(f.point),
            f.failed_runs,
            plural(f.runs, "run"),
            free(&f.headline)
        ));
    }
    if !v.unmeasured.is_empty() {
        let why = match (&r.disk_full, r.interrupted) {
            (Some(full), _) => format!("the disk of `{}` filled", full.folder),
            (None, true) => "the sweep was interrupted".to_string(),
            (None, false) => "the budget ran out".to_string(),
        };
        out.push(format!(
            "Not measured ({why}): points {}; run the same command again to resume from the cache.",
            v.unmeasured.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
        ));
    }
    out
}

/// Each point's GPU utilisation, where any point measured one.
fn gpu_line(r: &SweepRecord, label: &dyn Fn(usize) -> String) -> Option<String> {
    let per: Vec<String> = r
        .points
        .iter()
        .filter(|p| !p.summary.gpus.is_empty())
        .map(|p| format!("{} {}", label(p.index), gpu_cell(p)))
        .collect();
    (!per.is_empty()).then(|| {
        format!(
            "GPU utilisation (median over the readings in which the run held the GPU; utilisation only says \
             a kernel ran): {}.",
            per.join(", ")
        )
    })
}

/// `sweep.md`.
pub fn render_sweep(r: &SweepRecord) -> String {
    let mut out = vec![format!("# ups-doctor sweep: {}", markup::text(&r.scenario_name))];
    out.push("## Verdict".to_string());
    out.push(verdict_lines(r, true).iter().map(|l| format!("- {l}")).collect::<Vec<_>>().join("\n"));
    out.push("## Points".to_string());
    out.push(format!(
        "Throughput is the trainer's own clock (steps/s of rank 0; samples/s of all ranks together); \
         data wait is the ranks' mean share of step time spent waiting for data; peak PSS adds up \
         every process of every rank at one sample; worker PSS / USS is the largest worker's. \
         Medians with min–max over the runs that passed; a failed run is never averaged in. {} per \
         point, {} warm-up thrown away.",
        plural(r.runs_per_point, "run"),
        r.warmup_runs
    ));
    let gpu = has_gpu(r);
    let rows: Vec<Vec<String>> = r
        .points
        .iter()
        .map(|p| {
            let mut cells = row(p, gpu);
            cells[1] = code(&p.label);
            cells
        })
        .collect();
    let (header, align) = columns(gpu);
    out.push(markup::table(&header, &align, &rows));
    let dropped: Vec<String> = r
        .points
        .iter()
        .flat_map(|p| {
            p.dropped
                .iter()
                .map(move |d| format!("- point {} ({}): {}", p.index, code(&p.label), markup::text(d)))
        })
        .collect();
    if !dropped.is_empty() {
        out.push(format!(
            "Fields of the configuration that do not apply at some points were left at their defaults there \
             (the grid's other points keep them):\n\n{}",
            dropped.join("\n")
        ));
    }
    out.extend(charts(r));
    out.push("## Run folders".to_string());
    let mut folders = Vec::new();
    for p in &r.points {
        for run in &p.runs {
            folders.push(format!(
                "- {} {}: `{}/` — {}{}",
                p.index,
                code(&p.label),
                run.dir,
                kind_label(run.outcome),
                if run.cached { " (cached)" } else { "" }
            ));
        }
    }
    out.push(if folders.is_empty() { "None yet.".to_string() } else { folders.join("\n") });
    out.push(format!(
        "{} real {} this time (budget {}){}. Command: `{}`",
        r.real_runs,
        if r.real_runs == 1 { "run" } else { "runs" },
        r.budget,
        if r.budget_exhausted { ", budget exhausted" } else { "" },
        r.command.join(" ")
    ));
    out.join("\n\n") + "\n"
}

/// Throughput and peak memory per point as bar charts (medians of the passing runs; a point that
/// failed has no bar), when at least two points have each.
fn charts(r: &SweepRecord) -> Vec<String> {
    let by = |f: &dyn Fn(&PointRecord) -> Option<f64>| -> Vec<(usize, Option<f64>)> {
        r.points.iter().map(|p| (p.index, f(p))).collect()
    };
    let samples = by(&|p| p.summary.samples_per_s.map(|x| x.median));
    let throughput = if samples.iter().filter(|(_, v)| v.is_some()).count() >= 2 {
        super::mermaid::point_bars("Throughput per point (samples/s, median)", "samples/s", &samples)
    } else {
        let steps = by(&|p| p.summary.steps_per_s.map(|x| x.median));
        super::mermaid::point_bars("Throughput per point (steps/s, median)", "steps/s", &steps)
    };
    let mib = by(&|p| p.summary.tree_peak_pss_bytes.map(|x| x.median / f64::from(1 << 20)));
    let memory =
        super::mermaid::point_bars("Peak PSS of the whole tree per point (MiB, median)", "MiB", &mib);
    let drawn: Vec<String> =
        [throughput, memory].into_iter().flatten().map(|c| markup::fence("mermaid", &c)).collect();
    if drawn.is_empty() {
        return Vec::new();
    }
    let failed: Vec<String> =
        r.points.iter().filter(|p| p.summary.passed_runs == 0).map(|p| p.index.to_string()).collect();
    let mut note =
        "Bars are numbered as the points in the table above, medians over the runs that passed".to_string();
    match failed.len() {
        0 => {}
        1 => note += &format!("; point {} failed and has no bar", failed[0]),
        _ => note += &format!("; points {} failed and have no bar", failed.join(", ")),
    }
    let mut out = vec!["## Charts".to_string(), format!("{note}.")];
    out.extend(drawn);
    out
}

/// The terminal table (no trailing newline).
pub fn render_sweep_table(r: &SweepRecord) -> String {
    let mut table = Table::new();
    table
        .load_preset(presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Disabled)
        .force_no_tty();
    let gpu = has_gpu(r);
    let (header, aligns) = columns(gpu);
    table.set_header(header);
    for p in &r.points {
        table.add_row(row(p, gpu));
    }
    for (i, align) in aligns.iter().enumerate() {
        if let (Some(column), Align::Right) = (table.column_mut(i), align) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    table.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::{GpuRange, PointSummary, SweepVerdict};

    fn point(index: usize, label: &str, gpus: Vec<GpuRange>) -> PointRecord {
        PointRecord {
            index,
            label: label.into(),
            settings: vec![label.into()],
            world_size: 1,
            hash: String::new(),
            runs: Vec::new(),
            summary: PointSummary {
                runs: 2,
                passed_runs: 2,
                samples_per_s: Range::of([960.0, 1000.0]),
                gpus,
                ..PointSummary::default()
            },
            dropped: Vec::new(),
        }
    }

    fn gpu(index: u32, medians: &[f64]) -> GpuRange {
        GpuRange {
            index,
            util_percent: Range::of(medians.iter().copied()),
            util_peak: Some(30.0),
            sm_active_percent: None,
            memory_used_peak_bytes: Some(1 << 30),
        }
    }

    fn record(points: Vec<PointRecord>) -> SweepRecord {
        SweepRecord {
            tool_version: "0".into(),
            started_at: "2026-11-27T16:00:00Z".into(),
            command: vec!["ups-doctor".into(), "sweep".into()],
            scenario_file: "scenarios/gpu/single-cuda.json".into(),
            scenario_name: "single-cuda".into(),
            set: Vec::new(),
            vary: vec!["data.workers=0,4".into()],
            runs_per_point: 2,
            warmup_runs: 1,
            budget: 10,
            real_runs: 5,
            budget_exhausted: false,
            interrupted: false,
            disk_full: None,
            points,
            verdict: SweepVerdict::default(),
        }
    }

    /// Figures shaped like the H200's input-heavy pair (docs/gpu.md): 8 % with the loader in the
    /// trainer, 22 % with 4 spawned workers.
    #[test]
    fn gpu_utilisation_has_a_column_and_a_verdict_line_only_where_a_gpu_was_measured() {
        let r = record(vec![
            point(1, "data.workers=0", vec![gpu(0, &[8.0, 9.0])]),
            point(2, "data.workers=4", vec![gpu(0, &[22.0])]),
        ]);
        let md = render_sweep(&r);
        assert!(md.contains("| data wait | GPU util | peak PSS (tree) |"), "{md}");
        assert!(md.contains("| 8% (8%–9%) |") && md.contains("| 22% |"), "{md}");
        let lines = verdict_lines(&r, false);
        let line = lines.iter().find(|l| l.starts_with("GPU utilisation")).expect("a GPU line");
        assert!(line.ends_with("1 (data.workers=0) 8% (8%–9%), 2 (data.workers=4) 22%."), "{line}");
        assert!(render_sweep_table(&r).contains("GPU util"));

        // Several GPUs: each named; no GPU anywhere: no column, no line.
        let two = record(vec![point(1, "launch.world_size=2", vec![gpu(0, &[50.0]), gpu(1, &[48.0])])]);
        assert!(render_sweep(&two).contains("| GPU 0 50%, GPU 1 48% |"));
        let cpu = record(vec![point(1, "data.workers=0", Vec::new())]);
        assert!(!render_sweep(&cpu).contains("GPU"));
        assert!(!render_sweep_table(&cpu).contains("GPU"));
        assert!(!verdict_lines(&cpu, true).iter().any(|l| l.contains("GPU")));
    }
}
