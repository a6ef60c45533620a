//! The scenario model: what to run and what outcome to expect.
//!
//! `model` is the schema (plain serde data with defaults); `load` reads files strictly (unknown
//! fields, wrong types and impossible values are errors that name file, line:column, field and a
//! fix), applies `--set` overrides and validates; `command` holds the params and placeholders of
//! external training commands. Nothing here starts processes.

mod command;
mod delta;
mod explain;
mod fields;
pub mod launcher;
mod load;
mod locate;
mod model;
mod path;
mod rules;
mod size;
mod suggest;

pub use command::{
    BUILTIN_PLACEHOLDERS, COMMAND_LINE, Fill, Piece, is_identifier, pieces, placeholders, render_with,
    shell_line, shell_quote,
};
pub use delta::{describe_delta, run_relevant};
pub use fields::{lookup, when_matches};
pub use launcher::{declared_nodes, declared_ranks, flag_value, rank_flag_value, rank_flags};
pub use load::*;
pub use model::*;
pub use size::{SIZE_FORMS, SizeError, human_bytes, parse_size};
