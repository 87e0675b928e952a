//! Beside the sessions: the flusher that writes what the sessions recorded
//! in memory to the database in batches, and the periodic sweep that marks
//! silent nodes disconnected and forgets nodes unseen for longer than the
//! purge delay (and their health and traffic reports once the window of
//! the charts has passed).

use std::time::Duration;

use tokio::sync::watch;

use super::{SyncOptions, now_ms};
use crate::store::Store;
use crate::telemetry::{Telemetry, WINDOW_MS};

/// Starts the sweep and the flusher; they end when `shutdown`'s sender is dropped.
pub fn spawn(store: Store, telemetry: Telemetry, options: SyncOptions, shutdown: watch::Receiver<()>) {
    tokio::spawn(flush(store.clone(), options.flush_interval, shutdown.clone()));
    tokio::spawn(run(store, telemetry, options, shutdown));
}

/// Every `interval`, one transaction with every node record that changed.
async fn flush(store: Store, interval: Duration, mut shutdown: watch::Receiver<()>) {
    let mut tick = tokio::time::interval(interval.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            // Never sent on: resolves only when the service is dropped.
            _ = shutdown.changed() => return,
        }
        match store.flush_data_planes().await {
            Ok(written) => tracing::trace!(written, "data-plane records written"),
            // Kept in memory: the next tick writes them.
            Err(error) => tracing::warn!(%error, "cannot write data-plane records; retrying"),
        }
    }
}

async fn run(store: Store, telemetry: Telemetry, options: SyncOptions, mut shutdown: watch::Receiver<()>) {
    let mut tick = tokio::time::interval(options.sweep_interval.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            // Never sent on: resolves only when the service is dropped.
            _ = shutdown.changed() => return,
        }
        sweep(&store, &options).await;
        // Reports older than the charts' window show nothing any more.
        telemetry.forget_silent_since(now_ms() - WINDOW_MS);
    }
}

/// One pass. "Stale" itself is not stored: it is `last_seen` older than
/// `stale_after`, computed where it is shown. What is stored here is that such
/// a node is no longer connected: a live stream sends heartbeats (and is
/// closed after `heartbeat_timeout` without them), so a record still marked
/// connected this long after its last message belongs to a stream that died
/// with an earlier control-plane process.
pub async fn sweep(store: &Store, options: &SyncOptions) {
    let now = now_ms();
    let stale_before = now.saturating_sub(millis(options.stale_after));
    match store.list_data_planes().await {
        Ok(nodes) => {
            for mut node in nodes.into_iter().filter(|n| n.connected && n.last_seen < stale_before) {
                tracing::warn!(
                    node_id = %node.node_id,
                    version = ?node.applied_version,
                    silent_ms = now - node.last_seen,
                    "data plane stale: marking it disconnected"
                );
                node.connected = false;
                store.record_data_plane(node);
            }
        }
        Err(error) => tracing::warn!(%error, "cannot list data planes for the stale sweep"),
    }
    match store.purge_data_planes(now.saturating_sub(millis(options.purge_after))).await {
        Ok(purged) if purged > 0 => tracing::info!(purged, "forgot data planes unseen for {:?}", options.purge_after),
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "cannot purge data planes"),
    }
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}
