//! Initialization: a registered Node is ready for pods once it reports `Ready`, its startup
//! taints are gone (another agent removes them) and it has registered its resources. The
//! Node is labelled initialized and the claim becomes `Initialized` and `Ready`; until then
//! the provisioner still counts it as capacity on the way.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use super::condition;
use crate::apis::nodeclaim::{condition as cond, reason};
use crate::apis::{NodeClaim, NodeClaimStatus, labels, set_condition};
use crate::cloud::CloudProvider;
use crate::controllers::Context;
use crate::controllers::writes::Result;
use crate::telemetry::names::Stage;

/// Whether the Node is ready for pods as the claim expects.
pub fn is_initialized(claim: &NodeClaim, node: &Node) -> bool {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_ref());
    let starting = taints.into_iter().flatten().any(|t| {
        t.key == labels::UNREGISTERED_TAINT_KEY
            || claim
                .spec
                .startup_taints
                .iter()
                .any(|s| s.key == t.key && s.effect == t.effect)
    });
    let resources = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .is_some_and(|a| a.contains_key("cpu") && a.contains_key("memory"));
    ready && !starting && resources
}

/// Marks the Node and the claim initialized.
pub async fn initialize<C: CloudProvider>(
    ctx: &Context<C>,
    claim: &NodeClaim,
    node: &Node,
    now: jiff::Timestamp,
) -> Result<()> {
    let mut node_labels: BTreeMap<String, String> = BTreeMap::new();
    node_labels.insert(labels::INITIALIZED.to_string(), "true".to_string());
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    ctx.writer
        .patch_node(node, &taints, &node_labels, node.finalizers())
        .await?;
    // Only what this step owns: other steps' conditions are applied by their own managers.
    let mut status = NodeClaimStatus::default();
    set_condition(
        &mut status.conditions,
        condition(cond::INITIALIZED, true, reason::INITIALIZED, "", now),
    );
    set_condition(
        &mut status.conditions,
        condition(cond::READY, true, reason::INITIALIZED, "", now),
    );
    ctx.writer
        .apply_node_claim_status(&claim.name_any(), "initialization", &status)
        .await?;
    super::observe_stage(ctx, claim, Stage::Initialized, Some(cond::REGISTERED), now);
    tracing::info!(nodeclaim = %claim.name_any(), node = %node.name_any(), "initialized");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim() -> NodeClaim {
        serde_yaml::from_str(
            "apiVersion: tailor.sh/v1alpha1\nkind: NodeClaim\nmetadata: {name: c}\nspec:\n  nodeClassRef: {group: tailor.sh, kind: AKSNodeClass, name: default}\n  startupTaints: [{key: cni-not-ready, effect: NoSchedule}]\n",
        )
        .expect("claim")
    }

    fn node(taints: &str, ready: &str) -> Node {
        serde_yaml::from_str(&format!(
            "metadata: {{name: n}}\nspec: {{taints: {taints}}}\nstatus:\n  allocatable: {{cpu: '2', memory: 4Gi}}\n  conditions: [{{type: Ready, status: '{ready}'}}]\n"
        ))
        .expect("node")
    }

    #[test]
    fn a_node_is_initialized_only_when_ready_and_its_startup_taints_are_gone() {
        assert!(is_initialized(&claim(), &node("[]", "True")));
        assert!(!is_initialized(&claim(), &node("[]", "False")));
        assert!(!is_initialized(
            &claim(),
            &node("[{key: cni-not-ready, effect: NoSchedule}]", "True")
        ));
        assert!(!is_initialized(
            &claim(),
            &node("[{key: tailor.sh/unregistered, effect: NoExecute}]", "True")
        ));
        // Other taints (the pool's own) do not hold initialization back.
        assert!(is_initialized(
            &claim(),
            &node("[{key: dedicated, effect: NoSchedule}]", "True")
        ));
    }
}
