//! Process assembly: [`App::build`] binds every listener and loads the
//! snapshot cache; [`App::run_until_stopped`] runs the proxy, the ops server
//! and the sync client side by side until SIGTERM/SIGINT, then drains.
//! `main.rs`, `sluice standalone` and the tests all start a data plane here.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tracing::{error, info, warn};

use crate::backoff::Backoff;
use crate::base::{MetricRegistry, worker};
use crate::ops;
use crate::policy::PolicyContext;
use crate::policy::auth_failures::{AuthFailures, LoginGuard};
use crate::policy::rate_limit::{RateLimitContext, RateLimitError};
use crate::policy::remote_jwks::RemoteJwksSources;
use crate::proxy::{self, ProxyOptions, TlsSetupError, workers};
use crate::routing::TableStore;
use crate::settings::{self, Settings};
use crate::sync::{SyncClient, SyncError, SyncOptions, SyncState};
use crate::trace::{ExportError, Exporter, Tracer};

/// The ops server has no long requests; it gets a short grace period of its own.
const OPS_GRACE: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("cannot bind the {listener} listener on {addr}: {source}")]
    Bind { listener: &'static str, addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Sync(#[from] SyncError),
    #[error("the {listener} server failed: {source}")]
    Serve { listener: &'static str, source: std::io::Error },
    #[error(transparent)]
    Tls(#[from] TlsSetupError),
    #[error("--redis-url: {0}")]
    RateLimit(#[from] RateLimitError),
    #[error(transparent)]
    Trace(#[from] ExportError),
}

/// What a data plane bound, as printed on stdout and logged at start-up.
#[derive(Debug, Clone, Serialize)]
pub struct Bound {
    pub http_addr: SocketAddr,
    pub https_addr: SocketAddr,
    pub ops_addr: SocketAddr,
    pub node_id: String,
}

pub struct App {
    bound: Bound,
    http_listener: TcpListener,
    https_listener: TcpListener,
    /// Built once; certificates come from the current table per handshake.
    tls_config: Arc<rustls::ServerConfig>,
    ops_listener: TcpListener,
    tables: Arc<TableStore>,
    sync: SyncClient,
    sync_state: Arc<SyncState>,
    metrics: Arc<MetricRegistry>,
    proxy_options: ProxyOptions,
    /// Sends the proxy's spans to the collector; `None` with tracing off.
    exporter: Option<Exporter>,
    shutdown_grace: Duration,
}

impl App {
    /// Binds the listeners (port 0 allowed) and applies the cached snapshot,
    /// if any, before anything is served, so the first accepted request already
    /// sees a table. Nothing is served until [`App::run_until_stopped`].
    pub async fn build(settings: Settings) -> Result<App, AppError> {
        let metrics = ops::metrics_handle();
        let node_id = settings.resolved_node_id();
        // Before any snapshot is compiled: upstream pools keep a stack per worker.
        worker::plan(settings.worker_threads);
        let tables = Arc::new(TableStore::with_context(policy_context(&settings)?));

        let http_listener = bind("http", settings.http_addr)?;
        let ops_listener = bind("ops", settings.ops_addr)?;
        let https_listener = bind("https", settings.https_addr)?;
        let http_addr = local_addr("http", &http_listener, settings.http_addr)?;
        let https_addr = local_addr("https", &https_listener, settings.https_addr)?;
        let tls_config = proxy::tls_server_config(tables.clone())?;
        let ops_addr = local_addr("ops", &ops_listener, settings.ops_addr)?;

        let sync = SyncClient::new(
            SyncOptions {
                control_plane: settings.control_plane.clone(),
                cluster_token: settings.cluster_token.clone(),
                node_id: node_id.clone(),
                hostname: settings::hostname(),
                proxy_addresses: vec![http_addr.to_string()],
                heartbeat_interval: settings.heartbeat_interval(),
                snapshot_cache: settings.snapshot_cache.clone(),
                backoff: Backoff::default(),
                tls: settings.sync_tls(),
            },
            tables.clone(),
        )?;
        sync.load_cache().await;
        let sync_state = sync.state();
        let (tracer, exporter) = match settings.tracing(&node_id) {
            Some(tracing) => {
                let (tracer, exporter) = Tracer::new(tracing)?;
                (Some(tracer), Some(exporter))
            }
            None => (None, None),
        };

        Ok(App {
            bound: Bound { http_addr, https_addr, ops_addr, node_id },
            http_listener,
            https_listener,
            tls_config,
            ops_listener,
            tables,
            sync,
            sync_state,
            metrics,
            proxy_options: ProxyOptions {
                access_log: settings.access_log.is_on(),
                idle_timeout: settings.client_idle_timeout(),
                headers: settings.header_limits(),
                client_body_timeout: settings.client_body_timeout(),
                request_id_header: settings.request_id_header.clone(),
                tracer,
                ..ProxyOptions::default()
            },
            exporter,
            shutdown_grace: settings.shutdown_grace(),
        })
    }

    pub fn bound(&self) -> &Bound {
        &self.bound
    }

    pub fn tables(&self) -> Arc<TableStore> {
        self.tables.clone()
    }

    pub fn sync_state(&self) -> Arc<SyncState> {
        self.sync_state.clone()
    }

    /// Runs until SIGTERM or SIGINT, then shuts down gracefully.
    pub async fn run_until_stopped(self) -> Result<(), AppError> {
        self.run_until(shutdown_signal()).await
    }

    /// Runs until `stop` resolves (or a server fails), then stops accepting,
    /// lets in-flight requests finish up to the grace period, and returns.
    pub async fn run_until(self, stop: impl Future<Output = ()>) -> Result<(), AppError> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let (end_tx, end_rx) = watch::channel(false);
        let proxy_stop = workers::Stop { drain: stop_rx.clone(), end: end_rx };
        let stopped = || workers::stopped(stop_rx.clone());

        let listeners =
            workers::Listeners { http: self.http_listener, https: self.https_listener, tls: self.tls_config };
        let ends = workers::start(listeners, self.tables.clone(), self.proxy_options, &proxy_stop)
            .map_err(|source| AppError::Serve { listener: "proxy", source })?;
        // Ends once the proxy workers, and with them every tracer, are gone.
        let mut exporter = self.exporter.map(|exporter| tokio::spawn(exporter.run()));
        let mut proxy: FuturesUnordered<_> = ends.into_iter().collect();
        let mut ops = tokio::spawn(ops::serve(self.ops_listener, self.tables.clone(), self.metrics, stopped()));
        let mut sync = tokio::spawn(self.sync.run(stopped()));
        info!(
            http_addr = %self.bound.http_addr,
            https_addr = %self.bound.https_addr,
            ops_addr = %self.bound.ops_addr,
            proxy_workers = worker::count(),
            "data plane running"
        );

        // A server that ends on its own is a failure: stop the rest too, since
        // a node without its proxy or its probes should be restarted.
        let mut failure = None;
        tokio::select! {
            () = stop => info!("shutdown requested; draining in-flight requests"),
            Some(end) = proxy.next() => failure = worker_failure(end),
            result = &mut ops => {
                failure = task_failure("ops", result.map(|r| r.map_err(|source| AppError::Serve { listener: "ops", source })));
            }
        }
        let _ = stop_tx.send(true);

        // Every proxy worker drains both listeners within one grace period.
        let drained = async {
            while let Some(end) = proxy.next().await {
                if !matches!(end, Ok(Ok(()))) {
                    failure = failure.take().or_else(|| worker_failure(end));
                }
            }
        };
        let in_time = tokio::time::timeout(self.shutdown_grace, drained).await;
        let _ = end_tx.send(true);
        match in_time {
            Ok(()) => info!("in-flight requests finished"),
            Err(_) => {
                warn!(grace_secs = self.shutdown_grace.as_secs(), "grace period over; dropping remaining requests");
                while proxy.next().await.is_some() {}
            }
        }
        if !ops.is_finished() && tokio::time::timeout(OPS_GRACE, &mut ops).await.is_err() {
            ops.abort();
        }
        if tokio::time::timeout(OPS_GRACE, &mut sync).await.is_err() {
            sync.abort();
        }
        // The spans of the requests drained above, sent if the collector answers in time.
        if let Some(exporter) = exporter.as_mut()
            && tokio::time::timeout(OPS_GRACE, &mut *exporter).await.is_err()
        {
            exporter.abort();
        }
        info!("data plane stopped");
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Maps a proxy worker's end into an error worth returning (None for a
/// clean end): its listener failed, or it panicked (its sender is gone).
fn worker_failure(end: Result<std::io::Result<()>, oneshot::error::RecvError>) -> Option<AppError> {
    let end = end.map(|result| result.map_err(|source| AppError::Serve { listener: "proxy", source }));
    task_failure("proxy", end.map_err(|_| "its thread panicked"))
}

/// Maps a server task's end into an error worth returning (None for a clean end).
fn task_failure<T, E: Into<AppError>>(
    listener: &'static str,
    result: Result<Result<T, E>, impl std::fmt::Display>,
) -> Option<AppError> {
    match result {
        Ok(Ok(_)) => {
            error!(listener, "server stopped unexpectedly");
            None
        }
        Ok(Err(e)) => {
            let e = e.into();
            error!(listener, error = %e, "server failed");
            Some(e)
        }
        Err(e) => {
            error!(listener, error = %e, "server task panicked");
            Some(AppError::Serve { listener, source: std::io::Error::other(e.to_string()) })
        }
    }
}

/// Rate-limit inputs from the settings. Only a malformed Redis URL fails the
/// start: an unreachable Redis is retried in the background while the node
/// serves, with cluster-wide limits following their `fail_open` meanwhile.
fn policy_context(settings: &Settings) -> Result<PolicyContext, AppError> {
    let rate_limits = match settings.redis_url.as_deref().map(str::trim).filter(|url| !url.is_empty()) {
        Some(url) => RateLimitContext::connect(url)?,
        None => RateLimitContext::local(),
    };
    let mut context = PolicyContext::local();
    context.rate_limits = rate_limits.with_trusted_proxies(settings.trusted_proxies.clone());
    context.logins = LoginGuard {
        failures: Arc::new(AuthFailures::new(settings.auth_failure_limit, settings.auth_failure_window())),
        passwords: Arc::default(),
        trusted_proxies: settings.trusted_proxies.clone().into(),
    };
    context.jwks_sources =
        Arc::new(RemoteJwksSources::new(Duration::from_secs(settings.jwks_min_refresh_interval_secs)));
    Ok(context)
}

fn bind(listener: &'static str, addr: SocketAddr) -> Result<TcpListener, AppError> {
    crate::listener::bind(addr).map_err(|source| AppError::Bind { listener, addr, source })
}

fn local_addr(listener: &'static str, socket: &TcpListener, addr: SocketAddr) -> Result<SocketAddr, AppError> {
    socket.local_addr().map_err(|source| AppError::Bind { listener, addr, source })
}

/// Resolves on SIGTERM (orchestrators) or SIGINT (Ctrl-C).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => info!("SIGTERM received"),
                    _ = tokio::signal::ctrl_c() => info!("SIGINT received"),
                }
                return;
            }
            Err(e) => warn!(error = %e, "cannot listen for SIGTERM; only SIGINT stops the process"),
        }
    }
    if let Err(e) = tokio::signal::ctrl_c().await {
        // Without any signal handler the process can only be killed; never
        // resolve rather than shutting down at once.
        error!(error = %e, "cannot listen for SIGINT");
        std::future::pending::<()>().await;
    }
}
