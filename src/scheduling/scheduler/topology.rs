//! Inter-pod constraints: topology spread, pod affinity and anti-affinity as groups of
//! pods counted per domain of a topology key, and whether a node's domains satisfy a pod
//! (kube-scheduler's semantics; Karpenter's `topology.go`).

use std::collections::BTreeSet;

// Fx hashing: the keys are our own strings and requirement sets, not attacker input.
use rustc_hash::FxHashMap as HashMap;

use super::Scheduler;
use super::nodes::Node;
use super::placement::Reject;
use super::preferences::Active;
use crate::apis::labels;
use crate::scheduling::ids::{NodeId, PodId};
use crate::scheduling::pod::{Namespaces, PodTerm, Selector, Spread};
use crate::scheduling::taints;

/// What a group's constraint is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Kind {
    Spread {
        max_skew: i32,
        min_domains: Option<i32>,
        honor_node_affinity: bool,
        honor_taints: bool,
    },
    Affinity,
    Anti,
}

/// What makes two pods' constraints the same group.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct GroupKey {
    pub(super) kind: Kind,
    pub(super) key: String,
    pub(super) selector: Selector,
    pub(super) namespaces: Namespaces,
}

/// Pods that one constraint counts, per domain of its topology key.
#[derive(Debug, Clone)]
pub(super) struct Group {
    pub(super) kind: Kind,
    pub(super) key_id: usize,
    pub(super) selector: Selector,
    pub(super) namespaces: Namespaces,
    /// Matching pods per domain.
    pub(super) counts: Vec<u32>,
    /// Pods *having* this (required anti-affinity) term, per domain.
    pub(super) owners: Vec<u32>,
    pub(super) total: u32,
}

pub(super) fn bump(v: &mut Vec<u32>, d: u32) {
    let i = d as usize;
    if v.len() <= i {
        v.resize(i + 1, 0);
    }
    v[i] += 1;
}

pub(super) fn at(v: &[u32], d: u32) -> u32 {
    v.get(d as usize).copied().unwrap_or(0)
}

/// One constraint of a pod on a group.
#[derive(Debug, Clone, Copy)]
pub(super) struct Con {
    pub(super) group: usize,
    /// Whether the pod itself matches the group's selector (counts itself).
    pub(super) self_match: bool,
}

/// The domains (values) of one topology key, numbered in the order first seen.
#[derive(Default, Debug, Clone)]
pub(super) struct Interner {
    pub(super) ids: HashMap<String, u32>,
    pub(super) names: Vec<String>,
}

impl Interner {
    pub(super) fn id(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.ids.get(s) {
            return i;
        }
        let i = self.names.len() as u32;
        self.ids.insert(s.to_string(), i);
        self.names.push(s.to_string());
        i
    }
}

pub(super) fn term_key(kind: Kind, t: &PodTerm) -> GroupKey {
    GroupKey {
        kind,
        key: t.topology_key.clone(),
        selector: t.selector.clone(),
        namespaces: t.namespaces.clone(),
    }
}

pub(super) fn spread_key(s: &Spread, namespace: &str) -> GroupKey {
    GroupKey {
        kind: Kind::Spread {
            max_skew: s.max_skew,
            min_domains: s.min_domains,
            honor_node_affinity: s.honor_node_affinity,
            honor_taints: s.honor_taints,
        },
        key: s.topology_key.clone(),
        selector: s.selector.clone(),
        // Spread constraints count pods of the pod's own namespace.
        namespaces: Namespaces::Set(BTreeSet::from([namespace.to_string()])),
    }
}

impl Scheduler<'_> {
    pub(super) fn key_id(&mut self, key: &str) -> usize {
        if let Some(i) = self.keys.iter().position(|k| k == key) {
            return i;
        }
        self.keys.push(key.to_string());
        self.domains.push(Interner::default());
        self.keys.len() - 1
    }

    pub(super) fn group_id(
        &mut self,
        index: &mut HashMap<GroupKey, usize>,
        key: GroupKey,
    ) -> usize {
        if let Some(&g) = index.get(&key) {
            return g;
        }
        let key_id = self.key_id(&key.key);
        self.groups.push(Group {
            kind: key.kind,
            key_id,
            selector: key.selector.clone(),
            namespaces: key.namespaces.clone(),
            counts: Vec::new(),
            owners: Vec::new(),
            total: 0,
        });
        index.insert(key, self.groups.len() - 1);
        self.groups.len() - 1
    }

    pub(super) fn node_domains(&mut self, node: &Node) -> Vec<Option<u32>> {
        (0..self.keys.len())
            .map(|k| {
                let key = self.keys[k].clone();
                let value = if key == labels::HOSTNAME {
                    Some(
                        node.labels
                            .get(labels::HOSTNAME)
                            .cloned()
                            .unwrap_or_else(|| node.name.clone()),
                    )
                } else {
                    node.labels.get(labels::canonical_key(&key)).cloned()
                };
                value.map(|v| self.domains[k].id(&v))
            })
            .collect()
    }

    /// The smallest count over the domains a pod could be placed in, for a spread group.
    pub(super) fn spread_min(&self, g: usize, p: PodId, active: &Active, can_create: bool) -> u32 {
        let group = &self.groups[g];
        let Kind::Spread {
            min_domains,
            honor_node_affinity,
            honor_taints,
            ..
        } = group.kind
        else {
            return 0;
        };
        let key = &self.keys[group.key_id];
        if key == labels::HOSTNAME && can_create {
            // A node that does not exist yet is a domain with no matching pods.
            return 0;
        }
        let is_zone = labels::canonical_key(key) == labels::ZONE;
        if is_zone && active.trivial && !honor_taints {
            // Every node is eligible: the domains are every zone a node is in, plus the
            // zones a new node could take (empty ones count zero).
            let interned = &self.domains[group.key_id];
            let mut n_domains = interned.names.len();
            if can_create {
                for (pi, pool) in self.pools.enumerate() {
                    if self.pool_admits(pi, p, active).is_ok() {
                        for z in &pool.zones {
                            if !interned.ids.contains_key(z) {
                                n_domains += 1;
                            }
                        }
                    }
                }
            }
            let below_min_domains = min_domains.is_some_and(|m| (n_domains as i64) < i64::from(m));
            if n_domains > interned.names.len() || below_min_domains {
                return 0;
            }
            return (0..interned.names.len() as u32)
                .map(|d| at(&group.counts, d))
                .min()
                .unwrap_or(0);
        }
        let mut domains: BTreeSet<u32> = BTreeSet::new();
        for node in &self.nodes {
            if node.retired {
                continue;
            }
            let Some(d) = node.domains[group.key_id] else {
                continue;
            };
            if honor_node_affinity
                && !active.trivial
                && self
                    .requirements_match(node, &active.node_requirements)
                    .is_err()
            {
                continue;
            }
            if honor_taints
                && taints::untolerated(&node.taints, &self.pods[p].info.tolerations, false)
                    .is_some()
            {
                continue;
            }
            domains.insert(d);
        }
        if can_create && labels::canonical_key(key) == labels::ZONE {
            for (pi, pool) in self.pools.enumerate() {
                if self.pool_admits(pi, p, active).is_ok() {
                    // With nodeAffinityPolicy Honor, a zone the pod's node affinity rules
                    // out is no domain of its: no node there could ever count for it.
                    let zones = pool.zones.iter().filter(|z| {
                        !honor_node_affinity
                            || active
                                .node_requirements
                                .alternatives()
                                .iter()
                                .any(|a| a.get(labels::ZONE).is_none_or(|r| r.admits_value(z)))
                    });
                    for z in zones {
                        if let Some(&id) = self.domains[group.key_id].ids.get(z) {
                            domains.insert(id);
                        } else {
                            // A zone no node is in yet has a count of zero.
                            return 0;
                        }
                    }
                }
            }
        }
        if let Some(m) = min_domains
            && (domains.len() as i64) < i64::from(m)
        {
            return 0;
        }
        domains
            .iter()
            .map(|d| at(&group.counts, *d))
            .min()
            .unwrap_or(0)
    }

    /// Whether a node's topology domains satisfy the pod's active constraints.
    pub(super) fn topology_ok(
        &self,
        p: PodId,
        n: NodeId,
        active: &Active,
        can_create: bool,
    ) -> Result<(), Reject> {
        let node = &self.nodes[n];
        for c in &active.cons {
            self.domain_ok(
                c,
                node.domains[self.groups[c.group].key_id],
                p,
                active,
                can_create,
            )?;
        }
        for &g in &self.pods[p].anti_targets {
            let group = &self.groups[g];
            if let Some(d) = node.domains[group.key_id]
                && at(&group.owners, d) > 0
            {
                return Err(Reject::Topology(g, "symmetric"));
            }
        }
        Ok(())
    }

    pub(super) fn domain_ok(
        &self,
        c: &Con,
        d: Option<u32>,
        p: PodId,
        active: &Active,
        can_create: bool,
    ) -> Result<(), Reject> {
        let group = &self.groups[c.group];
        match group.kind {
            Kind::Spread { max_skew, .. } => {
                let Some(d) = d else {
                    return Err(Reject::Topology(c.group, "no-label"));
                };
                let min = self.spread_min(c.group, p, active, can_create);
                let count = i64::from(at(&group.counts, d)) + i64::from(c.self_match);
                if count - i64::from(min) > i64::from(max_skew) {
                    return Err(Reject::Topology(c.group, "skew"));
                }
            }
            Kind::Affinity => {
                if group.total == 0 && c.self_match {
                    return Ok(()); // the first pod of a self-affine group may go anywhere
                }
                match d {
                    Some(d) if at(&group.counts, d) > 0 => {}
                    _ => {
                        return Err(Reject::Topology(c.group, "affinity"));
                    }
                }
            }
            Kind::Anti => {
                if let Some(d) = d
                    && at(&group.counts, d) > 0
                {
                    return Err(Reject::Topology(c.group, "anti"));
                }
            }
        }
        Ok(())
    }
}
