//! The disruption controller: the leader evaluates the cluster with the pure decisions of
//! [`crate::disruption`] and carries out one command at a time through NodeClaims.
//!
//! A decision waits out a validation delay and is checked again on the cluster as it is
//! then. Its state lives on the objects, so a restart or a new leader continues it:
//!
//! 1. the old NodeClaims are annotated with the command's id and the number of replacements
//!    it needs, and their nodes tainted `tailor.sh/disrupted:NoSchedule`;
//! 2. replacement NodeClaims are created, annotated with the same id;
//! 3. once every replacement is Initialized, the old NodeClaims are deleted and their
//!    termination drains them through the Eviction API;
//! 4. a command whose replacements are missing, or not ready within the registration TTL,
//!    is undone: the taint and annotations are removed, unfinished replacements deleted.
//!
//! When to finish or undo is [`crate::disruption::controller::progress`].
//!
//! For a NodePool in recommend-only mode every decision over its nodes is published as an
//! Event on the pool with its saving in $/hour, counted in the decision metrics, and
//! nothing is touched. Each mode's pools are decided with the other's held
//! ([`crate::disruption::Cluster::held`]), so a recommend-only pool is never disrupted by a
//! decision that started in an autonomous one, nor does it hide the autonomous pools'
//! decisions behind its own.

use super::state::InOrder;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::provisioning::node_claim_for;
use super::{Context, reference};
use crate::apis::nodeclaim::condition;
use crate::apis::{NodeClaim, NodePool, labels};
use crate::cloud::CloudProvider;
use crate::disruption::controller::{InFlight, Progress, Validation, progress};
use crate::disruption::{self, Decision};
use crate::provisioning::Mode;
use crate::state::Snapshot;

/// A recommend-only decision is reported again after this long, not on every pass.
const REPORT_AGAIN: SignedDuration = SignedDuration::from_mins(10);
/// The summary waits at least this many times as long as the last one took: it takes at
/// most about a tenth of the controller's time.
const SUMMARY_SHARE: u32 = 10;

/// Annotation on the NodeClaims a command disrupts, and on its replacements: the command id.
pub const COMMAND_ANNOTATION: &str = "tailor.sh/disruption-command";
/// Annotation on a disrupted NodeClaim: how many replacements its command needs.
pub const REPLACEMENTS_ANNOTATION: &str = "tailor.sh/disruption-replacements";
/// Annotation on a disrupted NodeClaim: when its command began (RFC 3339).
pub const STARTED_ANNOTATION: &str = "tailor.sh/disruption-started";
/// Annotation on a replacement NodeClaim: it replaces nodes of this command.
pub const REPLACES_ANNOTATION: &str = "tailor.sh/replaces";

/// Commands in flight, read from the NodeClaims' annotations.
pub fn in_flight(claims: &[Arc<NodeClaim>]) -> Vec<InFlight> {
    let mut by_id: BTreeMap<String, InFlight> = BTreeMap::new();
    for c in claims
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
    {
        let a = c.annotations();
        if let Some(id) = a.get(COMMAND_ANNOTATION) {
            let entry = by_id.entry(id.clone()).or_insert_with(|| InFlight {
                id: id.clone(),
                old: Vec::new(),
                needed: 0,
                replacements: Vec::new(),
                started: None,
            });
            entry.old.push(c.name_any());
            entry.needed = a
                .get(REPLACEMENTS_ANNOTATION)
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            let marked = c
                .annotations()
                .get(STARTED_ANNOTATION)
                .and_then(|t| t.parse::<Timestamp>().ok());
            entry.started = match (entry.started, marked) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
    }
    for c in claims
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
    {
        if let Some(id) = c.annotations().get(REPLACES_ANNOTATION)
            && let Some(cmd) = by_id.get_mut(id)
        {
            let ready = c.condition_true(condition::INITIALIZED);
            cmd.replacements.push((c.name_any(), ready));
        }
    }
    by_id.into_values().collect()
}

/// Runs the disruption controller until aborted.
pub async fn run<C: CloudProvider + 'static>(ctx: Arc<Context<C>>) {
    ctx.state.wait_synced().await;
    let timers = ctx.settings.timers;
    let mut validation = Validation::new(timers.validation_delay);
    let mut reported: HashMap<String, Timestamp> = HashMap::new();
    let mut explained = Explained::default();
    let mut last_summary: Option<Timestamp> = None;
    let mut summary_took = Duration::ZERO;
    // The requests' daily and weekly cycle, learnt while the agent leads and kept in a
    // ConfigMap (until a day is recorded nothing is expected); read back on taking the
    // lead, and written as it grows.
    let mut leading = false;
    let mut saved: Option<i64> = None;
    // The stores' generation, the time of the last pass that found nothing to do and when
    // the first wait blocking a node then ends (unix seconds), and the generation the last
    // summary (the reports and metrics) was made on.
    let mut consolidated: Option<(u64, Timestamp, Option<i64>)> = None;
    let mut summarized_on: Option<u64> = None;
    // The pods as last read, so a pass reads only those that changed.
    let mut pods = crate::scheduling::PodMemo::default();
    loop {
        tokio::time::sleep(timers.disruption_interval).await;
        if !ctx.writer.is_leader() {
            validation.clear();
            pods = crate::scheduling::PodMemo::default();
            leading = false;
            last_summary = None;
            consolidated = None;
            summarized_on = None;
            continue;
        }
        if !leading {
            leading = true;
            super::demand::load(&ctx).await;
        }
        let now = ctx.clock.now();
        let claims = ctx.state.node_claims.in_order();
        let commands = in_flight(&claims);
        if !commands.is_empty() {
            validation.clear();
            for cmd in &commands {
                if let Err(e) = advance(&ctx, cmd, now).await {
                    tracing::warn!(command = %cmd.id, error = %e, "disruption command step failed");
                }
            }
            continue;
        }
        // Nothing to disrupt while capacity is launching or before Tailor manages a node: the
        // check needs only the claims, so the pass copies nothing then.
        if settling(&claims) {
            validation.clear();
            if claims
                .iter()
                .all(|c| c.metadata.deletion_timestamp.is_some())
            {
                ctx.metrics.set_disruption_blocked(std::iter::empty());
                ctx.metrics.set_savings_available(
                    crate::telemetry::names::SavingsSource::Consolidation,
                    0.0,
                );
            }
            continue;
        }
        drop(claims);
        // As Karpenter's consolidated state: a cluster that has not changed since a pass
        // found nothing to do would give nothing again. It is looked at again after a
        // change, or once the clock may have changed the answer (a node's quiet time
        // passing, an expiry, the cycle's expectation), at the demand history's grain. The
        // summary (recommend-only pools' reports, the savings metrics) is still made once on
        // the changed cluster, when it is due.
        let generation = ctx.state.generation();
        if consolidated.is_some_and(|(g, at, wake)| {
            g == generation
                && now.duration_since(at) < timers.consolidated_recheck
                && wake.is_none_or(|w| now.as_second() < w)
        }) && summarized_on == Some(generation)
        {
            continue;
        }
        consolidated = None;
        let mut snapshot = disruption_view(&ctx.state);
        let Ok(types) = ctx.instance_types().await else {
            validation.clear();
            continue;
        };
        let Ok(mut cluster) = disruption::Cluster::from_snapshot_remembering(
            &snapshot,
            &types,
            now.as_second(),
            &mut pods,
        ) else {
            validation.clear();
            continue;
        };
        let newest = {
            let mut demand = ctx.demand.lock().unwrap_or_else(|e| e.into_inner());
            demand.record(&cluster.input, cluster.now);
            cluster.expected =
                demand.expected(&cluster.input, cluster.now, ctx.settings.forecast_horizon);
            if ctx.settings.forecast_horizon > 0 {
                cluster.falling = demand.expected_fall(
                    &cluster.input,
                    cluster.now,
                    disruption::SCALE_DOWN_WINDOW,
                );
            }
            demand.newest()
        };
        if newest.is_some_and(|t| saved.is_none_or(|s| t - s >= super::demand::SAVE_EVERY)) {
            saved = newest;
            super::demand::save(&ctx).await;
        }
        // The cluster model holds what is decided over; the pods' copy goes before the
        // evaluation and the writes that follow.
        snapshot.pods = Vec::new();
        let marks = claim_marks(&cluster);
        mark(&ctx, &snapshot, &marks, now).await;
        let modes = PoolModes::of(&ctx, &snapshot, &cluster);
        // What to carry out: the first decision over the autonomous pools, the
        // recommend-only ones held (their nodes still take moved pods).
        let (decision, waiting) =
            if summary_due(last_summary, summary_took, timers.disruption_summary, now) {
                last_summary = Some(now);
                summarized_on = Some(generation);
                let started = std::time::Instant::now();
                let outcome = summarize(
                    &ctx,
                    &mut cluster,
                    &modes,
                    &snapshot,
                    (&mut reported, &mut explained),
                    now,
                )
                .await;
                summary_took = started.elapsed();
                outcome
            } else {
                decide(&ctx, &mut cluster, &modes)
            };
        if decision.is_none() {
            // Looked at again when the first wait that holds a node ends (a node's quiet
            // time after its pods moved), not only at the periodic re-check.
            consolidated = Some((
                generation,
                now,
                cluster.next_wait_end(|n| waiting.contains(n)),
            ));
        }
        if let Some(decision) = validation.offer(now, decision)
            && let Err(e) = start(&ctx, &snapshot, &cluster, &decision, now).await
        {
            tracing::warn!(error = %e, "starting a disruption failed");
        }
    }
}

/// Whether the summary is due at `now`: `every` after the last (every decision of every
/// pool, the savings available, the blocked nodes, the recommend-only reports, is evaluated
/// that often; what to carry out, on every pass), and at least [`SUMMARY_SHARE`] times as long as the last took. Evaluating every decision costs far
/// more than the first alone (about 280 times on 500 nodes, `cargo bench --bench
/// disruption_memory`), so on a large cluster the summary comes less often rather than
/// taking most of the controller's time.
fn summary_due(
    last: Option<Timestamp>,
    took: Duration,
    every: SignedDuration,
    now: Timestamp,
) -> bool {
    let wait = SignedDuration::try_from(took.saturating_mul(SUMMARY_SHARE))
        .unwrap_or(SignedDuration::MAX)
        .max(every);
    last.is_none_or(|t| now.duration_since(t) >= wait)
}

fn method_name(d: &Decision) -> &'static str {
    match d.method {
        disruption::Method::Empty => "empty",
        disruption::Method::Drift => "drift",
        disruption::Method::Multi => "multi",
        disruption::Method::Single => "single",
        disruption::Method::Expiration => "expiration",
    }
}

fn pool_of_node(snapshot: &Snapshot, node: &str) -> Option<String> {
    snapshot
        .nodes
        .iter()
        .find(|n| n.name_any() == node)?
        .labels()
        .get(labels::NODE_POOL)
        .cloned()
}

/// The snapshot disruption decides over: valid pools only and, of the unbound pods, those the
/// scheduler gave up on, so that a node they would land on is not taken away under them. The
/// pods are filtered while copying out of the stores: one copy, of only what is decided over.
fn disruption_view(state: &super::state::State) -> Snapshot {
    let mut view = state.snapshot_with_pods(|p| {
        p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
            || super::provisioning::is_provisionable(p)
    });
    view.node_pools
        .retain(|p| super::provisioning::validate_pool(p).is_ok());
    view
}

/// Whether the cluster is not settled enough to disrupt: no live claim (Tailor manages no
/// node), or capacity still launching (pods are on their way to the new nodes, and a
/// consolidation now would be undone within minutes).
fn settling(claims: &[Arc<NodeClaim>]) -> bool {
    let live: Vec<&Arc<NodeClaim>> = claims
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .collect();
    live.is_empty()
        || live
            .iter()
            .any(|c| !c.condition_true(condition::INITIALIZED))
}

/// The NodePools by the mode that applies to them now.
struct PoolModes {
    /// Recommend-only pools: reported, never acted on.
    recommend: BTreeSet<String>,
    /// Autonomous pools: acted on.
    autonomous: BTreeSet<String>,
    /// Whether a node of a recommend-only pool exists.
    recommend_nodes: bool,
    /// Whether a node of an autonomous pool exists.
    autonomous_nodes: bool,
}

impl PoolModes {
    fn of<C: CloudProvider>(
        ctx: &Context<C>,
        snapshot: &Snapshot,
        cluster: &disruption::Cluster,
    ) -> Self {
        let (recommend, autonomous): (Vec<&NodePool>, Vec<&NodePool>) = snapshot
            .node_pools
            .iter()
            .partition(|p| ctx.disruption_mode_for(Some(p)) == Mode::RecommendOnly);
        let names = |pools: Vec<&NodePool>| -> BTreeSet<String> {
            pools.into_iter().map(|p| p.name_any()).collect()
        };
        let (recommend, autonomous) = (names(recommend), names(autonomous));
        let has_nodes = |set: &BTreeSet<String>| {
            cluster
                .nodes
                .iter()
                .any(|m| m.pool.as_ref().is_some_and(|p| set.contains(p)))
        };
        PoolModes {
            recommend_nodes: has_nodes(&recommend),
            autonomous_nodes: has_nodes(&autonomous),
            recommend,
            autonomous,
        }
    }
}

/// The first decision to carry out on the cluster now: over the autonomous pools' nodes,
/// the recommend-only pools held. `cluster` is the disruption view; it is left holding
/// the recommend-only pools, as [`start`] re-validates over it.
fn decide<C: CloudProvider>(
    ctx: &Context<C>,
    cluster: &mut disruption::Cluster,
    modes: &PoolModes,
) -> (Option<Decision>, BTreeSet<String>) {
    cluster.held = modes.recommend.clone();
    if !modes.autonomous_nodes {
        return (None, BTreeSet::new());
    }
    let settings = disruption::Settings {
        all: false,
        ..ctx.settings.disruption.clone()
    };
    let started = std::time::Instant::now();
    let report = disruption::evaluate(cluster, &settings);
    ctx.metrics
        .observe_decision("consolidation", started.elapsed().as_secs_f64());
    let waiting = waiting_on_time(report.blocked.iter());
    (report.decisions.into_iter().next(), waiting)
}

/// The blocked nodes held only by a wait that ends by itself: their pool's
/// `consolidateAfter` since a pod change, or capacity bought ahead until its growth comes.
fn waiting_on_time<'a>(blocked: impl Iterator<Item = &'a disruption::Blocked>) -> BTreeSet<String> {
    use crate::telemetry::names::BlockedReason;
    blocked
        .filter(|b| {
            BlockedReason::classify(&b.reason) == BlockedReason::ConsolidateAfter
                || b.reason.starts_with("bought ahead")
        })
        .map(|b| b.node.clone())
        .collect()
}

/// Every decision on the cluster now, each mode's pools evaluated with the other's held:
/// the savings available and the blocked nodes go to the metrics, and each decision over
/// a recommend-only pool is published as an Event on that pool with its saving (again
/// after [`REPORT_AGAIN`]) and counted; nothing is touched. Returns the first decision
/// over the autonomous pools, as [`decide`] would, `cluster` left as it leaves it.
async fn summarize<C: CloudProvider>(
    ctx: &Context<C>,
    cluster: &mut disruption::Cluster,
    modes: &PoolModes,
    snapshot: &Snapshot,
    (reported, explained): (&mut HashMap<String, Timestamp>, &mut Explained),
    now: Timestamp,
) -> (Option<Decision>, BTreeSet<String>) {
    let started = std::time::Instant::now();
    let mut run = |held: &BTreeSet<String>, any: bool| {
        if !any {
            return disruption::Report::default();
        }
        cluster.held = held.clone();
        disruption::evaluate(
            cluster,
            &disruption::Settings {
                all: true,
                ..ctx.settings.disruption.clone()
            },
        )
    };
    let reporting = run(&modes.autonomous, modes.recommend_nodes);
    let acting = run(&modes.recommend, modes.autonomous_nodes);
    cluster.held = modes.recommend.clone();
    ctx.metrics
        .observe_decision("consolidation", started.elapsed().as_secs_f64());
    ctx.metrics.set_disruption_blocked(
        acting
            .blocked
            .iter()
            .chain(&reporting.blocked)
            .map(|b| b.reason.as_str()),
    );
    ctx.metrics.set_savings_available(
        crate::telemetry::names::SavingsSource::Consolidation,
        acting
            .decisions
            .iter()
            .chain(&reporting.decisions)
            .map(|d| d.savings_per_hour.max(0.0))
            .sum(),
    );
    let prices: HashMap<&str, f64> = cluster
        .input
        .nodes
        .iter()
        .zip(&cluster.nodes)
        .filter_map(|(n, m)| Some((n.name.as_str(), m.price_per_hour?)))
        .collect();
    let blocked: Vec<&disruption::Blocked> =
        acting.blocked.iter().chain(&reporting.blocked).collect();
    for (node, reason, note) in explained.due(&blocked, &prices, now) {
        let object = match snapshot
            .node_claims
            .iter()
            .find(|c| c.status.as_ref().and_then(|s| s.node_name.as_ref()) == Some(&node))
        {
            Some(claim) => reference(claim),
            None => match snapshot.nodes.iter().find(|n| n.name_any() == node) {
                Some(n) => reference(n),
                None => continue,
            },
        };
        ctx.writer
            .event(&object, EventType::Normal, reason, "Disrupt", note)
            .await;
    }
    reported.retain(|_, t| now.duration_since(*t) < REPORT_AGAIN);
    for decision in &reporting.decisions {
        let key = format!("{:?}:{}", decision.method, decision.nodes.join(","));
        if reported.contains_key(&key) {
            continue;
        }
        reported.insert(key, now);
        ctx.metrics
            .disruption_decision(method_name(decision), "recommend");
        let pools: BTreeSet<String> = decision
            .nodes
            .iter()
            .filter_map(|n| pool_of_node(snapshot, n))
            .collect();
        for pool in snapshot
            .node_pools
            .iter()
            .filter(|p| pools.contains(&p.name_any()))
        {
            ctx.writer
                .event(
                    &reference(pool),
                    EventType::Normal,
                    "WouldDisrupt",
                    "Disrupt",
                    format!(
                        "recommend-only: {} {} saving ${:.4}/hour ({} pod(s) would move); nothing done",
                        method_name(decision),
                        decision.nodes.join(", "),
                        decision.savings_per_hour,
                        decision.pods_moved.len()
                    ),
                )
                .await;
        }
    }
    let waiting = waiting_on_time(acting.blocked.iter().chain(&reporting.blocked));
    (acting.decisions.into_iter().next(), waiting)
}

/// A blocked node's reason is told again (as an Event on its NodeClaim) after this long,
/// if it has not changed; a changed reason is told at once.
const BLOCKED_AGAIN: SignedDuration = SignedDuration::from_hours(1);

/// At most this many blocked nodes are told why per summary; the rest on the next ones, so
/// that a large cluster's first summary does not wait on hundreds of Event writes.
const EXPLAINED_PER_SUMMARY: usize = 50;

/// Which blocked nodes were told why, and when: each node's reason is told once, again
/// when it changes, and again after [`BLOCKED_AGAIN`].
#[derive(Default)]
pub struct Explained(HashMap<String, (String, Timestamp)>);

impl Explained {
    /// The Events due now for `blocked` nodes: (node, Event reason, note). Waits that end
    /// by themselves within seconds or minutes (consolidateAfter after a pod change, a
    /// decision in flight) and nodes Tailor does not manage are not told; a node that
    /// is no longer blocked is forgotten. The reason is `Unconsolidatable` when no
    /// cheaper arrangement exists (as Karpenter names it), `DisruptionBlocked` otherwise;
    /// the note says why and what the node costs.
    pub fn due(
        &mut self,
        blocked: &[&disruption::Blocked],
        prices: &HashMap<&str, f64>,
        now: Timestamp,
    ) -> Vec<(String, &'static str, String)> {
        use crate::telemetry::names::BlockedReason;
        let mut out = Vec::new();
        let mut still = BTreeSet::new();
        for b in blocked {
            let class = BlockedReason::classify(&b.reason);
            if matches!(
                class,
                BlockedReason::ConsolidateAfter
                    | BlockedReason::InFlight
                    | BlockedReason::Unmanaged
            ) {
                continue;
            }
            still.insert(b.node.clone());
            let fresh = self.0.get(&b.node).is_none_or(|(reason, at)| {
                *reason != b.reason || now.duration_since(*at) >= BLOCKED_AGAIN
            });
            if !fresh || out.len() >= EXPLAINED_PER_SUMMARY {
                continue;
            }
            self.0.insert(b.node.clone(), (b.reason.clone(), now));
            let event = if class == BlockedReason::NoCheaperReplacement {
                "Unconsolidatable"
            } else {
                "DisruptionBlocked"
            };
            let cost = prices
                .get(b.node.as_str())
                .map(|p| format!("; node {} costs ${p:.4}/hour", b.node))
                .unwrap_or_default();
            out.push((b.node.clone(), event, format!("{}{cost}", b.reason)));
        }
        self.0.retain(|node, _| still.contains(node));
        out
    }
}

/// What the Drifted and Consolidatable conditions of one node's claim should say.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimMarks {
    /// The node.
    pub node: String,
    /// Why it has drifted, if it has.
    pub drifted: Option<String>,
    /// Whether its pool's `consolidateAfter` has passed since the last pod change.
    pub consolidatable: bool,
}

/// The marks of every node Tailor manages, from the disruption view. Pure.
pub fn claim_marks(cluster: &disruption::Cluster) -> Vec<ClaimMarks> {
    cluster
        .input
        .nodes
        .iter()
        .zip(&cluster.nodes)
        .filter_map(|(node, meta)| {
            let rules = cluster.rules.get(meta.pool.as_ref()?)?;
            let quiet_since = meta.last_pod_event.or(meta.created).unwrap_or(cluster.now);
            let consolidatable = rules
                .consolidate_after
                .is_some_and(|after| cluster.now.saturating_sub(quiet_since) >= after);
            Some(ClaimMarks {
                node: node.name.clone(),
                drifted: meta.drifted.clone(),
                consolidatable,
            })
        })
        .collect()
}

/// Writes the Drifted and Consolidatable conditions where they changed.
async fn mark<C: CloudProvider>(
    ctx: &Context<C>,
    snapshot: &Snapshot,
    marks: &[ClaimMarks],
    now: Timestamp,
) {
    use crate::apis::nodeclaim::reason;
    for m in marks {
        let Some(claim) = snapshot
            .node_claims
            .iter()
            .find(|c| c.status.as_ref().and_then(|s| s.node_name.as_ref()) == Some(&m.node))
        else {
            continue;
        };
        let current = claim
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        let drifted = match &m.drifted {
            Some(why) => super::nodeclaim::condition(
                condition::DRIFTED,
                true,
                reason::DRIFTED,
                why.clone(),
                now,
            ),
            None => super::nodeclaim::condition(condition::DRIFTED, false, "NotDrifted", "", now),
        };
        let consolidatable = if m.consolidatable {
            super::nodeclaim::condition(
                condition::CONSOLIDATABLE,
                true,
                "ConsolidateAfterElapsed",
                "",
                now,
            )
        } else {
            super::nodeclaim::condition(
                condition::CONSOLIDATABLE,
                false,
                reason::RECENT_POD_CHANGE,
                "",
                now,
            )
        };
        let same = |c: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition| {
            crate::apis::find_condition(&current, &c.type_).is_some_and(|have| {
                have.status == c.status && have.reason == c.reason && have.message == c.message
            })
        };
        if same(&drifted) && same(&consolidatable) {
            continue;
        }
        let mut status = crate::apis::NodeClaimStatus::default();
        for c in [drifted, consolidatable] {
            // Keep the transition time of a condition whose status did not change.
            let keep = crate::apis::find_condition(&current, &c.type_)
                .filter(|have| have.status == c.status);
            status.conditions.push(match keep {
                Some(have) => k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                    last_transition_time: have.last_transition_time.clone(),
                    ..c
                },
                None => c,
            });
        }
        if let Err(e) = ctx
            .writer
            .apply_node_claim_status(&claim.name_any(), "disruption", &status)
            .await
        {
            tracing::debug!(nodeclaim = %claim.name_any(), error = %e, "marking drift and consolidation failed");
        }
    }
}

/// Marks the old claims and creates the replacements. `cluster` is this pass's model, built
/// from `snapshot` (the disruption view, its pods already dropped).
async fn start<C: CloudProvider>(
    ctx: &Context<C>,
    snapshot: &Snapshot,
    cluster: &disruption::Cluster,
    decision: &Decision,
    now: Timestamp,
) -> Result<(), String> {
    let settings = disruption::Settings {
        all: false,
        ..ctx.settings.disruption.clone()
    };
    let plan = disruption::revalidate(cluster, &settings, decision)?;
    let id = format!("{}-{:08x}", method_name(decision), ctx.names.number());
    let claims: Vec<&NodeClaim> = decision
        .nodes
        .iter()
        .filter_map(|node| {
            snapshot
                .node_claims
                .iter()
                .find(|c| c.status.as_ref().and_then(|s| s.node_name.as_ref()) == Some(node))
        })
        .collect();
    if claims.len() != decision.nodes.len() {
        return Err(format!(
            "not every node of {:?} has a NodeClaim",
            decision.nodes
        ));
    }
    ctx.metrics
        .disruption_decision(method_name(decision), "autonomous");
    tracing::info!(command = %id, method = method_name(decision), nodes = ?decision.nodes, replacements = plan.node_claims.len(), pods = decision.pods_moved.len(), savings = decision.savings_per_hour, "disrupting");
    // 1. Mark and taint the old nodes: nothing new lands there from now on.
    for claim in &claims {
        let marks = BTreeMap::from([
            (COMMAND_ANNOTATION, Some(id.clone())),
            (
                REPLACEMENTS_ANNOTATION,
                Some(plan.node_claims.len().to_string()),
            ),
            (STARTED_ANNOTATION, Some(now.to_string())),
            (
                labels::TERMINATION_REASON_ANNOTATION,
                Some(method_name(decision).to_string()),
            ),
        ]);
        ctx.writer
            .annotate_node_claim(&claim.name_any(), &marks)
            .await
            .map_err(|e| e.to_string())?;
        if let Some(node) = snapshot
            .nodes
            .iter()
            .find(|n| Some(n.name_any()) == claim.status.as_ref().and_then(|s| s.node_name.clone()))
        {
            taint(ctx, node, true).await?;
        }
    }
    // 2. Replacements, created as NodeClaims and launched by the lifecycle controller.
    let pools: BTreeMap<String, &NodePool> = snapshot
        .node_pools
        .iter()
        .map(|p| (p.name_any(), p))
        .collect();
    // Said on the old claims and their pools: what is done, why, and what it saves.
    let note = disrupting_note(decision, &plan, &id);
    for claim in &claims {
        ctx.writer
            .event(
                &reference(*claim),
                EventType::Normal,
                "Disrupting",
                "Disrupt",
                note.clone(),
            )
            .await;
    }
    let decided_pools: BTreeSet<String> = decision
        .nodes
        .iter()
        .filter_map(|n| pool_of_node(snapshot, n))
        .collect();
    for pool in decided_pools.iter().filter_map(|p| pools.get(p)) {
        ctx.writer
            .event(
                &reference(*pool),
                EventType::Normal,
                "Disrupting",
                "Disrupt",
                format!("{}: {note}", decision.nodes.join(", ")),
            )
            .await;
    }
    for planned in &plan.node_claims {
        let pool = pools
            .get(&planned.node_pool)
            .ok_or_else(|| format!("nodepool {} is gone", planned.node_pool))?;
        // Only the planned size: a fallback to a dearer one would replace a node with its
        // equal (or worse) and undo the saving the decision was made for.
        let mut only = planned.clone();
        only.alternatives.clear();
        let mut claim = node_claim_for(&only, pool, snapshot, &ctx.names);
        claim
            .annotations_mut()
            .insert(REPLACES_ANNOTATION.to_string(), id.clone());
        ctx.writer
            .apply_node_claim(&claim)
            .await
            .map_err(|e| e.to_string())?;
        ctx.writer
            .event(
                &reference(&claim),
                EventType::Normal,
                "DisruptionLaunching",
                "Disrupt",
                format!(
                    "launching {} (${:.4}/hour) to replace {} ({}, command {id})",
                    planned.instance_type,
                    planned.price_per_hour,
                    decision.nodes.join(", "),
                    method_name(decision)
                ),
            )
            .await;
    }
    Ok(())
}

/// What a started decision does, for the Events on the nodes it disrupts: the method, the
/// replacements and their price, the saving and the pods that move. Pure.
pub fn disrupting_note(decision: &Decision, plan: &crate::scheduling::Plan, id: &str) -> String {
    let replacing = if plan.node_claims.is_empty() {
        "deleting without a replacement".to_string()
    } else {
        let types: Vec<&str> = plan
            .node_claims
            .iter()
            .map(|c| c.instance_type.as_str())
            .collect();
        let price: f64 = plan.node_claims.iter().map(|c| c.price_per_hour).sum();
        format!("replacing with {} (${price:.4}/hour)", types.join(", "))
    };
    let what = match decision.method {
        disruption::Method::Drift => "drift".to_string(),
        disruption::Method::Expiration => "expiration".to_string(),
        _ => format!("consolidation ({})", method_name(decision)),
    };
    format!(
        "{what}: {replacing}, saving ${:.4}/hour; {} pod(s) will be evicted and move (command {id}): {}",
        decision.savings_per_hour,
        decision.pods_moved.len(),
        decision.reason
    )
}

async fn taint<C: CloudProvider>(ctx: &Context<C>, node: &Node, on: bool) -> Result<(), String> {
    let mut taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let has = taints.iter().any(|t| t.key == labels::DISRUPTED_TAINT_KEY);
    if on == has {
        return Ok(());
    }
    if on {
        taints.push(Taint {
            key: labels::DISRUPTED_TAINT_KEY.to_string(),
            effect: "NoSchedule".to_string(),
            ..Taint::default()
        });
    } else {
        taints.retain(|t| t.key != labels::DISRUPTED_TAINT_KEY);
    }
    ctx.writer
        .patch_node(node, &taints, &BTreeMap::new(), node.finalizers())
        .await
        .map_err(|e| e.to_string())
}

/// Moves a command in flight one step.
async fn advance<C: CloudProvider>(
    ctx: &Context<C>,
    cmd: &InFlight,
    now: Timestamp,
) -> Result<(), String> {
    match progress(cmd, now, ctx.settings.registration_ttl) {
        Progress::Wait => Ok(()),
        Progress::Finish => {
            for old in &cmd.old {
                ctx.writer
                    .delete_node_claim(old)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            // The replacements are ordinary nodes from now on.
            for (name, _) in &cmd.replacements {
                ctx.writer
                    .annotate_node_claim(name, &BTreeMap::from([(REPLACES_ANNOTATION, None)]))
                    .await
                    .map_err(|e| e.to_string())?;
            }
            tracing::info!(command = %cmd.id, old = ?cmd.old, "replacements ready; old nodeclaims deleted");
            Ok(())
        }
        Progress::Undo(why) => {
            tracing::warn!(command = %cmd.id, %why, "undoing disruption command");
            for claim in ctx
                .state
                .node_claims
                .in_order()
                .iter()
                .filter(|c| cmd.old.contains(&c.name_any()))
            {
                ctx.writer
                    .event(
                        &reference(&**claim),
                        EventType::Warning,
                        "DisruptionUndone",
                        "Disrupt",
                        format!(
                            "command {} undone: {why}; the node takes pods again",
                            cmd.id
                        ),
                    )
                    .await;
            }
            for (name, ready) in &cmd.replacements {
                if !ready {
                    ctx.writer
                        .delete_node_claim(name)
                        .await
                        .map_err(|e| e.to_string())?;
                }
            }
            let claims = ctx.state.node_claims.in_order();
            let nodes = ctx.state.nodes.in_order();
            for old in &cmd.old {
                let Some(claim) = claims.iter().find(|c| &c.name_any() == old) else {
                    continue;
                };
                if let Some(node) = nodes.iter().find(|n| {
                    Some(n.name_any()) == claim.status.as_ref().and_then(|s| s.node_name.clone())
                }) {
                    taint(ctx, node, false).await?;
                }
                let cleared = [
                    COMMAND_ANNOTATION,
                    REPLACEMENTS_ANNOTATION,
                    STARTED_ANNOTATION,
                    labels::TERMINATION_REASON_ANNOTATION,
                ]
                .into_iter()
                .map(|k| (k, None))
                .collect();
                ctx.writer
                    .annotate_node_claim(old, &cleared)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_node_is_told_why_once_again_when_the_reason_changes_and_after_an_hour() {
        let t = |s: i64| Timestamp::from_second(1_790_000_000 + s).expect("a time");
        let b = |node: &str, reason: &str| disruption::Blocked {
            node: node.to_string(),
            reason: reason.to_string(),
        };
        let prices = HashMap::from([("big", 1.536)]);
        let mut told = Explained::default();
        let none = "no cheaper set of new nodes would hold its pods";
        let pdb = "PodDisruptionBudget shop/web allows no eviction of pod shop/web-1";
        let quiet = "pods changed 5s ago, consolidateAfter is 30s";
        let first = told.due(
            &[&b("big", none), &b("small", pdb), &b("new", quiet)],
            &prices,
            t(0),
        );
        assert_eq!(
            first,
            [
                (
                    "big".to_string(),
                    "Unconsolidatable",
                    format!("{none}; node big costs $1.5360/hour")
                ),
                ("small".to_string(), "DisruptionBlocked", pdb.to_string()),
            ],
            "a wait that ends by itself (consolidateAfter) is not told"
        );
        // The same reasons a pass later: nothing new.
        assert!(
            told.due(&[&b("big", none), &b("small", pdb)], &prices, t(30))
                .is_empty()
        );
        // small's reason changes: told at once; big's is told again after an hour.
        let budget = "disruption budget of NodePool default is used up";
        let later = told.due(&[&b("big", none), &b("small", budget)], &prices, t(60));
        assert_eq!(later.len(), 1);
        assert_eq!(later[0].2, budget);
        let hour = told.due(&[&b("big", none), &b("small", budget)], &prices, t(3600));
        assert_eq!(
            hour.iter().map(|e| e.0.as_str()).collect::<Vec<_>>(),
            ["big"]
        );
        // A node no longer blocked is forgotten: blocked again, it is told at once.
        assert!(told.due(&[], &prices, t(3601)).is_empty());
        assert_eq!(told.due(&[&b("small", budget)], &prices, t(3602)).len(), 1);
        // Many at once: a summary tells at most EXPLAINED_PER_SUMMARY, the next the rest.
        let many: Vec<disruption::Blocked> = (0..EXPLAINED_PER_SUMMARY + 7)
            .map(|i| b(&format!("n{i}"), pdb))
            .collect();
        let many: Vec<&disruption::Blocked> = many.iter().collect();
        let mut told = Explained::default();
        assert_eq!(told.due(&many, &prices, t(0)).len(), EXPLAINED_PER_SUMMARY);
        assert_eq!(told.due(&many, &prices, t(30)).len(), 7);
        assert!(told.due(&many, &prices, t(60)).is_empty());
    }

    #[test]
    fn the_summary_comes_every_30_s_or_ten_times_as_long_as_it_took() {
        let t = |s: i64| Timestamp::from_second(1_790_000_000 + s).expect("a time");
        let every = super::super::Timers::default().disruption_summary;
        // The first pass summarises.
        assert!(summary_due(None, Duration::ZERO, every, t(0)));
        // A quick summary: due again after 30 s, not before.
        let quick = Duration::from_millis(20);
        assert!(!summary_due(Some(t(0)), quick, every, t(29)));
        assert!(summary_due(Some(t(0)), quick, every, t(30)));
        // One that took 2 s (500 nodes): ten times that is under 30 s, so still 30 s.
        assert!(!summary_due(
            Some(t(0)),
            Duration::from_secs(2),
            every,
            t(29)
        ));
        assert!(summary_due(
            Some(t(0)),
            Duration::from_secs(2),
            every,
            t(30)
        ));
        // One that took 12 s: not for 120 s.
        let slow = Duration::from_secs(12);
        assert!(!summary_due(Some(t(0)), slow, every, t(119)));
        assert!(summary_due(Some(t(0)), slow, every, t(120)));
    }
}
