//! Scheduling scenarios: each proves one behaviour of the simulation, and every plan is
//! checked by the independent validator.

mod support;

use tailor::scheduling::{self, Input, Options, Plan, validate};

fn plan_with(yaml: &str, options: &Options) -> (Input, Plan) {
    let input = support::input_from_yaml(yaml);
    let plan = scheduling::schedule(&input, options);
    let errors = validate(&input, &plan);
    assert!(errors.is_empty(), "validator: {errors:#?}\nplan: {plan:#?}");
    (input, plan)
}

fn plan(yaml: &str) -> Plan {
    plan_with(yaml, &Options::default()).1
}

const POOL: &str = "
apiVersion: tailor.sh/v1alpha1
kind: NodePool
metadata: {name: default}
spec:
  template:
    spec:
      requirements:
      - {key: tailor.sh/capacity-type, operator: In, values: [on-demand]}
      nodeClassRef: {name: default}
";

fn pods(name: &str, replicas: u32, cpu: &str, memory: &str, extra_spec: &str) -> String {
    format!(
        "---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: default}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
{extra_spec}
      containers:
      - name: c
        image: i
        resources: {{requests: {{cpu: {cpu}, memory: {memory}}}}}
"
    )
}

fn node(name: &str, zone: &str, cpu: &str, memory: &str, extra: &str) -> String {
    format!(
        "---
apiVersion: v1
kind: Node
metadata:
  name: {name}
  labels: {{kubernetes.io/arch: amd64, kubernetes.io/os: linux, topology.kubernetes.io/zone: {zone}, node.kubernetes.io/instance-type: Standard_D4s_v5, kubernetes.io/hostname: {name}}}
spec:
{extra}
status:
  allocatable: {{cpu: {cpu}, memory: {memory}, pods: '110'}}
"
    )
}

fn bound_pod(name: &str, node: &str, labels: &str, cpu: &str) -> String {
    format!(
        "---
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default, labels: {{{labels}}}}}
spec:
  nodeName: {node}
  containers:
  - name: c
    image: i
    resources: {{requests: {{cpu: {cpu}, memory: 256Mi}}}}
status: {{phase: Running}}
"
    )
}

fn claim_of<'a>(plan: &'a Plan, pod_prefix: &str) -> Vec<&'a tailor::scheduling::PlannedNodeClaim> {
    plan.node_claims
        .iter()
        .filter(|c| {
            c.pods
                .iter()
                .any(|p| p.starts_with(&format!("default/{pod_prefix}")))
        })
        .collect()
}

#[test]
fn pods_fill_existing_nodes_before_new_nodes_are_bought() {
    let yaml = format!(
        "{POOL}{}{}",
        node("n1", "eastus-1", "4", "16Gi", ""),
        pods("web", 3, "1", "1Gi", "")
    );
    let p = plan(&yaml);
    assert_eq!(p.summary.scheduled_on_existing, 3);
    assert!(p.node_claims.is_empty());
}

#[test]
fn pods_that_do_not_fit_existing_nodes_get_the_cheapest_new_node() {
    let yaml = format!(
        "{POOL}{}{}",
        node("n1", "eastus-1", "1", "2Gi", ""),
        pods("web", 2, "1500m", "3Gi", "")
    );
    let p = plan(&yaml);
    assert_eq!(p.summary.scheduled_on_new, 2);
    assert_eq!(p.node_claims.len(), 1);
    // 3 cores and 6Gi: the cheapest on-demand type holding both is a 4-vCPU size.
    assert_eq!(p.node_claims[0].labels["tailor.sh/sku-cpu"], "4");
}

#[test]
fn init_containers_and_native_sidecars_size_the_request() {
    let spec = "      initContainers:
      - {name: proxy, image: i, restartPolicy: Always, resources: {requests: {cpu: 500m, memory: 1Gi}}}
      - {name: init, image: i, resources: {requests: {cpu: '6', memory: 1Gi}}}";
    let p = plan(&format!("{POOL}{}", pods("job", 1, "1", "1Gi", spec)));
    // The sidecar starts first and keeps running: the init peak is 6 + 0.5 cores, more
    // than the running 1 + 0.5.
    assert_eq!(p.node_claims[0].requests.cpu, "6500m");
}

#[test]
fn a_node_selector_on_arch_buys_only_that_architecture() {
    let spec = "      nodeSelector: {kubernetes.io/arch: arm64}";
    let p = plan(&format!("{POOL}{}", pods("arm", 4, "2", "4Gi", spec)));
    assert_eq!(
        pods_per_label(&p, "arm", "kubernetes.io/arch"),
        [("arm64".to_string(), 4)].into(),
        "{p:#?}"
    );
    assert!(
        p.node_claims
            .iter()
            .all(|c| c.labels["kubernetes.io/arch"] == "arm64"),
        "no node of another architecture is bought: {p:#?}"
    );
}

#[test]
fn required_node_affinity_terms_are_ored() {
    let spec = "      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions: [{key: tailor.sh/sku-family, operator: In, values: [GPU]}]
            - matchExpressions: [{key: karpenter.azure.com/sku-family, operator: In, values: [E]}]";
    let p = plan(&format!("{POOL}{}", pods("mem", 2, "1", "8Gi", spec)));
    // No size is of family GPU, so both pods take the second term: E sizes.
    assert_eq!(p.summary.scheduled_on_new, 2, "{p:#?}");
    assert_eq!(
        pods_per_label(&p, "mem", "tailor.sh/sku-family"),
        [("E".to_string(), 2)].into(),
        "{p:#?}"
    );
}

#[test]
fn an_empty_required_node_affinity_term_matches_no_node() {
    // Kubernetes: an empty term matches no objects. Alone it leaves the pod nowhere to go;
    // ORed with a real term, only that term counts.
    let nowhere = "      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - {}";
    let with_e = "      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - {}
            - matchExpressions: [{key: karpenter.azure.com/sku-family, operator: In, values: [E]}]";
    let p = plan(&format!(
        "{POOL}{}{}",
        pods("nowhere", 2, "1", "1Gi", nowhere),
        pods("mem", 2, "1", "8Gi", with_e)
    ));
    assert_eq!(p.summary.unschedulable, 2, "{p:#?}");
    assert!(
        p.unschedulable
            .iter()
            .all(|u| u.pod.starts_with("default/nowhere")
                && u.reason.contains("empty node affinity term")),
        "{:#?}",
        p.unschedulable
    );
    assert_eq!(
        pods_per_label(&p, "mem", "tailor.sh/sku-family"),
        [("E".to_string(), 2)].into(),
        "{p:#?}"
    );
}

#[test]
fn preferred_node_affinity_is_honoured_when_it_can_be() {
    let spec = "      affinity:
        nodeAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 50
            preference: {matchExpressions: [{key: topology.kubernetes.io/zone, operator: In, values: [eastus-3]}]}";
    let p = plan(&format!("{POOL}{}", pods("pref", 3, "1", "1Gi", spec)));
    assert_eq!(
        pods_per_label(&p, "pref", "topology.kubernetes.io/zone"),
        [("eastus-3".to_string(), 3)].into(),
        "{p:#?}"
    );
}

#[test]
fn preferred_node_affinity_is_relaxed_when_it_cannot_be_met() {
    let spec = "      affinity:
        nodeAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 50
            preference: {matchExpressions: [{key: tailor.sh/sku-family, operator: In, values: [NV]}]}";
    let p = plan(&format!("{POOL}{}", pods("pref", 1, "1", "1Gi", spec)));
    assert_eq!(p.summary.unschedulable, 0);
    assert_eq!(p.node_claims.len(), 1);
}

/// Pods of `plan` whose name starts with `prefix`, counted per value of a claim label.
fn pods_per_label(
    plan: &Plan,
    prefix: &str,
    label: &str,
) -> std::collections::BTreeMap<String, usize> {
    let mut out = std::collections::BTreeMap::new();
    for c in &plan.node_claims {
        let n = c
            .pods
            .iter()
            .filter(|p| p.starts_with(&format!("default/{prefix}")))
            .count();
        if n > 0 {
            *out.entry(c.labels[label].clone()).or_insert(0) += n;
        }
    }
    out
}

const PREFER_E: &str = "      affinity:
        nodeAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 50
            preference: {matchExpressions: [{key: karpenter.azure.com/sku-family, operator: In, values: [E]}]}";

#[test]
fn the_cost_aware_packer_keeps_a_preferred_sku_family_that_can_be_met() {
    // A D or an arm64 D would be cheaper for 1-core pods, but E sizes are allowed, so the
    // preference holds as a requirement.
    let p = plan(&format!("{POOL}{}", pods("pref", 3, "1", "1Gi", PREFER_E)));
    assert_eq!(p.summary.scheduled_on_new, 3, "{p:#?}");
    assert_eq!(
        pods_per_label(&p, "pref", "tailor.sh/sku-family"),
        [("E".to_string(), 3)].into(),
        "{p:#?}"
    );
}

#[test]
fn the_cost_aware_packer_keeps_a_preferred_zone_beside_pods_that_have_none() {
    let prefer_zone = "      affinity:
        nodeAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 50
            preference: {matchExpressions: [{key: topology.kubernetes.io/zone, operator: In, values: [eastus-3]}]}";
    let yaml = format!(
        "{POOL}{}{}",
        pods("pref", 5, "900m", "3100Mi", prefer_zone),
        pods("free", 7, "900m", "3100Mi", "")
    );
    let p = plan(&yaml);
    assert_eq!(p.summary.scheduled_on_new, 12, "{p:#?}");
    assert_eq!(
        pods_per_label(&p, "pref", "topology.kubernetes.io/zone"),
        [("eastus-3".to_string(), 5)].into(),
        "{p:#?}"
    );
}

#[test]
fn a_preferred_sku_family_that_no_size_offers_is_relaxed_by_the_packer_too() {
    let spec = "      affinity:
        nodeAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 50
            preference: {matchExpressions: [{key: tailor.sh/sku-family, operator: In, values: [NV]}]}";
    let yaml = format!(
        "{POOL}{}{}",
        pods("pref", 4, "1", "1Gi", spec),
        pods("free", 4, "1", "1Gi", "")
    );
    let (_, greedy) = plan_with(
        &yaml,
        &Options {
            cost_aware: false,
            ..Options::default()
        },
    );
    let p = plan(&yaml);
    assert_eq!(p.summary.scheduled_on_new, 8, "{p:#?}");
    // Relaxed, the preference no longer constrains the packing: the plan costs no more
    // than the greedy one.
    assert!(p.summary.hourly_cost <= greedy.summary.hourly_cost + 1e-9);
}

#[test]
fn preferred_pod_affinity_and_schedule_anyway_spread_hold_under_cost_aware_packing() {
    let spread = "      topologySpreadConstraints:
      - maxSkew: 1
        topologyKey: topology.kubernetes.io/zone
        whenUnsatisfiable: ScheduleAnyway
        labelSelector: {matchLabels: {app: spread}}";
    let near = "      affinity:
        podAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            podAffinityTerm:
              topologyKey: kubernetes.io/hostname
              labelSelector: {matchLabels: {app: cache}}";
    let yaml = format!(
        "{POOL}{}{}{}{}",
        pods("spread", 6, "500m", "1Gi", spread),
        pods("cache", 1, "500m", "1Gi", ""),
        pods("near", 2, "250m", "512Mi", near),
        pods("free", 10, "900m", "3100Mi", "")
    );
    let p = plan(&yaml);
    assert_eq!(p.summary.scheduled_on_new, 19, "{p:#?}");
    assert_eq!(
        pods_per_label(&p, "spread", "topology.kubernetes.io/zone")
            .into_values()
            .collect::<Vec<_>>(),
        [2, 2, 2],
        "{p:#?}"
    );
    let cache_node = &claim_of(&p, "cache")[0].name;
    let near_nodes: Vec<&String> = claim_of(&p, "near").iter().map(|c| &c.name).collect();
    assert_eq!(near_nodes, [cache_node], "{p:#?}");
}

#[test]
fn an_impossible_node_selector_is_unschedulable_with_the_conflicting_key() {
    let spec = "      nodeSelector: {team: payments}";
    let p = plan(&format!("{POOL}{}", pods("lost", 1, "1", "1Gi", spec)));
    assert_eq!(p.summary.unschedulable, 1);
    assert!(
        p.summary.hourly_cost == 0.0 && p.summary.hourly_cost.is_sign_positive(),
        "nothing bought costs 0, not -0: {:?}",
        p.summary.hourly_cost
    );
    let reason = &p.unschedulable[0].reason;
    assert!(
        reason.contains("nodepool default") && reason.contains("team"),
        "{reason}"
    );
}

#[test]
fn taints_keep_intolerant_pods_off_existing_nodes() {
    let taint = "  taints: [{key: dedicated, value: gpu, effect: NoSchedule}]";
    let yaml = format!(
        "{POOL}{}{}",
        node("gpu-1", "eastus-1", "8", "32Gi", taint),
        pods("web", 2, "1", "1Gi", "")
    );
    let p = plan(&yaml);
    assert_eq!(p.summary.scheduled_on_existing, 0);
    assert_eq!(p.summary.scheduled_on_new, 2);
}

#[test]
fn tolerations_let_pods_use_tainted_nodes() {
    let taint = "  taints: [{key: dedicated, value: gpu, effect: NoSchedule}]";
    let spec =
        "      tolerations: [{key: dedicated, operator: Equal, value: gpu, effect: NoSchedule}]";
    let yaml = format!(
        "{POOL}{}{}",
        node("gpu-1", "eastus-1", "8", "32Gi", taint),
        pods("web", 2, "1", "1Gi", spec)
    );
    assert_eq!(plan(&yaml).summary.scheduled_on_existing, 2);
}

const TAINTED_POOL: &str = "
apiVersion: tailor.sh/v1alpha1
kind: NodePool
metadata: {name: batch}
spec:
  template:
    spec:
      requirements: []
      taints: [{key: workload, value: batch, effect: NoSchedule}]
      startupTaints: [{key: example.com/agent-not-ready, effect: NoSchedule}]
      nodeClassRef: {name: default}
";

#[test]
fn nodepool_taints_must_be_tolerated_and_the_reason_names_the_taint() {
    let p = plan(&format!("{TAINTED_POOL}{}", pods("web", 1, "1", "1Gi", "")));
    assert_eq!(p.summary.unschedulable, 1);
    let reason = &p.unschedulable[0].reason;
    assert!(
        reason.contains("does not tolerate taint workload=batch:NoSchedule"),
        "{reason}"
    );
}

#[test]
fn startup_taints_do_not_need_tolerating_and_are_carried_on_the_claim() {
    let spec = "      tolerations: [{key: workload, operator: Exists}]";
    let p = plan(&format!(
        "{TAINTED_POOL}{}",
        pods("job", 1, "1", "1Gi", spec)
    ));
    assert_eq!(p.node_claims.len(), 1);
    assert_eq!(
        p.node_claims[0].startup_taints,
        vec!["example.com/agent-not-ready:NoSchedule".to_string()]
    );
}

const HOSTNAME_ANTI: &str = "      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - topologyKey: kubernetes.io/hostname
            labelSelector: {matchLabels: {app: db}}";

#[test]
fn pods_with_hostname_anti_affinity_land_on_distinct_nodes() {
    let p = plan(&format!(
        "{POOL}{}",
        pods("db", 4, "500m", "1Gi", HOSTNAME_ANTI)
    ));
    assert_eq!(claim_of(&p, "db").len(), 4);
    assert!(claim_of(&p, "db").iter().all(|c| c.pods.len() == 1));
}

#[test]
fn anti_affinity_counts_pods_already_running() {
    let yaml = format!(
        "{POOL}{}{}{}",
        node("n1", "eastus-1", "8", "32Gi", ""),
        bound_pod("db-old", "n1", "app: db", "100m"),
        pods("db", 1, "500m", "1Gi", HOSTNAME_ANTI)
    );
    let p = plan(&yaml);
    assert_eq!(
        p.summary.scheduled_on_existing, 0,
        "n1 already runs a db pod"
    );
    assert_eq!(p.summary.scheduled_on_new, 1);
}

#[test]
fn running_pods_anti_affinity_repels_new_pods_it_selects() {
    let yaml = format!(
        "{POOL}{}
---
apiVersion: v1
kind: Pod
metadata: {{name: loner, namespace: default, labels: {{app: loner}}}}
spec:
  nodeName: n1
  affinity:
    podAntiAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: kubernetes.io/hostname
        labelSelector: {{matchLabels: {{app: web}}}}
  containers: [{{name: c, image: i, resources: {{requests: {{cpu: 100m}}}}}}]
{}",
        node("n1", "eastus-1", "8", "32Gi", ""),
        pods("web", 1, "500m", "1Gi", "")
    );
    let p = plan(&yaml);
    assert_eq!(p.summary.scheduled_on_existing, 0);
    assert_eq!(p.summary.scheduled_on_new, 1);
}

#[test]
fn pod_affinity_on_zone_follows_the_target_pods() {
    let spec = "      affinity:
        podAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - topologyKey: topology.kubernetes.io/zone
            labelSelector: {matchLabels: {app: cache}}";
    let yaml = format!(
        "{POOL}{}{}{}",
        node("small", "eastus-2", "500m", "1Gi", ""),
        bound_pod("cache-0", "small", "app: cache", "400m"),
        pods("api", 3, "1", "2Gi", spec)
    );
    let p = plan(&yaml);
    assert_eq!(
        pods_per_label(&p, "api", "topology.kubernetes.io/zone"),
        [("eastus-2".to_string(), 3)].into(),
        "{p:#?}"
    );
}

#[test]
fn pod_affinity_with_no_target_anywhere_is_unschedulable() {
    let spec = "      affinity:
        podAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - topologyKey: topology.kubernetes.io/zone
            labelSelector: {matchLabels: {app: missing}}";
    let p = plan(&format!("{POOL}{}", pods("api", 1, "1", "2Gi", spec)));
    assert_eq!(p.summary.unschedulable, 1);
    assert!(
        p.unschedulable[0].reason.contains("affinity"),
        "{}",
        p.unschedulable[0].reason
    );
}

const ZONE_SPREAD: &str = "      topologySpreadConstraints:
      - maxSkew: 1
        topologyKey: topology.kubernetes.io/zone
        whenUnsatisfiable: DoNotSchedule
        labelSelector: {matchLabels: {app: web}}";

#[test]
fn zone_spread_puts_an_even_share_in_every_zone() {
    let p = plan(&format!(
        "{POOL}{}",
        pods("web", 9, "1", "1Gi", ZONE_SPREAD)
    ));
    let mut per_zone = std::collections::BTreeMap::new();
    for c in &p.node_claims {
        *per_zone.entry(c.zone.clone()).or_insert(0) += c.pods.len();
    }
    assert_eq!(
        per_zone.values().copied().collect::<Vec<_>>(),
        vec![3, 3, 3],
        "{per_zone:?}"
    );
}

#[test]
fn zone_spread_counts_pods_already_running() {
    let yaml = format!(
        "{POOL}{}{}{}{}",
        node("n1", "eastus-1", "500m", "1Gi", ""),
        bound_pod("web-old-1", "n1", "app: web", "100m"),
        bound_pod("web-old-2", "n1", "app: web", "100m"),
        pods("web", 4, "1", "1Gi", ZONE_SPREAD)
    );
    let p = plan(&yaml);
    // Zone 1 already has 2 (n1 has no room left anyway): the 4 new pods go 2/2 to the
    // other zones, and none is left pending.
    assert_eq!(p.summary.scheduled_on_new, 4, "{p:#?}");
    assert_eq!(
        pods_per_label(&p, "web", "topology.kubernetes.io/zone"),
        [("eastus-2".to_string(), 2), ("eastus-3".to_string(), 2)].into(),
        "{p:#?}"
    );
}

#[test]
fn hostname_spread_limits_pods_per_node_to_max_skew() {
    let spec = "      topologySpreadConstraints:
      - maxSkew: 2
        topologyKey: kubernetes.io/hostname
        whenUnsatisfiable: DoNotSchedule
        labelSelector: {matchLabels: {app: web}}";
    let p = plan(&format!("{POOL}{}", pods("web", 6, "100m", "128Mi", spec)));
    assert!(p.node_claims.iter().all(|c| c.pods.len() <= 2), "{p:#?}");
    assert_eq!(p.node_claims.len(), 3, "{p:#?}");
    assert_eq!(p.summary.scheduled_on_new, 6);
}

#[test]
fn schedule_anyway_spread_is_relaxed_when_it_cannot_hold() {
    let spec = "      nodeSelector: {topology.kubernetes.io/zone: eastus-1}
      topologySpreadConstraints:
      - maxSkew: 1
        topologyKey: topology.kubernetes.io/zone
        whenUnsatisfiable: ScheduleAnyway
        labelSelector: {matchLabels: {app: web}}";
    let p = plan(&format!("{POOL}{}", pods("web", 3, "1", "1Gi", spec)));
    assert_eq!(p.summary.unschedulable, 0);
    assert_eq!(
        pods_per_label(&p, "web", "topology.kubernetes.io/zone"),
        [("eastus-1".to_string(), 3)].into(),
        "{p:#?}"
    );
}

#[test]
fn do_not_schedule_spread_that_cannot_hold_leaves_pods_pending_with_the_reason() {
    let spec = "      nodeSelector: {topology.kubernetes.io/zone: eastus-1}
      topologySpreadConstraints:
      - maxSkew: 1
        topologyKey: topology.kubernetes.io/zone
        whenUnsatisfiable: DoNotSchedule
        nodeAffinityPolicy: Ignore
        labelSelector: {matchLabels: {app: web}}";
    let p = plan(&format!("{POOL}{}", pods("web", 3, "1", "1Gi", spec)));
    // With nodeAffinityPolicy Ignore, zones 2 and 3 count (empty): only one pod fits the skew.
    assert_eq!(p.summary.scheduled_on_new, 1);
    assert_eq!(p.summary.unschedulable, 2);
    assert!(
        p.unschedulable[0].reason.contains("maxSkew"),
        "{}",
        p.unschedulable[0].reason
    );
}

#[test]
fn min_domains_treats_missing_domains_as_empty() {
    let spec = "      topologySpreadConstraints:
      - maxSkew: 1
        minDomains: 5
        topologyKey: topology.kubernetes.io/zone
        whenUnsatisfiable: DoNotSchedule
        labelSelector: {matchLabels: {app: web}}";
    let p = plan(&format!("{POOL}{}", pods("web", 6, "1", "1Gi", spec)));
    // Only three zones exist, fewer than minDomains: the global minimum is 0, so each zone
    // takes at most maxSkew = 1 pod.
    assert_eq!(p.summary.scheduled_on_new, 3);
    assert_eq!(p.summary.unschedulable, 3);
}

#[test]
fn daemonset_overhead_counts_only_daemonsets_that_would_run_there() {
    let ds = |name: &str, selector: &str| {
        format!(
            "---
apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: {name}, namespace: kube-system}}
spec:
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      nodeSelector: {{{selector}}}
      containers: [{{name: c, image: i, resources: {{requests: {{cpu: 500m, memory: 512Mi}}}}}}]
"
        )
    };
    let yaml = format!(
        "{POOL}{}{}{}",
        ds("agent", "kubernetes.io/os: linux"),
        ds("windows-agent", "kubernetes.io/os: windows"),
        pods("web", 1, "1", "1Gi", "")
    );
    let p = plan(&yaml);
    let c = &p.node_claims[0];
    assert_eq!(c.daemon_sets, vec!["kube-system/agent".to_string()]);
    assert_eq!(c.requests.cpu, "1500m");
}

#[test]
fn max_pods_caps_pods_per_node() {
    let class = "---
apiVersion: tailor.sh/v1alpha1
kind: AKSNodeClass
metadata: {name: default}
spec: {maxPods: 10}
";
    let p = plan(&format!(
        "{POOL}{class}{}",
        pods("tiny", 25, "10m", "16Mi", "")
    ));
    assert!(p.node_claims.iter().all(|c| c.pods.len() <= 10), "{p:#?}");
    assert_eq!(p.summary.scheduled_on_new, 25);
}

#[test]
fn host_ports_keep_conflicting_pods_apart() {
    let spec = "      containers:
      - name: c
        image: i
        ports: [{containerPort: 80, hostPort: 8080}]
        resources: {requests: {cpu: 100m, memory: 64Mi}}";
    let yaml = format!(
        "{POOL}---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: proxy, namespace: default}}
spec:
  replicas: 3
  selector: {{matchLabels: {{app: proxy}}}}
  template:
    metadata: {{labels: {{app: proxy}}}}
    spec:
{spec}
"
    );
    let p = plan(&yaml);
    assert_eq!(p.node_claims.len(), 3);
}

#[test]
fn higher_weight_nodepools_are_tried_first() {
    let yaml = format!(
        "{POOL}---
apiVersion: tailor.sh/v1alpha1
kind: NodePool
metadata: {{name: preferred}}
spec:
  weight: 50
  template:
    spec:
      requirements: [{{key: tailor.sh/sku-family, operator: In, values: [E]}}]
      nodeClassRef: {{name: default}}
{}",
        pods("web", 2, "1", "1Gi", "")
    );
    let p = plan(&yaml);
    assert_eq!(
        pods_per_label(&p, "web", "tailor.sh/nodepool"),
        [("preferred".to_string(), 2)].into(),
        "{p:#?}"
    );
    assert_eq!(
        pods_per_label(&p, "web", "tailor.sh/sku-family"),
        [("E".to_string(), 2)].into(),
        "{p:#?}"
    );
}

#[test]
fn nodepool_limits_are_never_exceeded_and_the_rest_stays_pending() {
    let yaml = format!(
        "---
apiVersion: tailor.sh/v1alpha1
kind: NodePool
metadata: {{name: default}}
spec:
  limits: {{cpu: '16'}}
  template:
    spec:
      requirements: []
      nodeClassRef: {{name: default}}
{}",
        pods("web", 20, "1", "2Gi", "")
    );
    let (input, p) = plan_with(&yaml, &Options::default());
    let cpus: u32 = p
        .node_claims
        .iter()
        .map(|c| c.labels["tailor.sh/sku-cpu"].parse::<u32>().unwrap_or(0))
        .sum();
    assert!(cpus <= 16, "{cpus} vCPUs bought");
    assert!(p.summary.unschedulable > 0);
    assert!(
        p.unschedulable.iter().any(|u| u.reason.contains("limits")),
        "{:?}",
        p.unschedulable
    );
    assert!(validate(&input, &p).is_empty());
}

#[test]
fn capacity_type_and_zone_requirements_pin_offerings() {
    let yaml = format!(
        "---
apiVersion: tailor.sh/v1alpha1
kind: NodePool
metadata: {{name: spot}}
spec:
  template:
    spec:
      requirements:
      - {{key: karpenter.sh/capacity-type, operator: In, values: [spot]}}
      - {{key: topology.kubernetes.io/zone, operator: In, values: [eastus-2]}}
      nodeClassRef: {{name: default}}
{}",
        pods("web", 4, "1", "2Gi", "")
    );
    let p = plan(&yaml);
    assert_eq!(p.summary.scheduled_on_new, 4, "{p:#?}");
    assert!(p.node_claims.iter().all(|c| c.zone == "eastus-2"
        && c.capacity_type.as_str() == "spot"
        && c.price_is_estimate));
}

#[test]
fn min_values_requires_enough_distinct_fallback_types() {
    let pool = |min: u32| {
        format!(
            "---
apiVersion: tailor.sh/v1alpha1
kind: NodePool
metadata: {{name: default}}
spec:
  template:
    spec:
      requirements:
      - {{key: tailor.sh/sku-family, operator: In, values: [D, E, F], minValues: {min}}}
      - {{key: tailor.sh/sku-cpu, operator: In, values: ['2']}}
      nodeClassRef: {{name: default}}
"
        )
    };
    // 10Gi of memory at 2 vCPU: only E sizes hold it, so one family cannot satisfy minValues 2.
    let ok = plan(&format!("{}{}", pool(1), pods("mem", 1, "1", "10Gi", "")));
    assert_eq!(ok.summary.scheduled_on_new, 1);
    let p = plan(&format!("{}{}", pool(2), pods("mem", 1, "1", "10Gi", "")));
    assert_eq!(p.summary.unschedulable, 1);
    assert!(
        p.unschedulable[0].reason.contains("minValues"),
        "{}",
        p.unschedulable[0].reason
    );
}

#[test]
fn a_pod_larger_than_any_type_names_the_largest_allowed_type() {
    let yaml = format!(
        "---
apiVersion: tailor.sh/v1alpha1
kind: NodePool
metadata: {{name: default}}
spec:
  template:
    spec:
      requirements: [{{key: tailor.sh/sku-cpu, operator: Lte, values: ['4']}}, {{key: tailor.sh/sku-family, operator: In, values: [D]}}]
      nodeClassRef: {{name: default}}
{}",
        pods("big", 1, "1", "16Gi", "")
    );
    let p = plan(&yaml);
    assert_eq!(p.summary.unschedulable, 1);
    let reason = &p.unschedulable[0].reason;
    assert!(
        reason.contains("no instance type has 16Gi memory free after overhead and DaemonSets"),
        "{reason}"
    );
    assert!(
        reason.contains("largest allowed is Standard_D4"),
        "{reason}"
    );
}

#[test]
fn cost_aware_packing_is_never_worse_than_greedy_and_valid() {
    let yaml = format!(
        "{POOL}{}{}",
        pods("small", 50, "900m", "3100Mi", ""),
        pods("large", 50, "3500m", "28Gi", "")
    );
    let (_, greedy) = plan_with(
        &yaml,
        &Options {
            cost_aware: false,
            ..Options::default()
        },
    );
    let (_, tailored) = plan_with(&yaml, &Options::default());
    assert!(tailored.summary.hourly_cost <= greedy.summary.hourly_cost + 1e-9);
    assert_eq!(tailored.summary.scheduled_on_new, 100);
}

#[test]
fn the_same_input_always_gives_the_same_plan() {
    let yaml = format!(
        "{POOL}{}{}",
        pods("a", 30, "700m", "1Gi", ZONE_SPREAD),
        pods("b", 20, "250m", "3Gi", "")
    );
    assert_eq!(plan(&yaml), plan(&yaml));
}

#[test]
fn in_flight_nodeclaims_count_against_nodepool_limits() {
    let yaml = format!(
        "---
apiVersion: tailor.sh/v1alpha1
kind: NodePool
metadata: {{name: default}}
spec:
  limits: {{cpu: '8'}}
  template:
    spec:
      requirements: [{{key: tailor.sh/sku-family, operator: In, values: [D]}}]
      nodeClassRef: {{name: default}}
---
apiVersion: tailor.sh/v1alpha1
kind: NodeClaim
metadata:
  name: default-launching
  labels: {{tailor.sh/nodepool: default, node.kubernetes.io/instance-type: Standard_D4s_v5}}
spec:
  nodeClassRef: {{name: default}}
  requirements: []
{}",
        pods("web", 4, "1500m", "2Gi", "")
    );
    let (input, p) = plan_with(&yaml, &Options::default());
    assert_eq!(input.pools[0].nodes_in_use, 1);
    let cpus: u32 = p
        .node_claims
        .iter()
        .map(|c| c.labels["tailor.sh/sku-cpu"].parse::<u32>().unwrap_or(0))
        .sum();
    assert!(cpus <= 4, "only 4 of the 8 vCPUs are left, {cpus} bought");
    assert!(p.summary.unschedulable > 0);
}

#[test]
fn match_label_keys_spread_each_version_on_its_own() {
    let spread = "      topologySpreadConstraints:
      - maxSkew: 1
        topologyKey: topology.kubernetes.io/zone
        whenUnsatisfiable: DoNotSchedule
        labelSelector: {matchLabels: {app: web}}
        matchLabelKeys: [version]";
    let deployment = |name: &str, version: &str, replicas: u32| {
        format!(
            "---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: default}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: web, version: {version}}}}}
  template:
    metadata: {{labels: {{app: web, version: {version}}}}}
    spec:
{spread}
      containers: [{{name: c, image: i, resources: {{requests: {{cpu: '1', memory: 1Gi}}}}}}]
"
        )
    };
    let p = plan(&format!(
        "{POOL}{}{}",
        deployment("web-v1", "v1", 3),
        deployment("web-v2", "v2", 3)
    ));
    for version in ["web-v1", "web-v2"] {
        let mut zones: Vec<&str> = p
            .node_claims
            .iter()
            .flat_map(|c| {
                c.pods
                    .iter()
                    .filter(|k| k.starts_with(&format!("default/{version}-")))
                    .map(move |_| c.zone.as_str())
            })
            .collect();
        zones.sort();
        assert_eq!(
            zones,
            vec!["eastus-1", "eastus-2", "eastus-3"],
            "{version}: {p:#?}"
        );
    }
}

/// A pod with a node-affinity operator the scheduler does not know, as a newer API server
/// might accept: `extra` goes under its spec.
fn unreadable_pod(name: &str, node: &str, cpu: &str) -> String {
    format!(
        "---
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default, labels: {{app: {name}}}}}
spec:
  nodeName: {node}
  affinity: {{nodeAffinity: {{requiredDuringSchedulingIgnoredDuringExecution: {{nodeSelectorTerms: [{{matchExpressions: [{{key: topology.kubernetes.io/zone, operator: Near, values: [eastus-1]}}]}}]}}}}}}
  containers:
  - name: c
    image: i
    resources: {{requests: {{cpu: {cpu}, memory: 256Mi}}}}
status: {{phase: Running}}
"
    )
}

#[test]
fn a_pod_whose_spec_cannot_be_read_costs_only_that_pod() {
    let pending_unreadable = pods(
        "odd-web",
        1,
        "1",
        "1Gi",
        "      affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: a, operator: Near, values: [b]}]}]}}}",
    );
    let yaml = format!(
        "{POOL}{}{}{}{}{}{}",
        node("n1", "eastus-1", "4", "16Gi", ""),
        node("n2", "eastus-1", "4", "16Gi", ""),
        // Readable requests, unreadable affinity: it keeps its 2500m on n1.
        unreadable_pod("odd", "n1", "2500m"),
        // Neither readable: it fills n2.
        unreadable_pod("greedy", "n2", "lots"),
        pods("web", 2, "1", "1Gi", ""),
        pending_unreadable,
    );
    // A snapshot file is checked as it is read, so the operator and the quantity are
    // broken after reading, as the agent's watch could hold them.
    let readable = yaml
        .replace("operator: Near", "operator: In")
        .replace("cpu: lots", "cpu: 100m");
    let mut snapshot =
        tailor::state::Snapshot::from_yaml("scenario.yaml", &readable).expect("parses");
    for pod in &mut snapshot.pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let pod = std::sync::Arc::make_mut(pod);
        let spec = pod.spec.as_mut().expect("spec");
        if name == "greedy" {
            spec.containers[0]
                .resources
                .as_mut()
                .and_then(|r| r.requests.as_mut())
                .expect("requests")
                .insert(
                    "cpu".to_string(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity("lots".to_string()),
                );
        }
        if let Some(terms) = spec
            .affinity
            .as_mut()
            .and_then(|a| a.node_affinity.as_mut())
            .and_then(|n| {
                n.required_during_scheduling_ignored_during_execution
                    .as_mut()
            })
            .filter(|_| name != "greedy")
        {
            terms.node_selector_terms[0]
                .match_expressions
                .as_mut()
                .expect("expressions")[0]
                .operator = "Near".to_string();
        }
    }
    let catalog = tailor::catalog::Catalog::builtin().expect("catalog");
    let types = support::eastus_types(&catalog);
    // Read strictly, the first such pod fails the input, named with its field and value.
    let err = Input::from_snapshot(&snapshot, &types)
        .expect_err("an unreadable pod fails the strict reading")
        .to_string();
    assert!(
        err.contains("pod default/odd: spec.affinity.nodeAffinity") && err.contains("\"Near\""),
        "{err}"
    );
    let (input, unreadable) =
        Input::from_snapshot_reading_around(&snapshot, &types).expect("the rest is read");
    let mut names: Vec<&str> = unreadable.iter().map(|e| e.pod.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        ["default/greedy", "default/odd", "default/odd-web-00000"],
        "{unreadable:#?}"
    );
    let pending: Vec<&str> = input.pending.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(pending, ["default/web-00000", "default/web-00001"]);
    let on = |node: &str| {
        let n = input.nodes.iter().find(|n| n.name == node).expect("node");
        n.pods
            .iter()
            .map(|p| (p.key.clone(), p.requests.cpu))
            .collect::<Vec<_>>()
    };
    assert_eq!(on("n1"), [("default/odd".to_string(), 2500)]);
    assert_eq!(on("n2"), [("default/greedy".to_string(), 4000)]);
    // n1 has room for one web pod beside `odd`, n2 none beside `greedy`: one new node.
    let plan = scheduling::schedule(&input, &Options::default());
    assert!(validate(&input, &plan).is_empty());
    let placed = |node: &str| {
        plan.existing_nodes
            .iter()
            .filter(|e| e.node == node)
            .map(|e| e.pods.len())
            .sum::<usize>()
    };
    assert_eq!((placed("n1"), placed("n2")), (1, 0), "{plan:#?}");
    assert_eq!(plan.node_claims.len(), 1, "{plan:#?}");
    assert_eq!(plan.node_claims[0].pods.len(), 1);
    assert!(plan.unschedulable.is_empty());
}

#[test]
fn a_pod_is_read_again_only_when_its_resource_version_changes() {
    let yaml = [
        node("n1", "eastus-1", "4", "16Gi", ""),
        bound_pod("a", "n1", "app: a", "500m"),
        bound_pod("b", "n1", "app: b", "250m"),
        pods("web", 1, "1", "1Gi", ""),
    ]
    .concat();
    let mut snapshot = tailor::state::Snapshot::from_yaml("memo.yaml", &yaml).expect("parses");
    for (i, p) in snapshot.pods.iter_mut().enumerate() {
        let p = std::sync::Arc::make_mut(p);
        p.metadata.uid = Some(format!("uid-{i}"));
        p.metadata.resource_version = Some("1".to_string());
    }
    let catalog = tailor::catalog::Catalog::builtin().expect("catalog");
    let types = |settings: &tailor::model::NodeSettings| {
        let mut o = tailor::catalog::CatalogOptions::for_region("eastus");
        o.node = settings.clone();
        catalog
            .planning_types(&o, &Default::default())
            .map_err(|e| e.to_string())
    };
    let mut memo = tailor::scheduling::PodMemo::default();
    let bound = |input: &Input, key: &str| {
        input.nodes[0]
            .pods
            .iter()
            .find(|p| p.key == key)
            .expect("bound pod")
            .clone()
    };
    let (first, _) = Input::from_snapshot_remembering(&snapshot, &types, &mut memo).expect("reads");
    assert_eq!(memo.len(), 3, "every pod with a uid is remembered");
    let (again, _) = Input::from_snapshot_remembering(&snapshot, &types, &mut memo).expect("reads");
    // Unchanged pods are the very same reading.
    let (a1, a2) = (bound(&first, "default/a"), bound(&again, "default/a"));
    assert!(std::sync::Arc::ptr_eq(&a1, &a2));
    assert_eq!(again.pending.len(), 1);
    // A change comes with a new resourceVersion, and is read.
    let b = snapshot
        .pods
        .iter_mut()
        .find(|p| p.metadata.name.as_deref() == Some("b"))
        .expect("pod b");
    let b = std::sync::Arc::make_mut(b);
    b.metadata.resource_version = Some("2".to_string());
    let container = &mut b.spec.as_mut().expect("spec").containers[0];
    container
        .resources
        .as_mut()
        .expect("resources")
        .requests
        .as_mut()
        .expect("requests")
        .insert(
            "cpu".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("750m".to_string()),
        );
    let (changed, _) =
        Input::from_snapshot_remembering(&snapshot, &types, &mut memo).expect("reads");
    let b2 = bound(&changed, "default/b");
    assert_eq!(b2.requests.get(&tailor::model::Dimension::Cpu), 750);
    assert!(!std::sync::Arc::ptr_eq(&b2, &bound(&again, "default/b")));
    assert!(std::sync::Arc::ptr_eq(&bound(&changed, "default/a"), &a1));
    // What the memo holds is the last snapshot's pods: a pod gone is forgotten.
    snapshot
        .pods
        .retain(|p| p.metadata.name.as_deref() != Some("a"));
    Input::from_snapshot_remembering(&snapshot, &types, &mut memo).expect("reads");
    assert_eq!(memo.len(), 2);
    // The same input as a reading without the memo.
    let (fresh, _) = Input::from_snapshot_reading_around(&snapshot, &types).expect("reads");
    let (remembered, _) =
        Input::from_snapshot_remembering(&snapshot, &types, &mut memo).expect("reads");
    assert_eq!(format!("{fresh:?}"), format!("{remembered:?}"));
}

#[test]
fn a_snapshot_whose_pods_are_taken_plans_as_one_read_in_place_and_gives_its_pods_up() {
    // More pods than one read round holds, bound and pending, with spread and
    // anti-affinity across the rounds.
    let mut yaml = String::from(POOL);
    for n in 0..4 {
        yaml.push_str(&node(
            &format!("n{n}"),
            &format!("eastus-{}", n % 3 + 1),
            "16",
            "64Gi",
            "",
        ));
        for j in 0..30 {
            yaml.push_str(&bound_pod(
                &format!("b{n}-{j}"),
                &format!("n{n}"),
                "app: web",
                "100m",
            ));
        }
    }
    yaml.push_str(&pods("web", 9000, "100m", "128Mi", ""));
    yaml.push_str(&pods(
        "db",
        12,
        "2",
        "4Gi",
        "      affinity: {podAntiAffinity: {requiredDuringSchedulingIgnoredDuringExecution: \
         [{topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {app: db}}}]}}",
    ));
    let read_in_place = support::input_from_yaml(&yaml);
    let mut snapshot = tailor::state::Snapshot::from_yaml("scenario.yaml", &yaml).expect("parses");
    assert_eq!(snapshot.pods.len(), 120 + 9012);
    let catalog = tailor::catalog::Catalog::builtin().expect("built-in catalog");
    let types = support::eastus_types(&catalog);
    let taken = Input::from_snapshot_taking_pods(&mut snapshot, &types).expect("input builds");
    assert!(snapshot.pods.is_empty(), "the pods were handed over");
    assert_eq!(taken.pending.len(), 9012);
    assert_eq!(taken.nodes.iter().map(|n| n.pods.len()).sum::<usize>(), 120);
    let in_place = scheduling::schedule(&read_in_place, &Options::default());
    let from_taken = scheduling::schedule(&taken, &Options::default());
    assert!(in_place.summary.new_nodes > 0);
    assert_eq!(in_place, from_taken);
    assert!(validate(&taken, &from_taken).is_empty());
}

/// A pending pod `name` of namespace default with one claim.
fn pod_with_claim(name: &str, claim: &str) -> String {
    format!(
        "---
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  containers: [{{name: app, image: app, resources: {{requests: {{cpu: '1', memory: 2Gi}}}}}}]
  volumes: [{{name: data, persistentVolumeClaim: {{claimName: {claim}}}}}]
status: {{phase: Pending}}
"
    )
}

const STORAGE: &str = "
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: pv-db-0}
spec:
  capacity: {storage: 32Gi}
  accessModes: [ReadWriteOnce]
  csi: {driver: disk.csi.azure.com, volumeHandle: disk-db-0}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{key: topology.disk.csi.azure.com/zone, operator: In, values: [eastus-2]}]
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data-db-0, namespace: default}
spec: {accessModes: [ReadWriteOnce], volumeName: pv-db-0, resources: {requests: {storage: 32Gi}}}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: zonal}
provisioner: disk.csi.azure.com
volumeBindingMode: WaitForFirstConsumer
allowedTopologies:
- matchLabelExpressions: [{key: topology.disk.csi.azure.com/zone, values: [eastus-3]}]
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: scratch, namespace: default}
spec: {accessModes: [ReadWriteOnce], storageClassName: zonal, resources: {requests: {storage: 8Gi}}}
";

#[test]
fn pods_are_planned_only_in_the_zones_their_volumes_allow_and_the_validator_checks_it() {
    let yaml = format!(
        "{POOL}{STORAGE}{}{}",
        pod_with_claim("db-0", "data-db-0"),
        pod_with_claim("worker", "scratch")
    );
    let (input, p) = plan_with(&yaml, &Options::default());
    let zone_of = |pod: &str| {
        p.node_claims
            .iter()
            .find(|c| c.pods.iter().any(|k| k == pod))
            .map(|c| c.zone.clone())
            .unwrap_or_default()
    };
    // The bound disk is in eastus-2; the unbound claim's class provisions only in eastus-3.
    assert_eq!(zone_of("default/db-0"), "eastus-2", "{p:#?}");
    assert_eq!(zone_of("default/worker"), "eastus-3", "{p:#?}");
    // The validator reads the same constraint from the pod: the plan moved to another
    // zone is refused, naming the pod.
    let mut wrong = p.clone();
    for c in wrong
        .node_claims
        .iter_mut()
        .filter(|c| c.pods.iter().any(|k| k == "default/db-0"))
    {
        c.zone = "eastus-1".to_string();
        c.labels.insert(
            "topology.kubernetes.io/zone".to_string(),
            "eastus-1".to_string(),
        );
    }
    let errors = validate(&input, &wrong);
    assert!(
        errors.iter().any(|e| e.contains("db-0")),
        "the validator let a pod run away from its disk: {errors:#?}"
    );
    // A snapshot holding no claims, volumes or classes says nothing of where disks are:
    // the pods are planned wherever is cheapest, all in one node.
    let unknown = plan(&format!(
        "{POOL}{}{}",
        pod_with_claim("db-0", "data-db-0"),
        pod_with_claim("worker", "scratch")
    ));
    assert_eq!(unknown.node_claims.len(), 1, "{unknown:#?}");
}

#[test]
fn a_pod_whose_claim_or_class_is_missing_is_not_planned_and_the_field_is_named() {
    let catalog = tailor::catalog::Catalog::builtin().expect("catalog");
    let yaml = format!(
        "{POOL}{STORAGE}{}{}{}",
        pod_with_claim("lost", "no-such-claim"),
        pod_with_claim("db-0", "data-db-0"),
        "---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: fast, namespace: default}
spec: {accessModes: [ReadWriteOnce], storageClassName: premium-zrs, resources: {requests: {storage: 8Gi}}}
"
    ) + &pod_with_claim("classless", "fast");
    let snapshot = tailor::state::Snapshot::from_yaml("scenario.yaml", &yaml).expect("parses");
    let (input, unreadable) =
        Input::from_snapshot_reading_around(&snapshot, &support::eastus_types(&catalog))
            .expect("the rest builds");
    let by_pod: std::collections::BTreeMap<&str, (&str, &str)> = unreadable
        .iter()
        .map(|e| (e.pod.as_str(), (e.field.as_str(), e.message.as_str())))
        .collect();
    assert_eq!(
        by_pod.get("default/lost"),
        Some(&(
            "spec.volumes[0].persistentVolumeClaim.claimName",
            "PersistentVolumeClaim default/no-such-claim not found"
        ))
    );
    assert_eq!(
        by_pod.get("default/classless").map(|e| e.1),
        Some("StorageClass premium-zrs of claim default/fast not found")
    );
    // Only the readable pod is planned, and no node is bought for the others.
    let keys: Vec<&str> = input.pending.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(keys, ["default/db-0"]);
    // The whole-snapshot entry point refuses it, naming the pod.
    let err = Input::from_snapshot(&snapshot, &support::eastus_types(&catalog)).unwrap_err();
    assert!(err.to_string().contains("default/lost"), "{err}");
}

#[test]
fn a_node_takes_no_more_azure_disks_than_its_size_attaches() {
    // Ten small pods, each with its own Azure Disk, on 2-vCPU sizes (4 data disks each):
    // their CPU fits one node, their disks need three.
    let mut yaml = POOL.replace(
        "      - {key: tailor.sh/capacity-type, operator: In, values: [on-demand]}",
        "      - {key: tailor.sh/capacity-type, operator: In, values: [on-demand]}\n      - {key: tailor.sh/sku-cpu, operator: In, values: ['2']}",
    );
    yaml.push_str(
        "---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: managed-csi}
provisioner: disk.csi.azure.com
volumeBindingMode: WaitForFirstConsumer
",
    );
    for i in 0..10 {
        yaml.push_str(&format!(
            "---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: data-{i}, namespace: default}}
spec: {{accessModes: [ReadWriteOnce], storageClassName: managed-csi, resources: {{requests: {{storage: 8Gi}}}}}}
"
        ));
        yaml.push_str(
            &pod_with_claim(&format!("db-{i}"), &format!("data-{i}"))
                .replace("cpu: '1', memory: 2Gi", "cpu: 100m, memory: 256Mi"),
        );
    }
    let p = plan(&yaml);
    assert!(p.unschedulable.is_empty(), "{:?}", p.unschedulable);
    let per_node: Vec<usize> = p.node_claims.iter().map(|c| c.pods.len()).collect();
    assert!(
        per_node.iter().all(|n| *n <= 4),
        "a 2-vCPU node attaches 4 data disks: {per_node:?}"
    );
    assert_eq!(per_node.iter().sum::<usize>(), 10);
    assert_eq!(p.node_claims.len(), 3, "{per_node:?}");
}
