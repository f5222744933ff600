//! Every write the agent makes to the cluster, in one place, so a reader can audit what
//! Tailor can change. Each write first checks leadership: a follower, or a leader that has
//! just lost its lease, writes nothing. The exception is the admission webhook's own
//! objects (its certificate Secret and its `MutatingWebhookConfiguration`): every replica
//! serves the webhook, so each must hold the shared certificate, and each applies the same
//! configuration, so replicas never contest it.
//!
//! Tailor's own objects are written with server-side apply (field manager `tailor`). Node
//! taints, labels and finalizers are a JSON merge patch guarded by the node's
//! `resourceVersion`: `spec.taints` is an atomic list shared with the node lifecycle
//! controller, so applying it would take it over.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{ConfigMap, Node, ObjectReference, Pod, Secret, Taint};
use kube::api::{DeleteParams, EvictParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::watch;

use crate::apis::labels::FIELD_MANAGER;
use crate::apis::{
    NodeClaim, NodeClaimStatus, NodePool, NodePoolStatus, Recommendation, RecommendationStatus,
    RightsizingPolicy, RightsizingPolicyStatus,
};

/// Why a write did not happen.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// This replica does not hold the leader lease.
    #[error("not the leader: {what} not written")]
    NotLeader {
        /// The write that was refused.
        what: String,
    },
    /// The eviction was refused (a PodDisruptionBudget, HTTP 429); try again later.
    #[error("eviction of {pod} refused: {message}")]
    EvictionRefused {
        /// `namespace/name`.
        pod: String,
        /// The API server's message.
        message: String,
    },
    /// The object changed since it was read; re-read and retry.
    #[error("{what}: conflict, the object changed")]
    Conflict {
        /// The write.
        what: String,
    },
    /// The API server refused or failed the write.
    #[error("{what}: {source}")]
    Api {
        /// The write.
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// A cluster other than an API server (the demo's simulated one) refused the write.
    #[error("{what}: {message}")]
    Refused {
        /// The write.
        what: String,
        /// Why.
        message: String,
    },
}

impl WriteError {
    /// A bounded label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            WriteError::NotLeader { .. } => "not_leader",
            WriteError::EvictionRefused { .. } => "eviction_refused",
            WriteError::Conflict { .. } => "conflict",
            WriteError::Api { .. } | WriteError::Refused { .. } => "api",
        }
    }
}

/// Result alias for writes.
pub type Result<T> = std::result::Result<T, WriteError>;

/// What the agent's writes need of a cluster: a Kubernetes API server behind a kube client
/// ([`KubeApi`]), or the demo's simulated cluster. Each operation has the semantics of the
/// API call [`KubeApi`] makes for it; a write to an object that is gone succeeds (there is
/// nothing left to change), except where a method says otherwise. Leadership is the
/// [`Writer`]'s concern, not the cluster's.
#[async_trait]
pub trait ClusterApi: Send + Sync {
    /// See [`Writer::ensure_secret`].
    async fn ensure_secret(
        &self,
        namespace: &str,
        wanted: &Secret,
        current: &(dyn for<'s> Fn(&'s Secret) -> bool + Send + Sync),
    ) -> Result<Secret>;
    /// See [`Writer::apply_webhook_configuration`].
    async fn apply_webhook_configuration(
        &self,
        configuration: &MutatingWebhookConfiguration,
    ) -> Result<()>;
    /// See [`Writer::apply_node_claim`].
    async fn apply_node_claim(&self, claim: &NodeClaim) -> Result<NodeClaim>;
    /// See [`Writer::label_node_claim`].
    async fn label_node_claim(&self, name: &str, labels: &BTreeMap<String, String>) -> Result<()>;
    /// See [`Writer::apply_node_claim_status`].
    async fn apply_node_claim_status(
        &self,
        name: &str,
        step: &str,
        status: &NodeClaimStatus,
    ) -> Result<()>;
    /// See [`Writer::config_map_value`].
    async fn config_map_value(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
    ) -> Result<Option<String>>;
    /// See [`Writer::apply_config_map_value`].
    async fn apply_config_map_value(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> Result<()>;
    /// See [`Writer::apply_node_pool_status`].
    async fn apply_node_pool_status(&self, name: &str, status: &NodePoolStatus) -> Result<()>;
    /// See [`Writer::apply_recommendation`].
    async fn apply_recommendation(&self, recommendation: &Recommendation) -> Result<()>;
    /// See [`Writer::apply_recommendation_status`].
    async fn apply_recommendation_status(
        &self,
        namespace: &str,
        name: &str,
        status: &RecommendationStatus,
    ) -> Result<()>;
    /// See [`Writer::apply_rightsizing_policy_status`].
    async fn apply_rightsizing_policy_status(
        &self,
        namespace: &str,
        name: &str,
        status: &RightsizingPolicyStatus,
    ) -> Result<()>;
    /// See [`Writer::delete_node_claim`].
    async fn delete_node_claim(&self, name: &str) -> Result<()>;
    /// See [`Writer::annotate_node_claim`].
    async fn annotate_node_claim(
        &self,
        name: &str,
        annotations: &BTreeMap<&str, Option<String>>,
    ) -> Result<()>;
    /// See [`Writer::remove_node_claim_finalizer`].
    async fn remove_node_claim_finalizer(&self, claim: &NodeClaim, finalizer: &str) -> Result<()>;
    /// See [`Writer::patch_node`].
    async fn patch_node(
        &self,
        node: &Node,
        taints: &[Taint],
        labels: &BTreeMap<String, String>,
        finalizers: &[String],
    ) -> Result<()>;
    /// See [`Writer::fresh_node`].
    async fn fresh_node(&self, name: &str) -> Result<Option<Node>>;
    /// See [`Writer::delete_node`].
    async fn delete_node(&self, name: &str) -> Result<()>;
    /// See [`Writer::evict`].
    async fn evict(&self, pod: &Pod) -> Result<()>;
    /// See [`Writer::nominate`].
    async fn nominate(&self, namespace: &str, name: &str, node: &str) -> Result<()>;
    /// See [`Writer::resize_pod`].
    async fn resize_pod(&self, resize: &crate::actuation::Resize) -> Result<()>;
    /// See [`Writer::apply_workload_template`].
    async fn apply_workload_template(&self, body: &serde_json::Value) -> Result<()>;
    /// See [`Writer::delete_pod`].
    async fn delete_pod(&self, pod: &Pod) -> Result<()>;
    /// See [`Writer::event`].
    async fn event(
        &self,
        object: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    );
}

/// The agent's only way to change the cluster: every write checks leadership, then goes to
/// the cluster's [`ClusterApi`].
#[derive(Clone)]
pub struct Writer {
    api: Arc<dyn ClusterApi>,
    leader: watch::Receiver<bool>,
}

fn api_error(what: String) -> impl FnOnce(kube::Error) -> WriteError {
    move |source| match &source {
        kube::Error::Api(s) if s.code == 409 => WriteError::Conflict { what },
        _ => WriteError::Api { what, source },
    }
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

impl Writer {
    /// A writer to the API server behind `client` that acts while `leader` says so; events
    /// are reported as `instance`.
    pub fn new(client: Client, leader: watch::Receiver<bool>, instance: &str) -> Self {
        Writer::with_api(Arc::new(KubeApi::new(client, instance)), leader)
    }

    /// A writer to any cluster that acts while `leader` says so.
    pub fn with_api(api: Arc<dyn ClusterApi>, leader: watch::Receiver<bool>) -> Self {
        Writer { api, leader }
    }

    /// Whether this replica holds the lease now.
    pub fn is_leader(&self) -> bool {
        *self.leader.borrow()
    }

    fn check(&self, what: impl FnOnce() -> String) -> Result<()> {
        if self.is_leader() {
            Ok(())
        } else {
            Err(WriteError::NotLeader { what: what() })
        }
    }

    /// The Secret `namespace/name` when `current` accepts it; else `wanted` written in its
    /// place (created, or replaced guarded by its resourceVersion). When another replica
    /// writes it first, its Secret is read back and used, so all replicas end with one.
    /// Any replica, leader or not.
    pub async fn ensure_secret(
        &self,
        namespace: &str,
        wanted: &Secret,
        current: impl Fn(&Secret) -> bool + Send + Sync,
    ) -> Result<Secret> {
        self.api.ensure_secret(namespace, wanted, &current).await
    }

    /// Applies the admission webhook's configuration (server-side apply). Any replica,
    /// leader or not: every replica applies the same content.
    pub async fn apply_webhook_configuration(
        &self,
        configuration: &MutatingWebhookConfiguration,
    ) -> Result<()> {
        self.api.apply_webhook_configuration(configuration).await
    }

    /// Creates (or re-applies) a NodeClaim.
    pub async fn apply_node_claim(&self, claim: &NodeClaim) -> Result<NodeClaim> {
        self.check(|| format!("apply nodeclaim {}", claim.name_any()))?;
        self.api.apply_node_claim(claim).await
    }

    /// Applies labels to a NodeClaim (what the launch learnt: type, zone, capacity type).
    pub async fn label_node_claim(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<()> {
        self.check(|| format!("label nodeclaim {name}"))?;
        self.api.label_node_claim(name, labels).await
    }

    /// Applies the part of a NodeClaim's status one lifecycle step owns (`step` names the
    /// field manager, `tailor-<step>`), leaving the other steps' conditions alone.
    pub async fn apply_node_claim_status(
        &self,
        name: &str,
        step: &str,
        status: &NodeClaimStatus,
    ) -> Result<()> {
        self.check(|| format!("status of nodeclaim {name}"))?;
        self.api.apply_node_claim_status(name, step, status).await
    }

    /// One key of the ConfigMap `namespace/name` where the agent keeps state across
    /// restarts and leaders; `None` when the ConfigMap or the key does not exist. Any
    /// replica: a new leader reads what the last one kept.
    pub async fn config_map_value(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
    ) -> Result<Option<String>> {
        self.api.config_map_value(namespace, name, key).await
    }

    /// Keeps `value` under `key` of the ConfigMap `namespace/name` (server-side apply,
    /// which creates it the first time).
    pub async fn apply_config_map_value(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> Result<()> {
        self.check(|| format!("apply configmap {namespace}/{name}"))?;
        self.api
            .apply_config_map_value(namespace, name, key, value)
            .await
    }

    /// Applies a NodePool's status (its conditions).
    pub async fn apply_node_pool_status(&self, name: &str, status: &NodePoolStatus) -> Result<()> {
        self.check(|| format!("status of nodepool {name}"))?;
        self.api.apply_node_pool_status(name, status).await
    }

    /// Creates or re-applies a Recommendation's metadata (its owner reference to the
    /// workload, so it is garbage-collected with it) and spec.
    pub async fn apply_recommendation(&self, recommendation: &Recommendation) -> Result<()> {
        self.check(|| {
            format!(
                "apply recommendation {}/{}",
                recommendation.namespace().unwrap_or_default(),
                recommendation.name_any()
            )
        })?;
        self.api.apply_recommendation(recommendation).await
    }

    /// Applies a Recommendation's status.
    pub async fn apply_recommendation_status(
        &self,
        namespace: &str,
        name: &str,
        status: &RecommendationStatus,
    ) -> Result<()> {
        self.check(|| format!("status of recommendation {namespace}/{name}"))?;
        self.api
            .apply_recommendation_status(namespace, name, status)
            .await
    }

    /// Applies a RightsizingPolicy's status (Ready, and how many workloads it governs).
    pub async fn apply_rightsizing_policy_status(
        &self,
        namespace: &str,
        name: &str,
        status: &RightsizingPolicyStatus,
    ) -> Result<()> {
        self.check(|| format!("status of rightsizingpolicy {namespace}/{name}"))?;
        self.api
            .apply_rightsizing_policy_status(namespace, name, status)
            .await
    }

    /// Deletes a NodeClaim (its finalizer then drains and terminates the node).
    pub async fn delete_node_claim(&self, name: &str) -> Result<()> {
        self.check(|| format!("delete nodeclaim {name}"))?;
        self.api.delete_node_claim(name).await
    }

    /// Sets (`Some`) or removes (`None`) annotations of a NodeClaim.
    pub async fn annotate_node_claim(
        &self,
        name: &str,
        annotations: &BTreeMap<&str, Option<String>>,
    ) -> Result<()> {
        self.check(|| format!("annotate nodeclaim {name}"))?;
        self.api.annotate_node_claim(name, annotations).await
    }

    /// Removes `finalizer` from a NodeClaim, guarded by the version that was read
    /// ([`WriteError::Conflict`] when it changed since).
    pub async fn remove_node_claim_finalizer(
        &self,
        claim: &NodeClaim,
        finalizer: &str,
    ) -> Result<()> {
        self.check(|| format!("finalizer of nodeclaim {}", claim.name_any()))?;
        self.api.remove_node_claim_finalizer(claim, finalizer).await
    }

    /// Sets a Node's taints, adds labels and sets its finalizers, guarded by the version
    /// that was read ([`WriteError::Conflict`] when it changed since).
    pub async fn patch_node(
        &self,
        node: &Node,
        taints: &[Taint],
        labels: &BTreeMap<String, String>,
        finalizers: &[String],
    ) -> Result<()> {
        self.check(|| format!("patch node {}", node.name_any()))?;
        self.api.patch_node(node, taints, labels, finalizers).await
    }

    /// The Node as the API server has it now, for a write retried after a conflict (the
    /// stores may lag behind). `None` when it is gone.
    pub async fn fresh_node(&self, name: &str) -> Result<Option<Node>> {
        self.api.fresh_node(name).await
    }

    /// Deletes a Node object.
    pub async fn delete_node(&self, name: &str) -> Result<()> {
        self.check(|| format!("delete node {name}"))?;
        self.api.delete_node(name).await
    }

    /// Evicts a pod through the Eviction API, so PodDisruptionBudgets are honoured
    /// ([`WriteError::EvictionRefused`] when one allows no disruption now).
    pub async fn evict(&self, pod: &Pod) -> Result<()> {
        self.check(|| {
            format!(
                "evict pod {}/{}",
                pod.namespace().unwrap_or_default(),
                pod.name_any()
            )
        })?;
        self.api.evict(pod).await
    }

    /// Records on a pending pod the node Tailor planned it onto (`status.nominatedNodeName`,
    /// KEP-5278): kube-scheduler then holds that node's room for the pod and tries the
    /// node first, so pods bind where the plan put them instead of crowding each other off
    /// the nodes bought for them.
    pub async fn nominate(&self, namespace: &str, name: &str, node: &str) -> Result<()> {
        self.check(|| format!("nominate node {node} for pod {namespace}/{name}"))?;
        self.api.nominate(namespace, name, node).await
    }

    /// Resizes a running pod's containers in place through the `resize` subresource.
    pub async fn resize_pod(&self, resize: &crate::actuation::Resize) -> Result<()> {
        self.check(|| format!("resize pod {}/{}", resize.namespace, resize.pod))?;
        self.api.resize_pod(resize).await
    }

    /// `RollingRestart`: applies (server-side, field manager `tailor`) the resource fields
    /// of a workload's pod template, as [`crate::actuation::template_apply`] builds them;
    /// the workload's controller then rolls its pods. Nothing else of the workload is
    /// touched, and other managers keep the fields they own.
    pub async fn apply_workload_template(&self, body: &serde_json::Value) -> Result<()> {
        self.check(|| {
            format!(
                "apply the pod template requests of {} {}/{}",
                body["kind"].as_str().unwrap_or_default(),
                body["metadata"]["namespace"].as_str().unwrap_or_default(),
                body["metadata"]["name"].as_str().unwrap_or_default()
            )
        })?;
        self.api.apply_workload_template(body).await
    }

    /// Deletes a pod outright (after a NodeClaim's termination grace period).
    pub async fn delete_pod(&self, pod: &Pod) -> Result<()> {
        self.check(|| {
            format!(
                "delete pod {}/{}",
                pod.namespace().unwrap_or_default(),
                pod.name_any()
            )
        })?;
        self.api.delete_pod(pod).await
    }

    /// Publishes an Event about `object`. Events are reports, so a follower may publish them
    /// too; a failure is logged, never fatal.
    pub async fn event(
        &self,
        object: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.api.event(object, type_, reason, action, note).await;
    }
}

/// The cluster behind a kube client: what `tailor run` writes to.
pub struct KubeApi {
    client: Client,
    recorder: Recorder,
}

impl KubeApi {
    /// Writes through `client`; events are reported as `instance`.
    pub fn new(client: Client, instance: &str) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "tailor".to_string(),
                instance: Some(instance.to_string()),
            },
        );
        KubeApi { client, recorder }
    }
}

fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

#[async_trait]
impl ClusterApi for KubeApi {
    async fn ensure_secret(
        &self,
        namespace: &str,
        wanted: &Secret,
        current: &(dyn for<'s> Fn(&'s Secret) -> bool + Send + Sync),
    ) -> Result<Secret> {
        let name = wanted.metadata.name.clone().unwrap_or_default();
        let what = || format!("secret {namespace}/{name}");
        let api = Api::<Secret>::namespaced(self.client.clone(), namespace);
        let mut last = None;
        for _ in 0..3 {
            let existing = api.get_opt(&name).await.map_err(api_error(what()))?;
            let written = match existing {
                Some(s) if current(&s) => return Ok(s),
                Some(s) => {
                    let mut body = wanted.clone();
                    body.metadata.resource_version = s.metadata.resource_version.clone();
                    api.replace(&name, &PostParams::default(), &body).await
                }
                None => api.create(&PostParams::default(), wanted).await,
            };
            match written {
                Ok(s) => return Ok(s),
                // Another replica wrote it between the read and the write: read it again.
                Err(kube::Error::Api(e)) if e.code == 409 => last = Some(e.message),
                Err(e) => return Err(api_error(what())(e)),
            }
        }
        Err(WriteError::Conflict {
            what: format!("{}: {}", what(), last.unwrap_or_default()),
        })
    }

    async fn apply_webhook_configuration(
        &self,
        configuration: &MutatingWebhookConfiguration,
    ) -> Result<()> {
        let name = configuration.metadata.name.clone().unwrap_or_default();
        let what = || format!("apply mutatingwebhookconfiguration {name}");
        Api::<MutatingWebhookConfiguration>::all(self.client.clone())
            .patch(&name, &apply_params(), &Patch::Apply(configuration))
            .await
            .map(|_| ())
            .map_err(api_error(what()))
    }

    async fn apply_node_claim(&self, claim: &NodeClaim) -> Result<NodeClaim> {
        let name = claim.name_any();
        let what = || format!("apply nodeclaim {name}");
        let mut body = claim.clone();
        body.status = None;
        body.metadata.managed_fields = None;
        body.metadata.resource_version = None;
        Api::<NodeClaim>::all(self.client.clone())
            .patch(&name, &apply_params(), &Patch::Apply(&body))
            .await
            .map_err(api_error(what()))
    }

    async fn label_node_claim(&self, name: &str, labels: &BTreeMap<String, String>) -> Result<()> {
        let what = || format!("label nodeclaim {name}");
        let body = json!({
            "apiVersion": NodeClaim::api_version(&()),
            "kind": NodeClaim::kind(&()),
            "metadata": {"name": name, "labels": labels},
        });
        Api::<NodeClaim>::all(self.client.clone())
            .patch(
                name,
                &PatchParams::apply(&format!("{FIELD_MANAGER}-launch")).force(),
                &Patch::Apply(&body),
            )
            .await
            .map(|_| ())
            .map_err(api_error(what()))
    }

    async fn apply_node_claim_status(
        &self,
        name: &str,
        step: &str,
        status: &NodeClaimStatus,
    ) -> Result<()> {
        let what = || format!("status of nodeclaim {name}");
        let body = json!({
            "apiVersion": NodeClaim::api_version(&()),
            "kind": NodeClaim::kind(&()),
            "metadata": {"name": name},
            "status": status,
        });
        match Api::<NodeClaim>::all(self.client.clone())
            .patch_status(
                name,
                &PatchParams::apply(&format!("{FIELD_MANAGER}-{step}")).force(),
                &Patch::Apply(&body),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(api_error(what())(e)),
        }
    }

    async fn config_map_value(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
    ) -> Result<Option<String>> {
        let what = || format!("read configmap {namespace}/{name}");
        let found = Api::<ConfigMap>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(api_error(what()))?;
        Ok(found.and_then(|c| c.data).and_then(|mut d| d.remove(key)))
    }

    async fn apply_config_map_value(
        &self,
        namespace: &str,
        name: &str,
        key: &str,
        value: &str,
    ) -> Result<()> {
        let what = || format!("apply configmap {namespace}/{name}");
        let body = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/managed-by": "tailor"},
            },
            "data": {key: value},
        });
        Api::<ConfigMap>::namespaced(self.client.clone(), namespace)
            .patch(name, &apply_params(), &Patch::Apply(&body))
            .await
            .map(|_| ())
            .map_err(api_error(what()))
    }

    async fn apply_node_pool_status(&self, name: &str, status: &NodePoolStatus) -> Result<()> {
        let what = || format!("status of nodepool {name}");
        let body = json!({
            "apiVersion": NodePool::api_version(&()),
            "kind": NodePool::kind(&()),
            "metadata": {"name": name},
            "status": status,
        });
        match Api::<NodePool>::all(self.client.clone())
            .patch_status(name, &apply_params(), &Patch::Apply(&body))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(api_error(what())(e)),
        }
    }

    async fn apply_recommendation(&self, recommendation: &Recommendation) -> Result<()> {
        let (ns, name) = (
            recommendation.namespace().unwrap_or_default(),
            recommendation.name_any(),
        );
        let what = || format!("apply recommendation {ns}/{name}");
        let body = json!({
            "apiVersion": Recommendation::api_version(&()),
            "kind": Recommendation::kind(&()),
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": recommendation.labels(),
                "ownerReferences": recommendation.owner_references(),
            },
            "spec": recommendation.spec,
        });
        Api::<Recommendation>::namespaced(self.client.clone(), &ns)
            .patch(&name, &apply_params(), &Patch::Apply(&body))
            .await
            .map(|_| ())
            .map_err(api_error(what()))
    }

    async fn apply_recommendation_status(
        &self,
        namespace: &str,
        name: &str,
        status: &RecommendationStatus,
    ) -> Result<()> {
        let what = || format!("status of recommendation {namespace}/{name}");
        let body = json!({
            "apiVersion": Recommendation::api_version(&()),
            "kind": Recommendation::kind(&()),
            "metadata": {"name": name, "namespace": namespace},
            "status": status,
        });
        match Api::<Recommendation>::namespaced(self.client.clone(), namespace)
            .patch_status(name, &apply_params(), &Patch::Apply(&body))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(api_error(what())(e)),
        }
    }

    async fn apply_rightsizing_policy_status(
        &self,
        namespace: &str,
        name: &str,
        status: &RightsizingPolicyStatus,
    ) -> Result<()> {
        let what = || format!("status of rightsizingpolicy {namespace}/{name}");
        let body = json!({
            "apiVersion": RightsizingPolicy::api_version(&()),
            "kind": RightsizingPolicy::kind(&()),
            "metadata": {"name": name, "namespace": namespace},
            "status": status,
        });
        match Api::<RightsizingPolicy>::namespaced(self.client.clone(), namespace)
            .patch_status(name, &apply_params(), &Patch::Apply(&body))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(api_error(what())(e)),
        }
    }

    async fn delete_node_claim(&self, name: &str) -> Result<()> {
        let what = || format!("delete nodeclaim {name}");
        match Api::<NodeClaim>::all(self.client.clone())
            .delete(name, &DeleteParams::background())
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(api_error(what())(e)),
        }
    }

    async fn annotate_node_claim(
        &self,
        name: &str,
        annotations: &BTreeMap<&str, Option<String>>,
    ) -> Result<()> {
        let what = || format!("annotate nodeclaim {name}");
        let body = json!({"metadata": {"annotations": annotations}});
        match Api::<NodeClaim>::all(self.client.clone())
            .patch(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(api_error(what())(e)),
        }
    }

    async fn remove_node_claim_finalizer(&self, claim: &NodeClaim, finalizer: &str) -> Result<()> {
        let name = claim.name_any();
        let what = || format!("finalizer of nodeclaim {name}");
        let kept: Vec<&String> = claim
            .finalizers()
            .iter()
            .filter(|f| *f != finalizer)
            .collect();
        let body =
            json!({"metadata": {"finalizers": kept, "resourceVersion": claim.resource_version()}});
        match Api::<NodeClaim>::all(self.client.clone())
            .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(api_error(what())(e)),
        }
    }

    async fn patch_node(
        &self,
        node: &Node,
        taints: &[Taint],
        labels: &BTreeMap<String, String>,
        finalizers: &[String],
    ) -> Result<()> {
        let name = node.name_any();
        let what = || format!("patch node {name}");
        let body = json!({
            "metadata": {
                "labels": labels,
                "finalizers": finalizers,
                "resourceVersion": node.resource_version(),
            },
            "spec": {"taints": taints},
        });
        match Api::<Node>::all(self.client.clone())
            .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(api_error(what())(e)),
        }
    }

    async fn fresh_node(&self, name: &str) -> Result<Option<Node>> {
        Api::<Node>::all(self.client.clone())
            .get_opt(name)
            .await
            .map_err(api_error(format!("get node {name}")))
    }

    async fn delete_node(&self, name: &str) -> Result<()> {
        let what = || format!("delete node {name}");
        match Api::<Node>::all(self.client.clone())
            .delete(name, &DeleteParams::background())
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(api_error(what())(e)),
        }
    }

    async fn evict(&self, pod: &Pod) -> Result<()> {
        let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        let key = format!("{ns}/{name}");
        let what = || format!("evict pod {key}");
        let params = EvictParams {
            delete_options: Some(DeleteParams {
                preconditions: pod.uid().map(|uid| Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            }),
            post_options: PostParams::default(),
        };
        match Api::<Pod>::namespaced(self.client.clone(), &ns)
            .evict(&name, &params)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 429 => Err(WriteError::EvictionRefused {
                pod: key,
                message: s.message,
            }),
            Err(e) => Err(api_error(what())(e)),
        }
    }

    async fn nominate(&self, namespace: &str, name: &str, node: &str) -> Result<()> {
        let what = || format!("nominate node {node} for pod {namespace}/{name}");
        let body = json!({"status": {"nominatedNodeName": node}});
        match Api::<Pod>::namespaced(self.client.clone(), namespace)
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(api_error(what())(e)),
        }
    }

    async fn resize_pod(&self, resize: &crate::actuation::Resize) -> Result<()> {
        let (ns, name) = (&resize.namespace, &resize.pod);
        let what = || format!("resize pod {ns}/{name}");
        let containers: Vec<serde_json::Value> = resize
            .containers
            .iter()
            .map(|c| {
                let mut resources = json!({"requests": c.requests});
                if !c.limits.is_empty() {
                    resources["limits"] = json!(c.limits);
                }
                json!({"name": c.name, "resources": resources})
            })
            .collect();
        let body = json!({"spec": {"containers": containers}});
        match Api::<Pod>::namespaced(self.client.clone(), ns)
            .patch_resize(name, &PatchParams::default(), &Patch::Strategic(&body))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(api_error(what())(e)),
        }
    }

    async fn apply_workload_template(&self, body: &serde_json::Value) -> Result<()> {
        use kube::api::DynamicObject;
        use kube::discovery::ApiResource;
        let (kind, ns, name) = (
            body["kind"].as_str().unwrap_or_default(),
            body["metadata"]["namespace"].as_str().unwrap_or_default(),
            body["metadata"]["name"].as_str().unwrap_or_default(),
        );
        let what = || format!("apply the pod template requests of {kind} {ns}/{name}");
        let resource = ApiResource {
            group: "apps".to_string(),
            version: "v1".to_string(),
            api_version: "apps/v1".to_string(),
            kind: kind.to_string(),
            plural: format!("{}s", kind.to_ascii_lowercase()),
        };
        let object: DynamicObject =
            serde_json::from_value(body.clone()).map_err(|e| WriteError::Api {
                what: what(),
                source: kube::Error::SerdeError(e),
            })?;
        match Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, &resource)
            .patch(name, &apply_params(), &Patch::Apply(&object))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(api_error(what())(e)),
        }
    }

    async fn delete_pod(&self, pod: &Pod) -> Result<()> {
        let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        let what = || format!("delete pod {ns}/{name}");
        match Api::<Pod>::namespaced(self.client.clone(), &ns)
            .delete(&name, &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(api_error(what())(e)),
        }
    }

    async fn event(
        &self,
        object: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: action.to_string(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, object).await {
            tracing::warn!(reason, error = %e, "publishing an event failed");
        }
    }
}
