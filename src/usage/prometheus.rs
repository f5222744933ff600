//! Usage from any Prometheus-compatible API (Prometheus, Thanos, Mimir, VictoriaMetrics).
//!
//! Prometheus must not be hurt. A read first lists the container series in the window
//! (`/api/v1/series`, an index lookup), then plans its range queries from them:
//!
//! - every query aggregates on the server to one series per container (`sum`/`max by
//!   (namespace, pod, container)`) and covers as many namespaces as fit its budget;
//! - a query returns at most `max_points_per_query` points (containers x steps), and no
//!   series more than Prometheus' 11,000-point limit (longer windows are split in time);
//!   a namespace too large for one query is split by pod;
//! - memory is read as the exact peak of each interval (`max_over_time`, one point an hour
//!   by default), which is all the recommender needs from it; OOM kills come back only
//!   where a restart coincides with an `OOMKilled` termination reason;
//! - queries run a few at a time, and transport errors are retried with backoff until
//!   part of an answer has been handed on;
//! - answers are decoded as they arrive (`super::answer`): each series goes to the sink
//!   as it is read, so the memory a read takes follows one series per query in flight,
//!   not the size of the answers. The bytes in flight across all queries share one
//!   budget (`INFLIGHT_BYTES`), and an answer with more series than its query covers,
//!   more samples in a series than the query has steps, or a series longer than its
//!   samples and labels can take is refused as it arrives;
//! - an answer is read up to `max_response_bytes` and no further, and a failure says what
//!   happened: a timeout with its length, an HTML page where the API was expected, a
//!   body too large, Prometheus' own error.
//!
//! A 14-day read of 10,000 containers takes 118 queries at the default 1-minute CPU step
//! (27 at a 5-minute step); KRR's one query per 50 pods and resource takes 400. The agent
//! reads the whole window once, then only what is new.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use prometheus_http_query::response::Data;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use serde::de::DeserializeOwned;
use tokio::sync::Semaphore;

use super::answer::{AnswerError, AnswerLimits, Chunk, ChunkReader, Envelope, Matrix, SeriesList};
use super::{ContainerKey, ReadStats, UsageError, UsageQuery, UsageSink, UsageSource};
use crate::telemetry::Metrics;
use crate::telemetry::names::{PrometheusQuery, QueryError};

/// Prometheus refuses range queries of more than 11,000 points per series.
pub const MAX_POINTS_PER_SERIES: i64 = 11_000;

/// Most range queries one read may plan. A year of 10,000 containers at the default
/// step and budget takes about 600; a read that needs more asks too much of Prometheus
/// and is refused before the first query.
pub const MAX_QUERIES_PER_READ: usize = 2_000;

/// Default cap on one answer: 256 MiB. A full 2M-point range answer is about 80 MB of
/// JSON. Answers are decoded as they arrive, so this bounds the work of one answer, not
/// the memory it takes.
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 256 << 20;

/// Bytes of answers received and not yet decoded, across all the queries of a source: the
/// rest of an answer waits in the socket (and in Prometheus) until the decoders catch up.
pub const INFLIGHT_BYTES: usize = 16 << 20;

/// Most container series a read covers. More would take more memory than the agent is
/// given (a namespace filter reads a part of the cluster).
pub const MAX_CONTAINERS: usize = 100_000;

/// Most entries a series lookup may list (a container has one per restart and image).
pub const MAX_SERIES_ENTRIES: usize = 2_000_000;

/// Series of one query's answer beyond the containers it covers: containers that appeared
/// between the series lookup and the query.
fn series_allowed(containers: usize) -> usize {
    containers + containers / 4 + 16
}

/// Label names, which differ between cadvisor's own and kube-prometheus' relabelling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelNames {
    /// Namespace label.
    pub namespace: String,
    /// Pod label.
    pub pod: String,
    /// Container label.
    pub container: String,
}

impl Default for LabelNames {
    fn default() -> Self {
        LabelNames {
            namespace: "namespace".to_string(),
            pod: "pod".to_string(),
            container: "container".to_string(),
        }
    }
}

/// How to reach and query Prometheus.
#[derive(Debug, Clone)]
pub struct PrometheusSettings {
    /// Base URL, e.g. `http://prometheus.monitoring:9090`.
    pub url: String,
    /// File holding a bearer token, read once at start.
    pub bearer_token_file: Option<PathBuf>,
    /// Basic auth user and password.
    pub basic_auth: Option<(String, String)>,
    /// Extra headers (e.g. `X-Scope-OrgID` for Mimir).
    pub headers: Vec<(String, String)>,
    /// An AAD credential whose token is sent as the bearer token (Azure Managed
    /// Prometheus). It is asked before every request and refreshes before expiry.
    pub azure_auth: Option<AzureAuth>,
    /// PEM file of a CA to trust in addition to the system roots.
    pub ca_file: Option<PathBuf>,
    /// How long an answer may take to start, and then each part of it to arrive.
    pub timeout: Duration,
    /// Largest answer read, in bytes; a larger one fails the read without being held.
    pub max_response_bytes: u64,
    /// Window of `irate()` for CPU: each CPU sample is the usage between the last two
    /// scrapes in it, the minute-level usage whatever the step. Two minutes holds at least
    /// two samples at any usual cadvisor scrape interval (up to a minute).
    pub rate_window: Duration,
    /// Memory is read as the peak of each interval this long (divides a day).
    pub memory_interval: Duration,
    /// Most points (series x steps) one query may return.
    pub max_points_per_query: i64,
    /// Queries in flight at once.
    pub concurrency: usize,
    /// Retries of a failed request.
    pub retries: u32,
    /// Label names.
    pub labels: LabelNames,
}

impl PrometheusSettings {
    /// Defaults for a URL: 30 s timeout, 256 MiB answers, 2-minute `irate` windows, hourly
    /// memory peaks, 2M points per query, 4 queries at once, 3 retries.
    pub fn new(url: &str) -> Self {
        PrometheusSettings {
            url: url.to_string(),
            bearer_token_file: None,
            basic_auth: None,
            headers: Vec::new(),
            azure_auth: None,
            ca_file: None,
            timeout: Duration::from_secs(30),
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            rate_window: Duration::from_secs(120),
            memory_interval: Duration::from_secs(3600),
            max_points_per_query: 2_000_000,
            concurrency: 4,
            retries: 3,
            labels: LabelNames::default(),
        }
    }
}

/// Bearer tokens from an Azure credential (workload or managed identity) for `scope`.
#[derive(Debug, Clone)]
pub struct AzureAuth {
    /// The credential; it caches tokens and exchanges again shortly before they expire.
    pub credential: Arc<dyn azure_core::auth::TokenCredential>,
    /// The token scope, `https://prometheus.monitor.azure.com/.default` in the public cloud.
    pub scope: String,
}

/// Which series a query reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// CPU cores (rate of the usage counter).
    Cpu,
    /// Peak memory working set per interval.
    Memory,
    /// OOM kills per interval.
    Oom,
    /// Share of CFS periods throttled per interval, for containers with a CPU limit.
    Throttling,
}

/// One range query of a read.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedQuery {
    /// What it reads.
    pub metric: Metric,
    /// The PromQL.
    pub promql: String,
    /// First evaluation, unix seconds.
    pub start: i64,
    /// Last evaluation, unix seconds (inclusive).
    pub end: i64,
    /// Seconds between evaluations.
    pub step: i64,
    /// Containers it covers: its answer holds at most about this many series.
    pub series: usize,
}

impl PlannedQuery {
    /// Evaluations in its window: no series of its answer has more samples.
    pub fn points(&self) -> usize {
        ((self.end - self.start) / self.step.max(1) + 1).max(1) as usize
    }
}

/// A part of the containers one query covers: whole namespaces, or some pods of one
/// namespace. A query's parts are disjoint and joined with `or`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Namespaces(Vec<String>),
    Pods(String, Vec<String>),
}

/// Packs `containers` (namespace, pod; one entry per container) into groups of at most
/// `budget` containers (more only for a single pod that alone exceeds it), keeping
/// namespaces whole where they fit and splitting the others by pod. Each group comes with
/// the number of containers it covers.
fn groups(containers: &[(String, String)], budget: usize) -> Vec<(Vec<Part>, usize)> {
    let budget = budget.max(1);
    let mut by_ns: BTreeMap<&str, BTreeMap<&str, usize>> = BTreeMap::new();
    for (ns, pod) in containers {
        *by_ns.entry(ns).or_default().entry(pod).or_default() += 1;
    }
    let mut out = Vec::new();
    let mut whole: Vec<String> = Vec::new();
    let mut parts: Vec<Part> = Vec::new();
    let mut used = 0;
    let flush = |whole: &mut Vec<String>,
                 parts: &mut Vec<Part>,
                 used: usize,
                 out: &mut Vec<(Vec<Part>, usize)>| {
        let mut group = Vec::new();
        if !whole.is_empty() {
            group.push(Part::Namespaces(std::mem::take(whole)));
        }
        group.append(parts);
        if !group.is_empty() {
            out.push((group, used));
        }
    };
    for (ns, pods) in by_ns {
        let count: usize = pods.values().sum();
        if used + count <= budget {
            whole.push(ns.to_string());
            used += count;
            continue;
        }
        // Fill the rest of this group with some of its pods, then go on in new groups.
        let pods_len = pods.len();
        let mut chunk: Vec<String> = Vec::new();
        for (pod, c) in pods {
            if used + c > budget && used > 0 {
                if !chunk.is_empty() {
                    parts.push(Part::Pods(ns.to_string(), std::mem::take(&mut chunk)));
                }
                flush(&mut whole, &mut parts, used, &mut out);
                used = 0;
            }
            chunk.push(pod.to_string());
            used += c;
        }
        if chunk.len() == pods_len {
            whole.push(ns.to_string());
        } else if !chunk.is_empty() {
            parts.push(Part::Pods(ns.to_string(), chunk));
        }
    }
    flush(&mut whole, &mut parts, used, &mut out);
    out
}

/// Evaluation windows of at most `MAX_POINTS_PER_SERIES - 1` steps each, meeting without
/// overlap (range queries include both ends).
fn time_chunks(first: i64, last: i64, step: i64) -> Vec<(i64, i64)> {
    let span = (MAX_POINTS_PER_SERIES - 1) * step;
    let mut out = Vec::new();
    let mut s = first;
    while s <= last {
        let e = (s + span - step).min(last);
        out.push((s, e));
        s = e + step;
    }
    out
}

/// The Prometheus usage source.
#[derive(Clone)]
pub struct PrometheusSource {
    http: reqwest::Client,
    settings: Arc<PrometheusSettings>,
    /// The base URL as messages show it: credentials in it replaced by `***`.
    shown: Arc<str>,
    /// Where each request's duration and failure, and the data's age, are recorded.
    metrics: Option<Metrics>,
    /// Bytes of answers received and not yet decoded, across clones ([`INFLIGHT_BYTES`]).
    inflight: Arc<Semaphore>,
}

/// `url` as logs, errors and Events may show it: a user and password in it are replaced
/// by `***`. Text that does not parse as a URL with a host is shown from its last `@`.
pub fn redact_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut parsed) if parsed.has_host() => {
            if parsed.password().is_some() {
                let _ = parsed.set_password(Some("***"));
            }
            if !parsed.username().is_empty() {
                let _ = parsed.set_username("***");
            }
            parsed.to_string()
        }
        _ => match url.rsplit_once('@') {
            Some((_, rest)) => format!("***@{rest}"),
            None => url.to_string(),
        },
    }
}

fn settings_error(what: impl std::fmt::Display) -> UsageError {
    UsageError::Settings(what.to_string())
}

fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push_str("\\\\");
        }
        out.push(c);
    }
    out
}

/// The envelope of every Prometheus API answer.
#[derive(serde::Deserialize)]
struct ApiResponse<T> {
    status: String,
    data: Option<T>,
    #[serde(default)]
    error: Option<String>,
}

/// Labels of one series.
pub type Labels = std::collections::HashMap<String, String>;

/// How one request failed, why, and whether trying again can help.
enum Failure {
    /// Worth retrying: the connection failed, timed out, or the server had a moment.
    Transient(QueryError, String),
    /// Not worth retrying: the answer says the request or the settings are wrong.
    Final(QueryError, UsageError),
}

impl PrometheusSource {
    /// Builds the HTTP client (auth, headers, CA, timeout) for the settings.
    pub fn new(settings: PrometheusSettings) -> Result<Self, UsageError> {
        crate::telemetry::install_tls_provider();
        let mut headers = HeaderMap::new();
        if let Some(azure) = &settings.azure_auth {
            let other = if settings.bearer_token_file.is_some() {
                Some("a bearer token file")
            } else if settings.basic_auth.is_some() {
                Some("basic auth")
            } else if settings
                .headers
                .iter()
                .any(|(name, _)| name.eq_ignore_ascii_case("authorization"))
            {
                Some("an Authorization header")
            } else {
                None
            };
            if let Some(other) = other {
                return Err(settings_error(format!(
                    "Azure auth (token for {}) and {other} both set the Authorization header: \
                     use one",
                    azure.scope
                )));
            }
        }
        if let Some(file) = &settings.bearer_token_file {
            let token = std::fs::read_to_string(file).map_err(|e| {
                settings_error(format!("bearer token file {}: {e}", file.display()))
            })?;
            let value =
                HeaderValue::from_str(&format!("Bearer {}", token.trim())).map_err(|e| {
                    settings_error(format!("bearer token file {}: {e}", file.display()))
                })?;
            headers.insert(AUTHORIZATION, value);
        }
        if let Some((user, password)) = &settings.basic_auth {
            use base64::Engine as _;
            let encoded =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            let value = HeaderValue::from_str(&format!("Basic {encoded}"))
                .map_err(|e| settings_error(format!("basic auth: {e}")))?;
            headers.insert(AUTHORIZATION, value);
        }
        for (name, value) in &settings.headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| settings_error(format!("header name {name:?}: {e}")))?;
            let value = HeaderValue::from_str(value)
                .map_err(|e| settings_error(format!("header {name} value: {e}")))?;
            headers.insert(name, value);
        }
        let mut builder = reqwest::Client::builder()
            .default_headers(headers)
            .connect_timeout(settings.timeout)
            // Per read, not per request: an answer is decoded as it arrives, so a long
            // answer takes as long as its decoding, which no fixed total would fit.
            .read_timeout(settings.timeout);
        if let Some(ca) = &settings.ca_file {
            let pem = std::fs::read(ca)
                .map_err(|e| settings_error(format!("CA file {}: {e}", ca.display())))?;
            let cert = reqwest::Certificate::from_pem(&pem)
                .map_err(|e| settings_error(format!("CA file {}: {e}", ca.display())))?;
            builder = builder.add_root_certificate(cert);
        }
        let http = builder
            .build()
            .map_err(|e| settings_error(format!("HTTP client: {e}")))?;
        let shown: Arc<str> = redact_url(&settings.url).into();
        let url = reqwest::Url::parse(&settings.url)
            .map_err(|e| settings_error(format!("URL {shown:?}: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(settings_error(format!(
                "URL {shown:?}: the scheme must be http or https"
            )));
        }
        let day = 86_400;
        let interval = settings.memory_interval.as_secs() as i64;
        if interval <= 0 || day % interval != 0 {
            return Err(settings_error(format!(
                "memory interval {interval}s does not divide a day"
            )));
        }
        Ok(PrometheusSource {
            http,
            settings: Arc::new(settings),
            shown,
            metrics: None,
            inflight: Arc::new(Semaphore::new(INFLIGHT_BYTES)),
        })
    }

    /// Records every request's duration and failure, and the age of the newest sample of
    /// each read, in `metrics`.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    fn matchers(&self, namespaces: &[String], group: Option<&Part>) -> Vec<String> {
        let l = &self.settings.labels;
        let mut matchers = vec![
            format!("{}!=\"\"", l.container),
            format!("{}!=\"POD\"", l.container),
        ];
        let alternatives = |names: &[String]| {
            names
                .iter()
                .map(|n| regex_escape(n))
                .collect::<Vec<_>>()
                .join("|")
        };
        match group {
            Some(Part::Namespaces(ns)) => {
                matchers.push(format!("{}=~\"{}\"", l.namespace, alternatives(ns)));
            }
            Some(Part::Pods(ns, pods)) => {
                matchers.push(format!("{}=\"{}\"", l.namespace, ns.replace('"', "\\\"")));
                matchers.push(format!("{}=~\"{}\"", l.pod, alternatives(pods)));
            }
            None if !namespaces.is_empty() => {
                matchers.push(format!("{}=~\"{}\"", l.namespace, alternatives(namespaces)));
            }
            None => {}
        }
        matchers
    }

    fn selector(&self, metric: &str, extra: &str, matchers: &[String]) -> String {
        let mut all = matchers.to_vec();
        if !extra.is_empty() {
            all.push(extra.to_string());
        }
        format!("{metric}{{{}}}", all.join(","))
    }

    fn by(&self) -> String {
        let l = &self.settings.labels;
        format!("{}, {}, {}", l.namespace, l.pod, l.container)
    }

    /// `expr` for each part of a group, joined with `or` (the parts are disjoint).
    fn union(
        &self,
        query: &UsageQuery,
        group: &[Part],
        expr: impl Fn(&[String]) -> String,
    ) -> String {
        group
            .iter()
            .map(|part| expr(&self.matchers(&query.namespaces, Some(part))))
            .collect::<Vec<_>>()
            .join(" or ")
    }

    fn memory_interval(&self, query: &UsageQuery) -> i64 {
        (self.settings.memory_interval.as_secs() as i64).min((query.end - query.start).max(1))
    }

    /// The range queries for a read of `containers` (namespace, pod; one entry per
    /// container series) over the query's window. Pure: the benchmark counts them for
    /// clusters no test server holds.
    pub fn plan(&self, containers: &[(String, String)], query: &UsageQuery) -> Vec<PlannedQuery> {
        let mut out = Vec::new();
        if containers.is_empty() || query.end <= query.start {
            return out;
        }
        let by = self.by();
        let budget = |points_per_series: i64| {
            (self.settings.max_points_per_query / points_per_series.max(1)).max(1) as usize
        };
        // CPU: one point per step, each the usage between the last two scrapes before it
        // (`irate`): a sample of the minute-level usage, not the step's mean, which
        // would hide the minutes above it that a request is sized to keep short.
        let step = query.step.max(1);
        let window = self.settings.rate_window.as_secs().max(1) as i64;
        let cpu_chunks = time_chunks(query.start, query.end, step);
        let cpu_points = (cpu_chunks[0].1 - cpu_chunks[0].0) / step + 1;
        // A container capped by its CPU limit uses no more than the limit, whatever it
        // wanted; where cadvisor's CFS counters show throttling, the demand is estimated
        // from them as `rightsizing::recommender::throttled_demand` does (usage times one
        // plus half the throttled share of periods), in the same query, so the query
        // count does not grow.
        for (group, series) in groups(containers, budget(cpu_points)) {
            let rate_of = |metric: &'static str| {
                let union = self.union(query, &group, |sel| {
                    format!("irate({}[{window}s])", self.selector(metric, "", sel))
                });
                format!("sum by ({by}) ({union})")
            };
            let usage = rate_of("container_cpu_usage_seconds_total");
            let excess = crate::rightsizing::recommender::THROTTLED_EXCESS;
            let promql = format!(
                "({usage} * (1 + {excess} * clamp_max({} / ({} > 0), 1))) or {usage}",
                rate_of("container_cpu_cfs_throttled_periods_total"),
                rate_of("container_cpu_cfs_periods_total"),
            );
            for (s, e) in &cpu_chunks {
                out.push(PlannedQuery {
                    metric: Metric::Cpu,
                    promql: promql.clone(),
                    start: *s,
                    end: *e,
                    step,
                    series,
                });
            }
        }
        // Memory: the peak of each interval, evaluated at the interval's end over a window
        // one second short of it, so that consecutive intervals do not share a sample.
        let interval = self.memory_interval(query);
        let mem_chunks = time_chunks(query.start + interval, query.end, interval);
        let mem_points = (mem_chunks[0].1 - mem_chunks[0].0) / interval + 1;
        for (group, series) in groups(containers, budget(mem_points)) {
            let union = self.union(query, &group, |sel| {
                format!(
                    "max_over_time({}[{}s])",
                    self.selector("container_memory_working_set_bytes", "", sel),
                    interval - 1
                )
            });
            let promql = format!("max by ({by}) ({union})");
            for (s, e) in &mem_chunks {
                out.push(PlannedQuery {
                    metric: Metric::Memory,
                    promql: promql.clone(),
                    start: *s,
                    end: *e,
                    step: interval,
                    series,
                });
            }
        }
        // Throttling: the share of CFS periods throttled in each interval, for the
        // containers that have the counters (a CPU limit), so a throttled container's
        // limit is never lowered. Hourly, like memory, so it adds a query per memory one.
        for (group, series) in groups(containers, budget(mem_points)) {
            let increase = |metric: &'static str| {
                let union = self.union(query, &group, |sel| {
                    format!(
                        "increase({}[{}s])",
                        self.selector(metric, "", sel),
                        interval - 1
                    )
                });
                format!("sum by ({by}) ({union})")
            };
            let promql = format!(
                "{} / ({} > 0)",
                increase("container_cpu_cfs_throttled_periods_total"),
                increase("container_cpu_cfs_periods_total"),
            );
            for (s, e) in &mem_chunks {
                out.push(PlannedQuery {
                    metric: Metric::Throttling,
                    promql: promql.clone(),
                    start: *s,
                    end: *e,
                    step: interval,
                    series,
                });
            }
        }
        // OOM kills: a restart in the interval while the last termination was OOMKilled.
        // The answer holds only containers that were killed, so one query covers all.
        let m = self.matchers(&query.namespaces, None);
        let promql = format!(
            "(max by ({by}) (increase({}[{}s])) > 0) and on ({by}) (max by ({by}) ({}) == 1)",
            self.selector("kube_pod_container_status_restarts_total", "", &m),
            interval - 1,
            self.selector(
                "kube_pod_container_status_last_terminated_reason",
                "reason=\"OOMKilled\"",
                &m
            ),
        );
        for (s, e) in &mem_chunks {
            out.push(PlannedQuery {
                metric: Metric::Oom,
                promql: promql.clone(),
                start: *s,
                end: *e,
                step: interval,
                series: containers.len(),
            });
        }
        out
    }

    /// Runs `attempt_once` until it succeeds, fails for good, or has failed transiently
    /// `retries + 1` times, with backoff; records each request on the metrics.
    async fn call<T, F, Fut>(
        &self,
        query: PrometheusQuery,
        mut attempt_once: F,
    ) -> Result<T, UsageError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        let mut attempt = 0;
        loop {
            let started = std::time::Instant::now();
            let result = attempt_once().await;
            if let Some(m) = &self.metrics {
                m.observe_prometheus_query(query, started.elapsed().as_secs_f64());
                if let Err(Failure::Final(kind, _) | Failure::Transient(kind, _)) = &result {
                    m.prometheus_query_failed(query, *kind);
                }
            }
            match result {
                Ok(data) => return Ok(data),
                Err(Failure::Final(_, e)) => return Err(e),
                Err(Failure::Transient(_, message)) if attempt < self.settings.retries => {
                    attempt += 1;
                    tracing::warn!(error = %message, attempt, "prometheus request failed; retrying");
                    tokio::time::sleep(Duration::from_millis(200 * 2u64.pow(attempt))).await;
                }
                Err(Failure::Transient(_, message)) => {
                    return Err(UsageError::Unavailable {
                        url: self.shown.to_string(),
                        message: format!("{message} (tried {} times)", self.settings.retries + 1),
                    });
                }
            }
        }
    }

    /// POSTs `form` to the API `path` and decodes the whole answer's `data` (read up to the
    /// size cap), retrying transient failures. `what` names the request in errors. For the
    /// report's small queries; the usage read decodes its answers as they arrive.
    async fn call_buffered<T: DeserializeOwned>(
        &self,
        query: PrometheusQuery,
        path: &str,
        form: &[(&str, String)],
        what: &str,
    ) -> Result<T, UsageError> {
        self.call(query, || self.attempt(path, form, what)).await
    }

    /// `path` as messages show it.
    fn shown_url(&self, path: &str) -> String {
        format!("{}{path}", self.shown.trim_end_matches('/'))
    }

    fn transport(&self, url: &str, e: &reqwest::Error) -> Failure {
        if e.is_timeout() {
            Failure::Transient(
                QueryError::Timeout,
                format!(
                    "{url} timed out after {} s",
                    self.settings.timeout.as_secs_f64()
                ),
            )
        } else {
            Failure::Transient(QueryError::Unreachable, format!("{url}: {e}"))
        }
    }

    fn final_error(&self, kind: QueryError, message: String) -> Failure {
        Failure::Final(
            kind,
            UsageError::Unavailable {
                url: self.shown.to_string(),
                message,
            },
        )
    }

    fn too_large(&self, url: &str, size: u64) -> Failure {
        self.final_error(
            QueryError::TooLarge,
            format!(
                "the answer from {url} is {size} bytes or more, larger than the {} bytes \
                 read at most (--prometheus-max-response-bytes); fewer points per query \
                 make smaller answers",
                self.settings.max_response_bytes
            ),
        )
    }

    fn not_html(&self, url: &str, status: reqwest::StatusCode) -> Failure {
        self.final_error(
            QueryError::NotPrometheus,
            format!(
                "HTTP {status} from {url}: the answer is HTML, not the Prometheus API \
                 (a login page or a proxy?): check --prometheus-url and the auth settings"
            ),
        )
    }

    /// Sends one request and checks what can be known before its body: credentials
    /// refused, an HTML page, a declared length over the cap.
    async fn open(
        &self,
        path: &str,
        form: &[(&str, String)],
    ) -> Result<(reqwest::Response, reqwest::StatusCode), Failure> {
        let target = format!("{}{path}", self.settings.url.trim_end_matches('/'));
        // What messages show: never the credentials a URL may carry.
        let url = self.shown_url(path);
        let mut request = self.http.post(&target).form(form);
        if let Some(azure) = &self.settings.azure_auth {
            // The credential answers from its cache, or exchanges again near expiry.
            let token = azure
                .credential
                .get_token(&[azure.scope.as_str()])
                .await
                .map_err(|e| {
                    self.final_error(
                        QueryError::Unauthorized,
                        format!(
                            "no Azure token for {} to query {url}: {}",
                            azure.scope,
                            crate::telemetry::error_chain(&e)
                        ),
                    )
                })?;
            request = request.bearer_auth(token.token.secret());
        }
        let response = tokio::time::timeout(self.settings.timeout, request.send())
            .await
            .map_err(|_| {
                Failure::Transient(
                    QueryError::Timeout,
                    format!(
                        "{url} timed out after {} s",
                        self.settings.timeout.as_secs_f64()
                    ),
                )
            })?
            .map_err(|e| self.transport(&url, &e))?;
        let status = response.status();
        if matches!(status.as_u16(), 401 | 403) {
            // Credentials do not get better by retrying.
            let hint = match &self.settings.azure_auth {
                Some(azure) => format!(
                    "the Azure token for {} was refused: the identity needs the Monitoring \
                     Data Reader role on the Azure Monitor workspace",
                    azure.scope
                ),
                None => "check the bearer token, basic auth or Azure auth settings \
                         (--prometheus-bearer-token-file, --prometheus-basic-auth-user, \
                         --prometheus-azure-auth)"
                    .to_string(),
            };
            return Err(self.final_error(
                QueryError::Unauthorized,
                format!("HTTP {status} from {url}: {hint}"),
            ));
        }
        let html = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.to_ascii_lowercase().contains("html"));
        if html {
            return Err(self.not_html(&url, status));
        }
        if let Some(length) = response.content_length()
            && length > self.settings.max_response_bytes
        {
            return Err(self.too_large(&url, length));
        }
        Ok((response, status))
    }

    /// One request: the whole answer read up to the size cap, then decoded.
    async fn attempt<T: DeserializeOwned>(
        &self,
        path: &str,
        form: &[(&str, String)],
        what: &str,
    ) -> Result<T, Failure> {
        let url = self.shown_url(path);
        let (mut response, status) = self.open(path, form).await?;
        let cap = self.settings.max_response_bytes;
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| self.transport(&url, &e))?
        {
            if (body.len() + chunk.len()) as u64 > cap {
                return Err(self.too_large(&url, (body.len() + chunk.len()) as u64));
            }
            body.extend_from_slice(&chunk);
        }
        if body.trim_ascii_start().starts_with(b"<") {
            return Err(self.not_html(&url, status));
        }
        let decoded: ApiResponse<T> = match serde_json::from_slice(&body) {
            Ok(d) => d,
            // A server error without an API answer (a proxy's 502) may pass.
            Err(_) if status.is_server_error() => {
                return Err(Failure::Transient(
                    QueryError::ServerError,
                    format!("HTTP {status} from {url}"),
                ));
            }
            Err(e) => {
                return Err(self.final_error(
                    QueryError::NotPrometheus,
                    format!("HTTP {status} from {url}: the answer is not the Prometheus API: {e}"),
                ));
            }
        };
        self.envelope(
            Envelope {
                status: decoded.status,
                data: decoded.data,
                error: decoded.error,
            },
            status,
            &url,
            what,
        )
    }

    /// The data of a decoded answer, or the error it carries.
    fn envelope<T>(
        &self,
        envelope: Envelope<T>,
        status: reqwest::StatusCode,
        url: &str,
        what: &str,
    ) -> Result<T, Failure> {
        if envelope.status != "success" {
            return Err(Failure::Final(
                QueryError::Query,
                UsageError::Query {
                    url: self.shown.to_string(),
                    query: what.to_string(),
                    message: envelope.error.unwrap_or(envelope.status),
                },
            ));
        }
        envelope.data.ok_or_else(|| {
            self.final_error(
                QueryError::NotPrometheus,
                format!("HTTP {status} from {url}: a success answer without data"),
            )
        })
    }

    /// One request whose answer `decode` reads as it arrives, on a blocking thread, within
    /// `limits`. `handed_on` counts what `decode` has passed on: once it has, a broken
    /// answer cannot be tried again and the failure is final.
    async fn attempt_streamed<T, D>(
        &self,
        path: &str,
        form: &[(&str, String)],
        what: &str,
        limits: AnswerLimits,
        handed_on: &AtomicUsize,
        decode: D,
    ) -> Result<T, Failure>
    where
        T: Send + 'static,
        D: FnOnce(&mut ChunkReader) -> Result<Envelope<T>, AnswerError> + Send + 'static,
    {
        let url = self.shown_url(path);
        let (mut response, status) = self.open(path, form).await?;
        let (chunks, received) = tokio::sync::mpsc::channel::<Chunk>(2);
        let decoder = tokio::task::spawn_blocking(move || {
            let mut reader = ChunkReader::new(received, limits);
            decode(&mut reader)
        });
        // Chunks go to the decoder as it takes them; the rest waits in the socket.
        let mut first = true;
        let pumped: Result<(), Failure> = loop {
            let chunk = match response.chunk().await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => break Ok(()),
                Err(e) => break Err(self.transport(&url, &e)),
            };
            if std::mem::take(&mut first) && chunk.trim_ascii_start().starts_with(b"<") {
                break Err(self.not_html(&url, status));
            }
            let share = u32::try_from(chunk.len().clamp(1, INFLIGHT_BYTES)).unwrap_or(u32::MAX);
            let Ok(budget) = self.inflight.clone().acquire_many_owned(share).await else {
                break Ok(());
            };
            if chunks.send(Chunk::new(chunk, budget)).await.is_err() {
                // The decoder stopped: its answer says why.
                break Ok(());
            }
        };
        drop(chunks);
        let decoded = decoder.await;
        let partial = handed_on.load(Ordering::Acquire) > 0;
        let final_after_part = |kind: QueryError, message: String| {
            self.final_error(
                kind,
                format!("{message} (after part of the answer was read, so not tried again)"),
            )
        };
        match (pumped, decoded) {
            (Err(Failure::Transient(kind, message)), _) if partial => {
                Err(final_after_part(kind, message))
            }
            (Err(failure), _) => Err(failure),
            (Ok(()), Err(e)) => Err(self.final_error(
                QueryError::NotPrometheus,
                format!("decoding the answer from {url} failed: {e}"),
            )),
            (Ok(()), Ok(Ok(envelope))) => self.envelope(envelope, status, &url, what),
            (Ok(()), Ok(Err(e))) if e.limit => Err(self.final_error(
                QueryError::TooLarge,
                format!("HTTP {status} from {url}: {e}"),
            )),
            // A server error without an API answer (a proxy's 502) may pass.
            (Ok(()), Ok(Err(_))) if status.is_server_error() && !partial => Err(
                Failure::Transient(QueryError::ServerError, format!("HTTP {status} from {url}")),
            ),
            (Ok(()), Ok(Err(e))) => Err(self.final_error(
                QueryError::NotPrometheus,
                format!("HTTP {status} from {url}: the answer is not the Prometheus API: {e}"),
            )),
        }
    }

    /// A range query of any PromQL (the cost report's series), each series with its labels
    /// and its samples (unix seconds, value); samples that are not finite are left out.
    pub async fn query_range(
        &self,
        promql: &str,
        start: i64,
        end: i64,
        step: i64,
    ) -> Result<Vec<(Labels, Vec<(i64, f64)>)>, UsageError> {
        if step <= 0 || end < start || (end - start) / step + 1 > MAX_POINTS_PER_SERIES {
            return Err(settings_error(format!(
                "a range query from {start} to {end} every {step}s is outside 1..={MAX_POINTS_PER_SERIES} \
                 points per series: lengthen the step or shorten the window"
            )));
        }
        let form = [
            ("query", promql.to_string()),
            ("start", start.to_string()),
            ("end", end.to_string()),
            ("step", step.to_string()),
        ];
        let data: Data = self
            .call_buffered(
                PrometheusQuery::Report,
                "/api/v1/query_range",
                &form,
                promql,
            )
            .await?;
        match data {
            Data::Matrix(series) => Ok(series
                .into_iter()
                .map(|s| {
                    let (labels, samples) = s.into_inner();
                    let samples = samples
                        .iter()
                        .filter(|p| p.value().is_finite())
                        .map(|p| (p.timestamp() as i64, p.value()))
                        .collect();
                    (labels, samples)
                })
                .collect()),
            _ => Err(UsageError::Query {
                url: self.shown.to_string(),
                query: promql.to_string(),
                message: "expected a range vector".to_string(),
            }),
        }
    }

    /// An instant query of any PromQL at unix second `time`: each series' labels and
    /// value (series whose value is not finite are left out).
    pub async fn query_instant(
        &self,
        promql: &str,
        time: i64,
    ) -> Result<Vec<(Labels, f64)>, UsageError> {
        let form = [("query", promql.to_string()), ("time", time.to_string())];
        let data: Data = self
            .call_buffered(PrometheusQuery::Report, "/api/v1/query", &form, promql)
            .await?;
        match data {
            Data::Vector(series) => Ok(series
                .into_iter()
                .map(|s| s.into_inner())
                .filter(|(_, v)| v.value().is_finite())
                .map(|(labels, v)| (labels, v.value()))
                .collect()),
            _ => Err(UsageError::Query {
                url: self.shown.to_string(),
                query: promql.to_string(),
                message: "expected an instant vector".to_string(),
            }),
        }
    }

    /// The label names of the container series.
    pub fn labels(&self) -> &LabelNames {
        &self.settings.labels
    }

    /// The base URL, for messages (credentials in it replaced by `***`).
    pub fn url(&self) -> &str {
        &self.shown
    }

    /// The container series (namespace, pod; one entry per container) with memory
    /// samples in the window: an index lookup, no samples read. The lookup's answer is
    /// decoded as it arrives, and only the distinct containers are kept.
    pub async fn containers(
        &self,
        query: &UsageQuery,
    ) -> Result<Vec<(String, String)>, UsageError> {
        let m = self.matchers(&query.namespaces, None);
        let selector = self.selector("container_memory_working_set_bytes", "", &m);
        let form = [
            ("match[]", selector.clone()),
            ("start", query.start.to_string()),
            ("end", query.end.to_string()),
        ];
        let limits = AnswerLimits {
            max_bytes: self.settings.max_response_bytes,
            max_series: MAX_SERIES_ENTRIES,
            max_samples: 0,
            max_element_bytes: 64 << 10,
        };
        let keys = self
            .call(PrometheusQuery::Series, || {
                let names = self.settings.labels.clone();
                let handed_on = AtomicUsize::new(0);
                let (form, selector) = (&form, &selector);
                async move {
                    self.attempt_streamed(
                        "/api/v1/series",
                        form,
                        selector,
                        limits,
                        &handed_on,
                        move |reader| {
                            let mut keys = std::collections::BTreeSet::new();
                            let list = SeriesList::new(reader, &names, limits, |key| {
                                keys.insert(key);
                                if keys.len() > MAX_CONTAINERS {
                                    return Err(format!(
                                        "more than {MAX_CONTAINERS} containers have usage in \
                                         the window, more than one read covers: read fewer \
                                         namespaces"
                                    ));
                                }
                                Ok(())
                            });
                            let envelope = reader.decode(list)?;
                            Ok(Envelope {
                                status: envelope.status,
                                data: envelope.data.map(|_| keys),
                                error: envelope.error,
                            })
                        },
                    )
                    .await
                }
            })
            .await?;
        Ok(keys.into_iter().map(|k| (k.namespace, k.pod)).collect())
    }

    /// One planned range query, its series sent to `series` as they are decoded.
    async fn range_into(
        &self,
        q: &PlannedQuery,
        series: tokio::sync::mpsc::Sender<Delivered>,
    ) -> Result<(), UsageError> {
        let form = [
            ("query", q.promql.clone()),
            ("start", q.start.to_string()),
            ("end", q.end.to_string()),
            ("step", q.step.to_string()),
        ];
        let kind = match q.metric {
            Metric::Cpu => PrometheusQuery::Cpu,
            Metric::Memory => PrometheusQuery::Memory,
            Metric::Oom => PrometheusQuery::OomKills,
            Metric::Throttling => PrometheusQuery::Throttling,
        };
        let limits = AnswerLimits::range(
            self.settings.max_response_bytes,
            series_allowed(q.series),
            q.points(),
        );
        let handed_on = Arc::new(AtomicUsize::new(0));
        let metric = q.metric;
        self.call(kind, || {
            let names = self.settings.labels.clone();
            let series = series.clone();
            let counted = handed_on.clone();
            let handed_on = handed_on.clone();
            let form = &form;
            async move {
                self.attempt_streamed(
                    "/api/v1/query_range",
                    form,
                    &q.promql,
                    limits,
                    &handed_on,
                    move |reader| {
                        let matrix = Matrix::new(reader, &names, limits, |key, samples| {
                            let Some(key) = key else {
                                return Ok(());
                            };
                            counted.fetch_add(1, Ordering::AcqRel);
                            series
                                .blocking_send(Delivered {
                                    metric,
                                    key,
                                    samples,
                                })
                                .map_err(|_| "the read stopped".to_string())
                        });
                        reader.decode(matrix)
                    },
                )
                .await
                .map(|_| ())
            }
        })
        .await
    }
}

/// One series of a range answer, on its way from the decoder to the sink.
struct Delivered {
    metric: Metric,
    key: ContainerKey,
    samples: Vec<(i64, f64)>,
}

impl UsageSource for PrometheusSource {
    async fn read<S: UsageSink + Send>(
        &self,
        query: &UsageQuery,
        sink: &mut S,
    ) -> Result<ReadStats, UsageError> {
        // Bounded first: the plan's size follows from the window and the step.
        query.check()?;
        let containers = self.containers(query).await?;
        let plan = self.plan(&containers, query);
        if plan.len() > MAX_QUERIES_PER_READ {
            return Err(settings_error(format!(
                "reading {} container series over {}s at a {}s step would take {} queries, \
                 more than the {MAX_QUERIES_PER_READ} one read may issue: shorten the \
                 history, lengthen the step or raise the points per query",
                containers.len(),
                query.end - query.start,
                query.step,
                plan.len()
            )));
        }
        let mut stats = ReadStats {
            queries: 1 + plan.len(),
            series: containers.len(),
            ..ReadStats::default()
        };
        let interval = self.memory_interval(query);
        let mut newest: Option<i64> = None;
        let permits = Arc::new(Semaphore::new(self.settings.concurrency.max(1)));
        // Series go to the sink one at a time as the decoders read them; a few wait.
        let (sender, mut received) = tokio::sync::mpsc::channel::<Delivered>(16);
        let mut set = tokio::task::JoinSet::new();
        for q in plan {
            let this = self.clone();
            let permits = permits.clone();
            let sender = sender.clone();
            set.spawn(async move {
                let _permit = permits.acquire_owned().await;
                this.range_into(&q, sender).await
            });
        }
        drop(sender);
        let failed = |e: tokio::task::JoinError| UsageError::Unavailable {
            url: self.shown.to_string(),
            message: format!("query task failed: {e}"),
        };
        loop {
            let delivered = tokio::select! {
                delivered = received.recv() => match delivered {
                    Some(d) => d,
                    // Every query is done.
                    None => break,
                },
                Some(joined) = set.join_next() => {
                    // A failed query fails the read at once; the others are stopped.
                    joined.map_err(failed)??;
                    continue;
                }
            };
            let Delivered {
                metric,
                key,
                samples: mut buf,
            } = delivered;
            let plausible = match metric {
                Metric::Cpu => super::plausible_cpu,
                Metric::Memory => super::plausible_memory,
                Metric::Oom => f64::is_finite,
                Metric::Throttling => |v: f64| (0.0..=1.0).contains(&v),
            };
            // Prometheus writes values as strings; "NaN" and "+Inf" arrive as such and
            // are counted with the other implausible samples.
            let before = buf.len();
            buf.retain(|(_, v)| plausible(*v));
            stats.rejected_samples += (before - buf.len()) as u64;
            stats.samples += buf.len() as u64;
            if matches!(metric, Metric::Cpu | Metric::Memory) {
                newest = newest.max(buf.iter().map(|(t, _)| *t).max());
            }
            match metric {
                Metric::Cpu => sink.cpu(&key, &buf),
                Metric::Memory => {
                    for p in &mut buf {
                        p.0 -= interval;
                    }
                    sink.memory_peaks(&key, interval, &buf);
                }
                Metric::Oom => {
                    for (t, _) in &buf {
                        sink.oom_kill(&key, *t, interval);
                    }
                }
                Metric::Throttling => {
                    for p in &mut buf {
                        p.0 -= interval;
                    }
                    sink.throttling(&key, interval, &buf);
                }
            }
        }
        while let Some(joined) = set.join_next().await {
            joined.map_err(failed)??;
        }
        // How old the freshest usage is: autonomous right-sizing pauses when it is stale.
        if let (Some(m), Some(newest)) = (&self.metrics, newest) {
            m.set_usage_data_age((query.end - newest).max(0) as f64);
        }
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_in_a_url_are_never_shown() {
        for (url, shown) in [
            ("http://rt:s3cr3t@prom:9090", "http://***:***@prom:9090/"),
            (
                "https://user@prom.example/select/0",
                "https://***@prom.example/select/0",
            ),
            ("http://prom:9090", "http://prom:9090/"),
            ("prom:s3cr3t@host", "***@host"),
            ("no url at all", "no url at all"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    fn containers(spec: &[(&str, &str, usize)]) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (ns, pod, n) in spec {
            for _ in 0..*n {
                out.push((ns.to_string(), pod.to_string()));
            }
        }
        out
    }

    #[test]
    fn namespaces_are_packed_whole_and_a_large_one_is_split_by_pod() {
        let c = containers(&[
            ("a", "a-1", 2),
            ("b", "b-1", 1),
            ("c", "c-1", 3),
            ("c", "c-2", 3),
            ("c", "c-3", 1),
            ("d", "d-1", 1),
        ]);
        assert_eq!(
            groups(&c, 4),
            vec![
                (vec![Part::Namespaces(vec!["a".into(), "b".into()])], 3),
                (vec![Part::Pods("c".into(), vec!["c-1".into()])], 3),
                (
                    vec![Part::Pods("c".into(), vec!["c-2".into(), "c-3".into()])],
                    4
                ),
                (vec![Part::Namespaces(vec!["d".into()])], 1),
            ]
        );
        // Room left in a group is filled with the pods of the next namespace.
        let c = containers(&[("a", "a-1", 3), ("b", "b-1", 1), ("b", "b-2", 1)]);
        assert_eq!(
            groups(&c, 4),
            vec![
                (
                    vec![
                        Part::Namespaces(vec!["a".into()]),
                        Part::Pods("b".into(), vec!["b-1".into()])
                    ],
                    4
                ),
                (vec![Part::Pods("b".into(), vec!["b-2".into()])], 1),
            ]
        );
    }

    #[test]
    fn long_windows_are_split_below_the_point_limit_without_overlap() {
        let chunks = time_chunks(0, 14 * 86_400, 60);
        assert_eq!(chunks.len(), 2);
        assert_eq!(chunks[0].0, 0);
        assert_eq!(chunks[1].0, chunks[0].1 + 60);
        assert_eq!(chunks[1].1, 14 * 86_400);
        for (s, e) in chunks {
            assert!((e - s) / 60 < MAX_POINTS_PER_SERIES);
        }
    }

    #[test]
    fn ten_thousand_containers_over_two_weeks_take_a_few_dozen_queries() {
        let source = PrometheusSource::new(PrometheusSettings::new("http://prometheus:9090"))
            .expect("settings");
        let c: Vec<(String, String)> = (0..10_000)
            .map(|i| (format!("ns-{}", i / 250), format!("pod-{i}")))
            .collect();
        let q = UsageQuery {
            namespaces: Vec::new(),
            start: 0,
            end: 14 * 86_400,
            step: 300,
        };
        let plan = source.plan(&c, &q);
        let count = |m: Metric| plan.iter().filter(|p| p.metric == m).count();
        assert_eq!(count(Metric::Oom), 1);
        assert!(count(Metric::Memory) <= 2, "{}", count(Metric::Memory));
        assert_eq!(count(Metric::Throttling), count(Metric::Memory));
        // Throttling is read in the CPU queries themselves: no extra query.
        assert!(plan.iter().filter(|p| p.metric == Metric::Cpu).all(|p| {
            p.promql
                .contains("container_cpu_cfs_throttled_periods_total")
                && p.promql.contains("container_cpu_cfs_periods_total")
        }));
        assert!(plan.len() < 30, "{} queries", plan.len());
        // The groups of each window cover every container once, and each query says how
        // many: its answer may hold no more than about that many series.
        let covered = |m: Metric| -> usize {
            let first = plan.iter().filter(|p| p.metric == m).map(|p| p.start).min();
            plan.iter()
                .filter(|p| p.metric == m && Some(p.start) == first)
                .map(|p| p.series)
                .sum()
        };
        assert_eq!(covered(Metric::Cpu), 10_000);
        assert_eq!(covered(Metric::Memory), 10_000);
        assert_eq!(covered(Metric::Oom), 10_000);
        for p in &plan {
            assert!((p.end - p.start) / p.step < MAX_POINTS_PER_SERIES, "{p:?}");
        }
    }
}
