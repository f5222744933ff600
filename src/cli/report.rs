//! `tailor report`: what the cluster's requests cost over a window, what was used of them,
//! and what the right-sizing recommendations would have saved: per namespace, workload or
//! NodePool, from Prometheus history alone (kube-state-metrics and cadvisor) and the
//! catalog's node prices. Changes nothing.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use polars::prelude::DataFrame;

use super::recommend::{PrometheusArgs, duration_seconds};
use super::{CatalogSourceArgs, CliError, Result};
use crate::apis::Mode;
use crate::model::quantity::{format_milli, format_value};
use crate::report::Table;
use crate::report::cost::{self, FIGURES, GroupBy, Input, PriceTable, RECOVERABLE, Recommended};
use crate::report::svg::escape;
use crate::rightsizing::Prices;
use crate::rightsizing::service::{
    DEFAULT_STEP_SECONDS, Policies, Request, Resume, recommend_workloads,
};
use crate::state::Snapshot;
use crate::usage::inventory::{self, Inventory, InventoryQuery, Resources};
use crate::usage::prometheus::PrometheusSource;
use crate::usage::workloads::Workloads;

/// Output formats of `tailor report`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportFormat {
    /// Aligned columns for a terminal.
    Table,
    /// One row per group, for spreadsheets.
    Csv,
    /// The same rows as a Parquet file (needs `--output-file`).
    Parquet,
    /// A self-contained HTML page with the allocation by namespace, workload and NodePool.
    Html,
}

/// Arguments of `tailor report`.
#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// Prometheus-compatible API base URL.
    #[arg(long, env = "TAILOR_PROMETHEUS_URL")]
    pub prometheus_url: String,

    /// How to reach and read Prometheus.
    #[command(flatten)]
    pub prometheus: PrometheusArgs,

    /// The window reported (`30d`, or a Go duration such as `720h`; 1h to 366d).
    #[arg(long, env = "TAILOR_REPORT_WINDOW", default_value = "30d")]
    pub window: String,

    /// Spacing of the samples costed (Go duration, 1m to 1h): each request and usage
    /// sample stands for the step before it.
    #[arg(long, env = "TAILOR_REPORT_STEP", default_value = "1h")]
    pub step: String,

    /// Only these namespaces (repeatable); default: every namespace.
    #[arg(
        long = "namespace",
        short = 'n',
        env = "TAILOR_NAMESPACES",
        value_delimiter = ','
    )]
    pub namespaces: Vec<String>,

    /// End of the window (RFC 3339); default: now.
    #[arg(long, env = "TAILOR_NOW")]
    pub now: Option<String>,

    /// Rows per namespace, workload or NodePool (table, CSV and Parquet; the HTML page
    /// shows all three).
    #[arg(long, env = "TAILOR_REPORT_BY", value_enum, default_value = "workload")]
    pub by: GroupBy,

    /// Where prices and node sizes come from.
    #[command(flatten)]
    pub source: CatalogSourceArgs,

    /// Output format.
    #[arg(
        long,
        short = 'o',
        env = "TAILOR_OUTPUT",
        value_enum,
        default_value = "table"
    )]
    pub output: ReportFormat,

    /// Write the report to this file (written whole or not at all) instead of standard
    /// output; required for Parquet.
    #[arg(long, short = 'f', env = "TAILOR_OUTPUT_FILE")]
    pub output_file: Option<PathBuf>,
}

/// Everything the report shows.
#[derive(Debug, Clone)]
pub struct CostReport {
    /// Rows grouped by namespace.
    pub by_namespace: DataFrame,
    /// Rows grouped by workload.
    pub by_workload: DataFrame,
    /// Rows grouped by NodePool.
    pub by_nodepool: DataFrame,
    /// Window start and end, unix seconds.
    pub window: (i64, i64),
    /// Nodes whose size or price is unknown, priced at the catalog's median prices.
    pub estimated_nodes: Vec<String>,
    /// Workload containers with a recommendation.
    pub recommendations: usize,
    /// Prometheus queries issued.
    pub queries: usize,
}

impl CostReport {
    /// The rows of a grouping.
    pub fn frame(&self, by: GroupBy) -> &DataFrame {
        match by {
            GroupBy::Namespace => &self.by_namespace,
            GroupBy::Workload => &self.by_workload,
            GroupBy::Nodepool => &self.by_nodepool,
        }
    }
}

fn polars_error(e: polars::prelude::PolarsError) -> CliError {
    CliError::Encode(format!("cost frames: {e}"))
}

/// Catalog prices per size and capacity type: the on-demand list price, and for spot the
/// catalog's estimate (list price less `--spot-discount`).
fn price_table(catalog: &crate::catalog::Catalog, region: &str, spot_discount: f64) -> PriceTable {
    let mut table = PriceTable::default();
    for s in catalog.skus() {
        let Some(price) = catalog.price(region, &s.sku.name) else {
            continue;
        };
        let cores = f64::from(s.sku.vcpus);
        table.add(&s.sku.name, "on-demand", price, cores, s.sku.memory_gib);
        table.add(
            &s.sku.name,
            "spot",
            price * (1.0 - spot_discount),
            cores,
            s.sku.memory_gib,
        );
    }
    table
}

fn quantities(cpu: Option<f64>, memory: Option<f64>) -> Option<BTreeMap<String, Quantity>> {
    let mut m = BTreeMap::new();
    if let Some(c) = cpu {
        m.insert(
            "cpu".to_string(),
            Quantity(format_milli((c * 1000.0).round() as i64)),
        );
    }
    if let Some(b) = memory {
        m.insert(
            "memory".to_string(),
            Quantity(format_value(b.round() as i64)),
        );
    }
    (!m.is_empty()).then_some(m)
}

/// The cluster as Prometheus remembers it, in the form the right-sizing service reads:
/// every pod of the window with its top owner, and each workload's containers with the
/// newest requests and limits seen on any of its pods.
fn snapshot_of(inv: &Inventory) -> Snapshot {
    let mut pods: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for key in inv.latest.keys() {
        pods.entry((key.namespace.clone(), key.pod.clone()))
            .or_default()
            .push(key.container.clone());
    }
    let owner_of = |ns: &str, pod: &str| inv.owners.get(&(ns.to_string(), pod.to_string()));
    // The newest resources per workload container.
    let mut newest: BTreeMap<(String, String, String, String), Resources> = BTreeMap::new();
    for (key, r) in &inv.latest {
        let (kind, name) = owner_of(&key.namespace, &key.pod)
            .cloned()
            .unwrap_or_else(|| ("Pod".to_string(), key.pod.clone()));
        let slot = newest
            .entry((key.namespace.clone(), kind, name, key.container.clone()))
            .or_default();
        if r.at >= slot.at {
            *slot = *r;
        }
    }
    let mut snapshot = Snapshot::default();
    let mut replica_sets = std::collections::BTreeSet::new();
    let mut jobs = std::collections::BTreeSet::new();
    for ((ns, pod), containers) in pods {
        let owner = owner_of(&ns, &pod).cloned();
        let (kind, name) = owner
            .clone()
            .unwrap_or_else(|| ("Pod".to_string(), pod.clone()));
        let spec = PodSpec {
            containers: containers
                .iter()
                .map(|c| {
                    let r = newest
                        .get(&(ns.clone(), kind.clone(), name.clone(), c.clone()))
                        .copied()
                        .unwrap_or_default();
                    Container {
                        name: c.clone(),
                        resources: Some(ResourceRequirements {
                            requests: quantities(r.cpu_request, r.memory_request),
                            limits: quantities(r.cpu_limit, r.memory_limit),
                            ..ResourceRequirements::default()
                        }),
                        ..Container::default()
                    }
                })
                .collect(),
            ..PodSpec::default()
        };
        let meta = |name: &str| ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(ns.clone()),
            ..ObjectMeta::default()
        };
        // Bare ReplicaSets and Jobs are workloads only when the snapshot lists them.
        match kind.as_str() {
            "ReplicaSet" if replica_sets.insert((ns.clone(), name.clone())) => {
                snapshot.replica_sets.push(ReplicaSet {
                    metadata: meta(&name),
                    ..ReplicaSet::default()
                });
            }
            "Job" if jobs.insert((ns.clone(), name.clone())) => {
                snapshot.jobs.push(Job {
                    metadata: meta(&name),
                    ..Job::default()
                });
            }
            _ => {}
        }
        let mut pod_meta = meta(&pod);
        pod_meta.owner_references = owner.map(|(kind, name)| {
            vec![OwnerReference {
                api_version: "apps/v1".to_string(),
                kind,
                name,
                uid: String::new(),
                controller: Some(true),
                ..OwnerReference::default()
            }]
        });
        snapshot.pods.push(Arc::new(Pod {
            metadata: pod_meta,
            spec: Some(spec),
            ..Pod::default()
        }));
    }
    snapshot
}

/// Reads the window and builds the report.
pub async fn report(args: &ReportArgs) -> Result<CostReport> {
    // Flags first: a bad value is reported before anything is read.
    let window = duration_seconds(
        "--window",
        &args.window,
        crate::usage::MAX_WINDOW_SECONDS,
        "366d",
    )?;
    if window < 3600 {
        return Err(CliError::InvalidFlag {
            flag: "--window",
            reason: format!("{:?}: must be at least 1h", args.window),
        });
    }
    let step = duration_seconds("--step", &args.step, crate::usage::MAX_STEP_SECONDS, "1h")?;
    if step < 60 {
        return Err(CliError::InvalidFlag {
            flag: "--step",
            reason: format!("{:?}: must be at least 1m", args.step),
        });
    }
    let points = window / step;
    if points > crate::usage::prometheus::MAX_POINTS_PER_SERIES {
        return Err(CliError::InvalidFlag {
            flag: "--step",
            reason: format!(
                "{:?} over --window {:?} is {points} samples per series, more than Prometheus \
                 answers ({}): lengthen the step",
                args.step,
                args.window,
                crate::usage::prometheus::MAX_POINTS_PER_SERIES
            ),
        });
    }
    let now = super::now_flag(args.now.as_deref())?;
    if args.output == ReportFormat::Parquet && args.output_file.is_none() {
        return Err(CliError::InvalidFlag {
            flag: "--output-file",
            reason: "-o parquet writes a file: name it with --output-file".to_string(),
        });
    }
    let spot_discount = args.source.spot_discount;
    let (catalog, options) = args.source.clone().load()?;
    let types = catalog.instance_types(&options)?;
    let fallback = Prices::from_instance_types(&types);
    let prices = price_table(&catalog, &options.region, spot_discount);
    let largest = types
        .iter()
        .map(|t| (t.allocatable.cpu, t.allocatable.memory))
        .fold((0, 0), |a, b| (a.0.max(b.0), a.1.max(b.1)));
    let settings = args
        .prometheus
        .settings(&args.prometheus_url, &args.source.azure)?;
    let source = PrometheusSource::new(settings).map_err(|e| CliError::Input(e.to_string()))?;
    let start = now - points * step;
    eprintln!(
        "reading {}h of requests and usage from {}",
        (now - start) / 3600,
        crate::usage::prometheus::redact_url(&args.prometheus_url)
    );
    let inv = inventory::read(
        &source,
        &InventoryQuery {
            namespaces: args.namespaces.clone(),
            start: start + step,
            end: now,
            step,
        },
    )
    .await
    .map_err(|e| {
        CliError::Input(format!(
            "--prometheus-url {}: {e}",
            crate::usage::prometheus::redact_url(&args.prometheus_url)
        ))
    })?;
    if inv.requests.is_empty() {
        return Err(CliError::NothingToReport(format!(
            "Prometheus at --prometheus-url {} has no kube_pod_container_resource_requests \
             series{} in --window {} ending {}: check that it scrapes kube-state-metrics, the \
             window and --namespace",
            crate::usage::prometheus::redact_url(&args.prometheus_url),
            if args.namespaces.is_empty() {
                String::new()
            } else {
                format!(" in namespace(s) {}", args.namespaces.join(", "))
            },
            args.window,
            jiff::Timestamp::from_second(now).map_or_else(|_| now.to_string(), |t| t.to_string()),
        )));
    }
    // Recommendations from the right-sizing service over the same window.
    let snapshot = snapshot_of(&inv);
    let workloads = Workloads::from_snapshot(&snapshot);
    let policies = Policies::new(&[], None, Mode::Recommend);
    let outcome = recommend_workloads(
        &source,
        Request {
            snapshot: &snapshot,
            workloads: &workloads,
            policies: &policies,
            namespaces: &args.namespaces,
            history: Some(now - start),
            step: DEFAULT_STEP_SECONDS,
            now,
            largest_node: Some(largest),
            prices: fallback,
            resume: Resume::Nothing,
            keep_hours: false,
            ooms: &[],
        },
    )
    .await
    .map_err(|e| {
        CliError::Input(format!(
            "--prometheus-url {}: {e}",
            crate::usage::prometheus::redact_url(&args.prometheus_url)
        ))
    })?;
    let mut recommended = Recommended::default();
    for c in &outcome.containers {
        let r = &c.recommendation.recommended;
        recommended.namespace.push(c.workload.namespace.clone());
        recommended.kind.push(c.workload.kind.clone());
        recommended.workload.push(c.workload.name.clone());
        recommended.container.push(c.container.clone());
        recommended.cpu_cores.push(r.cpu.map(|m| m as f64 / 1000.0));
        recommended.memory_bytes.push(r.memory.map(|b| b as f64));
    }
    let mut estimated_nodes: Vec<String> = inv
        .nodes
        .iter()
        .filter(|(_, f)| !prices.has(&f.instance_type, &f.capacity_type))
        .map(|(n, _)| n.clone())
        .collect();
    // Nodes seen in requests but never in kube_node_labels are priced at the median too.
    let known: std::collections::BTreeSet<&String> = inv.nodes.keys().collect();
    let mut unlabelled: Vec<String> = inv
        .requests
        .node
        .iter()
        .filter(|n| !n.is_empty() && !known.contains(n))
        .cloned()
        .collect();
    unlabelled.sort();
    unlabelled.dedup();
    estimated_nodes.extend(unlabelled);
    if !estimated_nodes.is_empty() {
        tracing::warn!(
            "{} node(s) of unknown size or price are costed at the catalog's median prices: {}",
            estimated_nodes.len(),
            estimated_nodes.join(", ")
        );
    }
    let input = Input {
        inventory: &inv,
        step,
        prices: &prices,
        fallback,
        recommended: &recommended,
    };
    let by_workload = cost::allocate(&input, GroupBy::Workload).map_err(polars_error)?;
    if by_workload.height() == 0 {
        return Err(CliError::NothingToReport(format!(
            "the {} container(s) with requests in --window {} never ran on a node",
            inv.latest.len(),
            args.window
        )));
    }
    Ok(CostReport {
        by_namespace: cost::allocate(&input, GroupBy::Namespace).map_err(polars_error)?,
        by_nodepool: cost::allocate(&input, GroupBy::Nodepool).map_err(polars_error)?,
        by_workload,
        window: (start, now),
        estimated_nodes,
        recommendations: outcome.containers.len(),
        queries: inv.queries + outcome.stats.queries,
    })
}

fn total(df: &DataFrame, name: &str) -> f64 {
    cost::figures(df, name).map_or(0.0, |v| v.iter().sum())
}

fn key_cells(df: &DataFrame, by: GroupBy) -> Result<Vec<Vec<String>>> {
    let columns: Vec<Vec<String>> = by
        .keys()
        .iter()
        .map(|k| cost::keys(df, k))
        .collect::<std::result::Result<_, _>>()
        .map_err(polars_error)?;
    Ok((0..df.height())
        .map(|i| columns.iter().map(|c| display_key(&c[i])).collect())
        .collect())
}

fn display_key(k: &str) -> String {
    if k.is_empty() {
        "(none)".to_string()
    } else {
        k.to_string()
    }
}

fn figure_columns(df: &DataFrame) -> Result<BTreeMap<&'static str, Vec<f64>>> {
    let mut out = BTreeMap::new();
    for f in FIGURES.iter().chain(std::iter::once(&RECOVERABLE)) {
        out.insert(*f, cost::figures(df, f).map_err(polars_error)?);
    }
    Ok(out)
}

fn window_text(r: &CostReport) -> String {
    let t =
        |s: i64| jiff::Timestamp::from_second(s).map_or_else(|_| s.to_string(), |t| t.to_string());
    format!("{} to {}", t(r.window.0), t(r.window.1))
}

/// Renders one grouping for a terminal, with totals.
pub fn table(r: &CostReport, by: GroupBy) -> Result<String> {
    let df = r.frame(by);
    let mut header: Vec<String> = by.keys().iter().map(|k| k.to_ascii_uppercase()).collect();
    let first = header.len();
    header.extend(
        [
            "CPU CORE-H REQ/USED/REC",
            "MEM GIB-H REQ/USED/REC",
            "$ REQUESTED",
            "$ USED",
            "$ WASTED",
            "$ RECOVERABLE",
        ]
        .map(String::from),
    );
    let mut t = Table::new(header).align_right(&(first..first + 6).collect::<Vec<_>>());
    let f = figure_columns(df)?;
    for (i, keys) in key_cells(df, by)?.into_iter().enumerate() {
        let mut row = keys;
        row.push(format!(
            "{:.1} / {:.1} / {:.1}",
            f["requested_cpu_core_hours"][i],
            f["used_cpu_core_hours"][i],
            f["recommended_cpu_core_hours"][i]
        ));
        row.push(format!(
            "{:.1} / {:.1} / {:.1}",
            f["requested_memory_gib_hours"][i],
            f["used_memory_gib_hours"][i],
            f["recommended_memory_gib_hours"][i]
        ));
        for name in ["requested_cost", "used_cost", "wasted_cost", RECOVERABLE] {
            row.push(format!("{:.2}", f[name][i]));
        }
        t.row(row);
    }
    let mut text = t.render();
    text.push_str(&format!(
        "{}: ${:.2} requested, ${:.2} used, ${:.2} wasted, ${:.2} recoverable by the {} \
         recommendation(s) ({} Prometheus queries).\n",
        window_text(r),
        total(df, "requested_cost"),
        total(df, "used_cost"),
        total(df, "wasted_cost"),
        total(df, RECOVERABLE),
        r.recommendations,
        r.queries
    ));
    if !r.estimated_nodes.is_empty() {
        text.push_str(&format!(
            "{} node(s) of unknown size or price costed at the catalog's median prices: {}.\n",
            r.estimated_nodes.len(),
            r.estimated_nodes.join(", ")
        ));
    }
    Ok(text)
}

fn html_table(r: &CostReport, by: GroupBy) -> Result<String> {
    let df = r.frame(by);
    let f = figure_columns(df)?;
    let mut s = String::from("<table>\n<tr>");
    for k in by.keys() {
        s.push_str(&format!("<th>{}</th>", escape(k)));
    }
    for h in [
        "CPU core-h requested",
        "used",
        "recommended",
        "Memory GiB-h requested",
        "used",
        "recommended",
        "$ requested",
        "$ used",
        "$ recommended",
        "$ wasted",
        "$ recoverable",
    ] {
        s.push_str(&format!("<th>{h}</th>"));
    }
    s.push_str("</tr>\n");
    for (i, keys) in key_cells(df, by)?.into_iter().enumerate() {
        s.push_str("<tr>");
        for k in keys {
            s.push_str(&format!("<td>{}</td>", escape(&k)));
        }
        for name in FIGURES.iter().skip(1).chain(std::iter::once(&RECOVERABLE)) {
            s.push_str(&format!("<td class=\"n\">{:.2}</td>", f[name][i]));
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</table>\n");
    Ok(s)
}

/// Renders all three groupings as one self-contained HTML page.
pub fn html(r: &CostReport) -> Result<String> {
    let df = &r.by_workload;
    let mut page = String::from(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>Tailor cost report</title><style>\
         body{font-family:system-ui,sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:2em}\
         td,th{border:1px solid #ccc;padding:4px 8px}td.n{text-align:right}</style></head><body>\n",
    );
    page.push_str(&format!(
        "<h1>Cost report</h1>\n<p>{}: <b>${:.2}</b> requested, ${:.2} used, <b>${:.2}</b> wasted, \
         <b>${:.2}</b> recoverable by {} recommendation(s).</p>\n",
        escape(&window_text(r)),
        total(df, "requested_cost"),
        total(df, "used_cost"),
        total(df, "wasted_cost"),
        total(df, RECOVERABLE),
        r.recommendations
    ));
    if !r.estimated_nodes.is_empty() {
        page.push_str(&format!(
            "<p>Nodes of unknown size or price, costed at the catalog's median prices: {}</p>\n",
            escape(&r.estimated_nodes.join(", "))
        ));
    }
    for (title, by) in [
        ("By namespace", GroupBy::Namespace),
        ("By workload", GroupBy::Workload),
        ("By NodePool", GroupBy::Nodepool),
    ] {
        page.push_str(&format!("<h2>{title}</h2>\n"));
        page.push_str(&html_table(r, by)?);
    }
    page.push_str("</body></html>\n");
    Ok(page)
}

/// Writes `bytes` to `path` whole: into a temporary file beside it, renamed over it.
fn write_whole(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("partial");
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|source| {
            let _ = std::fs::remove_file(&tmp);
            CliError::WriteFile {
                path: path.to_path_buf(),
                source,
            }
        })
}

/// Runs `tailor report`.
pub fn run(args: ReportArgs, out: &mut dyn Write) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let report = runtime.block_on(report(&args))?;
    let bytes = match args.output {
        ReportFormat::Table => table(&report, args.by)?.into_bytes(),
        ReportFormat::Html => html(&report)?.into_bytes(),
        ReportFormat::Csv => {
            cost::to_csv(&mut report.frame(args.by).clone()).map_err(polars_error)?
        }
        ReportFormat::Parquet => {
            cost::to_parquet(&mut report.frame(args.by).clone()).map_err(polars_error)?
        }
    };
    match &args.output_file {
        Some(path) => write_whole(path, &bytes),
        None => Ok(out.write_all(&bytes)?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::ContainerKey;

    #[test]
    fn a_pod_gets_its_workloads_newest_requests() {
        let mut inv = Inventory::default();
        let key = |pod: &str| ContainerKey {
            namespace: "shop".into(),
            pod: pod.into(),
            container: "app".into(),
        };
        inv.latest.insert(
            key("web-a"),
            Resources {
                cpu_request: Some(0.5),
                at: 10,
                ..Resources::default()
            },
        );
        inv.latest.insert(
            key("web-b"),
            Resources {
                cpu_request: Some(0.25),
                memory_request: Some(1_073_741_824.0),
                at: 20,
                ..Resources::default()
            },
        );
        for pod in ["web-a", "web-b"] {
            inv.owners.insert(
                ("shop".into(), pod.into()),
                ("Deployment".into(), "web".into()),
            );
        }
        let snapshot = snapshot_of(&inv);
        let workloads = Workloads::from_snapshot(&snapshot);
        let w = workloads.of_pod("shop", "web-a").expect("a workload");
        assert_eq!((w.kind.as_str(), w.name.as_str()), ("Deployment", "web"));
        let c = workloads.container(&w, "app").expect("its container");
        let requests = c
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .expect("requests");
        assert_eq!(requests["cpu"].0, "250m");
        assert_eq!(requests["memory"].0, "1Gi");
    }
}
