//! The kernel log (`/dev/kmsg`), read for the OOM killer's records: opened when a scenario
//! starts, positioned at its end, and read for what came after when the scenario ends. Parsing
//! is pure ([`oom_kills_in`]).

use std::io;
use std::os::fd::OwnedFd;

use nix::errno::Errno;
use nix::fcntl::{OFlag, open};
use nix::sys::stat::Mode;
use nix::unistd::{Whence, lseek, read};

/// One kernel log record: its timestamp (µs since boot, the kernel's clock) and its text.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub ts_us: u64,
    pub text: String,
}

/// The kernel log, open from a point in time on.
pub struct KernelLog {
    fd: OwnedFd,
}

impl KernelLog {
    /// Opens `/dev/kmsg` positioned after its last record; the error says why it cannot be read
    /// (unprivileged, `kernel.dmesg_restrict`, no such device in a container).
    pub fn open_at_end() -> io::Result<KernelLog> {
        let fd = open(c"/dev/kmsg", OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC, Mode::empty())?;
        // SEEK_END on /dev/kmsg skips to after the last record.
        lseek(&fd, 0, Whence::SeekEnd)?;
        Ok(KernelLog { fd })
    }

    /// The records logged since the last read (or the open).
    pub fn read_new(&mut self) -> Vec<Record> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 8192];
        loop {
            // One record per read.
            let n = match read(&self.fd, &mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                // Records were overwritten before we read them: go on with the next.
                Err(Errno::EPIPE | Errno::EINTR) => continue,
                Err(_) => break, // EAGAIN: nothing more
            };
            if let Some(record) = parse_record(&String::from_utf8_lossy(&buf[..n])) {
                out.push(record);
            }
        }
        out
    }
}

/// `prio,seq,ts_us,flags[,…];message\n[ continuation lines]`.
fn parse_record(raw: &str) -> Option<Record> {
    let (header, text) = raw.split_once(';')?;
    let ts_us = header.split(',').nth(2)?.parse().ok()?;
    let text = text.lines().next().unwrap_or("").to_string();
    Some(Record { ts_us, text })
}

/// One OOM kill, as the kernel logged it.
#[derive(Debug, Clone, PartialEq)]
pub struct OomRecord {
    pub pid: u32,
    pub ts_us: u64,
    /// The process name (`comm`).
    pub command: String,
    pub anon_rss_bytes: Option<u64>,
    /// The memory cgroup whose limit was hit (`oom_memcg=`), and the task's own (`task_memcg=`),
    /// when the kernel printed its `oom-kill:` summary line.
    pub oom_memcg: Option<String>,
    pub task_memcg: Option<String>,
}

/// The OOM kills in `records`: each `Killed process PID (comm) … anon-rss:NkB` line, joined
/// with the `oom-kill:… task_memcg=…,pid=PID` line the kernel writes just before it.
pub fn oom_kills_in(records: &[Record]) -> Vec<OomRecord> {
    let mut summaries: Vec<(u32, Option<String>, Option<String>)> = Vec::new();
    let mut out = Vec::new();
    for r in records {
        if let Some(rest) = r.text.strip_prefix("oom-kill:") {
            let field = |key: &str| {
                rest.split(',').find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=').map(str::to_string))
            };
            if let Some(pid) = field("pid").and_then(|p| p.parse().ok()) {
                summaries.push((pid, field("oom_memcg"), field("task_memcg")));
            }
            continue;
        }
        let Some(at) = r.text.find("Killed process ") else {
            continue;
        };
        let rest = &r.text[at + "Killed process ".len()..];
        let Some((pid, after)) = rest.split_once(' ') else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        let command = after
            .strip_prefix('(')
            .and_then(|a| a.rsplit_once(')'))
            .map(|(c, _)| c.to_string())
            .unwrap_or_default();
        let anon_rss_bytes = after.split_once("anon-rss:").and_then(|(_, v)| {
            let kb: String = v.chars().take_while(char::is_ascii_digit).collect();
            kb.parse::<u64>().ok().map(|k| k * 1024)
        });
        let (oom_memcg, task_memcg) = summaries
            .iter()
            .rev()
            .find(|(p, _, _)| *p == pid)
            .map(|(_, o, t)| (o.clone(), t.clone()))
            .unwrap_or_default();
        out.push(OomRecord { pid, ts_us: r.ts_us, command, anon_rss_bytes, oom_memcg, task_memcg });
    }
    out
}

/// One Xid the NVIDIA driver logged: `NVRM: Xid (PCI:0000:3b:00): 79, pid=1957, name=python,
/// GPU has fallen off the bus.` (the driver's format, as NVIDIA's Xid catalogue shows it,
/// https://docs.nvidia.com/deploy/xid-errors/; `pid='<unknown>'` and no pid at all occur).
#[derive(Debug, Clone, PartialEq)]
pub struct XidRecord {
    pub ts_us: u64,
    pub code: u32,
    /// The GPU's PCI address (`0000:3b:00`).
    pub pci: String,
    pub pid: Option<u32>,
    /// The whole record, as the driver wrote it.
    pub text: String,
}

/// The Xid records in `records`.
pub fn xids_in(records: &[Record]) -> Vec<XidRecord> {
    records
        .iter()
        .filter_map(|r| {
            let rest = &r.text[r.text.find("NVRM: Xid (PCI:")? + "NVRM: Xid (PCI:".len()..];
            let (pci, rest) = rest.split_once("):")?;
            let rest = rest.trim_start();
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            let code = digits.parse().ok()?;
            let pid = rest.split(", ").find_map(|f| f.strip_prefix("pid=")?.trim_matches('\'').parse().ok());
            Some(XidRecord { ts_us: r.ts_us, code, pci: pci.to_string(), pid, text: r.text.clone() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_nvidia_drivers_xid_lines_with_and_without_a_pid() {
        let raw = [
            "3,900,5000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1957, name=python, GPU has fallen off the bus.",
            "3,901,6000,-;NVRM: Xid (PCI:0000:04:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0): Out Of Range Address",
            "3,902,7000,-;NVRM: Xid (PCI:0000:3b:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error",
            "6,903,8000,-;python[1957]: segfault at 0 ip 0 sp 0 error 4",
        ];
        let records: Vec<Record> = raw.iter().filter_map(|r| parse_record(r)).collect();
        let xids = xids_in(&records);
        let got: Vec<(u32, &str, Option<u32>)> =
            xids.iter().map(|x| (x.code, x.pci.as_str(), x.pid)).collect();
        assert_eq!(got, [(79, "0000:3b:00", Some(1957)), (13, "0000:04:00", None), (48, "0000:3b:00", None)]);
        assert!(xids[0].text.ends_with("GPU has fallen off the bus."));
    }

    #[test]
    fn reads_the_oom_killers_two_lines() {
        let raw = [
            "4,1201,8127381203,-;loader-w0 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
            "6,1230,8127381950,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/job/ups-doctor.1.2.0,task_memcg=/job/ups-doctor.1.2.0,task=loader-w0,pid=4242,uid=0",
            "3,1231,8127381990,-;Memory cgroup out of memory: Killed process 4242 (loader-w0) total-vm:1890212kB, anon-rss:301120kB, file-rss:70212kB, shmem-rss:0kB, UID:0 pgtables:1100kB oom_score_adj:0\n SUBSYSTEM=memory",
        ];
        let records: Vec<Record> = raw.iter().filter_map(|r| parse_record(r)).collect();
        assert_eq!(records[2].ts_us, 8_127_381_990);
        let kills = oom_kills_in(&records);
        assert_eq!(
            kills,
            vec![OomRecord {
                pid: 4242,
                ts_us: 8_127_381_990,
                command: "loader-w0".into(),
                anon_rss_bytes: Some(301_120 * 1024),
                oom_memcg: Some("/job/ups-doctor.1.2.0".into()),
                task_memcg: Some("/job/ups-doctor.1.2.0".into()),
            }]
        );
    }

    #[test]
    fn a_kill_without_its_summary_line_has_no_cgroup() {
        let records =
            [Record { ts_us: 5, text: "Out of memory: Killed process 77 (python) anon-rss:4kB".into() }];
        let kills = oom_kills_in(&records);
        assert_eq!(kills[0].pid, 77);
        assert_eq!(kills[0].command, "python");
        assert_eq!(kills[0].oom_memcg, None);
    }
}
