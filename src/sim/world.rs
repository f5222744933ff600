//! A scenario run on the simulated cluster with the agent in it: the same controllers
//! `tailor run` starts ([`crate::controllers::run_with_usage`]) run against the
//! [`SimCluster`] and the simulated Azure, on one virtual clock (tokio's, paused: time
//! moves as the controllers' and the cluster's timers fire). The scenario plays what the
//! agent does not control: workloads scaling with the day, Jobs starting and ending, the
//! usage of every pod (recorded, and served to right-sizing as Prometheus would), OOM
//! kills, spot reclaims and a capacity outage. Every figure of a run is measured on the
//! cluster, never reported by the agent about itself: pending time from the pods' own
//! creation and start, evictions from the Eviction API calls the cluster served, cost from
//! the cloud's bill.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use serde_json::json;

use super::cluster::{
    Controller, Gone, Happening, Objects, SimCluster, memory_limit, pod_requests,
};
use super::scenario::{Kind, Scenario};
use super::usage::{Recorded, Shared};
use crate::apis::recommendation::condition as recommendation_condition;
use crate::apis::{
    AKSNodeClass, LimitsPolicy, Mode as PolicyMode, NodePool, RightsizingPolicy,
    RightsizingPolicySpec, labels,
};
use crate::catalog::{Catalog, CatalogOptions};
use crate::clock::{Clock, RuntimeClock};
use crate::cloud::metered::MeteredCloud;
use crate::cloud::sim::{SPOT_NOTICE, SimSettings, SimulatedAzure};
use crate::cloud::{CloudProvider, Instance, InstanceState};
use crate::controllers::{self, Context, Names, Settings, State, Writer};
use crate::disruption;
use crate::model::{CapacityType, InstanceType};
use crate::provisioning::Mode;
use crate::state::{PendingPods, Snapshot};
use crate::telemetry::Metrics;
use crate::telemetry::names::{SavingsSource, Usage, When};
use crate::usage::ContainerKey;
use crate::usage::pool::Checkpoint;

const GIB: f64 = 1_073_741_824.0;

/// Seconds before the run's start the cluster is brought up (its pods as deployed placed,
/// their nodes launched and registered by the agent).
const WARM_UP: i64 = 600;

/// The longest the simulated control plane (kubelet, scheduler, node lifecycle) waits
/// without a change in the cluster.
const CONTROL_PLANE_EVERY: Duration = Duration::from_secs(15);

/// The taint on the spot NodePool's nodes; only pods that tolerate it land there.
const SPOT_TAINT: &str = "tailor.sh/spot";

/// The agent's namespace, where the cluster's default RightsizingPolicy lives.
const AGENT_NAMESPACE: &str = "tailor-system";

/// The container name of every simulated workload's one container.
const CONTAINER: &str = "app";

/// How one run behaves.
#[derive(Debug, Clone)]
pub struct RunSettings {
    /// Recommend-only (Tailor provisions; right-sizing and disruption are reported) or
    /// autonomous (act).
    pub mode: Mode,
    /// In autonomous mode, whether right-sizing is applied (false: consolidation only,
    /// with requests as deployed, as users of Karpenter run today).
    pub rightsizing: bool,
    /// Tailor's cost-aware packer for provisioning and replacements; off, Karpenter-style
    /// greedy packing.
    pub cost_aware: bool,
    /// Seconds ahead disruption looks at the requests' daily and weekly cycle: capacity the
    /// history says will be needed within this horizon is kept (0: no look ahead).
    pub forecast_horizon: i64,
    /// Seconds ahead provisioning buys for the requests' expected growth (the same
    /// cycle disruption reads, [`crate::provisioning::headroom`]); 0: only for pods
    /// already pending. Autonomous mode only.
    pub headroom_lead: i64,
    /// Disruption thresholds.
    pub disruption: disruption::Settings,
    /// The cluster's default RightsizingPolicy (its mode is the run's).
    pub policy: RightsizingPolicySpec,
    /// Seconds between right-sizing rounds (`--rightsizing-interval`).
    pub rightsizing_every: i64,
    /// The NodePools' consolidateAfter, seconds.
    pub consolidate_after: i64,
    /// The NodePools' disruption budget (share of nodes at once).
    pub budget_percent: u32,
}

impl RunSettings {
    /// The demo's settings for a mode.
    pub fn for_mode(mode: Mode) -> Self {
        RunSettings {
            mode,
            rightsizing: true,
            cost_aware: true,
            forecast_horizon: disruption::forecast::DEFAULT_HORIZON,
            headroom_lead: crate::provisioning::headroom::DEFAULT_LEAD,
            disruption: disruption::Settings::default(),
            // Requests are sized to the usage history; the teams' memory limits stay
            // where they set them, so a peak above anything seen so far is absorbed by the
            // node rather than killed at a limit cut down to the request. (A node whose
            // pods outgrow its memory still kills, see `usage`.)
            policy: RightsizingPolicySpec {
                limits: LimitsPolicy::Keep,
                ..RightsizingPolicySpec::default()
            },
            rightsizing_every: 6 * 3600,
            consolidate_after: 1800,
            budget_percent: 10,
        }
    }

    /// What users run today: Karpenter-style greedy packing and consolidation (any saving
    /// at all, no cost per eviction, no look ahead) on the same NodePools, with requests
    /// as deployed (recommendations are reported, never applied).
    pub fn consolidation_only() -> Self {
        RunSettings {
            rightsizing: false,
            cost_aware: false,
            forecast_horizon: 0,
            headroom_lead: 0,
            disruption: disruption::Settings::karpenter(),
            ..RunSettings::for_mode(Mode::Autonomous)
        }
    }

    /// Whether right-sizing recommendations are applied.
    fn applies_rightsizing(&self) -> bool {
        self.mode == Mode::Autonomous && self.rightsizing
    }

    /// The run's name in the report: `recommend-only`, `consolidation-only` or
    /// `autonomous`.
    pub fn name(&self) -> &'static str {
        match (self.mode, self.rightsizing) {
            (Mode::RecommendOnly, _) => "recommend-only",
            (Mode::Autonomous, false) => "consolidation-only",
            (Mode::Autonomous, true) => "autonomous",
        }
    }

    /// The agent's settings for this run, as `tailor run`'s flags would set them.
    fn agent(&self) -> Settings {
        Settings {
            // NodePools are provisioned in every run (the nodes come from somewhere);
            // recommend-only marks its pools' disruption recommend-only.
            mode: Mode::Autonomous,
            cluster_name: "tailor-demo".to_string(),
            rightsizing_interval: Duration::from_secs(self.rightsizing_every.max(1) as u64),
            namespace: AGENT_NAMESPACE.to_string(),
            webhook: true,
            headroom_lead: if self.mode == Mode::Autonomous {
                self.headroom_lead
            } else {
                0
            },
            cost_aware: self.cost_aware,
            disruption: self.disruption.clone(),
            forecast_horizon: self.forecast_horizon,
            ..Settings::default()
        }
    }
}

/// The cluster once an hour.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sample {
    /// Unix seconds.
    pub t: i64,
    /// USD per hour of the VMs.
    pub hourly_cost: f64,
    /// Nodes per VM size.
    pub nodes_by_type: BTreeMap<String, usize>,
    /// Requested CPU of scheduled pods, cores.
    pub cpu_requested: f64,
    /// CPU used, cores.
    pub cpu_used: f64,
    /// Requested memory of scheduled pods, GiB.
    pub memory_requested: f64,
    /// Memory used, GiB.
    pub memory_used: f64,
    /// Recommendations applied so far.
    pub recommendations_applied: usize,
    /// Pending pods.
    pub pending: usize,
    /// Pods evicted so far.
    pub evicted: usize,
    /// OOM kills so far.
    pub oom_kills: u64,
    /// Nodes launched so far (the bring-up before the start aside).
    pub launches: u64,
}

/// What one run did.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunSummary {
    /// Nodes at the start (after the first hour) and the end.
    pub nodes_start: usize,
    /// Nodes at the end.
    pub nodes_end: usize,
    /// USD per hour after the first hour.
    pub hourly_cost_start: f64,
    /// USD per hour at the end.
    pub hourly_cost_end: f64,
    /// Total spent over the run, USD.
    pub total_cost: f64,
    /// Requested CPU at the end, cores.
    pub cpu_requested_end: f64,
    /// Requested memory at the end, GiB.
    pub memory_requested_end: f64,
    /// USD per hour the requests at the end are worth (requested cores and GiB priced at
    /// the catalog's median per-core and per-GiB rates).
    pub requests_value_per_hour: f64,
    /// Recommendations applied over the run (autonomous: a workload's pods taking a new
    /// size), or actionable and not applied at the end (recommend-only).
    pub recommendations: usize,
    /// Disruption decisions carried out (autonomous), or reported at the end
    /// (recommend-only: the agent's `WouldDisrupt` Events of its last reports).
    pub decisions: usize,
    /// Decisions carried out, by method (`empty`, `single`, `multi`, `drift`,
    /// `expiration`).
    pub decisions_by_method: BTreeMap<String, usize>,
    /// Events the agent published over the run, by reason (`WouldDisrupt`,
    /// `WouldProvision`, `EvictedToResize`, ...): what `kubectl get events` shows of it.
    pub events_by_reason: BTreeMap<String, usize>,
    /// USD per hour saved by those decisions, each as it was taken (the nodes removed less
    /// their replacements, at the cloud's prices; for recommend-only, as reported). Not
    /// additive over a run: the night's consolidation removes nodes the day's growth buys
    /// again.
    pub consolidation_savings_per_hour: f64,
    /// USD the decisions carried out saved over the run: a decision's saving counts from
    /// when it is done until provisioning buys that much capacity again (autonomous;
    /// zero in recommend-only).
    pub consolidation_realised_savings: f64,
    /// Pods evicted by Tailor's choice: to disrupt a node, or to come back right-sized
    /// (drains before a spot reclaim are counted as spot interruptions, and a DaemonSet's
    /// pod, which goes with its node rather than moving, is not counted; both are in
    /// `evictions_by_cause`).
    pub pods_evicted: usize,
    /// Every eviction the cluster served, by why: `disruption` and `rightsizing` (the
    /// ones counted in `pods_evicted`), `spot-reclaim` (drained before Azure reclaims the
    /// VM) and `daemonset` (a DaemonSet's pod on a node being drained).
    pub evictions_by_cause: BTreeMap<String, usize>,
    /// Running pods resized in place (no restart) to their recommendation.
    pub resized_in_place: usize,
    /// OOM kills.
    pub oom_kills: u64,
    /// Median seconds from pending to running.
    pub provisioning_p50_seconds: f64,
    /// 99th percentile seconds from pending to running.
    pub provisioning_p99_seconds: f64,
    /// Pod-hours spent pending.
    pub pending_pod_hours: f64,
    /// Pod-hours spent pending, by why the pod was made: `scale-up` (a new replica),
    /// `job` (a Job's run started), `evicted` (replacing a pod disruption evicted),
    /// `resized` (replacing a pod evicted to be resized), `spot-interrupted` (replacing a
    /// pod drained before a spot reclaim), `node-lost` (its node went away without a
    /// drain) and `replaced` (a drain's grace period passed, or a rollout).
    pub pending_pod_hours_by_cause: BTreeMap<String, f64>,
    /// Nodes launched over the run (the bring-up before the start aside).
    pub launches: u64,
    /// Nodes launched in the bring-up before the start: the running cluster the run
    /// begins with.
    pub launches_before_start: u64,
    /// NodeClaims the agent created over the run, by why: `pending-pods` (pods the
    /// scheduler could not place), `headroom` (bought ahead of the expected growth),
    /// `replacement` (a disruption's new node). A claim whose launch failed for lack of
    /// capacity is made again, so these may exceed the launches.
    pub claims_by_origin: BTreeMap<String, usize>,
    /// Spot VMs Azure announced it would reclaim.
    pub spot_interruptions: u64,
}

/// What one workload went through in a run: its requests at the start and the end, the
/// last recommendation's reasons, and what it suffered.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadOutcome {
    /// `namespace/name`.
    pub workload: String,
    /// Deployment, StatefulSet, DaemonSet or Job.
    pub kind: String,
    /// CPU request at the start and the end, millicores.
    pub cpu: (i64, i64),
    /// Memory request at the start and the end, bytes.
    pub memory: (i64, i64),
    /// The reasons of its Recommendation at the end (empty without one).
    pub reasons: Vec<String>,
    /// OOM kills of its pods.
    pub oom_kills: u64,
    /// Its pods evicted by Tailor's choice.
    pub evictions: usize,
}

/// One run's result.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunResult {
    /// `recommend-only`, `consolidation-only` or `autonomous`.
    pub mode: String,
    /// Hourly samples.
    pub samples: Vec<Sample>,
    /// Per workload, in the scenario's order.
    pub workloads: Vec<WorkloadOutcome>,
    /// Totals.
    pub summary: RunSummary,
    /// Every create call the simulated cloud received, in order (not part of the demo's
    /// output: what tests check the provider's calls against).
    #[serde(skip)]
    pub create_calls: Vec<crate::cloud::sim::CreateCall>,
}

/// Builds an API object from its JSON form. Every call passes a literal of the type's own
/// shape, built in this file (the demo tests build each one), so it cannot fail.
fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).expect("a literal of the API type's own shape")
}

/// A NodePool of general-purpose D and E sizes (v5/v6, amd64) of one capacity type.
fn node_pool(name: &str, capacity_type: &str, weight: i32, settings: &RunSettings) -> NodePool {
    let mut annotations = serde_json::Map::new();
    if settings.mode == Mode::RecommendOnly {
        // Tailor provisions the pool; its consolidation is reported only.
        annotations.insert(
            labels::DISRUPTION_MODE_ANNOTATION.to_string(),
            json!("recommend"),
        );
    }
    let taints = if capacity_type == labels::CAPACITY_TYPE_SPOT {
        json!([{"key": SPOT_TAINT, "value": "true", "effect": "NoSchedule"}])
    } else {
        json!([])
    };
    object(json!({
        "apiVersion": "tailor.sh/v1alpha1",
        "kind": "NodePool",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "weight": weight,
            "template": {"spec": {
                "nodeClassRef": {"group": "tailor.sh", "kind": "AKSNodeClass", "name": "default"},
                "taints": taints,
                "requirements": [
                    {"key": labels::CAPACITY_TYPE, "operator": "In", "values": [capacity_type]},
                    {"key": labels::OS, "operator": "In", "values": [labels::OS_LINUX]},
                    {"key": labels::SKU_FAMILY, "operator": "In", "values": ["D", "E"]},
                    {"key": labels::SKU_VERSION, "operator": "In", "values": ["5", "6"]},
                    {"key": labels::ARCH, "operator": "In", "values": [labels::ARCH_AMD64]},
                ],
            }},
            "disruption": {
                "consolidationPolicy": "WhenEmptyOrUnderutilized",
                "consolidateAfter": format!("{}s", settings.consolidate_after),
                "budgets": [{"nodes": format!("{}%", settings.budget_percent)}],
            },
        },
    }))
}

fn node_class() -> AKSNodeClass {
    object(json!({
        "apiVersion": "tailor.sh/v1alpha1",
        "kind": "AKSNodeClass",
        "metadata": {"name": "default"},
        "spec": {},
    }))
}

/// The cluster's default RightsizingPolicy: the run's policy, applied (`Auto`, resized in
/// place) in autonomous mode, else reported.
fn policy(settings: &RunSettings) -> RightsizingPolicy {
    let mut spec = settings.policy.clone();
    spec.mode = if settings.applies_rightsizing() {
        PolicyMode::Auto
    } else {
        PolicyMode::Recommend
    };
    RightsizingPolicy {
        metadata: kube::api::ObjectMeta {
            name: Some("default".to_string()),
            namespace: Some(AGENT_NAMESPACE.to_string()),
            ..kube::api::ObjectMeta::default()
        },
        spec,
        status: None,
    }
}

/// The pod template of a scenario workload: one container asking its requests as the team
/// set them, its memory limit at the team's value; batch Jobs tolerate the spot taint.
fn template(w: &super::scenario::Workload) -> serde_json::Value {
    let tolerations = match w.kind {
        Kind::Job => json!([{"key": SPOT_TAINT, "operator": "Exists", "effect": "NoSchedule"}]),
        // Node agents run on every pool's nodes.
        Kind::DaemonSet => json!([{"key": SPOT_TAINT, "operator": "Exists"}]),
        _ => json!([]),
    };
    json!({
        "metadata": {"labels": {"app": w.name}},
        "spec": {
            "restartPolicy": if w.kind == Kind::Job { "Never" } else { "Always" },
            "tolerations": tolerations,
            "containers": [{
                "name": CONTAINER,
                "image": format!("registry.example/{}:1", w.name),
                "resources": {
                    "requests": {"cpu": format!("{}m", w.cpu_request), "memory": w.memory_request.to_string()},
                    "limits": {"memory": w.memory_limit.to_string()},
                },
            }],
        },
    })
}

/// Adds a scenario workload's objects to the cluster (shown to the agent) and its
/// controller; returns the workload's index.
fn add_workload(o: &mut Objects, w: &super::scenario::Workload) -> usize {
    let t = template(w);
    let meta =
        |name: &str| json!({"name": name, "namespace": w.namespace, "labels": {"app": w.name}});
    let selector = json!({"matchLabels": {"app": w.name}});
    let pod: Pod = object(json!({"metadata": t["metadata"], "spec": t["spec"]}));
    let controller = match w.kind {
        Kind::Deployment => {
            let d: Deployment = o.show(object(json!({
                "metadata": meta(&w.name),
                "spec": {"replicas": w.replicas, "selector": selector, "template": t},
            })));
            let rs_name = format!("{}-5c4d9b8f7", w.name);
            let mut rs_meta = meta(&rs_name);
            rs_meta["ownerReferences"] = json!([{
                "apiVersion": "apps/v1", "kind": "Deployment", "name": w.name,
                "uid": d.uid().unwrap_or_default(), "controller": true,
            }]);
            let rs: ReplicaSet = o.show(object(json!({
                "metadata": rs_meta,
                "spec": {"replicas": w.replicas, "selector": selector, "template": t},
            })));
            Controller::new("ReplicaSet", &rs.metadata, pod, 0)
        }
        Kind::StatefulSet => {
            let s: StatefulSet = o.show(object(json!({
                "metadata": meta(&w.name),
                "spec": {"replicas": w.replicas, "selector": selector, "serviceName": w.name, "template": t},
            })));
            Controller::new("StatefulSet", &s.metadata, pod, 0)
        }
        Kind::Job => {
            let j: Job = o.show(object(json!({
                "metadata": meta(&w.name),
                "spec": {"parallelism": w.replicas, "template": t},
            })));
            Controller::new("Job", &j.metadata, pod, 0)
        }
        Kind::DaemonSet => {
            let d: DaemonSet = o.show(object(json!({
                "metadata": meta(&w.name),
                "spec": {"selector": selector, "template": t},
            })));
            Controller::new("DaemonSet", &d.metadata, pod, 0)
        }
    };
    o.add_controller(controller)
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let i = ((values.len() as f64 - 1.0) * p).round() as usize;
    values[i.min(values.len() - 1)]
}

/// A stable hash of a name, for the scenario's per-pod and per-VM variations.
fn hash(name: &str) -> u64 {
    super::fnv1a(name.bytes())
}

/// A pod's replicas differ a little from each other: its usage is the trace's times this.
fn jitter(pod: &str) -> f64 {
    0.9 + ((hash(pod) % 1000) as f64) / 5000.0
}

/// The simulated control plane's loop: VMs that came up join as Nodes (a quarter of spot
/// VMs are reclaimed 1-11 hours later), Nodes whose VM is gone are removed, Azure's
/// notices reach the Nodes, and the kubelet and the scheduler act on what changed. It runs
/// whenever the cluster changes, when the next VM comes up or notice is due, and at least
/// every [`CONTROL_PLANE_EVERY`].
async fn control_plane(
    cluster: SimCluster,
    cloud: SimulatedAzure,
    state: State,
    sizes: BTreeMap<String, InstanceType>,
    launch_latency: i64,
    clock: Arc<dyn Clock>,
) {
    let mut notices: Vec<(i64, String)> = Vec::new();
    loop {
        let seen = state.generation();
        let now = clock.now().as_second();
        let instances = cloud.list().await.unwrap_or_default();
        let announced = cloud.interruptions().await.unwrap_or_default();
        {
            let mut o = cluster.lock();
            let alive: BTreeSet<&str> = instances.iter().map(|i| i.provider_id.as_str()).collect();
            let lost: Vec<String> = o
                .nodes
                .values()
                .filter_map(|n| n.spec.as_ref()?.provider_id.clone())
                .filter(|p| !alive.contains(p.as_str()))
                .collect();
            for p in lost {
                o.vm_gone(&p);
            }
            for i in instances
                .iter()
                .filter(|i| i.state == InstanceState::Running)
            {
                let Some(size) = sizes.get(&i.instance_type) else {
                    continue;
                };
                if o.nodes.contains_key(&i.claim) {
                    continue;
                }
                o.join(i, size);
                if i.capacity_type == CapacityType::Spot {
                    let h = hash(&i.claim);
                    if h.is_multiple_of(4) {
                        let at = now + 3600 + (h / 4 % 36_000) as i64;
                        if let Ok(t) = Timestamp::from_second(at) {
                            cloud.schedule_spot_interruption(&i.provider_id, t);
                            notices.push((at, i.provider_id.clone()));
                        }
                    }
                }
            }
            for n in &announced {
                o.preemption_scheduled(&n.provider_id, n.deadline);
            }
            o.retry_deferred_resizes();
            o.roll();
            o.schedule();
        }
        // The next VM to come up, or the next notice or reclaim.
        notices.retain(|(at, _)| *at + SPOT_NOTICE.as_secs() >= now);
        let next = instances
            .iter()
            .filter(|i| i.state == InstanceState::Launching)
            .map(|i| i.created_at.as_second() + launch_latency)
            .chain(
                notices
                    .iter()
                    .flat_map(|(at, _)| [*at, *at + SPOT_NOTICE.as_secs()]),
            )
            .filter(|t| *t > now)
            .min();
        let wait = next.map_or(CONTROL_PLANE_EVERY, |t| {
            Duration::from_secs((t - now) as u64).min(CONTROL_PLANE_EVERY)
        });
        controllers::wait_for_change_since(&state, seen, wait).await;
    }
}

/// What the run measures, as the cluster shows it.
struct Figures {
    /// When the measured run starts (the bring-up before it counts in nothing).
    start: i64,
    /// Nodes launched in the bring-up before the start.
    launched_before: u64,
    /// Pods not started yet: since when, and why they were made.
    pending: BTreeMap<String, (i64, &'static str)>,
    latencies: Vec<f64>,
    pending_seconds: f64,
    pending_by_cause: BTreeMap<&'static str, f64>,
    evictions: BTreeMap<&'static str, usize>,
    evicted_by_workload: Vec<usize>,
    oom_by_workload: Vec<u64>,
    ooms: u64,
    /// Per workload, the requests its newest pods take (cpu, memory).
    sizes: Vec<(i64, i64)>,
    applied: usize,
    /// Disruption commands under way: their NodeClaims gone so far, and those claims' USD
    /// per hour.
    commands: BTreeMap<String, (BTreeSet<String>, f64)>,
    /// The sizes on sale, by name, to price NodeClaims.
    sizes_by_name: BTreeMap<String, InstanceType>,
    done: Vec<f64>,
    /// Decisions carried out, by method.
    methods: BTreeMap<String, usize>,
    /// Running pods the kubelet resized in place.
    resized_in_place: usize,
    /// NodeClaims the agent created, by why.
    claims_by_origin: BTreeMap<&'static str, usize>,
    credit_per_hour: f64,
    realised: f64,
    /// NodeClaims whose instance was already counted, and whether provisioning bought it.
    instances_seen: BTreeSet<String>,
    spot_interruptions: u64,
}

impl Figures {
    fn cause(replaces: Option<Gone>, job: bool) -> &'static str {
        match replaces {
            None if job => "job",
            None => "scale-up",
            Some(Gone::EvictedByDisruption) => "evicted",
            Some(Gone::EvictedToResize) => "resized",
            Some(Gone::EvictedBeforeReclaim) => "spot-interrupted",
            Some(Gone::NodeLost) => "node-lost",
            Some(Gone::Deleted | Gone::ScaledDown) => "replaced",
        }
    }

    fn count_pending(&mut self, since: i64, until: i64, cause: &'static str) {
        let seconds = (until - since.max(self.start)).max(0) as f64;
        self.pending_seconds += seconds;
        *self.pending_by_cause.entry(cause).or_default() += seconds;
    }

    /// Takes in what the cluster did.
    fn observe(
        &mut self,
        happenings: Vec<(i64, Happening)>,
        o: &Objects,
        scenario: &Scenario,
        metrics: Option<&Metrics>,
        applies: bool,
    ) {
        for (at, h) in happenings {
            match h {
                Happening::PodCreated {
                    pod,
                    workload,
                    replaces,
                } => {
                    let job = scenario.workloads[workload].kind == Kind::Job;
                    self.pending
                        .insert(pod.clone(), (at, Self::cause(replaces, job)));
                    self.size_seen(workload, o.pods.get(&pod), applies);
                }
                Happening::PodStarted { pod, node } => {
                    if let Some((since, cause)) = self.pending.remove(&pod) {
                        self.count_pending(since, at, cause);
                        if since >= self.start
                            && o.workload_of(&pod)
                                .is_some_and(|w| scenario.workloads[w].kind != Kind::DaemonSet)
                        {
                            self.latencies.push((at - since) as f64);
                            if let Some(m) = metrics {
                                let pool = o
                                    .nodes
                                    .get(&node)
                                    .and_then(|n| n.labels().get(labels::NODE_POOL).cloned())
                                    .unwrap_or_default();
                                m.observe_pod_startup(&pool, (at - since) as f64);
                            }
                        }
                    }
                }
                Happening::PodGone { pod, workload, why } => {
                    if let Some((since, cause)) = self.pending.remove(&pod) {
                        self.count_pending(since, at, cause);
                    }
                    if at < self.start {
                        continue;
                    }
                    // A DaemonSet's pod evicted from a node going away is not moved
                    // anywhere: it goes with its node, and no pod waits for it.
                    let daemon = scenario.workloads[workload].kind == Kind::DaemonSet;
                    let cause = match why {
                        Gone::EvictedByDisruption | Gone::EvictedBeforeReclaim if daemon => {
                            "daemonset"
                        }
                        Gone::EvictedByDisruption => "disruption",
                        Gone::EvictedToResize => "rightsizing",
                        Gone::EvictedBeforeReclaim => "spot-reclaim",
                        _ => continue,
                    };
                    *self.evictions.entry(cause).or_default() += 1;
                    if matches!(cause, "disruption" | "rightsizing") {
                        self.evicted_by_workload[workload] += 1;
                    }
                }
                Happening::Resized { pod } => {
                    if at >= self.start {
                        self.resized_in_place += 1;
                    }
                    if let Some(w) = o.workload_of(&pod) {
                        self.size_seen(w, o.pods.get(&pod), applies);
                    }
                }
                Happening::ClaimCreated { claim } => {
                    if at < self.start {
                        continue;
                    }
                    let a = claim.annotations();
                    let why = if a.contains_key(crate::controllers::disruption::REPLACES_ANNOTATION)
                    {
                        "replacement"
                    } else if a.contains_key(labels::HEADROOM_ANNOTATION) {
                        "headroom"
                    } else {
                        "pending-pods"
                    };
                    *self.claims_by_origin.entry(why).or_default() += 1;
                }
                Happening::Preempted { .. } => {
                    if at >= self.start {
                        self.spot_interruptions += 1;
                    }
                }
                Happening::ClaimGone { claim } => {
                    let name = claim.name_any();
                    let Some(id) = claim
                        .annotations()
                        .get(crate::controllers::disruption::COMMAND_ANNOTATION)
                        .cloned()
                    else {
                        continue;
                    };
                    let Some(command) = o.commands.get(&id) else {
                        continue;
                    };
                    let price = self.price_of(&claim);
                    let replaced: f64 = command
                        .replacements
                        .iter()
                        .filter_map(|r| o.node_claims.get(r))
                        .map(|r| self.price_of(r))
                        .sum();
                    let entry = self.commands.entry(id.clone()).or_default();
                    entry.0.insert(name);
                    entry.1 += price;
                    if entry.0.is_superset(&command.old) {
                        let saving = entry.1 - replaced;
                        self.commands.remove(&id);
                        if at >= self.start {
                            let method = claim
                                .annotations()
                                .get(labels::TERMINATION_REASON_ANNOTATION)
                                .cloned()
                                .unwrap_or_default();
                            *self.methods.entry(method).or_default() += 1;
                            self.done.push(saving);
                            self.credit_per_hour += saving.max(0.0);
                        }
                    }
                }
            }
        }
    }

    /// What a NodeClaim's VM costs an hour, from the size, zone and capacity type its
    /// launch labelled it with.
    fn price_of(&self, claim: &crate::apis::NodeClaim) -> f64 {
        let l = claim.labels();
        let (Some(t), Some(zone), Some(ct)) = (
            l.get(labels::INSTANCE_TYPE),
            l.get(labels::ZONE),
            l.get(labels::CAPACITY_TYPE),
        ) else {
            return 0.0;
        };
        self.sizes_by_name
            .get(t)
            .and_then(|t| {
                t.offerings
                    .iter()
                    .find(|o| o.zone == *zone && o.capacity_type.as_str() == ct)
            })
            .map_or(0.0, |o| o.price_per_hour)
    }

    /// Pods evicted by Tailor's choice: to disrupt nodes, or to come back right-sized.
    fn tailors_evictions(&self) -> usize {
        ["disruption", "rightsizing"]
            .iter()
            .filter_map(|c| self.evictions.get(c))
            .sum()
    }

    /// A pod of workload `w` took a size: a new size applied, when it differs.
    fn size_seen(&mut self, w: usize, pod: Option<&Pod>, applies: bool) {
        let Some(pod) = pod else { return };
        let size = pod_requests(pod);
        if size != self.sizes[w] {
            self.sizes[w] = size;
            if applies {
                self.applied += 1;
            }
        }
    }
}

/// The simulated cluster, cloud and clock the agent's controllers run against.
struct World {
    cluster: SimCluster,
    cloud: SimulatedAzure,
    state: State,
    clock: Arc<dyn Clock>,
    launch_latency: i64,
}

impl World {
    /// Starts the agent's controllers (what `tailor run` starts, as leader) and the
    /// simulated control plane's loop on the current runtime. Dropping the returned sender
    /// ends the agent's leadership.
    #[allow(clippy::too_many_arguments)]
    fn start_agent(
        &self,
        catalog: Catalog,
        region: &str,
        settings: Settings,
        metrics: Metrics,
        usage: Shared,
        seed: u64,
        instance_types: &[InstanceType],
    ) -> (tokio::task::JoinSet<()>, tokio::sync::watch::Sender<bool>) {
        let (leader_tx, leader) = tokio::sync::watch::channel(true);
        let ctx = Arc::new(Context {
            state: self.state.clone(),
            writer: Writer::with_api(Arc::new(self.cluster.clone()), leader),
            cloud: MeteredCloud::new(self.cloud.clone(), Some(metrics.clone())),
            metrics,
            clock: self.clock.clone(),
            catalog: Arc::new(std::sync::RwLock::new(catalog)),
            catalog_options: CatalogOptions::for_region(region),
            settings,
            // The run starts with its cluster, not a day of its cycle: until a day is
            // known, the most it requested over the last horizon is kept.
            demand: std::sync::Mutex::new(
                disruption::forecast::DemandHistory::holding_the_peak_until_a_day(),
            ),
            names: Names::seeded(seed),
            rightsizing: true,
        });
        let mut tasks = tokio::task::JoinSet::new();
        controllers::run_with_usage(ctx, usage, &mut tasks);
        let sizes: BTreeMap<String, InstanceType> = instance_types
            .iter()
            .map(|t| (t.name.clone(), t.clone()))
            .collect();
        tasks.spawn(control_plane(
            self.cluster.clone(),
            self.cloud.clone(),
            self.state.clone(),
            sizes,
            self.launch_latency,
            self.clock.clone(),
        ));
        (tasks, leader_tx)
    }
}

/// The agent's controllers against a simulated cluster and Azure on the current tokio
/// runtime, for tests of what the controllers decide: start it on a paused runtime
/// (`#[tokio::test(start_paused = true)]`) and virtual time passes as fast as the
/// controllers' and the cluster's timers fire. The cluster plays the API server, the
/// workload controllers, kube-scheduler ([`super::binder`]) and the kubelet, as in the demo;
/// its objects and the cloud's record of calls are what a test asserts on.
pub struct Harness {
    /// The cluster's objects.
    pub cluster: SimCluster,
    /// The simulated Azure, with its record of create and delete calls.
    pub cloud: SimulatedAzure,
    /// The virtual clock.
    pub clock: Arc<dyn Clock>,
    deployments: BTreeMap<String, usize>,
    _tasks: tokio::task::JoinSet<()>,
    _leader: tokio::sync::watch::Sender<bool>,
}

impl Harness {
    /// A cluster in eastus holding `objects` (multi-document YAML of AKSNodeClasses,
    /// NodePools, PodDisruptionBudgets, RightsizingPolicies and Deployments, whose pods
    /// the workload controller then makes), with the agent started on it with `settings`.
    /// An error names a document the harness cannot hold.
    pub fn start(objects: &str, settings: Settings) -> Result<Harness, String> {
        let catalog = Catalog::builtin().map_err(|e| format!("built-in catalog: {e}"))?;
        let region = "eastus";
        let instance_types = catalog
            .instance_types(&CatalogOptions::for_region(region))
            .map_err(|e| format!("eastus instance types: {e}"))?;
        // 2026-01-01T00:00:00Z.
        let clock: Arc<dyn Clock> = Arc::new(RuntimeClock::starting_at(
            Timestamp::from_second(1_767_225_600).unwrap_or(Timestamp::UNIX_EPOCH),
        ));
        let sim_settings = SimSettings {
            region: region.to_string(),
            ..SimSettings::default()
        };
        let launch_latency = sim_settings.launch_latency.as_secs();
        let cloud = SimulatedAzure::new(clock.clone(), instance_types.clone(), sim_settings);
        let (state, feed) = State::in_memory();
        let cluster = SimCluster::new(feed, clock.clone(), 7);
        // Read as `tailor simulate` reads a snapshot: the same validation and messages.
        let snapshot = Snapshot::from_yaml_with("objects", objects, PendingPods::Skip)
            .map_err(|e| e.to_string())?;
        if let Some(w) = snapshot.warnings.first() {
            return Err(w.clone());
        }
        let unheld = [
            ("Pod", snapshot.pods.len()),
            ("Node", snapshot.nodes.len()),
            ("DaemonSet", snapshot.daemon_sets.len()),
            ("StatefulSet", snapshot.stateful_sets.len()),
            ("ReplicaSet", snapshot.replica_sets.len()),
            ("Job", snapshot.jobs.len()),
            (
                "PersistentVolumeClaim",
                snapshot.persistent_volume_claims.len(),
            ),
            ("PersistentVolume", snapshot.persistent_volumes.len()),
            ("StorageClass", snapshot.storage_classes.len()),
            (
                "HorizontalPodAutoscaler",
                snapshot.horizontal_pod_autoscalers.len(),
            ),
            ("NodeClaim", snapshot.node_claims.len()),
            ("Recommendation", snapshot.recommendations.len()),
        ];
        if let Some((kind, _)) = unheld.iter().find(|(_, n)| *n > 0) {
            return Err(format!(
                "the objects hold a {kind}, which the harness does not hold (it holds \
                 AKSNodeClasses, NodePools, PodDisruptionBudgets, RightsizingPolicies and \
                 Deployments)"
            ));
        }
        let mut deployments = BTreeMap::new();
        {
            let mut o = cluster.lock();
            for class in snapshot.node_classes {
                o.put(class);
            }
            for pool in snapshot.node_pools {
                o.put(pool);
            }
            for pdb in snapshot.pod_disruption_budgets {
                o.put(pdb);
            }
            for policy in snapshot.rightsizing_policies {
                o.put(policy);
            }
            for d in snapshot.deployments {
                let name = d.name_any();
                let w = add_deployment(&mut o, d)?;
                deployments.insert(name, w);
            }
            o.synced();
        }
        let world = World {
            cluster: cluster.clone(),
            cloud: cloud.clone(),
            state,
            clock: clock.clone(),
            launch_latency,
        };
        let metrics = Metrics::new(&opentelemetry::global::meter("tailor-harness"));
        let (tasks, leader) = world.start_agent(
            catalog,
            region,
            settings,
            metrics,
            Shared::new(Recorded::new(60)),
            7,
            &instance_types,
        );
        Ok(Harness {
            cluster,
            cloud,
            clock,
            deployments,
            _tasks: tasks,
            _leader: leader,
        })
    }

    /// Sets a Deployment's replicas; its controller makes or removes pods at once.
    pub fn scale(&self, deployment: &str, replicas: u32) -> Result<(), String> {
        let w = *self
            .deployments
            .get(deployment)
            .ok_or_else(|| format!("no Deployment {deployment:?}"))?;
        self.cluster.lock().scale(w, replicas);
        Ok(())
    }

    /// Waits, in virtual time, until `probe` finds what it looks for in the cluster (checked
    /// every virtual second), for at most `limit`; an error says what was not seen.
    pub async fn until<T>(
        &self,
        limit: Duration,
        what: &str,
        mut probe: impl FnMut(&Objects) -> Option<T>,
    ) -> Result<T, String> {
        let start = self.clock.now();
        loop {
            if let Some(found) = probe(&self.cluster.lock()) {
                return Ok(found);
            }
            let waited = self.clock.now().duration_since(start);
            if waited.as_secs() as u64 >= limit.as_secs() {
                return Err(format!(
                    "{what}: not seen within {} s (virtual)",
                    limit.as_secs()
                ));
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// Adds a Deployment (shown to the agent), its ReplicaSet and the ReplicaSet's controller,
/// scaled to the Deployment's replicas; returns the controller's index.
fn add_deployment(o: &mut Objects, d: Deployment) -> Result<usize, String> {
    let name = d.name_any();
    let spec = d
        .spec
        .clone()
        .ok_or_else(|| format!("Deployment {name}: no spec"))?;
    let replicas = u32::try_from(spec.replicas.unwrap_or(1)).map_err(|_| {
        format!(
            "Deployment {name}: spec.replicas {:?} is negative",
            spec.replicas
        )
    })?;
    let d = o.show(d);
    let template = spec.template.clone();
    let rs: ReplicaSet = o.show(ReplicaSet {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("{name}-5c4d9b8f7")),
            namespace: Some(d.namespace().unwrap_or_else(|| "default".to_string())),
            labels: template.metadata.as_ref().and_then(|m| m.labels.clone()),
            owner_references: Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    api_version: "apps/v1".to_string(),
                    kind: "Deployment".to_string(),
                    name: name.clone(),
                    uid: d.uid().unwrap_or_default(),
                    controller: Some(true),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::apps::v1::ReplicaSetSpec {
            replicas: spec.replicas,
            selector: spec.selector,
            template: Some(template.clone()),
            ..Default::default()
        }),
        status: None,
    });
    let pod = Pod {
        metadata: template.metadata.unwrap_or_default(),
        spec: template.spec,
        status: None,
    };
    let w = o.add_controller(Controller::new("ReplicaSet", &rs.metadata, pod, 0));
    o.scale(w, replicas);
    Ok(w)
}

/// Runs `scenario` in one mode on a paused runtime of its own (its clock is virtual);
/// `progress` is told the share done (0..1) now and then. With `metrics`, the agent's
/// controllers and the cluster record into them as they go (what `/metrics` serves).
pub fn run(
    scenario: &Scenario,
    settings: &RunSettings,
    instance_types: Vec<InstanceType>,
    metrics: Option<&Metrics>,
    progress: &mut dyn FnMut(f64),
) -> RunResult {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build();
    match runtime {
        Ok(r) => r.block_on(run_paused(
            scenario,
            settings,
            instance_types,
            metrics,
            progress,
        )),
        // A current-thread runtime without I/O has nothing that can fail to start; were it
        // to, the run is empty rather than the demo aborting.
        Err(_) => empty_run(settings),
    }
}

fn empty_run(settings: &RunSettings) -> RunResult {
    RunResult {
        mode: settings.name().to_string(),
        samples: Vec::new(),
        workloads: Vec::new(),
        summary: RunSummary::default(),
        create_calls: Vec::new(),
    }
}

async fn run_paused(
    scenario: &Scenario,
    settings: &RunSettings,
    instance_types: Vec<InstanceType>,
    metrics: Option<&Metrics>,
    progress: &mut dyn FnMut(f64),
) -> RunResult {
    let origin = Timestamp::from_second(scenario.start - WARM_UP).unwrap_or(Timestamp::UNIX_EPOCH);
    let clock: Arc<dyn Clock> = Arc::new(RuntimeClock::starting_at(origin));
    let sim_settings = SimSettings {
        region: scenario.region.clone(),
        ..SimSettings::default()
    };
    let launch_latency = sim_settings.launch_latency.as_secs();
    let cloud = SimulatedAzure::new(clock.clone(), instance_types.clone(), sim_settings);
    let (state, feed) = State::in_memory();
    let cluster = SimCluster::new(feed, clock.clone(), scenario.start as u64);
    let workloads: Vec<usize> = {
        let mut o = cluster.lock();
        o.put(node_class());
        o.put(node_pool("spot", labels::CAPACITY_TYPE_SPOT, 10, settings));
        o.put(node_pool(
            "default",
            labels::CAPACITY_TYPE_ON_DEMAND,
            0,
            settings,
        ));
        o.put(policy(settings));
        let indices = scenario
            .workloads
            .iter()
            .map(|w| add_workload(&mut o, w))
            .collect();
        o.serve_webhook(
            crate::webhook::Stores::of(&state, AGENT_NAMESPACE),
            crate::webhook::Settings {
                global_mode: PolicyMode::Auto,
                agent_namespace: AGENT_NAMESPACE.to_string(),
            },
        );
        o.synced();
        indices
    };
    let usage = Shared::new(Recorded::new(scenario.step));
    let private = Metrics::new(&opentelemetry::global::meter("tailor-sim"));
    let recorded = metrics.cloned().unwrap_or(private);
    // The built-in catalog the instance types come from; it is embedded in the binary and
    // its tests read it, so it loads.
    let Ok(catalog) = Catalog::builtin() else {
        return empty_run(settings);
    };
    let world = World {
        cluster: cluster.clone(),
        cloud: cloud.clone(),
        state: state.clone(),
        clock: clock.clone(),
        launch_latency,
    };
    let (mut tasks, leader_tx) = world.start_agent(
        catalog,
        &scenario.region,
        settings.agent(),
        recorded.clone(),
        usage.clone(),
        scenario.start as u64 ^ 0x007a_110a,
        &instance_types,
    );
    if let Some(m) = metrics {
        // Per-namespace counters start at zero: a namespace without OOM kills shows 0.
        for w in &scenario.workloads {
            m.oom_kills(&w.namespace, 0);
            m.recommendation_applied_by(&w.namespace, 0);
        }
    }
    let mut figures = Figures {
        start: scenario.start,
        pending: BTreeMap::new(),
        latencies: Vec::new(),
        pending_seconds: 0.0,
        pending_by_cause: BTreeMap::new(),
        evictions: BTreeMap::new(),
        evicted_by_workload: vec![0; scenario.workloads.len()],
        oom_by_workload: vec![0; scenario.workloads.len()],
        ooms: 0,
        sizes: scenario
            .workloads
            .iter()
            .map(|w| (w.cpu_request, w.memory_request))
            .collect(),
        applied: 0,
        commands: BTreeMap::new(),
        sizes_by_name: instance_types
            .iter()
            .map(|t| (t.name.clone(), t.clone()))
            .collect(),
        done: Vec::new(),
        methods: BTreeMap::new(),
        resized_in_place: 0,
        claims_by_origin: BTreeMap::new(),
        credit_per_hour: 0.0,
        realised: 0.0,
        instances_seen: BTreeSet::new(),
        spot_interruptions: 0,
        launched_before: 0,
    };
    let prices = crate::rightsizing::Prices::from_instance_types(&instance_types);
    let end = scenario.start + i64::from(scenario.days) * 86_400;
    let first = scenario.start - WARM_UP;
    let steps = (end - first) / scenario.step;
    let mut samples = Vec::new();
    let mut last_used: (f64, f64, BTreeMap<String, (f64, f64)>) = Default::default();
    for step in 0..steps {
        let now = first + step * scenario.step;
        let at = origin
            .checked_add(jiff::SignedDuration::from_secs(now - first))
            .unwrap_or(origin);
        let wait = at.duration_since(clock.now());
        if let Ok(d) = Duration::try_from(wait) {
            tokio::time::sleep(d).await;
        }
        if now == scenario.start {
            figures.launched_before = cloud.launches();
        }
        let since = now - scenario.start;
        // Azure runs out of one general-purpose size in every zone for half a day;
        // launches fall back to the next candidates.
        for zone in ["eastus-1", "eastus-2", "eastus-3"] {
            if since == scenario.capacity_outage.0 {
                cloud.inject_no_capacity(
                    scenario.capacity_outage_type,
                    zone,
                    CapacityType::OnDemand,
                );
            } else if since == scenario.capacity_outage.1 {
                cloud.clear_no_capacity(
                    scenario.capacity_outage_type,
                    zone,
                    CapacityType::OnDemand,
                );
            }
        }
        let instances: Vec<Instance> = cloud.list().await.unwrap_or_default();
        let mut o = cluster.lock();
        // The hour's sample is the cluster as the last hour left it, before this hour's
        // replica changes (with the last step's usage).
        if now > scenario.start && since % 3600 == 0 {
            if let Some(m) = metrics {
                record_namespaces(m, &o, scenario, &last_used.2, &prices);
            }
            // Usage every workload has taken in is forgotten.
            if let Some(until) = checkpoints_until(&o) {
                usage.lock().forget_before(until);
            }
            samples.push(sample(&o, &cloud, now, last_used.0, last_used.1, &figures));
            progress((step + 1) as f64 / steps as f64);
        }
        // Replica changes on the hour (the first step sets the cluster up).
        if step == 0 || since.rem_euclid(3600) == 0 {
            for (i, w) in scenario.workloads.iter().enumerate() {
                if w.kind != Kind::DaemonSet {
                    o.scale(workloads[i], scenario.desired(w, now));
                }
            }
        }
        last_used = use_step(&mut o, scenario, &usage, now, &mut figures, metrics);
        let happenings = o.take_happenings();
        figures.observe(
            happenings,
            &o,
            scenario,
            metrics,
            settings.applies_rightsizing(),
        );
        // Consolidation's realised saving: the decisions done, until provisioning buys
        // that much capacity again.
        let replaces_key = crate::controllers::disruption::REPLACES_ANNOTATION;
        let mut bought = 0.0;
        for i in &instances {
            if figures.instances_seen.insert(i.claim.clone()) {
                let replacement = o
                    .node_claims
                    .get(&i.claim)
                    .is_some_and(|c| c.annotations().contains_key(replaces_key));
                if !replacement && now >= scenario.start {
                    bought += i.price_per_hour;
                }
            }
        }
        figures.credit_per_hour = (figures.credit_per_hour - bought).max(0.0);
        if now >= scenario.start {
            let saved = figures.credit_per_hour * scenario.step as f64 / 3600.0;
            figures.realised += saved;
            if let Some(m) = metrics {
                m.savings_realised(SavingsSource::Consolidation, saved);
            }
        }
    }
    let now = end;
    if let Ok(d) = Duration::try_from(
        origin
            .checked_add(jiff::SignedDuration::from_secs(end - first))
            .unwrap_or(origin)
            .duration_since(clock.now()),
    ) {
        tokio::time::sleep(d).await;
    }
    let mut o = cluster.lock();
    let happenings = o.take_happenings();
    figures.observe(
        happenings,
        &o,
        scenario,
        metrics,
        settings.applies_rightsizing(),
    );
    samples.push(sample(&o, &cloud, now, last_used.0, last_used.1, &figures));
    progress(1.0);
    for (_, (since, cause)) in std::mem::take(&mut figures.pending) {
        figures.count_pending(since, now, cause);
    }
    let first_sample = samples
        .get(1)
        .or(samples.first())
        .cloned()
        .unwrap_or_default();
    let last = samples.last().cloned().unwrap_or_default();
    let (decisions, savings) = if settings.mode == Mode::Autonomous {
        (figures.done.len(), figures.done.iter().sum())
    } else {
        reported_decisions(&o, now)
    };
    let recommendations = if settings.applies_rightsizing() {
        figures.applied
    } else {
        o.recommendations
            .values()
            .filter(|r| {
                r.status.as_ref().is_some_and(|s| {
                    crate::apis::is_condition_true(
                        &s.conditions,
                        recommendation_condition::ACTIONABLE,
                    )
                })
            })
            .count()
    };
    let mut latencies = figures.latencies.clone();
    let pods_evicted = figures.tailors_evictions();
    let summary = RunSummary {
        nodes_start: first_sample.nodes_by_type.values().sum(),
        nodes_end: last.nodes_by_type.values().sum(),
        hourly_cost_start: first_sample.hourly_cost,
        hourly_cost_end: last.hourly_cost,
        total_cost: samples.iter().map(|s| s.hourly_cost).sum(),
        cpu_requested_end: last.cpu_requested,
        memory_requested_end: last.memory_requested,
        requests_value_per_hour: last.cpu_requested * prices.per_core_hour
            + last.memory_requested * prices.per_gib_hour,
        recommendations,
        decisions,
        decisions_by_method: figures.methods.clone(),
        events_by_reason: o
            .events
            .iter()
            .filter(|e| e.at.as_second() >= scenario.start)
            .fold(BTreeMap::new(), |mut m, e| {
                *m.entry(e.reason.clone()).or_default() += 1;
                m
            }),
        consolidation_savings_per_hour: savings,
        consolidation_realised_savings: figures.realised,
        pods_evicted,
        resized_in_place: figures.resized_in_place,
        evictions_by_cause: figures
            .evictions
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect(),
        oom_kills: figures.ooms,
        provisioning_p50_seconds: percentile(&mut latencies, 0.5),
        provisioning_p99_seconds: percentile(&mut latencies, 0.99),
        pending_pod_hours: figures.pending_seconds / 3600.0,
        pending_pod_hours_by_cause: figures
            .pending_by_cause
            .iter()
            .map(|(cause, seconds)| (cause.to_string(), seconds / 3600.0))
            .collect(),
        launches: cloud.launches().saturating_sub(figures.launched_before),
        launches_before_start: figures.launched_before,
        claims_by_origin: figures
            .claims_by_origin
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect(),
        spot_interruptions: figures.spot_interruptions,
    };
    let workloads_out = scenario
        .workloads
        .iter()
        .enumerate()
        .map(|(i, w)| WorkloadOutcome {
            workload: format!("{}/{}", w.namespace, w.name),
            kind: w.kind.as_str().to_string(),
            cpu: (w.cpu_request, figures.sizes[i].0),
            memory: (w.memory_request, figures.sizes[i].1),
            reasons: reasons_of(&o, w),
            oom_kills: figures.oom_by_workload[i],
            evictions: figures.evicted_by_workload[i],
        })
        .collect();
    drop(o);
    tasks.abort_all();
    drop(leader_tx);
    RunResult {
        mode: settings.name().to_string(),
        samples,
        workloads: workloads_out,
        summary,
        create_calls: cloud.create_calls(),
    }
}

/// One step of usage: every running pod uses what its trace says (recorded for
/// right-sizing); a container past its memory limit is OOM-killed, and when a node's pods
/// use more than its memory, the kernel kills the pod furthest above its request (the
/// kubelet's `oom_score_adj` for Burstable pods orders them so), as many as it takes.
/// Returns the cores and bytes used, and per namespace.
fn use_step(
    o: &mut Objects,
    scenario: &Scenario,
    usage: &Shared,
    now: i64,
    figures: &mut Figures,
    metrics: Option<&Metrics>,
) -> (f64, f64, BTreeMap<String, (f64, f64)>) {
    let i = ((now - scenario.start) / scenario.step).max(0) as usize;
    let (mut cpu_used, mut mem_used) = (0.0, 0.0);
    let mut by_namespace: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    let mut killed: Vec<(String, usize)> = Vec::new();
    // Per node: memory used, and per pod on it (key, bytes used above its request).
    let mut on_node: BTreeMap<String, (f64, Vec<(String, f64)>)> = BTreeMap::new();
    let mut recorded = usage.lock();
    for (key, pod) in &o.pods {
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        let Some(w) = o.workload_of(key).filter(|_| running) else {
            continue;
        };
        let trace = &scenario.workloads[w].trace;
        let (Some(cpu), Some(mem)) = (trace.cpu.get(i), trace.memory.get(i)) else {
            continue;
        };
        let j = jitter(key);
        let (cpu, mem) = (cpu * j, mem * j);
        cpu_used += cpu;
        mem_used += mem;
        let namespace = scenario.workloads[w].namespace.clone();
        let used = by_namespace.entry(namespace.clone()).or_default();
        used.0 += cpu;
        used.1 += mem;
        let container = ContainerKey {
            namespace,
            pod: pod.name_any(),
            container: CONTAINER.to_string(),
        };
        recorded.record(&container, now, cpu, mem);
        let (_, request) = pod_requests(pod);
        let limit = memory_limit(pod).unwrap_or(i64::MAX);
        if mem > limit as f64 {
            recorded.oom_kill(container, now, mem, request as f64);
            killed.push((key.clone(), w));
        } else if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
            let n = on_node.entry(node).or_default();
            n.0 += mem;
            n.1.push((key.clone(), mem - request as f64));
        }
    }
    for (node, (mut used, mut pods)) in on_node {
        let Some(allocatable) = o
            .nodes
            .get(&node)
            .and_then(|n| {
                n.status
                    .as_ref()?
                    .allocatable
                    .as_ref()?
                    .get("memory")
                    .cloned()
            })
            .and_then(|q| crate::model::quantity::parse_value(&q.0).ok())
        else {
            continue;
        };
        pods.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (key, above) in pods {
            if used <= allocatable as f64 || above <= 0.0 {
                break;
            }
            let Some((w, pod)) = o.workload_of(&key).zip(o.pods.get(&key)) else {
                continue;
            };
            let (_, request) = pod_requests(pod);
            let mem = request as f64 + above;
            used -= mem;
            let container = ContainerKey {
                namespace: scenario.workloads[w].namespace.clone(),
                pod: pod.name_any(),
                container: CONTAINER.to_string(),
            };
            recorded.oom_kill(container, now, mem, request as f64);
            killed.push((key, w));
        }
    }
    drop(recorded);
    for (key, w) in killed {
        o.oom_kill(&key);
        if now >= scenario.start {
            figures.ooms += 1;
            figures.oom_by_workload[w] += 1;
            if let Some(m) = metrics {
                m.oom_kills(&scenario.workloads[w].namespace, 1);
            }
        }
    }
    (cpu_used, mem_used, by_namespace)
}

/// The oldest point every workload's right-sizing has read up to (from the checkpoints
/// in the Recommendations): usage before it is never read again.
fn checkpoints_until(o: &Objects) -> Option<i64> {
    o.recommendations
        .values()
        .filter_map(|r| r.status.as_ref()?.checkpoint.as_deref())
        .filter_map(|text| serde_json::from_str::<Checkpoint>(text).ok())
        .map(|c| c.until)
        .min()
}

/// How far back a recommend-only run's last reports are read: the agent reports a standing
/// decision again every ten minutes, at its next look (at most five minutes later while
/// the cluster stays consolidated).
const REPORTED_WITHIN: i64 = 15 * 60;

/// The decisions a recommend-only run's agent reported at the end (`WouldDisrupt` Events on
/// the NodePools within [`REPORTED_WITHIN`], one per decision), and their $/hour.
fn reported_decisions(o: &Objects, now: i64) -> (usize, f64) {
    let mut latest: BTreeMap<&str, &super::cluster::RecordedEvent> = BTreeMap::new();
    for e in o
        .events
        .iter()
        .filter(|e| e.reason == "WouldDisrupt" && now - e.at.as_second() <= REPORTED_WITHIN)
    {
        // The note names the method and the nodes: one entry per decision.
        let decision = e.note.split(" saving ").next().unwrap_or(&e.note);
        latest.insert(decision, e);
    }
    let recent: Vec<&super::cluster::RecordedEvent> = latest.into_values().collect();
    let savings = recent
        .iter()
        .filter_map(|e| {
            let (_, rest) = e.note.split_once("saving $")?;
            rest.split_once("/hour")?.0.parse::<f64>().ok()
        })
        .sum();
    (recent.len(), savings)
}

/// The reasons of a workload's Recommendation's container.
fn reasons_of(o: &Objects, w: &super::scenario::Workload) -> Vec<String> {
    let name = format!("{}-{}", w.kind.as_str().to_ascii_lowercase(), w.name);
    o.recommendations
        .get(&format!("{}/{name}", w.namespace))
        .and_then(|r| r.status.as_ref())
        .and_then(|s| s.containers.first())
        .map(|c| c.reasons.clone())
        .unwrap_or_default()
}

/// Per namespace: requests before right-sizing and now, their hourly cost against the
/// cost of what is used, and the hour's realised right-sizing saving.
fn record_namespaces(
    m: &Metrics,
    o: &Objects,
    scenario: &Scenario,
    used: &BTreeMap<String, (f64, f64)>,
    prices: &crate::rightsizing::Prices,
) {
    let value =
        |cores: f64, bytes: f64| cores * prices.per_core_hour + bytes / GIB * prices.per_gib_hour;
    // (as deployed cores, bytes; now cores, bytes)
    let mut requests: BTreeMap<&str, (f64, f64, f64, f64)> = BTreeMap::new();
    for (key, pod) in &o.pods {
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        let Some(w) = o.workload_of(key).filter(|_| running) else {
            continue;
        };
        let workload = &scenario.workloads[w];
        let (cpu, memory) = pod_requests(pod);
        let r = requests.entry(workload.namespace.as_str()).or_default();
        r.0 += workload.cpu_request as f64 / 1000.0;
        r.1 += workload.memory_request as f64;
        r.2 += cpu as f64 / 1000.0;
        r.3 += memory as f64;
    }
    let mut realised = 0.0;
    for (namespace, (cpu0, mem0, cpu, mem)) in &requests {
        m.set_namespace_requests(namespace, When::Before, *cpu0, *mem0);
        m.set_namespace_requests(namespace, When::After, *cpu, *mem);
        m.set_namespace_cost(namespace, Usage::Requested, value(*cpu, *mem));
        let (cpu_used, mem_used) = used.get(*namespace).copied().unwrap_or_default();
        m.set_namespace_cost(namespace, Usage::Used, value(cpu_used, mem_used));
        realised += (value(*cpu0, *mem0) - value(*cpu, *mem)).max(0.0);
    }
    // Sampled hourly: the hour's saving is the rate times one hour.
    m.savings_realised(SavingsSource::Rightsizing, realised);
}

fn sample(
    o: &Objects,
    cloud: &SimulatedAzure,
    now: i64,
    cpu_used: f64,
    mem_used: f64,
    figures: &Figures,
) -> Sample {
    let mut nodes_by_type = BTreeMap::new();
    for n in o.nodes.values() {
        if let Some(t) = n.labels().get(labels::INSTANCE_TYPE) {
            *nodes_by_type.entry(t.clone()).or_default() += 1;
        }
    }
    let (mut cpu, mut memory, mut pending) = (0i64, 0i64, 0usize);
    for pod in o.pods.values() {
        if pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_some()
        {
            let (c, m) = pod_requests(pod);
            cpu += c;
            memory += m;
        } else {
            pending += 1;
        }
    }
    Sample {
        t: now,
        hourly_cost: cloud.hourly_cost(),
        nodes_by_type,
        cpu_requested: cpu as f64 / 1000.0,
        cpu_used,
        memory_requested: memory as f64 / GIB,
        memory_used: mem_used / GIB,
        recommendations_applied: figures.applied,
        pending,
        evicted: figures.tailors_evictions(),
        oom_kills: figures.ooms,
        launches: cloud.launches().saturating_sub(figures.launched_before),
    }
}
