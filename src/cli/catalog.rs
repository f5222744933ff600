//! `tailor catalog`: the VM sizes Tailor can buy, with allocatable after AKS overhead and
//! the price of every offering.

use std::collections::BTreeMap;
use std::io::Write;

use clap::Args;
use serde::Serialize;

use super::{CatalogSourceArgs, CliError, OutputArgs, Result};
use crate::model::quantity::{display_bytes, display_cores};
use crate::model::{
    CapacityType, InstanceType, Offering, OverheadModel, Requirement, Requirements,
};
use crate::report::Table;

/// Arguments of `tailor catalog`.
#[derive(Debug, Clone, Args)]
pub struct CatalogArgs {
    /// Where sizes and prices come from.
    #[command(flatten)]
    pub source: CatalogSourceArgs,

    /// Only sizes (and offerings) that satisfy this requirement, written
    /// `<key> <Operator> [v1,v2]`, e.g. `kubernetes.io/arch In arm64` or
    /// `tailor.sh/sku-cpu Lte 8`. Repeat to AND several.
    #[arg(
        long = "requirement",
        short = 'r',
        env = "TAILOR_REQUIREMENTS",
        value_delimiter = ';'
    )]
    pub requirements: Vec<String>,

    /// Output format.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// The `-o json|yaml` document.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CatalogReport {
    /// Region priced.
    pub region: String,
    /// Where the catalog came from.
    pub source: String,
    /// kube-reserved memory formula used for allocatable.
    pub overhead_model: OverheadModel,
    /// Pods per node used for capacity.
    pub max_pods: u32,
    /// Fraction off on-demand used to estimate spot prices.
    pub spot_discount: f64,
    /// Whether spot prices are estimates (true unless the catalog is live).
    pub spot_prices_are_estimates: bool,
    /// The sizes, cheapest on-demand first.
    pub instance_types: Vec<CatalogEntry>,
}

/// One size in the report.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CatalogEntry {
    /// ARM size name.
    pub name: String,
    /// `tailor.sh/sku-family`.
    pub family: String,
    /// `tailor.sh/sku-series`.
    pub series: String,
    /// `tailor.sh/sku-version`.
    pub version: u32,
    /// CPU architecture.
    pub arch: String,
    /// vCPUs.
    pub vcpus: u32,
    /// VM memory in GiB as Azure lists it.
    #[serde(rename = "memoryGiB")]
    pub memory_gib: f64,
    /// GPUs.
    pub gpus: u32,
    /// Node capacity (quantity strings).
    pub capacity: BTreeMap<String, String>,
    /// kube-reserved plus eviction threshold.
    pub overhead: BTreeMap<String, String>,
    /// What pods can request.
    pub allocatable: BTreeMap<String, String>,
    /// The offerings the requirements admit, cheapest first.
    pub offerings: Vec<Offering>,
}

fn entry(it: &InstanceType, offerings: Vec<Offering>) -> CatalogEntry {
    CatalogEntry {
        name: it.name.clone(),
        family: it.sku_name.family.clone(),
        series: it.sku_name.series(),
        version: it.sku_name.version,
        arch: it.sku.arch.clone(),
        vcpus: it.sku.vcpus,
        memory_gib: it.sku.memory_gib,
        gpus: it.sku.gpus,
        capacity: it.capacity.to_quantities(),
        overhead: it.overhead.to_quantities(),
        allocatable: it.allocatable.to_quantities(),
        offerings,
    }
}

/// Builds the report: sizes whose labels satisfy `requirements`, with the offerings whose
/// zone and capacity type do.
pub fn report(args: CatalogArgs) -> Result<CatalogReport> {
    let CatalogArgs {
        source,
        requirements,
        output: _,
    } = args;
    let (catalog, options) = source.load()?;
    let mut wanted = Requirements::new();
    for expression in &requirements {
        wanted.add(Requirement::parse_expression(expression)?);
    }
    let types = catalog.instance_types(&options)?;
    let estimates = !catalog.has_spot_prices(&options.region);
    let mut entries: Vec<CatalogEntry> = types
        .iter()
        .filter(|it| wanted.compatible(&it.requirements).is_ok())
        .filter_map(|it| {
            let offerings: Vec<Offering> = it
                .offerings
                .iter()
                .filter(|o| {
                    wanted
                        .get(crate::apis::labels::ZONE)
                        .is_none_or(|r| r.admits_value(&o.zone))
                        && wanted
                            .get(crate::apis::labels::CAPACITY_TYPE)
                            .is_none_or(|r| r.admits_value(o.capacity_type.as_str()))
                })
                .cloned()
                .collect();
            (!offerings.is_empty()).then(|| entry(it, offerings))
        })
        .collect();
    let cheapest = |e: &CatalogEntry| {
        e.offerings
            .iter()
            .map(|o| o.price_per_hour)
            .fold(f64::INFINITY, f64::min)
    };
    entries.sort_by(|a, b| {
        cheapest(a)
            .total_cmp(&cheapest(b))
            .then_with(|| a.name.cmp(&b.name))
    });
    Ok(CatalogReport {
        region: options.region,
        source: catalog.source,
        overhead_model: options.node.overhead_model,
        max_pods: options.node.max_pods,
        spot_discount: options.spot_discount,
        spot_prices_are_estimates: estimates,
        instance_types: entries,
    })
}

fn price_of(e: &CatalogEntry, ct: CapacityType) -> String {
    e.offerings
        .iter()
        .filter(|o| o.capacity_type == ct)
        .map(|o| o.price_per_hour)
        .reduce(f64::min)
        .map_or_else(|| "-".to_string(), |p| format!("{p:.4}"))
}

/// Renders the report as a table.
pub fn table(report: &CatalogReport) -> String {
    let mut t = Table::new([
        "NAME",
        "ARCH",
        "VCPU",
        "MEMORY",
        "ALLOC CPU",
        "ALLOC MEMORY",
        "PODS",
        "ON-DEMAND $/H",
        if report.spot_prices_are_estimates {
            "SPOT $/H (EST.)"
        } else {
            "SPOT $/H"
        },
        "ZONES",
    ])
    .align_right(&[2, 3, 4, 5, 6, 7, 8]);
    for e in &report.instance_types {
        let alloc = |k: &str| e.allocatable.get(k).cloned().unwrap_or_default();
        let cpu = crate::model::quantity::parse_milli(&alloc("cpu"))
            .map_or_else(|_| alloc("cpu"), display_cores);
        let mem = crate::model::quantity::parse_value(&alloc("memory"))
            .map_or_else(|_| alloc("memory"), display_bytes);
        let zones: std::collections::BTreeSet<&str> =
            e.offerings.iter().map(|o| o.zone.as_str()).collect();
        t.row([
            e.name.clone(),
            e.arch.clone(),
            e.vcpus.to_string(),
            format!("{}Gi", e.memory_gib),
            cpu,
            mem,
            alloc("pods"),
            price_of(e, CapacityType::OnDemand),
            price_of(e, CapacityType::Spot),
            zones.into_iter().collect::<Vec<_>>().join(","),
        ]);
    }
    let mut out = t.render();
    let spot = if report.spot_prices_are_estimates {
        format!(
            "spot prices are estimates ({:.0}% off on-demand)",
            report.spot_discount * 100.0
        )
    } else {
        "spot prices are published prices".to_string()
    };
    out.push_str(&format!(
        "\n{} instance types in {} from the {} catalog; {spot}.\n",
        report.instance_types.len(),
        report.region,
        report.source,
    ));
    out
}

/// Runs `tailor catalog`.
pub fn run(args: CatalogArgs, out: &mut dyn Write) -> Result<()> {
    let format = args.output.output;
    let report = report(args)?;
    let text = crate::report::render(format, &report, table).map_err(CliError::Encode)?;
    out.write_all(text.as_bytes())?;
    Ok(())
}
