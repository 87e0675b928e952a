//! What a data plane reports about its traffic and its upstream targets in
//! each heartbeat, as both planes must read it: the latency buckets' bounds
//! (the data plane counts into them, the control plane adds nodes' counts
//! bucket by bucket and takes percentiles of the sum), the caps that keep a
//! heartbeat small whatever the configuration, and the percentile itself.

/// Upper bounds of the latency buckets, in microseconds; a request slower
/// than the last bound counts in one more bucket. Fixed in the contract:
/// histograms of different nodes (and builds) add only if their buckets agree.
pub const LATENCY_BOUNDS_US: [u64; 13] = [
    1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// Buckets per histogram: one per bound, one for slower requests.
pub const LATENCY_BUCKETS: usize = LATENCY_BOUNDS_US.len() + 1;

/// APIs per heartbeat: the busiest in the interval. A node serving more APIs
/// reports how many it left out; a quiet API is not sent at all.
pub const MAX_HEARTBEAT_APIS: usize = 100;

/// Targets per heartbeat, the unhealthy first, so a down target is never
/// the one left out while healthy ones fill the cap.
pub const MAX_HEARTBEAT_TARGETS: usize = 500;

/// The bucket a request of `elapsed_us` microseconds counts in.
pub fn latency_bucket(elapsed_us: u64) -> usize {
    LATENCY_BOUNDS_US.partition_point(|bound| *bound < elapsed_us)
}

/// The `q` quantile (0 < q <= 1) of a histogram, in milliseconds, linear
/// within its bucket; `None` without requests. A quantile that falls in the
/// last bucket is reported as the last bound: the histogram only knows it is
/// slower than that.
pub fn latency_quantile_ms(buckets: &[u64], q: f64) -> Option<f64> {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = (q.clamp(0.0, 1.0) * total as f64).ceil().max(1.0);
    let mut below = 0u64;
    for (i, count) in buckets.iter().enumerate() {
        let seen = below + count;
        if *count > 0 && seen as f64 >= rank {
            let Some(upper) = LATENCY_BOUNDS_US.get(i) else { break };
            let lower = if i == 0 { 0 } else { LATENCY_BOUNDS_US[i - 1] };
            let within = (rank - below as f64) / *count as f64;
            return Some((lower as f64 + (upper - lower) as f64 * within) / 1_000.0);
        }
        below = seen;
    }
    LATENCY_BOUNDS_US.last().map(|last| *last as f64 / 1_000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_by_upper_bound() {
        let cases = [(0, 0), (1_000, 0), (1_001, 1), (2_500, 1), (60_000, 6), (10_000_000, 12), (10_000_001, 13)];
        for (elapsed_us, bucket) in cases {
            assert_eq!(latency_bucket(elapsed_us), bucket, "{elapsed_us} µs");
        }
        assert_eq!(latency_bucket(u64::MAX), LATENCY_BUCKETS - 1);
    }

    #[test]
    fn quantiles_interpolate_within_the_bucket() {
        let mut buckets = [0u64; LATENCY_BUCKETS];
        assert_eq!(latency_quantile_ms(&buckets, 0.99), None);
        // 99 fast requests (<= 1 ms) and one between 100 and 250 ms.
        buckets[0] = 99;
        buckets[7] = 1;
        assert_eq!(latency_quantile_ms(&buckets, 0.99), Some(1.0));
        assert_eq!(latency_quantile_ms(&buckets, 1.0), Some(250.0));
        let median = latency_quantile_ms(&buckets, 0.5).unwrap_or_default();
        assert!((median - 50.0 / 99.0).abs() < 1e-9, "{median}");
        // Slower than the last bound: reported as the last bound.
        let mut slow = [0u64; LATENCY_BUCKETS];
        slow[LATENCY_BUCKETS - 1] = 3;
        assert_eq!(latency_quantile_ms(&slow, 0.99), Some(10_000.0));
        // A short histogram (another build's) is read as far as it goes.
        assert_eq!(latency_quantile_ms(&[0, 4], 0.5), Some(1.75));
    }
}
