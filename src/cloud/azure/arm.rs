//! The ARM calls the provider makes, through azure_mgmt_compute 0.21 (VMs, Resource SKUs)
//! and an azure_core pipeline built the same way (NICs, operation status), with
//! Tailor's own long-running-operation polling.
//!
//! Two defects of the 0.21 crates shape this module (see AZURE-PROVIDER.md §0): awaiting
//! `virtual_machines().create_or_update(..)` re-sends the PUT in a loop and reads the
//! provisioning state from the wrong JSON key, and `delete(..)` has no poller at all. So
//! every write is `.send()`, and [`Arm::wait`] follows `Azure-AsyncOperation` (else
//! `Location`, else the resource itself) with `Retry-After` honoured, to a terminal state
//! or an overall timeout. The crates' retry policy also sleeps `Retry-After` without a
//! ceiling; [`ArmRetry`] caps it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use azure_core::auth::TokenCredential;
use azure_core::headers::{HeaderName, Headers};
use azure_core::{ClientOptions, Context, Method, Pipeline, Request, RetryOptions, Url};
use azure_mgmt_compute::package_2024_07_01 as compute;
use futures::StreamExt as _;
use serde_json::Value;

use super::classify::ArmFailure;

/// Compute API version of VM calls (the crate's package).
pub const COMPUTE_API_VERSION: &str = "2024-07-01";
/// Network API version of NIC calls.
pub const NETWORK_API_VERSION: &str = "2024-05-01";

const ASYNC_OPERATION: HeaderName = HeaderName::from_static("azure-asyncoperation");
const LOCATION: HeaderName = HeaderName::from_static("location");
const RETRY_AFTER: HeaderName = HeaderName::from_static("retry-after");
const RETRY_AFTER_MS: HeaderName = HeaderName::from_static("retry-after-ms");
const X_MS_RETRY_AFTER_MS: HeaderName = HeaderName::from_static("x-ms-retry-after-ms");

/// How ARM calls are retried and long-running operations polled.
#[derive(Debug, Clone, PartialEq)]
pub struct ArmSettings {
    /// Scheme and host of ARM (`https://management.azure.com`).
    pub endpoint: Url,
    /// Token scopes (`https://management.azure.com/.default`).
    pub scopes: Vec<String>,
    /// Retries of 408/429/5xx per call.
    pub max_retries: u32,
    /// First backoff.
    pub initial_delay: Duration,
    /// Longest single wait, `Retry-After` included.
    pub max_delay: Duration,
    /// Retries stop once this much time has passed since the first try.
    pub max_total_elapsed: Duration,
    /// Poll interval when an operation gives no `Retry-After` (Karpenter: 3 s).
    pub poll_interval: Duration,
    /// Longest wait for one operation.
    pub operation_timeout: Duration,
}

impl ArmSettings {
    /// Defaults for an ARM endpoint: the scope is the endpoint's `/.default`.
    pub fn for_endpoint(endpoint: Url) -> Self {
        let scope = format!("{}/.default", endpoint.as_str().trim_end_matches('/'));
        ArmSettings {
            endpoint,
            scopes: vec![scope],
            max_retries: 8,
            initial_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(30),
            max_total_elapsed: Duration::from_secs(60),
            poll_interval: Duration::from_secs(3),
            operation_timeout: Duration::from_secs(15 * 60),
        }
    }
}

/// Exponential backoff that honours `Retry-After` up to `max_delay` (the crate's own policy
/// has no ceiling on it).
#[derive(Debug)]
pub struct ArmRetry {
    max_retries: u32,
    initial_delay: Duration,
    max_delay: Duration,
    max_total_elapsed: Duration,
}

#[async_trait::async_trait]
impl azure_core::RetryPolicy for ArmRetry {
    fn is_expired(&self, duration_since_start: Duration, retry_count: u32) -> bool {
        retry_count >= self.max_retries || duration_since_start >= self.max_total_elapsed
    }

    fn sleep_duration(&self, retry_count: u32) -> Duration {
        let factor = 2u32.saturating_pow(retry_count.saturating_sub(1));
        self.initial_delay
            .saturating_mul(factor)
            .min(self.max_delay)
    }

    async fn wait(
        &self,
        _error: &azure_core::Error,
        retry_count: u32,
        retry_after: Option<Duration>,
    ) {
        let backoff = self.sleep_duration(retry_count);
        let wait = retry_after
            .map_or(backoff, |r| r.max(backoff))
            .min(self.max_delay);
        tokio::time::sleep(wait).await;
    }
}

/// Counts requests put on the wire (retries included).
#[derive(Debug)]
struct CallCounter(Arc<AtomicU64>);

#[async_trait::async_trait]
impl azure_core::Policy for CallCounter {
    async fn send(
        &self,
        ctx: &Context,
        request: &mut Request,
        next: &[Arc<dyn azure_core::Policy>],
    ) -> azure_core::PolicyResult {
        self.0.fetch_add(1, Ordering::Relaxed);
        next[0].send(ctx, request, &next[1..]).await
    }
}

/// A successful response, read whole.
#[derive(Debug, Clone)]
pub struct Raw {
    /// Status.
    pub status: u16,
    /// `Azure-AsyncOperation`.
    pub async_operation: Option<String>,
    /// `Location`.
    pub location: Option<String>,
    /// The wait the server asked for.
    pub retry_after: Option<Duration>,
    /// Body (JSON, or `Null` when empty).
    pub body: Value,
}

/// How a long-running operation ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// `Succeeded`.
    Succeeded,
    /// `Failed` or `Canceled`, with the error it reported.
    Failed(ArmFailure),
}

/// Why an ARM call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ArmError {
    /// ARM answered with an error status.
    #[error("{operation}: HTTP {}: {}: {}", .failure.status.unwrap_or(0), .failure.code, .failure.message)]
    Status {
        /// What was being done.
        operation: String,
        /// The error.
        failure: ArmFailure,
    },
    /// No answer, an unreadable answer, or no token.
    #[error("{operation}: {message}")]
    Transport {
        /// What was being done.
        operation: String,
        /// What went wrong.
        message: String,
    },
    /// The operation did not finish in time.
    #[error("{operation}: not finished after {seconds}s")]
    Timeout {
        /// What was being done.
        operation: String,
        /// The timeout.
        seconds: u64,
    },
}

impl ArmError {
    /// The ARM failure, when ARM answered.
    pub fn failure(&self) -> Option<&ArmFailure> {
        match self {
            ArmError::Status { failure, .. } => Some(failure),
            _ => None,
        }
    }

    /// Whether ARM said the resource does not exist.
    pub fn is_not_found(&self) -> bool {
        self.failure().is_some_and(|f| f.status == Some(404))
    }
}

/// The wait a response asks for: `retry-after-ms`, `x-ms-retry-after-ms`, then
/// `Retry-After` in seconds (as azure_core reads them).
pub fn retry_after(headers: &Headers) -> Option<Duration> {
    let ms = |h: &HeaderName| {
        headers
            .get_optional_str(h)
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_millis)
    };
    ms(&RETRY_AFTER_MS)
        .or_else(|| ms(&X_MS_RETRY_AFTER_MS))
        .or_else(|| {
            headers
                .get_optional_str(&RETRY_AFTER)
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs)
        })
}

/// The failure an azure_core error carries.
pub fn failure_of(e: &azure_core::Error) -> Option<ArmFailure> {
    let http = e.as_http_error()?;
    Some(ArmFailure {
        status: Some(u16::from(http.status())),
        code: http.error_code().unwrap_or_default().to_string(),
        // The matchers test the error text, which Karpenter takes with the whole body.
        message: format!("{} {}", http.error_message().unwrap_or_default(), http),
        retry_after_seconds: None,
    })
}

/// The state an operation-status body or a resource body reports, if terminal.
pub fn terminal_state(body: &Value) -> Option<Outcome> {
    let state = body
        .get("status")
        .or_else(|| body.pointer("/properties/provisioningState"))
        .and_then(Value::as_str);
    match state {
        Some("Succeeded") => Some(Outcome::Succeeded),
        Some("Failed") | Some("Canceled") | Some("Cancelled") => {
            let error = body.get("error").cloned().unwrap_or(Value::Null);
            Some(Outcome::Failed(ArmFailure {
                status: None,
                code: error
                    .get("code")
                    .and_then(Value::as_str)
                    .unwrap_or(state.unwrap_or_default())
                    .to_string(),
                message: error
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                retry_after_seconds: None,
            }))
        }
        _ => None,
    }
}

/// The ARM client of one subscription and resource group.
#[derive(Clone)]
pub struct Arm {
    compute: compute::Client,
    pipeline: Pipeline,
    credential: Arc<dyn TokenCredential>,
    settings: ArmSettings,
    subscription_id: String,
    resource_group: String,
    calls: Arc<AtomicU64>,
}

impl std::fmt::Debug for Arm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arm")
            .field("endpoint", &self.settings.endpoint.as_str())
            .field("subscription_id", &self.subscription_id)
            .field("resource_group", &self.resource_group)
            .finish()
    }
}

impl Arm {
    /// A client for `subscription_id`/`resource_group` at the settings' endpoint.
    pub fn new(
        credential: Arc<dyn TokenCredential>,
        settings: ArmSettings,
        subscription_id: &str,
        resource_group: &str,
    ) -> Self {
        let calls = Arc::new(AtomicU64::new(0));
        let options = || {
            let mut o = ClientOptions::default().retry(RetryOptions::custom(Arc::new(ArmRetry {
                max_retries: settings.max_retries,
                initial_delay: settings.initial_delay,
                max_delay: settings.max_delay,
                max_total_elapsed: settings.max_total_elapsed,
            })));
            o.per_retry_policies_mut()
                .push(Arc::new(CallCounter(calls.clone())));
            o
        };
        let compute = compute::Client::new(
            settings.endpoint.clone(),
            credential.clone(),
            settings.scopes.clone(),
            options(),
        );
        let pipeline = Pipeline::new(
            option_env!("CARGO_PKG_NAME"),
            option_env!("CARGO_PKG_VERSION"),
            options(),
            Vec::new(),
            Vec::new(),
        );
        Arm {
            compute,
            pipeline,
            credential,
            settings,
            subscription_id: subscription_id.to_string(),
            resource_group: resource_group.to_string(),
            calls,
        }
    }

    /// Requests sent so far (retries included).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// The settings.
    pub fn settings(&self) -> &ArmSettings {
        &self.settings
    }

    fn url(&self, path: &str, api_version: &str) -> Result<Url, ArmError> {
        let mut url = self.settings.endpoint.clone();
        url.set_path(path);
        url.set_query(Some(&format!("api-version={api_version}")));
        Ok(url)
    }

    fn transport(operation: &str, e: impl std::fmt::Display) -> ArmError {
        ArmError::Transport {
            operation: operation.to_string(),
            message: e.to_string(),
        }
    }

    fn status_error(operation: &str, e: azure_core::Error) -> ArmError {
        match failure_of(&e) {
            Some(failure) => ArmError::Status {
                operation: operation.to_string(),
                failure,
            },
            None => Self::transport(operation, format!("{e}")),
        }
    }

    async fn read(operation: &str, response: azure_core::Response) -> Result<Raw, ArmError> {
        let status = u16::from(response.status());
        let headers = response.headers().clone();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| Self::transport(operation, e))?;
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .map_err(|e| Self::transport(operation, format!("response is not JSON: {e}")))?
        };
        Ok(Raw {
            status,
            async_operation: headers.get_optional_string(&ASYNC_OPERATION),
            location: headers.get_optional_string(&LOCATION),
            retry_after: retry_after(&headers),
            body,
        })
    }

    /// One call through the raw pipeline (NICs, operation status), with a bearer token.
    async fn call(
        &self,
        operation: &str,
        method: Method,
        url: Url,
        body: Option<&Value>,
    ) -> Result<Raw, ArmError> {
        let scopes: Vec<&str> = self.settings.scopes.iter().map(String::as_str).collect();
        let token = self
            .credential
            .get_token(&scopes)
            .await
            .map_err(|e| Self::transport(operation, format!("getting a token: {e}")))?;
        let mut req = Request::new(url, method);
        req.insert_header(
            azure_core::headers::AUTHORIZATION,
            format!("Bearer {}", token.token.secret()),
        );
        if let Some(b) = body {
            req.insert_header("content-type", "application/json");
            req.set_body(azure_core::to_json(b).map_err(|e| Self::transport(operation, e))?);
        }
        let response = self
            .pipeline
            .send(&Context::default(), &mut req)
            .await
            .map_err(|e| Self::status_error(operation, e))?;
        Self::read(operation, response).await
    }

    fn nic_path(&self, name: &str) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Network/networkInterfaces/{name}",
            self.subscription_id, self.resource_group
        )
    }

    /// PUT a NIC and wait for it.
    pub async fn put_nic(&self, name: &str, body: &Value) -> Result<Value, ArmError> {
        let op = format!("create network interface {name}");
        let url = self.url(&self.nic_path(name), NETWORK_API_VERSION)?;
        let raw = self.call(&op, Method::Put, url.clone(), Some(body)).await?;
        match self.wait(&op, &raw, Some(url)).await? {
            Outcome::Succeeded => Ok(raw.body),
            Outcome::Failed(failure) => Err(ArmError::Status {
                operation: op,
                failure,
            }),
        }
    }

    /// GET a NIC; `None` when it does not exist.
    pub async fn get_nic(&self, name: &str) -> Result<Option<Value>, ArmError> {
        let op = format!("get network interface {name}");
        let url = self.url(&self.nic_path(name), NETWORK_API_VERSION)?;
        match self.call(&op, Method::Get, url, None).await {
            Ok(raw) => Ok(Some(raw.body)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// DELETE a NIC and wait; one that is already gone is deleted.
    pub async fn delete_nic(&self, name: &str) -> Result<(), ArmError> {
        let op = format!("delete network interface {name}");
        let url = self.url(&self.nic_path(name), NETWORK_API_VERSION)?;
        match self.call(&op, Method::Delete, url, None).await {
            Ok(raw) => match self.wait(&op, &raw, None).await? {
                Outcome::Succeeded => Ok(()),
                Outcome::Failed(failure) => Err(ArmError::Status {
                    operation: op,
                    failure,
                }),
            },
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Every NIC in the resource group (all pages).
    pub async fn list_nics(&self) -> Result<Vec<Value>, ArmError> {
        let op = "list network interfaces";
        let path = format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Network/networkInterfaces",
            self.subscription_id, self.resource_group
        );
        let mut url = self.url(&path, NETWORK_API_VERSION)?;
        let mut out = Vec::new();
        loop {
            let raw = self.call(op, Method::Get, url.clone(), None).await?;
            if let Some(items) = raw.body.get("value").and_then(Value::as_array) {
                out.extend(items.iter().cloned());
            }
            match raw
                .body
                .get("nextLink")
                .and_then(Value::as_str)
                .filter(|l| !l.is_empty())
            {
                Some(next) => url = Url::parse(next).map_err(|e| Self::transport(op, e))?,
                None => return Ok(out),
            }
        }
    }

    /// PUT a VM with the crate's `.send()` and wait for the operation. The body is checked
    /// against the crate's model first.
    pub async fn put_vm(&self, name: &str, body: &Value) -> Result<Outcome, ArmError> {
        let op = format!("create virtual machine {name}");
        let vm: compute::models::VirtualMachine =
            serde_json::from_value(body.clone()).map_err(|e| {
                Self::transport(
                    &op,
                    format!("the VM body does not fit the 2024-07-01 model: {e}"),
                )
            })?;
        let response = self
            .compute
            .virtual_machines_client()
            .create_or_update(&self.resource_group, name, vm, &self.subscription_id)
            .send()
            .await
            .map_err(|e| Self::status_error(&op, e))?;
        let raw = Self::read(&op, response.into_raw_response()).await?;
        let url = self.url(
            &format!(
                "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachines/{name}",
                self.subscription_id, self.resource_group
            ),
            COMPUTE_API_VERSION,
        )?;
        self.wait(&op, &raw, Some(url)).await
    }

    /// GET a VM as JSON; `None` when it does not exist.
    pub async fn get_vm(&self, name: &str) -> Result<Option<Value>, ArmError> {
        let op = format!("get virtual machine {name}");
        match self
            .compute
            .virtual_machines_client()
            .get(&self.resource_group, name, &self.subscription_id)
            .send()
            .await
        {
            Ok(response) => {
                let vm = response
                    .into_body()
                    .await
                    .map_err(|e| Self::transport(&op, e))?;
                Ok(Some(
                    serde_json::to_value(vm).map_err(|e| Self::transport(&op, e))?,
                ))
            }
            Err(e) => {
                let e = Self::status_error(&op, e);
                if e.is_not_found() { Ok(None) } else { Err(e) }
            }
        }
    }

    /// Force-deletes a VM and waits; one already gone is deleted (Karpenter treats 404 as
    /// success).
    pub async fn delete_vm(&self, name: &str) -> Result<(), ArmError> {
        let op = format!("delete virtual machine {name}");
        let sent = self
            .compute
            .virtual_machines_client()
            .delete(&self.resource_group, name, &self.subscription_id)
            .force_deletion(true)
            .send()
            .await;
        let response = match sent {
            Ok(r) => r,
            Err(e) => {
                let e = Self::status_error(&op, e);
                return if e.is_not_found() { Ok(()) } else { Err(e) };
            }
        };
        let raw = Self::read(&op, response.into_raw_response()).await?;
        match self.wait(&op, &raw, None).await {
            Ok(Outcome::Succeeded) => Ok(()),
            Ok(Outcome::Failed(failure)) => Err(ArmError::Status {
                operation: op,
                failure,
            }),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Every VM in the resource group, through the crate's pager.
    pub async fn list_vms(&self) -> Result<Vec<Value>, ArmError> {
        let op = "list virtual machines";
        let mut pages = self
            .compute
            .virtual_machines_client()
            .list(&self.resource_group, &self.subscription_id)
            .into_stream();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| Self::status_error(op, e))?;
            for vm in page.value {
                out.push(serde_json::to_value(vm).map_err(|e| Self::transport(op, e))?);
            }
        }
        Ok(out)
    }

    /// Resource SKUs for a region, through the crate's pager.
    pub async fn list_skus(
        &self,
        region: &str,
    ) -> Result<Vec<compute::models::ResourceSku>, ArmError> {
        let op = "list resource skus";
        let mut pages = self
            .compute
            .resource_skus_client()
            .list(&self.subscription_id)
            .filter(format!("location eq '{region}'"))
            .into_stream();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| Self::status_error(op, e))?;
            out.extend(page.value);
        }
        Ok(out)
    }

    /// Waits for the operation a write started: polls `Azure-AsyncOperation`, else
    /// `Location`, else `resource` (when the body's state is not terminal), sleeping what
    /// each answer asks (`poll_interval` when it asks nothing), until a terminal state or
    /// `operation_timeout`.
    pub async fn wait(
        &self,
        op: &str,
        first: &Raw,
        resource: Option<Url>,
    ) -> Result<Outcome, ArmError> {
        enum Poll {
            Status(Url),
            Location(Url),
            Resource(Url),
        }
        let parse = |u: &str| {
            Url::parse(u).map_err(|e| Self::transport(op, format!("bad operation URL {u:?}: {e}")))
        };
        let poll = if let Some(u) = &first.async_operation {
            Poll::Status(parse(u)?)
        } else if let Some(u) = first.location.as_ref().filter(|_| first.status == 202) {
            Poll::Location(parse(u)?)
        } else if first.status == 204 || first.body.is_null() {
            return Ok(Outcome::Succeeded);
        } else if let Some(outcome) = terminal_state(&first.body) {
            return Ok(outcome);
        } else if first
            .body
            .pointer("/properties/provisioningState")
            .is_none()
        {
            // No state at all counts as Succeeded (ARM RPC).
            return Ok(Outcome::Succeeded);
        } else if let Some(u) = resource {
            Poll::Resource(u)
        } else {
            return Ok(Outcome::Succeeded);
        };
        let started = tokio::time::Instant::now();
        let mut wait = first.retry_after.unwrap_or(self.settings.poll_interval);
        loop {
            if started.elapsed() + wait > self.settings.operation_timeout {
                return Err(ArmError::Timeout {
                    operation: op.to_string(),
                    seconds: self.settings.operation_timeout.as_secs(),
                });
            }
            tokio::time::sleep(wait).await;
            let (url, location) = match &poll {
                Poll::Status(u) | Poll::Resource(u) => (u.clone(), false),
                Poll::Location(u) => (u.clone(), true),
            };
            let raw = self.call(op, Method::Get, url, None).await?;
            wait = raw.retry_after.unwrap_or(self.settings.poll_interval);
            if location {
                if raw.status != 202 {
                    return Ok(Outcome::Succeeded);
                }
                continue;
            }
            if let Some(outcome) = terminal_state(&raw.body) {
                return Ok(outcome);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn retry_after_prefers_milliseconds_then_seconds() {
        let mut h = Headers::new();
        h.insert("retry-after", "7");
        assert_eq!(retry_after(&h), Some(Duration::from_secs(7)));
        h.insert("retry-after-ms", "250");
        assert_eq!(retry_after(&h), Some(Duration::from_millis(250)));
        assert_eq!(retry_after(&Headers::new()), None);
    }

    #[test]
    fn operation_states_are_terminal_only_when_succeeded_failed_or_canceled() {
        assert_eq!(terminal_state(&json!({"status": "InProgress"})), None);
        assert_eq!(
            terminal_state(&json!({"status": "Succeeded"})),
            Some(Outcome::Succeeded)
        );
        assert_eq!(
            terminal_state(&json!({"properties": {"provisioningState": "Creating"}})),
            None
        );
        let failed = terminal_state(
            &json!({"status": "Failed", "error": {"code": "ZonalAllocationFailed", "message": "m"}}),
        );
        assert!(matches!(failed, Some(Outcome::Failed(f)) if f.code == "ZonalAllocationFailed"));
        let canceled = terminal_state(&json!({"status": "Canceled"}));
        assert!(matches!(canceled, Some(Outcome::Failed(f)) if f.code == "Canceled"));
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        use azure_core::RetryPolicy as _;
        let p = ArmRetry {
            max_retries: 3,
            initial_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(300),
            max_total_elapsed: Duration::from_secs(60),
        };
        assert_eq!(p.sleep_duration(1), Duration::from_millis(100));
        assert_eq!(p.sleep_duration(2), Duration::from_millis(200));
        assert_eq!(p.sleep_duration(3), Duration::from_millis(300));
        assert!(p.is_expired(Duration::ZERO, 3));
        assert!(!p.is_expired(Duration::ZERO, 2));
    }
}
