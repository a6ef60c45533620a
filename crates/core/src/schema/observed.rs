//! What the observer in a user's Python program (`python/site/sitecustomize.py`) reported about
//! one rank: the process group it formed, its optimizer steps and their time, and the tail of its
//! collective ledger. Folded from the observer's markers; read by the judge.

use serde::{Deserialize, Serialize};

use crate::protocol::Marker;

/// Ledger entries kept per rank (the newest): enough to find where ranks part ways on a hang.
pub const LEDGER_KEPT: usize = 32;

/// The process group a rank formed with `init_process_group`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupFormed {
    pub backend: String,
    pub rank: u32,
    pub world_size: u32,
    pub store: String,
}

/// Processes a rank's process started of its own through `torch.multiprocessing` (it was a
/// launcher, not a rank): how many, and by which start method.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartedProcesses {
    pub nprocs: u32,
    pub start_method: String,
}

/// The Python and PyTorch a rank's process ran, as the observer read them inside it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TorchFacts {
    pub version: String,
    /// The CUDA torch was built with (`torch.version.cuda`); `None` for a CPU build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<String>,
    /// The NCCL torch was built with; `None` where it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl: Option<String>,
    pub python: String,
    pub executable: String,
}

/// A rank's main thread's mean time a step on a CPU and runnable but waiting for one, in ms
/// (`/proc/PID/task/PID/schedstat`): where the others ran on the CPUs it needed, it waits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CpuPerStep {
    pub run_ms: f64,
    pub wait_ms: f64,
    /// The same summed over the process's other threads (PyTorch's intra-op threads among them),
    /// those started since counted whole; `None` where they were not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub others_run_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub others_wait_ms: Option<f64>,
}

/// One collective the rank issued.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerEntry {
    pub op: String,
    pub group: String,
    pub seq: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub shapes: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub dtype: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub site: String,
    /// How long it took; `None` while the rank was still in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ms: Option<f64>,
    /// When the rank issued it, in seconds since the scenario started (its observer's stamp).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_s: Option<f64>,
    /// On the default group: its place in the group's own count of collectives (see
    /// [`ObservedProgram::issued`]), and how many it issued (`all_gather_object` issues two).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pos: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span: Option<u64>,
}

impl LedgerEntry {
    /// `all_gather #3 (train.py:40, 1,1 float32)`.
    pub fn render(&self) -> String {
        let group = if self.group == "default" { String::new() } else { format!(" of group {}", self.group) };
        let what: Vec<&str> = [self.site.as_str(), self.shapes.as_str(), self.dtype.as_str()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect();
        let what = if what.is_empty() { String::new() } else { format!(" ({})", what.join(", ")) };
        format!("`{}` #{}{group}{what}", self.op, self.seq)
    }

    /// Whether it issued the default group's collective `pos` (counting from C++ too).
    pub fn holds(&self, pos: u64) -> bool {
        self.pos.is_some_and(|p| p <= pos && pos < p + self.span.unwrap_or(1).max(1))
    }
}

/// Entries of the Flight Recorder kept per process group and rank (the newest): enough to align
/// the ranks around where they part ways, by sequence id.
pub const FLIGHT_KEPT: usize = 64;

/// One rank's Flight Recorder, as its observer handed it over.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FlightRecord {
    /// The newest [`FLIGHT_KEPT`] entries of each process group, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entries: Vec<FlightEntry>,
    /// Why there are none: PyTorch could not dump them (an older torch, a backend that records
    /// nothing), in its words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One collective the Flight Recorder kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlightEntry {
    /// Its process group's name (`default_pg`, or the id of a group made later).
    pub group: String,
    /// Its place in the group's sequence of collectives (1 is the first), or of its
    /// point-to-point operations for a send or a receive.
    pub seq: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub p2p: bool,
    /// `gloo:all_reduce`, `nccl:all_gather`.
    pub op: String,
    /// Each input tensor's shape, and its element type (`Float`).
    #[serde(default)]
    pub sizes: Vec<Vec<i64>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dtypes: Vec<String>,
    /// `scheduled`, `started` or `completed` (gloo's stay `scheduled`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub state: String,
    /// When PyTorch made the entry (its `time_created_ns`): the wall clock (`CLOCK_REALTIME`, as
    /// `time.time_ns()`, measured on torch 2.11 and gloo), nanoseconds since the Unix epoch;
    /// `None` where the dump had none (or 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_ns: Option<u64>,
    /// How long it took, as PyTorch timed it (`duration_ms`: NCCL with timing on); `None` where
    /// it did not (gloo's never are).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ms: Option<f64>,
    /// `created_ns` on the scenario's timeline (seconds since it started), put there by the
    /// harness as it reads a live rank's entries; `None` in a dump file read on its own, or
    /// where the time could not be placed (before the scenario started: the wall clock stepped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_s: Option<f64>,
}

impl FlightEntry {
    /// `gloo:all_reduce of [577] Float` (input shapes and element types).
    pub fn render(&self) -> String {
        let shapes: Vec<String> = self
            .sizes
            .iter()
            .map(|s| format!("[{}]", s.iter().map(i64::to_string).collect::<Vec<_>>().join(", ")))
            .collect();
        let mut dtypes = self.dtypes.clone();
        dtypes.dedup();
        let of = if shapes.is_empty() { String::new() } else { format!(" of {}", shapes.join(" ")) };
        let ty = if dtypes.is_empty() { String::new() } else { format!(" {}", dtypes.join("/")) };
        format!("`{}`{of}{ty}", self.op)
    }

    /// Whether two ranks' entries at one sequence id are the same collective: op, shapes, types.
    pub fn agrees(&self, other: &FlightEntry) -> bool {
        self.op == other.op && self.sizes == other.sizes && self.dtypes == other.dtypes
    }
}

/// A pickled value as JSON: dictionaries (their keys as text), lists and tuples (arrays), text,
/// numbers, `None`.
fn pickle_to_json(v: serde_pickle::Value) -> serde_json::Value {
    use serde_json::Value as J;
    use serde_pickle::{HashableValue as H, Value as P};
    let key = |k: H| match k {
        H::String(s) => s,
        H::I64(n) => n.to_string(),
        other => format!("{other:?}"),
    };
    match v {
        P::None => J::Null,
        P::Bool(b) => J::Bool(b),
        P::I64(n) => J::from(n),
        P::Int(n) => J::String(n.to_string()),
        P::F64(f) => serde_json::Number::from_f64(f).map_or(J::Null, J::Number),
        P::Bytes(b) => J::String(String::from_utf8_lossy(&b).into_owned()),
        P::String(s) => J::String(s),
        P::List(items) | P::Tuple(items) => J::Array(items.into_iter().map(pickle_to_json).collect()),
        P::Set(_) | P::FrozenSet(_) => J::Null,
        P::Dict(map) => J::Object(map.into_iter().map(|(k, v)| (key(k), pickle_to_json(v))).collect()),
    }
}

impl FlightRecord {
    /// The record from PyTorch's `_dump_fr_trace_json` text (`entries[]` with `pg_id`,
    /// `process_group`, `collective_seq_id`, `p2p_seq_id`, `is_p2p`, `profiling_name`,
    /// `input_sizes`, `input_dtypes`, `state`), keeping each group's newest [`FLIGHT_KEPT`];
    /// `None` for text that is not such a dump.
    pub fn from_dump(text: &str) -> Option<FlightRecord> {
        FlightRecord::from_value(&serde_json::from_str(text).ok()?)
    }

    /// The record from a file PyTorch wrote (`TORCH_NCCL_DUMP_ON_TIMEOUT`'s
    /// `TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>`, `_dump_fr_trace`'s bytes: a pickle of the same
    /// fields as [`FlightRecord::from_dump`] reads); `None` for bytes that are not such a dump.
    pub fn from_pickle(bytes: &[u8]) -> Option<FlightRecord> {
        let v = serde_pickle::value_from_slice(bytes, serde_pickle::DeOptions::new()).ok()?;
        FlightRecord::from_value(&pickle_to_json(v))
    }

    fn from_value(v: &serde_json::Value) -> Option<FlightRecord> {
        if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
            return Some(FlightRecord { entries: Vec::new(), error: Some(e.to_string()) });
        }
        let mut entries: Vec<FlightEntry> = v
            .get("entries")?
            .as_array()?
            .iter()
            .filter_map(|e| {
                let p2p = e.get("is_p2p").and_then(|p| p.as_bool()).unwrap_or(false);
                let seq = e.get(if p2p { "p2p_seq_id" } else { "collective_seq_id" })?.as_u64()?;
                let group = e
                    .get("process_group")
                    .and_then(|g| g.get(1))
                    .and_then(|g| g.as_str())
                    .filter(|g| !g.is_empty())
                    .map(str::to_string)
                    .or_else(|| e.get("pg_id").map(|id| id.to_string()))?;
                let sizes = e
                    .get("input_sizes")
                    .and_then(|s| s.as_array())
                    .map(|all| {
                        all.iter()
                            .map(|t| {
                                t.as_array()
                                    .map(|d| d.iter().filter_map(|x| x.as_i64()).collect())
                                    .unwrap_or_default()
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let dtypes = e
                    .get("input_dtypes")
                    .and_then(|s| s.as_array())
                    .map(|all| all.iter().filter_map(|t| t.as_str().map(str::to_string)).collect())
                    .unwrap_or_default();
                Some(FlightEntry {
                    group,
                    seq,
                    p2p,
                    op: e.get("profiling_name")?.as_str()?.to_string(),
                    sizes,
                    dtypes,
                    state: e.get("state").and_then(|s| s.as_str()).unwrap_or_default().to_string(),
                    created_ns: e.get("time_created_ns").and_then(|t| t.as_u64()).filter(|t| *t > 0),
                    ms: e.get("duration_ms").and_then(|d| d.as_f64()),
                    at_s: None,
                })
            })
            .collect();
        entries.sort_by(|a, b| (&a.group, a.p2p, a.seq).cmp(&(&b.group, b.p2p, b.seq)));
        // Sorted, each group's (and its point-to-point) entries are one run: keep its tail.
        let mut kept = Vec::new();
        for run in entries.chunk_by(|a, b| a.group == b.group && a.p2p == b.p2p) {
            kept.extend_from_slice(&run[run.len().saturating_sub(FLIGHT_KEPT)..]);
        }
        Some(FlightRecord { entries: kept, error: None })
    }
}

/// The observer's account of one rank.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ObservedProgram {
    /// `None`: the process never formed a process group (or the observer did not see it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<GroupFormed>,
    /// The processes it started of its own through `torch.multiprocessing` (`None`: none, or it
    /// was not a per-rank run's rank).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<StartedProcesses>,
    /// The process entered `init_process_group` (the observer's `joining` marker); with no
    /// `group`, it never returned from it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub joining: bool,
    /// The world size it entered `init_process_group` for (its argument, else `WORLD_SIZE`),
    /// where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub joining_world_size: Option<u32>,
    /// The Python and PyTorch the process ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch: Option<TorchFacts>,
    /// Whether the process said, in its last summary, that it formed a group.
    #[serde(default)]
    pub distributed: bool,
    pub steps: u64,
    /// Steps whose time was measured (every step after the first).
    #[serde(default)]
    pub timed_steps: u64,
    /// Medians over the last 256 steps: the whole step, and its time in `DataLoader.__next__`,
    /// in DDP's forward and in `torch.distributed` collectives.
    #[serde(default)]
    pub step_ms: f64,
    #[serde(default)]
    pub data_ms: f64,
    #[serde(default)]
    pub forward_ms: f64,
    #[serde(default)]
    pub collective_ms: f64,
    /// In `torch.autograd.backward` (every way of running backward goes through it): a DDP rank
    /// waits there for the others' gradients. 0 where not measured.
    #[serde(default, skip_serializing_if = "crate::protocol::is_zero_f64")]
    pub backward_ms: f64,
    /// Every collective it timed over the whole run, in steps and between them (a framework's
    /// syncs outside its steps): where a rank waits for another's work that no step holds. 0
    /// where not measured.
    #[serde(default, skip_serializing_if = "crate::protocol::is_zero_f64")]
    pub collective_total_ms: f64,
    /// Collectives issued, over every group.
    #[serde(default)]
    pub collectives: u64,
    /// The newest collectives (at most [`LEDGER_KEPT`]), oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ledger: Vec<LedgerEntry>,
    /// Markers the observer could not send (its queue was full, or the pipe was gone).
    #[serde(default)]
    pub dropped: u64,
    /// The collectives its observer kept in the file it maps were read after the process ended:
    /// the ledger's newest entries are every collective it issued from Python to its end (not
    /// only those its markers said within the quarter second its sending thread waits).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kept: bool,
    /// The default group's own count of the collectives issued on it, at the observer's last
    /// reading (every 0.25 s while it moves): those issued from C++ included, which the ledger
    /// cannot see. `None` without a group, or where its backend keeps no count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issued: Option<u64>,
    /// Of those, the ones not issued through `torch.distributed`'s Python functions: DDP's
    /// gradient reductions (and its start-up broadcasts), from C++.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unseen: Option<u64>,
    /// The median of those a step issued: DDP's gradient reductions per backward.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unseen_per_step: Option<f64>,
    /// The main thread's mean time a step on a CPU and waiting for one, from the kernel's
    /// account: a rank slowed by a crowded machine waits, one with more work of its own runs.
    /// `None` before the observer's second summary of timed steps, or where the kernel keeps none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_per_step: Option<CpuPerStep>,
    /// The intra-op threads its PyTorch computed with (`torch.get_num_threads()`) and the CPUs
    /// it could run on (its affinity mask), from its observer's last summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intra_op_threads: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// Its main thread's nice value at its last summary (`renice`, `nice`, a launcher's: Ray runs
    /// its workers at 15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nice: Option<i32>,
    /// When the program's own code had finished and its exit handlers (`atexit`) ran, in seconds
    /// since the scenario started: anything after it happened while Python shut down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exiting_at_s: Option<f64>,
    /// PyTorch's Flight Recorder entries of the rank (every collective of every group, those
    /// issued from C++ included), as its observer handed them over when ups-doctor asked (a rank
    /// failed, or the ranks were found hung); `None` where it was not asked or did not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flight: Option<FlightRecord>,
    /// Whether the figures above came from a forked child's summary (while folding only).
    #[serde(skip)]
    pub figures_from_fork: bool,
}

impl ObservedProgram {
    /// Folds in a collective the rank's observer kept in the file it maps, read after the rank
    /// ended (`collective_tail` in `src/harness/os/stacks.rs`): one its markers never said (issued
    /// after the last that went out: a rank aborted or killed within the quarter second its
    /// sending thread waits), or the time of one they said was still under way. One older than
    /// its group's newest in the ledger was said already, or let go as the ledger is.
    pub fn apply_kept(this: &mut Option<Self>, at: f64, marker: &Marker) {
        let Marker::Collective { group, seq, ms, .. } = marker else { return };
        if let Some(o) = this.as_mut() {
            if let Some(e) = o.ledger.iter_mut().rev().find(|e| e.group == *group && e.seq == *seq) {
                e.ms = e.ms.or(*ms);
                return;
            }
            if o.ledger.iter().any(|e| e.group == *group && e.seq > *seq) {
                return;
            }
        }
        Self::apply(this, at, marker);
    }

    /// Folds one observer marker, written at `at` (seconds since the scenario started), in;
    /// `false` for any other marker.
    pub fn apply(this: &mut Option<Self>, at: f64, marker: &Marker) -> bool {
        match marker {
            Marker::Joining { world_size, .. } => {
                let o = this.get_or_insert_with(Default::default);
                o.joining = true;
                o.joining_world_size = world_size.or(o.joining_world_size);
            }
            Marker::Group { backend, rank, world_size, store, .. } => {
                let o = this.get_or_insert_with(Default::default);
                o.distributed = true;
                o.group = Some(GroupFormed {
                    backend: backend.clone(),
                    rank: *rank,
                    world_size: *world_size,
                    store: store.clone(),
                });
            }
            Marker::Starts { nprocs, start_method } => {
                this.get_or_insert_with(Default::default).started =
                    Some(StartedProcesses { nprocs: *nprocs, start_method: start_method.clone() });
            }
            Marker::Collective { op, group, seq, shapes, dtype, site, ms, pos, span, skipped } => {
                let o = this.get_or_insert_with(Default::default);
                o.collectives += skipped;
                match o.ledger.iter_mut().rev().find(|e| e.group == *group && e.seq == *seq) {
                    Some(e) => {
                        e.ms = *ms;
                        e.span = span.or(e.span);
                    }
                    None => {
                        o.collectives += 1;
                        o.ledger.push(LedgerEntry {
                            op: op.clone(),
                            group: group.clone(),
                            seq: *seq,
                            shapes: shapes.clone(),
                            dtype: dtype.clone(),
                            site: site.clone(),
                            ms: *ms,
                            at_s: Some(at),
                            pos: *pos,
                            span: *span,
                        });
                        if o.ledger.len() > LEDGER_KEPT {
                            o.ledger.remove(0);
                        }
                    }
                }
            }
            Marker::Torch { version, cuda, nccl, python, executable } => {
                this.get_or_insert_with(Default::default).torch.get_or_insert_with(|| TorchFacts {
                    version: version.clone(),
                    cuda: cuda.clone(),
                    nccl: nccl.clone(),
                    python: python.clone(),
                    executable: executable.clone(),
                });
            }
            Marker::Observer {
                steps,
                timed_steps,
                step_ms,
                data_ms,
                forward_ms,
                collective_ms,
                backward_ms,
                collective_total_ms,
                distributed,
                dropped,
                unseen_per_step,
                cpu_run_ms,
                cpu_wait_ms,
                threads_run_ms,
                threads_wait_ms,
                intra_op_threads,
                cpus,
                nice,
                exiting,
                forked,
            } => {
                let o = this.get_or_insert_with(Default::default);
                // A forked child's summary (its parent's state at the fork) can reach the pipe
                // before one the parent queued earlier, with fewer steps: that one changes no
                // figure. The child's raises them only when it has more steps than seen (its
                // parent may have crashed before sending its own). Otherwise the newest summary
                // wins: a rank's process started again (a launcher's restart) counts from 0.
                let newer = if *forked || o.figures_from_fork { *steps > o.steps } else { true };
                if newer {
                    o.figures_from_fork = *forked;
                    o.steps = *steps;
                    o.timed_steps = *timed_steps;
                    o.step_ms = *step_ms;
                    o.data_ms = *data_ms;
                    o.forward_ms = *forward_ms;
                    o.collective_ms = *collective_ms;
                    o.backward_ms = *backward_ms;
                    o.collective_total_ms = *collective_total_ms;
                    o.dropped = *dropped;
                    o.unseen_per_step = unseen_per_step.or(o.unseen_per_step);
                    let (others_run_ms, others_wait_ms) = (*threads_run_ms, *threads_wait_ms);
                    if let (Some(&run_ms), Some(&wait_ms)) = (cpu_run_ms.as_ref(), cpu_wait_ms.as_ref()) {
                        o.cpu_per_step = Some(CpuPerStep { run_ms, wait_ms, others_run_ms, others_wait_ms });
                    }
                    o.intra_op_threads = intra_op_threads.or(o.intra_op_threads);
                    o.cpus = cpus.or(o.cpus);
                    o.nice = nice.or(o.nice);
                    o.distributed = *distributed || o.group.is_some();
                }
                if *exiting {
                    o.exiting_at_s = Some(at);
                }
            }
            Marker::Issued { n, unseen } => {
                let o = this.get_or_insert_with(Default::default);
                o.issued = Some(*n);
                o.unseen = Some(*unseen);
            }
            _ => return false,
        }
        true
    }

    /// The newest collective of `group` the rank issued.
    pub fn last_of(&self, group: &str) -> Option<&LedgerEntry> {
        self.ledger.iter().rev().find(|e| e.group == group)
    }

    /// The rank's collective `seq` of `group`, if the kept ledger still holds it.
    pub fn at(&self, group: &str, seq: u64) -> Option<&LedgerEntry> {
        self.ledger.iter().find(|e| e.group == group && e.seq == seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collective(op: &str, seq: u64, ms: Option<f64>) -> Marker {
        Marker::Collective {
            op: op.into(),
            group: "default".into(),
            seq,
            shapes: "1".into(),
            dtype: "float32".into(),
            site: "train.py:40".into(),
            ms,
            pos: None,
            span: None,
            skipped: 0,
        }
    }

    #[test]
    fn the_ledger_pairs_issue_and_return_and_keeps_the_newest() {
        let mut o = None;
        for seq in 1..=40 {
            assert!(ObservedProgram::apply(&mut o, 1.0, &collective("all_reduce", seq, None)));
            assert!(ObservedProgram::apply(&mut o, 1.0, &collective("all_reduce", seq, Some(1.0))));
        }
        ObservedProgram::apply(&mut o, 1.0, &collective("all_gather", 41, None));
        let o = o.unwrap();
        assert_eq!((o.collectives, o.ledger.len()), (41, LEDGER_KEPT));
        let last = o.last_of("default").unwrap();
        assert_eq!((last.op.as_str(), last.seq, last.ms), ("all_gather", 41, None));
        assert_eq!(o.at("default", 40).unwrap().ms, Some(1.0));
        assert_eq!(last.render(), "`all_gather` #41 (train.py:40, 1, float32)");
        assert!(!ObservedProgram::apply(&mut None, 1.0, &Marker::Error { message: "x".into() }));
    }

    /// What a rank's file kept adds the collectives its markers never said and the end of one
    /// they left under way, and never goes back on what they said or let go.
    #[test]
    fn kept_collectives_add_what_the_markers_never_said_and_nothing_twice() {
        let mut o = None;
        for seq in 1..=3 {
            ObservedProgram::apply(&mut o, 1.0, &collective("all_reduce", seq, Some(1.0)));
        }
        ObservedProgram::apply(&mut o, 1.0, &collective("all_reduce", 4, None));
        // The file: 2 (said, returned), 3 (said), 4 (said under way, returned since), 5 and 6 (never
        // said; 6 under way as the rank died).
        for (seq, ms) in [(2, Some(1.0)), (3, Some(1.0)), (4, Some(2.5)), (5, Some(1.0)), (6, None)] {
            ObservedProgram::apply_kept(&mut o, 2.0, &collective("all_gather", seq, ms));
        }
        // Older than the ledger's newest of its group, not in it: let go before, not brought back.
        ObservedProgram::apply_kept(&mut o, 2.0, &collective("barrier", 0, None));
        let o = o.unwrap();
        let seen: Vec<_> = o.ledger.iter().map(|e| (e.op.as_str(), e.seq, e.ms)).collect();
        assert_eq!(
            seen,
            [
                ("all_reduce", 1, Some(1.0)),
                ("all_reduce", 2, Some(1.0)),
                ("all_reduce", 3, Some(1.0)),
                ("all_reduce", 4, Some(2.5)),
                ("all_gather", 5, Some(1.0)),
                ("all_gather", 6, None)
            ]
        );
        assert_eq!(o.collectives, 6);
        assert_eq!(o.ledger[5].at_s, Some(2.0));
    }

    #[test]
    fn collectives_the_observer_counted_but_did_not_send_are_counted_once() {
        let mut o = None;
        let mut first = collective("all_gather", 65, Some(1.0));
        if let Marker::Collective { skipped, .. } = &mut first {
            *skipped = 64;
        }
        ObservedProgram::apply(&mut o, 1.0, &first);
        ObservedProgram::apply(&mut o, 1.0, &collective("all_gather", 66, None));
        ObservedProgram::apply(&mut o, 1.0, &collective("all_gather", 66, Some(1.0)));
        let o = o.unwrap();
        assert_eq!((o.collectives, o.ledger.len()), (66, 2));
        assert_eq!(o.last_of("default").unwrap().seq, 66);
    }

    #[test]
    fn the_groups_own_count_places_each_collective_and_counts_those_from_cpp() {
        let mut o = None;
        let at = |op: &str, seq, pos, ms, span| {
            let mut m = collective(op, seq, ms);
            if let Marker::Collective { pos: p, span: s, .. } = &mut m {
                (*p, *s) = (Some(pos), span);
            }
            m
        };
        ObservedProgram::apply(&mut o, 1.0, &at("all_gather_object", 1, 4, None, None));
        ObservedProgram::apply(&mut o, 1.0, &at("all_gather_object", 1, 4, Some(2.0), Some(2)));
        ObservedProgram::apply(&mut o, 1.0, &Marker::Issued { n: 19, unseen: 17 });
        let o = o.unwrap();
        let e = o.last_of("default").unwrap();
        assert_eq!((e.pos, e.span, e.ms), (Some(4), Some(2), Some(2.0)), "the return keeps its place");
        assert!(!e.holds(3) && e.holds(4) && e.holds(5) && !e.holds(6));
        assert_eq!((o.issued, o.unseen), (Some(19), Some(17)));
    }

    #[test]
    fn the_summary_sent_at_exit_says_when_the_program_had_finished() {
        let marker = |line: &str| serde_json::from_str::<Marker>(line).unwrap();
        let mut o = None;
        ObservedProgram::apply(
            &mut o,
            4.0,
            &marker(r#"{"t": "observer", "steps": 200, "distributed": true}"#),
        );
        assert_eq!(o.as_ref().unwrap().exiting_at_s, None);
        ObservedProgram::apply(
            &mut o,
            5.25,
            &marker(r#"{"t": "observer", "steps": 200, "distributed": true, "exiting": true}"#),
        );
        let o = o.unwrap();
        assert_eq!((o.steps, o.exiting_at_s), (200, Some(5.25)));
        let back = serde_json::to_string(&marker(r#"{"t": "observer", "steps": 1}"#)).unwrap();
        assert!(!back.contains("exiting"), "{back}");
    }

    #[test]
    fn a_summary_older_than_a_forked_childs_copy_changes_no_figure() {
        // A forked child's summary at exit (the state it inherited: 5 steps) reaches the pipe
        // before the one its parent queued at step 1.
        let summary = |steps: u64, step_ms: f64, forked: bool| Marker::Observer {
            steps,
            timed_steps: 0,
            step_ms,
            data_ms: 0.0,
            forward_ms: 0.0,
            collective_ms: 0.0,
            backward_ms: 0.0,
            collective_total_ms: 0.0,
            distributed: false,
            dropped: 0,
            unseen_per_step: None,
            cpu_run_ms: None,
            cpu_wait_ms: None,
            threads_run_ms: None,
            threads_wait_ms: None,
            intra_op_threads: None,
            cpus: None,
            nice: None,
            exiting: !forked,
            forked,
        };
        let figures = |o: &Option<ObservedProgram>| o.as_ref().map(|o| (o.steps, o.step_ms));
        let mut o = None;
        ObservedProgram::apply(&mut o, 3.0, &summary(5, 2.5, true));
        ObservedProgram::apply(&mut o, 3.1, &summary(1, 9.0, false));
        assert_eq!(figures(&o), Some((5, 2.5)));
        ObservedProgram::apply(&mut o, 4.0, &summary(10, 2.0, false));
        assert_eq!(figures(&o), Some((10, 2.0)));
        // The parent's own, then a child's copy of an older state: the parent's stays.
        ObservedProgram::apply(&mut o, 4.5, &summary(8, 7.0, true));
        assert_eq!(figures(&o), Some((10, 2.0)));
        // A rank's process started again counts from 0.
        ObservedProgram::apply(&mut o, 9.0, &summary(1, 3.0, false));
        assert_eq!(figures(&o), Some((1, 3.0)));
    }

    /// An entry's creation time and PyTorch's own duration are read where the dump has them; a
    /// zero time (none taken) and a dump without either (older ones) read as unknown.
    #[test]
    fn a_flight_entrys_creation_time_and_duration_are_read_where_the_dump_has_them() {
        let entry = |seq: u64, extra: &str| {
            format!(
                r#"{{"collective_seq_id": {seq}, "pg_id": 0, "process_group": ["0", "default_pg"],
                "profiling_name": "nccl:all_reduce", "input_sizes": [[4]], "input_dtypes": ["Float"],
                "state": "completed"{extra}}}"#
            )
        };
        let text = format!(
            r#"{{"entries": [{}, {}, {}]}}"#,
            entry(1, r#", "time_created_ns": 1796568387309692118, "duration_ms": 0.25"#),
            entry(2, r#", "time_created_ns": 0, "duration_ms": null"#),
            entry(3, ""),
        );
        let r = FlightRecord::from_dump(&text).unwrap();
        let times: Vec<_> = r.entries.iter().map(|e| (e.seq, e.created_ns, e.ms, e.at_s)).collect();
        assert_eq!(
            times,
            [
                (1, Some(1_796_568_387_309_692_118), Some(0.25), None),
                (2, None, None, None),
                (3, None, None, None)
            ]
        );
        // An entry written before these fields existed reads as one without them.
        let old = r#"{"group": "default_pg", "seq": 4, "op": "gloo:barrier", "sizes": []}"#;
        let e: FlightEntry = serde_json::from_str(old).unwrap();
        assert_eq!((e.created_ns, e.ms, e.at_s), (None, None, None));
    }
}
