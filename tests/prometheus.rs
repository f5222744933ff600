//! Usage from a real Prometheus server (Debian's package), backfilled with promtool: the
//! Prometheus usage source must return what was written, per container, and fail clearly
//! when Prometheus is not there.

#[path = "support/apiserver.rs"]
mod apiserver;
#[path = "support/bin.rs"]
mod bin;
#[path = "support/prometheus.rs"]
mod prometheus_server;

use std::f64::consts::PI;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use apiserver::{Fake, FakeApiServer, objects_from_yaml};
use bin::tailor;
use prometheus_server::{free_port, start_prometheus, start_prometheus_with_auth};
use tailor::usage::prometheus::{PrometheusSettings, PrometheusSource};
use tailor::usage::{ContainerKey, UsageError, UsageQuery, UsageSource};

const DAY: i64 = 86_400;
const MIB: f64 = 1_048_576.0;

/// CPU cores of a synthetic container at time `t` (diurnal around `base`).
fn cpu_at(base: f64, t: i64) -> f64 {
    base * (1.0 + 0.5 * (2.0 * PI * (t % DAY) as f64 / DAY as f64).sin())
}

/// Memory bytes of a synthetic container at time `t`.
fn memory_at(base_mib: f64, t: i64) -> f64 {
    ((base_mib + 40.0 * (2.0 * PI * (t % DAY) as f64 / DAY as f64).cos()) * MIB).round()
}

struct Fixture {
    start: i64,
    end: i64,
    openmetrics: String,
}

/// Two days of one-minute samples from midnight UTC three days ago: two web containers, a
/// batch worker OOM-killed after 36 hours, and the pause and cgroup series that must be
/// ignored. The days start at midnight so that the decay weights meet the daily cycle at
/// the same phase whenever the test runs.
fn fixture() -> Fixture {
    let now = jiff::Timestamp::now().as_second();
    let start = (now / DAY) * DAY - 3 * DAY;
    let end = start + 2 * DAY;
    let containers = [
        ("shop", "web-1", "app", 0.4, 300.0),
        ("shop", "web-2", "app", 0.6, 500.0),
        ("batch", "job-x", "worker", 1.0, 1024.0),
    ];
    let mut om = String::new();
    om.push_str("# TYPE container_cpu_usage_seconds counter\n");
    for (ns, pod, c, base, _) in containers {
        let mut total = 0.0;
        for t in (start..=end).step_by(60) {
            total += cpu_at(base, t) * 60.0;
            let _ = writeln!(
                om,
                "container_cpu_usage_seconds_total{{namespace=\"{ns}\",pod=\"{pod}\",container=\"{c}\"}} {total} {t}"
            );
        }
    }
    for (ns, pod, c) in [("shop", "web-1", "POD"), ("shop", "web-1", "")] {
        for t in (start..=end).step_by(60) {
            let _ = writeln!(
                om,
                "container_cpu_usage_seconds_total{{namespace=\"{ns}\",pod=\"{pod}\",container=\"{c}\"}} {} {t}",
                (t - start) as f64 * 5.0
            );
        }
    }
    om.push_str("# TYPE container_memory_working_set_bytes gauge\n");
    for (ns, pod, c, _, mib) in containers {
        for t in (start..=end).step_by(60) {
            let _ = writeln!(
                om,
                "container_memory_working_set_bytes{{namespace=\"{ns}\",pod=\"{pod}\",container=\"{c}\"}} {} {t}",
                memory_at(mib, t)
            );
        }
    }
    om.push_str("# TYPE kube_pod_container_status_restarts counter\n");
    for t in (start..=end).step_by(60) {
        let restarts = i32::from(t >= start + 36 * 3600);
        let _ = writeln!(
            om,
            "kube_pod_container_status_restarts_total{{namespace=\"batch\",pod=\"job-x\",container=\"worker\"}} {restarts} {t}"
        );
    }
    om.push_str("# TYPE kube_pod_container_status_last_terminated_reason gauge\n");
    for t in (start + 36 * 3600..=end).step_by(60) {
        let _ = writeln!(
            om,
            "kube_pod_container_status_last_terminated_reason{{namespace=\"batch\",pod=\"job-x\",container=\"worker\",reason=\"OOMKilled\"}} 1 {t}"
        );
    }
    om.push_str("# EOF\n");
    Fixture {
        start,
        end,
        openmetrics: om,
    }
}

fn key(ns: &str, pod: &str, c: &str) -> ContainerKey {
    ContainerKey {
        namespace: ns.into(),
        pod: pod.into(),
        container: c.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_read_back_from_prometheus_matches_the_generated_history() {
    let f = fixture();
    let server = start_prometheus(&f.openmetrics).await;
    let source =
        PrometheusSource::new(PrometheusSettings::new(&server.url)).expect("source builds");
    // Skip the first 10 minutes, where rate() has not five minutes of counter behind it.
    let query = UsageQuery {
        namespaces: Vec::new(),
        start: f.start + 600,
        end: f.end,
        step: 60,
    };
    let usage = source.usage(&query).await.expect("usage reads");
    let keys: Vec<&ContainerKey> = usage.containers.keys().collect();
    assert_eq!(
        keys,
        vec![
            &key("batch", "job-x", "worker"),
            &key("shop", "web-1", "app"),
            &key("shop", "web-2", "app")
        ],
        "pause and cgroup-level series are left out"
    );
    // Series discovery, then one query each for CPU, memory peaks and OOM kills.
    assert_eq!(usage.queries, 5);
    for (k, base, mib) in [
        (key("shop", "web-1", "app"), 0.4, 300.0),
        (key("shop", "web-2", "app"), 0.6, 500.0),
    ] {
        let u = &usage.containers[&k];
        let expected_points = ((query.end - query.start) / 60 + 1) as usize;
        // Memory comes back as the exact peak of each hour, keyed by the hour's start.
        assert_eq!(
            u.memory.len() as i64,
            (query.end - query.start) / 3600,
            "{k:?}"
        );
        for (s, v) in &u.memory {
            let peak = (1..=60)
                .map(|m| memory_at(mib, s + m * 60))
                .fold(0.0, f64::max);
            assert_eq!(*v, peak, "{k:?} memory peak of the hour from {s}");
        }
        // CPU is rate() over 5 minutes of a counter built from the per-minute usage: each
        // point is the mean usage of the five minutes before it.
        assert!(
            u.cpu.len() >= expected_points - 1,
            "{k:?}: {} cpu points",
            u.cpu.len()
        );
        for (t, v) in &u.cpu {
            let mean: f64 = (0..5).map(|i| cpu_at(base, t - i * 60)).sum::<f64>() / 5.0;
            assert!(
                (v - mean).abs() <= 0.01 * mean,
                "{k:?} cpu at {t}: {v} vs {mean}"
            );
        }
        assert!(u.oom_kills.is_empty());
    }
    let worker = &usage.containers[&key("batch", "job-x", "worker")];
    assert_eq!(
        worker.oom_kills.len(),
        1,
        "one kill: {:?}",
        worker.oom_kills
    );
    let at = worker.oom_kills[0];
    assert!(
        (f.start + 36 * 3600..f.start + 37 * 3600).contains(&at),
        "the OOM kill is dated within the hour after it: {at}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_filter_reads_only_those_namespaces() {
    let f = fixture();
    let server = start_prometheus(&f.openmetrics).await;
    let source =
        PrometheusSource::new(PrometheusSettings::new(&server.url)).expect("source builds");
    let usage = source
        .usage(&UsageQuery {
            namespaces: vec!["batch".to_string()],
            start: f.start + 600,
            end: f.start + 3600,
            step: 60,
        })
        .await
        .expect("usage reads");
    assert_eq!(
        usage.containers.keys().collect::<Vec<_>>(),
        vec![&key("batch", "job-x", "worker")]
    );
    assert_eq!(usage.queries, 5);
}

/// The share of CFS periods throttled is read per hour for the containers that have the
/// counters, and a container throttled that way keeps its CPU limit when its request falls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_is_read_per_hour_and_keeps_a_throttled_containers_limit() {
    use tailor::rightsizing::{ContainerHistory, Context, Policy, Requests, recommend};
    let start = (jiff::Timestamp::now().as_second() - 6 * 3600) / 3600 * 3600;
    let hours = 4;
    let mut om = String::from("# TYPE container_cpu_usage_seconds counter\n");
    let labels = |pod: &str| format!("namespace=\"shop\",pod=\"{pod}\",container=\"app\"");
    for pod in ["limited", "free"] {
        for m in 0..=hours * 60 {
            let _ = writeln!(
                om,
                "container_cpu_usage_seconds_total{{{}}} {} {}",
                labels(pod),
                0.3 * 60.0 * m as f64,
                start + m * 60
            );
        }
    }
    om.push_str("# TYPE container_memory_working_set_bytes gauge\n");
    for pod in ["limited", "free"] {
        for m in 0..=hours * 60 {
            let _ = writeln!(
                om,
                "container_memory_working_set_bytes{{{}}} {} {}",
                labels(pod),
                200.0 * MIB,
                start + m * 60
            );
        }
    }
    // 100 ms periods: 600 a minute; "limited" is throttled in 30% of them for three
    // hours, then not at all.
    om.push_str("# TYPE container_cpu_cfs_periods counter\n");
    for m in 0..=hours * 60 {
        let _ = writeln!(
            om,
            "container_cpu_cfs_periods_total{{{}}} {} {}",
            labels("limited"),
            600 * m,
            start + m * 60
        );
    }
    om.push_str("# TYPE container_cpu_cfs_throttled_periods counter\n");
    for m in 0..=hours * 60 {
        let throttled = 180 * m.min(3 * 60);
        let _ = writeln!(
            om,
            "container_cpu_cfs_throttled_periods_total{{{}}} {throttled} {}",
            labels("limited"),
            start + m * 60
        );
    }
    om.push_str("# EOF\n");
    let server = start_prometheus(&om).await;
    let source =
        PrometheusSource::new(PrometheusSettings::new(&server.url)).expect("source builds");
    let usage = source
        .usage(&UsageQuery {
            namespaces: Vec::new(),
            start,
            end: start + hours * 3600,
            step: 60,
        })
        .await
        .expect("usage reads");
    let limited = &usage.containers[&key("shop", "limited", "app")].throttled;
    let free = &usage.containers[&key("shop", "free", "app")].throttled;
    assert!(free.is_empty(), "{free:?}");
    let shares: Vec<f64> = limited.iter().map(|(_, s)| *s).collect();
    assert!(
        shares.iter().filter(|s| (0.25..=0.35).contains(*s)).count() >= 2
            && shares.iter().any(|s| *s < 0.01),
        "{limited:?}"
    );
    // The hours read tell the recommender the container was throttled: its 600m limit
    // stays although its request falls from 1 core to about 300m.
    let policy = Policy::default();
    let mut history = ContainerHistory::new(&policy, start);
    for (t, v) in &usage.containers[&key("shop", "limited", "app")].cpu {
        history.add_cpu(*t, *v);
    }
    for (_, share) in limited {
        history.note_throttling(*share);
    }
    let deployed = Requests {
        cpu: Some(1000),
        memory: None,
        cpu_limit: Some(600),
        memory_limit: None,
    };
    let r = recommend(
        &history,
        deployed,
        &policy,
        &Context::default(),
        start + hours * 3600,
    );
    assert!(r.recommended.cpu.is_some_and(|c| c < 1000), "{r:?}");
    assert_eq!(r.recommended.cpu_limit, Some(600), "{:?}", r.reasons);
    // Without the throttling read, the limit follows the request down.
    let mut unthrottled = ContainerHistory::new(&policy, start);
    for (t, v) in &usage.containers[&key("shop", "limited", "app")].cpu {
        unthrottled.add_cpu(*t, *v);
    }
    let r = recommend(
        &unthrottled,
        deployed,
        &policy,
        &Context::default(),
        start + hours * 3600,
    );
    assert!(r.recommended.cpu_limit.is_some_and(|l| l < 600), "{r:?}");
}

#[tokio::test]
async fn an_unreachable_prometheus_is_an_error_naming_it() {
    let port = free_port();
    let mut settings = PrometheusSettings::new(&format!("http://127.0.0.1:{port}"));
    settings.retries = 1;
    settings.timeout = Duration::from_secs(2);
    let source = PrometheusSource::new(settings).expect("source builds");
    let err = source
        .usage(&UsageQuery {
            namespaces: Vec::new(),
            start: 1_800_000_000,
            end: 1_800_003_600,
            step: 60,
        })
        .await
        .expect_err("nothing listens there");
    assert!(matches!(err, UsageError::Unavailable { .. }), "{err}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
    // It names the setting to check and the docs section.
    assert!(
        err.to_string().contains("settings.prometheusUrl")
            && err
                .to_string()
                .contains("docs/install.md#prometheus-or-azure-managed-prometheus"),
        "{err}"
    );
}

#[test]
fn bad_settings_are_rejected_before_any_query() {
    let mut settings = PrometheusSettings::new("http://127.0.0.1:9090");
    settings.bearer_token_file = Some(Path::new("/nonexistent/token").to_path_buf());
    let err = PrometheusSource::new(settings)
        .err()
        .expect("missing token file");
    assert!(err.to_string().contains("/nonexistent/token"), "{err}");
    let mut settings = PrometheusSettings::new("http://127.0.0.1:9090");
    settings.headers = vec![("bad header".to_string(), "x".to_string())];
    assert!(PrometheusSource::new(settings).is_err());
}

const SNAPSHOT: &str = "
apiVersion: tailor.sh/v1alpha1
kind: RightsizingPolicy
metadata: {name: default, namespace: tailor}
spec:
  profile: CostFirst
  update: {maxStepFraction: 1.0}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web, namespace: shop}
spec:
  replicas: 2
  serviceName: web
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: app
        image: shop/web
        resources:
          requests: {cpu: '2', memory: 2Gi}
          limits: {cpu: '4', memory: 4Gi}
---
apiVersion: v1
kind: Pod
metadata: {name: job-x, namespace: batch}
spec:
  containers:
  - {name: worker, image: batch/worker, resources: {requests: {cpu: '1', memory: 512Mi}}}
";

/// The weighted percentile of `samples` with VPA's decay weights (half-life one day),
/// computed directly from the values — no buckets.
fn weighted_percentile(samples: &[(i64, f64)], start: i64, p: f64) -> f64 {
    let mut v: Vec<(f64, f64)> = samples
        .iter()
        .map(|(t, x)| (*x, ((t - start) as f64 / DAY as f64).exp2()))
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: f64 = v.iter().map(|s| s.1).sum();
    let mut sum = 0.0;
    for (x, w) in &v {
        sum += w;
        if sum >= p * total {
            return *x;
        }
    }
    v.last().map_or(0.0, |s| s.0)
}

/// The decay-weighted mean of `r - x` over samples below `r` (the cores a request of `r`
/// leaves unused), and the decay-weighted share of samples above `r` (starved).
fn waste_and_above(samples: &[(i64, f64)], start: i64, r: f64) -> (f64, f64) {
    let (mut total, mut waste, mut above) = (0.0, 0.0, 0.0);
    for (t, x) in samples {
        let w = ((t - start) as f64 / DAY as f64).exp2();
        total += w;
        if *x > r {
            above += w;
        } else {
            waste += w * (r - x);
        }
    }
    (waste / total, above / total)
}

fn cpu_milli(q: &serde_json::Value) -> f64 {
    let s = q.as_str().expect("a quantity");
    s.strip_suffix('m').map_or_else(
        || s.parse::<f64>().expect("cores") * 1000.0,
        |m| m.parse().expect("millicores"),
    )
}

fn bytes(q: &serde_json::Value) -> f64 {
    let s = q.as_str().expect("a quantity");
    match s.strip_suffix("Mi") {
        Some(m) => m.parse::<f64>().expect("MiB") * MIB,
        None => match s.strip_suffix("Gi") {
            Some(g) => g.parse::<f64>().expect("GiB") * 1024.0 * MIB,
            None => s.parse().expect("bytes"),
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tailor_recommend_matches_values_computed_from_the_generated_samples() {
    let f = fixture();
    let server = start_prometheus(&f.openmetrics).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let snapshot = dir.path().join("cluster.yaml");
    std::fs::write(&snapshot, SNAPSHOT).expect("write snapshot");
    let now = jiff::Timestamp::from_second(f.end)
        .expect("valid")
        .to_string();
    let url = server.url.clone();
    let snap = snapshot.to_string_lossy().into_owned();
    let (ok, stdout, stderr) = tokio::task::spawn_blocking(move || {
        tailor(&[
            "recommend",
            "--prometheus-url",
            &url,
            "--snapshot",
            &snap,
            "--history",
            "2d",
            "--now",
            &now,
            "-o",
            "json",
        ])
    })
    .await
    .expect("joined");
    assert!(ok, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("valid JSON");
    let recs = report["recommendations"].as_array().expect("a list");
    assert_eq!(recs.len(), 2, "{report}");
    let web = recs
        .iter()
        .find(|r| r["workload"]["name"] == "web")
        .expect("the StatefulSet's container, pooled over web-1 and web-2");
    assert_eq!(web["workload"]["kind"], "StatefulSet");
    assert_eq!(web["container"], "app");
    assert_eq!(web["current"]["requests"]["cpu"], "2");

    // CPU: the usage of every minute (read with irate at the default 1-minute step),
    // decay-weighted (the web's over both replicas). The floor is the policy's percentile
    // (the median), raised to the burst percentile (99th) over the burst headroom if that
    // at most doubles it (no CPU margin by default).
    let defaults = tailor::rightsizing::Policy::from_spec(&tailor::apis::RightsizingPolicySpec {
        profile: tailor::apis::Profile::CostFirst,
        ..Default::default()
    })
    .expect("the snapshot's policy");
    let (burst_p, headroom) = defaults
        .cpu_burst
        .expect("the burst guard is on by default");
    let start = f.end - 2 * DAY;
    let minutes = |bases: &[f64]| -> Vec<(i64, f64)> {
        let mut cpu = Vec::new();
        for base in bases {
            for t in (start + 60..=f.end).step_by(60) {
                cpu.push((t, cpu_at(*base, t)));
            }
        }
        cpu
    };
    let fleet = [minutes(&[0.4, 0.6]), minutes(&[1.0])];
    let floor = |cpu: &[(i64, f64)]| {
        let body = weighted_percentile(cpu, start, defaults.cpu_percentiles.0);
        let burst = weighted_percentile(cpu, start, burst_p) / headroom;
        if burst <= defaults.cpu_burst_cap * body {
            body.max(burst)
        } else {
            body
        }
    };
    // Above the floor, both containers (the policy's fleet, under the snapshot's CostFirst
    // profile) are sized under one price on a starved share: each request is the level
    // minimising its decay-weighted waste in cores plus the price times its share of
    // samples above, and the price is the lowest at which the fleet (each container
    // weighing by its samples) leaves at most the profile's budget (7.25%) of its samples
    // above. Found exactly here over the samples'
    // own values; Tailor finds it over 5% buckets.
    let level = |cpu: &[(i64, f64)], price: f64| {
        let lowest = floor(cpu);
        cpu.iter()
            .map(|s| s.1)
            .chain([lowest])
            .filter(|r| *r >= lowest)
            .map(|r| (waste_and_above(cpu, start, r), r))
            .fold((f64::INFINITY, lowest), |best, ((waste, above), r)| {
                let cost = waste + price * above;
                if cost < best.0 { (cost, r) } else { best }
            })
            .1
    };
    let starved = |price: f64| {
        let samples: usize = fleet.iter().map(Vec::len).sum();
        fleet
            .iter()
            .map(|cpu| cpu.len() as f64 * waste_and_above(cpu, start, level(cpu, price)).1)
            .sum::<f64>()
            / samples as f64
    };
    let (mut lo, mut hi): (f64, f64) = (1e-6, 1e3);
    for _ in 0..60 {
        let mid: f64 = (lo * hi).sqrt();
        if starved(mid) > defaults.cpu_starvation_budget {
            lo = mid
        } else {
            hi = mid
        }
    }
    let best = level(&fleet[0], hi) * 1000.0;
    let web_floor = floor(&fleet[0]) * 1000.0;
    // At midnight the median is well short of that level.
    assert!(best > web_floor * 1.2, "{best} vs {web_floor}");
    let got_cpu = cpu_milli(&web["recommended"]["requests"]["cpu"]);
    assert!(
        got_cpu >= best * 0.95 && got_cpu <= best * 1.05 + 1.0,
        "cpu {got_cpu}m vs {best:.0}m (floor {web_floor:.0}m)"
    );
    // Memory: the highest daily peak over both replicas (web-2 reaches exactly 540Mi every
    // day), plus 4%, rounded up to a MiB.
    let expected_memory = 540.0 * MIB * 1.04;
    let got_memory = bytes(&web["recommended"]["requests"]["memory"]);
    assert!(
        got_memory >= expected_memory && got_memory <= expected_memory + MIB,
        "memory {} vs {}",
        got_memory / MIB,
        expected_memory / MIB
    );
    // Limits keep their 2x ratio; shrinking saves money.
    assert_eq!(
        cpu_milli(&web["recommended"]["limits"]["cpu"]),
        2.0 * got_cpu
    );
    assert!(web["monthlyCostDelta"].as_f64().expect("a number") < 0.0);

    let worker = recs
        .iter()
        .find(|r| r["workload"]["name"] == "job-x")
        .expect("the bare pod");
    assert_eq!(worker["workload"]["kind"], "Pod");
    // The OOM kill bumps memory to the peak of the hour it happened in plus 20%.
    let at_kill = (1..=60)
        .map(|m| memory_at(1024.0, f.start + 35 * 3600 + m * 60))
        .fold(0.0, f64::max);
    assert!(
        bytes(&worker["recommended"]["requests"]["memory"]) >= at_kill * 1.2,
        "{worker}"
    );
    assert!(
        worker["reasons"]
            .as_array()
            .expect("reasons")
            .iter()
            .any(|r| r.as_str().is_some_and(|s| s.contains("OOM")))
    );
    assert_eq!(report["summary"]["prometheusQueries"], 5);
    assert_eq!(report["summary"]["containers"], 2);
}

#[test]
fn tailor_recommend_reports_an_unreachable_prometheus_and_prints_no_recommendation() {
    let dir = tempfile::tempdir().expect("temp dir");
    let snapshot = dir.path().join("cluster.yaml");
    std::fs::write(&snapshot, SNAPSHOT).expect("write snapshot");
    let url = format!("http://127.0.0.1:{}", free_port());
    let (ok, stdout, stderr) = tailor(&[
        "recommend",
        "--prometheus-url",
        &url,
        "--prometheus-timeout-seconds",
        "2",
        "--snapshot",
        snapshot.to_str().expect("utf-8"),
    ]);
    assert!(!ok);
    assert!(stdout.is_empty(), "no recommendation is printed: {stdout}");
    assert!(stderr.contains(&url), "{stderr}");
}

/// Runs `tailor recommend` against `url` for the fixture's snapshot with extra flags.
async fn recommend(url: &str, snapshot: &Path, now: i64, extra: &[&str]) -> String {
    let now = jiff::Timestamp::from_second(now)
        .expect("valid")
        .to_string();
    let mut args: Vec<String> = [
        "recommend",
        "--prometheus-url",
        url,
        "--snapshot",
        snapshot.to_str().expect("utf-8"),
        "--history",
        "2d",
        "--now",
        &now,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    let (ok, stdout, stderr) = tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        tailor(&refs)
    })
    .await
    .expect("joined");
    assert!(ok, "{stderr}");
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_resumed_from_its_state_file_reads_only_new_usage_and_agrees_with_a_full_run() {
    let f = fixture();
    let server = start_prometheus(&f.openmetrics).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let snapshot = dir.path().join("cluster.yaml");
    std::fs::write(&snapshot, SNAPSHOT).expect("write snapshot");
    let state = dir.path().join("state.json");
    let state_arg = state.to_str().expect("utf-8");

    let full: serde_json::Value =
        serde_json::from_str(&recommend(&server.url, &snapshot, f.end, &["-o", "json"]).await)
            .expect("json");
    // First run stops six hours short of the end and saves its state.
    let first: serde_json::Value = serde_json::from_str(
        &recommend(
            &server.url,
            &snapshot,
            f.end - 6 * 3600,
            &["-o", "json", "--state", state_arg],
        )
        .await,
    )
    .expect("json");
    assert!(state.exists(), "the state file is written");
    let resumed: serde_json::Value = serde_json::from_str(
        &recommend(
            &server.url,
            &snapshot,
            f.end,
            &["-o", "json", "--state", state_arg],
        )
        .await,
    )
    .expect("json");
    let from = jiff::Timestamp::from_second(f.end - 6 * 3600)
        .expect("valid")
        .to_string();
    assert_eq!(resumed["summary"]["readFrom"], from.as_str());
    let (a, b) = (
        full["summary"]["samplesRead"].as_f64().expect("a count"),
        resumed["summary"]["samplesRead"].as_f64().expect("a count"),
    );
    assert!(
        b < a / 4.0,
        "six hours read instead of two days: {b} vs {a}"
    );
    let pick = |r: &serde_json::Value, name: &str| {
        r["recommendations"]
            .as_array()
            .expect("a list")
            .iter()
            .find(|e| e["workload"]["name"] == name)
            .cloned()
            .expect("present")
    };
    let (f_web, r_web) = (pick(&full, "web"), pick(&resumed, "web"));
    assert_eq!(
        f_web["recommended"]["requests"]["memory"],
        r_web["recommended"]["requests"]["memory"]
    );
    // The state keeps the first run's CPU target for its hour: the resumed request is the
    // mean of the two hours' targets (the full run's being the target of the last hour),
    // or the last hour's alone when it is more than the hysteresis (10%) above the first.
    let (fc, rc, first_c) = (
        cpu_milli(&f_web["recommended"]["requests"]["cpu"]),
        cpu_milli(&r_web["recommended"]["requests"]["cpu"]),
        cpu_milli(&pick(&first, "web")["recommended"]["requests"]["cpu"]),
    );
    let expected = if fc > first_c * 1.1 {
        fc
    } else {
        (fc + first_c) / 2.0
    };
    assert!(
        (expected - rc).abs() <= 0.05 * expected + 1.0,
        "cpu {rc}: not {expected} from {first_c} (six hours before) and {fc}"
    );

    // A corrupt state file is an error naming it, and is left as it was.
    std::fs::write(&state, "{not json").expect("write");
    let now = jiff::Timestamp::from_second(f.end)
        .expect("valid")
        .to_string();
    let url = server.url.clone();
    let snap = snapshot.to_string_lossy().into_owned();
    let state_owned = state_arg.to_string();
    let (ok, stdout, stderr) = tokio::task::spawn_blocking(move || {
        tailor(&[
            "recommend",
            "--prometheus-url",
            &url,
            "--snapshot",
            &snap,
            "--now",
            &now,
            "--state",
            &state_owned,
        ])
    })
    .await
    .expect("joined");
    assert!(!ok && stdout.is_empty());
    assert!(stderr.contains("state.json"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&state).expect("read"), "{not json");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csv_and_html_reports_hold_every_container() {
    let f = fixture();
    let server = start_prometheus(&f.openmetrics).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let snapshot = dir.path().join("cluster.yaml");
    std::fs::write(&snapshot, SNAPSHOT).expect("write snapshot");
    let csv = recommend(&server.url, &snapshot, f.end, &["-o", "csv"]).await;
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    let headers = reader.headers().expect("a header").clone();
    assert_eq!(&headers[0], "namespace");
    let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.expect("a row")).collect();
    assert_eq!(rows.len(), 2, "{csv}");
    let web = rows.iter().find(|r| &r[2] == "web").expect("web row");
    assert_eq!(&web[1], "StatefulSet");
    assert_eq!(&web[4], "2");

    let html = recommend(&server.url, &snapshot, f.end, &["-o", "html"]).await;
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(!html.contains("<script"), "self-contained, no scripts");
    // A CPU and a memory chart per container, each with usage and request lines.
    assert_eq!(html.matches("<svg").count(), 4, "two charts per container");
    assert!(html.contains("recommended") && html.contains("hourly peak"));
    assert!(html.contains("StatefulSet/web"));
}

/// A bcrypt hash (cost 12) of `monitoreo2021`, for Prometheus' web config.
const PASSWORD: &str = "monitoreo2021";
const PASSWORD_HASH: &str = "$2b$12$Kvf88U2IcARZwSqI7x0JTO22i763bOvDQl/C7ZGUM2bnAvLUDrEQy";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_auth_and_relabelled_series_are_read_with_their_flags() {
    let f = fixture();
    // The older cadvisor relabelling: the same series under other label names.
    let relabelled = f
        .openmetrics
        .replace("{namespace=", "{kubernetes_namespace=")
        .replace(",pod=", ",pod_name=")
        .replace(",container=", ",container_name=");
    let server =
        start_prometheus_with_auth(&relabelled, Some(("tailor", PASSWORD, PASSWORD_HASH))).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let snapshot = dir.path().join("cluster.yaml");
    std::fs::write(&snapshot, SNAPSHOT).expect("write snapshot");
    let password = dir.path().join("password");
    std::fs::write(&password, format!("{PASSWORD}\n")).expect("write password");
    let labels = [
        "--prometheus-namespace-label",
        "kubernetes_namespace",
        "--prometheus-pod-label",
        "pod_name",
        "--prometheus-container-label",
        "container_name",
    ];

    // Without credentials Prometheus refuses, and the error says where and why.
    let (url, snap) = (server.url.clone(), snapshot.clone());
    let (ok, stdout, stderr) = tokio::task::spawn_blocking(move || {
        tailor(&[
            "recommend",
            "--prometheus-url",
            &url,
            "--snapshot",
            snap.to_str().expect("utf-8"),
        ])
    })
    .await
    .expect("joined");
    assert!(!ok);
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains(&server.url) && stderr.contains("401"),
        "{stderr}"
    );

    let mut extra = vec![
        "--prometheus-basic-auth-user",
        "tailor",
        "--prometheus-basic-auth-password-file",
        password.to_str().expect("utf-8"),
        "-o",
        "json",
    ];
    extra.extend(labels);
    let json = recommend(&server.url, &snapshot, f.end, &extra).await;
    let report: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    let recs = report["recommendations"].as_array().expect("a list");
    assert_eq!(recs.len(), 2, "{report}");
    let web = recs
        .iter()
        .find(|r| r["workload"]["name"] == "web")
        .expect("web");
    // Same peak as under the standard labels: 540Mi plus 4%.
    let memory = bytes(&web["recommended"]["requests"]["memory"]);
    assert!(
        (540.0 * MIB * 1.04..=540.0 * MIB * 1.04 + MIB).contains(&memory),
        "{web}"
    );
    let worker = recs
        .iter()
        .find(|r| r["workload"]["name"] == "job-x")
        .expect("job-x");
    assert!(worker["reasons"].to_string().contains("OOM"), "{worker}");
}

#[test]
fn a_bad_label_flag_is_rejected_naming_the_flag() {
    let dir = tempfile::tempdir().expect("temp dir");
    let snapshot = dir.path().join("cluster.yaml");
    std::fs::write(&snapshot, SNAPSHOT).expect("write snapshot");
    let (ok, stdout, stderr) = tailor(&[
        "recommend",
        "--prometheus-url",
        "http://127.0.0.1:1",
        "--snapshot",
        snapshot.to_str().expect("utf-8"),
        "--prometheus-pod-label",
        "pod-name",
    ]);
    assert!(!ok);
    assert!(stdout.is_empty());
    assert!(
        stderr.contains("--prometheus-pod-label") && stderr.contains("pod-name"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recommend_from_a_live_cluster_agrees_with_the_same_objects_in_a_file() {
    let f = fixture();
    let server = start_prometheus(&f.openmetrics).await;
    let api = FakeApiServer::start(Fake {
        objects: objects_from_yaml(SNAPSHOT),
        crds: true,
        page_size: 1,
        ..Fake::default()
    })
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let snapshot = dir.path().join("cluster.yaml");
    std::fs::write(&snapshot, SNAPSHOT).expect("write snapshot");
    let kubeconfig = api.kubeconfig(dir.path());
    let from_file = recommend(&server.url, &snapshot, f.end, &["-o", "json"]).await;
    let now = jiff::Timestamp::from_second(f.end)
        .expect("valid")
        .to_string();
    let url = server.url.clone();
    let (ok, from_cluster, stderr) = tokio::task::spawn_blocking(move || {
        tailor(&[
            "recommend",
            "--prometheus-url",
            &url,
            "--kubeconfig",
            kubeconfig.to_str().expect("utf-8"),
            "--history",
            "2d",
            "--now",
            &now,
            "-o",
            "json",
        ])
    })
    .await
    .expect("joined");
    assert!(ok, "{stderr}");
    let file: serde_json::Value = serde_json::from_str(&from_file).expect("JSON");
    let cluster: serde_json::Value = serde_json::from_str(&from_cluster).expect("JSON");
    assert_eq!(cluster["recommendations"], file["recommendations"]);
    assert_eq!(cluster["recommendations"].as_array().map(Vec::len), Some(2));
    // The policy came from the cluster too: the RightsizingPolicy was listed.
    assert!(
        api.requests()
            .iter()
            .any(|r| r.starts_with("/apis/tailor.sh/v1alpha1/rightsizingpolicies"))
    );
}

/// What the fake Prometheus answers to a request.
enum Answer {
    /// A whole answer with this content type.
    Full(&'static str, String),
    /// A JSON answer that never ends.
    Endless,
    /// Nothing, ever.
    Silent,
}

/// A server on a loopback port that answers each request by its path; returns its URL.
async fn fake_prometheus(answer: impl Fn(&str) -> Answer + Send + Sync + 'static) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let answer = std::sync::Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 8192];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let path = String::from_utf8_lossy(&head)
                    .split_whitespace()
                    .nth(1)
                    .unwrap_or("")
                    .to_string();
                match answer(&path) {
                    Answer::Full(content_type, body) => {
                        let reply = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = socket.write_all(reply.as_bytes()).await;
                    }
                    Answer::Endless => {
                        let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"status\":\"success\",\"data\":[";
                        let _ = socket.write_all(head.as_bytes()).await;
                        let chunk = "{\"pod\":\"p\"},".repeat(10_000);
                        while socket.write_all(chunk.as_bytes()).await.is_ok() {}
                    }
                    Answer::Silent => tokio::time::sleep(Duration::from_secs(3600)).await,
                }
            });
        }
    });
    url
}

fn hour_query() -> UsageQuery {
    UsageQuery {
        namespaces: Vec::new(),
        start: 1_800_000_000,
        end: 1_800_003_600,
        step: 60,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_html_answer_is_named_as_html_not_the_prometheus_api() {
    let url = fake_prometheus(|_| {
        Answer::Full(
            "text/html; charset=utf-8",
            "<!doctype html><html><body>Sign in</body></html>".to_string(),
        )
    })
    .await;
    let source = PrometheusSource::new(PrometheusSettings::new(&url)).expect("source builds");
    let err = source
        .usage(&hour_query())
        .await
        .expect_err("HTML is no answer");
    let msg = err.to_string();
    assert!(
        msg.contains("the answer is HTML, not the Prometheus API") && msg.contains(&url),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_answer_is_cut_at_the_size_cap_and_reported() {
    let url = fake_prometheus(|_| Answer::Endless).await;
    let mut settings = PrometheusSettings::new(&url);
    settings.max_response_bytes = 1 << 20;
    let source = PrometheusSource::new(settings).expect("source builds");
    let err = source.usage(&hour_query()).await.expect_err("too large");
    let msg = err.to_string();
    assert!(
        msg.contains("larger than the 1048576 bytes read at most"),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_is_reported_as_a_timeout_with_its_length() {
    let url = fake_prometheus(|_| Answer::Silent).await;
    let mut settings = PrometheusSettings::new(&url);
    settings.timeout = Duration::from_secs(1);
    settings.retries = 1;
    let source = PrometheusSource::new(settings).expect("source builds");
    let err = source.usage(&hour_query()).await.expect_err("no answer");
    assert!(matches!(err, UsageError::Unavailable { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("timed out after 1 s") && msg.contains("tried 2 times"),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn implausible_samples_are_dropped_and_counted() {
    // Six hours: every query has at least the five steps the answer's series hold.
    let q = UsageQuery {
        start: hour_query().end - 6 * 3600,
        ..hour_query()
    };
    let t = q.end;
    let url = fake_prometheus(move |path| {
        let labels = r#"{"namespace":"shop","pod":"web-1","container":"app"}"#;
        let body = if path.ends_with("/series") {
            format!(r#"{{"status":"success","data":[{labels}]}}"#)
        } else {
            // NaN, infinity, a negative, an absurd value and one real sample.
            format!(
                r#"{{"status":"success","data":{{"resultType":"matrix","result":[{{"metric":{labels},"values":[[{},"NaN"],[{},"+Inf"],[{},"-1"],[{},"1e308"],[{t},"0.5"]]}}]}}}}"#,
                t - 4,
                t - 3,
                t - 2,
                t - 1
            )
        };
        Answer::Full("application/json", body)
    })
    .await;
    let source = PrometheusSource::new(PrometheusSettings::new(&url)).expect("source builds");
    let mut usage = tailor::usage::Usage::default();
    let stats = source.read(&q, &mut usage).await.expect("reads");
    // CPU, memory and throttling (a share, 0..1) drop four of five samples each; OOM kills
    // only the non-finite two.
    assert_eq!(stats.rejected_samples, 4 + 4 + 4 + 2, "{stats:?}");
    let app = &usage.containers[&key("shop", "web-1", "app")];
    assert_eq!(app.cpu, vec![(t, 0.5)]);
    assert_eq!(app.memory, vec![(t - 3600, 0.5)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recommend_fails_with_what_to_check_when_nothing_matches_and_names_containers_without_usage()
 {
    let f = fixture();
    let server = start_prometheus(&f.openmetrics).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let snapshot = dir.path().join("cluster.yaml");
    // The web pods also run a proxy sidecar that Prometheus has no series for.
    let with_sidecar = SNAPSHOT.replace(
        "      - name: app\n",
        "      - {name: proxy, image: envoy, resources: {requests: {cpu: 100m}}}\n      - name: app\n",
    );
    std::fs::write(&snapshot, &with_sidecar).expect("write snapshot");
    let now = jiff::Timestamp::from_second(f.end)
        .expect("valid")
        .to_string();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "recommend".to_string(),
            "--prometheus-url".to_string(),
            server.url.clone(),
            "--snapshot".to_string(),
            snapshot.to_string_lossy().into_owned(),
            "--history".to_string(),
            "2d".to_string(),
            "--now".to_string(),
            now.clone(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        std::thread::spawn(move || {
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            tailor(&refs)
        })
    };
    let (ok, stdout, stderr) = run(&["-o", "json"]).join().expect("joined");
    assert!(ok, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("valid JSON");
    assert_eq!(
        report["summary"]["containersWithoutUsage"],
        serde_json::json!([{"namespace": "shop", "workload": {"kind": "StatefulSet", "name": "web"}, "container": "proxy"}])
    );
    assert!(stderr.contains("shop/StatefulSet/web/proxy"), "{stderr}");

    // A pod label no series carries: nothing matches, and the message says what to check.
    let (ok, stdout, stderr) = run(&["--prometheus-pod-label", "pod_name"])
        .join()
        .expect("joined");
    assert!(!ok && stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("nothing to report")
            && stderr.contains("--prometheus-pod-label \"pod_name\"")
            && stderr.contains("shop/StatefulSet/web/app"),
        "{stderr}"
    );

    // A namespace the snapshot does not have.
    let (ok, _, stderr) = run(&["-n", "nowhere"]).join().expect("joined");
    assert!(!ok);
    assert!(
        stderr.contains("no workload in namespace(s) nowhere: check --namespace")
            && stderr.contains("batch, shop"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_would_take_too_many_queries_is_refused_before_the_first() {
    let requests = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = requests.clone();
    let url = fake_prometheus(move |path| {
        seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        assert!(
            path.ends_with("/series"),
            "only the series lookup is sent: {path}"
        );
        Answer::Full(
            "application/json",
            r#"{"status":"success","data":[{"namespace":"shop","pod":"web-1","container":"app"}]}"#
                .to_string(),
        )
    })
    .await;
    let source = PrometheusSource::new(PrometheusSettings::new(&url)).expect("source builds");
    // A year at a one-second step: one container alone needs about 2,900 CPU queries.
    let end = 1_800_000_000;
    let query = UsageQuery {
        namespaces: Vec::new(),
        start: end - 366 * DAY,
        end,
        step: 1,
    };
    let mut usage = tailor::usage::Usage::default();
    let err = source
        .read(&query, &mut usage)
        .await
        .expect_err("too many queries");
    let msg = err.to_string();
    assert!(
        msg.contains("more than the 2000 one read may issue"),
        "{msg}"
    );
    assert_eq!(requests.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[test]
fn windows_and_steps_out_of_bounds_are_refused() {
    let ok = UsageQuery {
        namespaces: Vec::new(),
        start: 0,
        end: 14 * DAY,
        step: 300,
    };
    assert!(ok.check().is_ok());
    for (start, end, step, message) in [
        (0, 0, 300, "is empty"),
        (0, 367 * DAY, 300, "longer than"),
        (0, DAY, 0, "step 0s is outside"),
        (0, DAY, 7200, "step 7200s is outside"),
    ] {
        let q = UsageQuery {
            start,
            end,
            step,
            ..ok.clone()
        };
        let err = q.check().expect_err("out of bounds");
        assert!(err.to_string().contains(message), "{err}");
    }
}

/// A value of Tailor's `/metrics` text, by series (name and labels as exposed).
fn series_value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_records_each_request_its_failures_by_kind_and_the_age_of_the_newest_sample() {
    use tailor::telemetry::Metrics;
    let meter = || opentelemetry::global::meter("test");
    let f = fixture();
    let server = start_prometheus(&f.openmetrics).await;
    let metrics = Metrics::new(&meter());
    let source = PrometheusSource::new(PrometheusSettings::new(&server.url))
        .expect("source builds")
        .with_metrics(metrics.clone());
    // The read ends an hour after the last sample: the newest usage is about that old.
    let query = UsageQuery {
        namespaces: Vec::new(),
        start: f.start + 600,
        end: f.end + 3600,
        step: 60,
    };
    source.usage(&query).await.expect("usage reads");
    let text = metrics.render();
    for q in ["series", "cpu", "memory", "oom_kills", "throttling"] {
        let count = format!("tailor_prometheus_query_duration_seconds_count{{query=\"{q}\"}}");
        assert_eq!(series_value(&text, &count), 1.0, "{q}");
        let errors =
            format!("tailor_prometheus_query_errors_total{{query=\"{q}\",kind=\"timeout\"}}");
        assert_eq!(series_value(&text, &errors), 0.0, "{q}");
    }
    // irate over 2 minutes still finds the last two counter samples up to 2 minutes after
    // the last one: the newest usage read is about an hour old.
    let age = series_value(&text, "tailor_usage_data_age_seconds");
    assert!((3000.0..=3600.0).contains(&age), "data age {age}");

    // Failures, each request (retries too) counted by why it failed.
    let cases: [(String, u32, &str); 3] = [
        (
            format!("http://127.0.0.1:{}", free_port()),
            1,
            "unreachable",
        ),
        (fake_prometheus(|_| Answer::Silent).await, 1, "timeout"),
        (
            fake_prometheus(|_| Answer::Full("text/html", "<html>Sign in</html>".to_string()))
                .await,
            3,
            "not_prometheus",
        ),
    ];
    for (url, retries, kind) in cases {
        let metrics = Metrics::new(&meter());
        let mut settings = PrometheusSettings::new(&url);
        settings.retries = retries;
        settings.timeout = Duration::from_secs(1);
        let source = PrometheusSource::new(settings)
            .expect("source builds")
            .with_metrics(metrics.clone());
        source.usage(&hour_query()).await.expect_err("fails");
        let text = metrics.render();
        // Final failures are not retried; transient ones are, `retries` times.
        let expected = if kind == "not_prometheus" {
            1
        } else {
            retries + 1
        };
        let errors =
            format!("tailor_prometheus_query_errors_total{{query=\"series\",kind=\"{kind}\"}}");
        assert_eq!(series_value(&text, &errors), f64::from(expected), "{url}");
        let count = "tailor_prometheus_query_duration_seconds_count{query=\"series\"}";
        assert_eq!(series_value(&text, count), f64::from(expected), "{url}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_with_more_series_or_samples_than_its_query_can_have_is_refused() {
    let start = hour_query().start;
    let answer = move |series: usize, samples: usize| {
        move |path: &str| {
            let labels =
                |i: usize| format!(r#"{{"namespace":"shop","pod":"web-{i}","container":"app"}}"#);
            let body = if path.ends_with("/series") {
                format!(r#"{{"status":"success","data":[{}]}}"#, labels(0))
            } else {
                let values: Vec<String> = (0..samples)
                    .map(|k| format!("[{},\"0.5\"]", start + 60 * k as i64))
                    .collect();
                let result: Vec<String> = (0..series)
                    .map(|i| {
                        format!(
                            r#"{{"metric":{},"values":[{}]}}"#,
                            labels(i),
                            values.join(",")
                        )
                    })
                    .collect();
                format!(
                    r#"{{"status":"success","data":{{"resultType":"matrix","result":[{}]}}}}"#,
                    result.join(",")
                )
            };
            Answer::Full("application/json", body)
        }
    };
    // One container: a query's answer may hold 17 series (16 more, for containers that
    // appeared since the lookup), and the hourly queries one sample a series.
    let read = |series, samples| async move {
        let url = fake_prometheus(answer(series, samples)).await;
        let source = PrometheusSource::new(PrometheusSettings::new(&url)).expect("source builds");
        source.usage(&hour_query()).await
    };
    let err = read(18, 1).await.expect_err("too many series").to_string();
    assert!(
        err.contains("more than 17 series, more than the query covers"),
        "{err}"
    );
    let err = read(1, 2).await.expect_err("too many samples").to_string();
    assert!(
        err.contains("series shop/web-0/app has more than 1 samples"),
        "{err}"
    );
    // The same shapes within the limits are read.
    let usage = read(17, 1).await.expect("within the limits");
    assert_eq!(usage.containers.len(), 17);
}
