//! The in-cluster agent's controllers: thin loops around the pure decisions, in the style of
//! Karpenter's controllers.
//!
//! - [`state`]: reflector stores for every kind a decision reads, turned into a `Snapshot`;
//! - [`provisioning`]: pending pods → planned nodes → NodeClaim objects;
//! - [`nodeclaim`]: a NodeClaim's life: launch, registration, initialization, liveness and
//!   termination behind a finalizer (drain through the Eviction API);
//! - [`disruption`]: consolidation, drift and expiration carried out through NodeClaims,
//!   replacements ready before anything is drained; reported only in recommend-only mode;
//! - [`interruption`]: a spot VM Azure announces it will reclaim is drained before it goes;
//! - [`garbage_collection`]: instances without a NodeClaim, NodeClaims without an instance;
//! - [`cost`]: the managed nodes counted and priced, for the cost metrics;
//! - [`demand`]: the requests' daily and weekly cycle, shared by provisioning (buying ahead)
//!   and disruption (keeping what the morning needs), kept in a ConfigMap;
//! - [`rightsizing`]: usage read from Prometheus every interval, one Recommendation per
//!   workload with its histogram checkpoint;
//! - [`writes`]: every write to the cluster, checked against leadership.
//!
//! Intent lives in the API server: the provisioner creates NodeClaims, the lifecycle
//! controller acts on them, so a restart or a new leader continues where the last stopped.
//! All controllers are started by [`run`] from one list.

pub mod cost;
pub mod demand;
pub mod disruption;
pub mod garbage_collection;
pub mod interruption;
pub mod leader;
pub mod nodeclaim;
pub mod provisioning;
pub mod rightsizing;
pub mod state;
pub mod writes;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::SignedDuration;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::{Resource, ResourceExt};
use tokio::task::JoinSet;

use crate::apis::NodePool;
use crate::apis::labels;
use crate::catalog::CatalogOptions;
use crate::clock::Clock;
use crate::cloud::CloudProvider;
use crate::model::{CapacityType, NodeSettings};
use crate::provisioning::Mode;
use crate::scheduling::PoolTypes;
use crate::telemetry::Metrics;

pub use state::State;
pub use writes::Writer;

/// The agent's settings, parsed once from flags.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Global mode; a NodePool's `tailor.sh/mode` annotation overrides it for its nodes.
    pub mode: Mode,
    /// The cluster's name, written on every instance so garbage collection finds its own.
    pub cluster_name: String,
    /// Close a provisioning batch after this long without a new pending pod.
    pub batch_idle: Duration,
    /// Close a provisioning batch this long after it opened.
    pub batch_max: Duration,
    /// A launched NodeClaim whose node has not registered after this long is replaced.
    pub registration_ttl: SignedDuration,
    /// An instance without a NodeClaim is deleted once it is this old.
    pub gc_grace: SignedDuration,
    /// How often the garbage collector looks.
    pub gc_interval: Duration,
    /// Where usage history is read for right-sizing; `None` turns right-sizing off.
    pub prometheus: Option<crate::usage::prometheus::PrometheusSettings>,
    /// How often right-sizing reads new usage and rewrites Recommendations.
    pub rightsizing_interval: Duration,
    /// Whether `update.mode: RollingRestart` may patch workloads' pod templates.
    pub rolling_restart: bool,
    /// Usage whose newest sample is older than this (seconds) is stale: nothing is changed
    /// on its strength.
    pub usage_stale_after: i64,
    /// The agent's namespace, where the cluster-wide default RightsizingPolicy lives.
    pub namespace: String,
    /// Whether the admission webhook serves (`--webhook-address`): only then do pods
    /// evicted because they cannot be resized in place come back with the new requests.
    pub webhook: bool,
    /// How far ahead (seconds) capacity is bought for the growth the requests' cycle
    /// expects (`provisioning::headroom`); 0 buys only for pending pods.
    pub headroom_lead: i64,
    /// Pending pods are planned with Tailor's cost-aware packer; off, Karpenter-style
    /// greedy packing (`--packing greedy`).
    pub cost_aware: bool,
    /// What consolidation asks of a decision (`--consolidation`).
    pub disruption: crate::disruption::Settings,
    /// How far ahead (seconds) disruption keeps the capacity the requests' cycle expects;
    /// 0 looks at the cluster as it is now only.
    pub forecast_horizon: i64,
    /// The controllers' protocol timers.
    pub timers: Timers,
}

/// The controllers' protocol timers: how long a decision waits before it is carried out,
/// how often a loop looks again. Production and the demo run the defaults; end-to-end tests
/// shrink them all by one factor (`tailor run --timer-scale`, hidden) so that a test waits
/// for the same sequence of events in a fraction of the time, the ratios between the timers
/// kept.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timers {
    /// How often the disruption controller evaluates.
    pub disruption_interval: Duration,
    /// A disruption decision is carried out only when it is decided again this long after it
    /// was first seen (Karpenter's consolidation validation).
    pub validation_delay: SignedDuration,
    /// How often every decision of every pool is evaluated for the reports and metrics.
    pub disruption_summary: SignedDuration,
    /// How long a cluster found consolidated is left before it is evaluated again.
    pub consolidated_recheck: SignedDuration,
    /// How long a pod planned onto an existing node, or reported in recommend-only mode, is
    /// left alone before it is planned again.
    pub provisioning_cover: SignedDuration,
    /// How long a pod planned onto a new node is left to kube-scheduler once that node is
    /// initialized. kube-scheduler binds within a second or two of a node turning Ready;
    /// a pod still pending after this was left out (others took its room) and is planned
    /// again at once, rather than after the full [`Timers::provisioning_cover`].
    pub provisioning_bind_grace: SignedDuration,
    /// How often capacity for the expected growth is looked at while the cluster changes.
    pub headroom_every: SignedDuration,
}

impl Default for Timers {
    fn default() -> Self {
        Timers {
            disruption_interval: Duration::from_secs(5),
            validation_delay: crate::disruption::controller::DEFAULT_VALIDATION_DELAY,
            disruption_summary: SignedDuration::from_secs(30),
            consolidated_recheck: SignedDuration::from_secs(300),
            provisioning_cover: SignedDuration::from_secs(20),
            provisioning_bind_grace: SignedDuration::from_secs(2),
            headroom_every: SignedDuration::from_secs(30),
        }
    }
}

impl Timers {
    /// The default timers multiplied by `factor` (in `(0, 1]`), none below 100 ms.
    pub fn scaled(factor: f64) -> Timers {
        let d = Timers::default();
        let shrink = |v: Duration| v.mul_f64(factor).max(Duration::from_millis(100));
        let signed = |v: SignedDuration| {
            SignedDuration::try_from(shrink(Duration::try_from(v).unwrap_or_default())).unwrap_or(v)
        };
        Timers {
            disruption_interval: shrink(d.disruption_interval),
            validation_delay: signed(d.validation_delay),
            disruption_summary: signed(d.disruption_summary),
            consolidated_recheck: signed(d.consolidated_recheck),
            provisioning_cover: signed(d.provisioning_cover),
            provisioning_bind_grace: signed(d.provisioning_bind_grace),
            headroom_every: signed(d.headroom_every),
        }
    }
}

/// How often right-sizing runs unless told otherwise.
pub const DEFAULT_RIGHTSIZING_INTERVAL: Duration = Duration::from_secs(15 * 60);

/// Age (seconds) of the newest usage sample beyond which usage is stale: cadvisor is
/// scraped every 15-60 s, so twenty minutes without a sample means the pipeline is broken.
pub const DEFAULT_USAGE_STALE_AFTER: i64 = 20 * 60;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            mode: Mode::RecommendOnly,
            cluster_name: "tailor".to_string(),
            batch_idle: crate::provisioning::DEFAULT_IDLE_WINDOW,
            batch_max: crate::provisioning::DEFAULT_MAX_WINDOW,
            registration_ttl: crate::disruption::controller::DEFAULT_REPLACEMENT_TTL,
            gc_grace: SignedDuration::from_secs(30),
            gc_interval: Duration::from_secs(30),
            prometheus: None,
            rightsizing_interval: DEFAULT_RIGHTSIZING_INTERVAL,
            rolling_restart: false,
            usage_stale_after: DEFAULT_USAGE_STALE_AFTER,
            namespace: "default".to_string(),
            webhook: false,
            headroom_lead: crate::provisioning::headroom::DEFAULT_LEAD,
            cost_aware: true,
            disruption: crate::disruption::Settings::default(),
            forecast_horizon: crate::disruption::forecast::DEFAULT_HORIZON,
            timers: Timers::default(),
        }
    }
}

/// Where the random parts of the names the agent gives (NodeClaims, launch batches,
/// disruption commands) come from: the system's randomness in a cluster, a seed in the
/// demo, so that a seed's run is the same every time.
pub struct Names(std::sync::Mutex<rand_chacha::ChaCha8Rng>);

impl Names {
    /// Names from the system's randomness.
    pub fn random() -> Self {
        Names::seeded(rand::random())
    }

    /// Names from `seed`: the same sequence every time.
    pub fn seeded(seed: u64) -> Self {
        use rand::SeedableRng;
        Names(std::sync::Mutex::new(
            rand_chacha::ChaCha8Rng::seed_from_u64(seed),
        ))
    }

    /// A random 32-bit number.
    pub fn number(&self) -> u32 {
        use rand::Rng;
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .random()
    }

    /// Five characters a Kubernetes name suffix is made of (no vowels, no look-alikes),
    /// as the API server's `generateName` draws them.
    pub fn suffix(&self) -> String {
        use rand::Rng;
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let mut rng = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (0..5)
            .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
            .collect()
    }
}

/// What every controller shares.
pub struct Context<C> {
    /// The stores.
    pub state: State,
    /// The only way to change the cluster.
    pub writer: Writer,
    /// The cloud.
    pub cloud: C,
    /// Metrics.
    pub metrics: Metrics,
    /// The clock.
    pub clock: Arc<dyn Clock>,
    /// The catalog, for instance types under each node class's settings.
    pub catalog: crate::catalog::SharedCatalog,
    /// Region and pricing options of the catalog.
    pub catalog_options: CatalogOptions,
    /// Settings.
    pub settings: Settings,
    /// The requests' cycle per NodePool, recorded by disruption and read by both
    /// disruption and provisioning ([`demand`]).
    pub demand: std::sync::Mutex<crate::disruption::forecast::DemandHistory>,
    /// The random parts of new names.
    pub names: Names,
    /// Whether right-sizing runs (a usage source is wired to [`rightsizing`]): pending
    /// pods it governs in `Auto` mode are then resized before nodes are bought for them.
    pub rightsizing: bool,
}

impl<C: CloudProvider> Context<C> {
    /// The mode that applies to a NodePool's nodes now: its annotation, else the global mode.
    pub fn mode_for(&self, pool: Option<&NodePool>) -> Mode {
        mode_for(self.settings.mode, pool)
    }

    /// The mode disruption applies to a NodePool's nodes now ([`disruption_mode_for`]).
    pub fn disruption_mode_for(&self, pool: Option<&NodePool>) -> Mode {
        disruption_mode_for(self.settings.mode, pool)
    }

    /// The offerings the cloud has marked unavailable now (size, zone, capacity type), as
    /// `tailor_unavailable_offerings` then shows them.
    pub async fn unavailable_offerings(
        &self,
    ) -> Result<BTreeSet<(String, String, CapacityType)>, String> {
        let unavailable: BTreeSet<(String, String, CapacityType)> = self
            .cloud
            .unavailable_offerings()
            .await
            .map_err(|e| e.to_string())?;
        self.metrics.set_unavailable_offerings(unavailable.len());
        Ok(unavailable)
    }

    /// Instance types on sale under `settings`, with offerings the cloud reports unavailable
    /// marked so.
    pub async fn instance_types(
        &self,
    ) -> Result<impl Fn(&NodeSettings) -> Result<PoolTypes, String> + '_, String> {
        let unavailable = self.unavailable_offerings().await?;
        Ok(move |settings: &NodeSettings| {
            let mut options = self.catalog_options.clone();
            options.node = NodeSettings {
                overhead_model: settings.overhead_model,
                max_pods: settings.max_pods,
                os_disk_gib: settings.os_disk_gib,
                ..options.node
            };
            self.catalog
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .planning_types(&options, &unavailable)
                .map_err(|e| e.to_string())
        })
    }
}

/// A mode annotation's value: `recommend` or `autonomous`; `None` for anything else.
fn annotated_mode(value: &str) -> Option<Mode> {
    match value {
        "recommend" => Some(Mode::RecommendOnly),
        "autonomous" => Some(Mode::Autonomous),
        _ => None,
    }
}

/// The mode for a NodePool: its `tailor.sh/mode` annotation (`recommend` or `autonomous`),
/// else `global`. An unknown value keeps the pool in recommend-only mode, the safe side
/// ([`mode_problem`] names it).
pub fn mode_for(global: Mode, pool: Option<&NodePool>) -> Mode {
    match pool.and_then(|p| p.annotations().get(labels::MODE_ANNOTATION)) {
        None => global,
        Some(v) => annotated_mode(v).unwrap_or(Mode::RecommendOnly),
    }
}

/// What is wrong with a NodePool's mode annotations (`tailor.sh/mode`,
/// `tailor.sh/disruption-mode`), naming the value: each must be `recommend` or
/// `autonomous`. A wrong one keeps the pool recommend-only ([`mode_for`]); this says so.
pub fn mode_problem(pool: &NodePool) -> Option<String> {
    [labels::MODE_ANNOTATION, labels::DISRUPTION_MODE_ANNOTATION]
        .into_iter()
        .find_map(|key| {
            let value = pool.annotations().get(key)?;
            annotated_mode(value).is_none().then(|| {
                format!(
                    "nodepool {}: annotation {key}: {value:?} is neither \"recommend\" nor \"autonomous\"; the pool stays recommend-only",
                    pool.name_any()
                )
            })
        })
}

/// The mode disruption applies to a NodePool's nodes: its `tailor.sh/disruption-mode`
/// annotation (`recommend` or `autonomous`), else the pool's mode ([`mode_for`]). A pool
/// can so be provisioned by Tailor while its consolidation is only reported, the usual
/// first step of taking it over from another autoscaler. An unknown value reports only.
pub fn disruption_mode_for(global: Mode, pool: Option<&NodePool>) -> Mode {
    match pool.and_then(|p| p.annotations().get(labels::DISRUPTION_MODE_ANNOTATION)) {
        None => mode_for(global, pool),
        Some(v) => annotated_mode(v).unwrap_or(Mode::RecommendOnly),
    }
}

/// A reference to an object, for Events.
pub fn reference<K: Resource<DynamicType = ()>>(object: &K) -> ObjectReference {
    object.object_ref(&())
}

/// Labels as a plain map.
pub fn labels_of<K: ResourceExt>(object: &K) -> BTreeMap<String, String> {
    object.labels().clone()
}

/// Starts every controller on `tasks`, right-sizing reading Prometheus (when
/// `--prometheus-url` is set). They run until aborted; each acts only while this replica
/// leads.
pub fn run<C: CloudProvider + 'static>(ctx: Arc<Context<C>>, tasks: &mut JoinSet<()>) {
    start(ctx.clone(), tasks);
    tasks.spawn(rightsizing::run(ctx));
}

/// Starts every controller on `tasks`, right-sizing reading `usage`: the demo's simulated
/// cluster serves its pods' usage this way.
pub fn run_with_usage<C, U>(ctx: Arc<Context<C>>, usage: U, tasks: &mut JoinSet<()>)
where
    C: CloudProvider + 'static,
    U: crate::usage::UsageSource + 'static,
{
    start(ctx.clone(), tasks);
    tasks.spawn(rightsizing::run_with(ctx, usage));
}

/// Every controller but right-sizing, whose usage source differs.
fn start<C: CloudProvider + 'static>(ctx: Arc<Context<C>>, tasks: &mut JoinSet<()>) {
    tasks.spawn(provisioning::run(ctx.clone()));
    tasks.spawn(nodeclaim::run(ctx.clone()));
    tasks.spawn(disruption::run(ctx.clone()));
    tasks.spawn(interruption::run(ctx.clone()));
    tasks.spawn(cost::run(ctx.clone()));
    tasks.spawn(store_sizes(ctx.clone()));
    tasks.spawn(garbage_collection::run(ctx));
}

/// Publishes how many objects each store holds (`tailor_snapshot_objects`), every 15 s.
async fn store_sizes<C: CloudProvider>(ctx: Arc<Context<C>>) {
    loop {
        for (kind, n) in ctx.state.sizes() {
            ctx.metrics.set_snapshot_objects(kind, n);
        }
        tokio::time::sleep(Duration::from_secs(15)).await;
    }
}

/// Sleeps until the stores change or `max` passes, whichever is first.
pub async fn wait_for_change(state: &State, max: Duration) {
    tokio::select! {
        // In this order, so the same run wakes the same way every time.
        biased;
        () = state.changed() => {}
        () = tokio::time::sleep(max) => {}
    }
}

/// Sleeps until the stores change after `seen` ([`State::generation`], read before the
/// pass that now waits) or `max` passes: a change made while the pass ran returns at once
/// instead of waiting for the next.
pub async fn wait_for_change_since(state: &State, seen: u64, max: Duration) {
    tokio::select! {
        biased;
        () = state.changed_since(seen) => {}
        () = tokio::time::sleep(max) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn timers_scale_together_and_the_default_is_production() {
        assert_eq!(Timers::scaled(1.0), Timers::default());
        let fast = Timers::scaled(0.2);
        assert_eq!(fast.validation_delay, SignedDuration::from_secs(3));
        assert_eq!(fast.disruption_interval, Duration::from_secs(1));
        assert_eq!(fast.provisioning_cover, SignedDuration::from_secs(4));
        assert_eq!(fast.consolidated_recheck, SignedDuration::from_secs(60));
        // The order between them is kept: a decision is validated over several passes.
        assert!(
            fast.validation_delay > SignedDuration::try_from(fast.disruption_interval).unwrap()
        );
        assert_eq!(
            Timers::scaled(0.0001).disruption_interval,
            Duration::from_millis(100),
            "never below 100 ms"
        );
    }

    fn pool(annotation: Option<&str>) -> NodePool {
        let mut p: NodePool = serde_yaml::from_str(
            "apiVersion: tailor.sh/v1alpha1\nkind: NodePool\nmetadata: {name: default}\nspec:\n  template:\n    spec:\n      nodeClassRef: {group: tailor.sh, kind: AKSNodeClass, name: default}\n",
        )
        .expect("valid nodepool");
        if let Some(a) = annotation {
            p.annotations_mut()
                .insert(labels::MODE_ANNOTATION.to_string(), a.to_string());
        }
        p
    }

    #[test]
    fn a_nodepool_annotation_overrides_the_global_mode() {
        assert_eq!(
            mode_for(Mode::RecommendOnly, Some(&pool(None))),
            Mode::RecommendOnly
        );
        assert_eq!(
            mode_for(Mode::Autonomous, Some(&pool(None))),
            Mode::Autonomous
        );
        assert_eq!(
            mode_for(Mode::RecommendOnly, Some(&pool(Some("autonomous")))),
            Mode::Autonomous
        );
        assert_eq!(
            mode_for(Mode::Autonomous, Some(&pool(Some("recommend")))),
            Mode::RecommendOnly
        );
        // A typo never turns autonomy on.
        assert_eq!(
            mode_for(Mode::Autonomous, Some(&pool(Some("autonomus")))),
            Mode::RecommendOnly
        );
    }

    #[test]
    fn a_disruption_mode_annotation_overrides_the_pools_mode_for_disruption_only() {
        let with = |mode: Option<&str>, disruption: &str| {
            let mut p = pool(mode);
            p.annotations_mut().insert(
                labels::DISRUPTION_MODE_ANNOTATION.to_string(),
                disruption.to_string(),
            );
            p
        };
        let reported = with(None, "recommend");
        assert_eq!(
            disruption_mode_for(Mode::Autonomous, Some(&reported)),
            Mode::RecommendOnly
        );
        assert_eq!(
            mode_for(Mode::Autonomous, Some(&reported)),
            Mode::Autonomous,
            "provisioning still acts"
        );
        assert_eq!(
            disruption_mode_for(Mode::RecommendOnly, Some(&with(None, "autonomous"))),
            Mode::Autonomous
        );
        assert_eq!(
            disruption_mode_for(Mode::Autonomous, Some(&with(None, "yes"))),
            Mode::RecommendOnly
        );
        // Without it, the pool's mode.
        assert_eq!(
            disruption_mode_for(Mode::Autonomous, Some(&pool(Some("recommend")))),
            Mode::RecommendOnly
        );
        assert_eq!(
            disruption_mode_for(Mode::Autonomous, Some(&pool(None))),
            Mode::Autonomous
        );
    }

    #[test]
    fn seeded_names_repeat_and_random_ones_differ() {
        let (a, b) = (Names::seeded(7), Names::seeded(7));
        let first: Vec<String> = (0..3).map(|_| a.suffix()).collect();
        assert_eq!(first, (0..3).map(|_| b.suffix()).collect::<Vec<_>>());
        assert_eq!(a.number(), b.number());
        assert!(first.iter().all(|s| s.len() == 5));
        let (x, y) = (Names::random(), Names::random());
        assert_ne!(
            (0..4).map(|_| x.number()).collect::<Vec<_>>(),
            (0..4).map(|_| y.number()).collect::<Vec<_>>()
        );
    }
}
