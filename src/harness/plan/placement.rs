//! Where one node's ranks sit in the world of a multi-node run: what its plan needs to give
//! each rank its global number and rendezvous.

use crate::harness::run::events::RunEvent;

/// Where this node's ranks sit in the world, for their environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePlacement {
    pub node: u32,
    pub nodes: u32,
    /// Ranks per node.
    pub local_world: u32,
    /// Node 0's address: the ranks' rendezvous (`MASTER_ADDR`).
    pub master_addr: String,
    pub master_port: u16,
    /// Where a launcher's rendezvous numbered this node's ranks from, once its ranks said so and
    /// it was not node × `local_world` (see `node_first_rank` in `harness/external.rs`).
    pub first_rank: Option<u32>,
}

impl NodePlacement {
    pub fn global_rank(&self, local: u32) -> u32 {
        self.first_rank.unwrap_or(self.node * self.local_world) + local
    }

    /// Follows the ranks where the launcher placed them (a [`RunEvent::Placed`]).
    pub fn follow(&mut self, event: &RunEvent) {
        if let RunEvent::Placed { first_rank, .. } = event {
            self.first_rank = Some(*first_rank);
        }
    }

    pub fn world(&self) -> u32 {
        self.nodes * self.local_world
    }
}
