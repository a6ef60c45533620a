//! The judge: what every process of a scenario left (evidence) → the culprit, the collateral and
//! the known failure pattern (verdict), the same way for the built-in trainer and for a user's own
//! program. Pure: no IO, no processes, no filesystem; it reads only the result types
//! ([`crate::schema`]), the scenario and the marker protocol, none of which imports it back, so
//! there is no import circle.

pub mod catalog;
pub mod evidence;
mod verdict;

pub use catalog::{ALL as PATTERNS, Pattern, SHM_FULL_SHARE, collective_of, input_bound, used_of};
pub use evidence::{KeyLine, Observed, key_line, last_error_line};
pub use verdict::{Judgement, judge, looked_like_ranks};

#[cfg(test)]
mod purity;
