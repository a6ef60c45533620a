//! ups-doctor: finds out why distributed deep-learning training crashes, hangs or crawls.
//!
//! Two worlds, one wire: [`trainer`] is the only module that uses tch (libtorch) and runs inside
//! rank processes; [`harness`], [`probe`], [`report`] and [`scenario`] run in the supervising
//! process and talk to ranks only through processes and the [`protocol`] markers; [`diagnose`] judges
//! what they left, without IO. [`schema`] holds the result types they all read.

// First, so that its `print!`/`eprintln!`… (which never panic on a reader that left) are the
// ones every module below sees.
#[macro_use]
pub mod output;

pub mod bisect;
pub mod diagnose;
mod error;
pub mod harness;
pub mod nodes;
pub mod probe;
pub mod protocol;
pub mod report;
pub mod run_files;
pub mod scenario;
pub mod schema;
pub mod secrets;
pub mod trainer;

pub use error::{Error, exit};
