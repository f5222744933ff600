//! Reading a [`Snapshot`] from a live cluster through the Kubernetes API: the objects a
//! snapshot file would hold, listed page by page and validated by the same code, so a
//! bad object is reported the same way whether it came from a file or from the cluster.

use std::path::Path;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::ListParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::snapshot::{PendingPods, Snapshot, SnapshotError};
use crate::apis::{AKSNodeClass, NodeClaim, NodePool, RightsizingPolicy};

/// Objects per list request; larger lists are read in pages.
const PAGE_SIZE: u32 = 500;

/// Why the cluster could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// No usable kubeconfig or in-cluster configuration.
    #[error("kubeconfig{}: {message}", path.as_deref().map(|p| format!(" {p}")).unwrap_or_default())]
    Config {
        /// The kubeconfig file, when one was named.
        path: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// A list request failed.
    #[error("listing {resource}{} from {server}: {message}", namespace.as_deref().map(|n| format!(" in namespace {n}")).unwrap_or_default())]
    List {
        /// The resource, e.g. `pods`.
        resource: String,
        /// The namespace, when the list was namespaced.
        namespace: Option<String>,
        /// The API server.
        server: String,
        /// The API server's answer.
        message: String,
    },
    /// An object failed validation.
    #[error(transparent)]
    Object(#[from] SnapshotError),
    /// The API server did not answer a first request.
    #[error("API server {server}: {cause}")]
    Unreachable {
        /// The API server's URL.
        server: String,
        /// Why, in words first (connection refused, timed out, TLS, 401 or 403), then the
        /// client's own message.
        cause: String,
    },
}

/// Asks the API server for its version, within `timeout`: a first request that names the
/// server and the cause when it cannot be reached (refused, no answer, TLS, credentials),
/// instead of the bare "client error (Connect)" of the first watch or Lease request.
pub async fn check_reachable(
    client: &Client,
    server: &str,
    timeout: std::time::Duration,
) -> Result<(), ClusterError> {
    let cause = match tokio::time::timeout(timeout, client.apiserver_version()).await {
        Ok(Ok(_)) => return Ok(()),
        Ok(Err(e)) => unreachable_cause(&e),
        Err(_) => format!("timed out: no answer within {} s", timeout.as_secs_f64()),
    };
    Err(ClusterError::Unreachable {
        server: server.to_string(),
        cause,
    })
}

/// Why a request to the API server failed, in words first, then every message in the
/// error's chain (the client's outermost message alone says only "client error").
pub fn unreachable_cause(e: &kube::Error) -> String {
    if let kube::Error::Api(status) = e {
        let words = match status.code {
            401 => "the credentials were refused (401 Unauthorized)",
            403 => "the credentials may not read the server's version (403 Forbidden)",
            _ => "the server refused the request",
        };
        return format!("{words}: {} {}", status.code, status.message);
    }
    let text = crate::telemetry::error_chain(e);
    let kind = std::iter::successors(std::error::Error::source(e), |s| s.source())
        .find_map(|s| s.downcast_ref::<std::io::Error>().map(std::io::Error::kind));
    let lower = text.to_lowercase();
    let words = match kind {
        Some(std::io::ErrorKind::ConnectionRefused) => "connection refused",
        Some(std::io::ErrorKind::TimedOut) => "timed out",
        _ if lower.contains("certificate")
            || lower.contains("tls")
            || lower.contains("handshake") =>
        {
            "TLS handshake failed"
        }
        _ if lower.contains("dns") || lower.contains("lookup") => "name lookup failed",
        _ => "unreachable",
    };
    format!("{words} ({text})")
}

/// The kinds of object a read can list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Pods.
    Pod,
    /// Nodes (cluster-scoped).
    Node,
    /// Deployments.
    Deployment,
    /// StatefulSets.
    StatefulSet,
    /// DaemonSets.
    DaemonSet,
    /// ReplicaSets (owners between Deployments and pods).
    ReplicaSet,
    /// Jobs (and, through their owners, CronJobs).
    Job,
    /// HorizontalPodAutoscalers (autoscaling/v2).
    HorizontalPodAutoscaler,
    /// PodDisruptionBudgets.
    PodDisruptionBudget,
    /// Tailor NodePools (cluster-scoped).
    NodePool,
    /// Tailor NodeClaims (cluster-scoped).
    NodeClaim,
    /// AKSNodeClasses (cluster-scoped).
    AksNodeClass,
    /// RightsizingPolicies.
    RightsizingPolicy,
}

/// What right-sizing needs: pods and their owners, HPAs, and the policies.
pub const RIGHTSIZING: &[Kind] = &[
    Kind::Pod,
    Kind::Deployment,
    Kind::StatefulSet,
    Kind::DaemonSet,
    Kind::ReplicaSet,
    Kind::Job,
    Kind::HorizontalPodAutoscaler,
    Kind::RightsizingPolicy,
];

/// A client from a kubeconfig file, or (without one) from `$KUBECONFIG`,
/// `~/.kube/config` or the in-cluster service account, in that order; with the API
/// server's URL, for messages.
pub async fn client(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<(Client, String), ClusterError> {
    let config = config(kubeconfig, context).await?;
    let server = config.cluster_url.to_string();
    let client = Client::try_from(config).map_err(|e| ClusterError::Config {
        path: kubeconfig.map(|p| p.display().to_string()),
        message: e.to_string(),
    })?;
    Ok((client, server.trim_end_matches('/').to_string()))
}

/// A client for the agent's writes: as [`client`], without the client's own retries of
/// refused requests. kube's default policy retries a 429 up to 15 times with growing
/// pauses, so an eviction a PodDisruptionBudget refuses would hold a drain for minutes
/// instead of being tried again on the next pass, and a termination grace period could
/// not cut in. Every write is retried by its controller's next pass.
pub async fn write_client(kubeconfig: Option<&Path>) -> Result<Client, ClusterError> {
    let mut config = config(kubeconfig, None).await?;
    config.default_retry = false;
    Client::try_from(config).map_err(|e| ClusterError::Config {
        path: kubeconfig.map(|p| p.display().to_string()),
        message: e.to_string(),
    })
}

async fn config(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Config, ClusterError> {
    crate::telemetry::install_tls_provider();
    let options = KubeConfigOptions {
        context: context.map(str::to_string),
        ..KubeConfigOptions::default()
    };
    let path = kubeconfig.map(|p| p.display().to_string());
    let config_error = |message: String| ClusterError::Config {
        path: path.clone(),
        message,
    };
    let config = match kubeconfig {
        Some(file) => {
            let parsed = Kubeconfig::read_from(file).map_err(|e| config_error(e.to_string()))?;
            Config::from_custom_kubeconfig(parsed, &options)
                .await
                .map_err(|e| config_error(e.to_string()))?
        }
        None if context.is_some() => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| config_error(e.to_string()))?,
        None => Config::infer()
            .await
            .map_err(|e| config_error(e.to_string()))?,
    };
    Ok(config)
}

/// Lists `kinds` (in `namespaces`, or everywhere when empty) into a snapshot. A Tailor
/// resource whose CRD is not installed reads as none, with a warning; any other failed
/// list is an error and nothing is returned. `pending` says whether workloads are
/// expanded into pending pods for their missing replicas.
pub async fn read(
    client: &Client,
    server: &str,
    namespaces: &[String],
    kinds: &[Kind],
    pending: PendingPods,
) -> Result<Snapshot, ClusterError> {
    let reader = Reader {
        client,
        server,
        namespaces,
    };
    let mut objects = Vec::new();
    let mut warnings = Vec::new();
    for kind in kinds {
        let r = &reader;
        let listed = match kind {
            Kind::Pod => r.required::<Pod>(r.namespaced::<Pod>().await),
            Kind::Node => r.required::<Node>(r.cluster::<Node>().await),
            Kind::Deployment => r.required::<Deployment>(r.namespaced::<Deployment>().await),
            Kind::StatefulSet => r.required::<StatefulSet>(r.namespaced::<StatefulSet>().await),
            Kind::DaemonSet => r.required::<DaemonSet>(r.namespaced::<DaemonSet>().await),
            Kind::ReplicaSet => r.required::<ReplicaSet>(r.namespaced::<ReplicaSet>().await),
            Kind::Job => r.required::<Job>(r.namespaced::<Job>().await),
            Kind::HorizontalPodAutoscaler => r.required::<HorizontalPodAutoscaler>(
                r.namespaced::<HorizontalPodAutoscaler>().await,
            ),
            Kind::PodDisruptionBudget => {
                r.required::<PodDisruptionBudget>(r.namespaced::<PodDisruptionBudget>().await)
            }
            Kind::NodePool => r.optional::<NodePool>(r.cluster::<NodePool>().await, &mut warnings),
            Kind::NodeClaim => {
                r.optional::<NodeClaim>(r.cluster::<NodeClaim>().await, &mut warnings)
            }
            Kind::AksNodeClass => {
                r.optional::<AKSNodeClass>(r.cluster::<AKSNodeClass>().await, &mut warnings)
            }
            Kind::RightsizingPolicy => r.optional::<RightsizingPolicy>(
                r.namespaced::<RightsizingPolicy>().await,
                &mut warnings,
            ),
        }?;
        objects.extend(listed);
    }
    let mut snapshot = Snapshot::from_objects(&format!("cluster {server}"), objects, pending)?;
    snapshot.warnings.extend(warnings);
    Ok(snapshot)
}

/// One read's client, server (for messages) and namespace filter.
struct Reader<'a> {
    client: &'a Client,
    server: &'a str,
    namespaces: &'a [String],
}

/// Listed objects, each with its place in the listing (for error messages).
type Listed = Vec<(String, serde_yaml::Value)>;

/// A failed list: the namespace it was for, and the client's error.
type ListFailure = (Option<String>, kube::Error);

impl Reader<'_> {
    /// Every object of a namespaced kind, in each namespace of the filter.
    async fn namespaced<K>(&self) -> Result<Listed, ListFailure>
    where
        K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Serialize
            + std::fmt::Debug,
    {
        if self.namespaces.is_empty() {
            return self.cluster::<K>().await;
        }
        let mut out = Vec::new();
        for ns in self.namespaces {
            let api = Api::<K>::namespaced(self.client.clone(), ns);
            out.extend(pages(api).await.map_err(|e| (Some(ns.clone()), e))?);
        }
        Ok(out)
    }

    /// Every object of a kind, in every namespace for a namespaced one.
    async fn cluster<K>(&self) -> Result<Listed, ListFailure>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
    {
        pages(Api::<K>::all(self.client.clone()))
            .await
            .map_err(|e| (None, e))
    }

    /// A list the read cannot do without.
    fn required<K: Resource<DynamicType = ()>>(
        &self,
        listed: Result<Listed, ListFailure>,
    ) -> Result<Listed, ClusterError> {
        listed.map_err(|(ns, e)| self.error::<K>(ns, e))
    }

    /// A Tailor kind: none (with a warning) when its CRD is not installed.
    fn optional<K: Resource<DynamicType = ()>>(
        &self,
        listed: Result<Listed, ListFailure>,
        warnings: &mut Vec<String>,
    ) -> Result<Listed, ClusterError> {
        match listed {
            Err((_, kube::Error::Api(status))) if status.code == 404 => {
                warnings.push(format!(
                    "{} is not served by {} (CRD not installed?): none read",
                    K::plural(&()),
                    self.server
                ));
                Ok(Vec::new())
            }
            other => self.required::<K>(other),
        }
    }

    fn error<K: Resource<DynamicType = ()>>(
        &self,
        namespace: Option<String>,
        e: kube::Error,
    ) -> ClusterError {
        let message = match e {
            kube::Error::Api(status) => format!("HTTP {}: {}", status.code, status.message),
            other => other.to_string(),
        };
        ClusterError::List {
            resource: K::plural(&()).to_string(),
            namespace,
            server: self.server.to_string(),
            message,
        }
    }
}

/// All pages of one list.
async fn pages<K>(api: Api<K>) -> Result<Listed, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let mut params = ListParams::default().limit(PAGE_SIZE);
    let mut out = Vec::new();
    loop {
        let page = api.list(&params).await?;
        for item in page.items {
            let index = format!("{} item {}", K::kind(&()), out.len() + 1);
            let value = serde_yaml::to_value(&item).map_err(|e| {
                kube::Error::SerdeError(serde_json::Error::io(std::io::Error::other(e.to_string())))
            })?;
            out.push((index, value));
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
}
