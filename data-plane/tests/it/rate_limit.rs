//! Rate limits: cluster-wide buckets shared through a real Redis
//! (`SLUICE_TEST_REDIS_URL`), Redis outages under fail-open and fail-closed,
//! and the policy in the proxy path over real sockets.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use http::HeaderMap;
use http_body_util::BodyExt;
use serde_json::Value;
use sluice_data_plane::policy::rate_limit::{
    RATELIMIT_LIMIT, RATELIMIT_REMAINING, RateCount, RateDecision, RateKeyInput, RateLimitContext, RateLimiter,
};
use sluice_data_plane::settings::Settings;
use sluice_proto::v1;
use sluice_testkit::services::service_url;

use crate::gateway::Gateway;
use crate::support::unused_addr;

/// The Redis to test against, or None when none is configured (skipped; under
/// CI a failure, by `sluice_testkit::services`). A configured Redis that does
/// not answer fails the test: cluster-wide limits are a feature CI must cover.
async fn test_redis() -> Result<Option<String>> {
    let Some(url) = service_url("SLUICE_TEST_REDIS_URL", "redis://127.0.0.1:6379")? else { return Ok(None) };
    let client = redis::Client::open(url.as_str())?;
    let reachable = tokio::time::timeout(Duration::from_secs(3), async {
        let mut connection = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut connection).await
    })
    .await;
    match reachable {
        Ok(Ok(_)) => Ok(Some(url)),
        Ok(Err(e)) => bail!("Redis at SLUICE_TEST_REDIS_URL is unreachable: {e}"),
        Err(_) => bail!("Redis at SLUICE_TEST_REDIS_URL did not answer"),
    }
}

/// A data plane's view of Redis: its own connection, and a key prefix unique
/// to the test so parallel tests (and reruns) never share buckets.
fn node(url: &str, prefix: &str) -> Result<RateLimitContext> {
    // Generous timeout: the test machine is shared and slow; the timeout
    // path has its own test.
    Ok(RateLimitContext::connect(url)?.with_key_prefix(prefix).with_redis_timeout(Duration::from_secs(2)))
}

fn random_prefix() -> String {
    format!("sluice-test:{:016x}", rand::random::<u64>())
}

fn cluster_spec(requests: u64, key: v1::RateLimitKey, fail_open: bool) -> v1::RateLimit {
    v1::RateLimit { requests, period_seconds: 60, key: key as i32, cluster_wide: true, fail_open, ..Default::default() }
}

/// An allowed request's `RateLimit-*` fields, as its answer carries them.
fn fields(limiter: &RateLimiter, count: RateCount) -> HeaderMap {
    let mut fields = HeaderMap::new();
    limiter.set_fields(count, &mut fields);
    fields
}

async fn check(limiter: &RateLimiter, client: &str) -> Result<RateDecision> {
    let headers = HeaderMap::new();
    let client_ip: IpAddr = client.parse()?;
    Ok(limiter.check(&RateKeyInput { consumer: None, client_ip, headers: &headers }, "r").await)
}

fn number(headers: &HeaderMap, name: &http::HeaderName) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.parse().ok()
}

#[tokio::test]
async fn two_data_planes_share_one_limit_through_redis() -> Result<()> {
    let Some(url) = test_redis().await? else { return Ok(()) };
    let prefix = random_prefix();
    let spec = cluster_spec(10, v1::RateLimitKey::Ip, false);
    let first = RateLimiter::compile(&spec, "shop", None, &node(&url, &prefix)?).map_err(anyhow::Error::msg)?;
    let second = RateLimiter::compile(&spec, "shop", None, &node(&url, &prefix)?).map_err(anyhow::Error::msg)?;
    assert!(first.is_cluster_wide() && second.is_cluster_wide());

    // Alternate between the nodes: the remaining count goes down across both.
    for n in 0..10u64 {
        let limiter = if n % 2 == 0 { &first } else { &second };
        match check(limiter, "192.0.2.1").await? {
            RateDecision::Allowed { count } => {
                let headers = fields(limiter, count);
                assert_eq!(number(&headers, &RATELIMIT_LIMIT), Some(10));
                assert_eq!(number(&headers, &RATELIMIT_REMAINING), Some(9 - n), "request {n}");
            }
            RateDecision::Limited { response } => bail!("request {n} was limited: {}", response.status()),
        }
    }
    for limiter in [&first, &second] {
        let RateDecision::Limited { response } = check(limiter, "192.0.2.1").await? else {
            bail!("an 11th request passed");
        };
        assert_eq!(response.status(), http::StatusCode::TOO_MANY_REQUESTS);
        let retry_after = number(response.headers(), &http::header::RETRY_AFTER);
        // One request per 6 s refills the shared bucket.
        assert!(retry_after.is_some_and(|s| (1..=6).contains(&s)), "Retry-After {retry_after:?}");
    }
    // Buckets are per key in Redis too.
    assert!(matches!(check(&second, "192.0.2.2").await?, RateDecision::Allowed { .. }));
    Ok(())
}

#[tokio::test]
async fn redis_buckets_survive_unchanged_swaps_and_reset_on_change() -> Result<()> {
    let Some(url) = test_redis().await? else { return Ok(()) };
    let ctx = node(&url, &random_prefix())?;
    let spec = cluster_spec(2, v1::RateLimitKey::Api, false);
    let limiter = RateLimiter::compile(&spec, "shop", None, &ctx).map_err(anyhow::Error::msg)?;
    for _ in 0..2 {
        assert!(matches!(check(&limiter, "192.0.2.1").await?, RateDecision::Allowed { .. }));
    }
    let same = RateLimiter::compile(&spec, "shop", Some(&limiter), &ctx).map_err(anyhow::Error::msg)?;
    assert!(Arc::ptr_eq(&limiter, &same));
    assert!(matches!(check(&same, "192.0.2.1").await?, RateDecision::Limited { .. }));
    // fail_open does not define the bucket: the Redis key stays.
    let toggled = RateLimiter::compile(&cluster_spec(2, v1::RateLimitKey::Api, true), "shop", Some(&same), &ctx)
        .map_err(anyhow::Error::msg)?;
    assert!(matches!(check(&toggled, "192.0.2.1").await?, RateDecision::Limited { .. }));
    // A new limit is a new key: it starts full.
    let raised = RateLimiter::compile(&cluster_spec(3, v1::RateLimitKey::Api, false), "shop", Some(&toggled), &ctx)
        .map_err(anyhow::Error::msg)?;
    match check(&raised, "192.0.2.1").await? {
        RateDecision::Allowed { count } => {
            assert_eq!(number(&fields(&raised, count), &RATELIMIT_REMAINING), Some(2));
        }
        RateDecision::Limited { .. } => bail!("a changed limit kept the old bucket"),
    }
    Ok(())
}

#[tokio::test]
async fn unreachable_redis_follows_fail_open() -> Result<()> {
    // Nothing listens there: every check fails fast with a refused connection.
    let closed = unused_addr().await?;
    let ctx = RateLimitContext::connect(&format!("redis://{closed}"))?.with_key_prefix(&random_prefix());

    let open = RateLimiter::compile(&cluster_spec(1, v1::RateLimitKey::Ip, true), "shop", None, &ctx)
        .map_err(anyhow::Error::msg)?;
    for _ in 0..3 {
        match check(&open, "192.0.2.1").await? {
            RateDecision::Allowed { count } => {
                let headers = fields(&open, count);
                assert_eq!(number(&headers, &RATELIMIT_LIMIT), Some(1));
                // Unknown while Redis is away; not made up.
                assert!(headers.get(&RATELIMIT_REMAINING).is_none());
            }
            RateDecision::Limited { response } => bail!("fail-open limited: {}", response.status()),
        }
    }

    let closed_policy = RateLimiter::compile(&cluster_spec(1, v1::RateLimitKey::Ip, false), "shop", None, &ctx)
        .map_err(anyhow::Error::msg)?;
    let RateDecision::Limited { response } = check(&closed_policy, "192.0.2.1").await? else {
        bail!("fail-closed let a request through without Redis");
    };
    assert_eq!(response.status(), http::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()[http::header::CONTENT_TYPE], "application/problem+json");
    assert!(response.headers().contains_key(http::header::RETRY_AFTER));
    let body: Value = serde_json::from_slice(&response.into_body().collect().await?.to_bytes())?;
    assert_eq!(body["status"], 503);
    assert_eq!(body["type"], "https://sluice.dev/problems/rate-limit-unavailable");
    Ok(())
}

#[tokio::test]
async fn a_malformed_redis_url_is_an_error_not_a_panic() {
    assert!(RateLimitContext::connect("not a url").is_err());
}

#[tokio::test]
async fn a_silent_redis_times_out_quickly() -> Result<()> {
    // Accepts connections and never answers, like a hung or black-holed Redis.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let ctx = RateLimitContext::connect(&format!("redis://{addr}"))?
        .with_key_prefix(&random_prefix())
        .with_redis_timeout(Duration::from_millis(100));
    let open = RateLimiter::compile(&cluster_spec(1, v1::RateLimitKey::Ip, true), "shop", None, &ctx)
        .map_err(anyhow::Error::msg)?;
    let closed = RateLimiter::compile(&cluster_spec(1, v1::RateLimitKey::Ip, false), "shop", None, &ctx)
        .map_err(anyhow::Error::msg)?;
    let started = std::time::Instant::now();
    assert!(matches!(check(&open, "192.0.2.1").await?, RateDecision::Allowed { .. }));
    let RateDecision::Limited { response } = check(&closed, "192.0.2.1").await? else {
        bail!("fail-closed let a request through without Redis");
    };
    assert_eq!(response.status(), http::StatusCode::SERVICE_UNAVAILABLE);
    // Two checks, each bounded by the 100 ms budget (plus a slow machine's slack).
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    hold.abort();
    Ok(())
}

// ---- Through the proxy ----------------------------------------------------

/// An upstream that counts what reaches it, so a test can prove a rejected
/// request never did.
struct CountingUpstream {
    addr: std::net::SocketAddr,
    hits: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl CountingUpstream {
    async fn start() -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = hits.clone();
        let task = crate::support::serve_http1(listener, move |_req| {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { Ok(http::Response::new(http_body_util::Full::new(bytes::Bytes::from_static(b"ok")))) }
        });
        Ok(CountingUpstream { addr, hits, task })
    }

    fn hits(&self) -> usize {
        self.hits.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for CountingUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn limited_snapshot(version: u64, upstream: &CountingUpstream, limit: v1::RateLimit, extra_api: bool) -> v1::Snapshot {
    let api = |name: &str, prefix: &str, policies: Vec<v1::Policy>| v1::Api {
        name: name.into(),
        path_prefix: prefix.into(),
        upstream: "backend".into(),
        policies,
        ..Default::default()
    };
    let mut apis = vec![api("shop", "/shop", vec![v1::Policy { kind: Some(v1::policy::Kind::RateLimit(limit)) }])];
    if extra_api {
        apis.push(api("other", "/other", Vec::new()));
    }
    let upstreams = vec![v1::Upstream {
        name: "backend".into(),
        targets: vec![v1::Target { url: format!("http://{}", upstream.addr), weight: 1 }],
        ..Default::default()
    }];
    v1::Snapshot { version, apis, upstreams, ..Default::default() }
}

fn local_spec(requests: u64, key: v1::RateLimitKey, header: &str) -> v1::RateLimit {
    v1::RateLimit { requests, period_seconds: 60, key: key as i32, header: header.into(), ..Default::default() }
}

fn http_client() -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?)
}

fn header_number(headers: &reqwest::header::HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.parse().ok()
}

#[tokio::test]
async fn the_sixth_request_in_a_minute_is_429_and_never_reaches_the_upstream() -> Result<()> {
    let upstream = CountingUpstream::start().await?;
    let snapshot = limited_snapshot(1, &upstream, local_spec(5, v1::RateLimitKey::Ip, ""), false);
    let proxy = Gateway::start(&snapshot).await?;
    let client = http_client()?;

    for expected in (0..5).rev() {
        let response = client.get(proxy.url("/shop/items")).send().await?;
        assert_eq!(response.status(), 200);
        assert_eq!(header_number(response.headers(), "ratelimit-limit"), Some(5));
        assert_eq!(header_number(response.headers(), "ratelimit-remaining"), Some(expected));
        assert!(header_number(response.headers(), "ratelimit-reset").is_some_and(|s| s <= 60));
    }
    let response = client.get(proxy.url("/shop/items")).send().await?;
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["content-type"], "application/problem+json");
    assert!(header_number(response.headers(), "retry-after").is_some_and(|s| (1..=12).contains(&s)));
    assert_eq!(header_number(response.headers(), "ratelimit-remaining"), Some(0));
    assert_eq!(header_number(response.headers(), "ratelimit-limit"), Some(5));
    assert!(header_number(response.headers(), "ratelimit-reset").is_some());
    let body: Value = response.json().await?;
    assert_eq!(body["status"], 429);
    assert_eq!(body["title"], "Too many requests");
    assert_eq!(upstream.hits(), 5, "the rejected request reached the upstream");
    Ok(())
}

#[tokio::test]
async fn header_values_get_separate_buckets_through_the_proxy() -> Result<()> {
    let upstream = CountingUpstream::start().await?;
    let snapshot = limited_snapshot(1, &upstream, local_spec(1, v1::RateLimitKey::Header, "X-Tenant"), false);
    let proxy = Gateway::start(&snapshot).await?;
    let client = http_client()?;
    let status = |tenant: &'static str| {
        let request = client.get(proxy.url("/shop/items")).header("x-tenant", tenant);
        async move { Ok::<_, anyhow::Error>(request.send().await?.status().as_u16()) }
    };
    assert_eq!(status("acme").await?, 200);
    assert_eq!(status("acme").await?, 429);
    assert_eq!(status("globex").await?, 200);
    assert_eq!(status("globex").await?, 429);
    assert_eq!(upstream.hits(), 2);
    Ok(())
}

#[tokio::test]
async fn a_swap_keeps_the_bucket_unless_the_limit_changes() -> Result<()> {
    let upstream = CountingUpstream::start().await?;
    let limit = local_spec(2, v1::RateLimitKey::Ip, "");
    let proxy = Gateway::start(&limited_snapshot(1, &upstream, limit.clone(), false)).await?;
    let client = http_client()?;
    let get = || async { Ok::<_, anyhow::Error>(client.get(proxy.url("/shop/items")).send().await?) };
    assert_eq!(get().await?.status(), 200);
    assert_eq!(get().await?.status(), 200);
    assert_eq!(get().await?.status(), 429);

    // A new snapshot (another API added) that leaves this limit alone.
    proxy.apply(&limited_snapshot(2, &upstream, limit, true)).await?;
    assert_eq!(client.get(proxy.url("/other/x")).send().await?.status(), 200, "the new snapshot is live");
    assert_eq!(get().await?.status(), 429, "an unchanged limit kept its bucket across the swap");

    // Changing the limit starts fresh buckets.
    proxy.apply(&limited_snapshot(3, &upstream, local_spec(3, v1::RateLimitKey::Ip, ""), true)).await?;
    let response = get().await?;
    assert_eq!(response.status(), 200);
    assert_eq!(header_number(response.headers(), "ratelimit-remaining"), Some(2));
    Ok(())
}

#[tokio::test]
async fn two_proxies_sharing_redis_enforce_one_limit() -> Result<()> {
    let Some(url) = test_redis().await? else { return Ok(()) };
    let upstream = CountingUpstream::start().await?;
    let mut limit = local_spec(10, v1::RateLimitKey::Api, "");
    limit.cluster_wide = true;
    let mut snapshot = limited_snapshot(1, &upstream, limit, false);
    // The bucket's Redis key starts with the API's name: one of its own per run.
    snapshot.apis[0].name = random_prefix().replace(':', "-");
    let with_redis = |settings: &mut Settings| settings.redis_url = Some(url.clone());
    let first = Gateway::start_with(&snapshot, with_redis).await?;
    let second = Gateway::start_with(&snapshot, with_redis).await?;
    let client = http_client()?;
    let mut passed = 0;
    for n in 0..16 {
        let proxy = if n % 2 == 0 { &first } else { &second };
        let response = client.get(proxy.url("/shop/items")).send().await?;
        match response.status().as_u16() {
            200 => passed += 1,
            429 => assert!(response.headers().contains_key("retry-after")),
            other => bail!("unexpected status {other}"),
        }
    }
    assert_eq!(passed, 10, "two data planes admitted {passed} requests against one limit of 10");
    assert_eq!(upstream.hits(), 10);
    Ok(())
}
