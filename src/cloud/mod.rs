//! The cloud edge: launching and deleting the VMs behind NodeClaims, and telling what can
//! be bought. One narrow trait, [`CloudProvider`], with a simulated Azure ([`sim`]) for the
//! demo, tests and benchmarks; the Azure Resource Manager implementation slots in beside
//! it.

pub mod azure;
pub mod kwok;
pub mod metered;
pub mod sim;
pub mod unavailable;

use std::collections::BTreeMap;
use std::future::Future;

use jiff::Timestamp;

use crate::model::{CapacityType, InstanceType};

/// Why a cloud call failed. [`CloudError::kind`] gives a bounded label for metrics.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CloudError {
    /// None of the candidate offerings had capacity.
    #[error("insufficient capacity for nodeclaim {claim}: tried {}", tried.join(", "))]
    InsufficientCapacity {
        /// The NodeClaim being launched.
        claim: String,
        /// `instance-type/zone/capacity-type` of every offering tried.
        tried: Vec<String>,
    },
    /// The subscription's vCPU quota for a family is exhausted.
    #[error("vCPU quota exhausted for family {family} in {region} launching nodeclaim {claim}")]
    Quota {
        /// The NodeClaim being launched.
        claim: String,
        /// The quota family.
        family: String,
        /// The region.
        region: String,
    },
    /// The launch request itself is invalid (no candidates, unknown size).
    #[error("invalid launch request for nodeclaim {claim}: {reason}")]
    InvalidRequest {
        /// The NodeClaim being launched.
        claim: String,
        /// What is wrong.
        reason: String,
    },
    /// The instance does not exist (any more).
    #[error("instance {provider_id} not found")]
    NotFound {
        /// The provider ID asked for.
        provider_id: String,
    },
    /// The cloud asked us to slow down.
    #[error("throttled by the cloud API; retry after {retry_after_seconds}s")]
    Throttled {
        /// Seconds to wait.
        retry_after_seconds: u64,
    },
    /// The cloud API refused or failed a call for another reason.
    #[error("{operation}: {code}: {message}")]
    Api {
        /// What was being done (`create vm aks-default-x`).
        operation: String,
        /// The cloud's error code (or HTTP status).
        code: String,
        /// The cloud's message.
        message: String,
    },
    /// The cloud cannot be reached or authenticated against.
    #[error("{0}")]
    Unavailable(String),
}

impl CloudError {
    /// A bounded, stable label value for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            CloudError::InsufficientCapacity { .. } => "insufficient_capacity",
            CloudError::Quota { .. } => "quota",
            CloudError::InvalidRequest { .. } => "invalid_request",
            CloudError::NotFound { .. } => "not_found",
            CloudError::Throttled { .. } => "throttled",
            CloudError::Api { .. } => "api_error",
            CloudError::Unavailable(_) => "unavailable",
        }
    }
}

/// Result alias for cloud calls.
pub type Result<T> = std::result::Result<T, CloudError>;

/// One way to satisfy a launch: a size bought in a zone with a capacity type.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchCandidate {
    /// ARM size name.
    pub instance_type: String,
    /// Zone label value (`eastus-1`).
    pub zone: String,
    /// Spot or on-demand.
    pub capacity_type: CapacityType,
    /// Expected USD/hour.
    pub price_per_hour: f64,
}

impl LaunchCandidate {
    /// `type/zone/capacity-type`, as shown in errors.
    pub fn describe(&self) -> String {
        format!(
            "{}/{}/{}",
            self.instance_type, self.zone, self.capacity_type
        )
    }
}

/// What the provisioner asks the cloud to launch for one NodeClaim.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchRequest {
    /// The NodeClaim's name; becomes the VM name.
    pub claim: String,
    /// The NodePool it belongs to.
    pub node_pool: String,
    /// Acceptable offerings in order of preference (cheapest first). The cloud takes
    /// the first one that has capacity.
    pub candidates: Vec<LaunchCandidate>,
    /// Tags for the VM (NodePool, cluster, and the AKSNodeClass's tags).
    pub tags: BTreeMap<String, String>,
    /// How the node is built: image, disk, subnet, kubelet, labels and taints. Clouds that
    /// boot no real OS (KWOK, the simulation) ignore it.
    pub node: NodeLaunch,
}

/// The node-level settings of a launch, from the NodeClaim and its AKSNodeClass.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeLaunch {
    /// The node class's image family.
    pub image_family: crate::apis::aksnodeclass::ImageFamily,
    /// A pinned node image version (`202501.01.0`); `None` takes the newest.
    pub image_version: Option<String>,
    /// Images the node class resolved, newest first; the first whose requirements the
    /// size meets is used instead of the family's default.
    pub images: Vec<crate::apis::aksnodeclass::NodeImage>,
    /// Subnet for the network interface; `None` uses the cluster's default node subnet.
    pub subnet_id: Option<String>,
    /// OS disk size in GB; `None` uses the AKS default (128).
    pub os_disk_size_gb: Option<i32>,
    /// Pods per node; `None` uses the cluster default.
    pub max_pods: Option<u32>,
    /// kubelet settings.
    pub kubelet: Option<crate::apis::aksnodeclass::KubeletConfiguration>,
    /// Labels the node registers with.
    pub labels: BTreeMap<String, String>,
    /// Taints the node registers with (`key=value:Effect`), startup taints included.
    pub taints: Vec<String>,
}

/// The lifecycle state of a VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum InstanceState {
    /// Created, not yet running.
    Launching,
    /// Running.
    Running,
    /// Being deleted.
    Terminating,
}

/// A VM as the cloud reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    /// The node's `spec.providerID` (`azure:///subscriptions/.../virtualMachines/<name>`).
    pub provider_id: String,
    /// The NodeClaim it was launched for.
    pub claim: String,
    /// The size.
    pub instance_type: String,
    /// The zone.
    pub zone: String,
    /// Spot or on-demand.
    pub capacity_type: CapacityType,
    /// USD/hour at launch.
    pub price_per_hour: f64,
    /// The OS image the VM was created from.
    pub image_id: String,
    /// When the create call was accepted.
    pub created_at: Timestamp,
    /// Current state.
    pub state: InstanceState,
    /// Tags.
    pub tags: BTreeMap<String, String>,
}

/// Why a running instance no longer matches what would be launched today.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriftReason {
    /// The node class now resolves to a different OS image.
    ImageChanged {
        /// The image the VM runs.
        running: String,
        /// The image a new VM would get.
        latest: String,
    },
    /// The size is no longer offered.
    InstanceTypeRemoved,
}

/// A notice that the cloud is reclaiming a spot VM.
#[derive(Debug, Clone, PartialEq)]
pub struct Interruption {
    /// The VM being reclaimed.
    pub provider_id: String,
    /// The NodeClaim it backs.
    pub claim: String,
    /// When the VM will be gone.
    pub deadline: Timestamp,
}

/// Offerings (size, zone, capacity type) that cannot be bought now.
pub type UnavailableSet = std::collections::BTreeSet<(String, String, CapacityType)>;

/// The offerings of `types` marked unavailable.
pub fn unavailable_in(types: Vec<InstanceType>) -> UnavailableSet {
    types
        .into_iter()
        .flat_map(|t| {
            t.offerings
                .into_iter()
                .filter(|o| !o.available)
                .map(move |o| (t.name.clone(), o.zone, o.capacity_type))
        })
        .collect()
}

/// The operations Tailor needs from a cloud. Implementations: [`sim::SimulatedAzure`];
/// the Azure Resource Manager provider.
pub trait CloudProvider: Send + Sync {
    /// Launches a VM for a NodeClaim, trying candidates in order.
    fn create(&self, request: &LaunchRequest) -> impl Future<Output = Result<Instance>> + Send;

    /// Deletes a VM; deleting one that is already gone is not an error.
    fn delete(&self, provider_id: &str) -> impl Future<Output = Result<()>> + Send;

    /// Reads one VM.
    fn get(&self, provider_id: &str) -> impl Future<Output = Result<Instance>> + Send;

    /// Lists every VM this agent launched.
    fn list(&self) -> impl Future<Output = Result<Vec<Instance>>> + Send;

    /// The sizes that can be bought now, with offerings marked unavailable while a
    /// recent capacity error stands.
    fn instance_types(&self) -> impl Future<Output = Result<Vec<InstanceType>>> + Send;

    /// The offerings of [`instance_types`](Self::instance_types) marked unavailable now
    /// (size, zone, capacity type). A cloud that knows them without building every
    /// instance type answers more cheaply; the answer is the same.
    fn unavailable_offerings(&self) -> impl Future<Output = Result<UnavailableSet>> + Send {
        async { Ok(unavailable_in(self.instance_types().await?)) }
    }

    /// Whether a VM has drifted from what would be launched today.
    fn is_drifted(
        &self,
        instance: &Instance,
    ) -> impl Future<Output = Result<Option<DriftReason>>> + Send;

    /// Spot interruption notices not yet handed out.
    fn interruptions(&self) -> impl Future<Output = Result<Vec<Interruption>>> + Send;

    /// Deletes cloud resources a crash left behind that no instance owns (an Azure NIC
    /// whose VM was never made); returns how many. Clouds without such resources have
    /// nothing to do.
    fn collect_leaked(&self) -> impl Future<Output = Result<usize>> + Send {
        std::future::ready(Ok(0))
    }
}
