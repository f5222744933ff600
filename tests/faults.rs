//! The agent under an unlucky operator's faults, on the real control plane: a Prometheus
//! URL carrying a password, an API server that refuses, never answers or refuses the
//! credentials, and a `KUBECONFIG` of several files. Each fault is bounded in time and
//! stays on loopback.

#[path = "support/control_plane.rs"]
#[allow(dead_code)] // shared with tests/agent.rs, which uses all of it
mod control_plane;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use control_plane::{Agent, ControlPlane, eventually, free_port};

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
    eventually(Duration::from_secs(60), "the agent leads", || async {
        agent
            .metrics()
            .await
            .lines()
            .any(|l| l.starts_with("tailor_leader") && l.trim_end().ends_with(" 1"))
            .then_some(())
    })
    .await;
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
            && condition.message.contains("recommend-only"),
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
