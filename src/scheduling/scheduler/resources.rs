//! Resource vectors: the fixed-size arrays the simulation adds, subtracts and compares,
//! and the map from extended resource names to their slots.

use crate::model::Resources;
use crate::model::quantity::{display_bytes, display_cores};

/// Resource vectors: cpu, memory, ephemeral-storage, pods, then up to four extended
/// resources, in the order the input first names them.
pub(crate) const R: usize = 8;

pub(crate) type ResV = [i64; R];

pub(super) const EXT_SLOTS: usize = R - 4;

pub(crate) fn add(a: &ResV, b: &ResV) -> ResV {
    std::array::from_fn(|i| a[i].saturating_add(b[i]))
}

pub(crate) fn sub(a: &ResV, b: &ResV) -> ResV {
    std::array::from_fn(|i| a[i].saturating_sub(b[i]))
}

pub(crate) fn fits(req: &ResV, cap: &ResV) -> bool {
    req.iter().zip(cap).all(|(r, c)| r <= c)
}

pub(super) fn vmax(a: &ResV, b: &ResV) -> ResV {
    std::array::from_fn(|i| a[i].max(b[i]))
}

/// Maps extended resource names to vector slots.
#[derive(Debug, Default, Clone)]
pub(super) struct Dims {
    pub(super) ext: Vec<String>,
}

impl Dims {
    pub(super) fn learn(&mut self, r: &Resources) {
        for k in r.extended.keys() {
            if !self.ext.contains(k) && self.ext.len() < EXT_SLOTS {
                self.ext.push(k.clone());
            }
        }
    }

    /// The vector for a resource list; `None` when it names an extended resource beyond
    /// the four slots.
    pub(super) fn vec(&self, r: &Resources) -> Option<ResV> {
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

    pub(super) fn name(&self, i: usize) -> String {
        match i {
            0 => "cpu".into(),
            1 => "memory".into(),
            2 => "ephemeral-storage".into(),
            3 => "pods".into(),
            _ => self.ext.get(i - 4).cloned().unwrap_or_default(),
        }
    }

    pub(super) fn show(&self, i: usize, v: i64) -> String {
        match i {
            0 => display_cores(v),
            1 | 2 => display_bytes(v),
            _ => v.to_string(),
        }
    }
}
