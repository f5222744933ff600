//! Liveness: a launched NodeClaim whose Node has not registered within the registration TTL
//! (15 minutes, as Karpenter) is deleted; its instance is terminated through the finalizer
//! and its pods are planned again, elsewhere if the offering keeps failing.

use kube::ResourceExt;
use kube::runtime::events::EventType;

use crate::apis::{NodeClaim, labels};
use crate::cloud::CloudProvider;
use crate::controllers::writes::Result;
use crate::controllers::{Context, reference};

/// Deletes a claim whose node never registered.
pub async fn replace<C: CloudProvider>(ctx: &Context<C>, claim: &NodeClaim) -> Result<()> {
    let name = claim.name_any();
    ctx.writer
        .event(
            &reference(claim),
            EventType::Warning,
            "RegistrationTimeout",
            "Replace",
            format!(
                "no node registered within {}; replacing the nodeclaim",
                ctx.settings.registration_ttl
            ),
        )
        .await;
    ctx.writer.delete_node_claim(&name).await?;
    let pool = claim
        .labels()
        .get(labels::NODE_POOL)
        .cloned()
        .unwrap_or_default();
    ctx.metrics.nodeclaim_terminated(&pool, "liveness");
    tracing::warn!(nodeclaim = %name, "node never registered; nodeclaim deleted");
    Ok(())
}
