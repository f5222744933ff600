//! Peak memory of the `tailor run` agent while it reads usage from a hostile Prometheus, on
//! a real control plane (built by `scripts/control-plane`): `cargo bench --bench
//! prometheus_memory`.
//!
//! The Prometheus API is `tests/support/hostile_prometheus.rs`: its series lookup lists the
//! containers, and it answers each range query with valid JSON of the API. Runs, each with
//! a fresh agent (so its VmHWM is the run's own):
//!
//! - `ordinary`, the baseline: 362 containers, each answer 181 series (what a query of
//!   181 containers holds) without padding: four CPU answers of about 45 MB in flight;
//! - `hostile`: the same containers, each answer 240 series (the most Tailor takes for a
//!   query of 181) each padded with a label to the most Tailor reads of a series of its
//!   query's steps: four answers of about 180 MB in flight;
//! - `hostile x2`: as `hostile` with 724 containers, eight CPU answers, four at a time.
//!
//! Printed per run: the bytes of range answers read, how long the read took, the agent's
//! peak resident memory (VmHWM) against the chart's memory limit and as a ratio to the
//! baseline's, and how long a pod created when the read began waited for its NodeClaim.
//! Without `--bench` it does a small smoke run (40 containers).

#[allow(dead_code)]
#[path = "../tests/support/control_plane.rs"]
mod control_plane;
#[path = "../tests/support/hostile_prometheus.rs"]
mod hostile_prometheus;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use control_plane::{Agent, ControlPlane, chart_memory_limit_mib, eventually, metric_value};
use hostile_prometheus::Shape;
use tailor::apis::NodeClaim;

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
      - {key: tailor.sh/capacity-type, operator: In, values: [on-demand]}
      nodeClassRef: {group: tailor.sh, kind: AKSNodeClass, name: default}
  disruption: {consolidateAfter: 10m}
---
apiVersion: v1
kind: Namespace
metadata: {name: hostile}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: hostile}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - {name: c, image: i, resources: {requests: {cpu: 100m, memory: 64Mi}}}
"#;

struct Run {
    answers: usize,
    mib_read: f64,
    read_secs: f64,
    peak_mib: f64,
    claim_secs: f64,
    failed: bool,
}

async fn run(cp: &ControlPlane, n: usize, shape: Shape) -> Run {
    let server = hostile_prometheus::start(shape).await;
    // The earlier runs' Recommendations hold checkpoints: without them, this run reads the
    // whole window again.
    let recommendations: kube::Api<tailor::apis::Recommendation> =
        kube::Api::namespaced(cp.client.clone(), "hostile");
    let _ = recommendations
        .delete_collection(&Default::default(), &Default::default())
        .await;
    let started = Instant::now();
    let agent = Agent::start(
        cp,
        &format!("prometheus-{n}"),
        &["--mode", "autonomous", "--prometheus-url", &server.url],
    );
    agent.wait_ready().await;
    // The previous run's agent was killed holding the Lease: wait for this one to lead, so
    // the pod's wait is the read's doing, not the takeover's.
    agent.wait_leading(60).await;
    // A pod to provision while the read goes on, too large for the nodes earlier runs
    // bought, so it needs a NodeClaim of its own.
    let name = format!("pending-{n}");
    cp.apply_yaml(&format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}, namespace: default}}\n\
         spec:\n  replicas: 1\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    \
         metadata: {{labels: {{app: {name}}}}}\n    spec:\n      containers:\n      - name: c\n        \
         image: i\n        resources: {{requests: {{cpu: '3', memory: 4Gi}}}}\n"
    ))
    .await;
    let asked = Instant::now();
    let claims: kube::Api<NodeClaim> = kube::Api::all(cp.client.clone());
    let before = control_plane::list(&claims).await.len();
    eventually(
        Duration::from_secs(300),
        "a NodeClaim for the pod",
        || async { (control_plane::list(&claims).await.len() > before).then_some(()) },
    )
    .await;
    let claim_secs = asked.elapsed().as_secs_f64();
    let failed = eventually(Duration::from_secs(900), "the usage read done", || async {
        let text = agent.metrics().await;
        if metric_value(&text, "tailor_usage_read_failures_total") > 0.0 {
            return Some(true);
        }
        (metric_value(&text, "tailor_usage_queries_total") > 0.0).then_some(false)
    })
    .await;
    Run {
        answers: server.range_answers.load(Ordering::Relaxed),
        mib_read: server.range_bytes.load(Ordering::Relaxed) as f64 / 1048576.0,
        read_secs: started.elapsed().as_secs_f64(),
        peak_mib: agent.peak_memory_mib(),
        claim_secs,
        failed,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let containers = if full { 362 } else { 40 };
    let cp = ControlPlane::start().await;
    cp.apply_yaml(POOL).await;
    let limit = chart_memory_limit_mib();
    // What one query covers: the plan packs 2M points into a query, 10,999 a series.
    let covered = containers.min(181);
    let runs = [
        (
            "ordinary",
            Shape {
                containers,
                series: covered,
                pad_bytes: Some(0),
            },
        ),
        (
            "hostile",
            Shape {
                containers,
                series: covered + covered / 4 + 16,
                pad_bytes: None,
            },
        ),
        (
            "hostile x2",
            Shape {
                containers: 2 * containers,
                series: covered + covered / 4 + 16,
                pad_bytes: None,
            },
        ),
    ];
    println!(
        "{:<11} {:>8} {:>10} {:>8} {:>10} {:>9} {:>10} {:>8}",
        "answers", "queries", "read MiB", "read s", "peak MiB", "x limit", "x ordinary", "claim s"
    );
    let mut baseline = None;
    for (n, (what, shape)) in runs.into_iter().enumerate() {
        let r = run(&cp, n, shape).await;
        let base = *baseline.get_or_insert(r.peak_mib);
        println!(
            "{what:<11} {:>8} {:>10.0} {:>8.1} {:>10.0} {:>9.2} {:>10.2} {:>8.1}{}",
            r.answers,
            r.mib_read,
            r.read_secs,
            r.peak_mib,
            r.peak_mib / limit,
            r.peak_mib / base,
            r.claim_secs,
            if r.failed { "  (read refused)" } else { "" }
        );
    }
    println!("chart memory limit: {limit:.0} MiB; target: every peak under it");
}
