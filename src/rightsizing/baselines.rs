//! The recommenders Tailor is measured against, written independently of Tailor's: they
//! share no code with `recommender` or `histogram`, so a defect there cannot flatter
//! Tailor in the backtest.
//!
//! [`Vpa`] follows the Kubernetes VPA recommender's defaults as its source states them
//! (`pkg/recommender/logic`, `pkg/recommender/model`, `pkg/recommender/util`):
//! - histograms with exponential buckets, the first 0.01 cores (CPU) or 1e7 bytes (memory)
//!   wide, each 5% wider than the one before, up to 1,000 cores or 1e12 bytes; a bucket
//!   `b` starts at `first * (1.05^b - 1) / 0.05`, and a percentile answers with the end
//!   of the bucket it falls in;
//! - every sample weighs `2^((t - reference) / half-life)` more than one at the reference
//!   time, with a 24 h half-life for both resources;
//! - CPU: every usage sample is added with the same weight (`minSampleWeight`, 0.1);
//! - memory: one sample per 24 h aggregation interval, the interval's peak, stamped with
//!   the interval's end; a higher sample in the same interval replaces the old peak
//!   (subtracted, then added);
//! - target: the 90th percentile plus a 15% safety margin for both, and at least 25
//!   millicores and 250 MiB per pod.
//!
//! [`krr`] is Robusta KRR's "simple" strategy: the 95th percentile of CPU samples and the
//! highest memory sample plus 15%.

/// Bucket layout of a VPA histogram.
#[derive(Debug, Clone, Copy)]
struct Layout {
    first: f64,
    ratio: f64,
    count: usize,
}

impl Layout {
    fn new(max: f64, first: f64, ratio: f64) -> Layout {
        // Enough buckets that the last one starts at or beyond `max`.
        let count = ((max * (ratio - 1.0) / first + 1.0).ln() / ratio.ln()).ceil() as usize + 1;
        Layout {
            first,
            ratio,
            count,
        }
    }

    fn bucket(&self, value: f64) -> usize {
        if value < self.first {
            return 0;
        }
        let b = ((value * (self.ratio - 1.0) / self.first + 1.0).ln() / self.ratio.ln()).floor();
        (b as usize).min(self.count - 1)
    }

    fn start(&self, bucket: usize) -> f64 {
        if bucket == 0 {
            return 0.0;
        }
        self.first * (self.ratio.powi(bucket as i32) - 1.0) / (self.ratio - 1.0)
    }
}

/// A VPA-style decaying histogram.
#[derive(Debug, Clone)]
struct Histogram {
    layout: Layout,
    half_life: f64,
    reference: i64,
    weights: Vec<f64>,
    total: f64,
}

impl Histogram {
    fn new(layout: Layout, half_life: f64) -> Histogram {
        Histogram {
            layout,
            half_life,
            reference: 0,
            weights: vec![0.0; layout.count],
            total: 0.0,
        }
    }

    fn factor(&mut self, t: i64) -> f64 {
        if self.total == 0.0 && self.weights.iter().all(|w| *w == 0.0) {
            self.reference = t;
        }
        // Keep the factors finite: move the reference forward and rescale, as VPA does
        // when the exponent grows large.
        let exponent = (t - self.reference) as f64 / self.half_life;
        if exponent > 60.0 {
            let shift = (exponent - 1.0).floor();
            let scale = (-shift).exp2();
            for w in &mut self.weights {
                *w *= scale;
            }
            self.total *= scale;
            self.reference += (shift * self.half_life) as i64;
        }
        ((t - self.reference) as f64 / self.half_life).exp2()
    }

    fn add(&mut self, value: f64, weight: f64, t: i64) {
        let w = weight * self.factor(t);
        let b = self.layout.bucket(value);
        self.weights[b] += w;
        self.total += w;
    }

    fn subtract(&mut self, value: f64, weight: f64, t: i64) {
        let w = weight * self.factor(t);
        let b = self.layout.bucket(value);
        let taken = w.min(self.weights[b]);
        self.weights[b] -= taken;
        self.total -= taken;
    }

    fn percentile(&self, p: f64) -> f64 {
        if self.total <= 0.0 {
            return 0.0;
        }
        let threshold = p * self.total;
        let mut sum = 0.0;
        let mut bucket = 0;
        while bucket < self.layout.count - 1 {
            sum += self.weights[bucket];
            if sum >= threshold {
                break;
            }
            bucket += 1;
        }
        if bucket < self.layout.count - 1 {
            self.layout.start(bucket + 1)
        } else {
            self.layout.start(bucket)
        }
    }
}

const VPA_HALF_LIFE: f64 = 86_400.0;
const VPA_INTERVAL: i64 = 86_400;
const VPA_CPU_WEIGHT: f64 = 0.1;
const VPA_PERCENTILE: f64 = 0.9;
const VPA_MARGIN: f64 = 0.15;
const VPA_MIN_CPU: f64 = 0.025;
const VPA_MIN_MEMORY: f64 = 250.0 * 1_048_576.0;

/// VPA's recommender for one single-container pod, with its default settings.
#[derive(Debug, Clone)]
pub struct Vpa {
    cpu: Histogram,
    memory: Histogram,
    last_cpu: Option<i64>,
    window_end: Option<i64>,
    peak: f64,
}

impl Default for Vpa {
    fn default() -> Self {
        Vpa {
            cpu: Histogram::new(Layout::new(1000.0, 0.01, 1.05), VPA_HALF_LIFE),
            memory: Histogram::new(Layout::new(1e12, 1e7, 1.05), VPA_HALF_LIFE),
            last_cpu: None,
            window_end: None,
            peak: 0.0,
        }
    }
}

impl Vpa {
    /// Adds a CPU usage sample (cores) at unix second `t`; out-of-order samples are
    /// dropped, as VPA drops them.
    pub fn add_cpu(&mut self, t: i64, cores: f64) {
        if !cores.is_finite() || cores < 0.0 || self.last_cpu.is_some_and(|l| t <= l) {
            return;
        }
        self.cpu.add(cores, VPA_CPU_WEIGHT, t);
        self.last_cpu = Some(t);
    }

    /// Adds a memory working-set sample (bytes) at unix second `t`.
    pub fn add_memory(&mut self, t: i64, bytes: f64) {
        if !bytes.is_finite() || bytes < 0.0 {
            return;
        }
        let end = *self.window_end.get_or_insert(t);
        if t < end {
            if self.peak != 0.0 && bytes > self.peak {
                self.memory.subtract(self.peak, 1.0, end);
                self.memory.add(bytes, 1.0, end);
                self.peak = bytes;
            }
        } else {
            let behind = (t - end) / VPA_INTERVAL * VPA_INTERVAL;
            let end = end + behind + VPA_INTERVAL;
            self.window_end = Some(end);
            self.memory.add(bytes, 1.0, end);
            self.peak = bytes;
        }
    }

    /// The target: (cores, bytes).
    pub fn target(&self) -> (f64, f64) {
        let cpu = self.cpu.percentile(VPA_PERCENTILE) * (1.0 + VPA_MARGIN);
        let memory = self.memory.percentile(VPA_PERCENTILE) * (1.0 + VPA_MARGIN);
        (cpu.max(VPA_MIN_CPU), memory.max(VPA_MIN_MEMORY))
    }
}

/// KRR's simple strategy on CPU samples (cores) and memory samples (bytes): the 95th
/// percentile of CPU and the maximum memory plus 15%.
pub fn krr(cpu: &[f64], memory: &[f64]) -> (f64, f64) {
    let mut sorted: Vec<f64> = cpu.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    let p95 = if sorted.is_empty() {
        0.0
    } else {
        // Nearest rank.
        let rank = ((0.95 * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1]
    };
    let max = memory.iter().copied().fold(0.0, f64::max);
    (p95, max * 1.15)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = 1_048_576.0;

    #[test]
    fn vpa_buckets_start_where_its_source_says() {
        let l = Layout::new(1000.0, 0.01, 1.05);
        assert_eq!(l.start(0), 0.0);
        assert!((l.start(1) - 0.01).abs() < 1e-12);
        assert!((l.start(2) - 0.0205).abs() < 1e-12);
        assert_eq!(l.bucket(0.005), 0);
        assert_eq!(l.bucket(0.015), 1);
        assert_eq!(l.bucket(0.021), 2);
        assert!(l.start(l.count - 1) >= 1000.0 && l.start(l.count - 2) < 1000.0);
    }

    #[test]
    fn vpa_on_flat_usage_is_the_bucket_end_plus_15_percent() {
        let mut v = Vpa::default();
        for m in 0..3 * 1440 {
            v.add_cpu(m * 60, 1.0);
            v.add_memory(m * 60, 1024.0 * MIB);
        }
        let (cpu, memory) = v.target();
        let l = Layout::new(1000.0, 0.01, 1.05);
        assert!(
            (cpu - l.start(l.bucket(1.0) + 1) * 1.15).abs() < 1e-9,
            "{cpu}"
        );
        assert!(cpu > 1.15 && cpu < 1.15 * 1.05);
        assert!(memory > 1.15 * 1024.0 * MIB && memory < 1.15 * 1.05 * 1024.0 * MIB);
    }

    #[test]
    fn vpa_keeps_one_memory_peak_per_day_and_recent_days_weigh_more() {
        let mut v = Vpa::default();
        // Nine days at 2 GiB, then the highest sample of each of the last three days is
        // 1 GiB: the older peaks still outweigh them at the 90th percentile...
        for d in 0..12 {
            let level = if d < 9 { 2048.0 } else { 1024.0 };
            for h in 0..24 {
                v.add_memory(d * 86_400 + h * 3600, level * MIB * (1.0 - h as f64 * 1e-3));
            }
        }
        assert!(v.target().1 > 2048.0 * MIB);
        // ...and a week later at 1 GiB they no longer do.
        for d in 12..19 {
            v.add_memory(d * 86_400, 1024.0 * MIB);
        }
        assert!(v.target().1 < 1.3 * 1024.0 * MIB, "{}", v.target().1 / MIB);
    }

    #[test]
    fn vpa_has_its_per_pod_minimums() {
        let mut v = Vpa::default();
        for m in 0..1440 {
            v.add_cpu(m * 60, 0.001);
            v.add_memory(m * 60, 20.0 * MIB);
        }
        assert_eq!(v.target(), (0.025, 250.0 * MIB));
    }

    #[test]
    fn krr_takes_the_cpu_p95_and_memory_maximum_plus_15_percent() {
        let cpu: Vec<f64> = (1..=100).map(|i| f64::from(i) / 100.0).collect();
        let memory: Vec<f64> = (0..100).map(|i| (1000.0 + f64::from(i)) * MIB).collect();
        let (c, m) = krr(&cpu, &memory);
        assert!((c - 0.95).abs() < 1e-12);
        assert!((m - 1099.0 * MIB * 1.15).abs() < 1.0);
    }
}
