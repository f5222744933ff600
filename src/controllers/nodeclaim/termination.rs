//! Termination, behind the `tailor.sh/termination` finalizer: the Node is cordoned with the
//! `tailor.sh/disrupted:NoSchedule` taint, its pods are evicted through the Eviction API
//! (PodDisruptionBudgets honoured, refusals retried on the next pass) — ordinary pods first,
//! then critical ones, DaemonSet pods last — and once it is empty the instance and the Node
//! are deleted and the finalizer dropped. After the claim's `terminationGracePeriod`,
//! remaining pods are deleted regardless of budgets.

use crate::controllers::state::InOrder;
use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use kube::ResourceExt;

use crate::apis::{NodeClaim, labels};
use crate::cloud::CloudProvider;
use crate::controllers::Context;
use crate::controllers::writes::WriteError;

/// The order in which a node's pods leave: lower first.
pub fn eviction_group(pod: &Pod) -> u8 {
    let daemon = pod.owner_references().iter().any(|o| o.kind == "DaemonSet");
    let critical = pod
        .spec
        .as_ref()
        .and_then(|s| s.priority_class_name.as_deref())
        .is_some_and(|p| p == "system-cluster-critical" || p == "system-node-critical");
    u8::from(daemon) * 2 + u8::from(critical)
}

/// Whether a pod still holds the node: not finished, not a static pod's mirror.
pub fn holds_node(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    let mirror = pod
        .annotations()
        .contains_key("kubernetes.io/config.mirror");
    !mirror && !matches!(phase, Some("Succeeded" | "Failed"))
}

/// The pods to evict now: the not-yet-terminating pods of the first group that still has
/// pods on the node (a later group waits until the earlier ones are gone).
pub fn to_evict(pods: &[&Pod]) -> Vec<usize> {
    let holding: Vec<(usize, &Pod)> = pods
        .iter()
        .enumerate()
        .filter(|(_, p)| holds_node(p))
        .map(|(i, p)| (i, *p))
        .collect();
    let Some(first) = holding.iter().map(|(_, p)| eviction_group(p)).min() else {
        return Vec::new();
    };
    holding
        .into_iter()
        .filter(|(_, p)| eviction_group(p) == first && p.metadata.deletion_timestamp.is_none())
        .map(|(i, _)| i)
        .collect()
}

fn disrupted_taint() -> Taint {
    Taint {
        key: labels::DISRUPTED_TAINT_KEY.to_string(),
        effect: "NoSchedule".to_string(),
        ..Taint::default()
    }
}

/// What an evicted pod is told: the node it leaves, why that node goes (the disruption
/// method, an interruption, an expiry, from the claim's termination reason) and, past the
/// claim's termination grace period, that it was deleted rather than evicted. Pure.
pub fn eviction_note(claim: &NodeClaim, node: &str, grace_over: bool) -> String {
    let why = claim
        .annotations()
        .get(labels::TERMINATION_REASON_ANNOTATION)
        .map_or("its NodeClaim was deleted", String::as_str);
    let command = claim
        .annotations()
        .get(crate::controllers::disruption::COMMAND_ANNOTATION)
        .map(|id| format!(", command {id}"))
        .unwrap_or_default();
    if grace_over {
        format!(
            "deleted by Tailor: node {node} is being removed ({why}{command}) and its NodeClaim's terminationGracePeriod is over"
        )
    } else {
        format!("evicted by Tailor: node {node} is being removed ({why}{command})")
    }
}

/// Why a termination pass stopped short.
#[derive(Debug, thiserror::Error)]
enum PassError {
    #[error(transparent)]
    Write(#[from] WriteError),
    #[error("deleting instance {provider_id}: {source}")]
    Cloud {
        provider_id: String,
        #[source]
        source: crate::cloud::CloudError,
    },
}

/// One pass of termination; called again until the finalizer is gone.
pub async fn terminate<C: CloudProvider>(ctx: &Context<C>, claim: &NodeClaim, _seen: Timestamp) {
    if let Err(e) = pass(ctx, claim).await {
        match e {
            PassError::Write(WriteError::EvictionRefused { .. } | WriteError::Conflict { .. }) => {
                tracing::debug!(nodeclaim = %claim.name_any(), error = %e, "eviction refused or object changed; retrying")
            }
            _ => {
                tracing::warn!(nodeclaim = %claim.name_any(), error = %e, "termination step failed; retrying")
            }
        }
    }
}

async fn pass<C: CloudProvider>(ctx: &Context<C>, claim: &NodeClaim) -> Result<(), PassError> {
    if !claim
        .finalizers()
        .iter()
        .any(|f| f == labels::TERMINATION_FINALIZER)
    {
        return Ok(());
    }
    let name = claim.name_any();
    let status = claim.status.clone().unwrap_or_default();
    let node: Option<std::sync::Arc<Node>> = ctx.state.nodes.state().into_iter().find(|n| {
        status.node_name.as_deref() == Some(n.name_any().as_str())
            || (status.provider_id.is_some()
                && n.spec.as_ref().and_then(|s| s.provider_id.as_ref())
                    == status.provider_id.as_ref())
    });
    if let Some(node) = &node {
        // 1. Cordon with the disruption taint.
        let mut taints = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        if !taints.iter().any(|t| t.key == labels::DISRUPTED_TAINT_KEY) {
            taints.push(disrupted_taint());
            ctx.writer
                .patch_node(node, &taints, &BTreeMap::new(), node.finalizers())
                .await?;
            return Ok(()); // the next pass sees the taint in the store
        }
        // 2. Drain.
        let node_name = node.name_any();
        let all = ctx.state.pods.in_order();
        let pods: Vec<&Pod> = all
            .iter()
            .map(|p| p.as_ref())
            .filter(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node_name.as_str())
            })
            .collect();
        if pods.iter().any(|p| holds_node(p)) {
            let now = ctx.clock.now();
            let grace_over = claim
                .spec
                .termination_grace_period()
                .ok()
                .flatten()
                .zip(claim.metadata.deletion_timestamp.as_ref())
                .is_some_and(|(grace, since)| {
                    since.0.checked_add(grace).is_ok_and(|end| now >= end)
                });
            let mut refused = None;
            for i in to_evict(&pods) {
                let result = if grace_over {
                    ctx.writer.delete_pod(pods[i]).await
                } else {
                    ctx.writer.evict(pods[i]).await
                };
                match result {
                    Ok(()) => {
                        ctx.metrics.eviction();
                        ctx.writer
                            .event(
                                &crate::controllers::reference(pods[i]),
                                kube::runtime::events::EventType::Normal,
                                "Evicted",
                                "Evict",
                                eviction_note(claim, &node_name, grace_over),
                            )
                            .await;
                    }
                    Err(e @ WriteError::EvictionRefused { .. }) => refused = Some(e),
                    Err(e) => return Err(e.into()),
                }
            }
            return refused.map_or(Ok(()), |e| Err(e.into()));
        }
    }
    // 3. Empty: delete the instance, then the Node, then let the claim go.
    if let Some(provider_id) = &status.provider_id
        && let Err(e) = ctx.cloud.delete(provider_id).await
    {
        return Err(PassError::Cloud {
            provider_id: provider_id.clone(),
            source: e,
        });
    }
    if let Some(node) = &node {
        let finalizers: Vec<String> = node
            .finalizers()
            .iter()
            .filter(|f| *f != labels::TERMINATION_FINALIZER)
            .cloned()
            .collect();
        if finalizers.len() != node.finalizers().len() {
            let taints = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default();
            ctx.writer
                .patch_node(node, &taints, &BTreeMap::new(), &finalizers)
                .await?;
        }
        ctx.writer.delete_node(&node.name_any()).await?;
    }
    ctx.writer
        .remove_node_claim_finalizer(claim, labels::TERMINATION_FINALIZER)
        .await?;
    let pool = claim
        .labels()
        .get(labels::NODE_POOL)
        .cloned()
        .unwrap_or_default();
    let reason = claim
        .annotations()
        .get(labels::TERMINATION_REASON_ANNOTATION)
        .cloned()
        .unwrap_or_else(|| "deleted".to_string());
    ctx.metrics.nodeclaim_terminated(&pool, &reason);
    tracing::info!(nodeclaim = %name, "terminated");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, owner: Option<&str>, priority: Option<&str>, terminating: bool) -> Pod {
        let mut p: Pod = serde_yaml::from_str(&format!(
            "metadata: {{name: {name}, namespace: default}}\nspec: {{containers: [{{name: c}}], nodeName: n}}\nstatus: {{phase: Running}}\n"
        ))
        .expect("pod");
        if let Some(kind) = owner {
            p.metadata.owner_references = Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    kind: kind.to_string(),
                    name: "x".to_string(),
                    api_version: "apps/v1".to_string(),
                    uid: "u".to_string(),
                    ..Default::default()
                },
            ]);
        }
        if let Some(pc) = priority {
            p.spec.as_mut().expect("spec").priority_class_name = Some(pc.to_string());
        }
        if terminating {
            p.metadata.deletion_timestamp = Some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH),
            );
        }
        p
    }

    #[test]
    fn ordinary_pods_leave_first_and_daemonset_pods_last() {
        let web = pod("web", Some("ReplicaSet"), None, false);
        let dns = pod(
            "dns",
            Some("ReplicaSet"),
            Some("system-cluster-critical"),
            false,
        );
        let agent = pod("agent", Some("DaemonSet"), None, false);
        let pods = vec![&agent, &dns, &web];
        assert_eq!(to_evict(&pods), [2], "the ordinary pod first");
        let pods = vec![&agent, &dns];
        assert_eq!(to_evict(&pods), [1], "then the critical one");
        let pods = vec![&agent];
        assert_eq!(to_evict(&pods), [0], "the DaemonSet pod last");
    }

    #[test]
    fn an_evicted_pod_is_told_which_node_goes_and_why() {
        let claim: NodeClaim = serde_yaml::from_str(
            "apiVersion: tailor.sh/v1alpha1\nkind: NodeClaim\nmetadata:\n  name: c\n  annotations: {tailor.sh/termination-reason: single, tailor.sh/disruption-command: single-0000abcd}\nspec:\n  nodeClassRef: {group: tailor.sh, kind: AKSNodeClass, name: default}\n",
        )
        .expect("claim");
        assert_eq!(
            eviction_note(&claim, "n1", false),
            "evicted by Tailor: node n1 is being removed (single, command single-0000abcd)"
        );
        assert!(eviction_note(&claim, "n1", true).starts_with("deleted by Tailor"));
        let mut plain = claim.clone();
        plain.metadata.annotations = None;
        assert_eq!(
            eviction_note(&plain, "n1", false),
            "evicted by Tailor: node n1 is being removed (its NodeClaim was deleted)"
        );
    }

    #[test]
    fn a_terminating_pod_holds_back_the_next_group_without_being_evicted_again() {
        let leaving = pod("web", Some("ReplicaSet"), None, true);
        let agent = pod("agent", Some("DaemonSet"), None, false);
        let pods = vec![&leaving, &agent];
        assert!(to_evict(&pods).is_empty());
        let mut done = pod("job", Some("Job"), None, false);
        done.status.as_mut().expect("status").phase = Some("Succeeded".to_string());
        let pods = vec![&done, &agent];
        assert_eq!(to_evict(&pods), [1], "finished pods do not hold the node");
    }
}
