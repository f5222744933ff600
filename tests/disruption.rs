//! Disruption scenarios: each method and each guard, decided over snapshots priced with
//! the built-in eastus catalog, and the command's JSON shape.

#[path = "support/bin.rs"]
mod bin;

use std::collections::BTreeSet;

use bin::tailor;
use tailor::catalog::{Catalog, CatalogOptions};
use tailor::disruption::{self, Cluster, Method, Report, Settings};
use tailor::model::NodeSettings;
use tailor::state::Snapshot;

/// 2026-11-30T12:00:00Z.
const NOW: i64 = 1_796_040_000;

const POOL: &str = "
apiVersion: tailor.sh/v1alpha1
kind: NodePool
metadata: {name: default}
spec:
  template:
    spec:
      requirements:
      - {key: karpenter.azure.com/sku-family, operator: In, values: [D]}
      - {key: kubernetes.io/arch, operator: In, values: [amd64]}
      - {key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}
      nodeClassRef: {group: karpenter.azure.com, kind: AKSNodeClass, name: default}
      expireAfter: 720h
  disruption:
    consolidationPolicy: WhenEmptyOrUnderutilized
    consolidateAfter: 5m
    budgets: [{nodes: '100%'}]
";

/// A D4s_v5 node in the default pool, created `age_h` hours before NOW.
fn node(name: &str, age_h: i64, annotations: &str) -> String {
    let created = jiff::Timestamp::from_second(NOW - age_h * 3600).expect("valid");
    format!(
        "---
apiVersion: v1
kind: Node
metadata:
  name: {name}
  creationTimestamp: '{created}'
  annotations: {{{annotations}}}
  labels: {{tailor.sh/nodepool: default, node.kubernetes.io/instance-type: Standard_D4s_v5, topology.kubernetes.io/zone: eastus-1, karpenter.sh/capacity-type: on-demand, kubernetes.io/arch: amd64, kubernetes.io/os: linux, karpenter.azure.com/sku-family: D}}
status:
  allocatable: {{cpu: 3860m, memory: 11Gi, pods: '110'}}
"
    )
}

/// A running pod of Deployment `app` on `node`, started an hour before NOW.
fn pod(name: &str, node: &str, cpu: &str, annotations: &str) -> String {
    let started = jiff::Timestamp::from_second(NOW - 3600).expect("valid");
    format!(
        "---
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: shop
  labels: {{app: web}}
  annotations: {{{annotations}}}
  ownerReferences: [{{apiVersion: apps/v1, kind: ReplicaSet, name: web-5d8f, uid: u1, controller: true}}]
spec:
  nodeName: {node}
  containers:
  - {{name: app, image: shop/web, resources: {{requests: {{cpu: {cpu}, memory: 512Mi}}}}}}
status: {{phase: Running, startTime: '{started}'}}
"
    )
}

/// The cluster of `yaml` at NOW, priced with the built-in eastus catalog.
fn cluster_of(yaml: &str) -> Cluster {
    let snapshot = Snapshot::from_yaml("scenario.yaml", yaml).expect("scenario parses");
    let catalog = Catalog::builtin().expect("built-in catalog");
    let types = |s: &NodeSettings| {
        let mut o = CatalogOptions::for_region("eastus");
        o.node = s.clone();
        catalog
            .instance_types(&o)
            .map(Into::into)
            .map_err(|e| e.to_string())
    };
    Cluster::from_snapshot(&snapshot, &types, NOW).expect("cluster builds")
}

fn evaluate_with(yaml: &str, settings: &Settings) -> Report {
    disruption::evaluate(&cluster_of(yaml), settings)
}

fn evaluate(yaml: &str) -> Report {
    evaluate_with(yaml, &Settings::default())
}

fn blocked<'a>(r: &'a Report, node: &str) -> &'a str {
    r.blocked
        .iter()
        .find(|b| b.node == node)
        .map_or("", |b| b.reason.as_str())
}

#[test]
fn an_empty_node_is_deleted_and_its_price_saved() {
    let yaml = format!(
        "{POOL}{}{}{}",
        node("a", 10, ""),
        node("b", 10, ""),
        pod("web-1", "a", "3", "")
    );
    // Replacing `a` by a D4as_v6 would save $0.01/hour, 5.2%: not worth it at 10%.
    let settings = Settings {
        min_savings_fraction: 0.1,
        ..Settings::default()
    };
    let r = evaluate_with(&yaml, &settings);
    assert_eq!(r.decisions.len(), 1, "{r:#?}");
    let d = &r.decisions[0];
    assert_eq!(d.method, Method::Empty);
    assert_eq!(d.nodes, ["b"]);
    assert!(d.pods_moved.is_empty());
    assert!((d.savings_per_hour - 0.192).abs() < 1e-9);
    assert!((r.summary.hourly_cost_before - 0.384).abs() < 1e-9);
    assert!((r.summary.hourly_cost_after - 0.192).abs() < 1e-9);
    assert!(blocked(&r, "a").contains("below the threshold"), "{r:#?}");
    // At the default 5% that replacement clears the share, but not the $0.02/hour its one
    // eviction must pay for on top of the $0.01 floor.
    let r = evaluate(&yaml);
    assert_eq!(r.decisions.len(), 1, "{r:#?}");
    assert!(blocked(&r, "a").contains("for 1 eviction(s)"), "{r:#?}");
    // Without a cost per eviction it is taken after the deletion.
    let free = Settings {
        min_savings_per_eviction: 0.0,
        ..Settings::default()
    };
    let r = evaluate_with(&yaml, &free);
    assert_eq!(r.decisions[0].method, Method::Empty);
    assert_eq!(r.decisions[1].method, Method::Single);
    assert_eq!(
        r.decisions[1].replacements[0].instance_type,
        "Standard_D4as_v6"
    );
}

#[test]
fn two_half_empty_nodes_become_one() {
    let yaml = format!(
        "{POOL}{}{}{}{}",
        node("a", 10, ""),
        node("b", 10, ""),
        pod("web-1", "a", "1500m", ""),
        pod("web-2", "b", "1500m", "")
    );
    let r = evaluate(&yaml);
    assert_eq!(r.decisions.len(), 1, "{r:#?}");
    let d = &r.decisions[0];
    // Both D4s_v5 (0.192 each) go for one D4as_v6 (0.182) holding both pods: the multi-node
    // decision saves 0.202/hour, deleting one of them and moving its pod 0.192.
    assert_eq!(d.method, Method::Multi, "{r:#?}");
    assert_eq!(d.pods_moved.len(), 2);
    assert_eq!(d.replacements.len(), 1);
    assert_eq!(d.replacements[0].instance_type, "Standard_D4as_v6");
    assert_eq!(r.summary.nodes_after, 1);
    assert_eq!(r.summary.evictions, 2);
    assert!((r.summary.hourly_cost_after - 0.182).abs() < 1e-9, "{r:#?}");
}

#[test]
fn several_light_nodes_are_consolidated_together() {
    // Four D4s_v5 nodes with 0.9 cores each.
    let mut yaml = POOL.to_string();
    for i in 0..4 {
        yaml.push_str(&node(&format!("n{i}"), 10, ""));
        yaml.push_str(&pod(&format!("web-{i}"), &format!("n{i}"), "900m", ""));
    }
    let r = evaluate(&yaml);
    assert_eq!(r.decisions[0].method, Method::Multi, "{r:#?}");
    assert_eq!(r.summary.nodes_after, 1, "{r:#?}");
    // The four pods' 3.6 cores fit one D4as_v6 (3.86 allocatable), 0.182/hour in eastus,
    // against 4 x 0.192 for the four D4s_v5.
    assert_eq!(
        r.decisions[0].replacements[0].instance_type,
        "Standard_D4as_v6"
    );
    assert!((r.summary.hourly_cost_after - 0.182).abs() < 1e-9, "{r:#?}");
}

#[test]
fn nodes_no_single_new_node_can_merge_are_repacked_into_the_fresh_plan_in_one_step() {
    // Three D4s_v5 nodes, one per zone, each with a pod pinned to its zone: no one new node
    // holds the pods of two of them, so no multi-node merge exists; one-node replacements
    // would take three commands. The fresh plan is three smaller nodes.
    let mut yaml = POOL.to_string();
    for z in 1..=3 {
        yaml.push_str(&node(&format!("n{z}"), 10, "").replace("eastus-1", &format!("eastus-{z}")));
        yaml.push_str(
            &pod(&format!("web-{z}"), &format!("n{z}"), "500m", "").replace(
                "  nodeName:",
                &format!(
                    "  nodeSelector: {{topology.kubernetes.io/zone: eastus-{z}}}\n  nodeName:"
                ),
            ),
        );
    }
    let first = Settings {
        all: false,
        ..Settings::default()
    };
    let r = evaluate_with(&yaml, &first);
    assert_eq!(r.decisions.len(), 1, "{r:#?}");
    let d = &r.decisions[0];
    assert_eq!(d.method, Method::Multi, "{r:#?}");
    assert_eq!(d.nodes.len(), 3, "{r:#?}");
    assert_eq!(d.replacements.len(), 3, "{r:#?}");
    let zones: BTreeSet<&str> = d.replacements.iter().map(|r| r.zone.as_str()).collect();
    assert_eq!(zones.len(), 3, "one replacement per zone: {r:#?}");
    assert!(
        d.replacements.iter().all(|r| r.price_per_hour < 0.192),
        "{r:#?}"
    );
    assert!(d.reason.contains("repacked"), "{}", d.reason);
    // The whole evaluation ends where one-node replacements would, in one decision.
    let all = evaluate(&yaml);
    assert_eq!(all.decisions.len(), 1, "{all:#?}");
    assert!(
        all.summary.hourly_cost_after < 3.0 * 0.192 * 0.6,
        "{all:#?}"
    );
}

#[test]
fn a_big_node_is_replaced_by_a_cheaper_one_that_holds_its_pods() {
    let yaml = format!(
        "{POOL}{}{}",
        node("a", 10, ""),
        pod("web-1", "a", "500m", "")
    );
    let r = evaluate(&yaml);
    assert_eq!(r.decisions.len(), 1, "{r:#?}");
    let d = &r.decisions[0];
    assert_eq!(d.method, Method::Single);
    assert_eq!(d.replacements.len(), 1);
    assert!(d.replacements[0].price_per_hour < 0.192);
    assert!(d.savings_per_hour >= 0.192 * 0.05);
}

#[test]
fn do_not_disrupt_on_the_node_or_a_pod_blocks_it() {
    for (node_ann, pod_ann, why) in [
        (
            "tailor.sh/do-not-disrupt: 'true'",
            "",
            "node is annotated do-not-disrupt",
        ),
        (
            "",
            "karpenter.sh/do-not-disrupt: 'true'",
            "pod shop/web-2 is annotated",
        ),
    ] {
        let yaml = format!(
            "{POOL}{}{}{}{}",
            node("a", 10, ""),
            node("b", 10, node_ann),
            pod("web-1", "a", "3", ""),
            pod("web-2", "b", "100m", pod_ann)
        );
        let r = evaluate(&yaml);
        assert!(
            r.decisions
                .iter()
                .all(|d| !d.nodes.contains(&"b".to_string())),
            "{r:#?}"
        );
        assert!(blocked(&r, "b").contains(why), "{r:#?}");
    }
}

#[test]
fn a_pdb_that_allows_no_eviction_blocks_the_node() {
    let pdb = "---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: shop}
spec:
  minAvailable: 2
  selector: {matchLabels: {app: web}}
";
    let yaml = format!(
        "{POOL}{}{}{}{}{pdb}",
        node("a", 10, ""),
        node("b", 10, ""),
        pod("web-1", "a", "1", ""),
        pod("web-2", "b", "1", "")
    );
    let r = evaluate(&yaml);
    assert!(r.decisions.is_empty(), "{r:#?}");
    assert!(
        blocked(&r, "a").contains("PodDisruptionBudget shop/web"),
        "{r:#?}"
    );
    // With room for one eviction at a time, the nodes are consolidated in one decision
    // (the drain takes the pods one after the other).
    let r = evaluate(&yaml.replace("minAvailable: 2", "minAvailable: 1"));
    assert_eq!(r.decisions.len(), 1, "{:#?}", r.decisions);
    assert!(r.summary.evictions >= 1, "{:#?}", r.summary);
}

#[test]
fn a_node_with_more_of_a_budgets_pods_than_it_allows_at_once_is_drained_in_steps() {
    // Five web pods, at least three available: two evictions at a time. Node `b` carries
    // three of them. The two nodes merge onto one smaller node all the same: their drain
    // takes two pods, then the others as the first two run elsewhere (the Eviction API
    // refuses them until then).
    let pdb = "---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: shop}
spec:
  minAvailable: 3
  selector: {matchLabels: {app: web}}
";
    let yaml = format!(
        "{POOL}{}{}{}{}{}{}{}{pdb}",
        node("a", 10, ""),
        node("b", 10, ""),
        pod("web-1", "a", "500m", ""),
        pod("web-2", "a", "500m", ""),
        pod("web-3", "b", "500m", ""),
        pod("web-4", "b", "500m", ""),
        pod("web-5", "b", "500m", "")
    );
    let r = evaluate(&yaml);
    assert_eq!(r.decisions.len(), 1, "{r:#?}");
    assert!(r.decisions[0].nodes.contains(&"b".to_string()), "{r:#?}");
    assert!(
        r.summary.evictions > 2,
        "more than the budget allows at once: {r:#?}"
    );
    // A budget with no eviction left keeps both nodes.
    let r = evaluate(&yaml.replace("minAvailable: 3", "minAvailable: 5"));
    assert!(r.decisions.is_empty(), "{r:#?}");
    assert!(
        blocked(&r, "b").contains("PodDisruptionBudget shop/web allows no eviction"),
        "{r:#?}"
    );
}

#[test]
fn a_saving_below_the_threshold_is_not_worth_the_churn() {
    let yaml = format!(
        "{POOL}{}{}",
        node("a", 10, ""),
        pod("web-1", "a", "500m", "")
    );
    let strict = Settings {
        min_savings_per_hour: 1.0,
        ..Settings::default()
    };
    let r = evaluate_with(&yaml, &strict);
    assert!(r.decisions.is_empty(), "{r:#?}");
    assert!(blocked(&r, "a").contains("below the threshold"), "{r:#?}");
}

#[test]
fn a_consolidation_must_pay_for_the_pods_it_evicts() {
    // Two half-empty D4s_v5: moving web-2 onto `a` saves b's $0.192/hour for one eviction.
    let yaml = format!(
        "{POOL}{}{}{}{}",
        node("a", 10, ""),
        node("b", 10, ""),
        pod("web-1", "a", "1500m", ""),
        pod("web-2", "b", "1500m", "")
    );
    let costly = Settings {
        min_savings_per_eviction: 0.2,
        ..Settings::default()
    };
    let r = evaluate_with(&yaml, &costly);
    assert!(r.decisions.is_empty(), "{r:#?}");
    assert!(
        blocked(&r, "a").contains("for 1 eviction(s)"),
        "the threshold names the evictions it charges for: {r:#?}"
    );
    // $0.01/hour floor + $0.15 for the one eviction = $0.16: the $0.192 saving clears it.
    let affordable = Settings {
        min_savings_per_eviction: 0.15,
        ..Settings::default()
    };
    let r = evaluate_with(&yaml, &affordable);
    assert_eq!(r.decisions.len(), 1, "{r:#?}");
    assert_eq!(r.decisions[0].pods_moved.len(), 1);
}

/// The cluster of `yaml` with `cpu` millicores expected of the default pool soon.
fn evaluate_expecting(yaml: &str, cpu: i64) -> Report {
    let mut cluster = cluster_of(yaml);
    cluster.expected.insert(
        "default".to_string(),
        tailor::model::Resources::cpu_memory(cpu, 1 << 30),
    );
    disruption::evaluate(&cluster, &Settings::default())
}

#[test]
fn capacity_the_cycle_expects_within_the_horizon_is_kept() {
    // Three D4s_v5 (3.86 cores each); 1.5 cores run on `a`, `b` and `c` are empty.
    let yaml = format!(
        "{POOL}{}{}{}{}",
        node("a", 10, ""),
        node("b", 10, ""),
        node("c", 10, ""),
        pod("web-1", "a", "1500m", "")
    );
    // 6.4 cores expected soon, plus 20% headroom: 7.68 cores, so two nodes (7.72) stay
    // and one empty node goes.
    let r = evaluate_expecting(&yaml, 6_400);
    assert_eq!(r.decisions.len(), 1, "{r:#?}");
    assert_eq!(r.decisions[0].method, Method::Empty);
    assert_eq!(r.decisions[0].nodes.len(), 1, "{r:#?}");
    assert_eq!(r.summary.nodes_after, 2);
    let kept = ["b", "c"]
        .iter()
        .find(|n| !r.decisions[0].nodes.contains(&n.to_string()))
        .expect("one empty node kept");
    assert!(
        blocked(&r, kept).contains("expected to need"),
        "{kept}: {r:#?}"
    );
    // 7 cores expected (8.4 with the headroom): every node stays.
    let r = evaluate_expecting(&yaml, 7_000);
    assert!(r.decisions.is_empty(), "{r:#?}");
    // Nothing more than what runs expected: both empty nodes go, and `a` stays.
    let r = evaluate_expecting(&yaml, 1_500);
    assert_eq!(r.summary.nodes_after, 1, "{r:#?}");
}

#[test]
fn a_pool_about_to_scale_down_is_not_consolidated_by_moving_pods_but_its_empty_nodes_go() {
    // `a` and `b` run a pod each (moving web-2 onto `a` saves b's $0.192/hour); `c` is
    // empty.
    let yaml = format!(
        "{POOL}{}{}{}{}{}",
        node("a", 10, ""),
        node("b", 10, ""),
        node("c", 10, ""),
        pod("web-1", "a", "1500m", ""),
        pod("web-2", "b", "1500m", "")
    );
    let mut cluster = cluster_of(&yaml);
    let cheap_evictions = Settings {
        min_savings_per_eviction: 0.0,
        ..Settings::default()
    };
    // Nothing expected to fall: the empty node goes, then pods move and fewer nodes are
    // left.
    let consolidates = |r: &Report| {
        r.decisions.len() >= 2
            && r.decisions[0].method == Method::Empty
            && r.decisions[1..]
                .iter()
                .all(|d| matches!(d.method, Method::Single | Method::Multi))
            && r.summary.evictions >= 1
            && r.summary.nodes_after <= 2
    };
    let r = disruption::evaluate(&cluster, &cheap_evictions);
    assert!(consolidates(&r), "{r:#?}");
    // The pool's requests are expected to fall 30% within the window: the empty node still
    // goes, no pod is moved, and the nodes left say why.
    cluster.falling.insert("default".to_string(), 0.3);
    let r = disruption::evaluate(&cluster, &cheap_evictions);
    assert_eq!(r.decisions.len(), 1, "{r:#?}");
    assert_eq!(r.decisions[0].method, Method::Empty);
    assert_eq!(r.decisions[0].nodes, ["c"]);
    assert_eq!(r.summary.evictions, 0, "{r:#?}");
    for n in ["a", "b"] {
        assert!(
            blocked(&r, n).contains("expected to fall 30% within 2h"),
            "{n}: {r:#?}"
        );
    }
    // A fall below the setting, or the setting off (Karpenter's rules), consolidates as
    // before.
    cluster.falling.insert("default".to_string(), 0.04);
    let r = disruption::evaluate(&cluster, &cheap_evictions);
    assert!(consolidates(&r), "{r:#?}");
    cluster.falling.insert("default".to_string(), 0.3);
    let off = Settings {
        wait_for_scale_down: 0.0,
        ..cheap_evictions
    };
    let r = disruption::evaluate(&cluster, &off);
    assert!(consolidates(&r), "{r:#?}");
}

#[test]
fn a_node_bought_ahead_is_kept_however_empty_until_the_growth_it_was_bought_for_comes() {
    // `a` runs a pod; `b` and `ahead` are empty, and `ahead`'s claim was bought ahead with
    // its lead ending an hour after NOW.
    let until = jiff::Timestamp::from_second(NOW + 3600).expect("valid");
    let claim = format!(
        "---
apiVersion: tailor.sh/v1alpha1
kind: NodeClaim
metadata:
  name: ahead
  labels: {{tailor.sh/nodepool: default}}
  annotations: {{tailor.sh/headroom: the cycle expects growth, tailor.sh/headroom-until: '{until}'}}
spec:
  nodeClassRef: {{group: karpenter.azure.com, kind: AKSNodeClass, name: default}}
  requirements: []
status: {{nodeName: ahead}}
"
    );
    let yaml = format!(
        "{POOL}{}{}{}{}{claim}",
        node("a", 10, ""),
        node("b", 10, ""),
        node("ahead", 10, ""),
        pod("web-1", "a", "1", "")
    );
    let r = evaluate(&yaml);
    let removed: BTreeSet<&str> = r
        .decisions
        .iter()
        .flat_map(|d| d.nodes.iter().map(String::as_str))
        .collect();
    // The other empty node goes, and `ahead` stays. Its room is kept for the growth too:
    // `a` may be replaced by a cheaper node, but its pod is not moved onto `ahead`.
    assert!(
        removed.contains("b") && !removed.contains("ahead"),
        "{r:#?}"
    );
    for d in r.decisions.iter().filter(|d| !d.pods_moved.is_empty()) {
        assert!(
            !d.replacements.is_empty(),
            "pods moved onto `ahead`: {r:#?}"
        );
    }
    assert!(blocked(&r, "ahead").contains("bought ahead"), "{r:#?}");
    // Once the lead has passed, it is an empty node like any other.
    let snapshot = Snapshot::from_yaml("scenario.yaml", &yaml).expect("scenario parses");
    let catalog = Catalog::builtin().expect("built-in catalog");
    let types = |s: &NodeSettings| {
        let mut o = CatalogOptions::for_region("eastus");
        o.node = s.clone();
        catalog
            .instance_types(&o)
            .map(Into::into)
            .map_err(|e| e.to_string())
    };
    let later = Cluster::from_snapshot(&snapshot, &types, NOW + 2 * 3600).expect("cluster");
    let r = disruption::evaluate(&later, &Settings::default());
    let removed: BTreeSet<&str> = r
        .decisions
        .iter()
        .flat_map(|d| d.nodes.iter().map(String::as_str))
        .collect();
    assert!(removed.contains("ahead") && removed.contains("b"), "{r:#?}");
}

#[test]
fn recent_pod_changes_wait_for_consolidate_after() {
    let yaml = format!(
        "{POOL}{}{}{}",
        node("a", 10, ""),
        node("b", 10, ""),
        pod("web-1", "a", "3", "")
    )
    .replace("consolidateAfter: 5m", "consolidateAfter: 2h");
    let r = evaluate(&yaml);
    // The empty node has been quiet for 10 hours; the busy one saw a pod an hour ago.
    assert_eq!(r.decisions.len(), 1, "{r:#?}");
    assert_eq!(r.decisions[0].nodes, ["b"]);
    assert!(blocked(&r, "a").contains("consolidateAfter"), "{r:#?}");
}

#[test]
fn the_controller_looks_again_when_the_first_blocking_wait_ends() {
    // a's pod started an hour ago and its pool waits 2h after a pod change: a's wait ends
    // in an hour, before anything else (both nodes expire after 720h).
    let yaml = format!(
        "{POOL}{}{}{}",
        node("a", 10, ""),
        node("b", 10, ""),
        pod("web-1", "a", "1", "")
    )
    .replace("consolidateAfter: 5m", "consolidateAfter: 2h");
    let mut cluster = cluster_of(&yaml);
    let r = disruption::evaluate(&cluster, &Settings::default());
    let held: BTreeSet<&str> = r
        .blocked
        .iter()
        .filter(|b| b.reason.contains("consolidateAfter"))
        .map(|b| b.node.as_str())
        .collect();
    assert_eq!(held, BTreeSet::from(["a"]), "{r:#?}");
    assert_eq!(
        cluster.next_wait_end(|n| held.contains(n)),
        Some(NOW + 3600)
    );
    // A node held by something else is not woken for: its quiet time ending changes
    // nothing. Only the expiry is left.
    let expiry = NOW - 10 * 3600 + 720 * 3600;
    assert_eq!(cluster.next_wait_end(|_| false), Some(expiry));
    // Then a is no longer held by consolidateAfter, and the next end is the expiry.
    cluster.now = NOW + 3600;
    let r = disruption::evaluate(&cluster, &Settings::default());
    assert!(
        r.blocked
            .iter()
            .all(|b| !b.reason.contains("consolidateAfter")),
        "{r:#?}"
    );
    assert_eq!(cluster.next_wait_end(|_| true), Some(expiry));
    // Past every expiry: no wait left.
    cluster.now = NOW + 720 * 3600;
    assert_eq!(cluster.next_wait_end(|_| true), None);
}

#[test]
fn budgets_cap_disruptions_and_a_scheduled_budget_applies_only_in_its_window() {
    let mut yaml = POOL.replace("budgets: [{nodes: '100%'}]", "budgets: [{nodes: '1'}]");
    for i in 0..3 {
        yaml.push_str(&node(&format!("e{i}"), 10, ""));
    }
    let r = evaluate(&yaml);
    assert_eq!(r.summary.nodes_after, 2, "one at a time: {r:#?}");
    // A zero budget from 12:00 for an hour, every day: blocks at 12:00 UTC (NOW).
    let windowed = POOL.replace(
        "budgets: [{nodes: '100%'}]",
        "budgets: [{nodes: '0', schedule: '0 12 * * *', duration: 1h}, {nodes: '100%'}]",
    );
    let mut yaml = windowed.clone();
    for i in 0..3 {
        yaml.push_str(&node(&format!("e{i}"), 10, ""));
    }
    let r = evaluate(&yaml);
    assert!(r.decisions.is_empty(), "{r:#?}");
    assert!(blocked(&r, "e0").contains("budget"), "{r:#?}");
    // Outside the window (from 13:00) all three go.
    let r = evaluate(&yaml.replace("'0 12 * * *'", "'0 13 * * *'"));
    assert_eq!(r.summary.nodes_after, 0, "{r:#?}");
}

/// A node of NodePool `pool`, otherwise as [`node`].
fn node_of(pool: &str, name: &str, age_h: i64) -> String {
    node(name, age_h, "").replace(
        "tailor.sh/nodepool: default",
        &format!("tailor.sh/nodepool: {pool}"),
    )
}

#[test]
fn a_held_pool_is_neither_disrupted_nor_grown_but_takes_moved_pods() {
    let batch = POOL.replace("metadata: {name: default}", "metadata: {name: batch}");
    let batch = format!("---{batch}");
    let yaml = format!(
        "{POOL}{batch}{}{}{}{}{}{}",
        node("a", 10, ""),
        node("b", 10, ""),
        pod("web-1", "b", "1", ""),
        node_of("batch", "e", 800),
        node_of("batch", "c", 10),
        pod("web-2", "c", "1", ""),
    );
    let snapshot = Snapshot::from_yaml("scenario.yaml", &yaml).expect("scenario parses");
    let catalog = Catalog::builtin().expect("built-in catalog");
    let types = |s: &NodeSettings| {
        let mut o = CatalogOptions::for_region("eastus");
        o.node = s.clone();
        catalog
            .instance_types(&o)
            .map(Into::into)
            .map_err(|e| e.to_string())
    };
    let mut cluster = Cluster::from_snapshot(&snapshot, &types, NOW).expect("cluster builds");
    // Nothing held: the expired batch node goes first.
    let free = disruption::evaluate(&cluster, &Settings::default());
    assert_eq!(free.decisions[0].method, Method::Expiration, "{free:#?}");
    assert_eq!(free.decisions[0].nodes, ["e"]);

    cluster.held = ["batch".to_string()].into();
    let r = disruption::evaluate(&cluster, &Settings::default());
    let decided: Vec<&str> = r
        .decisions
        .iter()
        .flat_map(|d| d.nodes.iter().map(String::as_str))
        .collect();
    // Both default nodes go: `a` is empty, and `b`'s pod fits on the held pool's `c`.
    assert_eq!(decided.len(), 2, "{r:#?}");
    assert!(decided.contains(&"a") && decided.contains(&"b"), "{r:#?}");
    assert!(
        r.decisions
            .iter()
            .all(|d| d.replacements.iter().all(|c| c.node_pool != "batch")),
        "{r:#?}"
    );
    assert_eq!(r.summary.nodes_after, 2, "{r:#?}");
    // The held nodes are left out of the blocked list: holding them was the caller's choice.
    assert!(
        r.blocked.iter().all(|b| b.node != "e" && b.node != "c"),
        "{r:#?}"
    );

    // Holding the default pool instead: its nodes stay, the batch node still expires, and
    // no replacement is planned in the default pool.
    cluster.held = ["default".to_string()].into();
    let r = disruption::evaluate(&cluster, &Settings::default());
    assert!(
        r.decisions
            .iter()
            .all(|d| d.nodes.iter().all(|n| n == "e" || n == "c")),
        "{r:#?}"
    );
    assert_eq!(r.decisions[0].nodes, ["e"], "{r:#?}");

    // A replacement is not bought in a held pool: `y` of the batch pool (which allows only
    // its own size) holds half a core, and only the default pool has a cheaper size.
    let only_d4 = batch.replace(
        "{key: karpenter.azure.com/sku-family, operator: In, values: [D]}",
        "{key: node.kubernetes.io/instance-type, operator: In, values: [Standard_D4s_v5]}",
    );
    // The default pool is preferred (weighted), so it is where the pod would go.
    let weighted = POOL.replace("spec:\n  template:", "spec:\n  weight: 10\n  template:");
    assert_ne!(weighted, POOL);
    let yaml = format!(
        "{weighted}{only_d4}{}{}",
        node_of("batch", "y", 10),
        pod("web-3", "y", "500m", ""),
    );
    let snapshot = Snapshot::from_yaml("scenario.yaml", &yaml).expect("scenario parses");
    let mut cluster = Cluster::from_snapshot(&snapshot, &types, NOW).expect("cluster builds");
    let free = disruption::evaluate(&cluster, &Settings::default());
    assert_eq!(free.decisions.len(), 1, "{free:#?}");
    assert_eq!(free.decisions[0].replacements[0].node_pool, "default");
    cluster.held = ["default".to_string()].into();
    let r = disruption::evaluate(&cluster, &Settings::default());
    assert!(r.decisions.is_empty(), "{r:#?}");
    assert!(!blocked(&r, "y").is_empty(), "{r:#?}");
}

#[test]
fn an_old_node_expires_even_when_annotated() {
    let yaml = format!(
        "{POOL}{}{}{}",
        node("old", 800, "tailor.sh/do-not-disrupt: 'true'"),
        node("b", 10, ""),
        pod("web-1", "old", "3", "")
    );
    let r = evaluate(&yaml);
    let d = &r.decisions[0];
    assert_eq!(d.method, Method::Expiration, "{r:#?}");
    assert_eq!(d.nodes, ["old"]);
    assert_eq!(d.pods_moved, ["shop/web-1"]);
}

#[test]
fn a_node_from_an_old_template_has_drifted() {
    let claim = "---
apiVersion: tailor.sh/v1alpha1
kind: NodeClaim
metadata:
  name: a-claim
  annotations: {tailor.sh/nodepool-hash: 0000000000000000}
  labels: {tailor.sh/nodepool: default}
spec:
  nodeClassRef: {group: karpenter.azure.com, kind: AKSNodeClass, name: default}
  requirements: []
status: {nodeName: a}
";
    let yaml = format!(
        "{POOL}{}{}{claim}",
        node("a", 10, ""),
        pod("web-1", "a", "3", "")
    );
    let r = evaluate(&yaml);
    assert_eq!(r.decisions[0].method, Method::Drift, "{r:#?}");
    assert_eq!(r.decisions[0].replacements.len(), 1);
    assert!(r.decisions[0].reason.contains("template changed"));
}

#[test]
fn a_node_on_an_old_image_has_drifted() {
    let class = "---
apiVersion: tailor.sh/v1alpha1
kind: AKSNodeClass
metadata: {name: default}
spec: {imageFamily: AzureLinux}
status:
  images:
  - id: /images/azurelinux-arm64/2026.11.20
    requirements: [{key: kubernetes.io/arch, operator: In, values: [arm64]}]
  - id: /images/azurelinux/2026.11.20
    requirements: [{key: kubernetes.io/arch, operator: In, values: [amd64]}]
";
    let claim = |image: &str| {
        format!(
            "---
apiVersion: tailor.sh/v1alpha1
kind: NodeClaim
metadata:
  name: a-claim
  labels: {{tailor.sh/nodepool: default}}
spec:
  nodeClassRef: {{group: karpenter.azure.com, kind: AKSNodeClass, name: default}}
  requirements: []
status: {{nodeName: a, imageID: {image}}}
"
        )
    };
    let base = format!(
        "{POOL}{}{}{class}",
        node("a", 10, ""),
        pod("web-1", "a", "3", "")
    );
    let r = evaluate(&format!("{base}{}", claim("/images/azurelinux/2026.10.02")));
    assert_eq!(r.decisions[0].method, Method::Drift, "{r:#?}");
    assert!(
        r.decisions[0]
            .reason
            .contains("/images/azurelinux/2026.11.20"),
        "the amd64 image is the one that counts: {}",
        r.decisions[0].reason
    );
    // On the latest image for its architecture, the node has not drifted.
    let r = evaluate(&format!("{base}{}", claim("/images/azurelinux/2026.11.20")));
    assert!(
        r.decisions.iter().all(|d| d.method != Method::Drift),
        "{r:#?}"
    );
}

/// A node of the default pool with the given extra labels (instance type, zone and
/// capacity type included only if given), created 10 hours before NOW.
fn bare_node(name: &str, labels: &str, allocatable: &str) -> String {
    let created = jiff::Timestamp::from_second(NOW - 10 * 3600).expect("valid");
    format!(
        "---
apiVersion: v1
kind: Node
metadata:
  name: {name}
  creationTimestamp: '{created}'
  labels: {{tailor.sh/nodepool: default, kubernetes.io/arch: amd64, kubernetes.io/os: linux, {labels}}}
status:
  allocatable: {{{allocatable}, pods: '110'}}
"
    )
}

#[test]
fn a_node_whose_size_the_pool_no_longer_allows_is_priced_and_replaced_by_drift() {
    // The pool now requires sku-version 6; the node is a D8s_v5 made before the change,
    // and carries no sku-version label (the catalog knows its version).
    let pool = POOL.replace(
        "- {key: kubernetes.io/arch, operator: In, values: [amd64]}",
        "- {key: kubernetes.io/arch, operator: In, values: [amd64]}\n      - {key: karpenter.azure.com/sku-version, operator: In, values: ['6']}",
    );
    let yaml = format!(
        "{pool}{}{}",
        bare_node(
            "old",
            "node.kubernetes.io/instance-type: Standard_D8s_v5, topology.kubernetes.io/zone: eastus-1, karpenter.sh/capacity-type: on-demand",
            "cpu: 7820m, memory: 27Gi"
        ),
        pod("web-1", "old", "3", "")
    );
    let r = evaluate(&yaml);
    // Priced from the catalog although the pool no longer sells it: $0.384/hour.
    assert!(
        (r.summary.hourly_cost_before - 0.384).abs() < 1e-9,
        "{r:#?}"
    );
    assert_eq!(blocked(&r, "old"), "", "{r:#?}");
    assert_eq!(r.decisions.len(), 1, "{r:#?}");
    let d = &r.decisions[0];
    assert_eq!(d.method, Method::Drift);
    assert_eq!(d.nodes, ["old"]);
    assert!(d.reason.contains("sku-version"), "{}", d.reason);
    assert_eq!(d.pods_moved, ["shop/web-1"]);
    // The 3-core pod goes to the cheapest v6 size that holds it, a D4as_v6 at $0.182:
    // $0.384 - $0.182 = $0.202/hour saved.
    assert_eq!(d.replacements.len(), 1);
    assert_eq!(d.replacements[0].instance_type, "Standard_D4as_v6");
    assert!((d.savings_per_hour - 0.202).abs() < 1e-9, "{d:#?}");
    assert!((r.summary.hourly_cost_after - 0.182).abs() < 1e-9);
}

#[test]
fn nodes_without_a_capacity_type_label_are_priced_as_on_demand_or_from_their_node_claim() {
    let pool = POOL.replace("values: [on-demand]", "values: [on-demand, spot]");
    let d4 =
        "node.kubernetes.io/instance-type: Standard_D4s_v5, topology.kubernetes.io/zone: eastus-1";
    let alloc = "cpu: 3860m, memory: 11Gi";
    // `spot` has no capacity-type label itself; its NodeClaim says spot.
    let claim = "---
apiVersion: tailor.sh/v1alpha1
kind: NodeClaim
metadata:
  name: spot-claim
  labels: {tailor.sh/nodepool: default, karpenter.sh/capacity-type: spot}
spec:
  nodeClassRef: {group: karpenter.azure.com, kind: AKSNodeClass, name: default}
  requirements: []
status: {nodeName: spot}
";
    let yaml = format!(
        "{pool}{}{}{}{claim}{}",
        bare_node("plain", d4, alloc),
        bare_node("spot", d4, alloc),
        bare_node("busy", d4, alloc),
        pod("web-1", "busy", "3", "")
    );
    let r = evaluate(&yaml);
    // Before: on-demand $0.192 twice and spot at 60% off, $0.0768.
    assert!(
        (r.summary.hourly_cost_before - (0.192 + 0.192 + 0.0768)).abs() < 1e-9,
        "{r:#?}"
    );
    let d = &r.decisions[0];
    assert_eq!(d.method, Method::Empty, "{r:#?}");
    assert_eq!(d.nodes, ["plain", "spot"]);
    assert!(
        (d.savings_per_hour - (0.192 + 0.0768)).abs() < 1e-9,
        "{d:#?}"
    );
    assert!(
        r.blocked.iter().all(|b| !b.reason.contains("no price")),
        "{r:#?}"
    );
}

#[test]
fn nothing_priced_is_reported_as_zero_never_negative_zero() {
    // A size the catalog does not know: the node stays unpriced and is left alone.
    let yaml = format!(
        "{POOL}{}",
        bare_node(
            "custom",
            "node.kubernetes.io/instance-type: Standard_Custom_v1, topology.kubernetes.io/zone: eastus-1, karpenter.sh/capacity-type: on-demand",
            "cpu: 3860m, memory: 11Gi"
        )
    );
    let r = evaluate(&yaml);
    assert!(r.decisions.is_empty(), "{r:#?}");
    assert!(blocked(&r, "custom").contains("no price for Standard_Custom_v1"));
    for cost in [r.summary.hourly_cost_before, r.summary.hourly_cost_after] {
        assert_eq!(cost, 0.0);
        assert!(cost.is_sign_positive(), "{cost:?} is negative zero");
    }
    let json = serde_json::to_string(&r).expect("JSON");
    assert!(!json.contains("-0.0"), "{json}");
    let table = tailor::cli::simulate::disruption_table(&r);
    assert!(!table.contains("-0.0"), "{table}");
}

#[test]
fn simulate_disruption_prints_the_documented_json() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("cluster.yaml");
    let yaml = format!(
        "{POOL}{}{}{}{}",
        node("a", 10, ""),
        node("b", 10, ""),
        pod("web-1", "a", "1500m", ""),
        pod("web-2", "b", "1500m", "")
    );
    std::fs::write(&path, yaml).expect("write");
    let now = jiff::Timestamp::from_second(NOW)
        .expect("valid")
        .to_string();
    let (ok, stdout, stderr) = tailor(&[
        "simulate",
        "--snapshot",
        path.to_str().expect("utf-8"),
        "--disruption",
        "--now",
        &now,
        "-o",
        "json",
    ]);
    assert!(ok, "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    let d = &v["decisions"][0];
    // Both nodes for one cheaper node (see `two_half_empty_nodes_become_one`).
    assert_eq!(d["method"], "multi");
    assert_eq!(d["nodes"].as_array().map(Vec::len), Some(2));
    assert_eq!(d["replacements"].as_array().map(Vec::len), Some(1));
    assert!(d["savingsPerHour"].as_f64().is_some_and(|s| s > 0.0));
    assert_eq!(d["podsMoved"].as_array().map(Vec::len), Some(2));
    assert!(v["blocked"].is_array());
    assert!(v["summary"]["hourlyCostBefore"].as_f64().is_some());
    assert!(v["summary"]["hourlyCostAfter"].as_f64().is_some());
}

#[test]
fn claims_are_marked_consolidatable_once_consolidate_after_has_passed_and_drifted_with_the_reason()
{
    // "old" last changed an hour ago (pod start); "fresh" was created just now, with no pod;
    // "stale" carries an older template hash than the pool hashes to now.
    let yaml = format!(
        "{POOL}{}{}{}{}{}",
        node("old", 2, ""),
        pod("web-1", "old", "500m", ""),
        node("fresh", 0, ""),
        node("stale", 3, ""),
        "---
apiVersion: tailor.sh/v1alpha1
kind: NodeClaim
metadata:
  name: stale-claim
  annotations: {tailor.sh/nodepool-hash: 0000000000000000}
  labels: {tailor.sh/nodepool: default}
spec:
  nodeClassRef: {group: karpenter.azure.com, kind: AKSNodeClass, name: default}
  requirements: []
status: {nodeName: stale}
",
    );
    let snapshot = Snapshot::from_yaml("scenario.yaml", &yaml).expect("scenario parses");
    let catalog = Catalog::builtin().expect("built-in catalog");
    let types = |s: &NodeSettings| {
        let mut o = CatalogOptions::for_region("eastus");
        o.node = s.clone();
        catalog
            .instance_types(&o)
            .map(Into::into)
            .map_err(|e| e.to_string())
    };
    let cluster = Cluster::from_snapshot(&snapshot, &types, NOW).expect("cluster builds");
    let marks = tailor::controllers::disruption::claim_marks(&cluster);
    let of = |n: &str| marks.iter().find(|m| m.node == n).expect("marked");
    assert!(
        of("old").consolidatable,
        "an hour quiet, consolidateAfter 5m"
    );
    assert!(!of("fresh").consolidatable, "created now");
    assert_eq!(of("old").drifted, None);
    assert!(of("stale").drifted.is_some(), "{:?}", of("stale"));
    assert_eq!(marks.len(), 3);
}

#[test]
fn a_node_holding_a_pod_whose_spec_cannot_be_read_is_left_alone_and_the_rest_is_decided() {
    // `web-2` needs a node-affinity operator the scheduler does not know (a newer API
    // server's): where it would go cannot be simulated.
    let odd = pod("web-2", "b", "100m", "").replace(
        "spec:\n",
        "spec:\n  affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: topology.kubernetes.io/zone, operator: Near, values: [eastus-1]}]}]}}}\n",
    );
    let yaml = format!(
        "{POOL}{}{}{}{}{}",
        node("a", 10, ""),
        node("b", 10, ""),
        node("c", 10, ""),
        pod("web-1", "a", "3", ""),
        odd
    );
    // A snapshot file is checked as it is read, so the operator is changed after reading,
    // as the agent's watch would hold it.
    let readable = yaml.replace("operator: Near", "operator: In");
    let mut snapshot = Snapshot::from_yaml("scenario.yaml", &readable).expect("scenario parses");
    unknown_operator(&mut snapshot, "web-2");
    let catalog = Catalog::builtin().expect("built-in catalog");
    let types = |s: &NodeSettings| {
        let mut o = CatalogOptions::for_region("eastus");
        o.node = s.clone();
        catalog
            .instance_types(&o)
            .map(Into::into)
            .map_err(|e| e.to_string())
    };
    let err = Cluster::from_snapshot(&snapshot, &types, NOW)
        .expect_err("the strict view fails")
        .to_string();
    assert!(
        err.contains("pod shop/web-2") && err.contains("Near"),
        "{err}"
    );
    let cluster =
        Cluster::from_snapshot_reading_around(&snapshot, &types, NOW).expect("cluster builds");
    assert_eq!(
        cluster.unreadable.keys().collect::<Vec<_>>(),
        ["shop/web-2"]
    );
    let r = disruption::evaluate(&cluster, &Settings::default());
    // The empty node still goes; the node of the unreadable pod stays, with the reason.
    assert!(
        r.decisions
            .iter()
            .any(|d| d.method == Method::Empty && d.nodes == ["c"]),
        "{r:#?}"
    );
    assert!(
        r.decisions
            .iter()
            .all(|d| !d.nodes.contains(&"b".to_string())
                && !d.pods_moved.contains(&"shop/web-2".to_string())),
        "{r:#?}"
    );
    assert!(
        blocked(&r, "b").contains("pod shop/web-2 cannot be read"),
        "{r:#?}"
    );
    // Readable, the same pod moves to `a` and `b` goes too.
    let r = evaluate(&readable);
    assert!(
        r.decisions
            .iter()
            .any(|d| d.nodes.contains(&"b".to_string())),
        "{r:#?}"
    );
}

/// Gives pod `name`'s first required node-affinity expression the operator `Near`, which
/// the scheduler does not know.
fn unknown_operator(snapshot: &mut Snapshot, name: &str) {
    let pod = snapshot
        .pods
        .iter_mut()
        .find(|p| p.metadata.name.as_deref() == Some(name))
        .expect("the pod");
    let pod = std::sync::Arc::make_mut(pod);
    let terms = &mut pod
        .spec
        .as_mut()
        .and_then(|s| s.affinity.as_mut())
        .and_then(|a| a.node_affinity.as_mut())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_mut()
        })
        .expect("a required node affinity")
        .node_selector_terms;
    terms[0].match_expressions.as_mut().expect("expressions")[0].operator = "Near".to_string();
}
