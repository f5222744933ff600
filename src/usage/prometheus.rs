//! Usage from any Prometheus-compatible API (Prometheus, Thanos, Mimir, VictoriaMetrics).
//!
//! Prometheus must not be hurt: every query aggregates on the server to one series per
//! container (`sum`/`max by (namespace, pod, container)`), covers all selected namespaces
//! at once, and spans one time chunk (a day by default), so a 14-day read of any number of
//! containers is 14 chunks x 3 metrics. Chunks run a few at a time, and transport errors
//! are retried with backoff.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prometheus_http_query::Client;
use prometheus_http_query::response::Data;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue};
use tokio::sync::Semaphore;

use super::{ContainerKey, ContainerUsage, Usage, UsageError, UsageQuery, UsageSource};

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
    /// PEM file of a CA to trust in addition to the system roots.
    pub ca_file: Option<PathBuf>,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Time span of one range query.
    pub chunk: Duration,
    /// Queries in flight at once.
    pub concurrency: usize,
    /// Retries of a failed request.
    pub retries: u32,
    /// Label names.
    pub labels: LabelNames,
}

impl PrometheusSettings {
    /// Defaults for a URL: 30 s timeout, one-day chunks, 4 queries at once, 3 retries.
    pub fn new(url: &str) -> Self {
        PrometheusSettings {
            url: url.to_string(),
            bearer_token_file: None,
            basic_auth: None,
            headers: Vec::new(),
            ca_file: None,
            timeout: Duration::from_secs(30),
            chunk: Duration::from_secs(86_400),
            concurrency: 4,
            retries: 3,
            labels: LabelNames::default(),
        }
    }
}

/// The Prometheus usage source.
#[derive(Clone)]
pub struct PrometheusSource {
    client: Client,
    settings: Arc<PrometheusSettings>,
}

fn settings_error(what: impl std::fmt::Display) -> UsageError {
    UsageError::Settings(what.to_string())
}

impl PrometheusSource {
    /// Builds the HTTP client (auth, headers, CA, timeout) for the settings.
    pub fn new(settings: PrometheusSettings) -> Result<Self, UsageError> {
        crate::telemetry::install_tls_provider();
        let mut headers = HeaderMap::new();
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
            .timeout(settings.timeout);
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
        let client = Client::from(http, &settings.url)
            .map_err(|e| settings_error(format!("URL {:?}: {e}", settings.url)))?;
        Ok(PrometheusSource {
            client,
            settings: Arc::new(settings),
        })
    }

    fn selector(&self, metric: &str, extra: &str, namespaces: &[String]) -> String {
        let l = &self.settings.labels;
        let mut matchers = vec![
            format!("{}!=\"\"", l.container),
            format!("{}!=\"POD\"", l.container),
        ];
        if !namespaces.is_empty() {
            let escaped: Vec<String> = namespaces.iter().map(|n| regex_escape(n)).collect();
            matchers.push(format!("{}=~\"{}\"", l.namespace, escaped.join("|")));
        }
        if !extra.is_empty() {
            matchers.push(extra.to_string());
        }
        format!("{metric}{{{}}}", matchers.join(","))
    }

    fn by(&self) -> String {
        let l = &self.settings.labels;
        format!("{}, {}, {}", l.namespace, l.pod, l.container)
    }

    /// The three queries for one chunk.
    pub fn queries(&self, namespaces: &[String]) -> [(Metric, String); 3] {
        let by = self.by();
        [
            (
                Metric::Cpu,
                format!(
                    "sum by ({by}) (rate({}[5m]))",
                    self.selector("container_cpu_usage_seconds_total", "", namespaces)
                ),
            ),
            (
                Metric::Memory,
                format!(
                    "max by ({by}) ({})",
                    self.selector("container_memory_working_set_bytes", "", namespaces)
                ),
            ),
            (
                Metric::Oom,
                format!(
                    "max by ({by}) ({})",
                    self.selector(
                        "kube_pod_container_status_last_terminated_reason",
                        "reason=\"OOMKilled\"",
                        namespaces
                    )
                ),
            ),
        ]
    }

    async fn range(
        &self,
        query: &str,
        start: i64,
        end: i64,
        step: i64,
    ) -> Result<Data, UsageError> {
        let mut attempt = 0;
        loop {
            let result = self
                .client
                .query_range(query, start, end, step as f64)
                .get()
                .await;
            match result {
                Ok(r) => return Ok(r.data().clone()),
                Err(prometheus_http_query::Error::Prometheus(e)) => {
                    return Err(UsageError::Query {
                        url: self.settings.url.clone(),
                        query: query.to_string(),
                        message: e.to_string(),
                    });
                }
                Err(e) if attempt < self.settings.retries => {
                    attempt += 1;
                    tracing::warn!(error = %e, attempt, "prometheus request failed; retrying");
                    tokio::time::sleep(Duration::from_millis(200 * 2u64.pow(attempt))).await;
                }
                Err(e) => {
                    return Err(UsageError::Unavailable {
                        url: self.settings.url.clone(),
                        message: format!("{e} (after {} retries)", self.settings.retries),
                    });
                }
            }
        }
    }
}

/// Which series a query reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// CPU cores (rate of the usage counter).
    Cpu,
    /// Memory working set.
    Memory,
    /// OOM-kill termination reason.
    Oom,
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

fn key_of(
    labels: &std::collections::HashMap<String, String>,
    names: &LabelNames,
) -> Option<ContainerKey> {
    Some(ContainerKey {
        namespace: labels.get(&names.namespace)?.clone(),
        pod: labels.get(&names.pod)?.clone(),
        container: labels.get(&names.container)?.clone(),
    })
}

impl UsageSource for PrometheusSource {
    async fn usage(&self, query: &UsageQuery) -> Result<Usage, UsageError> {
        if query.end <= query.start || query.step <= 0 {
            return Err(settings_error(format!(
                "empty window {}..{} or step {}",
                query.start, query.end, query.step
            )));
        }
        let chunk = i64::try_from(self.settings.chunk.as_secs())
            .unwrap_or(86_400)
            .max(query.step);
        let mut jobs = Vec::new();
        let mut s = query.start;
        while s < query.end {
            // Range queries include both ends: chunks meet without overlapping.
            let e = (s + chunk).min(query.end);
            let last = e == query.end;
            let end = if last { e } else { e - query.step };
            for (metric, promql) in self.queries(&query.namespaces) {
                jobs.push((metric, promql, s, end));
            }
            s = e;
        }
        let issued = jobs.len();
        let permits = Arc::new(Semaphore::new(self.settings.concurrency.max(1)));
        let mut set = tokio::task::JoinSet::new();
        for (i, (metric, promql, start, end)) in jobs.into_iter().enumerate() {
            let this = self.clone();
            let permits = permits.clone();
            let step = query.step;
            set.spawn(async move {
                let _permit = permits.acquire_owned().await;
                let data = this.range(&promql, start, end, step).await;
                (i, metric, data)
            });
        }
        let mut results = Vec::with_capacity(issued);
        while let Some(joined) = set.join_next().await {
            let (i, metric, data) = joined.map_err(|e| UsageError::Unavailable {
                url: self.settings.url.clone(),
                message: format!("query task failed: {e}"),
            })?;
            results.push((i, metric, data?));
        }
        // Chunks in time order, so each container's samples come out sorted.
        results.sort_by_key(|r| r.0);
        let mut containers: BTreeMap<ContainerKey, ContainerUsage> = BTreeMap::new();
        for (_, metric, data) in results {
            let Data::Matrix(series) = data else {
                return Err(UsageError::Query {
                    url: self.settings.url.clone(),
                    query: format!("{metric:?}"),
                    message: "expected a range vector".to_string(),
                });
            };
            for s in series {
                let Some(key) = key_of(s.metric(), &self.settings.labels) else {
                    continue;
                };
                let entry = containers.entry(key).or_default();
                let samples = s
                    .samples()
                    .iter()
                    .map(|p| (p.timestamp() as i64, p.value()));
                match metric {
                    Metric::Cpu => entry.cpu.extend(samples),
                    Metric::Memory => entry.memory.extend(samples),
                    Metric::Oom => {
                        if let Some((t, _)) = samples.into_iter().find(|(_, v)| *v > 0.0)
                            && !entry.oom_kills.contains(&t)
                        {
                            entry.oom_kills.push(t);
                        }
                    }
                }
            }
        }
        Ok(Usage {
            containers,
            queries: issued,
        })
    }
}
