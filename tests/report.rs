//! `tailor report` against a real Prometheus server (Debian's package) over two days of
//! kube-state-metrics and cadvisor history backfilled with promtool: every dollar and
//! core-hour is checked against figures computed here from the generated samples and the
//! catalog's published prices; the CSV and Parquet files are read back with polars.

#[path = "support/bin.rs"]
mod bin;
#[path = "support/prometheus.rs"]
mod prometheus_server;

use std::collections::BTreeMap;
use std::f64::consts::PI;
use std::fmt::Write as _;

use bin::tailor;
use polars::prelude::DataFrame;
use polars_io::SerReader as _;
use prometheus_server::{free_port, start_prometheus};

const DAY: i64 = 86_400;
const HOUR: i64 = 3_600;
const MIB: f64 = 1_048_576.0;
const GIB: f64 = 1_073_741_824.0;
const SPOT_DISCOUNT: f64 = 0.5;

/// CPU cores of a synthetic container at `t` (diurnal around `base`).
fn cpu_at(base: f64, t: i64) -> f64 {
    base * (1.0 + 0.5 * (2.0 * PI * (t % DAY) as f64 / DAY as f64).sin())
}

/// Memory bytes of a synthetic container at `t`.
fn memory_at(base_mib: f64, t: i64) -> f64 {
    ((base_mib + 40.0 * (2.0 * PI * (t % DAY) as f64 / DAY as f64).cos()) * MIB).round()
}

/// One container of the fixture.
struct Replica {
    namespace: &'static str,
    pod: &'static str,
    container: &'static str,
    node: &'static str,
    /// (kind, name) in kube_pod_owner; `None`: a bare pod.
    owner: Option<(&'static str, &'static str)>,
    cpu_request: Option<f64>,
    memory_request_mib: f64,
    cpu_base: f64,
    memory_mib: f64,
    /// When kube-state-metrics first reports it (cadvisor an hour earlier).
    from: i64,
}

struct Fixture {
    /// End of the window.
    end: i64,
    containers: Vec<Replica>,
    openmetrics: String,
}

/// Two days ending a day ago (and an hour before, for the first hour's rates): a
/// Deployment with a replica that lives the whole window and one that starts half way,
/// a StatefulSet on a spot node of another NodePool, a bare pod without a CPU request, and
/// a pending pod that costs nothing.
fn fixture() -> Fixture {
    let now = jiff::Timestamp::now().as_second();
    let end = (now / HOUR) * HOUR - DAY;
    let first = end - 2 * DAY - HOUR;
    let containers = vec![
        Replica {
            namespace: "shop",
            pod: "web-7d9f8c6b5-aaaaa",
            container: "app",
            node: "node-a",
            owner: Some(("ReplicaSet", "web-7d9f8c6b5")),
            cpu_request: Some(1.0),
            memory_request_mib: 1024.0,
            cpu_base: 0.4,
            memory_mib: 300.0,
            from: first + HOUR,
        },
        Replica {
            namespace: "shop",
            pod: "web-7d9f8c6b5-bbbbb",
            container: "app",
            node: "node-a",
            owner: Some(("ReplicaSet", "web-7d9f8c6b5")),
            cpu_request: Some(1.0),
            memory_request_mib: 1024.0,
            cpu_base: 0.6,
            memory_mib: 500.0,
            from: end - DAY,
        },
        Replica {
            namespace: "shop",
            pod: "db-0",
            container: "postgres",
            node: "node-b",
            owner: Some(("StatefulSet", "db")),
            cpu_request: Some(0.5),
            memory_request_mib: 2048.0,
            cpu_base: 0.2,
            memory_mib: 1500.0,
            from: first + HOUR,
        },
        Replica {
            namespace: "batch",
            pod: "adhoc",
            container: "sh",
            node: "node-a",
            owner: None,
            cpu_request: None,
            memory_request_mib: 256.0,
            cpu_base: 0.1,
            memory_mib: 100.0,
            from: first + HOUR,
        },
    ];
    let mut om = String::new();
    let minutes = |from: i64| (from..=end).step_by(60);
    om.push_str("# TYPE kube_pod_container_resource_requests gauge\n");
    for c in &containers {
        for t in minutes(c.from) {
            if let Some(cpu) = c.cpu_request {
                let _ = writeln!(
                    om,
                    "kube_pod_container_resource_requests{{namespace=\"{}\",pod=\"{}\",container=\"{}\",node=\"{}\",resource=\"cpu\",unit=\"core\"}} {cpu} {t}",
                    c.namespace, c.pod, c.container, c.node
                );
            }
        }
    }
    for c in &containers {
        for t in minutes(c.from) {
            let _ = writeln!(
                om,
                "kube_pod_container_resource_requests{{namespace=\"{}\",pod=\"{}\",container=\"{}\",node=\"{}\",resource=\"memory\",unit=\"byte\"}} {} {t}",
                c.namespace,
                c.pod,
                c.container,
                c.node,
                c.memory_request_mib * MIB
            );
        }
    }
    // A pending pod: requests, no node, no usage.
    for t in minutes(first + HOUR) {
        let _ = writeln!(
            om,
            "kube_pod_container_resource_requests{{namespace=\"shop\",pod=\"web-7d9f8c6b5-ccccc\",container=\"app\",node=\"\",resource=\"cpu\",unit=\"core\"}} 1 {t}"
        );
    }
    om.push_str("# TYPE kube_pod_container_resource_limits gauge\n");
    for t in minutes(first + HOUR) {
        let _ = writeln!(
            om,
            "kube_pod_container_resource_limits{{namespace=\"shop\",pod=\"db-0\",container=\"postgres\",node=\"node-b\",resource=\"memory\",unit=\"byte\"}} {} {t}",
            4096.0 * MIB
        );
    }
    om.push_str("# TYPE kube_pod_owner gauge\n");
    for c in &containers {
        let (kind, name) = c.owner.unwrap_or(("<none>", "<none>"));
        for t in minutes(c.from) {
            let _ = writeln!(
                om,
                "kube_pod_owner{{namespace=\"{}\",pod=\"{}\",owner_kind=\"{kind}\",owner_name=\"{name}\",owner_is_controller=\"true\"}} 1 {t}",
                c.namespace, c.pod
            );
        }
    }
    om.push_str("# TYPE kube_replicaset_owner gauge\n");
    for t in minutes(first + HOUR) {
        let _ = writeln!(
            om,
            "kube_replicaset_owner{{namespace=\"shop\",replicaset=\"web-7d9f8c6b5\",owner_kind=\"Deployment\",owner_name=\"web\",owner_is_controller=\"true\"}} 1 {t}"
        );
    }
    om.push_str("# TYPE kube_node_labels gauge\n");
    for t in minutes(first) {
        let _ = writeln!(
            om,
            "kube_node_labels{{node=\"node-a\",label_node_kubernetes_io_instance_type=\"Standard_D4s_v5\",label_tailor_sh_nodepool=\"general\",label_tailor_sh_capacity_type=\"on-demand\"}} 1 {t}"
        );
        let _ = writeln!(
            om,
            "kube_node_labels{{node=\"node-b\",label_node_kubernetes_io_instance_type=\"Standard_E4s_v5\",label_tailor_sh_nodepool=\"memory\",label_tailor_sh_capacity_type=\"spot\"}} 1 {t}"
        );
    }
    om.push_str("# TYPE container_cpu_usage_seconds counter\n");
    for c in &containers {
        let mut total = 0.0;
        for t in minutes(c.from - HOUR) {
            total += cpu_at(c.cpu_base, t) * 60.0;
            let _ = writeln!(
                om,
                "container_cpu_usage_seconds_total{{namespace=\"{}\",pod=\"{}\",container=\"{}\"}} {total} {t}",
                c.namespace, c.pod, c.container
            );
        }
    }
    om.push_str("# TYPE container_memory_working_set_bytes gauge\n");
    for c in &containers {
        for t in minutes(c.from - HOUR) {
            let _ = writeln!(
                om,
                "container_memory_working_set_bytes{{namespace=\"{}\",pod=\"{}\",container=\"{}\"}} {} {t}",
                c.namespace,
                c.pod,
                c.container,
                memory_at(c.memory_mib, t)
            );
        }
    }
    om.push_str("# EOF\n");
    Fixture {
        end,
        containers,
        openmetrics: om,
    }
}

/// The on-demand list price of a size in eastus and its vCPUs and GiB, read from the
/// built-in catalog's files.
fn published(size: &str) -> (f64, f64, f64) {
    let root = env!("CARGO_MANIFEST_DIR");
    let skus =
        std::fs::read_to_string(format!("{root}/src/catalog/builtin-skus.csv")).expect("skus");
    let prices =
        std::fs::read_to_string(format!("{root}/src/catalog/builtin-prices.csv")).expect("prices");
    let sku: Vec<&str> = skus
        .lines()
        .find(|l| l.starts_with(&format!("{size},")))
        .expect("size listed")
        .split(',')
        .collect();
    let price: f64 = prices
        .lines()
        .find(|l| l.starts_with(&format!("eastus,{size},")))
        .expect("price listed")
        .split(',')
        .nth(2)
        .expect("a price")
        .parse()
        .expect("a number");
    (
        price,
        sku[2].parse().expect("vcpus"),
        sku[3].parse().expect("GiB"),
    )
}

/// Figures expected for one workload, summed over its containers.
#[derive(Debug, Default, Clone, Copy)]
struct Expected {
    hours: f64,
    cpu_requested: f64,
    cpu_used: f64,
    memory_requested: f64,
    memory_used: f64,
    requested: f64,
    used: f64,
    wasted: f64,
}

/// Costs each container at every hourly evaluation of the window, as the report defines
/// them, from the generated samples themselves.
fn expected(f: &Fixture) -> BTreeMap<&'static str, Expected> {
    let price = |node: &str| {
        let (size, spot) = if node == "node-a" {
            ("Standard_D4s_v5", false)
        } else {
            ("Standard_E4s_v5", true)
        };
        let (p, cores, gib) = published(size);
        let p = if spot { p * (1.0 - SPOT_DISCOUNT) } else { p };
        (p / 2.0 / cores, p / 2.0 / gib)
    };
    let mut out: BTreeMap<&'static str, Expected> = BTreeMap::new();
    for c in &f.containers {
        let workload = match c.owner {
            Some(("ReplicaSet", _)) => "web",
            Some((_, name)) => name,
            None => c.pod,
        };
        let (pc, pg) = price(c.node);
        // The counter as generated, per minute.
        let mut counter = BTreeMap::new();
        let mut total = 0.0;
        for t in (c.from - HOUR..=f.end).step_by(60) {
            total += cpu_at(c.cpu_base, t) * 60.0;
            counter.insert(t, total);
        }
        let e = out.entry(workload).or_default();
        for k in 1..=48 {
            let t = f.end - 2 * DAY + k * HOUR;
            // kube-state-metrics reports the pod at this evaluation.
            if t < c.from {
                continue;
            }
            let cpu_used = (counter[&t] - counter[&(t - HOUR)]) / HOUR as f64;
            let memory_used = (0..=60)
                .map(|m| memory_at(c.memory_mib, t - HOUR + m * 60))
                .sum::<f64>()
                / 61.0
                / GIB;
            let cpu = c.cpu_request.unwrap_or(0.0);
            let memory = c.memory_request_mib * MIB / GIB;
            e.hours += 1.0;
            e.cpu_requested += cpu;
            e.cpu_used += cpu_used;
            e.memory_requested += memory;
            e.memory_used += memory_used;
            e.requested += cpu * pc + memory * pg;
            e.used += cpu_used * pc + memory_used * pg;
            e.wasted += (cpu - cpu_used).max(0.0) * pc + (memory - memory_used).max(0.0) * pg;
        }
    }
    out
}

fn column(df: &DataFrame, name: &str) -> Vec<f64> {
    let values = df
        .column(name)
        .expect(name)
        .as_materialized_series()
        .cast(&polars::prelude::DataType::Float64)
        .expect("numbers");
    let values = values.f64().expect("f64");
    (0..values.len())
        .map(|i| values.get(i).expect("no nulls"))
        .collect()
}

fn text(df: &DataFrame, name: &str) -> Vec<String> {
    let values = df
        .column(name)
        .expect(name)
        .as_materialized_series()
        .str()
        .expect("text")
        .clone();
    (0..values.len())
        .map(|i| values.get(i).unwrap_or("").to_string())
        .collect()
}

fn close(got: f64, want: f64, what: &str) {
    assert!(
        (got - want).abs() <= 1e-6 * want.abs().max(1.0),
        "{what}: got {got}, expected {want}"
    );
}

async fn run(args: Vec<String>) -> (bool, String, String) {
    tokio::task::spawn_blocking(move || {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        tailor(&refs)
    })
    .await
    .expect("joined")
}

fn report_args(url: &str, end: i64, extra: &[&str]) -> Vec<String> {
    let now = jiff::Timestamp::from_second(end)
        .expect("valid")
        .to_string();
    let mut args: Vec<String> = [
        "report",
        "--prometheus-url",
        url,
        "--window",
        "2d",
        "--now",
        &now,
        "--spot-discount",
        "0.5",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_matches_costs_computed_from_the_generated_history_in_every_format() {
    let f = fixture();
    let server = start_prometheus(&f.openmetrics).await;
    let want = expected(&f);
    let dir = tempfile::tempdir().expect("temp dir");

    // Parquet, read back with polars.
    let parquet = dir.path().join("by-workload.parquet");
    let (ok, stdout, stderr) = run(report_args(
        &server.url,
        f.end,
        &[
            "-o",
            "parquet",
            "--output-file",
            parquet.to_str().expect("utf-8"),
        ],
    ))
    .await;
    assert!(ok, "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    let file = std::fs::File::open(&parquet).expect("the parquet file");
    let df = polars_io::parquet::read::ParquetReader::new(file)
        .finish()
        .expect("valid parquet");
    assert_eq!(
        text(&df, "workload"),
        ["adhoc", "web", "db"],
        "one row per workload; the pending pod, on no node, costs nothing"
    );
    assert_eq!(text(&df, "kind"), ["Pod", "Deployment", "StatefulSet"]);
    assert_eq!(text(&df, "namespace"), ["batch", "shop", "shop"]);
    for (i, name) in ["adhoc", "web", "db"].iter().enumerate() {
        let e = want[name];
        close(column(&df, "container_hours")[i], e.hours, "hours");
        close(
            column(&df, "requested_cpu_core_hours")[i],
            e.cpu_requested,
            "cpu requested",
        );
        close(
            column(&df, "used_cpu_core_hours")[i],
            e.cpu_used,
            "cpu used",
        );
        close(
            column(&df, "requested_memory_gib_hours")[i],
            e.memory_requested,
            "memory requested",
        );
        close(
            column(&df, "used_memory_gib_hours")[i],
            e.memory_used,
            "memory used",
        );
        close(
            column(&df, "requested_cost")[i],
            e.requested,
            &format!("{name} requested $"),
        );
        close(
            column(&df, "used_cost")[i],
            e.used,
            &format!("{name} used $"),
        );
        close(
            column(&df, "wasted_cost")[i],
            e.wasted,
            &format!("{name} wasted $"),
        );
        // Recoverable is what the recommended requests would have cost less.
        close(
            column(&df, "recoverable_cost")[i],
            column(&df, "requested_cost")[i] - column(&df, "recommended_cost")[i],
            "recoverable",
        );
    }
    // The web Deployment: 48 hours of one replica and 25 of the other.
    assert_eq!(want["web"].hours, 73.0);
    // The StatefulSet's recommendation comes from the right-sizing service: its memory is
    // the highest daily peak (1540 MiB) plus 4%, rounded up to a MiB, on every hour.
    let db = 2;
    let hours = column(&df, "container_hours")[db];
    let recommended_memory = column(&df, "recommended_memory_gib_hours")[db] / hours * GIB;
    let expected_memory = 1540.0 * MIB * 1.04;
    assert!(
        recommended_memory >= expected_memory && recommended_memory <= expected_memory + MIB,
        "db memory {} MiB vs {} MiB",
        recommended_memory / MIB,
        expected_memory / MIB
    );
    let (price, cores, gib) = published("Standard_E4s_v5");
    let spot = price * (1.0 - SPOT_DISCOUNT);
    let recommended_cpu = column(&df, "recommended_cpu_core_hours")[db] / hours;
    close(
        column(&df, "recommended_cost")[db],
        hours
            * (recommended_cpu * spot / 2.0 / cores + recommended_memory / GIB * spot / 2.0 / gib),
        "db recommended $",
    );
    // It asks for 2 GiB and needs about 1.6: shrinking it is recoverable money.
    assert!(column(&df, "recoverable_cost")[db] > 0.0);

    // CSV by NodePool, parsed with polars: the node pools' totals are the workloads'.
    let (ok, csv, stderr) = run(report_args(
        &server.url,
        f.end,
        &["-o", "csv", "--by", "nodepool"],
    ))
    .await;
    assert!(ok, "{stderr}");
    let pools = polars_io::csv::read::CsvReadOptions::default()
        .with_has_header(true)
        .into_reader_with_file_handle(std::io::Cursor::new(csv.into_bytes()))
        .finish()
        .expect("valid CSV");
    assert_eq!(text(&pools, "nodepool"), ["general", "memory"]);
    let general = want["web"].requested + want["adhoc"].requested;
    close(
        column(&pools, "requested_cost")[0],
        general,
        "general requested $",
    );
    close(
        column(&pools, "requested_cost")[1],
        want["db"].requested,
        "memory requested $",
    );
    close(
        column(&pools, "wasted_cost")[0],
        want["web"].wasted + want["adhoc"].wasted,
        "general wasted $",
    );

    // The table by namespace and the HTML page carry the same totals.
    let (ok, table, stderr) = run(report_args(&server.url, f.end, &["--by", "namespace"])).await;
    assert!(ok, "{stderr}");
    let total: f64 = want.values().map(|e| e.requested).sum();
    assert!(table.contains("NAMESPACE"), "{table}");
    assert!(table.contains(&format!("${total:.2} requested")), "{table}");
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[1].starts_with("batch") && lines[2].starts_with("shop"),
        "{table}"
    );
    let (ok, page, stderr) = run(report_args(&server.url, f.end, &["-o", "html"])).await;
    assert!(ok, "{stderr}");
    assert!(
        page.contains(&format!("<b>${total:.2}</b> requested")),
        "{page}"
    );
    for heading in ["By namespace", "By workload", "By NodePool"] {
        assert!(page.contains(heading), "{heading}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_with_no_requests_is_an_error_and_writes_no_file() {
    let f = fixture();
    let server = start_prometheus(&f.openmetrics).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("report.parquet");
    // A month before the history starts.
    let (ok, stdout, stderr) = run(report_args(
        &server.url,
        f.end - 40 * DAY,
        &[
            "-o",
            "parquet",
            "--output-file",
            out.to_str().expect("utf-8"),
        ],
    ))
    .await;
    assert!(!ok);
    assert!(stdout.is_empty(), "{stdout}");
    assert!(stderr.contains("nothing to report"), "{stderr}");
    assert!(stderr.contains("--window 2d"), "{stderr}");
    assert!(stderr.contains(&server.url), "{stderr}");
    assert_eq!(
        std::fs::read_dir(dir.path()).expect("dir").count(),
        0,
        "no file, not even a partial one"
    );
    // A namespace with no history.
    let (ok, _, stderr) = run(report_args(&server.url, f.end, &["-n", "nowhere"])).await;
    assert!(!ok);
    assert!(stderr.contains("namespace(s) nowhere"), "{stderr}");
}

#[test]
fn bad_flags_are_named_and_an_unreachable_prometheus_leaves_no_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("report.csv");
    let url = format!("http://127.0.0.1:{}", free_port());
    for (flags, named) in [
        (vec!["--window", "30x"], "--window: \"30x\""),
        (
            vec!["--window", "400d"],
            "--window: \"400d\": must be at most 366d",
        ),
        (
            vec!["--window", "30m"],
            "--window: \"30m\": must be at least 1h",
        ),
        (vec!["--step", "5s"], "--step: \"5s\": must be at least 1m"),
        (vec!["--now", "yesterday"], "--now: \"yesterday\""),
        (vec!["-o", "parquet"], "--output-file"),
    ] {
        let mut args = vec!["report", "--prometheus-url", url.as_str()];
        args.extend(flags.iter().copied());
        let (ok, stdout, stderr) = tailor(&args);
        assert!(!ok, "{flags:?}");
        assert!(stdout.is_empty(), "{stdout}");
        assert!(stderr.contains(named), "{flags:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let (ok, stdout, stderr) = tailor(&[
        "report",
        "--prometheus-url",
        &url,
        "--prometheus-timeout-seconds",
        "2",
        "-o",
        "csv",
        "--output-file",
        out.to_str().expect("utf-8"),
    ]);
    assert!(!ok);
    assert!(stdout.is_empty(), "{stdout}");
    assert!(stderr.contains("--prometheus-url"), "{stderr}");
    assert!(stderr.contains(&url), "{stderr}");
    assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0);
}
