//! PyTorch's Flight Recorder, turned on by ups-doctor for a command's ranks and handed over by its
//! observer when the ranks are found hung: every collective of every rank, DDP's C++ gradient
//! all-reduces included, matched across ranks by sequence id. Real torchrun and PyTorch (CPU,
//! gloo); the fault is the program's own bug or injected from outside it
//! (`tests/programs/inject`).

use crate::util::{Sandbox, evidence_of as evidence, program, repo, run_command as run};
use serde_json::Value;

/// `ups-doctor run [--env E]… --hang-after 60 --timeout 300 -- torchrun --nproc_per_node 2
/// PROGRAM ARGS…`, which must end hung; its scenario.
fn hung(sb: &Sandbox, env: &[&str], name: &str, args: &[&str]) -> Value {
    let prog = program(name);
    let mut all: Vec<&str> = env.iter().flat_map(|e| ["--env", *e]).collect();
    // Generous: on two loaded cores torchrun may take tens of seconds to start its ranks.
    all.extend(["--hang-after", "60", "--timeout", "300", "--", "torchrun", "--nproc_per_node", "2", &prog]);
    all.extend(args);
    let out = run(sb, &all);
    let s = out.scenario().clone();
    assert_eq!(s["outcome"], "hung", "{}\n{:#}", out.stderr(), s["verdict"]);
    s
}

/// Each rank's Flight Recorder entries in `result.json`: (op, seq) of the default group.
fn recorded(s: &Value, rank: usize) -> Vec<(String, u64)> {
    s["ranks"][rank]["observed"]["flight"]["entries"]
        .as_array()
        .unwrap_or_else(|| {
            panic!("rank {rank} handed over no Flight Recorder entries: {:#}", s["ranks"][rank])
        })
        .iter()
        .filter(|e| e["group"] == "default_pg")
        .map(|e| (e["op"].as_str().unwrap().to_string(), e["seq"].as_u64().unwrap()))
        .collect()
}

/// The events of rank `rank`'s "collectives (Flight Recorder)" track in the run's `trace.json`,
/// in the order written.
fn flight_track(sb: &Sandbox, rank: u32) -> Vec<Value> {
    let trace: Value = serde_json::from_slice(&std::fs::read(sb.out().join("trace.json")).unwrap()).unwrap();
    let ev = trace["traceEvents"].as_array().unwrap();
    let pid = &ev
        .iter()
        .find(|e| e["name"] == "process_name" && e["args"]["name"] == format!("rank {rank}"))
        .unwrap_or_else(|| panic!("no process for rank {rank} in trace.json"))["pid"];
    let track = ev
        .iter()
        .find(|e| {
            e["name"] == "thread_name"
                && e["pid"] == *pid
                && e["args"]["name"] == "collectives (Flight Recorder)"
        })
        .unwrap_or_else(|| panic!("rank {rank} has no Flight Recorder track in trace.json"));
    ev.iter().filter(|e| e["pid"] == *pid && e["tid"] == track["tid"] && e["ph"] != "M").cloned().collect()
}

/// Rank 1 skips one step's backward (so DDP never issues its gradient all-reduce, from C++) and
/// waits in `dist.barrier()`; rank 0 waits in that all-reduce. The recorder says where they part
/// ways: the same sequence id, rank 0's all-reduce of the one 577-float bucket against rank 1's
/// barrier, with both ranks' entries up to there. `trace.json` draws each rank's entries on a
/// track of their own, at the times PyTorch made them: rank 1's barrier where its observer saw it
/// issued (the recorder's wall clock put on the run's timeline).
#[test]
fn a_rank_that_skips_a_ddp_backward_is_seen_where_the_ranks_part_ways_with_the_op_and_bucket_size() {
    let sb = Sandbox::new();
    let s = &hung(&sb, &[], "ddp.py", &["--steps", "6", "--skip-rank", "1", "--skip-step", "3"]);
    let (r0, r1) = (recorded(s, 0), recorded(s, 1));
    let (last0, last1) = (r0.last().unwrap(), r1.last().unwrap());
    assert_eq!((last0.0.as_str(), last1.0.as_str()), ("gloo:all_reduce", "gloo:barrier"), "{r0:?}\n{r1:?}");
    assert_eq!(last0.1, last1.1, "the same place in the group's sequence: {r0:?}\n{r1:?}");
    let want = format!(
        "at collective #{} of group `default_pg` the ranks part ways (different ops): rank 0 issued \
         `gloo:all_reduce` of [577] Float; rank 1 issued `gloo:barrier`",
        last0.1
    );
    let ev = evidence(s);
    assert!(ev.iter().any(|l| l.contains(&want)), "{want}\n{ev:#?}");
    let report = std::fs::read_to_string(sb.out().join("report.md")).unwrap();
    // Markdown escapes the brackets of the shape.
    let escaped = want.replace("[577]", "\\[577\\]");
    assert!(report.contains(&escaped), "the report says it too: {escaped}\n{report}");
    // And shows the ranks' collectives side by side, the divergence in bold.
    assert!(
        report.contains("### Collectives where the ranks part ways (Flight Recorder, group `default_pg`)"),
        "{report}"
    );
    let row = report.lines().find(|l| l.starts_with(&format!("| **{}** |", last0.1)));
    assert!(row.is_some_and(|r| r.contains("`gloo:all_reduce`") && r.contains("`gloo:barrier`")), "{report}");
    for (rank, recorded) in [(0, &r0), (1, &r1)] {
        let track = flight_track(&sb, rank);
        let names: Vec<&str> = track.iter().filter_map(|e| e["name"].as_str()).collect();
        let want: Vec<String> = recorded.iter().map(|(op, seq)| format!("{op} #{seq}")).collect();
        assert_eq!(names, want, "rank {rank}: one event per entry, in order");
        // gloo times none of its collectives: each is an instant, in the order they were made,
        // within the run.
        assert!(track.iter().all(|e| e["ph"] == "I" && e["args"]["state"] == "scheduled"), "{track:#?}");
        let ts: Vec<f64> = track.iter().map(|e| e["ts"].as_f64().unwrap()).collect();
        assert!(
            ts[0] > 0.0 && ts.is_sorted() && ts[ts.len() - 1] <= s["wall_s"].as_f64().unwrap() * 1e6,
            "{ts:?}"
        );
    }
    let at_divergence = flight_track(&sb, 0).pop().unwrap();
    assert_eq!(at_divergence["args"]["sizes"], serde_json::json!([[577]]), "{at_divergence}");
    assert_eq!(at_divergence["args"]["dtypes"], serde_json::json!(["Float"]), "{at_divergence}");
    let barrier = flight_track(&sb, 1).pop().unwrap();
    let issued = s["ranks"][1]["observed"]["ledger"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|e| e["op"] == "barrier")
        .and_then(|e| e["at_s"].as_f64())
        .expect("rank 1's observer saw its barrier issued");
    // The observer stamps the call before it goes into PyTorch, which makes the entry inside it:
    // the two agree to well within a second when the clocks are put together right (a wrong
    // clock is off by decades, or by the time before the run started).
    let made = barrier["ts"].as_f64().unwrap() / 1e6;
    assert!((issued - 0.01..issued + 1.0).contains(&made), "barrier made at {made} s, issued at {issued} s");
}

/// Rank 1 sleeps before a `dist.all_gather` of the program's (injected from outside, not in any
/// collective) while rank 0 waits in it: the recorder says rank 1 never issued that collective,
/// and what its last one was (one of DDP's gradient all-reduces, from C++).
#[test]
fn a_rank_asleep_outside_any_collective_never_issued_the_one_the_others_wait_in() {
    let sb = Sandbox::new();
    let inject = format!("PYTHONPATH={}", repo().join("tests/programs/inject").display());
    let faults = [inject.as_str(), "INJECT_SLEEP_RANK=1", "INJECT_SLEEP_S=600", "INJECT_SLEEP_CALL=4"];
    let s = &hung(&sb, &faults, "observed_ddp.py", &["--steps", "8"]);
    let (r0, r1) = (recorded(s, 0), recorded(s, 1));
    let (last0, last1) = (r0.last().unwrap(), r1.last().unwrap());
    assert_eq!(last0.0, "gloo:all_gather", "{r0:?}");
    assert_eq!(last1.1 + 1, last0.1, "rank 1 is one collective behind: {r0:?}\n{r1:?}");
    let want = format!(
        "at collective #{} of group `default_pg` the ranks part ways: rank 0 issued `gloo:all_gather`",
        last0.1
    );
    let ev = evidence(s);
    let line = ev.iter().find(|l| l.contains(&want)).unwrap_or_else(|| panic!("{want}\n{ev:#?}"));
    assert!(
        line.contains(&format!("rank 1 never issued it (its last: #{} `{}`", last1.1, last1.0)),
        "{line}"
    );
}

/// FSDP (`fully_shard`): rank 1 skips a step and waits in a barrier while rank 0 all-gathers the
/// first layer's parameters for that step's forward (its shard: 72 of the layer's 144 floats,
/// 16×8 weights and 16 biases). The recorder names the all-gather and its size.
#[test]
fn an_fsdp_rank_missing_an_all_gather_is_seen_with_the_op_and_its_size() {
    let sb = Sandbox::new();
    let s = &hung(&sb, &[], "fsdp2.py", &["--skip-rank", "1", "--skip-step", "2"]);
    let ev = evidence(s);
    let want = "the ranks part ways (different ops): rank 0 issued `gloo:all_gather` of [72] Float; rank 1 issued \
                `gloo:barrier`";
    assert!(ev.iter().any(|l| l.contains(want)), "{want}\n{ev:#?}");
}

/// The recorder the user sized (`TORCH_FR_BUFFER_SIZE=8`, kept as given) has wrapped many times
/// before the ranks part ways: each keeps its last 8 collectives, and they are aligned by sequence
/// id, not by position.
#[test]
fn a_ring_that_wrapped_before_the_ranks_part_ways_is_aligned_by_sequence_id() {
    let sb = Sandbox::new();
    let env = ["TORCH_FR_BUFFER_SIZE=8"];
    let s = &hung(&sb, &env, "ddp.py", &["--steps", "14", "--skip-rank", "1", "--skip-step", "11"]);
    let (r0, r1) = (recorded(s, 0), recorded(s, 1));
    assert!(r0.len() <= 8 && r1.len() <= 8, "the user's size stands: {r0:?}\n{r1:?}");
    let last = r0.last().unwrap().1;
    assert!(r0[0].1 > 8, "the ring wrapped: it no longer holds the first collectives: {r0:?}");
    let want = format!(
        "at collective #{last} of group `default_pg` the ranks part ways (different ops): rank 0 issued \
         `gloo:all_reduce` of [577] Float; rank 1 issued `gloo:barrier`"
    );
    let ev = evidence(s);
    assert!(ev.iter().any(|l| l.contains(&want)), "{want}\n{ev:#?}");
}

/// The dump files a job writes itself, read back by `ups-doctor report DIR`: one pickle per rank,
/// named `PREFIX<rank>`, as PyTorch's own NCCL watchdog writes them on a collective timeout
/// (`TORCH_NCCL_DUMP_ON_TIMEOUT`, `TORCH_NCCL_DEBUG_INFO_TEMP_FILE`); gloo writes none by itself,
/// so a watchdog thread injected from outside the program (`tests/programs/inject`) writes the
/// same function's bytes once the rank has stalled 15 s. The report of the folder finds the same
/// divergence as the live run's verdict, in the same table.
#[test]
fn dump_files_of_a_real_run_read_by_report_give_the_same_divergence_as_the_live_run() {
    let sb = Sandbox::new();
    let dumps = sb.path().join("dumps");
    std::fs::create_dir(&dumps).unwrap();
    let inject = format!("PYTHONPATH={}", repo().join("tests/programs/inject").display());
    let prefix = format!("INJECT_FR_DUMP={}/nccl_trace_rank_", dumps.display());
    let env = [inject.as_str(), prefix.as_str(), "INJECT_FR_DUMP_AFTER_S=15"];
    let s = &hung(&sb, &env, "ddp.py", &["--steps", "6", "--skip-rank", "1", "--skip-step", "3"]);
    let live = evidence(s)
        .into_iter()
        .find(|l| l.starts_with("Flight Recorder (every collective"))
        .unwrap_or_else(|| panic!("the live run's divergence: {:#?}", evidence(s)));
    assert!(live.contains("rank 1 issued `gloo:barrier`"), "{live}");
    let out = std::process::Command::new(crate::util::bin()).arg("report").arg(&dumps).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let written = dumps.join("ups-doctor-flight.md");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), written.display().to_string());
    let report = std::fs::read_to_string(&written).unwrap();
    // Markdown escapes the brackets of a shape.
    let said = live.replace('[', "\\[").replace(']', "\\]");
    assert!(report.contains(&format!("## Verdict\n\n{said}")), "{said}\n{report}");
    assert!(
        report.contains("### Collectives where the ranks part ways (Flight Recorder, group `default_pg`)"),
        "{report}"
    );
    for rank in 0..2 {
        assert!(
            report.contains(&format!("nccl_trace_rank_{rank}`")),
            "rank {rank}'s file is listed: {report}"
        );
    }
    // A folder with two dumps of one rank is refused, naming both.
    std::fs::copy(dumps.join("nccl_trace_rank_1"), dumps.join("copy_of_rank_1")).unwrap();
    let out = std::process::Command::new(crate::util::bin()).arg("report").arg(&dumps).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("are both rank 1's Flight Recorder dump"), "{stderr}");
}
