//! Observability: metric names and the metrics facade, OpenTelemetry export over OTLP,
//! and tracing with `RUST_LOG` filtering.
//!
//! OTLP export is on when an endpoint is configured (the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT`, chart value `settings.otlpEndpoint`; the exporter also
//! honours the other standard
//! `OTEL_EXPORTER_OTLP_*` variables such as headers and timeout). Without one, metrics are
//! still served in Prometheus text format at `/metrics`. Export never holds the agent back:
//! see [`export`].

pub mod export;
pub mod metrics;
pub mod names;

use std::time::Duration;

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

pub use metrics::Metrics;

/// Why telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// An OTLP exporter could not be built (bad endpoint, TLS setup).
    #[error("building the OTLP {signal} exporter for {endpoint}: {source}")]
    Exporter {
        /// `metrics` or `traces`.
        signal: &'static str,
        /// The configured endpoint.
        endpoint: String,
        /// The exporter's error.
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
    /// `RUST_LOG` (or `--log`) is not a valid filter.
    #[error("invalid log filter {filter:?}: {source}")]
    Filter {
        /// The filter as given.
        filter: String,
        /// The parse error.
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    /// A global subscriber was already installed.
    #[error("tracing was already initialised")]
    AlreadyInitialised,
}

/// Telemetry settings, parsed once from flags and their environment twins.
#[derive(Debug, Clone, Default)]
pub struct TelemetrySettings {
    /// OTLP/HTTP base endpoint (`http://collector:4318`); `None` disables OTLP export.
    pub otlp_endpoint: Option<String>,
    /// How often metrics are pushed; `None` means every 30 s.
    pub otlp_interval: Option<Duration>,
    /// Most ended spans waiting for export; `None` means [`export::DEFAULT_SPAN_QUEUE`].
    pub span_queue: Option<usize>,
    /// Log filter in `RUST_LOG` syntax; `None` means `info`.
    pub log_filter: Option<String>,
    /// Emit JSON log lines instead of human-readable ones.
    pub json_logs: bool,
}

/// Keeps the OpenTelemetry providers alive; [`Telemetry::shutdown`] flushes them.
pub struct Telemetry {
    /// The metrics facade.
    pub metrics: Metrics,
    meter_provider: Option<SdkMeterProvider>,
    tracer_provider: Option<SdkTracerProvider>,
}

/// An error and its causes, one line, each cause once (for logs and error messages: an
/// outer message alone often says only "client error").
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

fn resource() -> Resource {
    Resource::builder()
        .with_service_name("tailor")
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build()
}

fn signal_url(base: &str, path: &str) -> String {
    format!("{}/{path}", base.trim_end_matches('/'))
}

/// Builds the OTLP meter provider for `endpoint` (the base URL; `/v1/metrics` is appended).
pub fn otlp_meter_provider(
    endpoint: &str,
    interval: Duration,
) -> Result<SdkMeterProvider, TelemetryError> {
    let exporter = opentelemetry_otlp::MetricExporter::builder()
        .with_http()
        .with_endpoint(signal_url(endpoint, "v1/metrics"))
        .build()
        .map_err(|source| TelemetryError::Exporter {
            signal: "metrics",
            endpoint: endpoint.to_string(),
            source,
        })?;
    let reader = PeriodicReader::builder(export::CountingMetricExporter::new(exporter))
        .with_interval(interval)
        .build();
    Ok(SdkMeterProvider::builder()
        .with_resource(resource())
        .with_reader(reader)
        .build())
}

/// Builds the OTLP tracer provider for `endpoint` (the base URL; `/v1/traces` is
/// appended), holding at most `queue` ended spans for export.
pub fn otlp_tracer_provider(
    endpoint: &str,
    queue: usize,
) -> Result<SdkTracerProvider, TelemetryError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(signal_url(endpoint, "v1/traces"))
        .build()
        .map_err(|source| TelemetryError::Exporter {
            signal: "traces",
            endpoint: endpoint.to_string(),
            source,
        })?;
    Ok(SdkTracerProvider::builder()
        .with_resource(resource())
        .with_span_processor(export::BoundedSpanProcessor::new(exporter, queue))
        .build())
}

/// Installs the ring TLS provider for every HTTP client in the process (reqwest, the
/// Kubernetes client, the OTLP exporter). Safe to call more than once.
pub fn install_tls_provider() {
    // Err only means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl Telemetry {
    /// Sets up logging, tracing and metrics for the process. Call once, early.
    pub fn init(settings: &TelemetrySettings) -> Result<Self, TelemetryError> {
        install_tls_provider();
        let filter_text = settings
            .log_filter
            .clone()
            .unwrap_or_else(|| "info".to_string());
        let filter = EnvFilter::try_new(&filter_text).map_err(|source| TelemetryError::Filter {
            filter: filter_text.clone(),
            source,
        })?;
        let fmt_layer = if settings.json_logs {
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .json()
                .boxed()
        } else {
            // Colour only for a person at a terminal: escape codes in a log file or a CI
            // capture are noise.
            let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(ansi)
                .boxed()
        };
        let (meter_provider, tracer_provider) = match &settings.otlp_endpoint {
            Some(endpoint) => {
                let interval = settings.otlp_interval.unwrap_or(Duration::from_secs(30));
                (
                    Some(otlp_meter_provider(endpoint, interval)?),
                    Some(otlp_tracer_provider(
                        endpoint,
                        settings.span_queue.unwrap_or(export::DEFAULT_SPAN_QUEUE),
                    )?),
                )
            }
            None => (None, None),
        };
        let otel_layer = tracer_provider
            .as_ref()
            .map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("tailor")));
        tracing_subscriber::registry()
            .with(filter)
            .with(fmt_layer)
            .with(otel_layer)
            .try_init()
            .map_err(|_| TelemetryError::AlreadyInitialised)?;
        let metrics = match &meter_provider {
            Some(p) => {
                opentelemetry::global::set_meter_provider(p.clone());
                Metrics::new(&p.meter("tailor"))
            }
            None => Metrics::new(&opentelemetry::global::meter("tailor")),
        };
        Ok(Telemetry {
            metrics,
            meter_provider,
            tracer_provider,
        })
    }

    /// Flushes and stops the exporters. Their readers run on their own threads and
    /// block, so call this from a blocking context (e.g. `spawn_blocking`) under tokio.
    pub fn shutdown(self) {
        if let Some(p) = self.meter_provider
            && let Err(e) = p.shutdown()
        {
            tracing::warn!(error = %e, "flushing OTLP metrics failed");
        }
        if let Some(p) = self.tracer_provider
            && let Err(e) = p.shutdown()
        {
            tracing::warn!(error = %e, "flushing OTLP traces failed");
        }
    }
}
