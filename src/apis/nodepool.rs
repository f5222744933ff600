//! `NodePool`: a template for the nodes Tailor may buy, the limits on how many, and the rules for
//! when it may take them away again.
//!
//! The field layout follows Karpenter's `karpenter.sh/v1` NodePool: an existing Karpenter
//! NodePool manifest applies as a Tailor NodePool once its `apiVersion` reads
//! `tailor.sh/v1alpha1`.

use std::collections::BTreeMap;

use jiff::SignedDuration;
use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::apis::duration::{
    DURATION_OR_NEVER_PATTERN, DURATION_PATTERN, parse_duration, parse_duration_or_never,
};
use crate::apis::nodeclaim::{NodeClassReference, NodeRequirement, default_expire_after};
use crate::apis::{Error, ResourceList, Result};

/// Default for `disruption.consolidateAfter`: consolidate as soon as a node qualifies.
pub const DEFAULT_CONSOLIDATE_AFTER: &str = "0s";
/// Default for a budget's `nodes`: at most a tenth of the pool's nodes at once.
pub const DEFAULT_BUDGET_NODES: &str = "10%";
/// Key in `status.resources` that holds the number of nodes the pool owns.
pub const RESOURCE_NODES: &str = "nodes";

/// Condition types of a NodePool.
pub mod condition {
    /// Summary condition: the pool can be used to launch nodes.
    pub const READY: &str = "Ready";
    /// The referenced node class exists and is ready.
    pub const NODE_CLASS_READY: &str = "NodeClassReady";
    /// The pool's spec passed the checks the API server cannot make.
    pub const VALIDATION_SUCCEEDED: &str = "ValidationSucceeded";
}

/// Condition reasons Tailor writes on NodePools.
pub mod reason {
    /// The referenced node class does not exist.
    pub const NODE_CLASS_NOT_FOUND: &str = "NodeClassNotFound";
    /// The referenced node class exists but is not ready.
    pub const NODE_CLASS_NOT_READY: &str = "NodeClassNotReady";
    /// The pool's limits are reached; no further nodes will be launched from it.
    pub const LIMITS_EXCEEDED: &str = "LimitsExceeded";
    /// The pool's requirements admit no VM size in the catalog.
    pub const NO_COMPATIBLE_INSTANCE_TYPES: &str = "NoCompatibleInstanceTypes";
}

/// Labels and annotations stamped on every node (and NodeClaim) made from a NodePool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMetadata {
    /// Labels for the nodes. `tailor.sh/nodepool` is set by Tailor and cannot be given here.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 100))]
    #[x_kube(validation = Rule::new("self.all(k, k != 'tailor.sh/nodepool' && k != 'karpenter.sh/nodepool')").message("the nodepool label is set by Tailor and cannot be given in the template"))]
    pub labels: BTreeMap<String, String>,
    /// Annotations for the nodes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl TemplateMetadata {
    /// Whether there are neither labels nor annotations.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotations.is_empty()
    }
}

/// What a node made from this pool looks like.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimTemplate {
    /// Labels and annotations for the nodes.
    #[serde(default, skip_serializing_if = "TemplateMetadata::is_empty")]
    pub metadata: TemplateMetadata,
    /// Requirements, taints, node class and lifetime of the nodes.
    pub spec: NodeClaimTemplateSpec,
}

/// The NodeClaim spec a NodePool stamps out, less the resources (those come from the pods).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeClaimTemplateSpec {
    /// Node labels every node of the pool must satisfy: VM families, zones, capacity types,
    /// architectures. Pods narrow these further with their own node selectors and affinities.
    #[serde(default)]
    #[schemars(length(max = 100))]
    #[x_kube(validation = Rule::new("self.all(r, r.key != 'tailor.sh/nodepool' && r.key != 'karpenter.sh/nodepool')").message("the nodepool label is set by Tailor and cannot be required"))]
    pub requirements: Vec<NodeRequirement>,
    /// Taints every node of the pool carries; only pods that tolerate them land there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,
    /// Taints the nodes start with and that another agent removes once the node is prepared.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub startup_taints: Vec<Taint>,
    /// The node class (Azure settings) the nodes are created with.
    pub node_class_ref: NodeClassReference,
    /// Age at which a node is replaced, as a Go duration (`720h`) or `Never`.
    #[serde(default = "default_expire_after")]
    #[schemars(regex(pattern = DURATION_OR_NEVER_PATTERN))]
    pub expire_after: String,
    /// Longest time a node's drain may take before remaining pods are deleted regardless of
    /// PodDisruptionBudgets and `do-not-disrupt`, as a Go duration. Unset: wait for ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub termination_grace_period: Option<String>,
}

impl NodeClaimTemplateSpec {
    /// `expireAfter` as a duration; `None` when nodes never expire.
    pub fn expire_after(&self) -> Result<Option<SignedDuration>> {
        parse_duration_or_never(&self.expire_after)
    }

    /// `terminationGracePeriod` as a duration; `None` when drains may take for ever.
    pub fn termination_grace_period(&self) -> Result<Option<SignedDuration>> {
        self.termination_grace_period
            .as_deref()
            .map(parse_duration)
            .transpose()
    }
}

/// Which nodes consolidation may remove or replace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ConsolidationPolicy {
    /// Only nodes that run no workload pods.
    WhenEmpty,
    /// Empty nodes, and nodes whose pods fit elsewhere or on a cheaper replacement.
    #[default]
    WhenEmptyOrUnderutilized,
}

/// Why a node is being disrupted; budgets can be limited to some reasons.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub enum DisruptionReason {
    /// The node's pods fit on other nodes or on a cheaper replacement.
    Underutilized,
    /// The node runs no workload pods.
    Empty,
    /// The node no longer matches its NodePool or node class.
    Drifted,
}

fn default_budget_nodes() -> String {
    DEFAULT_BUDGET_NODES.to_owned()
}

/// A cap on how many of the pool's nodes may be disrupted at once, optionally only during a
/// recurring window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.schedule) == has(self.duration)").message("schedule and duration must be given together"))]
pub struct Budget {
    /// Most nodes that may be disrupted at once: a count (`"5"`) or a percentage of the pool's
    /// nodes (`"10%"`, rounded up). `"0"` blocks disruption.
    #[serde(default = "default_budget_nodes")]
    #[schemars(regex(pattern = r"^((100|[0-9]{1,2})%|[0-9]+)$"))]
    pub nodes: String,
    /// When the budget starts to apply, as a cron expression in UTC (`"0 9 * * mon-fri"`) or a
    /// macro such as `@daily`. Unset: the budget always applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(
        pattern = r"^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|\S+\s+\S+\s+\S+\s+\S+\s+\S+)$"
    ))]
    pub schedule: Option<String>,
    /// How long the budget applies after each `schedule` start, as a Go duration (`"8h"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub duration: Option<String>,
    /// Disruption reasons the budget limits (Underutilized, Empty, Drifted). Unset: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasons: Option<Vec<DisruptionReason>>,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            nodes: default_budget_nodes(),
            schedule: None,
            duration: None,
            reasons: None,
        }
    }
}

/// A budget's `nodes`, parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetNodes {
    /// An absolute number of nodes.
    Count(u32),
    /// A percentage of the pool's nodes, 0 to 100.
    Percent(u32),
}

impl BudgetNodes {
    /// How many of `total` nodes the budget lets go at once. Percentages round up, as
    /// Karpenter's budgets do, so `10%` of 5 nodes still allows one.
    pub fn allowed(self, total: usize) -> usize {
        match self {
            Self::Count(n) => usize::try_from(n).unwrap_or(usize::MAX),
            Self::Percent(p) => {
                let p = usize::try_from(p).unwrap_or(usize::MAX).min(100);
                total.saturating_mul(p).div_ceil(100)
            }
        }
    }
}

impl Budget {
    /// Parses `nodes` into a count or a percentage.
    pub fn nodes(&self) -> Result<BudgetNodes> {
        let invalid = || Error::InvalidBudgetNodes {
            value: self.nodes.clone(),
        };
        match self.nodes.strip_suffix('%') {
            Some(percent) => match percent.parse::<u32>() {
                Ok(p) if p <= 100 => Ok(BudgetNodes::Percent(p)),
                _ => Err(invalid()),
            },
            None => self
                .nodes
                .parse::<u32>()
                .map(BudgetNodes::Count)
                .map_err(|_| invalid()),
        }
    }

    /// `duration` as a span; `None` when the budget has no window.
    pub fn window(&self) -> Result<Option<SignedDuration>> {
        self.duration.as_deref().map(parse_duration).transpose()
    }

    /// Whether the budget limits disruptions for `reason`.
    pub fn applies_to(&self, reason: DisruptionReason) -> bool {
        self.reasons.as_ref().is_none_or(|r| r.contains(&reason))
    }
}

fn default_consolidate_after() -> String {
    DEFAULT_CONSOLIDATE_AFTER.to_owned()
}

fn default_budgets() -> Vec<Budget> {
    vec![Budget::default()]
}

/// When and how fast Tailor may take the pool's nodes away.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Disruption {
    /// Which nodes consolidation may remove or replace: `WhenEmpty` (only empty nodes) or
    /// `WhenEmptyOrUnderutilized` (also nodes whose pods fit elsewhere or on a cheaper node).
    #[serde(default)]
    pub consolidation_policy: ConsolidationPolicy,
    /// How long a node must go without pods arriving or leaving before it may be consolidated,
    /// as a Go duration (`"5m"`) or `Never` to switch consolidation off.
    #[serde(default = "default_consolidate_after")]
    #[schemars(regex(pattern = DURATION_OR_NEVER_PATTERN))]
    pub consolidate_after: String,
    /// Caps on how many nodes may be disrupted at once. When several apply, the smallest wins.
    #[serde(default = "default_budgets")]
    #[schemars(length(max = 50))]
    pub budgets: Vec<Budget>,
}

impl Default for Disruption {
    fn default() -> Self {
        Self {
            consolidation_policy: ConsolidationPolicy::default(),
            consolidate_after: default_consolidate_after(),
            budgets: default_budgets(),
        }
    }
}

impl Disruption {
    /// `consolidateAfter` as a duration; `None` when consolidation is off (`Never`).
    pub fn consolidate_after(&self) -> Result<Option<SignedDuration>> {
        parse_duration_or_never(&self.consolidate_after)
    }
}

/// A family of nodes Tailor may launch: their shape, their limits and their disruption rules.
// The typed `printcolumn(...)` lists repeat keys such as `type_`, which clippy mistakes for
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tailor.sh",
    version = "v1alpha1",
    kind = "NodePool",
    plural = "nodepools",
    singular = "nodepool",
    status = "NodePoolStatus",
    derive = "PartialEq",
    shortname = "tnp",
    category = "tailor",
    doc = "A family of nodes Tailor may launch for pending pods: which VM sizes, zones and capacity types, with which labels and taints, up to which limits, and how they may be consolidated. Field layout of Karpenter's karpenter.sh/v1 NodePool.",
    printcolumn(
        name = "NodeClass",
        type_ = "string",
        json_path = ".spec.template.spec.nodeClassRef.name"
    ),
    printcolumn(
        name = "Nodes",
        type_ = "string",
        json_path = ".status.resources.nodes"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Weight", type_ = "integer", json_path = ".spec.weight"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "CPU",
        type_ = "string",
        json_path = ".status.resources.cpu",
        priority = 1
    ),
    printcolumn(
        name = "Memory",
        type_ = "string",
        json_path = ".status.resources.memory",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodePoolSpec {
    /// What the nodes look like: labels, requirements, taints, node class and lifetime.
    pub template: NodeClaimTemplate,
    /// When and how fast nodes may be removed or replaced.
    #[serde(default)]
    pub disruption: Disruption,
    /// Most resources the pool's nodes may add up to (capacity, not allocatable), for example
    /// `cpu: 1000` or `memory: 4000Gi`. Tailor launches no node that would cross a limit.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: ResourceList,
    /// Preference among NodePools that all fit a pod: higher weight is tried first (1 to 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub weight: Option<i32>,
}

/// What Tailor observed about a NodePool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePoolStatus {
    /// Capacity of all the pool's nodes added up, plus `nodes`: how many there are.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: ResourceList,
    /// Ready, NodeClassReady, ValidationSucceeded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Generation of the node class that the conditions were computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_class_observed_generation: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::labels;
    use crate::apis::nodeclaim::RequirementOperator;

    /// A Karpenter `karpenter.sh/v1` NodePool for AKS with only its apiVersion changed.
    const KARPENTER_NODEPOOL: &str = r#"
apiVersion: tailor.sh/v1alpha1
kind: NodePool
metadata:
  name: general-purpose
spec:
  template:
    metadata:
      labels:
        team: platform
      annotations:
        example.com/owner: platform-team
    spec:
      nodeClassRef:
        group: karpenter.azure.com
        kind: AKSNodeClass
        name: default
      requirements:
        - key: kubernetes.io/arch
          operator: In
          values: ["amd64"]
        - key: karpenter.azure.com/sku-family
          operator: In
          values: ["D", "E", "F"]
          minValues: 2
        - key: karpenter.sh/capacity-type
          operator: In
          values: ["spot", "on-demand"]
        - key: karpenter.azure.com/sku-cpu
          operator: Lt
          values: ["33"]
        - key: topology.kubernetes.io/zone
          operator: Exists
      taints:
        - key: example.com/dedicated
          value: batch
          effect: NoSchedule
      startupTaints:
        - key: example.com/agent-not-ready
          effect: NoExecute
      expireAfter: 336h
      terminationGracePeriod: 48h
  disruption:
    consolidationPolicy: WhenEmpty
    consolidateAfter: 5m
    budgets:
      - nodes: "20%"
        reasons: [Empty, Drifted]
      - nodes: "0"
        schedule: "0 9 * * mon-fri"
        duration: 8h
  limits:
    cpu: 1000
    memory: 1000Gi
  weight: 50
"#;

    #[test]
    fn a_karpenter_nodepool_parses_once_its_api_version_is_changed()
    -> Result<(), Box<dyn std::error::Error>> {
        let pool: NodePool = serde_yaml::from_str(KARPENTER_NODEPOOL)?;
        let template = &pool.spec.template;
        assert_eq!(template.metadata.labels["team"], "platform");
        assert_eq!(
            template.metadata.annotations["example.com/owner"],
            "platform-team"
        );

        let spec = &template.spec;
        assert!(spec.node_class_ref.is_aks_node_class());
        assert_eq!(spec.requirements.len(), 5);
        let family = &spec.requirements[1];
        assert_eq!(family.canonical_key(), labels::SKU_FAMILY);
        assert_eq!(family.operator, RequirementOperator::In);
        assert_eq!(family.values, ["D", "E", "F"]);
        assert_eq!(family.min_values, Some(2));
        assert_eq!(spec.requirements[2].canonical_key(), labels::CAPACITY_TYPE);
        assert_eq!(spec.requirements[3].operator, RequirementOperator::Lt);
        assert!(spec.requirements[4].values.is_empty());
        assert_eq!(spec.taints[0].key, "example.com/dedicated");
        assert_eq!(spec.taints[0].value.as_deref(), Some("batch"));
        assert_eq!(spec.startup_taints[0].effect, "NoExecute");
        assert_eq!(spec.expire_after()?, Some(SignedDuration::from_hours(336)));
        assert_eq!(
            spec.termination_grace_period()?,
            Some(SignedDuration::from_hours(48))
        );

        let disruption = &pool.spec.disruption;
        assert_eq!(
            disruption.consolidation_policy,
            ConsolidationPolicy::WhenEmpty
        );
        assert_eq!(
            disruption.consolidate_after()?,
            Some(SignedDuration::from_mins(5))
        );
        assert_eq!(disruption.budgets.len(), 2);
        assert_eq!(disruption.budgets[0].nodes()?, BudgetNodes::Percent(20));
        assert!(disruption.budgets[0].applies_to(DisruptionReason::Drifted));
        assert!(!disruption.budgets[0].applies_to(DisruptionReason::Underutilized));
        assert_eq!(disruption.budgets[1].nodes()?, BudgetNodes::Count(0));
        assert_eq!(
            disruption.budgets[1].schedule.as_deref(),
            Some("0 9 * * mon-fri")
        );
        assert_eq!(
            disruption.budgets[1].window()?,
            Some(SignedDuration::from_hours(8))
        );
        assert!(disruption.budgets[1].applies_to(DisruptionReason::Underutilized));

        assert_eq!(pool.spec.limits["cpu"].0, "1000");
        assert_eq!(pool.spec.limits["memory"].0, "1000Gi");
        assert_eq!(pool.spec.weight, Some(50));
        Ok(())
    }

    #[test]
    fn a_minimal_nodepool_gets_karpenters_defaults() -> Result<(), Box<dyn std::error::Error>> {
        let pool: NodePool = serde_yaml::from_str(
            "apiVersion: tailor.sh/v1alpha1\nkind: NodePool\nmetadata: {name: p}\n\
             spec: {template: {spec: {nodeClassRef: {name: default}}}}\n",
        )?;
        let spec = &pool.spec;
        assert_eq!(
            spec.template.spec.expire_after()?,
            Some(SignedDuration::from_hours(720))
        );
        assert_eq!(spec.template.spec.termination_grace_period()?, None);
        assert_eq!(
            spec.disruption.consolidation_policy,
            ConsolidationPolicy::WhenEmptyOrUnderutilized
        );
        assert_eq!(
            spec.disruption.consolidate_after()?,
            Some(SignedDuration::ZERO)
        );
        assert_eq!(spec.disruption.budgets, vec![Budget::default()]);
        assert_eq!(
            spec.disruption.budgets[0].nodes()?,
            BudgetNodes::Percent(10)
        );
        assert_eq!(spec.weight, None);
        Ok(())
    }

    #[test]
    fn consolidate_after_never_switches_consolidation_off() -> Result<(), Box<dyn std::error::Error>>
    {
        let disruption = Disruption {
            consolidate_after: "Never".into(),
            ..Disruption::default()
        };
        assert_eq!(disruption.consolidate_after()?, None);
        Ok(())
    }

    #[test]
    fn percentage_budgets_round_up_and_counts_are_absolute() {
        assert_eq!(BudgetNodes::Percent(10).allowed(5), 1);
        assert_eq!(BudgetNodes::Percent(10).allowed(19), 2);
        assert_eq!(BudgetNodes::Percent(10).allowed(20), 2);
        assert_eq!(BudgetNodes::Percent(0).allowed(20), 0);
        assert_eq!(BudgetNodes::Percent(100).allowed(7), 7);
        assert_eq!(BudgetNodes::Count(3).allowed(1), 3);
    }

    #[test]
    fn malformed_budget_nodes_are_rejected() {
        for bad in ["", "ten", "101%", "-1", "5.5"] {
            let budget = Budget {
                nodes: bad.into(),
                ..Budget::default()
            };
            assert!(budget.nodes().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_nodepool_serialises_back_to_the_same_object() -> Result<(), serde_yaml::Error> {
        let pool: NodePool = serde_yaml::from_str(KARPENTER_NODEPOOL)?;
        let again: NodePool = serde_yaml::from_str(&serde_yaml::to_string(&pool)?)?;
        assert_eq!(pool, again);
        Ok(())
    }
}
