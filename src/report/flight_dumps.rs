//! `ups-doctor report DIR` of a folder of PyTorch Flight Recorder dumps taken elsewhere: the files
//! a job wrote with PyTorch's own variables (`TORCH_NCCL_TRACE_BUFFER_SIZE`,
//! `TORCH_NCCL_DUMP_ON_TIMEOUT`, `TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/path/nccl_trace_rank_`: one
//! pickle per rank, its rank the digits its name ends in, as PyTorch's own analyzer reads them),
//! collected from every node into one folder. The same match across ranks as a run's verdict
//! uses (`diagnose::flight_divergence`), the same table, in `DIR/ups-doctor-flight.md`.

use std::path::{Path, PathBuf};

use crate::schema::FlightRecord;

use super::markdown::{Doc, flight};
use super::markup;

/// The report written into the folder of dumps.
pub const FLIGHT_REPORT_FILE: &str = "ups-doctor-flight.md";

/// Folders below the given one that are looked into (PyTorch's analyzer walks the whole tree; a
/// folder of dumps copied from several nodes is a level or two deep).
const DEPTH: usize = 3;

/// One rank's dump as read.
pub struct Dump {
    pub rank: u32,
    pub file: PathBuf,
    pub record: FlightRecord,
}

/// Two dumps of one rank in the folder: which one is the job's cannot be told.
#[derive(Debug, thiserror::Error)]
#[error(
    "`{}` and `{}` are both rank {rank}'s Flight Recorder dump: keep one per rank (the one job's) in the folder",
    first.display(),
    second.display()
)]
pub struct TwoDumpsOfOneRank {
    pub rank: u32,
    pub first: PathBuf,
    pub second: PathBuf,
}

/// The Flight Recorder dumps in `dir`: every regular file whose name ends in a rank number and
/// whose bytes are such a dump (a pickle, or the JSON of `_dump_fr_trace_json`), by rank. Two
/// files of one rank are an error naming both.
pub fn read_dumps(dir: &Path) -> Result<Vec<Dump>, TwoDumpsOfOneRank> {
    let mut files = Vec::new();
    walk(dir, DEPTH, &mut files);
    files.sort();
    let mut dumps: Vec<Dump> = Vec::new();
    for file in files {
        let Some(rank) = rank_of(&file) else { continue };
        let Ok(bytes) = std::fs::read(&file) else { continue };
        let record = FlightRecord::from_pickle(&bytes)
            .or_else(|| std::str::from_utf8(&bytes).ok().and_then(FlightRecord::from_dump));
        let Some(record) = record else { continue };
        if let Some(other) = dumps.iter().find(|d| d.rank == rank) {
            return Err(TwoDumpsOfOneRank { rank, first: other.file.clone(), second: file });
        }
        dumps.push(Dump { rank, file, record });
    }
    dumps.sort_by_key(|d| d.rank);
    Ok(dumps)
}

fn walk(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_file() {
            out.push(entry.path());
        } else if kind.is_dir() && depth > 0 {
            walk(&entry.path(), depth - 1, out);
        }
    }
}

/// The rank a dump's name ends in (`nccl_trace_rank_12` → 12), as PyTorch's analyzer reads it.
fn rank_of(file: &Path) -> Option<u32> {
    let name = file.file_name()?.to_str()?;
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    name[name.len() - digits..].parse().ok()
}

/// The report of `dumps` read from `dir`.
pub fn render(dir: &Path, dumps: &[Dump]) -> String {
    let mut doc = Doc::default();
    doc.push(format!("# Flight Recorder dumps: `{}`", markup::text(&dir.display().to_string())));
    let records: Vec<(u32, &FlightRecord)> = dumps.iter().map(|d| (d.rank, &d.record)).collect();
    let divergence = crate::diagnose::flight_divergence(&records);
    let verdict = match &divergence {
        Some(d) => markup::harness(&d.sentence(), &[], 0),
        None => {
            let last: Vec<String> = records
                .iter()
                .filter_map(|(rank, r)| {
                    let e = r.entries.iter().filter(|e| !e.p2p).max_by_key(|e| e.seq)?;
                    Some(format!("rank {rank} #{} {}", e.seq, e.render()))
                })
                .collect();
            let said = format!(
                "The ranks' collectives do not part ways in these dumps: at every sequence id two or more of them \
                 recorded, they issued the same op, sizes and element types. Their last: {}.",
                if last.is_empty() { "none recorded".to_string() } else { last.join("; ") }
            );
            markup::harness(&said, &[], 0)
        }
    };
    doc.push(format!("## Verdict\n\n{verdict}"));
    let ranks: Vec<u32> = dumps.iter().map(|d| d.rank).collect();
    let world = ranks.iter().max().map_or(0, |m| m + 1);
    let absent: Vec<String> = (0..world).filter(|r| !ranks.contains(r)).map(|r| r.to_string()).collect();
    if !absent.is_empty() {
        doc.push(format!(
            "No dump of rank {} in the folder: what it issued is unknown, and it is not counted as missing a \
             collective.",
            absent.join(", ")
        ));
    }
    flight::table(&mut doc, &records);
    let rows: Vec<Vec<String>> = dumps
        .iter()
        .map(|d| {
            let groups: std::collections::BTreeSet<&str> =
                d.record.entries.iter().map(|e| e.group.as_str()).collect();
            vec![
                d.rank.to_string(),
                format!("`{}`", markup::text(&d.file.display().to_string())),
                d.record.entries.len().to_string(),
                groups.into_iter().map(|g| format!("`{}`", markup::text(g))).collect::<Vec<_>>().join(", "),
            ]
        })
        .collect();
    doc.push("### The dumps read".to_string());
    doc.push(markup::table(
        &["rank", "file", "entries kept", "groups"],
        &[markup::Align::Right, markup::Align::Left, markup::Align::Right, markup::Align::Left],
        &rows,
    ));
    doc.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dump(rank: u32, ops: &[&str]) -> Dump {
        let entries: Vec<String> = ops
            .iter()
            .enumerate()
            .map(|(i, op)| {
                format!(
                    r#"{{"collective_seq_id": {}, "is_p2p": false, "pg_id": 0, "process_group": ["0", "default_pg"], "profiling_name": "{op}", "input_sizes": [[4]], "input_dtypes": ["Float"], "state": "scheduled"}}"#,
                    i + 1
                )
            })
            .collect();
        let record = FlightRecord::from_dump(&format!(r#"{{"entries": [{}]}}"#, entries.join(","))).unwrap();
        Dump { rank, file: PathBuf::from(format!("d/nccl_trace_rank_{rank}")), record }
    }

    /// Ranks that agree say so with each one's last collective; a rank with no dump in the folder
    /// is said to be unknown, not missing a collective.
    #[test]
    fn dumps_that_agree_say_so_and_a_rank_without_a_dump_is_unknown() {
        let text =
            render(Path::new("d"), &[dump(0, &["gloo:all_reduce"; 3]), dump(2, &["gloo:all_reduce"; 3])]);
        assert!(text.contains("do not part ways in these dumps"), "{text}");
        assert!(text.contains("rank 0 #3 `gloo:all_reduce` of \\[4\\] Float"), "{text}");
        assert!(text.contains("No dump of rank 1 in the folder"), "{text}");
        assert!(!text.contains("### Collectives where the ranks part ways"), "{text}");
    }

    #[test]
    fn two_dumps_of_one_rank_are_refused_naming_both() {
        let dir = tempfile::tempdir().unwrap();
        let text = r#"{"entries": []}"#;
        for name in ["nccl_trace_rank_1", "copy_of_rank_1"] {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let Err(e) = read_dumps(dir.path()) else { panic!("two dumps of rank 1 read") };
        assert_eq!(
            e.to_string(),
            format!(
                "`{}` and `{}` are both rank 1's Flight Recorder dump: keep one per rank (the one job's) in the folder",
                dir.path().join("copy_of_rank_1").display(),
                dir.path().join("nccl_trace_rank_1").display()
            )
        );
    }

    #[test]
    fn a_dumps_rank_is_the_number_its_name_ends_in() {
        assert_eq!(rank_of(Path::new("/x/nccl_trace_rank_12")), Some(12));
        assert_eq!(rank_of(Path::new("fr_3")), Some(3));
        assert_eq!(rank_of(Path::new("notes.txt")), None);
    }

    /// A dump of torch 2.11 with gloo, as `_dump_fr_trace(True, False)` returned it (the bytes
    /// the NCCL watchdog writes to `TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>`): one rank, an
    /// `all_reduce` of 8 floats then a `broadcast`. Made here by
    /// `TORCH_FR_BUFFER_SIZE=2000 python -c 'import torch, torch.distributed as dist;
    /// dist.init_process_group("gloo", rank=0, world_size=1); t = torch.ones(8);
    /// dist.all_reduce(t); dist.broadcast(t, 0); import torch._C._distributed_c10d as c;
    /// open("fr_gloo_rank_0", "wb").write(c._dump_fr_trace(True, False))'`.
    #[test]
    fn a_pickled_dump_of_torch_2_11_is_read() {
        let r = FlightRecord::from_pickle(include_bytes!("../diagnose/fixtures/fr_gloo_rank_0")).unwrap();
        let ops: Vec<String> = r.entries.iter().map(|e| format!("#{} {}", e.seq, e.render())).collect();
        assert_eq!(ops, ["#1 `gloo:all_reduce` of [8] Float", "#2 `gloo:broadcast` of [8] Float"]);
        assert_eq!(r.entries[0].group, "default_pg");
        // Stamped by the wall clock as each was made (the dump was written on 2026-12-06), in order.
        let made: Vec<u64> = r.entries.iter().map(|e| e.created_ns.unwrap()).collect();
        assert!(made[0] > 1_796_000_000_000_000_000 && made[0] <= made[1], "{made:?}");
        assert_eq!(r.entries[0].ms, None, "gloo does not time its collectives");
        assert!(FlightRecord::from_pickle(b"not a pickle").is_none());
    }
}
