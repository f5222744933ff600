//! The right-sizing controller's round, as a program: `cargo bench --bench
//! rightsizing_interval`.
//!
//! A real Prometheus is backfilled with two hours of one-minute CPU and memory usage of
//! 10,000 containers (one per Deployment, in 20 namespaces), and the controller's code path
//! (`rightsizing::service::recommend_workloads`) runs twice: a cold round that reads the
//! policy's whole history window, then the steady round 15 minutes later that continues
//! every workload from its checkpoint and reads only the new 15 minutes. Prints the queries
//! and wall time of each and the ratios to the targets (≤ 10 s per round; ≤ 1/10 of KRR's
//! queries). Without `--bench` it does a small smoke run.

#[path = "../tests/support/prometheus.rs"]
mod prometheus_server;

use std::fmt::Write as _;
use std::time::Instant;

use tailor::apis::Mode;
use tailor::rightsizing::Prices;
use tailor::rightsizing::service::{
    DEFAULT_STEP_SECONDS, Policies, Request, Resume, recommend_workloads,
};
use tailor::state::Snapshot;
use tailor::usage::prometheus::{PrometheusSettings, PrometheusSource};
use tailor::usage::workloads::Workloads;

const NAMESPACES: usize = 20;

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let containers = if full { 10_000 } else { 200 };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(bench(containers));
}

async fn bench(containers: usize) {
    let end = jiff::Timestamp::now().as_second() / 60 * 60 - 60;
    let start = end - 2 * 3600;
    let began = Instant::now();
    let mut om = String::from("# TYPE container_cpu_usage_seconds counter\n");
    for i in 0..containers {
        let mut total = 0.0;
        for t in (start..=end).step_by(60) {
            total += (0.05 + (i % 13) as f64 * 0.02) * 60.0;
            let _ = writeln!(
                om,
                "container_cpu_usage_seconds_total{{namespace=\"ns-{}\",pod=\"app-{i}-5d8f7c9b4-abcde\",container=\"app\"}} {total} {t}",
                i % NAMESPACES
            );
        }
    }
    om.push_str("# TYPE container_memory_working_set_bytes gauge\n");
    for i in 0..containers {
        for t in (start..=end).step_by(60) {
            let _ = writeln!(
                om,
                "container_memory_working_set_bytes{{namespace=\"ns-{}\",pod=\"app-{i}-5d8f7c9b4-abcde\",container=\"app\"}} {} {t}",
                i % NAMESPACES,
                1.0e8 + (i % 7) as f64 * 1.0e7
            );
        }
    }
    om.push_str("# EOF\n");
    let server = prometheus_server::start_prometheus(&om).await;
    drop(om);
    let setup = began.elapsed().as_secs_f64();

    let mut yaml = String::new();
    for i in 0..containers {
        let _ = write!(
            yaml,
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: app-{i}, namespace: ns-{}}}\nspec:\n  replicas: 1\n  selector: {{matchLabels: {{app: app-{i}}}}}\n  template:\n    metadata: {{labels: {{app: app-{i}}}}}\n    spec:\n      containers:\n      - {{name: app, image: app, resources: {{requests: {{cpu: 500m, memory: 512Mi}}}}}}\n---\n",
            i % NAMESPACES
        );
    }
    let snapshot = Snapshot::from_yaml("bench.yaml", &yaml).expect("snapshot");
    let workloads = Workloads::from_snapshot(&snapshot);
    let policies = Policies::new(&[], Some("tailor"), Mode::Recommend);
    let source = PrometheusSource::new(PrometheusSettings::new(&server.url)).expect("source");
    let request = |now: i64, resume: Resume| Request {
        snapshot: &snapshot,
        workloads: &workloads,
        policies: &policies,
        namespaces: &[],
        history: None,
        step: DEFAULT_STEP_SECONDS,
        now,
        largest_node: None,
        prices: Prices::default(),
        resume,
        keep_hours: false,
        ooms: &[],
    };

    // The cold round, 15 minutes before the end: the whole 14-day window is planned.
    let t = Instant::now();
    let cold = recommend_workloads(&source, request(end - 900, Resume::Nothing))
        .await
        .expect("cold round");
    let cold_seconds = t.elapsed().as_secs_f64();
    // The steady round: every workload continues from its checkpoint.
    let t = Instant::now();
    let steady = recommend_workloads(
        &source,
        request(end, Resume::PerWorkload(cold.checkpoints.clone())),
    )
    .await
    .expect("steady round");
    let steady_seconds = t.elapsed().as_secs_f64();
    assert_eq!(
        steady.containers.len(),
        containers,
        "every container recommended"
    );

    // KRR issues one query per 50 pods per resource (its batching), every run.
    let krr = containers.div_ceil(50) * 2;
    println!(
        "== right-sizing round: {containers} containers, Prometheus over 2 h of 1-minute usage (setup {setup:.1}s) =="
    );
    println!(
        "cold round (14-day window, nothing checkpointed): {} queries, {} samples, {cold_seconds:.2}s",
        cold.stats.queries, cold.stats.samples
    );
    println!(
        "steady round (15 minutes after, from checkpoints): {} queries, {} samples, {steady_seconds:.2}s; ratio to the 10 s target {:.3} (target <= 1)",
        steady.stats.queries,
        steady.stats.samples,
        steady_seconds / 10.0
    );
    println!(
        "queries per round vs KRR ({krr}): cold {:.3}, steady {:.3} (target <= 0.1)",
        cold.stats.queries as f64 / krr as f64,
        steady.stats.queries as f64 / krr as f64
    );
}
