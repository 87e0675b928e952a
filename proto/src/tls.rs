//! TLS material of the sync channel, read from PEM files by both planes: the
//! control plane's certificate and key (and the CA its data planes' client
//! certificates must chain to), a data plane's CA bundle and client identity.
//! One reader, so both planes describe a bad file the same way.

use std::path::{Path, PathBuf};

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

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
}
