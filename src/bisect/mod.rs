//! Cutting a failing scenario down to where the failure starts (`ups-doctor bisect`).
//!
//! The search is pure: which components a scenario has ([`space`]), what counts as the same
//! failure ([`signature`]), and the confirm → ladder → delta debugging → halving →
//! 1-minimality search over an [`Oracle`] that runs candidates ([`search`]). Those three start no
//! processes, touch no files and never use tch. The IO edge around them is [`executor`] (an
//! [`Oracle`] that runs candidates as real supervised scenarios), [`session`] (one bisect: the
//! persisted [`Cache`], the search, the record) and [`record`] (what `bisect.json` holds);
//! [`command_line`] says a command's result in the command's own words.

pub mod command_line;
pub mod executor;
pub mod record;
pub mod search;
pub mod session;
pub mod signature;
pub mod space;

#[cfg(test)]
mod tests;

pub use crate::scenario::describe_delta;
pub use command_line::MinimalCommand;
pub use record::{BisectRecord, DifferentFailure, ProbeRow};
pub use search::{BoundaryEntry, Cache, Options, Oracle, Outcome, Probe, ProbeVerdict, Strategy, bisect};
pub use session::{Request, SessionError, run as run_session};
pub use signature::{Observation, Signature};
pub use space::{Assignment, Component, CutError, Kind, Setting, apply, config_hash, derive};
