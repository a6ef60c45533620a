//! `trace.json`, loaded by a real trace parser: Chrome DevTools' own trace engine
//! (`@paulirish/trace_engine` from npm, the Performance panel's parser, run by
//! `tests/trace/parse.mjs` under Node). Real runs of the real binary (a 2-rank DDP crash with a
//! data-loader worker, a hang), then `ups-doctor report DIR` re-rendering the trace; each is
//! asserted on what the engine made of it (its processes, threads, slices, instant events and
//! counters), against the run's `result.json`.
//!
//! `./x test` installs what it needs (`npm ci` in `tests/trace/`).

use std::path::Path;
use std::process::Command;

use crate::util::{Sandbox, repo, tiny};
use serde_json::Value;

/// What the trace engine made of `trace`.
pub(crate) fn parse(trace: &Path) -> Value {
    let dir = repo().join("tests/trace");
    assert!(
        dir.join("node_modules/@paulirish/trace_engine").is_dir(),
        "the trace test's npm packages are not installed in {}: run ./x test (it runs `npm ci` there)",
        dir.display()
    );
    let out = Command::new("node")
        .current_dir(&dir)
        .arg("parse.mjs")
        .arg(trace)
        .output()
        .expect("node runs (apt-get install nodejs)");
    assert!(
        out.status.success(),
        "the trace engine could not load {}:\n{}",
        trace.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("parse.mjs prints JSON")
}

/// The engine's thread whose name starts with `prefix`.
fn thread<'a>(parsed: &'a Value, prefix: &str) -> &'a Value {
    parsed["threads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
        .unwrap_or_else(|| panic!("no track named `{prefix}…` in {:#}", parsed["threads"]))
}

/// Nothing on the trace lies after the scenario's end (its wall time): a slice, an instant or a
/// sample there would contradict `result.json`.
pub(crate) fn assert_within_run(parsed: &Value, wall_s: f64) {
    let end = (wall_s * 1e6).round();
    for t in parsed["threads"].as_array().unwrap() {
        for s in t["slices"].as_array().unwrap() {
            let stop = s["ts"].as_f64().unwrap() + s["dur"].as_f64().unwrap();
            assert!(
                stop <= end,
                "slice {} of `{}` ends at {stop} µs, after the run's end {end}",
                s["name"],
                t["name"]
            );
        }
        for i in t["instants"].as_array().unwrap() {
            let at = i["ts"].as_f64().unwrap();
            assert!(
                at <= end,
                "instant {} of `{}` at {at} µs, after the run's end {end}",
                i["name"],
                t["name"]
            );
        }
    }
    for c in parsed["counters"].as_array().unwrap() {
        let at = c["ts"].as_f64().unwrap();
        assert!(at <= end, "counter {} at {at} µs, after the run's end {end}", c["name"]);
    }
}

fn us(seconds: &Value) -> f64 {
    (seconds.as_f64().unwrap() * 1e6).round()
}

#[test]
fn a_two_rank_crash_has_a_track_per_rank_and_worker_and_the_death_with_its_stack() {
    let sb = Sandbox::new();
    let body = r#"{
      "launch": { "mode": "ddp", "world_size": 2 },
      "model": { "depths": [1], "hidden": 32, "heads": 2, "latent_tokens": 8, "window": 2 },
      "data": { "samples": 16, "grid": 64, "timesteps": 4, "queries": 32, "batch_size": 8,
                "workers": 1, "start_method": "fork" },
      "train": { "steps": 8 },
      "limits": { "timeout_s": 120, "hang_after_s": 60 },
      "inject": [{ "fault": "segv", "phase": "forward", "step": 3, "rank": 1 }],
      "expect": { "outcome": "signaled", "signal": "SIGSEGV", "rank": 1 }
    }"#;
    let file = sb.scenario("crash", body);
    let run = sb.run(&[&file], &[]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    let trace = sb.out().join("trace.json");
    let parsed = parse(&trace);
    assert_within_run(&parsed, run.scenario()["wall_s"].as_f64().unwrap());

    // A process per rank, named for it; a thread for the rank and one for its worker.
    let processes: Vec<&str> =
        parsed["processes"].as_array().unwrap().iter().filter_map(|p| p["name"].as_str()).collect();
    assert!(processes.contains(&"rank 0") && processes.contains(&"rank 1"), "{processes:?}");
    for rank in 0..2 {
        let r = run.rank(rank);
        let own = thread(&parsed, &format!("rank {rank} (pid {})", r["pid"]));
        assert_eq!(own["process"], format!("rank {rank}"));
        // Every phase of its timeline is a slice the engine placed where result.json says.
        let timeline = r["timeline"].as_array().unwrap();
        assert!(!timeline.is_empty());
        let slices = own["slices"].as_array().unwrap();
        let phases: Vec<&Value> = slices.iter().filter(|s| s["cat"] == "phase").collect();
        assert_eq!(phases.len(), timeline.len(), "rank {rank}: {slices:#?}");
        for (span, slice) in timeline.iter().zip(&phases) {
            assert_eq!(slice["name"], span["phase"]);
            assert_eq!(slice["ts"].as_f64().unwrap(), us(&span["start_s"]));
        }
        // Each step a slice ending when result.json says it did, one after the other.
        let steps: Vec<&Value> = slices.iter().filter(|s| s["cat"] == "step").collect();
        let ends = r["step_ends_s"].as_array().unwrap();
        assert!(!ends.is_empty());
        for (end, slice) in ends.iter().zip(&steps) {
            assert_eq!(slice["name"], format!("step {}", end[0]));
            assert_eq!(slice["ts"].as_f64().unwrap() + slice["dur"].as_f64().unwrap(), us(&end[1]));
        }
        // Rank 1 died inside step 3: that step is drawn too, open, up to its death; rank 0 was
        // torn down inside its next step as well.
        assert_eq!(steps.len(), ends.len() + 1, "rank {rank}: {steps:#?}");
        let open = steps.last().unwrap();
        assert_eq!(open["args"]["open"], true);
        assert_eq!(open["ts"].as_f64().unwrap() + open["dur"].as_f64().unwrap(), us(&r["ended_at_s"]));
        let worker = &r["workers"][0];
        let w = thread(&parsed, &format!("worker 0 (pid {}, fork)", worker["pid"]));
        assert_eq!(w["pid"], own["pid"], "a rank's worker is a thread of the rank's process");
        assert_eq!(w["instants"][0]["ts"].as_f64().unwrap(), us(&worker["started_at_s"]));
    }

    // Rank 1's death: an instant at its end, with the crash handler's stack attached.
    let r1 = run.rank(1);
    let own = thread(&parsed, "rank 1 (pid");
    let death = own["instants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "killed by SIGSEGV")
        .unwrap_or_else(|| panic!("no death instant on rank 1: {:#}", own["instants"]));
    assert_eq!(death["ts"].as_f64().unwrap(), us(&r1["ended_at_s"]));
    assert_eq!(death["scope"], "t");
    assert_eq!(death["args"]["phase"], "forward");
    assert!(death["args"]["stack"].as_str().unwrap().contains("inject_segv"), "{:#}", death["args"]);
    // Rank 0, collateral, ends too, and after rank 1.
    let r0_end = thread(&parsed, "rank 0 (pid")["instants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["args"]["outcome"].is_string())
        .cloned()
        .expect("rank 0's end is marked");
    assert!(r0_end["ts"].as_f64().unwrap() >= death["ts"].as_f64().unwrap());

    // Memory as counters on each rank's process, on the run's timeline.
    let series = run.scenario()["memory"]["series"].as_array().unwrap();
    let pss: Vec<&Value> = parsed["counters"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"].as_str().unwrap().starts_with("PSS") && c["process"] == "rank 0")
        .collect();
    assert_eq!(pss.len(), series.len());
    assert_eq!(pss[0]["ts"].as_f64().unwrap(), us(&series[0]["t_s"]));

    // The report points to it.
    let report = std::fs::read_to_string(sb.out().join("report.md")).unwrap();
    assert!(report.contains("`trace.json`") && report.contains("https://ui.perfetto.dev"));

    // `ups-doctor report DIR` writes it again, from result.json alone.
    let before = std::fs::read_to_string(&trace).unwrap();
    std::fs::remove_file(&trace).unwrap();
    let status = sb.cmd().arg("report").arg(sb.out()).output().unwrap();
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
    assert_eq!(std::fs::read_to_string(&trace).unwrap(), before);
}

#[test]
fn a_hang_has_the_open_phase_and_the_moment_it_was_declared_with_every_threads_stack() {
    let sb = Sandbox::new();
    let file = sb.scenario(
        "hang",
        &tiny(
            r#""inject": [{"fault": "hang", "phase": "optimizer", "step": 2}],
                 "expect": {"outcome": "hung", "phase": "optimizer", "step": 2}"#,
        ),
    );
    // Generous for two busy cores (see tests/outcomes.rs).
    let run = sb.run(&[&file], &["--set", "limits.hang_after_s=10"]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    let r = run.rank(0);
    let parsed = parse(&sb.out().join("trace.json"));
    assert_within_run(&parsed, run.scenario()["wall_s"].as_f64().unwrap());
    let own = thread(&parsed, &format!("rank 0 (pid {})", r["pid"]));

    // Training never ended (the rank hung inside step 2's optimizer phase): a slice drawn to the
    // rank's end, marked open, naming the phase.
    let open: Vec<&Value> =
        own["slices"].as_array().unwrap().iter().filter(|s| s["args"]["open"] == true).collect();
    assert!(!open.is_empty(), "{:#}", own["slices"]);
    let end = us(&r["ended_at_s"]);
    for s in &open {
        assert_eq!(s["ts"].as_f64().unwrap() + s["dur"].as_f64().unwrap(), end);
    }
    assert!(open.iter().any(|s| s["name"] == "train" && s["args"]["last_phase"] == "optimizer"), "{open:#?}");
    // Inside it steps 0 and 1 ended, and step 2 is the one that never did.
    assert!(open.iter().any(|s| s["cat"] == "step" && s["name"] == "step 2"), "{open:#?}");
    let done: Vec<&str> = own["slices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["cat"] == "step" && s["args"]["open"].is_null())
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(done, ["step 0", "step 1"]);

    // The hang's moment: last marker + the silence it was declared after, with the stacks.
    let declared = own["instants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "hang declared")
        .unwrap_or_else(|| panic!("{:#}", own["instants"]));
    let at = r["last_marker_at_s"].as_f64().unwrap() + r["hang_detected_after_s"].as_f64().unwrap();
    assert_eq!(declared["ts"].as_f64().unwrap(), (at * 1e6).round());
    let stacks = declared["args"]["stacks"].as_str().unwrap();
    for t in r["stacks"].as_array().unwrap() {
        assert!(stacks.contains(&format!("(tid {})", t["tid"])), "thread {} missing:\n{stacks}", t["tid"]);
    }
    // And its teardown by ups-doctor, after the hang was declared.
    let teardown = own["instants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| {
            i["name"].as_str().unwrap().contains(" by ups-doctor")
                || i["name"].as_str().unwrap().ends_with("from ups-doctor")
        })
        .unwrap_or_else(|| panic!("{:#}", own["instants"]));
    assert!(teardown["ts"].as_f64().unwrap() >= declared["ts"].as_f64().unwrap());
}

#[test]
fn a_multi_node_run_has_each_rank_on_its_node_on_the_calibrated_timeline() {
    // The committed multi-node example (two agents, ranks 2 and 3 on node 1, rank 3 segfaults):
    // its result.json holds every node's evidence already moved onto node 0's clock with the
    // calibrated offsets; `ups-doctor report` writes its trace.
    let sb = Sandbox::new();
    let dir = sb.path().join("run-nodes");
    std::fs::create_dir_all(&dir).unwrap();
    let example = repo().join("reports/examples/run-nodes/result.json");
    std::fs::copy(&example, dir.join("result.json")).unwrap();
    let out = sb.cmd().arg("report").arg(&dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let parsed = parse(&dir.join("trace.json"));
    let result: Value = serde_json::from_str(&std::fs::read_to_string(&example).unwrap()).unwrap();
    let s = &result["scenarios"][0];
    let name = s["name"].as_str().unwrap();
    for node in s["nodes"]["per_node"].as_array().unwrap() {
        for rank in node["ranks"].as_array().unwrap() {
            let process =
                format!("{name}: rank {rank} (node {}, {})", node["node"], node["host"].as_str().unwrap());
            let r = &s["ranks"][rank.as_u64().unwrap() as usize];
            let own = parsed["threads"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["process"] == process.as_str())
                .unwrap_or_else(|| panic!("no process `{process}`: {:#}", parsed["processes"]));
            // Its end, where the merged (calibrated) result puts it.
            let end = own["instants"]
                .as_array()
                .unwrap()
                .iter()
                .find(|i| i["args"]["outcome"] == r["outcome"])
                .unwrap_or_else(|| panic!("rank {rank}: {:#}", own["instants"]));
            assert_eq!(end["ts"].as_f64().unwrap(), us(&r["ended_at_s"]));
        }
    }
    // Rank 3 (node 1) died first, before the collateral ends on node 0: the order holds on the trace.
    let ts_of = |rank: u32| {
        parsed["threads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["process"].as_str().is_some_and(|p| p.starts_with(&format!("{name}: rank {rank} "))))
            .unwrap()["instants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["args"]["outcome"].is_string())
            .unwrap()["ts"]
            .as_f64()
            .unwrap()
    };
    assert!(ts_of(3) < ts_of(0) && ts_of(3) < ts_of(1));
}
