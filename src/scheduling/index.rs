//! A first-fit index over nodes: finds the lowest-numbered node whose free resources hold
//! a request, skipping whole ranges of nodes that cannot, in logarithmic time.
//!
//! Each leaf holds a node's free resources and two bit masks of hostname-keyed constraint
//! groups: groups with a matching pod on the node, and groups with a pod *owning* a required
//! anti-affinity term on the node. An inner entry keeps the per-dimension maximum of free
//! resources and the AND of the masks below it, so a range is skipped when no node in it
//! has the room, or when every node in it holds a pod the request must avoid. The index
//! only prunes; every node it returns is still checked in full.

use super::scheduler::{R, ResV};

#[derive(Debug, Clone, Copy)]
struct Entry {
    free: ResV,
    present: u64,
    owners: u64,
}

const EMPTY: Entry = Entry {
    free: [i64::MIN; R],
    present: u64::MAX,
    owners: u64::MAX,
};

fn merge(a: &Entry, b: &Entry) -> Entry {
    Entry {
        free: std::array::from_fn(|i| a.free[i].max(b.free[i])),
        present: a.present & b.present,
        owners: a.owners & b.owners,
    }
}

/// What a query asks for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Query {
    /// Resources the node must have free.
    pub(crate) need: ResV,
    /// Skip nodes that have a matching pod of any of these groups.
    pub(crate) avoid_present: u64,
    /// Skip nodes that have an owner pod of any of these groups.
    pub(crate) avoid_owners: u64,
}

/// A segment tree over node indices.
#[derive(Debug, Clone, Default)]
pub(crate) struct NodeIndex {
    size: usize,
    tree: Vec<Entry>,
}

impl NodeIndex {
    fn grow(&mut self, n: usize) {
        if n < self.size {
            return;
        }
        let mut size = self.size.max(64);
        while size <= n {
            size *= 2;
        }
        let mut tree = vec![EMPTY; 2 * size];
        tree[size..size + self.size].copy_from_slice(&self.tree[self.size..2 * self.size]);
        for i in (1..size).rev() {
            tree[i] = merge(&tree[2 * i], &tree[2 * i + 1]);
        }
        self.size = size;
        self.tree = tree;
    }

    /// Sets node `n`'s free resources and masks; a closed node gets `None`.
    pub(crate) fn set(&mut self, n: usize, value: Option<(ResV, u64, u64)>) {
        self.grow(n);
        let mut i = self.size + n;
        self.tree[i] = match value {
            Some((free, present, owners)) => Entry {
                free,
                present,
                owners,
            },
            None => EMPTY,
        };
        while i > 1 {
            i /= 2;
            self.tree[i] = merge(&self.tree[2 * i], &self.tree[2 * i + 1]);
        }
    }

    fn prunes(e: &Entry, q: &Query) -> bool {
        (0..R).any(|d| e.free[d] < q.need[d])
            || e.present & q.avoid_present != 0
            || e.owners & q.avoid_owners != 0
    }

    /// The lowest node index `>= from` not pruned by the query.
    pub(crate) fn first(&self, from: usize, q: &Query) -> Option<usize> {
        if self.size == 0 || from >= self.size {
            return None;
        }
        self.descend(1, 0, self.size, from, q)
    }

    fn descend(&self, i: usize, lo: usize, hi: usize, from: usize, q: &Query) -> Option<usize> {
        if hi <= from || Self::prunes(&self.tree[i], q) {
            return None;
        }
        if hi - lo == 1 {
            return Some(lo);
        }
        let mid = (lo + hi) / 2;
        self.descend(2 * i, lo, mid, from, q)
            .or_else(|| self.descend(2 * i + 1, mid, hi, from, q))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free(cpu: i64, mem: i64) -> ResV {
        let mut v = [i64::MAX / 4; R];
        v[0] = cpu;
        v[1] = mem;
        v
    }

    fn need(cpu: i64, mem: i64) -> Query {
        let mut v = [0; R];
        v[0] = cpu;
        v[1] = mem;
        Query {
            need: v,
            avoid_present: 0,
            avoid_owners: 0,
        }
    }

    #[test]
    fn finds_the_first_node_with_room_in_every_dimension() {
        let mut idx = NodeIndex::default();
        idx.set(0, Some((free(4000, 1 << 30), 0, 0)));
        idx.set(1, Some((free(500, 8 << 30), 0, 0)));
        idx.set(2, Some((free(2000, 4 << 30), 0, 0)));
        assert_eq!(idx.first(0, &need(1000, 2 << 30)), Some(2));
        assert_eq!(idx.first(0, &need(100, 100)), Some(0));
        assert_eq!(idx.first(1, &need(100, 100)), Some(1));
        assert_eq!(idx.first(0, &need(8000, 1)), None);
        idx.set(0, None);
        assert_eq!(idx.first(0, &need(100, 100)), Some(1));
    }

    #[test]
    fn skips_nodes_holding_a_pod_to_avoid_and_grows_past_its_first_size() {
        let mut idx = NodeIndex::default();
        for n in 0..200 {
            idx.set(n, Some((free(4000, 1 << 30), 0b1, 0)));
        }
        idx.set(150, Some((free(4000, 1 << 30), 0b10, 0)));
        let q = Query {
            avoid_present: 0b1,
            ..need(100, 100)
        };
        assert_eq!(idx.first(0, &q), Some(150));
        assert_eq!(idx.first(151, &q), None);
    }
}
