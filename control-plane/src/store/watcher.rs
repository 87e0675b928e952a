//! Keeps a store's published version (what `subscribe` hands the sync server)
//! current when a process other than this one commits: LISTEN (PostgreSQL)
//! for other control planes' commits, plus a poll for notifications lost
//! while that connection was down, for SQLite files shared between processes,
//! and for a commit whose writer was cancelled before it published.
//!
//! The LISTEN connection is kept up for good: after any loss (the server
//! restarted, the backend was terminated, the network dropped) it is opened
//! again with jittered exponential backoff, and until then the poll carries
//! on alone. Which of the two modes the watcher is in is logged when it
//! changes and shown by [`WatchState`] (the control plane's `/metrics`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::{Notify, watch};

use super::{Inner, NOTIFY_CHANNEL, POLL_INTERVAL, Store};

/// First wait before opening LISTEN again; doubled per failure up to the maximum.
const LISTEN_RETRY_INITIAL: Duration = Duration::from_millis(250);
const LISTEN_RETRY_MAX: Duration = Duration::from_secs(30);

/// How the watcher learns of other processes' commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchMode {
    /// Notified on commit (and polling besides, for what a notification misses).
    Listen,
    /// Polling only: SQLite, or PostgreSQL while the LISTEN connection is down.
    Poll,
}

impl WatchMode {
    pub fn as_str(self) -> &'static str {
        match self {
            WatchMode::Listen => "listen",
            WatchMode::Poll => "poll",
        }
    }
}

/// The watcher's state, shared with whoever reports it.
#[derive(Debug, Default)]
pub struct WatchState {
    listening: AtomicBool,
    /// LISTEN connections opened, the first included.
    listens: AtomicU64,
}

impl WatchState {
    pub fn mode(&self) -> WatchMode {
        if self.listening.load(Ordering::Relaxed) { WatchMode::Listen } else { WatchMode::Poll }
    }

    /// How many times a LISTEN connection was opened; above 1 after a reconnect.
    pub fn listens(&self) -> u64 {
        self.listens.load(Ordering::Relaxed)
    }
}

/// Starts the watcher; it ends when the store is dropped.
pub(super) fn spawn_version_watcher(inner: &Arc<Inner>, listen_url: Option<String>, shutdown: watch::Receiver<()>) {
    let notified = Arc::new(Notify::new());
    if let Some(url) = listen_url {
        tokio::spawn(keep_listening(url, inner.watch.clone(), notified.clone(), shutdown.clone()));
    }
    tokio::spawn(refresh_on_events(Arc::downgrade(inner), notified, shutdown));
}

/// Refreshes the published version on every notification and poll tick.
async fn refresh_on_events(weak: Weak<Inner>, notified: Arc<Notify>, mut shutdown: watch::Receiver<()>) {
    let mut poll = tokio::time::interval(POLL_INTERVAL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            // Err: the sender went with the store.
            _ = shutdown.changed() => break,
            _ = poll.tick() => {}
            () = notified.notified() => {}
        }
        let Some(inner) = weak.upgrade() else { break };
        if let Err(e) = (Store { inner }).refresh_latest().await {
            tracing::debug!(error = %e, "refreshing the latest snapshot version failed");
        }
    }
}

/// Holds a LISTEN connection open, opening it again after any loss.
async fn keep_listening(url: String, state: Arc<WatchState>, notified: Arc<Notify>, mut shutdown: watch::Receiver<()>) {
    let mut retry = LISTEN_RETRY_INITIAL;
    loop {
        let opened = tokio::select! {
            _ = shutdown.changed() => return,
            opened = listen(&url) => opened,
        };
        match opened {
            Ok(mut listener) => {
                state.listening.store(true, Ordering::Relaxed);
                let listens = state.listens.fetch_add(1, Ordering::Relaxed) + 1;
                tracing::info!(listens, "config watch mode: listen (notified of other control planes' commits)");
                retry = LISTEN_RETRY_INITIAL;
                // Commits made while nothing listened were only polled for.
                notified.notify_one();
                let lost = loop {
                    tokio::select! {
                        _ = shutdown.changed() => return,
                        received = listener.try_recv() => match received {
                            Ok(Some(_)) => notified.notify_one(),
                            Ok(None) => break "the connection was closed".to_owned(),
                            Err(e) => break e.to_string(),
                        },
                    }
                };
                state.listening.store(false, Ordering::Relaxed);
                tracing::warn!(
                    reason = %lost,
                    "config watch mode: poll (LISTEN connection lost; polling every {POLL_INTERVAL:?} until it is back)"
                );
            }
            Err(e) => tracing::warn!(
                error = %e,
                "config watch mode: poll (cannot LISTEN; polling every {POLL_INTERVAL:?}, trying again in {retry:?})"
            ),
        }
        let wait = jittered(retry);
        tokio::select! {
            _ = shutdown.changed() => return,
            () = tokio::time::sleep(wait) => {}
        }
        retry = (retry * 2).min(LISTEN_RETRY_MAX);
    }
}

/// Between half and all of `wait`, so control planes that lost the database
/// together do not all come back at the same instant.
fn jittered(wait: Duration) -> Duration {
    wait.mul_f64(rand::random_range(0.5..=1.0))
}

async fn listen(url: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect(url).await?;
    // A loss is reported (`Ok(None)`) and the connection opened here again, with backoff.
    listener.eager_reconnect(false);
    listener.listen(NOTIFY_CHANNEL).await?;
    Ok(listener)
}
