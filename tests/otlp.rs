//! OTLP export: the real exporter pushes to a test receiver that decodes OTLP/HTTP
//! protobuf, and the metrics recorded through Tailor's facade arrive with their labels.
//! With a collector that is unreachable or accepts and never answers, export never holds
//! anything back: ended spans beyond the bounded queue are dropped at once, the agent keeps
//! provisioning and serving `/metrics`, and every dropped point and span is counted.

#[path = "support/control_plane.rs"]
#[allow(dead_code)] // shared with tests/agent.rs, which uses all of it
mod control_plane;

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::routing::post;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use tailor::telemetry::{Metrics, install_tls_provider, otlp_meter_provider, otlp_tracer_provider};

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

/// The value of `tailor_otlp_dropped_total` for `signal` and `reason` in a scrape.
fn dropped(text: &str, signal: &str, reason: &str) -> u64 {
    let prefix = format!("tailor_otlp_dropped_total{{signal=\"{signal}\",reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().parse().expect("a count"))
        .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
}

/// A collector that accepts connections and never reads or answers; the sockets stay open
/// while the returned task runs.
async fn hanging_collector() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("bound");
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    (format!("http://{addr}"), task)
}

/// An endpoint nothing listens on: a port bound and released.
fn unreachable_endpoint() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a port");
    format!("http://127.0.0.1:{port}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_past_the_bounded_queue_are_dropped_at_once_and_counted_with_failed_exports() {
    install_tls_provider();
    use opentelemetry::trace::{Tracer as _, TracerProvider as _};
    let (hanging, _collector) = hanging_collector().await;
    let facade = Metrics::new(&opentelemetry::global::meter("test"));
    let before_full = dropped(&facade.render(), "traces", "queue_full");
    let before_failed = dropped(&facade.render(), "traces", "export_failed");
    for endpoint in [unreachable_endpoint(), hanging] {
        let provider = otlp_tracer_provider(&endpoint, 16).expect("exporter builds");
        let tracer = provider.tracer("tailor");
        // Ending 5,000 spans returns although nothing can take them: all but the queue's
        // 16 (and those already in an export) are dropped.
        let ended = tokio::task::spawn_blocking(move || {
            for i in 0..5_000 {
                tracer.in_span(format!("round {i}"), |_| {});
            }
        });
        ended.await.expect("the spans end");
        let full = dropped(&facade.render(), "traces", "queue_full") - before_full;
        assert!(full >= 4_000, "{endpoint}: {full} spans counted as dropped");
        // The queued ones fail to export (refused, or past the exporter's timeout) and
        // are counted too; a shutdown flushes them.
        tokio::task::spawn_blocking(move || {
            let _ = provider.shutdown_with_timeout(std::time::Duration::from_secs(30));
        })
        .await
        .expect("shutdown returns");
    }
    let failed = dropped(&facade.render(), "traces", "export_failed") - before_failed;
    assert!(failed >= 1, "failed exports counted: {failed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_whose_collector_is_down_or_hangs_keeps_provisioning_and_counts_what_it_drops() {
    use control_plane::{Agent, ControlPlane, eventually, list};
    use k8s_openapi::api::core::v1::Pod;
    let cp = ControlPlane::start().await;
    let (hanging, _collector) = hanging_collector().await;
    let unreachable = unreachable_endpoint();
    let start = |name: &str, endpoint: &str| {
        let env = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
            ("OTEL_METRIC_EXPORT_INTERVAL", "500"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2000"),
        ];
        Agent::start_with(
            &cp,
            name,
            &["--cloud", "kwok"],
            &["--mode", "autonomous"],
            &env,
        )
    };
    let agents = [
        start("otlp-down", &unreachable),
        start("otlp-hangs", &hanging),
    ];
    for agent in &agents {
        agent.wait_ready().await;
    }
    cp.apply_yaml(POOL_AND_WORKLOAD).await;

    // Both keep serving /metrics, and the drops rise on both.
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(5))
        .build()
        .expect("client");
    for agent in &agents {
        let url = format!("{}/metrics", agent.url);
        let mut last = 0;
        for _ in 0..2 {
            last = eventually(
                std::time::Duration::from_secs(60),
                "more dropped metric points",
                || async {
                    let text = client.get(&url).send().await.ok()?.text().await.ok()?;
                    let n = dropped(&text, "metrics", "export_failed");
                    (n > last).then_some(n)
                },
            )
            .await;
        }
        println!("{}: {last} metric points dropped so far", agent.url);
    }
    // And the leader provisions meanwhile.
    let pods: kube::Api<Pod> = kube::Api::namespaced(cp.client.clone(), "default");
    eventually(
        std::time::Duration::from_secs(90),
        "3 pods Running",
        || async {
            let running = list(&pods)
                .await
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            (running == 3).then_some(())
        },
    )
    .await;
    for agent in &agents {
        let health = client
            .get(format!("{}/healthz", agent.url))
            .send()
            .await
            .expect("healthz answers");
        assert!(health.status().is_success());
    }
}

const POOL_AND_WORKLOAD: &str = r#"
apiVersion: tailor.sh/v1alpha1
kind: AKSNodeClass
metadata: {name: default}
spec: {imageFamily: AzureLinux}
---
apiVersion: tailor.sh/v1alpha1
kind: NodePool
metadata: {name: default}
spec:
  template:
    spec:
      requirements:
      - {key: tailor.sh/sku-family, operator: In, values: [D]}
      - {key: tailor.sh/capacity-type, operator: In, values: [on-demand]}
      nodeClassRef: {group: tailor.sh, kind: AKSNodeClass, name: default}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 0
      containers:
      - {name: app, image: registry.example/web:1, resources: {requests: {cpu: "1", memory: 2Gi}}}
"#;
