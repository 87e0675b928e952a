//! Closing client connections that sit idle: no request in flight for the
//! listener's idle timeout. This covers a kept-alive connection nobody uses
//! and a client that sends its request head too slowly (slowloris).
//!
//! hyper's own `header_read_timeout` does the same with a timer per request
//! (allocated, registered in the timer wheel and removed again each time).
//! Here a connection has one timer, which wakes at most once per timeout
//! period; a request only counts itself in and out.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::now_ms;

/// What one client connection is doing: requests in flight and when the last one ended.
#[derive(Debug)]
pub struct ConnectionActivity {
    in_flight: AtomicU32,
    last_ended_ms: AtomicU64,
}

impl ConnectionActivity {
    pub fn new() -> Arc<Self> {
        Arc::new(ConnectionActivity { in_flight: AtomicU32::new(0), last_ended_ms: AtomicU64::new(now_ms()) })
    }

    /// Counts a request in until the returned guard is dropped (when its
    /// response has been sent, or abandoned).
    pub fn begin(self: &Arc<Self>) -> ActiveRequest {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        ActiveRequest(self.clone())
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Resolves once the connection has had no request in flight for `timeout`.
    pub async fn idle_for(&self, timeout: Duration) {
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        loop {
            // In-flight first: seeing none also shows when the last one ended.
            let busy = self.in_flight() > 0;
            let elapsed = now_ms().saturating_sub(self.last_ended_ms.load(Ordering::Relaxed));
            if !busy && elapsed >= timeout_ms {
                return;
            }
            // Busy, or idle for less than the timeout: look again when the
            // timeout would run out if nothing happened meanwhile.
            let wait = if elapsed >= timeout_ms { timeout_ms } else { timeout_ms - elapsed };
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
    }
}

/// A request in flight on its connection.
#[derive(Debug)]
pub struct ActiveRequest(Arc<ConnectionActivity>);

impl Drop for ActiveRequest {
    fn drop(&mut self) {
        // The end time first: a watcher that sees no request in flight must
        // also see when the last one ended.
        self.0.last_ended_ms.store(now_ms(), Ordering::Relaxed);
        self.0.in_flight.fetch_sub(1, Ordering::Release);
    }
}
