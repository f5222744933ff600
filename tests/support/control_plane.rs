//! A real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler and the kubelet stand-in, built from source by `scripts/control-plane`)
//! and the `tailor run` agent as a separate process, for end-to-end tests.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde::de::DeserializeOwned;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A control plane for one test: its own (stopped, by PID, when dropped), or one of a pool
/// of running planes shared by the whole test run and reset for each test.
pub struct ControlPlane {
    home: Home,
    /// Its admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// An admin client.
    pub client: Client,
}

enum Home {
    /// Started for this test alone.
    Own(tempfile::TempDir),
    /// A plane of the pool in `dir`, held for this test by an exclusive lock on `_lock`.
    Pooled { dir: PathBuf, _lock: std::fs::File },
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        match &mut self.home {
            Home::Own(dir) => {
                down(dir.path());
                // A failed test keeps the cluster's and the agents' logs to read (any test
                // does with TAILOR_E2E_KEEP_LOGS set).
                if std::thread::panicking() || std::env::var_os("TAILOR_E2E_KEEP_LOGS").is_some() {
                    let kept = std::mem::replace(dir, tempfile::tempdir().expect("tempdir")).keep();
                    eprintln!("control plane logs kept in {}", kept.join("logs").display());
                }
            }
            // The plane keeps running for the next test; the lock goes with the file.
            Home::Pooled { dir, .. } => {
                if std::thread::panicking() {
                    eprintln!("control plane logs in {}", dir.join("logs").display());
                }
            }
        }
    }
}

fn down(dir: &Path) {
    let _ = Command::new(repo().join("scripts/control-plane"))
        .arg("down")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Runs `scripts/control-plane up DIR`, returning the admin kubeconfig's path.
fn up(dir: &Path) -> PathBuf {
    let out = Command::new(repo().join("scripts/control-plane"))
        .arg("up")
        .arg(dir)
        .output()
        .expect("scripts/control-plane runs");
    assert!(
        out.status.success(),
        "scripts/control-plane up failed (it needs go and openssl; ./scripts/test builds it):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(stdout.lines().last().expect("kubeconfig path").trim())
}

/// The directory of the control plane's binaries (kubectl among them), built once by
/// `scripts/control-plane build` (cached; a test that needs it fails when it cannot be built).
#[allow(dead_code)] // used by the documentation tests
pub fn binaries() -> &'static Path {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let out = Command::new(repo().join("scripts/control-plane"))
            .arg("build")
            .output()
            .expect("scripts/control-plane runs");
        assert!(
            out.status.success(),
            "scripts/control-plane build failed (it needs go):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_string())
    })
}

/// The pool's directory and size: `TAILOR_E2E_POOL` (set by `scripts/test`, which stops the
/// planes at the end) and `TAILOR_E2E_POOL_SIZE` (2 by default).
fn pool() -> Option<(PathBuf, usize)> {
    let dir = std::env::var_os("TAILOR_E2E_POOL").filter(|d| !d.is_empty())?;
    let size = std::env::var("TAILOR_E2E_POOL_SIZE")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(2);
    Some((PathBuf::from(dir), size))
}

/// Takes the first free slot of the pool, waiting while every slot is held by another test
/// (of this process or another: a `flock` on a file opened per call excludes both).
async fn take_slot(pool: &Path, size: usize) -> (usize, std::fs::File) {
    use std::os::fd::AsRawFd;
    std::fs::create_dir_all(pool).expect("the pool's directory");
    loop {
        for slot in 0..size {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(pool.join(format!("slot-{slot}.lock")))
                .expect("a slot's lock file");
            // SAFETY: flock on a descriptor this function owns, held open by `file`.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return (slot, file);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

impl ControlPlane {
    /// A control plane with Tailor's CRDs installed and nothing else: with `TAILOR_E2E_POOL`
    /// set, a plane of the pool (started on first use) reset to an empty cluster; without
    /// it, a fresh plane. Fails, never skips, when it cannot: the end-to-end tests are
    /// worthless without it.
    pub async fn start() -> ControlPlane {
        let Some((pool, size)) = pool() else {
            return ControlPlane::start_fresh().await;
        };
        tailor::telemetry::install_tls_provider();
        let (slot, lock) = take_slot(&pool, size).await;
        let dir = pool.join(format!("slot-{slot}"));
        let kubeconfig = dir.join("kubeconfig");
        let running = kubeconfig.exists()
            && client_for(&kubeconfig)
                .await
                .apiserver_version()
                .await
                .is_ok();
        if !running {
            // Left by a run that ended without stopping it: stop what is left, start anew.
            down(&dir);
            let _ = std::fs::remove_dir_all(&dir);
            up(&dir);
        }
        let client = client_for(&kubeconfig).await;
        let cp = ControlPlane {
            home: Home::Pooled { dir, _lock: lock },
            kubeconfig,
            client,
        };
        if running {
            cp.reset().await;
        } else {
            cp.install_crds().await;
        }
        cp
    }

    /// A control plane started for this test alone, stopped when it ends.
    pub async fn start_fresh() -> ControlPlane {
        let cp = ControlPlane::start_bare().await;
        cp.install_crds().await;
        cp
    }

    /// A plane started for this test alone without Tailor's CRDs, for a test that installs
    /// them itself (with helm, as a user does); stopped when it ends.
    pub async fn start_bare() -> ControlPlane {
        tailor::telemetry::install_tls_provider();
        let dir = tempfile::Builder::new()
            .prefix("tailor-e2e-")
            .tempdir()
            .expect("a temporary directory");
        let kubeconfig = up(dir.path());
        let client = client_for(&kubeconfig).await;
        ControlPlane {
            home: Home::Own(dir),
            kubeconfig,
            client,
        }
    }

    /// The directory holding the cluster's logs and state.
    pub fn dir(&self) -> &Path {
        match &self.home {
            Home::Own(dir) => dir.path(),
            Home::Pooled { dir, .. } => dir,
        }
    }

    async fn install_crds(&self) {
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        for (_, yaml) in tailor::apis::crd_yaml().expect("CRDs render") {
            let crd: CustomResourceDefinition = serde_yaml::from_str(&yaml).expect("CRD parses");
            api.create(&PostParams::default(), &crd)
                .await
                .expect("the API server accepts the CRD");
        }
        let names: Vec<String> = tailor::apis::crds()
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .collect();
        wait_established(&self.client, &names, Duration::from_secs(30)).await;
        self.wait_for_watch_caches().await;
    }

    /// Empties a pooled plane for the next test, as a fresh one would be but for Tailor's
    /// CRDs (installed long ago, as on a user's cluster): every namespace a test made goes;
    /// in `default`, every object a test or an agent may have made; at cluster scope,
    /// Tailor's objects, Nodes (finalizers stripped: no agent is left to drain them),
    /// webhooks, storage and RBAC that is not the API server's own. Waits until the API
    /// server holds none of them. The previous test's agents were killed with it.
    async fn reset(&self) {
        use k8s_openapi::api::admissionregistration::v1::{
            MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
        };
        use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
        use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
        use k8s_openapi::api::batch::v1::{CronJob, Job};
        use k8s_openapi::api::coordination::v1::Lease;
        use k8s_openapi::api::core::v1::{
            ConfigMap, Event, Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod,
            Secret, Service, ServiceAccount,
        };
        use k8s_openapi::api::policy::v1::PodDisruptionBudget;
        use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
        use k8s_openapi::api::scheduling::v1::PriorityClass;
        use k8s_openapi::api::storage::v1::StorageClass;
        use tailor::apis::{AKSNodeClass, NodeClaim, NodePool, Recommendation, RightsizingPolicy};

        const SYSTEM: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];
        let c = &self.client;
        let namespaces: Api<Namespace> = Api::all(c.clone());
        for ns in list(&namespaces).await {
            let name = ns.metadata.name.unwrap_or_default();
            if !SYSTEM.contains(&name.as_str()) && ns.metadata.deletion_timestamp.is_none() {
                let _ = namespaces.delete(&name, &DeleteParams::default()).await;
            }
        }
        let ns = "default";
        clear_in::<Deployment>(c, ns, "").await;
        clear_in::<ReplicaSet>(c, ns, "").await;
        clear_in::<StatefulSet>(c, ns, "").await;
        clear_in::<DaemonSet>(c, ns, "").await;
        clear_in::<Job>(c, ns, "").await;
        clear_in::<CronJob>(c, ns, "").await;
        clear_in::<PodDisruptionBudget>(c, ns, "").await;
        clear_in::<HorizontalPodAutoscaler>(c, ns, "").await;
        clear_in::<ConfigMap>(c, ns, "metadata.name!=kube-root-ca.crt").await;
        clear_in::<Secret>(c, ns, "").await;
        clear_in::<ServiceAccount>(c, ns, "metadata.name!=default").await;
        clear_in::<Service>(c, ns, "metadata.name!=kubernetes").await;
        clear_in::<Lease>(c, ns, "").await;
        clear_in::<Role>(c, ns, "").await;
        clear_in::<RoleBinding>(c, ns, "").await;
        clear_in::<PersistentVolumeClaim>(c, ns, "").await;
        clear_in::<Recommendation>(c, ns, "").await;
        clear_in::<RightsizingPolicy>(c, ns, "").await;
        clear_all::<NodePool>(c, "").await;
        clear_all::<AKSNodeClass>(c, "").await;
        clear_all::<MutatingWebhookConfiguration>(c, "").await;
        clear_all::<ValidatingWebhookConfiguration>(c, "").await;
        clear_all::<StorageClass>(c, "").await;
        clear_all::<PersistentVolume>(c, "").await;
        clear_all::<PriorityClass>(c, "").await;
        // The API server's own roles carry this label; anything else a test made.
        clear_all::<ClusterRole>(c, "!kubernetes.io/bootstrapping").await;
        clear_all::<ClusterRoleBinding>(c, "!kubernetes.io/bootstrapping").await;

        let pods: Api<Pod> = Api::all(c.clone());
        let claims: Api<NodeClaim> = Api::all(c.clone());
        let nodes: Api<Node> = Api::all(c.clone());
        let events: Api<Event> = Api::namespaced(c.clone(), ns);
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        let unfinalize = serde_json::json!({"metadata": {"finalizers": null}});
        eventually(
            Duration::from_secs(90),
            "the pooled control plane reset",
            || async {
                for claim in list(&claims).await {
                    let name = claim.metadata.name.clone().unwrap_or_default();
                    let _ = claims
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&unfinalize))
                        .await;
                    let _ = claims.delete(&name, &now).await;
                }
                for node in list(&nodes).await {
                    let name = node.metadata.name.clone().unwrap_or_default();
                    let _ = nodes
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&unfinalize))
                        .await;
                    let _ = nodes.delete(&name, &now).await;
                }
                let mut left = 0;
                for pod in list(&pods).await {
                    let pod_ns = pod.metadata.namespace.clone().unwrap_or_default();
                    if pod_ns == "kube-system" {
                        continue;
                    }
                    left += 1;
                    let name = pod.metadata.name.clone().unwrap_or_default();
                    let _ = Api::<Pod>::namespaced(c.clone(), &pod_ns)
                        .delete(&name, &now)
                        .await;
                }
                // Events last: the deletions above make some.
                let _ = events
                    .delete_collection(&DeleteParams::default(), &ListParams::default())
                    .await;
                let namespaces_left = list(&namespaces)
                    .await
                    .iter()
                    .filter(|n| !SYSTEM.contains(&n.metadata.name.as_deref().unwrap_or_default()))
                    .count();
                let empty = left == 0
                    && namespaces_left == 0
                    && list(&claims).await.is_empty()
                    && list(&nodes).await.is_empty()
                    && list(&Api::<NodePool>::all(c.clone())).await.is_empty()
                    && list(&events).await.is_empty();
                empty.then_some(())
            },
        )
        .await;
    }

    /// Waits until the API server serves a watch of every Tailor kind from a fresh list's
    /// resourceVersion. A CRD's watch cache starts a moment after the CRD is established, and
    /// a client that listed before then is told its version is too old and relists after a
    /// backoff. On a cluster where the CRDs were installed long ago that never happens; the
    /// tests start the agent on a cluster in that state.
    async fn wait_for_watch_caches(&self) {
        use futures::StreamExt;
        use kube::api::{DynamicObject, ListParams, WatchEvent, WatchParams};
        use kube::discovery::ApiResource;
        let kinds: Vec<ApiResource> = tailor::apis::crds()
            .into_iter()
            .map(|c| {
                let version = c
                    .spec
                    .versions
                    .iter()
                    .find(|v| v.storage)
                    .expect("a storage version")
                    .name
                    .clone();
                ApiResource {
                    api_version: format!("{}/{version}", c.spec.group),
                    group: c.spec.group.clone(),
                    version,
                    kind: c.spec.names.kind.clone(),
                    plural: c.spec.names.plural.clone(),
                }
            })
            .collect();
        let warm = |resource: ApiResource| async move {
            let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource);
            eventually(
                Duration::from_secs(30),
                &format!("the API server's watch cache of {}", resource.kind),
                || async {
                    let version = api
                        .list_metadata(&ListParams::default().limit(1))
                        .await
                        .ok()?
                        .metadata
                        .resource_version?;
                    let stream = api
                        .watch(&WatchParams::default().timeout(1), &version)
                        .await
                        .ok()?;
                    let first = tokio::time::timeout(Duration::from_secs(3), stream.boxed().next())
                        .await
                        .ok()?;
                    // A refused watch answers with an error; a served one with nothing
                    // (no change within the second) or with events.
                    (!matches!(first, Some(Ok(WatchEvent::Error(_)) | Err(_)))).then_some(())
                },
            )
            .await
        };
        futures::future::join_all(kinds.into_iter().map(warm)).await;
    }

    /// Creates the objects of a multi-document YAML text, in order.
    pub async fn apply_yaml(&self, yaml: &str) {
        for doc in serde_yaml::Deserializer::from_str(yaml) {
            let value: serde_json::Value = serde::Deserialize::deserialize(doc).expect("YAML");
            if value.is_null() {
                continue;
            }
            create_value(&self.client, value)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }

    /// Creates the single object of a YAML text, returning the API server's refusal.
    pub async fn try_create(&self, yaml: &str) -> Result<(), String> {
        let value: serde_json::Value = serde_yaml::from_str(yaml).expect("YAML");
        create_value(&self.client, value).await
    }
}

/// Deletes every object of a namespaced kind in `namespace` but those `fields` exclude.
async fn clear_in<K>(client: &Client, namespace: &str, fields: &str)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let _ = api
        .delete_collection(
            &DeleteParams::background(),
            &ListParams::default().fields(fields),
        )
        .await;
}

/// Deletes every object of a cluster-scoped kind but those `labels` exclude.
async fn clear_all<K>(client: &Client, labels: &str)
where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    let _ = api
        .delete_collection(
            &DeleteParams::background(),
            &ListParams::default().labels(labels),
        )
        .await;
}

/// A client for a kubeconfig file.
pub async fn client_for(kubeconfig: &Path) -> Client {
    let parsed = Kubeconfig::read_from(kubeconfig).expect("kubeconfig reads");
    let config = Config::from_custom_kubeconfig(parsed, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig is valid");
    Client::try_from(config).expect("client")
}

/// Creates one object given as JSON, by its apiVersion and kind.
pub async fn create_value(client: &Client, value: serde_json::Value) -> Result<(), String> {
    use kube::api::DynamicObject;
    use kube::discovery::ApiResource;
    let api_version = value["apiVersion"]
        .as_str()
        .expect("apiVersion")
        .to_string();
    let kind = value["kind"].as_str().expect("kind").to_string();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", &api_version));
    let plural = format!("{}s", kind.to_lowercase())
        .replace("classs", "classes")
        .replace("policys", "policies");
    let resource = ApiResource {
        group: group.to_string(),
        version: version.to_string(),
        api_version: api_version.clone(),
        kind: kind.clone(),
        plural,
    };
    let object: DynamicObject = serde_json::from_value(value).expect("object");
    let api: Api<DynamicObject> = match &object.metadata.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    api.create(&PostParams::default(), &object)
        .await
        .map(|_| ())
        .map_err(|e| format!("creating {kind} {:?}: {e}", object.metadata.name))
}

/// Waits until every CRD named in `names` is `Established`: the API server serves its
/// resources. Panics after `within`.
#[allow(dead_code)] // not every test binary installs CRDs of its own
pub async fn wait_established(client: &Client, names: &[String], within: Duration) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    eventually(within, "CRDs established", || async {
        for name in names {
            let crd = api.get(name).await.ok()?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if !established {
                return None;
            }
        }
        Some(())
    })
    .await;
}

/// Polls `probe` every 250 ms until it returns `Some`, failing the test after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A kubeconfig acting as the ServiceAccount `account` of `namespace`, as its projected token
/// does in a pod: the admin's kubeconfig with its client certificate swapped for a token the
/// TokenRequest API mints (valid an hour). Written into the plane's directory.
#[allow(dead_code)] // used by the chart tests
pub async fn service_account_kubeconfig(
    cp: &ControlPlane,
    namespace: &str,
    account: &str,
) -> PathBuf {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let token = Api::<ServiceAccount>::namespaced(cp.client.clone(), namespace)
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("a token for ServiceAccount {namespace}/{account}: {e}"))
        .status
        .expect("token status")
        .token;
    let text = std::fs::read_to_string(&cp.kubeconfig).expect("admin kubeconfig");
    let mut config: serde_yaml::Value = serde_yaml::from_str(&text).expect("kubeconfig YAML");
    let users = config["users"].as_sequence_mut().expect("users");
    assert_eq!(users.len(), 1, "one user in the admin kubeconfig");
    users[0]["user"] = serde_yaml::to_value(serde_json::json!({"token": token})).expect("user");
    let path = cp.dir().join(format!("{namespace}-{account}.kubeconfig"));
    std::fs::write(&path, serde_yaml::to_string(&config).expect("YAML")).expect("write");
    path
}

/// Lists every object of a kind.
pub async fn list<K>(api: &Api<K>) -> Vec<K>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    api.list(&Default::default()).await.expect("list").items
}

/// Every agent a test starts runs its protocol timers (the Lease, disruption's validation
/// delay and interval, the provisioner's cover) at this fraction of production's:
/// `tailor run --timer-scale`. A Lease of 4 s, a validation delay of 3 s, a disruption pass
/// every second.
pub const TIMER_SCALE: f64 = 0.2;

/// Production seconds at the tests' timer scale.
#[allow(dead_code)] // not every test binary waits on the agent's timers
pub fn scaled(production_secs: f64) -> Duration {
    Duration::from_secs_f64(production_secs * TIMER_SCALE)
}

/// One full disruption decision at the tests' timer scale: a pass that sees it, the
/// validation delay (15 s in production), and the pass that carries it out (passes every
/// 5 s). A cluster unchanged for longer than this had nothing left to decide.
#[allow(dead_code)] // not every test binary waits on disruption
pub fn decision_cycle() -> Duration {
    scaled(15.0 + 2.0 * 5.0)
}

/// The `tailor run` agent as a child process; killed when dropped.
pub struct Agent {
    child: Option<Child>,
    /// `http://127.0.0.1:PORT`, serving /metrics, /healthz and /readyz.
    pub url: String,
    #[allow(dead_code)] // read by the tests that read logs
    log: PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Agent {
    /// Starts `tailor run` against the control plane with `extra` flags (the cloud is KWOK).
    pub fn start(cp: &ControlPlane, name: &str, extra: &[&str]) -> Agent {
        Agent::start_with(cp, name, &["--cloud", "kwok"], extra, &[])
    }

    /// Starts `tailor run` with the cloud flags `cloud`, `extra` flags and environment `env`.
    pub fn start_with(
        cp: &ControlPlane,
        name: &str,
        cloud: &[&str],
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Agent {
        Agent::start_as(cp, &cp.kubeconfig, "default", name, cloud, extra, env)
    }

    /// Starts `tailor run` with the identity of `kubeconfig` (the admin's, or a
    /// ServiceAccount's; an empty path passes none), its leader-election Lease in
    /// `lease_namespace`.
    pub fn start_as(
        cp: &ControlPlane,
        kubeconfig: &Path,
        lease_namespace: &str,
        name: &str,
        cloud: &[&str],
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Agent {
        Agent::spawn(
            cp,
            kubeconfig,
            lease_namespace,
            name,
            cloud,
            extra,
            env,
            TIMER_SCALE,
            None,
        )
    }

    /// Starts `tailor run` on the KWOK cloud with `extra` flags, allowed to open at most
    /// `open_files` descriptors (soft and hard limit), as a container runtime may set.
    #[allow(dead_code)] // used by the connection-flood test only
    pub fn start_with_open_files(
        cp: &ControlPlane,
        name: &str,
        extra: &[&str],
        open_files: u64,
    ) -> Agent {
        Agent::spawn(
            cp,
            &cp.kubeconfig,
            "default",
            name,
            &["--cloud", "kwok"],
            extra,
            &[],
            TIMER_SCALE,
            Some(open_files),
        )
    }

    /// Starts `tailor run` on the KWOK cloud with its production timers (as users run it),
    /// for the benches that compare it with another autoscaler on the same cluster.
    #[allow(dead_code)] // used by the benches, not by the tests
    pub fn start_production(cp: &ControlPlane, name: &str, extra: &[&str]) -> Agent {
        Agent::spawn(
            cp,
            &cp.kubeconfig,
            "default",
            name,
            &["--cloud", "kwok"],
            extra,
            &[],
            1.0,
            None,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn spawn(
        cp: &ControlPlane,
        kubeconfig: &Path,
        lease_namespace: &str,
        name: &str,
        cloud: &[&str],
        extra: &[&str],
        env: &[(&str, &str)],
        timer_scale: f64,
        open_files: Option<u64>,
    ) -> Agent {
        let port = free_port();
        let address = format!("127.0.0.1:{port}");
        // Unique per test process and agent: a pooled plane's logs outlive its tests.
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = cp
            .dir()
            .join("logs")
            .join(format!("agent-{name}-{}-{n}.log", std::process::id()));
        let file = std::fs::File::create(&log).expect("agent log");
        // `TAILOR_E2E_BIN` runs the agent from another build (e.g. the optimised one the
        // benchmarks build), to measure its latencies as users run it.
        let binary = std::env::var_os("TAILOR_E2E_BIN")
            .filter(|b| !b.is_empty())
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_tailor").into());
        // An empty kubeconfig path: none on the command line, so the agent finds its own
        // (from `KUBECONFIG` in `env`).
        let kubeconfig_flag: Vec<&std::ffi::OsStr> = if kubeconfig.as_os_str().is_empty() {
            Vec::new()
        } else {
            vec!["--kubeconfig".as_ref(), kubeconfig.as_os_str()]
        };
        let mut command = Command::new(binary);
        if let Some(n) = open_files {
            use std::os::unix::process::CommandExt;
            // SAFETY: between fork and exec the closure only calls setrlimit, which is
            // async-signal-safe, and allocates nothing.
            unsafe {
                command.pre_exec(move || {
                    let limit = libc::rlimit {
                        rlim_cur: n as libc::rlim_t,
                        rlim_max: n as libc::rlim_t,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        let child = command
            .arg("run")
            .args(kubeconfig_flag)
            .args(cloud)
            .args([
                "--cluster-name",
                "e2e",
                "--metrics-address",
                &address,
                "--health-address",
                &address,
                "--leader-election-namespace",
                lease_namespace,
            ])
            .args(["--timer-scale", &timer_scale.to_string()])
            .args(extra)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info,tailor=debug")
            .env("POD_NAME", name)
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("tailor run starts");
        Agent {
            child: Some(child),
            url: format!("http://{address}"),
            log,
        }
    }

    /// Kills the agent at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether the agent has exited by itself (it is still running otherwise).
    #[allow(dead_code)] // not every test watches for an exit
    pub fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_some())
    }

    /// The agent's process id (0 once killed).
    #[allow(dead_code)] // used by the memory bench, not by every test
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The agent's log so far.
    #[allow(dead_code)] // not every test binary reads logs
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `lines` lines of the agent's log, oldest first (for failure messages).
    #[allow(dead_code)] // not every test binary reads logs
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Whether `/metrics` says this agent leads (false when it does not answer).
    #[allow(dead_code)] // not every test binary watches leadership
    pub async fn leads(&self) -> bool {
        let Ok(answer) = reqwest::get(format!("{}/metrics", self.url)).await else {
            return false;
        };
        answer
            .text()
            .await
            .unwrap_or_default()
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["tailor_leader", "1"])
    }

    /// Waits until this agent leads.
    #[allow(dead_code)] // not every test binary watches leadership
    pub async fn wait_leading(&self, secs: u64) {
        eventually(Duration::from_secs(secs), "the agent leads", || async {
            self.leads().await.then_some(())
        })
        .await;
    }

    /// Waits until `/readyz` answers 200.
    pub async fn wait_ready(&self) {
        let url = format!("{}/readyz", self.url);
        eventually(Duration::from_secs(60), "the agent's /readyz", || async {
            let r = reqwest::get(&url).await.ok()?;
            r.status().is_success().then_some(())
        })
        .await;
    }

    /// How many passes `controller` (`provisioning`, `rightsizing`, ...) has made: its
    /// reconcile count on `/metrics`.
    #[allow(dead_code)] // not every test binary counts passes
    pub async fn passes(&self, controller: &str) -> u64 {
        let series =
            format!("tailor_reconcile_duration_seconds_count{{controller=\"{controller}\"}}");
        metric_value(&self.metrics().await, &series) as u64
    }

    /// The agent's peak resident memory (VmHWM) so far, in MiB.
    #[allow(dead_code)] // used by the memory tests and benches
    pub fn peak_memory_mib(&self) -> f64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0.0, |kib| kib / 1024.0)
    }

    /// Waits until `controller` has made `n` more passes than now: what it decides from the
    /// cluster as it is now has then been decided and acted on.
    #[allow(dead_code)] // not every test binary counts passes
    pub async fn wait_passes(&self, controller: &str, n: u64, secs: u64) {
        let start = self.passes(controller).await;
        eventually(
            Duration::from_secs(secs),
            &format!("{n} more {controller} passes"),
            || async { (self.passes(controller).await >= start + n).then_some(()) },
        )
        .await;
    }

    /// The agent's `/metrics` text.
    pub async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.url))
            .await
            .expect("metrics answer")
            .text()
            .await
            .expect("metrics text")
    }
}

/// The value of `series` (a metric name, with its labels as `/metrics` writes them) in a
/// `/metrics` text; 0 when it is absent.
pub fn metric_value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The agent's memory limit in the chart's values, in MiB.
#[allow(dead_code)] // used by the memory tests and benches
pub fn chart_memory_limit_mib() -> f64 {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/charts/tailor/values.yaml");
    let values: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(path).expect("values.yaml")).expect("YAML");
    let limit = values["resources"]["limits"]["memory"]
        .as_str()
        .expect("resources.limits.memory");
    limit
        .strip_suffix("Mi")
        .and_then(|v| v.parse().ok())
        .or_else(|| {
            limit
                .strip_suffix("Gi")
                .and_then(|v| v.parse::<f64>().ok())
                .map(|g| g * 1024.0)
        })
        .expect("a limit in Mi or Gi")
}

/// A free loopback TCP port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}
