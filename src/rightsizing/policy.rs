//! A `RightsizingPolicy` parsed once into plain numbers for the recommender.

use crate::apis::{
    HpaPolicy, LimitsPolicy, Mode, Profile, ResourceKind, RightsizingPolicySpec, UpdateMode,
};
use crate::model::quantity;

/// Most recent days whose memory peaks a policy can ask to cover.
pub const MAX_PEAK_DAYS: u32 = 14;

/// The weight of a starved share of CPU samples against waste (relative to the mean use)
/// when a container's CPU is sized alone, without a fleet's starvation price: the request
/// is at least the level minimising `waste / mean + weight * starved share` over the
/// decayed usage histogram
/// (`DecayingHistogram::level_minimising_waste_and_starvation`). Chosen on the backtest's
/// tuning seeds with the default CPU margin of 0, throttled demand estimated as
/// `usage * (1 + share / 2)`, and the floor (p70) and burst headroom (2) of that time,
/// before the fleet's budget: 1.5 starved 9.3% of the samples, more than KRR's 8.6%; 1.75
/// starves 7.8% at 0.66x VPA's CPU waste (on the held-out seeds 7.4% and 0.74x).
pub const DEFAULT_CPU_STARVATION_WEIGHT: f64 = 1.75;

/// The share of CPU samples the containers of one policy, sized together, may leave above
/// their requests in their own history ([`Policy::cpu_starvation_budget`]). Chosen on the
/// backtest's tuning set together with the CPU percentile floor (p50) and the burst
/// headroom (3), as the setting of least CPU waste that starves the scored minutes at
/// least half a point less than KRR (8.6%): 7.25% starves 8.0% at 0.59x VPA's CPU waste.
/// The earlier 7% with a p70 floor and a headroom of 2 starved 7.8% at 0.62x; 7.5% starves
/// 8.3%, too close to KRR.
pub const DEFAULT_CPU_STARVATION_BUDGET: f64 = 0.0725;

/// The `Balanced` profile's fleet budget: none. Each container is sized by its own floors
/// ([`BALANCED_CPU_SHORT_CAP`], [`BALANCED_CPU_SEVERE_CAP`]) and its own trade
/// ([`DEFAULT_CPU_STARVATION_WEIGHT`]), so a policy per workload and one policy for all give
/// the same requests. On the backtest's tuning set a 2-4% budget changed no figure of a
/// 110-container fleet (the floors already leave 3.6% of the samples short), while a fleet
/// of one container spent it on itself: 3% covered a batch worker's bursts all day and
/// took CPU waste to 2.2-3x VPA's.
pub const BALANCED_CPU_STARVATION_BUDGET: f64 = 0.0;

/// The `Balanced` profile's per-container cap on short minutes: a CPU request leaves at
/// most this share of the container's own decayed samples above it.
pub const BALANCED_CPU_SHORT_CAP: f64 = 0.04;

/// The `Balanced` profile's per-container cap on severe starvation: at most this share of
/// a container's five-minute windows may average more than twice its CPU request.
pub const BALANCED_CPU_SEVERE_CAP: f64 = 0.005;

/// The profile's CPU trade: (fleet budget, per-container short-minute cap, severe cap).
pub fn profile_trade(profile: Profile) -> (f64, f64, f64) {
    match profile {
        Profile::Balanced => (
            BALANCED_CPU_STARVATION_BUDGET,
            BALANCED_CPU_SHORT_CAP,
            BALANCED_CPU_SEVERE_CAP,
        ),
        Profile::CostFirst => (DEFAULT_CPU_STARVATION_BUDGET, 0.0, 0.0),
    }
}

/// Why a policy cannot be used, naming the field and value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rightsizing policy: {field}: {message}")]
pub struct PolicyError {
    /// The field path.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// The recommender's parameters. Defaults are those of [`RightsizingPolicySpec::default`].
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Recommend only, or apply.
    pub mode: Mode,
    /// How applied requests reach the pods.
    pub update: UpdateMode,
    /// Whether CPU requests are managed.
    pub cpu: bool,
    /// Whether memory requests are managed.
    pub memory: bool,
    /// CPU target, lower-bound and upper-bound percentiles of usage samples.
    pub cpu_percentiles: (f64, f64, f64),
    /// Memory target, lower-bound and upper-bound percentiles of daily peaks.
    pub memory_percentiles: (f64, f64, f64),
    /// CPU burst percentile and headroom: the request is at least the burst percentile
    /// divided by the headroom.
    pub cpu_burst: Option<(f64, f64)>,
    /// The burst guard applies only when it raises the request at most this many times
    /// (0: always).
    pub cpu_burst_cap: f64,
    /// How much a starved share of samples weighs against waste when CPU is sized (see
    /// [`DEFAULT_CPU_STARVATION_WEIGHT`]); 0 sizes CPU by the percentile alone.
    pub cpu_starvation_weight: f64,
    /// The share of CPU samples a fleet's requests may leave above them, in the fleet's
    /// own history, where the containers of one policy are sized together
    /// ([`crate::rightsizing::cpu_starvation_price`]); 0 sizes each by the weight alone.
    pub cpu_starvation_budget: f64,
    /// How CPU savings are traded against short minutes; it sets the budget and the caps
    /// below ([`profile_trade`]).
    pub profile: Profile,
    /// Per container, the share of its decayed CPU samples its request may leave above it
    /// (0: no cap).
    pub cpu_short_cap: f64,
    /// Per container, the share of its five-minute windows whose mean may exceed twice its
    /// CPU request (0: no cap).
    pub cpu_severe_cap: f64,
    /// Whether a container with a sustained running phase (a batch worker, idle most of
    /// the day) has its CPU request cover that phase's median demand
    /// (`spec.cpu.coverRunningPhase`).
    pub cpu_running_phase: bool,
    /// Project rising daily memory peaks a day ahead.
    pub memory_trend: bool,
    /// Memory covers at least the highest daily peak of this many recent days (0: off).
    pub memory_peak_days: u32,
    /// CPU floor and ceiling in millicores.
    pub cpu_bounds: (Option<i64>, Option<i64>),
    /// Memory floor and ceiling in bytes.
    pub memory_bounds: (Option<i64>, Option<i64>),
    /// Added on top of the CPU target (0.15 = 15%).
    pub cpu_margin: f64,
    /// Added on top of the memory target.
    pub memory_margin: f64,
    /// How far back to read usage, seconds.
    pub history_window: i64,
    /// Below this much history nothing is applied automatically, seconds.
    pub minimum_history: i64,
    /// Sample weight half-life, seconds.
    pub half_life: i64,
    /// Largest change per update, as a fraction of the current request.
    pub max_step: f64,
    /// Changes smaller than this fraction of the current request are not made.
    pub min_change: f64,
    /// Pods of the workload that must stay available when one is evicted because it
    /// cannot be resized in place.
    pub min_replicas: i32,
    /// What happens to limits.
    pub limits: LimitsPolicy,
    /// Whether resources an HPA scales on may be resized.
    pub hpa: HpaPolicy,
    /// Memory bump after an OOM kill, as a fraction of the memory at the kill.
    pub oom_bump_fraction: f64,
    /// Smallest memory bump after an OOM kill, bytes.
    pub oom_min_bump: i64,
}

impl Default for Policy {
    fn default() -> Self {
        // The CRD defaults are valid by construction; fall back to the same numbers if a
        // future default ever failed to parse.
        Policy::from_spec(&RightsizingPolicySpec::default()).unwrap_or(Policy {
            mode: Mode::Recommend,
            update: UpdateMode::InPlace,
            cpu: true,
            memory: true,
            cpu_percentiles: (0.5, 0.5, 0.95),
            memory_percentiles: (0.9, 0.5, 0.99),
            cpu_burst: Some((0.99, 3.0)),
            cpu_burst_cap: 2.0,
            cpu_starvation_weight: DEFAULT_CPU_STARVATION_WEIGHT,
            cpu_starvation_budget: BALANCED_CPU_STARVATION_BUDGET,
            profile: Profile::Balanced,
            cpu_short_cap: BALANCED_CPU_SHORT_CAP,
            cpu_severe_cap: BALANCED_CPU_SEVERE_CAP,
            cpu_running_phase: false,
            memory_trend: false,
            memory_peak_days: 7,
            cpu_bounds: (None, None),
            memory_bounds: (None, None),
            cpu_margin: 0.0,
            memory_margin: 0.04,
            history_window: 14 * 86_400,
            minimum_history: 12 * 3600,
            half_life: 86_400,
            max_step: 0.5,
            min_change: 0.1,
            min_replicas: 1,
            limits: LimitsPolicy::KeepRatio,
            hpa: HpaPolicy::Skip,
            oom_bump_fraction: 0.2,
            oom_min_bump: 100 << 20,
        })
    }
}

fn quantity_field(
    field: &str,
    value: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    cpu: bool,
) -> Result<Option<i64>, PolicyError> {
    value
        .map(|q| {
            if cpu {
                quantity::parse_milli(&q.0)
            } else {
                quantity::parse_value(&q.0)
            }
        })
        .transpose()
        .map_err(|e| PolicyError {
            field: field.to_string(),
            message: e.to_string(),
        })
}

fn fraction(field: &str, v: f64) -> Result<f64, PolicyError> {
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(PolicyError {
            field: field.to_string(),
            message: format!("{v} is not between 0 and 1"),
        })
    }
}

impl Policy {
    /// The parameters VPA's recommender uses, for comparison: no Tailor refinements.
    pub fn vpa_compatible() -> Policy {
        Policy {
            cpu_percentiles: (0.9, 0.5, 0.95),
            memory_percentiles: (0.9, 0.5, 0.95),
            cpu_margin: 0.15,
            memory_margin: 0.15,
            half_life: 86_400,
            cpu_burst: None,
            cpu_burst_cap: 0.0,
            cpu_starvation_weight: 0.0,
            cpu_starvation_budget: 0.0,
            cpu_short_cap: 0.0,
            cpu_severe_cap: 0.0,
            cpu_running_phase: false,
            memory_trend: false,
            memory_peak_days: 0,
            ..Policy::default()
        }
    }

    /// Parses a policy spec, rejecting bad quantities, durations and fractions.
    pub fn from_spec(spec: &RightsizingPolicySpec) -> Result<Policy, PolicyError> {
        let duration = |field: &str, r: Result<jiff::SignedDuration, crate::apis::Error>| {
            r.map(|d| d.as_secs()).map_err(|e| PolicyError {
                field: field.to_string(),
                message: e.to_string(),
            })
        };
        let cpu_percentiles = (
            fraction("spec.cpu.percentile", spec.cpu.percentile)?,
            fraction("spec.cpu.lowerPercentile", spec.cpu.lower_percentile)?,
            fraction("spec.cpu.upperPercentile", spec.cpu.upper_percentile)?,
        );
        let memory_percentiles = (
            fraction("spec.memory.percentile", spec.memory.percentile)?,
            fraction("spec.memory.lowerPercentile", spec.memory.lower_percentile)?,
            fraction("spec.memory.upperPercentile", spec.memory.upper_percentile)?,
        );
        let (budget, short_cap, severe_cap) = profile_trade(spec.profile);
        let policy = Policy {
            mode: spec.mode,
            update: spec.update.mode,
            cpu: spec.covers(ResourceKind::Cpu),
            memory: spec.covers(ResourceKind::Memory),
            cpu_percentiles,
            memory_percentiles,
            cpu_burst: spec
                .cpu
                .burst_percentile
                .map(|p| fraction("spec.cpu.burstPercentile", p))
                .transpose()?
                .map(|p| (p, spec.cpu.burst_headroom.max(1.0))),
            cpu_burst_cap: spec.cpu.burst_max_raise.max(0.0),
            cpu_starvation_weight: DEFAULT_CPU_STARVATION_WEIGHT,
            cpu_starvation_budget: budget,
            profile: spec.profile,
            cpu_short_cap: short_cap,
            cpu_severe_cap: severe_cap,
            cpu_running_phase: spec.cpu.cover_running_phase,
            memory_trend: spec.memory.trend,
            memory_peak_days: spec.memory.peak_days.min(MAX_PEAK_DAYS),
            cpu_bounds: (
                quantity_field("spec.cpu.min", spec.cpu.min.as_ref(), true)?,
                quantity_field("spec.cpu.max", spec.cpu.max.as_ref(), true)?,
            ),
            memory_bounds: (
                quantity_field("spec.memory.min", spec.memory.min.as_ref(), false)?,
                quantity_field("spec.memory.max", spec.memory.max.as_ref(), false)?,
            ),
            cpu_margin: spec.cpu.safety_margin_fraction.max(0.0),
            memory_margin: spec.memory.safety_margin_fraction.max(0.0),
            history_window: duration("spec.historyWindow", spec.history_window())?,
            minimum_history: duration("spec.minimumHistory", spec.minimum_history())?,
            half_life: duration("spec.halfLife", spec.half_life())?.max(60),
            max_step: spec.update.max_step_fraction.max(0.0),
            min_change: fraction(
                "spec.update.minChangeFraction",
                spec.update.min_change_fraction,
            )?,
            min_replicas: spec.update.min_replicas.max(0),
            limits: spec.limits,
            hpa: spec.hpa,
            oom_bump_fraction: spec.oom_bump_fraction.max(0.0),
            oom_min_bump: quantity_field("spec.oomMinBump", Some(&spec.oom_min_bump), false)?
                .unwrap_or(0),
        };
        for (field, (lo, hi)) in [
            ("spec.cpu", policy.cpu_bounds),
            ("spec.memory", policy.memory_bounds),
        ] {
            if let (Some(lo), Some(hi)) = (lo, hi)
                && lo > hi
            {
                return Err(PolicyError {
                    field: format!("{field}.min"),
                    message: format!("min {lo} is above max {hi}"),
                });
            }
        }
        Ok(policy)
    }
}
