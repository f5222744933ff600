//! The agent's HTTP endpoints: `/healthz` (the process is alive and no part of it reports
//! itself stuck), `/readyz` (the agent has
//! what it needs to decide: a catalog and, in a cluster, synced caches) and `/metrics`
//! (Prometheus text format).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

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

/// Liveness: each part of the agent that can get stuck (leader election) reports it here
/// with the reason, and `/healthz` fails while any does, so the pod is restarted.
#[derive(Debug, Clone, Default)]
pub struct Liveness(Arc<Mutex<BTreeMap<&'static str, String>>>);

impl Liveness {
    /// `part` is stuck, for `reason`.
    pub fn fail(&self, part: &'static str, reason: String) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(part, reason);
    }

    /// `part` works again.
    pub fn recover(&self, part: &'static str) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(part);
    }

    /// What is stuck, one line per part; empty when the agent is live.
    pub fn problems(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(part, reason)| format!("{part}: {reason}"))
            .collect()
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Metrics,
    ready: Readiness,
    live: Liveness,
}

/// The router with every endpoint, for serving or for in-process tests.
pub fn router(metrics: Metrics, ready: Readiness, live: Liveness) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(AppState {
            metrics,
            ready,
            live,
        })
}

async fn healthz(State(state): State<AppState>) -> impl IntoResponse {
    let problems = state.live.problems();
    if problems.is_empty() {
        (StatusCode::OK, "ok".to_string())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, problems.join("\n"))
    }
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
    // Nothing here can get stuck: the demo's and tests' servers are always live.
    axum::serve(listener, router(metrics, ready, Liveness::default()))
        .with_graceful_shutdown(shutdown)
        .await
}
