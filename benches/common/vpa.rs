//! The Kubernetes Vertical Pod Autoscaler's own recommender as a right-sizing baseline:
//! the real binary (v1.8.1, built and cached by `scripts/vpa build`) run against a real
//! Prometheus and the real test control plane, so a backtest can compare Tailor with what
//! VPA itself recommends rather than with a re-implementation of it.
//!
//! [`recommend`] takes one [`VpaInput`] per container (a training history of one-minute
//! samples and the deployed requests) and:
//!
//! 1. takes a control plane (`ControlPlane::start`, pooled with `TAILOR_E2E_POOL`), adds
//!    nodes the kubelet stand-in runs and, in namespace `backtest`, one single-replica
//!    Deployment per input (label `app: <name>`, container `app` with the input's requests
//!    and CPU limit), and waits for every pod to run;
//! 2. installs VPA's CRDs and creates one `VerticalPodAutoscaler` per Deployment and CPU
//!    percentile (`<name>-p90`, update mode `Off`, served by the recommender named `p90`);
//! 3. shifts the history so that training ends just before now (VPA reads the last
//!    `--history-length` before its own start) and backfills it into Prometheus as
//!    cadvisor's series of the live pods: VPA reads CPU as
//!    `rate(container_cpu_usage_seconds_total[1m])` at a one-minute step, which needs two
//!    points in every minute, so the counter is written every 30 s (each minute's usage as
//!    two halves at its rate); memory is the working-set gauge, once a minute; the pod
//!    labels come from an `up{job="kubernetes-pods"}` series;
//! 4. runs the recommender once per percentile, waits until every VPA of that percentile
//!    has a recommendation for container `app`, reads it and stops the recommender.
//!
//! VPA's other settings are its defaults (15% margin, memory from daily peaks at p90, at
//! least 25m CPU and 250Mi memory, 24 h half-lives). Each phase's time is printed to stderr.

// This module's own copies of the test support, so that it works in any bench; a bench
// may include the same files itself (the backtest does `prometheus.rs`).
#[allow(dead_code)] // the benches use `ControlPlane::start` and a few helpers, not the agent
#[allow(clippy::duplicate_mod)]
#[path = "../../tests/support/control_plane.rs"]
mod control_plane;
#[allow(clippy::duplicate_mod)]
#[path = "../../tests/support/prometheus.rs"]
mod prometheus_server;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::discovery::ApiResource;
use kube::{Client, Resource};
use tailor::model::quantity::{parse_milli, parse_value};

/// The namespace of every object [`recommend`] creates.
const NAMESPACE: &str = "backtest";
/// The one container of every pod.
const CONTAINER: &str = "app";
/// The history VPA reads, as it would at `train_end` with `--history-length=7d`.
const HISTORY_DAYS: i64 = 7;
/// Pods per node (the kubelet stand-in's nodes take up to 110).
const PODS_PER_NODE: usize = 100;
/// API requests in flight at once while creating objects.
const CONCURRENCY: usize = 32;
/// Where every CPU counter starts, in core-seconds (see [`openmetrics`]).
const COUNTER_BASE: f64 = 1e6;
/// The label that tells which recommender (`p90`, ...) serves a VPA object.
const RECOMMENDER_LABEL: &str = "tailor.backtest/recommender";

/// One container's training history and deployment, as VPA sees it.
#[derive(Debug, Clone)]
pub struct VpaInput<'a> {
    /// Its Deployment's name (also its `app` label): a unique DNS-1123 label, e.g.
    /// `tuning-batch-3`.
    pub name: String,
    /// `(unix seconds, cores used)`, one sample per minute (the usage of the minute ending
    /// then), only while the container runs: a gap (a CronJob between runs) has none.
    pub cpu: &'a [(i64, f64)],
    /// `(unix seconds, working-set bytes)`, as `cpu`.
    pub memory: &'a [(i64, f64)],
    /// The deployed requests: cores, bytes.
    pub requests: (f64, f64),
    /// The deployed CPU limit in cores, if any.
    pub cpu_limit: Option<f64>,
}

/// VPA's recommendation for one container: `(cores, bytes)` each.
#[derive(Debug, Clone, Copy, PartialEq)]
#[allow(dead_code)] // not every caller reads the bounds
pub struct VpaOutput {
    /// `target`: what VPA would set the requests to.
    pub target: (f64, f64),
    /// `lowerBound`.
    pub lower: (f64, f64),
    /// `upperBound`.
    pub upper: (f64, f64),
}

/// Runs the real VPA recommender once per CPU target percentile in `cpu_percentiles` (0.9
/// is VPA's default, given to 0.1%) over the same history, which ends at `train_end` (unix
/// seconds; samples after it are refused); returns, per percentile in order, one output
/// per input in order. Panics, with the recommender's log path, when it fails or does not
/// answer for every input in time.
pub async fn recommend(
    inputs: &[VpaInput<'_>],
    train_end: i64,
    cpu_percentiles: &[f64],
) -> Vec<Vec<VpaOutput>> {
    let names = check(inputs, train_end, cpu_percentiles);
    let total = Instant::now();
    let vpa = vpa_build();

    let phase = Instant::now();
    let cp = control_plane::ControlPlane::start().await;
    let client = cp.client.clone();
    progress("control plane ready", phase);

    let phase = Instant::now();
    install_crds(&client, &vpa.join("vpa-v1-crd-gen.yaml")).await;
    create_workloads(&client, inputs).await;
    progress(
        &format!(
            "VPA CRDs, {} nodes and {} Deployments created",
            node_count(inputs.len()),
            inputs.len()
        ),
        phase,
    );
    let phase = Instant::now();
    let pods = wait_for_pods(&client, inputs).await;
    progress(&format!("{} pods running", pods.len()), phase);
    let phase = Instant::now();
    create_vpas(&client, inputs, &names).await;
    progress(
        &format!("{} VPA objects created", inputs.len() * names.len()),
        phase,
    );

    // Training ends a couple of minutes before now, on a minute: the recommender starts
    // after the backfill and reads up to its own start.
    let phase = Instant::now();
    let now = jiff::Timestamp::now().as_second();
    let history_end = now / 60 * 60 - 120;
    let om = openmetrics(inputs, &pods, history_end - train_end, history_end);
    let megabytes = om.len() as f64 / 1e6;
    progress(&format!("history written ({megabytes:.0} MB)"), phase);
    let phase = Instant::now();
    let prometheus = prometheus_server::start_prometheus(&om).await;
    drop(om);
    progress("history backfilled into Prometheus", phase);

    let scratch = Scratch::new();
    let mut outputs = Vec::with_capacity(names.len());
    for (&percentile, name) in cpu_percentiles.iter().zip(&names) {
        let phase = Instant::now();
        let run = Run {
            client: &client,
            binary: &vpa.join("recommender"),
            kubeconfig: &cp.kubeconfig,
            prometheus: &prometheus.url,
            log: &scratch.path().join(format!("recommender-{name}.log")),
            history_end,
        };
        outputs.push(run.recommend(inputs, name, percentile).await);
        progress(
            &format!(
                "{name}: the recommender answered for {} VPA objects",
                inputs.len()
            ),
            phase,
        );
    }
    clean_up(&client, inputs.len()).await;
    progress("VPA baseline done", total);
    outputs
}

fn progress(what: &str, since: Instant) {
    eprintln!("vpa: {what} in {:.1}s", since.elapsed().as_secs_f64());
}

/// Panics on inputs [`recommend`] cannot run; returns each percentile's recommender name.
fn check(inputs: &[VpaInput<'_>], train_end: i64, cpu_percentiles: &[f64]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    for input in inputs {
        let name = &input.name;
        let label = name.len() <= 63
            && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && name.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        assert!(label, "VPA input {name:?}: not a DNS-1123 label");
        assert!(seen.insert(name), "VPA input {name:?} given twice");
        for (what, samples) in [("cpu", input.cpu), ("memory", input.memory)] {
            for pair in samples.windows(2) {
                assert!(
                    pair[1].0 - pair[0].0 >= 60,
                    "VPA input {name}: {what} samples at {} and {} are less than a minute apart",
                    pair[0].0,
                    pair[1].0
                );
            }
            if let Some(last) = samples.last() {
                assert!(
                    last.0 <= train_end,
                    "VPA input {name}: {what} sample at {} is after the end of training {train_end}",
                    last.0
                );
            }
        }
    }
    let names: Vec<String> = cpu_percentiles
        .iter()
        .map(|&p| recommender_name(p))
        .collect();
    for (i, name) in names.iter().enumerate() {
        assert!(
            !names[..i].contains(name),
            "CPU percentile {name} given twice"
        );
    }
    names
}

/// `p90` for 0.9, `p99-5` for 0.995: the recommender's name and the VPA objects' suffix.
fn recommender_name(percentile: f64) -> String {
    let permille = (percentile * 1000.0).round();
    assert!(
        percentile > 0.0 && percentile <= 1.0 && (percentile * 1000.0 - permille).abs() < 1e-6,
        "CPU percentile {percentile}: not in (0, 1] to 0.1%"
    );
    let permille = permille as u32;
    match permille % 10 {
        0 => format!("p{}", permille / 10),
        tenth => format!("p{}-{tenth}", permille / 10),
    }
}

/// Runs `scripts/vpa build` (a second when cached) and returns the directory holding
/// `recommender` and `vpa-v1-crd-gen.yaml`.
fn vpa_build() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/vpa");
    let out = Command::new(&script)
        .arg("build")
        .output()
        .expect("scripts/vpa runs");
    assert!(
        out.status.success(),
        "scripts/vpa build failed (it needs go):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(stdout.lines().last().expect("the VPA directory").trim())
}

/// Creates VPA's CRDs (those already there, on a pooled control plane, stay) and waits
/// until the API server serves them.
async fn install_crds(client: &Client, yaml: &Path) {
    let text =
        std::fs::read_to_string(yaml).unwrap_or_else(|e| panic!("reading {}: {e}", yaml.display()));
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value: serde_json::Value = serde::Deserialize::deserialize(doc).expect("CRD YAML");
        if value.is_null() {
            continue;
        }
        let crd: CustomResourceDefinition = serde_json::from_value(value).expect("a CRD");
        names.push(crd.metadata.name.clone().expect("a CRD's name"));
        match api.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.is_already_exists() => {}
            Err(e) => panic!("creating CRD {:?}: {e}", crd.metadata.name),
        }
    }
    control_plane::wait_established(client, &names, Duration::from_secs(60)).await;
}

fn node_count(pods: usize) -> usize {
    pods.div_ceil(PODS_PER_NODE) + 1
}

fn node_name(i: usize) -> String {
    format!("vpa-backtest-{i}")
}

/// The namespace, the nodes (roomy enough for any requests) and one Deployment per input.
async fn create_workloads(client: &Client, inputs: &[VpaInput<'_>]) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}
    }))
    .expect("a Namespace");
    create(&namespaces, &namespace).await;

    let nodes: Api<Node> = Api::all(client.clone());
    let nodes = &nodes;
    concurrently((0..node_count(inputs.len())).map(|i| async move {
        let name = node_name(i);
        let node: Node = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                },
            },
            "status": {
                "capacity": {"cpu": "4000", "memory": "16Ti", "pods": "110"},
                "allocatable": {"cpu": "4000", "memory": "16Ti", "pods": "110"},
            },
        }))
        .expect("a Node");
        create(nodes, &node).await;
    }))
    .await;

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    let deployments = &deployments;
    concurrently(inputs.iter().map(|input| async move {
        create(deployments, &deployment(input)).await;
    }))
    .await;
}

fn deployment(input: &VpaInput<'_>) -> Deployment {
    let name = &input.name;
    let milli = |cores: f64| format!("{}m", (cores * 1000.0).round() as i64);
    let mut resources = serde_json::json!({
        "requests": {
            "cpu": milli(input.requests.0),
            "memory": format!("{}", input.requests.1.round() as i64),
        }
    });
    if let Some(limit) = input.cpu_limit {
        resources["limits"] = serde_json::json!({"cpu": milli(limit)});
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": name}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{
                        "name": CONTAINER,
                        "image": format!("registry.example/{name}:1"),
                        "resources": resources,
                    }],
                },
            },
        },
    }))
    .expect("a Deployment")
}

/// Waits until every input's Deployment has one Running pod; returns their names, in
/// input order.
async fn wait_for_pods(client: &Client, inputs: &[VpaInput<'_>]) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let timeout = Duration::from_secs(300);
    let start = Instant::now();
    loop {
        let listed = pods.list(&ListParams::default()).await.expect("list pods");
        let mut running: HashMap<String, Vec<String>> = HashMap::new();
        for pod in listed.items {
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            if phase != Some("Running") || pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let app = pod.metadata.labels.as_ref().and_then(|l| l.get("app"));
            if let (Some(app), Some(name)) = (app, pod.metadata.name.clone()) {
                running.entry(app.clone()).or_default().push(name);
            }
        }
        let names: Vec<Option<String>> = inputs
            .iter()
            .map(|i| match running.get(&i.name).map(Vec::as_slice) {
                Some([one]) => Some(one.clone()),
                _ => None,
            })
            .collect();
        let missing = names.iter().filter(|n| n.is_none()).count();
        if missing == 0 {
            return names.into_iter().flatten().collect();
        }
        assert!(
            start.elapsed() < timeout,
            "{missing} of {} Deployments in {NAMESPACE} have no single Running pod after {timeout:?}",
            inputs.len()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `autoscaling.k8s.io/v1` `VerticalPodAutoscaler`.
fn vpa_resource() -> ApiResource {
    ApiResource {
        group: "autoscaling.k8s.io".to_string(),
        version: "v1".to_string(),
        api_version: "autoscaling.k8s.io/v1".to_string(),
        kind: "VerticalPodAutoscaler".to_string(),
        plural: "verticalpodautoscalers".to_string(),
    }
}

/// One VPA object per input and recommender, recommending only (update mode `Off`).
async fn create_vpas(client: &Client, inputs: &[VpaInput<'_>], recommenders: &[String]) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NAMESPACE, &vpa_resource());
    let api = &api;
    concurrently(
        recommenders
            .iter()
            .flat_map(|r| inputs.iter().map(move |i| (r, i)))
            .map(|(recommender, input)| async move {
                let object: DynamicObject = serde_json::from_value(serde_json::json!({
                    "apiVersion": "autoscaling.k8s.io/v1",
                    "kind": "VerticalPodAutoscaler",
                    "metadata": {
                        "name": format!("{}-{recommender}", input.name),
                        "namespace": NAMESPACE,
                        "labels": {RECOMMENDER_LABEL: recommender},
                    },
                    "spec": {
                        "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": input.name},
                        "updatePolicy": {"updateMode": "Off"},
                        "recommenders": [{"name": recommender}],
                    },
                }))
                .expect("a VerticalPodAutoscaler");
                create(api, &object).await;
            }),
    )
    .await;
}

/// Runs `futures` with at most [`CONCURRENCY`] in flight.
async fn concurrently<F: Future<Output = ()>>(futures: impl Iterator<Item = F>) {
    futures::stream::iter(futures)
        .buffer_unordered(CONCURRENCY)
        .collect::<Vec<()>>()
        .await;
}

async fn create<K>(api: &Api<K>, object: &K)
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if let Err(e) = api.create(&PostParams::default(), object).await {
        panic!("creating {:?}: {e}", object.meta().name);
    }
}

/// `(unix seconds, value)`, in time order.
type Samples = Vec<(i64, f64)>;

/// The history as OpenMetrics text, every timestamp moved by `shift`, with the live pods'
/// names: what VPA's Prometheus queries read (cadvisor's series of job
/// `kubernetes-cadvisor`, pod labels from `up{job="kubernetes-pods"}`). Only the last
/// [`HISTORY_DAYS`] before `history_end` (after the shift) is written: VPA reads no more.
fn openmetrics(inputs: &[VpaInput<'_>], pods: &[String], shift: i64, history_end: i64) -> String {
    let from = history_end - HISTORY_DAYS * 86_400;
    let shifted = |samples: &[(i64, f64)]| -> Samples {
        samples
            .iter()
            .map(|&(t, v)| (t + shift, v))
            .filter(|&(t, _)| t > from)
            .collect()
    };
    let series: Vec<(Samples, Samples)> = inputs
        .iter()
        .map(|i| (shifted(i.cpu), shifted(i.memory)))
        .collect();
    // About 140 bytes a line: three lines a minute of history per input.
    let lines: usize = series.iter().map(|(c, m)| 2 * c.len() + m.len()).sum();
    let mut om = String::with_capacity(lines * 150 + (1 << 20));
    let cadvisor = |pod: &str| {
        format!(
            "{{job=\"kubernetes-cadvisor\",namespace=\"{NAMESPACE}\",pod=\"{pod}\",container=\"{CONTAINER}\"}}"
        )
    };
    // The counter of core-seconds, a point every 30 s while the container runs: a minute's
    // usage at its rate over its two halves, from a point at the start of each running
    // period's first minute. Then a one-minute rate at any step from a minute's middle to
    // the next minute's middle is that minute's usage: every minute is read exactly once,
    // whatever the phase of VPA's steps (without the starting point, each running period's
    // first minute is lost at half the phases). The counter starts far from zero, so that
    // Prometheus never shortens its extrapolation to where it would have been zero.
    om.push_str("# TYPE container_cpu_usage_seconds counter\n");
    for ((cpu, _), pod) in series.iter().zip(pods) {
        let labels = cadvisor(pod);
        let mut total = COUNTER_BASE;
        let mut last = i64::MIN;
        for &(t, cores) in cpu {
            if last != t - 60 {
                let at = t - 60;
                let _ = writeln!(om, "container_cpu_usage_seconds_total{labels} {total} {at}");
            }
            for at in [t - 30, t] {
                total += cores * 30.0;
                let _ = writeln!(om, "container_cpu_usage_seconds_total{labels} {total} {at}");
            }
            last = t;
        }
    }
    // The working set, once a minute: VPA reads the gauge's last point at each step, so
    // every minute is read exactly once (and, as from any scrape, again for up to
    // Prometheus' five-minute lookback after a running period ends).
    om.push_str("# TYPE container_memory_working_set_bytes gauge\n");
    for ((_, memory), pod) in series.iter().zip(pods) {
        let labels = cadvisor(pod);
        for &(t, bytes) in memory {
            let _ = writeln!(om, "container_memory_working_set_bytes{labels} {bytes} {t}");
        }
    }
    // Pod labels: VPA reads only each pod's last sample in the range, so one an hour (and
    // the last) keeps the answer to its range query small.
    om.push_str("# TYPE up gauge\n");
    for (((cpu, memory), pod), input) in series.iter().zip(pods).zip(inputs) {
        let times = if cpu.is_empty() { memory } else { cpu };
        let mut last = i64::MIN;
        for (k, &(t, _)) in times.iter().enumerate() {
            if t - last >= 3600 || k + 1 == times.len() {
                last = t;
                let _ = writeln!(
                    om,
                    "up{{job=\"kubernetes-pods\",namespace=\"{NAMESPACE}\",pod=\"{pod}\",pod_label_app=\"{}\"}} 1 {t}",
                    input.name
                );
            }
        }
    }
    om.push_str("# EOF\n");
    om
}

/// A temporary directory for the recommenders' logs, kept when the run fails (or with
/// `TAILOR_E2E_KEEP_LOGS` set, as the control plane's are).
struct Scratch(Option<tempfile::TempDir>);

impl Scratch {
    fn new() -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix("tailor-vpa-")
            .tempdir()
            .expect("a temporary directory");
        Scratch(Some(dir))
    }

    fn path(&self) -> &Path {
        self.0.as_ref().expect("the directory").path()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let keep = std::thread::panicking() || std::env::var_os("TAILOR_E2E_KEEP_LOGS").is_some();
        if keep && let Some(dir) = self.0.take() {
            eprintln!("vpa: recommender logs kept in {}", dir.keep().display());
        }
    }
}

/// The recommender process; killed when dropped.
struct Recommender(Child);

impl Drop for Recommender {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What one recommender run needs.
struct Run<'a> {
    client: &'a Client,
    binary: &'a Path,
    kubeconfig: &'a Path,
    prometheus: &'a str,
    log: &'a Path,
    /// Where the shifted history ends (unix seconds).
    history_end: i64,
}

impl Run<'_> {
    /// Runs the recommender named `name` at CPU target `percentile` until every input's VPA
    /// object has its recommendation; returns them in input order.
    async fn recommend(
        &self,
        inputs: &[VpaInput<'_>],
        name: &str,
        percentile: f64,
    ) -> Vec<VpaOutput> {
        // VPA queries `now - history-length .. now`: the minutes since the history's end
        // are added so that it reads all of the last HISTORY_DAYS before it.
        let since_end = (jiff::Timestamp::now().as_second() - self.history_end).max(0);
        let minutes = HISTORY_DAYS * 1440 + (since_end + 59) / 60 + 1;
        // Prometheus answers at most 11,000 points per series.
        assert!(
            minutes < 10_990,
            "the history ended {since_end}s ago: a one-minute read of it would exceed Prometheus' 11,000 points"
        );
        let log = std::fs::File::create(self.log).expect("the recommender's log");
        let args = self.args(name, percentile, minutes);
        let mut recommender = Recommender(
            Command::new(self.binary)
                .args(&args)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("the log"))
                .stderr(log)
                .spawn()
                .expect("the VPA recommender starts"),
        );
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), NAMESPACE, &vpa_resource());
        let by_name: HashMap<String, usize> = inputs
            .iter()
            .enumerate()
            .map(|(k, i)| (format!("{}-{name}", i.name), k))
            .collect();
        let timeout = Duration::from_secs(600 + inputs.len() as u64);
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = recommender.0.try_wait() {
                panic!(
                    "the VPA recommender {name} exited ({status}); its log: {}",
                    self.log.display()
                );
            }
            let listed = api
                .list(&ListParams::default().labels(&format!("{RECOMMENDER_LABEL}={name}")))
                .await
                .expect("list VPA objects");
            let mut outputs: Vec<Option<VpaOutput>> = vec![None; inputs.len()];
            for object in &listed.items {
                let index = object.metadata.name.as_ref().and_then(|n| by_name.get(n));
                if let (Some(&k), Some(output)) = (index, recommendation(object)) {
                    outputs[k] = Some(output);
                }
            }
            let missing = outputs.iter().filter(|o| o.is_none()).count();
            if missing == 0 {
                let text = std::fs::read_to_string(self.log).unwrap_or_default();
                // The recommender carries on without history when it cannot read it: every
                // answer would then be its minimum.
                assert!(
                    !text.contains("Cannot get cluster history"),
                    "the VPA recommender {name} could not read the history from Prometheus; its log: {}",
                    self.log.display()
                );
                return outputs.into_iter().flatten().collect();
            }
            assert!(
                start.elapsed() < timeout,
                "the VPA recommender {name} gave no recommendation for {missing} of {} VPA objects in {timeout:?}; its log: {}",
                inputs.len(),
                self.log.display()
            );
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    /// The recommender's flags: history from Prometheus (cadvisor's labels, pod labels from
    /// `up`), a 10 s loop, on loopback only, no leader election, this namespace only.
    fn args(&self, name: &str, percentile: f64, history_minutes: i64) -> Vec<String> {
        let port = control_plane::free_port();
        vec![
            format!("--kubeconfig={}", self.kubeconfig.display()),
            "--storage=prometheus".to_string(),
            format!("--prometheus-address={}", self.prometheus),
            format!("--history-length={history_minutes}m"),
            "--history-resolution=1m".to_string(),
            "--container-pod-name-label=pod".to_string(),
            "--container-name-label=container".to_string(),
            "--container-namespace-label=namespace".to_string(),
            "--prometheus-cadvisor-job-name=kubernetes-cadvisor".to_string(),
            "--metric-for-pod-labels=up{job=\"kubernetes-pods\"}[8d]".to_string(),
            "--pod-label-prefix=pod_label_".to_string(),
            "--pod-namespace-label=namespace".to_string(),
            "--pod-name-label=pod".to_string(),
            "--recommender-interval=10s".to_string(),
            format!("--recommender-name={name}"),
            format!("--target-cpu-percentile={percentile}"),
            format!("--vpa-object-namespace={NAMESPACE}"),
            // Metrics and /health-check: the recommender's only listener.
            format!("--address=127.0.0.1:{port}"),
            "--leader-elect=false".to_string(),
            // Hundreds of status updates a loop; the default 50/s takes seconds.
            "--kube-api-qps=500".to_string(),
            "--kube-api-burst=1000".to_string(),
        ]
    }
}

/// The recommendation for container `app` in a VPA object's status, if it has one.
fn recommendation(object: &DynamicObject) -> Option<VpaOutput> {
    let app = object.data["status"]["recommendation"]["containerRecommendations"]
        .as_array()?
        .iter()
        .find(|c| c["containerName"] == CONTAINER)?;
    let pair = |field: &str| -> Option<(f64, f64)> {
        let r = &app[field];
        let cpu = parse_milli(r["cpu"].as_str()?).ok()? as f64 / 1000.0;
        let memory = parse_value(r["memory"].as_str()?).ok()? as f64;
        Some((cpu, memory))
    };
    Some(VpaOutput {
        target: pair("target")?,
        lower: pair("lowerBound")?,
        upper: pair("upperBound")?,
    })
}

/// Deletes the namespace and the nodes without waiting, so that a pooled control plane's
/// next reset finds little left (VPA's CRDs stay, as Tailor's do); a plane of its own is
/// stopped when dropped anyway.
async fn clean_up(client: &Client, inputs: usize) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let _ = namespaces
        .delete(NAMESPACE, &DeleteParams::background())
        .await;
    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..node_count(inputs) {
        let _ = nodes.delete(&node_name(i), &DeleteParams::default()).await;
    }
}
