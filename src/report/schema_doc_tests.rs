//! `docs/result-json.md` stays true: every key a result carries is named there.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

use crate::report::fixtures;
use crate::schema::RunResult;

/// Every object key under `value`, except inside `environment` (the `ups-doctor env --json`
/// object) and `scenario` (the scenario file format), which are documented elsewhere.
fn keys(value: &Value, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                out.insert(key.clone());
                if key != "environment" && key != "scenario" {
                    keys(inner, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| keys(v, out)),
        _ => {}
    }
}

/// The words inside the document's backtick spans.
fn documented(doc: &str) -> BTreeSet<String> {
    doc.split('`')
        .skip(1)
        .step_by(2)
        .flat_map(|span| span.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn every_key_of_result_json_is_documented() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/result-json.md")).unwrap();
    let named = documented(&doc);
    let mut seen = BTreeSet::new();
    // The committed examples (real runs of the shipped, the external and the multi-node scenarios), which must
    // also still load, and the report's fixtures (hangs, interrupts, GPU samples, leftovers).
    for example in ["run-shipped-scenarios", "run-external-scenarios", "run-nodes"] {
        let text =
            std::fs::read_to_string(root.join("reports/examples").join(example).join("result.json")).unwrap();
        let run: RunResult = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{example} loads: {e}"));
        keys(&serde_json::to_value(&run).unwrap(), &mut seen);
    }
    let mut gpu = fixtures::passing();
    gpu.gpu = Some(fixtures::gpu_report());
    let fixture_runs = [
        fixtures::run(vec![
            gpu,
            fixtures::segv(),
            fixtures::hung(),
            fixtures::false_success(),
            fixtures::abort_raw_only(),
            fixtures::shm_bus_error(),
            fixtures::input_bound(),
        ]),
        fixtures::interrupted(),
    ];
    for run in &fixture_runs {
        keys(&serde_json::to_value(run).unwrap(), &mut seen);
    }
    assert!(seen.len() > 120, "{seen:?}");
    let missing: Vec<&String> = seen.iter().filter(|k| !named.contains(*k)).collect();
    assert!(missing.is_empty(), "keys of result.json that docs/result-json.md does not name: {missing:?}");
}

/// Values written before these fields were enums still load, as what they meant.
#[test]
fn earlier_spellings_still_load() {
    use crate::schema::{ExitSource, IdentifiedBy, ProcessDump, ProcessRole};
    let exit = |text: &str| serde_json::from_value::<ExitSource>(Value::from(text)).unwrap();
    assert_eq!(exit("launcher status 0"), ExitSource::LauncherStatus0);
    assert_eq!(
        exit(
            "launcher status 0, rank not identified; 2 processes below the launcher looked like ranks, their rank numbers are unknown"
        ),
        ExitSource::NotIdentified
    );
    assert_eq!(exit("procfs"), ExitSource::Procfs);
    assert!(serde_json::from_value::<ExitSource>(Value::from("zombie")).is_err());
    let by = |text: &str| serde_json::from_value::<IdentifiedBy>(Value::from(text)).unwrap();
    assert_eq!(by("launcher process"), IdentifiedBy::LauncherProcess);
    assert_eq!(by("spawn order"), IdentifiedBy::SpawnOrder);
    assert_eq!(by("SLURM_PROCID"), IdentifiedBy::SlurmProcid);
    let dump: ProcessDump = serde_json::from_str(
        r#"{"pid": 7, "role": "rank 3, child process (DataLoader worker?)", "threads": []}"#,
    )
    .unwrap();
    assert_eq!((dump.rank, dump.role), (3, ProcessRole::Child));
    assert_eq!(dump.label(), "rank 3, child process (DataLoader worker?)");
    // And what is written now reads back as it was.
    let now = serde_json::to_value(&dump).unwrap();
    assert_eq!((&now["rank"], &now["role"]), (&Value::from(3), &Value::from("child")));
    assert_eq!(serde_json::from_value::<ProcessDump>(now).unwrap(), dump);
    // A node's snapshot: the moment was part of the label, and is its own field now, which
    // survives the trip from an agent to the coordinator.
    let snap: ProcessDump = serde_json::from_str(
        r#"{"pid": 8, "role": "rank 0, the moment rank 3 on node 1 (b) was killed by SIGSEGV", "threads": []}"#,
    )
    .unwrap();
    assert_eq!(snap.taken.as_deref(), Some("the moment rank 3 on node 1 (b) was killed by SIGSEGV"));
    assert_eq!(snap.label(), "rank 0, the moment rank 3 on node 1 (b) was killed by SIGSEGV");
    assert_eq!(serde_json::from_value::<ProcessDump>(serde_json::to_value(&snap).unwrap()).unwrap(), snap);
    for source in [
        ExitSource::LauncherStatus0,
        ExitSource::TorchrunNotFailed,
        ExitSource::NotIdentified,
        ExitSource::Spawn,
        ExitSource::Srun,
        ExitSource::Unknown,
    ] {
        let text = serde_json::to_value(source).unwrap();
        assert_eq!(serde_json::from_value::<ExitSource>(text).unwrap(), source);
    }
    assert_eq!(serde_json::to_value(ExitSource::LauncherStatus0).unwrap(), "launcher_status_0");
}
