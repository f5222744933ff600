//! The agent under the chart's ServiceAccount, against a real control plane: the RBAC the
//! real `helm` renders from deploy/charts/tailor is installed, a token is minted for the
//! ServiceAccount through the TokenRequest API, and `tailor run` (KWOK cloud) runs with only
//! that identity through leader election and a hand-over, provisioning, a drain held by a
//! PodDisruptionBudget until the NodeClaim's termination grace period, right-sizing (a real
//! Prometheus with usage: Recommendations and their checkpoints, policy statuses, the
//! webhook's configuration, an in-place resize the node cannot make and the eviction that
//! follows, pod templates patched by `RollingRestart`), consolidation of empty nodes, the
//! demand history the leader keeps in a ConfigMap, and
//! recommend-only reports that repeat (an Event series). No request is refused.
//!
//! Then every permission the chart grants (each verb on each resource of each rule) is
//! taken away in turn, the agent restarted, and the same scenario run again: each removal
//! must break it with a 403 for exactly that verb on that resource, as the API server's audit
//! log shows; a stall or an exit with no such refusal fails the test.
//! A permission whose removal breaks nothing is one the chart should not grant.

#[path = "support/control_plane.rs"]
#[allow(dead_code)] // shared with tests/agent.rs, which uses all of it
mod control_plane;
#[path = "support/helm.rs"]
mod helm;
#[path = "support/prometheus.rs"]
#[allow(dead_code)] // shared with the Prometheus tests, which use all of it
mod prometheus_server;

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use control_plane::{Agent, ControlPlane, list};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tailor::apis::{AKSNodeClass, NodeClaim, NodePool, Recommendation, RightsizingPolicy};

/// The chart's release namespace (tests/support/helm.rs renders into it).
const NAMESPACE: &str = "tailor";

/// Right-sizing on (a Prometheus URL; the agent is given the test's by flag), so the chart
/// renders its rules and the webhook's.
const VALUES: &str = "settings:\n  clusterName: e2e\n  cloud: kwok\n  prometheusUrl: http://prometheus:9090\n  rightsizingRollingRestart: true\n";

/// `default` consolidates at once and forces a drain 5 s after a NodeClaim's deletion;
/// `report` is recommend-only and only pods tolerating its taint may use it.
const POOLS: &str = r#"
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
      - {key: kubernetes.io/arch, operator: In, values: [amd64]}
      nodeClassRef: {group: tailor.sh, kind: AKSNodeClass, name: default}
      terminationGracePeriod: 5s
  disruption:
    consolidationPolicy: WhenEmptyOrUnderutilized
    consolidateAfter: 0s
    budgets: [{nodes: "100%"}]
---
apiVersion: tailor.sh/v1alpha1
kind: NodePool
metadata:
  name: report
  annotations: {tailor.sh/mode: recommend}
spec:
  template:
    spec:
      requirements:
      - {key: tailor.sh/sku-family, operator: In, values: [E]}
      - {key: tailor.sh/capacity-type, operator: In, values: [on-demand]}
      taints: [{key: example.com/report, effect: NoSchedule}]
      nodeClassRef: {group: tailor.sh, kind: AKSNodeClass, name: default}
"#;

/// Two pods that may not share a node, whose PDB refuses every eviction; and one pod for
/// the recommend-only pool.
const WORKLOADS: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 0
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - {topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {app: web}}}
      containers:
      - {name: app, image: registry.example/web:1, resources: {requests: {cpu: "1", memory: 2Gi}}}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: default}
spec:
  minAvailable: 2
  selector: {matchLabels: {app: web}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: report, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: report}}
  template:
    metadata: {labels: {app: report}}
    spec:
      terminationGracePeriodSeconds: 0
      nodeSelector: {tailor.sh/nodepool: report}
      tolerations: [{key: example.com/report, operator: Exists}]
      containers:
      - {name: app, image: registry.example/report:1, resources: {requests: {cpu: 500m, memory: 1Gi}}}
"#;

/// Right-sizing's part: a small node (1 CPU, too little memory for `web`) where `grow`'s
/// pods start, whose usage calls for more CPU than the node has (resized in place, found
/// Infeasible, evicted and replaced through the webhook on a node provisioned for it);
/// and a Deployment, a StatefulSet and a DaemonSet with no pods, whose pod templates
/// `RollingRestart` patches. Two policies select the latter, so one is `Overlapping`.
const RIGHTSIZING: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: rs-small
  annotations: {kwok.x-k8s.io/node: fake}
  labels: {kubernetes.io/hostname: rs-small, kubernetes.io/os: linux, kubernetes.io/arch: amd64}
status:
  capacity: {cpu: "1", memory: 1Gi, pods: "110"}
  allocatable: {cpu: "1", memory: 1Gi, pods: "110"}
---
apiVersion: tailor.sh/v1alpha1
kind: RightsizingPolicy
metadata: {name: in-place, namespace: default}
spec:
  mode: Auto
  update: {mode: InPlace, maxStepFraction: 0}
---
apiVersion: tailor.sh/v1alpha1
kind: RightsizingPolicy
metadata: {name: rolling, namespace: default}
spec:
  targetRefs:
  - {kind: Deployment, name: roll}
  - {kind: StatefulSet, name: db}
  - {kind: DaemonSet, name: ds}
  mode: Auto
  update: {mode: RollingRestart, maxStepFraction: 0}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: grow, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: grow}}
  template:
    metadata: {labels: {app: grow}}
    spec:
      terminationGracePeriodSeconds: 0
      containers:
      - {name: app, image: registry.example/grow:1, resources: {requests: {cpu: 100m, memory: 64Mi}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: roll, namespace: default}
spec:
  replicas: 0
  selector: {matchLabels: {app: roll}}
  template:
    metadata: {labels: {app: roll}}
    spec:
      containers:
      - {name: app, image: registry.example/roll:1, resources: {requests: {cpu: "2", memory: 2Gi}}}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, namespace: default}
spec:
  replicas: 0
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      containers:
      - {name: app, image: registry.example/db:1, resources: {requests: {cpu: "2", memory: 2Gi}}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: ds, namespace: default}
spec:
  selector: {matchLabels: {app: ds}}
  template:
    metadata: {labels: {app: ds}}
    spec:
      nodeSelector: {example.com/no-such-node: "true"}
      containers:
      - {name: app, image: registry.example/ds:1, resources: {requests: {cpu: "2", memory: 2Gi}}}
"#;

/// Two days of usage of right-sizing's workloads (pods named as their controllers name
/// them), one sample a minute, ending now: `grow` uses a steady core, the others little.
fn usage() -> String {
    prometheus_server::steady_usage(
        "default",
        &[
            ("grow-5d8f7c9b4-abcde", 1.0, 200.0),
            ("grow-5d8f7c9b4-fghij", 1.0, 200.0),
            ("roll-6c7d8e9f5-klmno", 0.2, 300.0),
            ("db-0", 0.2, 300.0),
            ("ds-pqrst", 0.2, 300.0),
        ],
    )
}

/// What right-sizing runs with: Prometheus, and the webhook's certificate (for 127.0.0.1)
/// and URL (the first agent's address; every agent applies the same configuration).
struct Rightsizing {
    prometheus_url: String,
    cert_dir: PathBuf,
    webhook_port: u16,
}

impl Rightsizing {
    fn write_certificate(dir: &std::path::Path) {
        let cert = tailor::webhook::certificate::generate(&["127.0.0.1".to_string()])
            .expect("a serving certificate");
        std::fs::create_dir_all(dir).expect("certificate dir");
        std::fs::write(dir.join("tls.crt"), &cert.cert_pem).expect("tls.crt");
        std::fs::write(dir.join("tls.key"), &cert.key_pem).expect("tls.key");
        std::fs::write(dir.join("ca.crt"), cert.ca_pem.unwrap_or_default()).expect("ca.crt");
    }

    /// The flags of the agent `index` (0: the one the API server calls).
    fn flags(&self, index: usize) -> Vec<String> {
        let port = if index == 0 {
            self.webhook_port
        } else {
            control_plane::free_port()
        };
        vec![
            "--prometheus-url".to_string(),
            self.prometheus_url.clone(),
            "--rightsizing-interval".to_string(),
            "2s".to_string(),
            "--rightsizing-rolling-restart".to_string(),
            "--webhook-address".to_string(),
            format!("127.0.0.1:{port}"),
            "--webhook-url".to_string(),
            format!("https://127.0.0.1:{}/mutate-pods", self.webhook_port),
            "--webhook-cert-dir".to_string(),
            self.cert_dir.to_string_lossy().into_owned(),
        ]
    }
}

/// The `tailor` field manager's entry on an object, if it wrote any of its fields.
fn managed_by_tailor(meta: &kube::api::ObjectMeta) -> bool {
    meta.managed_fields
        .iter()
        .flatten()
        .any(|m| m.manager.as_deref() == Some("tailor"))
}

/// Requests of a pod's first container.
fn pod_requests(p: &Pod) -> Vec<(String, String)> {
    p.spec
        .as_ref()
        .and_then(|s| s.containers[0].resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
        .unwrap_or_default()
}

/// One verb on one resource, as a role of the chart grants it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Permission {
    /// `ClusterRole/tailor-read` or `Role/tailor-leader-election`.
    role: String,
    group: String,
    /// With its subresource: `pods/eviction`.
    resource: String,
    verb: String,
    /// The rule's `resourceNames` (empty: any object).
    names: Vec<String>,
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{} {}/{}", self.verb, group, self.resource)
    }
}

/// The chart's RBAC, rendered by the real helm.
struct ChartRbac {
    service_account: String,
    /// Each ClusterRole and Role as rendered (JSON).
    roles: Vec<serde_json::Value>,
    /// ServiceAccount and bindings, created once.
    fixed: Vec<serde_json::Value>,
}

impl ChartRbac {
    fn render() -> ChartRbac {
        let objects = helm::render("tailor", VALUES).expect("the chart renders");
        let mut rbac = ChartRbac {
            service_account: String::new(),
            roles: Vec::new(),
            fixed: Vec::new(),
        };
        for object in objects {
            let object = serde_json::to_value(&object).expect("JSON");
            match object["kind"].as_str().unwrap_or_default() {
                "ServiceAccount" => {
                    rbac.service_account = object["metadata"]["name"]
                        .as_str()
                        .expect("a name")
                        .to_string();
                    rbac.fixed.push(object);
                }
                "ClusterRoleBinding" | "RoleBinding" => rbac.fixed.push(object),
                "ClusterRole" | "Role" => rbac.roles.push(object),
                _ => {}
            }
        }
        assert!(!rbac.service_account.is_empty(), "a ServiceAccount");
        assert!(!rbac.roles.is_empty(), "roles");
        rbac
    }

    /// Every (role, group, resource, verb) the roles grant.
    fn permissions(&self) -> Vec<Permission> {
        let mut out = Vec::new();
        for role in &self.roles {
            let name = format!(
                "{}/{}",
                role["kind"].as_str().expect("kind"),
                role["metadata"]["name"].as_str().expect("name")
            );
            let rules: Vec<PolicyRule> =
                serde_json::from_value(role["rules"].clone()).expect("rules");
            for rule in rules {
                for group in rule.api_groups.clone().unwrap_or_default() {
                    for resource in rule.resources.clone().unwrap_or_default() {
                        for verb in &rule.verbs {
                            out.push(Permission {
                                role: name.clone(),
                                group: group.clone(),
                                resource: resource.clone(),
                                verb: verb.clone(),
                                names: rule.resource_names.clone().unwrap_or_default(),
                            });
                        }
                    }
                }
            }
        }
        out
    }

    /// Applies every role with every permission but `removed`, one rule per permission.
    async fn apply_roles(&self, cp: &ControlPlane, removed: Option<&Permission>) {
        let all = self.permissions();
        for role in &self.roles {
            let kind = role["kind"].as_str().expect("kind");
            let name = role["metadata"]["name"].as_str().expect("name");
            let id = format!("{kind}/{name}");
            let rules: Vec<PolicyRule> = all
                .iter()
                .filter(|p| p.role == id && Some(*p) != removed)
                .map(|p| PolicyRule {
                    api_groups: Some(vec![p.group.clone()]),
                    resources: Some(vec![p.resource.clone()]),
                    verbs: vec![p.verb.clone()],
                    resource_names: (!p.names.is_empty()).then(|| p.names.clone()),
                    ..PolicyRule::default()
                })
                .collect();
            let mut body = role.clone();
            body["rules"] = serde_json::to_value(&rules).expect("rules");
            body["metadata"]
                .as_object_mut()
                .expect("metadata")
                .remove("labels");
            let params = PatchParams::apply("tailor-rbac-test").force();
            if kind == "ClusterRole" {
                let role: ClusterRole = serde_json::from_value(body).expect("ClusterRole");
                Api::<ClusterRole>::all(cp.client.clone())
                    .patch(name, &params, &Patch::Apply(&role))
                    .await
                    .expect("apply ClusterRole");
            } else {
                let role: Role = serde_json::from_value(body).expect("Role");
                Api::<Role>::namespaced(cp.client.clone(), NAMESPACE)
                    .patch(name, &params, &Patch::Apply(&role))
                    .await
                    .expect("apply Role");
            }
        }
    }

    /// Waits until the API server's authorizer grants exactly what the applied roles do.
    async fn wait_authorized(&self, cp: &ControlPlane, removed: Option<&Permission>) {
        let start = Instant::now();
        loop {
            let mut wrong = Vec::new();
            for p in self.permissions() {
                let allowed = self.allowed(cp, &p).await;
                if allowed != (Some(&p) != removed) {
                    wrong.push(format!("{p}: allowed={allowed}"));
                }
            }
            if wrong.is_empty() {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the authorizer disagrees with the roles: {wrong:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Whether the ServiceAccount may do `p`, by a SubjectAccessReview.
    async fn allowed(&self, cp: &ControlPlane, p: &Permission) -> bool {
        let (resource, subresource) = match p.resource.split_once('/') {
            Some((r, s)) => (r.to_string(), Some(s.to_string())),
            None => (p.resource.clone(), None),
        };
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(format!(
                    "system:serviceaccount:{NAMESPACE}:{}",
                    self.service_account
                )),
                groups: Some(vec![
                    "system:serviceaccounts".to_string(),
                    format!("system:serviceaccounts:{NAMESPACE}"),
                    "system:authenticated".to_string(),
                ]),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(p.group.clone()),
                    resource: Some(resource),
                    subresource,
                    verb: Some(p.verb.clone()),
                    name: p.names.first().cloned(),
                    namespace: p.role.starts_with("Role/").then(|| NAMESPACE.to_string()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        Api::<SubjectAccessReview>::all(cp.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .expect("SubjectAccessReview")
            .status
            .is_some_and(|s| s.allowed)
    }
}

/// Installs the namespace, the ServiceAccount and the bindings, and writes a kubeconfig
/// holding a token minted for the ServiceAccount.
async fn install(cp: &ControlPlane, rbac: &ChartRbac) -> PathBuf {
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).expect("namespace");
    Api::<Namespace>::all(cp.client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create the namespace");
    for object in &rbac.fixed {
        control_plane::create_value(&cp.client, object.clone())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
    control_plane::service_account_kubeconfig(cp, NAMESPACE, &rbac.service_account).await
}

/// Deletes everything a run left: workloads, NodeClaims, Nodes (their finalizers first),
/// pools, the Lease and Events, so the next run starts from the same cluster.
async fn reset(cp: &ControlPlane) {
    let c = cp.client.clone();
    let background = DeleteParams::background();
    let all = ListParams::default();
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::background()
    };
    let _ = Api::<Deployment>::namespaced(c.clone(), "default")
        .delete_collection(&background, &all)
        .await;
    let _ = Api::<ReplicaSet>::namespaced(c.clone(), "default")
        .delete_collection(&background, &all)
        .await;
    let _ = Api::<PodDisruptionBudget>::namespaced(c.clone(), "default")
        .delete_collection(&background, &all)
        .await;
    // Right-sizing's objects, so each run creates its Recommendations, statuses and the
    // webhook configuration afresh.
    let _ = Api::<StatefulSet>::namespaced(c.clone(), "default")
        .delete_collection(&background, &all)
        .await;
    let _ = Api::<DaemonSet>::namespaced(c.clone(), "default")
        .delete_collection(&background, &all)
        .await;
    let _ = Api::<Recommendation>::namespaced(c.clone(), "default")
        .delete_collection(&background, &all)
        .await;
    let _ = Api::<RightsizingPolicy>::namespaced(c.clone(), "default")
        .delete_collection(&background, &all)
        .await;
    let _ = Api::<MutatingWebhookConfiguration>::all(c.clone())
        .delete(tailor::webhook::CONFIGURATION_NAME, &background)
        .await;
    // The demand history the leader keeps, so each run creates it afresh.
    let _ = Api::<ConfigMap>::namespaced(c.clone(), NAMESPACE)
        .delete(tailor::controllers::demand::CONFIG_MAP, &background)
        .await;
    let no_finalizers = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    let claims = Api::<NodeClaim>::all(c.clone());
    for claim in list(&claims).await {
        let _ = claims
            .patch(&claim.name_any(), &PatchParams::default(), &no_finalizers)
            .await;
        let _ = claims.delete(&claim.name_any(), &background).await;
    }
    let nodes = Api::<Node>::all(c.clone());
    for node in list(&nodes).await {
        let _ = nodes
            .patch(&node.name_any(), &PatchParams::default(), &no_finalizers)
            .await;
        let _ = nodes.delete(&node.name_any(), &background).await;
    }
    let _ = Api::<NodePool>::all(c.clone())
        .delete_collection(&background, &all)
        .await;
    let _ = Api::<AKSNodeClass>::all(c.clone())
        .delete_collection(&background, &all)
        .await;
    let _ = Api::<Lease>::namespaced(c.clone(), NAMESPACE)
        .delete_collection(&background, &all)
        .await;
    let pods = Api::<Pod>::namespaced(c.clone(), "default");
    let start = Instant::now();
    loop {
        let _ = pods.delete_collection(&now, &all).await;
        let _ = Api::<Event>::namespaced(c.clone(), "default")
            .delete_collection(&background, &all)
            .await;
        let clean = list(&pods).await.is_empty()
            && list(&Api::<Recommendation>::namespaced(c.clone(), "default"))
                .await
                .is_empty()
            && list(&claims).await.is_empty()
            && list(&nodes).await.is_empty()
            && list(&Api::<NodePool>::all(c.clone())).await.is_empty();
        if clean {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the cluster did not empty between runs"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The cluster's NodeClaims, Nodes and pods, for a failure's message.
async fn state(cp: &ControlPlane) -> String {
    let mut out = String::new();
    for c in list(&Api::<NodeClaim>::all(cp.client.clone())).await {
        out += &format!(
            "nodeclaim {} deleting={} finalizers={:?} node={:?}\n",
            c.name_any(),
            c.metadata.deletion_timestamp.is_some(),
            c.finalizers(),
            c.status.as_ref().and_then(|s| s.node_name.clone())
        );
    }
    for n in list(&Api::<Node>::all(cp.client.clone())).await {
        let taints: Vec<String> = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|t| t.key)
            .collect();
        out += &format!(
            "node {} deleting={} finalizers={:?} taints={taints:?}\n",
            n.name_any(),
            n.metadata.deletion_timestamp.is_some(),
            n.finalizers()
        );
    }
    for p in list(&Api::<Pod>::namespaced(cp.client.clone(), "default")).await {
        out += &format!(
            "pod {} node={:?} phase={:?} deleting={}\n",
            p.name_any(),
            p.spec.as_ref().and_then(|s| s.node_name.clone()),
            p.status.as_ref().and_then(|s| s.phase.clone()),
            p.metadata.deletion_timestamp.is_some()
        );
    }
    out
}

/// Why a run of the scenario did not complete.
#[derive(Debug)]
enum Broken {
    /// The API server refused one of the agents' requests (403), as its audit log shows.
    Refused(Refusal),
    /// The agent exited: its last log line.
    Exited(String),
    /// A stage did not complete in time.
    Stalled(&'static str),
}

impl fmt::Display for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Broken::Refused(r) => write!(f, "403: {r}"),
            Broken::Exited(line) => write!(f, "agent exited without a 403: {}", excerpt(line)),
            Broken::Stalled(stage) => write!(f, "stalled without a 403: {stage}"),
        }
    }
}

/// A request of a ServiceAccount the API server answered 403, from its audit log.
#[derive(Debug, Clone, PartialEq)]
struct Refusal {
    verb: String,
    group: String,
    /// With its subresource: `pods/eviction`.
    resource: String,
    user: String,
}

impl Refusal {
    /// Whether this refusal is of `p`: its verb on its resource.
    fn of(&self, p: &Permission) -> bool {
        self.verb == p.verb && self.group == p.group && self.resource == p.resource
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(
            f,
            "{} {}/{} by {}",
            self.verb, group, self.resource, self.user
        )
    }
}

/// The API server's audit log (`scripts/control-plane` audits every request of a
/// ServiceAccount outside kube-system), read from where a run began.
struct Audit {
    path: PathBuf,
    offset: u64,
}

impl Audit {
    /// The log from its current end on.
    fn from_now(cp: &ControlPlane) -> Audit {
        let path = cp.dir().join("logs").join("audit.log");
        let offset = std::fs::metadata(&path).map_or(0, |m| m.len());
        Audit { path, offset }
    }

    /// The first refusal in the complete lines written since the last read.
    fn refusal(&mut self) -> Option<Refusal> {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = std::fs::File::open(&self.path).ok()?;
        file.seek(SeekFrom::Start(self.offset)).ok()?;
        let mut text = String::new();
        file.read_to_string(&mut text).ok()?;
        let complete = text.rfind('\n').map_or(0, |i| i + 1);
        self.offset += complete as u64;
        text[..complete].lines().find_map(|line| {
            let e: serde_json::Value = serde_json::from_str(line).ok()?;
            if e["responseStatus"]["code"].as_i64() != Some(403) {
                return None;
            }
            let o = &e["objectRef"];
            let resource = match o["subresource"].as_str() {
                Some(sub) => format!("{}/{sub}", o["resource"].as_str()?),
                None => o["resource"].as_str()?.to_string(),
            };
            // The verb authorization refused, which is not always the request's: a
            // server-side apply (a patch) of an object that does not exist yet needs
            // `create`, and its refusal says "cannot create".
            let message = e["responseStatus"]["message"].as_str().unwrap_or_default();
            let refused = message
                .split_once(" cannot ")
                .and_then(|(_, rest)| rest.split_whitespace().next());
            Some(Refusal {
                verb: refused.or(e["verb"].as_str())?.to_string(),
                group: o["apiGroup"].as_str().unwrap_or_default().to_string(),
                resource,
                user: e["user"]["username"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            })
        })
    }
}

/// The part of an agent's log line that says what went wrong.
fn excerpt(line: &str) -> String {
    line.chars()
        .rev()
        .take(110)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect()
}

/// The agents of a run: the leader first, and the follower of the hand-over; and the API
/// server's audit log since the run began.
struct Agents {
    all: Vec<Agent>,
    audit: Audit,
}

impl Agents {
    /// Fails fast on a refusal (a 403 in the API server's audit log) or an exit, else polls
    /// `probe` until it holds.
    async fn until<T, F, Fut>(
        &mut self,
        stage: &'static str,
        secs: u64,
        mut probe: F,
    ) -> Result<T, Broken>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let start = Instant::now();
        loop {
            if let Some(refusal) = self.audit.refusal() {
                return Err(Broken::Refused(refusal));
            }
            for agent in &mut self.all {
                let log = agent.log();
                if agent.exited() {
                    let last = log.lines().last().unwrap_or_default().to_string();
                    return Err(Broken::Exited(last));
                }
            }
            if let Some(v) = probe().await {
                return Ok(v);
            }
            if start.elapsed() > Duration::from_secs(secs) {
                for agent in &self.all {
                    eprintln!("{}:\n{}", agent.url, agent_metrics(&agent.url).await);
                }
                return Err(Broken::Stalled(stage));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

async fn leads(agent: &Agent) -> bool {
    let Ok(response) = reqwest::get(format!("{}/metrics", agent.url)).await else {
        return false;
    };
    response
        .text()
        .await
        .is_ok_and(|m| m.lines().any(|l| l == "tailor_leader 1"))
}

async fn ready(agent: &Agent) -> bool {
    reqwest::get(format!("{}/readyz", agent.url))
        .await
        .is_ok_and(|r| r.status().is_success())
}

/// Web pods Running, each on a node of its own.
async fn web_running(pods: &Api<Pod>) -> Option<BTreeSet<String>> {
    let listed = list(pods).await;
    let nodes: BTreeSet<String> = listed
        .iter()
        .filter(|p| p.labels().get("app").map(String::as_str) == Some("web"))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
        .collect();
    (nodes.len() == 2).then_some(nodes)
}

/// The scenario, with `kubeconfig`'s identity; with `hand_over`, a second replica takes
/// the lease from the first (killed) before consolidation.
async fn scenario(
    cp: &ControlPlane,
    kubeconfig: &std::path::Path,
    run: &str,
    hand_over: bool,
    rs: &Rightsizing,
) -> Result<(), Broken> {
    reset(cp).await;
    cp.apply_yaml(POOLS).await;
    cp.apply_yaml(RIGHTSIZING).await;
    let start = |name: &str, index: usize| {
        let mut flags: Vec<String> = ["--mode", "autonomous", "--gc-interval", "2s"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        flags.extend(rs.flags(index));
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        Agent::start_as(
            cp,
            kubeconfig,
            NAMESPACE,
            &format!("{run}-{name}"),
            &["--cloud", "kwok"],
            &flags,
            &[],
        )
    };
    // grow's pods run on the small node before any agent could provision for them.
    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "default");
    control_plane::eventually(
        Duration::from_secs(60),
        "grow's pods running on the small node",
        || async {
            let on_small = list(&pods)
                .await
                .iter()
                .filter(|p| p.name_any().starts_with("grow-"))
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .filter(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("rs-small")
                })
                .count();
            (on_small == 2).then_some(())
        },
    )
    .await;
    let mut agents = Agents {
        audit: Audit::from_now(cp),
        all: vec![start("a", 0)],
    };
    let first = &agents.all[0].url.clone();
    agents
        .until("ready and leading", 30, || async {
            let m = reqwest::get(format!("{first}/metrics")).await.ok()?;
            let text = m.text().await.ok()?;
            let ready = reqwest::get(format!("{first}/readyz")).await.ok()?;
            (ready.status().is_success() && text.lines().any(|l| l == "tailor_leader 1"))
                .then_some(())
        })
        .await?;
    if hand_over {
        agents.all.push(start("b", 1));
        let second = &agents.all[1];
        let url = second.url.clone();
        agents
            .until("the follower ready", 30, || async {
                let r = reqwest::get(format!("{url}/readyz")).await.ok()?;
                r.status().is_success().then_some(())
            })
            .await?;
        assert!(!leads(&agents.all[1]).await, "two leaders");
    }

    // 1. Provisioning: a node for each web pod, nominated, registered and initialized.
    cp.apply_yaml(WORKLOADS).await;
    let first_nodes = agents
        .until("provisioning: 2 web pods Running", 60, || {
            web_running(&pods)
        })
        .await?;

    // R. Right-sizing: Recommendations and their statuses (checkpoints), the policies'
    // statuses, the webhook configuration, an in-place resize the small node cannot make
    // and the eviction that follows (its replacement created with the recommendation by
    // the webhook, on a node provisioned for it), and pod templates patched.
    let recommendations: Api<Recommendation> = Api::namespaced(cp.client.clone(), "default");
    let policies: Api<RightsizingPolicy> = Api::namespaced(cp.client.clone(), "default");
    agents
        .until(
            "right-sizing: Recommendations with checkpoints, the webhook configured",
            60,
            || async {
                let l = list(&recommendations).await;
                let checkpointed = l
                    .iter()
                    .filter(|r| r.status.as_ref().is_some_and(|s| s.checkpoint.is_some()))
                    .count();
                let configured = Api::<MutatingWebhookConfiguration>::all(cp.client.clone())
                    .get_opt(tailor::webhook::CONFIGURATION_NAME)
                    .await
                    .ok()
                    .flatten()
                    .is_some();
                (checkpointed >= 4 && configured).then_some(())
            },
        )
        .await?;
    agents
        .until("right-sizing: the overlapping policy told", 30, || async {
            let p = policies.get_opt("in-place").await.ok().flatten()?;
            p.status?
                .conditions
                .iter()
                .any(|c| c.type_ == "Overlapping" && c.status == "True")
                .then_some(())
        })
        .await?;
    let grow = recommendations
        .get_opt("deployment-grow")
        .await
        .ok()
        .flatten()
        .ok_or(Broken::Stalled("right-sizing: grow's Recommendation"))?;
    let target: Vec<(String, String)> = grow
        .status
        .as_ref()
        .and_then(|s| s.containers.first())
        .map(|c| {
            c.recommended
                .requests
                .iter()
                .map(|(k, v)| (k.clone(), v.0.clone()))
                .collect()
        })
        .unwrap_or_default();
    agents
        .until(
            "right-sizing: a grow pod evicted and replaced with the recommendation",
            90,
            || async {
                list(&pods)
                    .await
                    .iter()
                    .any(|p| {
                        // Created with the new requests, it cannot fit the small node.
                        p.name_any().starts_with("grow-")
                            && p.spec
                                .as_ref()
                                .and_then(|s| s.node_name.as_deref())
                                .is_some_and(|n| n != "rs-small")
                            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                            && pod_requests(p) == target
                    })
                    .then_some(())
            },
        )
        .await?;
    agents
        .until("right-sizing: pod templates patched", 30, || async {
            let c = cp.client.clone();
            let d = Api::<Deployment>::namespaced(c.clone(), "default")
                .get("roll")
                .await
                .ok()?;
            let s = Api::<StatefulSet>::namespaced(c.clone(), "default")
                .get("db")
                .await
                .ok()?;
            let ds = Api::<DaemonSet>::namespaced(c, "default")
                .get("ds")
                .await
                .ok()?;
            (managed_by_tailor(&d.metadata)
                && managed_by_tailor(&s.metadata)
                && managed_by_tailor(&ds.metadata))
            .then_some(())
        })
        .await?;
    // grow goes, so its node empties for consolidation.
    Api::<Deployment>::namespaced(cp.client.clone(), "default")
        .delete("grow", &DeleteParams::background())
        .await
        .expect("delete grow");

    // 2. Drain: a deleted NodeClaim's node is cordoned, its pod's eviction refused by the
    // PDB until the claim's 5 s grace period ends, then deleted; a new node takes the pod.
    let claims: Api<NodeClaim> = Api::all(cp.client.clone());
    let victim = list(&claims)
        .await
        .into_iter()
        .find(|c| {
            c.status
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_some_and(|n| first_nodes.contains(n))
        })
        .expect("the claim of a web node");
    let victim_node = victim
        .status
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .expect("registered");
    claims
        .delete(&victim.name_any(), &DeleteParams::background())
        .await
        .expect("delete the claim");
    let nodes: Api<Node> = Api::all(cp.client.clone());
    agents
        .until("drain: the claim and its node gone", 60, || async {
            let claim = claims.get_opt(&victim.name_any()).await.ok()?;
            let node = nodes.get_opt(&victim_node).await.ok()?;
            (claim.is_none() && node.is_none()).then_some(())
        })
        .await?;
    agents
        .until("drain: the pod running on a new node", 60, || async {
            web_running(&pods)
                .await
                .filter(|now| !now.contains(&victim_node))
        })
        .await?;

    // 3. Leader election: the leader dies; the follower takes the lease and acts.
    if hand_over {
        agents.all[0].kill();
        agents.all.remove(0);
        let url = agents.all[0].url.clone();
        agents
            .until("hand-over: the follower leads", 45, || async {
                let m = reqwest::get(format!("{url}/metrics")).await.ok()?;
                let text = m.text().await.ok()?;
                text.lines().any(|l| l == "tailor_leader 1").then_some(())
            })
            .await?;
    }

    // 4. Consolidation: with no web pods left, the empty nodes are removed.
    Api::<Deployment>::namespaced(cp.client.clone(), "default")
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .expect("scale web to 0");
    agents
        .until("consolidation: empty nodes removed", 90, || async {
            let left = list(&claims).await;
            let left_nodes: Vec<Node> = list(&nodes)
                .await
                .into_iter()
                .filter(|n| n.name_any() != "rs-small")
                .collect();
            (left.is_empty() && left_nodes.is_empty()).then_some(())
        })
        .await?;

    // 5. Recommend-only reports repeat as one Event series.
    let events: Api<Event> = Api::namespaced(cp.client.clone(), "default");
    agents
        .until(
            "recommend-only: a repeated WouldProvision event",
            60,
            || async {
                list(&events)
                    .await
                    .into_iter()
                    .find(|e| {
                        e.reason.as_deref() == Some("WouldProvision")
                            && e.series.as_ref().is_some_and(|s| s.count >= 2)
                    })
                    .map(|_| ())
            },
        )
        .await?;
    for agent in &agents.all {
        assert!(ready(agent).await);
    }
    Ok(())
}

/// The agent's reconcile, eviction and leader series, for a failure's message.
async fn agent_metrics(url: &str) -> String {
    let Ok(r) = reqwest::get(format!("{url}/metrics")).await else {
        return String::new();
    };
    r.text()
        .await
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            [
                "reconcile_duration_seconds_count",
                "reconcile_errors",
                "evictions",
                "leader",
            ]
            .iter()
            .any(|k| l.contains(k))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_needs_every_permission_of_the_chart_and_no_other() {
    let prometheus = prometheus_server::start_prometheus(&usage()).await;
    let cp = ControlPlane::start().await;
    let cert_dir = cp.dir().join("webhook-cert");
    Rightsizing::write_certificate(&cert_dir);
    let rs = Rightsizing {
        prometheus_url: prometheus.url.clone(),
        cert_dir,
        webhook_port: control_plane::free_port(),
    };
    let rbac = ChartRbac::render();
    let kubeconfig = install(&cp, &rbac).await;
    rbac.apply_roles(&cp, None).await;
    rbac.wait_authorized(&cp, None).await;

    // Everything the chart grants: the whole scenario, with a hand-over, and no refusal.
    let started = Instant::now();
    if let Err(broken) = scenario(&cp, &kubeconfig, "full", true, &rs).await {
        let logs = std::fs::read_dir(cp.dir().join("logs"))
            .expect("logs")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("agent-full"))
            .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n---\n");
        panic!(
            "with the chart's RBAC the scenario failed: {broken}\n{}\n{logs}",
            state(&cp).await
        );
    }
    println!(
        "the chart's RBAC: scenario passed in {:.0} s",
        started.elapsed().as_secs_f64()
    );

    // Each permission taken away in turn.
    let started = Instant::now();
    let permissions = rbac.permissions();
    let mut table = Vec::new();
    for (i, removed) in permissions.iter().enumerate() {
        rbac.apply_roles(&cp, Some(removed)).await;
        rbac.wait_authorized(&cp, Some(removed)).await;
        let started = Instant::now();
        let outcome = scenario(&cp, &kubeconfig, &format!("without-{i}"), false, &rs).await;
        table.push((removed.clone(), outcome, started.elapsed()));
    }
    rbac.apply_roles(&cp, None).await;

    println!("\n{:<48} {:>6}  what broke", "permission removed", "secs");
    for (p, outcome, took) in &table {
        let what = match outcome {
            Ok(()) => "NOTHING: the scenario passed".to_string(),
            Err(b) => b.to_string(),
        };
        println!("{:<48} {:>6.1}  {what}", p.to_string(), took.as_secs_f64());
    }
    let unneeded: Vec<String> = table
        .iter()
        .filter(|(_, outcome, _)| outcome.is_ok())
        .map(|(p, _, _)| format!("{} ({})", p, p.role))
        .collect();
    assert!(
        unneeded.is_empty(),
        "the chart grants permissions the agent does not need: {unneeded:?}"
    );
    // Each break must be the API server refusing the permission taken away (a 403 for that
    // verb on that resource in its audit log): a stall or an exit without one, or a refusal
    // of another permission, is not the removal's doing.
    let wrong: Vec<String> = table
        .iter()
        .filter_map(|(p, outcome, _)| match outcome {
            Err(Broken::Refused(r)) if r.of(p) => None,
            Err(b) => Some(format!("{p}: {b}")),
            Ok(()) => None,
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "removals that broke the scenario without a 403 of their own: {wrong:?}"
    );
    println!(
        "{} permissions; each one's removal broke the scenario; {:.0} s in all",
        table.len(),
        started.elapsed().as_secs_f64()
    );
}
