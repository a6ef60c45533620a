//! The job's TCP connections on this machine, read from `/proc` (each process's sockets by inode,
//! the network namespace's table): who holds the rendezvous store (`MASTER_PORT`), which ranks are
//! connected to it, and which ranks hold connections to each other (gloo's pairs, NCCL's
//! bootstrap). A rank of `WORLD_SIZE` with no connection to the store never joined, or lost it.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::harness::os::tcp;

use super::job::Job;

/// Who a process of the job is, for the sentence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case", tag = "role", content = "rank")]
pub enum Who {
    Launcher,
    Rank(u32),
    /// A process below a rank (a DataLoader worker), by its rank.
    Below(u32),
}

/// The job's TCP picture.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Connections {
    /// `MASTER_PORT`, when the ranks' environment has it.
    pub store_port: Option<u16>,
    /// The process of the job listening on it (none: the store is elsewhere, on another node or
    /// in a process that is not the job's).
    pub store_holder: Option<Who>,
    /// Ranks with an established connection to the store port.
    pub connected_to_store: Vec<u32>,
    /// Pairs of ranks connected to each other on this machine, with how many connections.
    pub peers: Vec<(u32, u32, usize)>,
}

impl Connections {
    /// One sentence of evidence.
    pub fn sentence(&self, ranks: &[u32]) -> Option<String> {
        let port = self.store_port?;
        let name = |w: Who| match w {
            Who::Launcher => "the launcher".to_string(),
            Who::Rank(r) => format!("rank {r}"),
            Who::Below(r) => format!("a process below rank {r}"),
        };
        let list = |r: &[u32]| r.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
        let mut text = match self.store_holder {
            Some(w) => format!("TCP on this machine: the rendezvous store at :{port} is held by {}", name(w)),
            None => format!(
                "TCP on this machine: no process of the job listens on :{port} (the store is elsewhere)"
            ),
        };
        let holder_rank = match self.store_holder {
            Some(Who::Rank(r)) => Some(r),
            _ => None,
        };
        // The rank that hosts the store talks to it in its own process, without a socket.
        let unconnected: Vec<u32> = ranks
            .iter()
            .copied()
            .filter(|r| !self.connected_to_store.contains(r) && Some(*r) != holder_rank)
            .collect();
        if !self.connected_to_store.is_empty() {
            text += &format!(
                "; connected to it: rank{} {}",
                plural(&self.connected_to_store),
                list(&self.connected_to_store)
            );
        }
        if !unconnected.is_empty() {
            text += &format!("; **not connected: rank{} {}**", plural(&unconnected), list(&unconnected));
        }
        if self.peers.is_empty() {
            text += "; no connection between ranks";
        } else {
            let pairs: Vec<String> = self.peers.iter().map(|(a, b, n)| format!("{a}↔{b} ({n})")).collect();
            text += &format!("; between ranks: {}", pairs.join(", "));
        }
        Some(text)
    }
}

fn plural(r: &[u32]) -> &'static str {
    if r.len() == 1 { "" } else { "s" }
}

/// Reads the job's connections now.
pub fn read(job: &Job) -> Connections {
    let store_port = job.master.as_deref().and_then(|m| m.rsplit_once(':')).and_then(|(_, p)| p.parse().ok());
    let mut owners: Vec<(u32, Who)> = job.launcher.map(|p| (p, Who::Launcher)).into_iter().collect();
    for r in &job.ranks {
        owners.push((r.pid, Who::Rank(r.rank)));
        owners.extend(r.children.iter().map(|&c| (c, Who::Below(r.rank))));
    }
    // One table for the job: its processes share a network namespace.
    let table = owners.first().map(|&(pid, _)| tcp::sockets(pid)).unwrap_or_default();
    let held: Vec<(Who, BTreeSet<u64>)> =
        owners.iter().map(|&(pid, who)| (who, tcp::socket_inodes(pid))).collect();
    let owner_of = |inode: u64| held.iter().find(|(_, set)| set.contains(&inode)).map(|(w, _)| *w);
    let rank_of = |w: Who| match w {
        Who::Rank(r) | Who::Below(r) => Some(r),
        Who::Launcher => None,
    };
    let store_holder = store_port
        .and_then(|port| table.iter().find(|s| s.listening && s.local_port == port))
        .and_then(|s| owner_of(s.inode));
    let mut connected = BTreeSet::new();
    let mut pairs: BTreeMap<(u32, u32), usize> = BTreeMap::new();
    for s in table.iter().filter(|s| s.established) {
        let Some(rank) = owner_of(s.inode).and_then(rank_of) else { continue };
        // To the store, here or on another node (a multi-node job's ranks off node 0 reach it
        // across the network: no holder here, and still connected).
        if Some(s.remote_port) == store_port {
            connected.insert(rank);
            continue;
        }
        // The other end, when it is on this machine: the socket whose local port is our remote one
        // and whose remote port is our local one.
        let other = table
            .iter()
            .find(|o| o.established && o.local_port == s.remote_port && o.remote_port == s.local_port)
            .and_then(|o| owner_of(o.inode))
            .and_then(rank_of);
        if let Some(other) = other.filter(|&o| o != rank) {
            // Counted from the lower rank's side only, so each connection once.
            if rank < other {
                *pairs.entry((rank, other)).or_default() += 1;
            }
        }
    }
    Connections {
        store_port,
        store_holder,
        connected_to_store: connected.into_iter().collect(),
        peers: pairs.into_iter().map(|((a, b), n)| (a, b, n)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sentence_names_the_holder_the_connected_and_the_missing() {
        let c = Connections {
            store_port: Some(29500),
            store_holder: Some(Who::Launcher),
            connected_to_store: vec![0, 1],
            peers: vec![(0, 1, 2)],
        };
        assert_eq!(
            c.sentence(&[0, 1, 2]).unwrap(),
            "TCP on this machine: the rendezvous store at :29500 is held by the launcher; connected to it: \
             ranks 0, 1; **not connected: rank 2**; between ranks: 0↔1 (2)"
        );
        let by_rank = Connections { store_holder: Some(Who::Rank(0)), connected_to_store: vec![1], ..c };
        assert!(!by_rank.sentence(&[0, 1]).unwrap().contains("not connected"), "rank 0 hosts the store");
    }
}
