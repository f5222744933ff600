//! End-to-end tests of `tailor run` against a real control plane (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler, built from source) with the kubelet stand-in
//! running the nodes Tailor creates through its KWOK cloud.
//!
//! Each test starts its own control plane and agent; they run one at a time (two cores).

#[path = "support/control_plane.rs"]
mod control_plane;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;
use std::time::Duration;

use control_plane::{Agent, ControlPlane, eventually, list};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::ResourceExt;
use kube::api::Api;
use tailor::apis::{NodeClaim, NodePool, labels};
use tailor::catalog::{Catalog, CatalogOptions};
use tailor::model::NodeSettings;
use tailor::scheduling::{self, Input, Options};
use tailor::state::Snapshot;

/// One control plane at a time: each is a handful of processes on a two-core machine.
static SERIAL: LazyLock<tokio::sync::Mutex<()>> = LazyLock::new(|| tokio::sync::Mutex::new(()));

const POOL: &str = r#"
apiVersion: tailor.sh/v1alpha1
kind: AKSNodeClass
metadata: {name: default}
spec: {imageFamily: AzureLinux, maxPods: 110}
---
apiVersion: tailor.sh/v1alpha1
kind: NodePool
metadata: {name: default}
spec:
  template:
    spec:
      requirements:
      - {key: tailor.sh/sku-family, operator: In, values: [D, E, F]}
      - {key: tailor.sh/capacity-type, operator: In, values: [on-demand]}
      - {key: kubernetes.io/arch, operator: In, values: [amd64]}
      nodeClassRef: {group: tailor.sh, kind: AKSNodeClass, name: default}
  limits: {cpu: "1000"}
"#;

fn deployment(name: &str, replicas: i32, cpu: &str, memory: &str, extra_spec: &str) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: default}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      terminationGracePeriodSeconds: 0
      containers:
      - name: app
        image: registry.example/{name}:1
        resources: {{requests: {{cpu: "{cpu}", memory: "{memory}"}}}}
{extra_spec}
"#
    )
}

/// The three Deployments of the provisioning test: 200 pods.
fn three_deployments() -> String {
    let spread = deployment(
        "spread",
        90,
        "500m",
        "1Gi",
        r#"      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: spread}}}"#,
    );
    let anti = deployment(
        "anti",
        10,
        "1",
        "2Gi",
        r#"      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - {topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {app: anti}}}"#,
    );
    let selected = deployment(
        "selected",
        100,
        "250m",
        "512Mi",
        r#"      nodeSelector: {tailor.sh/sku-family: D}"#,
    );
    format!("{spread}\n---\n{anti}\n---\n{selected}")
}

/// What `tailor simulate` plans for the same objects: the cost a provisioner should match.
fn simulated_cost(objects: &str) -> (f64, usize) {
    let snapshot = Snapshot::from_yaml("e2e.yaml", objects).expect("snapshot parses");
    let catalog = Catalog::builtin().expect("built-in catalog");
    let types = |settings: &NodeSettings| {
        let mut o = CatalogOptions::for_region("eastus");
        o.node = NodeSettings {
            overhead_model: settings.overhead_model,
            max_pods: settings.max_pods,
            os_disk_gib: settings.os_disk_gib,
            ..o.node
        };
        catalog.instance_types(&o).map_err(|e| e.to_string())
    };
    let input = Input::from_snapshot(&snapshot, &types).expect("input");
    let plan = scheduling::schedule(&input, &Options::default());
    assert!(plan.unschedulable.is_empty(), "{:?}", plan.unschedulable);
    (plan.summary.hourly_cost, plan.node_claims.len())
}

/// The hourly price of a created node, from its labels and the built-in catalog.
fn price(node: &Node) -> f64 {
    let l = node.labels();
    let catalog = Catalog::builtin().expect("catalog");
    let types = catalog
        .instance_types(&CatalogOptions::for_region("eastus"))
        .expect("types");
    let t = types
        .iter()
        .find(|t| Some(&t.name) == l.get(labels::INSTANCE_TYPE))
        .expect("a catalog type");
    t.offerings
        .iter()
        .find(|o| Some(&o.zone) == l.get(labels::ZONE) && Some(o.capacity_type.as_str()) == l.get(labels::CAPACITY_TYPE).map(String::as_str))
        .expect("an offering")
        .price_per_hour
}

fn running(pods: &[Pod]) -> usize {
    pods.iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count()
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_pods_of_three_deployments_all_run_on_nodes_tailor_created_at_the_simulated_cost() {
    let _serial = SERIAL.lock().await;
    let cp = ControlPlane::start().await;
    cp.apply_yaml(POOL).await;
    let agent = Agent::start(&cp, "agent-a", &["--mode", "autonomous"]);
    agent.wait_ready().await;
    let workloads = three_deployments();
    cp.apply_yaml(&workloads).await;

    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "default");
    let all_running = eventually(Duration::from_secs(240), "200 pods Running", || async {
        let listed = list(&pods).await;
        (listed.len() == 200 && running(&listed) == 200).then_some(listed)
    })
    .await;

    // Every pod runs on a node Tailor created, bound by the real scheduler.
    let nodes: Api<Node> = Api::all(cp.client.clone());
    let nodes = list(&nodes).await;
    let claims: Api<NodeClaim> = Api::all(cp.client.clone());
    let claims = list(&claims).await;
    let created: BTreeSet<String> = nodes
        .iter()
        .filter(|n| n.labels().get(labels::NODE_POOL).map(String::as_str) == Some("default"))
        .map(|n| n.name_any())
        .collect();
    for pod in &all_running {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).expect("bound");
        assert!(created.contains(&node), "{} runs on {node}, not a Tailor node", pod.name_any());
    }
    assert_eq!(created.len(), claims.len(), "one node per NodeClaim");
    assert!(claims.iter().all(|c| tailor::apis::is_condition_true(
        &c.status.clone().unwrap_or_default().conditions,
        "Initialized"
    )));

    // Constraints held: zone spread within 1, one anti pod per node, selected pods on D.
    let node_by_name: BTreeMap<String, &Node> = nodes.iter().map(|n| (n.name_any(), n)).collect();
    let label_of = |pod: &Pod, key: &str| {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        node_by_name
            .get(&node)
            .and_then(|n| n.labels().get(key).cloned())
            .unwrap_or_default()
    };
    let mut per_zone: BTreeMap<String, usize> = BTreeMap::new();
    let mut anti_nodes = BTreeSet::new();
    for pod in &all_running {
        match pod.labels().get("app").map(String::as_str) {
            Some("spread") => *per_zone.entry(label_of(pod, labels::ZONE)).or_default() += 1,
            Some("anti") => assert!(anti_nodes.insert(pod.spec.as_ref().and_then(|s| s.node_name.clone()))),
            Some("selected") => assert_eq!(label_of(pod, labels::SKU_FAMILY), "D", "{}", pod.name_any()),
            other => panic!("unexpected pod {other:?}"),
        }
    }
    let counts: Vec<usize> = per_zone.values().copied().collect();
    assert_eq!(counts.iter().sum::<usize>(), 90);
    assert!(counts.len() == 3 && counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1, "{per_zone:?}");
    assert_eq!(anti_nodes.len(), 10);

    // Cost within 2% of tailor simulate on the same objects.
    let cost: f64 = nodes.iter().filter(|n| created.contains(&n.name_any())).map(price).sum();
    let (simulated, simulated_nodes) = simulated_cost(&format!("{POOL}\n---\n{workloads}"));
    println!(
        "provisioned {} nodes at {cost:.4} $/hour; tailor simulate plans {simulated_nodes} at {simulated:.4} $/hour (ratio {:.4})",
        created.len(),
        cost / simulated
    );
    assert!(cost <= simulated * 1.02, "{cost} $/hour against {simulated} simulated\n{}", agent.log());

    // Pending → NodeClaim created: from each pod's creation to its node's claim's.
    let claim_created: BTreeMap<String, jiff::Timestamp> = claims
        .iter()
        .map(|c| {
            let node = c.status.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
            (node, c.creation_timestamp().map(|t| t.0).expect("created"))
        })
        .collect();
    let mut latencies: Vec<f64> = all_running
        .iter()
        .filter_map(|p| {
            // A pod starts pending when it is created: nothing else could run it.
            let created = p.creation_timestamp()?.0;
            let claim = claim_created.get(p.spec.as_ref()?.node_name.as_ref()?)?;
            Some(claim.duration_since(created).as_secs_f64().max(0.0))
        })
        .collect();
    latencies.sort_by(f64::total_cmp);
    println!(
        "pending -> NodeClaim created over {} pods: p50 {:.1} s, p99 {:.1} s (1 s timestamps; batch window 1 s idle / 10 s max)",
        latencies.len(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99)
    );
    assert_eq!(latencies.len(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_recommend_mode_pending_pods_are_reported_with_a_price_and_nothing_is_created() {
    let _serial = SERIAL.lock().await;
    let cp = ControlPlane::start().await;
    cp.apply_yaml(POOL).await;
    let agent = Agent::start(&cp, "agent-r", &["--mode", "recommend"]);
    agent.wait_ready().await;
    cp.apply_yaml(&deployment("web", 6, "1", "2Gi", "")).await;

    let events: Api<Event> = Api::namespaced(cp.client.clone(), "default");
    let report = eventually(Duration::from_secs(60), "a WouldProvision event on the NodePool", || async {
        list(&events)
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("WouldProvision"))
    })
    .await;
    let note = report.message.clone().unwrap_or_default();
    assert!(note.contains("6 pending pod(s)") && note.contains("$/hour"), "{note}");
    assert_eq!(report.involved_object.kind.as_deref(), Some("NodePool"));
    let claims: Api<NodeClaim> = Api::all(cp.client.clone());
    assert!(list(&claims).await.is_empty(), "recommend mode created a NodeClaim");

    // Switching the NodePool to autonomous acts at the next reconcile, without a restart.
    let pools: Api<NodePool> = Api::all(cp.client.clone());
    pools
        .patch(
            "default",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"annotations": {labels::MODE_ANNOTATION: "autonomous"}}})),
        )
        .await
        .expect("annotate nodepool");
    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "default");
    eventually(Duration::from_secs(120), "6 pods Running after the switch", || async {
        (running(&list(&pods).await) == 6).then_some(())
    })
    .await;
    assert!(!list(&claims).await.is_empty());
}
