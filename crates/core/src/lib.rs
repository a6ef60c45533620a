//! ups-doctor's shared types: what both worlds — the supervising `ups-doctor` and the
//! `ups-doctor-trainer` ranks — agree on, and nothing that runs.
//!
//! [`scenario`] is the scenario file model (strict loading, validation, `--set`); [`protocol`] the
//! marker wire format ranks write and the harness reads; [`schema`] the result types every later
//! stage reads (`result.json`). No libtorch, no processes, no reports: the trainer and the doctor
//! depend on this crate and never on each other.

pub mod protocol;
pub mod scenario;
pub mod schema;
