//! What disruption decides over: the scheduler's [`Input`] plus, per node, what it costs,
//! which NodePool owns it, how old it is and what protects it; per pod, whether it may be
//! evicted. Built from a snapshot; pure.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::apis::{ConsolidationPolicy, NodePool, labels};
use crate::model::{CapacityType, InstanceType, NodeSettings, Requirements, Resources};
use crate::scheduling::pod::{PodError, Selector, selector};
use crate::scheduling::{Input, InputError};
use crate::state::Snapshot;

/// One NodePool's disruption rules, parsed.
#[derive(Debug, Clone)]
pub struct PoolRules {
    /// Consolidate only empty nodes, or also underutilised ones.
    pub policy: ConsolidationPolicy,
    /// Seconds a node must go without pod changes before consolidation; `None`: never.
    pub consolidate_after: Option<i64>,
    /// Budgets: (nodes, reasons it limits; empty = all). Only budgets active now.
    pub budgets: Vec<(
        crate::apis::nodepool::BudgetNodes,
        Vec<crate::apis::DisruptionReason>,
    )>,
    /// Hash of the pool's node template; a NodeClaim made from another has drifted.
    pub template_hash: String,
    /// Node lifetime in seconds; `None`: never expires.
    pub expire_after: Option<i64>,
}

/// What disruption knows about one existing node.
#[derive(Debug, Clone, Default)]
pub struct NodeMeta {
    /// The owning NodePool, if Tailor manages the node.
    pub pool: Option<String>,
    /// VM size.
    pub instance_type: String,
    /// Zone.
    pub zone: String,
    /// Capacity type: the node's label, else its NodeClaim's, else on-demand (Karpenter's
    /// default when a NodePool does not say).
    pub capacity_type: CapacityType,
    /// USD per hour, when the catalog prices it.
    pub price_per_hour: Option<f64>,
    /// Creation time, unix seconds.
    pub created: Option<i64>,
    /// Last time a pod arrived or left, unix seconds (consolidateAfter counts from here).
    pub last_pod_event: Option<i64>,
    /// Annotated `do-not-disrupt`.
    pub do_not_disrupt: bool,
    /// Why it has drifted, if it has.
    pub drifted: Option<String>,
    /// The VM behind it (`spec.providerID`), for deleting it.
    pub provider_id: Option<String>,
    /// Bought ahead of expected growth: kept from consolidation until then (unix
    /// seconds), when the growth it was bought for has come.
    pub kept_until: Option<i64>,
}

/// A PodDisruptionBudget as disruption uses it.
#[derive(Debug, Clone)]
pub struct Pdb {
    /// `namespace/name`.
    pub key: String,
    /// Namespace.
    pub namespace: String,
    /// Pod selector.
    pub selector: Selector,
    /// Evictions it allows now.
    pub allowed: i64,
}

/// The cluster as disruption sees it.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// The scheduler's input (pending pods, nodes with their pods, pools, DaemonSets).
    pub input: Input,
    /// Per node of `input.nodes`, same order.
    pub nodes: Vec<NodeMeta>,
    /// Pods annotated `do-not-disrupt` (`namespace/name`).
    pub do_not_disrupt: BTreeSet<String>,
    /// PodDisruptionBudgets.
    pub pdbs: Vec<Pdb>,
    /// Per NodePool name.
    pub rules: BTreeMap<String, PoolRules>,
    /// Evaluation time, unix seconds.
    pub now: i64,
    /// Per NodePool: the requests its nodes are expected to carry within the forecast
    /// horizon (from the cycle of past requests, [`super::forecast::DemandHistory`]).
    /// Consolidation keeps that capacity; a pool without an entry has no expectation.
    pub expected: BTreeMap<String, Resources>,
    /// Per NodePool: the share by which its pods are expected to fall within
    /// [`super::SCALE_DOWN_WINDOW`] (from the same cycle,
    /// [`super::forecast::DemandHistory::expected_fall`]). While it is at least
    /// [`super::Settings::wait_for_scale_down`], the pool's nodes are not consolidated by
    /// moving pods: the workloads' own scale-down is about to free nodes without an
    /// eviction.
    pub falling: BTreeMap<String, f64>,
    /// Pods whose spec cannot be read (`namespace/name` to the error): their nodes are not
    /// disrupted.
    pub unreadable: BTreeMap<String, PodError>,
    /// NodePools this evaluation leaves as they are: their nodes are neither disrupted nor
    /// reported blocked, and no replacement is planned in them, though pods may move onto
    /// their nodes. The agent holds the recommend-only pools when deciding what to carry
    /// out, and the autonomous ones when deciding what to report.
    pub held: BTreeSet<String>,
}

/// Why the cluster could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The scheduler's input failed.
    #[error(transparent)]
    Input(#[from] InputError),
    /// A NodePool's disruption settings are invalid.
    #[error("nodepool {pool}: {field}: {message}")]
    Pool {
        /// The NodePool.
        pool: String,
        /// The field.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A PodDisruptionBudget is invalid.
    #[error("poddisruptionbudget {pdb}: {message}")]
    Pdb {
        /// `namespace/name`.
        pdb: String,
        /// What is wrong.
        message: String,
    },
}

fn annotated(annotations: Option<&BTreeMap<String, String>>) -> bool {
    annotations.is_some_and(|a| {
        [labels::DO_NOT_DISRUPT, labels::KARPENTER_DO_NOT_DISRUPT]
            .iter()
            .any(|k| a.get(*k).is_some_and(|v| v == "true"))
    })
}

fn label<'a>(l: &'a BTreeMap<String, String>, canonical: &str) -> Option<&'a str> {
    l.iter()
        .find(|(k, _)| labels::canonical_key(k) == canonical)
        .map(|(_, v)| v.as_str())
}

/// A stable hash (FNV-1a, 64 bits, hex) of a NodePool's node template: NodeClaims carry
/// it in `tailor.sh/nodepool-hash`, and a claim whose hash differs has drifted.
pub fn template_hash(pool: &NodePool) -> String {
    fnv_hex(&serde_json::to_string(&pool.spec.template).unwrap_or_default())
}

/// The same hash of an AKSNodeClass's spec (`tailor.sh/nodeclass-hash` on NodeClaims).
pub fn node_class_hash(class: &crate::apis::AKSNodeClass) -> String {
    fnv_hex(&serde_json::to_string(&class.spec).unwrap_or_default())
}

fn fnv_hex(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Why a node no longer meets its NodePool's requirements, if it does not (Karpenter's
/// requirement drift: a pool that now requires sku-version 6 has drifted from its v5
/// nodes). The node's labels are completed with what the catalog says of its size, and
/// with the zone and capacity type disruption resolved for it; a requirement on a key the
/// node does not carry is not drift (template label changes are caught by the hash).
fn requirements_drift(
    pool: &crate::scheduling::Pool,
    node: &crate::scheduling::ExistingNode,
    sku: Option<&InstanceType>,
    zone: &str,
    capacity_type: CapacityType,
) -> Option<String> {
    let mut known: BTreeMap<String, String> = sku
        .map(|t| t.requirements.single_valued_labels())
        .unwrap_or_default();
    if !zone.is_empty() {
        known.insert(labels::ZONE.to_string(), zone.to_string());
    }
    known.insert(
        labels::CAPACITY_TYPE.to_string(),
        capacity_type.as_str().to_string(),
    );
    for (k, v) in &node.labels {
        known.insert(labels::canonical_key(k).to_string(), v.clone());
    }
    pool.requirements
        .iter()
        .filter(|r| known.contains_key(r.key()))
        .find(|r| !r.matches(known.get(r.key()).map(String::as_str)))
        .map(|r| {
            format!(
                "NodePool {} now requires {r}, the node has {}={}",
                pool.name,
                r.key(),
                known.get(r.key()).map_or("", String::as_str)
            )
        })
}

fn seconds(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> i64 {
    t.0.as_second()
}

/// Whether a budget's window (cron `schedule` in UTC, then `duration`) contains `now`.
fn budget_active(b: &crate::apis::nodepool::Budget, now: i64) -> Result<bool, String> {
    let (Some(schedule), Some(window)) = (&b.schedule, b.window().map_err(|e| e.to_string())?)
    else {
        return Ok(true);
    };
    let cron: croner::Cron = schedule.parse().map_err(|e| format!("{schedule:?}: {e}"))?;
    let at = chrono::DateTime::from_timestamp(now, 0)
        .ok_or_else(|| format!("time {now} out of range"))?;
    // Active when the latest window opened at or before now and has not closed yet.
    match cron.find_previous_occurrence(&at, true) {
        Ok(start) => Ok(now - start.timestamp() < window.as_secs()),
        Err(_) => Ok(false),
    }
}

fn pool_rules(np: &NodePool, now: i64) -> Result<PoolRules, ClusterError> {
    let pool = np.metadata.name.clone().unwrap_or_default();
    let err = |field: &'static str, message: String| ClusterError::Pool {
        pool: pool.clone(),
        field,
        message,
    };
    let d = &np.spec.disruption;
    let consolidate_after = d
        .consolidate_after()
        .map_err(|e| err("spec.disruption.consolidateAfter", e.to_string()))?
        .map(|s| s.as_secs());
    let mut budgets = Vec::new();
    for b in &d.budgets {
        let nodes = b
            .nodes()
            .map_err(|e| err("spec.disruption.budgets.nodes", e.to_string()))?;
        if budget_active(b, now).map_err(|e| err("spec.disruption.budgets.schedule", e))? {
            budgets.push((nodes, b.reasons.clone().unwrap_or_default()));
        }
    }
    let expire_after =
        crate::apis::duration::parse_duration_or_never(&np.spec.template.spec.expire_after)
            .map_err(|e| err("spec.template.spec.expireAfter", e.to_string()))?
            .map(|s| s.as_secs());
    Ok(PoolRules {
        policy: d.consolidation_policy,
        consolidate_after,
        budgets,
        template_hash: template_hash(np),
        expire_after,
    })
}

fn pdb(p: &PodDisruptionBudget, pods: &[std::sync::Arc<Pod>]) -> Result<Pdb, ClusterError> {
    let namespace = p
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let key = format!("{namespace}/{}", p.metadata.name.as_deref().unwrap_or(""));
    let spec = p.spec.clone().unwrap_or_default();
    let sel = selector(spec.selector.as_ref()).map_err(|e| ClusterError::Pdb {
        pdb: key.clone(),
        message: format!("spec.selector: {e}"),
    })?;
    let allowed = match p.status.as_ref() {
        // The disruption controller's own count, when the snapshot carries it.
        Some(s) if s.observed_generation.is_some() || s.expected_pods > 0 => {
            i64::from(s.disruptions_allowed)
        }
        _ => {
            let matching = pods
                .iter()
                .filter(|pod| pod.metadata.namespace.as_deref().unwrap_or("default") == namespace)
                .filter(|pod| {
                    sel.matches(&pod.metadata.labels.clone().unwrap_or_default())
                        && pod.spec.as_ref().is_some_and(|s| s.node_name.is_some())
                })
                .count() as i64;
            let resolve = |v: &IntOrString, round_up: bool| -> Result<i64, ClusterError> {
                match v {
                    IntOrString::Int(i) => Ok(i64::from(*i)),
                    IntOrString::String(s) => {
                        let pct: f64 = s
                            .strip_suffix('%')
                            .and_then(|n| n.parse().ok())
                            .ok_or_else(|| ClusterError::Pdb {
                                pdb: key.clone(),
                                message: format!("{s:?} is neither a count nor a percentage"),
                            })?;
                        let x = pct / 100.0 * matching as f64;
                        Ok(if round_up { x.ceil() } else { x.floor() } as i64)
                    }
                }
            };
            match (&spec.max_unavailable, &spec.min_available) {
                (Some(max), _) => resolve(max, true)?,
                (None, Some(min)) => matching - resolve(min, true)?,
                (None, None) => matching,
            }
        }
    };
    Ok(Pdb {
        key,
        namespace,
        selector: sel,
        allowed: allowed.max(0),
    })
}

impl Cluster {
    /// The earliest time after `now` (unix seconds) at which a wait that blocks a managed
    /// node ends on its own: its pool's `consolidateAfter` since the last pod change or the
    /// growth it was bought ahead of, for the nodes `waiting` names (those the last
    /// evaluation found held by exactly that), or any node's `expireAfter`. A cluster that
    /// does not change gives the same decisions until then, so the controller looks again
    /// at that time instead of at its next periodic re-check; a node held by something else
    /// (a PDB, no cheaper arrangement) would give the same answer when its quiet time ends.
    pub fn next_wait_end(&self, waiting: impl Fn(&str) -> bool) -> Option<i64> {
        let mut ends = Vec::new();
        for (n, m) in self.input.nodes.iter().zip(&self.nodes) {
            let Some(rules) = m.pool.as_ref().and_then(|p| self.rules.get(p)) else {
                continue;
            };
            if waiting(&n.name) {
                if let (Some(after), Some(since)) =
                    (rules.consolidate_after, m.last_pod_event.or(m.created))
                {
                    ends.push(since.saturating_add(after));
                }
                if let Some(until) = m.kept_until {
                    ends.push(until);
                }
            }
            if let (Some(life), Some(created)) = (rules.expire_after, m.created) {
                ends.push(created.saturating_add(life));
            }
        }
        ends.into_iter().filter(|t| *t > self.now).min()
    }

    /// Builds the view of `snapshot` at `now` (unix seconds). The first pod whose spec
    /// cannot be read fails it; see [`Cluster::from_snapshot_reading_around`].
    pub fn from_snapshot(
        snapshot: &Snapshot,
        instance_types: &dyn Fn(&NodeSettings) -> Result<crate::scheduling::PoolTypes, String>,
        now: i64,
    ) -> Result<Self, ClusterError> {
        let cluster = Self::from_snapshot_reading_around(snapshot, instance_types, now)?;
        match cluster.unreadable.values().next() {
            Some(e) => Err(ClusterError::Input(InputError::Pod(e.clone()))),
            None => Ok(cluster),
        }
    }

    /// Like [`Cluster::from_snapshot`], but a pod whose spec cannot be read is kept in
    /// [`Cluster::unreadable`] instead of failing the view: it stays on its node with its
    /// requests ([`Input::from_snapshot_reading_around`]), and its node is not disrupted,
    /// as where the pod could go cannot be simulated.
    pub fn from_snapshot_reading_around(
        snapshot: &Snapshot,
        instance_types: &dyn Fn(&NodeSettings) -> Result<crate::scheduling::PoolTypes, String>,
        now: i64,
    ) -> Result<Self, ClusterError> {
        Self::from_snapshot_remembering(
            snapshot,
            instance_types,
            now,
            &mut crate::scheduling::PodMemo::default(),
        )
    }

    /// [`Cluster::from_snapshot_reading_around`] for the controller's passes: pods
    /// unchanged since the last pass are not read again
    /// ([`Input::from_snapshot_remembering`]).
    pub fn from_snapshot_remembering(
        snapshot: &Snapshot,
        instance_types: &dyn Fn(&NodeSettings) -> Result<crate::scheduling::PoolTypes, String>,
        now: i64,
        pods: &mut crate::scheduling::PodMemo,
    ) -> Result<Self, ClusterError> {
        let (input, unreadable) = Input::from_snapshot_remembering(snapshot, instance_types, pods)?;
        let unreadable = unreadable.into_iter().map(|e| (e.pod.clone(), e)).collect();
        // Existing nodes are priced from the whole catalog, not from what their NodePool
        // may buy now: a D8s_v5 under a pool that now requires sku-version 6 still costs
        // what a D8s_v5 costs, and is replaced by drift rather than left unpriced.
        let catalog = instance_types(&NodeSettings::default()).map_err(InputError::Catalog)?;
        let catalog: BTreeMap<&str, &InstanceType> =
            catalog.iter().map(|t| (t.name.as_str(), t)).collect();
        let mut rules = BTreeMap::new();
        for np in &snapshot.node_pools {
            rules.insert(
                np.metadata.name.clone().unwrap_or_default(),
                pool_rules(np, now)?,
            );
        }
        let classes: BTreeMap<&str, &crate::apis::AKSNodeClass> = snapshot
            .node_classes
            .iter()
            .filter_map(|c| Some((c.metadata.name.as_deref()?, c)))
            .collect();
        let claims: BTreeMap<&str, &crate::apis::NodeClaim> = snapshot
            .node_claims
            .iter()
            .filter_map(|c| Some((c.status.as_ref()?.node_name.as_deref()?, c)))
            .collect();
        let objects: BTreeMap<&str, &k8s_openapi::api::core::v1::Node> = snapshot
            .nodes
            .iter()
            .filter_map(|n| Some((n.metadata.name.as_deref()?, n)))
            .collect();
        let pod_starts: BTreeMap<String, i64> = snapshot
            .pods
            .iter()
            .filter_map(|p| {
                let start = p.status.as_ref()?.start_time.as_ref().map(seconds)?;
                Some((p.spec.as_ref()?.node_name.clone()?, start))
            })
            .fold(BTreeMap::new(), |mut m, (n, t)| {
                let e = m.entry(n).or_insert(t);
                *e = (*e).max(t);
                m
            });
        let mut nodes = Vec::with_capacity(input.nodes.len());
        for n in &input.nodes {
            let object = objects.get(n.name.as_str());
            let claim = claims.get(n.name.as_str());
            let claim_labels = claim.and_then(|c| c.metadata.labels.as_ref());
            let claim_requirements =
                claim.and_then(|c| Requirements::from_node_requirements(&c.spec.requirements).ok());
            // The node's label, else the NodeClaim's label, else a single value its
            // NodeClaim requires.
            let read = |key: &str| -> Option<String> {
                label(&n.labels, key)
                    .or_else(|| claim_labels.and_then(|l| label(l, key)))
                    .or_else(|| claim_requirements.as_ref()?.get(key)?.single_value())
                    .map(str::to_string)
            };
            let pool = read(labels::NODE_POOL);
            let instance_type = read(labels::INSTANCE_TYPE).unwrap_or_default();
            let zone = read(labels::ZONE).unwrap_or_default();
            // Karpenter launches on-demand capacity unless a requirement says otherwise.
            let capacity_type = match read(labels::CAPACITY_TYPE).as_deref() {
                Some(labels::CAPACITY_TYPE_SPOT) => CapacityType::Spot,
                _ => CapacityType::OnDemand,
            };
            let sku = catalog.get(instance_type.as_str()).copied();
            let price_per_hour = sku
                .and_then(|t| {
                    t.offerings
                        .iter()
                        .find(|o| o.zone == zone && o.capacity_type == capacity_type)
                        .or_else(|| {
                            t.offerings
                                .iter()
                                .find(|o| o.capacity_type == capacity_type)
                        })
                })
                .map(|o| o.price_per_hour);
            let created = object
                .and_then(|o| o.metadata.creation_timestamp.as_ref())
                .or_else(|| claim.and_then(|c| c.metadata.creation_timestamp.as_ref()))
                .map(seconds);
            let last_pod_event = claim
                .and_then(|c| c.status.as_ref()?.last_pod_event_time.as_ref())
                .map(seconds)
                .or_else(|| pod_starts.get(&n.name).copied())
                .or(created);
            let do_not_disrupt = annotated(object.and_then(|o| o.metadata.annotations.as_ref()))
                || annotated(claim.and_then(|c| c.metadata.annotations.as_ref()));
            let kept_until = claim
                .and_then(|c| {
                    c.metadata
                        .annotations
                        .as_ref()?
                        .get(labels::HEADROOM_UNTIL_ANNOTATION)
                })
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                .map(|t| t.as_second());
            let drifted = claim.and_then(|c| {
                let status = c.status.as_ref();
                if status.is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|k| k.type_ == "Drifted" && k.status == "True")
                }) {
                    return Some("NodeClaim is marked Drifted".to_string());
                }
                let annotations = c.metadata.annotations.as_ref();
                if let Some(have) = annotations.and_then(|a| a.get(labels::NODE_POOL_HASH))
                    && let Some(want) = pool
                        .as_deref()
                        .and_then(|p| rules.get(p))
                        .map(|r| &r.template_hash)
                    && have != want
                {
                    return Some(format!(
                        "NodePool template changed (hash {have}, now {want})"
                    ));
                }
                let class = classes.get(c.spec.node_class_ref.name.as_str())?;
                if let Some(have) = annotations.and_then(|a| a.get(labels::NODE_CLASS_HASH)) {
                    let want = node_class_hash(class);
                    if *have != want {
                        return Some(format!(
                            "AKSNodeClass {} changed (hash {have}, now {want})",
                            c.spec.node_class_ref.name
                        ));
                    }
                }
                // The newest image the class resolves for this node's labels.
                let running = status?.image_id.as_deref()?;
                let latest = class
                    .status
                    .as_ref()?
                    .images
                    .as_ref()?
                    .iter()
                    .find(|image| {
                        let term = k8s_openapi::api::core::v1::NodeSelectorTerm {
                            match_expressions: Some(image.requirements.clone()),
                            match_fields: None,
                        };
                        crate::model::Requirements::from_node_selector_term(&term)
                            .is_ok_and(|r| r.admits_labels(&n.labels))
                    })?;
                (latest.id != running)
                    .then(|| format!("node image {running} is not the latest, {}", latest.id))
            });
            let drifted = drifted.or_else(|| {
                let pool = input
                    .pools
                    .iter()
                    .find(|p| Some(&p.name) == pool.as_ref())?;
                requirements_drift(pool, n, sku, &zone, capacity_type)
            });
            let provider_id = object
                .and_then(|o| o.spec.as_ref()?.provider_id.clone())
                .or_else(|| claim.and_then(|c| c.status.as_ref()?.provider_id.clone()));
            nodes.push(NodeMeta {
                provider_id,
                pool,
                instance_type,
                zone,
                capacity_type,
                price_per_hour,
                created,
                last_pod_event,
                do_not_disrupt,
                drifted,
                kept_until,
            });
        }
        let do_not_disrupt = snapshot
            .pods
            .iter()
            .filter(|p| annotated(p.metadata.annotations.as_ref()))
            .map(|p| {
                format!(
                    "{}/{}",
                    p.metadata.namespace.as_deref().unwrap_or("default"),
                    p.metadata.name.as_deref().unwrap_or("")
                )
            })
            .collect();
        let pdbs = snapshot
            .pod_disruption_budgets
            .iter()
            .map(|p| pdb(p, &snapshot.pods))
            .collect::<Result<_, _>>()?;
        Ok(Cluster {
            input,
            nodes,
            do_not_disrupt,
            pdbs,
            rules,
            now,
            // The snapshot holds no history; the caller adds what its DemandHistory expects.
            expected: BTreeMap::new(),
            falling: BTreeMap::new(),
            unreadable,
            held: BTreeSet::new(),
        })
    }
}
