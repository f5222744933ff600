//! The catalog: which Azure VM sizes exist, what they hold, and what they cost per region.
//!
//! Two sources share one CSV format (the columns of `skus.csv` and `prices.csv` described
//! in the data README): the small built-in catalog compiled into the binary, so Tailor runs
//! with no network, and a directory given with `--catalog-dir`. Parsing is pure; only
//! [`Catalog::load_dir`] touches the file system. Spot prices are not published in this
//! data: spot offerings are estimated from on-demand prices with a discount factor and
//! flagged as estimates wherever they show.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::model::{CapacityType, InstanceType, NodeSettings, Offering, Sku, SkuName};
use crate::scheduling::PoolTypes;

const BUILTIN_SKUS: &str = include_str!("builtin-skus.csv");
const BUILTIN_PRICES: &str = include_str!("builtin-prices.csv");

/// Why a catalog could not be loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// A catalog file could not be read.
    #[error("reading catalog file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A CSV file is malformed.
    #[error("{file}: {source}")]
    Csv {
        /// Which file (name or "built-in skus").
        file: String,
        /// The CSV error, with its position.
        #[source]
        source: csv::Error,
    },
    /// A required column is missing from the header.
    #[error("{file}: missing column {column:?}")]
    MissingColumn {
        /// Which file.
        file: String,
        /// The column name.
        column: &'static str,
    },
    /// A cell does not hold what its column promises.
    #[error("{file} line {line}: column {column:?} has invalid value {value:?}")]
    BadValue {
        /// Which file.
        file: String,
        /// 1-based line number.
        line: u64,
        /// The column name.
        column: &'static str,
        /// The cell as written.
        value: String,
    },
    /// A size, or a size's price in a region, is listed twice; which row should win is
    /// not for Tailor to guess.
    #[error("{file} line {line}: {what} is listed again (first at line {first}); keep one row")]
    Duplicate {
        /// Which file.
        file: String,
        /// 1-based line of the second row.
        line: u64,
        /// 1-based line of the first row.
        first: u64,
        /// The size, or the region and size.
        what: String,
    },
    /// A zone name is not usable.
    #[error("zone {zone:?}: {reason}")]
    BadZone {
        /// The zone as given.
        zone: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The region has no prices at all.
    #[error(
        "region {region:?} has no prices in the {source_name} catalog (known regions: {known})"
    )]
    UnknownRegion {
        /// The requested region.
        region: String,
        /// Which catalog.
        source_name: String,
        /// Regions that do have prices.
        known: String,
    },
    /// The spot discount is outside 0..1.
    #[error("spot discount {0} must be between 0 and 1 (the fraction off the on-demand price)")]
    BadSpotDiscount(f64),
}

/// A catalog shared between the controllers and a cloud that refreshes it.
pub type SharedCatalog = std::sync::Arc<std::sync::RwLock<Catalog>>;

/// Result alias for catalog operations.
pub type Result<T> = std::result::Result<T, CatalogError>;

/// A VM size as listed in the catalog, with the admission facts the provider needs.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogSku {
    /// Hardware facts; `None` fields in the source make the size unusable.
    pub sku: Sku,
    /// Whether AKS node provisioning knows this size (unknown sizes are left out).
    pub known: bool,
    /// Whether AKS or the node provisioner refuses this size.
    pub restricted: bool,
    /// Zone numbers (`"1"`, `"2"`) the size is sold in, when the source says (Resource
    /// SKUs, with restricted zones removed); `None` offers it in every zone.
    pub zones: Option<Vec<String>>,
    /// Whether the size can run as spot (`LowPriorityCapable`).
    pub spot_capable: bool,
}

/// Options for turning the catalog into instance types for one region.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogOptions {
    /// Azure region, e.g. `eastus`.
    pub region: String,
    /// Zones to offer; empty means `<region>-1..3`.
    pub zones: Vec<String>,
    /// Fraction off the on-demand price used to estimate spot prices (0.6 = 60% off).
    pub spot_discount: f64,
    /// Whether to offer spot capacity at all.
    pub include_spot: bool,
    /// Node settings from the AKSNodeClass (overhead model, maxPods, disk).
    pub node: NodeSettings,
}

impl CatalogOptions {
    /// Default options for a region: three zones, spot estimated at 60% off.
    pub fn for_region(region: &str) -> Self {
        CatalogOptions {
            region: region.to_string(),
            zones: Vec::new(),
            spot_discount: DEFAULT_SPOT_DISCOUNT,
            include_spot: true,
            node: NodeSettings::default(),
        }
    }
}

/// The default spot discount: Azure spot usually sells 60-90% below list price; Tailor
/// assumes the low end so that spot savings are not overstated.
pub const DEFAULT_SPOT_DISCOUNT: f64 = 0.6;

/// VM sizes and on-demand list prices per region.
#[derive(Debug, Clone)]
pub struct Catalog {
    /// Where the catalog came from ("built-in" or a directory), for messages.
    pub source: String,
    skus: Vec<CatalogSku>,
    /// region → size name → USD/hour.
    prices: BTreeMap<String, BTreeMap<String, f64>>,
    /// region → size name → published spot USD/hour (live catalogs only).
    spot_prices: BTreeMap<String, BTreeMap<String, f64>>,
    /// The instance types already built, per options: a catalog never changes once made
    /// (a refresh makes a new one), and the agent's controllers ask for the same sizes on
    /// every pass.
    built: Arc<Mutex<Vec<Built>>>,
    /// The same with offerings marked unavailable, as planning shares them.
    marked: Arc<Mutex<Vec<Marked>>>,
}

/// Instance types built once for a set of options.
type Built = (CatalogOptions, Arc<Vec<InstanceType>>);

/// Offerings a cloud reports unavailable: size, zone, capacity type.
pub type Unavailable = std::collections::BTreeSet<(String, String, CapacityType)>;

/// Instance types built for a set of options with some offerings marked unavailable.
type Marked = (CatalogOptions, Unavailable, PoolTypes);

impl Catalog {
    /// The catalog compiled into the binary.
    pub fn builtin() -> Result<Self> {
        Self::from_csv("built-in", BUILTIN_SKUS, BUILTIN_PRICES)
    }

    /// Reads `skus.csv` and `prices.csv` from a directory.
    pub fn load_dir(dir: &Path) -> Result<Self> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path).map_err(|source| CatalogError::Read { path, source })
        };
        Self::from_csv(
            &dir.display().to_string(),
            &read("skus.csv")?,
            &read("prices.csv")?,
        )
    }

    /// Parses the two CSV texts. Rows with unknown vCPU or memory are kept but never
    /// offered; malformed cells are errors naming the file, line and column.
    pub fn from_csv(source: &str, skus_csv: &str, prices_csv: &str) -> Result<Self> {
        let skus = parse_skus(&format!("{source}/skus.csv"), skus_csv)?;
        let prices = parse_prices(&format!("{source}/prices.csv"), prices_csv)?;
        Ok(Catalog {
            source: source.to_string(),
            skus,
            prices,
            spot_prices: BTreeMap::new(),
            built: Arc::default(),
            marked: Arc::default(),
        })
    }

    /// A catalog read from a cloud's APIs: sizes with their zones and spot capability, and
    /// published on-demand and spot prices for one region. Spot offerings then carry the
    /// published price (never an estimate), and a size without a spot price has none.
    pub fn from_live(
        source: &str,
        region: &str,
        skus: Vec<CatalogSku>,
        on_demand: BTreeMap<String, f64>,
        spot: BTreeMap<String, f64>,
    ) -> Self {
        let region = region.to_ascii_lowercase();
        Catalog {
            source: source.to_string(),
            skus,
            prices: BTreeMap::from([(region.clone(), on_demand)]),
            spot_prices: BTreeMap::from([(region, spot)]),
            built: Arc::default(),
            marked: Arc::default(),
        }
    }

    /// Whether spot prices for `region` are published ones rather than estimates.
    pub fn has_spot_prices(&self, region: &str) -> bool {
        self.spot_prices.contains_key(&region.to_ascii_lowercase())
    }

    /// Every size in the catalog.
    pub fn skus(&self) -> &[CatalogSku] {
        &self.skus
    }

    /// Regions that have at least one price.
    pub fn regions(&self) -> Vec<&str> {
        self.prices.keys().map(String::as_str).collect()
    }

    /// The on-demand list price of a size in a region, if published and non-zero.
    /// Region names match case-insensitively (`EastUS` is `eastus`).
    pub fn price(&self, region: &str, size: &str) -> Option<f64> {
        self.prices
            .get(&region.to_ascii_lowercase())
            .and_then(|p| p.get(size))
            .copied()
            .filter(|p| *p > 0.0)
    }

    /// The instance types a node provisioner may buy in `options.region`, with offerings
    /// per zone and capacity type, sorted by name.
    ///
    /// Admission mirrors AKS node provisioning: at least 2 vCPUs and 3.5 GiB, not
    /// restricted, known to AKS, no confidential (DC/EC) or constrained-vCPU sizes, and a
    /// non-zero list price in the region.
    pub fn instance_types(&self, options: &CatalogOptions) -> Result<Vec<InstanceType>> {
        self.shared_instance_types(options).map(|t| (*t).clone())
    }

    /// [`Catalog::instance_types`], built once per options and shared.
    pub fn shared_instance_types(
        &self,
        options: &CatalogOptions,
    ) -> Result<Arc<Vec<InstanceType>>> {
        let mut built = self.built.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, types)) = built.iter().find(|(o, _)| o == options) {
            return Ok(types.clone());
        }
        let types = Arc::new(self.build_instance_types(options)?);
        // One entry per node class's settings; a bound all the same.
        if built.len() >= 64 {
            built.clear();
        }
        built.push((options.clone(), types.clone()));
        Ok(types)
    }

    /// [`Catalog::instance_types`] with the offerings in `unavailable` marked so, as one
    /// list planning shares: the same options and set give the very same list, so what
    /// scheduling derives from it ([`PoolTypes`]) is kept from one pass to the next.
    pub fn planning_types(
        &self,
        options: &CatalogOptions,
        unavailable: &Unavailable,
    ) -> Result<PoolTypes> {
        {
            let marked = self.marked.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((_, _, types)) = marked
                .iter()
                .find(|(o, u, _)| o == options && u == unavailable)
            {
                return Ok(types.clone());
            }
        }
        let mut types = self.instance_types(options)?;
        for t in &mut types {
            for o in &mut t.offerings {
                if unavailable.contains(&(t.name.clone(), o.zone.clone(), o.capacity_type)) {
                    o.available = false;
                }
            }
        }
        let types = PoolTypes::new(types);
        let mut marked = self.marked.lock().unwrap_or_else(PoisonError::into_inner);
        // One list per node class's settings for the offerings unavailable now (a change in
        // them makes new lists); each holds a copy of the catalog and the pools' shares of
        // it, so only a few are kept.
        if marked.len() >= 8 {
            marked.remove(0);
        }
        marked.push((options.clone(), unavailable.clone(), types.clone()));
        Ok(types)
    }

    fn build_instance_types(&self, options: &CatalogOptions) -> Result<Vec<InstanceType>> {
        if !(0.0..1.0).contains(&options.spot_discount) {
            return Err(CatalogError::BadSpotDiscount(options.spot_discount));
        }
        // Azure's region names are lower-case ids; `EastUS` as the portal shows it means
        // the same region.
        let region = options.region.to_ascii_lowercase();
        let Some(prices) = self.prices.get(&region) else {
            return Err(CatalogError::UnknownRegion {
                region: options.region.clone(),
                source_name: self.source.clone(),
                known: self.regions().join(", "),
            });
        };
        let zones: Vec<String> = if options.zones.is_empty() {
            (1..=3).map(|n| format!("{region}-{n}")).collect()
        } else {
            options.zones.clone()
        };
        for (i, zone) in zones.iter().enumerate() {
            if zone.trim().is_empty() {
                return Err(CatalogError::BadZone {
                    zone: zone.clone(),
                    reason: "a zone name must not be empty (e.g. eastus-1)",
                });
            }
            if zones[..i].contains(zone) {
                return Err(CatalogError::BadZone {
                    zone: zone.clone(),
                    reason: "the zone is given twice",
                });
            }
        }
        let mut out = Vec::new();
        for entry in &self.skus {
            if !admissible(entry) {
                continue;
            }
            let Some(&price) = prices.get(&entry.sku.name).filter(|p| **p > 0.0) else {
                continue;
            };
            let published_spot = self.spot_prices.get(&region);
            let spot_price = match published_spot {
                Some(spot) => entry
                    .spot_capable
                    .then(|| spot.get(&entry.sku.name).copied())
                    .flatten()
                    .filter(|p| *p > 0.0)
                    .map(|p| (p, false)),
                None => Some((round_price(price * (1.0 - options.spot_discount)), true)),
            };
            let sku_zones: Vec<&String> = zones
                .iter()
                .filter(|z| {
                    entry.zones.as_ref().is_none_or(|allowed| {
                        z.rsplit('-')
                            .next()
                            .is_some_and(|n| allowed.iter().any(|a| a == n))
                    })
                })
                .collect();
            if sku_zones.is_empty() {
                continue;
            }
            let mut offerings = Vec::with_capacity(sku_zones.len() * 2);
            for zone in sku_zones {
                offerings.push(Offering {
                    zone: zone.clone(),
                    capacity_type: CapacityType::OnDemand,
                    price_per_hour: price,
                    price_is_estimate: false,
                    available: true,
                });
                if options.include_spot
                    && let Some((spot, estimate)) = spot_price
                {
                    offerings.push(Offering {
                        zone: zone.clone(),
                        capacity_type: CapacityType::Spot,
                        price_per_hour: spot,
                        price_is_estimate: estimate,
                        available: true,
                    });
                }
            }
            out.push(InstanceType::new(
                entry.sku.clone(),
                &region,
                offerings,
                &options.node,
            ));
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

/// Rounds a derived price to the catalog's six decimals.
fn round_price(p: f64) -> f64 {
    crate::model::quantity::round_to(p, 6)
}

fn admissible(entry: &CatalogSku) -> bool {
    let sku = &entry.sku;
    let name = SkuName::parse(&sku.name);
    let confidential = name.family == "DC" || name.family == "EC";
    let constrained = sku.name.contains('-');
    entry.known
        && !entry.restricted
        && !confidential
        && !constrained
        && sku.vcpus >= 2
        && sku.memory_gib >= 3.5
}

/// Column positions looked up by name, so extra columns and any order are accepted.
struct Columns {
    file: String,
    index: BTreeMap<String, usize>,
}

impl Columns {
    fn new(file: &str, headers: &csv::StringRecord) -> Self {
        Columns {
            file: file.to_string(),
            index: headers
                .iter()
                .enumerate()
                .map(|(i, h)| (h.trim().to_string(), i))
                .collect(),
        }
    }

    fn require(&self, column: &'static str) -> Result<usize> {
        self.index
            .get(column)
            .copied()
            .ok_or_else(|| CatalogError::MissingColumn {
                file: self.file.clone(),
                column,
            })
    }

    fn bad(&self, record: &csv::StringRecord, column: &'static str, value: &str) -> CatalogError {
        CatalogError::BadValue {
            file: self.file.clone(),
            line: record.position().map_or(0, |p| p.line()),
            column,
            value: value.to_string(),
        }
    }
}

impl Columns {
    /// Records where `key` was first seen; a second row for it is an error.
    fn first_time(
        &self,
        seen: &mut BTreeMap<String, u64>,
        record: &csv::StringRecord,
        key: String,
    ) -> Result<()> {
        let line = record.position().map_or(0, |p| p.line());
        match seen.get(&key) {
            Some(&first) => Err(CatalogError::Duplicate {
                file: self.file.clone(),
                line,
                first,
                what: key,
            }),
            None => {
                seen.insert(key, line);
                Ok(())
            }
        }
    }
}

fn reader(text: &str) -> csv::Reader<&[u8]> {
    csv::ReaderBuilder::new()
        .comment(Some(b'#'))
        .flexible(false)
        .from_reader(text.as_bytes())
}

fn parse_bool(
    cols: &Columns,
    rec: &csv::StringRecord,
    column: &'static str,
    idx: Option<usize>,
) -> Result<bool> {
    match idx.and_then(|i| rec.get(i)).unwrap_or("") {
        "true" => Ok(true),
        "false" | "" => Ok(false),
        other => Err(cols.bad(rec, column, other)),
    }
}

fn parse_skus(file: &str, text: &str) -> Result<Vec<CatalogSku>> {
    let csv_err = |source| CatalogError::Csv {
        file: file.to_string(),
        source,
    };
    let mut rdr = reader(text);
    let cols = Columns::new(file, rdr.headers().map_err(csv_err)?);
    let name_i = cols.require("name")?;
    let vcpus_i = cols.require("vcpus")?;
    let mem_i = cols.require("memory_gib")?;
    let gpus_i = cols.index.get("gpus").copied();
    let arch_i = cols.index.get("arch").copied();
    let arch_name_i = cols.index.get("arch_from_name").copied();
    let known_i = cols.index.get("in_known_skus").copied();
    let aks_r_i = cols.index.get("aks_restricted").copied();
    let karp_r_i = cols.index.get("karpenter_restricted").copied();
    let mut out = Vec::new();
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    for rec in rdr.records() {
        let rec = rec.map_err(csv_err)?;
        let cell = |i: usize| rec.get(i).unwrap_or("").trim();
        let name = cell(name_i);
        if name.is_empty() {
            return Err(cols.bad(&rec, "name", name));
        }
        cols.first_time(&mut seen, &rec, name.to_string())?;
        let (vcpus, memory) = (cell(vcpus_i), cell(mem_i));
        if vcpus.is_empty() || memory.is_empty() {
            continue; // size without published capacity: never offered
        }
        let vcpus: u32 = vcpus.parse().map_err(|_| cols.bad(&rec, "vcpus", vcpus))?;
        let memory_gib: f64 = memory
            .parse()
            .ok()
            .filter(|m: &f64| m.is_finite() && *m >= 0.0)
            .ok_or_else(|| cols.bad(&rec, "memory_gib", memory))?;
        let gpus = match gpus_i.map(cell).unwrap_or("") {
            "" => 0,
            g => g.parse().map_err(|_| cols.bad(&rec, "gpus", g))?,
        };
        let arch = match (
            arch_i.map(cell).unwrap_or(""),
            arch_name_i.map(cell).unwrap_or(""),
        ) {
            ("", "") => "amd64",
            ("", from_name) => from_name,
            (arch, _) => arch,
        };
        if arch != "amd64" && arch != "arm64" {
            return Err(cols.bad(&rec, "arch", arch));
        }
        // Catalogs without the column are taken as all-known (hand-written files).
        let known = known_i.is_none() || parse_bool(&cols, &rec, "in_known_skus", known_i)?;
        let restricted = parse_bool(&cols, &rec, "aks_restricted", aks_r_i)?
            || parse_bool(&cols, &rec, "karpenter_restricted", karp_r_i)?;
        out.push(CatalogSku {
            sku: Sku {
                name: name.to_string(),
                vcpus,
                memory_gib,
                gpus,
                arch: arch.to_string(),
            },
            known,
            restricted,
            zones: None,
            spot_capable: true,
        });
    }
    Ok(out)
}

fn parse_prices(file: &str, text: &str) -> Result<BTreeMap<String, BTreeMap<String, f64>>> {
    let csv_err = |source| CatalogError::Csv {
        file: file.to_string(),
        source,
    };
    let mut rdr = reader(text);
    let cols = Columns::new(file, rdr.headers().map_err(csv_err)?);
    let region_i = cols.require("region")?;
    let sku_i = cols.require("sku")?;
    let price_i = cols.require("price_on_demand_usd_per_hour")?;
    let kind_i = cols.index.get("sku_kind").copied();
    let mut out: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    for rec in rdr.records() {
        let rec = rec.map_err(csv_err)?;
        let cell = |i: usize| rec.get(i).unwrap_or("").trim();
        // Dedicated-host prices are per host, not per VM.
        if kind_i.map(cell).is_some_and(|k| k != "vm" && !k.is_empty()) {
            continue;
        }
        let raw = cell(price_i);
        let price: f64 = raw
            .parse()
            .ok()
            .filter(|p: &f64| p.is_finite() && *p >= 0.0)
            .ok_or_else(|| cols.bad(&rec, "price_on_demand_usd_per_hour", raw))?;
        let region = cell(region_i).to_ascii_lowercase();
        let sku = cell(sku_i);
        cols.first_time(&mut seen, &rec, format!("{sku} in {region}"))?;
        out.entry(region)
            .or_default()
            .insert(sku.to_string(), price);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planning_types_are_one_list_per_options_and_unavailable_offerings() {
        let catalog = Catalog::builtin().expect("built-in catalog");
        let options = CatalogOptions::for_region("eastus");
        let none = Unavailable::new();
        let a = catalog.planning_types(&options, &none).expect("types");
        let b = catalog.planning_types(&options, &none).expect("types");
        // The same list, so what planning derives from it is shared.
        assert!(std::ptr::eq(a.as_ptr(), b.as_ptr()));
        assert!(a.iter().all(|t| t.offerings.iter().all(|o| o.available)));
        let size = a[0].name.clone();
        let zone = a[0].offerings[0].zone.clone();
        let ct = a[0].offerings[0].capacity_type;
        let out = Unavailable::from([(size.clone(), zone.clone(), ct)]);
        let c = catalog.planning_types(&options, &out).expect("types");
        assert!(!std::ptr::eq(a.as_ptr(), c.as_ptr()));
        let marked: Vec<(String, String, CapacityType)> = c
            .iter()
            .flat_map(|t| {
                t.offerings
                    .iter()
                    .filter(|o| !o.available)
                    .map(|o| (t.name.clone(), o.zone.clone(), o.capacity_type))
            })
            .collect();
        assert_eq!(
            marked,
            [(size, zone, ct)],
            "exactly the offering reported out"
        );
        // The list without the outage is still the first one.
        let d = catalog.planning_types(&options, &none).expect("types");
        assert!(std::ptr::eq(a.as_ptr(), d.as_ptr()));
    }
    use crate::model::Requirements;
    use crate::model::requirements::Requirement;

    const SKUS: &str = "name,vcpus,memory_gib\nStandard_D2s_v5,2,8\nStandard_D4s_v5,4,16\n";
    const PRICES: &str = "region,sku,price_on_demand_usd_per_hour\neastus,Standard_D2s_v5,0.096\n\
                          eastus,Standard_D4s_v5,0.192\n";

    #[test]
    fn a_size_or_a_price_listed_twice_is_an_error_naming_both_lines() {
        let skus = format!("{SKUS}Standard_D2s_v5,2,16\n");
        let err = Catalog::from_csv("cat", &skus, PRICES).expect_err("duplicate size");
        assert_eq!(
            err.to_string(),
            "cat/skus.csv line 4: Standard_D2s_v5 is listed again (first at line 2); keep one row"
        );
        let prices = format!("{PRICES}EastUS,Standard_D4s_v5,0.5\n");
        let err = Catalog::from_csv("cat", SKUS, &prices).expect_err("duplicate price");
        assert_eq!(
            err.to_string(),
            "cat/prices.csv line 4: Standard_D4s_v5 in eastus is listed again (first at line 3); keep one row"
        );
    }

    #[test]
    fn region_names_match_whatever_their_case() {
        let catalog = Catalog::from_csv("cat", SKUS, PRICES).expect("parses");
        let types = catalog
            .instance_types(&CatalogOptions::for_region("EastUS"))
            .expect("EastUS is eastus");
        assert_eq!(types.len(), 2);
        assert_eq!(types[0].offerings[0].zone, "eastus-1");
        assert_eq!(catalog.price("EASTUS", "Standard_D2s_v5"), Some(0.096));
    }

    #[test]
    fn an_empty_or_repeated_zone_is_refused() {
        let catalog = Catalog::from_csv("cat", SKUS, PRICES).expect("parses");
        for (zones, message) in [
            (
                vec![String::new()],
                "zone \"\": a zone name must not be empty (e.g. eastus-1)",
            ),
            (
                vec!["eastus-1".to_string(), "eastus-1".to_string()],
                "zone \"eastus-1\": the zone is given twice",
            ),
        ] {
            let options = CatalogOptions {
                zones,
                ..CatalogOptions::for_region("eastus")
            };
            let err = catalog.instance_types(&options).expect_err("bad zones");
            assert_eq!(err.to_string(), message);
        }
    }

    #[test]
    fn builtin_catalog_covers_d_e_f_in_both_architectures_and_two_regions() {
        let catalog = Catalog::builtin().expect("built-in catalog parses");
        for region in ["eastus", "westeurope"] {
            let types = catalog
                .instance_types(&CatalogOptions::for_region(region))
                .expect("region is priced");
            assert!(types.len() >= 40, "{region}: {} sizes", types.len());
            for family in ["D", "E", "F"] {
                assert!(
                    types.iter().any(|t| t.sku_name.family == family),
                    "{family}"
                );
            }
            for arch in ["amd64", "arm64"] {
                assert!(types.iter().any(|t| t.sku.arch == arch), "{arch}");
            }
            assert!(
                types.iter().any(|t| t.sku.vcpus == 2) && types.iter().any(|t| t.sku.vcpus == 64)
            );
        }
    }

    #[test]
    fn spot_offerings_are_estimated_from_on_demand_and_flagged() {
        let catalog = Catalog::builtin().expect("built-in catalog parses");
        let types = catalog
            .instance_types(&CatalogOptions::for_region("eastus"))
            .expect("eastus is priced");
        let d2 = types
            .iter()
            .find(|t| t.name == "Standard_D2s_v5")
            .expect("D2s_v5 listed");
        assert_eq!(d2.offerings.len(), 6);
        let spot =
            Requirements::new().with(Requirement::one_of("tailor.sh/capacity-type", ["spot"]));
        let o = d2.cheapest_offering(&spot).expect("spot offered");
        assert!(o.price_is_estimate);
        assert!((o.price_per_hour - 0.096 * 0.4).abs() < 1e-9);
    }

    #[test]
    fn unknown_region_lists_the_known_ones() {
        let catalog = Catalog::builtin().expect("built-in catalog parses");
        let err = catalog
            .instance_types(&CatalogOptions::for_region("marsnorth"))
            .expect_err("no such region");
        let msg = err.to_string();
        assert!(
            msg.contains("\"marsnorth\"") && msg.contains("eastus"),
            "{msg}"
        );
    }

    #[test]
    fn malformed_cells_name_file_line_column_and_value() {
        let skus = "name,vcpus,memory_gib,arch\nStandard_D2s_v5,2,8,amd64\nStandard_D4s_v5,four,16,amd64\n";
        let err = Catalog::from_csv("test", skus, "region,sku,price_on_demand_usd_per_hour\n")
            .expect_err("bad vcpus");
        let msg = err.to_string();
        assert!(
            msg.contains("test/skus.csv line 3")
                && msg.contains("\"vcpus\"")
                && msg.contains("\"four\""),
            "{msg}"
        );
        let err = Catalog::from_csv(
            "test",
            "name,vcpus\n",
            "region,sku,price_on_demand_usd_per_hour\n",
        )
        .expect_err("missing column");
        assert!(err.to_string().contains("memory_gib"));
    }

    #[test]
    fn sizes_the_provisioner_would_refuse_are_not_offered() {
        let skus = "name,vcpus,memory_gib,arch,in_known_skus,aks_restricted\n\
                    Standard_B1s,1,1,amd64,true,true\n\
                    Standard_DC4as_v5,4,16,amd64,true,false\n\
                    Standard_E64-16as_v6,64,512,amd64,true,false\n\
                    Standard_D4s_v5,4,16,amd64,true,false\n\
                    Standard_D8s_v5,8,32,amd64,false,false\n\
                    Standard_D16s_v5,,,,true,false\n";
        let prices = "region,sku,price_on_demand_usd_per_hour\n\
                      eastus,Standard_B1s,0.01\neastus,Standard_DC4as_v5,0.2\n\
                      eastus,Standard_E64-16as_v6,4\neastus,Standard_D4s_v5,0.192\n\
                      eastus,Standard_D8s_v5,0.384\neastus,Standard_D16s_v5,0.768\n";
        let catalog = Catalog::from_csv("test", skus, prices).expect("parses");
        let names: Vec<String> = catalog
            .instance_types(&CatalogOptions::for_region("eastus"))
            .expect("priced")
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert_eq!(names, vec!["Standard_D4s_v5".to_string()]);
    }
}
