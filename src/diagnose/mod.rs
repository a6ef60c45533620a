//! The judge: what every process of a scenario left (evidence) → the culprit, the collateral and
//! the known failure pattern (verdict), the same way for the built-in trainer and for a user's own
//! program, on one node or merged from several, or read from outside (`attach`); [`conclude`] is
//! the one entry every caller uses: it reads a result and writes into it the outcome, first
//! failure, collateral, verdict and how it met `expect`. Pure: no IO, no processes, no filesystem; it reads only the result types
//! ([`crate::schema`]), the scenario and the marker protocol, none of which imports it back, so
//! there is no import circle.

pub mod attached;
pub mod catalog;
mod conclude;
pub mod evidence;
mod nodes;
mod verdict;
pub mod words;

pub use catalog::{
    ALL as PATTERNS, Divergence, Pattern, SHM_FULL_SHARE, collective_of, flight_divergence, input_bound,
    used_of,
};
pub use conclude::{Seen, check_expectation, conclude};
pub use evidence::{KeyLine, Observed, key_line, last_error_line};
#[cfg(test)]
pub(crate) use verdict::judge;
pub use verdict::looked_like_ranks;

#[cfg(test)]
mod purity;
