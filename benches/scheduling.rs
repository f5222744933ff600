//! Scheduling benchmarks, as a program: `cargo bench --bench scheduling`.
//!
//! 1. Throughput on Karpenter's scheduling benchmark mix, single-threaded, N = 1k, 5k, 20k.
//! 2. Cost quality on the "Basic" mix of Karpenter's scale test, against the exact optimum
//!    and a Karpenter-style greedy baseline run in the same process.
//! 3. Peak memory (VmHWM) of the 20k-pod run.
//! 4. Consolidation: the Basic mix provisioned, both Deployments scaled down to 350, and
//!    disruption run to a steady state, against the exact optimum for 350 + 350.
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it does a small smoke run.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Affinity, TopologySpreadConstraint};
use tailor::catalog::{Catalog, CatalogOptions};
use tailor::model::{InstanceType, Requirement, Requirements};
use tailor::scheduling::{self, Input, Options, PodInfo, input::default_pool};

/// Basic mix optimum over the candidate sizes (eastus list prices), from the issue.
const BASIC_OPTIMUM: f64 = 102.72;

/// Optimum for 350 + 350 pods of the Basic mix over the same candidate sizes.
const SCALED_DOWN_OPTIMUM: f64 = 71.96;

#[path = "common/mix.rs"]
mod mix;

/// A pending pod of the mix, as the scheduler reads it.
fn pod(
    name: &str,
    cpu: &str,
    memory: &str,
    labels: BTreeMap<String, String>,
    affinity: Option<Affinity>,
    spread: Vec<TopologySpreadConstraint>,
) -> PodInfo {
    PodInfo::from_pod(&mix::pod(name, cpu, memory, labels, affinity, spread))
        .expect("generated pods are valid")
}

/// Karpenter's benchmark mix (see `common/mix.rs`), as the scheduler reads it.
fn diverse_pods(n: usize, seed: u64) -> Vec<PodInfo> {
    mix::diverse_pods(n, seed)
        .iter()
        .map(|p| PodInfo::from_pod(p).expect("generated pods are valid"))
        .collect()
}

fn shared_catalog() -> Catalog {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data/azure");
    Catalog::load_dir(&dir).expect("../shared/data/azure is readable")
}

fn all_pools(types: Vec<InstanceType>) -> Input {
    let mut pool = default_pool(&types.clone().into());
    // Both capacity types, as the throughput benchmark's catalog has.
    pool.requirements =
        Requirements::new().with(Requirement::one_of("tailor.sh/nodepool", ["default"]));
    pool.instance_types = types.into();
    Input {
        pools: vec![pool],
        ..Input::default()
    }
}

fn vm_hwm_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn throughput(
    types: &[InstanceType],
    sizes: &[usize],
    repeats: usize,
) -> Vec<(usize, f64, usize, f64)> {
    let mut rows = Vec::new();
    for &n in sizes {
        let mut input = all_pools(types.to_vec());
        input.pending = diverse_pods(n, 42);
        let mut best = f64::INFINITY;
        let mut plan = None;
        for _ in 0..repeats {
            let start = Instant::now();
            let p = scheduling::schedule(&input, &Options::default());
            best = best.min(start.elapsed().as_secs_f64());
            plan = Some(p);
        }
        let plan = plan.expect("ran at least once");
        assert_eq!(plan.summary.unschedulable, 0, "every benchmark pod lands");
        rows.push((n, best, plan.summary.new_nodes, plan.summary.hourly_cost));
    }
    rows
}

fn basic_mix(types: Vec<InstanceType>, small: usize, large: usize) -> Input {
    let family = Requirement::new("tailor.sh/sku-family", "In", &["D", "E", "F"]).expect("valid");
    let version = Requirement::new("tailor.sh/sku-version", "In", &["5", "6"]).expect("valid");
    let od = Requirement::one_of("tailor.sh/capacity-type", ["on-demand"]);
    let mut pool = default_pool(&Default::default());
    pool.requirements = pool.requirements.with(family).with(version).with(od);
    pool.instance_types = types
        .into_iter()
        .filter(|t| pool.requirements.intersects(&t.requirements).is_ok())
        .collect();
    let mut pending = Vec::new();
    for i in 0..small {
        pending.push(pod(
            &format!("small-{i}"),
            "900m",
            "3100Mi",
            BTreeMap::from([("app".into(), "small".into())]),
            None,
            vec![],
        ));
    }
    for i in 0..large {
        pending.push(pod(
            &format!("large-{i}"),
            "3500m",
            "28Gi",
            BTreeMap::from([("app".into(), "large".into())]),
            None,
            vec![],
        ));
    }
    Input {
        pending,
        pools: vec![pool],
        ..Input::default()
    }
}

/// The child process of the memory measurement: one run, then the peak resident set.
fn memory_run(n: usize) {
    let catalog = shared_catalog();
    let types = catalog
        .instance_types(&CatalogOptions::for_region("eastus"))
        .expect("eastus is priced");
    let mut input = all_pools(types);
    input.pending = diverse_pods(n, 42);
    let before = vm_hwm_kib();
    let plan = scheduling::schedule(&input, &Options::default());
    let after = vm_hwm_kib();
    println!(
        "== memory: peak RSS of a process that loads the catalog and plans {n} pods: {} MiB (before planning: {} MiB); {} nodes ==",
        after.map_or("?".into(), |k| format!("{:.1}", k as f64 / 1024.0)),
        before.map_or("?".into(), |k| format!("{:.1}", k as f64 / 1024.0)),
        plan.summary.new_nodes
    );
}

fn main() {
    if let Some(n) = std::env::var("TAILOR_BENCH_MEMORY_RUN")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        memory_run(n);
        return;
    }
    let full = std::env::args().any(|a| a == "--bench");
    let catalog = shared_catalog();
    let mut options = CatalogOptions::for_region("eastus");
    let types = catalog.instance_types(&options).expect("eastus is priced");
    println!(
        "catalog: {} eastus instance types (on-demand + estimated spot offerings)",
        types.len()
    );

    // 1. Throughput.
    let sizes: &[usize] = if full { &[1000, 5000, 20000] } else { &[200] };
    let repeats = if full { 3 } else { 1 };
    println!("\n== throughput: Karpenter's benchmark mix, single-threaded (best of {repeats}) ==");
    println!(
        "{:>7}  {:>9}  {:>11}  {:>6}  {:>9}",
        "pods", "seconds", "pods/s", "nodes", "$/hour"
    );
    for (n, secs, nodes, cost) in throughput(&types, sizes, repeats) {
        println!(
            "{n:>7}  {secs:>9.3}  {:>11.0}  {nodes:>6}  {cost:>9.2}",
            n as f64 / secs
        );
        if n == 20000 {
            println!(
                "target: <= 0.5 s for 20k pods (Karpenter published: 20.2 s on 400 types); ratio to target {:.2}",
                secs / 0.5
            );
        }
    }

    // 3. Peak memory of the largest run, measured in a child process that does only that.
    let largest = *sizes.last().unwrap_or(&200);
    match std::env::current_exe().and_then(|exe| {
        std::process::Command::new(exe)
            .env("TAILOR_BENCH_MEMORY_RUN", largest.to_string())
            .output()
    }) {
        Ok(out) => print!("\n{}", String::from_utf8_lossy(&out.stdout)),
        Err(e) => println!("\nmemory run failed: {e}"),
    }

    // 2. Cost quality.
    options.include_spot = false;
    let od_types = catalog.instance_types(&options).expect("eastus is priced");
    let (small, large) = if full { (500, 500) } else { (50, 50) };
    let input = basic_mix(od_types, small, large);
    println!(
        "\n== cost: Basic mix {small} x (900m, 3100Mi) + {large} x (3500m, 28Gi), {} candidate sizes ==",
        input.pools[0].instance_types.len()
    );
    let start = Instant::now();
    let tailored = scheduling::schedule(&input, &Options::default());
    let t_secs = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let greedy = scheduling::schedule(
        &input,
        &Options {
            cost_aware: false,
            ..Options::default()
        },
    );
    let g_secs = start.elapsed().as_secs_f64();
    assert!(
        scheduling::validate(&input, &tailored).is_empty(),
        "tailored plan is valid"
    );
    assert!(
        scheduling::validate(&input, &greedy).is_empty(),
        "greedy plan is valid"
    );
    let mut mix: BTreeMap<String, usize> = BTreeMap::new();
    for c in &tailored.node_claims {
        *mix.entry(c.instance_type.clone()).or_default() += 1;
    }
    println!(
        "tailor:   {:>8.2} $/hour, {:>3} nodes, {:.3} s  {mix:?}",
        tailored.summary.hourly_cost, tailored.summary.new_nodes, t_secs
    );
    println!(
        "greedy:   {:>8.2} $/hour, {:>3} nodes, {:.3} s  (largest-first, grow while anything fits, cheapest type that holds)",
        greedy.summary.hourly_cost, greedy.summary.new_nodes, g_secs
    );
    consolidation(&input, &tailored, if full { 350 } else { 35 }, full);
    if full {
        println!(
            "optimum:  {BASIC_OPTIMUM:>8.2} $/hour;  tailor/optimum = {:.4} (target <= 1.02);  greedy/optimum = {:.4};  tailor/greedy = {:.4}",
            tailored.summary.hourly_cost / BASIC_OPTIMUM,
            greedy.summary.hourly_cost / BASIC_OPTIMUM,
            tailored.summary.hourly_cost / greedy.summary.hourly_cost
        );
    } else {
        println!(
            "tailor/greedy = {:.4}",
            tailored.summary.hourly_cost / greedy.summary.hourly_cost
        );
    }
}

/// The provisioned Basic mix as existing nodes, keeping `keep` pods of each Deployment
/// (the highest ordinals go, as a scale-down would take them), then disruption run to a
/// steady state.
fn consolidation(input: &Input, plan: &scheduling::Plan, keep: usize, full: bool) {
    use tailor::disruption::{self, Cluster, NodeMeta, Settings};
    let pool = &input.pools[0];
    let pods: BTreeMap<&str, &PodInfo> =
        input.pending.iter().map(|p| (p.key.as_str(), p)).collect();
    let kept = |key: &str| {
        key.rsplit('-')
            .next()
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|n| n < keep)
    };
    let mut nodes = Vec::new();
    let mut meta = Vec::new();
    for c in &plan.node_claims {
        let Some(t) = pool
            .instance_types
            .iter()
            .find(|t| t.name == c.instance_type)
        else {
            continue;
        };
        let mut labels = c.labels.clone();
        labels.insert("kubernetes.io/hostname".into(), c.name.clone());
        nodes.push(scheduling::ExistingNode {
            derived: Default::default(),
            name: c.name.clone(),
            labels,
            taints: Vec::new(),
            allocatable: t.allocatable.clone(),
            pods: c
                .pods
                .iter()
                .filter(|k| kept(k))
                .filter_map(|k| pods.get(k.as_str()))
                .map(|p| {
                    std::sync::Arc::new(PodInfo {
                        node_name: Some(c.name.clone()),
                        ..(*p).clone()
                    })
                })
                .collect(),
            unschedulable: false,
        });
        meta.push(NodeMeta {
            pool: Some(c.node_pool.clone()),
            instance_type: c.instance_type.clone(),
            zone: c.zone.clone(),
            capacity_type: c.capacity_type,
            price_per_hour: Some(c.price_per_hour),
            ..NodeMeta::default()
        });
    }
    let cluster = Cluster {
        input: Input {
            pending: Vec::new(),
            nodes,
            pools: input.pools.clone(),
            daemon_sets: Vec::new(),
        },
        nodes: meta,
        do_not_disrupt: Default::default(),
        pdbs: Vec::new(),
        rules: BTreeMap::new(),
        now: 0,
        expected: BTreeMap::new(),
        falling: BTreeMap::new(),
        unreadable: BTreeMap::new(),
        held: Default::default(),
    };
    let start = Instant::now();
    let report = disruption::evaluate(&cluster, &Settings::default());
    let secs = start.elapsed().as_secs_f64();
    let mut methods: BTreeMap<String, usize> = BTreeMap::new();
    for d in &report.decisions {
        *methods.entry(format!("{:?}", d.method)).or_default() += 1;
    }
    let s = &report.summary;
    println!(
        "\n== consolidation: scaled down to {keep} + {keep}, disruption to a steady state ==\n\
         before: {:.2} $/hour on {} nodes; after: {:.2} $/hour on {} nodes; {} decisions {methods:?}; {} pods evicted; {secs:.3} s",
        s.hourly_cost_before,
        s.nodes_before,
        s.hourly_cost_after,
        s.nodes_after,
        report.decisions.len(),
        s.evictions
    );
    if full {
        println!(
            "optimum:  {SCALED_DOWN_OPTIMUM:>8.2} $/hour; after/optimum = {:.4} (target <= 1.05, <= {:.2} $/hour)",
            s.hourly_cost_after / SCALED_DOWN_OPTIMUM,
            SCALED_DOWN_OPTIMUM * 1.05
        );
    }
}
