//! Right-sizing backtest, as a program: `cargo bench --bench backtest`.
//!
//! For every trace shape, containers are generated with 14 days of one-minute samples;
//! each recommender trains on days 1-7 and is scored on days 8-14 with the neutral scoring
//! of `rightsizing::backtest`: CPU waste, short minutes (demand above the request), severe
//! starvation (five-minute windows averaging above twice the request), throttle risk
//! (demand above the recommended CPU limit), memory waste, memory risk (working set above
//! the request) and OOM risk (above the limit), pooled and per container. Containers come
//! in sets from disjoint seeds: a tuning set (the one Tailor's defaults were chosen on) and
//! held-out sets never used for tuning; each set is one cluster, and all are reported.
//!
//! The baseline is the real VPA recommender (`scripts/vpa`, v1.8.1), run against a real
//! Prometheus holding the training days (backfilled with promtool, as cadvisor would have
//! written them) and Deployments on the real test control plane, one per container, with
//! VerticalPodAutoscalers in `Off` mode (`common/vpa.rs`); it is run at its default CPU
//! target percentile (p90) and at p95, p80 and p70, so Tailor's CPU waste can also be compared at
//! equal short minutes. Tailor reads the same days through its Prometheus usage source,
//! exactly as `tailor recommend` does. Rows: `tailor` (the default, Balanced profile),
//! `cost-1st` (the CostFirst profile), `alone` (the default with every container its own
//! policy: nothing pooled), `phase` (the default with `cpu.coverRunningPhase`), `vpa` (the real one), `vpa-sim` (an in-house reimplementation
//! of VPA's defaults) and `krr` (KRR's simple strategy). Ratios are to the real VPA.
//!
//! `--in-memory` (and the tuning aids `--sweep`) train on the raw samples in memory
//! instead, with ratios to `vpa-sim`; without `--bench` (as `cargo test --benches` would
//! run it) a small in-memory run.

#[path = "../tests/support/prometheus.rs"]
mod prometheus_server;
#[path = "common/vpa.rs"]
mod vpa;

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

/// A recommender in the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Row {
    /// Tailor's default policy (the Balanced profile), containers of a set sized together.
    Tailor,
    /// The CostFirst profile.
    CostFirst,
    /// The default policy with every container sized alone (nothing pooled).
    Alone,
    /// The default policy with the running-phase floor (`cpu.coverRunningPhase`): what
    /// covering a batch worker's runs costs.
    Phase,
    /// The real VPA recommender at its default CPU percentile.
    Vpa,
    /// The in-house reimplementation of VPA's defaults.
    VpaSim,
    /// KRR's simple strategy.
    Krr,
}

impl Row {
    fn name(self) -> &'static str {
        match self {
            Row::Tailor => "tailor",
            Row::CostFirst => "cost-1st",
            Row::Alone => "alone",
            Row::Phase => "phase",
            Row::Vpa => "vpa",
            Row::VpaSim => "vpa-sim",
            Row::Krr => "krr",
        }
    }
}

/// Per container (in order), per row: the score.
type Scores = Vec<BTreeMap<Row, Score>>;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let full = args.iter().any(|a| a == "--bench");
    // Tuning aids, for the tuning set only: `--starvation-budget B` trains Tailor with
    // another fleet budget, `--short-cap C` with another per-container short-minute cap,
    // `--severe-cap C` another severe cap, `--burst-headroom H|off` another burst guard
    // headroom (or none), `--half-life S` another sample half-life, `--running-phase`
    // with the running-phase floor; `--sweep` prints the
    // trade-off over a grid on the tuning set and stops.
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let mut policy = Policy::default();
    if let Some(v) = value("--starvation-budget") {
        policy.cpu_starvation_budget = v.parse().expect("a share");
    }
    if let Some(v) = value("--short-cap") {
        policy.cpu_short_cap = v.parse().expect("a share");
    }
    if let Some(v) = value("--severe-cap") {
        policy.cpu_severe_cap = v.parse().expect("a share");
    }
    if let Some(v) = value("--burst-headroom") {
        policy.cpu_burst = match v.as_str() {
            "off" => None,
            h => policy
                .cpu_burst
                .map(|(p, _)| (p, h.parse().expect("a headroom or off"))),
        };
    }
    if let Some(v) = value("--half-life") {
        policy.half_life = v.parse().expect("seconds");
    }
    if args.iter().any(|a| a == "--running-phase") {
        policy.cpu_running_phase = true;
    }
    let tuned = policy != Policy::default();
    let sweep = args.iter().any(|a| a == "--sweep");
    let in_memory_only = !full || sweep || args.iter().any(|a| a == "--in-memory");
    // The CPU step of the read through Prometheus (`tailor recommend --step`).
    let prometheus_step: i64 = value("--prometheus-step")
        .map(|v| v.parse().expect("--prometheus-step: seconds"))
        .unwrap_or(tailor::rightsizing::service::DEFAULT_STEP_SECONDS);
    let per_set: u64 = value("--per-set")
        .map(|v| v.parse().expect("--per-set: containers per shape and set"))
        .unwrap_or(if full { 10 } else { 1 });
    let (days, step) = if full { (14u32, 60i64) } else { (4, 300) };
    let train_days = days / 2;
    let start = 1_790_000_000i64;
    let split = start + i64::from(train_days) * 86_400;
    let sets: &[Set] = if sweep || tuned {
        &[Set::Tuning]
    } else {
        &SETS
    };
    let mut containers = Vec::new();
    for &set in sets {
        for shape in Shape::ALL {
            for i in 0..per_set {
                let trace = generate(shape, set.seed(shape, i), start, days, step);
                containers.push(split_trace(set, shape, i, trace, split));
            }
        }
    }
    if sweep {
        sweep_tuning(&containers, split, step);
        return;
    }
    let cost_first = Policy::from_spec(&tailor::apis::RightsizingPolicySpec {
        profile: tailor::apis::Profile::CostFirst,
        ..Default::default()
    })
    .expect("the cost-first profile");
    let mut recs: Vec<BTreeMap<Row, Sized>> = vec![BTreeMap::new(); containers.len()];
    put(
        &mut recs,
        Row::Tailor,
        fleets(&containers, &policy, split, seen),
    );
    put(
        &mut recs,
        Row::CostFirst,
        fleets(&containers, &cost_first, split, seen),
    );
    put(
        &mut recs,
        Row::Alone,
        alone(&containers, &policy, split, seen),
    );
    let phase = Policy {
        cpu_running_phase: true,
        ..policy.clone()
    };
    put(
        &mut recs,
        Row::Phase,
        fleets(&containers, &phase, split, seen),
    );
    for (c, r) in containers.iter().zip(&mut recs) {
        r.insert(Row::VpaSim, train(Algorithm::Vpa, seen(c), split));
        r.insert(Row::Krr, train(Algorithm::Krr, seen(c), split));
    }
    println!(
        "== backtest in memory (raw samples): {per_set} containers per shape and set, {days} days at {step}s, train days 1-{train_days}, score days {}-{days}; ratios to the in-house VPA reimplementation ==",
        train_days + 1
    );
    report(
        &containers,
        &scores(&containers, &recs, step),
        Row::VpaSim,
        &[],
    );
    if in_memory_only {
        return;
    }

    // The same, trained on what Prometheus returns, against the real VPA.
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
        // What KRR and the reimplemented VPA read: the usage rate alone, capped by a CPU
        // limit, at the same step and window.
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
    let read_secs = began.elapsed().as_secs_f64();
    // The real VPA, at its default CPU percentile (first), one higher and two lower.
    let percentiles = [0.9, 0.95, 0.8, 0.7];
    let began = std::time::Instant::now();
    let inputs: Vec<vpa::VpaInput> = containers.iter().map(vpa_input).collect();
    let real = runtime.block_on(vpa::recommend(&inputs, split, &percentiles));
    let vpa_secs = began.elapsed().as_secs_f64();
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
            limits: (c.trace.cpu_limit, None),
            memory_interval: Some(read.memory_interval),
        }
    };
    let mut recs: Vec<BTreeMap<Row, Sized>> = vec![BTreeMap::new(); containers.len()];
    put(
        &mut recs,
        Row::Tailor,
        fleets(&containers, &policy, split, read_back),
    );
    put(
        &mut recs,
        Row::CostFirst,
        fleets(&containers, &cost_first, split, read_back),
    );
    put(
        &mut recs,
        Row::Alone,
        alone(&containers, &policy, split, read_back),
    );
    put(
        &mut recs,
        Row::Phase,
        fleets(&containers, &phase, split, read_back),
    );
    for (k, (c, r)) in containers.iter().zip(&mut recs).enumerate() {
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
        r.insert(Row::VpaSim, train(Algorithm::Vpa, usage_rate, split));
        r.insert(Row::Krr, train(Algorithm::Krr, usage_rate, split));
        let target = real[0][k].target;
        r.insert(
            Row::Vpa,
            Sized::requests(target.0, target.1)
                .keeping_limit_ratio(c.trace.requests, (c.trace.cpu_limit, None)),
        );
    }
    // The real VPA's pooled CPU figures at each percentile, per set: (short minutes, waste).
    let mut curve: BTreeMap<Set, Vec<(f64, f64)>> = BTreeMap::new();
    for outputs in &real {
        let mut pooled: BTreeMap<Set, Score> = BTreeMap::new();
        for (c, o) in containers.iter().zip(outputs) {
            let rec = Sized::requests(o.target.0, o.target.1);
            pooled
                .entry(c.set)
                .or_default()
                .add(&score(rec, observed(c), step));
        }
        for (set, s) in pooled {
            curve
                .entry(set)
                .or_default()
                .push((s.short_minutes(), s.waste_core_hours));
        }
    }
    println!(
        "\n== backtest through Prometheus against the real VPA recommender (v1.8.1): the training days backfilled with promtool; Tailor reads them with its Prometheus usage source at a {prometheus_step}s step ({} queries, {read_secs:.1}s including backfill); the real VPA reads its own copy at a 1-minute resolution, run at CPU target percentiles {percentiles:?} ({vpa_secs:.0}s) ==",
        usage.queries,
    );
    let curves: Vec<(Set, Vec<(f64, f64)>)> = curve.into_iter().collect();
    report(
        &containers,
        &scores(&containers, &recs, step),
        Row::Vpa,
        &curves,
    );
}

fn put(recs: &mut [BTreeMap<Row, Sized>], row: Row, sized: Vec<Sized>) {
    for (r, s) in recs.iter_mut().zip(sized) {
        r.insert(row, s);
    }
}

fn scores(containers: &[Container], recs: &[BTreeMap<Row, Sized>], step: i64) -> Scores {
    containers
        .iter()
        .zip(recs)
        .map(|(c, r)| {
            r.iter()
                .map(|(row, rec)| (*row, score(*rec, observed(c), step)))
                .collect()
        })
        .collect()
}

/// What the real VPA is given of a container: its training days and deployment.
fn vpa_input(c: &Container) -> vpa::VpaInput<'_> {
    vpa::VpaInput {
        name: c.pod.clone(),
        cpu: &c.train.0,
        memory: &c.train.1,
        requests: c.trace.requests,
        cpu_limit: c.trace.cpu_limit,
    }
}

/// Splits a trace into training and scored samples.
fn split_trace(set: Set, shape: Shape, i: u64, trace: Trace, split: i64) -> Container {
    let mut train = (Vec::new(), Vec::new(), Vec::new());
    let mut test = (Vec::new(), Vec::new());
    for k in 0..trace.cpu.len() {
        if !trace.running[k] {
            continue;
        }
        let t = trace.time(k);
        if t < split {
            train.0.push((t, trace.cpu[k]));
            train.1.push((t, trace.memory[k]));
            if let Some(th) = trace.throttled.as_ref() {
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

fn pct(x: f64) -> String {
    format!("{:.2}%", 100.0 * x)
}

/// The baseline's CPU waste at `short` short minutes, interpolated on its curve of
/// (short minutes, waste) over CPU percentiles; `None` outside the curve.
fn waste_at(curve: &[(f64, f64)], short: f64) -> Option<f64> {
    let mut points = curve.to_vec();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    points.windows(2).find_map(|w| {
        let ((s0, w0), (s1, w1)) = (w[0], w[1]);
        (short >= s0 && short <= s1 && s1 > s0).then(|| w0 + (w1 - w0) * (short - s0) / (s1 - s0))
    })
}

/// Prints, per set, the table per shape and overall, the per-container safety check and
/// the targets, with ratios to `base`; `curves` are the real VPA's (short minutes, CPU
/// waste) over its CPU percentiles, per set, for the comparison at equal short minutes.
fn report(containers: &[Container], scores: &Scores, base: Row, curves: &[(Set, Vec<(f64, f64)>)]) {
    for set in SETS {
        let members: Vec<usize> = (0..containers.len())
            .filter(|i| containers[*i].set == set)
            .collect();
        if members.is_empty() {
            continue;
        }
        println!(
            "\n-- {} set ({} containers) --\n{:<18} {:<8} {:>9} {:>9} {:>7} {:>7} {:>7} {:>7} {:>7}  {:>6} {:>6}",
            set.name(),
            members.len(),
            "shape",
            "row",
            "cpu c-h",
            "mem GiB-h",
            "short",
            "severe",
            "thrott",
            "memrisk",
            "oom",
            "cpu/b",
            "mem/b"
        );
        let line = |label: &str, row: Row, s: &Score, b: &Score| {
            println!(
                "{:<18} {:<8} {:>9.1} {:>9.1} {:>7} {:>7} {:>7} {:>7} {:>7}  {:>6} {:>6}",
                label,
                row.name(),
                s.waste_core_hours,
                s.waste_gib_hours,
                pct(s.short_minutes()),
                pct(s.severe()),
                pct(s.throttle_risk()),
                pct(s.memory_risk()),
                pct(s.oom_risk()),
                ratio(s.waste_core_hours, b.waste_core_hours),
                ratio(s.waste_gib_hours, b.waste_gib_hours),
            );
        };
        let mut overall: BTreeMap<Row, Score> = BTreeMap::new();
        for shape in Shape::ALL {
            let mut by_row: BTreeMap<Row, Score> = BTreeMap::new();
            for &i in members.iter().filter(|i| containers[**i].shape == shape) {
                for (row, s) in &scores[i] {
                    by_row.entry(*row).or_default().add(s);
                    overall.entry(*row).or_default().add(s);
                }
            }
            let b = by_row.get(&base).copied().unwrap_or_default();
            for (row, s) in &by_row {
                line(shape.name(), *row, s, &b);
            }
        }
        let b = overall.get(&base).copied().unwrap_or_default();
        for (row, s) in &overall {
            line("overall", *row, s, &b);
        }
        // Every container on its own: short minutes at most max(baseline + 1 point, 5%),
        // severe starvation at most the baseline's.
        let mut unsafe_short = Vec::new();
        let mut unsafe_severe = 0usize;
        for &i in &members {
            let (Some(t), Some(v)) = (scores[i].get(&Row::Tailor), scores[i].get(&base)) else {
                continue;
            };
            if t.short_minutes() > (v.short_minutes() + 0.01).max(0.05) {
                unsafe_short.push((t.short_minutes() - v.short_minutes(), i));
            }
            unsafe_severe += usize::from(t.severe() > v.severe());
        }
        unsafe_short.sort_by(|a, b| b.0.total_cmp(&a.0));
        for (_, i) in unsafe_short.iter().take(5) {
            let (t, v) = (scores[*i][&Row::Tailor], scores[*i][&base]);
            println!(
                "  short on {}: {} against {}'s {} (severe {} against {})",
                containers[*i].pod,
                pct(t.short_minutes()),
                base.name(),
                pct(v.short_minutes()),
                pct(t.severe()),
                pct(v.severe())
            );
        }
        let t = overall[&Row::Tailor];
        let verdict = |ok: bool| if ok { "met" } else { "NOT MET" };
        let cpu = t.waste_core_hours / b.waste_core_hours.max(1e-12);
        let mem = t.waste_gib_hours / b.waste_gib_hours.max(1e-12);
        println!(
            "{} targets against {}: CPU waste {cpu:.2}x (<= 0.80: {}), memory waste {mem:.2}x (<= 0.75: {}), short minutes {} vs {} ({}), severe {} vs {} ({}), memory risk {} vs {} ({}), throttle risk {} vs {} (+0.1 point: {}), containers short above max(baseline + 1 point, 5%): {} of {} ({}), severe above the baseline's: {} ({})",
            set.name(),
            base.name(),
            verdict(cpu <= 0.80),
            verdict(mem <= 0.75),
            pct(t.short_minutes()),
            pct(b.short_minutes()),
            verdict(t.short_minutes() <= b.short_minutes()),
            pct(t.severe()),
            pct(b.severe()),
            verdict(t.severe() <= b.severe()),
            pct(t.memory_risk()),
            pct(b.memory_risk()),
            verdict(t.memory_risk() <= b.memory_risk()),
            pct(t.throttle_risk()),
            pct(b.throttle_risk()),
            verdict(t.throttle_risk() <= b.throttle_risk() + 0.001),
            unsafe_short.len(),
            members.len(),
            verdict(unsafe_short.is_empty()),
            unsafe_severe,
            verdict(unsafe_severe == 0),
        );
        if let Some((_, curve)) = curves.iter().find(|(s, _)| *s == set) {
            for row in [Row::Tailor, Row::Phase, Row::Alone] {
                let s = overall[&row];
                match waste_at(curve, s.short_minutes()) {
                    Some(w) => println!(
                        "{} {} at equal short minutes ({}): CPU waste {:.2}x the real VPA's{}",
                        set.name(),
                        row.name(),
                        pct(s.short_minutes()),
                        s.waste_core_hours / w,
                        if row == Row::Alone {
                            format!(" (<= 0.95: {})", verdict(s.waste_core_hours <= 0.95 * w))
                        } else {
                            String::new()
                        }
                    ),
                    None => println!(
                        "{} {} short {} is outside the real VPA's curve {:?}",
                        set.name(),
                        row.name(),
                        pct(s.short_minutes()),
                        curve
                            .iter()
                            .map(|(sh, w)| format!("{} @ {w:.0} c-h", pct(*sh)))
                            .collect::<Vec<_>>()
                    ),
                }
            }
        }
    }
}

/// What training sees of a container in memory.
fn seen(c: &Container) -> Samples<'_> {
    Samples {
        cpu: &c.train.0,
        memory: &c.train.1,
        throttled: &c.train.2,
        requests: c.trace.requests,
        limits: (c.trace.cpu_limit, None),
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
    let mut recs = vec![Sized::requests(0.0, 0.0); containers.len()];
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

/// Tailor's recommendation for every container sized on its own: a fleet of one, as with
/// one policy per workload.
fn alone<'a>(
    containers: &'a [Container],
    policy: &Policy,
    split: i64,
    samples: impl Fn(&'a Container) -> Samples<'a>,
) -> Vec<Sized> {
    containers
        .iter()
        .map(|c| train_fleet(policy, &[samples(c)], split)[0])
        .collect()
}

/// Tailor's overall figures on the tuning set over a grid of fleet budgets and
/// per-container short-minute and severe caps, beside the reimplemented VPA's and KRR's:
/// the trade-off the Balanced profile's defaults were chosen from.
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
    let vpa = baselines[&Algorithm::Vpa];
    println!(
        "== tuning set sweep: vpa-sim short {} severe {} memory risk {} ==",
        pct(vpa.short_minutes()),
        pct(vpa.severe()),
        pct(vpa.memory_risk()),
    );
    println!(
        "{:>7} {:>6} {:>7} {:>8} {:>8} {:>7} {:>7} {:>7}",
        "budget", "cap", "severe", "cpu/vpa", "mem/vpa", "short", "severe", "thrott"
    );
    for budget in [0.02, 0.03, 0.04] {
        for cap in [0.03, 0.04] {
            for severe in [0.005, 0.01, 0.02, 0.03] {
                let policy = Policy {
                    cpu_starvation_budget: budget,
                    cpu_short_cap: cap,
                    cpu_severe_cap: severe,
                    ..Policy::default()
                };
                let mut total = Score::default();
                let recs = fleets(containers, &policy, split, seen);
                for (c, rec) in containers.iter().zip(recs) {
                    total.add(&score(rec, observed(c), step));
                }
                println!(
                    "{budget:>7.3} {cap:>6.3} {severe:>7.4} {:>7.3}x {:>7.3}x {:>7} {:>7} {:>7}",
                    total.waste_core_hours / vpa.waste_core_hours,
                    total.waste_gib_hours / vpa.waste_gib_hours,
                    pct(total.short_minutes()),
                    pct(total.severe()),
                    pct(total.throttle_risk()),
                );
            }
        }
    }
}
