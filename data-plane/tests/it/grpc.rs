//! gRPC through a real `sluice-dp`: a tonic server as the upstream (HTTP/2
//! prior knowledge) that, like some gRPC servers, refuses calls without
//! `te: trailers`, and tonic clients over h2c. Unary and server-streaming
//! calls, a failed call's status, and a stream that fails after messages
//! (its status in the trailers), with `grpc-status` in the access log and
//! the metrics.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::net::SocketAddr;
use std::task::{Context, Poll};

use anyhow::{Context as _, Result};
use futures_util::StreamExt;
use http::uri::PathAndQuery;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use sluice_proto::v1;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::{Code, Status};
use tonic_prost::ProstCodec;

use crate::fake_cp::{FakeControlPlane, seal};
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

async fn route(request: http::Request<Incoming>) -> Result<http::Response<tonic::body::Body>, Infallible> {
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

/// The tonic upstream on HTTP/2 with prior knowledge.
async fn grpc_upstream() -> Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service_fn(route))
                    .await;
            });
        }
    });
    Ok((addr, task))
}

type Client = tonic::client::Grpc<tonic::transport::Channel>;

async fn unary(client: &mut Client, text: &str) -> Result<tonic::Response<Echo>, Status> {
    client.ready().await.map_err(|e| Status::unknown(e.to_string()))?;
    let request = tonic::Request::new(Echo { text: text.into(), count: 0 });
    client.unary(request, PathAndQuery::from_static(UNARY), ProstCodec::<Echo, Echo>::default()).await
}

/// The messages of a server-streaming call, and how the stream ended.
async fn stream(client: &mut Client, text: &str, count: u32) -> Result<(Vec<Echo>, Result<(), Status>)> {
    client.ready().await?;
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

/// The `grpc_status` of the access log lines, in order.
fn logged_grpc_statuses(dp: &DataPlane) -> Vec<Value> {
    dp.process
        .stdout()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line.get("request_id").is_some())
        .map(|line| line["grpc_status"].clone())
        .collect()
}

#[tokio::test]
async fn grpc_calls_pass_through_with_trailers_and_their_status() -> Result<()> {
    let (upstream, _server) = grpc_upstream().await?;
    let snapshot = v1::Snapshot {
        version: 1,
        apis: vec![v1::Api {
            name: "echo".into(),
            path_prefix: "/test.Echo".into(),
            upstream: "grpc".into(),
            ..Default::default()
        }],
        upstreams: vec![v1::Upstream {
            name: "grpc".into(),
            targets: vec![v1::Target { url: format!("http://{upstream}"), weight: 1 }],
            http2: true,
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut cp = FakeControlPlane::start().await?;
    let dp = DataPlane::start(&cp.url(), &[]).await?;
    let mut conn = cp.accept().await?;
    conn.push(seal(snapshot)).await?;
    conn.ack().await?;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", dp.http_addr))?.connect().await?;
    let mut client = tonic::client::Grpc::new(channel);

    // Unary, over h2c: the server saw `te: trailers` and the request ID.
    let response = unary(&mut client, "apple").await.map_err(|status| anyhow::anyhow!("{status:?}"))?;
    let id = response.metadata().get("x-request-id").context("the request ID is echoed")?.to_str()?.to_owned();
    assert_eq!(response.into_inner().text, format!("apple from {id}"));

    // A failed call reaches the client as the server failed it.
    let status = unary(&mut client, "fail").await.err().context("the call should fail")?;
    assert_eq!((status.code(), status.message()), (Code::NotFound, "no such fruit: fail"));
    assert_eq!(status.metadata().get("x-detail").map(|v| v.to_str().ok()), Some(Some("kept")));

    // Server streaming: every message, then the status from the trailers.
    let (messages, end) = stream(&mut client, "pear", 5).await?;
    assert_eq!(messages.iter().map(|m| m.count).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
    assert!(end.is_ok(), "{end:?}");
    let (messages, end) = stream(&mut client, "abort", 2).await?;
    assert_eq!(messages.len(), 2);
    let status = end.err().context("the stream should end with an error")?;
    assert_eq!((status.code(), status.message()), (Code::Aborted, "stopped half way"));

    // grpc-status in the access log (headers or trailers) and the metrics.
    let expected = [Value::from(0), Value::from(5), Value::from(0), Value::from(10)];
    let logged = || async { logged_grpc_statuses(&dp).len() >= expected.len() };
    eventually("four access log lines", std::time::Duration::from_millis(20), logged).await?;
    assert_eq!(logged_grpc_statuses(&dp), expected, "stdout:\n{}", dp.process.stdout());
    let text = crate::support::client().get(dp.ops_url("/metrics")).send().await?.text().await?;
    for (code, n) in [("0", 2), ("5", 1), ("10", 1)] {
        let series = format!("sluice_grpc_responses_total{{api=\"echo\",grpc_status=\"{code}\"}} {n}");
        assert!(text.lines().any(|line| line == series), "no `{series}` in\n{text}");
    }
    crate::observe::assert_every_series_has_help(&text);
    Ok(())
}
