//! The catalogue against its user document: every pattern listed in `docs/patterns.md` with its
//! id, explanation, next step and reference, and nothing listed that the code does not know.

use super::ALL;

#[test]
fn ids_are_unique_kebab_case_and_every_pattern_has_its_texts() {
    let mut ids: Vec<&str> = ALL.iter().map(|p| p.id).collect();
    for p in ALL {
        assert!(p.id.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'), "{}", p.id);
        assert!(
            !p.title.is_empty()
                && !p.matches.is_empty()
                && !p.explanation.is_empty()
                && !p.next_step.is_empty()
        );
        assert!(p.reference.starts_with("https://"), "{}: {}", p.id, p.reference);
    }
    ids.sort_unstable();
    let n = ids.len();
    ids.dedup();
    assert_eq!(ids.len(), n, "duplicate ids");
}

/// One collapsed line, as the document writes a text.
fn line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What `docs/patterns.md` says about each pattern, generated from the catalogue.
pub fn document() -> String {
    let mut out = String::from(
        "# Failure patterns\n\n\
         <!-- Generated from src/diagnose/catalog/ by `UPS_DOCTOR_WRITE_PATTERNS=1 cargo test --lib \
         patterns_document`; a test fails when the two differ. -->\n\n\
         ups-doctor names one of these patterns in a verdict (`pattern` in `result.json`, \"Pattern\" in the \
         report) only when the run's evidence establishes it; otherwise the verdict says what was seen and \
         what was not. The same judge reads the built-in trainer's runs and your own program's.\n\n",
    );
    for p in ALL {
        out.push_str(&format!("- [`{}`](#{}): {}\n", p.id, p.id, p.title));
    }
    for p in ALL {
        out.push_str(&format!(
            "\n## {id}\n\n**{title}**\n\n- **Matches:** {}\n- **What it means:** {}\n- **Next step:** {}\n- **Reference:** <{}>\n",
            line(p.matches),
            line(p.explanation),
            line(p.next_step),
            p.reference,
            id = p.id,
            title = p.title,
        ));
    }
    out
}

#[test]
fn patterns_document_lists_every_pattern_of_the_catalogue() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/patterns.md");
    let want = document();
    if std::env::var_os("UPS_DOCTOR_WRITE_PATTERNS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/patterns.md differs from the catalogue: rerun with UPS_DOCTOR_WRITE_PATTERNS=1 and review the diff"
    );
}

/// A program's rank (no markers) that exited with status 1 after printing `stderr` at `at_s`.
pub(super) fn failed(rank: u32, at_s: f64, stderr: &str) -> crate::schema::RankResult {
    let mut e = crate::harness::RankEnd { exit: Some(crate::harness::Exit::Code(1)), ..Default::default() };
    e.rank = rank;
    e.pid = Some(1000 + rank);
    e.ended_at_s = Some(at_s);
    e.completed = Some(true);
    e.last_output_at = Some(at_s);
    e.stderr_tail = stderr.lines().map(String::from).collect();
    crate::harness::classify_rank(&e)
}

pub(super) fn judged(ranks: &[crate::schema::RankResult]) -> crate::diagnose::verdict::Judgement {
    judged_with(ranks, &[])
}

/// [`judged`], with the driver's Xids of the run.
pub(super) fn judged_with(
    ranks: &[crate::schema::RankResult],
    xids: &[crate::schema::GpuXid],
) -> crate::diagnose::verdict::Judgement {
    let scenario = crate::scenario::Scenario {
        command: Some(vec!["torchrun".into(), "train.py".into()]),
        ..Default::default()
    };
    let leftovers = crate::schema::Leftovers::default();
    crate::diagnose::verdict::judge(&crate::diagnose::evidence::Observed {
        scenario: &scenario,
        ranks,
        wall_s: 9.0,
        memory: None,
        leftovers: &leftovers,
        oom_kills: &[],
        xids,
        cgroup: None,
        launcher: None,
    })
}

/// The NVIDIA driver's Xid 79 naming rank 1's process (its text as NVIDIA's Xid catalogue shows
/// it, https://docs.nvidia.com/deploy/xid-errors/), after which rank 1 failed with a CUDA error
/// and rank 0 lost its peer: the GPU fault is the verdict. The same Xid of another job's process,
/// or a rank that only prints such a line, names nothing.
#[test]
fn an_xid_naming_a_ranks_process_is_the_verdict_and_one_of_another_process_is_not() {
    let xid = |rank: Option<u32>| crate::schema::GpuXid {
        code: 79,
        pci: "0000:3b:00".into(),
        pid: Some(1001),
        rank,
        at_s: 4.2,
        line: "NVRM: Xid (PCI:0000:3b:00): 79, pid=1001, name=python, GPU has fallen off the bus.".into(),
    };
    let ranks = [
        failed(
            0,
            5.0,
            "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer",
        ),
        failed(1, 4.5, "RuntimeError: CUDA error: unspecified launch failure"),
    ];
    let j = judged_with(&ranks, &[xid(Some(1))]);
    assert_eq!(j.verdict.pattern.as_deref(), Some("gpu-xid"), "{:#?}", j.verdict);
    assert_eq!(j.first_failure, Some(1));
    assert!(
        j.verdict.headline.starts_with(
            "Rank 1's GPU failed: the NVIDIA driver reported Xid 79 (the GPU has fallen off the bus) for its process \
             (pid 1001) at 4.2 s."
        ),
        "{}",
        j.verdict.headline
    );
    assert!(j.verdict.evidence.iter().any(|e| e.contains("kernel log (`/dev/kmsg`) at 4.2 s: `NVRM: Xid")));
    assert_ne!(judged_with(&ranks, &[xid(None)]).verdict.pattern.as_deref(), Some("gpu-xid"));
    let printed = [failed(0, 5.0, ""), failed(1, 4.5, &xid(None).line)];
    assert_ne!(judged(&printed).verdict.pattern.as_deref(), Some("gpu-xid"));
}
