//! Usage pooled per workload container as it is read: every replica's CPU samples go
//! straight into the container's decaying histogram, memory peaks are kept per interval
//! (the highest over replicas) and fed in time order at the end, OOM kills are paired with
//! the peak of the interval they happened in. Nothing holds the raw samples, so a read of
//! any length takes memory in proportion to containers, not samples.
//!
//! A pool can start from a [`Checkpoint`] of an earlier read and take only what came
//! after it; the checkpoint of the result is what the next run resumes from.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::workloads::{Workload, Workloads};
use super::{ContainerKey, UsageSink};
use crate::rightsizing::{ContainerHistory, Policy};

/// Checkpoint format version; a file of another version is not resumed from.
pub const CHECKPOINT_VERSION: u32 = 1;

/// One hour of a workload container's usage, over all its replicas, for charts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct HourUsage {
    /// Hour start, unix seconds.
    pub start: i64,
    /// Mean CPU of the samples, cores.
    pub cpu_mean: f64,
    /// Highest CPU sample, cores.
    pub cpu_max: f64,
    /// Highest memory working set, bytes.
    pub memory_max: f64,
}

#[derive(Debug, Clone, Copy, Default)]
struct HourAcc {
    cpu_sum: f64,
    cpu_n: u32,
    cpu_max: f64,
    memory_max: f64,
}

#[derive(Debug, Clone)]
struct Entry {
    history: ContainerHistory,
    peaks: BTreeMap<i64, f64>,
    ooms: Vec<Oom>,
    hours: BTreeMap<i64, HourAcc>,
}

/// An OOM kill as pooled.
#[derive(Debug, Clone, Copy)]
struct Oom {
    /// When.
    at: i64,
    /// The interval before it whose memory peak measures it, seconds.
    interval: i64,
    /// The memory it was killed at, when the pod told it.
    memory: Option<f64>,
    /// The request that proved too small, when the pod told it.
    request: Option<f64>,
}

/// A workload container's pooled history after a read.
#[derive(Debug, Clone)]
pub struct Pooled {
    /// The recommender's state.
    pub history: ContainerHistory,
    /// Hourly usage of this read (empty unless the pool keeps series).
    pub hours: Vec<HourUsage>,
}

/// Pools usage per (workload, container name).
#[derive(Debug)]
pub struct Pool<'a> {
    workloads: &'a Workloads,
    policy: &'a Policy,
    start: i64,
    after: Option<i64>,
    keep_hours: bool,
    entries: BTreeMap<(Workload, String), Entry>,
    resolved: BTreeMap<(String, String), Option<Workload>>,
    unmatched: BTreeSet<ContainerKey>,
}

/// Saved pool state: each workload container's recommender state and the time it covers
/// up to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    /// Format version.
    pub version: u32,
    /// Half-life (seconds) the histograms were built with.
    pub half_life: i64,
    /// Usage up to this unix second is in the state.
    pub until: i64,
    /// Per workload container.
    pub containers: Vec<CheckpointEntry>,
}

/// One workload container in a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointEntry {
    /// Namespace.
    pub namespace: String,
    /// Workload kind.
    pub kind: String,
    /// Workload name.
    pub name: String,
    /// Container name.
    pub container: String,
    /// Recommender state.
    pub history: ContainerHistory,
}

impl<'a> Pool<'a> {
    /// An empty pool for a read starting at `start`.
    pub fn new(workloads: &'a Workloads, policy: &'a Policy, start: i64) -> Self {
        Pool {
            workloads,
            policy,
            start,
            after: None,
            keep_hours: false,
            entries: BTreeMap::new(),
            resolved: BTreeMap::new(),
            unmatched: BTreeSet::new(),
        }
    }

    /// A pool that continues a checkpoint: its states are resumed and CPU samples at or
    /// before its end are skipped (range reads include their first point).
    pub fn resume(workloads: &'a Workloads, policy: &'a Policy, checkpoint: Checkpoint) -> Self {
        let mut pool = Pool::new(workloads, policy, checkpoint.until);
        pool.after = Some(checkpoint.until);
        for e in checkpoint.containers {
            let w = Workload {
                namespace: e.namespace,
                kind: e.kind,
                name: e.name,
            };
            pool.entries.insert(
                (w, e.container),
                Entry {
                    history: e.history,
                    peaks: BTreeMap::new(),
                    ooms: Vec::new(),
                    hours: BTreeMap::new(),
                },
            );
        }
        pool
    }

    /// Also keep hourly usage per container (for charts).
    pub fn keep_hours(mut self, keep: bool) -> Self {
        self.keep_hours = keep;
        self
    }

    fn entry(&mut self, key: &ContainerKey) -> Option<&mut Entry> {
        let pod = (key.namespace.clone(), key.pod.clone());
        let workload = match self.resolved.get(&pod) {
            Some(w) => w.clone(),
            None => {
                let w = self.workloads.of_pod(&key.namespace, &key.pod);
                self.resolved.insert(pod, w.clone());
                w
            }
        };
        let Some(workload) = workload else {
            self.unmatched.insert(key.clone());
            return None;
        };
        let (policy, start) = (self.policy, self.start);
        Some(
            self.entries
                .entry((workload, key.container.clone()))
                .or_insert_with(|| Entry {
                    history: ContainerHistory::new(policy, start),
                    peaks: BTreeMap::new(),
                    ooms: Vec::new(),
                    hours: BTreeMap::new(),
                }),
        )
    }

    /// Containers seen in the usage whose pod belongs to no workload of the snapshot.
    pub fn unmatched(&self) -> &BTreeSet<ContainerKey> {
        &self.unmatched
    }

    /// Feeds the memory peaks in time order and the OOM kills, and returns every
    /// workload container's history.
    pub fn finish(self) -> BTreeMap<(Workload, String), Pooled> {
        let mut out = BTreeMap::new();
        for (key, mut e) in self.entries {
            for (t, v) in &e.peaks {
                e.history.add_memory(*t, *v);
            }
            for oom in &e.ooms {
                // The working set at the kill is not sampled; the interval's peak is the
                // closest measurement of it, the limit the pod was killed at a closer one.
                let peak = e
                    .peaks
                    .range(oom.at - oom.interval..oom.at)
                    .map(|(_, v)| *v)
                    .fold(oom.memory.unwrap_or(0.0), f64::max);
                match oom.request {
                    Some(request) => e.history.add_oom_with_request(oom.at, peak, request),
                    None => e.history.add_oom(oom.at, peak),
                }
            }
            let hours = e
                .hours
                .iter()
                .map(|(start, h)| HourUsage {
                    start: *start,
                    cpu_mean: if h.cpu_n > 0 {
                        h.cpu_sum / f64::from(h.cpu_n)
                    } else {
                        0.0
                    },
                    cpu_max: h.cpu_max,
                    memory_max: h.memory_max,
                })
                .collect();
            out.insert(
                key,
                Pooled {
                    history: e.history,
                    hours,
                },
            );
        }
        out
    }
}

/// The start of the hour (counted from `start`) that `t` falls in.
fn hour_of(start: i64, t: i64) -> i64 {
    start + (t - start).div_euclid(3600) * 3600
}

impl UsageSink for Pool<'_> {
    fn cpu(&mut self, key: &ContainerKey, samples: &[(i64, f64)]) {
        let (after, keep, start) = (self.after, self.keep_hours, self.start);
        let Some(e) = self.entry(key) else { return };
        for (t, v) in samples {
            if after.is_some_and(|a| *t <= a) {
                continue;
            }
            e.history.add_cpu(*t, *v);
            if keep {
                let h = e.hours.entry(hour_of(start, *t)).or_default();
                h.cpu_sum += v;
                h.cpu_n += 1;
                h.cpu_max = h.cpu_max.max(*v);
            }
        }
    }

    fn memory_peaks(&mut self, key: &ContainerKey, interval: i64, peaks: &[(i64, f64)]) {
        let (keep, start) = (self.keep_hours, self.start);
        let Some(e) = self.entry(key) else { return };
        e.history.memory_sampled_every(interval);
        for (t, v) in peaks {
            let p = e.peaks.entry(*t).or_insert(0.0);
            *p = p.max(*v);
            if keep {
                let h = e.hours.entry(hour_of(start, *t)).or_default();
                h.memory_max = h.memory_max.max(*v);
            }
        }
    }

    fn throttling(&mut self, key: &ContainerKey, _interval: i64, shares: &[(i64, f64)]) {
        let after = self.after;
        let Some(e) = self.entry(key) else { return };
        for (t, share) in shares {
            if after.is_none_or(|a| *t > a) {
                e.history.note_throttling(*share);
            }
        }
    }

    fn oom_kill(&mut self, key: &ContainerKey, at: i64, interval: i64) {
        let Some(e) = self.entry(key) else { return };
        if !e.ooms.iter().any(|o| o.at == at) {
            e.ooms.push(Oom {
                at,
                interval,
                memory: None,
                request: None,
            });
        }
    }
}

impl Pool<'_> {
    /// Takes in an OOM kill seen on the pod ([`super::ObservedOom`]): paired, as a read
    /// one is, with the peak of the `interval` seconds before it, and with the memory it
    /// was killed at when that is known. A kill of a pod of no workload is counted
    /// unmatched; a kill alone is not usage, so a container with no history neither read
    /// nor resumed is left without one.
    pub fn observed_oom(&mut self, oom: &super::ObservedOom, interval: i64) {
        let Some(workload) = self.workloads.of_pod(&oom.key.namespace, &oom.key.pod) else {
            self.unmatched.insert(oom.key.clone());
            return;
        };
        let Some(e) = self.entries.get_mut(&(workload, oom.key.container.clone())) else {
            return;
        };
        match e.ooms.iter_mut().find(|o| o.at == oom.at) {
            Some(known) => {
                known.memory = known.memory.or(oom.memory);
                known.request = known.request.or(oom.request);
            }
            None => e.ooms.push(Oom {
                at: oom.at,
                interval,
                memory: oom.memory,
                request: oom.request,
            }),
        }
    }
}

impl Checkpoint {
    /// The checkpoint of pooled histories that cover usage up to `until`.
    pub fn of(
        pooled: &BTreeMap<(Workload, String), Pooled>,
        policy: &Policy,
        until: i64,
    ) -> Checkpoint {
        Checkpoint {
            version: CHECKPOINT_VERSION,
            half_life: policy.half_life,
            until,
            containers: pooled
                .iter()
                .map(|((w, c), p)| CheckpointEntry {
                    namespace: w.namespace.clone(),
                    kind: w.kind.clone(),
                    name: w.name.clone(),
                    container: c.clone(),
                    history: p.history.clone(),
                })
                .collect(),
        }
    }

    /// Whether this checkpoint can be resumed under `policy` for a read ending at `now`
    /// whose window starts at `window_start`; the reason if not.
    pub fn usable(&self, policy: &Policy, window_start: i64, now: i64) -> Result<(), String> {
        if self.version != CHECKPOINT_VERSION {
            return Err(format!(
                "format version {} (this build reads {CHECKPOINT_VERSION})",
                self.version
            ));
        }
        if self.half_life != policy.half_life {
            return Err(format!(
                "built with a {}s half-life, the policy now says {}s",
                self.half_life, policy.half_life
            ));
        }
        if self.until > now {
            return Err(format!(
                "it ends at {}, after the evaluation time",
                self.until
            ));
        }
        if self.until < window_start {
            return Err("it ends before the history window starts".to_string());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Snapshot;
    use crate::usage::ObservedOom;

    const SNAPSHOT: &str = "
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - {name: app, image: web, resources: {requests: {cpu: '1', memory: 1Gi}}}
";

    fn key(pod: &str) -> ContainerKey {
        ContainerKey {
            namespace: "shop".into(),
            pod: pod.into(),
            container: "app".into(),
        }
    }

    #[test]
    fn replicas_pool_into_one_workload_container_and_peaks_take_the_highest() {
        let snapshot = Snapshot::from_yaml("test", SNAPSHOT).expect("snapshot");
        let workloads = Workloads::from_snapshot(&snapshot);
        let policy = Policy::default();
        let mut pool = Pool::new(&workloads, &policy, 0).keep_hours(true);
        // Two replicas' answers, in either order.
        pool.memory_peaks(&key("web-7d9f8b6c5d-x2x9z"), 3600, &[(3600, 300.0e6)]);
        pool.memory_peaks(
            &key("web-7d9f8b6c5d-abcde"),
            3600,
            &[(0, 100.0e6), (3600, 200.0e6)],
        );
        pool.cpu(&key("web-7d9f8b6c5d-abcde"), &[(60, 0.5), (120, 1.5)]);
        pool.oom_kill(&key("web-7d9f8b6c5d-abcde"), 7200, 3600);
        pool.cpu(&key("other-1"), &[(60, 1.0)]);
        assert_eq!(pool.unmatched().len(), 1);
        let pooled = pool.finish();
        assert_eq!(pooled.len(), 1);
        let (k, p) = pooled.iter().next().expect("one");
        assert_eq!(
            (k.0.kind.as_str(), k.0.name.as_str()),
            ("Deployment", "web")
        );
        assert_eq!(p.history.samples(), 2);
        assert_eq!(p.hours.len(), 2);
        assert_eq!(p.hours[0].cpu_mean, 1.0);
        assert_eq!(p.hours[1].memory_max, 300.0e6);
    }

    #[test]
    fn hourly_peaks_one_a_run_tell_the_runs_apart() {
        // A container that runs for a few minutes every 6 hours, read as the peak of each
        // hour: one peak a run. The pool passes the interval on, so the 5 hours with no
        // peak between runs end each run.
        use crate::rightsizing::recommender::{Context, Requests, recommend};
        let snapshot = Snapshot::from_yaml("test", SNAPSHOT).expect("snapshot");
        let workloads = Workloads::from_snapshot(&snapshot);
        let policy = Policy::default();
        let mut pool = Pool::new(&workloads, &policy, 0);
        for run in 0..28 {
            let t = run * 6 * 3600;
            let peak = if run % 2 == 0 { 300.0e6 } else { 600.0e6 };
            pool.cpu(&key("web-7d9f8b6c5d-abcde"), &[(t, 1.0)]);
            pool.memory_peaks(&key("web-7d9f8b6c5d-abcde"), 3600, &[(t, peak)]);
        }
        let pooled = pool.finish();
        let (_, p) = pooled.iter().next().expect("one");
        let current = Requests {
            cpu: Some(1000),
            memory: Some(1 << 30),
            cpu_limit: None,
            memory_limit: None,
        };
        let r = recommend(
            &p.history,
            current,
            &policy,
            &Context::default(),
            7 * 86_400,
        );
        assert!(
            r.reasons.iter().any(|x| x.contains("from 27 runs")),
            "{:?}",
            r.reasons
        );
        assert!(r.recommended.memory.expect("memory") as f64 > 600.0e6);
    }

    #[test]
    fn an_oom_kill_seen_on_the_pod_bumps_from_what_it_was_killed_at_and_its_request_then() {
        use crate::rightsizing::recommender::{Context, Requests, recommend};
        let snapshot = Snapshot::from_yaml("test", SNAPSHOT).expect("snapshot");
        let workloads = Workloads::from_snapshot(&snapshot);
        let policy = Policy::default();
        // Two days of usage peaking at 300 MB; the template still asks 1 GiB, the pods were
        // resized to 320 MB and one is killed at its 400 MB limit in the last hour, which
        // no read holds yet.
        let history = |observed: Option<ObservedOom>| {
            let mut pool = Pool::new(&workloads, &policy, 0);
            for h in 0..48 {
                let t = h * 3600;
                pool.cpu(&key("web-7d9f8b6c5d-abcde"), &[(t, 0.2)]);
                pool.memory_peaks(&key("web-7d9f8b6c5d-abcde"), 3600, &[(t, 300.0e6)]);
            }
            if let Some(oom) = &observed {
                pool.observed_oom(oom, 3600);
                // The same kill read later from the history adds nothing.
                pool.oom_kill(&oom.key, oom.at, 3600);
            }
            let pooled = pool.finish();
            let current = Requests {
                cpu: Some(1000),
                memory: Some(1 << 30),
                cpu_limit: None,
                memory_limit: None,
            };
            let (_, p) = pooled.into_iter().next().expect("one");
            recommend(&p.history, current, &policy, &Context::default(), 49 * 3600)
        };
        let kill = ObservedOom {
            key: key("web-7d9f8b6c5d-zzzzz"),
            at: 48 * 3600 + 1800,
            memory: Some(400.0e6),
            request: Some(320.0e6),
        };
        let calm = history(None);
        let killed = history(Some(kill.clone()));
        let calm_memory = calm.recommended.memory.expect("memory") as f64;
        let killed_memory = killed.recommended.memory.expect("memory") as f64;
        assert!(calm_memory < 400.0e6, "{calm_memory}");
        // Bumped from the 400 MB it was killed at (20%, at least 100 MiB more), not from
        // the template's 1 GiB nor from the 300 MB peak the history holds.
        let bump = (400.0e6 * 1.2f64).max(400.0e6 + 100.0 * 1048576.0);
        assert!(
            killed_memory >= bump && killed_memory < bump + 1048576.0,
            "{killed_memory} against {bump}: {:?}",
            killed.reasons
        );
        assert!(
            killed
                .reasons
                .iter()
                .any(|r| r.contains("after an OOM kill")),
            "{:?}",
            killed.reasons
        );
        // A kill of a pod of no workload is not taken in, nor one of a container with no
        // usage: a kill alone makes no history.
        let mut pool = Pool::new(&workloads, &policy, 0);
        pool.observed_oom(
            &ObservedOom {
                key: key("other-1"),
                ..kill.clone()
            },
            3600,
        );
        assert_eq!(pool.unmatched().len(), 1);
        pool.observed_oom(&kill, 3600);
        assert!(pool.finish().is_empty());
    }

    #[test]
    fn a_resumed_pool_skips_samples_it_already_has_and_round_trips() {
        let snapshot = Snapshot::from_yaml("test", SNAPSHOT).expect("snapshot");
        let workloads = Workloads::from_snapshot(&snapshot);
        let policy = Policy::default();
        let mut pool = Pool::new(&workloads, &policy, 0);
        pool.cpu(&key("web-7d9f8b6c5d-abcde"), &[(60, 0.5), (120, 0.5)]);
        let first = pool.finish();
        let checkpoint = Checkpoint::of(&first, &policy, 120);
        let text = serde_json::to_string(&checkpoint).expect("serialises");
        let back: Checkpoint = serde_json::from_str(&text).expect("parses");
        assert_eq!(serde_json::to_string(&back).expect("serialises"), text);
        assert!(back.usable(&policy, 0, 200).is_ok());
        let other = Policy {
            half_life: 3600,
            ..Policy::default()
        };
        assert!(back.usable(&other, 0, 200).is_err());
        let mut pool = Pool::resume(&workloads, &policy, back);
        pool.cpu(&key("web-7d9f8b6c5d-abcde"), &[(120, 0.5), (180, 0.5)]);
        let second = pool.finish();
        let (_, p) = second.iter().next().expect("one");
        assert_eq!(
            p.history.samples(),
            3,
            "the sample at 120 is not counted twice"
        );
    }
}
