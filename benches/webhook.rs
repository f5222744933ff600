//! Latency of the admission webhook: pod admission reviews sent over HTTPS (rustls, kept-alive
//! connections, as the API server sends them) to the agent's webhook server, whose stores
//! hold a large cluster's workloads, ReplicaSets, policies and Recommendations. Against it,
//! in the same run and on the same TLS server code, the same round trip to a handler that
//! answers a fixed review without reading anything: the difference is what the decision costs.
//! Prints p50/p99 of both, their ratio, and p50/p99 of the pure decision alone. Target:
//! p99 ≤ 10 ms.
//!
//! `cargo bench --bench webhook`. Without `--bench` (as `cargo test --all-targets` runs it)
//! it does a small smoke run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use serde_json::{Value, json};
use tailor::apis::{Mode, Recommendation, RightsizingPolicy};
use tailor::webhook::{self, Objects, PATH, Settings, Stores, certificate};

/// Namespaces; each has one policy in Auto mode selecting its workloads.
const NAMESPACES: usize = 50;

fn store<K>(objects: impl IntoIterator<Item = K>) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    let (reader, mut writer) = reflector::store();
    for o in objects {
        writer.apply_watcher_event(&watcher::Event::Apply(o));
    }
    reader
}

fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("fixture")
}

/// Stores with `workloads` Deployments (two containers each, one ReplicaSet each, one
/// actionable Recommendation each) over [`NAMESPACES`] namespaces.
fn stores(workloads: usize) -> Stores {
    let ns = |i: usize| format!("team-{:02}", i % NAMESPACES);
    let deployments = (0..workloads).map(|i| {
        from::<Deployment>(json!({
            "metadata": {"name": format!("app-{i}"), "namespace": ns(i), "labels": {"app": format!("app-{i}"), "tier": "web"}},
            "spec": {"selector": {"matchLabels": {"app": format!("app-{i}")}}, "template": {"metadata": {"labels": {"app": format!("app-{i}")}}, "spec": {"containers": [{"name": "app"}, {"name": "proxy"}]}}}
        }))
    });
    let replica_sets = (0..workloads).map(|i| {
        from::<ReplicaSet>(json!({
            "metadata": {"name": format!("app-{i}-5d8f7c9b4"), "namespace": ns(i),
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": format!("app-{i}"), "uid": format!("d-{i}"), "controller": true}]},
            "spec": {"selector": {"matchLabels": {"app": format!("app-{i}")}}}
        }))
    });
    let condition = |t: &str, s: &str| json!({"type": t, "status": s, "reason": "x", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"});
    let recommendations = (0..workloads).map(|i| {
        from::<Recommendation>(json!({
            "metadata": {"name": format!("deployment-app-{i}"), "namespace": ns(i)},
            "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": format!("app-{i}")}},
            "status": {
                "containers": [
                    {"name": "app", "recommended": {"requests": {"cpu": "350m", "memory": "600Mi"}, "limits": {"memory": "1200Mi"}}},
                    {"name": "proxy", "recommended": {"requests": {"cpu": "40m", "memory": "64Mi"}}}
                ],
                "conditions": [condition("Ready", "True"), condition("Actionable", "True"), condition("Stale", "False")]
            }
        }))
    });
    let policies = (0..NAMESPACES).map(|n| {
        from::<RightsizingPolicy>(json!({
            "apiVersion": "tailor.sh/v1alpha1", "kind": "RightsizingPolicy",
            "metadata": {"name": "web", "namespace": format!("team-{n:02}")},
            "spec": {"mode": "Auto", "update": {"mode": "OnCreate"}, "selector": {"matchLabels": {"tier": "web"}}}
        }))
    });
    Stores {
        replica_sets: store(replica_sets.collect::<Vec<_>>()),
        jobs: store(Vec::<Job>::new()),
        deployments: store(deployments.collect::<Vec<_>>()),
        stateful_sets: store(Vec::<StatefulSet>::new()),
        daemon_sets: store(Vec::<DaemonSet>::new()),
        policies: store(policies.collect::<Vec<_>>()),
        recommendations: store(recommendations.collect::<Vec<_>>()),
        agent_namespace: "tailor".to_string(),
    }
}

/// A pod of workload `i` as a ReplicaSet creates it, and its admission review.
fn review(i: usize) -> (Pod, String, Vec<u8>) {
    let namespace = format!("team-{:02}", i % NAMESPACES);
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": format!("app-{i}-5d8f7c9b4-"), "namespace": namespace,
            "labels": {"app": format!("app-{i}"), "pod-template-hash": "5d8f7c9b4"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("app-{i}-5d8f7c9b4"), "uid": format!("r-{i}"), "controller": true}]},
        "spec": {"containers": [
            {"name": "app", "image": "registry.example/app:1", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}},
            {"name": "proxy", "image": "registry.example/proxy:1", "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}
        ]}
    });
    let body = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": format!("uid-{i}"), "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace, "operation": "CREATE", "name": "",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod, "dryRun": false
        }
    });
    (
        from(pod),
        namespace,
        serde_json::to_vec(&body).expect("encodes"),
    )
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Serves `router` over TLS with a certificate for 127.0.0.1; returns its URL.
async fn serve(router: Router, cert: &certificate::ServingCertificate) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let resolver = certificate::Resolver::new(certificate::certified_key(cert).expect("key"));
    tokio::spawn(webhook::serve_tls(
        listener,
        resolver,
        router,
        tailor::server::ConnectionLimits::default(),
        None,
    ));
    format!("https://{address}{PATH}")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (workloads, requests) = if full { (2_000, 2_000) } else { (50, 50) };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let stores = stores(workloads);
    let settings = Settings {
        global_mode: Mode::Recommend,
        agent_namespace: "tailor".to_string(),
    };
    let reviews: Vec<(Pod, String, Vec<u8>)> =
        (0..requests).map(|i| review(i % workloads)).collect();

    // The pure decision alone.
    let mut decisions = Vec::with_capacity(requests);
    let mut patched = 0;
    for (pod, namespace, _) in &reviews {
        let started = Instant::now();
        let d = webhook::mutate::decide(pod, namespace, &stores as &dyn Objects, &settings);
        decisions.push(started.elapsed());
        patched += usize::from(matches!(d, webhook::Decision::Patch { .. }));
    }
    assert_eq!(patched, requests, "every review is one to patch");

    // The fixed answer of the baseline: what the webhook answers for an unchanged pod.
    let fixed = {
        let (review, _) = webhook::answer(
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x","kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},"operation":"CREATE","name":"","userInfo":{}}}"#,
            &stores,
            &settings,
        );
        serde_json::to_vec(&review).expect("encodes")
    };
    let cert = certificate::generate(&["127.0.0.1".to_string()]).expect("certificate");
    let real = serve(webhook::router(Arc::new(stores), settings, None), &cert).await;
    let noop = serve(
        Router::new().route(
            PATH,
            post(move |_body: axum::body::Bytes| {
                let fixed = fixed.clone();
                async move { ([("content-type", "application/json")], fixed) }
            }),
        ),
        &cert,
    )
    .await;
    let ca =
        reqwest::Certificate::from_pem(cert.ca_pem.as_deref().expect("ca").as_bytes()).expect("ca");
    let client = reqwest::Client::builder()
        .add_root_certificate(ca)
        .build()
        .expect("client");
    let send = |url: &str, body: &Vec<u8>| {
        let request = client
            .post(url)
            .header("content-type", "application/json")
            .body(body.clone());
        async move {
            let started = Instant::now();
            let response = request.send().await.expect("answered");
            let text = response.bytes().await.expect("body");
            (started.elapsed(), text)
        }
    };
    // Warm both connections.
    for _ in 0..20 {
        send(&real, &reviews[0].2).await;
        send(&noop, &reviews[0].2).await;
    }
    let (mut webhook_times, mut baseline_times) = (Vec::new(), Vec::new());
    for (_, _, body) in &reviews {
        // Interleaved, so both see the same machine load.
        let (t, text) = send(&real, body).await;
        let answer: Value = serde_json::from_slice(&text).expect("a review");
        assert_eq!(answer["response"]["allowed"], true);
        // kube's AdmissionResponse writes the patch as an array of bytes, which the API
        // server's decoder accepts as well as base64.
        assert!(!answer["response"]["patch"].is_null(), "{answer}");
        webhook_times.push(t);
        baseline_times.push(send(&noop, body).await.0);
    }
    for list in [&mut decisions, &mut webhook_times, &mut baseline_times] {
        list.sort();
    }
    let row = |name: &str, list: &[Duration]| {
        println!(
            "{name:<34} p50 {:>7.3} ms   p99 {:>7.3} ms",
            ms(percentile(list, 0.5)),
            ms(percentile(list, 0.99))
        );
    };
    println!(
        "webhook: {requests} admission reviews, stores with {workloads} Deployments, {workloads} ReplicaSets, {workloads} Recommendations, {NAMESPACES} policies"
    );
    row("decision alone (pure)", &decisions);
    row("HTTPS round trip, webhook", &webhook_times);
    row("HTTPS round trip, no-op baseline", &baseline_times);
    let ratio = |p: f64| {
        percentile(&webhook_times, p).as_secs_f64() / percentile(&baseline_times, p).as_secs_f64()
    };
    println!(
        "webhook / baseline: p50 {:.2}x, p99 {:.2}x; target p99 <= 10 ms: {}",
        ratio(0.5),
        ratio(0.99),
        if percentile(&webhook_times, 0.99) <= Duration::from_millis(10) {
            "met"
        } else {
            "NOT met"
        }
    );
}
