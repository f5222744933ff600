//! The scheduler's answer: new NodeClaims with their pods and prices, placements on existing
//! nodes, and pods that cannot land with the reason.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::model::CapacityType;

/// A quantity pair for display and JSON.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CpuMemory {
    /// CPU as a Kubernetes quantity.
    pub cpu: String,
    /// Memory as a Kubernetes quantity.
    pub memory: String,
}

/// A node to buy.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedNodeClaim {
    /// A name for the claim (`<nodepool>-<n>`).
    pub name: String,
    /// The NodePool it belongs to.
    pub node_pool: String,
    /// The VM size chosen.
    pub instance_type: String,
    /// Zone.
    pub zone: String,
    /// Spot or on-demand.
    pub capacity_type: CapacityType,
    /// USD per hour.
    pub price_per_hour: f64,
    /// Whether the price is an estimate (spot).
    pub price_is_estimate: bool,
    /// Pods placed on it (`namespace/name`).
    pub pods: Vec<String>,
    /// DaemonSets whose pods will run on it.
    pub daemon_sets: Vec<String>,
    /// Sum of the pods' requests (DaemonSets included).
    pub requests: CpuMemory,
    /// The instance type's allocatable.
    pub allocatable: CpuMemory,
    /// Requested share of allocatable CPU (0..1).
    pub cpu_utilisation: f64,
    /// Requested share of allocatable memory (0..1).
    pub memory_utilisation: f64,
    /// Other instance types that would also hold these pods, cheapest first (what a launch
    /// may fall back to on a capacity error).
    pub alternatives: Vec<String>,
    /// Taints present while the node starts.
    pub startup_taints: Vec<String>,
    /// The labels the node will carry.
    pub labels: BTreeMap<String, String>,
}

/// Pods placed on one existing node.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExistingPlacement {
    /// Node name.
    pub node: String,
    /// Pods placed there.
    pub pods: Vec<String>,
}

/// A pod that cannot be placed.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Unschedulable {
    /// `namespace/name`.
    pub pod: String,
    /// Why, in words a user can act on.
    pub reason: String,
}

/// Totals.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Pending pods considered.
    pub pods: usize,
    /// New nodes to buy.
    pub new_nodes: usize,
    /// USD per hour of the new nodes.
    pub hourly_cost: f64,
    /// Pods placed on existing nodes.
    pub scheduled_on_existing: usize,
    /// Pods placed on new nodes.
    pub scheduled_on_new: usize,
    /// Pods that cannot be placed.
    pub unschedulable: usize,
}

/// The whole plan.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// New nodes, in creation order.
    pub node_claims: Vec<PlannedNodeClaim>,
    /// Placements on existing nodes.
    pub existing_nodes: Vec<ExistingPlacement>,
    /// Pods that cannot land.
    pub unschedulable: Vec<Unschedulable>,
    /// Totals.
    pub summary: Summary,
}
