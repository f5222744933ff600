//! `tailor recommend`: right-sized requests for every workload container, from its usage
//! history in Prometheus, with the monthly cost effect. Changes nothing.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde::Serialize;

use super::{CatalogSourceArgs, CliError, ClusterSourceArgs, Result};
use crate::apis::Mode;
use crate::model::quantity::{self, format_milli, format_value};
use crate::report::Table;
use crate::rightsizing::service::{Policies, Request, Resume, oom_kills, recommend_workloads};
use crate::rightsizing::{Prices, Requests};
use crate::state::{PendingPods, cluster};
use crate::usage::pool::{Checkpoint, HourUsage};
use crate::usage::prometheus::{LabelNames, PrometheusSettings, PrometheusSource};
use crate::usage::workloads::Workloads;

/// Output formats of `tailor recommend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RecommendFormat {
    /// Aligned columns for a terminal.
    Table,
    /// JSON (camelCase fields).
    Json,
    /// YAML (same fields as JSON).
    Yaml,
    /// One row per container, for spreadsheets.
    Csv,
    /// A self-contained HTML page with a usage chart per workload container.
    Html,
}

/// Hours in a month, for monthly figures.
pub const HOURS_PER_MONTH: f64 = 730.0;

/// Arguments of `tailor recommend`.
#[derive(Debug, Clone, Args)]
pub struct RecommendArgs {
    /// Prometheus-compatible API base URL.
    #[arg(long, env = "TAILOR_PROMETHEUS_URL")]
    pub prometheus_url: String,

    /// How to reach and read Prometheus.
    #[command(flatten)]
    pub prometheus: PrometheusArgs,

    /// The cluster: snapshot files or a live cluster.
    #[command(flatten)]
    pub cluster: ClusterSourceArgs,

    /// Only these namespaces (repeatable); default: every namespace in the snapshot or
    /// cluster.
    #[arg(
        long = "namespace",
        short = 'n',
        env = "TAILOR_NAMESPACES",
        value_delimiter = ','
    )]
    pub namespaces: Vec<String>,

    /// How much history to read (`14d`, or a Go duration such as `336h`; 1s to 366d).
    #[arg(long, env = "TAILOR_HISTORY", default_value = "14d")]
    pub history: String,

    /// CPU sample spacing (Go duration, 1s to 1h and at most the history); CPU is the rate
    /// over this step (at least 2m). A coarser step costs fewer queries but hides the
    /// minutes above each step's mean, which the request is sized to keep short.
    #[arg(long, env = "TAILOR_STEP", default_value = "1m")]
    pub step: String,

    /// Checkpoint file: resumed from when present (only newer usage is read) and
    /// rewritten after a successful read.
    #[arg(long, env = "TAILOR_STATE")]
    pub state: Option<PathBuf>,

    /// Evaluation time (RFC 3339); default: now.
    #[arg(long, env = "TAILOR_NOW")]
    pub now: Option<String>,

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
    pub output: RecommendFormat,
}

/// How to reach and read Prometheus: authentication, TLS, label names and limits. Shared by
/// `tailor recommend` and `tailor run` (the URL is each command's own flag).
#[derive(Debug, Clone, Args)]
pub struct PrometheusArgs {
    /// File holding a bearer token for Prometheus.
    #[arg(long, env = "TAILOR_PROMETHEUS_BEARER_TOKEN_FILE")]
    pub prometheus_bearer_token_file: Option<PathBuf>,

    /// User name for Prometheus basic auth (with `--prometheus-basic-auth-password-file`).
    #[arg(
        long,
        env = "TAILOR_PROMETHEUS_BASIC_AUTH_USER",
        requires = "prometheus_basic_auth_password_file"
    )]
    pub prometheus_basic_auth_user: Option<String>,

    /// File holding the password for Prometheus basic auth (a trailing newline is
    /// ignored).
    #[arg(
        long,
        env = "TAILOR_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE",
        requires = "prometheus_basic_auth_user"
    )]
    pub prometheus_basic_auth_password_file: Option<PathBuf>,

    /// Azure Managed Prometheus: send an Entra ID token from the Azure credential
    /// (workload identity, else the managed identity: see --azure-client-id) as the
    /// bearer token, exchanged again before it expires. The identity needs the
    /// Monitoring Data Reader role on the Azure Monitor workspace.
    #[arg(
        long,
        env = "TAILOR_PROMETHEUS_AZURE_AUTH",
        conflicts_with_all = [
            "prometheus_bearer_token_file",
            "prometheus_basic_auth_user",
            "prometheus_basic_auth_password_file",
        ]
    )]
    pub prometheus_azure_auth: bool,

    /// Token scope of `--prometheus-azure-auth` (another cloud's, e.g.
    /// `https://prometheus.monitor.azure.us/.default`).
    #[arg(
        long,
        env = "TAILOR_PROMETHEUS_AZURE_SCOPE",
        default_value = crate::cloud::azure::auth::PROMETHEUS_SCOPE
    )]
    pub prometheus_azure_scope: String,

    /// Label naming the namespace on the container series (`kubernetes_namespace` where
    /// cadvisor is scraped with the older relabelling).
    #[arg(
        long,
        env = "TAILOR_PROMETHEUS_NAMESPACE_LABEL",
        default_value = "namespace"
    )]
    pub prometheus_namespace_label: String,

    /// Label naming the pod on the container series (`pod_name` on older cadvisor).
    #[arg(long, env = "TAILOR_PROMETHEUS_POD_LABEL", default_value = "pod")]
    pub prometheus_pod_label: String,

    /// Label naming the container on the container series (`container_name` on older
    /// cadvisor).
    #[arg(
        long,
        env = "TAILOR_PROMETHEUS_CONTAINER_LABEL",
        default_value = "container"
    )]
    pub prometheus_container_label: String,

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

    /// How long Prometheus may take to start an answer, and then to send each part of it,
    /// seconds.
    #[arg(long, env = "TAILOR_PROMETHEUS_TIMEOUT_SECONDS", default_value_t = 30)]
    pub prometheus_timeout_seconds: u64,

    /// Largest Prometheus answer read, bytes (default 256 MiB); a larger one fails the
    /// read instead of filling memory.
    #[arg(
        long,
        env = "TAILOR_PROMETHEUS_MAX_RESPONSE_BYTES",
        default_value_t = crate::usage::prometheus::DEFAULT_MAX_RESPONSE_BYTES
    )]
    pub prometheus_max_response_bytes: u64,

    /// Most points (containers x steps) one Prometheus query may return.
    #[arg(
        long,
        env = "TAILOR_PROMETHEUS_MAX_POINTS_PER_QUERY",
        default_value_t = 2_000_000
    )]
    pub prometheus_max_points_per_query: i64,

    /// Queries in flight at once.
    #[arg(long, env = "TAILOR_PROMETHEUS_CONCURRENCY", default_value_t = 4)]
    pub prometheus_concurrency: usize,
}

impl PrometheusArgs {
    /// The usage source's settings for Prometheus at `url`, each flag checked and a bad one
    /// named; `azure` is how to reach Azure for `--prometheus-azure-auth`.
    pub fn settings(&self, url: &str, azure: &super::AzureArgs) -> Result<PrometheusSettings> {
        let mut headers = Vec::new();
        for h in &self.prometheus_headers {
            let (k, v) = h.split_once('=').ok_or_else(|| CliError::InvalidFlag {
                flag: "--prometheus-header",
                reason: format!("{h:?} is not Name=value"),
            })?;
            headers.push((k.to_string(), v.to_string()));
        }
        let mut settings = PrometheusSettings::new(url);
        settings.bearer_token_file = self.prometheus_bearer_token_file.clone();
        settings.ca_file = self.prometheus_ca_file.clone();
        settings.headers = headers;
        if self.prometheus_azure_auth {
            let scope = &self.prometheus_azure_scope;
            let valid = reqwest::Url::parse(scope).is_ok_and(|u| u.scheme() == "https")
                && scope.ends_with("/.default");
            if !valid {
                return Err(CliError::InvalidFlag {
                    flag: "--prometheus-azure-scope",
                    reason: format!("{scope:?} is not an https://HOST/.default scope"),
                });
            }
            settings.azure_auth = Some(crate::usage::prometheus::AzureAuth {
                credential: azure.credential()?,
                scope: scope.clone(),
            });
        }
        if let (Some(user), Some(file)) = (
            &self.prometheus_basic_auth_user,
            &self.prometheus_basic_auth_password_file,
        ) {
            let password = std::fs::read_to_string(file).map_err(|e| CliError::InvalidFlag {
                flag: "--prometheus-basic-auth-password-file",
                reason: format!("{}: {e}", file.display()),
            })?;
            settings.basic_auth = Some((
                user.clone(),
                password.trim_end_matches(['\r', '\n']).to_string(),
            ));
        }
        for (flag, value) in [
            (
                "--prometheus-namespace-label",
                &self.prometheus_namespace_label,
            ),
            ("--prometheus-pod-label", &self.prometheus_pod_label),
            (
                "--prometheus-container-label",
                &self.prometheus_container_label,
            ),
        ] {
            if !is_label_name(value) {
                return Err(CliError::InvalidFlag {
                    flag,
                    reason: format!(
                        "{value:?} is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)"
                    ),
                });
            }
        }
        settings.labels = LabelNames {
            namespace: self.prometheus_namespace_label.clone(),
            pod: self.prometheus_pod_label.clone(),
            container: self.prometheus_container_label.clone(),
        };
        settings.timeout = Duration::from_secs(self.prometheus_timeout_seconds.max(1));
        settings.max_response_bytes = self.prometheus_max_response_bytes;
        settings.max_points_per_query = self.prometheus_max_points_per_query.max(1);
        settings.concurrency = self.prometheus_concurrency.max(1);
        Ok(settings)
    }
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
    /// Hourly usage read in this run, for charts.
    #[serde(skip)]
    pub hours: Vec<HourUsage>,
}

/// Kind and name of a workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkloadRef {
    /// Kind.
    pub kind: String,
    /// Name.
    pub name: String,
}

/// A workload container named in the summary.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContainerRef {
    /// Namespace.
    pub namespace: String,
    /// The top owner.
    pub workload: WorkloadRef,
    /// Container name.
    pub container: String,
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
    /// Workload containers with no usage in the history: no recommendation for them.
    pub containers_without_usage: Vec<ContainerRef>,
    /// Samples read from Prometheus.
    pub samples_read: u64,
    /// Samples dropped as implausible (NaN, infinite, negative, beyond any VM).
    pub samples_rejected: u64,
    /// Start of the usage read in this run (later than the history window's start when
    /// resumed from a checkpoint), RFC 3339.
    pub read_from: String,
    /// Evaluation time, RFC 3339.
    pub now: String,
}

/// The whole report.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Report {
    /// Per container, by namespace, workload and container.
    pub recommendations: Vec<Entry>,
    /// Totals.
    pub summary: ReportSummary,
}

/// Parses a `--history` or `--step` value in seconds, refusing zero and values above
/// `max` (named in the message as `max_text`).
pub(super) fn duration_seconds(
    flag: &'static str,
    text: &str,
    max: i64,
    max_text: &str,
) -> Result<i64> {
    let invalid = |reason: String| CliError::InvalidFlag {
        flag,
        reason: format!("{text:?}: {reason}"),
    };
    // Days are common in this flag; accept `14d` as well as Go durations.
    let seconds = match text.strip_suffix('d').map(str::parse::<i64>) {
        Some(Ok(days)) => days
            .checked_mul(86_400)
            .filter(|s| *s >= 0)
            .ok_or_else(|| invalid(format!("must be at most {max_text}")))?,
        _ => crate::apis::duration::parse_duration(text)
            .map_err(|e| invalid(e.to_string()))?
            .as_secs(),
    };
    if seconds <= 0 {
        return Err(invalid("must be at least 1s".to_string()));
    }
    if seconds > max {
        return Err(invalid(format!("must be at most {max_text}")));
    }
    Ok(seconds)
}

/// Whether `s` is a valid Prometheus label name.
fn is_label_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Reads usage and builds the report.
pub async fn report(args: &RecommendArgs) -> Result<Report> {
    // Flags first: a bad value is reported before the cluster is read.
    let history = duration_seconds(
        "--history",
        &args.history,
        crate::usage::MAX_WINDOW_SECONDS,
        "366d",
    )?;
    let step = duration_seconds("--step", &args.step, crate::usage::MAX_STEP_SECONDS, "1h")?;
    if step > history {
        return Err(CliError::InvalidFlag {
            flag: "--step",
            reason: format!(
                "{:?} is longer than --history {:?}",
                args.step, args.history
            ),
        });
    }
    let snapshot = args
        .cluster
        // Right-sizing reads workload templates: pending pods for missing replicas would
        // only cost memory.
        .load(&args.namespaces, cluster::RIGHTSIZING, PendingPods::Skip)
        .await?;
    for warning in &snapshot.warnings {
        tracing::warn!("{warning}");
    }
    let workloads = Workloads::from_snapshot(&snapshot);
    let now = super::now_flag(args.now.as_deref())?;
    let policies = Policies::new(&snapshot.rightsizing_policies, None, Mode::Recommend);
    let (catalog, options) = args.source.clone().load()?;
    let types = catalog.instance_types(&options)?;
    let prices = Prices::from_instance_types(&types);
    let largest = types
        .iter()
        .map(|t| (t.allocatable.cpu, t.allocatable.memory))
        .fold((0, 0), |a, b| (a.0.max(b.0), a.1.max(b.1)));
    let settings = args
        .prometheus
        .settings(&args.prometheus_url, &args.source.azure)?;
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
    let in_scope: std::collections::BTreeSet<String> = namespaces.iter().cloned().collect();
    if workloads
        .templates
        .keys()
        .all(|w| !in_scope.contains(&w.namespace))
    {
        return Err(CliError::NothingToReport(if args.namespaces.is_empty() {
            "no workload in the snapshot or cluster: check --snapshot or --kubeconfig".to_string()
        } else {
            format!(
                "no workload in namespace(s) {}: check --namespace (the snapshot or cluster has \
                 workloads in {})",
                args.namespaces.join(", "),
                known_namespaces(&workloads)
            )
        }));
    }
    let window_start = now - history;
    let keep_hours = args.output == RecommendFormat::Html;
    // Resume from the checkpoint when it fits this run; a file that cannot be read is an
    // error (it is never overwritten unread).
    let resume = match &args.state {
        Some(path) if path.exists() => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| CliError::Input(format!("state file {}: {e}", path.display())))?;
            let c: Checkpoint = serde_json::from_str(&text).map_err(|e| {
                CliError::Input(format!(
                    "state file {}: {e} (move it away to start afresh)",
                    path.display()
                ))
            })?;
            Resume::All(c)
        }
        _ => Resume::Nothing,
    };
    let resuming_from = match &resume {
        Resume::All(c) if c.until >= window_start && c.until <= now => Some(c.until),
        _ => None,
    };
    let began = std::time::Instant::now();
    eprintln!(
        "reading {}h of usage for {} namespace(s) from {}{}",
        (now - resuming_from.unwrap_or(window_start)) / 3600,
        namespaces.len(),
        crate::usage::prometheus::redact_url(&args.prometheus_url),
        if resuming_from.is_some() {
            " (resuming from the state file)"
        } else {
            ""
        }
    );
    let outcome = recommend_workloads(
        &source,
        Request {
            snapshot: &snapshot,
            workloads: &workloads,
            policies: &policies,
            namespaces: &namespaces,
            history: Some(history),
            step,
            now,
            largest_node: Some(largest),
            prices,
            resume,
            keep_hours,
            ooms: &oom_kills(&snapshot.pods),
        },
    )
    .await
    .map_err(|e| CliError::Input(e.to_string()))?;
    if let Some((w, error)) = outcome
        .held
        .first()
        .map(|(w, p, e)| (w, format!("{p}: {e}")))
    {
        return Err(CliError::Input(format!(
            "{error} (it governs {}/{}/{})",
            w.namespace, w.kind, w.name
        )));
    }
    if let (Some(path), Some((_, why))) = (&args.state, outcome.not_resumed.first()) {
        eprintln!(
            "not resuming from {}: {why}; reading the whole history",
            path.display()
        );
    }
    let stats = outcome.stats;
    eprintln!(
        "read {} container series, {} samples in {} queries ({:.1}s)",
        stats.series,
        stats.samples,
        stats.queries,
        began.elapsed().as_secs_f64()
    );
    if stats.rejected_samples > 0 {
        tracing::warn!(
            "ignored {} samples that were not a number, infinite, negative or beyond any VM \
             (more than {} cores or {} bytes)",
            stats.rejected_samples,
            crate::usage::MAX_PLAUSIBLE_CPU_CORES,
            crate::usage::MAX_PLAUSIBLE_MEMORY_BYTES
        );
    }
    let unmatched = outcome.unmatched;
    if let Some(path) = &args.state {
        write_state(path, &outcome.merged_checkpoint(now))?;
    }
    let mut report = Report::default();
    let mut seen_workloads = std::collections::BTreeSet::new();
    for c in outcome.containers {
        let (w, r) = (&c.workload, c.recommendation);
        seen_workloads.insert(w.clone());
        report.summary.monthly_cost_delta += r.hourly_cost_delta * HOURS_PER_MONTH;
        report.recommendations.push(Entry {
            namespace: w.namespace.clone(),
            workload: WorkloadRef {
                kind: w.kind.clone(),
                name: w.name.clone(),
            },
            container: c.container.clone(),
            current: requests_limits(&r.current),
            recommended: requests_limits(&r.recommended),
            lower: pair(r.lower.0, r.lower.1),
            upper: pair(r.upper.0, r.upper.1),
            confidence: quantity::round_to(r.confidence, 2),
            actionable: r.actionable,
            reasons: r.reasons,
            monthly_cost_delta: quantity::round_to(r.hourly_cost_delta * HOURS_PER_MONTH, 2),
            hours: c.hours,
        });
    }
    // Every container of a workload in scope that has no usage is named, not dropped.
    for (w, container) in &outcome.without_usage {
        report.summary.containers_without_usage.push(ContainerRef {
            namespace: w.namespace.clone(),
            workload: WorkloadRef {
                kind: w.kind.clone(),
                name: w.name.clone(),
            },
            container: container.clone(),
        });
    }
    if report.recommendations.is_empty() {
        return Err(CliError::NothingToReport(nothing_matched(
            args,
            &stats,
            unmatched,
            &report.summary.containers_without_usage,
        )));
    }
    if !report.summary.containers_without_usage.is_empty() {
        tracing::warn!(
            "{} container(s) have no usage in Prometheus and get no recommendation: {}",
            report.summary.containers_without_usage.len(),
            names_of(&report.summary.containers_without_usage)
        );
    }
    report.summary.workloads = seen_workloads.len();
    report.summary.containers = report.recommendations.len();
    report.summary.monthly_cost_delta = quantity::round_to(report.summary.monthly_cost_delta, 2);
    report.summary.prometheus_queries = stats.queries;
    report.summary.samples_read = stats.samples;
    report.summary.samples_rejected = stats.rejected_samples;
    report.summary.read_from = rfc3339(outcome.read_from);
    report.summary.now = rfc3339(now);
    report.summary.unmatched_containers = unmatched;
    Ok(report)
}

/// The namespaces that hold workloads, for a message.
fn known_namespaces(workloads: &Workloads) -> String {
    let names: std::collections::BTreeSet<&str> = workloads
        .templates
        .keys()
        .map(|w| w.namespace.as_str())
        .collect();
    names.into_iter().collect::<Vec<_>>().join(", ")
}

/// Up to ten containers as `namespace/Kind/name/container`, for a message.
fn names_of(containers: &[ContainerRef]) -> String {
    let mut shown: Vec<String> = containers
        .iter()
        .take(10)
        .map(|c| {
            format!(
                "{}/{}/{}/{}",
                c.namespace, c.workload.kind, c.workload.name, c.container
            )
        })
        .collect();
    if containers.len() > 10 {
        shown.push(format!("and {} more", containers.len() - 10));
    }
    shown.join(", ")
}

/// Why a read produced no recommendation, and what to check.
fn nothing_matched(
    args: &RecommendArgs,
    stats: &crate::usage::ReadStats,
    unmatched: usize,
    without_usage: &[ContainerRef],
) -> String {
    let labels = format!(
        "--prometheus-namespace-label {:?}, --prometheus-pod-label {:?}, \
         --prometheus-container-label {:?}",
        args.prometheus.prometheus_namespace_label,
        args.prometheus.prometheus_pod_label,
        args.prometheus.prometheus_container_label
    );
    if stats.series == 0 {
        format!(
            "no usage for any of the {} workload container(s) ({}): Prometheus at {} has no \
             container_memory_working_set_bytes series with the labels {labels} in these \
             namespaces over --history {}; check the label flags, --namespace and that \
             Prometheus scrapes this cluster's cadvisor",
            without_usage.len(),
            names_of(without_usage),
            crate::usage::prometheus::redact_url(&args.prometheus_url),
            args.history
        )
    } else {
        format!(
            "{} container series were read from {} but {unmatched} of them matched none of \
             the {} workload container(s) ({}): check that the snapshot is of the cluster \
             Prometheus scrapes, and the label flags ({labels})",
            stats.series,
            crate::usage::prometheus::redact_url(&args.prometheus_url),
            without_usage.len(),
            names_of(without_usage)
        )
    }
}

fn rfc3339(t: i64) -> String {
    jiff::Timestamp::from_second(t).map_or_else(|_| t.to_string(), |t| t.to_string())
}

/// Writes the checkpoint next to its final place and renames it over, so a crash leaves
/// the old file or the new one, never half of one.
fn write_state(path: &std::path::Path, checkpoint: &Checkpoint) -> Result<()> {
    let text = serde_json::to_string(checkpoint).map_err(|e| CliError::Encode(e.to_string()))?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| CliError::Input(format!("state file {}: {e}", path.display())))
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
        "ACTIONABLE",
        "$/MONTH",
    ])
    .align_right(&[5, 7]);
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
            if e.actionable { "yes" } else { "no" }.to_string(),
            format!("{:+.2}", e.monthly_cost_delta),
        ]);
    }
    let s = &report.summary;
    let mut text = format!(
        "{}\n{} containers in {} workloads; {:+.2} $/month if applied ({} Prometheus queries).\n",
        t.render(),
        s.containers,
        s.workloads,
        s.monthly_cost_delta,
        s.prometheus_queries
    );
    let not_actionable = report
        .recommendations
        .iter()
        .filter(|e| !e.actionable)
        .count();
    if not_actionable > 0 {
        text.push_str(&format!(
            "{not_actionable} not actionable (too little history or gaps): shown, not to be applied.\n"
        ));
    }
    if !s.containers_without_usage.is_empty() {
        text.push_str(&format!(
            "{} container(s) without usage in Prometheus: {}.\n",
            s.containers_without_usage.len(),
            names_of(&s.containers_without_usage)
        ));
    }
    text
}

/// Renders the report as CSV: one row per container, quantities as Kubernetes strings.
pub fn csv(report: &Report) -> Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let err = |e: csv::Error| CliError::Encode(e.to_string());
    w.write_record([
        "namespace",
        "kind",
        "workload",
        "container",
        "current_cpu_request",
        "recommended_cpu_request",
        "current_memory_request",
        "recommended_memory_request",
        "current_cpu_limit",
        "recommended_cpu_limit",
        "current_memory_limit",
        "recommended_memory_limit",
        "lower_cpu",
        "upper_cpu",
        "lower_memory",
        "upper_memory",
        "confidence",
        "actionable",
        "monthly_cost_delta",
        "reasons",
    ])
    .map_err(err)?;
    let q = |v: &Option<String>| v.clone().unwrap_or_default();
    for e in &report.recommendations {
        w.write_record([
            e.namespace.clone(),
            e.workload.kind.clone(),
            e.workload.name.clone(),
            e.container.clone(),
            q(&e.current.requests.cpu),
            q(&e.recommended.requests.cpu),
            q(&e.current.requests.memory),
            q(&e.recommended.requests.memory),
            q(&e.current.limits.cpu),
            q(&e.recommended.limits.cpu),
            q(&e.current.limits.memory),
            q(&e.recommended.limits.memory),
            q(&e.lower.cpu),
            q(&e.upper.cpu),
            q(&e.lower.memory),
            q(&e.upper.memory),
            format!("{:.2}", e.confidence),
            e.actionable.to_string(),
            format!("{:.2}", e.monthly_cost_delta),
            e.reasons.join("; "),
        ])
        .map_err(err)?;
    }
    let bytes = w
        .into_inner()
        .map_err(|e| CliError::Encode(e.to_string()))?;
    String::from_utf8(bytes).map_err(|e| CliError::Encode(e.to_string()))
}

/// Runs `tailor recommend`.
pub fn run(args: RecommendArgs, out: &mut dyn Write) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let report = runtime.block_on(report(&args))?;
    let text = match args.output {
        RecommendFormat::Table => table(&report),
        RecommendFormat::Json => crate::report::render(crate::report::Format::Json, &report, table)
            .map_err(CliError::Encode)?,
        RecommendFormat::Yaml => crate::report::render(crate::report::Format::Yaml, &report, table)
            .map_err(CliError::Encode)?,
        RecommendFormat::Csv => csv(&report)?,
        RecommendFormat::Html => super::recommend_html::html(&report),
    };
    out.write_all(text.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(container: &str, actionable: bool, delta: f64) -> Entry {
        Entry {
            namespace: "shop".to_string(),
            workload: WorkloadRef {
                kind: "Deployment".to_string(),
                name: "web".to_string(),
            },
            container: container.to_string(),
            current: RequestsLimits {
                requests: pair(Some(1000), Some(1 << 30)),
                limits: CpuMemory::default(),
            },
            recommended: RequestsLimits {
                requests: pair(Some(500), Some(512 << 20)),
                limits: CpuMemory::default(),
            },
            lower: pair(Some(400), Some(400 << 20)),
            upper: pair(Some(800), Some(800 << 20)),
            confidence: 0.5,
            actionable,
            reasons: Vec::new(),
            monthly_cost_delta: delta,
            hours: Vec::new(),
        }
    }

    #[test]
    fn the_table_says_which_rows_are_actionable_and_names_containers_without_usage() {
        let report = Report {
            recommendations: vec![entry("app", true, -12.5), entry("worker", false, 0.0)],
            summary: ReportSummary {
                containers_without_usage: vec![ContainerRef {
                    namespace: "shop".to_string(),
                    workload: WorkloadRef {
                        kind: "Deployment".to_string(),
                        name: "web".to_string(),
                    },
                    container: "proxy".to_string(),
                }],
                ..ReportSummary::default()
            },
        };
        let text = table(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("ACTIONABLE"), "{text}");
        let column = lines[0].find("ACTIONABLE").expect("header");
        assert_eq!(&lines[1][column..column + 3], "yes", "{text}");
        assert_eq!(&lines[2][column..column + 2], "no", "{text}");
        assert!(text.contains("1 not actionable"), "{text}");
        assert!(
            text.contains("1 container(s) without usage in Prometheus: shop/Deployment/web/proxy"),
            "{text}"
        );
    }

    #[test]
    fn the_html_heading_names_container_workload_and_namespace_for_what_they_are() {
        let report = Report {
            recommendations: vec![entry("app", false, 1.0)],
            summary: ReportSummary {
                containers_without_usage: vec![ContainerRef {
                    namespace: "shop".to_string(),
                    workload: WorkloadRef {
                        kind: "Deployment".to_string(),
                        name: "web".to_string(),
                    },
                    container: "proxy".to_string(),
                }],
                ..ReportSummary::default()
            },
        };
        let page = super::super::recommend_html::html(&report);
        assert!(
            page.contains("<h2>container app of Deployment web in namespace shop</h2>"),
            "{page}"
        );
        assert!(page.contains("<th>Actionable</th>"), "{page}");
        assert!(
            page.contains("<li>container proxy of Deployment web in namespace shop</li>"),
            "{page}"
        );
    }
}
