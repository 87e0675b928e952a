//! The sync client's connections below gRPC: TCP to the control plane's
//! address and, for an `https://` URL, TLS verified against
//! `--control-plane-ca` (or the system roots) with the client certificate of
//! `--client-cert` when the control plane asks for one. An `https://` URL is
//! never served in clear. The files are read again for every connection, so
//! renewed certificates are used from the next reconnect on without a restart.

use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::rt::TokioIo;
use rustls::client::ResolvesClientCert;
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, SignatureScheme};
use rustls_pki_types::ServerName;
use sluice_proto::tls::{PemFileError, SYNC_ALPN, certificates, private_key, roots};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// How the data plane authenticates the control plane, and itself to it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncTls {
    /// CA bundle the control plane's certificate must chain to; system roots when absent.
    pub control_plane_ca: Option<PathBuf>,
    /// Client certificate and key, for a control plane that requires mutual TLS.
    pub client_identity: Option<(PathBuf, PathBuf)>,
}

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("the control plane URL must start with http:// or https://, got {0:?}")]
    Scheme(String),
    #[error(
        "--control-plane-ca, --client-cert and --client-key only apply to an https:// control plane URL; \
         {url} would send the cluster token and every snapshot in clear"
    )]
    TlsFilesWithoutHttps { url: String },
    #[error("the control plane URL {0} has no host")]
    NoHost(String),
    #[error("cannot connect to {addr}: {source}")]
    Tcp { addr: String, source: std::io::Error },
    #[error(transparent)]
    File(#[from] PemFileError),
    #[error("cannot use the client certificate: {0}")]
    ClientIdentity(String),
    #[error("{0:?} is not a valid TLS server name")]
    ServerName(String),
    #[error("TLS handshake with the control plane at {addr} failed: {reason}")]
    Handshake { addr: String, reason: String },
}

impl TransportError {
    /// Failures of the TLS setup (files, certificates), not of the network.
    pub fn needs_operator(&self) -> bool {
        matches!(self, Self::File(_) | Self::ClientIdentity(_) | Self::ServerName(_) | Self::Handshake { .. })
    }
}

/// A connection to the control plane, in clear or over TLS.
pub type Connection = TokioIo<Stream>;

pub enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// Connects tonic's channel: `Service<Uri>` as `Endpoint::connect_with_connector` takes it.
#[derive(Debug, Clone)]
pub struct Connector {
    tls: Option<Arc<SyncTls>>,
    without_certificate: Arc<WithoutClientCertificate>,
}

impl Connector {
    /// Checks the URL against the TLS settings once at start-up, so that a
    /// mistake fails there instead of in every reconnect. `http://` beyond
    /// loopback is allowed (a private network may be trusted), but logged.
    pub fn new(url: &str, tls: SyncTls) -> Result<Self, TransportError> {
        let uri: Uri = url.parse().map_err(|_| TransportError::Scheme(url.to_owned()))?;
        let host = uri.host().filter(|h| !h.is_empty()).ok_or_else(|| TransportError::NoHost(url.to_owned()))?;
        match uri.scheme_str() {
            Some("https") => Ok(Self { tls: Some(Arc::new(tls)), without_certificate: Arc::default() }),
            Some("http") if tls != SyncTls::default() => {
                Err(TransportError::TlsFilesWithoutHttps { url: url.to_owned() })
            }
            Some("http") => {
                if !is_loopback(host) {
                    tracing::warn!(
                        control_plane = url,
                        "the sync channel is not encrypted: the cluster token and every secret in the snapshots \
                         cross the network in clear; use an https:// control plane URL"
                    );
                }
                Ok(Self { tls: None, without_certificate: Arc::default() })
            }
            _ => Err(TransportError::Scheme(url.to_owned())),
        }
    }
}

impl Connector {
    /// Whether the control plane asked, in the last handshake, for a client
    /// certificate that this data plane does not have. Under TLS 1.3 the
    /// refusal comes after our side of the handshake, as an alert the call
    /// may never see (only "connection closed"); this says why regardless.
    pub fn certificate_was_required(&self) -> bool {
        self.without_certificate.asked.load(Ordering::Relaxed)
    }
}

fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost") || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

impl tower_service::Service<Uri> for Connector {
    type Response = Connection;
    type Error = TransportError;
    type Future = Pin<Box<dyn Future<Output = Result<Connection, TransportError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), TransportError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let tls = self.tls.clone();
        let without_certificate = self.without_certificate.clone();
        without_certificate.asked.store(false, Ordering::Relaxed);
        Box::pin(async move { connect(uri, tls.as_deref(), without_certificate).await.map(TokioIo::new) })
    }
}

async fn connect(
    uri: Uri,
    tls: Option<&SyncTls>,
    without_certificate: Arc<WithoutClientCertificate>,
) -> Result<Stream, TransportError> {
    let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']').to_owned();
    let port = uri.port_u16().unwrap_or(if tls.is_some() { 443 } else { 80 });
    let addr = format!("{host}:{port}");
    let tcp = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|source| TransportError::Tcp { addr: addr.clone(), source })?;
    let _ = tcp.set_nodelay(true);
    let Some(tls) = tls else { return Ok(Stream::Plain(tcp)) };
    let config = client_config(tls, without_certificate)?;
    let name = ServerName::try_from(host.clone()).map_err(|_| TransportError::ServerName(host))?;
    let stream = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| TransportError::Handshake { addr, reason: explain_handshake(&e, tls) })?;
    Ok(Stream::Tls(Box::new(stream)))
}

fn client_config(
    tls: &SyncTls,
    without_certificate: Arc<WithoutClientCertificate>,
) -> Result<ClientConfig, TransportError> {
    let roots = match &tls.control_plane_ca {
        Some(ca) => roots(ca)?,
        None => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            roots
        }
    };
    let builder = ClientConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TransportError::ClientIdentity(e.to_string()))?
        .with_root_certificates(roots);
    let mut config = match &tls.client_identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(certificates(cert)?, private_key(key)?)
            .map_err(|e| TransportError::ClientIdentity(format!("{} with {}: {e}", cert.display(), key.display())))?,
        None => builder.with_client_cert_resolver(without_certificate),
    };
    config.alpn_protocols = vec![SYNC_ALPN.to_vec()];
    Ok(config)
}

/// Sends no client certificate, like `with_no_client_auth`, but remembers
/// that the control plane asked for one.
#[derive(Debug, Default)]
struct WithoutClientCertificate {
    asked: AtomicBool,
}

impl ResolvesClientCert for WithoutClientCertificate {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        self.asked.store(true, Ordering::Relaxed);
        None
    }

    fn has_certs(&self) -> bool {
        false
    }
}

/// rustls says `invalid peer certificate: UnknownIssuer`; say which setting that points at.
fn explain_handshake(error: &std::io::Error, tls: &SyncTls) -> String {
    let text = error.to_string();
    if !text.contains("invalid peer certificate") {
        return text;
    }
    match &tls.control_plane_ca {
        Some(ca) => format!(
            "{text}: the control plane's certificate does not verify against --control-plane-ca {} \
             (wrong CA, expired, or not issued for this host name)",
            ca.display()
        ),
        None => format!(
            "{text}: the control plane's certificate does not verify against the system's CAs; \
             pass the cluster CA with --control-plane-ca"
        ),
    }
}

pub const CERTIFICATE_REQUIRED: &str =
    "the control plane requires a client certificate (mutual TLS): pass --client-cert and --client-key";

/// What a TLS alert from the control plane after the handshake means, if the
/// error text carries one about our client certificate.
pub fn refused_client_certificate(error: &str) -> Option<&'static str> {
    if error.contains("CertificateRequired") {
        Some(CERTIFICATE_REQUIRED)
    } else if ["BadCertificate", "UnknownCA", "CertificateExpired", "CertificateUnknown", "DecryptError"]
        .iter()
        .any(|alert| error.contains(alert))
    {
        Some(
            "the control plane refused the client certificate of --client-cert: it must be issued by the CA of its --grpc-client-ca and be valid now",
        )
    } else {
        None
    }
}

impl tokio::io::AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_tls_settings_must_agree() {
        let files = SyncTls { control_plane_ca: Some("ca.pem".into()), client_identity: None };
        assert!(Connector::new("https://cp:9090", files.clone()).is_ok_and(|c| c.tls.is_some()));
        assert!(Connector::new("https://cp:9090", SyncTls::default()).is_ok_and(|c| c.tls.is_some()));
        assert!(Connector::new("http://127.0.0.1:9090", SyncTls::default()).is_ok_and(|c| c.tls.is_none()));
        assert!(matches!(Connector::new("http://cp:9090", files), Err(TransportError::TlsFilesWithoutHttps { .. })));
        assert!(matches!(Connector::new("grpc://cp:9090", SyncTls::default()), Err(TransportError::Scheme(_))));
    }

    #[test]
    fn loopback_hosts() {
        for (host, loopback) in
            [("localhost", true), ("127.0.0.1", true), ("[::1]", true), ("10.0.0.1", false), ("cp.internal", false)]
        {
            assert_eq!(is_loopback(host), loopback, "{host}");
        }
    }
}
