//! Active health checks, beside the request path: one task per upstream pool
//! probes every target on an interval and flips its health after the
//! configured number of consecutive results, which the balancer then reads.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use sluice_proto::v1;

use super::Target;
use crate::tls::UpstreamTls;

/// Probes use the pool's TLS settings, so an https target is checked the
/// way requests reach it (same roots, SNI and client certificate).
type ProbeClient = Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// Starts the checker; returns `None` outside a tokio runtime (unit tests
/// compiling a table), where the targets simply stay healthy.
pub(super) fn spawn(
    upstream: String,
    check: v1::ActiveHealthCheck,
    targets: Vec<Arc<Target>>,
    tls: &UpstreamTls,
    http2: bool,
) -> Option<tokio::task::AbortHandle> {
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    let handle = runtime.spawn(run(upstream, check, targets, tls.clone(), http2));
    Some(handle.abort_handle())
}

/// Consecutive results of one target, local to the checker task.
#[derive(Default, Clone, Copy)]
struct Streak {
    successes: u32,
    failures: u32,
}

async fn run(upstream: String, check: v1::ActiveHealthCheck, targets: Vec<Arc<Target>>, tls: UpstreamTls, http2: bool) {
    let interval = Duration::from_millis(check.interval_ms.max(1));
    let timeout = Duration::from_millis(check.timeout_ms.max(1));
    let healthy_threshold = check.healthy_threshold.max(1);
    let unhealthy_threshold = check.unhealthy_threshold.max(1);
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(timeout));
    // No pooling: a probe must open a fresh connection, or a target that stopped
    // accepting would look alive through a kept-alive socket.
    let client: ProbeClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .timer(TokioTimer::new())
        .http2_only(http2)
        .build(tls.connector(connector, http2));
    let mut streaks = vec![Streak::default(); targets.len()];
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let probes = targets.iter().map(|t| probe(&client, t, &check.path, timeout));
        let results = futures_util::future::join_all(probes).await;
        for ((target, streak), ok) in targets.iter().zip(streaks.iter_mut()).zip(results) {
            let was_healthy = target.active_healthy.load(Ordering::Relaxed);
            if ok {
                *streak = Streak { successes: streak.successes.saturating_add(1), failures: 0 };
                if !was_healthy && streak.successes >= healthy_threshold {
                    target.active_healthy.store(true, Ordering::Relaxed);
                    tracing::info!(%upstream, target = %target.url, "target healthy again");
                    target.report_health();
                }
            } else {
                *streak = Streak { successes: 0, failures: streak.failures.saturating_add(1) };
                if was_healthy && streak.failures >= unhealthy_threshold {
                    target.active_healthy.store(false, Ordering::Relaxed);
                    tracing::warn!(%upstream, target = %target.url, "target failed its health checks");
                    target.report_health();
                }
            }
        }
    }
}

/// A 2xx or 3xx answer within the timeout counts as healthy.
async fn probe(client: &ProbeClient, target: &Target, path: &str, timeout: Duration) -> bool {
    let uri = format!("{}://{}{}", target.scheme, target.authority, path);
    let Ok(request) =
        http::Request::get(uri).header(http::header::USER_AGENT, "sluice-health-check").body(Empty::new())
    else {
        return false;
    };
    match tokio::time::timeout(timeout, client.request(request)).await {
        Ok(Ok(response)) => response.status().is_success() || response.status().is_redirection(),
        _ => false,
    }
}
