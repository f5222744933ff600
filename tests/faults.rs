//! The agent under an unlucky operator's faults, on the real control plane: a Prometheus
//! URL carrying a password, an API server that refuses, never answers or refuses the
//! credentials, and a `KUBECONFIG` of several files. Each fault is bounded in time and
//! stays on loopback.

#[path = "support/control_plane.rs"]
#[allow(dead_code)] // shared with tests/agent.rs, which uses all of it
mod control_plane;
#[path = "support/hostile_prometheus.rs"]
mod hostile_prometheus;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use control_plane::{
    Agent, ControlPlane, chart_memory_limit_mib, eventually, free_port, metric_value,
};

/// Waits up to `secs` for the agent to exit by itself; returns its log.
async fn exit_log(agent: &mut Agent, secs: u64) -> String {
    let started = Instant::now();
    while !agent.exited() {
        assert!(
            started.elapsed() < Duration::from_secs(secs),
            "the agent did not stop within {secs} s:\n{}",
            agent.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    agent.log()
}

/// The admin kubeconfig with `edit` applied to it, written to `dir/name`.
fn kubeconfig_with(
    cp: &ControlPlane,
    dir: &Path,
    name: &str,
    edit: impl FnOnce(&mut serde_yaml::Value),
) -> PathBuf {
    let text = std::fs::read_to_string(&cp.kubeconfig).expect("admin kubeconfig");
    let mut config: serde_yaml::Value = serde_yaml::from_str(&text).expect("kubeconfig parses");
    edit(&mut config);
    let path = dir.join(name);
    std::fs::write(
        &path,
        serde_yaml::to_string(&config).expect("kubeconfig writes"),
    )
    .expect("write kubeconfig");
    path
}

fn set_server(config: &mut serde_yaml::Value, server: &str) {
    config["clusters"][0]["cluster"]["server"] = server.into();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_errors_name_the_api_server_and_the_cause() {
    let cp = ControlPlane::start().await;
    let dir = tempfile::tempdir().expect("temp dir");

    // Nothing listens: refused.
    let refused = format!("https://127.0.0.1:{}", free_port());
    let file = kubeconfig_with(&cp, dir.path(), "refused", |c| set_server(c, &refused));
    let mut agent = Agent::start_as(
        &cp,
        &file,
        "default",
        "refused",
        &["--cloud", "kwok"],
        &[],
        &[],
    );
    let log = exit_log(&mut agent, 30).await;
    assert!(
        log.contains(&format!("API server {refused}: connection refused")),
        "{log}"
    );

    // A listener that takes the connection and never answers: timed out, within the
    // agent's first-request timeout (10 s) and not the client's default of minutes.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let silent_url = format!("https://{}", silent.local_addr().expect("address"));
    let file = kubeconfig_with(&cp, dir.path(), "silent", |c| set_server(c, &silent_url));
    let started = Instant::now();
    let mut agent = Agent::start_as(
        &cp,
        &file,
        "default",
        "silent",
        &["--cloud", "kwok"],
        &[],
        &[],
    );
    let log = exit_log(&mut agent, 40).await;
    assert!(
        log.contains(&format!("API server {silent_url}: timed out")),
        "{log}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    drop(silent);

    // The real API server, credentials it does not know: 401, named as such.
    let file = kubeconfig_with(&cp, dir.path(), "stranger", |c| {
        c["users"][0]["user"] = serde_yaml::from_str("{token: not-a-token}").expect("user");
    });
    let mut agent = Agent::start_as(
        &cp,
        &file,
        "default",
        "stranger",
        &["--cloud", "kwok"],
        &[],
        &[],
    );
    let log = exit_log(&mut agent, 30).await;
    let server = serde_yaml::from_str::<serde_yaml::Value>(
        &std::fs::read_to_string(&cp.kubeconfig).expect("kubeconfig"),
    )
    .expect("parses")["clusters"][0]["cluster"]["server"]
        .as_str()
        .expect("server")
        .trim_end_matches('/')
        .to_string();
    assert!(
        log.contains(&format!(
            "API server {server}: the credentials were refused (401 Unauthorized)"
        )),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubeconfig_of_several_files_is_merged_as_kubectl_does() {
    let cp = ControlPlane::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    // The cluster and context in one file, the user they name in another: neither works
    // alone.
    let clusters = kubeconfig_with(&cp, dir.path(), "clusters", |c| {
        c["users"] = serde_yaml::Value::Sequence(Vec::new());
    });
    let users = kubeconfig_with(&cp, dir.path(), "users", |c| {
        let users = c["users"].clone();
        *c = serde_yaml::from_str("{apiVersion: v1, kind: Config}").expect("config");
        c["users"] = users;
    });
    let paths = format!("{}:{}", clusters.display(), users.display());
    let home = tempfile::tempdir().expect("home");
    let home_dir = home.path().display().to_string();
    let agent = Agent::start_as(
        &cp,
        Path::new(""),
        "default",
        "merged",
        &["--cloud", "kwok"],
        &[],
        &[("KUBECONFIG", paths.as_str()), ("HOME", home_dir.as_str())],
    );
    agent.wait_ready().await;
    agent.wait_leading(60).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_in_the_prometheus_url_never_reaches_the_log_or_metrics() {
    let cp = ControlPlane::start().await;
    cp.apply_yaml(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: redact}\n---\n\
         apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: redact}\n\
         spec:\n  replicas: 1\n  selector: {matchLabels: {app: web}}\n  template:\n    \
         metadata: {labels: {app: web}}\n    spec:\n      containers:\n      - name: c\n        \
         image: i\n        resources: {requests: {cpu: 100m, memory: 64Mi}}\n",
    )
    .await;
    // Nothing listens there: every request fails and is retried, and each retry is logged.
    let url = format!("http://rt:s3cr3t-pass@127.0.0.1:{}", free_port());
    let agent = Agent::start(&cp, "redact", &["--prometheus-url", &url]);
    agent.wait_ready().await;
    eventually(
        Duration::from_secs(90),
        "a logged Prometheus retry",
        || async {
            let log = agent.log();
            log.contains("prometheus request failed; retrying")
                .then_some(())
        },
    )
    .await;
    let log = agent.log();
    assert!(
        !log.contains("s3cr3t-pass"),
        "the password is in the log:\n{log}"
    );
    assert!(log.contains("http://***:***@127.0.0.1:"), "{log}");
    assert!(!agent.metrics().await.contains("s3cr3t-pass"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mistyped_mode_is_named_on_the_nodepool_and_the_pool_stays_recommend_only() {
    use k8s_openapi::api::core::v1::Event;
    use kube::api::{Api, Patch, PatchParams};
    use tailor::apis::{NodeClaim, NodePool};

    let cp = ControlPlane::start().await;
    cp.apply_yaml(
        r#"
apiVersion: tailor.sh/v1alpha1
kind: AKSNodeClass
metadata: {name: default}
spec: {imageFamily: AzureLinux, maxPods: 110}
---
apiVersion: tailor.sh/v1alpha1
kind: NodePool
metadata:
  name: default
  annotations: {tailor.sh/mode: Autonomous}
spec:
  template:
    spec:
      requirements:
      - {key: tailor.sh/sku-family, operator: In, values: [D]}
      - {key: tailor.sh/capacity-type, operator: In, values: [on-demand]}
      nodeClassRef: {group: tailor.sh, kind: AKSNodeClass, name: default}
  disruption: {consolidateAfter: 10m}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - {name: c, image: i, resources: {requests: {cpu: 500m, memory: 1Gi}}}
"#,
    )
    .await;
    // Recommend-only globally: the pool's own (mistyped) annotation is all that could
    // make it act.
    let agent = Agent::start(&cp, "mode", &["--mode", "recommend"]);
    agent.wait_ready().await;
    let pools: Api<NodePool> = Api::all(cp.client.clone());
    let condition = eventually(
        Duration::from_secs(60),
        "ValidationSucceeded=False on the NodePool",
        || async {
            let pool = pools.get("default").await.ok()?;
            pool.status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "ValidationSucceeded" && c.status == "False")
        },
    )
    .await;
    assert_eq!(condition.reason, "InvalidMode");
    assert!(
        condition.message.contains("tailor.sh/mode: \"Autonomous\"")
            && condition.message.contains("recommend-only")
            && condition.message.contains("docs/configuration.md#modes"),
        "{}",
        condition.message
    );
    let events: Api<Event> = Api::namespaced(cp.client.clone(), "default");
    eventually(
        Duration::from_secs(60),
        "InvalidMode and WouldProvision Events on the NodePool",
        || async {
            let reasons: Vec<String> = control_plane::list(&events)
                .await
                .into_iter()
                .filter(|e| e.involved_object.kind.as_deref() == Some("NodePool"))
                .filter_map(|e| e.reason)
                .collect();
            (reasons.iter().any(|r| r == "InvalidMode")
                && reasons.iter().any(|r| r == "WouldProvision"))
            .then_some(())
        },
    )
    .await;
    assert!(agent.log().contains("\"Autonomous\" is neither"));
    let claims: Api<NodeClaim> = Api::all(cp.client.clone());
    assert!(control_plane::list(&claims).await.is_empty());

    // Written right, the pool acts, and the condition says it is valid again.
    pools
        .patch(
            "default",
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"metadata": {"annotations": {"tailor.sh/mode": "autonomous"}}}),
            ),
        )
        .await
        .expect("annotate");
    eventually(Duration::from_secs(60), "a NodeClaim", || async {
        (!control_plane::list(&claims).await.is_empty()).then_some(())
    })
    .await;
    let pool = pools.get("default").await.expect("pool");
    let valid = pool
        .status
        .expect("status")
        .conditions
        .into_iter()
        .find(|c| c.type_ == "ValidationSucceeded")
        .expect("condition");
    assert_eq!(valid.status, "True", "{valid:?}");
}

/// The holder of Lease `name` in `default`, if any.
async fn holder(cp: &ControlPlane, name: &str) -> Option<String> {
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: kube::Api<Lease> = kube::Api::namespaced(cp.client.clone(), "default");
    leases
        .get_opt(name)
        .await
        .ok()
        .flatten()?
        .spec?
        .holder_identity
}

/// Two agents campaigning for Lease `lease`, named (and so identified) `<lease>-a` and
/// `<lease>-b`; waits until one leads and returns them with the leader first.
async fn two_agents(cp: &ControlPlane, lease: &str) -> [(String, Agent); 2] {
    let flags = ["--mode", "recommend", "--leader-election-name", lease];
    let start = |suffix: &str| {
        let name = format!("{lease}-{suffix}");
        let agent = Agent::start(cp, &name, &flags);
        (name, agent)
    };
    let (a, b) = (start("a"), start("b"));
    a.1.wait_ready().await;
    b.1.wait_ready().await;
    let a_first = eventually(Duration::from_secs(60), "one agent leads", || async {
        match (a.1.leads().await, b.1.leads().await) {
            (true, false) => Some(true),
            (false, true) => Some(false),
            _ => None,
        }
    })
    .await;
    if a_first { [a, b] } else { [b, a] }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_lease_is_taken_again_and_the_follower_leads_when_the_leader_dies() {
    use k8s_openapi::api::coordination::v1::Lease;
    let cp = ControlPlane::start().await;
    let lease = "faults-deleted";
    let mut agents = two_agents(&cp, lease).await;
    let leases: kube::Api<Lease> = kube::Api::namespaced(cp.client.clone(), "default");
    leases
        .delete(lease, &kube::api::DeleteParams::default())
        .await
        .expect("delete the Lease");
    // Created again and held by one replica, the only one that leads.
    let held_by = eventually(Duration::from_secs(30), "the Lease held again", || async {
        let h = holder(&cp, lease).await?;
        let [(a_name, a), (_, b)] = &agents;
        let (a_leads, b_leads) = (a.leads().await, b.leads().await);
        (a_leads != b_leads && (h == *a_name) == a_leads).then_some(h)
    })
    .await;
    // The holder dies: the other replica takes the Lease once it expires (4 s at the
    // tests' timer scale).
    let dead = agents
        .iter()
        .position(|(n, _)| *n == held_by)
        .expect("an agent holds it");
    agents[dead].1.kill();
    let (survivor_name, survivor) = &agents[1 - dead];
    eventually(
        Duration::from_secs(30),
        "the survivor leads and holds the Lease",
        || async {
            (survivor.leads().await && holder(&cp, lease).await.as_deref() == Some(survivor_name))
                .then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sigterm_the_leader_releases_the_lease_and_the_follower_takes_it_within_two_seconds() {
    let cp = ControlPlane::start().await;
    let lease = "faults-sigterm";
    let [(was, leader), (_, follower)] = two_agents(&cp, lease).await;
    assert_eq!(holder(&cp, lease).await.as_deref(), Some(was.as_str()));
    // SAFETY: sends SIGTERM to a child process this test started and still owns.
    unsafe { libc::kill(leader.pid() as libc::pid_t, libc::SIGTERM) };
    let started = Instant::now();
    eventually(Duration::from_secs(20), "the follower leads", || async {
        follower.leads().await.then_some(())
    })
    .await;
    let handover = started.elapsed();
    let now = holder(&cp, lease).await.expect("held");
    assert_ne!(now, was, "the Lease changed hands");
    println!("hand-over after SIGTERM: {:.2} s", handover.as_secs_f64());
    // Without a release the follower would wait out the Lease (4 s here, 15 s in production).
    assert!(handover < Duration::from_secs(2), "{handover:?}");
    drop(leader);
}

/// A loopback TCP proxy to the API server that can be cut: while cut it refuses new
/// connections and has dropped the open ones.
struct Proxy {
    address: String,
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
    connections: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    listener: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        let open = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let connections = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (o, c) = (open.clone(), connections.clone());
        let listener = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !o.load(Ordering::SeqCst) {
                    continue; // dropped: the client sees the connection closed
                }
                let upstream = upstream.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                c.lock().expect("lock").push(task);
            }
        });
        Proxy {
            address,
            open,
            connections,
            listener,
        }
    }

    fn cut(&self) {
        self.open.store(false, std::sync::atomic::Ordering::SeqCst);
        for task in self.connections.lock().expect("lock").drain(..) {
            task.abort();
        }
    }

    fn restore(&self) {
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.listener.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_api_server_stops_leading_and_fails_liveness_until_it_is_back() {
    let cp = ControlPlane::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let text = std::fs::read_to_string(&cp.kubeconfig).expect("kubeconfig");
    let config: serde_yaml::Value = serde_yaml::from_str(&text).expect("parses");
    let server = config["clusters"][0]["cluster"]["server"]
        .as_str()
        .expect("server")
        .to_string();
    let upstream = server
        .trim_start_matches("https://")
        .trim_end_matches('/')
        .to_string();
    let proxy = Proxy::start(upstream).await;
    let file = kubeconfig_with(&cp, dir.path(), "proxied", |c| {
        set_server(c, &format!("https://{}", proxy.address));
    });
    let lease = "faults-cut";
    let agent = Agent::start_as(
        &cp,
        &file,
        "default",
        "cut",
        &["--cloud", "kwok"],
        &["--mode", "recommend", "--leader-election-name", lease],
        &[],
    );
    agent.wait_ready().await;
    agent.wait_leading(60).await;
    let healthz = format!("{}/healthz", agent.url);
    assert!(
        reqwest::get(&healthz)
            .await
            .expect("healthz")
            .status()
            .is_success()
    );

    proxy.cut();
    // It cannot renew: it stops leading within the renew deadline (2 s here), and liveness
    // fails once no Lease request has succeeded for the deadline and a Lease duration.
    eventually(
        Duration::from_secs(20),
        "the agent stops leading",
        || async { (!agent.leads().await).then_some(()) },
    )
    .await;
    let reason = eventually(Duration::from_secs(30), "/healthz fails", || async {
        let answer = reqwest::get(&healthz).await.ok()?;
        (answer.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE).then_some(())?;
        answer.text().await.ok()
    })
    .await;
    assert!(
        reason.contains("leader election") && reason.contains(lease),
        "{reason}"
    );

    proxy.restore();
    eventually(
        Duration::from_secs(60),
        "the agent leads and is live again",
        || async {
            let live = reqwest::get(&healthz).await.ok()?.status().is_success();
            (live && agent.leads().await).then_some(())
        },
    )
    .await;
}

/// A node class and an on-demand D-family NodePool that consolidates only after 10 minutes.
const POOL: &str = r#"
apiVersion: tailor.sh/v1alpha1
kind: AKSNodeClass
metadata: {name: default}
spec: {imageFamily: AzureLinux, maxPods: 110}
---
apiVersion: tailor.sh/v1alpha1
kind: NodePool
metadata: {name: default}
spec:
  template:
    spec:
      requirements:
      - {key: tailor.sh/sku-family, operator: In, values: [D]}
      - {key: tailor.sh/capacity-type, operator: In, values: [on-demand]}
      nodeClassRef: {group: tailor.sh, kind: AKSNodeClass, name: default}
  disruption: {consolidateAfter: 10m}
"#;

/// How a flooding client holds a connection: silent, or with a request it never finishes.
#[derive(Clone, Copy, Debug)]
enum Hold {
    /// Connects and sends nothing (no request, or no TLS ClientHello).
    Idle,
    /// Sends the start of an HTTP request and never its end.
    HalfRequest,
    /// Sends the header of a TLS record announcing a ClientHello and never the rest.
    HalfHandshake,
}

/// What a flood saw: connections the server closed, and the longest any stayed open
/// (those still open at the end count with their age then).
#[derive(Debug, Default)]
struct Flood {
    closed_by_server: usize,
    longest_open: Duration,
}

/// Keeps `n` connections from `from` to `to` held as `hold`, opening a new one whenever
/// the server closes one, until `stop` is set.
async fn flood(
    from: &'static str,
    to: std::net::SocketAddr,
    hold: Hold,
    n: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Flood {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut holders = tokio::task::JoinSet::new();
    for _ in 0..n {
        let stop = stop.clone();
        holders.spawn(async move {
            let mut seen = Flood::default();
            while !stop.load(Ordering::Relaxed) {
                let socket = tokio::net::TcpSocket::new_v4().expect("socket");
                socket
                    .bind(format!("{from}:0").parse().expect("address"))
                    .expect("bind");
                let Ok(mut stream) = socket.connect(to).await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let opened = Instant::now();
                let start: &[u8] = match hold {
                    Hold::Idle => b"",
                    Hold::HalfRequest => b"GET /metrics HTTP/1.1\r\nHost: tailor\r\n",
                    Hold::HalfHandshake => &[0x16, 0x03, 0x01, 0x02, 0x00],
                };
                let _ = stream.write_all(start).await;
                let mut buf = [0u8; 512];
                loop {
                    tokio::select! {
                        read = stream.read(&mut buf) => match read {
                            Ok(0) | Err(_) => {
                                seen.closed_by_server += 1;
                                break;
                            }
                            Ok(_) => {}
                        },
                        () = tokio::time::sleep(Duration::from_millis(100)) => {
                            if stop.load(Ordering::Relaxed) {
                                break;
                            }
                        }
                    }
                }
                seen.longest_open = seen.longest_open.max(opened.elapsed());
                // A bounded flood: each holder opens at most four connections a second.
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            seen
        });
    }
    let mut total = Flood::default();
    while let Some(seen) = holders.join_next().await {
        let seen = seen.expect("holder");
        total.closed_by_server += seen.closed_by_server;
        total.longest_open = total.longest_open.max(seen.longest_open);
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_on_every_listener_is_shed_and_the_agent_keeps_provisioning() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tailor::apis::NodeClaim;

    let cp = ControlPlane::start().await;
    cp.apply_yaml(POOL).await;
    let webhook = format!("127.0.0.1:{}", free_port());
    // 256 descriptors, as a tight container limit: 800 flooding connections would take
    // them all if the listeners accepted and held every one.
    let agent = Agent::start_with_open_files(
        &cp,
        "flood",
        &[
            "--mode",
            "autonomous",
            "--webhook-address",
            &webhook,
            "--webhook-url",
            &format!("https://{webhook}/mutate-pods"),
        ],
        256,
    );
    agent.wait_ready().await;
    agent.wait_leading(60).await;
    let metrics_address: std::net::SocketAddr = agent
        .url
        .trim_start_matches("http://")
        .parse()
        .expect("agent address");
    let webhook_address: std::net::SocketAddr = webhook.parse().expect("webhook address");

    // Two other clients (two source addresses on loopback), 200 connections each way.
    let stop = Arc::new(AtomicBool::new(false));
    let floods = [
        ("127.0.0.2", metrics_address, Hold::Idle),
        ("127.0.0.2", metrics_address, Hold::HalfRequest),
        ("127.0.0.3", webhook_address, Hold::Idle),
        ("127.0.0.3", webhook_address, Hold::HalfHandshake),
    ]
    .map(|(from, to, hold)| tokio::spawn(flood(from, to, hold, 200, stop.clone())));
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Under the flood, health answers at once and a new pod gets a node.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("client");
    for _ in 0..5 {
        let health = client
            .get(format!("{}/healthz", agent.url))
            .send()
            .await
            .expect("/healthz answers under the flood");
        assert_eq!(health.status(), 200);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    cp.apply_yaml(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: default}\n\
         spec:\n  replicas: 2\n  selector: {matchLabels: {app: web}}\n  template:\n    \
         metadata: {labels: {app: web}}\n    spec:\n      containers:\n      - name: c\n        \
         image: i\n        resources: {requests: {cpu: 500m, memory: 1Gi}}\n",
    )
    .await;
    let claims: kube::Api<NodeClaim> = kube::Api::all(cp.client.clone());
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(cp.client.clone(), "default");
    eventually(
        Duration::from_secs(60),
        "a NodeClaim launched and the pods bound under the flood",
        || async {
            let launched = control_plane::list(&claims).await.into_iter().any(|c| {
                c.status
                    .as_ref()
                    .is_some_and(|s| s.provider_id.as_deref().is_some_and(|p| !p.is_empty()))
            });
            let bound = control_plane::list(&pods)
                .await
                .iter()
                .filter(|p| {
                    p.spec
                        .as_ref()
                        .and_then(|s| s.node_name.as_deref())
                        .is_some_and(|n| !n.is_empty())
                })
                .count();
            (launched && bound == 2).then_some(())
        },
    )
    .await;

    stop.store(true, Ordering::Relaxed);
    let mut seen = Vec::new();
    for f in floods {
        seen.push(f.await.expect("flood"));
    }
    // Every flooding connection was closed by the agent: at accept when the listener was
    // full, or at the (scaled) 2 s header or handshake timeout; none lived much longer.
    for (s, what) in seen.iter().zip([
        "idle HTTP",
        "half-sent HTTP request",
        "idle TLS",
        "half-sent TLS handshake",
    ]) {
        assert!(s.closed_by_server >= 200, "{what}: {s:?}");
        assert!(s.longest_open < Duration::from_secs(5), "{what}: {s:?}");
    }
    let text = agent.metrics().await;
    let shed = |listener: &str, reason: &str| {
        metric_value(
            &text,
            &format!(
                "tailor_http_connections_shed_total{{listener=\"{listener}\",reason=\"{reason}\"}}"
            ),
        )
    };
    assert!(shed("metrics", "header_timeout") > 0.0, "{text}");
    assert!(shed("webhook", "handshake_timeout") > 0.0, "{text}");
    assert!(
        shed("metrics", "limit") + shed("metrics", "client_limit") > 0.0,
        "{text}"
    );
    assert!(agent.log().lines().all(|l| !l.contains("panicked")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_prometheus_answers_keep_the_agent_under_the_charts_memory_limit() {
    use tailor::apis::NodeClaim;

    let cp = ControlPlane::start().await;
    cp.apply_yaml(POOL).await;
    cp.apply_yaml(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: hostile}\n---\n\
         apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: hostile}\n\
         spec:\n  replicas: 1\n  selector: {matchLabels: {app: web}}\n  template:\n    \
         metadata: {labels: {app: web}}\n    spec:\n      containers:\n      - name: c\n        \
         image: i\n        resources: {requests: {cpu: 100m, memory: 64Mi}}\n",
    )
    .await;
    // 362 containers: the two weeks of CPU are read as four queries of 181 containers, all
    // in flight at once. Each is answered with 240 series (what a query of 181 may hold)
    // of 10,999 samples, each padded with a label to the most a series of 10,999 steps may
    // take: about 180 MB an answer, 720 MB at once.
    let server = hostile_prometheus::start(hostile_prometheus::Shape {
        containers: 362,
        series: 240,
        pad_bytes: None,
    })
    .await;
    let agent = Agent::start(
        &cp,
        "hostile",
        &["--mode", "autonomous", "--prometheus-url", &server.url],
    );
    agent.wait_ready().await;
    let limit = chart_memory_limit_mib();
    // The read takes every answer, or refuses one; meanwhile provisioning goes on.
    cp.apply_yaml(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: default}\n\
         spec:\n  replicas: 1\n  selector: {matchLabels: {app: web}}\n  template:\n    \
         metadata: {labels: {app: web}}\n    spec:\n      containers:\n      - name: c\n        \
         image: i\n        resources: {requests: {cpu: 500m, memory: 1Gi}}\n",
    )
    .await;
    let claims: kube::Api<NodeClaim> = kube::Api::all(cp.client.clone());
    let started = Instant::now();
    eventually(
        Duration::from_secs(120),
        "a NodeClaim for the new pod while the answers stream",
        || async { (!control_plane::list(&claims).await.is_empty()).then_some(()) },
    )
    .await;
    let claim_after = started.elapsed();
    // The read ends: every answer is within its query's limits, so it succeeds.
    let queries = eventually(Duration::from_secs(300), "the usage read done", || async {
        let text = agent.metrics().await;
        assert_eq!(
            metric_value(&text, "tailor_usage_read_failures_total"),
            0.0,
            "the read failed:\n{}",
            agent.log_tail(5)
        );
        let queries = metric_value(&text, "tailor_usage_queries_total");
        (queries > 0.0).then_some(queries)
    })
    .await;
    assert!(queries >= 4.0 + 3.0, "{queries} queries");
    let served = server
        .range_bytes
        .load(std::sync::atomic::Ordering::Relaxed) as f64
        / 1048576.0;
    let peak = agent.peak_memory_mib();
    eprintln!(
        "hostile Prometheus: {served:.0} MiB of range answers read; agent peak {peak:.0} MiB \
         (chart limit {limit:.0} MiB); first NodeClaim {:.1} s after the pod",
        claim_after.as_secs_f64()
    );
    // Every answer was read to its end, and together they were larger than the limit.
    let answers = server
        .range_answers
        .load(std::sync::atomic::Ordering::Relaxed) as f64;
    assert!(
        answers + 1.0 >= queries,
        "{answers} answers of {queries} queries"
    );
    assert!(
        served > limit,
        "the answers were not hostile: {served:.0} MiB"
    );
    assert!(
        peak < limit,
        "the agent peaked at {peak:.0} MiB, over the chart's {limit:.0} MiB limit"
    );
    assert!(agent.log().lines().all(|l| !l.contains("panicked")));
}
