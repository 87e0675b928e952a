//! Upstream pools, the last step of the request path before the wire: each
//! upstream of a snapshot becomes one pool holding its targets' health and
//! load counters, its balancer, its pooled HTTP clients and its health-check
//! task. A pool whose definition did not change is carried over to the next
//! routing table as is, so a swap resets no counter and drops no connection.

mod balance;
mod connections;
mod health;
mod http1;
pub use http1::{OwnHeads, ResponseBody};

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::{HeaderValue, Request, Response, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use metrics::{Counter, Gauge, Histogram};
use sluice_proto::v1;

use crate::base::forwarding::Replaced;
use crate::base::{ProxyBody, RequestBody};
use crate::clock::now_ms;
use crate::tls::{CertificateSet, UpstreamTls};

pub use balance::{Balancer, HashOn, PickContext, hash64};
pub use connections::SendError;
use connections::{Connections, Dialer};

const DEFAULT_EJECTION: Duration = Duration::from_secs(30);

/// A retry's cost in the budget's unit (thousandths of a retry, so a
/// request's deposit of `ratio` needs no float on the request path).
const RETRY_COST: i64 = 1_000;
/// The minimum's refill is kept for this long when unused.
const RESERVE_SECONDS: i64 = 10;
/// What deposits may add up to beyond the reserve, in retries.
const DEPOSIT_CAP: i64 = 100;

/// A target of an upstream with its live state.
#[derive(Debug)]
pub struct Target {
    /// The origin as configured, e.g. `http://10.0.0.5:8080`; used in logs and metric labels.
    pub url: String,
    pub scheme: Scheme,
    pub authority: Authority,
    /// `scheme://authority/`, what the connector dials.
    origin: Uri,
    /// The `Host` header for this target, built once.
    pub host_header: HeaderValue,
    pub weight: u32,
    upstream: String,
    /// Set by the active health check; true until a check says otherwise.
    active_healthy: AtomicBool,
    consecutive_failures: AtomicU32,
    /// Milliseconds since [`epoch`] until which the target is ejected; 0 when not ejected.
    ejected_until_ms: AtomicU64,
    in_flight: AtomicUsize,
    /// Open connections, idle or in use.
    connections: Connections,
    /// Registered once: the request path only stores into them.
    healthy_gauge: Gauge,
    in_flight_gauge: Gauge,
}

impl Target {
    /// Whether the balancer may send traffic here now.
    pub fn is_available(&self) -> bool {
        if !self.active_healthy.load(Ordering::Relaxed) {
            return false;
        }
        let until = self.ejected_until_ms.load(Ordering::Relaxed);
        if until == 0 {
            return true;
        }
        if now_ms() < until {
            return false;
        }
        // Ejection time is over: re-admit. Only the thread that wins the
        // exchange reports it, so the gauge and log fire once.
        if self.ejected_until_ms.compare_exchange(until, 0, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            self.consecutive_failures.store(0, Ordering::Relaxed);
            tracing::info!(upstream = %self.upstream, target = %self.url, "target re-admitted after ejection");
            self.report_health();
        }
        true
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// The target's health as the heartbeat reports it. A failing active
    /// check wins over an ejection: it lasts until the checks pass again,
    /// an ejection only until its time is over (which counts as over here,
    /// though the target is re-admitted only when a request next asks).
    pub fn health(&self) -> v1::TargetHealth {
        let state = if !self.active_healthy.load(Ordering::Relaxed) {
            v1::TargetState::FailingActiveCheck
        } else if self.ejected_until_ms.load(Ordering::Relaxed) > now_ms() {
            v1::TargetState::Ejected
        } else {
            v1::TargetState::Healthy
        };
        v1::TargetHealth { upstream: self.upstream.clone(), url: self.url.clone(), state: state.into() }
    }

    fn report_health(&self) {
        let healthy = self.active_healthy.load(Ordering::Relaxed) && self.ejected_until_ms.load(Ordering::Relaxed) == 0;
        self.healthy_gauge.set(if healthy { 1.0 } else { 0.0 });
    }

    fn report_in_flight(&self, n: usize) {
        self.in_flight_gauge.set(n as f64);
    }
}

/// Counts a request as in flight on a target until dropped; least-connections
/// and two-choices read this count. Keep it alive until the response body ends.
#[derive(Debug)]
pub struct InFlight {
    target: Arc<Target>,
}

impl InFlight {
    pub fn new(target: Arc<Target>) -> Self {
        let n = target.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        target.report_in_flight(n);
        InFlight { target }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let n = self.target.in_flight.fetch_sub(1, Ordering::Relaxed).saturating_sub(1);
        self.target.report_in_flight(n);
    }
}

/// The targets a request may go to: available, and not tried by it yet.
struct TargetList<'a> {
    targets: &'a [Arc<Target>],
    tried: Tried,
}

impl balance::Candidates for TargetList<'_> {
    fn len(&self) -> usize {
        self.targets.len()
    }
    fn available(&self, i: usize) -> bool {
        !self.tried.contains(i) && self.targets[i].is_available()
    }
    fn weight(&self, i: usize) -> u32 {
        self.targets[i].weight
    }
    fn in_flight(&self, i: usize) -> usize {
        self.targets[i].in_flight()
    }
}

/// An upstream's runtime form.
#[derive(Debug)]
pub struct UpstreamPool {
    pub name: String,
    /// The wire definition this pool was built from; a pool is reused only
    /// for an identical definition.
    spec: v1::Upstream,
    targets: Vec<Arc<Target>>,
    balancer: Balancer,
    /// Opens connections to the targets; `http://` ones go straight to TCP,
    /// `https://` ones through the pool's TLS settings.
    dialer: Dialer,
    /// TLS settings for `https://` targets (unused when there are none).
    tls: UpstreamTls,
    /// `None` disables passive ejection.
    passive: Option<PassiveHealth>,
    retry_budget: RetryBudget,
    retries: Counter,
    retries_refused: Counter,
    /// `sluice_upstream_request_duration_seconds`: each answered attempt.
    latency: Histogram,
    health_task: Option<tokio::task::AbortHandle>,
    idle_sweep_task: Option<tokio::task::AbortHandle>,
}

impl Drop for UpstreamPool {
    fn drop(&mut self) {
        // The last table using this pool is gone: stop probing its targets.
        // Its idle connections close as the targets drop.
        for task in [&self.health_task, &self.idle_sweep_task].into_iter().flatten() {
            task.abort();
        }
    }
}

impl UpstreamPool {
    /// Builds a pool, or returns `previous` when its definition is identical
    /// and it presents the same client certificate (which lives in the
    /// snapshot's certificates, outside the upstream definition).
    pub fn build(
        spec: &v1::Upstream,
        certificates: &CertificateSet,
        previous: Option<&Arc<UpstreamPool>>,
    ) -> Result<Arc<Self>, String> {
        let client_certificate = spec
            .tls
            .as_ref()
            .map(|tls| tls.client_certificate.as_str())
            .filter(|name| !name.is_empty())
            .and_then(|name| certificates.get(name));
        if let Some(previous) = previous
            && previous.spec == *spec
            && previous.tls.same_client_certificate(client_certificate)
        {
            return Ok(previous.clone());
        }
        let mut targets = Vec::with_capacity(spec.targets.len());
        for t in &spec.targets {
            let uri: http::Uri = t.url.parse().map_err(|e| format!("target `{}`: {e}", t.url))?;
            let scheme = uri.scheme().cloned().ok_or_else(|| format!("target `{}` has no scheme", t.url))?;
            if scheme != Scheme::HTTP && scheme != Scheme::HTTPS {
                return Err(format!("target `{}`: only http:// and https:// targets are supported", t.url));
            }
            let authority = uri.authority().cloned().ok_or_else(|| format!("target `{}` has no host", t.url))?;
            let origin = Uri::builder()
                .scheme(scheme.clone())
                .authority(authority.clone())
                .path_and_query("/")
                .build()
                .map_err(|e| format!("target `{}`: {e}", t.url))?;
            let url = t.url.trim_end_matches('/').to_string();
            let labels = [("upstream", spec.name.clone()), ("target", url.clone())];
            targets.push(Arc::new(Target {
                healthy_gauge: metrics::gauge!("sluice_upstream_healthy", &labels),
                in_flight_gauge: metrics::gauge!("sluice_upstream_active_connections", &labels),
                host_header: HeaderValue::from_str(authority.as_str())
                    .map_err(|e| format!("target `{}`: {e}", t.url))?,
                url,
                scheme,
                authority,
                origin,
                weight: t.weight.max(1),
                upstream: spec.name.clone(),
                active_healthy: AtomicBool::new(true),
                consecutive_failures: AtomicU32::new(0),
                ejected_until_ms: AtomicU64::new(0),
                in_flight: AtomicUsize::new(0),
                connections: Connections::default(),
            }));
        }
        let any_https = targets.iter().any(|t| t.scheme == Scheme::HTTPS);
        let tls = UpstreamTls::compile(spec, certificates, any_https).map_err(|e| e.to_string())?;
        let urls: Vec<&str> = targets.iter().map(|t| t.url.as_str()).collect();
        let weights: Vec<u32> = targets.iter().map(|t| t.weight).collect();
        let balancer = Balancer::new(spec, &urls, &weights)?;
        let passive = spec.passive_health_check.as_ref().filter(|p| p.consecutive_failures > 0).map(PassiveHealth::new);
        for t in &targets {
            t.report_health();
            t.report_in_flight(0);
        }
        let health_task = spec
            .health_check
            .as_ref()
            .filter(|c| !c.path.is_empty())
            .and_then(|check| health::spawn(spec.name.clone(), check.clone(), targets.clone(), &tls, spec.http2));
        let mut tcp = HttpConnector::new();
        tcp.set_nodelay(true);
        let dialer = Dialer::new(tls.connector(tcp, spec.http2), spec.http2);
        let idle_sweep_task = connections::spawn_idle_sweep(targets.iter().map(Arc::downgrade).collect());
        Ok(Arc::new(UpstreamPool {
            name: spec.name.clone(),
            spec: spec.clone(),
            targets,
            balancer,
            dialer,
            tls,
            passive,
            retry_budget: RetryBudget::new(spec.retry_budget.as_ref()),
            retries: metrics::counter!("sluice_upstream_retries_total", "upstream" => spec.name.clone()),
            retries_refused: metrics::counter!("sluice_upstream_retries_refused_total", "upstream" => spec.name.clone()),
            latency: metrics::histogram!("sluice_upstream_request_duration_seconds", "upstream" => spec.name.clone()),
            health_task,
            idle_sweep_task,
        }))
    }

    /// Whether to speak HTTP/2 to the targets (prior knowledge over TCP, ALPN over TLS).
    pub fn http2(&self) -> bool {
        self.spec.http2
    }

    pub fn targets(&self) -> &[Arc<Target>] {
        &self.targets
    }

    /// Sends a request to one of this pool's targets, on a kept-open
    /// connection when there is one. The URI is origin-form for HTTP/1.1
    /// (with a `Host` header), absolute for HTTP/2. `upgrade`: the request
    /// asks to switch protocols (its headers say which). `deadline`: when
    /// the attempt times out if no response head has come. `own`: what an
    /// HTTP/1.1 exchange writes and keeps itself, out of the header maps;
    /// only for a request to an HTTP/1.1 target that asks for no upgrade.
    pub fn send<'a>(
        &'a self,
        target: &'a Arc<Target>,
        request: Request<RequestBody>,
        connect_timeout: Duration,
        upgrade: bool,
        deadline: tokio::time::Instant,
        own: OwnHeads<'a>,
    ) -> impl Future<Output = Result<Response<ProxyBody>, SendError>> + 'a {
        self.dialer.send(target, request, connect_timeout, upgrade, deadline, own)
    }

    /// Whether a pick reads a field that forwarding sets (see
    /// `base::forwarding`): it must then find the forwarded value in the
    /// request's header map, not the client's.
    pub fn picks_by_forwarding_field(&self) -> bool {
        self.balancer.hashed_header().is_some_and(|name| Replaced::of(name).is_some())
    }

    /// Whether a pick reads the request's header fields: they must then be in its map.
    pub fn picks_by_request_field(&self) -> bool {
        self.balancer.reads_request_fields()
    }

    /// Picks a target for an attempt of a request (and marks it `tried`):
    /// for a retry, one the request has not tried when there is one, else
    /// any (a single target may well answer on a new connection); `None`
    /// when no target is available. A retry's pick does not count as a turn
    /// of the round robin: had it counted, with one of two targets down,
    /// every request would start on the dead one.
    pub fn pick(&self, client_ip: Option<IpAddr>, headers: &http::HeaderMap, tried: &mut Tried) -> Option<Arc<Target>> {
        let ctx = PickContext { client_ip, headers };
        let retry = tried.0 != 0;
        let untried = TargetList { targets: &self.targets, tried: *tried };
        let i = self.balancer.pick(&untried, &ctx, retry).or_else(|| {
            let any = TargetList { targets: &self.targets, tried: Tried::default() };
            if retry { self.balancer.pick(&any, &ctx, true) } else { None }
        })?;
        tried.mark(i);
        Some(self.targets[i].clone())
    }

    /// A target answered an attempt after `elapsed` (to its response head).
    pub fn record_latency(&self, elapsed: Duration) {
        self.latency.record(elapsed.as_secs_f64());
    }

    /// The target answered: a failure if the upstream's passive check counts that status, a success otherwise.
    pub fn record_answer(&self, target: &Target, status: http::StatusCode) {
        let Some(passive) = &self.passive else { return };
        if passive.counts(status) {
            self.record_failure(target);
        } else {
            target.consecutive_failures.store(0, Ordering::Relaxed);
        }
    }

    /// The exchange with the target failed on the target's side (connect error, reset, timeout):
    /// eject it for a while once failures reach the threshold.
    pub fn record_failure(&self, target: &Target) {
        let Some(PassiveHealth { threshold, ejection, .. }) = self.passive else { return };
        let failures = target.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= threshold && target.ejected_until_ms.load(Ordering::Relaxed) == 0 {
            let until = now_ms() + ejection.as_millis() as u64;
            target.ejected_until_ms.store(until.max(1), Ordering::Relaxed);
            tracing::warn!(upstream = %self.name, target = %target.url, failures, ?ejection, "target ejected");
            target.report_health();
        }
    }

    /// Every request deposits into the retry budget.
    pub fn deposit_retry_budget(&self) {
        self.retry_budget.deposit();
    }

    /// Takes one retry out of the budget (counted in the retry metrics);
    /// false when the budget is spent.
    pub fn withdraw_retry(&self) -> bool {
        let granted = self.retry_budget.withdraw(now_ms());
        let counted = if granted { &self.retries } else { &self.retries_refused };
        counted.increment(1);
        granted
    }
}

/// The targets an attempt of a request went to, by index: a retry goes
/// elsewhere. Targets past the 64th are not remembered (a retry may meet
/// one of them again).
#[derive(Debug, Clone, Copy, Default)]
pub struct Tried(u64);

impl Tried {
    fn mark(&mut self, i: usize) {
        if i < 64 {
            self.0 |= 1 << i;
        }
    }

    fn contains(self, i: usize) -> bool {
        i < 64 && self.0 & (1 << i) != 0
    }
}

/// How many retries an upstream may send: a bucket in thousandths of a
/// retry. Each request deposits `ratio` of a retry, time refills
/// `min_retries_per_second`, a retry takes one. It starts with, and keeps
/// at most, [`RESERVE_SECONDS`] of the minimum plus [`DEPOSIT_CAP`] retries
/// of deposits, so a quiet period does not store up a storm.
#[derive(Debug)]
struct RetryBudget {
    /// Thousandths of a retry.
    balance: AtomicI64,
    deposit: i64,
    /// Thousandths of a retry per millisecond: the minimum per second.
    refill_per_ms: i64,
    capacity: i64,
    /// When time last refilled the balance ([`now_ms`]).
    refilled_ms: AtomicU64,
}

impl RetryBudget {
    fn new(spec: Option<&v1::RetryBudget>) -> Self {
        let (ratio, min_per_second) = spec
            .map_or((sluice_proto::DEFAULT_RETRY_RATIO, sluice_proto::DEFAULT_MIN_RETRIES_PER_SECOND), |b| {
                (b.ratio, b.min_retries_per_second)
            });
        // Validated to 0..=1 (proto); the clamp keeps a NaN from a skewed peer harmless.
        let deposit = (ratio.clamp(0.0, 1.0) * RETRY_COST as f64).round() as i64;
        let refill_per_ms = i64::from(min_per_second);
        let reserve = refill_per_ms * 1_000 * RESERVE_SECONDS;
        RetryBudget {
            balance: AtomicI64::new(reserve),
            deposit,
            refill_per_ms,
            capacity: reserve + DEPOSIT_CAP * RETRY_COST,
            refilled_ms: AtomicU64::new(now_ms()),
        }
    }

    fn deposit(&self) {
        if self.deposit > 0 {
            let capacity = self.capacity;
            let _ = self
                .balance
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| Some((b + self.deposit).min(capacity)));
        }
    }

    /// Time's refill is added here, on the rare retry, not per request.
    fn withdraw(&self, now_ms: u64) -> bool {
        let last = self.refilled_ms.load(Ordering::Relaxed);
        if now_ms > last
            && self.refill_per_ms > 0
            && self.refilled_ms.compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            let refill = i64::try_from(now_ms - last).unwrap_or(i64::MAX).saturating_mul(self.refill_per_ms);
            let capacity = self.capacity;
            let _ = self
                .balance
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| Some(b.saturating_add(refill).min(capacity)));
        }
        self.balance
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| (b >= RETRY_COST).then_some(b - RETRY_COST))
            .is_ok()
    }
}

/// Passive ejection settings of one upstream.
#[derive(Debug, Clone, Copy)]
struct PassiveHealth {
    threshold: u32,
    ejection: Duration,
    /// Bit `n` set: status `500 + n` counts as a failure.
    unhealthy_statuses: u128,
}

impl PassiveHealth {
    fn new(spec: &v1::PassiveHealthCheck) -> PassiveHealth {
        let ejection = if spec.ejection_ms == 0 { DEFAULT_EJECTION } else { Duration::from_millis(spec.ejection_ms) };
        let unhealthy_statuses = spec
            .unhealthy_statuses
            .iter()
            .filter_map(|s| s.checked_sub(500).filter(|n| *n < 100))
            .fold(0u128, |bits, n| bits | 1 << n);
        PassiveHealth { threshold: spec.consecutive_failures, ejection, unhealthy_statuses }
    }

    fn counts(&self, status: http::StatusCode) -> bool {
        status.as_u16().checked_sub(500).is_some_and(|n| n < 100 && self.unhealthy_statuses & 1 << n != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(urls: &[&str]) -> v1::Upstream {
        v1::Upstream {
            name: "u".into(),
            targets: urls.iter().map(|u| v1::Target { url: u.to_string(), weight: 0 }).collect(),
            passive_health_check: Some(v1::PassiveHealthCheck {
                consecutive_failures: 2,
                ejection_ms: 50,
                unhealthy_statuses: vec![503],
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_hash_on_a_forwarding_field_is_told_apart() {
        let hashing_on = |source: v1::HashSource, name: &str| {
            let mut spec = spec(&["http://127.0.0.1:1", "http://127.0.0.1:2"]);
            spec.balance = v1::Balance::ConsistentHash.into();
            let mut hash_on = v1::HashOn { name: name.into(), ..Default::default() };
            hash_on.set_source(source);
            spec.hash_on = Some(hash_on);
            UpstreamPool::build(&spec, &CertificateSet::default(), None).unwrap().picks_by_forwarding_field()
        };
        for name in ["X-Forwarded-For", "x-forwarded-proto", "x-forwarded-host", "via", "host"] {
            assert!(hashing_on(v1::HashSource::Header, name), "{name}");
        }
        assert!(!hashing_on(v1::HashSource::Header, "x-user"));
        assert!(!hashing_on(v1::HashSource::Cookie, "x-forwarded-for"));
        assert!(
            !UpstreamPool::build(&spec(&["http://127.0.0.1:1"]), &CertificateSet::default(), None)
                .unwrap()
                .picks_by_forwarding_field()
        );
    }

    #[test]
    fn reuses_identical_pool_and_rebuilds_changed_one() {
        let a = UpstreamPool::build(&spec(&["http://127.0.0.1:1"]), &CertificateSet::default(), None).unwrap();
        let same = UpstreamPool::build(&spec(&["http://127.0.0.1:1"]), &CertificateSet::default(), Some(&a)).unwrap();
        assert!(Arc::ptr_eq(&a, &same));
        let changed =
            UpstreamPool::build(&spec(&["http://127.0.0.1:2"]), &CertificateSet::default(), Some(&a)).unwrap();
        assert!(!Arc::ptr_eq(&a, &changed));
    }

    #[test]
    fn https_targets_and_client_certificate_changes() {
        let client = |cn: &str| {
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = rcgen::CertificateParams::new(vec![cn.to_string()]).unwrap().self_signed(&key).unwrap();
            v1::Certificate {
                name: "client".into(),
                chain_pem: cert.pem(),
                private_key_pem: key.serialize_pem(),
                ..Default::default()
            }
        };
        let mut spec = spec(&["https://example.com"]);
        spec.tls = Some(v1::UpstreamTls { client_certificate: "client".into(), ..Default::default() });
        let first = client("a.test");
        let certs = CertificateSet::compile(std::slice::from_ref(&first), None).unwrap();
        let a = UpstreamPool::build(&spec, &certs, None).unwrap();
        assert_eq!(a.targets()[0].scheme, Scheme::HTTPS);
        // Same upstream, same certificate: carried over.
        let certs = CertificateSet::compile(std::slice::from_ref(&first), Some(&certs)).unwrap();
        let same = UpstreamPool::build(&spec, &certs, Some(&a)).unwrap();
        assert!(Arc::ptr_eq(&a, &same));
        // Same upstream, replaced client certificate: rebuilt with it.
        let certs = CertificateSet::compile(&[client("b.test")], Some(&certs)).unwrap();
        let rebuilt = UpstreamPool::build(&spec, &certs, Some(&same)).unwrap();
        assert!(!Arc::ptr_eq(&same, &rebuilt));
        let err = UpstreamPool::build(&spec, &CertificateSet::default(), None).unwrap_err();
        assert!(err.contains("`client` is not in the snapshot"), "{err}");
    }

    #[test]
    fn passive_ejection_and_readmission() {
        let pool =
            UpstreamPool::build(&spec(&["http://127.0.0.1:1", "http://127.0.0.1:2"]), &CertificateSet::default(), None)
                .unwrap();
        let h = http::HeaderMap::new();
        let t0 = pool.targets()[0].clone();
        pool.record_failure(&t0);
        assert!(t0.is_available());
        assert_eq!(t0.health().state(), v1::TargetState::Healthy);
        pool.record_failure(&t0);
        assert!(!t0.is_available());
        assert_eq!(t0.health().state(), v1::TargetState::Ejected);
        assert_eq!((t0.health().upstream.as_str(), t0.health().url.as_str()), ("u", "http://127.0.0.1:1"));
        assert!((0..10).all(|_| pool.pick(None, &h, &mut Tried::default()).is_some_and(|t| t.url.ends_with(":2"))));
        std::thread::sleep(Duration::from_millis(60));
        assert!(t0.is_available());
        // An answer the check does not count resets the failure count; one it counts is a failure.
        pool.record_failure(&t0);
        pool.record_answer(&t0, http::StatusCode::INTERNAL_SERVER_ERROR);
        pool.record_failure(&t0);
        assert!(t0.is_available());
        pool.record_answer(&t0, http::StatusCode::SERVICE_UNAVAILABLE);
        assert!(!t0.is_available());
    }

    #[test]
    fn retry_budget_starts_with_its_reserve_and_refills_by_ratio_and_time() {
        let budget = RetryBudget::new(Some(&v1::RetryBudget { ratio: 0.2, min_retries_per_second: 3 }));
        let start = budget.refilled_ms.load(Ordering::Relaxed);
        // 10 seconds of the minimum.
        assert_eq!((0..100).filter(|_| budget.withdraw(start)).count(), 30);
        // Five requests deposit one retry.
        for _ in 0..5 {
            budget.deposit();
        }
        assert!(budget.withdraw(start));
        assert!(!budget.withdraw(start));
        // A second refills the minimum.
        assert_eq!((0..10).filter(|_| budget.withdraw(start + 1_000)).count(), 3);
        // A long quiet spell refills only up to the reserve plus the deposit cap.
        for _ in 0..10_000 {
            budget.deposit();
        }
        assert_eq!((0..1_000).filter(|_| budget.withdraw(start + 3_600_000)).count(), 30 + 100);

        // No minimum, no ratio: no retry at all.
        let none = RetryBudget::new(Some(&v1::RetryBudget { ratio: 0.0, min_retries_per_second: 0 }));
        none.deposit();
        assert!(!none.withdraw(now_ms() + 10_000));
        // Unset: the defaults.
        let default = RetryBudget::new(None);
        assert_eq!(default.capacity, i64::from(sluice_proto::DEFAULT_MIN_RETRIES_PER_SECOND) * 10_000 + 100_000);
        assert_eq!(default.deposit, 200);
    }

    #[test]
    fn a_retry_skips_the_targets_tried_and_is_not_a_round_robin_turn() {
        let pool =
            UpstreamPool::build(&spec(&["http://127.0.0.1:1", "http://127.0.0.1:2"]), &CertificateSet::default(), None)
                .unwrap();
        let h = http::HeaderMap::new();
        let mut firsts = Vec::new();
        for _ in 0..4 {
            let mut tried = Tried::default();
            let first = pool.pick(None, &h, &mut tried).unwrap();
            let retry = pool.pick(None, &h, &mut tried).unwrap();
            assert!(!Arc::ptr_eq(&first, &retry), "a retry goes elsewhere");
            assert!(pool.pick(None, &h, &mut tried).is_some(), "both tried: either again");
            firsts.push(first.url.clone());
        }
        // The first attempts still alternate, retries or not.
        assert_eq!(firsts, ["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:1", "http://127.0.0.1:2"]);

        // One target: a retry goes to it again.
        let single = UpstreamPool::build(&spec(&["http://127.0.0.1:1"]), &CertificateSet::default(), None).unwrap();
        let mut tried = Tried::default();
        let first = single.pick(None, &h, &mut tried).unwrap();
        assert!(Arc::ptr_eq(&first, &single.pick(None, &h, &mut tried).unwrap()));

        let mut least = spec(&["http://127.0.0.1:1", "http://127.0.0.1:2"]);
        least.balance = v1::Balance::LeastConnections.into();
        let pool = UpstreamPool::build(&least, &CertificateSet::default(), None).unwrap();
        let mut tried = Tried::default();
        let first = pool.pick(None, &h, &mut tried).unwrap();
        assert!(!Arc::ptr_eq(&first, &pool.pick(None, &h, &mut tried).unwrap()));
    }
}
