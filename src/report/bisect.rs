//! `bisect.md`: the verdict first (the minimal failing scenario, ready to run, and the boundary),
//! then every probe. Rendered from [`BisectRecord`], the content of `bisect.json`.

use crate::bisect::{BisectRecord, ProbeVerdict};

use super::markup::{Align, code, fence, table, text};
use super::text::{NONE, percent, plural, secs, shell_line};

/// Renders `record` into `dir/bisect.md`, masked as every output is; its path.
pub fn write_bisect_md(
    dir: &std::path::Path,
    record: &BisectRecord,
) -> Result<std::path::PathBuf, super::ReportError> {
    let report = dir.join("bisect.md");
    let text = render_bisect(record) + "\n";
    if let Ok(doc) = serde_json::to_value(record) {
        crate::secrets::learn(&doc);
    }
    super::write_text(&report, &text)?;
    Ok(report)
}

/// The markdown report of a bisect.
pub fn render_bisect(r: &BisectRecord) -> String {
    let mut out: Vec<String> = vec![format!("# ups-doctor bisect: {}", text(&r.original.name))];
    let Some(sig) = &r.signature else {
        out.push(format!(
            "**The scenario did not fail** in {} while confirming, so there is nothing to cut down. \
             If the failure is rare, confirm with more runs (`--confirm N`).",
            plural(r.runs, "run")
        ));
        out.push(footer(r));
        return out.join("\n\n") + "\n";
    };
    let fails_with = if r.minimal_delta.is_empty() {
        "the original configuration (nothing could be cut)".to_string()
    } else {
        r.minimal_delta.iter().map(|d| code(d)).collect::<Vec<_>>().join(", ")
    };
    out.push(format!("**The failure ({}) still happens with {fails_with}.**", sig.describe()));
    let boundary: Vec<String> = r.boundary_detail.iter().filter(|b| b.passes).map(|b| code(&b.cut)).collect();
    out.push(if boundary.is_empty() {
        "No remaining component can be cut further: each is at its minimum, or cutting it would make the \
         scenario invalid (for example, an injected fault that names rank 1 needs two ranks)."
            .to_string()
    } else {
        format!(
            "It passes once any one of these is applied: {}. Those components are where the failure starts.",
            boundary.join(", ")
        )
    });
    let confidence = if r.is_flaky {
        format!(
            "The original fails in {} of runs (flaky): each \"passes\" was held for enough runs that the boundary's claims hold together at {} confidence.",
            percent(r.flaky),
            percent(r.confidence)
        )
    } else {
        "The failure reproduced in every confirming run, so it is treated as deterministic: one passing run decides a cut."
            .to_string()
    };
    out.push(format!("{confidence} {} of a budget of {}.", plural(r.runs, "real run"), r.budget));
    if r.budget_exhausted {
        let unknown = if r.unknown.is_empty() {
            String::new()
        } else {
            format!(" Still undecided: {}.", r.unknown.iter().map(|u| code(u)).collect::<Vec<_>>().join(", "))
        };
        out.push(format!(
            "> [!WARNING]\n> The budget ran out before the search finished: the scenario below fails, but may not be minimal.{unknown} Re-run with a larger `--budget`: cached runs are reused."
        ));
    }
    out.extend(different_failures(r));
    out.extend(r.minimal_command.as_ref().map(command_section));
    out.push(format!(
        "## Minimal failing scenario\n\nSaved as `minimal.json` next to this report; `ups-doctor run minimal.json` reproduces it (its `expect` is the failure).\n\n{}",
        fence("json", &masked_json(&r.minimal.file_json()))
    ));
    let boundary_rows: Vec<Vec<String>> = r
        .boundary_detail
        .iter()
        .map(|b| {
            vec![
                code(&b.component),
                code(&b.cut),
                if b.passes { "passes".into() } else { "still fails".into() },
                b.runs.to_string(),
            ]
        })
        .collect();
    if !boundary_rows.is_empty() {
        out.push(format!(
            "## Boundary\n\nEach remaining component, cut one step further on its own:\n\n{}",
            table(
                &["component", "cut", "result", "runs"],
                &[Align::Left, Align::Left, Align::Left, Align::Right],
                &boundary_rows
            )
        ));
    }
    let rows: Vec<Vec<String>> = r
        .probes
        .iter()
        .enumerate()
        .map(|(i, p)| {
            vec![
                (i + 1).to_string(),
                p.stage.clone(),
                if p.delta.is_empty() {
                    "(original)".into()
                } else {
                    p.delta.iter().map(|d| code(d)).collect::<Vec<_>>().join(", ")
                },
                p.observation.as_ref().map_or("passed".to_string(), |s| s.describe()),
                match p.verdict {
                    ProbeVerdict::Same => "same failure".into(),
                    ProbeVerdict::Passed => "passed".into(),
                    ProbeVerdict::Different => "**different**".into(),
                },
                if p.cached { "cached".into() } else { p.wall_s.map_or(NONE.into(), secs) },
            ]
        })
        .collect();
    out.push(format!(
        "## Probes\n\nEvery run, in order (each real run's logs are under `probes/`):\n\n{}",
        table(
            &["#", "stage", "configuration delta", "outcome", "signature", "wall"],
            &[Align::Right, Align::Left, Align::Left, Align::Left, Align::Left, Align::Right],
            &rows
        )
    ));
    out.push(footer(r));
    out.join("\n\n") + "\n"
}

/// Cuts that made the failure different, when there were any.
fn different_failures(r: &BisectRecord) -> Option<String> {
    if r.different_failures.is_empty() {
        return None;
    }
    let rows: Vec<Vec<String>> = r
        .different_failures
        .iter()
        .map(|d| vec![d.delta.iter().map(|x| code(x)).collect::<Vec<_>>().join(", "), d.signature.describe()])
        .collect();
    Some(format!(
        "These cuts made it fail **differently**, so they were not taken (a different failure is another bug, not a reproduction):\n\n{}",
        table(&["cut", "failure"], &[Align::Left, Align::Left], &rows)
    ))
}

/// A command's bisect: the minimal failing command line to paste, and the flags that make it pass.
fn command_section(minimal: &crate::bisect::MinimalCommand) -> String {
    let passes = if minimal.passes_once.is_empty() {
        String::new()
    } else {
        format!("\n\nIt passes once {}.", minimal.passes_once.join(", or once "))
    };
    let paste = match minimal.nodes {
        Some(n) => format!(
            "Paste it into a shell on each of its {n} nodes to see the failure again (on one machine, \
             `ups-doctor run --set launch.nodes={n} -- …` plays them all, as this bisect did)"
        ),
        None => "Paste it into a shell to see the failure again".to_string(),
    };
    format!("## Minimal failing command\n\n{paste}:\n\n{}{passes}", fence("sh", &minimal.line))
}

fn footer(r: &BisectRecord) -> String {
    format!(
        "<sub>ups-doctor {} · {} · {} · {} · libtorch {}</sub>",
        text(&r.tool_version),
        text(&r.started_at),
        code(&shell_line(&r.command)),
        text(&r.environment.os),
        text(&r.environment.libtorch_version)
    )
}

/// A JSON document as it may be shown: every secret value it holds (a flag's value sits on the
/// line after the flag, out of reach of a line-by-line mask) masked where it stands, the layout
/// kept.
fn masked_json(text: &str) -> String {
    let known = serde_json::from_str::<serde_json::Value>(text)
        .map(|v| crate::secrets::secret_values(&v))
        .unwrap_or_default();
    crate::secrets::mask_text_knowing(text, &known).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bisect::{BoundaryEntry, DifferentFailure, ProbeRow, Signature};
    use crate::scenario::{OutcomeKind, Scenario};

    fn segv() -> Signature {
        Signature {
            outcome: OutcomeKind::Signaled,
            signal: Some(crate::schema::Signal::SEGV),
            exit_code: None,
            role: crate::schema::ProcessRole::Rank,
            phase: Some("model.build/conditioner".into()),
            pattern: None,
            died_first: None,
            exception: None,
            key: None,
        }
    }

    fn record() -> BisectRecord {
        let original = Scenario { name: "segv-needs-conditioning".into(), ..Scenario::default() };
        let mut minimal = original.clone();
        minimal.model.attention = false;
        minimal.model.depths = vec![1];
        let probe = |stage: &str, delta: &[&str], observation: Option<Signature>, verdict, cached| ProbeRow {
            stage: stage.into(),
            delta: delta.iter().map(|d| d.to_string()).collect(),
            observation,
            verdict,
            cached,
            wall_s: (!cached).then_some(0.5),
            dir: (!cached).then(|| "probes/001".into()),
        };
        BisectRecord {
            tool_version: "0.1.0".into(),
            started_at: "2026-11-20T12:00:00Z".into(),
            command: vec!["ups-doctor".into(), "bisect".into(), "scenarios/x.json".into()],
            file: "scenarios/x.json".into(),
            overrides: Vec::new(),
            original,
            components: vec!["model.attention".into(), "model.conditioning".into(), "model.depths[0]".into()],
            signature: Some(segv()),
            flaky: 0.5,
            is_flaky: true,
            confidence: 0.97,
            runs: 4,
            budget: 60,
            budget_exhausted: false,
            interrupted: false,
            unknown: Vec::new(),
            minimal_command: None,
            minimal,
            minimal_delta: vec!["model.attention=false".into(), "model.depths=[1]".into()],
            boundary: vec!["model.conditioning".into()],
            boundary_detail: vec![BoundaryEntry {
                component: "model.conditioning".into(),
                cut: "model.conditioning=false".into(),
                passes: true,
                runs: 6,
            }],
            different_failures: vec![DifferentFailure {
                delta: vec!["data.samples=1".into()],
                signature: Signature {
                    outcome: OutcomeKind::Exited,
                    signal: None,
                    exit_code: Some(1),
                    role: crate::schema::ProcessRole::Rank,
                    phase: Some("forward".into()),
                    pattern: None,
                    died_first: None,
                    exception: None,
                    key: None,
                },
            }],
            probes: vec![
                probe("confirm", &[], Some(segv()), ProbeVerdict::Same, false),
                probe("ddmin", &["model.conditioning=false"], None, ProbeVerdict::Passed, true),
            ],
            environment: crate::probe::env::EnvSummary {
                tool_version: "0.1.0".into(),
                hostname: "host".into(),
                os: "Debian GNU/Linux 12".into(),
                kernel: "6.1".into(),
                arch: "x86_64".into(),
                cpus: 2,
                memory_total_bytes: None,
                libtorch_version: "2.11.0+cu130".into(),
                libtorch_lib: "/lib".into(),
                shm_total_bytes: None,
                shm_used_bytes: None,
                open_files_limit: None,
                locked_memory_limit: None,
                cgroup_memory_max: None,
                cgroup_cpu_max: None,
                container: None,
                variables: Vec::new(),
                python: None,
                gpu: None,
            },
        }
    }

    #[test]
    fn flaky_bisect_with_a_different_failure() {
        insta::assert_snapshot!(render_bisect(&record()));
    }

    #[test]
    fn a_commands_bisect_leads_with_the_command_to_paste_and_the_flags_that_make_it_pass() {
        let mut r = record();
        r.minimal_command = Some(crate::bisect::MinimalCommand {
            line: "KERNEL=fast python t.py --workers 2".into(),
            passes_once: vec!["`--workers 1`".into(), "`KERNEL` is unset".into()],
            nodes: None,
        });
        let text = render_bisect(&r);
        let section = "## Minimal failing command\n\nPaste it into a shell to see the failure again:\n\n```sh\n\
                       KERNEL=fast python t.py --workers 2\n```\n\nIt passes once `--workers 1`, or once `KERNEL` is \
                       unset.";
        assert!(text.contains(section), "{text}");
        assert!(text.find(section) < text.find("## Minimal failing scenario"), "{text}");
    }

    #[test]
    fn a_scenario_that_did_not_fail() {
        let mut r = record();
        r.signature = None;
        insta::assert_snapshot!(render_bisect(&r));
    }
}
