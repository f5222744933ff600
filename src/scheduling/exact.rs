//! Exact minimum-cost packing for small inputs.
//!
//! The cost-efficiency packer is within a fraction of a percent of the optimum on large
//! uniform workloads, but on a small mixed cluster (twenty pods split between arm64-only,
//! amd64-only and unconstrained) one badly filled node is a large share of the bill, and
//! packing each requirement group on its own never lets an unconstrained pod fill an
//! arm64 node's spare room. Below a few dozen pods the exact optimum is affordable:
//!
//! a dynamic programme over the vector of pods left per class (identical requests and
//! requirement group), where each step buys one node holding a sub-vector that includes
//! a pod of the first class left (so each packing is counted once), priced at the
//! cheapest type compatible with every group on it. A state's index is mixed-radix in the
//! class counts, so the state left after a step is a subtraction of indices.

use super::packing::BinType;
use super::scheduler::{R, ResV, fits};

/// Pods with identical requests from one requirement group.
#[derive(Debug, Clone, PartialEq)]
pub struct MixedClass {
    /// Requests of one pod.
    pub req: ResV,
    /// How many.
    pub count: usize,
    /// The requirement group (pods of different groups share a node only where a type
    /// is compatible with both); below 64.
    pub group: usize,
}

/// One node of an exact packing.
#[derive(Debug, Clone, PartialEq)]
pub struct MixedBin {
    /// The groups on it, as a bit mask.
    pub groups: u64,
    /// Index into the types offered for `groups`.
    pub bin_type: usize,
    /// Its price.
    pub price: f64,
    /// Pods per class.
    pub counts: Vec<usize>,
}

/// Most states (count vectors) the search may have.
pub const MAX_STATES: usize = 20_000;
/// Most node candidates (state, sub-vector that fits a node) the search may try before it
/// gives up and leaves the input to the cost-efficiency packer. Disruption runs the
/// scheduler for every candidate it weighs, so this stays at a few milliseconds of work in
/// an optimised build.
pub const MAX_STEPS: usize = 500_000;

/// How many states the search over these class counts has, or `None` beyond `limit`.
pub fn states(classes: &[MixedClass], limit: usize) -> Option<usize> {
    let mut total: usize = 1;
    for c in classes {
        total = total.checked_mul(c.count + 1)?;
        if total > limit {
            return None;
        }
    }
    Some(total)
}

/// The minimum-cost packing of every pod of `classes` onto nodes. `types_for(groups)`
/// gives the types a node holding pods of those groups may be, each with its room and
/// price; a bin's `bin_type` indexes that list. Returns `None` when there would be more
/// than `max_states` states or `max_steps` node candidates, there are 64 groups or more,
/// or some pod fits no type.
pub fn pack_exact(
    classes: &[MixedClass],
    types_for: &mut dyn FnMut(u64) -> Vec<BinType>,
    max_states: usize,
    max_steps: usize,
) -> Option<Vec<MixedBin>> {
    if classes.iter().any(|c| c.group >= 64) {
        return None;
    }
    states(classes, max_states)?;
    let k = classes.len();
    // Mixed-radix place values: index = sum(count_i * place_i).
    let mut place = vec![1usize; k];
    for i in 1..k {
        place[i] = place[i - 1] * (classes[i - 1].count + 1);
    }
    let states = place.last().map_or(1, |p| p * (classes[k - 1].count + 1));
    let decode = |mut idx: usize| -> Vec<usize> {
        (0..k)
            .map(|i| {
                let d = idx % (classes[i].count + 1);
                idx /= classes[i].count + 1;
                d
            })
            .collect()
    };
    // Types per group mask, with their indices cheapest first and the largest room per
    // dimension.
    let mut by_mask: std::collections::HashMap<u64, (Vec<BinType>, Vec<usize>, ResV)> =
        std::collections::HashMap::new();
    // One node's price and type for every sub-vector (infinite when none holds it).
    let mut price = vec![f64::INFINITY; states];
    let mut chosen = vec![usize::MAX; states];
    for (idx, (p, t)) in price.iter_mut().zip(chosen.iter_mut()).enumerate().skip(1) {
        let counts = decode(idx);
        let mut need = [0i64; R];
        let mut mask = 0u64;
        for (c, &n) in counts.iter().enumerate() {
            if n > 0 {
                mask |= 1 << classes[c].group;
                for (total, r) in need.iter_mut().zip(&classes[c].req) {
                    *total = total.saturating_add(r.saturating_mul(n as i64));
                }
            }
        }
        let (types, order, largest) = by_mask.entry(mask).or_insert_with(|| {
            let types = types_for(mask);
            let mut order: Vec<usize> = (0..types.len()).collect();
            order.sort_by(|&a, &b| types[a].price.total_cmp(&types[b].price).then(a.cmp(&b)));
            let mut largest = [0i64; R];
            for ty in &types {
                for (l, a) in largest.iter_mut().zip(&ty.alloc) {
                    *l = (*l).max(*a);
                }
            }
            (types, order, largest)
        });
        if !fits(&need, largest) {
            continue;
        }
        if let Some(&i) = order.iter().find(|&&i| fits(&need, &types[i].alloc)) {
            *p = types[i].price;
            *t = i;
        }
    }
    // best[s]: cheapest packing of state s; step[s]: the node bought first.
    let mut best = vec![f64::INFINITY; states];
    let mut step = vec![0usize; states];
    best[0] = 0.0;
    // A node's price only grows with what it holds (more pods need more room, more groups
    // admit fewer types), so once a sub-vector fits no node, every larger one is skipped.
    let mut steps = 0usize;
    for s in 1..states {
        let rem = decode(s);
        let first = rem.iter().position(|&n| n > 0)?;
        let low = |i: usize| usize::from(i == first);
        // Sub-vectors of `rem` with v[first] >= 1, in odometer order from `first` up.
        let mut v = vec![0usize; k];
        v[first] = 1;
        let mut vi = place[first];
        loop {
            let p = price[vi];
            let fits_a_node = p.is_finite();
            if fits_a_node {
                steps += 1;
                if steps > max_steps {
                    return None;
                }
                let total = p + best[s - vi];
                if total < best[s] - 1e-12 {
                    best[s] = total;
                    step[s] = vi;
                }
            }
            let mut i = first;
            if !fits_a_node {
                // Skip every sub-vector at least as large: reset the lowest raised digit
                // and carry into the next.
                while i < k && v[i] == low(i) {
                    i += 1;
                }
                if i == k {
                    break;
                }
                vi -= (v[i] - low(i)) * place[i];
                v[i] = low(i);
                i += 1;
            }
            let advanced = loop {
                if i == k {
                    break false;
                }
                if v[i] < rem[i] {
                    v[i] += 1;
                    vi += place[i];
                    break true;
                }
                vi -= (v[i] - low(i)) * place[i];
                v[i] = low(i);
                i += 1;
            };
            if !advanced {
                break;
            }
        }
    }
    let full = states - 1;
    if !best[full].is_finite() {
        return None;
    }
    let mut bins = Vec::new();
    let mut s = full;
    while s > 0 {
        let vi = step[s];
        let counts = decode(vi);
        let groups = counts
            .iter()
            .zip(classes)
            .filter(|(n, _)| **n > 0)
            .fold(0u64, |m, (_, c)| m | 1 << c.group);
        bins.push(MixedBin {
            groups,
            bin_type: chosen[vi],
            price: price[vi],
            counts,
        });
        s -= vi;
    }
    Some(bins)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(cpu: i64, mem_gib: i64) -> ResV {
        let mut v = [0; R];
        v[0] = cpu;
        v[1] = mem_gib << 30;
        v[3] = 1;
        v
    }

    fn bin(cpu: i64, mem_gib: i64, price: f64) -> BinType {
        let mut alloc = res(cpu, mem_gib);
        alloc[3] = 110;
        BinType { alloc, price }
    }

    /// Group 0 runs only on "arm" types, group 1 only on "amd" types, group 2 anywhere.
    fn arch_types(mask: u64) -> Vec<BinType> {
        let arm = vec![bin(2000, 8, 0.07), bin(4000, 16, 0.14)];
        let amd = vec![bin(2000, 8, 0.09), bin(4000, 16, 0.18)];
        match (mask & 1 != 0, mask & 2 != 0) {
            (true, true) => Vec::new(),
            (true, false) => arm,
            (false, true) => amd,
            (false, false) => arm.into_iter().chain(amd).collect(),
        }
    }

    fn cost(bins: &[MixedBin]) -> f64 {
        bins.iter().map(|b| b.price).sum()
    }

    #[test]
    fn unconstrained_pods_fill_the_room_left_on_constrained_nodes() {
        // A 1-core amd pod and a 1-core free pod. Packed per group they buy a 2-core amd
        // node and a 2-core arm node (0.09 + 0.07); together they share the amd node.
        let classes = vec![
            MixedClass {
                req: res(1000, 2),
                count: 1,
                group: 1,
            },
            MixedClass {
                req: res(1000, 2),
                count: 1,
                group: 2,
            },
        ];
        let bins = pack_exact(&classes, &mut arch_types, MAX_STATES, MAX_STEPS).expect("fits");
        assert!((cost(&bins) - 0.09).abs() < 1e-9, "{bins:?}");
        assert_eq!(bins.len(), 1);
        assert_eq!(bins[0].groups, 0b110);
        assert_eq!(bins[0].counts, [1, 1]);
    }

    #[test]
    fn groups_that_exclude_each_other_never_share_a_node() {
        let classes = vec![
            MixedClass {
                req: res(500, 1),
                count: 2,
                group: 0,
            },
            MixedClass {
                req: res(500, 1),
                count: 2,
                group: 1,
            },
        ];
        let bins = pack_exact(&classes, &mut arch_types, MAX_STATES, MAX_STEPS).expect("fits");
        assert!(
            bins.iter().all(|b| b.groups == 1 || b.groups == 2),
            "{bins:?}"
        );
        assert!((cost(&bins) - 0.16).abs() < 1e-9, "{bins:?}");
    }

    #[test]
    fn the_search_matches_brute_force_on_every_split_of_a_few_pods() {
        // Every way to put five pods of three classes on nodes, enumerated directly.
        let classes = vec![
            MixedClass {
                req: res(1200, 3),
                count: 2,
                group: 0,
            },
            MixedClass {
                req: res(700, 5),
                count: 2,
                group: 2,
            },
            MixedClass {
                req: res(1800, 1),
                count: 1,
                group: 1,
            },
        ];
        let pods: Vec<usize> = classes
            .iter()
            .enumerate()
            .flat_map(|(c, cl)| std::iter::repeat_n(c, cl.count))
            .collect();
        // Assign pod i to node a[i] (restricted growth strings enumerate set partitions).
        fn partitions(n: usize, a: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
            if a.len() == n {
                out.push(a.clone());
                return;
            }
            let next = a.iter().max().map_or(0, |m| m + 1);
            for b in 0..=next {
                a.push(b);
                partitions(n, a, out);
                a.pop();
            }
        }
        let mut all = Vec::new();
        partitions(pods.len(), &mut Vec::new(), &mut all);
        let mut brute = f64::INFINITY;
        for a in &all {
            let nodes = a.iter().max().map_or(0, |m| m + 1);
            let mut total = 0.0;
            for node in 0..nodes {
                let mut need = [0i64; R];
                let mut mask = 0u64;
                for (i, &c) in pods.iter().enumerate() {
                    if a[i] == node {
                        mask |= 1 << classes[c].group;
                        need = std::array::from_fn(|d| need[d] + classes[c].req[d]);
                    }
                }
                total += arch_types(mask)
                    .iter()
                    .filter(|t| fits(&need, &t.alloc))
                    .map(|t| t.price)
                    .fold(f64::INFINITY, f64::min);
            }
            brute = brute.min(total);
        }
        let bins = pack_exact(&classes, &mut arch_types, MAX_STATES, MAX_STEPS).expect("fits");
        assert!(
            (cost(&bins) - brute).abs() < 1e-9,
            "{} vs {brute}",
            cost(&bins)
        );
    }

    #[test]
    fn too_much_work_or_a_pod_that_fits_nothing_gives_no_packing() {
        let big = vec![MixedClass {
            req: res(100, 1),
            count: 10,
            group: 2,
        }];
        assert!(pack_exact(&big, &mut arch_types, 10, MAX_STEPS).is_none());
        assert!(pack_exact(&big, &mut arch_types, MAX_STATES, 5).is_none());
        assert!(pack_exact(&big, &mut arch_types, MAX_STATES, MAX_STEPS).is_some());
        let huge = vec![MixedClass {
            req: res(64_000, 1),
            count: 1,
            group: 2,
        }];
        assert!(pack_exact(&huge, &mut arch_types, MAX_STATES, MAX_STEPS).is_none());
    }
}
