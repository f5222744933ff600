//! Disruption: which nodes to take away, and what to buy instead, so the cluster costs
//! less without leaving a pod behind. Pure decisions over a [`Cluster`].
//!
//! Methods run in Karpenter's order — expiration (forceful), empty nodes, drift,
//! multi-node consolidation, single-node consolidation — and every consolidation is
//! proven by the scheduling simulator: the displaced pods land on the remaining nodes
//! plus at most one new, cheaper node. Beyond Karpenter, a consolidation must save at
//! least a share of what it replaces and a floor in $/hour, so the cluster does not churn
//! for pennies, and every decision carries its saving and the pods it moves.
//!
//! [`evaluate`] answers "what would be done now"; decisions are applied to a working copy
//! in turn (and counted against budgets), so later decisions see earlier ones.

pub mod cluster;
pub mod controller;
pub mod forecast;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::Serialize;

pub use cluster::{Cluster, ClusterError, NodeMeta};

use crate::apis::{ConsolidationPolicy, DisruptionReason, labels};
use crate::model::CapacityType;
use crate::scheduling::{self, ExistingNode, Input, Options, PodInfo};

/// How a decision disrupts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Nodes with no pods but DaemonSet pods.
    Empty,
    /// Nodes whose NodePool template changed since they were made.
    Drift,
    /// Several nodes removed, or replaced by one cheaper node.
    Multi,
    /// One node removed or replaced by a cheaper one.
    Single,
    /// Nodes older than `expireAfter` (forceful: budgets and do-not-disrupt do not stop it).
    Expiration,
}

impl Method {
    fn reason(self) -> Option<DisruptionReason> {
        match self {
            Method::Empty => Some(DisruptionReason::Empty),
            Method::Drift => Some(DisruptionReason::Drifted),
            Method::Multi | Method::Single => Some(DisruptionReason::Underutilized),
            Method::Expiration => None,
        }
    }
}

/// A node bought to replace disrupted ones.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Replacement {
    /// VM size.
    pub instance_type: String,
    /// Zone.
    pub zone: String,
    /// Spot or on-demand.
    pub capacity_type: CapacityType,
    /// USD per hour.
    pub price_per_hour: f64,
    /// Its NodePool.
    pub node_pool: String,
}

/// One disruption.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// How.
    pub method: Method,
    /// Nodes taken away.
    pub nodes: Vec<String>,
    /// Nodes bought first (launched and ready before the old ones are drained).
    pub replacements: Vec<Replacement>,
    /// USD per hour saved (negative for drift or expiration that costs more).
    pub savings_per_hour: f64,
    /// Pods evicted (`namespace/name`), DaemonSet pods excluded.
    pub pods_moved: Vec<String>,
    /// Why, in words.
    pub reason: String,
}

/// A node that will not be disrupted, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Blocked {
    /// Node name.
    pub node: String,
    /// Why.
    pub reason: String,
}

/// Totals.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// USD per hour of the priced nodes now.
    pub hourly_cost_before: f64,
    /// USD per hour after every decision.
    pub hourly_cost_after: f64,
    /// Nodes now.
    pub nodes_before: usize,
    /// Nodes after every decision.
    pub nodes_after: usize,
    /// Pods evicted by all decisions.
    pub evictions: usize,
}

/// What disruption would do now.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Report {
    /// Decisions, in the order they would be taken.
    pub decisions: Vec<Decision>,
    /// Nodes left alone, with the reason.
    pub blocked: Vec<Blocked>,
    /// Totals.
    pub summary: Summary,
}

/// What a consolidation must save per hour for every pod it evicts, by default. Chosen on
/// the demo's tuning seeds (1-20, 7 days): at $0.004 the autonomous week evicted up to 402
/// pods (target 350; 3 seeds missed), at $0.02 at most 329, at a cost no higher than 0.432x
/// recommend-only's; $0.03 and $0.04 evicted less but cost more. Since right-sizing prices
/// CPU starvation across the fleet (smaller requests for the largest workloads), $0.02
/// evicted up to 365 (2 seeds missed) and $0.025 at most 265, at a median cost of 0.401x
/// recommend-only's against 0.400x.
pub const DEFAULT_MIN_SAVINGS_PER_EVICTION: f64 = 0.025;

/// Tunables beyond the NodePools' own rules.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// A consolidation must save at least this share of the replaced nodes' price.
    pub min_savings_fraction: f64,
    /// ... and at least this many USD per hour.
    pub min_savings_per_hour: f64,
    /// ... plus this many USD per hour for every pod it evicts: an eviction restarts a
    /// pod, loses its caches and may leave it pending, so moving many pods must buy a
    /// saving worth it.
    pub min_savings_per_eviction: f64,
    /// Capacity kept above the requests a NodePool is expected to carry within the
    /// forecast horizon ([`Cluster::expected`]), as a share of them (0.2 = 20%): packing
    /// leaves gaps, so capacity equal to the requests would not hold them.
    pub headroom: f64,
    /// Replacements planned with Tailor's cost-aware packer; off, Karpenter-style greedy
    /// packing.
    pub cost_aware: bool,
    /// Whether a spot node may be replaced by a cheaper spot node.
    pub spot_to_spot: bool,
    /// Spot-to-spot needs at least this many cheaper spot sizes that fit (so the new node
    /// is not the next to be interrupted).
    pub spot_to_spot_min_alternatives: usize,
    /// Most nodes one multi-node consolidation considers.
    pub max_multi_nodes: usize,
    /// A NodePool whose pods are expected to fall by at least this share within
    /// [`SCALE_DOWN_WINDOW`] ([`Cluster::falling`]) is not consolidated by moving pods
    /// meanwhile; its empty nodes are still removed. The workloads' own scale-down is
    /// about to delete pods, and deleting them from the nodes consolidation would empty
    /// first (the pod deletion cost) frees those nodes without an eviction. 0 turns it
    /// off.
    pub wait_for_scale_down: f64,
    /// Apply decisions to a working copy and keep going (`evaluate`'s "everything now");
    /// false stops after the first decision.
    pub all: bool,
}

/// Capacity kept above what a NodePool is expected to carry, as a share of it
/// ([`Settings::headroom`]). Chosen on the demo's tuning seeds: at 0.1, removing capacity
/// down to the forecast bought nodes back within hours (up to 73 node launches a week on
/// one seed, against 63 at 0.2, for a median cost 1.5% higher).
pub const DEFAULT_EXPECTED_HEADROOM: f64 = 0.2;

/// How far ahead consolidation looks for the workloads' own scale-down
/// ([`Settings::wait_for_scale_down`]).
pub const SCALE_DOWN_WINDOW: i64 = 2 * 3600;

/// The expected fall within [`SCALE_DOWN_WINDOW`] past which a pool's consolidation waits
/// for its scale-down ([`Settings::wait_for_scale_down`]).
pub const DEFAULT_WAIT_FOR_SCALE_DOWN: f64 = 0.05;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            min_savings_fraction: 0.05,
            min_savings_per_hour: 0.01,
            min_savings_per_eviction: DEFAULT_MIN_SAVINGS_PER_EVICTION,
            headroom: DEFAULT_EXPECTED_HEADROOM,
            cost_aware: true,
            spot_to_spot: false,
            spot_to_spot_min_alternatives: 15,
            max_multi_nodes: 100,
            wait_for_scale_down: DEFAULT_WAIT_FOR_SCALE_DOWN,
            all: true,
        }
    }
}

impl Settings {
    /// Karpenter's consolidation: any saving at all replaces or removes nodes, whatever
    /// the evictions, with greedy packing. What Tailor is compared with.
    pub fn karpenter() -> Self {
        Settings {
            min_savings_fraction: 0.0,
            // Strictly cheaper, as Karpenter requires of a replacement.
            min_savings_per_hour: 0.0001,
            min_savings_per_eviction: 0.0,
            headroom: 0.0,
            cost_aware: false,
            wait_for_scale_down: 0.0,
            ..Settings::default()
        }
    }
}

/// The working copy a pass decides over.
struct Work<'a> {
    cluster: &'a Cluster,
    settings: &'a Settings,
    nodes: Vec<ExistingNode>,
    meta: Vec<NodeMeta>,
    /// Nodes made by this pass (replacements): not candidates.
    fresh: BTreeSet<String>,
    /// Nodes that received pending pods in this pass.
    chosen: BTreeSet<String>,
    /// Disruptions counted per (pool, reason) against budgets.
    disrupted: BTreeMap<String, usize>,
    /// Pool sizes at the start, for percentage budgets.
    pool_sizes: BTreeMap<String, usize>,
    /// PDB evictions used so far.
    pdb_used: BTreeMap<String, i64>,
    /// Nodes found blocked and why (first reason wins).
    blocked: BTreeMap<String, String>,
    replacements_made: usize,
}

/// A consolidation that passed the simulator.
struct Proven {
    nodes: Vec<usize>,
    plan: scheduling::Plan,
    savings: f64,
}

/// Whether a pod belongs to a DaemonSet (it goes with its node, and is drained last).
pub(crate) fn is_daemon(p: &PodInfo) -> bool {
    p.owner
        .as_deref()
        .is_some_and(|o| o.starts_with("DaemonSet/"))
}

fn movable(n: &ExistingNode) -> impl Iterator<Item = &PodInfo> {
    n.pods.iter().map(|p| &**p).filter(|p| !is_daemon(p))
}

/// What disruption would do at `cluster.now`.
pub fn evaluate(cluster: &Cluster, settings: &Settings) -> Report {
    run(cluster, settings).report
}

/// A report with the cluster it leads to.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The decisions.
    pub report: Report,
    /// The nodes after every decision, with their pods (replacements included).
    pub nodes: Vec<ExistingNode>,
    /// Per node of `nodes`.
    pub meta: Vec<NodeMeta>,
}

/// [`evaluate`], also returning the resulting nodes.
pub fn run(cluster: &Cluster, settings: &Settings) -> Outcome {
    let mut w = Work::new(cluster, settings);
    let before = w.cost();
    let nodes_before = w.nodes.len();
    w.place_pending();
    let mut decisions = Vec::new();
    loop {
        // Reasons are those of the last round: the one that found nothing more to do.
        w.blocked.clear();
        let next = w
            .expiration()
            .or_else(|| w.empty())
            .or_else(|| w.drift())
            .or_else(|| w.multi())
            .or_else(|| w.single());
        match next {
            Some(d) => decisions.push(d),
            None => break,
        }
        if !settings.all {
            break;
        }
    }
    let decided: BTreeSet<&str> = decisions
        .iter()
        .flat_map(|d| d.nodes.iter().map(String::as_str))
        .collect();
    let held: BTreeSet<&str> = w
        .nodes
        .iter()
        .zip(&w.meta)
        .filter(|(_, m)| m.pool.as_ref().is_some_and(|p| cluster.held.contains(p)))
        .map(|(n, _)| n.name.as_str())
        .collect();
    let blocked = w
        .blocked
        .iter()
        .filter(|(n, _)| !decided.contains(n.as_str()) && !held.contains(n.as_str()))
        .map(|(node, reason)| Blocked {
            node: node.clone(),
            reason: reason.clone(),
        })
        .collect();
    let report = Report {
        summary: Summary {
            hourly_cost_before: round4(before),
            hourly_cost_after: round4(w.cost()),
            nodes_before,
            nodes_after: w.nodes.len(),
            evictions: decisions.iter().map(|d| d.pods_moved.len()).sum(),
        },
        decisions,
        blocked,
    };
    Outcome {
        report,
        nodes: w.nodes,
        meta: w.meta,
    }
}

/// Checks a decision again on the cluster as it is now (after the validation delay):
/// the nodes are still there and still unprotected, an empty node is still empty, and a
/// consolidation still places every pod and still saves enough. Returns the plan to carry
/// out now (its replacements may differ from the original decision's).
pub fn revalidate(
    cluster: &Cluster,
    settings: &Settings,
    decision: &Decision,
) -> Result<scheduling::Plan, String> {
    let mut w = Work::new(cluster, settings);
    w.place_pending();
    let mut set = Vec::new();
    for name in &decision.nodes {
        let i = w
            .nodes
            .iter()
            .position(|n| &n.name == name)
            .ok_or_else(|| format!("node {name} is gone"))?;
        if let Some(why) = w.guard(i, decision.method) {
            return Err(format!("node {name}: {why}"));
        }
        set.push(i);
    }
    match decision.method {
        Method::Empty => {
            for &i in &set {
                if let Some(p) = movable(&w.nodes[i]).next() {
                    return Err(format!(
                        "pod {} appeared on node {}",
                        p.key, w.nodes[i].name
                    ));
                }
            }
            let plan = scheduling::Plan::default();
            w.keeps_expected(&set, &plan)?;
            Ok(plan)
        }
        Method::Multi | Method::Single => {
            let proven = w.prove_with(&set, decision.replacements.len().max(1))?;
            if proven.plan.node_claims.len() > decision.replacements.len() {
                return Err("the pods now need a replacement node".to_string());
            }
            Ok(proven.plan)
        }
        Method::Drift => {
            w.pdbs_allow(&set)?;
            w.simulate(&set, usize::MAX)
        }
        Method::Expiration => Ok(w.simulate(&set, usize::MAX).unwrap_or_default()),
    }
}

impl<'a> Work<'a> {
    fn new(cluster: &'a Cluster, settings: &'a Settings) -> Self {
        let mut w = Work {
            cluster,
            settings,
            nodes: cluster.input.nodes.clone(),
            meta: cluster.nodes.clone(),
            fresh: BTreeSet::new(),
            chosen: BTreeSet::new(),
            disrupted: BTreeMap::new(),
            pool_sizes: BTreeMap::new(),
            pdb_used: BTreeMap::new(),
            blocked: BTreeMap::new(),
            replacements_made: 0,
        };
        for m in &w.meta {
            if let Some(p) = &m.pool {
                *w.pool_sizes.entry(p.clone()).or_default() += 1;
            }
        }
        w
    }
}

/// Dollars rounded to 4 decimals, never negative zero: an empty `f64` sum is -0.0 (Rust's
/// `Sum` starts there), and a report must not print "-0.0" for nothing saved.
fn round4(x: f64) -> f64 {
    crate::model::quantity::round_to(x, 4)
}

impl Work<'_> {
    fn cost(&self) -> f64 {
        self.meta.iter().filter_map(|m| m.price_per_hour).sum()
    }

    fn block(&mut self, i: usize, reason: String) {
        self.blocked
            .entry(self.nodes[i].name.clone())
            .or_insert(reason);
    }

    /// Pending pods go first: nodes they land on are not disrupted in this pass.
    fn place_pending(&mut self) {
        if self.cluster.input.pending.is_empty() {
            return;
        }
        let input = Input {
            pending: self.cluster.input.pending.clone(),
            nodes: self.nodes.clone(),
            pools: self.pools(&[]),
            daemon_sets: self.cluster.input.daemon_sets.clone(),
        };
        let plan = scheduling::schedule(
            &input,
            &Options {
                cost_aware: self.settings.cost_aware,
                ..Options::default()
            },
        );
        for e in &plan.existing_nodes {
            self.chosen.insert(e.node.clone());
        }
    }

    /// The pools with what they own now, `without` the given nodes.
    fn pools(&self, without: &[usize]) -> Vec<scheduling::Pool> {
        let mut pools = self.cluster.input.pools.clone();
        pools.retain(|p| !self.cluster.held.contains(&p.name));
        for pool in &mut pools {
            pool.in_use = crate::model::Resources::default();
            pool.nodes_in_use = 0;
            for (i, n) in self.nodes.iter().enumerate() {
                if without.contains(&i) || self.meta[i].pool.as_deref() != Some(&pool.name) {
                    continue;
                }
                pool.nodes_in_use += 1;
                pool.in_use = pool
                    .in_use
                    .checked_add(&n.allocatable)
                    .unwrap_or_else(|_| pool.in_use.clone());
            }
        }
        pools
    }

    /// Budget room left for `pool` and `method` (expiration is not budgeted).
    fn budget_left(&self, pool: &str, method: Method) -> usize {
        let Some(reason) = method.reason() else {
            return usize::MAX;
        };
        let Some(rules) = self.cluster.rules.get(pool) else {
            return usize::MAX;
        };
        let size = self.pool_sizes.get(pool).copied().unwrap_or(0);
        let allowed = rules
            .budgets
            .iter()
            .filter(|(_, reasons)| reasons.is_empty() || reasons.contains(&reason))
            .map(|(nodes, _)| nodes.allowed(size))
            .min()
            .unwrap_or(usize::MAX);
        allowed.saturating_sub(self.disrupted.get(pool).copied().unwrap_or(0))
    }

    /// Why node `i` may not be disrupted by `method`, if it may not.
    fn guard(&self, i: usize, method: Method) -> Option<String> {
        let n = &self.nodes[i];
        let m = &self.meta[i];
        let Some(pool) = m.pool.as_deref() else {
            return Some("not owned by a NodePool".to_string());
        };
        if self.cluster.held.contains(pool) {
            return Some(format!("NodePool {pool} is held by this evaluation"));
        }
        if self.fresh.contains(&n.name) {
            return Some("launched by this pass".to_string());
        }
        // Before expiration too: where such a pod would go cannot be simulated.
        if let Some(e) = n
            .pods
            .iter()
            .find_map(|p| self.cluster.unreadable.get(&p.key))
        {
            return Some(format!(
                "pod {} cannot be read ({}: {}), so where it would go cannot be simulated",
                e.pod, e.field, e.message
            ));
        }
        if method == Method::Expiration {
            return None;
        }
        if m.do_not_disrupt {
            return Some("node is annotated do-not-disrupt".to_string());
        }
        if self.chosen.contains(&n.name) {
            return Some("chosen for pending pods in this pass".to_string());
        }
        if let Some(p) = movable(n).find(|p| self.cluster.do_not_disrupt.contains(&p.key)) {
            return Some(format!("pod {} is annotated do-not-disrupt", p.key));
        }
        for p in movable(n) {
            for pdb in &self.cluster.pdbs {
                if pdb.namespace == p.namespace
                    && pdb.selector.matches(&p.labels)
                    && pdb.allowed - self.pdb_used.get(&pdb.key).copied().unwrap_or(0) <= 0
                {
                    return Some(format!(
                        "PodDisruptionBudget {} allows no eviction of pod {}",
                        pdb.key, p.key
                    ));
                }
            }
        }
        if matches!(method, Method::Empty | Method::Multi | Method::Single) {
            if let Some(until) = m.kept_until.filter(|t| *t > self.cluster.now) {
                return Some(format!(
                    "bought ahead of the growth expected within the next {}s; kept until it comes",
                    until - self.cluster.now
                ));
            }
            let rules = self.cluster.rules.get(pool);
            match rules.map(|r| r.consolidate_after) {
                Some(None) => return Some("consolidateAfter is Never".to_string()),
                Some(Some(after)) => {
                    let since = m.last_pod_event.unwrap_or(i64::MIN / 2);
                    if self.cluster.now - since < after {
                        return Some(format!(
                            "pods changed {}s ago, consolidateAfter is {after}s",
                            self.cluster.now - since
                        ));
                    }
                }
                None => {}
            }
            if matches!(method, Method::Multi | Method::Single)
                && rules.is_some_and(|r| r.policy == ConsolidationPolicy::WhenEmpty)
            {
                return Some("consolidationPolicy is WhenEmpty and the node has pods".to_string());
            }
            if matches!(method, Method::Multi | Method::Single)
                && self.settings.wait_for_scale_down > 0.0
                && let Some(fall) = self
                    .cluster
                    .falling
                    .get(pool)
                    .filter(|f| **f >= self.settings.wait_for_scale_down)
            {
                return Some(format!(
                    "NodePool {pool}'s pods are expected to fall {:.0}% within {}h: its workloads' scale-down frees nodes without evictions",
                    fall * 100.0,
                    SCALE_DOWN_WINDOW / 3600
                ));
            }
        }
        if m.price_per_hour.is_none() && method != Method::Drift {
            return Some(format!(
                "no price for {} {} in {}",
                m.instance_type,
                m.capacity_type.as_str(),
                m.zone
            ));
        }
        if self.budget_left(pool, method) == 0 {
            return Some(format!("disruption budget of NodePool {pool} is used up"));
        }
        None
    }

    /// Whether removing `set` and adding `plan`'s new nodes keeps, in every NodePool with
    /// an expectation ([`Cluster::expected`]), the capacity for the requests it is
    /// expected to carry soon, plus the headroom. Nodes bought back within hours cost
    /// their launch, the pods' wait and the evictions that emptied them.
    fn keeps_expected(&self, set: &[usize], plan: &scheduling::Plan) -> Result<(), String> {
        use crate::model::Dimension;
        for (pool, expected) in &self.cluster.expected {
            let touched = set
                .iter()
                .any(|&i| self.meta[i].pool.as_deref() == Some(pool.as_str()));
            if !touched {
                continue;
            }
            let mut capacity = crate::model::Resources::default();
            for (i, n) in self.nodes.iter().enumerate() {
                if !set.contains(&i) && self.meta[i].pool.as_deref() == Some(pool.as_str()) {
                    capacity = capacity
                        .checked_add(&n.allocatable)
                        .unwrap_or_else(|_| capacity.clone());
                }
            }
            for claim in plan.node_claims.iter().filter(|c| &c.node_pool == pool) {
                if let Some(t) = self
                    .cluster
                    .input
                    .pools
                    .iter()
                    .find(|p| &p.name == pool)
                    .and_then(|p| {
                        p.instance_types
                            .iter()
                            .find(|t| t.name == claim.instance_type)
                    })
                {
                    capacity = capacity
                        .checked_add(&t.allocatable)
                        .unwrap_or_else(|_| capacity.clone());
                }
            }
            for dimension in [Dimension::Cpu, Dimension::Memory] {
                let want =
                    (expected.get(&dimension) as f64 * (1.0 + self.settings.headroom)) as i64;
                let have = capacity.get(&dimension);
                if have < want {
                    return Err(format!(
                        "NodePool {pool} is expected to need {} {dimension} (with headroom) within the forecast horizon; {} would be left",
                        dimension.format(want),
                        dimension.format(have),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether every PodDisruptionBudget covering a movable pod of `set` allows an eviction
    /// now, beyond those this pass's earlier decisions take. Not all of them at once: the
    /// drain evicts through the Eviction API, which refuses what a budget does not allow
    /// yet, and evicts the rest as the evicted pods' replacements become ready (the step
    /// Karpenter takes too). A node with more of a budget's pods than it allows at once
    /// would otherwise never be consolidated. The evictions a decision takes are counted
    /// against the budget (`apply`), so one pass starts one drain per exhausted budget.
    fn pdbs_allow(&self, set: &[usize]) -> Result<(), String> {
        for &i in set {
            for p in movable(&self.nodes[i]) {
                for pdb in &self.cluster.pdbs {
                    if pdb.namespace == p.namespace
                        && pdb.selector.matches(&p.labels)
                        && pdb.allowed - self.pdb_used.get(&pdb.key).copied().unwrap_or(0) <= 0
                    {
                        return Err(format!(
                            "PodDisruptionBudget {} allows no eviction of pod {} now",
                            pdb.key, p.key
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Simulates removing `set`: its movable pods must land on the remaining nodes and at
    /// most `max_new` new nodes.
    fn simulate(&self, set: &[usize], max_new: usize) -> Result<scheduling::Plan, String> {
        let pending: Vec<PodInfo> = set
            .iter()
            .flat_map(|&i| movable(&self.nodes[i]).cloned())
            .map(|mut p| {
                p.node_name = None;
                p
            })
            .collect();
        // Capacity bought ahead is kept for the growth it was bought for: the pods of the
        // nodes disrupted do not move onto it while it waits (they would take the room the
        // growth then finds gone, and it would be bought again).
        let nodes: Vec<ExistingNode> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(i, _)| {
                !set.contains(i)
                    && self.meta[*i]
                        .kept_until
                        .is_none_or(|t| t <= self.cluster.now)
            })
            .map(|(_, n)| n.clone())
            .collect();
        let input = Input {
            pending,
            nodes,
            pools: self.pools(set),
            daemon_sets: self.cluster.input.daemon_sets.clone(),
        };
        let plan = scheduling::schedule(
            &input,
            &Options {
                name_prefix: format!("replacement-{}-", self.replacements_made),
                // A consolidation may add one node, which already gets the cheapest type
                // that holds its pods: the exhaustive search would be spent for nothing on
                // every candidate weighed.
                exact_max_pods: if max_new <= 1 {
                    0
                } else {
                    scheduling::packing::EXACT_MAX_PODS
                },
                cost_aware: self.settings.cost_aware,
            },
        );
        if let Some(u) = plan.unschedulable.first() {
            return Err(format!(
                "pod {} would not fit elsewhere: {}",
                u.pod, u.reason
            ));
        }
        if plan.node_claims.len() > max_new {
            return Err(format!(
                "its pods need {} new nodes",
                plan.node_claims.len()
            ));
        }
        Ok(plan)
    }

    /// Proves a consolidation of `set`: pods fit, the saving clears the threshold, spot
    /// rules hold.
    fn prove(&self, set: &[usize]) -> Result<Proven, String> {
        self.prove_with(set, 1)
    }

    /// [`Work::prove`] with up to `max_new` new nodes.
    fn prove_with(&self, set: &[usize], max_new: usize) -> Result<Proven, String> {
        self.pdbs_allow(set)?;
        let plan = self.simulate(set, max_new)?;
        let price: f64 = set
            .iter()
            .filter_map(|&i| self.meta[i].price_per_hour)
            .sum();
        let new: f64 = plan.node_claims.iter().map(|c| c.price_per_hour).sum();
        let savings = price - new;
        let evictions = set
            .iter()
            .map(|&i| movable(&self.nodes[i]).count())
            .sum::<usize>();
        let needed = (price * self.settings.min_savings_fraction)
            .max(self.settings.min_savings_per_hour)
            + evictions as f64 * self.settings.min_savings_per_eviction;
        if savings < needed {
            return Err(format!(
                "saving ${savings:.4}/hour is below the threshold ${needed:.4}/hour for {evictions} eviction(s)"
            ));
        }
        self.keeps_expected(set, &plan)?;
        if let Some(claim) = plan.node_claims.first()
            && claim.capacity_type == CapacityType::Spot
            && set
                .iter()
                .all(|&i| self.meta[i].capacity_type == CapacityType::Spot)
        {
            if !self.settings.spot_to_spot {
                return Err("spot-to-spot replacement is off".to_string());
            }
            if claim.alternatives.len() + 1 < self.settings.spot_to_spot_min_alternatives {
                return Err(format!(
                    "only {} spot sizes fit, {} needed for spot-to-spot replacement",
                    claim.alternatives.len() + 1,
                    self.settings.spot_to_spot_min_alternatives
                ));
            }
        }
        Ok(Proven {
            nodes: set.to_vec(),
            plan,
            savings,
        })
    }

    /// Applies a decision to the working copy and describes it.
    fn apply(
        &mut self,
        method: Method,
        set: &[usize],
        plan: &scheduling::Plan,
        reason: String,
    ) -> Decision {
        let price: f64 = set
            .iter()
            .filter_map(|&i| self.meta[i].price_per_hour)
            .sum();
        let mut pods_moved: Vec<String> = set
            .iter()
            .flat_map(|&i| movable(&self.nodes[i]).map(|p| p.key.clone()))
            .collect();
        pods_moved.sort();
        for &i in set {
            for p in movable(&self.nodes[i]) {
                for pdb in &self.cluster.pdbs {
                    if pdb.namespace == p.namespace && pdb.selector.matches(&p.labels) {
                        *self.pdb_used.entry(pdb.key.clone()).or_default() += 1;
                    }
                }
            }
            if let Some(pool) = &self.meta[i].pool {
                *self.disrupted.entry(pool.clone()).or_default() += 1;
            }
        }
        let names: Vec<String> = set.iter().map(|&i| self.nodes[i].name.clone()).collect();
        // Displaced pods: to the nodes the plan chose.
        let displaced: BTreeMap<String, PodInfo> = set
            .iter()
            .flat_map(|&i| movable(&self.nodes[i]).cloned())
            .map(|p| (p.key.clone(), p))
            .collect();
        let mut keep: Vec<bool> = (0..self.nodes.len()).map(|i| !set.contains(&i)).collect();
        let mut nodes = Vec::new();
        let mut meta = Vec::new();
        for (i, n) in std::mem::take(&mut self.nodes).into_iter().enumerate() {
            if keep[i] {
                nodes.push(n);
                meta.push(self.meta[i].clone());
            }
        }
        keep.clear();
        for placement in &plan.existing_nodes {
            if let Some(n) = nodes.iter_mut().find(|n| n.name == placement.node) {
                for key in &placement.pods {
                    if let Some(p) = displaced.get(key) {
                        let mut p = p.clone();
                        p.node_name = Some(n.name.clone());
                        n.pods.push(Arc::new(p));
                    }
                }
            }
        }
        let mut replacements = Vec::new();
        for claim in &plan.node_claims {
            let allocatable = self
                .cluster
                .input
                .pools
                .iter()
                .find(|p| p.name == claim.node_pool)
                .and_then(|p| {
                    p.instance_types
                        .iter()
                        .find(|t| t.name == claim.instance_type)
                })
                .map(|t| t.allocatable.clone())
                .unwrap_or_default();
            let name = format!("{}-{}", claim.node_pool, claim.name);
            let pods = claim
                .pods
                .iter()
                .filter_map(|k| displaced.get(k))
                .map(|p| {
                    let mut p = p.clone();
                    p.node_name = Some(name.clone());
                    Arc::new(p)
                })
                .collect();
            let mut node_labels = claim.labels.clone();
            node_labels.insert(labels::HOSTNAME.to_string(), name.clone());
            let taints = self
                .cluster
                .input
                .pools
                .iter()
                .find(|p| p.name == claim.node_pool)
                .map(|p| p.taints.clone())
                .unwrap_or_default();
            nodes.push(ExistingNode {
                derived: Default::default(),
                name: name.clone(),
                labels: node_labels,
                taints,
                allocatable,
                pods,
                unschedulable: false,
            });
            meta.push(NodeMeta {
                pool: Some(claim.node_pool.clone()),
                instance_type: claim.instance_type.clone(),
                zone: claim.zone.clone(),
                capacity_type: claim.capacity_type,
                price_per_hour: Some(claim.price_per_hour),
                created: Some(self.cluster.now),
                last_pod_event: Some(self.cluster.now),
                do_not_disrupt: false,
                drifted: None,
                provider_id: None,
                kept_until: None,
            });
            self.fresh.insert(name);
            replacements.push(Replacement {
                instance_type: claim.instance_type.clone(),
                zone: claim.zone.clone(),
                capacity_type: claim.capacity_type,
                price_per_hour: claim.price_per_hour,
                node_pool: claim.node_pool.clone(),
            });
        }
        self.replacements_made += 1;
        self.nodes = nodes;
        self.meta = meta;
        let new: f64 = replacements.iter().map(|r| r.price_per_hour).sum();
        Decision {
            method,
            nodes: names,
            replacements,
            savings_per_hour: round4(price - new),
            pods_moved,
            reason,
        }
    }

    /// Indices of nodes `method` may touch; the others are recorded as blocked.
    fn candidates(&mut self, method: Method) -> Vec<usize> {
        let mut out = Vec::new();
        for i in 0..self.nodes.len() {
            match self.guard(i, method) {
                None => out.push(i),
                Some(why) => {
                    if !self.fresh.contains(&self.nodes[i].name) {
                        self.block(i, why);
                    }
                }
            }
        }
        out
    }

    fn expiration(&mut self) -> Option<Decision> {
        let now = self.cluster.now;
        let expired: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| {
                let m = &self.meta[i];
                let Some(rules) = m.pool.as_deref().and_then(|p| self.cluster.rules.get(p)) else {
                    return false;
                };
                matches!((rules.expire_after, m.created), (Some(life), Some(c)) if now - c >= life)
                    && self.guard(i, Method::Expiration).is_none()
            })
            .collect();
        let &first = expired.first()?;
        // Forceful: pods go wherever the provisioner puts them, any number of new nodes.
        let plan = match self.simulate(&[first], usize::MAX) {
            Ok(p) => p,
            Err(why) => {
                // Expiration does not wait for room; it reports what will be pending.
                tracing::debug!(node = %self.nodes[first].name, %why, "expiring anyway");
                scheduling::Plan::default()
            }
        };
        let age = self.meta[first].created.map_or(0, |c| now - c);
        Some(self.apply(
            Method::Expiration,
            &[first],
            &plan,
            format!("node is {}h old, past expireAfter", age / 3600),
        ))
    }

    fn empty(&mut self) -> Option<Decision> {
        let candidates = self.candidates(Method::Empty);
        let mut set = Vec::new();
        let mut per_pool: BTreeMap<String, usize> = BTreeMap::new();
        for i in candidates {
            if movable(&self.nodes[i]).next().is_some() {
                continue;
            }
            let pool = self.meta[i].pool.clone().unwrap_or_default();
            let used = per_pool.entry(pool.clone()).or_default();
            if *used < self.budget_left(&pool, Method::Empty) {
                set.push(i);
                if let Err(why) = self.keeps_expected(&set, &scheduling::Plan::default()) {
                    set.pop();
                    self.block(i, why);
                    continue;
                }
                *per_pool.entry(pool).or_default() += 1;
            } else {
                self.block(
                    i,
                    format!("disruption budget of NodePool {pool} is used up"),
                );
            }
        }
        if set.is_empty() {
            return None;
        }
        let n = set.len();
        Some(self.apply(
            Method::Empty,
            &set,
            &scheduling::Plan::default(),
            format!("{n} node(s) run only DaemonSet pods"),
        ))
    }

    fn drift(&mut self) -> Option<Decision> {
        let candidates = self.candidates(Method::Drift);
        for i in candidates {
            let Some(why) = self.meta[i].drifted.clone() else {
                continue;
            };
            if let Err(why) = self.pdbs_allow(&[i]) {
                self.block(i, why);
                continue;
            }
            match self.simulate(&[i], usize::MAX) {
                Ok(plan) => return Some(self.apply(Method::Drift, &[i], &plan, why)),
                Err(e) => self.block(i, format!("drifted, but {e}")),
            }
        }
        None
    }

    /// Candidates for consolidation, cheapest to disrupt first: fewest pods, then the
    /// most expensive node (the biggest saving for the same disruption).
    fn consolidation_order(&mut self, method: Method) -> Vec<usize> {
        let mut c: Vec<usize> = self
            .candidates(method)
            .into_iter()
            .filter(|&i| movable(&self.nodes[i]).next().is_some())
            .collect();
        c.sort_by(|&a, &b| {
            let pods = |i: usize| movable(&self.nodes[i]).count();
            pods(a).cmp(&pods(b)).then_with(|| {
                let p = |i: usize| self.meta[i].price_per_hour.unwrap_or(0.0);
                p(b).total_cmp(&p(a))
            })
        });
        c
    }

    fn multi(&mut self) -> Option<Decision> {
        let order = self.consolidation_order(Method::Multi);
        let mut pool_room: BTreeMap<String, usize> = BTreeMap::new();
        let mut eligible = Vec::new();
        for i in order {
            let pool = self.meta[i].pool.clone().unwrap_or_default();
            let room = pool_room
                .entry(pool.clone())
                .or_insert_with(|| self.budget_left(&pool, Method::Multi));
            if *room > 0 {
                *room -= 1;
                eligible.push(i);
            }
            if eligible.len() >= self.settings.max_multi_nodes {
                break;
            }
        }
        if eligible.len() < 2 {
            return None;
        }
        // Binary search for the longest prefix that consolidates onto the rest and at most
        // one new node.
        let (mut lo, mut hi) = (2usize, eligible.len());
        let mut best: Option<Proven> = None;
        while lo <= hi {
            let mid = (lo + hi) / 2;
            match self.prove(&eligible[..mid]) {
                Ok(p) => {
                    best = Some(p);
                    lo = mid + 1;
                }
                Err(_) => hi = mid - 1,
            }
        }
        let Some(p) = best else {
            return self.repack(&eligible);
        };
        let reason = format!(
            "{} nodes' pods fit on the rest{}, saving ${:.4}/hour",
            p.nodes.len(),
            if p.plan.node_claims.is_empty() {
                ""
            } else {
                " and one cheaper node"
            },
            p.savings
        );
        Some(self.apply(Method::Multi, &p.nodes, &p.plan, reason))
    }

    /// When no set merges into one new node: the pods of several candidates repacked into
    /// the packer's fresh plan for them, k nodes out and up to k new ones in (each the
    /// cheapest that holds its share, packed exactly; the saving must clear the same
    /// thresholds), as far as budgets and PDBs allow now: the whole eligible set first,
    /// then halves of it down to three nodes. A cluster left with many half-empty nodes of
    /// the wrong sizes reaches the fresh plan this way in one or a few commands, where
    /// one-node replacements take a command (and its validation and launch) per node or
    /// find nothing cheaper one node at a time.
    fn repack(&mut self, eligible: &[usize]) -> Option<Decision> {
        let mut sizes = Vec::new();
        let mut n = eligible.len();
        while n >= 3 {
            sizes.push(n);
            n = n.div_ceil(2).max(if n > 3 { 3 } else { 0 });
            if sizes.last() == Some(&n) {
                break;
            }
        }
        for size in sizes {
            let Ok(p) = self.prove_with(&eligible[..size], size) else {
                continue;
            };
            let reason = format!(
                "{} nodes' pods repacked onto the rest and {} new node(s), saving ${:.4}/hour",
                p.nodes.len(),
                p.plan.node_claims.len(),
                p.savings
            );
            return Some(self.apply(Method::Multi, &p.nodes, &p.plan, reason));
        }
        None
    }

    fn single(&mut self) -> Option<Decision> {
        let order = self.consolidation_order(Method::Single);
        for i in order {
            match self.prove(&[i]) {
                Ok(p) => {
                    let reason = if p.plan.node_claims.is_empty() {
                        "its pods fit on the other nodes".to_string()
                    } else {
                        format!(
                            "replaced by a cheaper {}",
                            p.plan.node_claims[0].instance_type
                        )
                    };
                    return Some(self.apply(Method::Single, &p.nodes, &p.plan, reason));
                }
                Err(why) => self.block(i, why),
            }
        }
        None
    }
}
