//! The mutating admission webhook: new pods of workloads in `Auto` mode get their
//! recommended requests (and limits, per the limit policy) at creation, so a GitOps manifest
//! never drifts and a pod that replaces an evicted one starts right-sized.
//!
//! - [`mutate`] is the decision, pure: pod + read-only view of the stores → JSON patch;
//! - [`certificate`]: the serving certificate, mounted or made by the agent;
//! - this module: the HTTPS server (rustls) and the `MutatingWebhookConfiguration`.
//!
//! It fails open: the configuration has `failurePolicy: Ignore` and a 2 s timeout, and every
//! answer allows the pod — a review that cannot be read, an owner that is not known, or a
//! recommendation that cannot be parsed is allowed unchanged with a log line. Every replica
//! serves it from its own stores (reads only), leader or not.

pub mod certificate;
pub mod mutate;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State as AxumState;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::post;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    WebhookClientConfig,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::api::ObjectMeta;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::apis::rightsizingpolicy::DEFAULT_POLICY_NAME;
use crate::apis::{Recommendation, RightsizingPolicy};
use crate::telemetry::Metrics;
use crate::telemetry::names::WebhookOutcome;
use crate::usage::workloads::Workload;
pub use mutate::{Decision, Objects, Settings};

/// Path the API server posts pod admission reviews to.
pub const PATH: &str = "/mutate-pods";

/// Name of the `MutatingWebhookConfiguration` the agent applies.
pub const CONFIGURATION_NAME: &str = "tailor-rightsizing";

/// Name of the webhook inside it (must be a fully qualified name).
pub const WEBHOOK_NAME: &str = "pods.rightsizing.tailor.sh";

/// Secret (in the agent's namespace) holding the certificate the agent made, shared by all
/// replicas so that one `caBundle` fits whichever replica the API server reaches.
pub const CERTIFICATE_SECRET: &str = "tailor-webhook-cert";

/// Annotation on that Secret naming the hosts its certificate was made for; a different
/// `--webhook-url` makes a new one.
pub const HOSTS_ANNOTATION: &str = "tailor.sh/webhook-hosts";

/// Seconds the API server waits for an answer before going on without it.
pub const TIMEOUT_SECONDS: i32 = 2;

/// Opt-out label: pods labelled `tailor.sh/rightsizing: "off"` are never sent to the webhook.
pub const OPT_OUT_LABEL: &str = "tailor.sh/rightsizing";

/// The reflector stores the decision reads, as [`Objects`].
#[derive(Clone)]
pub struct Stores {
    /// ReplicaSets.
    pub replica_sets: Store<ReplicaSet>,
    /// Jobs.
    pub jobs: Store<Job>,
    /// Deployments.
    pub deployments: Store<Deployment>,
    /// StatefulSets.
    pub stateful_sets: Store<StatefulSet>,
    /// DaemonSets.
    pub daemon_sets: Store<DaemonSet>,
    /// RightsizingPolicies.
    pub policies: Store<RightsizingPolicy>,
    /// Recommendations.
    pub recommendations: Store<Recommendation>,
    /// The agent's namespace (home of the cluster-default policy).
    pub agent_namespace: String,
}

impl Stores {
    /// The agent's stores.
    pub fn of(state: &crate::controllers::State, agent_namespace: &str) -> Stores {
        Stores {
            replica_sets: state.replica_sets.clone(),
            jobs: state.jobs.clone(),
            deployments: state.deployments.clone(),
            stateful_sets: state.stateful_sets.clone(),
            daemon_sets: state.daemon_sets.clone(),
            policies: state.policies.clone(),
            recommendations: state.recommendations.clone(),
            agent_namespace: agent_namespace.to_string(),
        }
    }
}

fn get<K>(store: &Store<K>, namespace: &str, name: &str) -> Option<Arc<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    store.get(&ObjectRef::new(name).within(namespace))
}

impl Objects for Stores {
    fn replica_set(&self, namespace: &str, name: &str) -> Option<Arc<ReplicaSet>> {
        get(&self.replica_sets, namespace, name)
    }

    fn job(&self, namespace: &str, name: &str) -> Option<Arc<Job>> {
        get(&self.jobs, namespace, name)
    }

    fn has_deployment(&self, namespace: &str, name: &str) -> bool {
        get(&self.deployments, namespace, name).is_some()
    }

    fn workload_labels(&self, w: &Workload) -> BTreeMap<String, String> {
        let (ns, name) = (w.namespace.as_str(), w.name.as_str());
        let labels = match w.kind.as_str() {
            "Deployment" => get(&self.deployments, ns, name).map(|o| o.metadata.labels.clone()),
            "StatefulSet" => get(&self.stateful_sets, ns, name).map(|o| o.metadata.labels.clone()),
            "DaemonSet" => get(&self.daemon_sets, ns, name).map(|o| o.metadata.labels.clone()),
            "ReplicaSet" => get(&self.replica_sets, ns, name).map(|o| o.metadata.labels.clone()),
            "Job" => get(&self.jobs, ns, name).map(|o| o.metadata.labels.clone()),
            _ => None,
        };
        labels.flatten().unwrap_or_default()
    }

    fn recommendation(&self, namespace: &str, name: &str) -> Option<Arc<Recommendation>> {
        get(&self.recommendations, namespace, name)
    }

    fn policies(&self, namespace: &str) -> Vec<RightsizingPolicy> {
        self.policies
            .state()
            .iter()
            .filter(|p| {
                let ns = p.metadata.namespace.as_deref().unwrap_or("default");
                ns == namespace
                    || (ns == self.agent_namespace
                        && p.metadata.name.as_deref() == Some(DEFAULT_POLICY_NAME))
            })
            .map(|p| (**p).clone())
            .collect()
    }
}

#[derive(Clone)]
struct Handler {
    objects: Arc<dyn Objects + Send + Sync>,
    settings: Arc<Settings>,
    metrics: Option<Metrics>,
}

/// The webhook's router: `POST /mutate-pods`. Public so that tests and benchmarks can drive
/// it without TLS.
pub fn router(
    objects: Arc<dyn Objects + Send + Sync>,
    settings: Settings,
    metrics: Option<Metrics>,
) -> Router {
    Router::new().route(PATH, post(review)).with_state(Handler {
        objects,
        settings: Arc::new(settings),
        metrics,
    })
}

/// The `request.uid` of a review that did not parse as a whole, if it has one.
fn uid_of(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.pointer("/request/uid")?.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// An answer that allows the pod unchanged, for a review that could not be read.
fn allow_unread(uid: String, why: &str) -> AdmissionReview<kube::core::DynamicObject> {
    let mut response = AdmissionResponse::invalid(why);
    response.allowed = true;
    response.uid = uid;
    response.into_review()
}

/// Answers one admission review. Never denies.
pub fn answer(
    body: &[u8],
    objects: &dyn Objects,
    settings: &Settings,
) -> (AdmissionReview<kube::core::DynamicObject>, WebhookOutcome) {
    let review: AdmissionReview<Pod> = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => {
            let uid = uid_of(body);
            tracing::warn!(uid = %uid, error = %e, "admission review unreadable: pod allowed unchanged");
            return (
                allow_unread(uid, "unreadable review"),
                WebhookOutcome::Error,
            );
        }
    };
    let request: AdmissionRequest<Pod> = match review.try_into() {
        Ok(r) => r,
        Err(e) => {
            let uid = uid_of(body);
            tracing::warn!(uid = %uid, error = %e, "admission review without a request: allowed");
            return (allow_unread(uid, "no request"), WebhookOutcome::Error);
        }
    };
    let allow = AdmissionResponse::from(&request);
    let namespace = request.namespace.clone().unwrap_or_default();
    let pod_name = request
        .object
        .as_ref()
        .and_then(|p| p.metadata.name.clone().or(p.metadata.generate_name.clone()))
        .unwrap_or_else(|| request.name.clone());
    let Some(pod) = request
        .object
        .as_ref()
        .filter(|_| request.operation == Operation::Create)
    else {
        tracing::debug!(pod = %format!("{namespace}/{pod_name}"), operation = ?request.operation, "not a pod creation: allowed");
        return (allow.into_review(), WebhookOutcome::Unchanged);
    };
    match mutate::decide(pod, &namespace, objects, settings) {
        Decision::Patch {
            workload,
            patch,
            containers,
        } => {
            let summary: Vec<String> = containers
                .iter()
                .map(|c| {
                    let values: Vec<String> = c
                        .requests
                        .iter()
                        .map(|(k, v)| format!("{k}={}", v.0))
                        .collect();
                    format!("{}[{}]", c.name, values.join(","))
                })
                .collect();
            match allow.clone().with_patch(patch) {
                Ok(patched) => {
                    tracing::info!(pod = %format!("{namespace}/{pod_name}"), workload = %format!("{}/{}", workload.kind, workload.name), containers = %summary.join(" "), "requests set at creation");
                    (patched.into_review(), WebhookOutcome::Patched)
                }
                Err(e) => {
                    tracing::warn!(pod = %format!("{namespace}/{pod_name}"), error = %e, "patch could not be encoded: allowed unchanged");
                    (allow.into_review(), WebhookOutcome::Error)
                }
            }
        }
        Decision::Unchanged(why) => {
            tracing::debug!(pod = %format!("{namespace}/{pod_name}"), why = %why, "allowed unchanged");
            (allow.into_review(), WebhookOutcome::Unchanged)
        }
        Decision::Invalid(why) => {
            tracing::warn!(pod = %format!("{namespace}/{pod_name}"), problem = %why, "allowed unchanged");
            (allow.into_review(), WebhookOutcome::Error)
        }
    }
}

async fn review(AxumState(h): AxumState<Handler>, body: Bytes) -> impl IntoResponse {
    let started = Instant::now();
    let (review, outcome) = answer(&body, h.objects.as_ref(), &h.settings);
    let body = serde_json::to_vec(&review).unwrap_or_default();
    if let Some(m) = &h.metrics {
        m.webhook_request(outcome, started.elapsed().as_secs_f64());
    }
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
}

/// Serves `router` over TLS on `listener` within `limits` until the task is aborted; the
/// certificate comes from `resolver` at each handshake.
pub async fn serve_tls(
    listener: TcpListener,
    resolver: Arc<certificate::Resolver>,
    router: Router,
    limits: crate::server::ConnectionLimits,
    metrics: Option<Metrics>,
) {
    let builder = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions();
    let mut config = match builder {
        Ok(b) => b.with_no_client_auth().with_cert_resolver(resolver),
        Err(e) => {
            tracing::error!(error = %e, "webhook TLS configuration failed: webhook off");
            return;
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    crate::server::serve_connections(
        listener,
        router,
        Some(TlsAcceptor::from(Arc::new(config))),
        limits,
        crate::telemetry::names::Listener::Webhook,
        metrics,
    )
    .await;
}

/// Where the API server reaches the webhook, parsed from `--webhook-url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The URL as given.
    pub url: String,
    /// Host of the URL (a DNS name or an IP address).
    pub host: String,
    /// `(service, namespace, port, path)` when the host is a Service's cluster DNS name:
    /// the configuration then names the Service, which the API server resolves itself.
    pub service: Option<(String, String, i32, String)>,
}

impl Endpoint {
    /// Parses an `https://` URL; errors name the value.
    pub fn parse(url: &str) -> Result<Endpoint, String> {
        let rest = url
            .strip_prefix("https://")
            .ok_or_else(|| format!("{url:?} must start with https://"))?;
        let (authority, path) = rest
            .split_once('/')
            .map_or((rest, "/".to_string()), |(a, p)| (a, format!("/{p}")));
        let (host, port) = if let Some(h) = authority.strip_prefix('[') {
            let (h, tail) = h
                .split_once(']')
                .ok_or_else(|| format!("{url:?}: unclosed [ in the host"))?;
            (
                h.to_string(),
                tail.strip_prefix(':').unwrap_or("443").to_string(),
            )
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p.to_string()),
                None => (authority.to_string(), "443".to_string()),
            }
        };
        if host.is_empty() {
            return Err(format!("{url:?} has no host"));
        }
        let port: i32 = port
            .parse()
            .map_err(|_| format!("{url:?}: port {port:?} is not a number"))?;
        let labels: Vec<&str> = host.split('.').collect();
        let service = match labels.as_slice() {
            [svc, ns, "svc"] | [svc, ns, "svc", "cluster", "local"] => {
                Some((svc.to_string(), ns.to_string(), port, path))
            }
            _ => None,
        };
        Ok(Endpoint {
            url: url.to_string(),
            host,
            service,
        })
    }

    /// The names the serving certificate must carry.
    pub fn hosts(&self) -> Vec<String> {
        match &self.service {
            Some((svc, ns, _, _)) => vec![
                format!("{svc}.{ns}.svc"),
                format!("{svc}.{ns}.svc.cluster.local"),
                format!("{svc}.{ns}"),
                svc.clone(),
            ],
            None => vec![self.host.clone()],
        }
    }
}

/// The default `--webhook-url`: the chart's Service (named like the release's fullname,
/// `tailor` by default) in the agent's namespace, on the chart's webhook port.
pub fn default_url(namespace: &str) -> String {
    format!("https://tailor.{namespace}.svc:9443{PATH}")
}

/// The `MutatingWebhookConfiguration`: pod CREATE only, fail open with a short timeout, no
/// side effects, never reinvoked, and never for the agent's own namespace or opted-out pods.
pub fn configuration(
    endpoint: &Endpoint,
    ca_bundle: Option<&str>,
    agent_namespace: &str,
) -> MutatingWebhookConfiguration {
    let client_config = WebhookClientConfig {
        ca_bundle: ca_bundle.map(|c| ByteString(c.as_bytes().to_vec())),
        service: endpoint
            .service
            .as_ref()
            .map(|(name, namespace, port, path)| ServiceReference {
                name: name.clone(),
                namespace: namespace.clone(),
                port: Some(*port),
                path: Some(path.clone()),
            }),
        url: endpoint.service.is_none().then(|| endpoint.url.clone()),
    };
    let not_in = |key: &str, values: Vec<String>| LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: key.to_string(),
            operator: "NotIn".to_string(),
            values: Some(values),
        }]),
        match_labels: None,
    };
    MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(CONFIGURATION_NAME.to_string()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "tailor".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        webhooks: Some(vec![MutatingWebhook {
            name: WEBHOOK_NAME.to_string(),
            admission_review_versions: vec!["v1".to_string()],
            client_config,
            failure_policy: Some("Ignore".to_string()),
            match_policy: Some("Equivalent".to_string()),
            namespace_selector: Some(not_in(
                "kubernetes.io/metadata.name",
                vec![agent_namespace.to_string()],
            )),
            object_selector: Some(not_in(OPT_OUT_LABEL, vec!["off".to_string()])),
            reinvocation_policy: Some("Never".to_string()),
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec![String::new()]),
                api_versions: Some(vec!["v1".to_string()]),
                operations: Some(vec!["CREATE".to_string()]),
                resources: Some(vec!["pods".to_string()]),
                scope: Some("Namespaced".to_string()),
            }]),
            side_effects: "None".to_string(),
            timeout_seconds: Some(TIMEOUT_SECONDS),
            match_conditions: None,
        }]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_url_becomes_a_service_reference_and_an_ip_url_stays_a_url() {
        let e = Endpoint::parse("https://tailor.tailor.svc:9443/mutate-pods").expect("parses");
        assert_eq!(
            e.service,
            Some((
                "tailor".into(),
                "tailor".into(),
                9443,
                "/mutate-pods".into()
            ))
        );
        assert!(e.hosts().contains(&"tailor.tailor.svc".to_string()));
        let c = configuration(&e, Some("CA"), "tailor");
        let hook = &c.webhooks.as_ref().expect("one webhook")[0];
        assert!(hook.client_config.url.is_none());
        assert_eq!(hook.failure_policy.as_deref(), Some("Ignore"));
        assert_eq!(hook.timeout_seconds, Some(TIMEOUT_SECONDS));
        assert_eq!(hook.side_effects, "None");
        assert_eq!(hook.reinvocation_policy.as_deref(), Some("Never"));
        let e = Endpoint::parse("https://127.0.0.1:8443/mutate-pods").expect("parses");
        assert_eq!(e.service, None);
        assert_eq!(e.hosts(), vec!["127.0.0.1".to_string()]);
        let c = configuration(&e, None, "tailor");
        let hook = &c.webhooks.as_ref().expect("one webhook")[0];
        assert_eq!(
            hook.client_config.url.as_deref(),
            Some("https://127.0.0.1:8443/mutate-pods")
        );
        assert!(hook.client_config.ca_bundle.is_none());
    }

    #[test]
    fn a_url_that_is_not_https_or_has_a_bad_port_is_refused_by_value() {
        let e = Endpoint::parse("http://tailor.tailor.svc/mutate").expect_err("http");
        assert!(e.contains("http://tailor.tailor.svc/mutate"), "{e}");
        let e = Endpoint::parse("https://host:port/x").expect_err("port");
        assert!(e.contains("\"port\""), "{e}");
    }
}
