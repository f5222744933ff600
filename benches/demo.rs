//! The demo over many seeds, as a program: `cargo bench --bench demo`.
//!
//! For every seed the mid-size scenario runs recommend-only, consolidation-only (what users
//! run today: greedy packing and Karpenter's consolidation, requests as deployed) and
//! autonomous. Prints each seed's figures, then the minimum, median and maximum of every
//! figure per seed set beside its target: the tuning seeds (1-20) and held-out seeds
//! (101-110) that no setting was tuned on.
//!
//! Flags: `--seeds 1-20,101-110` (ranges and single seeds; each comma-separated group is a
//! set), `--days 7`, `--threads 2`, and `--set key=value` (repeated) to try other
//! autonomous settings: horizon, headroom, lead, per-eviction, fraction, budget,
//! consolidate-after, rightsizing-every, scale-down, memory-margin, cpu-margin, max-step, min-change,
//! minimum-history (a duration such as 12h),
//! limits (keep or ratio); `--autonomous-only` skips the other two
//! runs while tuning; `--by-day` prints each seed's cost day by day (every run, and
//! autonomous against consolidation-only) and the autonomous run's launches by day, and
//! per seed set the minimum, median and
//! maximum of that ratio on the first day, before right-sizing has a day of history, and
//! on the days after, and of the first day's share of the autonomous cost. Without
//! `--bench` (as `cargo test --all-targets` runs it) a smoke run: one seed, one day.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use tailor::catalog::{Catalog, CatalogOptions};
use tailor::model::InstanceType;
use tailor::provisioning::Mode;
use tailor::sim::scenario::Scenario;
use tailor::sim::world::{self, RunSettings, RunSummary};

/// One seed's three runs.
struct Outcome {
    seed: u64,
    recommend_only: RunSummary,
    consolidation_only: RunSummary,
    autonomous: RunSummary,
    /// The autonomous run's workloads that had OOM kills: name and kills.
    oom_workloads: Vec<(String, u64)>,
    /// USD spent each day (from the hourly samples) by recommend-only, consolidation-only
    /// and autonomous, in that order.
    by_day: Vec<[f64; 3]>,
    /// Nodes the autonomous run launched each day.
    launches_by_day: Vec<u64>,
}

/// The autonomous run's cost against consolidation-only's over `days` (indices).
fn day_ratio(o: &Outcome, days: std::ops::Range<usize>) -> f64 {
    let of = |r: usize| -> f64 {
        o.by_day
            .get(days.clone())
            .unwrap_or(&[])
            .iter()
            .map(|d| d[r])
            .sum()
    };
    of(2) / of(1)
}

/// `--by-day`'s figures per seed set.
const BY_DAY: &[(&str, Read)] = &[
    ("day 1: cost / consolidation-only", |o| day_ratio(o, 0..1)),
    ("days 2-: cost / consolidation-only", |o| {
        day_ratio(o, 1..o.by_day.len())
    }),
    ("day 1's share of the autonomous cost", |o| {
        let total: f64 = o.by_day.iter().map(|d| d[2]).sum();
        o.by_day.first().map_or(0.0, |d| d[2]) / total
    }),
];

/// USD spent each day of a run: its hourly samples summed 24 at a time.
fn cost_by_day(samples: &[world::Sample]) -> Vec<f64> {
    samples
        .chunks(24)
        .map(|day| day.iter().map(|s| s.hourly_cost).sum())
        .collect()
}

/// Nodes launched each day of a run: the growth of its count, 24 samples at a time
/// (launches before the first sample count to the first day, and the run's last sample,
/// taken at its end, holds all of them).
fn launches_by_day(samples: &[world::Sample]) -> Vec<u64> {
    let mut before = 0;
    samples
        .chunks(24)
        .map(|day| {
            let end = day.last().map_or(before, |s| s.launches);
            let n = end.saturating_sub(before);
            before = end;
            n
        })
        .collect()
}

/// A figure of the autonomous run, how to read it from an outcome, and its target (the
/// figure must be at most this).
struct Figure {
    name: &'static str,
    value: fn(&Outcome) -> f64,
    target: f64,
}

const FIGURES: &[Figure] = &[
    Figure {
        name: "evictions",
        value: |o| o.autonomous.pods_evicted as f64,
        target: 350.0,
    },
    Figure {
        name: "OOM kills",
        value: |o| o.autonomous.oom_kills as f64,
        target: 4.0,
    },
    Figure {
        name: "pending pod-hours",
        value: |o| o.autonomous.pending_pod_hours,
        target: 3.0,
    },
    Figure {
        name: "node launches",
        value: |o| o.autonomous.launches as f64,
        target: 60.0,
    },
    Figure {
        name: "cost / recommend-only",
        value: |o| o.autonomous.total_cost / o.recommend_only.total_cost,
        target: 0.45,
    },
    Figure {
        name: "cost / consolidation-only",
        value: |o| o.autonomous.total_cost / o.consolidation_only.total_cost,
        target: 0.6,
    },
];

/// How to read a figure from an outcome.
type Read = fn(&Outcome) -> f64;

/// Figures of the other runs, shown for context (no target).
const CONTEXT: &[(&str, Read)] = &[
    ("recommend-only OOM kills", |o| {
        o.recommend_only.oom_kills as f64
    }),
    ("recommend-only pending pod-hours", |o| {
        o.recommend_only.pending_pod_hours
    }),
    ("recommend-only launches", |o| {
        o.recommend_only.launches as f64
    }),
    ("consolidation-only evictions", |o| {
        o.consolidation_only.pods_evicted as f64
    }),
    ("consolidation-only OOM kills", |o| {
        o.consolidation_only.oom_kills as f64
    }),
    ("consolidation-only pending pod-hours", |o| {
        o.consolidation_only.pending_pod_hours
    }),
    ("consolidation-only launches", |o| {
        o.consolidation_only.launches as f64
    }),
    ("consolidation-only cost / recommend-only", |o| {
        o.consolidation_only.total_cost / o.recommend_only.total_cost
    }),
];

fn parse_sets(arg: &str) -> Vec<Vec<u64>> {
    arg.split(',')
        .map(|group| match group.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u64, u64) = (
                    a.parse().expect("--seeds: a number before '-'"),
                    b.parse().expect("--seeds: a number after '-'"),
                );
                (a..=b).collect()
            }
            None => vec![group.parse().expect("--seeds: a seed")],
        })
        .collect()
}

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// The autonomous settings with `--set key=value` overrides applied (for tuning; the
/// defaults are the demo's).
fn autonomous(overrides: &[(String, String)]) -> RunSettings {
    let mut s = RunSettings::for_mode(Mode::Autonomous);
    for (key, value) in overrides {
        let number = || -> f64 { value.parse().expect("--set: a number") };
        match key.as_str() {
            "horizon" => s.forecast_horizon = number() as i64,
            "headroom" => s.disruption.headroom = number(),
            "lead" => s.headroom_lead = number() as i64,
            "per-eviction" => s.disruption.min_savings_per_eviction = number(),
            "fraction" => s.disruption.min_savings_fraction = number(),
            "scale-down" => s.disruption.wait_for_scale_down = number(),
            "budget" => s.budget_percent = number() as u32,
            "consolidate-after" => s.consolidate_after = number() as i64,
            "rightsizing-every" => s.rightsizing_every = number() as i64,
            "memory-margin" => s.policy.memory.safety_margin_fraction = number(),
            "cpu-margin" => s.policy.cpu.safety_margin_fraction = number(),
            "max-step" => s.policy.update.max_step_fraction = number(),
            "min-change" => s.policy.update.min_change_fraction = number(),
            "minimum-history" => s.policy.minimum_history = value.clone(),
            "limits" => {
                s.policy.limits = match value.as_str() {
                    "keep" => tailor::apis::LimitsPolicy::Keep,
                    "ratio" => tailor::apis::LimitsPolicy::KeepRatio,
                    other => panic!("--set limits: keep or ratio, not {other}"),
                }
            }
            other => panic!("--set: unknown setting {other}"),
        }
    }
    s
}

fn run_seed(
    seed: u64,
    days: u32,
    types: &[InstanceType],
    overrides: &[(String, String)],
    autonomous_only: bool,
) -> Outcome {
    let scenario = Scenario::mid_size(seed, days);
    let mut summaries = Vec::new();
    let mut days_of = Vec::new();
    let mut oom_workloads = Vec::new();
    let mut launches = Vec::new();
    let runs = if autonomous_only {
        // Tuning: the other two runs do not depend on the autonomous settings; their
        // figures (and the cost ratios) read as zero.
        summaries.push(RunSummary::default());
        summaries.push(RunSummary::default());
        days_of.push(Vec::new());
        days_of.push(Vec::new());
        vec![autonomous(overrides)]
    } else {
        vec![
            RunSettings::for_mode(Mode::RecommendOnly),
            RunSettings::consolidation_only(),
            autonomous(overrides),
        ]
    };
    for settings in runs {
        let run = world::run(&scenario, &settings, types.to_vec(), None, &mut |_| {});
        oom_workloads = run
            .workloads
            .iter()
            .filter(|w| w.oom_kills > 0)
            .map(|w| (w.workload.clone(), w.oom_kills))
            .collect();
        days_of.push(cost_by_day(&run.samples));
        // The last run is the autonomous one.
        launches = launches_by_day(&run.samples);
        summaries.push(run.summary);
    }
    let day_count = days_of.iter().map(Vec::len).max().unwrap_or(0);
    let by_day = (0..day_count)
        .map(|d| std::array::from_fn(|r| days_of[r].get(d).copied().unwrap_or(0.0)))
        .collect();
    let autonomous = summaries.pop().expect("three runs");
    let consolidation_only = summaries.pop().expect("three runs");
    let recommend_only = summaries.pop().expect("three runs");
    Outcome {
        seed,
        recommend_only,
        consolidation_only,
        autonomous,
        oom_workloads,
        by_day,
        launches_by_day: launches,
    }
}

fn min_median_max(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    (v[0], median, v[n - 1])
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let full = args.iter().any(|a| a == "--bench");
    let sets =
        parse_sets(flag(&args, "--seeds").unwrap_or(if full { "1-20,101-110" } else { "7" }));
    let days: u32 = flag(&args, "--days")
        .map(|d| d.parse().expect("--days: a number"))
        .unwrap_or(if full { 7 } else { 1 });
    let threads: usize = flag(&args, "--threads")
        .map(|d| d.parse().expect("--threads: a number"))
        .unwrap_or(2);
    let autonomous_only = args.iter().any(|a| a == "--autonomous-only");
    let show_days = args.iter().any(|a| a == "--by-day");
    let overrides: Vec<(String, String)> = args
        .iter()
        .enumerate()
        .filter(|(_, a)| *a == "--set")
        .filter_map(|(i, _)| args.get(i + 1)?.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let types = Catalog::builtin()
        .expect("the built-in catalog")
        .instance_types(&CatalogOptions::for_region("eastus"))
        .expect("instance types");
    let seeds: Vec<u64> = sets.iter().flatten().copied().collect();
    let next = AtomicUsize::new(0);
    let outcomes = Mutex::new(Vec::new());
    println!(
        "{:>5} {:>9} {:>9} {:>9} {:>6} {:>6} {:>6} {:>5} {:>7} {:>6} | {:>6} {:>6}",
        "seed",
        "RO $",
        "CO $",
        "AU $",
        "AU/RO",
        "AU/CO",
        "evict",
        "OOM",
        "pend-h",
        "launch",
        "CO-ev",
        "CO-lau"
    );
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(&seed) = seeds.get(i) else { break };
                    let o = run_seed(seed, days, &types, &overrides, autonomous_only);
                    println!(
                        "{:>5} {:>9.0} {:>9.0} {:>9.0} {:>6.3} {:>6.3} {:>6} {:>5} {:>7.2} {:>6} | {:>6} {:>6}",
                        o.seed,
                        o.recommend_only.total_cost,
                        o.consolidation_only.total_cost,
                        o.autonomous.total_cost,
                        o.autonomous.total_cost / o.recommend_only.total_cost,
                        o.autonomous.total_cost / o.consolidation_only.total_cost,
                        o.autonomous.pods_evicted,
                        o.autonomous.oom_kills,
                        o.autonomous.pending_pod_hours,
                        o.autonomous.launches,
                        o.consolidation_only.pods_evicted,
                        o.consolidation_only.launches,
                    );
                    let causes: Vec<String> = o
                        .autonomous
                        .pending_pod_hours_by_cause
                        .iter()
                        .map(|(cause, hours)| format!("{cause} {hours:.2}"))
                        .collect();
                    println!("      seed {} pending pod-hours by cause: {}", o.seed, causes.join(", "));
                    println!(
                        "      seed {} claims by origin: {:?}; decisions by method: {:?}; evictions by cause: {:?}",
                        o.seed,
                        o.autonomous.claims_by_origin,
                        o.autonomous.decisions_by_method,
                        o.autonomous.evictions_by_cause
                    );
                    if show_days {
                        let days: Vec<String> = o
                            .by_day
                            .iter()
                            .enumerate()
                            .map(|(d, [ro, co, au])| {
                                format!("day {} {ro:.0}/{co:.0}/{au:.0} ({:.3})", d + 1, au / co)
                            })
                            .collect();
                        println!(
                            "      seed {} USD by day, recommend-only/consolidation-only/autonomous (autonomous/consolidation-only): {}",
                            o.seed,
                            days.join(", ")
                        );
                        println!(
                            "      seed {} autonomous launches by day: {:?}",
                            o.seed, o.launches_by_day
                        );
                    }
                    if !o.oom_workloads.is_empty() {
                        println!("      seed {} OOM kills by workload: {:?}", o.seed, o.oom_workloads);
                    }
                    outcomes.lock().expect("not poisoned").push(o);
                }
            });
        }
    });
    let outcomes = outcomes.into_inner().expect("not poisoned");
    for set in &sets {
        let of_set: Vec<&Outcome> = outcomes.iter().filter(|o| set.contains(&o.seed)).collect();
        if of_set.is_empty() {
            continue;
        }
        println!(
            "\nseeds {}-{} ({} seeds, {days} days): autonomous, min / median / max",
            set[0],
            set[set.len() - 1],
            of_set.len()
        );
        for f in FIGURES {
            let (lo, mid, hi) = min_median_max(of_set.iter().map(|o| (f.value)(o)).collect());
            let missed = of_set.iter().filter(|o| (f.value)(o) > f.target).count();
            println!(
                "  {:<28} {:>9.3} {:>9.3} {:>9.3}   target <= {:<6} {}",
                f.name,
                lo,
                mid,
                hi,
                f.target,
                if missed == 0 {
                    "met on every seed".to_string()
                } else {
                    format!("MISSED on {missed} seed(s)")
                }
            );
        }
        // With --by-day, the first day against the rest: right-sizing waits for a day of
        // history, so the first day shows what consolidation and buying ahead do alone.
        let by_day: &[(&str, Read)] = if show_days && !autonomous_only {
            BY_DAY
        } else {
            &[]
        };
        for (name, value) in CONTEXT.iter().chain(by_day) {
            let (lo, mid, hi) = min_median_max(of_set.iter().map(|o| value(o)).collect());
            println!("  {name:<40} {lo:>9.3} {mid:>9.3} {hi:>9.3}");
        }
    }
}
