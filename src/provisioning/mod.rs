//! Provisioning's pure parts: the mode, when a batch of pending pods is complete, and what
//! to buy ahead of expected growth ([`headroom`]). The agent's provisioning controller
//! ([`crate::controllers::provisioning`]) plans each batch with the scheduling simulation
//! and turns the plan into NodeClaims.
//!
//! Batching follows Karpenter: a batch closes when no new pending pod has appeared for the
//! idle window, or when the maximum window has passed since the batch opened, so a burst of
//! pods is planned together instead of one node per pod.

pub mod headroom;

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

/// Default idle window: close a batch after this long without a new pending pod.
pub const DEFAULT_IDLE_WINDOW: Duration = Duration::from_secs(1);
/// Default maximum window: close a batch this long after it opened, whatever arrives.
pub const DEFAULT_MAX_WINDOW: Duration = Duration::from_secs(10);

/// How long a pod a round could not plan (no valid NodePool, the catalog unavailable, no
/// capacity) waits before it is planned again.
pub const RETRY: SignedDuration = SignedDuration::from_secs(10);

/// Whether the agent acts or only reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Plan and report every decision with its price; change nothing.
    RecommendOnly,
    /// Launch the planned nodes.
    Autonomous,
}

/// Decides when a batch of pending pods is complete. Pure: time is passed in.
#[derive(Debug, Clone)]
pub struct Batcher {
    idle: SignedDuration,
    max: SignedDuration,
    opened: Option<Timestamp>,
    last: Option<Timestamp>,
}

impl Batcher {
    /// A batcher with the given windows.
    pub fn new(idle: Duration, max: Duration) -> Self {
        let to_signed = |d: Duration| SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX);
        Batcher {
            idle: to_signed(idle),
            max: to_signed(max),
            opened: None,
            last: None,
        }
    }

    /// Records that a pending pod appeared (or changed) at `now`.
    pub fn observe(&mut self, now: Timestamp) {
        self.opened.get_or_insert(now);
        self.last = Some(now);
    }

    /// When the open batch opened, if one is open.
    pub fn opened(&self) -> Option<Timestamp> {
        self.opened
    }

    /// Whether the open batch is complete at `now`.
    pub fn ready(&self, now: Timestamp) -> bool {
        let (Some(opened), Some(last)) = (self.opened, self.last) else {
            return false;
        };
        now.duration_since(last) >= self.idle || now.duration_since(opened) >= self.max
    }

    /// When the open batch will be complete if nothing else arrives.
    pub fn deadline(&self) -> Option<Timestamp> {
        let (opened, last) = (self.opened?, self.last?);
        let idle = last.checked_add(self.idle).ok()?;
        let max = opened.checked_add(self.max).ok()?;
        Some(idle.min(max))
    }

    /// Closes the batch.
    pub fn reset(&mut self) {
        self.opened = None;
        self.last = None;
    }
}

impl Default for Batcher {
    fn default() -> Self {
        Batcher::new(DEFAULT_IDLE_WINDOW, DEFAULT_MAX_WINDOW)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).expect("valid")
    }

    #[test]
    fn a_batch_closes_after_the_idle_window_without_new_pods() {
        let mut b = Batcher::default();
        assert!(!b.ready(t(0)));
        b.observe(t(0));
        assert!(!b.ready(t(0)));
        b.observe(t(0));
        assert!(b.ready(t(1)));
        assert_eq!(b.deadline(), Some(t(1)));
    }

    #[test]
    fn a_steady_stream_of_pods_is_cut_at_the_maximum_window() {
        let mut b = Batcher::default();
        for s in 0..10 {
            b.observe(t(s));
            assert!(!b.ready(t(s)), "{s}");
        }
        b.observe(t(10));
        assert!(b.ready(t(10)), "ten seconds after opening");
        b.reset();
        assert!(!b.ready(t(11)));
        assert_eq!(b.opened(), None);
    }
}
