//! Right-sizing compute benchmark, as a program: `cargo bench --bench rightsizing`.
//!
//! Feeds 10,000 containers x 14 days x one-minute CPU and memory samples through the
//! recommender's history and builds every recommendation, single-threaded. The samples
//! are generated on the fly; a baseline loop that only generates them runs in the same
//! process, and the difference is the recommender's own time. Prints the peak resident
//! set of the process, and the Prometheus query counts of Tailor's scheme and of KRR's
//! (one query per 50 pods per metric). Without `--bench` it does a small smoke run.

use std::hint::black_box;
use std::time::Instant;

use tailor::rightsizing::{
    ContainerHistory, Context, Policy, Requests, cpu_starvation_price, recommend,
};
use tailor::usage::UsageQuery;
use tailor::usage::prometheus::{PrometheusSettings, PrometheusSource};

/// A cheap deterministic sample: a diurnal wave with hashed noise.
fn sample(container: u64, minute: u64) -> (f64, f64) {
    let mut z =
        container.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ minute.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z ^= z >> 31;
    let noise = (z % 1000) as f64 / 1000.0;
    let wave = ((minute % 1440) as f64 / 1440.0 * std::f64::consts::TAU).sin();
    let scale = 0.1 + (container % 17) as f64 * 0.05;
    (
        scale * (1.2 + wave + 0.3 * noise),
        2.0e8 * (1.0 + 0.2 * wave + 0.05 * noise),
    )
}

fn vm_hwm_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<f64>().ok())
        })
        .map_or(0.0, |k| k / 1024.0)
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (containers, days) = if full { (10_000u64, 14u64) } else { (50, 2) };
    let minutes = days * 1440;
    let start = 1_790_000_000i64;

    // Baseline: generating the samples only.
    let t0 = Instant::now();
    let mut sink = 0.0;
    for c in 0..containers {
        for m in 0..minutes {
            let (cpu, mem) = sample(c, m);
            sink += cpu + mem;
        }
    }
    black_box(sink);
    let generate = t0.elapsed().as_secs_f64();

    // The recommender: every sample into the history, then every recommendation.
    let policy = Policy::default();
    let t1 = Instant::now();
    let mut histories: Vec<ContainerHistory> = Vec::with_capacity(containers as usize);
    for c in 0..containers {
        let mut h = ContainerHistory::new(&policy, start);
        for m in 0..minutes {
            let (cpu, mem) = sample(c, m);
            let t = start + m as i64 * 60;
            h.add_cpu(t, cpu);
            h.add_memory(t, mem);
        }
        histories.push(h);
    }
    let now = start + minutes as i64 * 60;
    let current = Requests {
        cpu: Some(1000),
        memory: Some(1 << 30),
        cpu_limit: None,
        memory_limit: None,
    };
    let mut saved = 0.0;
    for h in &histories {
        saved += recommend(h, current, &policy, &Context::default(), now).hourly_cost_delta;
    }
    black_box(saved);
    let total = t1.elapsed().as_secs_f64();
    // The recommendations alone, with the default CPU sizing and with the percentile
    // alone (the sizing before the starvation weight), over the same histories.
    let recommend_all = |policy: &Policy| {
        let t = Instant::now();
        let mut saved = 0.0;
        for h in &histories {
            saved += recommend(h, current, policy, &Context::default(), now).hourly_cost_delta;
        }
        black_box(saved);
        t.elapsed().as_secs_f64()
    };
    let percentile_only = Policy {
        cpu_starvation_weight: 0.0,
        ..policy.clone()
    };
    let before = recommend_all(&percentile_only);
    let after = recommend_all(&policy);
    // The CostFirst profile's fleet price, solved over all 10,000 histories, then every
    // recommendation under it: what a right-sizing round of one such policy does (the
    // default Balanced profile has no fleet price).
    let cost_first = Policy::from_spec(&tailor::apis::RightsizingPolicySpec {
        profile: tailor::apis::Profile::CostFirst,
        ..Default::default()
    })
    .expect("the cost-first profile");
    let t = Instant::now();
    let price = cpu_starvation_price(&histories, &cost_first);
    let solve = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let priced = Context {
        cpu_starvation_price: price,
        ..Context::default()
    };
    let mut saved = 0.0;
    for h in &histories {
        saved += recommend(h, current, &cost_first, &priced, now).hourly_cost_delta;
    }
    black_box(saved);
    let fleet = solve + t.elapsed().as_secs_f64();
    let samples = containers * minutes * 2;
    let recommender = (total - generate).max(0.0);
    println!(
        "== right-sizing compute: {containers} containers x {days} days x 1-minute samples ({samples} samples) =="
    );
    println!("generation only (baseline):      {generate:.2} s");
    println!("generation + history + recommend: {total:.2} s");
    println!(
        "recommender's own time: {recommender:.2} s ({:.0} M samples/s); target <= 10 s",
        samples as f64 / recommender.max(1e-9) / 1e6
    );
    println!(
        "recommendations alone: {after:.3} s with the relative starvation weight, {before:.3} s with the percentile alone ({:.2}x)",
        after / before.max(1e-9)
    );
    println!(
        "recommendations under one fleet price (the CostFirst profile): {fleet:.3} s, of which solving the price {solve:.3} s ({:.2}x the percentile alone; price {:.4} cores)",
        fleet / before.max(1e-9),
        price.unwrap_or(0.0)
    );
    println!(
        "peak RSS of this process: {:.0} MiB (target <= 1024 MiB)",
        vm_hwm_mib()
    );
    // Query count for this cluster: 40 namespaces of 250 single-container pods, planned
    // by the Prometheus source exactly as a read plans them (plus its series lookup).
    let pods = containers; // one container per pod in this cluster
    let krr = pods.div_ceil(50) * 2;
    let source =
        PrometheusSource::new(PrometheusSettings::new("http://prometheus:9090")).expect("settings");
    let series: Vec<(String, String)> = (0..pods)
        .map(|i| (format!("ns-{}", i / 250), format!("pod-{i}")))
        .collect();
    for step in [300i64, 60] {
        let plan = source.plan(
            &series,
            &UsageQuery {
                namespaces: Vec::new(),
                start: 0,
                end: days as i64 * 86_400,
                step,
            },
        );
        let tailor = plan.len() + 1;
        println!(
            "Prometheus queries for {days} days at a {step}s CPU step: Tailor {tailor}, KRR {krr} (1 per 50 pods per resource); ratio {:.3} (target <= 0.1)",
            tailor as f64 / krr as f64
        );
    }
}
