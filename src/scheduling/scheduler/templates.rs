//! What new nodes a NodePool can make: its instance types less DaemonSet overhead, its
//! limits and zones, the types a node's requirements admit (cheapest first per zone and
//! capacity type), `minValues`, and whether a pool could take a pod at all.

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::Arc;

use super::Scheduler;
use super::preferences::Active;
use super::resources::{R, ResV, add, fits, sub, vmax};
use crate::apis::labels;
use crate::model::requirements::first_success;
use crate::model::{CapacityType, Dimension, Requirement, Requirements};
use crate::scheduling::ids::{Id, IdVec, PodId, PoolId, TypeId};
use crate::scheduling::input::Pool;
use crate::scheduling::taints;

/// An instance type a pool can make, with the room its DaemonSets leave.
#[derive(Debug, Clone)]
pub(super) struct TypeInfo {
    /// Index into the pool's instance types.
    pub(super) index: usize,
    /// Allocatable less the DaemonSets that would run on it.
    pub(super) alloc: ResV,
    /// Capacity, for limits.
    pub(super) capacity: ResV,
    /// DaemonSet overhead.
    pub(super) overhead: ResV,
    pub(super) daemon_sets: Vec<usize>,
}

/// A NodePool during the pass: its types, what its limits still allow, its zones and its
/// planned nodes.
#[derive(Debug, Clone)]
pub(super) struct PoolState {
    pub(super) types: IdVec<TypeId, TypeInfo>,
    /// Remaining limit per dimension (`i64::MAX` when unlimited).
    pub(super) remaining: ResV,
    pub(super) nodes_remaining: i64,
    pub(super) zones: Vec<String>,
    pub(super) planned_per_zone: BTreeMap<String, usize>,
    pub(super) counter: usize,
    /// Requirements with `minValues`: a node's fitting types must span that many values.
    pub(super) min_values: Vec<(String, usize)>,
}

impl PoolState {
    /// Counts `delta` of capacity against the limited dimensions (negative gives back).
    pub(super) fn charge(&mut self, delta: &ResV) {
        for (left, d) in self.remaining.iter_mut().zip(delta) {
            if *left != i64::MAX {
                *left -= d;
            }
        }
    }
}

/// Option lists are keyed by pool, node requirements, zone and capacity type.
pub(super) type OptionKey = (PoolId, Requirements, String, CapacityType);

/// Compatible type lists are keyed by pool and requirements.
pub(super) type CompatibleKey = (PoolId, Requirements);

/// Templates are keyed by pool and the pod's requirements (`None`: none).
pub(super) type TemplateKey = (PoolId, Option<Requirements>);

/// How new nodes of one pool are made for pods with given requirements.
pub(super) struct Templates {
    /// Types (indices into the pool's `types`) the requirements admit.
    pub(super) compatible: Rc<Vec<TypeId>>,
    /// One per admitted zone and capacity type.
    pub(super) slots: Vec<Slot>,
}

/// A new node's zone, capacity type, requirements, labels and candidate types.
pub(super) struct Slot {
    pub(super) zone: String,
    pub(super) capacity_type: CapacityType,
    pub(super) requirements: Arc<Requirements>,
    pub(super) labels: Arc<BTreeMap<String, String>>,
    pub(super) options: Rc<OptionList>,
}

/// A planned node's candidate types for its zone and capacity type, cheapest first, with the
/// per-dimension maximum allocatable over each suffix of the list.
#[derive(Debug, Default)]
pub(super) struct OptionList {
    pub(super) types: Vec<TypeId>,
    pub(super) suffix_max: Vec<ResV>,
}

impl OptionList {
    pub(super) fn new(types: Vec<TypeId>, alloc: impl Fn(TypeId) -> ResV) -> Self {
        let mut suffix_max = vec![[0; R]; types.len() + 1];
        for i in (0..types.len()).rev() {
            suffix_max[i] = vmax(&suffix_max[i + 1], &alloc(types[i]));
        }
        OptionList { types, suffix_max }
    }

    /// The largest allocatable per dimension over the types from `pos` on.
    pub(super) fn upper(&self, pos: usize) -> ResV {
        self.suffix_max.get(pos).copied().unwrap_or([0; R])
    }
}

impl Scheduler<'_> {
    pub(super) fn pool_state(&self, pool: &Pool) -> PoolState {
        let mut types = IdVec::new();
        // Every type's node requirements, shared by the pool's copies.
        let narrowed = (!self.input.daemon_sets.is_empty())
            .then(|| pool.instance_types.narrowed(&pool.requirements));
        let none = Requirements::new();
        for (index, it) in pool.instance_types.iter().enumerate() {
            let (Some(alloc), Some(capacity)) =
                (self.dims.vec(&it.allocatable), self.dims.vec(&it.capacity))
            else {
                continue;
            };
            // DaemonSets whose pods would run on this type in this pool.
            let node_reqs = match &narrowed {
                None => &none,
                Some(n) => &n[index],
            };
            let mut overhead = [0; R];
            let mut daemon_sets = Vec::new();
            for (d, ds) in self.input.daemon_sets.iter().enumerate() {
                let tolerated = taints::untolerated(&pool.taints, &ds.tolerations, false).is_none();
                let selected = ds
                    .node_requirements
                    .alternatives()
                    .iter()
                    .any(|a| a.compatible_allowing(node_reqs, &|_| false).is_ok());
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

    /// The pool's types (indices into its `types`) whose labels these requirements admit.
    pub(super) fn compatible_types(
        &self,
        pool: PoolId,
        requirements: &Requirements,
    ) -> Rc<Vec<TypeId>> {
        let key = (pool, requirements.clone());
        if let Some(list) = self.compatible_cache.borrow().get(&key) {
            return list.clone();
        }
        let admits = self.input.pools[pool.index()]
            .instance_types
            .admitting(requirements);
        let list: Rc<Vec<TypeId>> = Rc::new(
            self.pools[pool]
                .types
                .enumerate()
                .filter(|(_, ti)| admits[ti.index])
                .map(|(t, _)| t)
                .collect(),
        );
        self.compatible_cache.borrow_mut().insert(key, list.clone());
        list
    }

    /// The candidate types for nodes of a pool with these requirements in one zone and
    /// capacity type, cheapest first; shared between nodes.
    pub(super) fn option_list(
        &self,
        pool: PoolId,
        requirements: &Requirements,
        zone: &str,
        ct: CapacityType,
    ) -> Rc<OptionList> {
        let key = (pool, requirements.clone(), zone.to_string(), ct);
        if let Some(list) = self.option_cache.borrow().get(&key) {
            return list.clone();
        }
        let its = &self.input.pools[pool.index()].instance_types;
        let types = &self.pools[pool].types;
        let mut options: Vec<(f64, TypeId)> = Vec::new();
        for &t in self.compatible_types(pool, requirements).iter() {
            let it = &its[types[t].index];
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
            |t| types[t].alloc,
        ));
        self.option_cache.borrow_mut().insert(key, list.clone());
        list
    }

    /// Karpenter's `minValues`: the types that still hold `need` must span enough distinct
    /// values of each such key, so a launch can fall back across them.
    pub(super) fn min_values_ok(
        &self,
        pool: PoolId,
        options: &[TypeId],
        need: &ResV,
    ) -> Result<(), String> {
        let state = &self.pools[pool];
        if state.min_values.is_empty() {
            return Ok(());
        }
        let its = &self.input.pools[pool.index()].instance_types;
        for (key, min) in &state.min_values {
            let values: BTreeSet<&str> = options
                .iter()
                .map(|&t| &state.types[t])
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
    pub(super) fn pool_admits(&self, pi: PoolId, p: PodId, active: &Active) -> Result<(), String> {
        let pool = &self.input.pools[pi.index()];
        let pod = &self.pods[p];
        if let Some(t) = taints::untolerated(
            &pool.taints,
            &pod.info.tolerations,
            active.prefer_no_schedule,
        ) {
            return Err(format!("does not tolerate taint {}", taints::describe(t)));
        }
        if !active.trivial
            && let Err(c) = first_success(
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

    /// The ways a new node of pool `pi` can be made for pods with requirements `alt`
    /// (`None`: no requirements): compatible types, and per admitted zone and capacity type
    /// the node's requirements, labels and candidate types. Cached.
    pub(super) fn templates(&self, pi: PoolId, alt: Option<&Requirements>) -> Rc<Templates> {
        let key = (pi, alt.cloned());
        if let Some(t) = self.template_cache.borrow().get(&key) {
            return t.clone();
        }
        let pool = &self.input.pools[pi.index()];
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
                    requirements: Arc::new(requirements),
                    labels: Arc::new(node_labels),
                    options,
                });
            }
        }
        let t = Rc::new(Templates { compatible, slots });
        self.template_cache.borrow_mut().insert(key, t.clone());
        t
    }

    /// A one-off template for a node of pool `pi` with the given requirements.
    pub(super) fn slot_for(
        &self,
        pi: PoolId,
        requirements: Requirements,
        zone: &str,
        ct: CapacityType,
    ) -> Slot {
        let options = self.option_list(pi, &requirements, zone, ct);
        let mut node_labels = self.input.pools[pi.index()].labels.clone();
        node_labels.extend(requirements.single_valued_labels());
        Slot {
            zone: zone.to_string(),
            capacity_type: ct,
            requirements: Arc::new(requirements),
            labels: Arc::new(node_labels),
            options,
        }
    }
}
