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
