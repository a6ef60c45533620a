//! ups-doctor itself SIGKILLed mid-run (it gets no chance to clean up), five times each: a
//! built-in DDP run with data-loader workers leaves no process and no `/dev/shm` file; a silent
//! torchrun program that does not use the helper (its ranks get no death-with-parent and live in
//! torchrun's sessions) has no rank alive once the next `ups-doctor run` has started. Both rely
//! on the scenario's cgroup; the conditions are waited for, never slept on.
//!
//! Each test's runs make their scenario cgroups below a parent of the test's own
//! ([`OwnParent`]): every `ups-doctor run` sweeps the orphaned cgroups it finds beside its own,
//! and the suite's other tests run beside these in the same test binary, so without it a run of
//! another test could sweep this test's killed runs before the run this test watches does.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use crate::util::{Sandbox, alive, eventually, repo, venv_path};

const TRIALS: usize = 5;

/// A cgroup below the one ups-doctor would use, for one test's runs (`UPS_DOCTOR_CGROUP_PARENT`),
/// removed at the end with what the runs left in it.
struct OwnParent(PathBuf);

impl OwnParent {
    fn new(test: &str) -> OwnParent {
        let parent = ups_doctor::harness::os::cgroup::parent().expect("this machine can make cgroups");
        let dir = parent.dir.join(format!("test-{test}-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("cannot make `{}`: {e}", dir.display()));
        OwnParent(dir)
    }

    /// `ups-doctor …` with its scenario cgroups made (and orphans swept) below this parent.
    fn cmd(&self, sb: &Sandbox) -> std::process::Command {
        let mut cmd = sb.cmd();
        cmd.env("UPS_DOCTOR_CGROUP_PARENT", &self.0);
        cmd
    }
}

impl Drop for OwnParent {
    fn drop(&mut self) {
        // Empty scenario cgroups first (the runs remove theirs; an orphan's is swept), then ours.
        if let Ok(children) = std::fs::read_dir(&self.0) {
            for child in children.filter_map(Result::ok).filter(|e| e.path().is_dir()) {
                let _ = std::fs::remove_dir(child.path());
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The cgroup ups-doctor (pid `harness`) made for its scenario below `parent`, once it exists.
fn scenario_cgroup(parent: &OwnParent, harness: u32) -> Option<PathBuf> {
    let prefix = format!("ups-doctor.{harness}.");
    std::fs::read_dir(&parent.0)
        .ok()?
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
}

fn members(cgroup: &Path) -> Vec<u32> {
    std::fs::read_to_string(cgroup.join("cgroup.procs"))
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// `/dev/shm` files of the run whose ups-doctor has pid `harness` (run ids start with it).
fn shm_files_of(harness: u32) -> Vec<String> {
    let prefix = format!("ups-doctor-{harness}-");
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

fn start(sb: &Sandbox, parent: &OwnParent, file: &Path, out: &str) -> Child {
    parent
        .cmd(sb)
        .env("PATH", venv_path())
        .arg("run")
        .arg(file)
        .arg("--out")
        .arg(sb.path().join(out))
        .arg("--quiet")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("ups-doctor starts")
}

fn sigkill(child: &mut Child) {
    // SAFETY: our own child, not yet waited for.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
}

#[test]
fn a_sigkilled_ups_doctor_leaves_no_process_and_no_dev_shm_file_of_a_ddp_run_with_workers() {
    let sb = Sandbox::new();
    let parent = OwnParent::new("killed-ddp");
    let file = sb.scenario(
        "ddp-workers",
        r#"{
  "launch": { "mode": "ddp", "world_size": 2 },
  "model": { "depths": [1], "hidden": 32, "heads": 2, "latent_tokens": 8, "window": 2 },
  "data": { "samples": 16, "grid": 64, "timesteps": 4, "queries": 32, "batch_size": 8, "workers": 2, "start_method": "fork" },
  "train": { "steps": 1000000 },
  "limits": { "timeout_s": 900, "hang_after_s": 600 }
}"#,
    );
    let mut harnesses = Vec::new();
    for trial in 0..TRIALS {
        let mut child = start(&sb, &parent, &file, &format!("out{trial}"));
        let harness = child.id();
        harnesses.push(harness);
        // Training: both ranks and their four workers are in the cgroup, and the rings exist (a
        // worker is only started once its rank's ring does) and have lost their names.
        let mut pids = Vec::new();
        let training = eventually(Duration::from_secs(180), || {
            pids = scenario_cgroup(&parent, harness).map(|c| members(&c)).unwrap_or_default();
            pids.len() >= 6 && shm_files_of(harness).is_empty()
        });
        assert!(
            training,
            "trial {trial}: ranks and workers never all ran: {pids:?} {:?}",
            shm_files_of(harness)
        );
        sigkill(&mut child);
        let gone = eventually(Duration::from_secs(60), || pids.iter().all(|&p| !alive(p.into())));
        assert!(
            gone,
            "trial {trial}: still alive: {:?}",
            pids.iter().filter(|&&p| alive(p.into())).collect::<Vec<_>>()
        );
        assert_eq!(shm_files_of(harness), Vec::<String>::new(), "trial {trial}");
    }
    // The empty cgroups of the killed runs are removed by the next run.
    let plain = sb.scenario("plain", &crate::util::tiny(""));
    assert_eq!(sb.run_with(parent.cmd(&sb), &[&plain], &[]).code(), 0);
    let left: Vec<PathBuf> = harnesses.iter().filter_map(|&h| scenario_cgroup(&parent, h)).collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_sigkilled_ups_doctor_leaves_no_rank_of_a_silent_torchrun_program_once_the_next_run_starts() {
    let sb = Sandbox::new();
    let parent = OwnParent::new("killed-torchrun");
    let program = repo().join("tests/programs/silent_ranks.py").display().to_string();
    let scenario = |trial: usize| {
        let dir = sb.path().join(format!("pids{trial}"));
        std::fs::create_dir_all(&dir).unwrap();
        let file = sb.scenario(
            &format!("silent{trial}"),
            &format!(
                r#"{{"command": ["torchrun", "--nproc_per_node", "2", "{program}", "{}"],
  "launch": {{"world_size": 2, "style": "launcher"}}, "limits": {{"timeout_s": 900, "hang_after_s": 600}}}}"#,
                dir.display()
            ),
        );
        (file, dir)
    };
    let rank_pids = |dir: &Path| -> Option<Vec<u32>> {
        (0..2)
            .map(|r| std::fs::read_to_string(dir.join(format!("rank{r}.pid"))).ok()?.trim().parse().ok())
            .collect()
    };
    let mut previous: Option<Vec<u32>> = None;
    for trial in 0..TRIALS {
        let (file, dir) = scenario(trial);
        let mut child = start(&sb, &parent, &file, &format!("out{trial}"));
        if let Some(ranks) = previous.take() {
            // This run's start swept the killed run's orphaned cgroup.
            let swept = eventually(Duration::from_secs(120), || ranks.iter().all(|&p| !alive(p.into())));
            assert!(swept, "trial {}: ranks {ranks:?} of the killed run are still alive", trial - 1);
        }
        let mut ranks = None;
        let started = eventually(Duration::from_secs(180), || {
            ranks = rank_pids(&dir);
            ranks.is_some()
        });
        assert!(started, "trial {trial}: torchrun's ranks never started");
        let ranks = ranks.unwrap();
        sigkill(&mut child);
        // They run on, re-parented: nothing of theirs knows ups-doctor died.
        assert!(ranks.iter().all(|&p| alive(p.into())), "trial {trial}: the ranks died with ups-doctor");
        previous = Some(ranks);
    }
    // The next run, a plain one, ends the last trial's ranks and says so.
    let plain = sb.scenario("plain", &crate::util::tiny(""));
    let run = sb.run_with(parent.cmd(&sb), &[&plain], &[]);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    let ranks = previous.unwrap();
    assert!(
        ranks.iter().all(|&p| !alive(p.into())),
        "ranks {ranks:?} of the last killed run are still alive"
    );
    let orphans: Vec<u64> = run.scenario()["leftovers"]["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["earlier_run"] == true && p["killed"] == true)
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    for pid in ranks {
        assert!(orphans.contains(&u64::from(pid)), "rank {pid} is reported as killed: {orphans:?}");
    }
}
