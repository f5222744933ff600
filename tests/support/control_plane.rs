//! A real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler and the kubelet stand-in, built from source by `scripts/control-plane`)
//! and the `tailor run` agent as a separate process, for end-to-end tests.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde::de::DeserializeOwned;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A running control plane; stopped (by PID) when dropped.
pub struct ControlPlane {
    dir: tempfile::TempDir,
    /// Its admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// An admin client.
    pub client: Client,
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("scripts/control-plane"))
            .arg("down")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        // A failed test keeps the cluster's and the agents' logs to read (any test does with
        // TAILOR_E2E_KEEP_LOGS set).
        if std::thread::panicking() || std::env::var_os("TAILOR_E2E_KEEP_LOGS").is_some() {
            let kept =
                std::mem::replace(&mut self.dir, tempfile::tempdir().expect("tempdir")).keep();
            eprintln!("control plane logs kept in {}", kept.join("logs").display());
        }
    }
}

impl ControlPlane {
    /// Builds (once, cached) and starts a control plane with Tailor's CRDs installed. Fails,
    /// never skips, when it cannot: the end-to-end tests are worthless without it.
    pub async fn start() -> ControlPlane {
        tailor::telemetry::install_tls_provider();
        let dir = tempfile::Builder::new()
            .prefix("tailor-e2e-")
            .tempdir()
            .expect("a temporary directory");
        let out = Command::new(repo().join("scripts/control-plane"))
            .arg("up")
            .arg(dir.path())
            .output()
            .expect("scripts/control-plane runs");
        assert!(
            out.status.success(),
            "scripts/control-plane up failed (it needs go and openssl; ./scripts/test builds it):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let kubeconfig = PathBuf::from(stdout.lines().last().expect("kubeconfig path").trim());
        let client = client_for(&kubeconfig).await;
        let cp = ControlPlane {
            dir,
            kubeconfig,
            client,
        };
        cp.install_crds().await;
        cp
    }

    /// The directory holding the cluster's logs and state.
    pub fn dir(&self) -> &Path {
        self.dir.path()
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
        eventually(Duration::from_secs(30), "CRDs established", || async {
            for name in &names {
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
        self.wait_for_watch_caches().await;
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

/// Lists every object of a kind.
pub async fn list<K>(api: &Api<K>) -> Vec<K>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    api.list(&Default::default()).await.expect("list").items
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
    /// ServiceAccount's), its leader-election Lease in `lease_namespace`.
    pub fn start_as(
        cp: &ControlPlane,
        kubeconfig: &Path,
        lease_namespace: &str,
        name: &str,
        cloud: &[&str],
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Agent {
        let port = free_port();
        let address = format!("127.0.0.1:{port}");
        let log = cp.dir().join("logs").join(format!("agent-{name}.log"));
        let file = std::fs::File::create(&log).expect("agent log");
        // `TAILOR_E2E_BIN` runs the agent from another build (e.g. the optimised one the
        // benchmarks build), to measure its latencies as users run it.
        let binary = std::env::var_os("TAILOR_E2E_BIN")
            .filter(|b| !b.is_empty())
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_tailor").into());
        let child = Command::new(binary)
            .arg("run")
            .arg("--kubeconfig")
            .arg(kubeconfig)
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

    /// Waits until `/readyz` answers 200.
    pub async fn wait_ready(&self) {
        let url = format!("{}/readyz", self.url);
        eventually(Duration::from_secs(60), "the agent's /readyz", || async {
            let r = reqwest::get(&url).await.ok()?;
            r.status().is_success().then_some(())
        })
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

/// A free loopback TCP port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}
