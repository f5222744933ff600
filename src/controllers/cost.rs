//! What the managed nodes cost: every few seconds, the Nodes Tailor manages (those labelled
//! with a NodePool) are counted and priced from the catalog by size, zone and capacity type,
//! for the cost metrics and dashboards. Reads only; runs on every replica.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use super::Context;
use crate::apis::labels;
use crate::cloud::CloudProvider;
use crate::model::{CapacityType, InstanceType};

/// How often the cost is recomputed.
const INTERVAL: Duration = Duration::from_secs(15);

/// (NodePool, instance type, capacity type, zone).
type Group = (String, String, String, String);

/// Counts and prices `nodes` by group; a node whose offering is not in the catalog counts
/// with no price.
pub fn cost_by_group<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    types: &[InstanceType],
) -> BTreeMap<Group, (usize, f64)> {
    let mut groups: BTreeMap<Group, (usize, f64)> = BTreeMap::new();
    for node in nodes {
        let l = node.labels();
        let Some(pool) = l.get(labels::NODE_POOL) else {
            continue;
        };
        let get = |k: &str| l.get(k).cloned().unwrap_or_default();
        let (size, capacity, zone) = (
            get(labels::INSTANCE_TYPE),
            get(labels::CAPACITY_TYPE),
            get(labels::ZONE),
        );
        let price = CapacityType::parse(&capacity)
            .and_then(|c| {
                types
                    .iter()
                    .find(|t| t.name == size)?
                    .offerings
                    .iter()
                    .find(|o| o.zone == zone && o.capacity_type == c)
            })
            .map_or(0.0, |o| o.price_per_hour);
        let e = groups
            .entry((pool.clone(), size, capacity, zone))
            .or_default();
        e.0 += 1;
        e.1 += price;
    }
    groups
}

/// Keeps the node cost and count metrics up to date until aborted.
pub async fn run<C: CloudProvider + 'static>(ctx: Arc<Context<C>>) {
    ctx.state.wait_synced().await;
    let mut reported: BTreeSet<Group> = BTreeSet::new();
    let mut last: Option<BTreeMap<Group, (usize, f64)>> = None;
    loop {
        // The catalog is read every pass: a live catalog refreshes its prices.
        let types = ctx
            .catalog
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .shared_instance_types(&ctx.catalog_options);
        let types = match types {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "no catalog to price nodes with; cost metrics not updated");
                tokio::time::sleep(INTERVAL).await;
                continue;
            }
        };
        let nodes = ctx.state.nodes.state();
        let groups = cost_by_group(nodes.iter().map(|n| n.as_ref()), &types);
        drop(nodes);
        // The gauges keep what they were last set to: a pass that finds the same groups at
        // the same cost has nothing to set.
        if last.as_ref() != Some(&groups) {
            // Groups gone since the last pass drop to zero rather than keep their last value.
            for (pool, size, capacity, zone) in reported.iter().filter(|g| !groups.contains_key(*g))
            {
                ctx.metrics.set_node_cost(pool, size, capacity, zone, 0.0);
                ctx.metrics.set_nodes(pool, size, capacity, zone, 0);
            }
            for ((pool, size, capacity, zone), (count, cost)) in &groups {
                ctx.metrics.set_node_cost(pool, size, capacity, zone, *cost);
                ctx.metrics.set_nodes(pool, size, capacity, zone, *count);
            }
            reported = groups.keys().cloned().collect();
            last = Some(groups);
        }
        tokio::time::sleep(INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{Catalog, CatalogOptions};

    fn node(name: &str, labels: &[(&str, &str)]) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.to_string());
        n.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        n
    }

    #[test]
    fn managed_nodes_are_counted_and_priced_by_group_and_others_ignored() {
        let types = Catalog::builtin()
            .expect("catalog")
            .instance_types(&CatalogOptions::for_region("eastus"))
            .expect("types");
        let d4 = types
            .iter()
            .find(|t| t.name == "Standard_D4s_v5")
            .expect("D4s_v5 in the catalog");
        let price = d4
            .offerings
            .iter()
            .find(|o| o.zone == "eastus-1" && o.capacity_type == CapacityType::OnDemand)
            .expect("offering")
            .price_per_hour;
        let managed = [
            (labels::NODE_POOL, "default"),
            (labels::INSTANCE_TYPE, "Standard_D4s_v5"),
            (labels::CAPACITY_TYPE, "on-demand"),
            (labels::ZONE, "eastus-1"),
        ];
        let nodes = [
            node("a", &managed),
            node("b", &managed),
            node("system", &[(labels::INSTANCE_TYPE, "Standard_D4s_v5")]),
        ];
        let groups = cost_by_group(&nodes, &types);
        assert_eq!(groups.len(), 1, "{groups:?}");
        let (count, cost) = groups.values().next().copied().expect("a group");
        assert_eq!(count, 2);
        assert!((cost - 2.0 * price).abs() < 1e-9, "{cost} vs 2 x {price}");
    }
}
