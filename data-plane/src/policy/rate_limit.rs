//! The `rate_limit` policy, after authentication in the pipeline (so the
//! consumer is known and anonymous floods cannot spend a consumer's quota)
//! and before anything reaches the upstream: compiled once per snapshot into
//! a [`RateLimiter`], checked per request into a [`RateDecision`].
//!
//! Algorithm: GCRA (a token bucket without a refill timer), from governor in
//! local mode and from a Lua script in Redis in cluster-wide mode, so both
//! modes admit exactly the same traffic. `requests` per `period_seconds`
//! sets the refill rate (one request every `period / requests`); `burst` is
//! the bucket's capacity, i.e. how many requests may arrive at once (0 means
//! `requests`, so "5 per minute" admits 5 at once, then one every 12 s).
//!
//! Headers (draft-ietf-httpapi-ratelimit-headers, the `RateLimit-Limit` /
//! `-Remaining` / `-Reset` form): Limit is the capacity, Remaining what is
//! left after this request, Reset the seconds until the bucket is full again.
//! A rejection is a 429 problem with `Retry-After`: seconds until the next
//! request will be admitted.
//!
//! Redis failure (cluster-wide mode, Redis unreachable, erroring or slower
//! than the timeout): `fail_open: true` admits the request with only
//! `RateLimit-Limit` (the rest is unknown) and logs at most once per
//! [`WARN_INTERVAL`]; `fail_open: false` answers 503 problem details so an
//! outage of the limiter never silently removes a limit someone relies on.
//!
//! Buckets survive snapshot swaps: [`RateLimiter::compile`] returns the
//! previous limiter itself when the API and spec did not change.

mod client_ip;
mod cluster;
mod key;
mod local;
#[cfg(test)]
mod tests;

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use governor::Quota;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, header};
use sha2::{Digest, Sha256};
use sluice_proto::v1;
use tracing::warn;

pub use client_ip::effective_client_ip;
pub use sluice_proto::{Cidr, CidrError};

use crate::base::problem::Problem;
use crate::base::{ProxyBody, http1_wire};
use cluster::{RedisFailure, RedisHandle};
use key::KeyKind;
use local::LocalBuckets;

/// At most one "Redis unavailable" warning per limiter per interval: during
/// an outage every request fails the same way, and the log must stay usable.
pub const WARN_INTERVAL: Duration = Duration::from_secs(30);

pub const RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
pub const RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
pub const RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// Every field the policy sets on an answer, replacing the target's.
pub static RATELIMIT_FIELDS: [HeaderName; 4] =
    [RATELIMIT_LIMIT, RATELIMIT_REMAINING, RATELIMIT_RESET, RATELIMIT_POLICY];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateLimitError {
    #[error("invalid Redis URL: {0}")]
    RedisUrl(String),
    #[error("connecting to Redis needs a Tokio runtime")]
    NoRuntime,
}

/// What a request offers for keying its bucket.
pub struct RateKeyInput<'a> {
    /// The authenticated consumer, if an auth policy ran before. Shared, so
    /// that keying a bucket by it copies no name.
    pub consumer: Option<&'a Arc<str>>,
    /// The socket peer; resolved through trusted proxies here.
    pub client_ip: IpAddr,
    pub headers: &'a HeaderMap,
}

/// The policy's verdict. `Allowed` carries what the `RateLimit-*` fields of
/// the upstream's answer say about this request; `Limited` is the whole
/// response to send instead.
pub enum RateDecision {
    Allowed { count: RateCount },
    Limited { response: Response<ProxyBody> },
}

/// What an allowed request left of its bucket: the part of its answer's
/// `RateLimit-*` fields that is not the limiter's own (its limit and
/// policy). Kept as numbers, not header values, so that an answer whose
/// head goes out as the target sent it costs no map and no allocation
/// (`RateLimiter::write_fields`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateCount {
    /// Unknown when Redis could not be asked (fail-open): then only the limit and policy are sent.
    remaining_and_reset: Option<(u32, u64)>,
}

/// A number as a header value, formatted on the stack: one allocation, where
/// `HeaderValue::from` takes two (a growing buffer, then its shared form).
fn number_value(n: impl itoa::Integer) -> HeaderValue {
    let mut digits = itoa::Buffer::new();
    match HeaderValue::from_str(digits.format(n)) {
        Ok(value) => value,
        Err(_) => unreachable!("decimal digits are a valid header value"),
    }
}

/// Process-wide inputs of every rate limiter: Redis (if the data plane has
/// `--redis-url`) and the trusted proxies. Cheap to clone.
#[derive(Clone, Default)]
pub struct RateLimitContext {
    redis: Option<RedisHandle>,
    trusted_proxies: Arc<[Cidr]>,
}

impl std::fmt::Debug for RateLimitContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitContext")
            .field("redis", &self.redis.as_ref().map(|r| &r.prefix))
            .field("trusted_proxies", &self.trusted_proxies)
            .finish()
    }
}

impl RateLimitContext {
    /// Node-local limits only; `cluster_wide` policies fall back to local.
    pub fn local() -> Self {
        Self::default()
    }

    /// Cluster-wide limits through Redis. Checks the URL only and returns at
    /// once; the connection is made in the background and re-made after
    /// failures, so a Redis that is down at start-up never stops the node.
    /// Must be called inside a Tokio runtime.
    pub fn connect(redis_url: &str) -> Result<Self, RateLimitError> {
        Ok(RateLimitContext { redis: Some(RedisHandle::connect(redis_url)?), ..Self::default() })
    }

    /// Peers in these ranges are proxies whose `X-Forwarded-For` is believed.
    pub fn with_trusted_proxies(mut self, cidrs: impl Into<Arc<[Cidr]>>) -> Self {
        self.trusted_proxies = cidrs.into();
        self
    }

    /// Redis keys start `<prefix>:<api>:`; `sluice:rl` by default. Separate
    /// clusters sharing one Redis (or parallel tests) set their own.
    pub fn with_key_prefix(mut self, prefix: &str) -> Self {
        if let Some(redis) = &mut self.redis {
            redis.prefix = Arc::from(prefix);
        }
        self
    }

    /// How long a request waits for Redis before `fail_open` decides.
    pub fn with_redis_timeout(mut self, timeout: Duration) -> Self {
        if let Some(redis) = &mut self.redis {
            redis.timeout = timeout;
        }
        self
    }

    pub fn has_redis(&self) -> bool {
        self.redis.is_some()
    }

    pub fn trusted_proxies(&self) -> &[Cidr] {
        &self.trusted_proxies
    }
}

/// A limit's numbers, validated and precomputed at compile time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limit {
    requests: u64,
    period_seconds: u64,
    /// Bucket size: requests admitted at once.
    capacity: NonZeroU32,
    /// One request's worth of time: `period / requests`.
    emission: Duration,
    quota: Quota,
}

impl Limit {
    fn from_spec(spec: &v1::RateLimit) -> Result<Self, String> {
        let sluice_proto::policy::RateQuota { capacity, emission } = sluice_proto::policy::rate_quota(spec)?;
        let quota = Quota::with_period(emission)
            .ok_or_else(|| "rate_limit allows more than one request per nanosecond".to_owned())?;
        Ok(Limit {
            requests: spec.requests,
            period_seconds: spec.period_seconds,
            capacity,
            emission,
            quota: quota.allow_burst(capacity),
        })
    }

    /// The emission interval for the Redis script, exact rather than rounded
    /// to whole nanoseconds like governor's.
    fn emission_micros(&self) -> f64 {
        self.period_seconds as f64 * 1e6 / self.requests as f64
    }
}

/// What a bucket said about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Allowed { remaining: u32, reset: Duration },
    Limited { retry_after: Duration, reset: Duration },
}

enum Backend {
    Local(Arc<LocalBuckets>),
    /// `prefix` is `<ctx prefix>:<api>:<limit digest>:`; the digest makes a
    /// changed limit start from fresh keys instead of inheriting old state.
    Cluster {
        redis: RedisHandle,
        prefix: String,
    },
}

/// One API's compiled rate limit with its buckets.
pub struct RateLimiter {
    api: String,
    spec: v1::RateLimit,
    /// Everything that defines the buckets (not `fail_open`): limiters with
    /// the same identity can share local buckets.
    identity: String,
    limit: Limit,
    key: KeyKind,
    trusted: Arc<[Cidr]>,
    backend: Backend,
    limit_header: HeaderValue,
    policy_header: HeaderValue,
    /// Unix seconds of the last Redis warning, for [`WARN_INTERVAL`].
    last_warning: AtomicU64,
}

impl RateLimiter {
    /// The request field the buckets are keyed by, if any (the client's
    /// address behind trusted proxies comes from `X-Forwarded-For`, which
    /// never stays as the client sent it: see `Authentication::fields_read`).
    pub fn field_read(&self) -> Option<&HeaderName> {
        match &self.key {
            KeyKind::Header(name) => Some(name),
            _ => None,
        }
    }
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("api", &self.api)
            .field("spec", &self.spec)
            .field("cluster", &matches!(self.backend, Backend::Cluster { .. }))
            .finish()
    }
}

impl RateLimiter {
    /// Compiles `spec` for `api`. When `previous` (the same API's limiter in
    /// the table being replaced) has the same API and spec, it is returned
    /// itself, so its buckets and counters carry over the swap; a changed
    /// limit starts with fresh buckets.
    pub fn compile(
        spec: &v1::RateLimit,
        api: &str,
        previous: Option<&Arc<RateLimiter>>,
        ctx: &RateLimitContext,
    ) -> Result<Arc<RateLimiter>, String> {
        if let Some(previous) = previous
            && previous.api == api
            && previous.spec == *spec
        {
            return Ok(previous.clone());
        }
        let limit = Limit::from_spec(spec)?;
        let key = KeyKind::from_spec(spec)?;
        let identity = identity(api, &limit, spec);
        let backend = match (&ctx.redis, spec.cluster_wide) {
            (Some(redis), true) => {
                let digest = hex::encode(&Sha256::digest(identity.as_bytes())[..8]);
                Backend::Cluster { redis: redis.clone(), prefix: format!("{}:{api}:{digest}:", redis.prefix) }
            }
            (redis, cluster_wide) => {
                if cluster_wide && redis.is_none() {
                    warn!(api, "rate_limit is cluster_wide but this data plane has no --redis-url; limiting per node");
                }
                // Only `fail_open` changed (or the cluster switch without
                // Redis): same buckets, so keep them.
                let reuse = previous.and_then(|p| match &p.backend {
                    Backend::Local(buckets) if p.identity == identity => Some(buckets.clone()),
                    _ => None,
                });
                Backend::Local(reuse.unwrap_or_else(|| Arc::new(LocalBuckets::new(&limit))))
            }
        };
        let policy = match spec.burst {
            0 => format!("{};w={}", limit.requests, limit.period_seconds),
            _ => format!("{};w={};burst={}", limit.requests, limit.period_seconds, limit.capacity),
        };
        Ok(Arc::new(RateLimiter {
            api: api.to_owned(),
            spec: spec.clone(),
            identity,
            limit,
            key,
            trusted: ctx.trusted_proxies.clone(),
            backend,
            limit_header: HeaderValue::from(limit.capacity.get()),
            policy_header: HeaderValue::from_str(&policy).map_err(|e| e.to_string())?,
            last_warning: AtomicU64::new(0),
        }))
    }

    /// Spends one request from the request's bucket.
    /// `request_id` goes in the problem body of a refusal.
    pub async fn check(&self, input: &RateKeyInput<'_>, request_id: &str) -> RateDecision {
        let key = self.key.derive(input, &self.trusted);
        let outcome = match &self.backend {
            Backend::Local(buckets) => buckets.check(&key, &self.limit),
            Backend::Cluster { redis, prefix } => {
                let bucket = format!("{prefix}{}", key.redis_suffix());
                match redis.check(&bucket, &self.limit).await {
                    Ok(outcome) => outcome,
                    Err(failure) => return self.redis_unavailable(&failure, request_id),
                }
            }
        };
        match outcome {
            Outcome::Allowed { remaining, reset } => {
                RateDecision::Allowed { count: Self::count(Some((remaining, reset))) }
            }
            Outcome::Limited { retry_after, reset } => {
                metrics::counter!("sluice_rate_limited_total", "api" => self.api.clone()).increment(1);
                RateDecision::Limited { response: self.too_many_requests(retry_after, reset, request_id) }
            }
        }
    }

    pub fn spec(&self) -> &v1::RateLimit {
        &self.spec
    }

    pub fn is_cluster_wide(&self) -> bool {
        matches!(self.backend, Backend::Cluster { .. })
    }

    fn count(remaining_and_reset: Option<(u32, Duration)>) -> RateCount {
        RateCount { remaining_and_reset: remaining_and_reset.map(|(remaining, reset)| (remaining, ceil_secs(reset))) }
    }

    /// Sets an answer's `RateLimit-*` fields, replacing any the upstream sent.
    pub fn set_fields(&self, count: RateCount, headers: &mut HeaderMap) {
        headers.insert(RATELIMIT_LIMIT, self.limit_header.clone());
        if let Some((remaining, reset)) = count.remaining_and_reset {
            headers.insert(RATELIMIT_REMAINING, number_value(remaining));
            headers.insert(RATELIMIT_RESET, number_value(reset));
        }
        headers.insert(RATELIMIT_POLICY, self.policy_header.clone());
    }

    /// The same fields as `set_fields`, in its order, written as HTTP/1 lines:
    /// for an answer whose other fields go out as the upstream sent them.
    pub fn write_fields(&self, count: RateCount, out: &mut Vec<u8>) {
        http1_wire::write_field(out, &RATELIMIT_LIMIT, &self.limit_header);
        if let Some((remaining, reset)) = count.remaining_and_reset {
            http1_wire::write_line(
                out,
                RATELIMIT_REMAINING.as_str().as_bytes(),
                itoa::Buffer::new().format(remaining).as_bytes(),
            );
            http1_wire::write_line(
                out,
                RATELIMIT_RESET.as_str().as_bytes(),
                itoa::Buffer::new().format(reset).as_bytes(),
            );
        }
        http1_wire::write_field(out, &RATELIMIT_POLICY, &self.policy_header);
    }

    fn too_many_requests(&self, retry_after: Duration, reset: Duration, request_id: &str) -> Response<ProxyBody> {
        // Retry-After is whole seconds; rounding down could send the client
        // back before the bucket admits it, so round up and never say 0.
        let retry_secs = ceil_secs(retry_after).max(1);
        let detail = format!(
            "The rate limit of {} requests per {} is exhausted; retry in {retry_secs} s.",
            self.limit.requests,
            period_text(self.limit.period_seconds)
        );
        let mut response =
            problem(StatusCode::TOO_MANY_REQUESTS, "rate-limited", "Too many requests", &detail, request_id);
        let headers = response.headers_mut();
        self.set_fields(Self::count(Some((0, reset.max(retry_after)))), headers);
        headers.insert(header::RETRY_AFTER, HeaderValue::from(retry_secs));
        response
    }

    fn redis_unavailable(&self, failure: &RedisFailure, request_id: &str) -> RateDecision {
        metrics::counter!("sluice_rate_limit_redis_errors_total", "api" => self.api.clone()).increment(1);
        if self.should_warn() {
            warn!(
                api = %self.api, error = %failure, fail_open = self.spec.fail_open,
                "cluster-wide rate limit cannot reach Redis; {} (logged at most every {} s)",
                if self.spec.fail_open { "letting requests through" } else { "rejecting requests with 503" },
                WARN_INTERVAL.as_secs()
            );
        }
        if self.spec.fail_open {
            // Remaining and Reset are unknown; a made-up number would mislead
            // clients that pace themselves by it.
            return RateDecision::Allowed { count: Self::count(None) };
        }
        let mut response = problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "rate-limit-unavailable",
            "Rate limit unavailable",
            "The rate limit of this API cannot be checked right now; retry shortly.",
            request_id,
        );
        let headers = response.headers_mut();
        headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        self.set_fields(Self::count(None), headers);
        RateDecision::Limited { response }
    }

    fn should_warn(&self) -> bool {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let last = self.last_warning.load(Ordering::Relaxed);
        now.saturating_sub(last) >= WARN_INTERVAL.as_secs()
            && self.last_warning.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }
}

/// Everything that defines the buckets' meaning. `fail_open` and
/// `cluster_wide` are not part of it: toggling `fail_open` must not reset
/// anyone's quota (the backend choice decides separately whether local
/// buckets can be kept).
fn identity(api: &str, limit: &Limit, spec: &v1::RateLimit) -> String {
    format!(
        "{api}\n{}\n{}\n{}\n{}\n{}",
        limit.requests,
        limit.period_seconds,
        limit.capacity,
        spec.key,
        spec.header.trim().to_ascii_lowercase()
    )
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

fn period_text(seconds: u64) -> String {
    match seconds {
        1 => "second".into(),
        60 => "minute".into(),
        3_600 => "hour".into(),
        86_400 => "day".into(),
        n => format!("{n} s"),
    }
}

/// An RFC 9457 problem-details response.
fn problem(status: StatusCode, slug: &str, title: &str, detail: &str, request_id: &str) -> Response<ProxyBody> {
    Problem { slug, title, status, detail: Some(detail), instance: None, request_id: Some(request_id) }.into_response()
}
