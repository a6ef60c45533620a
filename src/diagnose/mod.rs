//! The judge: what every process of a scenario left (evidence) → the culprit, the collateral and
//! the known failure pattern (verdict), the same way for the built-in trainer and for a user's own
//! program, on one node or merged from several; [`conclude`] is the one entry every caller uses
//! (outcome, first failure, collateral, verdict, `expect`). Pure: no IO, no processes, no filesystem; it reads only the result types
//! ([`crate::schema`]), the scenario and the marker protocol, none of which imports it back, so
//! there is no import circle.

pub mod attached;
pub mod catalog;
mod conclude;
pub mod evidence;
mod verdict;
pub mod words;

pub use catalog::{ALL as PATTERNS, Pattern, SHM_FULL_SHARE, collective_of, input_bound, used_of};
pub use conclude::{Circumstances, Conclusion, Unobserved, check_expectation, conclude, settle};
pub use evidence::{KeyLine, Observed, key_line, last_error_line};
pub use verdict::{Judgement, judge, looked_like_ranks};

#[cfg(test)]
mod purity;
