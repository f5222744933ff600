//! OTLP export: the real exporter pushes to a test receiver that decodes OTLP/HTTP
//! protobuf, and the metrics recorded through Tailor's facade arrive with their labels.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::routing::post;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use tailor::telemetry::{Metrics, install_tls_provider, otlp_meter_provider};

type Received = Arc<Mutex<Vec<ExportMetricsServiceRequest>>>;

async fn receiver() -> (String, Received) {
    let received: Received = Arc::default();
    let sink = received.clone();
    let app = Router::new().route(
        "/v1/metrics",
        post(move |body: Bytes| {
            let sink = sink.clone();
            async move {
                let request =
                    ExportMetricsServiceRequest::decode(body).expect("valid OTLP protobuf");
                sink.lock().expect("not poisoned").push(request);
                ""
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("bound");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("receiver runs") });
    (format!("http://{addr}"), received)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_recorded_through_the_facade_arrive_over_otlp_http() {
    install_tls_provider();
    let (endpoint, received) = receiver().await;
    let provider = otlp_meter_provider(&endpoint, std::time::Duration::from_secs(3600))
        .expect("exporter builds");
    let metrics = Metrics::new(&provider.meter("tailor"));
    metrics.nodeclaim_launched("default", "Standard_D4s_v5", "spot", "eastus-2");
    metrics.observe_provisioning("default", 37.5);
    metrics.set_node_cost("default", "Standard_D4s_v5", "spot", "eastus-1", 0.0768);
    // The periodic reader exports from its own thread with a blocking client.
    tokio::task::spawn_blocking(move || provider.shutdown())
        .await
        .expect("joined")
        .expect("flush succeeds");

    let requests = received.lock().expect("not poisoned");
    assert!(!requests.is_empty(), "the receiver got an export");
    let service_names: Vec<String> = requests
        .iter()
        .flat_map(|r| &r.resource_metrics)
        .filter_map(|rm| rm.resource.as_ref())
        .flat_map(|r| &r.attributes)
        .filter(|kv| kv.key == "service.name")
        .filter_map(
            |kv| match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => Some(s.clone()),
                _ => None,
            },
        )
        .collect();
    assert!(
        service_names.iter().any(|s| s == "tailor"),
        "{service_names:?}"
    );
    let metrics: Vec<_> = requests
        .iter()
        .flat_map(|r| &r.resource_metrics)
        .flat_map(|rm| &rm.scope_metrics)
        .flat_map(|sm| &sm.metrics)
        .collect();
    let names: Vec<&str> = metrics.iter().map(|m| m.name.as_str()).collect();
    for expected in [
        "tailor_nodeclaims_launched",
        "tailor_provisioning_duration_seconds",
        "tailor_node_hourly_cost_dollars",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    let launched = metrics
        .iter()
        .find(|m| m.name == "tailor_nodeclaims_launched")
        .expect("launched counter");
    let debug = format!("{launched:?}");
    assert!(
        debug.contains("eastus-2") && debug.contains("Standard_D4s_v5"),
        "{debug}"
    );
}
