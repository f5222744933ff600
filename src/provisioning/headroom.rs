//! Capacity bought ahead of a NodePool's expected growth.
//!
//! A pool whose requests follow the day grows every morning, and every pod of that growth
//! waits for a node to launch when the capacity it needs was consolidated away overnight.
//! Given what each pool is expected to carry within a short lead time (the requests' daily
//! and weekly cycle, [`crate::disruption::forecast::DemandHistory`]), the provisioner plans
//! stand-in pods for the growth beyond what the pool's nodes carry now: the scheduler
//! places them in the room the pool has and plans nodes for the rest, which are launched
//! before the pods arrive. Stand-ins are never created anywhere; only the nodes planned
//! for them are launched, and consolidation keeps those nodes because the same forecast
//! expects them to be needed. When the room runs short within the lead, the purchase
//! covers the growth of the whole forecast horizon at once ([`plan`]), in a few larger
//! nodes rather than one more every hour of the ramp.
//!
//! The simulated cluster (`tailor demo`) and the in-cluster provisioning controller both
//! buy ahead with [`plan`], from the history the disruption controller records.
//!
//! Pure: the caller passes the cluster and the history the forecast reads.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;

use crate::apis::labels;
use crate::disruption::forecast::DemandHistory;
use crate::model::{Dimension, NodeRequirements, Requirement, Requirements, Resources};
use crate::scheduling::{self, Input, Options, PlannedNodeClaim, PodInfo};

/// How far ahead the provisioner buys for expected growth by default: well past a launch
/// and a registration, and enough of a morning ramp that its capacity comes in a few
/// larger nodes rather than one small node every hour; capacity bought early costs a few
/// node-hours a day.
pub const DEFAULT_LEAD: i64 = 3 * 3600;

/// How much above the forecast a purchase for the horizon buys, as a share of the
/// requests each pool is expected to carry. A morning that ramps past yesterday's, and
/// real pods that fill nodes less neatly than equal stand-ins, otherwise need a few more
/// small nodes every hour of the ramp, each a launch. It stays below the share
/// consolidation keeps above the forecast (`disruption::DEFAULT_EXPECTED_HEADROOM`), so
/// what is bought this way is not removed while the forecast holds. Chosen on the demo's
/// tuning seeds (1-20, 7 days): without it node launches reached 63 and pending pod-hours
/// 3.03; at 0.1, 54 and 2.25; at 0.2, 44 launches but a cost of 0.591 of
/// consolidation-only's, too close to its 0.6 target.
pub const DEFAULT_MARGIN: f64 = 0.1;

/// Namespace of the stand-in pods (their keys are `tailor-headroom/<pool>-<n>`).
pub const STAND_IN_NAMESPACE: &str = "tailor-headroom";

/// At most this many stand-ins per pool in one round: growth past it is bought over the
/// following rounds.
const MAX_STAND_INS: usize = 200;

/// Whether a planned pod is a headroom stand-in rather than a real pod.
pub fn is_stand_in(key: &str) -> bool {
    key.strip_prefix(STAND_IN_NAMESPACE)
        .is_some_and(|rest| rest.starts_with('/'))
}

/// Stand-in pods for the requests each pool is expected to add within the lead time:
/// `expected` (per pool, the requests its nodes are expected to carry) minus what the
/// pool's nodes carry now and what pending pods will add. The growth is split into pods
/// the size of the pool's median pod (DaemonSet pods, which follow the nodes, aside), so
/// the scheduler fits them into the room existing nodes have the way the real pods will
/// fit; each stand-in is pinned to its pool and tolerates the pool's taints. A pool that
/// carries no pods yet, or that is not expected to grow, gets none.
pub fn stand_ins(input: &Input, expected: &BTreeMap<String, Resources>) -> Vec<PodInfo> {
    let mut out = Vec::new();
    for pool in &input.pools {
        let Some(want) = expected.get(&pool.name) else {
            continue;
        };
        let on_pool: Vec<&PodInfo> = input
            .nodes
            .iter()
            .filter(|n| n.labels.get(labels::NODE_POOL) == Some(&pool.name))
            .flat_map(|n| n.pods.iter().map(AsRef::as_ref))
            .filter(|p| !crate::disruption::is_daemon(p))
            .collect();
        let carried = |d: &Dimension| -> i64 { on_pool.iter().map(|p| p.requests.get(d)).sum() };
        // Pending pods are on their way to some pool; counting them against every pool
        // they could land on errs towards buying less.
        let pending = |d: &Dimension| -> i64 {
            input
                .pending
                .iter()
                .filter(|p| p.node_requirements.admits_labels(&pool_labels(&pool.name)))
                .map(|p| p.requests.get(d))
                .sum()
        };
        let gap = |d: Dimension| (want.get(&d) - carried(&d) - pending(&d)).max(0);
        let (cpu, memory) = (gap(Dimension::Cpu), gap(Dimension::Memory));
        if cpu == 0 && memory == 0 {
            continue;
        }
        let mut sizes: Vec<(i64, i64)> = on_pool
            .iter()
            .map(|p| {
                (
                    p.requests.get(&Dimension::Cpu),
                    p.requests.get(&Dimension::Memory),
                )
            })
            .collect();
        if sizes.is_empty() {
            continue;
        }
        let median = |mut v: Vec<i64>| -> i64 {
            v.sort_unstable();
            v[v.len() / 2]
        };
        let typical_cpu = median(sizes.iter().map(|s| s.0).collect()).max(1);
        let typical_memory = median(sizes.drain(..).map(|s| s.1).collect()).max(1);
        let count = (cpu as f64 / typical_cpu as f64)
            .max(memory as f64 / typical_memory as f64)
            .ceil()
            .clamp(1.0, MAX_STAND_INS as f64) as i64;
        let tolerations: Vec<Toleration> = pool
            .taints
            .iter()
            .map(|t| Toleration {
                key: Some(t.key.clone()),
                operator: Some("Equal".to_string()),
                value: t.value.clone(),
                effect: Some(t.effect.clone()),
                ..Toleration::default()
            })
            .collect();
        let pinned = NodeRequirements::new(
            Requirements::new().with(Requirement::one_of(labels::NODE_POOL, [&pool.name])),
            Vec::new(),
        );
        for i in 0..count {
            // The growth split evenly, rounded up, so the stand-ins cover all of it.
            let share = |total: i64| (total + count - 1) / count;
            let mut requests = Resources::cpu_memory(share(cpu), share(memory));
            requests.set(&Dimension::Pods, 1);
            let mut stand_in =
                PodInfo::new(&format!("{STAND_IN_NAMESPACE}/{}-{i}", pool.name), requests);
            stand_in.node_requirements = pinned.clone();
            stand_in.tolerations = tolerations.clone();
            out.push(stand_in);
        }
    }
    out
}

/// The NodeClaims to launch ahead of the growth `history`'s cycle expects: none while
/// the room the pools have holds what is expected within `lead` seconds; otherwise the
/// nodes planned for the growth expected within `horizon` (at least `lead`), with
/// `margin` (a share of each pool's expected requests, [`DEFAULT_MARGIN`]) on top.
/// `input`'s pending pods are ignored (the caller buys ahead only when none is pending)
/// and the stand-ins planned onto each claim are in its `pods`.
pub fn plan(
    input: &Input,
    history: &DemandHistory,
    now: i64,
    lead: i64,
    horizon: i64,
    margin: f64,
    options: &Options,
) -> Vec<PlannedNodeClaim> {
    if lead <= 0 {
        return Vec::new();
    }
    let mut input = Input {
        pending: Vec::new(),
        ..input.clone()
    };
    // Whether to buy is asked of the forecast itself; what to buy has the margin on top.
    input.pending = stand_ins(&input, &history.expected_from_cycle(&input, now, lead));
    if input.pending.is_empty() {
        return Vec::new();
    }
    let plan = scheduling::schedule(&input, options);
    if plan.node_claims.is_empty() || (horizon <= lead && margin <= 0.0) {
        return plan.node_claims;
    }
    input.pending = Vec::new();
    let mut expected = history.expected_from_cycle(&input, now, horizon.max(lead));
    for requests in expected.values_mut() {
        for d in [Dimension::Cpu, Dimension::Memory] {
            requests.set(
                &d,
                (requests.get(&d) as f64 * (1.0 + margin.max(0.0))) as i64,
            );
        }
    }
    input.pending = stand_ins(&input, &expected);
    scheduling::schedule(&input, options).node_claims
}

/// The one label every node of `pool` has that says so.
fn pool_labels(pool: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(labels::NODE_POOL.to_string(), pool.to_string())])
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::Taint;

    use super::*;
    use crate::scheduling::input::default_pool;
    use crate::scheduling::{ExistingNode, Options, schedule};

    fn pod(key: &str, cpu: i64, memory: i64) -> PodInfo {
        let mut requests = Resources::cpu_memory(cpu, memory);
        requests.set(&Dimension::Pods, 1);
        let mut p = PodInfo::new(key, requests);
        p.owner = Some("Deployment/web".to_string());
        p
    }

    fn node(name: &str, pool: &str, cpu: i64, memory: i64, pods: Vec<PodInfo>) -> ExistingNode {
        let mut allocatable = Resources::cpu_memory(cpu, memory);
        allocatable.set(&Dimension::Pods, 110);
        ExistingNode {
            derived: Default::default(),
            name: name.to_string(),
            labels: pool_labels(pool),
            taints: Vec::new(),
            allocatable,
            pods: pods.into_iter().map(Arc::new).collect(),
            unschedulable: false,
        }
    }

    const GIB: i64 = 1 << 30;

    fn input(nodes: Vec<ExistingNode>, pending: Vec<PodInfo>) -> Input {
        let mut pool = default_pool(&crate::scheduling::PoolTypes::default());
        pool.name = "default".to_string();
        pool.requirements = pool
            .requirements
            .with(Requirement::one_of(labels::NODE_POOL, ["default"]));
        Input {
            pending,
            nodes,
            pools: vec![pool],
            daemon_sets: Vec::new(),
        }
    }

    fn expecting(cpu: i64, memory: i64) -> BTreeMap<String, Resources> {
        BTreeMap::from([("default".to_string(), Resources::cpu_memory(cpu, memory))])
    }

    fn total(pods: &[PodInfo], d: Dimension) -> i64 {
        pods.iter().map(|p| p.requests.get(&d)).sum()
    }

    #[test]
    fn the_expected_growth_becomes_pods_the_size_of_the_pools_median_pod() {
        // Four pods of 500m/1Gi carried; 4 cores and 8 GiB expected: 2 cores and 4 GiB to
        // come, four pods of the median size.
        let pods = (0..4)
            .map(|i| pod(&format!("shop/web-{i}"), 500, GIB))
            .collect();
        let input = input(vec![node("n1", "default", 4000, 16 * GIB, pods)], vec![]);
        let stand_ins = stand_ins(&input, &expecting(4000, 8 * GIB));
        assert_eq!(stand_ins.len(), 4);
        assert_eq!(total(&stand_ins, Dimension::Cpu), 2000);
        assert_eq!(total(&stand_ins, Dimension::Memory), 4 * GIB);
        assert!(stand_ins.iter().all(|p| is_stand_in(&p.key)));
        // Pinned to the pool.
        let elsewhere = pool_labels("spot");
        assert!(
            stand_ins
                .iter()
                .all(|p| !p.node_requirements.admits_labels(&elsewhere)
                    && p.node_requirements.admits_labels(&pool_labels("default")))
        );
    }

    #[test]
    fn no_growth_expected_or_pending_pods_covering_it_means_no_stand_ins() {
        let pods = vec![pod("shop/web-0", 1000, 2 * GIB)];
        let carried = input(
            vec![node("n1", "default", 4000, 16 * GIB, pods.clone())],
            vec![],
        );
        // Expected no more than carried.
        assert!(stand_ins(&carried, &expecting(1000, 2 * GIB)).is_empty());
        // A pool the forecast says nothing of.
        assert!(stand_ins(&carried, &BTreeMap::new()).is_empty());
        // Growth already pending.
        let with_pending = input(
            vec![node("n1", "default", 4000, 16 * GIB, pods)],
            vec![pod("shop/web-1", 1000, 2 * GIB)],
        );
        assert!(stand_ins(&with_pending, &expecting(2000, 4 * GIB)).is_empty());
        // A pool with no pods yet has no median pod to stand in for.
        let empty = input(vec![node("n1", "default", 4000, 16 * GIB, vec![])], vec![]);
        assert!(stand_ins(&empty, &expecting(2000, 4 * GIB)).is_empty());
    }

    #[test]
    fn stand_ins_tolerate_their_pools_taints() {
        let mut i = input(
            vec![node(
                "n1",
                "default",
                4000,
                16 * GIB,
                vec![pod("a/b-0", 500, GIB)],
            )],
            vec![],
        );
        i.pools[0].taints = vec![Taint {
            key: "tailor.sh/spot".to_string(),
            value: Some("true".to_string()),
            effect: "NoSchedule".to_string(),
            ..Taint::default()
        }];
        let s = stand_ins(&i, &expecting(1500, 3 * GIB));
        assert_eq!(s.len(), 2);
        assert!(s.iter().all(|p| {
            i.pools[0].taints.iter().all(|t| {
                p.tolerations
                    .iter()
                    .any(|x| crate::scheduling::taints::tolerates(x, t))
            })
        }));
    }

    /// Yesterday the pool's requests grew from 3 cores at 05:00 to 6 by 06:00 and 9 by
    /// 09:00 (memory alike); `input` is one 4-core node carrying 3 cores now.
    fn morning(i: &mut Input) -> DemandHistory {
        i.pools[0].instance_types = crate::catalog::Catalog::builtin()
            .and_then(|c| c.instance_types(&crate::catalog::CatalogOptions::for_region("eastus")))
            .expect("the built-in catalog loads")
            .into();
        let mut history = DemandHistory::new();
        for minute in (0..24 * 60).step_by(5) {
            let cores = match minute / 60 {
                0..5 => 3,
                5..9 => 6,
                _ => 9,
            };
            let pods = (0..cores * 2)
                .map(|k| pod(&format!("shop/web-{k}"), 500, GIB))
                .collect();
            let at = input(vec![node("n1", "default", 64_000, 256 * GIB, pods)], vec![]);
            history.record(&at, minute * 60);
        }
        history
    }

    #[test]
    fn the_room_short_within_the_lead_buys_the_whole_horizons_growth_at_once() {
        const DAY: i64 = 86_400;
        let pods = (0..6)
            .map(|k| pod(&format!("shop/web-{k}"), 500, GIB))
            .collect();
        let mut i = input(vec![node("n1", "default", 4000, 16 * GIB, pods)], vec![]);
        let history = morning(&mut i);
        let options = Options::default();
        let bought =
            |claims: &[PlannedNodeClaim]| -> usize { claims.iter().map(|c| c.pods.len()).sum() };
        // 04:00: within the next 30 minutes nothing grows; nothing is bought.
        assert!(plan(&i, &history, DAY + 4 * 3600, 1800, 6 * 3600, 0.0, &options).is_empty());
        // Nor with a margin: the margin sizes a purchase, it does not start one.
        assert!(plan(&i, &history, DAY + 4 * 3600, 1800, 6 * 3600, 0.5, &options).is_empty());
        // 04:45: within 30 minutes the pool doubles (3 more cores, 1 of room).
        let at_0445 = |horizon: i64, margin: f64| {
            plan(
                &i,
                &history,
                DAY + 4 * 3600 + 2700,
                1800,
                horizon,
                margin,
                &options,
            )
        };
        // The horizon's growth (to 9 cores, 6 more) is bought at once, less the room.
        let claims = at_0445(6 * 3600, 0.0);
        assert_eq!(bought(&claims), 10, "{claims:?}");
        assert!(claims.iter().all(|c| c.pods.iter().all(|k| is_stand_in(k))));
        // A margin of half the expected requests: 13.5 cores and 27 GiB to carry, 10.5
        // cores and 21 GiB beyond the 3 cores and 6 GiB carried, as 21 stand-ins of 500m
        // and 1 GiB; two fit in the node's room.
        let claims = at_0445(6 * 3600, 0.5);
        assert_eq!(bought(&claims), 19, "{claims:?}");
        // With the horizon no longer than the lead, only the lead's growth.
        let claims = at_0445(1800, 0.0);
        assert_eq!(bought(&claims), 4, "{claims:?}");
        // No lead, nothing ahead.
        assert!(
            plan(
                &i,
                &history,
                DAY + 4 * 3600 + 2700,
                0,
                6 * 3600,
                0.1,
                &options
            )
            .is_empty()
        );
    }

    #[test]
    fn the_scheduler_buys_only_the_growth_that_does_not_fit_in_the_room_there_is() {
        // A 4-core node carrying 3 cores: 1 core of room. 3 cores more expected: the
        // scheduler fits two 500m stand-ins in the room and plans a node for the other four.
        let pods = (0..6)
            .map(|i| pod(&format!("shop/web-{i}"), 500, GIB))
            .collect();
        let mut i = input(vec![node("n1", "default", 4000, 16 * GIB, pods)], vec![]);
        i.pools[0].instance_types = crate::catalog::Catalog::builtin()
            .and_then(|c| c.instance_types(&crate::catalog::CatalogOptions::for_region("eastus")))
            .expect("the built-in catalog loads")
            .into();
        i.pending = stand_ins(&i, &expecting(6000, 12 * GIB));
        assert_eq!(i.pending.len(), 6);
        let plan = schedule(&i, &Options::default());
        let on_existing: usize = plan.existing_nodes.iter().map(|e| e.pods.len()).sum();
        let on_new: usize = plan.node_claims.iter().map(|c| c.pods.len()).sum();
        assert_eq!(on_existing, 2, "{plan:?}");
        assert_eq!(on_new, 4, "{plan:?}");
        assert!(!plan.node_claims.is_empty());
    }
}
