//! A simulated Azure: VMs that take time to launch and delete, injected capacity and
//! quota errors, throttling and spot interruptions, all on an injected clock so the demo,
//! tests and benchmarks are deterministic.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::{Future, ready};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use jiff::{SignedDuration, Timestamp};

use super::unavailable::UnavailableOfferings;
use super::{
    CloudError, CloudProvider, DriftReason, Instance, InstanceState, Interruption, LaunchRequest,
    Result,
};
use crate::clock::Clock;
use crate::model::{CapacityType, InstanceType};

/// How long Azure gives a spot VM between the eviction notice and its removal.
pub const SPOT_NOTICE: SignedDuration = SignedDuration::from_secs(30);

/// Timings and identity of the simulated cloud.
#[derive(Debug, Clone)]
pub struct SimSettings {
    /// Region name used in provider IDs.
    pub region: String,
    /// From create to running.
    pub launch_latency: SignedDuration,
    /// From delete to gone.
    pub delete_latency: SignedDuration,
    /// The image new VMs get.
    pub image_id: String,
}

impl Default for SimSettings {
    fn default() -> Self {
        SimSettings {
            region: "eastus".to_string(),
            launch_latency: SignedDuration::from_secs(60),
            delete_latency: SignedDuration::from_secs(30),
            image_id: "aks-ubuntu-2204-gen2-202611.01.0".to_string(),
        }
    }
}

#[derive(Debug, Clone)]
struct SimInstance {
    instance: Instance,
    deleted_at: Option<Timestamp>,
    vcpus: u32,
    family: String,
}

/// A create call the simulated cloud received, and what it answered.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateCall {
    /// When it came.
    pub at: Timestamp,
    /// The request as the provider sent it.
    pub request: LaunchRequest,
    /// The offerings (size, zone, capacity type) it found without capacity, in the order
    /// tried: each is unavailable from then on for the TTL of a capacity error.
    pub refused: Vec<(String, String, CapacityType)>,
    /// The instance type launched, or the error returned.
    pub outcome: std::result::Result<String, CloudError>,
}

#[derive(Debug, Default)]
struct SimState {
    /// Every create call, in order.
    create_calls: Vec<CreateCall>,
    /// Errors the next create calls return, before anything else is looked at.
    create_errors: VecDeque<CloudError>,
    /// The provider IDs of every delete call, in order.
    delete_calls: Vec<String>,
    instances: BTreeMap<String, SimInstance>,
    no_capacity: BTreeSet<(String, String, CapacityType)>,
    quota_vcpus: BTreeMap<String, u32>,
    unavailable: UnavailableOfferings,
    /// (provider ID, notice time, notice delivered)
    scheduled_interruptions: Vec<(String, Timestamp, bool)>,
    removed_types: BTreeSet<String>,
    throttle_next: u32,
    created: u64,
    image_id: String,
}

/// An in-process Azure. Clones share the same cloud.
#[derive(Clone)]
pub struct SimulatedAzure {
    clock: Arc<dyn Clock>,
    settings: SimSettings,
    instance_types: Arc<Vec<InstanceType>>,
    state: Arc<Mutex<SimState>>,
}

impl SimulatedAzure {
    /// A cloud selling `instance_types` (from the catalog) on `clock`.
    pub fn new(
        clock: Arc<dyn Clock>,
        instance_types: Vec<InstanceType>,
        settings: SimSettings,
    ) -> Self {
        SimulatedAzure {
            clock,
            instance_types: Arc::new(instance_types),
            state: Arc::new(Mutex::new(SimState {
                image_id: settings.image_id.clone(),
                ..SimState::default()
            })),
            settings,
        }
    }

    fn lock(&self) -> MutexGuard<'_, SimState> {
        // The state holds plain data; a panic elsewhere cannot leave it half-written in a
        // way later calls could not read.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes every launch of this offering fail for lack of capacity until cleared.
    pub fn inject_no_capacity(&self, instance_type: &str, zone: &str, capacity_type: CapacityType) {
        self.lock().no_capacity.insert((
            instance_type.to_string(),
            zone.to_string(),
            capacity_type,
        ));
    }

    /// Lets the offering launch again.
    pub fn clear_no_capacity(&self, instance_type: &str, zone: &str, capacity_type: CapacityType) {
        self.lock().no_capacity.remove(&(
            instance_type.to_string(),
            zone.to_string(),
            capacity_type,
        ));
    }

    /// Caps the vCPUs that running VMs of one series (`Dsv5`) may use.
    pub fn set_quota(&self, series: &str, vcpus: u32) {
        self.lock().quota_vcpus.insert(series.to_string(), vcpus);
    }

    /// Makes the next `calls` API calls fail with a throttling error.
    pub fn throttle_next(&self, calls: u32) {
        self.lock().throttle_next = calls;
    }

    /// Makes the next create call fail with `error` (after any errors queued before it),
    /// whatever it asks for.
    pub fn next_create_error(&self, error: CloudError) {
        self.lock().create_errors.push_back(error);
    }

    /// Every create call so far, in order, with what each was answered.
    pub fn create_calls(&self) -> Vec<CreateCall> {
        self.lock().create_calls.clone()
    }

    /// The provider IDs of every delete call so far, in order.
    pub fn delete_calls(&self) -> Vec<String> {
        self.lock().delete_calls.clone()
    }

    /// Schedules an eviction notice for a spot VM at `at`.
    pub fn schedule_spot_interruption(&self, provider_id: &str, at: Timestamp) {
        self.lock()
            .scheduled_interruptions
            .push((provider_id.to_string(), at, false));
    }

    /// Changes the image new VMs get; running VMs on the old image then report drift.
    pub fn set_image(&self, image_id: &str) {
        self.lock().image_id = image_id.to_string();
    }

    /// Stops selling a size; VMs of that size then report drift.
    pub fn remove_instance_type(&self, name: &str) {
        self.lock().removed_types.insert(name.to_string());
    }

    /// Total USD/hour of VMs that exist now (launching, running or terminating).
    pub fn hourly_cost(&self) -> f64 {
        let now = self.clock.now();
        let mut state = self.lock();
        self.settle(&mut state, now);
        state
            .instances
            .values()
            .map(|i| i.instance.price_per_hour)
            .sum()
    }

    /// How many VMs were ever created.
    pub fn launches(&self) -> u64 {
        self.lock().created
    }

    fn throttled(&self, state: &mut SimState) -> Result<()> {
        if state.throttle_next > 0 {
            state.throttle_next -= 1;
            return Err(CloudError::Throttled {
                retry_after_seconds: 5,
            });
        }
        Ok(())
    }

    /// Applies the passage of time: launches finish, deletions and evictions complete.
    fn settle(&self, state: &mut SimState, now: Timestamp) {
        let launch = self.settings.launch_latency;
        let delete = self.settings.delete_latency;
        let evicted: BTreeSet<String> = state
            .scheduled_interruptions
            .iter()
            .filter(|(_, at, _)| at.checked_add(SPOT_NOTICE).is_ok_and(|d| d <= now))
            .map(|(id, _, _)| id.clone())
            .collect();
        state.instances.retain(|id, i| {
            let gone = i
                .deleted_at
                .is_some_and(|d| d.checked_add(delete).is_ok_and(|t| t <= now));
            let reclaimed = evicted.contains(id) && i.instance.capacity_type == CapacityType::Spot;
            !gone && !reclaimed
        });
        for i in state.instances.values_mut() {
            i.instance.state = match i.deleted_at {
                Some(_) => InstanceState::Terminating,
                None if i
                    .instance
                    .created_at
                    .checked_add(launch)
                    .is_ok_and(|t| t <= now) =>
                {
                    InstanceState::Running
                }
                None => InstanceState::Launching,
            };
        }
        state.unavailable.expire(now);
    }

    fn create_now(&self, request: &LaunchRequest) -> Result<Instance> {
        let now = self.clock.now();
        let mut state = self.lock();
        let mut refused = Vec::new();
        let result = match state.create_errors.pop_front() {
            Some(error) => Err(error),
            None => self.launch(&mut state, request, now, &mut refused),
        };
        state.create_calls.push(CreateCall {
            at: now,
            request: request.clone(),
            refused,
            outcome: result
                .as_ref()
                .map(|i| i.instance_type.clone())
                .map_err(Clone::clone),
        });
        result
    }

    fn launch(
        &self,
        state: &mut SimState,
        request: &LaunchRequest,
        now: Timestamp,
        refused: &mut Vec<(String, String, CapacityType)>,
    ) -> Result<Instance> {
        self.throttled(state)?;
        self.settle(state, now);
        if request.candidates.is_empty() {
            return Err(CloudError::InvalidRequest {
                claim: request.claim.clone(),
                reason: "no candidate offerings".to_string(),
            });
        }
        if state
            .instances
            .values()
            .any(|i| i.instance.claim == request.claim)
        {
            return Err(CloudError::InvalidRequest {
                claim: request.claim.clone(),
                reason: "an instance for this nodeclaim already exists".to_string(),
            });
        }
        let mut tried = Vec::new();
        for candidate in &request.candidates {
            let Some(it) = self.instance_types.iter().find(|t| {
                t.name == candidate.instance_type && !state.removed_types.contains(&t.name)
            }) else {
                return Err(CloudError::InvalidRequest {
                    claim: request.claim.clone(),
                    reason: format!("unknown instance type {}", candidate.instance_type),
                });
            };
            let offering_key = (
                candidate.instance_type.clone(),
                candidate.zone.clone(),
                candidate.capacity_type,
            );
            if state.unavailable.is_unavailable(
                &offering_key.0,
                &offering_key.1,
                offering_key.2,
                now,
            ) {
                tried.push(candidate.describe());
                continue;
            }
            if state.no_capacity.contains(&offering_key) {
                state
                    .unavailable
                    .mark(&offering_key.0, &offering_key.1, offering_key.2, now);
                tried.push(candidate.describe());
                refused.push(offering_key);
                continue;
            }
            let family = it.sku_name.series();
            if let Some(limit) = state.quota_vcpus.get(&family) {
                let used: u32 = state
                    .instances
                    .values()
                    .filter(|i| i.family == family)
                    .map(|i| i.vcpus)
                    .sum();
                if used + it.sku.vcpus > *limit {
                    return Err(CloudError::Quota {
                        claim: request.claim.clone(),
                        family,
                        region: self.settings.region.clone(),
                    });
                }
            }
            state.created += 1;
            let provider_id = format!(
                "azure:///subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/tailor-sim/providers/Microsoft.Compute/virtualMachines/{}",
                request.claim
            );
            let instance = Instance {
                provider_id: provider_id.clone(),
                claim: request.claim.clone(),
                instance_type: candidate.instance_type.clone(),
                zone: candidate.zone.clone(),
                capacity_type: candidate.capacity_type,
                price_per_hour: candidate.price_per_hour,
                image_id: state.image_id.clone(),
                created_at: now,
                state: InstanceState::Launching,
                tags: request.tags.clone(),
            };
            state.instances.insert(
                provider_id,
                SimInstance {
                    instance: instance.clone(),
                    deleted_at: None,
                    vcpus: it.sku.vcpus,
                    family,
                },
            );
            return Ok(instance);
        }
        Err(CloudError::InsufficientCapacity {
            claim: request.claim.clone(),
            tried,
        })
    }

    fn delete_now(&self, provider_id: &str) -> Result<()> {
        let now = self.clock.now();
        let mut state = self.lock();
        state.delete_calls.push(provider_id.to_string());
        self.throttled(&mut state)?;
        self.settle(&mut state, now);
        if let Some(i) = state.instances.get_mut(provider_id) {
            i.deleted_at.get_or_insert(now);
            i.instance.state = InstanceState::Terminating;
        }
        Ok(())
    }

    fn get_now(&self, provider_id: &str) -> Result<Instance> {
        let now = self.clock.now();
        let mut state = self.lock();
        self.throttled(&mut state)?;
        self.settle(&mut state, now);
        state
            .instances
            .get(provider_id)
            .map(|i| i.instance.clone())
            .ok_or_else(|| CloudError::NotFound {
                provider_id: provider_id.to_string(),
            })
    }

    fn list_now(&self) -> Result<Vec<Instance>> {
        let now = self.clock.now();
        let mut state = self.lock();
        self.throttled(&mut state)?;
        self.settle(&mut state, now);
        Ok(state
            .instances
            .values()
            .map(|i| i.instance.clone())
            .collect())
    }

    /// What [`instance_types_now`](Self::instance_types_now) marks unavailable, without
    /// copying every instance type.
    fn unavailable_now(&self) -> Result<super::UnavailableSet> {
        let now = self.clock.now();
        let mut state = self.lock();
        self.settle(&mut state, now);
        // The marked offerings of the sizes still on sale (the marks are few; the sizes
        // and their offerings many).
        let on_sale = |(name, zone, ct): &(String, String, CapacityType)| {
            !state.removed_types.contains(name)
                && self.instance_types.iter().any(|t| {
                    &t.name == name
                        && t.offerings
                            .iter()
                            .any(|o| &o.zone == zone && o.capacity_type == *ct)
                })
        };
        Ok(state
            .unavailable
            .marked_at(now)
            .chain(&state.no_capacity)
            .filter(|key| on_sale(key))
            .cloned()
            .collect())
    }

    fn instance_types_now(&self) -> Result<Vec<InstanceType>> {
        let now = self.clock.now();
        let mut state = self.lock();
        self.settle(&mut state, now);
        Ok(self
            .instance_types
            .iter()
            .filter(|t| !state.removed_types.contains(&t.name))
            .map(|t| {
                let mut t = t.clone();
                for o in &mut t.offerings {
                    o.available =
                        !state
                            .unavailable
                            .is_unavailable(&t.name, &o.zone, o.capacity_type, now)
                            && !state.no_capacity.contains(&(
                                t.name.clone(),
                                o.zone.clone(),
                                o.capacity_type,
                            ));
                }
                t
            })
            .collect())
    }

    fn drift_now(&self, instance: &Instance) -> Result<Option<DriftReason>> {
        let state = self.lock();
        if state.removed_types.contains(&instance.instance_type) {
            return Ok(Some(DriftReason::InstanceTypeRemoved));
        }
        if instance.image_id != state.image_id {
            return Ok(Some(DriftReason::ImageChanged {
                running: instance.image_id.clone(),
                latest: state.image_id.clone(),
            }));
        }
        Ok(None)
    }

    fn interruptions_now(&self) -> Result<Vec<Interruption>> {
        let now = self.clock.now();
        let mut state = self.lock();
        let SimState {
            instances,
            scheduled_interruptions,
            ..
        } = &mut *state;
        let mut out = Vec::new();
        for (id, at, delivered) in scheduled_interruptions.iter_mut() {
            if *delivered || *at > now {
                continue;
            }
            // Each notice is handed out once; the entry stays so that `settle` removes
            // the VM at the deadline.
            *delivered = true;
            let Some(i) = instances.get(id.as_str()) else {
                continue;
            };
            if i.instance.capacity_type != CapacityType::Spot {
                continue; // only spot VMs are reclaimed
            }
            out.push(Interruption {
                provider_id: id.clone(),
                claim: i.instance.claim.clone(),
                deadline: at.checked_add(SPOT_NOTICE).unwrap_or(Timestamp::MAX),
            });
        }
        Ok(out)
    }
}

impl CloudProvider for SimulatedAzure {
    fn create(&self, request: &LaunchRequest) -> impl Future<Output = Result<Instance>> + Send {
        ready(self.create_now(request))
    }

    fn delete(&self, provider_id: &str) -> impl Future<Output = Result<()>> + Send {
        ready(self.delete_now(provider_id))
    }

    fn get(&self, provider_id: &str) -> impl Future<Output = Result<Instance>> + Send {
        ready(self.get_now(provider_id))
    }

    fn list(&self) -> impl Future<Output = Result<Vec<Instance>>> + Send {
        ready(self.list_now())
    }

    fn instance_types(&self) -> impl Future<Output = Result<Vec<InstanceType>>> + Send {
        ready(self.instance_types_now())
    }

    fn unavailable_offerings(&self) -> impl Future<Output = Result<super::UnavailableSet>> + Send {
        ready(self.unavailable_now())
    }

    fn is_drifted(
        &self,
        instance: &Instance,
    ) -> impl Future<Output = Result<Option<DriftReason>>> + Send {
        ready(self.drift_now(instance))
    }

    fn interruptions(&self) -> impl Future<Output = Result<Vec<Interruption>>> + Send {
        ready(self.interruptions_now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{Catalog, CatalogOptions};
    use crate::clock::VirtualClock;
    use crate::cloud::LaunchCandidate;
    use std::time::Duration;

    fn cloud() -> (SimulatedAzure, VirtualClock) {
        let clock = VirtualClock::new(Timestamp::from_second(1_800_000_000).expect("valid"));
        let types = Catalog::builtin()
            .and_then(|c| c.instance_types(&CatalogOptions::for_region("eastus")))
            .expect("built-in catalog");
        (
            SimulatedAzure::new(Arc::new(clock.clone()), types, SimSettings::default()),
            clock,
        )
    }

    fn candidate(t: &str, zone: &str, ct: CapacityType) -> LaunchCandidate {
        LaunchCandidate {
            instance_type: t.into(),
            zone: zone.into(),
            capacity_type: ct,
            price_per_hour: 0.1,
        }
    }

    fn request(claim: &str, candidates: Vec<LaunchCandidate>) -> LaunchRequest {
        LaunchRequest {
            node: Default::default(),
            claim: claim.into(),
            node_pool: "default".into(),
            candidates,
            tags: BTreeMap::new(),
        }
    }

    #[tokio::test]
    async fn the_unavailable_offerings_are_those_the_instance_types_mark() {
        let (cloud, clock) = cloud();
        cloud.inject_no_capacity("Standard_D4s_v5", "eastus-2", CapacityType::OnDemand);
        let failed = cloud
            .create(&request(
                "c1",
                vec![candidate("Standard_D2s_v5", "eastus-1", CapacityType::Spot)],
            ))
            .await;
        assert!(failed.is_ok());
        cloud.inject_no_capacity("Standard_D2s_v5", "eastus-3", CapacityType::Spot);
        let _ = cloud
            .create(&request(
                "c2",
                vec![candidate("Standard_D2s_v5", "eastus-3", CapacityType::Spot)],
            ))
            .await;
        cloud.clear_no_capacity("Standard_D2s_v5", "eastus-3", CapacityType::Spot);
        let refused = cloud.create_calls()[1].refused.clone();
        assert_eq!(
            refused,
            [(
                "Standard_D2s_v5".to_string(),
                "eastus-3".to_string(),
                CapacityType::Spot
            )],
            "the call that found no capacity says where"
        );
        // Marks on what is not on sale are not offerings: a size the catalog lacks, and a
        // zone the size is not offered in.
        cloud.inject_no_capacity("Standard_Nope_v9", "eastus-1", CapacityType::OnDemand);
        cloud.inject_no_capacity("Standard_D4s_v5", "westus-1", CapacityType::OnDemand);
        let marked = crate::cloud::unavailable_in(cloud.instance_types().await.expect("types"));
        // The injected outage and the offering that failed (still within its TTL).
        assert_eq!(marked.len(), 2, "{marked:?}");
        assert_eq!(cloud.unavailable_offerings().await, Ok(marked));
        clock.advance(Duration::from_secs(3600));
        assert_eq!(cloud.unavailable_offerings().await.map(|u| u.len()), Ok(1));
    }

    #[tokio::test]
    async fn every_call_is_recorded_and_a_queued_error_answers_the_next_create_only() {
        let (cloud, _) = cloud();
        let d2 = || candidate("Standard_D2s_v5", "eastus-1", CapacityType::OnDemand);
        let quota = CloudError::Quota {
            claim: "c1".into(),
            family: "DSv5".into(),
            region: "eastus".into(),
        };
        cloud.next_create_error(quota.clone());
        assert_eq!(
            cloud.create(&request("c1", vec![d2()])).await,
            Err(quota.clone())
        );
        let vm = cloud
            .create(&request("c2", vec![d2()]))
            .await
            .expect("the error answered one call");
        cloud.delete(&vm.provider_id).await.expect("delete");
        let calls = cloud.create_calls();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].request.claim, "c1");
        assert!(calls.iter().all(|c| c.refused.is_empty()));
        assert_eq!(calls[0].outcome, Err(quota));
        assert_eq!(calls[1].request, request("c2", vec![d2()]));
        assert_eq!(calls[1].outcome, Ok("Standard_D2s_v5".to_string()));
        assert_eq!(cloud.delete_calls(), [vm.provider_id]);
        assert_eq!(cloud.launches(), 1, "a failed call launches nothing");
    }

    #[tokio::test]
    async fn a_launched_vm_runs_after_the_launch_latency_and_disappears_after_delete() {
        let (cloud, clock) = cloud();
        let vm = cloud
            .create(&request(
                "c1",
                vec![candidate(
                    "Standard_D2s_v5",
                    "eastus-1",
                    CapacityType::OnDemand,
                )],
            ))
            .await
            .expect("launch");
        assert_eq!(vm.state, InstanceState::Launching);
        clock.advance(Duration::from_secs(60));
        assert_eq!(
            cloud.get(&vm.provider_id).await.map(|i| i.state),
            Ok(InstanceState::Running)
        );
        cloud.delete(&vm.provider_id).await.expect("delete");
        assert_eq!(
            cloud.get(&vm.provider_id).await.map(|i| i.state),
            Ok(InstanceState::Terminating)
        );
        clock.advance(Duration::from_secs(30));
        assert!(matches!(
            cloud.get(&vm.provider_id).await,
            Err(CloudError::NotFound { .. })
        ));
        assert_eq!(cloud.list().await.map(|l| l.len()), Ok(0));
    }

    #[tokio::test]
    async fn capacity_errors_fall_through_to_the_next_candidate_and_mark_the_offering() {
        let (cloud, _clock) = cloud();
        cloud.inject_no_capacity("Standard_D2s_v5", "eastus-1", CapacityType::Spot);
        let vm = cloud
            .create(&request(
                "c1",
                vec![
                    candidate("Standard_D2s_v5", "eastus-1", CapacityType::Spot),
                    candidate("Standard_D2s_v5", "eastus-2", CapacityType::Spot),
                ],
            ))
            .await
            .expect("second candidate launches");
        assert_eq!(vm.zone, "eastus-2");
        let types = cloud.instance_types().await.expect("types");
        let d2 = types
            .iter()
            .find(|t| t.name == "Standard_D2s_v5")
            .expect("listed");
        let marked: Vec<_> = d2.offerings.iter().filter(|o| !o.available).collect();
        assert_eq!(marked.len(), 1);
        assert_eq!(
            (marked[0].zone.as_str(), marked[0].capacity_type),
            ("eastus-1", CapacityType::Spot)
        );
        let err = cloud
            .create(&request(
                "c2",
                vec![candidate("Standard_D2s_v5", "eastus-1", CapacityType::Spot)],
            ))
            .await
            .expect_err("no capacity");
        assert_eq!(err.kind(), "insufficient_capacity");
        assert!(err.to_string().contains("Standard_D2s_v5/eastus-1/spot"));
    }

    #[tokio::test]
    async fn quota_and_throttling_are_reported_as_their_own_kinds() {
        let (cloud, _clock) = cloud();
        cloud.set_quota("Dsv5", 4);
        let d4 = || {
            vec![candidate(
                "Standard_D4s_v5",
                "eastus-1",
                CapacityType::OnDemand,
            )]
        };
        cloud
            .create(&request("c1", d4()))
            .await
            .expect("within quota");
        let err = cloud
            .create(&request("c2", d4()))
            .await
            .expect_err("over quota");
        assert_eq!(err.kind(), "quota");
        cloud.throttle_next(1);
        assert_eq!(cloud.list().await.map_err(|e| e.kind()), Err("throttled"));
        assert_eq!(cloud.list().await.map(|l| l.len()), Ok(1));
    }

    #[tokio::test]
    async fn spot_vms_get_one_notice_and_are_gone_after_it() {
        let (cloud, clock) = cloud();
        let vm = cloud
            .create(&request(
                "s1",
                vec![candidate("Standard_D2s_v5", "eastus-1", CapacityType::Spot)],
            ))
            .await
            .expect("launch");
        let od = cloud
            .create(&request(
                "o1",
                vec![candidate(
                    "Standard_D2s_v5",
                    "eastus-1",
                    CapacityType::OnDemand,
                )],
            ))
            .await
            .expect("launch");
        let at = clock
            .now()
            .checked_add(SignedDuration::from_secs(600))
            .expect("in range");
        cloud.schedule_spot_interruption(&vm.provider_id, at);
        cloud.schedule_spot_interruption(&od.provider_id, at);
        assert_eq!(cloud.interruptions().await.map(|n| n.len()), Ok(0));
        clock.advance(Duration::from_secs(600));
        let notices = cloud.interruptions().await.expect("notices");
        assert_eq!(notices.len(), 1);
        assert_eq!(notices[0].claim, "s1");
        assert_eq!(cloud.interruptions().await.map(|n| n.len()), Ok(0));
        clock.advance(Duration::from_secs(30));
        let left: Vec<String> = cloud
            .list()
            .await
            .expect("list")
            .into_iter()
            .map(|i| i.claim)
            .collect();
        assert_eq!(left, vec!["o1".to_string()]);
    }

    #[tokio::test]
    async fn a_new_image_or_a_removed_size_makes_running_vms_drift() {
        let (cloud, _clock) = cloud();
        let vm = cloud
            .create(&request(
                "c1",
                vec![candidate(
                    "Standard_D2s_v5",
                    "eastus-1",
                    CapacityType::OnDemand,
                )],
            ))
            .await
            .expect("launch");
        assert_eq!(cloud.is_drifted(&vm).await, Ok(None));
        cloud.set_image("aks-ubuntu-2204-gen2-202612.01.0");
        assert!(matches!(
            cloud.is_drifted(&vm).await,
            Ok(Some(DriftReason::ImageChanged { .. }))
        ));
        cloud.remove_instance_type("Standard_D2s_v5");
        assert_eq!(
            cloud.is_drifted(&vm).await,
            Ok(Some(DriftReason::InstanceTypeRemoved))
        );
    }
}
