//! Loading cluster snapshots from the YAML that `kubectl` writes and from scenario files.

use std::path::PathBuf;

use tailor::state::{Snapshot, SnapshotError};

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
