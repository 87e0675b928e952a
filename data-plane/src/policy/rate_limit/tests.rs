//! Unit tests of the rate-limit policy: compile, carry-over across swaps,
//! local buckets and the responses they produce.

use std::net::IpAddr;

use http::HeaderMap;
use http_body_util::BodyExt;

use super::*;

fn spec(requests: u64, period_seconds: u64, key: v1::RateLimitKey) -> v1::RateLimit {
    v1::RateLimit { requests, period_seconds, key: key as i32, ..Default::default() }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

async fn check(limiter: &RateLimiter, client: &str, headers: &HeaderMap) -> RateDecision {
    limiter.check(&RateKeyInput { consumer: None, client_ip: ip(client), headers }, "r").await
}

fn header(headers: &HeaderMap, name: &HeaderName) -> u64 {
    headers.get(name).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()).expect("numeric header")
}

/// An allowed request's answer fields, as the map path sets them.
fn fields(limiter: &RateLimiter, count: RateCount) -> HeaderMap {
    let mut fields = HeaderMap::new();
    limiter.set_fields(count, &mut fields);
    fields
}

/// An allowed request's answer fields, as the writer of a head kept as sent writes them.
fn as_lines(limiter: &RateLimiter, count: RateCount) -> String {
    let mut out = Vec::new();
    limiter.write_fields(count, &mut out);
    String::from_utf8(out).unwrap()
}

fn lines_of(fields: &HeaderMap) -> String {
    fields.iter().map(|(name, value)| format!("{name}: {}\r\n", value.to_str().unwrap())).collect()
}

#[test]
fn the_fields_written_as_lines_are_those_set_on_a_map_in_its_order() {
    let ctx = RateLimitContext::local();
    let limiter = RateLimiter::compile(&spec(5, 60, v1::RateLimitKey::Ip), "shop", None, &ctx).unwrap();
    let counted = RateLimiter::count(Some((3, Duration::from_millis(24_001))));
    assert_eq!(
        as_lines(&limiter, counted),
        "ratelimit-limit: 5\r\nratelimit-remaining: 3\r\nratelimit-reset: 25\r\nratelimit-policy: 5;w=60\r\n"
    );
    assert_eq!(as_lines(&limiter, counted), lines_of(&fields(&limiter, counted)));
    // Fail-open (Redis unreachable): the count is unknown, so only the limit and the policy.
    let unknown = RateLimiter::count(None);
    assert_eq!(as_lines(&limiter, unknown), "ratelimit-limit: 5\r\nratelimit-policy: 5;w=60\r\n");
    assert_eq!(as_lines(&limiter, unknown), lines_of(&fields(&limiter, unknown)));
}

fn remaining(limiter: &RateLimiter, decision: RateDecision) -> Option<u64> {
    match decision {
        RateDecision::Allowed { count } => Some(header(&fields(limiter, count), &RATELIMIT_REMAINING)),
        RateDecision::Limited { .. } => None,
    }
}

#[test]
fn invalid_limits_do_not_compile() {
    let ctx = RateLimitContext::local();
    let mut header_without_name = spec(5, 60, v1::RateLimitKey::Header);
    header_without_name.header = String::new();
    let mut huge_burst = spec(5, 60, v1::RateLimitKey::Ip);
    huge_burst.burst = u64::from(u32::MAX) + 1;
    let cases = [
        spec(0, 60, v1::RateLimitKey::Ip),
        spec(5, 0, v1::RateLimitKey::Ip),
        spec(u64::from(u32::MAX) + 1, 60, v1::RateLimitKey::Ip),
        spec(u64::from(u32::MAX), 1, v1::RateLimitKey::Ip),
        header_without_name,
        huge_burst,
    ];
    for case in cases {
        assert!(RateLimiter::compile(&case, "shop", None, &ctx).is_err(), "{case:?} should not compile");
    }
}

#[test]
fn limits_derive_capacity_and_interval() {
    let limit = Limit::from_spec(&spec(5, 60, v1::RateLimitKey::Ip)).unwrap();
    assert_eq!(limit.capacity.get(), 5);
    assert_eq!(limit.emission, Duration::from_secs(12));
    assert!((limit.emission_micros() - 12e6).abs() < 1e-3);
    let mut bursty = spec(100, 1, v1::RateLimitKey::Ip);
    bursty.burst = 20;
    let limit = Limit::from_spec(&bursty).unwrap();
    assert_eq!(limit.capacity.get(), 20);
    assert_eq!(limit.emission, Duration::from_millis(10));
}

#[tokio::test]
async fn an_unchanged_spec_keeps_the_limiter_and_its_buckets() {
    let ctx = RateLimitContext::local();
    let limit = spec(2, 60, v1::RateLimitKey::Ip);
    let first = RateLimiter::compile(&limit, "shop", None, &ctx).unwrap();
    let headers = HeaderMap::new();
    check(&first, "192.0.2.1", &headers).await;
    check(&first, "192.0.2.1", &headers).await;

    let same = RateLimiter::compile(&limit.clone(), "shop", Some(&first), &ctx).unwrap();
    assert!(Arc::ptr_eq(&first, &same), "an unchanged limit is carried over as is");
    assert!(matches!(check(&same, "192.0.2.1", &headers).await, RateDecision::Limited { .. }));

    // Toggling fail_open changes nothing about the buckets: they are kept.
    let mut fail_closed = limit.clone();
    fail_closed.fail_open = !limit.fail_open;
    let toggled = RateLimiter::compile(&fail_closed, "shop", Some(&same), &ctx).unwrap();
    assert!(!Arc::ptr_eq(&same, &toggled));
    assert!(matches!(check(&toggled, "192.0.2.1", &headers).await, RateDecision::Limited { .. }));

    // A changed limit starts fresh.
    let raised = spec(3, 60, v1::RateLimitKey::Ip);
    let changed = RateLimiter::compile(&raised, "shop", Some(&toggled), &ctx).unwrap();
    assert!(!Arc::ptr_eq(&toggled, &changed));
    assert_eq!(remaining(&changed, check(&changed, "192.0.2.1", &headers).await), Some(2));

    // Another API never inherits a limiter, even with the same spec.
    let other = RateLimiter::compile(&raised, "billing", Some(&changed), &ctx).unwrap();
    assert!(!Arc::ptr_eq(&changed, &other));
}

#[tokio::test]
async fn five_per_minute_then_429_with_headers() {
    let ctx = RateLimitContext::local();
    let limiter = RateLimiter::compile(&spec(5, 60, v1::RateLimitKey::Ip), "shop", None, &ctx).unwrap();
    let headers = HeaderMap::new();
    for expected in (0..5).rev() {
        match check(&limiter, "192.0.2.1", &headers).await {
            RateDecision::Allowed { count } => {
                let headers = fields(&limiter, count);
                assert_eq!(header(&headers, &RATELIMIT_LIMIT), 5);
                assert_eq!(header(&headers, &RATELIMIT_REMAINING), expected);
                // One 12 s interval per spent request until the bucket is full.
                let reset = header(&headers, &RATELIMIT_RESET);
                assert!((12 * (5 - expected) - 1..=12 * (5 - expected)).contains(&reset), "reset {reset}");
                assert_eq!(headers[&RATELIMIT_POLICY], "5;w=60");
                assert_eq!(as_lines(&limiter, count), lines_of(&headers));
            }
            RateDecision::Limited { .. } => panic!("request {} was limited", 5 - expected),
        }
    }
    let RateDecision::Limited { response } = check(&limiter, "192.0.2.1", &headers).await else {
        panic!("the 6th request passed");
    };
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()[header::CONTENT_TYPE], "application/problem+json");
    let retry_after = header(response.headers(), &header::RETRY_AFTER);
    assert!((11..=12).contains(&retry_after), "retry after {retry_after}");
    assert_eq!(header(response.headers(), &RATELIMIT_REMAINING), 0);
    assert_eq!(header(response.headers(), &RATELIMIT_LIMIT), 5);
    assert!(header(response.headers(), &RATELIMIT_RESET) >= 59);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["status"], 429);
    assert_eq!(body["type"], "https://sluice.dev/problems/rate-limited");
    assert_eq!(body["title"], "Too many requests");
    assert!(body["detail"].as_str().unwrap().contains("5 requests per minute"));

    // Buckets are per key: another client is untouched.
    assert_eq!(remaining(&limiter, check(&limiter, "192.0.2.2", &headers).await), Some(4));
}

#[tokio::test]
async fn header_keys_get_their_own_buckets() {
    let ctx = RateLimitContext::local();
    let mut by_tenant = spec(1, 60, v1::RateLimitKey::Header);
    by_tenant.header = "X-Tenant".into();
    let limiter = RateLimiter::compile(&by_tenant, "shop", None, &ctx).unwrap();
    let tenant = |value: &'static str| {
        let mut headers = HeaderMap::new();
        headers.insert("x-tenant", HeaderValue::from_static(value));
        headers
    };
    let (acme, globex, none) = (tenant("acme"), tenant("globex"), HeaderMap::new());
    assert!(matches!(check(&limiter, "192.0.2.1", &acme).await, RateDecision::Allowed { .. }));
    assert!(matches!(check(&limiter, "192.0.2.1", &acme).await, RateDecision::Limited { .. }));
    assert!(matches!(check(&limiter, "192.0.2.1", &globex).await, RateDecision::Allowed { .. }));
    // Requests without the header share the "missing" bucket, not a tenant's.
    assert!(matches!(check(&limiter, "192.0.2.1", &none).await, RateDecision::Allowed { .. }));
    assert!(matches!(check(&limiter, "192.0.2.9", &none).await, RateDecision::Limited { .. }));
}

#[tokio::test]
async fn consumer_keys_fall_back_to_the_client_address() {
    let ctx = RateLimitContext::local().with_trusted_proxies(vec!["10.0.0.0/8".parse::<Cidr>().unwrap()]);
    let limiter = RateLimiter::compile(&spec(1, 60, v1::RateLimitKey::Consumer), "shop", None, &ctx).unwrap();
    let mut forwarded = HeaderMap::new();
    forwarded.insert("x-forwarded-for", HeaderValue::from_static("198.51.100.7"));
    let (alice, bob): (Arc<str>, Arc<str>) = ("alice".into(), "bob".into());
    let input = |consumer, headers| RateKeyInput { consumer, client_ip: ip("10.0.0.2"), headers };
    assert!(matches!(limiter.check(&input(Some(&alice), &forwarded), "r").await, RateDecision::Allowed { .. }));
    assert!(matches!(limiter.check(&input(Some(&alice), &forwarded), "r").await, RateDecision::Limited { .. }));
    assert!(matches!(limiter.check(&input(Some(&bob), &forwarded), "r").await, RateDecision::Allowed { .. }));
    // Anonymous: keyed by the client behind the trusted proxy.
    assert!(matches!(limiter.check(&input(None, &forwarded), "r").await, RateDecision::Allowed { .. }));
    assert!(matches!(limiter.check(&input(None, &forwarded), "r").await, RateDecision::Limited { .. }));
    assert!(matches!(limiter.check(&input(None, &HeaderMap::new()), "r").await, RateDecision::Allowed { .. }));
}

#[tokio::test]
async fn api_key_is_one_bucket_for_everyone() {
    let ctx = RateLimitContext::local();
    let limiter = RateLimiter::compile(&spec(2, 60, v1::RateLimitKey::Api), "shop", None, &ctx).unwrap();
    let headers = HeaderMap::new();
    assert!(matches!(check(&limiter, "192.0.2.1", &headers).await, RateDecision::Allowed { .. }));
    assert!(matches!(check(&limiter, "192.0.2.2", &headers).await, RateDecision::Allowed { .. }));
    assert!(matches!(check(&limiter, "192.0.2.3", &headers).await, RateDecision::Limited { .. }));
}

#[tokio::test]
async fn cluster_wide_without_redis_limits_locally() {
    let ctx = RateLimitContext::local();
    let mut shared = spec(1, 60, v1::RateLimitKey::Ip);
    shared.cluster_wide = true;
    let limiter = RateLimiter::compile(&shared, "shop", None, &ctx).unwrap();
    assert!(!limiter.is_cluster_wide());
    let headers = HeaderMap::new();
    assert!(matches!(check(&limiter, "192.0.2.1", &headers).await, RateDecision::Allowed { .. }));
    assert!(matches!(check(&limiter, "192.0.2.1", &headers).await, RateDecision::Limited { .. }));
}

#[tokio::test]
async fn idle_buckets_are_swept() {
    let limit = Limit::from_spec(&spec(1_000, 1, v1::RateLimitKey::Ip)).unwrap();
    let buckets = LocalBuckets::new(&limit);
    for n in 0..100u8 {
        buckets.check(&key::BucketKey::Ip(IpAddr::from([192, 0, 2, n])), &limit);
    }
    assert_eq!(buckets.len(), 100);
    // Each bucket is full again 1 ms after its only request.
    tokio::time::sleep(Duration::from_millis(20)).await;
    buckets.sweep_now();
    assert_eq!(buckets.len(), 0);
}

#[test]
fn rounding_helpers() {
    assert_eq!(ceil_secs(Duration::ZERO), 0);
    assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
    assert_eq!(ceil_secs(Duration::from_secs(12)), 12);
    assert_eq!(ceil_secs(Duration::from_millis(12_001)), 13);
    assert_eq!(period_text(60), "minute");
    assert_eq!(period_text(90), "90 s");
}
