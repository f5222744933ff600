//! The nodes of a plan, existing and planned: how they are made, their room (the
//! first-fit index over it), a planned node's candidate types and cheapest fitting type,
//! and giving an emptied planned node back to its pool.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Taint;

use super::Scheduler;
use super::resources::{R, ResV, fits, sub};
use super::templates::{OptionList, Slot};
use crate::apis::labels;
use crate::model::{CapacityType, Requirements};
use crate::scheduling::ids::{Id, NodeId, PodId, PoolId, TypeId};
use crate::scheduling::input::ExistingNode;
use crate::scheduling::pod::HostPort;

/// Whether a node exists or is planned in this pass (with its pool, zone and capacity type).
#[derive(Debug, Clone)]
pub(super) enum NodeKind {
    Existing,
    Planned {
        pool: PoolId,
        zone: String,
        capacity_type: CapacityType,
    },
}

/// A node of the pass, existing or planned.
#[derive(Debug, Clone)]
pub(super) struct Node {
    pub(super) name: String,
    pub(super) kind: NodeKind,
    /// Labels (planned nodes: without the hostname, which is the node's name). Shared
    /// between nodes made from the same template.
    pub(super) labels: Arc<BTreeMap<String, String>>,
    pub(super) requirements: Arc<Requirements>,
    pub(super) taints: Vec<Taint>,
    /// Requests of its pods (and, for planned nodes, not the DaemonSet overhead, which
    /// each instance type's `alloc` already subtracts).
    pub(super) used: ResV,
    /// Existing: allocatable. Planned: per-dimension maximum over the types still open.
    pub(super) cap_upper: ResV,
    /// Planned: indices into the pool's `types`, cheapest first for this zone and capacity
    /// type (shared between nodes with the same requirements).
    pub(super) options: Rc<OptionList>,
    /// Planned: position in `options` of the cheapest type that holds `used`.
    pub(super) pos: usize,
    pub(super) pods: Vec<PodId>,
    pub(super) host_ports: Vec<HostPort>,
    /// Domain per topology key in use.
    pub(super) domains: Vec<Option<u32>>,
    /// Planned: capacity counted against the pool's limits.
    pub(super) reserved: ResV,
    /// Existing: `spec.unschedulable`.
    pub(super) cordoned: bool,
    /// Planned: emptied by the packer and given back.
    pub(super) retired: bool,
    /// Hostname-keyed groups with a matching pod here (bit per group).
    pub(super) present_mask: u64,
    /// Hostname-keyed groups with a pod owning the anti-affinity term here.
    pub(super) owner_mask: u64,
}

impl Node {
    pub(super) fn is_planned(&self) -> bool {
        matches!(self.kind, NodeKind::Planned { .. })
    }

    /// Whether this is a node planned in this pass (and not retired by the packer).
    pub(super) fn is_planned_node(&self) -> bool {
        self.is_planned() && !self.retired
    }
}

pub(super) fn canonical_labels(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut out = labels.clone();
    for (k, v) in labels {
        let c = labels::canonical_key(k);
        if c != k {
            out.entry(c.to_string()).or_insert_with(|| v.clone());
        }
    }
    out
}

impl Scheduler<'_> {
    pub(super) fn existing_node(&mut self, n: &ExistingNode) -> Node {
        let (labels, requirements) = n.derived.get_or_derive(&n.labels, |l| {
            let labels = canonical_labels(l);
            let requirements = Requirements::from_labels(&labels);
            (labels, requirements)
        });
        let alloc = self.dims.vec(&n.allocatable).unwrap_or([0; R]);
        let mut node = Node {
            name: n.name.clone(),
            kind: NodeKind::Existing,
            requirements,
            labels,
            taints: n.taints.clone(),
            used: [0; R],
            cap_upper: alloc,
            options: Rc::default(),
            pos: 0,
            pods: Vec::new(),
            host_ports: Vec::new(),
            domains: Vec::new(),
            reserved: [0; R],
            cordoned: n.unschedulable,
            retired: false,
            present_mask: 0,
            owner_mask: 0,
        };
        node.domains = self.node_domains(&node);
        node
    }

    /// Appends an empty planned node with the given requirements; its options are every
    /// compatible type offered in its zone and capacity type, cheapest first.
    pub(super) fn push_planned(&mut self, pi: PoolId, name: String, slot: &Slot) -> NodeId {
        let pool = &self.input.pools[pi.index()];
        let mut node = Node {
            name,
            kind: NodeKind::Planned {
                pool: pi,
                zone: slot.zone.clone(),
                capacity_type: slot.capacity_type,
            },
            labels: slot.labels.clone(),
            requirements: slot.requirements.clone(),
            taints: pool.taints.clone(),
            used: [0; R],
            cap_upper: slot.options.upper(0),
            options: slot.options.clone(),
            pos: 0,
            pods: Vec::new(),
            host_ports: Vec::new(),
            domains: Vec::new(),
            reserved: [0; R],
            cordoned: false,
            retired: false,
            present_mask: 0,
            owner_mask: 0,
        };
        node.domains = self.node_domains(&node);
        let n = self.nodes.push(node);
        self.reindex(n);
        n
    }

    /// Updates node `n` in the first-fit index.
    pub(super) fn reindex(&mut self, n: NodeId) {
        let node = &self.nodes[n];
        let open = !node.retired && !node.cordoned;
        let value = open.then(|| {
            (
                sub(&node.cap_upper, &node.used),
                node.present_mask,
                node.owner_mask,
            )
        });
        self.index.set(n.index(), value);
    }

    /// Recomputes a planned node's per-dimension upper bound over the types from its
    /// cheapest fitting one on (cheaper types that cannot hold its pods never will).
    pub(super) fn refresh_upper(&mut self, n: NodeId) {
        let node = &mut self.nodes[n];
        if node.is_planned() {
            node.cap_upper = node.options.upper(node.pos);
        }
        self.reindex(n);
    }

    /// Recomputes a planned node's options from its pool (after pods left it), its
    /// cheapest fitting type and the capacity it counts against the pool's limits. An
    /// empty node is retired and its node count given back.
    pub(super) fn rebuild_options(&mut self, n: NodeId) {
        let NodeKind::Planned {
            pool,
            ref zone,
            capacity_type,
        } = self.nodes[n].kind
        else {
            return;
        };
        let zone = zone.clone();
        let options = self.option_list(pool, &self.nodes[n].requirements, &zone, capacity_type);
        let types = &self.pools[pool].types;
        let node = &self.nodes[n];
        let pos = options
            .types
            .iter()
            .position(|&t| fits(&node.used, &types[t].alloc))
            .unwrap_or(options.types.len());
        let reserved = if node.pods.is_empty() {
            [0; R]
        } else {
            options
                .types
                .get(pos)
                .map_or(node.reserved, |&t| types[t].capacity)
        };
        let delta = sub(&reserved, &node.reserved);
        self.pools[pool].charge(&delta);
        let node = &mut self.nodes[n];
        node.reserved = reserved;
        node.options = options;
        node.pos = pos;
        self.refresh_upper(n);
    }

    /// Gives back an emptied planned node.
    pub(super) fn retire(&mut self, n: NodeId) {
        let NodeKind::Planned { pool, ref zone, .. } = self.nodes[n].kind else {
            return;
        };
        if self.nodes[n].retired || !self.nodes[n].pods.is_empty() {
            return;
        }
        let zone = zone.clone();
        let reserved = self.nodes[n].reserved;
        let state = &mut self.pools[pool];
        state.nodes_remaining += 1;
        if let Some(c) = state.planned_per_zone.get_mut(&zone) {
            *c = c.saturating_sub(1);
        }
        state.charge(&reserved.map(|v| -v));
        let node = &mut self.nodes[n];
        node.reserved = [0; R];
        node.retired = true;
        node.options = Rc::default();
        node.cap_upper = [0; R];
        self.reindex(n);
    }

    /// The price and instance type index chosen for a planned node: its cheapest option
    /// that holds its pods.
    pub(super) fn chosen_type(&self, n: NodeId) -> Option<(TypeId, f64, bool)> {
        let node = &self.nodes[n];
        let NodeKind::Planned {
            pool,
            ref zone,
            capacity_type,
        } = node.kind
        else {
            return None;
        };
        let types = &self.pools[pool].types;
        let its = &self.input.pools[pool.index()].instance_types;
        node.options.types[node.pos.min(node.options.types.len())..]
            .iter()
            .find(|&&t| fits(&node.used, &types[t].alloc))
            .and_then(|&t| {
                let it = &its[types[t].index];
                it.offerings
                    .iter()
                    .find(|o| o.zone == *zone && o.capacity_type == capacity_type)
                    .map(|o| (t, o.price_per_hour, o.price_is_estimate))
            })
    }
}
