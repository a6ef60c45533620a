//! Clock calibration by round trips: an agent sends its own time, the coordinator answers with
//! its time, the agent notes when the answer came back. With `t0` (sent), `tc` (coordinator) and
//! `t1` (back), the coordinator's clock read `tc` somewhere within `[t0, t1]` of ours, so
//! `offset = tc − (t0 + t1) / 2` with an uncertainty of half the round trip. Of several samples
//! the one with the shortest round trip is kept (the least queueing). Calibrated at the start and
//! at the end of a run: the difference of the two offsets is the drift, and a time in between is
//! placed by interpolating the offset.

pub use crate::schema::{Calibration, Offset};

/// One round trip, in nanoseconds of the agent's clock (`t0`, `t1`) and the coordinator's (`tc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub t0: i64,
    pub tc: i64,
    pub t1: i64,
}

impl Sample {
    pub fn rtt_ns(&self) -> i64 {
        (self.t1 - self.t0).max(0)
    }
}

/// The offset from the sample with the shortest round trip; `None` without samples.
pub fn estimate(samples: &[Sample]) -> Option<Offset> {
    let best = samples.iter().min_by_key(|s| s.rtt_ns())?;
    let mid = best.t0 + best.rtt_ns() / 2;
    Some(Offset {
        offset_ms: (best.tc - mid) as f64 / 1e6,
        uncertainty_ms: best.rtt_ns() as f64 / 2e6,
        at_ns: mid,
        samples: samples.len() as u32,
    })
}

/// The wall clock in nanoseconds since the Unix epoch, plus the offset a test injects
/// ([`SKEW_ENV`]) to play a node whose clock is wrong.
pub fn now_ns() -> i64 {
    let real =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64);
    real + injected_skew_ns()
}

/// The wall clock ([`now_ns`]) at `instant`, from a reading of both clocks side by side: the one
/// of a few whose two monotonic reads around the wall clock's lie closest together. Subtracting
/// an event's age from a later wall-clock reading is off by whatever delayed that reading, and
/// puts every time of the node that much late (a rank's end once showed 1.5 ms after the other
/// node had learnt of it, both nodes on one 2-core machine).
pub fn wall_ns_of(instant: std::time::Instant) -> i64 {
    let mut best: Option<(std::time::Duration, i64)> = None;
    for _ in 0..8 {
        let before = std::time::Instant::now();
        let wall = now_ns();
        let after = std::time::Instant::now();
        let gap = after - before;
        let age = (before + gap / 2).saturating_duration_since(instant).as_nanos() as i64;
        if best.is_none_or(|(g, _)| gap < g) {
            best = Some((gap, wall - age));
        }
        if gap < std::time::Duration::from_micros(20) {
            break;
        }
    }
    best.map_or_else(now_ns, |(_, ns)| ns)
}

/// Test mode: milliseconds added to every time this agent reads (`UPS_DOCTOR_NODE_CLOCK_SKEW_MS`),
/// as if its clock were that far ahead; calibration must take it out again.
pub const SKEW_ENV: &str = "UPS_DOCTOR_NODE_CLOCK_SKEW_MS";

fn injected_skew_ns() -> i64 {
    static SKEW: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *SKEW.get_or_init(|| {
        std::env::var(SKEW_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(0, |ms| (ms * 1e6) as i64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shortest_round_trip_wins_and_half_of_it_is_the_uncertainty() {
        // The coordinator is 500 ms ahead. A slow sample (10 ms each way) and a fast one (1 ms).
        let ms = 1_000_000;
        let slow = Sample { t0: 0, tc: 10 * ms + 500 * ms, t1: 20 * ms };
        let fast = Sample { t0: 100 * ms, tc: 101 * ms + 500 * ms, t1: 102 * ms };
        let o = estimate(&[slow, fast]).unwrap();
        assert_eq!(o.offset_ms, 500.0);
        assert_eq!(o.uncertainty_ms, 1.0);
        assert_eq!(o.samples, 2);
        assert!(estimate(&[]).is_none());
    }

    #[test]
    fn an_asymmetric_trip_stays_within_the_stated_uncertainty() {
        let ms = 1_000_000;
        // True offset -200 ms; the answer was read 0.2 ms after sending, back 3.8 ms later.
        let s = Sample { t0: 0, tc: (0.2 * ms as f64) as i64 - 200 * ms, t1: 4 * ms };
        let o = estimate(&[s]).unwrap();
        assert!((o.offset_ms - -200.0).abs() <= o.uncertainty_ms, "{o:?}");
    }

    #[test]
    fn drift_is_interpolated_between_the_two_calibrations() {
        let at = |ms: i64, offset: f64, u: f64| Offset {
            offset_ms: offset,
            uncertainty_ms: u,
            at_ns: ms * 1_000_000,
            samples: 8,
        };
        let c = Calibration { start: at(0, 10.0, 0.1), end: Some(at(1000, 12.0, 0.3)) };
        assert_eq!(c.drift_ms(), Some(2.0));
        assert_eq!(c.offset_at(500 * 1_000_000), 11.0);
        assert_eq!(c.offset_at(-5), 10.0);
        assert_eq!(c.offset_at(5_000 * 1_000_000), 12.0);
        assert_eq!(c.uncertainty_ms(), 0.3);
        assert_eq!(c.to_coordinator_ns(500 * 1_000_000), 511 * 1_000_000);
        let open = Calibration { start: at(0, 10.0, 0.1), end: None };
        assert_eq!(open.offset_at(9_000_000_000), 10.0);
        assert_eq!(open.drift_ms(), None);
    }
}
