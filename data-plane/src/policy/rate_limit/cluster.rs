//! Cluster-wide buckets: the same GCRA as governor runs atomically inside
//! Redis (one Lua script per request), so every data plane spends from one
//! shared bucket per key. Redis's own clock is used, so the nodes' clocks
//! need not agree.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tracing::{info, warn};

use super::{Limit, Outcome, RateLimitError};

/// Per-request budget for Redis. A rate limit must not add more latency than
/// it saves; past this the policy's `fail_open` decides.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

/// Per connection attempt; reconnects happen off the request path.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long the start-up probe waits before reporting Redis unreachable.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// GCRA, step for step as governor's `test_and_update`: `tat` is the
/// theoretical arrival time of the next request; a request conforms unless it
/// comes more than `tau` (the burst tolerance) before it. Times are Redis
/// `TIME` in microseconds (exact in a Lua double until the year 2255), `t` is
/// fractional so per-second limits above 1e6 stay exact enough. The key
/// expires when the bucket would be full again, so idle keys cost nothing.
///
/// KEYS[1] bucket; ARGV[1] emission interval in µs; ARGV[2] capacity.
/// Returns {allowed, remaining, retry_after_ms, reset_ms}.
const GCRA_LUA: &str = r"
local t = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local tau = t * (capacity - 1)
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local earliest = tat - tau
if now < earliest then
  return {0, 0, math.ceil((earliest - now) / 1000), math.ceil((tat - now) / 1000)}
end
local new_tat = tat + t
local ttl = math.ceil((new_tat - now) / 1000) + 1
redis.call('SET', KEYS[1], string.format('%.17g', new_tat), 'PX', ttl)
local remaining = math.floor((now + tau + t - new_tat) / t + 1e-9)
if remaining < 0 then remaining = 0 end
return {1, remaining, 0, math.ceil((new_tat - now) / 1000)}
";

static GCRA: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(GCRA_LUA));

#[derive(Debug, thiserror::Error)]
pub(crate) enum RedisFailure {
    #[error("Redis did not answer within {0:?}")]
    Timeout(Duration),
    #[error("Redis failed: {0}")]
    Redis(#[from] redis::RedisError),
}

/// A shared, self-reconnecting connection to Redis plus the key prefix.
#[derive(Clone)]
pub(crate) struct RedisHandle {
    manager: ConnectionManager,
    pub(crate) prefix: Arc<str>,
    pub(crate) timeout: Duration,
}

impl RedisHandle {
    /// Connects lazily: a Redis that is down at start-up must not keep the
    /// data plane from serving, so this only checks the URL, and a background
    /// probe logs whether Redis answers. The connection manager reconnects
    /// by itself (with backoff) whenever a command meets a broken connection.
    pub(crate) fn connect(redis_url: &str) -> Result<Self, RateLimitError> {
        // The URL may carry a password: errors describe, never echo it.
        let client = redis::Client::open(redis_url).map_err(|e| RateLimitError::RedisUrl(e.to_string()))?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| RateLimitError::NoRuntime)?;
        let address = client.get_connection_info().addr().to_string();
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(DEFAULT_TIMEOUT))
            .set_number_of_retries(3)
            .set_min_delay(Duration::from_millis(100))
            .set_max_delay(Duration::from_secs(2));
        let manager = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|e| RateLimitError::RedisUrl(e.to_string()))?;
        runtime.spawn(probe(manager.clone(), address));
        Ok(RedisHandle { manager, prefix: Arc::from("sluice:rl"), timeout: DEFAULT_TIMEOUT })
    }

    /// Spends one request from `bucket` in Redis.
    pub(crate) async fn check(&self, bucket: &str, limit: &Limit) -> Result<Outcome, RedisFailure> {
        let mut connection = self.manager.clone();
        let mut invocation = GCRA.key(bucket);
        invocation.arg(limit.emission_micros()).arg(limit.capacity.get());
        let reply: (i64, i64, i64, i64) = tokio::time::timeout(self.timeout, invocation.invoke_async(&mut connection))
            .await
            .map_err(|_| RedisFailure::Timeout(self.timeout))??;
        let millis = |ms: i64| Duration::from_millis(u64::try_from(ms).unwrap_or(0));
        Ok(match reply {
            (1, remaining, _, reset_ms) => Outcome::Allowed {
                remaining: u32::try_from(remaining).unwrap_or(0).min(limit.capacity.get()),
                reset: millis(reset_ms),
            },
            (_, _, retry_ms, reset_ms) => Outcome::Limited { retry_after: millis(retry_ms), reset: millis(reset_ms) },
        })
    }
}

/// Start-up report only; the manager does the reconnecting.
async fn probe(mut manager: ConnectionManager, address: String) {
    let ping = redis::cmd("PING");
    let ping = ping.query_async::<String>(&mut manager);
    match tokio::time::timeout(PROBE_TIMEOUT, ping).await {
        Ok(Ok(_)) => info!(redis = %address, "connected to Redis for cluster-wide rate limits"),
        Ok(Err(e)) => warn!(
            redis = %address, error = %e,
            "Redis is unreachable; cluster-wide rate limits follow their fail_open setting until it answers"
        ),
        Err(_) => warn!(
            redis = %address,
            "Redis did not answer in time; cluster-wide rate limits follow their fail_open setting until it answers"
        ),
    }
}
