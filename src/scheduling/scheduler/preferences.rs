//! Preferences and their relaxation: preferred terms are treated as requirements, and
//! relaxed one at a time, lightest first, only when a pod cannot land (Karpenter's
//! `preferences.go`).

use super::Scheduler;
use super::topology::Con;
use crate::model::{NodeRequirements, Requirements};
use crate::scheduling::ids::PodId;

/// What can be relaxed, in the order Karpenter relaxes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Soft {
    Spread(usize),
    Anti(usize),
    Affinity(usize),
    NodeTerm(usize),
    PreferNoSchedule,
}

/// The node requirements in force at one relaxation level, and whether PreferNoSchedule
/// taints still count.
pub(super) struct Active {
    pub(super) node_requirements: NodeRequirements,
    pub(super) trivial: bool,
    pub(super) cons: Vec<Con>,
    pub(super) prefer_no_schedule: bool,
}

impl Scheduler<'_> {
    /// The relaxation steps available for a pod, in order.
    pub(super) fn softs(&self, p: PodId) -> Vec<Soft> {
        let pod = &self.pods[p];
        let mut out: Vec<Soft> = (0..pod.soft_spread.len()).map(Soft::Spread).collect();
        // Lightest preferences go first: the lists are sorted heaviest first.
        out.extend((0..pod.soft_anti.len()).rev().map(Soft::Anti));
        out.extend((0..pod.soft_affinity.len()).rev().map(Soft::Affinity));
        out.extend((0..pod.info.preferred_node.len()).rev().map(Soft::NodeTerm));
        out.push(Soft::PreferNoSchedule);
        out
    }

    pub(super) fn active(&self, p: PodId, relaxed: &[Soft]) -> Active {
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
}
