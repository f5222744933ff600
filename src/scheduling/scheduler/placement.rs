//! Placing one pod: whether a node can take it (room, cordon, taints, node affinity, host
//! ports, topology), recording it there or taking it off, and making a new node for it
//! from the first NodePool that can.

use std::rc::Rc;
use std::sync::Arc;

use super::Scheduler;
use super::nodes::{Node, NodeKind};
use super::preferences::Active;
use super::resources::{R, ResV, add, fits, sub};
use super::templates::OptionList;
use super::topology::{Kind, at, bump};
use crate::apis::labels;
use crate::model::{NodeRequirements, Requirements};
use crate::scheduling::ids::{Id, NodeId, PodId, PoolId, TypeId};
use crate::scheduling::index::Query;
use crate::scheduling::taints;

/// Why a node cannot take a pod. Cheap to build on the hot path; turned into words only
/// when a pod ends up unschedulable.
#[derive(Debug, Clone)]
pub(super) enum Reject {
    /// A fixed reason.
    Static(&'static str),
    /// Not enough of one resource dimension.
    Insufficient(usize),
    /// A topology constraint of a group, with what went wrong.
    Topology(usize, &'static str),
    /// The pod's node affinity does not match this node.
    NodeAffinity,
    /// A reason built on a rare path.
    Owned(String),
}

impl From<String> for Reject {
    fn from(s: String) -> Self {
        Reject::Owned(s)
    }
}

/// How a planned node changes to take a pod: narrowed requirements and options, the new
/// cheapest position and the capacity it then counts against its pool's limits.
pub(super) struct PlannedFit {
    pub(super) requirements: Option<Requirements>,
    pub(super) options: Option<Rc<OptionList>>,
    pub(super) pos: usize,
    pub(super) reserved: ResV,
}

impl Scheduler<'_> {
    /// Records pod `p` on node `n`: resources, ports, topology counts.
    pub(super) fn place(&mut self, p: PodId, n: NodeId) {
        let req = self.pods[p].req.unwrap_or([0; R]);
        let node = &mut self.nodes[n];
        node.used = add(&node.used, &req);
        node.pods.push(p);
        node.host_ports
            .extend(self.pods[p].info.host_ports.iter().cloned());
        for &g in &self.pods[p].matches {
            let group = &mut self.groups[g];
            if let Some(d) = node.domains[group.key_id] {
                bump(&mut group.counts, d);
                group.total += 1;
                if let Some(bit) = self.host_bit[g] {
                    node.present_mask |= bit;
                }
            }
        }
        for &g in &self.pods[p].owns_anti {
            let group = &mut self.groups[g];
            if let Some(d) = node.domains[group.key_id] {
                bump(&mut group.owners, d);
                if let Some(bit) = self.host_bit[g] {
                    node.owner_mask |= bit;
                }
            }
        }
        self.pods[p].node = Some(n);
        self.reindex(n);
    }

    /// Reverses [`Scheduler::place`] (used by the packer).
    pub(super) fn unplace(&mut self, p: PodId) {
        let Some(n) = self.pods[p].node.take() else {
            return;
        };
        let req = self.pods[p].req.unwrap_or([0; R]);
        let node = &mut self.nodes[n];
        node.used = sub(&node.used, &req);
        node.pods.retain(|q| *q != p);
        for hp in &self.pods[p].info.host_ports {
            if let Some(i) = node.host_ports.iter().position(|h| h == hp) {
                node.host_ports.remove(i);
            }
        }
        for &g in &self.pods[p].matches {
            let group = &mut self.groups[g];
            if let Some(d) = node.domains[group.key_id]
                && let Some(c) = group.counts.get_mut(d as usize)
            {
                *c -= 1;
                group.total -= 1;
                if *c == 0
                    && let Some(bit) = self.host_bit[g]
                {
                    node.present_mask &= !bit;
                }
            }
        }
        for &g in &self.pods[p].owns_anti {
            let group = &mut self.groups[g];
            if let Some(d) = node.domains[group.key_id]
                && let Some(c) = group.owners.get_mut(d as usize)
            {
                *c -= 1;
                if *c == 0
                    && let Some(bit) = self.host_bit[g]
                {
                    node.owner_mask &= !bit;
                }
            }
        }
        self.reindex(n);
    }

    /// A rejection in words.
    pub(super) fn reject_text(&self, r: &Reject) -> String {
        match r {
            Reject::Static(s) => (*s).to_string(),
            Reject::Owned(s) => s.clone(),
            Reject::NodeAffinity => "node selector or affinity does not match".to_string(),
            Reject::Insufficient(d) => format!("insufficient {}", self.dims.name(*d)),
            Reject::Topology(g, what) => {
                let group = &self.groups[*g];
                let key = &self.keys[group.key_id];
                match (*what, group.kind) {
                    ("skew", Kind::Spread { max_skew, .. }) => {
                        format!("topology spread on {key} would exceed maxSkew {max_skew}")
                    }
                    ("no-label", _) => format!("node has no {key} label for topology spread"),
                    ("affinity", _) => {
                        format!("pod affinity on {key} finds no matching pod in the node's domain")
                    }
                    ("anti", _) => format!(
                        "pod anti-affinity on {key} conflicts with a pod in the node's domain"
                    ),
                    _ => format!("an existing pod's anti-affinity on {key} excludes it"),
                }
            }
        }
    }

    pub(super) fn requirements_match(
        &self,
        node: &Node,
        reqs: &NodeRequirements,
    ) -> Result<(), String> {
        let r = if node.is_planned() {
            reqs.alternatives()
                .iter()
                .find(|a| {
                    a.compatible_allowing(&node.requirements, &labels::is_well_known)
                        .is_ok()
                })
                .map(|_| ())
                .ok_or(())
        } else {
            reqs.matches_labels(&node.labels).map_err(|_| ())
        };
        r.map_err(|()| {
            let conflict = reqs.alternatives().iter().find_map(|a| {
                if node.is_planned() {
                    a.compatible_allowing(&node.requirements, &labels::is_well_known)
                        .err()
                } else {
                    a.matches_labels(&node.labels).err()
                }
            });
            match conflict {
                Some(c) => format!("node affinity: {c}"),
                None => "node affinity does not match".to_string(),
            }
        })
    }

    pub(super) fn ports_free(&self, p: PodId, n: NodeId) -> bool {
        self.pods[p]
            .info
            .host_ports
            .iter()
            .all(|hp| !self.nodes[n].host_ports.iter().any(|h| h.conflicts(hp)))
    }

    /// What node `n` would have in use with pod `p` added, if that is within the node's
    /// upper bound.
    pub(super) fn room_for(&self, p: PodId, n: NodeId) -> Result<ResV, Reject> {
        let node = &self.nodes[n];
        let req = self.pods[p].req.ok_or(Reject::Static(
            "requests an extended resource this pass cannot track",
        ))?;
        let need = add(&node.used, &req);
        match (0..R).find(|&i| need[i] > node.cap_upper[i]) {
            Some(dim) => Err(Reject::Insufficient(dim)),
            None => Ok(need),
        }
    }

    /// Tries pod `p` on existing node `n`.
    pub(super) fn try_existing(
        &self,
        p: PodId,
        n: NodeId,
        active: &Active,
        can_create: bool,
    ) -> Result<(), Reject> {
        let node = &self.nodes[n];
        let pod = &self.pods[p];
        self.room_for(p, n)?;
        if node.cordoned {
            return Err(Reject::Static("node is cordoned"));
        }
        if let Some(t) = taints::untolerated(
            &node.taints,
            &pod.info.tolerations,
            active.prefer_no_schedule,
        ) {
            return Err(format!("untolerated taint {}", taints::describe(t)).into());
        }
        if !active.trivial && !active.node_requirements.admits_labels(&node.labels) {
            return Err(Reject::NodeAffinity);
        }
        if !self.ports_free(p, n) {
            return Err(Reject::Static("host port in use"));
        }
        self.topology_ok(p, n, active, can_create)
    }

    /// Tries pod `p` on planned node `n`; on success returns the narrowed requirements
    /// (if they changed), the surviving options and the new cheapest position.
    pub(super) fn try_planned(
        &self,
        p: PodId,
        n: NodeId,
        active: &Active,
        can_create: bool,
    ) -> Result<PlannedFit, Reject> {
        let node = &self.nodes[n];
        let NodeKind::Planned { pool, .. } = node.kind else {
            return Err(Reject::Static("not a planned node"));
        };
        let pod = &self.pods[p];
        let need = self.room_for(p, n)?;
        if let Some(t) = taints::untolerated(
            &node.taints,
            &pod.info.tolerations,
            active.prefer_no_schedule,
        ) {
            return Err(format!("untolerated taint {}", taints::describe(t)).into());
        }
        if !self.ports_free(p, n) {
            return Err(Reject::Static("host port in use"));
        }
        let (requirements, options) = if active.trivial {
            (None, None)
        } else {
            let alt = active
                .node_requirements
                .alternatives()
                .iter()
                .find(|a| {
                    a.compatible_allowing(&node.requirements, &labels::is_well_known)
                        .is_ok()
                })
                .ok_or_else(|| {
                    Reject::Owned(
                        self.requirements_match(node, &active.node_requirements)
                            .err()
                            .unwrap_or_default(),
                    )
                })?;
            let narrowed = node.requirements.intersect(alt);
            if narrowed == *node.requirements {
                (None, None)
            } else {
                let NodeKind::Planned {
                    zone,
                    capacity_type,
                    ..
                } = &node.kind
                else {
                    return Err(Reject::Static("not a planned node"));
                };
                let kept = self.option_list(pool, &narrowed, zone, *capacity_type);
                (Some(narrowed), Some(kept))
            }
        };
        let opts: &[TypeId] = &options.as_ref().unwrap_or(&node.options).types;
        let types = &self.pools[pool].types;
        let start = if options.is_some() { 0 } else { node.pos };
        let pos = (start..opts.len())
            .find(|&i| fits(&need, &types[opts[i]].alloc))
            .ok_or(Reject::Static(
                "no instance type left on this node holds the pod",
            ))?;
        self.min_values_ok(pool, &opts[pos..], &need)
            .map_err(Reject::Owned)?;
        // Limits: the node now counts as its cheapest fitting type.
        let new_reserved = types[opts[pos]].capacity;
        let delta = sub(&new_reserved, &node.reserved);
        let remaining = &self.pools[pool].remaining;
        if (0..R).any(|i| remaining[i] != i64::MAX && delta[i] > remaining[i]) {
            return Err(Reject::Static("nodepool limits reached"));
        }
        self.topology_ok(p, n, active, can_create)?;
        Ok(PlannedFit {
            requirements,
            options,
            pos,
            reserved: new_reserved,
        })
    }

    pub(super) fn apply_planned(&mut self, n: NodeId, fit: PlannedFit) {
        let NodeKind::Planned { pool, .. } = self.nodes[n].kind else {
            return;
        };
        let delta = sub(&fit.reserved, &self.nodes[n].reserved);
        let remaining = &mut self.pools[pool].remaining;
        for i in 0..R {
            if remaining[i] != i64::MAX {
                remaining[i] -= delta[i];
            }
        }
        let node = &mut self.nodes[n];
        node.reserved = fit.reserved;
        if let Some(r) = fit.requirements {
            let labels = Arc::make_mut(&mut node.labels);
            for (k, v) in r.single_valued_labels() {
                labels.entry(k).or_insert(v);
            }
            node.requirements = Arc::new(r);
        }
        if let Some(o) = fit.options {
            node.options = o;
        }
        node.pos = fit.pos;
        self.refresh_upper(n);
    }

    /// Creates a node for pod `p` from the first pool (by weight) that can hold it.
    pub(super) fn create_node(&mut self, p: PodId, active: &Active) -> Result<NodeId, Vec<String>> {
        let mut reasons = Vec::new();
        for pi in self.pools.ids() {
            match self.plan_new(pi, p, active) {
                Ok(n) => return Ok(n),
                Err(r) => reasons.push(format!(
                    "nodepool {}: {r}",
                    self.input.pools[pi.index()].name
                )),
            }
        }
        if self.pools.is_empty() {
            reasons.push("no NodePool".to_string());
        }
        Err(reasons)
    }

    pub(super) fn plan_new(
        &mut self,
        pi: PoolId,
        p: PodId,
        active: &Active,
    ) -> Result<NodeId, String> {
        self.pool_admits(pi, p, active)?;
        let req = self.pods[p]
            .req
            .ok_or("requests an extended resource this pass cannot track")?;
        let input = self.input;
        let pool = &input.pools[pi.index()];
        if self.pools[pi].nodes_remaining <= 0 {
            return Err("node limit reached".to_string());
        }
        // The requirements a new node would have: the pool's, narrowed by the first of the
        // pod's ORed alternatives that some instance type of the pool meets with room for
        // the pod (a term no size satisfies must not hide the next one), else the first
        // compatible alternative, for the reason.
        let alt = if active.trivial {
            None
        } else {
            let compatible: Vec<&Requirements> = active
                .node_requirements
                .alternatives()
                .iter()
                .filter(|a| {
                    a.compatible_allowing(&pool.requirements, &labels::is_well_known)
                        .is_ok()
                })
                .collect();
            compatible
                .iter()
                .find(|a| {
                    let templates = self.templates(pi, Some(a));
                    templates
                        .compatible
                        .iter()
                        .any(|&t| fits(&req, &self.pools[pi].types[t].alloc))
                })
                .or(compatible.first())
                .map(|a| (*a).clone())
        };
        let templates = self.templates(pi, alt.as_ref());
        let state = &self.pools[pi];
        let its = &pool.instance_types;
        // Types compatible with the requirements that hold the pod.
        let compatible = &templates.compatible;
        let mut candidates: Vec<TypeId> = Vec::new();
        let mut largest: Option<TypeId> = None;
        let compatible_count = compatible.len();
        for &t in compatible.iter() {
            let ti = &state.types[t];
            if largest.is_none_or(|l| {
                let a = &state.types[l].alloc;
                (ti.alloc[1], ti.alloc[0]) > (a[1], a[0])
            }) {
                largest = Some(t);
            }
            if !fits(&req, &ti.alloc) {
                continue;
            }
            let within = (0..R)
                .all(|i| state.remaining[i] == i64::MAX || ti.capacity[i] <= state.remaining[i]);
            if within {
                candidates.push(t);
            }
        }
        if candidates.is_empty() {
            if compatible_count == 0 {
                return Err(
                    "no instance type satisfies the pod's and the pool's requirements".to_string(),
                );
            }
            let any_fits = compatible
                .iter()
                .any(|&t| fits(&req, &state.types[t].alloc));
            if any_fits {
                return Err("limits reached".to_string());
            }
            let l = largest.map(|l| &state.types[l]);
            let short = (0..R)
                .find(|&i| l.is_some_and(|l| req[i] > l.alloc[i]))
                .unwrap_or(0);
            return Err(match l {
                Some(l) => format!(
                    "no instance type has {} {} free after overhead and DaemonSets; largest allowed is {} ({} {})",
                    self.dims.show(short, req[short]),
                    self.dims.name(short),
                    its[l.index].name,
                    self.dims.show(short, l.alloc[short]),
                    self.dims.name(short),
                ),
                None => "no instance type fits".to_string(),
            });
        }
        // Zone and capacity type: for every admitted pair, the cheapest candidate offered
        // there, checked below against the pod's topology on zone.
        let mut is_candidate = vec![false; state.types.len()];
        for &t in &candidates {
            is_candidate[t.index()] = true;
        }
        let mut choices: Vec<(usize, f64)> = Vec::new();
        for (i, slot) in templates.slots.iter().enumerate() {
            let Some(&t) = slot
                .options
                .types
                .iter()
                .find(|&&t| is_candidate[t.index()])
            else {
                continue;
            };
            let price = its[state.types[t].index]
                .offerings
                .iter()
                .find(|o| o.zone == slot.zone && o.capacity_type == slot.capacity_type)
                .map_or(f64::INFINITY, |o| o.price_per_hour);
            choices.push((i, price));
        }
        if choices.is_empty() {
            return Err("no available offering in an allowed zone and capacity type".to_string());
        }
        let zone_key = self
            .keys
            .iter()
            .position(|k| labels::canonical_key(k) == labels::ZONE);
        let mut best: Option<((i64, f64, usize, String), usize)> = None;
        let mut topo_reason = None;
        for &(slot_index, price) in &choices {
            let slot = &templates.slots[slot_index];
            let zone = &slot.zone;
            let zone_domain = zone_key.and_then(|k| self.domains[k].ids.get(zone).copied());
            // Check zone-keyed constraints for this zone.
            let mut ok = true;
            let mut spread_count = 0i64;
            if let Some(k) = zone_key {
                for c in &active.cons {
                    if self.groups[c.group].key_id != k {
                        continue;
                    }
                    let d = Some(zone_domain.unwrap_or(u32::MAX));
                    if let Err(e) = self.domain_ok(c, d, p, active, true) {
                        ok = false;
                        topo_reason = Some(e);
                        break;
                    }
                    if let Kind::Spread { .. } = self.groups[c.group].kind {
                        spread_count += i64::from(
                            zone_domain.map_or(0, |d| at(&self.groups[c.group].counts, d)),
                        );
                    }
                }
                if ok {
                    for &g in &self.pods[p].anti_targets {
                        let group = &self.groups[g];
                        if group.key_id == k
                            && zone_domain.is_some_and(|d| at(&group.owners, d) > 0)
                        {
                            ok = false;
                            topo_reason = Some(Reject::Topology(g, "symmetric"));
                        }
                    }
                }
            }
            if !ok {
                continue;
            }
            let balance = self.pools[pi]
                .planned_per_zone
                .get(zone)
                .copied()
                .unwrap_or(0);
            // Least-loaded zone for spread, then cheapest, then the zone with the fewest
            // planned nodes (keeps plain capacity spread), then by name.
            let better = best.as_ref().is_none_or(|(b, _)| {
                spread_count
                    .cmp(&b.0)
                    .then(price.total_cmp(&b.1))
                    .then(balance.cmp(&b.2))
                    .then_with(|| zone.cmp(&b.3))
                    .is_lt()
            });
            if better {
                best = Some(((spread_count, price, balance, zone.clone()), slot_index));
            }
        }
        let Some((_, slot_index)) = best else {
            return Err(topo_reason.map_or_else(
                || "no zone satisfies the pod's topology".to_string(),
                |r| self.reject_text(&r),
            ));
        };
        let slot = &templates.slots[slot_index];
        // Build the node.
        let state = &mut self.pools[pi];
        state.counter += 1;
        state.nodes_remaining -= 1;
        *state.planned_per_zone.entry(slot.zone.clone()).or_default() += 1;
        let name = format!(
            "{}{}-{}",
            self.options.name_prefix, pool.name, state.counter
        );
        let n = self.push_planned(pi, name, slot);
        match self
            .try_planned(p, n, active, true)
            .map_err(|r| self.reject_text(&r))
        {
            Ok(fit) => {
                self.apply_planned(n, fit);
                self.place(p, n);
                Ok(n)
            }
            Err(e) => {
                // Roll back the empty node.
                self.index.set(n.index(), None);
                let node = self.nodes.pop();
                let state = &mut self.pools[pi];
                state.nodes_remaining += 1;
                state.counter -= 1;
                if let Some(Node {
                    kind: NodeKind::Planned { zone, .. },
                    ..
                }) = node
                    && let Some(c) = state.planned_per_zone.get_mut(&zone)
                {
                    *c -= 1;
                }
                Err(e)
            }
        }
    }

    /// The index query for a pod: its requests, and the hostname-keyed groups whose
    /// presence on a node rules the node out.
    pub(super) fn query(&self, p: PodId, active: &Active, can_create: bool) -> Query {
        let pod = &self.pods[p];
        let mut q = Query {
            need: pod.req.unwrap_or([0; R]),
            avoid_present: 0,
            avoid_owners: 0,
        };
        for c in &active.cons {
            let Some(bit) = self.host_bit[c.group] else {
                continue;
            };
            match self.groups[c.group].kind {
                Kind::Anti => q.avoid_present |= bit,
                // With a new node possible the smallest count is 0, so maxSkew 1 rules out
                // every node that already has a matching pod.
                Kind::Spread { max_skew: 1, .. } if can_create && c.self_match => {
                    q.avoid_present |= bit
                }
                _ => {}
            }
        }
        for &g in &pod.anti_targets {
            if let Some(bit) = self.host_bit[g] {
                q.avoid_owners |= bit;
            }
        }
        q
    }
}
