//! The metrics facade: every measurement goes through one method here, which records it
//! both in the Prometheus registry behind `/metrics` and in OpenTelemetry instruments
//! (exported by OTLP when configured, no-ops otherwise). Every family is registered from
//! [`names::CATALOGUE`], so what is served is exactly what the reference page documents.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, LazyLock};

use opentelemetry::KeyValue;
use opentelemetry::metrics::{
    Counter as OtelCounter, Gauge as OtelGauge, Histogram as OtelHistogram, Meter,
};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::names::{
    self, BlockedReason, CloudOperation, ConnectionShed, Controller, DropReason, EvictionWait,
    Listener, MetricDef, MetricType, PrometheusQuery, QueryError, RecommendationState,
    SavingsSource, Signal, Stage, StuckResize, TerminationReason, Usage, WebhookOutcome, When,
};

type Labels = Vec<(&'static str, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;
type FloatCounter = Counter<f64, AtomicU64>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// Units whose values are fractional; every other unit counts things.
const FLOAT_UNITS: &[&str] = &[
    "seconds",
    "dollars",
    "dollars per hour",
    "cores",
    "bytes",
    "unix seconds",
];

fn is_float(def: &MetricDef) -> bool {
    FLOAT_UNITS.contains(&def.unit)
}

fn buckets(def: &MetricDef) -> &'static [f64] {
    match def.name {
        n if n == names::DECISION_DURATION.name || n == names::RECONCILE_DURATION.name => {
            names::DECISION_BUCKETS
        }
        n if n == names::CLOUD_REQUEST_DURATION.name
            || n == names::PROMETHEUS_QUERY_DURATION.name =>
        {
            names::CALL_BUCKETS
        }
        n if n == names::WEBHOOK_DURATION.name => names::WEBHOOK_BUCKETS,
        _ => names::PROVISIONING_BUCKETS,
    }
}

fn provisioning_histogram() -> Histogram {
    Histogram::new(names::PROVISIONING_BUCKETS.iter().copied())
}

fn decision_histogram() -> Histogram {
    Histogram::new(names::DECISION_BUCKETS.iter().copied())
}

fn call_histogram() -> Histogram {
    Histogram::new(names::CALL_BUCKETS.iter().copied())
}

fn webhook_histogram() -> Histogram {
    Histogram::new(names::WEBHOOK_BUCKETS.iter().copied())
}

/// What OTLP export dropped, for the whole process: the exporters are built before any
/// facade and outlive them, so every facade's registry serves this one family.
static OTLP_DROPPED: LazyLock<Family<Labels, Counter>> = LazyLock::new(Family::default);

/// Counts `n` metric data points or spans that OTLP export dropped. Served at `/metrics`
/// only: the exporter that dropped them is the one that would carry the count.
pub fn record_otlp_dropped(signal: Signal, reason: DropReason, n: u64) {
    OTLP_DROPPED
        .get_or_create(&otlp_dropped_labels(signal, reason))
        .inc_by(n);
}

fn otlp_dropped_labels(signal: Signal, reason: DropReason) -> Labels {
    vec![
        (names::label::SIGNAL, signal.as_str().to_string()),
        (names::label::REASON, reason.as_str().to_string()),
    ]
}

/// One registered family, of the type its definition says.
#[derive(Clone)]
enum Prom {
    Counter(Family<Labels, Counter>),
    FloatCounter(Family<Labels, FloatCounter>),
    Gauge(Family<Labels, Gauge>),
    FloatGauge(Family<Labels, FloatGauge>),
    Histogram(HistogramFamily),
}

enum Otel {
    Counter(OtelCounter<u64>),
    FloatCounter(OtelCounter<f64>),
    Gauge(OtelGauge<u64>),
    FloatGauge(OtelGauge<f64>),
    Histogram(OtelHistogram<f64>),
}

struct Instrument {
    def: MetricDef,
    prom: Prom,
    otel: Otel,
}

impl Instrument {
    fn new(def: MetricDef, meter: &Meter) -> Self {
        let unit = otel_unit(def.unit);
        let (prom, otel) = match (def.kind, is_float(&def)) {
            (MetricType::Counter, false) => (
                Prom::Counter(if def.name == names::OTLP_DROPPED.name {
                    OTLP_DROPPED.clone()
                } else {
                    Family::default()
                }),
                Otel::Counter(
                    meter
                        .u64_counter(def.name)
                        .with_description(def.help)
                        .with_unit(unit)
                        .build(),
                ),
            ),
            (MetricType::Counter, true) => (
                Prom::FloatCounter(Family::default()),
                Otel::FloatCounter(
                    meter
                        .f64_counter(def.name)
                        .with_description(def.help)
                        .with_unit(unit)
                        .build(),
                ),
            ),
            (MetricType::Gauge, false) => (
                Prom::Gauge(Family::default()),
                Otel::Gauge(
                    meter
                        .u64_gauge(def.name)
                        .with_description(def.help)
                        .with_unit(unit)
                        .build(),
                ),
            ),
            (MetricType::Gauge, true) => (
                Prom::FloatGauge(Family::default()),
                Otel::FloatGauge(
                    meter
                        .f64_gauge(def.name)
                        .with_description(def.help)
                        .with_unit(unit)
                        .build(),
                ),
            ),
            (MetricType::Histogram, _) => {
                let constructor: fn() -> Histogram = match buckets(&def) {
                    b if std::ptr::eq(b, names::DECISION_BUCKETS) => decision_histogram,
                    b if std::ptr::eq(b, names::CALL_BUCKETS) => call_histogram,
                    b if std::ptr::eq(b, names::WEBHOOK_BUCKETS) => webhook_histogram,
                    _ => provisioning_histogram,
                };
                (
                    Prom::Histogram(Family::new_with_constructor(constructor)),
                    Otel::Histogram(
                        meter
                            .f64_histogram(def.name)
                            .with_description(def.help)
                            .with_unit(unit)
                            .with_boundaries(buckets(&def).to_vec())
                            .build(),
                    ),
                )
            }
        };
        Instrument { def, prom, otel }
    }

    fn labels(&self, values: &[&str]) -> Labels {
        // Every call site passes the values of the keys the catalogue lists, in order; a
        // mismatch is a bug caught by the tests.
        debug_assert_eq!(
            values.len(),
            self.def.labels.len(),
            "{}: label values {values:?} for keys {:?}",
            self.def.name,
            self.def.labels
        );
        self.def
            .labels
            .iter()
            .zip(values)
            .map(|(k, v)| (*k, (*v).to_string()))
            .collect()
    }
}

/// The OpenTelemetry (UCUM) unit for a catalogue unit.
fn otel_unit(unit: &str) -> &'static str {
    match unit {
        "seconds" | "unix seconds" => "s",
        "bytes" => "By",
        "dollars" => "USD",
        "dollars per hour" => "USD/h",
        "cores" => "{core}",
        _ => "1",
    }
}

fn kv(labels: &Labels) -> Vec<KeyValue> {
    labels
        .iter()
        .map(|(k, v)| KeyValue::new(*k, v.clone()))
        .collect()
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// Tailor's metrics. Cheap to clone; clones record into the same registry.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    instruments: Arc<BTreeMap<&'static str, Instrument>>,
}

impl Metrics {
    /// Creates the metrics, registering every family of the catalogue, and recording into
    /// `meter` too.
    pub fn new(meter: &Meter) -> Self {
        let mut registry = Registry::default();
        let mut instruments = BTreeMap::new();
        for def in names::CATALOGUE {
            let i = Instrument::new(*def, meter);
            // Units are in the reference page and the names (`_seconds`, `_dollars`); the
            // exposition's UNIT line is left out because prometheus-client would append the
            // unit to the name again.
            let help = def.help;
            match &i.prom {
                Prom::Counter(f) => registry.register(def.name, help, f.clone()),
                Prom::FloatCounter(f) => registry.register(def.name, help, f.clone()),
                Prom::Gauge(f) => registry.register(def.name, help, f.clone()),
                Prom::FloatGauge(f) => registry.register(def.name, help, f.clone()),
                Prom::Histogram(f) => registry.register(def.name, help, f.clone()),
            }
            instruments.insert(def.name, i);
        }
        let m = Metrics {
            registry: Arc::new(registry),
            instruments: Arc::new(instruments),
        };
        m.set(&names::BUILD_INFO, &[env!("CARGO_PKG_VERSION")], 1.0);
        // Known label sets start at zero (Prometheus' advice for counters), so a dashboard
        // shows 0 errors rather than no data.
        for operation in CloudOperation::ALL {
            for kind in names::CLOUD_ERROR_KINDS {
                m.add(&names::CLOUD_ERRORS, &[operation.as_str(), kind], 0.0);
            }
        }
        for query in PrometheusQuery::ALL {
            for error in QueryError::ALL {
                m.add(
                    &names::PROMETHEUS_QUERY_ERRORS,
                    &[query.as_str(), error.as_str()],
                    0.0,
                );
            }
            // The request rate reads 0 rather than nothing before the first read.
            if let Some(i) = m.instruments.get(names::PROMETHEUS_QUERY_DURATION.name)
                && let Prom::Histogram(f) = &i.prom
            {
                let _ = f.get_or_create(&i.labels(&[query.as_str()]));
            }
        }
        for outcome in WebhookOutcome::ALL {
            m.add(&names::WEBHOOK_REQUESTS, &[outcome.as_str()], 0.0);
        }
        for listener in Listener::ALL {
            for reason in ConnectionShed::ALL {
                m.add(
                    &names::HTTP_CONNECTIONS_SHED,
                    &[listener.as_str(), reason.as_str()],
                    0.0,
                );
            }
        }
        for signal in Signal::ALL {
            for reason in DropReason::ALL {
                let _ = OTLP_DROPPED.get_or_create(&otlp_dropped_labels(*signal, *reason));
            }
        }
        // Unlabelled families have their one series from the start, so a scrape shows 0
        // rather than nothing; a timestamp has no meaningful zero and waits to be set.
        let zero_is_meaningful = |d: &&MetricDef| d.labels.is_empty() && d.unit != "unix seconds";
        for def in names::CATALOGUE.iter().filter(zero_is_meaningful) {
            match def.kind {
                MetricType::Counter => m.add(def, &[], 0.0),
                MetricType::Gauge => m.set(def, &[], 0.0),
                MetricType::Histogram => {}
            }
        }
        m
    }

    fn instrument(&self, def: &MetricDef) -> Option<&Instrument> {
        let i = self.instruments.get(def.name);
        debug_assert!(i.is_some(), "{} is not in the catalogue", def.name);
        i
    }

    /// Adds `by` to a counter.
    fn add(&self, def: &MetricDef, values: &[&str], by: f64) {
        let Some(i) = self.instrument(def) else {
            return;
        };
        let l = i.labels(values);
        match (&i.prom, &i.otel) {
            (Prom::Counter(f), Otel::Counter(o)) => {
                // Counts are whole: `by` is a count passed as f64 by the callers below.
                let n = by.max(0.0) as u64;
                f.get_or_create(&l).inc_by(n);
                o.add(n, &kv(&l));
            }
            (Prom::FloatCounter(f), Otel::FloatCounter(o)) => {
                let by = by.max(0.0);
                f.get_or_create(&l).inc_by(by);
                o.add(by, &kv(&l));
            }
            _ => debug_assert!(false, "{} is not a counter", def.name),
        }
    }

    /// Sets a gauge.
    fn set(&self, def: &MetricDef, values: &[&str], value: f64) {
        let Some(i) = self.instrument(def) else {
            return;
        };
        let l = i.labels(values);
        match (&i.prom, &i.otel) {
            (Prom::Gauge(f), Otel::Gauge(o)) => {
                let n = value.max(0.0) as i64;
                f.get_or_create(&l).set(n);
                o.record(n as u64, &kv(&l));
            }
            (Prom::FloatGauge(f), Otel::FloatGauge(o)) => {
                f.get_or_create(&l).set(value);
                o.record(value, &kv(&l));
            }
            _ => debug_assert!(false, "{} is not a gauge", def.name),
        }
    }

    /// Observes a histogram.
    fn observe(&self, def: &MetricDef, values: &[&str], value: f64) {
        let Some(i) = self.instrument(def) else {
            return;
        };
        let l = i.labels(values);
        match (&i.prom, &i.otel) {
            (Prom::Histogram(f), Otel::Histogram(o)) => {
                f.get_or_create(&l).observe(value);
                o.record(value, &kv(&l));
            }
            _ => debug_assert!(false, "{} is not a histogram", def.name),
        }
    }

    // Provisioning.

    /// Sets the number of pending pods.
    pub fn set_pods_pending(&self, pending: usize) {
        self.set(&names::PODS_PENDING, &[], count(pending) as f64);
    }

    /// Sets the hourly price of the new nodes the last batch planned, with the requests it
    /// was planned with and with every actionable recommendation applied.
    pub fn set_batch_cost(&self, planned: f64, right_sized: f64) {
        use names::PlanRequests;
        self.set(
            &names::PROVISIONING_BATCH_COST,
            &[PlanRequests::Planned.as_str()],
            planned,
        );
        self.set(
            &names::PROVISIONING_BATCH_COST,
            &[PlanRequests::RightSized.as_str()],
            right_sized,
        );
    }

    /// Records a pod's time from pending to its NodeClaim being created.
    pub fn observe_provisioning(&self, nodepool: &str, seconds: f64) {
        self.observe(&names::PROVISIONING_DURATION, &[nodepool], seconds);
    }

    /// Records a NodeClaim's time from the stage before to `stage`.
    pub fn observe_nodeclaim_stage(&self, nodepool: &str, stage: Stage, seconds: f64) {
        self.observe(
            &names::NODECLAIM_STAGE_DURATION,
            &[nodepool, stage.as_str()],
            seconds,
        );
    }

    /// Records a pod's time from pending to bound.
    pub fn observe_pod_startup(&self, nodepool: &str, seconds: f64) {
        self.observe(&names::POD_STARTUP_DURATION, &[nodepool], seconds);
    }

    /// Counts a launched NodeClaim (for pending pods or as a replacement).
    pub fn nodeclaim_launched(
        &self,
        nodepool: &str,
        instance_type: &str,
        capacity_type: &str,
        zone: &str,
    ) {
        self.add(
            &names::NODECLAIMS_LAUNCHED,
            &[nodepool, instance_type, capacity_type, zone],
            1.0,
        );
    }

    /// Counts a deleted NodeClaim. `reason` is the termination-reason annotation or a
    /// [`TerminationReason`] value; anything else is counted as `other`.
    pub fn nodeclaim_terminated(&self, nodepool: &str, reason: &str) {
        let reason = TerminationReason::parse(reason);
        self.add(
            &names::NODECLAIMS_TERMINATED,
            &[nodepool, reason.as_str()],
            1.0,
        );
    }

    /// Counts a cloud call and records how long it took.
    pub fn cloud_request(&self, operation: CloudOperation, seconds: f64) {
        self.add(&names::CLOUD_REQUESTS, &[operation.as_str()], 1.0);
        self.observe(
            &names::CLOUD_REQUEST_DURATION,
            &[operation.as_str()],
            seconds,
        );
    }

    /// Counts a failed cloud call; `kind` is `CloudError::kind`.
    pub fn cloud_error(&self, operation: &str, kind: &str) {
        self.add(&names::CLOUD_ERRORS, &[operation, kind], 1.0);
    }

    /// Sets how many offerings are cached as unavailable.
    pub fn set_unavailable_offerings(&self, count: usize) {
        self.set(&names::UNAVAILABLE_OFFERINGS, &[], count as f64);
    }

    /// Sets the number of instance types offered per capacity type.
    pub fn set_catalog_instance_types(&self, capacity_type: &str, count: usize) {
        self.set(
            &names::CATALOG_INSTANCE_TYPES,
            &[capacity_type],
            count as f64,
        );
    }

    /// Records when the catalog was loaded or refreshed (unix seconds).
    pub fn set_catalog_updated(&self, unix_seconds: i64) {
        self.set(&names::CATALOG_UPDATED, &[], unix_seconds as f64);
    }

    // Cost.

    /// Sets the hourly cost of one group of nodes.
    pub fn set_node_cost(
        &self,
        nodepool: &str,
        instance_type: &str,
        capacity_type: &str,
        zone: &str,
        dollars_per_hour: f64,
    ) {
        self.set(
            &names::NODE_HOURLY_COST,
            &[nodepool, instance_type, capacity_type, zone],
            dollars_per_hour,
        );
    }

    /// Sets the number of nodes of one group.
    pub fn set_nodes(
        &self,
        nodepool: &str,
        instance_type: &str,
        capacity_type: &str,
        zone: &str,
        nodes: usize,
    ) {
        self.set(
            &names::NODES,
            &[nodepool, instance_type, capacity_type, zone],
            nodes as f64,
        );
    }

    /// Sets the hourly cost of what a namespace requests or uses.
    pub fn set_namespace_cost(&self, namespace: &str, usage: Usage, dollars_per_hour: f64) {
        self.set(
            &names::NAMESPACE_HOURLY_COST,
            &[namespace, usage.as_str()],
            dollars_per_hour,
        );
    }

    /// Sets what the current recommendations or decisions would save per hour.
    pub fn set_savings_available(&self, source: SavingsSource, dollars_per_hour: f64) {
        self.set(
            &names::SAVINGS_AVAILABLE,
            &[source.as_str()],
            dollars_per_hour,
        );
    }

    /// Adds dollars saved by a change carried out.
    pub fn savings_realised(&self, source: SavingsSource, dollars: f64) {
        self.add(&names::SAVINGS_REALISED, &[source.as_str()], dollars);
    }

    // Disruption.

    /// Counts a disruption decision taken (`autonomous`) or reported (`recommend`).
    pub fn disruption_decision(&self, method: &str, mode: &str) {
        debug_assert!(names::METHODS.contains(&method), "method {method}");
        debug_assert!(names::MODES.contains(&mode), "mode {mode}");
        self.add(&names::DISRUPTION_DECISIONS, &[method, mode], 1.0);
    }

    /// Sets, from a disruption pass's explanations, how many nodes were left alone by
    /// reason (every reason is set, to zero when absent).
    pub fn set_disruption_blocked<'a>(&self, reasons: impl IntoIterator<Item = &'a str>) {
        let mut counts: BTreeMap<BlockedReason, usize> =
            BlockedReason::ALL.iter().map(|r| (*r, 0)).collect();
        for why in reasons {
            *counts.entry(BlockedReason::classify(why)).or_default() += 1;
        }
        for (reason, n) in counts {
            self.set(&names::DISRUPTION_BLOCKED, &[reason.as_str()], n as f64);
        }
    }

    /// Counts a pod evicted while draining a node.
    pub fn eviction(&self) {
        self.add(&names::EVICTIONS, &[], 1.0);
    }

    /// Records how long a decision took; `decision` is a [`names::Decision`] value.
    pub fn observe_decision(&self, decision: &str, seconds: f64) {
        debug_assert!(
            names::Decision::ALL.iter().any(|d| d.as_str() == decision),
            "decision {decision}"
        );
        self.observe(&names::DECISION_DURATION, &[decision], seconds);
    }

    // Right-sizing.

    /// Sets how many containers a recommendation covers.
    pub fn set_rightsizing_containers(&self, containers: usize) {
        self.set(&names::RIGHTSIZING_CONTAINERS, &[], containers as f64);
    }

    /// Sets how many workload recommendations are in `state`.
    pub fn set_recommendations(&self, state: RecommendationState, workloads: usize) {
        self.set(&names::RECOMMENDATIONS, &[state.as_str()], workloads as f64);
    }

    /// Counts a recommendation applied to a workload of `namespace`.
    pub fn recommendation_applied(&self, namespace: &str) {
        self.recommendation_applied_by(namespace, 1);
    }

    /// Counts `n` recommendations applied in `namespace` (0 starts its series).
    pub fn recommendation_applied_by(&self, namespace: &str, n: u64) {
        self.add(&names::RECOMMENDATIONS_APPLIED, &[namespace], n as f64);
    }

    /// Counts a pod evicted because it could not be resized in place.
    pub fn rightsizing_eviction(&self, why: StuckResize) {
        self.add(&names::RIGHTSIZING_EVICTIONS, &[why.as_str()], 1.0);
    }

    /// Sets how many pods wait to be evicted, by what holds them (every reason is set, so
    /// a cleared one reads 0).
    pub fn set_rightsizing_evictions_waiting(&self, waiting: &BTreeMap<EvictionWait, usize>) {
        for reason in EvictionWait::ALL {
            let n = waiting.get(reason).copied().unwrap_or(0);
            self.set(
                &names::RIGHTSIZING_EVICTIONS_WAITING,
                &[reason.as_str()],
                n as f64,
            );
        }
    }

    /// Sets a namespace's requests before right-sizing or now.
    pub fn set_namespace_requests(&self, namespace: &str, when: When, cores: f64, bytes: f64) {
        self.set(
            &names::NAMESPACE_CPU_REQUESTS,
            &[namespace, when.as_str()],
            cores,
        );
        self.set(
            &names::NAMESPACE_MEMORY_REQUESTS,
            &[namespace, when.as_str()],
            bytes,
        );
    }

    /// Counts OOM kills of containers in `namespace`.
    pub fn oom_kills(&self, namespace: &str, kills: u64) {
        self.add(&names::OOM_KILLS, &[namespace], kills as f64);
    }

    /// Records how long one request to Prometheus took.
    pub fn observe_prometheus_query(&self, query: PrometheusQuery, seconds: f64) {
        self.observe(
            &names::PROMETHEUS_QUERY_DURATION,
            &[query.as_str()],
            seconds,
        );
    }

    /// Counts a request to Prometheus that failed.
    pub fn prometheus_query_failed(&self, query: PrometheusQuery, error: QueryError) {
        self.add(
            &names::PROMETHEUS_QUERY_ERRORS,
            &[query.as_str(), error.as_str()],
            1.0,
        );
    }

    /// Sets the age of the newest usage sample.
    pub fn set_usage_data_age(&self, seconds: f64) {
        self.set(&names::USAGE_DATA_AGE, &[], seconds.max(0.0));
    }

    /// Counts one right-sizing read: its queries and samples.
    pub fn usage_read(&self, queries: usize, samples: u64) {
        self.add(&names::USAGE_QUERIES, &[], queries as f64);
        self.add(&names::USAGE_SAMPLES_READ, &[], samples as f64);
    }

    /// Counts a right-sizing read that failed.
    pub fn usage_read_failed(&self) {
        self.add(&names::USAGE_READ_FAILURES, &[], 1.0);
    }

    /// Records one admission review the webhook answered: how long it took and what it did.
    pub fn webhook_request(&self, outcome: WebhookOutcome, seconds: f64) {
        self.observe(&names::WEBHOOK_DURATION, &[], seconds);
        self.add(&names::WEBHOOK_REQUESTS, &[outcome.as_str()], 1.0);
    }

    // The agent.

    /// Sets how many connections `listener` holds open.
    pub fn set_connections(&self, listener: Listener, open: usize) {
        self.set(&names::HTTP_CONNECTIONS, &[listener.as_str()], open as f64);
    }

    /// Counts a connection `listener` closed before it was done with, and why.
    pub fn connection_shed(&self, listener: Listener, reason: ConnectionShed) {
        self.add(
            &names::HTTP_CONNECTIONS_SHED,
            &[listener.as_str(), reason.as_str()],
            1.0,
        );
    }

    /// Records whether this replica leads.
    pub fn set_leader(&self, leader: bool) {
        self.set(&names::LEADER, &[], f64::from(u8::from(leader)));
    }

    /// Records one reconcile of `controller`, and whether it failed.
    pub fn reconcile(&self, controller: Controller, seconds: f64, failed: bool) {
        self.observe(&names::RECONCILE_DURATION, &[controller.as_str()], seconds);
        self.add(
            &names::RECONCILE_ERRORS,
            &[controller.as_str()],
            if failed { 1.0 } else { 0.0 },
        );
    }

    /// Sets the number of objects of one kind in the stores.
    pub fn set_snapshot_objects(&self, kind: &str, count: usize) {
        self.set(&names::SNAPSHOT_OBJECTS, &[kind], count as f64);
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an error here would be a bug in the encoder.
        if encode(&mut out, &self.registry).is_err() {
            tracing::error!("encoding metrics failed");
        }
        out
    }
}

/// The reference page `docs/metrics.md`, generated from the catalogue.
pub fn reference_page() -> String {
    use std::fmt::Write as _;
    let mut out = String::from(
        "# Tailor metrics\n\n\
         <!-- Generated from src/telemetry/names.rs by `tailor metrics-reference`; a test fails when this page is stale. -->\n\n\
         Served in Prometheus text format at `/metrics` and pushed by OTLP when an endpoint is \
         configured. Counters are exposed with a `_total` suffix; histograms as `_bucket`, `_sum` \
         and `_count`. Every label takes values from a bounded set: the ones Tailor fixes are \
         listed; `nodepool`, `namespace`, `instance_type`, `zone` and `kind` (of objects) come \
         from the cluster's objects and the catalog. No label carries a pod name.\n",
    );
    let mut areas: Vec<_> = names::CATALOGUE.iter().map(|d| d.area).collect();
    areas.dedup();
    for area in areas {
        let _ = write!(
            out,
            "\n## {}\n\n| metric | type | unit | labels | meaning |\n|---|---|---|---|---|\n",
            area.title()
        );
        for def in names::CATALOGUE.iter().filter(|d| d.area == area) {
            let exposed = def.series_names().join("`, `");
            let labels = if def.labels.is_empty() {
                "-".to_string()
            } else {
                def.labels
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let _ = writeln!(
                out,
                "| `{exposed}` | {} | {} | {labels} | {}. |",
                def.kind.as_str(),
                def.unit,
                def.help
            );
        }
    }
    out.push_str("\n## Label values\n\n| label | metric | values |\n|---|---|---|\n");
    for def in names::CATALOGUE {
        for key in def.labels {
            if let Some(values) = names::label_values(key, def.name) {
                let _ = writeln!(
                    out,
                    "| `{key}` | `{}` | {} |",
                    def.name,
                    values
                        .iter()
                        .map(|v| format!("`{v}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics() -> Metrics {
        Metrics::new(&opentelemetry::global::meter("tailor-test"))
    }

    #[test]
    fn recorded_values_appear_in_the_exposition_under_their_names() {
        let m = metrics();
        m.nodeclaim_launched("default", "Standard_D4s_v5", "spot", "eastus-1");
        m.observe_provisioning("default", 42.0);
        m.cloud_error("create", "insufficient_capacity");
        m.set_node_cost("default", "Standard_D4s_v5", "spot", "eastus-1", 0.0768);
        let text = m.render();
        assert!(text.contains(
            "tailor_nodeclaims_launched_total{nodepool=\"default\",instance_type=\"Standard_D4s_v5\",capacity_type=\"spot\",zone=\"eastus-1\"} 1"
        ), "{text}");
        assert!(
            text.contains(
                "tailor_provisioning_duration_seconds_bucket{le=\"45.0\",nodepool=\"default\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains(
            "tailor_cloud_errors_total{operation=\"create\",kind=\"insufficient_capacity\"} 1"
        ));
        assert!(text.contains("tailor_node_hourly_cost_dollars{nodepool=\"default\",instance_type=\"Standard_D4s_v5\",capacity_type=\"spot\",zone=\"eastus-1\"} 0.0768"));
        assert!(text.contains("tailor_build_info{version="));
        assert!(text.contains("tailor_leader 0\n"), "counts are integers");
        assert!(text.trim_end().ends_with("# EOF"));
    }

    #[test]
    fn every_family_served_is_in_the_catalogue_and_the_reverse() {
        let m = metrics();
        // A family shows in the exposition once it has a series: give each one.
        for def in names::CATALOGUE {
            let values = vec!["x"; def.labels.len()];
            match def.kind {
                MetricType::Counter => m.add(def, &values, 1.0),
                MetricType::Gauge => m.set(def, &values, 1.0),
                MetricType::Histogram => m.observe(def, &values, 1.0),
            }
        }
        let text = m.render();
        let served: std::collections::BTreeSet<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        let catalogue: std::collections::BTreeSet<&str> =
            names::CATALOGUE.iter().map(|d| d.name).collect();
        assert_eq!(served, catalogue);
        assert_eq!(
            catalogue.len(),
            names::CATALOGUE.len(),
            "no name is listed twice"
        );
        for def in names::CATALOGUE {
            assert!(def.name.starts_with("tailor_"), "{}", def.name);
            assert!(
                !def.name.ends_with("_total"),
                "{}: counters are named without _total",
                def.name
            );
            assert!(
                !def.help.ends_with('.'),
                "{}: the page adds the full stop",
                def.name
            );
            if def.kind == MetricType::Histogram || def.unit == "seconds" {
                assert!(
                    def.name.ends_with("_seconds"),
                    "{}: a unit suffix",
                    def.name
                );
            }
        }
    }

    #[test]
    fn a_termination_reason_written_by_hand_is_counted_as_other() {
        let m = metrics();
        m.nodeclaim_terminated("default", "because I said so");
        m.nodeclaim_terminated("default", "drift");
        let text = m.render();
        assert!(
            text.contains(
                "tailor_nodeclaims_terminated_total{nodepool=\"default\",reason=\"other\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "tailor_nodeclaims_terminated_total{nodepool=\"default\",reason=\"drift\"} 1"
            ),
            "{text}"
        );
    }

    #[test]
    fn blocked_explanations_fall_into_bounded_reasons() {
        let cases = [
            (
                "PodDisruptionBudget shop/web allows no eviction of pod shop/web-1",
                "pdb",
            ),
            (
                "pod shop/web-1 is annotated do-not-disrupt",
                "do_not_disrupt",
            ),
            ("node is annotated do-not-disrupt", "do_not_disrupt"),
            ("disruption budget of NodePool default is used up", "budget"),
            (
                "pods changed 30s ago, consolidateAfter is 600s",
                "consolidate_after",
            ),
            ("consolidateAfter is Never", "policy"),
            (
                "consolidationPolicy is WhenEmpty and the node has pods",
                "policy",
            ),
            ("no price for Standard_D4s_v5 spot in eastus-1", "no_price"),
            ("not owned by a NodePool", "unmanaged"),
            ("launched by this pass", "in_flight"),
            (
                "NodePool default's pods are expected to fall 30% within 2h: its workloads' scale-down frees nodes without evictions",
                "scale_down",
            ),
            (
                "saving $0.0010/hour is below the threshold $0.0100/hour",
                "no_cheaper_replacement",
            ),
            ("something new", "other"),
        ];
        for (why, want) in cases {
            assert_eq!(BlockedReason::classify(why).as_str(), want, "{why}");
        }
        let m = metrics();
        m.set_disruption_blocked(["consolidateAfter is Never", "consolidateAfter is Never"]);
        let text = m.render();
        assert!(
            text.contains("tailor_disruption_blocked_nodes{reason=\"policy\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("tailor_disruption_blocked_nodes{reason=\"pdb\"} 0"),
            "{text}"
        );
    }

    #[test]
    fn the_reference_page_names_every_metric_with_its_type_unit_and_labels() {
        let page = reference_page();
        for def in names::CATALOGUE {
            let row = page
                .lines()
                .find(|l| l.starts_with(&format!("| `{}", def.series_names()[0])))
                .unwrap_or_else(|| panic!("{} has no row", def.name));
            assert!(
                row.contains(def.kind.as_str()) && row.contains(def.unit),
                "{row}"
            );
            for k in def.labels {
                assert!(row.contains(&format!("`{k}`")), "{row}");
            }
        }
    }
}
