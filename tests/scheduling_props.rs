//! Property: for random small clusters, every plan (cost-aware and greedy) passes the
//! independent validator — resources, affinity both ways, spread, taints, node selectors,
//! host ports and NodePool limits — and makes progress: with no NodePool limit every pod
//! is placed, and the cost-aware plan never costs more than the greedy one.

mod support;

use proptest::prelude::*;
use tailor::scheduling::{self, Options, validate};

#[derive(Debug, Clone)]
struct PodParams {
    cpu: usize,
    memory: usize,
    kind: usize,
    value: usize,
    replicas: u32,
}

fn pod_yaml(i: usize, p: &PodParams) -> String {
    let cpu = ["100m", "250m", "500m", "1", "1500m", "3"][p.cpu];
    let memory = ["128Mi", "512Mi", "1Gi", "2Gi", "6Gi", "12Gi"][p.memory];
    let v = ["a", "b", "c"][p.value];
    let name = format!("w{i}");
    let (labels, extra) = match p.kind {
        0 => (format!("app: {name}"), String::new()),
        1 => (
            format!("spread: {v}"),
            format!(
                "      topologySpreadConstraints:
      - {{maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule, labelSelector: {{matchLabels: {{spread: {v}}}}}}}"
            ),
        ),
        2 => (
            format!("hspread: {v}"),
            format!(
                "      topologySpreadConstraints:
      - {{maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {{matchLabels: {{hspread: {v}}}}}}}"
            ),
        ),
        3 => (
            format!("aff: {v}"),
            format!(
                "      affinity:
        podAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - {{topologyKey: topology.kubernetes.io/zone, labelSelector: {{matchLabels: {{aff: {v}}}}}}}"
            ),
        ),
        4 => (
            "anti: x".to_string(),
            "      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - {topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {anti: x}}}"
                .to_string(),
        ),
        5 => (format!("app: {name}"), "      nodeSelector: {kubernetes.io/arch: arm64}".to_string()),
        _ => (
            format!("app: {name}"),
            "      tolerations: [{key: dedicated, operator: Exists}]
      nodeSelector: {tailor.sh/nodepool: dedicated}"
                .to_string(),
        ),
    };
    format!(
        "---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: default}}
spec:
  replicas: {}
  selector: {{matchLabels: {{{labels}}}}}
  template:
    metadata: {{labels: {{{labels}}}}}
    spec:
{extra}
      containers: [{{name: c, image: i, resources: {{requests: {{cpu: '{cpu}', memory: {memory}}}}}}}]
",
        p.replicas
    )
}

fn cluster_yaml(pods: &[PodParams], cpu_limit: Option<u32>, existing: usize) -> String {
    let limit = cpu_limit.map_or(String::new(), |l| format!("  limits: {{cpu: '{l}'}}\n"));
    let mut yaml = format!(
        "apiVersion: tailor.sh/v1alpha1
kind: NodePool
metadata: {{name: general}}
spec:
{limit}  template:
    spec:
      requirements: [{{key: tailor.sh/sku-family, operator: In, values: [D, E, F]}}]
      nodeClassRef: {{name: default}}
---
apiVersion: tailor.sh/v1alpha1
kind: NodePool
metadata: {{name: dedicated}}
spec:
  weight: 10
  template:
    spec:
      requirements: []
      taints: [{{key: dedicated, value: 'true', effect: NoSchedule}}]
      nodeClassRef: {{name: default}}
"
    );
    for n in 0..existing {
        yaml.push_str(&format!(
            "---
apiVersion: v1
kind: Node
metadata:
  name: old-{n}
  labels: {{kubernetes.io/arch: amd64, kubernetes.io/os: linux, topology.kubernetes.io/zone: eastus-{}, tailor.sh/nodepool: general}}
status:
  allocatable: {{cpu: 3860m, memory: 12Gi, pods: '110'}}
",
            n % 3 + 1
        ));
    }
    for (i, p) in pods.iter().enumerate() {
        yaml.push_str(&pod_yaml(i, p));
    }
    yaml
}

fn pod_params() -> impl Strategy<Value = PodParams> {
    (0..6usize, 0..6usize, 0..7usize, 0..3usize, 1..6u32).prop_map(
        |(cpu, memory, kind, value, replicas)| PodParams {
            cpu,
            memory,
            kind,
            value,
            replicas,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn every_plan_passes_the_independent_validator(
        pods in prop::collection::vec(pod_params(), 1..8),
        cpu_limit in prop::option::of(8u32..64),
        existing in 0usize..4,
    ) {
        let yaml = cluster_yaml(&pods, cpu_limit, existing);
        let input = support::input_from_yaml(&yaml);
        let mut costs = Vec::new();
        for cost_aware in [true, false] {
            let plan = scheduling::schedule(&input, &Options { cost_aware, ..Options::default() });
            let errors = validate(&input, &plan);
            prop_assert!(errors.is_empty(), "cost_aware={cost_aware}: {errors:#?}\n{yaml}");
            prop_assert_eq!(
                plan.summary.scheduled_on_existing + plan.summary.scheduled_on_new + plan.summary.unschedulable,
                plan.summary.pods
            );
            // Progress: every generated pod can run somewhere (the pools sell sizes for
            // every request, arm64 included, and every constraint can be met on new
            // nodes), so without a limit none is left pending.
            if cpu_limit.is_none() {
                prop_assert_eq!(
                    plan.summary.unschedulable, 0,
                    "cost_aware={}: {:#?}\n{}", cost_aware, plan.unschedulable, yaml
                );
            }
            costs.push((plan.summary.hourly_cost, plan.summary.unschedulable));
        }
        // The packer only replaces the placement pass's plan with a cheaper one.
        let ((tailored, left_t), (greedy, left_g)) = (costs[0], costs[1]);
        if left_t == left_g {
            prop_assert!(tailored <= greedy + 1e-9, "cost-aware ${tailored} > greedy ${greedy}\n{yaml}");
        }
    }
}
