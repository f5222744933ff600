//! The demo's simulated Kubernetes cluster, which the agent's controllers run against as
//! they run against a real one: an in-memory API server holding the cluster's objects
//! (each write the agent makes through [`ClusterApi`] changes them, and every change is
//! shown to the agent's stores as a watch event would show it), and the parts of
//! Kubernetes the agent relies on, played in-process:
//!
//! - the API server's own rules: finalizers and deletion timestamps, resource-version
//!   preconditions, status merged per condition type, evictions refused by a
//!   PodDisruptionBudget, the `resize` subresource;
//! - the workload controllers: a ReplicaSet, StatefulSet, Job or DaemonSet keeps the pods
//!   it is told to, replacing any that go, each new pod passing the admission webhook's
//!   decision as the API server would call it;
//! - kube-scheduler: pending pods are taken in its queue order and bound where its default
//!   profile's filters and scores put them, a nominated node first ([`super::binder`],
//!   which shares nothing with Tailor's planner), or marked `PodScheduled=False` with
//!   reason `Unschedulable` and their nomination cleared, which is what the provisioner
//!   watches for;
//! - the kubelet: a VM that is running joins as a Node with the unregistered taint, pods
//!   start once bound, containers are OOM-killed and resized in place when their node has
//!   room (else the resize is `Deferred` or `Infeasible`, as the kubelet reports it);
//! - the cloud's node lifecycle: a Node whose VM is gone is deleted, and its pods with it;
//!   node-problem-detector's `PreemptionScheduled` condition on a spot VM Azure will reclaim.
//!
//! Nothing here decides anything Tailor decides; the [`super::world`] drives the scenario
//! (replicas, usage, OOM kills, the cloud) and reads the figures from the
//! [`Happening`]s this cluster records.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use jiff::Timestamp;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus, Node,
    NodeCondition, NodeSpec, NodeStatus, ObjectReference, Pod, PodCondition, PodStatus, Secret,
    Taint,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, ObjectMeta, OwnerReference, Time,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::Value;

use crate::actuation::{Resize, with_resources};
use crate::apis::{
    AKSNodeClass, NodeClaim, NodeClaimStatus, NodePool, NodePoolStatus, Recommendation,
    RecommendationStatus, RightsizingPolicy, RightsizingPolicyStatus, labels,
};
use crate::clock::Clock;
use crate::controllers::state::{Fed, StateFeed};
use crate::controllers::writes::{ClusterApi, Result, WriteError};
use crate::model::{InstanceType, Resources};
use crate::sim::binder::Binder;

/// Field owners whose status parts a NodeClaim's lifecycle steps apply separately; the
/// simulated server keeps each condition type, as server-side apply merges the
/// `conditions` list by `type`.
const LIST_MAP_KEYS: &[(&str, &str)] = &[("conditions", "type")];

/// Something the cluster did that the scenario counts.
#[derive(Debug, Clone, PartialEq)]
pub enum Happening {
    /// A pod was created (by its workload's controller); `replaces` says why, when it
    /// replaces a pod that went.
    PodCreated {
        /// `namespace/name`.
        pod: String,
        /// Index of its workload.
        workload: usize,
        /// Why the pod it replaces went, if it replaces one.
        replaces: Option<Gone>,
    },
    /// A pod was bound to a node and started.
    PodStarted {
        /// `namespace/name`.
        pod: String,
        /// The node.
        node: String,
    },
    /// A pod went.
    PodGone {
        /// `namespace/name`.
        pod: String,
        /// Index of its workload.
        workload: usize,
        /// Why.
        why: Gone,
    },
    /// A running pod's containers took new requests in place.
    Resized {
        /// `namespace/name`.
        pod: String,
    },
    /// node-problem-detector marked a Node: Azure will reclaim its spot VM.
    Preempted {
        /// The Node.
        node: String,
    },
    /// The agent created a NodeClaim.
    ClaimCreated {
        /// The claim as it was created.
        claim: Box<NodeClaim>,
    },
    /// A NodeClaim went (its finalizer lifted after termination).
    ClaimGone {
        /// The claim as it was last.
        claim: Box<NodeClaim>,
    },
}

/// A disruption command the agent started, as its NodeClaims' annotations show it.
#[derive(Debug, Clone, Default)]
pub struct Command {
    /// The NodeClaims it disrupts.
    pub old: BTreeSet<String>,
    /// The NodeClaims made to replace them.
    pub replacements: BTreeSet<String>,
}

/// Why a pod went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Gone {
    /// Evicted from a node disruption drained (consolidation, drift, expiry).
    EvictedByDisruption,
    /// Evicted from a spot node drained before Azure reclaims it.
    EvictedBeforeReclaim,
    /// Evicted by right-sizing, to come back with the recommended requests.
    EvictedToResize,
    /// Deleted outright (a drain's grace period passed).
    Deleted,
    /// Its node went away with it.
    NodeLost,
    /// Its workload wants fewer pods.
    ScaledDown,
}

/// A workload's controller as the simulated control plane runs it.
#[derive(Debug, Clone)]
pub struct Controller {
    /// `ReplicaSet`, `StatefulSet`, `Job` or `DaemonSet`.
    pub kind: &'static str,
    /// Namespace.
    pub namespace: String,
    /// The owning object's name (the ReplicaSet's, for a Deployment).
    pub owner: String,
    /// The owning object's uid.
    pub owner_uid: String,
    /// Pod labels, annotations and spec.
    pub template: Pod,
    /// Pods wanted (DaemonSets: one per schedulable node, whatever this says).
    pub replicas: u32,
    /// The next StatefulSet ordinal.
    next_ordinal: u32,
    /// When the template last changed, while pods made before remain.
    rolling: Option<Timestamp>,
}

impl Controller {
    /// A controller of `kind` owned by `owner`, making pods from `template`.
    pub fn new(kind: &'static str, owner: &ObjectMeta, template: Pod, replicas: u32) -> Self {
        Controller {
            kind,
            namespace: owner.namespace.clone().unwrap_or_default(),
            owner: owner.name.clone().unwrap_or_default(),
            owner_uid: owner.uid.clone().unwrap_or_default(),
            template,
            replicas,
            next_ordinal: 0,
            rolling: None,
        }
    }
}

/// An Event the agent published.
#[derive(Debug, Clone)]
pub struct RecordedEvent {
    /// When.
    pub at: Timestamp,
    /// The object's kind.
    pub kind: String,
    /// The object's name.
    pub name: String,
    /// `Normal` or `Warning`.
    pub warning: bool,
    /// The reason.
    pub reason: String,
    /// The note.
    pub note: String,
}

/// What the kubelet knows of a running pod that the API does not show: a resize it could
/// not make yet.
#[derive(Debug, Clone)]
struct DeferredResize {
    resize: Resize,
}

/// The cluster's objects and the state of its simulated control plane.
pub struct Objects {
    feed: StateFeed,
    clock: Arc<dyn Clock>,
    version: u64,
    uids: u64,
    names: rand_chacha::ChaCha8Rng,
    /// Pods by `namespace/name`.
    pub pods: BTreeMap<String, Pod>,
    /// Nodes by name.
    pub nodes: BTreeMap<String, Node>,
    /// NodeClaims by name.
    pub node_claims: BTreeMap<String, NodeClaim>,
    /// NodePools by name.
    pub node_pools: BTreeMap<String, NodePool>,
    /// AKSNodeClasses by name.
    pub node_classes: BTreeMap<String, AKSNodeClass>,
    /// PodDisruptionBudgets by `namespace/name`.
    pub pdbs: BTreeMap<String, PodDisruptionBudget>,
    /// RightsizingPolicies by `namespace/name`.
    pub policies: BTreeMap<String, RightsizingPolicy>,
    /// Recommendations by `namespace/name`.
    pub recommendations: BTreeMap<String, Recommendation>,
    config_maps: BTreeMap<(String, String), BTreeMap<String, String>>,
    secrets: BTreeMap<(String, String), Secret>,
    /// The workload controllers, by workload index.
    pub controllers: Vec<Controller>,
    /// Which workload (index) each pod belongs to.
    pod_workload: BTreeMap<String, usize>,
    deferred: BTreeMap<String, DeferredResize>,
    /// What the admission webhook decides for new pods, when it serves.
    webhook: Option<(crate::webhook::Stores, crate::webhook::Settings)>,
    /// Events the agent published, oldest first.
    pub events: Vec<RecordedEvent>,
    /// What happened (unix second, what) since the scenario last took it
    /// ([`Objects::take_happenings`]).
    happenings: Vec<(i64, Happening)>,
    /// Whether anything the scheduler reads changed since its last pass.
    schedule_due: bool,
    /// Disruption commands by id, from the annotations the agent wrote.
    pub commands: BTreeMap<String, Command>,
}

/// The simulated cluster; clones share it. It is the agent's [`ClusterApi`].
#[derive(Clone)]
pub struct SimCluster(Arc<Mutex<Objects>>);

fn key_of(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    }
}

fn pod_key(pod: &Pod) -> String {
    key_of(pod.metadata.namespace.as_deref(), &pod.name_any())
}

/// Merges an applied document into `target` as server-side apply does for one field
/// manager: objects field by field, lists replaced whole except the list-maps of
/// [`LIST_MAP_KEYS`] (merged item by key), and fields the document leaves out (or null)
/// left alone.
fn merge_applied(target: &mut Value, applied: &Value) {
    merge_at(target, applied, None);
}

fn merge_at(target: &mut Value, applied: &Value, field: Option<&str>) {
    match (target, applied) {
        (Value::Object(t), Value::Object(a)) => {
            for (k, v) in a {
                if v.is_null() {
                    continue;
                }
                match t.get_mut(k) {
                    Some(existing) => merge_at(existing, v, Some(k)),
                    None => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Value::Array(t), Value::Array(a)) => {
            let key = field.and_then(|f| {
                LIST_MAP_KEYS
                    .iter()
                    .find(|(list, _)| *list == f)
                    .map(|(_, k)| *k)
            });
            match key {
                Some(key) => {
                    for item in a {
                        match t.iter_mut().find(|x| x.get(key) == item.get(key)) {
                            Some(existing) => *existing = item.clone(),
                            None => t.push(item.clone()),
                        }
                    }
                }
                None => *t = a.clone(),
            }
        }
        (t, a) => *t = a.clone(),
    }
}

/// `status` merged into `current` ([`merge_applied`]); `current` unchanged when either
/// does not round-trip through JSON (plain API types always do).
fn merged<T: serde::Serialize + serde::de::DeserializeOwned + Clone>(
    current: &T,
    applied: &T,
) -> T {
    let (Ok(mut target), Ok(applied_json)) =
        (serde_json::to_value(current), serde_json::to_value(applied))
    else {
        return current.clone();
    };
    merge_applied(&mut target, &applied_json);
    serde_json::from_value(target).unwrap_or_else(|_| current.clone())
}

/// Millicores and bytes a pod's containers request (init containers and overhead aside:
/// the simulated workloads have neither).
pub fn pod_requests(pod: &Pod) -> (i64, i64) {
    let mut cpu = 0;
    let mut memory = 0;
    for c in pod.spec.iter().flat_map(|s| &s.containers) {
        let requests = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        if let Some(q) = requests.and_then(|r| r.get("cpu")) {
            cpu += crate::model::quantity::parse_milli(&q.0).unwrap_or(0);
        }
        if let Some(q) = requests.and_then(|r| r.get("memory")) {
            memory += crate::model::quantity::parse_value(&q.0).unwrap_or(0);
        }
    }
    (cpu, memory)
}

/// Bytes of the memory limit of a pod's first container, if it has one.
pub fn memory_limit(pod: &Pod) -> Option<i64> {
    let c = pod.spec.as_ref()?.containers.first()?;
    let q = c.resources.as_ref()?.limits.as_ref()?.get("memory")?;
    crate::model::quantity::parse_value(&q.0).ok()
}

fn condition_true(conditions: Option<&Vec<PodCondition>>, type_: &str) -> bool {
    conditions
        .into_iter()
        .flatten()
        .any(|c| c.type_ == type_ && c.status == "True")
}

impl SimCluster {
    /// An empty cluster whose objects `feed` shows to the agent's stores, on `clock`;
    /// names are drawn from `seed`.
    pub fn new(feed: StateFeed, clock: Arc<dyn Clock>, seed: u64) -> Self {
        use rand::SeedableRng;
        SimCluster(Arc::new(Mutex::new(Objects {
            feed,
            clock,
            version: 0,
            uids: 0,
            names: rand_chacha::ChaCha8Rng::seed_from_u64(seed),
            pods: BTreeMap::new(),
            nodes: BTreeMap::new(),
            node_claims: BTreeMap::new(),
            node_pools: BTreeMap::new(),
            node_classes: BTreeMap::new(),
            pdbs: BTreeMap::new(),
            policies: BTreeMap::new(),
            recommendations: BTreeMap::new(),
            config_maps: BTreeMap::new(),
            secrets: BTreeMap::new(),
            controllers: Vec::new(),
            pod_workload: BTreeMap::new(),
            deferred: BTreeMap::new(),
            webhook: None,
            events: Vec::new(),
            happenings: Vec::new(),
            schedule_due: true,
            commands: BTreeMap::new(),
        })))
    }

    /// The objects, locked. Never held across an await.
    pub fn lock(&self) -> MutexGuard<'_, Objects> {
        // The objects are plain data, and every change completes before the lock is
        // released: a panic elsewhere cannot leave them half-written.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Objects {
    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Marks the agent's stores synced: what they hold is the first full list.
    pub fn synced(&mut self) {
        self.feed.synced();
    }

    /// Calls the admission webhook's decision on every pod created from now on, as the API
    /// server calls a mutating webhook.
    pub fn serve_webhook(
        &mut self,
        stores: crate::webhook::Stores,
        settings: crate::webhook::Settings,
    ) {
        self.webhook = Some((stores, settings));
    }

    fn stamp(&mut self, meta: &mut ObjectMeta) {
        self.version += 1;
        meta.resource_version = Some(self.version.to_string());
        if meta.uid.is_none() {
            self.uids += 1;
            meta.uid = Some(format!("00000000-0000-4000-8000-{:012x}", self.uids));
        }
        if meta.creation_timestamp.is_none() {
            meta.creation_timestamp = Some(Time(self.now()));
        }
    }

    /// Stores a new or changed object and shows it to the agent.
    /// A write that changes nothing is no change, as on an API server: no new version and
    /// no watch event (a controller that writes the same status again does not wake
    /// everyone, itself included).
    pub fn put<K: Fed + Stored>(&mut self, mut object: K) -> K {
        let key = key_of(object.meta().namespace.as_deref(), &object.name_any());
        if let Some(existing) = K::table(self).get(&key) {
            let meta = object.meta_mut();
            meta.resource_version = existing.meta().resource_version.clone();
            meta.uid = existing.meta().uid.clone();
            meta.creation_timestamp = existing.meta().creation_timestamp.clone();
            if &object == existing {
                return object;
            }
        }
        self.stamp(object.meta_mut());
        self.feed.apply(&object);
        K::table(self).insert(key, object.clone());
        object
    }

    fn remove<K: Fed + Stored>(&mut self, key: &str) -> Option<K> {
        let object = K::table(self).remove(key)?;
        self.feed.delete(&object);
        Some(object)
    }

    /// Deletes an object: at once without finalizers, else it gets its deletion timestamp
    /// (once) and goes when the last finalizer is removed.
    fn delete<K: Fed + Stored>(&mut self, key: &str) -> bool {
        let now = self.now();
        let Some(object) = K::table(self).get(key).cloned() else {
            return false;
        };
        if object.meta().finalizers.as_ref().is_none_or(Vec::is_empty) {
            self.remove::<K>(key);
            return true;
        }
        if object.meta().deletion_timestamp.is_none() {
            let mut object = object;
            object.meta_mut().deletion_timestamp = Some(Time(now));
            self.put(object);
        }
        false
    }

    /// A random name suffix of five characters, as `generateName` makes them.
    fn suffix(&mut self) -> String {
        use rand::Rng;
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        (0..5)
            .map(|_| ALPHABET[self.names.random_range(0..ALPHABET.len())] as char)
            .collect()
    }

    /// Takes what happened since the last call.
    pub fn take_happenings(&mut self) -> Vec<(i64, Happening)> {
        std::mem::take(&mut self.happenings)
    }

    fn happened(&mut self, what: Happening) {
        let at = self.now().as_second();
        self.happenings.push((at, what));
    }

    /// The workload (index) of a pod.
    pub fn workload_of(&self, pod: &str) -> Option<usize> {
        self.pod_workload.get(pod).copied()
    }

    // ---- workload controllers ----

    /// Adds a workload's controller; its index is the workload's.
    pub fn add_controller(&mut self, controller: Controller) -> usize {
        self.controllers.push(controller);
        self.controllers.len() - 1
    }

    /// Sets how many pods workload `w` wants and creates or deletes pods to match (the
    /// newest go first, pending before running).
    pub fn scale(&mut self, w: usize, replicas: u32) {
        if let Some(c) = self.controllers.get_mut(w) {
            c.replicas = replicas;
        }
        self.reconcile_workload(w, None);
    }

    fn pods_of(&self, w: usize) -> Vec<String> {
        self.pod_workload
            .iter()
            .filter(|(_, x)| **x == w)
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn reconcile_workload(&mut self, w: usize, replaces: Option<Gone>) {
        let Some(c) = self.controllers.get(w) else {
            return;
        };
        if c.kind == "DaemonSet" {
            self.reconcile_daemon_set(w);
            return;
        }
        let want = c.replicas as usize;
        let mut have: Vec<String> = self
            .pods_of(w)
            .into_iter()
            .filter(|k| {
                self.pods
                    .get(k)
                    .is_some_and(|p| p.metadata.deletion_timestamp.is_none())
            })
            .collect();
        if have.len() > want {
            // Pending pods first, then the newest.
            have.sort_by_key(|k| {
                let p = &self.pods[k];
                let bound = p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
                let created = p.metadata.creation_timestamp.as_ref().map(|t| t.0);
                (
                    bound,
                    std::cmp::Reverse(created),
                    std::cmp::Reverse(k.clone()),
                )
            });
            let excess = have.len() - want;
            for k in have.drain(..excess) {
                self.remove_pod(&k, Gone::ScaledDown);
            }
        } else {
            for _ in have.len()..want {
                self.create_pod(w, None, replaces);
            }
        }
    }

    /// One pod per node, as the DaemonSet controller keeps them: a node gets its pod once
    /// none of its NoSchedule or NoExecute taints stops the template (so after registration
    /// lifts the unregistered taint, and not while a drain's taint is on); a pod stays until
    /// its node goes.
    fn reconcile_daemon_set(&mut self, w: usize) {
        let tolerations = self.controllers[w]
            .template
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.clone())
            .unwrap_or_default();
        let nodes: BTreeSet<String> = self
            .nodes
            .values()
            .filter(|n| n.metadata.deletion_timestamp.is_none())
            .map(|n| n.name_any())
            .collect();
        let open: BTreeSet<String> = self
            .nodes
            .values()
            .filter(|n| n.metadata.deletion_timestamp.is_none())
            .filter(|n| {
                let taints = n
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.clone())
                    .unwrap_or_default();
                crate::scheduling::taints::untolerated(&taints, &tolerations, false).is_none()
            })
            .map(|n| n.name_any())
            .collect();
        let mut covered = BTreeSet::new();
        for k in self.pods_of(w) {
            let node = self.pods[&k]
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone());
            match node {
                Some(n) if nodes.contains(&n) => {
                    covered.insert(n);
                }
                _ => self.remove_pod(&k, Gone::NodeLost),
            }
        }
        for node in open.difference(&covered).cloned().collect::<Vec<_>>() {
            self.create_pod(w, Some(node), None);
        }
    }

    /// Creates a pod of workload `w` from its template (through the webhook), bound to
    /// `node` when given (a DaemonSet's).
    fn create_pod(&mut self, w: usize, node: Option<String>, replaces: Option<Gone>) {
        let suffix = self.suffix();
        let Some(c) = self.controllers.get_mut(w) else {
            return;
        };
        let name = match c.kind {
            "StatefulSet" => {
                // The lowest ordinal not in use, as a StatefulSet's controller picks it.
                let used: BTreeSet<String> = self
                    .pod_workload
                    .iter()
                    .filter(|(_, x)| **x == w)
                    .map(|(k, _)| k.clone())
                    .collect();
                let c = &mut self.controllers[w];
                let mut n = 0;
                while used.contains(&key_of(Some(&c.namespace), &format!("{}-{n}", c.owner))) {
                    n += 1;
                }
                c.next_ordinal = c.next_ordinal.max(n + 1);
                format!("{}-{n}", c.owner)
            }
            _ => format!("{}-{suffix}", c.owner),
        };
        let c = &self.controllers[w];
        let mut pod = c.template.clone();
        pod.metadata.name = Some(name);
        pod.metadata.namespace = Some(c.namespace.clone());
        pod.metadata.owner_references = Some(vec![OwnerReference {
            api_version: match c.kind {
                "Job" => "batch/v1",
                _ => "apps/v1",
            }
            .to_string(),
            kind: c.kind.to_string(),
            name: c.owner.clone(),
            uid: c.owner_uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        if let Some(spec) = pod.spec.as_mut() {
            spec.node_name = node;
        }
        if let Some((stores, settings)) = &self.webhook
            && let crate::webhook::mutate::Decision::Patch { containers, .. } =
                crate::webhook::mutate::decide(&pod, &c.namespace, stores, settings)
        {
            pod = with_resources(&pod, &containers);
        }
        pod.status = Some(PodStatus {
            phase: Some("Pending".to_string()),
            ..PodStatus::default()
        });
        let key = pod_key(&pod);
        self.pod_workload.insert(key.clone(), w);
        let bound = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        self.put(pod);
        self.happened(Happening::PodCreated {
            pod: key.clone(),
            workload: w,
            replaces,
        });
        match bound {
            Some(node) => self.start_pod(&key, &node),
            None => self.schedule_due = true,
        }
    }

    /// Removes a pod (it is gone at once: the simulated containers stop instantly) and lets
    /// its workload's controller replace it.
    fn remove_pod(&mut self, key: &str, why: Gone) {
        let Some(_) = self.remove::<Pod>(key) else {
            return;
        };
        self.deferred.remove(key);
        self.schedule_due = true;
        let Some(w) = self.pod_workload.remove(key) else {
            return;
        };
        self.happened(Happening::PodGone {
            pod: key.to_string(),
            workload: w,
            why,
        });
        if why != Gone::ScaledDown {
            self.reconcile_workload(w, Some(why));
        }
    }

    /// Rollouts: a workload whose template changed replaces one pod made from the old
    /// template once none of its pods is pending.
    pub fn roll(&mut self) {
        for w in 0..self.controllers.len() {
            let Some(since) = self.controllers[w].rolling else {
                continue;
            };
            let pods = self.pods_of(w);
            let pending = pods.iter().any(|k| {
                self.pods[k]
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_ref())
                    .is_none()
            });
            if pending {
                continue;
            }
            let old = pods.iter().find(|k| {
                self.pods[*k]
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .is_some_and(|t| t.0 < since)
            });
            match old {
                Some(k) => self.remove_pod(&k.clone(), Gone::Deleted),
                None => self.controllers[w].rolling = None,
            }
        }
    }

    // ---- kube-scheduler ----

    fn schedulable_nodes(&self) -> Vec<&Node> {
        self.nodes
            .values()
            .filter(|n| n.metadata.deletion_timestamp.is_none())
            .filter(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .into_iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
            .collect()
    }

    /// The selector of the ReplicaSet or StatefulSet a pod belongs to, which
    /// kube-scheduler's default topology spread counts its pods by.
    fn workload_selector(&self, pod: &Pod) -> Option<LabelSelector> {
        let w = *self.pod_workload.get(&pod_key(pod))?;
        let c = self.controllers.get(w)?;
        matches!(c.kind, "ReplicaSet" | "StatefulSet").then(|| LabelSelector {
            match_labels: c.template.metadata.labels.clone(),
            ..LabelSelector::default()
        })
    }

    /// kube-scheduler's pass: pending pods are taken in its queue order (priority, then
    /// age) and each is bound where [`Binder`] says kube-scheduler would bind it, its
    /// nominated node first; the rest are marked unschedulable and lose their nomination.
    /// Does nothing when nothing it reads changed since the last pass.
    pub fn schedule(&mut self) {
        if !self.schedule_due {
            return;
        }
        self.schedule_due = false;
        let mut bound: Vec<(String, String)> = Vec::new();
        let mut refused: Vec<(String, String)> = Vec::new();
        {
            let selector = |pod: &Pod| self.workload_selector(pod);
            let mut pending: Vec<&Pod> = self
                .pods
                .values()
                .filter(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none()
                })
                .collect();
            if pending.is_empty() {
                return;
            }
            Binder::order(&mut pending);
            let mut binder = Binder::new(self.schedulable_nodes(), self.pods.values(), &selector);
            for pod in pending {
                match binder.choose(pod) {
                    Ok(Ok(choice)) => {
                        let node = Binder::pick(pod, &choice);
                        binder.bind(pod, &node);
                        bound.push((pod_key(pod), node));
                    }
                    Ok(Err(why)) => refused.push((pod_key(pod), why.to_string())),
                    Err(e) => refused.push((pod_key(pod), e)),
                }
            }
        }
        for (k, node) in bound {
            if let Some(mut pod) = self.pods.get(&k).cloned() {
                if let Some(spec) = pod.spec.as_mut() {
                    spec.node_name = Some(node.clone());
                }
                let status = pod.status.get_or_insert_with(PodStatus::default);
                status.nominated_node_name = None;
                self.put(pod);
                self.start_pod(&k, &node);
            }
        }
        for (k, why) in refused {
            self.mark_unschedulable(&k, &why);
        }
    }

    /// Marks a pod `PodScheduled=False` (`Unschedulable`, with kube-scheduler's message) and
    /// clears its nomination, as kube-scheduler does after a failed attempt.
    fn mark_unschedulable(&mut self, key: &str, why: &str) {
        let Some(mut pod) = self.pods.get(key).cloned() else {
            return;
        };
        let status = pod.status.get_or_insert_with(PodStatus::default);
        let nominated = status.nominated_node_name.take().is_some();
        let conditions = status.conditions.get_or_insert_with(Vec::new);
        if conditions
            .iter()
            .any(|c| c.type_ == "PodScheduled" && c.status == "False")
        {
            // Already marked: the condition keeps its transition time.
            if nominated {
                self.put(pod);
            }
            return;
        }
        conditions.retain(|c| c.type_ != "PodScheduled");
        conditions.push(PodCondition {
            type_: "PodScheduled".to_string(),
            status: "False".to_string(),
            reason: Some("Unschedulable".to_string()),
            message: Some(why.to_string()),
            last_transition_time: Some(Time(self.now())),
            ..PodCondition::default()
        });
        self.put(pod);
    }

    // ---- kubelet ----

    /// The kubelet starts a bound pod: running and ready, its container started.
    fn start_pod(&mut self, key: &str, node: &str) {
        let now = Time(self.now());
        let Some(mut pod) = self.pods.get(key).cloned() else {
            return;
        };
        let containers: Vec<String> = pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .map(|c| c.name.clone())
            .collect();
        let status = pod.status.get_or_insert_with(PodStatus::default);
        status.phase = Some("Running".to_string());
        status.start_time = Some(now.clone());
        status.conditions = Some(
            ["PodScheduled", "Initialized", "ContainersReady", "Ready"]
                .into_iter()
                .map(|t| PodCondition {
                    type_: t.to_string(),
                    status: "True".to_string(),
                    last_transition_time: Some(now.clone()),
                    ..PodCondition::default()
                })
                .collect(),
        );
        status.container_statuses = Some(
            containers
                .into_iter()
                .map(|name| ContainerStatus {
                    name,
                    ready: true,
                    started: Some(true),
                    restart_count: 0,
                    state: Some(ContainerState {
                        running: Some(ContainerStateRunning {
                            started_at: Some(now.clone()),
                        }),
                        ..ContainerState::default()
                    }),
                    ..ContainerStatus::default()
                })
                .collect(),
        );
        self.put(pod);
        self.happened(Happening::PodStarted {
            pod: key.to_string(),
            node: node.to_string(),
        });
    }

    /// A VM that came up joins the cluster: its Node, named after the NodeClaim, with the
    /// claim's labels, the size's labels and allocatable, and the unregistered taint the
    /// node boots with (startup taints are lifted at once: nothing in the simulation
    /// starts slowly). Nothing when the Node exists.
    pub fn join(&mut self, instance: &crate::cloud::Instance, size: &InstanceType) {
        if self.nodes.contains_key(&instance.claim) {
            return;
        }
        let claim = self.node_claims.get(&instance.claim);
        let mut node_labels = size.labels();
        if let Some(claim) = claim {
            node_labels.extend(claim.labels().clone());
        }
        node_labels.insert(labels::HOSTNAME.to_string(), instance.claim.clone());
        node_labels.insert(labels::ZONE.to_string(), instance.zone.clone());
        node_labels.insert(
            labels::CAPACITY_TYPE.to_string(),
            instance.capacity_type.as_str().to_string(),
        );
        node_labels.insert(
            labels::INSTANCE_TYPE.to_string(),
            instance.instance_type.clone(),
        );
        if let Some(pool) = instance.tags.get(labels::TAG_NODEPOOL) {
            node_labels.insert(labels::NODE_POOL.to_string(), pool.clone());
        }
        let mut taints: Vec<Taint> = claim.map(|c| c.spec.taints.clone()).unwrap_or_default();
        taints.push(Taint {
            key: labels::UNREGISTERED_TAINT_KEY.to_string(),
            effect: "NoExecute".to_string(),
            ..Taint::default()
        });
        let list = |r: &Resources| -> BTreeMap<String, Quantity> {
            r.to_quantities()
                .into_iter()
                .map(|(k, v)| (k, Quantity(v)))
                .collect()
        };
        let now = Time(self.now());
        let node = Node {
            metadata: ObjectMeta {
                name: Some(instance.claim.clone()),
                labels: Some(node_labels),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                provider_id: Some(instance.provider_id.clone()),
                taints: Some(taints),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                capacity: Some(list(&size.capacity)),
                allocatable: Some(list(&size.allocatable)),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".to_string(),
                    status: "True".to_string(),
                    reason: Some("KubeletReady".to_string()),
                    last_transition_time: Some(now.clone()),
                    last_heartbeat_time: Some(now),
                    ..NodeCondition::default()
                }]),
                ..NodeStatus::default()
            }),
        };
        self.put(node);
        self.schedule_due = true;
    }

    /// The cloud's node lifecycle: a Node whose VM is gone is deleted (behind Tailor's
    /// finalizer, which its termination lifts), and its pods go with the VM.
    pub fn vm_gone(&mut self, provider_id: &str) {
        let Some(name) = self
            .nodes
            .values()
            .find(|n| n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(provider_id))
            .map(|n| n.name_any())
        else {
            return;
        };
        for k in self.pods_on(&name) {
            self.remove_pod(&k, Gone::NodeLost);
        }
        if let Some(mut node) = self.nodes.get(&name).cloned() {
            if let Some(c) = node
                .status
                .as_mut()
                .and_then(|s| s.conditions.as_mut())
                .and_then(|c| c.iter_mut().find(|c| c.type_ == "Ready"))
            {
                c.status = "Unknown".to_string();
                c.reason = Some("NodeStatusUnknown".to_string());
            }
            self.put(node);
        }
        self.delete::<Node>(&name);
        self.node_gone(&name);
    }

    fn pods_on(&self, node: &str) -> Vec<String> {
        self.pods
            .iter()
            .filter(|(_, p)| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// After a Node is removed: pods still bound to it are gone (the pod garbage
    /// collector), and DaemonSets drop their pod there.
    fn node_gone(&mut self, name: &str) {
        if self.nodes.contains_key(name) {
            return;
        }
        for k in self.pods_on(name) {
            self.remove_pod(&k, Gone::NodeLost);
        }
        self.schedule_due = true;
    }

    /// node-problem-detector's report of a Scheduled Event preempting a spot VM, with the
    /// time Azure gives (`NotBefore`).
    pub fn preemption_scheduled(&mut self, provider_id: &str, deadline: Timestamp) {
        let Some(mut node) = self
            .nodes
            .values()
            .find(|n| n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(provider_id))
            .cloned()
        else {
            return;
        };
        let when = jiff::fmt::rfc2822::to_string(&deadline.to_zoned(jiff::tz::TimeZone::UTC))
            .unwrap_or_default();
        let conditions = node
            .status
            .get_or_insert_with(NodeStatus::default)
            .conditions
            .get_or_insert_with(Vec::new);
        if conditions.iter().any(|c| c.type_ == "PreemptionScheduled") {
            return;
        }
        let now = Time(self.now());
        conditions.push(NodeCondition {
            type_: crate::controllers::interruption::PREEMPTION_CONDITION.to_string(),
            status: "True".to_string(),
            reason: Some("SpotEvictionIncoming".to_string()),
            message: Some(format!("Preempt event scheduled: {when}")),
            last_transition_time: Some(now.clone()),
            last_heartbeat_time: Some(now),
        });
        let name = node.name_any();
        self.put(node);
        self.happened(Happening::Preempted { node: name });
    }

    /// The kernel kills a container past its memory: its pod shows the kill (last state
    /// `OOMKilled`) and the container restarts at the same size.
    pub fn oom_kill(&mut self, key: &str) {
        let now = Time(self.now());
        let Some(mut pod) = self.pods.get(key).cloned() else {
            return;
        };
        if let Some(c) = pod
            .status
            .as_mut()
            .and_then(|s| s.container_statuses.as_mut())
            .and_then(|c| c.first_mut())
        {
            c.restart_count += 1;
            c.last_state = Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 137,
                    reason: Some("OOMKilled".to_string()),
                    finished_at: Some(now.clone()),
                    ..ContainerStateTerminated::default()
                }),
                ..ContainerState::default()
            });
            c.state = Some(ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(now),
                }),
                ..ContainerState::default()
            });
        }
        self.put(pod);
    }

    /// Millicores and bytes requested by the pods bound to `node`, but `except`.
    fn requested_on(&self, node: &str, except: &str) -> (i64, i64) {
        self.pods_on(node)
            .iter()
            .filter(|k| k.as_str() != except)
            .map(|k| pod_requests(&self.pods[k]))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    fn allocatable_of(&self, node: &str) -> Option<(i64, i64)> {
        let a = self
            .nodes
            .get(node)?
            .status
            .as_ref()?
            .allocatable
            .as_ref()?;
        let cpu = crate::model::quantity::parse_milli(&a.get("cpu")?.0).ok()?;
        let memory = crate::model::quantity::parse_value(&a.get("memory")?.0).ok()?;
        Some((cpu, memory))
    }

    /// The kubelet's answer to a resize: made when the node has room; else `Infeasible`
    /// (more than the node can ever give) or `Deferred` (tried again as room frees).
    /// Returns whether it was made.
    fn actuate_resize(&mut self, resize: &Resize) -> bool {
        let key = key_of(Some(&resize.namespace), &resize.pod);
        let Some(pod) = self.pods.get(&key).cloned() else {
            self.deferred.remove(&key);
            return false;
        };
        let resized = with_resources(&pod, &resize.containers);
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        let verdict = match node
            .as_deref()
            .and_then(|n| Some((n, self.allocatable_of(n)?)))
        {
            // A pod not on a node yet takes the new requests at once.
            None => None,
            Some((node, (cpu, memory))) => {
                let (want_cpu, want_memory) = pod_requests(&resized);
                let (used_cpu, used_memory) = self.requested_on(node, &key);
                if want_cpu > cpu || want_memory > memory {
                    Some("Infeasible")
                } else if used_cpu + want_cpu > cpu || used_memory + want_memory > memory {
                    Some("Deferred")
                } else {
                    None
                }
            }
        };
        let mut pod = match verdict {
            None => {
                self.deferred.remove(&key);
                resized
            }
            Some(_) => {
                self.deferred.insert(
                    key.clone(),
                    DeferredResize {
                        resize: resize.clone(),
                    },
                );
                pod
            }
        };
        let now = Time(self.now());
        let conditions = pod
            .status
            .get_or_insert_with(PodStatus::default)
            .conditions
            .get_or_insert_with(Vec::new);
        let before = conditions
            .iter()
            .find(|c| c.type_ == "PodResizePending")
            .cloned();
        conditions.retain(|c| c.type_ != "PodResizePending");
        if let Some(reason) = verdict {
            // The transition time stays while the reason does.
            let since = before
                .filter(|c| c.reason.as_deref() == Some(reason))
                .and_then(|c| c.last_transition_time)
                .unwrap_or(now);
            conditions.push(PodCondition {
                type_: "PodResizePending".to_string(),
                status: "True".to_string(),
                reason: Some(reason.to_string()),
                message: Some(format!(
                    "the node has no room for the new requests ({reason})"
                )),
                last_transition_time: Some(since),
                ..PodCondition::default()
            });
        }
        let made = verdict.is_none();
        // Unchanged (a resize still deferred, or asked again as it is): nothing to show.
        if self.pods.get(&key) == Some(&pod) {
            return made;
        }
        self.put(pod);
        if made && node.is_some() {
            self.happened(Happening::Resized { pod: key });
            self.schedule_due = true;
        }
        made
    }

    /// Resizes the kubelet deferred, tried again: room may have freed.
    pub fn retry_deferred_resizes(&mut self) {
        let waiting: Vec<Resize> = self.deferred.values().map(|d| d.resize.clone()).collect();
        for resize in waiting {
            self.actuate_resize(&resize);
        }
    }

    // ---- the API server's eviction rules ----

    /// Whether a PodDisruptionBudget selecting `pod` allows no disruption now.
    fn budget_blocks(&self, pod: &Pod) -> Option<String> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let pod_labels = pod.labels();
        for (key, pdb) in &self.pdbs {
            if pdb.metadata.namespace.as_deref() != Some(ns.as_str()) {
                continue;
            }
            let Some(spec) = &pdb.spec else { continue };
            let Some(selector) = spec.selector.as_ref().and_then(|s| s.match_labels.as_ref())
            else {
                continue;
            };
            if !selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)) {
                continue;
            }
            let matching: Vec<&Pod> = self
                .pods
                .values()
                .filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()))
                .filter(|p| selector.iter().all(|(k, v)| p.labels().get(k) == Some(v)))
                .collect();
            let expected = matching.len() as i64;
            let healthy = matching
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter(|p| {
                    condition_true(
                        p.status.as_ref().and_then(|s| s.conditions.as_ref()),
                        "Ready",
                    )
                })
                .count() as i64;
            let count = |v: &IntOrString, round_up: bool| match v {
                IntOrString::Int(n) => i64::from(*n),
                IntOrString::String(s) => {
                    let pct: f64 = s.trim_end_matches('%').parse().unwrap_or(0.0);
                    let x = pct / 100.0 * expected as f64;
                    if round_up {
                        x.ceil() as i64
                    } else {
                        x.floor() as i64
                    }
                }
            };
            let allowed = match (&spec.min_available, &spec.max_unavailable) {
                (Some(min), _) => healthy - count(min, true),
                (None, Some(max)) => count(max, true) - (expected - healthy),
                (None, None) => healthy - expected,
            };
            if allowed <= 0 {
                return Some(format!(
                    "Cannot evict pod as it would violate the pod's disruption budget {key}"
                ));
            }
        }
        None
    }

    /// Why an eviction of `pod` is happening: the reason its node's claim is deleted with,
    /// or right-sizing when its node is not being drained.
    fn eviction_cause(&self, pod: &Pod) -> Gone {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        let claim = node.and_then(|n| {
            self.node_claims.values().find(|c| {
                c.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(n.as_str())
                    || c.name_any() == n
            })
        });
        match claim {
            Some(c) if c.metadata.deletion_timestamp.is_some() => {
                match c
                    .annotations()
                    .get(labels::TERMINATION_REASON_ANNOTATION)
                    .map(String::as_str)
                {
                    Some("interrupted") => Gone::EvictedBeforeReclaim,
                    _ => Gone::EvictedByDisruption,
                }
            }
            _ => Gone::EvictedToResize,
        }
    }
}

/// The object maps [`Objects::put`] stores into, per kind.
pub trait Stored: Resource<DynamicType = ()> + Clone + PartialEq + Sized {
    /// This kind's map.
    fn table(objects: &mut Objects) -> &mut BTreeMap<String, Self>;
}

macro_rules! stored {
    ($($kind:ty => $field:ident),* $(,)?) => {
        $(impl Stored for $kind {
            fn table(objects: &mut Objects) -> &mut BTreeMap<String, Self> {
                &mut objects.$field
            }
        })*
    };
}

stored!(
    Pod => pods,
    Node => nodes,
    NodeClaim => node_claims,
    NodePool => node_pools,
    AKSNodeClass => node_classes,
    PodDisruptionBudget => pdbs,
    RightsizingPolicy => policies,
    Recommendation => recommendations,
);

/// The workload kinds the agent reads but the simulated controllers do not change: shown
/// to the agent once, as they are.
impl Objects {
    /// Shows a workload object (Deployment, ReplicaSet, StatefulSet, Job, DaemonSet) to
    /// the agent; returns it with its uid.
    pub fn show<K: Fed>(&mut self, mut object: K) -> K {
        self.stamp(object.meta_mut());
        self.feed.apply(&object);
        object
    }
}

/// Deployments, ReplicaSets, StatefulSets, Jobs and DaemonSets are shown through
/// [`Objects::show`]; these assertions keep the kinds the feed takes in step.
const _: fn() = || {
    fn fed<K: Fed>() {}
    fed::<Deployment>();
    fed::<ReplicaSet>();
    fed::<StatefulSet>();
    fed::<Job>();
    fed::<DaemonSet>();
};

fn not_found_is_fine(found: bool) -> Result<()> {
    let _ = found;
    Ok(())
}

/// A server-side apply's merge of a map field: the applied keys over the existing ones, and
/// still no map when neither has a key (so applying the same object again is no change).
fn joined(
    existing: &Option<BTreeMap<String, String>>,
    applied: &Option<BTreeMap<String, String>>,
) -> Option<BTreeMap<String, String>> {
    let mut map = existing.clone().unwrap_or_default();
    map.extend(applied.clone().unwrap_or_default());
    (!map.is_empty() || existing.is_some()).then_some(map)
}

#[async_trait]
impl ClusterApi for SimCluster {
    async fn ensure_secret(
        &self,
        namespace: &str,
        wanted: &Secret,
        current: &(dyn for<'s> Fn(&'s Secret) -> bool + Send + Sync),
    ) -> Result<Secret> {
        let mut o = self.lock();
        let key = (namespace.to_string(), wanted.name_any());
        if let Some(s) = o.secrets.get(&key)
            && current(s)
        {
            return Ok(s.clone());
        }
        o.secrets.insert(key, wanted.clone());
        Ok(wanted.clone())
    }

    async fn apply_webhook_configuration(
        &self,
        _configuration: &MutatingWebhookConfiguration,
    ) -> Result<()> {
        // The simulated API server calls the webhook's decision itself
        // ([`Objects::serve_webhook`]); its configuration has nothing to configure.
        Ok(())
    }

    async fn apply_node_claim(&self, claim: &NodeClaim) -> Result<NodeClaim> {
        let mut o = self.lock();
        let name = claim.name_any();
        let mut object = match o.node_claims.get(&name) {
            Some(existing) => {
                let mut e = existing.clone();
                e.metadata.labels = joined(&e.metadata.labels, &claim.metadata.labels);
                e.metadata.annotations =
                    joined(&e.metadata.annotations, &claim.metadata.annotations);
                e.metadata.finalizers = claim.metadata.finalizers.clone();
                e.metadata.owner_references = claim.metadata.owner_references.clone();
                e.spec = claim.spec.clone();
                e
            }
            None => {
                let mut c = claim.clone();
                c.status = None;
                c.metadata.resource_version = None;
                c.metadata.uid = None;
                c.metadata.creation_timestamp = None;
                o.happened(Happening::ClaimCreated {
                    claim: Box::new(c.clone()),
                });
                c
            }
        };
        object.metadata.managed_fields = None;
        if let Some(id) = object
            .annotations()
            .get(crate::controllers::disruption::REPLACES_ANNOTATION)
        {
            o.commands
                .entry(id.clone())
                .or_default()
                .replacements
                .insert(name);
        }
        Ok(o.put(object))
    }

    async fn label_node_claim(&self, name: &str, labels: &BTreeMap<String, String>) -> Result<()> {
        let mut o = self.lock();
        let Some(mut claim) = o.node_claims.get(name).cloned() else {
            return Err(WriteError::Refused {
                what: format!("label nodeclaim {name}"),
                message: "not found".to_string(),
            });
        };
        claim.labels_mut().extend(labels.clone());
        o.put(claim);
        Ok(())
    }

    async fn apply_node_claim_status(
        &self,
        name: &str,
        _step: &str,
        status: &NodeClaimStatus,
    ) -> Result<()> {
        let mut o = self.lock();
        let Some(mut claim) = o.node_claims.get(name).cloned() else {
            return Ok(());
        };
        claim.status = Some(merged(&claim.status.clone().unwrap_or_default(), status));
        o.put(claim);
        Ok(())
    }

    async fn config_map_value(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
    ) -> Result<Option<String>> {
        let o = self.lock();
        Ok(o.config_maps
            .get(&(namespace.to_string(), name.to_string()))
            .and_then(|d| d.get(key).cloned()))
    }

    async fn apply_config_map_value(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> Result<()> {
        let mut o = self.lock();
        o.config_maps
            .entry((namespace.to_string(), name.to_string()))
            .or_default()
            .insert(key.to_string(), value.to_string());
        Ok(())
    }

    async fn apply_node_pool_status(&self, name: &str, status: &NodePoolStatus) -> Result<()> {
        let mut o = self.lock();
        let Some(mut pool) = o.node_pools.get(name).cloned() else {
            return Ok(());
        };
        pool.status = Some(merged(&pool.status.clone().unwrap_or_default(), status));
        o.put(pool);
        Ok(())
    }

    async fn apply_recommendation(&self, recommendation: &Recommendation) -> Result<()> {
        let mut o = self.lock();
        let key = key_of(
            recommendation.metadata.namespace.as_deref(),
            &recommendation.name_any(),
        );
        let object = match o.recommendations.get(&key) {
            Some(existing) => {
                let mut e = existing.clone();
                e.metadata.labels = recommendation.metadata.labels.clone();
                e.metadata.owner_references = recommendation.metadata.owner_references.clone();
                e.spec = recommendation.spec.clone();
                e
            }
            None => {
                let mut r = recommendation.clone();
                r.status = None;
                r.metadata.resource_version = None;
                r.metadata.uid = None;
                r
            }
        };
        o.put(object);
        Ok(())
    }

    async fn apply_recommendation_status(
        &self,
        namespace: &str,
        name: &str,
        status: &RecommendationStatus,
    ) -> Result<()> {
        let mut o = self.lock();
        let key = key_of(Some(namespace), name);
        let Some(mut r) = o.recommendations.get(&key).cloned() else {
            return Ok(());
        };
        r.status = Some(merged(&r.status.clone().unwrap_or_default(), status));
        o.put(r);
        Ok(())
    }

    async fn apply_rightsizing_policy_status(
        &self,
        namespace: &str,
        name: &str,
        status: &RightsizingPolicyStatus,
    ) -> Result<()> {
        let mut o = self.lock();
        let key = key_of(Some(namespace), name);
        let Some(mut p) = o.policies.get(&key).cloned() else {
            return Ok(());
        };
        let next = merged(&p.status.clone().unwrap_or_default(), status);
        if p.status.as_ref() == Some(&next) {
            return Ok(());
        }
        p.status = Some(next);
        o.put(p);
        Ok(())
    }

    async fn delete_node_claim(&self, name: &str) -> Result<()> {
        let mut o = self.lock();
        let found = o.node_claims.contains_key(name);
        o.delete::<NodeClaim>(name);
        not_found_is_fine(found)
    }

    async fn annotate_node_claim(
        &self,
        name: &str,
        annotations: &BTreeMap<&str, Option<String>>,
    ) -> Result<()> {
        let mut o = self.lock();
        let Some(mut claim) = o.node_claims.get(name).cloned() else {
            return Ok(());
        };
        if let Some(Some(id)) = annotations.get(crate::controllers::disruption::COMMAND_ANNOTATION)
        {
            o.commands
                .entry(id.clone())
                .or_default()
                .old
                .insert(name.to_string());
        }
        let a = claim.annotations_mut();
        for (k, v) in annotations {
            match v {
                Some(v) => {
                    a.insert((*k).to_string(), v.clone());
                }
                None => {
                    a.remove(*k);
                }
            }
        }
        o.put(claim);
        Ok(())
    }

    async fn remove_node_claim_finalizer(&self, claim: &NodeClaim, finalizer: &str) -> Result<()> {
        let mut o = self.lock();
        let name = claim.name_any();
        let Some(mut current) = o.node_claims.get(&name).cloned() else {
            return Ok(());
        };
        if current.metadata.resource_version != claim.metadata.resource_version {
            return Err(WriteError::Conflict {
                what: format!("finalizer of nodeclaim {name}"),
            });
        }
        current.finalizers_mut().retain(|f| f != finalizer);
        let gone = current.metadata.deletion_timestamp.is_some() && current.finalizers().is_empty();
        if gone {
            o.remove::<NodeClaim>(&name);
            o.happened(Happening::ClaimGone {
                claim: Box::new(current),
            });
        } else {
            o.put(current);
        }
        Ok(())
    }

    async fn patch_node(
        &self,
        node: &Node,
        taints: &[Taint],
        node_labels: &BTreeMap<String, String>,
        finalizers: &[String],
    ) -> Result<()> {
        let mut o = self.lock();
        let name = node.name_any();
        let Some(mut current) = o.nodes.get(&name).cloned() else {
            return Ok(());
        };
        if current.metadata.resource_version != node.metadata.resource_version {
            return Err(WriteError::Conflict {
                what: format!("patch node {name}"),
            });
        }
        current.labels_mut().extend(node_labels.clone());
        current.spec.get_or_insert_with(NodeSpec::default).taints = Some(taints.to_vec());
        current.metadata.finalizers = Some(finalizers.to_vec());
        if current.metadata.deletion_timestamp.is_some() && finalizers.is_empty() {
            o.remove::<Node>(&name);
            o.node_gone(&name);
        } else {
            o.put(current);
        }
        // Taints changed: registered nodes take DaemonSet pods, and pods may fit now.
        for w in 0..o.controllers.len() {
            if o.controllers[w].kind == "DaemonSet" {
                o.reconcile_daemon_set(w);
            }
        }
        o.schedule_due = true;
        Ok(())
    }

    async fn fresh_node(&self, name: &str) -> Result<Option<Node>> {
        Ok(self.lock().nodes.get(name).cloned())
    }

    async fn delete_node(&self, name: &str) -> Result<()> {
        let mut o = self.lock();
        if o.delete::<Node>(name) {
            o.node_gone(name);
        }
        Ok(())
    }

    async fn evict(&self, pod: &Pod) -> Result<()> {
        let mut o = self.lock();
        let key = pod_key(pod);
        let Some(current) = o.pods.get(&key).cloned() else {
            return Ok(());
        };
        if pod.metadata.uid.is_some() && current.metadata.uid != pod.metadata.uid {
            return Ok(());
        }
        if let Some(message) = o.budget_blocks(&current) {
            return Err(WriteError::EvictionRefused { pod: key, message });
        }
        let why = o.eviction_cause(&current);
        o.remove_pod(&key, why);
        Ok(())
    }

    async fn nominate(&self, namespace: &str, name: &str, node: &str) -> Result<()> {
        let mut o = self.lock();
        let key = key_of(Some(namespace), name);
        let Some(mut pod) = o.pods.get(&key).cloned() else {
            return Ok(());
        };
        pod.status
            .get_or_insert_with(PodStatus::default)
            .nominated_node_name = Some(node.to_string());
        o.put(pod);
        o.schedule_due = true;
        Ok(())
    }

    async fn resize_pod(&self, resize: &Resize) -> Result<()> {
        let mut o = self.lock();
        o.actuate_resize(resize);
        Ok(())
    }

    async fn apply_workload_template(&self, body: &serde_json::Value) -> Result<()> {
        let mut o = self.lock();
        let (kind, ns, name) = (
            body["kind"].as_str().unwrap_or_default(),
            body["metadata"]["namespace"].as_str().unwrap_or_default(),
            body["metadata"]["name"].as_str().unwrap_or_default(),
        );
        let Some(w) = o.controllers.iter().position(|c| {
            c.namespace == ns
                && (c.owner == name
                    || (c.kind == "ReplicaSet" && c.owner.starts_with(&format!("{name}-"))))
                && (c.kind == kind || (kind == "Deployment" && c.kind == "ReplicaSet"))
        }) else {
            return Ok(());
        };
        // New pods get the template's requests; the running ones are replaced one at a time
        // ([`Objects::roll`]), as a rollout with `maxUnavailable: 1` and no surge would.
        let mut template = serde_json::to_value(&o.controllers[w].template).unwrap_or_default();
        merge_by_name(
            &mut template["spec"]["containers"],
            &body["spec"]["template"]["spec"]["containers"],
        );
        if let Ok(t) = serde_json::from_value(template) {
            o.controllers[w].template = t;
            o.controllers[w].rolling = Some(o.now());
        }
        o.roll();
        Ok(())
    }

    async fn delete_pod(&self, pod: &Pod) -> Result<()> {
        let mut o = self.lock();
        let key = pod_key(pod);
        o.remove_pod(&key, Gone::Deleted);
        Ok(())
    }

    async fn event(
        &self,
        object: &ObjectReference,
        type_: EventType,
        reason: &str,
        _action: &str,
        note: String,
    ) {
        let mut o = self.lock();
        let at = o.now();
        o.events.push(RecordedEvent {
            at,
            kind: object.kind.clone().unwrap_or_default(),
            name: object.name.clone().unwrap_or_default(),
            warning: matches!(type_, EventType::Warning),
            reason: reason.to_string(),
            note,
        });
    }
}

/// Merges containers (by `name`) of an applied template into a template's.
fn merge_by_name(target: &mut Value, applied: &Value) {
    let (Some(t), Some(a)) = (target.as_array_mut(), applied.as_array()) else {
        return;
    };
    for item in a {
        if let Some(existing) = t.iter_mut().find(|x| x.get("name") == item.get("name")) {
            merge_applied(existing, item);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::VirtualClock;
    use crate::controllers::State;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).expect("valid")
    }

    fn cluster() -> (SimCluster, State, VirtualClock) {
        let clock = VirtualClock::new(t(0));
        let (state, feed) = State::in_memory();
        let c = SimCluster::new(feed, Arc::new(clock.clone()), 7);
        c.lock().synced();
        (c, state, clock)
    }

    fn node(name: &str, cpu: &str, memory: &str, taints: serde_json::Value) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {"providerID": format!("sim://{name}"), "taints": taints},
            "status": {
                "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }))
        .expect("a node")
    }

    fn template(cpu: &str, memory: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{
                "name": "app",
                "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}},
            }]},
        }))
        .expect("a template")
    }

    fn web(o: &mut Objects, kind: &'static str, cpu: &str, memory: &str) -> usize {
        let owner = ObjectMeta {
            name: Some("web-5c4d9b8f7".to_string()),
            namespace: Some("shop".to_string()),
            uid: Some("rs-uid".to_string()),
            ..ObjectMeta::default()
        };
        o.add_controller(Controller::new(kind, &owner, template(cpu, memory), 0))
    }

    fn bound(o: &Objects) -> BTreeMap<String, Option<String>> {
        o.pods
            .iter()
            .map(|(k, p)| (k.clone(), p.spec.as_ref().and_then(|s| s.node_name.clone())))
            .collect()
    }

    #[test]
    fn applied_status_merges_conditions_by_type_and_keeps_what_it_leaves_out() {
        let current = NodeClaimStatus {
            provider_id: Some("azure:///vm/a".to_string()),
            conditions: vec![
                crate::controllers::nodeclaim::condition("Launched", true, "Launched", "", t(0)),
                crate::controllers::nodeclaim::condition("Registered", false, "Waiting", "", t(0)),
            ],
            ..NodeClaimStatus::default()
        };
        let applied = NodeClaimStatus {
            node_name: Some("a".to_string()),
            conditions: vec![crate::controllers::nodeclaim::condition(
                "Registered",
                true,
                "Registered",
                "",
                t(5),
            )],
            ..NodeClaimStatus::default()
        };
        let m = merged(&current, &applied);
        assert_eq!(
            m.provider_id.as_deref(),
            Some("azure:///vm/a"),
            "left alone"
        );
        assert_eq!(m.node_name.as_deref(), Some("a"));
        let kinds: Vec<(&str, &str)> = m
            .conditions
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect();
        assert_eq!(kinds, [("Launched", "True"), ("Registered", "True")]);
    }

    #[tokio::test]
    async fn a_claim_with_a_finalizer_goes_only_when_it_is_lifted_and_only_from_the_version_read() {
        let (c, state, _) = cluster();
        let claim: NodeClaim = serde_yaml::from_str(
            "apiVersion: tailor.sh/v1alpha1\nkind: NodeClaim\nmetadata: {name: a, finalizers: [tailor.sh/termination]}\nspec:\n  nodeClassRef: {group: tailor.sh, kind: AKSNodeClass, name: default}\n",
        )
        .expect("a claim");
        c.apply_node_claim(&claim).await.expect("created");
        c.delete_node_claim("a").await.expect("deleted");
        let marked = c.lock().node_claims.get("a").cloned().expect("still there");
        assert!(marked.metadata.deletion_timestamp.is_some());
        // A stale copy cannot lift the finalizer.
        let stale = claim.clone();
        assert!(matches!(
            c.remove_node_claim_finalizer(&stale, labels::TERMINATION_FINALIZER)
                .await,
            Err(WriteError::Conflict { .. })
        ));
        assert!(c.lock().node_claims.contains_key("a"));
        c.remove_node_claim_finalizer(&marked, labels::TERMINATION_FINALIZER)
            .await
            .expect("lifted");
        assert!(!c.lock().node_claims.contains_key("a"));
        assert!(
            state.node_claims.state().is_empty(),
            "the store shows it gone"
        );
    }

    #[tokio::test]
    async fn a_write_that_changes_nothing_is_no_change() {
        let (c, state, _) = cluster();
        let claim: NodeClaim = serde_yaml::from_str(
            "apiVersion: tailor.sh/v1alpha1\nkind: NodeClaim\nmetadata: {name: a}\nspec:\n  nodeClassRef: {group: tailor.sh, kind: AKSNodeClass, name: default}\n",
        )
        .expect("a claim");
        c.apply_node_claim(&claim).await.expect("created");
        let before = state.generation();
        let version = c.lock().node_claims["a"].metadata.resource_version.clone();
        c.apply_node_claim(&claim).await.expect("applied again");
        assert_eq!(state.generation(), before);
        assert_eq!(c.lock().node_claims["a"].metadata.resource_version, version);
        c.label_node_claim("a", &BTreeMap::from([("x".to_string(), "1".to_string())]))
            .await
            .expect("labelled");
        assert_eq!(state.generation(), before + 1, "a real change is shown");
    }

    #[test]
    fn the_scheduler_binds_where_pods_fit_a_nomination_first_and_marks_the_rest() {
        let (c, _, _) = cluster();
        let mut o = c.lock();
        o.put(node("a", "2", "4Gi", serde_json::json!([])));
        o.put(node("b", "2", "4Gi", serde_json::json!([])));
        o.put(node(
            "tainted",
            "16",
            "64Gi",
            serde_json::json!([{"key": "tailor.sh/disrupted", "effect": "NoSchedule"}]),
        ));
        let w = web(&mut o, "ReplicaSet", "1500m", "1Gi");
        o.scale(w, 3);
        // Nominate the last pod to b: it goes there even though a comes first by name.
        let last = o.pods.keys().next_back().cloned().expect("a pod");
        if let Some(p) = o.pods.get(&last).cloned() {
            let mut p = p;
            p.status
                .get_or_insert_with(PodStatus::default)
                .nominated_node_name = Some("b".to_string());
            o.put(p);
        }
        o.schedule();
        let placed = bound(&o);
        assert_eq!(placed[&last].as_deref(), Some("b"));
        let on = |n: &str| placed.values().filter(|x| x.as_deref() == Some(n)).count();
        assert_eq!((on("a"), on("b"), on("tainted")), (1, 1, 0), "{placed:?}");
        let pending: Vec<&Pod> = o
            .pods
            .values()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none())
            .collect();
        assert_eq!(pending.len(), 1);
        assert!(crate::controllers::provisioning::is_provisionable(
            pending[0]
        ));
        // Bound pods run.
        let running = o
            .pods
            .values()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        assert_eq!(running, 2);
    }

    #[test]
    fn the_scheduler_spreads_a_workload_as_kube_scheduler_scores_and_a_failed_nomination_is_cleared()
     {
        let (c, _, _) = cluster();
        let mut o = c.lock();
        o.put(node("a", "8", "32Gi", serde_json::json!([])));
        o.put(node("b", "8", "32Gi", serde_json::json!([])));
        let w = web(&mut o, "ReplicaSet", "500m", "1Gi");
        o.scale(w, 4);
        o.schedule();
        // All four fit on a; kube-scheduler's least-allocated and spread scores put two on
        // each node.
        let placed = bound(&o);
        let on = |n: &str| placed.values().filter(|x| x.as_deref() == Some(n)).count();
        assert_eq!((on("a"), on("b")), (2, 2), "{placed:?}");

        // A pod nominated to a node it does not fit loses the nomination and says why.
        let big = web(&mut o, "ReplicaSet", "7500m", "1Gi");
        o.scale(big, 1);
        let key = o
            .pod_workload
            .iter()
            .find(|(_, w)| **w == big)
            .map(|(k, _)| k.clone())
            .expect("the big pod");
        let mut p = o.pods[&key].clone();
        p.status
            .get_or_insert_with(PodStatus::default)
            .nominated_node_name = Some("a".to_string());
        o.put(p);
        o.schedule_due = true;
        o.schedule();
        let status = o.pods[&key].status.clone().unwrap_or_default();
        assert_eq!(status.nominated_node_name, None);
        let scheduled = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "PodScheduled")
            .expect("PodScheduled");
        assert_eq!(
            (scheduled.status.as_str(), scheduled.reason.as_deref()),
            ("False", Some("Unschedulable"))
        );
        assert_eq!(
            scheduled.message.as_deref(),
            Some("0/2 nodes are available: 2 Insufficient cpu.")
        );
    }

    #[tokio::test]
    async fn an_eviction_a_budget_forbids_is_refused_and_an_allowed_one_is_replaced() {
        let (c, _, _) = cluster();
        {
            let mut o = c.lock();
            o.put(node("a", "8", "16Gi", serde_json::json!([])));
            let w = web(&mut o, "ReplicaSet", "500m", "512Mi");
            o.scale(w, 2);
            o.schedule();
            o.put::<PodDisruptionBudget>(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "web", "namespace": "shop"},
                    "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}},
                }))
                .expect("a pdb"),
            );
        }
        let first = c.lock().pods.values().next().cloned().expect("a pod");
        assert!(matches!(
            c.evict(&first).await,
            Err(WriteError::EvictionRefused { .. })
        ));
        assert_eq!(c.lock().pods.len(), 2);
        c.lock().pdbs.clear();
        let before: BTreeSet<String> = c.lock().pods.keys().cloned().collect();
        c.evict(&first).await.expect("evicted");
        let o = c.lock();
        let after: BTreeSet<String> = o.pods.keys().cloned().collect();
        assert_eq!(after.len(), 2, "the ReplicaSet replaced it");
        assert!(!after.contains(&pod_key(&first)));
        assert_eq!(after.difference(&before).count(), 1);
    }

    #[tokio::test]
    async fn a_resize_is_made_with_room_deferred_without_and_infeasible_past_the_node() {
        let (c, _, _) = cluster();
        let keys = {
            let mut o = c.lock();
            o.put(node("a", "4", "8Gi", serde_json::json!([])));
            let w = web(&mut o, "ReplicaSet", "1", "1Gi");
            o.scale(w, 2);
            o.schedule();
            o.pods.keys().cloned().collect::<Vec<_>>()
        };
        let resize = |pod: &str, cpu: &str| Resize {
            namespace: "shop".to_string(),
            pod: pod.rsplit('/').next().unwrap_or_default().to_string(),
            containers: vec![crate::actuation::ContainerResize {
                name: "app".to_string(),
                requests: BTreeMap::from([("cpu".to_string(), Quantity(cpu.to_string()))]),
                limits: BTreeMap::new(),
            }],
        };
        let pending = |c: &SimCluster, k: &str| {
            c.lock().pods[k]
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "PodResizePending"))
                .and_then(|c| c.reason.clone())
        };
        // 1 + 2 cores on a 4-core node: made.
        c.resize_pod(&resize(&keys[0], "2")).await.expect("asked");
        assert_eq!(pod_requests(&c.lock().pods[&keys[0]]).0, 2000);
        assert_eq!(pending(&c, &keys[0]), None);
        // 2 + 3 cores: no room now.
        c.resize_pod(&resize(&keys[1], "3")).await.expect("asked");
        assert_eq!(pod_requests(&c.lock().pods[&keys[1]]).0, 1000, "unchanged");
        assert_eq!(pending(&c, &keys[1]).as_deref(), Some("Deferred"));
        // Room frees (the first pod is sized down): the kubelet makes it.
        c.resize_pod(&resize(&keys[0], "500m"))
            .await
            .expect("asked");
        c.lock().retry_deferred_resizes();
        assert_eq!(pod_requests(&c.lock().pods[&keys[1]]).0, 3000);
        assert_eq!(pending(&c, &keys[1]), None);
        // More than the node has: infeasible, and the pod keeps its size.
        c.resize_pod(&resize(&keys[0], "6")).await.expect("asked");
        assert_eq!(pending(&c, &keys[0]).as_deref(), Some("Infeasible"));
        assert_eq!(pod_requests(&c.lock().pods[&keys[0]]).0, 500);
    }

    #[test]
    fn daemon_set_pods_come_to_registered_nodes_and_not_to_tainted_ones() {
        let (c, _, _) = cluster();
        let mut o = c.lock();
        o.put(node("ready", "4", "8Gi", serde_json::json!([])));
        o.put(node(
            "booting",
            "4",
            "8Gi",
            serde_json::json!([{"key": labels::UNREGISTERED_TAINT_KEY, "effect": "NoExecute"}]),
        ));
        let w = web(&mut o, "DaemonSet", "100m", "128Mi");
        o.scale(w, 0);
        let placed: Vec<Option<String>> = bound(&o).into_values().collect();
        assert_eq!(placed, [Some("ready".to_string())]);
    }
}
