//! Memory of the `tailor run` agent with a large cluster in its stores: 500 nodes and 5,000
//! pods on a real control plane (built by `scripts/control-plane`), against the same agent
//! watching an empty cluster in the same run. Prints resident memory (VmRSS and its peak
//! VmHWM) of both and their ratio; the target for the large cluster is 150 MiB. Every node
//! is one Tailor manages (a NodePool's, with an initialized NodeClaim), so the disruption
//! controller evaluates consolidation over the whole cluster on each pass, as it would in a
//! cluster Tailor provisioned.
//!
//! `cargo bench --bench agent`. Without `--bench` (as `cargo test --all-targets` runs it) it
//! does a small smoke run: 20 nodes and 100 pods. `TAILOR_BENCH_NODES` and
//! `TAILOR_BENCH_PODS_PER_NODE` size the cluster otherwise (e.g. 5,000 and 20 for issue
//! 43's 100,000 pods; the kubelet stand-in then renews 5,000 node Leases).

// The bench uses a part of the end-to-end support.
#[allow(dead_code)]
#[path = "../tests/support/control_plane.rs"]
mod control_plane;

use std::time::{Duration, Instant};

use control_plane::{Agent, ControlPlane, eventually};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tailor::apis::NodeClaim;

/// Pods per node unless `TAILOR_BENCH_PODS_PER_NODE` says otherwise.
const PODS_PER_NODE: usize = 10;

fn pods_per_node() -> usize {
    std::env::var("TAILOR_BENCH_PODS_PER_NODE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(PODS_PER_NODE)
}

fn kib(status: &str, field: &str) -> u64 {
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// (VmRSS, VmHWM) of the agent in MiB.
fn memory(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    (
        kib(&status, "VmRSS:") as f64 / 1024.0,
        kib(&status, "VmHWM:") as f64 / 1024.0,
    )
}

/// CPU time (user and system) the agent has used, in seconds: what returning freed memory
/// to the system promptly costs shows here.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces), from field 3 on.
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15, in clock ticks of 1/100 s on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

fn node(i: usize) -> Node {
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": format!("bench-{i:04}"),
            "labels": {
                "tailor.sh/nodepool": "default",
                "tailor.sh/registered": "true",
                "tailor.sh/capacity-type": "on-demand",
                "tailor.sh/cluster": "tailor",
                "kubernetes.io/hostname": format!("bench-{i:04}"),
                "node.kubernetes.io/instance-type": "Standard_D8s_v5",
                "topology.kubernetes.io/zone": format!("eastus-{}", i % 3 + 1),
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/os": "linux"
            },
            "annotations": {
                "kwok.x-k8s.io/node": "fake",
                "tags.tailor.sh/tailor.sh_nodeclaim": format!("bench-{i:04}")
            }
        },
        "spec": {"providerID": format!("kwok://bench-{i:04}")},
        "status": {
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "allocatable": {"cpu": "7800m", "memory": "27Gi", "pods": "110"}
        }
    }))
    .expect("node")
}

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
      - {key: tailor.sh/sku-family, operator: In, values: [D]}
      nodeClassRef: {group: tailor.sh, kind: AKSNodeClass, name: default}
  disruption: {consolidateAfter: 0s}
"#;

/// The initialized NodeClaim of bench node `i`.
fn claim(i: usize) -> (NodeClaim, serde_json::Value) {
    let claim = serde_json::from_value(serde_json::json!({
        "apiVersion": "tailor.sh/v1alpha1",
        "kind": "NodeClaim",
        "metadata": {"name": format!("bench-{i:04}"), "labels": {"tailor.sh/nodepool": "default"}},
        "spec": {"nodeClassRef": {"group": "tailor.sh", "kind": "AKSNodeClass", "name": "default"}}
    }))
    .expect("claim");
    let now = jiff::Timestamp::now().to_string();
    let condition = |t: &str| serde_json::json!({"type": t, "status": "True", "reason": t, "message": "", "lastTransitionTime": now});
    let status = serde_json::json!({"status": {
        "nodeName": format!("bench-{i:04}"),
        "providerID": format!("kwok://bench-{i:04}"),
        "conditions": [condition("Launched"), condition("Registered"), condition("Initialized")]
    }});
    (claim, status)
}

fn pod(node: usize, j: usize) -> Pod {
    let app = (node * pods_per_node() + j) % 200;
    serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": format!("app-{node:04}-{j:02}"),
            "namespace": "bench",
            "labels": {"app": format!("app-{app}"), "tier": "web"}
        },
        "spec": {
            "nodeName": format!("bench-{node:04}"),
            "containers": [{
                "name": "app",
                "image": "registry.example/app:1",
                "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}},
                "env": [{"name": "MODE", "value": "production"}]
            }]
        }
    }))
    .expect("pod")
}

/// (VmRSS, VmHWM, CPU seconds) once the agent is ready, leads (only the leader runs the
/// disruption controller, whose passes are the largest), and has run its controllers a
/// while.
async fn settle(agent: &Agent, pid: u32) -> (f64, f64, f64) {
    agent.wait_ready().await;
    agent.wait_leading(60).await;
    // Let the controllers take a few passes over the stores.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let (rss, hwm) = memory(pid);
    (rss, hwm, cpu_seconds(pid))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let nodes_wanted: usize = std::env::var("TAILOR_BENCH_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 500 } else { 20 });
    let per_node = pods_per_node();
    let cp = ControlPlane::start().await;

    // Baseline: the same agent over an empty cluster.
    let baseline = Agent::start(&cp, "bench-empty", &["--mode", "recommend"]);
    let (base_rss, base_hwm, base_cpu) = settle(&baseline, baseline.pid()).await;
    drop(baseline);

    let started = Instant::now();
    cp.apply_yaml(POOL).await;
    let namespaces: Api<Namespace> = Api::all(cp.client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "bench"}}))
                .expect("ns"),
        )
        .await
        .expect("namespace");
    let nodes: Api<Node> = Api::all(cp.client.clone());
    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "bench");
    let claims: Api<NodeClaim> = Api::all(cp.client.clone());
    let mut set = tokio::task::JoinSet::new();
    for chunk in 0..10 {
        let (nodes, pods, claims) = (nodes.clone(), pods.clone(), claims.clone());
        set.spawn(async move {
            for i in (chunk * nodes_wanted / 10)..((chunk + 1) * nodes_wanted / 10) {
                let (claim, status) = claim(i);
                claims
                    .create(&PostParams::default(), &claim)
                    .await
                    .expect("create claim");
                claims
                    .patch_status(
                        &format!("bench-{i:04}"),
                        &PatchParams::default(),
                        &Patch::Merge(status),
                    )
                    .await
                    .expect("claim status");
                nodes
                    .create(&PostParams::default(), &node(i))
                    .await
                    .expect("create node");
                for j in 0..per_node {
                    pods.create(&PostParams::default(), &pod(i, j))
                        .await
                        .expect("create pod");
                }
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r.expect("creating the cluster");
    }
    // One pod not Running is enough to wait on: a page of one, not the whole list.
    let not_running = kube::api::ListParams::default()
        .fields("status.phase!=Running")
        .limit(1);
    eventually(Duration::from_secs(1800), "every pod Running", || async {
        let left = pods.list(&not_running).await.ok()?;
        left.items.is_empty().then_some(())
    })
    .await;
    println!(
        "cluster of {nodes_wanted} nodes and {} pods created and running in {:.0} s",
        nodes_wanted * per_node,
        started.elapsed().as_secs_f64()
    );

    let agent = Agent::start(&cp, "bench-full", &["--mode", "recommend"]);
    let t = Instant::now();
    agent.wait_ready().await;
    let ready = t.elapsed().as_secs_f64();
    let (rss, hwm, cpu) = settle(&agent, agent.pid()).await;
    drop(agent);

    // The same agent with mimalloc's own purge delay (1 s in mimalloc 3; the agent sets 0
    // unless the environment says otherwise): what returning freed pages at once saves,
    // and what it costs.
    let delayed = Agent::start_with(
        &cp,
        "bench-delayed-purge",
        &["--cloud", "kwok"],
        &["--mode", "recommend"],
        &[("MIMALLOC_PURGE_DELAY", "1000")],
    );
    let (d_rss, d_hwm, d_cpu) = settle(&delayed, delayed.pid()).await;
    drop(delayed);

    let cluster = format!("{nodes_wanted} nodes / {} pods", nodes_wanted * per_node);
    println!(
        "agent, empty cluster:                  RSS {base_rss:6.1} MiB (peak {base_hwm:6.1} MiB), CPU {base_cpu:5.2} s"
    );
    println!(
        "agent, {cluster}:          RSS {rss:6.1} MiB (peak {hwm:6.1} MiB), CPU {cpu:5.2} s, ready {ready:.1} s after start"
    );
    println!(
        "  with mimalloc's 1 s purge delay:     RSS {d_rss:6.1} MiB (peak {d_hwm:6.1} MiB), CPU {d_cpu:5.2} s"
    );
    println!(
        "ratio to the empty-cluster baseline: {:.2}x RSS, {:.2}x peak; prompt purging against delayed: {:.2}x peak, {:.2}x CPU",
        rss / base_rss,
        hwm / base_hwm,
        hwm / d_hwm,
        cpu / d_cpu.max(0.01),
    );
    println!(
        "target: peak RSS <= 150 MiB ({})",
        if hwm <= 150.0 { "met" } else { "NOT met" }
    );
}
