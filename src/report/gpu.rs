//! The report's GPU section: per GPU the utilisation and SM activity (median and peak), memory,
//! clocks, power, temperature and why clocks were held down; GPU memory per process of the run;
//! a chart per GPU. When the GPUs could not be sampled, one line says why. Pure.

use crate::scenario::human_bytes;
use crate::schema::{GpuProcessPeak, GpuReport, GpuSummary, ProcessRole, ScenarioResult, Stat};

use super::markup::{self, Align, code, fence};
use super::text::{NONE, plural, sig};

/// The GPU blocks of a scenario: nothing when the GPUs were not watched (`device: cpu`).
pub(crate) fn gpu_blocks(s: &ScenarioResult) -> Vec<String> {
    let Some(g) = &s.gpu else {
        return Vec::new();
    };
    if let Some(why) = &g.unavailable {
        let devices: Vec<&str> = s.ranks.iter().filter_map(|r| r.device.as_deref()).collect();
        let on_cpu = !devices.is_empty() && devices.iter().all(|d| *d == "cpu");
        let tail = if on_cpu { " The ranks trained on the CPU." } else { "" };
        return vec![format!(
            "**GPU:** metrics unavailable: {}.{tail}",
            markup::text(why.trim_end_matches('.'))
        )];
    }
    if g.samples == 0 || g.gpus.is_empty() {
        return vec!["**GPU:** no sample was taken: the ranks ended before the first one.".to_string()];
    }
    let mut blocks = vec!["### GPU".to_string()];
    blocks.push(format!(
        "Sampled through NVML every {} s ({}). Figures are over the samples in which a process of this \
         run held the GPU. *Utilisation* is the share of time a kernel ran, so a kernel that spins (an NCCL \
         collective waiting for a peer) reads as busy; *SM activity* (GPM) is the share of SMs that were busy.",
        sig(g.interval_s, 3),
        plural(g.samples as usize, "sample")
    ));
    blocks.push(gpu_table(&g.gpus));
    for gpu in &g.gpus {
        if let Some(why) = &gpu.sm_activity_missing {
            blocks.push(format!(
                "SM activity of GPU {} is not measured: {}. Read its utilisation as \"a kernel was running\", \
                 not as \"the SMs were busy\".",
                gpu.index,
                markup::text(why)
            ));
        }
    }
    if !g.processes.is_empty() {
        blocks.push(process_table(&g.processes));
    }
    for (i, gpu) in g.gpus.iter().enumerate() {
        if let Some(chart) = chart(g, i, gpu) {
            blocks.push(fence("mermaid", &chart.0));
            blocks.push(format!("Lines, in drawing order: {}.", chart.1.join("; ")));
        }
    }
    blocks
}

fn pair(s: Option<Stat>, unit: &str) -> String {
    s.map_or_else(|| NONE.to_string(), |s| format!("{}{unit} / {}{unit}", sig(s.median, 3), sig(s.peak, 3)))
}

fn gpu_table(gpus: &[GpuSummary]) -> String {
    let rows: Vec<Vec<String>> = gpus
        .iter()
        .map(|g| {
            let name = if g.name.is_empty() { String::new() } else { format!(" {}", markup::text(&g.name)) };
            let reasons: Vec<String> = g
                .clock_reasons
                .iter()
                .map(|r| format!("{} ({:.0}%)", code(&r.reason), r.share * 100.0))
                .collect();
            vec![
                format!("{}{name}{}", g.index, if g.used_by_run { "" } else { " (not used by the run)" }),
                pair(g.util_percent, "%"),
                pair(g.sm_active_percent, "%"),
                format!(
                    "{} of {}",
                    g.memory_used_peak_bytes.map_or_else(|| NONE.to_string(), human_bytes),
                    human_bytes(g.memory_total_bytes)
                ),
                g.sm_clock_mhz.map_or_else(|| NONE.to_string(), |c| format!("{:.0} MHz", c.median)),
                pair(g.power_w, " W"),
                g.temperature_peak_c.map_or_else(|| NONE.to_string(), |t| format!("{t} °C")),
                if reasons.is_empty() { "none".to_string() } else { reasons.join(", ") },
            ]
        })
        .collect();
    markup::table(
        &[
            "GPU",
            "utilisation median / peak",
            "SM activity median / peak",
            "peak memory used",
            "SM clock (median)",
            "power median / peak",
            "peak temperature",
            "clocks held down by",
        ],
        &[
            Align::Left,
            Align::Right,
            Align::Right,
            Align::Right,
            Align::Right,
            Align::Right,
            Align::Right,
            Align::Left,
        ],
        &rows,
    )
}

fn process_table(processes: &[GpuProcessPeak]) -> String {
    let rows: Vec<Vec<String>> = processes
        .iter()
        .map(|p| {
            let who = match (p.role, p.rank, p.worker) {
                (ProcessRole::Rank, Some(r), _) => format!("rank {r}"),
                (ProcessRole::Worker, Some(r), Some(w)) => format!("rank {r} · worker {w}"),
                _ => "not of this run".to_string(),
            };
            vec![
                who,
                p.pid.to_string(),
                p.gpu.to_string(),
                p.peak_memory_bytes.map_or_else(|| "not reported".to_string(), human_bytes),
            ]
        })
        .collect();
    markup::table(
        &["process", "pid", "GPU", "peak GPU memory"],
        &[Align::Left, Align::Right, Align::Right, Align::Right],
        &rows,
    )
}

/// A line chart of one GPU over time (percent): utilisation, SM activity where measured, memory
/// used as a share of the total. xychart has no legend: the caller lists the lines.
fn chart(g: &GpuReport, i: usize, gpu: &GpuSummary) -> Option<(String, Vec<String>)> {
    if g.series.len() < 2 {
        return None;
    }
    let (first, last) = (g.series[0].t_s, g.series[g.series.len() - 1].t_s);
    let value = |v: Option<f64>| sig(v.unwrap_or(0.0), 3);
    let mut out = format!(
        "xychart-beta\n    title \"GPU {} (% over time)\"\n    x-axis \"seconds since the scenario started\" {} --> {}\n    \
         y-axis \"%\" 0 --> 100",
        gpu.index,
        sig(first, 3),
        sig(last, 3)
    );
    let mut lines = Vec::new();
    let util: Vec<String> =
        g.series.iter().map(|p| value(p.gpus.get(i).and_then(|v| v.util_percent))).collect();
    out.push_str(&format!("\n    line [{}]", util.join(", ")));
    lines.push("utilisation".to_string());
    if g.series.iter().any(|p| p.gpus.get(i).is_some_and(|v| v.sm_active_percent.is_some())) {
        let sm: Vec<String> =
            g.series.iter().map(|p| value(p.gpus.get(i).and_then(|v| v.sm_active_percent))).collect();
        out.push_str(&format!("\n    line [{}]", sm.join(", ")));
        lines.push("SM activity".to_string());
    }
    if gpu.memory_total_bytes > 0 {
        let total = gpu.memory_total_bytes as f64;
        let mem: Vec<String> = g
            .series
            .iter()
            .map(|p| value(p.gpus.get(i).and_then(|v| v.memory_used_bytes).map(|b| b as f64 / total * 100.0)))
            .collect();
        out.push_str(&format!("\n    line [{}]", mem.join(", ")));
        lines.push(format!("memory used (% of {})", human_bytes(gpu.memory_total_bytes)));
    }
    Some((out, lines))
}
