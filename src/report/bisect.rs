//! `bisect.md`: the verdict first (the minimal failing scenario, ready to run, and the boundary),
//! then every probe. Rendered from [`BisectRecord`], the content of `bisect.json`.

use crate::bisect::{BisectRecord, ProbeVerdict};

use super::markup::{Align, code, fence, table, text};
use super::text::{NONE, percent, plural, secs, shell_line};

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
    out.push(format!("**The failure ({}) still happens with {fails_with}.**", text(&sig.describe())));
    let boundary: Vec<String> = r.boundary_detail.iter().filter(|b| b.passes).map(|b| code(&b.cut)).collect();
    out.push(if boundary.is_empty() {
        "No single further cut makes it pass: every remaining component is at its minimum.".to_string()
    } else {
        format!(
            "It passes once any one of these is applied: {}. Those components are where the failure starts.",
            boundary.join(", ")
        )
    });
    let confidence = if r.is_flaky {
        format!(
            "The original fails in {} of runs (flaky): every \"passes\" above held for enough runs to be believed at {} confidence.",
            percent(r.flaky),
            percent(r.confidence)
        )
    } else {
        format!(
            "The failure reproduced in every confirming run; \"passes\" judgements are held at {} confidence.",
            percent(r.confidence)
        )
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
    if !r.different_failures.is_empty() {
        let rows: Vec<Vec<String>> = r
            .different_failures
            .iter()
            .map(|d| {
                vec![
                    d.delta.iter().map(|x| code(x)).collect::<Vec<_>>().join(", "),
                    text(&d.signature.describe()),
                ]
            })
            .collect();
        out.push(format!(
            "These cuts made it fail **differently**, so they were not taken (a different failure is another bug, not a reproduction):\n\n{}",
            table(&["cut", "failure"], &[Align::Left, Align::Left], &rows)
        ));
    }
    out.push(format!(
        "## Minimal failing scenario\n\nSaved as `minimal.json` next to this report; `ups-doctor run minimal.json` reproduces it (its `expect` is the failure).\n\n{}",
        fence("json", &serde_json::to_string_pretty(&r.minimal).unwrap_or_default())
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
                p.observation.as_ref().map_or("passed".to_string(), |s| text(&s.describe())),
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
