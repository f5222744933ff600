//! The metrics facade: every measurement goes through one method here, which records it
//! both in the Prometheus registry behind `/metrics` and in OpenTelemetry instruments
//! (exported by OTLP when configured, no-ops otherwise).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

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

use super::names::{self, label};

type Labels = Vec<(&'static str, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

fn provisioning_histogram() -> Histogram {
    Histogram::new(names::PROVISIONING_BUCKETS.iter().copied())
}

fn decision_histogram() -> Histogram {
    Histogram::new(names::DECISION_BUCKETS.iter().copied())
}

struct Otel {
    provisioning: OtelHistogram<f64>,
    launched: OtelCounter<u64>,
    terminated: OtelCounter<u64>,
    cloud_errors: OtelCounter<u64>,
    node_cost: OtelGauge<f64>,
    decision: OtelHistogram<f64>,
    snapshot_objects: OtelGauge<u64>,
    catalog_types: OtelGauge<u64>,
    evictions: OtelCounter<u64>,
    leader: OtelGauge<u64>,
    disruption_decisions: OtelCounter<u64>,
    unavailable_offerings: OtelGauge<u64>,
}

impl Otel {
    fn new(meter: &Meter) -> Self {
        Otel {
            provisioning: meter
                .f64_histogram(names::PROVISIONING_DURATION)
                .with_unit("s")
                .with_boundaries(names::PROVISIONING_BUCKETS.to_vec())
                .build(),
            launched: meter.u64_counter(names::NODECLAIMS_LAUNCHED).build(),
            terminated: meter.u64_counter(names::NODECLAIMS_TERMINATED).build(),
            cloud_errors: meter.u64_counter(names::CLOUD_ERRORS).build(),
            node_cost: meter
                .f64_gauge(names::NODE_HOURLY_COST)
                .with_unit("USD/h")
                .build(),
            decision: meter
                .f64_histogram(names::DECISION_DURATION)
                .with_unit("s")
                .with_boundaries(names::DECISION_BUCKETS.to_vec())
                .build(),
            snapshot_objects: meter.u64_gauge(names::SNAPSHOT_OBJECTS).build(),
            catalog_types: meter.u64_gauge(names::CATALOG_INSTANCE_TYPES).build(),
            evictions: meter.u64_counter(names::EVICTIONS).build(),
            leader: meter.u64_gauge(names::LEADER).build(),
            disruption_decisions: meter.u64_counter(names::DISRUPTION_DECISIONS).build(),
            unavailable_offerings: meter.u64_gauge(names::UNAVAILABLE_OFFERINGS).build(),
        }
    }
}

fn kv(labels: &Labels) -> Vec<KeyValue> {
    labels
        .iter()
        .map(|(k, v)| KeyValue::new(*k, v.clone()))
        .collect()
}

/// Tailor's metrics. Cheap to clone; clones record into the same registry.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    provisioning: Family<Labels, Histogram, fn() -> Histogram>,
    launched: Family<Labels, Counter>,
    terminated: Family<Labels, Counter>,
    cloud_errors: Family<Labels, Counter>,
    node_cost: Family<Labels, FloatGauge>,
    decision: Family<Labels, Histogram, fn() -> Histogram>,
    snapshot_objects: Family<Labels, Gauge>,
    catalog_types: Family<Labels, Gauge>,
    evictions: Counter,
    leader: Gauge,
    disruption_decisions: Family<Labels, Counter>,
    unavailable_offerings: Gauge,
    otel: Arc<Otel>,
}

impl Metrics {
    /// Creates the metrics, registering every family, and recording into `meter` too.
    pub fn new(meter: &Meter) -> Self {
        let mut registry = Registry::default();
        let build_info: Family<Labels, Gauge> = Family::default();
        build_info
            .get_or_create(&vec![(
                label::VERSION,
                env!("CARGO_PKG_VERSION").to_string(),
            )])
            .set(1);
        registry.register(names::BUILD_INFO, "Tailor build information", build_info);
        let m = Metrics {
            registry: Arc::new(Registry::default()),
            provisioning: Family::new_with_constructor(provisioning_histogram),
            launched: Family::default(),
            terminated: Family::default(),
            cloud_errors: Family::default(),
            node_cost: Family::default(),
            decision: Family::new_with_constructor(decision_histogram),
            snapshot_objects: Family::default(),
            catalog_types: Family::default(),
            evictions: Counter::default(),
            leader: Gauge::default(),
            disruption_decisions: Family::default(),
            unavailable_offerings: Gauge::default(),
            otel: Arc::new(Otel::new(meter)),
        };
        registry.register(
            names::PROVISIONING_DURATION,
            "Seconds from a pod becoming pending to its NodeClaim being launched",
            m.provisioning.clone(),
        );
        registry.register(
            names::NODECLAIMS_LAUNCHED,
            "NodeClaims launched",
            m.launched.clone(),
        );
        registry.register(
            names::NODECLAIMS_TERMINATED,
            "NodeClaims deleted, by reason",
            m.terminated.clone(),
        );
        registry.register(
            names::CLOUD_ERRORS,
            "Failed cloud calls, by operation and error kind",
            m.cloud_errors.clone(),
        );
        registry.register(
            names::NODE_HOURLY_COST,
            "USD per hour of the nodes Tailor manages",
            m.node_cost.clone(),
        );
        registry.register(
            names::DECISION_DURATION,
            "Seconds a decision (scheduling, consolidation, right-sizing) took",
            m.decision.clone(),
        );
        registry.register(
            names::SNAPSHOT_OBJECTS,
            "Objects in the last cluster snapshot",
            m.snapshot_objects.clone(),
        );
        registry.register(
            names::CATALOG_INSTANCE_TYPES,
            "Instance types the catalog offers",
            m.catalog_types.clone(),
        );
        registry.register(
            names::EVICTIONS,
            "Pods evicted through the Eviction API while draining nodes",
            m.evictions.clone(),
        );
        registry.register(
            names::LEADER,
            "1 while this replica holds the leader lease, else 0",
            m.leader.clone(),
        );
        registry.register(
            names::DISRUPTION_DECISIONS,
            "Disruption decisions, by method and mode (recommend: reported only)",
            m.disruption_decisions.clone(),
        );
        registry.register(
            names::UNAVAILABLE_OFFERINGS,
            "Offerings (size, zone, capacity type) cached as unavailable after a capacity error",
            m.unavailable_offerings.clone(),
        );
        Metrics {
            registry: Arc::new(registry),
            ..m
        }
    }

    /// Records a pod's time from pending to launched.
    pub fn observe_provisioning(&self, nodepool: &str, seconds: f64) {
        let l: Labels = vec![(label::NODEPOOL, nodepool.to_string())];
        self.provisioning.get_or_create(&l).observe(seconds);
        self.otel.provisioning.record(seconds, &kv(&l));
    }

    /// Counts a launched NodeClaim.
    pub fn nodeclaim_launched(
        &self,
        nodepool: &str,
        instance_type: &str,
        capacity_type: &str,
        zone: &str,
    ) {
        let l: Labels = vec![
            (label::NODEPOOL, nodepool.to_string()),
            (label::INSTANCE_TYPE, instance_type.to_string()),
            (label::CAPACITY_TYPE, capacity_type.to_string()),
            (label::ZONE, zone.to_string()),
        ];
        self.launched.get_or_create(&l).inc();
        self.otel.launched.add(1, &kv(&l));
    }

    /// Counts a deleted NodeClaim.
    pub fn nodeclaim_terminated(&self, nodepool: &str, reason: &str) {
        let l: Labels = vec![
            (label::NODEPOOL, nodepool.to_string()),
            (label::REASON, reason.to_string()),
        ];
        self.terminated.get_or_create(&l).inc();
        self.otel.terminated.add(1, &kv(&l));
    }

    /// Counts a failed cloud call.
    pub fn cloud_error(&self, operation: &str, kind: &str) {
        let l: Labels = vec![
            (label::OPERATION, operation.to_string()),
            (label::ERROR_KIND, kind.to_string()),
        ];
        self.cloud_errors.get_or_create(&l).inc();
        self.otel.cloud_errors.add(1, &kv(&l));
    }

    /// Sets the hourly cost of one group of nodes.
    pub fn set_node_cost(
        &self,
        nodepool: &str,
        instance_type: &str,
        capacity_type: &str,
        dollars_per_hour: f64,
    ) {
        let l: Labels = vec![
            (label::NODEPOOL, nodepool.to_string()),
            (label::INSTANCE_TYPE, instance_type.to_string()),
            (label::CAPACITY_TYPE, capacity_type.to_string()),
        ];
        self.node_cost.get_or_create(&l).set(dollars_per_hour);
        self.otel.node_cost.record(dollars_per_hour, &kv(&l));
    }

    /// Records how long a decision took.
    pub fn observe_decision(&self, decision: &str, seconds: f64) {
        let l: Labels = vec![(label::DECISION, decision.to_string())];
        self.decision.get_or_create(&l).observe(seconds);
        self.otel.decision.record(seconds, &kv(&l));
    }

    /// Sets the number of objects of one kind in the last snapshot.
    pub fn set_snapshot_objects(&self, kind: &str, count: usize) {
        let l: Labels = vec![(label::KIND, kind.to_string())];
        let n = i64::try_from(count).unwrap_or(i64::MAX);
        self.snapshot_objects.get_or_create(&l).set(n);
        self.otel.snapshot_objects.record(count as u64, &kv(&l));
    }

    /// Sets the number of instance types offered per capacity type.
    pub fn set_catalog_instance_types(&self, capacity_type: &str, count: usize) {
        let l: Labels = vec![(label::CAPACITY_TYPE, capacity_type.to_string())];
        let n = i64::try_from(count).unwrap_or(i64::MAX);
        self.catalog_types.get_or_create(&l).set(n);
        self.otel.catalog_types.record(count as u64, &kv(&l));
    }

    /// Counts a pod evicted while draining a node.
    pub fn eviction(&self) {
        self.evictions.inc();
        self.otel.evictions.add(1, &[]);
    }

    /// Counts a disruption decision taken (autonomous) or reported (recommend).
    pub fn disruption_decision(&self, method: &str, mode: &str) {
        let l: Labels = vec![
            (label::METHOD, method.to_string()),
            (label::MODE, mode.to_string()),
        ];
        self.disruption_decisions.get_or_create(&l).inc();
        self.otel.disruption_decisions.add(1, &kv(&l));
    }

    /// Sets how many offerings are cached as unavailable.
    pub fn set_unavailable_offerings(&self, count: usize) {
        self.unavailable_offerings
            .set(i64::try_from(count).unwrap_or(i64::MAX));
        self.otel.unavailable_offerings.record(count as u64, &[]);
    }

    /// Records whether this replica leads.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
        self.otel.leader.record(u64::from(leader), &[]);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_values_appear_in_the_exposition_under_their_names() {
        let meter = opentelemetry::global::meter("tailor-test");
        let m = Metrics::new(&meter);
        m.nodeclaim_launched("default", "Standard_D4s_v5", "spot", "eastus-1");
        m.observe_provisioning("default", 42.0);
        m.cloud_error("create", "insufficient_capacity");
        m.set_node_cost("default", "Standard_D4s_v5", "spot", 0.0768);
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
        assert!(text.contains("tailor_node_hourly_cost_dollars{nodepool=\"default\",instance_type=\"Standard_D4s_v5\",capacity_type=\"spot\"} 0.0768"));
        assert!(text.contains("tailor_build_info{version="));
        assert!(text.trim_end().ends_with("# EOF"));
    }
}
