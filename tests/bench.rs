//! What bench/ relies on, with the real binary (and, for the peers, the real PyTorch venv that
//! `./x test` installs and names in `UPS_DOCTOR_PYTHON`): the trainer's `done:` line, the hidden
//! `train --loader-only`, and peers that hold the same data and the same model as the trainer.
//! No timings are asserted here; bench/run measures them.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{Sandbox, tiny};
use ups_doctor::protocol::RUN_ID_ENV;

/// Names this test process's `/dev/shm` segments, to find any left behind.
fn run_id() -> String {
    format!("bench-test-{}", std::process::id())
}

fn stdout_of(cmd: &mut Command) -> String {
    let out = cmd.output().expect("the command starts");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The words of the one line starting with `prefix`.
fn line<'a>(stdout: &'a str, prefix: &str) -> Vec<&'a str> {
    let found = stdout.lines().find(|l| l.starts_with(prefix));
    found.unwrap_or_else(|| panic!("no `{prefix}` line in:\n{stdout}")).split_whitespace().collect()
}

fn number(word: &str) -> f64 {
    word.trim_end_matches([',', ';', ')']).parse().unwrap_or_else(|_| panic!("`{word}` is not a number"))
}

#[test]
fn the_done_line_gives_the_trainers_own_loop_time() {
    let sb = Sandbox::new();
    let file = sb.scenario("tiny", &tiny(""));
    let stdout = stdout_of(sb.cmd().arg("train").arg(&file).args(["--set", "train.steps=6"]));
    // done: 6 steps, loss A -> B; 6 steps in S s, R steps/s (data D s, compute C s)
    let w = line(&stdout, "done:");
    assert_eq!((w[1], w[7], w[8]), ("6", "6", "steps"), "{stdout}");
    let (loop_s, rate, data_s, compute_s) = (number(w[10]), number(w[12]), number(w[15]), number(w[18]));
    assert!(loop_s > 0.0 && data_s >= 0.0 && compute_s > 0.0, "{stdout}");
    assert!(data_s + compute_s <= loop_s + 0.002, "data and compute are parts of the loop: {stdout}");
    // The line rounds the loop time to 1 ms and the rate to 0.001 steps/s: their product is 6
    // within what that rounding allows (half a unit of each, times the other).
    let rounding = rate * 0.0005 + loop_s * 0.0005;
    assert!((rate * loop_s - 6.0).abs() <= rounding, "steps/s is steps over the loop time: {stdout}");
}

/// `train --loader-only` with the given overrides: (batches, batch size, checksum).
fn loader_only(sb: &Sandbox, file: &Path, sets: &[&str]) -> (u64, u64, String) {
    let mut cmd = sb.cmd();
    cmd.env(RUN_ID_ENV, run_id()).arg("train").arg("--loader-only").arg(file);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let stdout = stdout_of(&mut cmd);
    // loader-only: N batches of B samples in … s, first batch after … s, … samples/s after the
    // first W batches; dataset checksum 0x…
    let w = line(&stdout, "loader-only:");
    assert!(number(w[w.len() - 10]) > 0.0, "a throughput: {stdout}");
    (number(w[1]) as u64, number(w[4]) as u64, w[w.len() - 1].to_string())
}

#[test]
fn the_loader_only_path_draws_every_batch_of_the_same_data_with_any_workers() {
    let sb = Sandbox::new();
    let file = sb.scenario("tiny", &tiny(""));
    let sets = ["train.steps=5", "train.accum_steps=2", "data.augment_passes=2"];
    let with = |more: &[&'static str]| -> Vec<&'static str> { sets.iter().chain(more).copied().collect() };
    let inline = loader_only(&sb, &file, &sets);
    assert_eq!((inline.0, inline.1), (10, 8), "steps × accum_steps batches of data.batch_size");
    assert!(inline.2.starts_with("0x") && inline.2.len() == 18, "{}", inline.2);
    let forked = loader_only(&sb, &file, &with(&["data.workers=2"]));
    let spawned =
        loader_only(&sb, &file, &with(&["data.workers=2", "data.start_method=spawn", "data.cache=shm"]));
    assert_eq!(forked, inline);
    assert_eq!(spawned, inline);
    let other_seed = loader_only(&sb, &file, &with(&["train.seed=1"]));
    assert_ne!(other_seed.2, inline.2, "the checksum tells data sets apart");
    let leftovers: Vec<_> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(&run_id()))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

fn python() -> PathBuf {
    let python = std::env::var_os("UPS_DOCTOR_PYTHON").expect(
        "UPS_DOCTOR_PYTHON is not set: the bench peers need the PyTorch venv; `./x test` installs it and \
         sets it (or run `eval \"$(./x env)\"` before cargo test)",
    );
    PathBuf::from(python)
}

fn peers() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("bench").join("peers")
}

#[test]
fn the_python_peers_hold_the_trainers_data_and_model() {
    let sb = Sandbox::new();
    let file = sb.scenario("tiny", &tiny(""));
    let script = r#"
import json, sys, torch
import upsdata, upsmodel
torch.manual_seed(int(sys.argv[1]))
print(hex(upsdata.checksum(upsdata.generate(16, 64, 4))))
for extra in json.loads(sys.argv[2]):
    print(upsmodel.parameter_count(upsmodel.Operator(dict(upsmodel.DEFAULT_MODEL, **extra))))
"#;
    let models = [
        r#"{"depths": [1], "hidden": 32, "heads": 2, "latent_tokens": 8, "window": 2}"#,
        r#"{"depths": [2, 1], "hidden": 48, "heads": 3, "latent_tokens": 8, "window": 0, "attention": false}"#,
        r#"{"depths": [1], "hidden": 32, "heads": 2, "latent_tokens": 8, "conditioning": false, "mlp_ratio": 4}"#,
    ];
    let stdout = stdout_of(Command::new(python()).current_dir(peers()).env("OMP_NUM_THREADS", "1").args([
        "-c",
        script,
        "3",
        &format!("[{}]", models.join(",")),
    ]));
    let mut lines = stdout.lines();
    let (_, _, ours) = loader_only(&sb, &file, &["train.seed=3"]);
    // Python's hex() has no leading zeros; ours is zero-padded to 16 digits.
    let theirs = lines.next().unwrap();
    assert_eq!(u64::from_str_radix(&ours[2..], 16).unwrap(), u64::from_str_radix(&theirs[2..], 16).unwrap());
    for (i, model) in models.iter().enumerate() {
        let peer: u64 = lines.next().unwrap().trim().parse().unwrap();
        let body = format!(
            r#"{{ "model": {model}, "data": {{ "samples": 16, "grid": 64, "timesteps": 4, "queries": 32 }},
                 "train": {{ "steps": 1 }} }}"#
        );
        let run = sb.run(&[&sb.scenario(&format!("model{i}"), &body)], &[]);
        assert_eq!(run.code(), 0, "{}", run.stderr());
        let state = run.rank(0)["optimizer_state_bytes"].as_u64().unwrap();
        assert_eq!(peer, state / 8, "parameters of {model}: two f32 AdamW moments per parameter");
    }
}
