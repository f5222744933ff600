//! The agent's HTTP endpoints, served on a real socket and read with a real HTTP client.

use std::net::SocketAddr;

use tailor::server::{Readiness, serve};
use tailor::telemetry::{Metrics, install_tls_provider};
use tokio::sync::oneshot;

async fn start(
    metrics: Metrics,
    ready: Readiness,
) -> (SocketAddr, oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let (bound_tx, bound_rx) = oneshot::channel();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let addr: SocketAddr = "127.0.0.1:0".parse().expect("valid address");
        serve(
            addr,
            metrics,
            ready,
            move |a| {
                let _ = bound_tx.send(a);
            },
            async move {
                let _ = stop_rx.await;
            },
        )
        .await
        .expect("server runs");
    });
    let addr = bound_rx.await.expect("server bound");
    (addr, stop_tx, task)
}

#[tokio::test]
async fn health_readiness_and_metrics_are_served_over_http() {
    install_tls_provider();
    let metrics = Metrics::new(&opentelemetry::global::meter("server-test"));
    metrics.nodeclaim_launched("default", "Standard_D4s_v5", "on-demand", "eastus-1");
    metrics.observe_decision("scheduling", 0.004);
    let ready = Readiness::default();
    let (addr, stop, task) = start(metrics.clone(), ready.clone()).await;
    let client = reqwest::Client::new();
    let get = |path: &str| client.get(format!("http://{addr}{path}")).send();

    let health = get("/healthz").await.expect("healthz answers");
    assert_eq!(health.status(), 200);

    assert_eq!(get("/readyz").await.expect("readyz answers").status(), 503);
    ready.set(true);
    assert_eq!(get("/readyz").await.expect("readyz answers").status(), 200);

    let response = get("/metrics").await.expect("metrics answers");
    assert_eq!(response.status(), 200);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let body = response.text().await.expect("body");
    assert!(
        body.contains("tailor_nodeclaims_launched_total{nodepool=\"default\""),
        "{body}"
    );
    assert!(
        body.contains(
            "tailor_decision_duration_seconds_bucket{le=\"0.005\",decision=\"scheduling\"} 1"
        ),
        "{body}"
    );

    // Values recorded after start show up on the next scrape.
    metrics.cloud_error("create", "quota");
    let body = get("/metrics")
        .await
        .expect("metrics answers")
        .text()
        .await
        .expect("body");
    assert!(
        body.contains("tailor_cloud_errors_total{operation=\"create\",kind=\"quota\"} 1"),
        "{body}"
    );

    stop.send(()).expect("server still running");
    task.await.expect("server stops cleanly");
}
