//! `NodeClaim`: one node that Tailor has decided to buy, from the moment of decision until its VM
//! is deleted. Also the node requirement and node class reference types that `NodePool` shares.
//!
//! The field layout follows Karpenter's `karpenter.sh/v1` NodeClaim, so tooling written against
//! Karpenter reads Tailor's NodeClaims with only the apiVersion changed.

use std::collections::BTreeMap;

use jiff::SignedDuration;
use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::apis::ResourceList;
use crate::apis::duration::{
    DURATION_OR_NEVER_PATTERN, DURATION_PATTERN, parse_duration, parse_duration_or_never,
};
use crate::apis::labels;

/// Schema pattern for a Kubernetes label key: an optional DNS-subdomain prefix and a name.
pub const LABEL_KEY_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$";

/// Default for `expireAfter`: nodes are replaced after 30 days.
pub const DEFAULT_EXPIRE_AFTER: &str = "720h";

/// Condition types of a NodeClaim, in the order a healthy NodeClaim acquires them.
pub mod condition {
    /// The VM was created in Azure; `status.providerID` is set.
    pub const LAUNCHED: &str = "Launched";
    /// A Node object with the NodeClaim's provider ID joined the cluster.
    pub const REGISTERED: &str = "Registered";
    /// The node is ready, its startup taints are gone and it reports its extended resources.
    pub const INITIALIZED: &str = "Initialized";
    /// Summary condition: true once the NodeClaim is launched, registered and initialized.
    pub const READY: &str = "Ready";
    /// The NodeClaim no longer matches its NodePool or node class and is due for replacement.
    pub const DRIFTED: &str = "Drifted";
    /// The node's pods fit elsewhere (or it is empty) and `consolidateAfter` has passed.
    pub const CONSOLIDATABLE: &str = "Consolidatable";
    /// No pods other than DaemonSet pods run on the node.
    pub const EMPTY: &str = "Empty";
    /// Tailor has chosen the node for disruption and is draining it.
    pub const DISRUPTING: &str = "Disrupting";
}

/// Condition reasons Tailor writes on NodeClaims.
pub mod reason {
    /// The VM was created.
    pub const LAUNCHED: &str = "Launched";
    /// Creating the VM failed for a reason other than capacity or quota.
    pub const LAUNCH_FAILED: &str = "LaunchFailed";
    /// Azure had no capacity for the chosen size, zone and capacity type.
    pub const INSUFFICIENT_CAPACITY: &str = "InsufficientCapacity";
    /// The subscription's vCPU quota for the size family or region is used up.
    pub const QUOTA_EXCEEDED: &str = "QuotaExceeded";
    /// The chosen VM size is not offered in the region or zone.
    pub const SKU_NOT_AVAILABLE: &str = "SkuNotAvailable";
    /// The VM exists but no Node object has registered for it yet.
    pub const NODE_NOT_FOUND: &str = "NodeNotFound";
    /// The Node object registered.
    pub const REGISTERED: &str = "Registered";
    /// The Node object exists but is not Ready.
    pub const NODE_NOT_READY: &str = "NodeNotReady";
    /// The node still carries one of the NodeClaim's startup taints.
    pub const STARTUP_TAINTS_PRESENT: &str = "StartupTaintsPresent";
    /// The node does not yet report a resource the NodeClaim asked for.
    pub const RESOURCES_NOT_REGISTERED: &str = "ResourcesNotRegistered";
    /// The node is fully initialized.
    pub const INITIALIZED: &str = "Initialized";
    /// The NodePool's requirements no longer admit the NodeClaim's labels.
    pub const REQUIREMENTS_DRIFTED: &str = "RequirementsDrifted";
    /// The NodePool's template changed since the NodeClaim was made (hash mismatch).
    pub const NODE_POOL_DRIFTED: &str = "NodePoolDrifted";
    /// The AKSNodeClass changed since the NodeClaim was made (hash mismatch or new image).
    pub const NODE_CLASS_DRIFTED: &str = "NodeClassDrifted";
    /// The node runs no workload pods.
    pub const EMPTY: &str = "Empty";
    /// The node's pods fit on other nodes, or on a cheaper replacement.
    pub const UNDERUTILIZED: &str = "Underutilized";
    /// The node reached its `expireAfter` age.
    pub const EXPIRED: &str = "Expired";
    /// The node drifted from its NodePool or node class.
    pub const DRIFTED: &str = "Drifted";
    /// Pods changed on the node less than `consolidateAfter` ago.
    pub const RECENT_POD_CHANGE: &str = "RecentPodChange";
}

/// How a node requirement compares a node label with its values.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub enum RequirementOperator {
    /// The label's value is one of `values`.
    In,
    /// The label is absent or its value is none of `values`.
    NotIn,
    /// The label is present, with any value.
    Exists,
    /// The label is absent.
    DoesNotExist,
    /// The label's value, read as an integer, is greater than the single value.
    Gt,
    /// The label's value, read as an integer, is less than the single value.
    Lt,
    /// The label's value, read as an integer, is greater than or equal to the single value.
    Gte,
    /// The label's value, read as an integer, is less than or equal to the single value.
    Lte,
}

/// A constraint on one node label, with an optional demand for variety (`minValues`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.operator != 'In' || (has(self.values) && size(self.values) > 0)")
        .message("a requirement with operator In needs at least one value"),
    validation = Rule::new("!has(self.minValues) || self.operator != 'In' || (has(self.values) && self.minValues <= size(self.values))")
        .message("minValues cannot be larger than the number of values listed for operator In"),
    validation = Rule::new("!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || size(self.values) == 0")
        .message("operators Exists and DoesNotExist take no values"),
    validation = Rule::new("!(self.operator in ['Gt', 'Lt', 'Gte', 'Lte']) || (has(self.values) && size(self.values) == 1 && self.values[0].matches('^-?[0-9]+$'))")
        .message("operators Gt, Lt, Gte and Lte take exactly one integer value")
)]
pub struct NodeRequirement {
    /// Node label the requirement constrains, for example `topology.kubernetes.io/zone` or
    /// `tailor.sh/sku-family`. Karpenter's `karpenter.sh/*` and `karpenter.azure.com/sku-*`
    /// keys are accepted as aliases of the matching `tailor.sh/*` keys.
    #[schemars(length(min = 1, max = 316), regex(pattern = LABEL_KEY_PATTERN))]
    pub key: String,
    /// How the label is compared: In, NotIn, Exists, DoesNotExist, Gt, Lt, Gte or Lte.
    pub operator: RequirementOperator,
    /// Values to compare with. In and NotIn take a list; Gt, Lt, Gte and Lte take one integer;
    /// Exists and DoesNotExist take none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 500), inner(length(max = 63)))]
    pub values: Vec<String>,
    /// Least number of distinct values of this label that the candidate VM sizes must span
    /// when Tailor launches a node. Use it to keep spot launches flexible, for example at least
    /// 3 VM families.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 50))]
    pub min_values: Option<i32>,
}

impl NodeRequirement {
    /// The requirement's label key with Karpenter aliases folded onto Tailor's keys.
    pub fn canonical_key(&self) -> &str {
        labels::canonical_key(&self.key)
    }
}

fn default_node_class_group() -> String {
    labels::GROUP.to_owned()
}

fn default_node_class_kind() -> String {
    crate::apis::aksnodeclass::KIND.to_owned()
}

/// Points at the node class (Azure settings) that nodes are created with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeClassReference {
    /// API group of the node class: `tailor.sh`. Karpenter's `karpenter.azure.com` is accepted
    /// and resolves to Tailor's AKSNodeClass of the same name.
    #[serde(default = "default_node_class_group")]
    #[schemars(length(min = 1))]
    pub group: String,
    /// Kind of the node class: `AKSNodeClass`.
    #[serde(default = "default_node_class_kind")]
    #[schemars(length(min = 1))]
    pub kind: String,
    /// Name of the node class.
    #[schemars(length(min = 1))]
    pub name: String,
}

impl NodeClassReference {
    /// A reference to the Tailor AKSNodeClass called `name`.
    pub fn aks(name: impl Into<String>) -> Self {
        Self {
            group: default_node_class_group(),
            kind: default_node_class_kind(),
            name: name.into(),
        }
    }

    /// Whether the reference names an AKSNodeClass, under Tailor's group or Karpenter's.
    pub fn is_aks_node_class(&self) -> bool {
        (self.group == labels::GROUP || self.group == labels::KARPENTER_AZURE_GROUP)
            && self.kind == crate::apis::aksnodeclass::KIND
    }
}

/// Resources a NodeClaim's node must offer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimResources {
    /// Least allocatable resources the node must have: the summed requests of the pods it was
    /// bought for, plus DaemonSet overhead.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: ResourceList,
}

impl NodeClaimResources {
    /// Whether no resources are requested.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }
}

impl NodeClaim {
    /// Whether the status holds condition `type_` with status `True`.
    pub fn condition_true(&self, type_: &str) -> bool {
        self.status
            .as_ref()
            .is_some_and(|s| crate::apis::is_condition_true(&s.conditions, type_))
    }
}

pub(crate) fn default_expire_after() -> String {
    DEFAULT_EXPIRE_AFTER.to_owned()
}

/// The desired node of a NodeClaim. It cannot change once created: Tailor replaces the NodeClaim
/// instead.
// The typed `printcolumn(...)` lists repeat keys such as `type_`, which clippy mistakes for
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "tailor.sh",
    version = "v1alpha1",
    kind = "NodeClaim",
    plural = "nodeclaims",
    singular = "nodeclaim",
    status = "NodeClaimStatus",
    derive = "PartialEq",
    shortname = "tnc",
    category = "tailor",
    doc = "A request for one node: what it must satisfy and, in its status, the VM and Node that fulfil it. Tailor creates NodeClaims from NodePools; deleting one drains and deletes its node.",
    printcolumn(
        name = "Type",
        type_ = "string",
        json_path = ".metadata.labels.node\\.kubernetes\\.io/instance-type",
        description = "Azure VM size"
    ),
    printcolumn(
        name = "Capacity",
        type_ = "string",
        json_path = ".metadata.labels.tailor\\.sh/capacity-type",
        description = "spot or on-demand"
    ),
    printcolumn(
        name = "Zone",
        type_ = "string",
        json_path = ".metadata.labels.topology\\.kubernetes\\.io/zone"
    ),
    printcolumn(name = "Node", type_ = "string", json_path = ".status.nodeName"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "NodePool",
        type_ = "string",
        json_path = ".metadata.labels.tailor\\.sh/nodepool",
        priority = 1
    ),
    printcolumn(
        name = "ID",
        type_ = "string",
        json_path = ".status.providerID",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self == oldSelf").message("a NodeClaim's spec cannot change; delete it and let Tailor create a new one"))]
pub struct NodeClaimSpec {
    /// Node labels the node must satisfy; Tailor picks a VM size, zone and capacity type that
    /// meet all of them.
    #[serde(default)]
    #[schemars(length(max = 100))]
    pub requirements: Vec<NodeRequirement>,
    /// Resources the node must be able to allocate.
    #[serde(default, skip_serializing_if = "NodeClaimResources::is_empty")]
    pub resources: NodeClaimResources,
    /// Taints the node carries for its whole life.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,
    /// Taints the node starts with and that some other agent (a CNI, a device plugin) removes
    /// once the node is prepared. Tailor treats pods as able to land on the node regardless.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub startup_taints: Vec<Taint>,
    /// The node class (Azure settings) the node is created with.
    pub node_class_ref: NodeClassReference,
    /// Age at which the node is replaced, as a Go duration (`720h`) or `Never`.
    #[serde(default = "default_expire_after")]
    #[schemars(regex(pattern = DURATION_OR_NEVER_PATTERN))]
    pub expire_after: String,
    /// Longest time a drain may take before Tailor deletes remaining pods regardless of
    /// PodDisruptionBudgets and `do-not-disrupt`, as a Go duration. Unset: wait for ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub termination_grace_period: Option<String>,
}

impl NodeClaimSpec {
    /// `expireAfter` as a duration; `None` when the node never expires.
    pub fn expire_after(&self) -> crate::apis::Result<Option<SignedDuration>> {
        parse_duration_or_never(&self.expire_after)
    }

    /// `terminationGracePeriod` as a duration; `None` when drains may take for ever.
    pub fn termination_grace_period(&self) -> crate::apis::Result<Option<SignedDuration>> {
        self.termination_grace_period
            .as_deref()
            .map(parse_duration)
            .transpose()
    }
}

/// What Tailor observed about a NodeClaim's VM and Node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimStatus {
    /// Name of the Node object that registered for this NodeClaim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Azure resource ID of the VM, in the form the Node's `spec.providerID` carries.
    #[serde(
        rename = "providerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    /// Identifier of the OS image the VM was created from.
    #[serde(rename = "imageID", default, skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    /// Total resources of the VM size.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: ResourceList,
    /// Resources left for pods once system reservations and eviction thresholds are taken off.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocatable: ResourceList,
    /// Launched, Registered, Initialized, Ready, Drifted, Consolidatable, Empty, Disrupting.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// When a pod was last scheduled to or removed from the node; `consolidateAfter` counts
    /// from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_pod_event_time: Option<Time>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::{find_condition, is_condition_true};

    const KARPENTER_NODECLAIM: &str = r#"
apiVersion: tailor.sh/v1alpha1
kind: NodeClaim
metadata:
  name: general-purpose-x7k2p
  labels:
    karpenter.sh/nodepool: general-purpose
    node.kubernetes.io/instance-type: Standard_D4s_v5
spec:
  nodeClassRef:
    group: karpenter.azure.com
    kind: AKSNodeClass
    name: default
  requirements:
    - key: karpenter.sh/nodepool
      operator: In
      values: ["general-purpose"]
    - key: node.kubernetes.io/instance-type
      operator: In
      values: ["Standard_D4s_v5", "Standard_D4as_v5"]
      minValues: 2
    - key: karpenter.azure.com/sku-cpu
      operator: Gt
      values: ["2"]
  resources:
    requests:
      cpu: 3150m
      memory: 9Gi
      pods: "14"
  taints:
    - key: example.com/dedicated
      value: batch
      effect: NoSchedule
  expireAfter: Never
  terminationGracePeriod: 1h
status:
  nodeName: aks-general-purpose-x7k2p
  providerID: azure:///subscriptions/0000/resourceGroups/mc_rg/providers/Microsoft.Compute/virtualMachines/aks-general-purpose-x7k2p
  imageID: /CommunityGalleries/AKSUbuntu/images/2204gen2containerd/versions/202501.01.0
  capacity:
    cpu: "4"
    memory: 16Gi
    pods: "110"
  allocatable:
    cpu: 3860m
    memory: 12Gi
    pods: "110"
  lastPodEventTime: "2025-01-02T03:04:05Z"
  conditions:
    - type: Launched
      status: "True"
      reason: Launched
      message: ""
      lastTransitionTime: "2025-01-02T03:00:00Z"
    - type: Ready
      status: "True"
      reason: Ready
      message: ""
      lastTransitionTime: "2025-01-02T03:02:00Z"
"#;

    #[test]
    fn a_karpenter_nodeclaim_parses_once_its_api_version_is_changed()
    -> Result<(), serde_yaml::Error> {
        let claim: NodeClaim = serde_yaml::from_str(KARPENTER_NODECLAIM)?;
        let spec = &claim.spec;
        assert!(spec.node_class_ref.is_aks_node_class());
        assert_eq!(spec.node_class_ref.name, "default");
        assert_eq!(spec.requirements.len(), 3);
        assert_eq!(spec.requirements[0].canonical_key(), labels::NODE_POOL);
        assert_eq!(spec.requirements[1].min_values, Some(2));
        assert_eq!(spec.requirements[2].operator, RequirementOperator::Gt);
        assert_eq!(spec.resources.requests["cpu"].0, "3150m");
        assert_eq!(spec.resources.requests["pods"].0, "14");
        assert_eq!(spec.taints[0].effect, "NoSchedule");
        assert_eq!(spec.expire_after().ok(), Some(None));
        assert_eq!(
            spec.termination_grace_period().ok(),
            Some(Some(SignedDuration::from_hours(1)))
        );

        let status = claim.status.unwrap_or_default();
        assert_eq!(
            status.node_name.as_deref(),
            Some("aks-general-purpose-x7k2p")
        );
        assert!(
            status
                .provider_id
                .is_some_and(|id| id.starts_with("azure:///"))
        );
        assert_eq!(status.allocatable["cpu"].0, "3860m");
        assert!(status.last_pod_event_time.is_some());
        assert!(is_condition_true(&status.conditions, condition::READY));
        assert!(find_condition(&status.conditions, condition::DRIFTED).is_none());
        Ok(())
    }

    #[test]
    fn a_nodeclaim_without_expiry_or_class_group_gets_the_defaults() -> Result<(), serde_yaml::Error>
    {
        let claim: NodeClaim = serde_yaml::from_str(
            "apiVersion: tailor.sh/v1alpha1\nkind: NodeClaim\nmetadata: {name: x}\n\
             spec: {nodeClassRef: {name: default}}\n",
        )?;
        assert_eq!(claim.spec.expire_after, DEFAULT_EXPIRE_AFTER);
        assert_eq!(
            claim.spec.node_class_ref,
            NodeClassReference::aks("default")
        );
        assert!(claim.spec.requirements.is_empty());
        Ok(())
    }

    #[test]
    fn a_nodeclaim_serialises_back_to_the_same_object() -> Result<(), serde_yaml::Error> {
        let claim: NodeClaim = serde_yaml::from_str(KARPENTER_NODECLAIM)?;
        let again: NodeClaim = serde_yaml::from_str(&serde_yaml::to_string(&claim)?)?;
        assert_eq!(claim, again);
        Ok(())
    }
}
