//! One cgroup per scenario: every process of the scenario (ranks, their workers, a launcher and
//! whatever it starts) is moved into it before `exec`, so the harness can find every one of them
//! whatever they do with sessions and parents, limit their memory (`launch.memory_limit`) and read
//! the kernel's OOM-kill counter for them.
//!
//! Where: a child of the cgroup ups-doctor itself runs in, in the memory controller's cgroup v1
//! hierarchy where that is mounted, else in the cgroup v2 hierarchy (`UPS_DOCTOR_CGROUP_PARENT`
//! names another parent, for tests). Name: `ups-doctor.<pid>.<start>.<n>`, ups-doctor's pid and
//! its start time in clock ticks since boot (`/proc/<pid>/stat` field 22): a later run knows the
//! group is orphaned when no live process has that pid *and* that start time, and only then kills
//! what is in it ([`sweep_orphans`]).
//!
//! Signals: a process is signalled only through a pidfd opened *before* its pid is looked up in
//! the group's `cgroup.procs`; while the pidfd's process lives its pid names no other process, so
//! finding the pid there proves the process is in the group (and if it died in between, the
//! signal goes nowhere). Kernels without pidfds (before 5.3) get no signal from here.
//!
//! Membership alone does not make a process the run's: a program running as root can write any
//! pid into its group's `cgroup.procs`. So a scenario's teardown signals only members that were
//! started after the group was made and that descend from ups-doctor, the child subreaper of
//! everything it starts (`super::sys::become_child_subreaper`: a process of the run whose parent
//! is gone is reparented to ups-doctor, never to init, so every one of them descends from it
//! while it lives); one older than the group, or one that does not descend from ups-doctor
//! (started elsewhere during the run), was moved in from outside and is left alone
//! ([`ScenarioCgroup::is_ours`]). The sweep of a dead ups-doctor's groups has no live ancestor
//! to check, and goes by start time alone.

use std::ffi::{CStr, CString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{OFlag, open};
use nix::sys::signal::Signal;
use nix::sys::stat::Mode;
use nix::sys::statfs::statfs;
use nix::unistd::write;
use procfs::process::{MountInfo, Process};

use crate::schema::{CgroupReport, CgroupVersion};

/// Test-only override: the cgroup directory to create scenario cgroups under, instead of the
/// one ups-doctor runs in (a directory that is no cgroup, or a v2 group without the memory
/// controller, shows how a machine without one is handled).
pub const CGROUP_PARENT_ENV: &str = "UPS_DOCTOR_CGROUP_PARENT";

const PREFIX: &str = "ups-doctor.";
const CGROUP_SUPER_MAGIC: i64 = 0x0027_e0eb;
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
/// How long killed members get to leave the group before it is given up on.
const EMPTY_WAIT: Duration = Duration::from_secs(3);

/// Where scenario cgroups are made.
#[derive(Debug, Clone)]
pub struct Parent {
    pub dir: PathBuf,
    pub version: CgroupVersion,
    /// `dir` as the kernel names it (relative to the hierarchy's root, as in `/proc/<pid>/cgroup`
    /// and the OOM killer's `oom_memcg=`), when the mount table tells.
    pub kernel_path: Option<String>,
}

/// Why no scenario cgroup can be made, or limited, here. Without `launch.memory_limit` the
/// scenario runs without one and the result keeps the message; with one it is refused.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot read `/proc/self`: {0}")]
    OwnProcess(#[source] procfs::ProcError),
    #[error("cannot read `/proc/self/cgroup`: {0}")]
    OwnCgroups(#[source] procfs::ProcError),
    /// The parent named by [`CGROUP_PARENT_ENV`] is not in a cgroup file system.
    #[error("`{}` is not in a cgroup file system", .0.display())]
    NotACgroup(PathBuf),
    #[error("cannot read `{}`: {source}", dir.display())]
    Unreadable { dir: PathBuf, source: io::Error },
    #[error("this process is in no cgroup hierarchy (`/proc/self/cgroup`)")]
    NoHierarchy,
    #[error("the {} hierarchy is not mounted", version_name(*.0))]
    NotMounted(CgroupVersion),
    #[error("this process's cgroup `{path}` is outside the mounted part `{root}`")]
    OutsideMount { path: String, root: String },
    #[error("cannot read ups-doctor's own start time")]
    OwnStartTime,
    #[error("cannot read `/proc/uptime`")]
    Uptime,
    #[error("cannot create the cgroup `{}`: {source}", dir.display())]
    Create { dir: PathBuf, source: io::Error },
    #[error("cannot lock the cgroup `{}`: {source}", dir.display())]
    Lock { dir: PathBuf, source: io::Error },
    /// The group's path has a NUL byte, so a child cannot be told where to enter it.
    #[error("{0}")]
    Nul(#[from] std::ffi::NulError),
    #[error("cannot write `{value}` to `{}`: {source}", file.display())]
    Write { value: String, file: PathBuf, source: io::Error },
    #[error(
        "the cgroup v2 group `{}` does not give its children the memory controller, and enabling it in `{}` failed: {source}",
        parent.display(),
        subtree.display()
    )]
    NoMemoryController { parent: PathBuf, subtree: PathBuf, source: io::Error },
}

/// The parent for scenario cgroups, or why there is none.
pub fn parent() -> Result<Parent, CgroupError> {
    let me = Process::myself().map_err(CgroupError::OwnProcess)?;
    let mounts = me.mountinfo().map(|m| m.0).unwrap_or_default();
    if let Some(dir) = std::env::var_os(CGROUP_PARENT_ENV) {
        let dir = PathBuf::from(dir);
        let version = match fs_magic(&dir) {
            Ok(CGROUP_SUPER_MAGIC) => CgroupVersion::V1,
            Ok(CGROUP2_SUPER_MAGIC) => CgroupVersion::V2,
            Ok(_) => return Err(CgroupError::NotACgroup(dir)),
            Err(source) => return Err(CgroupError::Unreadable { dir, source }),
        };
        let kernel_path = kernel_path_of(&mounts, &dir);
        return Ok(Parent { dir, version, kernel_path });
    }
    let own = me.cgroups().map_err(CgroupError::OwnCgroups)?;
    let v1_memory =
        own.0.iter().find(|g| g.controllers.iter().any(|c| c == "memory")).map(|g| g.pathname.clone());
    let v2 = own.0.iter().find(|g| g.hierarchy == 0 && g.controllers.is_empty()).map(|g| g.pathname.clone());
    let (version, path, mount) = match (v1_memory, v2) {
        (Some(path), _) => (CgroupVersion::V1, path, find_mount(&mounts, "cgroup", Some("memory"))),
        (None, Some(path)) => (CgroupVersion::V2, path, find_mount(&mounts, "cgroup2", None)),
        (None, None) => return Err(CgroupError::NoHierarchy),
    };
    let Some((root, mount_point)) = mount else {
        return Err(CgroupError::NotMounted(version));
    };
    let mount_point = mount_point.to_string_lossy();
    let Some(inside) = path.strip_prefix(root.trim_end_matches('/')) else {
        return Err(CgroupError::OutsideMount { path, root: root.to_string() });
    };
    let dir =
        PathBuf::from(format!("{}/{}", mount_point.trim_end_matches('/'), inside.trim_start_matches('/')));
    Ok(Parent { dir, version, kernel_path: Some(path) })
}

fn version_name(v: CgroupVersion) -> &'static str {
    match v {
        CgroupVersion::V1 => "cgroup v1 memory",
        CgroupVersion::V2 => "cgroup v2",
    }
}

/// `(root, mount point)` of the first mount of `fstype` (with `option` among its super options).
fn find_mount<'a>(
    mounts: &'a [MountInfo],
    fstype: &str,
    option: Option<&str>,
) -> Option<(&'a str, &'a Path)> {
    mounts
        .iter()
        .find(|m| m.fs_type == fstype && option.is_none_or(|o| m.super_options.contains_key(o)))
        .map(|m| (m.root.as_str(), m.mount_point.as_path()))
}

/// The kernel's name for a directory inside a cgroup mount.
fn kernel_path_of(mounts: &[MountInfo], dir: &Path) -> Option<String> {
    let dir = dir.to_str()?;
    mounts
        .iter()
        .filter(|m| m.fs_type == "cgroup" || m.fs_type == "cgroup2")
        .filter_map(|m| {
            let inside = dir.strip_prefix(m.mount_point.to_str()?)?;
            (inside.is_empty() || inside.starts_with('/'))
                .then(|| format!("{}/{}", m.root.trim_end_matches('/'), inside.trim_start_matches('/')))
        })
        .max_by_key(String::len)
        .map(|p| if p.len() > 1 { p.trim_end_matches('/').to_string() } else { p })
}

fn fs_magic(dir: &Path) -> io::Result<i64> {
    Ok(statfs(dir)?.filesystem_type().0 as i64)
}

/// The start time of `pid` in clock ticks since boot (`/proc/<pid>/stat` field 22).
fn start_time(pid: u32) -> Option<u64> {
    crate::probe::memory::read_stat(pid).map(|s| s.start_ticks)
}

/// The cgroup of one scenario. Dropping it kills what is left in it and removes it.
#[derive(Debug)]
pub struct ScenarioCgroup {
    dir: PathBuf,
    version: CgroupVersion,
    kernel_path: Option<String>,
    procs: CString,
    limit: Option<u64>,
    oom_kills_before: u64,
    /// When the group was made, in clock ticks since boot (the unit of a process's start time).
    created_ticks: u64,
    /// The shared lock on the group's directory that tells other runs, in any PID namespace,
    /// that its ups-doctor still runs ([`super::life`]).
    _alive: super::life::Held,
}

/// Now, in clock ticks since boot: the unit of `/proc/<pid>/stat`'s start time.
fn now_ticks() -> Option<u64> {
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    let seconds: f64 = uptime.split_whitespace().next()?.parse().ok()?;
    Some((seconds * procfs::ticks_per_second() as f64) as u64)
}

impl ScenarioCgroup {
    /// Makes a fresh cgroup under `parent`, with `limit` bytes of memory (no swap) when given.
    pub fn create(parent: &Parent, limit: Option<u64>, tag: &str) -> Result<ScenarioCgroup, CgroupError> {
        let me = std::process::id();
        let start = start_time(me).ok_or(CgroupError::OwnStartTime)?;
        let name = format!("{PREFIX}{me}.{start}.{tag}");
        let dir = parent.dir.join(&name);
        // Between the mkdir and the lock, a sweep of a run in another PID namespace (where our pid
        // means nothing) can take the unlocked group for a dead run's: it then either holds it
        // (our lock is refused) or has removed it (our lock is on a directory with no name, and
        // the ranks could not enter it). Made again when so; a sweep spares it once locked.
        let mut attempt = 0;
        let (created_ticks, alive) = loop {
            attempt += 1;
            // Taken before the group exists, rounded down: nothing spawned in it can be older.
            let created_ticks = now_ticks().ok_or(CgroupError::Uptime)?.saturating_sub(1);
            match std::fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if attempt > 1 && e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(source) => return Err(CgroupError::Create { dir, source }),
            }
            match super::life::hold(&dir) {
                Ok(held) if held.still_at(&dir) => break (created_ticks, held),
                Ok(_) if attempt < 3 => continue,
                Err(e) if attempt < 3 && e.kind() == std::io::ErrorKind::WouldBlock => {
                    // The sweep holds it while it removes it: give it the moment that takes.
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    continue;
                }
                Ok(_) => {
                    let source = std::io::Error::other(
                        "a sweep of another run removed it as it was made, three times",
                    );
                    return Err(CgroupError::Lock { dir, source });
                }
                Err(source) => {
                    let _ = std::fs::remove_dir(&dir);
                    return Err(CgroupError::Lock { dir, source });
                }
            }
        };
        let procs = CString::new(dir.join("cgroup.procs").as_os_str().as_bytes())?;
        let mut cg = ScenarioCgroup {
            kernel_path: parent.kernel_path.as_ref().map(|p| format!("{}/{name}", p.trim_end_matches('/'))),
            dir,
            version: parent.version,
            procs,
            limit,
            oom_kills_before: 0,
            created_ticks,
            _alive: alive,
        };
        if let Some(bytes) = limit {
            // On failure `cg` drops here, which removes the directory again.
            cg.set_limit(parent, bytes)?;
        }
        cg.oom_kills_before = cg.oom_kill_count().unwrap_or(0);
        Ok(cg)
    }

    fn set_limit(&self, parent: &Parent, bytes: u64) -> Result<(), CgroupError> {
        let write = |file: &str, value: &str| {
            let file = self.dir.join(file);
            std::fs::write(&file, value).map_err(|source| CgroupError::Write {
                value: value.to_string(),
                file,
                source,
            })
        };
        match self.version {
            CgroupVersion::V1 => {
                write("memory.limit_in_bytes", &bytes.to_string())?;
                // Memory+swap at the same figure: the limit is not stretched by swapping.
                if self.dir.join("memory.memsw.limit_in_bytes").exists() {
                    write("memory.memsw.limit_in_bytes", &bytes.to_string())?;
                }
            }
            CgroupVersion::V2 => {
                if !self.has_v2_memory() {
                    // The parent must hand the controller down; refused (EBUSY) while the parent
                    // itself holds processes (cgroup v2's "no internal processes" rule).
                    let subtree = parent.dir.join("cgroup.subtree_control");
                    if let Err(source) = std::fs::write(&subtree, "+memory") {
                        return Err(CgroupError::NoMemoryController {
                            parent: parent.dir.clone(),
                            subtree,
                            source,
                        });
                    }
                }
                write("memory.max", &bytes.to_string())?;
                if self.dir.join("memory.swap.max").exists() {
                    write("memory.swap.max", "0")?;
                }
            }
        }
        Ok(())
    }

    fn has_v2_memory(&self) -> bool {
        std::fs::read_to_string(self.dir.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"))
    }

    /// `cgroup.procs` of this group, for [`enter`] in a child before `exec`.
    pub fn procs_file(&self) -> &CStr {
        &self.procs
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The group's path as the kernel log names it (`oom_memcg=`), when known.
    pub fn kernel_path(&self) -> Option<&str> {
        self.kernel_path.as_deref()
    }

    /// The processes in the group now.
    pub fn members(&self) -> Vec<u32> {
        members(&self.dir)
    }

    /// How many processes the OOM killer ended in this group since it was made.
    pub fn oom_kill_count(&self) -> Option<u64> {
        let (file, key) = match self.version {
            CgroupVersion::V1 => ("memory.oom_control", "oom_kill"),
            CgroupVersion::V2 => ("memory.events", "oom_kill"),
        };
        let text = std::fs::read_to_string(self.dir.join(file)).ok()?;
        let total: u64 = text.lines().find_map(|l| l.strip_prefix(key)?.trim().parse().ok())?;
        Some(total.saturating_sub(self.oom_kills_before))
    }

    /// The file that holds the group's memory use now, with its limit, when it has one.
    pub fn usage_file(&self) -> Option<(PathBuf, u64)> {
        let file = match self.version {
            CgroupVersion::V1 => "memory.usage_in_bytes",
            CgroupVersion::V2 => "memory.current",
        };
        Some((self.dir.join(file), self.limit?))
    }

    /// The highest memory use the kernel recorded for the group.
    pub fn peak_bytes(&self) -> Option<u64> {
        let file = match self.version {
            CgroupVersion::V1 => "memory.max_usage_in_bytes",
            CgroupVersion::V2 => "memory.peak",
        };
        std::fs::read_to_string(self.dir.join(file)).ok()?.trim().parse().ok()
    }

    /// What the result records of the group.
    pub fn report(&self) -> CgroupReport {
        CgroupReport {
            path: self.dir.display().to_string(),
            version: self.version,
            limit_bytes: self.limit,
            peak_bytes: self.peak_bytes(),
            oom_kills: self.oom_kill_count().unwrap_or(0),
        }
    }

    /// SIGKILLs every process in the group that was started after the group was made (see the
    /// module's documentation); returns the pids that got it.
    pub fn kill_all(&self) -> Vec<u32> {
        kill_members(&self.dir, self.live())
    }

    /// Whether a member that started at `start_ticks` (clock ticks since boot) can have been
    /// spawned by the run: it started after the group was made. One older than the group was
    /// moved in from outside.
    pub fn spawned_since_created(&self, start_ticks: u64) -> bool {
        start_ticks >= self.created_ticks
    }

    /// Whether the member `pid` (started at `start_ticks`) is the run's: started after the group
    /// was made, and descending from this ups-doctor (see the module's documentation).
    pub fn is_ours(&self, pid: u32, start_ticks: u64) -> bool {
        self.spawned_since_created(start_ticks) && super::owner::below_us(pid, None)
    }

    fn live(&self) -> Since {
        Since { ticks: self.created_ticks, below_us: true }
    }

    /// Kills what is left, waits for the group to empty and removes it. Returns the pids that
    /// were still in it.
    pub fn kill_and_remove(&self) -> Vec<u32> {
        let killed = self.kill_all();
        remove_when_empty(&self.dir, self.live());
        killed
    }
}

impl Drop for ScenarioCgroup {
    fn drop(&mut self) {
        self.kill_and_remove();
    }
}

/// Moves the calling process into the group whose `cgroup.procs` is `procs`. Async-signal-safe
/// (open, write, close), for use between `fork` and `exec`.
pub fn enter(procs: &CStr) -> io::Result<()> {
    // nix passes a `CStr` path straight through and allocates nothing; the fd closes on drop.
    let fd = open(procs, OFlag::O_WRONLY | OFlag::O_CLOEXEC, Mode::empty())?;
    // `0` names the writing process itself, in v1 and v2 alike.
    match write(&fd, b"0")? {
        1 => Ok(()),
        _ => Err(io::Error::from(Errno::EIO)),
    }
}

fn members(dir: &Path) -> Vec<u32> {
    read_members(dir).unwrap_or_default()
}

/// The processes in the group at `dir` now, `None` when its `cgroup.procs` cannot be read.
pub fn read_members(dir: &Path) -> Option<Vec<u32>> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .ok()
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

/// Which members of a group may be signalled: those started at or after `ticks` (clock ticks
/// since boot), and with `below_us`, descending from this ups-doctor.
#[derive(Debug, Clone, Copy)]
struct Since {
    ticks: u64,
    below_us: bool,
}

impl Since {
    fn qualifies(self, pid: u32) -> bool {
        start_time(pid).is_some_and(|s| s >= self.ticks)
            && (!self.below_us || super::owner::below_us(pid, None))
    }
}

/// SIGKILLs every member of the group at `dir` that qualifies (`since`), each through a pidfd
/// proven to be a member (see the module's comment). v2's `cgroup.kill` does the same in the
/// kernel where it exists, and is used only when every member qualifies.
fn kill_members(dir: &Path, since: Since) -> Vec<u32> {
    let pids = members(dir);
    if pids.is_empty() {
        return pids;
    }
    let kill_file = dir.join("cgroup.kill");
    if pids.iter().all(|&p| since.qualifies(p))
        && kill_file.exists()
        && std::fs::write(&kill_file, "1").is_ok()
    {
        return pids;
    }
    pids.into_iter().filter(|&pid| signal_member(dir, pid, Signal::SIGKILL as i32, since)).collect()
}

/// Sends `signal` to `pid` only if it is, provably, a member of the group at `dir` that
/// qualifies (`since`).
fn signal_member(dir: &Path, pid: u32, signal: i32, since: Since) -> bool {
    // The pidfd first: membership, start time and ancestry are then checked for the process it
    // names.
    let Ok(fd) = super::sys::pidfd_open(pid) else { return false };
    since.qualifies(pid) && members(dir).contains(&pid) && super::sys::pidfd_send_signal(&fd, signal).is_ok()
}

/// Waits (bounded) until the group at `dir` is empty, then removes it.
fn remove_when_empty(dir: &Path, since: Since) -> bool {
    let deadline = Instant::now() + EMPTY_WAIT;
    loop {
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        // Members that exited but are not yet gone from the group keep it busy for a moment.
        kill_members(dir, since);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A process found in the cgroup of an ups-doctor run that is gone, and killed.
#[derive(Debug, Clone, PartialEq)]
pub struct Orphan {
    pub pid: u32,
    pub command: String,
    /// The orphaned cgroup it was in.
    pub cgroup: PathBuf,
    pub killed: bool,
}

/// What [`sweep_orphans`] did.
#[derive(Debug, Default)]
pub struct Sweep {
    pub orphans: Vec<Orphan>,
    /// Groups whose ups-doctor seemed gone by its pid but could not be proven dead, with why:
    /// left alone.
    pub spared: Vec<(PathBuf, String)>,
}

/// Kills the processes of scenario cgroups under `parent` whose ups-doctor is gone, and removes
/// those groups. Gone means both: no live process here has the pid and start time in the group's
/// name, and nobody holds the group's lock ([`super::life`]) — a pid means nothing across PID
/// namespaces, the lock does. Only members started after that ups-doctor are killed: an older
/// one was moved in from outside.
pub fn sweep_orphans(parent: &Parent) -> Sweep {
    let Ok(entries) = std::fs::read_dir(&parent.dir) else {
        return Sweep::default();
    };
    let mut sweep = Sweep::default();
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((pid, start)) = owner_of(&name) else {
            continue;
        };
        if start_time(pid) == Some(start) {
            continue; // its ups-doctor still runs
        }
        let dir = entry.path();
        // Held until the group is emptied and removed, so that no other sweep does it too.
        let _dead = match super::life::owner(&dir) {
            super::life::Owner::Gone(held) => held,
            super::life::Owner::Absent => continue,
            super::life::Owner::Alive => {
                let why =
                    format!("its ups-doctor (pid {pid} where it runs, another PID namespace) still holds it");
                sweep.spared.push((dir, why));
                continue;
            }
            super::life::Owner::Unknown(e) => {
                sweep.spared.push((dir, format!("its owner cannot be proven gone: {e}")));
                continue;
            }
        };
        // The group was made after its ups-doctor started: a member older than that was moved in
        // from outside, is not the dead run's, and is left alone (and not listed), as a live
        // run's teardown leaves it.
        let since = Since { ticks: start, below_us: false };
        let ours = |p: &u32| start_time(*p).is_some_and(|s| s >= start);
        let before: Vec<(u32, String)> =
            members(&dir).into_iter().filter(ours).map(|p| (p, command_of(p))).collect();
        let killed = kill_members(&dir, since);
        remove_when_empty(&dir, since);
        let left = members(&dir);
        sweep.orphans.extend(before.into_iter().map(|(pid, command)| Orphan {
            pid,
            command,
            cgroup: dir.clone(),
            killed: killed.contains(&pid) && !left.contains(&pid),
        }));
    }
    sweep
}

/// `(pid, start time)` of the ups-doctor that named a group `ups-doctor.<pid>.<start>.<tag>`.
fn owner_of(name: &str) -> Option<(u32, u64)> {
    let mut parts = name.strip_prefix(PREFIX)?.splitn(3, '.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

fn command_of(pid: u32) -> String {
    crate::probe::memory::read_stat(pid).map(|s| s.command).unwrap_or_default()
}

/// Whether a cgroup with a memory limit can be made here: makes one and removes it. The error
/// says why not.
pub fn check_memory_limit(bytes: u64) -> Result<(), CgroupError> {
    let parent = parent()?;
    ScenarioCgroup::create(&parent, Some(bytes), "probe").map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
25 30 0:22 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs rw,mode=755
29 25 0:26 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
33 25 0:30 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    fn mountinfo() -> Vec<MountInfo> {
        use procfs::FromBufRead;
        procfs::process::MountInfos::from_buf_read(MOUNTINFO.as_bytes()).unwrap().0
    }

    #[test]
    fn finds_the_memory_hierarchy_and_the_v2_mount() {
        let m = mountinfo();
        assert_eq!(find_mount(&m, "cgroup", Some("memory")), Some(("/", Path::new("/sys/fs/cgroup/memory"))));
        assert_eq!(find_mount(&m, "cgroup2", None), Some(("/", Path::new("/sys/fs/cgroup/unified"))));
        assert_eq!(find_mount(&m, "cgroup", Some("pids")), None);
    }

    #[test]
    fn names_a_directory_as_the_kernel_does() {
        let m = mountinfo();
        let dir = Path::new("/sys/fs/cgroup/memory/job/ups-doctor.1.2.0");
        assert_eq!(kernel_path_of(&m, dir).as_deref(), Some("/job/ups-doctor.1.2.0"));
        assert_eq!(kernel_path_of(&m, Path::new("/tmp/x")), None);
    }

    #[test]
    fn the_owner_is_read_from_the_name_only_in_our_form() {
        assert_eq!(owner_of("ups-doctor.123.456.7"), Some((123, 456)));
        assert_eq!(owner_of("ups-doctor.123.456.probe"), Some((123, 456)));
        assert_eq!(owner_of("ups-doctor.x.456.7"), None);
        assert_eq!(owner_of("other.123.456.7"), None);
    }

    #[test]
    fn own_start_time_is_readable() {
        assert!(start_time(std::process::id()).is_some_and(|t| t > 0));
    }
}
