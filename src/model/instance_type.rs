//! Instance types (Azure VM sizes) as the scheduler sees them: capacity, AKS node
//! overhead, allocatable, labels, and the offerings (zone x capacity type x price) in
//! which they can be bought.

use std::collections::BTreeMap;
use std::fmt;

use crate::apis::labels;

use super::requirements::{Requirement, Requirements};
use super::resources::Resources;

const MIB: i64 = 1 << 20;
const GIB: i64 = 1 << 30;

/// How a node is bought. On-demand is the default, as in Karpenter when nothing asks for
/// spot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum CapacityType {
    /// Pay-as-you-go, never reclaimed.
    #[serde(rename = "on-demand")]
    #[default]
    OnDemand,
    /// Azure Spot: cheaper, may be evicted at any time.
    #[serde(rename = "spot")]
    Spot,
}

impl CapacityType {
    /// The label value (`on-demand`, `spot`).
    pub fn as_str(self) -> &'static str {
        match self {
            CapacityType::OnDemand => labels::CAPACITY_TYPE_ON_DEMAND,
            CapacityType::Spot => labels::CAPACITY_TYPE_SPOT,
        }
    }

    /// Parses a label value.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            labels::CAPACITY_TYPE_ON_DEMAND => Some(CapacityType::OnDemand),
            labels::CAPACITY_TYPE_SPOT => Some(CapacityType::Spot),
            _ => None,
        }
    }
}

impl fmt::Display for CapacityType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One way to buy an instance type: a zone, a capacity type and its hourly price.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Offering {
    /// Zone label value, `<region>-<n>` (e.g. `eastus-1`).
    pub zone: String,
    /// On-demand or spot.
    pub capacity_type: CapacityType,
    /// USD per hour.
    pub price_per_hour: f64,
    /// True when the price is derived (spot prices from the on-demand price and a
    /// discount factor) rather than a published list price.
    pub price_is_estimate: bool,
    /// False while the cloud reports no capacity for this offering.
    pub available: bool,
}

/// Hardware facts about an Azure VM size, independent of region and price.
#[derive(Debug, Clone, PartialEq)]
pub struct Sku {
    /// ARM size name, e.g. `Standard_D4s_v5`.
    pub name: String,
    /// vCPUs.
    pub vcpus: u32,
    /// Memory in GiB as Azure reports it (may be fractional).
    pub memory_gib: f64,
    /// GPUs.
    pub gpus: u32,
    /// `amd64` or `arm64`.
    pub arch: String,
}

/// The parts of an Azure size name: `Standard_E64ps_v6` → family `E`, 64 vCPUs, features
/// `ps`, version 6.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkuName {
    /// The letters before the first digit (`E`, `DC`, `NC`).
    pub family: String,
    /// The number after the family, when the name has one.
    pub cpus: Option<u32>,
    /// The letters after the number (`ps`, `ads`), additive features.
    pub features: String,
    /// The `_vN` generation, 1 when the name has none.
    pub version: u32,
}

impl SkuName {
    /// Splits a size name into its parts. Names without the `Standard_` prefix are
    /// accepted as well.
    pub fn parse(name: &str) -> Self {
        let body = name
            .strip_prefix("Standard_")
            .or_else(|| name.strip_prefix("Basic_"))
            .unwrap_or(name);
        let first_segment = body.split('_').next().unwrap_or(body);
        let family: String = first_segment
            .chars()
            .take_while(|c| c.is_ascii_alphabetic())
            .collect();
        let rest = &first_segment[family.len()..];
        let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        // Constrained-vCPU sizes ("E64-16as") carry "-<active cpus>" before the features.
        let after =
            rest[digits.len()..].trim_start_matches(|c: char| c == '-' || c.is_ascii_digit());
        let features: String = after.chars().filter(|c| c.is_ascii_alphabetic()).collect();
        let version = body
            .split('_')
            .skip(1)
            .filter_map(|seg| seg.strip_prefix('v').and_then(|v| v.parse::<u32>().ok()))
            .last()
            .unwrap_or(1);
        SkuName {
            family,
            cpus: digits.parse().ok(),
            features,
            version,
        }
    }

    /// The series: family, features and generation, e.g. `Dsv5`, `Epsv6`.
    pub fn series(&self) -> String {
        format!("{}{}v{}", self.family, self.features, self.version)
    }
}

/// How the node's kube-reserved memory and eviction threshold are computed; chosen per
/// AKSNodeClass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub enum OverheadModel {
    /// Regressive brackets on VM memory plus a 750Mi hard-eviction threshold (AKS before
    /// 1.29; what Karpenter's Azure provider uses). The default.
    #[default]
    Brackets,
    /// min(20 MiB x maxPods + 50 MiB, 25% of memory) plus a 100Mi threshold (AKS 1.29+).
    MaxPods,
}

/// Node settings that shape capacity and overhead (from the AKSNodeClass).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSettings {
    /// Which kube-reserved memory formula to use.
    pub overhead_model: OverheadModel,
    /// Pods per node (Azure CNI overlay default: 250).
    pub max_pods: u32,
    /// OS disk size in GiB, the node's ephemeral storage.
    pub os_disk_gib: u32,
    /// Share of VM memory the hypervisor keeps, as the Azure provider models it (7.5%).
    pub vm_memory_overhead_percent: f64,
}

impl Default for NodeSettings {
    fn default() -> Self {
        NodeSettings {
            overhead_model: OverheadModel::Brackets,
            max_pods: 250,
            os_disk_gib: 128,
            vm_memory_overhead_percent: 7.5,
        }
    }
}

/// kube-reserved CPU on AKS in millicores: 6% of the first core, 4% of the second, 2% of
/// the third and fourth, 1% of every core above four.
pub fn kube_reserved_cpu_milli(vcpus: u32) -> i64 {
    let v = i64::from(vcpus);
    let first = v.min(1) * 60;
    let second = (v - 1).clamp(0, 1) * 40;
    let third_fourth = (v - 2).clamp(0, 2) * 20;
    let rest = (v - 4).max(0) * 10;
    first + second + third_fourth + rest
}

/// kube-reserved memory on AKS in bytes, truncated to whole MiB.
pub fn kube_reserved_memory(memory_gib: f64, settings: &NodeSettings) -> i64 {
    match settings.overhead_model {
        OverheadModel::Brackets => {
            // 25% of the first 4 GiB, 20% of the next 4, 10% of the next 8, 6% up to
            // 128 GiB and 2% above, on the VM's raw memory.
            let brackets = [
                (4.0, 0.25),
                (4.0, 0.20),
                (8.0, 0.10),
                (112.0, 0.06),
                (f64::INFINITY, 0.02),
            ];
            let mut left = memory_gib.max(0.0);
            let mut reserved_gib = 0.0;
            for (size, share) in brackets {
                let take = left.min(size);
                reserved_gib += take * share;
                left -= take;
                if left <= 0.0 {
                    break;
                }
            }
            (reserved_gib * 1024.0).floor() as i64 * MIB
        }
        OverheadModel::MaxPods => {
            let per_pods = (20 * i64::from(settings.max_pods) + 50) * MIB;
            let quarter = ((memory_gib * 1024.0 * 0.25).floor() as i64) * MIB;
            per_pods.min(quarter)
        }
    }
}

/// The hard-eviction threshold (`memory.available`) in bytes for the overhead model.
pub fn eviction_threshold(model: OverheadModel) -> i64 {
    match model {
        OverheadModel::Brackets => 750 * MIB,
        OverheadModel::MaxPods => 100 * MIB,
    }
}

/// Node memory capacity as the Azure provider computes it: VM memory floored to whole
/// GiB, less the hypervisor share rounded up to the byte.
pub fn memory_capacity(memory_gib: f64, settings: &NodeSettings) -> i64 {
    let whole = memory_gib.max(0.0).floor() as i64 * GIB;
    let overhead = (whole as f64 * settings.vm_memory_overhead_percent / 100.0).ceil() as i64;
    whole - overhead
}

/// An instance type in one region: what a node of this size offers after overhead, the
/// labels it carries, and where and how it can be bought.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceType {
    /// ARM size name.
    pub name: String,
    /// Hardware facts.
    pub sku: Sku,
    /// The parsed name.
    pub sku_name: SkuName,
    /// What the node reports as capacity.
    pub capacity: Resources,
    /// kube-reserved plus eviction threshold.
    pub overhead: Resources,
    /// Capacity less overhead: what pods can request.
    pub allocatable: Resources,
    /// The labels a node of this type carries, as requirements (zone and capacity type
    /// span the offerings).
    pub requirements: Requirements,
    /// Ways to buy it, cheapest first.
    pub offerings: Vec<Offering>,
}

impl InstanceType {
    /// Builds an instance type from its SKU, region and offerings under the given node
    /// settings.
    pub fn new(
        sku: Sku,
        region: &str,
        mut offerings: Vec<Offering>,
        settings: &NodeSettings,
    ) -> Self {
        let sku_name = SkuName::parse(&sku.name);
        let mut capacity = Resources::cpu_memory(
            i64::from(sku.vcpus) * 1000,
            memory_capacity(sku.memory_gib, settings),
        );
        capacity.pods = i64::from(settings.max_pods);
        capacity.ephemeral_storage = i64::from(settings.os_disk_gib) * GIB;
        if sku.gpus > 0 {
            capacity.set(
                &super::resources::Dimension::Extended(labels::RESOURCE_NVIDIA_GPU.to_string()),
                i64::from(sku.gpus),
            );
        }
        let overhead = Resources::cpu_memory(
            kube_reserved_cpu_milli(sku.vcpus),
            kube_reserved_memory(sku.memory_gib, settings)
                + eviction_threshold(settings.overhead_model),
        );
        let allocatable = capacity
            .checked_sub(&overhead)
            .map_or_else(|_| Resources::zero(), |a| a.clamp_non_negative());
        offerings.sort_by(|a, b| {
            a.price_per_hour
                .total_cmp(&b.price_per_hour)
                .then_with(|| a.zone.cmp(&b.zone))
                .then_with(|| a.capacity_type.cmp(&b.capacity_type))
        });
        let requirements = instance_type_requirements(&sku, &sku_name, region, &offerings);
        InstanceType {
            name: sku.name.clone(),
            sku,
            sku_name,
            capacity,
            overhead,
            allocatable,
            requirements,
            offerings,
        }
    }

    /// The cheapest available offering that `requirements` admit (zone and capacity type).
    pub fn cheapest_offering(&self, requirements: &Requirements) -> Option<&Offering> {
        self.offerings.iter().find(|o| {
            o.available
                && requirements
                    .get(labels::ZONE)
                    .is_none_or(|r| r.admits_value(&o.zone))
                && requirements
                    .get(labels::CAPACITY_TYPE)
                    .is_none_or(|r| r.admits_value(o.capacity_type.as_str()))
        })
    }

    /// The label values of this type (excluding zone and capacity type, which depend on
    /// the offering).
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.requirements.single_valued_labels()
    }
}

fn instance_type_requirements(
    sku: &Sku,
    name: &SkuName,
    region: &str,
    offerings: &[Offering],
) -> Requirements {
    let memory_mib = (sku.memory_gib * 1024.0).round() as i64;
    let mut r = Requirements::new()
        .with(Requirement::one_of(labels::ARCH, [sku.arch.clone()]))
        .with(Requirement::one_of(labels::OS, ["linux"]))
        .with(Requirement::one_of(
            labels::INSTANCE_TYPE,
            [sku.name.clone()],
        ))
        .with(Requirement::one_of(labels::REGION, [region.to_string()]))
        .with(Requirement::one_of(labels::SKU_NAME, [sku.name.clone()]))
        .with(Requirement::one_of(
            labels::SKU_FAMILY,
            [name.family.clone()],
        ))
        .with(Requirement::one_of(labels::SKU_SERIES, [name.series()]))
        .with(Requirement::one_of(
            labels::SKU_VERSION,
            [name.version.to_string()],
        ))
        .with(Requirement::one_of(
            labels::SKU_CPU,
            [sku.vcpus.to_string()],
        ))
        .with(Requirement::one_of(
            labels::SKU_MEMORY,
            [memory_mib.to_string()],
        ))
        .with(Requirement::one_of(
            labels::SKU_GPU_COUNT,
            [sku.gpus.to_string()],
        ));
    let available = offerings.iter().filter(|o| o.available);
    r.add(Requirement::one_of(
        labels::ZONE,
        available.clone().map(|o| o.zone.clone()),
    ));
    r.add(Requirement::one_of(
        labels::CAPACITY_TYPE,
        available.map(|o| o.capacity_type.as_str().to_string()),
    ));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d2s_v5() -> Sku {
        Sku {
            name: "Standard_D2s_v5".into(),
            vcpus: 2,
            memory_gib: 8.0,
            gpus: 0,
            arch: "amd64".into(),
        }
    }

    fn offering(zone: &str, capacity_type: CapacityType, price: f64) -> Offering {
        Offering {
            zone: zone.into(),
            capacity_type,
            price_per_hour: price,
            price_is_estimate: capacity_type == CapacityType::Spot,
            available: true,
        }
    }

    #[test]
    fn size_names_split_into_family_series_and_version() {
        let e = SkuName::parse("Standard_E64ps_v6");
        assert_eq!(
            (e.family.as_str(), e.cpus, e.features.as_str(), e.version),
            ("E", Some(64), "ps", 6)
        );
        assert_eq!(e.series(), "Epsv6");
        assert_eq!(SkuName::parse("Standard_DC4as_v5").family, "DC");
        assert_eq!(SkuName::parse("Standard_A2").version, 1);
        let constrained = SkuName::parse("Standard_E64-16as_v6");
        assert_eq!(
            (constrained.cpus, constrained.features.as_str()),
            (Some(64), "as")
        );
        assert_eq!(SkuName::parse("Standard_NC24ads_A100_v4").version, 4);
    }

    #[test]
    fn kube_reserved_cpu_follows_the_aks_table() {
        let table = [
            (1, 60),
            (2, 100),
            (4, 140),
            (8, 180),
            (16, 260),
            (32, 420),
            (64, 740),
        ];
        for (cores, milli) in table {
            assert_eq!(kube_reserved_cpu_milli(cores), milli, "{cores} cores");
        }
    }

    #[test]
    fn kube_reserved_memory_brackets_match_the_azure_provider() {
        let s = NodeSettings::default();
        for (gib, mib) in [
            (8.0, 1843),
            (16.0, 2662),
            (32.0, 3645),
            (64.0, 5611),
            (256.0, 12165),
        ] {
            assert_eq!(kube_reserved_memory(gib, &s), mib * MIB, "{gib} GiB");
        }
    }

    #[test]
    fn max_pods_model_caps_reservation_at_a_quarter_of_memory() {
        let s = NodeSettings {
            overhead_model: OverheadModel::MaxPods,
            max_pods: 30,
            ..NodeSettings::default()
        };
        assert_eq!(kube_reserved_memory(16.0, &s), 650 * MIB);
        let dense = NodeSettings { max_pods: 250, ..s };
        assert_eq!(kube_reserved_memory(8.0, &dense), 2048 * MIB);
        assert_eq!(eviction_threshold(OverheadModel::MaxPods), 100 * MIB);
    }

    #[test]
    fn d2s_v5_allocatable_is_what_the_formula_gives_by_hand() {
        let it = InstanceType::new(
            d2s_v5(),
            "eastus",
            vec![offering("eastus-1", CapacityType::OnDemand, 0.096)],
            &NodeSettings::default(),
        );
        // 8 GiB less 7.5% rounded up to the byte.
        let capacity = 8 * GIB - (8.0 * GIB as f64 * 0.075).ceil() as i64;
        assert_eq!(it.capacity.memory, capacity);
        assert_eq!(it.allocatable.cpu, 1900);
        assert_eq!(it.allocatable.memory, capacity - 1843 * MIB - 750 * MIB);
        assert_eq!(it.allocatable.pods, 250);
        assert_eq!(it.labels()[labels::SKU_FAMILY], "D");
        assert_eq!(it.labels()[labels::SKU_MEMORY], "8192");
    }

    #[test]
    fn cheapest_offering_honours_zone_and_capacity_type_requirements() {
        let it = InstanceType::new(
            d2s_v5(),
            "eastus",
            vec![
                offering("eastus-1", CapacityType::OnDemand, 0.096),
                offering("eastus-2", CapacityType::Spot, 0.03),
                offering("eastus-1", CapacityType::Spot, 0.02),
            ],
            &NodeSettings::default(),
        );
        let any = Requirements::new();
        assert_eq!(
            it.cheapest_offering(&any).map(|o| o.price_per_hour),
            Some(0.02)
        );
        let zone2 = Requirements::new().with(Requirement::one_of(labels::ZONE, ["eastus-2"]));
        assert_eq!(
            it.cheapest_offering(&zone2).map(|o| o.price_per_hour),
            Some(0.03)
        );
        let od = Requirements::new().with(Requirement::one_of(
            "karpenter.sh/capacity-type",
            ["on-demand"],
        ));
        assert_eq!(
            it.cheapest_offering(&od).map(|o| o.zone.as_str()),
            Some("eastus-1")
        );
    }
}
