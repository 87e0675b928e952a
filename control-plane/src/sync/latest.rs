//! Between the store and the sessions: turns the store's "version N was
//! committed" signal into the snapshot itself, fetched and encoded once per
//! change and shared by every connected data plane, instead of one database
//! read and one encoding per node.

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use sluice_proto::v1;
use tokio::sync::watch;

use crate::store::Store;

/// The newest snapshot loaded so far; `None` until the first load succeeds.
pub type Latest = Option<Arc<Encoded>>;

/// Field number of `snapshot` in `ControlPlaneMessage` (sluice.proto).
const SNAPSHOT_FIELD: u32 = 1;

/// A snapshot ready to go out: what a session decides by (version, hash)
/// and the whole gRPC message, encoded once. Every stream sends the same
/// bytes, so a push to a thousand nodes holds one copy of the snapshot
/// however slowly each node reads.
#[derive(Debug)]
pub struct Encoded {
    pub version: u64,
    pub hash: String,
    /// A gRPC length-prefixed message (uncompressed) holding a
    /// `ControlPlaneMessage` with the snapshot.
    pub frame: Bytes,
}

impl Encoded {
    pub fn new(snapshot: &v1::Snapshot) -> Self {
        // The oneof's one field, written straight from the snapshot: a
        // `ControlPlaneMessage` built around it would need a copy.
        let message_len = prost::encoding::message::encoded_len(SNAPSHOT_FIELD, snapshot);
        let mut frame = BytesMut::with_capacity(5 + message_len);
        frame.put_u8(0); // not compressed
        frame.put_u32(u32::try_from(message_len).unwrap_or(u32::MAX));
        prost::encoding::message::encode(SNAPSHOT_FIELD, snapshot, &mut frame);
        Self { version: snapshot.version, hash: snapshot.hash.clone(), frame: frame.freeze() }
    }
}

/// How a burst of commits is folded into one push.
#[derive(Debug, Clone, Copy)]
pub struct Coalesce {
    /// A commit this long after the last push goes out at once; within a
    /// burst, push once no commit came for this long.
    pub quiet: Duration,
    /// Push at the latest this long after the first commit of a burst.
    pub max_wait: Duration,
}

/// Upper bound of the retry delay while the store cannot be read.
const MAX_RETRY: Duration = Duration::from_secs(5);

/// Starts the fan-out task. It ends when `shutdown`'s sender is dropped, when
/// every receiver is gone, or when the store closes its version channel.
pub fn spawn(store: Store, coalesce: Coalesce, shutdown: watch::Receiver<()>) -> watch::Receiver<Latest> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(run(store, coalesce, tx, shutdown));
    rx
}

async fn run(store: Store, coalesce: Coalesce, tx: watch::Sender<Latest>, mut shutdown: watch::Receiver<()>) {
    let mut versions = store.subscribe();
    // Load once at start so the first change is not needed to fill the cache.
    versions.mark_changed();
    let mut retry = Duration::from_millis(100);
    let mut last_push: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            changed = versions.changed() => if changed.is_err() { return },
            // Never sent on: resolves (with an error) only when the service is dropped.
            _ = shutdown.changed() => return,
            () = tx.closed() => return,
        }
        // A commit after a quiet spell (an operator's single write, the usual
        // case) is pushed at once. Within a burst, let the rest commit: wait
        // for `coalesce.quiet` without a commit, but no longer than
        // `coalesce.max_wait`, so a steady stream of writes still reaches the
        // data planes. The watch keeps only the newest version, so everything
        // committed meanwhile is one push.
        let in_burst = last_push.is_some_and(|at| at.elapsed() < coalesce.quiet);
        let burst_started = tokio::time::Instant::now();
        if in_burst {
            loop {
                tokio::select! {
                    changed = versions.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        if burst_started.elapsed() >= coalesce.max_wait {
                            break;
                        }
                    }
                    () = tokio::time::sleep(coalesce.quiet) => break,
                }
            }
        }
        let wanted = *versions.borrow_and_update();
        if tx.borrow().as_ref().is_some_and(|current| current.version >= wanted) {
            continue;
        }
        match store.latest_snapshot().await {
            Ok(snapshot) => {
                let snapshot = Arc::new(Encoded::new(&snapshot));
                retry = Duration::from_millis(100);
                last_push = Some(tokio::time::Instant::now());
                tx.send_if_modified(|current| {
                    let newer = current.as_ref().is_none_or(|c| snapshot.version > c.version);
                    if newer {
                        *current = Some(snapshot);
                    }
                    newer
                });
            }
            Err(error) => {
                tracing::error!(%error, version = wanted, "cannot load the latest snapshot; retrying in {retry:?}");
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(MAX_RETRY);
                versions.mark_changed();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use sluice_proto::v1::{ControlPlaneMessage, control_plane_message};

    use super::*;

    #[test]
    fn the_frame_is_the_control_plane_message_the_generated_code_would_send() {
        let snapshot = v1::Snapshot {
            version: 7,
            hash: "abc".into(),
            apis: vec![v1::Api { name: "a".into(), path_prefix: "/a".into(), ..Default::default() }],
            ..Default::default()
        };
        let encoded = Encoded::new(&snapshot);
        let message = ControlPlaneMessage { message: Some(control_plane_message::Message::Snapshot(snapshot.clone())) };
        let body = message.encode_to_vec();
        assert_eq!(encoded.frame[0], 0);
        assert_eq!(encoded.frame[1..5], u32::try_from(body.len()).unwrap().to_be_bytes());
        assert_eq!(encoded.frame[5..], body[..]);
        assert_eq!((encoded.version, encoded.hash.as_str()), (7, "abc"));
    }
}
