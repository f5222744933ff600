//! An independent check of a plan against its input: recomputes every constraint from the
//! plan's own output (node labels, pod lists, instance types) and the Kubernetes objects as
//! written, sharing none of the scheduler's bookkeeping, parsed requirements or matching
//! helpers (its own matching is in [`matching`]). Used by tests and by consolidation to
//! prove a plan sound.

pub(crate) mod matching;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    ContainerPort, NodeSelector, PodAffinityTerm, Taint, TopologySpreadConstraint,
};

use self::matching::{
    describe_taint, host_ports_conflict, node_admits, node_label, pool_requirement_holds,
    selector_matches, untolerated, zone_possible,
};
use super::input::{Input, Pool};
use super::plan::Plan;
use super::pod::{PodInfo, WrittenPlacement};
use crate::apis::labels;
use crate::model::{InstanceType, NodeRequirements, Resources};

/// A node as the plan leaves it.
struct PlacedNode<'a> {
    name: String,
    labels: BTreeMap<String, String>,
    taints: &'a [Taint],
    allocatable: Resources,
    pods: Vec<&'a PodInfo>,
    pool: Option<&'a str>,
    instance_type: Option<&'a InstanceType>,
    daemon_requests: Resources,
}

/// What a pod built without a spec (or setting no placement field) has written.
static NOTHING_WRITTEN: WrittenPlacement = WrittenPlacement {
    node_selector: BTreeMap::new(),
    affinity: None,
    topology_spread_constraints: Vec::new(),
    host_ports: Vec::new(),
};

fn written(p: &PodInfo) -> &WrittenPlacement {
    p.written.as_deref().unwrap_or(&NOTHING_WRITTEN)
}

/// Whether the scheduler saw constraints on a pod whose written fields were not kept: such
/// a pod cannot be checked, and passing it unchecked would hide a broken plan.
fn unverifiable(p: &PodInfo) -> bool {
    p.written.is_none()
        && (p.node_requirements != NodeRequirements::default()
            || !p.affinity.is_empty()
            || !p.anti_affinity.is_empty()
            || !p.spread.is_empty()
            || !p.host_ports.is_empty())
}

fn required_node_affinity(w: &WrittenPlacement) -> Option<&NodeSelector> {
    w.affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()
}

/// Required pod affinity (`anti` false) or anti-affinity (`anti` true) terms.
fn required_pod_terms(w: &WrittenPlacement, anti: bool) -> &[PodAffinityTerm] {
    let Some(a) = w.affinity.as_ref() else {
        return &[];
    };
    let terms = if anti {
        a.pod_anti_affinity.as_ref().and_then(|p| {
            p.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
    } else {
        a.pod_affinity.as_ref().and_then(|p| {
            p.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
    };
    terms.map_or(&[], Vec::as_slice)
}

/// Whether a node may run a pod by its nodeSelector and required node affinity.
fn admits(
    pod: &WrittenPlacement,
    node_name: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(), String> {
    node_admits(
        &pod.node_selector,
        required_node_affinity(pod),
        node_name,
        labels,
    )
}

/// The owner's values of `keys`, as `matchLabelKeys`/`mismatchLabelKeys` merge them into a
/// selector (keys the owner lacks are ignored).
fn own_values<'p>(keys: Option<&'p Vec<String>>, owner: &'p PodInfo) -> Vec<(&'p str, &'p str)> {
    keys.into_iter()
        .flatten()
        .filter_map(|k| owner.labels.get(k).map(|v| (k.as_str(), v.as_str())))
        .collect()
}

/// Whether `owner`'s pod (anti-)affinity term selects `other`: by namespace (the term's
/// list, else the owner's own; a `namespaceSelector` is read as every namespace, since
/// namespace labels are not part of a snapshot) and by labels.
fn term_selects(term: &PodAffinityTerm, owner: &PodInfo, other: &PodInfo) -> bool {
    let in_namespace = term.namespace_selector.is_some()
        || match term.namespaces.as_deref() {
            Some(list) if !list.is_empty() => list.contains(&other.namespace),
            _ => other.namespace == owner.namespace,
        };
    in_namespace
        && selector_matches(
            term.label_selector.as_ref(),
            &own_values(term.match_label_keys.as_ref(), owner),
            &own_values(term.mismatch_label_keys.as_ref(), owner),
            &other.labels,
        )
}

/// Whether a topology spread constraint of `owner` counts `other`: same namespace, and
/// the selector with `matchLabelKeys` merged in.
fn spread_counts(c: &TopologySpreadConstraint, owner: &PodInfo, other: &PodInfo) -> bool {
    other.namespace == owner.namespace
        && selector_matches(
            c.label_selector.as_ref(),
            &own_values(c.match_label_keys.as_ref(), owner),
            &[],
            &other.labels,
        )
}

/// Whether a pool's written requirements and template labels allow a zone.
fn pool_allows_zone(pool: &Pool, zone: &str) -> bool {
    let labels = BTreeMap::from([(labels::ZONE.to_string(), zone.to_string())]);
    pool.written_requirements
        .iter()
        .filter(|r| r.key == labels::ZONE)
        .all(|r| pool_requirement_holds(r, &labels).is_ok())
        && pool.labels.get(labels::ZONE).is_none_or(|z| z == zone)
}

/// Where a new node's labels disagree with what its pool, instance type and offering make
/// them: each key the validator can derive, and the label the plan gave instead.
fn label_disagreements(
    claim_labels: &BTreeMap<String, String>,
    pool: &Pool,
    it: &InstanceType,
    zone: &str,
    capacity_type: &str,
) -> Vec<String> {
    let mut expected: Vec<(String, String)> = it.labels().into_iter().collect();
    expected.extend(pool.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    expected.push((labels::ZONE.to_string(), zone.to_string()));
    expected.push((labels::CAPACITY_TYPE.to_string(), capacity_type.to_string()));
    expected.push((labels::NODE_POOL.to_string(), pool.name.clone()));
    expected
        .into_iter()
        .filter_map(|(k, v)| {
            let found = node_label(claim_labels, &k);
            (found != Some(v.as_str())).then(|| {
                format!(
                    "label {k} is {} but should be {v}",
                    found.unwrap_or("missing")
                )
            })
        })
        .collect()
}

/// Every violated constraint, described; empty when the plan is sound.
pub fn validate(input: &Input, plan: &Plan) -> Vec<String> {
    let mut errors = Vec::new();
    let pending: BTreeMap<&str, &PodInfo> =
        input.pending.iter().map(|p| (p.key.as_str(), p)).collect();
    let mut nodes: Vec<PlacedNode<'_>> = Vec::new();
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    for n in &input.nodes {
        let mut node = PlacedNode {
            name: n.name.clone(),
            labels: n.labels.clone(),
            taints: &n.taints,
            allocatable: n.allocatable.clone(),
            pods: n.pods.iter().map(|p| &**p).collect(),
            pool: None,
            instance_type: None,
            daemon_requests: Resources::zero(),
        };
        node.labels
            .entry(labels::HOSTNAME.to_string())
            .or_insert_with(|| n.name.clone());
        // Every placement naming the node counts, not only the first.
        for e in plan.existing_nodes.iter().filter(|e| e.node == n.name) {
            for key in &e.pods {
                match pending.get(key.as_str()) {
                    Some(p) => node.pods.push(p),
                    None => errors.push(format!("{key} placed on {} is not a pending pod", n.name)),
                }
                if !seen.insert(key.as_str()) {
                    errors.push(format!("{key} placed twice"));
                }
            }
            if n.unschedulable && !e.pods.is_empty() {
                errors.push(format!("pods placed on cordoned node {}", n.name));
            }
        }
        nodes.push(node);
    }
    for e in &plan.existing_nodes {
        if !input.nodes.iter().any(|n| n.name == e.node) {
            errors.push(format!("pods placed on unknown node {}", e.node));
        }
    }
    for c in &plan.node_claims {
        let Some(pool) = input.pools.iter().find(|p| p.name == c.node_pool) else {
            errors.push(format!("{} names unknown nodepool {}", c.name, c.node_pool));
            continue;
        };
        let Some(it) = pool
            .instance_types
            .iter()
            .find(|t| t.name == c.instance_type)
        else {
            errors.push(format!(
                "{}: {} is not an instance type of nodepool {}",
                c.name, c.instance_type, pool.name
            ));
            continue;
        };
        let offered = it
            .offerings
            .iter()
            .any(|o| o.available && o.zone == c.zone && o.capacity_type == c.capacity_type);
        if !offered {
            errors.push(format!(
                "{}: {} is not offered in {} as {}",
                c.name, it.name, c.zone, c.capacity_type
            ));
        }
        let mut node_labels = c.labels.clone();
        node_labels.insert(labels::HOSTNAME.to_string(), c.name.clone());
        // The labels must be the ones the node will really carry...
        for d in label_disagreements(&node_labels, pool, it, &c.zone, c.capacity_type.as_str()) {
            errors.push(format!("{}: {d}", c.name));
        }
        // ...and satisfy the pool's requirements as written.
        for r in &pool.written_requirements {
            if let Err(e) = pool_requirement_holds(r, &node_labels) {
                errors.push(format!(
                    "{}: labels violate nodepool {}: {e}",
                    c.name, pool.name
                ));
            }
        }
        let mut daemon_requests = Resources::zero();
        for ds in &input.daemon_sets {
            let ds_written = ds.written.as_deref().unwrap_or(&NOTHING_WRITTEN);
            let runs = untolerated(&pool.taints, &ds.tolerations).is_none()
                && admits(ds_written, &c.name, &node_labels).is_ok();
            if runs {
                daemon_requests = daemon_requests
                    .checked_add(&ds.requests)
                    .unwrap_or(daemon_requests);
            }
        }
        let mut pods = Vec::new();
        for key in &c.pods {
            match pending.get(key.as_str()) {
                Some(p) => pods.push(*p),
                None => errors.push(format!("{key} placed on {} is not a pending pod", c.name)),
            }
            if !seen.insert(key.as_str()) {
                errors.push(format!("{key} placed twice"));
            }
        }
        nodes.push(PlacedNode {
            name: c.name.clone(),
            labels: node_labels,
            taints: &pool.taints,
            allocatable: it.allocatable.clone(),
            pods,
            pool: Some(pool.name.as_str()),
            instance_type: Some(it),
            daemon_requests,
        });
    }
    for u in &plan.unschedulable {
        if !seen.insert(u.pod.as_str()) {
            errors.push(format!("{} both placed and unschedulable", u.pod));
        }
    }
    for p in &input.pending {
        if !seen.contains(p.key.as_str()) {
            errors.push(format!(
                "{} is neither placed nor reported unschedulable",
                p.key
            ));
        }
    }
    let newly_placed: BTreeSet<&str> = seen;
    for node in &nodes {
        for p in node.pods.iter().filter(|p| unverifiable(p)) {
            errors.push(format!(
                "{}: its placement constraints were not kept as written, so they cannot be checked",
                p.key
            ));
        }
    }
    for node in &nodes {
        // Resources, pod count included.
        let mut total = node.daemon_requests.clone();
        for p in &node.pods {
            total = total.checked_add(&p.requests).unwrap_or(total);
        }
        if !total.fits(&node.allocatable) {
            errors.push(format!(
                "{}: requests {total} exceed allocatable {}",
                node.name, node.allocatable
            ));
        }
        // Host ports.
        let mut ports: Vec<&ContainerPort> = Vec::new();
        for p in &node.pods {
            for hp in &written(p).host_ports {
                if ports.iter().any(|q| host_ports_conflict(q, hp)) {
                    errors.push(format!(
                        "{}: host port {} used twice",
                        node.name,
                        hp.host_port.unwrap_or_default()
                    ));
                }
                ports.push(hp);
            }
        }
        for p in node
            .pods
            .iter()
            .filter(|p| newly_placed.contains(p.key.as_str()))
        {
            if let Some(t) = untolerated(node.taints, &p.tolerations) {
                errors.push(format!(
                    "{} on {} does not tolerate {}",
                    p.key,
                    node.name,
                    describe_taint(t)
                ));
            }
            if let Err(e) = admits(written(p), &node.name, &node.labels) {
                errors.push(format!("{} on {}: node affinity: {e}", p.key, node.name));
            }
        }
    }
    // Inter-pod constraints of newly placed pods.
    let domain_of =
        |node: &PlacedNode<'_>, key: &str| node_label(&node.labels, key).map(str::to_string);
    let placed: Vec<(&PodInfo, usize)> = nodes
        .iter()
        .enumerate()
        .flat_map(|(i, n)| n.pods.iter().map(move |p| (*p, i)))
        .collect();
    for &(pod, ni) in placed
        .iter()
        .filter(|(p, _)| newly_placed.contains(p.key.as_str()))
    {
        let here = &nodes[ni];
        let mine = written(pod);
        for t in required_pod_terms(mine, true) {
            let d = domain_of(here, &t.topology_key);
            for &(other, oi) in &placed {
                if other.key == pod.key || d.is_none() {
                    continue;
                }
                if term_selects(t, pod, other) && domain_of(&nodes[oi], &t.topology_key) == d {
                    errors.push(format!(
                        "{} and {} share {} despite anti-affinity",
                        pod.key, other.key, t.topology_key
                    ));
                }
            }
        }
        // Symmetry: other pods' required anti-affinity must not select this pod.
        for &(other, oi) in &placed {
            if other.key == pod.key {
                continue;
            }
            for t in required_pod_terms(written(other), true) {
                let d = domain_of(&nodes[oi], &t.topology_key);
                if d.is_some()
                    && term_selects(t, other, pod)
                    && domain_of(here, &t.topology_key) == d
                {
                    errors.push(format!(
                        "{} is in {}'s anti-affinity domain",
                        pod.key, other.key
                    ));
                }
            }
        }
        for t in required_pod_terms(mine, false) {
            let matching: Vec<usize> = placed
                .iter()
                .filter(|(o, _)| o.key != pod.key && term_selects(t, pod, o))
                .map(|(_, i)| *i)
                .collect();
            if matching.is_empty() {
                continue; // a self-affine group's first pod may go anywhere
            }
            let d = domain_of(here, &t.topology_key);
            if d.is_none()
                || !matching
                    .iter()
                    .any(|&i| domain_of(&nodes[i], &t.topology_key) == d)
            {
                errors.push(format!(
                    "{} has no affinity peer in its {}",
                    pod.key, t.topology_key
                ));
            }
        }
        for s in mine
            .topology_spread_constraints
            .iter()
            .filter(|s| s.when_unsatisfiable == "DoNotSchedule")
        {
            // nodeAffinityPolicy defaults to Honor, nodeTaintsPolicy to Ignore.
            let honor_affinity = s.node_affinity_policy.as_deref() != Some("Ignore");
            let honor_taints = s.node_taints_policy.as_deref() == Some("Honor");
            let eligible = |n: &PlacedNode<'_>| {
                (!honor_affinity || admits(mine, &n.name, &n.labels).is_ok())
                    && (!honor_taints || untolerated(n.taints, &pod.tolerations).is_none())
            };
            let mut counts: BTreeMap<String, i64> = BTreeMap::new();
            if s.topology_key == labels::HOSTNAME {
                // A node that could still be bought is an empty domain.
                counts.insert(String::new(), 0);
            } else if s.topology_key == labels::ZONE {
                // Zones a node could still be bought in are domains, except those the
                // pool's requirements or (nodeAffinityPolicy Honor) the pod's own node
                // affinity rule out, or (nodeTaintsPolicy Honor) whose pool taints the pod
                // does not tolerate: no node there could ever count for it.
                for pool in &input.pools {
                    if honor_taints && untolerated(&pool.taints, &pod.tolerations).is_some() {
                        continue;
                    }
                    for it in &pool.instance_types {
                        for o in &it.offerings {
                            let pod_allows = !honor_affinity
                                || zone_possible(
                                    &mine.node_selector,
                                    required_node_affinity(mine),
                                    &o.zone,
                                );
                            if pool_allows_zone(pool, &o.zone) && pod_allows {
                                counts.entry(o.zone.clone()).or_insert(0);
                            }
                        }
                    }
                }
            }
            for n in nodes.iter().filter(|n| eligible(n)) {
                if let Some(d) = domain_of(n, &s.topology_key) {
                    counts.entry(d).or_insert(0);
                }
            }
            // As kube-scheduler counts: matching pods on eligible nodes only.
            for &(other, oi) in &placed {
                if spread_counts(s, pod, other)
                    && eligible(&nodes[oi])
                    && let Some(d) = domain_of(&nodes[oi], &s.topology_key)
                    && let Some(c) = counts.get_mut(&d)
                {
                    *c += 1;
                }
            }
            let Some(d) = domain_of(here, &s.topology_key) else {
                errors.push(format!(
                    "{} on {} which lacks {}",
                    pod.key, here.name, s.topology_key
                ));
                continue;
            };
            // Fewer eligible domains than minDomains: the global minimum is taken as 0.
            let min = if s
                .min_domains
                .is_some_and(|m| counts.len() < usize::try_from(m).unwrap_or(0))
            {
                0
            } else {
                counts.values().copied().min().unwrap_or(0)
            };
            let count = counts.get(&d).copied().unwrap_or(0);
            if count - min > i64::from(s.max_skew) {
                errors.push(format!(
                    "{}: {} has {count} matching pods, {} more than the least ({min})",
                    pod.key, d, s.max_skew
                ));
            }
        }
    }
    // NodePool limits over the new nodes and what the pool already had.
    for pool in &input.pools {
        let mut total = pool.in_use.clone();
        let mut count = pool.nodes_in_use;
        for n in nodes.iter().filter(|n| n.pool == Some(pool.name.as_str())) {
            if let Some(it) = n.instance_type {
                total = total.checked_add(&it.capacity).unwrap_or(total);
                count += 1;
            }
        }
        if count == pool.nodes_in_use {
            continue; // nothing new: a pool already over its limits is not this plan's doing
        }
        for d in &pool.limits.limited {
            if total.get(d) > pool.limits.resources.get(d) {
                errors.push(format!("nodepool {} exceeds its {} limit", pool.name, d));
            }
        }
        if pool.limits.nodes.is_some_and(|l| count > l) {
            errors.push(format!("nodepool {} exceeds its node limit", pool.name));
        }
    }
    errors
}
