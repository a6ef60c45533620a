//! What a stuck process is doing, read from outside: py-spy's stacks and each thread's wait
//! channel and system call (procfs); where a command's program and `py-spy` are.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use procfs::process::Syscall;

use crate::probe::run;
use crate::protocol::Marker;
use crate::schema::{KernelThread, ProcessDump, ProcessRole};

/// Where `program` is: itself when it names a path, else the first executable of that name on
/// `PATH` (as `execvp` would pick it).
pub fn find_program(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        let path = PathBuf::from(program);
        return path.is_file().then_some(path);
    }
    run::find_on_path(program)
}

/// `py-spy`, the one way every caller finds it: on `PATH`, next to the command's program (a
/// venv's `bin/python` or `bin/torchrun` has its `bin/py-spy` beside it), or next to ups-doctor
/// itself (installed into the same environment, as `pip install` puts both in its `bin/`).
pub fn find_py_spy(program: Option<&Path>) -> Option<PathBuf> {
    let beside = |dir: Option<&Path>| {
        let path = dir?.join("py-spy");
        run::is_executable(&path).then_some(path)
    };
    let own = std::env::current_exe().ok();
    find_program("py-spy")
        .or_else(|| beside(program.and_then(Path::parent)))
        .or_else(|| beside(own.as_deref().and_then(Path::parent)))
}

/// Whether a py-spy error is a refusal to read the process (ptrace permission).
pub fn ptrace_refused(error: &str) -> bool {
    ["Permission denied", "Operation not permitted", "EPERM", "ptrace"].iter().any(|n| error.contains(n))
}

/// Why py-spy may not read another process here, and the fix: the one wording for `run` and
/// `attach` alike.
pub fn ptrace_fix(who: &str) -> String {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .map(|s| format!("`kernel.yama.ptrace_scope` is {} here", s.trim()))
        .unwrap_or_else(|_| "this kernel has no Yama ptrace_scope".to_string());
    format!(
        "reading another process's memory needs ptrace permission; {scope}). Fix: run {who} as the job's user \
         or as root; or `sudo sysctl kernel.yama.ptrace_scope=0`; in a container start it with `--cap-add \
         SYS_PTRACE`"
    )
}

/// How long one `py-spy dump` may take.
const PY_SPY_TIMEOUT: Duration = Duration::from_secs(20);

/// Every thread of `pid` as py-spy sees it (Python and native frames), or why not.
pub fn py_spy_dump(py_spy: Option<&Path>, pid: u32, rank: u32, role: ProcessRole) -> ProcessDump {
    let threads = kernel_threads(pid);
    let (text, error) = match py_spy {
        None => (
            None,
            Some(
                "py-spy is not installed (not on `PATH`, not next to the program, not next to ups-doctor): `pip \
                 install py-spy` into the program's environment for Python stacks"
                    .to_string(),
            ),
        ),
        Some(py_spy) => {
            match run::bounded(Command::new(py_spy).args(["dump", "--native", "--pid", &pid.to_string()]), PY_SPY_TIMEOUT)
            {
                Ok(Some(done)) if done.status.success() => (Some(done.stdout), None),
                Ok(Some(done)) => {
                    let why = format!("{}\n{}", done.stdout.trim(), done.stderr.trim()).trim().to_string();
                    // A refusal says why and the fix on its first line: the report quotes that one.
                    let error = if ptrace_refused(&why) {
                        format!(
                            "py-spy was refused access to pid {pid} ({})\n`py-spy dump --native --pid {pid}` said: {why}",
                            ptrace_fix("ups-doctor")
                        )
                    } else {
                        format!("`py-spy dump --native --pid {pid}` failed: {why}")
                    };
                    (None, Some(error))
                }
                Ok(None) => (
                    None,
                    Some(format!(
                        "`py-spy dump --native --pid {pid}` did not answer within {}",
                        humantime::format_duration(PY_SPY_TIMEOUT)
                    )),
                ),
                Err(e) => (None, Some(format!("cannot run `{}`: {e}", py_spy.display()))),
            }
        }
    };
    ProcessDump { pid, rank, role, taken: None, py_spy: text, error, python: None, threads }
}

/// Each thread's name, kernel wait channel and current system call, from procfs.
pub fn kernel_threads(pid: u32) -> Vec<KernelThread> {
    let Some(tasks) =
        i32::try_from(pid).ok().and_then(|p| procfs::process::Process::new(p).ok()?.tasks().ok())
    else {
        return Vec::new();
    };
    let mut threads: Vec<KernelThread> = tasks
        .filter_map(Result::ok)
        .map(|task| {
            // procfs has no reader for a task's `wchan` (only the process's): read it as text.
            let wchan = std::fs::read_to_string(format!("/proc/{pid}/task/{}/wchan", task.tid))
                .ok()
                .map(|w| w.trim().to_string())
                .filter(|w| !w.is_empty() && w != "0");
            KernelThread {
                tid: task.tid as u32,
                name: task.stat().map(|s| s.comm).unwrap_or_default(),
                wchan,
                syscall: task.syscall().ok().map(|s| describe_syscall(&s)),
            }
        })
        .collect();
    threads.sort_unstable_by_key(|t| t.tid);
    threads
}

/// `/proc/PID/task/TID/syscall` in words: `202 (futex)` (the number is this architecture's),
/// `running`, or `-1` when the thread is blocked outside a system call.
fn describe_syscall(syscall: &Syscall) -> String {
    match *syscall {
        Syscall::Running => "running".to_string(),
        Syscall::Blocked { syscall_number: n, .. } => match syscall_name(n) {
            Some(name) => format!("{n} ({name})"),
            None => n.to_string(),
        },
        // `Syscall` is non-exhaustive: a form a later procfs learns to read.
        ref other => format!("{other:?}"),
    }
}

/// Names of the system calls a blocked training process usually sits in. The numbers are this
/// architecture's (libc's `SYS_*` constants differ between x86-64, aarch64, …); a call the
/// architecture lacks (aarch64 has no `poll`, `select` or `epoll_wait`) is simply not listed.
fn syscall_name(n: i64) -> Option<&'static str> {
    const NAMES: &[(libc::c_long, &str)] = &[
        (libc::SYS_read, "read"),
        (libc::SYS_write, "write"),
        #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
        (libc::SYS_poll, "poll"),
        #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
        (libc::SYS_select, "select"),
        #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
        (libc::SYS_nanosleep, "nanosleep"),
        (libc::SYS_accept, "accept"),
        (libc::SYS_recvfrom, "recvfrom"),
        (libc::SYS_sendto, "sendto"),
        (libc::SYS_recvmsg, "recvmsg"),
        (libc::SYS_wait4, "wait4"),
        (libc::SYS_waitid, "waitid"),
        (libc::SYS_futex, "futex"),
        (libc::SYS_clock_nanosleep, "clock_nanosleep"),
        #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
        (libc::SYS_epoll_wait, "epoll_wait"),
        (libc::SYS_pselect6, "pselect6"),
        (libc::SYS_ppoll, "ppoll"),
        (libc::SYS_epoll_pwait, "epoll_pwait"),
        (libc::SYS_accept4, "accept4"),
    ];
    NAMES.iter().find(|(num, _)| i64::from(*num) == n).map(|(_, name)| *name)
}

pub use crate::schema::TAKEN_AT_SIGTERM as AT_SIGTERM;

/// The Python stacks a rank wrote itself as SIGTERM stopped it (the observer's
/// `_stack_at_sigterm`: `folder/PID.txt`, the main thread's id on its first line, then
/// `faulthandler`'s dump), for the rank `pid`; `None` when it wrote none (never stopped by
/// SIGTERM, no process group formed, a handler of the program's own, or no observer).
pub fn stack_at_sigterm(folder: &Path, pid: u32, rank: u32) -> Option<ProcessDump> {
    let text = std::fs::read_to_string(folder.join(format!("{pid}.txt"))).ok()?;
    let dumped = text.lines().skip(1).any(|l| l.contains("(most recent call first)"));
    dumped.then(|| ProcessDump {
        pid,
        rank,
        role: ProcessRole::Rank,
        taken: Some(AT_SIGTERM.to_string()),
        py_spy: None,
        error: None,
        python: Some(text.trim_end().to_string()),
        threads: Vec::new(),
    })
}

/// The name of the file whose existence asks every observed rank for its Flight Recorder
/// entries (`answer_flight` in `python/site/sitecustomize.py`), in the observer's folder.
pub const FLIGHT_REQUEST: &str = "flight-request";

/// Asks every observed rank of the run for its Flight Recorder entries (once: the file stays).
pub fn ask_for_flight(folder: &Path) {
    let _ = crate::run_files::replace(&folder.join(FLIGHT_REQUEST), b"");
}

/// The text of the Flight Recorder dump a rank's observer handed over (`folder/flight-PID.json`),
/// at most 16 MiB of it (a dump of 2,000 entries is a few hundred KiB).
pub fn flight_dump(folder: &Path, pid: u32) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(folder.join(format!("flight-{pid}.json")))
        .ok()?
        .take(16 << 20)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// The step count a rank's observer kept in the file it maps (`_step_counter` in
/// `python/site/sitecustomize.py`: `folder/PID.steps`, two little-endian u64s: the steps done and
/// the `CLOCK_MONOTONIC` nanoseconds at which the last ended); `None` when it kept none.
pub fn step_counter(folder: &Path, pid: u32) -> Option<(u64, u64)> {
    let bytes = std::fs::read(folder.join(format!("{pid}.steps"))).ok()?;
    let word = |i: usize| Some(u64::from_le_bytes(bytes.get(i..i + 8)?.try_into().ok()?));
    Some((word(0)?, word(8)?)).filter(|(steps, _)| *steps > 0)
}

/// The file a rank's observer keeps its newest collectives in (`_Observer._open_tail` in
/// `python/site/sitecustomize.py`, where its layout is written down): `folder/PID.colls`, slots
/// of 256 bytes.
const TAIL_SLOT: usize = 256;

/// The collectives a rank's observer kept in the file it maps, oldest first (by the
/// `CLOCK_MONOTONIC` nanoseconds each was issued at, given with it); none where it kept none. A
/// slot never written or cut short is left out.
pub fn collective_tail(folder: &Path, pid: u32) -> Vec<(Marker, u64)> {
    let Ok(bytes) = std::fs::read(folder.join(format!("{pid}.colls"))) else { return Vec::new() };
    let mut kept: Vec<(Marker, u64)> = bytes.chunks_exact(TAIL_SLOT).filter_map(kept_collective).collect();
    kept.sort_by_key(|(m, stamp)| (*stamp, if let Marker::Collective { seq, .. } = m { *seq } else { 0 }));
    kept
}

/// One slot of that file: the collective and its stamp.
fn kept_collective(slot: &[u8]) -> Option<(Marker, u64)> {
    let word = |i: usize| Some(u64::from_le_bytes(slot.get(i..i + 8)?.try_into().ok()?));
    let state = slot[0];
    if !matches!(state, 1 | 2) {
        return None;
    }
    let (stamp, seq, pos) = (word(8)?, word(16)?, word(24)?);
    let ms = f64::from_bits(word(32)?);
    let text = &slot[40..];
    let text = std::str::from_utf8(&text[..text.iter().position(|b| *b == 0).unwrap_or(text.len())]).ok()?;
    let [op, group, shapes, dtype, site] = text.split('\u{1f}').collect::<Vec<_>>().try_into().ok()?;
    let marker = Marker::Collective {
        op: op.into(),
        group: group.into(),
        seq,
        shapes: shapes.into(),
        dtype: dtype.into(),
        site: site.into(),
        // Rounded to the microsecond, as the markers send it.
        ms: (state == 2).then_some((ms * 1000.0).round() / 1000.0),
        pos: (pos > 0).then_some(pos),
        span: None,
        skipped: 0,
    };
    Some((marker, stamp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::os::found::{FoundState, FoundWatch};

    /// The file a rank's observer keeps its newest collectives in, as `_Observer._open_tail`
    /// lays it out: 34 entries in 32 slots let go of the oldest two, the rest come oldest first
    /// whichever slot holds them, a returned one carries its time, an unwritten, garbled or cut
    /// slot is left out.
    #[test]
    fn the_collectives_a_rank_kept_are_read_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let slots = 32;
        let mut bytes = vec![0u8; slots * TAIL_SLOT];
        let count = slots as u64 + 2;
        for n in 0..count {
            let at = (n as usize % slots) * TAIL_SLOT;
            let slot = &mut bytes[at..at + TAIL_SLOT];
            slot.fill(0);
            slot[0] = if n + 1 == count { 1 } else { 2 };
            slot[8..16].copy_from_slice(&(1_000 + n).to_le_bytes());
            slot[16..24].copy_from_slice(&(n + 1).to_le_bytes());
            slot[24..32].copy_from_slice(&(if n == 2 { 0u64 } else { n + 10 }).to_le_bytes());
            slot[32..40].copy_from_slice(&0.5004f64.to_le_bytes());
            let text = format!("all_gather\u{1f}default\u{1f}1x{n}\u{1f}float32\u{1f}train.py:{n}");
            slot[40..40 + text.len()].copy_from_slice(text.as_bytes());
        }
        std::fs::write(dir.path().join("7.colls"), &bytes).unwrap();
        let kept = collective_tail(dir.path(), 7);
        let seqs: Vec<u64> = kept
            .iter()
            .map(|(m, _)| match m {
                Marker::Collective { seq, .. } => *seq,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(seqs, (3..=count).collect::<Vec<_>>(), "the oldest two let go, in the order issued");
        let Marker::Collective { op, shapes, site, ms, pos, .. } = &kept[0].0 else { unreachable!() };
        assert_eq!((op.as_str(), shapes.as_str(), site.as_str()), ("all_gather", "1x2", "train.py:2"));
        assert_eq!((*ms, *pos, kept[0].1), (Some(0.5), None, 1_002));
        let Marker::Collective { ms, pos, .. } = &kept[kept.len() - 1].0 else { unreachable!() };
        assert_eq!((*ms, *pos), (None, Some(count + 9)), "the last is still under way");
        // A slot whose text lost a field, and a file cut short, give what can be read.
        bytes[3 * TAIL_SLOT + 40..4 * TAIL_SLOT].fill(0);
        bytes[3 * TAIL_SLOT + 40..3 * TAIL_SLOT + 44].copy_from_slice(b"oops");
        bytes.truncate(10 * TAIL_SLOT + 100);
        std::fs::write(dir.path().join("7.colls"), &bytes).unwrap();
        // Slots 0-9 are left: entries 32 and 33 (slots 0, 1) and 2-9, less entry 3.
        assert_eq!(collective_tail(dir.path(), 7).len(), 2 + 8 - 1);
        assert!(collective_tail(dir.path(), 8).is_empty(), "no file");
    }

    /// No py-spy: one line with the fix, and the kernel's view of the threads all the same.
    #[test]
    fn no_py_spy_is_one_line_with_the_fix() {
        let dump = py_spy_dump(None, std::process::id(), 0, ProcessRole::Rank);
        let error = dump.error.expect("an error");
        assert_eq!(error.lines().count(), 1, "{error}");
        assert!(
            error.contains("not next to ups-doctor") && error.contains("`pip install py-spy`"),
            "{error}"
        );
        assert!(!dump.threads.is_empty());
    }

    /// A py-spy that is refused (no ptrace permission) gives the reason and the fix on the first
    /// line of the dump's error, the line the report quotes; the run goes on.
    #[test]
    fn a_py_spy_refused_by_ptrace_says_why_and_the_fix_on_its_first_line() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("py-spy");
        std::fs::write(&fake, "#!/bin/sh\necho 'Error: Operation not permitted (os error 1)' >&2\nexit 1\n")
            .unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let dump = py_spy_dump(Some(&fake), std::process::id(), 0, ProcessRole::Rank);
        let error = dump.error.expect("an error");
        let first = error.lines().next().unwrap();
        assert!(
            first.starts_with(&format!("py-spy was refused access to pid {}", std::process::id())),
            "{error}"
        );
        assert!(first.contains("--cap-add SYS_PTRACE") && first.contains("ptrace_scope"), "{error}");
        assert!(error.contains("Operation not permitted"), "py-spy's own words are kept: {error}");
        assert!(
            dump.py_spy.is_none() && !dump.threads.is_empty(),
            "the kernel's view of the threads is still read"
        );
    }

    #[test]
    fn a_step_counter_file_is_read_as_two_little_endian_words_and_a_short_or_empty_one_is_none() {
        let dir = std::env::temp_dir().join(format!("ups-doctor-step-counter-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut bytes = 4u64.to_le_bytes().to_vec();
        bytes.extend(123_456_789u64.to_le_bytes());
        std::fs::write(dir.join("10.steps"), &bytes).unwrap();
        std::fs::write(dir.join("11.steps"), &bytes[..12]).unwrap();
        std::fs::write(dir.join("12.steps"), [0u8; 16]).unwrap();
        assert_eq!(step_counter(&dir, 10), Some((4, 123_456_789)));
        assert_eq!(step_counter(&dir, 11), None);
        assert_eq!(step_counter(&dir, 12), None, "mapped, no step done yet");
        assert_eq!(step_counter(&dir, 13), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn programs_are_found_on_path_or_by_their_path() {
        assert!(find_program("sh").is_some());
        assert_eq!(find_program("/bin/sh"), Some(PathBuf::from("/bin/sh")));
        assert_eq!(find_program("ups-doctor-no-such-program"), None);
    }

    #[test]
    fn a_live_process_has_threads_with_a_syscall_and_this_one_is_no_zombie() {
        // A thread of our own that waits in the kernel until told to go. (Other tests' threads in
        // this process come and go while it is read, so only this one is judged.)
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let (tell, tid) = std::sync::mpsc::channel();
        let parked = std::thread::spawn(move || {
            tell.send(nix::unistd::gettid().as_raw() as u32).unwrap();
            wait.recv().ok();
        });
        let tid = tid.recv().unwrap();
        let me = std::process::id();
        let threads = kernel_threads(me);
        let thread = threads.iter().find(|t| t.tid == tid).expect("the parked thread is listed");
        assert!(thread.syscall.is_some(), "{thread:?}");
        go.send(()).unwrap();
        parked.join().unwrap();
        assert_eq!(FoundWatch::open(me).state(), FoundState::Running);
    }
}
