//! Backtesting recommenders: train on the first days of a trace, score the recommendation
//! on the days after.
//!
//! The scoring is neutral: it uses no parameter of any recommender under test.
//! - CPU waste: requested but not wanted core-hours, `(request - demand)+` per sample.
//! - CPU starvation: the share of one-minute samples whose demand exceeds the request.
//!   Demand is the usage, except for a container capped by its CPU limit, whose demand is
//!   what it wanted (the generator knows it; a recommender sees only the capped usage and
//!   the throttling counters).
//! - Memory waste: requested but unused GiB-hours.
//! - Memory risk: the share of five-minute windows whose highest working set exceeds the
//!   request (a would-be OOM kill, or reclaim under pressure).
//!
//! The baselines (VPA's defaults, KRR's simple strategy) are in [`super::baselines`] and
//! share no code with Tailor's recommender. Scoring is pure; traces come from
//! `sim::traces` or from any usage source.

use serde::Serialize;

use super::baselines::{Vpa, krr};
use super::policy::Policy;
use super::recommender::{ContainerHistory, Context, Requests, cpu_starvation_price, recommend};

const GIB: f64 = (1u64 << 30) as f64;
/// Memory risk is counted per window of this many seconds.
pub const MEMORY_RISK_WINDOW: i64 = 300;

/// A recommender under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Algorithm {
    /// Tailor with its default policy.
    Tailor,
    /// VPA's recommender with its defaults ([`Vpa`]).
    Vpa,
    /// KRR's simple strategy ([`krr`]).
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

/// What a recommender sees of one container: usage samples (unix seconds, value).
#[derive(Debug, Clone, Copy)]
pub struct Samples<'a> {
    /// CPU usage in cores, as cadvisor reports it.
    pub cpu: &'a [(i64, f64)],
    /// Memory working set in bytes.
    pub memory: &'a [(i64, f64)],
    /// Share of CFS periods throttled at each CPU sample's time, for containers with a CPU
    /// limit (empty otherwise).
    pub throttled: &'a [(i64, f64)],
    /// The requests deployed (cores, bytes).
    pub requests: (f64, f64),
    /// Seconds each memory sample covers when the samples are interval peaks (as read
    /// from Prometheus); `None` for raw samples.
    pub memory_interval: Option<i64>,
}

/// What is scored: the demand and memory of the days after training.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    /// CPU demand in cores.
    pub demand: &'a [(i64, f64)],
    /// Memory working set in bytes.
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

/// Trains `algorithm` on `train` and returns its recommendation at `now`.
pub fn train(algorithm: Algorithm, train: Samples<'_>, now: i64) -> Sized {
    match algorithm {
        Algorithm::Krr => {
            let cpu: Vec<f64> = train.cpu.iter().map(|s| s.1).collect();
            let memory: Vec<f64> = train.memory.iter().map(|s| s.1).collect();
            let (cpu, memory) = krr(&cpu, &memory);
            Sized { cpu, memory }
        }
        Algorithm::Vpa => {
            let mut vpa = Vpa::default();
            for (t, v) in train.cpu {
                vpa.add_cpu(*t, *v);
            }
            for (t, v) in train.memory {
                vpa.add_memory(*t, *v);
            }
            let (cpu, memory) = vpa.target();
            Sized { cpu, memory }
        }
        Algorithm::Tailor => train_policy(&Policy::default(), train, now),
    }
}

/// Trains Tailor's recommender with `policy`, starting from the deployed requests, and
/// returns the recommendation it reports at `now`.
pub fn train_policy(policy: &Policy, train: Samples<'_>, now: i64) -> Sized {
    let h = history_of(policy, train);
    recommend_from(&h, policy, train.requests, &Context::default(), now)
}

/// Trains Tailor's recommender with `policy` on a fleet of containers sized together (the
/// CPU starvation price solved over all of them, [`cpu_starvation_price`]) and returns
/// each one's recommendation at `now`, in order.
pub fn train_fleet(policy: &Policy, fleet: &[Samples<'_>], now: i64) -> Vec<Sized> {
    let histories: Vec<ContainerHistory> = fleet.iter().map(|s| history_of(policy, *s)).collect();
    let context = Context {
        cpu_starvation_price: cpu_starvation_price(&histories, policy),
        ..Context::default()
    };
    histories
        .iter()
        .zip(fleet)
        .map(|(h, s)| recommend_from(h, policy, s.requests, &context, now))
        .collect()
}

/// Tailor's history of a container, built from `train`.
pub fn history_of(policy: &Policy, train: Samples<'_>) -> ContainerHistory {
    let start = train.cpu.first().map_or(0, |s| s.0);
    let mut h = ContainerHistory::new(policy, start);
    let mut throttled = train.throttled.iter().peekable();
    for (t, v) in train.cpu {
        while throttled.next_if(|s| s.0 < *t).is_some() {}
        match throttled.next_if(|s| s.0 == *t) {
            Some((_, share)) => h.add_cpu_throttled(*t, *v, *share),
            None => h.add_cpu(*t, *v),
        }
    }
    if let Some(interval) = train.memory_interval {
        h.memory_sampled_every(interval);
    }
    for (t, v) in train.memory {
        h.add_memory(*t, *v);
    }
    h
}

/// Tailor's recommendation at `now` from a history, starting from the deployed requests.
pub fn recommend_from(
    h: &ContainerHistory,
    policy: &Policy,
    requests: (f64, f64),
    context: &Context,
    now: i64,
) -> Sized {
    let current = Requests {
        cpu: Some((requests.0 * 1000.0).ceil() as i64),
        memory: Some(requests.1.ceil() as i64),
        cpu_limit: None,
        memory_limit: None,
    };
    let r = recommend(h, current, policy, context, now);
    Sized {
        cpu: r.recommended.cpu.unwrap_or(0) as f64 / 1000.0,
        memory: r.recommended.memory.unwrap_or(0) as f64,
    }
}

/// Waste and risk of a recommendation over the scored days.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Score {
    /// Requested but not wanted core-hours.
    pub waste_core_hours: f64,
    /// Requested but unused GiB-hours.
    pub waste_gib_hours: f64,
    /// CPU samples scored.
    pub cpu_samples: u64,
    /// CPU samples whose demand exceeded the request.
    pub cpu_starved: u64,
    /// Memory windows scored.
    pub memory_windows: u64,
    /// Memory windows whose highest working set exceeded the request.
    pub memory_over: u64,
}

impl Score {
    /// Adds another score.
    pub fn add(&mut self, o: &Score) {
        self.waste_core_hours += o.waste_core_hours;
        self.waste_gib_hours += o.waste_gib_hours;
        self.cpu_samples += o.cpu_samples;
        self.cpu_starved += o.cpu_starved;
        self.memory_windows += o.memory_windows;
        self.memory_over += o.memory_over;
    }

    /// Share of CPU samples starved (0..1).
    pub fn starvation(&self) -> f64 {
        self.cpu_starved as f64 / (self.cpu_samples as f64).max(1.0)
    }

    /// Share of memory windows over the request (0..1).
    pub fn memory_risk(&self) -> f64 {
        self.memory_over as f64 / (self.memory_windows as f64).max(1.0)
    }
}

/// Scores a recommendation on the observed samples, taken every `step` seconds.
pub fn score(rec: Sized, test: Observed<'_>, step: i64) -> Score {
    let hours = step as f64 / 3600.0;
    let mut s = Score::default();
    for (_, wanted) in test.demand {
        s.cpu_samples += 1;
        s.waste_core_hours += (rec.cpu - wanted).max(0.0) * hours;
        if *wanted > rec.cpu {
            s.cpu_starved += 1;
        }
    }
    let mut window: Option<(i64, f64)> = None;
    let close = |w: Option<(i64, f64)>, s: &mut Score| {
        if let Some((_, peak)) = w {
            s.memory_windows += 1;
            if peak > rec.memory {
                s.memory_over += 1;
            }
        }
    };
    for (t, used) in test.memory {
        s.waste_gib_hours += (rec.memory - used).max(0.0) / GIB * hours;
        let w = t.div_euclid(MEMORY_RISK_WINDOW);
        match &mut window {
            Some((current, peak)) if *current == w => *peak = peak.max(*used),
            _ => {
                close(window, &mut s);
                window = Some((w, *used));
            }
        }
    }
    close(window, &mut s);
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
    fn waste_starved_samples_and_memory_windows_over_the_request_are_counted() {
        let (c, m) = flat(60, 1.0, GIB);
        let observed = Observed {
            demand: &c,
            memory: &m,
        };
        let roomy = Sized {
            cpu: 2.0,
            memory: 2.0 * GIB,
        };
        let s = score(roomy, observed, 60);
        assert!((s.waste_core_hours - 1.0).abs() < 1e-9);
        assert!((s.waste_gib_hours - 1.0).abs() < 1e-9);
        assert_eq!((s.cpu_samples, s.cpu_starved), (60, 0));
        assert_eq!((s.memory_windows, s.memory_over), (12, 0));
        // Any demand above the request starves, whatever the recommender's own guard.
        let tight = Sized {
            cpu: 0.99,
            memory: 0.5 * GIB,
        };
        let s = score(tight, observed, 60);
        assert_eq!(s.starvation(), 1.0);
        assert_eq!((s.memory_windows, s.memory_over), (12, 12));
        // One minute over the request in one five-minute window is one window at risk.
        let mut spike = m.clone();
        spike[7].1 = 3.0 * GIB;
        let s = score(
            roomy,
            Observed {
                demand: &c,
                memory: &spike,
            },
            60,
        );
        assert_eq!(s.memory_over, 1);
        assert!((s.memory_risk() - 1.0 / 12.0).abs() < 1e-12);
    }

    #[test]
    fn the_baselines_are_trained_on_usage_only() {
        let (c, m) = flat(3 * 1440, 1.0, GIB);
        let shares: Series = c.iter().map(|(t, _)| (*t, 0.9)).collect();
        fn seen<'a>(c: &'a Series, m: &'a Series, throttled: &'a [(i64, f64)]) -> Samples<'a> {
            Samples {
                cpu: c,
                memory: m,
                throttled,
                requests: (1.0, GIB),
                memory_interval: None,
            }
        }
        // VPA and KRR read cadvisor's usage: throttling does not move them.
        for alg in [Algorithm::Vpa, Algorithm::Krr] {
            assert_eq!(
                train(alg, seen(&c, &m, &[]), 3 * 86_400),
                train(alg, seen(&c, &m, &shares), 3 * 86_400)
            );
        }
        let vpa = train(Algorithm::Vpa, seen(&c, &m, &[]), 3 * 86_400);
        assert!(vpa.cpu > 1.15 && vpa.cpu < 1.15 * 1.05, "{vpa:?}");
        // Tailor estimates the demand behind heavy throttling.
        let plain = train(Algorithm::Tailor, seen(&c, &m, &[]), 3 * 86_400);
        let throttled = train(Algorithm::Tailor, seen(&c, &m, &shares), 3 * 86_400);
        assert!(throttled.cpu > 1.5 * plain.cpu, "{plain:?} {throttled:?}");
    }
}
