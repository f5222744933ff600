//! Right-sizing backtest, as a program: `cargo bench --bench backtest`.
//!
//! For every trace shape, containers are generated with 14 days of one-minute samples;
//! each algorithm trains on days 1-7 and is scored on days 8-14 with the neutral scoring
//! of `rightsizing::backtest` (CPU waste and starvation against the demand, memory waste,
//! memory risk per five-minute window). VPA and KRR are independent reimplementations
//! (`rightsizing::baselines`). Containers come in two sets from disjoint seeds: a tuning
//! set (the one Tailor's defaults were chosen on) and a held-out set never used for
//! tuning; both are reported, per shape and overall, with the targets: CPU and memory
//! waste each at most 0.70x VPA's, memory risk no higher than VPA's, CPU starvation no
//! higher than KRR's. Without `--bench` (as `cargo test --all-targets` runs it) it does a
//! small smoke run.
//!
//! The backtest runs twice: on the raw samples in memory, and on the real path — the
//! training days written as OpenMetrics (CPU usage, working set, and the CFS throttling
//! counters of CPU-limited containers), backfilled into a real Prometheus with promtool,
//! and read back through the Prometheus usage source exactly as `tailor recommend` reads
//! them (5-minute CPU rates by default, `--prometheus-step` seconds otherwise; hourly
//! memory peaks). VPA and KRR read the CPU usage rate at the same step, as they would in
//! a cluster: the throttling counters are Tailor's alone. Scoring always uses the raw
//! samples.

#[path = "../tests/support/prometheus.rs"]
mod prometheus_server;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use tailor::rightsizing::Policy;
use tailor::rightsizing::backtest::{
    Algorithm, Observed, Samples, Score, Sized, score, train, train_fleet,
};
use tailor::sim::traces::{Shape, Trace, generate};
use tailor::usage::prometheus::{PrometheusSettings, PrometheusSource};
use tailor::usage::{UsageQuery, UsageSource};

type Series = Vec<(i64, f64)>;

/// Which containers a figure is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Set {
    /// Seeds Tailor's defaults were tuned on.
    Tuning,
    /// Seeds never used for tuning.
    HeldOut,
    /// A second held-out set, from seeds first generated after the CPU sizing was chosen.
    Fresh,
    /// A third held-out set, from seeds first generated after the Jobs' memory bound
    /// became a prediction bound (chosen for the second set's CronJob memory risk).
    Third,
    /// A fourth held-out set, from seeds first generated after the CPU starvation budget
    /// was chosen on the tuning set.
    Fourth,
    /// A fifth held-out set, from seeds first generated after the budget, the percentile
    /// floor and the burst headroom were chosen together on the tuning set.
    Fifth,
}

impl Set {
    fn name(self) -> &'static str {
        match self {
            Set::Tuning => "tuning",
            Set::HeldOut => "held-out",
            Set::Fresh => "held-out-2",
            Set::Third => "held-out-3",
            Set::Fourth => "held-out-4",
            Set::Fifth => "held-out-5",
        }
    }

    /// Disjoint seed ranges per set and shape.
    fn seed(self, shape: Shape, i: u64) -> u64 {
        let base = match self {
            Set::Tuning => 0,
            Set::HeldOut => 9_000_000,
            Set::Fresh => 47_000_000,
            Set::Third => 83_000_000,
            Set::Fourth => 131_000_000,
            Set::Fifth => 211_000_000,
        };
        base + 1000 * (shape as u64 + 1) + i
    }
}

/// Every set, in report order.
const SETS: [Set; 6] = [
    Set::Tuning,
    Set::HeldOut,
    Set::Fresh,
    Set::Third,
    Set::Fourth,
    Set::Fifth,
];

/// A generated container, split into what training sees and what is scored.
struct Container {
    set: Set,
    shape: Shape,
    pod: String,
    trace: Trace,
    /// Training: CPU usage, memory, throttled share (running samples only).
    train: (Series, Series, Series),
    /// Scored: demand and memory (running samples only).
    test: (Series, Series),
}

type Table = BTreeMap<(Set, Shape, Algorithm), Score>;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let full = args.iter().any(|a| a == "--bench");
    // Tuning aids, for the tuning set only: `--tailor-cpu P,MARGIN` trains Tailor with
    // another CPU percentile and margin than its defaults, `--starvation-budget B` with
    // another CPU starvation budget, `--burst-headroom H|off` with another burst guard
    // headroom (or none), `--half-life S` with another sample half-life,
    // `--memory-trend` with rising memory peaks projected;
    // `--sweep` prints the trade-off over a grid of them on the tuning set and stops.
    // An analysis aid, for all sets: `--oracle-demand` trains all three recommenders on the
    // demand itself instead of the usage capped by a CPU limit (and no throttling
    // counters), in memory only, which shows how much of a CPU-limited container's figures come from what
    // its usage hides rather than from the recommender.
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let mut policy = Policy::default();
    let mut tuned = false;
    if let Some(v) = value("--tailor-cpu") {
        let (p, m) = v.split_once(',').expect("--tailor-cpu P,MARGIN");
        policy.cpu_percentiles.0 = p.parse().expect("a percentile");
        policy.cpu_margin = m.parse().expect("a margin");
        tuned = true;
    }
    if let Some(v) = value("--starvation-budget") {
        policy.cpu_starvation_budget = v.parse().expect("a share");
        tuned = true;
    }
    if let Some(v) = value("--burst-headroom") {
        policy.cpu_burst = match v.as_str() {
            "off" => None,
            h => policy
                .cpu_burst
                .map(|(p, _)| (p, h.parse().expect("a headroom or off"))),
        };
        tuned = true;
    }
    if let Some(v) = value("--half-life") {
        policy.half_life = v.parse().expect("seconds");
        tuned = true;
    }
    if args.iter().any(|a| a == "--memory-trend") {
        policy.memory_trend = true;
        tuned = true;
    }
    let tailor_policy = if tuned { policy } else { Policy::default() };
    let sweep = args.iter().any(|a| a == "--sweep");
    let oracle = args.iter().any(|a| a == "--oracle-demand");
    let in_memory_only = sweep || oracle || args.iter().any(|a| a == "--in-memory");
    // The CPU step of the read through Prometheus (`tailor recommend --step`).
    let prometheus_step: i64 = value("--prometheus-step")
        .map(|v| v.parse().expect("--prometheus-step: seconds"))
        .unwrap_or(300);
    let (per_set, days, step) = if full {
        (10u64, 14u32, 60i64)
    } else {
        (1, 4, 300)
    };
    let train_days = days / 2;
    let start = 1_790_000_000i64;
    let split = start + i64::from(train_days) * 86_400;
    let sets: &[Set] = if sweep { &[Set::Tuning] } else { &SETS };
    let mut containers = Vec::new();
    for &set in sets {
        for shape in Shape::ALL {
            for i in 0..per_set {
                let trace = generate(shape, set.seed(shape, i), start, days, step);
                containers.push(split_trace(set, shape, i, trace, split, oracle));
            }
        }
    }
    if sweep {
        sweep_tuning(&containers, split, step);
        return;
    }
    let mut table = Table::new();
    let tailor = fleets(&containers, &tailor_policy, split, seen);
    for (c, tailor) in containers.iter().zip(&tailor) {
        for alg in Algorithm::ALL {
            let rec = match alg {
                Algorithm::Tailor => *tailor,
                _ => train(alg, seen(c), split),
            };
            table
                .entry((c.set, c.shape, alg))
                .or_default()
                .add(&score(rec, observed(c), step));
        }
    }
    println!(
        "== backtest in memory (raw one-minute samples): {per_set} containers per shape and set, {days} days at {step}s, train days 1-{train_days}, score days {}-{days} ==",
        train_days + 1
    );
    report(&table);
    if in_memory_only {
        return;
    }

    // The same, trained on what Prometheus returns.
    let om = openmetrics(&containers, split, step);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let began = std::time::Instant::now();
    let (usage, plain) = runtime.block_on(async {
        let server = prometheus_server::start_prometheus(&om).await;
        let settings = PrometheusSettings::new(&server.url);
        let window = (settings.rate_window.as_secs() as i64).max(prometheus_step);
        let source = PrometheusSource::new(settings).expect("source");
        let usage = source
            .usage(&UsageQuery {
                namespaces: vec!["backtest".to_string()],
                start,
                end: split - 1,
                step: prometheus_step,
            })
            .await
            .expect("usage reads back");
        // What VPA and KRR read: the usage rate alone, capped by a CPU limit, at the
        // same step and window.
        let plain = source
            .query_range(
                &format!(
                    "sum by (namespace, pod, container) \
                     (rate(container_cpu_usage_seconds_total{{namespace=\"backtest\"}}[{window}s]))"
                ),
                start + prometheus_step,
                split - 1,
                prometheus_step,
            )
            .await
            .expect("the usage rate reads back");
        let plain: BTreeMap<String, Vec<(i64, f64)>> = plain
            .into_iter()
            .map(|(labels, points)| (labels.get("pod").cloned().unwrap_or_default(), points))
            .collect();
        (usage, plain)
    });
    drop(om);
    // Tailor's CPU read is already the demand estimated from the throttling counters; the
    // baselines read the usage rate, as they do in a cluster.
    let read_back = |c: &Container| {
        let key = tailor::usage::ContainerKey {
            namespace: "backtest".to_string(),
            pod: c.pod.clone(),
            container: "app".to_string(),
        };
        let read = usage
            .containers
            .get(&key)
            .expect("every container read back");
        Samples {
            cpu: &read.cpu,
            memory: &read.memory,
            throttled: &[],
            requests: c.trace.requests,
            memory_interval: Some(read.memory_interval),
        }
    };
    let mut table = Table::new();
    let tailor = fleets(&containers, &tailor_policy, split, read_back);
    for (c, tailor) in containers.iter().zip(&tailor) {
        let seen = read_back(c);
        let usage_rate = Samples {
            cpu: plain.get(&c.pod).map_or(&[][..], Vec::as_slice),
            ..seen
        };
        assert!(
            !usage_rate.cpu.is_empty(),
            "{}: no usage rate read back",
            c.pod
        );
        for alg in Algorithm::ALL {
            let rec = match alg {
                Algorithm::Tailor => *tailor,
                _ => train(alg, usage_rate, split),
            };
            table
                .entry((c.set, c.shape, alg))
                .or_default()
                .add(&score(rec, observed(c), step));
        }
    }
    println!(
        "\n== backtest through Prometheus: training days backfilled with promtool and read back with the Prometheus usage source at a {prometheus_step}s step ({} queries, {:.1}s including backfill; the baselines read the CPU usage rate at the same step) ==",
        usage.queries,
        began.elapsed().as_secs_f64()
    );
    report(&table);
}

/// Splits a trace into training and scored samples; with `oracle`, training sees the
/// demand instead of the usage (and no throttling counters).
fn split_trace(
    set: Set,
    shape: Shape,
    i: u64,
    trace: Trace,
    split: i64,
    oracle: bool,
) -> Container {
    let mut train = (Vec::new(), Vec::new(), Vec::new());
    let mut test = (Vec::new(), Vec::new());
    for k in 0..trace.cpu.len() {
        if !trace.running[k] {
            continue;
        }
        let t = trace.time(k);
        if t < split {
            let seen = if oracle {
                trace.demand[k]
            } else {
                trace.cpu[k]
            };
            train.0.push((t, seen));
            train.1.push((t, trace.memory[k]));
            if let Some(th) = trace.throttled.as_ref().filter(|_| !oracle) {
                train.2.push((t, th[k]));
            }
        } else {
            test.0.push((t, trace.demand[k]));
            test.1.push((t, trace.memory[k]));
        }
    }
    Container {
        set,
        shape,
        pod: format!("{}-{}-{i}", set.name(), shape.name()),
        trace,
        train,
        test,
    }
}

fn observed(c: &Container) -> Observed<'_> {
    Observed {
        demand: &c.test.0,
        memory: &c.test.1,
    }
}

/// The training days of every container as OpenMetrics text: CPU usage and the CFS
/// period counters as the cumulative counters cadvisor exports, memory as the working-set
/// gauge. A CronJob's series have no samples between its runs.
fn openmetrics(containers: &[Container], split: i64, step: i64) -> String {
    let mut om = String::new();
    let labels = |pod: &str| format!("namespace=\"backtest\",pod=\"{pod}\",container=\"app\"");
    om.push_str("# TYPE container_cpu_usage_seconds counter\n");
    for c in containers {
        let mut total = 0.0;
        for (t, v) in c.train.0.iter().take_while(|s| s.0 < split) {
            total += v * step as f64;
            let _ = writeln!(
                om,
                "container_cpu_usage_seconds_total{{{}}} {total} {t}",
                labels(&c.pod)
            );
        }
    }
    // 100 ms CFS periods: ten a second while the container runs.
    let per_step = step as f64 * 10.0;
    om.push_str("# TYPE container_cpu_cfs_periods counter\n");
    for c in containers.iter().filter(|c| !c.train.2.is_empty()) {
        for (k, (t, _)) in c.train.2.iter().enumerate() {
            let _ = writeln!(
                om,
                "container_cpu_cfs_periods_total{{{}}} {} {t}",
                labels(&c.pod),
                (k + 1) as f64 * per_step
            );
        }
    }
    om.push_str("# TYPE container_cpu_cfs_throttled_periods counter\n");
    for c in containers.iter().filter(|c| !c.train.2.is_empty()) {
        let mut total = 0.0;
        for (t, share) in &c.train.2 {
            total += (share * per_step).round();
            let _ = writeln!(
                om,
                "container_cpu_cfs_throttled_periods_total{{{}}} {total} {t}",
                labels(&c.pod)
            );
        }
    }
    om.push_str("# TYPE container_memory_working_set_bytes gauge\n");
    for c in containers {
        for (t, v) in c.train.1.iter().take_while(|s| s.0 < split) {
            let _ = writeln!(
                om,
                "container_memory_working_set_bytes{{{}}} {v} {t}",
                labels(&c.pod)
            );
        }
    }
    om.push_str("# EOF\n");
    om
}

/// Tailor's figure over VPA's (or KRR's), `-` when the baseline is zero.
fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}x", a / b)
    } else if a > 0.0 {
        "inf".to_string()
    } else {
        "-".to_string()
    }
}

/// Prints, per set, the table per shape and overall, and the targets.
fn report(table: &Table) {
    for set in SETS {
        println!(
            "\n-- {} set --\n{:<18} {:<7} {:>12} {:>12} {:>10} {:>10}   {:>9} {:>9}",
            set.name(),
            "shape",
            "algo",
            "cpu waste c-h",
            "mem waste GiB-h",
            "mem risk",
            "starved",
            "cpu/vpa",
            "mem/vpa"
        );
        if !table.keys().any(|k| k.0 == set) {
            continue;
        }
        let mut overall: BTreeMap<Algorithm, Score> = BTreeMap::new();
        for shape in Shape::ALL {
            let vpa = table
                .get(&(set, shape, Algorithm::Vpa))
                .copied()
                .unwrap_or_default();
            for alg in Algorithm::ALL {
                let Some(s) = table.get(&(set, shape, alg)) else {
                    continue;
                };
                println!(
                    "{:<18} {:<7} {:>12.1} {:>12.1} {:>9.3}% {:>9.3}%   {:>9} {:>9}",
                    shape.name(),
                    alg.name(),
                    s.waste_core_hours,
                    s.waste_gib_hours,
                    100.0 * s.memory_risk(),
                    100.0 * s.starvation(),
                    ratio(s.waste_core_hours, vpa.waste_core_hours),
                    ratio(s.waste_gib_hours, vpa.waste_gib_hours),
                );
                overall.entry(alg).or_default().add(s);
            }
        }
        for (alg, s) in &overall {
            println!(
                "{:<18} {:<7} {:>12.1} {:>12.1} {:>9.3}% {:>9.3}%   {:>9} {:>9}",
                "overall",
                alg.name(),
                s.waste_core_hours,
                s.waste_gib_hours,
                100.0 * s.memory_risk(),
                100.0 * s.starvation(),
                ratio(
                    s.waste_core_hours,
                    overall[&Algorithm::Vpa].waste_core_hours
                ),
                ratio(s.waste_gib_hours, overall[&Algorithm::Vpa].waste_gib_hours),
            );
        }
        let (t, v, k) = (
            overall[&Algorithm::Tailor],
            overall[&Algorithm::Vpa],
            overall[&Algorithm::Krr],
        );
        let verdict = |ok: bool| if ok { "met" } else { "NOT MET" };
        let cpu = t.waste_core_hours / v.waste_core_hours.max(1e-12);
        let mem = t.waste_gib_hours / v.waste_gib_hours.max(1e-12);
        println!(
            "{} targets: CPU waste {cpu:.2}x VPA's (<= 0.70: {}), memory waste {mem:.2}x VPA's (<= 0.70: {}), memory risk {:.3}% vs VPA's {:.3}% ({}), CPU starvation {:.3}% vs KRR's {:.3}% ({})",
            set.name(),
            verdict(cpu <= 0.70),
            verdict(mem <= 0.70),
            100.0 * t.memory_risk(),
            100.0 * v.memory_risk(),
            verdict(t.memory_risk() <= v.memory_risk()),
            100.0 * t.starvation(),
            100.0 * k.starvation(),
            verdict(t.starvation() <= k.starvation()),
        );
    }
}

/// What training sees of a container in memory.
fn seen(c: &Container) -> Samples<'_> {
    Samples {
        cpu: &c.train.0,
        memory: &c.train.1,
        throttled: &c.train.2,
        requests: c.trace.requests,
        memory_interval: None,
    }
}

/// Tailor's recommendation for every container, in order: each set is one cluster, its
/// containers sized together under `policy` (`train_fleet`).
fn fleets<'a>(
    containers: &'a [Container],
    policy: &Policy,
    split: i64,
    samples: impl Fn(&'a Container) -> Samples<'a>,
) -> Vec<Sized> {
    let mut recs = vec![
        Sized {
            cpu: 0.0,
            memory: 0.0
        };
        containers.len()
    ];
    for set in SETS {
        let members: Vec<usize> = (0..containers.len())
            .filter(|i| containers[*i].set == set)
            .collect();
        let fleet: Vec<Samples<'a>> = members.iter().map(|i| samples(&containers[*i])).collect();
        for (i, rec) in members.iter().zip(train_fleet(policy, &fleet, split)) {
            recs[*i] = rec;
        }
    }
    recs
}

/// Tailor's overall figures on the tuning set over a grid of CPU starvation budgets,
/// percentile floors and burst headrooms, beside VPA's and KRR's: the trade-off curve the
/// default budget was chosen from.
fn sweep_tuning(containers: &[Container], split: i64, step: i64) {
    let mut baselines: BTreeMap<Algorithm, Score> = BTreeMap::new();
    for c in containers {
        for alg in [Algorithm::Vpa, Algorithm::Krr] {
            let rec = train(alg, seen(c), split);
            baselines
                .entry(alg)
                .or_default()
                .add(&score(rec, observed(c), step));
        }
    }
    let (vpa, krr) = (baselines[&Algorithm::Vpa], baselines[&Algorithm::Krr]);
    println!(
        "== tuning set sweep: VPA memory risk {:.3}%, KRR starvation {:.3}% ==",
        100.0 * vpa.memory_risk(),
        100.0 * krr.starvation()
    );
    println!(
        "{:>7} {:>6} {:>6} {:>9} {:>9} {:>9} {:>9}",
        "budget", "floor", "burst", "cpu/vpa", "mem/vpa", "mem risk", "starved"
    );
    for budget in [0.065, 0.07, 0.0725, 0.075] {
        for floor in [0.5, 0.6, 0.7] {
            for burst in [Some(2.0), Some(2.5), Some(3.0), None] {
                let defaults = Policy::default();
                let policy = Policy {
                    cpu_starvation_budget: budget,
                    cpu_percentiles: (
                        floor,
                        defaults.cpu_percentiles.1,
                        defaults.cpu_percentiles.2,
                    ),
                    cpu_burst: burst.and_then(|h| defaults.cpu_burst.map(|(p, _)| (p, h))),
                    ..defaults
                };
                let mut total = Score::default();
                let recs = fleets(containers, &policy, split, seen);
                for (c, rec) in containers.iter().zip(recs) {
                    total.add(&score(rec, observed(c), step));
                }
                println!(
                    "{budget:>7.3} {floor:>6.2} {:>6} {:>8.3}x {:>8.3}x {:>8.3}% {:>8.3}%{}",
                    burst.map_or("off".to_string(), |h| format!("{h}")),
                    total.waste_core_hours / vpa.waste_core_hours,
                    total.waste_gib_hours / vpa.waste_gib_hours,
                    100.0 * total.memory_risk(),
                    100.0 * total.starvation(),
                    if total.waste_core_hours <= 0.7 * vpa.waste_core_hours
                        && total.starvation() <= krr.starvation()
                    {
                        "  both CPU targets"
                    } else {
                        ""
                    }
                );
            }
        }
    }
}
