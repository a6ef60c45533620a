//! The observer in the `sitecustomize` ups-doctor puts first on a command's `PYTHONPATH`
//! (`python/site/sitecustomize.py`) and the verdicts that read it, on real PyTorch 2.11 programs
//! (CPU, gloo) that know nothing of ups-doctor, with faults injected from outside them: a
//! second `sitecustomize` on `PYTHONPATH` (`tests/programs/inject/`), which ups-doctor's runs after
//! its own.

use std::ffi::OsStr;

use crate::util::{Sandbox, repo};
use serde_json::Value;

/// `torchrun` over `tests/programs/observed_ddp.py` on `ranks` ranks, expecting `outcome`.
fn ddp_scenario(sb: &Sandbox, name: &str, ranks: u32, outcome: &str) -> std::path::PathBuf {
    let program = repo().join("tests/programs/observed_ddp.py").display().to_string();
    sb.scenario(
        name,
        &format!(
            r#"{{"command": ["torchrun", "--nproc_per_node", "{ranks}", "--master_port", "{{master_port}}",
                 "{program}", "--steps", "20"],
                "launch": {{"world_size": {ranks}}}, "limits": {{"timeout_s": 180, "hang_after_s": 10}},
                "expect": {{"outcome": "{outcome}"}}}}"#
        ),
    )
}

/// `torchrun` over `ranks` ranks of the repository's `program` with `args`, expecting `outcome`
/// (a hang declared after `hang_after_s`).
fn torchrun_scenario(
    sb: &Sandbox,
    name: &str,
    ranks: u32,
    program: &str,
    args: &[&str],
    hang_after_s: u32,
    outcome: &str,
) -> std::path::PathBuf {
    let path = repo().join(program).display().to_string();
    let ranks_text = ranks.to_string();
    let mut command =
        vec!["torchrun", "--nproc_per_node", &ranks_text, "--master_port", "{master_port}", &path];
    command.extend(args);
    let scenario = serde_json::json!({
        "command": command,
        "launch": {"world_size": ranks},
        "limits": {"timeout_s": 180, "hang_after_s": hang_after_s},
        "expect": {"outcome": outcome},
    });
    sb.scenario(name, &scenario.to_string())
}

/// Runs one scenario with the injector on `PYTHONPATH` and `env` set; its result.
fn run_injected(sb: &Sandbox, file: &std::path::Path, env: &[(&str, &str)]) -> Value {
    let inject = repo().join("tests/programs/inject");
    let mut vars: Vec<(&str, &OsStr)> = vec![("PYTHONPATH", inject.as_os_str())];
    vars.extend(env.iter().map(|(k, v)| (*k, OsStr::new(*v))));
    let run = sb.run_in_venv_with_env(&[file], &vars);
    let s = run.result["scenarios"][0].clone();
    assert_eq!(run.code(), 0, "outcome as expected; stderr:\n{}\nverdict: {:#}", run.stderr(), s["verdict"]);
    s
}

/// The number of the first line of `tests/programs/observed_ddp.py` that holds `needle`, as the
/// program's frames name it.
fn line_of(needle: &str) -> usize {
    let source = std::fs::read_to_string(repo().join("tests/programs/observed_ddp.py")).unwrap();
    source
        .lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no `{needle}` in observed_ddp.py"))
        + 1
}

fn verdict<'v>(s: &'v Value, field: &str) -> &'v str {
    s["verdict"][field].as_str().unwrap_or_else(|| panic!("no verdict.{field}: {:#}", s["verdict"]))
}

/// Rank 0 or rank 1 skips, of 2 and of 4, and rank 2 of 4: the ledger names the one that skipped,
/// whichever it is and however many wait.
#[test]
fn a_skipped_collective_is_attributed_to_the_rank_that_skipped_it_whichever_it_is() {
    for (ranks, skipper) in [(2u32, 0u32), (2, 1), (4, 0), (4, 1), (4, 2)] {
        let sb = Sandbox::new();
        let file = ddp_scenario(&sb, "skip", ranks, "hung");
        // The 5th `all_gather` of the skipping rank returns at once without gathering.
        let s = run_injected(
            &sb,
            &file,
            &[("INJECT_SKIP_RANK", &skipper.to_string()), ("INJECT_SKIP_CALL", "5")],
        );
        assert_eq!(verdict(&s, "pattern"), "collective-mismatch", "{:#}", s["verdict"]);
        assert_eq!(s["first_failure"].as_u64(), Some(u64::from(skipper)), "{:#}", s["verdict"]);
        let others: Vec<String> = (0..ranks).filter(|r| *r != skipper).map(|r| r.to_string()).collect();
        let (waiters, verb) = if others.len() == 1 {
            (format!("rank {}", others[0]), "waits")
        } else {
            (format!("ranks {}", others.join(", ")), "wait")
        };
        let shapes = vec!["1"; (ranks as usize + 1).min(4)].join(",");
        let headline = verdict(&s, "headline");
        assert!(
            headline.starts_with(&format!(
                "Collectives out of step: rank {skipper} never issued `all_gather` #5 (observed_ddp.py:{}, \
                 {shapes}, float32), which {waiters} {verb} in",
                line_of("dist.all_gather(")
            )),
            "{headline}"
        );
        let rank = &s["ranks"][skipper as usize]["observed"];
        assert_eq!(
            (rank["group"]["backend"].as_str(), rank["group"]["world_size"].as_u64()),
            (Some("gloo"), Some(u64::from(ranks)))
        );
        if ranks == 2 {
            the_trace_shows_each_ranks_collectives_and_the_one_it_waits_in(&sb, &s, 1 - skipper);
        }
    }
}

/// `trace.json`, loaded by Chrome DevTools' trace engine: each rank has a track of its
/// collectives as the observer's ledger kept them, at the times result.json gives; the waiting
/// rank's `all_gather` #5 is drawn open up to its end.
fn the_trace_shows_each_ranks_collectives_and_the_one_it_waits_in(sb: &Sandbox, s: &Value, waiter: u32) {
    let parsed = crate::trace::parse(&sb.out().join("trace.json"));
    crate::trace::assert_within_run(&parsed, s["wall_s"].as_f64().unwrap());
    for rank in 0..2u32 {
        let r = &s["ranks"][rank as usize];
        let ledger = r["observed"]["ledger"].as_array().unwrap();
        let tracks: Vec<&Value> = parsed["threads"]
            .as_array()
            .unwrap()
            .iter()
            // The ledger's track, not the Flight Recorder's beside it (present where a rank
            // answered ups-doctor's request for it as the hang was found).
            .filter(|t| {
                t["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("collectives") && !n.contains("Flight Recorder"))
            })
            .filter(|t| t["process"] == format!("rank {rank}"))
            .collect();
        assert_eq!(tracks.len(), 1, "rank {rank}: one collectives track: {:#}", parsed["threads"]);
        let slices = tracks[0]["slices"].as_array().unwrap();
        assert_eq!(slices.len(), ledger.iter().filter(|e| e["at_s"].is_number()).count(), "rank {rank}");
        for (slice, entry) in slices.iter().zip(ledger.iter().filter(|e| e["at_s"].is_number())) {
            assert_eq!(
                slice["name"],
                format!("{} #{}", entry["op"].as_str().unwrap(), entry["seq"]),
                "rank {rank}"
            );
            assert_eq!(slice["ts"].as_f64().unwrap(), (entry["at_s"].as_f64().unwrap() * 1e6).round());
        }
        if rank == waiter {
            let open = slices
                .iter()
                .find(|x| x["args"]["open"] == true)
                .expect("the waiting rank's collective is open");
            assert_eq!(open["name"], "all_gather #5", "{slices:#?}");
            let end = (r["ended_at_s"].as_f64().unwrap() * 1e6).round();
            assert_eq!(open["ts"].as_f64().unwrap() + open["dur"].as_f64().unwrap(), end);
        }
    }
}

#[test]
fn a_rank_slow_to_load_its_data_is_named_a_straggler_with_its_phase() {
    let sb = Sandbox::new();
    let file = ddp_scenario(&sb, "straggler", 2, "passed");
    let s = run_injected(&sb, &file, &[("INJECT_SLOW_RANK", "1"), ("INJECT_SLOW_MS", "40")]);
    assert_eq!(verdict(&s, "pattern"), "straggler", "{:#}", s["verdict"]);
    let headline = verdict(&s, "headline");
    assert!(
        headline.starts_with("Passed: 2 ranks of `torchrun … observed_ddp.py` finished in"),
        "{headline}"
    );
    assert!(
        headline.contains("Rank 1 is a straggler: its steps spend")
            && headline.contains("in data loading (`DataLoader.__next__`)"),
        "{headline}"
    );
    // Both ranks' steps were counted by the optimizer hook, without a change to the program.
    for r in s["ranks"].as_array().unwrap() {
        assert_eq!(r["steps_done"], 20, "{r}");
        assert_eq!(r["observed"]["steps"], 20, "{r}");
    }
    // The PyTorch the program ran, read inside it (not the bundled libtorch), leads the
    // report's Environment section: the venv's torch 2.11.0, its CUDA build and its NCCL.
    let torch = &s["ranks"][0]["observed"]["torch"];
    assert!(torch["version"].as_str().is_some_and(|v| v.starts_with("2.11.0")), "{torch}");
    assert_eq!(torch["executable"], crate::util::venv_python().display().to_string(), "{torch}");
    let md = std::fs::read_to_string(sb.out().join("report.md")).unwrap();
    let line =
        md.lines().find(|l| l.starts_with("**Your program ran:** Python ")).unwrap_or_else(|| panic!("{md}"));
    assert!(line.contains(&format!("torch `{}`", torch["version"].as_str().unwrap())), "{line}");
    if let Some(nccl) = torch["nccl"].as_str() {
        assert!(line.contains(&format!("NCCL {nccl}")) && nccl.split('.').count() == 3, "{line}");
    }
}

/// A program whose optimizer is stepped once per parameter group each training step, as DeepSpeed's
/// ZeRO-1/2 optimizer steps the one it wraps: each training step is one step, not one per group
/// (TRL's SFT script under ZeRO-2 was counted 40 steps for 20, each "step" half of one, and rank 1's
/// 300 ms a step of its own work was not named), and a rank slow to load its data is still named.
#[test]
fn an_optimizer_stepped_once_per_parameter_group_counts_one_step_a_training_step() {
    let sb = Sandbox::new();
    let args = ["--steps", "20", "--step-per-group"];
    let file = torchrun_scenario(&sb, "per-group", 2, "tests/programs/observed_ddp.py", &args, 10, "passed");
    let s = run_injected(&sb, &file, &[("INJECT_SLOW_RANK", "1"), ("INJECT_SLOW_MS", "40")]);
    for r in s["ranks"].as_array().unwrap() {
        assert_eq!(r["steps_done"], 20, "{r}");
        assert_eq!(r["observed"]["steps"], 20, "{r}");
    }
    assert_eq!(verdict(&s, "pattern"), "straggler", "{:#}", s["verdict"]);
    let headline = verdict(&s, "headline");
    assert!(
        headline.contains("Rank 1 is a straggler: its steps spend")
            && headline.contains("in data loading (`DataLoader.__next__`)"),
        "{headline}"
    );
}

/// A program stepping faster than the observer sends (every 0.25 s) sends one step marker per
/// batch, each saying the steps since the last: every step is still counted, its samples too, and
/// the trace draws a batch as `steps a–b`.
#[test]
fn fast_steps_are_sent_in_batches_and_every_step_still_counts() {
    let sb = Sandbox::new();
    let program = repo().join("tests/programs/observed_ddp.py").display().to_string();
    let file = sb.scenario(
        "fast",
        &format!(
            r#"{{"command": ["torchrun", "--nproc_per_node", "1", "--master_port", "{{master_port}}",
                 "{program}", "--steps", "400"],
                "launch": {{"world_size": 1}}, "limits": {{"timeout_s": 180}},
                "expect": {{"outcome": "passed"}}}}"#
        ),
    );
    let run = sb.run_in_venv(&[&file]);
    let s = &run.result["scenarios"][0];
    assert_eq!(run.code(), 0, "stderr:\n{}\nverdict: {:#}", run.stderr(), s["verdict"]);
    let r = &s["ranks"][0];
    assert_eq!(r["steps_done"], 400, "{r}");
    assert_eq!(r["observed"]["steps"], 400, "{r}");
    // Every collective counted (400 `all_gather`s and the closing `barrier`), though a batch sends
    // only its newest 32 that have returned; the ledger keeps the newest, in order.
    assert_eq!(r["observed"]["collectives"], 401, "{r}");
    let ledger = r["observed"]["ledger"].as_array().unwrap();
    let seqs: Vec<u64> = ledger.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (401 - seqs.len() as u64 + 1..=401).collect::<Vec<_>>(), "{ledger:?}");
    assert_eq!((ledger.len(), ledger.last().unwrap()["op"].as_str()), (32, Some("barrier")), "{ledger:?}");
    // 400 steps of 32 samples (the batch size `DataLoader.__next__` returned).
    let samples_per_s = s["samples_per_s"].as_f64().unwrap_or_else(|| panic!("{s}"));
    let steps_per_s = s["steps_per_s"].as_f64().unwrap_or_else(|| panic!("{s}"));
    assert!((samples_per_s / steps_per_s - 32.0).abs() < 1e-6, "{samples_per_s} / {steps_per_s}");
    // Fewer markers than steps: 400 would need a send between every two steps, 100 s of them.
    let ends = r["step_ends_s"].as_array().unwrap();
    assert!(!ends.is_empty() && ends.len() < 400, "{ends:?}");
    assert_eq!(ends.last().unwrap()[0], 399, "{ends:?}");
    let trace: Value =
        serde_json::from_str(&std::fs::read_to_string(sb.out().join("trace.json")).unwrap()).unwrap();
    let batches = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["cat"] == "step" && e["name"].as_str().is_some_and(|n| n.starts_with("steps ")))
        .count();
    assert!(batches > 0, "no `steps a–b` slice in trace.json");
}

/// torchrun itself computes for 12 s without a word before it starts any rank (a slow `import
/// torch` on a loaded machine) with `hang_after_s` at 4: the launcher is busy, not hung, and the
/// run passes. Before the launcher's own CPU time counted, such a run was "No rank started".
#[test]
fn a_launcher_computing_silently_past_the_hang_threshold_before_its_ranks_start_is_not_hung() {
    silent_launcher_passes("slow-launcher", "INJECT_LAUNCHER_BUSY_S");
}

/// The same launcher waiting on its disk instead of computing (1 MiB read a second, a few
/// milliseconds of CPU: an `import torch` from a network filesystem, or from a disk a build beside
/// it keeps busy). Seen in a fresh-clone test run beside heavy jobs: torchrun had started no rank
/// after 20 s, using too little CPU to count as busy, and the run was "No rank started". What
/// the launcher's processes read counts as progress too.
#[test]
fn a_launcher_reading_silently_past_the_hang_threshold_before_its_ranks_start_is_not_hung() {
    silent_launcher_passes("reading-launcher", "INJECT_LAUNCHER_READING_S");
}

/// A 2-rank DDP run under torchrun whose launcher spends 12 s without a word before it starts any
/// rank (`variable`, one of the injector's) with `hang_after_s` at 4: it must pass, not hang.
fn silent_launcher_passes(name: &str, variable: &str) {
    let sb = Sandbox::new();
    let file = ddp_scenario(&sb, name, 2, "passed");
    let text =
        std::fs::read_to_string(&file).unwrap().replace(r#""hang_after_s": 10"#, r#""hang_after_s": 4"#);
    assert!(text.contains(r#""hang_after_s": 4"#), "{text}");
    std::fs::write(&file, text).unwrap();
    let s = run_injected(&sb, &file, &[(variable, "12")]);
    // The silence really was past the threshold: the launcher's own start alone takes 12 s.
    assert!(s["wall_s"].as_f64().is_some_and(|w| w >= 12.0), "{:#}", s["verdict"]);
    for r in s["ranks"].as_array().unwrap() {
        assert_eq!(r["outcome"], "passed", "{r}");
        assert!(r["hang_detected_after_s"].is_null(), "{r}");
        assert_eq!(r["steps_done"], 20, "{r}");
    }
}

/// Rank 0 computes for 25 s without a word before a gather (a long validation, a compile) while
/// rank 1 waits in it, silent: with `hang_after_s` at 10 the run is busy, not hung (issue 32:
/// "a hang is declared only on a rank whose own progress and CPU time have stopped").
#[test]
fn a_rank_computing_silently_past_the_hang_threshold_is_busy_and_the_run_is_not_called_hung() {
    let sb = Sandbox::new();
    let file = ddp_scenario(&sb, "busy", 2, "passed");
    let s = run_injected(
        &sb,
        &file,
        &[("INJECT_BUSY_RANK", "0"), ("INJECT_BUSY_S", "25"), ("INJECT_BUSY_CALL", "3")],
    );
    // The silence really was past the threshold: the computing alone takes 25 s of wall time.
    assert!(s["wall_s"].as_f64().is_some_and(|w| w >= 25.0), "{:#}", s["verdict"]);
    for r in s["ranks"].as_array().unwrap() {
        assert_eq!(r["outcome"], "passed", "{r}");
        assert!(r["hang_detected_after_s"].is_null(), "{r}");
        assert_eq!(r["steps_done"], 20, "{r}");
    }
}

#[test]
fn accelerate_launch_cpu_with_two_processes_is_reported_as_one_process_not_distributed() {
    let sb = Sandbox::new();
    let program = repo().join("tests/programs/accelerate_train.py").display().to_string();
    let file = sb.scenario(
        "accelerate",
        &format!(
            r#"{{"command": ["accelerate", "launch", "--cpu", "--num_processes", "2", "{program}"],
                "launch": {{"world_size": 2}}, "limits": {{"timeout_s": 180, "hang_after_s": 60}}}}"#
        ),
    );
    let run = sb.run_in_venv(&[&file]);
    let s = &run.result["scenarios"][0];
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    assert_eq!(verdict(s, "pattern"), "not-distributed", "{:#}", s["verdict"]);
    let headline = verdict(s, "headline");
    assert!(
        headline.contains(
            "But it was not distributed: 2 ranks were declared, 1 process trained (20 optimizer steps) and none \
             called `init_process_group`."
        ),
        "{headline}"
    );
}

/// The rendezvous port is held by another process (started here, outside the run, as a user's
/// earlier job would be): torchrun cannot open its store and no rank starts. The verdict names the
/// port and the process holding it, and no rank "failed" that never started.
#[test]
fn a_rendezvous_port_in_use_names_the_port_and_its_holder_and_no_rank_failed() {
    use std::io::BufRead;
    let sb = Sandbox::new();
    let mut holder = std::process::Command::new(crate::util::venv_python())
        .args([
            "-c",
            "import socket, time\ns = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n\
             print(s.getsockname()[1], flush=True); time.sleep(600)",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the port holder starts");
    let mut port = String::new();
    std::io::BufReader::new(holder.stdout.take().unwrap()).read_line(&mut port).unwrap();
    let port = port.trim().to_string();
    let program = repo().join("tests/programs/observed_ddp.py").display().to_string();
    let mut cmd = sb.cmd();
    cmd.env("PATH", crate::util::venv_path());
    let run = sb.run_with(
        cmd,
        &[],
        &["--", "torchrun", "--nproc_per_node", "2", "--master_port", &port, &program, "--steps", "5"],
    );
    let holder_pid = holder.id();
    holder.kill().unwrap();
    holder.wait().unwrap();
    let s = &run.result["scenarios"][0];
    assert_eq!(run.code(), 1, "not met; stderr:\n{}", run.stderr());
    assert_eq!(verdict(s, "pattern"), "rendezvous-port-in-use", "{:#}", s["verdict"]);
    let headline = verdict(s, "headline");
    assert!(
        headline.starts_with(&format!(
            "The rendezvous port {port} was already in use (`EADDRINUSE`), held by process {holder_pid} (`"
        )) && headline.ends_with("`torchrun` could not open its store, and no rank started."),
        "{headline}"
    );
    assert!(verdict(s, "key_line").contains("EADDRINUSE"));
    assert!(s["first_failure"].is_null(), "no rank is the first failure: {}", s["first_failure"]);
    for r in s["ranks"].as_array().unwrap() {
        assert_eq!(
            (r["outcome"].as_str(), r["collateral"].as_bool()),
            (Some("launch_failed"), Some(false)),
            "{r}"
        );
    }
    let launcher = &s["external"]["launcher"]["port_in_use"];
    assert_eq!(launcher["port"].to_string(), port, "{launcher}");
    assert_eq!(launcher["holder_pid"], holder_pid, "{launcher}");
}

/// Observing must not change what is observed: the same failing command (rank 1 of a DDP program
/// under torchrun segfaults at step 3; a fault from the program, nothing injected by us) judged
/// with the observer and with `--no-observe` ends in the same outcome, signal and first failure.
#[test]
fn a_failing_run_ends_the_same_way_with_and_without_the_observer() {
    let program = repo().join("tests/programs/ddp.py").display().to_string();
    let argv = ["torchrun", "--nproc_per_node", "2", &program, "--segv-rank", "1", "--segv-step", "3"];
    let mut ends = Vec::new();
    for observe in [true, false] {
        let sb = Sandbox::new();
        let mut cmd = sb.cmd();
        cmd.env("PATH", crate::util::venv_path());
        let mut args = vec!["--hang-after", "60"];
        if !observe {
            args.push("--no-observe");
        }
        args.push("--");
        args.extend(argv);
        let run = sb.run_with(cmd, &[], &args);
        let s = run.result["scenarios"][0].clone();
        assert_eq!(
            s["ranks"][0]["observed"].is_object(),
            observe,
            "observed only with the observer on: {}",
            s["ranks"][0]
        );
        ends.push((s["outcome"].clone(), s["first_failure"].clone(), s["ranks"][1]["signal"].clone()));
    }
    assert_eq!(ends[0], ends[1], "observed vs --no-observe");
    assert_eq!(ends[0], (Value::from("signaled"), Value::from(1), Value::from("SIGSEGV")));
}

/// A command's DataLoader workers, which the program starts without a word to ups-doctor, are
/// announced by the observer in the rank that started them: each rank's `workers` holds its own
/// (their pids below that rank, the start method the loader used), and the memory table shows
/// them as workers with their PSS and USS, not as anonymous children. Per rank (`python`, the
/// marker pipe) and under torchrun (the FIFO, where a worker's marker goes to its parent's rank).
/// A worker is sampled when it is announced; its samples at 250 ms after that are what a busy
/// machine may not get round to, so the workers here decode slowly enough to live about 2 s (at
/// the default 4 ms a sample they lived 0.45 s, and CI once saw no worker row at all).
#[test]
fn a_commands_dataloader_workers_are_named_per_rank_with_their_memory() {
    let program = repo().join("tests/programs/slow_data.py").display().to_string();
    let args = ["--steps", "12", "--num-workers", "2", "--decode-ms", "40"];
    for (argv, ranks) in [
        ([&["--", "python", &program][..], &args].concat(), 1usize),
        ([&["--", "torchrun", "--nproc_per_node", "2", &program][..], &args].concat(), 2),
    ] {
        let sb = Sandbox::new();
        let mut cmd = sb.cmd();
        cmd.env("PATH", crate::util::venv_path());
        let run = sb.run_with(cmd, &[], &argv);
        assert_eq!(run.code(), 0, "{}", run.stderr());
        let s = run.scenario();
        let processes = s["memory"]["processes"].as_array().unwrap();
        for rank in 0..ranks {
            let r = &s["ranks"][rank];
            let workers =
                r["workers"].as_array().unwrap_or_else(|| panic!("rank {rank} names no worker: {r:#}"));
            assert_eq!(workers.len(), 2, "rank {rank}: {workers:#?}");
            for (id, w) in workers.iter().enumerate() {
                assert_eq!(
                    (w["id"].as_u64(), w["start_method"].as_str()),
                    (Some(id as u64), Some("fork")),
                    "{w}"
                );
                let row = processes
                    .iter()
                    .find(|p| p["pid"] == w["pid"])
                    .unwrap_or_else(|| panic!("worker {w} has no memory row: {processes:#?}"));
                assert_eq!(
                    (row["rank"].as_u64(), row["role"].as_str()),
                    (Some(rank as u64), Some("worker")),
                    "{row}"
                );
                assert!(row["peak_uss_bytes"].as_u64().is_some_and(|b| b > 0), "{row}");
            }
        }
        // The report speaks of the program's own DataLoader and re-runs the run folder's
        // `scenario.json`, without the built-in trainer's fields the command never used.
        let md = sb.reports();
        assert!(md.contains("```sh\nups-doctor run scenario.json\n```"), "{md}");
        assert!(!md.contains("`data.workers`") && !md.contains("\"model\": {"), "{md}");
        assert!(sb.out().join("scenario.json").is_file());
    }
}

/// A rank that waits in `DataLoader.__next__` while its workers decode a slow first batch is
/// silent (no step, no output) and uses no CPU itself, but its workers do: it is busy, not hung.
/// Each worker's first batch costs 8 × 600 ms of CPU here, four workers on two cores, so both
/// ranks are silent for 10 s or more against `--hang-after 3`; a rank's CPU is read with its
/// workers' (before, its own process alone was read, and this run was stopped as "Rank 0 hung").
/// Only its DataLoader workers count: a child forked after OpenMP's threads that deadlocks spinning
/// in libgomp is still a hang (`patterns::hangs_of_real_programs_are_named_from_py_spy_stacks`).
#[test]
fn ranks_waiting_on_their_dataloader_workers_first_batch_are_busy_not_hung() {
    let program = repo().join("tests/programs/slow_data.py").display().to_string();
    let sb = Sandbox::new();
    let mut cmd = sb.cmd();
    cmd.env("PATH", crate::util::venv_path());
    let argv = [
        "--hang-after",
        "3",
        "--",
        "torchrun",
        "--nproc_per_node",
        "2",
        &program,
        "--steps",
        "2",
        "--num-workers",
        "2",
        "--decode-ms",
        "600",
    ];
    let run = sb.run_with(cmd, &[], &argv);
    let s = run.scenario();
    assert_eq!(run.code(), 0, "{}\nverdict: {:#}", run.stderr(), s["verdict"]);
    assert_eq!(s["outcome"], "passed", "{:#}", s["verdict"]);
    for r in s["ranks"].as_array().unwrap() {
        assert_eq!(r["outcome"], "passed", "{r:#}");
        assert_eq!(r["observed"]["steps"], 2, "{r:#}");
        // The silence was real: the first step ended past the hang threshold after the workers
        // were started (their announcement was the rank's last sign of life before it).
        let started = r["workers"].as_array().unwrap().iter().filter_map(|w| w["started_at_s"].as_f64());
        let started = started.fold(f64::NAN, f64::max);
        let first_step = r["step_ends_s"][0][1].as_f64().unwrap_or(f64::NAN);
        assert!(
            first_step - started >= 3.0,
            "workers started at {started} s, first step at {first_step} s: {r:#}"
        );
    }
}

/// Under torchrun every rank's traceback lands, unprefixed, in one shared stream: which rank
/// raised what cannot be told from the output. The observer's `sys.excepthook` (chained) sends
/// the rank's uncaught exception as its error, with the program's own frame. Rank 1's
/// `import torch.utils.data.distributed` fails (injected from outside: a package missing from
/// one node's image); rank 0, stopped by torchrun, is collateral.
#[test]
fn a_ranks_uncaught_exception_under_torchrun_is_that_ranks_error_with_the_programs_line() {
    let sb = Sandbox::new();
    let file = ddp_scenario(&sb, "missing", 2, "exited");
    let s = run_injected(
        &sb,
        &file,
        &[("INJECT_MISSING_RANK", "1"), ("INJECT_MISSING_MODULE", "torch.utils.data.distributed")],
    );
    assert_eq!(s["first_failure"], 1, "{:#}", s["verdict"]);
    let error = format!(
        "ModuleNotFoundError: No module named 'torch.utils.data.distributed' (observed_ddp.py:{} in <module>)",
        line_of("from torch.utils.data.distributed import")
    );
    assert_eq!(s["ranks"][1]["error"], error, "{:#}", s["ranks"][1]);
    assert_eq!(verdict(&s, "key_line"), error);
    let headline = verdict(&s, "headline");
    assert!(headline.starts_with(&format!("Rank 1 exited with status 1: {error}")), "{headline}");
    assert!(headline.ends_with("Rank 0 failed after it (collateral)."), "{headline}");
    // The launcher's own `ChildFailedError` is no rank's error.
    assert!(s["ranks"][0]["error"].is_null(), "{:#}", s["ranks"][0]);
}

/// Rank 1 falls asleep before its 3rd gather (a slow disk, a lock: injected from outside) while
/// rank 0 waits in it. Rank 1 never issued that gather, but not because it skipped it: its stack
/// is outside any collective. It is named as the rank the other waits for and said to be behind,
/// with the program's line it was at; the ledger alone is not made to say it "went past".
#[test]
fn a_rank_asleep_outside_any_collective_is_behind_not_a_collective_mismatch() {
    let sb = Sandbox::new();
    let file = ddp_scenario(&sb, "sleep", 2, "hung");
    let s = run_injected(
        &sb,
        &file,
        &[("INJECT_SLEEP_RANK", "1"), ("INJECT_SLEEP_S", "60"), ("INJECT_SLEEP_CALL", "3")],
    );
    assert_eq!(verdict(&s, "pattern"), "ranks-out-of-step", "{:#}", s["verdict"]);
    assert_eq!(s["first_failure"], 1, "{:#}", s["verdict"]);
    let headline = verdict(&s, "headline");
    assert!(headline.contains("Rank 1 is the odd one: it is stuck outside any collective"), "{headline}");
    let cause = verdict(&s, "likely_cause");
    assert!(
        cause.contains(&format!(
            "Rank 1 is behind, in its own work outside any collective, at `main (observed_ddp.py:{})`",
            line_of("dist.all_gather(")
        )),
        "{cause}"
    );
    assert!(!format!("{:#}", s["verdict"]).contains("gone on past"), "{:#}", s["verdict"]);
}

/// One rank computes alone for a minute before its 5th optimizer step (injected: a long
/// evaluation or a checkpoint written by one rank), in a program whose only collectives are DDP's
/// own (`--no-gather`), with the group's timeout at 5 s: rank 0 waits in DDP's next all-reduce and
/// gives up first; torchrun then stops rank 1. Rank 0 failed first because it waited: the group's
/// count (which counts DDP's reductions, issued from C++) names rank 1 as the rank it waited for,
/// and neither is called the other's collateral. Without the observer there is no count: the
/// verdict says it cannot tell, and still calls no rank collateral.
#[test]
fn a_collective_that_timed_out_names_the_rank_it_waited_for_not_the_first_to_fail() {
    let program = repo().join("tests/programs/observed_ddp.py").display().to_string();
    for observe in [true, false] {
        let sb = Sandbox::new();
        let file = sb.scenario(
            "timeout",
            &format!(
                r#"{{"command": ["torchrun", "--nproc_per_node", "2", "--master_port", "{{master_port}}",
                     "{program}", "--steps", "20", "--no-gather", "--timeout-s", "5"],
                    "launch": {{"world_size": 2, "observe": {observe}}},
                    "limits": {{"timeout_s": 180, "hang_after_s": 30}}, "expect": {{"outcome": "exited"}}}}"#
            ),
        );
        let s = run_injected(
            &sb,
            &file,
            &[("INJECT_STALL_RANK", "1"), ("INJECT_STALL_S", "60"), ("INJECT_STALL_STEP", "5")],
        );
        assert_eq!(verdict(&s, "pattern"), "collective-timeout", "{:#}", s["verdict"]);
        assert_eq!(s["first_failure"], 0, "{:#}", s["verdict"]);
        let headline = verdict(&s, "headline");
        assert!(headline.starts_with("Rank 0 gave up after 5 s waiting in a collective"), "{headline}");
        if observe {
            // Where rank 1 was as torchrun stopped it, from the stack it wrote itself then: the
            // program's `optimizer.step()` line (the stall runs in the step's pre-hook).
            let step_line = line_of("optimizer.step()");
            assert!(
                headline.contains("which rank 1 had not reached")
                    && headline.ends_with(&format!(
                        "it was waiting for rank 1, outside any collective, at `main (observed_ddp.py:{step_line})` \
                         when it was stopped."
                    )),
                "{headline}"
            );
            let dumps = s["ranks"][1]["dumps"].as_array().expect("rank 1's dumps");
            assert!(
                dumps.iter().any(|d| d["taken"] == "as SIGTERM stopped it"
                    && d["python"].as_str().is_some_and(|t| t.contains("in _compute"))),
                "{dumps:#?}"
            );
        } else {
            assert!(
                headline.contains(
                    "which rank it waited for cannot be told: the observer did not read every rank's count"
                ),
                "{headline}"
            );
        }
        assert!(!headline.contains("collateral"), "{headline}");
        assert_eq!(s["ranks"][1]["signal"], "SIGTERM", "torchrun stopped rank 1: {:#}", s["ranks"][1]);
        assert_eq!(s["ranks"][1]["collateral"], false, "{:#}", s["ranks"][1]);
        // The ranks' stack files were read into the result, and their folder is gone.
        let left: Vec<_> = walkdir(&sb.out()).into_iter().filter(|p| p.ends_with("stop-stacks")).collect();
        assert!(left.is_empty(), "{left:?}");
    }
}

/// A Lightning program (`tests/programs/launchers.py --launcher lightning`) under torchrun: rank 0
/// raises at step 3 while rank 1 computes in its optimizer step (a stall injected from outside).
/// torchrun stops rank 1 with SIGTERM; Lightning's own SIGTERM handler, which runs once rank 1 is
/// back in Python, broadcasts to rank 0, which is gone. Before, that broadcast made the verdict
/// "rank 0 never issued `broadcast` #10, which rank 1 waits in", over rank 0's plain error; and
/// Lightning's handler had replaced the observer's, so where rank 1 was when stopped was lost.
#[test]
fn a_collective_a_rank_issues_after_its_peer_failed_is_not_a_mismatch_and_lightnings_handler_keeps_the_stack()
{
    let sb = Sandbox::new();
    let args = ["--launcher", "lightning", "--steps", "40", "--raise-rank", "0", "--raise-step", "3"];
    let file = torchrun_scenario(&sb, "lightning", 2, "tests/programs/launchers.py", &args, 30, "exited");
    let s = run_injected(
        &sb,
        &file,
        &[("INJECT_STALL_RANK", "1"), ("INJECT_STALL_S", "60"), ("INJECT_STALL_STEP", "4")],
    );
    assert_ne!(s["verdict"]["pattern"], "collective-mismatch", "{:#}", s["verdict"]);
    assert_eq!(s["first_failure"], 0, "{:#}", s["verdict"]);
    let headline = verdict(&s, "headline");
    assert!(
        headline.starts_with("Rank 0 exited with status 1: ValueError: bad shard on rank 0 (launchers.py:"),
        "{headline}"
    );
    // The broadcast rank 1 issued in Lightning's handler is in its ledger, after rank 0 had gone.
    let ledger = s["ranks"][1]["observed"]["ledger"].as_array().expect("rank 1's ledger");
    let last = ledger.last().expect("rank 1 issued collectives");
    assert_eq!((last["op"].as_str(), last["ms"].is_null()), (Some("broadcast"), true), "{last}");
    // Rank 1's stack as SIGTERM came, written before Lightning's handler ran: in the stall.
    let dumps = s["ranks"][1]["dumps"].as_array().expect("rank 1's dumps");
    assert!(
        dumps.iter().any(|d| d["taken"] == "as SIGTERM stopped it"
            && d["python"]
                .as_str()
                .is_some_and(|t| t.contains("in _compute") && !t.contains("signal_connector"))),
        "{dumps:#?}"
    );
    assert!(sb.reports().contains("What rank 1 was doing when it was stopped"), "{}", sb.reports());
}

/// A Lightning program under torchrun whose rank 1 alone calls `dist.barrier()` inside its
/// `training_step` at step 3 (`launchers.py --hang-rank 1`): rank 0 goes on into DDP's gradient
/// all-reduce and both hang. Lightning issues barriers of its own as it sets up (all from the
/// program's `trainer.fit` line), so rank 0 had issued `barrier` before: that was taken for a rank
/// on the barrier's path that then skipped it, and rank 0, the rank that did nothing wrong, was
/// named ("rank 0 never issued `barrier` #10 … had gone on past it"). Only the same op from the
/// same call site says that. And rank 1 was said to have "left its training loop early", which
/// its step count (as many as rank 0's) does not show: where it waits is said instead.
#[test]
fn a_barrier_one_lightning_rank_adds_inside_a_step_names_that_rank_not_the_one_that_went_on() {
    let sb = Sandbox::new();
    let path = repo().join("tests/programs/launchers.py");
    let source = std::fs::read_to_string(&path).unwrap();
    let barrier_line =
        source.lines().position(|l| l.trim() == "dist.barrier()").expect("a barrier in faults()") + 1;
    let args = ["--launcher", "lightning", "--steps", "40", "--hang-rank", "1", "--hang-step", "3"];
    let file =
        torchrun_scenario(&sb, "lightning-barrier", 2, "tests/programs/launchers.py", &args, 10, "hung");
    let s = run_injected(&sb, &file, &[]);
    assert_eq!(verdict(&s, "pattern"), "ranks-out-of-step", "{:#}", s["verdict"]);
    assert_eq!(s["first_failure"], 1, "{:#}", s["verdict"]);
    let headline = verdict(&s, "headline");
    assert!(
        headline.contains(&format!(
            "Rank 1 is the odd one: it waits in a `dist.barrier()` at `faults (launchers.py:{barrier_line})` that no \
             other rank is in, with as many steps done as they (3)"
        )),
        "{headline}"
    );
    assert!(!headline.contains("left its training loop early"), "{headline}");
}

/// Every path below `dir`.
fn walkdir(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walkdir(&path));
        }
        out.push(path);
    }
    out
}

/// torchrun with `--max-restarts 1` and rank 1's module missing in every attempt (injected from
/// outside): the first attempt fails, torchrun starts both ranks again (`TORCHELASTIC_RESTART_COUNT`
/// 1), and the second fails too. The restart is seen and said; the headline is torchrun's end with
/// the watched attempt after it, not the first attempt's failure as the job's; the ranks' results
/// are their first processes' (the new processes' markers are not folded in).
#[test]
fn a_torchrun_restart_is_seen_and_the_watched_attempt_is_not_called_the_jobs_end() {
    let sb = Sandbox::new();
    let program = repo().join("tests/programs/observed_ddp.py").display().to_string();
    let file = sb.scenario(
        "restart",
        &format!(
            r#"{{"command": ["torchrun", "--nproc_per_node", "2", "--max-restarts", "1", "--master_port",
                 "{{master_port}}", "{program}", "--steps", "10"],
                "launch": {{"world_size": 2}}, "limits": {{"timeout_s": 180, "hang_after_s": 60}},
                "expect": {{"outcome": "exited"}}}}"#
        ),
    );
    let s = run_injected(
        &sb,
        &file,
        &[("INJECT_MISSING_RANK", "1"), ("INJECT_MISSING_MODULE", "torch.utils.data.distributed")],
    );
    let restarted = s["external"]["launcher"]["restarted"].as_array().expect("the restart is recorded");
    let mut again: Vec<u64> = restarted.iter().map(|r| r["rank"].as_u64().unwrap()).collect();
    again.sort_unstable();
    assert_eq!(again, [0, 1], "{restarted:#?}");
    for r in restarted {
        let rank = r["rank"].as_u64().unwrap() as usize;
        assert_ne!(r["pid"], s["ranks"][rank]["pid"], "a new process, not the watched one: {restarted:#?}");
    }
    let headline = verdict(&s, "headline");
    assert!(
        headline.starts_with(
            "`torchrun … observed_ddp.py` exited with status 1 after it had started ranks 0, 1 again; the later \
             attempt's end is in its own output (not watched). The attempt ups-doctor watched: Rank 1 exited with \
             status 1: ModuleNotFoundError"
        ),
        "{headline}"
    );
}

/// A DataLoader worker's exception under torchrun, re-raised in the rank: the rank's error (from
/// the observer's `sys.excepthook`) places it at the dataset's own line, from the worker's
/// `Original Traceback` in the message, not at the rank's `for batch in loader`.
#[test]
fn a_workers_exception_under_torchrun_is_placed_at_the_datasets_line() {
    let sb = Sandbox::new();
    let args = ["--case", "dataset_error"];
    let file = torchrun_scenario(&sb, "dataset", 1, "tests/programs/patterns.py", &args, 60, "exited");
    let run = sb.run_in_venv(&[&file]);
    let s = &run.result["scenarios"][0];
    assert_eq!(run.code(), 0, "stderr:\n{}\n{:#}", run.stderr(), s["verdict"]);
    assert_eq!(verdict(s, "pattern"), "dataloader-worker-exception", "{:#}", s["verdict"]);
    let error = s["ranks"][0]["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("ValueError: Caught ValueError in DataLoader worker process 0."), "{error}");
    let source = std::fs::read_to_string(repo().join("tests/programs/patterns.py")).unwrap();
    let line = source.lines().position(|l| l.contains("raise ValueError(f\"corrupt sample")).unwrap() + 1;
    let at = format!("ValueError: corrupt sample at index 5 (patterns.py:{line} in __getitem__)");
    assert!(error.ends_with(&at), "{error}");
}

/// The observer's sending thread reads the default group's count in C++ without the GIL; a daemon
/// thread that takes the GIL back while the interpreter finalizes is ended by `pthread_exit`, which
/// aborts the process when it unwinds through pybind11's guard ("terminate called without an
/// active exception", SIGABRT at the program's exit, seen once under load). So `at_exit` (an atexit
/// handler, which runs before finalizing) waits for a read under way and lets the group go; no read
/// follows it. The group here is a stand-in whose read blocks until released, so that the read is
/// under way for certain when the exit begins.
#[test]
fn the_observers_exit_waits_for_a_read_of_the_groups_count_and_no_read_follows_it() {
    let script = r#"
import importlib.util, sys, threading
spec = importlib.util.spec_from_file_location("ups_site", sys.argv[1])
site = importlib.util.module_from_spec(spec)
spec.loader.exec_module(site)
import os
markers, sink = os.pipe()
obs = site._Observer(sink, None)
inside, release, calls = threading.Event(), threading.Event(), []
class Group:
    def _get_sequence_number_for_group(self):
        calls.append(threading.current_thread().name)
        inside.set()
        release.wait()
        return 7
obs.use_group(Group())
reader = threading.Thread(target=obs.send_issued, name="sender")
reader.start()
assert inside.wait(60), "the sender's read began"
exited = threading.Event()
threading.Thread(target=lambda: (obs.at_exit(), exited.set()), name="exit").start()
print("exit returned during the read:", exited.wait(3), flush=True)
release.set()
assert exited.wait(60), "exit returned once the read did"
reader.join()
print("reads after exit:", obs.issued(), obs.pg, flush=True)
print("calls:", calls, flush=True)
os.close(sink)
print(os.read(markers, 65536).decode(), flush=True)
"#;
    let stdout = with_the_observer_module(script);
    assert!(stdout.contains("exit returned during the read: False"), "{stdout}");
    assert!(stdout.contains("reads after exit: None None"), "{stdout}");
    // The sender's read, then exit's own last one (made once the sender's had returned).
    assert!(stdout.contains("calls: ['sender', 'exit']"), "{stdout}");
    // And the count the sender read went out.
    assert!(stdout.contains(r#"{"t": "issued", "n": 7"#), "{stdout}");
}

/// ups-doctor reads the marker pipe whenever it is not busy; on a loaded machine it can be full
/// for a while. The observer's sending thread then waits in its write, and the program's hooks
/// (a step's marker, a collective's return), which queue markers, must not wait with it; nor may
/// the program's exit wait more than a moment (issue 57: "never slow the program"). The pipe here
/// is filled and never read while the hooks and the exit run; no timing is asserted, only that
/// they return at all while nothing drains it (before, each waited as long as the pipe stayed
/// full). Then the pipe is read: what was sent is whole lines in order.
#[test]
fn the_programs_hooks_never_wait_for_a_write_to_a_full_pipe() {
    let script = r##"
import importlib.util, sys, threading, time
spec = importlib.util.spec_from_file_location("ups_site", sys.argv[1])
site = importlib.util.module_from_spec(spec)
spec.loader.exec_module(site)
import os
markers, sink = os.pipe()
os.set_blocking(sink, False)
filled = 0
try:
    while True:
        filled += os.write(sink, b"#" * 4096)
except BlockingIOError:
    pass
os.set_blocking(sink, True)
obs = site._Observer(sink, None)
obs.send({"t": "observer", "steps": 0}, urgent=True)
# The sending thread is in its write, blocked on the full pipe: the kernel says where it waits.
deadline = time.monotonic() + 120
while True:
    thread = obs.thread
    wchan = ""
    if thread is not None and thread.native_id is not None:
        try:
            wchan = open(f"/proc/self/task/{thread.native_id}/wchan").read()
        except OSError:
            pass
    if "pipe_write" in wchan:
        break
    assert time.monotonic() < deadline, f"the sender never blocked in its write ({wchan!r})"
    time.sleep(0.01)
def probe(name, call):
    done = threading.Event()
    threading.Thread(target=lambda: (call(), done.set()), daemon=True).start()
    print(f"{name} returned while the pipe was full:", done.wait(60), flush=True)
# The hooks themselves: the optimizer's step hook, and a collective's wrapper (around a stand-in
# for torch.distributed's function, and torch's tensor class: no torch here).
import types
sys.modules.setdefault("torch", types.SimpleNamespace(Tensor=type("Tensor", (), {})))
site._observer = obs
dist = types.SimpleNamespace()
def all_reduce(tensor, op=None, group=None, async_op=False):
    return None
site._wrap_collective(dist, "all_reduce", all_reduce)
probe("a step's marker", lambda: obs.on_step(object()))
probe("a collective's return", lambda: dist.all_reduce([]))
probe("the exit", obs.at_exit)
os.set_blocking(markers, False)
got = b""
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        got += os.read(markers, 1 << 16)
    except BlockingIOError:
        if obs.thread is None or not obs.thread.is_alive():
            break
        time.sleep(0.01)
text = got.replace(b"#", b"").decode()
print("lines:", [line.split(",")[0] for line in text.splitlines()], flush=True)
"##;
    let stdout = with_the_observer_module(script);
    for hook in ["a step's marker", "a collective's return", "the exit"] {
        assert!(stdout.contains(&format!("{hook} returned while the pipe was full: True")), "{stdout}");
    }
    // The first summary, blocked in the write, went out whole once the pipe was read.
    assert!(stdout.contains(r#"lines: ['{"t": "observer"'"#), "{stdout}");
}

/// Runs `script` (Python) in the test venv with the observer's module as `sys.argv[1]`, outside
/// any run (no marker pipe of ups-doctor's), and gives what it printed; it must exit 0.
fn with_the_observer_module(script: &str) -> String {
    let out = std::process::Command::new(crate::util::venv_python())
        .args(["-c", script])
        .arg(repo().join("python/site/sitecustomize.py"))
        .env_remove("UPS_DOCTOR_MARKER_FD")
        .env_remove("UPS_DOCTOR_MARKER_PATH")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// `observed_ddp.py` as 2 copies ups-doctor starts (`per_rank`), rank 1's behind `rank1_prefix` (a
/// command that then runs it: `flock LOCK`, `nice -n 5`), `steps` steps, `hang_after_s`,
/// expecting `outcome`.
fn per_rank_ddp(
    sb: &Sandbox,
    name: &str,
    rank1_prefix: &str,
    (steps, hang_after_s): (u32, u32),
    outcome: &str,
) -> crate::util::RunOutput {
    let program = repo().join("tests/programs/observed_ddp.py").display().to_string();
    let run = format!("python {program} --steps {steps}");
    let script = format!(r#"if [ "$RANK" = 1 ]; then exec {rank1_prefix} {run}; fi; exec {run}"#);
    let scenario = serde_json::json!({
        "command": ["sh", "-c", script],
        "launch": {"world_size": 2, "style": "per_rank"},
        "limits": {"timeout_s": 180, "hang_after_s": hang_after_s},
        "expect": {"outcome": outcome},
    });
    let file = sb.scenario(name, &scenario.to_string());
    sb.run_in_venv(&[&file])
}

/// Holds `lock` with `flock` (another job's), released when dropped.
struct HeldLock(std::process::Child);

impl HeldLock {
    fn take(lock: &std::path::Path) -> HeldLock {
        let holder =
            std::process::Command::new("flock").arg(lock).args(["sleep", "600"]).spawn().expect("flock");
        // Held once a try to take it fails (`flock -n` exits 1).
        let free =
            || std::process::Command::new("flock").args(["-n"]).arg(lock).arg("true").status().unwrap();
        while free().success() {
            std::thread::yield_now();
        }
        HeldLock(holder)
    }
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Rank 1 of `observed_ddp.py` (each rank a copy ups-doctor starts) waits for a lock another job
/// holds before it starts (`flock`, as ranks that share a dataset's or a cache's lock do) and never
/// reaches `init_process_group`, where rank 0 waits. Rank 1 is named with where it was: not "the
/// one that did not come ended before it was found" (it was alive, and its stack taken) — seen of
/// a rank started at nice 19 beside a busy loop, still importing torch a minute on.
#[test]
fn a_rank_that_never_reached_the_rendezvous_is_named_with_where_it_was() {
    let sb = Sandbox::new();
    let lock = sb.path().join("dataset.lock");
    std::fs::write(&lock, "").unwrap();
    let _held = HeldLock::take(&lock);
    let run = per_rank_ddp(&sb, "late-rank", &format!("flock {}", lock.display()), (20, 15), "hung");
    let s = &run.result["scenarios"][0];
    assert_eq!(run.code(), 0, "hung, as expected: {:#}", s["verdict"]);
    let headline = verdict(s, "headline");
    assert_eq!(verdict(s, "pattern"), "rendezvous-incomplete", "{headline}");
    assert_eq!(s["first_failure"], 1, "{headline}");
    assert!(
        headline.contains(
            "rank 1 had not entered `init_process_group` when the hang was declared: it was still in the system call"
        ) && headline.contains("(its process `flock`)"),
        "{headline}"
    );
    assert!(!headline.contains("ended before it was found"), "{headline}");
}

/// Each rank's nice value, as the kernel has its main thread, in its `observed`: rank 1 of
/// `observed_ddp.py` started with `nice -n 5` (each rank a copy ups-doctor starts).
#[test]
fn each_ranks_nice_value_is_observed() {
    let sb = Sandbox::new();
    let run = per_rank_ddp(&sb, "niced", "nice -n 5", (10, 60), "passed");
    let s = &run.result["scenarios"][0];
    assert_eq!(run.code(), 0, "passed: {:#}", s["verdict"]);
    let nice: Vec<Option<i64>> =
        s["ranks"].as_array().unwrap().iter().map(|r| r["observed"]["nice"].as_i64()).collect();
    // Relative to rank 0's: the tests may themselves run niced.
    let [Some(zero), Some(one)] = nice[..] else { panic!("both ranks' nice values: {nice:?}") };
    assert_eq!(one - zero, 5, "{nice:?}");
}
