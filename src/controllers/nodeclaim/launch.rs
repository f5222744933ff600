//! Launch: the cloud creates the instance for a NodeClaim, trying the offerings its
//! requirements admit, cheapest first. On success the claim learns its provider ID, type,
//! zone, capacity type and resources; on a capacity error the offerings are cached as
//! unavailable (by the cloud) and the claim is deleted so its pods are planned again.

use std::collections::BTreeMap;

use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::condition;
use crate::apis::nodeclaim::{condition as cond, reason};
use crate::apis::{NodeClaim, NodeClaimStatus, labels, set_condition};
use crate::cloud::kwok::quantities;
use crate::cloud::{CloudError, CloudProvider, LaunchCandidate, LaunchRequest};
use crate::controllers::{Context, reference};
use crate::model::{InstanceType, Requirements};
use crate::telemetry::names::Stage;

/// The launch request for a claim: every offering its requirements admit whose type holds
/// the claim's requests, cheapest first.
pub fn launch_request(
    claim: &NodeClaim,
    types: &[InstanceType],
    cluster_name: &str,
) -> Result<LaunchRequest, String> {
    let name = claim.name_any();
    let requirements = Requirements::from_node_requirements(&claim.spec.requirements)
        .map_err(|e| format!("nodeclaim {name}: spec.requirements: {e}"))?;
    let requests = crate::model::pod::parse_quantities(
        Some(&claim.spec.resources.requests),
        "spec.resources.requests",
    )
    .map_err(|e| format!("nodeclaim {name}: {}: {}", e.field, e.source))?;
    let mut candidates = Vec::new();
    for t in types {
        if requirements.intersects(&t.requirements).is_err() || !requests.fits(&t.allocatable) {
            continue;
        }
        for o in t.offerings.iter().filter(|o| o.available) {
            let zone_ok = requirements
                .get(labels::ZONE)
                .is_none_or(|r| r.admits_value(&o.zone));
            let ct_ok = requirements
                .get(labels::CAPACITY_TYPE)
                .is_none_or(|r| r.admits_value(o.capacity_type.as_str()));
            if zone_ok && ct_ok {
                candidates.push(LaunchCandidate {
                    instance_type: t.name.clone(),
                    zone: o.zone.clone(),
                    capacity_type: o.capacity_type,
                    price_per_hour: o.price_per_hour,
                });
            }
        }
    }
    candidates.sort_by(|a, b| {
        a.price_per_hour
            .total_cmp(&b.price_per_hour)
            .then_with(|| a.instance_type.cmp(&b.instance_type))
            .then_with(|| a.zone.cmp(&b.zone))
    });
    let pool = claim
        .labels()
        .get(labels::NODE_POOL)
        .cloned()
        .unwrap_or_default();
    Ok(LaunchRequest {
        node: crate::cloud::NodeLaunch::default(),
        claim: name.clone(),
        node_pool: pool.clone(),
        candidates,
        tags: BTreeMap::from([
            (labels::TAG_NODEPOOL.to_string(), pool),
            (labels::TAG_NODECLAIM.to_string(), name),
            (labels::TAG_CLUSTER.to_string(), cluster_name.to_string()),
        ]),
    })
}

/// The node-level launch settings: the claim's labels and taints and its AKSNodeClass's
/// image, disk, subnet and kubelet settings (defaults when the class is not found).
pub fn node_launch(
    claim: &NodeClaim,
    class: Option<&crate::apis::AKSNodeClass>,
) -> crate::cloud::NodeLaunch {
    let taint = |t: &k8s_openapi::api::core::v1::Taint| match &t.value {
        Some(v) => format!("{}={}:{}", t.key, v, t.effect),
        None => format!("{}:{}", t.key, t.effect),
    };
    let mut node = crate::cloud::NodeLaunch {
        labels: claim.labels().clone(),
        // The node boots with the unregistered taint; registration removes it once the
        // claim has adopted the node (as Karpenter's bootstrap does).
        taints: std::iter::once(format!("{}:NoExecute", labels::UNREGISTERED_TAINT_KEY))
            .chain(
                claim
                    .spec
                    .taints
                    .iter()
                    .chain(&claim.spec.startup_taints)
                    .map(taint),
            )
            .collect(),
        ..Default::default()
    };
    // Single-valued `In` requirements are labels the node must carry (Karpenter does the same).
    for r in &claim.spec.requirements {
        if r.operator == crate::apis::nodeclaim::RequirementOperator::In
            && let [v] = r.values.as_slice()
        {
            node.labels
                .entry(r.key.clone())
                .or_insert_with(|| v.clone());
        }
    }
    if let Some(class) = class {
        let spec = &class.spec;
        node.image_family = spec.image_family;
        node.image_version = spec.image_version.clone();
        node.images = class
            .status
            .as_ref()
            .and_then(|s| s.images.clone())
            .unwrap_or_default();
        node.subnet_id = spec.vnet_subnet_id.clone();
        node.os_disk_size_gb = spec.os_disk_size_gb;
        node.max_pods = spec.max_pods.and_then(|m| u32::try_from(m).ok());
        node.kubelet = spec.kubelet.clone();
    }
    node
}

/// Launches the claim's instance and records the result on the claim.
pub async fn launch<C: CloudProvider>(ctx: &Context<C>, claim: &NodeClaim) {
    let name = claim.name_any();
    let pool = claim
        .labels()
        .get(labels::NODE_POOL)
        .cloned()
        .unwrap_or_default();
    let types = match ctx.cloud.instance_types().await {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(nodeclaim = %name, error = %e, "instance types unavailable; launch postponed");
            return;
        }
    };
    let now = ctx.clock.now();
    // Only what this step owns: other steps' conditions are applied by their own managers.
    let mut status = NodeClaimStatus::default();
    let request = match launch_request(claim, &types, &ctx.settings.cluster_name) {
        Ok(mut r) => {
            let class = ctx.state.node_class(&claim.spec.node_class_ref.name);
            r.node = node_launch(claim, class.as_ref());
            if let Some(class) = &class {
                for (k, v) in &class.spec.tags {
                    r.tags.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
            r
        }
        Err(message) => {
            set_condition(
                &mut status.conditions,
                condition(cond::LAUNCHED, false, reason::LAUNCH_FAILED, message, now),
            );
            let _ = ctx
                .writer
                .apply_node_claim_status(&name, "launch", &status)
                .await;
            return;
        }
    };
    let started = std::time::Instant::now();
    let result = if request.candidates.is_empty() {
        Err(CloudError::InsufficientCapacity {
            claim: name.clone(),
            tried: Vec::new(),
        })
    } else {
        ctx.cloud.create(&request).await
    };
    ctx.metrics
        .observe_decision("launch", started.elapsed().as_secs_f64());
    // A launch may have cached offerings as unavailable: refresh their count now.
    let _ = ctx.instance_types().await;
    let now = ctx.clock.now();
    match result {
        Ok(instance) => {
            super::observe_stage(ctx, claim, Stage::Launched, None, now);
            ctx.metrics.nodeclaim_launched(
                &pool,
                &instance.instance_type,
                instance.capacity_type.as_str(),
                &instance.zone,
            );
            let labels = BTreeMap::from([
                (
                    labels::INSTANCE_TYPE.to_string(),
                    instance.instance_type.clone(),
                ),
                (labels::ZONE.to_string(), instance.zone.clone()),
                (
                    labels::CAPACITY_TYPE.to_string(),
                    instance.capacity_type.as_str().to_string(),
                ),
                (labels::NODE_POOL.to_string(), pool.clone()),
            ]);
            if let Err(e) = ctx.writer.label_node_claim(&name, &labels).await {
                tracing::warn!(nodeclaim = %name, error = %e, "labelling nodeclaim failed");
            }
            if let Some(t) = types.iter().find(|t| t.name == instance.instance_type) {
                status.capacity = quantities(&t.capacity);
                status.allocatable = quantities(&t.allocatable);
            }
            status.provider_id = Some(instance.provider_id.clone());
            status.image_id = Some(instance.image_id.clone());
            set_condition(
                &mut status.conditions,
                condition(
                    cond::LAUNCHED,
                    true,
                    reason::LAUNCHED,
                    format!(
                        "{} in {} ({})",
                        instance.instance_type, instance.zone, instance.capacity_type
                    ),
                    now,
                ),
            );
            if let Err(e) = ctx
                .writer
                .apply_node_claim_status(&name, "launch", &status)
                .await
            {
                tracing::warn!(nodeclaim = %name, error = %e, "recording the launch failed; the next launch finds the instance");
            }
            tracing::info!(nodeclaim = %name, instance_type = %instance.instance_type, zone = %instance.zone, "launched");
        }
        Err(e) => {
            let (why, give_up) = match &e {
                CloudError::InsufficientCapacity { .. } => (reason::INSUFFICIENT_CAPACITY, true),
                CloudError::Quota { .. } => (reason::QUOTA_EXCEEDED, true),
                _ => (reason::LAUNCH_FAILED, false),
            };
            tracing::warn!(nodeclaim = %name, error = %e, "launch failed");
            set_condition(
                &mut status.conditions,
                condition(cond::LAUNCHED, false, why, e.to_string(), now),
            );
            let _ = ctx
                .writer
                .apply_node_claim_status(&name, "launch", &status)
                .await;
            ctx.writer
                .event(
                    &reference(claim),
                    EventType::Warning,
                    why,
                    "Launch",
                    e.to_string(),
                )
                .await;
            if give_up {
                // Its pods are planned again, without the offerings now cached unavailable.
                if let Err(e) = ctx.writer.delete_node_claim(&name).await {
                    tracing::warn!(nodeclaim = %name, error = %e, "deleting the unlaunchable nodeclaim failed");
                }
                ctx.metrics.nodeclaim_terminated(&pool, "launch_failed");
            } else {
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{Catalog, CatalogOptions};

    fn claim(requirements: &str, cpu: &str) -> NodeClaim {
        serde_yaml::from_str(&format!(
            "apiVersion: tailor.sh/v1alpha1\nkind: NodeClaim\nmetadata: {{name: default-abcde, labels: {{tailor.sh/nodepool: default}}}}\nspec:\n  nodeClassRef: {{group: tailor.sh, kind: AKSNodeClass, name: default}}\n  resources: {{requests: {{cpu: '{cpu}', memory: 1Gi}}}}\n  requirements: {requirements}\n"
        ))
        .expect("valid nodeclaim")
    }

    fn types() -> Vec<InstanceType> {
        Catalog::builtin()
            .expect("builtin catalog")
            .instance_types(&CatalogOptions::for_region("eastus"))
            .expect("eastus types")
    }

    #[test]
    fn candidates_are_the_admitted_offerings_that_fit_cheapest_first() {
        let c = claim(
            "[{key: node.kubernetes.io/instance-type, operator: In, values: [Standard_D2s_v5, Standard_D4s_v5, Standard_D8s_v5]}, {key: topology.kubernetes.io/zone, operator: In, values: [eastus-2]}, {key: tailor.sh/capacity-type, operator: In, values: [on-demand]}]",
            "3",
        );
        let request = launch_request(&c, &types(), "test").expect("request");
        let names: Vec<&str> = request
            .candidates
            .iter()
            .map(|c| c.instance_type.as_str())
            .collect();
        // D2s_v5 admitted but too small for 3 cores; the rest cheapest first, one zone.
        assert_eq!(names, ["Standard_D4s_v5", "Standard_D8s_v5"]);
        assert!(request.candidates.iter().all(|c| c.zone == "eastus-2"));
        assert_eq!(
            request.tags.get(labels::TAG_CLUSTER).map(String::as_str),
            Some("test")
        );
        assert_eq!(request.node_pool, "default");
    }

    #[test]
    fn unavailable_offerings_are_not_candidates() {
        let c = claim(
            "[{key: node.kubernetes.io/instance-type, operator: In, values: [Standard_D4s_v5]}, {key: tailor.sh/capacity-type, operator: In, values: [on-demand]}]",
            "1",
        );
        let mut ts = types();
        let all = launch_request(&c, &ts, "test")
            .expect("request")
            .candidates
            .len();
        assert!(all >= 2, "D4s_v5 is sold in several zones");
        for t in ts.iter_mut().filter(|t| t.name == "Standard_D4s_v5") {
            // Offerings are cheapest first, spot before on-demand: take an on-demand one.
            if let Some(o) = t
                .offerings
                .iter_mut()
                .find(|o| o.capacity_type == crate::model::CapacityType::OnDemand)
            {
                o.available = false;
            }
        }
        assert_eq!(
            launch_request(&c, &ts, "test")
                .expect("request")
                .candidates
                .len(),
            all - 1
        );
    }
}
