//! TLS termination, at accept time on the HTTPS listener: its one
//! `ServerConfig`, built once at start, and the resolver that picks each
//! handshake's certificate from the routing table current at that moment.

use std::sync::Arc;

use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::routing::TableStore;

#[derive(Debug, thiserror::Error)]
#[error("cannot set up TLS termination: {0}")]
pub struct TlsSetupError(#[from] rustls::Error);

/// Chooses the server certificate by SNI from the current routing table.
/// Loading the table per handshake (not per config) is what lets a snapshot
/// replace certificates without rebuilding the config or touching open
/// connections: they finished their handshake and keep their session.
#[derive(Debug)]
struct SniResolver {
    tables: Arc<TableStore>,
}

impl SniResolver {
    fn new(tables: Arc<TableStore>) -> Self {
        SniResolver { tables }
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let sni = hello.server_name();
        // Before the first snapshot there is nothing to serve; rustls then
        // aborts the handshake with an alert instead of a wrong certificate.
        let Some(table) = self.tables.load() else {
            tracing::debug!(sni, "TLS handshake before any snapshot; refused");
            return None;
        };
        let picked = table.certificates().resolve(sni).map(|c| c.key.clone());
        if picked.is_none() {
            tracing::debug!(sni, "no certificate for this SNI and no default; handshake refused");
        }
        picked
    }
}

/// The HTTPS listener's config: TLS 1.3 and 1.2, ALPN h2 then http/1.1, and
/// resumption by session id (the default in-memory cache) and by stateless
/// tickets, so returning clients skip the full handshake.
pub fn tls_server_config(tables: Arc<TableStore>) -> Result<Arc<ServerConfig>, TlsSetupError> {
    let mut config = ServerConfig::builder_with_provider(crate::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(SniResolver::new(tables)));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config.ticketer = rustls::crypto::aws_lc_rs::Ticketer::new()?;
    Ok(Arc::new(config))
}
