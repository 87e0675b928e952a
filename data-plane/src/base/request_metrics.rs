//! Per-API request metrics with their handles resolved once, held by each
//! compiled API (`routing`) and recorded by the proxy's access log. A `counter!`
//! with labels builds its key (label strings included) and looks it up in
//! the registry on every call; here each (method, status class) handle is
//! registered on its first request and the request path after that only
//! increments an atomic. Handles are allocated lazily, so an API that never
//! sees traffic costs one pointer and adds no series to `/metrics`.

use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

use http::{Method, StatusCode};
use metrics::{Counter, Histogram};

const METHODS: [&str; 10] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE", "OTHER"];
const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];
/// gRPC's status codes (0 OK to 16 UNAUTHENTICATED), then any other value.
const GRPC_CODES: [&str; 18] =
    ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16", "other"];

/// `sluice_requests_total` and `sluice_request_duration_seconds` of one API.
#[derive(Debug)]
pub struct RequestMetrics {
    api: Arc<str>,
    handles: OnceLock<Box<Handles>>,
}

#[derive(Debug)]
struct Handles {
    requests: [[OnceLock<Counter>; STATUS_CLASSES.len()]; METHODS.len()],
    duration: Histogram,
    grpc: [OnceLock<Counter>; GRPC_CODES.len()],
}

/// Requests that matched no API (404, 405, not ready) are counted under `api="-"`.
pub static UNROUTED: LazyLock<RequestMetrics> = LazyLock::new(|| RequestMetrics::new("-".into()));

impl RequestMetrics {
    pub fn new(api: Arc<str>) -> Self {
        RequestMetrics { api, handles: OnceLock::new() }
    }

    /// `grpc_status`: a gRPC response's `grpc-status`, counted in
    /// `sluice_grpc_responses_total`.
    pub fn record(&self, method: &Method, status: StatusCode, elapsed: Duration, grpc_status: Option<u16>) {
        let handles = self.handles.get_or_init(|| {
            Box::new(Handles {
                requests: Default::default(),
                duration: metrics::histogram!("sluice_request_duration_seconds", "api" => self.api.to_string()),
                grpc: Default::default(),
            })
        });
        let (m, s) = (method_index(method), status_class_index(status));
        handles.requests[m][s]
            .get_or_init(|| {
                metrics::counter!(
                    "sluice_requests_total",
                    "api" => self.api.to_string(),
                    "method" => METHODS[m],
                    "status_class" => STATUS_CLASSES[s]
                )
            })
            .increment(1);
        handles.duration.record(elapsed.as_secs_f64());
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

/// Unknown methods share one label so a client cannot blow up metric cardinality.
fn method_index(method: &Method) -> usize {
    let name = method.as_str();
    METHODS[..METHODS.len() - 1].iter().position(|m| *m == name).unwrap_or(METHODS.len() - 1)
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
    }
}
