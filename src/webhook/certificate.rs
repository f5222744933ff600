//! The webhook's serving certificate: read from a mounted directory (`tls.crt`, `tls.key`,
//! optionally `ca.crt`, as a `kubernetes.io/tls` Secret or cert-manager writes them), or made
//! by the agent: a CA and a serving certificate signed by it, whose CA is the
//! `MutatingWebhookConfiguration`'s `caBundle`.
//!
//! A mounted certificate is read again every minute, so a renewal (the kubelet updates the
//! mounted Secret in place) is served without a restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// Why a serving certificate cannot be made or read.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    /// A file of the certificate directory cannot be read or parsed.
    #[error("--webhook-cert-dir: {path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The certificate or key is unusable for TLS.
    #[error("webhook certificate: {0}")]
    Invalid(String),
    /// Generating the certificate failed.
    #[error("generating the webhook certificate: {0}")]
    Generate(#[from] rcgen::Error),
}

/// A serving certificate with its key and the CA that clients trust it through, PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServingCertificate {
    /// The serving certificate (chain), PEM.
    pub cert_pem: String,
    /// Its private key, PEM.
    pub key_pem: String,
    /// The CA bundle for `caBundle`, PEM; `None` when a mounted directory has no `ca.crt`
    /// (the bundle is then someone else's to set, e.g. cert-manager's CA injector).
    pub ca_pem: Option<String>,
}

/// Makes a CA and a serving certificate for `hosts` (DNS names or IP addresses), valid for
/// ten years from an hour ago (clock skew).
pub fn generate(hosts: &[String]) -> Result<ServingCertificate, CertificateError> {
    let now = time::OffsetDateTime::now_utc();
    let (not_before, not_after) = (
        now - time::Duration::hours(1),
        now + time::Duration::days(3650),
    );
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, "tailor webhook CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.not_before = not_before;
    ca.not_after = not_after;
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(hosts.to_vec())?;
    leaf.distinguished_name.push(
        DnType::CommonName,
        hosts
            .first()
            .cloned()
            .unwrap_or_else(|| "tailor".to_string()),
    );
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = not_before;
    leaf.not_after = not_after;
    let cert = leaf.signed_by(&key, &issuer)?;
    Ok(ServingCertificate {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        ca_pem: Some(ca_cert.pem()),
    })
}

/// Reads `tls.crt`, `tls.key` and, when present, `ca.crt` from `dir`.
pub fn read_dir(dir: &Path) -> Result<ServingCertificate, CertificateError> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path).map_err(|e| CertificateError::File {
            path,
            message: e.to_string(),
        })
    };
    let ca_pem = match read("ca.crt") {
        Ok(ca) if !ca.trim().is_empty() => Some(ca),
        _ => None,
    };
    Ok(ServingCertificate {
        cert_pem: read("tls.crt")?,
        key_pem: read("tls.key")?,
        ca_pem,
    })
}

/// The rustls form of a certificate and key.
pub fn certified_key(cert: &ServingCertificate) -> Result<CertifiedKey, CertificateError> {
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| CertificateError::Invalid(format!("tls.crt: {e}")))?;
    if chain.is_empty() {
        return Err(CertificateError::Invalid(
            "tls.crt: no CERTIFICATE block".to_string(),
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes())
        .map_err(|e| CertificateError::Invalid(format!("tls.key: {e}")))?;
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(chain, key, &provider)
        .map_err(|e| CertificateError::Invalid(e.to_string()))
}

/// Serves whichever certificate was loaded last.
#[derive(Debug)]
pub struct Resolver(RwLock<Arc<CertifiedKey>>);

impl Resolver {
    /// A resolver serving `key`.
    pub fn new(key: CertifiedKey) -> Arc<Resolver> {
        Arc::new(Resolver(RwLock::new(Arc::new(key))))
    }

    /// Serves `key` from the next handshake on.
    pub fn set(&self, key: CertifiedKey) {
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(key);
    }

    /// Reads `dir` every `period` and serves what it holds; a read that fails keeps the
    /// certificate served before, with a warning.
    pub async fn reload_forever(self: Arc<Self>, dir: PathBuf, period: Duration) {
        let mut last = read_dir(&dir).ok();
        loop {
            tokio::time::sleep(period).await;
            match read_dir(&dir).and_then(|c| Ok((certified_key(&c)?, c))) {
                Ok((key, cert)) if last.as_ref() != Some(&cert) => {
                    self.set(key);
                    last = Some(cert);
                    tracing::info!(dir = %dir.display(), "webhook certificate reloaded");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "webhook certificate not reloaded"),
            }
        }
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.0
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_certificate_is_usable_for_tls_and_names_its_hosts() {
        let cert = generate(&["127.0.0.1".to_string(), "tailor.tailor.svc".to_string()])
            .expect("generated");
        assert!(
            cert.ca_pem
                .as_deref()
                .is_some_and(|c| c.contains("BEGIN CERTIFICATE"))
        );
        assert_ne!(cert.ca_pem.as_deref(), Some(cert.cert_pem.as_str()));
        certified_key(&cert).expect("rustls accepts the generated certificate");
    }

    #[test]
    fn a_missing_or_broken_certificate_directory_is_named_in_the_error() {
        let dir = std::env::temp_dir().join(format!("tailor-cert-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let e = read_dir(&dir).expect_err("no files");
        assert!(e.to_string().contains("tls.crt"), "{e}");
        std::fs::write(dir.join("tls.crt"), "not a certificate").expect("write");
        std::fs::write(dir.join("tls.key"), "not a key").expect("write");
        let cert = read_dir(&dir).expect("files exist");
        let e = certified_key(&cert).expect_err("garbage");
        assert!(e.to_string().contains("tls.crt"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
