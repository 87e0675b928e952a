//! Node-local buckets: governor's keyed GCRA limiter holding one bucket per
//! key in memory, swept periodically so idle keys do not pile up.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use governor::DefaultKeyedRateLimiter;
use governor::clock::Clock;
use governor::middleware::StateInformationMiddleware;
use tokio::task::AbortHandle;

use super::key::BucketKey;
use super::{Limit, Outcome};

type Keyed = DefaultKeyedRateLimiter<BucketKey, StateInformationMiddleware>;

/// How often buckets that are full again (indistinguishable from new ones)
/// are dropped. Memory is then bounded by the keys seen within about one
/// refill period plus this interval.
const SWEEP_INTERVAL: Duration = Duration::from_secs(30);

/// Without a Tokio runtime at compile time (unit tests, embedding) the
/// sweep runs inline on every this-many checks instead.
const SWEEP_EVERY_CHECKS: u64 = 16_384;

pub(crate) struct LocalBuckets {
    limiter: Arc<Keyed>,
    sweeper: Option<AbortHandle>,
    checks: AtomicU64,
}

impl LocalBuckets {
    pub(crate) fn new(limit: &Limit) -> Self {
        let limiter: Keyed = governor::RateLimiter::keyed(limit.quota).with_middleware();
        let limiter = Arc::new(limiter);
        let sweeper = tokio::runtime::Handle::try_current()
            .ok()
            .map(|runtime| runtime.spawn(sweep(Arc::downgrade(&limiter))).abort_handle());
        LocalBuckets { limiter, sweeper, checks: AtomicU64::new(0) }
    }

    pub(crate) fn check(&self, key: &BucketKey, limit: &Limit) -> Outcome {
        if self.sweeper.is_none() && self.checks.fetch_add(1, Ordering::Relaxed).is_multiple_of(SWEEP_EVERY_CHECKS) {
            self.limiter.retain_recent();
        }
        match self.limiter.check_key(key) {
            // governor does not expose the bucket's theoretical arrival time
            // on success, only the whole cells left; the bucket is full again
            // at most one emission interval per missing cell from now, so
            // Reset is that upper bound (exact when the bucket started full,
            // at most one interval high otherwise).
            Ok(state) => {
                let remaining = state.remaining_burst_capacity().min(limit.capacity.get());
                let missing = limit.capacity.get() - remaining;
                Outcome::Allowed { remaining, reset: limit.emission.saturating_mul(missing) }
            }
            Err(not_until) => {
                let retry_after = not_until.wait_time_from(self.limiter.clock().now());
                // The next cell conforms at `retry_after`; the bucket is full
                // `capacity - 1` intervals later.
                let reset = retry_after + limit.emission.saturating_mul(limit.capacity.get() - 1);
                Outcome::Limited { retry_after, reset }
            }
        }
    }

    /// Keys currently held (approximate under concurrency).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.limiter.len()
    }

    #[cfg(test)]
    pub(crate) fn sweep_now(&self) {
        self.limiter.retain_recent();
    }
}

impl Drop for LocalBuckets {
    fn drop(&mut self) {
        if let Some(sweeper) = &self.sweeper {
            sweeper.abort();
        }
    }
}

/// Holds only a weak reference, so a limiter dropped with its routing table
/// is freed even if the abort races with a tick.
async fn sweep(limiter: Weak<Keyed>) {
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(limiter) = limiter.upgrade() else { return };
        limiter.retain_recent();
        limiter.shrink_to_fit();
    }
}
