//! `trace.json`: the run on one timeline, in the Chrome trace-event format (the JSON object form
//! with `traceEvents`), which Perfetto (<https://ui.perfetto.dev>), `chrome://tracing` and Chrome
//! DevTools open.
//!
//! Every rank is a process of the trace (named `rank N`, with its pid, and its node in a
//! multi-node run) whose first thread is the rank itself and whose other threads are its
//! data-loader workers, so each rank and each worker has a track of its own. On them:
//! - phases as complete slices (`X`), a phase that never ended drawn up to the rank's end and
//!   marked `open`; the training loop is one `train` slice (`result.json` folds the per-step
//!   phases into it; its args carry the steps done, the last step and, when it never ended, the
//!   phase the rank was last in), and inside it each step as a slice of its own (from the
//!   previous step's end to its own; one under way at the rank's end drawn to it, marked `open`);
//! - the rank's end (a signal, an exit code, a hang, a teardown by ups-doctor), the moment the
//!   hang was declared, a worker's start, an OOM kill and, for a command's rank, the moment its
//!   program had finished (its exit handlers ran: what ends after it ended as Python shut down)
//!   as instant events (`I`, thread scope), the backtrace, thread stacks or py-spy dump attached
//!   in `args`;
//! - a command's collectives, as the observer's ledger keeps them (the newest 32 of each rank),
//!   as slices on a track of their own beside the rank's (`all_gather #3`, from its issue for as
//!   long as it took; one the rank was still in drawn to its end, marked `open`), with their call
//!   site, shapes and dtype in `args`;
//! - a rank's Flight Recorder entries (`observed.flight`: every collective of every group, those
//!   issued from C++ included), where it handed them over, on a track of their own
//!   (`collectives (Flight Recorder)`, `gloo:all_reduce #4`) at the time PyTorch made each one
//!   (its wall-clock `time_created_ns`, put on the scenario's timeline by the harness): a slice as
//!   long as PyTorch timed it (NCCL with timing on), else an instant (gloo times none); `seq`,
//!   `group`, `sizes`, `dtypes` and `state` in `args`. Entries with no time that can be placed are
//!   listed on one instant at the rank's end that says so, never drawn at a time they did not have;
//! - each rank's PSS (with its workers) as a counter (`C`) on its process; `/dev/shm` and GPU
//!   samples as counters on a process of their own (`/dev/shm`, `GPU N`), so each has its own axis.
//!
//! Times are the scenario's timeline (seconds since it started; in a multi-node run node 0's
//! clock, onto which the merge put every node's evidence with the calibrated offsets, so the trace
//! is on the calibrated clock). Scenarios of one invocation follow each other on the trace.
//!
//! Pure: rendered from a [`RunResult`] only, like the markdown.

use serde_json::{Value, json};

use crate::protocol::Frame;
use crate::schema::{ProcessDump, RankResult, RunResult, ScenarioResult, ThreadStack};

/// The file beside `result.json`.
pub const TRACE_FILE: &str = "trace.json";

/// Microseconds between one scenario's end and the next one's start on the trace.
const GAP_US: f64 = 1_000_000.0;
/// Trace process ids of one scenario: rank `r` of scenario `i` is `(i + 1) * PER_SCENARIO + r`.
const PER_SCENARIO: u64 = 100_000;
/// The thread of a rank's own track; worker `w` is `WORKER_TID + w`.
const RANK_TID: u64 = 1;
/// The thread of a rank's collectives (the observer's ledger).
const COLLECTIVE_TID: u64 = 2;
/// The thread of a rank's collectives as PyTorch's Flight Recorder kept them.
const FLIGHT_TID: u64 = 3;
const WORKER_TID: u64 = 1_000;

/// The trace of `run`, as the JSON text `trace.json` holds (ending in a newline).
pub fn render_trace(run: &RunResult) -> String {
    let mut text = serde_json::to_string(&trace_value(run)).expect("a JSON value always encodes");
    text.push('\n');
    text
}

/// [`render_trace`]'s document, as the file sink writes it ([`super::files::write_json`]).
pub fn trace_value(run: &RunResult) -> serde_json::Value {
    let mut events = Vec::new();
    let mut offset_us = 0.0;
    for (i, s) in run.scenarios.iter().enumerate() {
        // Each rank's node, found once: a search of every node's ranks for each rank was
        // quadratic in the ranks.
        let nodes = s
            .nodes
            .iter()
            .flat_map(|n| n.per_node.iter().rev())
            .flat_map(|p| p.ranks.iter().map(move |r| (*r, p)))
            .collect();
        Scenario { s, index: i as u64, offset_us, multi: run.scenarios.len() > 1, nodes }.events(&mut events);
        offset_us += s.wall_s.max(0.0) * 1e6 + GAP_US;
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "tool": format!("ups-doctor {}", run.tool_version),
            "started_at": run.started_at,
            "command": run.command.join(" "),
            "clock": "seconds since each scenario started (multi-node: node 0's clock, calibrated)",
        },
    })
}

struct Scenario<'a> {
    s: &'a ScenarioResult,
    index: u64,
    offset_us: f64,
    multi: bool,
    nodes: std::collections::HashMap<u32, &'a crate::schema::NodeSection>,
}

impl Scenario<'_> {
    fn ts(&self, t_s: f64) -> f64 {
        // Whole microseconds: viewers sort by `ts`, and a float that does not print round-trips
        // oddly in some of them.
        (self.offset_us + t_s.max(0.0) * 1e6).round()
    }

    fn pid(&self, rank: u32) -> u64 {
        (self.index + 1) * PER_SCENARIO + u64::from(rank)
    }

    /// A process for what is not a rank (`/dev/shm`, GPUs), after the ranks.
    fn extra_pid(&self, n: u64) -> u64 {
        (self.index + 1) * PER_SCENARIO + 50_000 + n
    }

    fn prefix(&self) -> String {
        if self.multi { format!("{}: ", self.s.name) } else { String::new() }
    }

    /// The scenario's end: what a phase that never ended, or a rank with no end time, is drawn to.
    fn end_of(&self, r: &RankResult) -> f64 {
        r.ended_at_s.or(r.last_marker_at_s).unwrap_or(self.s.wall_s).max(0.0)
    }

    fn events(&self, out: &mut Vec<Value>) {
        let s = self.s;
        for r in &s.ranks {
            self.rank_events(r, out);
        }
        self.memory_events(out);
        self.gpu_events(out);
    }

    fn rank_events(&self, r: &RankResult, out: &mut Vec<Value>) {
        let pid = self.pid(r.rank);
        let node = self.nodes.get(&r.rank);
        let mut name = format!("{}rank {}", self.prefix(), r.rank);
        if let Some(node) = node {
            name.push_str(&format!(" (node {}, {})", node.node, node.host));
        }
        out.push(meta("process_name", pid, 0, json!({ "name": name })));
        out.push(meta("process_sort_index", pid, 0, json!({ "sort_index": pid })));
        let rank_thread = match r.pid {
            Some(p) => format!("rank {} (pid {p})", r.rank),
            None => format!("rank {}", r.rank),
        };
        out.push(meta("thread_name", pid, RANK_TID, json!({ "name": rank_thread })));
        out.push(meta("thread_sort_index", pid, RANK_TID, json!({ "sort_index": 0 })));
        for w in &r.workers {
            let tid = WORKER_TID + u64::from(w.id);
            let label = format!("worker {} (pid {}, {})", w.id, w.pid, w.start_method);
            out.push(meta("thread_name", pid, tid, json!({ "name": label })));
            out.push(meta("thread_sort_index", pid, tid, json!({ "sort_index": 2 + w.id })));
            out.push(instant(
                &format!("worker {} started ({})", w.id, w.start_method),
                "worker",
                self.ts(w.started_at_s),
                pid,
                tid,
                json!({ "pid": w.pid }),
            ));
        }
        let end = self.end_of(r);
        for span in &r.timeline {
            let stop = span.end_s.unwrap_or(end).max(span.start_s);
            let mut args = serde_json::Map::new();
            if span.end_s.is_none() {
                args.insert("open".into(), json!(true));
                args.insert("note".into(), json!("never ended: drawn up to the rank's end"));
            }
            if span.phase == "train" {
                args.insert("steps_done".into(), json!(r.steps_done));
                if let Some(step) = r.last_step {
                    args.insert("last_step".into(), json!(step));
                }
                if span.end_s.is_none()
                    && let Some(phase) = &r.last_phase
                {
                    args.insert("last_phase".into(), json!(phase));
                }
            }
            out.push(json!({
                "name": span.phase,
                "cat": "phase",
                "ph": "X",
                "ts": self.ts(span.start_s),
                "dur": (self.ts(stop) - self.ts(span.start_s)).max(0.0),
                "pid": pid,
                "tid": RANK_TID,
                "args": Value::Object(args),
            }));
        }
        self.step_events(r, end, pid, out);
        self.collective_events(r, end, pid, out);
        self.flight_events(r, end, pid, out);
        if let Some(at) = r.observed.as_ref().and_then(|o| o.exiting_at_s) {
            let args = json!({ "note": "the program's own code had finished: its exit handlers ran" });
            out.push(instant("program finished", "exit", self.ts(at), pid, RANK_TID, args));
        }
        if let (Some(at), Some(after)) =
            (super::text::hang_declared_at(r, self.s.wall_s), r.hang_detected_after_s)
        {
            let mut args = serde_json::Map::new();
            args.insert("silent_s".into(), json!(after));
            if let Some(phase) = &r.last_phase {
                args.insert("last_phase".into(), json!(phase));
            }
            attach_stacks(&mut args, r);
            out.push(instant("hang declared", "hang", self.ts(at), pid, RANK_TID, Value::Object(args)));
        }
        if let Some((what, args)) = end_event(r, super::text::hang_declared_at(r, self.s.wall_s).is_some())
            && let Some(at) = r.ended_at_s
        {
            out.push(instant(&what, "end", self.ts(at), pid, RANK_TID, args));
        }
        for kill in self.s.oom_kills.iter().filter(|k| k.rank == Some(r.rank)) {
            let Some(at) = kill.at_s else { continue };
            let tid = kill.worker.map_or(RANK_TID, |w| WORKER_TID + u64::from(w));
            let mut args = json!({ "pid": kill.pid });
            if let Some(rss) = kill.anon_rss_bytes {
                args["anon_rss_MiB"] = json!(mib(rss));
            }
            out.push(instant("killed by the OOM killer", "end", self.ts(at), pid, tid, args));
        }
    }

    /// The steps as slices inside `train`: each from the previous step's end (the first from
    /// `train`'s start) to its own; `steps a–b` where `result.json` thinned them. A step under way
    /// when the rank ended is drawn to its end, marked `open`.
    fn step_events(&self, r: &RankResult, end: f64, pid: u64, out: &mut Vec<Value>) {
        let Some(train) = r.timeline.iter().find(|p| p.phase == "train") else { return };
        let mut from = (train.start_s, r.step_ends_s.first().map_or(0, |&(s, _)| s));
        for (i, &(step, at)) in r.step_ends_s.iter().enumerate() {
            let first = if i == 0 { step } else { from.1 };
            let name = if first == step { format!("step {step}") } else { format!("steps {first}–{step}") };
            out.push(self.slice(&name, "step", from.0, at.max(from.0), pid, json!({ "step": step })));
            from = (at, step + 1);
        }
        if train.end_s.is_none() && !r.step_ends_s.is_empty() {
            let mut args = serde_json::Map::new();
            args.insert("open".into(), json!(true));
            args.insert("step".into(), json!(r.last_step.unwrap_or(from.1)));
            if let Some(phase) = &r.last_phase {
                args.insert("last_phase".into(), json!(phase));
            }
            let step = r.last_step.unwrap_or(from.1);
            out.push(self.slice(
                &format!("step {step}"),
                "step",
                from.0,
                end.max(from.0),
                pid,
                Value::Object(args),
            ));
        }
    }

    /// The observer's ledger (the newest collectives of a command's rank) on a track of its own:
    /// each collective from when the rank issued it for as long as it took; one the rank was
    /// still in drawn to the rank's end, marked `open`.
    fn collective_events(&self, r: &RankResult, end: f64, pid: u64, out: &mut Vec<Value>) {
        let Some(o) = &r.observed else { return };
        let timed: Vec<_> = o.ledger.iter().filter_map(|e| Some((e, e.at_s?))).collect();
        if timed.is_empty() {
            return;
        }
        let label = if o.collectives > timed.len() as u64 {
            format!("collectives (the newest {} of {})", timed.len(), o.collectives)
        } else {
            "collectives".to_string()
        };
        out.push(meta("thread_name", pid, COLLECTIVE_TID, json!({ "name": label })));
        out.push(meta("thread_sort_index", pid, COLLECTIVE_TID, json!({ "sort_index": 1 })));
        for (e, at) in timed {
            let mut args = serde_json::Map::new();
            for (key, value) in
                [("group", &e.group), ("shapes", &e.shapes), ("dtype", &e.dtype), ("site", &e.site)]
            {
                if !value.is_empty() {
                    args.insert(key.into(), json!(value));
                }
            }
            args.insert("seq".into(), json!(e.seq));
            let stop = match e.ms {
                Some(ms) => {
                    args.insert("ms".into(), json!(ms));
                    at + ms / 1000.0
                }
                None => {
                    args.insert("open".into(), json!(true));
                    args.insert("note".into(), json!("the rank was still in it: drawn up to the rank's end"));
                    end.max(at)
                }
            };
            let group = if e.group == "default" { String::new() } else { format!(" ({})", e.group) };
            let mut slice = self.slice(
                &format!("{} #{}{group}", e.op, e.seq),
                "collective",
                at,
                stop,
                pid,
                Value::Object(args),
            );
            slice["tid"] = json!(COLLECTIVE_TID);
            out.push(slice);
        }
    }

    /// The rank's Flight Recorder entries (every collective of every group, C++ ones included) on
    /// a track of their own: each at the time PyTorch made it, a slice as long as PyTorch timed it
    /// (NCCL with timing on) or an instant where it did not (gloo); the entries with no time that
    /// can be placed listed on one instant at the rank's end, which says so, not drawn anywhere.
    fn flight_events(&self, r: &RankResult, end: f64, pid: u64, out: &mut Vec<Value>) {
        let Some(f) = r.observed.as_ref().and_then(|o| o.flight.as_ref()) else { return };
        if f.entries.is_empty() {
            return;
        }
        out.push(meta("thread_name", pid, FLIGHT_TID, json!({ "name": "collectives (Flight Recorder)" })));
        out.push(meta("thread_sort_index", pid, FLIGHT_TID, json!({ "sort_index": 1 })));
        let mut untimed = Vec::new();
        for e in &f.entries {
            let mut name = format!("{}{} #{}", e.op, if e.p2p { " p2p" } else { "" }, e.seq);
            if e.group != "default_pg" {
                name.push_str(&format!(" ({})", e.group));
            }
            let Some(at) = e.at_s else {
                untimed.push(format!("{name}: {}", flight_args(e)));
                continue;
            };
            let args = flight_args(e);
            let mut event = match e.ms {
                Some(ms) => self.slice(&name, "flight", at, at + ms / 1000.0, pid, args),
                None => instant(&name, "flight", self.ts(at), pid, RANK_TID, args),
            };
            event["tid"] = json!(FLIGHT_TID);
            out.push(event);
        }
        if !untimed.is_empty() {
            let args = json!({
                "note": "PyTorch's recorder gave these no time that can be placed on the run's timeline: \
                         listed here, at the rank's end, not drawn where they happened",
                "entries": untimed,
            });
            let name = format!("{} Flight Recorder entries without a time", untimed.len());
            out.push(instant(&name, "flight", self.ts(end), pid, FLIGHT_TID, args));
        }
    }

    fn slice(&self, name: &str, cat: &str, start_s: f64, end_s: f64, pid: u64, args: Value) -> Value {
        json!({
            "name": name,
            "cat": cat,
            "ph": "X",
            "ts": self.ts(start_s),
            "dur": (self.ts(end_s) - self.ts(start_s)).max(0.0),
            "pid": pid,
            "tid": RANK_TID,
            "args": args,
        })
    }

    fn memory_events(&self, out: &mut Vec<Value>) {
        let Some(m) = &self.s.memory else { return };
        for p in &m.series {
            for (rank, &pss) in p.pss_bytes.iter().enumerate() {
                let pid = self.pid(rank as u32);
                out.push(counter(
                    "PSS (MiB, with its workers)",
                    self.ts(p.t_s),
                    pid,
                    json!({ "PSS": mib(pss) }),
                ));
            }
        }
        if m.series.iter().any(|p| p.shm_used_bytes.is_some()) {
            let pid = self.extra_pid(0);
            let name = match m.shm.total_bytes {
                Some(total) => format!("{}/dev/shm (of {:.1} MiB)", self.prefix(), mib(total)),
                None => format!("{}/dev/shm", self.prefix()),
            };
            out.push(meta("process_name", pid, 0, json!({ "name": name })));
            out.push(meta("process_sort_index", pid, 0, json!({ "sort_index": pid })));
            for p in &m.series {
                if let Some(used) = p.shm_used_bytes {
                    out.push(counter(
                        "/dev/shm used (MiB)",
                        self.ts(p.t_s),
                        pid,
                        json!({ "used": mib(used) }),
                    ));
                }
            }
        }
    }

    fn gpu_events(&self, out: &mut Vec<Value>) {
        let Some(g) = &self.s.gpu else { return };
        for (i, gpu) in g.gpus.iter().enumerate() {
            let pid = self.extra_pid(1 + i as u64);
            let name = format!("{}GPU {} ({})", self.prefix(), gpu.index, gpu.name);
            out.push(meta("process_name", pid, 0, json!({ "name": name })));
            out.push(meta("process_sort_index", pid, 0, json!({ "sort_index": pid })));
            for p in &g.series {
                let Some(v) = p.gpus.get(i) else { continue };
                let ts = self.ts(p.t_s);
                let mut activity = serde_json::Map::new();
                if let Some(u) = v.util_percent {
                    activity.insert("util".into(), json!(u));
                }
                if let Some(sm) = v.sm_active_percent {
                    activity.insert("sm_active".into(), json!(sm));
                }
                if !activity.is_empty() {
                    out.push(counter("GPU activity (%)", ts, pid, Value::Object(activity)));
                }
                if let Some(used) = v.memory_used_bytes {
                    out.push(counter("GPU memory used (MiB)", ts, pid, json!({ "used": mib(used) })));
                }
            }
        }
    }
}

/// The instant event of a rank's end, when it ended in a way worth marking: its name and args.
/// A stuck rank's stacks go on its "hang declared" event when that is drawn (`hang_drawn`), else
/// here.
fn end_event(r: &RankResult, hang_drawn: bool) -> Option<(String, Value)> {
    let sent = r.torn_down_with;
    let what = match (r.signal, r.exit_code) {
        (Some(sig), _) if sent == Some(sig) => format!("{} from ups-doctor", sig.name()),
        (Some(sig), _) => format!("killed by {}", sig.name()),
        (None, Some(0)) if sent.is_none() && r.error.is_none() => return None,
        (None, Some(code)) => format!("exited with code {code}"),
        // Its own end was not seen (a launcher's rank, a hung one torn down): what was sent.
        (None, None) if sent.is_some() => format!("{} sent by ups-doctor", sent?.name()),
        (None, None) => return None,
    };
    let mut args = serde_json::Map::new();
    args.insert("outcome".into(), json!(r.outcome));
    if let Some(phase) = &r.last_phase {
        args.insert("phase".into(), json!(phase));
    }
    if let Some(step) = r.last_step {
        args.insert("step".into(), json!(step));
    }
    if r.collateral {
        args.insert("collateral".into(), json!(true));
    }
    if let Some(error) = &r.error {
        args.insert("error".into(), json!(error));
    }
    if !r.backtrace.is_empty() {
        args.insert("stack".into(), json!(frame_lines(&r.backtrace)));
    } else if !r.raw_backtrace.is_empty() {
        args.insert("stack".into(), json!(r.raw_backtrace.join("\n")));
    }
    if !hang_drawn {
        attach_stacks(&mut args, r);
    }
    Some((what, Value::Object(args)))
}

/// A Flight Recorder entry's `args`: its place in its group's sequence, the group, the input
/// shapes and types, the state PyTorch last saw it in, and how long it took where PyTorch timed it.
fn flight_args(e: &crate::schema::FlightEntry) -> Value {
    let mut args = json!({ "seq": e.seq, "group": e.group, "sizes": e.sizes, "dtypes": e.dtypes });
    if !e.state.is_empty() {
        args["state"] = json!(e.state);
    }
    if e.p2p {
        args["p2p"] = json!(true);
    }
    if let Some(ms) = e.ms {
        args["ms"] = json!(ms);
    }
    args
}

/// A stuck rank's thread stacks and py-spy dumps, as text in `args`.
fn attach_stacks(args: &mut serde_json::Map<String, Value>, r: &RankResult) {
    if !r.stacks.is_empty() {
        let text: Vec<String> = r.stacks.iter().map(thread_text).collect();
        args.insert("stacks".into(), json!(text.join("\n\n")));
    }
    if !r.dumps.is_empty() {
        let text: Vec<String> = r.dumps.iter().map(dump_text).collect();
        args.insert("dumps".into(), json!(text.join("\n\n")));
    }
}

fn thread_text(t: &ThreadStack) -> String {
    format!("thread {} (tid {})\n{}", t.thread, t.tid, frame_lines(&t.frames))
}

fn dump_text(d: &ProcessDump) -> String {
    let body = d.py_spy.clone().or_else(|| d.python.clone()).or_else(|| d.error.clone()).unwrap_or_default();
    format!("{} (pid {})\n{body}", d.label(), d.pid)
}

fn frame_lines(frames: &[Frame]) -> String {
    frames
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let what = f.symbol.as_deref().map_or_else(|| f.addr.clone(), super::stack::demangle);
            match &f.location {
                Some(loc) => format!("#{i} {what} ({loc})"),
                None => format!("#{i} {what}"),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn meta(name: &str, pid: u64, tid: u64, args: Value) -> Value {
    json!({ "name": name, "ph": "M", "pid": pid, "tid": tid, "args": args })
}

/// A thread-scoped instant event. `I` is the phase Chromium's own tracing writes (the format's
/// document lists `i` too); Perfetto, `chrome://tracing` and DevTools all read `I`.
fn instant(name: &str, cat: &str, ts: f64, pid: u64, tid: u64, args: Value) -> Value {
    json!({ "name": name, "cat": cat, "ph": "I", "s": "t", "ts": ts, "pid": pid, "tid": tid, "args": args })
}

fn counter(name: &str, ts: f64, pid: u64, args: Value) -> Value {
    json!({ "name": name, "cat": "counter", "ph": "C", "ts": ts, "pid": pid, "tid": 0, "args": args })
}

fn mib(bytes: u64) -> f64 {
    (bytes as f64 / (1024.0 * 1024.0) * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures;

    fn events(run: &RunResult) -> Vec<Value> {
        let v: Value = serde_json::from_str(&render_trace(run)).unwrap();
        v["traceEvents"].as_array().unwrap().clone()
    }

    #[test]
    fn a_crash_has_a_track_per_rank_its_phases_and_the_death_with_its_stack() {
        let run = fixtures::run(vec![fixtures::segv()]);
        let s = &run.scenarios[0];
        let ev = events(&run);
        let names: Vec<&str> = ev
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .filter_map(|e| e["args"]["name"].as_str())
            .collect();
        for r in &s.ranks {
            assert!(names.iter().any(|n| n.starts_with(&format!("rank {}", r.rank))), "{names:?}");
        }
        let culprit = s.first_failure.unwrap();
        let r = s.ranks.iter().find(|r| r.rank == culprit).unwrap();
        let death = ev
            .iter()
            .find(|e| {
                e["ph"] == "I" && e["cat"] == "end" && e["pid"] == json!(PER_SCENARIO + u64::from(culprit))
            })
            .expect("the culprit's end is an instant event");
        assert_eq!(death["name"], format!("killed by {}", r.signal.unwrap().name()));
        assert_eq!(death["ts"], json!((r.ended_at_s.unwrap() * 1e6).round()));
        let first = r.backtrace[0].symbol.as_deref().unwrap_or(&r.backtrace[0].addr);
        assert!(death["args"]["stack"].as_str().unwrap().contains(first));
        let slices = ev.iter().filter(|e| e["ph"] == "X").count();
        assert_eq!(slices, s.ranks.iter().map(|r| r.timeline.len()).sum::<usize>());
    }

    #[test]
    fn a_hang_marks_the_moment_it_was_declared_and_the_open_phase() {
        let run = fixtures::run(vec![fixtures::hung()]);
        let s = &run.scenarios[0];
        let ev = events(&run);
        let hung = s.ranks.iter().find(|r| r.hang_detected_after_s.is_some()).unwrap();
        let declared = ev.iter().find(|e| e["name"] == "hang declared").expect("hang instant");
        let at = hung.last_marker_at_s.unwrap() + hung.hang_detected_after_s.unwrap();
        assert_eq!(declared["ts"], json!((at * 1e6).round()));
        if !hung.stacks.is_empty() {
            assert!(declared["args"]["stacks"].as_str().unwrap().contains(&hung.stacks[0].thread));
        }
        let open = hung.timeline.iter().filter(|p| p.end_s.is_none()).count();
        let drawn_open = ev.iter().filter(|e| e["ph"] == "X" && e["args"]["open"] == true).count();
        assert!(open > 0 && drawn_open >= open, "open phases {open}, drawn {drawn_open}");
    }

    #[test]
    fn memory_and_shm_are_counters_shm_on_its_own_process() {
        let run = fixtures::run(vec![fixtures::shm_bus_error()]);
        let m = run.scenarios[0].memory.as_ref().unwrap();
        let ev = events(&run);
        let pss =
            ev.iter().filter(|e| e["ph"] == "C" && e["name"].as_str().unwrap().starts_with("PSS")).count();
        assert_eq!(pss, m.series.iter().map(|p| p.pss_bytes.len()).sum::<usize>());
        let shm: Vec<&Value> =
            ev.iter().filter(|e| e["ph"] == "C" && e["name"] == "/dev/shm used (MiB)").collect();
        assert_eq!(shm.len(), m.series.iter().filter(|p| p.shm_used_bytes.is_some()).count());
        assert!(shm.iter().all(|e| e["pid"].as_u64().unwrap() > PER_SCENARIO + 1_000));
    }

    #[test]
    fn a_commands_collectives_are_slices_on_a_track_of_their_own_the_open_one_to_the_ranks_end() {
        let mut s = fixtures::hung();
        let r = &mut s.ranks[0];
        let end = r.ended_at_s.or(r.last_marker_at_s).unwrap_or(s.wall_s);
        let entry = |op: &str, seq: u64, at_s: Option<f64>, ms: Option<f64>| crate::schema::LedgerEntry {
            op: op.into(),
            group: "default".into(),
            seq,
            shapes: "4x4".into(),
            dtype: "float32".into(),
            site: "train.py:40".into(),
            ms,
            at_s,
            pos: None,
            span: None,
        };
        r.observed = Some(crate::schema::ObservedProgram {
            collectives: 40,
            ledger: vec![
                entry("all_reduce", 38, Some(0.5), Some(2.0)),
                entry("broadcast", 39, None, Some(1.0)),
                entry("all_gather", 40, Some(0.75), None),
            ],
            ..Default::default()
        });
        let ev = events(&fixtures::run(vec![s]));
        let track = ev
            .iter()
            .find(|e| e["name"] == "thread_name" && e["tid"] == json!(COLLECTIVE_TID))
            .expect("a track for the collectives");
        assert_eq!(track["args"]["name"], "collectives (the newest 2 of 40)");
        let slices: Vec<&Value> = ev.iter().filter(|e| e["cat"] == "collective").collect();
        assert_eq!(slices.len(), 2, "one without a time is not drawn: {slices:?}");
        assert!(slices.iter().all(|e| e["tid"] == json!(COLLECTIVE_TID) && e["ph"] == "X"));
        assert_eq!(
            (&slices[0]["name"], &slices[0]["ts"], &slices[0]["dur"]),
            (&json!("all_reduce #38"), &json!(500_000.0), &json!(2_000.0))
        );
        assert_eq!(slices[0]["args"]["site"], "train.py:40");
        assert_eq!(slices[1]["name"], "all_gather #40");
        assert_eq!(slices[1]["args"]["open"], true);
        assert_eq!(slices[1]["dur"], json!((end * 1e6).round() - 750_000.0));
    }

    #[test]
    fn flight_recorder_entries_are_on_a_track_of_their_own_at_the_time_pytorch_made_them() {
        let mut s = fixtures::hung();
        let r = &mut s.ranks[0];
        let end = r.ended_at_s.or(r.last_marker_at_s).unwrap_or(s.wall_s);
        let entry = |op: &str, group: &str, seq: u64, at_s: Option<f64>, ms: Option<f64>| {
            crate::schema::FlightEntry {
                group: group.into(),
                seq,
                p2p: false,
                op: op.into(),
                sizes: vec![vec![577]],
                dtypes: vec!["Float".into()],
                state: "scheduled".into(),
                created_ns: at_s.map(|_| 1_796_568_387_309_692_118),
                ms,
                at_s,
            }
        };
        r.observed = Some(crate::schema::ObservedProgram {
            flight: Some(crate::schema::FlightRecord {
                entries: vec![
                    entry("gloo:all_reduce", "default_pg", 4, Some(0.5), None),
                    entry("nccl:all_gather", "default_pg", 5, Some(0.625), Some(2.5)),
                    entry("gloo:broadcast", "1", 1, Some(0.75), None),
                    entry("gloo:barrier", "default_pg", 6, None, None),
                ],
                error: None,
            }),
            ..Default::default()
        });
        let ev = events(&fixtures::run(vec![s]));
        let track = ev
            .iter()
            .find(|e| e["name"] == "thread_name" && e["tid"] == json!(FLIGHT_TID))
            .expect("a track for the recorder's entries");
        assert_eq!(track["args"]["name"], "collectives (Flight Recorder)");
        let drawn: Vec<&Value> = ev.iter().filter(|e| e["cat"] == "flight").collect();
        assert!(
            drawn.iter().all(|e| e["tid"] == json!(FLIGHT_TID) && e["pid"] == track["pid"]),
            "{drawn:#?}"
        );
        let got: Vec<(&Value, &Value, &Value)> =
            drawn.iter().map(|e| (&e["name"], &e["ph"], &e["ts"])).collect();
        assert_eq!(
            got,
            [
                (&json!("gloo:all_reduce #4"), &json!("I"), &json!(500_000.0)),
                (&json!("nccl:all_gather #5"), &json!("X"), &json!(625_000.0)),
                (&json!("gloo:broadcast #1 (1)"), &json!("I"), &json!(750_000.0)),
                (
                    &json!("1 Flight Recorder entries without a time"),
                    &json!("I"),
                    &json!((end * 1e6).round())
                ),
            ]
        );
        assert_eq!(
            drawn[0]["args"],
            json!({ "seq": 4, "group": "default_pg", "sizes": [[577]], "dtypes": ["Float"], "state": "scheduled" })
        );
        assert_eq!((&drawn[1]["dur"], &drawn[1]["args"]["ms"]), (&json!(2_500.0), &json!(2.5)));
        let untimed = &drawn[3]["args"];
        assert!(untimed["note"].as_str().unwrap().contains("not drawn where they happened"), "{untimed}");
        let listed = untimed["entries"].as_array().unwrap();
        assert!(
            listed.len() == 1 && listed[0].as_str().unwrap().starts_with("gloo:barrier #6: "),
            "{untimed}"
        );
        // A rank whose recorder kept nothing (or was not asked) has no such track.
        assert_eq!(
            ev.iter().filter(|e| e["name"] == "thread_name" && e["tid"] == json!(FLIGHT_TID)).count(),
            1
        );
    }

    #[test]
    fn the_moment_a_commands_program_finished_is_marked_before_a_crash_at_exit() {
        let mut s = fixtures::segv();
        s.ranks[1].observed =
            Some(crate::schema::ObservedProgram { exiting_at_s: Some(1.25), ..Default::default() });
        let ev = events(&fixtures::run(vec![s]));
        let finished: Vec<&Value> = ev.iter().filter(|e| e["name"] == "program finished").collect();
        assert_eq!(finished.len(), 1, "only the rank whose observer said so: {finished:?}");
        assert_eq!((&finished[0]["ph"], &finished[0]["ts"]), (&json!("I"), &json!(1_250_000.0)));
        assert_eq!(
            finished[0]["pid"],
            ev.iter().find(|e| e["name"] == "process_name" && e["args"]["name"] == "rank 1").unwrap()["pid"]
        );
    }

    #[test]
    fn thinned_steps_are_slices_over_the_steps_they_stand_for() {
        let mut s = fixtures::passing();
        let r = &mut s.ranks[0];
        let train = r.timeline.iter().find(|p| p.phase == "train").unwrap().clone();
        let t = |d: f64| train.start_s + d;
        r.step_ends_s = vec![(0, t(0.1)), (2, t(0.2)), (4, t(0.3))];
        let ev = events(&fixtures::run(vec![s]));
        let steps: Vec<&str> =
            ev.iter().filter(|e| e["cat"] == "step").filter_map(|e| e["name"].as_str()).collect();
        assert_eq!(steps, ["step 0", "steps 1–2", "steps 3–4"]);
    }
}
