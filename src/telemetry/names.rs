//! Every metric name, label key and histogram bucket boundary Tailor exports, in one
//! place. Dashboards and alert rules refer to these names; change them only with them.

/// Build information; value 1, labelled with the version.
pub const BUILD_INFO: &str = "tailor_build_info";
/// Seconds from a pod becoming pending to its NodeClaim being launched (histogram).
pub const PROVISIONING_DURATION: &str = "tailor_provisioning_duration_seconds";
/// NodeClaims launched (counter).
pub const NODECLAIMS_LAUNCHED: &str = "tailor_nodeclaims_launched";
/// NodeClaims deleted, by reason (counter).
pub const NODECLAIMS_TERMINATED: &str = "tailor_nodeclaims_terminated";
/// Failed cloud calls, by operation and error kind (counter).
pub const CLOUD_ERRORS: &str = "tailor_cloud_errors";
/// USD per hour of the nodes Tailor manages, by NodePool, type and capacity type (gauge).
pub const NODE_HOURLY_COST: &str = "tailor_node_hourly_cost_dollars";
/// Seconds a pure decision (scheduling simulation, consolidation, recommendation) took
/// (histogram).
pub const DECISION_DURATION: &str = "tailor_decision_duration_seconds";
/// Objects in the last cluster snapshot, by kind (gauge).
pub const SNAPSHOT_OBJECTS: &str = "tailor_snapshot_objects";
/// Instance types the catalog offers, by capacity type (gauge).
pub const CATALOG_INSTANCE_TYPES: &str = "tailor_catalog_instance_types";

/// Pods evicted while draining nodes (counter).
pub const EVICTIONS: &str = "tailor_evictions";
/// 1 while this replica holds the leader lease (gauge).
pub const LEADER: &str = "tailor_leader";

/// Disruption decisions, by method and mode (counter).
pub const DISRUPTION_DECISIONS: &str = "tailor_disruption_decisions";

/// Offerings cached as unavailable after a capacity error (gauge).
pub const UNAVAILABLE_OFFERINGS: &str = "tailor_unavailable_offerings";

/// Label keys. Values are always bounded sets (no pod names, no free text).
pub mod label {
    /// Tailor version.
    pub const VERSION: &str = "version";
    /// NodePool name.
    pub const NODEPOOL: &str = "nodepool";
    /// VM size.
    pub const INSTANCE_TYPE: &str = "instance_type";
    /// `spot` or `on-demand`.
    pub const CAPACITY_TYPE: &str = "capacity_type";
    /// Zone label value.
    pub const ZONE: &str = "zone";
    /// Cloud operation (`create`, `delete`, `get`, `list`, `instance_types`).
    pub const OPERATION: &str = "operation";
    /// Error kind from `CloudError::kind`.
    pub const ERROR_KIND: &str = "kind";
    /// Decision name (`scheduling`, `consolidation`, `rightsizing`).
    pub const DECISION: &str = "decision";
    /// Kubernetes kind.
    pub const KIND: &str = "kind";
    /// Disruption method (`empty`, `drift`, `multi`, `single`, `expiration`).
    pub const METHOD: &str = "method";
    /// `recommend` or `autonomous`.
    pub const MODE: &str = "mode";
    /// Why a NodeClaim went away (`empty`, `underutilized`, `drifted`, `expired`, `interrupted`).
    pub const REASON: &str = "reason";
}

/// Bucket boundaries for provisioning latency: VM launches take tens of seconds to a few
/// minutes, and batching adds up to ten seconds.
pub const PROVISIONING_BUCKETS: &[f64] = &[
    1.0, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0,
];

/// Bucket boundaries for decision time: the target is well under a second for 20k pods.
pub const DECISION_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
