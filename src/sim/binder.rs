//! kube-scheduler's default binding, played for the simulated cluster: which node a pending
//! pod is bound to, one pod at a time, by the filters and weighted scores of the default
//! scheduler profile (Kubernetes 1.35).
//!
//! It is written from kube-scheduler's documented behaviour and reads the objects as the API
//! holds them. It shares nothing with Tailor's planner and packer: where the plan and
//! kube-scheduler disagree, the simulated cluster shows it, as a real one would. The
//! node-label, toleration, selector and host-port rules come from the plan validator's own
//! reading of them ([`crate::scheduling::validate::matching`]), which is itself kept apart
//! from the planner.
//!
//! Filters, in kube-scheduler's order: node unschedulable, node affinity (`nodeSelector` and
//! required terms), host ports, resources (requests, plus those of pods nominated to the node
//! with at least the pod's priority) and pod count, taints (`NoSchedule`, `NoExecute`),
//! topology spread (`DoNotSchedule`) and required inter-pod (anti-)affinity, both ways.
//!
//! Scores, each normalised to 0..=100 and weighted as the default profile weighs them: taint
//! toleration 3 (untolerated `PreferNoSchedule` taints, fewer is better), node affinity 2
//! (preferred terms), resources fit 1 (least allocated, with kube-scheduler's non-zero
//! defaults of 100m CPU and 200 MiB for a container that requests nothing), topology spread 2
//! (the pod's `ScheduleAnyway` constraints or, without any, the system defaults: hostname
//! with skew 3 and zone with skew 5 over the pods of its ReplicaSet or StatefulSet), inter-pod
//! affinity 2 (preferred terms both ways and other pods' required affinity at weight 1), and
//! balanced allocation 1. Image locality and volume scoring add nothing here: simulated nodes
//! pull no images and carry no volumes.
//!
//! A pod nominated to a node is bound there without scoring when the node passes every
//! filter, as kube-scheduler evaluates a nominated node first. Among nodes of equal best
//! score kube-scheduler picks at random; [`Binder::choose`] returns all of them and
//! [`Binder::pick`] takes one by a hash of the pod and node names, so runs repeat.
//!
//! Left out: volume filters (simulated pods have no volumes), namespace selectors on
//! affinity terms (only listed namespaces or the pod's own), and the nominated pods' effect on
//! filters other than resources.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, Node, NodeSelector, Pod, PodAffinityTerm, PodSpec, Taint, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;

use crate::model::quantity;
use crate::scheduling::validate::matching;

/// The most a score plugin gives a node.
const MAX_SCORE: i64 = 100;
/// kube-scheduler's CPU request for a container that sets none, when scoring (millicores).
const DEFAULT_CPU_MILLI: i64 = 100;
/// kube-scheduler's memory request for a container that sets none, when scoring (bytes).
const DEFAULT_MEMORY: i64 = 200 * 1024 * 1024;
const HOSTNAME: &str = "kubernetes.io/hostname";
const ZONE: &str = "topology.kubernetes.io/zone";
const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

/// The default profile's score weights.
const W_TAINT: i64 = 3;
const W_NODE_AFFINITY: i64 = 2;
const W_FIT: i64 = 1;
const W_SPREAD: i64 = 2;
const W_POD_AFFINITY: i64 = 2;
const W_BALANCED: i64 = 1;

/// CPU (millicores), memory (bytes) and pods.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Amount {
    cpu: i64,
    memory: i64,
}

impl Amount {
    fn add(self, o: Amount) -> Amount {
        Amount {
            cpu: self.cpu + o.cpu,
            memory: self.memory + o.memory,
        }
    }
    fn max(self, o: Amount) -> Amount {
        Amount {
            cpu: self.cpu.max(o.cpu),
            memory: self.memory.max(o.memory),
        }
    }
}

/// What a pod asks of a node: its requests as the filter counts them, and as least-allocated
/// scoring counts them (a container without a CPU or memory request counts the default).
#[derive(Debug, Clone, Copy, Default)]
struct Demand {
    requested: Amount,
    non_zero: Amount,
}

fn container_demand(c: &Container) -> Result<Demand, String> {
    let requests = c.resources.as_ref().and_then(|r| r.requests.as_ref());
    let get = |name: &str| requests.and_then(|r| r.get(name)).map(|q| q.0.as_str());
    let cpu = get("cpu")
        .map(|v| {
            quantity::parse_milli(v).map_err(|e| format!("container {} cpu {v:?}: {e}", c.name))
        })
        .transpose()?;
    let memory = get("memory")
        .map(|v| {
            quantity::parse_value(v).map_err(|e| format!("container {} memory {v:?}: {e}", c.name))
        })
        .transpose()?;
    Ok(Demand {
        requested: Amount {
            cpu: cpu.unwrap_or(0),
            memory: memory.unwrap_or(0),
        },
        non_zero: Amount {
            cpu: cpu.unwrap_or(DEFAULT_CPU_MILLI),
            memory: memory.unwrap_or(DEFAULT_MEMORY),
        },
    })
}

/// A pod's effective requests: the sum of its containers and sidecars (init containers that
/// restart always), or the largest init container with the sidecars started before it, if
/// more; plus the pod's overhead.
fn pod_demand(spec: &PodSpec) -> Result<Demand, String> {
    let mut requested = Amount::default();
    let mut non_zero = Amount::default();
    for c in &spec.containers {
        let d = container_demand(c)?;
        requested = requested.add(d.requested);
        non_zero = non_zero.add(d.non_zero);
    }
    let mut sidecars = Demand::default();
    let mut init_peak = Demand::default();
    for c in spec.init_containers.iter().flatten() {
        let d = container_demand(c)?;
        if c.restart_policy.as_deref() == Some("Always") {
            sidecars.requested = sidecars.requested.add(d.requested);
            sidecars.non_zero = sidecars.non_zero.add(d.non_zero);
        } else {
            init_peak.requested = init_peak.requested.max(sidecars.requested.add(d.requested));
            init_peak.non_zero = init_peak.non_zero.max(sidecars.non_zero.add(d.non_zero));
        }
    }
    requested = requested.add(sidecars.requested).max(init_peak.requested);
    non_zero = non_zero.add(sidecars.non_zero).max(init_peak.non_zero);
    if let Some(overhead) = &spec.overhead {
        for (name, q) in overhead {
            let v = &q.0;
            match name.as_str() {
                "cpu" => {
                    let m =
                        quantity::parse_milli(v).map_err(|e| format!("overhead cpu {v:?}: {e}"))?;
                    requested.cpu += m;
                    non_zero.cpu += m;
                }
                "memory" => {
                    let b = quantity::parse_value(v)
                        .map_err(|e| format!("overhead memory {v:?}: {e}"))?;
                    requested.memory += b;
                    non_zero.memory += b;
                }
                _ => {}
            }
        }
    }
    Ok(Demand {
        requested,
        non_zero,
    })
}

fn spec(pod: &Pod) -> &PodSpec {
    static EMPTY: std::sync::OnceLock<PodSpec> = std::sync::OnceLock::new();
    pod.spec
        .as_ref()
        .unwrap_or_else(|| EMPTY.get_or_init(PodSpec::default))
}

fn key(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

fn priority(pod: &Pod) -> i32 {
    spec(pod).priority.unwrap_or(0)
}

fn terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// A node as the scheduler's cache holds it: its allocatable and what its pods request.
struct Slot<'a> {
    node: &'a Node,
    name: String,
    allocatable: Amount,
    max_pods: i64,
    requested: Amount,
    non_zero: Amount,
    pods: Vec<&'a Pod>,
}

impl Slot<'_> {
    fn labels(&self) -> &BTreeMap<String, String> {
        self.node.labels()
    }
    fn taints(&self) -> &[Taint] {
        self.node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_deref())
            .unwrap_or_default()
    }
    fn label(&self, key: &str) -> Option<&str> {
        self.labels().get(key).map(String::as_str)
    }
}

fn parse_node(node: &Node) -> (Amount, i64) {
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let get = |name: &str| allocatable.and_then(|a| a.get(name)).map(|q| q.0.as_str());
    let cpu = get("cpu")
        .and_then(|v| quantity::parse_milli(v).ok())
        .unwrap_or(0);
    let memory = get("memory")
        .and_then(|v| quantity::parse_value(v).ok())
        .unwrap_or(0);
    let pods = get("pods")
        .and_then(|v| quantity::parse_value(v).ok())
        .unwrap_or(0);
    (Amount { cpu, memory }, pods)
}

/// Why a pod fits no node, by the first filter each node failed, as kube-scheduler's
/// `FailedScheduling` message counts them.
#[derive(Debug, Clone, PartialEq)]
pub struct Unschedulable {
    /// Nodes considered.
    pub nodes: usize,
    /// Reason → number of nodes it ruled out.
    pub reasons: BTreeMap<String, usize>,
}

impl std::fmt::Display for Unschedulable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "0/{} nodes are available", self.nodes)?;
        let mut sep = ": ";
        for (reason, n) in &self.reasons {
            write!(f, "{sep}{n} {reason}")?;
            sep = ", ";
        }
        write!(f, ".")
    }
}

/// Where a pod may go: the nominated node it is bound to without scoring, or the nodes of
/// equal best score (kube-scheduler picks one of them at random).
#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    /// The pod's nominated node passed every filter.
    Nominated(String),
    /// The nodes of the best total score, by name, and that score.
    Best {
        /// Nodes of equal best score.
        nodes: Vec<String>,
        /// The weighted total.
        score: i64,
    },
}

impl Choice {
    /// Whether kube-scheduler may bind the pod to `node`.
    pub fn allows(&self, node: &str) -> bool {
        match self {
            Choice::Nominated(n) => n == node,
            Choice::Best { nodes, .. } => nodes.iter().any(|n| n == node),
        }
    }
}

/// The selector of the workload a pod belongs to, for the system default topology spread
/// (kube-scheduler merges those of the Services, ReplicaSets and StatefulSets selecting it).
pub type DefaultSelector<'f> = dyn Fn(&Pod) -> Option<LabelSelector> + 'f;

/// kube-scheduler's view of a cluster during one pass: the nodes, the pods bound to them and
/// the pods still pending (whose nominations reserve room).
pub struct Binder<'a> {
    slots: Vec<Slot<'a>>,
    nominated: Vec<(&'a Pod, usize, Demand)>,
    default_selector: &'a DefaultSelector<'a>,
}

/// A pod's pod-affinity terms: required affinity, required anti-affinity, preferred affinity
/// (weighted), preferred anti-affinity (weighted).
struct Terms<'p> {
    affinity: &'p [PodAffinityTerm],
    anti: &'p [PodAffinityTerm],
    preferred: Vec<(i64, &'p PodAffinityTerm)>,
    preferred_anti: Vec<(i64, &'p PodAffinityTerm)>,
}

fn terms(pod: &Pod) -> Terms<'_> {
    let affinity = spec(pod).affinity.as_ref();
    let pa = affinity.and_then(|a| a.pod_affinity.as_ref());
    let paa = affinity.and_then(|a| a.pod_anti_affinity.as_ref());
    Terms {
        affinity: pa
            .and_then(|p| {
                p.required_during_scheduling_ignored_during_execution
                    .as_deref()
            })
            .unwrap_or_default(),
        anti: paa
            .and_then(|p| {
                p.required_during_scheduling_ignored_during_execution
                    .as_deref()
            })
            .unwrap_or_default(),
        preferred: pa
            .and_then(|p| {
                p.preferred_during_scheduling_ignored_during_execution
                    .as_deref()
            })
            .unwrap_or_default()
            .iter()
            .map(|w| (i64::from(w.weight), &w.pod_affinity_term))
            .collect(),
        preferred_anti: paa
            .and_then(|p| {
                p.preferred_during_scheduling_ignored_during_execution
                    .as_deref()
            })
            .unwrap_or_default()
            .iter()
            .map(|w| (i64::from(w.weight), &w.pod_affinity_term))
            .collect(),
    }
}

/// Whether `term`, written on `owner`, selects `other`: the namespace is the owner's unless
/// the term lists namespaces (an empty namespace selector selects every namespace), and the
/// labels match its selector with `matchLabelKeys` / `mismatchLabelKeys` merged in.
fn term_selects(term: &PodAffinityTerm, owner: &Pod, other: &Pod) -> bool {
    let other_ns = other.namespace().unwrap_or_default();
    let owner_ns = owner.namespace().unwrap_or_default();
    let listed = term.namespaces.as_deref().unwrap_or_default();
    let all_namespaces = term.namespace_selector.as_ref().is_some_and(|s| {
        s.match_labels.as_ref().is_none_or(|m| m.is_empty())
            && s.match_expressions.as_ref().is_none_or(|m| m.is_empty())
    });
    let in_namespace = all_namespaces
        || if listed.is_empty() {
            other_ns == owner_ns
        } else {
            listed.contains(&other_ns)
        };
    if !in_namespace {
        return false;
    }
    let owner_labels = owner.labels();
    fn own<'k>(
        keys: Option<&'k Vec<String>>,
        labels: &'k BTreeMap<String, String>,
    ) -> Vec<(&'k str, &'k str)> {
        keys.into_iter()
            .flatten()
            .filter_map(|k| labels.get(k).map(|v| (k.as_str(), v.as_str())))
            .collect()
    }
    matching::selector_matches(
        term.label_selector.as_ref(),
        &own(term.match_label_keys.as_ref(), owner_labels),
        &own(term.mismatch_label_keys.as_ref(), owner_labels),
        other.labels(),
    )
}

/// A topology spread constraint as the scheduler applies it: its key, skew and the selector
/// of the pods it counts (with `matchLabelKeys` merged in), and whether the node
/// inclusion policy honours taints.
struct Spread {
    key: String,
    max_skew: i64,
    min_domains: Option<i32>,
    selector: LabelSelector,
    same: Vec<(String, String)>,
    honour_taints: bool,
    honour_affinity: bool,
}

impl Spread {
    fn counts(&self, owner_ns: &str, pod: &Pod) -> bool {
        if terminating(pod) || pod.namespace().unwrap_or_default() != owner_ns {
            return false;
        }
        let same: Vec<(&str, &str)> = self
            .same
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        matching::selector_matches(Some(&self.selector), &same, &[], pod.labels())
    }
}

fn explicit_spreads(pod: &Pod, when: &str) -> Vec<Spread> {
    let labels = pod.labels();
    spec(pod)
        .topology_spread_constraints
        .iter()
        .flatten()
        .filter(|c: &&TopologySpreadConstraint| c.when_unsatisfiable == when)
        .map(|c| Spread {
            key: c.topology_key.clone(),
            max_skew: i64::from(c.max_skew),
            min_domains: c.min_domains,
            selector: c.label_selector.clone().unwrap_or_default(),
            same: c
                .match_label_keys
                .iter()
                .flatten()
                .filter_map(|k| labels.get(k).map(|v| (k.clone(), v.clone())))
                .collect(),
            honour_taints: c.node_taints_policy.as_deref() == Some("Honor"),
            honour_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
        })
        .collect()
}

impl<'a> Binder<'a> {
    /// The scheduler's view of `nodes` (those it may bind to) with `pods`: each pod bound to
    /// one of them counts there; a pending pod nominated to one reserves its room for pods of
    /// lower or equal priority.
    pub fn new(
        nodes: impl IntoIterator<Item = &'a Node>,
        pods: impl IntoIterator<Item = &'a Pod>,
        default_selector: &'a DefaultSelector<'a>,
    ) -> Self {
        let mut slots: Vec<Slot<'a>> = nodes
            .into_iter()
            .map(|node| {
                let (allocatable, max_pods) = parse_node(node);
                Slot {
                    node,
                    name: node.name_any(),
                    allocatable,
                    max_pods,
                    requested: Amount::default(),
                    non_zero: Amount::default(),
                    pods: Vec::new(),
                }
            })
            .collect();
        let index: BTreeMap<String, usize> = slots
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.clone(), i))
            .collect();
        let mut nominated = Vec::new();
        for pod in pods {
            if finished(pod) {
                continue;
            }
            let Ok(demand) = pod_demand(spec(pod)) else {
                continue;
            };
            match spec(pod).node_name.as_deref() {
                Some(node) => {
                    if let Some(&i) = index.get(node) {
                        let slot = &mut slots[i];
                        slot.requested = slot.requested.add(demand.requested);
                        slot.non_zero = slot.non_zero.add(demand.non_zero);
                        slot.pods.push(pod);
                    }
                }
                None => {
                    let to = pod
                        .status
                        .as_ref()
                        .and_then(|s| s.nominated_node_name.as_deref())
                        .and_then(|n| index.get(n));
                    if let Some(&i) = to
                        && !terminating(pod)
                    {
                        nominated.push((pod, i, demand));
                    }
                }
            }
        }
        Binder {
            slots,
            nominated,
            default_selector,
        }
    }

    /// kube-scheduler's queue order: higher priority first, then the pod that came first.
    pub fn order(pending: &mut [&Pod]) {
        pending.sort_by(|a, b| {
            priority(b)
                .cmp(&priority(a))
                .then_with(|| {
                    a.metadata
                        .creation_timestamp
                        .cmp(&b.metadata.creation_timestamp)
                })
                .then_with(|| key(a).cmp(&key(b)))
        });
    }

    /// The first filter `pod` fails on slot `i`, if any.
    fn filter(&self, pod: &Pod, demand: &Demand, i: usize) -> Option<String> {
        let slot = &self.slots[i];
        let s = spec(pod);
        let tolerations = s.tolerations.as_deref().unwrap_or_default();
        // NodeUnschedulable.
        let cordoned = slot
            .node
            .spec
            .as_ref()
            .and_then(|n| n.unschedulable)
            .unwrap_or(false);
        if cordoned {
            let taint = Taint {
                key: UNSCHEDULABLE_TAINT.to_string(),
                effect: "NoSchedule".to_string(),
                ..Taint::default()
            };
            if !tolerations.iter().any(|t| matching::tolerates(t, &taint)) {
                return Some("node(s) were unschedulable".to_string());
            }
        }
        // NodeAffinity.
        if !self.affinity_admits(pod, slot) {
            return Some("node(s) didn't match Pod's node affinity/selector".to_string());
        }
        // NodePorts.
        let ports = |p: &Pod| {
            spec(p)
                .containers
                .iter()
                .chain(spec(p).init_containers.iter().flatten())
                .flat_map(|c| c.ports.iter().flatten())
                .cloned()
                .collect::<Vec<_>>()
        };
        let wanted = ports(pod);
        if wanted.iter().any(|w| w.host_port.is_some())
            && slot.pods.iter().any(|p| {
                ports(p)
                    .iter()
                    .any(|u| wanted.iter().any(|w| matching::host_ports_conflict(w, u)))
            })
        {
            return Some("node(s) didn't have free ports for the requested pod ports".to_string());
        }
        // NodeResourcesFit, with the room pods nominated here of at least this priority hold.
        let mut requested = slot.requested;
        let mut count = slot.pods.len() as i64;
        let me = key(pod);
        for (other, j, d) in &self.nominated {
            if *j == i && priority(other) >= priority(pod) && key(other) != me {
                requested = requested.add(d.requested);
                count += 1;
            }
        }
        if count + 1 > slot.max_pods {
            return Some("Too many pods".to_string());
        }
        if demand.requested.cpu > 0 && requested.cpu + demand.requested.cpu > slot.allocatable.cpu {
            return Some("Insufficient cpu".to_string());
        }
        if demand.requested.memory > 0
            && requested.memory + demand.requested.memory > slot.allocatable.memory
        {
            return Some("Insufficient memory".to_string());
        }
        // TaintToleration.
        if let Some(t) = matching::untolerated(slot.taints(), tolerations) {
            return Some(format!(
                "node(s) had untolerated taint {{{}}}",
                matching::describe_taint(t)
            ));
        }
        // PodTopologySpread (DoNotSchedule).
        if let Some(reason) = self.spread_filter(pod, slot) {
            return Some(reason);
        }
        // InterPodAffinity.
        self.pod_affinity_filter(pod, slot)
    }

    fn affinity_admits(&self, pod: &Pod, slot: &Slot<'_>) -> bool {
        let s = spec(pod);
        let required: Option<&NodeSelector> = s
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| {
                n.required_during_scheduling_ignored_during_execution
                    .as_ref()
            });
        matching::node_admits(
            s.node_selector.as_ref().unwrap_or(&BTreeMap::new()),
            required,
            &slot.name,
            slot.labels(),
        )
        .is_ok()
    }

    /// Whether a node's pods count towards a spread constraint's domains: it has the key,
    /// and passes the pod's node affinity and taints as the inclusion policies say.
    fn spread_includes(&self, pod: &Pod, c: &Spread, slot: &Slot<'_>) -> bool {
        if c.honour_affinity && !self.affinity_admits(pod, slot) {
            return false;
        }
        if c.honour_taints
            && matching::untolerated(
                slot.taints(),
                spec(pod).tolerations.as_deref().unwrap_or_default(),
            )
            .is_some()
        {
            return false;
        }
        true
    }

    fn spread_filter(&self, pod: &Pod, slot: &Slot<'_>) -> Option<String> {
        let constraints = explicit_spreads(pod, "DoNotSchedule");
        if constraints.is_empty() {
            return None;
        }
        let ns = pod.namespace().unwrap_or_default();
        for c in &constraints {
            let Some(value) = slot.label(&c.key) else {
                return Some(
                    "node(s) didn't match pod topology spread constraints (missing required label)"
                        .to_string(),
                );
            };
            let mut domains: BTreeMap<&str, i64> = BTreeMap::new();
            for other in &self.slots {
                let has_all = constraints.iter().all(|k| other.label(&k.key).is_some());
                if !has_all || !self.spread_includes(pod, c, other) {
                    continue;
                }
                let Some(v) = other.label(&c.key) else {
                    continue;
                };
                let n = other.pods.iter().filter(|p| c.counts(&ns, p)).count() as i64;
                *domains.entry(v).or_default() += n;
            }
            let mut min = domains.values().copied().min().unwrap_or(0);
            if let Some(m) = c.min_domains
                && (domains.len() as i64) < i64::from(m)
            {
                min = 0;
            }
            let own = i64::from(c.counts(&ns, pod));
            let here = domains.get(value).copied().unwrap_or(0);
            if here + own - min > c.max_skew {
                return Some("node(s) didn't match pod topology spread constraints".to_string());
            }
        }
        None
    }

    fn pod_affinity_filter(&self, pod: &Pod, slot: &Slot<'_>) -> Option<String> {
        let mine = terms(pod);
        let same_domain = |other: &Slot<'_>, key: &str| -> bool {
            match (slot.label(key), other.label(key)) {
                (Some(a), Some(b)) => a == b,
                _ => false,
            }
        };
        // The pod's anti-affinity against pods in the node's domain.
        for t in mine.anti {
            for other in &self.slots {
                if same_domain(other, &t.topology_key)
                    && other.pods.iter().any(|p| term_selects(t, pod, p))
                {
                    return Some("node(s) didn't match pod anti-affinity rules".to_string());
                }
            }
        }
        // Other pods' anti-affinity against this pod.
        for other in &self.slots {
            for p in &other.pods {
                for t in terms(p).anti {
                    if same_domain(other, &t.topology_key) && term_selects(t, p, pod) {
                        return Some(
                            "node(s) didn't satisfy existing pods anti-affinity rules".to_string(),
                        );
                    }
                }
            }
        }
        // The pod's affinity. Pods matching every term count in their node's domain of each
        // term; the node needs a count in each of its domains, unless no pod counts anywhere
        // and the pod matches its own terms (the first of its group).
        if !mine.affinity.is_empty() {
            let mut counted: BTreeMap<(&str, &str), usize> = BTreeMap::new();
            for other in &self.slots {
                for p in &other.pods {
                    if !mine.affinity.iter().all(|t| term_selects(t, pod, p)) {
                        continue;
                    }
                    for t in mine.affinity {
                        if let Some(v) = other.label(&t.topology_key) {
                            *counted.entry((t.topology_key.as_str(), v)).or_default() += 1;
                        }
                    }
                }
            }
            let mut exist = true;
            for t in mine.affinity {
                let Some(v) = slot.label(&t.topology_key) else {
                    return Some("node(s) didn't match pod affinity rules".to_string());
                };
                if !counted.contains_key(&(t.topology_key.as_str(), v)) {
                    exist = false;
                }
            }
            let first_of_group =
                counted.is_empty() && mine.affinity.iter().all(|t| term_selects(t, pod, pod));
            if !exist && !first_of_group {
                return Some("node(s) didn't match pod affinity rules".to_string());
            }
        }
        None
    }

    /// The score plugins' totals for the feasible slots, weighted and summed.
    fn scores(&self, pod: &Pod, demand: &Demand, feasible: &[usize]) -> Vec<i64> {
        let s = spec(pod);
        let tolerations = s.tolerations.as_deref().unwrap_or_default();
        let n = feasible.len();
        let mut total = vec![0i64; n];

        // TaintToleration: untolerated PreferNoSchedule taints, reversed.
        let prefer_tolerations: Vec<_> = tolerations
            .iter()
            .filter(|t| {
                t.effect
                    .as_deref()
                    .is_none_or(|e| e.is_empty() || e == "PreferNoSchedule")
            })
            .cloned()
            .collect();
        let raw: Vec<i64> = feasible
            .iter()
            .map(|&i| {
                self.slots[i]
                    .taints()
                    .iter()
                    .filter(|t| t.effect == "PreferNoSchedule")
                    .filter(|t| !prefer_tolerations.iter().any(|x| matching::tolerates(x, t)))
                    .count() as i64
            })
            .collect();
        add_weighted(&mut total, &normalize(&raw, true), W_TAINT);

        // NodeAffinity: preferred terms' weights.
        let preferred = s
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_deref()
            })
            .unwrap_or_default();
        let raw: Vec<i64> = feasible
            .iter()
            .map(|&i| {
                let slot = &self.slots[i];
                preferred
                    .iter()
                    .filter(|p| {
                        matching::term_matches(&p.preference, &slot.name, slot.labels())
                            .unwrap_or(false)
                    })
                    .map(|p| i64::from(p.weight))
                    .sum()
            })
            .collect();
        add_weighted(&mut total, &normalize(&raw, false), W_NODE_AFFINITY);

        // NodeResourcesFit (least allocated) and BalancedAllocation.
        let best_effort = demand.requested == Amount::default();
        for (k, &i) in feasible.iter().enumerate() {
            let slot = &self.slots[i];
            let least = |req: i64, cap: i64| -> i64 {
                if cap == 0 || req > cap {
                    0
                } else {
                    (cap - req) * MAX_SCORE / cap
                }
            };
            let nz = slot.non_zero.add(demand.non_zero);
            let mut sum = 0;
            let mut weights = 0;
            for (req, cap) in [
                (nz.cpu, slot.allocatable.cpu),
                (nz.memory, slot.allocatable.memory),
            ] {
                if cap == 0 {
                    continue;
                }
                sum += least(req, cap);
                weights += 1;
            }
            let fit = if weights == 0 { 0 } else { sum / weights };
            total[k] += W_FIT * fit;

            if !best_effort {
                let r = slot.requested.add(demand.requested);
                let mut fractions = Vec::new();
                for (req, cap) in [
                    (r.cpu, slot.allocatable.cpu),
                    (r.memory, slot.allocatable.memory),
                ] {
                    if cap == 0 {
                        continue;
                    }
                    fractions.push((req as f64 / cap as f64).min(1.0));
                }
                let std = if fractions.len() == 2 {
                    ((fractions[0] - fractions[1]) / 2.0).abs()
                } else {
                    0.0
                };
                total[k] += W_BALANCED * ((1.0 - std) * MAX_SCORE as f64) as i64;
            }
        }

        // PodTopologySpread.
        if let Some(spread) = self.spread_scores(pod, feasible) {
            add_weighted(&mut total, &spread, W_SPREAD);
        }

        // InterPodAffinity.
        if let Some(affinity) = self.pod_affinity_scores(pod, feasible) {
            add_weighted(&mut total, &affinity, W_POD_AFFINITY);
        }
        total
    }

    fn spread_scores(&self, pod: &Pod, feasible: &[usize]) -> Option<Vec<i64>> {
        let ns = pod.namespace().unwrap_or_default();
        let explicit = explicit_spreads(pod, "ScheduleAnyway");
        let system = spec(pod)
            .topology_spread_constraints
            .as_ref()
            .is_none_or(|c| c.is_empty());
        let constraints = if system {
            let selector = (self.default_selector)(pod)?;
            if selector.match_labels.as_ref().is_none_or(|m| m.is_empty())
                && selector
                    .match_expressions
                    .as_ref()
                    .is_none_or(|m| m.is_empty())
            {
                return None;
            }
            [(HOSTNAME, 3), (ZONE, 5)]
                .into_iter()
                .map(|(key, skew)| Spread {
                    key: key.to_string(),
                    max_skew: skew,
                    min_domains: None,
                    selector: selector.clone(),
                    same: Vec::new(),
                    honour_taints: false,
                    honour_affinity: true,
                })
                .collect()
        } else {
            explicit
        };
        if constraints.is_empty() {
            return None;
        }
        // With explicit constraints, nodes lacking a topology key are left out and score 0.
        let require_all = !system;
        let has_all = |slot: &Slot<'_>| constraints.iter().all(|c| slot.label(&c.key).is_some());
        let ignored: Vec<bool> = feasible
            .iter()
            .map(|&i| require_all && !has_all(&self.slots[i]))
            .collect();
        // Domains come from the feasible nodes; their counts from every node.
        let mut weights = Vec::new();
        let mut counts: Vec<BTreeMap<String, i64>> = Vec::new();
        for c in &constraints {
            let mut domains: BTreeMap<String, i64> = BTreeMap::new();
            for (k, &i) in feasible.iter().enumerate() {
                if ignored[k] || c.key == HOSTNAME {
                    continue;
                }
                let v = self.slots[i].label(&c.key).unwrap_or_default().to_string();
                domains.entry(v).or_default();
            }
            let size = if c.key == HOSTNAME {
                ignored.iter().filter(|x| !**x).count()
            } else {
                domains.len()
            };
            weights.push(((size + 2) as f64).ln());
            if c.key != HOSTNAME {
                for slot in &self.slots {
                    if require_all && !has_all(slot) {
                        continue;
                    }
                    if !self.spread_includes(pod, c, slot) {
                        continue;
                    }
                    let v = slot.label(&c.key).unwrap_or_default();
                    if let Some(d) = domains.get_mut(v) {
                        *d += slot.pods.iter().filter(|p| c.counts(&ns, p)).count() as i64;
                    }
                }
            }
            counts.push(domains);
        }
        let raw: Vec<i64> = feasible
            .iter()
            .enumerate()
            .map(|(k, &i)| {
                if ignored[k] {
                    return 0;
                }
                let slot = &self.slots[i];
                let mut score = 0.0;
                for (ci, c) in constraints.iter().enumerate() {
                    let Some(v) = slot.label(&c.key) else {
                        continue;
                    };
                    let cnt = if c.key == HOSTNAME {
                        slot.pods.iter().filter(|p| c.counts(&ns, p)).count() as i64
                    } else {
                        counts[ci].get(v).copied().unwrap_or(0)
                    };
                    score += cnt as f64 * weights[ci] + (c.max_skew - 1) as f64;
                }
                score.round() as i64
            })
            .collect();
        let considered: Vec<i64> = raw
            .iter()
            .zip(&ignored)
            .filter(|(_, ig)| !**ig)
            .map(|(s, _)| *s)
            .collect();
        let max = considered.iter().copied().max().unwrap_or(0);
        let min = considered.iter().copied().min().unwrap_or(0);
        Some(
            raw.iter()
                .zip(&ignored)
                .map(|(s, ig)| {
                    if *ig {
                        0
                    } else if max == 0 {
                        MAX_SCORE
                    } else {
                        MAX_SCORE * (max + min - s) / max
                    }
                })
                .collect(),
        )
    }

    fn pod_affinity_scores(&self, pod: &Pod, feasible: &[usize]) -> Option<Vec<i64>> {
        let mine = terms(pod);
        // (topology key, value) → score added to every node in that domain.
        let mut by_domain: BTreeMap<(String, String), i64> = BTreeMap::new();
        let mut any = false;
        for slot in &self.slots {
            for p in &slot.pods {
                let mut add = |t: &PodAffinityTerm, w: i64| {
                    if let Some(v) = slot.label(&t.topology_key) {
                        *by_domain
                            .entry((t.topology_key.clone(), v.to_string()))
                            .or_default() += w;
                    }
                };
                for (w, t) in &mine.preferred {
                    any = true;
                    if term_selects(t, pod, p) {
                        add(t, *w);
                    }
                }
                for (w, t) in &mine.preferred_anti {
                    any = true;
                    if term_selects(t, pod, p) {
                        add(t, -*w);
                    }
                }
                let theirs = terms(p);
                for t in theirs.affinity {
                    any = true;
                    if term_selects(t, p, pod) {
                        add(t, 1);
                    }
                }
                for (w, t) in &theirs.preferred {
                    any = true;
                    if term_selects(t, p, pod) {
                        add(t, *w);
                    }
                }
                for (w, t) in &theirs.preferred_anti {
                    any = true;
                    if term_selects(t, p, pod) {
                        add(t, -*w);
                    }
                }
            }
        }
        if !any {
            return None;
        }
        let raw: Vec<i64> = feasible
            .iter()
            .map(|&i| {
                let slot = &self.slots[i];
                by_domain
                    .iter()
                    .filter(|((k, v), _)| slot.label(k) == Some(v.as_str()))
                    .map(|(_, s)| *s)
                    .sum()
            })
            .collect();
        let max = raw.iter().copied().max().unwrap_or(0);
        let min = raw.iter().copied().min().unwrap_or(0);
        let diff = max - min;
        Some(
            raw.iter()
                .map(|s| {
                    if diff > 0 {
                        (MAX_SCORE as f64 * (s - min) as f64 / diff as f64) as i64
                    } else {
                        0
                    }
                })
                .collect(),
        )
    }

    /// Where kube-scheduler may bind `pod` now, or why it fits no node. An error names a
    /// request the pod's spec cannot hold.
    pub fn choose(&self, pod: &Pod) -> Result<std::result::Result<Choice, Unschedulable>, String> {
        let demand = pod_demand(spec(pod)).map_err(|e| format!("pod {}: {e}", key(pod)))?;
        if let Some(name) = pod
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.as_deref())
            && let Some(i) = self.slots.iter().position(|s| s.name == name)
            && self.filter(pod, &demand, i).is_none()
        {
            return Ok(Ok(Choice::Nominated(name.to_string())));
        }
        let mut feasible = Vec::new();
        let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
        for i in 0..self.slots.len() {
            match self.filter(pod, &demand, i) {
                None => feasible.push(i),
                Some(r) => *reasons.entry(r).or_default() += 1,
            }
        }
        if feasible.is_empty() {
            return Ok(Err(Unschedulable {
                nodes: self.slots.len(),
                reasons,
            }));
        }
        let scores = self.scores(pod, &demand, &feasible);
        let best = scores.iter().copied().max().unwrap_or(0);
        let mut nodes: Vec<String> = feasible
            .iter()
            .zip(&scores)
            .filter(|(_, s)| **s == best)
            .map(|(&i, _)| self.slots[i].name.clone())
            .collect();
        nodes.sort();
        Ok(Ok(Choice::Best { nodes, score: best }))
    }

    /// One node of a choice: the nominated node, or among equal best, the one a hash of the
    /// pod's and node's names ranks first (kube-scheduler picks at random; this repeats).
    pub fn pick(pod: &Pod, choice: &Choice) -> String {
        match choice {
            Choice::Nominated(n) => n.clone(),
            Choice::Best { nodes, .. } => {
                let k = key(pod);
                nodes
                    .iter()
                    .min_by_key(|n| super::fnv1a(k.bytes().chain([0]).chain(n.bytes()).chain([0])))
                    .cloned()
                    .unwrap_or_default()
            }
        }
    }

    /// Records `pod` as bound to `node`, as the scheduler's cache assumes it before the next
    /// pod; its nomination, if any, no longer holds room.
    pub fn bind(&mut self, pod: &'a Pod, node: &str) {
        let me = key(pod);
        self.nominated.retain(|(p, _, _)| key(p) != me);
        let Some(slot) = self.slots.iter_mut().find(|s| s.name == node) else {
            return;
        };
        if let Ok(d) = pod_demand(spec(pod)) {
            slot.requested = slot.requested.add(d.requested);
            slot.non_zero = slot.non_zero.add(d.non_zero);
        }
        slot.pods.push(pod);
    }
}

fn normalize(raw: &[i64], reverse: bool) -> Vec<i64> {
    let max = raw.iter().copied().max().unwrap_or(0);
    raw.iter()
        .map(|&s| {
            if max == 0 {
                if reverse { MAX_SCORE } else { 0 }
            } else {
                let v = MAX_SCORE * s / max;
                if reverse { MAX_SCORE - v } else { v }
            }
        })
        .collect()
}

fn add_weighted(total: &mut [i64], scores: &[i64], weight: i64) {
    for (t, s) in total.iter_mut().zip(scores) {
        *t += weight * s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, zone: &str, cpu: &str, memory: &str, extra: &str) -> Node {
        serde_yaml::from_str(&format!(
            "metadata: {{name: {name}, labels: {{kubernetes.io/hostname: {name}, topology.kubernetes.io/zone: {zone}}}}}
spec: {{{extra}}}
status: {{allocatable: {{cpu: '{cpu}', memory: '{memory}', pods: '110'}}}}"
        ))
        .unwrap()
    }

    fn pod(name: &str, app: &str, cpu: &str, memory: &str, on: Option<&str>, extra: &str) -> Pod {
        let node = on.map(|n| format!("nodeName: {n}, ")).unwrap_or_default();
        serde_yaml::from_str(&format!(
            "metadata: {{name: {name}, namespace: default, labels: {{app: {app}}}}}
spec: {{{node}containers: [{{name: c, resources: {{requests: {{cpu: '{cpu}', memory: '{memory}'}}}}}}]{extra}}}"
        ))
        .unwrap()
    }

    fn no_workload(_: &Pod) -> Option<LabelSelector> {
        None
    }

    fn by_app(pod: &Pod) -> Option<LabelSelector> {
        Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                "app".to_string(),
                pod.labels().get("app").cloned().unwrap_or_default(),
            )])),
            ..LabelSelector::default()
        })
    }

    fn best(choice: Result<std::result::Result<Choice, Unschedulable>, String>) -> Vec<String> {
        match choice.unwrap() {
            Ok(Choice::Best { nodes, .. }) => nodes,
            other => panic!("expected a scored choice, got {other:?}"),
        }
    }

    #[test]
    fn least_allocated_sends_a_pod_to_the_emptier_of_two_equal_nodes() {
        let nodes = [
            node("a", "z1", "4", "16Gi", ""),
            node("b", "z1", "4", "16Gi", ""),
        ];
        let pods = [pod("p0", "x", "2", "4Gi", Some("a"), "")];
        let b = Binder::new(&nodes, &pods, &no_workload);
        let p = pod("p1", "y", "1", "1Gi", None, "");
        assert_eq!(best(b.choose(&p)), ["b"]);
    }

    #[test]
    fn balanced_allocation_outweighs_the_emptier_memory_of_a_lopsided_node() {
        // Least allocated: a 75, b (75 + 93) / 2 = 84. Balanced: a 100, b 90. Totals 175, 174.
        let nodes = [
            node("a", "z1", "4", "4Gi", ""),
            node("b", "z1", "4", "16Gi", ""),
        ];
        let b = Binder::new(&nodes, &[], &no_workload);
        let p = pod("p", "x", "1", "1Gi", None, "");
        match b.choose(&p).unwrap() {
            Ok(Choice::Best { nodes, score }) => {
                assert_eq!(nodes, ["a"]);
                // Taint toleration gives every node 100 (weight 3): 300 + 75 + 100.
                assert_eq!(score, 475);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_container_without_requests_counts_the_defaults_when_scoring_only() {
        // Node a holds ten best-effort pods: they take no room, but score as 1 CPU / 2000 MiB.
        let nodes = [
            node("a", "z1", "4", "16Gi", ""),
            node("b", "z1", "4", "16Gi", ""),
        ];
        let mut pods = Vec::new();
        for i in 0..10 {
            let mut p = pod(&format!("be{i}"), "be", "0", "0", Some("a"), "");
            p.spec.as_mut().unwrap().containers[0].resources = None;
            pods.push(p);
        }
        let b = Binder::new(&nodes, &pods, &no_workload);
        // Both fit (a's pods request nothing). Least allocated: a (0 + 12) / 2 = 6, b
        // (0 + 25) / 2 = 12; balanced allocation is 87 on both.
        assert_eq!(best(b.choose(&pod("p", "x", "4", "12Gi", None, ""))), ["b"]);
    }

    #[test]
    fn the_nominated_node_is_taken_without_scoring_when_it_passes_the_filters() {
        let nodes = [
            node("a", "z1", "4", "16Gi", ""),
            node("b", "z1", "4", "16Gi", ""),
        ];
        let pods = [pod("p0", "x", "2", "4Gi", Some("a"), "")];
        let b = Binder::new(&nodes, &pods, &no_workload);
        let mut p = pod("p1", "y", "1", "1Gi", None, "");
        p.status = Some(k8s_openapi::api::core::v1::PodStatus {
            nominated_node_name: Some("a".to_string()),
            ..Default::default()
        });
        assert_eq!(
            b.choose(&p).unwrap(),
            Ok(Choice::Nominated("a".to_string()))
        );
        // Too big for a: scored over both nodes, and only b fits.
        let mut big = pod("p2", "y", "3", "1Gi", None, "");
        big.status = p.status.clone();
        assert_eq!(best(b.choose(&big)), ["b"]);
    }

    #[test]
    fn a_pod_nominated_to_a_node_holds_its_room_against_pods_of_lower_or_equal_priority() {
        let nodes = [node("a", "z1", "4", "16Gi", "")];
        let mut waiting = pod("w", "x", "3", "1Gi", None, ", priority: 5");
        waiting.status = Some(k8s_openapi::api::core::v1::PodStatus {
            nominated_node_name: Some("a".to_string()),
            ..Default::default()
        });
        let pods = [waiting];
        let b = Binder::new(&nodes, &pods, &no_workload);
        let equal = pod("e", "y", "2", "1Gi", None, ", priority: 5");
        let refused = b.choose(&equal).unwrap().unwrap_err();
        assert_eq!(
            refused.reasons,
            BTreeMap::from([("Insufficient cpu".to_string(), 1)])
        );
        assert_eq!(
            refused.to_string(),
            "0/1 nodes are available: 1 Insufficient cpu."
        );
        let higher = pod("h", "y", "2", "1Gi", None, ", priority: 6");
        assert_eq!(best(b.choose(&higher)), ["a"]);
        // Once bound elsewhere (or here), the nomination holds nothing.
        let mut b = b;
        b.bind(&pods[0], "a");
        assert!(
            b.choose(&equal).unwrap().is_err(),
            "bound: its requests count now"
        );
    }

    #[test]
    fn taints_keep_pods_off_and_prefer_no_schedule_only_lowers_the_score() {
        let nodes = [
            node(
                "a",
                "z1",
                "4",
                "16Gi",
                "taints: [{key: gpu, effect: NoSchedule}]",
            ),
            node(
                "b",
                "z1",
                "4",
                "16Gi",
                "taints: [{key: spot, effect: PreferNoSchedule}]",
            ),
            node("c", "z1", "2", "16Gi", ""),
        ];
        let b = Binder::new(&nodes, &[], &no_workload);
        // b scores 84 + 90 for its resources against c's 71 + 78, but b's PreferNoSchedule
        // taint costs it 3 × 100.
        assert_eq!(best(b.choose(&pod("p", "x", "1", "1Gi", None, ""))), ["c"]);
        let tolerant = pod(
            "t",
            "x",
            "1",
            "1Gi",
            None,
            ", tolerations: [{key: gpu, operator: Exists}, {key: spot, operator: Exists}]",
        );
        assert_eq!(best(b.choose(&tolerant)), ["a", "b"]);
        let cordoned = [node("d", "z1", "4", "16Gi", "unschedulable: true")];
        let b = Binder::new(&cordoned, &[], &no_workload);
        let why = b
            .choose(&pod("p", "x", "1", "1Gi", None, ""))
            .unwrap()
            .unwrap_err();
        assert_eq!(
            why.reasons.keys().collect::<Vec<_>>(),
            ["node(s) were unschedulable"]
        );
    }

    #[test]
    fn node_selector_and_preferred_node_affinity_choose_among_nodes() {
        let mut nodes = [
            node("a", "z1", "4", "16Gi", ""),
            node("b", "z2", "4", "16Gi", ""),
            node("c", "z3", "4", "16Gi", ""),
        ];
        nodes[2]
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("disk".to_string(), "ssd".to_string());
        let b = Binder::new(&nodes, &[], &no_workload);
        let selected = pod(
            "s",
            "x",
            "1",
            "1Gi",
            None,
            ", nodeSelector: {topology.kubernetes.io/zone: z2}",
        );
        assert_eq!(best(b.choose(&selected)), ["b"]);
        let preferring = pod(
            "p",
            "x",
            "1",
            "1Gi",
            None,
            ", affinity: {nodeAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: 10, preference: {matchExpressions: [{key: disk, operator: In, values: [ssd]}]}}]}}",
        );
        assert_eq!(best(b.choose(&preferring)), ["c"]);
        assert_eq!(
            best(b.choose(&pod("q", "x", "1", "1Gi", None, ""))),
            ["a", "b", "c"]
        );
    }

    #[test]
    fn the_system_default_spread_moves_a_workloads_pod_off_the_node_holding_its_siblings() {
        // Least allocated and balanced allocation score a and b alike (98 and 99 each); the
        // hostname default (skew 3) gives a 2 × ln 4 + 2 and b 2, so b wins after normalising.
        let nodes = [
            node("a", "z1", "16", "64Gi", ""),
            node("b", "z1", "4", "16Gi", ""),
        ];
        let pods = [
            pod("w0", "web", "100m", "128Mi", Some("a"), ""),
            pod("w1", "web", "100m", "128Mi", Some("a"), ""),
        ];
        let p = pod("w2", "web", "100m", "128Mi", None, "");
        assert_eq!(best(Binder::new(&nodes, &pods, &by_app).choose(&p)), ["b"]);
        // A bare pod has no workload and so no default spread: a tie.
        assert_eq!(
            best(Binder::new(&nodes, &pods, &no_workload).choose(&p)),
            ["a", "b"]
        );
    }

    #[test]
    fn a_do_not_schedule_spread_admits_only_the_zones_within_the_skew() {
        let nodes = [
            node("a", "z1", "8", "32Gi", ""),
            node("b", "z2", "8", "32Gi", ""),
            node("c", "z3", "2", "8Gi", ""),
        ];
        let spread = ", topologySpreadConstraints: [{maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: web}}}]";
        let pods = [
            pod("w0", "web", "1", "1Gi", Some("a"), spread),
            pod("w1", "web", "1", "1Gi", Some("b"), spread),
        ];
        let b = Binder::new(&nodes, &pods, &no_workload);
        // c is the fullest node by far, but only z3 keeps the skew within 1.
        assert_eq!(
            best(b.choose(&pod("w2", "web", "1", "1Gi", None, spread))),
            ["c"]
        );
        let mut b = b;
        let third = pod("w2", "web", "1", "1Gi", None, spread);
        b.bind(&third, "c");
        assert_eq!(
            best(b.choose(&pod("w3", "web", "1", "1Gi", None, spread))),
            ["a", "b"],
            "every zone holds one: any zone, and the roomy nodes score alike"
        );
    }

    #[test]
    fn required_anti_affinity_holds_both_ways_and_affinity_follows_its_group() {
        let nodes = [
            node("a", "z1", "8", "32Gi", ""),
            node("b", "z1", "8", "32Gi", ""),
        ];
        let anti = ", affinity: {podAntiAffinity: {requiredDuringSchedulingIgnoredDuringExecution: [{topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {app: db}}}]}}";
        let pods = [pod("db0", "db", "1", "1Gi", Some("a"), anti)];
        let b = Binder::new(&nodes, &pods, &no_workload);
        // The new db pod avoids a (its own term); so does any pod the existing db pod's term
        // selects, here another db pod without terms of its own.
        assert_eq!(
            best(b.choose(&pod("db1", "db", "1", "1Gi", None, anti))),
            ["b"]
        );
        assert_eq!(
            best(b.choose(&pod("db2", "db", "1", "1Gi", None, ""))),
            ["b"]
        );
        // Affinity to the cache: the first cache pod may go anywhere, the next joins it.
        let affinity = ", affinity: {podAffinity: {requiredDuringSchedulingIgnoredDuringExecution: [{topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {app: cache}}}]}}";
        let first = pod("c0", "cache", "1", "1Gi", None, affinity);
        assert_eq!(best(b.choose(&first)), ["b"], "least allocated: b is empty");
        let mut b = b;
        b.bind(&first, "a");
        assert_eq!(
            best(b.choose(&pod("c1", "cache", "1", "1Gi", None, affinity))),
            ["a"]
        );
        // A pod with affinity to a group that has no pod and that it is not part of fits
        // nowhere.
        let lost = pod(
            "l",
            "other",
            "1",
            "1Gi",
            None,
            &affinity.replace("cache", "ghost"),
        );
        assert!(b.choose(&lost).unwrap().is_err());
    }

    #[test]
    fn the_queue_takes_higher_priority_first_then_the_older_pod() {
        let mut a = pod("a", "x", "1", "1Gi", None, "");
        let mut b = pod("b", "x", "1", "1Gi", None, ", priority: 10");
        let mut c = pod("c", "x", "1", "1Gi", None, "");
        a.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-01-01T00:00:02Z".parse().unwrap(),
        ));
        c.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-01-01T00:00:01Z".parse().unwrap(),
        ));
        b.metadata.creation_timestamp = a.metadata.creation_timestamp.clone();
        let mut queue = vec![&a, &b, &c];
        Binder::order(&mut queue);
        let names: Vec<String> = queue.iter().map(|p| p.name_any()).collect();
        assert_eq!(names, ["b", "c", "a"]);
    }

    #[test]
    fn a_tie_is_broken_the_same_way_each_time_and_only_among_the_tied() {
        let choice = Choice::Best {
            nodes: vec!["a".into(), "b".into(), "c".into()],
            score: 1,
        };
        let picks: std::collections::BTreeSet<String> = (0..40)
            .map(|i| Binder::pick(&pod(&format!("p{i}"), "x", "1", "1Gi", None, ""), &choice))
            .collect();
        assert_eq!(picks.len(), 3, "pods spread over the tied nodes: {picks:?}");
        let p = pod("p", "x", "1", "1Gi", None, "");
        assert_eq!(Binder::pick(&p, &choice), Binder::pick(&p, &choice));
        assert!(choice.allows(&Binder::pick(&p, &choice)));
        assert!(!choice.allows("d"));
    }

    #[test]
    fn a_request_the_api_would_refuse_is_an_error_naming_the_pod_and_value() {
        let nodes = [node("a", "z1", "4", "16Gi", "")];
        let b = Binder::new(&nodes, &[], &no_workload);
        let err = b
            .choose(&pod("p", "x", "lots", "1Gi", None, ""))
            .unwrap_err();
        assert!(
            err.contains("default/p") && err.contains("\"lots\""),
            "{err}"
        );
    }
}
