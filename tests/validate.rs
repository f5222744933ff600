//! The plan validator rejects broken plans: for each rule, a sound plan from the scheduler
//! is accepted, then broken in exactly that way, and the validator names the breakage.

mod support;

use tailor::apis::labels;
use tailor::scheduling::{
    self, ExistingPlacement, Input, Options, Plan, PlannedNodeClaim, Unschedulable, validate,
};

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

fn pods(name: &str, replicas: u32, cpu: &str, extra_spec: &str) -> String {
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
        resources: {{requests: {{cpu: {cpu}, memory: 1Gi}}}}
"
    )
}

/// An amd64 node in eastus-1 with 4 cores and 16Gi free; `spec` goes under `spec:`.
fn node(name: &str, spec: &str) -> String {
    format!(
        "---
apiVersion: v1
kind: Node
metadata:
  name: {name}
  labels: {{kubernetes.io/arch: amd64, kubernetes.io/os: linux, topology.kubernetes.io/zone: eastus-1, kubernetes.io/hostname: {name}}}
spec: {{{spec}}}
status:
  allocatable: {{cpu: '4', memory: 16Gi, pods: '110'}}
"
    )
}

/// Plans `yaml`, checks the plan is sound, breaks it with `breakage`, and returns the
/// validator's errors for the broken plan.
fn errors_after(yaml: &str, breakage: impl FnOnce(&Input, &mut Plan)) -> Vec<String> {
    let input = support::input_from_yaml(yaml);
    let mut plan = scheduling::schedule(&input, &Options::default());
    let sound = validate(&input, &plan);
    assert!(
        sound.is_empty(),
        "the unbroken plan is sound: {sound:#?}\n{plan:#?}"
    );
    breakage(&input, &mut plan);
    validate(&input, &plan)
}

fn assert_rejected(errors: &[String], expected: &str) {
    assert!(
        errors.iter().any(|e| e.contains(expected)),
        "expected an error containing {expected:?}, got {errors:#?}"
    );
}

/// Takes the first pod off the claim holding a pod named `prefix-*`.
fn take_pod(plan: &mut Plan, prefix: &str) -> String {
    let wanted = format!("default/{prefix}");
    let claim = plan
        .node_claims
        .iter_mut()
        .find(|c| c.pods.iter().any(|p| p.starts_with(&wanted)))
        .expect("a claim holds the pod");
    let i = claim
        .pods
        .iter()
        .position(|p| p.starts_with(&wanted))
        .expect("present");
    claim.pods.remove(i)
}

fn claim_holding<'a>(plan: &'a mut Plan, key: &str) -> &'a mut PlannedNodeClaim {
    plan.node_claims
        .iter_mut()
        .find(|c| c.pods.iter().any(|p| p == key))
        .expect("a claim holds the pod")
}

fn place_on_existing(plan: &mut Plan, node: &str, pod: String) {
    plan.existing_nodes.push(ExistingPlacement {
        node: node.to_string(),
        pods: vec![pod],
    });
}

#[test]
fn a_pod_that_is_not_pending_is_rejected() {
    let yaml = format!("{POOL}{}{}", node("n1", ""), pods("web", 1, "1", ""));
    let e = errors_after(&yaml, |_, plan| {
        place_on_existing(plan, "n1", "default/ghost".to_string());
    });
    assert_rejected(&e, "default/ghost placed on n1 is not a pending pod");
}

#[test]
fn a_placement_on_a_node_that_does_not_exist_is_rejected() {
    let yaml = format!("{POOL}{}", pods("web", 1, "1", ""));
    let e = errors_after(&yaml, |_, plan| {
        let pod = take_pod(plan, "web");
        place_on_existing(plan, "nowhere", pod);
    });
    assert_rejected(&e, "pods placed on unknown node nowhere");
}

#[test]
fn a_pod_placed_twice_is_rejected() {
    let yaml = format!("{POOL}{}", pods("web", 1, "1", ""));
    let e = errors_after(&yaml, |_, plan| {
        let pod = plan.node_claims[0].pods[0].clone();
        plan.node_claims[0].pods.push(pod);
    });
    assert_rejected(&e, "placed twice");
}

#[test]
fn pods_on_a_cordoned_node_are_rejected() {
    let yaml = format!(
        "{POOL}{}{}",
        node("n1", "unschedulable: true"),
        pods("web", 1, "1", "")
    );
    let e = errors_after(&yaml, |_, plan| {
        let pod = take_pod(plan, "web");
        place_on_existing(plan, "n1", pod);
    });
    assert_rejected(&e, "pods placed on cordoned node n1");
}

#[test]
fn a_claim_of_an_unknown_nodepool_is_rejected() {
    let yaml = format!("{POOL}{}", pods("web", 1, "1", ""));
    let e = errors_after(&yaml, |_, plan| {
        plan.node_claims[0].node_pool = "elsewhere".to_string();
    });
    assert_rejected(&e, "names unknown nodepool elsewhere");
}

#[test]
fn an_instance_type_the_pool_cannot_buy_is_rejected() {
    let yaml = format!("{POOL}{}", pods("web", 1, "1", ""));
    let e = errors_after(&yaml, |_, plan| {
        plan.node_claims[0].instance_type = "Standard_Imaginary_v9".to_string();
    });
    assert_rejected(
        &e,
        "Standard_Imaginary_v9 is not an instance type of nodepool default",
    );
}

#[test]
fn an_offering_not_sold_in_the_zone_is_rejected() {
    let yaml = format!("{POOL}{}", pods("web", 1, "1", ""));
    let e = errors_after(&yaml, |_, plan| {
        plan.node_claims[0].zone = "westus2-1".to_string();
    });
    assert_rejected(&e, "is not offered in westus2-1");
}

#[test]
fn labels_outside_the_pool_requirements_are_rejected() {
    let yaml = format!("{POOL}{}", pods("web", 1, "1", ""));
    let e = errors_after(&yaml, |_, plan| {
        plan.node_claims[0]
            .labels
            .insert(labels::CAPACITY_TYPE.to_string(), "spot".to_string());
    });
    assert_rejected(&e, "labels violate nodepool default");
}

#[test]
fn a_pod_both_placed_and_unschedulable_is_rejected() {
    let yaml = format!("{POOL}{}", pods("web", 1, "1", ""));
    let e = errors_after(&yaml, |_, plan| {
        let pod = plan.node_claims[0].pods[0].clone();
        plan.unschedulable.push(Unschedulable {
            pod,
            reason: "made up".to_string(),
        });
    });
    assert_rejected(&e, "both placed and unschedulable");
}

#[test]
fn a_pending_pod_left_out_of_the_plan_is_rejected() {
    let yaml = format!("{POOL}{}", pods("web", 2, "1", ""));
    let e = errors_after(&yaml, |_, plan| {
        take_pod(plan, "web");
    });
    assert_rejected(&e, "is neither placed nor reported unschedulable");
}

#[test]
fn requests_beyond_allocatable_are_rejected() {
    let yaml = format!("{POOL}{}", pods("web", 3, "1", ""));
    let e = errors_after(&yaml, |_, plan| {
        // Three 1-core pods on a 2-vCPU size (1900m allocatable).
        for c in &mut plan.node_claims {
            c.instance_type = "Standard_D2s_v5".to_string();
            c.labels.remove(labels::INSTANCE_TYPE);
        }
        let mut all: Vec<String> = Vec::new();
        for c in &mut plan.node_claims {
            all.append(&mut c.pods);
        }
        plan.node_claims[0].pods = all;
    });
    assert_rejected(&e, "exceed allocatable");
}

#[test]
fn a_host_port_used_twice_on_a_node_is_rejected() {
    let spec = "      containers:
      - name: c
        image: i
        ports: [{containerPort: 80, hostPort: 8080}]
        resources: {requests: {cpu: 100m, memory: 128Mi}}";
    // Two host-port pods and a bare pods() list would repeat `containers`, so write them.
    let yaml = format!(
        "{POOL}---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: default}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
{spec}
"
    );
    let e = errors_after(&yaml, |_, plan| {
        assert_eq!(plan.node_claims.len(), 2, "the ports keep the pods apart");
        let pod = take_pod(plan, "web");
        let other = plan
            .node_claims
            .iter_mut()
            .find(|c| !c.pods.is_empty())
            .expect("the other claim");
        other.pods.push(pod);
    });
    assert_rejected(&e, "host port 8080 used twice");
}

#[test]
fn a_pod_on_a_taint_it_does_not_tolerate_is_rejected() {
    let yaml = format!(
        "{POOL}{}{}",
        node(
            "n1",
            "taints: [{key: dedicated, value: gpu, effect: NoSchedule}]"
        ),
        pods("web", 1, "1", "")
    );
    let e = errors_after(&yaml, |_, plan| {
        let pod = take_pod(plan, "web");
        place_on_existing(plan, "n1", pod);
    });
    assert_rejected(&e, "does not tolerate dedicated=gpu:NoSchedule");
}

#[test]
fn a_pod_on_a_node_its_selector_excludes_is_rejected() {
    let yaml = format!(
        "{POOL}{}{}",
        node("n1", ""),
        pods(
            "arm",
            1,
            "1",
            "      nodeSelector: {kubernetes.io/arch: arm64}"
        )
    );
    let e = errors_after(&yaml, |_, plan| {
        let pod = take_pod(plan, "arm");
        place_on_existing(plan, "n1", pod);
    });
    assert_rejected(&e, "on n1: node affinity");
}

const HOST_ANTI: &str = "      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - topologyKey: kubernetes.io/hostname
            labelSelector: {matchLabels: {app: solo}}";

#[test]
fn pods_sharing_a_node_despite_anti_affinity_are_rejected() {
    let yaml = format!("{POOL}{}", pods("solo", 2, "100m", HOST_ANTI));
    let e = errors_after(&yaml, |_, plan| {
        let pod = take_pod(plan, "solo");
        let other = plan
            .node_claims
            .iter_mut()
            .find(|c| !c.pods.is_empty())
            .expect("the other claim");
        other.pods.push(pod);
    });
    assert_rejected(&e, "despite anti-affinity");
}

#[test]
fn a_pod_in_another_pods_anti_affinity_domain_is_rejected() {
    // `solo` repels `web`; `web` itself has no constraint (the symmetric rule).
    let anti_web = "      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - topologyKey: kubernetes.io/hostname
            labelSelector: {matchLabels: {app: web}}";
    let yaml = format!(
        "{POOL}{}{}",
        pods("solo", 1, "100m", anti_web),
        pods("web", 1, "100m", "")
    );
    let e = errors_after(&yaml, |_, plan| {
        let pod = take_pod(plan, "web");
        claim_holding(plan, "default/solo-00000").pods.push(pod);
    });
    assert_rejected(
        &e,
        "default/web-00000 is in default/solo-00000's anti-affinity domain",
    );
}

#[test]
fn a_pod_away_from_its_required_affinity_peer_is_rejected() {
    let near = "      affinity:
        podAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - topologyKey: kubernetes.io/hostname
            labelSelector: {matchLabels: {app: cache}}";
    let yaml = format!(
        "{POOL}{}{}{}",
        node("n1", ""),
        // Too big for n1, so the cache pod and its peer get a new node.
        pods("cache", 1, "5", ""),
        pods("near", 1, "100m", near)
    );
    let e = errors_after(&yaml, |_, plan| {
        let pod = take_pod(plan, "near");
        place_on_existing(plan, "n1", pod);
    });
    assert_rejected(
        &e,
        "default/near-00000 has no affinity peer in its kubernetes.io/hostname",
    );
}

const ZONE_SPREAD: &str = "      topologySpreadConstraints:
      - maxSkew: 1
        topologyKey: topology.kubernetes.io/zone
        whenUnsatisfiable: DoNotSchedule
        labelSelector: {matchLabels: {app: web}}";

#[test]
fn a_spread_pod_on_a_node_without_the_topology_label_is_rejected() {
    let bare = "---
apiVersion: v1
kind: Node
metadata:
  name: bare
  labels: {kubernetes.io/arch: amd64, kubernetes.io/os: linux, kubernetes.io/hostname: bare}
status:
  allocatable: {cpu: '4', memory: 16Gi, pods: '110'}
";
    let yaml = format!("{POOL}{bare}{}", pods("web", 3, "3", ZONE_SPREAD));
    let e = errors_after(&yaml, |_, plan| {
        let pod = take_pod(plan, "web");
        place_on_existing(plan, "bare", pod);
    });
    assert_rejected(&e, "on bare which lacks topology.kubernetes.io/zone");
}

#[test]
fn a_spread_beyond_max_skew_is_rejected() {
    let yaml = format!("{POOL}{}", pods("web", 3, "3", ZONE_SPREAD));
    let e = errors_after(&yaml, |_, plan| {
        // One pod per zone; move one zone's pod to another zone's node: 2, 1, 0.
        assert_eq!(plan.node_claims.len(), 3);
        let pod = plan.node_claims[0].pods.remove(0);
        plan.node_claims[1].pods.push(pod);
    });
    assert_rejected(&e, "1 more than the least (0)");
}

/// Zone spread for pods whose node affinity allows only two of the region's three zones.
const TWO_ZONE_SPREAD: &str = "      topologySpreadConstraints:
      - maxSkew: 1
        topologyKey: topology.kubernetes.io/zone
        whenUnsatisfiable: DoNotSchedule
        labelSelector: {matchLabels: {app: web}}
      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions:
              - {key: topology.kubernetes.io/zone, operator: In, values: [eastus-1, eastus-2]}";

#[test]
fn a_zone_the_pods_affinity_excludes_is_not_a_spread_domain() {
    let yaml = format!("{POOL}{}", pods("web", 4, "3", TWO_ZONE_SPREAD));
    // Two pods in each allowed zone is sound (eastus-3, empty, does not count); three and
    // one is not.
    let e = errors_after(&yaml, |_, plan| {
        let in_zone = |plan: &Plan, zone: &str| -> usize {
            plan.node_claims
                .iter()
                .filter(|c| c.zone == zone)
                .map(|c| c.pods.len())
                .sum()
        };
        assert_eq!(
            (in_zone(plan, "eastus-1"), in_zone(plan, "eastus-2")),
            (2, 2),
            "{plan:#?}"
        );
        let from = plan
            .node_claims
            .iter()
            .position(|c| c.zone == "eastus-2")
            .expect("a claim in eastus-2");
        let to = plan
            .node_claims
            .iter()
            .position(|c| c.zone == "eastus-1")
            .expect("a claim in eastus-1");
        let pod = plan.node_claims[from].pods.remove(0);
        plan.node_claims[to].pods.push(pod);
    });
    assert_rejected(&e, "has 3 matching pods, 1 more than the least (1)");
}

#[test]
fn below_min_domains_the_least_count_is_zero() {
    let spread = format!(
        "{ZONE_SPREAD}
        minDomains: 4"
    );
    let yaml = format!("{POOL}{}", pods("web", 6, "3", &spread));
    let e = errors_after(&yaml, |_, plan| {
        // Three zones, fewer than four domains: one pod per zone, the rest unschedulable.
        assert_eq!(plan.node_claims.len(), 3);
        assert_eq!(plan.unschedulable.len(), 3);
        let pod = plan.unschedulable.remove(0).pod;
        plan.node_claims[0].pods.push(pod);
    });
    assert_rejected(&e, "has 2 matching pods, 1 more than the least (0)");
}

#[test]
fn a_plan_beyond_the_pool_resource_limit_is_rejected() {
    let pool = format!("{POOL}  limits: {{cpu: '8'}}\n");
    let yaml = format!("{pool}{}", pods("web", 1, "1", ""));
    let e = errors_after(&yaml, |_, plan| {
        plan.node_claims[0].instance_type = "Standard_D16s_v5".to_string();
        plan.node_claims[0].labels.remove(labels::INSTANCE_TYPE);
    });
    assert_rejected(&e, "nodepool default exceeds its cpu limit");
}

#[test]
fn a_plan_beyond_the_pool_node_limit_is_rejected() {
    let pool = format!("{POOL}  limits: {{nodes: '1'}}\n");
    let yaml = format!("{pool}{}", pods("web", 2, "500m", ""));
    let e = errors_after(&yaml, |_, plan| {
        assert_eq!(plan.node_claims.len(), 1, "{plan:#?}");
        let mut second = plan.node_claims[0].clone();
        let pod = plan.node_claims[0].pods.remove(0);
        second.name = format!("{}-b", second.name);
        second.pods = vec![pod];
        plan.node_claims.push(second);
    });
    assert_rejected(&e, "nodepool default exceeds its node limit");
}

#[test]
fn a_new_node_labelled_unlike_its_instance_type_is_rejected() {
    let yaml = format!("{POOL}{}", pods("web", 1, "1", ""));
    let e = errors_after(&yaml, |_, plan| {
        let arch = plan.node_claims[0]
            .labels
            .get_mut(labels::ARCH)
            .expect("a new node carries its architecture");
        *arch = if arch == "arm64" { "amd64" } else { "arm64" }.to_string();
    });
    assert_rejected(&e, "label kubernetes.io/arch is");
}

#[test]
fn a_pod_on_a_node_outside_its_required_node_affinity_terms_is_rejected() {
    // Two ORed terms, neither of which the existing amd64 node in eastus-1 meets.
    let affinity = "      affinity:
        nodeAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            nodeSelectorTerms:
            - matchExpressions: [{key: kubernetes.io/arch, operator: In, values: [arm64]}]
            - matchExpressions: [{key: topology.kubernetes.io/zone, operator: NotIn, values: [eastus-1]}]";
    let yaml = format!(
        "{POOL}{}{}",
        node("n1", ""),
        pods("picky", 1, "1", affinity)
    );
    let e = errors_after(&yaml, |_, plan| {
        let pod = take_pod(plan, "picky");
        place_on_existing(plan, "n1", pod);
    });
    assert_rejected(&e, "none of the 2 required node affinity terms matches");
}

#[test]
fn a_new_node_outside_a_numeric_pool_requirement_is_rejected() {
    let pool = POOL.replace(
        "      nodeClassRef",
        "      - {key: tailor.sh/sku-cpu, operator: Gte, values: ['4']}\n      nodeClassRef",
    );
    let yaml = format!("{pool}{}", pods("web", 1, "1", ""));
    let e = errors_after(&yaml, |_, plan| {
        plan.node_claims[0]
            .labels
            .insert(labels::SKU_CPU.to_string(), "2".to_string());
    });
    assert_rejected(
        &e,
        "requirement tailor.sh/sku-cpu Gte [4] does not hold for \"2\"",
    );
}

#[test]
fn a_pod_whose_constraints_were_not_kept_as_written_cannot_pass() {
    let yaml = format!(
        "{POOL}{}",
        pods(
            "arm",
            1,
            "1",
            "      nodeSelector: {kubernetes.io/arch: arm64}"
        )
    );
    let mut input = support::input_from_yaml(&yaml);
    let plan = scheduling::schedule(&input, &Options::default());
    assert!(validate(&input, &plan).is_empty());
    // Parsed constraints without the written ones: nothing to check them against.
    input.pending[0].written = None;
    assert_rejected(
        &validate(&input, &plan),
        "its placement constraints were not kept as written",
    );
}
