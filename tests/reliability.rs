//! Reliability and safety through the real binary: ups-doctor signals only its own processes,
//! and an interruption or a hostile input never loses or falsifies a result.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::util::{Sandbox, alive, eventually, repo, venv_python};

/// `setsid sleep 600`: a process of nobody's run. Killed and reaped on drop.
struct Unrelated(Child);

impl Unrelated {
    fn start() -> Unrelated {
        Unrelated(
            Command::new("setsid")
                .args(["sleep", "600"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("setsid sleep starts"),
        )
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Starts one on exactly `pid` (a recycled pid), through `ns_last_pid`; other processes
    /// being created at the same moment can take it first, so this tries again until it lands.
    fn start_on(pid: u32) -> Unrelated {
        for _ in 0..200 {
            std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string())
                .expect("root may set ns_last_pid");
            let u = Unrelated::start();
            if u.pid() == pid {
                return u;
            }
        }
        panic!("could not start a process on pid {pid}");
    }
}

impl Drop for Unrelated {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn forged_worker_markers_never_get_an_unrelated_process_killed() {
    let sb = Sandbox::new();
    let bystander = Unrelated::start();
    let handshake = sb.path().join("handshake");
    std::fs::create_dir_all(&handshake).unwrap();
    let python = venv_python();
    let forge = repo().join("tests/programs/forge_markers.py");
    let file = sb.scenario(
        "forger",
        &format!(
            r#"{{"command": ["{}", "{}", "{}", "{}"], "limits": {{"timeout_s": 300, "hang_after_s": 200}},
                "expect": {{"completes_when": "done"}}}}"#,
            python.display(),
            forge.display(),
            bystander.pid(),
            handshake.display()
        ),
    );
    let run = sb
        .cmd()
        .arg("run")
        .arg(&file)
        .arg("--out")
        .arg(sb.out())
        .args(["--json", "--quiet"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let recycled_file = handshake.join("recycled_pid");
    assert!(eventually(Duration::from_secs(120), || recycled_file.exists()), "the forger never got going");
    let recycled: u32 = std::fs::read_to_string(&recycled_file).unwrap().trim().parse().unwrap();
    let impostor = Unrelated::start_on(recycled);
    std::fs::write(handshake.join("go"), "").unwrap();
    let output = run.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(alive(bystander.pid() as u64), "the process a forged marker named was killed:\n{stderr}");
    assert!(alive(impostor.pid() as u64), "the process on a worker's recycled pid was killed:\n{stderr}");
    let result: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("no result ({e}); stderr:\n{stderr}"));
    let scenario = &result["scenarios"][0];
    let leftovers = scenario["leftovers"]["processes"].as_array().cloned().unwrap_or_default();
    assert!(
        leftovers.iter().all(|p| p["pid"] != bystander.pid() && p["pid"] != impostor.pid()),
        "a foreign process was reported as a leftover of the run: {leftovers:?}"
    );
    let rank = &scenario["ranks"][0];
    // The real worker's marker may be read only after the impostor took its pid (the harness
    // reads markers as they come, on a busy machine later): then that claim is foreign too.
    let claimed = rank["foreign_pids"].clone();
    assert!(
        claimed == serde_json::json!([bystander.pid()])
            || claimed == serde_json::json!([bystander.pid(), recycled]),
        "rank: {rank}"
    );
    assert!(rank["bad_markers"].as_u64() >= Some(1));
    let report = std::fs::read_to_string(sb.out().join("report.md")).unwrap();
    assert!(
        report.contains(&format!("claimed process {} as its data-loader worker", bystander.pid())),
        "report:\n{report}"
    );
}

/// Sends `signal` to `pid` (a child of this test).
fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) on a child this test started.
    unsafe { libc::kill(pid as i32, signal) };
}

#[test]
fn an_interrupted_bisect_caches_only_finished_probes_and_resumes_to_the_right_boundary() {
    let sb = Sandbox::new();
    let file = sb.scenario(
        "single",
        r#"{
  "model": { "depths": [2, 2], "hidden": 32, "heads": 2, "latent_tokens": 8, "window": 2, "mlp_ratio": 2 },
  "data": { "samples": 16, "grid": 64, "timesteps": 4, "queries": 32, "batch_size": 8 },
  "train": { "steps": 6, "accum_steps": 2 },
  "limits": { "timeout_s": 120, "hang_after_s": 60 },
  "inject": [{"fault": "segv", "phase": "model.build/conditioner"}],
  "expect": {"outcome": "signaled"}
}"#,
    );
    let cache = sb.path().join("cache");
    let bisect = |out: &str| {
        let mut cmd = sb.cmd();
        cmd.arg("bisect")
            .arg(&file)
            .arg("--out")
            .arg(sb.path().join(out))
            .args(["--json", "--quiet", "--cache"]);
        cmd.arg(&cache);
        cmd
    };
    let child = bisect("first").stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let third = sb.path().join("first/probes/003");
    assert!(
        eventually(Duration::from_secs(120), || third.exists()),
        "the bisect never reached its third probe"
    );
    signal(child.id(), libc::SIGINT);
    let first = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert_eq!(first.status.code(), Some(130), "{stderr}");
    let cached: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(std::fs::read_dir(&cache).unwrap().next().unwrap().unwrap().path()).unwrap(),
    )
    .unwrap();
    let observations: Vec<&serde_json::Value> =
        cached.as_object().unwrap().values().flat_map(|v| v.as_array().unwrap()).collect();
    assert!(!observations.is_empty(), "nothing cached: {cached}");
    assert!(
        observations.iter().all(|o| o.is_null() || o["outcome"] == "signaled"),
        "an interrupted probe was cached as a result: {cached:#}"
    );
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(sb.path().join("first/bisect.json")).unwrap()).unwrap();
    assert_eq!(record["interrupted"], true, "{record:#}");
    assert!(record["runs"].as_u64().unwrap() <= observations.len() as u64, "unanswered runs were counted");

    let again = bisect("again").output().unwrap();
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(0), "{stderr}");
    let record: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(record["boundary"], serde_json::json!(["model.conditioning"]), "{record:#}");
    let reused = record["probes"].as_array().unwrap().iter().filter(|p| p["cached"] == true).count();
    assert!(reused >= 1, "the resumed bisect ran everything again: {record:#}");
}

/// A tiny 2-rank DDP run whose ranks each start 2 fork data-loader workers (a `/dev/shm` ring
/// each), training long enough that a signal can land in start-up, training or teardown.
const DDP_WITH_WORKERS: &str = r#"{
  "launch": {"mode": "ddp", "world_size": 2},
  "model": { "depths": [1], "hidden": 32, "heads": 2, "latent_tokens": 8, "window": 2 },
  "data": { "samples": 16, "grid": 64, "timesteps": 4, "queries": 32, "batch_size": 8, "workers": 2 },
  "train": { "steps": 150 },
  "limits": { "timeout_s": 120, "hang_after_s": 60 }
}"#;

/// `/dev/shm` files of runs of the ups-doctor with this pid (run ids start with it).
fn shm_of(harness: u32) -> Vec<String> {
    let prefix = format!("ups-doctor-{harness}-");
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Live processes carrying a run id of the ups-doctor with this pid.
fn processes_of(harness: u32) -> Vec<u32> {
    let prefix = format!("UPS_DOCTOR_RUN_ID={harness}-");
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .filter(|&pid| alive(pid as u64))
                .filter(|pid| {
                    std::fs::read(format!("/proc/{pid}/environ"))
                        .is_ok_and(|env| env.split(|&b| b == 0).any(|e| e.starts_with(prefix.as_bytes())))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A small deterministic generator (xorshift), so that the signal times are the same each run.
struct Seeded(u64);

impl Seeded {
    fn next_unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Whether `pid` has a handler for `signal` (`SigCgt` of `/proc/PID/status`).
fn catches(pid: u32, signal: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
        status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            .is_some_and(|mask| mask & (1 << (signal - 1)) != 0)
    })
}

/// What GNU `timeout -s SIG` does when time is up, at `at` seconds after ups-doctor has its
/// handlers (before that, no program can answer a signal): SIG to the command, then SIG to the
/// whole process group (the command leads it here, as `timeout` makes it). `timeout` itself is not
/// used because its clock starts at `exec`, before the dynamic loader has run.
#[test]
fn timeout_sigint_or_sigterm_at_any_moment_always_leaves_a_result_and_nothing_behind() {
    use std::os::unix::process::CommandExt;
    let sb = Sandbox::new();
    let file = sb.scenario("ddp-workers", DDP_WITH_WORKERS);
    // How long a whole run takes here, counted as the trials count: from ups-doctor's handlers
    // being in place to its exit (about 1.5 s on an idle 2-core machine, several times that on a
    // busy one). The points are placed against it, not against a fixed time that a faster or
    // slower machine would move the run away from.
    // The shorter of two runs: the first may pay for a cold start.
    let whole = (0..2)
        .map(|n| {
            let mut cmd = sb.cmd();
            cmd.arg("run")
                .arg(&file)
                .arg("--out")
                .arg(sb.path().join(format!("out-whole-{n}")))
                .arg("--quiet");
            let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
            let pid = child.id();
            assert!(eventually(Duration::from_secs(60), || catches(pid, libc::SIGINT) || !alive(pid as u64)));
            let started = std::time::Instant::now();
            assert_eq!(child.wait().unwrap().code(), Some(0), "the scenario passes when left alone");
            started.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    let mut rng = Seeded(0x5eed_1234_abcd_0018);
    let (mut interrupted, mut before, mut during) = (0, 0, 0);
    for trial in 0..20 {
        // From the start (loading, the environment probe) to a tenth past the whole run's length
        // (teardown, or a finished run): one point in each twentieth of that span, at a seeded
        // place within it. Measured here: about three in four land before the run's result is
        // final (13 of 20 with a span of 1.25 times the run, 15 with 1.1).
        let at = 1.1 * whole * (trial as f64 + rng.next_unit()) / 20.0;
        let (sig, name) = if trial % 2 == 0 { (libc::SIGINT, "INT") } else { (libc::SIGTERM, "TERM") };
        let out = sb.path().join(format!("out-{trial}"));
        let stderr_file = sb.path().join(format!("stderr-{trial}"));
        let mut child = sb
            .cmd()
            .arg("run")
            .arg(&file)
            .arg("--out")
            .arg(&out)
            .args(["--quiet", "--json"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr_file).unwrap())
            .process_group(0)
            .spawn()
            .unwrap();
        let harness = child.id();
        assert!(
            eventually(Duration::from_secs(60), || catches(harness, libc::SIGINT) || !alive(harness as u64)),
            "ups-doctor never installed its handlers"
        );
        std::thread::sleep(Duration::from_secs_f64(at));
        signal(harness, sig);
        // SAFETY: kill(2) on the process group of the child started above.
        unsafe { libc::kill(-(harness as i32), sig) };
        let status = child.wait().unwrap();
        let stderr = std::fs::read_to_string(&stderr_file).unwrap_or_default();
        let what = format!("trial {trial}: SIG{name} at {at:.2} s, status {status}\n{stderr}");
        let text = std::fs::read_to_string(out.join("result.json"))
            .unwrap_or_else(|e| panic!("no result.json ({e}); {what}"));
        let result: serde_json::Value = serde_json::from_str(&text).unwrap();
        match status.code() {
            Some(130) => {
                interrupted += 1;
                assert_eq!(result["interrupted"], true, "{what}");
                let told = result["scenarios"].as_array().map_or(0, Vec::len)
                    + result["not_run"].as_array().map_or(0, Vec::len);
                assert_eq!(told, 1, "the scenario is neither a result nor `not_run`: {what}");
                if result["not_run"].as_array().is_some_and(|n| !n.is_empty()) {
                    before += 1;
                } else {
                    during += 1;
                    assert_eq!(result["scenarios"][0]["interrupted"], true, "{what}");
                }
            }
            // The signal came after the run ended.
            Some(0) => assert_eq!(result["interrupted"], false, "{what}"),
            _ => panic!("unexpected status; {what}"),
        }
        assert!(out.join("report.md").exists(), "{what}");
        assert!(
            eventually(Duration::from_secs(20), || processes_of(harness).is_empty()),
            "processes of the run survived: {:?}; {what}",
            processes_of(harness)
        );
        assert_eq!(shm_of(harness), Vec::<String>::new(), "/dev/shm leftovers; {what}");
    }
    eprintln!(
        "{interrupted} of 20 runs interrupted ({before} before the scenario started, {during} during it)"
    );
    assert!(interrupted >= 10, "only {interrupted} of 20 runs were interrupted: the points missed the run");
}

#[test]
fn secrets_never_reach_the_report_result_json_or_env() {
    let sb = Sandbox::new();
    let file = sb.scenario("plain", r#"{"command": ["true"]}"#);
    let secret_env =
        [("TORCH_HOME_TOKEN", "tSECRET"), ("NCCL_IB_PASSWORD", "hunter2"), ("UPS_DOCTOR_API_KEY", "k3y")];
    let out = sb
        .cmd()
        .arg("run")
        .arg(&file)
        .arg("--out")
        .arg(sb.out())
        .arg("--quiet")
        .envs(secret_env)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let mut shown = vec![
        ("result.json", std::fs::read_to_string(sb.out().join("result.json")).unwrap()),
        ("report.md", std::fs::read_to_string(sb.out().join("report.md")).unwrap()),
    ];
    for args in [&["env"][..], &["env", "--json"], &["env", "--markdown"]] {
        let out = sb.cmd().args(args).envs(secret_env).output().unwrap();
        shown.push(("env", String::from_utf8_lossy(&out.stdout).into_owned()));
    }
    for (what, text) in shown {
        for (name, value) in secret_env {
            assert!(text.contains(name), "{what} does not list {name}:\n{text}");
            assert!(!text.contains(value), "{what} shows the value of {name}:\n{text}");
        }
        assert!(text.contains("<redacted>"), "{what}:\n{text}");
    }
}

#[test]
fn public_masks_the_home_folder_in_the_report_and_result_json() {
    let sb = Sandbox::new();
    let file = sb.scenario("plain", r#"{"command": ["true"]}"#);
    let home = sb.path().display().to_string();
    let out = sb
        .cmd()
        .env("HOME", &home)
        .arg("run")
        .arg(&file)
        .arg("--out")
        .arg(sb.out())
        .args(["--quiet", "--public"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    for name in ["result.json", "report.md"] {
        let text = std::fs::read_to_string(sb.out().join(name)).unwrap();
        assert!(!text.contains(&home), "{name} shows the home folder {home}:\n{text}");
        assert!(text.contains("~/scenarios/plain.json"), "{name}:\n{text}");
    }
}

#[test]
fn the_reports_rerun_command_line_is_shell_quoted() {
    let sb = Sandbox::new();
    let file = sb.scenario(
        "quoting",
        r#"{"command": ["echo", "{x}"], "launch": {"style": "per_rank"}, "params": {"x": "a; touch PWNED; $(touch PWNED2) `touch PWNED3` it's"}}"#,
    );
    let out = sb.cmd().arg("run").arg(&file).arg("--out").arg(sb.out()).arg("--quiet").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let report = std::fs::read_to_string(sb.out().join("report.md")).unwrap();
    let line =
        report.lines().find(|l| l.starts_with("Command (per_rank): ")).expect("a command line").to_string();
    // The command sits in an inline code span, whose fence is as many backticks as needed.
    let rest = line.trim_start_matches("Command (per_rank): ");
    let fence: String = rest.chars().take_while(|&c| c == '`').collect();
    let command = rest[fence.len()..].split(fence.as_str()).next().unwrap().trim();
    let pasted = Command::new("sh").arg("-c").arg(command).current_dir(sb.path()).output().unwrap();
    for f in ["PWNED", "PWNED2", "PWNED3"] {
        assert!(!sb.path().join(f).exists(), "pasting `{command}` ran `touch {f}`");
    }
    assert_eq!(
        String::from_utf8_lossy(&pasted.stdout).trim_end(),
        "a; touch PWNED; $(touch PWNED2) `touch PWNED3` it's",
        "`{command}`"
    );
}

#[test]
fn a_full_disk_never_leaves_a_result_that_claims_more_or_less_than_happened() {
    let sb = Sandbox::new();
    let first = sb.scenario("a-quiet", r#"{"command": ["true"]}"#);
    // 290 kB of output into a 128 KiB disk.
    let second = sb.scenario("b-noisy", r#"{"command": ["seq", "1", "50000"]}"#);
    let disk = crate::util::SmallDisk::mount(sb.path().join("small"), "128k");
    let out_dir = disk.0.join("out");
    let out = sb
        .cmd()
        .arg("run")
        .arg(&first)
        .arg(&second)
        .arg("--out")
        .arg(&out_dir)
        .arg("--quiet")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let what = format!("status {}\n{stderr}", out.status);
    // The failed log write is loud, with the path and the cause.
    let log = out_dir.join("2-b-noisy/rank0.stdout.log");
    assert!(
        stderr.contains(&format!("could not write `{}`: No space left on device", log.display())),
        "{what}"
    );
    assert_eq!(out.status.code(), Some(0), "{what}");
    // The log is cut with a note, not lost: it starts with the program's first lines.
    let text = String::from_utf8(std::fs::read(&log).unwrap()).unwrap();
    assert!(text.starts_with("1\n2\n3\n"), "{text}");
    assert!(text.contains("[ups-doctor: log cut here"), "the log has no note:\n{text}");
    // The result tells both scenarios, and that the noisy one's log was cut.
    let result: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("result.json")).unwrap()).unwrap();
    assert_eq!(result["scenarios"].as_array().map(Vec::len), Some(2), "{result:#}");
    assert_eq!(result["interrupted"], false);
    let errors = result["scenarios"][1]["ranks"][0]["log_errors"].to_string();
    assert!(errors.contains("No space left on device"), "{result:#}");
    assert_eq!(
        result["scenarios"][1]["ranks"][0]["log_tail"].as_array().and_then(|t| t.last()),
        Some(&serde_json::json!("50000"))
    );
    // The scenario's own report (report.md is the run's summary) says so too.
    let report = std::fs::read_to_string(out_dir.join("2-b-noisy/report.md")).unwrap();
    assert!(report.contains("No space left on device"), "{report}");
    // ups-doctor's own copies of its sitecustomize.py (about 30 KB each, needed only while a
    // scenario ran) made room first.
    for scenario in ["1-a-quiet", "2-b-noisy"] {
        assert!(
            !out_dir.join(scenario).join("python-site").exists(),
            "{scenario}'s python-site is still there"
        );
    }
}

/// Issue 57, item 14: Ctrl-C on a run whose ranks are all still running (`plain.py --mode wait`,
/// rank 1 deaf to SIGTERM) — a real SIGINT to ups-doctor, real ranks — twice one copy per rank and
/// once under torchrun. ups-doctor's own teardown (SIGTERM, then SIGKILL for the deaf rank, as
/// `torn_down_with` records) is no crash: no first failure, no collateral, no "before the
/// interrupt" crash, no SIGKILL "by something other than ups-doctor", no bisect of a crash; each
/// rank is said to have been stopped by ups-doctor, and the verdict is the same every time (its
/// wall time aside). No rank outlives it.
#[test]
fn ctrl_c_on_running_ranks_names_no_crash_and_says_the_same_every_time() {
    let program = repo().join("tests/programs/plain.py").display().to_string();
    let python = venv_python().display().to_string();
    let runs: [&[&str]; 3] = [
        &["--ranks", "2", "--", &python, &program],
        &["--ranks", "2", "--", &python, &program],
        &["--", "torchrun", "--nproc_per_node", "2", &program],
    ];
    let mut verdicts = Vec::new();
    for (i, argv) in runs.iter().enumerate() {
        let sb = Sandbox::new();
        let child = sb
            .cmd()
            .env("PATH", crate::util::venv_path())
            .args(["run", "--quiet", "--out"])
            .arg(sb.out())
            .args(*argv)
            .args(["--mode", "wait", "--deaf-rank", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let waiting = |rank: u32| {
            crate::util::files_under(&sb.out())
                .iter()
                .filter(|p| p.extension().is_some_and(|e| e == "log"))
                .any(|p| {
                    std::fs::read_to_string(p).is_ok_and(|t| t.contains(&format!("rank {rank} waiting")))
                })
        };
        assert!(
            eventually(Duration::from_secs(120), || waiting(0) && waiting(1)),
            "run {i}: the ranks never started waiting"
        );
        let ranks = crate::util::files_under(&sb.out());
        // SAFETY: signalling our own child, as a terminal's Ctrl-C does.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(130), "run {i}: {stderr}\n{ranks:?}");
        let result: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(sb.out().join("result.json")).unwrap()).unwrap();
        let s = &result["scenarios"][0];
        assert_eq!((&result["interrupted"], &s["interrupted"]), (&true.into(), &true.into()), "{s:#}");
        for r in s["ranks"].as_array().unwrap() {
            let pid = r["pid"].as_u64().unwrap();
            assert!(eventually(Duration::from_secs(10), || !alive(pid)), "run {i}: rank pid {pid} survived");
            assert_eq!(r["collateral"], false, "run {i}: {s:#}");
        }
        assert_eq!(s["ranks"][1]["torn_down_with"], "SIGKILL", "run {i}: {s:#}");
        assert!(
            s["first_failure"].is_null(),
            "run {i}: a first failure from ups-doctor's own signals: {s:#}"
        );
        let v = &s["verdict"];
        let text = v.to_string();
        for wrong in
            ["Before the interrupt", "something other than ups-doctor", "bisect", "crash", "collateral"]
        {
            assert!(!text.contains(wrong), "run {i}: the verdict says `{wrong}`: {v:#}");
        }
        assert!(v["likely_cause"].is_null() && v["pattern"].is_null(), "run {i}: {v:#}");
        let headline = v["headline"].as_str().unwrap();
        assert!(
            headline.contains("nothing had failed") && headline.contains("ups-doctor stopped"),
            "{headline}"
        );
        let evidence: Vec<&str> =
            v["evidence"].as_array().unwrap().iter().filter_map(|e| e.as_str()).collect();
        assert!(evidence.iter().any(|e| e.starts_with("rank 1:") && e.contains("SIGKILL")), "{evidence:?}");
        let report = std::fs::read_to_string(sb.out().join("report.md")).unwrap();
        assert!(report.contains("## plain: interrupted") && !report.contains("first failure"), "{report}");
        let found = crate::consistency::check_run_dir(&sb.out());
        assert!(found.is_empty(), "the report contradicts its result.json:\n{}", found.join("\n"));
        // The same verdict every time: only the wall time in the headline differs.
        let mut same = v.clone();
        let wall = headline.split(" s,").next().unwrap().rsplit(' ').next().unwrap().to_string();
        same["headline"] = headline.replacen(&wall, "T", 1).into();
        verdicts.push(same);
    }
    assert!(verdicts.windows(2).all(|w| w[0] == w[1]), "{verdicts:#?}");
}
