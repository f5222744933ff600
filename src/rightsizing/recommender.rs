//! Per-container usage state and the recommendation built from it.
//!
//! The core follows VPA's recommender and improves on it where the backtest says so:
//! CPU from a decaying histogram of usage samples; memory from a decaying histogram of
//! per-window (24h) peaks; a safety margin; bounds that widen while history is short;
//! memory bumped after OOM kills. On top: policy floors and ceilings, the largest node's
//! allocatable as a hard ceiling, hysteresis, a maximum step per change, HPA awareness,
//! limit handling, and the hourly cost of the change. Pure: time is passed in.

use serde::{Deserialize, Serialize};

use super::histogram::{Buckets, DecayingHistogram};
use super::policy::Policy;
use crate::apis::{HpaPolicy, LimitsPolicy, Profile};
use crate::model::quantity::{display_bytes, format_milli, format_value};

/// Length of the window whose peak is one memory sample (VPA's aggregation interval).
pub const MEMORY_WINDOW_SECONDS: i64 = 86_400;
const GIB: f64 = (1u64 << 30) as f64;
/// Below this share of the expected samples, history is partial and not acted on.
const MIN_COVERAGE: f64 = 0.5;
/// Daily peaks used for the memory trend.
const TREND_WINDOWS: usize = 7;
/// Daily peaks kept (for the trend and the recent-peak floor).
const KEPT_WINDOWS: usize = super::policy::MAX_PEAK_DAYS as usize;
/// Per-run memory peaks kept, for containers that run intermittently (Jobs, CronJobs).
const KEPT_RUNS: usize = 30;
/// Closed runs needed before the per-run peaks size memory.
const MIN_RUNS: usize = 3;
/// Closed runs needed before an intermittent container's memory is cut below its
/// request. Whatever the runs' peaks are distributed as, the next run peaks above every
/// one of `n` runs seen with chance `1 / (n + 1)`; from 19 runs that is at most 5%. Fewer
/// runs than that cannot tell a Job that always peaks the same from one whose input is
/// large one run in five: a fit of a few quiet runs predicts the quiet peak, and the
/// first large run meets every replica at once below its need.
const RUNS_TO_CUT_MEMORY: usize = 19;

/// A container whose pods ran less than this share of its history, with closed runs, is
/// intermittent (a Job or CronJob) for [`RUNS_TO_CUT_MEMORY`].
const INTERMITTENT_SHARE: f64 = 0.5;
/// A run ends when no memory sample came for at least one whole sampling interval and at
/// least this many seconds: raw scrapes a minute apart tolerate a few missed ones, and
/// hourly peaks (as read from Prometheus) end a run at the first hour with no sample.
const RUN_IDLE_SECONDS: i64 = 600;
/// The standard normal's 99th percentile: the next run's peak is sized for the 99th
/// percentile of a lognormal fit of the runs' peaks.
const RUN_PEAK_Z: f64 = 2.326;
/// How much more than it got a throttled CFS period is taken to have wanted, as a share of
/// the container's usage: a throttled period ran out of quota, so it wanted at least what it
/// got, and how much more the counters cannot say.
pub const THROTTLED_EXCESS: f64 = 0.5;

/// Hours of CPU targets the request is the mean of: a daily cycle
/// ([`ContainerHistory::note_cpu_target`]).
pub const CPU_TARGET_HOURS: i64 = 24;

/// Student's t one-sided 99th percentile with `df` degrees of freedom: from the table up
/// to 4, then the Cornish-Fisher expansion around the normal's (within 0.5% from there).
fn student_t99(df: f64) -> f64 {
    const TABLE: [f64; 4] = [31.821, 6.965, 4.541, 3.747];
    let df = df.max(1.0);
    if df < 5.0 {
        return TABLE[(df as usize).clamp(1, 4) - 1];
    }
    let z = RUN_PEAK_Z;
    let (z3, z5, z7) = (z.powi(3), z.powi(5), z.powi(7));
    z + (z3 + z) / (4.0 * df)
        + (5.0 * z5 + 16.0 * z3 + 3.0 * z) / (96.0 * df.powi(2))
        + (3.0 * z7 + 19.0 * z5 + 17.0 * z3 - 15.0 * z) / (384.0 * df.powi(3))
}

/// The CPU a container wanted, estimated from its usage (capped by its CPU limit) and the
/// share of CFS periods in which it was throttled: `usage * (1 + THROTTLED_EXCESS * share)`,
/// at most one and a half times the usage when every period is throttled. With demand
/// varying period to period around its level (lognormal, 35% spread), the estimate is
/// within 5% of the demand up to 1.2x the limit and 8-19% short at 1.5-1.8x. A short
/// estimate corrects itself: the raised request raises the limit with it (limits are kept
/// in ratio), so the next round sees further; one that overshoots only wastes. Counting a
/// throttled period as wanting twice what it got overshot by up to 25% near the limit;
/// `usage / (1 - share)` overshot further. (An excess growing with the square of the share
/// tracked that demand more closely, but stretched the top of the usage histogram so the
/// CPU level was chosen lower, and starved the backtest's CPU-limited containers more.)
pub fn throttled_demand(cores: f64, throttled_share: f64) -> f64 {
    let share = throttled_share.clamp(0.0, 1.0);
    cores * (1.0 + THROTTLED_EXCESS * share)
}

/// CPU windows of this many seconds hold one mean each in the windowed histogram
/// ([`ContainerHistory::add_cpu`]): severe starvation and running phases are judged on them.
pub const CPU_WINDOW_SECONDS: i64 = 300;
/// A window is severely starved when its mean exceeds the request this many times.
pub const SEVERE_FACTOR: f64 = 2.0;
/// Running phases are judged on windows of this many seconds: long enough that a spike of
/// a few minutes does not fill one, short enough that a batch run of half an hour does.
pub const PHASE_WINDOW_SECONDS: i64 = 900;
/// A running phase: windows whose mean is at least this many times the container's median
/// sample (a batch worker's bursts against its idle level).
const PHASE_FACTOR: f64 = 8.0;
/// ... making up at least this share of the windows; a rarer phase is a spike, left to the
/// short-minute and severe caps.
const PHASE_MIN_SHARE: f64 = 0.01;
/// The request covers this percentile of the running phase's windows.
const PHASE_PERCENTILE: f64 = 0.5;
/// A minute (or an hour read from Prometheus) counts as throttled when at least this share
/// of its CFS periods was.
const THROTTLED_MINUTE_SHARE: f64 = 0.01;
/// A container throttled in at least this share of its minutes is a throttled container:
/// its CPU limit is never lowered.
const THROTTLED_CONTAINER_SHARE: f64 = 0.01;
/// The per-container reference of the Balanced profile's caps: VPA's default CPU target
/// percentile and safety margin, applied to the same history.
const REFERENCE_PERCENTILE: f64 = 0.9;
const REFERENCE_MARGIN: f64 = 0.15;
/// A recommended CPU limit stays at least this high a percentile of the container's
/// demand ...
const LIMIT_PERCENTILE: f64 = 0.999;
/// ... with this much room above it.
const LIMIT_HEADROOM: f64 = 0.1;

/// Confidence reaches 1 with a week of history.
const FULL_CONFIDENCE_SECONDS: f64 = 7.0 * 86_400.0;

/// An OOM kill seen in the history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OomEvent {
    /// Unix seconds.
    pub at: i64,
    /// Memory in use (or the limit) when it happened, bytes.
    pub memory: f64,
    /// The container's memory request when it happened, when known. Without it the
    /// current request stands in, which is right only while the request has not been
    /// changed since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<f64>,
}

/// Everything the recommender keeps about one container across all its pods. Serialisable,
/// so the in-cluster agent can checkpoint it and add only new samples each cycle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerHistory {
    cpu: DecayingHistogram,
    memory_peaks: DecayingHistogram,
    window_start: i64,
    window_peak: f64,
    first: Option<i64>,
    last: Option<i64>,
    samples: u64,
    ooms: Vec<OomEvent>,
    /// The last closed windows' peaks (start, bytes), newest last, for the trend.
    #[serde(default)]
    recent_peaks: Vec<(i64, f64)>,
    /// Time of the last CPU sample and the smallest spacing seen between CPU samples,
    /// to tell how much of the span the samples cover.
    #[serde(default)]
    last_cpu: Option<i64>,
    #[serde(default)]
    min_gap: Option<i64>,
    /// Runs of an intermittent container: the time of the last memory sample, the
    /// smallest spacing between memory samples, the open run's peak, and the peaks of the
    /// last closed runs. A gap with no sample for a whole interval and at least
    /// [`RUN_IDLE_SECONDS`] ends a run.
    #[serde(default)]
    last_memory: Option<i64>,
    #[serde(default)]
    memory_gap: Option<i64>,
    #[serde(default)]
    run_peak: f64,
    #[serde(default)]
    run_peaks: Vec<f64>,
    /// When the open run started, and the seconds the closed runs lasted: how much of the
    /// span any pod ran. Absent in checkpoints from before it was kept, where the share
    /// starts low and errs towards treating the container as intermittent.
    #[serde(default)]
    run_start: Option<i64>,
    #[serde(default)]
    ran_seconds: i64,
    /// The CPU targets of the last day, one per hour (the hour since the epoch, cores),
    /// oldest first: the request is their mean, so it does not follow the hour of day
    /// ([`ContainerHistory::note_cpu_target`]).
    #[serde(default)]
    cpu_targets: Vec<(i64, f64)>,
    /// CPU window means of [`CPU_WINDOW_SECONDS`] (severe starvation) and of
    /// [`PHASE_WINDOW_SECONDS`] (running phases). Absent in checkpoints from before they
    /// were kept; started with the next sample.
    #[serde(default)]
    cpu_windows: Option<WindowMeans>,
    #[serde(default)]
    cpu_phases: Option<WindowMeans>,
    /// CPU samples that came with CFS throttling counters, and those of them throttled in
    /// at least [`THROTTLED_MINUTE_SHARE`] of their periods.
    #[serde(default)]
    metered_samples: u64,
    #[serde(default)]
    throttled_samples: u64,
}

impl ContainerHistory {
    /// Empty history for a policy's half-life, starting at unix second `start`.
    pub fn new(policy: &Policy, start: i64) -> Self {
        let half_life = policy.half_life as f64;
        ContainerHistory {
            cpu: DecayingHistogram::new(Buckets::CPU, half_life, start),
            memory_peaks: DecayingHistogram::new(Buckets::MEMORY, half_life, start),
            window_start: start,
            window_peak: 0.0,
            first: None,
            last: None,
            samples: 0,
            ooms: Vec::new(),
            recent_peaks: Vec::new(),
            last_cpu: None,
            min_gap: None,
            last_memory: None,
            memory_gap: None,
            run_peak: 0.0,
            run_peaks: Vec::new(),
            run_start: None,
            ran_seconds: 0,
            cpu_targets: Vec::new(),
            cpu_windows: Some(WindowMeans::new(CPU_WINDOW_SECONDS, half_life, start)),
            cpu_phases: Some(WindowMeans::new(PHASE_WINDOW_SECONDS, half_life, start)),
            metered_samples: 0,
            throttled_samples: 0,
        }
    }

    /// Keeps `cores`, the CPU target computed at `now` from the usage alone
    /// ([`ContainerRecommendation::cpu_target_cores`]), as the target of `now`'s hour (a
    /// later one in the same hour replaces it), for a day. A target more than `jump` (a
    /// share) above every other target of the day is a new level, not an hour of the
    /// cycle: the day's targets before it are dropped.
    ///
    /// With usage decaying by a half-life of a day, the newest hours weigh most, so the
    /// target computed in the evening (after the day's peak) and the one computed at night
    /// differ by a third on a daily cycle: applied as they come, every morning's target
    /// is an increase the packed nodes have no room for, and the pods are evicted to get
    /// it. The request is the mean of the day's targets instead.
    pub fn note_cpu_target(&mut self, now: i64, cores: f64, jump: f64) {
        if !cores.is_finite() || cores < 0.0 {
            return;
        }
        let hour = now.div_euclid(3600);
        self.cpu_targets
            .retain(|(h, _)| *h > hour - CPU_TARGET_HOURS && *h < hour);
        // A new level (or the first target) starts the day's targets again.
        if self.cpu_target_over_day(now, cores, jump).1 == 1 {
            self.cpu_targets.clear();
        }
        self.cpu_targets.push((hour, cores));
    }

    /// The request `cores` (the target of `now`) makes with the targets kept from the
    /// other hours of the last day, with how many hours it spans: their mean, or `cores`
    /// itself when it is a new level ([`ContainerHistory::note_cpu_target`]).
    fn cpu_target_over_day(&self, now: i64, cores: f64, jump: f64) -> (f64, usize) {
        let hour = now.div_euclid(3600);
        let kept: Vec<f64> = self
            .cpu_targets
            .iter()
            .filter(|(h, _)| *h > hour - CPU_TARGET_HOURS && *h < hour)
            .map(|(_, c)| *c)
            .collect();
        let highest = kept.iter().copied().fold(f64::NAN, f64::max);
        if highest.is_finite() && cores > highest * (1.0 + jump) {
            return (cores, 1);
        }
        let n = kept.len() + 1;
        ((kept.iter().sum::<f64>() + cores) / n as f64, n)
    }

    fn seen(&mut self, t: i64) {
        self.first = Some(self.first.map_or(t, |f| f.min(t)));
        self.last = Some(self.last.map_or(t, |l| l.max(t)));
    }

    /// Adds a CPU usage sample (cores) taken at `t`.
    pub fn add_cpu(&mut self, t: i64, cores: f64) {
        if cores.is_finite() && cores >= 0.0 {
            // A sample of zero still counts: an idle container is information.
            self.cpu.add(cores.max(0.001), 1.0, t);
            self.samples += 1;
            if let Some(last) = self.last_cpu
                && t > last
            {
                self.min_gap = Some(self.min_gap.map_or(t - last, |g| g.min(t - last)));
            }
            self.last_cpu = Some(self.last_cpu.map_or(t, |l| l.max(t)));
            self.seen(t);
            self.add_to_window(t, cores);
        }
    }

    /// Adds a sample to the CPU window means.
    fn add_to_window(&mut self, t: i64, cores: f64) {
        let half_life = self.cpu.half_life();
        self.cpu_windows
            .get_or_insert_with(|| WindowMeans::new(CPU_WINDOW_SECONDS, half_life, t))
            .add(t, cores);
        self.cpu_phases
            .get_or_insert_with(|| WindowMeans::new(PHASE_WINDOW_SECONDS, half_life, t))
            .add(t, cores);
    }

    /// Counts an interval (a minute, or an hour as read from Prometheus) in which
    /// `share` (0..1) of the container's CFS periods were throttled, without a CPU sample:
    /// the usage source already folds throttling into the CPU it reads.
    pub fn note_throttling(&mut self, share: f64) {
        if share.is_finite() {
            self.metered_samples += 1;
            self.throttled_samples += u64::from(share >= THROTTLED_MINUTE_SHARE);
        }
    }

    /// The share of CPU samples with throttling counters that were throttled, if any had
    /// counters.
    pub fn throttled_share(&self) -> Option<f64> {
        (self.metered_samples > 0)
            .then(|| self.throttled_samples as f64 / self.metered_samples as f64)
    }

    /// Adds a CPU usage sample (cores) taken at `t` by a container that was throttled in
    /// `throttled_share` (0..1) of its CFS periods: the sample counts as the demand
    /// estimated by [`throttled_demand`], not the capped usage.
    pub fn add_cpu_throttled(&mut self, t: i64, cores: f64, throttled_share: f64) {
        if throttled_share.is_finite() {
            self.metered_samples += 1;
            self.throttled_samples += u64::from(throttled_share >= THROTTLED_MINUTE_SHARE);
            self.add_cpu(t, throttled_demand(cores, throttled_share));
        } else {
            self.add_cpu(t, cores);
        }
    }

    /// Says that memory samples are the peaks of intervals of `seconds` (as read from
    /// Prometheus): an interval with no sample had no pod running, so a Job that runs once
    /// every few hours, one sample a run, still has its runs told apart. Without it the
    /// spacing is learnt from the samples, which for such a Job is the time between runs.
    pub fn memory_sampled_every(&mut self, seconds: i64) {
        if seconds > 0 {
            self.memory_gap = Some(self.memory_gap.map_or(seconds, |g| g.min(seconds)));
        }
    }

    /// Adds a memory working-set sample (bytes) taken at `t`; the peak of each 24h window
    /// becomes one sample of the memory histogram.
    pub fn add_memory(&mut self, t: i64, bytes: f64) {
        if !bytes.is_finite() || bytes < 0.0 {
            return;
        }
        self.track_runs(t, bytes);
        if t >= self.window_start + MEMORY_WINDOW_SECONDS {
            self.close_window();
            let windows = (t - self.window_start) / MEMORY_WINDOW_SECONDS;
            self.window_start += windows * MEMORY_WINDOW_SECONDS;
        }
        self.window_peak = self.window_peak.max(bytes);
        self.seen(t);
    }

    /// Follows runs: a gap between memory samples that leaves out a whole interval of the
    /// usual spacing, and at least [`RUN_IDLE_SECONDS`], means no pod ran (a Job between
    /// runs), and closes the run's peak.
    fn track_runs(&mut self, t: i64, bytes: f64) {
        if let Some(last) = self.last_memory
            && t > last
        {
            let gap = t - last;
            let usual = self.memory_gap.map_or(gap, |g| g.min(gap));
            if gap - usual >= usual.max(RUN_IDLE_SECONDS) && self.run_peak > 0.0 {
                if let Some(start) = self.run_start {
                    self.ran_seconds += last - start + usual;
                }
                self.run_start = Some(t);
                self.run_peaks.push(self.run_peak);
                if self.run_peaks.len() > KEPT_RUNS {
                    self.run_peaks.remove(0);
                }
                self.run_peak = 0.0;
            }
            self.memory_gap = Some(usual);
        }
        self.last_memory = Some(self.last_memory.map_or(t, |l| l.max(t)));
        self.run_start.get_or_insert(t);
        self.run_peak = self.run_peak.max(bytes);
    }

    /// The share (0..1) of the span in which any pod of the container ran: about 1 for a
    /// long-running workload (an outage or two included), the runs' share of the time for
    /// a Job.
    fn running_share(&self) -> f64 {
        let span = self.span_seconds();
        let (Some(start), Some(last)) = (self.run_start, self.last_memory) else {
            return 1.0;
        };
        if span <= 0 {
            return 1.0;
        }
        let open = last - start + self.memory_gap.unwrap_or(0);
        ((self.ran_seconds + open) as f64 / span as f64).clamp(0.0, 1.0)
    }

    /// For an intermittent container with enough closed runs, the peak the next run is
    /// sized for: the 99th percentile of the next run's peak as a lognormal fit of the
    /// runs' peaks (the open run's included) predicts it, and at least the highest of
    /// them. The fit is from a few runs, so the bound is a prediction bound: Student's t
    /// in place of the normal's percentile, widened by `sqrt(1 + 1/n)` for the error of
    /// the fitted mean (with 14 runs, 2.74 standard deviations instead of 2.33).
    fn next_run_peak(&self) -> Option<f64> {
        if self.run_peaks.len() < MIN_RUNS {
            return None;
        }
        let peaks: Vec<f64> = self
            .run_peaks
            .iter()
            .copied()
            .chain((self.run_peak > 0.0).then_some(self.run_peak))
            .filter(|p| *p > 0.0)
            .collect();
        let n = peaks.len() as f64;
        let logs: Vec<f64> = peaks.iter().map(|p| p.ln()).collect();
        let mean = logs.iter().sum::<f64>() / n;
        let var = logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
        let highest = peaks.iter().copied().fold(0.0, f64::max);
        let bound = student_t99(n - 1.0) * (1.0 + 1.0 / n).sqrt();
        Some((mean + bound * var.sqrt()).exp().max(highest))
    }

    fn close_window(&mut self) {
        if self.window_peak > 0.0 {
            self.memory_peaks
                .add(self.window_peak, 1.0, self.window_start);
            self.recent_peaks
                .push((self.window_start, self.window_peak));
            if self.recent_peaks.len() > KEPT_WINDOWS {
                self.recent_peaks.remove(0);
            }
        }
        self.window_peak = 0.0;
    }

    /// Records an OOM kill at `t` with the memory in use or the limit at the time.
    pub fn add_oom(&mut self, t: i64, memory: f64) {
        self.push_oom(OomEvent {
            at: t,
            memory,
            request: None,
        });
    }

    /// Records an OOM kill at `t` with the memory in use and the container's memory
    /// request at the time (what an agent that changes requests must record, so a later
    /// recommendation bumps from the request that was too small, not from its own).
    pub fn add_oom_with_request(&mut self, t: i64, memory: f64, request: f64) {
        self.push_oom(OomEvent {
            at: t,
            memory,
            request: Some(request),
        });
    }

    fn push_oom(&mut self, oom: OomEvent) {
        if !self.ooms.iter().any(|o| o.at == oom.at) {
            self.seen(oom.at);
            self.ooms.push(oom);
        }
    }

    /// The decayed share of CPU samples above `cores`.
    pub fn cpu_share_above(&self, cores: f64) -> f64 {
        1.0 - self.cpu.share_at_or_below(cores)
    }

    /// Seconds between the first and the last sample.
    pub fn span_seconds(&self) -> i64 {
        match (self.first, self.last) {
            (Some(f), Some(l)) => l - f,
            _ => 0,
        }
    }

    /// Unix second of the newest sample, if any: how fresh the usage behind a
    /// recommendation is.
    pub fn last_sample(&self) -> Option<i64> {
        self.last
    }

    /// CPU usage samples seen.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// The share (0..1) of the span the CPU samples cover at their usual spacing: low when
    /// the source returned partial data.
    pub fn coverage(&self) -> f64 {
        match (self.min_gap, self.span_seconds()) {
            (Some(gap), span) if span > 0 => {
                (self.samples as f64 * gap as f64 / span as f64).min(1.0)
            }
            _ => 1.0,
        }
    }

    /// The peak projected one window ahead when daily peaks have been rising: a
    /// least-squares line through the recent peaks, if its slope is positive.
    fn projected_peak(&self) -> Option<f64> {
        let skip = self.recent_peaks.len().saturating_sub(TREND_WINDOWS);
        let mut points: Vec<(f64, f64)> = self
            .recent_peaks
            .iter()
            .skip(skip)
            .map(|(t, v)| (*t as f64 / MEMORY_WINDOW_SECONDS as f64, *v))
            .collect();
        if self.window_peak > 0.0 {
            points.push((
                self.window_start as f64 / MEMORY_WINDOW_SECONDS as f64,
                self.window_peak,
            ));
        }
        if points.len() < 3 {
            return None;
        }
        let n = points.len() as f64;
        let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
        let my = points.iter().map(|p| p.1).sum::<f64>() / n;
        let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
        let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        if sxx <= 0.0 {
            return None;
        }
        let slope = sxy / sxx;
        let last = points.last().map(|p| p.0)?;
        (slope > 0.0).then_some(my + slope * (last + 1.0 - mx))
    }

    /// The kept daily peaks (window start, bytes), the open window's so far included.
    fn kept_peaks(&self) -> impl Iterator<Item = (i64, f64)> + '_ {
        let open = (self.window_peak > 0.0).then_some((self.window_start, self.window_peak));
        self.recent_peaks.iter().copied().chain(open)
    }

    /// The highest daily peak of windows starting at or after `since`, the open window
    /// included: exact, not rounded to a histogram bucket.
    fn highest_peak_since(&self, since: i64) -> Option<f64> {
        self.kept_peaks()
            .filter(|(start, _)| *start + MEMORY_WINDOW_SECONDS > since)
            .map(|(_, peak)| peak)
            .reduce(f64::max)
    }

    /// The highest kept daily peak in the memory bucket whose upper edge is `edge`, or
    /// `edge` when none is kept.
    fn exact_peak_in_bucket(&self, edge: f64) -> f64 {
        let lower = edge / Buckets::MEMORY.ratio;
        self.kept_peaks()
            .map(|(_, peak)| peak)
            .filter(|peak| *peak > lower && *peak <= edge)
            .reduce(f64::max)
            .unwrap_or(edge)
    }

    /// The memory histogram including the open window's peak so far.
    fn memory_with_open_window(&self) -> DecayingHistogram {
        let mut h = self.memory_peaks.clone();
        if self.window_peak > 0.0 {
            h.add(self.window_peak, 1.0, self.window_start);
        }
        h
    }
}

/// A decaying histogram of the means of fixed windows of CPU samples, and the open window
/// (its index since the epoch, the sum and count of its samples).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct WindowMeans {
    seconds: i64,
    means: DecayingHistogram,
    open: Option<(i64, f64, u32)>,
}

impl WindowMeans {
    fn new(seconds: i64, half_life: f64, start: i64) -> WindowMeans {
        WindowMeans {
            seconds,
            means: DecayingHistogram::new(Buckets::CPU, half_life, start),
            open: None,
        }
    }

    /// Adds a sample; a sample of a later window closes the open one into the histogram,
    /// a late sample of a closed window is dropped.
    fn add(&mut self, t: i64, cores: f64) {
        let w = t.div_euclid(self.seconds);
        match &mut self.open {
            Some((open, sum, n)) if *open == w => {
                *sum += cores;
                *n += 1;
            }
            Some((open, _, _)) if *open > w => {}
            _ => {
                if let Some((open, sum, n)) = self.open.take() {
                    self.means
                        .add((sum / f64::from(n)).max(0.001), 1.0, open * self.seconds);
                }
                self.open = Some((w, cores, 1));
            }
        }
    }

    /// The histogram with the open window in it; `None` when empty.
    fn with_open(&self) -> Option<DecayingHistogram> {
        let mut h = self.means.clone();
        if let Some((w, sum, n)) = self.open {
            h.add(
                (sum / f64::from(n.max(1))).max(0.001),
                1.0,
                w * self.seconds,
            );
        }
        (!h.is_empty()).then_some(h)
    }
}

/// A container's requests and limits: CPU in millicores, memory in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Requests {
    /// CPU request, millicores.
    pub cpu: Option<i64>,
    /// Memory request, bytes.
    pub memory: Option<i64>,
    /// CPU limit, millicores.
    pub cpu_limit: Option<i64>,
    /// Memory limit, bytes.
    pub memory_limit: Option<i64>,
}

/// What else the recommendation depends on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Context {
    /// An HPA scales this workload on CPU.
    pub hpa_on_cpu: bool,
    /// An HPA scales this workload on memory.
    pub hpa_on_memory: bool,
    /// The largest allocatable CPU (millicores) and memory (bytes) a node can offer.
    pub largest_node: Option<(i64, i64)>,
    /// USD per core-hour and per GiB-hour of requested capacity.
    pub prices: Prices,
    /// The cores of waste one whole share of starved CPU samples is worth, the same for
    /// every container of a fleet; `None` uses the policy's starvation weight.
    pub cpu_starvation_price: Option<f64>,
}

/// What a core and a GiB of requests cost per hour, from the catalog.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Prices {
    /// USD per requested core-hour.
    pub per_core_hour: f64,
    /// USD per requested GiB-hour.
    pub per_gib_hour: f64,
}

impl Prices {
    /// Prices from instance types: each type's price split evenly between its allocatable
    /// cores and GiB, and the median over types taken, so one odd size does not skew it.
    pub fn from_instance_types(types: &[crate::model::InstanceType]) -> Prices {
        let mut per_core = Vec::new();
        let mut per_gib = Vec::new();
        for t in types {
            let Some(price) = t
                .offerings
                .iter()
                .filter(|o| !o.price_is_estimate)
                .map(|o| o.price_per_hour)
                .reduce(f64::min)
            else {
                continue;
            };
            let cores = t.allocatable.cpu as f64 / 1000.0;
            let gib = t.allocatable.memory as f64 / GIB;
            if cores > 0.0 && gib > 0.0 {
                per_core.push(price / 2.0 / cores);
                per_gib.push(price / 2.0 / gib);
            }
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        };
        Prices {
            per_core_hour: median(per_core),
            per_gib_hour: median(per_gib),
        }
    }
}

/// A recommendation for one container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerRecommendation {
    /// Current requests and limits.
    pub current: Requests,
    /// Recommended requests and limits.
    pub recommended: Requests,
    /// Lower bound: below this the container is likely starved (CPU millicores, memory bytes).
    pub lower: (Option<i64>, Option<i64>),
    /// Upper bound: above this is likely waste.
    pub upper: (Option<i64>, Option<i64>),
    /// 0..1: how much history supports the numbers (1 = a week or more).
    pub confidence: f64,
    /// Whether the history is long enough for autonomous changes.
    pub actionable: bool,
    /// Why the numbers are what they are, in words.
    pub reasons: Vec<String>,
    /// USD per hour the change saves (negative) or costs (positive).
    pub hourly_cost_delta: f64,
    /// The memory increase follows an OOM kill: actuation applies it whole, not held back
    /// by the maximum step.
    #[serde(default)]
    pub memory_urgent: bool,
    /// The CPU target (cores) the usage gives at this hour, before the day's mean and the
    /// policy's bounds: what [`ContainerHistory::note_cpu_target`] keeps for the next
    /// rounds.
    #[serde(skip)]
    pub cpu_target_cores: Option<f64>,
}

fn clamp_opt(v: f64, lo: Option<i64>, hi: Option<i64>) -> f64 {
    let v = lo.map_or(v, |l| v.max(l as f64));
    hi.map_or(v, |h| v.min(h as f64))
}

/// One resource's recommendation before limits: the new request and its bounds.
struct Sized {
    request: Option<i64>,
    lower: Option<i64>,
    upper: Option<i64>,
}

impl Sized {
    /// A request with bounds that hold it: policy floors, the burst guard, hysteresis and
    /// the maximum step can move the request outside the percentile range, and a lower
    /// bound above the recommendation (or an upper one below it) would contradict it.
    fn around(request: i64, lower: f64, upper: f64, unit: i64) -> Self {
        let lower = ((lower / unit as f64).floor() as i64).saturating_mul(unit);
        let upper = ((upper / unit as f64).ceil() as i64).saturating_mul(unit);
        Sized {
            request: Some(request),
            lower: Some(lower.clamp(0, request)),
            upper: Some(upper.max(request)),
        }
    }
}

/// What a container's CPU request is sized from besides the trade level: the policy's
/// percentile, the burst guard's percentile within its headroom, and the per-container
/// floors of the profile (cores; 0 where the profile sets none).
#[derive(Debug, Clone, Copy)]
struct CpuBasis {
    percentile: f64,
    burst: f64,
    /// Leaves at most `policy.cpu_short_cap` of the samples above it.
    short: f64,
    /// Leaves at most `policy.cpu_severe_cap` of the windows above twice it.
    severe: f64,
    /// Covers the running phase's median window, and the phase's share of windows.
    phase: Option<(f64, f64)>,
}

impl CpuBasis {
    fn of(history: &ContainerHistory, policy: &Policy) -> CpuBasis {
        let windows = history
            .cpu_windows
            .as_ref()
            .and_then(WindowMeans::with_open);
        let phases = history.cpu_phases.as_ref().and_then(WindowMeans::with_open);
        // The reference a container is never made worse than: VPA's rule on the same
        // history (its CPU percentile plus its margin). Each cap is at least what that
        // reference leaves short.
        let reference =
            history.cpu.percentile(REFERENCE_PERCENTILE).unwrap_or(0.0) * (1.0 + REFERENCE_MARGIN);
        let short = if policy.cpu_short_cap > 0.0 {
            let cap = policy.cpu_short_cap.max(history.cpu_share_above(reference));
            history.cpu.percentile(1.0 - cap).unwrap_or(0.0)
        } else {
            0.0
        };
        let severe = match &windows {
            Some(w) if policy.cpu_severe_cap > 0.0 => {
                let cap = policy
                    .cpu_severe_cap
                    .max(1.0 - w.share_at_or_below(SEVERE_FACTOR * reference));
                w.percentile(1.0 - cap).unwrap_or(0.0) / SEVERE_FACTOR
            }
            _ => 0.0,
        };
        let phase = match &phases {
            Some(w) if policy.cpu_running_phase => {
                let median = history.cpu.percentile(0.5).unwrap_or(0.0);
                let share = 1.0 - w.share_at_or_below(PHASE_FACTOR * median);
                (median > 0.0 && share >= PHASE_MIN_SHARE).then(|| {
                    (
                        w.percentile(1.0 - share * (1.0 - PHASE_PERCENTILE))
                            .unwrap_or(0.0),
                        share,
                    )
                })
            }
            _ => None,
        };
        CpuBasis {
            percentile: history
                .cpu
                .percentile(policy.cpu_percentiles.0)
                .unwrap_or(0.0),
            burst: policy.cpu_burst.map_or(0.0, |(bp, headroom)| {
                history.cpu.percentile(bp).unwrap_or(0.0) / headroom
            }),
            short,
            severe,
            phase,
        }
    }

    /// The highest of the profile's per-container floors, cores.
    fn floor(&self) -> f64 {
        self.short
            .max(self.severe)
            .max(self.phase.map_or(0.0, |p| p.0))
    }

    /// The body (the percentile, raised to the trade level and the floors) and the burst
    /// guard, cores.
    fn body_and_burst(&self, level: Option<f64>, policy: &Policy) -> (f64, f64) {
        let body = level
            .map_or(self.percentile, |l| l.max(self.percentile))
            .max(self.floor());
        // Bursts: the request covers the burst percentile within the burst headroom.
        // Covering a burst is worth it while it raises the request moderately; a rare
        // burst far above the body (a batch spike) is left to the node's slack.
        let burst = if policy.cpu_burst_cap > 0.0 && self.burst > body * policy.cpu_burst_cap {
            body
        } else {
            self.burst
        };
        (body, burst)
    }

    /// The CPU request within the policy's floor and ceiling, cores, as [`recommend`] sets
    /// it before the largest node's ceiling.
    fn target(&self, level: Option<f64>, policy: &Policy) -> f64 {
        let (body, burst) = self.body_and_burst(level, policy);
        let (floor, ceiling) = policy.cpu_bounds;
        clamp_opt(
            body.max(burst) * (1.0 + policy.cpu_margin) * 1000.0,
            floor,
            ceiling,
        ) / 1000.0
    }
}

/// The starvation price (cores of waste one whole share of starved samples is worth) at
/// which the CPU targets of `histories`, all under `policy`, starve
/// `policy.cpu_starvation_budget` of the fleet's samples in their own history (each
/// container weighing by its samples): the lowest such price, so the fleet reserves as
/// little as the budget allows, and its starved samples fall where sparing them would
/// reserve the most cores. The same price in every container is the optimum for the
/// fleet's totals: a relative weight per container spends the budget where it saves
/// little. `None` when the policy sets no budget or no history has CPU samples; the
/// highest price tried when even that starves more than the budget (the floors of the
/// percentile and the burst guard bind first).
pub fn cpu_starvation_price<'a>(
    histories: impl IntoIterator<Item = &'a ContainerHistory>,
    policy: &Policy,
) -> Option<f64> {
    let budget = policy.cpu_starvation_budget;
    if !policy.cpu || budget <= 0.0 {
        return None;
    }
    struct Member {
        points: Vec<super::histogram::TradePoint>,
        basis: CpuBasis,
        weight: f64,
    }
    let mut members = Vec::new();
    let (mut smallest, mut largest) = (f64::INFINITY, 0.0f64);
    for history in histories {
        let Some(mean) = history.cpu.mean().filter(|m| *m > 0.0) else {
            continue;
        };
        smallest = smallest.min(mean);
        largest = largest.max(mean);
        members.push(Member {
            points: history.cpu.trade_points(),
            basis: CpuBasis::of(history, policy),
            weight: history.samples.max(1) as f64,
        });
    }
    if members.is_empty() {
        return None;
    }
    let total: f64 = members.iter().map(|m| m.weight).sum();
    let starved = |price: f64| {
        members
            .iter()
            .map(|m| {
                let level = super::histogram::cheapest(&m.points, price);
                m.weight * super::histogram::share_above(&m.points, m.basis.target(level, policy))
            })
            .sum::<f64>()
            / total
    };
    // A price of a thousandth of the smallest mean buys no coverage; a thousand times the
    // largest covers every sample any container has.
    let (mut lo, mut hi) = (smallest * 1e-3, largest * 1e3);
    if starved(lo) <= budget {
        return Some(lo);
    }
    if starved(hi) > budget {
        return Some(hi);
    }
    // The starved share falls as the price rises (a higher price never lowers a level):
    // halve the ratio between a price starving too much and one within the budget.
    for _ in 0..PRICE_STEPS {
        let mid = (lo * hi).sqrt();
        if starved(mid) > budget {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(hi)
}

/// Bisection steps of [`cpu_starvation_price`]: the price is found within a factor of
/// `(1e6 * largest / smallest)^(2^-30)`, far finer than the buckets' 5%.
const PRICE_STEPS: usize = 30;

/// The CPU limit a recommendation sets, from the one the limits policy gives: never lower
/// than the deployed limit of a container that was throttled (in at least
/// [`THROTTLED_CONTAINER_SHARE`] of its minutes), and, where Tailor scales the limit
/// (`KeepRatio`), never below the container's high-percentile demand with headroom, so a
/// container that was not throttled is not throttled by a lowered limit. Says why a limit
/// was kept, raised or removed.
fn guard_cpu_limit(
    history: &ContainerHistory,
    policy: &Policy,
    deployed: Option<i64>,
    limit: Option<i64>,
    reasons: &mut Vec<String>,
) -> Option<i64> {
    let Some(mut limit) = limit else {
        if let Some(deployed) = deployed {
            reasons.push(format!(
                "cpu limit {} removed (limits policy {:?}): nothing throttles the container",
                format_milli(deployed),
                policy.limits
            ));
        }
        return None;
    };
    if let (Some(deployed), Some(share)) = (deployed, history.throttled_share())
        && share >= THROTTLED_CONTAINER_SHARE
        && limit < deployed
    {
        reasons.push(format!(
            "cpu limit kept at {}: the container was throttled in {:.1}% of its minutes, and a throttled container's limit is never lowered",
            format_milli(deployed),
            100.0 * share
        ));
        limit = deployed;
    }
    if policy.limits == LimitsPolicy::KeepRatio
        && let Some(top) = history.cpu.percentile(LIMIT_PERCENTILE)
    {
        let floor = (top * (1.0 + LIMIT_HEADROOM) * 1000.0).ceil() as i64;
        if limit < floor {
            reasons.push(format!(
                "cpu limit raised to {} (the request's ratio gives {}): {:.1}% above the {:.1}th percentile of the container's demand, so the limit does not throttle it",
                format_milli(floor),
                format_milli(limit),
                100.0 * LIMIT_HEADROOM,
                100.0 * LIMIT_PERCENTILE
            ));
            limit = floor;
        }
    }
    Some(limit)
}

/// Why the CPU request sits at a profile floor above the trade level.
fn floor_reason(
    history: &ContainerHistory,
    basis: &CpuBasis,
    floor: f64,
    policy: &Policy,
) -> String {
    let at = format_milli((floor * 1000.0).ceil() as i64);
    match basis.phase {
        Some((level, share)) if level >= floor => format!(
            "cpu covers the running phase at {at}: {:.1}% of 15-minute windows run above {:.0} times the median use (a batch worker's bursts), and the request is their median, not the idle minutes'",
            100.0 * share,
            PHASE_FACTOR
        ),
        _ if basis.severe >= floor => format!(
            "cpu raised to {at}: at most {:.1}% of 5-minute windows may average more than twice the request",
            100.0 * policy.cpu_severe_cap
        ),
        _ => format!(
            "cpu raised to {at}: at most {:.0}% of minutes may be short of the request ({:.1}% in the history at {at})",
            100.0 * policy.cpu_short_cap,
            100.0 * history.cpu_share_above(floor)
        ),
    }
}

/// Under the cost-first profile, what a request below the Balanced profile's floors
/// trades: the container's short minutes against the Balanced profile's.
fn cost_first_trade(history: &ContainerHistory, policy: &Policy, body: f64) -> Option<String> {
    let (_, short_cap, severe_cap) = super::policy::profile_trade(Profile::Balanced);
    let balanced = Policy {
        cpu_short_cap: short_cap,
        cpu_severe_cap: severe_cap,
        ..policy.clone()
    };
    let floor = CpuBasis::of(history, &balanced).floor();
    (floor > body * 1.005).then(|| {
        format!(
            "cost-first profile: cpu {} leaves {:.1}% of minutes short in the history, where the Balanced profile would request {} ({:.1}% short)",
            format_milli((body * 1000.0).ceil() as i64),
            100.0 * history.cpu_share_above(body),
            format_milli((floor * 1000.0).ceil() as i64),
            100.0 * history.cpu_share_above(floor)
        )
    })
}

/// Builds the recommendation for a container at `now`.
pub fn recommend(
    history: &ContainerHistory,
    current: Requests,
    policy: &Policy,
    context: &Context,
    now: i64,
) -> ContainerRecommendation {
    let mut reasons = Vec::new();
    let span = history.span_seconds();
    let days = (span as f64 / 86_400.0).max(1.0 / 24.0);
    let coverage = history.coverage();
    let confidence = (span as f64 / FULL_CONFIDENCE_SECONDS).clamp(0.0, 1.0) * coverage;
    let mut actionable = span >= policy.minimum_history;
    if !actionable {
        reasons.push(format!(
            "only {}h of history (minimum {}h): recommendation shown, nothing applied automatically",
            span / 3600,
            policy.minimum_history / 3600
        ));
    }
    if coverage < MIN_COVERAGE {
        // Partial data: the numbers rest on too little of the window to act on.
        actionable = false;
        reasons.push(format!(
            "samples cover only {:.0}% of the history (gaps in the usage data): confidence lowered, nothing applied automatically",
            coverage * 100.0
        ));
    }
    // Bounds widen while history is short (VPA's confidence multipliers).
    let upper_widen = 1.0 + 1.0 / days;
    let lower_narrow = (1.0 + 0.001 / days).powi(-2);
    let margin = 1.0 + policy.cpu_margin;
    let memory_margin = 1.0 + policy.memory_margin;

    // CPU.
    let mut cpu_target_cores = None;
    let cpu = if policy.cpu && !history.cpu.is_empty() {
        let (_, lo, hi) = policy.cpu_percentiles;
        let basis = CpuBasis::of(history, policy);
        let level = match context.cpu_starvation_price {
            Some(price) => history.cpu.level_minimising_waste_at_price(price),
            None if policy.cpu_starvation_weight > 0.0 => history
                .cpu
                .level_minimising_waste_and_starvation(policy.cpu_starvation_weight),
            None => None,
        };
        let (body, burst) = basis.body_and_burst(level, policy);
        let floor = basis.floor();
        let traded = level.map_or(basis.percentile, |l| l.max(basis.percentile));
        if floor > traded {
            reasons.push(floor_reason(history, &basis, floor, policy));
        } else if policy.profile == Profile::CostFirst
            && let Some(reason) = cost_first_trade(history, policy, body)
        {
            reasons.push(reason);
        }
        if let Some(level) = level
            && body > basis.percentile
            && level >= floor
        {
            // Where the usage's top is dense (smooth daily or weekly cycles), covering it
            // costs little: the request rises to where more would only add waste.
            reasons.push(format!(
                "cpu covers the usage up to {} ({:.0}% of samples): above it, more would waste more than it spares",
                format_milli((level * 1000.0).ceil() as i64),
                100.0 * history.cpu.share_at_or_below(level)
            ));
        }
        let raw = body.max(burst) * margin;
        cpu_target_cores = Some(raw);
        let (day_mean, hours) = history.cpu_target_over_day(now, raw, policy.min_change);
        if hours > 1 && (day_mean - raw).abs() > raw * policy.min_change {
            reasons.push(format!(
                "cpu is the mean of {hours} hourly targets of the last 24 hours ({} now): the hour of day does not move it",
                format_milli((raw * 1000.0).ceil() as i64)
            ));
        }
        let target = day_mean * 1000.0;
        let lower = history.cpu.percentile(lo).unwrap_or(0.0) * margin * 1000.0 * lower_narrow;
        let upper = history.cpu.percentile(hi).unwrap_or(0.0) * margin * 1000.0 * upper_widen;
        let node_max = context.largest_node.map(|(c, _)| c);
        let (floor, ceiling) = policy.cpu_bounds;
        let ceiling = match (ceiling, node_max) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut value = clamp_opt(target, floor, ceiling);
        if value > target + 0.5 {
            reasons.push(format!(
                "cpu raised to the policy minimum {}",
                format_milli(value.ceil() as i64)
            ));
        } else if value + 0.5 < target {
            reasons.push(format!(
                "cpu capped at {} (policy maximum or largest node)",
                format_milli(value as i64)
            ));
        }
        if context.hpa_on_cpu && policy.hpa == HpaPolicy::Skip {
            reasons.push("an HPA scales this workload on cpu: cpu request left as is".to_string());
            value = current.cpu.map_or(value, |c| c as f64);
        }
        let value = settle(
            "cpu",
            value,
            current.cpu,
            policy,
            Increase::Compressible,
            &mut reasons,
            format_milli,
        );
        Some(Sized::around(
            value.max(1),
            lower,
            clamp_opt(upper, None, ceiling),
            1,
        ))
    } else {
        None
    };

    // Memory.
    let mut memory_urgent = false;
    let memory_hist = history.memory_with_open_window();
    let memory = if policy.memory && !memory_hist.is_empty() {
        let (p, lo, hi) = policy.memory_percentiles;
        let mut percentile = memory_hist.percentile(p).unwrap_or(0.0);
        if policy.memory_peak_days > 0 {
            // The histogram answers with its bucket's upper edge, up to 5% above the peak
            // it stands for; the exact peak is known when it is still kept.
            percentile = history.exact_peak_in_bucket(percentile);
        }
        let mut target = percentile * memory_margin;
        if policy.memory_peak_days > 0
            && let Some(peak) = history.highest_peak_since(
                now - i64::from(policy.memory_peak_days) * MEMORY_WINDOW_SECONDS,
            )
            && peak * memory_margin > target
        {
            target = peak * memory_margin;
            reasons.push(format!(
                "memory covers the highest daily peak of the last {} days ({})",
                policy.memory_peak_days,
                display_bytes(peak as i64)
            ));
        }
        if let Some(next_run) = history.next_run_peak()
            && next_run * memory_margin > target
        {
            // A Job's run peaks with its input, and a short run's peak is not in the daily
            // peaks the way a long-running pod's is: size for the next run's likely peak.
            target = next_run * memory_margin;
            reasons.push(format!(
                "runs are intermittent (a Job): memory sized for the next run's likely peak {} from {} runs",
                display_bytes(next_run as i64),
                history.run_peaks.len()
            ));
        }
        let runs = history.run_peaks.len();
        // Intermittent: pods ran less than half the time (a long-running workload down for
        // a while once has a closed run too, and is not held by this rule).
        if runs > 0
            && runs < RUNS_TO_CUT_MEMORY
            && history.running_share() < INTERMITTENT_SHARE
            && let Some(deployed) = current.memory.map(|m| m as f64)
            && deployed > target
        {
            target = deployed;
            reasons.push(format!(
                "runs are intermittent (a Job): memory kept at its request {} until {RUNS_TO_CUT_MEMORY} runs are seen ({runs} so far), as a run peaking above all {runs} comes with chance 1/{}",
                display_bytes(deployed as i64),
                runs + 1
            ));
        }
        if policy.memory_trend
            && let Some(projected) = history.projected_peak()
            && projected * memory_margin > target
        {
            target = projected * memory_margin;
            reasons.push(format!(
                "daily memory peaks are rising: sized for {} expected by tomorrow",
                display_bytes(projected as i64)
            ));
        }
        let mut oom_driven = false;
        // Killed at its current size (or above it): any increase, whichever rule sets it,
        // is not held back by the maximum step.
        let mut killed_at_this_size = false;
        let lower = memory_hist.percentile(lo).unwrap_or(0.0) * memory_margin * lower_narrow;
        let upper = memory_hist.percentile(hi).unwrap_or(0.0) * memory_margin * upper_widen;
        let window_start = now - policy.history_window;
        for oom in history.ooms.iter().filter(|o| o.at >= window_start) {
            // As VPA does: the container needed more than it had, which is at least the
            // measured peak and at least its request.
            let request = oom
                .request
                .unwrap_or_else(|| current.memory.unwrap_or(0) as f64);
            let at_kill = oom.memory.max(request);
            // What it was killed at as recorded; the current request stands in only for
            // the bump, as it may have grown since.
            let recorded = oom.memory.max(oom.request.unwrap_or(0.0));
            killed_at_this_size |= current.memory.is_some_and(|m| m as f64 <= recorded);
            let bumped = (at_kill * (1.0 + policy.oom_bump_fraction))
                .max(at_kill + policy.oom_min_bump as f64);
            if bumped > target {
                target = bumped;
                oom_driven = true;
                reasons.push(format!(
                    "memory bumped to {} after an OOM kill at {}",
                    display_bytes(bumped as i64),
                    jiff::Timestamp::from_second(oom.at)
                        .map_or_else(|_| oom.at.to_string(), |t| t.to_string())
                ));
            }
        }
        let node_max = context.largest_node.map(|(_, m)| m);
        let (floor, ceiling) = policy.memory_bounds;
        let ceiling = match (ceiling, node_max) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut value = clamp_opt(target, floor, ceiling);
        if value > target + 1.0 {
            reasons.push(format!(
                "memory raised to the policy minimum {}",
                display_bytes(value as i64)
            ));
        } else if value + 1.0 < target {
            reasons.push(format!(
                "memory capped at {} (policy maximum or largest node)",
                display_bytes(value as i64)
            ));
        }
        if context.hpa_on_memory && policy.hpa == HpaPolicy::Skip {
            reasons.push(
                "an HPA scales this workload on memory: memory request left as is".to_string(),
            );
            value = current.memory.map_or(value, |m| m as f64);
        }
        // Memory is rounded up to whole MiB: a request is never cut below the evidence.
        let mib = (1 << 20) as f64;
        let value = (value / mib).ceil() * mib;
        // An increase forced by an OOM kill is not held back by the maximum step: the
        // container is being killed at its current size. Nor is a larger one another rule
        // sets while the container is killed at that size: stepping towards it would leave
        // the container below what it needs, and killed again, for several changes.
        let urgent =
            oom_driven || (killed_at_this_size && current.memory.is_some_and(|m| value > m as f64));
        if urgent && !oom_driven {
            reasons.push(format!(
                "memory raised in one change: OOM-killed at its current size {}",
                display_bytes(current.memory.unwrap_or(0))
            ));
        }
        let value = settle(
            "memory",
            value,
            current.memory,
            policy,
            if urgent {
                Increase::Urgent
            } else {
                Increase::Incompressible
            },
            &mut reasons,
            format_value,
        );
        memory_urgent = urgent;
        // Bounds in whole MiB, like the request, so they print as quantities.
        Some(Sized::around(
            value,
            lower,
            clamp_opt(upper, None, ceiling),
            1 << 20,
        ))
    } else {
        None
    };

    // Limits.
    let new_cpu = cpu.as_ref().and_then(|s| s.request).or(current.cpu);
    let new_memory = memory.as_ref().and_then(|s| s.request).or(current.memory);
    let ratio_limit =
        |limit: Option<i64>, old: Option<i64>, new: Option<i64>| match (limit, old, new) {
            (Some(l), Some(o), Some(n)) if o > 0 => {
                Some(((l as f64) * (n as f64) / (o as f64)).ceil() as i64)
            }
            (l, _, _) => l,
        };
    let (cpu_limit, memory_limit) = match policy.limits {
        LimitsPolicy::KeepRatio => (
            ratio_limit(current.cpu_limit, current.cpu, new_cpu),
            ratio_limit(current.memory_limit, current.memory, new_memory),
        ),
        LimitsPolicy::DropCpu => (
            None,
            ratio_limit(current.memory_limit, current.memory, new_memory),
        ),
        LimitsPolicy::Keep => (current.cpu_limit, current.memory_limit),
        LimitsPolicy::Remove => (None, None),
    };
    let cpu_limit = guard_cpu_limit(history, policy, current.cpu_limit, cpu_limit, &mut reasons);
    // A limit below the request is invalid: raise it to the request.
    let cpu_limit = cpu_limit.map(|l| l.max(new_cpu.unwrap_or(0)));
    let memory_limit = memory_limit.map(|l| l.max(new_memory.unwrap_or(0)));

    let delta_cores = (new_cpu.unwrap_or(0) - current.cpu.unwrap_or(0)) as f64 / 1000.0;
    let delta_gib = (new_memory.unwrap_or(0) - current.memory.unwrap_or(0)) as f64 / GIB;
    let hourly_cost_delta =
        delta_cores * context.prices.per_core_hour + delta_gib * context.prices.per_gib_hour;

    ContainerRecommendation {
        current,
        recommended: Requests {
            cpu: new_cpu,
            memory: new_memory,
            cpu_limit,
            memory_limit,
        },
        lower: (
            cpu.as_ref().and_then(|s| s.lower),
            memory.as_ref().and_then(|s| s.lower),
        ),
        upper: (
            cpu.as_ref().and_then(|s| s.upper),
            memory.as_ref().and_then(|s| s.upper),
        ),
        confidence,
        actionable,
        reasons,
        hourly_cost_delta,
        memory_urgent,
        cpu_target_cores,
    }
}

/// How an increase of a request is treated by [`settle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Increase {
    /// CPU: a small increase is not made (hysteresis), a large one is stepped.
    Compressible,
    /// Memory: every increase is made; a large one is stepped.
    Incompressible,
    /// Memory after an OOM kill: made whole, not stepped.
    Urgent,
}

/// Applies hysteresis against the current request. The maximum step is not applied here:
/// it limits how far one change moves a running pod ([`next_step`]), never the target
/// reported. When the target is further than the step, a reason says so.
fn settle(
    what: &str,
    target: f64,
    current: Option<i64>,
    policy: &Policy,
    increase: Increase,
    reasons: &mut Vec<String>,
    show: impl Fn(i64) -> String,
) -> i64 {
    let target = target.ceil() as i64;
    let Some(current) = current.filter(|c| *c > 0) else {
        return target;
    };
    let change = (target - current) as f64 / current as f64;
    // Memory is not compressible: a request a little below the evidence is not kept for
    // the sake of a small change, it is what an OOM kill (or reclaim) starts from.
    let holdable = change <= 0.0 || increase == Increase::Compressible;
    if change.abs() < policy.min_change && holdable {
        if target != current {
            reasons.push(format!(
                "{what} within {:.0}% of the current request: unchanged",
                policy.min_change * 100.0
            ));
        }
        return current;
    }
    let held_back = !(increase == Increase::Urgent && change > 0.0);
    if held_back && policy.max_step > 0.0 && change.abs() > policy.max_step {
        reasons.push(format!(
            "{what} is applied at most {:.0}% per change: {} next, {} is the target",
            policy.max_step * 100.0,
            show(stepped(current, target, policy.max_step)),
            show(target)
        ));
    }
    target
}

/// `current` moved towards `target` by at most `max_step` of `current` (0: no limit).
fn stepped(current: i64, target: i64, max_step: f64) -> i64 {
    if current <= 0 || max_step <= 0.0 {
        return target;
    }
    let change = (target - current) as f64 / current as f64;
    if change.abs() <= max_step {
        target
    } else if change > 0.0 {
        (current as f64 * (1.0 + max_step)).ceil() as i64
    } else {
        (current as f64 * (1.0 - max_step)).ceil() as i64
    }
}

/// The requests to apply next on the way from `current` to a recommendation: each request
/// moves at most `max_step` (a fraction of the current request) per change, except a memory
/// increase forced by an OOM kill, which is applied whole (the container is being killed at
/// its current size). A limit moves with its request, in proportion, from the current
/// limit to the recommended one (so a policy's ratio is kept, and a kept limit stays), and
/// is never set below the recommended request: a limit reserves nothing on the node, and
/// one stepped below the evidence would kill (memory) or throttle (CPU) the container
/// while its request is on the way. The recommendation itself is never cut: this is for
/// actuation only.
pub fn next_step(
    current: Requests,
    recommendation: &ContainerRecommendation,
    max_step: f64,
) -> Requests {
    let target = recommendation.recommended;
    let step = |now: Option<i64>, to: Option<i64>, urgent: bool| match (now, to) {
        (Some(n), Some(t)) if urgent && t > n => Some(t),
        (Some(n), Some(t)) => Some(stepped(n, t, max_step)),
        (_, t) => t,
    };
    let cpu = step(current.cpu, target.cpu, false);
    let memory = step(current.memory, target.memory, recommendation.memory_urgent);
    // From (current request, current limit) to (target request, target limit), the
    // limit in proportion to how far the request moved; at least the target request.
    let follow = |now: Option<i64>,
                  limit_now: Option<i64>,
                  to: Option<i64>,
                  limit_to: Option<i64>,
                  applied: Option<i64>| {
        let limit_to = limit_to?;
        let limit = match (now, limit_now, to, applied) {
            (Some(n), Some(ln), Some(t), Some(a)) if t != n => {
                let moved = (a - n) as f64 / (t - n) as f64;
                (ln as f64 + (limit_to - ln) as f64 * moved).ceil() as i64
            }
            _ => limit_to,
        };
        Some(limit.max(to.unwrap_or(0)).max(applied.unwrap_or(0)))
    };
    Requests {
        cpu,
        memory,
        cpu_limit: follow(
            current.cpu,
            current.cpu_limit,
            target.cpu,
            target.cpu_limit,
            cpu,
        ),
        memory_limit: follow(
            current.memory,
            current.memory_limit,
            target.memory,
            target.memory_limit,
            memory,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400;
    const MIB: i64 = 1 << 20;

    /// The default policy without the maximum step, with CPU sized by the percentile alone
    /// (the starvation weight and budget have their own tests) and a 10% CPU margin (the
    /// default has none), so that the tests can tell the margin's share of a request from
    /// the level under it. The percentile (70th) and the burst guard (the 99th within
    /// twice the request) are fixed here, not taken from the defaults, which are tuned on
    /// the backtest: the tests check the mechanisms.
    fn cost_first() -> Policy {
        Policy::from_spec(&crate::apis::RightsizingPolicySpec {
            profile: Profile::CostFirst,
            ..Default::default()
        })
        .expect("the cost-first profile")
    }

    /// A policy sizing CPU by the percentile, margin and burst guard alone: the
    /// per-container floors of the Balanced profile are tested on their own.
    fn policy() -> Policy {
        Policy {
            max_step: 0.0,
            cpu_starvation_weight: 0.0,
            cpu_short_cap: 0.0,
            cpu_severe_cap: 0.0,
            cpu_running_phase: false,
            cpu_margin: 0.1,
            cpu_percentiles: (0.7, 0.5, 0.95),
            cpu_burst: Some((0.99, 2.0)),
            ..Policy::default()
        }
    }

    /// [`policy`] with a 50% maximum step per change, the default's.
    fn stepped_policy() -> Policy {
        Policy {
            max_step: 0.5,
            ..policy()
        }
    }

    /// `days` of minute samples of a daily cycle between `low` and `high` cores, when
    /// `burst` is `None`; otherwise `low` cores with `high`-core bursts every `burst`
    /// minutes. Memory flat at 500 MiB.
    fn cpu_history(days: i64, low: f64, high: f64, burst: Option<i64>) -> ContainerHistory {
        let mut h = ContainerHistory::new(&policy(), 0);
        for m in 0..days * 1440 {
            let cores = match burst {
                None => {
                    let angle = 2.0 * std::f64::consts::PI * (m % 1440) as f64 / 1440.0;
                    low + (high - low) * (0.5 + 0.5 * angle.sin())
                }
                Some(every) if m % every == 0 => high,
                Some(_) => low,
            };
            h.add_cpu(m * 60, cores);
            h.add_memory(m * 60, (500 * MIB) as f64);
        }
        h
    }

    #[test]
    fn a_smooth_daily_cycle_is_covered_up_to_its_dense_top() {
        let h = cpu_history(7, 0.1, 1.0, None);
        let weighted = Policy {
            cpu_starvation_weight: 3.0,
            ..policy()
        };
        let r = recommend(
            &h,
            Requests::default(),
            &weighted,
            &Context::default(),
            7 * DAY,
        );
        let cpu = r.recommended.cpu.expect("cpu");
        // The top of a sine is where its samples crowd: the request covers it (0.95 core
        // or more, plus 10%)...
        assert!(cpu >= 1040, "{cpu} {:?}", r.reasons);
        assert!(
            r.reasons.iter().any(|x| x.contains("more would waste")),
            "{:?}",
            r.reasons
        );
        // ...where the sustained percentile alone (p70 + 10%, about 0.9 core) leaves
        // demand above the request a fifth of the day.
        let plain = recommend(
            &h,
            Requests::default(),
            &policy(),
            &Context::default(),
            7 * DAY,
        );
        assert!(plain.recommended.cpu.expect("cpu") < 950, "{plain:?}");
    }

    #[test]
    fn rare_bursts_far_above_the_body_are_not_reserved_all_day() {
        // 50m with a 2-core burst one minute in twenty.
        let h = cpu_history(7, 0.05, 2.0, Some(20));
        let r = recommend(
            &h,
            Requests::default(),
            &Policy {
                max_step: 0.0,
                ..Policy::default()
            },
            &Context::default(),
            7 * DAY,
        );
        let cpu = r.recommended.cpu.expect("cpu");
        assert!(cpu < 100, "{cpu} {:?}", r.reasons);
    }

    #[test]
    fn a_small_memory_increase_is_made_while_a_small_cpu_increase_is_not() {
        // The evidence asks for about 451m and 520 MiB; the requests are a little below.
        let h = history(7);
        let r = recommend(
            &h,
            current(420, 505 * MIB),
            &policy(),
            &Context::default(),
            7 * DAY,
        );
        // Memory below the highest recent peak is what an OOM kill starts from: raised.
        assert_eq!(r.recommended.memory, Some(520 * MIB), "{:?}", r.reasons);
        // CPU is compressible: a change within 10% is not worth a resize.
        assert_eq!(r.recommended.cpu, Some(420), "{:?}", r.reasons);
        // A small memory decrease is still not made.
        let r = recommend(
            &h,
            current(420, 540 * MIB),
            &policy(),
            &Context::default(),
            7 * DAY,
        );
        assert_eq!(r.recommended.memory, Some(540 * MIB), "{:?}", r.reasons);
    }

    /// `days` of minute samples: CPU cycling 0.1..=0.5 cores, memory 400-500 MiB.
    fn history(days: i64) -> ContainerHistory {
        let mut h = ContainerHistory::new(&policy(), 0);
        for m in 0..days * 1440 {
            let t = m * 60;
            h.add_cpu(t, 0.1 + (m % 5) as f64 * 0.1);
            h.add_memory(t, ((400 + (m % 101)) * MIB) as f64);
        }
        h
    }

    fn current(cpu: i64, memory: i64) -> Requests {
        Requests {
            cpu: Some(cpu),
            memory: Some(memory),
            cpu_limit: Some(cpu * 2),
            memory_limit: Some(memory * 2),
        }
    }

    #[test]
    fn cpu_is_the_sustained_percentile_plus_margin_and_memory_the_highest_peak_plus_margin() {
        let h = history(7);
        let r = recommend(
            &h,
            current(2000, 2048 * MIB),
            &policy(),
            &Context::default(),
            7 * DAY,
        );
        // p70 of {0.1..0.5} is 0.4 (within one 5% bucket), plus 10%; the burst guard
        // (p99 / 2 = 0.25) is below it.
        let cpu = r.recommended.cpu.expect("cpu");
        assert!((440..=462).contains(&cpu), "{cpu}");
        // The highest daily peak is exactly 500 MiB, plus 4%, rounded up to a MiB.
        let mem = r.recommended.memory.expect("memory");
        assert_eq!(mem, 520 * MIB, "{}", mem / MIB);
        assert_eq!(r.confidence, 1.0 - 60.0 / FULL_CONFIDENCE_SECONDS);
        assert!(r.actionable);
        assert!(r.lower.0 <= r.recommended.cpu && r.recommended.cpu <= r.upper.0);
    }

    #[test]
    fn short_history_lowers_confidence_widens_bounds_and_blocks_autonomy() {
        let short = history(0).clone();
        let mut h = short;
        for m in 0..360 {
            h.add_cpu(m * 60, 0.3);
            h.add_memory(m * 60, (300 * MIB) as f64);
        }
        let r = recommend(
            &h,
            current(1000, 1024 * MIB),
            &policy(),
            &Context::default(),
            6 * 3600,
        );
        assert!(!r.actionable);
        assert!(r.confidence < 0.05);
        assert!(
            r.reasons.iter().any(|x| x.contains("history")),
            "{:?}",
            r.reasons
        );
        let week = recommend(
            &history(7),
            current(1000, 1024 * MIB),
            &policy(),
            &Context::default(),
            7 * DAY,
        );
        let spread = |r: &ContainerRecommendation| {
            r.upper.0.unwrap_or(0) as f64 / r.recommended.cpu.unwrap_or(1) as f64
        };
        assert!(
            spread(&r) > spread(&week),
            "bounds are wider with less history"
        );
    }

    #[test]
    fn an_oom_kill_bumps_memory_above_the_memory_at_the_kill() {
        let mut h = history(3);
        h.add_oom(2 * DAY, (900 * MIB) as f64);
        let r = recommend(
            &h,
            current(1000, 512 * MIB),
            &policy(),
            &Context::default(),
            3 * DAY,
        );
        // max(900Mi x 1.2, 900Mi + 100Mi) = 1080Mi.
        assert_eq!(r.recommended.memory, Some(1080 * MIB), "{:?}", r.reasons);
        assert!(
            r.reasons.iter().any(|x| x.contains("OOM kill")),
            "{:?}",
            r.reasons
        );
        // An OOM older than the history window no longer counts.
        let r = recommend(
            &h,
            current(1000, 1024 * MIB),
            &policy(),
            &Context::default(),
            30 * DAY,
        );
        assert!(r.recommended.memory.expect("memory") < 700 * MIB);
    }

    #[test]
    fn an_oom_bump_does_not_compound_once_the_request_has_grown() {
        // Killed at 900Mi with a 512Mi request: bumped to 1080Mi. Once the request is
        // 1080Mi, the same kill asks for nothing more.
        let mut h = history(3);
        h.add_oom_with_request(2 * DAY, (900 * MIB) as f64, (512 * MIB) as f64);
        let first = recommend(
            &h,
            current(1000, 512 * MIB),
            &policy(),
            &Context::default(),
            3 * DAY,
        );
        assert_eq!(first.recommended.memory, Some(1080 * MIB));
        let again = recommend(
            &h,
            current(1000, 1080 * MIB),
            &policy(),
            &Context::default(),
            3 * DAY,
        );
        assert!(
            again.recommended.memory <= Some(1080 * MIB),
            "{:?} {:?}",
            again.recommended.memory,
            again.reasons
        );
    }

    #[test]
    fn an_oom_driven_increase_is_not_held_back_by_the_maximum_step() {
        let mut h = history(3);
        h.add_oom(2 * DAY, (900 * MIB) as f64);
        let stepped = stepped_policy();
        let now = current(1000, 256 * MIB);
        let r = recommend(&h, now, &stepped, &Context::default(), 3 * DAY);
        assert_eq!(r.recommended.memory, Some(1080 * MIB), "{:?}", r.reasons);
        assert!(r.memory_urgent);
        assert_eq!(next_step(now, &r, 0.5).memory, Some(1080 * MIB));
        // Without the OOM kill the same increase would be stepped.
        let calm = ContainerRecommendation {
            memory_urgent: false,
            ..r.clone()
        };
        assert_eq!(next_step(now, &calm, 0.5).memory, Some(384 * MIB));
    }

    #[test]
    fn killed_at_its_current_size_a_larger_increase_from_another_rule_is_not_stepped_either() {
        // Peaks of 500 MiB set the target; the container was killed at its 300 MiB limit,
        // whose bump (400 MiB) is below that target.
        let mut h = history(3);
        h.add_oom(2 * DAY, (300 * MIB) as f64);
        let stepped = stepped_policy();
        let now = Requests {
            memory_limit: Some(300 * MIB),
            ..current(1000, 256 * MIB)
        };
        let r = recommend(&h, now, &stepped, &Context::default(), 3 * DAY);
        let target = r.recommended.memory.expect("memory");
        assert!(target > 500 * MIB, "{target} {:?}", r.reasons);
        assert!(r.memory_urgent, "{:?}", r.reasons);
        assert_eq!(next_step(now, &r, 0.5).memory, Some(target));
        assert!(
            r.reasons
                .iter()
                .any(|w| w.contains("OOM-killed at its current size")),
            "{:?}",
            r.reasons
        );
        // Grown past the size it was killed at, the next increase is stepped again.
        let grown = Requests {
            memory_limit: Some(640 * MIB),
            ..current(1000, 320 * MIB)
        };
        let later = recommend(&h, grown, &stepped, &Context::default(), 3 * DAY);
        assert!(!later.memory_urgent, "{:?}", later.reasons);
        assert_eq!(next_step(grown, &later, 0.5).memory, Some(480 * MIB));
    }

    #[test]
    fn the_burst_guard_keeps_bursts_within_the_headroom() {
        // Idle 98% of the time at 0.05 cores, bursting to 2 cores.
        let mut h = ContainerHistory::new(&policy(), 0);
        for m in 0..7 * 1440 {
            h.add_cpu(m * 60, if m % 50 == 0 { 2.0 } else { 0.05 });
            h.add_memory(m * 60, (100 * MIB) as f64);
        }
        let plain = recommend(
            &h,
            Requests::default(),
            &policy(),
            &Context::default(),
            7 * DAY,
        );
        assert!(
            plain.recommended.cpu.expect("cpu") < 100,
            "bursts 40 times the sustained level are beyond the guard's cap: {:?}",
            plain.recommended
        );
        let guarded = Policy {
            cpu_burst: Some((0.99, 2.0)),
            cpu_burst_cap: 0.0,
            ..policy()
        };
        let r = recommend(
            &h,
            Requests::default(),
            &guarded,
            &Context::default(),
            7 * DAY,
        );
        assert!(
            r.recommended.cpu.expect("cpu") >= 1000,
            "{:?}",
            r.recommended
        );

        // GC-like spikes to 2.5 times the sustained level: covered within the headroom.
        let mut h = ContainerHistory::new(&policy(), 0);
        for m in 0..7 * 1440 {
            h.add_cpu(m * 60, if m % 50 == 0 { 0.75 } else { 0.3 });
            h.add_memory(m * 60, (100 * MIB) as f64);
        }
        let r = recommend(
            &h,
            Requests::default(),
            &policy(),
            &Context::default(),
            7 * DAY,
        );
        let cpu = r.recommended.cpu.expect("cpu");
        assert!(cpu >= 375, "spikes stay within twice the request: {cpu}");
    }

    #[test]
    fn memory_covers_the_highest_peak_of_the_recent_days_only() {
        // One 2 GiB peak on day 0, then 500 MiB peaks for nine days.
        let mut h = ContainerHistory::new(&policy(), 0);
        for d in 0..10 {
            for m in 0..1440 {
                let peak = if d == 0 && m == 600 { 2048 } else { 500 };
                h.add_memory(d * DAY + m * 60, (peak * MIB) as f64);
                h.add_cpu(d * DAY + m * 60, 0.1);
            }
        }
        let r = recommend(
            &h,
            Requests::default(),
            &policy(),
            &Context::default(),
            10 * DAY,
        );
        assert_eq!(r.recommended.memory, Some(520 * MIB), "{:?}", r.reasons);
        let fortnight = Policy {
            memory_peak_days: 14,
            ..policy()
        };
        let r = recommend(
            &h,
            Requests::default(),
            &fortnight,
            &Context::default(),
            10 * DAY,
        );
        assert_eq!(
            r.recommended.memory,
            Some(((2048.0 * 1.04) as i64 + 1) * MIB),
            "{:?}",
            r.reasons
        );
        assert!(r.reasons.iter().any(|x| x.contains("highest daily peak")));
    }

    #[test]
    fn rising_daily_peaks_are_projected_a_day_ahead_when_the_trend_is_on() {
        let mut h = ContainerHistory::new(&policy(), 0);
        for d in 0..5 {
            for m in 0..1440 {
                h.add_memory(d * DAY + m * 60, ((500 + 100 * d) * MIB) as f64);
                h.add_cpu(d * DAY + m * 60, 0.1);
            }
        }
        let trend = Policy {
            memory_trend: true,
            ..policy()
        };
        let r = recommend(
            &h,
            Requests::default(),
            &trend,
            &Context::default(),
            5 * DAY,
        );
        // Peaks 500..900Mi: tomorrow's is 1000Mi, plus 4%.
        assert!(
            r.recommended.memory.expect("memory") >= 1040 * MIB,
            "{:?}",
            r.reasons
        );
        let flat = recommend(
            &h,
            Requests::default(),
            &policy(),
            &Context::default(),
            5 * DAY,
        );
        assert!(flat.recommended.memory < r.recommended.memory);
    }

    #[test]
    fn partial_history_lowers_confidence_and_blocks_autonomy() {
        // Seven days, but samples only in the first 2 hours of each day.
        let mut h = ContainerHistory::new(&policy(), 0);
        for d in 0..7 {
            for m in 0..120 {
                let t = d * DAY + m * 60;
                h.add_cpu(t, 0.3);
                h.add_memory(t, (300 * MIB) as f64);
            }
        }
        assert!(h.coverage() < 0.1, "{}", h.coverage());
        let r = recommend(
            &h,
            current(1000, 1024 * MIB),
            &policy(),
            &Context::default(),
            7 * DAY,
        );
        assert!(!r.actionable);
        assert!(r.confidence < 0.1, "{}", r.confidence);
        assert!(
            r.reasons.iter().any(|x| x.contains("gaps")),
            "{:?}",
            r.reasons
        );
        // Full minute coverage keeps confidence.
        assert!(history(7).coverage() > 0.99);
    }

    #[test]
    fn small_changes_are_not_made() {
        let h = history(7);
        let r = recommend(
            &h,
            current(480, 550 * MIB),
            &policy(),
            &Context::default(),
            7 * DAY,
        );
        assert_eq!(r.recommended.cpu, Some(480));
        assert_eq!(r.recommended.memory, Some(550 * MIB));
        assert!(r.reasons.iter().any(|x| x.contains("unchanged")));
        assert_eq!(r.hourly_cost_delta, 0.0);
    }

    #[test]
    fn the_student_t_percentile_matches_tables_and_approaches_the_normal() {
        // One-sided 99th percentiles from tables; the normal's is 2.326.
        for (df, table) in [
            (2.0, 6.965),
            (5.0, 3.365),
            (10.0, 2.764),
            (13.0, 2.650),
            (30.0, 2.457),
            (100.0, 2.364),
        ] {
            let t = student_t99(df);
            assert!((t - table).abs() / table < 0.005, "{df} df: {t} vs {table}");
        }
        assert!((student_t99(1e9) - RUN_PEAK_Z).abs() < 1e-6);
    }

    #[test]
    fn runs_read_as_hourly_peaks_are_told_apart_when_the_interval_is_known() {
        // A CronJob run every few hours for a week, read from Prometheus as the peak of
        // each hour: one sample a run, 300 or 600 MiB by turns.
        let feed = |interval: Option<i64>, every_hours: i64| {
            let mut h = ContainerHistory::new(&policy(), 0);
            if let Some(i) = interval {
                h.memory_sampled_every(i);
            }
            for run in 0..(7 * 24 / every_hours) {
                let t = run * every_hours * 3600;
                let peak = if run % 2 == 0 { 300.0 } else { 600.0 } * MIB as f64;
                h.add_cpu(t, 1.0);
                h.add_memory(t, peak);
            }
            recommend(
                &h,
                current(1000, 1024 * MIB),
                &policy(),
                &Context::default(),
                7 * DAY,
            )
        };
        // The hourly interval says each 6-hour gap is five hours with no pod: 27 closed
        // runs, and memory is sized for the next run above the highest peak.
        let told = feed(Some(3600), 6);
        assert!(
            told.reasons.iter().any(|x| x.contains("from 27 runs")),
            "{:?}",
            told.reasons
        );
        let memory = told.recommended.memory.expect("memory") as f64;
        assert!(
            memory > 1.3 * 600.0 * MIB as f64,
            "{} MiB",
            memory / MIB as f64
        );
        // Learnt from the samples, the usual spacing is the six hours between runs:
        // one long run, sized from the daily peaks alone.
        let untold = feed(None, 6);
        assert!(
            !untold.reasons.iter().any(|x| x.contains("next run")),
            "{:?}",
            untold.reasons
        );
        assert!(untold.recommended.memory < told.recommended.memory);
        // Every 2 hours, a single empty hour between runs still ends each one: 83 closed,
        // the last 30 kept.
        let close = feed(Some(3600), 2);
        assert!(
            close.reasons.iter().any(|x| x.contains("from 30 runs")),
            "{:?}",
            close.reasons
        );
    }

    #[test]
    fn the_cpu_request_is_the_mean_of_the_days_targets_not_the_hours() {
        // A business-day cycle: 8 busy hours at 1 core, 16 quiet ones at 0.2. With a
        // half-life of a day the newest hours weigh most, so the target computed after
        // the busy hours and the one computed before them differ by far more than the
        // hysteresis; hourly rounds keep each hour's target.
        let policy = policy();
        let mut h = ContainerHistory::new(&policy, 0);
        let far = current(5000, 500 * MIB);
        let (mut raw, mut applied) = (Vec::new(), Vec::new());
        for hour in 0..72i64 {
            for m in 0..60 {
                let t = (hour * 60 + m) * 60;
                let busy = (9..17).contains(&(hour % 24));
                h.add_cpu(t, if busy { 1.0 } else { 0.2 });
                h.add_memory(t, (500 * MIB) as f64);
            }
            let now = (hour + 1) * 3600 - 60;
            let r = recommend(&h, far, &policy, &Context::default(), now);
            let cores = r.cpu_target_cores.expect("a CPU target");
            if hour >= 48 {
                raw.push(cores * 1000.0);
                applied.push(r.recommended.cpu.expect("a CPU request") as f64);
                if (applied[applied.len() - 1] - cores * 1000.0).abs() > cores * 120.0 {
                    assert!(
                        r.reasons
                            .iter()
                            .any(|x| x.contains("mean of 24 hourly targets of the last 24 hours")),
                        "{:?}",
                        r.reasons
                    );
                }
            }
            h.note_cpu_target(now, cores, policy.min_change);
        }
        let spread = |v: &[f64]| {
            v.iter().copied().fold(0.0, f64::max) / v.iter().copied().fold(f64::MAX, f64::min)
        };
        assert!(spread(&raw) > 1.5, "hour by hour: {raw:?}");
        assert!(spread(&applied) < 1.1, "over the day: {applied:?}");
        // The request stays inside the day's targets, near their mean.
        let mean = raw.iter().sum::<f64>() / raw.len() as f64;
        let mid = applied.iter().sum::<f64>() / applied.len() as f64;
        assert!((mid - mean).abs() < 0.05 * mean, "{mid} vs {mean}");

        // Without kept targets (a one-off `tailor recommend`, the backtest) the request is
        // the target of the hour itself.
        let fresh = cpu_history(3, 0.2, 1.0, None);
        let r = recommend(&fresh, far, &policy, &Context::default(), 3 * DAY);
        let cores = r.cpu_target_cores.expect("a CPU target");
        assert_eq!(r.recommended.cpu, Some((cores * 1000.0).ceil() as i64));
        // Targets older than a day are dropped, and a later target replaces the hour's.
        let mut kept = fresh.clone();
        kept.note_cpu_target(3 * DAY - 7200, 9.0, 0.1);
        kept.note_cpu_target(3 * DAY - 3000, 5.0, 0.1);
        kept.note_cpu_target(3 * DAY - 2000, 3.0, 0.1);
        kept.note_cpu_target(3 * DAY + 2 * DAY, 1.0, 0.1);
        assert_eq!(kept.cpu_targets, vec![(5 * 24, 1.0)]);
        let mut kept = fresh;
        kept.note_cpu_target(3 * DAY - 3000, 5.0, 0.1);
        kept.note_cpu_target(3 * DAY - 2000, 3.0, 0.1);
        assert_eq!(kept.cpu_target_over_day(3 * DAY, 1.0, 0.1), (2.0, 2));
        // A target above every one of the day by more than the jump is a new level: the
        // request follows it at once, and the mean starts again from it.
        assert_eq!(kept.cpu_target_over_day(3 * DAY, 3.4, 0.1), (3.4, 1));
        kept.note_cpu_target(3 * DAY, 3.4, 0.1);
        assert_eq!(kept.cpu_targets, vec![(72, 3.4)]);
        assert_eq!(kept.cpu_target_over_day(3 * DAY + 3600, 3.0, 0.1), (3.2, 2));
    }

    #[test]
    fn a_rise_to_a_new_level_is_followed_at_once_and_a_fall_over_the_day() {
        // Two days flat at 0.2 cores, then flat at 1 core: the hour's target climbs as the
        // new samples gain weight, and the request climbs with it, not a day behind.
        let policy = policy();
        let mut h = ContainerHistory::new(&policy, 0);
        let far = current(5000, 500 * MIB);
        let mut rising = Vec::new();
        for hour in 0..(4 * 24i64) {
            let level = if hour < 48 { 0.2 } else { 1.0 };
            for m in 0..60 {
                let t = (hour * 60 + m) * 60;
                h.add_cpu(t, level);
                h.add_memory(t, (500 * MIB) as f64);
            }
            let now = (hour + 1) * 3600 - 60;
            let r = recommend(&h, far, &policy, &Context::default(), now);
            let cores = r.cpu_target_cores.expect("a CPU target");
            let applied = r.recommended.cpu.expect("a CPU request");
            if (48..60).contains(&hour) {
                rising.push((cores * 1000.0, applied));
            }
            h.note_cpu_target(now, cores, policy.min_change);
        }
        // The request reached the new level within the first hours of it.
        assert!(rising.iter().any(|(_, a)| *a >= 1000), "{rising:?}");
        let (last_target, last_applied) = rising[rising.len() - 1];
        assert!(last_applied as f64 >= 0.9 * last_target, "{rising:?}");
        // Back down: once the hour's target falls, the request follows over the day's
        // mean, not at once.
        let mut fell = None;
        for hour in (4 * 24i64)..(7 * 24) {
            for m in 0..60 {
                let t = (hour * 60 + m) * 60;
                h.add_cpu(t, 0.2);
                h.add_memory(t, (500 * MIB) as f64);
            }
            let now = (hour + 1) * 3600 - 60;
            let r = recommend(&h, far, &policy, &Context::default(), now);
            let cores = r.cpu_target_cores.expect("a CPU target");
            if cores < 0.5 && fell.is_none() {
                fell = Some((cores, r.recommended.cpu.expect("a CPU request"), r.reasons));
            }
            h.note_cpu_target(now, cores, policy.min_change);
        }
        let (cores, applied, reasons) = fell.expect("the target falls within three days");
        assert!(
            applied as f64 > cores * 1000.0 * 1.5,
            "{applied} vs {cores}: {reasons:?}"
        );
    }

    #[test]
    fn a_jobs_memory_is_not_cut_until_enough_runs_bound_the_chance_of_a_larger_one() {
        // A Job: a 1-hour run every 6 hours, each peaking at 550-570 MiB; deployed with
        // 3.5 GiB. One run in five of such a Job may meet a large input (not seen here).
        let job = |runs: i64| {
            let mut h = ContainerHistory::new(&policy(), 0);
            for run in 0..runs {
                let begin = run * 6 * 3600;
                for m in 0..12 {
                    let t = begin + m * 300;
                    h.add_cpu(t, 0.05);
                    h.add_memory(t, (550.0 + (run % 3) as f64 * 10.0) * MIB as f64);
                }
            }
            h
        };
        let feed = |runs: i64| {
            recommend(
                &job(runs),
                current(1000, 3584 * MIB),
                &policy(),
                &Context::default(),
                runs * 6 * 3600,
            )
        };
        // 14 runs (3.5 days), 13 of them closed: the quiet peaks alone would size memory
        // near 600 MiB; the request is kept, with why.
        let few = feed(14);
        assert_eq!(
            few.recommended.memory,
            Some(3584 * MIB),
            "{:?}",
            few.reasons
        );
        assert!(
            few.reasons
                .iter()
                .any(|x| x.contains("until 19 runs are seen (13 so far)") && x.contains("1/14")),
            "{:?}",
            few.reasons
        );
        // 21 runs (20 closed): the chance of a run above all of them is below 5%, and
        // memory is sized from the runs.
        let enough = feed(21);
        let memory = enough.recommended.memory.expect("memory");
        assert!(
            (570 * MIB..700 * MIB).contains(&memory),
            "{} MiB: {:?}",
            memory / MIB,
            enough.reasons
        );
        assert!(
            !enough
                .reasons
                .iter()
                .any(|x| x.contains("kept at its request"))
        );
        // A long-running container (no runs) is cut at once, as before.
        let steady = recommend(
            &history(7),
            current(1000, 3584 * MIB),
            &policy(),
            &Context::default(),
            7 * DAY,
        );
        assert!(steady.recommended.memory.expect("memory") < 3584 * MIB);
        // Nor is one that was down for an hour once: it has a closed run, but its pods ran
        // nearly all the time, so it is not a Job.
        let mut outage = ContainerHistory::new(&policy(), 0);
        for m in (0..7 * 1440).filter(|m| !(3 * 1440..3 * 1440 + 60).contains(m)) {
            outage.add_cpu(m * 60, 0.2);
            outage.add_memory(m * 60, ((400 + (m % 101)) * MIB) as f64);
        }
        assert_eq!(outage.run_peaks.len(), 1);
        assert!(outage.running_share() > 0.98, "{}", outage.running_share());
        // The Job ran one hour in six.
        let share = job(14).running_share();
        assert!((0.15..0.2).contains(&share), "{share}");
        let down_once = recommend(
            &outage,
            current(1000, 3584 * MIB),
            &policy(),
            &Context::default(),
            7 * DAY,
        );
        assert!(
            down_once.recommended.memory.expect("memory") < 1024 * MIB,
            "{:?}",
            down_once.reasons
        );
    }

    #[test]
    fn an_intermittent_container_is_sized_for_its_next_runs_peak() {
        // A CronJob: a 20-minute run every 4 hours for a week, runs peaking at 300 or
        // 600 MiB by turns (their input varies).
        let mut h = ContainerHistory::new(&policy(), 0);
        let mut highest = 0.0f64;
        for run in 0..(7 * 6) {
            let begin = run * 4 * 3600;
            let peak = if run % 2 == 0 { 300.0 } else { 600.0 } * MIB as f64;
            for m in 0..20 {
                let t = begin + m * 60;
                let used = peak * (0.5 + 0.5 * f64::from(m as i32) / 19.0);
                h.add_cpu(t, 1.0);
                h.add_memory(t, used);
                highest = highest.max(used);
            }
        }
        let r = recommend(
            &h,
            current(1000, 1024 * MIB),
            &policy(),
            &Context::default(),
            7 * DAY,
        );
        // The highest daily peak plus 4% would be 624 MiB: the runs' spread says the
        // next run may well peak higher.
        let memory = r.recommended.memory.expect("memory") as f64;
        assert!(memory > 1.3 * highest, "{} MiB", memory / MIB as f64);
        assert!(
            r.reasons.iter().any(|x| x.contains("next run")),
            "{:?}",
            r.reasons
        );
        // A long-running container (no gaps) has no runs to size from.
        let steady = recommend(
            &history(7),
            current(1000, 1024 * MIB),
            &policy(),
            &Context::default(),
            7 * DAY,
        );
        assert!(!steady.reasons.iter().any(|x| x.contains("next run")));
    }

    #[test]
    fn throttled_samples_count_as_the_demand_the_throttling_shows() {
        let mut capped = ContainerHistory::new(&policy(), 0);
        let mut throttled = ContainerHistory::new(&policy(), 0);
        for m in 0..3 * 1440 {
            capped.add_cpu(m * 60, 0.5);
            throttled.add_cpu_throttled(m * 60, 0.5, 0.6);
        }
        let cpu = |h: &ContainerHistory| {
            recommend(
                h,
                current(500, 512 * MIB),
                &policy(),
                &Context::default(),
                3 * DAY,
            )
            .recommended
            .cpu
            .expect("cpu") as f64
        };
        // Throttled in 60% of its periods, it wanted about 1.3x what it was allowed.
        let ratio = cpu(&throttled) / cpu(&capped);
        assert!((1.25..1.35).contains(&ratio), "{ratio}");
        assert_eq!(throttled_demand(0.5, 0.0), 0.5);
        assert_eq!(throttled_demand(0.5, 1.0), 0.75);
    }

    #[test]
    fn the_maximum_step_limits_the_applied_change_but_not_the_reported_target() {
        let h = history(7);
        let stepped = stepped_policy();
        let now = current(4000, 4096 * MIB);
        let r = recommend(&h, now, &stepped, &Context::default(), 7 * DAY);
        // The target is reported whole (about 0.45 cores and 520 MiB)...
        let cpu = r.recommended.cpu.expect("cpu");
        assert!((440..=462).contains(&cpu), "{cpu}");
        assert_eq!(r.recommended.memory, Some(520 * MIB));
        assert!(
            r.reasons
                .iter()
                .any(|x| x.contains("at most 50% per change")),
            "{:?}",
            r.reasons
        );
        // ...and the change applied next moves half way from the current requests, the
        // limits keeping their ratio to the request.
        let next = next_step(now, &r, stepped.max_step);
        assert_eq!(next.cpu, Some(2000));
        assert_eq!(next.memory, Some(2048 * MIB));
        assert_eq!(next.memory_limit, Some(4096 * MIB));
        // Once within the step, the target itself is applied.
        let closer = next_step(current(600, 700 * MIB), &r, stepped.max_step);
        assert_eq!(closer.cpu, r.recommended.cpu);
        assert_eq!(closer.memory, r.recommended.memory);
    }

    #[test]
    fn a_stepped_change_keeps_a_kept_limit_and_never_sets_a_limit_below_the_target_request() {
        let h = history(7);
        let keep = Policy {
            limits: LimitsPolicy::Keep,
            ..stepped_policy()
        };
        // Stepping down from 4 GiB towards 520 MiB: the team's 4 GiB limit stays.
        let now = current(4000, 4096 * MIB);
        let r = recommend(&h, now, &keep, &Context::default(), 7 * DAY);
        assert_eq!(r.recommended.memory_limit, Some(8192 * MIB));
        let next = next_step(now, &r, keep.max_step);
        assert_eq!(next.memory, Some(2048 * MIB));
        assert_eq!(next.memory_limit, Some(8192 * MIB), "a kept limit moved");
        assert_eq!(next.cpu_limit, Some(8000));
        // Stepping up from 100 MiB (limit 200 MiB) towards 520 MiB: the request moves half
        // way, the limit at once to at least the target, or the container would be killed
        // below what its history needs while the request is on the way.
        let small = current(4000, 100 * MIB);
        let up = recommend(&h, small, &keep, &Context::default(), 7 * DAY);
        assert_eq!(up.recommended.memory, Some(520 * MIB));
        let next = next_step(small, &up, keep.max_step);
        assert_eq!(next.memory, Some(150 * MIB));
        assert!(
            next.memory_limit >= Some(520 * MIB),
            "{:?} below the target 520 MiB",
            next.memory_limit
        );
        // The policy's ratio is kept on a partial step (2:1 here).
        let ratio = stepped_policy();
        let r = recommend(&h, now, &ratio, &Context::default(), 7 * DAY);
        let next = next_step(now, &r, ratio.max_step);
        assert_eq!(next.memory_limit, Some(4096 * MIB));
    }

    #[test]
    fn bounds_hold_the_recommendation_whatever_moved_it_and_memory_bounds_are_whole_mib() {
        let h = history(7);
        // A policy floor above the usage, a maximum step that holds a cut back, a
        // change too small to make, and an HPA that keeps the request: each moves the
        // request outside the percentile range the bounds come from.
        let cases = [
            (
                Policy {
                    cpu_bounds: (Some(1000), None),
                    memory_bounds: (Some(2048 * MIB), None),
                    ..policy()
                },
                current(4000, 4096 * MIB),
                Context::default(),
            ),
            (
                stepped_policy(),
                current(4000, 4096 * MIB),
                Context::default(),
            ),
            (policy(), current(460, 530 * MIB), Context::default()),
            (
                policy(),
                current(50, 64 * MIB),
                Context {
                    hpa_on_cpu: true,
                    hpa_on_memory: true,
                    ..Context::default()
                },
            ),
        ];
        for (policy, current, context) in cases {
            let r = recommend(&h, current, &policy, &context, 7 * DAY);
            let (cpu, memory) = (r.recommended.cpu, r.recommended.memory);
            assert!(
                r.lower.0 <= cpu && cpu <= r.upper.0,
                "cpu {:?} <= {cpu:?} <= {:?}",
                r.lower.0,
                r.upper.0
            );
            assert!(
                r.lower.1 <= memory && memory <= r.upper.1,
                "memory {:?} <= {memory:?} <= {:?}",
                r.lower.1,
                r.upper.1
            );
            for bound in [r.lower.1, r.upper.1].into_iter().flatten() {
                assert_eq!(bound % MIB, 0, "{bound} is not whole MiB");
            }
        }
    }

    #[test]
    fn policy_bounds_and_the_largest_node_clamp_the_request() {
        let h = history(7);
        let bounded = Policy {
            cpu_bounds: (Some(1000), None),
            memory_bounds: (None, Some(256 * MIB)),
            ..policy()
        };
        let r = recommend(
            &h,
            current(4000, 4096 * MIB),
            &bounded,
            &Context::default(),
            7 * DAY,
        );
        assert_eq!(r.recommended.cpu, Some(1000));
        assert_eq!(r.recommended.memory, Some(256 * MIB));
        let tiny_node = Context {
            largest_node: Some((300, 8192 * MIB)),
            ..Context::default()
        };
        let r = recommend(
            &h,
            current(4000, 4096 * MIB),
            &policy(),
            &tiny_node,
            7 * DAY,
        );
        assert_eq!(r.recommended.cpu, Some(300));
    }

    #[test]
    fn resources_an_hpa_scales_on_are_left_alone_by_default() {
        let h = history(7);
        let hpa = Context {
            hpa_on_cpu: true,
            ..Context::default()
        };
        let r = recommend(&h, current(4000, 4096 * MIB), &policy(), &hpa, 7 * DAY);
        assert_eq!(r.recommended.cpu, Some(4000));
        assert!(r.recommended.memory.expect("memory") < 1024 * MIB);
        let allowed = Policy {
            hpa: HpaPolicy::AllowWithTargetScaling,
            ..policy()
        };
        let r = recommend(&h, current(4000, 4096 * MIB), &allowed, &hpa, 7 * DAY);
        assert!(r.recommended.cpu.expect("cpu") < 1000);
    }

    #[test]
    fn limits_keep_their_ratio_or_follow_the_policy() {
        let h = history(7);
        let r = recommend(
            &h,
            current(2000, 2048 * MIB),
            &policy(),
            &Context::default(),
            7 * DAY,
        );
        let rec = r.recommended;
        assert_eq!(rec.cpu_limit, rec.cpu.map(|c| c * 2));
        assert_eq!(rec.memory_limit, rec.memory.map(|m| m * 2));
        let drop = Policy {
            limits: LimitsPolicy::DropCpu,
            ..policy()
        };
        let r = recommend(
            &h,
            current(2000, 2048 * MIB),
            &drop,
            &Context::default(),
            7 * DAY,
        );
        assert_eq!(r.recommended.cpu_limit, None);
        assert!(r.recommended.memory_limit.is_some());
    }

    #[test]
    fn the_cost_effect_prices_the_change_in_cores_and_gib() {
        let h = history(7);
        let ctx = Context {
            prices: Prices {
                per_core_hour: 0.04,
                per_gib_hour: 0.005,
            },
            ..Context::default()
        };
        let r = recommend(&h, current(2000, 2048 * MIB), &policy(), &ctx, 7 * DAY);
        let cores = (r.recommended.cpu.expect("cpu") - 2000) as f64 / 1000.0;
        let gib = (r.recommended.memory.expect("memory") - 2048 * MIB) as f64 / (1u64 << 30) as f64;
        assert!((r.hourly_cost_delta - (cores * 0.04 + gib * 0.005)).abs() < 1e-12);
        assert!(r.hourly_cost_delta < 0.0, "shrinking saves money");
    }

    #[test]
    fn history_checkpoints_restore_to_the_same_recommendation() {
        let h = history(3);
        let json = serde_json::to_string(&h).expect("serialises");
        let back: ContainerHistory = serde_json::from_str(&json).expect("parses");
        let a = recommend(
            &h,
            current(2000, 2048 * MIB),
            &policy(),
            &Context::default(),
            3 * DAY,
        );
        let b = recommend(
            &back,
            current(2000, 2048 * MIB),
            &policy(),
            &Context::default(),
            3 * DAY,
        );
        assert_eq!(a, b);
    }

    #[test]
    fn prices_split_each_type_between_cores_and_memory() {
        let catalog = crate::catalog::Catalog::builtin().expect("built-in catalog");
        let types = catalog
            .instance_types(&crate::catalog::CatalogOptions::for_region("eastus"))
            .expect("eastus");
        let p = Prices::from_instance_types(&types);
        assert!((0.005..0.05).contains(&p.per_core_hour), "{p:?}");
        assert!((0.0005..0.01).contains(&p.per_gib_hour), "{p:?}");
    }

    #[test]
    fn one_starvation_price_spends_the_fleet_budget_where_it_spares_the_most_cores() {
        // The cost-first profile: the fleet's budget with no per-container floor.
        let policy = Policy {
            max_step: 0.0,
            cpu_burst: None,
            ..cost_first()
        };
        // The same noisy daily cycle at three scales: about 100m, 1 core and 10 cores at
        // the top.
        let fleet: Vec<ContainerHistory> = [0.1, 1.0, 10.0]
            .iter()
            .map(|&peak| {
                let mut h = ContainerHistory::new(&policy, 0);
                let mut seed = 0x2545_f491_4f6c_dd1d_u64;
                for m in 0..7 * 1440 {
                    seed = seed
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    let noise = (seed >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
                    let angle = 2.0 * std::f64::consts::PI * (m % 1440) as f64 / 1440.0;
                    let load = 0.75 + 0.25 * angle.sin();
                    h.add_cpu(m * 60, peak * load * (1.0 + 0.3 * noise));
                }
                h
            })
            .collect();
        let price = cpu_starvation_price(&fleet, &policy).expect("a fleet with CPU samples");
        let unset = Requests {
            cpu: None,
            memory: None,
            cpu_limit: None,
            memory_limit: None,
        };
        let shares = |price: f64| -> Vec<f64> {
            let context = Context {
                cpu_starvation_price: Some(price),
                ..Context::default()
            };
            fleet
                .iter()
                .map(|h| {
                    let r = recommend(h, unset, &policy, &context, 7 * DAY);
                    h.cpu_share_above(r.recommended.cpu.expect("cpu") as f64 / 1000.0)
                })
                .collect()
        };
        let mean = |v: Vec<f64>| v.iter().sum::<f64>() / v.len() as f64;
        let budget = policy.cpu_starvation_budget;
        let at_price = shares(price);
        // The fleet's starved share is within the budget, and a lower price exceeds it.
        assert!(mean(at_price.clone()) <= budget, "{at_price:?}");
        assert!(mean(shares(price * 0.98)) > budget);
        // The starved samples fall on the largest container, where covering them would
        // reserve the most cores; the weight relative to each one's mean would starve all
        // three alike.
        assert!(at_price[2] > budget, "{at_price:?}");
        assert!(
            at_price[0] < at_price[1] && at_price[1] < at_price[2],
            "{at_price:?}"
        );
        let relative: Vec<f64> = fleet
            .iter()
            .map(|h| {
                let r = recommend(h, unset, &policy, &Context::default(), 7 * DAY);
                h.cpu_share_above(r.recommended.cpu.expect("cpu") as f64 / 1000.0)
            })
            .collect();
        assert!(
            (relative[0] - relative[2]).abs() < 0.02,
            "the relative weight starves scaled copies alike: {relative:?}"
        );
    }

    #[test]
    fn no_starvation_price_without_a_budget_or_cpu_samples() {
        let fleet = [cpu_history(2, 0.5, 1.0, None)];
        let off = Policy {
            cpu_starvation_budget: 0.0,
            ..Policy::default()
        };
        assert_eq!(cpu_starvation_price(&fleet, &off), None);
        let empty: [ContainerHistory; 0] = [];
        assert_eq!(cpu_starvation_price(&empty, &cost_first()), None);
        // A budget no level can meet (the percentile floor starves 30%) prices at the top.
        let tight = Policy {
            cpu_starvation_budget: 1e-9,
            cpu_percentiles: (0.7, 0.5, 0.95),
            ..Policy::default()
        };
        let price = cpu_starvation_price(&fleet, &tight).expect("a price");
        let context = Context {
            cpu_starvation_price: Some(price),
            ..Context::default()
        };
        let r = recommend(
            &fleet[0],
            Requests {
                cpu: None,
                memory: None,
                cpu_limit: None,
                memory_limit: None,
            },
            &tight,
            &context,
            2 * DAY,
        );
        assert!(fleet[0].cpu_share_above(r.recommended.cpu.expect("cpu") as f64 / 1000.0) < 0.01);
    }

    #[test]
    fn the_starvation_price_counts_what_a_policy_ceiling_starves() {
        // A daily cycle between 0.5 and 1 core; a ceiling of 600m starves most of it.
        // The fleet price is the cost-first profile's (the Balanced one sets no budget).
        let fleet = [cpu_history(2, 0.5, 1.0, None)];
        let open = cost_first();
        let capped = Policy {
            cpu_bounds: (None, Some(600)),
            ..cost_first()
        };
        let free = cpu_starvation_price(&fleet, &open).expect("a price");
        let forced = cpu_starvation_price(&fleet, &capped).expect("a price");
        // Without the ceiling the budget is met at a moderate price; with it no level can
        // meet it, and the price is the highest tried, not one the ceiling undoes.
        assert!(fleet[0].cpu_share_above(0.6) > 0.5);
        assert!(forced > 100.0 * free, "{forced} vs {free}");
    }

    /// A batch worker: idle at 20m, three 30-minute runs a day at 1.5 cores, for a week.
    fn batch_worker(policy: &Policy) -> ContainerHistory {
        let mut h = ContainerHistory::new(policy, 0);
        for m in 0..7 * 1440 {
            let minute_of_day = m % 1440;
            let running = [120, 600, 1080]
                .iter()
                .any(|start| (*start..start + 30).contains(&minute_of_day));
            let cores = if running {
                1.5 + 0.05 * ((m % 7) as f64 - 3.0)
            } else {
                0.02
            };
            h.add_cpu(m * 60, cores);
            h.add_memory(m * 60, (300 * MIB) as f64);
        }
        h
    }

    fn unset() -> Requests {
        Requests {
            cpu: None,
            memory: None,
            cpu_limit: None,
            memory_limit: None,
        }
    }

    #[test]
    fn a_batch_worker_is_sized_for_its_running_phase_when_the_policy_covers_it() {
        let covering = Policy {
            max_step: 0.0,
            cpu_running_phase: true,
            ..Policy::default()
        };
        let h = batch_worker(&covering);
        let r = recommend(&h, unset(), &covering, &Context::default(), 7 * DAY);
        let cpu = r.recommended.cpu.expect("cpu");
        // The runs' median demand is about 1.5 cores; the idle level 20m.
        assert!((1400..=1700).contains(&cpu), "{cpu}m {:?}", r.reasons);
        assert!(
            r.reasons.iter().any(|x| x.contains("running phase")),
            "{:?}",
            r.reasons
        );
        // Without the floor (the default sized alone, and the cost-first profile priced
        // to spare cores) the request stays near the idle level: the floor is what
        // rejects it.
        let cost_first = Policy {
            max_step: 0.0,
            ..cost_first()
        };
        let priced = Context {
            cpu_starvation_price: cpu_starvation_price([&h], &cost_first),
            ..Context::default()
        };
        for (policy, context) in [
            (
                Policy {
                    max_step: 0.0,
                    ..Policy::default()
                },
                Context::default(),
            ),
            (cost_first, priced),
        ] {
            let cheap = recommend(&h, unset(), &policy, &context, 7 * DAY);
            let cheap_cpu = cheap.recommended.cpu.expect("cpu");
            assert!(cheap_cpu < 200, "{cheap_cpu}m {:?}", cheap.reasons);
            assert!(h.cpu_share_above(cheap_cpu as f64 / 1000.0) > 0.05);
        }
    }

    #[test]
    fn no_container_is_left_short_more_often_than_its_cap_to_pay_for_the_fleet() {
        // Usage spread evenly between 0.1 and 1 core: every level trades waste for short
        // minutes at the same rate, so a cheap starvation price cuts deep.
        let balanced = Policy {
            max_step: 0.0,
            cpu_burst: None,
            ..Policy::default()
        };
        let mut h = ContainerHistory::new(&balanced, 0);
        for m in 0..7 * 1440 {
            h.add_cpu(m * 60, 0.1 + 0.9 * ((m * 37) % 100) as f64 / 99.0);
        }
        // A price at which the fleet would gladly starve this container.
        let cheap = Context {
            cpu_starvation_price: Some(0.01),
            ..Context::default()
        };
        let cut = recommend(
            &h,
            unset(),
            &Policy {
                max_step: 0.0,
                cpu_burst: None,
                ..cost_first()
            },
            &cheap,
            7 * DAY,
        );
        let cut_share = h.cpu_share_above(cut.recommended.cpu.expect("cpu") as f64 / 1000.0);
        assert!(cut_share > 0.2, "{cut_share}");
        let safe = recommend(&h, unset(), &balanced, &cheap, 7 * DAY);
        let safe_share = h.cpu_share_above(safe.recommended.cpu.expect("cpu") as f64 / 1000.0);
        // At most the cap (4%), or what VPA's own rule (p90 + 15%) would leave short.
        assert!(
            safe_share <= super::super::policy::BALANCED_CPU_SHORT_CAP + 1e-9,
            "{safe_share}"
        );
        assert!(
            safe.reasons.iter().any(|x| x.contains("may be short")),
            "{:?}",
            safe.reasons
        );
        // The cost-first recommendation says what it trades against the Balanced one.
        assert!(
            cut.reasons
                .iter()
                .any(|x| x.contains("cost-first profile") && x.contains("Balanced profile")),
            "{:?}",
            cut.reasons
        );
    }

    #[test]
    fn a_throttled_containers_cpu_limit_is_never_lowered() {
        // Throttled in a third of its periods at 300m of usage, limit 400m, request 800m:
        // the request falls, and the ratio would take the limit down with it.
        let policy = Policy {
            max_step: 0.0,
            ..policy()
        };
        let mut throttled = ContainerHistory::new(&policy, 0);
        let mut calm = ContainerHistory::new(&policy, 0);
        for m in 0..7 * 1440 {
            throttled.add_cpu_throttled(m * 60, 0.3, 0.33);
            calm.add_cpu_throttled(m * 60, 0.3, 0.0);
        }
        let deployed = Requests {
            cpu: Some(800),
            memory: None,
            cpu_limit: Some(400),
            memory_limit: None,
        };
        let r = recommend(&throttled, deployed, &policy, &Context::default(), 7 * DAY);
        let (request, limit) = (
            r.recommended.cpu.expect("cpu"),
            r.recommended.cpu_limit.expect("a limit"),
        );
        assert!(request < 800, "{request}m");
        assert!(limit >= 400, "{limit}m {:?}", r.reasons);
        assert!(
            r.reasons.iter().any(|x| x.contains("never lowered")),
            "{:?}",
            r.reasons
        );
        // Not throttled: the limit follows the request down, but never below the demand's
        // 99.9th percentile with 10% headroom, and says so when it is raised.
        let r = recommend(&calm, deployed, &policy, &Context::default(), 7 * DAY);
        let limit = r.recommended.cpu_limit.expect("a limit");
        assert!(limit < 400, "{limit}m");
        assert!(limit as f64 >= 300.0 * (1.0 + LIMIT_HEADROOM), "{limit}m");
        // Usage cycling 0.1..=0.5 cores with the limit at the request: the ratio would
        // set the limit at the new request (p70 plus 10%, about 440m), below the top.
        let tight = Requests {
            cpu: Some(800),
            cpu_limit: Some(800),
            ..deployed
        };
        let r = recommend(&history(7), tight, &policy, &Context::default(), 7 * DAY);
        let limit = r.recommended.cpu_limit.expect("a limit");
        assert!(
            limit as f64 >= 500.0 * (1.0 + LIMIT_HEADROOM),
            "{limit}m {:?}",
            r.reasons
        );
        assert!(
            r.reasons.iter().any(|x| x.contains("cpu limit raised")),
            "{:?}",
            r.reasons
        );
        // A limit the policy drops is said to be removed.
        let dropped = recommend(
            &calm,
            deployed,
            &Policy {
                limits: LimitsPolicy::DropCpu,
                ..policy.clone()
            },
            &Context::default(),
            7 * DAY,
        );
        assert_eq!(dropped.recommended.cpu_limit, None);
        assert!(dropped.reasons.iter().any(|x| x.contains("removed")));
    }
}
