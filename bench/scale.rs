//! What the merge of nodes, the judge and the report cost at the size real jobs reach (issue 59):
//! one simulated job (`ups_doctor::nodes::simulate`) made from a real run's recorded result,
//! merged (which judges it: `diagnose::conclude`), judged once more on its own, and rendered as
//! `report.md`, `result.json` and `trace.json`. Prints one JSON line of figures; `bench/scale.py`
//! runs it at several sizes, each in a process of its own so that the peak memory is that size's.
//!
//! ```sh
//! cargo bench --bench scale -- --case hang --ranks 4096 --nodes 512 [--out DIR]
//! ```
//!
//! Cases, from runs recorded here:
//! - `hang`: `bench/scale/hang-2rank.json`, a real `ups-doctor run -- torchrun --nproc_per_node 2
//!   tests/programs/ddp.py --steps 6 --skip-rank 1 --skip-step 3`: rank 0 waits in DDP's
//!   all-reduce, rank 1 in a barrier. Every rank is rank 0's copy except rank 1777 (modulo the
//!   world), rank 1's.
//! - `crash`: node 1 of `reports/examples/run-nodes` (torchrun 2 × 2, rank 3 killed by SIGSEGV):
//!   every rank is its collateral rank 0's copy except rank 1777, the SIGSEGV.

use std::path::{Path, PathBuf};
use std::time::Instant;

use ups_doctor::nodes::merge::{MergeInput, merge};
use ups_doctor::nodes::simulate::{self, Job};
use ups_doctor::schema::RunResult;

struct Args {
    case: String,
    ranks: u32,
    nodes: u32,
    out: Option<PathBuf>,
}

fn args() -> Args {
    let mut a = Args { case: "hang".into(), ranks: 1024, nodes: 128, out: None };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--case" => a.case = it.next().expect("--case hang|crash"),
            "--ranks" => a.ranks = it.next().and_then(|v| v.parse().ok()).expect("--ranks N"),
            "--nodes" => a.nodes = it.next().and_then(|v| v.parse().ok()).expect("--nodes N"),
            "--out" => a.out = it.next().map(PathBuf::from),
            // `cargo bench` adds `--bench`.
            _ => {}
        }
    }
    assert!(a.nodes > 0 && a.ranks.is_multiple_of(a.nodes), "--ranks must be a multiple of --nodes");
    a
}

/// `VmRSS` and `VmHWM` (the peak) of this process, in MiB.
fn rss_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .map_or(f64::NAN, |kib| kib / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn recorded(case: &str) -> (RunResult, usize, usize) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (file, common, odd) = match case {
        "hang" => ("bench/scale/hang-2rank.json", 0, 1),
        "crash" => ("reports/examples/run-nodes/2-torchrun-2x2-rank3-segv/node1/result.json", 0, 1),
        other => panic!("unknown case `{other}`: hang or crash"),
    };
    let text = std::fs::read_to_string(root.join(file)).expect("the recorded result");
    (serde_json::from_str(&text).expect("a result.json"), common, odd)
}

fn main() {
    let a = args();
    let (mut run, common, odd) = recorded(&a.case);
    let template = run.scenarios.remove(0);
    let job =
        Job { nodes: a.nodes, ranks_per_node: a.ranks / a.nodes, common, odd: vec![(1777 % a.ranks, odd)] };
    let t = Instant::now();
    let nodes = simulate::nodes(&template, &job);
    let simulate_s = t.elapsed().as_secs_f64();
    let (input_rss, _) = rss_mib();

    let mut scenario = template.scenario.clone();
    scenario.launch.world_size = job.world();
    let t = Instant::now();
    let merged = merge(MergeInput {
        scenario: &scenario,
        file: template.file.clone(),
        overrides: Vec::new(),
        coordinator: "10.0.0.1:29411".into(),
        ranks_per_node: job.ranks_per_node,
        nodes,
    });
    let merge_s = t.elapsed().as_secs_f64();
    let mut again = merged.clone();
    let t = Instant::now();
    ups_doctor::diagnose::conclude(&mut again, ups_doctor::diagnose::Seen::Ran);
    let conclude_s = t.elapsed().as_secs_f64();
    drop(again);

    run.scenarios = vec![merged];
    let t = Instant::now();
    let report = ups_doctor::report::render_markdown(&run);
    let markdown_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let json = ups_doctor::report::result_json(&run).expect("result.json");
    let json_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let trace = ups_doctor::report::render_trace(&run);
    let trace_s = t.elapsed().as_secs_f64();
    let (_, peak) = rss_mib();
    // Loadable: the trace parses back as JSON with its events.
    let events = serde_json::from_str::<serde_json::Value>(&trace)
        .ok()
        .and_then(|v| v["traceEvents"].as_array().map(Vec::len))
        .unwrap_or(0);
    if let Some(dir) = &a.out {
        std::fs::create_dir_all(dir).expect("--out folder");
        std::fs::write(dir.join("report.md"), &report).expect("report.md");
        std::fs::write(dir.join("result.json"), &json).expect("result.json");
        std::fs::write(dir.join("trace.json"), &trace).expect("trace.json");
    }
    let s = &run.scenarios[0];
    let figures = serde_json::json!({
        "case": a.case,
        "ranks": a.ranks,
        "nodes": a.nodes,
        "simulate_s": simulate_s,
        "merge_s": merge_s,
        "conclude_s": conclude_s,
        "markdown_s": markdown_s,
        "result_json_s": json_s,
        "trace_s": trace_s,
        "input_rss_mib": input_rss,
        "peak_rss_mib": peak,
        "report_chars": report.chars().count(),
        "result_json_bytes": json.len(),
        "trace_bytes": trace.len(),
        "trace_events": events,
        "first_failure": s.first_failure,
        "headline": s.verdict.headline,
    });
    println!("{figures}");
}
