//! Synthetic container usage with realistic shapes: diurnal web traffic, batch bursts,
//! slow memory growth, JVM-like flat memory, spiky CPU, idle services and weekly cycles,
//! and the shapes that hurt right-sizers on real clusters: CronJobs (short runs, each with
//! its own peak), containers capped by their CPU limit (cadvisor's usage stops at the
//! limit; the CFS throttling counters show the demand), containers deployed with requests
//! below their real use, and cache-like memory that fills up and stays. Each with noise,
//! deterministic for a seed.

use std::f64::consts::PI;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const DAY: f64 = 86_400.0;
const MIB: f64 = 1_048_576.0;

/// The shape of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Shape {
    /// Web traffic: CPU follows the day, memory breathes with it.
    Diurnal,
    /// Batch: short heavy bursts a few times a day, idle otherwise.
    Batch,
    /// Memory grows slowly until a restart (leak-like); CPU steady.
    Leak,
    /// JVM-like: memory flat at the heap size, CPU moderate with GC spikes.
    Jvm,
    /// Spiky CPU: mostly low with frequent short spikes.
    Spiky,
    /// Idle: nearly nothing.
    Idle,
    /// Weekly cycle: busy weekdays, quiet weekends.
    Weekly,
    /// A CronJob: a run every few hours of 10-40 minutes, each run's memory peak set by
    /// its input (varying run to run); no pod, so no samples, between runs.
    CronJob,
    /// Diurnal demand capped by a CPU limit below its peak: usage stops at the limit and
    /// the throttled share of CFS periods rises.
    CpuLimited,
    /// Steady busy service deployed with requests well below its real use.
    UnderProvisioned,
    /// Cache-like: memory fills up over the first day to the cache size and stays; CPU low.
    Cache,
}

impl Shape {
    /// Every shape, in a stable order.
    pub const ALL: [Shape; 11] = [
        Shape::Diurnal,
        Shape::Batch,
        Shape::Leak,
        Shape::Jvm,
        Shape::Spiky,
        Shape::Idle,
        Shape::Weekly,
        Shape::CronJob,
        Shape::CpuLimited,
        Shape::UnderProvisioned,
        Shape::Cache,
    ];

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Diurnal => "diurnal",
            Shape::Batch => "batch",
            Shape::Leak => "leak",
            Shape::Jvm => "jvm",
            Shape::Spiky => "spiky",
            Shape::Idle => "idle",
            Shape::Weekly => "weekly",
            Shape::CronJob => "cronjob",
            Shape::CpuLimited => "cpu-limited",
            Shape::UnderProvisioned => "under-provisioned",
            Shape::Cache => "cache",
        }
    }
}

/// One container's usage: a sample every `step` seconds from `start`.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// The shape it was generated with.
    pub shape: Shape,
    /// Unix seconds of the first sample.
    pub start: i64,
    /// Seconds between samples.
    pub step: i64,
    /// CPU usage in cores, as cadvisor reports it (capped at the CPU limit, if any).
    pub cpu: Vec<f64>,
    /// CPU the container wanted, in cores: the usage, unless the limit capped it.
    pub demand: Vec<f64>,
    /// Memory working set in bytes.
    pub memory: Vec<f64>,
    /// Whether a pod ran at each sample (a CronJob has none between runs); samples where
    /// none ran are not usage.
    pub running: Vec<bool>,
    /// Share (0..1) of CFS periods throttled per sample, for a container with a CPU limit.
    pub throttled: Option<Vec<f64>>,
    /// The CPU limit in cores, if any.
    pub cpu_limit: Option<f64>,
    /// The requests deployed (cores, bytes): what the right-sizer starts from.
    pub requests: (f64, f64),
}

impl Trace {
    /// The unix second of sample `i`.
    pub fn time(&self, i: usize) -> i64 {
        self.start + i as i64 * self.step
    }

    /// Samples per day.
    pub fn per_day(&self) -> usize {
        (86_400 / self.step.max(1)) as usize
    }
}

fn gaussian(rng: &mut ChaCha8Rng) -> f64 {
    // Box-Muller.
    let u1: f64 = rng.random::<f64>().max(1e-12);
    let u2: f64 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (2.0 * PI * u2).cos()
}

/// Generates `days` of samples every `step` seconds for a container of `shape`, with its
/// scale drawn from the seed.
pub fn generate(shape: Shape, seed: u64, start: i64, days: u32, step: i64) -> Trace {
    match shape {
        Shape::CronJob | Shape::CpuLimited | Shape::UnderProvisioned | Shape::Cache => {
            return generate_widened(shape, seed, start, days, step);
        }
        _ => {}
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = (f64::from(days) * DAY / step as f64) as usize;
    let scale = 0.5 + rng.random::<f64>() * 1.5; // 0.5x..2x
    let phase = rng.random::<f64>() * DAY;
    let mut cpu = Vec::with_capacity(n);
    let mut memory = Vec::with_capacity(n);
    let base_mem = (200.0 + rng.random::<f64>() * 800.0) * MIB * scale;
    let mut leak = 0.0;
    let restart_every = (3.0 + rng.random::<f64>() * 4.0) * DAY;
    let mut burst_left = 0usize;
    let mut spike_left = 0usize;
    for i in 0..n {
        let t = start as f64 + i as f64 * step as f64;
        let day_angle = 2.0 * PI * ((t + phase) % DAY) / DAY;
        let noise = gaussian(&mut rng);
        let (c, m) = match shape {
            Shape::Diurnal => {
                let load = 0.55 + 0.45 * day_angle.sin();
                (
                    0.4 * scale * load * (1.0 + 0.1 * noise),
                    base_mem * (1.0 + 0.15 * load + 0.01 * noise),
                )
            }
            Shape::Batch => {
                if burst_left == 0 && rng.random::<f64>() < 3.0 * step as f64 / DAY {
                    burst_left = (1800 / step.max(1)) as usize; // 30-minute bursts
                }
                if burst_left > 0 {
                    burst_left -= 1;
                    (
                        1.5 * scale * (1.0 + 0.1 * noise),
                        base_mem * (1.6 + 0.05 * noise),
                    )
                } else {
                    (
                        0.02 * scale * (1.0 + 0.2 * noise.abs()),
                        base_mem * (0.5 + 0.01 * noise),
                    )
                }
            }
            Shape::Leak => {
                leak += step as f64 * 0.5 * base_mem / DAY; // +50% a day
                if (t - start as f64) % restart_every < step as f64 && i > 0 {
                    leak = 0.0;
                }
                (0.2 * scale * (1.0 + 0.1 * noise), base_mem + leak)
            }
            Shape::Jvm => {
                let gc = if rng.random::<f64>() < 0.02 { 2.5 } else { 1.0 };
                (
                    0.3 * scale * gc * (1.0 + 0.1 * noise),
                    base_mem * 1.5 * (1.0 + 0.002 * noise),
                )
            }
            Shape::Spiky => {
                if spike_left == 0 && rng.random::<f64>() < 0.01 {
                    spike_left = 1 + (rng.random::<f64>() * 5.0) as usize;
                }
                let c = if spike_left > 0 {
                    spike_left -= 1;
                    1.2 * scale
                } else {
                    0.1 * scale
                };
                (c * (1.0 + 0.15 * noise), base_mem * (1.0 + 0.03 * noise))
            }
            Shape::Idle => (
                0.005 * (1.0 + 0.3 * noise.abs()),
                40.0 * MIB * (1.0 + 0.01 * noise),
            ),
            Shape::CronJob | Shape::CpuLimited | Shape::UnderProvisioned | Shape::Cache => {
                unreachable!("generated by generate_widened")
            }
            Shape::Weekly => {
                let weekday = (((t + phase) / DAY) as i64).rem_euclid(7) < 5;
                let load = if weekday {
                    0.6 + 0.4 * day_angle.sin()
                } else {
                    0.15
                };
                (
                    0.5 * scale * load * (1.0 + 0.1 * noise),
                    base_mem * (1.0 + 0.3 * load + 0.01 * noise),
                )
            }
        };
        cpu.push(c.max(0.0));
        memory.push(m.max(MIB));
    }
    // Deployed requests from a separate stream, so the usage above stays what it was for
    // a seed: teams over-provision, by 1.5x to 4x of the mean.
    let mut deploy = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_dec1);
    let over = 1.5 + deploy.random::<f64>() * 2.5;
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let requests = (mean(&cpu) * over, mean(&memory) * over);
    Trace {
        shape,
        start,
        step,
        demand: cpu.clone(),
        running: vec![true; cpu.len()],
        cpu,
        memory,
        throttled: None,
        cpu_limit: None,
        requests,
    }
}

/// CFS periods a one-minute sample is split into when estimating throttling: the demand
/// varies within a minute, and a period is throttled when its demand exceeds the limit.
const SUB_PERIODS: usize = 20;

/// The shapes added for unseen clusters: CronJobs, CPU-limited, under-provisioned and
/// cache-like containers.
fn generate_widened(shape: Shape, seed: u64, start: i64, days: u32, step: i64) -> Trace {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = (f64::from(days) * DAY / step as f64) as usize;
    let scale = 0.5 + rng.random::<f64>() * 1.5;
    let phase = rng.random::<f64>() * DAY;
    let base_mem = (200.0 + rng.random::<f64>() * 800.0) * MIB * scale;
    let mut cpu = Vec::with_capacity(n);
    let mut demand = Vec::with_capacity(n);
    let mut memory = Vec::with_capacity(n);
    let mut running = Vec::with_capacity(n);
    let mut throttled = Vec::new();
    let mut cpu_limit = None;
    // CronJob: a schedule of every 2, 4, 6 or 12 hours, runs of 10-40 minutes.
    let every = [2.0, 4.0, 6.0, 12.0][(rng.random::<f64>() * 4.0) as usize % 4] * 3600.0;
    let run_minutes = 10.0 + rng.random::<f64>() * 30.0;
    let input_spread = 0.1 + rng.random::<f64>() * 0.2;
    let mut run_peak = base_mem;
    let mut run_index = -1i64;
    // CPU-limited: the limit sits between 55% and 85% of the daily peak demand.
    let peak_demand = 0.6 * scale;
    let limit = peak_demand * (0.55 + rng.random::<f64>() * 0.3);
    if shape == Shape::CpuLimited {
        cpu_limit = Some(limit);
    }
    let cache_size = base_mem * (1.5 + rng.random::<f64>());
    for i in 0..n {
        let t = start as f64 + i as f64 * step as f64;
        let day_angle = 2.0 * PI * ((t + phase) % DAY) / DAY;
        let noise = gaussian(&mut rng);
        let (want, m, up) = match shape {
            Shape::CronJob => {
                let since = (t + phase).rem_euclid(every);
                let run = ((t + phase) / every).floor() as i64;
                if run != run_index {
                    run_index = run;
                    // Each run's input, lognormal around the usual size.
                    run_peak = base_mem * (input_spread * gaussian(&mut rng)).exp();
                }
                let length = run_minutes * 60.0;
                if since < length {
                    let progress = since / length;
                    (
                        1.2 * scale * (1.0 + 0.15 * noise),
                        run_peak * (0.4 + 0.6 * progress) * (1.0 + 0.01 * noise),
                        true,
                    )
                } else {
                    (0.0, 0.0, false)
                }
            }
            Shape::CpuLimited => {
                let load = 0.55 + 0.45 * day_angle.sin();
                (
                    peak_demand * load * (1.0 + 0.1 * noise),
                    base_mem * (1.0 + 0.05 * load + 0.005 * noise),
                    true,
                )
            }
            Shape::UnderProvisioned => {
                let load = 0.75 + 0.25 * day_angle.sin();
                (
                    0.5 * scale * load * (1.0 + 0.12 * noise),
                    base_mem * (1.0 + 0.1 * load + 0.01 * noise),
                    true,
                )
            }
            Shape::Cache => {
                let age = (t - start as f64) / DAY;
                let filled = cache_size * (1.0 - (-3.0 * age).exp());
                (
                    0.03 * scale * (1.0 + 0.3 * noise.abs()),
                    (0.3 * base_mem + filled) * (1.0 + 0.003 * noise),
                    true,
                )
            }
            _ => unreachable!("generated by generate"),
        };
        let want = want.max(0.0);
        let used = match cpu_limit {
            Some(limit) if up => {
                // Within the minute the demand varies period to period; a period whose
                // demand is above the limit is throttled and runs at the limit.
                let mut sum = 0.0;
                let mut hit = 0usize;
                for _ in 0..SUB_PERIODS {
                    let v = want * (0.35 * gaussian(&mut rng)).exp() / (0.35f64 * 0.35 / 2.0).exp();
                    if v > limit {
                        hit += 1;
                    }
                    sum += v.min(limit);
                }
                throttled.push(hit as f64 / SUB_PERIODS as f64);
                sum / SUB_PERIODS as f64
            }
            Some(_) => {
                throttled.push(0.0);
                0.0
            }
            None => want,
        };
        cpu.push(if up { used } else { 0.0 });
        demand.push(if up { want } else { 0.0 });
        memory.push(if up { m.max(MIB) } else { 0.0 });
        running.push(up);
    }
    let mut deploy = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_dec1);
    let live: Vec<usize> = (0..n).filter(|i| running[*i]).collect();
    let mean = |v: &[f64]| live.iter().map(|i| v[*i]).sum::<f64>() / live.len().max(1) as f64;
    let requests = match shape {
        // Requests at 40-70% of the mean use.
        Shape::UnderProvisioned => {
            let under = 0.4 + deploy.random::<f64>() * 0.3;
            (mean(&demand) * under, mean(&memory) * 1.2)
        }
        Shape::CpuLimited => (limit * 0.5, mean(&memory) * 2.0),
        _ => {
            let over = 1.5 + deploy.random::<f64>() * 2.5;
            (mean(&demand) * over, mean(&memory) * over)
        }
    };
    Trace {
        shape,
        start,
        step,
        cpu,
        demand,
        memory,
        running,
        throttled: cpu_limit.map(|_| throttled),
        cpu_limit,
        requests,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_are_deterministic_for_a_seed() {
        let a = generate(Shape::Diurnal, 7, 0, 2, 60);
        let b = generate(Shape::Diurnal, 7, 0, 2, 60);
        assert_eq!(a, b);
        assert_eq!(a.cpu.len(), 2 * 1440);
        assert_ne!(a, generate(Shape::Diurnal, 8, 0, 2, 60));
    }

    #[test]
    fn shapes_look_like_their_names() {
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
        let idle = generate(Shape::Idle, 1, 0, 2, 60);
        assert!(mean(&idle.cpu) < 0.01);
        let batch = generate(Shape::Batch, 1, 0, 7, 60);
        assert!(max(&batch.cpu) > 10.0 * mean(&batch.cpu).max(0.01) / 3.0);
        let leak = generate(Shape::Leak, 1, 0, 2, 60);
        let day = leak.per_day();
        assert!(leak.memory[day - 1] > leak.memory[0] * 1.3, "memory grows");
        let jvm = generate(Shape::Jvm, 1, 0, 2, 60);
        assert!(max(&jvm.memory) / mean(&jvm.memory) < 1.02, "flat memory");
    }

    #[test]
    fn widened_shapes_look_like_their_names() {
        // A CronJob runs a small part of the time, and its runs peak differently.
        let job = generate(Shape::CronJob, 3, 0, 2, 60);
        let up = job.running.iter().filter(|r| **r).count();
        assert!(up > 0 && up < job.running.len() / 3, "{up}");
        assert!(
            job.running
                .iter()
                .zip(&job.memory)
                .all(|(r, m)| *r || *m == 0.0),
            "no usage without a pod"
        );
        // A CPU-limited container's usage stops at its limit while the demand does not,
        // and the throttled share shows it.
        let limited = generate(Shape::CpuLimited, 3, 0, 2, 60);
        let limit = limited.cpu_limit.expect("a limit");
        let throttled = limited.throttled.as_ref().expect("throttling counters");
        assert!(limited.cpu.iter().all(|c| *c <= limit + 1e-9));
        assert!(limited.demand.iter().copied().fold(0.0, f64::max) > limit * 1.1);
        assert!(throttled.iter().copied().fold(0.0, f64::max) > 0.5);
        // Under-provisioned: the deployed CPU request is below the usual use.
        let under = generate(Shape::UnderProvisioned, 3, 0, 2, 60);
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        assert!(under.requests.0 < 0.75 * mean(&under.demand));
        // Cache: memory fills and stays.
        let cache = generate(Shape::Cache, 3, 0, 3, 60);
        let day = cache.per_day();
        assert!(cache.memory[2 * day] > 2.0 * cache.memory[0]);
        assert!(cache.memory[3 * day - 1] / cache.memory[2 * day] < 1.05);
    }
}
