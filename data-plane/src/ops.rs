//! The ops listener (`--ops-addr`), separate from the proxy port so that
//! health probes and scrapes never compete with traffic or match a route:
//! `/healthz` (process alive), `/readyz` (a routing table is applied),
//! `/metrics` (Prometheus text).

use std::sync::{Arc, Once};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;

use crate::base::MetricRegistry;
use crate::routing::TableStore;

static DESCRIBED: Once = Once::new();

/// The process-wide metric registry (see [`MetricRegistry::install`]), with
/// every series' `# HELP` text.
pub fn metrics_handle() -> Arc<MetricRegistry> {
    let registry = MetricRegistry::install();
    DESCRIBED.call_once(|| {
        crate::sync::describe_metrics();
        describe_proxy_metrics();
        // Label-less counters of rare events start at zero: until a series
        // exists, `rate()` and `increase()` cannot see its first event, and a
        // dashboard panel over it shows "no data" instead of 0.
        for name in [
            crate::sync::METRIC_SNAPSHOT_SWAPS,
            crate::sync::METRIC_SNAPSHOT_REJECTS,
            "sluice_password_verifications_total",
        ] {
            metrics::counter!(name).increment(0);
        }
    });
    registry
}

/// `# HELP` for every series of the request path (the sync client's are in
/// `sync::describe_metrics`), in one place: docs/operations.md lists the same.
fn describe_proxy_metrics() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "sluice_requests_total",
        "Requests answered, by API (`-`: no route), method, status and status class"
    );
    describe_histogram!(
        "sluice_request_duration_seconds",
        Unit::Seconds,
        "From a request's head to the last byte of its response, by API"
    );
    describe_counter!("sluice_request_bytes_total", Unit::Bytes, "Request body bytes read from clients, by API");
    describe_counter!("sluice_response_bytes_total", Unit::Bytes, "Response body bytes sent to clients, by API");
    describe_counter!("sluice_grpc_responses_total", "gRPC calls answered, by API and grpc-status");
    describe_counter!("sluice_consumer_requests_total", "Authenticated requests per configured consumer");
    describe_counter!("sluice_policy_rejections_total", "Requests a policy refused, by API, policy and status");
    describe_counter!("sluice_rate_limited_total", "Requests refused by a rate limit (429), by API");
    describe_counter!("sluice_rate_limit_redis_errors_total", "Cluster-wide rate limit checks Redis failed, by API");
    describe_counter!("sluice_auth_failures_total", "Failed authentications");
    describe_counter!(
        "sluice_auth_limited_total",
        "Requests refused because their client failed authentication too often"
    );
    describe_counter!("sluice_password_verifications_total", "Basic-auth passwords checked with argon2");
    describe_gauge!(
        "sluice_upstream_healthy",
        "1 while a target takes traffic, 0 while a health check or ejection keeps it out"
    );
    describe_gauge!("sluice_upstream_active_connections", "Requests in flight on a target");
    describe_histogram!(
        "sluice_upstream_request_duration_seconds",
        Unit::Seconds,
        "From sending an attempt to a target to its response head, by upstream"
    );
    describe_counter!("sluice_jwks_fetches_total", "JWKS fetches from a jwt policy's jwks_url, by URL and result");
    describe_counter!("sluice_upstream_retries_total", "Retries sent, by upstream");
    describe_counter!("sluice_upstream_retries_refused_total", "Retries the upstream's retry budget refused");
    describe_counter!("sluice_trace_spans_exported_total", "Spans the OTLP collector of --otlp-endpoint accepted");
    describe_counter!(
        "sluice_trace_spans_dropped_total",
        "Spans lost: the export queue was full (queue_full) or the export failed (export_failed)"
    );
}

#[derive(Clone)]
struct OpsState {
    tables: Arc<TableStore>,
    metrics: Arc<MetricRegistry>,
}

pub fn router(tables: Arc<TableStore>, metrics: Arc<MetricRegistry>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(render_metrics))
        .with_state(OpsState { tables, metrics })
}

/// Serves the ops endpoints until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    tables: Arc<TableStore>,
    metrics: Arc<MetricRegistry>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(tables, metrics)).with_graceful_shutdown(shutdown).await
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready only once a snapshot (received or cached) is applied: before that
/// every request would be a 404, so a load balancer must not send traffic yet.
async fn readyz(State(state): State<OpsState>) -> impl IntoResponse {
    if state.tables.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "no snapshot applied yet\n")
    }
}

async fn render_metrics(State(state): State<OpsState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], state.metrics.render())
}
