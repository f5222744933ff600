//! Synthetic container usage with realistic shapes: diurnal web traffic, batch bursts,
//! slow memory growth, JVM-like flat memory, spiky CPU, idle services and weekly cycles,
//! each with noise. Deterministic for a seed.

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
}

impl Shape {
    /// Every shape, in a stable order.
    pub const ALL: [Shape; 7] = [
        Shape::Diurnal,
        Shape::Batch,
        Shape::Leak,
        Shape::Jvm,
        Shape::Spiky,
        Shape::Idle,
        Shape::Weekly,
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
    /// CPU in cores.
    pub cpu: Vec<f64>,
    /// Memory working set in bytes.
    pub memory: Vec<f64>,
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
    Trace {
        shape,
        start,
        step,
        cpu,
        memory,
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
}
