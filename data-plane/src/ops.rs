//! The ops listener (`--ops-addr`), separate from the proxy port so that
//! health probes and scrapes never compete with traffic or match a route:
//! `/healthz` (process alive), `/readyz` (a routing table is applied),
//! `/metrics` (Prometheus text).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tracing::warn;

use crate::routing::TableStore;

/// Latency buckets in seconds, from sub-millisecond proxy overhead to slow upstreams.
const SECONDS_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

static METRICS: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process-wide Prometheus handle. The global recorder can be installed
/// only once per process, and tests build several apps in one process, so the
/// first caller installs it and everyone shares the handle. If some other
/// recorder got there first, metrics render empty instead of panicking.
pub fn metrics_handle() -> PrometheusHandle {
    METRICS
        .get_or_init(|| {
            let builder = match PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
            {
                Ok(builder) => builder,
                Err(e) => {
                    warn!(error = %e, "invalid histogram buckets; histograms render as summaries");
                    PrometheusBuilder::new()
                }
            };
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            if let Err(e) = metrics::set_global_recorder(recorder) {
                warn!(error = %e, "a metrics recorder is already installed; /metrics will be empty");
            } else {
                crate::sync::describe_metrics();
                describe_proxy_metrics();
                spawn_upkeep(handle.clone());
            }
            handle
        })
        .clone()
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
}

/// How often histogram samples are folded into their buckets.
///
/// Until then every request's samples are held raw (8 bytes each plus block
/// overhead), so what they hold grows with the request rate times this
/// interval. Folding costs the same per sample whenever it happens, so a
/// short interval costs nothing more.
const HISTOGRAM_UPKEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Histograms accumulate samples until drained; without upkeep an unscraped
/// node would grow without bound.
fn spawn_upkeep(handle: PrometheusHandle) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(HISTOGRAM_UPKEEP_INTERVAL);
        loop {
            tick.tick().await;
            handle.run_upkeep();
        }
    });
}

#[derive(Clone)]
struct OpsState {
    tables: Arc<TableStore>,
    metrics: PrometheusHandle,
}

pub fn router(tables: Arc<TableStore>, metrics: PrometheusHandle) -> Router {
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
    metrics: PrometheusHandle,
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
