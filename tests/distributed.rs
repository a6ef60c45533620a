//! Multi-rank runs with the real trainer: DDP over the `tcp` backend through libtorch's TCPStore,
//! first failure vs collateral, ranks out of step, unused parameters, and ranks started by hand
//! with the torchrun environment.

use std::process::Command;

use crate::util::{Sandbox, alive, tiny};
use serde_json::Value;

fn ddp(extra: &str) -> String {
    let sep = if extra.trim().is_empty() { "" } else { "," };
    tiny(&format!(r#""launch": {{"mode": "ddp", "world_size": 2}}{sep} {extra}"#))
}

fn losses(rank: &Value) -> Vec<f64> {
    rank["losses"].as_array().unwrap().iter().map(|p| p[1].as_f64().unwrap()).collect()
}

#[test]
fn ddp_ranks_end_bit_identical_and_match_one_rank_on_the_global_batch() {
    let sb = Sandbox::new();
    let file = sb.scenario("ddp", &ddp(""));
    let two = sb.run(&[&file], &["--set", "train.steps=30"]);
    assert_eq!(two.code(), 0, "stderr:\n{}", two.stderr());
    let (r0, r1) = (two.rank(0), two.rank(1));
    assert_eq!(r0["outcome"], "passed");
    assert_eq!(r1["outcome"], "passed");
    assert!(r0["params_checksum"].is_string());
    assert_eq!(r0["params_checksum"], r1["params_checksum"], "parameters are bit-identical across ranks");

    // The same global batch (2 × 8) on one rank.
    let one = sb.run(
        &[&file],
        &["--set", "train.steps=30", "--set", "launch.world_size=1", "--set", "data.batch_size=16"],
    );
    assert_eq!(one.code(), 0, "stderr:\n{}", one.stderr());
    let (a, b) = (losses(one.rank(0)), losses(two.rank(0)));
    assert_eq!(a.len(), 30);
    // Stated tolerance: 1e-4 relative over 30 steps (measured: < 1e-6; the runs differ only in
    // floating-point summation order, which compounds chaotically over longer runs).
    for (step, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!((x - y).abs() <= 1e-4 * x.abs(), "step {step}: one rank {x}, two ranks {y}");
    }
}

#[test]
fn a_rank_that_segfaults_is_the_culprit_and_its_peer_is_collateral() {
    let sb = Sandbox::new();
    let file = sb.scenario(
        "segv",
        &ddp(r#""inject": [{"fault": "segv", "phase": "forward", "step": 3, "rank": 1}],
                "expect": {"outcome": "signaled", "signal": "SIGSEGV", "rank": 1, "phase": "forward", "step": 3}"#),
    );
    let run = sb.run(&[&file], &[]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    let s = run.scenario();
    assert_eq!(s["first_failure"], 1);
    let (r0, r1) = (run.rank(0), run.rank(1));
    assert_eq!(r1["signal"], "SIGSEGV");
    assert_eq!(r1["collateral"], false);
    assert_eq!(r0["collateral"], true);
    assert_eq!(r0["last_phase"], "allreduce", "rank 0 was waiting for rank 1 in the all-reduce");
    let evidence = s["verdict"]["evidence"].to_string();
    assert!(evidence.contains("collateral: rank 0"), "{evidence}");
    assert!(s["verdict"]["headline"].as_str().unwrap().starts_with("Rank 1 was killed by SIGSEGV"));
    assert_eq!(s["verdict"]["pattern"], "native-crash");
    for r in [r0, r1] {
        assert!(!alive(r["pid"].as_u64().unwrap()), "no rank outlives the run");
    }
    let report = std::fs::read_to_string(sb.out().join("report.md")).unwrap();
    assert!(report.contains("(first failure)") && report.contains("(collateral)"), "{report}");
}

#[test]
fn ranks_out_of_step_hang_and_the_odd_rank_is_named() {
    let sb = Sandbox::new();
    let file = sb.scenario(
        "uneven",
        &ddp(r#""inject": [{"fault": "uneven_steps", "phase": "data.next", "step": 4, "rank": 1}],
                "expect": {"outcome": "hung", "rank": 1}"#),
    );
    let run = sb.run(&[&file], &["--set", "limits.hang_after_s=10"]);
    assert_eq!(run.code(), 0, "stderr:\n{}", run.stderr());
    let (r0, r1) = (run.rank(0), run.rank(1));
    assert_eq!(r0["outcome"], "hung");
    assert_eq!(r0["last_phase"], "allreduce");
    assert_eq!(r0["last_step"], 4);
    assert_eq!(r1["last_phase"], "dist.barrier");
    assert!(!r0["stacks"].as_array().unwrap().is_empty(), "stacks of the stuck ranks");
    let cause = run.scenario()["verdict"]["likely_cause"].as_str().unwrap();
    assert!(cause.contains("out of step") && cause.contains("Rank 1 stopped first"), "{cause}");
    assert_eq!(run.scenario()["verdict"]["pattern"], "ranks-out-of-step");
}

#[test]
fn an_unused_parameter_fails_on_the_next_forward_unless_find_unused_parameters() {
    let sb = Sandbox::new();
    let file = sb
        .scenario("unused", &ddp(r#""inject": [{"fault": "unused_param", "phase": "forward", "step": 2}]"#));
    let run = sb.run(&[&file], &[]);
    let r0 = run.rank(0);
    assert_eq!(r0["outcome"], "exited");
    assert_eq!(r0["last_phase"], "forward");
    assert_eq!(r0["last_step"], 3, "raised on the forward after the one that skipped");
    let error = r0["error"].as_str().unwrap();
    assert!(error.starts_with("Expected to have finished reduction in the prior iteration"), "{error}");
    assert!(error.contains("Parameter indices which did not receive grad for rank 0: "), "{error}");
    assert!(error.contains("stage0.block0"), "names the parameters: {error}");
    let verdict = &run.scenario()["verdict"];
    assert_eq!(verdict["pattern"], "ddp-unused-parameters");
    let headline = verdict["headline"].as_str().unwrap();
    assert!(
        headline.starts_with("DDP found unused parameters:") && headline.contains("stage0.block0"),
        "{headline}"
    );
    assert!(verdict["next_step"].as_str().unwrap().contains("find_unused_parameters"));

    let handled = sb.run(&[&file], &["--set", "train.find_unused_parameters=true"]);
    assert_eq!(handled.code(), 0, "stderr:\n{}", handled.stderr());
    assert_eq!(handled.rank(0)["params_checksum"], handled.rank(1)["params_checksum"]);
}

#[test]
fn ranks_started_by_hand_with_the_torchrun_environment_train_together() {
    let sb = Sandbox::new();
    let file = sb.scenario("byhand", &ddp(""));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let children: Vec<_> = (0..2)
        .map(|rank| {
            Command::new(crate::util::bin())
                .arg("train")
                .arg(&file)
                .envs([
                    ("RANK", rank.to_string()),
                    ("LOCAL_RANK", rank.to_string()),
                    ("WORLD_SIZE", "2".to_string()),
                    ("MASTER_ADDR", "127.0.0.1".to_string()),
                    ("MASTER_PORT", port.to_string()),
                    ("OMP_NUM_THREADS", "1".to_string()),
                ])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs: Vec<_> = children.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    for (rank, out) in outputs.iter().enumerate() {
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "rank {rank}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("done: 8 steps"), "rank {rank}: {stdout}");
    }
}

#[test]
fn a_rank_that_cannot_reach_the_store_names_the_address_and_the_timeout() {
    let sb = Sandbox::new();
    let file = sb.scenario("lonely", &ddp(""));
    // Rank 1 of 2, and nobody hosts the store: the port refuses connections for the whole test.
    let (_held, port) = crate::util::refused_port();
    let out = Command::new(crate::util::bin())
        .arg("train")
        .arg(&file)
        .args(["--set", "limits.timeout_s=3"])
        .envs([
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", &port.to_string()),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("127.0.0.1:{port}")) && stderr.contains("3 s"), "{stderr}");
}

#[test]
fn nccl_on_cpu_ranks_is_refused_before_anything_runs() {
    let sb = Sandbox::new();
    let body = tiny(r#""launch": {"mode": "ddp", "world_size": 2, "device": "cpu", "backend": "nccl"}"#);
    sb.scenario("nccl-cpu", &body);
    let out = sb.cmd().args(["run", "scenarios/nccl-cpu.json"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "`launch.backend`: `nccl` needs CUDA tensors, but `device` is `cpu`: NCCL cannot reduce CPU \
             memory"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("hint: use `backend: tcp` (or `auto`, which picks `tcp` for CPU ranks)"),
        "{stderr}"
    );
    assert!(!sb.path().join("reports").exists(), "nothing ran");
}

#[test]
fn nccl_chosen_while_ranks_train_on_the_cpu_fails_at_dist_init_saying_why() {
    // `device: auto` loads (the device is decided on the machine), but until the model moves to
    // CUDA every rank trains on the CPU, where NCCL cannot work: each rank says so at `dist.init`.
    let sb = Sandbox::new();
    let file =
        sb.scenario("nccl-auto", &tiny(r#""launch": {"mode": "ddp", "world_size": 2, "backend": "nccl"}"#));
    let run = sb.run(&[&file], &[]);
    assert_eq!(run.code(), 1, "stderr:\n{}", run.stderr());
    for rank in 0..2 {
        let r = run.rank(rank);
        assert_eq!(r["outcome"], "exited", "rank {rank}: {r}");
        assert_eq!(r["last_phase"], "dist.init", "rank {rank}: {r}");
        let error = r["error"].as_str().unwrap();
        assert!(
            error.starts_with("`launch.backend: nccl` needs CUDA tensors, but this rank trains on the CPU"),
            "{error}"
        );
    }
}
