//! The simulated world: usage traces with the shapes real workloads have. The demo, the
//! backtest and the benchmarks all draw on it.

pub mod binder;
pub mod cluster;
pub mod scenario;
pub mod traces;
pub mod usage;
pub mod world;
