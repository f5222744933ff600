//! Well-known label, annotation, taint and finalizer keys.
//!
//! Tailor's own keys live under `tailor.sh/`. Clusters that used Karpenter (or AKS node
//! auto-provisioning) carry the same facts under `karpenter.sh/` and `karpenter.azure.com/`;
//! [`canonical_key`] folds those aliases onto Tailor's keys so that requirements, selectors and
//! node labels written for Karpenter keep their meaning.

/// API group of every Tailor custom resource.
pub const GROUP: &str = "tailor.sh";
/// API version of every Tailor custom resource.
pub const VERSION: &str = "v1alpha1";
/// Field manager name used for every server-side apply the agent makes.
pub const FIELD_MANAGER: &str = "tailor";
/// Category that groups all Tailor resources: `kubectl get tailor`.
pub const CATEGORY: &str = "tailor";

/// API group of Karpenter's core resources, accepted as an alias prefix for labels.
pub const KARPENTER_GROUP: &str = "karpenter.sh";
/// API group of Karpenter's Azure provider; a `nodeClassRef` naming this group with kind
/// `AKSNodeClass` is resolved to Tailor's `AKSNodeClass` of the same name.
pub const KARPENTER_AZURE_GROUP: &str = "karpenter.azure.com";

// ---- Tailor node labels ----------------------------------------------------------------------

/// Name of the NodePool that owns a node or NodeClaim.
pub const NODE_POOL: &str = "tailor.sh/nodepool";
/// Whether a node is a spot or an on-demand VM; values [`CAPACITY_TYPE_SPOT`] and
/// [`CAPACITY_TYPE_ON_DEMAND`].
pub const CAPACITY_TYPE: &str = "tailor.sh/capacity-type";
/// Azure VM size name, for example `Standard_D4s_v5`.
pub const SKU_NAME: &str = "tailor.sh/sku-name";
/// Azure VM size family letter(s), for example `D` or `E`.
pub const SKU_FAMILY: &str = "tailor.sh/sku-family";
/// Azure VM size series, for example `Dsv5`.
pub const SKU_SERIES: &str = "tailor.sh/sku-series";
/// Azure VM size generation number, for example `5` for `Standard_D4s_v5`.
pub const SKU_VERSION: &str = "tailor.sh/sku-version";
/// Number of vCPUs of the VM size.
pub const SKU_CPU: &str = "tailor.sh/sku-cpu";
/// Memory of the VM size in MiB.
pub const SKU_MEMORY: &str = "tailor.sh/sku-memory";
/// Number of GPUs of the VM size.
pub const SKU_GPU_COUNT: &str = "tailor.sh/sku-gpu-count";

/// Label applied once a node has registered with the API server.
pub const REGISTERED: &str = "tailor.sh/registered";
/// Label applied once a node is initialized: ready, startup taints gone, resources reported.
pub const INITIALIZED: &str = "tailor.sh/initialized";

// ---- Tailor annotations, taints and finalizers -----------------------------------------------

/// Annotation on a pod or node: when `"true"`, Tailor never voluntarily disrupts the node.
pub const DO_NOT_DISRUPT: &str = "tailor.sh/do-not-disrupt";
/// Annotation on a NodePool and its NodeClaims: hash of the NodeClaim template, used to detect
/// drift when the template changes.
pub const NODE_POOL_HASH: &str = "tailor.sh/nodepool-hash";
/// Annotation on an AKSNodeClass and its NodeClaims: hash of the node class, used to detect
/// drift when the node class changes.
pub const NODE_CLASS_HASH: &str = "tailor.sh/nodeclass-hash";
/// Taint key placed on a node that Tailor is draining, so no new pods land on it.
pub const DISRUPTED_TAINT_KEY: &str = "tailor.sh/disrupted";
/// Taint key placed on a node until Tailor has matched it to its NodeClaim.
pub const UNREGISTERED_TAINT_KEY: &str = "tailor.sh/unregistered";
/// Annotation naming the provisioning batch a NodeClaim was planned in. Registration holds
/// the nodes of one batch back until all of them have appeared (or a short hold expires), so
/// kube-scheduler sees the planned nodes together and binds pods where the plan put them.
pub const LAUNCH_BATCH_ANNOTATION: &str = "tailor.sh/launch-batch";
/// Annotation on a NodeClaim the provisioner created: the pending pods (`namespace/name`,
/// comma-separated) its plan put on the node. kube-scheduler clears a pod's nomination each
/// time it fails to place it, which it does while the node is still booting, so
/// registration nominates the pods still waiting again just before the node turns
/// schedulable: kube-scheduler then tries that node first and keeps its room for them.
pub const PLANNED_PODS_ANNOTATION: &str = "tailor.sh/planned-pods";

/// Annotation on a NodeClaim bought ahead of the growth the requests' cycle expects rather
/// than for pending pods (`provisioning::headroom`): what it was bought for.
pub const HEADROOM_ANNOTATION: &str = "tailor.sh/headroom";
/// Annotation on a NodeClaim bought ahead (RFC 3339): the end of the lead it was bought
/// for. Until then consolidation leaves it, however empty: the growth it waits for has not
/// come yet, and removing it would have it bought again.
pub const HEADROOM_UNTIL_ANNOTATION: &str = "tailor.sh/headroom-until";
/// Finalizer that holds a NodeClaim or node until its VM has been deleted.
pub const TERMINATION_FINALIZER: &str = "tailor.sh/termination";

/// Cloud tag (Azure tag keys cannot hold `/`) naming the NodePool an instance was launched for.
pub const TAG_NODEPOOL: &str = "tailor.sh_nodepool";
/// Cloud tag naming the NodeClaim an instance was launched for.
pub const TAG_NODECLAIM: &str = "tailor.sh_nodeclaim";
/// Cloud tag naming the cluster an instance was launched for.
pub const TAG_CLUSTER: &str = "tailor.sh_cluster";
/// Annotation on a NodeClaim saying why Tailor deleted it (a disruption method, `liveness`),
/// for the termination metric.
pub const TERMINATION_REASON_ANNOTATION: &str = "tailor.sh/termination-reason";
/// Annotation on a NodePool (`recommend` or `autonomous`) overriding the agent's global mode
/// for the nodes of that pool.
pub const MODE_ANNOTATION: &str = "tailor.sh/mode";
/// Annotation on a NodePool (`recommend` or `autonomous`) overriding its mode for
/// disruption alone: its consolidation reported while Tailor provisions it, or the reverse.
pub const DISRUPTION_MODE_ANNOTATION: &str = "tailor.sh/disruption-mode";

/// Value of [`CAPACITY_TYPE`] for Azure spot VMs.
pub const CAPACITY_TYPE_SPOT: &str = "spot";
/// Value of [`CAPACITY_TYPE`] for regular pay-as-you-go VMs.
pub const CAPACITY_TYPE_ON_DEMAND: &str = "on-demand";

// ---- Karpenter aliases -----------------------------------------------------------------------

/// Karpenter's NodePool label; alias of [`NODE_POOL`].
pub const KARPENTER_NODE_POOL: &str = "karpenter.sh/nodepool";
/// Karpenter's capacity type label; alias of [`CAPACITY_TYPE`].
pub const KARPENTER_CAPACITY_TYPE: &str = "karpenter.sh/capacity-type";
/// Karpenter's do-not-disrupt annotation; alias of [`DO_NOT_DISRUPT`].
pub const KARPENTER_DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
/// Karpenter Azure provider's VM size name label; alias of [`SKU_NAME`].
pub const KARPENTER_SKU_NAME: &str = "karpenter.azure.com/sku-name";
/// Karpenter Azure provider's VM family label; alias of [`SKU_FAMILY`].
pub const KARPENTER_SKU_FAMILY: &str = "karpenter.azure.com/sku-family";
/// Karpenter Azure provider's VM series label; alias of [`SKU_SERIES`].
pub const KARPENTER_SKU_SERIES: &str = "karpenter.azure.com/sku-series";
/// Karpenter Azure provider's VM version label; alias of [`SKU_VERSION`].
pub const KARPENTER_SKU_VERSION: &str = "karpenter.azure.com/sku-version";
/// Karpenter Azure provider's vCPU count label; alias of [`SKU_CPU`].
pub const KARPENTER_SKU_CPU: &str = "karpenter.azure.com/sku-cpu";
/// Karpenter Azure provider's memory label; alias of [`SKU_MEMORY`].
pub const KARPENTER_SKU_MEMORY: &str = "karpenter.azure.com/sku-memory";
/// Karpenter Azure provider's GPU count label; alias of [`SKU_GPU_COUNT`].
pub const KARPENTER_SKU_GPU_COUNT: &str = "karpenter.azure.com/sku-gpu-count";

/// Every accepted alias with the Tailor key it stands for.
pub const ALIASES: &[(&str, &str)] = &[
    (KARPENTER_NODE_POOL, NODE_POOL),
    (KARPENTER_CAPACITY_TYPE, CAPACITY_TYPE),
    (KARPENTER_DO_NOT_DISRUPT, DO_NOT_DISRUPT),
    (KARPENTER_SKU_NAME, SKU_NAME),
    (KARPENTER_SKU_FAMILY, SKU_FAMILY),
    (KARPENTER_SKU_SERIES, SKU_SERIES),
    (KARPENTER_SKU_VERSION, SKU_VERSION),
    (KARPENTER_SKU_CPU, SKU_CPU),
    (KARPENTER_SKU_MEMORY, SKU_MEMORY),
    (KARPENTER_SKU_GPU_COUNT, SKU_GPU_COUNT),
];

// ---- Kubernetes well-known labels ------------------------------------------------------------

/// CPU architecture of a node (`amd64`, `arm64`).
pub const ARCH: &str = "kubernetes.io/arch";
/// Operating system of a node (`linux`, `windows`).
pub const OS: &str = "kubernetes.io/os";
/// Hostname of a node; the topology domain for per-node spreading.
pub const HOSTNAME: &str = "kubernetes.io/hostname";
/// VM size of a node, as the cloud provider reports it.
pub const INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// Availability zone of a node, for example `westeurope-1`.
pub const ZONE: &str = "topology.kubernetes.io/zone";
/// Region of a node, for example `westeurope`.
pub const REGION: &str = "topology.kubernetes.io/region";

/// Value of [`ARCH`] for x86-64 nodes.
pub const ARCH_AMD64: &str = "amd64";
/// Value of [`ARCH`] for 64-bit Arm nodes.
pub const ARCH_ARM64: &str = "arm64";
/// Value of [`OS`] for Linux nodes.
pub const OS_LINUX: &str = "linux";

/// Maps a Karpenter alias onto the Tailor key it stands for; any other key comes back unchanged.
///
/// Use it wherever a label key from user input (NodePool requirements, pod node selectors and
/// affinities, annotations) is compared with a key Tailor sets.
pub fn canonical_key(key: &str) -> &str {
    ALIASES
        .iter()
        .find(|(alias, _)| *alias == key)
        .map_or(key, |(_, canonical)| canonical)
}

/// Whether `key` is a Karpenter alias of a Tailor key.
pub fn is_alias(key: &str) -> bool {
    ALIASES.iter().any(|(alias, _)| *alias == key)
}

/// Whether a label is one an instance type defines (architecture, OS, size, zone, region,
/// capacity type and the `tailor.sh/sku-*` labels): a node-to-be may leave it undefined
/// until its instance type is chosen.
pub fn is_well_known(key: &str) -> bool {
    let key = canonical_key(key);
    matches!(
        key,
        ARCH | OS | INSTANCE_TYPE | ZONE | REGION | CAPACITY_TYPE
    ) || key.starts_with("tailor.sh/sku-")
}

/// The extended resource name of NVIDIA GPUs.
pub const RESOURCE_NVIDIA_GPU: &str = "nvidia.com/gpu";

/// Annotation on pods that a snapshot added for workload replicas it had no pod for.
pub const SYNTHESIZED_ANNOTATION: &str = "tailor.sh/synthesized";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn karpenter_aliases_map_onto_tailor_keys() {
        assert_eq!(canonical_key("karpenter.sh/nodepool"), NODE_POOL);
        assert_eq!(canonical_key("karpenter.sh/capacity-type"), CAPACITY_TYPE);
        assert_eq!(canonical_key("karpenter.sh/do-not-disrupt"), DO_NOT_DISRUPT);
        assert_eq!(canonical_key("karpenter.azure.com/sku-family"), SKU_FAMILY);
        assert_eq!(
            canonical_key("karpenter.azure.com/sku-version"),
            SKU_VERSION
        );
        assert_eq!(
            canonical_key("karpenter.azure.com/sku-gpu-count"),
            SKU_GPU_COUNT
        );
    }

    #[test]
    fn other_keys_pass_through_canonical_key_unchanged() {
        assert_eq!(canonical_key(ZONE), ZONE);
        assert_eq!(canonical_key(NODE_POOL), NODE_POOL);
        assert_eq!(canonical_key("example.com/team"), "example.com/team");
        assert!(!is_alias(NODE_POOL));
    }

    #[test]
    fn every_alias_targets_a_tailor_key_with_the_same_suffix() {
        for (alias, canonical) in ALIASES {
            assert!(is_alias(alias));
            assert!(canonical.starts_with("tailor.sh/"), "{canonical}");
            let suffix = |k: &str| k.rsplit('/').next().unwrap_or_default().to_owned();
            assert_eq!(suffix(alias), suffix(canonical));
        }
    }
}
