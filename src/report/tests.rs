//! Snapshots of every rendered output, and the run-folder round trip.

use std::fs;

use super::fixtures::{self, run};
use super::*;

#[test]
fn markdown_of_a_passing_single_rank_run() {
    insta::assert_snapshot!(render_markdown(&run(vec![fixtures::passing()])));
}

#[test]
fn markdown_of_a_segfault_with_backtrace() {
    insta::assert_snapshot!(render_markdown(&run(vec![fixtures::segv()])));
}

#[test]
fn markdown_of_a_hang_with_thread_stacks() {
    insta::assert_snapshot!(render_markdown(&run(vec![fixtures::hung()])));
}

#[test]
fn markdown_of_a_false_success_that_misses_its_expectation() {
    insta::assert_snapshot!(render_markdown(&run(vec![fixtures::false_success()])));
}

#[test]
fn markdown_of_a_bus_error_in_a_full_dev_shm_with_leftovers() {
    insta::assert_snapshot!(render_markdown(&run(vec![fixtures::shm_bus_error()])));
}

#[test]
fn markdown_of_an_input_bound_run() {
    let md = render_markdown(&run(vec![fixtures::input_bound()]));
    let headline = md.lines().find(|l| l.starts_with("**Passed")).expect("the headline");
    assert!(headline.ends_with("Input-bound: 78% of step time waiting for data.**"), "{headline}");
    assert!(
        md.contains("**Next step:** The ranks wait for batches more than they compute: try more workers"),
        "{md}"
    );
    assert!(md.contains("208.6 samples/s"), "{md}");
}

/// Each rank's time in collectives over the whole run is on the speed line where the observer
/// timed it (the accuracy matrix's Accelerate straggler: rank 0 waited 10.9 s for rank 1); over
/// 8 ranks, the least, the median and the most; not where no rank timed any.
#[test]
fn the_speed_line_says_how_long_each_rank_waited_in_collectives() {
    let with = |times: &[f64]| {
        let mut s = fixtures::passing();
        s.ranks = times
            .iter()
            .enumerate()
            .map(|(i, ms)| {
                let mut r = fixtures::rank(i as u32, 10);
                r.observed =
                    Some(crate::schema::ObservedProgram { collective_total_ms: *ms, ..Default::default() });
                r
            })
            .collect();
        let md = render_markdown(&run(vec![s]));
        md.lines().find(|l| l.starts_with("**Speed:**")).expect("a speed line").to_string()
    };
    let line = with(&[10_900.0, 30.0]);
    assert!(line.ends_with(" · in collectives over the whole run: rank 0 10.9 s, rank 1 0.03 s"), "{line}");
    let many: Vec<f64> = (0..16).map(|r| if r == 5 { 9_000.0 } else { 100.0 + r as f64 }).collect();
    let line = with(&many);
    assert!(
        line.ends_with(
            " · in collectives over the whole run: least 0.10 s (rank 0), median 0.11 s, most 9.0 s (rank 5)"
        ),
        "{line}"
    );
    assert!(!with(&[0.0, 0.0]).contains("collectives"));
}

#[test]
fn markdown_of_an_interrupted_run() {
    insta::assert_snapshot!(render_markdown(&fixtures::interrupted()));
}

/// A scenario cut short by Ctrl-C (kept, marked interrupted), a rank whose marker claimed a
/// foreign pid, a log a full disk cut, and a run ups-doctor could not finish.
#[test]
fn markdown_of_an_interrupted_scenario_a_foreign_pid_a_cut_log_and_a_stop() {
    let mut run = fixtures::interrupted();
    let s = &mut run.scenarios[0];
    s.interrupted = true;
    s.met_expectation = false;
    s.verdict.evidence.insert(0, format!("Before the interrupt: {}", s.verdict.headline));
    s.verdict.headline = "Interrupted by the user after 12.3 s, before the scenario ended on its own".into();
    s.ranks[0].foreign_pids = vec![4242];
    s.ranks[0].bad_markers += 1;
    s.ranks[0].log_errors =
        vec!["could not write `out/1-x/rank0.stdout.log`: No space left on device (os error 28)".into()];
    run.stopped_by = Some("failed to prepare `out/3-y`: No space left on device (os error 28)".into());
    // The summary (the stop, the interrupted scenario) and the scenario's own report (its notes).
    insta::assert_snapshot!(render_markdown(&run) + "\n=====\n" + &render_scenario_markdown(&run, 0));
}

#[test]
fn matrix_of_every_kind_of_outcome() {
    let all = run(vec![
        fixtures::passing(),
        fixtures::segv(),
        fixtures::hung(),
        fixtures::false_success(),
        fixtures::abort_raw_only(),
        fixtures::shm_bus_error(),
    ]);
    insta::assert_snapshot!(render_matrix(&all, false));
}

#[test]
fn matrix_of_an_interrupted_run_lists_what_did_not_run() {
    insta::assert_snapshot!(render_matrix(&fixtures::interrupted(), false));
}

#[test]
fn matrix_colours_only_when_asked() {
    let all = run(vec![fixtures::passing(), fixtures::false_success()]);
    assert!(!render_matrix(&all, false).contains('\u{1b}'));
    let coloured = render_matrix(&all, true);
    let green = "\u{1b}[38;5;10m passed ";
    let red = "\u{1b}[38;5;9m false success ";
    assert!(coloured.contains(green) && coloured.contains(red), "{coloured:?}");
    assert!(coloured.contains("\u{1b}[38;5;9m NOT MET "), "{coloured:?}");
    assert!(!coloured.contains("\u{1b}[38;5;9m met "), "{coloured:?}");
}

#[test]
fn pipes_and_newlines_in_cells_do_not_break_the_rank_table() {
    let mut s = fixtures::passing();
    s.ranks[0].error = Some("expected a|b\ngot c".into());
    let md = render_markdown(&run(vec![s]));
    let row = md.lines().find(|l| l.starts_with("| 0 |")).expect("rank 0's row");
    assert!(row.contains(r"`expected a\|b ⏎ got c`"), "{row}");
    let header = md.lines().find(|l| l.starts_with("| rank |")).unwrap();
    let unescaped = |l: &str| l.replace(r"\|", "").matches('|').count();
    assert_eq!(unescaped(row), unescaped(header));
}

#[test]
fn fences_outgrow_backticks_in_log_lines() {
    let mut s = fixtures::passing();
    s.ranks[0].log_tail = vec!["```".into(), "a ```` b".into()];
    let md = render_markdown(&run(vec![s]));
    assert!(md.contains("`````text\n```\na ```` b\n`````"), "{md}");
}

#[test]
fn write_run_then_rerender_gives_the_same_report() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("runs/2025-06-02T09-14-03");
    let original = fixtures::interrupted();
    let report = write_run(&folder, &original).unwrap();
    assert_eq!(report, folder.join(REPORT_FILE));
    let written = fs::read_to_string(&report).unwrap();
    assert_eq!(written, render_markdown(&original));

    let saved: crate::schema::RunResult =
        serde_json::from_str(&fs::read_to_string(folder.join(RESULT_FILE)).unwrap()).unwrap();
    assert_eq!(saved.scenarios.len(), original.scenarios.len());
    assert_eq!(saved.not_run, original.not_run);

    fs::remove_file(&report).unwrap();
    assert_eq!(rerender(&folder).unwrap(), report);
    assert_eq!(fs::read_to_string(&report).unwrap(), written);
    let leftovers: Vec<_> = fs::read_dir(&folder)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn write_run_survives_a_nan_loss() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = fixtures::passing();
    s.ranks[0].final_loss = Some(f64::NAN);
    s.ranks[0].losses.push((60, f64::NAN));
    let report = write_run(dir.path(), &run(vec![s])).unwrap();
    assert!(fs::read_to_string(report).unwrap().contains("# ups-doctor report"));
}

#[test]
fn rerender_of_a_missing_folder_says_what_to_pass() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-run");
    let err = rerender(&missing).unwrap_err();
    assert!(matches!(err, ReportError::NotFound { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "`{}` not found: pass the folder of a run (it holds result.json and report.md)",
            missing.display()
        )
    );

    let err = rerender(dir.path()).unwrap_err();
    assert!(
        err.to_string().starts_with(&format!("`{}` not found", dir.path().join("result.json").display()))
    );
}

#[test]
fn rerender_of_a_file_asks_for_its_folder() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(RESULT_FILE);
    fs::write(&file, "{}").unwrap();
    let err = rerender(&file).unwrap_err();
    assert!(matches!(err, ReportError::NotAFolder { .. }), "{err:?}");
    assert!(err.to_string().contains(&format!("pass the folder that holds it (`{}`)", dir.path().display())));
}

#[test]
fn rerender_of_invalid_json_names_file_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(RESULT_FILE);
    fs::write(&path, "{\n  \"tool_version\": \"0.1.0\",\n  \"started_at\": ,\n}\n").unwrap();
    let err = rerender(dir.path()).unwrap_err();
    let ReportError::InvalidJson { line, column, .. } = &err else { panic!("{err:?}") };
    assert_eq!((*line, *column), (3, 17));
    let message = err.to_string();
    assert!(message.starts_with(&format!("`{}:3:17`: not a valid run result", path.display())), "{message}");
    assert!(message.contains("expected value"), "{message}");
    assert!(message.contains("hint: the file is not complete JSON"), "{message}");
}

#[test]
fn rerender_of_a_wrong_shape_names_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let mut value = serde_json::to_value(run(vec![fixtures::passing()])).unwrap();
    value["scenarios"][0]["outcome"] = "segfault".into();
    fs::write(dir.path().join(RESULT_FILE), serde_json::to_string_pretty(&value).unwrap()).unwrap();
    let message = rerender(dir.path()).unwrap_err().to_string();
    assert!(message.contains("at `scenarios[0].outcome`: unknown variant `segfault`"), "{message}");
    assert!(!message.contains(" at line "), "{message}");
}

#[test]
fn a_summary_of_many_failures_fits_one_comment() {
    let many = run((0..300).map(|_| fixtures::segv()).collect());
    let md = render_markdown(&many);
    assert!(md.chars().count() <= 65_536, "{} characters", md.chars().count());
    assert!(md.contains("are left out to fit one GitHub comment"), "{md}");
    assert!(md.starts_with("# ups-doctor report\n"));
    // The full report of each scenario is whole, in its own file.
    let full = super::render_scenario_markdown(&many, 299);
    assert!(full.contains("### Backtrace of rank 1"), "{full}");
}

#[test]
fn a_single_scenario_with_a_huge_log_fits_one_comment_and_says_what_is_left_out() {
    let mut s = fixtures::segv();
    s.ranks[0].log_tail = (0..3000).map(|i| format!("line {i}: {}", "x".repeat(60))).collect();
    let one = run(vec![s]);
    let md = render_markdown(&one);
    assert!(md.chars().count() <= 65_536, "{} characters", md.chars().count());
    assert!(md.contains("Left out here to fit one GitHub comment"), "{md}");
    assert!(md.contains("### Backtrace of rank 1"), "the evidence stays: {md}");
    assert!(!super::is_summary(&one));
}

#[test]
fn env_text_lists_every_fact_then_the_variables() {
    insta::assert_snapshot!(render_env_text(&fixtures::env()));
}

#[test]
fn env_as_markdown_is_the_reports_environment_section() {
    let md = super::render_env_markdown(&fixtures::env());
    assert!(md.starts_with("## Environment\n"));
    assert!(render_markdown(&fixtures::run(Vec::new())).contains(md.trim_end()));
}

#[test]
fn env_text_says_when_no_variable_is_set() {
    let mut env = fixtures::env();
    env.variables.clear();
    env.container = None;
    env.shm_total_bytes = None;
    let text = render_env_text(&env);
    assert!(text.contains("container                  none detected\n"), "{text}");
    assert!(text.contains("/dev/shm                   not mounted\n"), "{text}");
    assert!(text.ends_with("variables: none of NCCL_*, TORCH_*, PYTORCH_*, CUDA_*, OMP_*, MKL_*, GLOO_*, UPS_DOCTOR_* is set\n"), "{text}");
}

#[test]
fn gpu_section_matrix_column_and_the_unavailable_line() {
    let mut on_gpu = fixtures::passing();
    on_gpu.name = "single-cuda".into();
    on_gpu.scenario.name = "single-cuda".into();
    on_gpu.file = "scenarios/gpu/single-cuda.json".into();
    on_gpu.scenario.launch.device = crate::scenario::Device::Cuda;
    on_gpu.ranks[0].pid = Some(4242);
    on_gpu.ranks[0].device = Some("cuda:0".into());
    on_gpu.gpu = Some(fixtures::gpu_report());
    let mut on_cpu = fixtures::passing();
    on_cpu.gpu = Some(crate::schema::GpuReport::unavailable(
        "libnvidia-ml.so.1 not found: no NVIDIA driver on this machine (cannot open shared object file: No \
         such file or directory)",
    ));
    let both = run(vec![on_gpu, on_cpu]);
    let md = super::render_scenario_markdown(&both, 1);
    assert!(md.contains(
        "**GPU:** metrics unavailable: libnvidia-ml.so.1 not found: no NVIDIA driver on this machine (cannot \
         open shared object file: No such file or directory). The ranks trained on the CPU."
    ));
    insta::assert_snapshot!("markdown_of_a_gpu_run", super::render_scenario_markdown(&both, 0));
    insta::assert_snapshot!("matrix_with_gpu_utilisation", render_matrix(&both, false));
}

#[test]
fn issue_text_is_the_summary_and_names_the_failed_scenarios_reports_to_attach() {
    let mut passing = fixtures::passing();
    passing.name = "train-cpu".into();
    let both = run(vec![fixtures::segv(), passing]);
    let issue = super::issue_text(&both);
    assert_eq!(issue.paste, render_markdown(&both));
    insta::assert_snapshot!(issue.attach.join("\n"));
}

#[test]
fn matrix_at_80_columns_takes_the_narrow_layout_and_fits() {
    let all = run(vec![
        fixtures::passing(),
        fixtures::segv(),
        fixtures::hung(),
        fixtures::false_success(),
        fixtures::abort_raw_only(),
        fixtures::shm_bus_error(),
    ]);
    let text = render_matrix_fit(&all, false, 80);
    for line in text.lines() {
        assert!(line.chars().count() <= 80, "{} columns: {line}", line.chars().count());
    }
    insta::assert_snapshot!(text);
    // Wide enough, it is the table.
    assert_eq!(render_matrix_fit(&all, false, 200), render_matrix(&all, false));
}

#[test]
fn verdict_lines_at_80_columns_carry_the_key_line_and_the_next_step() {
    let mut s = fixtures::shm_bus_error();
    s.verdict.key_line =
        Some("RuntimeError: DataLoader worker (pid 5567) is killed by signal: Bus error.".into());
    let text = render_verdict_lines(&s, 80);
    for line in text.lines() {
        assert!(line.chars().count() <= 80, "{line}");
    }
    insta::assert_snapshot!(text);
    assert!(text.contains("key line: RuntimeError") && text.contains("next step: "), "{text}");
}
