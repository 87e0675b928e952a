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
use std::time::{Duration, Instant};

use crate::clock::{ms_at, now_ms};

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
        ActiveRequest(Some(self.clone()))
    }

    /// The end time first: a watcher that sees no request in flight must
    /// also see when the last one ended.
    fn end(&self, ended_ms: u64) {
        self.last_ended_ms.store(ended_ms, Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::Release);
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

/// A request in flight on its connection, until [`ActiveRequest::ended_at`]
/// or its drop.
#[derive(Debug)]
pub struct ActiveRequest(Option<Arc<ConnectionActivity>>);

impl ActiveRequest {
    /// Ends the request at `at`, a clock reading its caller took anyway
    /// (one read fewer per request than the drop's).
    pub fn ended_at(&mut self, at: Instant) {
        if let Some(activity) = self.0.take() {
            activity.end(ms_at(at));
        }
    }
}

impl Drop for ActiveRequest {
    fn drop(&mut self) {
        if let Some(activity) = self.0.take() {
            activity.end(now_ms());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_ended_at_a_time_counts_out_once_with_that_time() {
        let activity = ConnectionActivity::new();
        let (mut first, second) = (activity.begin(), activity.begin());
        assert_eq!(activity.in_flight(), 2);
        let ended = Instant::now();
        first.ended_at(ended);
        assert_eq!(activity.in_flight(), 1);
        assert_eq!(activity.last_ended_ms.load(Ordering::Relaxed), ms_at(ended));
        drop(first);
        assert_eq!(activity.in_flight(), 1, "ended once, not again when dropped");
        drop(second);
        assert_eq!(activity.in_flight(), 0);
        assert!(activity.last_ended_ms.load(Ordering::Relaxed) >= ms_at(ended));
    }
}
