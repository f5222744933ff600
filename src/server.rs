//! The agent's HTTP endpoints: `/healthz` (the process is alive), `/readyz` (the agent has
//! what it needs to decide: a catalog and, in a cluster, synced caches) and `/metrics`
//! (Prometheus text format).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::telemetry::Metrics;

/// Readiness, flipped by the agent when its caches are synced.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks the agent ready or not.
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }

    /// Whether the agent is ready.
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    ready: Readiness,
}

/// The router with every endpoint, for serving or for in-process tests.
pub fn router(metrics: Metrics, ready: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(AppState { metrics, ready })
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    if state.ready.is_ready() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

async fn metrics_text(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
}

/// Binds `addr` and serves until `shutdown` resolves. Returns the bound address first
/// through `on_bound` (useful with port 0).
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    ready: Readiness,
    on_bound: impl FnOnce(SocketAddr),
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    on_bound(listener.local_addr()?);
    serve_on(listener, metrics, ready, shutdown).await
}

/// Serves on a listener bound beforehand, so that a caller can report an address in use
/// before it starts long work, until `shutdown` resolves.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    metrics: Metrics,
    ready: Readiness,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(metrics, ready))
        .with_graceful_shutdown(shutdown)
        .await
}
