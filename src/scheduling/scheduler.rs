//! The scheduling simulation: places pending pods on existing nodes, on nodes planned in
//! this pass, or on new nodes from NodePools, with kube-scheduler's constraints.
//!
//! The placement pass follows Karpenter's order (largest pods first; existing nodes, then
//! planned nodes, then a new node from the highest-weight NodePool that works; preferences
//! treated as requirements and relaxed one at a time only when a pod cannot land). The
//! packer (see [`super::packing`]) then re-packs pods that carry no inter-pod constraint
//! onto the cheapest set of instance types.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use k8s_openapi::api::core::v1::Taint;
// Fx hashing: the keys are our own strings and requirement sets, not attacker input.
use rustc_hash::FxHashMap as HashMap;

use super::index::{NodeIndex, Query};
use super::input::{ExistingNode, Input, Pool};
use super::pod::{HostPort, Namespaces, PodInfo, PodTerm, Selector, Spread};
use super::taints;
use crate::apis::labels;
use crate::model::quantity::{display_bytes, display_cores};
use crate::model::{
    CapacityType, Dimension, NodeRequirements, Requirement, Requirements, Resources,
};

/// Resource vectors: cpu, memory, ephemeral-storage, pods, then up to four extended
/// resources, in the order the input first names them.
pub(crate) const R: usize = 8;
pub(crate) type ResV = [i64; R];
const EXT_SLOTS: usize = R - 4;

pub(crate) fn add(a: &ResV, b: &ResV) -> ResV {
    std::array::from_fn(|i| a[i].saturating_add(b[i]))
}

pub(crate) fn sub(a: &ResV, b: &ResV) -> ResV {
    std::array::from_fn(|i| a[i].saturating_sub(b[i]))
}

pub(crate) fn fits(req: &ResV, cap: &ResV) -> bool {
    req.iter().zip(cap).all(|(r, c)| r <= c)
}

fn vmax(a: &ResV, b: &ResV) -> ResV {
    std::array::from_fn(|i| a[i].max(b[i]))
}

/// Maps extended resource names to vector slots.
#[derive(Debug, Default, Clone)]
pub(crate) struct Dims {
    ext: Vec<String>,
}

impl Dims {
    fn learn(&mut self, r: &Resources) {
        for k in r.extended.keys() {
            if !self.ext.contains(k) && self.ext.len() < EXT_SLOTS {
                self.ext.push(k.clone());
            }
        }
    }

    /// The vector for a resource list; `None` when it names an extended resource beyond
    /// the four slots.
    pub(crate) fn vec(&self, r: &Resources) -> Option<ResV> {
        let mut v = [0; R];
        v[0] = r.cpu;
        v[1] = r.memory;
        v[2] = r.ephemeral_storage;
        v[3] = r.pods;
        for (k, amount) in &r.extended {
            let slot = self.ext.iter().position(|e| e == k)?;
            v[4 + slot] = *amount;
        }
        Some(v)
    }

    fn name(&self, i: usize) -> String {
        match i {
            0 => "cpu".into(),
            1 => "memory".into(),
            2 => "ephemeral-storage".into(),
            3 => "pods".into(),
            _ => self.ext.get(i - 4).cloned().unwrap_or_default(),
        }
    }

    fn show(&self, i: usize, v: i64) -> String {
        match i {
            0 => display_cores(v),
            1 | 2 => display_bytes(v),
            _ => v.to_string(),
        }
    }
}

/// Why a node cannot take a pod. Cheap to build on the hot path; turned into words only
/// when a pod ends up unschedulable.
#[derive(Debug, Clone)]
pub(crate) enum Reject {
    /// A fixed reason.
    Static(&'static str),
    /// Not enough of one resource dimension.
    Insufficient(usize),
    /// A topology constraint of a group, with what went wrong.
    Topology(usize, &'static str),
    /// The pod's node affinity does not match this node.
    NodeAffinity,
    /// A reason built on a rare path.
    Owned(String),
}

impl From<String> for Reject {
    fn from(s: String) -> Self {
        Reject::Owned(s)
    }
}

/// Options for one scheduling pass.
#[derive(Debug, Clone)]
pub struct Options {
    /// Re-pack pods without inter-pod constraints onto the cheapest instance types
    /// (Tailor's packer). Off gives Karpenter-style greedy packing.
    pub cost_aware: bool,
    /// Prefix for planned node names.
    pub name_prefix: String,
    /// The packer searches for the exact minimum-cost packing when at most this many pods
    /// are to be packed (0: never). Disruption turns it off where a plan may add one node
    /// at most: one node already takes the cheapest type that holds its pods.
    pub exact_max_pods: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            cost_aware: true,
            name_prefix: String::new(),
            exact_max_pods: super::packing::EXACT_MAX_PODS,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Spread {
        max_skew: i32,
        min_domains: Option<i32>,
        honor_node_affinity: bool,
        honor_taints: bool,
    },
    Affinity,
    Anti,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct GroupKey {
    kind: Kind,
    key: String,
    selector: Selector,
    namespaces: Namespaces,
}

/// Pods that one constraint counts, per domain of its topology key.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    kind: Kind,
    key_id: usize,
    selector: Selector,
    namespaces: Namespaces,
    /// Matching pods per domain.
    counts: Vec<u32>,
    /// Pods *having* this (required anti-affinity) term, per domain.
    owners: Vec<u32>,
    total: u32,
}

fn bump(v: &mut Vec<u32>, d: u32) {
    let i = d as usize;
    if v.len() <= i {
        v.resize(i + 1, 0);
    }
    v[i] += 1;
}

fn at(v: &[u32], d: u32) -> u32 {
    v.get(d as usize).copied().unwrap_or(0)
}

/// One constraint of a pod on a group.
#[derive(Debug, Clone, Copy)]
struct Con {
    group: usize,
    /// Whether the pod itself matches the group's selector (counts itself).
    self_match: bool,
}

/// What can be relaxed, in the order Karpenter relaxes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Soft {
    Spread(usize),
    Anti(usize),
    Affinity(usize),
    NodeTerm(usize),
    PreferNoSchedule,
}

#[derive(Debug)]
pub(crate) struct PodState<'a> {
    pub(crate) info: &'a PodInfo,
    pub(crate) req: Option<ResV>,
    required: Vec<Con>,
    soft_spread: Vec<Con>,
    soft_anti: Vec<Con>,
    soft_affinity: Vec<Con>,
    /// Groups whose selector matches this pod (counted on placement).
    pub(crate) matches: Vec<usize>,
    /// Required anti-affinity groups whose selector matches this pod (symmetry).
    anti_targets: Vec<usize>,
    /// Groups this pod owns as a required anti-affinity term.
    owns_anti: Vec<usize>,
    /// Placement: node index.
    pub(crate) node: Option<usize>,
    /// The node requirements in force when the placement pass placed the pod: its required
    /// terms plus the preferred terms it did not have to relax. The packer moves the pod
    /// only within these, so a preference relaxed nowhere is not dropped for a cheaper
    /// node (Karpenter treats preferences as requirements until the pod cannot land).
    pub(crate) kept_requirements: Option<NodeRequirements>,
    trivial_requirements: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct TypeInfo {
    /// Index into the pool's instance types.
    pub(crate) index: usize,
    /// Allocatable less the DaemonSets that would run on it.
    pub(crate) alloc: ResV,
    /// Capacity, for limits.
    pub(crate) capacity: ResV,
    /// DaemonSet overhead.
    pub(crate) overhead: ResV,
    pub(crate) daemon_sets: Vec<usize>,
}

#[derive(Debug, Clone)]
pub(crate) struct PoolState {
    pub(crate) types: Vec<TypeInfo>,
    /// Remaining limit per dimension (`i64::MAX` when unlimited).
    pub(crate) remaining: ResV,
    pub(crate) nodes_remaining: i64,
    pub(crate) zones: Vec<String>,
    pub(crate) planned_per_zone: BTreeMap<String, usize>,
    pub(crate) counter: usize,
    /// Requirements with `minValues`: a node's fitting types must span that many values.
    pub(crate) min_values: Vec<(String, usize)>,
}

/// Option lists are keyed by pool, node requirements, zone and capacity type.
type OptionKey = (usize, Requirements, String, CapacityType);
/// Compatible type lists are keyed by pool and requirements.
type CompatibleKey = (usize, Requirements);
/// Templates are keyed by pool and the pod's requirements (`None`: none).
type TemplateKey = (usize, Option<Requirements>);

/// How new nodes of one pool are made for pods with given requirements.
pub(crate) struct Templates {
    /// Types (indices into the pool's `types`) the requirements admit.
    compatible: Rc<Vec<u32>>,
    /// One per admitted zone and capacity type.
    slots: Vec<Slot>,
}

/// A new node's zone, capacity type, requirements, labels and candidate types.
pub(crate) struct Slot {
    pub(crate) zone: String,
    pub(crate) capacity_type: CapacityType,
    pub(crate) requirements: Rc<Requirements>,
    pub(crate) labels: Rc<BTreeMap<String, String>>,
    pub(crate) options: Rc<OptionList>,
}

/// A planned node's candidate types for its zone and capacity type, cheapest first, with the
/// per-dimension maximum allocatable over each suffix of the list.
#[derive(Debug, Default)]
pub(crate) struct OptionList {
    pub(crate) types: Vec<u32>,
    suffix_max: Vec<ResV>,
}

impl OptionList {
    fn new(types: Vec<u32>, alloc: impl Fn(u32) -> ResV) -> Self {
        let mut suffix_max = vec![[0; R]; types.len() + 1];
        for i in (0..types.len()).rev() {
            suffix_max[i] = vmax(&suffix_max[i + 1], &alloc(types[i]));
        }
        OptionList { types, suffix_max }
    }

    /// The largest allocatable per dimension over the types from `pos` on.
    fn upper(&self, pos: usize) -> ResV {
        self.suffix_max.get(pos).copied().unwrap_or([0; R])
    }
}

impl PoolState {
    /// Counts `delta` of capacity against the limited dimensions (negative gives back).
    pub(crate) fn charge(&mut self, delta: &ResV) {
        for (left, d) in self.remaining.iter_mut().zip(delta) {
            if *left != i64::MAX {
                *left -= d;
            }
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) enum NodeKind {
    Existing,
    Planned {
        pool: usize,
        zone: String,
        capacity_type: CapacityType,
    },
}

#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub(crate) name: String,
    pub(crate) kind: NodeKind,
    /// Labels (planned nodes: without the hostname, which is the node's name). Shared
    /// between nodes made from the same template.
    pub(crate) labels: Rc<BTreeMap<String, String>>,
    pub(crate) requirements: Rc<Requirements>,
    pub(crate) taints: Vec<Taint>,
    /// Requests of its pods (and, for planned nodes, not the DaemonSet overhead, which
    /// each instance type's `alloc` already subtracts).
    pub(crate) used: ResV,
    /// Existing: allocatable. Planned: per-dimension maximum over the types still open.
    pub(crate) cap_upper: ResV,
    /// Planned: indices into the pool's `types`, cheapest first for this zone and capacity
    /// type (shared between nodes with the same requirements).
    pub(crate) options: Rc<OptionList>,
    /// Planned: position in `options` of the cheapest type that holds `used`.
    pub(crate) pos: usize,
    pub(crate) pods: Vec<usize>,
    pub(crate) host_ports: Vec<HostPort>,
    /// Domain per topology key in use.
    domains: Vec<Option<u32>>,
    /// Planned: capacity counted against the pool's limits.
    pub(crate) reserved: ResV,
    /// Existing: `spec.unschedulable`.
    pub(crate) cordoned: bool,
    /// Planned: emptied by the packer and given back.
    pub(crate) retired: bool,
    /// Hostname-keyed groups with a matching pod here (bit per group).
    present_mask: u64,
    /// Hostname-keyed groups with a pod owning the anti-affinity term here.
    owner_mask: u64,
}

impl Node {
    fn is_planned(&self) -> bool {
        matches!(self.kind, NodeKind::Planned { .. })
    }

    /// Whether this is a node planned in this pass (and not retired by the packer).
    pub(crate) fn is_planned_node(&self) -> bool {
        self.is_planned() && !self.retired
    }
}

/// The mutable state of a pass, saved so the packer can undo a worse result.
pub(crate) struct Checkpoint {
    nodes: Vec<Node>,
    groups: Vec<Group>,
    pools: Vec<PoolState>,
    domains: Vec<Interner>,
    pod_nodes: Vec<Option<usize>>,
    index: NodeIndex,
}

#[derive(Default, Debug, Clone)]
struct Interner {
    ids: HashMap<String, u32>,
    names: Vec<String>,
}

impl Interner {
    fn id(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.ids.get(s) {
            return i;
        }
        let i = self.names.len() as u32;
        self.ids.insert(s.to_string(), i);
        self.names.push(s.to_string());
        i
    }
}

/// The working state of one pass.
pub(crate) struct Scheduler<'a> {
    pub(crate) input: &'a Input,
    pub(crate) dims: Dims,
    pub(crate) pods: Vec<PodState<'a>>,
    pub(crate) nodes: Vec<Node>,
    groups: Vec<Group>,
    keys: Vec<String>,
    domains: Vec<Interner>,
    pub(crate) pools: Vec<PoolState>,
    pub(crate) unschedulable: Vec<(usize, String)>,
    pub(crate) options: Options,
    /// First-fit index over nodes.
    index: NodeIndex,
    /// Bit per hostname-keyed group (at most 64 groups get one).
    host_bit: Vec<Option<u64>>,
    /// Option lists by pool, requirements, zone and capacity type.
    option_cache: RefCell<HashMap<OptionKey, Rc<OptionList>>>,
    /// New-node templates by pool and pod requirements.
    template_cache: RefCell<HashMap<TemplateKey, Rc<Templates>>>,
    /// Compatible types by pool and requirements.
    compatible_cache: RefCell<HashMap<CompatibleKey, Rc<Vec<u32>>>>,
}

fn canonical_labels(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut out = labels.clone();
    for (k, v) in labels {
        let c = labels::canonical_key(k);
        if c != k {
            out.entry(c.to_string()).or_insert_with(|| v.clone());
        }
    }
    out
}

fn term_key(kind: Kind, t: &PodTerm) -> GroupKey {
    GroupKey {
        kind,
        key: t.topology_key.clone(),
        selector: t.selector.clone(),
        namespaces: t.namespaces.clone(),
    }
}

fn spread_key(s: &Spread, namespace: &str) -> GroupKey {
    GroupKey {
        kind: Kind::Spread {
            max_skew: s.max_skew,
            min_domains: s.min_domains,
            honor_node_affinity: s.honor_node_affinity,
            honor_taints: s.honor_taints,
        },
        key: s.topology_key.clone(),
        selector: s.selector.clone(),
        // Spread constraints count pods of the pod's own namespace.
        namespaces: Namespaces::Set(BTreeSet::from([namespace.to_string()])),
    }
}

/// The node requirements in force at one relaxation level, and whether PreferNoSchedule
/// taints still count.
struct Active {
    node_requirements: NodeRequirements,
    trivial: bool,
    cons: Vec<Con>,
    prefer_no_schedule: bool,
}

impl<'a> Scheduler<'a> {
    pub(crate) fn new(input: &'a Input, options: Options) -> Self {
        let mut dims = Dims::default();
        for p in input
            .pending
            .iter()
            .chain(input.nodes.iter().flat_map(|n| n.pods.iter().map(|p| &**p)))
        {
            dims.learn(&p.requests);
        }
        for n in &input.nodes {
            dims.learn(&n.allocatable);
        }
        for pool in &input.pools {
            for it in &pool.instance_types {
                dims.learn(&it.allocatable);
            }
        }
        let mut s = Scheduler {
            input,
            dims,
            pods: Vec::new(),
            nodes: Vec::new(),
            groups: Vec::new(),
            keys: Vec::new(),
            domains: Vec::new(),
            pools: Vec::new(),
            unschedulable: Vec::new(),
            options,
            index: NodeIndex::default(),
            host_bit: Vec::new(),
            option_cache: RefCell::new(HashMap::default()),
            compatible_cache: RefCell::new(HashMap::default()),
            template_cache: RefCell::new(HashMap::default()),
        };
        s.build();
        s
    }

    fn key_id(&mut self, key: &str) -> usize {
        if let Some(i) = self.keys.iter().position(|k| k == key) {
            return i;
        }
        self.keys.push(key.to_string());
        self.domains.push(Interner::default());
        self.keys.len() - 1
    }

    fn group_id(&mut self, index: &mut HashMap<GroupKey, usize>, key: GroupKey) -> usize {
        if let Some(&g) = index.get(&key) {
            return g;
        }
        let key_id = self.key_id(&key.key);
        self.groups.push(Group {
            kind: key.kind,
            key_id,
            selector: key.selector.clone(),
            namespaces: key.namespaces.clone(),
            counts: Vec::new(),
            owners: Vec::new(),
            total: 0,
        });
        index.insert(key, self.groups.len() - 1);
        self.groups.len() - 1
    }

    fn build(&mut self) {
        let input = self.input;
        // Pods: pending first (ids 0..n), then pods already on nodes.
        let all: Vec<&PodInfo> = input
            .pending
            .iter()
            .chain(input.nodes.iter().flat_map(|n| n.pods.iter().map(|p| &**p)))
            .collect();
        let mut index: HashMap<GroupKey, usize> = HashMap::default();
        for info in &all {
            let mut st = PodState {
                info,
                req: self.dims.vec(&info.requests),
                required: Vec::new(),
                soft_spread: Vec::new(),
                soft_anti: Vec::new(),
                soft_affinity: Vec::new(),
                matches: Vec::new(),
                anti_targets: Vec::new(),
                owns_anti: Vec::new(),
                node: None,
                kept_requirements: None,
                trivial_requirements: info
                    .node_requirements
                    .alternatives()
                    .iter()
                    .all(|a| a.is_empty()),
            };
            for s in &info.spread {
                let g = self.group_id(&mut index, spread_key(s, &info.namespace));
                let con = Con {
                    group: g,
                    self_match: false,
                };
                if s.hard {
                    st.required.push(con);
                } else {
                    st.soft_spread.push(con);
                }
            }
            for t in &info.affinity {
                let g = self.group_id(&mut index, term_key(Kind::Affinity, t));
                st.required.push(Con {
                    group: g,
                    self_match: false,
                });
            }
            for t in &info.anti_affinity {
                let g = self.group_id(&mut index, term_key(Kind::Anti, t));
                st.required.push(Con {
                    group: g,
                    self_match: false,
                });
                st.owns_anti.push(g);
            }
            for (_, t) in &info.preferred_affinity {
                let g = self.group_id(&mut index, term_key(Kind::Affinity, t));
                st.soft_affinity.push(Con {
                    group: g,
                    self_match: false,
                });
            }
            for (_, t) in &info.preferred_anti_affinity {
                let g = self.group_id(&mut index, term_key(Kind::Anti, t));
                st.soft_anti.push(Con {
                    group: g,
                    self_match: false,
                });
            }
            self.pods.push(st);
        }
        // Which groups each pod matches, and whether it matches its own constraints.
        let required_anti: Vec<bool> = {
            let mut v = vec![false; self.groups.len()];
            for p in &self.pods {
                for &g in &p.owns_anti {
                    v[g] = true;
                }
            }
            v
        };
        for p in &mut self.pods {
            for (g, group) in self.groups.iter().enumerate() {
                if group.namespaces.contains(&p.info.namespace)
                    && group.selector.matches(&p.info.labels)
                {
                    p.matches.push(g);
                    if required_anti[g] {
                        p.anti_targets.push(g);
                    }
                }
            }
            let matches = p.matches.clone();
            for c in p
                .required
                .iter_mut()
                .chain(p.soft_spread.iter_mut())
                .chain(p.soft_anti.iter_mut())
                .chain(p.soft_affinity.iter_mut())
            {
                c.self_match = matches.contains(&c.group);
            }
        }
        // Hostname-keyed groups get a bit for the first-fit index.
        let mut next_bit = 0u32;
        self.host_bit = self
            .groups
            .iter()
            .map(|g| {
                if self.keys[g.key_id] == labels::HOSTNAME && next_bit < 64 {
                    next_bit += 1;
                    Some(1u64 << (next_bit - 1))
                } else {
                    None
                }
            })
            .collect();
        // Pools: instance types with DaemonSet overhead, zones, limits.
        for pool in &input.pools {
            let state = self.pool_state(pool);
            self.pools.push(state);
        }
        // Existing nodes, with their pods counted.
        let mut pod_id = input.pending.len();
        for n in &input.nodes {
            let idx = self.nodes.len();
            let node = self.existing_node(n);
            self.nodes.push(node);
            self.reindex(idx);
            for _ in &n.pods {
                self.place(pod_id, idx);
                pod_id += 1;
            }
        }
    }

    fn pool_state(&self, pool: &Pool) -> PoolState {
        let mut types = Vec::new();
        for (index, it) in pool.instance_types.iter().enumerate() {
            let (Some(alloc), Some(capacity)) =
                (self.dims.vec(&it.allocatable), self.dims.vec(&it.capacity))
            else {
                continue;
            };
            // DaemonSets whose pods would run on this type in this pool.
            let node_reqs = if self.input.daemon_sets.is_empty() {
                Requirements::new()
            } else {
                pool.requirements.intersect(&it.requirements)
            };
            let mut overhead = [0; R];
            let mut daemon_sets = Vec::new();
            for (d, ds) in self.input.daemon_sets.iter().enumerate() {
                let tolerated = taints::untolerated(&pool.taints, &ds.tolerations, false).is_none();
                let selected = ds
                    .node_requirements
                    .alternatives()
                    .iter()
                    .any(|a| a.compatible_allowing(&node_reqs, &|_| false).is_ok());
                if tolerated
                    && selected
                    && let Some(v) = self.dims.vec(&ds.requests)
                {
                    overhead = add(&overhead, &v);
                    daemon_sets.push(d);
                }
            }
            let alloc = sub(&alloc, &overhead);
            if alloc.iter().any(|v| *v < 0) {
                continue; // the DaemonSets alone do not fit
            }
            types.push(TypeInfo {
                index,
                alloc,
                capacity,
                overhead,
                daemon_sets,
            });
        }
        let mut zones: BTreeSet<String> = BTreeSet::new();
        for it in &pool.instance_types {
            for o in it.offerings.iter().filter(|o| o.available) {
                zones.insert(o.zone.clone());
            }
        }
        let zone_req = pool.requirements.get(labels::ZONE);
        let zones = zones
            .into_iter()
            .filter(|z| zone_req.is_none_or(|r| r.admits_value(z)))
            .collect();
        let mut remaining = [i64::MAX; R];
        for d in &pool.limits.limited {
            let slot = match d {
                Dimension::Cpu => Some(0),
                Dimension::Memory => Some(1),
                Dimension::EphemeralStorage => Some(2),
                Dimension::Pods => Some(3),
                Dimension::Extended(n) => self.dims.ext.iter().position(|e| e == n).map(|p| p + 4),
            };
            if let Some(i) = slot {
                remaining[i] = pool.limits.resources.get(d) - pool.in_use.get(d);
            }
        }
        let min_values = pool
            .requirements
            .iter()
            .filter_map(|r| r.min_values().map(|m| (r.key().to_string(), m as usize)))
            .collect();
        PoolState {
            min_values,
            types,
            remaining,
            nodes_remaining: pool
                .limits
                .nodes
                .map_or(i64::MAX, |n| n - pool.nodes_in_use),
            zones,
            planned_per_zone: BTreeMap::new(),
            counter: 0,
        }
    }

    fn existing_node(&mut self, n: &ExistingNode) -> Node {
        let labels = canonical_labels(&n.labels);
        let alloc = self.dims.vec(&n.allocatable).unwrap_or([0; R]);
        let mut node = Node {
            name: n.name.clone(),
            kind: NodeKind::Existing,
            requirements: Rc::new(Requirements::from_labels(&labels)),
            labels: Rc::new(labels),
            taints: n.taints.clone(),
            used: [0; R],
            cap_upper: alloc,
            options: Rc::default(),
            pos: 0,
            pods: Vec::new(),
            host_ports: Vec::new(),
            domains: Vec::new(),
            reserved: [0; R],
            cordoned: n.unschedulable,
            retired: false,
            present_mask: 0,
            owner_mask: 0,
        };
        node.domains = self.node_domains(&node);
        node
    }

    fn node_domains(&mut self, node: &Node) -> Vec<Option<u32>> {
        (0..self.keys.len())
            .map(|k| {
                let key = self.keys[k].clone();
                let value = if key == labels::HOSTNAME {
                    Some(
                        node.labels
                            .get(labels::HOSTNAME)
                            .cloned()
                            .unwrap_or_else(|| node.name.clone()),
                    )
                } else {
                    node.labels.get(labels::canonical_key(&key)).cloned()
                };
                value.map(|v| self.domains[k].id(&v))
            })
            .collect()
    }

    /// Records pod `p` on node `n`: resources, ports, topology counts.
    pub(crate) fn place(&mut self, p: usize, n: usize) {
        let req = self.pods[p].req.unwrap_or([0; R]);
        let node = &mut self.nodes[n];
        node.used = add(&node.used, &req);
        node.pods.push(p);
        node.host_ports
            .extend(self.pods[p].info.host_ports.iter().cloned());
        for &g in &self.pods[p].matches {
            let group = &mut self.groups[g];
            if let Some(d) = node.domains[group.key_id] {
                bump(&mut group.counts, d);
                group.total += 1;
                if let Some(bit) = self.host_bit[g] {
                    node.present_mask |= bit;
                }
            }
        }
        for &g in &self.pods[p].owns_anti {
            let group = &mut self.groups[g];
            if let Some(d) = node.domains[group.key_id] {
                bump(&mut group.owners, d);
                if let Some(bit) = self.host_bit[g] {
                    node.owner_mask |= bit;
                }
            }
        }
        self.pods[p].node = Some(n);
        self.reindex(n);
    }

    /// Narrows a planned node's room to one type's allocatable (the packer fills kept
    /// nodes without changing their type); `rebuild_options` restores it.
    pub(crate) fn limit_to_type(&mut self, n: usize, t: usize) {
        if let NodeKind::Planned { pool, .. } = self.nodes[n].kind {
            self.nodes[n].cap_upper = self.pools[pool].types[t].alloc;
            self.reindex(n);
        }
    }

    /// The first open node from `from` on with `need` free.
    pub(crate) fn first_fit(&self, from: usize, need: ResV) -> Option<usize> {
        self.index.first(
            from,
            &Query {
                need,
                avoid_present: 0,
                avoid_owners: 0,
            },
        )
    }

    /// A rejection in words.
    fn reject_text(&self, r: &Reject) -> String {
        match r {
            Reject::Static(s) => (*s).to_string(),
            Reject::Owned(s) => s.clone(),
            Reject::NodeAffinity => "node selector or affinity does not match".to_string(),
            Reject::Insufficient(d) => format!("insufficient {}", self.dims.name(*d)),
            Reject::Topology(g, what) => {
                let group = &self.groups[*g];
                let key = &self.keys[group.key_id];
                match (*what, group.kind) {
                    ("skew", Kind::Spread { max_skew, .. }) => {
                        format!("topology spread on {key} would exceed maxSkew {max_skew}")
                    }
                    ("no-label", _) => format!("node has no {key} label for topology spread"),
                    ("affinity", _) => {
                        format!("pod affinity on {key} finds no matching pod in the node's domain")
                    }
                    ("anti", _) => format!(
                        "pod anti-affinity on {key} conflicts with a pod in the node's domain"
                    ),
                    _ => format!("an existing pod's anti-affinity on {key} excludes it"),
                }
            }
        }
    }

    /// Updates node `n` in the first-fit index.
    pub(crate) fn reindex(&mut self, n: usize) {
        let node = &self.nodes[n];
        let open = !node.retired && !node.cordoned;
        let value = open.then(|| {
            (
                sub(&node.cap_upper, &node.used),
                node.present_mask,
                node.owner_mask,
            )
        });
        self.index.set(n, value);
    }

    /// Reverses [`Scheduler::place`] (used by the packer).
    pub(crate) fn unplace(&mut self, p: usize) {
        let Some(n) = self.pods[p].node.take() else {
            return;
        };
        let req = self.pods[p].req.unwrap_or([0; R]);
        let node = &mut self.nodes[n];
        node.used = sub(&node.used, &req);
        node.pods.retain(|q| *q != p);
        for hp in &self.pods[p].info.host_ports {
            if let Some(i) = node.host_ports.iter().position(|h| h == hp) {
                node.host_ports.remove(i);
            }
        }
        for &g in &self.pods[p].matches {
            let group = &mut self.groups[g];
            if let Some(d) = node.domains[group.key_id]
                && let Some(c) = group.counts.get_mut(d as usize)
            {
                *c -= 1;
                group.total -= 1;
                if *c == 0
                    && let Some(bit) = self.host_bit[g]
                {
                    node.present_mask &= !bit;
                }
            }
        }
        for &g in &self.pods[p].owns_anti {
            let group = &mut self.groups[g];
            if let Some(d) = node.domains[group.key_id]
                && let Some(c) = group.owners.get_mut(d as usize)
            {
                *c -= 1;
                if *c == 0
                    && let Some(bit) = self.host_bit[g]
                {
                    node.owner_mask &= !bit;
                }
            }
        }
        self.reindex(n);
    }

    /// The relaxation steps available for a pod, in order.
    fn softs(&self, p: usize) -> Vec<Soft> {
        let pod = &self.pods[p];
        let mut out: Vec<Soft> = (0..pod.soft_spread.len()).map(Soft::Spread).collect();
        // Lightest preferences go first: the lists are sorted heaviest first.
        out.extend((0..pod.soft_anti.len()).rev().map(Soft::Anti));
        out.extend((0..pod.soft_affinity.len()).rev().map(Soft::Affinity));
        out.extend((0..pod.info.preferred_node.len()).rev().map(Soft::NodeTerm));
        out.push(Soft::PreferNoSchedule);
        out
    }

    fn active(&self, p: usize, relaxed: &[Soft]) -> Active {
        let pod = &self.pods[p];
        let mut cons = pod.required.clone();
        for (i, c) in pod.soft_spread.iter().enumerate() {
            if !relaxed.contains(&Soft::Spread(i)) {
                cons.push(*c);
            }
        }
        for (i, c) in pod.soft_anti.iter().enumerate() {
            if !relaxed.contains(&Soft::Anti(i)) {
                cons.push(*c);
            }
        }
        for (i, c) in pod.soft_affinity.iter().enumerate() {
            if !relaxed.contains(&Soft::Affinity(i)) {
                cons.push(*c);
            }
        }
        let mut extra = Requirements::new();
        let mut any_extra = false;
        for (i, (_, term)) in pod.info.preferred_node.iter().enumerate() {
            if !relaxed.contains(&Soft::NodeTerm(i)) {
                extra = extra.intersect(term);
                any_extra = true;
            }
        }
        let node_requirements = if any_extra {
            NodeRequirements::new(extra, pod.info.node_requirements.alternatives().to_vec())
        } else {
            pod.info.node_requirements.clone()
        };
        Active {
            trivial: pod.trivial_requirements && !any_extra,
            node_requirements,
            cons,
            prefer_no_schedule: !relaxed.contains(&Soft::PreferNoSchedule),
        }
    }

    /// The smallest count over the domains a pod could be placed in, for a spread group.
    fn spread_min(&self, g: usize, p: usize, active: &Active, can_create: bool) -> u32 {
        let group = &self.groups[g];
        let Kind::Spread {
            min_domains,
            honor_node_affinity,
            honor_taints,
            ..
        } = group.kind
        else {
            return 0;
        };
        let key = &self.keys[group.key_id];
        if key == labels::HOSTNAME && can_create {
            // A node that does not exist yet is a domain with no matching pods.
            return 0;
        }
        let is_zone = labels::canonical_key(key) == labels::ZONE;
        if is_zone && active.trivial && !honor_taints {
            // Every node is eligible: the domains are every zone a node is in, plus the
            // zones a new node could take (empty ones count zero).
            let interned = &self.domains[group.key_id];
            let mut n_domains = interned.names.len();
            if can_create {
                for (pi, pool) in self.pools.iter().enumerate() {
                    if self.pool_admits(pi, p, active).is_ok() {
                        for z in &pool.zones {
                            if !interned.ids.contains_key(z) {
                                n_domains += 1;
                            }
                        }
                    }
                }
            }
            let below_min_domains = min_domains.is_some_and(|m| (n_domains as i64) < i64::from(m));
            if n_domains > interned.names.len() || below_min_domains {
                return 0;
            }
            return (0..interned.names.len() as u32)
                .map(|d| at(&group.counts, d))
                .min()
                .unwrap_or(0);
        }
        let mut domains: BTreeSet<u32> = BTreeSet::new();
        for node in &self.nodes {
            if node.retired {
                continue;
            }
            let Some(d) = node.domains[group.key_id] else {
                continue;
            };
            if honor_node_affinity
                && !active.trivial
                && self
                    .requirements_match(node, &active.node_requirements)
                    .is_err()
            {
                continue;
            }
            if honor_taints
                && taints::untolerated(&node.taints, &self.pods[p].info.tolerations, false)
                    .is_some()
            {
                continue;
            }
            domains.insert(d);
        }
        if can_create && labels::canonical_key(key) == labels::ZONE {
            for (pi, pool) in self.pools.iter().enumerate() {
                if self.pool_admits(pi, p, active).is_ok() {
                    // With nodeAffinityPolicy Honor, a zone the pod's node affinity rules
                    // out is no domain of its: no node there could ever count for it.
                    let zones = pool.zones.iter().filter(|z| {
                        !honor_node_affinity
                            || active
                                .node_requirements
                                .alternatives()
                                .iter()
                                .any(|a| a.get(labels::ZONE).is_none_or(|r| r.admits_value(z)))
                    });
                    for z in zones {
                        if let Some(&id) = self.domains[group.key_id].ids.get(z) {
                            domains.insert(id);
                        } else {
                            // A zone no node is in yet has a count of zero.
                            return 0;
                        }
                    }
                }
            }
        }
        if let Some(m) = min_domains
            && (domains.len() as i64) < i64::from(m)
        {
            return 0;
        }
        domains
            .iter()
            .map(|d| at(&group.counts, *d))
            .min()
            .unwrap_or(0)
    }

    /// Whether a node's topology domains satisfy the pod's active constraints.
    fn topology_ok(
        &self,
        p: usize,
        n: usize,
        active: &Active,
        can_create: bool,
    ) -> Result<(), Reject> {
        let node = &self.nodes[n];
        for c in &active.cons {
            self.domain_ok(
                c,
                node.domains[self.groups[c.group].key_id],
                p,
                active,
                can_create,
            )?;
        }
        for &g in &self.pods[p].anti_targets {
            let group = &self.groups[g];
            if let Some(d) = node.domains[group.key_id]
                && at(&group.owners, d) > 0
            {
                return Err(Reject::Topology(g, "symmetric"));
            }
        }
        Ok(())
    }

    fn domain_ok(
        &self,
        c: &Con,
        d: Option<u32>,
        p: usize,
        active: &Active,
        can_create: bool,
    ) -> Result<(), Reject> {
        let group = &self.groups[c.group];
        match group.kind {
            Kind::Spread { max_skew, .. } => {
                let Some(d) = d else {
                    return Err(Reject::Topology(c.group, "no-label"));
                };
                let min = self.spread_min(c.group, p, active, can_create);
                let count = i64::from(at(&group.counts, d)) + i64::from(c.self_match);
                if count - i64::from(min) > i64::from(max_skew) {
                    return Err(Reject::Topology(c.group, "skew"));
                }
            }
            Kind::Affinity => {
                if group.total == 0 && c.self_match {
                    return Ok(()); // the first pod of a self-affine group may go anywhere
                }
                match d {
                    Some(d) if at(&group.counts, d) > 0 => {}
                    _ => {
                        return Err(Reject::Topology(c.group, "affinity"));
                    }
                }
            }
            Kind::Anti => {
                if let Some(d) = d
                    && at(&group.counts, d) > 0
                {
                    return Err(Reject::Topology(c.group, "anti"));
                }
            }
        }
        Ok(())
    }

    fn requirements_match(&self, node: &Node, reqs: &NodeRequirements) -> Result<(), String> {
        let r = if node.is_planned() {
            reqs.alternatives()
                .iter()
                .find(|a| {
                    a.compatible_allowing(&node.requirements, &labels::is_well_known)
                        .is_ok()
                })
                .map(|_| ())
                .ok_or(())
        } else {
            reqs.matches_labels(&node.labels).map_err(|_| ())
        };
        r.map_err(|()| {
            let conflict = reqs.alternatives().iter().find_map(|a| {
                if node.is_planned() {
                    a.compatible_allowing(&node.requirements, &labels::is_well_known)
                        .err()
                } else {
                    a.matches_labels(&node.labels).err()
                }
            });
            match conflict {
                Some(c) => format!("node affinity: {c}"),
                None => "node affinity does not match".to_string(),
            }
        })
    }

    fn ports_free(&self, p: usize, n: usize) -> bool {
        self.pods[p]
            .info
            .host_ports
            .iter()
            .all(|hp| !self.nodes[n].host_ports.iter().any(|h| h.conflicts(hp)))
    }

    /// What node `n` would have in use with pod `p` added, if that is within the node's
    /// upper bound.
    fn room_for(&self, p: usize, n: usize) -> Result<ResV, Reject> {
        let node = &self.nodes[n];
        let req = self.pods[p].req.ok_or(Reject::Static(
            "requests an extended resource this pass cannot track",
        ))?;
        let need = add(&node.used, &req);
        match (0..R).find(|&i| need[i] > node.cap_upper[i]) {
            Some(dim) => Err(Reject::Insufficient(dim)),
            None => Ok(need),
        }
    }

    /// Tries pod `p` on existing node `n`.
    fn try_existing(
        &self,
        p: usize,
        n: usize,
        active: &Active,
        can_create: bool,
    ) -> Result<(), Reject> {
        let node = &self.nodes[n];
        let pod = &self.pods[p];
        self.room_for(p, n)?;
        if node.cordoned {
            return Err(Reject::Static("node is cordoned"));
        }
        if let Some(t) = taints::untolerated(
            &node.taints,
            &pod.info.tolerations,
            active.prefer_no_schedule,
        ) {
            return Err(format!("untolerated taint {}", taints::describe(t)).into());
        }
        if !active.trivial && !active.node_requirements.admits_labels(&node.labels) {
            return Err(Reject::NodeAffinity);
        }
        if !self.ports_free(p, n) {
            return Err(Reject::Static("host port in use"));
        }
        self.topology_ok(p, n, active, can_create)
    }

    /// Tries pod `p` on planned node `n`; on success returns the narrowed requirements
    /// (if they changed), the surviving options and the new cheapest position.
    fn try_planned(
        &self,
        p: usize,
        n: usize,
        active: &Active,
        can_create: bool,
    ) -> Result<PlannedFit, Reject> {
        let node = &self.nodes[n];
        let NodeKind::Planned { pool, .. } = node.kind else {
            return Err(Reject::Static("not a planned node"));
        };
        let pod = &self.pods[p];
        let need = self.room_for(p, n)?;
        if let Some(t) = taints::untolerated(
            &node.taints,
            &pod.info.tolerations,
            active.prefer_no_schedule,
        ) {
            return Err(format!("untolerated taint {}", taints::describe(t)).into());
        }
        if !self.ports_free(p, n) {
            return Err(Reject::Static("host port in use"));
        }
        let (requirements, options) = if active.trivial {
            (None, None)
        } else {
            let alt = active
                .node_requirements
                .alternatives()
                .iter()
                .find(|a| {
                    a.compatible_allowing(&node.requirements, &labels::is_well_known)
                        .is_ok()
                })
                .ok_or_else(|| {
                    Reject::Owned(
                        self.requirements_match(node, &active.node_requirements)
                            .err()
                            .unwrap_or_default(),
                    )
                })?;
            let narrowed = node.requirements.intersect(alt);
            if narrowed == *node.requirements {
                (None, None)
            } else {
                let NodeKind::Planned {
                    zone,
                    capacity_type,
                    ..
                } = &node.kind
                else {
                    return Err(Reject::Static("not a planned node"));
                };
                let kept = self.option_list(pool, &narrowed, zone, *capacity_type);
                (Some(narrowed), Some(kept))
            }
        };
        let opts: &[u32] = &options.as_ref().unwrap_or(&node.options).types;
        let types = &self.pools[pool].types;
        let start = if options.is_some() { 0 } else { node.pos };
        let pos = (start..opts.len())
            .find(|&i| fits(&need, &types[opts[i] as usize].alloc))
            .ok_or(Reject::Static(
                "no instance type left on this node holds the pod",
            ))?;
        self.min_values_ok(pool, &opts[pos..], &need)
            .map_err(Reject::Owned)?;
        // Limits: the node now counts as its cheapest fitting type.
        let new_reserved = types[opts[pos] as usize].capacity;
        let delta = sub(&new_reserved, &node.reserved);
        let remaining = &self.pools[pool].remaining;
        if (0..R).any(|i| remaining[i] != i64::MAX && delta[i] > remaining[i]) {
            return Err(Reject::Static("nodepool limits reached"));
        }
        self.topology_ok(p, n, active, can_create)?;
        Ok(PlannedFit {
            requirements,
            options,
            pos,
            reserved: new_reserved,
        })
    }

    fn apply_planned(&mut self, n: usize, fit: PlannedFit) {
        let NodeKind::Planned { pool, .. } = self.nodes[n].kind else {
            return;
        };
        let delta = sub(&fit.reserved, &self.nodes[n].reserved);
        let remaining = &mut self.pools[pool].remaining;
        for i in 0..R {
            if remaining[i] != i64::MAX {
                remaining[i] -= delta[i];
            }
        }
        let node = &mut self.nodes[n];
        node.reserved = fit.reserved;
        if let Some(r) = fit.requirements {
            let labels = Rc::make_mut(&mut node.labels);
            for (k, v) in r.single_valued_labels() {
                labels.entry(k).or_insert(v);
            }
            node.requirements = Rc::new(r);
        }
        if let Some(o) = fit.options {
            node.options = o;
        }
        node.pos = fit.pos;
        self.refresh_upper(n);
    }

    /// Recomputes a planned node's per-dimension upper bound over the types from its
    /// cheapest fitting one on (cheaper types that cannot hold its pods never will).
    pub(crate) fn refresh_upper(&mut self, n: usize) {
        let node = &mut self.nodes[n];
        if node.is_planned() {
            node.cap_upper = node.options.upper(node.pos);
        }
        self.reindex(n);
    }

    /// The pool's types (indices into its `types`) whose labels these requirements admit.
    fn compatible_types(&self, pool: usize, requirements: &Requirements) -> Rc<Vec<u32>> {
        let key = (pool, requirements.clone());
        if let Some(list) = self.compatible_cache.borrow().get(&key) {
            return list.clone();
        }
        let its = &self.input.pools[pool].instance_types;
        let list: Rc<Vec<u32>> = Rc::new(
            self.pools[pool]
                .types
                .iter()
                .enumerate()
                .filter(|(_, ti)| its[ti.index].requirements.intersects(requirements).is_ok())
                .map(|(t, _)| t as u32)
                .collect(),
        );
        self.compatible_cache.borrow_mut().insert(key, list.clone());
        list
    }

    /// The candidate types for nodes of a pool with these requirements in one zone and
    /// capacity type, cheapest first; shared between nodes.
    pub(crate) fn option_list(
        &self,
        pool: usize,
        requirements: &Requirements,
        zone: &str,
        ct: CapacityType,
    ) -> Rc<OptionList> {
        let key = (pool, requirements.clone(), zone.to_string(), ct);
        if let Some(list) = self.option_cache.borrow().get(&key) {
            return list.clone();
        }
        let its = &self.input.pools[pool].instance_types;
        let types = &self.pools[pool].types;
        let mut options: Vec<(f64, u32)> = Vec::new();
        for &t in self.compatible_types(pool, requirements).iter() {
            let it = &its[types[t as usize].index];
            if let Some(o) = it
                .offerings
                .iter()
                .find(|o| o.available && o.zone == zone && o.capacity_type == ct)
            {
                options.push((o.price_per_hour, t));
            }
        }
        options.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let list = Rc::new(OptionList::new(
            options.into_iter().map(|(_, t)| t).collect(),
            |t| types[t as usize].alloc,
        ));
        self.option_cache.borrow_mut().insert(key, list.clone());
        list
    }

    /// Karpenter's `minValues`: the types that still hold `need` must span enough distinct
    /// values of each such key, so a launch can fall back across them.
    pub(crate) fn min_values_ok(
        &self,
        pool: usize,
        options: &[u32],
        need: &ResV,
    ) -> Result<(), String> {
        let state = &self.pools[pool];
        if state.min_values.is_empty() {
            return Ok(());
        }
        let its = &self.input.pools[pool].instance_types;
        for (key, min) in &state.min_values {
            let values: BTreeSet<&str> = options
                .iter()
                .map(|&t| &state.types[t as usize])
                .filter(|ti| fits(need, &ti.alloc))
                .filter_map(|ti| {
                    its[ti.index]
                        .requirements
                        .get(key)
                        .and_then(|r| r.single_value())
                })
                .collect();
            if values.len() < *min {
                return Err(format!(
                    "minValues {min} on {key} not met: the types that fit span {} value(s)",
                    values.len()
                ));
            }
        }
        Ok(())
    }

    /// Whether pool `pi` could ever take pod `p` (taints and requirements).
    fn pool_admits(&self, pi: usize, p: usize, active: &Active) -> Result<(), String> {
        let pool = &self.input.pools[pi];
        let pod = &self.pods[p];
        if let Some(t) = taints::untolerated(
            &pool.taints,
            &pod.info.tolerations,
            active.prefer_no_schedule,
        ) {
            return Err(format!("does not tolerate taint {}", taints::describe(t)));
        }
        if !active.trivial
            && let Err(c) = first_ok(
                active
                    .node_requirements
                    .alternatives()
                    .iter()
                    .map(|a| a.compatible_allowing(&pool.requirements, &labels::is_well_known)),
            )
        {
            return Err(format!("incompatible requirements: {c}"));
        }
        Ok(())
    }

    /// Creates a node for pod `p` from the first pool (by weight) that can hold it.
    fn create_node(&mut self, p: usize, active: &Active) -> Result<usize, Vec<String>> {
        let mut reasons = Vec::new();
        for pi in 0..self.pools.len() {
            match self.plan_new(pi, p, active) {
                Ok(n) => return Ok(n),
                Err(r) => reasons.push(format!("nodepool {}: {r}", self.input.pools[pi].name)),
            }
        }
        if self.pools.is_empty() {
            reasons.push("no NodePool".to_string());
        }
        Err(reasons)
    }

    /// The ways a new node of pool `pi` can be made for pods with requirements `alt`
    /// (`None`: no requirements): compatible types, and per admitted zone and capacity type
    /// the node's requirements, labels and candidate types. Cached.
    fn templates(&self, pi: usize, alt: Option<&Requirements>) -> Rc<Templates> {
        let key = (pi, alt.cloned());
        if let Some(t) = self.template_cache.borrow().get(&key) {
            return t.clone();
        }
        let pool = &self.input.pools[pi];
        let base = match alt {
            Some(a) => pool.requirements.intersect(a),
            None => pool.requirements.clone(),
        };
        let compatible = self.compatible_types(pi, &base);
        let mut slots = Vec::new();
        for zone in &self.pools[pi].zones {
            if base
                .get(labels::ZONE)
                .is_some_and(|r| !r.admits_value(zone))
            {
                continue;
            }
            for ct in [CapacityType::OnDemand, CapacityType::Spot] {
                if base
                    .get(labels::CAPACITY_TYPE)
                    .is_some_and(|r| !r.admits_value(ct.as_str()))
                {
                    continue;
                }
                let requirements = base
                    .clone()
                    .with(Requirement::one_of(labels::ZONE, [zone.clone()]))
                    .with(Requirement::one_of(
                        labels::CAPACITY_TYPE,
                        [ct.as_str().to_string()],
                    ))
                    .with(Requirement::one_of(labels::NODE_POOL, [pool.name.clone()]));
                let options = self.option_list(pi, &requirements, zone, ct);
                let mut node_labels = pool.labels.clone();
                node_labels.extend(requirements.single_valued_labels());
                slots.push(Slot {
                    zone: zone.clone(),
                    capacity_type: ct,
                    requirements: Rc::new(requirements),
                    labels: Rc::new(node_labels),
                    options,
                });
            }
        }
        let t = Rc::new(Templates { compatible, slots });
        self.template_cache.borrow_mut().insert(key, t.clone());
        t
    }

    fn plan_new(&mut self, pi: usize, p: usize, active: &Active) -> Result<usize, String> {
        self.pool_admits(pi, p, active)?;
        let req = self.pods[p]
            .req
            .ok_or("requests an extended resource this pass cannot track")?;
        let input = self.input;
        let pool = &input.pools[pi];
        if self.pools[pi].nodes_remaining <= 0 {
            return Err("node limit reached".to_string());
        }
        // The requirements a new node would have: the pool's, narrowed by the first of the
        // pod's ORed alternatives that some instance type of the pool meets with room for
        // the pod (a term no size satisfies must not hide the next one), else the first
        // compatible alternative, for the reason.
        let alt = if active.trivial {
            None
        } else {
            let compatible: Vec<&Requirements> = active
                .node_requirements
                .alternatives()
                .iter()
                .filter(|a| {
                    a.compatible_allowing(&pool.requirements, &labels::is_well_known)
                        .is_ok()
                })
                .collect();
            compatible
                .iter()
                .find(|a| {
                    let templates = self.templates(pi, Some(a));
                    templates
                        .compatible
                        .iter()
                        .any(|&t| fits(&req, &self.pools[pi].types[t as usize].alloc))
                })
                .or(compatible.first())
                .map(|a| (*a).clone())
        };
        let templates = self.templates(pi, alt.as_ref());
        let state = &self.pools[pi];
        let its = &pool.instance_types;
        // Types compatible with the requirements that hold the pod.
        let compatible = &templates.compatible;
        let mut candidates: Vec<u32> = Vec::new();
        let mut largest: Option<u32> = None;
        let compatible_count = compatible.len();
        for &t in compatible.iter() {
            let ti = &state.types[t as usize];
            if largest.is_none_or(|l| {
                let a = &state.types[l as usize].alloc;
                (ti.alloc[1], ti.alloc[0]) > (a[1], a[0])
            }) {
                largest = Some(t);
            }
            if !fits(&req, &ti.alloc) {
                continue;
            }
            let within = (0..R)
                .all(|i| state.remaining[i] == i64::MAX || ti.capacity[i] <= state.remaining[i]);
            if within {
                candidates.push(t);
            }
        }
        if candidates.is_empty() {
            if compatible_count == 0 {
                return Err(
                    "no instance type satisfies the pod's and the pool's requirements".to_string(),
                );
            }
            let any_fits = compatible
                .iter()
                .any(|&t| fits(&req, &state.types[t as usize].alloc));
            if any_fits {
                return Err("limits reached".to_string());
            }
            let l = largest.map(|l| &state.types[l as usize]);
            let short = (0..R)
                .find(|&i| l.is_some_and(|l| req[i] > l.alloc[i]))
                .unwrap_or(0);
            return Err(match l {
                Some(l) => format!(
                    "no instance type has {} {} free after overhead and DaemonSets; largest allowed is {} ({} {})",
                    self.dims.show(short, req[short]),
                    self.dims.name(short),
                    its[l.index].name,
                    self.dims.show(short, l.alloc[short]),
                    self.dims.name(short),
                ),
                None => "no instance type fits".to_string(),
            });
        }
        // Zone and capacity type: for every admitted pair, the cheapest candidate offered
        // there, checked below against the pod's topology on zone.
        let mut is_candidate = vec![false; state.types.len()];
        for &t in &candidates {
            is_candidate[t as usize] = true;
        }
        let mut choices: Vec<(usize, f64)> = Vec::new();
        for (i, slot) in templates.slots.iter().enumerate() {
            let Some(&t) = slot
                .options
                .types
                .iter()
                .find(|&&t| is_candidate[t as usize])
            else {
                continue;
            };
            let price = its[state.types[t as usize].index]
                .offerings
                .iter()
                .find(|o| o.zone == slot.zone && o.capacity_type == slot.capacity_type)
                .map_or(f64::INFINITY, |o| o.price_per_hour);
            choices.push((i, price));
        }
        if choices.is_empty() {
            return Err("no available offering in an allowed zone and capacity type".to_string());
        }
        let zone_key = self
            .keys
            .iter()
            .position(|k| labels::canonical_key(k) == labels::ZONE);
        let mut best: Option<((i64, f64, usize, String), usize)> = None;
        let mut topo_reason = None;
        for &(slot_index, price) in &choices {
            let slot = &templates.slots[slot_index];
            let zone = &slot.zone;
            let zone_domain = zone_key.and_then(|k| self.domains[k].ids.get(zone).copied());
            // Check zone-keyed constraints for this zone.
            let mut ok = true;
            let mut spread_count = 0i64;
            if let Some(k) = zone_key {
                for c in &active.cons {
                    if self.groups[c.group].key_id != k {
                        continue;
                    }
                    let d = Some(zone_domain.unwrap_or(u32::MAX));
                    if let Err(e) = self.domain_ok(c, d, p, active, true) {
                        ok = false;
                        topo_reason = Some(e);
                        break;
                    }
                    if let Kind::Spread { .. } = self.groups[c.group].kind {
                        spread_count += i64::from(
                            zone_domain.map_or(0, |d| at(&self.groups[c.group].counts, d)),
                        );
                    }
                }
                if ok {
                    for &g in &self.pods[p].anti_targets {
                        let group = &self.groups[g];
                        if group.key_id == k
                            && zone_domain.is_some_and(|d| at(&group.owners, d) > 0)
                        {
                            ok = false;
                            topo_reason = Some(Reject::Topology(g, "symmetric"));
                        }
                    }
                }
            }
            if !ok {
                continue;
            }
            let balance = self.pools[pi]
                .planned_per_zone
                .get(zone)
                .copied()
                .unwrap_or(0);
            // Least-loaded zone for spread, then cheapest, then the zone with the fewest
            // planned nodes (keeps plain capacity spread), then by name.
            let better = best.as_ref().is_none_or(|(b, _)| {
                spread_count
                    .cmp(&b.0)
                    .then(price.total_cmp(&b.1))
                    .then(balance.cmp(&b.2))
                    .then_with(|| zone.cmp(&b.3))
                    .is_lt()
            });
            if better {
                best = Some(((spread_count, price, balance, zone.clone()), slot_index));
            }
        }
        let Some((_, slot_index)) = best else {
            return Err(topo_reason.map_or_else(
                || "no zone satisfies the pod's topology".to_string(),
                |r| self.reject_text(&r),
            ));
        };
        let slot = &templates.slots[slot_index];
        // Build the node.
        let state = &mut self.pools[pi];
        state.counter += 1;
        state.nodes_remaining -= 1;
        *state.planned_per_zone.entry(slot.zone.clone()).or_default() += 1;
        let name = format!(
            "{}{}-{}",
            self.options.name_prefix, pool.name, state.counter
        );
        let n = self.push_planned(pi, name, slot);
        match self
            .try_planned(p, n, active, true)
            .map_err(|r| self.reject_text(&r))
        {
            Ok(fit) => {
                self.apply_planned(n, fit);
                self.place(p, n);
                Ok(n)
            }
            Err(e) => {
                // Roll back the empty node.
                self.index.set(n, None);
                let node = self.nodes.pop();
                let state = &mut self.pools[pi];
                state.nodes_remaining += 1;
                state.counter -= 1;
                if let Some(Node {
                    kind: NodeKind::Planned { zone, .. },
                    ..
                }) = node
                    && let Some(c) = state.planned_per_zone.get_mut(&zone)
                {
                    *c -= 1;
                }
                Err(e)
            }
        }
    }

    /// The index query for a pod: its requests, and the hostname-keyed groups whose
    /// presence on a node rules the node out.
    fn query(&self, p: usize, active: &Active, can_create: bool) -> Query {
        let pod = &self.pods[p];
        let mut q = Query {
            need: pod.req.unwrap_or([0; R]),
            avoid_present: 0,
            avoid_owners: 0,
        };
        for c in &active.cons {
            let Some(bit) = self.host_bit[c.group] else {
                continue;
            };
            match self.groups[c.group].kind {
                Kind::Anti => q.avoid_present |= bit,
                // With a new node possible the smallest count is 0, so maxSkew 1 rules out
                // every node that already has a matching pod.
                Kind::Spread { max_skew: 1, .. } if can_create && c.self_match => {
                    q.avoid_present |= bit
                }
                _ => {}
            }
        }
        for &g in &pod.anti_targets {
            if let Some(bit) = self.host_bit[g] {
                q.avoid_owners |= bit;
            }
        }
        q
    }

    /// Places one pending pod, relaxing preferences as needed.
    fn schedule_pod(&mut self, p: usize) {
        if self.pods[p].req.is_none() {
            self.unschedulable.push((
                p,
                format!(
                    "requests more distinct extended resources than the simulation tracks ({EXT_SLOTS})"
                ),
            ));
            return;
        }
        let softs = self.softs(p);
        let mut last_reasons = Vec::new();
        for level in 0..=softs.len() {
            let active = self.active(p, &softs[..level]);
            let can_create =
                (0..self.pools.len()).any(|pi| self.pool_admits(pi, p, &active).is_ok());
            // 1. Existing and planned nodes, in order, through the first-fit index.
            let query = self.query(p, &active, can_create);
            let mut from = 0;
            let mut placed = None;
            while let Some(n) = self.index.first(from, &query) {
                if self.nodes[n].is_planned() {
                    if let Ok(fit) = self.try_planned(p, n, &active, can_create) {
                        self.apply_planned(n, fit);
                        placed = Some(n);
                        break;
                    }
                } else if self.try_existing(p, n, &active, can_create).is_ok() {
                    placed = Some(n);
                    break;
                }
                from = n + 1;
            }
            if let Some(n) = placed {
                self.place(p, n);
                self.pods[p].kept_requirements = Some(active.node_requirements);
                return;
            }
            // 2. A new node.
            match self.create_node(p, &active) {
                Ok(_) => {
                    self.pods[p].kept_requirements = Some(active.node_requirements);
                    return;
                }
                Err(r) => last_reasons = r,
            }
        }
        let active = self.active(p, &softs);
        let reason = self.explain(p, &active, &last_reasons);
        self.unschedulable.push((p, reason));
    }

    fn explain(&self, p: usize, active: &Active, pool_reasons: &[String]) -> String {
        let can_create = (0..self.pools.len()).any(|pi| self.pool_admits(pi, p, active).is_ok());
        let mut by_reason: BTreeMap<String, usize> = BTreeMap::new();
        let mut counted = 0;
        for (n, node) in self.nodes.iter().enumerate() {
            if node.retired {
                continue;
            }
            let r = if node.is_planned() {
                self.try_planned(p, n, active, can_create).err()
            } else {
                self.try_existing(p, n, active, can_create).err()
            };
            if let Some(r) = r {
                *by_reason.entry(self.reject_text(&r)).or_default() += 1;
                counted += 1;
            }
        }
        let mut parts = Vec::new();
        if counted > 0 {
            let mut list: Vec<(String, usize)> = by_reason.into_iter().collect();
            list.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            let shown: Vec<String> = list
                .iter()
                .take(3)
                .map(|(r, c)| format!("{c} {r}"))
                .collect();
            parts.push(format!("0/{counted} nodes fit ({})", shown.join(", ")));
        }
        parts.extend(pool_reasons.iter().cloned());
        parts.join("; ")
    }

    /// Runs the placement pass over every pending pod.
    pub(crate) fn run(&mut self) {
        let pending = self.input.pending.len();
        let mut order: Vec<usize> = (0..pending).collect();
        // Largest first (CPU, then memory), as Karpenter orders its queue; name breaks ties
        // so the result does not depend on input order.
        order.sort_by(|&a, &b| {
            let ra = self.pods[a].req.unwrap_or([0; R]);
            let rb = self.pods[b].req.unwrap_or([0; R]);
            rb[0]
                .cmp(&ra[0])
                .then(rb[1].cmp(&ra[1]))
                .then_with(|| self.pods[a].info.key.cmp(&self.pods[b].info.key))
        });
        for p in order {
            self.schedule_pod(p);
        }
    }

    /// Appends an empty planned node with the given requirements; its options are every
    /// compatible type offered in its zone and capacity type, cheapest first.
    pub(crate) fn push_planned(&mut self, pi: usize, name: String, slot: &Slot) -> usize {
        let pool = &self.input.pools[pi];
        let mut node = Node {
            name,
            kind: NodeKind::Planned {
                pool: pi,
                zone: slot.zone.clone(),
                capacity_type: slot.capacity_type,
            },
            labels: slot.labels.clone(),
            requirements: slot.requirements.clone(),
            taints: pool.taints.clone(),
            used: [0; R],
            cap_upper: slot.options.upper(0),
            options: slot.options.clone(),
            pos: 0,
            pods: Vec::new(),
            host_ports: Vec::new(),
            domains: Vec::new(),
            reserved: [0; R],
            cordoned: false,
            retired: false,
            present_mask: 0,
            owner_mask: 0,
        };
        node.domains = self.node_domains(&node);
        let n = self.nodes.len();
        self.nodes.push(node);
        self.reindex(n);
        n
    }

    /// A one-off template for a node of pool `pi` with the given requirements.
    pub(crate) fn slot_for(
        &self,
        pi: usize,
        requirements: Requirements,
        zone: &str,
        ct: CapacityType,
    ) -> Slot {
        let options = self.option_list(pi, &requirements, zone, ct);
        let mut node_labels = self.input.pools[pi].labels.clone();
        node_labels.extend(requirements.single_valued_labels());
        Slot {
            zone: zone.to_string(),
            capacity_type: ct,
            requirements: Rc::new(requirements),
            labels: Rc::new(node_labels),
            options,
        }
    }

    /// Recomputes a planned node's options from its pool (after pods left it), its
    /// cheapest fitting type and the capacity it counts against the pool's limits. An
    /// empty node is retired and its node count given back.
    pub(crate) fn rebuild_options(&mut self, n: usize) {
        let NodeKind::Planned {
            pool,
            ref zone,
            capacity_type,
        } = self.nodes[n].kind
        else {
            return;
        };
        let zone = zone.clone();
        let options = self.option_list(pool, &self.nodes[n].requirements, &zone, capacity_type);
        let types = &self.pools[pool].types;
        let node = &self.nodes[n];
        let pos = options
            .types
            .iter()
            .position(|&t| fits(&node.used, &types[t as usize].alloc))
            .unwrap_or(options.types.len());
        let reserved = if node.pods.is_empty() {
            [0; R]
        } else {
            options
                .types
                .get(pos)
                .map_or(node.reserved, |&t| types[t as usize].capacity)
        };
        let delta = sub(&reserved, &node.reserved);
        self.pools[pool].charge(&delta);
        let node = &mut self.nodes[n];
        node.reserved = reserved;
        node.options = options;
        node.pos = pos;
        self.refresh_upper(n);
    }

    /// Gives back an emptied planned node.
    pub(crate) fn retire(&mut self, n: usize) {
        let NodeKind::Planned { pool, ref zone, .. } = self.nodes[n].kind else {
            return;
        };
        if self.nodes[n].retired || !self.nodes[n].pods.is_empty() {
            return;
        }
        let zone = zone.clone();
        let reserved = self.nodes[n].reserved;
        let state = &mut self.pools[pool];
        state.nodes_remaining += 1;
        if let Some(c) = state.planned_per_zone.get_mut(&zone) {
            *c = c.saturating_sub(1);
        }
        state.charge(&reserved.map(|v| -v));
        let node = &mut self.nodes[n];
        node.reserved = [0; R];
        node.retired = true;
        node.options = Rc::default();
        node.cap_upper = [0; R];
        self.reindex(n);
    }

    /// Saves the mutable state of the pass.
    pub(crate) fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            nodes: self.nodes.clone(),
            groups: self.groups.clone(),
            pools: self.pools.clone(),
            domains: self.domains.clone(),
            pod_nodes: self.pods.iter().map(|p| p.node).collect(),
            index: self.index.clone(),
        }
    }

    /// Restores a saved state.
    pub(crate) fn restore(&mut self, c: Checkpoint) {
        self.nodes = c.nodes;
        self.groups = c.groups;
        self.pools = c.pools;
        self.domains = c.domains;
        self.index = c.index;
        for (p, n) in self.pods.iter_mut().zip(c.pod_nodes) {
            p.node = n;
        }
    }

    /// The price and instance type index chosen for a planned node: its cheapest option
    /// that holds its pods.
    pub(crate) fn chosen_type(&self, n: usize) -> Option<(usize, f64, bool)> {
        let node = &self.nodes[n];
        let NodeKind::Planned {
            pool,
            ref zone,
            capacity_type,
        } = node.kind
        else {
            return None;
        };
        let types = &self.pools[pool].types;
        let its = &self.input.pools[pool].instance_types;
        node.options.types[node.pos.min(node.options.types.len())..]
            .iter()
            .find(|&&t| fits(&node.used, &types[t as usize].alloc))
            .and_then(|&t| {
                let it = &its[types[t as usize].index];
                it.offerings
                    .iter()
                    .find(|o| o.zone == *zone && o.capacity_type == capacity_type)
                    .map(|o| (t as usize, o.price_per_hour, o.price_is_estimate))
            })
    }
}

struct PlannedFit {
    requirements: Option<Requirements>,
    options: Option<Rc<OptionList>>,
    pos: usize,
    reserved: ResV,
}

fn first_ok<E, I: Iterator<Item = Result<(), E>>>(mut it: I) -> Result<(), E> {
    let mut first = None;
    for r in it.by_ref() {
        match r {
            Ok(()) => return Ok(()),
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    match first {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
