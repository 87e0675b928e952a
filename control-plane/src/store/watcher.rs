//! Keeps a store's published version (what `subscribe` hands the sync server)
//! current when a process other than this one commits.

use std::sync::{Arc, Weak};

use sqlx::postgres::PgListener;
use tokio::sync::watch;

use super::{Inner, NOTIFY_CHANNEL, POLL_INTERVAL, Store};

/// Keeps the published version current when another process writes: LISTEN
/// (PostgreSQL) for other control planes' commits, plus a poll for notifications
/// lost while that connection was down, for SQLite files shared between
/// processes, and for a commit whose writer was cancelled before it published.
/// Ends when the store is dropped.
pub(super) fn spawn_version_watcher(inner: &Arc<Inner>, listen_url: Option<String>, mut shutdown: watch::Receiver<()>) {
    let weak: Weak<Inner> = Arc::downgrade(inner);
    tokio::spawn(async move {
        let mut listener = match listen_url {
            Some(url) => listen(&url).await,
            None => None,
        };
        let mut poll = tokio::time::interval(POLL_INTERVAL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                // Err: the sender went with the store.
                _ = shutdown.changed() => break,
                _ = poll.tick() => {}
                received = next_notification(&mut listener) => {
                    if let Err(e) = received {
                        // PgListener already retried the connection; keep polling.
                        tracing::warn!(error = %e, "LISTEN connection lost; polling for new snapshot versions");
                        listener = None;
                    }
                }
            }
            let Some(inner) = weak.upgrade() else { break };
            if let Err(e) = (Store { inner }).refresh_latest().await {
                tracing::debug!(error = %e, "refreshing the latest snapshot version failed");
            }
        }
    });
}

async fn listen(url: &str) -> Option<PgListener> {
    let mut listener = match PgListener::connect(url).await {
        Ok(listener) => listener,
        Err(e) => {
            tracing::warn!(error = %e, "no LISTEN connection; polling for new snapshot versions");
            return None;
        }
    };
    match listener.listen(NOTIFY_CHANNEL).await {
        Ok(()) => Some(listener),
        Err(e) => {
            tracing::warn!(error = %e, "LISTEN failed; polling for new snapshot versions");
            None
        }
    }
}

async fn next_notification(listener: &mut Option<PgListener>) -> Result<(), sqlx::Error> {
    match listener {
        Some(listener) => listener.recv().await.map(drop),
        None => std::future::pending().await,
    }
}
