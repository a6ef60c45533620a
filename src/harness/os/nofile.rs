//! The open-file limit (`RLIMIT_NOFILE`) and how many ranks it lets ups-doctor start.
//!
//! The supervisor holds a few files per rank for the whole run (measured with `sleep` ranks
//! under `ups-doctor run`, `/proc/PID/fd` at its peak: 58 files for 10 ranks, 210 for 40, so 5.1
//! a rank and about 8 besides): the read ends of its stdout, stderr and marker pipes, its two log
//! files, and, while a rank starts, the child's ends of those pipes. The common soft limit of
//! 1024 therefore stopped the 203rd rank with `EMFILE` while the hard limit allowed far more.
//! So the soft limit is raised to the hard one at start-up (as systemd advises programs that
//! need many files to do), and a world size that still cannot fit is refused before anything
//! starts.

use nix::sys::resource::{RLIM_INFINITY, Resource, getrlimit, setrlimit};

/// Files the supervisor holds per rank it starts, with room for the ones a rank holds while it
/// starts (measured 5.1; see the module's documentation).
pub const FILES_PER_RANK: u64 = 6;
/// Files besides the ranks' (the probes', the samplers', py-spy's, a node's sockets): measured
/// about 8 for a plain run, given ample room.
pub const FILES_BESIDES: u64 = 64;

/// The open-file limit after [`raise`]: what ups-doctor may open, and the most it could be raised to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub soft: u64,
    pub hard: u64,
}

/// Raises the soft open-file limit to the hard one (idempotent; children inherit it, as they do
/// under torchrun, which does the same) and returns the limit now in force.
pub fn raise() -> Limit {
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return Limit { soft: u64::MAX, hard: u64::MAX };
    };
    let as_u64 = |v: nix::sys::resource::rlim_t| if v == RLIM_INFINITY { u64::MAX } else { v };
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return Limit { soft: as_u64(hard), hard: as_u64(hard) };
    }
    Limit { soft: as_u64(soft), hard: as_u64(hard) }
}

/// Files open in this process now.
pub fn open_now() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

/// Files ups-doctor needs open at once to start `ranks` ranks, with `open` files open already.
pub fn needed(ranks: u64, open: u64) -> u64 {
    open + FILES_BESIDES + FILES_PER_RANK * ranks
}

/// The most ranks `limit` lets ups-doctor start with `open` files open already.
pub fn most_ranks(limit: u64, open: u64) -> u64 {
    limit.saturating_sub(open + FILES_BESIDES) / FILES_PER_RANK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_bounds_the_ranks_and_the_need_is_within_it() {
        let open = 10;
        for limit in [256, 1024, 4096, 1 << 20] {
            let most = most_ranks(limit, open);
            assert!(needed(most, open) <= limit);
            assert!(needed(most + 1, open) > limit);
        }
        // The measured case: a 1024 soft limit fits ~200 ranks before the raise, not 1024.
        assert!(most_ranks(1024, 8) < 203);
    }

    #[test]
    fn raising_never_lowers_the_limit() {
        let (before, _) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        let after = raise();
        assert!(after.soft >= before);
        assert!(after.soft <= after.hard);
    }
}
