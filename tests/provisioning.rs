//! The provisioner against the simulated Azure cloud on a virtual clock.

mod support;

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use tailor::catalog::{Catalog, CatalogOptions};
use tailor::clock::{Clock, VirtualClock};
use tailor::cloud::sim::{SimSettings, SimulatedAzure};
use tailor::cloud::{CloudProvider, InstanceState};
use tailor::model::CapacityType;
use tailor::provisioning::{Batcher, Mode, Provisioner};
use tailor::scheduling::{Input, Options};
use tailor::telemetry::Metrics;

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

fn setup() -> (Input, SimulatedAzure, VirtualClock) {
    let clock = VirtualClock::new(Timestamp::from_second(1_800_000_000).expect("valid"));
    let catalog = Catalog::builtin().expect("built-in catalog");
    let types = catalog
        .instance_types(&CatalogOptions::for_region("eastus"))
        .expect("eastus");
    let cloud = SimulatedAzure::new(Arc::new(clock.clone()), types, SimSettings::default());
    let input = support::input_from_yaml(SCENARIO);
    (input, cloud, clock)
}

#[tokio::test]
async fn recommend_only_records_the_plan_and_its_price_and_launches_nothing() {
    let (input, cloud, clock) = setup();
    let mut p = Provisioner::new(cloud, Mode::RecommendOnly, Options::default(), None);
    let round = p
        .provision(&input, clock.now(), &Default::default())
        .await
        .clone();
    assert!(!round.acted);
    assert!(round.plan.summary.new_nodes > 0);
    assert!(round.hourly_cost() > 0.0);
    assert_eq!(round.hourly_cost(), round.plan.summary.hourly_cost);
    assert_eq!(p.cloud().list().await.map(|l| l.len()), Ok(0));
    assert_eq!(p.history().len(), 1);
}

#[tokio::test]
async fn autonomous_mode_launches_every_planned_claim_and_counts_it() {
    let (input, cloud, clock) = setup();
    let metrics = Metrics::new(&opentelemetry::global::meter("provisioning-test"));
    let mut p = Provisioner::new(
        cloud,
        Mode::Autonomous,
        Options::default(),
        Some(metrics.clone()),
    );
    let opened = clock.now();
    clock.advance(Duration::from_secs(2));
    let since = input
        .pending
        .iter()
        .map(|pod| (pod.key.clone(), opened))
        .collect();
    let round = p.provision(&input, clock.now(), &since).await.clone();
    assert!(round.acted);
    assert!(round.failed.is_empty(), "{:?}", round.failed);
    let instances = p.cloud().list().await.expect("list");
    assert_eq!(instances.len(), round.plan.summary.new_nodes);
    for l in &round.launched {
        assert_eq!(l.instance.instance_type, l.claim.instance_type);
        assert_eq!(l.instance.state, InstanceState::Launching);
    }
    clock.advance(Duration::from_secs(60));
    assert!(
        p.cloud()
            .list()
            .await
            .expect("list")
            .iter()
            .all(|i| i.state == InstanceState::Running)
    );
    let text = metrics.render();
    assert!(text.contains("tailor_nodeclaims_launched_total"), "{text}");
    assert!(
        text.contains("tailor_provisioning_duration_seconds_count{nodepool=\"default\"}"),
        "{text}"
    );
}

#[tokio::test]
async fn a_capacity_error_falls_back_to_the_next_type_that_holds_the_pods() {
    let (input, cloud, clock) = setup();
    // Find what the plan would choose, then take that offering away.
    let plan = tailor::scheduling::schedule(&input, &Options::default());
    let first = &plan.node_claims[0];
    for zone in ["eastus-1", "eastus-2", "eastus-3"] {
        cloud.inject_no_capacity(&first.instance_type, zone, CapacityType::OnDemand);
    }
    let metrics = Metrics::new(&opentelemetry::global::meter("provisioning-test"));
    let mut p = Provisioner::new(cloud, Mode::Autonomous, Options::default(), Some(metrics));
    let round = p
        .provision(&input, clock.now(), &Default::default())
        .await
        .clone();
    assert!(round.failed.is_empty(), "{:?}", round.failed);
    assert!(
        round
            .launched
            .iter()
            .all(|l| l.instance.instance_type != first.instance_type)
    );
    assert!(
        round
            .launched
            .iter()
            .any(|l| l.claim.alternatives.contains(&l.instance.instance_type))
    );
}

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
    let (mut input, _, _) = setup();
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

#[tokio::test]
async fn buying_ahead_launches_for_the_growth_that_does_not_fit_and_only_in_autonomous_mode() {
    let (_, cloud, clock) = setup();
    let now = clock.now();
    let (input, history) = running_before_the_morning(now.as_second());
    let mut p = Provisioner::new(cloud, Mode::Autonomous, Options::default(), None);
    let round = p
        .buy_ahead(&input, &history, now, 3 * 3600, 6 * 3600, 0.0)
        .await
        .expect("growth expected")
        .clone();
    // Twenty-four more pods' worth expected; four fit the node's room, twenty get nodes.
    let stand_ins: usize = round.launched.iter().map(|l| l.claim.pods.len()).sum();
    assert_eq!(stand_ins, 20, "{round:#?}");
    assert!(round.acted && round.failed.is_empty(), "{round:#?}");
    assert_eq!(
        p.cloud().list().await.map(|l| l.len()),
        Ok(round.launched.len())
    );
    assert!(round.hourly_cost() > 0.0);
    // Recommend-only: the same plan recorded with its price, nothing launched.
    let (_, cloud, _) = setup();
    let mut p = Provisioner::new(cloud, Mode::RecommendOnly, Options::default(), None);
    let recorded = p
        .buy_ahead(&input, &history, now, 3 * 3600, 6 * 3600, 0.0)
        .await
        .expect("growth expected")
        .clone();
    assert!(!recorded.acted);
    assert_eq!(recorded.plan.node_claims.len(), round.launched.len());
    assert!((recorded.hourly_cost() - round.hourly_cost()).abs() < 1e-9);
    assert_eq!(p.cloud().list().await.map(|l| l.len()), Ok(0));
    // Without a day of history, or without a lead, nothing is bought.
    let empty = tailor::disruption::forecast::DemandHistory::new();
    assert!(
        p.buy_ahead(&input, &empty, now, 3 * 3600, 6 * 3600, 0.1)
            .await
            .is_none()
    );
    assert!(
        p.buy_ahead(&input, &history, now, 0, 6 * 3600, 0.1)
            .await
            .is_none()
    );
}
