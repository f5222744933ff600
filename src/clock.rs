//! Time as an injected dependency: the real clock in a cluster, a virtual one in the
//! simulator, the demo and tests. Decision code never reads a clock; it is handed `now`.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use jiff::Timestamp;

/// A source of the current time.
pub trait Clock: Send + Sync {
    /// The current instant.
    fn now(&self) -> Timestamp;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that moves only when told to; clones share the same time.
#[derive(Debug, Clone)]
pub struct VirtualClock {
    now: Arc<Mutex<Timestamp>>,
}

impl VirtualClock {
    /// A virtual clock starting at `start`.
    pub fn new(start: Timestamp) -> Self {
        VirtualClock {
            now: Arc::new(Mutex::new(start)),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        // A virtual clock is only ever advanced by scenario steps far below jiff's
        // ~20,000-year range; saturate rather than fail if a test overshoots.
        *now = now
            .checked_add(jiff::SignedDuration::try_from(by).unwrap_or(jiff::SignedDuration::MAX))
            .unwrap_or(Timestamp::MAX);
    }

    /// Sets the clock to `to` (which may be earlier, to replay a scenario).
    pub fn set(&self, to: Timestamp) {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner) = to;
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Timestamp {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Tokio's clock, read as the time from `origin` on: under a runtime whose time is paused
/// (the demo's), time moves only as the runtime's timers fire, so what the controllers
/// read as now and what they sleep for are one virtual time.
#[derive(Debug, Clone, Copy)]
pub struct RuntimeClock {
    origin: Timestamp,
    at: tokio::time::Instant,
}

impl RuntimeClock {
    /// Reads `origin` now.
    pub fn starting_at(origin: Timestamp) -> Self {
        RuntimeClock {
            origin,
            at: tokio::time::Instant::now(),
        }
    }
}

impl Clock for RuntimeClock {
    fn now(&self) -> Timestamp {
        let elapsed =
            jiff::SignedDuration::try_from(self.at.elapsed()).unwrap_or(jiff::SignedDuration::MAX);
        self.origin.checked_add(elapsed).unwrap_or(Timestamp::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_clock_moves_only_when_advanced_and_clones_share_time() {
        let start = Timestamp::from_second(1_700_000_000).expect("valid instant");
        let clock = VirtualClock::new(start);
        let shared = clock.clone();
        assert_eq!(clock.now(), start);
        shared.advance(Duration::from_secs(90));
        assert_eq!(clock.now().as_second(), 1_700_000_090);
    }

    #[tokio::test(start_paused = true)]
    async fn the_runtime_clock_moves_with_the_paused_runtimes_timers() {
        let start = Timestamp::from_second(1_800_000_000).expect("valid instant");
        let clock = RuntimeClock::starting_at(start);
        assert_eq!(clock.now(), start);
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(clock.now().as_second(), 1_800_003_600);
    }
}
