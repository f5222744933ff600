//! Property: whatever bytes arrive, the snapshot loader, the quantity parser and the
//! catalog CSV loader answer with a value or an error, never a panic, and quickly. Inputs
//! are arbitrary bytes and, to reach past the first parse error, sequences of the tokens
//! each format is made of, and kubectl-shaped lists, which must load the same read item
//! by item as read whole. 256 cases per property in `cargo test`; set `PROPTEST_CASES`
//! for a long fuzzing run (`--nocapture` shows the slowest case of each property).

use proptest::prelude::*;
use tailor::catalog::Catalog;
use tailor::model::quantity::{parse_milli, parse_value};
use tailor::state::Snapshot;

/// Runs one case and reports (with `--nocapture`) each time a property's slowest case so
/// far gets slower, so a long fuzzing run shows how close any input came to hanging.
fn timed<T>(property: &str, case: impl FnOnce() -> T) -> T {
    use std::sync::Mutex;
    use std::time::{Duration, Instant};
    static SLOWEST: Mutex<Vec<(String, Duration)>> = Mutex::new(Vec::new());
    let start = Instant::now();
    let out = case();
    let took = start.elapsed();
    let mut slowest = SLOWEST.lock().unwrap_or_else(|e| e.into_inner());
    let known = slowest.iter().position(|(p, _)| p == property);
    let record = match known {
        Some(i) if slowest[i].1 >= took => None,
        Some(i) => Some(i),
        None => {
            slowest.push((property.to_string(), Duration::ZERO));
            Some(slowest.len() - 1)
        }
    };
    if let Some(i) = record {
        slowest[i].1 = took;
        if took > Duration::from_millis(50) {
            eprintln!("slowest case of {property} so far: {took:.2?}");
        }
    }
    out
}

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

/// A `kind: List` as kubectl writes it, items at indentation 0 or 2, with what YAML allows
/// between and inside items (comments, blank lines, block scalars, anchors, flow
/// collections) and, sometimes, a broken or misplaced line.
fn list_texts() -> impl Strategy<Value = String> {
    let items = prop::sample::select(vec![
        vec![
            "- apiVersion: v1",
            "  kind: Pod",
            "  metadata: {name: a, namespace: x}",
            "  spec:",
            "    containers:",
            "    - name: c",
            "      resources: {requests: {cpu: 100m}}",
        ],
        vec![
            "- apiVersion: v1",
            "  kind: Node",
            "  metadata:",
            "    name: n",
            "    labels: &l {a: b}",
            "  status: {allocatable: {cpu: '4', memory: 16Gi}}",
        ],
        vec![
            "- metadata:",
            "    name: p",
            "    annotations:",
            "      note: |",
            "        - not an item",
            "",
            "        kind: Pod",
            "  spec: {containers: [{name: c}]}",
        ],
        vec![
            "-",
            "  apiVersion: apps/v1",
            "  kind: Deployment",
            "  metadata: {name: d, namespace: x}",
            "  spec: {replicas: 2, template: {spec: {containers: [{name: c}]}}}",
        ],
        vec![
            "- apiVersion: v1",
            "  kind: ConfigMap",
            "  metadata: {name: cm}",
            "  data:",
            "    k: \"multi",
            "      line\"",
        ],
        vec![
            "- apiVersion: v1",
            "  kind: Pod",
            "  metadata: {name: q, labels: *l}",
            "  spec: {containers: [{name: c}]}",
        ],
        vec![
            "- apiVersion: policy/v1",
            "  kind: PodDisruptionBudget",
            "  metadata: {name: b, namespace: x}",
            "  spec: {maxUnavailable: -1}",
        ],
        vec![
            "# a comment",
            "- apiVersion: v1",
            "  kind: Pod",
            "  # inside",
            "  metadata: {name: r}",
            "  spec: {containers: [{name: c, ports: [{containerPort: 80, hostPort: 999999}]}]}",
        ],
        vec!["- [a, b", "  ]"],
        vec!["- plain", "  continued"],
        vec!["- 'quoted", "- still quoted'"],
        vec!["-bad"],
        vec!["  stray: key"],
        vec!["\tkind: Pod"],
        vec!["--- "],
    ]);
    let headers = prop::sample::select(vec![
        "apiVersion: v1\n",
        "---\napiVersion: v1\n",
        "# kubectl get all\napiVersion: v1\nkind: List\n",
        "apiVersion: v1\nkind: PodList\n",
        "apiVersion: v1\nmetadata: {a: [\n",
    ]);
    let trailers = prop::sample::select(vec![
        "kind: List\nmetadata:\n  resourceVersion: \"\"\n",
        "kind: PodList\n",
        "metadata: {}\n",
        "]}\nkind: List\n",
        "items: []\nkind: List\n",
        "",
    ]);
    (
        headers,
        prop::bool::ANY,
        prop::collection::vec(items, 0..6),
        trailers,
    )
        .prop_map(|(header, indented, items, trailer)| {
            let pad = if indented { "  " } else { "" };
            let mut text = format!("{header}items:\n");
            for item in items {
                for line in item {
                    if !line.is_empty() {
                        text.push_str(pad);
                    }
                    text.push_str(line);
                    text.push('\n');
                }
            }
            text.push_str(trailer);
            text
        })
}

proptest! {
    #[test]
    fn a_list_read_item_by_item_loads_exactly_what_it_loads_read_whole(text in list_texts()) {
        // A trailing empty document makes the loader read the text whole.
        let (by_item, whole) = timed("list item by item", || {
            (
                Snapshot::from_yaml("list.yaml", &text),
                Snapshot::from_yaml("list.yaml", &format!("{text}---\n")),
            )
        });
        match (&by_item, &whole) {
            (Ok(a), Ok(b)) => prop_assert_eq!(format!("{a:?}"), format!("{b:?}")),
            (Err(_), Err(_)) => {}
            _ => prop_assert!(false, "by item: {:?}\nwhole: {:?}", by_item.as_ref().map(|s| s.pods.len()), whole.as_ref().map(|s| s.pods.len())),
        }
    }

    #[test]
    fn the_snapshot_loader_never_panics_on_bytes(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let _ = timed("snapshot bytes", || Snapshot::from_yaml("fuzz.yaml", &text(&bytes)));
    }

    #[test]
    fn the_snapshot_loader_never_panics_on_kubernetes_shaped_yaml(yaml in yaml_pieces()) {
        if let Ok(snapshot) = timed("snapshot yaml", || Snapshot::from_yaml("fuzz.yaml", &yaml)) {
            prop_assert!(snapshot.pods.len() <= tailor::state::MAX_PODS_PER_SNAPSHOT);
        }
    }

    #[test]
    fn quantities_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..64), q in quantity_pieces()) {
        timed("quantities", || {
            for input in [text(&bytes), q] {
                let _ = parse_milli(&input);
                let _ = parse_value(&input);
            }
        });
    }

    #[test]
    fn the_catalog_loader_never_panics(
        skus in csv_pieces(),
        prices in csv_pieces(),
        bytes in prop::collection::vec(any::<u8>(), 0..1024),
    ) {
        timed("catalog", || {
            let _ = Catalog::from_csv("fuzz", &skus, &prices);
            let _ = Catalog::from_csv("fuzz", &text(&bytes), &prices);
            if let Ok(catalog) = Catalog::from_csv("fuzz", &format!("name,vcpus,memory_gib\n{skus}"), &prices) {
                for region in catalog.regions() {
                    let _ = catalog.instance_types(&tailor::catalog::CatalogOptions::for_region(region));
                }
            }
        });
    }
}
