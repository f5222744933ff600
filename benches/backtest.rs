//! Right-sizing backtest, as a program: `cargo bench --bench backtest`.
//!
//! For every trace shape, containers are generated with 14 days of one-minute samples;
//! each algorithm trains on days 1-7 and is scored on days 8-14. Prints waste (requested
//! but unused core-hours and GiB-hours) and risk (would-be OOM and starvation samples per
//! container-day) per shape and overall, with Tailor's waste relative to VPA and KRR.
//! Without `--bench` (as `cargo test --all-targets` runs it) it does a small smoke run.
//!
//! The backtest runs twice: on the raw samples in memory, and on the real path — the
//! training days written as OpenMetrics, backfilled into a real Prometheus with promtool,
//! and read back through the Prometheus usage source exactly as `tailor recommend` reads
//! them (5-minute CPU rates, hourly memory peaks). Scoring always uses the raw samples.

#[path = "../tests/support/prometheus.rs"]
mod prometheus_server;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use tailor::usage::prometheus::{PrometheusSettings, PrometheusSource};
use tailor::usage::{UsageQuery, UsageSource};

use tailor::catalog::{Catalog, CatalogOptions};
use tailor::rightsizing::Prices;
use tailor::rightsizing::backtest::{Algorithm, Samples, Score, Sized, score, train};
use tailor::sim::traces::{Shape, generate};

/// A generated container: shape, pod name, CPU and memory samples.
type Kept = (Shape, String, Vec<(i64, f64)>, Vec<(i64, f64)>);

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (per_shape, days, step) = if full {
        (20u64, 14u32, 60i64)
    } else {
        (2, 4, 300)
    };
    let train_days = days / 2;
    let start = 1_790_000_000i64;
    let split = start + i64::from(train_days) * 86_400;
    let mut table: BTreeMap<(Shape, Algorithm), Score> = BTreeMap::new();
    // The least memory waste any fixed request without an OOM can have: each container's
    // exact peak of the test days.
    let mut memory_floor = Score::default();
    let mut kept: Vec<Kept> = Vec::new();
    for shape in Shape::ALL {
        for i in 0..per_shape {
            let trace = generate(shape, 1000 * (shape as u64 + 1) + i, start, days, step);
            let cpu: Vec<(i64, f64)> = trace
                .cpu
                .iter()
                .enumerate()
                .map(|(k, v)| (trace.time(k), *v))
                .collect();
            let memory: Vec<(i64, f64)> = trace
                .memory
                .iter()
                .enumerate()
                .map(|(k, v)| (trace.time(k), *v))
                .collect();
            let cut = cpu.partition_point(|s| s.0 < split);
            let train_samples = Samples {
                cpu: &cpu[..cut],
                memory: &memory[..cut],
            };
            let test_samples = Samples {
                cpu: &cpu[cut..],
                memory: &memory[cut..],
            };
            let test_peak = test_samples.memory.iter().map(|s| s.1).fold(0.0, f64::max);
            memory_floor.add(&score(
                Sized {
                    cpu: 0.0,
                    memory: test_peak,
                },
                test_samples,
                step,
            ));
            kept.push((
                shape,
                format!("{}-{i}", shape.name()),
                cpu.clone(),
                memory.clone(),
            ));
            for alg in Algorithm::ALL {
                let rec = train(alg, train_samples, split);
                table
                    .entry((shape, alg))
                    .or_default()
                    .add(&score(rec, test_samples, step));
            }
        }
    }
    println!(
        "== backtest in memory (raw samples): {per_shape} containers per shape, {days} days at {step}s, train days 1-{train_days}, test days {}-{days} ==",
        train_days + 1
    );
    let overall = report(&table);
    println!(
        "memory floor (each container's exact test peak, no OOM): {:.1} GiB-h; vpa is {:.2}x it, tailor {:.2}x",
        memory_floor.waste_gib_hours,
        overall[&Algorithm::Vpa].waste_gib_hours / memory_floor.waste_gib_hours.max(1e-9),
        overall[&Algorithm::Tailor].waste_gib_hours / memory_floor.waste_gib_hours.max(1e-9)
    );
    // The same, trained on what Prometheus returns.
    let om = openmetrics(&kept, split, step);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let began = std::time::Instant::now();
    let usage = runtime.block_on(async {
        let server = prometheus_server::start_prometheus(&om).await;
        let source = PrometheusSource::new(PrometheusSettings::new(&server.url)).expect("source");
        source
            .usage(&UsageQuery {
                namespaces: vec!["backtest".to_string()],
                start,
                end: split - 1,
                step: 300,
            })
            .await
            .expect("usage reads back")
    });
    drop(om);
    let mut table: BTreeMap<(Shape, Algorithm), Score> = BTreeMap::new();
    for (shape, pod, cpu, memory) in &kept {
        let key = tailor::usage::ContainerKey {
            namespace: "backtest".to_string(),
            pod: pod.clone(),
            container: "app".to_string(),
        };
        let read = usage
            .containers
            .get(&key)
            .expect("every container read back");
        let cut = cpu.partition_point(|s| s.0 < split);
        let test_samples = Samples {
            cpu: &cpu[cut..],
            memory: &memory[cut..],
        };
        let train_samples = Samples {
            cpu: &read.cpu,
            memory: &read.memory,
        };
        for alg in Algorithm::ALL {
            let rec = train(alg, train_samples, split);
            table
                .entry((*shape, alg))
                .or_default()
                .add(&score(rec, test_samples, step));
        }
    }
    println!(
        "\n== backtest through Prometheus: training days backfilled with promtool and read back with the Prometheus usage source ({} queries, {:.1}s including backfill) ==",
        usage.queries,
        began.elapsed().as_secs_f64()
    );
    let overall = report(&table);
    println!(
        "memory floor (each container's exact test peak, no OOM): {:.1} GiB-h; vpa is {:.2}x it, tailor {:.2}x",
        memory_floor.waste_gib_hours,
        overall[&Algorithm::Vpa].waste_gib_hours / memory_floor.waste_gib_hours.max(1e-9),
        overall[&Algorithm::Tailor].waste_gib_hours / memory_floor.waste_gib_hours.max(1e-9)
    );
}

/// The training days of every container as OpenMetrics text: CPU as the cumulative
/// counter cadvisor exports, memory as the working-set gauge.
fn openmetrics(kept: &[Kept], split: i64, step: i64) -> String {
    let mut om = String::new();
    om.push_str("# TYPE container_cpu_usage_seconds counter\n");
    for (_, pod, cpu, _) in kept {
        let mut total = 0.0;
        for (t, v) in cpu.iter().take_while(|s| s.0 < split) {
            total += v * step as f64;
            let _ = writeln!(
                om,
                "container_cpu_usage_seconds_total{{namespace=\"backtest\",pod=\"{pod}\",container=\"app\"}} {total} {t}"
            );
        }
    }
    om.push_str("# TYPE container_memory_working_set_bytes gauge\n");
    for (_, pod, _, memory) in kept {
        for (t, v) in memory.iter().take_while(|s| s.0 < split) {
            let _ = writeln!(
                om,
                "container_memory_working_set_bytes{{namespace=\"backtest\",pod=\"{pod}\",container=\"app\"}} {v} {t}"
            );
        }
    }
    om.push_str("# EOF\n");
    om
}

/// Prints the table per shape and overall, and Tailor against VPA and KRR.
fn report(table: &BTreeMap<(Shape, Algorithm), Score>) -> BTreeMap<Algorithm, Score> {
    println!(
        "{:<9} {:<7} {:>12} {:>12} {:>14} {:>14}",
        "shape", "algo", "waste core-h", "waste GiB-h", "OOM risk/day", "starve risk/day"
    );
    let mut overall: BTreeMap<Algorithm, Score> = BTreeMap::new();
    for ((shape, alg), s) in table {
        println!(
            "{:<9} {:<7} {:>12.1} {:>12.1} {:>14.3} {:>14.3}",
            shape.name(),
            alg.name(),
            s.waste_core_hours,
            s.waste_gib_hours,
            s.memory_risk_rate(),
            s.cpu_risk_rate()
        );
        overall.entry(*alg).or_default().add(s);
    }
    println!();
    for (alg, s) in &overall {
        println!(
            "{:<9} {:<7} {:>12.1} {:>12.1} {:>14.3} {:>14.3}",
            "overall",
            alg.name(),
            s.waste_core_hours,
            s.waste_gib_hours,
            s.memory_risk_rate(),
            s.cpu_risk_rate()
        );
    }
    let (t, v, k) = (
        &overall[&Algorithm::Tailor],
        &overall[&Algorithm::Vpa],
        &overall[&Algorithm::Krr],
    );
    let less = |a: f64, b: f64| if b > 0.0 { 100.0 * (1.0 - a / b) } else { 0.0 };
    // Waste in dollars, at what a requested core-hour and GiB-hour cost in eastus.
    let catalog = Catalog::builtin().expect("built-in catalog");
    let types = catalog
        .instance_types(&CatalogOptions::for_region("eastus"))
        .expect("eastus instance types");
    let prices = Prices::from_instance_types(&types);
    let dollars = |s: &Score| {
        s.waste_core_hours * prices.per_core_hour + s.waste_gib_hours * prices.per_gib_hour
    };
    println!(
        "\nwaste in dollars (eastus: {:.4} $/core-h, {:.4} $/GiB-h): tailor {:.0}, vpa {:.0}, krr {:.0}",
        prices.per_core_hour,
        prices.per_gib_hour,
        dollars(t),
        dollars(v),
        dollars(k)
    );
    println!(
        "tailor vs vpa: {:.1}% less CPU waste, {:.1}% less memory waste, {:.1}% less waste in dollars, OOM risk {:.2} vs {:.2}, starvation {:.2} vs {:.2} per container-day (target: >= 30% less waste, OOM risk no higher)",
        less(t.waste_core_hours, v.waste_core_hours),
        less(t.waste_gib_hours, v.waste_gib_hours),
        less(dollars(t), dollars(v)),
        t.memory_risk_rate(),
        v.memory_risk_rate(),
        t.cpu_risk_rate(),
        v.cpu_risk_rate()
    );
    println!(
        "tailor vs krr: {:.1}% less CPU waste, {:.1}% less memory waste, {:.1}% less waste in dollars, OOM risk {:.2} vs {:.2}, starvation {:.2} vs {:.2}",
        less(t.waste_core_hours, k.waste_core_hours),
        less(t.waste_gib_hours, k.waste_gib_hours),
        less(dollars(t), dollars(k)),
        t.memory_risk_rate(),
        k.memory_risk_rate(),
        t.cpu_risk_rate(),
        k.cpu_risk_rate()
    );
    overall
}
