//! Property: whatever the cluster, disruption never strands a pod — every pod bound
//! before is bound after, on a node with room for it — never takes a NodePool past its
//! limits, and makes progress: an empty node is removed and its price saved.

use proptest::prelude::*;
use tailor::catalog::{Catalog, CatalogOptions};
use tailor::disruption::{self, Cluster, Settings};
use tailor::model::{Dimension, NodeSettings, Resources};
use tailor::state::Snapshot;

const NOW: i64 = 1_796_040_000;

/// eastus on-demand USD per hour of the sizes in `SIZES`, from the built-in catalog.
const PRICES: &[f64] = &[0.096, 0.192, 0.384];

/// (name, allocatable cpu milli, allocatable memory MiB) of sizes in the pool.
const SIZES: &[(&str, i64, i64)] = &[
    ("Standard_D2s_v5", 1900, 4986),
    ("Standard_D4s_v5", 3860, 11745),
    ("Standard_D8s_v5", 7820, 25917),
];

fn scenario(nodes: &[(usize, Vec<(i64, i64)>)], cpu_limit: i64) -> String {
    let mut y = format!(
        "apiVersion: tailor.sh/v1alpha1
kind: NodePool
metadata: {{name: default}}
spec:
  template:
    spec:
      requirements:
      - {{key: karpenter.azure.com/sku-family, operator: In, values: [D]}}
      - {{key: kubernetes.io/arch, operator: In, values: [amd64]}}
      - {{key: karpenter.sh/capacity-type, operator: In, values: [on-demand]}}
      nodeClassRef: {{group: karpenter.azure.com, kind: AKSNodeClass, name: default}}
  limits: {{cpu: '{cpu_limit}m'}}
  disruption: {{consolidationPolicy: WhenEmptyOrUnderutilized, consolidateAfter: 0s, budgets: [{{nodes: '100%'}}]}}
"
    );
    for (n, (size, pods)) in nodes.iter().enumerate() {
        let (ty, cpu, mem) = SIZES[*size];
        y.push_str(&format!(
            "---
apiVersion: v1
kind: Node
metadata:
  name: n{n}
  labels: {{tailor.sh/nodepool: default, node.kubernetes.io/instance-type: {ty}, topology.kubernetes.io/zone: eastus-1, karpenter.sh/capacity-type: on-demand, kubernetes.io/arch: amd64, kubernetes.io/os: linux, karpenter.azure.com/sku-family: D}}
status:
  allocatable: {{cpu: {cpu}m, memory: {mem}Mi, pods: '110'}}
"
        ));
        for (p, (c, m)) in pods.iter().enumerate() {
            y.push_str(&format!(
                "---
apiVersion: v1
kind: Pod
metadata: {{name: p{n}-{p}, namespace: app}}
spec:
  nodeName: n{n}
  containers: [{{name: c, image: i, resources: {{requests: {{cpu: {c}m, memory: {m}Mi}}}}}}]
status: {{phase: Running}}
"
            ));
        }
    }
    y
}

/// Nodes with pods that fit them.
fn nodes() -> impl Strategy<Value = Vec<(usize, Vec<(i64, i64)>)>> {
    prop::collection::vec(
        (
            0..SIZES.len(),
            prop::collection::vec((50i64..1800, 64i64..3000), 0..6),
        ),
        1..7,
    )
    .prop_map(|nodes| {
        nodes
            .into_iter()
            .map(|(size, pods)| {
                let (_, cpu, mem) = SIZES[size];
                let (mut c, mut m) = (0, 0);
                let fitting = pods
                    .into_iter()
                    .filter(|(pc, pm)| {
                        let ok = c + pc <= cpu && m + pm <= mem;
                        if ok {
                            c += pc;
                            m += pm;
                        }
                        ok
                    })
                    .collect();
                (size, fitting)
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn consolidation_strands_no_pod_and_keeps_pool_limits(
        nodes in nodes(),
        headroom in 0i64..16_000,
    ) {
        let in_use: i64 = nodes.iter().map(|(s, _)| SIZES[*s].1).sum();
        let limit = in_use + headroom;
        let snapshot = Snapshot::from_yaml("props.yaml", &scenario(&nodes, limit)).expect("parses");
        let catalog = Catalog::builtin().expect("catalog");
        let types = |s: &NodeSettings| {
            let mut o = CatalogOptions::for_region("eastus");
            o.node = s.clone();
            catalog.instance_types(&o).map(Into::into).map_err(|e| e.to_string())
        };
        let cluster = Cluster::from_snapshot(&snapshot, &types, NOW).expect("cluster");
        let out = disruption::run(&cluster, &Settings::default());

        let mut before: Vec<String> = cluster.input.nodes.iter()
            .flat_map(|n| n.pods.iter().map(|p| p.key.clone())).collect();
        let mut after: Vec<String> = out.nodes.iter()
            .flat_map(|n| n.pods.iter().map(|p| p.key.clone())).collect();
        before.sort();
        after.sort();
        prop_assert_eq!(&before, &after, "every pod bound before is bound after, once");
        let mut cpu_in_pool = 0;
        for n in &out.nodes {
            let mut used = Resources::default();
            for p in &n.pods {
                used = used.checked_add(&p.requests).expect("adds");
                prop_assert_eq!(p.node_name.as_deref(), Some(n.name.as_str()));
            }
            for d in [Dimension::Cpu, Dimension::Memory] {
                prop_assert!(used.get(&d) <= n.allocatable.get(&d),
                    "node {} over-committed on {:?}: {:?}", n.name, d, out.report);
            }
            cpu_in_pool += n.allocatable.get(&Dimension::Cpu);
        }
        prop_assert!(cpu_in_pool <= limit, "pool cpu {} > limit {}", cpu_in_pool, limit);
        let summary = &out.report.summary;
        prop_assert!(summary.hourly_cost_after <= summary.hourly_cost_before + 1e-9);
        // Progress: nothing protects an empty node here (a 100% budget, consolidateAfter
        // 0s, no annotation), so every empty node goes and the cost falls by its price.
        let empty: Vec<usize> = (0..nodes.len()).filter(|&n| nodes[n].1.is_empty()).collect();
        let empty_price: f64 = empty.iter().map(|&n| PRICES[nodes[n].0]).sum();
        prop_assert!(
            summary.hourly_cost_after <= summary.hourly_cost_before - empty_price + 1e-9,
            "{} empty node(s) worth ${}/hour, cost ${} -> ${}: {:#?}",
            empty.len(), empty_price, summary.hourly_cost_before, summary.hourly_cost_after, out.report
        );
        prop_assert!(summary.nodes_after + empty.len() <= summary.nodes_before, "{:#?}", out.report);
        for &n in &empty {
            let name = format!("n{n}");
            prop_assert!(out.nodes.iter().all(|x| x.name != name), "empty {} kept: {:#?}", name, out.report);
        }
    }
}
