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
}

/// The layout of [`DemandHistory::to_json`].
const SAVED_VERSION: u32 = 1;

/// A history as kept across restarts.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Saved {
    version: u32,
    /// Seconds between samples, for readers.
    resolution: i64,
    pools: BTreeMap<String, Vec<[i64; 3]>>,
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
/// DaemonSets' aside), every pool of `input` included (a pool without nodes requests
/// nothing).
fn requested(input: &Input) -> BTreeMap<String, (i64, i64)> {
    let mut out: BTreeMap<String, (i64, i64)> = input
        .pools
        .iter()
        .map(|p| (p.name.clone(), (0, 0)))
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
        }
    }
    out
}

impl DemandHistory {
    /// An empty history that expects nothing until it holds a day: a pool is expected to
    /// need more than it requests now only once yesterday's cycle is known. The agent
    /// keeps its history in memory, so a restart starts over, and holding the peak
    /// before that would block consolidation for a day after every restart.
    pub fn new() -> Self {
        DemandHistory::default()
    }

    /// An empty history that, until it holds a day, expects each pool to need the most it
    /// requested so far, rather than removing capacity at the first trough only to buy it
    /// again at the next peak. For a run that starts with its history (the demo).
    pub fn holding_the_peak_until_a_day() -> Self {
        DemandHistory {
            hold_peak: true,
            ..DemandHistory::default()
        }
    }

    /// Records what the pods on each pool's nodes request at `now`; a sample within
    /// five minutes of the last one is skipped.
    pub fn record(&mut self, input: &Input, now: i64) {
        for (pool, (cpu, memory)) in requested(input) {
            let points = self.pools.entry(pool).or_default();
            if points.back().is_some_and(|p| now - p.t < RESOLUTION) {
                continue;
            }
            points.push_back(Point {
                t: now,
                cpu,
                memory,
            });
            while points.front().is_some_and(|p| now - p.t > KEEP) {
                points.pop_front();
            }
        }
    }

    /// Per pool, the requests its nodes are expected to carry at the most within
    /// `[now, now + horizon]`. A pool whose history does not reach a day back has no entry,
    /// or, when the history holds the peak until a day, is expected to need the most it
    /// requested so far; a pool without history has no entry.
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

    /// Per pool, the share by which its requests are expected to fall within `within`
    /// seconds: how far they fell over the same window one day and one week earlier,
    /// from the window's start to its lowest point, the smaller of CPU's and memory's
    /// fall and the smaller of the two cycles' (both must agree: a pool frees capacity
    /// only when both dimensions shrink, and a cycle that did not fall says nothing will).
    /// A pool without a cycle a day back, or whose requests were not falling then, has no
    /// entry.
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
                let Some(base) = points
                    .iter()
                    .filter(|p| (p.t - then).abs() <= RESOLUTION)
                    .min_by_key(|p| (p.t - then).abs())
                else {
                    continue;
                };
                let (low_cpu, low_memory) = points
                    .iter()
                    .filter(|p| p.t >= base.t && p.t <= then + within)
                    .fold((base.cpu, base.memory), |a, p| {
                        (a.0.min(p.cpu), a.1.min(p.memory))
                    });
                let share = |base: i64, low: i64| -> f64 {
                    if base > 0 {
                        1.0 - low as f64 / base as f64
                    } else {
                        0.0
                    }
                };
                let f = share(base.cpu, low_cpu).min(share(base.memory, low_memory));
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
                        .map(|p| [p.t, p.cpu, p.memory])
                        .collect();
                    (pool.clone(), kept)
                })
                .collect(),
        };
        serde_json::to_string(&saved).unwrap_or_default()
    }

    /// A history read back from [`DemandHistory::to_json`]'s output, expecting nothing
    /// until it holds a day (as [`DemandHistory::new`]). Points older than a week and a
    /// horizon before `now`, or after `now`, are dropped. An error names the pool, the
    /// point and what is wrong with it; nothing of a bad document is used.
    pub fn from_json(json: &str, now: i64) -> Result<Self, String> {
        let saved: Saved =
            serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_str(json))
                .map_err(|e| format!("{}: {}", e.path(), e.inner()))?;
        if saved.version != SAVED_VERSION {
            return Err(format!(
                "version: {} is not {SAVED_VERSION}, the only version this agent reads",
                saved.version
            ));
        }
        let mut history = DemandHistory::new();
        for (pool, points) in saved.pools {
            let mut kept = VecDeque::new();
            let mut last: Option<i64> = None;
            for (i, [t, cpu, memory]) in points.into_iter().enumerate() {
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
                    kept.push_back(Point { t, cpu, memory });
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
        for (pool, (cpu, memory)) in requested(input) {
            let Some(points) = self.pools.get(&pool) else {
                continue;
            };
            let mut grown: Option<(i64, i64)> = None;
            for lag in LAGS {
                let then = now - lag;
                let Some(base) = points
                    .iter()
                    .filter(|p| (p.t - then).abs() <= RESOLUTION)
                    .min_by_key(|p| (p.t - then).abs())
                else {
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
            // Until a day is recorded the cycle is unknown: the capacity needed since the
            // history began is kept, rather than removed at the first trough and bought
            // again at the next peak.
            let grown = grown.or_else(|| {
                if !hold_peak {
                    return None;
                }
                let first = points.front()?;
                (now - first.t >= RESOLUTION).then(|| {
                    points
                        .iter()
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
        let mut pool = default_pool(Vec::new());
        pool.name = "default".to_string();
        Input {
            pending: Vec::new(),
            nodes: vec![ExistingNode {
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

    /// Two days of requests that hold at 10 cores and 32 GiB until noon, fall by 40% over
    /// the next hour and stay there.
    fn falling_at_noon(history: &mut DemandHistory) {
        for day in 0..2 {
            for minute in (0..24 * 60).step_by(5) {
                let t = day * DAY + minute * 60;
                let (cpu, gib) = match minute {
                    m if m < 12 * 60 => (10_000, 32),
                    m if m < 13 * 60 => (8_000, 26),
                    _ => (6_000, 20),
                };
                history.record(&input(cpu, gib), t);
            }
        }
    }

    #[test]
    fn the_fall_the_cycle_expects_is_read_from_the_same_window_a_day_earlier() {
        let mut history = DemandHistory::new();
        falling_at_noon(&mut history);
        // At 11:55 on day 2 the next two hours fell 40% in CPU and 37.5% in memory a day
        // earlier: the smaller is expected.
        let fall = history.expected_fall(&input(10_000, 32), 2 * DAY + 11 * 3600 + 3300, 2 * 3600);
        let f = fall.get("default").copied().expect("a fall for the pool");
        assert!((f - 0.375).abs() < 1e-9, "{f}");
        // Within one hour of 11:30 only the first step (20% CPU, 18.75% memory) is seen.
        let fall = history.expected_fall(&input(10_000, 32), 2 * DAY + 11 * 3600 + 1800, 3600);
        let f = fall.get("default").copied().expect("a fall for the pool");
        assert!((f - 0.1875).abs() < 1e-9, "{f}");
        // In the morning and after the fall, nothing falls within two hours.
        for hour in [6, 14] {
            let fall = history.expected_fall(&input(6_000, 20), 2 * DAY + hour * 3600, 2 * 3600);
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
        young.record(&input(10_000, 32), 0);
        young.record(&input(6_000, 20), 3600);
        assert!(
            young
                .expected_fall(&input(6_000, 20), 2 * 3600, 2 * 3600)
                .is_empty()
        );
        // Only CPU falls: memory holds, so no capacity frees.
        let mut cpu_only = DemandHistory::new();
        for minute in (0..2 * 24 * 60).step_by(5) {
            let cpu = if minute % (24 * 60) < 12 * 60 {
                10_000
            } else {
                6_000
            };
            cpu_only.record(&input(cpu, 8), minute * 60);
        }
        assert!(
            cpu_only
                .expected_fall(&input(10_000, 8), DAY + 11 * 3600, 2 * 3600)
                .is_empty()
        );
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
        let e = refused(r#"{"version":2,"resolution":300,"pools":{}}"#);
        assert!(e.contains("version: 2"), "{e}");
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
            let cpu = if h == 3 { 9_000 } else { 4_000 };
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
    fn before_a_day_of_history_the_most_requested_so_far_is_expected_when_held() {
        let mut history = DemandHistory::holding_the_peak_until_a_day();
        assert!(
            history.expected(&input(4_000, 8), 0, 6 * 3600).is_empty(),
            "no history, no expectation"
        );
        for h in 0..20 {
            let cpu = if h == 10 { 9_000 } else { 4_000 };
            history.record(&input(cpu, 8), h * 3600);
        }
        let expected = history.expected(&input(4_000, 8), 20 * 3600, 6 * 3600);
        assert_eq!(expected["default"].get(&Dimension::Cpu), 9_000);
        // The agent's history (a restart starts it over) expects nothing before a day.
        let mut agent = DemandHistory::new();
        for h in 0..20 {
            let cpu = if h == 10 { 9_000 } else { 4_000 };
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
