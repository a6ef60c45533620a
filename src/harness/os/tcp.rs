//! TCP sockets as the kernel lists them (`/proc/PID/net/tcp`, `tcp6`) and which process holds
//! which (`/proc/PID/fd/*` → `socket:[INODE]`): enough to tell who listens on a rendezvous port
//! and who is connected to it.

use std::collections::BTreeSet;

/// A port on 127.0.0.1 that was free a moment ago (the kernel's choice for port 0). Whoever binds
/// it next races with other programs, as torchrun's `--master-port 0` does.
pub fn free_port() -> std::io::Result<u16> {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port())
}

/// One TCP socket of a network namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Socket {
    pub local_port: u16,
    pub remote_port: u16,
    /// `LISTEN` (state `0A`).
    pub listening: bool,
    /// `ESTABLISHED` (state `01`).
    pub established: bool,
    pub inode: u64,
}

/// The TCP sockets (IPv4 and IPv6) of `pid`'s network namespace.
pub fn sockets(pid: u32) -> Vec<Socket> {
    ["tcp", "tcp6"]
        .iter()
        .filter_map(|file| std::fs::read_to_string(format!("/proc/{pid}/net/{file}")).ok())
        .flat_map(|text| parse(&text))
        .collect()
}

/// The lines of a `/proc/net/tcp` table: `sl local_address rem_address st … uid timeout inode`,
/// addresses as `HEXADDR:HEXPORT`.
pub fn parse(text: &str) -> Vec<Socket> {
    let port = |addr: &str| addr.rsplit_once(':').and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let state = *f.get(3)?;
            Some(Socket {
                local_port: port(f.get(1)?)?,
                remote_port: port(f.get(2)?)?,
                listening: state == "0A",
                established: state == "01",
                inode: f.get(9)?.parse().ok()?,
            })
        })
        .collect()
}

/// The inodes of the sockets `pid` holds open.
pub fn socket_inodes(pid: u32) -> BTreeSet<u64> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return BTreeSet::new() };
    dir.filter_map(|e| {
        let target = std::fs::read_link(e.ok()?.path()).ok()?;
        target.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
    })
    .collect()
}

/// The process listening on TCP `port` in this network namespace, and its command line: read
/// from `/proc` only (it may be anyone's; it is named, never signalled).
pub fn listener_of(port: u16) -> Option<(u32, String)> {
    let me = std::process::id();
    let inodes: BTreeSet<u64> =
        sockets(me).into_iter().filter(|s| s.listening && s.local_port == port).map(|s| s.inode).collect();
    if inodes.is_empty() {
        return None;
    }
    let pids =
        std::fs::read_dir("/proc").ok()?.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok());
    pids.filter(|&pid| pid != me).find(|&pid| !socket_inodes(pid).is_disjoint(&inodes)).map(|pid| {
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| {
                b.split(|&c| c == 0)
                    .filter(|a| !a.is_empty())
                    .map(|a| String::from_utf8_lossy(a))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        (pid, cmd)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_table_gives_ports_states_and_inodes() {
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:7239 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 41234 1 0000000000000000 100 0 0 10 0
   1: 0100007F:A2C4 0100007F:7239 01 00000000:00000000 00:00000000 00000000     0        0 41240 1 0000000000000000 20 4 30 10 -1";
        assert_eq!(
            parse(text),
            vec![
                Socket {
                    local_port: 29241,
                    remote_port: 0,
                    listening: true,
                    established: false,
                    inode: 41234
                },
                Socket {
                    local_port: 41668,
                    remote_port: 29241,
                    listening: false,
                    established: true,
                    inode: 41240
                },
            ]
        );
    }

    #[test]
    fn the_listener_of_a_port_is_another_process_found_by_its_socket() {
        let port = free_port().unwrap();
        let mut holder = std::process::Command::new("python3")
            .args(["-c", &format!("import socket,sys,time; s=socket.socket(); s.bind(('127.0.0.1',{port})); s.listen(); print(1,flush=True); time.sleep(60)")])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(holder.stdout.as_mut().unwrap()), &mut line)
            .unwrap();
        let found = listener_of(port);
        holder.kill().unwrap();
        holder.wait().unwrap();
        let (pid, cmd) = found.expect("the listener is found");
        assert_eq!(pid, holder.id());
        assert!(cmd.contains("python3 -c import socket"), "{cmd}");
    }

    #[test]
    fn a_listener_of_this_process_is_found_with_its_inode() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let me = std::process::id();
        let mine = socket_inodes(me);
        let found = sockets(me).into_iter().find(|s| s.listening && s.local_port == port).unwrap();
        assert!(mine.contains(&found.inode), "{found:?} among {mine:?}");
    }
}
