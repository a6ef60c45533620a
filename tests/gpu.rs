//! The GPU path through the real binary. On a machine without a GPU (CI, the project's CPU
//! machines): `device: cuda` is refused before launch with the reason, `auto` trains on the CPU,
//! a forced CUDA rank fails at start saying why, `amp` runs CPU bf16 autocast, `env` and the
//! report say why there are no GPU metrics. The `#[ignore]`d tests need a GPU and run the shipped
//! `scenarios/gpu/` scenarios for real (`scripts/gpu-check.sh` runs them).

use std::path::{Path, PathBuf};

use crate::util::{Sandbox, bin, tiny};
use serde_json::Value;

/// GPUs libtorch's CUDA sees on this machine, asked the way `ups-doctor run` asks.
fn gpus() -> u64 {
    let out = std::process::Command::new(crate::util::trainer_bin())
        .arg("cuda-probe")
        .output()
        .expect("cuda-probe runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("cuda-probe prints JSON");
    v["device_count"].as_u64().expect("a device count")
}

/// The checkout: where cargo built the tests, or `UPS_DOCTOR_REPO` on another machine.
fn repo() -> PathBuf {
    std::env::var_os("UPS_DOCTOR_REPO")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

#[test]
fn cuda_ranks_without_a_gpu_are_refused_before_anything_runs() {
    if gpus() > 0 {
        return; // covered by the GPU tests below
    }
    let sb = Sandbox::new();
    sb.scenario("cuda", &tiny(r#""launch": { "device": "cuda" }"#));
    let out = sb.cmd().args(["run", "scenarios/cuda.json"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with(
            "error: scenarios/cuda.json: `launch.device`: `cuda`, but this machine has no GPU CUDA can use: "
        ),
        "{stderr}"
    );
    // The reason names what is missing (here: libtorch_cuda.so's own CUDA libraries, or a driver).
    assert!(stderr.contains("libtorch_cuda.so") || stderr.contains("driver"), "{stderr}");
    assert!(
        stderr.contains("\n  hint: use `device: auto` to train on the CPU where there is no GPU"),
        "{stderr}"
    );
    assert!(!sb.path().join("reports").exists(), "nothing ran");
}

#[test]
fn auto_trains_on_the_cpu_and_the_report_says_why_there_are_no_gpu_metrics() {
    if gpus() > 0 {
        return;
    }
    let sb = Sandbox::new();
    let file = sb.scenario("auto", &tiny(""));
    let run = sb.run(&[&file], &[]);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    assert_eq!(run.rank(0)["device"], "cpu");
    let why = run.scenario()["gpu"]["unavailable"].as_str().expect("the GPU report says why");
    assert!(why.contains("libnvidia-ml.so.1"), "{why}");
    let report = std::fs::read_to_string(sb.out().join("report.md")).unwrap();
    assert!(
        report.contains(&format!(
            "**GPU:** metrics unavailable: {}. The ranks trained on the CPU.",
            why.trim_end_matches('.')
        )),
        "{report}"
    );
    // `device: cpu` is a choice: no GPU line at all.
    let cpu = sb.scenario("cpu", &tiny(r#""launch": { "device": "cpu" }"#));
    let run = sb.run(&[&cpu], &[]);
    assert!(run.scenario().get("gpu").is_none(), "{}", run.scenario());
}

#[test]
fn a_forced_cuda_rank_without_a_gpu_fails_at_start_saying_why() {
    if gpus() > 0 {
        return;
    }
    let sb = Sandbox::new();
    sb.scenario(
        "forced",
        &tiny(r#""launch": { "device": "cuda" }, "expect": { "outcome": "exited", "exit_code": 1, "phase": "start" }"#),
    );
    let out = sb
        .cmd()
        .env("UPS_DOCTOR_FORCE_GPU", "1")
        .args(["run", "scenarios/forced.json", "--out", "forced", "--json", "--quiet"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rank = &result["scenarios"][0]["ranks"][0];
    assert_eq!(rank["device"], "none");
    let error = rank["error"].as_str().unwrap();
    assert!(error.starts_with("`launch.device` is `cuda`, but this rank cannot use CUDA: "), "{error}");
    assert!(error.contains("hint: use `device: auto`"), "{error}");
}

#[test]
fn amp_runs_bf16_autocast_on_cpu_ranks_and_the_loss_still_falls() {
    let sb = Sandbox::new();
    let file = sb.scenario("amp", &tiny(r#""launch": { "device": "cpu" }"#));
    let run = sb.run(&[&file], &["--set", "train.steps=30", "--set", "train.amp=true"]);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    let rank = run.rank(0);
    let (first, last) = (rank["first_loss"].as_f64().unwrap(), rank["final_loss"].as_f64().unwrap());
    assert!(last < first * 0.8, "bf16 autocast must still train: {first} -> {last}");
}

#[test]
fn env_lists_nvml_driver_cuda_and_nccl() {
    let out = std::process::Command::new(bin()).args(["env", "--json"]).output().unwrap();
    assert!(out.status.success());
    let env: Value = serde_json::from_slice(&out.stdout).unwrap();
    let gpu = &env["gpu"];
    let cuda = &gpu["cuda"];
    assert!(cuda["cuda_runtime"].as_str().is_some_and(|v| v.starts_with("13.")), "{gpu}");
    assert!(cuda["nccl_version"].is_string() || cuda["nccl_error"].is_string(), "{gpu}");
    let text = std::process::Command::new(bin()).arg("env").output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    match gpu["nvml_error"].as_str() {
        Some(why) => {
            assert!(
                why.starts_with("libnvidia-ml.so.1 not found: no NVIDIA driver on this machine"),
                "{why}"
            );
            assert!(text.contains(&format!("unavailable: {why}")), "{text}");
        }
        None => {
            assert!(gpu["driver"]["driver_version"].is_string(), "{gpu}");
            assert!(!gpu["driver"]["gpus"].as_array().unwrap().is_empty(), "{gpu}");
        }
    }
}

#[test]
fn gpu_scenarios_stay_out_of_the_default_folder() {
    let files = ups_doctor::scenario::scenario_files(&[repo().join("scenarios")]).unwrap();
    assert!(!files.is_empty());
    assert!(files.iter().all(|f| f.parent() == Some(repo().join("scenarios").as_path())), "{files:?}");
    let gpu = ups_doctor::scenario::scenario_files(&[repo().join("scenarios/gpu")]).unwrap();
    let names: Vec<String> =
        gpu.iter().map(|f| f.file_stem().unwrap().to_string_lossy().into_owned()).collect();
    for want in ["single-cuda", "ddp-1rank-nccl", "workers-spawn-cuda", "workers-fork-cuda", "amp-cuda"] {
        assert!(names.iter().any(|n| n == want), "{names:?}");
    }
    for f in &gpu {
        ups_doctor::scenario::load_file(f, &[]).unwrap_or_else(|e| panic!("{e}"));
    }
}

// ---- GPU machine only (scripts/gpu-check.sh) ----

/// Runs one shipped GPU scenario (with `--set` overrides) and returns its result.
fn run_gpu_scenario(sb: &Sandbox, name: &str, set: &[&str]) -> Value {
    let file = repo().join(format!("scenarios/gpu/{name}.json"));
    let mut args: Vec<String> = Vec::new();
    for s in set {
        args.push("--set".into());
        args.push(s.to_string());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = sb.run(&[Path::new(&file)], &args);
    assert_eq!(run.code(), 0, "{name} did not meet its expectation:\n{}\n{}", run.stderr(), run.scenario());
    run.scenario().clone()
}

fn sampled_util(s: &Value) -> f64 {
    let g = &s["gpu"]["gpus"][0];
    assert!(g["used_by_run"].as_bool().unwrap(), "{}", s["gpu"]);
    g["util_percent"]["median"].as_f64().expect("utilisation was sampled")
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_single_cuda_trains_on_the_gpu_with_utilisation_and_memory_in_the_report() {
    let sb = Sandbox::new();
    let s = run_gpu_scenario(&sb, "single-cuda", &[]);
    assert_eq!(s["ranks"][0]["device"], "cuda:0");
    assert!(sampled_util(&s) > 0.0);
    let procs = s["gpu"]["processes"].as_array().unwrap();
    assert!(
        procs.iter().any(|p| p["role"] == "rank" && p["peak_memory_bytes"].as_u64().unwrap_or(0) > 0),
        "{procs:?}"
    );
    let report = std::fs::read_to_string(sb.out().join("report.md")).unwrap();
    assert!(report.contains("### GPU") && report.contains("title \"GPU 0 (% over time)\""), "{report}");
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_amp_and_ddp_over_nccl_train_on_the_gpu() {
    let sb = Sandbox::new();
    let amp = run_gpu_scenario(&sb, "amp-cuda", &[]);
    assert_eq!(amp["ranks"][0]["device"], "cuda:0");
    let sb = Sandbox::new();
    let ddp = run_gpu_scenario(&sb, "ddp-1rank-nccl", &[]);
    assert_eq!(ddp["ranks"][0]["device"], "cuda:0");
    assert!(ddp["ranks"][0]["params_checksum"].is_string());
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_spawned_workers_with_a_cuda_cache_hold_gpu_memory_of_their_own() {
    let sb = Sandbox::new();
    let s = run_gpu_scenario(&sb, "workers-spawn-cuda", &[]);
    let workers: Vec<&Value> =
        s["gpu"]["processes"].as_array().unwrap().iter().filter(|p| p["role"] == "worker").collect();
    assert!(!workers.is_empty(), "{}", s["gpu"]);
    let evidence = s["verdict"]["evidence"].to_string();
    assert!(evidence.contains("CUDA-contaminated cache"), "{evidence}");
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_forked_workers_touching_cuda_fail_and_the_report_says_use_spawn() {
    let sb = Sandbox::new();
    let s = run_gpu_scenario(&sb, "workers-fork-cuda", &[]);
    let cause = s["verdict"]["likely_cause"].as_str().unwrap();
    assert!(cause.contains("Cannot re-initialize CUDA in forked subprocess"), "{cause}");
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_more_cuda_ranks_than_gpus_are_refused_and_forced_ones_meet_nccls_duplicate_gpu_error() {
    if gpus() != 1 {
        return; // the text below is about one GPU
    }
    let sb = Sandbox::new();
    sb.scenario("two", &tiny(r#""launch": { "mode": "ddp", "world_size": 2, "device": "cuda" }"#));
    let out = sb.cmd().args(["run", "scenarios/two.json"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("2 CUDA ranks, but this machine has 1 GPU"), "{stderr}");
    let forced = sb
        .cmd()
        .env("UPS_DOCTOR_FORCE_GPU", "1")
        .args(["run", "scenarios/two.json", "--out", "forced", "--json", "--quiet"])
        .output()
        .unwrap();
    let result: Value = serde_json::from_slice(&forced.stdout).unwrap();
    let s = &result["scenarios"][0];
    let errors = s["ranks"].to_string();
    assert!(errors.contains("Duplicate GPU detected"), "{errors}");
    assert!(
        s["verdict"]["likely_cause"].as_str().unwrap().starts_with("Two ranks were given the same GPU"),
        "{s}"
    );
}
