//! Samplers and readers of machine state. `env` says what the machine is.
//! Probes observe; they never change what they observe.

pub mod env;
