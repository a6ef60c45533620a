//! Mermaid charts that GitHub renders inline: a gantt of every rank's phases and a line chart of
//! the loss. Each function returns the diagram source, or `None` when there is nothing to draw.

use std::fmt::Write;

use crate::harness::{MemoryReport, RankResult, ScenarioResult};

use super::text::sig;

/// Most points drawn in the loss chart; longer series are thinned evenly.
const MAX_LOSS_POINTS: usize = 60;

/// A gantt of each rank's `timeline`, one section per rank, in milliseconds since the scenario
/// started. A phase that never ended runs to the rank's end (or its last marker, or the
/// scenario's wall time) and is marked `crit`.
pub(crate) fn timeline(s: &ScenarioResult) -> Option<String> {
    let ranks: Vec<&RankResult> = s.ranks.iter().filter(|r| !r.timeline.is_empty()).collect();
    if ranks.is_empty() {
        return None;
    }
    let span_end =
        |r: &RankResult, end: Option<f64>| end.or(r.ended_at_s).or(r.last_marker_at_s).unwrap_or(s.wall_s);
    let latest =
        ranks.iter().flat_map(|r| r.timeline.iter().map(|p| span_end(r, p.end_s))).fold(0.0_f64, f64::max);
    // Time 0 is the epoch; minutes and seconds read the same in every time zone that GitHub's
    // viewer may render them in, hours would not.
    let (axis, unit) = if latest < 60.0 { ("%S.%L", "seconds") } else { ("%M:%S", "minutes:seconds") };
    let mut out = String::new();
    let _ = writeln!(out, "gantt");
    let _ = writeln!(out, "    title Phases per rank ({unit} since the scenario started)");
    let _ = writeln!(out, "    dateFormat x");
    let _ = writeln!(out, "    axisFormat {axis}");
    let _ = writeln!(out, "    todayMarker off");
    for r in ranks {
        let _ = writeln!(out, "    section rank {}", r.rank);
        for span in &r.timeline {
            let start = ms(span.start_s);
            // A zero-length task is dropped by some mermaid versions; keep it visible.
            let end = ms(span_end(r, span.end_s)).max(start + 1);
            let name = task_name(&span.phase);
            if span.end_s.is_some() {
                let _ = writeln!(out, "    {name} :{start}, {end}");
            } else {
                let _ = writeln!(out, "    {name} (never ended) :crit, {start}, {end}");
            }
        }
    }
    Some(out.trim_end().to_string())
}

/// A line chart of one rank's loss per step, when it has at least two finite points.
pub(crate) fn loss_chart(r: &RankResult) -> Option<String> {
    let points: Vec<(u64, f64)> = r.losses.iter().copied().filter(|(_, l)| l.is_finite()).collect();
    if points.len() < 2 {
        return None;
    }
    let points = thin(&points, MAX_LOSS_POINTS);
    let (first, last) = (points[0].0, points[points.len() - 1].0);
    let values: Vec<String> = points.iter().map(|(_, l)| sig(*l, 4)).collect();
    Some(format!(
        "xychart-beta\n    title \"Loss of rank {}\"\n    x-axis \"step\" {first} --> {last}\n    \
         y-axis \"loss\"\n    line [{}]",
        r.rank,
        values.join(", ")
    ))
}

/// A line chart over time of each rank's PSS (with its workers) and of `/dev/shm` used, in MiB,
/// when there are at least two samples. xychart has no legend: the caller lists the lines.
pub(crate) fn memory_chart(m: &MemoryReport, ranks: usize) -> Option<String> {
    if m.series.len() < 2 {
        return None;
    }
    let mib = |b: u64| sig(b as f64 / f64::from(1 << 20), 4);
    let (first, last) = (m.series[0].t_s, m.series[m.series.len() - 1].t_s);
    let mut out = format!(
        "xychart-beta\n    title \"Memory (MiB): PSS per rank, /dev/shm used\"\n    x-axis \"seconds since the \
         scenario started\" {} --> {}\n    y-axis \"MiB\"",
        sig(first, 3),
        sig(last, 3)
    );
    for rank in 0..ranks {
        let values: Vec<String> =
            m.series.iter().map(|p| mib(p.pss_bytes.get(rank).copied().unwrap_or(0))).collect();
        out.push_str(&format!("\n    line [{}]", values.join(", ")));
    }
    if m.series.iter().any(|p| p.shm_used_bytes.is_some()) {
        let values: Vec<String> = m.series.iter().map(|p| mib(p.shm_used_bytes.unwrap_or(0))).collect();
        out.push_str(&format!("\n    line [{}]", values.join(", ")));
    }
    Some(out)
}

fn ms(s: f64) -> i64 {
    (s.max(0.0) * 1000.0).round() as i64
}

/// A phase name that cannot break the task syntax (`:` separates the metadata, `#` and `;` are
/// special to mermaid).
fn task_name(phase: &str) -> String {
    let name: String = phase
        .chars()
        .map(|c| if matches!(c, ':' | ';' | '#' | '%') || c.is_control() { '-' } else { c })
        .collect();
    if name.trim().is_empty() { "(unnamed)".to_string() } else { name.trim().to_string() }
}

/// At most `max` points, evenly spread, always keeping the first and the last.
fn thin(points: &[(u64, f64)], max: usize) -> Vec<(u64, f64)> {
    if points.len() <= max {
        return points.to_vec();
    }
    let last = points.len() - 1;
    (0..max).map(|i| points[i * last / (max - 1)]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thinning_keeps_the_ends() {
        let points: Vec<(u64, f64)> = (0..1000).map(|i| (i, i as f64)).collect();
        let thinned = thin(&points, 60);
        assert_eq!(thinned.len(), 60);
        assert_eq!(thinned[0].0, 0);
        assert_eq!(thinned[59].0, 999);
    }

    #[test]
    fn task_names_cannot_break_the_syntax() {
        assert_eq!(task_name("a:b;c#d"), "a-b-c-d");
        assert_eq!(task_name("model.build/encoder"), "model.build/encoder");
    }
}
