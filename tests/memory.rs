//! Memory and `/dev/shm` forensics through the real binary: samples of the real rank process,
//! a real leaked segment found and removed, a real SIGBUS in a private 8 MiB `/dev/shm`.

use std::path::Path;

use crate::util::{Sandbox, tiny};
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// The run id of a leftover segment named `ups-doctor-<run id>-leak-<rank>`.
fn run_id_of(segment: &str) -> String {
    segment
        .strip_prefix("ups-doctor-")
        .and_then(|rest| rest.rsplit_once("-leak-"))
        .map(|(id, _)| id.to_string())
        .unwrap_or_else(|| panic!("not a leak segment name: {segment}"))
}

/// Files in the machine's `/dev/shm` named for this run id.
fn segments_of_run(run_id: &str) -> Vec<String> {
    let prefix = format!("ups-doctor-{run_id}-");
    std::fs::read_dir("/dev/shm")
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

fn report(sb: &Sandbox) -> String {
    sb.reports()
}

fn only_leftover_segment(scenario: &Value) -> &Value {
    let shm = scenario["leftovers"]["shm"].as_array().expect("leftover segments listed");
    let ours: Vec<&Value> = shm.iter().filter(|s| s["ours"] == true).collect();
    assert_eq!(ours.len(), 1, "{shm:#?}");
    ours[0]
}

#[test]
fn memory_of_the_rank_is_sampled_with_pss_within_rss() {
    let sb = Sandbox::new();
    let file = sb.scenario("ok", &tiny(""));
    let run = sb.run(&[&file], &[]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    let memory = &run.scenario()["memory"];
    assert!(memory["samples"].as_u64().unwrap() >= 1, "{memory:#}");
    let rank = memory["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["role"] == "rank")
        .unwrap_or_else(|| panic!("the rank process was sampled: {memory:#}"));
    assert_eq!(rank["pid"], run.rank(0)["pid"]);
    let (rss, pss, uss) = (
        rank["peak_rss_bytes"].as_u64().unwrap(),
        rank["peak_pss_bytes"].as_u64().unwrap(),
        rank["peak_uss_bytes"].as_u64().unwrap(),
    );
    // A libtorch process maps tens of MiB at least; the bound only guards against zeros.
    assert!(pss > MIB && pss <= rss && uss <= rss, "rss {rss} pss {pss} uss {uss}");
    let series = memory["series"].as_array().unwrap();
    assert!(!series.is_empty() && series.len() <= 100);
    assert!(memory["shm"]["total_bytes"].as_u64().unwrap() > 0);
    let md = report(&sb);
    assert!(md.contains("### Memory") && md.contains("| rank 0 |"), "{md}");
    // Other tests on this machine may create or sweep /dev/shm files meanwhile; the section is
    // there either way.
    assert!(md.contains("### Leftovers"), "{md}");
}

#[test]
fn a_leaked_segment_is_found_reported_and_removed() {
    let sb = Sandbox::new();
    let file = sb.scenario(
        "leak",
        &tiny(r#""inject": [{"fault": "leak_shm", "phase": "forward", "step": 1, "size": "2m"}]"#),
    );
    let run = sb.run(&[&file], &[]);
    assert_eq!(run.code(), 0, "training passes despite the leak; stderr:\n{}", run.stderr());
    let seg = only_leftover_segment(run.scenario());
    let name = seg["name"].as_str().unwrap();
    assert_eq!(seg["size_bytes"], 2 * MIB);
    assert_eq!(seg["allocated_bytes"], 2 * MIB, "every page was written");
    assert_eq!(seg["removed"], true);
    assert!(!Path::new("/dev/shm").join(name).exists(), "{name} is gone after the run");
    assert!(run.scenario()["memory"]["shm"]["peak_ours_bytes"].as_u64().unwrap() >= 2 * MIB);
    let md = report(&sb);
    assert!(md.contains(&format!("`/dev/shm/{name}` (2.0 MiB): created by this run")), "{md}");
    assert!(md.contains("**removed by ups-doctor**"), "{md}");
    assert_eq!(run.scenario()["verdict"]["pattern"], "leaked-shm");
}

#[test]
fn a_segment_too_big_for_a_private_8m_dev_shm_is_a_real_sigbus() {
    let sb = Sandbox::new();
    let file = sb.scenario(
        "bus",
        &tiny(
            r#""inject": [{"fault": "leak_shm", "phase": "forward", "step": 1, "size": "16m"}],
               "expect": {"outcome": "signaled", "signal": "SIGBUS", "phase": "forward", "step": 1}"#,
        ),
    );
    let run = sb.run(&[&file], &["--set", "data.shm_size=8m"]);
    if run.code() == 3 && run.stderr().contains("Operation not permitted") {
        eprintln!("skipped: this machine does not permit mount namespaces:\n{}", run.stderr());
        return;
    }
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    let r = run.rank(0);
    assert_eq!(r["signal"], "SIGBUS");
    let shm = &run.scenario()["memory"]["shm"];
    assert_eq!(shm["private"], true);
    assert_eq!(shm["total_bytes"], 8 * MIB, "the private /dev/shm has the size asked for");
    let at = &shm["at_rank_end"][0];
    assert_eq!((at["used_bytes"].as_u64(), at["total_bytes"].as_u64()), (Some(8 * MIB), Some(8 * MIB)));
    let verdict = &run.scenario()["verdict"];
    assert_eq!(verdict["pattern"], "shm-exhausted", "{verdict:#}");
    let cause = verdict["likely_cause"].as_str().unwrap();
    assert!(cause.contains("Please try to raise your shared memory limit."), "{cause}");
    assert!(verdict["next_step"].as_str().unwrap().contains("raise `data.shm_size`"));
    let md = report(&sb);
    assert!(md.contains("was at 8.0 of 8.0 MiB (100%) when rank 0 was killed by SIGBUS"), "{md}");
    // The machine's own /dev/shm never saw the segment, and nothing of the run is left.
    let seg = only_leftover_segment(run.scenario());
    assert_eq!(seg["removed"], true);
    assert!(segments_of_run(&run_id_of(seg["name"].as_str().unwrap())).is_empty());
}

#[test]
fn no_segment_of_a_crashed_run_survives_it() {
    let sb = Sandbox::new();
    let file = sb.scenario(
        "leak-then-segv",
        &tiny(
            r#""inject": [{"fault": "leak_shm", "phase": "forward", "step": 1, "size": "1m"},
                          {"fault": "segv", "phase": "backward", "step": 2}],
               "expect": {"outcome": "signaled", "signal": "SIGSEGV"}"#,
        ),
    );
    let run = sb.run(&[&file], &[]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    let seg = only_leftover_segment(run.scenario());
    assert_eq!(seg["removed"], true);
    let run_id = run_id_of(seg["name"].as_str().unwrap());
    assert_eq!(segments_of_run(&run_id), Vec::<String>::new(), "run {run_id} left segments behind");
    assert!(
        run.scenario()["verdict"]["evidence"].to_string().contains("removed by ups-doctor"),
        "{:#}",
        run.scenario()["verdict"]
    );
}

/// A program's own `/dev/shm` files that its own cleanup removes must be gone after a crash under
/// ups-doctor as they are without it. Spawned DataLoader workers' queues are named semaphores
/// (`sem.mp-…`), which Python's resource tracker unlinks once no process that uses them is left;
/// ups-doctor SIGKILLed the launcher's whole process group as it ended, the tracker with the
/// crashed rank's orphaned workers, before it had: each such run left every one of them (28 here,
/// and 28 from each of Ignite's `idist.Parallel` runs with a crashed rank in the accuracy matrix).
/// The names are the ones this run's ranks registered (the program prints them), so other runs on
/// the machine play no part.
#[test]
fn a_crashed_spawn_runs_semaphores_are_unlinked_by_its_resource_tracker() {
    let sb = Sandbox::new();
    let program = crate::util::program("launchers.py");
    let run = crate::util::run_command(
        &sb,
        &[
            "--",
            "python",
            &program,
            "--launcher",
            "spawn",
            "--workers",
            "2",
            "--worker-start",
            "spawn",
            "--show-semaphores",
            "--segv-rank",
            "1",
            "--segv-step",
            "2",
        ],
    );
    let s = run.scenario();
    assert_eq!(s["outcome"], "signaled", "{}\n{:#}", run.stderr(), s["verdict"]);
    let printed: String = std::fs::read_dir(sb.out())
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("launcher.stdout.log")).ok())
        .collect();
    let names: Vec<&str> = printed.lines().filter_map(|l| l.split(" semaphore ").nth(1)).collect();
    // Each rank's DataLoader iterator made its queues (3 semaphores each) and its done event.
    for rank in 0..2 {
        assert!(printed.contains(&format!("rank {rank} semaphore sem.mp-")), "{printed}");
    }
    let left: Vec<&&str> = names.iter().filter(|n| Path::new("/dev/shm").join(n).exists()).collect();
    assert!(left.is_empty(), "{} of {} semaphores left in /dev/shm: {left:?}", left.len(), names.len());
    let listed = s["leftovers"]["shm"].to_string();
    assert!(!names.iter().any(|n| listed.contains(n)), "{listed}");
}

#[test]
fn an_invalid_shm_size_is_bad_input_naming_the_field() {
    let sb = Sandbox::new();
    let file = sb.scenario("bad", &tiny(""));
    let run = sb.run(&[&file], &["--set", "data.shm_size=64 megs"]);
    assert_eq!(run.code(), 2, "stderr:\n{}", run.stderr());
    let stderr = run.stderr();
    assert!(stderr.contains("data.shm_size") && stderr.contains("unknown unit `megs`"), "{stderr}");
    assert!(stderr.contains("\"64m\""), "the accepted forms are named: {stderr}");
}

#[test]
fn without_the_right_to_make_a_mount_namespace_shm_size_says_so() {
    // As root, setpriv drops CAP_SYS_ADMIN for the run; a user without it is refused anyway.
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let setpriv = Path::new("/usr/bin/setpriv");
    if root && !setpriv.exists() {
        return;
    }
    let sb = Sandbox::new();
    let file = sb.scenario("bus", &tiny(""));
    let mut cmd = if root {
        let mut c = std::process::Command::new(setpriv);
        c.args(["--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin"]).arg(crate::util::bin());
        c
    } else {
        std::process::Command::new(crate::util::bin())
    };
    let out = cmd
        .arg("run")
        .arg(&file)
        .arg("--out")
        .arg(sb.out())
        .args(["--quiet", "--set", "data.shm_size=8m"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "stderr:\n{stderr}");
    assert!(stderr.contains("`unshare(CLONE_NEWNS)` failed: Operation not permitted"), "{stderr}");
    assert!(stderr.contains("needs root or CAP_SYS_ADMIN"), "{stderr}");
}

#[test]
fn segments_of_an_ups_doctor_that_died_are_swept_by_the_next_run() {
    // A pid that just exited stands for an ups-doctor killed before it could clean up.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let name = format!("ups-doctor-{dead}-0-00000000-leak-0");
    let path = Path::new("/dev/shm").join(&name);
    std::fs::write(&path, vec![1u8; 4096]).unwrap();
    let sb = Sandbox::new();
    let file = sb.scenario("ok", &tiny(""));
    let run = sb.run(&[&file], &[]);
    let exists = path.exists();
    let _ = std::fs::remove_file(&path);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    assert!(!exists, "{name} outlived the next run");
}

#[test]
fn a_worker_that_overflows_a_small_dev_shm_is_named_with_the_figure_at_its_death() {
    let sb = Sandbox::new();
    // Four workers with four batches in flight each need a 16 MiB ring: the first write past
    // 8 MiB is a real SIGBUS in whichever worker makes it.
    let file = sb.scenario(
        "worker-bus",
        r#"{
  "model": { "depths": [1], "hidden": 32, "heads": 2, "latent_tokens": 8, "window": 2 },
  "data": { "samples": 16, "grid": 4096, "timesteps": 4, "queries": 32, "batch_size": 64,
            "workers": 4, "prefetch": 4, "cache": "shm", "shm_size": "8m" },
  "train": { "steps": 10 },
  "limits": { "timeout_s": 120, "hang_after_s": 60 },
  "expect": { "outcome": "exited", "message": "is killed by signal: Bus error" }
}"#,
    );
    let run = sb.run(&[&file], &[]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    let r0 = run.rank(0);
    let error = r0["error"].as_str().unwrap();
    let pid: u64 = error["DataLoader worker (pid ".len()..].split(')').next().unwrap().parse().unwrap();
    let worker = r0["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["pid"] == pid)
        .unwrap_or_else(|| panic!("the dead worker {pid} is one of the rank's: {r0}"));
    let id = worker["id"].as_u64().unwrap();
    assert!(error.contains(&format!("[data-loader worker {id} of rank 0, fork; /dev/shm held")), "{error}");
    let verdict = &run.scenario()["verdict"];
    let evidence = verdict["evidence"].to_string();
    assert!(
        evidence.contains(&format!(
            "was at 8.0 of 8.0 MiB (100%) when worker {id} of rank 0 (pid {pid}) was killed by SIGBUS"
        )),
        "{evidence}"
    );
    assert!(verdict["likely_cause"].as_str().unwrap().contains("out of shared memory"), "{verdict}");
    assert!(verdict["next_step"].as_str().unwrap().contains("raise `data.shm_size`"), "{verdict}");
}

/// A dataset cache of 128 × 501 × 1024 floats (trajectories) and 128 (viscosity): 250.5 MiB,
/// about four times the private memory of a spawned worker with libtorch loaded (near 60 MiB),
/// so a copy of it cannot hide in a worker's own memory nor be imagined from it. 501 snapshots
/// of the 500 solver steps cost no more solving than 4 would.
/// 240 steps, so that each worker serves batches for several seconds: with 30 (about a second
/// of work after the workers' start) a worker on two busy cores was sampled only while it loaded
/// libtorch, twice in fresh-clone runs beside another (USS 4.7 and 9 MiB), before the low-priority
/// sampler got to it again; how long the workers live is the test's to make certain, not the
/// scheduler's.
fn spawned_workers_over(cache: &str) -> String {
    format!(
        r#"{{
  "model": {{ "depths": [1], "hidden": 32, "heads": 2, "latent_tokens": 8, "window": 2 }},
  "data": {{ "samples": 128, "grid": 1024, "timesteps": 501, "queries": 32, "batch_size": 8,
            "workers": 2, "start_method": "spawn", "cache": "{cache}" }},
  "train": {{ "steps": 240 }},
  "limits": {{ "timeout_s": 300, "hang_after_s": 120 }}
}}"#
    )
}

/// The `datasets` entry of rank 0, after checking that each of its two workers was sampled
/// once it had libtorch loaded: an unsampled worker would read as a USS of 0, "far below" any
/// cache, and pass for sharing.
fn dataset_of_two_sampled_workers(scenario: &Value) -> &Value {
    let memory = &scenario["memory"];
    let datasets = memory["datasets"].as_array().expect("datasets listed");
    assert_eq!(datasets.len(), 1, "{memory:#}");
    let d = &datasets[0];
    assert_eq!(d["bytes"], 4 * (128 * 501 * 1024 + 128), "{d}");
    assert_eq!(d["workers"], 2, "{d}");
    let workers = scenario["ranks"][0]["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 2);
    for (w, uss) in workers.iter().zip(d["worker_peak_uss_bytes"].as_array().unwrap()) {
        assert_eq!(w["start_method"], "spawn");
        let p = memory["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"] == w["pid"])
            .unwrap_or_else(|| panic!("worker {w} was sampled: {memory:#}"));
        assert_eq!((p["role"].as_str(), &p["worker"]), (Some("worker"), &w["id"]));
        assert_eq!(&p["peak_uss_bytes"], uss, "the sharing line uses the worker's own peak");
        // A process that has loaded libtorch holds tens of MiB of its own (relocated data).
        assert!(uss.as_u64().unwrap() >= 16 * MIB, "worker {w} sampled only before libtorch: {uss}");
    }
    d
}

#[test]
fn spawned_workers_share_an_shm_cache_and_each_copy_a_memory_cache() {
    let sb = Sandbox::new();
    let shm = sb.scenario("spawn-shm", &spawned_workers_over("shm"));
    let memory = sb.scenario("spawn-memory", &spawned_workers_over("memory"));
    let run = sb.run(&[&shm, &memory], &[]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    let scenarios = run.result["scenarios"].as_array().unwrap();
    for s in scenarios {
        assert_eq!(s["ranks"][0]["outcome"], "passed", "{}: {:#}", s["name"], s["verdict"]);
    }

    // shm: the workers map the rank's one segment; their private memory stays at a libtorch
    // process's own, far below the cache.
    let shared = dataset_of_two_sampled_workers(&scenarios[0]);
    let bytes = shared["bytes"].as_u64().unwrap();
    assert_eq!(shared["cache"], "shm");
    assert_eq!((&shared["private_copies"], &shared["duplicated_bytes"]), (&0.into(), &0.into()), "{shared}");
    assert_eq!(shared["shared_bytes"], bytes);
    for uss in shared["worker_peak_uss_bytes"].as_array().unwrap() {
        assert!(uss.as_u64().unwrap() < bytes / 2, "a worker of the shm cache holds {uss} of its own");
    }

    // memory: a spawned worker cannot reach the rank's heap and builds the whole set again.
    let copied = dataset_of_two_sampled_workers(&scenarios[1]);
    assert_eq!(copied["cache"], "memory");
    assert_eq!(copied["private_copies"], 2, "{copied}");
    assert_eq!(copied["duplicated_bytes"], 2 * bytes);
    assert_eq!(copied["shared_bytes"], 0);
    for uss in copied["worker_peak_uss_bytes"].as_array().unwrap() {
        assert!(uss.as_u64().unwrap() >= bytes, "a worker of the memory cache holds only {uss}");
    }

    let md = report(&sb);
    assert!(
        md.contains(
            "rank 0: the 250.5 MiB cache (`cache: shm`) is shared by its 2 workers: none of them holds \
             a private copy, nothing is duplicated"
        ),
        "{md}"
    );
    assert!(
        md.contains(
            "rank 0: 2 workers each hold a private copy of the 250.5 MiB cache (`cache: memory`): \
             501.0 MiB duplicated"
        ),
        "{md}"
    );
}
