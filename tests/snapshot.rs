//! Loading cluster snapshots from the YAML that `kubectl` writes and from scenario files.

use std::path::PathBuf;

use tailor::state::{MAX_PODS_PER_SNAPSHOT, MAX_YAML_DEPTH, PendingPods, Snapshot, SnapshotError};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn load(names: &[&str]) -> Snapshot {
    let paths: Vec<PathBuf> = names.iter().map(|n| fixture(n)).collect();
    Snapshot::load(&paths).expect("fixtures load")
}

fn load_err(text: &str) -> String {
    match Snapshot::from_yaml("broken.yaml", text) {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_kubectl_list_with_mixed_kinds_loads_every_kind_tailor_reads() {
    let s = load(&["cluster-list.yaml"]);
    assert_eq!(s.nodes.len(), 1);
    assert_eq!(s.deployments.len(), 1);
    assert_eq!(s.replica_sets.len(), 1);
    assert_eq!(s.daemon_sets.len(), 1);
    assert_eq!(s.pod_disruption_budgets.len(), 1);
    assert_eq!(s.horizontal_pod_autoscalers.len(), 1);
    // The listed pod belongs to the Deployment through its ReplicaSet, so two of the
    // three replicas are missing and become pending pods.
    assert_eq!(s.pods.len(), 3);
    assert_eq!(s.pending_pods().count(), 2);
    assert_eq!(s.pods_on("aks-default-a1b2c").count(), 1);
    assert!(
        s.warnings
            .iter()
            .any(|w| w.contains("ConfigMap shop/settings") && w.contains("item 8")),
        "{:?}",
        s.warnings
    );
}

#[test]
fn a_multi_document_scenario_expands_workloads_into_pending_pods() {
    let s = load(&["scenario.yaml"]);
    assert_eq!(
        s.node_pools.len(),
        1,
        "karpenter.sh/v1 NodePool is read as a Tailor NodePool"
    );
    assert_eq!(s.node_classes.len(), 1);
    let pending: Vec<_> = s.pending_pods().collect();
    // 500 api replicas + 3 db replicas + 2 report pods (parallelism 2 of 5 completions).
    assert_eq!(pending.len(), 505);
    let db0 = pending
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some("db-0"))
        .expect("StatefulSet pods are named by ordinal");
    assert_eq!(db0.metadata.namespace.as_deref(), Some("shop"));
    assert_eq!(
        db0.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app"))
            .map(String::as_str),
        Some("db")
    );
    let owner = &db0.metadata.owner_references.as_ref().expect("owner set")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("StatefulSet", "db")
    );
}

#[test]
fn files_and_directories_merge_into_one_snapshot() {
    let s = load(&["cluster-list.yaml", "scenario.yaml"]);
    assert_eq!(s.pending_pods().count(), 507);
    let dir = Snapshot::load(&[PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")])
        .expect("directory loads");
    assert_eq!(dir.pending_pods().count(), 507);
}

#[test]
fn a_bad_quantity_names_file_document_object_and_field() {
    let msg = load_err(
        "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: shop}\nspec:\n  containers:\n  \
         - name: a\n    image: a\n  - name: b\n    image: b\n    resources:\n      requests: {cpu: lots}\n",
    );
    assert!(msg.contains("broken.yaml"), "{msg}");
    assert!(msg.contains("document 2"), "{msg}");
    assert!(msg.contains("Pod shop/web"), "{msg}");
    assert!(
        msg.contains("spec.containers[1].resources.requests"),
        "{msg}"
    );
    assert!(msg.contains("\"lots\""), "{msg}");
}

#[test]
fn a_wrongly_typed_field_names_its_path_inside_a_list() {
    let msg = load_err(
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: apps/v1\n  kind: Deployment\n  \
         metadata: {name: api, namespace: shop}\n  spec:\n    replicas: three\n    selector: {}\n    \
         template: {}\n",
    );
    assert!(msg.contains("document 1 item 1"), "{msg}");
    assert!(msg.contains("Deployment shop/api"), "{msg}");
    assert!(msg.contains("field spec.replicas"), "{msg}");
}

#[test]
fn a_bad_document_loads_nothing() {
    let text = "apiVersion: v1\nkind: Node\nmetadata: {name: ok}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: [not, a, string]}\n";
    let err = Snapshot::from_yaml("two.yaml", text).expect_err("second document is bad");
    assert!(matches!(err, SnapshotError::Object { .. }));
    assert!(err.to_string().contains("document 2"), "{err}");
    assert!(err.to_string().contains("metadata.name"), "{err}");
}

#[test]
fn invalid_yaml_and_missing_kind_are_errors_with_the_document_index() {
    let msg = load_err("apiVersion: v1\nkind: Node\n---\nkey: [unclosed\n");
    assert!(
        msg.contains("document 2") && msg.contains("invalid YAML"),
        "{msg}"
    );
    let msg = load_err("apiVersion: v1\nmetadata: {name: x}\n");
    assert!(msg.contains("document 1") && msg.contains("kind"), "{msg}");
}

#[test]
fn a_nodepool_with_a_bad_limit_is_rejected() {
    let msg = load_err(
        "apiVersion: tailor.sh/v1alpha1\nkind: NodePool\nmetadata: {name: default}\n\
         spec:\n  template:\n    spec:\n      requirements: []\n      \
         nodeClassRef: {group: tailor.sh, kind: AKSNodeClass, name: default}\n  limits: {cpu: 10x}\n",
    );
    assert!(
        msg.contains("NodePool default") && msg.contains("spec.limits") && msg.contains("\"10x\""),
        "{msg}"
    );
}

fn workload(kind: &str, name: &str, count_field: &str, count: i64) -> String {
    let api = if kind == "Job" { "batch/v1" } else { "apps/v1" };
    format!(
        "apiVersion: {api}\nkind: {kind}\nmetadata: {{name: {name}, namespace: shop}}\n\
         spec:\n  {count_field}: {count}\n  selector: {{matchLabels: {{app: {name}}}}}\n  \
         template:\n    metadata: {{labels: {{app: {name}}}}}\n    spec:\n      \
         containers: [{{name: app, image: app, resources: {{requests: {{cpu: 100m}}}}}}]\n"
    )
}

#[test]
fn workloads_asking_for_more_pods_than_a_snapshot_may_hold_are_refused_before_expansion() {
    for (kind, field, count) in [
        ("Deployment", "replicas", 2_147_483_647),
        ("StatefulSet", "replicas", 100_000_000),
        ("Job", "parallelism", 2_000_000_000),
    ] {
        let err = Snapshot::from_yaml("huge.yaml", &workload(kind, "huge", field, count))
            .expect_err("more pods than a snapshot may hold");
        assert!(matches!(err, SnapshotError::TooManyPods { .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.contains(&format!("{kind} shop/huge")), "{msg}");
        assert!(msg.contains(&format!("spec.{field}")), "{msg}");
        assert!(msg.contains(&count.to_string()), "{msg}");
        assert!(msg.contains(&MAX_PODS_PER_SNAPSHOT.to_string()), "{msg}");
    }
    // Many workloads that each fit are refused together once they cross the bound.
    let half = (MAX_PODS_PER_SNAPSHOT / 2 + 1) as i64;
    let text = format!(
        "{}---\n{}",
        workload("Deployment", "a", "replicas", half),
        workload("Deployment", "b", "replicas", half)
    );
    let err = Snapshot::from_yaml("two.yaml", &text).expect_err("the sum is too large");
    assert!(err.to_string().contains("Deployment shop/b"), "{err}");
}

#[test]
fn loading_without_pending_pods_keeps_a_huge_workload_as_a_template_only() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("huge.yaml");
    std::fs::write(
        &path,
        workload("Deployment", "huge", "replicas", 2_147_483_647),
    )
    .expect("write");
    let s = Snapshot::load_with(std::slice::from_ref(&path), PendingPods::Skip).expect("loads");
    assert_eq!(s.deployments.len(), 1);
    assert!(s.pods.is_empty());
    // The same file with expansion is refused, not expanded.
    assert!(Snapshot::load_with(&[path], PendingPods::Expand).is_err());
}

#[test]
fn negative_counts_are_refused_as_the_api_server_does() {
    for (kind, field) in [
        ("Deployment", "replicas"),
        ("StatefulSet", "replicas"),
        ("ReplicaSet", "replicas"),
        ("Job", "parallelism"),
        ("Job", "completions"),
    ] {
        let msg = load_err(&workload(kind, "web", field, -5));
        assert!(
            msg.contains(&format!("{kind} shop/web"))
                && msg.contains(&format!(
                    "field spec.{field}: Invalid value: -5: must be greater than or equal to 0"
                )),
            "{msg}"
        );
    }
}

#[test]
fn deeply_nested_yaml_is_refused_before_parsing() {
    let depth = 100_000;
    let flow = format!("key: {}{}\n", "[".repeat(depth), "]".repeat(depth));
    let block = format!("{}x\n", "- ".repeat(depth));
    let mapping = format!("key: {}", "{a: ".repeat(depth));
    for text in [flow, block, mapping] {
        let started = std::time::Instant::now();
        let err = Snapshot::from_yaml("deep.yaml", &text).expect_err("too deep");
        let msg = err.to_string();
        assert!(
            msg.contains("deep.yaml")
                && msg.contains("at line 1")
                && msg.contains(&format!("more than the {MAX_YAML_DEPTH} levels")),
            "{msg}"
        );
        // Not a timing assertion on the result: a parse of this depth takes tens of
        // seconds, the scan a few milliseconds; allow any machine a wide margin.
        assert!(started.elapsed().as_secs() < 5, "{:?}", started.elapsed());
    }
    // Nesting to the bound, quoted brackets and brackets in comments are not counted
    // against it.
    let ok = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c, annotations: {{a: \"[[[[{}\"}}}}  # {}\n",
        "[".repeat(500),
        "{".repeat(500)
    );
    Snapshot::from_yaml("ok.yaml", &ok).expect("brackets in strings and comments are fine");
}

#[test]
fn an_empty_file_dev_null_or_an_empty_directory_is_an_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let empty = dir.path().join("empty.yaml");
    std::fs::write(&empty, "# only a comment\n---\n").expect("write");
    let err = Snapshot::load(std::slice::from_ref(&empty)).expect_err("no objects");
    assert!(matches!(err, SnapshotError::Empty { .. }), "{err}");
    assert!(
        err.to_string().contains("empty.yaml: no YAML document"),
        "{err}"
    );
    let err = Snapshot::load(&[PathBuf::from("/dev/null")]).expect_err("no objects");
    assert!(err.to_string().contains("/dev/null"), "{err}");
    let nothing = dir.path().join("nothing");
    std::fs::create_dir(&nothing).expect("mkdir");
    std::fs::write(nothing.join("notes.txt"), "not yaml").expect("write");
    let err = Snapshot::load(&[nothing]).expect_err("no YAML files");
    assert!(
        err.to_string()
            .contains("no .yaml or .yml file in this directory"),
        "{err}"
    );
}

#[test]
fn invalid_objects_are_refused_with_the_api_servers_message_naming_object_field_and_value() {
    let cases = [
        (
            "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: web, namespace: shop}\n\
             spec: {maxUnavailable: -1, selector: {matchLabels: {app: web}}}\n",
            "PodDisruptionBudget shop/web): field spec.maxUnavailable: Invalid value: -1: must be greater than or equal to 0",
        ),
        (
            "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: web, namespace: shop}\n\
             spec: {minAvailable: '150%'}\n",
            "field spec.minAvailable: Invalid value: \"150%\": must not be greater than 100%",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: shop}\nspec:\n  containers:\n  \
             - name: a\n    image: a\n    ports: [{containerPort: 80, hostPort: 999999}]\n",
            "Pod shop/web): field spec.containers[0].ports[0].hostPort: Invalid value: 999999: must be between 1 and 65535, inclusive",
        ),
        (
            "apiVersion: karpenter.azure.com/v1beta1\nkind: AKSNodeClass\nmetadata: {name: default}\n\
             spec: {maxPods: 0}\n",
            "AKSNodeClass default): field spec.maxPods: Invalid value: 0: spec.maxPods in body should be greater than or equal to 10",
        ),
        (
            "apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata: {name: default}\nspec:\n  template:\n    \
             spec:\n      requirements: []\n      nodeClassRef: {group: tailor.sh, kind: AKSNodeClass, name: default}\n  \
             disruption:\n    budgets: [{nodes: '10%', schedule: '0 9 * *', duration: 8h}]\n",
            "NodePool default): field spec.disruption.budgets[0].schedule: Invalid value: \"0 9 * *\": spec.disruption.budgets[0].schedule in body should match",
        ),
    ];
    for (text, expected) in cases {
        let msg = load_err(text);
        assert!(msg.contains(expected), "{msg}\nexpected: {expected}");
    }
    // A template's ports are checked too, under the template's path.
    let mut deployment = workload("Deployment", "web", "replicas", 1);
    deployment = deployment.replace(
        "resources: {requests: {cpu: 100m}}",
        "ports: [{containerPort: 0}]",
    );
    let msg = load_err(&deployment);
    assert!(
        msg.contains(
            "field spec.template.spec.containers[0].ports[0].containerPort: Invalid value: 0"
        ),
        "{msg}"
    );
}

/// The same text parsed as whole documents: a trailing empty document keeps the loader
/// from reading a list item by item.
fn whole(text: &str) -> String {
    format!("{text}---\n")
}

#[test]
fn a_kubectl_list_read_item_by_item_holds_exactly_what_it_holds_read_whole() {
    let text = std::fs::read_to_string(fixture("cluster-list.yaml")).expect("fixture");
    let by_item = Snapshot::from_yaml("list.yaml", &text).expect("by item");
    let read_whole = Snapshot::from_yaml("list.yaml", &whole(&text)).expect("whole");
    assert_eq!(format!("{by_item:?}"), format!("{read_whole:?}"));
    // Indented items, comments between them, block scalars, a typed list whose items
    // omit their kind, and keys after the items.
    let typed = "# kubectl get pods -o yaml\n---\napiVersion: v1\nitems:\n  # first\n  - metadata:\n      \
                 name: a\n      namespace: x\n      annotations:\n        note: |\n          - not an item\n\
                 \n          kind: nor a key\n    spec:\n      containers: [{name: c, resources: {requests: \
                 {cpu: 100m}}}]\n\n  - metadata: {name: b, namespace: x}\n    spec: {containers: [{name: c}]}\n\
                 kind: PodList\nmetadata:\n  resourceVersion: \"7\"\n";
    let by_item = Snapshot::from_yaml("pods.yaml", typed).expect("typed list by item");
    assert_eq!(by_item.pods.len(), 2);
    assert_eq!(
        by_item.pods[0]
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("note"))
            .map(String::as_str),
        Some("- not an item\n\nkind: nor a key\n")
    );
    let read_whole = Snapshot::from_yaml("pods.yaml", &whole(typed)).expect("whole");
    assert_eq!(format!("{by_item:?}"), format!("{read_whole:?}"));
}

#[test]
fn a_list_whose_items_share_anchors_is_read_whole_with_the_same_result() {
    // The second item aliases the first's labels: it cannot be parsed alone.
    let text = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Pod\n  metadata:\n    \
                name: a\n    labels: &labels {app: web}\n  spec: {containers: [{name: c}]}\n\
                - apiVersion: v1\n  kind: Pod\n  metadata:\n    name: b\n    labels: *labels\n  \
                spec: {containers: [{name: c}]}\n";
    let s = Snapshot::from_yaml("anchors.yaml", text).expect("anchors resolve");
    assert_eq!(s.pods.len(), 2);
    assert_eq!(
        s.pods[1]
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("app")),
        Some(&"web".to_string())
    );
}

#[test]
fn errors_in_a_list_read_item_by_item_name_the_item_and_a_bad_item_loads_nothing() {
    let text = "apiVersion: v1\nitems:\n- apiVersion: v1\n  kind: Pod\n  metadata: {name: a}\n  \
                spec: {containers: [{name: c}]}\n- apiVersion: v1\n  kind: Pod\n  metadata: {name: b}\n  \
                spec: {containers: [{name: c, resources: {requests: {cpu: lots}}}]}\nkind: List\n";
    let msg = load_err(text);
    assert!(
        msg.contains("document 1 item 2") && msg.contains("Pod b"),
        "{msg}"
    );
    assert_eq!(msg, load_err(&whole(text)));
    // Broken YAML in an item is the parser's message for the whole document, with the
    // line in the file.
    let broken = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Pod\n  metadata: {name: [a}\n";
    let msg = load_err(broken);
    assert!(
        msg.contains("document 1: invalid YAML") && msg.contains("line 6"),
        "{msg}"
    );
}

/// A `kind: List` of `n` pods; `bad` items get an unreadable CPU request and `shared` ones
/// alias an anchor set in item 1 (such an item cannot be parsed alone).
fn long_list(n: usize, bad: &[usize], shared: &[usize]) -> String {
    let mut text = String::from("apiVersion: v1\nkind: List\nitems:\n");
    for i in 1..=n {
        let cpu = if bad.contains(&i) { "lots" } else { "100m" };
        let labels = if i == 1 {
            "&labels {app: web}"
        } else if shared.contains(&i) {
            "*labels"
        } else {
            "{app: web}"
        };
        text.push_str(&format!(
            "- apiVersion: v1\n  kind: Pod\n  metadata:\n    name: p{i}\n    namespace: x\n    \
             labels: {labels}\n  spec:\n    containers:\n    - name: c\n      resources: \
             {{requests: {{cpu: {cpu}}}}}\n"
        ));
    }
    text
}

#[test]
fn a_long_list_read_on_every_core_keeps_its_order_and_the_sequential_outcome() {
    // Long enough to be cut into runs for several cores.
    let text = long_list(3000, &[], &[]);
    let by_item = Snapshot::from_yaml("long.yaml", &text).expect("by item");
    assert_eq!(by_item.pods.len(), 3000);
    let names: Vec<_> = by_item
        .pods
        .iter()
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect();
    let expected: Vec<_> = (1..=3000).map(|i| format!("p{i}")).collect();
    assert_eq!(names, expected, "items keep the file's order");
    let read_whole = Snapshot::from_yaml("long.yaml", &whole(&text)).expect("whole");
    assert_eq!(format!("{by_item:?}"), format!("{read_whole:?}"));

    // Two bad items in different halves of the list: the error is the first one's, as
    // read in order.
    let msg = load_err(&long_list(3000, &[2900, 1200], &[]));
    assert!(
        msg.contains("document 1 item 1200") && msg.contains("Pod x/p1200"),
        "{msg}"
    );
    // An item that cannot be parsed alone, late in the list, after a bad one: the bad item
    // decides, as it would have one item after another.
    let msg = load_err(&long_list(3000, &[1200], &[2500]));
    assert!(msg.contains("document 1 item 1200"), "{msg}");
    // The aliased item first: the list is read whole, and the bad item is still named
    // (by the whole document's reading, with the same message as read whole).
    let text = long_list(3000, &[2500], &[1200]);
    assert_eq!(load_err(&text), load_err(&whole(&text)));
    let shared = long_list(3000, &[], &[1200, 2999]);
    let s = Snapshot::from_yaml("shared.yaml", &shared).expect("anchors resolve");
    assert_eq!(s.pods.len(), 3000);
}
