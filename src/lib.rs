//! ups-doctor: finds out why distributed deep-learning training crashes, hangs or crawls.
//!
//! Two worlds, one wire: the trainer (crate `ups-doctor-trainer`, executable
//! `ups-doctor-trainer`) is the only code that uses tch (libtorch) and runs inside rank processes;
//! this crate — [`harness`], [`probe`], [`report`], [`bisect`], [`nodes`] — runs in the supervising
//! process, never loads libtorch, and talks to ranks only through processes and the [`protocol`]
//! markers; [`diagnose`] judges what they left, without IO. [`scenario`], [`protocol`] and
//! [`schema`] (the result types every stage reads) come from `ups-doctor-core`, which both sides
//! share.

// First, so that its `print!`/`eprintln!`… (which never panic on a reader that left) are the
// ones every module below sees.
#[macro_use]
pub mod output;

pub mod attach;
pub mod bisect;
pub mod diagnose;
mod error;
pub mod exit;
pub mod harness;
pub mod nodes;
pub mod probe;
pub mod report;
pub mod run_files;
pub mod secrets;
pub mod session;
pub mod sweep;

pub use ups_doctor_core::{protocol, scenario, schema};

pub use error::Error;
