//! A metering decorator around any [`CloudProvider`]: every call is counted and timed by
//! operation, and every failure counted by its error kind, in one place, so no controller
//! spells cloud metrics itself and a new provider is metered without a line of its own.

use std::future::Future;
use std::time::Instant;

use super::{CloudProvider, DriftReason, Instance, Interruption, LaunchRequest, Result};
use crate::model::InstanceType;
use crate::telemetry::Metrics;
use crate::telemetry::names::CloudOperation;

/// `inner`, with its calls recorded in `metrics` (when there are metrics).
#[derive(Clone)]
pub struct MeteredCloud<C> {
    inner: C,
    metrics: Option<Metrics>,
}

impl<C> MeteredCloud<C> {
    /// Wraps `inner`; without `metrics` the wrapper only forwards.
    pub fn new(inner: C, metrics: Option<Metrics>) -> Self {
        MeteredCloud { inner, metrics }
    }

    /// The wrapped provider.
    pub fn inner(&self) -> &C {
        &self.inner
    }

    async fn record<T>(
        &self,
        operation: CloudOperation,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let started = Instant::now();
        let result = call.await;
        if let Some(m) = &self.metrics {
            m.cloud_request(operation, started.elapsed().as_secs_f64());
            if let Err(e) = &result {
                m.cloud_error(operation.as_str(), e.kind());
            }
        }
        result
    }
}

impl<C: CloudProvider> CloudProvider for MeteredCloud<C> {
    fn create(&self, request: &LaunchRequest) -> impl Future<Output = Result<Instance>> + Send {
        self.record(CloudOperation::Create, self.inner.create(request))
    }

    fn delete(&self, provider_id: &str) -> impl Future<Output = Result<()>> + Send {
        self.record(CloudOperation::Delete, self.inner.delete(provider_id))
    }

    fn get(&self, provider_id: &str) -> impl Future<Output = Result<Instance>> + Send {
        self.record(CloudOperation::Get, self.inner.get(provider_id))
    }

    fn list(&self) -> impl Future<Output = Result<Vec<Instance>>> + Send {
        self.record(CloudOperation::List, self.inner.list())
    }

    fn instance_types(&self) -> impl Future<Output = Result<Vec<InstanceType>>> + Send {
        self.record(CloudOperation::InstanceTypes, self.inner.instance_types())
    }

    // Counted as the instance-types read it stands for.
    fn unavailable_offerings(&self) -> impl Future<Output = Result<super::UnavailableSet>> + Send {
        self.record(
            CloudOperation::InstanceTypes,
            self.inner.unavailable_offerings(),
        )
    }

    fn is_drifted(
        &self,
        instance: &Instance,
    ) -> impl Future<Output = Result<Option<DriftReason>>> + Send {
        self.record(CloudOperation::IsDrifted, self.inner.is_drifted(instance))
    }

    fn interruptions(&self) -> impl Future<Output = Result<Vec<Interruption>>> + Send {
        self.record(CloudOperation::Interruptions, self.inner.interruptions())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use jiff::Timestamp;

    use super::*;
    use crate::clock::VirtualClock;
    use crate::cloud::sim::{SimSettings, SimulatedAzure};

    #[tokio::test]
    async fn calls_are_counted_and_timed_and_failures_counted_by_kind() {
        let clock = VirtualClock::new(Timestamp::UNIX_EPOCH);
        let sim = SimulatedAzure::new(Arc::new(clock), Vec::new(), SimSettings::default());
        let metrics = Metrics::new(&opentelemetry::global::meter("tailor-test"));
        let cloud = MeteredCloud::new(sim, Some(metrics.clone()));
        cloud.list().await.expect("listing an empty cloud works");
        let missing = cloud.get("azure:///nothing").await;
        assert!(missing.is_err());
        let text = metrics.render();
        assert!(
            text.contains("tailor_cloud_requests_total{operation=\"list\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("tailor_cloud_requests_total{operation=\"get\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("tailor_cloud_errors_total{operation=\"get\",kind=\"not_found\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("tailor_cloud_request_duration_seconds_count{operation=\"list\"} 1"),
            "{text}"
        );
        // A successful call counts no error (the series start at zero).
        assert!(
            text.lines()
                .filter(|l| l.starts_with("tailor_cloud_errors_total{operation=\"list\""))
                .all(|l| l.ends_with(" 0")),
            "{text}"
        );
    }
}
