//! The scenario model: what to run and what outcome to expect.
//!
//! `model` is the schema (plain serde data with defaults); `load` reads files strictly (unknown
//! fields, wrong types and impossible values are errors that name file, line:column, field and a
//! fix), applies `--set` overrides and validates. Nothing here starts processes.

mod load;
mod locate;
mod model;
mod path;
mod rules;
mod size;
mod suggest;

pub use load::*;
pub use model::*;
pub use size::{SIZE_FORMS, parse_size};
