//! Typed indices for the scheduler's and the packer's tables, so that a pod's index cannot
//! be passed where a node's is expected: `place(pod, node)` reads itself, and the compiler
//! checks it. Each id indexes its own [`IdVec`].

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Index, IndexMut};

/// An index into one kind of table.
pub(crate) trait Id: Copy {
    /// The id of the `i`th entry.
    fn new(i: usize) -> Self;
    /// The position this id stands for.
    fn index(self) -> usize;
}

macro_rules! id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub(crate) struct $name(u32);

        impl Id for $name {
            fn new(i: usize) -> Self {
                // Tables are built from an input held in memory: far fewer than 2^32
                // pods, nodes, pools or types, so the conversion cannot fail.
                $name(u32::try_from(i).expect("fewer than 2^32 entries"))
            }

            fn index(self) -> usize {
                self.0 as usize
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

id!(
    /// A pod of the pass: pending pods first, in input order, then pods already on nodes.
    PodId
);
id!(
    /// A node of the pass: existing nodes first, in input order, then planned nodes.
    NodeId
);
id!(
    /// A NodePool, in input order (highest weight first).
    PoolId
);
id!(
    /// One of a NodePool's instance types that its DaemonSets leave room on.
    TypeId
);

/// A vector indexed by one kind of id.
pub(crate) struct IdVec<I, T> {
    items: Vec<T>,
    id: PhantomData<fn(I) -> I>,
}

impl<I: Id, T> IdVec<I, T> {
    /// An empty table.
    pub(crate) fn new() -> Self {
        IdVec {
            items: Vec::new(),
            id: PhantomData,
        }
    }

    /// Appends an entry and returns its id.
    pub(crate) fn push(&mut self, item: T) -> I {
        let id = I::new(self.items.len());
        self.items.push(item);
        id
    }

    /// Removes the last entry.
    pub(crate) fn pop(&mut self) -> Option<T> {
        self.items.pop()
    }

    /// How many entries there are.
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether there is no entry.
    pub(crate) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Every id, in order.
    pub(crate) fn ids(&self) -> impl DoubleEndedIterator<Item = I> + use<I, T> {
        (0..self.items.len()).map(I::new)
    }

    /// The entries, in order.
    pub(crate) fn iter(&self) -> std::slice::Iter<'_, T> {
        self.items.iter()
    }

    /// The entries, in order, for change.
    pub(crate) fn iter_mut(&mut self) -> std::slice::IterMut<'_, T> {
        self.items.iter_mut()
    }

    /// Each entry with its id, in order.
    pub(crate) fn enumerate(&self) -> impl DoubleEndedIterator<Item = (I, &T)> {
        self.items.iter().enumerate().map(|(i, t)| (I::new(i), t))
    }
}

impl<I: Id, T> Default for IdVec<I, T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<I, T: Clone> Clone for IdVec<I, T> {
    fn clone(&self) -> Self {
        IdVec {
            items: self.items.clone(),
            id: PhantomData,
        }
    }
}

impl<I, T: fmt::Debug> fmt::Debug for IdVec<I, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.items.fmt(f)
    }
}

impl<I: Id, T> FromIterator<T> for IdVec<I, T> {
    fn from_iter<It: IntoIterator<Item = T>>(iter: It) -> Self {
        IdVec {
            items: iter.into_iter().collect(),
            id: PhantomData,
        }
    }
}

impl<I: Id, T> Index<I> for IdVec<I, T> {
    type Output = T;

    fn index(&self, id: I) -> &T {
        &self.items[id.index()]
    }
}

impl<I: Id, T> IndexMut<I> for IdVec<I, T> {
    fn index_mut(&mut self, id: I) -> &mut T {
        &mut self.items[id.index()]
    }
}

impl<'v, I, T> IntoIterator for &'v mut IdVec<I, T> {
    type Item = &'v mut T;
    type IntoIter = std::slice::IterMut<'v, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.iter_mut()
    }
}

impl<'v, I, T> IntoIterator for &'v IdVec<I, T> {
    type Item = &'v T;
    type IntoIter = std::slice::Iter<'v, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}
