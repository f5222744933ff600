//! The simulated cluster's usage as a [`UsageSource`]: what its pods used, step by step,
//! served the way Prometheus serves a real cluster's (CPU samples, the memory peak of each
//! interval, OOM kills), so the demo's right-sizing reads through
//! [`crate::rightsizing::service`] as the agent's does, checkpoints and all.

use std::collections::BTreeMap;
use std::future::{Future, ready};

use crate::usage::{
    ContainerKey, ObservedOom, ReadStats, UsageError, UsageQuery, UsageSink, UsageSource,
};

/// What one container used.
#[derive(Debug, Default)]
struct Series {
    /// (unix second, cores), in time order.
    cpu: Vec<(i64, f64)>,
    /// (unix second, bytes), in time order.
    memory: Vec<(i64, f64)>,
    /// Unix seconds of OOM kills.
    ooms: Vec<i64>,
}

/// The recorded usage of every container of the simulated cluster.
#[derive(Debug)]
pub struct Recorded {
    /// The longest interval a memory peak covers, seconds.
    memory_interval: i64,
    series: BTreeMap<ContainerKey, Series>,
}

impl Recorded {
    /// Empty; memory is read as the peak of each `memory_interval` seconds.
    pub fn new(memory_interval: i64) -> Self {
        Recorded {
            memory_interval: memory_interval.max(1),
            series: BTreeMap::new(),
        }
    }

    /// Records what a container used at `t` (samples come in time order).
    pub fn record(&mut self, key: &ContainerKey, t: i64, cores: f64, bytes: f64) {
        let s = self.series.entry(key.clone()).or_default();
        s.cpu.push((t, cores));
        s.memory.push((t, bytes));
    }

    /// Records an OOM kill of a container at `t`, at `memory` bytes with `request` bytes
    /// requested; returns the kill as its pod shows it ([`ObservedOom`]).
    pub fn oom_kill(
        &mut self,
        key: ContainerKey,
        t: i64,
        memory: f64,
        request: f64,
    ) -> ObservedOom {
        self.series.entry(key.clone()).or_default().ooms.push(t);
        ObservedOom {
            key,
            at: t,
            memory: Some(memory),
            request: Some(request),
        }
    }

    /// Drops everything before `t`: what every reader has already taken in.
    pub fn forget_before(&mut self, t: i64) {
        for s in self.series.values_mut() {
            s.cpu.retain(|(at, _)| *at >= t);
            s.memory.retain(|(at, _)| *at >= t);
            s.ooms.retain(|at| *at >= t);
        }
        self.series
            .retain(|_, s| !s.cpu.is_empty() || !s.memory.is_empty() || !s.ooms.is_empty());
    }

    fn read_into<S: UsageSink>(&self, query: &UsageQuery, sink: &mut S) -> ReadStats {
        let mut stats = ReadStats {
            queries: 1,
            ..ReadStats::default()
        };
        // As the Prometheus source: a peak per interval ending at start + k * interval,
        // keyed by the interval's start, an interval no longer than the window.
        let interval = self.memory_interval.min((query.end - query.start).max(1));
        let in_scope = |k: &ContainerKey| {
            query.namespaces.is_empty() || query.namespaces.contains(&k.namespace)
        };
        for (key, s) in self.series.iter().filter(|(k, _)| in_scope(k)) {
            let cpu: Vec<(i64, f64)> = s
                .cpu
                .iter()
                .copied()
                .filter(|(t, _)| (query.start..=query.end).contains(t))
                .collect();
            let mut peaks: Vec<(i64, f64)> = Vec::new();
            for (t, v) in s
                .memory
                .iter()
                .filter(|(t, _)| *t > query.start && *t <= query.end)
            {
                let from = query.start + (t - query.start - 1) / interval * interval;
                match peaks.last_mut() {
                    Some((at, peak)) if *at == from => *peak = peak.max(*v),
                    _ => peaks.push((from, *v)),
                }
            }
            if cpu.is_empty() && peaks.is_empty() {
                continue;
            }
            stats.series += 1;
            stats.samples += (cpu.len() + peaks.len()) as u64;
            if !cpu.is_empty() {
                sink.cpu(key, &cpu);
            }
            if !peaks.is_empty() {
                sink.memory_peaks(key, interval, &peaks);
            }
            for at in s
                .ooms
                .iter()
                .filter(|t| **t > query.start && **t <= query.end)
            {
                sink.oom_kill(key, *at, interval);
            }
        }
        stats
    }
}

impl UsageSource for Recorded {
    fn read<S: UsageSink + Send>(
        &self,
        query: &UsageQuery,
        sink: &mut S,
    ) -> impl Future<Output = Result<ReadStats, UsageError>> + Send {
        ready(Ok(self.read_into(query, sink)))
    }
}

/// A [`Recorded`] shared between the simulated cluster, which records what its pods use,
/// and the agent's right-sizing controller, which reads it as it reads Prometheus.
#[derive(Debug, Clone)]
pub struct Shared(std::sync::Arc<std::sync::Mutex<Recorded>>);

impl Shared {
    /// Shares `recorded`.
    pub fn new(recorded: Recorded) -> Self {
        Shared(std::sync::Arc::new(std::sync::Mutex::new(recorded)))
    }

    /// The recorded usage, locked (never across an await).
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Recorded> {
        // Plain data, each change made whole under the lock.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl UsageSource for Shared {
    fn read<S: UsageSink + Send>(
        &self,
        query: &UsageQuery,
        sink: &mut S,
    ) -> impl Future<Output = Result<ReadStats, UsageError>> + Send {
        ready(Ok(self.lock().read_into(query, sink)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::Usage;

    fn key(ns: &str, pod: &str) -> ContainerKey {
        ContainerKey {
            namespace: ns.into(),
            pod: pod.into(),
            container: "app".into(),
        }
    }

    #[test]
    fn a_read_serves_the_window_as_cpu_samples_interval_peaks_and_kills() {
        let mut r = Recorded::new(3600);
        for i in 0..=24 {
            let t = i * 300;
            r.record(
                &key("shop", "web-1"),
                t,
                0.1 * i as f64,
                1e6 * (i % 13) as f64,
            );
        }
        r.record(&key("other", "db-1"), 300, 1.0, 1.0);
        let shown = r.oom_kill(key("shop", "web-1"), 4000, 13e6, 10e6);
        assert_eq!(
            (shown.at, shown.memory, shown.request),
            (4000, Some(13e6), Some(10e6))
        );
        let query = UsageQuery {
            namespaces: vec!["shop".into()],
            start: 0,
            end: 7200,
            step: 300,
        };
        let mut usage = Usage::default();
        let stats = ready_now(r.read(&query, &mut usage));
        assert_eq!(stats.series, 1, "only the namespace asked for");
        let web = &usage.containers[&key("shop", "web-1")];
        assert_eq!(web.cpu.len(), 25);
        // Two hourly peaks: samples 1-12 (peak 12 MB) and 13-24 (peak 11 MB at 24 * 300).
        assert_eq!(web.memory, vec![(0, 12e6), (3600, 11e6)]);
        assert_eq!(web.memory_interval, 3600);
        assert_eq!(web.oom_kills, vec![4000]);
        // Forgotten samples are not served again.
        r.forget_before(3600);
        let mut later = Usage::default();
        ready_now(r.read(&query, &mut later));
        assert_eq!(later.containers[&key("shop", "web-1")].cpu.len(), 13);
    }

    /// Polls a future that is ready at once.
    fn ready_now<T>(f: impl Future<Output = Result<T, UsageError>>) -> T {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut f = std::pin::pin!(f);
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(r) => r.expect("the read"),
            std::task::Poll::Pending => panic!("a recorded read is ready at once"),
        }
    }
}
