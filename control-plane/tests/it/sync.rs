//! The gRPC sync server end to end: a real SQLite store, the tonic server on
//! 127.0.0.1:0, and the generated client playing a data plane.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use sluice_control_plane::model::{Balance, Target, Upstream};
use sluice_control_plane::secrets::SecretBox;
use sluice_control_plane::store::{DataPlaneRecord, Store};
use sluice_control_plane::sync::{SyncOptions, SyncService};
use sluice_control_plane::tokens::TokenDigest;
use sluice_proto::PROTOCOL_VERSION;
use sluice_proto::v1::config_sync_client::ConfigSyncClient;
use sluice_proto::v1::{
    Ack, ControlPlaneMessage, DataPlaneMessage, Heartbeat, Hello, Nack, Snapshot, control_plane_message,
    data_plane_message,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Code, Streaming};

const TOKEN: &str = "cluster-token-for-tests";
/// Bound on every wait: a broken server fails the test instead of hanging it.
const WAIT: Duration = Duration::from_secs(10);
/// How long "nothing arrives" is watched for.
const QUIET: Duration = Duration::from_millis(600);

struct Harness {
    store: Store,
    addr: SocketAddr,
    service: SyncService,
    server: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn start(options: SyncOptions) -> Result<Harness> {
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("sluice.db").display());
    let secrets = SecretBox::from_key_material(&"ab".repeat(32))?;
    let store = within(Store::open(&url, secrets)).await??;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let service = SyncService::new(store.clone(), TokenDigest::of(TOKEN), options);
    let server = service.clone().into_server();
    let server = tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(server)
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await;
        if let Err(error) = served {
            eprintln!("sync server failed: {error}");
        }
    });
    Ok(Harness { store, addr, service, server, _dir: dir })
}

/// One simulated data plane: the sending half and the snapshot stream.
struct Node {
    tx: mpsc::Sender<DataPlaneMessage>,
    rx: Streaming<ControlPlaneMessage>,
}

fn hello(node_id: &str, current: Option<&Snapshot>) -> Hello {
    Hello {
        node_id: node_id.to_owned(),
        hostname: format!("{node_id}.test"),
        software_version: "test-1".to_owned(),
        protocol_version: PROTOCOL_VERSION,
        current_hash: current.map(|s| s.hash.clone()).unwrap_or_default(),
        current_version: current.map_or(0, |s| s.version),
        proxy_addresses: vec!["127.0.0.1:8080".to_owned()],
    }
}

fn message(message: data_plane_message::Message) -> DataPlaneMessage {
    DataPlaneMessage { message: Some(message) }
}

async fn connect_with(addr: SocketAddr, token: Option<&str>, first: DataPlaneMessage) -> Result<Node, tonic::Status> {
    let mut client = ConfigSyncClient::connect(format!("http://{addr}"))
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let (tx, rx) = mpsc::channel(16);
    // Queued before the call so it is the stream's first message.
    tx.send(first).await.map_err(|_| tonic::Status::internal("queue closed"))?;
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().map_err(|_| tonic::Status::internal("bad metadata"))?;
        request.metadata_mut().insert("authorization", value);
    }
    let response = tokio::time::timeout(WAIT, client.sync(request))
        .await
        .map_err(|_| tonic::Status::deadline_exceeded("test: no response to Sync"))??;
    Ok(Node { tx, rx: response.into_inner() })
}

async fn connect(addr: SocketAddr, hello: Hello) -> Result<Node> {
    connect_with(addr, Some(TOKEN), message(data_plane_message::Message::Hello(hello)))
        .await
        .map_err(|status| anyhow!("connect refused: {status:?}"))
}

impl Node {
    async fn next_snapshot_within(&mut self, wait: Duration) -> Result<Option<Snapshot>> {
        match tokio::time::timeout(wait, self.rx.message()).await {
            Err(_) => Ok(None),
            Ok(Err(status)) => bail!("stream failed: {status:?}"),
            Ok(Ok(None)) => bail!("stream ended"),
            Ok(Ok(Some(ControlPlaneMessage { message: Some(control_plane_message::Message::Snapshot(s)) }))) => {
                Ok(Some(s))
            }
            Ok(Ok(Some(other))) => bail!("unexpected message {other:?}"),
        }
    }

    async fn next_snapshot(&mut self) -> Result<Snapshot> {
        self.next_snapshot_within(WAIT).await?.context("no snapshot arrived in time")
    }

    async fn send(&self, msg: data_plane_message::Message) -> Result<()> {
        self.tx.send(message(msg)).await.map_err(|_| anyhow!("stream closed"))
    }

    async fn ack(&self, snapshot: &Snapshot) -> Result<()> {
        self.send(data_plane_message::Message::Ack(Ack { version: snapshot.version, hash: snapshot.hash.clone() }))
            .await
    }

    async fn heartbeat(&self, running: &Snapshot) -> Result<()> {
        self.send(data_plane_message::Message::Heartbeat(Heartbeat {
            current_hash: running.hash.clone(),
            current_version: running.version,
            ..Heartbeat::default()
        }))
        .await
    }
}

static UPSTREAMS: AtomicUsize = AtomicUsize::new(0);

/// Commits one change (a new upstream) and returns the new version.
async fn write(store: &Store) -> Result<u64> {
    let n = UPSTREAMS.fetch_add(1, Ordering::Relaxed);
    let committed = within(store.write("sync test", move |cfg| {
        cfg.upstreams.push(Upstream {
            name: format!("up-{n}"),
            targets: vec![Target { url: format!("http://127.0.0.1:{}", 10_000 + n), weight: 1 }],
            balance: Balance::RoundRobin,
            hash_on: None,
            health_check: None,
            passive_health_check: None,
            tls: None,
            http2: false,
            retry_budget: None,
        });
        Ok::<_, Infallible>(())
    }))
    .await??;
    ensure!(committed.changed, "write committed nothing");
    Ok(committed.version)
}

async fn within<F: Future>(future: F) -> Result<F::Output> {
    tokio::time::timeout(WAIT, future).await.map_err(|_| anyhow!("timed out after {WAIT:?}"))
}

/// Polls the store until `node_id`'s record satisfies `check`.
async fn record_where(
    store: &Store,
    node_id: &str,
    check: impl Fn(&DataPlaneRecord) -> bool,
) -> Result<DataPlaneRecord> {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut last = None;
    while tokio::time::Instant::now() < deadline {
        last = store.list_data_planes().await?.into_iter().find(|r| r.node_id == node_id);
        if let Some(record) = last.as_ref().filter(|r| check(r)) {
            return Ok(record.clone());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("record of {node_id} never matched; last seen: {last:?}")
}

fn fast() -> SyncOptions {
    SyncOptions::default()
}

#[tokio::test]
async fn wrong_or_missing_token_is_refused() -> Result<()> {
    let h = start(fast()).await?;
    let hello = || message(data_plane_message::Message::Hello(hello("dp-token", None)));

    let refused = connect_with(h.addr, Some("not-the-token"), hello()).await.err().context("wrong token accepted")?;
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert!(refused.message().contains("invalid cluster token"), "{refused:?}");

    let refused = connect_with(h.addr, None, hello()).await.err().context("missing token accepted")?;
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert!(refused.message().contains("Bearer"), "{refused:?}");

    // Nothing about a refused node is recorded.
    assert!(h.store.list_data_planes().await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn wrong_protocol_version_is_refused_with_both_versions() -> Result<()> {
    let h = start(fast()).await?;
    let other = PROTOCOL_VERSION + 41;
    let first = message(data_plane_message::Message::Hello(Hello { protocol_version: other, ..hello("dp-old", None) }));
    let refused = connect_with(h.addr, Some(TOKEN), first).await.err().context("wrong protocol accepted")?;
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains(&format!("version {other}")), "{refused:?}");
    assert!(refused.message().contains(&format!("version {PROTOCOL_VERSION}")), "{refused:?}");
    Ok(())
}

#[tokio::test]
async fn first_message_must_be_hello() -> Result<()> {
    let h = start(fast()).await?;
    let first = message(data_plane_message::Message::Heartbeat(Heartbeat::default()));
    let refused = connect_with(h.addr, Some(TOKEN), first).await.err().context("heartbeat-first accepted")?;
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    Ok(())
}

#[tokio::test]
async fn current_snapshot_on_connect_then_each_write() -> Result<()> {
    let h = start(fast()).await?;
    let before = write(&h.store).await?;
    let mut node = connect(h.addr, hello("dp-1", None)).await?;

    let first = node.next_snapshot().await?;
    assert_eq!(first.version, before);
    assert!(!first.hash.is_empty());
    assert_eq!(first.upstreams.len(), 1);
    let record = record_where(&h.store, "dp-1", |r| r.connected).await?;
    assert_eq!(record.hostname, "dp-1.test");
    assert_eq!(record.software_version, "test-1");
    assert_eq!(record.protocol_version, PROTOCOL_VERSION);
    assert!(record.address.starts_with("127.0.0.1:"), "{record:?}");

    let started = tokio::time::Instant::now();
    let after = write(&h.store).await?;
    let second = node.next_snapshot_within(Duration::from_secs(2)).await?.context("write not pushed within 2 s")?;
    assert_eq!(second.version, after);
    assert_ne!(second.hash, first.hash);
    assert_eq!(second.upstreams.len(), 2);
    eprintln!("write pushed in {:?}", started.elapsed());
    Ok(())
}

#[tokio::test]
async fn node_already_running_latest_gets_nothing_but_is_recorded() -> Result<()> {
    let h = start(fast()).await?;
    write(&h.store).await?;
    let latest = within(h.store.latest_snapshot()).await??;
    let mut node = connect(h.addr, hello("dp-current", Some(&latest))).await?;

    assert!(node.next_snapshot_within(QUIET).await?.is_none(), "snapshot the node already runs was sent");
    let record = record_where(&h.store, "dp-current", |r| r.connected).await?;
    assert_eq!(record.applied_version, Some(latest.version));
    assert_eq!(record.applied_hash.as_deref(), Some(latest.hash.as_str()));

    // It still gets the next change.
    let next = write(&h.store).await?;
    assert_eq!(node.next_snapshot().await?.version, next);
    Ok(())
}

#[tokio::test]
async fn burst_of_writes_is_coalesced() -> Result<()> {
    // A quiet time far above a write's duration, even on a loaded machine, so that the burst is one burst: a
    // push ends only where the writes paused for the quiet time (counted below) or the burst outlasted the
    // longest wait.
    let options = SyncOptions {
        coalesce_delay: Duration::from_millis(200),
        coalesce_max_delay: Duration::from_secs(10),
        ..fast()
    };
    let h = start(options.clone()).await?;
    let mut node = connect(h.addr, hello("dp-burst", None)).await?;
    let initial = node.next_snapshot().await?;

    let mut last = initial.version;
    let started = tokio::time::Instant::now();
    let mut commits = Vec::with_capacity(50);
    for _ in 0..50 {
        last = write(&h.store).await?;
        commits.push(tokio::time::Instant::now());
    }
    let burst = started.elapsed();
    let pauses = commits.windows(2).filter(|w| w[1] - w[0] >= options.coalesce_delay).count();
    let max_waits = (burst.as_millis() / options.coalesce_max_delay.as_millis()) as usize;
    // The first write goes out at once, the rest of the burst once it is over; then one more per pause and
    // per longest wait.
    let allowed = 2 + pauses + max_waits;
    let mut received = Vec::new();
    loop {
        let snapshot = node.next_snapshot().await?;
        received.push(snapshot.version);
        if snapshot.version == last {
            assert_eq!(snapshot.upstreams.len(), 50);
            break;
        }
        ensure!(snapshot.version < last, "version beyond the last write: {received:?}");
    }
    assert!(received.windows(2).all(|w| w[0] < w[1]), "not increasing: {received:?}");
    eprintln!("50 writes in {burst:?} arrived as {} snapshots: {received:?}", received.len());
    assert!(
        received.len() <= allowed,
        "50 writes in {burst:?} ({pauses} pauses) arrived as {} snapshots: {received:?}",
        received.len()
    );
    assert!(node.next_snapshot_within(QUIET).await?.is_none(), "extra snapshot after the last");
    Ok(())
}

#[tokio::test]
async fn ack_and_nack_are_recorded_and_nacked_version_is_not_resent() -> Result<()> {
    let h = start(fast()).await?;
    let mut node = connect(h.addr, hello("dp-ack", None)).await?;
    let good = node.next_snapshot().await?;
    node.ack(&good).await?;
    let record = record_where(&h.store, "dp-ack", |r| r.last_ack_version == Some(good.version)).await?;
    assert_eq!(record.applied_version, Some(good.version));
    assert_eq!(record.applied_hash.as_deref(), Some(good.hash.as_str()));
    assert_eq!(record.last_error, None);

    write(&h.store).await?;
    let bad = node.next_snapshot().await?;
    node.send(data_plane_message::Message::Nack(Nack {
        version: bad.version,
        hash: bad.hash.clone(),
        error: "upstream up-x: cannot compile".to_owned(),
    }))
    .await?;
    let record = record_where(&h.store, "dp-ack", |r| r.last_nack_version == Some(bad.version)).await?;
    assert_eq!(record.last_error.as_deref(), Some("upstream up-x: cannot compile"));
    // Still runs the good one.
    assert_eq!(record.applied_version, Some(good.version));

    // Heartbeats from the old table do not bring the refused snapshot back.
    for _ in 0..3 {
        node.heartbeat(&good).await?;
        assert!(node.next_snapshot_within(QUIET / 3).await?.is_none(), "NACKed snapshot re-sent");
    }
    let record = record_where(&h.store, "dp-ack", |r| r.last_seen > 0).await?;
    assert_eq!(record.applied_hash.as_deref(), Some(good.hash.as_str()));
    assert_eq!(record.last_error.as_deref(), Some("upstream up-x: cannot compile"), "NACK shown until a newer ACK");

    // A newer change is sent, and accepting it clears the error.
    let fixed_version = write(&h.store).await?;
    let fixed = node.next_snapshot().await?;
    assert_eq!(fixed.version, fixed_version);
    node.ack(&fixed).await?;
    let record = record_where(&h.store, "dp-ack", |r| r.last_ack_version == Some(fixed.version)).await?;
    assert_eq!(record.last_error, None);
    assert_eq!(record.last_nack_version, Some(bad.version));
    assert_eq!(record.applied_version, Some(fixed.version));
    Ok(())
}

#[tokio::test]
async fn nacked_version_is_not_resent_on_reconnect_of_the_same_build() -> Result<()> {
    let h = start(fast()).await?;
    let mut node = connect(h.addr, hello("dp-re", None)).await?;
    let bad = node.next_snapshot().await?;
    node.send(data_plane_message::Message::Nack(Nack {
        version: bad.version,
        hash: bad.hash.clone(),
        error: "no".into(),
    }))
    .await?;
    record_where(&h.store, "dp-re", |r| r.last_nack_version == Some(bad.version)).await?;
    drop(node);
    record_where(&h.store, "dp-re", |r| !r.connected).await?;

    let mut again = connect(h.addr, hello("dp-re", None)).await?;
    assert!(again.next_snapshot_within(QUIET).await?.is_none(), "NACKed snapshot re-sent after reconnect");
    // A different build may accept it: it is sent again.
    let mut upgraded = connect(h.addr, Hello { software_version: "test-2".into(), ..hello("dp-re", None) }).await?;
    assert_eq!(upgraded.next_snapshot().await?.version, bad.version);
    Ok(())
}

#[tokio::test]
async fn disconnect_marks_node_not_connected() -> Result<()> {
    let h = start(fast()).await?;
    let mut node = connect(h.addr, hello("dp-bye", None)).await?;
    node.next_snapshot().await?;
    record_where(&h.store, "dp-bye", |r| r.connected).await?;
    drop(node);
    let record = record_where(&h.store, "dp-bye", |r| !r.connected).await?;
    assert!(record.last_seen >= record.first_seen);
    Ok(())
}

#[tokio::test]
async fn reconnect_replaces_the_previous_stream() -> Result<()> {
    let h = start(fast()).await?;
    let mut first = connect(h.addr, hello("dp-twice", None)).await?;
    first.next_snapshot().await?;
    let mut second = connect(h.addr, hello("dp-twice", None)).await?;
    second.next_snapshot().await?;
    // The older stream is closed with a reason; the node stays connected.
    let ended = within(first.rx.message()).await?;
    assert!(matches!(&ended, Err(status) if status.code() == Code::Aborted), "{ended:?}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    record_where(&h.store, "dp-twice", |r| r.connected).await?;
    Ok(())
}

#[tokio::test]
async fn silent_stream_is_closed_and_old_nodes_are_purged() -> Result<()> {
    let h = start(SyncOptions {
        heartbeat_timeout: Duration::from_millis(300),
        stale_after: Duration::from_millis(400),
        purge_after: Duration::from_millis(800),
        sweep_interval: Duration::from_millis(50),
        ..fast()
    })
    .await?;
    let mut node = connect(h.addr, hello("dp-silent", None)).await?;
    node.next_snapshot().await?;
    // No heartbeats: the server gives up on the stream...
    let ended = within(node.rx.message()).await?;
    assert!(matches!(&ended, Err(status) if status.code() == Code::DeadlineExceeded), "{ended:?}");
    record_where(&h.store, "dp-silent", |r| !r.connected).await?;
    // ...and forgets the node after the purge delay.
    let deadline = tokio::time::Instant::now() + WAIT;
    while h.store.list_data_planes().await?.iter().any(|r| r.node_id == "dp-silent") {
        ensure!(tokio::time::Instant::now() < deadline, "node never purged");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

#[tokio::test]
async fn close_ends_streams_and_refuses_new_ones() -> Result<()> {
    let h = start(fast()).await?;
    let mut node = connect(h.addr, hello("dp-close", None)).await?;
    node.next_snapshot().await?;
    h.service.close();
    let ended = within(node.rx.message()).await?;
    assert!(matches!(&ended, Err(status) if status.code() == Code::Unavailable), "{ended:?}");
    record_where(&h.store, "dp-close", |r| !r.connected).await?;
    let refused = connect(h.addr, hello("dp-late", None)).await.err().context("accepted while closing")?;
    assert!(refused.to_string().contains("Unavailable"), "{refused}");
    Ok(())
}

/// Removes the upstream `write` added last, reverting the configuration to
/// the content (and hash) it had before.
async fn revert(store: &Store) -> Result<u64> {
    let committed = within(store.write("sync test revert", |cfg| {
        cfg.upstreams.pop();
        Ok::<_, Infallible>(())
    }))
    .await??;
    ensure!(committed.changed, "revert committed nothing");
    Ok(committed.version)
}

/// Finding 1 of issue 24: a change, then its revert committed while the node
/// was still applying the change. The revert's content is what the node ran
/// before, but the node ends on the change: it must be sent the revert.
#[tokio::test]
async fn revert_committed_while_the_change_is_unanswered_is_delivered() -> Result<()> {
    let h = start(fast()).await?;
    let mut node = connect(h.addr, hello("dp-revert", None)).await?;
    let before = node.next_snapshot().await?;
    node.ack(&before).await?;
    record_where(&h.store, "dp-revert", |r| r.applied_version == Some(before.version)).await?;

    write(&h.store).await?;
    let change = node.next_snapshot().await?;
    // The node is still compiling the change when the revert commits, and
    // the control plane takes the revert in before the change is answered
    // (as when the node was stopped): it either pushes the revert at once or
    // records that it thinks the node runs it.
    let reverted = revert(&h.store).await?;
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut early = None;
    while early.is_none() && tokio::time::Instant::now() < deadline {
        early = node.next_snapshot_within(Duration::from_millis(50)).await?;
        let record = h.store.list_data_planes().await?.into_iter().find(|r| r.node_id == "dp-revert");
        if record.is_some_and(|r| r.applied_version == Some(reverted)) {
            break;
        }
    }
    node.ack(&change).await?;
    let head = match early {
        Some(early) => early,
        None => node.next_snapshot().await?,
    };
    assert_eq!(head.version, reverted, "the node must end on the head, not on the reverted change");
    assert_eq!(head.hash, before.hash, "the revert restores the earlier content");
    node.ack(&head).await?;
    let record = record_where(&h.store, "dp-revert", |r| r.applied_version == Some(reverted)).await?;
    assert_eq!(record.applied_hash.as_deref(), Some(before.hash.as_str()));
    assert!(node.next_snapshot_within(QUIET).await?.is_none(), "nothing more to send");
    Ok(())
}

/// A snapshot lost on the way (no answer) is sent again after the ACK timeout.
#[tokio::test]
async fn unanswered_push_is_sent_again() -> Result<()> {
    let h = start(SyncOptions { ack_timeout: Duration::from_millis(300), ..fast() }).await?;
    let mut node = connect(h.addr, hello("dp-lost", None)).await?;
    let lost = node.next_snapshot().await?;
    let again = node.next_snapshot().await?;
    assert_eq!((again.version, &again.hash), (lost.version, &lost.hash));
    node.ack(&again).await?;
    record_where(&h.store, "dp-lost", |r| r.applied_version == Some(lost.version)).await?;
    assert!(node.next_snapshot_within(QUIET).await?.is_none(), "an answered push was sent again");
    Ok(())
}

/// Finding 2's second half: a node that refused the newest snapshot gets the
/// newest one it has not refused, and so does the same build restarted
/// without its table, instead of staying not ready.
#[tokio::test]
async fn node_that_refused_the_head_gets_the_newest_it_can_take() -> Result<()> {
    let h = start(fast()).await?;
    let good_version = write(&h.store).await?;
    let mut node = connect(h.addr, hello("dp-skew", None)).await?;
    let good = node.next_snapshot().await?;
    assert_eq!(good.version, good_version);
    node.ack(&good).await?;
    record_where(&h.store, "dp-skew", |r| r.applied_version == Some(good_version)).await?;
    drop(node);
    record_where(&h.store, "dp-skew", |r| !r.connected).await?;

    // Two writes while the node is away: it comes back to the second only.
    let middle = write(&h.store).await?;
    let bad_version = write(&h.store).await?;
    let mut node = connect(h.addr, hello("dp-skew", Some(&good))).await?;
    let bad = node.next_snapshot().await?;
    assert_eq!(bad.version, bad_version);
    node.send(data_plane_message::Message::Nack(Nack {
        version: bad.version,
        hash: bad.hash.clone(),
        error: "built without support for this".into(),
    }))
    .await?;
    let fallback = node.next_snapshot().await?;
    assert_eq!(fallback.version, middle, "the newest version the node has not refused");
    node.ack(&fallback).await?;
    record_where(&h.store, "dp-skew", |r| r.applied_version == Some(middle)).await?;
    drop(node);
    record_where(&h.store, "dp-skew", |r| !r.connected).await?;

    // Restarted without a cache, the same build asks again and gets it again.
    let mut restarted = connect(h.addr, hello("dp-skew", None)).await?;
    let first = restarted.next_snapshot().await?;
    assert_eq!(first.version, middle, "a restarted node of the same build gets what it can take");
    restarted.ack(&first).await?;
    assert!(restarted.next_snapshot_within(QUIET).await?.is_none(), "the refused head was sent again");

    // Reverting the refused change gives the content the node runs a newer
    // number: nothing to send, the node runs the head, its NACK is history.
    let reverted = revert(&h.store).await?;
    let record = record_where(&h.store, "dp-skew", |r| r.applied_version == Some(reverted)).await?;
    assert_eq!(record.last_error, None);
    assert!(restarted.next_snapshot_within(QUIET).await?.is_none(), "the content the node runs was sent");
    Ok(())
}
