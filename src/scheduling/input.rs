//! What the scheduler decides over: pending pods, existing nodes with their pods, NodePools
//! with the instance types they may buy, and DaemonSets. Built from a snapshot and a
//! catalog; pure.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

// Fx hashing: the keys are the cluster's own uids.
use rustc_hash::FxHashMap as HashMap;

use k8s_openapi::api::core::v1::{Pod, PodSpec, Taint, Toleration};
use rayon::prelude::*;

use super::PoolTypes;
use super::pod::{HostPort, PodError, PodInfo, WrittenPlacement};
use crate::apis::{AKSNodeClass, NodePool, NodeRequirement, RequirementOperator, labels};
use crate::model::pod::{node_requirements, parse_quantities, pod_requests};
use crate::model::{
    NodeRequirements, NodeSettings, OverheadModel, Requirement, Requirements, Resources,
};
use crate::state::Snapshot;

/// The input, or the first pod that could not be read: a plan of a whole snapshot needs
/// every pod.
fn refuse_unreadable((input, unreadable): (Input, Vec<PodError>)) -> Result<Input, InputError> {
    match unreadable.into_iter().next() {
        Some(e) => Err(InputError::Pod(e)),
        None => Ok(input),
    }
}

/// The fewest pods one core reads on its own when a snapshot's pods are read on every
/// core: below this, handing pods to another core costs more than it saves.
const PODS_PER_RUN: usize = 512;

/// Pods read per round: large enough to keep every core busy, small enough that pods
/// handed over ([`Input::from_snapshot_taking_pods`]) are freed while the rest are read.
const PODS_PER_READ: usize = 8192;

/// What each pod read as, by uid, at the resourceVersion it was read at: a pod is the same
/// until its resourceVersion changes, so a controller that builds its input on every pass
/// reads only the pods that changed ([`Input::from_snapshot_remembering`]).
#[derive(Debug, Default)]
pub struct PodMemo {
    by_uid: HashMap<String, (String, Arc<PodInfo>)>,
}

impl PodMemo {
    fn get(&self, uid: &str, resource_version: &str) -> Option<Arc<PodInfo>> {
        self.by_uid
            .get(uid)
            .filter(|(rv, _)| rv == resource_version)
            .map(|(_, info)| info.clone())
    }

    /// Pods remembered (those of the last snapshot read).
    pub fn len(&self) -> usize {
        self.by_uid.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.by_uid.is_empty()
    }
}

/// Why the scheduler's input could not be built from a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// A pod's constraints do not parse.
    #[error(transparent)]
    Pod(#[from] PodError),
    /// A NodePool is invalid.
    #[error("nodepool {pool}: {field}: {message}")]
    NodePool {
        /// The NodePool.
        pool: String,
        /// The field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A node's allocatable does not parse.
    #[error("node {node}: {message}")]
    Node {
        /// The node.
        node: String,
        /// What is wrong.
        message: String,
    },
    /// The catalog could not provide instance types.
    #[error("instance types: {0}")]
    Catalog(String),
    /// A DaemonSet's pod template does not parse.
    #[error("daemonset {daemon_set}: {message}")]
    DaemonSet {
        /// `namespace/name`.
        daemon_set: String,
        /// What is wrong.
        message: String,
    },
}

/// A node that exists, with the pods bound to it.
#[derive(Debug, Clone)]
pub struct ExistingNode {
    /// Node name.
    pub name: String,
    /// Labels (aliases are matched too).
    pub labels: BTreeMap<String, String>,
    /// Taints.
    pub taints: Vec<Taint>,
    /// Allocatable resources.
    pub allocatable: Resources,
    /// Pods bound to it, shared: the disruption pass weighs many what-ifs over the same
    /// nodes, and each copies the node list, not the pods.
    pub pods: Vec<Arc<PodInfo>>,
    /// `spec.unschedulable` (cordoned).
    pub unschedulable: bool,
    /// What the scheduler derives from the labels, shared by the node's copies.
    pub derived: LabelMemo,
}

/// What the scheduler derives from a node's labels (their canonical form, and the
/// requirements that pin each to its value), worked out on the first copy of the node a
/// pass schedules on and shared by the rest: a disruption pass schedules on a copy of the
/// cluster for every candidate it weighs. Kept with the labels it was derived from, so a
/// copy whose labels were changed derives its own.
#[derive(Debug, Clone, Default)]
pub struct LabelMemo(Arc<OnceLock<Derived>>);

type Derived = (
    BTreeMap<String, String>,
    Arc<BTreeMap<String, String>>,
    Arc<Requirements>,
);

impl LabelMemo {
    /// The derivation `derive` makes of `labels`, made once for these labels.
    pub(crate) fn get_or_derive(
        &self,
        labels: &BTreeMap<String, String>,
        derive: impl Fn(&BTreeMap<String, String>) -> (BTreeMap<String, String>, Requirements),
    ) -> (Arc<BTreeMap<String, String>>, Arc<Requirements>) {
        let made = |l: &BTreeMap<String, String>| {
            let (canonical, requirements) = derive(l);
            (Arc::new(canonical), Arc::new(requirements))
        };
        let (source, canonical, requirements) = self.0.get_or_init(|| {
            let (c, r) = made(labels);
            (labels.clone(), c, r)
        });
        if source == labels {
            (canonical.clone(), requirements.clone())
        } else {
            made(labels)
        }
    }
}

/// Upper bounds on what a NodePool may own. Absent keys are unlimited.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Limits {
    /// Resource limits (cpu in millicores, memory in bytes, ...).
    pub resources: Resources,
    /// Which dimensions of `resources` are limited.
    pub limited: Vec<crate::model::Dimension>,
    /// Node count limit.
    pub nodes: Option<i64>,
}

/// A NodePool as the scheduler uses it.
#[derive(Debug, Clone)]
pub struct Pool {
    /// Name.
    pub name: String,
    /// Higher weights are tried first.
    pub weight: i32,
    /// Requirements every node of the pool satisfies (template labels included as
    /// single-valued requirements).
    pub requirements: Requirements,
    /// `spec.template.spec.requirements` as written, for the plan validator (which checks
    /// new nodes against these rather than against `requirements`).
    pub written_requirements: Vec<NodeRequirement>,
    /// Template labels.
    pub labels: BTreeMap<String, String>,
    /// Taints pods must tolerate.
    pub taints: Vec<Taint>,
    /// Taints present only while the node starts; pods need not tolerate them.
    pub startup_taints: Vec<Taint>,
    /// Instance types the pool may buy (already built with its node class's overhead
    /// model and maxPods), compatible with its requirements.
    pub instance_types: PoolTypes,
    /// Limits.
    pub limits: Limits,
    /// What the pool owns already (existing nodes and in-flight claims): capacity and node
    /// count.
    pub in_use: Resources,
    /// Nodes the pool owns already.
    pub nodes_in_use: i64,
}

/// A DaemonSet: its pods run on every node they tolerate and select.
#[derive(Debug, Clone)]
pub struct DaemonSetInfo {
    /// `namespace/name`.
    pub key: String,
    /// Requests of one of its pods.
    pub requests: Resources,
    /// Where its pods may run.
    pub node_requirements: NodeRequirements,
    /// Its pods' tolerations.
    pub tolerations: Vec<Toleration>,
    /// Host ports its pods bind.
    pub host_ports: Vec<HostPort>,
    /// Its pod template's placement fields as written, for the plan validator.
    pub written: Option<Arc<WrittenPlacement>>,
}

/// The scheduler's whole input.
#[derive(Debug, Clone, Default)]
pub struct Input {
    /// Pods to place.
    pub pending: Vec<PodInfo>,
    /// Existing nodes.
    pub nodes: Vec<ExistingNode>,
    /// NodePools, highest weight first.
    pub pools: Vec<Pool>,
    /// DaemonSets.
    pub daemon_sets: Vec<DaemonSetInfo>,
}

/// Node settings (overhead model, maxPods, OS disk) for a NodePool's node class.
pub fn node_settings(class: Option<&AKSNodeClass>) -> NodeSettings {
    let mut s = NodeSettings::default();
    if let Some(c) = class {
        s.overhead_model = match c.spec.overhead_model {
            crate::apis::OverheadModel::Brackets => OverheadModel::Brackets,
            crate::apis::OverheadModel::MaxPods => OverheadModel::MaxPods,
        };
        if let Some(m) = c.spec.max_pods.and_then(|m| u32::try_from(m).ok()) {
            s.max_pods = m;
        }
        if let Some(d) = c.spec.os_disk_size_gb.and_then(|d| u32::try_from(d).ok()) {
            s.os_disk_gib = d;
        }
    }
    s
}

/// Builds a scheduler pool from a NodePool and the instance types of its node class.
pub fn pool_from(np: &NodePool, instance_types: &PoolTypes) -> Result<Pool, InputError> {
    let name = np.metadata.name.clone().unwrap_or_default();
    let fail = |field: &str, message: String| InputError::NodePool {
        pool: name.clone(),
        field: field.to_string(),
        message,
    };
    let template = &np.spec.template;
    let mut requirements = Requirements::from_node_requirements(&template.spec.requirements)
        .map_err(|e| fail("spec.template.spec.requirements", e.to_string()))?;
    for (k, v) in &template.metadata.labels {
        requirements.add(Requirement::one_of(k, [v.clone()]));
    }
    requirements.add(Requirement::one_of(labels::NODE_POOL, [name.clone()]));
    let limits = parse_limits(&np.spec.limits).map_err(|m| fail("spec.limits", m))?;
    // Only instance types whose labels the pool's requirements admit (keys the instance
    // type does not define, such as custom template labels, are left to the pool).
    let instance_types = instance_types.admitted_by(&requirements);
    Ok(Pool {
        name: name.clone(),
        weight: np.spec.weight.unwrap_or(0),
        requirements,
        written_requirements: template.spec.requirements.clone(),
        labels: template.metadata.labels.clone(),
        taints: template.spec.taints.clone(),
        startup_taints: template.spec.startup_taints.clone(),
        instance_types,
        limits,
        in_use: Resources::zero(),
        nodes_in_use: 0,
    })
}

fn parse_limits(
    map: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
) -> Result<Limits, String> {
    let mut limits = Limits::default();
    let mut rest = BTreeMap::new();
    for (k, v) in map {
        if k == "nodes" {
            let n = crate::model::quantity::parse_value(&v.0).map_err(|e| e.to_string())?;
            limits.nodes = Some(n);
        } else {
            rest.insert(k.clone(), v.clone());
        }
    }
    limits.resources =
        parse_quantities(Some(&rest), "spec.limits").map_err(|e| e.source.to_string())?;
    limits.limited = rest
        .keys()
        .map(|k| crate::model::Dimension::from_name(k))
        .collect();
    Ok(limits)
}

fn daemon_set_info(key: String, spec: &PodSpec) -> Result<DaemonSetInfo, InputError> {
    let pod = Pod {
        spec: Some(spec.clone()),
        ..Default::default()
    };
    let info = PodInfo::from_pod(&pod).map_err(|e| InputError::DaemonSet {
        daemon_set: key.clone(),
        message: format!("{}: {}", e.field, e.message),
    })?;
    let requests = pod_requests(spec).map_err(|e| InputError::DaemonSet {
        daemon_set: key.clone(),
        message: e.to_string(),
    })?;
    let node_requirements = node_requirements(spec).map_err(|e| InputError::DaemonSet {
        daemon_set: key.clone(),
        message: e.to_string(),
    })?;
    // DaemonSet pods tolerate the node lifecycle taints the DaemonSet controller adds.
    let mut tolerations = spec.tolerations.clone().unwrap_or_default();
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/disk-pressure",
        "node.kubernetes.io/memory-pressure",
        "node.kubernetes.io/pid-pressure",
        "node.kubernetes.io/unschedulable",
    ] {
        tolerations.push(Toleration {
            key: Some(key.to_string()),
            operator: Some("Exists".to_string()),
            ..Default::default()
        });
    }
    Ok(DaemonSetInfo {
        key,
        requests,
        node_requirements,
        tolerations,
        host_ports: info.host_ports,
        written: info.written,
    })
}

impl Input {
    /// Builds the input from a snapshot. `instance_types` gives, for each node settings
    /// (from the pool's AKSNodeClass), the instance types on sale. A snapshot without
    /// NodePools gets one `default` pool allowing on-demand linux nodes of every type.
    /// The first pod whose spec cannot be read fails the whole input; see
    /// [`Input::from_snapshot_reading_around`] for the agent's reading.
    pub fn from_snapshot(
        snapshot: &Snapshot,
        instance_types: &dyn Fn(&NodeSettings) -> Result<PoolTypes, String>,
    ) -> Result<Self, InputError> {
        refuse_unreadable(Self::from_snapshot_reading_around(
            snapshot,
            instance_types,
        )?)
    }

    /// Like [`Input::from_snapshot`], but a pod whose spec cannot be read (a constraint
    /// the API server accepts and the scheduler cannot parse) costs only that pod, not the
    /// whole cluster's planning. A pending such pod is left out: it cannot be planned. A
    /// bound one stays on its node as a pod of its labels and requests without
    /// constraints, or of its node's whole allocatable when its requests cannot be read
    /// either, so the node is never taken for emptier than it is. Each such pod's error is
    /// returned beside the input, in snapshot order.
    pub fn from_snapshot_reading_around(
        snapshot: &Snapshot,
        instance_types: &dyn Fn(&NodeSettings) -> Result<PoolTypes, String>,
    ) -> Result<(Self, Vec<PodError>), InputError> {
        Self::from_snapshot_remembering(snapshot, instance_types, &mut PodMemo::default())
    }

    /// [`Input::from_snapshot_reading_around`] for a controller that reads the cluster on
    /// every pass: each pod is read once per resourceVersion, and `memo` then holds the
    /// pods of this snapshot (for the next pass).
    pub fn from_snapshot_remembering(
        snapshot: &Snapshot,
        instance_types: &dyn Fn(&NodeSettings) -> Result<PoolTypes, String>,
        memo: &mut PodMemo,
    ) -> Result<(Self, Vec<PodError>), InputError> {
        Self::build(
            snapshot,
            snapshot.pods.iter().cloned(),
            instance_types,
            memo,
        )
    }

    /// [`Input::from_snapshot`] for a one-shot plan of a snapshot nothing else needs: its
    /// pods are taken out of it and freed as they are read, so a large cluster's objects and
    /// the scheduler's model of them are not held at once (100,000 pods: about 0.8 and
    /// 0.4 GB).
    pub fn from_snapshot_taking_pods(
        snapshot: &mut Snapshot,
        instance_types: &dyn Fn(&NodeSettings) -> Result<PoolTypes, String>,
    ) -> Result<Self, InputError> {
        let pods = std::mem::take(&mut snapshot.pods);
        refuse_unreadable(Self::build(
            snapshot,
            pods.into_iter(),
            instance_types,
            &mut PodMemo::default(),
        )?)
    }

    /// Builds the input from `snapshot`'s objects and `pods` (the snapshot's, in order),
    /// reading the pods a run at a time.
    fn build(
        snapshot: &Snapshot,
        mut pods: impl Iterator<Item = Arc<Pod>>,
        instance_types: &dyn Fn(&NodeSettings) -> Result<PoolTypes, String>,
        memo: &mut PodMemo,
    ) -> Result<(Self, Vec<PodError>), InputError> {
        let mut pods_by_node: BTreeMap<String, Vec<Arc<PodInfo>>> = BTreeMap::new();
        let mut pending = Vec::new();
        let mut unreadable = Vec::new();
        // Bound unreadable pods whose requests could not be read either: they fill their node.
        let mut filling = std::collections::BTreeSet::new();
        let mut seen = HashMap::default();
        // Pods are read on every core (a large snapshot's pods are most of the work here),
        // a run at a time; what is built from them keeps the snapshot's order. Pods handed
        // over are freed run by run.
        let remembered = &*memo;
        // Where pods' claims let them run, when the snapshot holds the cluster's claims,
        // volumes and classes. A pod with claims is read afresh on every pass (its volume
        // may have been bound since), never from the memo.
        let topology = snapshot.storage_read.then(|| {
            super::volumes::VolumeTopology::new(
                &snapshot.persistent_volume_claims,
                &snapshot.persistent_volumes,
                &snapshot.storage_classes,
            )
        });
        let topology = topology.as_ref();
        loop {
            let chunk: Vec<Arc<Pod>> = pods.by_ref().take(PODS_PER_READ).collect();
            if chunk.is_empty() {
                break;
            }
            let reads: Vec<_> = chunk
                .par_iter()
                .with_min_len(PODS_PER_RUN)
                .map(|p| {
                    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                    if matches!(phase, Some("Succeeded" | "Failed")) {
                        return None;
                    }
                    if let Some(t) = topology.filter(|_| super::volumes::has_claims(p)) {
                        let read = match t.constrain(p) {
                            Ok(Some(constrained)) => PodInfo::from_pod(&constrained),
                            Ok(None) => PodInfo::from_pod(p),
                            Err(e) => Err(e),
                        };
                        return Some(read.map(|mut info| {
                            let disks = t.disks(p);
                            if disks > 0 {
                                info.requests
                                    .extended
                                    .insert(super::volumes::DISK_ATTACHMENTS.to_string(), disks);
                            }
                            Arc::new(info)
                        }));
                    }
                    let version = p
                        .metadata
                        .uid
                        .as_ref()
                        .zip(p.metadata.resource_version.as_ref());
                    Some(
                        match version.and_then(|(uid, rv)| remembered.get(uid, rv)) {
                            Some(info) => Ok(info),
                            None => PodInfo::from_pod(p).map(Arc::new),
                        },
                    )
                })
                .collect();
            for (p, read) in chunk.iter().zip(reads) {
                let Some(read) = read else {
                    continue;
                };
                let version = p
                    .metadata
                    .uid
                    .as_ref()
                    .zip(p.metadata.resource_version.as_ref());
                let info = match read {
                    Ok(info) => {
                        if let Some((uid, rv)) = version
                            && !(topology.is_some() && super::volumes::has_claims(p))
                        {
                            seen.insert(uid.clone(), (rv.clone(), info.clone()));
                        }
                        info
                    }
                    Err(e) => {
                        let key = e.pod.clone();
                        unreadable.push(e);
                        let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
                            continue;
                        };
                        let mut info = PodInfo::new(&key, Resources::zero());
                        match p.spec.as_ref().map(pod_requests) {
                            Some(Ok(r)) => info.requests = r,
                            _ => {
                                filling.insert(info.key.clone());
                            }
                        }
                        info.labels = p.metadata.labels.clone().unwrap_or_default();
                        info.owner = super::pod::owner_of(p);
                        info.node_name = Some(node);
                        Arc::new(info)
                    }
                };
                match &info.node_name {
                    Some(n) => pods_by_node.entry(n.clone()).or_default().push(info),
                    None => pending.push(Arc::unwrap_or_clone(info)),
                }
            }
        }
        memo.by_uid = seen;
        let mut nodes = Vec::new();
        for n in &snapshot.nodes {
            let name = n.metadata.name.clone().unwrap_or_default();
            let allocatable = parse_quantities(
                n.status.as_ref().and_then(|s| s.allocatable.as_ref()),
                "status.allocatable",
            )
            .map_err(|e| InputError::Node {
                node: name.clone(),
                message: e.to_string(),
            })?;
            let mut labels = n.metadata.labels.clone().unwrap_or_default();
            labels
                .entry(labels::HOSTNAME.to_string())
                .or_insert_with(|| name.clone());
            let mut pods = pods_by_node.remove(&name).unwrap_or_default();
            for pod in pods.iter_mut().filter(|p| filling.contains(&p.key)) {
                let mut filled = PodInfo::clone(pod);
                filled.requests = allocatable.clone();
                *pod = Arc::new(filled);
            }
            nodes.push(ExistingNode {
                derived: Default::default(),
                pods,
                name,
                labels,
                taints: n
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.clone())
                    .unwrap_or_default(),
                allocatable,
                unschedulable: n
                    .spec
                    .as_ref()
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false),
            });
        }
        // Pods bound to nodes missing from the snapshot still count for topology: they
        // are dropped here because their domains are unknown.
        let classes: BTreeMap<String, &AKSNodeClass> = snapshot
            .node_classes
            .iter()
            .map(|c| (c.metadata.name.clone().unwrap_or_default(), c))
            .collect();
        let mut pools = Vec::new();
        for np in &snapshot.node_pools {
            let class = classes
                .get(&np.spec.template.spec.node_class_ref.name)
                .copied();
            let settings = node_settings(class);
            let mut pool = pool_from(np, &instance_types(&settings).map_err(InputError::Catalog)?)?;
            for node in &nodes {
                let owner = node
                    .labels
                    .iter()
                    .find(|(k, _)| labels::canonical_key(k) == labels::NODE_POOL)
                    .map(|(_, v)| v.as_str());
                if owner == Some(pool.name.as_str()) {
                    pool.nodes_in_use += 1;
                    pool.in_use = pool
                        .in_use
                        .checked_add(&node.allocatable)
                        .unwrap_or_else(|_| pool.in_use.clone());
                }
            }
            // In-flight claims (launched, no node yet) count against the limits too.
            let node_names: std::collections::BTreeSet<&str> =
                nodes.iter().map(|n| n.name.as_str()).collect();
            for claim in &snapshot.node_claims {
                let claim_labels = claim.metadata.labels.clone().unwrap_or_default();
                let owner = claim_labels
                    .iter()
                    .find(|(k, _)| labels::canonical_key(k) == labels::NODE_POOL)
                    .map(|(_, v)| v.as_str());
                let registered = claim
                    .status
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .is_some_and(|n| node_names.contains(n));
                if owner != Some(pool.name.as_str()) || registered {
                    continue;
                }
                let capacity = claim
                    .status
                    .as_ref()
                    .map(|s| &s.capacity)
                    .filter(|c| !c.is_empty())
                    .map(|c| parse_quantities(Some(c), "status.capacity"))
                    .transpose()
                    .map_err(|e| InputError::NodePool {
                        pool: pool.name.clone(),
                        field: format!(
                            "nodeclaim {} {}",
                            claim.metadata.name.as_deref().unwrap_or(""),
                            e.field
                        ),
                        message: e.source.to_string(),
                    })?
                    .or_else(|| {
                        let size = claim_labels.get(labels::INSTANCE_TYPE)?;
                        pool.instance_types
                            .iter()
                            .find(|t| &t.name == size)
                            .map(|t| t.capacity.clone())
                    })
                    .unwrap_or_default();
                pool.nodes_in_use += 1;
                pool.in_use = pool
                    .in_use
                    .checked_add(&capacity)
                    .unwrap_or_else(|_| pool.in_use.clone());
            }
            pools.push(pool);
        }
        if pools.is_empty() {
            pools.push(default_pool(
                &instance_types(&NodeSettings::default()).map_err(InputError::Catalog)?,
            ));
        }
        if pending
            .iter()
            .chain(nodes.iter().flat_map(|n| n.pods.iter().map(|p| &**p)))
            .any(|p| {
                p.requests
                    .extended
                    .contains_key(super::volumes::DISK_ATTACHMENTS)
            })
        {
            with_disk_slots(&mut pools, &mut nodes);
        }
        pools.sort_by(|a, b| b.weight.cmp(&a.weight).then_with(|| a.name.cmp(&b.name)));
        let mut daemon_sets = Vec::new();
        for ds in &snapshot.daemon_sets {
            let key = format!(
                "{}/{}",
                ds.metadata.namespace.as_deref().unwrap_or("default"),
                ds.metadata.name.as_deref().unwrap_or("")
            );
            if let Some(spec) = ds.spec.as_ref().and_then(|s| s.template.spec.as_ref()) {
                daemon_sets.push(daemon_set_info(key, spec)?);
            }
        }
        Ok((
            Input {
                pending,
                nodes,
                pools,
                daemon_sets,
            },
            unreadable,
        ))
    }
}

/// The pool used when a snapshot defines none: on-demand linux nodes of any type.
pub fn default_pool(instance_types: &PoolTypes) -> Pool {
    let in_one = |key: &str, value: &str| NodeRequirement {
        key: key.to_string(),
        operator: RequirementOperator::In,
        values: vec![value.to_string()],
        min_values: None,
    };
    let written_requirements = vec![
        in_one(labels::CAPACITY_TYPE, labels::CAPACITY_TYPE_ON_DEMAND),
        in_one(labels::OS, labels::OS_LINUX),
    ];
    let requirements = Requirements::new()
        .with(Requirement::one_of(
            labels::CAPACITY_TYPE,
            [labels::CAPACITY_TYPE_ON_DEMAND],
        ))
        .with(Requirement::one_of(labels::OS, [labels::OS_LINUX]))
        .with(Requirement::one_of(labels::NODE_POOL, ["default"]));
    let instance_types = instance_types.admitted_by(&requirements);
    Pool {
        name: "default".to_string(),
        weight: 0,
        requirements,
        written_requirements,
        labels: BTreeMap::new(),
        taints: Vec::new(),
        startup_taints: Vec::new(),
        instance_types,
        limits: Limits::default(),
        in_use: Resources::zero(),
        nodes_in_use: 0,
    }
}

/// Gives every instance type and existing node its data-disk slots
/// ([`super::volumes::max_data_disks`]), once some pod is known to use Azure Disks: a node of
/// a size the catalog does not know keeps no limit. Without such pods nothing changes, so
/// plans of clusters without disks are untouched.
fn with_disk_slots(pools: &mut [Pool], nodes: &mut [ExistingNode]) {
    use super::volumes::{DISK_ATTACHMENTS, max_data_disks};
    let mut slots: BTreeMap<String, i64> = BTreeMap::new();
    for pool in pools.iter_mut() {
        let types: Vec<crate::model::InstanceType> = pool
            .instance_types
            .iter()
            .map(|t| {
                let mut t = t.clone();
                let n = max_data_disks(t.sku.vcpus);
                t.capacity.extended.insert(DISK_ATTACHMENTS.to_string(), n);
                t.allocatable
                    .extended
                    .insert(DISK_ATTACHMENTS.to_string(), n);
                slots.insert(t.name.clone(), n);
                t
            })
            .collect();
        pool.instance_types = types.into();
    }
    for node in nodes.iter_mut() {
        if node.allocatable.extended.contains_key(DISK_ATTACHMENTS) {
            continue;
        }
        let n = node
            .labels
            .get(labels::INSTANCE_TYPE)
            .and_then(|t| slots.get(t))
            .copied()
            .unwrap_or(i64::from(u32::MAX));
        node.allocatable
            .extended
            .insert(DISK_ATTACHMENTS.to_string(), n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_label_memo_derives_once_for_the_same_labels_and_again_for_changed_ones() {
        let memo = LabelMemo::default();
        let calls = Cell::new(0);
        let derive = |l: &BTreeMap<String, String>| {
            calls.set(calls.get() + 1);
            (l.clone(), Requirements::from_labels(l))
        };
        let zone = |z: &str| BTreeMap::from([(labels::ZONE.to_string(), z.to_string())]);
        let (l1, r1) = memo.get_or_derive(&zone("eastus-1"), derive);
        // A copy of the node shares the derivation.
        let copy = memo.clone();
        let (l2, r2) = copy.get_or_derive(&zone("eastus-1"), derive);
        assert!(Arc::ptr_eq(&l1, &l2) && Arc::ptr_eq(&r1, &r2));
        assert_eq!(calls.get(), 1);
        // Changed labels are derived afresh, never answered from the memo.
        let (l3, r3) = copy.get_or_derive(&zone("eastus-2"), derive);
        assert_eq!(calls.get(), 2);
        assert_eq!(*l3, zone("eastus-2"));
        assert_eq!(*r3, Requirements::from_labels(&zone("eastus-2")));
        assert_ne!(r3, r1);
    }
}
