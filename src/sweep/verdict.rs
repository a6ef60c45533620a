//! The sweep's verdict, judged from the points' summaries only: the fastest configuration that
//! passed and its ratio to the first point, scaling where the rank count varies, the memory
//! story, the configurations that failed and how. A winner is named only where the measured
//! ranges do not overlap; with one run a point there is no measure of noise, and the verdict
//! says so.

use super::record::{Failed, Fastest, MemoryStory, PointRecord, Range, Scaling, SweepVerdict};

fn passed(p: &PointRecord) -> bool {
    p.summary.runs > 0 && p.summary.failure.is_none()
}

/// Judges the points.
pub fn judge(points: &[PointRecord]) -> SweepVerdict {
    let speeds: Vec<(&PointRecord, Range)> =
        points.iter().filter(|p| passed(p)).filter_map(|p| Some((p, p.summary.samples_per_s?))).collect();
    let fastest = speeds.iter().max_by(|a, b| a.1.median.total_cmp(&b.1.median)).map(|(p, r)| {
        let first = points.first().filter(|f| passed(f)).and_then(|f| f.summary.samples_per_s);
        Fastest {
            point: p.index,
            samples_per_s: *r,
            ratio_to_first: first.filter(|f| f.median > 0.0).map(|f| r.median / f.median),
            within_noise_of: speeds
                .iter()
                .filter(|(q, s)| q.index != p.index && s.overlaps(r))
                .map(|(q, _)| q.index)
                .collect(),
        }
    });
    SweepVerdict {
        fastest,
        scaling: scaling(points),
        memory: memory(points),
        failed: points
            .iter()
            .filter_map(|p| {
                let f = p.summary.failure.as_ref()?;
                Some(Failed {
                    point: p.index,
                    outcome: f.outcome,
                    pattern: f.pattern.clone(),
                    headline: f.headline.clone(),
                    failed_runs: f.failed_runs,
                    runs: p.summary.runs,
                })
            })
            .collect(),
        noise_unknown: points.iter().any(|p| p.summary.passed_runs == 1),
        unmeasured: points.iter().filter(|p| p.summary.runs == 0).map(|p| p.index).collect(),
    }
}

/// The settings of a point other than its rank count: `launch.world_size` and any setting that
/// is the rank count under another name at every point (`-L ranks 1,2` fills `--nproc_per_node
/// {ranks}` and sets `params.ranks` with the world size).
fn others<'p>(p: &'p PointRecord, points: &[PointRecord]) -> Vec<&'p String> {
    let field = |s: &str| s.split_once('=').map_or(s, |(f, _)| f).to_string();
    let is_rank_count = |path: &str| {
        points.iter().all(|q| {
            q.settings
                .iter()
                .find(|s| field(s) == path)
                .is_some_and(|s| s.split_once('=').is_some_and(|(_, v)| v == q.world_size.to_string()))
        })
    };
    p.settings.iter().filter(|s| !s.starts_with("launch.world_size=") && !is_rank_count(&field(s))).collect()
}

fn scaling(points: &[PointRecord]) -> Vec<Scaling> {
    let Some(fewest) = points.iter().map(|p| p.world_size).min() else { return Vec::new() };
    if points.iter().all(|p| p.world_size == fewest) {
        return Vec::new();
    }
    let mut out = Vec::new();
    for p in points.iter().filter(|p| p.world_size > fewest && passed(p)) {
        let Some(base) =
            points.iter().find(|q| q.world_size == fewest && others(q, points) == others(p, points))
        else {
            continue;
        };
        let (Some(s), Some(b)) = (p.summary.samples_per_s, base.summary.samples_per_s) else { continue };
        if !passed(base) || b.median <= 0.0 {
            continue;
        }
        let speedup = s.median / b.median;
        out.push(Scaling {
            point: p.index,
            baseline: base.index,
            ranks: p.world_size,
            baseline_ranks: fewest,
            speedup,
            efficiency: speedup / (f64::from(p.world_size) / f64::from(fewest)),
            data_wait_fraction: p.summary.data_wait_fraction.map(|r| r.median),
            within_noise: s.overlaps(&b),
        });
    }
    out
}

fn memory(points: &[PointRecord]) -> MemoryStory {
    let sizes: Vec<(usize, u64)> = points
        .iter()
        .filter(|p| passed(p))
        .filter_map(|p| Some((p.index, p.summary.tree_peak_pss_bytes?.median as u64)))
        .collect();
    MemoryStory {
        smallest: sizes.iter().min_by_key(|s| s.1).copied(),
        largest: sizes.iter().max_by_key(|s| s.1).copied(),
        duplicated: points
            .iter()
            .filter(|p| p.summary.dataset.as_ref().is_some_and(|d| d.private_copies > 0))
            .map(|p| p.index)
            .collect(),
        shared: points
            .iter()
            .filter(|p| {
                p.summary.dataset.as_ref().is_some_and(|d| d.judged && d.workers > 0 && d.private_copies == 0)
            })
            .map(|p| p.index)
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::OutcomeKind;
    use crate::sweep::record::{FailureSeen, PointSummary};

    fn point(index: usize, settings: &[&str], ws: u32, samples: &[f64]) -> PointRecord {
        PointRecord {
            index,
            label: settings.join(" "),
            settings: settings.iter().map(|s| s.to_string()).collect(),
            world_size: ws,
            hash: String::new(),
            runs: Vec::new(),
            summary: PointSummary {
                runs: samples.len(),
                passed_runs: samples.len(),
                samples_per_s: Range::of(samples.iter().copied()),
                ..PointSummary::default()
            },
            dropped: Vec::new(),
        }
    }

    #[test]
    fn the_fastest_is_named_with_the_points_it_cannot_be_told_from() {
        let points = [
            point(1, &["data.workers=0"], 1, &[10.0, 11.0]),
            point(2, &["data.workers=2"], 1, &[20.0, 22.0]),
            point(3, &["data.workers=4"], 1, &[21.0, 23.0]),
        ];
        let f = judge(&points).fastest.unwrap();
        assert_eq!(f.point, 3);
        assert_eq!(f.within_noise_of, [2]);
        assert!((f.ratio_to_first.unwrap() - 22.0 / 10.5).abs() < 1e-9);
    }

    #[test]
    fn a_failed_point_is_never_the_fastest_and_keeps_its_pattern() {
        let mut hung = point(2, &["data.start_method=fork"], 1, &[]);
        hung.summary.runs = 1;
        hung.summary.failure = Some(FailureSeen {
            outcome: OutcomeKind::Hung,
            pattern: Some("fork-after-threads".into()),
            headline: "hung".into(),
            failed_runs: 1,
        });
        let v = judge(&[point(1, &["data.start_method=spawn"], 1, &[5.0]), hung]);
        assert_eq!(v.fastest.unwrap().point, 1);
        assert_eq!(v.failed[0].pattern.as_deref(), Some("fork-after-threads"));
        assert!(v.noise_unknown);
    }

    #[test]
    fn a_placeholder_that_is_the_rank_count_is_not_another_configuration() {
        let points = vec![
            point(1, &["params.ranks=1", "launch.world_size=1", "params.workers=0"], 1, &[10.0]),
            point(2, &["params.ranks=2", "launch.world_size=2", "params.workers=0"], 2, &[13.0]),
        ];
        let s = judge(&points).scaling;
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!((s[0].point, s[0].baseline), (2, 1));
        assert!((s[0].efficiency - 0.65).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn scaling_compares_each_rank_count_with_the_same_configuration_on_the_fewest_ranks() {
        let points = [
            point(1, &["data.workers=0", "launch.world_size=1"], 1, &[10.0]),
            point(2, &["data.workers=0", "launch.world_size=2"], 2, &[12.0]),
            point(3, &["data.workers=2", "launch.world_size=1"], 1, &[10.0]),
            point(4, &["data.workers=2", "launch.world_size=2"], 2, &[20.0]),
        ];
        let s = judge(&points).scaling;
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].point, s[0].baseline), (2, 1));
        assert!((s[0].efficiency - 0.6).abs() < 1e-9);
        assert_eq!((s[1].point, s[1].baseline), (4, 3));
        assert!((s[1].speedup - 2.0).abs() < 1e-9);
    }
}
