//! The exit status of `ups-doctor` (`run`, `bisect`, `report`, `env`), as `--help` lists it.

/// Every scenario met its `expect` (`bisect`: a minimal failing configuration was found).
pub const MET: u8 = 0;
/// Some scenario did not meet its `expect` (`bisect`: the scenario did not fail, or the
/// budget ran out first).
pub const NOT_MET: u8 = 1;
/// Bad input: a scenario file, a `--set`, a flag's value, a report folder, or a scenario
/// this machine cannot run (no GPU for CUDA ranks, no cgroup for a memory limit).
pub const BAD_INPUT: u8 = 2;
/// ups-doctor itself failed (a folder it could not write, a probe it could not run).
pub const INTERNAL: u8 = 3;
/// Interrupted by SIGINT, SIGTERM or SIGHUP; what ran is saved and marked `interrupted`.
pub const INTERRUPTED: u8 = 130;

/// The table `--help` ends with.
pub const HELP: &str = "\
Exit status:
  0    every scenario met its `expect` (bisect: a minimal failing configuration was found)
  1    some scenario did not (bisect: the scenario did not fail, or the budget ran out)
  2    bad input: a scenario file, a --set, a flag, a report folder, or a scenario this
       machine cannot run (CUDA ranks without a GPU, a memory limit without a cgroup)
  3    internal error: ups-doctor itself failed, or could not write its folder (a full
       disk: a sweep stops there, keeping what ran, and resumes when run again)
  130  interrupted (SIGINT, SIGTERM, SIGHUP): what ran is saved, marked interrupted";
