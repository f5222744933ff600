//! The agent under the chart's ServiceAccount, against a real control plane: the RBAC the
//! real `helm` renders from deploy/charts/tailor is installed, a token is minted for the
//! ServiceAccount through the TokenRequest API, and `tailor run` (KWOK cloud) runs with only
//! that identity through leader election and a hand-over, provisioning, a drain held by a
//! PodDisruptionBudget until the NodeClaim's termination grace period, consolidation of empty
//! nodes, and recommend-only reports that repeat (an Event series). No request is refused.
//!
//! Then every permission the chart grants (each verb on each resource of each rule) is
//! taken away in turn, the agent restarted, and the same scenario run again: each removal
//! must break it (a 403 in the agent's log, the agent exiting, or a stage not completing).
//! A permission whose removal breaks nothing is one the chart should not grant.

#[path = "support/control_plane.rs"]
#[allow(dead_code)] // shared with tests/agent.rs, which uses all of it
mod control_plane;
#[path = "support/helm.rs"]
mod helm;

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use control_plane::{Agent, ControlPlane, list};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tailor::apis::{AKSNodeClass, NodeClaim, NodePool};

/// The chart's release namespace (tests/support/helm.rs renders into it).
const NAMESPACE: &str = "tailor";

const VALUES: &str = "settings:\n  clusterName: e2e\n  cloud: kwok\n";

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

/// One verb on one resource, as a role of the chart grants it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Permission {
    /// `ClusterRole/tailor-read` or `Role/tailor-leader-election`.
    role: String,
    group: String,
    /// With its subresource: `pods/eviction`.
    resource: String,
    verb: String,
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
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let token = Api::<ServiceAccount>::namespaced(cp.client.clone(), NAMESPACE)
        .create_token_request(&rbac.service_account, &PostParams::default(), &request)
        .await
        .expect("a token for the ServiceAccount")
        .status
        .expect("token status")
        .token;
    // The admin's kubeconfig with its client certificate swapped for the token.
    let text = std::fs::read_to_string(&cp.kubeconfig).expect("admin kubeconfig");
    let mut config: serde_yaml::Value = serde_yaml::from_str(&text).expect("kubeconfig YAML");
    let users = config["users"].as_sequence_mut().expect("users");
    assert_eq!(users.len(), 1, "one user in the admin kubeconfig");
    users[0]["user"] = serde_yaml::to_value(json!({"token": token})).expect("user");
    let path = cp.dir().join("serviceaccount.kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&config).expect("YAML")).expect("write");
    path
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
    /// The API server refused a request: the agent's log line.
    Forbidden(String),
    /// The agent exited: its last log line.
    Exited(String),
    /// A stage did not complete in time.
    Stalled(&'static str),
}

impl fmt::Display for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Broken::Forbidden(line) => write!(f, "403: {}", excerpt(line)),
            Broken::Exited(line) => write!(f, "agent exited: {}", excerpt(line)),
            Broken::Stalled(stage) => write!(f, "stalled: {stage}"),
        }
    }
}

/// The part of a refusal that says what was refused.
fn excerpt(line: &str) -> String {
    let line = line.replace("\\\"", "\"");
    let from = line.find("cannot ").unwrap_or(0);
    let text = &line[from..];
    let end = [
        " at the cluster scope",
        " in the namespace",
        ": RBAC",
        ": Forbidden",
    ]
    .iter()
    .filter_map(|s| text.find(s))
    .min()
    .unwrap_or(text.len());
    text[..end].chars().take(110).collect()
}

/// The first refusal in an agent's log.
fn forbidden(log: &str) -> Option<String> {
    log.lines()
        .find(|l| l.to_ascii_lowercase().contains("forbidden"))
        .map(str::to_string)
}

/// The agents of a run: the leader first, and the follower of the hand-over.
struct Agents {
    all: Vec<Agent>,
}

impl Agents {
    /// Fails fast on a refusal or an exit, else polls `probe` until it holds.
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
            for agent in &mut self.all {
                let log = agent.log();
                if let Some(line) = forbidden(&log) {
                    return Err(Broken::Forbidden(line));
                }
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
) -> Result<(), Broken> {
    reset(cp).await;
    cp.apply_yaml(POOLS).await;
    let start = |name: &str| {
        Agent::start_as(
            cp,
            kubeconfig,
            NAMESPACE,
            &format!("{run}-{name}"),
            &["--cloud", "kwok"],
            &["--mode", "autonomous", "--gc-interval", "2s"],
            &[],
        )
    };
    let mut agents = Agents {
        all: vec![start("a")],
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
        agents.all.push(start("b"));
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
    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "default");
    let first_nodes = agents
        .until("provisioning: 2 web pods Running", 60, || {
            web_running(&pods)
        })
        .await?;

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
            let left_nodes = list(&nodes).await;
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
    let cp = ControlPlane::start().await;
    let rbac = ChartRbac::render();
    let kubeconfig = install(&cp, &rbac).await;
    rbac.apply_roles(&cp, None).await;
    rbac.wait_authorized(&cp, None).await;

    // Everything the chart grants: the whole scenario, with a hand-over, and no refusal.
    let started = Instant::now();
    if let Err(broken) = scenario(&cp, &kubeconfig, "full", true).await {
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
        let outcome = scenario(&cp, &kubeconfig, &format!("without-{i}"), false).await;
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
    // A refusal must name the permission taken away: the break is the removal's doing.
    let wrong: Vec<String> = table
        .iter()
        .filter_map(|(p, outcome, _)| match outcome {
            Err(Broken::Forbidden(line)) => {
                let resource = p.resource.split('/').next().unwrap_or_default();
                (!(line.contains(&p.verb) && line.contains(resource)))
                    .then(|| format!("{p}: {line}"))
            }
            _ => None,
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "refusals of another permission: {wrong:?}"
    );
    println!(
        "{} permissions; each one's removal broke the scenario; {:.0} s in all",
        table.len(),
        started.elapsed().as_secs_f64()
    );
}
