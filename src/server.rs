//! The agent's HTTP endpoints: `/healthz` (the process is alive and no part of it reports
//! itself stuck), `/readyz` (the agent has
//! what it needs to decide: a catalog and, in a cluster, synced caches) and `/metrics`
//! (Prometheus text format).
//!
//! Every listener (these and the admission webhook's) is served by [`serve_connections`],
//! which any pod in the cluster may reach, so it bounds what a client can hold:
//!
//! - connections per listener and per client address, within the process' descriptor
//!   limit (a flood is closed at accept, and the agent keeps descriptors for its own calls);
//! - a TLS handshake must finish within its timeout;
//! - a request's headers must arrive within the header timeout of the connection opening
//!   or of the previous answer, which is also how long an idle keep-alive connection lives;
//! - a whole request, body and answer, must finish within the request timeout.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use crate::telemetry::Metrics;
use crate::telemetry::names::{ConnectionShed, Listener};

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
    let router = router(metrics.clone(), ready, Liveness::default());
    let limits = ConnectionLimits::default().within_descriptors(1);
    tokio::select! {
        () = serve_connections(listener, router, None, limits, Listener::Metrics, Some(metrics)) => {}
        () = shutdown => {}
    }
    Ok(())
}

/// What one listener lets its clients hold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConnectionLimits {
    /// Open connections at once; more are closed as they are accepted.
    pub max_connections: usize,
    /// Open connections at once from one client address.
    pub max_per_client: usize,
    /// A TLS handshake longer than this is cut.
    pub handshake_timeout: Duration,
    /// A request's headers must arrive within this of the connection opening or of the
    /// previous answer; so an idle keep-alive connection is closed after it too.
    pub header_timeout: Duration,
    /// A request, from its headers to its answer (the body included), longer than this is
    /// answered 408 and its connection closed.
    pub request_timeout: Duration,
}

impl Default for ConnectionLimits {
    /// 256 connections, 64 from one address, a 10 s handshake, 10 s for headers (and idle
    /// keep-alive), 30 s a request. The API server calls the webhook with a 2 s timeout,
    /// kubelet probes with 1 s and Prometheus scrapes within 10 s, so none of them is cut.
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 256,
            max_per_client: 64,
            handshake_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
        }
    }
}

impl ConnectionLimits {
    /// The defaults with their timeouts multiplied by `scale` (tests run the protocol
    /// timers faster; see `--timer-scale`).
    pub fn scaled(scale: f64) -> Self {
        let d = ConnectionLimits::default();
        let scale = |t: Duration| t.mul_f64(scale.clamp(0.01, 1.0));
        ConnectionLimits {
            handshake_timeout: scale(d.handshake_timeout),
            header_timeout: scale(d.header_timeout),
            request_timeout: scale(d.request_timeout),
            ..d
        }
    }

    /// The limits lowered, where need be, so that `listeners` listeners full of clients
    /// hold at most half the descriptors the process may open: the other half stays for
    /// the agent's own calls (the API server, the cloud, Prometheus).
    pub fn within_descriptors(self, listeners: usize) -> Self {
        match open_files_limit() {
            Some(limit) => self.within(limit, listeners),
            None => self,
        }
    }

    fn within(self, open_files: u64, listeners: usize) -> Self {
        let share = (open_files / 2 / listeners.max(1) as u64).max(8) as usize;
        let max_connections = self.max_connections.min(share);
        ConnectionLimits {
            max_connections,
            max_per_client: self.max_per_client.min(max_connections.div_ceil(2)).max(1),
            ..self
        }
    }
}

/// The soft limit on open descriptors, from `/proc/self/limits` (Linux); `None` where it
/// cannot be read or is unlimited.
fn open_files_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Connections open per client address; a slot is given back when its guard drops.
#[derive(Default)]
struct PerClient(Mutex<HashMap<IpAddr, usize>>);

struct ClientSlot(Arc<PerClient>, IpAddr);

impl PerClient {
    fn enter(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<ClientSlot> {
        let mut open = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = open.entry(ip).or_default();
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(ClientSlot(self.clone(), ip))
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = (self.0)
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.1);
            }
        }
    }
}

/// Serves `router` on `listener` (over TLS when `tls` is given) within `limits`, until the
/// future is dropped; dropping it closes every connection it holds. Connections shed, and
/// those open, are counted on `metrics` under `name`.
pub async fn serve_connections(
    listener: TcpListener,
    router: Router,
    tls: Option<TlsAcceptor>,
    limits: ConnectionLimits,
    name: Listener,
    metrics: Option<Metrics>,
) {
    let max = limits.max_connections.max(1);
    let slots = Arc::new(Semaphore::new(max));
    let clients = Arc::new(PerClient::default());
    let shed = {
        let metrics = metrics.clone();
        move |reason: ConnectionShed| {
            if let Some(m) = &metrics {
                m.connection_shed(name, reason);
            }
        }
    };
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (stream, peer) = match accepted {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors, most likely: wait for some to be given back.
                tracing::warn!(listener = name.as_str(), error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            shed(ConnectionShed::Limit);
            drop(stream);
            continue;
        };
        let Some(client) = clients.enter(peer.ip(), limits.max_per_client) else {
            shed(ConnectionShed::ClientLimit);
            drop(stream);
            continue;
        };
        // Connections open: the slots taken.
        let report = {
            let (slots, metrics) = (slots.clone(), metrics.clone());
            move || {
                if let Some(m) = &metrics {
                    m.set_connections(name, max - slots.available_permits());
                }
            }
        };
        report();
        let (tls, router, shed) = (tls.clone(), router.clone(), shed.clone());
        connections.spawn(async move {
            let held = (slot, client);
            match tls {
                Some(acceptor) => {
                    match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream))
                        .await
                    {
                        Ok(Ok(stream)) => serve_one(stream, router, limits, peer, &shed).await,
                        Ok(Err(e)) => {
                            tracing::debug!(peer = %peer, error = %e, "TLS handshake failed");
                        }
                        Err(_) => shed(ConnectionShed::HandshakeTimeout),
                    }
                }
                None => serve_one(stream, router, limits, peer, &shed).await,
            }
            drop(held);
            report();
        });
    }
}

/// Serves HTTP/1.1 on one connection within the header and request timeouts.
async fn serve_one<S>(
    stream: S,
    router: Router,
    limits: ConnectionLimits,
    peer: SocketAddr,
    shed: &(impl Fn(ConnectionShed) + Clone + Send + Sync + 'static),
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let inner = TowerToHyperService::new(router);
    let on_timeout = shed.clone();
    let service = hyper::service::service_fn(move |request| {
        let answer = hyper::service::Service::call(&inner, request);
        let on_timeout = on_timeout.clone();
        async move {
            match tokio::time::timeout(limits.request_timeout, answer).await {
                Ok(answered) => answered,
                Err(_) => {
                    on_timeout(ConnectionShed::RequestTimeout);
                    let mut response = axum::response::Response::new(axum::body::Body::from(
                        "request not completed in time\n",
                    ));
                    *response.status_mut() = StatusCode::REQUEST_TIMEOUT;
                    response.headers_mut().insert(
                        header::CONNECTION,
                        header::HeaderValue::from_static("close"),
                    );
                    Ok(response)
                }
            }
        }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if let Err(e) = served {
        if e.is_timeout() {
            shed(ConnectionShed::HeaderTimeout);
        } else {
            tracing::debug!(peer = %peer, error = %e, "connection ended");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_leave_half_the_descriptors_to_the_agent() {
        let d = ConnectionLimits::default();
        assert_eq!(d.within(1_048_576, 3), d);
        let small = d.within(256, 2);
        assert_eq!(small.max_connections, 64);
        assert_eq!(small.max_per_client, 32);
        assert_eq!(small.header_timeout, d.header_timeout);
        // Never none at all.
        assert_eq!(d.within(4, 3).max_connections, 8);
        assert!(open_files_limit().is_some_and(|n| n > 0));
    }

    #[test]
    fn one_client_holds_at_most_its_share_and_gets_it_back() {
        let clients = Arc::new(PerClient::default());
        let a: IpAddr = "10.0.0.1".parse().expect("ip");
        let b: IpAddr = "10.0.0.2".parse().expect("ip");
        let first = clients.enter(a, 2).expect("first");
        let _second = clients.enter(a, 2).expect("second");
        assert!(clients.enter(a, 2).is_none());
        assert!(clients.enter(b, 2).is_some());
        drop(first);
        assert!(clients.enter(a, 2).is_some());
    }

    #[test]
    fn scaled_limits_scale_only_the_timeouts() {
        let s = ConnectionLimits::scaled(0.2);
        assert_eq!(s.header_timeout, Duration::from_secs(2));
        assert_eq!(s.handshake_timeout, Duration::from_secs(2));
        assert_eq!(s.request_timeout, Duration::from_secs(6));
        assert_eq!(
            s.max_connections,
            ConnectionLimits::default().max_connections
        );
    }
}
