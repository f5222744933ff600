//! Remembers offerings that recently failed for lack of capacity, so the provisioner
//! stops asking for them for a while (Karpenter keeps such entries for three minutes).

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};

use crate::model::CapacityType;

/// How long an offering stays marked unavailable after a capacity error.
pub const DEFAULT_TTL: SignedDuration = SignedDuration::from_secs(180);

/// Offerings (`type`, `zone`, `capacity type`) with an expiry.
#[derive(Debug, Clone, Default)]
pub struct UnavailableOfferings {
    until: BTreeMap<(String, String, CapacityType), Timestamp>,
    ttl: Option<SignedDuration>,
}

impl UnavailableOfferings {
    /// An empty cache with the given time to live.
    pub fn with_ttl(ttl: SignedDuration) -> Self {
        UnavailableOfferings {
            until: BTreeMap::new(),
            ttl: Some(ttl),
        }
    }

    /// Marks an offering unavailable from `now` for the TTL.
    pub fn mark(
        &mut self,
        instance_type: &str,
        zone: &str,
        capacity_type: CapacityType,
        now: Timestamp,
    ) {
        let ttl = self.ttl.unwrap_or(DEFAULT_TTL);
        let expiry = now.checked_add(ttl).unwrap_or(Timestamp::MAX);
        self.until.insert(
            (instance_type.to_string(), zone.to_string(), capacity_type),
            expiry,
        );
    }

    /// Whether an offering is marked unavailable at `now`.
    pub fn is_unavailable(
        &self,
        instance_type: &str,
        zone: &str,
        capacity_type: CapacityType,
        now: Timestamp,
    ) -> bool {
        self.until
            .get(&(instance_type.to_string(), zone.to_string(), capacity_type))
            .is_some_and(|until| now < *until)
    }

    /// Drops expired entries.
    pub fn expire(&mut self, now: Timestamp) {
        self.until.retain(|_, until| now < *until);
    }

    /// How many offerings are marked at `now`.
    pub fn len_at(&self, now: Timestamp) -> usize {
        self.until.values().filter(|u| now < **u).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marked_offerings_expire_after_the_ttl() {
        let t0 = Timestamp::from_second(1_000).expect("valid");
        let mut cache = UnavailableOfferings::with_ttl(SignedDuration::from_secs(60));
        cache.mark("Standard_D2s_v5", "eastus-1", CapacityType::Spot, t0);
        assert!(cache.is_unavailable("Standard_D2s_v5", "eastus-1", CapacityType::Spot, t0));
        assert!(!cache.is_unavailable("Standard_D2s_v5", "eastus-1", CapacityType::OnDemand, t0));
        let later = Timestamp::from_second(1_060).expect("valid");
        assert!(!cache.is_unavailable("Standard_D2s_v5", "eastus-1", CapacityType::Spot, later));
        cache.expire(later);
        assert_eq!(cache.len_at(t0), 0);
    }
}
