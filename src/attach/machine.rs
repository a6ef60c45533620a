//! What one machine's window saw of a job, judged and written: the job's processes watched
//! ([`Local::observe`]), the evidence before the judge's, the judge's verdict on one machine's ranks
//! or every node's ([`Judging`]), and the run folder (`result.json`, `report.md`, `attach.json`).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::json;

use crate::Error;
use crate::harness::ptrace_refused as refused;
use crate::scenario::{LaunchStyle, OutcomeKind, Scenario};
use crate::schema::{
    ExternalRun, ExternalStyle, ProcessDump, ProcessRole, RunResult, ScenarioResult, Verdict,
};

use super::judge::{self, Motion, State, Window};
use super::{gpu, job, stop, tcp, watch};

/// The one message for stacks that cannot be read, with the fix.
fn ptrace_hint(pids: &[u32]) -> String {
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    format!(
        "stacks cannot be read: py-spy was refused access to pid {} ({}",
        list.join(", "),
        crate::harness::ptrace_fix("`ups-doctor attach`")
    )
}

fn size(bytes: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    if bytes as f64 >= 1024.0 * MIB {
        format!("{:.2} GiB", bytes as f64 / (1024.0 * MIB))
    } else {
        format!("{:.1} MiB", bytes as f64 / MIB)
    }
}

/// The last look at every process below a rank (its DataLoader workers), as dumps of that rank.
fn child_dumps(job: &job::Job, watched: &[watch::Watched]) -> Vec<(u32, ProcessDump)> {
    job.ranks
        .iter()
        .flat_map(|r| r.children.iter().map(move |&c| (r.rank, c)))
        .filter_map(|(rank, c)| {
            let w = watched.iter().find(|w| w.pid == c)?;
            let last = w.looks.last()?;
            Some((
                rank,
                ProcessDump {
                    pid: c,
                    rank,
                    role: ProcessRole::Child,
                    taken: Some(judge::TAKEN.to_string()),
                    py_spy: last.py_spy.clone(),
                    error: last.error.clone(),
                    python: None,
                    threads: last.threads.clone(),
                },
            ))
        })
        .collect()
}

/// What an attach saw, for the evidence it puts before the judge's.
struct Seen<'a> {
    pid: u32,
    job: &'a job::Job,
    watched: &'a [watch::Watched],
    started_at: &'a str,
    window_s: f64,
    looks: u32,
    native: bool,
}

impl Seen<'_> {
    /// When and how the job was read, what was found, what could not be read, memory and
    /// `/dev/shm`: the lines before the judge's evidence.
    fn evidence(&self, found: &[u32], of: &str, refused_pids: &[u32], shm: &watch::Shm) -> Vec<String> {
        let mut front = vec![format!(
            "attached at {} to a job already running (not started under ups-doctor), found from pid {}; \
             watched {:.1} s, {} looks at each of its {} processes; read-only: no signal sent, nothing written \
             into its processes; stacks by {}",
            self.started_at,
            self.pid,
            self.window_s,
            self.looks,
            self.watched.len(),
            if self.native {
                "`py-spy dump --native` (each process paused while read)"
            } else {
                "`py-spy dump --nonblocking` (never stopped)"
            }
        )];
        front.push(format!(
            "the job: {}{}; {}{of} found here{}",
            match self.job.launcher {
                Some(l) => format!("launcher pid {l}"),
                None => "no launcher (ranks started one by one)".to_string(),
            },
            self.job.master.as_ref().map(|m| format!(", MASTER_ADDR:PORT {m}")).unwrap_or_default(),
            judge::ranks_text(found),
            self.job.run_id.as_ref().map(|r| format!(", TORCHELASTIC_RUN_ID {r}")).unwrap_or_default()
        ));
        if !refused_pids.is_empty() {
            let hint = ptrace_hint(refused_pids);
            eprintln!("warning: {hint}");
            front.push(hint);
        }
        if !self.job.unreadable.is_empty() {
            front.push(format!(
                "environments not readable (another user's processes), so not judged as ranks: pid {}",
                self.job.unreadable.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
            ));
        }
        for r in &self.job.ranks {
            let mem = |p: u32| self.watched.iter().find(|w| w.pid == p).and_then(|w| w.memory);
            if let Some(m) = mem(r.pid) {
                let kids: Vec<_> = r.children.iter().filter_map(|&c| mem(c)).collect();
                let workers = if kids.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; {} process(es) below it (DataLoader workers?) PSS {} together",
                        kids.len(),
                        size(kids.iter().map(|k| k.pss).sum())
                    )
                };
                front.push(format!(
                    "rank {} memory: PSS {}, USS {}{workers}",
                    r.rank,
                    size(m.pss),
                    size(m.uss)
                ));
            }
        }
        front.push(format!(
            "/dev/shm: {} of {} used, {} file(s)",
            size(shm.used),
            size(shm.total),
            shm.segments.len()
        ));
        front
    }

    /// `attach.json`: the state, every process as seen (state at the first and last look, CPU used,
    /// memory, py-spy's refusals), the ranks' classes and what nothing was sent to.
    #[expect(
        clippy::too_many_arguments,
        reason = "the parts of one attach's findings, each computed once by attach_one"
    )]
    fn record(
        &self,
        state: State,
        culprit: Option<u32>,
        found: &[u32],
        missing: &[u32],
        views: &[judge::RankView],
        refused_pids: &[u32],
        shm: &watch::Shm,
    ) -> serde_json::Value {
        let processes: Vec<serde_json::Value> = self
            .watched
            .iter()
            .map(|w| {
                let role = if Some(w.pid) == self.job.launcher {
                    json!({"role": "launcher"})
                } else if let Some(r) = self.job.ranks.iter().find(|r| r.pid == w.pid) {
                    json!({"role": "rank", "rank": r.rank})
                } else {
                    let r = self.job.ranks.iter().find(|r| r.children.contains(&w.pid)).map(|r| r.rank);
                    json!({"role": "child", "rank": r})
                };
                json!({
                    "pid": w.pid,
                    "who": role,
                    "state_first": w.looks.first().and_then(|l| l.state).map(String::from),
                    "state_last": w.looks.last().and_then(|l| l.state).map(String::from),
                    "cpu_used_s": w.cpu_used_s(),
                    "pss": w.memory.map(|m| m.pss),
                    "uss": w.memory.map(|m| m.uss),
                    "py_spy_errors": w.looks.iter().filter_map(|l| l.error.clone()).collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({
            "attached_to": self.pid,
            "state": state.as_str(),
            "attached_at": self.started_at,
            "window_s": self.window_s,
            "looks": self.looks,
            "native": self.native,
            "signalled": [],
            "launcher": self.job.launcher,
            "command": self.job.command,
            "world_size": self.job.world_size,
            "local_world_size": self.job.local_world_size,
            "master": self.job.master,
            "torchelastic_run_id": self.job.run_id,
            "ranks_found": found,
            "ranks_missing": missing,
            "culprit": culprit,
            "ranks": views.iter().map(|v| json!({
                "rank": v.rank, "pid": v.pid, "motion": v.motion.as_str(), "cpu_used_s": v.cpu_s,
                "place": v.place(), "stack_looks": v.looks,
            })).collect::<Vec<_>>(),
            "classes": judge::classes(views).iter().map(|(ranks, place, motion)| json!({
                "ranks": ranks, "place": place, "motion": motion,
            })).collect::<Vec<_>>(),
            "unreadable": self.job.unreadable,
            "stacks_refused": refused_pids,
            "dev_shm": {"used": shm.used, "total": shm.total, "files": shm.segments.len()},
            "processes": processes,
        })
    }
}

/// What one machine's window saw of the job, before it is judged.
pub(super) struct Local {
    pub(super) pid: u32,
    pub(super) job: job::Job,
    pub(super) started_at: String,
    /// When the window began (ns since the Unix epoch, this machine's clock).
    pub(super) started_ns: i64,
    pub(super) window_s: f64,
    pub(super) looks: u32,
    pub(super) native: bool,
    pub(super) py_spy: Option<PathBuf>,
    pub(super) watched: Vec<watch::Watched>,
    pub(super) shm: watch::Shm,
    pub(super) views: Vec<judge::RankView>,
    pub(super) children: Vec<(u32, ProcessDump)>,
    pub(super) refused_pids: Vec<u32>,
    pub(super) connections: tcp::Connections,
    /// Every GPU of this machine over the window (NVML), the job's processes on it labelled.
    pub(super) gpu: crate::schema::GpuReport,
    /// This machine's facts, read once (it starts Python) however many times the job is judged.
    pub(super) environment: std::sync::OnceLock<crate::schema::EnvSummary>,
}

/// What the judge is given: one machine's ranks, or every node's.
pub(super) struct Judging {
    pub(super) views: Vec<judge::RankView>,
    pub(super) children: Vec<(u32, ProcessDump)>,
    pub(super) missing: Vec<u32>,
    /// How each rank was told (`RANK`, spawn order, …), on whichever node it was found.
    pub(super) identified: Vec<(u32, crate::schema::IdentifiedBy)>,
    pub(super) world: Option<u32>,
    /// Where ranks not found were looked for (`on this machine`).
    pub(super) scope: String,
    /// The evidence before the judge's.
    pub(super) front: Vec<String>,
    pub(super) nodes: Option<crate::schema::NodesReport>,
}

impl Judging {
    /// This machine's ranks alone, as a single attach (or a node's own report) judges them.
    pub(super) fn alone(local: &Local) -> Judging {
        Judging {
            views: local.views.clone(),
            children: local.children.clone(),
            missing: local.job.missing(),
            identified: local.identified(),
            world: local.job.world_size,
            scope: judge::HERE.to_string(),
            front: local.front(),
            nodes: None,
        }
    }
}

impl Local {
    /// Watches every process of `job` over `window`, read-only.
    pub(super) fn observe(pid: u32, job: job::Job, window: Duration, native: bool) -> Local {
        let started = SystemTime::now();
        let started_ns = crate::nodes::clock::now_ns();
        let started_at = humantime::format_rfc3339_seconds(started).to_string();
        let py_spy = crate::harness::find_py_spy(watch::program_of(job.ranks[0].pid).as_deref());
        let found: Vec<u32> = job.ranks.iter().map(|r| r.rank).collect();
        let of = job.world_size.map(|w| format!(" of WORLD_SIZE {w}")).unwrap_or_default();
        eprintln!(
            "attaching to {} (pid {}): {}{of}; watching {:.1} s, read-only",
            job.command.iter().map(|a| a.rsplit('/').next().unwrap_or(a)).collect::<Vec<_>>().join(" "),
            job.launcher.unwrap_or(job.ranks[0].pid),
            judge::ranks_text(&found),
            window.as_secs_f64()
        );
        let options = watch::Options { window, looks: 4, native, py_spy: py_spy.clone() };
        let gpus = std::thread::Builder::new().name("gpu".into()).spawn(move || gpu::watch(window));
        let watched = watch::watch(&job.pids(), &options);
        let gpu = gpu::report(
            match gpus.map(|thread| thread.join()) {
                Ok(Ok(watched)) => watched.map_err(gpu::Unwatched::from),
                Ok(Err(_)) => Err(gpu::Unwatched::Panicked),
                Err(e) => Err(gpu::Unwatched::NoThread(e)),
            },
            &job,
        );
        let shm = watch::dev_shm();
        let window_s = window.as_secs_f64();
        let rank_pids: Vec<(u32, u32)> = job.ranks.iter().map(|r| (r.rank, r.pid)).collect();
        let views = judge::view(&rank_pids, &watched, window_s);
        let children = child_dumps(&job, &watched);
        // What the window could not read: named, with the fix once.
        let refused_pids: Vec<u32> = watched
            .iter()
            .filter(|w| w.looks.iter().any(|l| l.error.as_deref().is_some_and(refused)))
            .map(|w| w.pid)
            .collect();
        let connections = tcp::read(&job);
        Local {
            pid,
            job,
            started_at,
            started_ns,
            window_s,
            looks: options.looks,
            native,
            py_spy,
            watched,
            shm,
            views,
            children,
            refused_pids,
            connections,
            gpu,
            environment: std::sync::OnceLock::new(),
        }
    }

    /// How each rank of this machine was told.
    pub(super) fn identified(&self) -> Vec<(u32, crate::schema::IdentifiedBy)> {
        self.job.ranks.iter().map(|r| (r.rank, r.by)).collect()
    }

    fn found(&self) -> Vec<u32> {
        self.job.ranks.iter().map(|r| r.rank).collect()
    }

    fn seen(&self) -> Seen<'_> {
        Seen {
            pid: self.pid,
            job: &self.job,
            watched: &self.watched,
            started_at: &self.started_at,
            window_s: self.window_s,
            looks: self.looks,
            native: self.native,
        }
    }

    /// This machine's evidence before the judge's: how the job was read, memory, `/dev/shm`,
    /// its connections.
    pub(super) fn front(&self) -> Vec<String> {
        let found = self.found();
        let of = self.job.world_size.map(|w| format!(" of WORLD_SIZE {w}")).unwrap_or_default();
        let mut front = self.seen().evidence(&found, &of, &self.refused_pids, &self.shm);
        let expected: Vec<u32> = found.iter().chain(&self.job.missing()).copied().collect();
        front.extend(self.connections.sentence(&expected));
        front
    }

    /// The job as a scenario: its command, its world, its launch style.
    fn scenario(&self, world: Option<u32>, nodes: u32) -> Scenario {
        Scenario {
            name: format!("attach-{}", self.pid),
            command: Some(self.job.command.clone()),
            launch: crate::scenario::Launch {
                world_size: world.unwrap_or(self.job.ranks.len() as u32),
                nodes,
                style: if self.job.launcher.is_some() { LaunchStyle::Launcher } else { LaunchStyle::PerRank },
                ..Default::default()
            },
            ..Scenario::default()
        }
    }

    /// Judges `what` (this machine's ranks, or every node's) and makes the run's result and
    /// `attach.json`.
    pub(super) fn judge(&self, what: Judging) -> (State, RunResult, serde_json::Value) {
        let Judging { views, children, missing, identified, world, scope, front, nodes } = what;
        let scenario = self.scenario(world, nodes.as_ref().map_or(1, |n| n.nodes));
        let window_s = self.window_s;
        let pid = self.pid;
        let external = ExternalRun {
            argv: self.job.command.clone(),
            style: if self.job.launcher.is_some() { ExternalStyle::Launcher } else { ExternalStyle::PerRank },
            style_chosen: Some(format!(
                "attached to a running job from pid {pid}: ups-doctor did not start it"
            )),
            markers_seen: false,
            observer_silent: false,
            completion: String::new(),
            launcher: None,
            py_spy: self.py_spy.as_ref().map(|p| p.display().to_string()),
            world_size_declared: None,
        };
        let mut result = ScenarioResult {
            name: scenario.name.clone(),
            file: format!("(attached to pid {pid})"),
            overrides: Vec::new(),
            scenario,
            // Written by the judge below, ranks included (their outcome is the window's).
            outcome: OutcomeKind::Passed,
            met_expectation: false,
            interrupted: false,
            expectation_mismatches: Vec::new(),
            verdict: Verdict::unjudged(),
            first_failure: None,
            ranks: Vec::new(),
            wall_s: window_s,
            steps_per_s: None,
            samples_per_s: None,
            memory: None,
            leftovers: Default::default(),
            // One machine's GPUs; a merge of several nodes' windows has no GPU report (each
            // node's own report has its own).
            gpu: nodes.is_none().then(|| self.gpu.clone()),
            external: Some(external),
            cgroup: None,
            oom_kills: Vec::new(),
            xids: Vec::new(),
            cgroup_unavailable: None,
            nodes,
        };
        let window = Window {
            views: &views,
            missing: &missing,
            world,
            children: &children,
            scope: &scope,
            front: &front,
        };
        crate::diagnose::conclude(&mut result, crate::diagnose::Seen::Attached(&window));
        let state = State::of(result.outcome);
        if let Some(e) = result.external.as_mut() {
            e.completion = format!("attached read-only for {window_s:.1} s (state {})", state.as_str());
        }
        for r in &mut result.ranks {
            r.identified_by = identified.iter().find(|(rank, _)| *rank == r.rank).map(|(_, by)| *by);
        }
        let run = RunResult {
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            started_at: self.started_at.clone(),
            command: std::env::args().collect(),
            environment: self
                .environment
                .get_or_init(|| crate::probe::machine(&crate::probe::Needs { python: true, trainer: None }))
                .clone(),
            scenarios: vec![result],
            not_run: Vec::new(),
            interrupted: false,
            stopped_by: None,
            logs_cut: Vec::new(),
        };
        let found: Vec<u32> = views.iter().map(|v| v.rank).collect();
        let culprit = run.scenarios[0].first_failure;
        let mut attach =
            self.seen().record(state, culprit, &found, &missing, &views, &self.refused_pids, &self.shm);
        attach["tcp"] = json!(self.connections);
        (state, run, attach)
    }
}

/// The headline, the ranks of `views` whose stacks could not be read, and where the report is.
pub(super) fn tell(run: &RunResult, views: &[judge::RankView], report: &Path) {
    for s in &run.scenarios {
        eprintln!("{}", s.verdict.headline);
    }
    for v in views.iter().filter(|v| v.motion == Motion::Unread) {
        eprintln!("  rank {} (pid {}): stack unreadable", v.rank, v.pid);
    }
    eprintln!("report: {}", report.display());
}

/// `--then stop`, once the evidence is on disk (whatever stopping does, it stays): stops the job
/// and writes the run folder again with what was sent to whom.
pub(super) fn stop_and_record(
    out: &Path,
    run: &mut RunResult,
    attach: &mut serde_json::Value,
    heads: &[crate::harness::os::owner::Identity],
    everyone: &[crate::harness::os::owner::Identity],
) -> Result<PathBuf, Error> {
    let stopped = stop::stop(heads, everyone, stop::TERM_GRACE);
    eprintln!("{}", stopped.sentence());
    run.scenarios[0].verdict.evidence.push(stopped.sentence());
    attach["signalled"] = json!(stopped.termed.iter().chain(&stopped.killed).collect::<Vec<_>>());
    attach["stopped"] = json!({
        "sigterm": stopped.termed, "sigkill": stopped.killed, "survivors": stopped.survivors,
        "took_s": stopped.took_s,
    });
    write_attach(out, run, attach)
}

/// Writes the run folder (result.json, report.md, trace.json) and attach.json; the report's path.
pub(super) fn write_attach(
    out: &Path,
    run: &RunResult,
    attach: &serde_json::Value,
) -> Result<PathBuf, Error> {
    let report = crate::report::write_run(out, run)?;
    crate::report::write_json(&out.join("attach.json"), attach, true)?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn py_spys_refusals_give_one_message_with_the_fix() {
        assert!(refused("Error: Permission denied (os error 13)"));
        assert!(refused("Error: Operation not permitted (os error 1)"));
        assert!(!refused("Error: Failed to find python version from target process"));
        let hint = ptrace_hint(&[12, 34]);
        assert!(hint.starts_with("stacks cannot be read: py-spy was refused access to pid 12, 34"), "{hint}");
        assert!(hint.contains("--cap-add SYS_PTRACE") && hint.contains("kernel.yama.ptrace_scope"), "{hint}");
    }
}
