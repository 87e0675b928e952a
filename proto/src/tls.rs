//! TLS material both planes read. From PEM files, for the sync channel: the
//! control plane's certificate and key (and the CA its data planes' client
//! certificates must chain to), a data plane's CA bundle and client identity.
//! From a snapshot: certificates served to clients or presented to upstreams,
//! an upstream's CA bundle and SNI name, which a data plane loads when it
//! compiles the snapshot and the control plane loads, with the same
//! functions, before it commits one. One reader, so both planes describe bad
//! material the same way and the control plane refuses what a data plane
//! would.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// The sync service is gRPC, which needs HTTP/2: both ends offer only `h2`.
pub const SYNC_ALPN: &[u8] = b"h2";

/// A PEM file that cannot be used, named with the reason.
#[derive(Debug, thiserror::Error)]
#[error("{}: {reason}", .path.display())]
pub struct PemFileError {
    pub path: PathBuf,
    pub reason: String,
}

fn error(path: &Path, reason: impl Into<String>) -> PemFileError {
    PemFileError { path: path.to_owned(), reason: reason.into() }
}

/// Every `CERTIFICATE` block of the file, leaf first for a chain.
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, PemFileError> {
    let bytes = std::fs::read(path).map_err(|e| error(path, e.to_string()))?;
    let certificates = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| error(path, format!("not a PEM certificate file: {e}")))?;
    if certificates.is_empty() {
        return Err(error(path, "holds no CERTIFICATE block"));
    }
    Ok(certificates)
}

/// The file's private key (PKCS#8, PKCS#1 or SEC1).
pub fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, PemFileError> {
    let bytes = std::fs::read(path).map_err(|e| error(path, e.to_string()))?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| error(path, format!("holds no usable PEM private key: {e}")))
}

/// The file's certificates as trust anchors.
pub fn roots(path: &Path) -> Result<RootCertStore, PemFileError> {
    let mut roots = RootCertStore::empty();
    for certificate in certificates(path)? {
        roots.add(certificate).map_err(|e| error(path, format!("holds a certificate that is not a usable CA: {e}")))?;
    }
    Ok(roots)
}

/// The one crypto provider (aws-lc-rs). Passed explicitly to every rustls
/// builder rather than installed as the process default, so no other crate's
/// choice of default can make a config pick another provider.
pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER.get_or_init(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider())).clone()
}

/// TLS material in a snapshot that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum MaterialError {
    #[error("cannot parse the PEM chain: {0}")]
    Chain(rustls_pki_types::pem::Error),
    #[error("the chain holds no CERTIFICATE block")]
    EmptyChain,
    #[error("cannot parse the private key: {0}")]
    Key(rustls_pki_types::pem::Error),
    #[error("the key does not fit the certificate: {0}")]
    KeyMismatch(rustls::Error),
    #[error("cannot parse PEM: {0}")]
    BundlePem(rustls_pki_types::pem::Error),
    #[error("not a usable CA certificate: {0}")]
    BundleCertificate(rustls::Error),
    #[error("holds no CERTIFICATE block")]
    EmptyBundle,
    #[error("`{0}` is not a valid server name")]
    ServerName(String),
}

/// A certificate chain (leaf first) and its private key, loaded and checked
/// to belong together: a mismatched pair would only fail at handshake time.
pub fn certified_key(chain_pem: &str, private_key_pem: &str) -> Result<CertifiedKey, MaterialError> {
    let chain = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(MaterialError::Chain)?;
    if chain.is_empty() {
        return Err(MaterialError::EmptyChain);
    }
    let key = PrivateKeyDer::from_pem_slice(private_key_pem.as_bytes()).map_err(MaterialError::Key)?;
    CertifiedKey::from_der(chain, key, &provider()).map_err(MaterialError::KeyMismatch)
}

/// An upstream's CA bundle as trust anchors.
pub fn ca_bundle(pem: &str) -> Result<RootCertStore, MaterialError> {
    let mut roots = RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        roots.add(certificate.map_err(MaterialError::BundlePem)?).map_err(MaterialError::BundleCertificate)?;
    }
    if roots.is_empty() {
        return Err(MaterialError::EmptyBundle);
    }
    Ok(roots)
}

/// The name sent (and verified) instead of each target's host: an upstream's `tls.sni`.
pub fn server_name(sni: &str) -> Result<ServerName<'static>, MaterialError> {
    ServerName::try_from(sni.to_owned()).map_err(|_| MaterialError::ServerName(sni.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unusable_files_are_named_with_the_reason() {
        let dir = std::env::temp_dir().join(format!("sluice-proto-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.pem");
        let text = dir.join("text.pem");
        std::fs::write(&text, "not pem").unwrap();
        let missing_err = certificates(&missing).unwrap_err().to_string();
        assert!(missing_err.starts_with(&missing.display().to_string()), "{missing_err}");
        assert!(certificates(&text).unwrap_err().to_string().contains("no CERTIFICATE"));
        assert!(private_key(&text).unwrap_err().to_string().contains("no usable PEM private key"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unusable_snapshot_material_is_refused_with_the_reason() {
        assert!(matches!(ca_bundle("not a certificate"), Err(MaterialError::EmptyBundle)));
        assert!(matches!(certified_key("not a certificate", "nor a key"), Err(MaterialError::EmptyChain)));
        assert!(matches!(server_name("bad name!"), Err(MaterialError::ServerName(_))));
        assert!(server_name("api.example.com").is_ok());
    }
}
