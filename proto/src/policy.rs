//! Policy settings as a data plane reads them when it compiles a policy, and
//! the control plane, with the same functions, before it commits: the ones
//! whose reading can fail on a value `validate` lets through.

use std::num::NonZeroU32;
use std::time::Duration;

use http::HeaderName;

use crate::v1::{ApiKeyAuth, RateLimit};

/// A rate limit's numbers, ready for a token bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateQuota {
    /// Bucket size: requests admitted at once (`burst`, else `requests`).
    pub capacity: NonZeroU32,
    /// One request's worth of time: `period / requests`, at least a nanosecond.
    pub emission: Duration,
}

/// `requests` per `period_seconds` with `burst`, as a bucket.
pub fn rate_quota(spec: &RateLimit) -> Result<RateQuota, String> {
    let requests = u32::try_from(spec.requests)
        .ok()
        .filter(|r| *r > 0)
        .ok_or_else(|| format!("rate_limit requests must be between 1 and {}", u32::MAX))?;
    if spec.period_seconds == 0 {
        return Err("rate_limit period must be at least one second".into());
    }
    let emission = Duration::from_secs(spec.period_seconds) / requests;
    if emission.is_zero() {
        return Err("rate_limit allows more than one request per nanosecond".into());
    }
    let burst = if spec.burst == 0 { u64::from(requests) } else { spec.burst };
    let capacity = u32::try_from(burst)
        .ok()
        .and_then(NonZeroU32::new)
        .ok_or_else(|| format!("rate_limit burst must be at most {}", u32::MAX))?;
    Ok(RateQuota { capacity, emission })
}

/// The header a `key: header` rate limit keys its buckets by.
pub fn rate_limit_header(spec: &RateLimit) -> Result<HeaderName, String> {
    let name = spec.header.trim();
    if name.is_empty() {
        return Err("rate_limit key `header` needs a header name".into());
    }
    HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("rate_limit header `{name}` is not a valid header name"))
}

/// The header an `api_key` policy reads the key from, if any.
pub fn api_key_header(spec: &ApiKeyAuth) -> Result<Option<HeaderName>, String> {
    (!spec.header.is_empty())
        .then(|| HeaderName::from_bytes(spec.header.as_bytes()))
        .transpose()
        .map_err(|_| format!("`{}` is not a valid header name", spec.header))
}
