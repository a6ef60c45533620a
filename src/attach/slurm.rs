//! `ups-doctor attach --slurm JOB[.STEP]`: a whole Slurm job from a login or batch host. Slurm's
//! `scontrol show job` names the job's nodes; `srun --jobid JOB --overlap` places one read-only probe
//! on each of them beside the job's tasks, without a new allocation (the way users hand-roll
//! `srun --overlap … py-spy dump` loops). Each probe (`attach --slurm-probe JOB[.STEP]`, hidden)
//! finds the step's tasks on its own host by their environment (`SLURM_JOB_ID`, `SLURM_STEP_ID`)
//! and is one node of a multi-node attach ([`super::nodes`]): node 0 at the first host of the
//! probes' node list gathers the others and writes the one report through the same judge as
//! `attach PID`. Nothing is signalled (`--then stop` is refused here: `scancel` is Slurm's way).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::nodes::NodeConfig;
use crate::nodes::config::{DEFAULT_PORT, NodeFlags, PORT_ENV, first_host};
use crate::scenario::launcher::SRUN;
use crate::{Error, exit};

use super::job;

/// What `attach --slurm` passes on to each probe (its own flags).
#[derive(Debug, Clone)]
pub struct Options {
    pub out: Option<PathBuf>,
    pub watch: f64,
    pub native: bool,
    pub join_timeout: f64,
    /// `--then stop` was given (refused here).
    pub stop: bool,
}

/// Where one probe attaches: the task it found, its node's folder, and its place among the
/// probes (`None` on a job of one node).
pub struct Probe {
    pub pid: u32,
    pub out: PathBuf,
    pub window: Duration,
    pub config: Option<NodeConfig>,
}

/// Slurm's launcher of steps, as the launcher table names it.
fn srun() -> &'static str {
    SRUN.programs[0]
}

/// A Slurm job, and one of its steps where given (`1234`, `1234.0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobStep {
    pub job: String,
    pub step: Option<String>,
}

impl JobStep {
    pub fn parse(flag: &str, text: &str) -> Result<JobStep, Error> {
        let bad = || {
            Error::BadInput(format!(
                "{flag} {text:?} is not a Slurm job id: give JOBID or JOBID.STEP (e.g. `{flag} 1234` or `{flag} 1234.0`, as squeue and sacct print them)"
            ))
        };
        let (job, step) = match text.trim().split_once('.') {
            Some((j, s)) => (j, Some(s)),
            None => (text.trim(), None),
        };
        let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !numeric(job) || step.is_some_and(|s| !numeric(s)) {
            return Err(bad());
        }
        Ok(JobStep { job: job.to_string(), step: step.map(str::to_string) })
    }

    fn text(&self) -> String {
        match &self.step {
            Some(s) => format!("{}.{s}", self.job),
            None => self.job.clone(),
        }
    }
}

/// What `scontrol show job -o` says of a job: its state, node list and node count.
#[derive(Debug, PartialEq, Eq)]
struct Placed {
    state: String,
    node_list: String,
    nodes: u32,
}

/// Reads one `scontrol show job -o` line (`Key=Value` fields separated by spaces).
fn placed(line: &str) -> Option<Placed> {
    let field = |key: &str| {
        line.split_whitespace().find_map(|f| f.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
    };
    Some(Placed {
        state: field("JobState")?.to_string(),
        node_list: field("NodeList")?.to_string(),
        nodes: field("NumNodes")?.split('-').next()?.parse().ok()?,
    })
}

/// Where the step to attach runs, from `scontrol show step -o JOB[.STEP]`'s lines: the step given,
/// else the job's one step started by srun (`JOB.0`), else its batch step where it has no other
/// (a script that runs the program itself); `None` where it has several steps (or Slurm said
/// none): then the job's nodes. A job step on fewer nodes than the job's left probes on nodes where
/// it has no task, which node 0 then waited for until `--join-timeout`.
fn step_nodes(lines: &str, step: Option<&str>) -> Option<(String, u32)> {
    let steps: Vec<(String, String, u32)> = lines
        .lines()
        .filter_map(|line| {
            let field = |key: &str| {
                line.split_whitespace().find_map(|f| f.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
            };
            let id = field("StepId")?.split_once('.')?.1.to_string();
            Some((id, field("NodeList")?.to_string(), field("Nodes")?.parse().ok()?))
        })
        .collect();
    let numbered: Vec<&(String, String, u32)> =
        steps.iter().filter(|(id, _, _)| id.bytes().all(|b| b.is_ascii_digit())).collect();
    let chosen = match step {
        Some(s) => steps.iter().find(|(id, _, _)| id == s),
        None if numbered.len() == 1 => numbered.first().copied(),
        None if numbered.is_empty() => steps.iter().find(|(id, _, _)| id == "batch"),
        None => None,
    };
    chosen.map(|(_, list, nodes)| (list.clone(), *nodes))
}

fn slurm_tool(name: &str) -> Error {
    Error::BadInput(format!(
        "`attach --slurm` runs Slurm's `{name}`, which is not on PATH here: run it on a host of the cluster where `squeue` works (a login node or the job's batch host)"
    ))
}

/// The login side: asks Slurm where the job runs, starts the probes there with `srun --overlap`
/// and waits for them; node 0's folder holds the report.
pub fn command(spec: &str, args: &Options) -> Result<u8, Error> {
    let target = JobStep::parse("--slurm", spec)?;
    if args.stop {
        return Err(Error::BadInput(
            "`--then stop` with `--slurm`: end a Slurm job with `scancel JOBID`; attach only reads it".into(),
        ));
    }
    let shown = Command::new("scontrol")
        .args(["show", "job", "-o", &target.job])
        .output()
        .map_err(|_| slurm_tool("scontrol"))?;
    let said = String::from_utf8_lossy(&shown.stdout);
    if !shown.status.success() {
        return Err(Error::BadInput(format!(
            "`scontrol show job {}` failed: {} (is {} a job of this cluster? `squeue --me` lists yours)",
            target.job,
            String::from_utf8_lossy(&shown.stderr).trim(),
            target.job
        )));
    }
    let Some(job) = said.lines().find_map(placed) else {
        return Err(Error::BadInput(format!(
            "`scontrol show job -o {}` printed no JobState, NodeList and NumNodes: {}",
            target.job,
            said.trim()
        )));
    };
    if job.state != "RUNNING" {
        return Err(Error::BadInput(format!(
            "Slurm job {} is {}: attach reads a job while it runs (nothing of it runs now)",
            target.job, job.state
        )));
    }
    let shown = Command::new("scontrol").args(["show", "step", "-o", &target.text()]).output();
    let said = shown.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    let (node_list, nodes) = step_nodes(&said, target.step.as_deref()).unwrap_or((job.node_list, job.nodes));
    let out = match &args.out {
        Some(dir) => dir.clone(),
        None => crate::session::fresh_run_dir(
            Path::new("reports/runs"),
            &format!("-attach-slurm-{}", target.job),
        )?,
    };
    std::fs::create_dir_all(&out).map_err(|source| Error::Io {
        what: "create",
        path: out.clone(),
        source,
    })?;
    let out = std::fs::canonicalize(&out).map_err(|source| Error::Io {
        what: "resolve",
        path: out.clone(),
        source,
    })?;
    let me = std::env::current_exe().map_err(|source| Error::Io {
        what: "find",
        path: PathBuf::from("/proc/self/exe"),
        source,
    })?;
    let mut probes = Command::new(srun());
    probes
        .arg(format!("--jobid={}", target.job))
        .args(["--overlap", "--ntasks-per-node=1", "--job-name=ups-doctor-attach"])
        .arg(format!("--nodes={nodes}"))
        .arg(format!("--nodelist={node_list}"))
        .arg(&me)
        .args(["attach", "--slurm-probe", &target.text(), "--out"])
        .arg(&out)
        .args(["--watch", &args.watch.to_string(), "--join-timeout", &args.join_timeout.to_string()]);
    if args.native {
        probes.arg("--native");
    }
    eprintln!(
        "attach: Slurm job {} runs on {} node(s) ({}): a probe on each through `srun --jobid={} --overlap`",
        target.text(),
        nodes,
        node_list,
        target.job
    );
    let status = probes.status().map_err(|_| slurm_tool(srun()))?;
    let report = node_out(&out, 0).join("report.md");
    if report.is_file() {
        eprintln!("the job's report (node 0): {}", report.display());
    } else {
        eprintln!(
            "no report at {}: node 0's probe wrote none there (is {} on a file system the job's nodes share?)",
            report.display(),
            out.display()
        );
    }
    Ok(match status.code() {
        Some(0) => exit::MET,
        Some(c) if (1..=255).contains(&c) => c as u8,
        _ => exit::NOT_MET,
    })
}

/// Node `n`'s folder below the one `attach --slurm` was given.
fn node_out(out: &Path, n: u32) -> PathBuf {
    out.join(format!("node{n}"))
}

/// One probe, started by [`command`]'s srun on one node of the job: finds the step's tasks on this
/// host and says where it attaches, as node `SLURM_NODEID` of `SLURM_STEP_NUM_NODES`.
pub fn probe(spec: &str, args: &Options) -> Result<Probe, Error> {
    let target = JobStep::parse("--slurm-probe", spec)?;
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let need = |k: &str| {
        env(k).ok_or_else(|| {
            Error::BadInput(format!(
                "`--slurm-probe` runs as a task of `attach --slurm`'s srun, which sets `{k}`; it is not set: use `ups-doctor attach --slurm {}`",
                target.text()
            ))
        })
    };
    let nodes: u32 = need("SLURM_STEP_NUM_NODES").or_else(|_| need("SLURM_NNODES"))?.parse().unwrap_or(1);
    let node: u32 = need("SLURM_NODEID")?.parse().unwrap_or(0);
    let list = need("SLURM_STEP_NODELIST").or_else(|_| need("SLURM_JOB_NODELIST"))?;
    let own_step = env("SLURM_STEP_ID");
    let host = crate::nodes::run::host_name();
    let pid = job::slurm_task(&target.job, target.step.as_deref(), own_step.as_deref())
        .map_err(|why| Error::BadInput(format!("Slurm job {} on {host}: {why}", target.text())))?;
    let base = args.out.clone().unwrap_or_else(|| PathBuf::from("."));
    let port = env(PORT_ENV).and_then(|p| p.parse::<u16>().ok()).unwrap_or(DEFAULT_PORT);
    let first = first_host(&list)
        .ok_or_else(|| Error::BadInput(format!("`SLURM_STEP_NODELIST={list}` names no host")))?;
    let flags = NodeFlags {
        nodes: Some(nodes),
        node_rank: Some(node),
        coordinator: Some(format!("{first}:{port}")),
        listen: None,
        join_timeout_s: Some(args.join_timeout),
    };
    let config = NodeConfig::resolve(&flags, &|_| None).map_err(|e| Error::BadInput(e.0))?;
    Ok(Probe {
        pid,
        out: node_out(&base, node),
        window: Duration::from_secs_f64(args.watch),
        config: config.filter(|c| c.nodes > 1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_id_with_or_without_its_step_is_read_and_anything_else_is_refused_with_the_form() {
        assert_eq!(JobStep::parse("--slurm", "1234").unwrap(), JobStep { job: "1234".into(), step: None });
        assert_eq!(
            JobStep::parse("--slurm", "1234.0").unwrap(),
            JobStep { job: "1234".into(), step: Some("0".into()) }
        );
        for bad in ["", "12a", "1234.", "1234.batch", "node1"] {
            let e = JobStep::parse("--slurm", bad).unwrap_err().to_string();
            assert!(e.contains("give JOBID or JOBID.STEP"), "{bad}: {e}");
        }
    }

    #[test]
    fn scontrols_one_line_form_gives_the_state_nodes_and_their_count() {
        // As `scontrol show job -o` of slurm-wlm 22.05 prints it (shortened: fields in its order).
        let line = "JobId=7 JobName=train UserId=root(0) JobState=RUNNING Reason=None NodeList=node[1-2] \
                    BatchHost=node1 NumNodes=2 NumCPUs=4 ReqNodeList=(null) ExcNodeList=(null)";
        assert_eq!(
            placed(line),
            Some(Placed { state: "RUNNING".into(), node_list: "node[1-2]".into(), nodes: 2 })
        );
        let pending = "JobId=8 JobState=PENDING Reason=Resources NodeList=(null) NumNodes=2-2";
        assert_eq!(placed(pending).map(|p| (p.state, p.nodes)), Some(("PENDING".into(), 2)));
        assert_eq!(placed("nothing here"), None);
    }

    #[test]
    fn the_probes_go_where_the_step_runs() {
        // As `scontrol show step -o 1` of slurm-wlm 22.05 prints it for a job of two nodes whose
        // batch script ran `srun -N 1 -n 1 sleep 60` (shortened: fields in its order).
        let two = "StepId=1.batch UserId=0 State=RUNNING Partition=debug NodeList=node1 Nodes=1 CPUs=0 Tasks=1 Name=batch\n\
                   StepId=1.0 UserId=0 State=RUNNING Partition=debug NodeList=node1 Nodes=1 CPUs=1 Tasks=1 Name=sleep\n";
        assert_eq!(step_nodes(two, None), Some(("node1".into(), 1)));
        assert_eq!(step_nodes(two, Some("0")), Some(("node1".into(), 1)));
        assert_eq!(step_nodes(two, Some("3")), None);
        let batch_only = "StepId=2.batch UserId=0 State=RUNNING NodeList=node2 Nodes=1 Tasks=1 Name=batch\n\
                          StepId=2.extern UserId=0 State=RUNNING NodeList=node[1-2] Nodes=2 Tasks=2 Name=extern";
        assert_eq!(step_nodes(batch_only, None), Some(("node2".into(), 1)));
        let several = "StepId=3.0 NodeList=node1 Nodes=1\nStepId=3.1 NodeList=node2 Nodes=1";
        assert_eq!(step_nodes(several, None), None, "the job's nodes, each probe finding its step");
        assert_eq!(step_nodes("", None), None);
    }
}
