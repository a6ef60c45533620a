//! Per-process memory from procfs: `smaps_rollup` (RSS, PSS, USS, shared) and the process table
//! (`/proc/<pid>/stat`: command, state, process group). Parsing is pure and tested on recorded
//! text; the `read_*` functions and [`processes`] are the procfs edge.

use std::fs;

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
}

impl ProcStat {
    pub fn zombie(&self) -> bool {
        matches!(self.state, 'Z' | 'X')
    }
}

/// Parses `smaps_rollup`; `None` when a line the figures need is missing (a kernel thread, or a
/// process that exited while being read).
pub fn parse_smaps_rollup(text: &str) -> Option<Rollup> {
    let mut fields = [None::<u64>; 6];
    const NAMES: [&str; 6] =
        ["Rss:", "Pss:", "Private_Clean:", "Private_Dirty:", "Shared_Clean:", "Shared_Dirty:"];
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let (Some(name), Some(value)) = (parts.next(), parts.next()) else {
            continue;
        };
        if let Some(i) = NAMES.iter().position(|n| *n == name) {
            // Values are in kB (KiB) whatever the unit column says.
            fields[i] = value.parse::<u64>().ok().map(|kib| kib * 1024);
        }
    }
    let [rss, pss, private_clean, private_dirty, shared_clean, shared_dirty] = fields;
    Some(Rollup {
        rss: rss?,
        pss: pss?,
        uss: private_clean? + private_dirty?,
        shared: shared_clean? + shared_dirty?,
    })
}

/// Parses `/proc/<pid>/stat`. The command sits in parentheses and may itself contain spaces and
/// parentheses, so the fields after it are found from the last `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    let command = text.get(open + 1..close)?.to_string();
    let mut rest = text[close + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    let pgid = rest.next()?.parse().ok()?;
    // After pgrp: session … starttime is the 17th field on (field 22 of stat(5)).
    let start_ticks = rest.nth(16)?.parse().ok()?;
    Some(ProcStat { pid, command, state, ppid, pgid, start_ticks })
}

/// `/proc/<pid>/smaps_rollup`, or `None` when the process is gone or unreadable.
pub fn read_smaps_rollup(pid: u32) -> Option<Rollup> {
    parse_smaps_rollup(&fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?)
}

/// `/proc/<pid>/stat`, or `None` when the process is gone or unreadable.
pub fn read_stat(pid: u32) -> Option<ProcStat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Every process on the machine, from `/proc/*/stat` (processes that vanish while being read
/// are skipped).
pub fn processes() -> Vec<ProcStat> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .filter_map(|e| fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|text| parse_stat(&text))
        .collect()
}

/// Whether `/proc/<pid>/environ` holds `key=value` (false when it cannot be read).
pub fn environ_has(pid: u32, key: &str, value: &str) -> bool {
    let Ok(bytes) = fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let wanted = format!("{key}={value}");
    bytes.split(|&b| b == 0).any(|entry| entry == wanted.as_bytes())
}

/// The value of `key` in `/proc/<pid>/environ` (the environment the process started with).
pub fn environ_var(pid: u32, key: &str) -> Option<String> {
    let bytes = fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{key}=");
    bytes
        .split(|&b| b == 0)
        .find_map(|entry| entry.strip_prefix(prefix.as_bytes()))
        .map(|v| String::from_utf8_lossy(v).into_owned())
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

    #[test]
    fn stat_survives_odd_command_names() {
        let s = parse_stat(
            "4242 (pt_data (worker) 1) S 4200 4200 4200 0 -1 4194624 301 0 0 0 5 3 0 0 20 0 1 0 77 9 3",
        )
        .unwrap();
        assert_eq!(
            s,
            ProcStat {
                pid: 4242,
                command: "pt_data (worker) 1".into(),
                state: 'S',
                ppid: 4200,
                pgid: 4200,
                start_ticks: 77
            }
        );
        assert!(!s.zombie());
        assert!(parse_stat("4243 (x) Z 1 4200 4200 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 78").unwrap().zombie());
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_process_can_be_read() {
        let me = std::process::id();
        let r = read_smaps_rollup(me).expect("own smaps_rollup");
        assert!(r.rss > 0 && r.pss > 0 && r.pss <= r.rss);
        assert!(processes().iter().any(|p| p.pid == me));
    }
}
