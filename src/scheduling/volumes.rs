//! Where a pod's persistent volumes let it run: the zone of each bound zonal
//! PersistentVolume (its `nodeAffinity`, as kube-scheduler's VolumeZone and VolumeBinding
//! read it) and, for a claim not yet bound under a `WaitForFirstConsumer` StorageClass, the
//! class's `allowedTopologies`. The zones become a required node-affinity expression on the
//! pod's spec, so the scheduler, the packer and the plan validator all see them as written
//! constraints. A claim, volume or class the pod names but the cluster lacks is an error on
//! that pod's field: kube-scheduler would never place it, and no node is bought for it.
//!
//! Azure Disks also count against a node's data-disk limit: each claim backed by the Azure
//! Disk driver requests one [`DISK_ATTACHMENTS`], and each node allows its size's maximum
//! data-disk count ([`max_data_disks`]), as the CSI driver's attach limit does. Pure.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PersistentVolume, PersistentVolumeClaim, Pod,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::pod::PodError;
use crate::apis::labels;

/// The label keys a volume's zone is written under: the well-known one, its deprecated
/// predecessor, and the Azure Disk CSI driver's (its values are the node zone's, `eastus-1`).
pub const ZONE_KEYS: [&str; 3] = [
    labels::ZONE,
    "failure-domain.beta.kubernetes.io/zone",
    "topology.disk.csi.azure.com/zone",
];

/// The extended resource planning counts Azure Disk attachments in: a pod requests one per
/// claim the Azure Disk driver backs, a node allows [`max_data_disks`].
pub const DISK_ATTACHMENTS: &str = "tailor.sh/azure-disk-attachments";

/// The Azure Disk provisioners and drivers (the CSI driver and the in-tree plugin's name).
const DISK_DRIVERS: [&str; 2] = ["disk.csi.azure.com", "kubernetes.io/azure-disk"];

/// How many data disks a VM size attaches at most. Azure's published limits for the D, E and
/// F sizes up to 64 vCPUs are two per vCPU, at most 32 (a 2-vCPU size: 4; 16 vCPUs and up:
/// 32), and 64 for the larger sizes; the full catalog's `max_data_disks` capability agrees
/// for every size it gives it for in those families.
pub fn max_data_disks(vcpus: u32) -> i64 {
    if vcpus > 64 {
        64
    } else {
        (2 * i64::from(vcpus)).min(32)
    }
}

/// The annotation marking the cluster's default StorageClass.
const DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";

/// The cluster's claims, volumes and classes, indexed for [`VolumeTopology::constrain`].
pub struct VolumeTopology<'a> {
    claims: BTreeMap<(&'a str, &'a str), &'a PersistentVolumeClaim>,
    volumes: BTreeMap<&'a str, &'a PersistentVolume>,
    classes: BTreeMap<&'a str, &'a StorageClass>,
    default_class: Option<&'a StorageClass>,
}

impl<'a> VolumeTopology<'a> {
    /// Indexes the objects.
    pub fn new(
        claims: &'a [PersistentVolumeClaim],
        volumes: &'a [PersistentVolume],
        classes: &'a [StorageClass],
    ) -> Self {
        let name = |m: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            m.name.as_deref().unwrap_or_default()
        };
        VolumeTopology {
            claims: claims
                .iter()
                .map(|c| {
                    let ns = c.metadata.namespace.as_deref().unwrap_or("default");
                    ((ns, name(&c.metadata)), c)
                })
                .collect(),
            volumes: volumes.iter().map(|v| (name(&v.metadata), v)).collect(),
            classes: classes.iter().map(|c| (name(&c.metadata), c)).collect(),
            default_class: classes.iter().find(|c| {
                c.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(DEFAULT_CLASS))
                    .is_some_and(|v| v == "true")
            }),
        }
    }

    /// The zones `pod`'s volumes allow (`None`: no volume restricts it), or the error of the
    /// first volume whose claim, volume or class is missing. Several volumes: the zones all
    /// of them allow.
    pub fn zones(&self, pod: &Pod) -> Result<Option<BTreeSet<String>>, PodError> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let key = format!(
            "{namespace}/{}",
            pod.metadata.name.as_deref().unwrap_or_default()
        );
        let fail = |field: String, message: String| PodError {
            pod: key.clone(),
            field,
            message,
        };
        let mut allowed: Option<BTreeSet<String>> = None;
        let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
        for (i, v) in volumes.into_iter().flatten().enumerate() {
            let Some(source) = &v.persistent_volume_claim else {
                continue;
            };
            let field = format!("spec.volumes[{i}].persistentVolumeClaim.claimName");
            let claim = self
                .claims
                .get(&(namespace, source.claim_name.as_str()))
                .ok_or_else(|| {
                    fail(
                        field.clone(),
                        format!(
                            "PersistentVolumeClaim {namespace}/{} not found",
                            source.claim_name
                        ),
                    )
                })?;
            let spec = claim.spec.as_ref();
            let zones = match spec.and_then(|s| s.volume_name.as_deref()) {
                Some(bound) if !bound.is_empty() => {
                    let pv = self.volumes.get(bound).ok_or_else(|| {
                        fail(
                            field.clone(),
                            format!(
                                "PersistentVolume {bound} of claim {namespace}/{} not found",
                                source.claim_name
                            ),
                        )
                    })?;
                    volume_zones(pv)
                }
                _ => {
                    let class = match spec.and_then(|s| s.storage_class_name.as_deref()) {
                        // An empty class name asks for a pre-provisioned volume of no class.
                        Some("") => None,
                        Some(name) => Some(*self.classes.get(name).ok_or_else(|| {
                            fail(
                                field.clone(),
                                format!(
                                    "StorageClass {name} of claim {namespace}/{} not found",
                                    source.claim_name
                                ),
                            )
                        })?),
                        None => self.default_class,
                    };
                    class.and_then(class_zones)
                }
            };
            if let Some(zones) = zones {
                allowed = Some(match allowed {
                    Some(have) => have.intersection(&zones).cloned().collect(),
                    None => zones,
                });
            }
        }
        Ok(allowed)
    }

    /// How many of `pod`'s claims are Azure Disks (bound to a volume of the Azure Disk
    /// driver, or to be provisioned by a class of it): each takes one of its node's
    /// data-disk slots. Claims that cannot be read count as none (they fail in
    /// [`VolumeTopology::zones`]).
    pub fn disks(&self, pod: &Pod) -> i64 {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
        let mut n = 0;
        for v in volumes.into_iter().flatten() {
            let Some(source) = &v.persistent_volume_claim else {
                continue;
            };
            let Some(claim) = self.claims.get(&(namespace, source.claim_name.as_str())) else {
                continue;
            };
            let spec = claim.spec.as_ref();
            let disk = match spec.and_then(|s| s.volume_name.as_deref()) {
                Some(bound) if !bound.is_empty() => self
                    .volumes
                    .get(bound)
                    .and_then(|pv| pv.spec.as_ref())
                    .is_some_and(|s| {
                        s.azure_disk.is_some()
                            || s.csi
                                .as_ref()
                                .is_some_and(|c| DISK_DRIVERS.contains(&c.driver.as_str()))
                    }),
                _ => {
                    let class = match spec.and_then(|s| s.storage_class_name.as_deref()) {
                        Some("") => None,
                        Some(name) => self.classes.get(name).copied(),
                        None => self.default_class,
                    };
                    class.is_some_and(|c| DISK_DRIVERS.contains(&c.provisioner.as_str()))
                }
            };
            n += i64::from(disk);
        }
        n
    }

    /// `pod` with its volumes' zones added to its required node affinity (to every term,
    /// or as the only one), or `None` when no volume restricts it.
    pub fn constrain(&self, pod: &Pod) -> Result<Option<Pod>, PodError> {
        let Some(zones) = self.zones(pod)? else {
            return Ok(None);
        };
        let expression = NodeSelectorRequirement {
            key: labels::ZONE.to_string(),
            operator: "In".to_string(),
            values: Some(zones.into_iter().collect()),
        };
        let mut pod = pod.clone();
        let spec = pod.spec.get_or_insert_with(Default::default);
        let required = spec
            .affinity
            .get_or_insert_with(Affinity::default)
            .node_affinity
            .get_or_insert_with(NodeAffinity::default)
            .required_during_scheduling_ignored_during_execution
            .get_or_insert_with(NodeSelector::default);
        if required.node_selector_terms.is_empty() {
            required
                .node_selector_terms
                .push(NodeSelectorTerm::default());
        }
        for term in &mut required.node_selector_terms {
            term.match_expressions
                .get_or_insert_with(Vec::new)
                .push(expression.clone());
        }
        Ok(Some(pod))
    }
}

/// Whether a pod names any PersistentVolumeClaim (only such pods are looked at).
pub fn has_claims(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|v| v.iter().any(|v| v.persistent_volume_claim.is_some()))
}

fn zone_values<'e>(
    expressions: impl Iterator<Item = (&'e str, Option<&'e Vec<String>>)>,
) -> Option<BTreeSet<String>> {
    let mut zones: Option<BTreeSet<String>> = None;
    for (key, values) in expressions {
        if !ZONE_KEYS.contains(&key) {
            continue;
        }
        // An empty value is a regional (zone-less) disk: it attaches anywhere.
        let these: BTreeSet<String> = values
            .into_iter()
            .flatten()
            .filter(|v| !v.is_empty())
            .cloned()
            .collect();
        if these.is_empty() {
            continue;
        }
        zones = Some(match zones {
            Some(have) => have.intersection(&these).cloned().collect(),
            None => these,
        });
    }
    zones
}

/// The zones a bound volume's node affinity allows: the union over its terms (ORed) of
/// each term's zone expressions (`In`); `None` when a term does not restrict the zone.
fn volume_zones(pv: &PersistentVolume) -> Option<BTreeSet<String>> {
    let terms = &pv
        .spec
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms;
    let mut all = BTreeSet::new();
    for term in terms {
        let expressions = term
            .match_expressions
            .iter()
            .flatten()
            .filter(|e| e.operator == "In")
            .map(|e| (e.key.as_str(), e.values.as_ref()));
        all.extend(zone_values(expressions)?);
    }
    (!all.is_empty()).then_some(all)
}

/// The zones a `WaitForFirstConsumer` class may provision in (its `allowedTopologies`);
/// `None` for an `Immediate` class (the volume is made before the pod is placed) or one
/// without topology.
fn class_zones(class: &StorageClass) -> Option<BTreeSet<String>> {
    if class.volume_binding_mode.as_deref() != Some("WaitForFirstConsumer") {
        return None;
    }
    let mut all = BTreeSet::new();
    for term in class.allowed_topologies.iter().flatten() {
        let expressions = term
            .match_label_expressions
            .iter()
            .flatten()
            .map(|e| (e.key.as_str(), Some(&e.values)));
        all.extend(zone_values(expressions)?);
    }
    (!all.is_empty()).then_some(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml<T: serde::de::DeserializeOwned>(text: &str) -> T {
        serde_yaml::from_str(text).expect("valid test object")
    }

    fn pod(claims: &[&str], extra: &str) -> Pod {
        let volumes: Vec<String> = claims
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{{name: v{i}, persistentVolumeClaim: {{claimName: {c}}}}}"))
            .collect();
        yaml(&format!(
            "metadata: {{name: db-0, namespace: shop}}\nspec:\n  containers: [{{name: db, image: db}}]\n  volumes: [{}]\n{extra}",
            volumes.join(", ")
        ))
    }

    fn claim(name: &str, spec: &str) -> PersistentVolumeClaim {
        yaml(&format!(
            "metadata: {{name: {name}, namespace: shop}}\nspec: {spec}\n"
        ))
    }

    fn zonal_volume(name: &str, key: &str, zones: &[&str]) -> PersistentVolume {
        yaml(&format!(
            "metadata: {{name: {name}}}\nspec:\n  nodeAffinity:\n    required:\n      nodeSelectorTerms:\n      - matchExpressions: [{{key: {key}, operator: In, values: [{}]}}]\n",
            zones.join(", ")
        ))
    }

    fn class(name: &str, rest: &str) -> StorageClass {
        yaml(&format!(
            "metadata: {{name: {name}}}\nprovisioner: disk.csi.azure.com\n{rest}"
        ))
    }

    #[test]
    fn a_bound_zonal_volume_pins_the_pod_to_its_zone_on_every_term() {
        let claims = [claim("data", "{volumeName: pv-1}")];
        let volumes = [zonal_volume(
            "pv-1",
            "topology.disk.csi.azure.com/zone",
            &["eastus-2"],
        )];
        let t = VolumeTopology::new(&claims, &volumes, &[]);
        let p = pod(
            &["data"],
            "  affinity:\n    nodeAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n        nodeSelectorTerms:\n        - matchExpressions: [{key: kubernetes.io/arch, operator: In, values: [amd64]}]\n        - matchExpressions: [{key: kubernetes.io/arch, operator: In, values: [arm64]}]\n",
        );
        let constrained = t.constrain(&p).expect("readable").expect("constrained");
        let terms = constrained
            .spec
            .and_then(|s| s.affinity)
            .and_then(|a| a.node_affinity)
            .and_then(|n| n.required_during_scheduling_ignored_during_execution)
            .expect("required")
            .node_selector_terms;
        assert_eq!(terms.len(), 2);
        for term in terms {
            let last = term
                .match_expressions
                .expect("expressions")
                .pop()
                .expect("one");
            assert_eq!(last.key, labels::ZONE);
            assert_eq!(last.values, Some(vec!["eastus-2".to_string()]));
        }
    }

    #[test]
    fn unbound_claims_follow_their_class_and_several_volumes_intersect() {
        let claims = [
            claim("wffc", "{storageClassName: zonal}"),
            claim("default", "{}"),
            claim("immediate", "{storageClassName: now}"),
        ];
        let classes = [
            class(
                "zonal",
                "volumeBindingMode: WaitForFirstConsumer\nallowedTopologies:\n- matchLabelExpressions: [{key: topology.disk.csi.azure.com/zone, values: [eastus-1, eastus-2]}]\n",
            ),
            yaml(
                "metadata: {name: managed, annotations: {storageclass.kubernetes.io/is-default-class: 'true'}}\nprovisioner: disk.csi.azure.com\nvolumeBindingMode: WaitForFirstConsumer\nallowedTopologies:\n- matchLabelExpressions: [{key: topology.kubernetes.io/zone, values: [eastus-2, eastus-3]}]\n",
            ),
            class("now", "volumeBindingMode: Immediate\n"),
        ];
        let t = VolumeTopology::new(&claims, &[], &classes);
        let zones = |c: &[&str]| t.zones(&pod(c, "")).expect("readable");
        let set = |z: &[&str]| Some(z.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>());
        assert_eq!(zones(&["wffc"]), set(&["eastus-1", "eastus-2"]));
        assert_eq!(zones(&["default"]), set(&["eastus-2", "eastus-3"]));
        assert_eq!(zones(&["wffc", "default"]), set(&["eastus-2"]));
        // Immediate binding: the volume is made before the pod is placed; nothing yet.
        assert_eq!(zones(&["immediate"]), None);
        // A pod without claims is left as it is.
        let plain: Pod = yaml("metadata: {name: web}\nspec: {containers: [{name: a, image: a}]}\n");
        assert!(!has_claims(&plain));
        assert_eq!(t.constrain(&plain).expect("readable"), None);
    }

    #[test]
    fn a_regional_volume_does_not_restrict_the_zone() {
        let claims = [claim("data", "{volumeName: pv-lrs}")];
        let volumes = [zonal_volume(
            "pv-lrs",
            "topology.disk.csi.azure.com/zone",
            &["''"],
        )];
        let t = VolumeTopology::new(&claims, &volumes, &[]);
        assert_eq!(t.zones(&pod(&["data"], "")).expect("readable"), None);
    }

    #[test]
    fn azure_disk_claims_are_counted_and_others_are_not() {
        let claims = [
            claim("bound-disk", "{volumeName: pv-disk}"),
            claim("bound-files", "{volumeName: pv-files}"),
            claim("new-disk", "{storageClassName: managed-csi}"),
            claim("new-files", "{storageClassName: azurefile}"),
        ];
        let volumes: [PersistentVolume; 2] = [
            yaml(
                "metadata: {name: pv-disk}\nspec: {csi: {driver: disk.csi.azure.com, volumeHandle: d}}\n",
            ),
            yaml(
                "metadata: {name: pv-files}\nspec: {csi: {driver: file.csi.azure.com, volumeHandle: f}}\n",
            ),
        ];
        let classes = [
            class("managed-csi", "volumeBindingMode: WaitForFirstConsumer\n"),
            yaml("metadata: {name: azurefile}\nprovisioner: file.csi.azure.com\n"),
        ];
        let t = VolumeTopology::new(&claims, &volumes, &classes);
        assert_eq!(
            t.disks(&pod(
                &["bound-disk", "bound-files", "new-disk", "new-files"],
                ""
            )),
            2
        );
        assert_eq!(t.disks(&pod(&["bound-files"], "")), 0);
        // Azure's limits: two per vCPU up to 32, 64 above 64 vCPUs.
        assert_eq!(
            [2, 4, 8, 16, 64, 96].map(max_data_disks),
            [4, 8, 16, 32, 32, 64]
        );
    }

    #[test]
    fn a_missing_claim_volume_or_class_names_the_field_and_the_object() {
        let claims = [
            claim("lost", "{volumeName: pv-gone}"),
            claim("classless", "{storageClassName: fast}"),
        ];
        let t = VolumeTopology::new(&claims, &[], &[]);
        let err = |c: &str| t.zones(&pod(&["ok-not-here", c][1..], "")).unwrap_err();
        let e = t.zones(&pod(&["nope"], "")).unwrap_err();
        assert_eq!(e.pod, "shop/db-0");
        assert_eq!(e.field, "spec.volumes[0].persistentVolumeClaim.claimName");
        assert_eq!(e.message, "PersistentVolumeClaim shop/nope not found");
        assert_eq!(
            err("lost").message,
            "PersistentVolume pv-gone of claim shop/lost not found"
        );
        assert_eq!(
            err("classless").message,
            "StorageClass fast of claim shop/classless not found"
        );
    }
}
