//! TLS on both sides of the proxy, the bottom of the request path.
//! Termination: the snapshot's certificates are compiled into a
//! [`CertificateSet`] held by the routing table, from which the proxy's HTTPS
//! listener picks one per handshake (`proxy::tls_server_config`), so a new
//! snapshot's certificates apply to the next handshake with no restart.
//! Origination: each upstream with `https://` targets gets a rustls client
//! config (roots or CA bundle, SNI, client certificate) built at compile time.

mod certificates;
mod upstream;

use std::sync::Arc;

use rustls::crypto::CryptoProvider;

pub use certificates::{CertificateError, CertificateSet, CompiledCertificate};
pub use upstream::{UpstreamTls, UpstreamTlsError};

/// The one crypto provider of the process (see [`sluice_proto::tls::provider`]).
pub(crate) fn provider() -> Arc<CryptoProvider> {
    sluice_proto::tls::provider()
}
