//! Credentials for ARM (and Azure Managed Prometheus): workload identity, or the VM's
//! managed identity.
//!
//! azure_identity 0.21's `WorkloadIdentityCredential` reads the projected service-account
//! token once, when it is created; once that token rotates (kubelet rewrites it about every
//! hour) every later exchange would present a stale assertion. [`WorkloadIdentity`] reads
//! the file on every exchange instead and hands it to the crate's own
//! `federated_credentials_flow::perform`, so the request AAD sees is the crate's.

use std::path::PathBuf;
use std::sync::Arc;

use azure_core::auth::{AccessToken, TokenCredential};
use azure_core::error::{Error as AzError, ErrorKind};
use azure_core::{HttpClient, Url};
use time::OffsetDateTime;
use tokio::sync::Mutex;

/// The public cloud's AAD authority.
pub const DEFAULT_AUTHORITY_HOST: &str = "https://login.microsoftonline.com";
/// Scope of Azure Managed Prometheus queries.
pub const PROMETHEUS_SCOPE: &str = "https://prometheus.monitor.azure.com/.default";
/// A token is exchanged again this long before it expires.
const REFRESH_MARGIN: time::Duration = time::Duration::seconds(20);

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
    /// The VM's system-assigned managed identity through IMDS.
    ManagedIdentity,
}

impl AuthSettings {
    /// Workload identity when the webhook's variables are set, else managed identity.
    /// `env` looks a variable up (the process environment in the binary).
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Self {
        let get = |k: &str| env(k).filter(|v| !v.is_empty());
        match (
            get("AZURE_TENANT_ID"),
            get("AZURE_CLIENT_ID"),
            get("AZURE_FEDERATED_TOKEN_FILE"),
        ) {
            (Some(tenant_id), Some(client_id), Some(file)) => AuthSettings::WorkloadIdentity {
                tenant_id,
                client_id,
                token_file: PathBuf::from(file),
                authority_host: get("AZURE_AUTHORITY_HOST")
                    .unwrap_or_else(|| DEFAULT_AUTHORITY_HOST.to_string()),
            },
            _ => AuthSettings::ManagedIdentity,
        }
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
            AuthSettings::ManagedIdentity => Ok(Arc::new(
                azure_identity::VirtualMachineManagedIdentityCredential::new(
                    azure_identity::TokenCredentialOptions::default(),
                ),
            )),
        }
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
                format!("workload identity: reading the federated token file {file}: {e}")
            })
        })?;
        let token = text.trim();
        if token.is_empty() {
            return Err(AzError::with_message(ErrorKind::Credential, || {
                format!("workload identity: the federated token file {file} is empty")
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
                    "workload identity: exchanging the token in {} at {}",
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
            AuthSettings::WorkloadIdentity {
                tenant_id: "t".to_string(),
                client_id: "c".to_string(),
                token_file: PathBuf::from("/var/run/token"),
                authority_host: "http://127.0.0.1:1".to_string(),
            }
        );
        assert_eq!(
            AuthSettings::from_env(|_| None),
            AuthSettings::ManagedIdentity
        );
    }
}
