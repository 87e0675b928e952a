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
use http::StatusCode;
use http_body::{Body, Frame, SizeHint};
use serde::Serialize;

use crate::routing::RoutingTable;
use crate::upstream::{InFlight, ProxyBody};

/// What is known about a request by the time its response starts.
#[derive(Debug)]
pub struct Exchange {
    pub started: Instant,
    pub method: String,
    /// Path only: a query string may carry secrets (API keys) that must not reach the log.
    pub path: String,
    pub api: Option<String>,
    pub upstream_target: Option<String>,
    pub consumer: Option<String>,
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
    let api = exchange.api.clone().unwrap_or_else(|| "-".to_string());
    let status_class = match exchange.status.as_u16() {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    };
    let method = method_label(&exchange.method);
    metrics::counter!("sluice_requests_total", "api" => api.clone(), "method" => method, "status_class" => status_class)
        .increment(1);
    metrics::histogram!("sluice_request_duration_seconds", "api" => api).record(elapsed.as_secs_f64());
    if !exchange.access_log {
        return;
    }
    let line = Line {
        time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        api: exchange.api.as_deref(),
        method: &exchange.method,
        path: &exchange.path,
        status: exchange.status.as_u16(),
        bytes,
        duration_ms: (elapsed.as_secs_f64() * 1e6).round() / 1e3,
        upstream: exchange.upstream_target.as_deref(),
        consumer: exchange.consumer.as_deref(),
    };
    if let Ok(mut text) = serde_json::to_vec(&line) {
        text.push(b'\n');
        // One write per line keeps lines whole when requests finish concurrently.
        let _ = std::io::stdout().lock().write_all(&text);
    }
}

/// Unknown methods share one label so a client cannot blow up metric cardinality.
fn method_label(method: &str) -> &'static str {
    match method {
        "GET" => "GET",
        "HEAD" => "HEAD",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "OPTIONS" => "OPTIONS",
        "CONNECT" => "CONNECT",
        "TRACE" => "TRACE",
        _ => "OTHER",
    }
}
