//! Small mixed clusters (about twenty pods split between arm64-only, amd64-only and
//! unconstrained Deployments) are packed within 5% of the exact minimum-cost packing.
//!
//! The optimum is computed here, independently of the scheduler: an exhaustive dynamic
//! programme over how many pods of each Deployment are left, where each step buys the
//! node holding some of them (always at least one pod of the first Deployment left, so
//! every packing is counted once) at the price of the cheapest catalog size of a
//! compatible architecture that holds them. The scheduler must match it through its whole
//! pipeline (placement, packing, validation).
//!
//! Cases are generated from seeds. The tuning seeds were looked at while the packer was
//! improved; the held-out seeds were not, and report the same bound on unseen clusters.

mod support;

use std::collections::HashMap;

use tailor::apis::labels;
use tailor::catalog::{Catalog, CatalogOptions};
use tailor::model::CapacityType;
use tailor::scheduling::{self, Options, validate};

/// Seeds looked at while tuning the packer.
const TUNING: std::ops::RangeInclusive<u64> = 1..=20;
/// Seeds kept out of tuning.
const HELD_OUT: std::ops::RangeInclusive<u64> = 1001..=1020;
/// The bound the issue sets for small clusters.
const BOUND: f64 = 1.05;

/// xorshift64*: a deterministic generator, so every case can be replayed from its seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One Deployment of a generated cluster.
#[derive(Debug, Clone)]
struct Deployment {
    arch: Option<&'static str>,
    cpu_milli: i64,
    memory_mib: i64,
    replicas: usize,
}

/// 3-5 Deployments of 16-24 pods in all, each arm64-only, amd64-only or unconstrained,
/// with requests from a menu of common sizes.
fn cluster(seed: u64) -> Vec<Deployment> {
    let mut rng = Rng::new(seed);
    let cpus = [250, 500, 1000, 1500, 2000, 3000];
    let memories = [512, 1024, 2048, 3072, 4096, 6144, 8192];
    let archs = [Some("arm64"), Some("amd64"), None];
    loop {
        let kinds = 3 + rng.below(3) as usize;
        let total = 16 + rng.below(9) as usize;
        let mut out = Vec::new();
        let mut left = total;
        for k in 0..kinds {
            let replicas = if k + 1 == kinds {
                left
            } else {
                let share = left / (kinds - k);
                (share / 2 + rng.below(share as u64 + 1) as usize).clamp(1, left - (kinds - k - 1))
            };
            left -= replicas;
            out.push(Deployment {
                // The first three cover every architecture constraint.
                arch: archs[if k < 3 { k } else { rng.below(3) as usize }],
                cpu_milli: cpus[rng.below(cpus.len() as u64) as usize],
                memory_mib: memories[rng.below(memories.len() as u64) as usize],
                replicas,
            });
        }
        // Keep the exhaustive search small: sub-vectors of the count vector.
        let work: usize = out
            .iter()
            .map(|d| (d.replicas + 1) * (d.replicas + 2) / 2)
            .product();
        if work <= 3_000_000 {
            return out;
        }
    }
}

fn yaml(deployments: &[Deployment]) -> String {
    let mut out = String::new();
    for (i, d) in deployments.iter().enumerate() {
        let selector = d
            .arch
            .map(|a| format!("      nodeSelector: {{kubernetes.io/arch: {a}}}\n"))
            .unwrap_or_default();
        out.push_str(&format!(
            "---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: d{i}, namespace: default}}
spec:
  replicas: {}
  selector: {{matchLabels: {{app: d{i}}}}}
  template:
    metadata: {{labels: {{app: d{i}}}}}
    spec:
{selector}      containers:
      - name: c
        image: i
        resources: {{requests: {{cpu: {}m, memory: {}Mi}}}}
",
            d.replicas, d.cpu_milli, d.memory_mib
        ));
    }
    out
}

/// A size as the optimum sees it: architecture, room for pods and on-demand price.
struct Size {
    arch: String,
    cpu_milli: i64,
    memory: i64,
    pods: i64,
    price: f64,
}

fn sizes() -> Vec<Size> {
    let catalog = Catalog::builtin().expect("built-in catalog");
    let types = catalog
        .instance_types(&CatalogOptions::for_region("eastus"))
        .expect("eastus types");
    let mut out: Vec<Size> = types
        .iter()
        .filter_map(|t| {
            let price = t
                .offerings
                .iter()
                .filter(|o| o.capacity_type == CapacityType::OnDemand && o.available)
                .map(|o| o.price_per_hour)
                .reduce(f64::min)?;
            Some(Size {
                arch: t.labels().get(labels::ARCH)?.clone(),
                cpu_milli: t.allocatable.cpu,
                memory: t.allocatable.memory,
                pods: t.allocatable.pods,
                price,
            })
        })
        .collect();
    out.sort_by(|a, b| a.price.total_cmp(&b.price));
    out
}

/// The exact minimum cost of packing `deployments` onto new nodes of `sizes`.
fn optimum(deployments: &[Deployment], sizes: &[Size]) -> f64 {
    let counts: Vec<usize> = deployments.iter().map(|d| d.replicas).collect();
    // Price of one node holding `v` pods of each Deployment (infinite when none does).
    let price = |v: &[usize]| -> f64 {
        let mut cpu = 0;
        let mut memory = 0;
        let mut pods = 0;
        let mut arch: Option<&str> = None;
        for (d, &n) in deployments.iter().zip(v) {
            if n == 0 {
                continue;
            }
            cpu += d.cpu_milli * n as i64;
            memory += d.memory_mib * (1 << 20) * n as i64;
            pods += n as i64;
            if let Some(a) = d.arch {
                if arch.is_some_and(|b| b != a) {
                    return f64::INFINITY;
                }
                arch = Some(a);
            }
        }
        sizes
            .iter()
            .find(|s| {
                arch.is_none_or(|a| s.arch == a)
                    && s.cpu_milli >= cpu
                    && s.memory >= memory
                    && s.pods >= pods
            })
            .map_or(f64::INFINITY, |s| s.price)
    };
    let mut prices: HashMap<Vec<usize>, f64> = HashMap::new();
    let mut best: HashMap<Vec<usize>, f64> = HashMap::new();
    fn solve(
        rem: &[usize],
        counts_price: &mut dyn FnMut(&[usize]) -> f64,
        best: &mut HashMap<Vec<usize>, f64>,
    ) -> f64 {
        let Some(first) = rem.iter().position(|&n| n > 0) else {
            return 0.0;
        };
        if let Some(&b) = best.get(rem) {
            return b;
        }
        let mut result = f64::INFINITY;
        // Every sub-vector with at least one pod of the first Deployment left.
        let mut v = vec![0; rem.len()];
        v[first] = 1;
        loop {
            let p = counts_price(&v);
            if p.is_finite() {
                let rest: Vec<usize> = rem.iter().zip(&v).map(|(r, x)| r - x).collect();
                result = result.min(p + solve(&rest, counts_price, best));
            }
            // Next sub-vector in odometer order.
            let mut i = first;
            loop {
                if i == rem.len() {
                    best.insert(rem.to_vec(), result);
                    return result;
                }
                let low = usize::from(i == first);
                if v[i] < rem[i] {
                    v[i] += 1;
                    break;
                }
                v[i] = low;
                i += 1;
            }
        }
    }
    let mut cached = |v: &[usize]| -> f64 {
        if let Some(&p) = prices.get(v) {
            return p;
        }
        let p = price(v);
        prices.insert(v.to_vec(), p);
        p
    };
    solve(&counts, &mut cached, &mut best)
}

/// (seed, planned cost, optimum, ratio) per case.
fn ratios(seeds: std::ops::RangeInclusive<u64>, sizes: &[Size]) -> Vec<(u64, f64, f64, f64)> {
    seeds
        .map(|seed| {
            let deployments = cluster(seed);
            let input = support::input_from_yaml(&yaml(&deployments));
            let plan = scheduling::schedule(&input, &Options::default());
            let errors = validate(&input, &plan);
            assert!(errors.is_empty(), "seed {seed}: {errors:#?}");
            let pods: usize = deployments.iter().map(|d| d.replicas).sum();
            assert_eq!(
                plan.summary.scheduled_on_new, pods,
                "seed {seed}: {plan:#?}"
            );
            let best = optimum(&deployments, sizes);
            assert!(best.is_finite() && best > 0.0, "seed {seed}");
            let cost = plan.summary.hourly_cost;
            // Never below the optimum: that would mean the optimum here is wrong.
            assert!(
                cost >= best - 1e-6,
                "seed {seed}: plan ${cost} below the optimum ${best}: {deployments:?}"
            );
            (seed, cost, best, cost / best)
        })
        .collect()
}

fn report(name: &str, rows: &[(u64, f64, f64, f64)]) -> (f64, f64) {
    for (seed, cost, best, ratio) in rows {
        println!("{name} seed {seed}: plan ${cost:.4}/h, optimum ${best:.4}/h, {ratio:.4}x");
    }
    let worst = rows.iter().map(|r| r.3).fold(0.0, f64::max);
    let mean = rows.iter().map(|r| r.3).sum::<f64>() / rows.len() as f64;
    println!(
        "{name}: mean {mean:.4}x, worst {worst:.4}x over {} clusters",
        rows.len()
    );
    (mean, worst)
}

#[test]
fn the_optimum_here_prices_a_known_case_exactly() {
    // Two 1-core amd64 pods and two 1-core arm64 pods: one 2-vCPU node per architecture
    // (1900m allocatable holds one 1-core pod, so two nodes each) is beaten by a 4-vCPU
    // node per architecture.
    let sizes = sizes();
    let d = |arch| Deployment {
        arch: Some(arch),
        cpu_milli: 1000,
        memory_mib: 1024,
        replicas: 2,
    };
    let best = optimum(&[d("amd64"), d("arm64")], &sizes);
    let cheapest = |arch: &str, cpu: i64| {
        sizes
            .iter()
            .find(|s| s.arch == arch && s.cpu_milli >= cpu && s.memory >= 2 << 30)
            .map(|s| s.price)
            .expect("a size")
    };
    let expected = (cheapest("amd64", 2000).min(2.0 * cheapest("amd64", 1000)))
        + (cheapest("arm64", 2000).min(2.0 * cheapest("arm64", 1000)));
    assert!((best - expected).abs() < 1e-9, "{best} != {expected}");
}

#[test]
fn small_mixed_clusters_pack_within_five_percent_of_the_exact_optimum() {
    let sizes = sizes();
    let (_, tuned) = report("tuning", &ratios(TUNING, &sizes));
    let (_, held_out) = report("held-out", &ratios(HELD_OUT, &sizes));
    assert!(tuned <= BOUND, "worst tuning ratio {tuned:.4}");
    assert!(held_out <= BOUND, "worst held-out ratio {held_out:.4}");
}
