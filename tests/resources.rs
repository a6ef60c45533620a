//! A rank that ran out of something its program asked for, from real runs of real PyTorch (CPU):
//! a checkpoint that does not fit the model (`load_state_dict`), file descriptors under a low
//! `ulimit -n` with DataLoader workers. (A CUDA OOM needs a GPU: its text is a unit test's
//! fixture, `src/diagnose/catalog/resources.rs`, with where it came from.)

use crate::util::{Sandbox, program, run_command as run, venv_path};
use serde_json::Value;

fn verdict<'v>(s: &'v Value, field: &str) -> &'v str {
    s["verdict"][field].as_str().unwrap_or_else(|| panic!("no verdict.{field}: {:#}", s["verdict"]))
}

/// Rank 0 saves the DDP-wrapped model's checkpoint and every rank loads it into the bare model:
/// each raises PyTorch's `Error(s) in loading state_dict`, and the verdict says the checkpoint's
/// names carry DDP's `module.` prefix and how to load it.
#[test]
fn a_checkpoint_of_the_ddp_wrapped_model_loaded_into_the_bare_one_names_the_prefix_on_every_rank() {
    let sb = Sandbox::new();
    let ckpt = sb.path().join("model.pt").display().to_string();
    let prog = program("checkpoint.py");
    let out = run(&sb, &["--", "torchrun", "--nproc_per_node", "2", &prog, "--path", &ckpt]);
    let s = out.scenario();
    // Rank 0's own end: status 1, or torchrun's SIGTERM as it exited after its traceback (a race).
    assert!(s["outcome"] == "exited" || s["outcome"] == "signaled", "{}\n{:#}", out.stderr(), s["verdict"]);
    assert_eq!(verdict(s, "pattern"), "state-dict-mismatch", "{:#}", s["verdict"]);
    assert_eq!(s["first_failure"], 0, "the lowest of the ranks that raised: {:#}", s["verdict"]);
    let headline = verdict(s, "headline");
    assert!(
        headline.contains("the checkpoint's names carry a `module.` prefix the model's lack"),
        "{headline}"
    );
    assert!(verdict(s, "next_step").contains("DDP's `module.`"), "{:#}", s["verdict"]);
    assert!(
        verdict(s, "key_line").starts_with("RuntimeError: Error(s) in loading state_dict for Sequential")
    );
    // Both ranks failed the same way, each on its own: no rank is the other's collateral.
    let collateral: Vec<&Value> =
        s["ranks"].as_array().unwrap().iter().filter(|r| r["collateral"] == true).collect();
    assert!(collateral.is_empty(), "{:#}", s["verdict"]);
}

/// A DataLoader's workers hand every tensor over as a file descriptor; under `ulimit -n 256` (set
/// in the shell that runs the program, as a job script does) the process runs out and
/// `multiprocessing` fails with `received 0 items of ancdata`: named as too many open files, with
/// the limit and the sharing strategy as the way out.
#[test]
fn a_dataloader_that_runs_out_of_file_descriptors_is_named_so() {
    let sb = Sandbox::new();
    let prog = program("nofile.py");
    let script = format!("ulimit -n 256; exec python {prog}");
    let out = run(&sb, &["--", "sh", "-c", &script]);
    let s = out.scenario();
    assert_eq!(s["outcome"], "exited", "{}\n{:#}", out.stderr(), s["verdict"]);
    assert_eq!(verdict(s, "pattern"), "too-many-open-files", "{:#}", s["verdict"]);
    assert!(verdict(s, "key_line").contains("received 0 items of ancdata"), "{:#}", s["verdict"]);
    assert!(verdict(s, "next_step").contains("ulimit -n"), "{:#}", s["verdict"]);
}

/// A 2-task `srun` step with a 5 s time limit on the one-host Slurm cluster: slurmstepd cancels it
/// (SIGTERM, then SIGKILL) and says so. The verdict is the scheduler's limit: no rank failed
/// first, none is collateral, and the program is not said to have crashed.
#[test]
fn a_step_slurm_ends_at_its_time_limit_is_the_schedulers_doing_not_a_crash() {
    let Some(conf) = crate::util::slurm::cluster("time limit") else { return };
    let sb = Sandbox::new();
    let mut cmd = sb.cmd();
    cmd.env("PATH", venv_path()).env("SLURM_CONF", &conf);
    let out = sb.run_with(
        cmd,
        &[],
        &[
            "--hang-after",
            "300",
            "--timeout",
            "400",
            "--",
            "srun",
            "-N",
            "1",
            "-n",
            "2",
            "--time=0:05",
            "-J",
            "ups-doctor-test-time-limit",
            "python",
            "-c",
            "import time; time.sleep(600)",
        ],
    );
    let s = out.scenario();
    assert_eq!(verdict(s, "pattern"), "scheduler-ended", "{}\n{:#}", out.stderr(), s["verdict"]);
    assert!(s["first_failure"].is_null(), "{:#}", s["verdict"]);
    let headline = verdict(s, "headline");
    assert!(
        headline.starts_with("Slurm ended step ")
            && headline.contains("at its time limit")
            && headline.contains("not by a fault of the program"),
        "{headline}"
    );
    let collateral: Vec<&Value> =
        s["ranks"].as_array().unwrap().iter().filter(|r| r["collateral"] == true).collect();
    assert!(collateral.is_empty(), "{:#}", s["verdict"]);
}

/// A step compiled with `fullgraph=True` that branches on a tensor's value: TorchDynamo raises
/// its own exception, named as `torch.compile` failing to trace, with where to look.
#[test]
fn a_compiled_step_that_cannot_be_one_graph_is_named_as_torch_compile_failing() {
    let sb = Sandbox::new();
    let out = run(&sb, &["--", "python", &program("compile_break.py")]);
    let s = out.scenario();
    assert_eq!(verdict(s, "pattern"), "compile-failed", "{}\n{:#}", out.stderr(), s["verdict"]);
    assert!(verdict(s, "key_line").starts_with("torch._dynamo.exc."), "{:#}", s["verdict"]);
    assert!(
        verdict(s, "headline").contains("TorchDynamo could not trace the code into one graph"),
        "{:#}",
        s["verdict"]
    );
    assert!(verdict(s, "next_step").contains("TORCH_LOGS=graph_breaks"), "{:#}", s["verdict"]);
}

/// The NVIDIA driver's Xid for a rank's process, written into the real kernel log (`/dev/kmsg`,
/// as root) the way the driver writes it when the GPU under the process fails, from outside the
/// program (`tests/programs/inject`); rank 1 then raises. The verdict is the GPU fault, rank 1's,
/// with the driver's line quoted. The same line only printed by the rank is no GPU fault.
#[test]
fn an_xid_the_driver_logs_for_a_ranks_process_is_the_verdict_and_a_printed_one_is_not() {
    let inject = format!("PYTHONPATH={}", crate::util::repo().join("tests/programs/inject").display());
    let prog = program("ddp.py");
    let run_with = |sb: &Sandbox, extra: &[&str]| {
        let mut args: Vec<&str> =
            vec!["--env", &inject, "--env", "INJECT_XID_RANK=1", "--env", "INJECT_XID_STEP=3"];
        for e in extra {
            args.extend(["--env", e]);
        }
        args.extend(["--", "torchrun", "--nproc_per_node", "2", &prog, "--steps", "8"]);
        run(sb, &args).scenario().clone()
    };
    let sb = Sandbox::new();
    let s = run_with(&sb, &[]);
    assert_eq!(verdict(&s, "pattern"), "gpu-xid", "{:#}", s["verdict"]);
    assert_eq!(s["first_failure"], 1, "{:#}", s["verdict"]);
    let headline = verdict(&s, "headline");
    assert!(
        headline.starts_with(
            "Rank 1's GPU failed: the NVIDIA driver reported Xid 79 (the GPU has fallen off the bus)"
        ),
        "{headline}"
    );
    let pid = s["ranks"][1]["pid"].as_u64().expect("rank 1's pid");
    assert_eq!(s["xids"][0]["pid"], pid, "{:#}", s["xids"]);
    let evidence = s["verdict"]["evidence"].to_string();
    assert!(
        evidence.contains(&format!("NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python")),
        "{evidence}"
    );

    let sb = Sandbox::new();
    let s = run_with(&sb, &["INJECT_XID_PRINT=1"]);
    assert_ne!(s["verdict"]["pattern"], "gpu-xid", "{:#}", s["verdict"]);
    assert_eq!(s["first_failure"], 1, "{:#}", s["verdict"]);
    assert!(s["xids"].is_null(), "{:#}", s["xids"]);
}
