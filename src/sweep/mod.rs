//! A grid of scenario configurations, each point run under the same harness as `run`
//! (`ups-doctor sweep`): which configuration is fastest, what each costs in memory, which fail
//! and how.
//!
//! Pure: [`grid`] turns `--vary path=v1,v2` into points (each a list of `--set` overrides),
//! [`record`] is what `sweep.json` holds and how one run's result is summarised, [`verdict`]
//! judges the points (fastest passing, scaling, memory, failures, noise). Running the points,
//! the cache and the files are the session's (`session/sweep.rs`); rendering is `report`'s.

pub mod grid;
pub mod record;
pub mod verdict;

pub use grid::{Axis, AxisProblem, GridError, check_axes, label, parse_list, parse_vary, points};
pub use record::{
    DiskFull, GpuRange, PointGpu, PointMemory, PointRecord, PointRun, PointSummary, ProcessPeak, Range,
    SweepRecord, SweepVerdict, summarise_point, summarise_run,
};
pub use verdict::judge;
