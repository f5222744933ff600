//! An independent check of a plan against its input: recomputes every constraint from the
//! plan's own output (node labels, pod lists, instance types), sharing none of the
//! scheduler's bookkeeping. Used by tests and by consolidation to prove a plan sound.

use std::collections::{BTreeMap, BTreeSet};

use super::input::Input;
use super::plan::Plan;
use super::pod::PodInfo;
use super::taints;
use crate::apis::labels;
use crate::model::{InstanceType, Resources};

/// A node as the plan leaves it.
struct PlacedNode<'a> {
    name: String,
    labels: BTreeMap<String, String>,
    taints: Vec<k8s_openapi::api::core::v1::Taint>,
    allocatable: Resources,
    pods: Vec<&'a PodInfo>,
    pool: Option<&'a str>,
    instance_type: Option<&'a InstanceType>,
    daemon_requests: Resources,
}

fn label<'l>(labels: &'l BTreeMap<String, String>, key: &str) -> Option<&'l str> {
    if key == labels::HOSTNAME {
        return labels.get(key).map(String::as_str);
    }
    let canonical = labels::canonical_key(key);
    labels
        .iter()
        .find(|(k, _)| labels::canonical_key(k) == canonical)
        .map(|(_, v)| v.as_str())
}

/// Whether a zone requirement (absent: any zone) admits `zone`.
fn zone_allowed(requirement: Option<&crate::model::Requirement>, zone: &str) -> bool {
    requirement.is_none_or(|r| r.admits_value(zone))
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
            taints: n.taints.clone(),
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
        // The node must satisfy its pool's requirements.
        if let Err(e) = pool.requirements.matches_labels(&node_labels) {
            errors.push(format!(
                "{}: labels violate nodepool {}: {e}",
                c.name, pool.name
            ));
        }
        let mut daemon_requests = Resources::zero();
        for ds in &input.daemon_sets {
            let runs = taints::untolerated(&pool.taints, &ds.tolerations, false).is_none()
                && ds.node_requirements.matches_labels(&node_labels).is_ok();
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
            taints: pool.taints.clone(),
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
        let mut ports = Vec::new();
        for p in &node.pods {
            for hp in &p.host_ports {
                if ports.iter().any(|q: &super::pod::HostPort| q.conflicts(hp)) {
                    errors.push(format!("{}: host port {} used twice", node.name, hp.port));
                }
                ports.push(hp.clone());
            }
        }
        for p in node
            .pods
            .iter()
            .filter(|p| newly_placed.contains(p.key.as_str()))
        {
            if let Some(t) = taints::untolerated(&node.taints, &p.tolerations, false) {
                errors.push(format!(
                    "{} on {} does not tolerate {}",
                    p.key,
                    node.name,
                    taints::describe(t)
                ));
            }
            if let Err(e) = p.node_requirements.matches_labels(&node.labels) {
                errors.push(format!("{} on {}: node affinity: {e}", p.key, node.name));
            }
        }
    }
    // Inter-pod constraints of newly placed pods.
    let domain_of = |node: &PlacedNode<'_>, key: &str| label(&node.labels, key).map(str::to_string);
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
        for t in &pod.anti_affinity {
            let d = domain_of(here, &t.topology_key);
            for &(other, oi) in &placed {
                if other.key == pod.key || d.is_none() {
                    continue;
                }
                if t.namespaces.contains(&other.namespace)
                    && t.selector.matches(&other.labels)
                    && domain_of(&nodes[oi], &t.topology_key) == d
                {
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
            for t in &other.anti_affinity {
                let d = domain_of(&nodes[oi], &t.topology_key);
                if d.is_some()
                    && t.namespaces.contains(&pod.namespace)
                    && t.selector.matches(&pod.labels)
                    && domain_of(here, &t.topology_key) == d
                {
                    errors.push(format!(
                        "{} is in {}'s anti-affinity domain",
                        pod.key, other.key
                    ));
                }
            }
        }
        for t in &pod.affinity {
            let matching: Vec<usize> = placed
                .iter()
                .filter(|(o, _)| {
                    o.key != pod.key
                        && t.namespaces.contains(&o.namespace)
                        && t.selector.matches(&o.labels)
                })
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
        for s in pod.spread.iter().filter(|s| s.hard) {
            let mut counts: BTreeMap<String, i64> = BTreeMap::new();
            if s.topology_key == labels::HOSTNAME {
                // A node that could still be bought is an empty domain.
                counts.insert(String::new(), 0);
            } else if labels::canonical_key(&s.topology_key) == labels::ZONE {
                // Zones a node could still be bought in are domains, except those the
                // pool's requirements or (nodeAffinityPolicy Honor) the pod's own node
                // affinity rule out: no node there could ever count for it.
                for pool in &input.pools {
                    for it in &pool.instance_types {
                        for o in &it.offerings {
                            let pool_allows =
                                zone_allowed(pool.requirements.get(labels::ZONE), &o.zone);
                            let pod_allows = !s.honor_node_affinity
                                || pod
                                    .node_requirements
                                    .alternatives()
                                    .iter()
                                    .any(|a| zone_allowed(a.get(labels::ZONE), &o.zone));
                            if pool_allows && pod_allows {
                                counts.entry(o.zone.clone()).or_insert(0);
                            }
                        }
                    }
                }
            }
            for n in &nodes {
                if s.honor_node_affinity && pod.node_requirements.matches_labels(&n.labels).is_err()
                {
                    continue;
                }
                if let Some(d) = domain_of(n, &s.topology_key) {
                    counts.entry(d).or_insert(0);
                }
            }
            for &(other, oi) in &placed {
                if other.namespace == pod.namespace
                    && s.selector.matches(&other.labels)
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
            let mine = counts.get(&d).copied().unwrap_or(0);
            if mine - min > i64::from(s.max_skew) {
                errors.push(format!(
                    "{}: {} has {mine} matching pods, {} more than the least ({min})",
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
