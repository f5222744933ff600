//! Garbage collection: instances tagged with this cluster that no NodeClaim owns (a crash
//! between the launch and the claim's status write, or a claim removed by hand) are deleted
//! once older than a grace period; NodeClaims whose launched instance is gone are deleted so
//! their pods are planned again. Nothing else is touched.

use std::collections::BTreeSet;
use std::sync::Arc;

use kube::ResourceExt;

use super::Context;
use crate::apis::labels;
use crate::cloud::{CloudError, CloudProvider, Instance};

/// Instances to delete: tagged for `cluster`, owned by no NodeClaim in `claims`, older
/// than the grace period at `now`, and not already being deleted (a terminated claim's VM
/// is still listed while the cloud removes it).
pub fn orphans<'a>(
    instances: &'a [Instance],
    claims: &BTreeSet<String>,
    cluster: &str,
    now: jiff::Timestamp,
    grace: jiff::SignedDuration,
) -> Vec<&'a Instance> {
    instances
        .iter()
        .filter(|i| i.tags.get(labels::TAG_CLUSTER).map(String::as_str) == Some(cluster))
        .filter(|i| !claims.contains(&i.claim))
        .filter(|i| now.duration_since(i.created_at) >= grace)
        .filter(|i| i.state != crate::cloud::InstanceState::Terminating)
        .collect()
}

/// Runs garbage collection until aborted.
pub async fn run<C: CloudProvider + 'static>(ctx: Arc<Context<C>>) {
    ctx.state.wait_synced().await;
    loop {
        tokio::time::sleep(ctx.settings.gc_interval).await;
        if !ctx.writer.is_leader() {
            continue;
        }
        let started = std::time::Instant::now();
        let result = collect(&ctx).await;
        ctx.metrics.reconcile(
            crate::telemetry::names::Controller::GarbageCollection,
            started.elapsed().as_secs_f64(),
            result.is_err(),
        );
        if let Err(e) = result {
            tracing::warn!(error = %e, "garbage collection failed");
        }
    }
}

async fn collect<C: CloudProvider>(ctx: &Context<C>) -> Result<(), CloudError> {
    // The offerings marked unavailable expire on their own TTL: the gauge follows them on
    // every pass, also while nothing is planned (a failure is the cloud's, counted there).
    let _ = ctx.unavailable_offerings().await;
    match ctx.cloud.collect_leaked().await {
        Ok(0) => {}
        Ok(n) => tracing::info!(resources = n, "deleted leaked cloud resources"),
        Err(e) => ctx.metrics.cloud_error("collect_leaked", e.kind()),
    }
    let instances = ctx.cloud.list().await?;
    let now = ctx.clock.now();
    let claims = ctx.state.node_claims.state();
    let names: BTreeSet<String> = claims.iter().map(|c| c.name_any()).collect();
    for orphan in orphans(
        &instances,
        &names,
        &ctx.settings.cluster_name,
        now,
        ctx.settings.gc_grace,
    ) {
        tracing::warn!(instance = %orphan.provider_id, claim = %orphan.claim, "instance without a nodeclaim; deleting it");
        // A failure is counted by the metered cloud; the next pass tries again.
        if let Err(e) = ctx.cloud.delete(&orphan.provider_id).await {
            tracing::warn!(instance = %orphan.provider_id, error = %e, "deleting an orphan instance failed");
        }
    }
    let live: BTreeSet<&str> = instances.iter().map(|i| i.provider_id.as_str()).collect();
    for claim in claims
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
    {
        let Some(provider_id) = claim.status.as_ref().and_then(|s| s.provider_id.as_deref()) else {
            continue;
        };
        if live.contains(provider_id) {
            continue;
        }
        // Listed without it: confirm with a direct read before deleting the claim.
        if let Err(CloudError::NotFound { .. }) = ctx.cloud.get(provider_id).await {
            tracing::warn!(nodeclaim = %claim.name_any(), instance = provider_id, "instance is gone; deleting the nodeclaim");
            if let Err(e) = ctx.writer.delete_node_claim(&claim.name_any()).await {
                tracing::warn!(nodeclaim = %claim.name_any(), error = %e, "deleting nodeclaim failed");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::InstanceState;
    use crate::model::CapacityType;
    use std::collections::BTreeMap;

    fn instance(claim: &str, cluster: &str, age_secs: i64) -> Instance {
        Instance {
            provider_id: format!("kwok://{claim}"),
            claim: claim.to_string(),
            instance_type: "Standard_D2s_v5".to_string(),
            zone: "eastus-1".to_string(),
            capacity_type: CapacityType::OnDemand,
            price_per_hour: 0.1,
            image_id: "kwok".to_string(),
            created_at: jiff::Timestamp::from_second(1_000_000 - age_secs).expect("valid"),
            state: InstanceState::Running,
            tags: BTreeMap::from([(labels::TAG_CLUSTER.to_string(), cluster.to_string())]),
        }
    }

    #[test]
    fn only_old_instances_of_this_cluster_without_a_claim_are_orphans() {
        let now = jiff::Timestamp::from_second(1_000_000).expect("valid");
        let grace = jiff::SignedDuration::from_secs(30);
        let instances = vec![
            instance("owned", "c1", 600),
            instance("orphan", "c1", 600),
            instance("young", "c1", 5),
            instance("other-cluster", "c2", 600),
            Instance {
                state: InstanceState::Terminating,
                ..instance("going", "c1", 600)
            },
        ];
        let claims = BTreeSet::from(["owned".to_string()]);
        let found: Vec<&str> = orphans(&instances, &claims, "c1", now, grace)
            .into_iter()
            .map(|i| i.claim.as_str())
            .collect();
        assert_eq!(found, ["orphan"]);
    }
}
