//! The agent's controllers deciding on the in-process simulated cluster, on a paused clock:
//! what they do is asserted on the cluster's objects and the simulated Azure's record of
//! calls. A virtual hour takes a second or two; nothing here waits on a real timer. What
//! only a real API server, kube-scheduler, eviction API, webhook or RBAC can show stays in
//! the end-to-end tests (tests/agent.rs and the others on the real control plane).

use std::collections::BTreeSet;
use std::time::Duration;

#[path = "support/objects.rs"]
mod objects;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use tailor::apis::labels;
use tailor::controllers::Settings;
use tailor::provisioning::Mode;
use tailor::sim::cluster::{Gone, Happening, Objects};
use tailor::sim::world::Harness;

use objects::{EAGER_POOL, deployment};

fn autonomous() -> Settings {
    Settings {
        mode: Mode::Autonomous,
        ..Settings::default()
    }
}

fn running(o: &Objects, app: &str) -> usize {
    o.pods
        .values()
        .filter(|p| p.labels().get("app").map(String::as_str) == Some(app))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count()
}

fn ready(n: &Node) -> bool {
    let condition = n
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let registering = n
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .any(|t| t.key == labels::UNREGISTERED_TAINT_KEY);
    condition && !registering
}

fn family(n: &Node) -> &str {
    n.labels()
        .get(labels::SKU_FAMILY)
        .map(String::as_str)
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn pending_pods_get_nodes_and_an_emptied_node_is_removed() {
    let h = Harness::start(
        &format!("{EAGER_POOL}---\n{}", deployment("web", 6, "1", "2Gi", "")),
        autonomous(),
    )
    .expect("the harness starts");
    h.until(Duration::from_secs(600), "six web pods running", |o| {
        (running(o, "web") == 6).then_some(())
    })
    .await
    .expect("provisioned");
    let launched = h.cloud.create_calls();
    assert!(
        !launched.is_empty() && launched.iter().all(|c| c.outcome.is_ok()),
        "{launched:?}"
    );
    let nodes_before = h.cluster.lock().nodes.len();
    assert!(nodes_before >= 1);

    // Scaled to nothing, every node is empty: all go, and the cloud is told to delete
    // each VM.
    h.scale("web", 0).expect("scale");
    h.until(Duration::from_secs(900), "every node removed", |o| {
        o.nodes.is_empty().then_some(())
    })
    .await
    .expect("consolidated");
    assert_eq!(h.cloud.delete_calls().len(), launched.len());
}

#[tokio::test(start_paused = true)]
async fn a_drifted_node_is_replaced_and_the_replacement_is_ready_before_the_drain() {
    let h = Harness::start(
        &format!("{EAGER_POOL}---\n{}", deployment("web", 3, "1", "2Gi", "")),
        autonomous(),
    )
    .expect("the harness starts");
    h.until(Duration::from_secs(600), "three web pods running", |o| {
        (running(o, "web") == 3).then_some(())
    })
    .await
    .expect("provisioned");
    let old: BTreeSet<String> = h.cluster.lock().nodes.keys().cloned().collect();
    assert!(h.cluster.lock().nodes.values().all(|n| family(n) == "D"));

    // The pool now wants E-family nodes: every D node has drifted.
    {
        let mut o = h.cluster.lock();
        let mut pool = o
            .node_pools
            .values()
            .find(|p| p.name_any() == "default")
            .cloned()
            .expect("the pool");
        for r in &mut pool.spec.template.spec.requirements {
            if r.key == labels::SKU_FAMILY {
                r.values = vec!["E".to_string()];
            }
        }
        o.put(pool);
    }

    // Every virtual second: an old node is drained (its claim deleted) only once an E node
    // is ready for its pods. The cluster's record dates each eviction to the second; the
    // first one must not come before the first E node was seen ready (polled each second).
    h.cluster.lock().take_happenings();
    let mut ready_e_at: Option<i64> = None;
    let mut first_eviction: Option<i64> = None;
    h.until(Duration::from_secs(1800), "the D nodes replaced", |o| {
        let now = h.clock.now().as_second();
        if ready_e_at.is_none() && o.nodes.values().any(|n| family(n) == "E" && ready(n)) {
            ready_e_at = Some(now);
        }
        let old_gone = o.nodes.keys().all(|n| !old.contains(n));
        (old_gone && running(o, "web") == 3).then_some(())
    })
    .await
    .expect("drift replaced");
    for (at, happening) in h.cluster.lock().take_happenings() {
        if let Happening::PodGone {
            why: Gone::EvictedByDisruption,
            ..
        } = happening
        {
            first_eviction = Some(first_eviction.map_or(at, |f| f.min(at)));
        }
    }
    let (ready_e_at, first_eviction) = (
        ready_e_at.expect("an E node became ready"),
        first_eviction.expect("the old nodes' pods were evicted"),
    );
    assert!(
        first_eviction >= ready_e_at - 1,
        "the first eviction at {first_eviction} came before an E node was ready at {ready_e_at}"
    );
    let o = h.cluster.lock();
    let families: BTreeSet<&str> = o.nodes.values().map(family).collect();
    assert_eq!(families, BTreeSet::from(["E"]));
    // The cloud launched E sizes and deleted every old VM.
    let e_launches = h
        .cloud
        .create_calls()
        .iter()
        .filter(|c| {
            c.outcome
                .as_ref()
                .is_ok_and(|t| t.starts_with("Standard_E"))
        })
        .count();
    assert!(e_launches >= 1);
    assert!(h.cloud.delete_calls().len() >= old.len());
}

#[tokio::test(start_paused = true)]
async fn a_recommend_only_pool_is_reported_and_kept_while_an_autonomous_pool_beside_it_consolidates()
 {
    let batch_pool = EAGER_POOL
        .split("---")
        .nth(1)
        .expect("the pool document")
        .replace("metadata: {name: default}", "metadata: {name: batch}");
    let in_pool = |pool: &str| format!("      nodeSelector: {{{}: {pool}}}", labels::NODE_POOL);
    let h = Harness::start(
        &format!(
            "{EAGER_POOL}---{batch_pool}---\n{}---\n{}",
            deployment("web", 6, "1500m", "2Gi", &in_pool("default")),
            deployment("jobs", 6, "1500m", "2Gi", &in_pool("batch"))
        ),
        autonomous(),
    )
    .expect("the harness starts");
    h.until(Duration::from_secs(600), "twelve pods running", |o| {
        (running(o, "web") + running(o, "jobs") == 12).then_some(())
    })
    .await
    .expect("provisioned");
    let of_pool = |o: &Objects, pool: &str| -> BTreeSet<String> {
        o.node_claims
            .values()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .filter(|c| c.labels().get(labels::NODE_POOL).map(String::as_str) == Some(pool))
            .map(|c| c.name_any())
            .collect()
    };
    let (web_before, batch_before) = {
        let o = h.cluster.lock();
        (of_pool(&o, "default"), of_pool(&o, "batch"))
    };
    assert!(!web_before.is_empty() && !batch_before.is_empty());
    // The batch pool turns recommend-only; both Deployments shrink. The batch pool's nodes
    // are left empty, which, evaluated first, would be the first decision.
    {
        let mut o = h.cluster.lock();
        let mut pool = o
            .node_pools
            .values()
            .find(|p| p.name_any() == "batch")
            .cloned()
            .expect("the batch pool");
        pool.annotations_mut()
            .insert(labels::MODE_ANNOTATION.to_string(), "recommend".to_string());
        o.put(pool);
    }
    h.scale("web", 1).expect("scale");
    h.scale("jobs", 0).expect("scale");

    let note = h
        .until(Duration::from_secs(900), "consolidated and reported", |o| {
            assert_eq!(
                of_pool(o, "batch"),
                batch_before,
                "a claim of the recommend-only pool was deleted or created"
            );
            let consolidated = of_pool(o, "default") != web_before;
            let report = o
                .events
                .iter()
                .find(|e| e.reason == "WouldDisrupt" && e.name == "batch")
                .map(|e| e.note.clone());
            if consolidated { report } else { None }
        })
        .await
        .expect("the autonomous pool consolidates, the recommend-only one is reported");
    assert!(note.contains("nothing done"), "{note}");
    let o = h.cluster.lock();
    assert!(
        o.events
            .iter()
            .all(|e| e.reason != "WouldDisrupt" || e.name == "batch"),
        "the autonomous pool's decisions were reported instead of carried out"
    );
    // The emptied recommend-only nodes still run their VMs: none was deleted.
    let deleted: BTreeSet<String> = h.cloud.delete_calls().into_iter().collect();
    let batch_vms: Vec<String> = o
        .nodes
        .values()
        .filter(|n| n.labels().get(labels::NODE_POOL).map(String::as_str) == Some("batch"))
        .filter_map(|n| n.spec.as_ref()?.provider_id.clone())
        .collect();
    assert_eq!(batch_vms.len(), batch_before.len());
    assert!(
        batch_vms.iter().all(|v| !deleted.contains(v)),
        "{deleted:?}"
    );
}

#[tokio::test]
async fn a_document_the_harness_cannot_hold_is_refused_naming_it() {
    let refused = |objects: &str| {
        Harness::start(objects, autonomous())
            .err()
            .expect("refused")
    };
    let err = refused("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}");
    assert!(
        err.contains("document 1") && err.contains("ConfigMap"),
        "{err}"
    );
    let err = refused(
        "apiVersion: v1\nkind: Node\nmetadata: {name: n}\nstatus: {allocatable: {cpu: '4', memory: 16Gi, pods: '110'}}",
    );
    assert!(err.contains("hold a Node"), "{err}");
    let err = refused(&deployment("web", -1, "1", "1Gi", ""));
    assert!(err.contains("replicas") && err.contains("-1"), "{err}");
}
