//! The packer's view of the planning state: the named operations the cost-aware packer
//! ([`crate::scheduling::packing`]) may perform after the placement pass, and nothing else.
//!
//! The packer lifts pods that carry no inter-pod constraint off planned nodes, shrinks or
//! retires the nodes they leave, refills kept nodes' spare room, opens new nodes for the
//! rest and, if the result is not cheaper, rolls everything back. Each of those steps is
//! one method here; the scheduler's fields stay private to its module.

use super::nodes::{Node, NodeKind};
use super::resources::{R, ResV};
use super::templates::PoolState;
use super::topology::{Group, Interner};
use super::{Options, Scheduler};
use crate::apis::labels;
use crate::model::{CapacityType, InstanceType, NodeRequirements, Requirement, Requirements};
use crate::scheduling::ids::{Id, IdVec, NodeId, PodId, PoolId, TypeId};
use crate::scheduling::index::{NodeIndex, Query};
use crate::scheduling::input::Pool;
use crate::scheduling::taints;

/// The mutable state of a pass, saved so the packer can undo a worse result.
pub(crate) struct Snapshot {
    nodes: IdVec<NodeId, Node>,
    groups: Vec<Group>,
    pools: IdVec<PoolId, PoolState>,
    domains: Vec<Interner>,
    pod_nodes: Vec<Option<NodeId>>,
    index: NodeIndex,
}

/// The planning state as the packer sees it.
pub(crate) struct Planning<'s, 'a> {
    s: &'s mut Scheduler<'a>,
}

impl<'a> Scheduler<'a> {
    /// The packer's view of this pass.
    pub(crate) fn planning(&mut self) -> Planning<'_, 'a> {
        Planning { s: self }
    }
}

impl Planning<'_, '_> {
    /// The options of the pass.
    pub(crate) fn options(&self) -> &Options {
        &self.s.options
    }

    /// Saves the mutable state of the pass.
    pub(crate) fn snapshot(&self) -> Snapshot {
        let s = &self.s;
        Snapshot {
            nodes: s.nodes.clone(),
            groups: s.groups.clone(),
            pools: s.pools.clone(),
            domains: s.domains.clone(),
            pod_nodes: s.pods.iter().map(|p| p.node).collect(),
            index: s.index.clone(),
        }
    }

    /// Returns to a saved state.
    pub(crate) fn rollback(&mut self, saved: Snapshot) {
        let s = &mut *self.s;
        s.nodes = saved.nodes;
        s.groups = saved.groups;
        s.pools = saved.pools;
        s.domains = saved.domains;
        s.index = saved.index;
        for (p, n) in s.pods.iter_mut().zip(saved.pod_nodes) {
            p.node = n;
        }
    }

    /// What the planned nodes cost per hour, each at its cheapest type that holds its pods.
    pub(crate) fn planned_cost(&self) -> f64 {
        self.s
            .nodes
            .ids()
            .filter(|&n| !self.s.nodes[n].pods.is_empty())
            .filter_map(|n| self.s.chosen_type(n).map(|(_, p, _)| p))
            .sum()
    }

    /// The pending pods, in input order.
    pub(crate) fn pending_pods(&self) -> impl Iterator<Item = PodId> + use<> {
        (0..self.s.input.pending.len()).map(PodId::new)
    }

    /// The pool of the planned node pod `p` is on, if the packer may move it: it has no
    /// inter-pod constraint of its own and no other pod's constraint selects it.
    pub(crate) fn movable(&self, p: PodId) -> Option<PoolId> {
        let pod = &self.s.pods[p];
        let free = pod.req.is_some() && !pod.info.has_pod_constraints() && pod.matches.is_empty();
        match self.s.nodes[pod.node?].kind {
            NodeKind::Planned { pool, .. } if free => Some(pool),
            _ => None,
        }
    }

    /// Takes pod `p` off its node.
    pub(crate) fn lift(&mut self, p: PodId) {
        self.s.unplace(p);
    }

    /// Puts pod `p` on node `n`.
    pub(crate) fn put(&mut self, p: PodId, n: NodeId) {
        self.s.place(p, n);
    }

    /// Pod `p`'s requests (`None`: an extended resource the pass cannot track).
    pub(crate) fn request(&self, p: PodId) -> Option<ResV> {
        self.s.pods[p].req
    }

    /// What a lifted pod's new node must satisfy: the requirements its placement kept
    /// (preferences included unless the placement pass had to relax them).
    pub(crate) fn kept_requirements(&self, p: PodId) -> NodeRequirements {
        let pod = &self.s.pods[p];
        pod.kept_requirements
            .clone()
            .unwrap_or_else(|| pod.info.node_requirements.clone())
    }

    /// Whether every pending pod the placement pass did not give up on is on a node.
    pub(crate) fn all_placed(&self) -> bool {
        self.pending_pods()
            .filter(|&p| !self.s.unschedulable.iter().any(|(u, _)| *u == p))
            .all(|p| self.s.pods[p].node.is_some())
    }

    /// The nodes planned in this pass and not retired, in plan order.
    pub(crate) fn planned_nodes(&self) -> Vec<NodeId> {
        self.s
            .nodes
            .enumerate()
            .filter(|(_, node)| node.is_planned_node())
            .map(|(n, _)| n)
            .collect()
    }

    /// Whether node `n` holds no pod.
    pub(crate) fn is_empty(&self, n: NodeId) -> bool {
        self.s.nodes[n].pods.is_empty()
    }

    /// Whether node `n` is planned in this pass, not retired, and holds a pod.
    pub(crate) fn is_kept(&self, n: NodeId) -> bool {
        self.s.nodes[n].is_planned_node() && !self.s.nodes[n].pods.is_empty()
    }

    /// Gives back an emptied planned node to its pool.
    pub(crate) fn retire(&mut self, n: NodeId) {
        self.s.retire(n);
    }

    /// Recomputes a planned node's candidate types after pods left or joined it: its
    /// cheapest fitting type and the capacity it counts against the pool's limits.
    pub(crate) fn reprice(&mut self, n: NodeId) {
        self.s.rebuild_options(n);
    }

    /// The type (index into its pool's types), price and whether the price is an estimate
    /// of planned node `n`: its cheapest option that holds its pods.
    pub(crate) fn cheapest_type(&self, n: NodeId) -> Option<(TypeId, f64, bool)> {
        self.s.chosen_type(n)
    }

    /// Narrows a planned node's room to one type's allocatable (kept nodes take lifted
    /// pods without changing their type); [`Planning::reprice`] lifts the limit.
    pub(crate) fn limit_to_type(&mut self, n: NodeId, t: TypeId) {
        let s = &mut *self.s;
        if let NodeKind::Planned { pool, .. } = s.nodes[n].kind {
            s.nodes[n].cap_upper = s.pools[pool].types[t].alloc;
            s.reindex(n);
        }
    }

    /// The first open node after `after` (from the first node if `None`) with `need` free.
    pub(crate) fn first_fit(&self, need: ResV, after: Option<NodeId>) -> Option<NodeId> {
        let from = after.map_or(0, |n| n.index() + 1);
        let query = Query {
            need,
            avoid_present: 0,
            avoid_owners: 0,
        };
        self.s.index.first(from, &query).map(NodeId::new)
    }

    /// Whether lifted pod `p` may join kept planned node `n` of type `t`: it tolerates the
    /// node's taints and one of its kept requirement terms is compatible with the node and
    /// the type. On success the node's requirements narrow to that term.
    pub(crate) fn admit(&mut self, p: PodId, n: NodeId, t: TypeId) -> bool {
        let s = &mut *self.s;
        let NodeKind::Planned { pool, .. } = s.nodes[n].kind else {
            return false;
        };
        let pod = &s.pods[p];
        if taints::untolerated(&s.nodes[n].taints, &pod.info.tolerations, true).is_some() {
            return false;
        }
        let kept = self.kept_requirements(p);
        let s = &mut *self.s;
        let alts = kept.alternatives();
        if alts.iter().all(|a| a.is_empty()) {
            return true;
        }
        let it = &s.input.pools[pool.index()].instance_types[s.pools[pool].types[t].index];
        let node_reqs = s.nodes[n].requirements.clone();
        for a in alts {
            if a.compatible_allowing(&node_reqs, &labels::is_well_known)
                .is_ok()
            {
                let narrowed = node_reqs.intersect(a);
                if it.requirements.intersects(&narrowed).is_ok() {
                    s.nodes[n].requirements = std::sync::Arc::new(narrowed);
                    return true;
                }
            }
        }
        false
    }

    /// Opens an empty planned node of pool `pi` with requirements `base`, in `zone` and
    /// capacity type `ct`, counted as type `t` (index into the pool's types) against the
    /// pool's limits; `None` when the pool's node or resource limits refuse it.
    pub(crate) fn open_node(
        &mut self,
        pi: PoolId,
        base: &Requirements,
        zone: &str,
        ct: CapacityType,
        t: TypeId,
    ) -> Option<NodeId> {
        let s = &mut *self.s;
        let capacity = s.pools[pi].types[t].capacity;
        let state = &mut s.pools[pi];
        if state.nodes_remaining <= 0
            || (0..R).any(|i| state.remaining[i] != i64::MAX && capacity[i] > state.remaining[i])
        {
            return None;
        }
        state.counter += 1;
        state.nodes_remaining -= 1;
        *state.planned_per_zone.entry(zone.to_string()).or_default() += 1;
        let pool = &s.input.pools[pi.index()];
        let name = format!("{}{}-{}", s.options.name_prefix, pool.name, state.counter);
        let requirements = base
            .clone()
            .with(Requirement::one_of(labels::ZONE, [zone.to_string()]))
            .with(Requirement::one_of(
                labels::CAPACITY_TYPE,
                [ct.as_str().to_string()],
            ))
            .with(Requirement::one_of(labels::NODE_POOL, [pool.name.clone()]));
        let slot = s.slot_for(pi, requirements, zone, ct);
        Some(s.push_planned(pi, name, &slot))
    }

    /// Whether planned node `n`'s types that hold its pods span its pool's `minValues`.
    pub(crate) fn meets_min_values(&self, n: NodeId) -> bool {
        let node = &self.s.nodes[n];
        let NodeKind::Planned { pool, .. } = node.kind else {
            return true;
        };
        self.s
            .min_values_ok(pool, &node.options.types[node.pos..], &node.used)
            .is_ok()
    }

    /// How many nodes of pool `pi` are planned in `zone`.
    pub(crate) fn planned_in_zone(&self, pi: PoolId, zone: &str) -> usize {
        self.s.pools[pi]
            .planned_per_zone
            .get(zone)
            .copied()
            .unwrap_or(0)
    }

    /// NodePool `pi` as the input gives it.
    pub(crate) fn pool(&self, pi: PoolId) -> &Pool {
        &self.s.input.pools[pi.index()]
    }

    /// The instance types pool `pi` can make (DaemonSets fit on them) whose labels admit
    /// `requirements`, each with its index among the pool's types, its catalog entry and
    /// its room for pods (allocatable less DaemonSet overhead).
    pub(crate) fn pool_types_admitting(
        &self,
        pi: PoolId,
        requirements: &Requirements,
    ) -> Vec<(TypeId, &InstanceType, ResV)> {
        let pool = &self.s.input.pools[pi.index()];
        let types = &self.s.pools[pi].types;
        self.s
            .compatible_types(pi, requirements)
            .iter()
            .map(|&t| (t, &pool.instance_types[types[t].index], types[t].alloc))
            .collect()
    }

    /// The catalog entry of type `t` (index among pool `pi`'s types).
    pub(crate) fn instance_type(&self, pi: PoolId, t: TypeId) -> &InstanceType {
        &self.s.input.pools[pi.index()].instance_types[self.s.pools[pi].types[t].index]
    }
}
