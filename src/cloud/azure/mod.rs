//! The Azure Resource Manager cloud: VMs launched as Karpenter's Azure provider launches
//! them in its default mode (a NIC named after the claim, then the VM), deleted with their
//! NIC, listed by tag, and a live catalog of sizes and prices refreshed every 12 hours.
//!
//! - [`arm`]: the calls, through azure_mgmt_compute/azure_core 0.21, with Tailor's own
//!   long-running-operation polling.
//! - [`classify`]: what an ARM error means for the unavailable-offerings cache (pure).
//! - [`resources`]: NIC and VM bodies, names, provider IDs, tags (pure).
//! - [`bootstrap`]: the custom data that joins the node to the cluster (pure).
//! - [`catalog`]: Resource SKUs and Retail Prices into a [`Catalog`].
//! - [`auth`]: workload identity that re-reads its token file, managed identity.

pub mod arm;
pub mod auth;
pub mod bootstrap;
pub mod catalog;
pub mod classify;
pub mod resources;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use azure_core::auth::TokenCredential;
use jiff::Timestamp;
use serde_json::Value;

use self::arm::{Arm, ArmError, ArmSettings, Outcome};
use self::bootstrap::ClusterBootstrap;
use self::classify::{ArmFailure, CapacityTypes, Mark, Reason, Zones, classify};
use self::resources::{Placement, SkuFacts, VmSpec};
use super::unavailable::UnavailableOfferings;
use super::{
    CloudError, CloudProvider, DriftReason, Instance, InstanceState, Interruption, LaunchCandidate,
    LaunchRequest, Result,
};
use crate::apis::labels;
use crate::catalog::{CatalogOptions, SharedCatalog};
use crate::clock::Clock;
use crate::model::{CapacityType, InstanceType};

/// How often the live catalog is read again (Karpenter refreshes prices every 12 h).
pub const CATALOG_REFRESH: Duration = Duration::from_secs(12 * 3600);
/// The public cloud's ARM endpoint.
pub const DEFAULT_ARM_ENDPOINT: &str = "https://management.azure.com";
/// The public Retail Prices endpoint.
pub const DEFAULT_PRICES_ENDPOINT: &str = "https://prices.azure.com";

/// Everything the Azure cloud needs to know.
#[derive(Debug, Clone)]
pub struct AzureSettings {
    /// Where VMs go.
    pub placement: Placement,
    /// The cluster's name, tagged on every resource.
    pub cluster_name: String,
    /// How nodes join.
    pub bootstrap: ClusterBootstrap,
    /// ARM endpoint, retries and polling.
    pub arm: ArmSettings,
    /// Retail Prices endpoint (scheme and host).
    pub prices_endpoint: String,
    /// Throttled launches are retried after this long.
    pub throttle_backoff: Duration,
}

/// The Azure cloud. Clones share caches.
#[derive(Clone)]
pub struct AzureCloud {
    arm: Arm,
    http: reqwest::Client,
    clock: Arc<dyn Clock>,
    settings: Arc<AzureSettings>,
    catalog: SharedCatalog,
    catalog_options: CatalogOptions,
    facts: Arc<RwLock<BTreeMap<String, SkuFacts>>>,
    unavailable: Arc<Mutex<UnavailableOfferings>>,
    in_flight: Arc<Mutex<BTreeSet<String>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data: a panic elsewhere cannot leave it half-written.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Removes a launch's name from the in-flight set however the launch ends.
struct InFlight<'a>(&'a Mutex<BTreeSet<String>>, String);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        lock(self.0).remove(&self.1);
    }
}

impl AzureCloud {
    /// A cloud selling what `catalog` lists (the built-in catalog until the first
    /// [`AzureCloud::refresh_catalog`]).
    pub fn new(
        credential: Arc<dyn TokenCredential>,
        settings: AzureSettings,
        clock: Arc<dyn Clock>,
        catalog: SharedCatalog,
        catalog_options: CatalogOptions,
    ) -> Self {
        let arm = Arm::new(
            credential,
            settings.arm.clone(),
            &settings.placement.subscription_id,
            &settings.placement.resource_group,
        );
        AzureCloud {
            arm,
            http: reqwest::Client::new(),
            clock,
            settings: Arc::new(settings),
            catalog,
            catalog_options,
            facts: Arc::new(RwLock::new(BTreeMap::new())),
            unavailable: Arc::new(Mutex::new(UnavailableOfferings::default())),
            in_flight: Arc::new(Mutex::new(BTreeSet::new())),
        }
    }

    /// The shared catalog the cloud refreshes.
    pub fn catalog(&self) -> SharedCatalog {
        self.catalog.clone()
    }

    /// ARM requests sent so far (retries included).
    pub fn arm_calls(&self) -> u64 {
        self.arm.calls()
    }

    /// Reads the live catalog; on failure the last good one stays.
    pub async fn refresh_catalog(&self) -> std::result::Result<(), catalog::LiveCatalogError> {
        let (fresh, skus) = catalog::fetch(
            &self.arm,
            &self.http,
            &self.settings.prices_endpoint,
            &self.settings.placement.location,
        )
        .await?;
        *self.catalog.write().unwrap_or_else(PoisonError::into_inner) = fresh;
        *self.facts.write().unwrap_or_else(PoisonError::into_inner) = skus.facts;
        Ok(())
    }

    /// Refreshes the catalog every `interval` until aborted, keeping the last good one.
    pub async fn refresh_forever(self, interval: Duration) {
        loop {
            tokio::time::sleep(interval).await;
            if let Err(e) = self.refresh_catalog().await {
                tracing::warn!(error = %e, "live catalog refresh failed; keeping the last good catalog");
            }
        }
    }

    fn facts_of(&self, size: &str) -> SkuFacts {
        if let Some(f) = self
            .facts
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(size)
        {
            return f.clone();
        }
        let catalog = self.catalog.read().unwrap_or_else(PoisonError::into_inner);
        let sku = catalog.skus().iter().find(|s| s.sku.name == size);
        SkuFacts {
            vcpus: sku.map_or(0, |s| s.sku.vcpus),
            arm64: sku.is_some_and(|s| s.sku.arch == "arm64"),
            hyperv_gen2: true,
            ..SkuFacts::default()
        }
    }

    fn types_now(&self) -> Vec<InstanceType> {
        let catalog = self.catalog.read().unwrap_or_else(PoisonError::into_inner);
        catalog
            .instance_types(&self.catalog_options)
            .unwrap_or_default()
    }

    fn price_of(&self, size: &str, zone: &str, ct: CapacityType) -> f64 {
        self.types_now()
            .iter()
            .find(|t| t.name == size)
            .and_then(|t| {
                t.offerings
                    .iter()
                    .find(|o| o.zone == zone && o.capacity_type == ct)
            })
            .map_or(0.0, |o| o.price_per_hour)
    }

    fn is_unavailable(&self, c: &LaunchCandidate, now: Timestamp) -> bool {
        let facts = self.facts_of(&c.instance_type);
        lock(&self.unavailable).is_offering_unavailable(
            &c.instance_type,
            facts.family.as_deref(),
            facts.vcpus,
            &c.zone,
            c.capacity_type,
            now,
        )
    }

    /// Applies a verdict's marks for the attempted offering.
    fn mark(&self, c: &LaunchCandidate, marks: &[Mark], now: Timestamp) {
        let facts = self.facts_of(&c.instance_type);
        let all_zones: Vec<String> = self
            .types_now()
            .iter()
            .find(|t| t.name == c.instance_type)
            .map(|t| {
                let z: BTreeSet<String> = t.offerings.iter().map(|o| o.zone.clone()).collect();
                z.into_iter().collect()
            })
            .unwrap_or_default();
        let mut cache = lock(&self.unavailable);
        for mark in marks {
            match *mark {
                Mark::Offering {
                    zones,
                    capacity_types,
                    ttl,
                } => {
                    let zones: Vec<String> = match zones {
                        Zones::Attempted => vec![c.zone.clone()],
                        Zones::All => {
                            let mut z = all_zones.clone();
                            if !z.contains(&c.zone) {
                                z.push(c.zone.clone());
                            }
                            z
                        }
                    };
                    let cts = match capacity_types {
                        CapacityTypes::Attempted => vec![c.capacity_type],
                        CapacityTypes::Both => vec![CapacityType::OnDemand, CapacityType::Spot],
                    };
                    for z in &zones {
                        for ct in &cts {
                            cache.mark_for(&c.instance_type, z, *ct, now, ttl);
                        }
                    }
                }
                Mark::Family { min_vcpus, ttl } => {
                    let family = facts
                        .family
                        .clone()
                        .unwrap_or_else(|| c.instance_type.clone());
                    let mut zones = all_zones.clone();
                    if !zones.contains(&c.zone) {
                        zones.push(c.zone.clone());
                    }
                    for z in &zones {
                        cache.mark_family(&family, z, c.capacity_type, min_vcpus, now, ttl);
                    }
                    if facts.family.is_none() {
                        cache.mark_for(&c.instance_type, &c.zone, c.capacity_type, now, ttl);
                    }
                }
                Mark::CapacityType { capacity_type, ttl } => {
                    cache.mark_capacity_type(capacity_type, now, ttl);
                }
            }
        }
    }

    fn api_error(&self, e: ArmError) -> CloudError {
        match e {
            ArmError::Status { failure, .. } if failure.status == Some(429) => {
                CloudError::Throttled {
                    retry_after_seconds: failure
                        .retry_after_seconds
                        .unwrap_or(self.settings.throttle_backoff.as_secs()),
                }
            }
            ArmError::Status { operation, failure } => CloudError::Api {
                operation,
                code: if failure.code.is_empty() {
                    failure
                        .status
                        .map_or_else(String::new, |s| format!("HTTP {s}"))
                } else {
                    failure.code
                },
                message: failure.message,
            },
            other => CloudError::Unavailable(other.to_string()),
        }
    }

    /// The instance a VM's JSON describes; `None` when it is not this cluster's.
    fn instance_from(&self, vm: &Value) -> Option<Instance> {
        let tags: BTreeMap<String, String> = vm
            .get("tags")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        if tags.get(labels::TAG_CLUSTER) != Some(&self.settings.cluster_name) {
            return None;
        }
        let id = vm.get("id").and_then(Value::as_str)?;
        let name = vm.get("name").and_then(Value::as_str)?;
        let location = vm
            .get("location")
            .and_then(Value::as_str)
            .unwrap_or(&self.settings.placement.location);
        let props = vm.get("properties").cloned().unwrap_or(Value::Null);
        let size = props
            .pointer("/hardwareProfile/vmSize")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let zone = vm
            .pointer("/zones/0")
            .and_then(Value::as_str)
            .map_or_else(|| location.to_string(), |n| format!("{location}-{n}"));
        let capacity_type = match props.get("priority").and_then(Value::as_str) {
            Some("Spot") | Some("Low") => CapacityType::Spot,
            _ => CapacityType::OnDemand,
        };
        let state = match props.get("provisioningState").and_then(Value::as_str) {
            Some("Creating") | Some("Updating") => InstanceState::Launching,
            Some("Deleting") => InstanceState::Terminating,
            _ => InstanceState::Running,
        };
        let image = props
            .pointer("/storageProfile/imageReference/communityGalleryImageId")
            .or_else(|| props.pointer("/storageProfile/imageReference/id"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let created_at = props
            .get("timeCreated")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<Timestamp>().ok())
            .unwrap_or(Timestamp::UNIX_EPOCH);
        let claim = tags.get(labels::TAG_NODECLAIM).cloned().unwrap_or_else(|| {
            name.strip_prefix(resources::NAME_PREFIX)
                .unwrap_or(name)
                .to_string()
        });
        Some(Instance {
            provider_id: resources::provider_id(id),
            claim,
            price_per_hour: self.price_of(&size, &zone, capacity_type),
            instance_type: size,
            zone,
            capacity_type,
            image_id: image,
            created_at,
            state,
            tags,
        })
    }

    /// Deletes NICs tagged for this cluster that no VM uses and no launch is creating: the
    /// leftovers of a crash between the NIC and the VM. Returns how many went.
    pub async fn delete_orphan_nics(&self) -> Result<usize> {
        let nics = self.arm.list_nics().await.map_err(|e| self.api_error(e))?;
        let in_flight = lock(&self.in_flight).clone();
        let mut deleted = 0;
        for nic in nics {
            let ours = nic
                .pointer(&format!("/tags/{}", labels::TAG_CLUSTER))
                .and_then(Value::as_str)
                == Some(self.settings.cluster_name.as_str());
            let attached = nic.pointer("/properties/virtualMachine/id").is_some();
            let Some(name) = nic.get("name").and_then(Value::as_str) else {
                continue;
            };
            if !ours || attached || in_flight.contains(name) {
                continue;
            }
            // The VM may exist yet not be reflected on the NIC: never strand a VM.
            if self
                .arm
                .get_vm(name)
                .await
                .map_err(|e| self.api_error(e))?
                .is_some()
            {
                continue;
            }
            tracing::warn!(nic = name, "network interface without a VM; deleting it");
            self.arm
                .delete_nic(name)
                .await
                .map_err(|e| self.api_error(e))?;
            deleted += 1;
        }
        Ok(deleted)
    }

    async fn create_inner(&self, request: &LaunchRequest) -> Result<Instance> {
        let claim = &request.claim;
        if request.candidates.is_empty() {
            return Err(CloudError::InvalidRequest {
                claim: claim.clone(),
                reason: "no candidate offerings".to_string(),
            });
        }
        let p = &self.settings.placement;
        let name = resources::resource_name(claim);
        lock(&self.in_flight).insert(name.clone());
        let _guard = InFlight(&self.in_flight, name.clone());
        // A launch retried after a crash or by a new leader finds the VM it made.
        if let Some(vm) = self
            .arm
            .get_vm(&name)
            .await
            .map_err(|e| self.api_error(e))?
        {
            let failed = vm
                .pointer("/properties/provisioningState")
                .and_then(Value::as_str)
                == Some("Failed");
            if !failed && let Some(i) = self.instance_from(&vm) {
                return Ok(i);
            }
            self.arm
                .delete_vm(&name)
                .await
                .map_err(|e| self.api_error(e))?;
        }
        let tags = resources::tags(&request.tags);
        let nic_id = resources::nic_id(p, &name);
        let vm_id = resources::vm_id(p, &name);
        let provider_id = resources::provider_id(&vm_id);
        let custom_data =
            bootstrap::custom_data(&self.settings.bootstrap, &request.node, &provider_id);
        let mut nic: Option<bool> = None; // accelerated networking of the NIC made so far
        let mut made_nic = false;
        let mut tried = Vec::new();
        let mut quota: Option<Reason> = None;
        let outcome: Result<Instance> = 'attempts: {
            for c in &request.candidates {
                let now = self.clock.now();
                if self.is_unavailable(c, now) {
                    tried.push(c.describe());
                    continue;
                }
                let facts = self.facts_of(&c.instance_type);
                if nic != Some(facts.accelerated_networking) {
                    if nic.is_some() {
                        // Accelerated networking cannot change while the NIC could be attached.
                        if let Err(e) = self.arm.delete_nic(&name).await {
                            break 'attempts Err(self.api_error(e));
                        }
                    }
                    let body = resources::nic_body(p, &request.node, &facts, &tags);
                    if let Err(e) = self.arm.put_nic(&name, &body).await {
                        break 'attempts Err(self.api_error(e));
                    }
                    nic = Some(facts.accelerated_networking);
                    made_nic = true;
                }
                let image = resources::image_id(&request.node, &facts);
                let body = resources::vm_body(
                    p,
                    &VmSpec {
                        name: &name,
                        size: &c.instance_type,
                        zone: &c.zone,
                        capacity_type: c.capacity_type,
                        node: &request.node,
                        facts: &facts,
                        image_id: &image,
                        custom_data: &custom_data,
                        tags: &tags,
                        nic_id: &nic_id,
                    },
                );
                let failure: ArmFailure = match self.arm.put_vm(&name, &body).await {
                    Ok(Outcome::Succeeded) => {
                        break 'attempts Ok(Instance {
                            provider_id: provider_id.clone(),
                            claim: claim.clone(),
                            instance_type: c.instance_type.clone(),
                            zone: c.zone.clone(),
                            capacity_type: c.capacity_type,
                            price_per_hour: c.price_per_hour,
                            image_id: image,
                            created_at: now,
                            state: InstanceState::Running,
                            tags: tags.clone(),
                        });
                    }
                    Ok(Outcome::Failed(f)) => {
                        // An asynchronous failure leaves a Failed VM behind; remove it. Its
                        // NIC goes with it (deleteOption Delete): the next attempt makes a
                        // new one.
                        if let Err(e) = self.arm.delete_vm(&name).await {
                            break 'attempts Err(self.api_error(e));
                        }
                        nic = None;
                        f
                    }
                    Err(ArmError::Status { failure, .. }) => failure,
                    Err(e) => {
                        // A VM that never finished must not run on unowned: remove it.
                        if matches!(e, ArmError::Timeout { .. })
                            && let Err(d) = self.arm.delete_vm(&name).await
                        {
                            tracing::warn!(vm = %name, error = %d, "deleting a VM whose creation timed out failed; garbage collection retries");
                        }
                        break 'attempts Err(self.api_error(e));
                    }
                };
                let verdict = classify(&failure, c.capacity_type, facts.vcpus);
                tracing::info!(claim = %claim, offering = %c.describe(), code = %failure.code, reason = verdict.reason.as_str(), "launch attempt failed");
                self.mark(c, &verdict.marks, now);
                tried.push(c.describe());
                if matches!(
                    verdict.reason,
                    Reason::FamilyQuota
                        | Reason::SpotQuota
                        | Reason::RegionalQuota
                        | Reason::SubscriptionQuota
                ) {
                    quota = Some(verdict.reason);
                }
                if !verdict.try_next {
                    break 'attempts Err(match verdict.reason {
                        Reason::Throttled => CloudError::Throttled {
                            retry_after_seconds: failure
                                .retry_after_seconds
                                .unwrap_or(self.settings.throttle_backoff.as_secs()),
                        },
                        Reason::RegionalQuota | Reason::SubscriptionQuota => CloudError::Quota {
                            claim: claim.clone(),
                            family: "total regional cores".to_string(),
                            region: p.location.clone(),
                        },
                        _ => CloudError::Api {
                            operation: format!("create virtual machine {name} ({})", c.describe()),
                            code: failure.code.clone(),
                            message: failure.message.clone(),
                        },
                    });
                }
            }
            Err(match quota {
                Some(Reason::FamilyQuota) | Some(Reason::SpotQuota) => CloudError::Quota {
                    claim: claim.clone(),
                    family: request
                        .candidates
                        .iter()
                        .filter_map(|c| self.facts_of(&c.instance_type).family)
                        .collect::<BTreeSet<_>>()
                        .into_iter()
                        .collect::<Vec<_>>()
                        .join(","),
                    region: p.location.clone(),
                },
                _ => CloudError::InsufficientCapacity {
                    claim: claim.clone(),
                    tried,
                },
            })
        };
        if outcome.is_err() && made_nic {
            // No orphan NIC after a failed launch.
            if let Err(e) = self.arm.delete_nic(&name).await {
                tracing::warn!(nic = %name, error = %e, "deleting the network interface of a failed launch failed; garbage collection retries");
            }
        }
        outcome
    }
}

impl CloudProvider for AzureCloud {
    async fn create(&self, request: &LaunchRequest) -> Result<Instance> {
        self.create_inner(request).await
    }

    async fn delete(&self, provider_id: &str) -> Result<()> {
        let name = resources::vm_name(provider_id).ok_or_else(|| CloudError::NotFound {
            provider_id: provider_id.to_string(),
        })?;
        self.arm
            .delete_vm(name)
            .await
            .map_err(|e| self.api_error(e))?;
        // deleteOption Delete removes the NIC with the VM; a NIC that stayed (an older
        // VM, a failed cascade) goes now.
        self.arm
            .delete_nic(name)
            .await
            .map_err(|e| self.api_error(e))
    }

    async fn get(&self, provider_id: &str) -> Result<Instance> {
        let not_found = || CloudError::NotFound {
            provider_id: provider_id.to_string(),
        };
        let name = resources::vm_name(provider_id).ok_or_else(not_found)?;
        self.arm
            .get_vm(name)
            .await
            .map_err(|e| self.api_error(e))?
            .and_then(|vm| self.instance_from(&vm))
            .ok_or_else(not_found)
    }

    async fn list(&self) -> Result<Vec<Instance>> {
        Ok(self
            .arm
            .list_vms()
            .await
            .map_err(|e| self.api_error(e))?
            .iter()
            .filter_map(|vm| self.instance_from(vm))
            .collect())
    }

    async fn instance_types(&self) -> Result<Vec<InstanceType>> {
        let now = self.clock.now();
        let mut types = self.types_now();
        for t in &mut types {
            let facts = self.facts_of(&t.name);
            let cache = lock(&self.unavailable);
            for o in &mut t.offerings {
                o.available = !cache.is_offering_unavailable(
                    &t.name,
                    facts.family.as_deref(),
                    t.sku.vcpus,
                    &o.zone,
                    o.capacity_type,
                    now,
                );
            }
        }
        Ok(types)
    }

    async fn is_drifted(&self, instance: &Instance) -> Result<Option<DriftReason>> {
        let sold = self
            .types_now()
            .iter()
            .any(|t| t.name == instance.instance_type);
        Ok((!sold).then_some(DriftReason::InstanceTypeRemoved))
    }

    async fn interruptions(&self) -> Result<Vec<Interruption>> {
        Ok(Vec::new())
    }

    async fn collect_leaked(&self) -> Result<usize> {
        self.delete_orphan_nics().await
    }
}
