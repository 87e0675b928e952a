//! Snapshot -> routing table, between the sync client and the proxy: `compile`
//! turns a validated snapshot into the runtime form (route matcher, per-API
//! settings and policy chains, upstream pools) off to the side, and
//! `TableStore` swaps it in with one atomic store that every new request then
//! reads once.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use http::Method;
use sha2::{Digest, Sha256};
use sluice_proto::v1;

use sluice_proto::routes as matcher;
pub use sluice_proto::routes::RouteMiss;

use crate::base::{MetricRegistry, RequestMetrics};
use crate::fast_map::FastMap;
use crate::policy::{ConsumerTags, PolicyChain, PolicyContext, PolicyError};
use crate::tls::{CertificateError, CertificateSet};
use crate::upstream::UpstreamPool;

/// Used when an API leaves its timeouts at 0.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("snapshot is invalid: {}", join(.0))]
    Invalid(Vec<sluice_proto::Violation>),
    #[error("upstream `{upstream}`: {reason}")]
    Upstream { upstream: String, reason: String },
    #[error("API `{api}` refers to upstream `{upstream}`, which the snapshot does not define")]
    MissingUpstream { api: String, upstream: String },
    #[error("route conflict on `{route}`: {detail}")]
    RouteConflict { route: String, detail: String },
    #[error("API `{api}`: {source}")]
    Policy { api: String, source: PolicyError },
    #[error(transparent)]
    Certificate(#[from] CertificateError),
}

fn join(violations: &[sluice_proto::Violation]) -> String {
    violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// An API's runtime settings, shared by every request it serves.
#[derive(Debug)]
pub struct CompiledApi {
    pub name: String,
    /// The path prefix without a trailing slash ("" for "/"), removed when `strip_prefix` is set.
    pub prefix: String,
    pub strip_prefix: bool,
    pub preserve_host: bool,
    /// Forward the client's path as sent, not its canonical form (see `sluice_proto::path`).
    pub forward_raw_path: bool,
    /// Tunnel a client's `Upgrade: h2c` to the upstream instead of dropping it.
    pub allow_h2c_upgrade: bool,
    pub upstream: Arc<UpstreamPool>,
    /// Time allowed to open a connection to a target.
    pub connect_timeout: Duration,
    /// Time allowed until the upstream's response headers arrive.
    pub request_timeout: Duration,
    pub retries: u32,
    /// The API's policies, run between route match and upstream pick.
    pub policies: PolicyChain,
    /// Carried over per API name, like policy state: the handles it has
    /// resolved stay resolved, so no request after a swap pays the registry
    /// lookups again.
    pub metrics: Arc<RequestMetrics>,
}

/// The compiled form of one snapshot. Immutable once built; requests hold an
/// `Arc` to the table they started with until they finish.
#[derive(Debug)]
pub struct RoutingTable {
    pub version: u64,
    pub hash: String,
    /// Shared with the next table when its routes are the same (see [`route_digest`]).
    matcher: Arc<matcher::Matcher>,
    route_digest: RouteDigest,
    apis: Vec<Arc<CompiledApi>>,
    upstreams: HashMap<String, Arc<UpstreamPool>>,
    /// The configured consumers, kept to tell which ones a swap removed.
    consumers: Arc<ConsumerTags>,
    /// Served by SNI on the HTTPS listener, looked up per handshake.
    certificates: CertificateSet,
}

impl RoutingTable {
    /// Finds the API serving a request. `host` is the Host header or URI authority.
    pub fn route(&self, host: Option<&str>, path: &str, method: &Method) -> Result<&Arc<CompiledApi>, RouteMiss> {
        let index = self.matcher.lookup(host, path, method)?;
        self.apis.get(index).ok_or(RouteMiss::NotFound)
    }

    pub fn apis(&self) -> &[Arc<CompiledApi>] {
        &self.apis
    }

    pub fn upstream(&self, name: &str) -> Option<&Arc<UpstreamPool>> {
        self.upstreams.get(name)
    }

    /// Every upstream pool, in no particular order.
    pub fn upstreams(&self) -> impl Iterator<Item = &Arc<UpstreamPool>> {
        self.upstreams.values()
    }

    pub fn certificates(&self) -> &CertificateSet {
        &self.certificates
    }
}

/// Compiles a snapshot. Upstream pools whose definition is unchanged since
/// `previous` are carried over with their connections, health and counters.
/// Policy state (rate-limit buckets, validators) and request metrics are
/// carried over per API name.
pub fn compile(
    snapshot: &v1::Snapshot,
    previous: Option<&RoutingTable>,
    ctx: &PolicyContext,
) -> Result<RoutingTable, CompileError> {
    sluice_proto::validate(snapshot).map_err(CompileError::Invalid)?;

    // Before the upstreams: an upstream may present one as its client certificate.
    let certificates = CertificateSet::compile(&snapshot.certificates, previous.map(|p| &p.certificates))?;
    let mut upstreams = HashMap::with_capacity(snapshot.upstreams.len());
    for spec in &snapshot.upstreams {
        let old = previous.and_then(|p| p.upstreams.get(&spec.name));
        let pool = UpstreamPool::build(spec, &certificates, old)
            .map_err(|reason| CompileError::Upstream { upstream: spec.name.clone(), reason })?;
        upstreams.insert(spec.name.clone(), pool);
    }

    let previous_apis: FastMap<&str, &CompiledApi> =
        previous.map(|p| p.apis.iter().map(|a| (a.name.as_str(), a.as_ref())).collect()).unwrap_or_default();
    let consumers = Arc::new(ConsumerTags::new(&snapshot.consumers));
    let mut apis = Vec::with_capacity(snapshot.apis.len());
    for api in &snapshot.apis {
        let old = previous_apis.get(api.name.as_str());
        let old_policies = old.map(|a| &a.policies);
        let policies = PolicyChain::compile(api, snapshot, &consumers, old_policies, ctx)
            .map_err(|source| CompileError::Policy { api: api.name.clone(), source })?;
        let upstream = upstreams
            .get(&api.upstream)
            .cloned()
            .ok_or_else(|| CompileError::MissingUpstream { api: api.name.clone(), upstream: api.upstream.clone() })?;
        apis.push(Arc::new(CompiledApi {
            name: api.name.clone(),
            prefix: api.path_prefix.trim_end_matches('/').to_string(),
            strip_prefix: api.strip_prefix,
            preserve_host: api.preserve_host,
            forward_raw_path: api.forward_raw_path,
            allow_h2c_upgrade: api.allow_h2c_upgrade,
            connect_timeout: millis_or(api.connect_timeout_ms, DEFAULT_CONNECT_TIMEOUT),
            upstream,
            request_timeout: millis_or(api.request_timeout_ms, DEFAULT_REQUEST_TIMEOUT),
            retries: api.retries,
            policies,
            metrics: match old {
                Some(old) => old.metrics.clone(),
                None => Arc::new(RequestMetrics::new(api.name.as_str().into())),
            },
        }));
    }

    let route_digest = route_digest(&snapshot.apis);
    let matcher = match previous.filter(|p| p.route_digest == route_digest) {
        Some(previous) => previous.matcher.clone(),
        None => {
            let matcher = matcher::Matcher::from_apis(&snapshot.apis)
                .map_err(|c| CompileError::RouteConflict { route: c.route, detail: c.detail })?;
            Arc::new(matcher)
        }
    };

    let hash = if snapshot.hash.is_empty() { sluice_proto::content_hash(snapshot) } else { snapshot.hash.clone() };
    Ok(RoutingTable {
        version: snapshot.version,
        hash,
        matcher,
        route_digest,
        apis,
        upstreams,
        consumers,
        certificates,
    })
}

type RouteDigest = [u8; 32];

/// SHA-256 over what the matcher is built from: each API's hosts, prefix,
/// paths and methods, in table order (the matcher answers with positions).
/// Most snapshots change policies or upstreams, not routes; then the new table
/// shares the old matcher instead of building and freeing one, a large part
/// of a swap's work when there are many APIs. A cryptographic digest, so
/// that two different route sets never pass for the same.
fn route_digest(apis: &[v1::Api]) -> RouteDigest {
    fn field(digest: &mut Sha256, bytes: &[u8]) {
        digest.update((bytes.len() as u64).to_le_bytes());
        digest.update(bytes);
    }
    fn list(digest: &mut Sha256, items: &[String]) {
        digest.update((items.len() as u64).to_le_bytes());
        for item in items {
            field(digest, item.as_bytes());
        }
    }
    let mut digest = Sha256::new();
    digest.update((apis.len() as u64).to_le_bytes());
    for api in apis {
        list(&mut digest, &api.hosts);
        field(&mut digest, api.path_prefix.as_bytes());
        list(&mut digest, &api.paths);
        list(&mut digest, &api.methods);
    }
    digest.finalize().into()
}

fn millis_or(ms: u64, default: Duration) -> Duration {
    if ms == 0 { default } else { Duration::from_millis(ms) }
}

/// What [`TableStore::apply`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApplyOutcome {
    /// The table already serves a snapshot with this hash; nothing was done.
    Unchanged,
    Swapped {
        version: u64,
        compile_time: Duration,
    },
}

/// Holds the current routing table. Readers call [`TableStore::load`] once per
/// request; a swap never blocks them and never shows them a half-built table.
#[derive(Debug, Default)]
pub struct TableStore {
    current: ArcSwapOption<RoutingTable>,
    /// What every compile needs from the process (Redis for rate limits).
    context: PolicyContext,
    /// Serializes writers so two applies cannot both compile against the same
    /// previous table and lose one's carried-over state.
    apply_lock: Mutex<()>,
}

impl TableStore {
    /// Node-local policy state (no Redis).
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_context(context: PolicyContext) -> Self {
        TableStore { context, ..Self::default() }
    }

    pub fn load(&self) -> Option<Arc<RoutingTable>> {
        self.current.load_full()
    }

    /// Ready once any table is applied.
    pub fn is_ready(&self) -> bool {
        self.current.load().is_some()
    }

    /// Compiles `snapshot` and swaps it in, unless its hash is already served.
    /// On error the current table stays.
    pub fn apply(&self, snapshot: &v1::Snapshot) -> Result<ApplyOutcome, CompileError> {
        let _writer = self.apply_lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let previous = self.load();
        let hash = if snapshot.hash.is_empty() { sluice_proto::content_hash(snapshot) } else { snapshot.hash.clone() };
        if previous.as_ref().is_some_and(|p| p.hash == hash) {
            return Ok(ApplyOutcome::Unchanged);
        }
        let started = Instant::now();
        let mut table = compile(snapshot, previous.as_deref(), &self.context)?;
        table.hash = hash;
        let compile_time = started.elapsed();
        let version = table.version;
        let table = Arc::new(table);
        self.current.store(Some(table.clone()));
        if let Some(previous) = previous {
            forget_removed(&previous, &table);
            retire(previous);
        }
        Ok(ApplyOutcome::Swapped { version, compile_time })
    }
}

/// Drops the metric series of the APIs, upstreams, targets and consumers
/// `previous` had and `next` has not, so that `/metrics` shows only what is
/// configured (and a name that comes back starts its series at zero).
/// Series are matched by label name and value: an upstream and an API of the
/// same name are told apart, and a target only goes with its upstream.
///
/// After the store, so no new request resolves a handle of what left. A
/// request still on `previous` keeps its resolved handles (their counts are
/// no longer rendered); one that registers a series anew after this point
/// (a policy refusal is counted through the registry) brings that one
/// series back until the name is removed again: rare, and bounded by the
/// requests in flight at the swap.
fn forget_removed(previous: &RoutingTable, next: &RoutingTable) {
    let kept_apis: HashSet<&str> = next.apis.iter().map(|api| api.name.as_str()).collect();
    let apis: HashSet<&str> =
        previous.apis.iter().map(|api| api.name.as_str()).filter(|name| !kept_apis.contains(name)).collect();
    let upstreams: HashSet<&str> =
        previous.upstreams.keys().map(String::as_str).filter(|name| !next.upstreams.contains_key(*name)).collect();
    let mut targets: HashSet<(&str, &str)> = HashSet::new();
    for (name, pool) in &previous.upstreams {
        let Some(kept) = next.upstreams.get(name).filter(|kept| !Arc::ptr_eq(kept, pool)) else { continue };
        for target in pool.targets() {
            if !kept.targets().iter().any(|t| t.url == target.url) {
                targets.insert((name.as_str(), target.url.as_str()));
            }
        }
    }
    let consumers: HashSet<&str> = previous.consumers.names().filter(|name| !next.consumers.contains(name)).collect();
    if apis.is_empty() && upstreams.is_empty() && targets.is_empty() && consumers.is_empty() {
        return;
    }
    MetricRegistry::forget_installed(|key| {
        let label = |name: &str| key.labels().find(|l| l.key() == name).map(|l| l.value());
        label("api").is_some_and(|api| apis.contains(api))
            || label("consumer").is_some_and(|consumer| consumers.contains(consumer))
            || label("upstream").is_some_and(|upstream| {
                upstreams.contains(upstream) || label("target").is_some_and(|t| targets.contains(&(upstream, t)))
            })
    });
}

/// How often a replaced table is first checked for requests still on it.
const RETIRE_POLL: Duration = Duration::from_millis(20);

/// Frees a replaced table once no request holds it any more, on the runtime
/// that applied the snapshot (the control runtime), not on a proxy worker:
/// freeing a large table takes a while, and the last request to let go of
/// the table would pay for it with every connection of its worker waiting.
/// Outside a runtime (unit tests) the table is simply dropped.
fn retire(table: Arc<RoutingTable>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    runtime.spawn(async move {
        // Out of the store, the table gains no new holders: the count only falls.
        let mut wait = RETIRE_POLL;
        while Arc::strong_count(&table) > 1 {
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(1));
        }
        drop(table);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(name: &str, url: &str) -> v1::Upstream {
        v1::Upstream {
            name: name.into(),
            targets: vec![v1::Target { url: url.into(), weight: 1 }],
            ..Default::default()
        }
    }

    fn api(name: &str, prefix: &str, upstream: &str) -> v1::Api {
        v1::Api { name: name.into(), path_prefix: prefix.into(), upstream: upstream.into(), ..Default::default() }
    }

    fn snapshot(apis: Vec<v1::Api>, upstreams: Vec<v1::Upstream>) -> v1::Snapshot {
        v1::Snapshot { version: 1, apis, upstreams, ..Default::default() }
    }

    #[test]
    fn compile_errors_table() {
        let ok_up = || upstream("u", "http://127.0.0.1:9");
        let cases: Vec<(&str, v1::Snapshot, &str)> = vec![
            (
                "missing upstream",
                snapshot(vec![api("a", "/", "nope")], vec![ok_up()]),
                "upstream `nope` does not exist",
            ),
            ("bad prefix", snapshot(vec![api("a", "shop", "u")], vec![ok_up()]), "must start with `/`"),
            (
                "bad certificate",
                v1::Snapshot {
                    certificates: vec![v1::Certificate {
                        name: "site".into(),
                        chain_pem: "junk".into(),
                        private_key_pem: "junk".into(),
                        ..Default::default()
                    }],
                    ..snapshot(vec![api("a", "/", "u")], vec![ok_up()])
                },
                "certificate `site`: the chain holds no CERTIFICATE block",
            ),
            (
                "bad CA bundle",
                snapshot(
                    vec![api("a", "/", "u")],
                    vec![v1::Upstream {
                        tls: Some(v1::UpstreamTls { ca_bundle_pem: "junk".into(), ..Default::default() }),
                        ..upstream("u", "https://example.com")
                    }],
                ),
                "upstream `u`: tls.ca_bundle_pem",
            ),
            (
                "overlap",
                snapshot(vec![api("a", "/x", "u"), api("b", "/x/", "u")], vec![ok_up()]),
                "already routes host",
            ),
            (
                "template conflict",
                snapshot(
                    vec![
                        v1::Api { paths: vec!["/x/{id}".into()], ..api("a", "/x", "u") },
                        v1::Api { paths: vec!["/x/{sku}".into()], ..api("b", "/x", "u") },
                    ],
                    vec![ok_up()],
                ),
                "route conflict on `/x/{sku}`",
            ),
            ("no targets", snapshot(vec![], vec![v1::Upstream { name: "u".into(), ..Default::default() }]), "target"),
        ];
        for (name, snapshot, want) in cases {
            match compile(&snapshot, None, &PolicyContext::local()) {
                Ok(_) => panic!("{name}: compiled"),
                Err(e) => assert!(e.to_string().contains(want), "{name}: {e}"),
            }
        }
    }

    #[test]
    fn compiles_and_routes() {
        let s = snapshot(
            vec![
                v1::Api { strip_prefix: true, request_timeout_ms: 1500, ..api("shop", "/shop/", "u") },
                api("root", "/", "u"),
            ],
            vec![upstream("u", "http://127.0.0.1:9")],
        );
        let table = compile(&s, None, &PolicyContext::local()).unwrap();
        let shop = table.route(Some("x"), "/shop/a", &Method::GET).unwrap();
        assert_eq!((shop.name.as_str(), shop.prefix.as_str()), ("shop", "/shop"));
        assert_eq!(shop.request_timeout, Duration::from_millis(1500));
        assert_eq!(table.route(None, "/other", &Method::GET).unwrap().name, "root");
        assert_eq!(table.hash, sluice_proto::content_hash(&s));
    }

    #[test]
    fn store_swaps_skips_same_hash_and_keeps_old_on_error() {
        let store = TableStore::new();
        assert!(!store.is_ready());
        let mut s = snapshot(vec![api("a", "/", "u")], vec![upstream("u", "http://127.0.0.1:9")]);
        assert!(matches!(store.apply(&s).unwrap(), ApplyOutcome::Swapped { version: 1, .. }));
        assert!(store.is_ready());
        let first = store.load().unwrap();
        s.version = 2;
        assert_eq!(store.apply(&s).unwrap(), ApplyOutcome::Unchanged);

        // A changed API keeps the unchanged upstream pool ...
        s.version = 3;
        s.apis[0].strip_prefix = true;
        assert!(matches!(store.apply(&s).unwrap(), ApplyOutcome::Swapped { version: 3, .. }));
        let second = store.load().unwrap();
        assert!(Arc::ptr_eq(first.upstream("u").unwrap(), second.upstream("u").unwrap()));
        // ... and the API its resolved metric handles.
        assert!(Arc::ptr_eq(&first.apis()[0].metrics, &second.apis()[0].metrics));

        let mut bad = s.clone();
        bad.version = 4;
        bad.apis[0].upstream = "missing".into();
        assert!(store.apply(&bad).is_err());
        assert_eq!(store.load().unwrap().version, 3);
    }

    #[test]
    fn a_table_shares_the_matcher_only_while_the_routes_are_the_same() {
        let store = TableStore::new();
        let mut s = snapshot(
            vec![api("a", "/a", "u"), v1::Api { methods: vec!["GET".into()], ..api("b", "/b", "u") }],
            vec![upstream("u", "http://127.0.0.1:9")],
        );
        store.apply(&s).unwrap();
        let first = store.load().unwrap();

        s.version = 2;
        s.apis[0].strip_prefix = true;
        store.apply(&s).unwrap();
        let second = store.load().unwrap();
        assert!(Arc::ptr_eq(&first.matcher, &second.matcher));
        assert!(second.route(None, "/a/x", &Method::GET).unwrap().strip_prefix);

        // Each part of a route, changed alone, builds a new matcher that routes by it.
        type Change = fn(&mut v1::Snapshot);
        let changes: [(&str, Change); 4] = [
            ("prefix", |s| s.apis[0].path_prefix = "/c".into()),
            ("method", |s| s.apis[1].methods = vec!["POST".into()]),
            ("host", |s| s.apis[0].hosts = vec!["example.com".into()]),
            ("paths", |s| s.apis[1].paths = vec!["/b/items".into()]),
        ];
        let mut previous = second;
        for (version, (what, change)) in (3..).zip(changes) {
            s.version = version;
            change(&mut s);
            store.apply(&s).unwrap();
            let table = store.load().unwrap();
            assert!(!Arc::ptr_eq(&previous.matcher, &table.matcher), "{what}: matcher shared");
            previous = table;
        }
        let table = previous;
        assert_eq!(table.route(None, "/a/x", &Method::GET).unwrap_err(), RouteMiss::NotFound);
        assert_eq!(table.route(Some("example.com"), "/c/x", &Method::GET).unwrap().name, "a");
        assert_eq!(table.route(None, "/c/x", &Method::GET).unwrap_err(), RouteMiss::NotFound);
        assert_eq!(table.route(None, "/b/items", &Method::POST).unwrap().name, "b");
        assert!(table.route(None, "/b/items", &Method::GET).is_err());
        assert_eq!(table.route(None, "/b/other", &Method::POST).unwrap_err(), RouteMiss::NotFound);
    }

    #[tokio::test]
    async fn a_replaced_table_lives_while_a_request_holds_it_then_is_freed() {
        let store = TableStore::new();
        let mut s = snapshot(vec![api("a", "/", "u")], vec![upstream("u", "http://127.0.0.1:9")]);
        store.apply(&s).unwrap();
        let in_flight = store.load().unwrap();
        let replaced = Arc::downgrade(&in_flight);
        s.version = 2;
        s.apis[0].strip_prefix = true;
        store.apply(&s).unwrap();

        // A few polls later the retiring task still holds the table beside the
        // request, so the request letting go does not free it on its worker.
        tokio::time::sleep(RETIRE_POLL * 3).await;
        assert_eq!(replaced.strong_count(), 2, "the retiring task let go of a table a request still holds");
        drop(in_flight);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while replaced.strong_count() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(RETIRE_POLL).await;
        }
        assert_eq!(replaced.strong_count(), 0, "the replaced table is freed once nobody holds it");
        assert_eq!(store.load().unwrap().version, 2);
    }
}
