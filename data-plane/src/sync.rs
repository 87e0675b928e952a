//! The sync client: the data plane's only link to the control plane. It says
//! Hello, receives snapshots on one gRPC stream, has the routing table store
//! compile and swap each one, answers Ack or Nack, sends heartbeats (with
//! the traffic and target-health summary `report` builds), and
//! reconnects with backoff. While it is disconnected the proxy keeps serving
//! the last table it applied. `transport` makes the connections (TLS for an
//! `https://` control plane).

mod report;
mod transport;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_proto::v1::config_sync_client::ConfigSyncClient;
use sluice_proto::v1::{
    Ack, ControlPlaneMessage, DataPlaneMessage, Heartbeat, Hello, Nack, Snapshot, control_plane_message,
    data_plane_message,
};
use sluice_proto::{AUTHORIZATION_METADATA, PROTOCOL_VERSION};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, error, info, warn};

use crate::backoff::Backoff;
use crate::base::error_chain;
use crate::routing::{ApplyOutcome, CompileError, TableStore};
use crate::snapshot_cache::{self, CacheKey};

pub use transport::{Connector, SyncTls, TransportError};

/// Gauge: 1 while the sync stream is open, 0 otherwise.
pub const METRIC_SYNC_CONNECTED: &str = "sluice_sync_connected";
/// Counter: routing tables swapped in (from the control plane or the cache).
pub const METRIC_SNAPSHOT_SWAPS: &str = "sluice_snapshot_swaps_total";
/// Counter: snapshots rejected (Nacked).
pub const METRIC_SNAPSHOT_REJECTS: &str = "sluice_snapshot_rejects_total";
/// Gauge: version of the snapshot being served.
pub const METRIC_SNAPSHOT_VERSION: &str = "sluice_snapshot_version";
/// Histogram: time to compile a snapshot into a routing table.
pub const METRIC_COMPILE_SECONDS: &str = "sluice_snapshot_compile_seconds";

/// Snapshots hold whole OpenAPI documents; tonic's 4 MiB default would reject
/// a large but legitimate configuration.
const MAX_SNAPSHOT_BYTES: usize = 256 * 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP/2 pings notice a control plane that vanished without closing the
/// connection (host down, partition) long before TCP would.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("invalid control plane address {url:?}: {source}")]
    InvalidEndpoint { url: String, source: tonic::transport::Error },
    #[error("cluster token is not a valid header value")]
    InvalidToken,
    #[error("--snapshot-cache needs --cluster-token: the cache is sealed with a key derived from it")]
    CacheWithoutToken,
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("cannot connect to control plane {url}: {reason}")]
    Connect { url: String, reason: String },
    /// The connection was made but TLS could not be set up: the certificates
    /// or their files are wrong, which retrying alone will not fix.
    #[error("cannot connect to control plane {url}: {reason}")]
    Tls { url: String, reason: String },
    #[error("control plane refused the sync stream ({code:?}): {message}")]
    Refused { code: Code, message: String },
    #[error("sync stream failed ({code:?}): {message}")]
    Stream { code: Code, message: String },
    #[error("control plane closed the sync stream")]
    Closed,
}

impl SyncError {
    /// `certificate_was_required`: the control plane asked for a client
    /// certificate this data plane does not have.
    fn from_status(status: tonic::Status, opening: bool, url: &str, certificate_was_required: bool) -> Self {
        let code = status.code();
        // A TLS 1.3 server refuses a client certificate after the client's
        // side of the handshake is done: the alert surfaces here, under the
        // status, as the cause of a cancelled call, unless the connection
        // closed before it was read.
        let causes = std::error::Error::source(&status).map(error_chain).unwrap_or_default();
        let hint = transport::refused_client_certificate(&causes)
            .or((opening && certificate_was_required).then_some(transport::CERTIFICATE_REQUIRED));
        if let Some(hint) = hint {
            return SyncError::Tls { url: url.to_owned(), reason: format!("{causes}: {hint}") };
        }
        let message = match causes.is_empty() {
            true => status.message().to_owned(),
            false => format!("{}: {causes}", status.message()),
        };
        if opening { SyncError::Refused { code, message } } else { SyncError::Stream { code, message } }
    }

    /// Failures that retrying cannot fix without an operator (wrong token,
    /// incompatible protocol): logged as errors, not warnings.
    pub fn needs_operator(&self) -> bool {
        matches!(
            self,
            SyncError::InvalidToken
                | SyncError::CacheWithoutToken
                | SyncError::Transport(_)
                | SyncError::Tls { .. }
                | SyncError::Refused {
                    code: Code::Unauthenticated
                        | Code::PermissionDenied
                        | Code::FailedPrecondition
                        | Code::Unimplemented,
                    ..
                }
                | SyncError::Stream {
                    code: Code::Unauthenticated | Code::PermissionDenied | Code::FailedPrecondition,
                    ..
                }
        )
    }
}

/// The snapshot a node currently serves, as reported to the control plane.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    pub version: u64,
    pub hash: String,
}

/// What the sync client shares with the rest of the process (ops endpoints, tests).
#[derive(Debug, Default)]
pub struct SyncState {
    connected: AtomicBool,
    current: Mutex<Option<Applied>>,
}

impl SyncState {
    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    pub fn current(&self) -> Option<Applied> {
        self.current.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set_connected(&self, connected: bool) {
        self.connected.store(connected, Ordering::Relaxed);
        metrics::gauge!(METRIC_SYNC_CONNECTED).set(if connected { 1.0 } else { 0.0 });
    }

    fn set_current(&self, applied: Applied) {
        metrics::gauge!(METRIC_SNAPSHOT_VERSION).set(applied.version as f64);
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(applied);
    }
}

/// Registers descriptions so `/metrics` explains the sync series.
pub fn describe_metrics() {
    metrics::describe_gauge!(METRIC_SYNC_CONNECTED, "1 while the sync stream to the control plane is open");
    metrics::describe_counter!(METRIC_SNAPSHOT_SWAPS, "Routing tables swapped in");
    metrics::describe_counter!(METRIC_SNAPSHOT_REJECTS, "Snapshots rejected (NACKed) because they failed to compile");
    metrics::describe_gauge!(METRIC_SNAPSHOT_VERSION, "Version of the snapshot being served");
    metrics::describe_histogram!(
        METRIC_COMPILE_SECONDS,
        metrics::Unit::Seconds,
        "Time to compile a snapshot into a routing table"
    );
}

/// How the sync client identifies itself and paces the stream.
#[derive(Debug, Clone)]
pub struct SyncOptions {
    pub control_plane: String,
    pub cluster_token: Option<String>,
    pub node_id: String,
    pub hostname: String,
    pub proxy_addresses: Vec<String>,
    pub heartbeat_interval: Duration,
    pub snapshot_cache: Option<PathBuf>,
    pub backoff: Backoff,
    pub tls: SyncTls,
}

/// Where a snapshot came from; only the control plane's are worth caching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    ControlPlane,
    Cache,
}

pub struct SyncClient {
    options: SyncOptions,
    endpoint: Endpoint,
    connector: transport::Connector,
    /// `--snapshot-cache` and the key it is sealed with.
    cache: Option<Arc<(PathBuf, CacheKey)>>,
    authorization: Option<MetadataValue<tonic::metadata::Ascii>>,
    tables: Arc<TableStore>,
    state: Arc<SyncState>,
    /// When the last heartbeat took the traffic counters: the next one's interval starts here.
    last_summary: Mutex<Instant>,
}

impl SyncClient {
    /// Checks the address and token up front so that a typo fails start-up
    /// instead of turning into an endless reconnect loop.
    pub fn new(options: SyncOptions, tables: Arc<TableStore>) -> Result<Self, SyncError> {
        let endpoint = Endpoint::from_shared(options.control_plane.clone())
            .map_err(|source| SyncError::InvalidEndpoint { url: options.control_plane.clone(), source })?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        let connector = transport::Connector::new(&options.control_plane, options.tls.clone())?;
        let cache = match (&options.snapshot_cache, &options.cluster_token) {
            (None, _) => None,
            (Some(path), Some(token)) => Some(Arc::new((path.clone(), CacheKey::derive(token)))),
            (Some(_), None) => return Err(SyncError::CacheWithoutToken),
        };
        let authorization = match &options.cluster_token {
            Some(token) => {
                Some(MetadataValue::try_from(format!("Bearer {token}")).map_err(|_| SyncError::InvalidToken)?)
            }
            None => None,
        };
        Ok(Self {
            options,
            endpoint,
            connector,
            cache,
            authorization,
            tables,
            state: Arc::default(),
            last_summary: Mutex::new(Instant::now()),
        })
    }

    pub fn state(&self) -> Arc<SyncState> {
        self.state.clone()
    }

    /// Applies the cached snapshot, if configured and present, so the node is
    /// ready before the control plane answers. A missing, unreadable or
    /// corrupt cache is logged and ignored: the control plane is the source of
    /// truth and will send a fresh snapshot.
    pub async fn load_cache(&self) -> bool {
        let Some(cache) = self.cache.clone() else { return false };
        let loaded = tokio::task::spawn_blocking(move || snapshot_cache::load(&cache.0, &cache.1)).await;
        match loaded {
            Ok(Ok(Some(snapshot))) => {
                let version = snapshot.version;
                match self.apply(snapshot, Source::Cache).await {
                    Ok(_) => {
                        info!(version, "serving snapshot from cache until the control plane answers");
                        true
                    }
                    Err(reason) => {
                        warn!(version, %reason, "cached snapshot does not compile; ignoring it");
                        false
                    }
                }
            }
            Ok(Ok(None)) => {
                debug!("no snapshot cache yet");
                false
            }
            Ok(Err(e)) => {
                warn!(error = %e, "ignoring unusable snapshot cache");
                false
            }
            Err(e) => {
                warn!(error = %e, "reading snapshot cache failed");
                false
            }
        }
    }

    /// Keeps a sync stream open until `shutdown` resolves, reconnecting with
    /// backoff after every failure. Never returns an error: a data plane
    /// without a control plane keeps serving what it has.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut backoff = self.options.backoff.clone();
        self.state.set_connected(false);
        loop {
            let result = tokio::select! {
                result = self.session(&mut backoff) => result,
                () = &mut shutdown => break,
            };
            self.state.set_connected(false);
            let delay = backoff.next_delay();
            let retry_in_ms = delay.as_millis() as u64;
            match result {
                Ok(()) => {}
                Err(e) if e.needs_operator() => {
                    error!(control_plane = %self.options.control_plane, error = %e, retry_in_ms, "sync with control plane refused")
                }
                Err(e) => {
                    warn!(control_plane = %self.options.control_plane, error = %e, retry_in_ms, "sync with control plane failed")
                }
            }
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = &mut shutdown => break,
            }
        }
        self.state.set_connected(false);
        debug!("sync client stopped");
    }

    /// One stream's life: connect, Hello, then snapshots and heartbeats until
    /// the stream breaks.
    async fn session(&self, backoff: &mut Backoff) -> Result<(), SyncError> {
        let channel: Channel = self.endpoint.connect_with_connector(self.connector.clone()).await.map_err(|e| {
            let (url, reason) = (self.options.control_plane.clone(), error_chain(&e));
            if transport_failure(&e).is_some_and(TransportError::needs_operator) {
                SyncError::Tls { url, reason }
            } else {
                SyncError::Connect { url, reason }
            }
        })?;
        let mut client = ConfigSyncClient::new(channel).max_decoding_message_size(MAX_SNAPSHOT_BYTES);

        let (tx, rx) = mpsc::channel::<DataPlaneMessage>(16);
        // Queued before the call so Hello is the stream's first message.
        tx.send(self.hello()).await.map_err(|_| SyncError::Closed)?;
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        if let Some(value) = &self.authorization {
            request.metadata_mut().insert(AUTHORIZATION_METADATA, value.clone());
        }
        let mut inbound = client
            .sync(request)
            .await
            .map_err(|status| {
                SyncError::from_status(
                    status,
                    true,
                    &self.options.control_plane,
                    self.connector.certificate_was_required(),
                )
            })?
            .into_inner();
        self.state.set_connected(true);
        info!(control_plane = %self.options.control_plane, node_id = %self.options.node_id, "sync stream open");

        let period = self.options.heartbeat_interval;
        let mut heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                message = inbound.message() => {
                    let message = message.map_err(|status| SyncError::from_status(status, false, &self.options.control_plane, false))?;
                    let Some(ControlPlaneMessage { message }) = message else { return Err(SyncError::Closed) };
                    match message {
                        Some(control_plane_message::Message::Snapshot(snapshot)) => {
                            // Only a stream that delivers is healthy; a server that
                            // accepts and drops us at once must not be retried at full speed.
                            backoff.reset();
                            let reply = self.handle_snapshot(snapshot).await;
                            tx.send(reply).await.map_err(|_| SyncError::Closed)?;
                        }
                        // A newer control plane may send kinds this node does not know.
                        None => debug!("ignoring unknown control plane message"),
                    }
                }
                _ = heartbeat.tick() => {
                    tx.send(self.heartbeat()).await.map_err(|_| SyncError::Closed)?;
                }
            }
        }
    }

    fn hello(&self) -> DataPlaneMessage {
        let current = self.state.current().unwrap_or_default();
        DataPlaneMessage {
            message: Some(data_plane_message::Message::Hello(Hello {
                node_id: self.options.node_id.clone(),
                hostname: self.options.hostname.clone(),
                software_version: env!("CARGO_PKG_VERSION").to_owned(),
                protocol_version: PROTOCOL_VERSION,
                current_hash: current.hash,
                current_version: current.version,
                proxy_addresses: self.options.proxy_addresses.clone(),
            })),
        }
    }

    /// The served version, plus the traffic since the previous heartbeat
    /// (counted across reconnects: requests served while the control plane
    /// was away are in the first heartbeat after, over the longer interval)
    /// and the targets' health.
    fn heartbeat(&self) -> DataPlaneMessage {
        let current = self.state.current().unwrap_or_default();
        let interval = {
            let mut last = self.last_summary.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = Instant::now();
            now.duration_since(std::mem::replace(&mut *last, now))
        };
        let (traffic, targets, targets_omitted) = report::summarise(self.tables.load().as_deref(), interval);
        DataPlaneMessage {
            message: Some(data_plane_message::Message::Heartbeat(Heartbeat {
                current_hash: current.hash,
                current_version: current.version,
                traffic: Some(traffic),
                targets,
                targets_omitted,
            })),
        }
    }

    async fn handle_snapshot(&self, snapshot: Snapshot) -> DataPlaneMessage {
        let (version, hash) = (snapshot.version, snapshot.hash.clone());
        let message = match self.apply(snapshot, Source::ControlPlane).await {
            Ok(_) => data_plane_message::Message::Ack(Ack { version, hash }),
            Err(error) => {
                warn!(version, %hash, %error, "snapshot rejected; the previous routing table keeps serving");
                metrics::counter!(METRIC_SNAPSHOT_REJECTS).increment(1);
                data_plane_message::Message::Nack(Nack { version, hash, error: error.to_string() })
            }
        };
        DataPlaneMessage { message: Some(message) }
    }

    /// Verifies, compiles and swaps one snapshot; returns whether the table
    /// changed, or the reason it was rejected (its text is the Nack's error).
    async fn apply(&self, mut snapshot: Snapshot, source: Source) -> Result<bool, ApplyError> {
        // The hash is what "same snapshot, do nothing" trusts, so it must
        // really describe the content.
        sluice_proto::canonicalize(&mut snapshot);
        let actual = sluice_proto::content_hash(&snapshot);
        if actual != snapshot.hash {
            return Err(ApplyError::HashMismatch { claimed: snapshot.hash, computed: actual });
        }

        // Compiling can be expensive (schemas, certificates): keep it off the
        // async workers so proxying and heartbeats are not stalled.
        let tables = self.tables.clone();
        let (snapshot, result) = tokio::task::spawn_blocking(move || {
            let result = tables.apply(&snapshot);
            (snapshot, result)
        })
        .await
        .map_err(ApplyError::Aborted)?;
        let outcome = result?;

        let applied = Applied { version: snapshot.version, hash: snapshot.hash.clone() };
        let swapped = match outcome {
            // Same content, possibly under a newer version (a rollback to an
            // identical configuration): report the version the control plane knows.
            ApplyOutcome::Unchanged => {
                debug!(version = applied.version, "snapshot unchanged; nothing to swap");
                false
            }
            ApplyOutcome::Swapped { version, compile_time } => {
                metrics::counter!(METRIC_SNAPSHOT_SWAPS).increment(1);
                metrics::histogram!(METRIC_COMPILE_SECONDS).record(compile_time.as_secs_f64());
                info!(
                    version,
                    hash = %applied.hash,
                    compile_ms = compile_time.as_secs_f64() * 1e3,
                    source = ?source,
                    "routing table swapped"
                );
                if source == Source::ControlPlane {
                    self.persist(snapshot).await;
                }
                true
            }
        };
        self.state.set_current(applied);
        Ok(swapped)
    }

    /// Failing to write the cache does not undo the swap: the node serves the
    /// new table either way, it only loses the head start after a restart.
    async fn persist(&self, snapshot: Snapshot) {
        let Some(cache) = self.cache.clone() else { return };
        let version = snapshot.version;
        match tokio::task::spawn_blocking(move || snapshot_cache::store(&cache.0, &snapshot, &cache.1)).await {
            Ok(Ok(())) => debug!(version, "snapshot cached"),
            Ok(Err(e)) => warn!(version, error = %e, "could not write snapshot cache"),
            Err(e) => warn!(version, error = %e, "snapshot cache writer failed"),
        }
    }
}

/// Why a snapshot was not applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("snapshot hash {claimed:?} does not match its content (computed {computed})")]
    HashMismatch { claimed: String, computed: String },
    #[error("snapshot compile aborted: {0}")]
    Aborted(#[source] tokio::task::JoinError),
    #[error(transparent)]
    Compile(#[from] CompileError),
}

/// Our connector's error, if that is where `error` came from.
fn transport_failure<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a TransportError> {
    let mut source = Some(error);
    while let Some(cause) = source {
        if let Some(failure) = cause.downcast_ref::<TransportError>() {
            return Some(failure);
        }
        source = cause.source();
    }
    None
}
