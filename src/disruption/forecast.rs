//! What each NodePool's pods will request in the next hours, read from the cycle of what
//! they requested before.
//!
//! Clusters breathe with the day and the week: replicas follow traffic, batch runs at fixed
//! hours. Consolidation that removes at night the nodes the morning buys again pays for a
//! few hours' saving with launches, evictions and pods left pending; given what the pools
//! are expected to carry ([`super::Cluster::expected`]) it keeps that capacity instead.
//!
//! The history is a sample of the requested CPU and memory on each pool's nodes every few
//! minutes. The expectation for `[now, now + horizon]` is today's requests scaled by how
//! much they grew over the same window one day and one week earlier (the larger growth),
//! never below today's. Growth rather than the figures themselves, because right-sizing
//! changes requests between then and now: the cycle's shape survives it, its level does
//! not. Pure: the caller records and asks with its own `now`.

use std::collections::{BTreeMap, VecDeque};

use crate::apis::labels;
use crate::model::{Dimension, Resources};
use crate::scheduling::Input;

/// How far ahead the demo and the agent look by default: a quarter of a day covers a
/// morning ramp and the next run of a job that runs every few hours.
pub const DEFAULT_HORIZON: i64 = 6 * 3600;

/// At most one sample per this many seconds.
const RESOLUTION: i64 = 300;

/// The cycles looked at: the same hours yesterday and a week ago.
const LAGS: [i64; 2] = [86_400, 7 * 86_400];

/// History older than this is dropped: a week back plus a horizon's window.
const KEEP: i64 = 8 * 86_400;

#[derive(Debug, Clone, Copy, PartialEq)]
struct Point {
    t: i64,
    cpu: i64,
    memory: i64,
    /// Pods on the pool's nodes (DaemonSets' aside); `None` in a history kept before
    /// they were recorded.
    pods: Option<i64>,
}

/// The layout of [`DemandHistory::to_json`]: 2 adds the pods to each point.
const SAVED_VERSION: u32 = 2;

/// The layouts [`DemandHistory::from_json`] reads: 1 (`[time, cpu, memory]`) and 2
/// (`[time, cpu, memory, pods]`).
const READ_VERSIONS: [u32; 2] = [1, 2];

/// A history as kept across restarts.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Saved {
    version: u32,
    /// Seconds between samples, for readers.
    resolution: i64,
    pools: BTreeMap<String, Vec<Vec<i64>>>,
}

/// Requested CPU and memory per NodePool over time.
#[derive(Debug, Clone, Default)]
pub struct DemandHistory {
    pools: BTreeMap<String, VecDeque<Point>>,
    /// Whether a pool whose history is shorter than a day is expected to need the most it
    /// requested so far (see [`DemandHistory::holding_the_peak_until_a_day`]).
    hold_peak: bool,
}

/// Requested CPU (millicores) and memory (bytes) of the pods on each pool's nodes (the
/// DaemonSets' aside), and how many they are, every pool of `input` included (a pool
/// without nodes requests nothing).
fn requested(input: &Input) -> BTreeMap<String, (i64, i64, i64)> {
    let mut out: BTreeMap<String, (i64, i64, i64)> = input
        .pools
        .iter()
        .map(|p| (p.name.clone(), (0, 0, 0)))
        .collect();
    for node in &input.nodes {
        let Some(pool) = node.labels.get(labels::NODE_POOL) else {
            continue;
        };
        let e = out.entry(pool.clone()).or_default();
        // A DaemonSet's pods come and go with the nodes: they need no capacity of their
        // own, and counting them would keep a pool's last node for its own DaemonSets.
        for p in node.pods.iter().filter(|p| !super::is_daemon(p)) {
            e.0 += p.requests.get(&Dimension::Cpu);
            e.1 += p.requests.get(&Dimension::Memory);
            e.2 += 1;
        }
    }
    out
}

/// The sample nearest `t`, if one lies within the history's resolution of it.
fn sample_at(points: &VecDeque<Point>, t: i64) -> Option<&Point> {
    points
        .iter()
        .filter(|p| (p.t - t).abs() <= RESOLUTION)
        .min_by_key(|p| (p.t - t).abs())
}

impl DemandHistory {
    /// An empty history that expects nothing until it holds a day: a pool is expected to
    /// need more than it requests now only once yesterday's cycle is known. The agent's:
    /// on a fresh install a scale-down is consolidated at once, as users of consolidation
    /// expect, rather than held for hours by a peak whose cycle is not yet known. Its
    /// history is kept across restarts (`controllers::demand`), so only the first day
    /// after the install goes without a cycle.
    pub fn new() -> Self {
        DemandHistory::default()
    }

    /// Whether a pool whose history is shorter than a day is expected to need the most it
    /// requested over the last horizon ([`DemandHistory::holding_the_peak_until_a_day`]).
    pub fn holds_peak(&self) -> bool {
        self.hold_peak
    }

    /// This history, holding the peak until a day or not as `hold` says: a history read
    /// back ([`DemandHistory::from_json`]) keeps the setting of the one it replaces.
    pub fn with_peak_held(mut self, hold: bool) -> Self {
        self.hold_peak = hold;
        self
    }

    /// An empty history that, until it holds a day, expects each pool to need the most it
    /// requested over the last horizon, rather than removing capacity at the first dip only
    /// to buy it again within the hour. Only that far back: a peak of the morning held
    /// through the afternoon and the night costs a day of the cluster's largest size before
    /// the cycle is known. For a run that starts with its history (the demo).
    pub fn holding_the_peak_until_a_day() -> Self {
        DemandHistory {
            hold_peak: true,
            ..DemandHistory::default()
        }
    }

    /// Records what the pods on each pool's nodes request at `now`; a sample within
    /// five minutes of the last one is skipped.
    pub fn record(&mut self, input: &Input, now: i64) {
        for (pool, (cpu, memory, pods)) in requested(input) {
            let points = self.pools.entry(pool).or_default();
            if points.back().is_some_and(|p| now - p.t < RESOLUTION) {
                continue;
            }
            points.push_back(Point {
                t: now,
                cpu,
                memory,
                pods: Some(pods),
            });
            while points.front().is_some_and(|p| now - p.t > KEEP) {
                points.pop_front();
            }
        }
    }

    /// Per pool, the requests its nodes are expected to carry at the most within
    /// `[now, now + horizon]`. A pool whose history does not reach a day back has no entry,
    /// or, when the history holds the peak until a day, is expected to need the most it
    /// requested within `[now - horizon, now]`; a pool without history has no entry.
    pub fn expected(&self, input: &Input, now: i64, horizon: i64) -> BTreeMap<String, Resources> {
        self.expected_within(input, now, horizon, self.hold_peak)
    }

    /// Per pool, the requests its nodes are expected to carry at the most within
    /// `[now, now + horizon]` from the cycle alone: a pool whose history does not reach a
    /// day back has no entry, whether or not the history holds the peak until a day. What
    /// to buy ahead on: the peak so far says what to keep, not when it comes back.
    pub fn expected_from_cycle(
        &self,
        input: &Input,
        now: i64,
        horizon: i64,
    ) -> BTreeMap<String, Resources> {
        self.expected_within(input, now, horizon, false)
    }

    /// Per pool, the share of its pods the workloads' own scale-down is expected to
    /// remove within `within` seconds: how far the pods on its nodes fell over the same
    /// window one day and one week earlier, from the window's start to its lowest point,
    /// the smaller of the two cycles' (a cycle that did not fall says nothing will). Pods,
    /// not requests: right-sizing cuts requests in steps that are no cycle, and only pods
    /// that go free room without an eviction. A pool without a cycle a day back, or whose
    /// pods were not falling then, has no entry.
    pub fn expected_fall(&self, input: &Input, now: i64, within: i64) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        if within <= 0 {
            return out;
        }
        for pool in requested(input).into_keys() {
            let Some(points) = self.pools.get(&pool) else {
                continue;
            };
            let mut fall: Option<f64> = None;
            for lag in LAGS {
                let then = now - lag;
                let Some((base_t, Some(base))) = sample_at(points, then).map(|p| (p.t, p.pods))
                else {
                    continue;
                };
                let low = points
                    .iter()
                    .filter(|p| p.t >= base_t && p.t <= then + within)
                    .filter_map(|p| p.pods)
                    .fold(base, i64::min);
                let f = if base > 0 {
                    1.0 - low as f64 / base as f64
                } else {
                    0.0
                };
                fall = Some(fall.map_or(f, |g| g.min(f)));
            }
            if let Some(f) = fall.filter(|f| *f > 0.0) {
                out.insert(pool, f);
            }
        }
        out
    }

    /// The newest sample's time, over all pools.
    pub fn newest(&self) -> Option<i64> {
        self.pools
            .values()
            .filter_map(|p| p.back())
            .map(|p| p.t)
            .max()
    }

    /// The history as JSON, for keeping it across restarts: per pool, `[time, cpu
    /// millicores, memory bytes]` in time order. Points older than `keep` seconds before the
    /// newest are left out (the history needs a week and a horizon; a smaller `keep`
    /// bounds the size where many pools would not fit an object).
    pub fn to_json(&self, keep: i64) -> String {
        let newest = self.newest().unwrap_or(0);
        let saved = Saved {
            version: SAVED_VERSION,
            resolution: RESOLUTION,
            pools: self
                .pools
                .iter()
                .map(|(pool, points)| {
                    let kept = points
                        .iter()
                        .filter(|p| newest - p.t <= keep)
                        .map(|p| match p.pods {
                            Some(pods) => vec![p.t, p.cpu, p.memory, pods],
                            // A point read from a history kept before pods were
                            // recorded: its pods are not known, and 0 would read as a
                            // fall.
                            None => vec![p.t, p.cpu, p.memory, -1],
                        })
                        .collect();
                    (pool.clone(), kept)
                })
                .collect(),
        };
        serde_json::to_string(&saved).unwrap_or_default()
    }

    /// A history read back from [`DemandHistory::to_json`]'s output, expecting nothing
    /// until it holds a day (as [`DemandHistory::new`]; the setting is not saved, see
    /// [`DemandHistory::with_peak_held`]). Points older than a week and a
    /// horizon before `now`, or after `now`, are dropped. An error names the pool, the
    /// point and what is wrong with it; nothing of a bad document is used.
    pub fn from_json(json: &str, now: i64) -> Result<Self, String> {
        let saved: Saved =
            serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_str(json))
                .map_err(|e| format!("{}: {}", e.path(), e.inner()))?;
        if !READ_VERSIONS.contains(&saved.version) {
            return Err(format!(
                "version: {} is not one this agent reads ({READ_VERSIONS:?})",
                saved.version
            ));
        }
        let fields = if saved.version == 1 { 3 } else { 4 };
        let mut history = DemandHistory::new();
        for (pool, points) in saved.pools {
            let mut kept = VecDeque::new();
            let mut last: Option<i64> = None;
            for (i, point) in points.into_iter().enumerate() {
                if point.len() != fields {
                    return Err(format!(
                        "pools.{pool}[{i}]: {} numbers, version {} has {fields}",
                        point.len(),
                        saved.version
                    ));
                }
                // Every version has at least these three.
                let (t, cpu, memory) = (point[0], point[1], point[2]);
                // Version 2's pods; -1 where they were not recorded.
                let pods = point.get(3).copied();
                if let Some(p) = pods.filter(|p| *p < -1) {
                    return Err(format!("pools.{pool}[{i}]: {p} pods must not be negative"));
                }
                let pods = pods.filter(|p| *p >= 0);
                if cpu < 0 || memory < 0 {
                    return Err(format!(
                        "pools.{pool}[{i}]: requests {cpu}m CPU and {memory} bytes must not be negative"
                    ));
                }
                if last.is_some_and(|l| t <= l) {
                    return Err(format!(
                        "pools.{pool}[{i}]: time {t} is not after the point before it"
                    ));
                }
                last = Some(t);
                if t <= now && now - t <= KEEP {
                    kept.push_back(Point {
                        t,
                        cpu,
                        memory,
                        pods,
                    });
                }
            }
            if !kept.is_empty() {
                history.pools.insert(pool, kept);
            }
        }
        Ok(history)
    }

    fn expected_within(
        &self,
        input: &Input,
        now: i64,
        horizon: i64,
        hold_peak: bool,
    ) -> BTreeMap<String, Resources> {
        let mut out = BTreeMap::new();
        if horizon <= 0 {
            return out;
        }
        for (pool, (cpu, memory, _)) in requested(input) {
            let Some(points) = self.pools.get(&pool) else {
                continue;
            };
            let mut grown: Option<(i64, i64)> = None;
            for lag in LAGS {
                let then = now - lag;
                let Some(base) = sample_at(points, then) else {
                    continue;
                };
                let window = points
                    .iter()
                    .filter(|p| p.t >= then && p.t <= then + horizon);
                let (peak_cpu, peak_memory) =
                    window.fold((0, 0), |a, p| (a.0.max(p.cpu), a.1.max(p.memory)));
                let scale = |now: i64, base: i64, peak: i64| -> i64 {
                    if base > 0 && now > 0 {
                        (now as f64 * peak as f64 / base as f64).round() as i64
                    } else {
                        // Nothing ran then, or nothing runs now (a Job's pool between
                        // runs): growth from nothing has no ratio, and what ran at the
                        // peak is what to expect.
                        peak
                    }
                };
                let e = (
                    scale(cpu, base.cpu, peak_cpu).max(cpu),
                    scale(memory, base.memory, peak_memory).max(memory),
                );
                grown = Some(grown.map_or(e, |g| (g.0.max(e.0), g.1.max(e.1))));
            }
            // Until a day is recorded the cycle is unknown: the capacity needed over the
            // last horizon is kept, looking back as far as the cycle would look ahead,
            // rather than removed at the first dip and bought again within the hour.
            let grown = grown.or_else(|| {
                if !hold_peak {
                    return None;
                }
                let first = points.front()?;
                (now - first.t >= RESOLUTION).then(|| {
                    points
                        .iter()
                        .filter(|p| p.t >= now - horizon)
                        .fold((cpu, memory), |a, p| (a.0.max(p.cpu), a.1.max(p.memory)))
                })
            });
            if let Some((cpu, memory)) = grown {
                out.insert(pool, Resources::cpu_memory(cpu, memory));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::input::default_pool;
    use crate::scheduling::{ExistingNode, PodInfo};

    const DAY: i64 = 86_400;

    /// One node of pool `default` whose pods request `cpu` millicores and `gib` GiB.
    fn input(cpu: i64, gib: i64) -> Input {
        let mut pod = PodInfo::new("shop/web-1", Resources::cpu_memory(cpu, gib << 30));
        pod.node_name = Some("n1".to_string());
        let mut pool = default_pool(&crate::scheduling::PoolTypes::default());
        pool.name = "default".to_string();
        Input {
            pending: Vec::new(),
            nodes: vec![ExistingNode {
                derived: Default::default(),
                name: "n1".to_string(),
                labels: BTreeMap::from([(labels::NODE_POOL.to_string(), "default".to_string())]),
                taints: Vec::new(),
                allocatable: Resources::cpu_memory(16_000, 64 << 30),
                pods: vec![std::sync::Arc::new(pod)],
                unschedulable: false,
            }],
            pools: vec![pool],
            daemon_sets: Vec::new(),
        }
    }

    /// A day whose requests are 4 cores at night (hours 0-7) and 10 cores by day.
    fn a_day_of_cycle(history: &mut DemandHistory, day: i64) {
        for minute in (0..24 * 60).step_by(5) {
            let t = day * DAY + minute * 60;
            let cpu = if minute < 8 * 60 { 4_000 } else { 10_000 };
            history.record(&input(cpu, 8), t);
        }
    }

    /// One node of pool `default` running `pods` pods of `cpu` millicores and 1 GiB each.
    fn pods_input(pods: usize, cpu: i64) -> Input {
        let mut one = input(0, 0);
        let template = (*one.nodes[0].pods[0]).clone();
        one.nodes[0].pods = (0..pods)
            .map(|i| {
                let mut p = template.clone();
                p.key = format!("shop/web-{i}");
                p.requests = Resources::cpu_memory(cpu, 1 << 30);
                std::sync::Arc::new(p)
            })
            .collect();
        one
    }

    /// Two days whose pods hold at 10 until noon, fall to 8 over the next hour and to 6
    /// after; each pod's CPU request is `cpu_before` until noon and `cpu_after` from then.
    fn falling_at_noon(history: &mut DemandHistory, cpu_before: i64, cpu_after: i64) {
        for day in 0..2 {
            for minute in (0..24 * 60).step_by(5) {
                let t = day * DAY + minute * 60;
                let (pods, cpu) = match minute {
                    m if m < 12 * 60 => (10, cpu_before),
                    m if m < 13 * 60 => (8, cpu_after),
                    _ => (6, cpu_after),
                };
                history.record(&pods_input(pods, cpu), t);
            }
        }
    }

    #[test]
    fn the_fall_the_cycle_expects_is_read_from_the_pods_a_day_earlier() {
        let mut history = DemandHistory::new();
        falling_at_noon(&mut history, 1_000, 1_000);
        // At 11:55 on day 2 the next two hours lost 40% of the pods a day earlier.
        let fall =
            history.expected_fall(&pods_input(10, 1_000), 2 * DAY + 11 * 3600 + 3300, 2 * 3600);
        let f = fall.get("default").copied().expect("a fall for the pool");
        assert!((f - 0.4).abs() < 1e-9, "{f}");
        // Within one hour of 11:30 only the first step (20%) is seen.
        let fall = history.expected_fall(&pods_input(10, 1_000), 2 * DAY + 11 * 3600 + 1800, 3600);
        let f = fall.get("default").copied().expect("a fall for the pool");
        assert!((f - 0.2).abs() < 1e-9, "{f}");
        // In the morning and after the fall, nothing falls within two hours.
        for hour in [6, 14] {
            let fall =
                history.expected_fall(&pods_input(6, 1_000), 2 * DAY + hour * 3600, 2 * 3600);
            assert!(fall.is_empty(), "{hour}h: {fall:?}");
        }
        // A ramp up is no fall, and without a day of history nothing is expected.
        let mut rising = DemandHistory::new();
        a_day_of_cycle(&mut rising, 0);
        a_day_of_cycle(&mut rising, 1);
        assert!(
            rising
                .expected_fall(&input(4_000, 8), 2 * DAY + 7 * 3600, 2 * 3600)
                .is_empty()
        );
        let mut young = DemandHistory::new();
        young.record(&pods_input(10, 1_000), 0);
        young.record(&pods_input(6, 1_000), 3600);
        assert!(
            young
                .expected_fall(&pods_input(6, 1_000), 2 * 3600, 2 * 3600)
                .is_empty()
        );
        // Requests cut in a step with every pod staying (right-sizing) free no node: no
        // fall, though the requests fell by half.
        let mut resized = DemandHistory::new();
        for minute in (0..2 * 24 * 60).step_by(5) {
            let cpu = if minute % (24 * 60) < 12 * 60 {
                1_000
            } else {
                500
            };
            resized.record(&pods_input(10, cpu), minute * 60);
        }
        assert!(
            resized
                .expected_fall(&pods_input(10, 1_000), DAY + 11 * 3600, 2 * 3600)
                .is_empty()
        );
        // A history kept before pods were recorded expects no fall, and still expects
        // its growth.
        let v1: Vec<[i64; 3]> = (0..24 * 12)
            .map(|i| [i * 300, 10_000 - i, 8 << 30])
            .collect();
        let json = serde_json::json!({"version": 1, "resolution": 300, "pools": {"default": v1}});
        let old = DemandHistory::from_json(&json.to_string(), DAY + 3600).expect("version 1 reads");
        assert!(
            old.expected_fall(&input(10_000, 8), DAY + 3600, 2 * 3600)
                .is_empty()
        );
        let again = DemandHistory::from_json(&old.to_json(KEEP), DAY + 3600).expect("reads back");
        assert!(
            again
                .expected_fall(&input(10_000, 8), DAY + 3600, 2 * 3600)
                .is_empty()
        );
        assert_eq!(again.pools["default"], old.pools["default"]);
    }

    #[test]
    fn a_history_read_back_holds_the_peak_only_when_the_run_it_joins_does() {
        let mut held = DemandHistory::holding_the_peak_until_a_day();
        held.record(&input(10_000, 8), 0);
        held.record(&input(4_000, 8), 3600);
        let now = 2 * 3600;
        let peak = |h: &DemandHistory| {
            h.expected(&input(4_000, 8), now, 6 * 3600)
                .get("default")
                .map(|r| r.get(&Dimension::Cpu))
        };
        assert!(held.holds_peak());
        assert_eq!(peak(&held), Some(10_000));
        // The setting is not in the saved document: read back, the history expects
        // nothing before a day...
        let back = DemandHistory::from_json(&held.to_json(KEEP), now).expect("reads back");
        assert!(!back.holds_peak());
        assert_eq!(peak(&back), None);
        // ... until the run that reads it says it holds the peak, as the demo does.
        let joined = back.with_peak_held(true);
        assert_eq!(peak(&joined), Some(10_000));
        assert_eq!(peak(&joined.with_peak_held(false)), None);
    }

    #[test]
    fn a_saved_history_read_back_expects_the_same_and_a_bad_one_is_refused() {
        let mut history = DemandHistory::new();
        a_day_of_cycle(&mut history, 0);
        let now = DAY + 5 * 3600;
        let json = history.to_json(KEEP);
        let back = DemandHistory::from_json(&json, now).expect("reads back");
        let expected = back.expected(&input(4_000, 8), now, 6 * 3600);
        assert_eq!(expected["default"].get(&Dimension::Cpu), 10_000);
        assert_eq!(expected, history.expected(&input(4_000, 8), now, 6 * 3600));
        // Kept to a shorter span, only the newest points are written.
        let short = DemandHistory::from_json(&history.to_json(3600), now).expect("reads");
        assert_eq!(short.pools["default"].len(), 13);
        // Read long after, nothing is left to expect from.
        let stale = DemandHistory::from_json(&json, 30 * DAY).expect("reads");
        assert!(stale.pools.is_empty());
        assert!(stale.expected(&input(4_000, 8), 30 * DAY, 3600).is_empty());

        let refused = |json: &str| DemandHistory::from_json(json, now).expect_err(json);
        assert!(refused("{").contains("EOF"), "{}", refused("{"));
        let e = refused(r#"{"version":3,"resolution":300,"pools":{}}"#);
        assert!(e.contains("version: 3"), "{e}");
        let e = refused(r#"{"version":1,"resolution":300,"pools":{"gpu":[[10,1,1,1]]}}"#);
        assert!(
            e.contains("pools.gpu[0]: 4 numbers, version 1 has 3"),
            "{e}"
        );
        let e = refused(r#"{"version":2,"resolution":300,"pools":{"gpu":[[10,1,1]]}}"#);
        assert!(
            e.contains("pools.gpu[0]: 3 numbers, version 2 has 4"),
            "{e}"
        );
        let e = refused(r#"{"version":2,"resolution":300,"pools":{"gpu":[[10,1,1,-2]]}}"#);
        assert!(e.contains("pools.gpu[0]: -2 pods"), "{e}");
        let e = refused(r#"{"version":1,"resolution":300,"pools":{"default":[[10,1,1],[5,1,1]]}}"#);
        assert!(e.contains("pools.default[1]: time 5"), "{e}");
        let e = refused(r#"{"version":1,"resolution":300,"pools":{"gpu":[[10,-1,1]]}}"#);
        assert!(e.contains("pools.gpu[0]") && e.contains("-1m"), "{e}");
        let e = refused(r#"{"version":1,"resolution":300,"pools":{"gpu":[[10,1]]}}"#);
        assert!(e.contains("pools.gpu[0]"), "{e}");
    }

    #[test]
    fn the_morning_ramp_seen_yesterday_is_expected_before_dawn() {
        let mut history = DemandHistory::new();
        a_day_of_cycle(&mut history, 0);
        // Day 1, 05:00: 4 cores now; yesterday they grew 2.5x between 05:00 and 11:00.
        let now = DAY + 5 * 3600;
        let expected = history.expected(&input(4_000, 8), now, 6 * 3600);
        let e = &expected["default"];
        assert_eq!(e.get(&Dimension::Cpu), 10_000);
        assert_eq!(e.get(&Dimension::Memory), 8 << 30, "memory did not grow");
        // At 12:00 nothing grows in the next six hours: today's requests are expected.
        let expected = history.expected(&input(10_000, 8), DAY + 12 * 3600, 6 * 3600);
        assert_eq!(expected["default"].get(&Dimension::Cpu), 10_000);
    }

    #[test]
    fn the_cycle_alone_expects_nothing_before_a_day_even_when_the_peak_is_held() {
        let mut history = DemandHistory::holding_the_peak_until_a_day();
        for h in 0..20 {
            let cpu = if h == 16 { 9_000 } else { 4_000 };
            history.record(&input(cpu, 8), h * 3600);
        }
        let now = 20 * 3600;
        // The held peak is what disruption keeps...
        let held = history.expected(&input(4_000, 8), now, 6 * 3600);
        assert_eq!(held["default"].get(&Dimension::Cpu), 9_000);
        // ...but it says nothing of when it comes back: nothing to buy ahead for.
        assert!(
            history
                .expected_from_cycle(&input(4_000, 8), now, 6 * 3600)
                .is_empty()
        );
        // A day later the cycle answers both.
        let mut history = DemandHistory::holding_the_peak_until_a_day();
        a_day_of_cycle(&mut history, 0);
        let now = DAY + 5 * 3600;
        assert_eq!(
            history.expected_from_cycle(&input(4_000, 8), now, 6 * 3600)["default"]
                .get(&Dimension::Cpu),
            10_000
        );
    }

    #[test]
    fn growth_scales_todays_requests_not_yesterdays() {
        let mut history = DemandHistory::new();
        a_day_of_cycle(&mut history, 0);
        // Right-sizing halved every request since: the ramp is 2.5x of today's 2 cores.
        let expected = history.expected(&input(2_000, 4), DAY + 5 * 3600, 6 * 3600);
        assert_eq!(expected["default"].get(&Dimension::Cpu), 5_000);
        assert_eq!(expected["default"].get(&Dimension::Memory), 4 << 30);
    }

    #[test]
    fn a_pool_that_carries_nothing_now_expects_what_ran_then() {
        // A Job's pool: 3 cores for the first two hours of each 4-hour cycle, and nothing
        // between runs.
        let mut history = DemandHistory::new();
        let cpu_at = |t: i64| if t % (4 * 3600) < 2 * 3600 { 3_000 } else { 0 };
        for minute in (0..30 * 60).step_by(5) {
            let t = minute * 60;
            history.record(&input(cpu_at(t), 1), t);
        }
        // An hour into a run yesterday at this time; today's has not started yet (it is
        // late, or its pods are pending): growth from nothing has no ratio, and the run is
        // what to expect.
        let now = DAY + 3600;
        assert_eq!(cpu_at(now - DAY), 3_000);
        let expected = history.expected(&input(0, 0), now, 6 * 3600);
        assert_eq!(expected["default"].get(&Dimension::Cpu), 3_000);
    }

    #[test]
    fn before_a_day_of_history_the_most_requested_over_the_horizon_is_expected_when_held() {
        let mut history = DemandHistory::holding_the_peak_until_a_day();
        assert!(
            history.expected(&input(4_000, 8), 0, 6 * 3600).is_empty(),
            "no history, no expectation"
        );
        for h in 0..20 {
            let cpu = match h {
                3 => 12_000,
                16 => 9_000,
                _ => 4_000,
            };
            history.record(&input(cpu, 8), h * 3600);
        }
        // Held: the peak of the last six hours (16:00), not the higher one of 03:00.
        let expected = history.expected(&input(4_000, 8), 20 * 3600, 6 * 3600);
        assert_eq!(expected["default"].get(&Dimension::Cpu), 9_000);
        // More than six hours past it, today's requests are all that is kept.
        let expected = history.expected(&input(4_000, 8), 23 * 3600, 6 * 3600);
        assert_eq!(expected["default"].get(&Dimension::Cpu), 4_000);
        // The agent's history (a restart starts it over) expects nothing before a day.
        let mut agent = DemandHistory::new();
        for h in 0..20 {
            let cpu = if h == 16 { 9_000 } else { 4_000 };
            agent.record(&input(cpu, 8), h * 3600);
        }
        assert!(
            agent
                .expected(&input(4_000, 8), 20 * 3600, 6 * 3600)
                .is_empty()
        );
    }

    #[test]
    fn daemon_set_pods_are_not_demand_a_pool_must_keep_capacity_for() {
        // A pool whose last node holds only its DaemonSets' pods, all day long.
        let mut only_daemons = input(500, 1);
        let node = &mut only_daemons.nodes[0];
        let mut daemon = PodInfo::clone(&node.pods[0]);
        daemon.owner = Some("DaemonSet/log-agent".to_string());
        node.pods = vec![std::sync::Arc::new(daemon)];
        let mut history = DemandHistory::new();
        for minute in (0..26 * 60).step_by(5) {
            history.record(&only_daemons, minute * 60);
        }
        let now = 26 * 3600;
        let expected = history.expected(&only_daemons, now, 6 * 3600);
        assert_eq!(
            expected["default"],
            Resources::cpu_memory(0, 0),
            "{expected:?}"
        );
        // The same requests from a workload's pod are demand.
        let mut history = DemandHistory::new();
        for minute in (0..26 * 60).step_by(5) {
            history.record(&input(500, 1), minute * 60);
        }
        let expected = history.expected(&input(500, 1), now, 6 * 3600);
        assert_eq!(expected["default"].get(&Dimension::Cpu), 500);
    }

    #[test]
    fn without_a_horizon_nothing_is_expected() {
        let mut history = DemandHistory::new();
        a_day_of_cycle(&mut history, 0);
        assert!(history.expected(&input(4_000, 8), DAY + 3600, 0).is_empty());
    }

    #[test]
    fn samples_closer_than_five_minutes_and_older_than_eight_days_are_dropped() {
        let mut history = DemandHistory::new();
        history.record(&input(1_000, 1), 0);
        history.record(&input(9_000, 1), 60);
        assert_eq!(history.pools["default"].len(), 1);
        history.record(&input(1_000, 1), 9 * DAY);
        assert_eq!(
            history.pools["default"].len(),
            1,
            "the first is past a week and a day"
        );
    }
}
