//! What the harness knows about a rank from its markers so far. Pure: markers in, state out.

use serde::{Deserialize, Serialize};

use crate::protocol::{Frame, Marker};

use crate::schema::{ObservedProgram, PhaseSpan, ThreadStack, WorkerInfo};

/// Losses kept per rank; longer runs are thinned to every k-th step.
const MAX_LOSSES: usize = 500;

/// Phase spans kept per rank: a program beginning new phases without end (a flood of `begin`
/// markers) cannot grow the timeline without bound.
pub const MAX_SPANS: usize = 4096;

/// Accumulated evidence about one rank. Times are seconds since the scenario started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RankState {
    pub markers: u64,
    pub bad_markers: u64,
    /// Markers dropped unread: they came faster than they could be folded in (the queue is
    /// bounded, see `harness::os::process::Sink`).
    pub dropped_markers: u64,
    /// Pids that `worker` markers named but that are not this run's processes (bad markers).
    pub foreign_pids: Vec<u32>,
    pub last_marker_at: Option<f64>,
    pub pid: Option<u32>,
    pub intra_op_threads: Option<i64>,
    /// The device the rank trains on (`cpu`, `cuda:0`), from its `start` marker.
    pub device: Option<String>,
    /// The last phase begun and its step.
    pub phase: Option<String>,
    pub step: Option<u64>,
    pub timeline: Vec<PhaseSpan>,
    pub steps_done: u64,
    pub losses: Vec<(u64, f64)>,
    loss_stride: u64,
    /// When each step ended (step, seconds), thinned as `losses` are.
    pub step_ends: Vec<(u64, f64)>,
    step_stride: u64,
    pub first_loss: Option<f64>,
    pub last_loss: Option<f64>,
    pub data_ms: f64,
    pub compute_ms: f64,
    pub samples: u64,
    /// When the first per-step phase began and the last step ended.
    pub train_started_at: Option<f64>,
    pub last_step_at: Option<f64>,
    pub done: bool,
    /// The parameter checksum the rank reported at the end of training.
    pub checksum: Option<String>,
    pub optimizer_state_bytes: Option<u64>,
    pub error: Option<String>,
    pub crash_signal: Option<i32>,
    pub raw_backtrace: Vec<String>,
    pub backtrace: Vec<Frame>,
    pub stacks: Vec<ThreadStack>,
    pub stacks_complete: bool,
    /// `stack_end` markers received: one per process (rank or worker) that finished its dump.
    pub stack_ends: u32,
    /// Data-loader workers this rank started, in start order.
    pub workers: Vec<WorkerInfo>,
    pub dataset: Option<DatasetInfo>,
    /// What the observer in a user's Python program reported.
    pub observed: Option<ObservedProgram>,
}

/// The rank's dataset cache.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetInfo {
    pub bytes: u64,
    pub cache: String,
}

/// Phases repeated every step (`data.next`, `forward`, `allreduce`, …) are drawn as one `train`
/// span in the timeline; checkpoint saves stand out on their own.
fn collapses_into_train(phase: &str, step: Option<u64>) -> bool {
    step.is_some() && !phase.starts_with("checkpoint.")
}

/// Keeps `(step, value)` for one step in every `stride`: the first seen of each run of `stride`
/// step numbers, so that markers whose numbers skip (the observer's, each saying several steps; a
/// helper's loss logged every 10th step) are still kept once the stride has grown. At
/// [`MAX_LOSSES`] points it keeps every other one and doubles the stride.
fn keep_thinned<T>(points: &mut Vec<(u64, T)>, stride: &mut u64, step: u64, value: T) {
    let every = (*stride).max(1);
    if points.last().is_none_or(|&(last, _)| step / every != last / every) {
        points.push((step, value));
    }
    if points.len() >= MAX_LOSSES {
        *stride = every * 2;
        let mut i = 0;
        points.retain(|_| {
            i += 1;
            i % 2 == 1
        });
    }
}

impl RankState {
    /// Folds one marker written at `at` (its writer's stamp, else when it was read) into the state.
    pub fn apply(&mut self, at: f64, marker: Marker) {
        self.markers += 1;
        // A stack dump is written because ups-doctor asked for it (the hang was already declared,
        // or the run is being torn down): it is not progress, and counting it would put the
        // rank's last marker after the hang was declared.
        // Never earlier than one already seen: the observer's step marker carries its newest
        // step's stamp, and may go out before markers stamped a little earlier.
        if !matches!(marker, Marker::Stack { .. } | Marker::StackEnd { .. }) {
            self.last_marker_at = Some(self.last_marker_at.map_or(at, |last| last.max(at)));
        }
        if ObservedProgram::apply(&mut self.observed, at, &marker) {
            return;
        }
        match marker {
            Marker::Start { pid, intra_op_threads, device, .. } => {
                self.pid = Some(pid);
                self.device = Some(device);
                self.intra_op_threads = Some(intra_op_threads);
            }
            Marker::Begin { phase, step } => {
                if collapses_into_train(&phase, step) {
                    if self.train_started_at.is_none() {
                        self.train_started_at = Some(at);
                        self.timeline.push(PhaseSpan { phase: "train".into(), start_s: at, end_s: None });
                    } else if let Some(span) = self.timeline.iter_mut().rev().find(|s| s.phase == "train") {
                        // A step began: training is under way again until its `step` marker, so
                        // a rank that dies or hangs inside a step shows `train` as never ended.
                        span.end_s = None;
                    }
                } else if self.timeline.len() < MAX_SPANS {
                    self.timeline.push(PhaseSpan { phase: phase.clone(), start_s: at, end_s: None });
                }
                self.phase = Some(phase);
                self.step = step;
            }
            Marker::End { phase, step, .. } => {
                if !collapses_into_train(&phase, step)
                    && let Some(span) = self.timeline.iter_mut().rev().find(|s| s.phase == phase)
                {
                    span.end_s = Some(at);
                }
            }
            Marker::Step { step, loss, data_ms, compute_ms, samples } => {
                self.steps_done = step + 1;
                self.record_step_end(step, at);
                // A step without a loss (the observer's: it cannot see the loss) still has its time.
                self.data_ms += data_ms;
                self.compute_ms += compute_ms;
                self.samples += samples;
                self.last_step_at = Some(at);
                if self.train_started_at.is_none() {
                    self.train_started_at = Some(at);
                    self.timeline.push(PhaseSpan { phase: "train".into(), start_s: at, end_s: None });
                }
                if let Some(span) = self.timeline.iter_mut().rev().find(|s| s.phase == "train") {
                    span.end_s = Some(at);
                }
                // JSON has no NaN: a non-finite loss would not survive result.json. The trainer
                // stops on one before reporting the step, so this only guards foreign writers.
                let Some(loss) = loss.is_finite().then_some(loss) else {
                    return;
                };
                self.first_loss.get_or_insert(loss);
                self.last_loss = Some(loss);
                self.record_loss(step, loss);
            }
            // Its time is all a progress marker is for (it moved `last_marker_at` above).
            Marker::Progress { .. } => {}
            Marker::Done { checksum, optimizer_state_bytes, .. } => {
                self.done = true;
                self.checksum = checksum;
                self.optimizer_state_bytes = optimizer_state_bytes;
            }
            Marker::Error { message } => self.error = Some(message),
            Marker::CrashRaw { signal, addrs } => {
                self.crash_signal = Some(signal);
                self.raw_backtrace = addrs;
            }
            Marker::Crash { signal, frames } => {
                self.crash_signal = Some(signal);
                self.backtrace = frames;
            }
            Marker::Stack { tid, thread, frames } => {
                self.stacks.push(ThreadStack { tid, thread, frames });
            }
            Marker::StackEnd { .. } => {
                self.stacks_complete = true;
                self.stack_ends += 1;
            }
            Marker::Worker { id, pid, start_method } => {
                self.workers.push(WorkerInfo { id, pid, start_method, started_at_s: at })
            }
            Marker::Dataset { bytes, cache } => self.dataset = Some(DatasetInfo { bytes, cache }),
            // Folded into `observed` above.
            Marker::Group { .. }
            | Marker::Starts { .. }
            | Marker::Joining { .. }
            | Marker::Collective { .. }
            | Marker::Issued { .. }
            | Marker::Observer { .. }
            | Marker::Torch { .. } => {}
        }
    }

    /// Folds in a marker written after ups-doctor began tearing the rank down: it answers the
    /// teardown, so it is not progress, nor the program finishing by itself. A program whose
    /// SIGTERM handler exits cleanly (Ray's workers, Lightning's) runs its exit handlers then, and
    /// the observer's last summary says `exiting`; counted, the rank's last marker would come
    /// after the silence that was declared, and the judge would order the hung ranks by how
    /// fast each answered the SIGTERM.
    pub fn apply_answering_teardown(&mut self, at: f64, marker: Marker) {
        let last = self.last_marker_at;
        let exiting = self.observed.as_ref().and_then(|o| o.exiting_at_s);
        self.apply(at, marker);
        self.last_marker_at = last;
        if let Some(o) = self.observed.as_mut() {
            o.exiting_at_s = exiting;
        }
    }

    /// Counts a line on the marker pipe that was not a marker.
    pub fn apply_bad(&mut self, at: f64) {
        self.bad_markers += 1;
        self.last_marker_at = Some(self.last_marker_at.map_or(at, |last| last.max(at)));
    }

    /// Steps the rank's observer counted in its own memory, read after the rank ended (`at`: when
    /// the last of them ended, where its stamp could be read): more than its markers said when it
    /// died before sending the last ones. The steps only the count knows carry no times.
    pub fn counted_steps(&mut self, steps: u64, at: Option<f64>) {
        // The observer's own figure too, whether or not its step markers got through: its last
        // summary may have been lost where the step markers were not (a segfault between them).
        if let Some(o) = self.observed.as_mut() {
            o.steps = o.steps.max(steps);
        }
        if steps <= self.steps_done {
            return;
        }
        self.steps_done = steps;
        if let Some(at) = at {
            self.record_step_end(steps - 1, at);
            self.last_step_at = Some(at);
        }
    }

    /// The file the rank's observer kept its newest collectives in was read after it ended.
    pub fn kept_read(&mut self) {
        if let Some(o) = self.observed.as_mut() {
            o.kept = true;
        }
    }

    /// A collective the rank's observer kept in its own memory, read after the rank ended
    /// (issued at `at`, where its stamp could be read): see [`ObservedProgram::apply_kept`].
    pub fn kept_collective(&mut self, at: f64, marker: &Marker) {
        ObservedProgram::apply_kept(&mut self.observed, at, marker);
    }

    fn record_step_end(&mut self, step: u64, at: f64) {
        keep_thinned(&mut self.step_ends, &mut self.step_stride, step, at);
    }

    fn record_loss(&mut self, step: u64, loss: f64) {
        keep_thinned(&mut self.losses, &mut self.loss_stride, step, loss);
    }

    /// Optimizer steps per second over the training loop.
    pub fn steps_per_s(&self) -> Option<f64> {
        let (start, end) = (self.train_started_at?, self.last_step_at?);
        (end > start && self.steps_done > 0).then(|| self.steps_done as f64 / (end - start))
    }

    /// Samples per second over the training loop.
    pub fn samples_per_s(&self) -> Option<f64> {
        let (start, end) = (self.train_started_at?, self.last_step_at?);
        (end > start && self.samples > 0).then(|| self.samples as f64 / (end - start))
    }

    /// Fraction of step time spent waiting for data.
    pub fn data_wait_fraction(&self) -> Option<f64> {
        let total = self.data_ms + self.compute_ms;
        (total > 0.0).then(|| self.data_ms / total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn begin(phase: &str, step: Option<u64>) -> Marker {
        Marker::Begin { phase: phase.into(), step }
    }

    #[test]
    fn tracks_last_phase_and_folds_steps_into_one_train_span() {
        let mut s = RankState::default();
        s.apply(0.1, begin("data.generate", None));
        s.apply(0.2, Marker::End { phase: "data.generate".into(), step: None, ms: 100.0 });
        s.apply(0.3, begin("data.next", Some(0)));
        s.apply(0.4, begin("forward", Some(0)));
        s.apply(0.5, Marker::Step { step: 0, loss: 1.0, data_ms: 10.0, compute_ms: 30.0, samples: 8 });
        s.apply(0.6, begin("forward", Some(1)));
        assert_eq!(s.phase.as_deref(), Some("forward"));
        assert_eq!(s.step, Some(1));
        assert_eq!(s.steps_done, 1);
        assert_eq!(s.timeline.len(), 2);
        assert_eq!(s.timeline[0].end_s, Some(0.2));
        assert_eq!(s.timeline[1].phase, "train");
        // Inside step 1: training has not ended.
        assert_eq!(s.timeline[1].end_s, None);
        assert_eq!(s.data_wait_fraction(), Some(0.25));
        s.apply(0.7, Marker::Step { step: 1, loss: 0.9, data_ms: 10.0, compute_ms: 30.0, samples: 8 });
        assert_eq!(s.timeline[1].end_s, Some(0.7));
        assert_eq!(s.step_ends, [(0, 0.5), (1, 0.7)]);
    }

    #[test]
    fn a_stack_dump_is_not_progress() {
        let mut s = RankState::default();
        s.apply(1.0, begin("forward", Some(0)));
        s.apply(9.0, Marker::Stack { tid: 7, thread: "main".into(), frames: vec![] });
        s.apply(9.1, Marker::StackEnd { threads: 1 });
        assert_eq!(s.last_marker_at, Some(1.0));
        assert_eq!(s.stacks.len(), 1);
    }

    /// Ray's workers answer ups-doctor's SIGTERM by exiting cleanly: the observer's summary then
    /// says `exiting`. Neither it nor its time is the rank's own progress or end.
    #[test]
    fn a_marker_that_answers_the_teardown_is_neither_progress_nor_the_program_finishing() {
        let exiting = || {
            let text = r#"{"t": "observer", "steps": 50, "distributed": true, "exiting": true}"#;
            serde_json::from_str::<Marker>(text).unwrap()
        };
        let mut s = RankState::default();
        s.apply(1.0, begin("forward", Some(0)));
        s.apply_answering_teardown(30.0, exiting());
        assert_eq!(s.last_marker_at, Some(1.0));
        assert_eq!(s.observed.as_ref().map(|o| (o.steps, o.exiting_at_s)), Some((50, None)));
        s.apply(31.0, exiting());
        assert_eq!(s.observed.as_ref().and_then(|o| o.exiting_at_s), Some(31.0), "the same marker, counted");
    }

    #[test]
    fn a_step_marker_that_says_several_steps_counts_them_all_and_keeps_its_end() {
        // The observer's step marker, sent once per batch: steps 0 to 2, then 3 to 9.
        let mut s = RankState::default();
        s.apply(0.5, Marker::Step { step: 2, loss: f64::NAN, data_ms: 3.0, compute_ms: 9.0, samples: 96 });
        // A collective issued before step 9's end, sent after the step marker.
        s.apply(0.45, Marker::Progress { phase: "x".into(), done: 1, total: 2 });
        assert_eq!(s.last_marker_at, Some(0.5), "the last marker's time never goes back");
        s.apply(1.2, Marker::Step { step: 9, loss: f64::NAN, data_ms: 7.0, compute_ms: 21.0, samples: 224 });
        assert_eq!(s.steps_done, 10);
        assert_eq!((s.data_ms, s.compute_ms, s.samples), (10.0, 30.0, 320));
        assert_eq!(s.step_ends, [(2, 0.5), (9, 1.2)]);
    }

    #[test]
    fn thinned_step_ends_keep_markers_that_skip_step_numbers() {
        let mut s = RankState::default();
        // A marker every other step, each with an odd number: once the stride is even, no number
        // is a multiple of it, and one end per stride must still be kept.
        for step in (1..200_000).step_by(2) {
            s.apply(
                step as f64,
                Marker::Step { step, loss: f64::NAN, data_ms: 0.0, compute_ms: 1.0, samples: 1 },
            );
        }
        assert!(s.step_stride > 2);
        assert!(s.step_ends.len() >= MAX_LOSSES / 4, "kept {}", s.step_ends.len());
        assert!(s.step_ends.last().unwrap().0 > 190_000, "{:?}", s.step_ends.last());
    }

    #[test]
    fn a_loss_logged_every_tenth_step_is_still_kept_once_thinned() {
        // A helper's loss logged at steps 9, 19, 29, …: none a multiple of an even stride.
        let mut s = RankState::default();
        for step in (9..100_000).step_by(10) {
            s.apply(step as f64, Marker::Step { step, loss: 1.0, data_ms: 0.0, compute_ms: 1.0, samples: 1 });
        }
        assert!(s.losses.len() < MAX_LOSSES);
        assert!(s.losses.last().unwrap().0 > 90_000, "{:?}", s.losses.last());
    }

    #[test]
    fn long_runs_thin_the_loss_curve() {
        let mut s = RankState::default();
        for step in 0..5000 {
            s.apply(step as f64, Marker::Step { step, loss: 1.0, data_ms: 0.0, compute_ms: 1.0, samples: 1 });
        }
        assert!(s.losses.len() < MAX_LOSSES);
        assert_eq!(s.losses[0].0, 0);
        assert!(s.losses.last().unwrap().0 > 4000);
    }

    #[test]
    fn a_count_kept_by_the_observer_raises_the_steps_its_markers_said_and_never_lowers_them() {
        let mut s = RankState { observed: Some(ObservedProgram::default()), ..Default::default() };
        s.apply(1.0, Marker::Step { step: 0, loss: f64::NAN, data_ms: 0.0, compute_ms: 1.0, samples: 1 });
        s.counted_steps(4, Some(1.2));
        assert_eq!((s.steps_done, s.last_step_at, s.step_ends.last()), (4, Some(1.2), Some(&(3, 1.2))));
        assert_eq!(s.observed.as_ref().map(|o| o.steps), Some(4));
        // A count behind the markers (read before a marker that came later) changes nothing.
        s.counted_steps(2, Some(5.0));
        assert_eq!((s.steps_done, s.last_step_at), (4, Some(1.2)));
        // Without a time, only the count.
        s.counted_steps(6, None);
        assert_eq!((s.steps_done, s.last_step_at), (6, Some(1.2)));
        // Step markers that all got through while the observer's summary did not (seen beside
        // two other test runs: `steps_done` 4, `observed.steps` 0): the count raises the summary's.
        let mut s = RankState { observed: Some(ObservedProgram::default()), ..Default::default() };
        for step in 0..4 {
            s.apply(1.0, Marker::Step { step, loss: f64::NAN, data_ms: 0.0, compute_ms: 1.0, samples: 1 });
        }
        s.counted_steps(4, Some(1.2));
        assert_eq!((s.steps_done, s.observed.as_ref().map(|o| o.steps)), (4, Some(4)));
    }
}
