//! `tailor recommend`: right-sized requests for every workload container, from its usage
//! history in Prometheus, with the monthly cost effect. Changes nothing.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde::Serialize;

use super::{CatalogSourceArgs, CliError, OutputArgs, Result, SnapshotArgs};
use crate::model::quantity::{self, format_milli, format_value};
use crate::report::Table;
use crate::rightsizing::{ContainerHistory, Context, Policy, Prices, Requests, recommend};
use crate::state::Snapshot;
use crate::usage::prometheus::{PrometheusSettings, PrometheusSource};
use crate::usage::workloads::{Workload, Workloads};
use crate::usage::{UsageQuery, UsageSource};

/// Hours in a month, for monthly figures.
pub const HOURS_PER_MONTH: f64 = 730.0;

/// Arguments of `tailor recommend`.
#[derive(Debug, Clone, Args)]
pub struct RecommendArgs {
    /// Prometheus-compatible API base URL.
    #[arg(long, env = "TAILOR_PROMETHEUS_URL")]
    pub prometheus_url: String,

    /// File holding a bearer token for Prometheus.
    #[arg(long, env = "TAILOR_PROMETHEUS_BEARER_TOKEN_FILE")]
    pub prometheus_bearer_token_file: Option<PathBuf>,

    /// Extra header for Prometheus requests, `Name=value` (repeatable).
    #[arg(
        long = "prometheus-header",
        env = "TAILOR_PROMETHEUS_HEADERS",
        value_delimiter = ';'
    )]
    pub prometheus_headers: Vec<String>,

    /// PEM CA file to trust for Prometheus.
    #[arg(long, env = "TAILOR_PROMETHEUS_CA_FILE")]
    pub prometheus_ca_file: Option<PathBuf>,

    /// Per-request timeout for Prometheus, seconds.
    #[arg(long, env = "TAILOR_PROMETHEUS_TIMEOUT_SECONDS", default_value_t = 30)]
    pub prometheus_timeout_seconds: u64,

    /// The cluster snapshot.
    #[command(flatten)]
    pub snapshot: SnapshotArgs,

    /// Only these namespaces (repeatable); default: every namespace in the snapshot.
    #[arg(
        long = "namespace",
        short = 'n',
        env = "TAILOR_NAMESPACES",
        value_delimiter = ','
    )]
    pub namespaces: Vec<String>,

    /// How much history to read (Go duration, e.g. `14d` is written `336h`).
    #[arg(long, env = "TAILOR_HISTORY", default_value = "336h")]
    pub history: String,

    /// Sample spacing (Go duration).
    #[arg(long, env = "TAILOR_STEP", default_value = "1m")]
    pub step: String,

    /// Evaluation time (RFC 3339); default: now.
    #[arg(long, env = "TAILOR_NOW")]
    pub now: Option<String>,

    /// Where prices and node sizes come from.
    #[command(flatten)]
    pub source: CatalogSourceArgs,

    /// Output format.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// CPU and memory as Kubernetes quantities; absent when not set.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CpuMemory {
    /// CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    /// Memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
}

fn pair(cpu: Option<i64>, memory: Option<i64>) -> CpuMemory {
    CpuMemory {
        cpu: cpu.map(format_milli),
        memory: memory.map(format_value),
    }
}

/// Requests and limits.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RequestsLimits {
    /// Requests.
    pub requests: CpuMemory,
    /// Limits.
    pub limits: CpuMemory,
}

fn requests_limits(r: &Requests) -> RequestsLimits {
    RequestsLimits {
        requests: pair(r.cpu, r.memory),
        limits: pair(r.cpu_limit, r.memory_limit),
    }
}

/// One container's recommendation in the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// Namespace.
    pub namespace: String,
    /// The top owner.
    pub workload: WorkloadRef,
    /// Container name.
    pub container: String,
    /// Current requests and limits.
    pub current: RequestsLimits,
    /// Recommended requests and limits.
    pub recommended: RequestsLimits,
    /// Lower bound.
    pub lower: CpuMemory,
    /// Upper bound.
    pub upper: CpuMemory,
    /// 0..1.
    pub confidence: f64,
    /// Whether the history is long enough for autonomous changes.
    pub actionable: bool,
    /// Why.
    pub reasons: Vec<String>,
    /// USD per month the change saves (negative) or costs.
    pub monthly_cost_delta: f64,
}

/// Kind and name of a workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkloadRef {
    /// Kind.
    pub kind: String,
    /// Name.
    pub name: String,
}

/// Totals.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportSummary {
    /// Workloads with a recommendation.
    pub workloads: usize,
    /// Containers with a recommendation.
    pub containers: usize,
    /// USD per month over all containers (negative saves).
    pub monthly_cost_delta: f64,
    /// Prometheus queries issued.
    pub prometheus_queries: usize,
    /// Containers in the history that matched no workload of the snapshot.
    pub unmatched_containers: usize,
}

/// The whole report.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Report {
    /// Per container, by namespace, workload and container.
    pub recommendations: Vec<Entry>,
    /// Totals.
    pub summary: ReportSummary,
}

fn duration_seconds(flag: &'static str, text: &str) -> Result<i64> {
    // Days are common in this flag; accept `14d` as well as Go durations.
    if let Some(days) = text.strip_suffix('d')
        && let Ok(d) = days.parse::<i64>()
    {
        return Ok(d * 86_400);
    }
    crate::apis::duration::parse_duration(text)
        .map(|d| d.as_secs())
        .map_err(|e| CliError::InvalidFlag {
            flag,
            reason: e.to_string(),
        })
}

fn parse_quantity(
    v: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    cpu: bool,
) -> Option<i64> {
    v.and_then(|q| {
        if cpu {
            quantity::parse_milli(&q.0).ok()
        } else {
            quantity::parse_value(&q.0).ok()
        }
    })
}

/// Reads usage and builds the report.
pub async fn report(args: &RecommendArgs) -> Result<Report> {
    let snapshot =
        Snapshot::load(&args.snapshot.paths).map_err(|e| CliError::Input(e.to_string()))?;
    let workloads = Workloads::from_snapshot(&snapshot);
    let history = duration_seconds("--history", &args.history)?;
    let step = duration_seconds("--step", &args.step)?.max(1);
    let now = match &args.now {
        Some(t) => t
            .parse::<jiff::Timestamp>()
            .map_err(|e| CliError::InvalidFlag {
                flag: "--now",
                reason: format!("{t:?}: {e}"),
            })?
            .as_second(),
        None => jiff::Timestamp::now().as_second(),
    };
    let policy = match snapshot.rightsizing_policies.iter().find(|p| {
        p.metadata.name.as_deref() == Some(crate::apis::rightsizingpolicy::DEFAULT_POLICY_NAME)
    }) {
        Some(p) => Policy::from_spec(&p.spec).map_err(|e| CliError::Input(e.to_string()))?,
        None => Policy::default(),
    };
    let (catalog, options) = args.source.clone().load()?;
    let types = catalog.instance_types(&options)?;
    let prices = Prices::from_instance_types(&types);
    let largest = types
        .iter()
        .map(|t| (t.allocatable.cpu, t.allocatable.memory))
        .fold((0, 0), |a, b| (a.0.max(b.0), a.1.max(b.1)));
    let mut headers = Vec::new();
    for h in &args.prometheus_headers {
        let (k, v) = h.split_once('=').ok_or_else(|| CliError::InvalidFlag {
            flag: "--prometheus-header",
            reason: format!("{h:?} is not Name=value"),
        })?;
        headers.push((k.to_string(), v.to_string()));
    }
    let mut settings = PrometheusSettings::new(&args.prometheus_url);
    settings.bearer_token_file = args.prometheus_bearer_token_file.clone();
    settings.ca_file = args.prometheus_ca_file.clone();
    settings.headers = headers;
    settings.timeout = Duration::from_secs(args.prometheus_timeout_seconds.max(1));
    let source = PrometheusSource::new(settings).map_err(|e| CliError::Input(e.to_string()))?;
    let mut namespaces: Vec<String> = if args.namespaces.is_empty() {
        workloads
            .templates
            .keys()
            .map(|w| w.namespace.clone())
            .collect()
    } else {
        args.namespaces.clone()
    };
    namespaces.sort();
    namespaces.dedup();
    let start = now - history;
    eprintln!(
        "reading {}h of usage for {} namespace(s) from {}",
        history / 3600,
        namespaces.len(),
        args.prometheus_url
    );
    let usage = source
        .usage(&UsageQuery {
            namespaces,
            start,
            end: now,
            step,
        })
        .await
        .map_err(|e| CliError::Input(e.to_string()))?;
    // Pool every pod's samples per workload container, in time order (memory peaks are
    // taken per 24h window across all replicas).
    #[derive(Default)]
    struct Pooled {
        cpu: Vec<(i64, f64)>,
        memory: Vec<(i64, f64)>,
        ooms: Vec<(i64, f64)>,
    }
    let mut pooled: BTreeMap<(Workload, String), Pooled> = BTreeMap::new();
    let mut unmatched = 0;
    for (key, u) in &usage.containers {
        let Some(w) = workloads.of_pod(&key.namespace, &key.pod) else {
            unmatched += 1;
            continue;
        };
        let p = pooled.entry((w, key.container.clone())).or_default();
        p.cpu.extend_from_slice(&u.cpu);
        p.memory.extend_from_slice(&u.memory);
        for t in &u.oom_kills {
            // The memory at the kill is not in this metric: take the pod's highest sample
            // up to that moment.
            let peak = u
                .memory
                .iter()
                .filter(|(s, _)| s <= t)
                .map(|(_, v)| *v)
                .fold(0.0, f64::max);
            p.ooms.push((*t, peak));
        }
    }
    let mut histories: BTreeMap<(Workload, String), ContainerHistory> = BTreeMap::new();
    for (key, mut p) in pooled {
        p.memory.sort_by_key(|s| s.0);
        let h = histories
            .entry(key)
            .or_insert_with(|| ContainerHistory::new(&policy, start));
        for (t, v) in &p.cpu {
            h.add_cpu(*t, *v);
        }
        for (t, v) in &p.memory {
            h.add_memory(*t, *v);
        }
        for (t, v) in &p.ooms {
            h.add_oom(*t, *v);
        }
    }
    let mut report = Report::default();
    let mut seen_workloads = std::collections::BTreeSet::new();
    for ((w, container), h) in &histories {
        let Some(c) = workloads.container(w, container) else {
            unmatched += 1;
            continue;
        };
        let res = c.resources.as_ref();
        let current = Requests {
            cpu: parse_quantity(
                res.and_then(|r| r.requests.as_ref())
                    .and_then(|m| m.get("cpu")),
                true,
            ),
            memory: parse_quantity(
                res.and_then(|r| r.requests.as_ref())
                    .and_then(|m| m.get("memory")),
                false,
            ),
            cpu_limit: parse_quantity(
                res.and_then(|r| r.limits.as_ref())
                    .and_then(|m| m.get("cpu")),
                true,
            ),
            memory_limit: parse_quantity(
                res.and_then(|r| r.limits.as_ref())
                    .and_then(|m| m.get("memory")),
                false,
            ),
        };
        let (hpa_on_cpu, hpa_on_memory) = hpa_resources(&snapshot, w);
        let context = Context {
            hpa_on_cpu,
            hpa_on_memory,
            largest_node: Some(largest),
            prices,
        };
        let r = recommend(h, current, &policy, &context, now);
        seen_workloads.insert(w.clone());
        report.summary.monthly_cost_delta += r.hourly_cost_delta * HOURS_PER_MONTH;
        report.recommendations.push(Entry {
            namespace: w.namespace.clone(),
            workload: WorkloadRef {
                kind: w.kind.clone(),
                name: w.name.clone(),
            },
            container: container.clone(),
            current: requests_limits(&r.current),
            recommended: requests_limits(&r.recommended),
            lower: pair(r.lower.0, r.lower.1),
            upper: pair(r.upper.0, r.upper.1),
            confidence: (r.confidence * 100.0).round() / 100.0,
            actionable: r.actionable,
            reasons: r.reasons,
            monthly_cost_delta: (r.hourly_cost_delta * HOURS_PER_MONTH * 100.0).round() / 100.0,
        });
    }
    report.summary.workloads = seen_workloads.len();
    report.summary.containers = report.recommendations.len();
    report.summary.monthly_cost_delta = (report.summary.monthly_cost_delta * 100.0).round() / 100.0;
    report.summary.prometheus_queries = usage.queries;
    report.summary.unmatched_containers = unmatched;
    Ok(report)
}

/// Which resources an HPA targeting the workload scales on.
fn hpa_resources(snapshot: &Snapshot, w: &Workload) -> (bool, bool) {
    let mut cpu = false;
    let mut memory = false;
    for hpa in &snapshot.horizontal_pod_autoscalers {
        let ns = hpa.metadata.namespace.as_deref().unwrap_or("default");
        let Some(spec) = &hpa.spec else { continue };
        if ns != w.namespace
            || spec.scale_target_ref.kind != w.kind
            || spec.scale_target_ref.name != w.name
        {
            continue;
        }
        for m in spec.metrics.iter().flatten() {
            let name = m
                .resource
                .as_ref()
                .map(|r| r.name.as_str())
                .or_else(|| m.container_resource.as_ref().map(|r| r.name.as_str()));
            match name {
                Some("cpu") => cpu = true,
                Some("memory") => memory = true,
                _ => {}
            }
        }
        // An HPA without metrics scales on CPU (the API default).
        if spec.metrics.as_ref().is_none_or(|m| m.is_empty()) {
            cpu = true;
        }
    }
    (cpu, memory)
}

fn show(q: &Option<String>, cpu: bool) -> String {
    match q {
        None => "-".to_string(),
        Some(q) if cpu => {
            quantity::parse_milli(q).map_or_else(|_| q.clone(), quantity::display_cores)
        }
        Some(q) => quantity::parse_value(q).map_or_else(|_| q.clone(), quantity::display_bytes),
    }
}

/// Renders the report for a terminal.
pub fn table(report: &Report) -> String {
    let mut t = Table::new([
        "NAMESPACE",
        "WORKLOAD",
        "CONTAINER",
        "CPU",
        "MEMORY",
        "CONFIDENCE",
        "$/MONTH",
    ])
    .align_right(&[5, 6]);
    for e in &report.recommendations {
        t.row([
            e.namespace.clone(),
            format!("{}/{}", e.workload.kind, e.workload.name),
            e.container.clone(),
            format!(
                "{} -> {}",
                show(&e.current.requests.cpu, true),
                show(&e.recommended.requests.cpu, true)
            ),
            format!(
                "{} -> {}",
                show(&e.current.requests.memory, false),
                show(&e.recommended.requests.memory, false)
            ),
            format!("{:.0}%", e.confidence * 100.0),
            format!("{:+.2}", e.monthly_cost_delta),
        ]);
    }
    let s = &report.summary;
    format!(
        "{}\n{} containers in {} workloads; {:+.2} $/month if applied ({} Prometheus queries).\n",
        t.render(),
        s.containers,
        s.workloads,
        s.monthly_cost_delta,
        s.prometheus_queries
    )
}

/// Runs `tailor recommend`.
pub fn run(args: RecommendArgs, out: &mut dyn Write) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let report = runtime.block_on(report(&args))?;
    let text =
        crate::report::render(args.output.output, &report, table).map_err(CliError::Encode)?;
    out.write_all(text.as_bytes())?;
    Ok(())
}
