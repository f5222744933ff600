//! Reading usage history: the [`UsageSource`] trait and its Prometheus implementation.

pub mod answer;
#[cfg(feature = "report")]
pub mod inventory;
pub mod pool;
pub mod prometheus;
pub mod workloads;

use std::future::Future;

/// One container of one pod.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContainerKey {
    /// Namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
}

/// An OOM kill seen on the pod itself (its container's last termination in the API), not
/// read from the usage history: known within seconds, where the history learns of it only
/// once the next scrape and read take it in.
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedOom {
    /// The container.
    pub key: ContainerKey,
    /// When it was killed, unix seconds.
    pub at: i64,
    /// The memory it was killed at, bytes, when known (its memory limit).
    pub memory: Option<f64>,
    /// Its memory request when it was killed, bytes: what proved too small, which may
    /// differ from its workload's template once requests are resized in place.
    pub request: Option<f64>,
}

/// A container's usage as read: CPU samples, memory peaks per interval, OOM kills.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerUsage {
    /// CPU in cores: (unix seconds, cores).
    pub cpu: Vec<(i64, f64)>,
    /// Highest memory working set per interval: (interval start, bytes).
    pub memory: Vec<(i64, f64)>,
    /// Unix seconds by which an OOM kill had happened (within the memory interval before).
    pub oom_kills: Vec<i64>,
    /// Seconds each memory peak covers (0 until a peak is read).
    pub memory_interval: i64,
    /// Share of CFS periods throttled per memory interval: (interval start, 0..1); empty
    /// for a container without a CPU limit.
    pub throttled: Vec<(i64, f64)>,
}

/// What to read.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageQuery {
    /// Namespaces to read; empty reads every namespace.
    pub namespaces: Vec<String>,
    /// Start, unix seconds.
    pub start: i64,
    /// End, unix seconds.
    pub end: i64,
    /// CPU sample spacing, seconds.
    pub step: i64,
}

/// Longest history a read covers: a year. With the recommender's 24-hour half-life a
/// sample older than that weighs less than 2^-365; the bound keeps a typo such as
/// `--history 999999999d` from planning billions of hours of queries.
pub const MAX_WINDOW_SECONDS: i64 = 366 * 86_400;

/// Coarsest CPU step: an hour. CPU is read as the rate over the step, and a coarser
/// rate averages away the peaks a request must cover.
pub const MAX_STEP_SECONDS: i64 = 3_600;

impl UsageQuery {
    /// Checks the window and step: a non-empty window of at most
    /// [`MAX_WINDOW_SECONDS`] and a step of 1 s to [`MAX_STEP_SECONDS`] (a window
    /// resumed from a checkpoint may be shorter than the step).
    pub fn check(&self) -> Result<(), UsageError> {
        let window = self.end.saturating_sub(self.start);
        let invalid = |what: String| Err(UsageError::Settings(what));
        if window <= 0 {
            return invalid(format!(
                "the window {}..{} is empty: it must end after it starts",
                self.start, self.end
            ));
        }
        if window > MAX_WINDOW_SECONDS {
            return invalid(format!(
                "the window of {window}s is longer than {MAX_WINDOW_SECONDS}s (366 days)"
            ));
        }
        if self.step <= 0 || self.step > MAX_STEP_SECONDS {
            return invalid(format!(
                "step {}s is outside 1s..={MAX_STEP_SECONDS}s",
                self.step
            ));
        }
        Ok(())
    }
}

/// What a read cost the source.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Requests issued (series discovery included).
    pub queries: usize,
    /// Container series found.
    pub series: usize,
    /// Samples received and used.
    pub samples: u64,
    /// Samples received and dropped as implausible: not a number, infinite, negative or
    /// beyond [`MAX_PLAUSIBLE_CPU_CORES`] / [`MAX_PLAUSIBLE_MEMORY_BYTES`].
    pub rejected_samples: u64,
}

/// Most CPU one container can use, in cores: Azure's largest VM has 416 vCPUs, so more
/// than 1,024 is a broken exporter or counter reset, not usage.
pub const MAX_PLAUSIBLE_CPU_CORES: f64 = 1_024.0;

/// Most memory one container can use: Azure's largest VM has 12 TiB, so more than 64 TiB
/// is a broken exporter, not usage.
pub const MAX_PLAUSIBLE_MEMORY_BYTES: f64 = (64_u64 << 40) as f64;

/// Whether a CPU sample (cores) can be real usage.
pub fn plausible_cpu(cores: f64) -> bool {
    (0.0..=MAX_PLAUSIBLE_CPU_CORES).contains(&cores)
}

/// Whether a memory sample (bytes) can be real usage.
pub fn plausible_memory(bytes: f64) -> bool {
    (0.0..=MAX_PLAUSIBLE_MEMORY_BYTES).contains(&bytes)
}

/// Receives usage as it is read, so a long history never has to be held in memory.
/// Calls come in any order across containers; within one call samples are in time order.
pub trait UsageSink {
    /// CPU samples (unix seconds, cores) of a container.
    fn cpu(&mut self, key: &ContainerKey, samples: &[(i64, f64)]);
    /// Highest memory working set (bytes) per interval of `interval` seconds, keyed by the
    /// interval's start.
    fn memory_peaks(&mut self, key: &ContainerKey, interval: i64, peaks: &[(i64, f64)]);
    /// An OOM kill of the container within the `interval` seconds before `at`.
    fn oom_kill(&mut self, key: &ContainerKey, at: i64, interval: i64);
    /// The share (0..1) of CFS periods throttled per interval of `interval` seconds, keyed
    /// by the interval's start, for a container with a CPU limit. Ignored by default.
    fn throttling(&mut self, _key: &ContainerKey, _interval: i64, _shares: &[(i64, f64)]) {}
}

/// Usage read for a query, collected in memory (for tests and small reads).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    /// Samples per container, in key order.
    pub containers: std::collections::BTreeMap<ContainerKey, ContainerUsage>,
    /// How many queries the source issued.
    pub queries: usize,
}

impl UsageSink for Usage {
    fn cpu(&mut self, key: &ContainerKey, samples: &[(i64, f64)]) {
        let c = self.containers.entry(key.clone()).or_default();
        c.cpu.extend_from_slice(samples);
    }

    fn memory_peaks(&mut self, key: &ContainerKey, interval: i64, peaks: &[(i64, f64)]) {
        let c = self.containers.entry(key.clone()).or_default();
        c.memory.extend_from_slice(peaks);
        c.memory_interval = interval;
    }

    fn oom_kill(&mut self, key: &ContainerKey, at: i64, _interval: i64) {
        let c = self.containers.entry(key.clone()).or_default();
        if !c.oom_kills.contains(&at) {
            c.oom_kills.push(at);
        }
    }

    fn throttling(&mut self, key: &ContainerKey, _interval: i64, shares: &[(i64, f64)]) {
        let c = self.containers.entry(key.clone()).or_default();
        c.throttled.extend_from_slice(shares);
    }
}

/// What an unreachable source tells the user to check: the setting that names it and the
/// docs section on Prometheus.
pub const PROMETHEUS_DOCS: &str = "check --prometheus-url (TAILOR_PROMETHEUS_URL; the chart's \
     settings.prometheusUrl) and its credentials; see \
     docs/install.md#prometheus-or-azure-managed-prometheus";

/// Why usage could not be read. No recommendation is built on a failed read.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    /// The source's settings are invalid.
    #[error("usage source settings: {0}")]
    Settings(String),
    /// The source could not be reached or kept failing.
    #[error("reading usage from {url}: {message}; {PROMETHEUS_DOCS}")]
    Unavailable {
        /// The source's address.
        url: String,
        /// What went wrong, after retries.
        message: String,
    },
    /// The source answered with an error for a query.
    #[error("query {query:?} failed at {url}: {message}")]
    Query {
        /// The source's address.
        url: String,
        /// The PromQL sent.
        query: String,
        /// The source's error.
        message: String,
    },
}

/// Where usage history comes from. The Prometheus source reads any Prometheus-compatible
/// API; the simulator supplies its own.
pub trait UsageSource: Send + Sync {
    /// Reads CPU, memory peaks and OOM kills for the query's window into `sink`, piece by
    /// piece. On an error the sink may hold part of the window: callers discard it.
    fn read<S: UsageSink + Send>(
        &self,
        query: &UsageQuery,
        sink: &mut S,
    ) -> impl Future<Output = Result<ReadStats, UsageError>> + Send;

    /// Reads the whole window into memory.
    fn usage(&self, query: &UsageQuery) -> impl Future<Output = Result<Usage, UsageError>> + Send
    where
        Self: Sized,
    {
        async move {
            let mut usage = Usage::default();
            let stats = self.read(query, &mut usage).await?;
            usage.queries = stats.queries;
            // Answers arrive in any order: put each container's samples in time order once.
            for c in usage.containers.values_mut() {
                c.cpu.sort_by_key(|s| s.0);
                c.memory.sort_by_key(|s| s.0);
                c.oom_kills.sort_unstable();
            }
            Ok(usage)
        }
    }
}
