//! Heap use of one disruption pass over a cluster Tailor manages: 500 nodes, 5,000 pods
//! (the agent bench's shape), measured in process by a counting allocator. Prints the bytes
//! live after the snapshot is built (the baseline: what the agent's stores hold), what the
//! cluster model adds, and the peak the evaluation reaches above it, each as a ratio of the
//! baseline. This is the part of the agent's peak memory the disruption controller adds
//! every few seconds. Then the summary pass the agent also runs every 30 s (every decision,
//! not only the first): its time as a ratio of the deciding pass's, its peak, and the share
//! of the controller's evaluation time summaries take.
//!
//! `cargo bench --bench disruption_memory`. Without `--bench` (as `cargo test --all-targets`
//! runs it) it does a small smoke run: 20 nodes and 100 pods.

use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};

use tailor::catalog::{Catalog, CatalogOptions};
use tailor::disruption::{self, Cluster, Settings};
use tailor::model::NodeSettings;
use tailor::state::Snapshot;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; the counters only
// observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                let live = LIVE.fetch_add(new_size - layout.size(), Ordering::Relaxed)
                    + (new_size - layout.size());
                PEAK.fetch_max(live, Ordering::Relaxed);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const PODS_PER_NODE: usize = 10;
const NOW: i64 = 1_767_225_600;

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Resets the peak to what is live now and returns that.
fn mark() -> usize {
    let live = LIVE.load(Ordering::Relaxed);
    PEAK.store(live, Ordering::Relaxed);
    live
}

/// A NodePool, its class, and `nodes` initialized nodes with their claims, each holding
/// `PODS_PER_NODE` pods of 200 Deployments.
fn cluster_yaml(nodes: usize) -> String {
    let mut y = String::from(
        "apiVersion: tailor.sh/v1alpha1
kind: AKSNodeClass
metadata: {name: default}
spec: {imageFamily: AzureLinux, maxPods: 110}
---
apiVersion: tailor.sh/v1alpha1
kind: NodePool
metadata: {name: default}
spec:
  template:
    spec:
      requirements:
      - {key: tailor.sh/sku-family, operator: In, values: [D]}
      nodeClassRef: {group: tailor.sh, kind: AKSNodeClass, name: default}
  disruption: {consolidateAfter: 0s}
",
    );
    for i in 0..nodes {
        let zone = i % 3 + 1;
        write!(
            y,
            "---
apiVersion: v1
kind: Node
metadata:
  name: bench-{i:04}
  labels:
    tailor.sh/nodepool: default
    tailor.sh/registered: 'true'
    tailor.sh/capacity-type: on-demand
    kubernetes.io/hostname: bench-{i:04}
    node.kubernetes.io/instance-type: Standard_D8s_v5
    topology.kubernetes.io/zone: eastus-{zone}
    kubernetes.io/arch: amd64
    kubernetes.io/os: linux
  creationTimestamp: '2025-12-01T00:00:00Z'
spec: {{providerID: 'kwok://bench-{i:04}'}}
status:
  capacity: {{cpu: '8', memory: 32Gi, pods: '110'}}
  allocatable: {{cpu: 7800m, memory: 27Gi, pods: '110'}}
---
apiVersion: tailor.sh/v1alpha1
kind: NodeClaim
metadata:
  name: bench-{i:04}
  labels: {{tailor.sh/nodepool: default}}
  creationTimestamp: '2025-12-01T00:00:00Z'
spec:
  nodeClassRef: {{group: tailor.sh, kind: AKSNodeClass, name: default}}
status:
  nodeName: bench-{i:04}
  providerID: 'kwok://bench-{i:04}'
  conditions:
  - {{type: Launched, status: 'True', reason: Launched, message: '', lastTransitionTime: '2025-12-01T00:00:00Z'}}
  - {{type: Registered, status: 'True', reason: Registered, message: '', lastTransitionTime: '2025-12-01T00:00:00Z'}}
  - {{type: Initialized, status: 'True', reason: Initialized, message: '', lastTransitionTime: '2025-12-01T00:00:00Z'}}
"
        )
        .expect("write to a String");
        for j in 0..PODS_PER_NODE {
            let app = (i * PODS_PER_NODE + j) % 200;
            write!(
                y,
                "---
apiVersion: v1
kind: Pod
metadata:
  name: app-{i:04}-{j:02}
  namespace: bench
  labels: {{app: app-{app}, tier: web}}
spec:
  nodeName: bench-{i:04}
  containers:
  - name: app
    image: registry.example/app:1
    resources: {{requests: {{cpu: 500m, memory: 1Gi}}, limits: {{memory: 1Gi}}}}
status: {{phase: Running, startTime: '2025-12-01T00:00:00Z'}}
"
            )
            .expect("write to a String");
        }
    }
    y
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let nodes = if full { 500 } else { 20 };
    let catalog = Catalog::builtin().expect("built-in catalog");
    let types = |s: &NodeSettings| {
        let mut o = CatalogOptions::for_region("eastus");
        o.node = s.clone();
        catalog
            .instance_types(&o)
            .map(Into::into)
            .map_err(|e| e.to_string())
    };
    let yaml = cluster_yaml(nodes);
    let snapshot = Snapshot::from_yaml("bench.yaml", &yaml).expect("bench cluster parses");
    drop(yaml);
    let pods = snapshot.pods.len();

    let baseline = mark();
    let cluster = Cluster::from_snapshot(&snapshot, &types, NOW).expect("cluster builds");
    let model = LIVE.load(Ordering::Relaxed) - baseline;
    let build_peak = PEAK.load(Ordering::Relaxed) - baseline;

    let before = mark();
    let settings = Settings {
        all: false,
        ..Settings::default()
    };
    let started = std::time::Instant::now();
    let report = disruption::evaluate(&cluster, &settings);
    let took = started.elapsed();
    let eval_peak = PEAK.load(Ordering::Relaxed) - before;
    assert!(
        !report.decisions.is_empty() || !report.blocked.is_empty(),
        "the pass must weigh the nodes"
    );

    println!(
        "disruption pass over {nodes} managed nodes and {pods} pods ({} decision(s), {:.2} s)",
        report.decisions.len(),
        took.as_secs_f64()
    );
    println!("  snapshot (baseline)       {:>8.1} MiB", mib(baseline));
    println!(
        "  cluster model             {:>8.1} MiB  ({:.2}x baseline; {:.1} MiB peak while built)",
        mib(model),
        model as f64 / baseline as f64,
        mib(build_peak)
    );
    println!(
        "  evaluation peak above it  {:>8.1} MiB  ({:.2}x baseline)",
        mib(eval_peak),
        eval_peak as f64 / baseline as f64
    );

    // The summary the agent evaluates every 30 s besides: every decision of the pass
    // (savings available, blocked nodes, recommend-only reports), against the deciding
    // pass above (the first decision only) that it runs every 5 s.
    let before = mark();
    let started = std::time::Instant::now();
    let summary = disruption::evaluate(&cluster, &Settings::default());
    let summary_took = started.elapsed();
    let summary_peak = PEAK.load(Ordering::Relaxed) - before;
    assert!(
        summary.decisions.len() >= report.decisions.len(),
        "the summary weighs every decision the deciding pass does"
    );
    let ratio = summary_took.as_secs_f64() / took.as_secs_f64().max(1e-9);
    // Per 30 s: six passes, one of which evaluates the summary instead of deciding: one
    // evaluation of every decision, two when pools of both modes have nodes.
    let share = |evaluations: f64| evaluations * ratio / (5.0 + evaluations * ratio);
    println!(
        "  summary pass (every decision, {} of them): {:.2} s, {:.2}x the deciding pass; \
         peak {:.1} MiB above the snapshot ({:.2}x baseline)",
        summary.decisions.len(),
        summary_took.as_secs_f64(),
        ratio,
        mib(summary_peak),
        summary_peak as f64 / baseline as f64
    );
    println!(
        "  evaluation time spent on summaries: {:.0}% with one mode's pools, {:.0}% with both",
        100.0 * share(1.0),
        100.0 * share(2.0)
    );
}
