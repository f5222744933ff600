//! `RightsizingPolicy`: which workloads Tailor right-sizes, how it computes their requests from
//! usage history, and whether and how it applies them.
//!
//! Policies are namespaced and govern workloads in their own namespace. The policy named
//! [`DEFAULT_POLICY_NAME`] (`default`) in the agent's own namespace is the cluster-wide default: it
//! governs every workload that no policy of its own namespace selects.
//!
//! When several policies of a namespace select one workload, the most specific governs it:
//! a policy naming it in `targetRefs`, then one whose `selector` matches it, then one with
//! neither; among equals the first by name. The others get the `Overlapping` condition,
//! naming the workloads (up to [`OVERLAPPING_LISTED`]) and the policy that governs each.

use jiff::SignedDuration;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::apis::Result;
use crate::apis::duration::{DURATION_PATTERN, parse_duration};

/// Name of the cluster-wide default policy, looked up in the agent's own namespace.
pub const DEFAULT_POLICY_NAME: &str = "default";

/// Workloads an `Overlapping` condition names; the message counts the rest.
pub const OVERLAPPING_LISTED: usize = 5;

/// Condition types of a RightsizingPolicy.
pub mod condition {
    /// The policy is valid and in use.
    pub const READY: &str = "Ready";
    /// Another policy wins some of the workloads this one selects (the message names them).
    pub const OVERLAPPING: &str = "Overlapping";
}

/// Condition reasons Tailor writes on RightsizingPolicies.
pub mod reason {
    /// The policy is valid and in use.
    pub const ACTIVE: &str = "Active";
    /// A field holds a value the API server accepted but Tailor cannot use (see the message).
    pub const INVALID: &str = "Invalid";
    /// Another policy in the namespace also selects some of this policy's workloads.
    pub const OVERLAPPING: &str = "Overlapping";
    /// No other policy wins a workload this one selects.
    pub const EXCLUSIVE: &str = "Exclusive";
}

/// Whether Tailor only recommends or also applies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Mode {
    /// Write Recommendations and metrics; change nothing in the cluster.
    #[default]
    Recommend,
    /// Apply recommended requests, and plan nodes with them.
    Auto,
}

/// A resource Tailor right-sizes.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum ResourceKind {
    /// CPU requests.
    Cpu,
    /// Memory requests.
    Memory,
}

impl ResourceKind {
    /// The resource name as Kubernetes resource lists spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Memory => "memory",
        }
    }
}

/// How applied recommendations reach the pods.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum UpdateMode {
    /// Resize running pods in place (the pod `resize` subresource); no restart where the
    /// container's resize policy allows it.
    #[default]
    InPlace,
    /// Set requests only on new pods, through Tailor's admission webhook.
    OnCreate,
    /// Patch the workload's pod template, which rolls its pods.
    RollingRestart,
}

/// What happens to limits when requests change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum LimitsPolicy {
    /// Scale each limit by the same factor as its request.
    #[default]
    KeepRatio,
    /// Remove CPU limits (avoids throttling); treat memory limits as KeepRatio.
    DropCpu,
    /// Leave limits as they are (raising a request above its limit raises the limit to match).
    Keep,
    /// Remove all limits.
    Remove,
}

/// How CPU savings are traded against short minutes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Profile {
    /// Every container is safe on its own: its CPU request leaves at most a few percent of
    /// its minutes short, never lets a five-minute window's demand reach twice the request
    /// more than rarely, and covers a batch container's running phase. The policy's
    /// containers share a small budget of short minutes above those floors.
    #[default]
    Balanced,
    /// Cost first: the policy's containers share a larger budget of short minutes, spent
    /// wherever it spares the most cores, with no per-container floor: a few containers
    /// may run short often to pay for the fleet. Recommendations say what each container
    /// trades.
    CostFirst,
}

/// What Tailor does with workloads that a HorizontalPodAutoscaler scales on the same resource.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum HpaPolicy {
    /// Leave them alone: changing requests would move the HPA's utilisation target.
    #[default]
    Skip,
    /// Right-size them and rescale the HPA's utilisation target so the scaling point stays put.
    AllowWithTargetScaling,
}

/// A workload the policy names directly.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadReference {
    /// Workload kind: Deployment, StatefulSet, DaemonSet, CronJob, Job or Rollout.
    #[schemars(length(min = 1))]
    pub kind: String,
    /// Workload name, in the policy's namespace.
    #[schemars(length(min = 1))]
    pub name: String,
}

fn default_resources() -> Vec<ResourceKind> {
    vec![ResourceKind::Cpu, ResourceKind::Memory]
}
fn default_cpu_percentile() -> f64 {
    0.5
}
fn default_cpu_margin() -> f64 {
    0.0
}
fn default_memory_margin() -> f64 {
    0.04
}
fn default_burst_percentile() -> Option<f64> {
    Some(0.99)
}
fn default_burst_max_raise() -> f64 {
    2.0
}
fn default_lower_percentile() -> f64 {
    0.5
}
fn default_cpu_upper_percentile() -> f64 {
    0.95
}
fn default_memory_percentile() -> f64 {
    0.9
}
fn default_memory_upper_percentile() -> f64 {
    0.99
}
fn default_peak_days() -> u32 {
    7
}
fn default_history_window() -> String {
    "336h".to_owned()
}
fn default_minimum_history() -> String {
    "12h".to_owned()
}
fn default_half_life() -> String {
    "24h".to_owned()
}
fn default_max_step() -> f64 {
    0.5
}
fn default_min_replicas() -> i32 {
    1
}
fn default_min_change() -> f64 {
    0.1
}
fn default_oom_bump_fraction() -> f64 {
    0.2
}
fn default_oom_min_bump() -> Quantity {
    Quantity("100Mi".to_owned())
}

/// How CPU requests are computed from usage samples.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.lowerPercentile <= self.percentile && self.percentile <= self.upperPercentile").message("percentiles must satisfy lowerPercentile <= percentile <= upperPercentile"))]
pub struct CpuPolicy {
    /// Percentile of decayed CPU usage samples the request covers at least (0 to 1): the
    /// sustained level. Above it the request rises to where covering more samples would
    /// waste more than it spares; CPU is compressible, so bursts above the request borrow
    /// the node's slack (see `burstPercentile`).
    #[serde(default = "default_cpu_percentile")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub percentile: f64,
    /// Percentile reported as the lower bound of the recommendation.
    #[serde(default = "default_lower_percentile")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub lower_percentile: f64,
    /// Percentile reported as the upper bound of the recommendation.
    #[serde(default = "default_cpu_upper_percentile")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub upper_percentile: f64,
    /// Smallest CPU request Tailor recommends, for example `10m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<Quantity>,
    /// Largest CPU request Tailor recommends, for example `8`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<Quantity>,
    /// Percentile of CPU usage that bursts reach (0 to 1): the request is at least this
    /// percentile divided by `burstHeadroom`, so bursts rarely need more than that many
    /// times the request. `null` turns the burst guard off.
    #[serde(default = "default_burst_percentile")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub burst_percentile: Option<f64>,
    /// The burst guard raises the request at most this many times the sustained level; a
    /// rarer, taller burst (a batch spike) is left to the node's slack rather than reserved
    /// around the clock. 0 removes the cap.
    #[serde(default = "default_burst_max_raise")]
    #[schemars(range(min = 0.0, max = 100.0))]
    pub burst_max_raise: f64,
    /// How many times its request a burst may use (CPU is compressible; limits and node
    /// slack carry the burst).
    #[serde(default = "default_burst_headroom")]
    #[schemars(range(min = 1.0, max = 10.0))]
    pub burst_headroom: f64,
    /// Headroom on top of the computed CPU request (0.1: 10% more). None by default: the
    /// request already covers the usage up to the level where more would waste more than
    /// it spares, and a margin on top of that level only adds waste.
    #[serde(default = "default_cpu_margin")]
    #[schemars(range(min = 0.0, max = 10.0))]
    pub safety_margin_fraction: f64,
    /// Size a container with a sustained running phase (a batch worker idle most of the day,
    /// working in runs of a quarter of an hour or more) for the median demand of its runs,
    /// all day. Off by default: a worker busy a few percent of the day would reserve its
    /// runs' cores around the clock; the short-minute floor of the `Balanced` profile
    /// already covers runs that take more than a few percent of the minutes, and Jobs and
    /// CronJobs, whose pods exist only while they run, are sized from their runs alone.
    #[serde(default)]
    pub cover_running_phase: bool,
}

fn default_burst_headroom() -> f64 {
    3.0
}

impl Default for CpuPolicy {
    fn default() -> Self {
        Self {
            percentile: default_cpu_percentile(),
            lower_percentile: default_lower_percentile(),
            upper_percentile: default_cpu_upper_percentile(),
            min: None,
            max: None,
            burst_percentile: default_burst_percentile(),
            burst_max_raise: default_burst_max_raise(),
            burst_headroom: default_burst_headroom(),
            safety_margin_fraction: default_cpu_margin(),
            cover_running_phase: false,
        }
    }
}

/// How memory requests are computed. Memory is sized from daily peaks, not from samples, since
/// running short of memory kills the container rather than slowing it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.lowerPercentile <= self.percentile && self.percentile <= self.upperPercentile").message("percentiles must satisfy lowerPercentile <= percentile <= upperPercentile"))]
pub struct MemoryPolicy {
    /// Percentile of the daily memory peaks (working set) that becomes the request (0 to 1).
    #[serde(default = "default_memory_percentile")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub percentile: f64,
    /// Percentile of daily peaks reported as the lower bound of the recommendation.
    #[serde(default = "default_lower_percentile")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub lower_percentile: f64,
    /// Percentile of daily peaks reported as the upper bound of the recommendation.
    #[serde(default = "default_memory_upper_percentile")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub upper_percentile: f64,
    /// Smallest memory request Tailor recommends, for example `32Mi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<Quantity>,
    /// Largest memory request Tailor recommends, for example `16Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<Quantity>,
    /// Follow rising daily peaks: when peaks grow day over day (a leak, a growing cache),
    /// size for the peak projected a day ahead. Off by default.
    #[serde(default)]
    pub trend: bool,
    /// The request covers at least the highest daily peak of this many recent days (0 to 14;
    /// 0 leaves memory to the percentile alone, as VPA does).
    #[serde(default = "default_peak_days")]
    #[schemars(range(min = 0, max = 14))]
    pub peak_days: u32,
    /// Headroom on top of the computed memory request (0.04: 4% more). Small, because the
    /// request already covers the highest daily peak of `peakDays`.
    #[serde(default = "default_memory_margin")]
    #[schemars(range(min = 0.0, max = 10.0))]
    pub safety_margin_fraction: f64,
}

impl Default for MemoryPolicy {
    fn default() -> Self {
        Self {
            percentile: default_memory_percentile(),
            lower_percentile: default_lower_percentile(),
            upper_percentile: default_memory_upper_percentile(),
            min: None,
            max: None,
            trend: false,
            peak_days: default_peak_days(),
            safety_margin_fraction: default_memory_margin(),
        }
    }
}

/// How and how fast applied recommendations change pods.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpdatePolicy {
    /// How new requests reach the pods: `InPlace` (resize running pods), `OnCreate` (admission
    /// webhook on new pods only) or `RollingRestart` (patch the pod template).
    #[serde(default)]
    pub mode: UpdateMode,
    /// Largest relative change of a request in one step (0.5: at most halve or grow by half).
    #[serde(default = "default_max_step")]
    #[schemars(range(min = 0.0, max = 10.0))]
    pub max_step_fraction: f64,
    /// Smallest relative change worth applying; smaller differences are left alone so pods are
    /// not resized back and forth.
    #[serde(default = "default_min_change")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub min_change_fraction: f64,
    /// `InPlace` falls back to evicting a pod whose resize the node cannot make
    /// (`Infeasible`, `Deferred` for more than 5 minutes, or refused); it evicts only while
    /// at least this many of the workload's pods stay available (running, ready, not
    /// terminating) besides the evicted ones, and only when the pod's PodDisruptionBudget
    /// allows. The default 1 never evicts the only pod of a single-replica workload; 0
    /// allows it.
    #[serde(default = "default_min_replicas")]
    #[schemars(range(min = 0))]
    pub min_replicas: i32,
}

impl Default for UpdatePolicy {
    fn default() -> Self {
        Self {
            mode: UpdateMode::default(),
            max_step_fraction: default_max_step(),
            min_change_fraction: default_min_change(),
            min_replicas: default_min_replicas(),
        }
    }
}

/// Which workloads Tailor right-sizes and how.
// The typed `printcolumn(...)` lists repeat keys such as `type_`, which clippy mistakes for
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tailor.sh",
    version = "v1alpha1",
    kind = "RightsizingPolicy",
    plural = "rightsizingpolicies",
    singular = "rightsizingpolicy",
    namespaced,
    status = "RightsizingPolicyStatus",
    derive = "PartialEq",
    shortname = "rsp",
    category = "tailor",
    doc = "Which workloads of its namespace Tailor right-sizes, how requests are computed from usage history, and whether and how they are applied. The policy named 'default' in the agent's namespace is the cluster-wide default for workloads no policy of their own namespace selects. When several policies select a workload, one naming it in targetRefs governs it, then one whose selector matches, then one with neither, equals by name; the others get the Overlapping condition.",
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.mode"),
    printcolumn(name = "Update", type_ = "string", json_path = ".spec.update.mode"),
    printcolumn(name = "Workloads", type_ = "integer", json_path = ".status.workloads"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RightsizingPolicySpec {
    /// Selects workloads by their labels. With neither selector nor targetRefs the policy covers
    /// every workload in its namespace (for the default policy: in the cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Workloads the policy names directly, in addition to those the selector matches.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target_refs: Vec<WorkloadReference>,
    /// `Recommend`: write Recommendations only. `Auto`: also apply them.
    #[serde(default)]
    pub mode: Mode,
    /// Resources to right-size: `cpu`, `memory` or both.
    #[serde(default = "default_resources")]
    pub resources: Vec<ResourceKind>,
    /// How CPU savings are traded against short minutes: `Balanced` (every container safe
    /// on its own) or `CostFirst` (a fleet budget of short minutes, spent where it saves
    /// the most).
    #[serde(default)]
    pub profile: Profile,
    /// How CPU requests are computed.
    #[serde(default)]
    pub cpu: CpuPolicy,
    /// How memory requests are computed.
    #[serde(default)]
    pub memory: MemoryPolicy,
    /// How much usage history is read, as a Go duration (`336h` is two weeks).
    #[serde(default = "default_history_window")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub history_window: String,
    /// Least usage history a container needs before its recommendation is applied; with
    /// less it is reported, not actionable. Half a daily cycle by default; every change is
    /// stepped (`update.maxStepFraction`), and an OOM kill raises memory at once.
    #[serde(default = "default_minimum_history")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub minimum_history: String,
    /// Age at which a usage sample counts half as much as a fresh one.
    #[serde(default = "default_half_life")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub half_life: String,
    /// How applied recommendations reach the pods, and how fast.
    #[serde(default)]
    pub update: UpdatePolicy,
    /// What happens to limits: `KeepRatio`, `DropCpu`, `Keep` or `Remove`.
    #[serde(default)]
    pub limits: LimitsPolicy,
    /// Workloads scaled by a HorizontalPodAutoscaler on the same resource: `Skip` them or
    /// `AllowWithTargetScaling`.
    #[serde(default)]
    pub hpa: HpaPolicy,
    /// After an out-of-memory kill, raise the memory request by this fraction, or by
    /// `oomMinBump` if that is larger.
    #[serde(default = "default_oom_bump_fraction")]
    #[schemars(range(min = 0.0, max = 10.0))]
    pub oom_bump_fraction: f64,
    /// Smallest raise of the memory request after an out-of-memory kill.
    #[serde(default = "default_oom_min_bump")]
    pub oom_min_bump: Quantity,
}

impl RightsizingPolicySpec {
    /// Whether the policy right-sizes `resource`.
    pub fn covers(&self, resource: ResourceKind) -> bool {
        self.resources.contains(&resource)
    }

    /// `historyWindow` as a duration.
    pub fn history_window(&self) -> Result<SignedDuration> {
        parse_duration(&self.history_window)
    }

    /// `minimumHistory` as a duration.
    pub fn minimum_history(&self) -> Result<SignedDuration> {
        parse_duration(&self.minimum_history)
    }

    /// `halfLife` as a duration.
    pub fn half_life(&self) -> Result<SignedDuration> {
        parse_duration(&self.half_life)
    }
}

impl Default for RightsizingPolicySpec {
    /// The settings of a policy with an empty spec.
    fn default() -> Self {
        Self {
            selector: None,
            target_refs: Vec::new(),
            mode: Mode::default(),
            resources: default_resources(),
            profile: Profile::default(),
            cpu: CpuPolicy::default(),
            memory: MemoryPolicy::default(),
            history_window: default_history_window(),
            minimum_history: default_minimum_history(),
            half_life: default_half_life(),
            update: UpdatePolicy::default(),
            limits: LimitsPolicy::default(),
            hpa: HpaPolicy::default(),
            oom_bump_fraction: default_oom_bump_fraction(),
            oom_min_bump: default_oom_min_bump(),
        }
    }
}

/// What Tailor observed about a RightsizingPolicy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RightsizingPolicyStatus {
    /// Ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Generation of the spec the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Number of workloads the policy currently governs.
    #[serde(default)]
    pub workloads: i32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_policy_recommends_both_resources_with_the_documented_defaults()
    -> Result<(), Box<dyn std::error::Error>> {
        let policy: RightsizingPolicy = serde_yaml::from_str(
            "apiVersion: tailor.sh/v1alpha1\nkind: RightsizingPolicy\n\
             metadata: {name: default, namespace: tailor-system}\nspec: {}\n",
        )?;
        let spec = &policy.spec;
        assert_eq!(spec, &RightsizingPolicySpec::default());
        assert_eq!(spec.mode, Mode::Recommend);
        assert!(spec.covers(ResourceKind::Cpu) && spec.covers(ResourceKind::Memory));
        assert_eq!(spec.cpu.percentile, 0.5);
        assert_eq!(spec.cpu.burst_percentile, Some(0.99));
        assert_eq!(spec.cpu.safety_margin_fraction, 0.0);
        assert_eq!(spec.memory.peak_days, 7);
        assert_eq!(spec.memory.safety_margin_fraction, 0.04);
        assert_eq!(spec.cpu.lower_percentile, 0.5);
        assert_eq!(spec.cpu.upper_percentile, 0.95);
        assert_eq!(spec.memory.percentile, 0.9);
        assert_eq!(spec.history_window()?, SignedDuration::from_hours(336));
        assert_eq!(spec.minimum_history()?, SignedDuration::from_hours(12));
        assert_eq!(spec.half_life()?, SignedDuration::from_hours(24));
        assert_eq!(spec.update.mode, UpdateMode::InPlace);
        assert_eq!(spec.update.max_step_fraction, 0.5);
        assert_eq!(spec.update.min_change_fraction, 0.1);
        assert_eq!(spec.update.min_replicas, 1);
        assert_eq!(spec.limits, LimitsPolicy::KeepRatio);
        assert_eq!(spec.hpa, HpaPolicy::Skip);
        assert_eq!(spec.oom_bump_fraction, 0.2);
        assert_eq!(spec.oom_min_bump.0, "100Mi");
        assert_eq!(policy.metadata.name.as_deref(), Some(DEFAULT_POLICY_NAME));
        Ok(())
    }

    #[test]
    fn a_policy_selects_workloads_by_label_and_by_name() -> Result<(), serde_yaml::Error> {
        let spec: RightsizingPolicySpec = serde_yaml::from_str(
            r#"
selector:
  matchLabels: {tier: web}
targetRefs:
  - {kind: Deployment, name: checkout}
mode: Auto
resources: [memory]
memory: {percentile: 0.95, min: 64Mi, max: 4Gi}
update: {mode: OnCreate}
limits: DropCpu
hpa: AllowWithTargetScaling
"#,
        )?;
        let labels = spec.selector.as_ref().and_then(|s| s.match_labels.clone());
        assert_eq!(labels.unwrap_or_default()["tier"], "web");
        assert_eq!(spec.target_refs[0].name, "checkout");
        assert_eq!(spec.mode, Mode::Auto);
        assert!(!spec.covers(ResourceKind::Cpu));
        assert_eq!(spec.memory.percentile, 0.95);
        assert_eq!(spec.memory.max.as_ref().map(|q| q.0.as_str()), Some("4Gi"));
        assert_eq!(spec.update.mode, UpdateMode::OnCreate);
        assert_eq!(spec.update.max_step_fraction, 0.5);
        assert_eq!(spec.limits, LimitsPolicy::DropCpu);
        assert_eq!(spec.hpa, HpaPolicy::AllowWithTargetScaling);
        Ok(())
    }
}
