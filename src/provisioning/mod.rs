//! The provisioner: batches pending pods, plans nodes for them with the scheduling
//! simulation, and launches the planned NodeClaims through the [`CloudProvider`] — or, in
//! recommend-only mode, records the plan and its price and launches nothing.
//!
//! Batching follows Karpenter: a batch closes when no new pending pod has appeared for the
//! idle window, or when the maximum window has passed since the batch opened, so a burst of
//! pods is planned together instead of one node per pod.

pub mod headroom;

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use crate::cloud::{CloudError, CloudProvider, Instance, LaunchCandidate, LaunchRequest};
use crate::scheduling::{self, Input, Options, Plan, PlannedNodeClaim};
use crate::telemetry::Metrics;

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

/// A NodeClaim the cloud accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct Launched {
    /// The planned claim.
    pub claim: PlannedNodeClaim,
    /// The VM the cloud created (its type may be a fallback candidate).
    pub instance: Instance,
}

/// What one provisioning round did.
#[derive(Debug, Clone, PartialEq)]
pub struct Round {
    /// When the round ran.
    pub at: Timestamp,
    /// The plan.
    pub plan: Plan,
    /// Whether anything was launched (false in recommend-only mode).
    pub acted: bool,
    /// Claims launched.
    pub launched: Vec<Launched>,
    /// Claims the cloud refused, with the error.
    pub failed: Vec<(String, CloudError)>,
}

impl Round {
    /// USD/hour of what this round bought (or would have bought).
    pub fn hourly_cost(&self) -> f64 {
        if self.acted {
            self.launched
                .iter()
                .map(|l| l.instance.price_per_hour)
                .sum()
        } else {
            self.plan.summary.hourly_cost
        }
    }
}

/// Rounds a [`Provisioner`] keeps in its history, newest last.
const HISTORY: usize = 100;

/// Plans and launches nodes for pending pods.
pub struct Provisioner<C> {
    cloud: C,
    mode: Mode,
    options: Options,
    metrics: Option<Metrics>,
    history: Vec<Round>,
    counter: u64,
}

impl<C: CloudProvider> Provisioner<C> {
    /// A provisioner launching through `cloud` in `mode`.
    pub fn new(cloud: C, mode: Mode, options: Options, metrics: Option<Metrics>) -> Self {
        Provisioner {
            cloud,
            mode,
            options,
            metrics,
            history: Vec::new(),
            counter: 0,
        }
    }

    /// The last rounds (at most a hundred), oldest first: in recommend-only mode, the
    /// record of what would have been bought and its price.
    pub fn history(&self) -> &[Round] {
        &self.history
    }

    /// The cloud.
    pub fn cloud(&self) -> &C {
        &self.cloud
    }

    /// Plans for the input's pending pods and, in autonomous mode, launches the plan.
    /// `pending_since` is when each pending pod (by key) began waiting, for the
    /// provisioning-latency metric.
    pub async fn provision(
        &mut self,
        input: &Input,
        now: Timestamp,
        pending_since: &BTreeMap<String, Timestamp>,
    ) -> &Round {
        let started = std::time::Instant::now();
        self.counter += 1;
        let options = Options {
            name_prefix: format!("r{}-", self.counter),
            ..self.options.clone()
        };
        let plan = scheduling::schedule(input, &options);
        if let Some(m) = &self.metrics {
            m.observe_decision("scheduling", started.elapsed().as_secs_f64());
        }
        self.carry_out(input, plan, now, pending_since).await
    }

    /// Buys ahead of the growth `history`'s cycle expects (see [`headroom::plan`]): the
    /// nodes planned for stand-in pods are launched in autonomous mode, recorded only in
    /// recommend-only mode. Nothing when no growth is expected beyond the room the pools
    /// have.
    pub async fn buy_ahead(
        &mut self,
        input: &Input,
        history: &crate::disruption::forecast::DemandHistory,
        now: Timestamp,
        lead: i64,
        horizon: i64,
        margin: f64,
    ) -> Option<&Round> {
        self.counter += 1;
        let options = Options {
            name_prefix: format!("h{}-", self.counter),
            ..self.options.clone()
        };
        let claims = headroom::plan(
            input,
            history,
            now.as_second(),
            lead,
            horizon,
            margin,
            &options,
        );
        if claims.is_empty() {
            return None;
        }
        let plan = Plan {
            summary: scheduling::plan::Summary {
                new_nodes: claims.len(),
                hourly_cost: claims.iter().map(|c| c.price_per_hour).sum(),
                ..Default::default()
            },
            node_claims: claims,
            ..Plan::default()
        };
        Some(self.carry_out(input, plan, now, &BTreeMap::new()).await)
    }

    /// Launches a plan's claims in autonomous mode (each through its candidates, cheapest
    /// first) and records the round.
    async fn carry_out(
        &mut self,
        input: &Input,
        plan: Plan,
        now: Timestamp,
        pending_since: &BTreeMap<String, Timestamp>,
    ) -> &Round {
        let mut round = Round {
            at: now,
            acted: self.mode == Mode::Autonomous,
            plan,
            launched: Vec::new(),
            failed: Vec::new(),
        };
        if round.acted {
            for claim in &round.plan.node_claims {
                let request = launch_request(input, claim);
                match self.cloud.create(&request).await {
                    Ok(instance) => {
                        if let Some(m) = &self.metrics {
                            m.nodeclaim_launched(
                                &claim.node_pool,
                                &instance.instance_type,
                                instance.capacity_type.as_str(),
                                &instance.zone,
                            );
                            for since in claim.pods.iter().filter_map(|p| pending_since.get(p)) {
                                m.observe_provisioning(
                                    &claim.node_pool,
                                    now.duration_since(*since).as_secs_f64(),
                                );
                            }
                        }
                        round.launched.push(Launched {
                            claim: claim.clone(),
                            instance,
                        });
                    }
                    Err(e) => {
                        // Counted by the metered cloud (`cloud::metered`), as every call.
                        tracing::warn!(claim = %claim.name, error = %e, "launch failed");
                        round.failed.push((claim.name.clone(), e));
                    }
                }
            }
        } else {
            tracing::info!(
                nodes = round.plan.summary.new_nodes,
                hourly_cost = round.plan.summary.hourly_cost,
                "recommend-only: planned nodes not launched"
            );
        }
        if self.history.len() >= HISTORY {
            self.history.remove(0);
        }
        self.history.push(round);
        &self.history[self.history.len() - 1]
    }
}

/// The launch request for a planned claim: its chosen offering first, then the other
/// types that hold its pods in the same zone and capacity type, cheapest first.
pub fn launch_request(input: &Input, claim: &PlannedNodeClaim) -> LaunchRequest {
    let pool = input.pools.iter().find(|p| p.name == claim.node_pool);
    let price_of = |name: &str| {
        pool.and_then(|p| p.instance_types.iter().find(|t| t.name == name))
            .and_then(|t| {
                t.offerings
                    .iter()
                    .find(|o| o.zone == claim.zone && o.capacity_type == claim.capacity_type)
            })
            .map(|o| o.price_per_hour)
    };
    let mut candidates = vec![LaunchCandidate {
        instance_type: claim.instance_type.clone(),
        zone: claim.zone.clone(),
        capacity_type: claim.capacity_type,
        price_per_hour: claim.price_per_hour,
    }];
    for alt in &claim.alternatives {
        if let Some(price) = price_of(alt) {
            candidates.push(LaunchCandidate {
                instance_type: alt.clone(),
                zone: claim.zone.clone(),
                capacity_type: claim.capacity_type,
                price_per_hour: price,
            });
        }
    }
    LaunchRequest {
        node: crate::cloud::NodeLaunch::default(),
        claim: claim.name.clone(),
        node_pool: claim.node_pool.clone(),
        candidates,
        tags: BTreeMap::from([
            (
                crate::apis::labels::TAG_NODEPOOL.to_string(),
                claim.node_pool.clone(),
            ),
            (
                crate::apis::labels::TAG_NODECLAIM.to_string(),
                claim.name.clone(),
            ),
        ]),
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
