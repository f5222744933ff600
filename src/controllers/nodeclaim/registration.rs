//! Registration: the Node whose provider ID matches the claim's has appeared. Tailor adopts
//! it: the claim's labels and taints are synced onto it, the unregistered taint it booted
//! with is removed, and the termination finalizer is added so that deleting the Node drains
//! it through the claim. The claim records the Node's name and `Registered`.

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::ResourceExt;

use super::condition;
use crate::apis::nodeclaim::{condition as cond, reason};
use crate::apis::{NodeClaim, NodeClaimStatus, labels, set_condition};
use crate::cloud::CloudProvider;
use crate::controllers::Context;
use crate::controllers::writes::{Result, WriteError};
use crate::telemetry::names::Stage;

/// The taints a registered node carries: its own less the unregistered taint, plus the
/// claim's taints and startup taints it lacks.
pub fn registered_taints(claim: &NodeClaim, node: &Node) -> Vec<Taint> {
    let mut taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != labels::UNREGISTERED_TAINT_KEY)
        .collect();
    for t in claim.spec.taints.iter().chain(&claim.spec.startup_taints) {
        if !taints
            .iter()
            .any(|have| have.key == t.key && have.effect == t.effect)
        {
            taints.push(t.clone());
        }
    }
    taints
}

/// The pods to nominate before `registering` nodes turn schedulable: of each claim's planned
/// pods ([`labels::PLANNED_PODS_ANNOTATION`]), those still unbound and not nominated to the
/// claim's node (kube-scheduler cleared the nomination while the node booted), as
/// (`namespace/name`, node). Pure.
pub fn waiting_for<'a>(
    registering: impl IntoIterator<Item = (&'a NodeClaim, &'a Node)>,
    pods: &[std::sync::Arc<k8s_openapi::api::core::v1::Pod>],
) -> Vec<(String, String)> {
    let mut planned: std::collections::HashMap<&str, String> = std::collections::HashMap::new();
    for (claim, node) in registering {
        if let Some(list) = claim.annotations().get(labels::PLANNED_PODS_ANNOTATION) {
            for key in list.split(',').filter(|k| !k.is_empty()) {
                planned.insert(key, node.name_any());
            }
        }
    }
    if planned.is_empty() {
        return Vec::new();
    }
    let mut out: Vec<(String, String)> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.spec.as_ref().is_none_or(|s| s.node_name.is_none()))
        .filter_map(|p| {
            let key = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
            let node = planned.get(key.as_str())?;
            let nominated = p
                .status
                .as_ref()
                .and_then(|s| s.nominated_node_name.as_ref());
            (nominated != Some(node)).then(|| (key, node.clone()))
        })
        .collect();
    out.sort();
    out
}

/// Adopts the Node and marks the claim registered.
pub async fn register<C: CloudProvider>(
    ctx: &Context<C>,
    claim: &NodeClaim,
    node: &Node,
    now: jiff::Timestamp,
) -> Result<()> {
    let mut node_labels = claim.labels().clone();
    node_labels.insert(labels::REGISTERED.to_string(), "true".to_string());
    // A new node's status is written often by its kubelet, so the patch (guarded by the
    // resource version, since it replaces the taint list) may meet a conflict: it is retried
    // at once on the node read afresh, so that the nodes of one batch turn schedulable
    // together rather than a pass apart.
    let mut current = node.clone();
    let mut attempt = 0;
    loop {
        let mut finalizers = current.finalizers().to_vec();
        if !finalizers
            .iter()
            .any(|f| f == labels::TERMINATION_FINALIZER)
        {
            finalizers.push(labels::TERMINATION_FINALIZER.to_string());
        }
        match ctx
            .writer
            .patch_node(
                &current,
                &registered_taints(claim, &current),
                &node_labels,
                &finalizers,
            )
            .await
        {
            Ok(()) => break,
            Err(WriteError::Conflict { .. }) if attempt < 3 => {
                attempt += 1;
                match ctx.writer.fresh_node(&node.name_any()).await? {
                    Some(fresh) => current = fresh,
                    None => return Ok(()),
                }
            }
            Err(e) => return Err(e),
        }
    }
    // Only what this step owns: other steps' conditions are applied by their own managers.
    let mut status = NodeClaimStatus {
        node_name: Some(node.name_any()),
        ..NodeClaimStatus::default()
    };
    set_condition(
        &mut status.conditions,
        condition(
            cond::REGISTERED,
            true,
            reason::REGISTERED,
            format!("node {}", node.name_any()),
            now,
        ),
    );
    ctx.writer
        .apply_node_claim_status(&claim.name_any(), "registration", &status)
        .await?;
    super::observe_stage(ctx, claim, Stage::Registered, Some(cond::LAUNCHED), now);
    tracing::info!(nodeclaim = %claim.name_any(), node = %node.name_any(), "registered");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_planned_on_a_registering_node_and_still_waiting_are_nominated_to_it_again() {
        let claim: NodeClaim = serde_yaml::from_str(
            "apiVersion: tailor.sh/v1alpha1\nkind: NodeClaim\nmetadata:\n  name: c\n  annotations: {tailor.sh/planned-pods: 'shop/a,shop/b,shop/c,shop/d'}\nspec:\n  nodeClassRef: {group: tailor.sh, kind: AKSNodeClass, name: default}\n",
        )
        .expect("claim");
        let node: Node = serde_yaml::from_str("metadata: {name: node-c}\n").expect("node");
        let pod = |name: &str, extra: &str| {
            std::sync::Arc::new(
                serde_yaml::from_str::<k8s_openapi::api::core::v1::Pod>(&format!(
                    "metadata: {{name: {name}, namespace: shop}}\nspec: {{containers: [{{name: app, image: app}}]{extra}}}\nstatus: {{phase: Pending}}\n"
                ))
                .expect("pod"),
            )
        };
        let mut nominated = (*pod("c", "")).clone();
        nominated.status.get_or_insert_default().nominated_node_name = Some("node-c".to_string());
        let pods = vec![
            // a: waiting, its nomination cleared; b: already bound elsewhere; c: still
            // nominated to the node; d: gone; e: not planned on this claim.
            pod("a", ""),
            pod("b", ", nodeName: other"),
            std::sync::Arc::new(nominated),
            pod("e", ""),
        ];
        assert_eq!(
            waiting_for([(&claim, &node)], &pods),
            [("shop/a".to_string(), "node-c".to_string())]
        );
        // A claim without the annotation (a replacement, a node bought ahead) nominates
        // nothing.
        let mut plain = claim.clone();
        plain.metadata.annotations = None;
        assert!(waiting_for([(&plain, &node)], &pods).is_empty());
    }

    #[test]
    fn registration_drops_the_unregistered_taint_and_adds_the_claims_taints_once() {
        let claim: NodeClaim = serde_yaml::from_str(
            "apiVersion: tailor.sh/v1alpha1\nkind: NodeClaim\nmetadata: {name: c}\nspec:\n  nodeClassRef: {group: tailor.sh, kind: AKSNodeClass, name: default}\n  taints: [{key: dedicated, value: batch, effect: NoSchedule}]\n  startupTaints: [{key: cni-not-ready, effect: NoSchedule}]\n",
        )
        .expect("claim");
        let node: Node = serde_yaml::from_str(
            "metadata: {name: n}\nspec:\n  taints: [{key: tailor.sh/unregistered, effect: NoExecute}, {key: dedicated, value: batch, effect: NoSchedule}, {key: node.kubernetes.io/not-ready, effect: NoSchedule}]\n",
        )
        .expect("node");
        let keys: Vec<String> = registered_taints(&claim, &node)
            .into_iter()
            .map(|t| t.key)
            .collect();
        assert_eq!(
            keys,
            ["dedicated", "node.kubernetes.io/not-ready", "cni-not-ready"]
        );
    }
}
