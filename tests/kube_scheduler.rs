//! The simulated cluster's binder (`tailor::sim::binder`) against the real kube-scheduler, on
//! the real control plane: fixed scenarios of nodes and pods, the pods created one at a
//! time. Before each pod is created the binder is asked where kube-scheduler may bind it,
//! from the objects as the API server lists them; the node kube-scheduler then binds it to
//! must be one the binder allows (kube-scheduler picks at random among nodes of equal best
//! score, so the binder answers with all of them).
//!
//! Each scenario must also tell the binder apart from a packer: in some steps the node
//! kube-scheduler picks is not the first node by name that fits, which is where the
//! simulated cluster's old scheduler put every pod.

#[path = "support/control_plane.rs"]
#[allow(dead_code)] // shared with tests/agent.rs, which uses all of it
mod control_plane;

use std::collections::BTreeMap;
use std::time::Duration;

use control_plane::{ControlPlane, eventually, list};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use tailor::sim::binder::{Binder, Choice};

const NS: &str = "binder";

/// A node the kubelet stand-in keeps Ready: `extra` goes into its spec.
fn node(name: &str, zone: &str, cpu: &str, memory: &str, labels: &str, extra: &str) -> Node {
    serde_yaml::from_str(&format!(
        "apiVersion: v1
kind: Node
metadata:
  name: {name}
  annotations: {{kwok.x-k8s.io/node: fake}}
  labels: {{kubernetes.io/hostname: {name}, topology.kubernetes.io/zone: {zone}{labels}}}
spec: {{{extra}}}
status:
  capacity: {{cpu: '{cpu}', memory: '{memory}', pods: '110'}}
  allocatable: {{cpu: '{cpu}', memory: '{memory}', pods: '110'}}"
    ))
    .expect("a node")
}

/// A pod of `app` requesting `cpu` and `memory` (none when empty); `extra` goes into its spec.
fn pod(name: &str, app: &str, cpu: &str, memory: &str, extra: &str) -> Pod {
    let requests = match (cpu.is_empty(), memory.is_empty()) {
        (true, true) => String::new(),
        _ => format!(
            ", resources: {{requests: {{{}}}}}",
            [("cpu", cpu), ("memory", memory)]
                .iter()
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| format!("{k}: '{v}'"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    serde_yaml::from_str(&format!(
        "apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {NS}, labels: {{app: {app}}}}}
spec:
  terminationGracePeriodSeconds: 0
  containers: [{{name: app, image: registry.k8s.io/pause:3.10{requests}}}]
  {extra}"
    ))
    .expect("a pod")
}

/// How a scenario went: steps where kube-scheduler's node was allowed, all steps, steps where
/// the binder narrowed the feasible nodes to fewer, and steps where first-fit by name differs.
#[derive(Debug, Default)]
struct Outcome {
    agreed: usize,
    steps: usize,
    narrowed: usize,
    unlike_first_fit: usize,
    disagreements: Vec<String>,
}

/// The Services of the scenario: app → selector, as kube-scheduler's default spread reads it.
fn selector_for<'a>(services: &'a [&'a str]) -> impl Fn(&Pod) -> Option<LabelSelector> + 'a {
    move |pod: &Pod| {
        let app = pod.labels().get("app")?;
        services.contains(&app.as_str()).then(|| LabelSelector {
            match_labels: Some(BTreeMap::from([("app".to_string(), app.clone())])),
            ..LabelSelector::default()
        })
    }
}

async fn clear(cp: &ControlPlane) {
    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), NS);
    let _ = pods
        .delete_collection(
            &DeleteParams::default().grace_period(0),
            &ListParams::default(),
        )
        .await;
    let nodes: Api<Node> = Api::all(cp.client.clone());
    let _ = nodes
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    eventually(Duration::from_secs(60), "pods and nodes gone", || async {
        (list(&pods).await.is_empty() && list(&nodes).await.is_empty()).then_some(())
    })
    .await;
}

async fn run(cp: &ControlPlane, nodes: &[Node], services: &[&str], pods: &[Pod]) -> Outcome {
    clear(cp).await;
    let node_api: Api<Node> = Api::all(cp.client.clone());
    for n in nodes {
        node_api
            .create(&PostParams::default(), n)
            .await
            .unwrap_or_else(|e| panic!("node {}: {e}", n.name_any()));
    }
    for app in services {
        cp.apply_yaml(&format!(
            "apiVersion: v1
kind: Service
metadata: {{name: {app}, namespace: {NS}}}
spec: {{selector: {{app: {app}}}, ports: [{{port: 80}}]}}"
        ))
        .await;
    }
    // Ready, and without the taints the node lifecycle controller puts on a node until then.
    eventually(
        Duration::from_secs(60),
        "nodes Ready and untainted",
        || async {
            let listed = list(&node_api).await;
            (listed.len() == nodes.len()
                && listed.iter().all(|n| {
                    let ready = n
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .into_iter()
                        .flatten()
                        .any(|c| c.type_ == "Ready" && c.status == "True");
                    let lifecycle_taint = n
                        .spec
                        .as_ref()
                        .and_then(|s| s.taints.as_ref())
                        .into_iter()
                        .flatten()
                        .any(|t| t.key.starts_with("node.kubernetes.io/"));
                    ready && !lifecycle_taint
                }))
            .then_some(())
        },
    )
    .await;

    let pod_api: Api<Pod> = Api::namespaced(cp.client.clone(), NS);
    let all_pods: Api<Pod> = Api::all(cp.client.clone());
    let selector = selector_for(services);
    let mut outcome = Outcome::default();
    for p in pods {
        let listed_nodes = list(&node_api).await;
        let listed_pods = list(&all_pods).await;
        let binder = Binder::new(&listed_nodes, &listed_pods, &selector);
        let choice = binder
            .choose(p)
            .expect("valid requests")
            .unwrap_or_else(|why| panic!("{}: the binder finds no node: {why}", p.name_any()));
        // The packer's answer: the first node by name with room and no filter against it.
        let first_fit = {
            let mut names: Vec<String> = listed_nodes.iter().map(|n| n.name_any()).collect();
            names.sort();
            names.into_iter().find(|n| {
                let one: Vec<Node> = listed_nodes
                    .iter()
                    .filter(|x| x.name_any() == *n)
                    .cloned()
                    .collect();
                Binder::new(&one, &listed_pods, &selector)
                    .choose(p)
                    .is_ok_and(|c| c.is_ok())
            })
        };
        pod_api
            .create(&PostParams::default(), p)
            .await
            .unwrap_or_else(|e| panic!("pod {}: {e}", p.name_any()));
        let name = p.name_any();
        let bound = eventually(Duration::from_secs(30), "the pod bound", || async {
            pod_api
                .get(&name)
                .await
                .ok()
                .and_then(|p| p.spec.and_then(|s| s.node_name))
        })
        .await;
        outcome.steps += 1;
        if choice.allows(&bound) {
            outcome.agreed += 1;
        } else {
            outcome.disagreements.push(format!(
                "{name}: kube-scheduler bound it to {bound}, the binder said {choice:?}"
            ));
        }
        if let Choice::Best { nodes: best, .. } = &choice
            && best.len() < nodes.len()
        {
            outcome.narrowed += 1;
        }
        if first_fit.as_deref() != Some(bound.as_str()) {
            outcome.unlike_first_fit += 1;
        }
    }
    println!("{outcome:?}");
    outcome
}

fn check(scenario: &str, o: &Outcome, steps: usize) {
    assert_eq!(o.steps, steps, "{scenario}: every pod was placed");
    assert!(
        o.disagreements.is_empty(),
        "{scenario}: kube-scheduler bound {} of {} pods where the binder did not allow:\n{}",
        o.steps - o.agreed,
        o.steps,
        o.disagreements.join("\n")
    );
    // The scenario has to discriminate: a binder allowing every node would agree trivially,
    // and first-fit packing must lose somewhere.
    assert!(
        o.narrowed * 2 >= o.steps,
        "{scenario}: the binder narrowed only {} of {} steps",
        o.narrowed,
        o.steps
    );
    assert!(
        o.unlike_first_fit > 0,
        "{scenario}: first-fit by name agreed with kube-scheduler on every pod"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulated_binder_agrees_with_kube_scheduler_pod_by_pod() {
    let cp = ControlPlane::start().await;
    cp.apply_yaml(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}"
    ))
    .await;

    // 1. Mixed node sizes and one Service's pods of mixed shapes beside bare pods: least
    //    allocated, balanced allocation and the system default spread (hostname and zone).
    let nodes = [
        node("n1", "z1", "4", "16Gi", "", ""),
        node("n2", "z2", "8", "32Gi", "", ""),
        node("n3", "z3", "2", "8Gi", "", ""),
        node("n4", "z1", "4", "8Gi", "", ""),
    ];
    let shapes = [
        ("500m", "1Gi"),
        ("1", "2Gi"),
        ("250m", "3Gi"),
        ("750m", "512Mi"),
        ("1500m", "1Gi"),
    ];
    let mut pods = Vec::new();
    for i in 0..14 {
        let (cpu, memory) = shapes[i % shapes.len()];
        pods.push(pod(&format!("web-{i:02}"), "web", cpu, memory, ""));
        if i % 4 == 3 {
            pods.push(pod(&format!("batch-{i:02}"), "batch", "100m", "4Gi", ""));
        }
    }
    let one = run(&cp, &nodes, &["web"], &pods).await;
    check("mixed sizes", &one, pods.len());

    // 2. Constraints the plan cares about: a hard zone spread with a soft hostname spread, a
    //    preferred node label, and a PreferNoSchedule taint.
    let nodes = [
        node("a1", "z1", "4", "16Gi", ", disk: ssd", ""),
        node("a2", "z1", "8", "32Gi", "", ""),
        node(
            "b1",
            "z2",
            "4",
            "16Gi",
            "",
            "taints: [{key: spot, effect: PreferNoSchedule}]",
        ),
        node("b2", "z2", "4", "16Gi", ", disk: ssd", ""),
        node("c1", "z3", "8", "16Gi", "", ""),
    ];
    let spread = "topologySpreadConstraints: [{maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: api}}}, {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway, labelSelector: {matchLabels: {app: api}}}]";
    let prefer = "affinity: {nodeAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: 40, preference: {matchExpressions: [{key: disk, operator: In, values: [ssd]}]}}]}}";
    let mut pods = Vec::new();
    for i in 0..9 {
        pods.push(pod(&format!("api-{i}"), "api", "500m", "1Gi", spread));
        if i % 3 == 1 {
            pods.push(pod(&format!("cache-{i}"), "cache", "1", "2Gi", prefer));
        }
    }
    let two = run(&cp, &nodes, &["api"], &pods).await;
    check("spread, affinity and taints", &two, pods.len());

    // 3. One pod per node by required anti-affinity, beside best-effort pods that request
    //    nothing (scored with kube-scheduler's non-zero defaults).
    let nodes = [
        node("x1", "z1", "2", "8Gi", "", ""),
        node("x2", "z2", "4", "8Gi", "", ""),
        node("x3", "z3", "4", "16Gi", "", ""),
    ];
    let anti = "affinity: {podAntiAffinity: {requiredDuringSchedulingIgnoredDuringExecution: [{topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {app: db}}}]}}";
    let mut pods = Vec::new();
    for i in 0..3 {
        pods.push(pod(&format!("db-{i}"), "db", "1", "1Gi", anti));
        pods.push(pod(&format!("be-{i}a"), "be", "", "", ""));
        pods.push(pod(&format!("be-{i}b"), "be", "", "", ""));
    }
    let three = run(&cp, &nodes, &["db"], &pods).await;
    check("anti-affinity and best effort", &three, pods.len());

    clear(&cp).await;
}
