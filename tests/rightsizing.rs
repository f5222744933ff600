//! End-to-end tests of right-sizing in the cluster: `tailor run` against a real control
//! plane (with the kubelet stand-in running the pods) and a real Prometheus backfilled with
//! usage of the test workloads' pods.
//!
//! Each test starts its own Prometheus and agents and takes a control plane (one of
//! `scripts/test`'s pool, reset for it, or its own).

#[path = "support/bin.rs"]
mod bin;
#[path = "support/control_plane.rs"]
mod control_plane;
#[path = "support/objects.rs"]
mod objects;
#[path = "support/prometheus.rs"]
mod prometheus_server;

use std::collections::BTreeMap;
use std::f64::consts::PI;
use std::fmt::Write as _;
use std::sync::LazyLock;
use std::time::Duration;

use control_plane::{Agent, ControlPlane, eventually, list};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::ResourceExt;
use kube::api::Api;
use prometheus_server::{TestPrometheus, start_prometheus};
use tailor::apis::{Recommendation, RightsizingPolicy};

/// One control plane at a time: each is a handful of processes on a two-core machine.
static SERIAL: LazyLock<tokio::sync::Mutex<()>> = LazyLock::new(|| tokio::sync::Mutex::new(()));

const DAY: i64 = 86_400;
const MIB: f64 = 1_048_576.0;

/// A node the kubelet stand-in runs, roomy enough for every test pod.
const NODE: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: fake-1
  annotations: {kwok.x-k8s.io/node: fake}
  labels: {kubernetes.io/hostname: fake-1, kubernetes.io/os: linux, kubernetes.io/arch: amd64}
status:
  capacity: {cpu: "32", memory: 128Gi, pods: "110"}
  allocatable: {cpu: "32", memory: 128Gi, pods: "110"}
"#;

fn deployment(ns: &str, name: &str, replicas: i32, cpu: &str, memory: &str) -> String {
    objects::deployment_in(ns, name, replicas, cpu, memory, "")
}

/// The workloads: `web` and `api` with three days of usage, `fresh` with six hours (too
/// little to act on).
fn workloads() -> String {
    [
        NODE.to_string(),
        deployment("default", "web", 2, "1", "1Gi"),
        deployment("default", "api", 1, "500m", "512Mi"),
        deployment("default", "fresh", 1, "250m", "256Mi"),
    ]
    .join("\n---\n")
}

/// Usage history ending now, one-minute samples: pods named as the Deployments' pods are
/// (`<deployment>-<hash>-<suffix>`), so they map to their Deployment.
fn history(containers: &[(&str, &str, f64, f64, i64)]) -> (String, i64) {
    let end = jiff::Timestamp::now().as_second() / 60 * 60 - 60;
    let mut om = String::from("# TYPE container_cpu_usage_seconds counter\n");
    for (ns, pod, cores, _, span) in containers {
        let mut total = 0.0;
        for t in (end - span..=end).step_by(60) {
            total += cores * (1.0 + 0.5 * (2.0 * PI * (t % DAY) as f64 / DAY as f64).sin()) * 60.0;
            let _ = writeln!(
                om,
                "container_cpu_usage_seconds_total{{namespace=\"{ns}\",pod=\"{pod}\",container=\"app\"}} {total} {t}"
            );
        }
    }
    om.push_str("# TYPE container_memory_working_set_bytes gauge\n");
    for (ns, pod, _, mib, span) in containers {
        for t in (end - span..=end).step_by(60) {
            let v = ((mib + 30.0 * (2.0 * PI * (t % DAY) as f64 / DAY as f64).cos()) * MIB).round();
            let _ = writeln!(
                om,
                "container_memory_working_set_bytes{{namespace=\"{ns}\",pod=\"{pod}\",container=\"app\"}} {v} {t}"
            );
        }
    }
    om.push_str("# EOF\n");
    (om, end)
}

fn usage() -> String {
    history(&[
        (
            "default",
            "web-5d8f7c9b4-abcde",
            WEB_USAGE[0].0,
            WEB_USAGE[0].1,
            3 * DAY,
        ),
        (
            "default",
            "web-5d8f7c9b4-fghij",
            WEB_USAGE[1].0,
            WEB_USAGE[1].1,
            3 * DAY,
        ),
        ("default", "api-7c6b5d4f8-klmno", 0.1, 200.0, 3 * DAY),
        ("default", "fresh-6f5e4d3c2-pqrst", 0.05, 100.0, 6 * 3600),
        ("other", "batch-8e7d6c5b4-uvwxy", 0.3, 400.0, 3 * DAY),
    ])
    .0
}

/// Requests and restarts of every pod, by name: what "no pod changes" compares.
async fn pod_state(cp: &ControlPlane, ns: &str) -> BTreeMap<String, String> {
    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), ns);
    list(&pods)
        .await
        .iter()
        .map(|p| {
            let spec = p.spec.as_ref().map(|s| {
                s.containers
                    .iter()
                    .map(|c| format!("{:?}", c.resources))
                    .collect::<Vec<_>>()
            });
            let restarts: i32 = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map_or(0, |cs| cs.iter().map(|c| c.restart_count).sum());
            (
                p.name_any(),
                format!("{spec:?} restarts={restarts} uid={:?}", p.uid()),
            )
        })
        .collect()
}

async fn wait_pods_running(cp: &ControlPlane, ns: &str, count: usize) {
    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), ns);
    eventually(
        Duration::from_secs(90),
        &format!("{count} pods Running in {ns}"),
        || async {
            let listed = list(&pods).await;
            let running = listed
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            (running == count).then_some(())
        },
    )
    .await;
}

fn condition<'a>(r: &'a Recommendation, type_: &str) -> Option<&'a str> {
    r.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.as_str())
}

fn condition_reason(r: &Recommendation, type_: &str) -> String {
    r.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .map(|c| format!("{}: {}", c.reason, c.message))
        .unwrap_or_default()
}

/// The first container's recommended requests, by resource.
fn recommended_requests(r: &Recommendation) -> BTreeMap<String, String> {
    r.status.as_ref().expect("status").containers[0]
        .recommended
        .requests
        .iter()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect()
}

/// Requests as a pod spec writes them.
fn requests(cpu: &str, memory: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("cpu".to_string(), cpu.to_string()),
        ("memory".to_string(), memory.to_string()),
    ])
}

async fn recommendation(cp: &ControlPlane, ns: &str, name: &str) -> Option<Recommendation> {
    Api::<Recommendation>::namespaced(cp.client.clone(), ns)
        .get_opt(name)
        .await
        .ok()
        .flatten()
}

/// Waits up to `secs` for the Recommendation `name` in `default` to be actionable.
async fn actionable(cp: &ControlPlane, name: &str, secs: u64) -> Recommendation {
    let what = format!("{name}'s actionable Recommendation");
    eventually(Duration::from_secs(secs), &what, || async {
        let r = recommendation(cp, "default", name).await?;
        (condition(&r, "Actionable") == Some("True")).then_some(r)
    })
    .await
}

/// The value of a metric line starting with `prefix` in `/metrics` text (0 when absent).
fn metric(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn agent_flags(prometheus: &TestPrometheus, interval: &str) -> Vec<String> {
    vec![
        "--prometheus-url".to_string(),
        prometheus.url.clone(),
        "--rightsizing-interval".to_string(),
        interval.to_string(),
    ]
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Starts a control plane with the workloads running and Prometheus over their history.
async fn cluster() -> (ControlPlane, TestPrometheus) {
    let prometheus = start_prometheus(&usage()).await;
    let cp = ControlPlane::start().await;
    cp.apply_yaml(&workloads()).await;
    wait_pods_running(&cp, "default", 4).await;
    (cp, prometheus)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_recommend_mode_every_workload_gets_the_recommendation_tailor_recommend_computes_and_no_pod_changes()
 {
    let _serial = SERIAL.lock().await;
    let (cp, prometheus) = cluster().await;
    let before = pod_state(&cp, "default").await;
    // One round only: the values are those of a whole-history read at its time.
    let flags = agent_flags(&prometheus, "1h");
    let agent = Agent::start(&cp, "agent-a", &as_strs(&flags));
    agent.wait_ready().await;

    let recs: Api<Recommendation> = Api::namespaced(cp.client.clone(), "default");
    let all = eventually(Duration::from_secs(60), "three Recommendations", || async {
        let l = list(&recs).await;
        (l.len() == 3 && l.iter().all(|r| condition(r, "Stale").is_some())).then_some(l)
    })
    .await;
    let by_name: BTreeMap<String, Recommendation> =
        all.into_iter().map(|r| (r.name_any(), r)).collect();
    let web = &by_name["deployment-web"];
    let fresh = &by_name["deployment-fresh"];
    assert_eq!(condition(web, "Ready"), Some("True"), "{web:?}");
    assert_eq!(
        condition(web, "Actionable"),
        Some("True"),
        "{}",
        condition_reason(web, "Actionable")
    );
    assert_eq!(condition(web, "Stale"), Some("False"));
    // Six hours of history: reported, not actionable.
    assert_eq!(condition(fresh, "Ready"), Some("True"));
    assert_eq!(
        condition(fresh, "Actionable"),
        Some("False"),
        "{}",
        condition_reason(fresh, "Actionable")
    );
    assert!(condition_reason(fresh, "Actionable").contains("InsufficientHistory"));
    // Owned by its workload, so it is garbage-collected with it.
    let owner = &web.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Deployment", "web")
    );
    let status = web.status.clone().expect("status");
    assert_eq!(status.mode.as_deref(), Some("Recommend"));
    let summary = status.summary.clone().expect("summary");
    assert_eq!(summary.workload, "Deployment/web");
    assert!(
        summary.cpu.contains("->") && summary.memory.contains("->"),
        "{summary:?}"
    );
    assert!(
        status.checkpoint.is_some(),
        "the histograms are checkpointed"
    );
    // The reads are timed and the data's age is known at /metrics.
    let exported = agent.metrics().await;
    assert!(
        metric(&exported, "tailor_prometheus_query_duration_seconds_count") >= 1.0,
        "no Prometheus request timed:\n{exported}"
    );
    assert!(
        exported
            .lines()
            .any(|l| l.starts_with("tailor_usage_data_age_seconds")),
        "no data age:\n{exported}"
    );

    // `tailor recommend` on the same cluster, data and time computes the same values.
    let until = status.usage_read_until.expect("read until");
    let now = jiff::Timestamp::from_second(until)
        .expect("valid")
        .to_string();
    let (url, kubeconfig) = (prometheus.url.clone(), cp.kubeconfig.clone());
    let (ok, stdout, stderr) = tokio::task::spawn_blocking(move || {
        bin::tailor(&[
            "recommend",
            "--prometheus-url",
            &url,
            "--kubeconfig",
            kubeconfig.to_str().expect("utf-8"),
            "-n",
            "default",
            "--now",
            &now,
            "-o",
            "json",
        ])
    })
    .await
    .expect("joined");
    assert!(ok, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    let entries = report["recommendations"].as_array().expect("a list");
    assert_eq!(entries.len(), 3, "{stdout}");
    for e in entries {
        let name = format!(
            "deployment-{}",
            e["workload"]["name"].as_str().expect("name")
        );
        let rec = &by_name[&name];
        let c = &rec.status.as_ref().expect("status").containers[0];
        for resource in ["cpu", "memory"] {
            assert_eq!(
                e["recommended"]["requests"][resource].as_str(),
                c.recommended.requests.get(resource).map(|q| q.0.as_str()),
                "{name} {resource}: tailor recommend vs the Recommendation"
            );
        }
        assert_eq!(
            e["actionable"].as_bool(),
            Some(condition(rec, "Actionable") == Some("True"))
        );
    }
    // Printer columns make `kubectl get recommendations` a report.
    let crd = tailor::apis::crds()
        .into_iter()
        .find(|c| c.spec.names.kind == "Recommendation")
        .expect("the CRD");
    let columns: Vec<String> = crd.spec.versions[0]
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.name.clone())
        .collect();
    for wanted in [
        "Workload",
        "Containers",
        "CPU",
        "Memory",
        "$/Month",
        "Confidence",
        "Mode",
    ] {
        assert!(columns.contains(&wanted.to_string()), "{columns:?}");
    }
    // The values against the usage the generator wrote, not against Tailor's own policy:
    // web's CPU request leaves at most 5% of its two pods' minutes short (the Balanced
    // profile's promise) and reserves no more than VPA's rule (p90 plus 15%) would, and its
    // memory request covers the peak working set by at most half again. Neither the
    // template's requests (1 core, 1Gi) nor a starved value pass.
    let usage = generated(&WEB_USAGE);
    let web_requests = &web.status.as_ref().expect("status").containers[0]
        .recommended
        .requests;
    let cpu = millicores(&web_requests["cpu"].0) as f64 / 1000.0;
    let memory = bytes(&web_requests["memory"].0) / MIB;
    assert!(
        usage.short(cpu) <= 0.05 && cpu <= 1.15 * usage.cpu_p90,
        "web's CPU request {cpu} cores leaves {:.1}% of the minutes short (usage median {}, p90 {}, peak {})",
        100.0 * usage.short(cpu),
        usage.cpu_median,
        usage.cpu_p90,
        usage.cpu_max
    );
    assert!(
        memory >= usage.memory_max && memory <= 1.5 * usage.memory_max,
        "web's memory request {memory} MiB against a peak working set of {} MiB",
        usage.memory_max
    );
    // Nothing about the pods changed once the round (the only one: an hour apart) is over.
    eventually(
        Duration::from_secs(30),
        "the right-sizing round done",
        || async { (agent.passes("rightsizing").await >= 1).then_some(()) },
    )
    .await;
    assert_eq!(pod_state(&cp, "default").await, before);
}

/// The generator's parameters of web's two pods: (mean cores, mean working set in MiB).
const WEB_USAGE: [(f64, f64); 2] = [(0.2, 300.0), (0.25, 320.0)];

/// What the generator wrote for a workload's pods over three days, computed from its
/// formulas (the oracle the recommendation is checked against).
struct Generated {
    cpu: Vec<f64>,
    cpu_median: f64,
    cpu_p90: f64,
    cpu_max: f64,
    memory_max: f64,
}

impl Generated {
    /// The share of the generated CPU samples above `cores`.
    fn short(&self, cores: f64) -> f64 {
        self.cpu.iter().filter(|c| **c > cores).count() as f64 / self.cpu.len() as f64
    }
}

fn generated(pods: &[(f64, f64)]) -> Generated {
    let end = jiff::Timestamp::now().as_second() / 60 * 60;
    let mut cpu = Vec::new();
    let mut memory_max = 0.0_f64;
    for &(cores, mib) in pods {
        for t in (end - 3 * DAY..=end).step_by(60) {
            let phase = 2.0 * PI * (t % DAY) as f64 / DAY as f64;
            cpu.push(cores * (1.0 + 0.5 * phase.sin()));
            memory_max = memory_max.max(mib + 30.0 * phase.cos());
        }
    }
    cpu.sort_by(f64::total_cmp);
    Generated {
        cpu_median: cpu[cpu.len() / 2],
        cpu_p90: cpu[cpu.len() * 9 / 10],
        cpu_max: cpu[cpu.len() - 1],
        memory_max,
        cpu,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_prometheus_stops_recommendations_turn_stale_with_an_event_and_recover_when_it_returns()
 {
    let _serial = SERIAL.lock().await;
    let (cp, mut prometheus) = cluster().await;
    let before = pod_state(&cp, "default").await;
    let flags = agent_flags(&prometheus, "2s");
    let agent = Agent::start(&cp, "agent-a", &as_strs(&flags));
    agent.wait_ready().await;
    let fresh = eventually(
        Duration::from_secs(60),
        "a fresh Recommendation",
        || async {
            let r = recommendation(&cp, "default", "deployment-web").await?;
            (condition(&r, "Stale") == Some("False")).then_some(r)
        },
    )
    .await;
    let values = fresh.status.as_ref().expect("status").containers.clone();

    prometheus.stop();
    let stale = eventually(
        Duration::from_secs(60),
        "a stale Recommendation",
        || async {
            let r = recommendation(&cp, "default", "deployment-web").await?;
            (condition(&r, "Stale") == Some("True")).then_some(r)
        },
    )
    .await;
    assert!(
        condition_reason(&stale, "Stale").starts_with("UsageUnavailable"),
        "{}",
        condition_reason(&stale, "Stale")
    );
    assert_eq!(condition(&stale, "Actionable"), Some("False"));
    // The last good values are kept.
    assert_eq!(stale.status.as_ref().expect("status").containers, values);
    let events: Api<Event> = Api::namespaced(cp.client.clone(), "default");
    eventually(Duration::from_secs(30), "a UsageStale event", || async {
        list(&events)
            .await
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("UsageStale")
                    && e.involved_object.name.as_deref() == Some("deployment-web")
            })
            .then_some(())
    })
    .await;
    let metrics = agent.metrics().await;
    assert!(
        metric(&metrics, "tailor_usage_read_failures_total") >= 1.0,
        "{metrics}"
    );
    assert!(
        metric(&metrics, "tailor_recommendations{state=\"stale\"") >= 1.0,
        "{metrics}"
    );

    let stale_until = stale.status.as_ref().and_then(|s| s.usage_read_until);
    prometheus.restart().await;
    let recovered = eventually(
        Duration::from_secs(60),
        "a fresh Recommendation again",
        || async {
            let r = recommendation(&cp, "default", "deployment-web").await?;
            (condition(&r, "Stale") == Some("False")).then_some(r)
        },
    )
    .await;
    assert!(recovered.status.as_ref().and_then(|s| s.usage_read_until) > stale_until);
    assert_eq!(pod_state(&cp, "default").await, before, "no pod changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_continues_from_the_checkpoints_instead_of_reading_the_whole_history() {
    let _serial = SERIAL.lock().await;
    let (cp, prometheus) = cluster().await;
    let flags = agent_flags(&prometheus, "2s");
    let mut a = Agent::start(&cp, "agent-a", &as_strs(&flags));
    a.wait_ready().await;
    // The first leader reads the whole history once.
    let first = eventually(
        Duration::from_secs(60),
        "the first leader's round",
        || async {
            recommendation(&cp, "default", "deployment-web").await?;
            let m = a.metrics().await;
            let samples = metric(&m, "tailor_usage_samples_read_total");
            (samples > 0.0).then_some(samples)
        },
    )
    .await;
    let b = Agent::start(&cp, "agent-b", &as_strs(&flags));
    b.wait_ready().await;
    let until_before = recommendation(&cp, "default", "deployment-web")
        .await
        .and_then(|r| r.status?.usage_read_until)
        .expect("read until");
    a.kill();
    // The follower takes over and keeps the Recommendations current.
    eventually(
        Duration::from_secs(60),
        "the new leader's rounds",
        || async {
            let m = b.metrics().await;
            (metric(&m, "tailor_usage_queries_total") >= 2.0).then_some(())
        },
    )
    .await;
    let after = eventually(Duration::from_secs(30), "a newer read", || async {
        let r = recommendation(&cp, "default", "deployment-web").await?;
        (r.status.as_ref()?.usage_read_until? > until_before).then_some(r)
    })
    .await;
    let read_by_b = metric(&b.metrics().await, "tailor_usage_samples_read_total");
    assert!(
        read_by_b * 20.0 < first,
        "the new leader read {read_by_b} samples, the first {first}: it did not resume"
    );
    // The continued histogram holds the whole history.
    let checkpoint: serde_json::Value = serde_json::from_str(
        after
            .status
            .as_ref()
            .and_then(|s| s.checkpoint.as_deref())
            .expect("checkpoint"),
    )
    .expect("JSON");
    let samples = checkpoint["containers"][0]["history"]["samples"]
        .as_f64()
        .expect("samples");
    assert!(samples >= 3.0 * 288.0, "{samples} samples: a cold start");
    assert_eq!(condition(&after, "Stale"), Some("False"));
}

const TOO_TIGHT: &str = r#"
apiVersion: tailor.sh/v1alpha1
kind: RightsizingPolicy
metadata: {name: too-tight, namespace: default}
spec:
  selector: {matchLabels: {app: web}}
  mode: Auto
  memory: {min: 2Gi, max: 1Gi}
"#;

const BAD_SELECTOR: &str = r#"
apiVersion: tailor.sh/v1alpha1
kind: RightsizingPolicy
metadata: {name: bad-selector, namespace: other}
spec:
  selector:
    matchExpressions: [{key: app, operator: Sometimes, values: [batch]}]
  mode: Auto
"#;

const UNKNOWN_MODE: &str = r#"
apiVersion: tailor.sh/v1alpha1
kind: RightsizingPolicy
metadata: {name: unknown-mode, namespace: default}
spec:
  mode: Whenever
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_policies_are_refused_or_reported_and_nothing_is_recommended_under_them() {
    let _serial = SERIAL.lock().await;
    let prometheus = start_prometheus(&usage()).await;
    let cp = ControlPlane::start().await;
    // An unknown mode is refused by the schema, naming the field and the value.
    let refused = cp.try_create(UNKNOWN_MODE).await.expect_err("refused");
    assert!(
        refused.contains("spec.mode") && refused.contains("Whenever"),
        "{refused}"
    );
    cp.apply_yaml(&workloads()).await;
    cp.apply_yaml("apiVersion: v1\nkind: Namespace\nmetadata: {name: other}\n")
        .await;
    cp.apply_yaml(&deployment("other", "batch", 1, "1", "1Gi"))
        .await;
    cp.apply_yaml(TOO_TIGHT).await;
    cp.apply_yaml(BAD_SELECTOR).await;
    wait_pods_running(&cp, "default", 4).await;
    wait_pods_running(&cp, "other", 1).await;
    let before = (
        pod_state(&cp, "default").await,
        pod_state(&cp, "other").await,
    );
    let flags = agent_flags(&prometheus, "2s");
    let agent = Agent::start(&cp, "agent-a", &as_strs(&flags));
    agent.wait_ready().await;

    let policies: Api<RightsizingPolicy> = Api::all(cp.client.clone());
    let reported = eventually(
        Duration::from_secs(60),
        "both policies reported",
        || async {
            let l = list(&policies).await;
            let invalid: Vec<String> = l
                .iter()
                .filter_map(|p| {
                    let c = p.status.as_ref()?.conditions.first()?;
                    (c.status == "False" && c.reason == "Invalid")
                        .then(|| format!("{}: {}", p.name_any(), c.message))
                })
                .collect();
            (invalid.len() == 2).then_some(invalid)
        },
    )
    .await;
    let text = reported.join("\n");
    assert!(
        text.contains("too-tight: ") && text.contains("spec.memory.min"),
        "{text}"
    );
    assert!(
        text.contains("bad-selector: ")
            && text.contains("spec.selector")
            && text.contains("Sometimes"),
        "{text}"
    );
    // Workloads the policies govern get nothing; the others are right-sized as usual.
    eventually(Duration::from_secs(60), "api's Recommendation", || async {
        recommendation(&cp, "default", "deployment-api").await
    })
    .await;
    // A full round after the one that wrote api's: web's and batch's would exist by then.
    agent.wait_passes("rightsizing", 1, 60).await;
    assert!(
        recommendation(&cp, "default", "deployment-web")
            .await
            .is_none()
    );
    assert!(
        recommendation(&cp, "other", "deployment-batch")
            .await
            .is_none()
    );
    assert_eq!(
        (
            pod_state(&cp, "default").await,
            pod_state(&cp, "other").await
        ),
        before,
        "nothing applied"
    );
}

const AUTO_IN_PLACE: &str = r#"
apiVersion: tailor.sh/v1alpha1
kind: RightsizingPolicy
metadata: {name: default, namespace: default}
spec:
  mode: Auto
  update: {mode: InPlace, maxStepFraction: 1.0}
"#;

const HPA_ON_CPU: &str = r#"
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: api, namespace: default}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: api}
  minReplicas: 1
  maxReplicas: 3
  metrics:
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 80}}
"#;

/// Requests of a pod's first container in spec and in status, and its restarts.
type PodResources = (BTreeMap<String, String>, BTreeMap<String, String>, i32);

/// Requests of a pod's first container in spec and in status, and its restarts.
fn pod_resources(p: &Pod) -> PodResources {
    let q =
        |m: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
            m.map(|m| m.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
                .unwrap_or_default()
        };
    let spec = p
        .spec
        .as_ref()
        .and_then(|s| s.containers[0].resources.as_ref());
    let status = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.first());
    (
        q(spec.and_then(|r| r.requests.as_ref())),
        q(status
            .and_then(|c| c.resources.as_ref())
            .and_then(|r| r.requests.as_ref())),
        status.map_or(0, |c| c.restart_count),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_auto_mode_running_pods_are_resized_in_place_without_restarts_and_hpa_cpu_is_left_alone()
{
    let _serial = SERIAL.lock().await;
    let (cp, prometheus) = cluster().await;
    cp.apply_yaml(HPA_ON_CPU).await;
    cp.apply_yaml(AUTO_IN_PLACE).await;
    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "default");
    let before: BTreeMap<String, (Option<String>, PodResources)> = list(&pods)
        .await
        .iter()
        .map(|p| (p.name_any(), (p.uid(), pod_resources(p))))
        .collect();
    let flags = agent_flags(&prometheus, "3s");
    let agent = Agent::start(&cp, "agent-a", &as_strs(&flags));
    agent.wait_ready().await;
    let web = actionable(&cp, "deployment-web", 60).await;
    let web_target = recommended_requests(&web);
    let (_, (_, web_before)) = before
        .iter()
        .find(|(name, _)| name.starts_with("web-"))
        .expect("a web pod");
    assert_ne!(web_target, web_before.0, "a change to make");
    // Every web pod is resized, spec and status, with no restart and no new pod.
    eventually(
        Duration::from_secs(60),
        "web pods resized in place",
        || async {
            let now = list(&pods).await;
            let webs: Vec<&Pod> = now
                .iter()
                .filter(|p| p.name_any().starts_with("web-"))
                .collect();
            (webs.len() == 2
                && webs.iter().all(|p| {
                    let (spec, status, restarts) = pod_resources(p);
                    spec == web_target && status == web_target && restarts == 0
                }))
            .then_some(())
        },
    )
    .await;
    let after = list(&pods).await;
    for p in &after {
        let (uid, _) = &before[&p.name_any()];
        assert_eq!(&p.uid(), uid, "{} was not replaced", p.name_any());
    }
    // The HPA scales api on CPU: its CPU request stays, its memory is right-sized.
    let api = eventually(Duration::from_secs(30), "api's Recommendation", || async {
        recommendation(&cp, "default", "deployment-api").await
    })
    .await;
    let api_target = recommended_requests(&api);
    assert_eq!(
        api_target.get("cpu").map(String::as_str),
        Some("500m"),
        "{api_target:?}"
    );
    assert_ne!(api_target.get("memory").map(String::as_str), Some("512Mi"));
    eventually(Duration::from_secs(60), "api's memory resized", || async {
        let now = list(&pods).await;
        let p = now.iter().find(|p| p.name_any().starts_with("api-"))?;
        let (spec, status, _) = pod_resources(p);
        (spec == api_target && status == api_target).then_some(())
    })
    .await;
    // Too little history: the fresh workload's pod is not touched.
    let fresh_now = after
        .iter()
        .find(|p| p.name_any().starts_with("fresh-"))
        .expect("fresh pod");
    assert_eq!(pod_resources(fresh_now), before[&fresh_now.name_any()].1);
    let metrics = agent.metrics().await;
    assert!(
        metric(&metrics, "tailor_recommendations_applied_total") >= 3.0,
        "{metrics}"
    );
}

fn bytes(q: &str) -> f64 {
    tailor::model::quantity::parse_value(q).expect("a quantity") as f64
}

/// An OOM kill is answered when the pod shows it, not at the next round: with rounds an
/// hour apart, the killed container's memory is raised above the request it was killed at
/// within seconds, from the pod's status alone (the usage history does not hold the kill),
/// and the pods get it in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oom_killed_container_gets_more_memory_within_seconds_not_at_the_next_round() {
    let _serial = SERIAL.lock().await;
    let (cp, prometheus) = cluster().await;
    cp.apply_yaml(AUTO_IN_PLACE).await;
    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "default");
    let flags = agent_flags(&prometheus, "1h");
    let agent = Agent::start(&cp, "agent-a", &as_strs(&flags));
    agent.wait_ready().await;
    // The first round sizes web and resizes its pods.
    let web = actionable(&cp, "deployment-web", 60).await;
    let sized = recommended_requests(&web);
    let sized_memory = bytes(&sized["memory"]);
    assert!(sized_memory < bytes("1Gi"), "{sized:?}");
    let web_pods = || async {
        list(&pods)
            .await
            .into_iter()
            .filter(|p| p.name_any().starts_with("web-"))
            .collect::<Vec<Pod>>()
    };
    eventually(Duration::from_secs(60), "web pods resized", || async {
        let webs = web_pods().await;
        (webs.len() == 2 && webs.iter().all(|p| pod_resources(p).0 == sized)).then_some(())
    })
    .await;
    // One web container is OOM-killed at that size and restarted, as the kubelet reports.
    let mut victim = web_pods().await.remove(0);
    let killed_at = jiff::Timestamp::now().to_string();
    let status = victim.status.as_mut().expect("status");
    let container = &mut status.container_statuses.as_mut().expect("statuses")[0];
    container.restart_count = 1;
    container.last_state = Some(
        serde_json::from_value(serde_json::json!({
            "terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": killed_at}
        }))
        .expect("a container state"),
    );
    let patch = serde_json::json!({"status": {"containerStatuses": status.container_statuses}});
    pods.patch_status(
        &victim.name_any(),
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .expect("the pod's status patched");
    // Within seconds, not an hour: the Recommendation's memory is bumped (20%, at least
    // 100 MiB) above the request the container was killed at, and says why.
    let bumped = eventually(Duration::from_secs(60), "web's memory bumped", || async {
        let r = recommendation(&cp, "default", "deployment-web").await?;
        (bytes(&recommended_requests(&r)["memory"]) > sized_memory).then_some(r)
    })
    .await;
    let target = recommended_requests(&bumped);
    assert!(
        bytes(&target["memory"]) >= (sized_memory * 1.2).max(sized_memory + 100.0 * MIB),
        "{target:?} after {sized:?}"
    );
    let reasons = &bumped.status.as_ref().expect("status").containers[0].reasons;
    assert!(
        reasons.iter().any(|r| r.contains("after an OOM kill")),
        "{reasons:?}"
    );
    assert_eq!(target["cpu"], sized["cpu"], "only memory moves");
    // Both pods get the new memory in place: the killed one must not die at its old size.
    eventually(
        Duration::from_secs(60),
        "web pods given the memory",
        || async {
            let webs = web_pods().await;
            (webs.len() == 2
                && webs.iter().all(|p| {
                    let (spec, status, _) = pod_resources(p);
                    spec == target && status == target
                }))
            .then_some(())
        },
    )
    .await;
}

/// `web` is in Auto mode with requests set only at creation; `api` has no policy and the
/// agent's global mode is recommend.
const AUTO_ON_CREATE: &str = r#"
apiVersion: tailor.sh/v1alpha1
kind: RightsizingPolicy
metadata: {name: web-on-create, namespace: default}
spec:
  selector: {matchLabels: {app: web}}
  mode: Auto
  update: {mode: OnCreate, maxStepFraction: 1.0}
"#;

/// Waits until a dry-run creation of a copy of a pod whose name starts with `prefix` comes
/// back from admission with `requests`: the agent's webhook then serves the recommendation.
/// Nothing is stored, so the workload's pods are as they were.
async fn webhook_serves(
    cp: &ControlPlane,
    prefix: &str,
    requests: &BTreeMap<String, String>,
    within: Duration,
) {
    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "default");
    let template = list(&pods)
        .await
        .into_iter()
        .find(|p| p.name_any().starts_with(prefix))
        .expect("a pod to copy");
    let mut copy = Pod {
        metadata: kube::api::ObjectMeta {
            generate_name: Some(prefix.to_string()),
            labels: template.metadata.labels.clone(),
            owner_references: template.metadata.owner_references.clone(),
            ..Default::default()
        },
        spec: template.spec.clone(),
        status: None,
    };
    if let Some(spec) = copy.spec.as_mut() {
        spec.node_name = None;
    }
    let dry_run = kube::api::PostParams {
        dry_run: true,
        ..Default::default()
    };
    eventually(within, "the webhook serving the recommendation", || async {
        let admitted = pods.create(&dry_run, &copy).await.ok()?;
        (&pod_resources(&admitted).0 == requests).then_some(())
    })
    .await;
}

/// Deletes one pod whose name starts with `prefix` and waits for its replacement (a pod of
/// that prefix whose uid is new); returns the replacement.
async fn replace_one_pod(cp: &ControlPlane, prefix: &str, within: Duration) -> Pod {
    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "default");
    let before = list(&pods).await;
    let known: Vec<Option<String>> = before.iter().map(|p| p.uid()).collect();
    let victim = before
        .iter()
        .find(|p| p.name_any().starts_with(prefix))
        .expect("a pod to replace");
    pods.delete(&victim.name_any(), &kube::api::DeleteParams::default())
        .await
        .expect("pod deleted");
    eventually(within, &format!("a new {prefix} pod"), || async {
        list(&pods)
            .await
            .into_iter()
            .find(|p| p.name_any().starts_with(prefix) && !known.contains(&p.uid()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_auto_mode_new_pods_get_the_recommended_requests_from_the_webhook_and_are_still_created_when_the_agent_is_down()
 {
    let _serial = SERIAL.lock().await;
    let (cp, prometheus) = cluster().await;
    cp.apply_yaml(AUTO_ON_CREATE).await;
    cp.apply_yaml("apiVersion: v1\nkind: Namespace\nmetadata: {name: tailor}\n")
        .await;
    let port = control_plane::free_port();
    let mut flags = agent_flags(&prometheus, "1h");
    flags.extend([
        "--webhook-address".to_string(),
        format!("127.0.0.1:{port}"),
        // The API server runs on the host, so it calls the agent by address.
        "--webhook-url".to_string(),
        format!("https://127.0.0.1:{port}/mutate-pods"),
    ]);
    let mut agent = Agent::start_as(
        &cp,
        &cp.kubeconfig,
        "tailor",
        "agent-a",
        &["--cloud", "kwok"],
        &as_strs(&flags),
        &[],
    );
    agent.wait_ready().await;

    // The agent made its certificate, shared it through a Secret, and put its CA in the
    // configuration it applied.
    let configurations: Api<
        k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration,
    > = Api::all(cp.client.clone());
    let configuration = eventually(
        Duration::from_secs(30),
        "the webhook configuration",
        || async {
            configurations
                .get_opt("tailor-rightsizing")
                .await
                .ok()
                .flatten()
        },
    )
    .await;
    let hook = &configuration.webhooks.as_ref().expect("webhooks")[0];
    assert_eq!(hook.failure_policy.as_deref(), Some("Ignore"));
    assert_eq!(hook.timeout_seconds, Some(2));
    let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(cp.client.clone(), "tailor")
        .get("tailor-webhook-cert")
        .await
        .expect("the certificate Secret");
    assert_eq!(
        hook.client_config.ca_bundle.as_ref().map(|b| &b.0),
        secret
            .data
            .as_ref()
            .and_then(|d| d.get("ca.crt"))
            .map(|b| &b.0),
        "the caBundle is the Secret's CA"
    );

    let web = actionable(&cp, "deployment-web", 60).await;
    let api = actionable(&cp, "deployment-api", 30).await;
    let web_target = recommended_requests(&web);
    assert_ne!(web_target, requests("1", "1Gi"), "a change to make");
    assert_ne!(
        recommended_requests(&api),
        requests("500m", "512Mi"),
        "a change not to make"
    );
    // The agent's stores lag the API server (a watch can expire and back off while the
    // cluster is busy): wait until its webhook serves the web recommendation, asked through
    // dry-run creations that the API server sends to the webhook but never stores.
    webhook_serves(&cp, "web-", &web_target, Duration::from_secs(30)).await;
    let patched_before = metric(
        &agent.metrics().await,
        "tailor_webhook_requests_total{outcome=\"patched\"",
    );

    // A new web pod is created with the recommendation; the running one is left as it is
    // (OnCreate does not resize).
    let created = replace_one_pod(&cp, "web-", Duration::from_secs(30)).await;
    assert_eq!(pod_resources(&created).0, web_target, "{created:?}");
    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "default");
    let other_web = list(&pods)
        .await
        .into_iter()
        .find(|p| p.name_any().starts_with("web-") && p.uid() != created.uid())
        .expect("the other web pod");
    assert_eq!(pod_resources(&other_web).0, requests("1", "1Gi"));
    // api is in Recommend mode: its new pod keeps the template's requests.
    let created_api = replace_one_pod(&cp, "api-", Duration::from_secs(30)).await;
    assert_eq!(pod_resources(&created_api).0, requests("500m", "512Mi"));
    let metrics = agent.metrics().await;
    assert!(
        metric(
            &metrics,
            "tailor_webhook_requests_total{outcome=\"patched\""
        ) >= patched_before + 1.0,
        "{metrics}"
    );
    assert!(
        metric(
            &metrics,
            "tailor_webhook_requests_total{outcome=\"unchanged\""
        ) >= 1.0,
        "{metrics}"
    );
    assert!(
        metric(&metrics, "tailor_webhook_duration_seconds_count") >= 2.0,
        "{metrics}"
    );

    // With the agent gone the configuration stays, and pods are still created (fail open),
    // with the template's requests.
    agent.kill();
    let started = std::time::Instant::now();
    let unpatched = replace_one_pod(&cp, "web-", Duration::from_secs(30)).await;
    assert_eq!(pod_resources(&unpatched).0, requests("1", "1Gi"));
    assert!(
        configurations
            .get_opt("tailor-rightsizing")
            .await
            .ok()
            .flatten()
            .is_some(),
        "the webhook was still configured"
    );
    eprintln!(
        "a pod was created {:.1}s after its predecessor's deletion with the webhook down",
        started.elapsed().as_secs_f64()
    );
}

/// A NodePool Tailor buys KWOK nodes from, autonomous whatever the agent's global mode.
const AUTONOMOUS_POOL: &str = r#"
apiVersion: tailor.sh/v1alpha1
kind: AKSNodeClass
metadata: {name: default}
spec: {imageFamily: AzureLinux, maxPods: 110}
---
apiVersion: tailor.sh/v1alpha1
kind: NodePool
metadata:
  name: default
  annotations: {tailor.sh/mode: autonomous}
spec:
  template:
    spec:
      requirements:
      - {key: tailor.sh/sku-family, operator: In, values: [D, E, F]}
      - {key: tailor.sh/capacity-type, operator: In, values: [on-demand]}
      - {key: kubernetes.io/arch, operator: In, values: [amd64]}
      nodeClassRef: {group: tailor.sh, kind: AKSNodeClass, name: default}
  limits: {cpu: "1000"}
  disruption: {consolidateAfter: 10m}
"#;

/// `web` is right-sized in Auto mode (requests set at creation only, whole steps); `api`
/// falls under the agent's global recommend mode.
const WEB_AUTO_ON_CREATE: &str = r#"
apiVersion: tailor.sh/v1alpha1
kind: RightsizingPolicy
metadata: {name: web-auto, namespace: default}
spec:
  selector: {matchLabels: {app: web}}
  mode: Auto
  update: {mode: OnCreate, maxStepFraction: 1.0}
"#;

/// Millicores of a CPU quantity.
fn millicores(q: &str) -> i64 {
    tailor::model::quantity::parse_milli(q).expect("a CPU quantity")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_pods_are_bought_nodes_for_their_recommended_requests_and_recommend_mode_prices_the_difference()
 {
    let _serial = SERIAL.lock().await;
    let prometheus = start_prometheus(&usage()).await;
    let cp = ControlPlane::start().await;
    // No node yet: every pod of the scale-up below is pending until Tailor buys one.
    cp.apply_yaml(
        &[
            AUTONOMOUS_POOL.to_string(),
            WEB_AUTO_ON_CREATE.to_string(),
            deployment("default", "web", 0, "1", "1Gi"),
            deployment("default", "api", 0, "2", "4Gi"),
        ]
        .join("\n---\n"),
    )
    .await;
    let flags = agent_flags(&prometheus, "1h");
    let agent = Agent::start(&cp, "agent-a", &as_strs(&flags));
    agent.wait_ready().await;
    let target = |name: &'static str| {
        let cp = &cp;
        async move { recommended_requests(&actionable(cp, name, 60).await) }
    };
    let web_target = target("deployment-web").await;
    let api_target = target("deployment-api").await;
    assert!(millicores(&web_target["cpu"]) < 1000, "{web_target:?}");
    assert!(millicores(&api_target["cpu"]) < 2000, "{api_target:?}");

    // Scale both up at once: one batch of twelve pending pods.
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(cp.client.clone(), "default");
    for name in ["web", "api"] {
        deployments
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({"spec": {"replicas": 6}})),
            )
            .await
            .expect("scaled");
    }
    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "default");
    let running = eventually(
        Duration::from_secs(120),
        "twelve pods Running on nodes Tailor bought",
        || async {
            let l = list(&pods).await;
            let running = l
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .count();
            (running == 12).then_some(l)
        },
    )
    .await;
    // Auto mode: each web pod was resized while pending, before its node existed; it never
    // restarted and runs with the recommendation. Recommend mode: api keeps its template.
    for p in &running {
        let (spec, status, restarts) = pod_resources(p);
        if p.name_any().starts_with("web-") {
            assert_eq!(spec, web_target, "{}", p.name_any());
            assert_eq!(status, web_target, "{}", p.name_any());
            assert_eq!(restarts, 0);
        } else {
            assert_eq!(spec, requests("2", "4Gi"), "{}", p.name_any());
        }
    }
    // The nodes were bought for those requests: the claims' planned CPU is the web pods'
    // recommendation plus api's template, not web's template (6 cores more).
    let claims: Api<tailor::apis::NodeClaim> = Api::all(cp.client.clone());
    let planned: i64 = list(&claims)
        .await
        .iter()
        .map(|c| millicores(&c.spec.resources.requests["cpu"].0))
        .sum();
    let right_sized = 6 * millicores(&web_target["cpu"]) + 6 * 2000;
    assert!(
        planned <= right_sized + 10 && planned >= right_sized - 10,
        "claims plan {planned}m of CPU; the pods right-sized request {right_sized}m"
    );
    // Recommend mode: the batch's price with api's recommendation applied is reported on
    // the NodePool and at /metrics, and nothing was done about it.
    let events: Api<Event> = Api::namespaced(cp.client.clone(), "default");
    let report = eventually(
        Duration::from_secs(30),
        "a RightsizingWouldChangeBatch event on the NodePool",
        || async {
            list(&events)
                .await
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("RightsizingWouldChangeBatch"))
        },
    )
    .await;
    assert_eq!(report.involved_object.kind.as_deref(), Some("NodePool"));
    let message = report.message.unwrap_or_default();
    assert!(
        message.contains("6 pending pod(s) of 1 Recommend-mode workload(s)"),
        "{message}"
    );
    let exported = agent.metrics().await;
    let planned_cost = metric(
        &exported,
        "tailor_provisioning_batch_hourly_cost_dollars{requests=\"planned\"}",
    );
    let right_sized_cost = metric(
        &exported,
        "tailor_provisioning_batch_hourly_cost_dollars{requests=\"right_sized\"}",
    );
    assert!(
        planned_cost > right_sized_cost && right_sized_cost > 0.0,
        "planned ${planned_cost}/h, right-sized ${right_sized_cost}/h\n{exported}"
    );
    eprintln!(
        "batch: ${planned_cost:.4}/h as planned, ${right_sized_cost:.4}/h right-sized; {message}"
    );
}

/// An AdmissionReview of a new `web` pod, as the API server sends it.
fn web_pod_review(uid: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "default", "operation": "CREATE", "name": "",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"generateName": "web-5d8f7c9b4-", "namespace": "default",
                    "labels": {"app": "web", "pod-template-hash": "5d8f7c9b4"},
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                        "name": "web-5d8f7c9b4", "uid": "r-1", "controller": true}]},
                "spec": {"containers": [{"name": "app", "image": "registry.example/web:1",
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}
            },
            "dryRun": false
        }
    })
}

/// Sends a review to a replica over TLS, trusting only `ca_pem`; the response's `allowed`,
/// whether it carries a patch, and the whole answer.
async fn review_over_tls(port: u16, ca_pem: &[u8], uid: &str) -> (bool, bool, String) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem).expect("a CA"))
        .build()
        .expect("client");
    let answer: serde_json::Value = client
        .post(format!("https://127.0.0.1:{port}/mutate-pods"))
        .json(&web_pod_review(uid))
        .send()
        .await
        .expect("the replica answers over TLS, trusted through the CA")
        .json()
        .await
        .expect("an AdmissionReview");
    let response = &answer["response"];
    assert_eq!(response["uid"].as_str(), Some(uid), "{answer}");
    (
        response["allowed"].as_bool() == Some(true),
        // kube's AdmissionResponse writes the patch's bytes as a JSON array, which the API
        // server reads as it reads a base64 string.
        response["patch"].is_string()
            || response["patch"].as_array().is_some_and(|a| !a.is_empty()),
        answer.to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_serve_the_webhook_with_one_generated_certificate_and_a_mounted_one_is_served_and_published()
 {
    let _serial = SERIAL.lock().await;
    let (cp, prometheus) = cluster().await;
    cp.apply_yaml(AUTO_ON_CREATE).await;
    cp.apply_yaml("apiVersion: v1\nkind: Namespace\nmetadata: {name: tailor}\n")
        .await;
    let ports = [control_plane::free_port(), control_plane::free_port()];
    let start = |name: &str, port: u16, extra: &[String]| {
        let mut flags = agent_flags(&prometheus, "1h");
        flags.extend([
            "--webhook-address".to_string(),
            format!("127.0.0.1:{port}"),
            "--webhook-url".to_string(),
            format!("https://127.0.0.1:{}/mutate-pods", ports[0]),
        ]);
        flags.extend(extra.iter().cloned());
        Agent::start_as(
            &cp,
            &cp.kubeconfig,
            "tailor",
            name,
            &["--cloud", "kwok"],
            &as_strs(&flags),
            &[],
        )
    };
    let a = start("agent-a", ports[0], &[]);
    a.wait_ready().await;
    let b = start("agent-b", ports[1], &[]);
    b.wait_ready().await;
    let configurations: Api<
        k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration,
    > = Api::all(cp.client.clone());
    let ca_bundle = || async {
        configurations
            .get_opt("tailor-rightsizing")
            .await
            .ok()
            .flatten()?
            .webhooks?
            .first()?
            .client_config
            .ca_bundle
            .clone()
            .map(|b| b.0)
    };
    let generated = eventually(Duration::from_secs(30), "the caBundle", ca_bundle).await;
    actionable(&cp, "deployment-web", 60).await;
    // Whichever replica the Service picks, its certificate verifies against the one CA
    // the configuration publishes, and it patches the pod the same way.
    // (Each replica's stores see the Recommendation a moment after the API server has it.)
    for (i, port) in ports.iter().enumerate() {
        let generated = &generated;
        eventually(
            Duration::from_secs(30),
            &format!("the replica on port {port} to patch"),
            || async move {
                let (allowed, patched, answer) =
                    review_over_tls(*port, generated, &format!("review-{i}")).await;
                assert!(allowed, "replica on port {port}: {answer}");
                patched.then_some(())
            },
        )
        .await;
    }
    // A CA that did not sign them is refused: the check above is a real verification.
    let stranger =
        tailor::webhook::certificate::generate(&["127.0.0.1".to_string()]).expect("a certificate");
    let stranger_client = reqwest::Client::builder()
        .add_root_certificate(
            reqwest::Certificate::from_pem(stranger.ca_pem.as_deref().expect("ca").as_bytes())
                .expect("a CA"),
        )
        .build()
        .expect("client");
    assert!(
        stranger_client
            .post(format!("https://127.0.0.1:{}/mutate-pods", ports[0]))
            .json(&web_pod_review("stranger"))
            .send()
            .await
            .is_err(),
        "a replica's certificate verified against an unrelated CA"
    );
    drop((a, b));

    // A mounted certificate (as a kubernetes.io/tls Secret or cert-manager writes it) is
    // what the agent serves, and its CA becomes the caBundle.
    let dir = cp.dir().join("webhook-cert");
    std::fs::create_dir_all(&dir).expect("cert dir");
    let mounted =
        tailor::webhook::certificate::generate(&["127.0.0.1".to_string()]).expect("a certificate");
    let ca = mounted.ca_pem.clone().expect("ca");
    std::fs::write(dir.join("tls.crt"), &mounted.cert_pem).expect("tls.crt");
    std::fs::write(dir.join("tls.key"), &mounted.key_pem).expect("tls.key");
    std::fs::write(dir.join("ca.crt"), &ca).expect("ca.crt");
    let c = start(
        "agent-c",
        ports[0],
        &[
            "--webhook-cert-dir".to_string(),
            dir.to_str().expect("utf-8").to_string(),
        ],
    );
    c.wait_ready().await;
    eventually(
        Duration::from_secs(60),
        "the mounted CA as the caBundle",
        || async { (ca_bundle().await? == ca.as_bytes()).then_some(()) },
    )
    .await;
    assert!(
        review_over_tls(ports[0], ca.as_bytes(), "mounted").await.0,
        "the mounted certificate serves"
    );
    // And the API server, trusting that bundle, has the pods it creates patched.
    let created = replace_one_pod(&cp, "web-", Duration::from_secs(30)).await;
    assert_ne!(
        pod_resources(&created).0.get("cpu").map(String::as_str),
        Some("1"),
        "the new web pod was right-sized through the mounted certificate"
    );
}

/// A small node where `grow` and `held` start; the roomy node joins once they run.
const SMALL_NODE: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: small-1
  annotations: {kwok.x-k8s.io/node: fake}
  labels: {kubernetes.io/hostname: small-1, kubernetes.io/os: linux, kubernetes.io/arch: amd64}
status:
  capacity: {cpu: "1", memory: 4Gi, pods: "110"}
  allocatable: {cpu: "1", memory: 4Gi, pods: "110"}
"#;

/// Every workload of the namespace in Auto mode, resized in place in one step.
const AUTO_IN_PLACE_ONE_STEP: &str = r#"
apiVersion: tailor.sh/v1alpha1
kind: RightsizingPolicy
metadata: {name: default, namespace: default}
spec:
  mode: Auto
  update: {mode: InPlace, maxStepFraction: 0}
"#;

/// `held`'s budget is at its limit: no pod may be disrupted.
const HELD_PDB: &str = r#"
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: held, namespace: default}
spec:
  minAvailable: 2
  selector: {matchLabels: {app: held}}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_the_node_cannot_resize_is_evicted_and_comes_back_with_the_recommendation_unless_its_pdb_forbids()
 {
    let _serial = SERIAL.lock().await;
    // Both workloads use well over a core: more than the small node can ever give a pod.
    let (usage, _) = history(&[
        ("default", "grow-5d8f7c9b4-abcde", 1.2, 300.0, 3 * DAY),
        ("default", "grow-5d8f7c9b4-fghij", 1.2, 300.0, 3 * DAY),
        ("default", "held-7c6b5d4f8-klmno", 1.2, 300.0, 3 * DAY),
        ("default", "held-7c6b5d4f8-pqrst", 1.2, 300.0, 3 * DAY),
    ]);
    let prometheus = start_prometheus(&usage).await;
    let cp = ControlPlane::start().await;
    cp.apply_yaml(
        &[
            SMALL_NODE.to_string(),
            deployment("default", "grow", 2, "100m", "64Mi"),
            deployment("default", "held", 2, "100m", "64Mi"),
            HELD_PDB.to_string(),
        ]
        .join("\n---\n"),
    )
    .await;
    wait_pods_running(&cp, "default", 4).await;
    // The roomy node joins now: only a pod created with the new requests goes there.
    cp.apply_yaml(NODE).await;
    cp.apply_yaml(AUTO_IN_PLACE_ONE_STEP).await;
    cp.apply_yaml("apiVersion: v1\nkind: Namespace\nmetadata: {name: tailor}\n")
        .await;
    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "default");
    let uids = |prefix: &'static str| {
        let pods = pods.clone();
        async move {
            list(&pods)
                .await
                .into_iter()
                .filter(|p| p.name_any().starts_with(prefix))
                .filter_map(|p| p.uid())
                .collect::<Vec<_>>()
        }
    };
    let (grow_before, held_before) = (uids("grow-").await, uids("held-").await);
    assert_eq!((grow_before.len(), held_before.len()), (2, 2));

    let port = control_plane::free_port();
    let mut flags = agent_flags(&prometheus, "3s");
    flags.extend([
        "--webhook-address".to_string(),
        format!("127.0.0.1:{port}"),
        "--webhook-url".to_string(),
        format!("https://127.0.0.1:{port}/mutate-pods"),
    ]);
    let agent = Agent::start_as(
        &cp,
        &cp.kubeconfig,
        "tailor",
        "agent-a",
        &["--cloud", "kwok"],
        &as_strs(&flags),
        &[],
    );
    agent.wait_ready().await;
    let grow = actionable(&cp, "deployment-grow", 60).await;
    let target = recommended_requests(&grow);
    let cores = tailor::model::quantity::parse_milli(&target["cpu"]).expect("cpu");
    assert!(
        cores > 1000,
        "a recommendation the small node cannot hold: {target:?}"
    );

    // grow's pods are resized, found Infeasible, evicted one at a time (minReplicas 1) and
    // replaced by pods created with the recommendation, which land on the roomy node.
    let replaced = eventually(
        Duration::from_secs(120),
        "grow's pods replaced with the recommendation",
        || async {
            let now = list(&pods).await;
            let grows: Vec<&Pod> = now
                .iter()
                .filter(|p| p.name_any().starts_with("grow-"))
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            let done = grows.len() == 2
                && grows.iter().all(|p| {
                    let (spec, status, _) = pod_resources(p);
                    !grow_before.contains(&p.uid().unwrap_or_default())
                        && spec == target
                        && status == target
                        && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("fake-1")
                });
            done.then(|| grows.iter().map(|p| p.name_any()).collect::<Vec<_>>())
        },
    )
    .await;
    assert_eq!(replaced.len(), 2);

    // held's budget allows no disruption: its pods stay, stuck, and the Recommendation says why.
    let events: Api<Event> = Api::namespaced(cp.client.clone(), "default");
    let waiting = eventually(
        Duration::from_secs(60),
        "an EvictionBlockedByBudget event",
        || async {
            list(&events).await.into_iter().find(|e| {
                e.reason.as_deref() == Some("EvictionBlockedByBudget")
                    && e.involved_object.name.as_deref() == Some("deployment-held")
            })
        },
    )
    .await;
    let message = waiting.message.unwrap_or_default();
    assert!(
        message.contains("Infeasible") && message.contains("PodDisruptionBudget"),
        "{message}"
    );
    let evicted = list(&events)
        .await
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("EvictedToResize")
                && e.involved_object.name.as_deref() == Some("deployment-grow")
        })
        .count();
    assert!(
        evicted >= 1,
        "no EvictedToResize event on grow's Recommendation"
    );
    assert_eq!(
        uids("held-").await,
        held_before,
        "held's pods were not evicted"
    );
    let metrics = agent.metrics().await;
    assert!(
        metric(
            &metrics,
            "tailor_rightsizing_evictions_total{reason=\"infeasible\""
        ) >= 2.0,
        "{metrics}"
    );
    assert!(
        metric(
            &metrics,
            "tailor_rightsizing_evictions_waiting{reason=\"pdb\""
        ) >= 1.0,
        "{metrics}"
    );
}

/// `web` opts into rolling restarts; the others stay in recommend mode.
const ROLLING_RESTART: &str = r#"
apiVersion: tailor.sh/v1alpha1
kind: RightsizingPolicy
metadata: {name: web-rolling, namespace: default}
spec:
  selector: {matchLabels: {app: web}}
  mode: Auto
  update: {mode: RollingRestart, maxStepFraction: 0}
"#;

/// A Deployment's spec with its containers' resources taken out, for "nothing else changed".
fn without_resources(d: &k8s_openapi::api::apps::v1::Deployment) -> serde_json::Value {
    let mut spec = serde_json::to_value(d.spec.as_ref().expect("spec")).expect("JSON");
    for c in spec["template"]["spec"]["containers"]
        .as_array_mut()
        .expect("containers")
    {
        c.as_object_mut().expect("container").remove("resources");
    }
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_rolling_restart_mode_the_pod_template_gets_the_requests_and_the_deployment_rolls_its_pods()
 {
    use k8s_openapi::api::apps::v1::Deployment;
    let _serial = SERIAL.lock().await;
    let (cp, prometheus) = cluster().await;
    cp.apply_yaml(ROLLING_RESTART).await;
    let deployments: Api<Deployment> = Api::namespaced(cp.client.clone(), "default");
    let before = deployments.get("web").await.expect("web");
    let api_before = deployments.get("api").await.expect("api");
    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "default");
    let old_uids: Vec<Option<String>> = list(&pods)
        .await
        .iter()
        .filter(|p| p.name_any().starts_with("web-"))
        .map(|p| p.uid())
        .collect();
    // Without --rightsizing-rolling-restart (the chart's default, which grants no patch on
    // workloads) the policy is told so on the Recommendation and the template is left alone.
    let flags = agent_flags(&prometheus, "3s");
    let off = Agent::start(&cp, "agent-off", &as_strs(&flags));
    off.wait_ready().await;
    actionable(&cp, "deployment-web", 60).await;
    let events: Api<Event> = Api::namespaced(cp.client.clone(), "default");
    let refused = eventually(
        Duration::from_secs(60),
        "a RollingRestartDisabled Event",
        || async {
            list(&events)
                .await
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("RollingRestartDisabled"))
        },
    )
    .await;
    assert_eq!(
        refused.involved_object.name.as_deref(),
        Some("deployment-web"),
        "{refused:?}"
    );
    assert!(
        refused
            .message
            .as_deref()
            .is_some_and(|m| m.contains("--rightsizing-rolling-restart")),
        "{refused:?}"
    );
    let untouched = deployments.get("web").await.expect("web");
    assert_eq!(
        untouched.spec.as_ref().map(|s| &s.template),
        before.spec.as_ref().map(|s| &s.template),
        "the template is left alone"
    );
    drop(off);

    let mut flags = flags;
    flags.push("--rightsizing-rolling-restart".to_string());
    let agent = Agent::start(&cp, "agent-a", &as_strs(&flags));
    agent.wait_ready().await;
    let web = actionable(&cp, "deployment-web", 60).await;
    let target = recommended_requests(&web);
    let requests = |d: &Deployment| -> BTreeMap<String, String> {
        d.spec
            .as_ref()
            .expect("spec")
            .template
            .spec
            .as_ref()
            .expect("pod spec")
            .containers[0]
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
            .unwrap_or_default()
    };
    assert_ne!(requests(&before), target, "a change to make");
    // The template gets the recommendation, applied by Tailor's field manager.
    let after = eventually(
        Duration::from_secs(60),
        "web's template requests",
        || async {
            let d = deployments.get("web").await.ok()?;
            (requests(&d) == target).then_some(d)
        },
    )
    .await;
    assert_eq!(
        without_resources(&after),
        without_resources(&before),
        "nothing but the requests changed"
    );
    let managers: Vec<String> = after
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.manager.as_deref() == Some("tailor"))
        .map(|m| serde_json::to_string(&m.fields_v1).expect("JSON"))
        .collect();
    assert_eq!(managers.len(), 1, "{:?}", after.metadata.managed_fields);
    for owned in ["f:requests", "f:cpu", "f:memory"] {
        assert!(managers[0].contains(owned), "{}", managers[0]);
    }
    for not_owned in ["f:image", "f:replicas", "f:selector", "f:labels"] {
        assert!(!managers[0].contains(not_owned), "{}", managers[0]);
    }
    // The Deployment rolls: new web pods with the new requests replace the old ones.
    eventually(Duration::from_secs(90), "web's pods rolled", || async {
        let now = list(&pods).await;
        let webs: Vec<&Pod> = now
            .iter()
            .filter(|p| p.name_any().starts_with("web-"))
            .collect();
        (webs.len() == 2
            && webs.iter().all(|p| {
                !old_uids.contains(&p.uid())
                    && pod_resources(p).0 == target
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            }))
        .then_some(())
    })
    .await;
    // api is in recommend mode: its template is as it was.
    let api_after = deployments.get("api").await.expect("api");
    assert_eq!(requests(&api_after), requests(&api_before));
    assert_eq!(
        api_after.metadata.generation,
        api_before.metadata.generation
    );
    let metrics = agent.metrics().await;
    assert!(
        metric(&metrics, "tailor_recommendations_applied_total") >= 1.0,
        "{metrics}"
    );
}

/// A container throttled by its CPU limit keeps that limit when its request falls: the
/// agent reads the throttled share of CFS periods from Prometheus, and the Recommendation
/// says why the limit was kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_containers_cpu_limit_is_kept_when_its_request_falls() {
    let _serial = SERIAL.lock().await;
    // Request and limit 500m; 300m of usage a minute for three days, throttled in a third
    // of its 100 ms periods.
    let end = jiff::Timestamp::now().as_second() / 60 * 60 - 60;
    let labels = r#"namespace="default",pod="limited-5d8f7c9b4-abcde",container="app""#;
    let mut om = String::new();
    for (metric, per_minute) in [
        ("container_cpu_usage_seconds", 0.3 * 60.0),
        ("container_cpu_cfs_periods", 600.0),
        ("container_cpu_cfs_throttled_periods", 200.0),
    ] {
        let _ = writeln!(om, "# TYPE {metric} counter");
        let mut total = 0.0;
        for t in (end - 3 * DAY..=end).step_by(60) {
            total += per_minute;
            let _ = writeln!(om, "{metric}_total{{{labels}}} {total} {t}");
        }
    }
    om.push_str("# TYPE container_memory_working_set_bytes gauge\n");
    for t in (end - 3 * DAY..=end).step_by(60) {
        let _ = writeln!(
            om,
            "container_memory_working_set_bytes{{{labels}}} {} {t}",
            200.0 * MIB
        );
    }
    om.push_str("# EOF\n");
    let prometheus = start_prometheus(&om).await;
    let cp = ControlPlane::start().await;
    let limited = deployment("default", "limited", 1, "500m", "1Gi").replace(
        r#"resources: {requests: {cpu: "500m", memory: "1Gi"}}"#,
        r#"resources: {requests: {cpu: "500m", memory: "1Gi"}, limits: {cpu: 500m}}"#,
    );
    cp.apply_yaml(&[NODE.to_string(), limited].join("\n---\n"))
        .await;
    wait_pods_running(&cp, "default", 1).await;
    let flags = agent_flags(&prometheus, "1h");
    let agent = Agent::start(&cp, "agent-a", &as_strs(&flags));
    agent.wait_ready().await;
    let r = eventually(
        Duration::from_secs(60),
        "limited's Recommendation",
        || async {
            let r = recommendation(&cp, "default", "deployment-limited").await?;
            (condition(&r, "Ready") == Some("True")).then_some(r)
        },
    )
    .await;
    let c = &r.status.as_ref().expect("status").containers[0];
    let cpu = millicores(&c.recommended.requests["cpu"].0);
    let limit = millicores(&c.recommended.limits["cpu"].0);
    // The request falls towards the demand the throttling shows (300m used, a third of
    // the periods throttled: about 350m); the ratio would take the limit down with it,
    // but it stays.
    assert!(cpu < 450, "request {cpu}m: {:?}", c.reasons);
    assert_eq!(limit, 500, "limit {limit}m: {:?}", c.reasons);
    assert!(
        c.reasons.iter().any(|x| x.contains("never lowered")),
        "{:?}",
        c.reasons
    );
}
