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

/// Where a plan puts a pod: a new claim's name or an existing node's name.
fn node_of(plan: &scheduling::Plan, key: &str) -> Option<String> {
    plan.node_claims
        .iter()
        .find(|c| c.pods.iter().any(|p| p == key))
        .map(|c| c.name.clone())
        .or_else(|| {
            plan.existing_nodes
                .iter()
                .find(|e| e.pods.iter().any(|p| p == key))
                .map(|e| e.node.clone())
        })
}

/// The plan with `key` taken off its node and put on `target` (a claim or existing node).
fn moved(plan: &scheduling::Plan, key: &str, target: &str) -> scheduling::Plan {
    let mut plan = plan.clone();
    for c in &mut plan.node_claims {
        c.pods.retain(|p| p != key);
    }
    for e in &mut plan.existing_nodes {
        e.pods.retain(|p| p != key);
    }
    match plan.node_claims.iter_mut().find(|c| c.name == target) {
        Some(c) => c.pods.push(key.to_string()),
        None => plan.existing_nodes.push(scheduling::ExistingPlacement {
            node: target.to_string(),
            pods: vec![key.to_string()],
        }),
    }
    plan
}

/// Every node of the plan (claims and existing nodes) with its labels.
fn plan_nodes(
    input: &scheduling::Input,
    plan: &scheduling::Plan,
) -> Vec<(String, std::collections::BTreeMap<String, String>)> {
    plan.node_claims
        .iter()
        .map(|c| (c.name.clone(), c.labels.clone()))
        .chain(
            input
                .nodes
                .iter()
                .map(|n| (n.name.clone(), n.labels.clone())),
        )
        .collect()
}

fn node_selector<'p>(p: &'p scheduling::PodInfo, key: &str) -> Option<&'p str> {
    p.written
        .as_ref()?
        .node_selector
        .get(key)
        .map(String::as_str)
}

/// Breaks a sound plan in every way the generated cluster allows, each on its own copy:
/// a pod moved past its taint, node selector or anti-affinity, and a new node relabelled.
/// Returns each broken plan with the words the validator must use for it.
fn breakages(
    input: &scheduling::Input,
    plan: &scheduling::Plan,
) -> Vec<(&'static str, scheduling::Plan)> {
    let mut out = Vec::new();
    let nodes = plan_nodes(input, plan);
    let placed: Vec<&scheduling::PodInfo> = input
        .pending
        .iter()
        .filter(|p| node_of(plan, &p.key).is_some())
        .collect();
    let pool_of = |labels: &std::collections::BTreeMap<String, String>| {
        labels.get("tailor.sh/nodepool").cloned()
    };
    // A pod without the toleration onto a node of the tainted pool.
    if let (Some(pod), Some((node, _))) = (
        placed
            .iter()
            .find(|p| node_selector(p, "tailor.sh/nodepool").is_none()),
        nodes
            .iter()
            .find(|(_, l)| pool_of(l).as_deref() == Some("dedicated")),
    ) {
        out.push(("does not tolerate dedicated", moved(plan, &pod.key, node)));
    }
    // A pod selecting the dedicated pool onto a node of another pool.
    if let (Some(pod), Some((node, _))) = (
        placed
            .iter()
            .find(|p| node_selector(p, "tailor.sh/nodepool") == Some("dedicated")),
        nodes
            .iter()
            .find(|(_, l)| pool_of(l).as_deref() != Some("dedicated")),
    ) {
        out.push(("node affinity", moved(plan, &pod.key, node)));
    }
    // An arm64 pod onto an amd64 node.
    if let (Some(pod), Some((node, _))) = (
        placed
            .iter()
            .find(|p| node_selector(p, "kubernetes.io/arch") == Some("arm64")),
        nodes
            .iter()
            .find(|(_, l)| l.get("kubernetes.io/arch").map(String::as_str) == Some("amd64")),
    ) {
        out.push(("node affinity", moved(plan, &pod.key, node)));
    }
    // Two pods of the hostname anti-affinity group onto one node.
    let anti: Vec<&&scheduling::PodInfo> = placed
        .iter()
        .filter(|p| p.labels.get("anti").map(String::as_str) == Some("x"))
        .collect();
    if let [a, b, ..] = anti.as_slice()
        && let Some(node) = node_of(plan, &b.key)
    {
        out.push(("anti-affinity", moved(plan, &a.key, &node)));
    }
    // A new node claiming a zone its offering is not in.
    if let Some(c) = plan.node_claims.first() {
        let mut broken = plan.clone();
        broken.node_claims[0].labels.insert(
            "topology.kubernetes.io/zone".to_string(),
            format!("{}-moved", c.zone),
        );
        out.push(("label topology.kubernetes.io/zone is", broken));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Differential check of the validator's own matching against the scheduler's: what
    /// the scheduler plans, the validator accepts; the same plan broken is refused, for the
    /// rule that was broken.
    #[test]
    fn the_validator_accepts_scheduler_plans_and_refuses_them_broken(
        pods in prop::collection::vec(pod_params(), 2..9),
        existing in 0usize..3,
    ) {
        let yaml = cluster_yaml(&pods, None, existing);
        let input = support::input_from_yaml(&yaml);
        let plan = scheduling::schedule(&input, &Options::default());
        let sound = validate(&input, &plan);
        prop_assert!(sound.is_empty(), "{sound:#?}\n{yaml}");
        for (rule, broken) in breakages(&input, &plan) {
            let errors = validate(&input, &broken);
            prop_assert!(
                errors.iter().any(|e| e.contains(rule)),
                "breaking {rule:?} went unnoticed: {errors:#?}\n{yaml}"
            );
        }
    }
}

/// The generator above does reach each breakage: a fixed cluster with every pod kind
/// yields all five, so the property is not vacuous.
#[test]
fn the_generated_breakages_cover_every_rule() {
    let pods: Vec<PodParams> = (0..7)
        .map(|kind| PodParams {
            cpu: 1,
            memory: 1,
            kind,
            value: 0,
            replicas: 2,
        })
        .collect();
    let yaml = cluster_yaml(&pods, None, 1);
    let input = support::input_from_yaml(&yaml);
    let plan = scheduling::schedule(&input, &Options::default());
    assert!(validate(&input, &plan).is_empty());
    let rules: Vec<&str> = breakages(&input, &plan).iter().map(|(r, _)| *r).collect();
    assert_eq!(
        rules,
        [
            "does not tolerate dedicated",
            "node affinity",
            "node affinity",
            "anti-affinity",
            "label topology.kubernetes.io/zone is"
        ]
    );
    for (rule, broken) in breakages(&input, &plan) {
        let errors = validate(&input, &broken);
        assert!(
            errors.iter().any(|e| e.contains(rule)),
            "{rule}: {errors:#?}"
        );
    }
}
