//! The simulated cluster on a virtual clock: workloads create and delete pods, pods use
//! CPU and memory as their traces say and are OOM-killed past their limit, and the real
//! Tailor code decides — the scheduler and provisioner buy nodes from the simulated Azure,
//! the recommender sizes requests from the usage it sees, and disruption consolidates.
//! The cluster itself is the [`Actuator`] disruption drains through.

use std::collections::{BTreeMap, BTreeSet};
use std::future::{Future, ready};
use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Taint;

use super::scenario::{Kind, Scenario};
use super::usage::Recorded;
use crate::apis::labels;
use crate::apis::nodepool::BudgetNodes;
use crate::clock::{Clock, VirtualClock};
use crate::cloud::metered::MeteredCloud;
use crate::cloud::sim::{SimSettings, SimulatedAzure};
use crate::cloud::{CloudProvider, InstanceState};
use crate::disruption::cluster::PoolRules;
use crate::disruption::controller::{
    ActError, Actuator, DEFAULT_VALIDATION_DELAY, DISRUPTED_TAINT, Disrupter, Phase, Validation,
};
use crate::disruption::{self, Cluster, NodeMeta};
use crate::model::{CapacityType, Dimension, InstanceType, Requirement, Resources};
use crate::provisioning::{self, Batcher, Mode, Provisioner};
use crate::rightsizing::service::{
    Policies, Request as ServiceRequest, Resume, recommend_workloads,
};
use crate::rightsizing::{ContainerRecommendation, Context, Policy, Prices, Requests};
use crate::scheduling::input::default_pool;
use crate::scheduling::{DaemonSetInfo, ExistingNode, Input, Options, PodInfo, Pool};
use crate::state::Snapshot;
use crate::telemetry::Metrics;
use crate::telemetry::names::{Controller, RecommendationState, SavingsSource, Stage, Usage, When};
use crate::usage::pool::Checkpoint;
use crate::usage::workloads::{Workload, Workloads};
use crate::usage::{ContainerKey, ObservedOom};

/// The simulated cloud, with every call metered as the agent's is.
type Cloud = MeteredCloud<SimulatedAzure>;

const GIB: f64 = 1_073_741_824.0;

/// Seconds before the run's start the cluster is brought up (its pods as deployed placed,
/// their nodes launched and registered).
const WARM_UP: i64 = 600;

/// Seconds between the finer steps in which nodes register, disruption acts and pending
/// pods are placed (usage moves in the scenario's coarser step).
const SUB_STEP: i64 = 15;

/// The taint on the spot NodePool's nodes; only pods that tolerate it land there.
const SPOT_TAINT: &str = "tailor.sh/spot";

/// A NodePool of general-purpose D and E sizes (v5/v6, amd64) of one capacity type.
fn node_pool(name: &str, capacity_type: &str, weight: i32, types: &[InstanceType]) -> Pool {
    let written = [
        (labels::CAPACITY_TYPE, vec![capacity_type]),
        (labels::OS, vec![labels::OS_LINUX]),
        (labels::SKU_FAMILY, vec!["D", "E"]),
        (labels::SKU_VERSION, vec!["5", "6"]),
        (labels::ARCH, vec!["amd64"]),
    ]
    .into_iter()
    .map(|(key, values)| crate::apis::NodeRequirement {
        key: key.to_string(),
        operator: crate::apis::RequirementOperator::In,
        values: values.into_iter().map(str::to_string).collect(),
        min_values: None,
    })
    .collect::<Vec<_>>();
    // `In` with at least one value always parses.
    let requirements = crate::model::Requirements::from_node_requirements(&written)
        .expect("In requirements with values are valid")
        .with(Requirement::one_of(labels::NODE_POOL, [name]));
    let taints = if capacity_type == labels::CAPACITY_TYPE_SPOT {
        vec![Taint {
            key: SPOT_TAINT.to_string(),
            value: Some("true".to_string()),
            effect: "NoSchedule".to_string(),
            ..Taint::default()
        }]
    } else {
        Vec::new()
    };
    let mut pool = default_pool(Vec::new());
    pool.name = name.to_string();
    pool.weight = weight;
    pool.taints = taints;
    pool.instance_types = types
        .iter()
        .filter(|t| requirements.intersects(&t.requirements).is_ok())
        .cloned()
        .collect();
    pool.requirements = requirements;
    pool.written_requirements = written;
    pool
}

/// How one run behaves.
#[derive(Debug, Clone)]
pub struct RunSettings {
    /// Recommend-only (report right-sizing and disruption) or autonomous (act).
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
    /// How much above the forecast a purchase ahead buys, as a share of each pool's
    /// expected requests ([`crate::provisioning::headroom::DEFAULT_MARGIN`]).
    pub headroom_margin: f64,
    /// Disruption thresholds.
    pub disruption: disruption::Settings,
    /// The right-sizing policy.
    pub policy: Policy,
    /// Seconds between right-sizing rounds.
    pub rightsizing_every: i64,
    /// Seconds between disruption evaluations.
    pub disruption_every: i64,
    /// The NodePool's consolidateAfter, seconds.
    pub consolidate_after: i64,
    /// The NodePool's disruption budget (share of nodes at once).
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
            headroom_margin: crate::provisioning::headroom::DEFAULT_MARGIN,
            disruption: disruption::Settings::default(),
            // Requests are sized to the usage history; the teams' memory limits stay
            // where they set them, so a peak above anything seen so far is absorbed by the
            // node rather than killed at a limit cut down to the request. (A node whose
            // pods outgrow its memory still kills, see `usage`.)
            policy: Policy {
                limits: crate::apis::LimitsPolicy::Keep,
                ..Policy::default()
            },
            rightsizing_every: 6 * 3600,
            disruption_every: 600,
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
            headroom_margin: 0.0,
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
    /// Recommendations applied over the run (autonomous), or waiting to be applied at
    /// the last round (recommend-only).
    pub recommendations: usize,
    /// Disruption decisions carried out (autonomous) or reported (recommend-only, last
    /// evaluation).
    pub decisions: usize,
    /// USD per hour saved by those decisions, each as it was taken. Not additive over a
    /// run: the night's consolidation removes nodes the day's growth buys again.
    pub consolidation_savings_per_hour: f64,
    /// USD the decisions carried out saved over the run: a decision's saving counts from
    /// when it is done until provisioning buys that much capacity again (autonomous;
    /// zero in recommend-only).
    pub consolidation_realised_savings: f64,
    /// Pods evicted.
    pub pods_evicted: usize,
    /// OOM kills.
    pub oom_kills: u64,
    /// Median seconds from pending to running.
    pub provisioning_p50_seconds: f64,
    /// 99th percentile seconds from pending to running.
    pub provisioning_p99_seconds: f64,
    /// Pod-hours spent pending.
    pub pending_pod_hours: f64,
    /// Pod-hours spent pending, by why the pods were pending: `scale-up` (a new replica),
    /// `job` (a Job's run started), `evicted` (by disruption), `spot-interrupted`,
    /// `node-lost` (its node went away without a drain) and `oom-moved` (recreated
    /// elsewhere at a bigger size after an OOM kill).
    pub pending_pod_hours_by_cause: BTreeMap<String, f64>,
    /// Nodes launched over the run (the bring-up before the start aside).
    pub launches: u64,
    /// Nodes launched in the bring-up before the start: the running cluster the run
    /// begins with.
    pub launches_before_start: u64,
    /// Spot VMs reclaimed by the cloud (their pods rescheduled).
    pub spot_interruptions: u64,
}

/// What one workload went through in a run: its requests at the start and the end, the
/// last change and why, and what it suffered.
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
    /// The reasons of the last recommendation that changed the size (empty before the
    /// first change).
    pub reasons: Vec<String>,
    /// OOM kills of its pods.
    pub oom_kills: u64,
    /// Its pods evicted by disruption.
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
}

#[derive(Debug, Clone)]
struct SimPod {
    key: String,
    /// The pod's number within its workload: its name in the usage history.
    ordinal: u64,
    workload: usize,
    node: Option<String>,
    running: bool,
    cpu: i64,
    memory: i64,
    memory_limit: i64,
    pending_since: Option<i64>,
    /// Why the pod is pending (or was, last), see `RunSummary::pending_pod_hours_by_cause`.
    pending_cause: &'static str,
    jitter: f64,
}

#[derive(Debug, Clone)]
struct SimNode {
    name: String,
    provider_id: String,
    instance_type: String,
    zone: String,
    capacity_type: CapacityType,
    price: f64,
    allocatable: Resources,
    labels: BTreeMap<String, String>,
    taints: Vec<Taint>,
    created: i64,
    last_pod_event: i64,
}

/// Requested sizes per workload: what new pods get.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sizes {
    cpu: i64,
    memory: i64,
    memory_limit: i64,
}

struct World<'a> {
    scenario: &'a Scenario,
    settings: &'a RunSettings,
    /// NodePools: on-demand `default`, and `spot` (tainted; batch Jobs tolerate it).
    pools: Vec<Pool>,
    templates: Vec<PodInfo>,
    daemon_sets: Vec<DaemonSetInfo>,
    nodes: Vec<SimNode>,
    pods: Vec<SimPod>,
    sizes: Vec<Sizes>,
    next_ordinal: Vec<u64>,
    /// Labels of claims launched by the provisioner, until their node registers.
    launching: BTreeMap<String, BTreeMap<String, String>>,
    /// What the pods used, served to right-sizing as Prometheus serves a cluster's.
    usage: Recorded,
    /// Per workload, the right-sizing state the last round left (as the agent keeps it in
    /// each Recommendation): a round reads only the usage after it.
    checkpoints: BTreeMap<Workload, Checkpoint>,
    /// OOM kills the pods showed since the last round, as the agent reads them.
    observed: Vec<ObservedOom>,
    /// Pods OOM-killed in this step, to be answered.
    killed: Vec<String>,
    /// Per workload: OOM kills, evictions and the reasons of the last change.
    oom_by_workload: Vec<u64>,
    evicted_by_workload: Vec<usize>,
    last_reasons: Vec<Vec<String>>,
    context: Context,
    now: i64,
    latencies: Vec<f64>,
    evicted: usize,
    ooms: u64,
    applied: usize,
    pending_seconds: f64,
    /// Pending pod-seconds per cause (see `SimPod::pending_cause`).
    pending_by_cause: BTreeMap<&'static str, f64>,
    spot_interruptions: u64,
    /// USD per hour of nodes provisioning has launched so far.
    launched_per_hour: f64,
    metrics: Option<Metrics>,
    /// (pool, size, capacity type, zone) whose cost was last reported (to zero the ones
    /// gone).
    reported_types: BTreeSet<(String, String, String, String)>,
    /// Per workload: whether its last recommendation was actionable, and its $/hour effect
    /// per pod.
    last_recommendation: Vec<Option<(bool, f64)>>,
    /// Per namespace: CPU cores and memory bytes used in the last step.
    used_by_namespace: BTreeMap<String, (f64, f64)>,
    /// Requests per NodePool over time, and what they expect of the next hours.
    demand: disruption::forecast::DemandHistory,
    /// What each NodePool is expected to carry within the forecast horizon, as of the
    /// last disruption evaluation.
    expected: BTreeMap<String, Resources>,
    /// Decides when pending pods are planned, with the agent's windows.
    batcher: Batcher,
    /// The pending pods the open or last batch saw.
    batch_pods: BTreeSet<String>,
    /// When the last provisioning round ran.
    last_round: Option<Timestamp>,
    /// The one clock the cloud, the provisioner and the disruption controller read.
    clock: VirtualClock,
    /// Seconds the simulated cloud takes from creating a VM to running it.
    launch_latency: i64,
}

/// The container name of every simulated workload's one container.
const USAGE_CONTAINER: &str = "app";

/// A pod's container in the usage history, named as a Deployment's pods are
/// (`<workload>-<hash>-<5 characters>`), so right-sizing maps it to its workload as it maps
/// a cluster's pods.
fn usage_key(w: &super::scenario::Workload, ordinal: u64) -> ContainerKey {
    ContainerKey {
        namespace: w.namespace.clone(),
        pod: format!("{}-5c4d9b8f7-{:05}", w.name, ordinal % 100_000),
        container: USAGE_CONTAINER.to_string(),
    }
}

fn pod_info(namespace: &str, name: &str, kind: Kind, app: &str) -> PodInfo {
    let mut info = PodInfo::new(&format!("{namespace}/{name}"), Resources::default());
    info.labels = BTreeMap::from([("app".to_string(), app.to_string())]);
    info.owner = Some(format!("{}/{app}", kind.as_str()));
    info
}

fn resources(cpu: i64, memory: i64) -> Resources {
    let mut r = Resources::cpu_memory(cpu, memory);
    r.set(&Dimension::Pods, 1);
    r
}

impl World<'_> {
    fn pod_info(&self, p: &SimPod) -> PodInfo {
        let mut info = self.templates[p.workload].clone();
        info.key = p.key.clone();
        info.requests = resources(p.cpu, p.memory);
        info.node_name = p.node.clone();
        info
    }

    fn is_daemon(&self, p: &SimPod) -> bool {
        self.scenario.workloads[p.workload].kind == Kind::DaemonSet
    }

    fn existing(&self, n: &SimNode) -> ExistingNode {
        ExistingNode {
            name: n.name.clone(),
            labels: n.labels.clone(),
            taints: n.taints.clone(),
            allocatable: n.allocatable.clone(),
            pods: self
                .pods
                .iter()
                .filter(|p| p.node.as_deref() == Some(n.name.as_str()))
                .map(|p| std::sync::Arc::new(self.pod_info(p)))
                .collect(),
            unschedulable: false,
        }
    }

    fn pools_now(&self) -> Vec<Pool> {
        let mut pools = self.pools.clone();
        for pool in &mut pools {
            let owned = |l: &BTreeMap<String, String>| {
                l.get(labels::NODE_POOL).is_some_and(|p| *p == pool.name)
            };
            pool.nodes_in_use = (self.nodes.iter().filter(|n| owned(&n.labels)).count()
                + self.launching.values().filter(|l| owned(l)).count())
                as i64;
        }
        pools
    }

    fn pending(&self) -> Vec<PodInfo> {
        self.pods
            .iter()
            .filter(|p| p.node.is_none())
            .map(|p| self.pod_info(p))
            .collect()
    }

    /// The view disruption decides over.
    fn view(&self) -> Cluster {
        let rules = PoolRules {
            policy: crate::apis::ConsolidationPolicy::WhenEmptyOrUnderutilized,
            consolidate_after: Some(self.settings.consolidate_after),
            budgets: vec![(
                BudgetNodes::Percent(self.settings.budget_percent),
                Vec::new(),
            )],
            template_hash: String::new(),
            expire_after: None,
        };
        Cluster {
            input: Input {
                pending: self.pending(),
                nodes: self.nodes.iter().map(|n| self.existing(n)).collect(),
                pools: self.pools_now(),
                daemon_sets: self.daemon_sets.clone(),
            },
            nodes: self
                .nodes
                .iter()
                .map(|n| NodeMeta {
                    pool: n.labels.get(labels::NODE_POOL).cloned(),
                    instance_type: n.instance_type.clone(),
                    zone: n.zone.clone(),
                    capacity_type: n.capacity_type,
                    price_per_hour: Some(n.price),
                    created: Some(n.created),
                    last_pod_event: Some(n.last_pod_event),
                    do_not_disrupt: false,
                    drifted: None,
                    provider_id: Some(n.provider_id.clone()),
                })
                .collect(),
            do_not_disrupt: Default::default(),
            pdbs: Vec::new(),
            rules: self
                .pools
                .iter()
                .map(|p| (p.name.clone(), rules.clone()))
                .collect(),
            now: self.now,
            expected: self.expected.clone(),
            unreadable: BTreeMap::new(),
            held: Default::default(),
        }
    }

    fn new_pod(&mut self, w: usize, node: Option<String>) {
        let workload = &self.scenario.workloads[w];
        self.next_ordinal[w] += 1;
        let ordinal = self.next_ordinal[w];
        let key = match &node {
            Some(n) => format!("{}/{}-{n}", workload.namespace, workload.name),
            None => format!("{}/{}-{ordinal}", workload.namespace, workload.name),
        };
        // Replicas differ a little from each other, deterministically.
        let jitter = 0.9 + ((ordinal.wrapping_mul(2_654_435_761) % 1000) as f64) / 5000.0;
        let s = self.sizes[w];
        let running = node.is_some();
        self.pods.push(SimPod {
            key,
            ordinal,
            workload: w,
            node,
            running,
            cpu: s.cpu,
            memory: s.memory,
            memory_limit: s.memory_limit,
            pending_since: (!running).then_some(self.now),
            pending_cause: if workload.kind == Kind::Job {
                "job"
            } else {
                "scale-up"
            },
            jitter,
        });
    }

    /// Counts `seconds` of pending time for every pod not running, by why it is pending.
    fn count_pending(&mut self, seconds: f64) {
        for p in self.pods.iter().filter(|p| !p.running) {
            self.pending_seconds += seconds;
            *self.pending_by_cause.entry(p.pending_cause).or_default() += seconds;
        }
    }

    /// Replica changes: create or delete pods to match what the workloads want now.
    fn reconcile_workloads(&mut self) {
        for w in 0..self.scenario.workloads.len() {
            let workload = &self.scenario.workloads[w];
            if workload.kind == Kind::DaemonSet {
                continue;
            }
            let want = self.scenario.desired(workload, self.now) as usize;
            let have: Vec<usize> = (0..self.pods.len())
                .filter(|&i| self.pods[i].workload == w)
                .collect();
            if have.len() < want {
                for _ in have.len()..want {
                    self.new_pod(w, None);
                }
            } else if have.len() > want {
                // The newest go first; pending ones before running ones.
                let mut order = have.clone();
                order.sort_by_key(|&i| (self.pods[i].running, std::cmp::Reverse(i)));
                let mut gone: Vec<usize> = order[..have.len() - want].to_vec();
                gone.sort_unstable_by(|a, b| b.cmp(a));
                for i in gone {
                    let p = self.pods.remove(i);
                    if let Some(n) = p.node
                        && let Some(node) = self.nodes.iter_mut().find(|x| x.name == n)
                    {
                        node.last_pod_event = self.now;
                    }
                }
            }
        }
    }

    /// VMs that came up register as nodes (with their DaemonSet pods); nominated pods
    /// start running.
    async fn register(&mut self, cloud: &Cloud) {
        let Ok(instances) = cloud.list().await else {
            return;
        };
        // Nodes whose VM is gone (a spot VM reclaimed, or deleted) leave the cluster.
        let alive: BTreeSet<&str> = instances
            .iter()
            .filter(|i| i.state == InstanceState::Running)
            .map(|i| i.claim.as_str())
            .collect();
        let gone: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| !alive.contains(n.name.as_str()))
            .map(|n| n.name.clone())
            .collect();
        for name in gone {
            if let Some(m) = &self.metrics
                && let Some(n) = self.nodes.iter().find(|n| n.name == name)
            {
                let pool = n.labels.get(labels::NODE_POOL).map_or("", String::as_str);
                m.nodeclaim_terminated(pool, "interrupted");
            }
            self.remove_node(&name);
        }
        for i in instances {
            if i.state != InstanceState::Running || self.nodes.iter().any(|n| n.name == i.claim) {
                continue;
            }
            let pool_name = self
                .launching
                .get(&i.claim)
                .and_then(|l| l.get(labels::NODE_POOL))
                .or_else(|| i.tags.get("tailor.sh_nodepool"))
                .cloned()
                .unwrap_or_default();
            let Some(pool) = self.pools.iter().find(|p| p.name == pool_name) else {
                continue;
            };
            let Some(t) = pool
                .instance_types
                .iter()
                .find(|t| t.name == i.instance_type)
            else {
                continue;
            };
            let (allocatable, taints) = (t.allocatable.clone(), pool.taints.clone());
            let mut node_labels = self.launching.remove(&i.claim).unwrap_or_else(|| {
                let mut l = t.requirements.single_valued_labels();
                l.insert(labels::NODE_POOL.to_string(), pool_name.clone());
                l
            });
            node_labels.insert(labels::INSTANCE_TYPE.to_string(), i.instance_type.clone());
            node_labels.insert(labels::ZONE.to_string(), i.zone.clone());
            node_labels.insert(
                labels::CAPACITY_TYPE.to_string(),
                i.capacity_type.as_str().to_string(),
            );
            node_labels.insert(labels::HOSTNAME.to_string(), i.claim.clone());
            // The node joined when its VM came up, which may be between two of the
            // simulation's looks.
            let joined = (i.created_at.as_second() + self.launch_latency)
                .clamp(self.now - SUB_STEP, self.now);
            if let Some(m) = &self.metrics {
                let launched = joined - i.created_at.as_second();
                m.observe_nodeclaim_stage(&pool_name, Stage::Registered, launched as f64);
                // A simulated node is ready for pods as it joins.
                m.observe_nodeclaim_stage(&pool_name, Stage::Initialized, 0.0);
            }
            self.nodes.push(SimNode {
                name: i.claim.clone(),
                provider_id: i.provider_id.clone(),
                instance_type: i.instance_type.clone(),
                zone: i.zone.clone(),
                capacity_type: i.capacity_type,
                price: i.price_per_hour,
                allocatable,
                labels: node_labels,
                taints,
                created: joined,
                last_pod_event: joined,
            });
            if i.capacity_type == CapacityType::Spot {
                // A quarter of spot VMs are reclaimed within 1-11 hours of starting.
                let h = i.claim.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                    (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
                });
                if h % 4 == 0 {
                    let at = self.now + 3600 + (h / 4 % 36_000) as i64;
                    if let Ok(at) = Timestamp::from_second(at) {
                        cloud.inner().schedule_spot_interruption(&i.provider_id, at);
                    }
                }
            }
            for w in 0..self.scenario.workloads.len() {
                if self.scenario.workloads[w].kind == Kind::DaemonSet {
                    self.new_pod(w, Some(i.claim.clone()));
                }
            }
            let now = self.now;
            for p in &mut self.pods {
                if p.node.as_deref() == Some(i.claim.as_str()) && !p.running {
                    p.running = true;
                    if let Some(since) = p.pending_since.take() {
                        let started = joined.max(since);
                        // Pending time is counted a sub-step at a time: the part of the
                        // last one after the node joined was running time.
                        let over = (now - started) as f64;
                        self.pending_seconds -= over;
                        *self.pending_by_cause.entry(p.pending_cause).or_default() -= over;
                        self.latencies.push((started - since) as f64);
                        if let Some(m) = &self.metrics {
                            m.observe_pod_startup(&pool_name, (started - since) as f64);
                        }
                    }
                }
            }
        }
    }

    /// Removes a node: its DaemonSet pods go with it, the others are pending again.
    fn remove_node(&mut self, node: &str) {
        self.nodes.retain(|n| n.name != node);
        let now = self.now;
        let workloads = &self.scenario.workloads;
        self.pods.retain(|p| {
            !(p.node.as_deref() == Some(node) && workloads[p.workload].kind == Kind::DaemonSet)
        });
        for p in &mut self.pods {
            if p.node.as_deref() == Some(node) {
                p.node = None;
                p.running = false;
                p.pending_since = Some(now);
                p.pending_cause = "node-lost";
            }
        }
    }

    /// Spot interruption notices: the node is cordoned and drained at once (its pods are
    /// pending again and get new nodes); the cloud reclaims the VM at the deadline.
    async fn interruptions(&mut self, cloud: &Cloud) {
        let Ok(notices) = cloud.interruptions().await else {
            return;
        };
        for notice in notices {
            let Some(node) = self
                .nodes
                .iter_mut()
                .find(|n| n.provider_id == notice.provider_id)
            else {
                continue;
            };
            node.taints.push(Taint {
                key: DISRUPTED_TAINT.to_string(),
                effect: "NoSchedule".to_string(),
                ..Taint::default()
            });
            let name = node.name.clone();
            self.spot_interruptions += 1;
            let now = self.now;
            for p in &mut self.pods {
                if p.node.as_deref() == Some(name.as_str())
                    && self.scenario.workloads[p.workload].kind != Kind::DaemonSet
                {
                    p.node = None;
                    p.running = false;
                    p.pending_since = Some(now);
                    p.pending_cause = "spot-interrupted";
                }
            }
        }
    }

    /// Pending pods, planned as the agent's provisioning controller plans them: a change in
    /// the pending set, or pods a round left pending once the retry pause has passed, opens
    /// or extends a batch, and the provisioner places them on nodes with room or buys new
    /// nodes for them when the [`Batcher`] closes it. Pods appear here at the sub-step's
    /// grain, longer than the batch windows and the retry pause, so a batch opened at a
    /// sub-step closes within it, at its deadline, and the round runs then.
    async fn provision(&mut self, provisioner: &mut Provisioner<Cloud>) {
        let pending = self.pending();
        if pending.is_empty() {
            self.batcher.reset();
            self.batch_pods.clear();
            return;
        }
        let now = self.timestamp();
        let keys: BTreeSet<String> = pending.iter().map(|p| p.key.clone()).collect();
        let retry = self
            .last_round
            .is_some_and(|t| now.duration_since(t) >= provisioning::RETRY);
        if keys != self.batch_pods || retry {
            self.batcher.observe(now);
            self.batch_pods = keys;
        }
        let Some(at) = self.batcher.deadline() else {
            return;
        };
        if at.as_second() >= self.now + SUB_STEP {
            // The batch closes after this sub-step: planned at a later call.
            return;
        }
        self.batcher.reset();
        self.last_round = Some(at);
        // The round runs when the batch closes: the cloud stamps its launches then.
        self.clock.set(at);
        let input = Input {
            pending,
            nodes: self.nodes.iter().map(|n| self.existing(n)).collect(),
            pools: self.pools_now(),
            daemon_sets: self.daemon_sets.clone(),
        };
        let since: BTreeMap<String, Timestamp> = self
            .pods
            .iter()
            .filter_map(|p| {
                Some((
                    p.key.clone(),
                    Timestamp::from_second(p.pending_since?).ok()?,
                ))
            })
            .collect();
        let round = provisioner.provision(&input, at, &since).await;
        let now = at.as_second();
        for placement in &round.plan.existing_nodes {
            for key in &placement.pods {
                if let Some(p) = self.pods.iter_mut().find(|p| &p.key == key) {
                    p.node = Some(placement.node.clone());
                    p.running = true;
                    if let Some(since) = p.pending_since.take() {
                        self.latencies.push((now - since) as f64);
                        if let Some(m) = &self.metrics {
                            let pool = self
                                .nodes
                                .iter()
                                .find(|n| n.name == placement.node)
                                .and_then(|n| n.labels.get(labels::NODE_POOL))
                                .map_or("", String::as_str);
                            m.observe_pod_startup(pool, (now - since) as f64);
                        }
                    }
                }
            }
            if let Some(n) = self.nodes.iter_mut().find(|n| n.name == placement.node) {
                n.last_pod_event = now;
            }
        }
        self.launched(round);
    }

    /// Buys, ahead of time, the capacity each NodePool is expected to need within the
    /// headroom lead beyond what it carries (`Provisioner::buy_ahead`; autonomous mode,
    /// nothing while pods are pending or nodes launching).
    async fn headroom(&mut self, provisioner: &mut Provisioner<Cloud>) {
        let lead = self.settings.headroom_lead;
        if lead <= 0
            || self.settings.mode != Mode::Autonomous
            || !self.launching.is_empty()
            || self.pods.iter().any(|p| p.node.is_none())
        {
            return;
        }
        let input = Input {
            pending: Vec::new(),
            nodes: self.nodes.iter().map(|n| self.existing(n)).collect(),
            pools: self.pools_now(),
            daemon_sets: self.daemon_sets.clone(),
        };
        let now = Clock::now(&self.clock);
        if let Some(round) = provisioner
            .buy_ahead(
                &input,
                &self.demand,
                now,
                lead,
                self.settings.forecast_horizon,
                self.settings.headroom_margin,
            )
            .await
        {
            self.launched(round);
        }
    }

    /// Evaluates disruption on the cluster now, as the agent's disruption controller does:
    /// the requests' cycle recorded and its expectation attached, the decisions counted in
    /// the metrics.
    fn evaluate_disruption(&mut self, settings: &disruption::Settings) -> disruption::Report {
        let mut view = self.view();
        self.demand.record(&view.input, self.now);
        self.expected = self
            .demand
            .expected(&view.input, self.now, self.settings.forecast_horizon);
        view.expected = self.expected.clone();
        let started = std::time::Instant::now();
        let report = disruption::evaluate(&view, settings);
        if let Some(m) = &self.metrics {
            let seconds = started.elapsed().as_secs_f64();
            m.observe_decision("disruption", seconds);
            m.reconcile(Controller::Disruption, seconds, false);
            m.set_disruption_blocked(report.blocked.iter().map(|b| b.reason.as_str()));
            let savings = report.decisions.iter().map(|d| d.savings_per_hour.max(0.0));
            m.set_savings_available(SavingsSource::Consolidation, savings.sum());
            let mode = match self.settings.mode {
                Mode::Autonomous => "autonomous",
                Mode::RecommendOnly => "recommend",
            };
            for d in &report.decisions {
                // `Method`'s names, lower-cased, are the documented label values.
                let method = format!("{:?}", d.method).to_lowercase();
                m.disruption_decision(&method, mode);
            }
        }
        report
    }

    /// The clock as a timestamp.
    fn timestamp(&self) -> Timestamp {
        Timestamp::from_second(self.now).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    /// Books what a provisioning round launched: each node is launching until it
    /// registers, and the pods planned onto it are nominated to it.
    fn launched(&mut self, round: &provisioning::Round) {
        let now = round.at.as_second();
        for l in &round.launched {
            self.launched_per_hour += l.instance.price_per_hour;
            if let Some(m) = &self.metrics {
                // The simulated claim is created and launched in one step.
                let launched = l.instance.created_at.as_second() - now;
                m.observe_nodeclaim_stage(&l.claim.node_pool, Stage::Launched, launched as f64);
            }
            self.launching
                .insert(l.instance.claim.clone(), l.claim.labels.clone());
            for key in &l.claim.pods {
                if let Some(p) = self.pods.iter_mut().find(|p| &p.key == key) {
                    p.node = Some(l.instance.claim.clone());
                }
            }
        }
    }

    /// One step of usage: the usage is recorded, pods past their memory limit are OOM-killed
    /// (answered by [`World::answer_ooms`]).
    fn usage(&mut self) -> (f64, f64) {
        let i = ((self.now - self.scenario.start) / self.scenario.step).max(0) as usize;
        let (mut cpu_used, mut mem_used) = (0.0, 0.0);
        let mut killed = Vec::new();
        // Per node: memory used, and per pod on it (key, bytes used above its request).
        let mut on_node: BTreeMap<String, (f64, Vec<(String, f64)>)> = BTreeMap::new();
        self.used_by_namespace.clear();
        for p in &mut self.pods {
            if !p.running {
                continue;
            }
            let trace = &self.scenario.workloads[p.workload].trace;
            let (Some(cpu), Some(mem)) = (trace.cpu.get(i), trace.memory.get(i)) else {
                continue;
            };
            let (cpu, mem) = (cpu * p.jitter, mem * p.jitter);
            cpu_used += cpu;
            mem_used += mem;
            let namespace = &self.scenario.workloads[p.workload].namespace;
            let used = self.used_by_namespace.entry(namespace.clone()).or_default();
            used.0 += cpu;
            used.1 += mem;
            let key = usage_key(&self.scenario.workloads[p.workload], p.ordinal);
            self.usage.record(&key, self.now, cpu, mem);
            if mem > p.memory_limit as f64 {
                self.ooms += 1;
                if let Some(m) = &self.metrics {
                    m.oom_kills(&self.scenario.workloads[p.workload].namespace, 1);
                }
                self.oom_by_workload[p.workload] += 1;
                let shown = self.usage.oom_kill(key, self.now, mem, p.memory as f64);
                self.observed.push(shown);
                killed.push(p.key.clone());
            } else if let Some(node) = &p.node {
                let n = on_node.entry(node.clone()).or_default();
                n.0 += mem;
                n.1.push((p.key.clone(), mem - p.memory as f64));
            }
        }
        // A limit above the request lets a pod use memory nobody reserved: when a node's
        // pods use more than its allocatable memory, the kernel kills the pod furthest
        // above its request (the kubelet's oom_score_adj for Burstable pods orders them
        // so), as many as it takes.
        for (node, (mut used, mut pods)) in on_node {
            let Some(allocatable) = self
                .nodes
                .iter()
                .find(|n| n.name == node)
                .map(|n| n.allocatable.get(&Dimension::Memory) as f64)
            else {
                continue;
            };
            pods.sort_by(|a, b| b.1.total_cmp(&a.1));
            for (key, above) in pods {
                if used <= allocatable || above <= 0.0 {
                    break;
                }
                let Some(p) = self.pods.iter().find(|p| p.key == key) else {
                    continue;
                };
                let mem = p.memory as f64 + above;
                used -= mem;
                self.ooms += 1;
                if let Some(m) = &self.metrics {
                    m.oom_kills(&self.scenario.workloads[p.workload].namespace, 1);
                }
                self.oom_by_workload[p.workload] += 1;
                let usage = usage_key(&self.scenario.workloads[p.workload], p.ordinal);
                let shown = self.usage.oom_kill(usage, self.now, mem, p.memory as f64);
                self.observed.push(shown);
                killed.push(key);
            }
        }
        self.killed = killed;
        (cpu_used, mem_used)
    }

    /// Tailor answers an OOM kill at once, as the agent does when a pod shows one: a
    /// round, from which the killed workload's memory is bumped and the container restarts
    /// at the new size (in place when its node has room, otherwise the pod is recreated
    /// elsewhere).
    async fn answer_ooms(&mut self) {
        let killed = std::mem::take(&mut self.killed);
        if killed.is_empty() || !self.settings.applies_rightsizing() {
            return;
        }
        let recommendations = self.recommendations().await;
        for key in killed {
            let Some(i) = self.pods.iter().position(|p| p.key == key) else {
                continue;
            };
            let w = self.pods[i].workload;
            let next = recommendations[w]
                .clone()
                .and_then(|r| self.take(w, r, true))
                .unwrap_or(self.sizes[w]);
            let left = self.resize_in_place(w, next);
            // The killed container cannot restart at its old size: without room on
            // its node, the pod is recreated elsewhere.
            if left.contains(&key)
                && let Some(p) = self.pods.iter_mut().find(|p| p.key == key)
            {
                p.cpu = next.cpu;
                p.memory = next.memory;
                p.memory_limit = next.memory_limit;
                p.node = None;
                p.running = false;
                p.pending_since = Some(self.now);
                p.pending_cause = "oom-moved";
            }
        }
    }

    /// The workloads as the right-sizing service reads them: a Deployment each, its
    /// template asking the workload's current size.
    fn rightsizing_snapshot(&self) -> Snapshot {
        use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
        use k8s_openapi::api::core::v1::{
            Container, PodSpec, PodTemplateSpec, ResourceRequirements,
        };
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
        let mut snapshot = Snapshot::default();
        for (w, s) in self.scenario.workloads.iter().zip(&self.sizes) {
            let list = |pairs: &[(&str, String)]| {
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.clone())))
                    .collect::<BTreeMap<_, _>>()
            };
            let container = Container {
                name: USAGE_CONTAINER.to_string(),
                resources: Some(ResourceRequirements {
                    requests: Some(list(&[
                        ("cpu", format!("{}m", s.cpu)),
                        ("memory", s.memory.to_string()),
                    ])),
                    limits: Some(list(&[("memory", s.memory_limit.to_string())])),
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            };
            snapshot.deployments.push(Deployment {
                metadata: ObjectMeta {
                    name: Some(w.name.clone()),
                    namespace: Some(w.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(DeploymentSpec {
                    template: PodTemplateSpec {
                        spec: Some(PodSpec {
                            containers: vec![container],
                            ..PodSpec::default()
                        }),
                        ..PodTemplateSpec::default()
                    },
                    ..DeploymentSpec::default()
                }),
                ..Deployment::default()
            });
        }
        snapshot
    }

    /// A right-sizing round through the service the agent's controller runs: the usage
    /// since each workload's checkpoint and the OOM kills the pods showed, all workloads
    /// sized together under the run's policy. Per workload, its recommendation.
    async fn recommendations(&mut self) -> Vec<Option<ContainerRecommendation>> {
        let snapshot = self.rightsizing_snapshot();
        let workloads = Workloads::from_snapshot(&snapshot);
        let policies = Policies::only(self.settings.policy.clone());
        let observed = std::mem::take(&mut self.observed);
        let outcome = recommend_workloads(
            &self.usage,
            ServiceRequest {
                snapshot: &snapshot,
                workloads: &workloads,
                policies: &policies,
                namespaces: &[],
                history: None,
                step: self.scenario.step,
                now: self.now,
                largest_node: self.context.largest_node,
                prices: self.context.prices,
                resume: Resume::PerWorkload(std::mem::take(&mut self.checkpoints)),
                keep_hours: false,
                ooms: &observed,
            },
        )
        .await;
        // The recorded source cannot fail; were it to, the round would leave every size.
        let Ok(outcome) = outcome else {
            return vec![None; self.scenario.workloads.len()];
        };
        self.checkpoints = outcome.checkpoints;
        if let Some(until) = self.checkpoints.values().map(|c| c.until).min() {
            self.usage.forget_before(until);
        }
        let index: BTreeMap<(&str, &str), usize> = self
            .scenario
            .workloads
            .iter()
            .enumerate()
            .map(|(i, w)| ((w.namespace.as_str(), w.name.as_str()), i))
            .collect();
        let mut out = vec![None; self.scenario.workloads.len()];
        for c in outcome.containers {
            if let Some(&i) = index.get(&(c.workload.namespace.as_str(), c.workload.name.as_str()))
            {
                out[i] = Some(c.recommendation);
            }
        }
        out
    }

    /// Takes workload `w`'s recommendation `r`; with `oom`, only a memory increase is
    /// taken. Returns the new size when it changed.
    fn take(&mut self, w: usize, r: ContainerRecommendation, oom: bool) -> Option<Sizes> {
        let s = self.sizes[w];
        let current = Requests {
            cpu: Some(s.cpu),
            memory: Some(s.memory),
            cpu_limit: None,
            memory_limit: Some(s.memory_limit),
        };
        if !oom {
            self.last_recommendation[w] = r
                .recommended
                .cpu
                .map(|_| (r.actionable, r.hourly_cost_delta));
        }
        // The recommendation is the whole target; a change moves at most the policy's
        // step towards it (an OOM-driven memory increase whole), as actuation does.
        let applied =
            crate::rightsizing::recommender::next_step(current, &r, self.settings.policy.max_step);
        let (Some(cpu), Some(memory)) = (applied.cpu, applied.memory) else {
            return None;
        };
        let mut next = Sizes {
            cpu,
            memory,
            memory_limit: applied.memory_limit.unwrap_or(memory).max(memory),
        };
        if oom {
            if next.memory <= s.memory {
                return None;
            }
            next.cpu = s.cpu;
        } else if !r.actionable || next == s {
            return None;
        }
        // The reasons of the last change made, not of later rounds that left the size
        // alone ("within 10%: unchanged" would contradict the change shown beside it).
        if !oom {
            self.last_reasons[w] = r.reasons;
        }
        self.sizes[w] = next;
        Some(next)
    }

    /// A right-sizing round: recommendations for every workload; in autonomous mode the
    /// actionable ones become the workload's size and running pods are resized in place
    /// where their node has room.
    async fn rightsize(&mut self) -> usize {
        let started = std::time::Instant::now();
        let recommendations = self.recommendations().await;
        let mut changed = 0;
        let mut available = 0.0;
        for (w, r) in recommendations.into_iter().enumerate() {
            let before = self.sizes[w];
            let Some(next) = r.and_then(|r| self.take(w, r, false)) else {
                continue;
            };
            changed += 1;
            if !self.settings.applies_rightsizing() {
                self.sizes[w] = before; // reported only
                let pods = self.pods.iter().filter(|p| p.workload == w).count();
                if let Some((true, delta)) = self.last_recommendation[w] {
                    available += (-delta).max(0.0) * pods as f64;
                }
                continue;
            }
            self.applied += 1;
            if let Some(m) = &self.metrics {
                m.recommendation_applied(&self.scenario.workloads[w].namespace);
            }
            self.resize_in_place(w, next);
        }
        if let Some(m) = &self.metrics {
            let seconds = started.elapsed().as_secs_f64();
            m.observe_decision("rightsizing", seconds);
            m.reconcile(Controller::Rightsizing, seconds, false);
            let covered = self.last_recommendation.iter().flatten().count();
            m.set_rightsizing_containers(covered);
            let stale = self
                .last_recommendation
                .iter()
                .flatten()
                .filter(|(actionable, _)| !actionable)
                .count();
            let applied = (0..self.sizes.len())
                .filter(|&w| {
                    let original = &self.scenario.workloads[w];
                    self.sizes[w].cpu != original.cpu_request
                        || self.sizes[w].memory != original.memory_request
                })
                .count();
            let actionable = if self.settings.applies_rightsizing() {
                0
            } else {
                changed
            };
            m.set_recommendations(RecommendationState::Actionable, actionable);
            m.set_recommendations(RecommendationState::Applied, applied);
            m.set_recommendations(RecommendationState::Stale, stale);
            m.set_savings_available(SavingsSource::Rightsizing, available);
            // The simulated usage is read every step: the newest sample is this step's.
            m.set_usage_data_age(0.0);
        }
        changed
    }

    /// Resizes the running pods of workload `w` to `next` where their node has room;
    /// pods not yet running take it at once. Returns the pods left at their old size.
    fn resize_in_place(&mut self, w: usize, next: Sizes) -> Vec<String> {
        let mut used: BTreeMap<String, (i64, i64)> = BTreeMap::new();
        for p in &self.pods {
            if let Some(n) = &p.node {
                let e = used.entry(n.clone()).or_default();
                e.0 += p.cpu;
                e.1 += p.memory;
            }
        }
        let mut left = Vec::new();
        for p in self.pods.iter_mut().filter(|p| p.workload == w) {
            let node = p
                .node
                .as_deref()
                .and_then(|n| self.nodes.iter().find(|x| x.name == n));
            let fits = match node {
                None => true, // pending, or on a node still starting: takes the new size
                Some(node) => {
                    let e = used.entry(node.name.clone()).or_default();
                    let cpu_after = e.0 - p.cpu + next.cpu;
                    let mem_after = e.1 - p.memory + next.memory;
                    let ok = cpu_after <= node.allocatable.get(&Dimension::Cpu)
                        && mem_after <= node.allocatable.get(&Dimension::Memory);
                    if ok {
                        *e = (cpu_after, mem_after);
                    }
                    ok
                }
            };
            if fits {
                p.cpu = next.cpu;
                p.memory = next.memory;
                p.memory_limit = next.memory_limit;
            } else {
                left.push(p.key.clone());
            }
        }
        left
    }

    /// Per namespace: requests before right-sizing and now, their hourly cost against the
    /// cost of what is used, and the hour's realised right-sizing saving.
    fn record_namespaces(&self, m: &Metrics) {
        let prices = &self.context.prices;
        let value = |cores: f64, bytes: f64| {
            cores * prices.per_core_hour + bytes / GIB * prices.per_gib_hour
        };
        // (original cores, original bytes, current cores, current bytes)
        let mut requests: BTreeMap<&str, (f64, f64, f64, f64)> = BTreeMap::new();
        for p in self.pods.iter().filter(|p| p.running) {
            let w = &self.scenario.workloads[p.workload];
            let r = requests.entry(w.namespace.as_str()).or_default();
            r.0 += w.cpu_request as f64 / 1000.0;
            r.1 += w.memory_request as f64;
            r.2 += p.cpu as f64 / 1000.0;
            r.3 += p.memory as f64;
        }
        let mut realised = 0.0;
        for (namespace, (cpu0, mem0, cpu, mem)) in &requests {
            m.set_namespace_requests(namespace, When::Before, *cpu0, *mem0);
            m.set_namespace_requests(namespace, When::After, *cpu, *mem);
            m.set_namespace_cost(namespace, Usage::Requested, value(*cpu, *mem));
            let (cpu_used, mem_used) = self
                .used_by_namespace
                .get(*namespace)
                .copied()
                .unwrap_or_default();
            m.set_namespace_cost(namespace, Usage::Used, value(cpu_used, mem_used));
            realised += (value(*cpu0, *mem0) - value(*cpu, *mem)).max(0.0);
        }
        // Sampled hourly: the hour's saving is the rate times one hour.
        m.savings_realised(SavingsSource::Rightsizing, realised);
        m.set_snapshot_objects("Pod", self.pods.len());
        m.set_snapshot_objects("Node", self.nodes.len());
    }

    fn sample(&mut self, cpu_used: f64, mem_used: f64, cloud: &SimulatedAzure) -> Sample {
        let mut nodes_by_type = BTreeMap::new();
        let mut cost_by_type: BTreeMap<(String, String, String, String), f64> = BTreeMap::new();
        let mut count_by_type: BTreeMap<(String, String, String, String), usize> = BTreeMap::new();
        for n in &self.nodes {
            *nodes_by_type.entry(n.instance_type.clone()).or_default() += 1;
            let pool = n.labels.get(labels::NODE_POOL).cloned().unwrap_or_default();
            let key = (
                pool,
                n.instance_type.clone(),
                n.capacity_type.as_str().to_string(),
                n.zone.clone(),
            );
            *count_by_type.entry(key.clone()).or_default() += 1;
            *cost_by_type.entry(key).or_default() += n.price;
        }
        if let Some(m) = &self.metrics {
            for (pool, t, capacity, zone) in self
                .reported_types
                .iter()
                .filter(|k| !cost_by_type.contains_key(*k))
            {
                m.set_node_cost(pool, t, capacity, zone, 0.0);
                m.set_nodes(pool, t, capacity, zone, 0);
            }
            for ((pool, t, capacity, zone), cost) in &cost_by_type {
                m.set_node_cost(pool, t, capacity, zone, *cost);
            }
            for ((pool, t, capacity, zone), n) in &count_by_type {
                m.set_nodes(pool, t, capacity, zone, *n);
            }
            self.reported_types = cost_by_type.keys().cloned().collect();
            self.record_namespaces(m);
        }
        let scheduled = self.pods.iter().filter(|p| p.node.is_some());
        let (cpu, mem) = scheduled.fold((0i64, 0i64), |a, p| (a.0 + p.cpu, a.1 + p.memory));
        Sample {
            t: self.now,
            hourly_cost: cloud.hourly_cost(),
            nodes_by_type,
            cpu_requested: cpu as f64 / 1000.0,
            cpu_used,
            memory_requested: mem as f64 / GIB,
            memory_used: mem_used / GIB,
            recommendations_applied: self.applied,
            pending: self.pods.iter().filter(|p| p.node.is_none()).count(),
            evicted: self.evicted,
            oom_kills: self.ooms,
        }
    }
}

impl Actuator for World<'_> {
    fn taint(&mut self, node: &str) -> impl Future<Output = Result<(), ActError>> + Send {
        let result = match self.nodes.iter_mut().find(|n| n.name == node) {
            Some(n) => {
                n.taints.push(Taint {
                    key: DISRUPTED_TAINT.to_string(),
                    effect: "NoSchedule".to_string(),
                    ..Taint::default()
                });
                Ok(())
            }
            None => Err(ActError::Failed(format!("node {node} not found"))),
        };
        ready(result)
    }

    fn evict(&mut self, pod: &str) -> impl Future<Output = Result<(), ActError>> + Send {
        let now = self.now;
        if let Some(i) = self.pods.iter().position(|p| p.key == pod) {
            if let Some(n) = self.pods[i].node.clone()
                && let Some(node) = self.nodes.iter_mut().find(|x| x.name == n)
            {
                node.last_pod_event = now;
            }
            if self.is_daemon(&self.pods[i]) {
                self.pods.remove(i);
            } else {
                // The controller recreates it; it is pending until placed.
                let sizes = self.sizes[self.pods[i].workload];
                let p = &mut self.pods[i];
                p.node = None;
                p.running = false;
                p.pending_since = Some(now);
                p.pending_cause = "evicted";
                p.cpu = sizes.cpu;
                p.memory = sizes.memory;
                p.memory_limit = sizes.memory_limit;
                self.evicted += 1;
                self.evicted_by_workload[p.workload] += 1;
                if let Some(m) = &self.metrics {
                    m.eviction();
                }
            }
        }
        ready(Ok(()))
    }

    fn delete_node(&mut self, node: &str) -> impl Future<Output = Result<(), ActError>> + Send {
        if let Some(m) = &self.metrics {
            let pool = self
                .nodes
                .iter()
                .find(|n| n.name == node)
                .and_then(|n| n.labels.get(labels::NODE_POOL))
                .map_or("", String::as_str);
            m.nodeclaim_terminated(pool, "consolidation");
        }
        self.remove_node(node);
        ready(Ok(()))
    }
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let i = ((values.len() as f64 - 1.0) * p).round() as usize;
    values[i.min(values.len() - 1)]
}

/// Runs `scenario` in one mode; `progress` is told the share done (0..1) now and then.
/// With `metrics`, launches, terminations, provisioning latency and node cost are
/// recorded as they happen (what `/metrics` serves).
pub async fn run(
    scenario: &Scenario,
    settings: &RunSettings,
    instance_types: Vec<InstanceType>,
    metrics: Option<&Metrics>,
    progress: &mut dyn FnMut(f64),
) -> RunResult {
    let start = Timestamp::from_second(scenario.start).unwrap_or(Timestamp::UNIX_EPOCH);
    let clock = VirtualClock::new(start);
    let sim_settings = SimSettings {
        region: scenario.region.clone(),
        ..SimSettings::default()
    };
    let cloud = SimulatedAzure::new(
        Arc::new(clock.clone()),
        instance_types.clone(),
        sim_settings.clone(),
    );
    let pools = vec![
        node_pool("spot", labels::CAPACITY_TYPE_SPOT, 10, &instance_types),
        node_pool(
            "default",
            labels::CAPACITY_TYPE_ON_DEMAND,
            0,
            &instance_types,
        ),
    ];
    let templates: Vec<PodInfo> = scenario
        .workloads
        .iter()
        .map(|w| {
            let mut info = pod_info(&w.namespace, &w.name, w.kind, &w.name);
            if w.kind == Kind::Job {
                // Batch work runs on spot when there is spot.
                info.tolerations
                    .push(k8s_openapi::api::core::v1::Toleration {
                        key: Some(SPOT_TAINT.to_string()),
                        operator: Some("Exists".to_string()),
                        effect: Some("NoSchedule".to_string()),
                        ..Default::default()
                    });
            }
            info
        })
        .collect();
    let daemon_sets = scenario
        .workloads
        .iter()
        .filter(|w| w.kind == Kind::DaemonSet)
        .map(|w| DaemonSetInfo {
            key: format!("{}/{}", w.namespace, w.name),
            requests: resources(w.cpu_request, w.memory_request),
            node_requirements: Default::default(),
            tolerations: Vec::new(),
            host_ports: Vec::new(),
            written: None,
        })
        .collect();
    let largest = pools
        .iter()
        .flat_map(|p| p.instance_types.iter())
        .map(|t| {
            (
                t.allocatable.get(&Dimension::Cpu),
                t.allocatable.get(&Dimension::Memory),
            )
        })
        .fold((0, 0), |a, b| (a.0.max(b.0), a.1.max(b.1)));
    let context = Context {
        largest_node: Some(largest),
        prices: Prices::from_instance_types(&pools[1].instance_types),
        ..Context::default()
    };
    let mut world = World {
        scenario,
        settings,
        pools,
        templates,
        daemon_sets,
        nodes: Vec::new(),
        pods: Vec::new(),
        sizes: scenario
            .workloads
            .iter()
            .map(|w| Sizes {
                cpu: w.cpu_request,
                memory: w.memory_request,
                memory_limit: w.memory_limit,
            })
            .collect(),
        next_ordinal: vec![0; scenario.workloads.len()],
        launching: BTreeMap::new(),
        // Memory is read at the usage step: each sample is its own peak.
        usage: Recorded::new(scenario.step),
        checkpoints: BTreeMap::new(),
        observed: Vec::new(),
        killed: Vec::new(),
        oom_by_workload: vec![0; scenario.workloads.len()],
        evicted_by_workload: vec![0; scenario.workloads.len()],
        last_reasons: vec![Vec::new(); scenario.workloads.len()],
        context,
        now: scenario.start,
        latencies: Vec::new(),
        evicted: 0,
        ooms: 0,
        applied: 0,
        pending_seconds: 0.0,
        pending_by_cause: BTreeMap::new(),
        spot_interruptions: 0,
        launched_per_hour: 0.0,
        metrics: metrics.cloned(),
        reported_types: Default::default(),
        last_recommendation: vec![None; scenario.workloads.len()],
        used_by_namespace: BTreeMap::new(),
        demand: disruption::forecast::DemandHistory::holding_the_peak_until_a_day(),
        expected: BTreeMap::new(),
        batcher: Batcher::default(),
        batch_pods: Default::default(),
        last_round: None,
        clock: clock.clone(),
        launch_latency: sim_settings.launch_latency.as_secs(),
    };
    if let Some(m) = metrics {
        // Per-namespace counters start at zero: a namespace without OOM kills shows 0.
        for w in &scenario.workloads {
            m.oom_kills(&w.namespace, 0);
            m.recommendation_applied_by(&w.namespace, 0);
        }
    }
    let metered: Cloud = MeteredCloud::new(cloud.clone(), metrics.cloned());
    // Every run provisions: pods need nodes whatever the mode (recommend-only leaves
    // right-sizing and disruption to report).
    let mut provisioner = Provisioner::new(
        metered.clone(),
        Mode::Autonomous,
        Options {
            cost_aware: settings.cost_aware,
            ..Options::default()
        },
        metrics.cloned(),
    );
    // Replacements count in the launch metrics like the provisioner's launches.
    let mut disrupter = Disrupter::new(
        metered.clone(),
        settings.mode,
        settings.disruption.clone(),
        // Validated before it is submitted ([`Validation`]).
        SignedDuration::ZERO,
    )
    .with_metrics(metrics.cloned());
    // The cluster runs when the week begins, as a cluster does when Tailor is installed
    // into it: the pods as deployed are placed and their nodes launched in the minutes
    // before, and that bring-up counts in none of the run's figures.
    world.now = scenario.start - WARM_UP;
    clock.set(Timestamp::from_second(world.now).unwrap_or(start));
    world.reconcile_workloads();
    while world.now < scenario.start {
        world.provision(&mut provisioner).await;
        world.now += SUB_STEP;
        clock.set(world.timestamp());
        world.register(&metered).await;
    }
    world.latencies.clear();
    world.pending_seconds = 0.0;
    world.pending_by_cause.clear();
    let launched_before = cloud.launches();
    let end = scenario.start + i64::from(scenario.days) * 86_400;
    let mut samples = Vec::new();
    let mut recommended = 0usize;
    let mut last_report = disruption::Report::default();
    // Autonomous mode carries out one decision at a time and evaluates again when it is
    // done, as the agent does; recommend-only mode reports every decision of a pass.
    let evaluation = if settings.mode == Mode::Autonomous {
        disruption::Settings {
            all: false,
            ..settings.disruption.clone()
        }
    } else {
        settings.disruption.clone()
    };
    let mut consolidating = false;
    // As in the agent, a decision is carried out once deciding again after the validation
    // delay gives the same one; the Disrupter then re-validates it and starts at once.
    let mut validation = Validation::new(DEFAULT_VALIDATION_DELAY);
    // The command this pass started last: once it is aborted, the pass decides no more.
    let mut latest: Option<usize> = None;
    // Realised consolidation savings: the $/hour of decisions done and not yet bought
    // back by provisioning, integrated over time.
    let mut credited = BTreeSet::new();
    let mut credit_per_hour = 0.0;
    let mut launched_seen = world.launched_per_hour;
    let mut realised = 0.0;
    let steps = (end - scenario.start) / scenario.step;
    for step in 0..steps {
        world.now = scenario.start + step * scenario.step;
        clock.set(Timestamp::from_second(world.now).unwrap_or(start));
        // Azure runs out of the cheapest general-purpose size in one zone for half a day;
        // launches fall back to the next candidates.
        let since = world.now - scenario.start;
        if since == scenario.capacity_outage.0 {
            for zone in ["eastus-1", "eastus-2", "eastus-3"] {
                cloud.inject_no_capacity(
                    scenario.capacity_outage_type,
                    zone,
                    CapacityType::OnDemand,
                );
            }
        } else if since == scenario.capacity_outage.1 {
            for zone in ["eastus-1", "eastus-2", "eastus-3"] {
                cloud.clear_no_capacity(
                    scenario.capacity_outage_type,
                    zone,
                    CapacityType::OnDemand,
                );
            }
        }
        world.interruptions(&metered).await;
        world.register(&metered).await;
        if (world.now - scenario.start) % 3600 == 0 {
            world.reconcile_workloads();
        }
        let started = std::time::Instant::now();
        world.provision(&mut provisioner).await;
        if let Some(m) = &world.metrics {
            m.reconcile(
                Controller::Provisioning,
                started.elapsed().as_secs_f64(),
                false,
            );
            m.set_pods_pending(world.pods.iter().filter(|p| p.node.is_none()).count());
        }
        let (cpu_used, mem_used) = world.usage();
        world.answer_ooms().await;
        if since >= 86_400 && since % settings.rightsizing_every == 0 {
            recommended = world.rightsize().await;
        }
        if since % settings.disruption_every == 0
            && !disrupter.busy()
            && (settings.mode != Mode::Autonomous || world.launching.is_empty())
        {
            let report = world.evaluate_disruption(&evaluation);
            consolidating = !report.decisions.is_empty();
            latest = None;
            if settings.mode == Mode::Autonomous {
                let now = Clock::now(&clock);
                if let Some(d) = validation.offer(now, report.decisions.first().cloned()) {
                    latest = Some(disrupter.commands().len());
                    disrupter.submit(now, vec![d]);
                }
            }
            last_report = report;
        }
        world.headroom(&mut provisioner).await;
        // Launches and disruption move in finer steps than usage: nodes register as they
        // come up; decisions validate, launch and drain; pods a drain evicted or a node
        // left behind are placed within seconds, as kube-scheduler and the provisioner
        // place them, not at the next usage step. Pending time is counted at the same
        // grain.
        let mut stepped = 0;
        for _ in 0..(scenario.step / SUB_STEP).max(1) {
            let waiting = world.pods.iter().any(|p| p.node.is_none());
            // As the agent's disruption controller: one decision at a time, the next taken
            // on the cluster the last one left, once nothing is launching.
            if consolidating
                && settings.mode == Mode::Autonomous
                && !disrupter.busy()
                && world.launching.is_empty()
            {
                // A decision the cluster no longer bore out waits for the next pass: the
                // cluster has moved, and deciding again at once would find the same.
                if latest.is_some_and(|i| {
                    matches!(
                        disrupter.commands().get(i).map(|c| &c.phase),
                        Some(Phase::Aborted(_))
                    )
                }) {
                    consolidating = false;
                    validation.clear();
                } else {
                    let report = world.evaluate_disruption(&evaluation);
                    consolidating = !report.decisions.is_empty();
                    let now = Clock::now(&clock);
                    if let Some(d) = validation.offer(now, report.decisions.first().cloned()) {
                        latest = Some(disrupter.commands().len());
                        disrupter.submit(now, vec![d]);
                    }
                    last_report = report;
                }
            }
            if !disrupter.busy() && world.launching.is_empty() && !waiting && !validation.pending()
            {
                break;
            }
            let view = world.view();
            disrupter.tick(Clock::now(&clock), &view, &mut world).await;
            world.register(&metered).await;
            world.provision(&mut provisioner).await;
            world.count_pending(SUB_STEP as f64);
            stepped += SUB_STEP;
            world.now += SUB_STEP;
            clock.set(world.timestamp());
        }
        world.now = scenario.start + step * scenario.step;
        for (i, c) in disrupter.commands().iter().enumerate() {
            if c.phase == Phase::Done && credited.insert(i) {
                credit_per_hour += c.decision.savings_per_hour.max(0.0);
            }
        }
        let bought = world.launched_per_hour - launched_seen;
        launched_seen = world.launched_per_hour;
        credit_per_hour = (credit_per_hour - bought).max(0.0);
        realised += credit_per_hour * scenario.step as f64 / 3600.0;
        if let Some(m) = &world.metrics {
            let saved = credit_per_hour * scenario.step as f64 / 3600.0;
            m.savings_realised(SavingsSource::Consolidation, saved);
        }
        world.count_pending((scenario.step - stepped).max(0) as f64);
        if since % 3600 == 0 {
            if let Some(m) = &world.metrics
                && let Ok(types) = metered.instance_types().await
            {
                let unavailable = types
                    .iter()
                    .flat_map(|t| &t.offerings)
                    .filter(|o| !o.available)
                    .count();
                m.set_unavailable_offerings(unavailable);
            }
            samples.push(world.sample(cpu_used, mem_used, &cloud));
            progress((step + 1) as f64 / steps as f64);
        }
    }
    let done: Vec<_> = disrupter
        .commands()
        .iter()
        .filter(|c| c.phase == Phase::Done)
        .collect();
    let first = samples
        .get(1)
        .or(samples.first())
        .cloned()
        .unwrap_or_default();
    let last = samples.last().cloned().unwrap_or_default();
    let mut latencies = world.latencies.clone();
    let summary = RunSummary {
        nodes_start: first.nodes_by_type.values().sum(),
        nodes_end: last.nodes_by_type.values().sum(),
        hourly_cost_start: first.hourly_cost,
        hourly_cost_end: last.hourly_cost,
        total_cost: samples.iter().map(|s| s.hourly_cost).sum(),
        cpu_requested_end: last.cpu_requested,
        memory_requested_end: last.memory_requested,
        requests_value_per_hour: last.cpu_requested * world.context.prices.per_core_hour
            + last.memory_requested * world.context.prices.per_gib_hour,
        recommendations: if settings.applies_rightsizing() {
            world.applied
        } else {
            recommended
        },
        decisions: if settings.mode == Mode::Autonomous {
            done.len()
        } else {
            last_report.decisions.len()
        },
        consolidation_savings_per_hour: if settings.mode == Mode::Autonomous {
            done.iter().map(|c| c.decision.savings_per_hour).sum()
        } else {
            last_report
                .decisions
                .iter()
                .map(|d| d.savings_per_hour)
                .sum()
        },
        consolidation_realised_savings: realised,
        pods_evicted: world.evicted,
        oom_kills: world.ooms,
        provisioning_p50_seconds: percentile(&mut latencies, 0.5),
        provisioning_p99_seconds: percentile(&mut latencies, 0.99),
        pending_pod_hours: world.pending_seconds / 3600.0,
        pending_pod_hours_by_cause: world
            .pending_by_cause
            .iter()
            .map(|(cause, seconds)| (cause.to_string(), seconds / 3600.0))
            .collect(),
        launches: cloud.launches() - launched_before,
        launches_before_start: launched_before,
        spot_interruptions: world.spot_interruptions,
    };
    let workloads = scenario
        .workloads
        .iter()
        .enumerate()
        .map(|(i, w)| WorkloadOutcome {
            workload: format!("{}/{}", w.namespace, w.name),
            kind: w.kind.as_str().to_string(),
            cpu: (w.cpu_request, world.sizes[i].cpu),
            memory: (w.memory_request, world.sizes[i].memory),
            reasons: world.last_reasons[i].clone(),
            oom_kills: world.oom_by_workload[i],
            evictions: world.evicted_by_workload[i],
        })
        .collect();
    RunResult {
        mode: settings.name().to_string(),
        samples,
        workloads,
        summary,
    }
}
