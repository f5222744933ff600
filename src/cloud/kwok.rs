//! A cloud whose "VMs" are fake Nodes in a real Kubernetes cluster, for testing the agent
//! against a real control plane (as Karpenter's KWOK provider does).
//!
//! A launch creates, after a configurable delay, a Node named after the NodeClaim with the
//! annotation `kwok.x-k8s.io/node: fake` (so KWOK or Tailor's kubelet stand-in runs it),
//! `spec.providerID: kwok://<name>`, the instance type's labels, capacity and allocatable
//! from the catalog, and the unregistered taint a real node boots with. Deleting the
//! instance deletes the Node. Capacity errors can be injected per offering; offerings that
//! failed are cached as unavailable for a TTL, like the Azure provider does.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};

use super::unavailable::UnavailableOfferings;
use super::{
    CloudError, CloudProvider, DriftReason, Instance, InstanceState, Interruption, LaunchRequest,
    Result,
};
use crate::apis::labels;
use crate::clock::Clock;
use crate::model::{CapacityType, InstanceType, Resources};

/// The annotation KWOK (and the kubelet stand-in) select the nodes they run by.
pub const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";
/// Its value.
pub const KWOK_NODE_VALUE: &str = "fake";
/// Provider ID scheme of KWOK nodes.
pub const PROVIDER_ID_PREFIX: &str = "kwok://";
/// Label naming the cluster an instance was launched for; the garbage collector lists by it.
pub const CLUSTER_LABEL: &str = "tailor.sh/cluster";
/// Prefix of the annotations that carry an instance's tags.
pub const TAG_ANNOTATION_PREFIX: &str = "tags.tailor.sh/";

/// How the KWOK cloud behaves.
#[derive(Debug, Clone)]
pub struct KwokSettings {
    /// The cluster name written on every instance.
    pub cluster_name: String,
    /// Delay between a launch request and the Node's creation.
    pub launch_delay: Duration,
    /// Offerings (`type`, `zone`, `capacity type`) that fail with insufficient capacity.
    pub no_capacity: BTreeSet<(String, String, CapacityType)>,
    /// How long a failed offering stays unavailable.
    pub unavailable_ttl: SignedDuration,
}

/// Fake VMs as KWOK Nodes. Clones share the unavailable-offerings cache.
#[derive(Clone)]
pub struct KwokCloud {
    client: Client,
    clock: Arc<dyn Clock>,
    settings: KwokSettings,
    instance_types: Arc<Vec<InstanceType>>,
    unavailable: Arc<Mutex<UnavailableOfferings>>,
}

impl KwokCloud {
    /// A KWOK cloud selling `instance_types` in the cluster behind `client`.
    pub fn new(
        client: Client,
        clock: Arc<dyn Clock>,
        instance_types: Vec<InstanceType>,
        settings: KwokSettings,
    ) -> Self {
        KwokCloud {
            client,
            clock,
            unavailable: Arc::new(Mutex::new(UnavailableOfferings::with_ttl(
                settings.unavailable_ttl,
            ))),
            settings,
            instance_types: Arc::new(instance_types),
        }
    }

    fn cache(&self) -> MutexGuard<'_, UnavailableOfferings> {
        // Plain data: a panic elsewhere cannot leave it half-written.
        self.unavailable
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    fn node_for(
        &self,
        request: &LaunchRequest,
        it: &InstanceType,
        zone: &str,
        ct: CapacityType,
    ) -> Node {
        let mut node_labels = it.labels();
        node_labels.insert(labels::HOSTNAME.to_string(), request.claim.clone());
        node_labels.insert(labels::ZONE.to_string(), zone.to_string());
        node_labels.insert(labels::CAPACITY_TYPE.to_string(), ct.as_str().to_string());
        node_labels.insert(labels::NODE_POOL.to_string(), request.node_pool.clone());
        node_labels.insert(
            CLUSTER_LABEL.to_string(),
            self.settings.cluster_name.clone(),
        );
        let mut annotations = BTreeMap::from([(
            KWOK_NODE_ANNOTATION.to_string(),
            KWOK_NODE_VALUE.to_string(),
        )]);
        for (k, v) in &request.tags {
            annotations.insert(format!("{TAG_ANNOTATION_PREFIX}{k}"), v.clone());
        }
        Node {
            metadata: ObjectMeta {
                name: Some(request.claim.clone()),
                labels: Some(node_labels),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                provider_id: Some(format!("{PROVIDER_ID_PREFIX}{}", request.claim)),
                taints: Some(vec![Taint {
                    key: labels::UNREGISTERED_TAINT_KEY.to_string(),
                    effect: "NoExecute".to_string(),
                    ..Taint::default()
                }]),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                capacity: Some(quantities(&it.capacity)),
                allocatable: Some(quantities(&it.allocatable)),
                ..NodeStatus::default()
            }),
        }
    }

    fn instance_from(&self, node: &Node) -> Option<Instance> {
        let name = node.metadata.name.clone()?;
        let l = node.metadata.labels.as_ref()?;
        if l.get(CLUSTER_LABEL) != Some(&self.settings.cluster_name) {
            return None;
        }
        let instance_type = l.get(labels::INSTANCE_TYPE).cloned().unwrap_or_default();
        let zone = l.get(labels::ZONE).cloned().unwrap_or_default();
        let capacity_type = l
            .get(labels::CAPACITY_TYPE)
            .and_then(|c| CapacityType::parse(c))
            .unwrap_or(CapacityType::OnDemand);
        let price_per_hour = self
            .instance_types
            .iter()
            .find(|t| t.name == instance_type)
            .and_then(|t| {
                t.offerings
                    .iter()
                    .find(|o| o.zone == zone && o.capacity_type == capacity_type)
            })
            .map_or(0.0, |o| o.price_per_hour);
        let tags = node
            .metadata
            .annotations
            .iter()
            .flatten()
            .filter_map(|(k, v)| {
                k.strip_prefix(TAG_ANNOTATION_PREFIX)
                    .map(|k| (k.to_string(), v.clone()))
            })
            .collect::<BTreeMap<_, _>>();
        Some(Instance {
            provider_id: format!("{PROVIDER_ID_PREFIX}{name}"),
            claim: tags
                .get(labels::TAG_NODECLAIM)
                .cloned()
                .unwrap_or_else(|| name.clone()),
            instance_type,
            zone,
            capacity_type,
            price_per_hour,
            image_id: "kwok".to_string(),
            created_at: node
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(Timestamp::UNIX_EPOCH, |t| t.0),
            state: if node.metadata.deletion_timestamp.is_some() {
                InstanceState::Terminating
            } else {
                InstanceState::Running
            },
            tags,
        })
    }

    fn name_of(provider_id: &str) -> Result<&str> {
        provider_id
            .strip_prefix(PROVIDER_ID_PREFIX)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| CloudError::NotFound {
                provider_id: provider_id.to_string(),
            })
    }

    async fn create_inner(&self, request: &LaunchRequest) -> Result<Instance> {
        if request.candidates.is_empty() {
            return Err(CloudError::InvalidRequest {
                claim: request.claim.clone(),
                reason: "no candidate offerings".to_string(),
            });
        }
        // A launch for a claim whose node exists already (a retry after a crash, or a second
        // leader) returns that node instead of making a second one.
        if let Some(existing) = self
            .nodes()
            .get_opt(&request.claim)
            .await
            .map_err(api_error(&request.claim))?
            .and_then(|n| self.instance_from(&n))
        {
            return Ok(existing);
        }
        let mut tried = Vec::new();
        for candidate in &request.candidates {
            let now = self.clock.now();
            let key = (
                candidate.instance_type.clone(),
                candidate.zone.clone(),
                candidate.capacity_type,
            );
            if self.cache().is_unavailable(&key.0, &key.1, key.2, now) {
                tried.push(candidate.describe());
                continue;
            }
            let Some(it) = self
                .instance_types
                .iter()
                .find(|t| t.name == candidate.instance_type)
            else {
                return Err(CloudError::InvalidRequest {
                    claim: request.claim.clone(),
                    reason: format!("unknown instance type {}", candidate.instance_type),
                });
            };
            if self.settings.no_capacity.contains(&key) {
                self.cache().mark(&key.0, &key.1, key.2, now);
                tried.push(candidate.describe());
                continue;
            }
            tokio::time::sleep(self.settings.launch_delay).await;
            let node = self.node_for(request, it, &candidate.zone, candidate.capacity_type);
            let created = match self.nodes().create(&PostParams::default(), &node).await {
                Ok(n) => n,
                Err(kube::Error::Api(s)) if s.code == 409 => self
                    .nodes()
                    .get(&request.claim)
                    .await
                    .map_err(api_error(&request.claim))?,
                Err(e) => return Err(api_error(&request.claim)(e)),
            };
            let mut instance =
                self.instance_from(&created)
                    .ok_or_else(|| CloudError::InvalidRequest {
                        claim: request.claim.clone(),
                        reason: "node was created for another cluster".to_string(),
                    })?;
            instance.price_per_hour = candidate.price_per_hour;
            return Ok(instance);
        }
        Err(CloudError::InsufficientCapacity {
            claim: request.claim.clone(),
            tried,
        })
    }
}

/// Resources as Kubernetes quantities, for Node status.
pub fn quantities(r: &Resources) -> BTreeMap<String, Quantity> {
    r.to_quantities()
        .into_iter()
        .map(|(k, v)| (k, Quantity(v)))
        .collect()
}

/// Maps an API error of the fake cloud's Kubernetes calls to a cloud error.
fn api_error(claim: &str) -> impl Fn(kube::Error) -> CloudError + '_ {
    move |e| match e {
        kube::Error::Api(s) if s.code == 429 => CloudError::Throttled {
            retry_after_seconds: 1,
        },
        other => CloudError::InvalidRequest {
            claim: claim.to_string(),
            reason: other.to_string(),
        },
    }
}

impl CloudProvider for KwokCloud {
    async fn create(&self, request: &LaunchRequest) -> Result<Instance> {
        self.create_inner(request).await
    }

    async fn delete(&self, provider_id: &str) -> Result<()> {
        let name = Self::name_of(provider_id)?;
        match self.nodes().delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(api_error(name)(e)),
        }
    }

    async fn get(&self, provider_id: &str) -> Result<Instance> {
        let name = Self::name_of(provider_id)?;
        self.nodes()
            .get_opt(name)
            .await
            .map_err(api_error(name))?
            .and_then(|n| self.instance_from(&n))
            .ok_or_else(|| CloudError::NotFound {
                provider_id: provider_id.to_string(),
            })
    }

    async fn list(&self) -> Result<Vec<Instance>> {
        let selector = format!("{CLUSTER_LABEL}={}", self.settings.cluster_name);
        let nodes = self
            .nodes()
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(api_error("list"))?;
        Ok(nodes
            .items
            .iter()
            .filter_map(|n| self.instance_from(n))
            .collect())
    }

    async fn instance_types(&self) -> Result<Vec<InstanceType>> {
        let now = self.clock.now();
        let cache = self.cache();
        Ok(self
            .instance_types
            .iter()
            .map(|t| {
                let mut t = t.clone();
                for o in &mut t.offerings {
                    o.available = !cache.is_unavailable(&t.name, &o.zone, o.capacity_type, now);
                }
                t
            })
            .collect())
    }

    async fn is_drifted(&self, _instance: &Instance) -> Result<Option<DriftReason>> {
        Ok(None)
    }

    async fn interruptions(&self) -> Result<Vec<Interruption>> {
        Ok(Vec::new())
    }
}

/// Parses `type/zone/capacity-type` (the `--kwok-no-capacity` flag's form).
pub fn parse_offering(s: &str) -> std::result::Result<(String, String, CapacityType), String> {
    let parts: Vec<&str> = s.split('/').collect();
    match parts.as_slice() {
        [t, z, c] if !t.is_empty() && !z.is_empty() => {
            let ct = CapacityType::parse(c)
                .ok_or_else(|| format!("{s}: capacity type {c:?} is not spot or on-demand"))?;
            Ok((t.to_string(), z.to_string(), ct))
        }
        _ => Err(format!(
            "{s}: expected INSTANCE-TYPE/ZONE/CAPACITY-TYPE, e.g. Standard_D4s_v5/eastus-1/on-demand"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offerings_parse_from_the_flag_form() {
        assert_eq!(
            parse_offering("Standard_D4s_v5/eastus-1/spot"),
            Ok((
                "Standard_D4s_v5".to_string(),
                "eastus-1".to_string(),
                CapacityType::Spot
            ))
        );
        let err = parse_offering("Standard_D4s_v5/eastus-1").unwrap_err();
        assert!(err.contains("INSTANCE-TYPE/ZONE/CAPACITY-TYPE"), "{err}");
        let err = parse_offering("Standard_D4s_v5/eastus-1/reserved").unwrap_err();
        assert!(err.contains("\"reserved\""), "{err}");
    }

    #[test]
    fn provider_ids_name_the_node() {
        assert_eq!(
            KwokCloud::name_of("kwok://default-abc12"),
            Ok("default-abc12")
        );
        assert!(KwokCloud::name_of("azure:///subscriptions/x").is_err());
        assert!(KwokCloud::name_of("kwok://").is_err());
    }
}
