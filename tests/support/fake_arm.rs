//! A fake Azure Resource Manager on a loopback port, for the Azure provider's tests: the
//! real azure_mgmt_compute / azure_core / azure_identity clients talk to it over HTTP.
//!
//! Bodies are built from Microsoft's published examples and observed bodies in
//! `../shared/data/azure/arm/` (never copied into the repository). It speaks the ARM
//! long-running-operation protocol as Compute does (PUT VM → 201 + `Azure-AsyncOperation`;
//! DELETE → 202 + `Location` and `Azure-AsyncOperation`; NIC DELETE → 202 + `Location`),
//! pages VM and NIC lists, Resource SKUs and Retail Prices with links on its own base
//! URL, issues AAD tokens for workload identity and IMDS tokens for managed identities,
//! and injects faults on demand.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// The shared fixture directory.
pub fn arm_data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data/azure/arm")
}

/// A fixture as JSON.
pub fn fixture(path: &str) -> Value {
    let p = arm_data().join(path);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

const SPECS: &str = "azure-rest-api-specs/specification";

/// Which requests a fault applies to.
#[derive(Debug, Clone, Default)]
pub struct Match {
    /// HTTP method (`PUT`), any when empty.
    pub method: String,
    /// `virtualMachines`, `networkInterfaces`, `skus`, `prices`, `operations`; any when empty.
    pub kind: String,
    /// VM size in the PUT body.
    pub size: Option<String>,
    /// ARM zone number in the PUT body (`"1"`).
    pub zone: Option<String>,
    /// Priority in the PUT body (`Spot`, `Regular`).
    pub priority: Option<String>,
}

/// What goes wrong.
#[derive(Debug, Clone)]
pub enum FaultKind {
    /// Answer with this status, body and headers instead.
    Status {
        /// HTTP status.
        status: u16,
        /// Body.
        body: Value,
        /// Extra headers.
        headers: Vec<(String, String)>,
    },
    /// Accept the PUT; the operation then fails with this error.
    AsyncFailure {
        /// The operation body (status Failed + error).
        body: Value,
    },
    /// Answer after this delay.
    Slow(Duration),
    /// The operation never finishes.
    NeverFinish,
}

/// A fault, applied `times` times (`u32::MAX`: always).
#[derive(Debug, Clone)]
pub struct Fault {
    /// Which requests.
    pub on: Match,
    /// What happens.
    pub kind: FaultKind,
    /// How many more times.
    pub times: u32,
}

/// One logged request.
#[derive(Debug, Clone)]
pub struct Logged {
    /// Method.
    pub method: String,
    /// Path.
    pub path: String,
    /// Query.
    pub query: String,
    /// JSON body, or `Null`.
    pub body: Value,
    /// When it arrived.
    pub at: Instant,
    /// The status answered.
    pub status: u16,
}

/// A token the fake issued, by AAD (workload identity) or IMDS (managed identity).
#[derive(Debug, Clone)]
pub struct Issued {
    /// The access token (`fake-token-N`).
    pub token: String,
    /// The v2 scope (AAD) or v1 resource (IMDS) it was issued for.
    pub audience: String,
    /// Who asked: `workload`, `imds:system`, or `imds:client_id=...` and the like.
    pub via: String,
    /// When it was issued.
    pub at: Instant,
    /// Its lifetime in seconds.
    pub lifetime: u64,
}

impl Issued {
    /// Whether the token is still valid now.
    pub fn valid(&self) -> bool {
        self.at.elapsed() < Duration::from_secs(self.lifetime)
    }
}

/// A user-assigned managed identity attached to the fake's VM, as IMDS knows it.
#[derive(Debug, Clone)]
pub struct UserIdentity {
    /// Client (application) ID.
    pub client_id: String,
    /// Object (principal) ID.
    pub object_id: String,
    /// ARM resource ID.
    pub resource_id: String,
}

/// What an operation changes when it ends.
#[derive(Debug, Clone)]
pub enum OpTarget {
    /// Creating a VM.
    CreateVm(String),
    /// Deleting a VM.
    DeleteVm(String),
    /// Deleting a NIC.
    DeleteNic(String),
}

/// A long-running operation.
#[derive(Debug, Clone)]
pub struct Op {
    target: OpTarget,
    polls_left: u32,
    failure: Option<Value>,
    never: bool,
    done: bool,
}

/// Called with a created VM and its custom data (base64).
pub type VmCreated = Arc<dyn Fn(&Value, &str) + Send + Sync>;
/// Called with a deleted VM's name.
pub type VmDeleted = Arc<dyn Fn(&str) + Send + Sync>;

/// The fake's state.
pub struct Arm {
    /// Base URL, set at start.
    pub base: String,
    /// VMs by name.
    pub vms: BTreeMap<String, Value>,
    /// NICs by name.
    pub nics: BTreeMap<String, Value>,
    /// Long-running operations by ID.
    pub ops: BTreeMap<String, Op>,
    /// The next ID handed out.
    pub next_id: u64,
    /// Every request.
    pub requests: Vec<Logged>,
    /// Pending faults.
    pub faults: Vec<Fault>,
    /// InProgress answers before an operation ends.
    pub polls_in_progress: u32,
    /// `Retry-After` seconds on accepted operations and their polls.
    pub retry_after: Option<u64>,
    /// Items per page of every list.
    pub page_size: usize,
    /// Resource SKUs served.
    pub skus: Vec<Value>,
    /// Retail price items served.
    pub prices: Vec<Value>,
    /// `expires_in` of issued tokens.
    pub token_lifetime: u64,
    /// Client assertions presented to the token endpoint, in order.
    pub assertions: Vec<String>,
    /// Every token issued, by either endpoint, in order.
    pub issued: Vec<Issued>,
    /// Whether IMDS issues tokens for a system-assigned identity.
    pub imds_system_assigned: bool,
    /// User-assigned identities IMDS issues tokens for.
    pub imds_user_assigned: Vec<UserIdentity>,
    /// Called with each VM whose create operation succeeded, and the custom data it was
    /// created with (base64), as a booting VM would use it.
    pub on_vm_created: Option<VmCreated>,
    /// Custom data of each VM (ARM keeps it but never returns it).
    pub custom_data: BTreeMap<String, String>,
    /// Called with each VM name deleted.
    pub on_vm_deleted: Option<VmDeleted>,
}

impl Default for Arm {
    fn default() -> Self {
        Arm {
            base: String::new(),
            vms: BTreeMap::new(),
            nics: BTreeMap::new(),
            ops: BTreeMap::new(),
            next_id: 1,
            requests: Vec::new(),
            faults: Vec::new(),
            polls_in_progress: 1,
            retry_after: Some(1),
            page_size: 2,
            skus: default_skus(),
            prices: default_prices(),
            token_lifetime: 3600,
            assertions: Vec::new(),
            issued: Vec::new(),
            imds_system_assigned: true,
            imds_user_assigned: Vec::new(),
            on_vm_created: None,
            custom_data: BTreeMap::new(),
            on_vm_deleted: None,
        }
    }
}

impl Arm {
    /// Requests matching a method and a path fragment.
    pub fn count(&self, method: &str, fragment: &str) -> usize {
        self.requests
            .iter()
            .filter(|r| r.method == method && r.path.contains(fragment))
            .count()
    }

    /// PUT bodies sent for VMs, in order.
    pub fn vm_puts(&self) -> Vec<Value> {
        self.requests
            .iter()
            .filter(|r| r.method == "PUT" && r.path.contains("/virtualMachines/"))
            .map(|r| r.body.clone())
            .collect()
    }
}

/// The SKUs served by default: the real eastus listing from Azure/skewer, plus D2s_v3
/// and D8s_v3 made from its D4s_v3 entry (same family, other sizes).
pub fn default_skus() -> Vec<Value> {
    let listing = fixture("skewer/testdata/eastus.json");
    let mut skus: Vec<Value> = listing["value"].as_array().cloned().unwrap_or_default();
    let d4 = skus
        .iter()
        .find(|s| s["name"] == "Standard_D4s_v3")
        .cloned()
        .expect("D4s_v3 in the skewer listing");
    for (name, vcpus, mem) in [("Standard_D2s_v3", 2, 8), ("Standard_D8s_v3", 8, 32)] {
        let mut s = d4.clone();
        s["name"] = json!(name);
        s["size"] = json!(name.trim_start_matches("Standard_"));
        for c in s["capabilities"].as_array_mut().expect("capabilities") {
            match c["name"].as_str() {
                Some("vCPUs") | Some("vCPUsAvailable") => c["value"] = json!(vcpus.to_string()),
                Some("MemoryGB") => c["value"] = json!(mem.to_string()),
                _ => {}
            }
        }
        skus.push(s);
    }
    skus
}

/// A Linux consumption price item in the published item shape.
pub fn price_item(arm_sku: &str, sku_name: &str, product: &str, meter: &str, price: f64) -> Value {
    let items = fixture("retail-prices/ms-learn-sample-items.json");
    let mut item = items[0].clone();
    item["armRegionName"] = json!("eastus");
    item["location"] = json!("US East");
    item["armSkuName"] = json!(arm_sku);
    item["skuName"] = json!(sku_name);
    item["productName"] = json!(product);
    item["meterName"] = json!(meter);
    item["retailPrice"] = json!(price);
    item["unitPrice"] = json!(price);
    item["type"] = json!("Consumption");
    item
}

/// Prices for the default SKUs (on-demand, spot, and Windows/Low Priority rows to skip).
/// Standard_D2_v2 has no price at all.
pub fn default_prices() -> Vec<Value> {
    let mut out = Vec::new();
    for (sku, short, od, spot) in [
        ("Standard_D2s_v3", "D2s v3", 0.096, 0.0192),
        ("Standard_D4s_v3", "D4s v3", 0.192, 0.0384),
        ("Standard_D8s_v3", "D8s v3", 0.384, 0.0768),
    ] {
        out.push(price_item(
            sku,
            short,
            "Virtual Machines DSv3 Series",
            short,
            od,
        ));
        out.push(price_item(
            sku,
            &format!("{short} Spot"),
            "Virtual Machines DSv3 Series",
            &format!("{short} Spot"),
            spot,
        ));
        out.push(price_item(
            sku,
            short,
            "Virtual Machines DSv3 Series Windows",
            short,
            od * 2.0,
        ));
        out.push(price_item(
            sku,
            &format!("{short} Low Priority"),
            "Virtual Machines DSv3 Series",
            &format!("{short} Low Priority"),
            od * 0.2,
        ));
    }
    out
}

/// A running fake ARM.
pub struct FakeArm {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// The state.
    pub state: Arc<Mutex<Arm>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeArm {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeArm {
    /// Starts serving `arm` on a free loopback port.
    pub async fn start(arm: Arm) -> FakeArm {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let state = Arc::new(Mutex::new(Arm {
            base: url.clone(),
            ..arm
        }));
        let app = Router::new().fallback(handle).with_state(state.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeArm { url, state, task }
    }

    /// Locks the state.
    pub fn arm(&self) -> std::sync::MutexGuard<'_, Arm> {
        self.state.lock().expect("fake arm state")
    }
}

fn json_response(status: u16, body: &Value, headers: &[(String, String)]) -> Response {
    let mut r = (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        if body.is_null() {
            String::new()
        } else {
            body.to_string()
        },
    )
        .into_response();
    let h = r.headers_mut();
    if !body.is_null() {
        h.insert(
            "content-type",
            "application/json; charset=utf-8".parse().expect("header"),
        );
    }
    for (k, v) in headers {
        if let (Ok(k), Ok(v)) = (
            axum::http::HeaderName::from_bytes(k.as_bytes()),
            axum::http::HeaderValue::from_str(v),
        ) {
            h.append(k, v);
        }
    }
    r
}

fn error_body(code: &str, message: &str) -> Value {
    json!({"error": {"code": code, "message": message}})
}

fn not_found(kind: &str, name: &str, rg: &str) -> Value {
    let mut body = fixture("observed/vm-get-404-ResourceNotFound.body.json");
    body["error"]["message"] = json!(format!(
        "The Resource '{kind}/{name}' under resource group '{rg}' was not found. For more details please go to https://aka.ms/ARMResourceNotFoundFix"
    ));
    body
}

fn matches(m: &Match, method: &str, kind: &str, body: &Value) -> bool {
    (m.method.is_empty() || m.method == method)
        && (m.kind.is_empty() || m.kind == kind)
        && m.size.as_ref().is_none_or(|s| {
            body.pointer("/properties/hardwareProfile/vmSize")
                .and_then(Value::as_str)
                == Some(s)
        })
        && m.zone
            .as_ref()
            .is_none_or(|z| body.pointer("/zones/0").and_then(Value::as_str) == Some(z))
        && m.priority
            .as_ref()
            .is_none_or(|p| body.pointer("/properties/priority").and_then(Value::as_str) == Some(p))
}

fn take_fault(arm: &mut Arm, method: &str, kind: &str, body: &Value) -> Option<FaultKind> {
    let i = arm
        .faults
        .iter()
        .position(|f| f.times > 0 && matches(&f.on, method, kind, body))?;
    let f = &mut arm.faults[i];
    if f.times != u32::MAX {
        f.times -= 1;
    }
    Some(f.kind.clone())
}

async fn handle(
    State(state): State<Arc<Mutex<Arm>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let query = uri.query().unwrap_or_default().to_string();
    let json_body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let kind = if path.ends_with("/oauth2/v2.0/token") {
        "token"
    } else if path == "/metadata/identity/oauth2/token" {
        "imds"
    } else if path.starts_with("/api/retail/prices") {
        "prices"
    } else if path.contains("/operations/") || path.contains("/operationResults/") {
        "operations"
    } else if path.ends_with("/Microsoft.Compute/skus") {
        "skus"
    } else if path.contains("/virtualMachines") {
        "virtualMachines"
    } else if path.contains("/networkInterfaces") {
        "networkInterfaces"
    } else {
        "unknown"
    };
    let fault = {
        let mut arm = state.lock().expect("state");
        take_fault(&mut arm, method.as_str(), kind, &json_body)
    };
    if let Some(FaultKind::Slow(d)) = &fault {
        tokio::time::sleep(*d).await;
    }
    let mut arm = state.lock().expect("state");
    let (status, body, extra) = if let Some(FaultKind::Status {
        status,
        body,
        headers,
    }) = &fault
    {
        (*status, body.clone(), headers.clone())
    } else if kind == "token" {
        token(&mut arm, &body)
    } else if kind == "imds" {
        imds(&mut arm, method.as_str(), &query, &headers)
    } else if kind == "prices" {
        prices(&arm, &query)
    } else if !headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("Bearer fake-token-"))
    {
        (
            401,
            error_body(
                "AuthenticationFailed",
                "Authentication failed. The 'Authorization' header is missing or invalid.",
            ),
            Vec::new(),
        )
    } else {
        match kind {
            "skus" => skus(&arm, &path, &query),
            "operations" => operation(&mut arm, &segs),
            "virtualMachines" => vm(
                &mut arm,
                method.as_str(),
                &segs,
                &query,
                &json_body,
                fault.as_ref(),
            ),
            "networkInterfaces" => nic(&mut arm, method.as_str(), &segs, &query, &json_body),
            _ => (
                404,
                error_body("InvalidResourceType", &format!("no route for {path}")),
                Vec::new(),
            ),
        }
    };
    let mut headers = extra;
    headers.push((
        "x-ms-request-id".to_string(),
        format!("req-{}", arm.requests.len() + 1),
    ));
    if method == Method::GET {
        headers.push((
            "x-ms-ratelimit-remaining-subscription-reads".to_string(),
            "11999".to_string(),
        ));
    } else {
        headers.push((
            "x-ms-ratelimit-remaining-subscription-writes".to_string(),
            "1199".to_string(),
        ));
    }
    arm.requests.push(Logged {
        method: method.to_string(),
        path,
        query,
        body: json_body,
        at: Instant::now(),
        status,
    });
    json_response(status, &body, &headers)
}

fn token(arm: &mut Arm, body: &Bytes) -> (u16, Value, Vec<(String, String)>) {
    let form: BTreeMap<String, String> = url_pairs(&String::from_utf8_lossy(body));
    let Some(assertion) = form.get("client_assertion") else {
        return (
            400,
            json!({"error": "invalid_request", "error_description": "AADSTS900144: The request body must contain the following parameter: 'client_assertion'."}),
            Vec::new(),
        );
    };
    if form.get("grant_type").map(String::as_str) != Some("client_credentials")
        || form.get("client_assertion_type").map(String::as_str)
            != Some("urn:ietf:params:oauth:client-assertion-type:jwt-bearer")
    {
        return (400, json!({"error": "invalid_request"}), Vec::new());
    }
    arm.assertions.push(assertion.clone());
    let token = issue(
        arm,
        form.get("scope").cloned().unwrap_or_default(),
        "workload".to_string(),
    );
    (
        200,
        json!({
            "token_type": "Bearer",
            "expires_in": arm.token_lifetime,
            "ext_expires_in": arm.token_lifetime,
            "access_token": token,
        }),
        Vec::new(),
    )
}

/// Records and returns a new token for `audience`.
fn issue(arm: &mut Arm, audience: String, via: String) -> String {
    let token = format!("fake-token-{}", arm.issued.len() + 1);
    arm.issued.push(Issued {
        token: token.clone(),
        audience,
        via,
        at: Instant::now(),
        lifetime: arm.token_lifetime,
    });
    token
}

/// The Instance Metadata Service's token API (api-version 2018-02-01), as a VM's IMDS
/// answers: the `Metadata: true` header is required, `resource` names the audience, and
/// `client_id`, `object_id` or `msi_res_id` pick a user-assigned identity; an identity
/// the VM does not have is `400 invalid_request: Identity not found`. Expiries are
/// strings, as IMDS sends them.
fn imds(
    arm: &mut Arm,
    method: &str,
    query: &str,
    headers: &HeaderMap,
) -> (u16, Value, Vec<(String, String)>) {
    let bad = |description: &str| {
        (
            400,
            json!({"error": "invalid_request", "error_description": description}),
            Vec::new(),
        )
    };
    if method != "GET" {
        return (405, json!({"error": "Method not allowed"}), Vec::new());
    }
    if headers.get("metadata").and_then(|v| v.to_str().ok()) != Some("true") {
        return bad("Required metadata header not specified");
    }
    let q = url_pairs(query);
    if q.get("api-version").map(String::as_str) != Some("2018-02-01") {
        return bad("Invalid or missing api-version");
    }
    let Some(resource) = q.get("resource").filter(|r| !r.is_empty()).cloned() else {
        return bad("Required query variable 'resource' is missing");
    };
    let picked: Vec<(&str, &String)> = ["client_id", "object_id", "msi_res_id"]
        .into_iter()
        .filter_map(|k| q.get(k).map(|v| (k, v)))
        .collect();
    let via = match picked.as_slice() {
        [] if arm.imds_system_assigned => "imds:system".to_string(),
        [] => return bad("Identity not found"),
        [(k, v)] => {
            let known = arm.imds_user_assigned.iter().any(|u| match *k {
                "client_id" => u.client_id.eq_ignore_ascii_case(v),
                "object_id" => u.object_id.eq_ignore_ascii_case(v),
                _ => u.resource_id.eq_ignore_ascii_case(v),
            });
            if !known {
                return bad("Identity not found");
            }
            format!("imds:{k}={v}")
        }
        _ => return bad("Only one of client_id, object_id or msi_res_id may be given"),
    };
    let token = issue(arm, resource.clone(), via);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    (
        200,
        json!({
            "access_token": token,
            "client_id": "fake",
            "expires_in": arm.token_lifetime.to_string(),
            "expires_on": (now + arm.token_lifetime).to_string(),
            "ext_expires_in": arm.token_lifetime.to_string(),
            "not_before": now.to_string(),
            "resource": resource,
            "token_type": "Bearer",
        }),
        Vec::new(),
    )
}

fn url_pairs(s: &str) -> BTreeMap<String, String> {
    s.split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'+', _) => out.push(b' '),
            (b'%', Some(b)) => {
                out.push(b);
                i += 2;
            }
            (b, _) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn skip_of(query: &str) -> usize {
    url_pairs(query)
        .get("$skip")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn with_skip(base: &str, path: &str, query: &str, skip: usize) -> String {
    let rest: Vec<&str> = query
        .split('&')
        .filter(|kv| !kv.starts_with("$skip=") && !kv.starts_with("%24skip=") && !kv.is_empty())
        .collect();
    format!("{base}{path}?{}&$skip={skip}", rest.join("&"))
}

fn prices(arm: &Arm, query: &str) -> (u16, Value, Vec<(String, String)>) {
    let skip = skip_of(query);
    let end = (skip + arm.page_size).min(arm.prices.len());
    let mut page = fixture("retail-prices/page-envelope.assembled.json");
    page["Items"] = json!(arm.prices[skip.min(end)..end]);
    page["Count"] = json!(end - skip.min(end));
    page["NextPageLink"] = if end < arm.prices.len() {
        json!(with_skip(&arm.base, "/api/retail/prices", query, end))
    } else {
        Value::Null
    };
    (200, page, Vec::new())
}

fn skus(arm: &Arm, path: &str, query: &str) -> (u16, Value, Vec<(String, String)>) {
    let skip = skip_of(query);
    let end = (skip + arm.page_size).min(arm.skus.len());
    let next = if end < arm.skus.len() {
        json!(with_skip(&arm.base, path, query, end))
    } else {
        Value::Null
    };
    (
        200,
        json!({"value": arm.skus[skip.min(end)..end], "nextLink": next}),
        Vec::new(),
    )
}

fn retry_after(arm: &Arm) -> Vec<(String, String)> {
    arm.retry_after
        .map(|s| vec![("Retry-After".to_string(), s.to_string())])
        .unwrap_or_default()
}

fn new_op(arm: &mut Arm, target: OpTarget, failure: Option<Value>, never: bool) -> String {
    let id = format!("00000000-0000-0000-0000-{:012}", arm.next_id);
    arm.next_id += 1;
    arm.ops.insert(
        id.clone(),
        Op {
            target,
            polls_left: arm.polls_in_progress,
            failure,
            never,
            done: false,
        },
    );
    id
}

fn finish(arm: &mut Arm, id: &str) {
    let Some(op) = arm.ops.get_mut(id) else {
        return;
    };
    if op.done {
        return;
    }
    op.done = true;
    let op = op.clone();
    match op.target {
        OpTarget::CreateVm(name) => {
            let state = if op.failure.is_some() {
                "Failed"
            } else {
                "Succeeded"
            };
            if let Some(vm) = arm.vms.get_mut(&name) {
                vm["properties"]["provisioningState"] = json!(state);
                let vm = vm.clone();
                if op.failure.is_none()
                    && let Some(hook) = arm.on_vm_created.clone()
                {
                    hook(&vm, arm.custom_data.get(&name).map_or("", String::as_str));
                }
            }
        }
        OpTarget::DeleteVm(name) => {
            if let Some(vm) = arm.vms.remove(&name) {
                // deleteOption: Delete takes the NIC and the disk along.
                if let Some(nics) = vm
                    .pointer("/properties/networkProfile/networkInterfaces")
                    .and_then(Value::as_array)
                {
                    for n in nics {
                        let delete = n
                            .pointer("/properties/deleteOption")
                            .and_then(Value::as_str)
                            == Some("Delete");
                        let nic_name = n["id"]
                            .as_str()
                            .and_then(|id| id.rsplit('/').next())
                            .unwrap_or_default()
                            .to_string();
                        if delete {
                            arm.nics.remove(&nic_name);
                        } else if let Some(nic) = arm.nics.get_mut(&nic_name) {
                            nic["properties"]
                                .as_object_mut()
                                .map(|p| p.remove("virtualMachine"));
                        }
                    }
                }
                if let Some(hook) = arm.on_vm_deleted.clone() {
                    hook(&name);
                }
            }
        }
        OpTarget::DeleteNic(name) => {
            arm.nics.remove(&name);
        }
    }
}

fn operation(arm: &mut Arm, segs: &[&str]) -> (u16, Value, Vec<(String, String)>) {
    let id = segs.last().copied().unwrap_or_default().to_string();
    let location_style = segs.contains(&"operationResults");
    let Some(op) = arm.ops.get(&id).cloned() else {
        return (
            404,
            error_body("NotFound", &format!("operation {id} not found")),
            Vec::new(),
        );
    };
    if !op.never && op.polls_left == 0 {
        finish(arm, &id);
        if location_style {
            return (200, Value::Null, Vec::new());
        }
        let mut body = match &op.failure {
            Some(f) => f.clone(),
            None => fixture("observed/asyncop-succeeded.assembled.body.json"),
        };
        body["name"] = json!(id);
        return (200, body, Vec::new());
    }
    if let Some(o) = arm.ops.get_mut(&id) {
        o.polls_left = o.polls_left.saturating_sub(1);
    }
    let headers = retry_after(arm);
    if location_style {
        return (202, Value::Null, headers);
    }
    let mut body = fixture("observed/asyncop-inprogress.assembled.body.json");
    body["name"] = json!(id);
    (200, body, headers)
}

fn list_page(arm: &Arm, items: Vec<Value>, path: &str, query: &str) -> Value {
    let skip = skip_of(query);
    let end = (skip + arm.page_size).min(items.len());
    let next = if end < items.len() {
        json!(with_skip(&arm.base, path, query, end))
    } else {
        Value::Null
    };
    let mut page = json!({"value": items[skip.min(end)..end]});
    if !next.is_null() {
        page["nextLink"] = next;
    }
    page
}

fn vm(
    arm: &mut Arm,
    method: &str,
    segs: &[&str],
    query: &str,
    body: &Value,
    fault: Option<&FaultKind>,
) -> (u16, Value, Vec<(String, String)>) {
    // subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines[/{name}]
    let (sub, rg) = (
        segs.get(1).copied().unwrap_or_default(),
        segs.get(3).copied().unwrap_or_default(),
    );
    let name = segs.get(7).copied().map(str::to_string);
    let Some(name) = name else {
        let items: Vec<Value> = arm.vms.values().cloned().collect();
        let path = format!("/{}", segs.join("/"));
        return (200, list_page(arm, items, &path, query), Vec::new());
    };
    match method {
        "GET" => match arm.vms.get(&name) {
            Some(vm) => (200, vm.clone(), Vec::new()),
            None => (
                404,
                not_found("Microsoft.Compute/virtualMachines", &name, rg),
                Vec::new(),
            ),
        },
        "PUT" => {
            if body.get("location").is_none() {
                return (
                    400,
                    error_body(
                        "LocationRequired",
                        "The location property is required for this definition.",
                    ),
                    Vec::new(),
                );
            }
            // The NIC must exist (Compute checks references synchronously).
            let nic_ref = body
                .pointer("/properties/networkProfile/networkInterfaces/0/id")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let nic_name = nic_ref.rsplit('/').next().unwrap_or_default().to_string();
            if !arm.nics.contains_key(&nic_name) {
                return (
                    400,
                    error_body(
                        "InvalidParameter",
                        &format!("Resource {nic_ref} not found."),
                    ),
                    Vec::new(),
                );
            }
            if let Some(existing) = arm.vms.get(&name) {
                return (200, existing.clone(), Vec::new());
            }
            let template = fixture(&format!(
                "{SPECS}/compute/resource-manager/Microsoft.Compute/ComputeRP/stable/2024-07-01/examples/virtualMachineExamples/VirtualMachine_Create_FromACommunityGalleryImage.json"
            ));
            let mut vm = template["responses"]["201"]["body"].clone();
            let id = format!(
                "/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{name}"
            );
            vm["id"] = json!(id);
            vm["name"] = json!(name);
            vm["location"] = body["location"].clone();
            for k in ["tags", "zones", "identity"] {
                if let Some(v) = body.get(k) {
                    vm[k] = v.clone();
                }
            }
            let mut props = body["properties"].clone();
            // ARM keeps customData for the VM but never returns it.
            if let Some(os) = props.get_mut("osProfile").and_then(Value::as_object_mut)
                && let Some(Value::String(data)) = os.remove("customData")
            {
                arm.custom_data.insert(name.clone(), data);
            }
            props["provisioningState"] = json!("Creating");
            props["vmId"] = json!(format!("{:08x}-0000-0000-0000-000000000000", arm.next_id));
            props["timeCreated"] = json!(jiff::Timestamp::now().to_string());
            vm["properties"] = props;
            arm.vms.insert(name.clone(), vm.clone());
            if let Some(nic) = arm.nics.get_mut(&nic_name) {
                nic["properties"]["virtualMachine"] = json!({"id": id});
            }
            let (failure, never) = match fault {
                Some(FaultKind::AsyncFailure { body }) => (Some(body.clone()), false),
                Some(FaultKind::NeverFinish) => (None, true),
                _ => (None, false),
            };
            let loc = body["location"].as_str().unwrap_or("eastus").to_string();
            let op = new_op(arm, OpTarget::CreateVm(name), failure, never);
            let mut headers = vec![(
                "Azure-AsyncOperation".to_string(),
                format!(
                    "{}/subscriptions/{sub}/providers/Microsoft.Compute/locations/{loc}/operations/{op}?api-version=2024-07-01",
                    arm.base
                ),
            )];
            headers.extend(retry_after(arm));
            (201, vm, headers)
        }
        "DELETE" => {
            let Some(vm) = arm.vms.get_mut(&name) else {
                return (204, Value::Null, Vec::new());
            };
            vm["properties"]["provisioningState"] = json!("Deleting");
            let loc = vm["location"].as_str().unwrap_or("eastus").to_string();
            let op = new_op(arm, OpTarget::DeleteVm(name), None, false);
            let mut headers = vec![
                (
                    "Location".to_string(),
                    format!(
                        "{}/subscriptions/{sub}/providers/Microsoft.Compute/locations/{loc}/operations/{op}?monitor=true&api-version=2024-07-01",
                        arm.base
                    ),
                ),
                (
                    "Azure-AsyncOperation".to_string(),
                    format!(
                        "{}/subscriptions/{sub}/providers/Microsoft.Compute/locations/{loc}/operations/{op}?api-version=2024-07-01",
                        arm.base
                    ),
                ),
            ];
            headers.extend(retry_after(arm));
            (202, Value::Null, headers)
        }
        _ => (405, error_body("MethodNotAllowed", method), Vec::new()),
    }
}

fn nic(
    arm: &mut Arm,
    method: &str,
    segs: &[&str],
    query: &str,
    body: &Value,
) -> (u16, Value, Vec<(String, String)>) {
    let (sub, rg) = (
        segs.get(1).copied().unwrap_or_default(),
        segs.get(3).copied().unwrap_or_default(),
    );
    let Some(name) = segs.get(7).copied().map(str::to_string) else {
        let items: Vec<Value> = arm.nics.values().cloned().collect();
        let path = format!("/{}", segs.join("/"));
        return (200, list_page(arm, items, &path, query), Vec::new());
    };
    match method {
        "GET" => match arm.nics.get(&name) {
            Some(n) => (200, n.clone(), Vec::new()),
            None => (
                404,
                not_found("Microsoft.Network/networkInterfaces", &name, rg),
                Vec::new(),
            ),
        },
        "PUT" => {
            let template = fixture(&format!(
                "{SPECS}/network/resource-manager/Microsoft.Network/stable/2024-05-01/examples/NetworkInterfaceCreate.json"
            ));
            let mut nic = template["responses"]["201"]["body"].clone();
            let id = format!(
                "/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Network/networkInterfaces/{name}"
            );
            nic["id"] = json!(id);
            nic["name"] = json!(name);
            nic["location"] = body["location"].clone();
            nic["tags"] = body.get("tags").cloned().unwrap_or(json!({}));
            let mut props = body["properties"].clone();
            props["provisioningState"] = json!("Succeeded");
            if let Some(vm) = arm
                .nics
                .get(&name)
                .and_then(|n| n.pointer("/properties/virtualMachine").cloned())
            {
                props["virtualMachine"] = vm;
            }
            nic["properties"] = props;
            let status = if arm.nics.contains_key(&name) {
                200
            } else {
                201
            };
            arm.nics.insert(name, nic.clone());
            (status, nic, Vec::new())
        }
        "DELETE" => {
            if !arm.nics.contains_key(&name) {
                return (204, Value::Null, Vec::new());
            }
            if arm.nics[&name]
                .pointer("/properties/virtualMachine/id")
                .is_some()
            {
                return (
                    400,
                    error_body(
                        "NicInUse",
                        &format!(
                            "Network Interface {name} is used by existing resource. In order to delete the network interface, it must be dissociated from the resource."
                        ),
                    ),
                    Vec::new(),
                );
            }
            let op = new_op(arm, OpTarget::DeleteNic(name.clone()), None, false);
            let mut headers = vec![(
                "Location".to_string(),
                format!(
                    "{}/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Network/networkInterfaces/{name}/operationResults/{op}?api-version=2024-05-01",
                    arm.base
                ),
            )];
            headers.extend(retry_after(arm));
            (202, Value::Null, headers)
        }
        _ => (405, error_body("MethodNotAllowed", method), Vec::new()),
    }
}
