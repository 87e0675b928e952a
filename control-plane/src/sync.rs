//! The control plane's end of the snapshot push: the gRPC `ConfigSync`
//! service data planes connect to. It authenticates each stream, checks the
//! Hello, then hands the stream to a per-node session that pushes snapshots
//! and records ACK / NACK / heartbeats in the store (and the heartbeats'
//! health and traffic reports in `Telemetry`).
//!
//! Flow: store commit -> `latest` (one fetch and one encoding per change,
//! shared by every session) -> `session` (per node: coalesce, skip what the node runs or
//! refused, push) -> data plane -> ACK/NACK -> `session` -> store.
//! `sweeper` runs beside them, writes the nodes' records in batches and
//! forgets nodes that went silent. `server` is the gRPC plumbing.

mod auth;
mod latest;
mod server;
mod session;
mod sweeper;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use sluice_proto::text::truncate;
use sluice_proto::v1::{DataPlaneMessage, Hello, data_plane_message};
use sluice_proto::{AUTHORIZATION_METADATA, PROTOCOL_VERSION};
use tokio::sync::{mpsc, oneshot, watch};
use tonic::{Request, Status, Streaming};

pub use server::SyncServer;

use crate::store::{Store, now_ms};
use crate::telemetry::Telemetry;
use crate::tokens::TokenDigest;

/// Node ids key the data-plane table and the admin API's URLs.
const MAX_NODE_ID_LEN: usize = 253;
/// Hostname and software version, as stored and shown.
const MAX_LABEL_LEN: usize = 255;

/// Timing and size limits of the sync server.
#[derive(Debug, Clone)]
pub struct SyncOptions {
    /// A stream on which the data plane sent nothing (not even a heartbeat)
    /// for this long is closed, so a half-open connection does not keep a
    /// node shown as connected. Also bounds the wait for the Hello.
    pub heartbeat_timeout: Duration,
    /// A node whose last message is older than this is stale; the sweeper
    /// marks it disconnected (its session, if any, is gone or hung).
    pub stale_after: Duration,
    /// A node unseen for this long is removed from the data-plane list.
    pub purge_after: Duration,
    /// How often the sweeper looks for stale and purgeable nodes.
    pub sweep_interval: Duration,
    /// A commit this long after the last push is pushed at once; one sooner
    /// is part of a burst: wait until no further commit came for this long
    /// before fetching the snapshot, so the rest of the burst becomes one push.
    pub coalesce_delay: Duration,
    /// ...but push no later than this after the burst's first commit, so a
    /// steady stream of writes is still delivered.
    pub coalesce_max_delay: Duration,
    /// A pushed snapshot still unanswered after this long is taken as lost
    /// and the node's target is sent again. A data plane answers every
    /// snapshot once compiled, so this only needs to exceed the slowest
    /// compile of the largest configuration.
    pub ack_timeout: Duration,
    /// How often the nodes' records (heartbeats, answers) are written to
    /// the database; between writes they are in memory, where this control
    /// plane's admin API reads them.
    pub flush_interval: Duration,
    /// Largest gRPC message accepted from a data plane (a snapshot is sent
    /// whatever its size; a data plane has its own limit).
    pub max_message_size: usize,
}

impl Default for SyncOptions {
    fn default() -> Self {
        Self {
            // Data planes heartbeat every 5 s by default: three missed beats.
            heartbeat_timeout: Duration::from_secs(15),
            stale_after: Duration::from_secs(30),
            purge_after: Duration::from_secs(60 * 60),
            sweep_interval: Duration::from_secs(10),
            // Short enough that a write made right after the previous one
            // (an operator's script, one call at a time) is still served
            // within tens of milliseconds; long enough to fold a tight loop
            // of writes into a few pushes.
            coalesce_delay: Duration::from_millis(20),
            coalesce_max_delay: Duration::from_millis(250),
            ack_timeout: Duration::from_secs(30),
            flush_interval: Duration::from_secs(1),
            // A 10,000-API snapshot with specs is tens of MiB.
            max_message_size: 64 * 1024 * 1024,
        }
    }
}

/// The `ConfigSync` gRPC service. Cheap to clone; every clone shares the
/// snapshot fan-out and the registry of live sessions.
#[derive(Clone)]
pub struct SyncService {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    /// What heartbeats report beside the version (target health, traffic), kept in memory for the admin API.
    telemetry: Telemetry,
    cluster_token: TokenDigest,
    options: SyncOptions,
    /// Latest snapshot, fetched once per change for all sessions.
    latest: watch::Receiver<latest::Latest>,
    /// Live sessions by node id. A reconnecting node replaces its old
    /// session (which may be half-open), so only one session writes a node's
    /// record and only the newest may mark it disconnected.
    sessions: Mutex<HashMap<String, SessionEntry>>,
    next_session_id: AtomicU64,
    /// Dropped with the service: tells the background tasks to stop.
    _shutdown: watch::Sender<()>,
    /// Set by [`SyncService::close`]: streams end, new ones are refused.
    closing: watch::Sender<bool>,
}

struct SessionEntry {
    id: u64,
    /// Dropping it (on replacement) ends the older session.
    _cancel: oneshot::Sender<()>,
}

/// Builds the gRPC service. Spawns the snapshot fan-out, the flusher and the
/// sweeper, so it must be called inside a Tokio runtime; they stop once the
/// service and its streams are gone.
pub fn sync_server(store: Store, cluster_token: TokenDigest, options: SyncOptions) -> SyncServer {
    SyncService::new(store, cluster_token, options).into_server()
}

impl SyncService {
    /// See [`sync_server`]; use this directly only to wrap the service yourself.
    pub fn new(store: Store, cluster_token: TokenDigest, options: SyncOptions) -> Self {
        let (shutdown, shutdown_rx) = watch::channel(());
        let coalesce = latest::Coalesce { quiet: options.coalesce_delay, max_wait: options.coalesce_max_delay };
        let latest = latest::spawn(store.clone(), coalesce, shutdown_rx.clone());
        let telemetry = Telemetry::default();
        sweeper::spawn(store.clone(), telemetry.clone(), options.clone(), shutdown_rx);
        Self {
            inner: Arc::new(Inner {
                store,
                telemetry,
                cluster_token,
                options,
                latest,
                sessions: Mutex::new(HashMap::new()),
                next_session_id: AtomicU64::new(1),
                _shutdown: shutdown,
                closing: watch::channel(false).0,
            }),
        }
    }

    /// The data planes' reports of target health and traffic, for the admin API.
    pub fn telemetry(&self) -> Telemetry {
        self.inner.telemetry.clone()
    }

    /// The gRPC service for `tonic::transport::Server::add_service`. Keep a
    /// clone of `self` to [`close`](Self::close) the streams at shutdown.
    pub fn into_server(self) -> SyncServer {
        SyncServer::new(self)
    }

    /// Ends every open stream with `Unavailable` and refuses new ones, so data
    /// planes reconnect (to another control plane, or to this one once it is
    /// back). Call it when shutting down: a graceful server shutdown otherwise
    /// waits for sync streams, which never end on their own.
    pub fn close(&self) {
        self.inner.closing.send_replace(true);
    }

    fn closing(&self) -> watch::Receiver<bool> {
        self.inner.closing.subscribe()
    }

    /// Registers a session for `node_id`, ending any older one for the same
    /// node. Returns the session id and the receiver that fires on replacement.
    fn register(&self, node_id: &str) -> (u64, oneshot::Receiver<()>) {
        let id = self.inner.next_session_id.fetch_add(1, Ordering::Relaxed);
        let (cancel, cancelled) = oneshot::channel();
        let previous = self.sessions().insert(node_id.to_owned(), SessionEntry { id, _cancel: cancel });
        if previous.is_some() {
            tracing::warn!(
                node_id,
                "data plane connected again while its previous stream was open; closing the previous stream \
                 (two data planes with the same node id will keep replacing each other)"
            );
        }
        (id, cancelled)
    }

    /// Removes the session if it is still the node's current one. Returns
    /// whether it was, i.e. whether the node is now really disconnected.
    fn unregister(&self, node_id: &str, id: u64) -> bool {
        let mut sessions = self.sessions();
        if sessions.get(node_id).is_some_and(|entry| entry.id == id) {
            sessions.remove(node_id);
            true
        } else {
            false
        }
    }

    fn is_current(&self, node_id: &str, id: u64) -> bool {
        self.sessions().get(node_id).is_some_and(|entry| entry.id == id)
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, SessionEntry>> {
        // The map stays consistent even if a holder panicked: every critical
        // section is a single insert or remove.
        self.inner.sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl SyncService {
    /// The `Sync` call: checks the token and the Hello, then starts the
    /// node's session; returns what the session sends.
    async fn sync(
        &self,
        request: Request<Streaming<DataPlaneMessage>>,
    ) -> Result<mpsc::Receiver<Result<Bytes, Status>>, Status> {
        if *self.inner.closing.borrow() {
            return Err(Status::unavailable("the control plane is shutting down; reconnect later"));
        }
        let peer = request.remote_addr();
        let peer_text = peer.map_or_else(|| "unknown".to_owned(), |addr| addr.to_string());
        if let Err(refusal) = auth::check(request.metadata().get(AUTHORIZATION_METADATA), &self.inner.cluster_token) {
            tracing::warn!(peer = %peer_text, reason = %refusal, "sync stream refused: bad cluster token");
            return Err(Status::unauthenticated(refusal.to_string()));
        }
        let mut inbound = request.into_inner();
        let hello = read_hello(&mut inbound, self.inner.options.heartbeat_timeout, &peer_text).await?;

        let (tx, rx) = mpsc::channel(1);
        let session = session::Session::start(self.clone(), hello, peer, tx).await?;
        tokio::spawn(session.run(inbound));
        Ok(rx)
    }
}

/// Waits for the first message, which must be a Hello of our protocol version
/// naming the node.
async fn read_hello(inbound: &mut Streaming<DataPlaneMessage>, timeout: Duration, peer: &str) -> Result<Hello, Status> {
    let first = match tokio::time::timeout(timeout, inbound.next()).await {
        Err(_) => {
            tracing::warn!(peer, "sync stream refused: no Hello within {timeout:?}");
            return Err(Status::deadline_exceeded(format!(
                "no Hello received within {timeout:?}; the first message must be Hello"
            )));
        }
        Ok(None) => return Err(Status::cancelled("stream closed before Hello")),
        Ok(Some(Err(status))) => return Err(status),
        Ok(Some(Ok(message))) => message,
    };
    let hello = match first.message {
        Some(data_plane_message::Message::Hello(hello)) => hello,
        other => {
            let got = message_name(other.as_ref());
            tracing::warn!(peer, got, "sync stream refused: first message was not Hello");
            return Err(Status::invalid_argument(format!("the first message must be Hello, got {got}")));
        }
    };
    if hello.protocol_version != PROTOCOL_VERSION {
        let reason = format!(
            "data plane speaks sync protocol version {}, this control plane speaks version {PROTOCOL_VERSION}; \
             run data planes and control plane of compatible releases",
            hello.protocol_version
        );
        tracing::warn!(
            peer,
            node_id = %hello.node_id,
            data_plane_protocol = hello.protocol_version,
            control_plane_protocol = PROTOCOL_VERSION,
            "sync stream refused: incompatible protocol version"
        );
        return Err(Status::failed_precondition(reason));
    }
    if hello.node_id.trim().is_empty() {
        tracing::warn!(peer, "sync stream refused: Hello without node id");
        return Err(Status::invalid_argument("Hello must carry a non-empty node_id"));
    }
    if hello.node_id.len() > MAX_NODE_ID_LEN {
        tracing::warn!(peer, len = hello.node_id.len(), "sync stream refused: node id too long");
        return Err(Status::invalid_argument(format!("node_id must be at most {MAX_NODE_ID_LEN} bytes")));
    }
    // Shown to operators only: trim rather than refuse.
    let mut hello = hello;
    hello.hostname = truncate(hello.hostname, MAX_LABEL_LEN);
    hello.software_version = truncate(hello.software_version, MAX_LABEL_LEN);
    Ok(hello)
}

fn message_name(message: Option<&data_plane_message::Message>) -> &'static str {
    match message {
        Some(data_plane_message::Message::Hello(_)) => "Hello",
        Some(data_plane_message::Message::Ack(_)) => "Ack",
        Some(data_plane_message::Message::Nack(_)) => "Nack",
        Some(data_plane_message::Message::Heartbeat(_)) => "Heartbeat",
        None => "an empty message",
    }
}

/// Where operators can reach the node's proxy: the first address it says it
/// serves on, with a wildcard IP (`0.0.0.0:8080`) replaced by the IP it
/// connected from; the stream's peer address when it reports none.
fn proxy_address(proxy_addresses: &[String], peer: Option<SocketAddr>) -> String {
    let reported = proxy_addresses.first().and_then(|a| a.parse::<SocketAddr>().ok());
    match (reported, peer) {
        (Some(addr), Some(peer)) if addr.ip().is_unspecified() => SocketAddr::new(peer.ip(), addr.port()).to_string(),
        (Some(addr), _) => addr.to_string(),
        (None, peer) => peer.map(|addr| addr.to_string()).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_address_prefers_the_reported_listener() {
        let peer: Option<SocketAddr> = "10.1.2.3:50000".parse().ok();
        let cases = [
            (vec!["0.0.0.0:8080".to_string()], peer, "10.1.2.3:8080"),
            (vec!["127.0.0.1:8081".to_string()], peer, "127.0.0.1:8081"),
            (vec![], peer, "10.1.2.3:50000"),
            (vec![], None, ""),
        ];
        for (reported, peer, expected) in cases {
            assert_eq!(proxy_address(&reported, peer), expected, "{reported:?}");
        }
    }
}
