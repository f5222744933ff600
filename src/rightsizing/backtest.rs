//! Backtesting recommenders: train on the first days of a trace, score the recommendation
//! on the days after.
//!
//! Waste is what was requested but not used (core-hours, GiB-hours). Risk is, per
//! container-day, the samples where memory use exceeded the recommended memory (a would-be
//! OOM kill) and where CPU use exceeded twice the recommended CPU (starvation). Scoring is
//! pure; traces come from `sim::traces` or from any usage source.

use serde::Serialize;

use super::policy::Policy;
use super::recommender::{ContainerHistory, Context, Requests, recommend};

const GIB: f64 = (1u64 << 30) as f64;

/// A recommender under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Algorithm {
    /// Tailor with its default policy.
    Tailor,
    /// VPA's defaults: CPU p90 + 15%, memory p90 of daily peaks + 15%, 24h half-life.
    Vpa,
    /// KRR's simple strategy: CPU p95 of samples, memory maximum + 15%.
    Krr,
}

impl Algorithm {
    /// Every algorithm, in report order.
    pub const ALL: [Algorithm; 3] = [Algorithm::Tailor, Algorithm::Vpa, Algorithm::Krr];

    /// Display name.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Tailor => "tailor",
            Algorithm::Vpa => "vpa",
            Algorithm::Krr => "krr",
        }
    }
}

/// Samples of one container: (unix seconds, cores) and (unix seconds, bytes).
#[derive(Debug, Clone, Copy)]
pub struct Samples<'a> {
    /// CPU in cores.
    pub cpu: &'a [(i64, f64)],
    /// Memory in bytes.
    pub memory: &'a [(i64, f64)],
}

/// A recommendation: cores and bytes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sized {
    /// Cores.
    pub cpu: f64,
    /// Bytes.
    pub memory: f64,
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let rank = (p * (values.len() - 1) as f64).round() as usize;
    values[rank.min(values.len() - 1)]
}

/// VPA's defaults as a policy.
pub fn vpa_policy() -> Policy {
    Policy {
        cpu_percentiles: (0.9, 0.5, 0.95),
        memory_percentiles: (0.9, 0.5, 0.95),
        cpu_margin: 0.15,
        memory_margin: 0.15,
        half_life: 86_400,
        max_step: 0.0,
        min_change: 0.0,
        ..Policy::vpa_compatible()
    }
}

/// Trains `algorithm` on `train` and returns its recommendation at `now`.
pub fn train(algorithm: Algorithm, train: Samples<'_>, now: i64) -> Sized {
    match algorithm {
        Algorithm::Krr => {
            let mut cpu: Vec<f64> = train.cpu.iter().map(|s| s.1).collect();
            let max_mem = train.memory.iter().map(|s| s.1).fold(0.0, f64::max);
            Sized {
                cpu: percentile(&mut cpu, 0.95),
                memory: max_mem * 1.15,
            }
        }
        Algorithm::Vpa => train_policy(&vpa_policy(), train, now),
        Algorithm::Tailor => train_policy(&tailor_policy(), train, now),
    }
}

/// Tailor's default policy, without the stability rules (hysteresis, step) that only
/// matter between successive recommendations.
pub fn tailor_policy() -> Policy {
    Policy {
        max_step: 0.0,
        min_change: 0.0,
        ..Policy::default()
    }
}

/// Trains the recommender with `policy` and returns its recommendation at `now`.
pub fn train_policy(policy: &Policy, train: Samples<'_>, now: i64) -> Sized {
    let start = train.cpu.first().map_or(0, |s| s.0);
    let mut h = ContainerHistory::new(policy, start);
    for (t, v) in train.cpu {
        h.add_cpu(*t, *v);
    }
    for (t, v) in train.memory {
        h.add_memory(*t, *v);
    }
    let r = recommend(&h, Requests::default(), policy, &Context::default(), now);
    Sized {
        cpu: r.recommended.cpu.unwrap_or(0) as f64 / 1000.0,
        memory: r.recommended.memory.unwrap_or(0) as f64,
    }
}

/// Waste and risk of a recommendation over test samples.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Score {
    /// Requested but unused core-hours.
    pub waste_core_hours: f64,
    /// Requested but unused GiB-hours.
    pub waste_gib_hours: f64,
    /// Samples with memory above the recommendation.
    pub memory_risk_samples: u64,
    /// Samples with CPU above twice the recommendation.
    pub cpu_risk_samples: u64,
    /// Container-days scored.
    pub container_days: f64,
}

impl Score {
    /// Adds another score.
    pub fn add(&mut self, o: &Score) {
        self.waste_core_hours += o.waste_core_hours;
        self.waste_gib_hours += o.waste_gib_hours;
        self.memory_risk_samples += o.memory_risk_samples;
        self.cpu_risk_samples += o.cpu_risk_samples;
        self.container_days += o.container_days;
    }

    /// Would-be OOM samples per container-day.
    pub fn memory_risk_rate(&self) -> f64 {
        self.memory_risk_samples as f64 / self.container_days.max(1e-9)
    }

    /// Starvation samples per container-day.
    pub fn cpu_risk_rate(&self) -> f64 {
        self.cpu_risk_samples as f64 / self.container_days.max(1e-9)
    }
}

/// Scores a recommendation on test samples taken every `step` seconds.
pub fn score(rec: Sized, test: Samples<'_>, step: i64) -> Score {
    let hours = step as f64 / 3600.0;
    let mut s = Score {
        container_days: test.cpu.len() as f64 * step as f64 / 86_400.0,
        ..Score::default()
    };
    for (_, used) in test.cpu {
        s.waste_core_hours += (rec.cpu - used).max(0.0) * hours;
        if *used > 2.0 * rec.cpu {
            s.cpu_risk_samples += 1;
        }
    }
    for (_, used) in test.memory {
        s.waste_gib_hours += (rec.memory - used).max(0.0) / GIB * hours;
        if *used > rec.memory {
            s.memory_risk_samples += 1;
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    type Series = Vec<(i64, f64)>;

    fn flat(n: usize, cpu: f64, mem: f64) -> (Series, Series) {
        let c = (0..n).map(|i| (i as i64 * 60, cpu)).collect();
        let m = (0..n).map(|i| (i as i64 * 60, mem)).collect();
        (c, m)
    }

    #[test]
    fn waste_and_risk_are_counted_per_sample() {
        let (c, m) = flat(60, 1.0, GIB);
        let rec = Sized {
            cpu: 2.0,
            memory: 2.0 * GIB,
        };
        let s = score(
            rec,
            Samples {
                cpu: &c,
                memory: &m,
            },
            60,
        );
        assert!((s.waste_core_hours - 1.0).abs() < 1e-9);
        assert!((s.waste_gib_hours - 1.0).abs() < 1e-9);
        assert_eq!((s.cpu_risk_samples, s.memory_risk_samples), (0, 0));
        let tight = Sized {
            cpu: 0.4,
            memory: 0.5 * GIB,
        };
        let s = score(
            tight,
            Samples {
                cpu: &c,
                memory: &m,
            },
            60,
        );
        assert_eq!((s.cpu_risk_samples, s.memory_risk_samples), (60, 60));
        assert!((s.container_days - 1.0 / 24.0).abs() < 1e-9);
    }

    #[test]
    fn krr_takes_the_cpu_p95_and_memory_maximum_plus_15_percent() {
        let c: Vec<(i64, f64)> = (0..100)
            .map(|i| (i * 60, f64::from(i as i32 + 1) / 100.0))
            .collect();
        let m: Vec<(i64, f64)> = (0..100)
            .map(|i| (i * 60, GIB * (1.0 + i as f64 / 100.0)))
            .collect();
        let r = train(
            Algorithm::Krr,
            Samples {
                cpu: &c,
                memory: &m,
            },
            6000,
        );
        assert!((r.cpu - 0.95).abs() < 0.011, "{r:?}");
        assert!((r.memory - GIB * 1.99 * 1.15).abs() < 1.0);
    }

    #[test]
    fn vpa_on_flat_usage_recommends_usage_plus_its_margin() {
        let (c, m) = flat(3 * 1440, 1.0, GIB);
        let r = train(
            Algorithm::Vpa,
            Samples {
                cpu: &c,
                memory: &m,
            },
            3 * 86_400,
        );
        assert!(r.cpu >= 1.15 && r.cpu <= 1.15 * 1.05 + 0.001, "{r:?}");
        assert!(
            r.memory >= 1.15 * GIB && r.memory <= 1.15 * 1.05 * GIB + (1 << 20) as f64,
            "{r:?}"
        );
    }
}
