//! Access log and request metrics, the last step of the request path: the
//! response body is wrapped so that the line is written and the metrics are
//! recorded when the body has been fully sent (or the client went away), with
//! the real byte count and duration even for long streamed responses.

use std::borrow::BorrowMut;
use std::io::Write;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, Method, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use serde::Serialize;

use super::idle::ActiveRequest;
use crate::base::{BodyError, BodyStatus, ProxyBody, RequestId, UNROUTED};
use crate::policy::RateCount;
use crate::routing::{CompiledApi, RoutingTable};
use crate::trace::{ActiveSpan, SpanEnd};
use crate::upstream::{InFlight, Target};

/// What is known about a request by the time its response starts. Built on
/// every request: its fields are cheap clones (reference counts), never copies.
#[derive(Debug)]
pub struct Exchange {
    /// Counts the request as in flight on its connection until the response ends.
    pub active: ActiveRequest,
    pub request_id: RequestId,
    pub started: Instant,
    /// The client's address (the connection's peer) and TLS version.
    pub client: IpAddr,
    pub tls: Option<&'static str>,
    pub version: Version,
    pub method: Method,
    /// The request's path: a query string may carry secrets (API keys), so
    /// only the path is logged. Shared with the policy chain.
    pub path: RequestPath,
    /// The routed host and the client's `User-Agent`, copied (see `path`)
    /// only when the access log is on.
    pub host: Option<Box<str>>,
    pub user_agent: Option<Box<str>>,
    pub api: Option<Arc<CompiledApi>>,
    pub upstream_target: Option<Arc<Target>>,
    /// The last attempt's answer: its status and how long its head took
    /// from the attempt's start; `None` when no target answered.
    pub upstream_status: Option<StatusCode>,
    pub upstream_elapsed: Option<Duration>,
    /// Counts the client's body as it is read (requests with a body only),
    /// for the access log and the byte counters.
    pub request_body: Option<BodyStatus>,
    pub consumer: Option<Arc<str>>,
    /// The answer's `RateLimit-*` values (see `policy::Findings`).
    pub rate_count: Option<RateCount>,
    pub status: StatusCode,
    /// A gRPC response's `grpc-status`, from its headers or its trailers.
    pub grpc_status: Option<u16>,
    pub access_log: bool,
    /// The response goes out through `proxy::http1`'s writer, which can
    /// write a target's header fields as they were sent, without a header
    /// map (hyper's writers take a map only).
    pub fields_as_sent: bool,
    /// Keeps the target's in-flight count up until the response body ends.
    pub in_flight: Option<InFlight>,
    /// The table the request started on, kept until its body ends.
    pub table: Option<Arc<RoutingTable>>,
    /// The request's span when it is traced and sampled (see `trace`).
    pub trace: Option<Box<ActiveSpan>>,
}

/// The request's path (without its query), as the exchange keeps it.
#[derive(Debug, Clone)]
pub enum RequestPath {
    /// The client's, sharing the connection's read buffer: only where that
    /// buffer lives until the response ends anyway (`http1`, which reads
    /// the next request only then), as it saves a copy per request.
    Sent(PathAndQuery),
    /// Copied: hyper reads the next request while a response is sent, into
    /// a new buffer if this one is still held, so a path sharing it kept an
    /// 8 KiB buffer alive per open connection. Also a canonicalised path.
    Copied(Arc<str>),
}

impl RequestPath {
    /// Shared for the span, which outlives the exchange.
    fn to_shared(&self) -> Arc<str> {
        match self {
            RequestPath::Sent(sent) => sent.path().into(),
            RequestPath::Copied(copied) => copied.clone(),
        }
    }
}

impl std::ops::Deref for RequestPath {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            RequestPath::Sent(sent) => sent.path(),
            RequestPath::Copied(copied) => copied,
        }
    }
}

/// One access log line; docs/operations.md describes every field, in this order.
#[derive(Serialize)]
struct Line<'a> {
    time: String,
    request_id: &'a RequestId,
    client: IpAddr,
    tls: Option<&'a str>,
    http: &'a str,
    method: &'a str,
    host: Option<&'a str>,
    path: &'a str,
    user_agent: Option<&'a str>,
    api: Option<&'a str>,
    consumer: Option<&'a str>,
    status: u16,
    bytes_in: u64,
    bytes_out: u64,
    duration_ms: f64,
    upstream: Option<&'a str>,
    upstream_status: Option<u16>,
    upstream_ms: Option<f64>,
    grpc_status: Option<u16>,
}

/// A response body that reports its exchange when it ends or is dropped.
/// The exchange is held (`X = Exchange`) where the body outlives the request's
/// handler (hyper's connections), or borrowed (`X = &mut Exchange`) from the
/// one that writes the response (`http1`), which then moves neither through
/// the response.
pub struct LoggedBody<X: BorrowMut<Exchange> = Exchange> {
    inner: ProxyBody,
    bytes: u64,
    exchange: Option<X>,
}

impl<X: BorrowMut<Exchange>> LoggedBody<X> {
    pub fn new(inner: ProxyBody, exchange: X) -> Self {
        LoggedBody { inner, bytes: 0, exchange: Some(exchange) }
    }

    fn finish(&mut self) {
        // Ended where it is: it is large.
        let Some(exchange) = self.exchange.as_mut().map(BorrowMut::borrow_mut) else { return };
        // The one clock reading of the end, for the metrics, the log, the span and the connection.
        let ended = Instant::now();
        let elapsed = ended.saturating_duration_since(exchange.started);
        report(exchange, self.bytes, elapsed);
        // After the log line: a drain that sees no request in flight finds it written.
        exchange.active.ended_at(ended);
        if let Some(span) = exchange.trace.take() {
            end_span(span, exchange, elapsed);
        }
        self.exchange = None;
    }
}

impl<X: BorrowMut<Exchange> + Unpin> Body for LoggedBody<X> {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.bytes += data.len() as u64;
                } else if let Some(trailers) = frame.trailers_ref()
                    && let Some(status) = grpc_status(trailers)
                    && let Some(exchange) = self.exchange.as_mut()
                {
                    exchange.borrow_mut().grpc_status = Some(status);
                }
            }
            Poll::Ready(None) => self.finish(),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<X: BorrowMut<Exchange>> Drop for LoggedBody<X> {
    fn drop(&mut self) {
        // hyper may drop a body it knows is empty without polling it to the end.
        self.finish();
    }
}

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// The `grpc-status` in a gRPC response's headers (a call that failed at
/// once) or trailers (every other call).
pub(super) fn grpc_status(headers: &HeaderMap) -> Option<u16> {
    headers.get(GRPC_STATUS).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok())
}

/// Milliseconds with microseconds as decimals.
fn millis(elapsed: Duration) -> f64 {
    (elapsed.as_secs_f64() * 1e6).round() / 1e3
}

fn http_version(version: Version) -> &'static str {
    match version {
        Version::HTTP_09 => "0.9",
        Version::HTTP_10 => "1.0",
        Version::HTTP_2 => "2",
        Version::HTTP_3 => "3",
        _ => "1.1",
    }
}

/// The longest `User-Agent` logged; longer ones are cut (at a character boundary).
const USER_AGENT_LOGGED: usize = 256;

/// The client's `User-Agent`, as much as is logged.
pub(super) fn user_agent(value: &[u8]) -> Box<str> {
    let text = String::from_utf8_lossy(value);
    let mut end = text.len().min(USER_AGENT_LOGGED);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].into()
}

/// Hands the span what it reports, taken from the exchange, whose owner
/// drops the rest (the in-flight counts, the table) as usual.
fn end_span(span: Box<ActiveSpan>, exchange: &mut Exchange, elapsed: Duration) {
    span.end(SpanEnd {
        elapsed,
        method: exchange.method.clone(),
        scheme: if exchange.tls.is_some() { "https" } else { "http" },
        path: exchange.path.to_shared(),
        version: exchange.version,
        client: exchange.client,
        host: exchange.host.take(),
        user_agent: exchange.user_agent.take(),
        request_id: exchange.request_id,
        api: exchange.api.take(),
        consumer: exchange.consumer.take(),
        status: exchange.status,
        target: exchange.upstream_target.take(),
        upstream_status: exchange.upstream_status,
        grpc_status: exchange.grpc_status,
    });
}

fn report(exchange: &Exchange, bytes: u64, elapsed: Duration) {
    let metrics = exchange.api.as_ref().map_or(&*UNROUTED, |api| &api.metrics);
    let bytes_in = exchange.request_body.as_ref().map_or(0, BodyStatus::received);
    metrics.record(&exchange.method, exchange.status, elapsed, (bytes_in, bytes), exchange.grpc_status);
    if !exchange.access_log {
        return;
    }
    let line = Line {
        time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        request_id: &exchange.request_id,
        client: exchange.client,
        tls: exchange.tls,
        http: http_version(exchange.version),
        method: exchange.method.as_str(),
        host: exchange.host.as_deref(),
        path: &exchange.path,
        user_agent: exchange.user_agent.as_deref(),
        api: exchange.api.as_ref().map(|api| api.name.as_str()),
        consumer: exchange.consumer.as_deref(),
        status: exchange.status.as_u16(),
        bytes_in,
        bytes_out: bytes,
        duration_ms: millis(elapsed),
        upstream: exchange.upstream_target.as_ref().map(|target| target.url.as_str()),
        upstream_status: exchange.upstream_status.map(|status| status.as_u16()),
        upstream_ms: exchange.upstream_elapsed.map(millis),
        grpc_status: exchange.grpc_status,
    };
    if let Ok(mut text) = serde_json::to_vec(&line) {
        text.push(b'\n');
        // One write per line keeps lines whole when requests finish concurrently.
        let _ = std::io::stdout().lock().write_all(&text);
    }
}
