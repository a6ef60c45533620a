//! Fuzzing in the test suite: seeded generated cases (mutations of real inputs: the shipped
//! scenarios, real markers, real `result.json` files) for the scenario loader, `--set`, the marker
//! parser and `ups-doctor report`. No panic, no hang, every load error positioned. The generator
//! is seeded, so a failure replays exactly; the case that failed is printed.
//!
//! Each target runs in a thread of its own under a generous watchdog: a hang fails the test
//! instead of stalling the suite.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use ups_doctor::protocol::Marker;
use ups_doctor::scenario::{self, Override, ScenarioError};

/// Cases per target.
const CASES: usize = 3000;

/// xorshift64*: small, seeded, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next() % n as u64) as usize }
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Tokens a mutation splices in: JSON syntax, absurd numbers, field names, odd strings.
const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "null",
    "true",
    "false",
    "0",
    "-1",
    "1e300",
    "-1e300",
    "1e-300",
    "4294967295",
    "18446744073709551616",
    "100000",
    "NaN",
    "Infinity",
    "\"\"",
    "[]",
    "{}",
    "\"x\"",
    "\"world_size\"",
    "\"steps\"",
    "\"timeout_s\"",
    "\"hang_after_s\"",
    "\"workers\"",
    "\"params\"",
    "\"command\"",
    "\"inject\"",
    "\"when\"",
    "\"shm_size\"",
    "\"64m\"",
    "\"9999999999999g\"",
    "\"{x}\"",
    "\"{world_size}\"",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "\u{feff}",
    "é",
    "\n",
    " ",
    "\"phase\"",
    "\"step\"",
    "\"rank\"",
    "\"depths\"",
    "[0]",
    "[1,1,1,1]",
    "\"fault\"",
    "\"segv\"",
    "\"launch\"",
    "\"mode\"",
];

/// One mutation of `input` (bytes: a mutation may break UTF-8).
fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(7) {
            0 => {
                if at < out.len() {
                    out[at] = rng.next() as u8;
                }
            }
            1 => {
                let end = (at + 1 + rng.below(16)).min(out.len());
                out.drain(at..end);
            }
            2 | 3 => {
                let token = rng.pick(TOKENS).as_bytes().to_vec();
                out.splice(at..at, token);
            }
            4 => out.truncate(at),
            5 => {
                let end = (at + rng.below(32)).min(out.len());
                let copy = out[at..end].to_vec();
                let to = rng.below(out.len() + 1);
                out.splice(to..to, copy);
            }
            _ => {
                // Replace a number with an absurd one.
                if let Some(pos) = out[at.min(out.len())..].iter().position(u8::is_ascii_digit) {
                    let start = at + pos;
                    let end = start + out[start..].iter().take_while(|b| b.is_ascii_digit()).count();
                    let token =
                        rng.pick(&["1e300", "4294967295", "100000", "-5", "0", "1.5"]).as_bytes().to_vec();
                    out.splice(start..end, token);
                }
            }
        }
    }
    out
}

/// Runs `body` on its own thread; fails if it panics or takes longer than a generous bound.
fn guarded(name: &str, body: impl FnOnce() -> String + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    let started = std::time::Instant::now();
    let handle = std::thread::spawn(move || {
        let summary = body();
        let _ = tx.send(summary);
    });
    match rx.recv_timeout(Duration::from_secs(300)) {
        Ok(summary) => eprintln!("fuzz {name}: {summary} in {:.1} s", started.elapsed().as_secs_f64()),
        Err(_) => {
            if handle.is_finished() {
                let _ = handle.join();
                panic!("fuzz {name}: a case panicked (see above)");
            }
            panic!("fuzz {name}: no answer within 300 s: a case hangs");
        }
    }
}

/// The shipped scenario files (external ones included): the seeds.
fn seeds() -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    for dir in ["scenarios", "scenarios/external"] {
        let Ok(entries) = std::fs::read_dir(crate::util::repo().join(dir)) else { continue };
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().is_some_and(|x| x == "json") {
                files.push((path.clone(), std::fs::read(&path).unwrap()));
            }
        }
    }
    files.sort();
    assert!(files.len() >= 10, "the shipped scenarios are the seeds");
    files
}

/// Whether the error says where: a position in the file, the `--set` that caused it, or a field
/// that is not written in the file at all (a default the rule is about), named.
fn positioned(e: &ScenarioError, source: &[u8]) -> bool {
    if e.line.is_some() || e.from_override.is_some() {
        return true;
    }
    let Some(field) = &e.field else { return false };
    let last = field.rsplit(['.', '[']).next().unwrap_or(field).trim_end_matches(']');
    !String::from_utf8_lossy(source).contains(&format!("\"{last}\""))
}

#[test]
fn the_scenario_loader_never_panics_and_positions_every_error() {
    guarded("scenario loader", || {
        let seeds = seeds();
        let dir = tempfile::tempdir().unwrap();
        let mut rng = Rng(0x0018_f00d_5eed_0001);
        let (mut ok, mut rejected) = (0, 0);
        for case in 0..CASES {
            let (origin, seed) = rng.pick(&seeds).clone();
            let bytes = mutate(&mut rng, &seed);
            // Through the file, so that invalid UTF-8 reaches the loader as it would.
            let file = dir.path().join(origin.file_name().unwrap());
            std::fs::write(&file, &bytes).unwrap();
            let outcome = std::panic::catch_unwind(|| scenario::load_file(&file, &[]));
            match outcome {
                Ok(Ok(_)) => ok += 1,
                Ok(Err(e)) => {
                    rejected += 1;
                    assert!(
                        positioned(&e, &bytes),
                        "case {case}: an error without a position: {e}\ninput:\n{}",
                        String::from_utf8_lossy(&bytes)
                    );
                }
                Err(_) => panic!("case {case}: the loader panicked on:\n{}", String::from_utf8_lossy(&bytes)),
            }
        }
        format!("{CASES} cases, {ok} loaded, {rejected} rejected with a position")
    });
}

#[test]
fn set_overrides_never_panic_and_name_the_culprit() {
    guarded("--set", || {
        let base = crate::util::repo().join("scenarios/ddp-2rank-cpu.json");
        let source = std::fs::read_to_string(&base).unwrap();
        let paths = [
            "train.steps",
            "limits.timeout_s",
            "limits.hang_after_s",
            "launch.world_size",
            "data.workers",
            "data.shm_size",
            "model.depths",
            "model.depths[0]",
            "inject[0].step",
            "inject[0].when.launch.mode",
            "params.x",
            "command",
            "expect.outcome",
            "data",
            "",
            ".",
            "a..b",
            "x[",
            "[0]",
            "train.steps[0]",
        ];
        let mut rng = Rng(0x0018_f00d_5eed_0002);
        let (mut parsed, mut refused, mut ok) = (0, 0, 0);
        for case in 0..CASES {
            let path = rng.pick(&paths).to_string();
            let token = *rng.pick(TOKENS);
            let value = String::from_utf8_lossy(&mutate(&mut rng, token.as_bytes())).into_owned();
            let raw = if rng.below(10) == 0 { value.clone() } else { format!("{path}={value}") };
            let outcome = std::panic::catch_unwind(|| {
                let o: Override = raw.parse()?;
                scenario::load_str(&source, &base, &[o]).map(|_| ()).map_err(|e| e.to_string())
            });
            match outcome {
                Err(_) => panic!("case {case}: `--set {raw}` panicked"),
                Ok(Ok(())) => ok += 1,
                Ok(Err(message)) => {
                    if message.starts_with(&base.display().to_string()) {
                        parsed += 1;
                        assert!(
                            message.contains("--set "),
                            "case {case}: `--set {raw}` not named: {message}"
                        );
                    } else {
                        refused += 1;
                    }
                }
            }
        }
        format!(
            "{CASES} cases, {ok} accepted, {parsed} refused by the loader naming the --set, {refused} refused as malformed"
        )
    });
}

#[test]
fn the_marker_parser_never_panics() {
    guarded("marker parser", || {
        let lines = [
            r#"{"t":"start","pid":12,"rank":0,"world_size":2,"device":"cpu","libtorch":"2.11.0","intra_op_threads":1}"#,
            r#"{"t":"phase","name":"forward","step":3}"#,
            r#"{"t":"step","step":3,"loss":0.5,"data_ms":1.0,"compute_ms":2.0,"samples":8}"#,
            r#"{"t":"done","steps":8,"first_loss":1.0,"final_loss":0.1,"checksum":"ab"}"#,
            r#"{"t":"worker","id":0,"pid":4242,"start_method":"fork"}"#,
            r#"{"t":"crash_raw","signal":11,"addrs":["0x1","0x2"]}"#,
            r#"{"t":"crash","signal":11,"frames":[{"addr":"0x1","symbol":"f","location":"a.rs:1"}]}"#,
            r#"{"t":"stack","tid":7,"thread":"main","frames":[]}"#,
            r#"{"t":"stack_end","threads":3}"#,
            r#"{"t":"error","message":"boom"}"#,
            r#"{"t":"dataset","bytes":100,"cache":"shm"}"#,
        ];
        let mut rng = Rng(0x0018_f00d_5eed_0003);
        let (mut ok, mut bad) = (0, 0);
        for case in 0..CASES {
            let seed = *rng.pick(&lines);
            let bytes = mutate(&mut rng, seed.as_bytes());
            let line = String::from_utf8_lossy(&bytes).into_owned();
            match std::panic::catch_unwind(|| Marker::parse(&line).is_ok()) {
                Ok(true) => ok += 1,
                Ok(false) => bad += 1,
                Err(_) => panic!("case {case}: the marker parser panicked on {line:?}"),
            }
        }
        format!("{CASES} cases, {ok} parsed, {bad} refused")
    });
}

/// The `result.json` files of the committed example reports, each cut to its first three
/// scenarios (the big one has two dozen; parsing it thousands of times measures nothing more).
fn example_results() -> Vec<Vec<u8>> {
    let mut found = Vec::new();
    for e in std::fs::read_dir(crate::util::repo().join("reports/examples")).unwrap().flatten() {
        let path = e.path().join("result.json");
        if let Ok(bytes) = std::fs::read(&path) {
            let mut value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            if let Some(scenarios) = value["scenarios"].as_array_mut() {
                scenarios.truncate(3);
            }
            found.push(serde_json::to_vec_pretty(&value).unwrap());
        }
    }
    assert!(!found.is_empty(), "the example reports are the seeds");
    found
}

/// Whether a `report` error about `result.json` says where.
fn report_error_positioned(message: &str) -> bool {
    // `…/result.json:LINE:COLUMN`: not a valid run result…
    message.split("result.json:").nth(1).is_some_and(|rest| {
        let mut parts = rest.splitn(3, ':');
        parts.next().is_some_and(|l| l.parse::<usize>().is_ok())
            && parts.next().is_some_and(|c| c.trim_end_matches('`').parse::<usize>().is_ok())
    })
}

#[test]
fn report_over_corrupted_result_json_never_panics_and_positions_every_error() {
    guarded("report", || {
        let seeds = example_results();
        let dir = tempfile::tempdir().unwrap();
        let mut rng = Rng(0x0018_f00d_5eed_0004);
        let (mut rendered, mut refused) = (0, 0);
        for case in 0..CASES {
            let seed = rng.pick(&seeds).clone();
            let bytes = mutate(&mut rng, &seed);
            std::fs::write(dir.path().join("result.json"), &bytes).unwrap();
            let outcome = std::panic::catch_unwind(|| {
                ups_doctor::report::rerender(dir.path()).map_err(|e| e.to_string())
            });
            match outcome {
                Err(_) => panic!("case {case}: `report` panicked on:\n{}", String::from_utf8_lossy(&bytes)),
                Ok(Ok(_)) => rendered += 1,
                Ok(Err(message)) => {
                    refused += 1;
                    assert!(report_error_positioned(&message), "case {case}: not positioned: {message}");
                }
            }
        }
        format!("{CASES} cases, {rendered} rendered, {refused} refused with a position")
    });
}

#[test]
fn report_through_the_real_binary_refuses_corrupted_results_with_a_position() {
    let seeds = example_results();
    let mut rng = Rng(0x0018_f00d_5eed_0005);
    let sb = crate::util::Sandbox::new();
    let mut refused = 0;
    for _ in 0..8 {
        let seed = rng.pick(&seeds).clone();
        let bytes = mutate(&mut rng, &seed);
        let dir = sb.path().join("run");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("result.json"), &bytes).unwrap();
        let out = sb.cmd().arg("report").arg(&dir).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        match out.status.code() {
            Some(0) => {}
            Some(2) => {
                refused += 1;
                assert!(report_error_positioned(&stderr), "{stderr}");
            }
            other => panic!("status {other:?}: {stderr}"),
        }
    }
    assert!(refused > 0, "no case was refused: the mutations do nothing");
}
