//! ups-doctor's integration tests, as one test binary (ripgrep's `tests/tests.rs`): each module
//! runs the real `ups-doctor` binary (and the trainer beside it, and real PyTorch programs) the
//! way a user would. One binary links once and lets cargo schedule every test together.

mod util;

mod accuracy;
mod architecture;
mod attach;
mod bad_input;
mod bench;
mod bisect;
mod bundle;
mod checkpoint;
mod command;
mod consistency;
mod distributed;
mod external;
mod flight;
mod fsdp;
mod fuzz;
mod generalise;
mod gpu;
mod hostile;
mod hosts;
mod kept;
mod killed;
mod launchers;
mod lifecycle;
mod loader;
mod memory;
mod nodes;
mod observe;
mod oom;
mod outcomes;
mod patterns;
mod ray;
mod reliability;
mod render;
mod resources;
mod secrets;
mod slurm;
mod sweep;
mod trace;
mod training;
mod wheel;
