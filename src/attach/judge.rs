//! What the window showed, as the judge reads it: each rank's [`RankView`] from what was watched.
//! The judging itself is the one judge's ([`crate::diagnose::attached`]). Pure.

pub use crate::diagnose::attached::*;
use crate::diagnose::evidence::StackFrame;

use super::watch::Watched;

/// Views each rank of `ranks` (rank, pid) from what was watched over `window_s`.
pub fn view(ranks: &[(u32, u32)], watched: &[Watched], window_s: f64) -> Vec<RankView> {
    ranks
        .iter()
        .map(|&(rank, pid)| {
            let w = watched.iter().find(|w| w.pid == pid);
            let looks = w.map(|w| w.looks.as_slice()).unwrap_or_default();
            let gone = looks.last().is_none_or(|l| matches!(l.state, None | Some('Z' | 'X')));
            let stacks: Vec<(&str, Vec<StackFrame>)> = looks
                .iter()
                .filter_map(|l| l.py_spy.as_deref())
                .map(|t| (t, main_frames(t, pid)))
                .filter(|(_, f)| !f.is_empty())
                .collect();
            let cpu_s = w.and_then(Watched::cpu_used_s);
            let moved = stacks.windows(2).any(|p| p[0].1 != p[1].1);
            let idle = cpu_s.is_some_and(|c| c < IDLE_SHARE * window_s);
            let motion = if gone {
                Motion::Gone
            } else if stacks.len() < 2 {
                Motion::Unread
            } else if moved {
                Motion::Moving
            } else if idle {
                Motion::Stuck
            } else {
                Motion::Busy
            };
            let last = stacks.last();
            RankView {
                rank,
                pid,
                motion,
                cpu_s,
                looks: stacks.len(),
                frames: last.map(|(_, f)| f.clone()).unwrap_or_default(),
                py_spy: last.map(|(t, _)| t.to_string()),
                error: looks.iter().rev().find_map(|l| l.error.clone()),
                threads: looks.last().map(|l| l.threads.clone()).unwrap_or_default(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attach::watch::Look;
    use crate::scenario::{OutcomeKind, Scenario};
    use crate::schema::ProcessDump;

    /// The judge's conclusion on `views` through its one entrance, as `attach` asks for it.
    fn conclude(
        scenario: &Scenario,
        views: &[RankView],
        missing: &[u32],
        world: Option<u32>,
        children: &[(u32, ProcessDump)],
        window_s: f64,
        scope: &str,
    ) -> Judged {
        let mut result = crate::report::fixtures::passing();
        (result.scenario, result.wall_s, result.ranks) = (scenario.clone(), window_s, Vec::new());
        let window = Window { views, missing, world, children, scope, front: &[] };
        crate::diagnose::conclude(&mut result, crate::diagnose::Seen::Attached(&window));
        Judged {
            state: State::of(result.outcome),
            outcome: result.outcome,
            culprit: result.first_failure,
            verdict: result.verdict,
            ranks: result.ranks,
        }
    }

    fn look(at_s: f64, cpu_s: f64, text: &str) -> Look {
        Look {
            at_s,
            state: Some('S'),
            cpu_s: Some(cpu_s),
            py_spy: Some(text.to_string()),
            error: None,
            threads: Vec::new(),
        }
    }

    fn dump(pid: u32, frames: &[&str]) -> String {
        let mut t = format!("Process {pid}: python\n\nThread {pid} (idle): \"MainThread\"\n");
        for f in frames {
            t.push_str(&format!("    {f}\n"));
        }
        t
    }

    const BACKWARD: [&str; 4] = [
        "_engine_run_backward (torch/autograd/graph.py:869)",
        "backward (torch/autograd/__init__.py:381)",
        "Tensor.backward (torch/_tensor.py:631)",
        "<module> (ddp.py:52)",
    ];
    const BARRIER: [&str; 3] = [
        "barrier (torch/distributed/distributed_c10d.py:5037)",
        "_exception_logger.<locals>.wrapper (torch/distributed/c10d_logger.py:83)",
        "<module> (ddp.py:48)",
    ];
    const SLEEP: [&str; 2] = ["slow_hook (stall.py:9)", "<module> (ddp.py:50)"];

    fn still(pid: u32, frames: &[&str], cpu: f64) -> Watched {
        let text = dump(pid, frames);
        Watched {
            pid,
            looks: (0..3).map(|i| look(f64::from(i), cpu * f64::from(i), &text)).collect(),
            memory: None,
        }
    }

    fn scenario() -> Scenario {
        Scenario { command: Some(vec!["torchrun".into(), "ddp.py".into()]), ..Scenario::default() }
    }

    #[test]
    fn a_rank_stuck_outside_any_collective_is_named_and_the_job_is_hung() {
        let watched = [still(10, &BACKWARD, 0.0), still(11, &SLEEP, 0.0)];
        let views = view(&[(0, 10), (1, 11)], &watched, 3.0);
        assert!(views.iter().all(|v| v.motion == Motion::Stuck), "{views:?}");
        let j = conclude(&scenario(), &views, &[], Some(2), &[], 3.0, HERE);
        assert_eq!(j.state, State::Hung);
        assert_eq!(j.culprit, Some(1), "{:?}", j.verdict);
        assert!(j.verdict.headline.starts_with("Hung: rank 1 is the one"), "{}", j.verdict.headline);
    }

    #[test]
    fn a_rank_in_barrier_while_the_other_waits_in_backward_is_named() {
        let watched = [still(10, &BACKWARD, 0.0), still(11, &BARRIER, 0.0)];
        let views = view(&[(0, 10), (1, 11)], &watched, 3.0);
        let j = conclude(&scenario(), &views, &[], Some(2), &[], 3.0, HERE);
        assert_eq!(j.culprit, Some(1), "{:?}", j.verdict);
    }

    #[test]
    fn two_ranks_in_two_different_training_collectives_cannot_be_told_apart() {
        let other = ["all_reduce (torch/distributed/distributed_c10d.py:2900)", "<module> (t.py:20)"];
        let watched = [still(10, &BACKWARD, 0.0), still(11, &other, 0.0)];
        let views = view(&[(0, 10), (1, 11)], &watched, 3.0);
        let j = conclude(&scenario(), &views, &[], Some(2), &[], 3.0, HERE);
        assert_eq!(j.state, State::Hung);
        assert_eq!(j.culprit, None);
        assert!(j.verdict.headline.starts_with("Hung: cannot tell which rank"), "{}", j.verdict.headline);
        assert!(j.verdict.headline.contains("rank 0 in `_engine_run_backward`"), "{}", j.verdict.headline);
    }

    #[test]
    fn ranks_whose_stacks_move_with_cpu_rising_are_running() {
        let moving = |pid: u32| Watched {
            pid,
            looks: vec![
                look(0.0, 1.0, &dump(pid, &BACKWARD)),
                look(
                    1.5,
                    2.4,
                    &dump(pid, &["forward (torch/nn/modules/linear.py:125)", "<module> (ddp.py:45)"]),
                ),
                look(3.0, 3.9, &dump(pid, &BACKWARD)),
            ],
            memory: None,
        };
        let views = view(&[(0, 10), (1, 11)], &[moving(10), moving(11)], 3.0);
        let j = conclude(&scenario(), &views, &[], Some(2), &[], 3.0, HERE);
        assert_eq!(j.state, State::Running, "{views:?}");
        assert_eq!(j.outcome, OutcomeKind::Passed);
        assert!(j.verdict.headline.starts_with("Running: ranks 0, 1 of 2"), "{}", j.verdict.headline);
    }

    #[test]
    fn a_missing_rank_of_world_size_makes_the_job_failed() {
        let watched = [still(10, &BACKWARD, 0.0)];
        let views = view(&[(0, 10)], &watched, 3.0);
        let j = conclude(&scenario(), &views, &[1], Some(2), &[], 3.0, HERE);
        assert_eq!(j.state, State::Failed);
        assert!(j.verdict.headline.starts_with("Failed: rank 1 gone"), "{}", j.verdict.headline);
        assert!(
            j.verdict.evidence.iter().any(|l| l.contains("rank 1 of WORLD_SIZE 2 not found")),
            "{:?}",
            j.verdict.evidence
        );
    }

    #[test]
    fn with_native_frames_a_rank_is_placed_by_its_innermost_python_frame() {
        let text = dump(
            10,
            &[
                "0x7f22fdca3f16 (libc.so.6)",
                "c10d::Reducer::finalize_backward (libtorch_cpu.so)",
                "_engine_run_backward (torch/autograd/graph.py:869)",
                "<module> (ddp.py:52)",
            ],
        );
        let frames = main_frames(&text, 10);
        assert_eq!(place(&frames), "`_engine_run_backward` (torch/autograd/graph.py:869) ← ddp.py:52");
        assert_eq!(place(&frames[..2]), "`c10d::Reducer::finalize_backward` (libtorch_cpu.so)");
    }

    #[test]
    fn ranks_whose_stacks_cannot_be_read_and_that_use_no_cpu_are_not_called_running() {
        let unread = |pid: u32, cpu: f64| Watched {
            pid,
            looks: (0..3)
                .map(|i| Look {
                    at_s: f64::from(i),
                    state: Some('S'),
                    cpu_s: Some(cpu * f64::from(i)),
                    py_spy: None,
                    error: Some("`py-spy dump --nonblocking --pid 10` failed: Permission denied".into()),
                    threads: Vec::new(),
                })
                .collect(),
            memory: None,
        };
        let views = view(&[(0, 10), (1, 11)], &[unread(10, 0.0), unread(11, 0.0)], 3.0);
        assert!(views.iter().all(|v| v.motion == Motion::Unread), "{views:?}");
        let j = conclude(&scenario(), &views, &[], Some(2), &[], 3.0, HERE);
        assert_eq!(j.state, State::Hung);
        assert_eq!(j.culprit, None);
        assert!(j.verdict.headline.contains("ranks 0, 1 in no readable stack"), "{}", j.verdict.headline);
        let views = view(&[(0, 10), (1, 11)], &[unread(10, 1.0), unread(11, 1.0)], 3.0);
        assert_eq!(conclude(&scenario(), &views, &[], Some(2), &[], 3.0, HERE).state, State::Running);
    }

    #[test]
    fn a_busy_rank_with_the_same_stack_is_busy_not_stuck() {
        let watched = [still(10, &BACKWARD, 0.0), still(11, &SLEEP, 1.0)];
        let views = view(&[(0, 10), (1, 11)], &watched, 3.0);
        assert_eq!(views[1].motion, Motion::Busy);
        let j = conclude(&scenario(), &views, &[], Some(2), &[], 3.0, HERE);
        assert_eq!(j.culprit, Some(1), "{:?}", j.verdict);
        assert!(j.verdict.headline.contains("It is busy"), "{}", j.verdict.headline);
    }
}
