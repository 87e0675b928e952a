//! gRPC through a real `sluice-dp`: a tonic server as the upstream that,
//! like some gRPC servers, refuses calls without `te: trailers`, and tonic
//! clients. Over h2c (HTTP/2 prior knowledge both sides) and over TLS (h2 by
//! ALPN both sides, the upstream's certificate from a private CA the
//! snapshot names). Unary and server-streaming calls, a failed call's
//! status, and a stream that fails after messages (its status in the
//! trailers), with `grpc-status` in the access log and the metrics, and what
//! the upstream received on each call.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use anyhow::{Context as _, Result};
use bytes::Bytes;
use futures_util::StreamExt;
use http::uri::PathAndQuery;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ServerConfig};
use serde_json::Value;
use sluice_proto::v1;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tonic::client::{Grpc, GrpcService};
use tonic::codegen::StdError;
use tonic::{Code, Status};
use tonic_prost::ProstCodec;

use crate::certs::{Ca, provider};
use crate::support::{DataPlane, eventually};

#[derive(Clone, PartialEq, prost::Message)]
struct Echo {
    #[prost(string, tag = "1")]
    text: String,
    #[prost(uint32, tag = "2")]
    count: u32,
}

const UNARY: &str = "/test.Echo/Unary";
const STREAM: &str = "/test.Echo/Stream";

/// Answers `text` back, with the request ID the call arrived with; a text
/// of `fail` fails the call with NOT_FOUND and details of its own.
#[derive(Clone)]
struct Unary;

impl tower_service::Service<tonic::Request<Echo>> for Unary {
    type Response = tonic::Response<Echo>;
    type Error = Status;
    type Future = Ready<Result<Self::Response, Status>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic::Request<Echo>) -> Self::Future {
        let id = request.metadata().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        let echo = request.into_inner();
        if echo.text == "fail" {
            let mut status = Status::new(Code::NotFound, "no such fruit: fail");
            status.metadata_mut().insert("x-detail", tonic::metadata::MetadataValue::from_static("kept"));
            return ready(Err(status));
        }
        ready(Ok(tonic::Response::new(Echo { text: format!("{} from {id}", echo.text), count: 0 })))
    }
}

type Messages = futures_util::stream::Iter<std::vec::IntoIter<Result<Echo, Status>>>;

/// `count` messages; a text of `abort` ends the stream with ABORTED after them.
#[derive(Clone)]
struct Stream;

impl tower_service::Service<tonic::Request<Echo>> for Stream {
    type Response = tonic::Response<Messages>;
    type Error = Status;
    type Future = Ready<Result<Self::Response, Status>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic::Request<Echo>) -> Self::Future {
        let echo = request.into_inner();
        let mut messages: Vec<Result<Echo, Status>> =
            (0..echo.count).map(|i| Ok(Echo { text: format!("{} {i}", echo.text), count: i })).collect();
        if echo.text == "abort" {
            messages.push(Err(Status::aborted("stopped half way")));
        }
        ready(Ok(tonic::Response::new(futures_util::stream::iter(messages))))
    }
}

/// What the upstream saw of one call: its connection and its head.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    path: String,
    version: http::Version,
    te: Option<String>,
    forwarded_proto: Option<String>,
    /// The connection's ALPN protocol and SNI (none over h2c).
    alpn: Option<String>,
    sni: Option<String>,
}

/// The TLS connection's ALPN protocol and SNI, for [`Seen`].
#[derive(Debug, Clone, Default)]
struct ConnectionInfo {
    alpn: Option<String>,
    sni: Option<String>,
}

type SeenLog = Arc<Mutex<Vec<Seen>>>;

async fn route(
    seen: SeenLog,
    connection: ConnectionInfo,
    request: http::Request<Incoming>,
) -> Result<http::Response<tonic::body::Body>, Infallible> {
    let header = |name: &str| request.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let call = Seen {
        path: request.uri().path().to_owned(),
        version: request.version(),
        te: header("te"),
        forwarded_proto: header("x-forwarded-proto"),
        alpn: connection.alpn,
        sni: connection.sni,
    };
    if let Ok(mut seen) = seen.lock() {
        seen.push(call);
    }
    // As grpc-java and others: a call without `te: trailers` is refused.
    if request.headers().get(http::header::TE).is_none_or(|te| te != "trailers") {
        return Ok(Status::internal("te: trailers is required").into_http());
    }
    let mut grpc = tonic::server::Grpc::new(ProstCodec::<Echo, Echo>::default());
    Ok(match request.uri().path() {
        UNARY => grpc.unary(Unary, request).await,
        STREAM => grpc.server_streaming(Stream, request).await,
        _ => Status::unimplemented("no such method").into_http(),
    })
}

/// The tonic upstream on HTTP/2: with prior knowledge (h2c), or over TLS
/// offering only h2 by ALPN, as a gRPC server with TLS does. Returns its
/// address and the calls it saw; the connections close when the task ends.
async fn grpc_upstream(tls: Option<TlsAcceptor>) -> Result<(SocketAddr, SeenLog, JoinHandle<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let seen = SeenLog::default();
    let log = seen.clone();
    let task = tokio::spawn(async move {
        let mut connections = JoinSet::new();
        while let Ok((stream, _)) = listener.accept().await {
            let (tls, log) = (tls.clone(), log.clone());
            connections.spawn(async move {
                let h2 = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                match tls {
                    None => {
                        let service = service_fn(move |r| route(log.clone(), ConnectionInfo::default(), r));
                        let _ = h2.serve_connection(TokioIo::new(stream), service).await;
                    }
                    Some(acceptor) => {
                        let Ok(stream) = acceptor.accept(stream).await else { return };
                        let session = stream.get_ref().1;
                        let info = ConnectionInfo {
                            alpn: session.alpn_protocol().map(|p| String::from_utf8_lossy(p).into_owned()),
                            sni: session.server_name().map(str::to_owned),
                        };
                        let service = service_fn(move |r| route(log.clone(), info.clone(), r));
                        let _ = h2.serve_connection(TokioIo::new(stream), service).await;
                    }
                }
            });
        }
    });
    Ok((addr, seen, task))
}

/// What the calls need of a client's transport: tonic's `Channel` (h2c), or
/// [`H2`] over TLS.
trait Transport:
    GrpcService<
        tonic::body::Body,
        Error: Into<StdError>,
        ResponseBody: http_body::Body<Data = Bytes, Error: Into<StdError>> + Send + 'static,
    >
{
}

impl<T> Transport for T where
    T: GrpcService<
            tonic::body::Body,
            Error: Into<StdError>,
            ResponseBody: http_body::Body<Data = Bytes, Error: Into<StdError>> + Send + 'static,
        >
{
}

/// One client HTTP/2 connection as a gRPC transport: tonic's `Channel` has
/// no TLS in this build (its TLS features are off), so the TLS client is
/// rustls and hyper's HTTP/2 sender under tonic's gRPC client.
#[derive(Clone)]
struct H2(hyper::client::conn::http2::SendRequest<tonic::body::Body>);

impl tower_service::Service<http::Request<tonic::body::Body>> for H2 {
    type Response = http::Response<Incoming>;
    type Error = hyper::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, hyper::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), hyper::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.0.send_request(request))
    }
}

/// A gRPC client over TLS to `addr` as `name`, offering h2 and http/1.1 by
/// ALPN as a browser-grade client does; returns the protocol ALPN chose.
async fn tls_client(addr: SocketAddr, name: &str, ca: &Ca) -> Result<(Grpc<H2>, Option<Vec<u8>>)> {
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(ca.roots()?)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tcp = TcpStream::connect(addr).await?;
    let stream = TlsConnector::from(Arc::new(config)).connect(ServerName::try_from(name.to_owned())?, tcp).await?;
    let alpn = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let origin = http::Uri::try_from(format!("https://{name}"))?;
    Ok((Grpc::with_origin(H2(sender), origin), alpn))
}

async fn unary<T: Transport>(client: &mut Grpc<T>, text: &str) -> Result<tonic::Response<Echo>, Status> {
    client.ready().await.map_err(|e| Status::unknown(e.into().to_string()))?;
    let request = tonic::Request::new(Echo { text: text.into(), count: 0 });
    client.unary(request, PathAndQuery::from_static(UNARY), ProstCodec::<Echo, Echo>::default()).await
}

/// The messages of a server-streaming call, and how the stream ended.
async fn stream<T: Transport>(client: &mut Grpc<T>, text: &str, count: u32) -> Result<(Vec<Echo>, Result<(), Status>)> {
    client.ready().await.map_err(|e| anyhow::anyhow!(e.into()))?;
    let request = tonic::Request::new(Echo { text: text.into(), count });
    let response = client.server_streaming(request, PathAndQuery::from_static(STREAM), ProstCodec::default()).await?;
    let mut messages = Vec::new();
    let mut stream = response.into_inner();
    while let Some(item) = stream.next().await {
        match item {
            Ok(message) => messages.push(message),
            Err(status) => return Ok((messages, Err(status))),
        }
    }
    Ok((messages, Ok(())))
}

/// The calls both tests make and what their client must see: a unary call
/// answered (with the request ID the upstream got), a failed one with its
/// status and metadata unchanged, a stream of five messages ending well, and
/// one of two ending ABORTED in its trailers. In that order: four calls,
/// two of each method.
async fn make_calls<T: Transport>(client: &mut Grpc<T>) -> Result<()> {
    let response = unary(client, "apple").await.map_err(|status| anyhow::anyhow!("{status:?}"))?;
    let id = response.metadata().get("x-request-id").context("the request ID is echoed")?.to_str()?.to_owned();
    assert_eq!(response.into_inner().text, format!("apple from {id}"));

    // A failed call reaches the client as the server failed it.
    let status = unary(client, "fail").await.err().context("the call should fail")?;
    assert_eq!((status.code(), status.message()), (Code::NotFound, "no such fruit: fail"));
    assert_eq!(status.metadata().get("x-detail").map(|v| v.to_str().ok()), Some(Some("kept")));

    // Server streaming: every message, then the status from the trailers.
    let (messages, end) = stream(client, "pear", 5).await?;
    assert_eq!(messages.iter().map(|m| m.count).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
    assert!(end.is_ok(), "{end:?}");
    let (messages, end) = stream(client, "abort", 2).await?;
    assert_eq!(messages.len(), 2);
    let status = end.err().context("the stream should end with an error")?;
    assert_eq!((status.code(), status.message()), (Code::Aborted, "stopped half way"));
    Ok(())
}

/// The upstream saw the four calls of [`make_calls`] as `expected` says of
/// each (its path aside), on HTTP/2 with `te: trailers`.
fn assert_upstream_saw(seen: &SeenLog, expected: &Seen) {
    let seen = seen.lock().map(|seen| seen.clone()).unwrap_or_default();
    let paths: Vec<&str> = seen.iter().map(|call| call.path.as_str()).collect();
    assert_eq!(paths, [UNARY, UNARY, STREAM, STREAM]);
    for call in &seen {
        assert_eq!(&Seen { path: call.path.clone(), ..expected.clone() }, call);
    }
}

/// The access log lines (those with a request ID), in order.
fn access_log(dp: &DataPlane) -> Vec<Value> {
    dp.process
        .stdout()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line.get("request_id").is_some())
        .collect()
}

/// `grpc-status` of the four calls of [`make_calls`] in the access log
/// (from headers or trailers), each line with the client's TLS version (if
/// any) and HTTP/2, and in the metrics.
async fn assert_statuses_observed(dp: &DataPlane, tls: Option<&str>) -> Result<()> {
    let expected = [0, 5, 0, 10].map(|code| (Value::from(code), Value::from(tls), Value::from("2")));
    let lines = || {
        access_log(dp)
            .iter()
            .map(|l| (l["grpc_status"].clone(), l["tls"].clone(), l["http"].clone()))
            .collect::<Vec<_>>()
    };
    let logged = || async { access_log(dp).len() >= expected.len() };
    eventually("four access log lines", std::time::Duration::from_millis(20), logged).await?;
    assert_eq!(lines(), expected, "stdout:\n{}", dp.process.stdout());
    let text = crate::support::client().get(dp.ops_url("/metrics")).send().await?.text().await?;
    for (code, n) in [("0", 2), ("5", 1), ("10", 1)] {
        let series = format!("sluice_grpc_responses_total{{api=\"echo\",grpc_status=\"{code}\"}} {n}");
        assert!(text.lines().any(|line| line == series), "no `{series}` in\n{text}");
    }
    crate::observe::assert_every_series_has_help(&text);
    Ok(())
}

fn snapshot(upstream: v1::Upstream, certificates: Vec<v1::Certificate>) -> v1::Snapshot {
    v1::Snapshot {
        version: 1,
        apis: vec![v1::Api {
            name: "echo".into(),
            path_prefix: "/test.Echo".into(),
            upstream: upstream.name.clone(),
            ..Default::default()
        }],
        upstreams: vec![upstream],
        certificates,
        ..Default::default()
    }
}

#[tokio::test]
async fn grpc_calls_pass_through_with_trailers_and_their_status() -> Result<()> {
    let (upstream, seen, _server) = grpc_upstream(None).await?;
    let upstream = v1::Upstream {
        name: "grpc".into(),
        targets: vec![v1::Target { url: format!("http://{upstream}"), weight: 1 }],
        http2: true,
        ..Default::default()
    };
    let (_cp, dp) = DataPlane::running(snapshot(upstream, vec![]), &[]).await?;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", dp.http_addr))?.connect().await?;
    let mut client = Grpc::new(channel);

    make_calls(&mut client).await?;
    let h2c = Seen {
        path: String::new(),
        version: http::Version::HTTP_2,
        te: Some("trailers".into()),
        forwarded_proto: Some("http".into()),
        alpn: None,
        sni: None,
    };
    assert_upstream_saw(&seen, &h2c);
    assert_statuses_observed(&dp, None).await
}

#[tokio::test]
async fn grpc_calls_pass_through_over_tls_both_sides() -> Result<()> {
    // The upstream's certificate comes from a private CA only the snapshot
    // names, and ALPN there offers h2 alone: the data plane must offer it.
    let upstream_ca = Ca::new("gRPC upstream CA")?;
    let upstream_leaf = upstream_ca.server_leaf(&["grpc.internal"])?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![upstream_leaf.der.clone()], upstream_leaf.key()?)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    let (upstream, seen, _server) = grpc_upstream(Some(TlsAcceptor::from(Arc::new(config)))).await?;
    let upstream = v1::Upstream {
        name: "grpc".into(),
        targets: vec![v1::Target { url: format!("https://{upstream}"), weight: 1 }],
        http2: true,
        tls: Some(v1::UpstreamTls {
            ca_bundle_pem: upstream_ca.pem(),
            sni: "grpc.internal".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    // The gateway's own certificate, from another CA the client trusts.
    let site_ca = Ca::new("gRPC site CA")?;
    let site = site_ca.server_leaf(&["grpc.example.test"])?;
    let certificates = vec![site.certificate("grpc-site", &["grpc.example.test"], false)];
    let (_cp, dp) = DataPlane::running(snapshot(upstream, certificates), &[]).await?;

    let (mut client, alpn) = tls_client(dp.https_addr, "grpc.example.test", &site_ca).await?;
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]), "the gateway chose h2 by ALPN");
    make_calls(&mut client).await?;
    let tls = Seen {
        path: String::new(),
        version: http::Version::HTTP_2,
        te: Some("trailers".into()),
        forwarded_proto: Some("https".into()),
        alpn: Some("h2".into()),
        sni: Some("grpc.internal".into()),
    };
    assert_upstream_saw(&seen, &tls);
    assert_statuses_observed(&dp, Some("TLSv1.3")).await?;

    // Messages larger than HTTP/2's default windows, both ways, and a long
    // stream: flow control holds across both TLS hops.
    let big = "x".repeat(3_000_000);
    let response = unary(&mut client, &big).await.map_err(|status| anyhow::anyhow!("{status:?}"))?;
    let id = response.metadata().get("x-request-id").context("the request ID is echoed")?.to_str()?.to_owned();
    assert!(response.into_inner().text == format!("{big} from {id}"), "the 3 MB text came back whole");
    let (messages, end) = stream(&mut client, &"y".repeat(20_000), 500).await?;
    assert_eq!((messages.len(), messages.iter().map(|m| m.text.len()).min()), (500, Some(20_002)));
    assert!(end.is_ok(), "{end:?}");
    Ok(())
}
