//! `ups-doctor attach` on real PyTorch 2.11 jobs (CPU, gloo) that the test starts itself, outside
//! ups-doctor: torchrun with 2 and 4 ranks and `torch.multiprocessing.spawn` with DataLoader
//! workers; faults injected from outside the program (a `sitecustomize` on `PYTHONPATH`) or by the
//! program's own flag. Every test checks that attaching changed nothing: every process of the job
//! has the same pid, start time and state after `attach` as before, and none was stopped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::util::{Sandbox, bin, children_of, eventually, free_port, repo, venv_path, venv_python};
use serde_json::Value;

fn program(name: &str) -> String {
    repo().join("tests/programs").join(name).display().to_string()
}

/// A job the test started: its launcher and everything below it are the test's own processes,
/// killed when it is dropped.
struct Job {
    launcher: Child,
    log: PathBuf,
}

impl Job {
    fn start(sb: &Sandbox, argv: &[String], env: &[(&str, String)]) -> Job {
        Job::start_as(sb, "job", argv, env)
    }

    /// A job whose output goes to `NAME.log` (two jobs of one test each have their own).
    fn start_as(sb: &Sandbox, name: &str, argv: &[String], env: &[(&str, String)]) -> Job {
        let log = sb.path().join(format!("{name}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let launcher = Command::new(&argv[0])
            .args(&argv[1..])
            .env("PATH", venv_path())
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("the job starts");
        Job { launcher, log }
    }

    fn pid(&self) -> u32 {
        self.launcher.id()
    }

    /// Polls `cond` while the job runs: a job that ended without it fails the test at once.
    fn reaches(&self, mut cond: impl FnMut() -> bool) -> bool {
        eventually(LIMIT, || cond() || !crate::util::alive(u64::from(self.pid())))
            && crate::util::alive(u64::from(self.pid()))
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The launcher and every process below it.
    fn processes(&self) -> Vec<u32> {
        let mut all = vec![self.pid()];
        let mut i = 0;
        while i < all.len() {
            all.extend(children_of(all[i]));
            i += 1;
        }
        all
    }

    /// The direct children of the launcher that are ranks (not multiprocessing's resource tracker).
    fn ranks(&self) -> Vec<u32> {
        children_of(self.pid())
            .into_iter()
            .filter(|&p| {
                !std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                    .unwrap_or_default()
                    .contains("resource_tracker")
            })
            .collect()
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // Only the test's own processes: its child and what is below it.
        let below = self.processes();
        for pid in below.iter().rev() {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid as i32), nix::sys::signal::SIGKILL);
        }
        let _ = self.launcher.wait();
    }
}

/// `(pid, start time, state)` of each process, from `/proc/PID/stat`.
fn snapshot(pids: &[u32]) -> Vec<(u32, u64, char)> {
    pids.iter()
        .filter_map(|&pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let after: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
            Some((pid, after[19].parse().ok()?, after[0].chars().next()?))
        })
        .collect()
}

/// The job's processes are all still there after `attach` (the same pid and start time), none
/// stopped, traced or dead. Running (`R`) against sleeping (`S`) is not compared: a rank that
/// waits at a rendezvous or in a collective retries and polls, so on a busy machine it is `R` at
/// one reading and `S` at the next whatever `attach` does (the fresh-clone suite under load caught
/// a waiting rank `R` before and `S` after). Where a wait is the point, the test checks that the
/// rank still waits where it did.
fn assert_untouched(before: &[(u32, u64, char)], job: &Job) {
    let pids: Vec<u32> = before.iter().map(|b| b.0).collect();
    let after = snapshot(&pids);
    assert_eq!(after.len(), before.len(), "a process of the job is gone: before {before:?}, after {after:?}");
    for (b, a) in before.iter().zip(&after) {
        assert_eq!((b.0, b.1), (a.0, a.1), "the same process");
        assert!(!matches!(a.2, 'T' | 't' | 'Z'), "pid {} is {} after attach", a.0, a.2);
        let status = std::fs::read_to_string(format!("/proc/{}/status", a.0)).unwrap_or_default();
        assert!(status.contains("TracerPid:\t0"), "pid {} is still traced", a.0);
    }
    assert_eq!(job.processes().len(), before.len(), "the job's process tree changed");
}

struct Attached {
    code: i32,
    stderr: String,
    attach: Value,
    result: Value,
    report: String,
}

/// No NVIDIA driver's NVML on this machine (CI and the project's CPU machines).
fn nvml_absent() -> bool {
    ![
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "/usr/lib64/libnvidia-ml.so.1",
        "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).exists())
}

fn attach(sb: &Sandbox, pid: u32) -> Attached {
    attach_with(sb, pid, &[])
}

fn attach_with(sb: &Sandbox, pid: u32, args: &[&str]) -> Attached {
    let out_dir = sb.path().join(format!("attach-{pid}"));
    let out = Command::new(bin())
        .args(["attach", &pid.to_string(), "--out"])
        .arg(&out_dir)
        .args(args)
        .env("PATH", venv_path())
        .output()
        .expect("ups-doctor runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    // The report attach writes is read back against its result.json, as every run's is (issue 30).
    if out_dir.join("result.json").is_file() && out_dir.join("report.md").is_file() {
        let found = crate::consistency::check_run_dir(&out_dir);
        assert!(found.is_empty(), "the report contradicts its result.json:\n{}", found.join("\n"));
    }
    let read = |name: &str| -> String {
        std::fs::read_to_string(out_dir.join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}; stderr:\n{stderr}"))
    };
    Attached {
        code: out.status.code().unwrap_or(-1),
        attach: serde_json::from_str(&read("attach.json")).unwrap(),
        result: serde_json::from_str(&read("result.json")).unwrap(),
        report: read("report.md"),
        stderr,
    }
}

/// The main thread of `pid` as py-spy sees it without stopping it (the test's own look, to know
/// when the job has reached its fault).
fn stack(pid: u32) -> String {
    let py_spy = venv_python().with_file_name("py-spy");
    Command::new(py_spy)
        .args(["dump", "--nonblocking", "--pid", &pid.to_string()])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

fn torchrun(ranks: u32, port: u16, script: &[&str]) -> Vec<String> {
    let mut argv = vec![
        venv_python().with_file_name("torchrun").display().to_string(),
        "--nproc_per_node".into(),
        ranks.to_string(),
        "--master_port".into(),
        port.to_string(),
    ];
    argv.extend(script.iter().map(|s| s.to_string()));
    argv
}

const LIMIT: Duration = Duration::from_secs(240);

#[test]
fn a_healthy_torchrun_job_is_running_and_attach_leaves_it_as_it_was() {
    let sb = Sandbox::new();
    let script = program("launchers.py");
    let job =
        Job::start(&sb, &torchrun(2, free_port(), &[&script, "--launcher", "env", "--steps", "100000"]), &[]);
    assert!(
        job.reaches(|| job.output().contains("rank 1 step 20") && job.output().contains("rank 0 step 20")),
        "the job trains:\n{}",
        job.output()
    );
    let before = snapshot(&job.processes());
    let a = attach(&sb, job.pid());
    assert_untouched(&before, &job);
    assert!(job.output().lines().filter(|l| l.starts_with("rank 0 step")).count() > 20, "it still trains");
    assert_eq!(a.code, 0, "running is exit 0; stderr:\n{}", a.stderr);
    assert_eq!(a.attach["state"], "running", "{:#}", a.attach);
    assert_eq!(a.attach["ranks_found"], serde_json::json!([0, 1]));
    assert_eq!(a.attach["world_size"], 2);
    assert_eq!(a.attach["launcher"], job.pid());
    assert_eq!(a.attach["signalled"], serde_json::json!([]));
    for r in a.attach["ranks"].as_array().unwrap() {
        assert_ne!(r["motion"], "stuck", "{r}");
        assert!(r["cpu_used_s"].as_f64().unwrap() > 0.0, "{r}");
    }
    let scenario = &a.result["scenarios"][0];
    assert!(
        scenario["verdict"]["headline"].as_str().unwrap().starts_with("Running: ranks 0, 1 of 2"),
        "{}",
        scenario["verdict"]
    );
    assert!(a.report.contains("read-only: no signal sent"), "{}", a.report);
    // GPU activity per process is read through NVML over the window; on a machine without one
    // the report says why there is none (with a GPU: src/attach/gpu.rs's test on an H200
    // recording).
    let gpu = &scenario["gpu"];
    if nvml_absent() {
        assert!(gpu["unavailable"].as_str().is_some_and(|w| w.contains("libnvidia-ml")), "{gpu}");
        assert!(a.report.contains("metrics unavailable"), "{}", a.report);
    } else {
        assert!(gpu["gpus"].as_array().is_some_and(|g| !g.is_empty()), "{gpu}");
    }
    // The job's TCP connections: torchrun's agent holds the store, both ranks are connected to it
    // and to each other (gloo).
    let tcp = &a.attach["tcp"];
    assert_eq!(tcp["store_holder"]["role"], "launcher", "{tcp}");
    assert_eq!(tcp["connected_to_store"], serde_json::json!([0, 1]), "{tcp}");
    assert_eq!((tcp["peers"][0][0].as_u64(), tcp["peers"][0][1].as_u64()), (Some(0), Some(1)), "{tcp}");
    assert!(a.report.contains("TCP on this machine: the rendezvous store at :"), "{}", a.report);
    // `--all` lists it with the pid to attach to.
    let before = snapshot(&job.processes());
    let list = Command::new(bin()).args(["attach", "--all"]).output().expect("ups-doctor runs");
    assert_untouched(&before, &job);
    let text = String::from_utf8_lossy(&list.stdout);
    let entry =
        text.split("\npid ").find(|e| e.trim_start_matches("pid ").starts_with(&format!("{}:", job.pid())));
    let entry = entry.unwrap_or_else(|| panic!("the job is listed:\n{text}"));
    assert!(entry.contains("torchrun --nproc_per_node 2"), "{entry}");
    assert!(entry.contains("ranks 0, 1 of 2"), "{entry}");
    assert!(entry.contains(&format!("ups-doctor attach {}", job.pid())), "{entry}");
}

/// `--then stop` on a hung job: the stacks are read first (the same verdict as without it), then
/// the launcher and ranks get SIGTERM and the whole job ends; nothing else is touched.
#[test]
fn then_stop_reads_a_hung_job_first_and_then_ends_every_process_of_it() {
    let sb = Sandbox::new();
    let stalled = sb.path().join("stalled");
    let site = repo().join("tests/programs/attach_stall").display().to_string();
    let mut job = Job::start(
        &sb,
        &torchrun(2, free_port(), &[&program("launchers.py"), "--launcher", "env", "--steps", "1000"]),
        &[
            ("PYTHONPATH", site),
            ("ATTACH_STALL_RANK", "1".into()),
            ("ATTACH_STALL_STEP", "3".into()),
            ("ATTACH_STALL_FILE", stalled.display().to_string()),
        ],
    );
    assert!(job.reaches(|| stalled.exists()), "rank 1 reaches its stall:\n{}", job.output());
    let ranks = job.ranks();
    let rank0 = ranks
        .iter()
        .copied()
        .find(|&p| std::fs::read_to_string(&stalled).is_ok_and(|s| s.trim() != p.to_string()));
    let rank0 = rank0.expect("rank 0");
    assert!(job.reaches(|| stack(rank0).contains("_engine_run_backward")), "rank 0 waits in backward");
    let everyone = job.processes();
    let mut bystander = Command::new("sleep").arg("600").spawn().unwrap();
    let a = attach_with(&sb, job.pid(), &["--then", "stop"]);
    assert_eq!(a.code, 1, "hung is exit 1; stderr:\n{}", a.stderr);
    assert_eq!(
        (a.attach["state"].as_str(), a.attach["culprit"].as_u64()),
        (Some("hung"), Some(1)),
        "{:#}",
        a.attach
    );
    let termed = a.attach["stopped"]["sigterm"].as_array().cloned().unwrap_or_default();
    assert!(termed.contains(&serde_json::json!(job.pid())), "the launcher got SIGTERM: {:#}", a.attach);
    let gone =
        eventually(Duration::from_secs(30), || everyone.iter().all(|&p| !crate::util::alive(p.into())));
    assert!(
        gone,
        "still there: {:?}",
        everyone.iter().filter(|&&p| crate::util::alive(p.into())).collect::<Vec<_>>()
    );
    assert!(job.launcher.try_wait().unwrap().is_some(), "the launcher ended");
    let untouched = bystander.try_wait().unwrap().is_none();
    let _ = bystander.kill();
    let _ = bystander.wait();
    assert!(untouched, "a process outside the job was touched");
    assert!(
        a.report.contains("then stopped as asked (`--then stop`), after the stacks were read"),
        "{}",
        a.report
    );
    assert!(a.report.contains("read-only: no signal sent"), "the window itself was read-only:\n{}", a.report);
}

#[test]
fn a_rank_stalled_outside_any_collective_is_named_among_four_torchrun_ranks() {
    let sb = Sandbox::new();
    let script = program("launchers.py");
    let stalled = sb.path().join("stalled");
    let site = repo().join("tests/programs/attach_stall").display().to_string();
    let job = Job::start(
        &sb,
        &torchrun(4, free_port(), &[&script, "--launcher", "env", "--steps", "1000"]),
        &[
            ("PYTHONPATH", site),
            ("ATTACH_STALL_RANK", "2".into()),
            ("ATTACH_STALL_STEP", "3".into()),
            ("ATTACH_STALL_FILE", stalled.display().to_string()),
        ],
    );
    assert!(job.reaches(|| stalled.exists()), "rank 2 reaches its stall:\n{}", job.output());
    // The others wait for it in the next step's gradient all-reduce.
    let ranks = job.ranks();
    assert_eq!(ranks.len(), 4, "{}", job.output());
    let stalled_pid: u32 = std::fs::read_to_string(&stalled).unwrap().trim().parse().unwrap();
    assert!(
        job.reaches(|| ranks
            .iter()
            .filter(|&&p| p != stalled_pid)
            .all(|&p| stack(p).contains("_engine_run_backward"))),
        "the other ranks wait in backward"
    );
    let before = snapshot(&job.processes());
    let a = attach(&sb, job.pid());
    assert_untouched(&before, &job);
    assert_eq!(a.code, 1, "hung is exit 1; stderr:\n{}", a.stderr);
    assert_eq!(a.attach["state"], "hung", "{:#}", a.attach);
    assert_eq!(a.attach["ranks_found"], serde_json::json!([0, 1, 2, 3]));
    assert_eq!(a.attach["culprit"], 2, "{:#}", a.attach);
    let rank2 = &a.attach["ranks"][2];
    assert_eq!(rank2["pid"], stalled_pid);
    assert!(rank2["place"].as_str().unwrap().contains("stall_in_optimizer_hook"), "{rank2}");
    let scenario = &a.result["scenarios"][0];
    assert_eq!(scenario["first_failure"], 2);
    let headline = scenario["verdict"]["headline"].as_str().unwrap();
    assert!(headline.starts_with("Hung: rank 2 is the one the others wait for"), "{headline}");
    assert!(headline.contains("stuck outside any collective"), "{headline}");
}

/// `attach` on each node of a two-node torchrun job (two launchers on this machine, each its
/// node's 2 ranks, one c10d rendezvous), with rank 3 stalled outside any collective: node 0
/// judges all four ranks at once and names rank 3, on whichever node the rendezvous put it; node
/// 1 keeps its own report, sees its ranks connected to the store on the other node, and exits
/// with node 0's verdict; no process of either node's job is touched.
#[test]
fn attach_on_each_node_of_a_two_node_job_names_the_stalled_rank_among_all_four() {
    let sb = Sandbox::new();
    let (rdzv, coordinator) = (free_port(), format!("127.0.0.1:{}", free_port()));
    let script = program("launchers.py");
    let stalled = sb.path().join("stalled");
    let env = [
        ("PYTHONPATH", repo().join("tests/programs/attach_stall").display().to_string()),
        ("ATTACH_STALL_RANK", "3".into()),
        ("ATTACH_STALL_STEP", "3".into()),
        ("ATTACH_STALL_FILE", stalled.display().to_string()),
    ];
    let jobs: Vec<Job> = (0..2u32)
        .map(|node| {
            let mut argv = vec![venv_python().with_file_name("torchrun").display().to_string()];
            argv.extend(
                [
                    "--nnodes=2",
                    &format!("--node-rank={node}"),
                    "--nproc-per-node=2",
                    "--rdzv-backend=c10d",
                    &format!("--rdzv-endpoint=127.0.0.1:{rdzv}"),
                    "--rdzv-id=two-nodes",
                    &format!("--rdzv-conf=is_host={}", u8::from(node == 0)),
                    &script,
                    "--launcher",
                    "env",
                    "--steps",
                    "1000",
                ]
                .map(String::from),
            );
            Job::start_as(&sb, &format!("node{node}"), &argv, &env)
        })
        .collect();
    assert!(jobs[0].reaches(|| stalled.exists()), "rank 3 reaches its stall:\n{}", jobs[0].output());
    let stalled_pid: u32 = std::fs::read_to_string(&stalled).unwrap().trim().parse().unwrap();
    let ranks: Vec<u32> = jobs.iter().flat_map(Job::ranks).collect();
    assert_eq!(ranks.len(), 4, "{}\n{}", jobs[0].output(), jobs[1].output());
    assert!(
        jobs[0].reaches(|| ranks
            .iter()
            .filter(|&&p| p != stalled_pid)
            .all(|&p| stack(p).contains("_engine_run_backward"))),
        "the other ranks wait in backward"
    );
    let before: Vec<_> = jobs.iter().map(|j| snapshot(&j.processes())).collect();
    let node1_out = sb.path().join("node1-attach");
    let node1 = Command::new(bin())
        .args(["attach", &jobs[1].pid().to_string(), "--nodes", "2", "--node-rank", "1"])
        .args(["--coordinator", &coordinator, "--out"])
        .arg(&node1_out)
        .env("PATH", venv_path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ups-doctor starts");
    let a =
        attach_with(&sb, jobs[0].pid(), &["--nodes", "2", "--node-rank", "0", "--coordinator", &coordinator]);
    let node1 = node1.wait_with_output().unwrap();
    for (job, before) in jobs.iter().zip(&before) {
        assert_untouched(before, job);
    }
    // Node 0: one verdict on all four ranks.
    assert_eq!(a.code, 1, "hung is exit 1; stderr:\n{}", a.stderr);
    assert_eq!(a.attach["state"], "hung", "{:#}", a.attach);
    assert_eq!(a.attach["ranks_found"], serde_json::json!([0, 1, 2, 3]), "{:#}", a.attach);
    assert_eq!(a.attach["ranks_missing"], serde_json::json!([]));
    assert_eq!(a.attach["culprit"], 3, "{:#}", a.attach);
    let scenario = &a.result["scenarios"][0];
    let headline = scenario["verdict"]["headline"].as_str().unwrap();
    assert!(headline.starts_with("Hung: rank 3 is the one the others wait for"), "{headline}");
    let nodes = scenario["nodes"]["per_node"].as_array().unwrap();
    assert_eq!(nodes.len(), 2, "{:#}", scenario["nodes"]);
    let mut placed: Vec<u64> = nodes
        .iter()
        .flat_map(|n| n["ranks"].as_array().unwrap().iter().map(|r| r.as_u64().unwrap()))
        .collect();
    placed.sort_unstable();
    assert_eq!(placed, [0, 1, 2, 3], "each rank on the node that found it");
    assert!(nodes[1]["clock"]["start"]["samples"].as_u64().unwrap() > 0, "node 1's clock is calibrated");
    for r in scenario["ranks"].as_array().unwrap() {
        assert_eq!(r["identified_by"], "RANK", "each node says how it told its ranks: {r:#}");
    }
    assert!(
        a.report.contains("`ups-doctor attach` on each to the job already running there"),
        "{}",
        a.report
    );
    // Node 1: its own report of its two ranks, and node 0's verdict as its exit status.
    let stderr1 = String::from_utf8_lossy(&node1.stderr);
    assert_eq!(node1.status.code(), Some(1), "{stderr1}");
    assert!(stderr1.contains("node 0 judged every node's ranks together"), "{stderr1}");
    let own: Value =
        serde_json::from_str(&std::fs::read_to_string(node1_out.join("attach.json")).unwrap()).unwrap();
    assert_eq!(own["ranks_found"], nodes[1]["ranks"], "{own:#}");
    assert_eq!(own["tcp"]["store_holder"], Value::Null, "the store is on node 0: {:#}", own["tcp"]);
    assert_eq!(own["tcp"]["connected_to_store"], nodes[1]["ranks"], "{:#}", own["tcp"]);
    let found = crate::consistency::check_run_dir(&node1_out);
    assert!(found.is_empty(), "node 1's report contradicts its result.json:\n{}", found.join("\n"));
    // `attach --all` on this machine lists each node's share with how to read all of them at once.
    let all = Command::new(bin()).args(["attach", "--all"]).env("PATH", venv_path()).output().unwrap();
    let listed = String::from_utf8_lossy(&all.stdout);
    for job in &jobs {
        let at = listed.find(&format!("pid {}:", job.pid())).unwrap_or_else(|| panic!("{listed}"));
        let entry = &listed[at..listed[at + 1..].find("\npid ").map_or(listed.len(), |e| at + 1 + e)];
        assert!(entry.contains("this machine holds 2 of the job's 4 ranks, on node "), "{entry}");
        assert!(
            entry.contains(&format!("`ups-doctor attach {} --nodes 2 --node-rank ", job.pid())),
            "{entry}"
        );
    }
    // Both nodes given node 0's job: not one job's two shares, so node 0 refuses to merge (exit
    // 2, naming the rank found twice) and node 1 says so and keeps its own report.
    let pid0 = jobs[0].pid().to_string();
    let coordinator = format!("127.0.0.1:{}", free_port());
    let attach_as = |node: &str| {
        Command::new(bin())
            .args(["attach", &pid0, "--watch", "1", "--nodes", "2", "--node-rank", node, "--coordinator"])
            .arg(&coordinator)
            .arg("--out")
            .arg(sb.path().join(format!("twice-{node}")))
            .env("PATH", venv_path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (second, first) = (attach_as("1"), attach_as("0"));
    let (first, second) = (first.wait_with_output().unwrap(), second.wait_with_output().unwrap());
    let (stderr0, stderr1) =
        (String::from_utf8_lossy(&first.stderr), String::from_utf8_lossy(&second.stderr));
    assert_eq!(first.status.code(), Some(2), "{stderr0}");
    assert!(stderr0.contains("rank 0 was found on node 0 and on node 1"), "{stderr0}");
    assert!(stderr1.contains("node 0 did not merge: rank 0 was found on node 0 and on node 1"), "{stderr1}");
    assert!(sb.path().join("twice-1/report.md").is_file(), "node 1's own report stands");
}

#[test]
fn an_mp_spawn_rank_that_skipped_a_collective_is_named_or_not_told_and_its_workers_are_found() {
    let sb = Sandbox::new();
    let script = program("launchers.py");
    let argv: Vec<String> = [
        venv_python().display().to_string(),
        script,
        "--launcher".into(),
        "spawn".into(),
        "--steps".into(),
        "40".into(),
        "--workers".into(),
        "2".into(),
        "--hang-rank".into(),
        "1".into(),
        "--hang-step".into(),
        "3".into(),
    ]
    .into();
    let job = Job::start(&sb, &argv, &[("PET_MASTER_PORT", free_port().to_string())]);
    assert!(
        job.reaches(|| job.output().contains("rank 1: skipping the all-reduce of step 3")),
        "rank 1 skips:\n{}",
        job.output()
    );
    let ranks = job.ranks();
    assert_eq!(ranks.len(), 2, "{}", job.output());
    assert!(
        job.reaches(|| ranks.iter().any(|&p| stack(p).contains("barrier"))
            && ranks.iter().any(|&p| stack(p).contains("_engine_run_backward"))),
        "one rank waits in barrier, the other in backward"
    );
    let before = snapshot(&job.processes());
    let a = attach(&sb, job.pid());
    assert_untouched(&before, &job);
    assert_eq!(a.attach["state"], "hung", "{:#}\nstderr:\n{}", a.attach, a.stderr);
    assert_eq!(a.attach["ranks_found"], serde_json::json!([0, 1]));
    let headline = a.result["scenarios"][0]["verdict"]["headline"].as_str().unwrap().to_string();
    match &a.attach["culprit"] {
        Value::Null => assert!(headline.starts_with("Hung: cannot tell which rank"), "{headline}"),
        culprit => {
            assert_eq!(culprit, 1, "{headline}");
            assert!(headline.contains("rank 1 waits in `dist.barrier()`"), "{headline}");
        }
    }
    // Two forked DataLoader workers below each rank, each named as the rank's child.
    let children =
        a.attach["processes"].as_array().unwrap().iter().filter(|p| p["who"]["role"] == "child").count();
    assert_eq!(children, 4, "{:#}", a.attach["processes"]);
    assert!(Path::new(&sb.path().join(format!("attach-{}", job.pid()))).join("report.md").exists());
    // From a DataLoader worker's pid: the same job, the same ranks.
    let worker = children_of(ranks[0])[0];
    let from_worker = attach(&sb, worker);
    assert_eq!(from_worker.attach["launcher"], job.pid(), "{:#}", from_worker.attach);
    assert_eq!(from_worker.attach["ranks_found"], serde_json::json!([0, 1]));
}

#[test]
fn a_rank_gone_before_the_rendezvous_makes_the_job_failed_and_the_rank_missing() {
    let sb = Sandbox::new();
    let script = program("launchers.py");
    let site = repo().join("tests/programs/attach_stall").display().to_string();
    let job = Job::start(
        &sb,
        &torchrun(2, free_port(), &[&script, "--launcher", "env", "--steps", "1000"]),
        &[("PYTHONPATH", site), ("ATTACH_EXIT_RANK", "1".into())],
    );
    // Rank 0 alone, waiting for rank 1 in `init_process_group`.
    assert!(
        job.reaches(|| {
            let ranks = job.ranks();
            ranks.len() == 1 && stack(ranks[0]).contains("init_process_group")
        }),
        "rank 0 waits alone at the rendezvous:\n{}",
        job.output()
    );
    let before = snapshot(&job.processes());
    // From rank 0's pid this time: the job is found from any rank.
    let a = attach(&sb, job.ranks()[0]);
    assert_untouched(&before, &job);
    assert!(
        stack(job.ranks()[0]).contains("init_process_group"),
        "rank 0 still waits at the rendezvous after attach:\n{}",
        job.output()
    );
    assert_eq!(a.code, 1, "stderr:\n{}", a.stderr);
    assert_eq!(a.attach["state"], "failed", "{:#}", a.attach);
    assert_eq!(a.attach["launcher"], job.pid());
    assert_eq!(a.attach["ranks_found"], serde_json::json!([0]));
    assert_eq!(a.attach["ranks_missing"], serde_json::json!([1]));
    let verdict = &a.result["scenarios"][0]["verdict"];
    let headline = verdict["headline"].as_str().unwrap();
    assert!(headline.starts_with("Failed: rank 1 gone before or during the window"), "{headline}");
    assert!(headline.contains("rank 0 in"), "{headline}");
    let evidence = verdict["evidence"].to_string();
    assert!(evidence.contains("rank 1 of WORLD_SIZE 2 not found on this machine"), "{evidence}");
    // Rank 0 reached the store; rank 1 never did.
    assert_eq!(a.attach["tcp"]["connected_to_store"], serde_json::json!([0]), "{:#}", a.attach["tcp"]);
    assert!(evidence.contains("**not connected: rank 1**"), "{evidence}");
}

#[test]
fn a_process_that_is_no_pytorch_job_and_a_bad_window_are_bad_input_naming_the_fix() {
    let sb = Sandbox::new();
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = sleeper.id().to_string();
    let out = Command::new(bin()).args(["attach", &pid, "--out"]).arg(sb.path().join("a")).output().unwrap();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("no PyTorch job at pid {pid}: it is neither a launcher nor a rank")),
        "{stderr}"
    );
    assert!(stderr.contains("ups-doctor attach --all"), "{stderr}");
    let out = Command::new(bin()).args(["attach", &pid, "--watch", "0"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--watch 0 is not between 0.5 and 3600 seconds"), "{stderr}");
    // Several nodes: each flag's value and the fix, before any waiting for the others.
    for (args, says) in [
        (&["--nodes", "2", "--node-rank", "2"][..], "node rank 2 is not below the number of nodes 2"),
        (
            &["--nodes", "2", "--node-rank", "1", "--coordinator", "node0"],
            "`--coordinator node0` is not HOST:PORT",
        ),
        (&["1", "--nodes", "2", "--node-rank", "1"], "`--nodes 2` attaches to one job: give one pid"),
    ] {
        let out = Command::new(bin()).args(["attach", &pid]).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

/// `--native` (a ptrace stop per read, still no signal): a process forked after a 2-thread matmul
/// deadlocks in libgomp on its own matmul (as a fork-started DataLoader worker does); the judge
/// names the pattern from the child's native frames.
#[test]
fn a_child_deadlocked_after_fork_is_named_from_native_stacks_with_native() {
    let sb = Sandbox::new();
    let argv =
        [venv_python().display().to_string(), program("patterns.py"), "--case".into(), "fork_threads".into()];
    // One rank of its own, as a per-rank launch would start it.
    let job = Job::start(&sb, &argv, &[("RANK", "0".into()), ("WORLD_SIZE", "1".into())]);
    assert!(
        job.reaches(|| job.output().contains("child: multiplying")),
        "the child forks:\n{}",
        job.output()
    );
    let child = children_of(job.pid());
    assert_eq!(child.len(), 1);
    assert!(job.reaches(|| stack(child[0]).contains("<module> (patterns.py")), "the child runs its matmul");
    let before = snapshot(&job.processes());
    let out_dir = sb.path().join("native");
    let out = Command::new(bin())
        .args(["attach", &job.pid().to_string(), "--native", "--out"])
        .arg(&out_dir)
        .env("PATH", venv_path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_untouched(&before, &job);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let attach: Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("attach.json")).unwrap()).unwrap();
    assert_eq!(attach["state"], "hung", "{attach:#}");
    assert_eq!(attach["native"], true);
    let result: Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("result.json")).unwrap()).unwrap();
    let verdict = &result["scenarios"][0]["verdict"];
    assert_eq!(verdict["pattern"], "fork-after-threads", "{verdict:#}");
    let headline = verdict["headline"].as_str().unwrap();
    assert!(
        headline
            .starts_with(&format!("Hung: Fork after threads: a child process of rank 0 (pid {}", child[0])),
        "{headline}"
    );
}

/// Ranks started by hand from a shell a person types into (`RANK=1 python train.py &`): the shell
/// is their parent and lacks their rank variables, and was taken for the job's launcher, so
/// `--then stop` sent it SIGTERM (which an interactive bash ignores) and SIGKILL 10 s later: the
/// user's shell died. A shell with no script is never a job's launcher: the ranks are stopped, the
/// shell is left alone.
#[test]
fn then_stop_never_signals_the_shell_the_ranks_were_started_from() {
    use std::io::Write;
    let sb = Sandbox::new();
    let stalled = sb.path().join("stalled");
    let site = repo().join("tests/programs/attach_stall").display().to_string();
    let port = free_port();
    let mut shell = Command::new("bash")
        .current_dir(sb.path())
        .env("PATH", venv_path())
        .env("PYTHONPATH", &site)
        .env("ATTACH_STALL_RANK", "1")
        .env("ATTACH_STALL_STEP", "3")
        .env("ATTACH_STALL_FILE", &stalled)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let prog = program("launchers.py");
    let mut stdin = shell.stdin.take().unwrap();
    for rank in 0..2 {
        writeln!(
            stdin,
            "RANK={rank} LOCAL_RANK={rank} WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT={port} \
             python {prog} --launcher env --steps 1000 > rank{rank}.log 2>&1 &"
        )
        .unwrap();
    }
    stdin.flush().unwrap();
    let reached = eventually(LIMIT, || stalled.exists());
    let ranks = children_of(shell.id());
    assert!(reached, "rank 1 reaches its stall; the shell's children: {ranks:?}");
    let rank0 = ranks
        .iter()
        .copied()
        .find(|&p| std::fs::read_to_string(&stalled).is_ok_and(|s| s.trim() != p.to_string()));
    let rank0 = rank0.expect("rank 0");
    assert!(eventually(LIMIT, || stack(rank0).contains("_engine_run_backward")), "rank 0 waits in backward");
    let a = attach_with(&sb, rank0, &["--then", "stop"]);
    assert_eq!(a.attach["state"].as_str(), Some("hung"), "{:#}\n{}", a.attach, a.stderr);
    let termed = a.attach["stopped"]["sigterm"].as_array().cloned().unwrap_or_default();
    assert!(!termed.contains(&serde_json::json!(shell.id())), "the shell got SIGTERM: {:#}", a.attach);
    assert!(
        eventually(Duration::from_secs(30), || ranks.iter().all(|&p| !crate::util::alive(p.into()))),
        "the ranks were stopped"
    );
    assert!(shell.try_wait().unwrap().is_none(), "the user's shell is alive");
    drop(stdin);
    let _ = shell.kill();
    let _ = shell.wait();
}

/// A parent that starts ranks of several jobs (a test runner, a workflow script, a notebook
/// kernel), told apart by their rendezvous variables, is the launcher of none of them: attaching
/// to one job's rank takes neither that parent nor a rank of another job below it (the suite's own
/// runner, the parent of every test's ranks, was taken for a launcher and a rank of a neighbouring
/// test for rank 1 of a one-rank job: CI of stop 64), and `--then stop` ends the one job only. A
/// parent of one job's ranks only stays its launcher (`secrets::…`: a script that starts its rank).
#[test]
fn a_parent_of_ranks_of_two_jobs_is_no_launcher_and_then_stop_ends_only_the_job_attached_to() {
    let sb = Sandbox::new();
    let port = free_port().to_string();
    let sleeper = "import time\nprint('up', flush=True)\ntime.sleep(600)";
    // The workflow script: two jobs' ranks, each with its own rendezvous variables.
    let parent = format!(
        "import os, subprocess, sys, time\n\
         def start(extra):\n\
         \x20   return subprocess.Popen([sys.executable, '-c', {sleeper:?}], env=dict(os.environ, **extra))\n\
         a = start({{'RANK': '0', 'WORLD_SIZE': '1'}})\n\
         b = start({{'RANK': '1', 'WORLD_SIZE': '2', 'MASTER_ADDR': '127.0.0.1', 'MASTER_PORT': '{port}'}})\n\
         print('started', a.pid, b.pid, flush=True)\n\
         time.sleep(600)\n"
    );
    let job = Job::start(&sb, &[venv_python().display().to_string(), "-c".into(), parent], &[]);
    assert!(job.reaches(|| job.output().matches("up").count() == 2), "both start:\n{}", job.output());
    let pids: Vec<u32> = job
        .output()
        .lines()
        .find_map(|l| l.strip_prefix("started "))
        .expect("the pids")
        .split(' ')
        .map(|p| p.parse().unwrap())
        .collect();
    let (a, b) = (pids[0], pids[1]);
    let other = snapshot(&[job.pid(), b]);
    let out = attach_with(&sb, a, &["--then", "stop"]);
    assert_eq!(out.attach["launcher"], Value::Null, "{:#}", out.attach);
    assert_eq!(out.attach["ranks_found"], serde_json::json!([0]), "{:#}", out.attach);
    assert_eq!(out.attach["world_size"], 1, "{:#}", out.attach);
    assert!(eventually(Duration::from_secs(30), || !crate::util::alive(a.into())), "job a was stopped");
    assert_eq!(snapshot(&[job.pid(), b]), other, "the parent and the other job's rank are as they were");
}
