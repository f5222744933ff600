//! The scheduler's view of a pod: what it requests and every constraint on where it may
//! run, parsed once from the Kubernetes object.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    Affinity, ContainerPort, Pod, PodAffinityTerm, PodSpec, Toleration, TopologySpreadConstraint,
    WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::model::pod::{self as podreq, FieldError};
use crate::model::{NodeRequirements, Requirement, RequirementError, Requirements, Resources};

/// A pod whose constraints do not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod {pod}: {field}: {message}")]
pub struct PodError {
    /// `namespace/name`.
    pub pod: String,
    /// The field path.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// A label selector over pods; `None` inside matches no pod (a null selector), an empty
/// set of requirements matches every pod.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Selector(pub Option<Requirements>);

impl Selector {
    /// Whether a pod's labels match.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.as_ref().is_some_and(|r| r.admits_labels(labels))
    }
}

/// Which namespaces a pod (anti-)affinity term looks at.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Namespaces {
    /// These namespaces (the pod's own when the term names none).
    Set(BTreeSet<String>),
    /// Every namespace (a `namespaceSelector` was given; namespace labels are not part of a
    /// snapshot, so any selector is read as matching every namespace).
    All,
}

impl Namespaces {
    /// Whether a namespace is included.
    pub fn contains(&self, namespace: &str) -> bool {
        match self {
            Namespaces::All => true,
            Namespaces::Set(s) => s.contains(namespace),
        }
    }
}

/// A pod affinity or anti-affinity term.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodTerm {
    /// The node label whose values are the domains (`kubernetes.io/hostname`, zone, ...).
    pub topology_key: String,
    /// Which pods the term is about.
    pub selector: Selector,
    /// In which namespaces.
    pub namespaces: Namespaces,
}

/// A topology spread constraint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Spread {
    /// Largest allowed difference between a domain's count and the smallest count.
    pub max_skew: i32,
    /// The node label whose values are the domains.
    pub topology_key: String,
    /// `DoNotSchedule` (true) or `ScheduleAnyway` (false, a preference).
    pub hard: bool,
    /// Which pods are counted (in the pod's namespace), with `matchLabelKeys` merged in.
    pub selector: Selector,
    /// Below this many eligible domains the smallest count is taken as zero.
    pub min_domains: Option<i32>,
    /// `nodeAffinityPolicy: Honor` (the default): only nodes the pod may run on form domains.
    pub honor_node_affinity: bool,
    /// `nodeTaintsPolicy: Honor`: only nodes whose taints the pod tolerates form domains
    /// (the default is Ignore).
    pub honor_taints: bool,
}

/// A host port a container binds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPort {
    /// TCP, UDP or SCTP.
    pub protocol: String,
    /// The host IP, `0.0.0.0` when unset.
    pub ip: String,
    /// The port.
    pub port: i32,
}

impl HostPort {
    /// Whether two bindings collide on one node (the wildcard IP collides with every IP).
    pub fn conflicts(&self, other: &HostPort) -> bool {
        self.port == other.port
            && self.protocol == other.protocol
            && (self.ip == other.ip || self.ip == "0.0.0.0" || other.ip == "0.0.0.0")
    }
}

/// The placement fields of a pod spec as the user wrote them. The plan validator checks
/// plans against these rather than against the parsed forms on [`PodInfo`], so that a
/// parsing mistake cannot hide itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WrittenPlacement {
    /// `spec.nodeSelector`.
    pub node_selector: BTreeMap<String, String>,
    /// `spec.affinity` with its preferred terms left out (only required terms are checked).
    pub affinity: Option<Affinity>,
    /// `spec.topologySpreadConstraints`.
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    /// The ports that set a `hostPort`, of app containers and native sidecars.
    pub host_ports: Vec<ContainerPort>,
}

impl WrittenPlacement {
    /// The spec's placement fields, or `None` when it sets none of them (most pods; they
    /// then cost one pointer).
    pub fn of(spec: &PodSpec) -> Option<Arc<Self>> {
        let affinity = spec.affinity.as_ref().map(|a| {
            let mut a = a.clone();
            if let Some(n) = a.node_affinity.as_mut() {
                n.preferred_during_scheduling_ignored_during_execution = None;
            }
            if let Some(p) = a.pod_affinity.as_mut() {
                p.preferred_during_scheduling_ignored_during_execution = None;
            }
            if let Some(p) = a.pod_anti_affinity.as_mut() {
                p.preferred_during_scheduling_ignored_during_execution = None;
            }
            a
        });
        let sidecars = spec
            .init_containers
            .iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"));
        let host_ports: Vec<ContainerPort> = spec
            .containers
            .iter()
            .chain(sidecars)
            .flat_map(|c| c.ports.iter().flatten())
            .filter(|p| p.host_port.is_some_and(|h| h > 0))
            .cloned()
            .collect();
        let written = WrittenPlacement {
            node_selector: spec.node_selector.clone().unwrap_or_default(),
            affinity: affinity.filter(|a| {
                let required_node = a.node_affinity.as_ref().is_some_and(|n| {
                    n.required_during_scheduling_ignored_during_execution
                        .is_some()
                });
                let required_pod = a.pod_affinity.as_ref().is_some_and(|p| {
                    p.required_during_scheduling_ignored_during_execution
                        .as_ref()
                        .is_some_and(|t| !t.is_empty())
                });
                let required_anti = a.pod_anti_affinity.as_ref().is_some_and(|p| {
                    p.required_during_scheduling_ignored_during_execution
                        .as_ref()
                        .is_some_and(|t| !t.is_empty())
                });
                required_node || required_pod || required_anti
            }),
            topology_spread_constraints: spec
                .topology_spread_constraints
                .clone()
                .unwrap_or_default(),
            host_ports,
        };
        (written != WrittenPlacement::default()).then(|| Arc::new(written))
    }
}

/// Everything the scheduler needs to know about one pod.
#[derive(Debug, Clone)]
pub struct PodInfo {
    /// `namespace/name`.
    pub key: String,
    /// Namespace.
    pub namespace: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Requests as kube-scheduler computes them (init containers, sidecars, overhead).
    pub requests: Resources,
    /// Node selector ANDed with one of the required node-affinity terms.
    pub node_requirements: NodeRequirements,
    /// Preferred node-affinity terms, heaviest first.
    pub preferred_node: Vec<(i32, Requirements)>,
    /// Tolerations.
    pub tolerations: Vec<Toleration>,
    /// Required pod affinity terms.
    pub affinity: Vec<PodTerm>,
    /// Required pod anti-affinity terms.
    pub anti_affinity: Vec<PodTerm>,
    /// Preferred pod affinity terms with weights.
    pub preferred_affinity: Vec<(i32, PodTerm)>,
    /// Preferred pod anti-affinity terms with weights.
    pub preferred_anti_affinity: Vec<(i32, PodTerm)>,
    /// Topology spread constraints.
    pub spread: Vec<Spread>,
    /// Host ports.
    pub host_ports: Vec<HostPort>,
    /// The node it is bound to, if any.
    pub node_name: Option<String>,
    /// The workload that owns it (`Kind/name`), if any.
    pub owner: Option<String>,
    /// The placement fields as written, for the plan validator; `None` when the spec sets
    /// none (or when the pod was not built from a spec).
    pub written: Option<Arc<WrittenPlacement>>,
}

impl PodInfo {
    /// A pod with only a key (`namespace/name`) and requests: no labels, constraints,
    /// tolerations or owner, not bound to a node.
    pub fn new(key: &str, requests: Resources) -> Self {
        PodInfo {
            key: key.to_string(),
            namespace: key.split('/').next().unwrap_or_default().to_string(),
            labels: BTreeMap::new(),
            requests,
            node_requirements: NodeRequirements::default(),
            preferred_node: Vec::new(),
            tolerations: Vec::new(),
            affinity: Vec::new(),
            anti_affinity: Vec::new(),
            preferred_affinity: Vec::new(),
            preferred_anti_affinity: Vec::new(),
            spread: Vec::new(),
            host_ports: Vec::new(),
            node_name: None,
            owner: None,
            written: None,
        }
    }

    /// Whether the pod has any constraint that involves other pods or ports (and so cannot
    /// be moved freely between nodes by the packer).
    pub fn has_pod_constraints(&self) -> bool {
        !(self.affinity.is_empty()
            && self.anti_affinity.is_empty()
            && self.preferred_affinity.is_empty()
            && self.preferred_anti_affinity.is_empty()
            && self.spread.is_empty()
            && self.host_ports.is_empty())
    }

    /// Parses a Kubernetes pod.
    pub fn from_pod(pod: &Pod) -> Result<Self, PodError> {
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        let key = format!("{namespace}/{}", pod.metadata.name.as_deref().unwrap_or(""));
        let fail = |field: String, message: String| PodError {
            pod: key.clone(),
            field,
            message,
        };
        let from_field = |e: FieldError| fail(e.field, e.source.to_string());
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let empty = PodSpec::default();
        let spec = pod.spec.as_ref().unwrap_or(&empty);
        let requests = podreq::pod_requests(spec).map_err(from_field)?;
        let node_requirements = podreq::node_requirements(spec).map_err(from_field)?;
        let preferred_node = podreq::preferred_node_terms(spec).map_err(from_field)?;
        let pod_affinity = spec.affinity.as_ref().and_then(|a| a.pod_affinity.as_ref());
        let pod_anti = spec
            .affinity
            .as_ref()
            .and_then(|a| a.pod_anti_affinity.as_ref());
        let term = |t: &PodAffinityTerm, field: String| {
            pod_term(t, &namespace, &labels).map_err(|m| fail(field, m))
        };
        // Required and preferred terms of pod affinity and anti-affinity, with the field
        // path of each for errors.
        let required = |terms: Option<&Vec<PodAffinityTerm>>, kind: &str| {
            terms
                .into_iter()
                .flatten()
                .enumerate()
                .map(|(i, t)| term(t, format!("spec.affinity.{kind}.requiredDuringSchedulingIgnoredDuringExecution[{i}]")))
                .collect::<Result<Vec<_>, _>>()
        };
        let preferred = |terms: Option<&Vec<WeightedPodAffinityTerm>>, kind: &str| {
            terms
                .into_iter()
                .flatten()
                .enumerate()
                .map(|(i, w)| {
                    let field = format!(
                        "spec.affinity.{kind}.preferredDuringSchedulingIgnoredDuringExecution[{i}]"
                    );
                    term(&w.pod_affinity_term, field).map(|t| (w.weight, t))
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let affinity = required(
            pod_affinity.and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            }),
            "podAffinity",
        )?;
        let anti_affinity = required(
            pod_anti.and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            }),
            "podAntiAffinity",
        )?;
        let mut preferred_affinity = preferred(
            pod_affinity.and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            }),
            "podAffinity",
        )?;
        let mut preferred_anti_affinity = preferred(
            pod_anti.and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            }),
            "podAntiAffinity",
        )?;
        // Lightest preferences are relaxed first.
        preferred_affinity.sort_by_key(|p| std::cmp::Reverse(p.0));
        preferred_anti_affinity.sort_by_key(|p| std::cmp::Reverse(p.0));
        let mut spread = Vec::new();
        for (i, c) in spec
            .topology_spread_constraints
            .iter()
            .flatten()
            .enumerate()
        {
            spread.push(
                spread_constraint(c, &labels)
                    .map_err(|m| fail(format!("spec.topologySpreadConstraints[{i}]"), m))?,
            );
        }
        let mut host_ports = Vec::new();
        let sidecars = spec
            .init_containers
            .iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"));
        for c in spec.containers.iter().chain(sidecars) {
            for p in c.ports.iter().flatten() {
                if let Some(port) = p.host_port.filter(|p| *p > 0) {
                    host_ports.push(HostPort {
                        protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_string()),
                        ip: p
                            .host_ip
                            .clone()
                            .filter(|ip| !ip.is_empty())
                            .unwrap_or_else(|| "0.0.0.0".to_string()),
                        port,
                    });
                }
            }
        }
        let owner = owner_of(pod);
        Ok(PodInfo {
            key: key.clone(),
            namespace,
            labels,
            requests,
            node_requirements,
            preferred_node,
            tolerations: spec.tolerations.clone().unwrap_or_default(),
            affinity,
            anti_affinity,
            preferred_affinity,
            preferred_anti_affinity,
            spread,
            host_ports,
            node_name: spec.node_name.clone(),
            owner,
            written: WrittenPlacement::of(spec),
        })
    }
}

/// The workload that owns a pod (`Kind/name`): its controller, else its first owner.
pub fn owner_of(pod: &Pod) -> Option<String> {
    pod.metadata
        .owner_references
        .as_ref()
        .and_then(|o| {
            o.iter()
                .find(|o| o.controller == Some(true))
                .or_else(|| o.first())
        })
        .map(|o| format!("{}/{}", o.kind, o.name))
}

/// Converts a Kubernetes label selector; `None` is the null selector.
pub fn selector(s: Option<&LabelSelector>) -> Result<Selector, RequirementError> {
    let Some(s) = s else {
        return Ok(Selector(None));
    };
    let mut r = Requirements::new();
    for (k, v) in s.match_labels.iter().flatten() {
        r.add(Requirement::one_of(k, [v.clone()]));
    }
    for e in s.match_expressions.iter().flatten() {
        r.add(Requirement::new(
            &e.key,
            &e.operator,
            e.values.as_deref().unwrap_or_default(),
        )?);
    }
    Ok(Selector(Some(r)))
}

/// Adds `matchLabelKeys` (key In [own value]) and `mismatchLabelKeys` (key NotIn [own
/// value]) to a selector, as kube-scheduler merges them.
fn merge_label_keys(
    mut sel: Selector,
    match_keys: &[String],
    mismatch_keys: &[String],
    labels: &BTreeMap<String, String>,
) -> Selector {
    if let Some(r) = sel.0.as_mut() {
        for k in match_keys {
            if let Some(v) = labels.get(k) {
                r.add(Requirement::one_of(k, [v.clone()]));
            }
        }
        for k in mismatch_keys {
            if let Some(v) = labels.get(k) {
                r.add(Requirement::any(k).intersect(&not_in(k, v)));
            }
        }
    }
    sel
}

fn not_in(key: &str, value: &str) -> Requirement {
    // NotIn with one value cannot fail to build.
    Requirement::new(key, "NotIn", &[value]).unwrap_or_else(|_| Requirement::any(key))
}

fn pod_term(
    t: &PodAffinityTerm,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Result<PodTerm, String> {
    let sel = selector(t.label_selector.as_ref()).map_err(|e| e.to_string())?;
    let sel = merge_label_keys(
        sel,
        t.match_label_keys.as_deref().unwrap_or_default(),
        t.mismatch_label_keys.as_deref().unwrap_or_default(),
        labels,
    );
    let namespaces = match (&t.namespaces, &t.namespace_selector) {
        (_, Some(_)) => Namespaces::All,
        (Some(ns), None) if !ns.is_empty() => Namespaces::Set(ns.iter().cloned().collect()),
        _ => Namespaces::Set(BTreeSet::from([namespace.to_string()])),
    };
    if t.topology_key.is_empty() {
        return Err("topologyKey must not be empty".to_string());
    }
    Ok(PodTerm {
        topology_key: t.topology_key.clone(),
        selector: sel,
        namespaces,
    })
}

fn spread_constraint(
    c: &TopologySpreadConstraint,
    labels: &BTreeMap<String, String>,
) -> Result<Spread, String> {
    if c.max_skew < 1 {
        return Err(format!("maxSkew must be at least 1, got {}", c.max_skew));
    }
    let hard = match c.when_unsatisfiable.as_str() {
        "DoNotSchedule" => true,
        "ScheduleAnyway" => false,
        other => {
            return Err(format!(
                "whenUnsatisfiable {other:?} is neither DoNotSchedule nor ScheduleAnyway"
            ));
        }
    };
    let sel = selector(c.label_selector.as_ref()).map_err(|e| e.to_string())?;
    let sel = merge_label_keys(
        sel,
        c.match_label_keys.as_deref().unwrap_or_default(),
        &[],
        labels,
    );
    Ok(Spread {
        max_skew: c.max_skew,
        topology_key: c.topology_key.clone(),
        hard,
        selector: sel,
        min_domains: c.min_domains,
        honor_node_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
        honor_taints: c.node_taints_policy.as_deref() == Some("Honor"),
    })
}
