//! Credentials for ARM (and Azure Managed Prometheus): workload identity, or the VM's
//! managed identity (system- or user-assigned) through IMDS.
//!
//! azure_identity 0.21's `WorkloadIdentityCredential` reads the projected service-account
//! token once, when it is created; once that token rotates (kubelet rewrites it about every
//! hour) every later exchange would present a stale assertion. [`WorkloadIdentity`] reads
//! the file on every exchange instead and hands it to the crate's own
//! `federated_credentials_flow::perform`, so the request AAD sees is the crate's.
//!
//! The crate's `VirtualMachineManagedIdentityCredential` can only ask for the system-assigned
//! identity (its `ImdsId` is private), so [`ManagedIdentity`] speaks IMDS itself and can
//! name a user-assigned identity. Its endpoint is `--azure-imds-endpoint`, else
//! `AZURE_POD_IDENTITY_AUTHORITY_HOST` (the Azure SDKs' IMDS override); `IDENTITY_ENDPOINT`
//! is not read, because where it is set (App Service, Azure Arc) it names another token
//! protocol, not IMDS.

use std::path::PathBuf;
use std::sync::Arc;

use azure_core::auth::{AccessToken, TokenCredential};
use azure_core::error::{Error as AzError, ErrorKind};
use azure_core::{HttpClient, Url};
use time::OffsetDateTime;
use tokio::sync::Mutex;

/// What a failed token request tells the user to check: the chart's identity values and the
/// docs section that explains them.
pub const IDENTITY_DOCS: &str = "the agent's Azure identity is the chart's workloadIdentity.enabled \
     and workloadIdentity.clientId, or managedIdentity.clientId (AZURE_CLIENT_ID); see \
     docs/install.md#an-azure-identity";

/// The public cloud's AAD authority.
pub const DEFAULT_AUTHORITY_HOST: &str = "https://login.microsoftonline.com";
/// Scope of Azure Managed Prometheus queries.
pub const PROMETHEUS_SCOPE: &str = "https://prometheus.monitor.azure.com/.default";
/// A token is exchanged again this long before it expires.
const REFRESH_MARGIN: time::Duration = time::Duration::seconds(20);

/// The Azure Instance Metadata Service, which issues managed-identity tokens on a VM.
pub const DEFAULT_IMDS_ENDPOINT: &str = "http://169.254.169.254";
/// The IMDS token API version (the one every Azure SDK uses for VMs).
pub const IMDS_API_VERSION: &str = "2018-02-01";
/// The path of the IMDS token API.
const IMDS_TOKEN_PATH: &str = "/metadata/identity/oauth2/token";

/// Which user-assigned identity a managed-identity token is for (IMDS's query parameter).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserAssigned {
    /// `client_id=`: the identity's application (client) ID.
    ClientId(String),
    /// `object_id=`: the identity's principal (object) ID.
    ObjectId(String),
    /// `msi_res_id=`: the identity's ARM resource ID.
    ResourceId(String),
}

impl UserAssigned {
    /// IMDS's query parameter and its value.
    fn query(&self) -> (&'static str, &str) {
        match self {
            UserAssigned::ClientId(v) => ("client_id", v),
            UserAssigned::ObjectId(v) => ("object_id", v),
            UserAssigned::ResourceId(v) => ("msi_res_id", v),
        }
    }
}

impl std::fmt::Display for UserAssigned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (k, v) = self.query();
        write!(f, "the user-assigned identity {k}={v}")
    }
}

/// Which credential to use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthSettings {
    /// Federated token exchange (AKS workload identity).
    WorkloadIdentity {
        /// `AZURE_TENANT_ID`.
        tenant_id: String,
        /// `AZURE_CLIENT_ID`.
        client_id: String,
        /// `AZURE_FEDERATED_TOKEN_FILE`.
        token_file: PathBuf,
        /// `AZURE_AUTHORITY_HOST`, default the public cloud.
        authority_host: String,
    },
    /// The VM's managed identity through IMDS: the system-assigned one, or a
    /// user-assigned one.
    ManagedIdentity {
        /// `None` for the system-assigned identity.
        user_assigned: Option<UserAssigned>,
        /// The IMDS base URL.
        endpoint: String,
    },
}

/// What selects and configures the credential: the workload-identity webhook's variables,
/// and the managed-identity settings. Empty strings count as unset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdentityChoice {
    /// `AZURE_TENANT_ID`.
    pub tenant_id: Option<String>,
    /// `--azure-client-id` / `AZURE_CLIENT_ID`: workload identity's application, or the
    /// user-assigned managed identity's client ID.
    pub client_id: Option<String>,
    /// `AZURE_FEDERATED_TOKEN_FILE`.
    pub federated_token_file: Option<String>,
    /// `AZURE_AUTHORITY_HOST`.
    pub authority_host: Option<String>,
    /// `--azure-managed-identity-object-id`.
    pub object_id: Option<String>,
    /// `--azure-managed-identity-resource-id`.
    pub resource_id: Option<String>,
    /// `--azure-imds-endpoint` (else `AZURE_POD_IDENTITY_AUTHORITY_HOST`, the Azure SDKs'
    /// override of the IMDS host).
    pub imds_endpoint: Option<String>,
}

/// Whether `s` is a GUID (8-4-4-4-12 hex digits), the form of Entra client and object IDs.
fn is_guid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| p.len() == n && p.chars().all(|c| c.is_ascii_hexdigit()))
}

impl AuthSettings {
    /// Workload identity when the webhook's variables are set, else managed identity.
    /// `env` looks a variable up (the process environment in the binary).
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        Self::select(IdentityChoice {
            tenant_id: env("AZURE_TENANT_ID"),
            client_id: env("AZURE_CLIENT_ID"),
            federated_token_file: env("AZURE_FEDERATED_TOKEN_FILE"),
            authority_host: env("AZURE_AUTHORITY_HOST"),
            object_id: None,
            resource_id: None,
            imds_endpoint: env("AZURE_POD_IDENTITY_AUTHORITY_HOST"),
        })
    }

    /// Workload identity when the tenant, client and federated token file are all given;
    /// otherwise managed identity: user-assigned when a client ID, object ID or resource
    /// ID is given (at most one), else system-assigned.
    pub fn select(choice: IdentityChoice) -> Result<Self, String> {
        let set = |v: Option<String>| v.map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
        let tenant_id = set(choice.tenant_id);
        let client_id = set(choice.client_id);
        let token_file = set(choice.federated_token_file);
        let object_id = set(choice.object_id);
        let resource_id = set(choice.resource_id);
        if let (Some(tenant_id), Some(client_id), Some(file)) =
            (tenant_id, client_id.clone(), token_file)
        {
            if let Some((flag, value)) = object_id
                .map(|v| ("--azure-managed-identity-object-id", v))
                .or(resource_id.map(|v| ("--azure-managed-identity-resource-id", v)))
            {
                return Err(format!(
                    "{flag} {value:?} selects a managed identity, but AZURE_FEDERATED_TOKEN_FILE \
                     {file:?} selects workload identity: set one of them"
                ));
            }
            return Ok(AuthSettings::WorkloadIdentity {
                tenant_id,
                client_id,
                token_file: PathBuf::from(file),
                authority_host: set(choice.authority_host)
                    .unwrap_or_else(|| DEFAULT_AUTHORITY_HOST.to_string()),
            });
        }
        let given: Vec<(&str, UserAssigned)> = [
            client_id.map(|v| ("--azure-client-id", UserAssigned::ClientId(v))),
            object_id.map(|v| {
                (
                    "--azure-managed-identity-object-id",
                    UserAssigned::ObjectId(v),
                )
            }),
            resource_id.map(|v| {
                (
                    "--azure-managed-identity-resource-id",
                    UserAssigned::ResourceId(v),
                )
            }),
        ]
        .into_iter()
        .flatten()
        .collect();
        if given.len() > 1 {
            let flags: Vec<&str> = given.iter().map(|(f, _)| *f).collect();
            return Err(format!(
                "{} each name a user-assigned managed identity: give only one",
                flags.join(" and ")
            ));
        }
        let user_assigned = match given.into_iter().next() {
            None => None,
            Some((flag, id)) => {
                match &id {
                    UserAssigned::ClientId(v) | UserAssigned::ObjectId(v) if !is_guid(v) => {
                        return Err(format!(
                            "{flag} {v:?} is not a GUID (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"
                        ));
                    }
                    UserAssigned::ResourceId(v)
                        if !(v.to_ascii_lowercase().starts_with("/subscriptions/")
                            && v.to_ascii_lowercase().contains(
                                "/providers/microsoft.managedidentity/userassignedidentities/",
                            )) =>
                    {
                        return Err(format!(
                            "{flag} {v:?} is not a user-assigned identity's resource ID \
                             (/subscriptions/.../providers/Microsoft.ManagedIdentity/userAssignedIdentities/NAME)"
                        ));
                    }
                    _ => {}
                }
                Some(id)
            }
        };
        let endpoint =
            set(choice.imds_endpoint).unwrap_or_else(|| DEFAULT_IMDS_ENDPOINT.to_string());
        imds_base(&endpoint)?;
        Ok(AuthSettings::ManagedIdentity {
            user_assigned,
            endpoint,
        })
    }

    /// The credential these settings describe.
    pub fn credential(&self) -> Result<Arc<dyn TokenCredential>, String> {
        match self {
            AuthSettings::WorkloadIdentity {
                tenant_id,
                client_id,
                token_file,
                authority_host,
            } => Ok(Arc::new(WorkloadIdentity::new(
                azure_core::new_http_client(),
                tenant_id,
                client_id,
                token_file.clone(),
                authority_host,
            )?)),
            AuthSettings::ManagedIdentity {
                user_assigned,
                endpoint,
            } => Ok(Arc::new(ManagedIdentity::new(
                endpoint,
                user_assigned.clone(),
            )?)),
        }
    }
}

/// The IMDS base URL, refused unless it is an http(s) URL.
fn imds_base(endpoint: &str) -> Result<Url, String> {
    let url =
        Url::parse(endpoint).map_err(|e| format!("--azure-imds-endpoint {endpoint:?}: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(format!(
            "--azure-imds-endpoint {endpoint:?}: must be an http(s) URL such as {DEFAULT_IMDS_ENDPOINT}"
        ));
    }
    Ok(url)
}

/// The VM's managed identity, system- or user-assigned, through the Instance Metadata
/// Service: `GET /metadata/identity/oauth2/token?api-version=2018-02-01&resource=R` with
/// `Metadata: true` (plus `client_id=`, `object_id=` or `msi_res_id=` for a user-assigned
/// identity). Tokens are cached per resource until shortly before they expire.
#[derive(Debug)]
pub struct ManagedIdentity {
    http: reqwest::Client,
    endpoint: Url,
    user_assigned: Option<UserAssigned>,
    /// Tries after the first for answers IMDS documents as transient (404, 410, 429, 5xx)
    /// and for connection failures.
    pub retries: u32,
    /// The first pause between tries; doubled after each.
    pub retry_delay: std::time::Duration,
    cache: Mutex<Vec<(String, AccessToken)>>,
}

impl ManagedIdentity {
    /// A credential for the system-assigned identity (`None`) or a user-assigned one, from
    /// the IMDS at `endpoint`.
    pub fn new(endpoint: &str, user_assigned: Option<UserAssigned>) -> Result<Self, String> {
        crate::telemetry::install_tls_provider();
        let endpoint = imds_base(endpoint)?;
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(2))
            .timeout(std::time::Duration::from_secs(10))
            .build()
            .map_err(|e| format!("managed identity: HTTP client: {e}"))?;
        Ok(ManagedIdentity {
            http,
            endpoint,
            user_assigned,
            retries: 3,
            retry_delay: std::time::Duration::from_millis(500),
            cache: Mutex::new(Vec::new()),
        })
    }

    /// Which identity, for errors.
    fn who(&self) -> String {
        self.user_assigned.as_ref().map_or_else(
            || "the system-assigned identity".to_string(),
            |u| u.to_string(),
        )
    }

    /// The token URL for `resource`.
    fn token_url(&self, resource: &str) -> Url {
        let mut url = self.endpoint.clone();
        url.set_path(IMDS_TOKEN_PATH);
        url.set_query(None);
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("api-version", IMDS_API_VERSION)
                .append_pair("resource", resource);
            if let Some(u) = &self.user_assigned {
                let (k, v) = u.query();
                q.append_pair(k, v);
            }
        }
        url
    }

    /// One token for `resource` from IMDS, retrying what IMDS says is transient.
    async fn fetch(&self, resource: &str) -> azure_core::Result<AccessToken> {
        let url = self.token_url(resource);
        let mut shown = url.clone();
        shown.set_query(None);
        let fail = |message: String| {
            AzError::with_message(ErrorKind::Credential, || {
                format!(
                    "managed identity: {} at {shown} for {resource:?}: {message}; {IDENTITY_DOCS}",
                    self.who()
                )
            })
        };
        let mut attempt = 0;
        loop {
            let last = attempt >= self.retries;
            let answer = self
                .http
                .get(url.clone())
                .header("Metadata", "true")
                .send()
                .await;
            let response = match answer {
                Ok(r) => r,
                Err(e) if !last => {
                    tracing::debug!(error = %e, attempt, "IMDS unreachable; retrying");
                    attempt += 1;
                    tokio::time::sleep(self.retry_delay * 2u32.pow(attempt - 1)).await;
                    continue;
                }
                Err(e) => {
                    return Err(fail(format!(
                        "IMDS did not answer ({e}; tried {} times): is this an Azure VM with a managed identity, or is --azure-imds-endpoint wrong?",
                        attempt + 1
                    )));
                }
            };
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            if status.is_success() {
                return parse_imds_token(&body).map_err(fail);
            }
            let transient = matches!(status.as_u16(), 404 | 410 | 429 | 500..=599);
            if transient && !last {
                attempt += 1;
                tokio::time::sleep(self.retry_delay * 2u32.pow(attempt - 1)).await;
                continue;
            }
            // IMDS errors are OAuth-style: {"error": ..., "error_description": ...}.
            let detail = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| {
                    let error = v.get("error")?.as_str()?.to_string();
                    Some(match v.get("error_description").and_then(|d| d.as_str()) {
                        Some(d) => format!("{error}: {d}"),
                        None => error,
                    })
                })
                .unwrap_or_else(|| body.chars().take(300).collect());
            return Err(fail(format!("IMDS answered HTTP {status}: {detail}")));
        }
    }
}

/// A number IMDS may send as a string (`"3599"`) or a number.
fn number_field(v: &serde_json::Value, key: &str) -> Option<i64> {
    match v.get(key)? {
        serde_json::Value::String(s) => s.trim().parse().ok(),
        n => n.as_i64(),
    }
}

/// The token and its expiry from an IMDS answer: `expires_on` (epoch seconds) when given,
/// else now plus `expires_in`.
fn parse_imds_token(body: &str) -> Result<AccessToken, String> {
    let v: serde_json::Value =
        serde_json::from_str(body).map_err(|e| format!("the token answer is not JSON: {e}"))?;
    let token = v
        .get("access_token")
        .and_then(|t| t.as_str())
        .filter(|t| !t.is_empty())
        .ok_or("the token answer has no access_token")?;
    let expires_on = match (
        number_field(&v, "expires_on"),
        number_field(&v, "expires_in"),
    ) {
        (Some(on), _) => OffsetDateTime::from_unix_timestamp(on)
            .map_err(|e| format!("the token answer's expires_on {on}: {e}"))?,
        (None, Some(secs)) => OffsetDateTime::now_utc() + time::Duration::seconds(secs),
        (None, None) => return Err("the token answer has neither expires_on nor expires_in".into()),
    };
    Ok(AccessToken::new(token.to_string(), expires_on))
}

/// The v1 resource IMDS takes for a v2 scope (`https://x/.default` → `https://x`).
fn resource_of(scopes: &[&str]) -> azure_core::Result<String> {
    match scopes {
        [scope] => Ok(scope
            .strip_suffix(azure_core::auth::DEFAULT_SCOPE_SUFFIX)
            .unwrap_or(scope)
            .to_string()),
        _ => Err(AzError::with_message(ErrorKind::Credential, || {
            format!("managed identity: exactly one scope per token, got {scopes:?}")
        })),
    }
}

#[async_trait::async_trait]
impl TokenCredential for ManagedIdentity {
    async fn get_token(&self, scopes: &[&str]) -> azure_core::Result<AccessToken> {
        let resource = resource_of(scopes)?;
        let mut cache = self.cache.lock().await;
        let now = OffsetDateTime::now_utc();
        if let Some((_, t)) = cache
            .iter()
            .find(|(r, t)| *r == resource && t.expires_on - REFRESH_MARGIN > now)
        {
            return Ok(t.clone());
        }
        let token = self.fetch(&resource).await?;
        cache.retain(|(r, _)| *r != resource);
        cache.push((resource, token.clone()));
        Ok(token)
    }

    async fn clear_cache(&self) -> azure_core::Result<()> {
        self.cache.lock().await.clear();
        Ok(())
    }
}

/// Workload identity that re-reads the federated token file for every exchange.
#[derive(Debug)]
pub struct WorkloadIdentity {
    http: Arc<dyn HttpClient>,
    tenant_id: String,
    client_id: String,
    token_file: PathBuf,
    authority: Url,
    cache: Mutex<Vec<(Vec<String>, AccessToken)>>,
}

impl WorkloadIdentity {
    /// A credential for `client_id` in `tenant_id`, presenting the token in `token_file` to
    /// the authority at `authority_host`.
    pub fn new(
        http: Arc<dyn HttpClient>,
        tenant_id: &str,
        client_id: &str,
        token_file: PathBuf,
        authority_host: &str,
    ) -> Result<Self, String> {
        let authority = Url::parse(authority_host)
            .map_err(|e| format!("AZURE_AUTHORITY_HOST {authority_host:?}: {e}"))?;
        if tenant_id.is_empty() || client_id.is_empty() {
            return Err("workload identity needs AZURE_TENANT_ID and AZURE_CLIENT_ID".to_string());
        }
        Ok(WorkloadIdentity {
            http,
            tenant_id: tenant_id.to_string(),
            client_id: client_id.to_string(),
            token_file,
            authority,
            cache: Mutex::new(Vec::new()),
        })
    }

    /// Reads the projected token, refusing what cannot be an assertion.
    fn assertion(&self) -> azure_core::Result<String> {
        let file = self.token_file.display();
        let text = std::fs::read_to_string(&self.token_file).map_err(|e| {
            AzError::with_message(ErrorKind::Credential, || {
                format!(
                    "workload identity: reading the federated token file {file}: {e}; {IDENTITY_DOCS}"
                )
            })
        })?;
        let token = text.trim();
        if token.is_empty() {
            return Err(AzError::with_message(ErrorKind::Credential, || {
                format!(
                    "workload identity: the federated token file {file} is empty; {IDENTITY_DOCS}"
                )
            }));
        }
        // A service-account token is a JWT: three base64url parts.
        let jwt_like = token.split('.').count() == 3
            && token
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '='));
        if !jwt_like {
            return Err(AzError::with_message(ErrorKind::Credential, || {
                format!(
                    "workload identity: the federated token file {file} does not hold a JWT (expected header.payload.signature)"
                )
            }));
        }
        Ok(token.to_string())
    }
}

#[async_trait::async_trait]
impl TokenCredential for WorkloadIdentity {
    async fn get_token(&self, scopes: &[&str]) -> azure_core::Result<AccessToken> {
        let key: Vec<String> = scopes.iter().map(|s| (*s).to_string()).collect();
        let mut cache = self.cache.lock().await;
        let now = OffsetDateTime::now_utc();
        if let Some((_, t)) = cache
            .iter()
            .find(|(k, t)| *k == key && t.expires_on - REFRESH_MARGIN > now)
        {
            return Ok(t.clone());
        }
        let assertion = self.assertion()?;
        let response = azure_identity::federated_credentials_flow::perform(
            self.http.clone(),
            &self.client_id,
            &assertion,
            scopes,
            &self.tenant_id,
            &self.authority,
        )
        .await
        .map_err(|e| {
            AzError::full(
                ErrorKind::Credential,
                e,
                format!(
                    "workload identity: exchanging the token in {} at {}; {IDENTITY_DOCS}",
                    self.token_file.display(),
                    self.authority
                ),
            )
        })?;
        let expires_on = response.expires_on.unwrap_or_else(|| {
            now + time::Duration::seconds(i64::try_from(response.expires_in).unwrap_or(0))
        });
        let token = AccessToken::new(response.access_token().clone(), expires_on);
        cache.retain(|(k, _)| *k != key);
        cache.push((key, token.clone()));
        Ok(token)
    }

    async fn clear_cache(&self) -> azure_core::Result<()> {
        self.cache.lock().await.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GUID: &str = "7c9f2a4e-1b3d-4e5f-8a6b-0c1d2e3f4a5b";

    #[test]
    fn workload_identity_is_chosen_when_the_webhook_variables_are_set() {
        let env = |k: &str| match k {
            "AZURE_TENANT_ID" => Some("t".to_string()),
            "AZURE_CLIENT_ID" => Some("c".to_string()),
            "AZURE_FEDERATED_TOKEN_FILE" => Some("/var/run/token".to_string()),
            "AZURE_AUTHORITY_HOST" => Some("http://127.0.0.1:1".to_string()),
            _ => None,
        };
        assert_eq!(
            AuthSettings::from_env(env),
            Ok(AuthSettings::WorkloadIdentity {
                tenant_id: "t".to_string(),
                client_id: "c".to_string(),
                token_file: PathBuf::from("/var/run/token"),
                authority_host: "http://127.0.0.1:1".to_string(),
            })
        );
        assert_eq!(
            AuthSettings::from_env(|_| None),
            Ok(AuthSettings::ManagedIdentity {
                user_assigned: None,
                endpoint: DEFAULT_IMDS_ENDPOINT.to_string(),
            })
        );
    }

    #[test]
    fn a_client_id_without_a_token_file_selects_a_user_assigned_identity() {
        let env = |k: &str| match k {
            "AZURE_TENANT_ID" => Some("t".to_string()),
            "AZURE_CLIENT_ID" => Some(GUID.to_string()),
            "AZURE_POD_IDENTITY_AUTHORITY_HOST" => Some("http://127.0.0.1:9".to_string()),
            _ => None,
        };
        assert_eq!(
            AuthSettings::from_env(env),
            Ok(AuthSettings::ManagedIdentity {
                user_assigned: Some(UserAssigned::ClientId(GUID.to_string())),
                endpoint: "http://127.0.0.1:9".to_string(),
            })
        );
        let rid = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/kubelet";
        assert_eq!(
            AuthSettings::select(IdentityChoice {
                resource_id: Some(rid.to_string()),
                ..IdentityChoice::default()
            }),
            Ok(AuthSettings::ManagedIdentity {
                user_assigned: Some(UserAssigned::ResourceId(rid.to_string())),
                endpoint: DEFAULT_IMDS_ENDPOINT.to_string(),
            })
        );
    }

    #[test]
    fn bad_identity_settings_are_refused_naming_the_flag_and_value() {
        let err = |c: IdentityChoice| AuthSettings::select(c).expect_err("refused");
        let e = err(IdentityChoice {
            client_id: Some("kubelet".to_string()),
            ..IdentityChoice::default()
        });
        assert!(
            e.contains("--azure-client-id") && e.contains("\"kubelet\"") && e.contains("GUID"),
            "{e}"
        );
        let e = err(IdentityChoice {
            object_id: Some("12".to_string()),
            ..IdentityChoice::default()
        });
        assert!(
            e.contains("--azure-managed-identity-object-id") && e.contains("\"12\""),
            "{e}"
        );
        let e = err(IdentityChoice {
            resource_id: Some("/subscriptions/s/vm".to_string()),
            ..IdentityChoice::default()
        });
        assert!(
            e.contains("--azure-managed-identity-resource-id") && e.contains("/subscriptions/s/vm"),
            "{e}"
        );
        let e = err(IdentityChoice {
            client_id: Some(GUID.to_string()),
            object_id: Some(GUID.to_string()),
            ..IdentityChoice::default()
        });
        assert!(
            e.contains("--azure-client-id and --azure-managed-identity-object-id"),
            "{e}"
        );
        let e = err(IdentityChoice {
            imds_endpoint: Some("169.254.169.254".to_string()),
            ..IdentityChoice::default()
        });
        assert!(
            e.contains("--azure-imds-endpoint") && e.contains("169.254.169.254"),
            "{e}"
        );
        let e = err(IdentityChoice {
            tenant_id: Some("t".to_string()),
            client_id: Some("c".to_string()),
            federated_token_file: Some("/var/run/token".to_string()),
            object_id: Some(GUID.to_string()),
            ..IdentityChoice::default()
        });
        assert!(
            e.contains("--azure-managed-identity-object-id")
                && e.contains("AZURE_FEDERATED_TOKEN_FILE"),
            "{e}"
        );
    }

    #[test]
    fn imds_answers_are_read_with_string_or_number_expiries() {
        let t = parse_imds_token(
            r#"{"access_token":"abc","expires_in":"3599","expires_on":"1800003599","resource":"https://management.azure.com","token_type":"Bearer"}"#,
        )
        .expect("token");
        assert_eq!(t.token.secret(), "abc");
        assert_eq!(t.expires_on.unix_timestamp(), 1_800_003_599);
        let t = parse_imds_token(r#"{"access_token":"abc","expires_in":60}"#).expect("token");
        let left = t.expires_on - OffsetDateTime::now_utc();
        assert!(left > time::Duration::seconds(50) && left <= time::Duration::seconds(60));
        assert!(
            parse_imds_token(r#"{"expires_in":60}"#)
                .unwrap_err()
                .contains("access_token")
        );
        assert!(
            parse_imds_token(r#"{"access_token":"abc"}"#)
                .unwrap_err()
                .contains("expires")
        );
        assert_eq!(
            resource_of(&["https://prometheus.monitor.azure.com/.default"]).expect("one"),
            "https://prometheus.monitor.azure.com"
        );
    }
}
