//! The live catalog: VM sizes from Resource SKUs and prices from the Retail Prices API,
//! turned into Tailor's [`Catalog`]. Parsing is pure; [`fetch`] does the two reads.
//!
//! As Karpenter's Azure provider does: sizes restricted for the subscription in the
//! region are dropped and restricted zones removed (`instancetypes.go`); spot is offered
//! only for `LowPriorityCapable` sizes; prices skip Windows products and Low Priority
//! meters, and a `skuName` ending in " Spot" is the spot price (`pricing.go`). A size with
//! no on-demand price is never offered.

use std::collections::BTreeMap;

use azure_mgmt_compute::package_2024_07_01::models::{ResourceSku, resource_sku_restrictions};
use serde::Deserialize;

use super::arm::{Arm, ArmError};
use super::resources::SkuFacts;
use crate::catalog::{Catalog, CatalogSku};
use crate::model::Sku;

/// The Retail Prices API version Karpenter uses.
pub const PRICES_API_VERSION: &str = "2023-01-01-preview";

/// Sizes of one region, with the facts the VM bodies need.
#[derive(Debug, Clone, Default)]
pub struct Skus {
    /// For the catalog.
    pub catalog: Vec<CatalogSku>,
    /// Size name → facts.
    pub facts: BTreeMap<String, SkuFacts>,
    /// Sizes dropped because they are restricted for the subscription.
    pub restricted: Vec<String>,
}

fn capability<'a>(sku: &'a ResourceSku, name: &str) -> Option<&'a str> {
    sku.capabilities
        .iter()
        .find(|c| c.name.as_deref() == Some(name))
        .and_then(|c| c.value.as_deref())
}

/// The VM sizes of `region` in a Resource SKUs listing.
pub fn parse_skus(region: &str, listing: &[ResourceSku]) -> Skus {
    let mut out = Skus::default();
    for sku in listing {
        if sku.resource_type.as_deref() != Some("virtualMachines") {
            continue;
        }
        let Some(name) = sku.name.clone() else {
            continue;
        };
        let Some(info) = sku.location_info.iter().find(|l| {
            l.location
                .as_deref()
                .is_some_and(|l| l.eq_ignore_ascii_case(region))
        }) else {
            continue;
        };
        let in_region = |values: &[String]| values.iter().any(|v| v.eq_ignore_ascii_case(region));
        let location_restricted = sku.restrictions.iter().any(|r| {
            r.type_ == Some(resource_sku_restrictions::Type::Location)
                && (in_region(&r.values)
                    || r.restriction_info
                        .as_ref()
                        .is_some_and(|i| in_region(&i.locations)))
        });
        if location_restricted {
            out.restricted.push(name);
            continue;
        }
        let restricted_zones: Vec<&String> = sku
            .restrictions
            .iter()
            .filter(|r| r.type_ == Some(resource_sku_restrictions::Type::Zone))
            .filter_map(|r| r.restriction_info.as_ref())
            .flat_map(|i| i.zones.iter())
            .collect();
        let mut zones: Vec<String> = info
            .zones
            .iter()
            .filter(|z| !restricted_zones.contains(z))
            .cloned()
            .collect();
        zones.sort();
        let number = |k: &str| capability(sku, k).and_then(|v| v.parse::<f64>().ok());
        let flag = |k: &str| capability(sku, k).is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let (Some(vcpus), Some(memory_gib)) = (number("vCPUs"), number("MemoryGB")) else {
            continue;
        };
        // Sizes that are zonal somewhere but have every zone restricted here are gone.
        if !info.zones.is_empty() && zones.is_empty() {
            out.restricted.push(name);
            continue;
        }
        let arm64 =
            capability(sku, "CpuArchitectureType").is_some_and(|a| a.eq_ignore_ascii_case("Arm64"));
        let vcpus = vcpus as u32;
        out.facts.insert(
            name.clone(),
            SkuFacts {
                vcpus,
                family: sku.family.clone(),
                accelerated_networking: flag("AcceleratedNetworkingEnabled"),
                ephemeral_os_disk: flag("EphemeralOSDiskSupported"),
                max_resource_volume_mb: number("MaxResourceVolumeMB").unwrap_or(0.0) as u64,
                cached_disk_bytes: number("CachedDiskBytes").unwrap_or(0.0) as u64,
                hyperv_gen2: capability(sku, "HyperVGenerations").is_some_and(|g| g.contains("V2")),
                arm64,
            },
        );
        out.catalog.push(CatalogSku {
            sku: Sku {
                name,
                vcpus,
                memory_gib,
                gpus: number("GPUs").unwrap_or(0.0) as u32,
                arch: if arm64 { "arm64" } else { "amd64" }.to_string(),
            },
            known: true,
            restricted: false,
            // A regional-only size (no zones listed) is offered in every zone label.
            zones: (!zones.is_empty()).then_some(zones),
            spot_capable: flag("LowPriorityCapable"),
        });
    }
    out
}

/// One page of the Retail Prices API.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct PricesPage {
    /// Items.
    #[serde(default)]
    pub items: Vec<PriceItem>,
    /// The next page, absent or empty on the last.
    #[serde(default)]
    pub next_page_link: Option<String>,
}

/// One price.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PriceItem {
    /// ARM size name.
    #[serde(default)]
    pub arm_sku_name: String,
    /// USD/hour.
    pub retail_price: f64,
    /// `D2s v5 Spot`.
    #[serde(default)]
    pub sku_name: String,
    /// `Virtual Machines DSv5 Series Windows`.
    #[serde(default)]
    pub product_name: String,
    /// `D2s v5 Low Priority`.
    #[serde(default)]
    pub meter_name: String,
    /// `Consumption`.
    #[serde(default, rename = "type")]
    pub price_type: String,
    /// `1 Hour`.
    #[serde(default)]
    pub unit_of_measure: String,
}

/// On-demand and spot prices per size.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prices {
    /// Size → on-demand USD/hour.
    pub on_demand: BTreeMap<String, f64>,
    /// Size → spot USD/hour.
    pub spot: BTreeMap<String, f64>,
}

impl Prices {
    /// Adds a page's Linux consumption prices.
    pub fn add(&mut self, items: &[PriceItem]) {
        for item in items {
            if item.product_name.ends_with(" Windows")
                || item.meter_name.ends_with(" Low Priority")
                || item.arm_sku_name.is_empty()
                || (!item.price_type.is_empty() && item.price_type != "Consumption")
                || !(item.retail_price.is_finite() && item.retail_price > 0.0)
            {
                continue;
            }
            let map = if item.sku_name.ends_with(" Spot") {
                &mut self.spot
            } else {
                &mut self.on_demand
            };
            // Several meters can price one size; the lowest is what a VM is billed.
            map.entry(item.arm_sku_name.clone())
                .and_modify(|p| *p = p.min(item.retail_price))
                .or_insert(item.retail_price);
        }
    }
}

/// The first page's URL.
pub fn prices_url(endpoint: &str, region: &str) -> String {
    let filter = format!(
        "priceType eq 'Consumption' and currencyCode eq 'USD' and serviceFamily eq 'Compute' and serviceName eq 'Virtual Machines' and armRegionName eq '{region}'"
    );
    let mut url = format!(
        "{}/api/retail/prices?api-version={PRICES_API_VERSION}&$filter=",
        endpoint.trim_end_matches('/')
    );
    for b in filter.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                url.push(b as char)
            }
            _ => url.push_str(&format!("%{b:02X}")),
        }
    }
    url
}

/// Why the live catalog could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LiveCatalogError {
    /// Resource SKUs failed.
    #[error("reading Resource SKUs: {0}")]
    Skus(#[source] ArmError),
    /// The Retail Prices API failed.
    #[error("reading retail prices from {url}: {message}")]
    Prices {
        /// The page.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// Nothing usable came back.
    #[error("the live catalog for {region} is empty: {what}")]
    Empty {
        /// Region.
        region: String,
        /// What was missing.
        what: String,
    },
}

/// Reads every page of retail prices for `region`.
pub async fn fetch_prices(
    http: &reqwest::Client,
    endpoint: &str,
    region: &str,
) -> Result<Prices, LiveCatalogError> {
    let mut prices = Prices::default();
    let mut url = prices_url(endpoint, region);
    // A loop guard: the API pages by 100-1000 items; no region has a million prices.
    for _ in 0..10_000 {
        let err = |message: String| LiveCatalogError::Prices {
            url: url.clone(),
            message,
        };
        let response = http
            .get(&url)
            .send()
            .await
            .map_err(|e| err(e.to_string()))?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| err(e.to_string()))?;
        if !status.is_success() {
            return Err(err(format!(
                "HTTP {status}: {}",
                String::from_utf8_lossy(&bytes)
            )));
        }
        let page: PricesPage =
            serde_json::from_slice(&bytes).map_err(|e| err(format!("unexpected body: {e}")))?;
        prices.add(&page.items);
        match page.next_page_link.filter(|l| !l.is_empty()) {
            Some(next) => url = next,
            None => return Ok(prices),
        }
    }
    Err(LiveCatalogError::Prices {
        url,
        message: "more than 10000 pages".to_string(),
    })
}

/// Reads SKUs and prices and builds the catalog (`source` names it in reports).
pub async fn fetch(
    arm: &Arm,
    http: &reqwest::Client,
    prices_endpoint: &str,
    region: &str,
) -> Result<(Catalog, Skus), LiveCatalogError> {
    let listing = arm
        .list_skus(region)
        .await
        .map_err(LiveCatalogError::Skus)?;
    let skus = parse_skus(region, &listing);
    if skus.catalog.is_empty() {
        return Err(LiveCatalogError::Empty {
            region: region.to_string(),
            what: format!("no VM sizes among {} Resource SKUs", listing.len()),
        });
    }
    let prices = fetch_prices(http, prices_endpoint, region).await?;
    if prices.on_demand.is_empty() {
        return Err(LiveCatalogError::Empty {
            region: region.to_string(),
            what: "no on-demand Linux prices".to_string(),
        });
    }
    let catalog = Catalog::from_live(
        "azure",
        region,
        skus.catalog.clone(),
        prices.on_demand,
        prices.spot,
    );
    Ok((catalog, skus))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skewer_eastus() -> Vec<ResourceSku> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../shared/data/azure/arm/skewer/testdata/eastus.json"
        );
        let text = std::fs::read_to_string(path).expect("shared fixture");
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        serde_json::from_value(v["value"].clone()).expect("resource skus")
    }

    #[test]
    fn restricted_sizes_are_dropped_and_capabilities_read() {
        let skus = parse_skus("eastus", &skewer_eastus());
        let names: Vec<&str> = skus.catalog.iter().map(|s| s.sku.name.as_str()).collect();
        assert!(!names.contains(&"Standard_D13_v2_Promo"), "{names:?}");
        assert!(skus.restricted.iter().any(|n| n == "Standard_D13_v2_Promo"));
        let d4 = skus
            .catalog
            .iter()
            .find(|s| s.sku.name == "Standard_D4s_v3")
            .expect("D4s_v3");
        assert_eq!(d4.sku.vcpus, 4);
        assert_eq!(d4.sku.memory_gib, 16.0);
        assert!(d4.spot_capable);
        let facts = &skus.facts["Standard_D4s_v3"];
        assert!(facts.accelerated_networking);
        assert!(facts.hyperv_gen2);
    }

    #[test]
    fn windows_and_low_priority_prices_are_skipped_and_spot_is_split_out() {
        let item = |sku: &str, product: &str, meter: &str, price| PriceItem {
            arm_sku_name: "Standard_D2s_v5".to_string(),
            retail_price: price,
            sku_name: sku.to_string(),
            product_name: product.to_string(),
            meter_name: meter.to_string(),
            price_type: "Consumption".to_string(),
            unit_of_measure: "1 Hour".to_string(),
        };
        let mut p = Prices::default();
        p.add(&[
            item("D2s v5", "Virtual Machines DSv5 Series", "D2s v5", 0.096),
            item(
                "D2s v5",
                "Virtual Machines DSv5 Series Windows",
                "D2s v5",
                0.188,
            ),
            item(
                "D2s v5 Low Priority",
                "Virtual Machines DSv5 Series",
                "D2s v5 Low Priority",
                0.0192,
            ),
            item(
                "D2s v5 Spot",
                "Virtual Machines DSv5 Series",
                "D2s v5 Spot",
                0.0110,
            ),
        ]);
        assert_eq!(p.on_demand["Standard_D2s_v5"], 0.096);
        assert_eq!(p.spot["Standard_D2s_v5"], 0.0110);
    }

    #[test]
    fn the_prices_url_filters_linux_consumption_in_the_region() {
        let u = prices_url("https://prices.azure.com/", "eastus");
        assert!(u.starts_with("https://prices.azure.com/api/retail/prices?api-version=2023-01-01-preview&$filter=priceType%20eq%20%27Consumption%27"), "{u}");
        assert!(u.ends_with("armRegionName%20eq%20%27eastus%27"), "{u}");
    }
}
