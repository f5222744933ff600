//! A decaying histogram with exponentially growing buckets, the core of VPA's recommender:
//! samples lose half their weight every half-life, so recent behaviour dominates while a
//! long history still counts. Buckets grow by a fixed ratio, so relative precision is the
//! same for a 10m and a 10-core container.
//!
//! Decay is applied by weighting each new sample by `2^((t - reference) / half_life)`
//! instead of shrinking every old one; the reference moves forward (and every weight is
//! rescaled) before the factors grow large. The state serialises, so an agent can save it
//! and resume without re-reading history.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// Bucket layout: the first bucket's upper edge and the growth ratio.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Buckets {
    /// Upper edge of the first bucket.
    pub first: f64,
    /// Each bucket is this much wider than the previous one (1.05 = 5%).
    pub ratio: f64,
    /// Number of buckets; values above the last edge land in the last bucket.
    pub count: usize,
}

impl Buckets {
    /// CPU in cores: 10m resolution at the bottom, 5% growth, up to about 1000 cores.
    pub const CPU: Buckets = Buckets {
        first: 0.01,
        ratio: 1.05,
        count: 237,
    };

    /// Memory in bytes: 10 MB at the bottom, 5% growth, up to about 1 TB.
    pub const MEMORY: Buckets = Buckets {
        first: 1e7,
        ratio: 1.05,
        count: 237,
    };

    /// The bucket a value falls in: the first whose upper edge is at least `value`.
    pub fn index(&self, value: f64) -> usize {
        match IndexTable::for_layout(self) {
            Some(table) => table.index(value),
            None => self.index_with(value, 1.0 / self.ratio.ln()),
        }
    }

    /// [`Buckets::index`] with `1 / ln(ratio)` precomputed (the hot path).
    fn index_with(&self, value: f64, inv_ln_ratio: f64) -> usize {
        if value.is_nan() || value <= self.first {
            return 0;
        }
        // Upper edge of bucket i is first * ratio^i.
        let i = ((value / self.first).ln() * inv_ln_ratio).ceil();
        (i.max(0.0) as usize).min(self.count - 1)
    }

    /// The upper edge of bucket `i`.
    pub fn upper(&self, i: usize) -> f64 {
        self.first * self.ratio.powi(i as i32)
    }
}

/// Sub-divisions of each power of two in an [`IndexTable`]: 64 cells of about 1.1% each,
/// so a cell spans at most two 5% buckets.
const CELLS_PER_OCTAVE: usize = 64;

/// Finds a value's bucket without a logarithm: the value's binary exponent and top six
/// mantissa bits pick a cell, the cell gives the first bucket that can hold its values,
/// and at most a step or two along the exact edges finds the bucket. Built once for each
/// of Tailor's layouts; the hot path of every CPU sample.
#[derive(Debug)]
struct IndexTable {
    buckets: Buckets,
    /// Upper edge of every bucket.
    edges: Vec<f64>,
    /// Binary exponent of the first cell.
    first_exponent: i64,
    /// Per cell, the first bucket whose upper edge reaches the cell's lower end.
    start: Vec<u16>,
}

impl IndexTable {
    fn new(buckets: Buckets) -> Self {
        let edges: Vec<f64> = (0..buckets.count).map(|i| buckets.upper(i)).collect();
        let exponent = |v: f64| ((v.to_bits() >> 52) & 0x7ff) as i64 - 1023;
        let first_exponent = exponent(buckets.first);
        let last = edges.last().copied().unwrap_or(buckets.first);
        let cells = (exponent(last) - first_exponent + 1) as usize * CELLS_PER_OCTAVE;
        let mut start = Vec::with_capacity(cells);
        let mut j = 0usize;
        for cell in 0..cells {
            let octave = (cell / CELLS_PER_OCTAVE) as i32 + first_exponent as i32;
            let low = 2f64.powi(octave) * (1.0 + (cell % CELLS_PER_OCTAVE) as f64 / 64.0);
            while j + 1 < edges.len() && edges[j] < low {
                j += 1;
            }
            start.push(j as u16);
        }
        IndexTable {
            buckets,
            edges,
            first_exponent,
            start,
        }
    }

    /// The table for one of Tailor's layouts, `None` for any other.
    fn for_layout(buckets: &Buckets) -> Option<&'static IndexTable> {
        static CPU: OnceLock<IndexTable> = OnceLock::new();
        static MEMORY: OnceLock<IndexTable> = OnceLock::new();
        if *buckets == Buckets::CPU {
            Some(CPU.get_or_init(|| IndexTable::new(Buckets::CPU)))
        } else if *buckets == Buckets::MEMORY {
            Some(MEMORY.get_or_init(|| IndexTable::new(Buckets::MEMORY)))
        } else {
            None
        }
    }

    fn index(&self, value: f64) -> usize {
        // NaN and everything up to the first edge (zero, negatives) go to bucket 0.
        if value.is_nan() || value <= self.buckets.first {
            return 0;
        }
        let bits = value.to_bits();
        let octave = ((bits >> 52) & 0x7ff) as i64 - 1023 - self.first_exponent;
        let cell = octave as usize * CELLS_PER_OCTAVE + ((bits >> 46) & 63) as usize;
        let Some(&start) = self.start.get(cell) else {
            return self.edges.len() - 1;
        };
        let mut j = usize::from(start);
        while j + 1 < self.edges.len() && value > self.edges[j] {
            j += 1;
        }
        j
    }
}

/// Largest weight factor before the reference time moves forward (2^40).
const MAX_FACTOR: f64 = 1.0e12;

/// A histogram of samples whose weight halves every `half_life_seconds`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecayingHistogram {
    buckets: Buckets,
    half_life_seconds: f64,
    /// Unix seconds the weights are relative to.
    reference: i64,
    weights: Vec<f64>,
    total: f64,
    /// Cache for consecutive samples: the last time and its weight factor, and the factor
    /// for the last spacing between samples (samples usually come evenly spaced, so the
    /// next factor is one multiplication away instead of an `exp2`).
    #[serde(skip)]
    last: Option<(i64, f64)>,
    #[serde(skip)]
    spacing: Option<(i64, f64)>,
    /// The fast bucket lookup of this layout, when it is one of Tailor's.
    #[serde(skip)]
    table: Lookup,
}

/// A histogram's cached [`IndexTable`]; derived data, so never part of equality.
#[derive(Debug, Clone, Copy, Default)]
struct Lookup(Option<&'static IndexTable>);

impl PartialEq for Lookup {
    fn eq(&self, _: &Lookup) -> bool {
        true
    }
}

impl DecayingHistogram {
    /// An empty histogram.
    pub fn new(buckets: Buckets, half_life_seconds: f64, reference: i64) -> Self {
        DecayingHistogram {
            buckets,
            half_life_seconds: half_life_seconds.max(1.0),
            reference,
            weights: vec![0.0; buckets.count],
            total: 0.0,
            last: None,
            spacing: None,
            table: Lookup(IndexTable::for_layout(&buckets)),
        }
    }

    fn factor(&self, t: i64) -> f64 {
        ((t - self.reference) as f64 / self.half_life_seconds).exp2()
    }

    /// The half-life of a sample's weight, seconds.
    pub fn half_life(&self) -> f64 {
        self.half_life_seconds
    }

    /// Adds a sample taken at unix second `t` with base weight `weight`.
    pub fn add(&mut self, value: f64, weight: f64, t: i64) {
        if !value.is_finite() || !weight.is_finite() || weight <= 0.0 {
            return;
        }
        let mut factor = match (self.last, self.spacing) {
            (Some((lt, lf)), Some((dt, df))) if t - lt == dt => lf * df,
            (Some((lt, lf)), _) if t == lt => lf,
            _ => self.factor(t),
        };
        if factor > MAX_FACTOR {
            self.shift_reference(t);
            factor = self.factor(t);
            self.spacing = None;
        }
        if let Some((lt, _)) = self.last
            && t != lt
            && self.spacing.is_none_or(|(dt, _)| dt != t - lt)
        {
            self.spacing = Some((t - lt, ((t - lt) as f64 / self.half_life_seconds).exp2()));
        }
        self.last = Some((t, factor));
        let w = weight * factor;
        if self.table.0.is_none() {
            // Restored from a checkpoint (the table is not saved), or another layout.
            self.table = Lookup(IndexTable::for_layout(&self.buckets));
        }
        let i = match self.table.0 {
            Some(table) => table.index(value),
            None => self
                .buckets
                .index_with(value, 1.0 / self.buckets.ratio.ln()),
        };
        self.weights[i] += w;
        self.total += w;
    }

    /// Moves the reference to `t`, rescaling every weight; the percentiles do not change.
    pub fn shift_reference(&mut self, t: i64) {
        let scale = (-(t - self.reference) as f64 / self.half_life_seconds).exp2();
        for w in &mut self.weights {
            *w *= scale;
        }
        self.total *= scale;
        self.reference = t;
        self.last = None;
    }

    /// Whether no sample has been added.
    pub fn is_empty(&self) -> bool {
        self.total <= 0.0
    }

    /// The value below which `p` (0..=1) of the decayed weight lies: the upper edge of the
    /// bucket where the cumulative weight reaches `p`. `None` when empty.
    pub fn percentile(&self, p: f64) -> Option<f64> {
        if self.is_empty() {
            return None;
        }
        let target = p.clamp(0.0, 1.0) * self.total;
        let mut sum = 0.0;
        for (i, w) in self.weights.iter().enumerate() {
            sum += w;
            if sum >= target && *w > 0.0 || sum >= self.total {
                return Some(self.buckets.upper(i));
            }
        }
        Some(self.buckets.upper(self.buckets.count - 1))
    }

    /// The decayed share (0..=1) of samples in buckets whose upper edge is at most
    /// `level`; 0 when empty.
    pub fn share_at_or_below(&self, level: f64) -> f64 {
        if self.is_empty() {
            return 0.0;
        }
        let below: f64 = self
            .weights
            .iter()
            .enumerate()
            .take_while(|(i, _)| self.buckets.upper(*i) <= level * (1.0 + 1e-12))
            .map(|(_, w)| w)
            .sum();
        (below / self.total).min(1.0)
    }

    /// The candidate levels of the trade between waste and starvation: the upper edge of
    /// each bucket that holds samples (between samples the waste grows while the
    /// starvation stays), with `waste`, the decayed mean of `(level - sample)+` (what a
    /// request of `level` reserves and the samples leave unused), and `above`, the decayed
    /// share of samples above it. Samples stand at their bucket's geometric centre. Empty
    /// when the histogram is.
    pub fn trade_points(&self) -> Vec<TradePoint> {
        let mut points = Vec::new();
        if self.is_empty() {
            return points;
        }
        let centre = |i: usize| self.buckets.upper(i) / self.buckets.ratio.sqrt();
        let mut below = 0.0;
        let mut below_sum = 0.0;
        for (i, w) in self.weights.iter().enumerate() {
            below += w;
            below_sum += w * centre(i);
            if *w <= 0.0 {
                continue;
            }
            let level = self.buckets.upper(i);
            points.push(TradePoint {
                level,
                waste: ((level * below - below_sum) / self.total).max(0.0),
                above: ((self.total - below) / self.total).max(0.0),
            });
            if below >= self.total {
                break;
            }
        }
        points
    }

    /// The decayed mean of the samples (at their buckets' geometric centres); `None` when
    /// empty.
    pub fn mean(&self) -> Option<f64> {
        if self.is_empty() {
            return None;
        }
        let centre = |i: usize| self.buckets.upper(i) / self.buckets.ratio.sqrt();
        let sum: f64 = self
            .weights
            .iter()
            .enumerate()
            .map(|(i, w)| w * centre(i))
            .sum();
        Some(sum / self.total)
    }

    /// The level `r` (a bucket's upper edge) that minimises
    /// `waste(r) / mean + starvation_weight * above(r)` over the [`Self::trade_points`],
    /// `mean` being the samples' mean, so the trade is the same for a 10m and a 10-core
    /// container. The optimum sits where raising `r` by a little wastes as much as it
    /// saves in starved samples: high on a smooth distribution whose top is dense
    /// (covering it costs little), low on a bursty one whose rare bursts lie far above the
    /// body (covering them would reserve the gap all day). `None` when empty.
    pub fn level_minimising_waste_and_starvation(&self, starvation_weight: f64) -> Option<f64> {
        let mean = self.mean().filter(|m| *m > 0.0)?;
        cheapest(&self.trade_points(), starvation_weight * mean)
    }

    /// The level minimising `waste(r) + price * above(r)`, waste in the samples' own unit:
    /// one price trades waste for starvation alike in every container it is given to, so
    /// across a fleet the starved samples go where they spare the most.
    pub fn level_minimising_waste_at_price(&self, price: f64) -> Option<f64> {
        cheapest(&self.trade_points(), price)
    }

    /// Merges another histogram with the same layout and half-life (e.g. two replicas of
    /// one container).
    pub fn merge(&mut self, other: &DecayingHistogram) {
        let mut other = other.clone();
        if other.reference != self.reference {
            other.shift_reference(self.reference);
        }
        for (a, b) in self.weights.iter_mut().zip(&other.weights) {
            *a += b;
        }
        self.total += other.total;
    }
}

/// A candidate request level with what it wastes and starves (see
/// [`DecayingHistogram::trade_points`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TradePoint {
    /// The level, in the samples' unit.
    pub level: f64,
    /// The decayed mean of `(level - sample)+`.
    pub waste: f64,
    /// The decayed share of samples above the level.
    pub above: f64,
}

/// The share of samples above `level`, read from a histogram's [`DecayingHistogram::trade_points`]:
/// the `above` of the highest point at or below `level`, 1 below the lowest point, as
/// [`DecayingHistogram::share_at_or_below`] gives it from the buckets but by a binary
/// search (the fleet's starvation price asks it of every container at every step).
pub fn share_above(points: &[TradePoint], level: f64) -> f64 {
    let at_or_below = points.partition_point(|p| p.level <= level * (1.0 + 1e-12));
    match at_or_below.checked_sub(1) {
        Some(i) => points[i].above,
        None => 1.0,
    }
}

/// The level of the point minimising `waste + price * above` (the lowest on a tie).
pub fn cheapest(points: &[TradePoint], price: f64) -> Option<f64> {
    let mut best: Option<(f64, f64)> = None;
    for p in points {
        let cost = p.waste + price * p.above;
        if best.is_none_or(|(c, _)| cost < c) {
            best = Some((cost, p.level));
        }
    }
    best.map(|(_, level)| level)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400;

    #[test]
    fn buckets_grow_by_the_ratio_and_cover_the_range() {
        let b = Buckets::CPU;
        assert_eq!(b.index(0.0), 0);
        assert_eq!(b.index(0.01), 0);
        assert_eq!(b.index(0.0105), 1);
        assert!(b.upper(b.count - 1) > 1000.0);
        let v = 3.7;
        let i = b.index(v);
        assert!(b.upper(i) >= v && b.upper(i - 1) < v);
    }

    #[test]
    fn the_lookup_table_agrees_with_the_edges_everywhere() {
        for b in [Buckets::CPU, Buckets::MEMORY] {
            let table = IndexTable::new(b);
            // Exactly on every edge, just above and just below it.
            for i in 0..b.count {
                let edge = b.upper(i);
                assert_eq!(table.index(edge), i, "edge {i}");
                if i + 1 < b.count {
                    assert_eq!(table.index(edge * (1.0 + 1e-12)), i + 1, "above edge {i}");
                }
                assert_eq!(table.index(edge * (1.0 - 1e-12)), i, "below edge {i}");
            }
            // A dense sweep against the definition: the first edge at or above the value.
            let mut v = b.first / 3.0;
            while v < b.upper(b.count - 1) * 3.0 {
                let expected = (0..b.count)
                    .find(|&i| v <= b.upper(i))
                    .unwrap_or(b.count - 1);
                assert_eq!(table.index(v), expected, "{v}");
                v *= 1.0037;
            }
            assert_eq!(table.index(f64::NAN), 0);
            assert_eq!(table.index(-1.0), 0);
            assert_eq!(table.index(f64::INFINITY), b.count - 1);
        }
    }

    #[test]
    fn percentiles_of_uniform_samples_are_within_one_bucket() {
        let mut h = DecayingHistogram::new(Buckets::CPU, 86_400.0, 0);
        for i in 1..=100 {
            h.add(f64::from(i) / 100.0, 1.0, 0);
        }
        let p90 = h.percentile(0.9).expect("not empty");
        assert!((0.9..=0.9 * 1.05 + 1e-9).contains(&p90), "{p90}");
        let p50 = h.percentile(0.5).expect("not empty");
        assert!((0.5..=0.5 * 1.05 + 1e-9).contains(&p50), "{p50}");
        assert_eq!(
            DecayingHistogram::new(Buckets::CPU, 1.0, 0).percentile(0.5),
            None
        );
    }

    #[test]
    fn old_samples_lose_half_their_weight_per_half_life() {
        // One day of 1-core samples, then one day of 4-core samples, half-life one day:
        // the newer day weighs twice as much, so the median is the newer value.
        let mut h = DecayingHistogram::new(Buckets::CPU, DAY as f64, 0);
        for m in 0..1440 {
            h.add(1.0, 1.0, m * 60);
        }
        for m in 0..1440 {
            h.add(4.0, 1.0, DAY + m * 60);
        }
        let p50 = h.percentile(0.5).expect("not empty");
        assert!(p50 >= 4.0, "{p50}");
        // Without decay the two days weigh the same and the 40th percentile is the old one.
        let mut flat = DecayingHistogram::new(Buckets::CPU, 1e12, 0);
        for m in 0..1440 {
            flat.add(1.0, 1.0, m * 60);
            flat.add(4.0, 1.0, DAY + m * 60);
        }
        assert!(flat.percentile(0.4).expect("not empty") < 1.1);
    }

    #[test]
    fn moving_the_reference_keeps_percentiles_and_survives_long_histories() {
        let mut h = DecayingHistogram::new(Buckets::MEMORY, 3600.0, 0);
        // 200 hours of samples: the factor passes 2^40 and the reference moves.
        for hour in 0..200 {
            h.add(1e9 + hour as f64 * 1e6, 1.0, hour * 3600);
        }
        let before = h.percentile(0.95);
        h.shift_reference(200 * 3600);
        assert_eq!(h.percentile(0.95), before);
        assert!(h.percentile(0.5).is_some_and(|v| v.is_finite()));
    }

    #[test]
    fn state_round_trips_through_a_checkpoint() {
        let mut h = DecayingHistogram::new(Buckets::CPU, DAY as f64, 0);
        for i in 0..50 {
            h.add(0.1 * f64::from(i), 1.0, i64::from(i) * 60);
        }
        let saved = serde_json::to_string(&h).expect("serialises");
        let restored: DecayingHistogram = serde_json::from_str(&saved).expect("parses");
        for p in [0.0, 0.1, 0.5, 0.9, 0.95, 0.99, 1.0] {
            assert_eq!(restored.percentile(p), h.percentile(p), "p{p}");
        }
    }

    #[test]
    fn merging_two_replicas_adds_their_weights() {
        let mut a = DecayingHistogram::new(Buckets::CPU, DAY as f64, 0);
        let mut b = DecayingHistogram::new(Buckets::CPU, DAY as f64, 100);
        a.add(1.0, 1.0, 0);
        b.add(2.0, 1.0, 0);
        a.merge(&b);
        assert!(a.percentile(1.0).expect("not empty") >= 2.0);
        assert!(a.percentile(0.4).expect("not empty") < 1.1);
    }

    #[test]
    fn the_share_above_from_trade_points_is_the_buckets_share() {
        let mut h = DecayingHistogram::new(Buckets::CPU, DAY as f64, 0);
        for m in 0..600 {
            // Three clusters with gaps between them, and decay across the span.
            let v = [0.05, 0.4, 2.5][m % 3] * (1.0 + 0.01 * (m % 7) as f64);
            h.add(v, 1.0, m as i64 * 600);
        }
        let points = h.trade_points();
        assert!(points.len() > 3);
        let mut levels: Vec<f64> = points.iter().map(|p| p.level).collect();
        levels.extend([0.0, 0.001, 0.03, 0.2, 1.0, 2.0, 3.0, 100.0]);
        levels.extend(points.iter().map(|p| p.level * 0.999));
        let mut seen = Vec::new();
        for level in levels {
            let want = 1.0 - h.share_at_or_below(level);
            let got = share_above(&points, level);
            assert!((got - want).abs() < 1e-9, "at {level}: {got} vs {want}");
            seen.push(got);
        }
        // Below every sample all are above; above every sample none; a third above 1 core.
        assert_eq!(share_above(&points, 0.0), 1.0);
        assert!(share_above(&points, 100.0) < 1e-12);
        let above_one = share_above(&points, 1.0);
        assert!((0.2..0.5).contains(&above_one), "{above_one}");
        assert!(seen.iter().any(|s| *s > 0.0 && *s < 1.0));
    }

    #[test]
    fn the_waste_starvation_level_covers_a_dense_top_but_not_rare_far_bursts() {
        // A daily sine between 0.1 and 1.0 core: the top of the cycle is where the samples
        // crowd, so covering it costs little.
        let mut smooth = DecayingHistogram::new(Buckets::CPU, DAY as f64, 0);
        for m in 0..1440 {
            let angle = 2.0 * std::f64::consts::PI * m as f64 / 1440.0;
            smooth.add(0.55 + 0.45 * angle.sin(), 1.0, m * 60);
        }
        let p70 = smooth.percentile(0.7).expect("not empty");
        let level = smooth
            .level_minimising_waste_and_starvation(4.0)
            .expect("not empty");
        assert!(level >= 0.95, "{level} (p70 {p70})");
        assert!(smooth.share_at_or_below(level) > 0.93);
        // A weight of almost nothing buys no coverage: the level falls to the bottom.
        let cheap = smooth
            .level_minimising_waste_and_starvation(0.01)
            .expect("not empty");
        assert!(cheap < p70 / 2.0, "{cheap}");

        // Idle at 50m with bursts to 2 cores 5% of the time: covering the bursts would
        // reserve 40 times the idle level all day.
        let mut bursty = DecayingHistogram::new(Buckets::CPU, DAY as f64, 0);
        for m in 0..1440 {
            bursty.add(if m % 20 == 0 { 2.0 } else { 0.05 }, 1.0, m * 60);
        }
        let level = bursty
            .level_minimising_waste_and_starvation(4.0)
            .expect("not empty");
        assert!(level < 0.06, "{level}");
        assert_eq!(
            DecayingHistogram::new(Buckets::CPU, 1.0, 0).level_minimising_waste_and_starvation(4.0),
            None
        );
    }
}
