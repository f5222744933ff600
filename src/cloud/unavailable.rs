//! Remembers offerings that recently failed for lack of capacity, so the provisioner
//! stops asking for them for a while (Karpenter keeps such entries for three minutes).
//!
//! Besides single offerings, two wider keys mirror Karpenter's Azure provider
//! (`pkg/cache/unavailableofferings.go`): a quota family in a zone and capacity type, which
//! blocks every size of the family with at least as many vCPUs as the failed one, and a
//! whole capacity type (spot, when the subscription's low-priority quota is gone). Each
//! entry carries its own expiry, because Azure's errors come with different TTLs.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};

use crate::model::CapacityType;

/// How long an offering stays marked unavailable after a capacity error.
pub const DEFAULT_TTL: SignedDuration = SignedDuration::from_secs(180);

/// Offerings (`type`, `zone`, `capacity type`) with an expiry.
#[derive(Debug, Clone, Default)]
pub struct UnavailableOfferings {
    until: BTreeMap<(String, String, CapacityType), Timestamp>,
    /// (lower-cased quota family, zone, capacity type) -> (smallest blocked vCPU count, expiry).
    families: BTreeMap<(String, String, CapacityType), (u32, Timestamp)>,
    /// Capacity types unavailable everywhere.
    capacity_types: BTreeMap<CapacityType, Timestamp>,
    ttl: Option<SignedDuration>,
}

impl UnavailableOfferings {
    /// An empty cache with the given time to live.
    pub fn with_ttl(ttl: SignedDuration) -> Self {
        UnavailableOfferings {
            ttl: Some(ttl),
            ..UnavailableOfferings::default()
        }
    }

    /// Marks an offering unavailable from `now` for `ttl` (longer entries are kept).
    pub fn mark_for(
        &mut self,
        instance_type: &str,
        zone: &str,
        capacity_type: CapacityType,
        now: Timestamp,
        ttl: SignedDuration,
    ) {
        let expiry = now.checked_add(ttl).unwrap_or(Timestamp::MAX);
        let entry = self
            .until
            .entry((instance_type.to_string(), zone.to_string(), capacity_type))
            .or_insert(expiry);
        *entry = (*entry).max(expiry);
    }

    /// Marks every size of a quota family with at least `min_vcpus` vCPUs unavailable in a
    /// zone for a capacity type (Karpenter's `skufamily:<family>:<zone>:<capacityType>`).
    pub fn mark_family(
        &mut self,
        family: &str,
        zone: &str,
        capacity_type: CapacityType,
        min_vcpus: u32,
        now: Timestamp,
        ttl: SignedDuration,
    ) {
        let expiry = now.checked_add(ttl).unwrap_or(Timestamp::MAX);
        let key = (family.to_ascii_lowercase(), zone.to_string(), capacity_type);
        let entry = self.families.entry(key).or_insert((min_vcpus, expiry));
        if now >= entry.1 {
            *entry = (min_vcpus, expiry);
        } else {
            *entry = (entry.0.min(min_vcpus), entry.1.max(expiry));
        }
    }

    /// Marks a capacity type unavailable everywhere (Karpenter's `spot::` key).
    pub fn mark_capacity_type(
        &mut self,
        capacity_type: CapacityType,
        now: Timestamp,
        ttl: SignedDuration,
    ) {
        let expiry = now.checked_add(ttl).unwrap_or(Timestamp::MAX);
        let entry = self.capacity_types.entry(capacity_type).or_insert(expiry);
        *entry = (*entry).max(expiry);
    }

    /// Whether an offering is unavailable at `now` under any key: the offering itself, its
    /// quota family (`family` as Resource SKUs names it, with the size's vCPUs), or its
    /// capacity type.
    pub fn is_offering_unavailable(
        &self,
        instance_type: &str,
        family: Option<&str>,
        vcpus: u32,
        zone: &str,
        capacity_type: CapacityType,
        now: Timestamp,
    ) -> bool {
        self.is_unavailable(instance_type, zone, capacity_type, now)
            || self
                .capacity_types
                .get(&capacity_type)
                .is_some_and(|until| now < *until)
            || family.is_some_and(|f| {
                self.families
                    .get(&(f.to_ascii_lowercase(), zone.to_string(), capacity_type))
                    .is_some_and(|(min, until)| now < *until && vcpus >= *min)
            })
    }

    /// When an offering becomes available again under the offering key alone, if marked.
    pub fn expiry(
        &self,
        instance_type: &str,
        zone: &str,
        capacity_type: CapacityType,
    ) -> Option<Timestamp> {
        self.until
            .get(&(instance_type.to_string(), zone.to_string(), capacity_type))
            .copied()
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
        !self.until.is_empty()
            && self
                .until
                .get(&(instance_type.to_string(), zone.to_string(), capacity_type))
                .is_some_and(|until| now < *until)
    }

    /// The offerings marked unavailable under their own key at `now` (family and
    /// capacity-type marks are not listed).
    pub fn marked_at(
        &self,
        now: Timestamp,
    ) -> impl Iterator<Item = &(String, String, CapacityType)> + '_ {
        self.until
            .iter()
            .filter(move |(_, until)| now < **until)
            .map(|(key, _)| key)
    }

    /// Drops expired entries.
    pub fn expire(&mut self, now: Timestamp) {
        self.until.retain(|_, until| now < *until);
        self.families.retain(|_, (_, until)| now < *until);
        self.capacity_types.retain(|_, until| now < *until);
    }

    /// How many offerings are marked at `now`.
    pub fn len_at(&self, now: Timestamp) -> usize {
        self.until.values().filter(|u| now < **u).count()
            + self.families.values().filter(|(_, u)| now < *u).count()
            + self.capacity_types.values().filter(|u| now < **u).count()
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

    #[test]
    fn a_family_entry_blocks_sizes_at_or_above_its_vcpus_in_its_zone_only() {
        let t0 = Timestamp::from_second(1_000).expect("valid");
        let mut cache = UnavailableOfferings::default();
        let hour = SignedDuration::from_hours(1);
        cache.mark_family(
            "standardDSv5Family",
            "eastus-1",
            CapacityType::OnDemand,
            8,
            t0,
            hour,
        );
        let fam = Some("STANDARDDSV5FAMILY");
        let blocked = |vcpus, zone, ct, at| {
            cache.is_offering_unavailable("Standard_D8s_v5", fam, vcpus, zone, ct, at)
        };
        assert!(blocked(8, "eastus-1", CapacityType::OnDemand, t0));
        assert!(blocked(16, "eastus-1", CapacityType::OnDemand, t0));
        assert!(!blocked(4, "eastus-1", CapacityType::OnDemand, t0));
        assert!(!blocked(8, "eastus-2", CapacityType::OnDemand, t0));
        assert!(!blocked(8, "eastus-1", CapacityType::Spot, t0));
        let later = Timestamp::from_second(1_000 + 3_600).expect("valid");
        assert!(!blocked(8, "eastus-1", CapacityType::OnDemand, later));
    }

    #[test]
    fn a_capacity_type_entry_blocks_every_offering_of_that_type() {
        let t0 = Timestamp::from_second(1_000).expect("valid");
        let mut cache = UnavailableOfferings::default();
        cache.mark_capacity_type(CapacityType::Spot, t0, SignedDuration::from_hours(1));
        assert!(cache.is_offering_unavailable("A", None, 2, "z-1", CapacityType::Spot, t0));
        assert!(!cache.is_offering_unavailable("A", None, 2, "z-1", CapacityType::OnDemand, t0));
    }
}
