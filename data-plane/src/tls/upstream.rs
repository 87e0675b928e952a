//! TLS origination, on the last hop: turns an upstream's `tls` settings into
//! the rustls client config and the hyper connector its pooled clients use.
//! Built when the upstream pool is built, i.e. only when the upstream's
//! definition (or its client certificate) changes.

use std::sync::{Arc, OnceLock};

use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::client::ResolvesClientCert;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use sluice_proto::v1;

use super::{CertificateSet, CompiledCertificate};

#[derive(Debug, thiserror::Error)]
pub enum UpstreamTlsError {
    #[error("tls.ca_bundle_pem: {0}")]
    CaBundle(String),
    #[error("tls.sni `{0}` is not a valid server name")]
    Sni(String),
    #[error("tls.client_certificate `{0}` is not in the snapshot")]
    MissingClientCertificate(String),
    #[error("cannot build the TLS client config: {0}")]
    Config(#[from] rustls::Error),
}

/// What a pool needs to open TLS connections to its targets.
#[derive(Debug, Clone)]
pub struct UpstreamTls {
    config: ClientConfig,
    /// `tls.sni` when set; otherwise each target's host is sent and verified.
    server_name: Option<ServerName<'static>>,
    /// The client certificate presented, kept so that a pool is rebuilt when
    /// the snapshot changes that certificate but not the upstream.
    client_certificate: Option<Arc<CompiledCertificate>>,
}

impl UpstreamTls {
    /// `needs_roots` is false for an upstream with only `http://` targets:
    /// the config is then never used, so the system roots are not loaded.
    pub fn compile(
        upstream: &v1::Upstream,
        certificates: &CertificateSet,
        needs_roots: bool,
    ) -> Result<UpstreamTls, UpstreamTlsError> {
        let tls = upstream.tls.clone().unwrap_or_default();
        let builder = ClientConfig::builder_with_provider(super::provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
        let builder = if tls.insecure_skip_verify {
            tracing::warn!(
                upstream = %upstream.name,
                "tls.insecure_skip_verify is set: the upstream's certificates are NOT verified"
            );
            builder.dangerous().with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(super::provider())))
        } else if !tls.ca_bundle_pem.is_empty() {
            let roots = sluice_proto::tls::ca_bundle(&tls.ca_bundle_pem)
                .map_err(|e| UpstreamTlsError::CaBundle(e.to_string()))?;
            builder.with_root_certificates(roots)
        } else if needs_roots {
            builder.with_root_certificates(system_roots())
        } else {
            builder.with_root_certificates(RootCertStore::empty())
        };
        let client_certificate = match tls.client_certificate.as_str() {
            "" => None,
            name => Some(
                certificates
                    .get(name)
                    .cloned()
                    .ok_or_else(|| UpstreamTlsError::MissingClientCertificate(name.to_string()))?,
            ),
        };
        let config = match &client_certificate {
            Some(certificate) => builder.with_client_cert_resolver(Arc::new(ClientIdentity(certificate.key.clone()))),
            None => builder.with_no_client_auth(),
        };
        let server_name = match tls.sni.as_str() {
            "" => None,
            sni => Some(sluice_proto::tls::server_name(sni).map_err(|_| UpstreamTlsError::Sni(sni.to_string()))?),
        };
        Ok(UpstreamTls { config, server_name, client_certificate })
    }

    /// Whether `self` presents the same client certificate as `other`
    /// (the same compiled certificate, or none on both sides).
    pub fn same_client_certificate(&self, other: Option<&Arc<CompiledCertificate>>) -> bool {
        match (&self.client_certificate, other) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// A connector for `http://` and `https://` targets. With `http2`, ALPN
    /// offers only h2, matching the client's HTTP/2-only mode; otherwise no
    /// ALPN is sent and the server speaks HTTP/1.1.
    pub fn connector(&self, mut http: HttpConnector, http2: bool) -> HttpsConnector<HttpConnector> {
        // The TCP connector must let https URIs through; the TLS layer on top
        // decides per scheme.
        http.enforce_http(false);
        let builder = HttpsConnectorBuilder::new().with_tls_config(self.config.clone()).https_or_http();
        let builder = match &self.server_name {
            Some(name) => builder.with_server_name_resolver(FixedServerNameResolver::new(name.clone())),
            None => builder,
        };
        if http2 { builder.enable_http2().wrap_connector(http) } else { builder.enable_http1().wrap_connector(http) }
    }
}

/// The operating system's trusted roots, read once per process: reading the
/// store costs milliseconds and it does not change under a running process.
fn system_roots() -> Arc<RootCertStore> {
    static ROOTS: OnceLock<Arc<RootCertStore>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let loaded = rustls_native_certs::load_native_certs();
            for error in &loaded.errors {
                tracing::warn!(%error, "cannot read part of the system root certificates");
            }
            let mut roots = RootCertStore::empty();
            let (added, ignored) = roots.add_parsable_certificates(loaded.certs);
            if roots.is_empty() {
                tracing::warn!("no system root certificates: https upstreams need tls.ca_bundle_pem");
            } else {
                tracing::debug!(added, ignored, "loaded the system root certificates");
            }
            Arc::new(roots)
        })
        .clone()
}

/// Presents one fixed certificate whenever the upstream asks for one.
#[derive(Debug)]
struct ClientIdentity(Arc<CertifiedKey>);

impl ResolvesClientCert for ClientIdentity {
    fn resolve(&self, _root_hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// `insecure_skip_verify`: any certificate for any name is accepted. The
/// handshake signatures are still checked, which costs nothing and keeps the
/// connection bound to the presented key.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(tls: v1::UpstreamTls) -> v1::Upstream {
        v1::Upstream {
            name: "u".into(),
            targets: vec![v1::Target { url: "https://127.0.0.1:1".into(), weight: 1 }],
            tls: Some(tls),
            ..Default::default()
        }
    }

    #[test]
    fn bad_settings_are_reported() {
        let certs = CertificateSet::default();
        let cases = [
            (v1::UpstreamTls { ca_bundle_pem: "junk".into(), ..Default::default() }, "no CERTIFICATE"),
            (v1::UpstreamTls { sni: "bad name!".into(), ..Default::default() }, "tls.sni"),
            (v1::UpstreamTls { client_certificate: "nope".into(), ..Default::default() }, "`nope` is not in"),
        ];
        for (tls, want) in cases {
            let err = UpstreamTls::compile(&upstream(tls), &certs, true).expect_err(want);
            assert!(err.to_string().contains(want), "{err}");
        }
    }

    #[test]
    fn ca_bundle_and_insecure_compile() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).unwrap();
        let certs = CertificateSet::default();
        let with_ca = v1::UpstreamTls { ca_bundle_pem: ca.pem(), sni: "api.internal".into(), ..Default::default() };
        let compiled = UpstreamTls::compile(&upstream(with_ca), &certs, true).unwrap();
        assert!(compiled.server_name.is_some() && compiled.same_client_certificate(None));
        let insecure = v1::UpstreamTls { insecure_skip_verify: true, ..Default::default() };
        assert!(UpstreamTls::compile(&upstream(insecure), &certs, true).is_ok());
    }
}
