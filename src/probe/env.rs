//! What the machine is: the facts a maintainer asks for first in an issue, plus the ones PyTorch's
//! `collect_env` misses (`/dev/shm` size, ulimits, cgroup limits, relevant variables).

use std::fs;
use std::path::Path;

use crate::scenario::human_bytes;
use nix::sys::resource::{RLIM_INFINITY, Resource, getrlimit, rlim_t};
use procfs::Current;
use procfs::process::Process;
pub use ups_doctor_core::schema::{EnvSummary, PythonEnv};

/// Asks the interpreter for its facts without importing torch (slow, and not needed for a
/// version): `importlib.metadata` reads the installed distribution.
const PYTHON_PROBE: &str = "import sys, json, multiprocessing as mp\n\
try:\n    from importlib.metadata import version\n    t = version('torch')\n\
except Exception:\n    t = None\n\
print(json.dumps({'version': sys.version.split()[0], 'torch': t, \
'start_method': mp.get_context().get_start_method()}))";

/// How long a Python interpreter may take to answer [`PYTHON_PROBE`].
const PYTHON_PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Asks the `python3` (else `python`) on `PATH`; `None` when there is neither.
pub fn probe_python() -> Option<PythonEnv> {
    let exe = super::run::find_on_path("python3").or_else(|| super::run::find_on_path("python"))?;
    let mut env = PythonEnv {
        executable: exe.display().to_string(),
        version: None,
        torch_version: None,
        start_method: None,
        problem: None,
    };
    match ask(&exe, PYTHON_PROBE_TIMEOUT) {
        Ok(out) => match serde_json::from_str::<serde_json::Value>(out.trim()) {
            Ok(v) => {
                let field = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
                env.version = field("version");
                env.torch_version = field("torch");
                env.start_method = field("start_method");
            }
            Err(_) => env.problem = Some(format!("it printed {:?}, not its facts", out.trim())),
        },
        Err(problem) => env.problem = Some(problem),
    }
    Some(env)
}

/// Runs `exe -c PYTHON_PROBE` and returns its stdout; an error after `timeout` (it is killed).
fn ask(exe: &Path, timeout: std::time::Duration) -> Result<String, String> {
    let mut cmd = std::process::Command::new(exe);
    match super::run::bounded(cmd.args(["-c", PYTHON_PROBE]), timeout) {
        Ok(Some(done)) if done.status.success() => Ok(done.stdout),
        Ok(Some(done)) => Err(format!("it exited with {}", done.status)),
        Ok(None) => Err(format!("it did not answer within {}", humantime::format_duration(timeout))),
        Err(e) => Err(format!("could not start it: {e}")),
    }
}

/// Words in a variable's name that suggest its value is a secret: such values are never shown,
/// whatever the variable's prefix (`TORCH_HOME_TOKEN`, `NCCL_…_KEY`, `UPS_DOCTOR_…_PASSWORD`).
/// What a secret's value is shown as.
pub use crate::secrets::REDACTED;

/// Whether a variable's name suggests its value is a secret: the one rule, [`crate::secrets`].
pub fn is_secret_name(name: &str) -> bool {
    crate::secrets::is_secret_name(name)
}

/// Replaces the values of variables whose names suggest a secret with [`REDACTED`], and masks
/// secrets inside the others (a password in a URL, a token) as [`crate::secrets::mask_text`]
/// does. Applied where the environment is collected, and again where a saved one is shown (a
/// result written by an older version).
pub fn redact_variables(variables: &mut [(String, String)]) {
    for (name, value) in variables.iter_mut() {
        if is_secret_name(name) {
            *value = REDACTED.to_string();
        } else if let std::borrow::Cow::Owned(masked) = crate::secrets::mask_text(value) {
            *value = masked;
        }
    }
}

const VARIABLE_PREFIXES: [&str; 8] =
    ["NCCL_", "TORCH_", "CUDA_", "OMP_", "MKL_", "GLOO_", "PYTORCH_", "UPS_DOCTOR_"];

/// Reads the environment of this machine and process: only what needs no other program (no
/// Python, no GPU; [`super::machine`] adds those a command needs).
pub fn collect() -> EnvSummary {
    let (shm_total, shm_used) = match statvfs_bytes(Path::new("/dev/shm")) {
        Some((total, free)) => (Some(total), Some(total.saturating_sub(free))),
        None => (None, None),
    };
    let mut variables: Vec<(String, String)> =
        std::env::vars().filter(|(k, _)| VARIABLE_PREFIXES.iter().any(|p| k.starts_with(p))).collect();
    variables.sort();
    redact_variables(&mut variables);
    let cgroup = own_cgroup_dir();
    // The kernel's names for this host (what /proc/sys/kernel/{hostname,osrelease} show).
    let uts = nix::sys::utsname::uname().ok();
    EnvSummary {
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        hostname: uts.as_ref().map(|u| u.nodename().to_string_lossy().into_owned()).unwrap_or_default(),
        os: os_pretty_name().unwrap_or_else(|| std::env::consts::OS.to_string()),
        kernel: uts.as_ref().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default(),
        arch: std::env::consts::ARCH.to_string(),
        cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        memory_total_bytes: meminfo_total(),
        // The trainer's, filled where it ran (`ups-doctor` itself never loads libtorch).
        libtorch_version: String::new(),
        libtorch_lib: String::new(),
        shm_total_bytes: shm_total,
        shm_used_bytes: shm_used,
        open_files_limit: rlimit(Resource::RLIMIT_NOFILE, |v| v.to_string()),
        locked_memory_limit: rlimit(Resource::RLIMIT_MEMLOCK, human_bytes),
        cgroup_memory_max: cgroup.as_ref().and_then(|d| read_trim(&format!("{d}/memory.max"))),
        cgroup_cpu_max: cgroup.as_ref().and_then(|d| read_trim(&format!("{d}/cpu.max"))),
        container: detect_container(),
        variables,
        python: None,
        gpu: None,
    }
}

fn read_trim(path: &str) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

fn os_pretty_name() -> Option<String> {
    let text = fs::read_to_string("/etc/os-release").ok()?;
    text.lines().find_map(|l| l.strip_prefix("PRETTY_NAME=")).map(|v| v.trim_matches('"').to_string())
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn meminfo_total() -> Option<u64> {
    procfs::Meminfo::current().ok().map(|m| m.mem_total)
}

/// Total and available bytes of the filesystem at `path`.
pub fn statvfs_bytes(path: &Path) -> Option<(u64, u64)> {
    let st = nix::sys::statvfs::statvfs(path).ok()?;
    let frsize = st.fragment_size() as u64;
    Some((st.blocks() as u64 * frsize, st.blocks_available() as u64 * frsize))
}

/// A resource limit as `soft (hard …)`, each shown by `show` unless unlimited.
fn rlimit(resource: Resource, show: impl Fn(rlim_t) -> String) -> Option<String> {
    let (soft, hard) = getrlimit(resource).ok()?;
    let show = |v: rlim_t| if v == RLIM_INFINITY { "unlimited".to_string() } else { show(v) };
    Some(format!("{} (hard {})", show(soft), show(hard)))
}

/// The cgroup v2 directory this process is in (`0::/path` in `/proc/self/cgroup`).
fn own_cgroup_dir() -> Option<String> {
    let groups = Process::myself().ok()?.cgroups().ok()?;
    let v2 = groups.0.iter().find(|g| g.hierarchy == 0 && g.controllers.is_empty())?;
    Some(format!("/sys/fs/cgroup{}", v2.pathname.trim_end_matches('/')))
}

fn detect_container() -> Option<String> {
    if Path::new("/.dockerenv").exists() {
        return Some("docker".into());
    }
    if Path::new("/run/.containerenv").exists() {
        return Some("podman".into());
    }
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        return Some("kubernetes".into());
    }
    let init = Process::new(1).and_then(|p| p.cgroups()).map(|g| g.0).unwrap_or_default();
    ["docker", "kubepods", "containerd", "lxc"]
        .into_iter()
        .find(|k| init.iter().any(|g| g.pathname.contains(k)))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names_are_redacted_whatever_their_prefix() {
        let mut vars = vec![
            ("TORCH_HOME_TOKEN".to_string(), "tSECRET".to_string()),
            ("NCCL_IB_HCA".to_string(), "mlx5".to_string()),
            ("UPS_DOCTOR_api_key".to_string(), "k".to_string()),
            ("CUDA_VISIBLE_DEVICES".to_string(), "0,1".to_string()),
        ];
        redact_variables(&mut vars);
        let values: Vec<&str> = vars.iter().map(|(_, v)| v.as_str()).collect();
        assert_eq!(values, ["<redacted>", "mlx5", "<redacted>", "0,1"]);
    }

    #[test]
    fn collect_reads_this_machine() {
        let env = collect();
        assert!(env.cpus >= 1);
        assert!(env.memory_total_bytes.unwrap_or(0) > 0);
        assert!(!env.kernel.is_empty());
    }

    #[test]
    fn python_on_path_is_asked_for_its_version_and_start_method() {
        // This machine has a python3 (the set-up needs one), so the probe must answer.
        let python = probe_python().expect("python3 on PATH");
        assert_eq!(python.problem, None);
        assert!(python.version.as_deref().is_some_and(|v| v.starts_with('3')), "{python:?}");
        assert!(["fork", "spawn", "forkserver"].contains(&python.start_method.as_deref().unwrap_or("")));
    }

    #[test]
    fn a_python_that_does_not_answer_is_killed_and_said_so() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("python3");
        fs::write(&exe, "#!/bin/sh\nexec sleep 30\n").unwrap();
        fs::set_permissions(&exe, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let err = ask(&exe, std::time::Duration::from_millis(300)).unwrap_err();
        assert_eq!(err, "it did not answer within 300ms");
    }
}
