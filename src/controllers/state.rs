//! The agent's view of the cluster: one reflector store per kind the decisions read, and
//! the [`Snapshot`] built from them — the same type the CLI reads from YAML, so the agent
//! decides on exactly what `tailor simulate` would be shown.

use std::fmt::Debug;
use std::future::ready;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    Container, Node, PersistentVolume, PersistentVolumeClaim, Pod, PodSpec, PodTemplateSpec,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;

use crate::apis::{AKSNodeClass, NodeClaim, NodePool, Recommendation, RightsizingPolicy};
use crate::state::Snapshot;

/// Reflector stores for every kind a decision reads.
#[derive(Clone)]
pub struct State {
    /// Pods.
    pub pods: Store<Pod>,
    /// Nodes.
    pub nodes: Store<Node>,
    /// NodePools.
    pub node_pools: Store<NodePool>,
    /// NodeClaims.
    pub node_claims: Store<NodeClaim>,
    /// AKSNodeClasses.
    pub node_classes: Store<AKSNodeClass>,
    /// PodDisruptionBudgets.
    pub pdbs: Store<PodDisruptionBudget>,
    /// PersistentVolumeClaims.
    pub claims: Store<PersistentVolumeClaim>,
    /// PersistentVolumes.
    pub volumes: Store<PersistentVolume>,
    /// StorageClasses.
    pub storage_classes: Store<StorageClass>,
    /// DaemonSets.
    pub daemon_sets: Store<DaemonSet>,
    /// Deployments.
    pub deployments: Store<Deployment>,
    /// StatefulSets.
    pub stateful_sets: Store<StatefulSet>,
    /// ReplicaSets.
    pub replica_sets: Store<ReplicaSet>,
    /// Jobs.
    pub jobs: Store<Job>,
    /// HorizontalPodAutoscalers.
    pub hpas: Store<HorizontalPodAutoscaler>,
    /// RightsizingPolicies.
    pub policies: Store<RightsizingPolicy>,
    /// Recommendations, with their checkpoints: a follower holds what the leader last
    /// wrote, so it continues the histograms when it takes over.
    pub recommendations: Store<Recommendation>,
    changed: Arc<Notify>,
    synced: watch::Receiver<bool>,
    /// Changes seen so far, over every store.
    generation: Arc<AtomicU64>,
}

/// Starts a reflector for `K` on `tasks`, notifying `changed` on every event.
fn reflect<K>(
    client: &Client,
    tasks: &mut JoinSet<()>,
    changed: &Arc<Notify>,
    generation: &Arc<AtomicU64>,
) -> Store<K>
where
    K: Resource<DynamicType = ()> + Slim + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let api = Api::<K>::all(client.clone());
    let changed = changed.clone();
    let generation = generation.clone();
    let kind = K::kind(&()).to_string();
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        // Fields no decision reads are dropped as objects arrive: the stores (and every
        // snapshot built from them) hold only what the controllers use.
        .modify(|o: &mut K| {
            o.managed_fields_mut().clear();
            o.annotations_mut().remove(LAST_APPLIED);
            o.slim();
        })
        .reflect(writer)
        .for_each(move |event| {
            match event {
                Ok(_) => {
                    generation.fetch_add(1, Ordering::Relaxed);
                    changed.notify_waiters();
                }
                Err(e) => tracing::warn!(kind = %kind, error = %e, "watch failed; retrying"),
            }
            ready(())
        });
    tasks.spawn(stream);
    reader
}

/// `kubectl apply`'s copy of the whole object: often the largest annotation, never read.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops the parts of an object that no decision reads. The stores are read-only views:
/// every write is a targeted patch or apply of the fields Tailor owns, never the stored
/// object sent back, so nothing dropped here can be erased from the cluster.
pub trait Slim {
    /// Removes what the controllers never read.
    fn slim(&mut self) {}
}

/// A pod spec keeps what scheduling, disruption and right-sizing read: containers' names,
/// images, resources, ports, restart and resize policies, and everything about placement.
/// Volumes other than claims, environment, probes, commands and security settings are
/// dropped.
fn slim_pod_spec(spec: &mut PodSpec) {
    fn container(c: &mut Container) {
        c.env = None;
        c.env_from = None;
        c.volume_mounts = None;
        c.volume_devices = None;
        c.liveness_probe = None;
        c.readiness_probe = None;
        c.startup_probe = None;
        c.lifecycle = None;
        c.command = None;
        c.args = None;
        c.working_dir = None;
        c.security_context = None;
        c.termination_message_path = None;
        c.termination_message_policy = None;
    }
    spec.containers.iter_mut().for_each(container);
    spec.init_containers
        .iter_mut()
        .flatten()
        .for_each(container);
    spec.ephemeral_containers = None;
    crate::state::keep_claim_volumes(spec);
    spec.security_context = None;
    spec.image_pull_secrets = None;
    spec.host_aliases = None;
    spec.dns_config = None;
    spec.readiness_gates = None;
}

fn slim_template(template: &mut PodTemplateSpec) {
    template.metadata.iter_mut().for_each(|m| {
        m.managed_fields = None;
        if let Some(a) = m.annotations.as_mut() {
            a.remove(LAST_APPLIED);
        }
    });
    template.spec.iter_mut().for_each(slim_pod_spec);
}

impl Slim for Pod {
    fn slim(&mut self) {
        self.spec.iter_mut().for_each(slim_pod_spec);
        if let Some(status) = self.status.as_mut() {
            let statuses = status
                .container_statuses
                .iter_mut()
                .chain(status.init_container_statuses.iter_mut())
                .flatten();
            for c in statuses {
                c.image = String::new();
                c.image_id = String::new();
                c.container_id = None;
                c.volume_mounts = None;
                c.user = None;
                c.allocated_resources_status = None;
            }
            status.ephemeral_container_statuses = None;
        }
    }
}

impl Slim for Node {
    fn slim(&mut self) {
        if let Some(status) = self.status.as_mut() {
            status.images = None;
            status.volumes_attached = None;
            status.volumes_in_use = None;
        }
    }
}

impl Slim for DaemonSet {
    fn slim(&mut self) {
        self.spec
            .iter_mut()
            .for_each(|s| slim_template(&mut s.template));
    }
}

impl Slim for Deployment {
    fn slim(&mut self) {
        self.spec
            .iter_mut()
            .for_each(|s| slim_template(&mut s.template));
    }
}

impl Slim for StatefulSet {
    fn slim(&mut self) {
        self.spec.iter_mut().for_each(|s| {
            slim_template(&mut s.template);
            // Claim templates shape volumes, which no decision reads.
            s.volume_claim_templates = None;
        });
    }
}

impl Slim for ReplicaSet {
    fn slim(&mut self) {
        self.spec
            .iter_mut()
            .filter_map(|s| s.template.as_mut())
            .for_each(slim_template);
    }
}

impl Slim for Job {
    fn slim(&mut self) {
        self.spec
            .iter_mut()
            .for_each(|s| slim_template(&mut s.template));
    }
}

impl Slim for PodDisruptionBudget {}
impl Slim for StorageClass {}

impl Slim for PersistentVolumeClaim {
    fn slim(&mut self) {
        // What places a pod: the bound volume's name and the class; not the claim's data
        // source, selector or status.
        if let Some(spec) = self.spec.as_mut() {
            spec.data_source = None;
            spec.data_source_ref = None;
            spec.selector = None;
        }
        self.status = None;
    }
}

impl Slim for PersistentVolume {
    fn slim(&mut self) {
        // The driver (an Azure Disk takes a data-disk slot) and the node affinity (its zone)
        // place a pod; the source's other details are not read.
        if let Some(spec) = self.spec.as_mut() {
            spec.csi =
                spec.csi
                    .take()
                    .map(|c| k8s_openapi::api::core::v1::CSIPersistentVolumeSource {
                        driver: c.driver,
                        ..Default::default()
                    });
            spec.mount_options = None;
            spec.claim_ref = None;
        }
        self.status = None;
    }
}
impl Slim for HorizontalPodAutoscaler {}
impl Slim for NodePool {}
impl Slim for NodeClaim {}
impl Slim for AKSNodeClass {}
impl Slim for RightsizingPolicy {}
impl Slim for Recommendation {}

impl State {
    /// Starts watching every kind; the watches run on `tasks` until they are aborted.
    pub fn start(client: &Client, tasks: &mut JoinSet<()>) -> State {
        let changed = Arc::new(Notify::new());
        let generation = Arc::new(AtomicU64::new(0));
        let (done, synced) = watch::channel(false);
        let (c, g) = (&changed, &generation);
        let state = State {
            pods: reflect(client, tasks, c, g),
            nodes: reflect(client, tasks, c, g),
            node_pools: reflect(client, tasks, c, g),
            node_claims: reflect(client, tasks, c, g),
            node_classes: reflect(client, tasks, c, g),
            pdbs: reflect(client, tasks, c, g),
            claims: reflect(client, tasks, c, g),
            volumes: reflect(client, tasks, c, g),
            storage_classes: reflect(client, tasks, c, g),
            daemon_sets: reflect(client, tasks, c, g),
            deployments: reflect(client, tasks, c, g),
            stateful_sets: reflect(client, tasks, c, g),
            replica_sets: reflect(client, tasks, c, g),
            jobs: reflect(client, tasks, c, g),
            hpas: reflect(client, tasks, c, g),
            policies: reflect(client, tasks, c, g),
            recommendations: reflect(client, tasks, c, g),
            changed,
            synced,
            generation,
        };
        tasks.spawn(state.clone().sync_all(done));
        state
    }

    /// Stores filled by hand instead of by watches, and the [`StateFeed`] that fills them:
    /// the demo's simulated cluster shows its objects to the controllers this way. Nothing
    /// is synced until [`StateFeed::synced`].
    pub fn in_memory() -> (State, StateFeed) {
        let changed = Arc::new(Notify::new());
        let generation = Arc::new(AtomicU64::new(0));
        let (done, synced) = watch::channel(false);
        macro_rules! stores {
            ($($field:ident),*) => {{
                $(let $field = reflector::store();)*
                (
                    State {
                        $($field: $field.0,)*
                        changed: changed.clone(),
                        synced,
                        generation: generation.clone(),
                    },
                    StateFeed {
                        $($field: $field.1,)*
                        changed,
                        generation,
                        done: Some(done),
                    },
                )
            }};
        }
        stores!(
            pods,
            nodes,
            node_pools,
            node_claims,
            node_classes,
            pdbs,
            claims,
            volumes,
            storage_classes,
            daemon_sets,
            deployments,
            stateful_sets,
            replica_sets,
            jobs,
            hpas,
            policies,
            recommendations
        )
    }

    /// Waits until every store has its first full list.
    pub async fn wait_synced(&self) {
        let mut synced = self.synced.clone();
        // An error means the syncing task is gone: the agent is shutting down.
        let _ = synced.wait_for(|done| *done).await;
    }

    /// Waits for each store in turn and then announces it. One waiter per store: a store
    /// wakes only one task waiting for its first list, so every other controller waits on
    /// the announcement instead.
    async fn sync_all(self, done: watch::Sender<bool>) {
        async fn one<K: Clone + Resource<DynamicType = ()> + 'static>(store: &Store<K>) {
            if store.wait_until_ready().await.is_ok() {
                tracing::debug!(kind = %K::kind(&()), "store synced");
            }
        }
        tokio::join!(
            one(&self.pods),
            one(&self.nodes),
            one(&self.node_pools),
            one(&self.node_claims),
            one(&self.node_classes),
            one(&self.pdbs),
            one(&self.claims),
            one(&self.volumes),
            one(&self.storage_classes),
            one(&self.daemon_sets),
            one(&self.deployments),
            one(&self.stateful_sets),
            one(&self.replica_sets),
            one(&self.jobs),
            one(&self.hpas),
            one(&self.policies),
            one(&self.recommendations),
        );
        let _ = done.send(true);
    }

    /// The AKSNodeClass of this name, if the store holds it.
    pub fn node_class(&self, name: &str) -> Option<AKSNodeClass> {
        self.node_classes
            .state()
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))
            .map(|c| (**c).clone())
    }

    /// Resolves at the next change of any store (or spuriously; callers re-read).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Resolves at the next change of any store, or at once when the stores have changed
    /// since `seen` ([`State::generation`]).
    pub async fn changed_since(&self, seen: u64) {
        let notified = self.changed.notified();
        tokio::pin!(notified);
        // Registered before the check: a change between the check and the wait wakes it.
        notified.as_mut().enable();
        if self.generation() != seen {
            return;
        }
        notified.await;
    }

    /// How many changes the stores have seen: equal on two reads, nothing changed between
    /// them.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// A snapshot of the stores as they are now. Unlike a snapshot file, workloads are not
    /// expanded into pending pods: their controllers make the pods, and the agent sees them.
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot_with_pods(|_| true)
    }

    /// A snapshot holding only the pods `keep` selects: a controller that reads a few
    /// pods does not copy all of them.
    pub fn snapshot_with_pods(&self, keep: impl Fn(&Pod) -> bool) -> Snapshot {
        // In name order: a store iterates in an order of its own, which changes from process
        // to process, and decisions that try nodes or pods in turn would follow it.
        fn sorted<K: Resource<DynamicType = ()>>(mut objects: Vec<Arc<K>>) -> Vec<Arc<K>> {
            objects.sort_by(|a, b| {
                (&a.meta().namespace, &a.meta().name).cmp(&(&b.meta().namespace, &b.meta().name))
            });
            objects
        }
        fn all<K: Clone + Resource<DynamicType = ()>>(store: &Store<K>) -> Vec<K> {
            sorted(store.state())
                .iter()
                .map(|o| (**o).clone())
                .collect()
        }
        Snapshot {
            pods: sorted(self.pods.state_filter(|p| keep(p))),
            nodes: all(&self.nodes),
            daemon_sets: all(&self.daemon_sets),
            deployments: all(&self.deployments),
            stateful_sets: all(&self.stateful_sets),
            replica_sets: all(&self.replica_sets),
            jobs: all(&self.jobs),
            pod_disruption_budgets: all(&self.pdbs),
            persistent_volume_claims: all(&self.claims),
            persistent_volumes: all(&self.volumes),
            storage_classes: all(&self.storage_classes),
            storage_read: true,
            horizontal_pod_autoscalers: all(&self.hpas),
            node_pools: all(&self.node_pools),
            node_claims: all(&self.node_claims),
            node_classes: all(&self.node_classes),
            rightsizing_policies: all(&self.policies),
            // The right-sizing controller reads the store directly, checkpoints and all.
            recommendations: Vec::new(),
            warnings: Vec::new(),
        }
    }

    /// Objects per kind in the stores, for the store-size metric.
    pub fn sizes(&self) -> [(&'static str, usize); 17] {
        [
            ("Pod", self.pods.len()),
            ("Node", self.nodes.len()),
            ("NodePool", self.node_pools.len()),
            ("NodeClaim", self.node_claims.len()),
            ("AKSNodeClass", self.node_classes.len()),
            ("PodDisruptionBudget", self.pdbs.len()),
            ("PersistentVolumeClaim", self.claims.len()),
            ("PersistentVolume", self.volumes.len()),
            ("StorageClass", self.storage_classes.len()),
            ("DaemonSet", self.daemon_sets.len()),
            ("Deployment", self.deployments.len()),
            ("StatefulSet", self.stateful_sets.len()),
            ("ReplicaSet", self.replica_sets.len()),
            ("Job", self.jobs.len()),
            ("HorizontalPodAutoscaler", self.hpas.len()),
            ("RightsizingPolicy", self.policies.len()),
            ("Recommendation", self.recommendations.len()),
        ]
    }
}

/// A store's objects in name order (namespace, then name): a store iterates in an order of
/// its own, which changes from process to process, so a controller that acts on objects
/// in turn (evicts pods, launches claims) reads them this way and does the same every time.
pub trait InOrder<K> {
    /// The objects, in name order.
    fn in_order(&self) -> Vec<Arc<K>>;
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> InOrder<K> for Store<K> {
    fn in_order(&self) -> Vec<Arc<K>> {
        let mut objects = self.state();
        objects.sort_by(|a, b| {
            (&a.meta().namespace, &a.meta().name).cmp(&(&b.meta().namespace, &b.meta().name))
        });
        objects
    }
}

/// Fills the stores of a [`State::in_memory`]: every object shown, changed or removed
/// wakes the controllers waiting for a change, as a watch event does.
pub struct StateFeed {
    pods: reflector::store::Writer<Pod>,
    nodes: reflector::store::Writer<Node>,
    node_pools: reflector::store::Writer<NodePool>,
    node_claims: reflector::store::Writer<NodeClaim>,
    node_classes: reflector::store::Writer<AKSNodeClass>,
    pdbs: reflector::store::Writer<PodDisruptionBudget>,
    claims: reflector::store::Writer<PersistentVolumeClaim>,
    volumes: reflector::store::Writer<PersistentVolume>,
    storage_classes: reflector::store::Writer<StorageClass>,
    daemon_sets: reflector::store::Writer<DaemonSet>,
    deployments: reflector::store::Writer<Deployment>,
    stateful_sets: reflector::store::Writer<StatefulSet>,
    replica_sets: reflector::store::Writer<ReplicaSet>,
    jobs: reflector::store::Writer<Job>,
    hpas: reflector::store::Writer<HorizontalPodAutoscaler>,
    policies: reflector::store::Writer<RightsizingPolicy>,
    recommendations: reflector::store::Writer<Recommendation>,
    changed: Arc<Notify>,
    generation: Arc<AtomicU64>,
    done: Option<watch::Sender<bool>>,
}

/// A kind a [`StateFeed`] has a store for.
pub trait Fed: Resource<DynamicType = ()> + Clone + Sized + 'static {
    /// Its store's writer.
    fn store(feed: &mut StateFeed) -> &mut reflector::store::Writer<Self>;
}

macro_rules! fed {
    ($($kind:ty => $field:ident),* $(,)?) => {
        $(impl Fed for $kind {
            fn store(feed: &mut StateFeed) -> &mut reflector::store::Writer<Self> {
                &mut feed.$field
            }
        })*

        impl StateFeed {
            /// Marks every store synced (what it holds is the first full list): the
            /// controllers waiting for it start.
            pub fn synced(&mut self) {
                $(
                    self.$field.apply_watcher_event(&watcher::Event::Init);
                    for o in self.$field.as_reader().state() {
                        self.$field.apply_watcher_event(&watcher::Event::InitApply((*o).clone()));
                    }
                    self.$field.apply_watcher_event(&watcher::Event::InitDone);
                )*
                if let Some(done) = self.done.take() {
                    let _ = done.send(true);
                }
                self.changed.notify_waiters();
            }
        }
    };
}

fed!(
    Pod => pods,
    Node => nodes,
    NodePool => node_pools,
    NodeClaim => node_claims,
    AKSNodeClass => node_classes,
    PodDisruptionBudget => pdbs,
    PersistentVolumeClaim => claims,
    PersistentVolume => volumes,
    StorageClass => storage_classes,
    DaemonSet => daemon_sets,
    Deployment => deployments,
    StatefulSet => stateful_sets,
    ReplicaSet => replica_sets,
    Job => jobs,
    HorizontalPodAutoscaler => hpas,
    RightsizingPolicy => policies,
    Recommendation => recommendations,
);

impl StateFeed {
    /// Shows `object` as it is now (new or changed).
    pub fn apply<K: Fed>(&mut self, object: &K) {
        K::store(self).apply_watcher_event(&watcher::Event::Apply(object.clone()));
        self.notify();
    }

    /// Removes `object` from its store.
    pub fn delete<K: Fed>(&mut self, object: &K) {
        K::store(self).apply_watcher_event(&watcher::Event::Delete(object.clone()));
        self.notify();
    }

    fn notify(&self) {
        self.generation.fetch_add(1, Ordering::Relaxed);
        self.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(namespace: &str, name: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some(namespace.to_string()),
                name: Some(name.to_string()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    #[tokio::test]
    async fn a_fed_state_syncs_when_told_wakes_on_every_change_and_snapshots_in_name_order() {
        let (state, mut feed) = State::in_memory();
        for name in ["web-c", "web-a", "web-b"] {
            feed.apply(&pod("shop", name));
        }
        // Not synced before the feed says so.
        let early = tokio::time::timeout(std::time::Duration::from_millis(20), state.wait_synced());
        assert!(early.await.is_err(), "synced before the first full list");
        feed.synced();
        state.wait_synced().await;
        let names: Vec<String> = state.snapshot().pods.iter().map(|p| p.name_any()).collect();
        assert_eq!(names, ["web-a", "web-b", "web-c"]);

        let before = state.generation();
        let waiting = tokio::spawn({
            let state = state.clone();
            async move { state.changed().await }
        });
        tokio::task::yield_now().await;
        feed.delete(&pod("shop", "web-b"));
        tokio::time::timeout(std::time::Duration::from_secs(1), waiting)
            .await
            .expect("the waiter is woken")
            .expect("the waiter ran");
        assert_eq!(state.generation(), before + 1);
        assert_eq!(state.pods.state().len(), 2);
        assert_eq!(state.generation(), before + 1, "reading changes nothing");
    }
}
