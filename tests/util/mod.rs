//! Runs the real `ups-doctor` binary against purpose-built scenarios in a temporary folder.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod hosts;
pub mod slurm;

/// The binary under test.
/// The binary under test: the one cargo built, or `UPS_DOCTOR_BIN` when test binaries run on
/// another machine than the one that built them (`scripts/gpu-check.sh`).
pub fn bin() -> PathBuf {
    std::env::var_os("UPS_DOCTOR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_ups-doctor")))
}

/// The trainer executable the binary under test starts for built-in ranks: `UPS_DOCTOR_TRAINER`,
/// else `ups-doctor-trainer` beside [`bin`] (where cargo builds it).
pub fn trainer_bin() -> PathBuf {
    std::env::var_os("UPS_DOCTOR_TRAINER")
        .map(PathBuf::from)
        .unwrap_or_else(|| bin().with_file_name("ups-doctor-trainer"))
}

/// A scratch folder holding scenario files and the run's report folder.
pub struct Sandbox {
    pub dir: tempfile::TempDir,
}

/// A failing test's sandbox (its scenario, reports, logs, `result.json`) is kept and its path
/// printed: the evidence of a failure that happens once in several runs is otherwise gone.
/// `UPS_DOCTOR_KEEP_SANDBOX=1` keeps a passing test's too (to compare a pass with a failure).
impl Drop for Sandbox {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("UPS_DOCTOR_KEEP_SANDBOX").is_some_and(|v| v == "1") {
            let kept = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("temp dir")).keep();
            eprintln!("sandbox of the test kept: {}", kept.display());
        }
    }
}

impl Sandbox {
    pub fn new() -> Sandbox {
        Sandbox { dir: tempfile::tempdir().expect("temp dir") }
    }

    /// A sandbox outside `/tmp`, under cargo's temporary folder for tests: on every host of
    /// [`hosts::Hosts`] (each has a `/tmp` of its own) it is the same folder, as a cluster's shared
    /// file system is.
    pub fn shared() -> Sandbox {
        Sandbox { dir: tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir") }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes `scenarios/<name>.json` with `body` and returns its path.
    pub fn scenario(&self, name: &str, body: &str) -> PathBuf {
        let dir = self.path().join("scenarios");
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(format!("{name}.json"));
        std::fs::write(&file, body).unwrap();
        file
    }

    pub fn out(&self) -> PathBuf {
        self.path().join("out")
    }

    /// The run's `report.md` followed by every scenario's full report (`N-name/report.md`,
    /// written when the run had several scenarios and `report.md` is their summary).
    pub fn reports(&self) -> String {
        let out = self.out();
        let mut text = std::fs::read_to_string(out.join("report.md")).unwrap();
        let mut folders: Vec<PathBuf> =
            std::fs::read_dir(&out).unwrap().flatten().map(|e| e.path()).collect();
        folders.sort();
        for full in folders.iter().map(|f| f.join("report.md")).filter(|f| f.is_file()) {
            text.push_str(&std::fs::read_to_string(full).unwrap());
        }
        text
    }

    /// `ups-doctor` with the sandbox as working directory.
    pub fn cmd(&self) -> Command {
        let mut cmd = Command::new(bin());
        // The shell that runs the suite may set `PYTHONUNBUFFERED` (the one this was written in
        // did); ups-doctor leaves a user's value alone, so the commands would run with the
        // caller's buffering instead of ups-doctor's. A test that wants it sets it.
        cmd.current_dir(self.path()).env("NO_COLOR", "1").env_remove("PYTHONUNBUFFERED");
        cmd
    }

    /// `ups-doctor run FILES --out OUT --json --quiet ARGS`.
    pub fn run(&self, files: &[&Path], args: &[&str]) -> RunOutput {
        self.run_with(self.cmd(), files, args)
    }

    /// `ups-doctor run FILES …` with the PyTorch venv's `bin` first on `PATH`, for external
    /// commands (`python`, `torchrun`, `py-spy` are the venv's).
    pub fn run_in_venv(&self, files: &[&Path]) -> RunOutput {
        self.run_in_venv_with_env(files, &[])
    }

    /// `run_in_venv` with more variables in ups-doctor's environment (`SLURM_CONF` for srun).
    pub fn run_in_venv_with_env(&self, files: &[&Path], env: &[(&str, &std::ffi::OsStr)]) -> RunOutput {
        let mut cmd = self.cmd();
        cmd.env("PATH", venv_path()).envs(env.iter().copied());
        self.run_with(cmd, files, &[])
    }

    pub fn run_with(&self, mut cmd: Command, files: &[&Path], args: &[&str]) -> RunOutput {
        let output = cmd
            .arg("run")
            .args(files)
            .arg("--out")
            .arg(self.out())
            .args(["--json", "--quiet"])
            .args(args)
            .output()
            .expect("ups-doctor starts");
        let result = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
        // Every report a test produces is read back against its result.json (issue 30).
        let out = self.out();
        if out.join("result.json").is_file() && out.join("report.md").is_file() {
            let found = crate::consistency::check_run_dir(&out);
            assert!(found.is_empty(), "the report contradicts its result.json:\n{}", found.join("\n"));
        }
        RunOutput { output, result }
    }
}

pub struct RunOutput {
    pub output: Output,
    /// The `--json` result printed on stdout (`Null` if none).
    pub result: Value,
}

impl RunOutput {
    pub fn code(&self) -> i32 {
        self.output.status.code().unwrap_or(-1)
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    /// The only scenario's result.
    pub fn scenario(&self) -> &Value {
        let scenarios = self.result["scenarios"]
            .as_array()
            .unwrap_or_else(|| panic!("no result on stdout; stderr:\n{}", self.stderr()));
        assert_eq!(scenarios.len(), 1, "one scenario expected");
        &scenarios[0]
    }

    pub fn rank(&self, rank: usize) -> &Value {
        &self.scenario()["ranks"][rank]
    }
}

/// A tiny configuration that trains in about a second on a busy 2-core machine; `extra` is
/// spliced into the top-level object (`"inject": [...], "expect": {...}`).
pub fn tiny(extra: &str) -> String {
    let sep = if extra.trim().is_empty() { "" } else { "," };
    format!(
        r#"{{
  "model": {{ "depths": [1], "hidden": 32, "heads": 2, "latent_tokens": 8, "window": 2 }},
  "data": {{ "samples": 16, "grid": 64, "timesteps": 4, "queries": 32, "batch_size": 8 }},
  "train": {{ "steps": 8 }},
  "limits": {{ "timeout_s": 120, "hang_after_s": 60 }}{sep}
  {extra}
}}"#
    )
}

/// Whether a process with this pid exists (zombies count as gone).
pub fn alive(pid: u64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit(')').next().and_then(|s| s.split_whitespace().next());
            state != Some("Z")
        }
        Err(_) => false,
    }
}

/// Polls `cond` until it holds or `limit` passes; returns whether it held. The limit is a
/// generous upper bound, never an expectation about speed.
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    cond()
}

/// DDP of the built-in trainer over 4 CPU ranks (2 per node where run on two), 8 steps, a tiny
/// model; `extra`: more top-level fields (`"inject": …, "expect": …`).
pub fn ddp_four_ranks(sb: &Sandbox, name: &str, timeout_s: u32, hang_after_s: u32, extra: &str) -> PathBuf {
    let sep = if extra.is_empty() { "" } else { "," };
    sb.scenario(
        name,
        &format!(
            r#"{{
  "launch": {{ "mode": "ddp", "world_size": 4 }},
  "model": {{ "depths": [1], "hidden": 32, "heads": 2, "latent_tokens": 8, "window": 2 }},
  "data": {{ "samples": 16, "grid": 64, "timesteps": 4, "queries": 32, "batch_size": 8 }},
  "train": {{ "steps": 8 }},
  "limits": {{ "timeout_s": {timeout_s}, "hang_after_s": {hang_after_s} }}{sep}
  {extra}
}}"#
        ),
    )
}

/// The user's DDP program (`tests/programs/ddp.py`) under torchrun, 4 ranks, rank 3 segfaulting at
/// step 3: the scenario `name` of a run across two nodes (each node's torchrun runs 2).
pub fn torchrun_rank_3_segfaults(sb: &Sandbox, name: &str) -> PathBuf {
    sb.scenario(
        name,
        &format!(
            r#"{{"command": ["torchrun", "--nproc_per_node", "{{world_size}}", "{}", "--steps", "8", "--segv-rank", "3", "--segv-step", "3"],
                "launch": {{"world_size": 4, "style": "launcher"}},
                "limits": {{"timeout_s": 300, "hang_after_s": 150}},
                "expect": {{"outcome": "signaled", "signal": "SIGSEGV", "rank": 3}}}}"#,
            repo().join("tests/programs/ddp.py").display()
        ),
    )
}

/// Which of two nodes ran rank 3 of [`torchrun_rank_3_segfaults`]: the one whose torchrun names it
/// in its failure summary (`node_out(n)`: node `n`'s `--out`). torchrun's c10d rendezvous, not
/// `--node-rank`, decides which node runs which ranks.
pub fn node_of_rank_3(node_out: impl Fn(usize) -> PathBuf, name: &str) -> usize {
    (0..2)
        .find(|&n| {
            let log = node_out(n).join(format!("1-{name}/launcher.stderr.log"));
            std::fs::read_to_string(log).unwrap_or_default().contains("rank      : 3 (local_rank: 1)")
        })
        .expect("one node's torchrun names rank 3 in its failure summary")
}

/// The Python of the PyTorch 2.11 venv the tests of external programs run in: `UPS_DOCTOR_PYTHON`,
/// else the cache's default. Never skipped: a missing venv fails the test with the fix.
pub fn venv_python() -> PathBuf {
    if let Some(python) = std::env::var_os("UPS_DOCTOR_PYTHON") {
        return PathBuf::from(python);
    }
    let cache = std::env::var_os("UPS_DOCTOR_CACHE").map(PathBuf::from).unwrap_or_else(|| {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache"));
        base.join("ups-doctor")
    });
    let python = cache.join("pytorch-2.11.0/bin/python");
    assert!(
        python.is_file(),
        "no PyTorch venv at {} and UPS_DOCTOR_PYTHON is not set: run ./x test or ./x pytorch",
        python.display()
    );
    python
}

/// A port nobody listens on now, for a coordinator or a program's rendezvous.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A port on 127.0.0.1 that refuses every connection for as long as the returned socket lives.
///
/// A port from [`free_port`] that nobody binds is free for anyone while a test waits on it: another
/// test's store can bind it, and a connection to it can be given that very port as its own local
/// port and connect to itself (TCP's self-connect). Either way a client that should have been
/// refused talks to something. This socket is bound without `SO_REUSEADDR` and never listens, so the
/// kernel refuses connections to it and gives its port to no other socket.
pub fn refused_port() -> (std::os::fd::OwnedFd, u16) {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket calls on a descriptor this function owns; every result is checked.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let socket = std::os::fd::OwnedFd::from_raw_fd(fd);
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        addr.sin_family = libc::AF_INET as libc::sa_family_t;
        addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let bound = libc::bind(fd, (&raw const addr).cast(), len);
        assert_eq!(bound, 0, "bind: {}", std::io::Error::last_os_error());
        let mut got = len;
        let named = libc::getsockname(fd, (&raw mut addr).cast(), &mut got);
        assert_eq!(named, 0, "getsockname: {}", std::io::Error::last_os_error());
        (socket, u16::from_be(addr.sin_port))
    }
}

/// `PATH` with the venv's `bin` first, so that `python` and `torchrun` in a command are its own.
pub fn venv_path() -> std::ffi::OsString {
    let python = venv_python();
    let bin = python.parent().expect("python is in a bin folder").to_path_buf();
    let rest = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(&rest))).expect("PATH joins")
}

/// This repository's root (for `tests/programs/` and `python/`).
/// A test program's path: `tests/programs/NAME`.
pub fn program(name: &str) -> String {
    repo().join("tests/programs").join(name).display().to_string()
}

/// `ups-doctor run ARGS…` in `sb` with the test venv's python and torchrun first on `PATH`.
pub fn run_command(sb: &Sandbox, args: &[&str]) -> RunOutput {
    let mut cmd = sb.cmd();
    cmd.env("PATH", venv_path());
    sb.run_with(cmd, &[], args)
}

/// The lines of a scenario's verdict evidence.
pub fn evidence_of(s: &Value) -> Vec<String> {
    s["verdict"]["evidence"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e.as_str().map(String::from))
        .collect()
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Child processes of `pid`, from procfs.
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).ok().is_some_and(|stat| {
                let after = stat.rsplit(')').next().unwrap_or("");
                after.split_whitespace().nth(1).and_then(|pp| pp.parse::<u32>().ok()) == Some(pid)
            })
        })
        .collect()
}

/// A tmpfs of `size` mounted at a folder for one test (a full disk on demand; needs root),
/// unmounted when dropped.
pub struct SmallDisk(pub PathBuf);

impl SmallDisk {
    pub fn mount(at: PathBuf, size: &str) -> SmallDisk {
        std::fs::create_dir_all(&at).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&at)
            .status()
            .unwrap();
        assert!(status.success(), "mount -t tmpfs needs root");
        SmallDisk(at)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Every file below `dir` (links included, as files), in no particular order.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(path);
            } else {
                found.push(path);
            }
        }
    }
    found
}

/// Unpacks the `report --bundle` archive of the run folder `run_dir` into `into` (created) with
/// `tar`, and returns the files it held.
pub fn unpack_bundle(run_dir: &Path, into: &Path) -> Vec<PathBuf> {
    std::fs::create_dir_all(into).unwrap();
    let tar = Command::new("tar")
        .arg("-xzf")
        .arg(run_dir.join("ups-doctor-bundle.tar.gz"))
        .arg("-C")
        .arg(into)
        .status()
        .expect("tar runs");
    assert!(tar.success(), "tar could not unpack the bundle of {}", run_dir.display());
    files_under(into)
}
