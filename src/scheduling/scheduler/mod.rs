//! The scheduling simulation: places pending pods on existing nodes, on nodes planned in
//! this pass, or on new nodes from NodePools, with kube-scheduler's constraints.
//!
//! The placement pass follows Karpenter's order (largest pods first; existing nodes, then
//! planned nodes, then a new node from the highest-weight NodePool that works; preferences
//! treated as requirements and relaxed one at a time only when a pod cannot land). The
//! packer (see [`super::packing`]) then re-packs pods that carry no inter-pod constraint
//! onto the cheapest set of instance types.
//!
//! This module holds the pass's state, its construction and the run loop; each concept
//! has its own file (as Karpenter splits its scheduler):
//! - `resources`: resource vectors and extended-resource slots;
//! - `topology`: spread and pod (anti-)affinity groups, domains, skew;
//! - `preferences`: preferred terms and their relaxation;
//! - `templates`: what new nodes a NodePool can make, and whether it admits a pod;
//! - `nodes`: existing and planned nodes, their room and cheapest type;
//! - `placement`: whether a node can take a pod, recording it, making a new node;
//! - `output`: the [`Plan`](crate::scheduling::Plan) the final state describes;
//! - `planning`: the packer's narrow view of the state ([`Planning`]).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

// Fx hashing: the keys are our own strings and requirement sets, not attacker input.
use rustc_hash::FxHashMap as HashMap;

use super::ids::{Id, IdVec, NodeId, PodId, PoolId, TypeId};
use super::index::NodeIndex;
use super::input::Input;
use super::pod::PodInfo;
use crate::apis::labels;
use crate::model::NodeRequirements;

mod nodes;
mod output;
mod placement;
mod planning;
mod preferences;
mod resources;
mod templates;
mod topology;

use nodes::Node;
pub(crate) use planning::Planning;
use preferences::Active;
use resources::{Dims, EXT_SLOTS};
pub(crate) use resources::{R, ResV, fits};
use templates::{CompatibleKey, OptionKey, OptionList, PoolState, TemplateKey, Templates};
use topology::{Con, Group, GroupKey, Interner, Kind, spread_key, term_key};

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

/// A pod of the pass: its requests, its constraints as groups, and where it is.
#[derive(Debug)]
struct PodState<'a> {
    info: &'a PodInfo,
    req: Option<ResV>,
    required: Vec<Con>,
    soft_spread: Vec<Con>,
    soft_anti: Vec<Con>,
    soft_affinity: Vec<Con>,
    /// Groups whose selector matches this pod (counted on placement).
    matches: Vec<usize>,
    /// Required anti-affinity groups whose selector matches this pod (symmetry).
    anti_targets: Vec<usize>,
    /// Groups this pod owns as a required anti-affinity term.
    owns_anti: Vec<usize>,
    /// The node it is on.
    node: Option<NodeId>,
    /// The node requirements in force when the placement pass placed the pod: its required
    /// terms plus the preferred terms it did not have to relax. The packer moves the pod
    /// only within these, so a preference relaxed nowhere is not dropped for a cheaper
    /// node (Karpenter treats preferences as requirements until the pod cannot land).
    kept_requirements: Option<NodeRequirements>,
    trivial_requirements: bool,
}

/// The working state of one pass.
pub(crate) struct Scheduler<'a> {
    input: &'a Input,
    dims: Dims,
    pods: IdVec<PodId, PodState<'a>>,
    nodes: IdVec<NodeId, Node>,
    groups: Vec<Group>,
    keys: Vec<String>,
    domains: Vec<Interner>,
    pools: IdVec<PoolId, PoolState>,
    unschedulable: Vec<(PodId, String)>,
    options: Options,
    /// First-fit index over nodes.
    index: NodeIndex,
    /// Bit per hostname-keyed group (at most 64 groups get one).
    host_bit: Vec<Option<u64>>,
    /// Option lists by pool, requirements, zone and capacity type.
    option_cache: RefCell<HashMap<OptionKey, Rc<OptionList>>>,
    /// New-node templates by pool and pod requirements.
    template_cache: RefCell<HashMap<TemplateKey, Rc<Templates>>>,
    /// Compatible types by pool and requirements.
    compatible_cache: RefCell<HashMap<CompatibleKey, Rc<Vec<TypeId>>>>,
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
            pods: IdVec::new(),
            nodes: IdVec::new(),
            groups: Vec::new(),
            keys: Vec::new(),
            domains: Vec::new(),
            pools: IdVec::new(),
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
            let node = self.existing_node(n);
            let id = self.nodes.push(node);
            self.reindex(id);
            for _ in &n.pods {
                self.place(PodId::new(pod_id), id);
                pod_id += 1;
            }
        }
    }

    /// Places one pending pod, relaxing preferences as needed.
    fn schedule_pod(&mut self, p: PodId) {
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
            let can_create = self
                .pools
                .ids()
                .any(|pi| self.pool_admits(pi, p, &active).is_ok());
            // 1. Existing and planned nodes, in order, through the first-fit index.
            let query = self.query(p, &active, can_create);
            let mut from = 0;
            let mut placed = None;
            while let Some(n) = self.index.first(from, &query).map(NodeId::new) {
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
                from = n.index() + 1;
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

    fn explain(&self, p: PodId, active: &Active, pool_reasons: &[String]) -> String {
        let can_create = self
            .pools
            .ids()
            .any(|pi| self.pool_admits(pi, p, active).is_ok());
        let mut by_reason: BTreeMap<String, usize> = BTreeMap::new();
        let mut counted = 0;
        for (n, node) in self.nodes.enumerate() {
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
        let mut order: Vec<PodId> = (0..pending).map(PodId::new).collect();
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
}
