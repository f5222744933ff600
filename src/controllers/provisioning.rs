//! The provisioning controller: pods the real scheduler could not place are batched,
//! planned with the scheduling simulation (existing nodes and NodeClaims still launching
//! count as capacity), and become NodeClaim objects — or, for a NodePool in recommend-only
//! mode, an Event with the plan's price. Pods that cannot land get an Event with the reason.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::{Context, reference, wait_for_change_since};
use crate::actuation::{ContainerResize, Resize, with_resources};
use crate::apis::nodeclaim::{NodeClaimResources, NodeRequirement, RequirementOperator};
use crate::apis::{NodeClaim, NodeClaimSpec, NodePool, labels};
use crate::cloud::CloudProvider;
use crate::disruption::cluster::{node_class_hash, template_hash};
use crate::model::pod::parse_quantities;
use crate::provisioning::{Batcher, Mode};
use crate::scheduling::input::pool_from;
use crate::scheduling::pod::PodError;
use crate::scheduling::{self, ExistingNode, Input, Options, Plan, PlannedNodeClaim};
use crate::state::Snapshot;
use crate::webhook::mutate::{Decision, Objects, decide, decide_if_auto};

/// Taints a node carries only while it starts; a node still initializing is planned as if
/// it had none of them, as Karpenter does, or every pod pending for it would buy another.
const EPHEMERAL_TAINTS: &[&str] = &[
    labels::UNREGISTERED_TAINT_KEY,
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "node.cloudprovider.kubernetes.io/uninitialized",
];

/// How often the provisioner looks whether to buy ahead of the growth the requests' cycle
/// expects (`provisioning::headroom`) while nothing is pending or launching and the cluster
/// has not changed since the last look (after a change: `Timers::headroom_every`): the the cycle's expectation moves at the demand history's
/// grain (a sample every 5 minutes), and the same cluster and the same expectation give the
/// same answer. Planning ahead is the provisioner's costliest pass (a copy of the cluster
/// and a packing of the expected growth), so it is not repeated for nothing.
const HEADROOM_UNCHANGED_EVERY: SignedDuration = SignedDuration::from_mins(5);

/// A recommend-only pool is told what buying ahead would launch at most this often.
const HEADROOM_REPORT_AGAIN: SignedDuration = SignedDuration::from_hours(1);

/// How long a NodeClaim the provisioner created covers its pods before the NodeClaim store
/// has shown it. A watch that falls behind (a resource version expired, a re-list) can
/// leave a new claim out of the store for a few seconds; read as gone, it would have its
/// pods planned, and a node bought for them, a second time.
const UNSEEN_COVER: SignedDuration = SignedDuration::from_secs(60);

/// Where a pending pod was last planned to land.
#[derive(Debug, Clone)]
enum Target {
    /// A NodeClaim created for it at `created`: covered while the claim lives, and for
    /// [`UNSEEN_COVER`] while the store has not shown it yet (`seen`).
    Claim {
        name: String,
        created: Timestamp,
        seen: bool,
    },
    /// An existing node or a launching claim, or a recommend-only report: covered until then.
    Until(Timestamp),
}

/// The provisioner's memory between rounds.
#[derive(Default)]
struct Round {
    batcher: Batcher,
    /// When each pending pod (by uid) was first seen pending.
    first_seen: HashMap<String, Timestamp>,
    covered: HashMap<String, Target>,
    uncovered: BTreeSet<String>,
    /// Pods already told why they cannot land (pod uid, reason).
    told: BTreeSet<(String, String)>,
    /// Pending pods (by uid) whose right-sizing resize was refused: planned as they are
    /// from then on, or every round would buy a node they do not fit.
    resize_refused: BTreeSet<String>,
    /// When the provisioner last looked whether to buy ahead, and the stores' generation
    /// it planned on (none when there was nothing to plan on then: pods pending, capacity
    /// launching).
    headroom_at: Option<(Timestamp, Option<u64>)>,
    /// When each recommend-only pool was last told what buying ahead would launch.
    headroom_reported: HashMap<String, Timestamp>,
    /// How long a pod planned onto an existing node, or reported in recommend-only mode, is
    /// left alone before it is planned again, and how often buying ahead is looked at.
    timers: super::Timers,
}

impl Round {
    fn new(settings: &super::Settings) -> Round {
        Round {
            batcher: Batcher::new(settings.batch_idle, settings.batch_max),
            timers: settings.timers,
            ..Round::default()
        }
    }

    /// Until when a pod planned or reported `now` is left alone.
    fn cover_until(&self, now: Timestamp) -> Target {
        Target::Until(
            now.checked_add(self.timers.provisioning_cover)
                .unwrap_or(now),
        )
    }

    /// Until when a pod whose new node was seen initialized `now` is left to kube-scheduler.
    fn bind_grace_until(&self, now: Timestamp) -> Target {
        Target::Until(
            now.checked_add(self.timers.provisioning_bind_grace)
                .unwrap_or(now),
        )
    }
}

/// Runs the provisioner until aborted.
pub async fn run<C: CloudProvider + 'static>(ctx: Arc<Context<C>>) {
    ctx.state.wait_synced().await;
    let mut round = Round::new(&ctx.settings);
    let mut seen = ctx.state.generation();
    let mut wake: Option<Timestamp> = None;
    loop {
        // Until the stores change or the round's next deadline (a batch closing, a cover
        // running out, the next look ahead), and at least every few seconds.
        let wait = wake
            .map(|t| {
                let left = t.duration_since(ctx.clock.now());
                Duration::try_from(left).unwrap_or(Duration::ZERO)
            })
            .unwrap_or(MAX_WAIT)
            .clamp(MIN_WAIT, MAX_WAIT);
        wait_for_change_since(&ctx.state, seen, wait).await;
        seen = ctx.state.generation();
        if !ctx.writer.is_leader() {
            wake = None;
            // A new leader starts from what the API server holds, not from our memory.
            round = Round::new(&ctx.settings);
            continue;
        }
        let now = ctx.clock.now();
        let pods = ctx.state.pods.state();
        observe(&mut round, &pods, &ctx.state.node_claims.state(), now);
        ctx.metrics
            .set_pods_pending(pods.iter().filter(|p| is_provisionable(p)).count());
        drop(pods);
        if round.batcher.ready(now) {
            round.batcher.reset();
            let started = std::time::Instant::now();
            // The planning copy of the stores is made only when a batch closes, and holds
            // only the pods planning reads: those bound to nodes and those pending.
            let snapshot = ctx.state.snapshot_with_pods(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() || is_provisionable(p)
            });
            provision(&ctx, &mut round, snapshot, now).await;
            ctx.metrics.reconcile(
                crate::telemetry::names::Controller::Provisioning,
                started.elapsed().as_secs_f64(),
                false,
            );
            // Whatever the round could not cover is looked at again after a pause.
            let retry_at = now.checked_add(crate::provisioning::RETRY).unwrap_or(now);
            for pod in std::mem::take(&mut round.uncovered) {
                round.covered.entry(pod).or_insert(Target::Until(retry_at));
            }
        } else if ctx.settings.headroom_lead > 0
            && round.uncovered.is_empty()
            && headroom_due(&round, seen).is_none_or(|t| t <= now)
        {
            let planned = buy_ahead(&ctx, &mut round, now).await;
            round.headroom_at = Some((now, planned.then_some(seen)));
        }
        wake = next_wake(&round, ctx.settings.headroom_lead > 0, seen);
    }
}

/// The provisioner looks again at least this often, whatever changed.
const MAX_WAIT: Duration = Duration::from_secs(5);
/// ... and at most this often while nothing changes.
const MIN_WAIT: Duration = Duration::from_millis(100);

/// When the round's memory next changes its mind with no change in the cluster: its batch
/// closes, a pending pod's cover runs out, or buying ahead is due. `None`: nothing is
/// waiting on time.
fn next_wake(round: &Round, buying_ahead: bool, generation: u64) -> Option<Timestamp> {
    let covers = round.covered.values().filter_map(|t| match t {
        Target::Until(t) => Some(*t),
        Target::Claim {
            created,
            seen: false,
            ..
        } => created.checked_add(UNSEEN_COVER).ok(),
        Target::Claim { .. } => None,
    });
    let headroom = headroom_due(round, generation).filter(|_| buying_ahead);
    covers.chain(round.batcher.deadline()).chain(headroom).min()
}

/// When buying ahead is next looked at, after the round's last look (when, and the
/// generation it planned on) with the stores now at `generation`: `headroom_every` after it
/// when the cluster has changed since or nothing was planned, [`HEADROOM_UNCHANGED_EVERY`]
/// when it planned on this very cluster. `None`: never looked, due now.
fn headroom_due(round: &Round, generation: u64) -> Option<Timestamp> {
    let (at, planned_on) = round.headroom_at?;
    let every = if planned_on == Some(generation) {
        HEADROOM_UNCHANGED_EVERY
    } else {
        round.timers.headroom_every
    };
    Some(at.checked_add(every).unwrap_or(at))
}

/// Buys ahead of the growth the requests' daily and weekly cycle expects within the lead
/// (`provisioning::headroom::plan`), while no pod is pending and no NodeClaim launching:
/// NodeClaims for the pools in autonomous mode, annotated with what they were bought for;
/// for a pool in recommend-only mode, an Event with what would be launched and its price.
/// Returns whether it planned: not while pods are pending or capacity is launching (looked
/// at again on the next change), nor without pools or instance types.
async fn buy_ahead<C: CloudProvider>(ctx: &Context<C>, round: &mut Round, now: Timestamp) -> bool {
    {
        let pods = ctx.state.pods.state();
        if pods.iter().any(|p| is_provisionable(p)) {
            return false;
        }
        let claims = ctx.state.node_claims.state();
        if claims.iter().any(|c| {
            c.metadata.deletion_timestamp.is_none()
                && !c.condition_true(crate::apis::nodeclaim::condition::INITIALIZED)
        }) {
            return false;
        }
    }
    let mut snapshot = ctx
        .state
        .snapshot_with_pods(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some());
    // Invalid pools are reported by the provisioning rounds; nothing is bought for them.
    snapshot
        .node_pools
        .retain(|p| p.metadata.deletion_timestamp.is_none() && validate_pool(p).is_ok());
    if snapshot.node_pools.is_empty() {
        return false;
    }
    let types = match ctx.instance_types().await {
        Ok(t) => t,
        Err(e) => {
            tracing::debug!(error = %e, "instance types unavailable; not buying ahead");
            return false;
        }
    };
    let Some((input, _)) = planning_input(&snapshot, &types) else {
        return false;
    };
    let batch = format!("h{:08x}", ctx.names.number());
    let options = Options {
        cost_aware: ctx.settings.cost_aware,
        name_prefix: format!("{batch}-"),
        ..Options::default()
    };
    let claims = {
        let demand = ctx.demand.lock().unwrap_or_else(|e| e.into_inner());
        crate::provisioning::headroom::plan(
            &input,
            &demand,
            now.as_second(),
            ctx.settings.headroom_lead,
            ctx.settings
                .forecast_horizon
                .max(ctx.settings.headroom_lead),
            crate::provisioning::headroom::DEFAULT_MARGIN,
            &options,
        )
    };
    if claims.is_empty() {
        return true;
    }
    let pools: HashMap<String, &NodePool> = snapshot
        .node_pools
        .iter()
        .map(|p| (p.name_any(), p))
        .collect();
    let lead = format_hours(ctx.settings.headroom_lead);
    // What is bought is kept from consolidation until the growth it is bought for comes.
    let until = now
        .checked_add(SignedDuration::from_secs(ctx.settings.headroom_lead))
        .unwrap_or(now);
    let mut by_pool: BTreeMap<&str, Vec<&PlannedNodeClaim>> = BTreeMap::new();
    for claim in &claims {
        by_pool
            .entry(claim.node_pool.as_str())
            .or_default()
            .push(claim);
    }
    for (pool_name, planned) in by_pool {
        let Some(pool) = pools.get(pool_name).copied() else {
            continue;
        };
        let price: f64 = planned.iter().map(|c| c.price_per_hour).sum();
        let stand_ins: usize = planned.iter().map(|c| c.pods.len()).sum();
        let sizes: Vec<&str> = planned.iter().map(|c| c.instance_type.as_str()).collect();
        let why = format!(
            "the requests' daily and weekly cycle expects {pool_name} to outgrow its room within {lead}: capacity for {stand_ins} pod(s) the size of its median pod"
        );
        if ctx.mode_for(Some(pool)) != Mode::Autonomous {
            let due = round
                .headroom_reported
                .get(pool_name)
                .is_none_or(|t| now.duration_since(*t) >= HEADROOM_REPORT_AGAIN);
            if due {
                round.headroom_reported.insert(pool_name.to_string(), now);
                ctx.writer
                    .event(
                        &reference(pool),
                        EventType::Normal,
                        "WouldBuyAhead",
                        "Provision",
                        format!(
                            "recommend-only: {why}; buying ahead would launch {} node(s) ({}) at ${price:.4}/hour; nothing done",
                            planned.len(),
                            sizes.join(", ")
                        ),
                    )
                    .await;
            }
            continue;
        }
        for p in planned {
            let mut claim = node_claim_for(p, pool, &snapshot, &ctx.names);
            let annotations = claim.annotations_mut();
            annotations.insert(labels::LAUNCH_BATCH_ANNOTATION.to_string(), batch.clone());
            annotations.insert(labels::HEADROOM_ANNOTATION.to_string(), why.clone());
            annotations.insert(
                labels::HEADROOM_UNTIL_ANNOTATION.to_string(),
                until.to_string(),
            );
            match ctx.writer.apply_node_claim(&claim).await {
                Ok(_) => tracing::info!(
                    nodeclaim = %claim.name_any(),
                    instance_type = %p.instance_type,
                    nodepool = %pool_name,
                    "created nodeclaim ahead of expected growth"
                ),
                Err(e) => {
                    tracing::warn!(nodepool = %pool_name, error = %e, "buying ahead failed");
                    return true;
                }
            }
        }
    }
    true
}

/// Seconds as hours and minutes, for messages.
fn format_hours(seconds: i64) -> String {
    let (h, m) = (seconds / 3600, seconds % 3600 / 60);
    match (h, m) {
        (0, m) => format!("{m}m"),
        (h, 0) => format!("{h}h"),
        (h, m) => format!("{h}h{m}m"),
    }
}

/// Whether the real scheduler has given up on a pod: unbound, not being deleted, not a
/// DaemonSet's, and marked `PodScheduled=False` with reason `Unschedulable`.
pub fn is_provisionable(pod: &Pod) -> bool {
    let spec = pod.spec.as_ref();
    if spec.and_then(|s| s.node_name.as_ref()).is_some()
        || pod.metadata.deletion_timestamp.is_some()
    {
        return false;
    }
    if pod.owner_references().iter().any(|o| o.kind == "DaemonSet") {
        return false;
    }
    let status = pod.status.as_ref();
    if matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) {
        return false;
    }
    status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        })
}

fn key(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

/// Updates the batch with the pods pending now: a new uncovered pod (or one whose claim went
/// away) opens or extends the batch.
fn observe(round: &mut Round, pods: &[Arc<Pod>], claims: &[Arc<NodeClaim>], now: Timestamp) {
    // A claim covers its pods while it launches. Once its node is initialized the pods
    // get a short grace to be bound; after that, a pod still pending (kube-scheduler
    // filled the node with others) is planned again: onto a node with room if there is
    // one, else onto a new node, so a straggler waits seconds rather than a cover period.
    let launching: BTreeSet<String> = claims
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter(|c| !c.condition_true(crate::apis::nodeclaim::condition::INITIALIZED))
        .map(|c| c.name_any())
        .collect();
    let live_claims: BTreeSet<String> = claims
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .map(|c| c.name_any())
        .collect();
    let known: BTreeSet<String> = claims.iter().map(|c| c.name_any()).collect();
    let cover = round.bind_grace_until(now);
    for target in round.covered.values_mut() {
        let Target::Claim { name, seen, .. } = target else {
            continue;
        };
        *seen |= known.contains(name.as_str());
        if live_claims.contains(name.as_str()) && !launching.contains(name.as_str()) {
            *target = cover.clone();
        }
    }
    let mut pending_uids = BTreeSet::new();
    let mut uncovered = BTreeSet::new();
    for pod in pods.iter().filter(|p| is_provisionable(p)) {
        let uid = pod.uid().unwrap_or_default();
        round.first_seen.entry(uid.clone()).or_insert(now);
        pending_uids.insert(uid);
        let k = key(pod);
        let covered = match round.covered.get(&k) {
            Some(Target::Claim {
                name,
                created,
                seen,
            }) => {
                live_claims.contains(name) || (!seen && now.duration_since(*created) < UNSEEN_COVER)
            }
            Some(Target::Until(t)) => now < *t,
            None => false,
        };
        if !covered {
            uncovered.insert(k);
        }
    }
    round.first_seen.retain(|uid, _| pending_uids.contains(uid));
    let pending_keys: BTreeSet<String> = pods
        .iter()
        .filter(|p| is_provisionable(p))
        .map(|p| key(p))
        .collect();
    round.covered.retain(|k, _| pending_keys.contains(k));
    round.told.retain(|(uid, _)| pending_uids.contains(uid));
    round
        .resize_refused
        .retain(|uid| pending_uids.contains(uid));
    if !uncovered.is_empty() && uncovered != round.uncovered {
        round.batcher.observe(now);
    }
    round.uncovered = uncovered;
}

/// Plans the pending pods and acts on the plan.
async fn provision<C: CloudProvider>(
    ctx: &Context<C>,
    round: &mut Round,
    mut snapshot: Snapshot,
    now: Timestamp,
) {
    let started = std::time::Instant::now();
    let mut valid = BTreeSet::new();
    for pool in &snapshot.node_pools {
        if pool.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let verdict = validate_pool(pool);
        // A mistyped mode is reported like an invalid pool, but the pool is still planned
        // with, recommend-only: its pending pods get their WouldProvision Events.
        let shown = match (&verdict, super::mode_problem(pool)) {
            (Err(m), _) => Err(Invalid::Pool(m.clone())),
            (Ok(()), Some(m)) => Err(Invalid::Mode(m)),
            (Ok(()), None) => Ok(()),
        };
        report_validation(ctx, pool, &shown, now).await;
        if verdict.is_ok() {
            valid.insert(pool.name_any());
        }
    }
    // Only valid pools are planned with; nothing is launched for the others.
    snapshot
        .node_pools
        .retain(|p| valid.contains(&p.name_any()));
    if valid.is_empty() {
        tracing::info!(
            pending = round.uncovered.len(),
            "pending pods but no valid NodePool: nothing to provision"
        );
        return;
    }
    let types = match ctx.instance_types().await {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "instance types unavailable; provisioning postponed");
            return;
        }
    };
    // Pending pods are planned with the requests they will run with: those right-sizing
    // governs in Auto mode are resized before their nodes are bought.
    let right_sizing = if ctx.rightsizing {
        let objects = crate::webhook::Stores::of(&ctx.state, &ctx.settings.namespace);
        right_size(
            &snapshot.pods,
            &objects,
            &webhook_settings(&ctx.settings),
            &round.resize_refused,
        )
    } else {
        RightSizing::default()
    };
    for pod in &mut snapshot.pods {
        if let Some(resize) = right_sizing.resizes.get(&key(pod)) {
            *pod = Arc::new(with_resources(pod, &resize.containers));
        }
    }
    let batch = format!("p{:08x}", ctx.names.number());
    let cost_aware = ctx.settings.cost_aware;
    let Some((plan, unreadable)) = plan_batch(&snapshot, &types, &batch, cost_aware) else {
        return;
    };
    tell_unreadable(ctx, round, &snapshot, &unreadable, now).await;
    ctx.metrics
        .observe_decision("scheduling", started.elapsed().as_secs_f64());
    tracing::debug!(
        pending = snapshot.pods.iter().filter(|p| is_provisionable(p)).count(),
        new_nodes = plan.node_claims.len(),
        on_existing = plan
            .existing_nodes
            .iter()
            .map(|e| e.pods.len())
            .sum::<usize>(),
        unschedulable = plan.unschedulable.len(),
        "planned pending pods"
    );
    resize_pending(ctx, round, &snapshot, &plan, &right_sizing.resizes).await;
    act(ctx, round, &snapshot, &plan, &batch, now).await;
    // Recommend mode: what the batch would need with the recommendations applied, priced
    // once the batch is on its way (it never delays a launch).
    // The gauges are set before the Event that reports the gap is published, so whoever
    // reads the Event finds the figures on /metrics. A batch that buys no node (its pods
    // go to existing nodes) leaves them at the last batch that did.
    if plan.node_claims.is_empty() {
        return;
    }
    let planned_cost = new_node_cost(&plan);
    if right_sizing.what_if.is_empty() {
        ctx.metrics.set_batch_cost(planned_cost, planned_cost);
        return;
    }
    let mut what_if = snapshot;
    for pod in &mut what_if.pods {
        if let Some(p) = right_sizing.what_if.get(&key(pod)) {
            *pod = p.clone();
        }
    }
    match plan_batch(
        &what_if,
        &types,
        &format!("{batch}-if-right-sized"),
        cost_aware,
    ) {
        Some((alternative, _)) => {
            ctx.metrics
                .set_batch_cost(planned_cost, new_node_cost(&alternative));
            report_right_sizing_effect(ctx, &what_if, &plan, &alternative, &right_sizing).await;
        }
        None => ctx.metrics.set_batch_cost(planned_cost, planned_cost),
    }
}

/// Plans a snapshot's pending pods (cost-aware, or greedily), new nodes named after
/// `batch`; with the pods whose specs cannot be read (left out of the plan, or kept on their
/// nodes as their requests).
fn plan_batch(
    snapshot: &Snapshot,
    types: &dyn Fn(&crate::model::NodeSettings) -> Result<crate::scheduling::PoolTypes, String>,
    batch: &str,
    cost_aware: bool,
) -> Option<(Plan, Vec<PodError>)> {
    let (input, unreadable) = planning_input(snapshot, types)?;
    let plan = scheduling::schedule(
        &input,
        &Options {
            cost_aware,
            name_prefix: format!("{batch}-"),
            ..Options::default()
        },
    );
    Some((plan, unreadable))
}

/// Tells each pending pod whose spec cannot be read, once, with a Warning Event naming
/// the field, that it is not planned (the rest of the batch is); it is not planned again
/// for a while. A bound one is logged once: its node keeps it and is not disrupted.
async fn tell_unreadable<C: CloudProvider>(
    ctx: &Context<C>,
    round: &mut Round,
    snapshot: &Snapshot,
    unreadable: &[PodError],
    now: Timestamp,
) {
    if unreadable.is_empty() {
        return;
    }
    let pods: HashMap<String, &Arc<Pod>> = snapshot.pods.iter().map(|p| (key(p), p)).collect();
    for e in unreadable {
        let Some(pod) = pods.get(&e.pod) else {
            continue;
        };
        let reason = format!("{}: {}", e.field, e.message);
        if !round
            .told
            .insert((pod.uid().unwrap_or_default(), reason.clone()))
        {
            continue;
        }
        let bound = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
        if bound {
            tracing::warn!(pod = %e.pod, error = %reason, "a running pod's spec cannot be read: planned as its requests only, and its node is not disrupted");
            continue;
        }
        round.covered.insert(e.pod.clone(), round.cover_until(now));
        tracing::warn!(pod = %e.pod, error = %reason, "a pending pod's spec cannot be read; not planned");
        ctx.writer
            .event(
                &reference(pod.as_ref()),
                EventType::Warning,
                "FailedProvisioning",
                "Provision",
                format!("Tailor plans no node for this pod (the other pending pods are planned): {reason}"),
            )
            .await;
    }
}

/// The cluster as the provisioner plans on it: the snapshot, with the NodeClaims still
/// launching as capacity already bought.
fn planning_input(
    snapshot: &Snapshot,
    types: &dyn Fn(&crate::model::NodeSettings) -> Result<crate::scheduling::PoolTypes, String>,
) -> Option<(Input, Vec<PodError>)> {
    let (mut input, unreadable) = match Input::from_snapshot_reading_around(snapshot, types) {
        Ok(i) => i,
        Err(e) => {
            tracing::warn!(error = %e, "the cluster cannot be planned");
            return None;
        }
    };
    add_in_flight(&mut input, snapshot);
    Some((input, unreadable))
}

/// Hourly price of the new nodes a plan buys.
fn new_node_cost(plan: &Plan) -> f64 {
    plan.node_claims
        .iter()
        .fold(0.0, |total, c| total + c.price_per_hour)
}

/// The webhook's view of the agent's modes: what right-sizing gives a pod it creates.
fn webhook_settings(settings: &super::Settings) -> crate::webhook::Settings {
    crate::webhook::Settings {
        global_mode: match settings.mode {
            Mode::Autonomous => crate::apis::Mode::Auto,
            Mode::RecommendOnly => crate::apis::Mode::Recommend,
        },
        agent_namespace: settings.namespace.clone(),
    }
}

/// Pending pods' requests as right-sizing sets them.
#[derive(Debug, Default)]
struct RightSizing {
    /// Pods (by key) right-sizing governs in Auto mode whose requests differ from their
    /// recommendation: resized before their nodes are bought, and planned so.
    resizes: BTreeMap<String, Resize>,
    /// Pods (by key) of Recommend-mode workloads with an actionable recommendation, as they
    /// would be with it applied: priced, never acted on.
    what_if: HashMap<String, Arc<Pod>>,
    /// The workloads of those pods (`namespace/Kind/name`).
    what_if_workloads: BTreeSet<String>,
}

/// What right-sizing does to each pending pod: the webhook's decision for a pod being
/// created, limited to the containers a resize may change (an init container's resources
/// are fixed once the pod exists). Pods in `refused` are left as they are.
fn right_size(
    pods: &[Arc<Pod>],
    objects: &dyn Objects,
    settings: &crate::webhook::Settings,
    refused: &BTreeSet<String>,
) -> RightSizing {
    let mut out = RightSizing::default();
    for pod in pods.iter().filter(|p| is_provisionable(p)) {
        if refused.contains(&pod.uid().unwrap_or_default()) {
            continue;
        }
        let namespace = pod.namespace().unwrap_or_default();
        let resizable = |containers: Vec<ContainerResize>| -> Vec<ContainerResize> {
            let spec = pod.spec.as_ref();
            containers
                .into_iter()
                .filter(|c| spec.is_some_and(|s| s.containers.iter().any(|x| x.name == c.name)))
                .collect()
        };
        match decide(pod, &namespace, objects, settings) {
            Decision::Patch { containers, .. } => {
                let containers = resizable(containers);
                if !containers.is_empty() {
                    out.resizes.insert(
                        key(pod),
                        Resize {
                            namespace,
                            pod: pod.name_any(),
                            containers,
                        },
                    );
                }
            }
            Decision::Unchanged(_) | Decision::Invalid(_) => {
                if let Decision::Patch {
                    workload,
                    containers,
                    ..
                } = decide_if_auto(pod, &namespace, objects, settings)
                {
                    let containers = resizable(containers);
                    if !containers.is_empty() {
                        out.what_if
                            .insert(key(pod), Arc::new(with_resources(pod, &containers)));
                        out.what_if_workloads.insert(format!(
                            "{}/{}/{}",
                            workload.namespace, workload.kind, workload.name
                        ));
                    }
                }
            }
        }
    }
    out
}

/// Resizes the pending pods right-sizing governs in Auto mode that the plan places, before
/// any node is bought for them: the plan counted them at these requests. A refused resize
/// leaves the pod to be planned as it is next round.
async fn resize_pending<C: CloudProvider>(
    ctx: &Context<C>,
    round: &mut Round,
    snapshot: &Snapshot,
    plan: &Plan,
    resizes: &BTreeMap<String, Resize>,
) {
    if resizes.is_empty() {
        return;
    }
    let placed: BTreeSet<&str> = plan
        .node_claims
        .iter()
        .flat_map(|c| c.pods.iter())
        .chain(plan.existing_nodes.iter().flat_map(|e| e.pods.iter()))
        .map(String::as_str)
        .collect();
    let wanted: Vec<&Resize> = resizes
        .iter()
        .filter(|(k, _)| placed.contains(k.as_str()))
        .map(|(_, r)| r)
        .collect();
    let uids: HashMap<String, String> = snapshot
        .pods
        .iter()
        .map(|p| (key(p), p.uid().unwrap_or_default()))
        .collect();
    for wave in wanted.chunks(16) {
        let results =
            futures::future::join_all(wave.iter().map(|r| ctx.writer.resize_pod(r))).await;
        for (r, result) in wave.iter().zip(results) {
            let k = format!("{}/{}", r.namespace, r.pod);
            match result {
                Ok(()) => {
                    ctx.metrics.recommendation_applied(&r.namespace);
                    tracing::info!(pod = %k, "pending pod resized to its recommendation before its node is bought");
                }
                Err(e) => {
                    tracing::warn!(pod = %k, error = %e, "resizing a pending pod was refused; it is planned as it is from now on");
                    if let Some(uid) = uids.get(&k) {
                        round.resize_refused.insert(uid.clone());
                    }
                }
            }
        }
    }
}

/// Reports, on the NodePools the batch buys from, what it would need with the
/// Recommend-mode recommendations applied, when that differs.
async fn report_right_sizing_effect<C: CloudProvider>(
    ctx: &Context<C>,
    snapshot: &Snapshot,
    plan: &Plan,
    alternative: &Plan,
    right_sizing: &RightSizing,
) {
    let (nodes, cost) = (plan.node_claims.len(), new_node_cost(plan));
    let (fewer, cheaper) = (alternative.node_claims.len(), new_node_cost(alternative));
    if nodes == fewer && (cost - cheaper).abs() < 1e-6 {
        return;
    }
    let message = format!(
        "with the recommendations of {} pending pod(s) of {} Recommend-mode workload(s) applied, this batch would need {fewer} new node(s) at ${cheaper:.4}/hour instead of {nodes} at ${cost:.4}/hour",
        right_sizing.what_if.len(),
        right_sizing.what_if_workloads.len(),
    );
    tracing::info!(%message, "right-sizing would change this batch");
    let pools: BTreeSet<&str> = plan
        .node_claims
        .iter()
        .chain(&alternative.node_claims)
        .map(|c| c.node_pool.as_str())
        .collect();
    for pool in snapshot
        .node_pools
        .iter()
        .filter(|p| pools.contains(p.name_any().as_str()))
    {
        ctx.writer
            .event(
                &reference(pool),
                EventType::Normal,
                "RightsizingWouldChangeBatch",
                "Provision",
                message.clone(),
            )
            .await;
    }
}

/// Why a NodePool failed validation.
enum Invalid {
    /// Its spec cannot be planned with: nothing is launched for it.
    Pool(String),
    /// A mode annotation has a value Tailor does not know: the pool stays recommend-only.
    Mode(String),
}

/// Records the verdict as the pool's `ValidationSucceeded` condition (only when it changes),
/// with an Event when the pool is invalid: nothing is launched for an invalid pool, and a
/// pool with a mistyped mode stays recommend-only.
async fn report_validation<C: CloudProvider>(
    ctx: &Context<C>,
    pool: &NodePool,
    verdict: &Result<(), Invalid>,
    now: Timestamp,
) {
    use crate::apis::nodepool::condition::VALIDATION_SUCCEEDED;
    let mut status = pool.status.clone().unwrap_or_default();
    // A refusal says where the docs explain what the field takes.
    let (ok, reason, message) = match verdict {
        Ok(()) => (true, "Valid", String::new()),
        Err(Invalid::Pool(m)) => (
            false,
            "Invalid",
            format!("{m}; see docs/configuration.md#nodepool"),
        ),
        Err(Invalid::Mode(m)) => (
            false,
            "InvalidMode",
            format!("{m}; see docs/configuration.md#modes"),
        ),
    };
    let changed = crate::apis::set_condition(
        &mut status.conditions,
        super::nodeclaim::condition(VALIDATION_SUCCEEDED, ok, reason, message.clone(), now),
    );
    if !changed {
        return;
    }
    if !ok {
        let event = match verdict {
            Err(Invalid::Mode(_)) => {
                tracing::warn!(nodepool = %pool.name_any(), %message, "nodepool mode annotation is invalid; it stays recommend-only");
                "InvalidMode"
            }
            _ => {
                tracing::warn!(nodepool = %pool.name_any(), %message, "nodepool is invalid; nothing is launched for it");
                "InvalidNodePool"
            }
        };
        ctx.writer
            .event(
                &reference(pool),
                EventType::Warning,
                event,
                "Validate",
                message,
            )
            .await;
    }
    if let Err(e) = ctx
        .writer
        .apply_node_pool_status(&pool.name_any(), &status)
        .await
    {
        tracing::warn!(nodepool = %pool.name_any(), error = %e, "recording nodepool validation failed");
    }
}

/// Checks the NodePool as the scheduler will read it: requirements, limits, template.
pub fn validate_pool(pool: &NodePool) -> Result<(), String> {
    pool_from(pool, &crate::scheduling::PoolTypes::default())
        .map(|_| ())
        .map_err(|e| e.to_string())?;
    for (k, v) in &pool.spec.limits {
        if v.0.trim_start().starts_with('-') {
            return Err(format!(
                "nodepool {}: spec.limits.{k}: {} must not be negative",
                pool.name_any(),
                v.0
            ));
        }
    }
    Ok(())
}

/// NodeClaims that are not yet initialized are capacity already bought: pods that fit them
/// wait for them instead of buying more. A claim whose node has registered is that node,
/// planned without the taints it carries only while starting.
fn add_in_flight(input: &mut Input, snapshot: &Snapshot) {
    for claim in &snapshot.node_claims {
        if claim.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if claim.condition_true(crate::apis::nodeclaim::condition::INITIALIZED) {
            continue;
        }
        let status = claim.status.clone().unwrap_or_default();
        let startup: Vec<&str> = claim
            .spec
            .startup_taints
            .iter()
            .map(|t| t.key.as_str())
            .collect();
        // Its Node may be in the stores before the claim records it: match by provider ID
        // too, or the node would be planned twice (once empty) and pods promised to it.
        let by_provider_id = status.provider_id.as_ref().and_then(|id| {
            snapshot
                .nodes
                .iter()
                .find(|n| n.spec.as_ref().and_then(|s| s.provider_id.as_ref()) == Some(id))
                .and_then(|n| n.metadata.name.clone())
        });
        // (A Node named after the claim, as launches name them, is it too: it can appear
        // before the launch has recorded the provider ID.)
        if let Some(node) = status
            .node_name
            .clone()
            .or(by_provider_id)
            .or_else(|| Some(claim.name_any()))
            .and_then(|n| input.nodes.iter_mut().find(|e| e.name == n))
        {
            node.taints.retain(|t| {
                !EPHEMERAL_TAINTS.contains(&t.key.as_str()) && !startup.contains(&t.key.as_str())
            });
            continue;
        }
        let name = claim.name_any();
        let mut node_labels = claim.labels().clone();
        for r in &claim.spec.requirements {
            if r.operator == RequirementOperator::In && r.values.len() == 1 {
                node_labels
                    .entry(r.key.clone())
                    .or_insert_with(|| r.values[0].clone());
            }
        }
        node_labels.insert(labels::HOSTNAME.to_string(), name.clone());
        let allocatable = if status.allocatable.is_empty() {
            claim_type_allocatable(input, claim)
        } else {
            parse_quantities(Some(&status.allocatable), "status.allocatable").ok()
        };
        let Some(allocatable) = allocatable else {
            continue;
        };
        input.nodes.push(ExistingNode {
            derived: Default::default(),
            name,
            labels: node_labels,
            taints: claim.spec.taints.clone(),
            allocatable,
            pods: Vec::new(),
            unschedulable: false,
        });
    }
}

/// The allocatable of the smallest instance type a claim admits, before it has launched.
fn claim_type_allocatable(input: &Input, claim: &NodeClaim) -> Option<crate::model::Resources> {
    let types: BTreeSet<&str> = claim
        .spec
        .requirements
        .iter()
        .filter(|r| {
            labels::canonical_key(&r.key) == labels::INSTANCE_TYPE
                && r.operator == RequirementOperator::In
        })
        .flat_map(|r| r.values.iter().map(String::as_str))
        .collect();
    input
        .pools
        .iter()
        .flat_map(|p| p.instance_types.iter())
        .filter(|t| types.contains(t.name.as_str()))
        .map(|t| t.allocatable.clone())
        .min_by_key(|a| (a.cpu, a.memory))
}

async fn act<C: CloudProvider>(
    ctx: &Context<C>,
    round: &mut Round,
    snapshot: &Snapshot,
    plan: &Plan,
    batch: &str,
    now: Timestamp,
) {
    let pods: HashMap<String, &Pod> = snapshot.pods.iter().map(|p| (key(p), &**p)).collect();
    let pools: HashMap<String, &NodePool> = snapshot
        .node_pools
        .iter()
        .map(|p| (p.name_any(), p))
        .collect();
    // (pod key, node) for every pod planned onto a node that exists or is being bought.
    let mut nominations: Vec<(&str, String)> = Vec::new();
    for placed in &plan.existing_nodes {
        for pod in &placed.pods {
            round.covered.insert(pod.clone(), round.cover_until(now));
            if ctx.mode_for(placed_pool(&placed.node, snapshot, &pools)) == Mode::Autonomous {
                nominations.push((pod.as_str(), placed.node.clone()));
            }
        }
    }
    let mut recommended: BTreeMap<String, (usize, f64, usize)> = BTreeMap::new();
    let mut to_create = Vec::new();
    for planned in &plan.node_claims {
        let pool = pools.get(&planned.node_pool).copied();
        match (pool, ctx.mode_for(pool)) {
            (Some(pool), Mode::Autonomous) => {
                let mut claim = node_claim_for(planned, pool, snapshot, &ctx.names);
                claim.annotations_mut().insert(
                    labels::LAUNCH_BATCH_ANNOTATION.to_string(),
                    batch.to_string(),
                );
                claim.annotations_mut().insert(
                    labels::PLANNED_PODS_ANNOTATION.to_string(),
                    planned.pods.join(","),
                );
                for pod in &planned.pods {
                    // The node is named after its claim when it registers.
                    nominations.push((pod.as_str(), claim.name_any()));
                }
                to_create.push((claim, planned));
            }
            _ => {
                let entry = recommended.entry(planned.node_pool.clone()).or_default();
                entry.0 += 1;
                entry.1 += planned.price_per_hour;
                entry.2 += planned.pods.len();
                for pod in &planned.pods {
                    round.covered.insert(pod.clone(), round.cover_until(now));
                }
            }
        }
    }
    // Nominations race the new nodes: a pod must be nominated before its node turns Ready,
    // or kube-scheduler may give the room to another. They go out alongside the claims.
    let create = async {
        use futures::StreamExt;
        // Sixteen at a time: a large scale-up must not flood the API server, and each claim
        // is written as soon as a slot frees (waves would wait for their slowest write).
        let writes: Vec<_> = to_create
            .iter()
            .map(|(claim, planned)| async move {
                let result = ctx.writer.apply_node_claim(claim).await;
                (claim.name_any(), *planned, result, ctx.clock.now())
            })
            .collect();
        futures::stream::iter(writes)
            .buffer_unordered(16)
            .collect::<Vec<_>>()
            .await
    };
    let ((), created) = tokio::join!(nominate(ctx, &nominations), create);
    for (name, planned, result, at) in created {
        match result {
            Ok(_) => {
                tracing::info!(nodeclaim = %name, instance_type = %planned.instance_type, pods = planned.pods.len(), "created nodeclaim");
                for pod in &planned.pods {
                    round.covered.insert(
                        pod.clone(),
                        Target::Claim {
                            name: name.clone(),
                            created: at,
                            seen: false,
                        },
                    );
                    if let Some(since) = pods
                        .get(pod)
                        .and_then(|p| p.uid())
                        .and_then(|uid| round.first_seen.get(&uid))
                    {
                        ctx.metrics.observe_provisioning(
                            &planned.node_pool,
                            at.duration_since(*since).as_secs_f64(),
                        );
                    }
                }
            }
            // Its pods stay uncovered and are planned again after a pause.
            Err(e) => tracing::warn!(nodeclaim = %name, error = %e, "creating nodeclaim failed"),
        }
    }
    for (pool_name, (nodes, cost, pod_count)) in recommended {
        if let Some(pool) = pools.get(&pool_name) {
            ctx.writer
                .event(
                    &reference(*pool),
                    EventType::Normal,
                    "WouldProvision",
                    "Provision",
                    format!("recommend-only: {pod_count} pending pod(s) need {nodes} new node(s) at ${cost:.4}/hour; nothing launched"),
                )
                .await;
        }
    }
    for u in &plan.unschedulable {
        let Some(pod) = pods.get(&u.pod) else {
            continue;
        };
        let uid = pod.uid().unwrap_or_default();
        round.covered.insert(u.pod.clone(), round.cover_until(now));
        if round.told.insert((uid, u.reason.clone())) {
            ctx.writer
                .event(
                    &reference(*pod),
                    EventType::Warning,
                    "FailedProvisioning",
                    "Provision",
                    format!("no node Tailor can launch fits this pod: {}", u.reason),
                )
                .await;
        }
    }
}

/// The NodePool of an existing node or in-flight claim the plan placed pods on.
fn placed_pool<'a>(
    name: &str,
    snapshot: &Snapshot,
    pools: &HashMap<String, &'a NodePool>,
) -> Option<&'a NodePool> {
    let labels = snapshot
        .nodes
        .iter()
        .find(|n| n.name_any() == name)
        .map(|n| n.labels())
        .or_else(|| {
            snapshot
                .node_claims
                .iter()
                .find(|c| c.name_any() == name)
                .map(|c| c.labels())
        })?;
    pools.get(labels.get(labels::NODE_POOL)?).copied()
}

/// Tells kube-scheduler where each planned pod is meant to land (a few writes at a time).
/// A failed nomination only costs placement quality, so it is logged, not retried.
pub(crate) async fn nominate<C: CloudProvider>(ctx: &Context<C>, nominations: &[(&str, String)]) {
    use futures::StreamExt;
    futures::stream::iter(nominations)
        .for_each_concurrent(32, |(pod, node)| async move {
            let (namespace, name) = pod.split_once('/').unwrap_or(("", pod));
            if let Err(e) = ctx.writer.nominate(namespace, name, node).await {
                tracing::debug!(pod = %pod, node = %node, error = %e, "nominating the planned node failed");
            }
        })
        .await;
}

/// The NodeClaim object for a planned node: the pool's template, narrowed to the planned
/// instance type (and its fallbacks), zone and capacity type.
pub fn node_claim_for(
    planned: &PlannedNodeClaim,
    pool: &NodePool,
    snapshot: &Snapshot,
    names: &super::Names,
) -> NodeClaim {
    let template = &pool.spec.template;
    let pool_name = pool.name_any();
    let narrowed = [
        labels::INSTANCE_TYPE,
        labels::ZONE,
        labels::CAPACITY_TYPE,
        labels::NODE_POOL,
    ];
    let mut requirements: Vec<NodeRequirement> = template
        .spec
        .requirements
        .iter()
        .filter(|r| !narrowed.contains(&labels::canonical_key(&r.key)))
        .cloned()
        .collect();
    let mut types = vec![planned.instance_type.clone()];
    types.extend(planned.alternatives.iter().cloned());
    for (k, values) in [
        (labels::INSTANCE_TYPE, types),
        (labels::ZONE, vec![planned.zone.clone()]),
        (
            labels::CAPACITY_TYPE,
            vec![planned.capacity_type.as_str().to_string()],
        ),
        (labels::NODE_POOL, vec![pool_name.clone()]),
    ] {
        requirements.push(NodeRequirement {
            key: k.to_string(),
            operator: RequirementOperator::In,
            values,
            min_values: None,
        });
    }
    let mut claim_labels = template.metadata.labels.clone();
    claim_labels.insert(labels::NODE_POOL.to_string(), pool_name.clone());
    let mut annotations = template.metadata.annotations.clone();
    annotations.insert(labels::NODE_POOL_HASH.to_string(), template_hash(pool));
    if let Some(class) = snapshot
        .node_classes
        .iter()
        .find(|c| c.name_any() == template.spec.node_class_ref.name)
    {
        annotations.insert(labels::NODE_CLASS_HASH.to_string(), node_class_hash(class));
    }
    let suffix = names.suffix();
    NodeClaim {
        metadata: ObjectMeta {
            name: Some(format!("{pool_name}-{suffix}")),
            labels: Some(claim_labels),
            annotations: Some(annotations),
            finalizers: Some(vec![labels::TERMINATION_FINALIZER.to_string()]),
            owner_references: Some(vec![OwnerReference {
                api_version: format!("{}/{}", labels::GROUP, labels::VERSION),
                kind: "NodePool".to_string(),
                name: pool_name,
                uid: pool.uid().unwrap_or_default(),
                block_owner_deletion: Some(true),
                controller: None,
            }]),
            ..ObjectMeta::default()
        },
        spec: NodeClaimSpec {
            requirements,
            resources: NodeClaimResources {
                requests: BTreeMap::from([
                    ("cpu".to_string(), Quantity(planned.requests.cpu.clone())),
                    (
                        "memory".to_string(),
                        Quantity(planned.requests.memory.clone()),
                    ),
                ]),
            },
            taints: template.spec.taints.clone(),
            startup_taints: template.spec.startup_taints.clone(),
            node_class_ref: template.spec.node_class_ref.clone(),
            expire_after: template.spec.expire_after.clone(),
            termination_grace_period: template.spec.termination_grace_period.clone(),
        },
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).expect("valid")
    }

    fn pending(name: &str) -> Arc<Pod> {
        Arc::new(
            serde_yaml::from_str(&format!(
                "metadata: {{name: {name}, namespace: shop, uid: uid-{name}}}\nspec: {{containers: [{{name: app, image: app}}]}}\nstatus:\n  phase: Pending\n  conditions: [{{type: PodScheduled, status: 'False', reason: Unschedulable}}]\n"
            ))
            .expect("valid pod"),
        )
    }

    fn claim(name: &str) -> Arc<NodeClaim> {
        Arc::new(
            serde_yaml::from_str(&format!(
                "apiVersion: tailor.sh/v1alpha1\nkind: NodeClaim\nmetadata: {{name: {name}}}\nspec:\n  nodeClassRef: {{group: tailor.sh, kind: AKSNodeClass, name: default}}\n"
            ))
            .expect("valid nodeclaim"),
        )
    }

    fn initialized(name: &str) -> Arc<NodeClaim> {
        let mut c = (*claim(name)).clone();
        c.status = Some(crate::apis::NodeClaimStatus {
            conditions: vec![super::super::nodeclaim::condition(
                crate::apis::nodeclaim::condition::INITIALIZED,
                true,
                "Initialized",
                "",
                t(0),
            )],
            ..Default::default()
        });
        Arc::new(c)
    }

    fn created_for(round: &mut Round, pod: &str, name: &str, at: Timestamp) {
        round.covered.insert(
            format!("shop/{pod}"),
            Target::Claim {
                name: name.to_string(),
                created: at,
                seen: false,
            },
        );
    }

    #[test]
    fn the_round_wakes_when_its_batch_closes_a_cover_runs_out_or_buying_ahead_is_due() {
        let mut round = Round::default();
        assert_eq!(next_wake(&round, true, 0), None, "nothing waits on time");
        round.batcher.observe(t(0));
        assert_eq!(next_wake(&round, false, 0), round.batcher.deadline());
        round.batcher.reset();
        round
            .covered
            .insert("shop/a".to_string(), Target::Until(t(20)));
        created_for(&mut round, "b", "default-bbbbb", t(5));
        round.covered.insert(
            "shop/c".to_string(),
            Target::Claim {
                name: "default-ccccc".to_string(),
                created: t(0),
                seen: true,
            },
        );
        // a's cover ends at 20; b's unseen claim covers it until 65; c's seen claim while
        // it lives, whatever the time.
        assert_eq!(next_wake(&round, false, 0), Some(t(20)));
        round.covered.remove("shop/a");
        assert_eq!(next_wake(&round, false, 0), Some(t(65)));
        // The next look ahead, only when buying ahead: 30 s after the last when the
        // cluster has changed since, 5 minutes when not.
        round.headroom_at = Some((t(0), Some(7)));
        assert_eq!(next_wake(&round, true, 8), Some(t(30)));
        assert_eq!(next_wake(&round, true, 7), Some(t(65)));
        assert_eq!(next_wake(&round, false, 8), Some(t(65)));
        round.covered.clear();
        assert_eq!(next_wake(&round, true, 7), Some(t(300)));
        // Nothing planned at the last look (pods were pending): 30 s, changed or not.
        round.headroom_at = Some((t(0), None));
        assert_eq!(next_wake(&round, true, 7), Some(t(30)));
    }

    #[test]
    fn a_pod_left_out_when_its_new_node_is_initialized_is_planned_again_after_the_bind_grace() {
        let timers = super::super::Timers::default();
        let pods = [pending("web-1"), pending("web-2")];
        let mut round = Round {
            timers,
            ..Round::default()
        };
        created_for(&mut round, "web-1", "default-aaaaa", t(0));
        created_for(&mut round, "web-2", "default-bbbbb", t(0));
        // Both claims launching: both pods wait for them.
        observe(
            &mut round,
            &pods,
            &[claim("default-aaaaa"), claim("default-bbbbb")],
            t(4),
        );
        assert!(round.uncovered.is_empty(), "{:?}", round.uncovered);
        // a's node is initialized at 8; web-1 is left to kube-scheduler for the grace.
        let claims = [initialized("default-aaaaa"), claim("default-bbbbb")];
        observe(&mut round, &pods, &claims, t(8));
        assert!(round.uncovered.is_empty(), "{:?}", round.uncovered);
        let grace = timers.provisioning_bind_grace.as_secs();
        assert!(grace < timers.provisioning_cover.as_secs());
        observe(&mut round, &pods, &claims, t(8 + grace - 1));
        assert!(round.uncovered.is_empty(), "{:?}", round.uncovered);
        // Still pending after the grace: kube-scheduler gave its room to another pod. It is
        // planned again now, long before a cover period; web-2's node is still launching.
        observe(&mut round, &pods, &claims, t(8 + grace));
        assert_eq!(round.uncovered, BTreeSet::from(["shop/web-1".to_string()]));
        // ... in a batch that closes after the idle window.
        assert!(
            round
                .batcher
                .deadline()
                .is_some_and(|d| d <= t(8 + grace + 10)),
            "{:?}",
            round.batcher.deadline()
        );
    }

    #[test]
    fn a_claim_the_store_has_not_shown_yet_covers_its_pods_and_one_seen_then_gone_does_not() {
        let pods = [pending("web-1"), pending("web-2")];
        let mut round = Round::default();
        created_for(&mut round, "web-1", "default-aaaaa", t(0));
        created_for(&mut round, "web-2", "default-bbbbb", t(0));

        // The NodeClaim watch fell behind: neither claim is in the store, and neither pod
        // is planned again.
        observe(&mut round, &pods, &[], t(5));
        assert!(round.uncovered.is_empty(), "{:?}", round.uncovered);

        // One claim shows up, launching; the other stays out of the store.
        observe(&mut round, &pods, &[claim("default-aaaaa")], t(10));
        assert!(round.uncovered.is_empty(), "{:?}", round.uncovered);

        // The seen claim is deleted (its launch failed): its pod is planned again at once.
        observe(&mut round, &pods, &[], t(15));
        assert_eq!(round.uncovered, BTreeSet::from(["shop/web-1".to_string()]));

        // A claim never shown for the whole cover is taken as gone too.
        observe(&mut round, &pods, &[], t(0) + UNSEEN_COVER);
        assert_eq!(
            round.uncovered,
            BTreeSet::from(["shop/web-1".to_string(), "shop/web-2".to_string()])
        );
    }
}
