//! Runs a [`super::plan::Plan`]: starts its processes, feeds what happens to them into the
//! supervisor's state machine ([`machine`]) and carries out what it decides (stack dumps,
//! SIGTERM, SIGKILL), then sweeps leftovers ([`teardown`]). Sampling runs beside it
//! ([`sampler`]); [`interrupt`] wakes it on Ctrl-C. On one node of several it talks to the others
//! through a [`crate::harness::run::events::Listener`].

pub mod events;
pub mod interrupt;
pub mod machine;
mod sampler;
pub mod supervise;
mod teardown;
