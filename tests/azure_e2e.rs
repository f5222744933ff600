//! `tailor run --cloud azure` end to end: a real control plane, the agent as a process
//! talking to the fake ARM through the real Azure crates, and the fake registering a
//! KWOK-style Node (run by the control plane's kubelet stand-in) for every VM it creates,
//! as the VM's kubelet would from its custom data. A Spot VM evicted by Azure (eviction
//! policy Delete: the VM disappears from ARM) has its NodeClaim deleted by garbage
//! collection, and its pods are provisioned again.

#[path = "support/control_plane.rs"]
#[allow(dead_code)] // shared with tests/agent.rs, which uses all of it
mod control_plane;
#[path = "support/fake_arm.rs"]
mod fake_arm;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use control_plane::{Agent, ControlPlane, eventually, list};
use fake_arm::{Arm, FakeArm};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use tailor::apis::NodeClaim;
use tailor::cloud::azure::bootstrap;

const POOL: &str = r#"
apiVersion: tailor.sh/v1alpha1
kind: AKSNodeClass
metadata: {name: default}
spec: {imageFamily: Ubuntu2204, maxPods: 110}
---
apiVersion: tailor.sh/v1alpha1
kind: NodePool
metadata: {name: default}
spec:
  template:
    spec:
      requirements:
      - {key: tailor.sh/capacity-type, operator: In, values: [spot, on-demand]}
      nodeClassRef: {group: tailor.sh, kind: AKSNodeClass, name: default}
  limits: {cpu: "100"}
  disruption: {consolidateAfter: 10m}
"#;

const WORKLOAD: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 6
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 0
      containers:
      - name: app
        image: registry.example/web:1
        resources: {requests: {cpu: "500m", memory: "512Mi"}}
"#;

/// The Node a VM's kubelet registers: name, provider ID, labels and taints from the
/// kubelet flags in its custom data; capacity from the size's Resource SKU.
fn node_for(vm: &Value, custom_data: &str, skus: &[Value]) -> Node {
    let script = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(custom_data)
            .expect("base64 custom data"),
    )
    .expect("utf-8 script");
    let flags = bootstrap::embedded_flags(&script).expect("kubelet flags");
    let flag = |name: &str| {
        flags
            .iter()
            .find_map(|f| f.strip_prefix(name))
            .map(str::to_string)
    };
    let size = vm
        .pointer("/properties/hardwareProfile/vmSize")
        .and_then(Value::as_str)
        .expect("size");
    let sku = skus
        .iter()
        .find(|s| s["name"] == size)
        .expect("sku of the VM");
    let cap = |n: &str| {
        sku["capabilities"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == n))
            .and_then(|c| c["value"].as_str())
            .unwrap_or("0")
            .to_string()
    };
    let name = vm["name"].as_str().expect("name").to_string();
    let zone = format!(
        "{}-{}",
        vm["location"].as_str().unwrap_or("eastus"),
        vm.pointer("/zones/0")
            .and_then(Value::as_str)
            .unwrap_or("1")
    );
    let mut labels: BTreeMap<String, String> = flag("--node-labels=")
        .unwrap_or_default()
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    labels.insert("kubernetes.io/hostname".into(), name.clone());
    labels.insert("kubernetes.io/os".into(), "linux".into());
    labels.insert("kubernetes.io/arch".into(), "amd64".into());
    labels.insert("node.kubernetes.io/instance-type".into(), size.to_string());
    labels.insert("topology.kubernetes.io/zone".into(), zone);
    let taints: Vec<Value> = flag("--register-with-taints=")
        .unwrap_or_default()
        .split(',')
        .filter(|t| !t.is_empty())
        .map(|t| {
            let (kv, effect) = t.split_once(':').expect("key[=value]:Effect");
            match kv.split_once('=') {
                Some((k, v)) => json!({"key": k, "value": v, "effect": effect}),
                None => json!({"key": kv, "effect": effect}),
            }
        })
        .collect();
    let pods = flag("--max-pods=").unwrap_or_else(|| "110".into());
    let memory = format!("{}Gi", cap("MemoryGB"));
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "spec": {"providerID": flag("--provider-id=").expect("provider id"), "taints": taints},
        "status": {
            "capacity": {"cpu": cap("vCPUs"), "memory": memory, "pods": pods},
            "allocatable": {"cpu": cap("vCPUs"), "memory": memory, "pods": pods}
        }
    }))
    .expect("node")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tailor_run_with_the_azure_cloud_provisions_pending_pods_end_to_end() {
    let cp = ControlPlane::start().await;
    cp.apply_yaml(POOL).await;
    let nodes: Api<Node> = Api::all(cp.client.clone());
    let handle = tokio::runtime::Handle::current();
    let (created_nodes, deleted_nodes, skus) =
        (nodes.clone(), nodes.clone(), fake_arm::default_skus());
    let (h1, h2) = (handle.clone(), handle);
    let arm = Arm {
        retry_after: None,
        on_vm_created: Some(Arc::new(move |vm: &Value, data: &str| {
            let node = node_for(vm, data, &skus);
            let api = created_nodes.clone();
            h1.spawn(async move {
                if let Err(e) = api.create(&PostParams::default(), &node).await {
                    eprintln!("registering node: {e}");
                }
            });
        })),
        on_vm_deleted: Some(Arc::new(move |name: &str| {
            let (api, name) = (deleted_nodes.clone(), name.to_string());
            h2.spawn(async move {
                let _ = api.delete(&name, &DeleteParams::default()).await;
            });
        })),
        ..Arm::default()
    };
    let fake = FakeArm::start(arm).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ0YWlsb3IifQ.c2ln").expect("token file");
    let token = token.display().to_string();
    let sub = "00000000-0000-0000-0000-000000000001";
    let subnet = format!(
        "/subscriptions/{sub}/resourceGroups/net/providers/Microsoft.Network/virtualNetworks/v/subnets/nodes"
    );
    let agent = Agent::start_with(
        &cp,
        "agent-azure",
        &["--cloud", "azure"],
        &[
            "--mode",
            "autonomous",
            "--subscription-id",
            sub,
            "--azure-resource-manager-endpoint",
            &fake.url,
            "--azure-prices-endpoint",
            &fake.url,
            "--azure-node-resource-group",
            "MC_rg_e2e_eastus",
            "--azure-subnet-id",
            &subnet,
            "--azure-ssh-public-key",
            "ssh-rsa AAAAB3NzaC1yc2E e2e",
            "--cluster-endpoint",
            "https://e2e.hcp.eastus.azmk8s.io:443",
            "--cluster-ca-bundle",
            "LS0tLS1CRUdJTi0tLS0t",
            "--kubelet-bootstrap-token",
            "abcdef.0123456789abcdef",
            "--azure-poll-interval",
            "100ms",
            "--gc-interval",
            "2s",
        ],
        &[
            ("AZURE_TENANT_ID", "tenant"),
            ("AZURE_CLIENT_ID", "client"),
            ("AZURE_FEDERATED_TOKEN_FILE", &token),
            ("AZURE_AUTHORITY_HOST", &fake.url),
        ],
    );
    agent.wait_ready().await;
    cp.apply_yaml(WORKLOAD).await;
    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "default");
    let running = eventually(
        Duration::from_secs(180),
        "6 pods Running on Azure nodes",
        || async {
            let listed = list(&pods).await;
            let running = listed
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            (running == 6).then_some(listed)
        },
    )
    .await;
    let live = list(&nodes).await;
    let (evicted, vms_before) = {
        let arm = fake.arm();
        assert!(!arm.vms.is_empty(), "the agent created VMs through ARM");
        for pod in &running {
            let node = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .expect("bound");
            let n = live
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some(node.as_str()))
                .expect("node");
            let pid = n
                .spec
                .as_ref()
                .and_then(|s| s.provider_id.clone())
                .unwrap_or_default();
            assert!(
                pid.starts_with(&format!(
                    "azure:///subscriptions/{sub}/resourceGroups/mc_rg_e2e_eastus/"
                )),
                "{pid}"
            );
            assert!(arm.vms.contains_key(&node), "{node} is a VM");
        }
        assert!(
            arm.count("GET", "/api/retail/prices") > 0,
            "live prices read"
        );
        // Spot is the cheapest offering the pool allows, and Karpenter's spot settings are sent.
        let (evicted, vm) = arm
            .vms
            .iter()
            .next()
            .map(|(n, v)| (n.clone(), v.clone()))
            .expect("a VM");
        assert_eq!(
            (
                vm.pointer("/properties/priority").and_then(Value::as_str),
                vm.pointer("/properties/evictionPolicy")
                    .and_then(Value::as_str)
            ),
            (Some("Spot"), Some("Delete")),
            "{vm}"
        );
        (evicted, arm.vms.len())
    };

    // Azure evicts the Spot VM: with eviction policy Delete the VM and its NIC are gone
    // from ARM, without any call from Tailor.
    {
        let mut arm = fake.arm();
        arm.vms.remove(&evicted);
        arm.nics.remove(&evicted);
    }
    let claims: Api<NodeClaim> = Api::all(cp.client.clone());
    let claim_of = |c: &NodeClaim| {
        c.status
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .is_some_and(|p| {
                p.to_ascii_lowercase().ends_with(&format!(
                    "/virtualmachines/{}",
                    evicted.to_ascii_lowercase()
                ))
            })
    };
    assert!(
        list(&claims).await.iter().any(claim_of),
        "a NodeClaim owns the evicted VM"
    );
    eventually(
        Duration::from_secs(120),
        "the evicted VM's NodeClaim and Node deleted",
        || async {
            let gone_claim = !list(&claims).await.iter().any(claim_of);
            let gone_node = !list(&nodes)
                .await
                .iter()
                .any(|n| n.metadata.name.as_deref() == Some(evicted.as_str()));
            (gone_claim && gone_node).then_some(())
        },
    )
    .await;
    eventually(
        Duration::from_secs(180),
        "6 pods Running again, none on the evicted VM",
        || async {
            let listed = list(&pods).await;
            let arm = fake.arm();
            let running = listed
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .filter(|p| {
                    p.spec
                        .as_ref()
                        .and_then(|s| s.node_name.as_deref())
                        .is_some_and(|n| n != evicted && arm.vms.contains_key(n))
                })
                .count();
            (running == 6).then_some(())
        },
    )
    .await;
    let arm = fake.arm();
    eprintln!(
        "spot eviction: {} VMs before, {} after; {} VM PUTs in all",
        vms_before,
        arm.vms.len(),
        arm.vm_puts().len()
    );
    drop(arm);
    drop(agent);
}
