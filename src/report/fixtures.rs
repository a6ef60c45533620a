//! Hand-built run results for the report tests: one per shape of failure the report must explain.
//! Values are fixed (no clocks, pids or paths from the machine), so snapshots are stable.

use crate::probe::env::{EnvSummary, PythonEnv};
use crate::protocol::Frame;
use crate::scenario::{Expect, Fault, FaultKind, Mode, OutcomeKind, Scenario};
use crate::schema::{
    DatasetSharing, LeftoverProcess, LeftoverSegment, Leftovers, MemoryPoint, MemoryReport, PhaseSpan,
    ProcessMemory, ProcessRole, RankResult, RunResult, ScenarioResult, ShmAt, ShmUsage, Signal, ThreadStack,
    Verdict,
};

const MIB: u64 = 1024 * 1024;

pub fn env() -> EnvSummary {
    EnvSummary {
        tool_version: "0.1.0".into(),
        hostname: "trainbox-7".into(),
        os: "Ubuntu 24.04.2 LTS".into(),
        kernel: "6.8.0-57-generic".into(),
        arch: "x86_64".into(),
        cpus: 16,
        memory_total_bytes: Some(64 * 1024 * MIB),
        libtorch_version: "2.11.0".into(),
        libtorch_lib: "/root/.cache/ups-doctor/libtorch-2.11.0/torch/lib".into(),
        shm_total_bytes: Some(64 * MIB),
        shm_used_bytes: Some(3 * MIB / 2),
        open_files_limit: Some("1048576 (hard 1048576)".into()),
        locked_memory_limit: Some("8192 (hard 8192)".into()),
        cgroup_memory_max: Some("max".into()),
        cgroup_cpu_max: Some("max 100000".into()),
        container: Some("docker".into()),
        variables: vec![
            ("OMP_NUM_THREADS".into(), "4".into()),
            ("TORCH_SHOW_CPP_STACKTRACES".into(), "1".into()),
        ],
        python: Some(PythonEnv {
            executable: "/opt/venv/bin/python3".into(),
            version: Some("3.12.3".into()),
            torch_version: Some("2.11.0+cu130".into()),
            start_method: Some("fork".into()),
            problem: None,
        }),
        gpu: None,
    }
}

pub fn run(scenarios: Vec<ScenarioResult>) -> RunResult {
    RunResult {
        tool_version: "0.1.0".into(),
        started_at: "2025-06-02T09:14:03Z".into(),
        command: vec!["ups-doctor".into(), "run".into(), "scenarios/".into()],
        environment: env(),
        scenarios,
        not_run: Vec::new(),
        interrupted: false,
        stopped_by: None,
        logs_cut: Vec::new(),
    }
}

fn frame(addr: &str, symbol: Option<&str>, location: Option<&str>) -> Frame {
    Frame { addr: addr.into(), symbol: symbol.map(Into::into), location: location.map(Into::into) }
}

fn span(phase: &str, start_s: f64, end_s: Option<f64>) -> PhaseSpan {
    PhaseSpan { phase: phase.into(), start_s, end_s }
}

/// A rank that trained `steps` steps and ended well; tests change what they need.
pub fn rank(rank: u32, steps: u64) -> RankResult {
    let losses: Vec<(u64, f64)> = (0..steps).map(|s| (s, 0.35 + 1.95 * (-(s as f64) / 12.0).exp())).collect();
    RankResult {
        rank,
        pid: Some(41000 + rank),
        device: Some("cpu".into()),
        outcome: OutcomeKind::Passed,
        signal: None,
        exit_code: Some(0),
        last_phase: Some("train".into()),
        last_step: steps.checked_sub(1),
        error: None,
        backtrace: Vec::new(),
        raw_backtrace: Vec::new(),
        stacks: Vec::new(),
        ended_at_s: Some(5.42),
        last_marker_at_s: Some(5.40),
        hang_detected_after_s: None,
        hung_at_s: None,
        silent_cpu: None,
        torn_down_with: None,
        collateral: false,
        params_checksum: None,
        optimizer_state_bytes: None,
        steps_done: steps,
        observed: None,
        first_loss: losses.first().map(|l| l.1),
        final_loss: losses.last().map(|l| l.1),
        data_wait_fraction: Some(0.031),
        losses,
        timeline: vec![
            span("start", 0.0, Some(0.08)),
            span("data.generate", 0.08, Some(0.61)),
            span("model.build", 0.61, Some(0.74)),
            span("train", 0.74, Some(5.38)),
        ],
        stdout_log: format!("logs/rank{rank}.stdout"),
        stderr_log: format!("logs/rank{rank}.stderr"),
        log_tail: vec![
            format!("[rank {rank}] device cpu, 4 intra-op threads"),
            format!("[rank {rank}] step 59 loss 0.3663"),
        ],
        markers: 250,
        bad_markers: 0,
        dropped_markers: 0,
        foreign_pids: Vec::new(),
        step_ends_s: Vec::new(),
        log_errors: Vec::new(),
        workers: Vec::new(),
        exit_source: None,
        identified_by: None,
        last_output_at_s: None,
        quotes: Vec::new(),
        dumps: Vec::new(),
    }
}

fn scenario(name: &str, mode: Mode, world_size: u32, expect: Expect) -> Scenario {
    let mut s = Scenario { name: name.into(), ..Scenario::default() };
    s.launch.mode = mode;
    s.launch.world_size = world_size;
    s.expect = expect;
    s
}

/// A process's peaks, in MiB; shared is RSS minus USS.
fn process(
    rank: u32,
    role: ProcessRole,
    worker: Option<u32>,
    pid: u32,
    rss: u64,
    pss: u64,
    uss: u64,
) -> ProcessMemory {
    ProcessMemory {
        rank,
        role,
        worker,
        pid,
        command: "ups-doctor".into(),
        peak_rss_bytes: rss * MIB,
        peak_pss_bytes: pss * MIB,
        peak_uss_bytes: uss * MIB,
        peak_shared_bytes: (rss - uss) * MIB,
    }
}

/// Points of (seconds, PSS per rank in MiB, /dev/shm used in MiB).
fn series(points: &[(f64, &[u64], u64)]) -> Vec<MemoryPoint> {
    points
        .iter()
        .map(|(t, pss, shm)| MemoryPoint {
            t_s: *t,
            pss_bytes: pss.iter().map(|p| p * MIB).collect(),
            shm_used_bytes: Some(shm * MIB),
        })
        .collect()
}

/// A single-rank CPU run that trains and passes.
pub fn passing() -> ScenarioResult {
    let mut sc = scenario("single-cpu-baseline", Mode::Single, 1, Expect::default());
    sc.description = "The reference run: one rank, no workers, the default model.".into();
    ScenarioResult {
        name: sc.name.clone(),
        file: "scenarios/single-cpu-baseline.json".into(),
        overrides: Vec::new(),
        scenario: sc,
        outcome: OutcomeKind::Passed,
        met_expectation: true,
        interrupted: false,
        expectation_mismatches: Vec::new(),
        verdict: Verdict {
            headline: "Rank 0 trained 60 steps and its loss fell from 2.3 to 0.37.".into(),
            evidence: Vec::new(),
            likely_cause: None,
            next_step: None,
            ..Default::default()
        },
        first_failure: None,
        ranks: vec![RankResult {
            params_checksum: Some("5d1c0f7e9a2b4c68".into()),
            optimizer_state_bytes: Some(1_262_592),
            ..rank(0, 60)
        }],
        wall_s: 5.61,
        steps_per_s: Some(13.04),
        samples_per_s: Some(208.6),
        memory: Some(MemoryReport {
            interval_s: 0.25,
            samples: 22,
            processes: vec![process(0, ProcessRole::Rank, None, 41000, 412, 298, 279)],
            series: series(&[(0.25, &[38], 1), (1.5, &[220], 1), (3.0, &[298], 2), (5.25, &[291], 1)]),
            shm: ShmUsage {
                private: false,
                total_bytes: Some(64 * MIB),
                peak_used_bytes: Some(3 * MIB / 2),
                peak_ours_bytes: 0,
                at_rank_end: vec![ShmAt {
                    rank: 0,
                    t_s: 5.42,
                    used_bytes: 3 * MIB / 2,
                    total_bytes: 64 * MIB,
                }],
            },
            datasets: Vec::new(),
        }),
        leftovers: Leftovers::default(),
        external: None,
        cgroup: None,
        oom_kills: Vec::new(),
        xids: Vec::new(),
        cgroup_unavailable: None,
        nodes: None,
        gpu: None,
    }
}

/// DDP on two ranks: rank 1 is killed by SIGSEGV in `forward` at step 3, rank 0 is torn down.
pub fn segv() -> ScenarioResult {
    let expect = Expect {
        outcome: OutcomeKind::Signaled,
        signal: Some("SIGSEGV".into()),
        rank: Some(1),
        phase: Some("forward".into()),
        step: Some(3),
        ..Expect::default()
    };
    let mut sc = scenario("ddp-segv-forward", Mode::Ddp, 2, expect);
    sc.train.steps = 20;
    sc.inject = vec![Fault {
        fault: FaultKind::Segv,
        phase: "forward".into(),
        step: 3,
        rank: Some(1),
        when: Default::default(),
        probability: 1.0,
        size: None,
    }];

    let timeline = |end: Option<f64>| {
        vec![
            span("start", 0.0, Some(0.09)),
            span("dist.init", 0.09, Some(0.42)),
            span("data.generate", 0.42, Some(0.95)),
            span("model.build", 0.95, Some(1.10)),
            span("train", 1.10, end),
        ]
    };
    let mut r0 = rank(0, 3);
    r0.outcome = OutcomeKind::Signaled;
    r0.signal = Some(Signal::TERM);
    r0.exit_code = None;
    r0.torn_down_with = Some(Signal::TERM);
    r0.collateral = true;
    r0.last_phase = Some("allreduce".into());
    r0.last_step = Some(3);
    r0.error = Some(
        "[tcp] allreduce of bucket 0 failed: Connection closed by peer [127.0.0.1]:29517 \
         (rank 1)"
            .into(),
    );
    r0.ended_at_s = Some(3.71);
    r0.last_marker_at_s = Some(1.52);
    r0.timeline = timeline(None);
    r0.log_tail = vec![
        "[rank 0] step 2 loss 1.938".into(),
        "\u{1b}[31mERROR\u{1b}[0m allreduce of bucket 0 failed: Connection closed by peer".into(),
    ];

    let mut r1 = rank(1, 3);
    r1.outcome = OutcomeKind::Signaled;
    r1.signal = Some(Signal::SEGV);
    r1.exit_code = None;
    r1.last_phase = Some("forward".into());
    r1.last_step = Some(3);
    r1.ended_at_s = Some(1.55);
    r1.last_marker_at_s = Some(1.51);
    r1.timeline = timeline(None);
    r1.backtrace = vec![
        frame(
            "0x55d0c1a2b3c4",
            Some("ups_doctor_trainer::crash::on_fatal_signal"),
            Some("crates/trainer/src/crash.rs:88"),
        ),
        frame("0x7f3a9e442520", None, None),
        frame(
            "0x55d0c1a29f10",
            Some("ups_doctor_trainer::faults::segv"),
            Some("crates/trainer/src/faults.rs:41"),
        ),
        frame(
            "0x55d0c1a2a004",
            Some("ups_doctor_trainer::faults::Faults::fire"),
            Some("crates/trainer/src/faults.rs:120"),
        ),
        frame(
            "0x55d0c1a1c777",
            Some("ups_doctor_trainer::train_loop"),
            Some("crates/trainer/src/loop.rs:77"),
        ),
        frame("0x55d0c1a0b001", Some("main"), None),
    ];
    r1.raw_backtrace = r1.backtrace.iter().map(|f| f.addr.clone()).collect();
    r1.log_tail = vec!["[rank 1] step 2 loss 1.941".into(), "Segmentation fault".into()];

    ScenarioResult {
        name: sc.name.clone(),
        file: "scenarios/ddp-segv-forward.json".into(),
        overrides: vec!["train.steps=20".into()],
        scenario: sc,
        outcome: OutcomeKind::Signaled,
        met_expectation: true,
        interrupted: false,
        expectation_mismatches: Vec::new(),
        verdict: Verdict {
            headline: "Rank 1 was killed by SIGSEGV in `forward` at step 3; rank 0 was collateral \
                       (torn down while waiting in `allreduce`)."
                .into(),
            evidence: vec![
                "rank 1's last marker: begin `forward` step 3, 0.04 s before it died".into(),
                "the crash handler's backtrace points into `ups_doctor_trainer::faults::segv`".into(),
                "rank 0 lost its peer in `allreduce` 0.01 s after rank 1 died".into(),
            ],
            likely_cause: Some(
                "an invalid memory access in native code (a custom op, a bad pointer, or a \
                 library built for another ABI)"
                    .into(),
            ),
            next_step: Some(
                "run `ups-doctor bisect scenarios/ddp-segv-forward.json` to find the smallest \
                 configuration that still crashes"
                    .into(),
            ),
            ..Default::default()
        },
        first_failure: Some(1),
        ranks: vec![r0, r1],
        wall_s: 3.85,
        steps_per_s: Some(2.11),
        samples_per_s: Some(67.5),
        memory: None,
        leftovers: Leftovers::default(),
        external: None,
        cgroup: None,
        oom_kills: Vec::new(),
        xids: Vec::new(),
        cgroup_unavailable: None,
        nodes: None,
        gpu: None,
    }
}

/// One rank deadlocks in `backward`; the stack dump shows two threads waiting on each other.
pub fn hung() -> ScenarioResult {
    let expect = Expect { outcome: OutcomeKind::Hung, phase: Some("backward".into()), ..Expect::default() };
    let mut sc = scenario("deadlock-in-backward", Mode::Single, 1, expect);
    sc.limits.hang_after_s = 10.0;

    let mut r0 = rank(0, 7);
    r0.outcome = OutcomeKind::Hung;
    r0.signal = Some(Signal::KILL);
    r0.exit_code = None;
    r0.torn_down_with = Some(Signal::KILL);
    r0.last_phase = Some("backward".into());
    r0.last_step = Some(7);
    r0.hang_detected_after_s = Some(10.0);
    r0.last_marker_at_s = Some(2.41);
    r0.ended_at_s = Some(12.93);
    r0.data_wait_fraction = None;
    r0.timeline.pop();
    r0.timeline.push(span("train", 0.74, None));
    r0.stacks = vec![
        ThreadStack {
            tid: 41000,
            thread: "main".into(),
            frames: vec![
                frame("0x7f3a9e491117", Some("__futex_abstimed_wait_common"), None),
                frame(
                    "0x55d0c1a3a100",
                    Some("std::sys::sync::mutex::futex::Mutex::lock_contended"),
                    Some("library/std/src/sys/sync/mutex/futex.rs:62"),
                ),
                frame(
                    "0x55d0c1a29e00",
                    Some("ups_doctor_trainer::faults::hang"),
                    Some("crates/trainer/src/faults.rs:77"),
                ),
                frame(
                    "0x55d0c1a1c777",
                    Some("ups_doctor_trainer::train_loop"),
                    Some("crates/trainer/src/loop.rs:91"),
                ),
            ],
        },
        ThreadStack {
            tid: 41007,
            thread: "fault-peer".into(),
            frames: vec![
                frame("0x7f3a9e491117", Some("__futex_abstimed_wait_common"), None),
                frame(
                    "0x55d0c1a3a100",
                    Some("std::sys::sync::mutex::futex::Mutex::lock_contended"),
                    Some("library/std/src/sys/sync/mutex/futex.rs:62"),
                ),
                frame(
                    "0x55d0c1a29e80",
                    Some("ups_doctor_trainer::faults::hang::{{closure}}"),
                    Some("crates/trainer/src/faults.rs:84"),
                ),
            ],
        },
    ];
    r0.log_tail = vec!["[rank 0] step 6 loss 1.163".into()];

    ScenarioResult {
        name: sc.name.clone(),
        file: "scenarios/deadlock-in-backward.json".into(),
        overrides: Vec::new(),
        scenario: sc,
        outcome: OutcomeKind::Hung,
        met_expectation: true,
        interrupted: false,
        expectation_mismatches: Vec::new(),
        verdict: Verdict {
            headline: "Rank 0 hung in `backward` at step 7: no marker for 10.0 s.".into(),
            evidence: vec![
                "2 threads are blocked in `Mutex::lock_contended`, each holding the lock the \
                 other waits for"
                    .into(),
            ],
            likely_cause: Some("a lock-order deadlock between two threads".into()),
            next_step: Some(
                "read the two stacks below: the frames under the lock calls show which locks".into(),
            ),
            ..Default::default()
        },
        first_failure: Some(0),
        ranks: vec![r0],
        wall_s: 13.02,
        steps_per_s: Some(3.18),
        samples_per_s: Some(50.9),
        memory: None,
        leftovers: Leftovers::default(),
        external: None,
        cgroup: None,
        oom_kills: Vec::new(),
        xids: Vec::new(),
        cgroup_unavailable: None,
        nodes: None,
        gpu: None,
    }
}

/// A rank exits with status 0 before training ends: looks like success, is not.
pub fn false_success() -> ScenarioResult {
    let mut sc = scenario("ddp-silent-exit", Mode::Ddp, 2, Expect::default());
    sc.description = "Should pass: checks that DDP on two CPU ranks trains | and that's all.".into();

    let mut r0 = rank(0, 10);
    r0.outcome = OutcomeKind::Exited;
    r0.exit_code = Some(1);
    r0.last_phase = Some("allreduce".into());
    r0.last_step = Some(10);
    r0.error = Some(format!(
        "peer lost: rank 1 closed the connection during allreduce of bucket 0\n{}",
        "while waiting for 1.2 MB from [127.0.0.1]:29517 ".repeat(4)
    ));
    r0.ended_at_s = Some(2.33);
    r0.last_marker_at_s = Some(2.30);

    let mut r1 = rank(1, 10);
    r1.outcome = OutcomeKind::FalseSuccess;
    r1.exit_code = Some(0);
    r1.last_phase = Some("optimizer".into());
    r1.last_step = Some(9);
    r1.ended_at_s = Some(2.29);
    r1.last_marker_at_s = Some(2.28);
    r1.bad_markers = 2;
    r1.log_tail = Vec::new();

    ScenarioResult {
        name: sc.name.clone(),
        file: "scenarios/ddp-silent-exit.json".into(),
        overrides: vec!["data.shm_size=\"64m\"".into()],
        scenario: sc,
        outcome: OutcomeKind::FalseSuccess,
        met_expectation: false,
        interrupted: false,
        expectation_mismatches: vec!["outcome: expected `passed`, got `false_success`".into()],
        verdict: Verdict {
            headline: "Rank 1 exited with status 0 at step 9 of 60 without finishing training \
                       (a false success)."
                .into(),
            evidence: vec![
                "rank 1 sent no `done` marker".into(),
                "rank 0 then failed in `allreduce`: its peer was gone".into(),
            ],
            likely_cause: Some(
                "an exception caught and turned into a clean exit (`sys.exit(0)` in a wrapper, \
                 `os._exit(0)` in a signal handler)"
                    .into(),
            ),
            next_step: None,
            ..Default::default()
        },
        first_failure: Some(1),
        ranks: vec![r0, r1],
        wall_s: 2.41,
        steps_per_s: None,
        samples_per_s: None,
        memory: None,
        leftovers: Leftovers::default(),
        external: None,
        cgroup: None,
        oom_kills: Vec::new(),
        xids: Vec::new(),
        cgroup_unavailable: None,
        nodes: None,
        gpu: None,
    }
}

/// SIGABRT whose symbolisation failed: only raw addresses reached the harness.
pub fn abort_raw_only() -> ScenarioResult {
    let expect =
        Expect { outcome: OutcomeKind::Signaled, signal: Some("SIGABRT".into()), ..Expect::default() };
    let sc = scenario("abort-in-optimizer", Mode::Single, 1, expect);
    let mut r0 = rank(0, 4);
    r0.outcome = OutcomeKind::Signaled;
    r0.signal = Some(Signal::ABRT);
    r0.exit_code = None;
    r0.last_phase = Some("optimizer".into());
    r0.last_step = Some(4);
    r0.raw_backtrace = vec!["0x7f3a9e44b9fc".into(), "0x7f3a9e3f7476".into(), "0x55d0c1a29d31".into()];
    r0.losses.truncate(1);
    r0.timeline = Vec::new();
    r0.log_tail = vec!["terminate called after throwing an instance of 'c10::Error'".into()];
    ScenarioResult {
        name: sc.name.clone(),
        file: "scenarios/abort-in-optimizer.json".into(),
        overrides: Vec::new(),
        scenario: sc,
        outcome: OutcomeKind::Signaled,
        met_expectation: true,
        interrupted: false,
        expectation_mismatches: Vec::new(),
        verdict: Verdict {
            headline: "Rank 0 was killed by SIGABRT in `optimizer` at step 4.".into(),
            evidence: Vec::new(),
            likely_cause: None,
            next_step: None,
            ..Default::default()
        },
        first_failure: Some(0),
        ranks: vec![r0],
        wall_s: 1.2,
        steps_per_s: Some(3.4),
        samples_per_s: Some(54.4),
        memory: None,
        leftovers: Leftovers::default(),
        external: None,
        cgroup: None,
        oom_kills: Vec::new(),
        xids: Vec::new(),
        cgroup_unavailable: None,
        nodes: None,
        gpu: None,
    }
}

/// Two workers in a 64 MB `/dev/shm`: rank 0 dies of SIGBUS with `/dev/shm` full, its workers
/// each held a private copy of the dataset, one outlived it, and a segment was left behind. The
/// verdict is the harness's own, so its wording is snapshot-tested here.
pub fn shm_bus_error() -> ScenarioResult {
    let expect =
        Expect { outcome: OutcomeKind::Signaled, signal: Some("SIGBUS".into()), ..Expect::default() };
    let mut sc = scenario("shm-64m-bus-error", Mode::Single, 1, expect);
    sc.data.shm_size = Some("64m".into());
    sc.data.workers = 2;
    sc.inject = vec![Fault {
        fault: FaultKind::LeakShm,
        phase: "forward".into(),
        step: 2,
        rank: None,
        when: Default::default(),
        probability: 1.0,
        size: Some("96m".into()),
    }];
    let mut r0 = rank(0, 2);
    r0.outcome = OutcomeKind::Signaled;
    r0.signal = Some(Signal::BUS);
    r0.exit_code = None;
    r0.last_phase = Some("forward".into());
    r0.last_step = Some(2);
    r0.ended_at_s = Some(2.02);
    r0.last_marker_at_s = Some(1.98);
    r0.losses.truncate(2);
    r0.timeline.pop();
    r0.timeline.push(span("train", 0.74, None));
    r0.log_tail = vec!["ups-doctor: injecting fault `LeakShm` at forward step 2".into(), "Bus error".into()];
    let ranks = vec![r0];
    let memory = MemoryReport {
        interval_s: 0.25,
        samples: 8,
        processes: vec![
            process(0, ProcessRole::Rank, None, 41000, 420, 302, 280),
            process(0, ProcessRole::Worker, Some(0), 41003, 160, 131, 125),
            process(0, ProcessRole::Worker, Some(1), 41004, 158, 130, 124),
        ],
        series: series(&[(0.25, &[40], 0), (0.75, &[420], 2), (1.25, &[560], 20), (1.75, &[563], 64)]),
        shm: ShmUsage {
            private: true,
            total_bytes: Some(64 * MIB),
            peak_used_bytes: Some(64 * MIB),
            peak_ours_bytes: 64 * MIB,
            at_rank_end: vec![ShmAt { rank: 0, t_s: 2.02, used_bytes: 64 * MIB, total_bytes: 64 * MIB }],
        },
        datasets: vec![DatasetSharing {
            rank: 0,
            bytes: 120 * MIB,
            cache: "memory".into(),
            workers: 2,
            private_copies: 2,
            duplicated_bytes: 240 * MIB,
            shared_bytes: 0,
            worker_peak_uss_bytes: vec![125 * MIB, 124 * MIB],
            judged: true,
        }],
    };
    let leftovers = Leftovers {
        shm: vec![
            LeftoverSegment {
                name: "ups-doctor-41000-0-1f54b1f9-leak-0".into(),
                size_bytes: 96 * MIB,
                allocated_bytes: 64 * MIB,
                ours: true,
                earlier_run: false,
                removed: true,
                error: None,
            },
            LeftoverSegment {
                name: "torch_41003_2_1".into(),
                size_bytes: MIB,
                allocated_bytes: MIB,
                ours: false,
                earlier_run: false,
                removed: true,
                error: None,
            },
        ],
        processes: vec![LeftoverProcess {
            pid: 41004,
            command: "ups-doctor".into(),
            rank: Some(0),
            worker: Some(1),
            killed: true,
            earlier_run: false,
        }],
    };
    let (outcome, first_failure, v) = judged(&sc, &ranks, 2.1, Some(&memory), &leftovers);
    ScenarioResult {
        name: sc.name.clone(),
        file: "scenarios/shm-64m-bus-error.json".into(),
        overrides: Vec::new(),
        scenario: sc,
        outcome,
        met_expectation: true,
        interrupted: false,
        expectation_mismatches: Vec::new(),
        verdict: v,
        first_failure,
        ranks,
        wall_s: 2.1,
        steps_per_s: Some(1.6),
        samples_per_s: Some(25.6),
        memory: Some(memory),
        leftovers,
        external: None,
        cgroup: None,
        oom_kills: Vec::new(),
        xids: Vec::new(),
        cgroup_unavailable: None,
        nodes: None,
        gpu: None,
    }
}

/// A passing run that waits for data most of each step; verdict from the harness.
pub fn input_bound() -> ScenarioResult {
    let mut s = passing();
    s.name = "input-bound".into();
    s.scenario.name = s.name.clone();
    s.ranks[0].data_wait_fraction = Some(0.78);
    let (outcome, _, v) = judged(&s.scenario, &s.ranks, s.wall_s, s.memory.as_ref(), &s.leftovers);
    s.outcome = outcome;
    s.verdict = v;
    s
}

/// The judge's verdict on fixture ranks, as a run would have it.
fn judged(
    sc: &Scenario,
    ranks: &[RankResult],
    wall_s: f64,
    memory: Option<&MemoryReport>,
    leftovers: &Leftovers,
) -> (OutcomeKind, Option<u32>, Verdict) {
    let j = crate::diagnose::judge(&crate::diagnose::Observed {
        scenario: sc,
        ranks,
        wall_s,
        memory,
        leftovers,
        oom_kills: &[],
        xids: &[],
        cgroup: None,
        launcher: None,
    });
    (j.outcome, j.first_failure, j.verdict)
}

/// A run the user interrupted: two scenarios ended, two never started.
pub fn interrupted() -> RunResult {
    let mut run = run(vec![passing(), abort_raw_only()]);
    run.interrupted = true;
    run.not_run = vec!["fsdp-inplace-view".into(), "shm-64m-bus-error".into()];
    run
}

/// A GPU report folded from the recorded-shape NVML samples of one H100 training run (rank 0 is
/// pid 4242).
pub fn gpu_report() -> crate::schema::GpuReport {
    let samples: Vec<crate::harness::GpuSample> =
        serde_json::from_str(include_str!("../harness/observe/fixtures/nvml-h100-training.json")).unwrap();
    let info = vec![crate::probe::nvml::GpuInfo {
        index: 0,
        name: "NVIDIA H100 80GB HBM3".into(),
        uuid: "GPU-0".into(),
        memory_total_bytes: 80 << 30,
    }];
    let mut rec = crate::harness::GpuRecorder::new(0.2, info, Vec::new());
    for s in samples {
        rec.record(s);
    }
    rec.finish(&[&crate::harness::RankState::default()], &[Some(4242)])
}

/// The GPU report of a real run: NVML readings recorded on an H200 while `single-cuda` trained
/// (rank 0 is pid 789; scripts/gpu-check.sh, 2026-11-27).
pub fn h200_gpu_report() -> crate::schema::GpuReport {
    use crate::harness::gpu_h200;
    gpu_h200::h200_recorder(gpu_h200::recording(), Vec::new())
        .finish(&[&crate::harness::RankState::default()], &[Some(789)])
}
