//! The plan a pass's final state describes: what landed on existing nodes, each planned
//! node with its cheapest type, price, alternatives and labels, and what could not land.

use std::collections::BTreeMap;

use super::Scheduler;
use super::nodes::NodeKind;
use super::resources::{add, fits};
use crate::apis::labels;
use crate::model::quantity::{format_milli, format_value};
use crate::scheduling::ids::Id;
use crate::scheduling::plan::{
    CpuMemory, ExistingPlacement, Plan, PlannedNodeClaim, Summary, Unschedulable,
};
use crate::scheduling::taints;

impl Scheduler<'_> {
    /// The plan this pass's state describes: placements on existing nodes, the planned
    /// nodes (numbered per pool in plan order) and the pods that could not land.
    pub(crate) fn plan(&self) -> Plan {
        let pending = self.input.pending.len();
        let mut node_claims = Vec::new();
        let mut on_existing: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut scheduled_on_new = 0;
        for (n, node) in self.nodes.enumerate() {
            let mine: Vec<String> = {
                let mut v: Vec<String> = node
                    .pods
                    .iter()
                    .filter(|&&p| p.index() < pending)
                    .map(|&p| self.pods[p].info.key.clone())
                    .collect();
                v.sort();
                v
            };
            match &node.kind {
                NodeKind::Existing => {
                    if !mine.is_empty() {
                        on_existing.insert(node.name.clone(), mine);
                    }
                }
                NodeKind::Planned {
                    pool,
                    zone,
                    capacity_type,
                } => {
                    if node.retired || node.pods.is_empty() {
                        continue;
                    }
                    let Some((t, price, estimate)) = self.chosen_type(n) else {
                        continue;
                    };
                    let pool_in = &self.input.pools[pool.index()];
                    let ti = &self.pools[*pool].types[t];
                    let it = &pool_in.instance_types[ti.index];
                    let requests = add(&node.used, &ti.overhead);
                    let alloc = &it.allocatable;
                    let share = |used: i64, cap: i64| {
                        if cap > 0 {
                            used as f64 / cap as f64
                        } else {
                            0.0
                        }
                    };
                    let alternatives: Vec<String> = node
                        .options
                        .types
                        .iter()
                        .map(|&o| &self.pools[*pool].types[o])
                        .filter(|o| o.index != ti.index && fits(&node.used, &o.alloc))
                        .take(5)
                        .map(|o| pool_in.instance_types[o.index].name.clone())
                        .collect();
                    let mut node_labels = (*node.labels).clone();
                    node_labels.extend(it.labels());
                    node_labels.insert(labels::ZONE.to_string(), zone.clone());
                    node_labels.insert(
                        labels::CAPACITY_TYPE.to_string(),
                        capacity_type.as_str().to_string(),
                    );
                    scheduled_on_new += mine.len();
                    node_claims.push(PlannedNodeClaim {
                        name: node.name.clone(),
                        node_pool: pool_in.name.clone(),
                        instance_type: it.name.clone(),
                        zone: zone.clone(),
                        capacity_type: *capacity_type,
                        price_per_hour: price,
                        price_is_estimate: estimate,
                        pods: mine,
                        daemon_sets: ti
                            .daemon_sets
                            .iter()
                            .map(|&d| self.input.daemon_sets[d].key.clone())
                            .collect(),
                        requests: CpuMemory {
                            cpu: format_milli(requests[0]),
                            memory: format_value(requests[1]),
                        },
                        allocatable: CpuMemory {
                            cpu: format_milli(alloc.cpu),
                            memory: format_value(alloc.memory),
                        },
                        cpu_utilisation: share(requests[0], alloc.cpu),
                        memory_utilisation: share(requests[1], alloc.memory),
                        alternatives,
                        startup_taints: pool_in
                            .startup_taints
                            .iter()
                            .map(taints::describe)
                            .collect(),
                        labels: node_labels,
                    });
                }
            }
        }
        // Number new nodes per pool in plan order, so names do not depend on how many
        // intermediate nodes the packer discarded.
        let mut per_pool: BTreeMap<String, usize> = BTreeMap::new();
        for c in &mut node_claims {
            let k = per_pool.entry(c.node_pool.clone()).or_default();
            *k += 1;
            let name = format!("{}{}-{}", self.options.name_prefix, c.node_pool, k);
            c.labels.insert(labels::HOSTNAME.to_string(), name.clone());
            c.name = name;
        }
        let mut unschedulable: Vec<Unschedulable> = self
            .unschedulable
            .iter()
            .map(|(p, reason)| Unschedulable {
                pod: self.pods[*p].info.key.clone(),
                reason: reason.clone(),
            })
            .collect();
        unschedulable.sort_by(|a, b| a.pod.cmp(&b.pod));
        let scheduled_on_existing = on_existing.values().map(Vec::len).sum();
        let hourly_cost = node_claims.iter().map(|c| c.price_per_hour).sum::<f64>();
        Plan {
            summary: Summary {
                pods: pending,
                new_nodes: node_claims.len(),
                hourly_cost: crate::model::quantity::round_to(hourly_cost, 6),
                scheduled_on_existing,
                scheduled_on_new,
                unschedulable: unschedulable.len(),
            },
            node_claims,
            existing_nodes: on_existing
                .into_iter()
                .map(|(node, pods)| ExistingPlacement { node, pods })
                .collect(),
            unschedulable,
        }
    }
}
