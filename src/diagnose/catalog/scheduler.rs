//! A job step ended by its scheduler, not by a fault of the program: Slurm's time limit or a
//! preemption, in slurmstepd's own words. Every rank was stopped by Slurm (SIGTERM, then SIGKILL
//! after `KillWait`): no rank failed first, none is collateral.

use super::{Finding, Pattern};
use crate::diagnose::evidence::{Evidence, RankEvidence};

pub const SCHEDULER_ENDED: Pattern = Pattern {
    id: "scheduler-ended",
    title: "Ended by the scheduler (time limit, preemption)",
    matches: "slurmstepd's `*** STEP J.S ON HOST CANCELLED AT T DUE TO TIME LIMIT ***` (or `DUE TO PREEMPTION`, \
              or the same of a `JOB`) in the launcher's or a rank's output",
    explanation: "Slurm ended the job step when its time limit passed (or when a job of higher priority took its \
                  nodes): it sent every task SIGTERM, then SIGKILL after the cluster's `KillWait`. Nothing in the \
                  program failed; the ranks' signals are Slurm's.",
    next_step: "Ask for more time (`--time`), or make the job resumable: checkpoint regularly and ask Slurm to warn \
                the job before the limit (`--signal=B:USR1@120`), then save and requeue on that signal.",
    reference: "https://slurm.schedmd.com/sbatch.html#OPT_time",
};

/// `(step, when, why)` of slurmstepd's cancellation line.
fn cancelled(line: &str) -> Option<(&str, &str, &str)> {
    let rest = &line[line.find("*** ")? + 4..];
    let (what, rest) = rest.split_once(" CANCELLED AT ")?;
    let (when, why) = rest.split_once(" DUE TO ")?;
    let why = why.trim_end().trim_end_matches("***").trim();
    let what = what.split(" ON ").next().unwrap_or(what);
    matches!(why, "TIME LIMIT" | "PREEMPTION").then_some((what, when.trim(), why))
}

pub fn scheduler_ended(ev: &Evidence, first: Option<&RankEvidence>) -> Option<Finding> {
    first?;
    let launcher = ev.launcher.iter().flat_map(|l| l.log_tail.iter());
    let ranks = ev.ranks.iter().flat_map(|r| r.text.iter());
    let (what, when, why) = launcher.chain(ranks).find_map(|l| cancelled(l))?;
    let mut f = Finding::of(&SCHEDULER_ENDED);
    f.undecided = true;
    let reason = if why == "TIME LIMIT" { "at its time limit" } else { "for a preemption" };
    let reached = ev.ranks.iter().filter_map(|r| r.result.last_step).max();
    let step = reached.map(|s| format!(" The ranks had reached step {s}.")).unwrap_or_default();
    f.headline = Some(format!(
        "Slurm ended {} {reason} ({when}): every rank was stopped by Slurm (SIGTERM, then SIGKILL), not by a fault of \
         the program.{step}",
        what.to_lowercase()
    ));
    f.evidence.push(format!("slurmstepd: *** {what} CANCELLED AT {when} DUE TO {why} ***"));
    if why == "PREEMPTION" {
        f.next_step = Some(
            "Make the job resumable: checkpoint regularly and requeue it (`--requeue`), or run it in a partition or \
             QOS that is not preempted."
                .to_string(),
        );
    }
    Some(f)
}

#[cfg(test)]
mod tests {
    use super::cancelled;

    #[test]
    fn slurmstepds_line_is_read_and_other_cancellations_are_not_this() {
        // As slurmstepd of slurm-wlm 22.05 printed it under the one-host cluster of the tests.
        let line =
            "slurmstepd-vm: error: *** STEP 1.0 ON vm CANCELLED AT 2026-12-06T05:24:43 DUE TO TIME LIMIT ***";
        assert_eq!(cancelled(line), Some(("STEP 1.0", "2026-12-06T05:24:43", "TIME LIMIT")));
        let job =
            "slurmstepd: error: *** JOB 77 ON node3 CANCELLED AT 2026-01-01T00:00:00 DUE TO PREEMPTION ***";
        assert_eq!(cancelled(job), Some(("JOB 77", "2026-01-01T00:00:00", "PREEMPTION")));
        // A user's scancel is not the scheduler's limit.
        let by_user = "slurmstepd: error: *** STEP 3.0 ON vm CANCELLED AT 2026-12-06T05:24:43 ***";
        assert_eq!(cancelled(by_user), None);
    }
}
