//! Cluster state as decisions see it: a consistent snapshot of the objects that matter
//! for scheduling, right-sizing and disruption.
//!
//! A [`Snapshot`] can come from YAML files (what `kubectl get -o yaml` writes, or a
//! hand-written scenario) and, in a cluster, from reflector stores.

pub mod cluster;
pub mod snapshot;

pub use snapshot::{MAX_PODS_PER_SNAPSHOT, MAX_YAML_DEPTH, PendingPods, Snapshot, SnapshotError};

/// Keeps of a pod's volumes only the claims it names (volume name and claim name): where
/// its disks are decides where it may run; every other volume source is dropped, as no
/// decision reads it.
pub fn keep_claim_volumes(spec: &mut k8s_openapi::api::core::v1::PodSpec) {
    use k8s_openapi::api::core::v1::Volume;
    spec.volumes = spec.volumes.take().and_then(|volumes| {
        let kept: Vec<Volume> = volumes
            .into_iter()
            .filter(|v| v.persistent_volume_claim.is_some())
            .map(|v| Volume {
                name: v.name,
                persistent_volume_claim: v.persistent_volume_claim,
                ..Volume::default()
            })
            .collect();
        (!kept.is_empty()).then_some(kept)
    });
}
