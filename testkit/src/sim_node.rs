//! A simulated data plane, for fleet tests and the `fleet` benchmark: speaks
//! the sync protocol as `sluice-dp` does (Hello with what it runs, an answer
//! to every snapshot, heartbeats, reconnects) but compiles nothing, so one
//! process can hold a thousand of them. It can be told to be slow, to lose a
//! push, to refuse content, to stop as under SIGSTOP, to drop its stream, or
//! to come back without what it ran (a restart without a snapshot cache).
//!
//! Snapshots are read only as far as their version and hash; a refusal rule
//! that needs the content decodes it (see [`Pushed::decode`]).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use prost::Message;
use sluice_proto::v1::{Ack, DataPlaneMessage, Heartbeat, Hello, Nack, Snapshot, data_plane_message};
use sluice_proto::{AUTHORIZATION_METADATA, PROTOCOL_VERSION};
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;

/// How a node identifies itself and paces its stream.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// `http://host:port` of the control plane's sync server.
    pub control_plane: String,
    pub cluster_token: String,
    pub node_id: String,
    /// A NACK is remembered for reconnects of the same build only.
    pub software_version: String,
    pub heartbeat: Duration,
    /// Wait before reconnecting after the stream ended.
    pub reconnect_delay: Duration,
}

impl SimOptions {
    pub fn new(control_plane: impl Into<String>, cluster_token: impl Into<String>, node_id: impl Into<String>) -> Self {
        Self {
            control_plane: control_plane.into(),
            cluster_token: cluster_token.into(),
            node_id: node_id.into(),
            software_version: "sim-1".into(),
            heartbeat: Duration::from_secs(5),
            reconnect_delay: Duration::from_millis(100),
        }
    }
}

/// A snapshot as pushed: version and hash read, the rest left encoded.
#[derive(Clone)]
pub struct Pushed {
    pub version: u64,
    pub hash: String,
    encoded: Bytes,
}

impl Pushed {
    /// The whole snapshot, for a rule that looks at the content.
    pub fn decode(&self) -> Result<Snapshot> {
        Snapshot::decode(self.encoded.clone()).context("decoding a pushed snapshot")
    }
}

/// Decides the node's answer to a snapshot: `Some(reason)` NACKs it.
pub type RefusalRule = Arc<dyn Fn(&Pushed) -> Option<String> + Send + Sync>;

/// What the node does to the snapshots it is sent.
#[derive(Clone, Default)]
pub struct Faults {
    /// Time taken before answering (a slow compile).
    pub delay: Duration,
    /// How many of the next snapshots are lost: neither applied nor answered.
    pub lose_next: u32,
    /// Content this node refuses, as a data plane of another build might.
    pub refuse: Option<RefusalRule>,
}

/// The node's view, as a test checks it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeState {
    /// `(version, hash)` of the snapshot it serves.
    pub running: Option<(u64, String)>,
    pub connected: bool,
    /// Snapshots received over all streams.
    pub received: u64,
    /// Every `(version, hash)` it NACKed, oldest first.
    pub refused: Vec<(u64, String)>,
}

/// One snapshot's arrival, for an observer timing pushes.
#[derive(Debug, Clone, Copy)]
pub struct Arrival {
    pub node: usize,
    pub version: u64,
    pub at: Instant,
}

struct Shared {
    options: SimOptions,
    index: usize,
    faults: Mutex<Faults>,
    state: Mutex<NodeState>,
    /// Woken on every state change, for [`SimNode::wait_until`].
    changed: Notify,
    paused: watch::Sender<bool>,
    /// Fired to end the current stream (the node then reconnects).
    hang_up: Notify,
    observer: Option<mpsc::UnboundedSender<Arrival>>,
}

/// A running simulated data plane; dropping it ends it.
pub struct SimNode {
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SimNode {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SimNode {
    /// Starts the node; it connects (and reconnects) in the background.
    pub fn start(options: SimOptions) -> Result<SimNode> {
        Self::start_observed(options, 0, None)
    }

    /// As [`SimNode::start`], reporting each snapshot's arrival as node `index`.
    pub fn start_observed(
        options: SimOptions,
        index: usize,
        observer: Option<mpsc::UnboundedSender<Arrival>>,
    ) -> Result<SimNode> {
        let endpoint = Endpoint::from_shared(options.control_plane.clone())
            .context("control plane address")?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true);
        let shared = Arc::new(Shared {
            options,
            index,
            faults: Mutex::default(),
            state: Mutex::default(),
            changed: Notify::new(),
            paused: watch::channel(false).0,
            hang_up: Notify::new(),
            observer,
        });
        let task = tokio::spawn(run(shared.clone(), endpoint));
        Ok(SimNode { shared, task })
    }

    pub fn node_id(&self) -> &str {
        &self.shared.options.node_id
    }

    pub fn state(&self) -> NodeState {
        self.shared.state().clone()
    }

    pub fn set_faults(&self, faults: Faults) {
        *lock(&self.shared.faults) = faults;
    }

    pub fn update_faults(&self, change: impl FnOnce(&mut Faults)) {
        change(&mut lock(&self.shared.faults));
    }

    /// Stops reading and heartbeating, as a process under SIGSTOP; the stream stays open.
    pub fn pause(&self) {
        self.shared.paused.send_replace(true);
    }

    pub fn resume(&self) {
        self.shared.paused.send_replace(false);
    }

    pub fn is_paused(&self) -> bool {
        *self.shared.paused.borrow()
    }

    /// Ends the stream; the node reconnects after its reconnect delay.
    pub fn hang_up(&self) {
        self.shared.hang_up.notify_one();
    }

    /// Ends the stream and forgets what it ran, as a restart without cache.
    pub fn restart_without_cache(&self) {
        self.shared.update(|state| state.running = None);
        self.hang_up();
    }

    /// Waits until `check` holds for the node's state, or fails after `wait`
    /// with the last state seen.
    pub async fn wait_until(&self, wait: Duration, check: impl Fn(&NodeState) -> bool) -> Result<NodeState> {
        let deadline = Instant::now() + wait;
        loop {
            let changed = self.shared.changed.notified();
            let state = self.state();
            if check(&state) {
                return Ok(state);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                bail!("node {} never reached the state waited for; last: {:?}", self.node_id(), self.state());
            }
        }
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, NodeState> {
        lock(&self.state)
    }

    fn update(&self, change: impl FnOnce(&mut NodeState)) {
        change(&mut self.state());
        self.changed.notify_waiters();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn run(shared: Arc<Shared>, endpoint: Endpoint) {
    loop {
        if let Err(error) = stream(&shared, &endpoint).await {
            tracing::debug!(node_id = %shared.options.node_id, %error, "simulated data plane: stream ended");
        }
        shared.update(|state| state.connected = false);
        tokio::time::sleep(shared.options.reconnect_delay).await;
    }
}

/// The server's messages, read no further than the snapshot's bytes.
#[derive(Clone, PartialEq, prost::Message)]
struct RawControlPlaneMessage {
    #[prost(bytes = "bytes", optional, tag = "1")]
    snapshot: Option<Bytes>,
}

/// A snapshot's leading fields; prost skips the rest without copying it.
#[derive(Clone, PartialEq, prost::Message)]
struct SnapshotHead {
    #[prost(uint64, tag = "1")]
    version: u64,
    #[prost(string, tag = "2")]
    hash: String,
}

/// One stream's life: Hello, then answers and heartbeats until it ends.
async fn stream(shared: &Arc<Shared>, endpoint: &Endpoint) -> Result<()> {
    let channel = endpoint.connect().await.context("connecting")?;
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(256 * 1024 * 1024);
    grpc.ready().await.context("channel not ready")?;

    let (tx, rx) = mpsc::channel::<DataPlaneMessage>(16);
    let running = shared.state().running.clone();
    let hello = Hello {
        node_id: shared.options.node_id.clone(),
        hostname: format!("{}.sim", shared.options.node_id),
        software_version: shared.options.software_version.clone(),
        protocol_version: PROTOCOL_VERSION,
        current_hash: running.as_ref().map(|(_, hash)| hash.clone()).unwrap_or_default(),
        current_version: running.as_ref().map_or(0, |(version, _)| *version),
        proxy_addresses: Vec::new(),
    };
    tx.send(message(data_plane_message::Message::Hello(hello))).await.context("queue closed")?;
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    let token = format!("Bearer {}", shared.options.cluster_token).parse().context("cluster token")?;
    request.metadata_mut().insert(AUTHORIZATION_METADATA, token);
    let path = http::uri::PathAndQuery::from_static("/sluice.v1.ConfigSync/Sync");
    let codec = tonic_prost::ProstCodec::<DataPlaneMessage, RawControlPlaneMessage>::default();
    let mut inbound = grpc.streaming(request, path, codec).await.context("Sync refused")?.into_inner();
    shared.update(|state| state.connected = true);

    let period = shared.options.heartbeat;
    let mut heartbeat = tokio::time::interval_at(Instant::now() + period, period);
    let mut paused = shared.paused.subscribe();
    loop {
        // Paused: neither read nor beat, as a stopped process.
        paused.wait_for(|paused| !*paused).await.context("node dropped")?;
        tokio::select! {
            message = inbound.message() => {
                let Some(message) = message.context("stream failed")? else { bail!("stream closed by the server") };
                let Some(encoded) = message.snapshot else { continue };
                let head = SnapshotHead::decode(encoded.clone()).context("snapshot head")?;
                let pushed = Pushed { version: head.version, hash: head.hash, encoded };
                if let Some(observer) = &shared.observer {
                    let _ = observer.send(Arrival { node: shared.index, version: pushed.version, at: Instant::now() });
                }
                shared.update(|state| state.received += 1);
                if let Some(answer) = answer(shared, &pushed).await {
                    tx.send(answer).await.context("queue closed")?;
                }
            }
            _ = heartbeat.tick() => {
                let running = shared.state().running.clone().unwrap_or_default();
                let beat = Heartbeat { current_version: running.0, current_hash: running.1, ..Heartbeat::default() };
                tx.send(message(data_plane_message::Message::Heartbeat(beat))).await.context("queue closed")?;
            }
            _ = paused.changed() => {}
            () = shared.hang_up.notified() => bail!("hung up"),
        }
    }
}

/// Applies (or refuses, or loses) one snapshot; `None` when it is lost.
async fn answer(shared: &Shared, pushed: &Pushed) -> Option<DataPlaneMessage> {
    let (delay, refusal) = {
        let mut faults = lock(&shared.faults);
        if faults.lose_next > 0 {
            faults.lose_next -= 1;
            return None;
        }
        (faults.delay, faults.refuse.as_ref().and_then(|rule| rule(pushed)))
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let (version, hash) = (pushed.version, pushed.hash.clone());
    let reply = match refusal {
        Some(error) => {
            shared.update(|state| state.refused.push((version, hash.clone())));
            data_plane_message::Message::Nack(Nack { version, hash, error })
        }
        None => {
            shared.update(|state| state.running = Some((version, hash.clone())));
            data_plane_message::Message::Ack(Ack { version, hash })
        }
    };
    Some(message(reply))
}

fn message(message: data_plane_message::Message) -> DataPlaneMessage {
    DataPlaneMessage { message: Some(message) }
}
