//! One data plane's stream after its Hello: keeps the node on its target
//! (the newest snapshot, or the newest it has not refused) and records what
//! the node reports (ACK, NACK, heartbeat) in the store.
//!
//! Level-triggered: after every event (commit, answer, heartbeat, a push
//! that went unanswered) the session compares what the node will run once
//! it has answered everything sent with the target, and pushes the target
//! when they differ. Deciding on the event alone (is this commit already
//! what the node runs?) left a node on a reverted change: a revert that
//! arrived while the change was still being applied looked like a no-op.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use sluice_proto::text::truncate;
use sluice_proto::v1::{DataPlaneMessage, Hello, data_plane_message};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;
use tonic::{Status, Streaming};

use super::latest::{Encoded, Latest};
use super::server::Outbound;
use super::{SyncService, now_ms, proxy_address};
use crate::store::DataPlaneRecord;

/// NACKed snapshots remembered per stream. Bounded so a node that NACKs
/// endlessly cannot grow the server's memory; only the newest matter, since
/// older snapshots are never sent again anyway.
const REFUSED_MEMORY: usize = 32;

/// Longest NACK reason stored and logged; the text comes from the data plane.
const MAX_ERROR_LEN: usize = 4096;

pub struct Session {
    service: SyncService,
    id: u64,
    /// What the store shows for this node (recorded in memory, written in
    /// batches); this session is its only writer while it is the node's
    /// registered session.
    record: DataPlaneRecord,
    tx: Outbound,
    cancelled: oneshot::Receiver<()>,
    closing: watch::Receiver<bool>,
    latest: watch::Receiver<Latest>,
    /// The newest committed snapshot this session has seen.
    head: Option<Arc<Encoded>>,
    /// What the node should run: `head`, or, when the node refused it, the
    /// newest older snapshot it has not refused; `None` when it refused all.
    target: Option<Arc<Encoded>>,
    /// The target, chosen to be sent once the stream has room.
    pending: Option<Arc<Encoded>>,
    /// Sent and not answered yet, oldest first: a data plane answers in order.
    unanswered: VecDeque<Sent>,
    /// (version, hash) of snapshots this node NACKed: never sent to it again.
    refused: VecDeque<(u64, String)>,
}

/// A snapshot pushed to the node, awaiting its ACK or NACK.
struct Sent {
    version: u64,
    hash: String,
    at: Instant,
}

/// What woke the session loop, when handling it needs all of `self`.
enum Event {
    Message(DataPlaneMessage),
    Committed,
    /// The oldest push went unanswered for `ack_timeout`.
    Unanswered,
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
        let previous = match store.data_plane(&hello.node_id).await {
            Ok(previous) => previous,
            Err(error) => {
                tracing::warn!(node_id = %hello.node_id, %error, "cannot read data-plane records");
                None
            }
        };
        // The fan-out's copy, encoded already, while it is the newest this
        // process knows: a thousand nodes reconnecting at once must not each
        // read the database. Just after a commit it may lag; then read.
        let loaded = service.inner.latest.borrow().clone().filter(|s| s.version >= store.current_version());
        let snapshot = match loaded {
            Some(snapshot) => snapshot,
            None => store.latest_snapshot().await.map(|s| Arc::new(Encoded::new(&s))).map_err(|error| {
                tracing::error!(node_id = %hello.node_id, %error, "cannot load the latest snapshot for a new stream");
                Status::unavailable("the control plane cannot load its configuration right now; retry later")
            })?,
        };

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
            last_nack_hash: previous.as_ref().and_then(|p| p.last_nack_hash.clone()),
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
            refused.push_back((version, prev.last_nack_hash.clone().unwrap_or_default()));
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
            head: None,
            target: None,
            pending: None,
            unanswered: VecDeque::new(),
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
        session.committed(snapshot).await;
        session.save();
        Ok(session)
    }

    /// Serves the stream until either side ends it, then records the node as
    /// disconnected (unless a newer stream of the same node took over).
    pub async fn run(mut self, mut inbound: Streaming<DataPlaneMessage>) {
        let options = &self.service.inner.options;
        let (timeout, ack_timeout) = (options.heartbeat_timeout, options.ack_timeout);
        let idle = tokio::time::sleep(timeout);
        tokio::pin!(idle);
        // The hub may already hold a newer snapshot than the one fetched at start.
        self.latest.mark_changed();

        let end = loop {
            let answer_due = self.unanswered.front().map(|sent| sent.at + ack_timeout);
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
                    // Still the target: an answer or a commit since it was
                    // chosen re-ran `reconcile`, which keeps `pending` current.
                    if let Some(snapshot) = self.pending.take() {
                        tracing::info!(node_id = %self.record.node_id, version = snapshot.version, "snapshot sent");
                        self.unanswered.push_back(Sent {
                            version: snapshot.version,
                            hash: snapshot.hash.clone(),
                            at: Instant::now(),
                        });
                        permit.send(Ok(snapshot.frame.clone()));
                    }
                    continue;
                }
                changed = self.latest.changed() => {
                    if changed.is_err() {
                        break End::Refused(Status::unavailable("control plane shutting down"));
                    }
                    Event::Committed
                }
                () = sleep_until_due(answer_due) => Event::Unanswered,
                () = self.tx.closed() => break End::Closed,
            };
            match event {
                Event::Message(message) => {
                    idle.as_mut().reset(Instant::now() + timeout);
                    if let Err(status) = self.handle(message).await {
                        break End::Refused(status);
                    }
                }
                Event::Committed => {
                    let newest = self.latest.borrow_and_update().clone();
                    if let Some(snapshot) = newest
                        && self.committed(snapshot).await
                    {
                        self.save();
                    }
                }
                Event::Unanswered => {
                    // A data plane answers every snapshot, so this one was
                    // lost on the way (or the node is stuck, and the idle
                    // timeout ends the stream). Its target is sent again; a
                    // late answer to the lost one is still taken as it comes.
                    let version = self.unanswered.front().map(|sent| sent.version);
                    tracing::warn!(
                        node_id = %self.record.node_id,
                        ?version,
                        "no answer to a pushed snapshot within {ack_timeout:?}; sending the target again"
                    );
                    self.unanswered.clear();
                    if self.reconcile() {
                        self.save();
                    }
                }
            }
        };
        self.finish(end).await;
    }

    /// A newer snapshot was committed: it becomes the head, and the target
    /// unless the node refused it. Returns whether the node's record changed.
    async fn committed(&mut self, snapshot: Arc<Encoded>) -> bool {
        if self.head.as_ref().is_some_and(|head| head.version >= snapshot.version) {
            return false;
        }
        self.head = Some(snapshot);
        self.retarget().await;
        self.reconcile()
    }

    /// Picks the target: the head, unless the node refused it (by version, or
    /// the same content under another version); then the newest older
    /// snapshot it has not refused, so a node whose build cannot take the
    /// newest configuration still runs the newest it can.
    async fn retarget(&mut self) {
        let Some(head) = self.head.clone() else { return };
        if !is_refused(&self.refused, head.version, &head.hash) {
            self.target = Some(head);
            return;
        }
        let refused = &self.refused;
        let found = self
            .service
            .inner
            .store
            .newest_snapshot_below(head.version, |version, hash| is_refused(refused, version, hash));
        match found.await {
            Ok(found) => {
                let node_id = &self.record.node_id;
                match &found {
                    Some(older) => tracing::info!(
                        %node_id,
                        head = head.version,
                        version = older.version,
                        "node refused the newest snapshot; its target is the newest it has not refused"
                    ),
                    None => tracing::warn!(%node_id, head = head.version, "node refused every stored snapshot"),
                }
                self.target = found.map(|older| Arc::new(Encoded::new(&older)));
            }
            // The target stays what it was; the next event tries again.
            Err(error) => tracing::warn!(node_id = %self.record.node_id, %error, "cannot look for an older snapshot"),
        }
    }

    /// Compares what the node will run once it has answered every push with
    /// the target, and chooses the target to be sent when they differ.
    /// Returns whether the node's record changed.
    fn reconcile(&mut self) -> bool {
        let Some(target) = self.target.clone() else {
            self.pending = None;
            return false;
        };
        let after_answers =
            self.unanswered.back().map(|sent| sent.hash.as_str()).or(self.record.applied_hash.as_deref());
        if after_answers != Some(target.hash.as_str()) {
            self.pending = Some(target);
            return false;
        }
        self.pending = None;
        if !self.unanswered.is_empty() || self.record.applied_version.is_some_and(|v| v >= target.version) {
            return false;
        }
        // Same content under a newer number (a no-op write, a rollback or
        // revert to what the node runs): the node runs this version too.
        tracing::debug!(node_id = %self.record.node_id, version = target.version, "node already runs this content");
        self.record.applied_version = Some(target.version);
        // Reverting a refused change lands here: that newer version counts
        // as accepted, so the NACK it supersedes is no longer shown.
        if self.record.last_nack_version.is_some_and(|nacked| target.version > nacked) {
            self.record.last_error = None;
        }
        true
    }

    /// Takes the answers up to the one for `version` off the unanswered list
    /// (answers come in order; ones before it were lost); returns the hash
    /// that push carried, for an answer without one.
    fn answered(&mut self, version: u64) -> Option<String> {
        let position = self.unanswered.iter().position(|sent| sent.version == version)?;
        self.unanswered.drain(..=position).next_back().map(|sent| sent.hash)
    }

    /// Applies one message from the data plane to the node's record.
    async fn handle(&mut self, message: DataPlaneMessage) -> Result<(), Status> {
        let node_id = self.record.node_id.clone();
        self.record.last_seen = now_ms();
        match message.message {
            Some(data_plane_message::Message::Ack(ack)) => {
                let sent_hash = self.answered(ack.version);
                let hash = if ack.hash.is_empty() { sent_hash.unwrap_or_default() } else { ack.hash };
                tracing::info!(%node_id, version = ack.version, "data plane ACKed snapshot");
                // The NACK stays visible until a newer snapshot is accepted.
                if self.record.last_nack_version.is_none_or(|nacked| ack.version > nacked) {
                    self.record.last_error = None;
                }
                self.record.applied_version = Some(ack.version);
                self.record.applied_hash = (!hash.is_empty()).then_some(hash);
                self.record.last_ack_version = Some(ack.version);
                self.reconcile();
            }
            Some(data_plane_message::Message::Nack(nack)) => {
                let sent_hash = self.answered(nack.version);
                let hash = if nack.hash.is_empty() { sent_hash.unwrap_or_default() } else { nack.hash };
                let error = truncate(nack.error, MAX_ERROR_LEN);
                tracing::warn!(%node_id, version = nack.version, %error, "data plane NACKed snapshot");
                if self.refused.len() == REFUSED_MEMORY {
                    self.refused.pop_front();
                }
                self.refused.push_back((nack.version, hash.clone()));
                self.record.last_nack_version = Some(nack.version);
                self.record.last_nack_hash = (!hash.is_empty()).then_some(hash);
                self.record.last_error = Some(error);
                self.retarget().await;
                self.reconcile();
            }
            Some(data_plane_message::Message::Heartbeat(beat)) => {
                tracing::debug!(%node_id, version = beat.current_version, "heartbeat");
                self.service.inner.telemetry.record(&node_id, self.record.last_seen, &beat);
                if beat.current_hash.is_empty() {
                    // Serving nothing yet; keep what was recorded.
                } else if self.record.applied_hash.as_deref() == Some(beat.current_hash.as_str()) {
                    // Same content: keep the newer number (see `reconcile`).
                    self.record.applied_version = self.record.applied_version.max(Some(beat.current_version));
                } else {
                    self.record.applied_version = Some(beat.current_version);
                    self.record.applied_hash = Some(beat.current_hash);
                }
                self.reconcile();
            }
            Some(data_plane_message::Message::Hello(_)) => {
                tracing::warn!(%node_id, "second Hello on one stream; closing it");
                return Err(Status::invalid_argument("Hello may be sent only once, as the first message"));
            }
            None => tracing::debug!(%node_id, "empty message from data plane ignored"),
        }
        self.save();
        Ok(())
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
            self.write();
        }
    }

    /// Records the node's state (in memory; the flusher writes it).
    fn save(&self) {
        // A replaced session must not overwrite what its successor records.
        if !self.service.is_current(&self.record.node_id, self.id) {
            return;
        }
        self.write();
    }

    fn write(&self) {
        self.service.inner.store.record_data_plane(self.record.clone());
    }
}

fn is_refused(refused: &VecDeque<(u64, String)>, version: u64, hash: &str) -> bool {
    refused.iter().any(|(v, h)| *v == version || (!h.is_empty() && h == hash))
}

/// Resolves at `due`, or never when nothing is awaited.
async fn sleep_until_due(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}
