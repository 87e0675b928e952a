//! Access log and request metrics, the last step of the request path: the
//! response body is wrapped so that the line is written and the metrics are
//! recorded when the body has been fully sent (or the client went away), with
//! the real byte count and duration even for long streamed responses.

use std::io::Write;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body::{Body, Frame, SizeHint};
use serde::Serialize;

use super::idle::ActiveRequest;
use crate::base::{ProxyBody, RequestId, UNROUTED};
use crate::routing::{CompiledApi, RoutingTable};
use crate::upstream::{InFlight, Target};

/// What is known about a request by the time its response starts. Built on
/// every request: its fields are cheap clones (reference counts), never copies.
#[derive(Debug)]
pub struct Exchange {
    /// Counts the request as in flight on its connection until the response ends.
    pub active: ActiveRequest,
    pub request_id: RequestId,
    pub started: Instant,
    pub method: Method,
    /// The request's path, copied: a query string may carry secrets (API
    /// keys), so only the path is logged. Not the client's `Uri`, which
    /// shares the connection's read buffer: held until the response ends,
    /// it kept that 8 KiB buffer alive beside the one hyper reads the next
    /// request into, for every open connection. Shared with the policy chain.
    pub path: Arc<str>,
    pub api: Option<Arc<CompiledApi>>,
    pub upstream_target: Option<Arc<Target>>,
    pub consumer: Option<Arc<str>>,
    pub status: StatusCode,
    pub access_log: bool,
    /// Keeps the target's in-flight count up until the response body ends.
    pub in_flight: Option<InFlight>,
    /// The table the request started on, kept until its body ends.
    pub table: Option<Arc<RoutingTable>>,
}

#[derive(Serialize)]
struct Line<'a> {
    time: String,
    request_id: &'a RequestId,
    api: Option<&'a str>,
    method: &'a str,
    path: &'a str,
    status: u16,
    bytes: u64,
    duration_ms: f64,
    upstream: Option<&'a str>,
    consumer: Option<&'a str>,
}

/// A response body that reports its exchange when it ends or is dropped.
pub struct LoggedBody {
    inner: ProxyBody,
    bytes: u64,
    exchange: Option<Exchange>,
}

impl LoggedBody {
    pub fn new(inner: ProxyBody, exchange: Exchange) -> Self {
        LoggedBody { inner, bytes: 0, exchange: Some(exchange) }
    }

    fn finish(&mut self) {
        if let Some(exchange) = self.exchange.take() {
            report(&exchange, self.bytes);
        }
    }
}

impl Body for LoggedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.bytes += data.len() as u64;
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

impl Drop for LoggedBody {
    fn drop(&mut self) {
        // hyper may drop a body it knows is empty without polling it to the end.
        self.finish();
    }
}

fn report(exchange: &Exchange, bytes: u64) {
    let elapsed = exchange.started.elapsed();
    let metrics = exchange.api.as_ref().map_or(&*UNROUTED, |api| &api.metrics);
    metrics.record(&exchange.method, exchange.status, elapsed);
    if !exchange.access_log {
        return;
    }
    let line = Line {
        time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        request_id: &exchange.request_id,
        api: exchange.api.as_ref().map(|api| api.name.as_str()),
        method: exchange.method.as_str(),
        path: &exchange.path,
        status: exchange.status.as_u16(),
        bytes,
        duration_ms: (elapsed.as_secs_f64() * 1e6).round() / 1e3,
        upstream: exchange.upstream_target.as_ref().map(|target| target.url.as_str()),
        consumer: exchange.consumer.as_deref(),
    };
    if let Ok(mut text) = serde_json::to_vec(&line) {
        text.push(b'\n');
        // One write per line keeps lines whole when requests finish concurrently.
        let _ = std::io::stdout().lock().write_all(&text);
    }
}
