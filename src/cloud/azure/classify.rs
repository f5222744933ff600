//! What an ARM error means for a launch: which offerings to stop asking for, for how long,
//! and whether the next candidate may still succeed. Pure: the caller supplies the error's
//! status, code and message and applies the verdict to its cache.
//!
//! The matchers and TTLs are those of Karpenter's Azure provider
//! (`azure-sdk-for-go-extensions` `pkg/errors`, and `pkg/providers/instance/offerings`
//! `commonerrorhandlers.go`): codes alone for capacity errors, `OperationNotAllowed` plus a
//! phrase of the message for quota errors. Tailor always launches zonal VMs, so Karpenter's
//! "placement scope" is the attempted zone, and "every zone" means every zone of the size.

use jiff::SignedDuration;

use crate::model::CapacityType;

/// Spot quota exhausted, or a size's family quota at limit 0 (`SubscriptionQuotaReachedTTL`).
pub const SUBSCRIPTION_QUOTA_TTL: SignedDuration = SignedDuration::from_hours(1);
/// A family quota that is merely low (`LowQuotaTTL`).
pub const LOW_QUOTA_TTL: SignedDuration = SignedDuration::from_mins(10);
/// Capacity errors (`AllocationFailed`, `ZonalAllocationFailed`, `Overconstrained*`).
pub const ALLOCATION_FAILURE_TTL: SignedDuration = SignedDuration::from_hours(1);
/// `SkuNotAvailable` for spot.
pub const SKU_NOT_AVAILABLE_SPOT_TTL: SignedDuration = SignedDuration::from_hours(1);
/// `SkuNotAvailable` for on-demand.
pub const SKU_NOT_AVAILABLE_ON_DEMAND_TTL: SignedDuration = SignedDuration::from_hours(23);

/// An ARM error as the provider saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArmFailure {
    /// HTTP status, or `None` for an error reported in an operation status body.
    pub status: Option<u16>,
    /// ARM error code (`error.code`), empty when the body had none.
    pub code: String,
    /// The error text: message and, where present, the whole body.
    pub message: String,
    /// `Retry-After` in seconds, when the response carried one.
    pub retry_after_seconds: Option<u64>,
}

/// Why the classifier decided as it did: a bounded vocabulary for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// `OperationNotAllowed` mentioning `LowPriorityCores`.
    SpotQuota,
    /// `OperationNotAllowed` mentioning `Family Cores quota`.
    FamilyQuota,
    /// `OperationNotAllowed` mentioning the Total Regional Cores quota.
    RegionalQuota,
    /// `OperationNotAllowed` asking to submit a quota increase.
    SubscriptionQuota,
    /// `SkuNotAvailable`.
    SkuNotAvailable,
    /// `ZonalAllocationFailed`.
    ZonalAllocationFailed,
    /// `AllocationFailed`.
    AllocationFailed,
    /// `OverconstrainedZonalAllocationRequest`.
    OverconstrainedZonal,
    /// `OverconstrainedAllocationRequest`.
    Overconstrained,
    /// `InsufficientSubnetSize`.
    InsufficientSubnetSize,
    /// `NicReservedForAnotherVm`.
    NicReserved,
    /// HTTP 429.
    Throttled,
    /// HTTP 404 / `ResourceNotFound` / `NotFound`.
    NotFound,
    /// Anything else.
    Other,
}

impl Reason {
    /// A stable label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::SpotQuota => "spot_quota",
            Reason::FamilyQuota => "family_quota",
            Reason::RegionalQuota => "regional_quota",
            Reason::SubscriptionQuota => "subscription_quota",
            Reason::SkuNotAvailable => "sku_not_available",
            Reason::ZonalAllocationFailed => "zonal_allocation_failed",
            Reason::AllocationFailed => "allocation_failed",
            Reason::OverconstrainedZonal => "overconstrained_zonal",
            Reason::Overconstrained => "overconstrained",
            Reason::InsufficientSubnetSize => "insufficient_subnet_size",
            Reason::NicReserved => "nic_reserved",
            Reason::Throttled => "throttled",
            Reason::NotFound => "not_found",
            Reason::Other => "other",
        }
    }
}

/// Which zones of the attempted size an entry covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zones {
    /// The attempted zone.
    Attempted,
    /// Every zone the size is sold in.
    All,
}

/// Which capacity types an entry covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapacityTypes {
    /// The attempted capacity type.
    Attempted,
    /// On-demand and spot.
    Both,
}

/// One entry for the unavailable-offerings cache, relative to the attempted offering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// The attempted size in these zones and capacity types.
    Offering {
        /// Zones covered.
        zones: Zones,
        /// Capacity types covered.
        capacity_types: CapacityTypes,
        /// How long.
        ttl: SignedDuration,
    },
    /// Every size of the attempted size's quota family with at least `min_vcpus` vCPUs,
    /// in every zone, for the attempted capacity type.
    Family {
        /// Smallest blocked size; 0 blocks the whole family.
        min_vcpus: u32,
        /// How long.
        ttl: SignedDuration,
    },
    /// Every offering of this capacity type.
    CapacityType {
        /// Which.
        capacity_type: CapacityType,
        /// How long.
        ttl: SignedDuration,
    },
}

/// What to do after a failed launch attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Why.
    pub reason: Reason,
    /// Entries for the unavailable-offerings cache.
    pub marks: Vec<Mark>,
    /// Whether another candidate may succeed (capacity errors), or the launch must stop
    /// (regional quota, throttling, a bad request).
    pub try_next: bool,
}

/// Classifies an ARM error for the attempted offering (`vcpus` of its size, its capacity
/// type).
pub fn classify(failure: &ArmFailure, capacity_type: CapacityType, vcpus: u32) -> Verdict {
    let code = failure.code.as_str();
    let text = failure.message.as_str();
    let verdict = |reason, marks: Vec<Mark>, try_next| Verdict {
        reason,
        marks,
        try_next,
    };
    let offering = |zones, capacity_types, ttl| Mark::Offering {
        zones,
        capacity_types,
        ttl,
    };
    if failure.status == Some(429) || code == "TooManyRequests" {
        return verdict(Reason::Throttled, Vec::new(), false);
    }
    if failure.status == Some(404) || code == "ResourceNotFound" || code == "NotFound" {
        return verdict(Reason::NotFound, Vec::new(), false);
    }
    match code {
        "OperationNotAllowed" if text.contains("LowPriorityCores") => verdict(
            Reason::SpotQuota,
            vec![Mark::CapacityType {
                capacity_type: CapacityType::Spot,
                ttl: SUBSCRIPTION_QUOTA_TTL,
            }],
            true,
        ),
        "OperationNotAllowed" if text.contains("Family Cores quota") => {
            // At limit 0 no size of the family fits; otherwise smaller sizes still may.
            let (min_vcpus, ttl) =
                if text.contains("Current Limit: 0,") || text.ends_with("Current Limit: 0") {
                    (0, SUBSCRIPTION_QUOTA_TTL)
                } else {
                    (vcpus, LOW_QUOTA_TTL)
                };
            verdict(
                Reason::FamilyQuota,
                vec![Mark::Family { min_vcpus, ttl }],
                true,
            )
        }
        "OperationNotAllowed" if text.contains("exceeding approved Total Regional Cores quota") => {
            verdict(Reason::RegionalQuota, Vec::new(), false)
        }
        "OperationNotAllowed" if text.contains("Submit a request for Quota increase") => {
            verdict(Reason::SubscriptionQuota, Vec::new(), false)
        }
        "SkuNotAvailable" => verdict(
            Reason::SkuNotAvailable,
            vec![offering(
                Zones::Attempted,
                CapacityTypes::Attempted,
                match capacity_type {
                    CapacityType::Spot => SKU_NOT_AVAILABLE_SPOT_TTL,
                    CapacityType::OnDemand => SKU_NOT_AVAILABLE_ON_DEMAND_TTL,
                },
            )],
            true,
        ),
        "ZonalAllocationFailed" => verdict(
            Reason::ZonalAllocationFailed,
            vec![offering(
                Zones::Attempted,
                CapacityTypes::Both,
                ALLOCATION_FAILURE_TTL,
            )],
            true,
        ),
        "AllocationFailed" => verdict(
            Reason::AllocationFailed,
            vec![offering(
                Zones::All,
                CapacityTypes::Both,
                ALLOCATION_FAILURE_TTL,
            )],
            true,
        ),
        "OverconstrainedZonalAllocationRequest" => verdict(
            Reason::OverconstrainedZonal,
            vec![offering(
                Zones::Attempted,
                CapacityTypes::Attempted,
                ALLOCATION_FAILURE_TTL,
            )],
            true,
        ),
        "OverconstrainedAllocationRequest" => verdict(
            Reason::Overconstrained,
            vec![offering(
                Zones::All,
                CapacityTypes::Attempted,
                ALLOCATION_FAILURE_TTL,
            )],
            true,
        ),
        "InsufficientSubnetSize" => verdict(Reason::InsufficientSubnetSize, Vec::new(), false),
        "NicReservedForAnotherVm" => verdict(Reason::NicReserved, Vec::new(), false),
        _ => verdict(Reason::Other, Vec::new(), false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAMILY_QUOTA: &str = "Operation could not be completed as it results in exceeding approved standardDSv5Family Cores quota. Additional details - Deployment Model: Resource Manager, Location: eastus, Current Limit: 10, Current Usage: 8, Additional Required: 4, (Minimum) New Limit Required: 12.";
    const FAMILY_QUOTA_ZERO: &str = "Operation could not be completed as it results in exceeding approved standardDSv5Family Cores quota. Additional details - Deployment Model: Resource Manager, Location: eastus, Current Limit: 0, Current Usage: 0, Additional Required: 4, (Minimum) New Limit Required: 4.";
    const SPOT_QUOTA: &str = "Operation could not be completed as it results in exceeding approved LowPriorityCores quota. Additional details - Deployment Model: Resource Manager, Location: eastus, Current Limit: 3, Current Usage: 0, Additional Required: 4, (Minimum) New Limit Required: 4.";
    const REGIONAL_QUOTA: &str = "Operation could not be completed as it results in exceeding approved Total Regional Cores quota. Additional details - Current Limit: 10";
    const THROTTLED: &str = "The request is being throttled as the limit has been reached for operation type - Read_ObservationWindow_00:03:00. For more information, see - https://aka.ms/srpthrottlinglimits";

    fn failure(status: Option<u16>, code: &str, message: &str) -> ArmFailure {
        ArmFailure {
            status,
            code: code.to_string(),
            message: message.to_string(),
            retry_after_seconds: None,
        }
    }

    /// status, code, message, attempted capacity type → reason, cache entries, try next.
    type Row<'a> = (
        Option<u16>,
        &'a str,
        &'a str,
        CapacityType,
        Reason,
        Vec<Mark>,
        bool,
    );

    /// The classifier's table: status, code, message, attempted capacity type → reason,
    /// cache entries, whether the next candidate is tried.
    #[test]
    fn the_classifier_table_matches_karpenters_handlers() {
        use CapacityType::{OnDemand, Spot};
        let hour = SignedDuration::from_hours(1);
        let rows: Vec<Row<'_>> = vec![
            (
                Some(409),
                "OperationNotAllowed",
                SPOT_QUOTA,
                Spot,
                Reason::SpotQuota,
                vec![Mark::CapacityType {
                    capacity_type: Spot,
                    ttl: hour,
                }],
                true,
            ),
            (
                Some(409),
                "OperationNotAllowed",
                FAMILY_QUOTA,
                OnDemand,
                Reason::FamilyQuota,
                vec![Mark::Family {
                    min_vcpus: 4,
                    ttl: SignedDuration::from_mins(10),
                }],
                true,
            ),
            (
                Some(409),
                "OperationNotAllowed",
                FAMILY_QUOTA_ZERO,
                OnDemand,
                Reason::FamilyQuota,
                vec![Mark::Family {
                    min_vcpus: 0,
                    ttl: hour,
                }],
                true,
            ),
            (
                Some(409),
                "OperationNotAllowed",
                REGIONAL_QUOTA,
                OnDemand,
                Reason::RegionalQuota,
                vec![],
                false,
            ),
            (
                Some(409),
                "SkuNotAvailable",
                "The requested VM size ... is currently not available",
                Spot,
                Reason::SkuNotAvailable,
                vec![Mark::Offering {
                    zones: Zones::Attempted,
                    capacity_types: CapacityTypes::Attempted,
                    ttl: hour,
                }],
                true,
            ),
            (
                Some(409),
                "SkuNotAvailable",
                "The requested VM size ... is currently not available",
                OnDemand,
                Reason::SkuNotAvailable,
                vec![Mark::Offering {
                    zones: Zones::Attempted,
                    capacity_types: CapacityTypes::Attempted,
                    ttl: SignedDuration::from_hours(23),
                }],
                true,
            ),
            (
                None,
                "ZonalAllocationFailed",
                "Allocation failed. We do not have sufficient capacity for the requested VM size in this zone.",
                Spot,
                Reason::ZonalAllocationFailed,
                vec![Mark::Offering {
                    zones: Zones::Attempted,
                    capacity_types: CapacityTypes::Both,
                    ttl: hour,
                }],
                true,
            ),
            (
                None,
                "AllocationFailed",
                "Allocation failed.",
                OnDemand,
                Reason::AllocationFailed,
                vec![Mark::Offering {
                    zones: Zones::All,
                    capacity_types: CapacityTypes::Both,
                    ttl: hour,
                }],
                true,
            ),
            (
                None,
                "OverconstrainedZonalAllocationRequest",
                "Allocation failed. VM(s) with the following constraints cannot be allocated",
                Spot,
                Reason::OverconstrainedZonal,
                vec![Mark::Offering {
                    zones: Zones::Attempted,
                    capacity_types: CapacityTypes::Attempted,
                    ttl: hour,
                }],
                true,
            ),
            (
                None,
                "OverconstrainedAllocationRequest",
                "Allocation failed. VM(s) with the following constraints cannot be allocated",
                OnDemand,
                Reason::Overconstrained,
                vec![Mark::Offering {
                    zones: Zones::All,
                    capacity_types: CapacityTypes::Attempted,
                    ttl: hour,
                }],
                true,
            ),
            (
                Some(400),
                "InsufficientSubnetSize",
                "subnet full",
                OnDemand,
                Reason::InsufficientSubnetSize,
                vec![],
                false,
            ),
            (
                Some(400),
                "NicReservedForAnotherVm",
                "reserved",
                OnDemand,
                Reason::NicReserved,
                vec![],
                false,
            ),
            // 429 bodies say OperationNotAllowed too, without the quota phrases.
            (
                Some(429),
                "OperationNotAllowed",
                THROTTLED,
                OnDemand,
                Reason::Throttled,
                vec![],
                false,
            ),
            (
                Some(404),
                "ResourceNotFound",
                "The Resource was not found",
                OnDemand,
                Reason::NotFound,
                vec![],
                false,
            ),
            (
                Some(400),
                "InvalidParameter",
                "bad customData",
                OnDemand,
                Reason::Other,
                vec![],
                false,
            ),
            // A quota code without a known phrase is not a capacity error.
            (
                Some(409),
                "OperationNotAllowed",
                "something else",
                OnDemand,
                Reason::Other,
                vec![],
                false,
            ),
        ];
        for (status, code, message, ct, reason, marks, try_next) in rows {
            let got = classify(&failure(status, code, message), ct, 4);
            assert_eq!(
                got,
                Verdict {
                    reason,
                    marks,
                    try_next
                },
                "{status:?} {code} {ct}: {message}"
            );
        }
    }

    #[test]
    fn the_observed_family_quota_body_is_a_family_quota() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../shared/data/azure/arm/observed/vm-put-409-OperationNotAllowed-family-quota.body.json"
        );
        let body = std::fs::read_to_string(path).expect("shared fixture");
        let v: serde_json::Value = serde_json::from_str(&body).expect("json");
        let f = failure(
            Some(409),
            v["error"]["code"].as_str().unwrap_or_default(),
            v["error"]["message"].as_str().unwrap_or_default(),
        );
        assert_eq!(
            classify(&f, CapacityType::OnDemand, 2).reason,
            Reason::FamilyQuota
        );
    }
}
