//! `Recommendation`: Tailor's current right-sizing advice for one workload, with bounds,
//! confidence, reasons and cost effect per container. `kubectl get recommendations -A` reads as
//! a savings report.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::apis::ResourceList;

/// Hours in the average month, used to turn hourly cost into monthly cost (730 = 8760 / 12).
pub const HOURS_PER_MONTH: f64 = 730.0;

/// Condition types of a Recommendation.
pub mod condition {
    /// There is enough usage history for a recommendation.
    pub const READY: &str = "Ready";
    /// The recommended requests are in effect on the workload's pods.
    pub const APPLIED: &str = "Applied";
    /// The recommendation may be acted on in `Auto` mode: enough history, fresh usage.
    pub const ACTIONABLE: &str = "Actionable";
    /// The usage behind the recommendation could not be refreshed (Prometheus unreachable,
    /// failing or behind): it is shown as last computed and nothing is changed for it.
    pub const STALE: &str = "Stale";
}

/// Condition reasons Tailor writes on Recommendations.
pub mod reason {
    /// The containers have less usage history than the policy's `minimumHistory`.
    pub const INSUFFICIENT_HISTORY: &str = "InsufficientHistory";
    /// The recommendation is computed.
    pub const RECOMMENDED: &str = "Recommended";
    /// The policy is in `Recommend` mode, so nothing is applied.
    pub const RECOMMEND_ONLY: &str = "RecommendOnly";
    /// A HorizontalPodAutoscaler scales the workload on a right-sized resource and the policy
    /// says `hpa: Skip`.
    pub const SKIPPED_FOR_HPA: &str = "SkippedForHPA";
    /// The difference from the current requests is below the policy's `minChangeFraction`.
    pub const WITHIN_HYSTERESIS: &str = "WithinHysteresis";
    /// The recommended requests were applied.
    pub const APPLIED: &str = "Applied";
    /// Applying failed; the message says why.
    pub const APPLY_FAILED: &str = "ApplyFailed";
    /// No usage of the workload's containers was found in the history.
    pub const NO_USAGE: &str = "NoUsage";
    /// Usage samples cover too little of the history (gaps): shown, not acted on.
    pub const PARTIAL_DATA: &str = "PartialData";
    /// The last read of usage succeeded and its newest sample is recent.
    pub const FRESH: &str = "UsageFresh";
    /// Prometheus could not be reached or failed a query.
    pub const USAGE_UNAVAILABLE: &str = "UsageUnavailable";
    /// The newest usage sample is older than the staleness threshold.
    pub const USAGE_TOO_OLD: &str = "UsageTooOld";
    /// The recommendation may be applied in `Auto` mode.
    pub const ACTIONABLE: &str = "Actionable";
}

/// The workload a Recommendation is for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetReference {
    /// API version of the workload, for example `apps/v1`.
    #[schemars(length(min = 1))]
    pub api_version: String,
    /// Kind of the workload, for example `Deployment`.
    #[schemars(length(min = 1))]
    pub kind: String,
    /// Name of the workload, in the Recommendation's namespace.
    #[schemars(length(min = 1))]
    pub name: String,
}

/// Which workload a Recommendation is for and which policy produced it.
// The typed `printcolumn(...)` lists repeat keys such as `type_`, which clippy mistakes for
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tailor.sh",
    version = "v1alpha1",
    kind = "Recommendation",
    plural = "recommendations",
    singular = "recommendation",
    namespaced,
    status = "RecommendationStatus",
    derive = "PartialEq",
    shortname = "rec",
    category = "tailor",
    doc = "Tailor's current right-sizing advice for one workload: per container the current, recommended, lower and upper requests, the confidence and reasons, and what the change does to cost. Written by Tailor; read it, do not edit it.",
    printcolumn(
        name = "Workload",
        type_ = "string",
        json_path = ".status.summary.workload"
    ),
    printcolumn(
        name = "Containers",
        type_ = "integer",
        json_path = ".status.summary.containers"
    ),
    printcolumn(
        name = "CPU",
        type_ = "string",
        json_path = ".status.summary.cpu",
        description = "CPU requests of all containers, current -> recommended"
    ),
    printcolumn(
        name = "Memory",
        type_ = "string",
        json_path = ".status.summary.memory",
        description = "Memory requests of all containers, current -> recommended"
    ),
    printcolumn(
        name = "$/Month",
        type_ = "number",
        json_path = ".status.summary.monthlyCostDelta",
        description = "USD per month the recommendation adds (negative: saves) over all replicas' requests"
    ),
    printcolumn(
        name = "Confidence",
        type_ = "number",
        json_path = ".status.summary.confidence"
    ),
    printcolumn(name = "Mode", type_ = "string", json_path = ".status.mode"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Actionable",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Actionable\")].status",
        description = "Whether there is enough recent history to act on the recommendation"
    ),
    printcolumn(
        name = "Stale",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Stale\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Policy",
        type_ = "string",
        json_path = ".spec.policyRef",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RecommendationSpec {
    /// The workload the recommendation is for.
    pub target_ref: TargetReference,
    /// Name of the RightsizingPolicy that governs the workload. Unset: the cluster default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_ref: Option<String>,
}

/// Requests and limits of one container.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerResources {
    /// Requests, by resource name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: ResourceList,
    /// Limits, by resource name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: ResourceList,
}

/// The recommendation for one container of the workload.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerRecommendation {
    /// Container name, as in the pod template (init and sidecar containers included).
    pub name: String,
    /// Requests and limits the pod template sets today.
    #[serde(default)]
    pub current: ContainerResources,
    /// Requests and limits Tailor recommends.
    #[serde(default)]
    pub recommended: ContainerResources,
    /// Smallest requests that still cover usage at the policy's lower percentiles; below these
    /// the container is likely starved.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub lower: ResourceList,
    /// Requests that cover usage at the policy's upper percentiles; above these the container
    /// is likely over-provisioned.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub upper: ResourceList,
    /// How much the recommendation can be trusted, from 0 (no history) to 1 (a full history
    /// window of steady usage).
    #[serde(default)]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub confidence: f64,
    /// Why the recommendation is what it is, for example `capped at policy max` or
    /// `raised after OOM kill`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// Change in monthly cost of this container across all replicas if the recommendation is
    /// applied, in USD; negative means savings.
    #[serde(default)]
    pub monthly_cost_delta: f64,
}

/// The whole workload in one line, for `kubectl get recommendations`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecommendationSummary {
    /// `Kind/name` of the workload.
    pub workload: String,
    /// Containers with a recommendation.
    pub containers: i32,
    /// Sum of the containers' CPU requests, current -> recommended (`2 -> 350m`).
    pub cpu: String,
    /// Sum of the containers' memory requests, current -> recommended (`4Gi -> 1200Mi`).
    pub memory: String,
    /// USD per month the recommendation adds (negative: saves), per container summed.
    pub monthly_cost_delta: f64,
    /// The lowest confidence of the containers (0 to 1).
    pub confidence: f64,
}

/// Tailor's recommendation and its effect.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecommendationStatus {
    /// One entry per container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub containers: Vec<ContainerRecommendation>,
    /// Change in hourly cost of the whole workload if the recommendation is applied, in USD;
    /// negative means savings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hourly_cost_delta: Option<f64>,
    /// USD per month saved by applying the recommendation (the negated monthly cost delta);
    /// negative when the workload needs more than it asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monthly_savings: Option<f64>,
    /// When the recommendation was last computed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
    /// Ready, Actionable, Stale, Applied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The mode that governs the workload: `Recommend` or `Auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// The workload in one line, for printer columns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<RecommendationSummary>,
    /// Unix second up to which usage has been read into the checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_read_until: Option<i64>,
    /// The recommender's histograms for this workload (JSON, opaque), so a restarted or
    /// new leader continues them instead of reading the whole history again. Written by
    /// Tailor; do not edit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
}

impl RecommendationStatus {
    /// Sets `hourlyCostDelta` and the matching `monthlySavings` together so they never disagree.
    pub fn set_hourly_cost_delta(&mut self, hourly_usd: f64) {
        self.hourly_cost_delta = Some(hourly_usd);
        self.monthly_savings = Some(-hourly_usd * HOURS_PER_MONTH);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RECOMMENDATION: &str = r#"
apiVersion: tailor.sh/v1alpha1
kind: Recommendation
metadata: {name: deployment-checkout, namespace: shop}
spec:
  targetRef: {apiVersion: apps/v1, kind: Deployment, name: checkout}
  policyRef: default
status:
  hourlyCostDelta: -0.042
  monthlySavings: 30.66
  lastUpdateTime: "2025-03-01T12:00:00Z"
  containers:
    - name: app
      current:
        requests: {cpu: "2", memory: 4Gi}
        limits: {memory: 4Gi}
      recommended:
        requests: {cpu: 350m, memory: 1200Mi}
        limits: {memory: 1200Mi}
      lower: {cpu: 200m, memory: 900Mi}
      upper: {cpu: 600m, memory: 1500Mi}
      confidence: 0.83
      reasons: ["cpu at p90 of 14d usage + 15% margin"]
      monthlyCostDelta: -30.66
"#;

    #[test]
    fn a_recommendation_carries_bounds_confidence_and_cost_per_container()
    -> Result<(), serde_yaml::Error> {
        let rec: Recommendation = serde_yaml::from_str(RECOMMENDATION)?;
        assert_eq!(rec.spec.target_ref.kind, "Deployment");
        assert_eq!(rec.spec.policy_ref.as_deref(), Some("default"));
        let status = rec.status.unwrap_or_default();
        let app = &status.containers[0];
        assert_eq!(app.current.requests["cpu"].0, "2");
        assert_eq!(app.recommended.requests["memory"].0, "1200Mi");
        assert_eq!(app.lower["cpu"].0, "200m");
        assert_eq!(app.upper["memory"].0, "1500Mi");
        assert!((app.confidence - 0.83).abs() < 1e-9);
        assert!(app.monthly_cost_delta < 0.0);
        assert_eq!(status.hourly_cost_delta, Some(-0.042));
        assert!(status.last_update_time.is_some());
        Ok(())
    }

    #[test]
    fn monthly_savings_are_the_negated_hourly_delta_over_an_average_month() {
        let mut status = RecommendationStatus::default();
        status.set_hourly_cost_delta(-0.042);
        let savings = status.monthly_savings.unwrap_or_default();
        assert!((savings - 30.66).abs() < 1e-9, "{savings}");
    }
}
