//! The simulated world: usage traces with the shapes real workloads have. The demo, the
//! backtest and the benchmarks all draw on it.

pub mod binder;
pub mod cluster;
pub mod scenario;
pub mod traces;
pub mod usage;
pub mod world;

/// FNV-1a of a byte string: a stable hash for the simulation's repeatable choices.
pub(crate) fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
