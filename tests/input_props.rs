//! Property: whatever bytes arrive, the snapshot loader, the quantity parser and the
//! catalog CSV loader answer with a value or an error, never a panic, and quickly. Inputs
//! are arbitrary bytes and, to reach past the first parse error, sequences of the tokens
//! each format is made of. 256 cases per property in `cargo test`; set `PROPTEST_CASES`
//! for a long fuzzing run.

use proptest::prelude::*;
use tailor::catalog::Catalog;
use tailor::model::quantity::{parse_milli, parse_value};
use tailor::state::Snapshot;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// YAML made of the pieces Kubernetes objects (and attacks on them) are made of.
fn yaml_pieces() -> impl Strategy<Value = String> {
    let pieces = prop::sample::select(vec![
        "apiVersion: v1\n",
        "apiVersion: apps/v1\n",
        "apiVersion: karpenter.sh/v1\n",
        "apiVersion: policy/v1\n",
        "kind: Pod\n",
        "kind: Deployment\n",
        "kind: Job\n",
        "kind: List\n",
        "kind: NodePool\n",
        "kind: PodDisruptionBudget\n",
        "metadata: {name: a, namespace: b}\n",
        "spec:\n",
        "  replicas: 3\n",
        "  replicas: -5\n",
        "  replicas: 2147483647\n",
        "  parallelism: 9999999\n",
        "  maxUnavailable: -1\n",
        "  containers: [{name: c, image: i, resources: {requests: {cpu: 1n}}}]\n",
        "  template: {spec: {containers: [{name: c, ports: [{containerPort: 0}]}]}}\n",
        "items:\n",
        "- ",
        "  ",
        "[",
        "]",
        "{",
        "}",
        ": ",
        ", ",
        "'",
        "\"",
        "# ",
        "---\n",
        "&a ",
        "*a ",
        "!!str ",
        "|\n",
        ">\n",
        "\n",
        "~",
        "null",
        "1e308",
        "NaN",
    ]);
    prop::collection::vec(pieces, 0..120).prop_map(|v| v.concat())
}

fn quantity_pieces() -> impl Strategy<Value = String> {
    let pieces = prop::sample::select(vec![
        "0",
        "1",
        "9",
        "99999999999999999999",
        ".",
        "+",
        "-",
        "e",
        "E",
        "m",
        "n",
        "u",
        "k",
        "M",
        "G",
        "Ki",
        "Mi",
        "Gi",
        "Ei",
        "i",
        "e-40",
        "e+40",
        " ",
    ]);
    prop::collection::vec(pieces, 0..12).prop_map(|v| v.concat())
}

fn csv_pieces() -> impl Strategy<Value = String> {
    let pieces = prop::sample::select(vec![
        "name,vcpus,memory_gib,arch\n",
        "region,sku,price_on_demand_usd_per_hour,sku_kind\n",
        "Standard_D2s_v5",
        "eastus",
        "EastUS",
        "vm",
        "2",
        "8",
        "-1",
        "NaN",
        "inf",
        "0.096",
        "arm64",
        ",",
        "\"",
        "\n",
        "#",
        "\r\n",
    ]);
    prop::collection::vec(pieces, 0..60).prop_map(|v| v.concat())
}

proptest! {
    #[test]
    fn the_snapshot_loader_never_panics_on_bytes(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let _ = Snapshot::from_yaml("fuzz.yaml", &text(&bytes));
    }

    #[test]
    fn the_snapshot_loader_never_panics_on_kubernetes_shaped_yaml(yaml in yaml_pieces()) {
        if let Ok(snapshot) = Snapshot::from_yaml("fuzz.yaml", &yaml) {
            prop_assert!(snapshot.pods.len() <= tailor::state::MAX_PODS_PER_SNAPSHOT);
        }
    }

    #[test]
    fn quantities_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..64), q in quantity_pieces()) {
        for input in [text(&bytes), q] {
            let _ = parse_milli(&input);
            let _ = parse_value(&input);
        }
    }

    #[test]
    fn the_catalog_loader_never_panics(
        skus in csv_pieces(),
        prices in csv_pieces(),
        bytes in prop::collection::vec(any::<u8>(), 0..1024),
    ) {
        let _ = Catalog::from_csv("fuzz", &skus, &prices);
        let _ = Catalog::from_csv("fuzz", &text(&bytes), &prices);
        if let Ok(catalog) = Catalog::from_csv("fuzz", &format!("name,vcpus,memory_gib\n{skus}"), &prices) {
            for region in catalog.regions() {
                let _ = catalog.instance_types(&tailor::catalog::CatalogOptions::for_region(region));
            }
        }
    }
}
