//! Reading usage history: the [`UsageSource`] trait and its Prometheus implementation.

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

/// A container's usage samples: (unix seconds, value).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerUsage {
    /// CPU in cores.
    pub cpu: Vec<(i64, f64)>,
    /// Memory working set in bytes.
    pub memory: Vec<(i64, f64)>,
    /// Unix seconds at which an OOM kill was first seen.
    pub oom_kills: Vec<i64>,
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
    /// Sample spacing, seconds.
    pub step: i64,
}

/// Usage read for a query.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    /// Samples per container, in key order.
    pub containers: std::collections::BTreeMap<ContainerKey, ContainerUsage>,
    /// How many queries the source issued.
    pub queries: usize,
}

/// Why usage could not be read. No recommendation is built on a failed read.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    /// The source's settings are invalid.
    #[error("usage source settings: {0}")]
    Settings(String),
    /// The source could not be reached or kept failing.
    #[error("reading usage from {url}: {message}")]
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
    /// Reads CPU, memory and OOM kills for the query's window.
    fn usage(&self, query: &UsageQuery) -> impl Future<Output = Result<Usage, UsageError>> + Send;
}
