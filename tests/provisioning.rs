//! Provisioning's pure parts on a virtual clock: when a batch closes, and what is bought
//! ahead of the growth the requests' cycle expects. (The provisioning controller itself is
//! tested against a real control plane in `tests/agent.rs`, and runs the demo.)

mod support;

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use tailor::clock::{Clock, VirtualClock};
use tailor::provisioning::Batcher;
use tailor::scheduling::{Input, Options};

const SCENARIO: &str = "
apiVersion: tailor.sh/v1alpha1
kind: NodePool
metadata: {name: default}
spec:
  template:
    spec:
      requirements:
      - {key: tailor.sh/capacity-type, operator: In, values: [on-demand]}
      - {key: tailor.sh/sku-family, operator: In, values: [D]}
      nodeClassRef: {name: default}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec:
  replicas: 12
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: c, image: i, resources: {requests: {cpu: '1', memory: 2Gi}}}]
";

#[test]
fn batching_waits_for_the_idle_window_on_the_virtual_clock() {
    let clock = VirtualClock::new(Timestamp::from_second(1_800_000_000).expect("valid"));
    let mut b = Batcher::new(Duration::from_secs(1), Duration::from_secs(10));
    b.observe(clock.now());
    clock.advance(Duration::from_millis(600));
    b.observe(clock.now());
    clock.advance(Duration::from_millis(600));
    assert!(!b.ready(clock.now()), "a pod arrived 0.6 s ago");
    clock.advance(Duration::from_millis(400));
    assert!(b.ready(clock.now()));
}

/// The scenario's twelve pods (1 CPU, 2 GiB each) running on one node of pool `default`
/// with room for four more, and a kept history in which the pool's requests tripled twenty
/// minutes after this time yesterday.
fn running_before_the_morning(now: i64) -> (Input, tailor::disruption::forecast::DemandHistory) {
    use tailor::model::{Dimension, Resources};
    let mut input = support::input_from_yaml(SCENARIO);
    let mut allocatable = Resources::cpu_memory(16_000, 64 << 30);
    allocatable.set(&Dimension::Pods, 110);
    let pods = std::mem::take(&mut input.pending)
        .into_iter()
        .map(|mut p| {
            p.node_name = Some("n1".to_string());
            Arc::new(p)
        })
        .collect();
    input.nodes.push(tailor::scheduling::ExistingNode {
        derived: Default::default(),
        name: "n1".to_string(),
        labels: [(
            tailor::apis::labels::NODE_POOL.to_string(),
            "default".to_string(),
        )]
        .into(),
        taints: Vec::new(),
        allocatable,
        pods,
        unschedulable: false,
    });
    let points: Vec<[i64; 3]> = (now - 26 * 3600..=now - 18 * 3600)
        .step_by(300)
        .map(|t| {
            let k = if t < now - 24 * 3600 + 1200 { 1 } else { 3 };
            [t, k * 12_000, k * (24 << 30)]
        })
        .collect();
    let json = serde_json::json!({"version": 1, "resolution": 300, "pools": {"default": points}});
    let history = tailor::disruption::forecast::DemandHistory::from_json(&json.to_string(), now)
        .expect("valid");
    (input, history)
}

#[test]
fn buying_ahead_plans_for_the_growth_that_does_not_fit_and_nothing_without_a_day_or_a_lead() {
    use tailor::provisioning::headroom::plan;
    let now = 1_800_000_000;
    let (input, history) = running_before_the_morning(now);
    let options = Options::default();
    let claims = plan(&input, &history, now, 3 * 3600, 6 * 3600, 0.0, &options);
    // Twenty-four more pods' worth expected; four fit the node's room, twenty get nodes.
    let stand_ins: usize = claims.iter().map(|c| c.pods.len()).sum();
    assert_eq!(stand_ins, 20, "{claims:#?}");
    assert!(
        claims
            .iter()
            .all(|c| c.node_pool == "default" && c.price_per_hour > 0.0),
        "{claims:#?}"
    );
    // Without a day of history, or without a lead, nothing is bought.
    let empty = tailor::disruption::forecast::DemandHistory::new();
    assert!(plan(&input, &empty, now, 3 * 3600, 6 * 3600, 0.1, &options).is_empty());
    assert!(plan(&input, &history, now, 0, 6 * 3600, 0.1, &options).is_empty());
}
