//! Per-API traffic counters for the heartbeat's summary (`sync::report`),
//! recorded beside the request metrics at the end of each request. The
//! Prometheus handles cannot be read back, so these are a few atomics of
//! our own: one add into a latency bucket per request (their sum is the
//! request count) and one more for a 5xx. The heartbeat takes and resets
//! them, so they never hold more than one interval.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::StatusCode;
use sluice_proto::telemetry::{LATENCY_BUCKETS, latency_bucket};

#[derive(Debug, Default)]
pub struct TrafficCounters {
    latency: [AtomicU64; LATENCY_BUCKETS],
    errors: AtomicU64,
}

/// What [`TrafficCounters::take`] returns: the counts since the previous take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrafficCounts {
    pub requests: u64,
    pub errors: u64,
    pub latency: [u64; LATENCY_BUCKETS],
}

impl TrafficCounters {
    pub fn record(&self, status: StatusCode, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.latency[latency_bucket(micros)].fetch_add(1, Ordering::Relaxed);
        if status.is_server_error() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counts since the previous take, reset to zero; `None` when there
    /// were no requests. Each counter is swapped on its own: a request that
    /// ends during the take may have its error counted in this interval and
    /// its latency in the next, which a summary can afford.
    pub fn take(&self) -> Option<TrafficCounts> {
        let latency: [u64; LATENCY_BUCKETS] = std::array::from_fn(|i| self.latency[i].swap(0, Ordering::Relaxed));
        let errors = self.errors.swap(0, Ordering::Relaxed);
        let requests = latency.iter().sum();
        (requests > 0 || errors > 0).then_some(TrafficCounts { requests, errors, latency })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_returns_the_interval_and_resets() {
        let counters = TrafficCounters::default();
        assert_eq!(counters.take(), None);
        counters.record(StatusCode::OK, Duration::from_micros(500));
        counters.record(StatusCode::BAD_GATEWAY, Duration::from_millis(30));
        counters.record(StatusCode::NOT_FOUND, Duration::from_secs(60));
        let counts = counters.take().expect("counts");
        assert_eq!((counts.requests, counts.errors), (3, 1));
        assert_eq!((counts.latency[0], counts.latency[5], counts.latency[LATENCY_BUCKETS - 1]), (1, 1, 1));
        assert_eq!(counters.take(), None);
    }
}
