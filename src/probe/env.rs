//! What the machine is: the facts a maintainer asks for first in an issue, plus the ones PyTorch's
//! `collect_env` misses (`/dev/shm` size, ulimits, cgroup limits, relevant variables).

use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// A snapshot of the environment a run happened in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvSummary {
    pub tool_version: String,
    pub hostname: String,
    pub os: String,
    pub kernel: String,
    pub arch: String,
    pub cpus: usize,
    pub memory_total_bytes: Option<u64>,
    pub libtorch_version: String,
    pub libtorch_lib: String,
    /// `/dev/shm` size and use in bytes, when it is mounted.
    pub shm_total_bytes: Option<u64>,
    pub shm_used_bytes: Option<u64>,
    /// `ulimit -n` (soft).
    pub open_files_limit: Option<String>,
    /// Locked-memory limit (soft and hard, `ulimit -l`), which pinned host memory needs.
    pub locked_memory_limit: Option<String>,
    /// cgroup v2 `memory.max` and `cpu.max` of this process's cgroup.
    pub cgroup_memory_max: Option<String>,
    pub cgroup_cpu_max: Option<String>,
    /// Container runtime detected (docker, podman, kubernetes), if any.
    pub container: Option<String>,
    /// `NCCL_*`, `TORCH_*`, `CUDA_*`, `OMP_*`, `MKL_*`, `GLOO_*`, `UPS_DOCTOR_*` as set.
    pub variables: Vec<(String, String)>,
    /// Driver, CUDA, NCCL and GPUs ([`super::gpu_env`]); filled by the commands that can ask a
    /// child process about libtorch's CUDA, absent in results of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<super::gpu_env::GpuEnv>,
}

const VARIABLE_PREFIXES: [&str; 8] =
    ["NCCL_", "TORCH_", "CUDA_", "OMP_", "MKL_", "GLOO_", "PYTORCH_", "UPS_DOCTOR_"];

impl EnvSummary {
    /// Reads the environment of this machine and process.
    pub fn collect() -> EnvSummary {
        let (shm_total, shm_used) = match statvfs_bytes(Path::new("/dev/shm")) {
            Some((total, free)) => (Some(total), Some(total.saturating_sub(free))),
            None => (None, None),
        };
        let mut variables: Vec<(String, String)> =
            std::env::vars().filter(|(k, _)| VARIABLE_PREFIXES.iter().any(|p| k.starts_with(p))).collect();
        variables.sort();
        let cgroup = own_cgroup_dir();
        EnvSummary {
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            hostname: read_trim("/proc/sys/kernel/hostname").unwrap_or_default(),
            os: os_pretty_name().unwrap_or_else(|| std::env::consts::OS.to_string()),
            kernel: read_trim("/proc/sys/kernel/osrelease").unwrap_or_default(),
            arch: std::env::consts::ARCH.to_string(),
            cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            memory_total_bytes: meminfo_total(),
            libtorch_version: env!("UPS_DOCTOR_LIBTORCH_VERSION").to_string(),
            libtorch_lib: env!("UPS_DOCTOR_LIBTORCH_LIB").to_string(),
            shm_total_bytes: shm_total,
            shm_used_bytes: shm_used,
            open_files_limit: rlimit(libc::RLIMIT_NOFILE, |v| v.to_string()),
            locked_memory_limit: rlimit(libc::RLIMIT_MEMLOCK, human_bytes),
            cgroup_memory_max: cgroup.as_ref().and_then(|d| read_trim(&format!("{d}/memory.max"))),
            cgroup_cpu_max: cgroup.as_ref().and_then(|d| read_trim(&format!("{d}/cpu.max"))),
            container: detect_container(),
            variables,
            gpu: None,
        }
    }
}

fn read_trim(path: &str) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

fn os_pretty_name() -> Option<String> {
    let text = fs::read_to_string("/etc/os-release").ok()?;
    text.lines().find_map(|l| l.strip_prefix("PRETTY_NAME=")).map(|v| v.trim_matches('"').to_string())
}

fn meminfo_total() -> Option<u64> {
    let text = fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Total and available bytes of the filesystem at `path`.
pub fn statvfs_bytes(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a valid out-pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let frsize = st.f_frsize as u64;
    Some((st.f_blocks as u64 * frsize, st.f_bavail as u64 * frsize))
}

/// A resource limit as `soft (hard …)`, each shown by `show` unless unlimited.
fn rlimit(resource: libc::__rlimit_resource_t, show: impl Fn(libc::rlim_t) -> String) -> Option<String> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid out-pointer.
    if unsafe { libc::getrlimit(resource, &mut lim) } != 0 {
        return None;
    }
    let show = |v: libc::rlim_t| if v == libc::RLIM_INFINITY { "unlimited".to_string() } else { show(v) };
    Some(format!("{} (hard {})", show(lim.rlim_cur), show(lim.rlim_max)))
}

fn own_cgroup_dir() -> Option<String> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    // cgroup v2: a single line `0::/path`.
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(format!("/sys/fs/cgroup{}", rel.trim_end_matches('/')))
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
    let cgroup = fs::read_to_string("/proc/1/cgroup").unwrap_or_default();
    ["docker", "kubepods", "containerd", "lxc"].into_iter().find(|k| cgroup.contains(k)).map(str::to_string)
}

/// Formats a byte count for people: `64.0 MiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_bytes_picks_a_readable_unit() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(64 * 1024 * 1024), "64.0 MiB");
        assert_eq!(human_bytes(3 * 1024 * 1024 * 1024 / 2), "1.5 GiB");
    }

    #[test]
    fn collect_reads_this_machine() {
        let env = EnvSummary::collect();
        assert!(env.cpus >= 1);
        assert!(env.memory_total_bytes.unwrap_or(0) > 0);
        assert!(!env.kernel.is_empty());
    }
}
