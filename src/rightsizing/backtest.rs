//! Backtesting recommenders: train on the first days of a trace, score the recommendation
//! on the days after.
//!
//! The scoring is neutral: it uses no parameter of any recommender under test. Samples are
//! one minute apart; demand is the usage, except for a container capped by its CPU limit,
//! whose demand is what it wanted (the generator knows it; a recommender sees only the
//! capped usage and the throttling counters).
//! - CPU waste: `sum max(0, request - demand)` core-hours.
//! - CPU short minutes: the share of one-minute samples whose demand exceeds the request.
//! - Severe starvation: the share of five-minute windows whose mean demand exceeds twice
//!   the request.
//! - Throttle risk: the share of minutes whose demand exceeds the recommended CPU limit
//!   (none without a limit).
//! - Memory waste: `sum max(0, request - working set)` GiB-hours.
//! - Memory risk: the share of minutes whose working set exceeds the request (reclaim under
//!   pressure, or eviction); OOM risk: above the recommended memory limit (a kill).
//!
//! Every figure is kept per container and adds up over a fleet. The baselines (VPA's
//! defaults, KRR's simple strategy) are in [`super::baselines`] and share no code with
//! Tailor's recommender. Scoring is pure; traces come from `sim::traces` or from any usage
//! source.

use serde::Serialize;

use super::baselines::{Vpa, krr};
use super::policy::Policy;
use super::recommender::{ContainerHistory, Context, Requests, cpu_starvation_price, recommend};

const GIB: f64 = (1u64 << 30) as f64;
/// Severe starvation is counted per window of this many seconds.
pub const SEVERE_WINDOW: i64 = 300;
/// A window is severely starved when its mean demand exceeds the request this many times.
pub const SEVERE_FACTOR: f64 = 2.0;

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
    /// The limits deployed (cores, bytes), if any.
    pub limits: (Option<f64>, Option<f64>),
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

/// A recommendation: requests and limits, in cores and bytes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sized {
    /// CPU request, cores.
    pub cpu: f64,
    /// Memory request, bytes.
    pub memory: f64,
    /// CPU limit, cores (none: unlimited).
    pub cpu_limit: Option<f64>,
    /// Memory limit, bytes (none: unlimited).
    pub memory_limit: Option<f64>,
}

impl Sized {
    /// Requests only, no limits.
    pub fn requests(cpu: f64, memory: f64) -> Sized {
        Sized {
            cpu,
            memory,
            cpu_limit: None,
            memory_limit: None,
        }
    }

    /// The deployed limits scaled with the requests, as VPA's admission controller applies
    /// a recommendation (limits keep their ratio to the requests).
    pub fn keeping_limit_ratio(
        self,
        deployed: (f64, f64),
        limits: (Option<f64>, Option<f64>),
    ) -> Sized {
        let scale = |limit: Option<f64>, old: f64, new: f64| {
            limit.map(|l| if old > 0.0 { l * new / old } else { l })
        };
        Sized {
            cpu_limit: scale(limits.0, deployed.0, self.cpu),
            memory_limit: scale(limits.1, deployed.1, self.memory),
            ..self
        }
    }
}

/// Trains `algorithm` on `train` and returns its recommendation at `now`.
pub fn train(algorithm: Algorithm, train: Samples<'_>, now: i64) -> Sized {
    match algorithm {
        Algorithm::Krr => {
            let cpu: Vec<f64> = train.cpu.iter().map(|s| s.1).collect();
            let memory: Vec<f64> = train.memory.iter().map(|s| s.1).collect();
            let (cpu, memory) = krr(&cpu, &memory);
            // KRR's simple strategy sets no CPU limit and the memory limit at the request.
            Sized {
                cpu,
                memory,
                cpu_limit: None,
                memory_limit: Some(memory),
            }
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
            Sized::requests(cpu, memory).keeping_limit_ratio(train.requests, train.limits)
        }
        Algorithm::Tailor => train_policy(&Policy::default(), train, now),
    }
}

/// Trains Tailor's recommender with `policy`, starting from the deployed requests, and
/// returns the recommendation it reports at `now`.
pub fn train_policy(policy: &Policy, train: Samples<'_>, now: i64) -> Sized {
    let h = history_of(policy, train);
    recommend_from(&h, policy, train, &Context::default(), now)
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
        .map(|(h, s)| recommend_from(h, policy, *s, &context, now))
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

/// Tailor's recommendation at `now` from a history, starting from the deployed requests
/// and limits of `train`.
pub fn recommend_from(
    h: &ContainerHistory,
    policy: &Policy,
    train: Samples<'_>,
    context: &Context,
    now: i64,
) -> Sized {
    let (requests, limits) = (train.requests, train.limits);
    let current = Requests {
        cpu: Some((requests.0 * 1000.0).ceil() as i64),
        memory: Some(requests.1.ceil() as i64),
        cpu_limit: limits.0.map(|l| (l * 1000.0).ceil() as i64),
        memory_limit: limits.1.map(|l| l.ceil() as i64),
    };
    let r = recommend(h, current, policy, context, now);
    Sized {
        cpu: r.recommended.cpu.unwrap_or(0) as f64 / 1000.0,
        memory: r.recommended.memory.unwrap_or(0) as f64,
        cpu_limit: r.recommended.cpu_limit.map(|l| l as f64 / 1000.0),
        memory_limit: r.recommended.memory_limit.map(|l| l as f64),
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
    /// CPU samples (minutes) scored.
    pub cpu_samples: u64,
    /// CPU samples whose demand exceeded the request.
    pub cpu_short: u64,
    /// Five-minute windows scored.
    pub cpu_windows: u64,
    /// Five-minute windows whose mean demand exceeded twice the request.
    pub cpu_severe: u64,
    /// CPU samples whose demand exceeded the recommended CPU limit.
    pub cpu_throttled: u64,
    /// Memory samples (minutes) scored.
    pub memory_samples: u64,
    /// Memory samples whose working set exceeded the request.
    pub memory_over: u64,
    /// Memory samples whose working set exceeded the recommended memory limit.
    pub memory_oom: u64,
}

fn share(n: u64, of: u64) -> f64 {
    n as f64 / (of as f64).max(1.0)
}

impl Score {
    /// Adds another score.
    pub fn add(&mut self, o: &Score) {
        self.waste_core_hours += o.waste_core_hours;
        self.waste_gib_hours += o.waste_gib_hours;
        self.cpu_samples += o.cpu_samples;
        self.cpu_short += o.cpu_short;
        self.cpu_windows += o.cpu_windows;
        self.cpu_severe += o.cpu_severe;
        self.cpu_throttled += o.cpu_throttled;
        self.memory_samples += o.memory_samples;
        self.memory_over += o.memory_over;
        self.memory_oom += o.memory_oom;
    }

    /// Share of CPU minutes short of their demand (0..1).
    pub fn short_minutes(&self) -> f64 {
        share(self.cpu_short, self.cpu_samples)
    }

    /// Share of five-minute windows severely starved (0..1).
    pub fn severe(&self) -> f64 {
        share(self.cpu_severe, self.cpu_windows)
    }

    /// Share of CPU minutes whose demand is above the CPU limit (0..1).
    pub fn throttle_risk(&self) -> f64 {
        share(self.cpu_throttled, self.cpu_samples)
    }

    /// Share of memory minutes over the request (0..1).
    pub fn memory_risk(&self) -> f64 {
        share(self.memory_over, self.memory_samples)
    }

    /// Share of memory minutes over the limit (0..1).
    pub fn oom_risk(&self) -> f64 {
        share(self.memory_oom, self.memory_samples)
    }
}

/// Scores a recommendation on the observed samples, taken every `step` seconds.
pub fn score(rec: Sized, test: Observed<'_>, step: i64) -> Score {
    let hours = step as f64 / 3600.0;
    let mut s = Score::default();
    // The open five-minute window: its index, summed demand and samples.
    let mut window: Option<(i64, f64, u32)> = None;
    let close = |w: Option<(i64, f64, u32)>, s: &mut Score| {
        if let Some((_, sum, n)) = w {
            s.cpu_windows += 1;
            if sum / f64::from(n) > SEVERE_FACTOR * rec.cpu {
                s.cpu_severe += 1;
            }
        }
    };
    for (t, wanted) in test.demand {
        s.cpu_samples += 1;
        s.waste_core_hours += (rec.cpu - wanted).max(0.0) * hours;
        s.cpu_short += u64::from(*wanted > rec.cpu);
        s.cpu_throttled += u64::from(rec.cpu_limit.is_some_and(|l| *wanted > l));
        let w = t.div_euclid(SEVERE_WINDOW);
        match &mut window {
            Some((current, sum, n)) if *current == w => {
                *sum += wanted;
                *n += 1;
            }
            _ => {
                close(window, &mut s);
                window = Some((w, *wanted, 1));
            }
        }
    }
    close(window, &mut s);
    for (_, used) in test.memory {
        s.memory_samples += 1;
        s.waste_gib_hours += (rec.memory - used).max(0.0) / GIB * hours;
        s.memory_over += u64::from(*used > rec.memory);
        s.memory_oom += u64::from(rec.memory_limit.is_some_and(|l| *used > l));
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
    fn waste_short_minutes_severe_windows_throttling_and_memory_risk_are_counted() {
        let (c, m) = flat(60, 1.0, GIB);
        let observed = Observed {
            demand: &c,
            memory: &m,
        };
        let roomy = Sized {
            cpu_limit: Some(3.0),
            memory_limit: Some(4.0 * GIB),
            ..Sized::requests(2.0, 2.0 * GIB)
        };
        let s = score(roomy, observed, 60);
        assert!((s.waste_core_hours - 1.0).abs() < 1e-9);
        assert!((s.waste_gib_hours - 1.0).abs() < 1e-9);
        assert_eq!(
            (s.cpu_samples, s.cpu_short, s.cpu_windows, s.cpu_severe),
            (60, 0, 12, 0)
        );
        assert_eq!(
            (
                s.cpu_throttled,
                s.memory_samples,
                s.memory_over,
                s.memory_oom
            ),
            (0, 60, 0, 0)
        );
        // Any demand above the request is short, whatever the recommender's own guard; a
        // window is severe only above twice the request.
        let tight = Sized {
            cpu_limit: Some(0.995),
            memory_limit: Some(0.9 * GIB),
            ..Sized::requests(0.99, 0.5 * GIB)
        };
        let s = score(tight, observed, 60);
        assert_eq!(
            (s.short_minutes(), s.severe(), s.throttle_risk()),
            (1.0, 0.0, 1.0)
        );
        assert_eq!((s.memory_risk(), s.oom_risk()), (1.0, 1.0));
        let starved = score(Sized::requests(0.45, GIB), observed, 60);
        assert_eq!((starved.severe(), starved.throttle_risk()), (1.0, 0.0));
        // One five-minute window whose mean is above twice the request; one minute over
        // the memory request.
        let mut burst = c.clone();
        for s in &mut burst[10..15] {
            s.1 = 4.5;
        }
        let mut spike = m.clone();
        spike[7].1 = 3.0 * GIB;
        let s = score(
            roomy,
            Observed {
                demand: &burst,
                memory: &spike,
            },
            60,
        );
        assert_eq!((s.cpu_short, s.cpu_severe, s.cpu_throttled), (5, 1, 5));
        assert!((s.severe() - 1.0 / 12.0).abs() < 1e-12);
        assert_eq!((s.memory_over, s.memory_oom), (1, 0));
        assert!((s.memory_risk() - 1.0 / 60.0).abs() < 1e-12);
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
                limits: (Some(2.0), None),
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
        // VPA applies its target keeping the limit's ratio to the request.
        assert_eq!(vpa.cpu_limit, Some(2.0 * vpa.cpu));
        // Tailor estimates the demand behind heavy throttling.
        let plain = train(Algorithm::Tailor, seen(&c, &m, &[]), 3 * 86_400);
        let throttled = train(Algorithm::Tailor, seen(&c, &m, &shares), 3 * 86_400);
        assert!(throttled.cpu > 1.5 * plain.cpu, "{plain:?} {throttled:?}");
    }
}
