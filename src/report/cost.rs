//! Cost allocation over a window: every container's requests and usage per step, priced
//! at the hourly price of the node it ran on, grouped by namespace, workload or NodePool.
//!
//! A node's hourly price is split evenly between its vCPUs and its GiB of memory (the
//! split the right-sizing recommender prices requests with), so a container pays for the
//! share of its node it requests. Per step and resource:
//! - requested: request x price; used: usage x price;
//! - wasted: what was requested and not used, `max(request - usage, 0)` x price;
//! - recommended: the right-sizing recommendation x price over the same steps;
//! - recoverable: requested - recommended (negative: the workload needs more than it
//!   asks for).
//!
//! The frames are polars lazy frames: the request series joined with usage, owners, node
//! facts, catalog prices and recommendations, then grouped and summed.

use polars::prelude::*;

use crate::usage::inventory::Inventory;

const GIB: f64 = (1u64 << 30) as f64;

/// How rows are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GroupBy {
    /// One row per namespace.
    Namespace,
    /// One row per workload (namespace, kind, name).
    Workload,
    /// One row per NodePool.
    Nodepool,
}

impl GroupBy {
    /// The key columns of the grouping.
    pub fn keys(self) -> &'static [&'static str] {
        match self {
            GroupBy::Namespace => &["namespace"],
            GroupBy::Workload => &["namespace", "kind", "workload"],
            GroupBy::Nodepool => &["nodepool"],
        }
    }
}

/// The figure columns of an allocation, in order, after the key columns.
pub const FIGURES: [&str; 11] = [
    "container_hours",
    "requested_cpu_core_hours",
    "used_cpu_core_hours",
    "recommended_cpu_core_hours",
    "requested_memory_gib_hours",
    "used_memory_gib_hours",
    "recommended_memory_gib_hours",
    "requested_cost",
    "used_cost",
    "recommended_cost",
    "wasted_cost",
];

/// The last figure column: recoverable dollars.
pub const RECOVERABLE: &str = "recoverable_cost";

/// Hourly prices per instance type and capacity type, split per core and per GiB.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PriceTable {
    /// ARM size.
    pub instance_type: Vec<String>,
    /// `on-demand` or `spot`.
    pub capacity_type: Vec<String>,
    /// USD per core-hour.
    pub per_core_hour: Vec<f64>,
    /// USD per GiB-hour.
    pub per_gib_hour: Vec<f64>,
}

impl PriceTable {
    /// Adds a size at `price_per_hour` with `cores` vCPUs and `gib` GiB: half the price to
    /// each resource.
    pub fn add(
        &mut self,
        size: &str,
        capacity_type: &str,
        price_per_hour: f64,
        cores: f64,
        gib: f64,
    ) {
        if cores <= 0.0 || gib <= 0.0 || price_per_hour <= 0.0 {
            return;
        }
        self.instance_type.push(size.to_string());
        self.capacity_type.push(capacity_type.to_string());
        self.per_core_hour.push(price_per_hour / 2.0 / cores);
        self.per_gib_hour.push(price_per_hour / 2.0 / gib);
    }

    /// Whether a size is priced for a capacity type.
    pub fn has(&self, size: &str, capacity_type: &str) -> bool {
        self.instance_type
            .iter()
            .zip(&self.capacity_type)
            .any(|(s, c)| s == size && c == capacity_type)
    }
}

/// Recommended requests per workload container (cores and bytes; `None`: not set).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recommended {
    /// Namespace.
    pub namespace: Vec<String>,
    /// Workload kind.
    pub kind: Vec<String>,
    /// Workload name.
    pub workload: Vec<String>,
    /// Container.
    pub container: Vec<String>,
    /// Recommended CPU request, cores.
    pub cpu_cores: Vec<Option<f64>>,
    /// Recommended memory request, bytes.
    pub memory_bytes: Vec<Option<f64>>,
}

/// What an allocation is computed from.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// The window's series.
    pub inventory: &'a Inventory,
    /// Seconds each sample stands for.
    pub step: i64,
    /// Catalog prices.
    pub prices: &'a PriceTable,
    /// For nodes of an unknown size: USD per core-hour and per GiB-hour.
    pub fallback: crate::rightsizing::Prices,
    /// The right-sizing service's recommendations.
    pub recommended: &'a Recommended,
}

fn strings(name: &str, v: &[String]) -> Column {
    Column::new(name.into(), v)
}

fn positive(e: Expr) -> Expr {
    when(e.clone().gt(lit(0.0))).then(e).otherwise(lit(0.0))
}

/// One row per container and step: requests, usage, owner, node, prices and
/// recommendation, with the cost of the step.
fn rows(input: &Input<'_>) -> PolarsResult<LazyFrame> {
    let inv = input.inventory;
    let r = &inv.requests;
    let requests = DataFrame::new_infer_height(vec![
        strings("namespace", &r.namespace),
        strings("pod", &r.pod),
        strings("container", &r.container),
        strings("node", &r.node),
        Column::new("time".into(), &r.time),
        Column::new("cpu_request".into(), &r.cpu_cores),
        Column::new("memory_request".into(), &r.memory_bytes),
    ])?;
    let usage = |s: &crate::usage::inventory::ContainerSamples, name: &str| {
        DataFrame::new_infer_height(vec![
            strings("namespace", &s.namespace),
            strings("pod", &s.pod),
            strings("container", &s.container),
            Column::new("time".into(), &s.time),
            Column::new(name.into(), &s.value),
        ])
    };
    let cpu_used = usage(&inv.cpu_used, "cpu_used")?;
    let memory_used = usage(&inv.memory_used, "memory_used")?;
    let (mut own_ns, mut own_pod, mut own_kind, mut own_name) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for ((ns, pod), (kind, name)) in &inv.owners {
        own_ns.push(ns.clone());
        own_pod.push(pod.clone());
        own_kind.push(kind.clone());
        own_name.push(name.clone());
    }
    let owners = DataFrame::new_infer_height(vec![
        strings("namespace", &own_ns),
        strings("pod", &own_pod),
        strings("kind", &own_kind),
        strings("workload", &own_name),
    ])?;
    let (mut node, mut size, mut pool, mut capacity) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (name, facts) in &inv.nodes {
        node.push(name.clone());
        size.push(facts.instance_type.clone());
        pool.push(facts.node_pool.clone());
        capacity.push(facts.capacity_type.clone());
    }
    let nodes = DataFrame::new_infer_height(vec![
        strings("node", &node),
        strings("instance_type", &size),
        strings("nodepool", &pool),
        strings("capacity_type", &capacity),
    ])?;
    let p = input.prices;
    let prices = DataFrame::new_infer_height(vec![
        strings("instance_type", &p.instance_type),
        strings("capacity_type", &p.capacity_type),
        Column::new("per_core_hour".into(), &p.per_core_hour),
        Column::new("per_gib_hour".into(), &p.per_gib_hour),
    ])?;
    let rec = input.recommended;
    let recommended = DataFrame::new_infer_height(vec![
        strings("namespace", &rec.namespace),
        strings("kind", &rec.kind),
        strings("workload", &rec.workload),
        strings("container", &rec.container),
        Column::new("recommended_cpu".into(), &rec.cpu_cores),
        Column::new("recommended_memory".into(), &rec.memory_bytes),
    ])?;

    let on = |names: &[&str]| names.iter().map(|n| col(*n)).collect::<Vec<_>>();
    let left = |lf: LazyFrame, other: DataFrame, keys: &[&str]| {
        lf.join(
            other.lazy(),
            on(keys),
            on(keys),
            JoinArgs::new(JoinType::Left),
        )
    };
    let container_step = ["namespace", "pod", "container", "time"];
    let mut lf = requests
        .lazy()
        // A pod not yet on a node occupies no node: it costs nothing.
        .filter(col("node").neq(lit("")));
    lf = left(lf, cpu_used, &container_step);
    lf = left(lf, memory_used, &container_step);
    lf = left(lf, owners, &["namespace", "pod"]);
    lf = left(lf, nodes, &["node"]);
    lf = lf.with_columns([
        // A bare pod is its own workload.
        col("kind").fill_null(lit("Pod")),
        col("workload").fill_null(col("pod")),
        col("nodepool").fill_null(lit("")),
        col("instance_type").fill_null(lit("")),
        col("capacity_type").fill_null(lit("on-demand")),
    ]);
    lf = left(lf, prices, &["instance_type", "capacity_type"]);
    lf = left(
        lf,
        recommended,
        &["namespace", "kind", "workload", "container"],
    );
    let hours = lit(input.step as f64 / 3600.0);
    let cpu = col("cpu_request");
    let mem = col("memory_request") / lit(GIB);
    let cpu_used = col("cpu_used");
    let mem_used = col("memory_used") / lit(GIB);
    let rec_cpu = col("recommended_cpu");
    let rec_mem = col("recommended_memory") / lit(GIB);
    let (pc, pg) = (col("per_core_hour"), col("per_gib_hour"));
    let lf = lf
        .with_columns([
            col("cpu_used").fill_null(lit(0.0)),
            col("memory_used").fill_null(lit(0.0)),
            // Without a recommendation the request stands.
            col("recommended_cpu").fill_null(col("cpu_request")),
            col("recommended_memory").fill_null(col("memory_request")),
            col("per_core_hour").fill_null(lit(input.fallback.per_core_hour)),
            col("per_gib_hour").fill_null(lit(input.fallback.per_gib_hour)),
        ])
        .with_columns([
            hours.clone().alias("container_hours"),
            (cpu.clone() * hours.clone()).alias("requested_cpu_core_hours"),
            (cpu_used.clone() * hours.clone()).alias("used_cpu_core_hours"),
            (rec_cpu.clone() * hours.clone()).alias("recommended_cpu_core_hours"),
            (mem.clone() * hours.clone()).alias("requested_memory_gib_hours"),
            (mem_used.clone() * hours.clone()).alias("used_memory_gib_hours"),
            (rec_mem.clone() * hours.clone()).alias("recommended_memory_gib_hours"),
            ((cpu.clone() * pc.clone() + mem.clone() * pg.clone()) * hours.clone())
                .alias("requested_cost"),
            ((cpu_used.clone() * pc.clone() + mem_used.clone() * pg.clone()) * hours.clone())
                .alias("used_cost"),
            ((rec_cpu * pc.clone() + rec_mem * pg.clone()) * hours.clone())
                .alias("recommended_cost"),
            ((positive(cpu - cpu_used) * pc + positive(mem - mem_used) * pg) * hours)
                .alias("wasted_cost"),
        ])
        .with_column((col("requested_cost") - col("recommended_cost")).alias(RECOVERABLE));
    Ok(lf)
}

/// The allocation grouped by `by`: key columns, then [`FIGURES`] and [`RECOVERABLE`]
/// summed over the window, sorted by key.
pub fn allocate(input: &Input<'_>, by: GroupBy) -> PolarsResult<DataFrame> {
    let keys: Vec<Expr> = by.keys().iter().map(|k| col(*k)).collect();
    let sums: Vec<Expr> = FIGURES
        .iter()
        .chain(std::iter::once(&RECOVERABLE))
        .map(|f| col(*f).sum())
        .collect();
    rows(input)?
        .group_by(keys)
        .agg(sums)
        .sort(
            by.keys()
                .iter()
                .map(|k| PlSmallStr::from(*k))
                .collect::<Vec<_>>(),
            SortMultipleOptions::default(),
        )
        .collect()
}

/// A figure column as numbers.
pub fn figures(df: &DataFrame, name: &str) -> PolarsResult<Vec<f64>> {
    let values = df.column(name)?.as_materialized_series().f64()?.clone();
    Ok((0..values.len())
        .map(|i| values.get(i).unwrap_or(0.0))
        .collect())
}

/// A key column as text.
pub fn keys(df: &DataFrame, name: &str) -> PolarsResult<Vec<String>> {
    let values = df.column(name)?.as_materialized_series().str()?.clone();
    Ok((0..values.len())
        .map(|i| values.get(i).unwrap_or("").to_string())
        .collect())
}

/// The frame as CSV (header row, `.` decimals).
pub fn to_csv(df: &mut DataFrame) -> PolarsResult<Vec<u8>> {
    use polars_io::SerWriter as _;
    let mut out = Vec::new();
    polars_io::csv::write::CsvWriter::new(&mut out).finish(df)?;
    Ok(out)
}

/// The frame as a Parquet file's bytes.
pub fn to_parquet(df: &mut DataFrame) -> PolarsResult<Vec<u8>> {
    let mut out = Vec::new();
    polars_io::parquet::write::ParquetWriter::new(&mut out).finish(df)?;
    Ok(out)
}
