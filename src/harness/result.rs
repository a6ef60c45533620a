//! The result types moved to [`crate::schema`]; this path re-exports them only so that code
//! written against `harness::result` keeps compiling while branches merge. New code reads
//! `crate::schema`.

pub use crate::schema::*;
