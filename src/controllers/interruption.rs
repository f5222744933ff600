//! Spot interruption: a Tailor node whose VM Azure is about to reclaim is drained before it
//! goes, so its pods move while the node still runs and the provisioner buys their room at
//! once, instead of after the VM has vanished and the Node has timed out.
//!
//! Azure announces a reclaim as a Scheduled Event inside the VM, at best some 30 seconds
//! ahead. On AKS, node-problem-detector turns it into a Node condition:
//! `PreemptionScheduled=True` (reason `SpotEvictionIncoming`), or, on older node images,
//! `VMEventScheduled=True` with a message naming the event (`Preempt`, `Terminate`, or
//! one the VM survives such as `Reboot` or `Freeze`). The deadline is in the message
//! (`Preempt Scheduled: Sat, 01 Aug 2026 05:41:02 GMT. ...`).
//!
//! The controller deletes the node's NodeClaim with the reason `interrupted`; termination
//! then cordons the node and evicts its pods through the Eviction API (the same path as
//! every other removal). In recommend-only mode the notice is reported as an Event on the
//! Node and nothing is touched. The simulator's world answers its cloud's interruption
//! notices likewise (cordon, pods moved at once); it reads them from its cloud, not from
//! Node conditions, so it does not share this code.

use super::state::InOrder;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::{Context, reference, wait_for_change_since};
use crate::apis::labels;
use crate::cloud::CloudProvider;
use crate::provisioning::Mode;
use crate::telemetry::names::TerminationReason;

/// The condition node-problem-detector sets for a spot reclaim.
pub const PREEMPTION_CONDITION: &str = "PreemptionScheduled";
/// The condition node-problem-detector sets for any Scheduled Event.
pub const VM_EVENT_CONDITION: &str = "VMEventScheduled";
/// Scheduled Events after which the VM is gone; the others (Reboot, Redeploy, Freeze) leave
/// it, and its pods, in place.
const FATAL_EVENTS: [&str; 2] = ["Preempt", "Terminate"];
/// How often the nodes are looked at when nothing changes: a notice comes at most 30
/// seconds ahead.
const INTERVAL: Duration = Duration::from_secs(2);

/// A reclaim announced on a Node.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    /// The condition that carried it.
    pub condition: String,
    /// When the VM goes, when the message says.
    pub deadline: Option<Timestamp>,
    /// The condition's message, for the Event.
    pub message: String,
}

/// The reclaim `node` announces, if any: a true `PreemptionScheduled` condition, or a true
/// `VMEventScheduled` whose message names `Preempt` or `Terminate`. Pure.
pub fn notice(node: &Node) -> Option<Notice> {
    let conditions = node.status.as_ref()?.conditions.as_ref()?;
    conditions.iter().find_map(|c| {
        if c.status != "True" {
            return None;
        }
        let message = c.message.clone().unwrap_or_default();
        let fatal = match c.type_.as_str() {
            PREEMPTION_CONDITION => true,
            VM_EVENT_CONDITION => FATAL_EVENTS.iter().any(|e| {
                message
                    .split_whitespace()
                    .any(|w| w.trim_matches(':') == *e)
            }),
            _ => false,
        };
        fatal.then(|| Notice {
            condition: c.type_.clone(),
            deadline: deadline(&message),
            message,
        })
    })
}

/// The time after `Scheduled:` in a notice's message (RFC 2822, as Azure writes
/// `NotBefore`), if it reads.
fn deadline(message: &str) -> Option<Timestamp> {
    let (_, rest) = message.split_once("Scheduled:")?;
    let rest = rest.trim_start();
    // The date ends with its zone ("GMT", "+0000"); a sentence may follow.
    let end = rest.find(". ").unwrap_or(rest.len());
    let text = rest[..end].trim_end_matches('.');
    jiff::fmt::rfc2822::parse(text).ok().map(|z| z.timestamp())
}

/// Runs the interruption controller until aborted.
pub async fn run<C: CloudProvider + 'static>(ctx: Arc<Context<C>>) {
    ctx.state.wait_synced().await;
    // Nodes drained, and nodes reported in recommend-only mode (by uid): each is drained
    // once, and reported once, but a reported node is drained if its pool turns autonomous
    // before the VM goes.
    let mut drained: BTreeSet<String> = BTreeSet::new();
    let mut reported: BTreeSet<String> = BTreeSet::new();
    let mut seen = ctx.state.generation();
    loop {
        wait_for_change_since(&ctx.state, seen, INTERVAL).await;
        seen = ctx.state.generation();
        if !ctx.writer.is_leader() {
            drained.clear();
            reported.clear();
            continue;
        }
        let nodes = ctx.state.nodes.in_order();
        // Nodes gone are forgotten (the set of live ones is made only when there is
        // something to forget: the loop wakes on every change in the cluster).
        if !drained.is_empty() || !reported.is_empty() {
            let live: BTreeSet<String> = nodes.iter().filter_map(|n| n.uid()).collect();
            drained.retain(|uid| live.contains(uid));
            reported.retain(|uid| live.contains(uid));
        }
        for node in nodes.iter() {
            let Some(notice) = notice(node) else {
                continue;
            };
            let uid = node.uid().unwrap_or_default();
            if drained.contains(&uid) {
                continue;
            }
            match respond(&ctx, node, &notice, !reported.contains(&uid)).await {
                Ok(Outcome::Drained) => {
                    drained.insert(uid);
                }
                Ok(Outcome::Reported) => {
                    reported.insert(uid);
                }
                Ok(Outcome::NotManaged) => {}
                Err(e) => {
                    tracing::warn!(node = %node.name_any(), error = %e, "answering a spot interruption failed; retrying");
                }
            }
        }
    }
}

/// What [`respond`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// The NodeClaim was deleted (or was already going).
    Drained,
    /// Recommend-only mode: reported, or reported before; nothing done.
    Reported,
    /// No Tailor NodeClaim holds the node: someone else's node.
    NotManaged,
}

/// Drains `node` by deleting its NodeClaim (reason `interrupted`), or in recommend-only mode
/// reports the notice (when `report`). A node Tailor does not manage, or whose claim is
/// already going, is left alone.
async fn respond<C: CloudProvider>(
    ctx: &Context<C>,
    node: &Node,
    notice: &Notice,
    report: bool,
) -> Result<Outcome, String> {
    let name = node.name_any();
    let claims = ctx.state.node_claims.in_order();
    let Some(claim) = claims
        .iter()
        .find(|c| c.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name.as_str()))
    else {
        return Ok(Outcome::NotManaged);
    };
    if claim.metadata.deletion_timestamp.is_some() {
        return Ok(Outcome::Drained);
    }
    let pool_name = claim.labels().get(labels::NODE_POOL).cloned();
    let pool = pool_name.as_deref().and_then(|p| {
        ctx.state
            .node_pools
            .in_order()
            .into_iter()
            .find(|n| n.name_any() == p)
    });
    let by = notice
        .deadline
        .map_or_else(|| "soon".to_string(), |d| format!("at {d}"));
    if ctx.mode_for(pool.as_deref()) != Mode::Autonomous {
        if !report {
            return Ok(Outcome::Reported);
        }
        ctx.writer
            .event(
                &reference(node),
                EventType::Warning,
                "WouldDrainForInterruption",
                "Disrupt",
                format!(
                    "recommend-only: Azure reclaims this spot VM {by} ({}: {}); draining now would move its pods before it goes; nothing done",
                    notice.condition, notice.message
                ),
            )
            .await;
        return Ok(Outcome::Reported);
    }
    ctx.writer
        .annotate_node_claim(
            &claim.name_any(),
            &BTreeMap::from([(
                labels::TERMINATION_REASON_ANNOTATION,
                Some(TerminationReason::Interrupted.as_str().to_string()),
            )]),
        )
        .await
        .map_err(|e| e.to_string())?;
    ctx.writer
        .delete_node_claim(&claim.name_any())
        .await
        .map_err(|e| e.to_string())?;
    ctx.writer
        .event(
            &reference(node),
            EventType::Warning,
            "DrainingForInterruption",
            "Disrupt",
            format!(
                "Azure reclaims this spot VM {by} ({}); its NodeClaim {} is deleted and its pods are moving",
                notice.condition,
                claim.name_any()
            ),
        )
        .await;
    tracing::info!(node = %name, nodeclaim = %claim.name_any(), deadline = ?notice.deadline, "spot interruption: draining");
    Ok(Outcome::Drained)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(conditions: &str) -> Node {
        serde_yaml::from_str(&format!(
            "metadata: {{name: n}}\nstatus:\n  conditions:\n{conditions}"
        ))
        .expect("node")
    }

    fn condition(type_: &str, status: &str, message: &str) -> String {
        format!("  - {{type: {type_}, status: \"{status}\", message: \"{message}\"}}\n")
    }

    const PREEMPT: &str = "Preempt Scheduled: Sat, 01 Aug 2026 05:41:02 GMT. For more information, see https://aka.ms/aks/spot. EventId: 6c6f1e3a";

    #[test]
    fn a_preemption_condition_is_a_notice_with_its_deadline() {
        let n = node(&format!(
            "{}{}",
            condition("Ready", "True", "kubelet is posting ready status"),
            condition(PREEMPTION_CONDITION, "True", PREEMPT)
        ));
        let got = notice(&n).expect("a notice");
        assert_eq!(got.condition, PREEMPTION_CONDITION);
        assert_eq!(
            got.deadline,
            Some("2026-08-01T05:41:02Z".parse().expect("valid"))
        );
    }

    #[test]
    fn only_true_conditions_of_events_the_vm_does_not_survive_are_notices() {
        // Cleared.
        assert_eq!(
            notice(&node(&condition(PREEMPTION_CONDITION, "False", PREEMPT))),
            None
        );
        // A reboot or a freeze leaves the VM and its pods.
        for event in ["Reboot", "Freeze", "Redeploy"] {
            let message = format!("{event} Scheduled: Sat, 01 Aug 2026 05:41:02 GMT.");
            assert_eq!(
                notice(&node(&condition(VM_EVENT_CONDITION, "True", &message))),
                None,
                "{event}"
            );
        }
        // Preempt and Terminate through the generic condition.
        for event in ["Preempt", "Terminate"] {
            let message = format!("{event} Scheduled: Sat, 01 Aug 2026 05:41:02 GMT.");
            let got = notice(&node(&condition(VM_EVENT_CONDITION, "True", &message)))
                .unwrap_or_else(|| panic!("{event} is a notice"));
            assert_eq!(got.condition, VM_EVENT_CONDITION);
            assert!(got.deadline.is_some(), "{event}");
        }
        // Other conditions, and a node without any.
        assert_eq!(
            notice(&node(&condition("MemoryPressure", "True", PREEMPT))),
            None
        );
        let bare: Node = serde_yaml::from_str("metadata: {name: n}").expect("node");
        assert_eq!(notice(&bare), None);
    }

    #[test]
    fn a_notice_whose_date_does_not_read_still_drains() {
        let got = notice(&node(&condition(
            PREEMPTION_CONDITION,
            "True",
            "Preempt Scheduled: soon",
        )))
        .expect("a notice");
        assert_eq!(got.deadline, None);
    }
}
