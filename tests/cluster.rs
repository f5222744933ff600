//! Reading the cluster through the Kubernetes API: the real `kube` client against a fake
//! API server that speaks the wire format. Objects listed from the API must make the same
//! snapshot as the same objects in a file, page by page; failures name the resource.

#[path = "support/apiserver.rs"]
mod apiserver;
#[path = "support/bin.rs"]
mod bin;

use apiserver::{Fake, FakeApiServer, objects_from_yaml};
use bin::tailor;
use tailor::state::cluster::{self, Kind};
use tailor::state::{PendingPods, Snapshot};

const OBJECTS: &str = "
apiVersion: tailor.sh/v1alpha1
kind: RightsizingPolicy
metadata: {name: default, namespace: tailor}
spec:
  update: {maxStepFraction: 1.0}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: api, namespace: shop, uid: d1}
spec:
  replicas: 2
  selector: {matchLabels: {app: api}}
  template:
    metadata: {labels: {app: api}}
    spec:
      containers:
      - {name: app, image: shop/api, resources: {requests: {cpu: 500m, memory: 1Gi}}}
---
apiVersion: apps/v1
kind: ReplicaSet
metadata:
  name: api-7d9f
  namespace: shop
  uid: r1
  ownerReferences: [{apiVersion: apps/v1, kind: Deployment, name: api, uid: d1, controller: true}]
spec:
  replicas: 2
  selector: {matchLabels: {app: api}}
  template:
    metadata: {labels: {app: api}}
    spec:
      containers:
      - {name: app, image: shop/api, resources: {requests: {cpu: 500m, memory: 1Gi}}}
---
apiVersion: v1
kind: Pod
metadata:
  name: api-7d9f-a
  namespace: shop
  ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: api-7d9f, uid: r1, controller: true}]
spec:
  containers:
  - {name: app, image: shop/api, resources: {requests: {cpu: 500m, memory: 1Gi}}}
---
apiVersion: v1
kind: Pod
metadata:
  name: api-7d9f-b
  namespace: shop
  ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: api-7d9f, uid: r1, controller: true}]
spec:
  containers:
  - {name: app, image: shop/api, resources: {requests: {cpu: 500m, memory: 1Gi}}}
---
apiVersion: v1
kind: Pod
metadata: {name: tool, namespace: ops}
spec:
  containers:
  - {name: main, image: ops/tool, resources: {requests: {cpu: 100m, memory: 64Mi}}}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: api, namespace: shop}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: api}
  maxReplicas: 10
  metrics:
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 70}}
";

fn names(snapshot: &Snapshot) -> Vec<String> {
    let mut out: Vec<String> = snapshot
        .pods
        .iter()
        .map(|p| {
            format!(
                "Pod {}/{}",
                p.metadata.namespace.as_deref().unwrap_or(""),
                p.metadata.name.as_deref().unwrap_or("")
            )
        })
        .chain(
            snapshot
                .deployments
                .iter()
                .map(|d| format!("Deployment {:?}", d.metadata.name)),
        )
        .chain(
            snapshot
                .replica_sets
                .iter()
                .map(|d| format!("ReplicaSet {:?}", d.metadata.name)),
        )
        .chain(
            snapshot
                .horizontal_pod_autoscalers
                .iter()
                .map(|d| format!("HPA {:?}", d.metadata.name)),
        )
        .chain(
            snapshot
                .rightsizing_policies
                .iter()
                .map(|d| format!("RightsizingPolicy {:?}", d.metadata.name)),
        )
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn objects_listed_page_by_page_make_the_same_snapshot_as_the_file() {
    let server = FakeApiServer::start(Fake {
        objects: objects_from_yaml(OBJECTS),
        page_size: 1,
        crds: true,
        ..Fake::default()
    })
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = server.kubeconfig(dir.path());
    let (client, url) = cluster::client(Some(&kubeconfig), None)
        .await
        .expect("client from the kubeconfig");
    assert_eq!(url, server.url);
    let listed = cluster::read(
        &client,
        &url,
        &[],
        cluster::RIGHTSIZING,
        PendingPods::Expand,
    )
    .await
    .expect("cluster read");
    let file = Snapshot::from_yaml("objects.yaml", OBJECTS).expect("file parses");
    assert_eq!(names(&listed), names(&file));
    assert_eq!(listed.pods, file.pods);
    assert!(listed.warnings.is_empty(), "{:?}", listed.warnings);
    // Two pods at one per page: the second page was asked for with the first's token.
    let requests = server.requests();
    assert!(
        requests
            .iter()
            .any(|r| r.starts_with("/api/v1/pods?") && r.contains("continue=1")),
        "{requests:?}"
    );
}

#[tokio::test]
async fn a_namespace_filter_lists_only_those_namespaces() {
    let server = FakeApiServer::start(Fake {
        objects: objects_from_yaml(OBJECTS),
        crds: true,
        ..Fake::default()
    })
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let (client, url) = cluster::client(Some(&server.kubeconfig(dir.path())), None)
        .await
        .expect("client");
    let listed = cluster::read(
        &client,
        &url,
        &["ops".to_string()],
        &[Kind::Pod],
        PendingPods::Expand,
    )
    .await
    .expect("cluster read");
    assert_eq!(listed.pods.len(), 1);
    assert_eq!(listed.pods[0].metadata.name.as_deref(), Some("tool"));
    assert!(
        server
            .requests()
            .iter()
            .all(|r| r.starts_with("/api/v1/namespaces/ops/pods"))
    );
}

#[tokio::test]
async fn missing_crds_read_as_none_with_a_warning() {
    let server = FakeApiServer::start(Fake {
        objects: objects_from_yaml(OBJECTS),
        crds: false,
        ..Fake::default()
    })
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let (client, url) = cluster::client(Some(&server.kubeconfig(dir.path())), None)
        .await
        .expect("client");
    let listed = cluster::read(
        &client,
        &url,
        &[],
        cluster::RIGHTSIZING,
        PendingPods::Expand,
    )
    .await
    .expect("a read without the CRDs still works");
    assert!(listed.rightsizing_policies.is_empty());
    assert_eq!(listed.deployments.len(), 1);
    assert!(
        listed
            .warnings
            .iter()
            .any(|w| w.contains("rightsizingpolicies") && w.contains(&server.url)),
        "{:?}",
        listed.warnings
    );
}

#[tokio::test]
async fn an_invalid_object_from_the_cluster_is_named_with_its_field() {
    let bad = OBJECTS.replace("cpu: 100m, memory: 64Mi", "cpu: lots, memory: 64Mi");
    let server = FakeApiServer::start(Fake {
        objects: objects_from_yaml(&bad),
        crds: true,
        ..Fake::default()
    })
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let (client, url) = cluster::client(Some(&server.kubeconfig(dir.path())), None)
        .await
        .expect("client");
    let err = cluster::read(
        &client,
        &url,
        &[],
        cluster::RIGHTSIZING,
        PendingPods::Expand,
    )
    .await
    .expect_err("a bad quantity is refused")
    .to_string();
    assert!(
        err.contains("Pod ops/tool") && err.contains("lots") && err.contains(&server.url),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_list_fails_recommend_naming_the_resource_and_prints_nothing() {
    let server = FakeApiServer::start(Fake {
        objects: objects_from_yaml(OBJECTS),
        crds: true,
        forbidden: ["pods".to_string()].into(),
        ..Fake::default()
    })
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = server.kubeconfig(dir.path());
    let (ok, stdout, stderr) = tokio::task::spawn_blocking(move || {
        tailor(&[
            "recommend",
            "--prometheus-url",
            "http://127.0.0.1:1",
            "--kubeconfig",
            kubeconfig.to_str().expect("utf-8"),
            "-o",
            "json",
        ])
    })
    .await
    .expect("joined");
    assert!(!ok);
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("listing pods") && stderr.contains("403") && stderr.contains("forbidden"),
        "{stderr}"
    );
}

#[test]
fn snapshot_and_kubeconfig_are_exclusive_and_one_is_required() {
    let (ok, _, stderr) = tailor(&["recommend", "--prometheus-url", "http://127.0.0.1:1"]);
    assert!(!ok);
    assert!(stderr.contains("--snapshot"), "{stderr}");
    let (ok, _, stderr) = tailor(&[
        "recommend",
        "--prometheus-url",
        "http://127.0.0.1:1",
        "--snapshot",
        "x.yaml",
        "--kubeconfig",
        "k",
    ]);
    assert!(!ok);
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}
