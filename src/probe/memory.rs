//! Per-process memory from procfs: `smaps_rollup` (RSS, PSS, USS, shared) and the process table
//! (`/proc/<pid>/stat`: command, state, process group, start time, a zombie's wait status), and
//! the environment a process started with. The procfs crate parses; `parse_*` take recorded text
//! (tested), the `read_*` functions, [`processes`] and `environ_*` are the procfs edge.

use std::ffi::OsStr;

use procfs::process::{Process, SmapsRollup, Stat};
use procfs::{FromBufRead, FromRead};

/// One process's memory, in bytes, from `/proc/<pid>/smaps_rollup`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rollup {
    pub rss: u64,
    /// Proportional set size: shared pages divided among the processes that map them.
    pub pss: u64,
    /// Unique set size: pages only this process maps (`Private_Clean` + `Private_Dirty`).
    pub uss: u64,
    /// Pages mapped by other processes too (`Shared_Clean` + `Shared_Dirty`).
    pub shared: u64,
}

impl Rollup {
    /// This reading moved to a resident size of `rss` without reading again: what the process
    /// gained or lost counted as its own (a page it faults in is private until another maps it).
    pub fn moved_to(&self, rss: u64) -> Rollup {
        let (up, down) = (rss.saturating_sub(self.rss), self.rss.saturating_sub(rss));
        Rollup {
            rss,
            pss: (self.pss + up).saturating_sub(down),
            uss: (self.uss + up).saturating_sub(down),
            shared: self.shared,
        }
    }
}

/// The machine's available and total memory in bytes (`MemAvailable`, `MemTotal`).
pub fn available() -> Option<(u64, u64)> {
    use procfs::Current;
    let m = procfs::Meminfo::current().ok()?;
    Some((m.mem_available?, m.mem_total))
}

/// The fields of `/proc/<pid>/stat` the harness needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat {
    pub pid: u32,
    pub command: String,
    /// `R`, `S`, `D`, `Z`, …
    pub state: char,
    pub ppid: u32,
    pub pgid: u32,
    /// When it started, in clock ticks since boot: with the pid, names one process for good.
    pub start_ticks: u64,
    /// The wait status of a zombie (field 52, Linux 3.5+): how a process that is not our child
    /// ended, readable until its parent reaps it. `None` on older kernels; 0 while it runs.
    pub exit_code: Option<i32>,
    /// Its first thread has begun to exit (`PF_EXITING` in field 9): the process is dying, and
    /// turns a zombie within milliseconds (see [`crate::harness::os::found`]).
    pub exiting: bool,
    /// The CPU time it used so far, user and system, in clock ticks ([`ticks_to_seconds`]).
    pub cpu_ticks: u64,
}

/// `PF_EXITING` in `/proc/PID/stat`'s flags (include/linux/sched.h).
const PF_EXITING: u32 = 0x4;

impl ProcStat {
    pub fn zombie(&self) -> bool {
        matches!(self.state, 'Z' | 'X')
    }
}

/// Parses `smaps_rollup` (through procfs); `None` when a line the figures need is missing (a
/// kernel thread, or a process that exited while being read).
pub fn parse_smaps_rollup(text: &str) -> Option<Rollup> {
    rollup(&SmapsRollup::from_buf_read(text.as_bytes()).ok()?)
}

fn rollup(r: &SmapsRollup) -> Option<Rollup> {
    // procfs gives every figure in bytes, keyed by the line's name without its colon.
    let map = &r.memory_map_rollup.0.first()?.extension.map;
    let get = |name: &str| map.get(name).copied();
    Some(Rollup {
        rss: get("Rss")?,
        pss: get("Pss")?,
        uss: get("Private_Clean")? + get("Private_Dirty")?,
        shared: get("Shared_Clean")? + get("Shared_Dirty")?,
    })
}

/// Parses the text of `/proc/<pid>/stat` (through procfs, which finds the fields after the
/// command from its last `)`: a command may itself contain spaces and parentheses).
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    Stat::from_read(text.as_bytes()).ok().map(|s| proc_stat(&s))
}

fn proc_stat(s: &Stat) -> ProcStat {
    ProcStat {
        pid: s.pid as u32,
        command: s.comm.clone(),
        state: s.state,
        ppid: s.ppid as u32,
        pgid: s.pgrp as u32,
        start_ticks: s.starttime,
        exit_code: s.exit_code,
        exiting: s.flags & PF_EXITING != 0,
        cpu_ticks: s.utime + s.stime,
    }
}

/// Clock ticks of `/proc/PID/stat` (`cpu_ticks`) in seconds.
pub fn ticks_to_seconds(ticks: u64) -> f64 {
    ticks as f64 / procfs::ticks_per_second() as f64
}

fn process(pid: u32) -> Option<Process> {
    Process::new(i32::try_from(pid).ok()?).ok()
}

/// One process, opened once (a descriptor on its `/proc/<pid>` directory): every read through it
/// is of that same process, so a pid reused between two reads fails the later one instead of
/// answering for the newcomer.
pub struct ProcHandle(Process);

impl ProcHandle {
    /// `pid`'s `/proc` directory, or `None` when there is no such process.
    pub fn open(pid: u32) -> Option<ProcHandle> {
        process(pid).map(ProcHandle)
    }

    /// Its `stat`, or `None` once it is gone.
    pub fn stat(&self) -> Option<ProcStat> {
        self.0.stat().ok().map(|s| proc_stat(&s))
    }

    /// Whether the environment it started with holds `key=value` (false when unreadable).
    pub fn environ_has(&self, key: &str, value: &str) -> bool {
        self.0.environ().is_ok_and(|env| env.get(OsStr::new(key)).is_some_and(|v| v == value))
    }

    /// Whether the environment it started with holds `key=value`; `None` when the process is
    /// gone or exiting (see [`environ_holds`]); `Some(false)` when otherwise unreadable.
    pub fn environ_holds(&self, key: &str, value: &str) -> Option<bool> {
        environ_holds(self.0.environ(), key, value)
    }

    /// The value of `key` in the environment it started with.
    pub fn environ_var(&self, key: &str) -> Option<String> {
        self.0.environ().ok()?.get(OsStr::new(key)).map(|v| v.to_string_lossy().into_owned())
    }
}

/// One process's `/proc/<pid>/stat`, opened once and read again with one `pread` a time: a
/// watcher that polls a process every few milliseconds pays one system call a poll instead of
/// eight (opening the process's directory and the file, `statx`, `lseek`, two reads, two closes).
/// The descriptor stays bound to that process: once it is reaped a read fails, even when its pid
/// has been given to another process since.
pub struct StatReader {
    file: std::fs::File,
    text: Vec<u8>,
}

impl StatReader {
    /// `None` when there is no such process.
    pub fn open(pid: u32) -> Option<StatReader> {
        let file = std::fs::File::open(format!("/proc/{pid}/stat")).ok()?;
        Some(StatReader { file, text: vec![0; 4096] })
    }

    /// The process's `stat` now, or `None` once it is gone (reaped).
    pub fn read(&mut self) -> Option<ProcStat> {
        use std::os::unix::fs::FileExt;
        let mut len = 0;
        loop {
            if len == self.text.len() {
                self.text.resize(len * 2, 0);
            }
            match self.file.read_at(&mut self.text[len..], len as u64) {
                Ok(0) => break,
                // A line shorter than the buffer is the whole file: no second read to find its end.
                Ok(n) if len + n < self.text.len() => {
                    len += n;
                    break;
                }
                Ok(n) => len += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
        Some(proc_stat(&Stat::from_read(&self.text[..len]).ok()?))
    }
}

/// `/proc/<pid>/smaps_rollup`, or `None` when the process is gone or unreadable.
pub fn read_smaps_rollup(pid: u32) -> Option<Rollup> {
    let mut text = Vec::with_capacity(2048);
    read_proc_file(&format!("/proc/{pid}/smaps_rollup"), &mut text)?;
    rollup(&SmapsRollup::from_buf_read(&text[..]).ok()?)
}

/// `/proc/<pid>/smaps_rollup` and the CPU time reading it took the calling thread (the kernel's
/// walk of the process's pages runs in it; see
/// [`crate::harness::observe::memory::RollupCadence`]). The CPU time, not the wall time: on a
/// busy machine a walk is preempted, and its wall time would say more of the load than of its
/// cost.
pub fn read_smaps_rollup_timed(pid: u32) -> Option<(Rollup, std::time::Duration)> {
    let start = thread_cpu_time();
    let rollup = read_smaps_rollup(pid)?;
    Some((rollup, thread_cpu_time().saturating_sub(start)))
}

/// The CPU time the calling thread has used (`CLOCK_THREAD_CPUTIME_ID`: user and system time),
/// zero where the clock cannot be read.
fn thread_cpu_time() -> std::time::Duration {
    use nix::time::{ClockId, clock_gettime};
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(std::time::Duration::ZERO, std::time::Duration::from)
}

/// The resident size in bytes from `/proc/<pid>/statm`: the kernel's counters, read without
/// walking the process's pages (microseconds, where `smaps_rollup` takes milliseconds).
pub fn read_rss(pid: u32) -> Option<u64> {
    let mut text = Vec::with_capacity(128);
    read_proc_file(&format!("/proc/{pid}/statm"), &mut text)?;
    parse_statm_rss(std::str::from_utf8(&text).ok()?)
}

/// The resident size in bytes from the text of `statm` (pages: size, resident, shared, …).
pub fn parse_statm_rss(text: &str) -> Option<u64> {
    let pages: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * procfs::page_size())
}

/// The CPU time `pid` has used (its threads, not its children), in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = procfs::process::Process::new(i32::try_from(pid).ok()?).and_then(|p| p.stat()).ok()?;
    Some(ticks_to_seconds(stat.utime + stat.stime))
}

/// Bytes a process has read, as far as a reader outside can tell: what it read through system
/// calls (`rchar` in `/proc/<pid>/io`) and the pages its major faults brought in from storage
/// (`majflt`: a shared library being mapped in is read that way, not through `read`). `None`
/// when the process is gone or unreadable.
pub fn bytes_read(pid: u32) -> Option<u64> {
    let p = procfs::process::Process::new(i32::try_from(pid).ok()?).ok()?;
    let faults = p.stat().ok()?.majflt;
    let read = p.io().map_or(0, |io| io.rchar);
    Some(read.saturating_add(faults.saturating_mul(procfs::page_size())))
}

/// `/proc/<pid>/stat`, or `None` when the process is gone or unreadable.
pub fn read_stat(pid: u32) -> Option<ProcStat> {
    ProcHandle::open(pid)?.stat()
}

/// Every process on the machine, from `/proc/*/stat` (processes that vanish while being read
/// are skipped).
///
/// Read directly, four system calls a process (open, read, the read that finds the end, close):
/// the table is read every 250 ms while a run is sampled, and procfs's `Process` costs seven
/// (it opens and `stat`s the process's directory first, and sizes its buffer with `statx` and
/// `lseek`), measured with `strace -c` on the sampling thread.
pub fn processes() -> Vec<ProcStat> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    processes_among(dir.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok()))
}

/// The processes `pids` that exist, as [`processes`] reads them.
pub fn processes_among(pids: impl IntoIterator<Item = u32>) -> Vec<ProcStat> {
    let mut text = Vec::with_capacity(1024);
    pids.into_iter()
        .filter_map(|pid| {
            read_proc_file(&format!("/proc/{pid}/stat"), &mut text)?;
            Some(proc_stat(&Stat::from_read(&text[..]).ok()?))
        })
        .collect()
}

/// Reads a small `/proc` file into `text` (cleared first) with plain reads: `std`'s
/// `read_to_end` asks the file's size first, which `/proc` does not know.
fn read_proc_file(path: &str, text: &mut Vec<u8>) -> Option<()> {
    use std::io::Read;
    text.clear();
    let mut file = std::fs::File::open(path).ok()?;
    let mut chunk = [0u8; 4096];
    loop {
        match file.read(&mut chunk) {
            Ok(0) => return Some(()),
            Ok(n) => text.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

/// `/proc/<pid>/cmdline`, its arguments joined by spaces (empty for a zombie or a kernel
/// thread); `None` when the process is gone, unreadable or its arguments are not UTF-8.
pub fn cmdline(pid: u32) -> Option<String> {
    process(pid)?.cmdline().ok().map(|args| args.join(" "))
}

/// Whether `/proc/<pid>/environ` holds `key=value` (false when it cannot be read).
pub fn environ_has(pid: u32, key: &str, value: &str) -> bool {
    ProcHandle::open(pid).is_some_and(|p| p.environ_has(key, value))
}

/// The value of `key` in `/proc/<pid>/environ` (the environment the process started with).
pub fn environ_var(pid: u32, key: &str) -> Option<String> {
    ProcHandle::open(pid)?.environ_var(key)
}

/// What a read of `/proc/<pid>/environ` says of `key=value`. A process on its way out reads as
/// ESRCH ("no such process", procfs's `NotFound`) from the moment its memory is released, while
/// its `stat` still says running, for as long as the kernel takes to free that memory (measured:
/// 0.85 s for a SIGKILLed process holding 3 GiB): that is `None`, not an answer.
fn environ_holds(
    read: procfs::ProcResult<std::collections::HashMap<std::ffi::OsString, std::ffi::OsString>>,
    key: &str,
    value: &str,
) -> Option<bool> {
    match read {
        Ok(env) => Some(env.get(OsStr::new(key)).is_some_and(|v| v == value)),
        Err(procfs::ProcError::NotFound(_)) => None,
        Err(_) => Some(false),
    }
}

/// `/proc/<pid>/environ` in one read, for questions about several variables: separate reads of a
/// child between its fork and its exec could see its parent's environment first and its own after.
pub fn environ(pid: u32) -> Option<std::collections::HashMap<std::ffi::OsString, std::ffi::OsString>> {
    process(pid)?.environ().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recorded from a rank of this project (kernel 6.8).
    const ROLLUP: &str = "\
558d9f02c000-7fff704cf000 ---p 00000000 00:00 0                          [rollup]
Rss:              412356 kB
Pss:              298004 kB
Pss_Dirty:        250112 kB
Pss_Anon:         249876 kB
Pss_File:          48128 kB
Pss_Shmem:             0 kB
Shared_Clean:     131072 kB
Shared_Dirty:       2048 kB
Private_Clean:     29124 kB
Private_Dirty:    250112 kB
Referenced:       412356 kB
Anonymous:        249876 kB
Swap:                  0 kB
";

    #[test]
    fn rollup_gives_rss_pss_uss_and_shared() {
        let r = parse_smaps_rollup(ROLLUP).unwrap();
        assert_eq!(r.rss, 412_356 * 1024);
        assert_eq!(r.pss, 298_004 * 1024);
        assert_eq!(r.uss, (29_124 + 250_112) * 1024);
        assert_eq!(r.shared, (131_072 + 2048) * 1024);
        assert_eq!(r.uss + r.shared, r.rss);
    }

    #[test]
    fn an_empty_rollup_is_none() {
        assert_eq!(parse_smaps_rollup(""), None);
        assert_eq!(parse_smaps_rollup("Rss: 4 kB\nPss: 4 kB\n"), None);
    }

    /// Fields 23 to 52 of a `/proc/<pid>/stat` recorded on kernel 6.8 (vsize … exit_code).
    const TAIL: &str = "3133440 390 18446744073709551615 94671015645184 94671015665065 140736041264128 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 94671015681072 94671015682688 94671448465408 140736041269909 140736041269929 140736041269929 140736041271275 0\n";

    #[test]
    fn stat_survives_odd_command_names() {
        let s = parse_stat(&format!(
            "4242 (pt_data (worker) 1) S 4200 4200 4200 0 -1 4194624 301 0 0 0 5 3 0 0 20 0 1 0 77 {TAIL}"
        ))
        .unwrap();
        assert_eq!(
            s,
            ProcStat {
                pid: 4242,
                command: "pt_data (worker) 1".into(),
                state: 'S',
                ppid: 4200,
                pgid: 4200,
                start_ticks: 77,
                exit_code: Some(0),
                exiting: false,
                cpu_ticks: 8,
            }
        );
        assert!(!s.zombie());
        // A zombie that exited with code 3 (wait status 3 << 8) in its last field.
        let zombie = parse_stat(&format!(
            "4243 (x) Z 1 4200 4200 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 78 {}",
            TAIL.replace(" 0\n", " 768\n")
        ))
        .unwrap();
        assert!(zombie.zombie());
        assert_eq!(zombie.exit_code, Some(768));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("4244 (x) S 1 4200 4200 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0"), None);
    }

    #[test]
    fn statm_gives_the_resident_pages_in_bytes() {
        assert_eq!(parse_statm_rss("9004 2048 512 1 0 1500 0\n"), Some(2048 * procfs::page_size()));
        assert_eq!(parse_statm_rss("9004"), None);
        assert_eq!(parse_statm_rss(""), None);
    }

    #[test]
    fn this_process_can_be_read() {
        let me = std::process::id();
        let r = read_smaps_rollup(me).expect("own smaps_rollup");
        assert!(r.rss > 0 && r.pss > 0 && r.pss <= r.rss);
        // The counters `statm` shows and the pages `smaps_rollup` walks agree on the resident
        // size, within what this test process allocates meanwhile (its threads run on).
        let rss = read_rss(me).expect("own statm");
        assert!(rss.abs_diff(r.rss) < 64 << 20, "statm {rss} vs smaps_rollup {}", r.rss);
        let table = processes();
        let mine = table.iter().find(|p| p.pid == me).expect("this process in the table");
        assert_eq!(mine.ppid, std::os::unix::process::parent_id());
        assert!(table.iter().any(|p| p.pid == 1));
        let stat = read_stat(me).expect("own stat");
        assert_eq!((stat.pid, stat.zombie(), stat.exit_code), (me, false, Some(0)));
        // The test harness started this process with a PATH; a made-up variable is not there.
        let path = std::env::var("PATH").unwrap();
        assert!(environ_has(me, "PATH", &path));
        assert_eq!(environ_var(me, "PATH").as_deref(), Some(path.as_str()));
        assert!(!environ_has(me, "PATH", "/nowhere"));
        // A process on its way out (ESRCH, which procfs calls NotFound) is no answer; a refusal is.
        let gone = Err(procfs::ProcError::NotFound(Some("/proc/1/environ".into())));
        assert_eq!(environ_holds(gone, "PATH", &path), None);
        let refused = Err(procfs::ProcError::PermissionDenied(None));
        assert_eq!(environ_holds(refused, "PATH", &path), Some(false));
        assert_eq!(environ_var(me, "UPS_DOCTOR_NO_SUCH_VARIABLE"), None);
    }
}
