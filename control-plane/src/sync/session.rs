//! One data plane's stream after its Hello: decides which snapshots to push
//! (newest only, nothing the node already runs, nothing it refused) and
//! records what the node reports (ACK, NACK, heartbeat) in the store.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use sluice_proto::v1::{self, ControlPlaneMessage, DataPlaneMessage, Hello, control_plane_message, data_plane_message};
use tokio::sync::{mpsc, oneshot, watch};
use tonic::{Status, Streaming};

use super::latest::Latest;
use super::{SyncService, now_ms, proxy_address, truncate};
use crate::store::DataPlaneRecord;

/// NACKed snapshots remembered per stream. Bounded so a node that NACKs
/// endlessly cannot grow the server's memory; only the newest matter, since
/// older snapshots are never sent again anyway.
const REFUSED_MEMORY: usize = 32;

/// Longest NACK reason stored and logged; the text comes from the data plane.
const MAX_ERROR_LEN: usize = 4096;

type Outbound = mpsc::Sender<Result<ControlPlaneMessage, Status>>;

pub struct Session {
    service: SyncService,
    id: u64,
    /// What the store shows for this node; this session is its only writer
    /// while it is the node's registered session.
    record: DataPlaneRecord,
    tx: Outbound,
    cancelled: oneshot::Receiver<()>,
    closing: watch::Receiver<bool>,
    latest: watch::Receiver<Latest>,
    /// Newest version looked at; anything not newer is old news.
    newest_seen: u64,
    /// Chosen to be sent once the stream has room; replaced (coalesced) when a
    /// newer snapshot arrives first.
    pending: Option<Arc<v1::Snapshot>>,
    /// Last snapshot sent, awaiting its ACK or NACK.
    sent: Option<(u64, String)>,
    /// (version, hash) of snapshots this node NACKed: never sent to it again.
    refused: VecDeque<(u64, String)>,
}

/// What woke the session loop, when handling it needs all of `self`.
enum Event {
    Message(DataPlaneMessage),
    Committed,
}

/// Why a session ended, for the log line and the status sent to the node.
enum End {
    /// The data plane closed its side.
    Closed,
    /// The stream failed in transport; the node will reconnect.
    Broken(Status),
    /// Refused mid-stream (protocol misuse, timeout, replacement, shutdown).
    Refused(Status),
}

impl Session {
    /// Records the node as connected and picks the first snapshot to send.
    pub async fn start(
        service: SyncService,
        hello: Hello,
        peer: Option<SocketAddr>,
        tx: Outbound,
    ) -> Result<Self, Status> {
        let store = &service.inner.store;
        let now = now_ms();
        // Earlier record of this node, if any: keeps first_seen and the NACK
        // shown until a newer snapshot is accepted.
        let previous = match store.list_data_planes().await {
            Ok(nodes) => nodes.into_iter().find(|node| node.node_id == hello.node_id),
            Err(error) => {
                tracing::warn!(node_id = %hello.node_id, %error, "cannot read data-plane records");
                None
            }
        };
        let snapshot = store.latest_snapshot().await.map_err(|error| {
            tracing::error!(node_id = %hello.node_id, %error, "cannot load the latest snapshot for a new stream");
            Status::unavailable("the control plane cannot load its configuration right now; retry later")
        })?;

        let reported_hash = (!hello.current_hash.is_empty()).then(|| hello.current_hash.clone());
        let record = DataPlaneRecord {
            node_id: hello.node_id.clone(),
            hostname: hello.hostname.clone(),
            address: proxy_address(&hello.proxy_addresses, peer),
            software_version: hello.software_version.clone(),
            protocol_version: hello.protocol_version,
            applied_version: reported_hash.as_ref().map(|_| hello.current_version),
            applied_hash: reported_hash,
            last_ack_version: previous.as_ref().and_then(|p| p.last_ack_version),
            last_nack_version: previous.as_ref().and_then(|p| p.last_nack_version),
            last_error: previous.as_ref().and_then(|p| p.last_error.clone()),
            connected: true,
            first_seen: previous.as_ref().map_or(now, |p| p.first_seen),
            last_seen: now,
        };

        let mut refused = VecDeque::new();
        // A NACK survives a reconnect of the same build: the same software
        // would refuse the same snapshot again, so re-sending it is the resend
        // loop to avoid. A different build (say, the fix) gets it again.
        if let Some(prev) = &previous
            && prev.software_version == hello.software_version
            && let Some(version) = prev.last_nack_version
        {
            refused.push_back((version, String::new()));
        }

        let (id, cancelled) = service.register(&hello.node_id);
        let latest = service.inner.latest.clone();
        let closing = service.closing();
        let mut session = Self {
            service,
            id,
            record,
            tx,
            cancelled,
            closing,
            latest,
            newest_seen: 0,
            pending: None,
            sent: None,
            refused,
        };
        tracing::info!(
            node_id = %session.record.node_id,
            hostname = %session.record.hostname,
            address = %session.record.address,
            software_version = %session.record.software_version,
            current_version = hello.current_version,
            latest_version = snapshot.version,
            "data plane connected"
        );
        session.consider(snapshot);
        session.save().await;
        Ok(session)
    }

    /// Serves the stream until either side ends it, then records the node as
    /// disconnected (unless a newer stream of the same node took over).
    pub async fn run(mut self, mut inbound: Streaming<DataPlaneMessage>) {
        let timeout = self.service.inner.options.heartbeat_timeout;
        let idle = tokio::time::sleep(timeout);
        tokio::pin!(idle);
        // The hub may already hold a newer snapshot than the one fetched at start.
        self.latest.mark_changed();

        let end = loop {
            // Branches that need `&mut self` hand an event out of the select:
            // its futures borrow parts of `self` until it returns.
            let event = tokio::select! {
                biased;
                _ = &mut self.cancelled => {
                    break End::Refused(Status::aborted("replaced by a newer sync stream with the same node id"));
                }
                _ = self.closing.wait_for(|closing| *closing) => {
                    break End::Refused(Status::unavailable("the control plane is shutting down; reconnect later"));
                }
                message = inbound.next() => match message {
                    None => break End::Closed,
                    Some(Err(status)) => break End::Broken(status),
                    Some(Ok(message)) => Event::Message(message),
                },
                () = &mut idle => {
                    break End::Refused(Status::deadline_exceeded(format!(
                        "no heartbeat from the data plane within {timeout:?}; closing the stream"
                    )));
                }
                permit = self.tx.reserve(), if self.pending.is_some() => {
                    let Ok(permit) = permit else { break End::Closed };
                    // Checked again: an ACK or NACK may have come in since it was chosen.
                    let pending = self.pending.take();
                    if let Some(snapshot) = pending.filter(|s| wanted(&self.record, &self.sent, &self.refused, s)) {
                        tracing::info!(node_id = %self.record.node_id, version = snapshot.version, "snapshot sent");
                        self.sent = Some((snapshot.version, snapshot.hash.clone()));
                        permit.send(Ok(ControlPlaneMessage {
                            message: Some(control_plane_message::Message::Snapshot((*snapshot).clone())),
                        }));
                    }
                    continue;
                }
                changed = self.latest.changed() => {
                    if changed.is_err() {
                        break End::Refused(Status::unavailable("control plane shutting down"));
                    }
                    Event::Committed
                }
                () = self.tx.closed() => break End::Closed,
            };
            match event {
                Event::Message(message) => {
                    idle.as_mut().reset(tokio::time::Instant::now() + timeout);
                    if let Err(status) = self.handle(message).await {
                        break End::Refused(status);
                    }
                }
                Event::Committed => {
                    let newest = self.latest.borrow_and_update().clone();
                    if let Some(snapshot) = newest
                        && self.consider(snapshot)
                    {
                        self.save().await;
                    }
                }
            }
        };
        self.finish(end).await;
    }

    /// Decides whether a newly committed snapshot goes to this node. Returns
    /// whether the node's record changed.
    fn consider(&mut self, snapshot: Arc<v1::Snapshot>) -> bool {
        if snapshot.version <= self.newest_seen {
            return false;
        }
        self.newest_seen = snapshot.version;
        let node_id = &self.record.node_id;
        if self.record.applied_hash.as_deref() == Some(snapshot.hash.as_str()) {
            // Same content under a newer number (no-op write, rollback to what
            // the node runs): nothing to push, and the node runs this version.
            tracing::debug!(%node_id, version = snapshot.version, "node already runs this content");
            self.record.applied_version = self.record.applied_version.max(Some(snapshot.version));
            // Reverting a refused change lands here (back to the content the
            // node runs): that newer version counts as accepted, so the NACK
            // it supersedes is no longer shown, as with an ACK.
            if self.record.last_nack_version.is_some_and(|nacked| snapshot.version > nacked) {
                self.record.last_error = None;
            }
            self.pending = None;
            return true;
        } else if self.is_refused(&snapshot) {
            tracing::info!(%node_id, version = snapshot.version, "not re-sending a snapshot this node NACKed");
            // Anything older still pending is superseded by this refused one:
            // sending it would roll the node back, not forward.
            self.pending = None;
        } else if self.wanted(&snapshot) {
            self.pending = Some(snapshot);
        } else {
            // Its content is already in flight: an older pending one is moot.
            self.pending = None;
        }
        false
    }

    fn wanted(&self, snapshot: &v1::Snapshot) -> bool {
        wanted(&self.record, &self.sent, &self.refused, snapshot)
    }

    fn is_refused(&self, snapshot: &v1::Snapshot) -> bool {
        is_refused(&self.refused, snapshot)
    }

    /// Applies one message from the data plane to the node's record.
    async fn handle(&mut self, message: DataPlaneMessage) -> Result<(), Status> {
        let node_id = self.record.node_id.clone();
        self.record.last_seen = now_ms();
        match message.message {
            Some(data_plane_message::Message::Ack(ack)) => {
                let hash = self.hash_of(ack.version, ack.hash);
                tracing::info!(%node_id, version = ack.version, "data plane ACKed snapshot");
                // DESIGN: the NACK stays visible until a newer snapshot is accepted.
                if self.record.last_nack_version.is_none_or(|nacked| ack.version > nacked) {
                    self.record.last_error = None;
                }
                self.record.applied_version = Some(ack.version);
                self.record.applied_hash = (!hash.is_empty()).then_some(hash);
                self.record.last_ack_version = Some(ack.version);
            }
            Some(data_plane_message::Message::Nack(nack)) => {
                let hash = self.hash_of(nack.version, nack.hash);
                let error = truncate(nack.error, MAX_ERROR_LEN);
                tracing::warn!(%node_id, version = nack.version, %error, "data plane NACKed snapshot");
                if self.refused.len() == REFUSED_MEMORY {
                    self.refused.pop_front();
                }
                self.refused.push_back((nack.version, hash));
                self.record.last_nack_version = Some(nack.version);
                self.record.last_error = Some(error);
            }
            Some(data_plane_message::Message::Heartbeat(beat)) => {
                tracing::debug!(%node_id, version = beat.current_version, "heartbeat");
                if beat.current_hash.is_empty() {
                    // Serving nothing yet; keep what was recorded.
                } else if self.record.applied_hash.as_deref() == Some(beat.current_hash.as_str()) {
                    // Same content: keep the newer number (see `consider`).
                    self.record.applied_version = self.record.applied_version.max(Some(beat.current_version));
                } else {
                    self.record.applied_version = Some(beat.current_version);
                    self.record.applied_hash = Some(beat.current_hash);
                }
            }
            Some(data_plane_message::Message::Hello(_)) => {
                tracing::warn!(%node_id, "second Hello on one stream; closing it");
                return Err(Status::invalid_argument("Hello may be sent only once, as the first message"));
            }
            None => tracing::debug!(%node_id, "empty message from data plane ignored"),
        }
        self.save().await;
        Ok(())
    }

    /// The hash a data plane meant: older clients may leave it empty, and the
    /// version then names the snapshot we sent.
    fn hash_of(&self, version: u64, hash: String) -> String {
        if !hash.is_empty() {
            return hash;
        }
        match &self.sent {
            Some((sent_version, sent_hash)) if *sent_version == version => sent_hash.clone(),
            _ => String::new(),
        }
    }

    async fn finish(mut self, end: End) {
        let node_id = self.record.node_id.clone();
        match &end {
            End::Closed => tracing::info!(%node_id, version = ?self.record.applied_version, "data plane disconnected"),
            End::Broken(status) => tracing::info!(
                %node_id,
                version = ?self.record.applied_version,
                reason = %status.message(),
                "data plane disconnected: stream broken"
            ),
            End::Refused(status) => tracing::warn!(
                %node_id,
                version = ?self.record.applied_version,
                reason = %status.message(),
                "closing data plane stream"
            ),
        }
        if let End::Refused(status) = end {
            // Best effort: the node may already be gone, or not reading.
            let _ = tokio::time::timeout(Duration::from_secs(1), self.tx.send(Err(status))).await;
        }
        if self.service.unregister(&node_id, self.id) {
            self.record.connected = false;
            self.record.last_seen = now_ms();
            self.write().await;
        }
    }

    /// Writes the node's record. A failed write is logged, not fatal: config
    /// delivery matters more than the status page, and the next event retries.
    async fn save(&self) {
        // A replaced session must not overwrite what its successor records.
        if !self.service.is_current(&self.record.node_id, self.id) {
            return;
        }
        self.write().await;
    }

    async fn write(&self) {
        if let Err(error) = self.service.inner.store.upsert_data_plane(&self.record).await {
            tracing::warn!(node_id = %self.record.node_id, %error, "cannot record data-plane state");
        }
    }
}

/// Whether `snapshot` should still be sent: not what the node runs, not in
/// flight, not refused. Takes fields, not the session, so the send branch can
/// call it while other parts of the session are borrowed.
fn wanted(
    record: &DataPlaneRecord,
    sent: &Option<(u64, String)>,
    refused: &VecDeque<(u64, String)>,
    snapshot: &v1::Snapshot,
) -> bool {
    record.applied_hash.as_deref() != Some(snapshot.hash.as_str())
        && sent.as_ref().is_none_or(|(_, hash)| *hash != snapshot.hash)
        && !is_refused(refused, snapshot)
}

fn is_refused(refused: &VecDeque<(u64, String)>, snapshot: &v1::Snapshot) -> bool {
    refused.iter().any(|(version, hash)| *version == snapshot.version || (!hash.is_empty() && *hash == snapshot.hash))
}
