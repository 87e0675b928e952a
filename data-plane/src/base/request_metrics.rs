//! Per-API request metrics with their handles resolved once, held by each
//! compiled API (`routing`) and recorded by the proxy's access log. A `counter!`
//! with labels builds its key (label strings included) and looks it up in
//! the registry on every call; here each (method, status) handle is
//! registered on its first request and the request path after that only
//! increments an atomic. Handles are allocated lazily, so an API that never
//! sees traffic costs one pointer and adds no series to `/metrics`. The same
//! call counts the request for the heartbeat's traffic summary (`traffic`).

mod traffic;

use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

use http::{Method, StatusCode};
use metrics::{Counter, Histogram};
use traffic::{TrafficCounters, TrafficCounts};

const METHODS: [&str; 10] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE", "OTHER"];
const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];
/// The statuses labelled by their code: those the gateway answers itself and
/// the common ones of upstreams. Any other is labelled by its class, so a
/// client or an upstream cannot grow the series without bound.
const STATUS_CODES: [u16; 28] = [
    200, 201, 202, 204, 206, 301, 302, 304, 307, 308, 400, 401, 403, 404, 405, 408, 409, 412, 413, 415, 422, 429, 431,
    500, 501, 502, 503, 504,
];
/// `status` label values: [`STATUS_CODES`], then the classes.
const STATUS_LABELS: [&str; 33] = [
    "200", "201", "202", "204", "206", "301", "302", "304", "307", "308", "400", "401", "403", "404", "405", "408",
    "409", "412", "413", "415", "422", "429", "431", "500", "501", "502", "503", "504", "1xx", "2xx", "3xx", "4xx",
    "5xx",
];
/// gRPC's status codes (0 OK to 16 UNAUTHENTICATED), then any other value.
const GRPC_CODES: [&str; 18] =
    ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16", "other"];

/// `sluice_requests_total`, `sluice_request_duration_seconds`, the byte
/// counters and `sluice_grpc_responses_total` of one API.
#[derive(Debug)]
pub struct RequestMetrics {
    api: Arc<str>,
    handles: OnceLock<Box<Handles>>,
}

#[derive(Debug)]
struct Handles {
    /// Per method, a row of per-status handles made on the method's first
    /// request: most APIs see two or three methods.
    requests: [OnceLock<Box<[OnceLock<Counter>; STATUS_LABELS.len()]>>; METHODS.len()],
    duration: Histogram,
    bytes_in: Counter,
    bytes_out: Counter,
    grpc: [OnceLock<Counter>; GRPC_CODES.len()],
    /// What the heartbeat summarises; here so that an idle API costs nothing more.
    traffic: TrafficCounters,
}

/// Requests that matched no API (404, 405, not ready) are counted under `api="-"`.
pub static UNROUTED: LazyLock<RequestMetrics> = LazyLock::new(|| RequestMetrics::new("-".into()));

impl RequestMetrics {
    pub fn new(api: Arc<str>) -> Self {
        RequestMetrics { api, handles: OnceLock::new() }
    }

    /// `grpc_status`: a gRPC response's `grpc-status`, counted in
    /// `sluice_grpc_responses_total`.
    /// `bytes`: the request's and the response's body bytes.
    pub fn record(
        &self,
        method: &Method,
        status: StatusCode,
        elapsed: Duration,
        bytes: (u64, u64),
        grpc_status: Option<u16>,
    ) {
        let handles = self.handles.get_or_init(|| {
            Box::new(Handles {
                requests: Default::default(),
                duration: metrics::histogram!("sluice_request_duration_seconds", "api" => self.api.to_string()),
                bytes_in: metrics::counter!("sluice_request_bytes_total", "api" => self.api.to_string()),
                bytes_out: metrics::counter!("sluice_response_bytes_total", "api" => self.api.to_string()),
                grpc: Default::default(),
                traffic: TrafficCounters::default(),
            })
        });
        let (m, s, c) = (method_index(method), status_index(status), status_class_index(status));
        handles.requests[m].get_or_init(|| Box::new(std::array::from_fn(|_| OnceLock::new())))[s]
            .get_or_init(|| {
                metrics::counter!(
                    "sluice_requests_total",
                    "api" => self.api.to_string(),
                    "method" => METHODS[m],
                    "status" => STATUS_LABELS[s],
                    "status_class" => STATUS_CLASSES[c]
                )
            })
            .increment(1);
        handles.duration.record(elapsed.as_secs_f64());
        handles.traffic.record(status, elapsed);
        let (bytes_in, bytes_out) = bytes;
        if bytes_in > 0 {
            handles.bytes_in.increment(bytes_in);
        }
        handles.bytes_out.increment(bytes_out);
        if let Some(code) = grpc_status {
            let g = usize::from(code).min(GRPC_CODES.len() - 1);
            handles.grpc[g]
                .get_or_init(|| {
                    metrics::counter!(
                        "sluice_grpc_responses_total",
                        "api" => self.api.to_string(),
                        "grpc_status" => GRPC_CODES[g]
                    )
                })
                .increment(1);
        }
    }
}

impl RequestMetrics {
    /// This API's traffic since the previous take (see [`TrafficCounters::take`]).
    pub fn take_traffic(&self) -> Option<TrafficCounts> {
        self.handles.get()?.traffic.take()
    }
}

/// Unknown methods share one label so a client cannot blow up metric cardinality.
fn method_index(method: &Method) -> usize {
    let name = method.as_str();
    METHODS[..METHODS.len() - 1].iter().position(|m| *m == name).unwrap_or(METHODS.len() - 1)
}

/// The status's own label when it has one, else its class's.
fn status_index(status: StatusCode) -> usize {
    let code = status.as_u16();
    STATUS_CODES.iter().position(|known| *known == code).unwrap_or(STATUS_CODES.len() + status_class_index(status))
}

fn status_class_index(status: StatusCode) -> usize {
    (usize::from(status.as_u16() / 100)).clamp(1, 5) - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_bounded() {
        assert_eq!(METHODS[method_index(&Method::GET)], "GET");
        assert_eq!(METHODS[method_index(&Method::PATCH)], "PATCH");
        let custom = Method::from_bytes(b"PURGE").unwrap_or(Method::GET);
        assert_eq!(METHODS[method_index(&custom)], "OTHER");
        assert_eq!(STATUS_CLASSES[status_class_index(StatusCode::SWITCHING_PROTOCOLS)], "1xx");
        assert_eq!(STATUS_CLASSES[status_class_index(StatusCode::NOT_FOUND)], "4xx");
        assert_eq!(STATUS_CLASSES[status_class_index(StatusCode::GATEWAY_TIMEOUT)], "5xx");
        for (code, label) in
            [(200, "200"), (404, "404"), (504, "504"), (299, "2xx"), (418, "4xx"), (599, "5xx"), (101, "1xx")]
        {
            assert_eq!(STATUS_LABELS[status_index(StatusCode::from_u16(code).unwrap())], label);
        }
        for (i, code) in STATUS_CODES.iter().enumerate() {
            assert_eq!(STATUS_LABELS[i], code.to_string());
        }
    }
}
