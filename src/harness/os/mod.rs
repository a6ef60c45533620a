//! The kernel seam of the harness: code here talks to the kernel directly (cgroupfs, pidfds,
//! `/dev/kmsg`); everything above it works on plain data. It must not decide what an
//! observation means: it reports what the kernel says.

pub mod cgroup;
pub mod kmsg;
pub mod pidfd;
pub mod tcp;
