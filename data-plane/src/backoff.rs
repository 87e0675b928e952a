//! Reconnect pacing for the sync client: jittered exponential backoff, so that
//! a control plane coming back after an outage is not hit by every data plane
//! in the same instant.

use std::time::Duration;

use rand::Rng;

#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    attempt: u32,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        let min = min.max(Duration::from_millis(1));
        Self { min, max: max.max(min), attempt: 0 }
    }

    /// The delay before the next attempt: "equal jitter", i.e. half of the
    /// exponential ceiling plus a random share of the other half. Never zero
    /// (a refusing control plane must not be hammered) and never above `max`.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling();
        self.attempt = self.attempt.saturating_add(1);
        let half = ceiling / 2;
        let jitter = rand::rng().random_range(0..=half.as_millis().max(1) as u64);
        (half + Duration::from_millis(jitter)).min(self.max).max(self.min / 2)
    }

    /// Called once a connection proved healthy, so the next outage starts fast again.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    fn ceiling(&self) -> Duration {
        // 2^20 * min is far above any sensible max; capping the shift avoids overflow.
        let factor = 1u32 << self.attempt.min(20);
        self.min.saturating_mul(factor).min(self.max)
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_millis(100), Duration::from_secs(10))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_within_bounds_and_resets() {
        let mut b = Backoff::default();
        let delays: Vec<_> = (0..30).map(|_| b.next_delay()).collect();
        for (i, d) in delays.iter().enumerate() {
            let ceiling = Duration::from_millis(100).saturating_mul(1 << i.min(20)).min(Duration::from_secs(10));
            assert!(*d >= Duration::from_millis(50), "attempt {i}: {d:?} too short");
            assert!(*d <= ceiling, "attempt {i}: {d:?} above {ceiling:?}");
        }
        // Late attempts sit in the upper half of the cap.
        assert!(delays[29] >= Duration::from_secs(5));
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }

    #[test]
    fn jitter_spreads_delays() {
        let delays: std::collections::HashSet<_> = (0..20)
            .map(|_| {
                let mut b = Backoff::default();
                (0..6).map(|_| b.next_delay()).last()
            })
            .collect();
        assert!(delays.len() > 1, "twenty nodes would reconnect in lockstep");
    }

    #[test]
    fn degenerate_bounds_do_not_panic() {
        let mut b = Backoff::new(Duration::ZERO, Duration::ZERO);
        for _ in 0..100 {
            assert!(b.next_delay() <= Duration::from_millis(1));
        }
    }
}
