//! Cluster state as decisions see it: a consistent snapshot of the objects that matter
//! for scheduling, right-sizing and disruption.
//!
//! A [`Snapshot`] can come from YAML files (what `kubectl get -o yaml` writes, or a
//! hand-written scenario) and, in a cluster, from reflector stores.

pub mod cluster;
pub mod snapshot;

pub use snapshot::{MAX_PODS_PER_SNAPSHOT, MAX_YAML_DEPTH, PendingPods, Snapshot, SnapshotError};
