//! The operations the cost-aware packer uses on the planning state.

use super::Scheduler;
use super::nodes::{Node, NodeKind};
use super::resources::ResV;
use super::templates::PoolState;
use super::topology::{Group, Interner};
use crate::scheduling::index::{NodeIndex, Query};

/// The mutable state of a pass, saved so the packer can undo a worse result.
pub(crate) struct Checkpoint {
    pub(super) nodes: Vec<Node>,
    pub(super) groups: Vec<Group>,
    pub(super) pools: Vec<PoolState>,
    pub(super) domains: Vec<Interner>,
    pub(super) pod_nodes: Vec<Option<usize>>,
    pub(super) index: NodeIndex,
}

impl Scheduler<'_> {
    /// Saves the mutable state of the pass.
    pub(crate) fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            nodes: self.nodes.clone(),
            groups: self.groups.clone(),
            pools: self.pools.clone(),
            domains: self.domains.clone(),
            pod_nodes: self.pods.iter().map(|p| p.node).collect(),
            index: self.index.clone(),
        }
    }

    /// Restores a saved state.
    pub(crate) fn restore(&mut self, c: Checkpoint) {
        self.nodes = c.nodes;
        self.groups = c.groups;
        self.pools = c.pools;
        self.domains = c.domains;
        self.index = c.index;
        for (p, n) in self.pods.iter_mut().zip(c.pod_nodes) {
            p.node = n;
        }
    }

    /// Narrows a planned node's room to one type's allocatable (the packer fills kept
    /// nodes without changing their type); `rebuild_options` restores it.
    pub(crate) fn limit_to_type(&mut self, n: usize, t: usize) {
        if let NodeKind::Planned { pool, .. } = self.nodes[n].kind {
            self.nodes[n].cap_upper = self.pools[pool].types[t].alloc;
            self.reindex(n);
        }
    }

    /// The first open node from `from` on with `need` free.
    pub(crate) fn first_fit(&self, from: usize, need: ResV) -> Option<usize> {
        self.index.first(
            from,
            &Query {
                need,
                avoid_present: 0,
                avoid_owners: 0,
            },
        )
    }
}
