//! Right-sizing in the cluster. Every `--rightsizing-interval` the leader reads the usage
//! that came in since its last read from Prometheus, continues each workload's histograms
//! from the checkpoint kept in its `Recommendation`, and server-side-applies one
//! Recommendation per workload (owned by the workload, so it goes when the workload goes)
//! through [`crate::rightsizing::service`], the code `tailor recommend` runs.
//!
//! Safety: when the read fails (Prometheus unreachable or failing) or its newest sample is
//! older than the staleness threshold, every Recommendation keeps its last values and is
//! marked `Stale`, an Event and a metric say why, and nothing is acted on. A workload with
//! too little history is reported, not actionable. A policy that cannot be used is
//! reported on its status and holds the workloads it would govern: no Recommendation is
//! written for them.

use super::state::InOrder;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use kube::ResourceExt;
use kube::api::ObjectMeta;
use kube::runtime::events::EventType;

use super::Context;
use super::writes::WriteError;
use crate::actuation::eviction::{self, Stuck, Wait};
use crate::apis::recommendation::{HOURS_PER_MONTH, condition, reason};
use crate::apis::rightsizingpolicy::{
    OVERLAPPING_LISTED, condition as policy_condition, reason as policy_reason,
};
use crate::apis::{
    ContainerRecommendation, ContainerResources, Mode, Recommendation, RecommendationSpec,
    RecommendationStatus, RecommendationSummary, ResourceList, RightsizingPolicyStatus,
    TargetReference, UpdateMode,
};
use crate::cloud::CloudProvider;
use crate::model::quantity::{self, format_milli, format_value};
use crate::provisioning::Mode as GlobalMode;
use crate::rightsizing::Requests;
use crate::rightsizing::service::{
    ContainerOutcome, DEFAULT_STEP_SECONDS, Governance, Outcome, Policies, PolicyRef, Request,
    Resume, oom_kills, recommend_workloads, workload_labels,
};
use crate::state::Snapshot;
use crate::telemetry::names::{Controller, EvictionWait, RecommendationState, StuckResize};
use crate::usage::pool::Checkpoint;
use crate::usage::prometheus::PrometheusSource;
use crate::usage::workloads::{Workload, Workloads};
use crate::usage::{ContainerKey, UsageSource};

/// Labels of each workload object.
type Labels = BTreeMap<Workload, BTreeMap<String, String>>;

/// Event reasons of this controller.
pub mod event_reason {
    /// Usage could not be read or is too old: Recommendations are stale.
    pub const USAGE_STALE: &str = "UsageStale";
    /// Usage is read again after being stale.
    pub const USAGE_FRESH: &str = "UsageFresh";
    /// A pod that could not be resized in place was evicted, to come back with the
    /// recommended requests.
    pub const EVICTED: &str = "EvictedToResize";
    /// Pods that could not be resized in place are not evicted: their PodDisruptionBudget
    /// allows no disruption now.
    pub const BLOCKED_BY_BUDGET: &str = "EvictionBlockedByBudget";
    /// Pods that could not be resized in place are not evicted: fewer than
    /// `update.minReplicas` would stay available.
    pub const BLOCKED_BY_MIN_REPLICAS: &str = "EvictionBlockedByMinReplicas";
    /// Pods that could not be resized in place are not evicted: no webhook would give their
    /// replacements the new requests.
    pub const BLOCKED_WITHOUT_WEBHOOK: &str = "EvictionBlockedWithoutWebhook";
    /// `RollingRestart`: the workload's pod template got the recommended requests.
    pub const TEMPLATE_APPLIED: &str = "TemplateRequestsApplied";
    /// `RollingRestart` was asked for but the install does not allow it: nothing patched.
    pub const ROLLING_RESTART_DISABLED: &str = "RollingRestartDisabled";
}

/// Runs right-sizing until aborted, reading usage from Prometheus; does nothing without
/// `--prometheus-url`.
pub async fn run<C: CloudProvider + 'static>(ctx: Arc<Context<C>>) {
    let Some(settings) = ctx.settings.prometheus.clone() else {
        tracing::info!("no --prometheus-url: right-sizing is off");
        return;
    };
    let source = match PrometheusSource::new(settings) {
        // Each request's duration and failures, and the data's age, reach /metrics.
        Ok(s) => s.with_metrics(ctx.metrics.clone()),
        Err(e) => {
            tracing::error!(error = %e, "right-sizing is off: the Prometheus settings are unusable");
            return;
        }
    };
    run_with(ctx, source).await;
}

/// Runs right-sizing until aborted, reading usage from `source`.
pub async fn run_with<C: CloudProvider + 'static, U: UsageSource>(ctx: Arc<Context<C>>, source: U) {
    ctx.state.wait_synced().await;
    // Checkpoints written in this term of leadership; on a new term the store's are used.
    let mut term: Option<Term> = None;
    loop {
        if !ctx.writer.is_leader() {
            term = None;
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        let term = term.get_or_insert_with(Term::default);
        let started = Instant::now();
        let result = reconcile(&ctx, &source, term).await;
        ctx.metrics.reconcile(
            Controller::Rightsizing,
            started.elapsed().as_secs_f64(),
            result.is_err(),
        );
        if result.is_ok() {
            ctx.metrics
                .observe_decision("rightsizing", started.elapsed().as_secs_f64());
        }
        match result {
            Ok(n) => tracing::info!(
                workloads = n,
                seconds = started.elapsed().as_secs_f64(),
                "right-sizing round done"
            ),
            Err(e) => tracing::warn!(error = %e, "right-sizing round failed"),
        }
        next_round(&ctx, &term.ooms_seen, ctx.settings.rightsizing_interval).await;
    }
}

/// Waits for the next round: `interval`, or less when a container is OOM-killed that the
/// last round did not see, so its memory is raised within seconds of the kill rather than
/// at the next round (the usage history learns of a kill only after a scrape and a read).
async fn next_round<C: CloudProvider>(
    ctx: &Context<C>,
    seen: &BTreeSet<(ContainerKey, i64)>,
    interval: Duration,
) {
    // Tokio's clock, not the system's: on the demo's paused runtime an interval is
    // virtual time.
    let deadline = tokio::time::Instant::now() + interval;
    // A container killed over and over (crash-looping at a capped size) starts a round at
    // most this often.
    let earliest = tokio::time::Instant::now() + OOM_ROUND_GAP.min(interval);
    loop {
        let seen_generation = ctx.state.generation();
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return;
        }
        if oom_kills(&ctx.state.pods.state())
            .iter()
            .any(|o| !seen.contains(&(o.key.clone(), o.at)))
        {
            tokio::time::sleep_until(earliest).await;
            return;
        }
        super::wait_for_change_since(&ctx.state, seen_generation, left).await;
    }
}

/// The least time between the end of a round and one an OOM kill starts.
const OOM_ROUND_GAP: Duration = Duration::from_secs(5);

/// What the leader remembers between rounds.
#[derive(Default)]
struct Term {
    /// The last checkpoint written per workload.
    checkpoints: BTreeMap<Workload, Checkpoint>,
    /// Recommendations whose metadata and spec were applied this term.
    applied: BTreeSet<(String, String)>,
    /// The OOM kills the last round took in (container, when): a new one starts a round.
    ooms_seen: BTreeSet<(ContainerKey, i64)>,
    /// Pods (namespace, name) whose resize call the API server refused, with its message;
    /// cleared when a resize is accepted or the pod is evicted or gone.
    refused: BTreeMap<(String, String), String>,
}

/// Why a round failed.
#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error(transparent)]
    Usage(#[from] crate::usage::UsageError),
    #[error("{0}")]
    Catalog(String),
    #[error(transparent)]
    Write(#[from] super::writes::WriteError),
}

/// The Recommendation name of a workload: `<kind>-<name>`, lower case.
pub fn recommendation_name(w: &Workload) -> String {
    format!("{}-{}", w.kind.to_ascii_lowercase(), w.name)
}

/// The API version, kind and uid of a workload object, for the owner reference.
fn owner_of(snapshot: &Snapshot, w: &Workload) -> Option<OwnerReference> {
    fn find<'a, K: kube::Resource<DynamicType = ()> + 'a>(
        list: impl IntoIterator<Item = &'a K>,
        w: &Workload,
    ) -> Option<OwnerReference> {
        list.into_iter()
            .find(|o| {
                o.meta().namespace.as_deref() == Some(w.namespace.as_str())
                    && o.meta().name.as_deref() == Some(w.name.as_str())
            })
            .and_then(|o| {
                Some(OwnerReference {
                    api_version: K::api_version(&()).to_string(),
                    kind: K::kind(&()).to_string(),
                    name: w.name.clone(),
                    uid: o.meta().uid.clone()?,
                    controller: Some(false),
                    block_owner_deletion: None,
                })
            })
    }
    match w.kind.as_str() {
        "Deployment" => find(&snapshot.deployments, w),
        "StatefulSet" => find(&snapshot.stateful_sets, w),
        "DaemonSet" => find(&snapshot.daemon_sets, w),
        "ReplicaSet" => find(&snapshot.replica_sets, w),
        "Job" => find(&snapshot.jobs, w),
        "CronJob" => snapshot
            .jobs
            .iter()
            .filter(|j| j.metadata.namespace.as_deref() == Some(w.namespace.as_str()))
            .flat_map(|j| j.metadata.owner_references.iter().flatten())
            .find(|o| o.kind == "CronJob" && o.name == w.name)
            .map(|o| OwnerReference {
                controller: Some(false),
                block_owner_deletion: None,
                ..o.clone()
            }),
        // A bare pod is not a workload worth a standing recommendation.
        _ => None,
    }
}

/// A condition, keeping the previous transition time when the status did not change.
fn condition_of(
    previous: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    now: Timestamp,
) -> Condition {
    let status = if status { "True" } else { "False" }.to_string();
    let since = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or(Time(now), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_string(),
        status,
        reason: reason.to_string(),
        message,
        last_transition_time: since,
        observed_generation: None,
    }
}

fn cpu_list(cpu: Option<i64>, memory: Option<i64>) -> ResourceList {
    let mut list = ResourceList::new();
    if let Some(c) = cpu {
        list.insert(
            "cpu".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity(format_milli(c)),
        );
    }
    if let Some(m) = memory {
        list.insert(
            "memory".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity(format_value(m)),
        );
    }
    list
}

fn resources(r: &Requests) -> ContainerResources {
    ContainerResources {
        requests: cpu_list(r.cpu, r.memory),
        limits: cpu_list(r.cpu_limit, r.memory_limit),
    }
}

/// Why usage is stale, if it is.
#[derive(Debug, Clone, PartialEq)]
pub enum Staleness {
    /// The last read succeeded and its newest sample is recent.
    Fresh,
    /// The read failed.
    Unavailable(String),
    /// The newest sample is this many seconds old.
    TooOld(i64),
}

impl Staleness {
    fn condition(&self, previous: &[Condition], now: Timestamp) -> Condition {
        match self {
            Staleness::Fresh => condition_of(
                previous,
                condition::STALE,
                false,
                reason::FRESH,
                "usage read from Prometheus in the last round".to_string(),
                now,
            ),
            Staleness::Unavailable(why) => condition_of(
                previous,
                condition::STALE,
                true,
                reason::USAGE_UNAVAILABLE,
                format!("usage could not be read, values are from the last good read: {why}"),
                now,
            ),
            Staleness::TooOld(age) => condition_of(
                previous,
                condition::STALE,
                true,
                reason::USAGE_TOO_OLD,
                format!(
                    "the newest usage sample is {age}s old: Prometheus is not scraping the \
                     containers; nothing is applied until it is"
                ),
                now,
            ),
        }
    }
}

/// The status of a workload's Recommendation from its containers' outcomes. Pure.
#[allow(clippy::too_many_arguments)]
pub fn status_of(
    w: &Workload,
    containers: &[&ContainerOutcome],
    without_usage: usize,
    mode: Mode,
    staleness: &Staleness,
    checkpoint: Option<&Checkpoint>,
    previous: &[Condition],
    now: Timestamp,
) -> RecommendationStatus {
    let mut status = RecommendationStatus {
        mode: Some(format!("{mode:?}")),
        last_update_time: Some(Time(now)),
        usage_read_until: checkpoint.map(|c| c.until),
        checkpoint: checkpoint.and_then(|c| serde_json::to_string(c).ok()),
        ..RecommendationStatus::default()
    };
    let mut hourly = 0.0;
    let (mut cpu_now, mut cpu_new, mut mem_now, mut mem_new) = (0, 0, 0, 0);
    let mut confidence: f64 = 1.0;
    let mut not_actionable = Vec::new();
    for c in containers {
        let r = &c.recommendation;
        hourly += r.hourly_cost_delta;
        cpu_now += r.current.cpu.unwrap_or(0);
        cpu_new += r.recommended.cpu.unwrap_or(0);
        mem_now += r.current.memory.unwrap_or(0);
        mem_new += r.recommended.memory.unwrap_or(0);
        confidence = confidence.min(r.confidence);
        if !r.actionable {
            not_actionable.push(format!(
                "{}: {}",
                c.container,
                r.reasons
                    .first()
                    .cloned()
                    .unwrap_or_else(|| "not actionable".to_string())
            ));
        }
        status.containers.push(ContainerRecommendation {
            name: c.container.clone(),
            current: resources(&r.current),
            recommended: resources(&r.recommended),
            lower: cpu_list(r.lower.0, r.lower.1),
            upper: cpu_list(r.upper.0, r.upper.1),
            confidence: quantity::round_to(r.confidence, 2),
            reasons: r.reasons.clone(),
            monthly_cost_delta: quantity::round_to(r.hourly_cost_delta * HOURS_PER_MONTH, 2),
        });
    }
    if containers.is_empty() {
        confidence = 0.0;
    }
    status.set_hourly_cost_delta(hourly);
    status.summary = Some(RecommendationSummary {
        workload: format!("{}/{}", w.kind, w.name),
        containers: i32::try_from(containers.len()).unwrap_or(i32::MAX),
        cpu: format!(
            "{} -> {}",
            quantity::display_cores(cpu_now),
            quantity::display_cores(cpu_new)
        ),
        memory: format!(
            "{} -> {}",
            quantity::display_bytes(mem_now),
            quantity::display_bytes(mem_new)
        ),
        monthly_cost_delta: quantity::round_to(hourly * HOURS_PER_MONTH, 2),
        confidence: quantity::round_to(confidence, 2),
    });
    let ready = if containers.is_empty() {
        condition_of(
            previous,
            condition::READY,
            false,
            reason::NO_USAGE,
            format!("no usage in Prometheus for the workload's {without_usage} container(s) yet"),
            now,
        )
    } else {
        condition_of(
            previous,
            condition::READY,
            true,
            reason::RECOMMENDED,
            format!(
                "{} container(s) recommended{}",
                containers.len(),
                if without_usage > 0 {
                    format!("; {without_usage} without usage")
                } else {
                    String::new()
                }
            ),
            now,
        )
    };
    let actionable = if containers.is_empty() {
        condition_of(
            previous,
            condition::ACTIONABLE,
            false,
            reason::NO_USAGE,
            "nothing to act on without usage".to_string(),
            now,
        )
    } else if *staleness != Staleness::Fresh {
        condition_of(
            previous,
            condition::ACTIONABLE,
            false,
            reason::USAGE_UNAVAILABLE,
            "usage is stale: nothing is acted on".to_string(),
            now,
        )
    } else if !not_actionable.is_empty() {
        condition_of(
            previous,
            condition::ACTIONABLE,
            false,
            reason::INSUFFICIENT_HISTORY,
            not_actionable.join("; "),
            now,
        )
    } else {
        condition_of(
            previous,
            condition::ACTIONABLE,
            true,
            reason::ACTIONABLE,
            "enough recent history to act on".to_string(),
            now,
        )
    };
    status.conditions = vec![ready, actionable, staleness.condition(previous, now)];
    status
}

/// One round: read, compute, write. Returns the workloads written.
async fn reconcile<C: CloudProvider, U: UsageSource>(
    ctx: &Context<C>,
    source: &U,
    term: &mut Term,
) -> Result<usize, RoundError> {
    let now = ctx.clock.now();
    let now_s = now.as_second();
    let snapshot = ctx.state.snapshot();
    let workloads = Workloads::from_snapshot(&snapshot);
    let global = match ctx.settings.mode {
        GlobalMode::RecommendOnly => Mode::Recommend,
        GlobalMode::Autonomous => Mode::Auto,
    };
    let policies = Policies::new(
        &snapshot.rightsizing_policies,
        Some(&ctx.settings.namespace),
        global,
    );
    let stored: Vec<Arc<Recommendation>> = ctx.state.recommendations.in_order();
    let stored_by_name: BTreeMap<(String, String), &Recommendation> = stored
        .iter()
        .map(|r| ((r.namespace().unwrap_or_default(), r.name_any()), &**r))
        .collect();
    // Checkpoints: this term's, else what the store holds (a previous leader's).
    let mut checkpoints = term.checkpoints.clone();
    for r in &stored {
        let w = Workload {
            namespace: r.namespace().unwrap_or_default(),
            kind: r.spec.target_ref.kind.clone(),
            name: r.spec.target_ref.name.clone(),
        };
        if checkpoints.contains_key(&w) {
            continue;
        }
        if let Some(c) = r
            .status
            .as_ref()
            .and_then(|s| s.checkpoint.as_deref())
            .and_then(|text| serde_json::from_str::<Checkpoint>(text).ok())
        {
            checkpoints.insert(w, c);
        }
    }
    let (prices, largest) = {
        let catalog = ctx
            .catalog
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let types = catalog
            .instance_types(&ctx.catalog_options)
            .map_err(|e| RoundError::Catalog(e.to_string()))?;
        (
            crate::rightsizing::Prices::from_instance_types(&types),
            types
                .iter()
                .map(|t| (t.allocatable.cpu, t.allocatable.memory))
                .fold((0, 0), |a, b| (a.0.max(b.0), a.1.max(b.1))),
        )
    };
    let labels = workload_labels(&snapshot);
    write_policy_statuses(ctx, &snapshot, &workloads, (&policies, &labels), now).await;
    let ooms = oom_kills(&snapshot.pods);
    let result = recommend_workloads(
        source,
        Request {
            snapshot: &snapshot,
            workloads: &workloads,
            policies: &policies,
            namespaces: &[],
            history: None,
            step: DEFAULT_STEP_SECONDS,
            now: now_s,
            largest_node: Some(largest),
            prices,
            resume: Resume::PerWorkload(checkpoints),
            keep_hours: false,
            ooms: &ooms,
        },
    )
    .await;
    term.ooms_seen = ooms.into_iter().map(|o| (o.key, o.at)).collect();
    let outcome = match result {
        Ok(o) => o,
        Err(e) => {
            ctx.metrics.usage_read_failed();
            mark_stale(ctx, &stored, &Staleness::Unavailable(e.to_string()), now).await;
            return Err(e.into());
        }
    };
    ctx.metrics
        .usage_read(outcome.stats.queries, outcome.stats.samples);
    let newest = outcome
        .containers
        .iter()
        .filter_map(|c| c.last_sample)
        .max();
    if let Some(newest) = newest {
        ctx.metrics.set_usage_data_age((now_s - newest) as f64);
    }
    let staleness = match newest {
        Some(t) if now_s - t > ctx.settings.usage_stale_after => Staleness::TooOld(now_s - t),
        _ => Staleness::Fresh,
    };
    for (w, p, e) in &outcome.held {
        tracing::debug!(workload = %format!("{}/{}/{}", w.namespace, w.kind, w.name), policy = %p, error = %e, "held by an unusable policy");
    }
    // What the recommendations would save an hour, over every pod they apply to (those
    // that would cost more count as nothing saved).
    let mut pods_of: BTreeMap<Workload, usize> = BTreeMap::new();
    for p in &snapshot.pods {
        let namespace = p.metadata.namespace.as_deref().unwrap_or("default");
        if let Some(w) = workloads.of_pod(namespace, &p.name_any()) {
            *pods_of.entry(w).or_default() += 1;
        }
    }
    let available: f64 = outcome
        .containers
        .iter()
        .map(|c| {
            let pods = pods_of.get(&c.workload).copied().unwrap_or(0);
            (-c.recommendation.hourly_cost_delta).max(0.0) * pods as f64
        })
        .sum();
    ctx.metrics.set_savings_available(
        crate::telemetry::names::SavingsSource::Rightsizing,
        available,
    );
    let written = write_recommendations(
        ctx,
        &snapshot,
        &outcome,
        &staleness,
        &stored_by_name,
        (&policies, &labels, &workloads),
        term,
        now,
    )
    .await?;
    Ok(written)
}

/// Marks every stored Recommendation stale (keeping its values), with an Event on the ones
/// that were not stale before.
async fn mark_stale<C: CloudProvider>(
    ctx: &Context<C>,
    stored: &[Arc<Recommendation>],
    staleness: &Staleness,
    now: Timestamp,
) {
    ctx.metrics
        .set_recommendations(RecommendationState::Stale, stored.len());
    ctx.metrics
        .set_recommendations(RecommendationState::Actionable, 0);
    for r in stored {
        let mut status = r.status.clone().unwrap_or_default();
        let was_stale = status
            .conditions
            .iter()
            .any(|c| c.type_ == condition::STALE && c.status == "True");
        let stale = staleness.condition(&status.conditions, now);
        let not_actionable = condition_of(
            &status.conditions,
            condition::ACTIONABLE,
            false,
            reason::USAGE_UNAVAILABLE,
            "usage is stale: nothing is acted on".to_string(),
            now,
        );
        status
            .conditions
            .retain(|c| c.type_ != condition::STALE && c.type_ != condition::ACTIONABLE);
        let message = stale.message.clone();
        status.conditions.push(not_actionable);
        status.conditions.push(stale);
        let (ns, name) = (r.namespace().unwrap_or_default(), r.name_any());
        if let Err(e) = ctx
            .writer
            .apply_recommendation_status(&ns, &name, &status)
            .await
        {
            tracing::warn!(recommendation = %format!("{ns}/{name}"), error = %e, "marking stale failed");
            continue;
        }
        if !was_stale {
            ctx.writer
                .event(
                    &super::reference(&**r),
                    EventType::Warning,
                    event_reason::USAGE_STALE,
                    "Rightsizing",
                    message,
                )
                .await;
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn write_recommendations<C: CloudProvider>(
    ctx: &Context<C>,
    snapshot: &Snapshot,
    outcome: &Outcome,
    staleness: &Staleness,
    stored: &BTreeMap<(String, String), &Recommendation>,
    (policies, labels, workloads): (&Policies, &Labels, &Workloads),
    term: &mut Term,
    now: Timestamp,
) -> Result<usize, RoundError> {
    let mut by_workload: BTreeMap<&Workload, Vec<&ContainerOutcome>> = BTreeMap::new();
    for c in &outcome.containers {
        by_workload.entry(&c.workload).or_default().push(c);
    }
    let mut without: BTreeMap<&Workload, usize> = BTreeMap::new();
    for (w, _) in &outcome.without_usage {
        *without.entry(w).or_default() += 1;
    }
    let mut written = 0;
    let (mut actionable, mut stale, mut containers) = (0, 0, 0);
    let mut waiting: BTreeMap<EvictionWait, usize> = BTreeMap::new();
    for (w, checkpoint) in &outcome.checkpoints {
        let Some(owner) = owner_of(snapshot, w) else {
            continue;
        };
        let list = by_workload.get(w).cloned().unwrap_or_default();
        let mode = list
            .first()
            .map_or_else(|| governing_mode(policies, labels, w), |c| c.mode);
        let name = recommendation_name(w);
        let key = (w.namespace.clone(), name.clone());
        let previous = stored
            .get(&key)
            .and_then(|r| r.status.as_ref())
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        let was_stale = previous
            .iter()
            .any(|c| c.type_ == condition::STALE && c.status == "True");
        let policy_ref = list.first().and_then(|c| c.policy.clone()).map(|p| p.name);
        let object = Recommendation {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(w.namespace.clone()),
                owner_references: Some(vec![owner.clone()]),
                ..ObjectMeta::default()
            },
            spec: RecommendationSpec {
                target_ref: TargetReference {
                    api_version: owner.api_version.clone(),
                    kind: w.kind.clone(),
                    name: w.name.clone(),
                },
                policy_ref,
            },
            status: None,
        };
        let same = stored.get(&key).is_some_and(|r| {
            r.spec == object.spec && r.metadata.owner_references == object.metadata.owner_references
        });
        if !same || !term.applied.contains(&key) {
            ctx.writer.apply_recommendation(&object).await?;
            term.applied.insert(key.clone());
        }
        let status = status_of(
            w,
            &list,
            without.get(w).copied().unwrap_or(0),
            mode,
            staleness,
            Some(checkpoint),
            &previous,
            now,
        );
        if status
            .conditions
            .iter()
            .any(|c| c.type_ == condition::ACTIONABLE && c.status == "True")
        {
            actionable += 1;
        }
        let is_stale = *staleness != Staleness::Fresh;
        stale += usize::from(is_stale);
        containers += list.len();
        ctx.writer
            .apply_recommendation_status(&w.namespace, &name, &status)
            .await?;
        term.checkpoints.insert(w.clone(), checkpoint.clone());
        written += 1;
        let act = status
            .conditions
            .iter()
            .any(|c| c.type_ == condition::ACTIONABLE && c.status == "True");
        if act
            && mode == Mode::Auto
            && list
                .first()
                .is_some_and(|c| c.update == UpdateMode::InPlace)
        {
            let reference = super::reference(&object);
            let mut round = Actuation {
                reference: &reference,
                term: &mut *term,
                waiting: &mut waiting,
                now: now.as_second(),
            };
            resize_in_place(ctx, snapshot, workloads, w, &list, &mut round).await;
        }
        if act
            && mode == Mode::Auto
            && list
                .first()
                .is_some_and(|c| c.update == UpdateMode::RollingRestart)
        {
            roll(ctx, workloads, w, &list, &super::reference(&object)).await;
        }
        if is_stale != was_stale {
            let reference = super::reference(&object);
            let (type_, reason, note) = if is_stale {
                let note = status
                    .conditions
                    .iter()
                    .find(|c| c.type_ == condition::STALE)
                    .map(|c| c.message.clone())
                    .unwrap_or_default();
                (EventType::Warning, event_reason::USAGE_STALE, note)
            } else {
                (
                    EventType::Normal,
                    event_reason::USAGE_FRESH,
                    "usage is read again".to_string(),
                )
            };
            ctx.writer
                .event(&reference, type_, reason, "Rightsizing", note)
                .await;
        }
    }
    // Refusals of pods that are gone are forgotten.
    term.refused.retain(|(ns, name), _| {
        snapshot.pods.iter().any(|p| {
            p.metadata.namespace.as_deref() == Some(ns) && p.metadata.name.as_deref() == Some(name)
        })
    });
    ctx.metrics.set_rightsizing_evictions_waiting(&waiting);
    ctx.metrics.set_rightsizing_containers(containers);
    ctx.metrics
        .set_recommendations(RecommendationState::Actionable, actionable);
    ctx.metrics
        .set_recommendations(RecommendationState::Stale, stale);
    Ok(written)
}

/// What one workload's actuation reads and records beyond the cluster.
struct Actuation<'a> {
    /// The workload's Recommendation, where Events about its pods go.
    reference: &'a ObjectReference,
    term: &'a mut Term,
    /// Pods waiting to be evicted this round, by what holds them.
    waiting: &'a mut BTreeMap<EvictionWait, usize>,
    /// Unix seconds.
    now: i64,
}

fn stuck_label(s: &Stuck) -> StuckResize {
    match s {
        Stuck::Infeasible(_) => StuckResize::Infeasible,
        Stuck::Deferred(_) => StuckResize::Deferred,
        Stuck::Refused(_) => StuckResize::Refused,
    }
}

fn wait_label(w: &Wait) -> EvictionWait {
    match w {
        Wait::MinReplicas { .. } => EvictionWait::MinReplicas,
        Wait::NoWebhook => EvictionWait::NoWebhook,
    }
}

/// Auto mode, `InPlace`: resizes the workload's running pods to the recommendation through
/// the pod `resize` subresource, leaving changes within the hysteresis alone; then evicts
/// the pods the node cannot resize, as [`crate::actuation::eviction`] decides, and says on
/// the Recommendation why the others wait.
async fn resize_in_place<C: CloudProvider>(
    ctx: &Context<C>,
    snapshot: &Snapshot,
    workloads: &Workloads,
    w: &Workload,
    containers: &[&ContainerOutcome],
    round: &mut Actuation<'_>,
) {
    let targets: BTreeMap<String, crate::rightsizing::ContainerRecommendation> = containers
        .iter()
        .map(|c| (c.container.clone(), c.recommendation.clone()))
        .collect();
    // The maximum step is applied here, against each pod's requests; the Recommendation
    // written above keeps the whole target.
    let rules = crate::actuation::Rules {
        min_change: containers.first().map_or(0.1, |c| c.min_change),
        max_step: containers.first().map_or(0.5, |c| c.max_step),
    };
    let min_replicas = containers.first().map_or(1, |c| c.min_replicas);
    let pods: Vec<&Pod> = snapshot
        .pods
        .iter()
        .map(|p| &**p)
        .filter(|p| {
            workloads
                .of_pod(
                    p.metadata.namespace.as_deref().unwrap_or("default"),
                    p.metadata.name.as_deref().unwrap_or_default(),
                )
                .as_ref()
                == Some(w)
        })
        .collect();
    for resize in crate::actuation::resizes(pods.iter().copied(), &targets, rules) {
        let key = (resize.namespace.clone(), resize.pod.clone());
        match ctx.writer.resize_pod(&resize).await {
            Ok(()) => {
                round.term.refused.remove(&key);
                ctx.metrics.recommendation_applied(&resize.namespace);
                tracing::info!(pod = %format!("{}/{}", resize.namespace, resize.pod), "resized in place");
            }
            Err(WriteError::NotLeader { .. }) => return,
            Err(e) => {
                tracing::warn!(pod = %format!("{}/{}", resize.namespace, resize.pod), error = %e, "in-place resize refused");
                round.term.refused.insert(key, e.to_string());
            }
        }
    }
    let refused: BTreeMap<String, String> = round
        .term
        .refused
        .iter()
        .filter(|((ns, _), _)| *ns == w.namespace)
        .map(|((_, name), why)| (name.clone(), why.clone()))
        .collect();
    // A memory increase an OOM kill forced does not wait for room on the node.
    let urgent = containers.iter().any(|c| c.recommendation.memory_urgent);
    let plan = eviction::plan(
        pods.iter().copied(),
        &refused,
        min_replicas,
        ctx.settings.webhook,
        urgent,
        round.now,
    );
    // One Event per outcome and round (the recorder folds repeats of a reason into a
    // series, so each reason says one thing), naming the pods.
    let mut notes: BTreeMap<EvictionWait, Vec<String>> = BTreeMap::new();
    let mut evicted: Vec<String> = Vec::new();
    for (name, why, wait) in &plan.waiting {
        notes
            .entry(wait_label(wait))
            .or_default()
            .push(format!("{name} ({why}; {wait})"));
    }
    for (name, why) in &plan.evict {
        let Some(pod) = pods
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
        else {
            continue;
        };
        match ctx.writer.evict(pod).await {
            Ok(()) => {
                round
                    .term
                    .refused
                    .remove(&(w.namespace.clone(), name.clone()));
                ctx.metrics.rightsizing_eviction(stuck_label(why));
                tracing::info!(pod = %format!("{}/{name}", w.namespace), why = %why, "evicted: it could not be resized in place");
                evicted.push(format!("{name} ({why})"));
            }
            // The PodDisruptionBudget allows no disruption now: the next round tries again.
            Err(WriteError::EvictionRefused { message, .. }) => {
                notes.entry(EvictionWait::Pdb).or_default().push(format!(
                    "{name} ({why}; its PodDisruptionBudget allows no disruption now: \
                     {message}; tried again next round)"
                ));
            }
            Err(WriteError::NotLeader { .. }) => return,
            Err(e) => {
                tracing::warn!(pod = %format!("{}/{name}", w.namespace), error = %e, "eviction failed");
            }
        }
    }
    const LISTED: usize = 5;
    let listed = |pods: &[String]| {
        let mut text = pods
            .iter()
            .take(LISTED)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if pods.len() > LISTED {
            text.push_str(&format!(" and {} more", pods.len() - LISTED));
        }
        text
    };
    if !evicted.is_empty() {
        let note = format!(
            "evicted {} pod(s) that could not be resized in place: {}; their replacements get \
             the recommended requests at creation",
            evicted.len(),
            listed(&evicted)
        );
        ctx.writer
            .event(
                round.reference,
                EventType::Normal,
                event_reason::EVICTED,
                "Evict",
                note,
            )
            .await;
    }
    for (wait, pods) in notes {
        *round.waiting.entry(wait).or_default() += pods.len();
        let reason = match wait {
            EvictionWait::Pdb => event_reason::BLOCKED_BY_BUDGET,
            EvictionWait::MinReplicas => event_reason::BLOCKED_BY_MIN_REPLICAS,
            EvictionWait::NoWebhook => event_reason::BLOCKED_WITHOUT_WEBHOOK,
        };
        let note = format!(
            "{} pod(s) could not be resized in place and are not evicted: {}",
            pods.len(),
            listed(&pods)
        );
        ctx.writer
            .event(round.reference, EventType::Warning, reason, "Evict", note)
            .await;
    }
}

/// Auto mode, `RollingRestart`: applies the recommendation to the workload's pod template
/// (only its resource fields), so the workload's controller rolls the pods; they get the
/// same values from the webhook, when it serves, as they are created.
async fn roll<C: CloudProvider>(
    ctx: &Context<C>,
    workloads: &Workloads,
    w: &Workload,
    containers: &[&ContainerOutcome],
    reference: &ObjectReference,
) {
    let Some(template) = workloads.templates.get(w) else {
        return;
    };
    let targets: BTreeMap<String, crate::rightsizing::ContainerRecommendation> = containers
        .iter()
        .map(|c| (c.container.clone(), c.recommendation.clone()))
        .collect();
    let rules = crate::actuation::Rules {
        min_change: containers.first().map_or(0.1, |c| c.min_change),
        max_step: containers.first().map_or(0.5, |c| c.max_step),
    };
    if crate::actuation::rollable(&w.kind).is_none() {
        tracing::debug!(workload = %format!("{}/{}/{}", w.namespace, w.kind, w.name), "RollingRestart: the kind has no rolling pod template; the webhook applies at creation");
        return;
    }
    if !ctx.settings.rolling_restart {
        let note = format!(
            "{} {}: update.mode RollingRestart is off in this install (--rightsizing-rolling-restart, chart value settings.rightsizingRollingRestart); the pod template is left as it is",
            w.kind, w.name
        );
        tracing::debug!(%note, "RollingRestart not applied");
        ctx.writer
            .event(
                reference,
                EventType::Warning,
                event_reason::ROLLING_RESTART_DISABLED,
                "Rightsizing",
                note,
            )
            .await;
        return;
    }
    let Some(body) =
        crate::actuation::template_apply(&w.kind, &w.namespace, &w.name, template, &targets, rules)
    else {
        return;
    };
    match ctx.writer.apply_workload_template(&body).await {
        Ok(()) => {
            ctx.metrics.recommendation_applied(&w.namespace);
            tracing::info!(workload = %format!("{}/{}/{}", w.namespace, w.kind, w.name), "pod template requests applied: the workload rolls its pods");
            ctx.writer
                .event(
                    reference,
                    EventType::Normal,
                    event_reason::TEMPLATE_APPLIED,
                    "Rightsizing",
                    format!(
                        "{} {}: pod template requests set to the recommendation; its pods roll",
                        w.kind, w.name
                    ),
                )
                .await;
        }
        Err(WriteError::NotLeader { .. }) => {}
        Err(e) => {
            tracing::warn!(workload = %format!("{}/{}/{}", w.namespace, w.kind, w.name), error = %e, "applying the pod template requests failed");
        }
    }
}

/// The mode of a workload without usage: its policy's, else the global one.
fn governing_mode(policies: &Policies, labels: &Labels, w: &Workload) -> Mode {
    match policies.govern(w, labels.get(w).unwrap_or(&BTreeMap::new())) {
        Governance::Governed { policy, .. } => policy.mode,
        Governance::Held { .. } => Mode::Recommend,
    }
}

/// A policy's `Overlapping` condition: true when other policies win some of the workloads
/// it selects, naming them (a bounded list) and their winners.
fn overlapping_condition(
    previous: &[Condition],
    lost: Option<&Vec<(Workload, PolicyRef)>>,
    now: Timestamp,
) -> Condition {
    let Some(lost) = lost.filter(|l| !l.is_empty()) else {
        return condition_of(
            previous,
            policy_condition::OVERLAPPING,
            false,
            policy_reason::EXCLUSIVE,
            "no other policy governs a workload this policy selects".to_string(),
            now,
        );
    };
    let mut named: Vec<String> = lost
        .iter()
        .take(OVERLAPPING_LISTED)
        .map(|(w, winner)| format!("{}/{} (governed by {})", w.kind, w.name, winner.name))
        .collect();
    if lost.len() > OVERLAPPING_LISTED {
        named.push(format!("and {} more", lost.len() - OVERLAPPING_LISTED));
    }
    condition_of(
        previous,
        policy_condition::OVERLAPPING,
        true,
        policy_reason::OVERLAPPING,
        format!(
            "{} workload(s) this policy selects are governed by a more specific policy \
             (targetRefs, then selector, then name order): {}",
            lost.len(),
            named.join(", ")
        ),
        now,
    )
}

/// Writes each policy's Ready condition: Active, or Invalid naming the field and value.
async fn write_policy_statuses<C: CloudProvider>(
    ctx: &Context<C>,
    snapshot: &Snapshot,
    workloads: &Workloads,
    (policies, labels): (&Policies, &Labels),
    now: Timestamp,
) {
    let mut counts: BTreeMap<PolicyRef, i32> = BTreeMap::new();
    let none = BTreeMap::new();
    for w in workloads.templates.keys() {
        let source = match policies.govern(w, labels.get(w).unwrap_or(&none)) {
            Governance::Governed { source, .. } => source,
            Governance::Held { source, .. } => Some(source),
        };
        if let Some(p) = source {
            *counts.entry(p).or_default() += 1;
        }
    }
    let overlapping = policies.overlapping(
        workloads
            .templates
            .keys()
            .map(|w| (w, labels.get(w).unwrap_or(&none))),
    );
    for (p, problem) in policies.problems() {
        let Some(object) = snapshot.rightsizing_policies.iter().find(|o| {
            o.metadata.namespace.as_deref() == Some(p.namespace.as_str())
                && o.metadata.name.as_deref() == Some(p.name.as_str())
        }) else {
            continue;
        };
        let previous = object
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        let ready = match &problem {
            None => condition_of(
                &previous,
                policy_condition::READY,
                true,
                policy_reason::ACTIVE,
                "the policy is valid and in use".to_string(),
                now,
            ),
            Some(e) => condition_of(
                &previous,
                policy_condition::READY,
                false,
                policy_reason::INVALID,
                format!("{e}: nothing is recommended or applied under this policy"),
                now,
            ),
        };
        let overlap = overlapping_condition(&previous, overlapping.get(&p), now);
        let status = RightsizingPolicyStatus {
            conditions: vec![ready, overlap],
            observed_generation: object.metadata.generation,
            workloads: counts.get(&p).copied().unwrap_or(0),
        };
        if object.status.as_ref() == Some(&status) {
            continue;
        }
        if problem.is_some()
            && object.status.as_ref().map(|s| &s.conditions) != Some(&status.conditions)
        {
            ctx.writer
                .event(
                    &super::reference(object),
                    EventType::Warning,
                    policy_reason::INVALID,
                    "Rightsizing",
                    status.conditions[0].message.clone(),
                )
                .await;
        }
        if let Err(e) = ctx
            .writer
            .apply_rightsizing_policy_status(&p.namespace, &p.name, &status)
            .await
        {
            tracing::warn!(policy = %p, error = %e, "writing the policy status failed");
        }
    }
}
