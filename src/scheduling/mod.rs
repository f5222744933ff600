//! Scheduling simulation: which pending pods land where, and which nodes to buy for the
//! rest, as strict as kube-scheduler about where a pod may run and cheaper than greedy
//! packing. Pure: a function of its [`Input`] and [`Options`].

mod exact;
mod ids;
mod index;
pub mod input;
pub mod packing;
pub mod plan;
pub mod pod;
mod scheduler;
pub mod taints;
pub mod types;
pub mod validate;
pub mod volumes;

pub use input::{DaemonSetInfo, ExistingNode, Input, InputError, Limits, PodMemo, Pool};
pub use plan::{CpuMemory, ExistingPlacement, Plan, PlannedNodeClaim, Summary, Unschedulable};
pub use pod::{PodError, PodInfo};
pub use scheduler::Options;
pub use types::PoolTypes;
pub use validate::validate;

use scheduler::Scheduler;

/// Plans placements and new nodes for the input's pending pods.
pub fn schedule(input: &Input, options: &Options) -> Plan {
    let mut s = Scheduler::new(input, options.clone());
    s.run();
    if options.cost_aware {
        packing::repack(&mut s.planning());
    }
    s.plan()
}
