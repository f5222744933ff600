//! `AKSNodeClass`: the Azure side of a node — OS image, disk, subnet, tags, kubelet settings —
//! and how Tailor estimates the node's system overhead.
//!
//! The field layout follows the Karpenter Azure provider's `karpenter.azure.com/v1beta1`
//! AKSNodeClass, so its manifests apply once the `apiVersion` reads `tailor.sh/v1alpha1`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::NodeSelectorRequirement;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Kind name, as `nodeClassRef.kind` spells it.
pub const KIND: &str = "AKSNodeClass";
/// Default OS disk size in GB.
pub const DEFAULT_OS_DISK_SIZE_GB: i32 = 128;

/// Condition types of an AKSNodeClass.
pub mod condition {
    /// Summary condition: nodes can be launched with this class.
    pub const READY: &str = "Ready";
    /// The OS images for the class's image family were resolved (`status.images`).
    pub const IMAGES_READY: &str = "ImagesReady";
    /// The subnet exists and can be used.
    pub const SUBNET_READY: &str = "SubnetReady";
}

/// Condition reasons Tailor writes on AKSNodeClasses.
pub mod reason {
    /// The subnet in `vnetSubnetID` does not exist or cannot be read.
    pub const SUBNET_NOT_FOUND: &str = "SubnetNotFound";
    /// No image of the family and version is available.
    pub const IMAGE_NOT_FOUND: &str = "ImageNotFound";
}

/// Operating system image family of the nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ImageFamily {
    /// Ubuntu 22.04.
    #[default]
    Ubuntu2204,
    /// Ubuntu 24.04.
    Ubuntu2404,
    /// The Ubuntu release AKS currently recommends for the cluster's Kubernetes version.
    Ubuntu,
    /// Azure Linux (formerly CBL-Mariner).
    AzureLinux,
}

/// FIPS 140 mode of the node image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum FipsMode {
    /// Use a FIPS-enabled image.
    #[serde(rename = "FIPS")]
    Fips,
    /// Use a regular image.
    Disabled,
}

/// How Tailor estimates the resources a node keeps for itself (kube-reserved plus the eviction
/// threshold), and so what a VM size leaves for pods.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum OverheadModel {
    /// Classic AKS: kube-reserved memory in brackets (25% of the first 4 GiB, 20% of the next
    /// 4, 10% of the next 8, 6% up to 128 GiB, 2% above) plus a 750Mi eviction threshold.
    #[default]
    Brackets,
    /// Newer AKS: kube-reserved memory of min(20 MiB x maxPods + 50 MiB, 25% of memory) plus a
    /// 100Mi eviction threshold.
    MaxPods,
}

/// kubelet CPU manager policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CpuManagerPolicy {
    /// Shared CPU pool for every container.
    None,
    /// Exclusive cores for Guaranteed pods with whole-CPU requests.
    Static,
}

/// kubelet topology manager policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum TopologyManagerPolicy {
    /// No NUMA alignment.
    None,
    /// Prefer NUMA-aligned resources, admit the pod anyway.
    BestEffort,
    /// Admit the pod only if its resources can be NUMA-aligned.
    Restricted,
    /// Admit the pod only if its resources fit one NUMA node.
    SingleNumaNode,
}

/// kubelet settings for the nodes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.imageGCHighThresholdPercent) || !has(self.imageGCLowThresholdPercent) || self.imageGCHighThresholdPercent > self.imageGCLowThresholdPercent").message("imageGCHighThresholdPercent must be greater than imageGCLowThresholdPercent"))]
pub struct KubeletConfiguration {
    /// CPU manager policy: `none` (shared pool) or `static` (exclusive cores for Guaranteed
    /// pods).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_manager_policy: Option<CpuManagerPolicy>,
    /// Whether CPU limits are enforced with CFS quota.
    #[serde(
        rename = "cpuCFSQuota",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub cpu_cfs_quota: Option<bool>,
    /// Disk usage percentage above which image garbage collection always runs.
    #[serde(
        rename = "imageGCHighThresholdPercent",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0, max = 100))]
    pub image_gc_high_threshold_percent: Option<i32>,
    /// Disk usage percentage below which image garbage collection never runs.
    #[serde(
        rename = "imageGCLowThresholdPercent",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0, max = 100))]
    pub image_gc_low_threshold_percent: Option<i32>,
    /// Topology manager policy: `none`, `best-effort`, `restricted` or `single-numa-node`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_manager_policy: Option<TopologyManagerPolicy>,
    /// Unsafe sysctls (or patterns such as `net.core.*`) pods may set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_unsafe_sysctls: Vec<String>,
    /// Largest size of a container log file before it is rotated, for example `50Mi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+([KMG]i)?$"))]
    pub container_log_max_size: Option<String>,
    /// Most log files kept per container (at least 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 2))]
    pub container_log_max_files: Option<i32>,
    /// Most processes a pod may run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_pids_limit: Option<i64>,
}

fn default_os_disk_size_gb() -> Option<i32> {
    Some(DEFAULT_OS_DISK_SIZE_GB)
}

/// Azure settings for the nodes of every NodePool that references this class.
// The typed `printcolumn(...)` lists repeat keys such as `type_`, which clippy mistakes for
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tailor.sh",
    version = "v1alpha1",
    kind = "AKSNodeClass",
    plural = "aksnodeclasses",
    singular = "aksnodeclass",
    status = "AKSNodeClassStatus",
    derive = "PartialEq",
    shortname = "taksnc",
    category = "tailor",
    doc = "Azure settings for nodes: OS image, OS disk, subnet, tags, kubelet settings, and the model Tailor uses for node overhead. Field layout of the Karpenter Azure provider's karpenter.azure.com/v1beta1 AKSNodeClass.",
    printcolumn(
        name = "ImageFamily",
        type_ = "string",
        json_path = ".spec.imageFamily"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct AKSNodeClassSpec {
    /// Azure resource ID of the subnet the nodes' network interfaces join. Unset: the
    /// cluster's default node subnet.
    #[serde(
        rename = "vnetSubnetID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(regex(
        pattern = r"(?i)^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.Network/virtualNetworks/[^/]+/subnets/[^/]+$"
    ))]
    pub vnet_subnet_id: Option<String>,
    /// Size of the OS disk in GB (30 to 2048).
    #[serde(
        rename = "osDiskSizeGB",
        default = "default_os_disk_size_gb",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 30, max = 2048))]
    pub os_disk_size_gb: Option<i32>,
    /// OS image family: Ubuntu2204, Ubuntu2404, Ubuntu or AzureLinux.
    #[serde(default)]
    pub image_family: ImageFamily,
    /// Pin the node image to this version (for example `202501.01.0`). Unset: the newest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_version: Option<String>,
    /// `FIPS` for a FIPS 140 enabled image, `Disabled` for a regular one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fips_mode: Option<FipsMode>,
    /// Azure tags added to every VM, disk and network interface Tailor creates.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 50))]
    pub tags: BTreeMap<String, String>,
    /// kubelet settings for the nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet: Option<KubeletConfiguration>,
    /// Most pods per node (10 to 250). Unset: the AKS default for the network plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 250))]
    pub max_pods: Option<i32>,
    /// How Tailor estimates each node's reserved memory: `Brackets` (classic AKS; kube-reserved
    /// by memory brackets plus a 750Mi eviction threshold) or `MaxPods` (newer AKS;
    /// min(20 MiB x maxPods + 50 MiB, 25%) plus 100Mi).
    #[serde(default)]
    pub overhead_model: OverheadModel,
}

impl AKSNodeClassSpec {
    /// The OS disk size in GB, falling back to the default when unset.
    pub fn os_disk_size_gb_or_default(&self) -> i32 {
        self.os_disk_size_gb.unwrap_or(DEFAULT_OS_DISK_SIZE_GB)
    }
}

/// An OS image resolved for the class, and the nodes it suits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeImage {
    /// Azure resource ID of the image version.
    pub id: String,
    /// Node labels a VM must satisfy to use this image (architecture, Hyper-V generation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requirements: Vec<NodeSelectorRequirement>,
}

/// What Tailor observed about an AKSNodeClass.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AKSNodeClassStatus {
    /// Ready, ImagesReady, SubnetReady.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// OS images resolved for the class's image family, newest first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<Vec<NodeImage>>,
    /// Kubernetes version new nodes join with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Karpenter Azure `karpenter.azure.com/v1beta1` AKSNodeClass with only its apiVersion
    /// changed.
    const KARPENTER_AKSNODECLASS: &str = r#"
apiVersion: tailor.sh/v1alpha1
kind: AKSNodeClass
metadata:
  name: default
spec:
  imageFamily: AzureLinux
  osDiskSizeGB: 64
  vnetSubnetID: /subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/net-rg/providers/Microsoft.Network/virtualNetworks/aks-vnet/subnets/nodes
  fipsMode: FIPS
  maxPods: 110
  tags:
    env: prod
    cost-center: "4711"
  kubelet:
    cpuManagerPolicy: static
    cpuCFSQuota: true
    imageGCHighThresholdPercent: 85
    imageGCLowThresholdPercent: 80
    topologyManagerPolicy: best-effort
    allowedUnsafeSysctls: ["net.core.somaxconn"]
    containerLogMaxSize: 50Mi
    containerLogMaxFiles: 5
    podPidsLimit: 4096
status:
  kubernetesVersion: "1.33.2"
  images:
    - id: /CommunityGalleries/AKSAzureLinux/images/V2gen2/versions/202501.01.0
      requirements:
        - key: kubernetes.io/arch
          operator: In
          values: ["amd64"]
"#;

    #[test]
    fn a_karpenter_aksnodeclass_parses_once_its_api_version_is_changed()
    -> Result<(), serde_yaml::Error> {
        let class: AKSNodeClass = serde_yaml::from_str(KARPENTER_AKSNODECLASS)?;
        let spec = &class.spec;
        assert_eq!(spec.image_family, ImageFamily::AzureLinux);
        assert_eq!(spec.os_disk_size_gb, Some(64));
        assert!(
            spec.vnet_subnet_id
                .as_deref()
                .is_some_and(|id| id.ends_with("/subnets/nodes"))
        );
        assert_eq!(spec.fips_mode, Some(FipsMode::Fips));
        assert_eq!(spec.max_pods, Some(110));
        assert_eq!(spec.tags["cost-center"], "4711");
        assert_eq!(spec.overhead_model, OverheadModel::Brackets);

        let kubelet = spec.kubelet.clone().unwrap_or_default();
        assert_eq!(kubelet.cpu_manager_policy, Some(CpuManagerPolicy::Static));
        assert_eq!(kubelet.cpu_cfs_quota, Some(true));
        assert_eq!(kubelet.image_gc_high_threshold_percent, Some(85));
        assert_eq!(kubelet.image_gc_low_threshold_percent, Some(80));
        assert_eq!(
            kubelet.topology_manager_policy,
            Some(TopologyManagerPolicy::BestEffort)
        );
        assert_eq!(kubelet.allowed_unsafe_sysctls, ["net.core.somaxconn"]);
        assert_eq!(kubelet.container_log_max_size.as_deref(), Some("50Mi"));
        assert_eq!(kubelet.container_log_max_files, Some(5));
        assert_eq!(kubelet.pod_pids_limit, Some(4096));

        let status = class.status.unwrap_or_default();
        assert_eq!(status.kubernetes_version.as_deref(), Some("1.33.2"));
        let images = status.images.unwrap_or_default();
        assert_eq!(images.len(), 1);
        assert_eq!(images[0].requirements[0].key, "kubernetes.io/arch");
        Ok(())
    }

    #[test]
    fn an_empty_aksnodeclass_gets_ubuntu_a_128_gb_disk_and_bracket_overhead()
    -> Result<(), serde_yaml::Error> {
        let class: AKSNodeClass = serde_yaml::from_str(
            "apiVersion: tailor.sh/v1alpha1\nkind: AKSNodeClass\nmetadata: {name: d}\nspec: {}\n",
        )?;
        assert_eq!(class.spec.image_family, ImageFamily::Ubuntu2204);
        assert_eq!(class.spec.os_disk_size_gb_or_default(), 128);
        assert_eq!(class.spec.os_disk_size_gb, Some(128));
        assert_eq!(class.spec.overhead_model, OverheadModel::Brackets);
        assert!(class.spec.kubelet.is_none());
        Ok(())
    }

    #[test]
    fn the_max_pods_overhead_model_is_chosen_by_name() -> Result<(), serde_yaml::Error> {
        let spec: AKSNodeClassSpec = serde_yaml::from_str("overheadModel: MaxPods\nmaxPods: 30\n")?;
        assert_eq!(spec.overhead_model, OverheadModel::MaxPods);
        assert_eq!(spec.max_pods, Some(30));
        Ok(())
    }
}
