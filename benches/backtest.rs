//! Right-sizing backtest, as a program: `cargo bench --bench backtest`.
//!
//! For every trace shape, containers are generated with 14 days of one-minute samples;
//! each algorithm trains on days 1-7 and is scored on days 8-14. Prints waste (requested
//! but unused core-hours and GiB-hours) and risk (would-be OOM and starvation samples per
//! container-day) per shape and overall, with Tailor's waste relative to VPA and KRR.
//! Without `--bench` (as `cargo test --all-targets` runs it) it does a small smoke run.

use std::collections::BTreeMap;

use tailor::catalog::{Catalog, CatalogOptions};
use tailor::rightsizing::Prices;
use tailor::rightsizing::backtest::{Algorithm, Samples, Score, Sized, score, train};
use tailor::sim::traces::{Shape, generate};

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
        "== backtest: {per_shape} containers per shape, {days} days at {step}s, train days 1-{train_days}, test days {}-{days} ==",
        train_days + 1
    );
    println!(
        "{:<9} {:<7} {:>12} {:>12} {:>14} {:>14}",
        "shape", "algo", "waste core-h", "waste GiB-h", "OOM risk/day", "starve risk/day"
    );
    let mut overall: BTreeMap<Algorithm, Score> = BTreeMap::new();
    for ((shape, alg), s) in &table {
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
        "memory floor (each container's exact test peak, no OOM): {:.1} GiB-h; vpa is {:.2}x it, tailor {:.2}x",
        memory_floor.waste_gib_hours,
        v.waste_gib_hours / memory_floor.waste_gib_hours.max(1e-9),
        t.waste_gib_hours / memory_floor.waste_gib_hours.max(1e-9)
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
}
