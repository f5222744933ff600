//! OTLP export that never holds the agent back.
//!
//! Nothing on the agent's own threads waits for a collector:
//!
//! - metrics are aggregated in memory (bounded by the catalogue's label sets) and pushed by
//!   the SDK's periodic reader from its own thread; an export that fails or outlives the
//!   exporter's timeout (`OTEL_EXPORTER_OTLP_TIMEOUT`, 10 s by default) is given up, and the
//!   next interval sends the cumulative values again, so nothing piles up;
//! - ended spans wait in a bounded queue ([`BoundedSpanProcessor`]) that the SDK's batch
//!   processor drains from its own thread; when the collector falls behind and the queue
//!   is full, a span is dropped at once rather than waited for.
//!
//! Every data point of a failed metrics export, every span of a failed export and every
//! span refused by a full queue is counted in `tailor_otlp_dropped_total`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::Temporality;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Span, SpanData, SpanExporter, SpanProcessor,
};

use super::metrics::record_otlp_dropped;
use super::names::{DropReason, Signal};

/// Spans that may wait for export at once, as the SDK's default (`OTEL_BSP_MAX_QUEUE_SIZE`).
pub const DEFAULT_SPAN_QUEUE: usize = 2048;

/// A metric exporter that counts the data points of every failed export as dropped.
#[derive(Debug)]
pub struct CountingMetricExporter<E> {
    inner: E,
}

impl<E> CountingMetricExporter<E> {
    /// Wraps `inner`.
    pub fn new(inner: E) -> Self {
        CountingMetricExporter { inner }
    }
}

impl<E: PushMetricExporter> PushMetricExporter for CountingMetricExporter<E> {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        let result = self.inner.export(metrics).await;
        if result.is_err() {
            record_otlp_dropped(
                Signal::Metrics,
                DropReason::ExportFailed,
                data_points(metrics),
            );
        }
        result
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

/// The data points of an export: one per label set of each metric.
fn data_points(metrics: &ResourceMetrics) -> u64 {
    fn count<T>(data: &MetricData<T>) -> usize {
        match data {
            MetricData::Gauge(g) => g.data_points().count(),
            MetricData::Sum(s) => s.data_points().count(),
            MetricData::Histogram(h) => h.data_points().count(),
            MetricData::ExponentialHistogram(h) => h.data_points().count(),
        }
    }
    let n: usize = metrics
        .scope_metrics()
        .flat_map(|s| s.metrics())
        .map(|m| match m.data() {
            AggregatedMetrics::F64(d) => count(d),
            AggregatedMetrics::U64(d) => count(d),
            AggregatedMetrics::I64(d) => count(d),
        })
        .sum();
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// Spans ended and not yet through an export.
#[derive(Debug, Default)]
struct Pending(AtomicUsize);

impl Pending {
    /// Takes a place if fewer than `capacity` are taken.
    fn reserve(&self, capacity: usize) -> bool {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < capacity).then_some(n + 1)
            })
            .is_ok()
    }

    fn release(&self, n: usize) {
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                Some(p.saturating_sub(n))
            });
    }
}

/// The SDK's batch span processor behind a bounded queue whose drops are counted: a span
/// ended while `capacity` spans wait for export is dropped, without waiting.
#[derive(Debug)]
pub struct BoundedSpanProcessor {
    inner: BatchSpanProcessor,
    pending: Arc<Pending>,
    capacity: usize,
}

impl BoundedSpanProcessor {
    /// A batch processor exporting to `exporter`, holding at most `capacity` spans.
    pub fn new<E: SpanExporter + 'static>(exporter: E, capacity: usize) -> Self {
        let capacity = capacity.max(1);
        let pending = Arc::new(Pending::default());
        let exporter = CountingSpanExporter {
            inner: exporter,
            pending: pending.clone(),
        };
        // The SDK's own queue is as large as ours, so it never drops uncounted.
        let config = BatchConfigBuilder::default()
            .with_max_queue_size(capacity)
            .build();
        let inner = BatchSpanProcessor::builder(exporter)
            .with_batch_config(config)
            .build();
        BoundedSpanProcessor {
            inner,
            pending,
            capacity,
        }
    }
}

impl SpanProcessor for BoundedSpanProcessor {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.pending.reserve(self.capacity) {
            self.inner.on_end(span);
        } else {
            record_otlp_dropped(Signal::Traces, DropReason::QueueFull, 1);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// Releases the queue places of exported spans and counts those of failed exports.
#[derive(Debug)]
struct CountingSpanExporter<E> {
    inner: E,
    pending: Arc<Pending>,
}

impl<E: SpanExporter> SpanExporter for CountingSpanExporter<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        let result = self.inner.export(batch).await;
        self.pending.release(n);
        if result.is_err() {
            record_otlp_dropped(
                Signal::Traces,
                DropReason::ExportFailed,
                u64::try_from(n).unwrap_or(u64::MAX),
            );
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::Pending;

    #[test]
    fn the_queue_refuses_past_its_capacity_and_takes_again_after_an_export() {
        let p = Pending::default();
        assert!(p.reserve(2));
        assert!(p.reserve(2));
        assert!(!p.reserve(2), "full");
        p.release(1);
        assert!(p.reserve(2));
        p.release(10);
        assert!(p.reserve(1), "a release never goes below zero");
    }
}
