//! Mermaid charts that GitHub renders inline: a gantt of every rank's phases and a line chart of
//! the loss. Each function returns the diagram source, or `None` when there is nothing to draw.

use std::fmt::Write;

use crate::schema::{MemoryReport, RankResult, ScenarioResult};

use super::text::sig;

/// Fewest losses worth a chart (500 px high): fewer are written out in a line instead
/// ([`loss_line`]).
pub(crate) const MIN_LOSS_POINTS: usize = 6;

/// The losses of a rank too few for a chart, as a line: `Loss of rank 0: 3.2 (step 0) → 19.1 (step
/// 1) → 2.8 (step 2).`
pub(crate) fn loss_line(r: &RankResult) -> Option<String> {
    let points: Vec<(u64, f64)> = r.losses.iter().copied().filter(|(_, l)| l.is_finite()).collect();
    if points.is_empty() || points.len() >= MIN_LOSS_POINTS {
        return None;
    }
    let steps: Vec<String> = points.iter().map(|(s, l)| format!("{} (step {s})", sig(*l, 4))).collect();
    Some(format!("Loss of rank {}: {}.", r.rank, steps.join(" → ")))
}

/// Most points drawn in the loss chart; longer series are thinned evenly.
const MAX_LOSS_POINTS: usize = 60;

/// Colours of an xychart's lines, in drawing order: each has at least 3:1 contrast against
/// GitHub's light (`#ffffff`) and dark (`#0d1117`) page, where mermaid's own first colour
/// (`#ECECFF`) is invisible on white. [`LEGEND`] names them with the matching coloured squares.
pub(crate) const PALETTE: [&str; 6] = ["#2f81f7", "#e5534b", "#1a7f37", "#db6d28", "#8250df", "#bf8700"];

/// The coloured square that stands for `PALETTE[i]` in a chart's legend.
pub(crate) const LEGEND: [&str; 6] = ["🟦", "🟥", "🟩", "🟧", "🟪", "🟨"];

/// The first line of every xychart: the palette, for whichever theme GitHub renders with.
fn xychart_init() -> String {
    format!(
        "%%{{init: {{\"themeVariables\": {{\"xyChart\": {{\"plotColorPalette\": \"{}\"}}}}}}}}%%",
        PALETTE.join(", ")
    )
}

/// `🟦 rank 0 · 🟥 /dev/shm used`: the legend xychart does not draw, one entry per line in drawing
/// order.
pub(crate) fn legend(names: &[String]) -> String {
    names
        .iter()
        .enumerate()
        .map(|(i, n)| format!("{}\u{a0}{n}", LEGEND[i % LEGEND.len()]))
        .collect::<Vec<_>>()
        .join(" · ")
}

/// Narrowest bar of the gantt, as a share of its time span: a shorter phase is drawn this wide
/// (about 4 px in GitHub's column) and its name says how long it really took.
const MIN_BAR_SHARE: f64 = 0.005;

/// Runs shorter than this get a millisecond axis: `%s` floors to whole seconds, and the ticks of
/// a shorter span are less than a second apart.
const MS_AXIS_BELOW_S: f64 = 20.0;

/// A gantt of each rank's `timeline`, one section per rank. A phase that never ended runs to the
/// rank's end (or its last marker, or the scenario's wall time) and is marked `crit`.
///
/// Times are milliseconds since the epoch standing for the scenario's start, labelled with
/// `%s`/`%Q` (seconds or milliseconds since the epoch): those count the same in every time zone
/// and do not wrap after a minute, where `%S` (the seconds field of the viewer's local time)
/// did both.
/// Most ranks the timeline draws one by one.
const DRAWN_MAX: usize = 16;

/// The ranks the timeline draws, each with how many more it stands for: all of them up to
/// [`DRAWN_MAX`]; beyond, the first rank of each class that ended the same way at the same place
/// (and the first failure alone), at most [`DRAWN_MAX`] classes — a chart of 4,096 rows was most
/// of a report's length and no viewer draws it.
fn drawn<'a>(s: &ScenarioResult, ranks: Vec<&'a RankResult>) -> Vec<(&'a RankResult, usize)> {
    if ranks.len() <= DRAWN_MAX {
        return ranks.into_iter().map(|r| (r, 0)).collect();
    }
    let mut classes: Vec<(&RankResult, usize)> = Vec::new();
    let mut index: std::collections::HashMap<_, usize> = std::collections::HashMap::new();
    for r in ranks {
        let key = (s.first_failure == Some(r.rank), r.outcome, r.last_phase.clone(), r.last_step);
        match index.get(&key) {
            Some(&i) => classes[i].1 += 1,
            None => {
                index.insert(key, classes.len());
                classes.push((r, 0));
            }
        }
    }
    classes.truncate(DRAWN_MAX);
    classes
}

pub(crate) fn timeline(s: &ScenarioResult) -> Option<String> {
    let ranks: Vec<&RankResult> = s.ranks.iter().filter(|r| !r.timeline.is_empty()).collect();
    if ranks.is_empty() {
        return None;
    }
    let span_end =
        |r: &RankResult, end: Option<f64>| end.or(r.ended_at_s).or(r.last_marker_at_s).unwrap_or(s.wall_s);
    let latest =
        ranks.iter().flat_map(|r| r.timeline.iter().map(|p| span_end(r, p.end_s))).fold(0.0_f64, f64::max);
    let (axis, unit) = if latest < MS_AXIS_BELOW_S { ("%Q", "milliseconds") } else { ("%s", "seconds") };
    let min_bar = ((latest * 1000.0 * MIN_BAR_SHARE).round() as i64).max(1);
    let ranks = drawn(s, ranks);
    let mut out = String::new();
    let _ = writeln!(out, "gantt");
    let _ = writeln!(out, "    title Phases per rank ({unit} since the scenario started)");
    let _ = writeln!(out, "    dateFormat x");
    let _ = writeln!(out, "    axisFormat {axis}");
    let _ = writeln!(out, "    todayMarker off");
    for (r, like) in ranks {
        match like {
            0 => {
                let _ = writeln!(out, "    section rank {}", r.rank);
            }
            n => {
                let _ = writeln!(out, "    section rank {} and {n} more like it", r.rank);
            }
        }
        for span in folded(&r.timeline) {
            let start = ms(span.start_s);
            let real_end = ms(span_end(r, span.end_s)).max(start);
            let end = real_end.max(start.saturating_add(min_bar));
            let mut name = task_name(&span.phase);
            if end > real_end {
                name.push_str(&format!(" ({} ms)", real_end - start));
            }
            if span.end_s.is_some() {
                let _ = writeln!(out, "    {name} :{start}, {end}");
            } else {
                let _ = writeln!(out, "    {name} (never ended) :crit, {start}, {end}");
            }
        }
        // The moments that matter, as milestones: the hang declared, the moment the program's
        // own code had finished (its exit handlers ran) and the rank's end, when it did not pass.
        if let (Some(at), Some(after)) = (super::text::hang_declared_at(r, s.wall_s), r.hang_detected_after_s)
        {
            let _ = writeln!(
                out,
                "{}",
                milestone(&format!("hang declared ({after:.0} s silent)"), ms(at), latest)
            );
        }
        if r.outcome != crate::scenario::OutcomeKind::Passed {
            if let Some(at) = r.observed.as_ref().and_then(|o| o.exiting_at_s) {
                let _ = writeln!(out, "{}", milestone("program finished", ms(at), latest));
            }
            if let Some(at) = r.ended_at_s {
                let _ = writeln!(out, "{}", milestone(&task_name(&end_label(r)), ms(at), latest));
            }
        }
    }
    Some(out.trim_end().to_string())
}

/// Pixels of the narrowest column a gantt is read in (GitHub's, a phone's excepted) and of one
/// character of a milestone's label.
const GANTT_PX: f64 = 700.0;
const LABEL_CHAR_PX: f64 = 6.5;

/// A milestone at `t` ms, on a chart whose tasks end at `latest_s`. Mermaid draws a milestone
/// at the middle of its start and end, and its label to the right when there is room before the
/// chart's edge: one near the end gets a span around `t` wide enough for the label to fit after
/// it (the axis grows by half of it), instead of a label drawn across its own diamond and cut off
/// at the edge.
fn milestone(label: &str, t: i64, latest_s: f64) -> String {
    let span = (latest_s * 1000.0).max(1.0);
    let share = ((label.chars().count() as f64 * LABEL_CHAR_PX + 24.0) / GANTT_PX).min(0.45);
    // The room on the right that the label needs, in ms of the axis once it has grown.
    let room = span * share / (1.0 - share);
    // Symmetric about `t` (never before 0), so that the diamond stays exactly at `t`.
    let half = if (t as f64) + room > span { (room.ceil() as i64).min(t.max(0)) } else { 0 };
    let (start, end) = (t - half, t.saturating_add(half));
    format!("    {label} :milestone, crit, {start}, {end}")
}

/// How a rank's end reads on its milestone: `killed by SIGSEGV`, `exit 1`, `SIGTERM from
/// ups-doctor`.
fn end_label(r: &RankResult) -> String {
    match (r.signal, r.exit_code, r.torn_down_with) {
        (Some(sig), _, Some(sent)) if sig == sent => format!("{} from ups-doctor", sig.name()),
        (Some(sig), _, _) => format!("killed by {}", sig.name()),
        (None, Some(code), _) => format!("exit {code}"),
        (None, None, Some(sent)) => format!("{} sent by ups-doctor", sent.name()),
        (None, None, None) => "ended".to_string(),
    }
}

/// The timeline with its start-up folded: the phases that ended before training began (model
/// building block by block, data generation, …; two or more of them) become one `start-up` bar
/// that names the longest. A phase that never ended, and checkpoints, stay on their own.
fn folded(timeline: &[crate::schema::PhaseSpan]) -> Vec<crate::schema::PhaseSpan> {
    let train_at = timeline.iter().position(|p| p.phase == "train").unwrap_or(timeline.len());
    let foldable = |p: &crate::schema::PhaseSpan| p.end_s.is_some() && !p.phase.starts_with("checkpoint.");
    let startup: Vec<&crate::schema::PhaseSpan> =
        timeline[..train_at].iter().filter(|p| foldable(p)).collect();
    if startup.len() < 2 {
        return timeline.to_vec();
    }
    let start = startup.iter().map(|p| p.start_s).fold(f64::INFINITY, f64::min);
    let end = startup.iter().filter_map(|p| p.end_s).fold(f64::NEG_INFINITY, f64::max);
    let longest = startup
        .iter()
        .max_by(|a, b| {
            (a.end_s.unwrap_or(a.start_s) - a.start_s).total_cmp(&(b.end_s.unwrap_or(b.start_s) - b.start_s))
        })
        .expect("two or more");
    let longest_s = longest.end_s.unwrap_or(longest.start_s) - longest.start_s;
    let mut out = vec![crate::schema::PhaseSpan {
        phase: format!("start-up, {} phases (longest {} {:.2} s)", startup.len(), longest.phase, longest_s),
        start_s: start,
        end_s: Some(end),
    }];
    out.extend(timeline[..train_at].iter().filter(|p| !foldable(p)).cloned());
    out.extend(timeline[train_at..].iter().cloned());
    out
}

/// Fewer steps than this are drawn on a categorical axis (one label per step); a numeric axis
/// over so short a range would tick at fractions of a step.
const CATEGORICAL_BELOW: u64 = 10;

/// An xychart's x axis over steps, with whole-step labels only.
fn step_axis(points: &[(u64, f64)]) -> String {
    // The extremes, not the ends: a hand-edited or damaged result.json may list steps out of order.
    let first = points.iter().map(|p| p.0).min().unwrap_or(0);
    let last = points.iter().map(|p| p.0).max().unwrap_or(0);
    if last - first < CATEGORICAL_BELOW {
        let steps: Vec<String> = points.iter().map(|(s, _)| s.to_string()).collect();
        format!("x-axis \"step\" [{}]", steps.join(", "))
    } else {
        format!("x-axis \"step\" {first} --> {last}")
    }
}

/// A line chart of one rank's loss per step, when it has at least two finite points.
pub(crate) fn loss_chart(r: &RankResult) -> Option<String> {
    let points: Vec<(u64, f64)> = r.losses.iter().copied().filter(|(_, l)| l.is_finite()).collect();
    if points.len() < MIN_LOSS_POINTS {
        return None;
    }
    let points = thin(&points, MAX_LOSS_POINTS);
    let values: Vec<String> = points.iter().map(|(_, l)| sig(*l, 4)).collect();
    Some(format!(
        "{}\nxychart-beta\n    title \"Loss of rank {}\"\n    {}\n    y-axis \"loss\"\n    line [{}]",
        xychart_init(),
        r.rank,
        step_axis(&points),
        values.join(", ")
    ))
}

/// A memory chart and the names of its lines, in drawing order.
pub(crate) struct MemoryChart {
    pub(crate) source: String,
    pub(crate) lines: Vec<String>,
    /// Seconds since the scenario started of the first and last sample drawn.
    pub(crate) window: (f64, f64),
    /// `/dev/shm` used over the same window, on its own axis (0 to its size), when it was ever
    /// in use.
    pub(crate) shm: Option<String>,
}

/// A line chart over time of each rank's PSS (with its workers), in MiB, and one of `/dev/shm`.
/// Only samples taken while every rank's process existed are drawn (a process that does not exist
/// has no memory, not 0 MiB); failing two such samples, those where any did. The `/dev/shm` chart
/// is drawn only when something was ever in use there. `None` with fewer than two samples.
pub(crate) fn memory_chart(m: &MemoryReport, ranks: usize) -> Option<MemoryChart> {
    let alive = |p: &crate::schema::MemoryPoint, all: bool| {
        let mut each = (0..ranks).map(|r| p.pss_bytes.get(r).copied().unwrap_or(0) > 0);
        if all { each.all(|a| a) } else { each.any(|a| a) }
    };
    let mut series: Vec<_> = m.series.iter().filter(|p| alive(p, true)).collect();
    if series.len() < 2 {
        series = m.series.iter().filter(|p| alive(p, false)).collect();
    }
    if series.len() < 2 {
        return None;
    }
    let mib = |b: u64| sig(b as f64 / f64::from(1 << 20), 4);
    let (first, last) = (series[0].t_s, series[series.len() - 1].t_s);
    // Seconds on the time axis: to a tenth from 10 s on, so that rounding never puts the axis's
    // end past the scenario's (three significant digits made a last sample at 301.82 s "302").
    let axis = |t: f64| if t >= 10.0 { format!("{t:.1}") } else { sig(t, 3) };
    let mut out = format!(
        "{}\nxychart-beta\n    title \"Memory (MiB)\"\n    x-axis \"seconds since the scenario started\" {} \
         --> {}\n    y-axis \"MiB\"",
        xychart_init(),
        axis(first),
        axis(last)
    );
    let mut lines = Vec::new();
    for rank in 0..ranks {
        let values: Vec<String> =
            series.iter().map(|p| mib(p.pss_bytes.get(rank).copied().unwrap_or(0))).collect();
        out.push_str(&format!("\n    line [{}]", values.join(", ")));
        lines.push(format!("PSS of rank {rank} with its workers"));
    }
    // `/dev/shm` on an axis of its own, from 0 to its size: a few MiB next to hundreds of MiB of
    // PSS would draw as a flat line at zero however full it was.
    let shm = series.iter().any(|p| p.shm_used_bytes.unwrap_or(0) > 0).then(|| {
        let values: Vec<String> = series.iter().map(|p| mib(p.shm_used_bytes.unwrap_or(0))).collect();
        let top = m.shm.total_bytes.map(|t| format!(" 0 --> {}", mib(t))).unwrap_or_default();
        format!(
            "{}\nxychart-beta\n    title \"/dev/shm used (MiB)\"\n    x-axis \"seconds since the scenario started\" {} \
             --> {}\n    y-axis \"MiB\"{top}\n    line [{}]",
            xychart_init(),
            axis(first),
            axis(last),
            values.join(", ")
        )
    });
    Some(MemoryChart { source: out, lines, window: (first, last), shm })
}

/// A bar per sweep point (`(point number, value)`, `None`: the point has no figure, it failed),
/// from 0: the sweep's comparison at a glance. `None` when fewer than two points have a figure.
pub(crate) fn point_bars(title: &str, unit: &str, points: &[(usize, Option<f64>)]) -> Option<String> {
    if points.iter().filter(|(_, v)| v.is_some()).count() < 2 {
        return None;
    }
    let top = points.iter().filter_map(|(_, v)| *v).fold(0.0_f64, f64::max);
    let names: Vec<String> = points.iter().map(|(i, _)| format!("\"{i}\"")).collect();
    let values: Vec<String> = points.iter().map(|(_, v)| sig(v.unwrap_or(0.0), 4)).collect();
    Some(format!(
        "{}\nxychart-beta\n    title \"{title}\"\n    x-axis \"point\" [{}]\n    y-axis \"{unit}\" 0 --> {}\n    \
         bar [{}]",
        xychart_init(),
        names.join(", "),
        sig(top * 1.1, 3),
        values.join(", ")
    ))
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

    /// A run the time limit ended at 301.9 s, last sampled at 301.82 s: three significant digits
    /// made the axis end at 302 s, past the scenario's end (caught by tests/consistency.rs).
    #[test]
    fn the_memory_charts_time_axis_never_rounds_past_its_last_sample() {
        let point = |t_s: f64| crate::schema::MemoryPoint {
            t_s,
            pss_bytes: vec![1 << 30],
            shm_used_bytes: Some(1 << 20),
        };
        let m = MemoryReport {
            series: vec![point(0.254), point(150.0), point(301.82)],
            ..MemoryReport::default()
        };
        let chart = memory_chart(&m, 1).unwrap();
        for source in [&chart.source, chart.shm.as_ref().unwrap()] {
            assert!(
                source.contains("x-axis \"seconds since the scenario started\" 0.254 --> 301.8\n"),
                "{source}"
            );
        }
        let m = MemoryReport { series: vec![point(0.25), point(5.25)], ..MemoryReport::default() };
        assert!(memory_chart(&m, 1).unwrap().source.contains("0.25 --> 5.25\n"));
    }

    #[test]
    fn point_bars_draw_a_bar_per_point_with_a_failed_one_at_zero_and_need_two_figures() {
        let chart =
            point_bars("Throughput", "samples/s", &[(1, Some(181.0)), (2, Some(241.0)), (3, None)]).unwrap();
        assert!(chart.contains("x-axis \"point\" [\"1\", \"2\", \"3\"]"), "{chart}");
        assert!(chart.contains("y-axis \"samples/s\" 0 --> 265"), "{chart}");
        assert!(chart.ends_with("bar [181, 241, 0]"), "{chart}");
        assert_eq!(point_bars("Throughput", "samples/s", &[(1, Some(181.0)), (2, None)]), None);
    }

    #[test]
    fn thinning_keeps_the_ends() {
        let points: Vec<(u64, f64)> = (0..1000).map(|i| (i, i as f64)).collect();
        let thinned = thin(&points, 60);
        assert_eq!(thinned.len(), 60);
        assert_eq!(thinned[0].0, 0);
        assert_eq!(thinned[59].0, 999);
    }

    #[test]
    fn a_rank_that_crashed_after_its_program_finished_shows_both_moments() {
        let mut s = crate::report::fixtures::segv();
        s.ranks[1].observed =
            Some(crate::schema::ObservedProgram { exiting_at_s: Some(1.25), ..Default::default() });
        let chart = timeline(&s).unwrap();
        let lines: Vec<&str> = chart.lines().collect();
        let at = |label: &str| lines.iter().position(|l| l.trim_start().starts_with(label));
        let (finished, killed) =
            (at("program finished :milestone").unwrap(), at("killed by SIGSEGV").unwrap());
        assert!(finished < killed, "{chart}");
        assert!(lines[..finished].iter().any(|l| l.trim() == "section rank 1"), "{chart}");
        assert!(lines[finished].contains("1250"), "{chart}");
        // A rank that passed gets none: its exit handlers running is how every program ends.
        s.ranks[1] = crate::report::fixtures::passing().ranks[0].clone();
        s.ranks[1].observed =
            Some(crate::schema::ObservedProgram { exiting_at_s: Some(1.25), ..Default::default() });
        assert!(!timeline(&s).unwrap().contains("program finished"));
    }

    #[test]
    fn task_names_cannot_break_the_syntax() {
        assert_eq!(task_name("a:b;c#d"), "a-b-c-d");
        assert_eq!(task_name("model.build/encoder"), "model.build/encoder");
    }
}
