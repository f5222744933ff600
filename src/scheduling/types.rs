//! A NodePool's instance types as planning shares them: one list behind every copy of the
//! pool a pass makes (disruption weighs each candidate on a copy of the cluster, and a
//! pass may weigh dozens), with what the scheduler derives from the list and a set of
//! requirements worked out once for all of them rather than once per copy.
//!
//! The derived facts are functions of the list and their key only, so sharing them changes
//! no decision: a scheduler given a fresh list computes the same answers.

use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, Mutex, PoisonError};

// Fx hashing: the keys are requirement sets the cluster's own objects make.
use rustc_hash::FxHashMap as HashMap;

use crate::model::{InstanceType, Requirements};

/// Entries of each memo before it starts again: a bound on what a list can hold when pods
/// bring ever new requirements (each entry is one small vector per type).
const MEMO_ENTRIES: usize = 4096;

/// A pool's instance types, shared between copies of the pool. Dereferences to the types.
#[derive(Clone, Default)]
pub struct PoolTypes(Arc<Shared>);

#[derive(Default)]
struct Shared {
    types: Vec<InstanceType>,
    memo: Mutex<Memo>,
}

#[derive(Default)]
struct Memo {
    /// Per pool requirements: each type's node requirements (the pool's narrowed by the
    /// type's labels).
    narrowed: HashMap<Requirements, Arc<Vec<Requirements>>>,
    /// Per requirements: whether each type's labels admit them.
    admits: HashMap<Requirements, Arc<Vec<bool>>>,
    /// Per pool requirements: the types they admit, as a list of its own.
    admitted: HashMap<Requirements, PoolTypes>,
}

impl PoolTypes {
    /// A list of its own.
    pub fn new(types: Vec<InstanceType>) -> Self {
        PoolTypes(Arc::new(Shared {
            types,
            memo: Mutex::default(),
        }))
    }

    /// The node requirements of each type under a pool's `requirements`: the pool's
    /// narrowed by the type's own labels, in list order.
    pub fn narrowed(&self, requirements: &Requirements) -> Arc<Vec<Requirements>> {
        self.remembered(
            |m| &mut m.narrowed,
            requirements,
            |types| {
                Arc::new(
                    types
                        .iter()
                        .map(|it| requirements.intersect(&it.requirements))
                        .collect(),
                )
            },
        )
    }

    /// Whether each type's labels admit `requirements`, in list order.
    pub fn admitting(&self, requirements: &Requirements) -> Arc<Vec<bool>> {
        self.remembered(
            |m| &mut m.admits,
            requirements,
            |types| {
                Arc::new(
                    types
                        .iter()
                        .map(|it| it.requirements.intersects(requirements).is_ok())
                        .collect(),
                )
            },
        )
    }

    /// The types whose labels a pool's `requirements` admit (keys a type does not define,
    /// such as a pool's own template labels, are left to the pool), as a list of its own
    /// that later calls with the same requirements share.
    pub fn admitted_by(&self, requirements: &Requirements) -> PoolTypes {
        self.remembered(
            |m| &mut m.admitted,
            requirements,
            |types| {
                types
                    .iter()
                    .filter(|it| requirements.intersects(&it.requirements).is_ok())
                    .cloned()
                    .collect()
            },
        )
    }

    /// What `derive` makes of the types for `key`, from the memo `table` picks when it is
    /// there (made outside the lock, then kept).
    fn remembered<V: Clone>(
        &self,
        table: fn(&mut Memo) -> &mut HashMap<Requirements, V>,
        key: &Requirements,
        derive: impl FnOnce(&[InstanceType]) -> V,
    ) -> V {
        if let Some(v) = table(&mut self.memo()).get(key) {
            return v.clone();
        }
        let v = derive(&self.0.types);
        let mut memo = self.memo();
        let entries = table(&mut memo);
        if entries.len() >= MEMO_ENTRIES {
            entries.clear();
        }
        entries.insert(key.clone(), v.clone());
        v
    }

    fn memo(&self) -> std::sync::MutexGuard<'_, Memo> {
        self.0.memo.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Deref for PoolTypes {
    type Target = [InstanceType];

    fn deref(&self) -> &[InstanceType] {
        &self.0.types
    }
}

impl From<Vec<InstanceType>> for PoolTypes {
    fn from(types: Vec<InstanceType>) -> Self {
        PoolTypes::new(types)
    }
}

impl FromIterator<InstanceType> for PoolTypes {
    fn from_iter<I: IntoIterator<Item = InstanceType>>(iter: I) -> Self {
        PoolTypes::new(iter.into_iter().collect())
    }
}

impl<'a> IntoIterator for &'a PoolTypes {
    type Item = &'a InstanceType;
    type IntoIter = std::slice::Iter<'a, InstanceType>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.types.iter()
    }
}

impl fmt::Debug for PoolTypes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.types.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::labels;
    use crate::model::Requirement;

    fn types() -> PoolTypes {
        let catalog = crate::catalog::Catalog::builtin().expect("built-in catalog");
        catalog
            .instance_types(&crate::catalog::CatalogOptions::for_region("eastus"))
            .expect("eastus types")
            .into_iter()
            .take(12)
            .collect()
    }

    #[test]
    fn copies_share_the_list_and_what_is_derived_from_it() {
        let a = types();
        let b = a.clone();
        assert!(std::ptr::eq(a.as_ptr(), b.as_ptr()));
        let first = a[0].name.clone();
        let req =
            Requirements::new().with(Requirement::one_of(labels::INSTANCE_TYPE, [first.clone()]));
        let admits = a.admitting(&req);
        // Only the named size admits it, and the copy gets the very same answer.
        assert_eq!(admits.iter().filter(|x| **x).count(), 1);
        assert!(admits[0]);
        assert!(Arc::ptr_eq(&admits, &b.admitting(&req)));
    }

    #[test]
    fn derived_facts_equal_a_fresh_computation() {
        let a = types();
        let pool = Requirements::new().with(Requirement::one_of(
            labels::CAPACITY_TYPE,
            [labels::CAPACITY_TYPE_SPOT],
        ));
        let narrowed = a.narrowed(&pool);
        assert_eq!(narrowed.len(), a.len());
        for (it, n) in a.iter().zip(narrowed.iter()) {
            assert_eq!(n, &pool.intersect(&it.requirements));
            assert_ne!(n, &pool, "the type's labels narrow the pool's requirements");
        }
        let admits = a.admitting(&pool);
        for (it, x) in a.iter().zip(admits.iter()) {
            assert_eq!(*x, it.requirements.intersects(&pool).is_ok());
        }
    }
}
