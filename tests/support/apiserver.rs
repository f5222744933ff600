//! A fake Kubernetes API server for tests, speaking the real wire format over HTTP on a
//! loopback port, so the real `kube` client (and the `tailor` binary, through a
//! kubeconfig) can talk to it. It serves list requests for the built-in kinds Tailor
//! reads and, when installed, Tailor's CRDs: paged with `limit` and `continue`, items
//! without `kind`/`apiVersion` as a real server sends them, `Status` bodies for 404 and
//! 403. It records every request path for assertions.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// What the fake serves and how.
#[derive(Default)]
pub struct Fake {
    /// Objects, each with apiVersion, kind and metadata.
    pub objects: Vec<Value>,
    /// Most items per page, whatever the client asks for (0: no cap).
    pub page_size: usize,
    /// Whether Tailor's CRDs are installed.
    pub crds: bool,
    /// Plurals whose list is forbidden.
    pub forbidden: BTreeSet<String>,
    /// Every request's path and query, in order.
    pub requests: Vec<String>,
}

/// A running fake API server.
pub struct FakeApiServer {
    /// Base URL, `http://127.0.0.1:PORT`.
    pub url: String,
    /// The served state (objects, settings and the request log).
    pub state: Arc<Mutex<Fake>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeApiServer {
    /// Starts serving `fake` on a free loopback port.
    pub async fn start(fake: Fake) -> FakeApiServer {
        let state = Arc::new(Mutex::new(fake));
        let app = Router::new().fallback(handle).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let url = format!("http://{}", listener.local_addr().expect("bound address"));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeApiServer { url, state, task }
    }

    /// A kubeconfig file for this server in `dir`.
    pub fn kubeconfig(&self, dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\nclusters:\n- name: fake\n  cluster: {{server: \"{}\"}}\nusers:\n- name: fake\n  user: {{token: test-token}}\ncontexts:\n- name: fake\n  context: {{cluster: fake, user: fake}}\n",
            self.url
        );
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    /// The request paths seen so far.
    pub fn requests(&self) -> Vec<String> {
        self.state.lock().expect("not poisoned").requests.clone()
    }
}

/// Objects from multi-document YAML.
pub fn objects_from_yaml(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|d| serde::Deserialize::deserialize(d).expect("valid YAML"))
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// The resources a real cluster serves: (group/version, plural, kind, namespaced).
const BUILT_IN: &[(&str, &str, &str, bool)] = &[
    ("v1", "pods", "Pod", true),
    ("v1", "nodes", "Node", false),
    ("apps/v1", "deployments", "Deployment", true),
    ("apps/v1", "statefulsets", "StatefulSet", true),
    ("apps/v1", "daemonsets", "DaemonSet", true),
    ("apps/v1", "replicasets", "ReplicaSet", true),
    ("batch/v1", "jobs", "Job", true),
    (
        "autoscaling/v2",
        "horizontalpodautoscalers",
        "HorizontalPodAutoscaler",
        true,
    ),
    (
        "policy/v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        true,
    ),
];

/// Tailor's CRDs.
const CRDS: &[(&str, &str, &str, bool)] = &[
    ("tailor.sh/v1alpha1", "nodepools", "NodePool", false),
    ("tailor.sh/v1alpha1", "nodeclaims", "NodeClaim", false),
    (
        "tailor.sh/v1alpha1",
        "aksnodeclasses",
        "AKSNodeClass",
        false,
    ),
    (
        "tailor.sh/v1alpha1",
        "rightsizingpolicies",
        "RightsizingPolicy",
        true,
    ),
    (
        "tailor.sh/v1alpha1",
        "recommendations",
        "Recommendation",
        true,
    ),
];

fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    (code, axum::Json(body)).into_response()
}

async fn handle(State(state): State<Arc<Mutex<Fake>>>, uri: Uri) -> Response {
    let mut fake = state.lock().expect("not poisoned");
    fake.requests.push(uri.to_string());
    let path = uri.path().trim_matches('/');
    let parts: Vec<&str> = path.split('/').collect();
    // /api/v1/... or /apis/GROUP/VERSION/...
    let (group_version, rest) = match parts.as_slice() {
        ["api", v, rest @ ..] => (v.to_string(), rest),
        ["apis", g, v, rest @ ..] => (format!("{g}/{v}"), rest),
        _ => return not_found(),
    };
    let (namespace, plural) = match rest {
        ["namespaces", ns, plural] => (Some(ns.to_string()), plural.to_string()),
        [plural] => (None, plural.to_string()),
        _ => return not_found(),
    };
    let served: Vec<&(&str, &str, &str, bool)> = BUILT_IN
        .iter()
        .chain(CRDS.iter().filter(|_| fake.crds))
        .collect();
    let Some(&&(_, _, kind, namespaced)) = served
        .iter()
        .find(|(gv, p, _, _)| *gv == group_version && *p == plural)
    else {
        return not_found();
    };
    if namespace.is_some() && !namespaced {
        return not_found();
    }
    if fake.forbidden.contains(&plural) {
        let scope = match &namespace {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".to_string(),
        };
        let group = group_version.rsplit_once('/').map_or("", |(g, _)| g);
        return status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!(
                "{plural} is forbidden: User \"system:serviceaccount:tailor:tailor\" cannot list resource \"{plural}\" in API group \"{group}\" {scope}"
            ),
        );
    }
    let mut limit = 0usize;
    let mut offset = 0usize;
    for pair in uri.query().unwrap_or("").split('&') {
        match pair.split_once('=') {
            Some(("limit", v)) => limit = v.parse().unwrap_or(0),
            Some(("continue", v)) => offset = v.parse().unwrap_or(0),
            _ => {}
        }
    }
    if fake.page_size > 0 {
        limit = if limit == 0 {
            fake.page_size
        } else {
            limit.min(fake.page_size)
        };
    }
    let matching: Vec<Value> = fake
        .objects
        .iter()
        .filter(|o| o["kind"] == kind && o["apiVersion"] == group_version.as_str())
        .filter(|o| {
            namespace
                .as_deref()
                .is_none_or(|ns| o["metadata"]["namespace"].as_str().unwrap_or("default") == ns)
        })
        .cloned()
        .collect();
    let end = if limit == 0 {
        matching.len()
    } else {
        (offset + limit).min(matching.len())
    };
    let items: Vec<Value> = matching[offset.min(end)..end]
        .iter()
        .map(|o| {
            // A real server leaves kind and apiVersion off list items.
            let mut item = o.clone();
            if let Some(m) = item.as_object_mut() {
                m.remove("kind");
                m.remove("apiVersion");
            }
            item
        })
        .collect();
    let mut metadata = json!({"resourceVersion": "1"});
    if end < matching.len() {
        metadata["continue"] = json!(end.to_string());
    }
    axum::Json(json!({
        "kind": format!("{kind}List"),
        "apiVersion": group_version,
        "metadata": metadata,
        "items": items,
    }))
    .into_response()
}

fn not_found() -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        "the server could not find the requested resource".to_string(),
    )
}
