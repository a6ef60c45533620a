//! The kernel seam of the harness: code here talks to the kernel directly (spawn, process groups,
//! signals and `waitid` in `process`, ownership checks in `owner`, a run's proof of life across PID namespaces in `life`, the private `/dev/shm` mount
//! namespace in `namespace`, cgroupfs, `/dev/kmsg`, and in `sys` the calls nix does not wrap: pidfds, `_exit`, …); everything above it works on plain
//! data. It must not decide what an
//! observation means: it reports what the kernel says.

pub mod capture;
pub mod cgroup;
pub(crate) mod cleanup;
pub(crate) mod found;
pub mod kmsg;
pub mod life;
pub(crate) mod namespace;
pub mod nofile;
pub(crate) mod owner;
pub(crate) mod process;
pub mod stacks;
pub mod sys;
pub mod tcp;
pub mod tree;

pub use sys::terminal_columns;
