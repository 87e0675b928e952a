//! TLS through a real data plane. Termination: SNI selection (exact,
//! wildcard, default, none), TLS 1.3 and 1.2, ALPN h2 and http/1.1, and a
//! certificate replaced by a new snapshot, on the in-process HTTPS listener
//! and on the real binary. Origination: TLS upstreams with a private CA, the
//! system roots, the insecure switch and mTLS. Certificates are made per test.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rcgen::ExtendedKeyUsagePurpose;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ProtocolVersion, RootCertStore, ServerConfig, SupportedProtocolVersion};
use serde_json::{Value, json};
use sluice_proto::v1;
use tokio::net::{TcpListener, TcpStream};

use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::certs::{Ca, Leaf, provider};
use crate::fake_cp::{FakeControlPlane, seal};
use crate::gateway::Gateway;
use crate::support::{DataPlane, client};

/// Answers every request with JSON describing what arrived, so tests can see
/// the forwarded scheme, the HTTP version on the last hop, and whether the
/// data plane presented a client certificate.
async fn echo(
    name: &'static str,
    client_cert: Option<String>,
    req: http::Request<Incoming>,
) -> Result<http::Response<Full<Bytes>>, Infallible> {
    let body = json!({
        "name": name,
        "path": req.uri().path(),
        "version": format!("{:?}", req.version()),
        "forwarded_proto": req.headers().get("x-forwarded-proto").and_then(|v| v.to_str().ok()),
        "client_cert": client_cert,
    });
    Ok(http::Response::new(Full::new(Bytes::from(body.to_string()))))
}

/// An upstream on 127.0.0.1: plain HTTP, or TLS with `server` (optionally
/// requiring a client certificate issued by `client_ca`). Serves HTTP/1.1
/// and HTTP/2 (by ALPN over TLS).
struct TestUpstream {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for TestUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestUpstream {
    async fn plain() -> Result<Self> {
        Self::start(None).await
    }

    async fn tls(server: &Leaf, client_ca: Option<&Ca>) -> Result<Self> {
        let builder = ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
        let builder = match client_ca {
            Some(ca) => builder.with_client_cert_verifier(
                WebPkiClientVerifier::builder_with_provider(ca.roots()?.into(), provider()).build()?,
            ),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(vec![server.der.clone()], server.key()?)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Self::start(Some(TlsAcceptor::from(Arc::new(config)))).await
    }

    async fn start(tls: Option<TlsAcceptor>) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let tls = tls.clone();
                connections.spawn(async move {
                    let builder = auto::Builder::new(TokioExecutor::new());
                    match tls {
                        None => {
                            let service = service_fn(|req| echo("plain", None, req));
                            let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                        }
                        Some(acceptor) => {
                            let Ok(stream) = acceptor.accept(stream).await else { return };
                            let client_cert =
                                stream.get_ref().1.peer_certificates().map(|c| format!("{} presented", c.len()));
                            let service = service_fn(move |req| echo("tls", client_cert.clone(), req));
                            let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                        }
                    }
                });
            }
        });
        Ok(TestUpstream { addr, task })
    }

    fn url(&self, scheme: &str) -> String {
        format!("{scheme}://{}", self.addr)
    }
}

/// GET through the gateway's plain listener: (status, body as JSON or string).
async fn get(gateway: &Gateway, path: &str) -> Result<(u16, Value)> {
    let response = client().get(gateway.url(path)).send().await?;
    let status = response.status().as_u16();
    let body = response.text().await?;
    Ok((status, serde_json::from_str(&body).unwrap_or(Value::String(body))))
}

fn snapshot(version: u64, upstream: v1::Upstream, certificates: Vec<v1::Certificate>) -> v1::Snapshot {
    let api =
        v1::Api { name: "echo".into(), path_prefix: "/".into(), upstream: upstream.name.clone(), ..Default::default() };
    v1::Snapshot { version, apis: vec![api], upstreams: vec![upstream], certificates, ..Default::default() }
}

fn upstream(url: String, tls: Option<v1::UpstreamTls>, http2: bool) -> v1::Upstream {
    v1::Upstream {
        name: "backend".into(),
        targets: vec![v1::Target { url, weight: 1 }],
        tls,
        http2,
        ..Default::default()
    }
}

enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Empty<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Empty<Bytes>>),
}

/// One client TLS connection, kept open so several requests can use it.
struct Conn {
    sender: Sender,
    protocol: Option<ProtocolVersion>,
    alpn: Option<Vec<u8>>,
    peer: CertificateDer<'static>,
}

/// Connects with a fresh client config (so no session is resumed and every
/// connection runs the certificate selection), speaking h2 when ALPN chose it.
async fn connect(
    addr: SocketAddr,
    server_name: &str,
    roots: &RootCertStore,
    version: &'static SupportedProtocolVersion,
    alpn: &[&str],
) -> Result<Conn> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[version])?
        .with_root_certificates(roots.clone())
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(server_name.to_string())?;
    let stream = TlsConnector::from(Arc::new(config)).connect(name, tcp).await?;
    let (_, session) = stream.get_ref();
    let protocol = session.protocol_version();
    let alpn = session.alpn_protocol().map(<[u8]>::to_vec);
    let peer = session.peer_certificates().and_then(|c| c.first()).context("no peer certificate")?.clone().into_owned();
    let io = TokioIo::new(stream);
    let sender = if alpn.as_deref() == Some(b"h2") {
        let (sender, connection) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
        tokio::spawn(connection);
        Sender::H2(sender)
    } else {
        let (sender, connection) = hyper::client::conn::http1::handshake(io).await?;
        tokio::spawn(connection);
        Sender::H1(sender)
    };
    Ok(Conn { sender, protocol, alpn, peer })
}

impl Conn {
    async fn get(&mut self, path: &str) -> Result<(u16, Value)> {
        let response = match &mut self.sender {
            Sender::H1(sender) => {
                sender.ready().await?;
                let request = http::Request::get(path).header("host", "gateway").body(Empty::new())?;
                sender.send_request(request).await?
            }
            Sender::H2(sender) => {
                sender.ready().await?;
                let request = http::Request::get(format!("https://gateway{path}")).body(Empty::new())?;
                sender.send_request(request).await?
            }
        };
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
    }
}

/// The certificates of the termination tests, all issued by one CA.
struct Site {
    ca: Ca,
    api: Leaf,
    wild: Leaf,
    fallback: Leaf,
}

impl Site {
    fn new() -> Result<Self> {
        let ca = Ca::new("Sluice test CA")?;
        let api = ca.server_leaf(&["api.example.test"])?;
        let wild = ca.server_leaf(&["*.wild.test"])?;
        // Valid for the names the default is expected to answer, so that the
        // client's own verification passes and only the selection is tested.
        let fallback = ca.server_leaf(&["fallback.example.test", "unknown.example.test", "127.0.0.1"])?;
        Ok(Site { ca, api, wild, fallback })
    }

    fn certificates(&self, with_default: bool) -> Vec<v1::Certificate> {
        let mut certs = vec![
            self.api.certificate("api", &["api.example.test"], false),
            self.wild.certificate("wild", &["*.wild.test"], false),
        ];
        if with_default {
            certs.push(self.fallback.certificate("fallback", &[], true));
        }
        certs
    }
}

#[tokio::test]
async fn sni_selection_versions_and_alpn() -> Result<()> {
    let site = Site::new()?;
    let roots = site.ca.roots()?;
    let backend = TestUpstream::plain().await?;
    let gw = Gateway::start_empty(|_| {}).await?;
    gw.apply(&snapshot(1, upstream(backend.url("http"), None, false), site.certificates(true))).await?;

    let tls13 = &rustls::version::TLS13;
    let tls12 = &rustls::version::TLS12;
    /// (TLS version, ALPN offered by the client, ALPN expected)
    type Case = (&'static SupportedProtocolVersion, &'static [&'static str], Option<&'static [u8]>);
    let cases: [Case; 4] = [
        (tls13, &["h2", "http/1.1"], Some(b"h2")),
        (tls13, &["http/1.1"], Some(b"http/1.1")),
        (tls12, &["h2", "http/1.1"], Some(b"h2")),
        (tls12, &[], None),
    ];
    for (version, alpn, negotiated) in cases {
        let mut conn = connect(gw.https, "api.example.test", &roots, version, alpn).await?;
        let case = format!("{:?} {alpn:?}", version.version);
        assert_eq!(conn.protocol, Some(version.version), "{case}");
        assert_eq!(conn.alpn.as_deref(), negotiated, "{case}");
        assert_eq!(conn.peer, site.api.der, "{case}: exact SNI picks `api`");
        let (status, echo) = conn.get("/hello").await?;
        assert_eq!(status, 200, "{case}: {echo}");
        assert_eq!(echo["forwarded_proto"], "https", "{case}");
        assert_eq!(echo["path"], "/hello");
    }

    let cases = [
        ("shop.wild.test", &site.wild.der, "wildcard"),
        ("unknown.example.test", &site.fallback.der, "default for an unknown name"),
        ("127.0.0.1", &site.fallback.der, "default without SNI"),
    ];
    for (name, want, case) in cases {
        let mut conn = connect(gw.https, name, &roots, tls13, &["http/1.1"]).await?;
        assert_eq!(&conn.peer, want, "{case}");
        assert_eq!(conn.get("/x").await?.0, 200, "{case}");
    }

    // Without a default, a name nothing serves is refused at the handshake.
    gw.apply(&snapshot(2, upstream(backend.url("http"), None, false), site.certificates(false))).await?;
    let refused = connect(gw.https, "unknown.example.test", &roots, tls13, &[]).await;
    assert!(refused.is_err(), "handshake for an unknown name without a default must fail");
    let mut conn = connect(gw.https, "api.example.test", &roots, tls12, &[]).await?;
    assert_eq!(conn.get("/x").await?.0, 200);
    Ok(())
}

#[tokio::test]
async fn reqwest_client_gets_h2_and_http1_over_tls() -> Result<()> {
    let site = Site::new()?;
    let backend = TestUpstream::plain().await?;
    let gw = Gateway::start_empty(|_| {}).await?;
    gw.apply(&snapshot(1, upstream(backend.url("http"), None, false), site.certificates(true))).await?;
    let port = gw.https.port();
    let ca = reqwest::Certificate::from_pem(site.ca.pem().as_bytes())?;
    let builder = || {
        reqwest::Client::builder()
            .no_proxy()
            .tls_certs_only([ca.clone()])
            .tls_info(true)
            .resolve("api.example.test", gw.https)
            .resolve("shop.wild.test", gw.https)
    };
    let peer = |response: &reqwest::Response| {
        response
            .extensions()
            .get::<reqwest::tls::TlsInfo>()
            .and_then(|info| info.peer_certificate())
            .map(<[u8]>::to_vec)
    };

    let h2 = builder().build()?;
    let response = h2.get(format!("https://api.example.test:{port}/a")).send().await?;
    assert_eq!((response.status().as_u16(), response.version()), (200, http::Version::HTTP_2));
    assert_eq!(peer(&response).as_deref(), Some(site.api.der.as_ref()));
    let echo: Value = response.json().await?;
    assert_eq!(echo["forwarded_proto"], "https");

    let http1 = builder().http1_only().tls_version_max(reqwest::tls::Version::TLS_1_2).build()?;
    let response = http1.get(format!("https://shop.wild.test:{port}/b")).send().await?;
    assert_eq!((response.status().as_u16(), response.version()), (200, http::Version::HTTP_11));
    assert_eq!(peer(&response).as_deref(), Some(site.wild.der.as_ref()));
    Ok(())
}

#[tokio::test]
async fn replaced_certificate_serves_next_handshake_and_open_connections_continue() -> Result<()> {
    let ca = Ca::new("Rotation CA")?;
    let roots = ca.roots()?;
    let (old, new) = (ca.server_leaf(&["api.example.test"])?, ca.server_leaf(&["api.example.test"])?);
    let backend = TestUpstream::plain().await?;
    let gw = Gateway::start_empty(|_| {}).await?;
    let site = |leaf: &Leaf| vec![leaf.certificate("site", &["api.example.test"], false)];
    gw.apply(&snapshot(1, upstream(backend.url("http"), None, false), site(&old))).await?;

    let tls13 = &rustls::version::TLS13;
    let mut h1 = connect(gw.https, "api.example.test", &roots, tls13, &["http/1.1"]).await?;
    let mut h2 = connect(gw.https, "api.example.test", &roots, tls13, &["h2"]).await?;
    assert_eq!((h1.peer.as_ref(), h2.peer.as_ref()), (old.der.as_ref(), old.der.as_ref()));
    assert_eq!(h1.get("/before").await?.0, 200);

    gw.apply(&snapshot(2, upstream(backend.url("http"), None, false), site(&new))).await?;
    let mut fresh = connect(gw.https, "api.example.test", &roots, tls13, &["http/1.1"]).await?;
    assert_eq!(fresh.peer, new.der, "the next handshake gets the new certificate");
    assert_eq!(fresh.get("/new").await?.0, 200);
    // Connections opened before the swap keep their session and keep working.
    for conn in [&mut h1, &mut h2] {
        let (status, echo) = conn.get("/after").await?;
        assert_eq!(status, 200, "{echo}");
        assert_eq!(conn.peer, old.der);
    }
    Ok(())
}

#[tokio::test]
async fn upstream_tls_verification_sni_insecure_and_http2() -> Result<()> {
    let ca = Ca::new("Upstream CA")?;
    let server = ca.server_leaf(&["upstream.internal", "127.0.0.1"])?;
    let backend = TestUpstream::tls(&server, None).await?;
    let gw = Gateway::start_empty(|_| {}).await?;
    let bundle = |sni: &str| v1::UpstreamTls { ca_bundle_pem: ca.pem(), sni: sni.into(), ..Default::default() };
    let insecure = v1::UpstreamTls { insecure_skip_verify: true, ..Default::default() };
    let cases = [
        ("CA bundle, SNI", Some(bundle("upstream.internal")), false, 200, "HTTP/1.1"),
        ("CA bundle, target IP as name", Some(bundle("")), false, 200, "HTTP/1.1"),
        ("CA bundle, HTTP/2 by ALPN", Some(bundle("upstream.internal")), true, 200, "HTTP/2.0"),
        ("system roots: unknown issuer", None, false, 502, ""),
        ("CA bundle, SNI the certificate does not name", Some(bundle("other.internal")), false, 502, ""),
        ("insecure_skip_verify", Some(insecure.clone()), false, 200, "HTTP/1.1"),
    ];
    for (version, (case, tls, http2, want, upstream_version)) in (1..).zip(cases) {
        gw.apply(&snapshot(version, upstream(backend.url("https"), tls, http2), vec![])).await?;
        let (status, echo) = get(&gw, "/through").await?;
        assert_eq!(status, want, "{case}: {echo}");
        if want == 200 {
            assert_eq!(
                (echo["name"].as_str(), echo["version"].as_str()),
                (Some("tls"), Some(upstream_version)),
                "{case}"
            );
        } else {
            assert_eq!(echo["status"], 502, "{case}: a problem details body: {echo}");
        }
    }
    Ok(())
}

#[tokio::test]
async fn upstream_mtls_presents_the_named_certificate() -> Result<()> {
    let server_ca = Ca::new("Upstream CA")?;
    let client_ca = Ca::new("Client CA")?;
    let server = server_ca.server_leaf(&["upstream.internal"])?;
    let identity = client_ca.leaf(&["sluice-gateway"], ExtendedKeyUsagePurpose::ClientAuth)?;
    let backend = TestUpstream::tls(&server, Some(&client_ca)).await?;
    let gw = Gateway::start_empty(|_| {}).await?;
    let tls = |client_certificate: &str| v1::UpstreamTls {
        ca_bundle_pem: server_ca.pem(),
        sni: "upstream.internal".into(),
        client_certificate: client_certificate.into(),
        ..Default::default()
    };
    let certificates = vec![identity.certificate("gateway-client", &[], false)];

    gw.apply(&snapshot(1, upstream(backend.url("https"), Some(tls("gateway-client")), false), certificates.clone()))
        .await?;
    let (status, echo) = get(&gw, "/mtls").await?;
    assert_eq!(status, 200, "{echo}");
    assert_eq!(echo["client_cert"], "1 presented");

    gw.apply(&snapshot(2, upstream(backend.url("https"), Some(tls("")), false), certificates)).await?;
    let (status, echo) = get(&gw, "/mtls").await?;
    assert_eq!(status, 502, "without a client certificate the upstream refuses: {echo}");
    Ok(())
}

#[tokio::test]
async fn binary_serves_https_and_nacks_a_bad_certificate() -> Result<()> {
    let site = Site::new()?;
    let backend = TestUpstream::plain().await?;
    let mut cp = FakeControlPlane::start().await?;
    let dp = DataPlane::start(&cp.url(), &[]).await?;
    assert_ne!(dp.https_addr.port(), 0, "the address line carries the bound https_addr");
    let mut conn = cp.accept().await?;

    conn.push(seal(snapshot(1, upstream(backend.url("http"), None, false), site.certificates(true)))).await?;
    assert_eq!(conn.ack().await?.version, 1);
    let tls_client = reqwest::Client::builder()
        .no_proxy()
        .tls_certs_only([reqwest::Certificate::from_pem(site.ca.pem().as_bytes())?])
        .resolve("api.example.test", dp.https_addr)
        .build()?;
    let url = format!("https://api.example.test:{}/bin", dp.https_addr.port());
    let response = tls_client.get(&url).send().await?;
    assert_eq!(response.status().as_u16(), 200);
    let echo: Value = response.json().await?;
    assert_eq!(echo["forwarded_proto"], "https");

    let mut bad = site.certificates(true);
    bad[0].private_key_pem = site.wild.key_pem.clone();
    conn.push(seal(snapshot(2, upstream(backend.url("http"), None, false), bad))).await?;
    let nack = conn.nack().await?;
    if !nack.error.contains("certificate `api`") {
        bail!("the NACK should name the certificate: {}", nack.error);
    }
    // The old table keeps serving.
    assert_eq!(tls_client.get(&url).send().await?.status().as_u16(), 200);
    Ok(())
}
