//! Hosts of their own on this machine (scripts/hosts.sh): a group of network, UTS, PID, IPC and
//! mount namespaces, one per host, on a private bridge, for the tests that cross a network.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use super::repo;

/// A group of hosts `node1..nodeN` (addresses 10.251.0.11.., names in each host's /etc/hosts),
/// stopped when dropped: every process left on them is killed with its host's PID namespace.
pub struct Hosts {
    group: String,
    pub count: u32,
    /// `SLURM_CONF` of the cluster across the hosts, when started with Slurm.
    pub slurm_conf: Option<PathBuf>,
}

static GROUPS: AtomicU32 = AtomicU32::new(0);

fn script() -> PathBuf {
    repo().join("scripts/hosts.sh")
}

impl Hosts {
    /// `count` hosts, with a Slurm cluster across them when `slurm` (slurmctld on node1, one slurmd
    /// per host). `None`, after saying why, where this machine cannot make them (not root; no
    /// Slurm for a test that needs it and `./x test` did not promise one).
    pub fn up(test: &str, count: u32, slurm: bool) -> Option<Hosts> {
        // SAFETY: geteuid(2) has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("{test}: skipped: hosts of their own need root (network, PID and mount namespaces)");
            return None;
        }
        if slurm && Command::new("slurmd").arg("-V").output().is_err() {
            assert!(
                std::env::var_os("UPS_DOCTOR_SLURM").is_none_or(|v| v != "1"),
                "./x test installed slurm-wlm, but slurmd does not run"
            );
            eprintln!("{test}: skipped: no slurmd (apt-get install slurm-wlm; `./x test` does)");
            return None;
        }
        let group = format!("{:x}{}", std::process::id(), GROUPS.fetch_add(1, Ordering::Relaxed));
        assert!(group.len() <= 8, "group name {group}");
        let mut cmd = Command::new(script());
        cmd.args(["start", &group, &count.to_string()]);
        if slurm {
            cmd.arg("--slurm");
        }
        // What the hosts share with this machine when it lies under /tmp (each host has its own):
        // the checkout, the binaries, the tests' shared folders, the cache of venvs and libtorch
        // (`…/ups-doctor`, three folders above the venv's python).
        let python = super::venv_python();
        let cache = python.ancestors().nth(3).map(std::path::Path::to_path_buf).unwrap_or_default();
        let share = [
            super::repo(),
            super::bin().parent().map(std::path::Path::to_path_buf).unwrap_or_default(),
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
            cache,
        ];
        let share =
            std::env::join_paths(share.iter().filter(|p| !p.as_os_str().is_empty())).expect("paths join");
        let out = cmd
            .env("UPS_DOCTOR_HOSTS_OWNER", std::process::id().to_string())
            .env("UPS_DOCTOR_HOSTS_SHARE", share)
            .output()
            .expect("hosts.sh runs");
        let mut hosts = Hosts { group, count, slurm_conf: None };
        assert!(
            out.status.success(),
            "scripts/hosts.sh start {} {count}: {:?}\n{}",
            hosts.group,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        hosts.slurm_conf = slurm.then(|| hosts.dir().join("slurm/slurm.conf"));
        Some(hosts)
    }

    fn dir(&self) -> PathBuf {
        std::env::var_os("UPS_DOCTOR_HOSTS_DIR")
            .map_or_else(|| PathBuf::from("/run/ups-doctor-hosts"), PathBuf::from)
            .join(&self.group)
    }

    /// `CMD` run on `host` (`node1`…), in the caller's working directory: configure it further
    /// (arguments, environment, folder) and start it.
    pub fn on(&self, host: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(script());
        cmd.args(["exec", &self.group, host, "--"]).arg(program);
        cmd
    }

    /// The pid (as this test sees it) of `host`'s first process, which holds its namespaces.
    fn init(&self, host: &str) -> u32 {
        std::fs::read_to_string(self.dir().join(format!("{host}.pid"))).unwrap().trim().parse().unwrap()
    }

    /// The processes running on `host` now other than its first one: `(pid, comm)`.
    pub fn processes(&self, host: &str) -> Vec<(u32, String)> {
        let init = self.init(host);
        let ns = |pid: u32| std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
        let theirs = ns(init).expect("the host's first process runs");
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|&pid| pid != init && ns(pid).as_ref() == Some(&theirs))
            .filter_map(|pid| {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
                let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                // A zombie is dead (its host's first process reaps it).
                let zombie = state.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z'));
                (!zombie).then(|| (pid, comm.trim().to_string()))
            })
            .collect()
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let out = Command::new(script()).args(["stop", &self.group]).output();
        if !out.as_ref().is_ok_and(|o| o.status.success()) {
            eprintln!("scripts/hosts.sh stop {}: {out:?}", self.group);
        }
    }
}
