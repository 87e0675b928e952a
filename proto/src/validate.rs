//! Structural validation of a snapshot, run by the control plane before it
//! commits a change and by the data plane before it compiles one: names are
//! unique, references resolve, values are in range. Every violation is
//! reported, each with the path of the offending field, so that an operator
//! fixes them all in one go.

use std::borrow::Cow;
use std::fmt;

use crate::Cidr;
use crate::path;
use crate::v1::{
    Api, Balance, Certificate, Consumer, HashSource, HeaderRules, Policy, RateLimitKey, Snapshot, Upstream,
    policy::Kind,
};

// The control plane validates every write and a data plane every snapshot,
// each over all names and routes: with many APIs the default SipHash is a
// large part of that cost, and these keys come from the operator, not clients.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// One problem in a snapshot. `path` is a JSON-pointer-like path whose list
/// elements are addressed by name, e.g. `/apis/shop/upstream`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub path: String,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Longest name of an API, upstream, consumer, spec or certificate.
pub const MAX_NAME_LEN: usize = 128;
/// The alphabet of names, as the admin API's OpenAPI document publishes it (`check_name` is the rule).
pub const NAME_PATTERN: &str = "^[A-Za-z0-9._@-]+$";
const METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"];
const JWT_ALGORITHMS: &[&str] =
    &["HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA"];

/// Checks the whole snapshot; returns every violation found.
pub fn validate(snapshot: &Snapshot) -> Result<(), Vec<Violation>> {
    let mut v = Violations::default();
    let upstreams = unique_names(&mut v, "upstreams", snapshot.upstreams.iter().map(|u| u.name.as_str()));
    let specs = unique_names(&mut v, "specs", snapshot.specs.iter().map(|s| s.name.as_str()));
    let certificates = unique_names(&mut v, "certificates", snapshot.certificates.iter().map(|c| c.name.as_str()));
    unique_names(&mut v, "consumers", snapshot.consumers.iter().map(|c| c.username.as_str()));
    unique_names(&mut v, "apis", snapshot.apis.iter().map(|a| a.name.as_str()));

    for api in &snapshot.apis {
        check_api(&mut v, api, &upstreams, &specs);
    }
    check_route_overlap(&mut v, &snapshot.apis);
    for upstream in &snapshot.upstreams {
        check_upstream(&mut v, upstream, &certificates);
    }
    check_consumers(&mut v, &snapshot.consumers);
    for spec in &snapshot.specs {
        if spec.json.trim().is_empty() {
            v.push(format!("/specs/{}/content", spec.name), "must not be empty");
        }
    }
    check_certificates(&mut v, &snapshot.certificates);

    if v.0.is_empty() { Ok(()) } else { Err(v.0) }
}

#[derive(Default)]
struct Violations(Vec<Violation>);

impl Violations {
    fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(Violation { path: path.into(), message: message.into() });
    }
}

fn unique_names<'a>(v: &mut Violations, kind: &str, names: impl Iterator<Item = &'a str>) -> HashSet<&'a str> {
    let mut seen = HashSet::with_capacity_and_hasher(names.size_hint().0, Default::default());
    for name in names {
        if let Err(message) = check_name(name) {
            v.push(format!("/{kind}/{name}/name"), message);
        }
        if !seen.insert(name) {
            v.push(format!("/{kind}/{name}/name"), format!("the name `{name}` is used twice"));
        }
    }
    seen
}

/// Names appear in URLs and metrics labels, so they are kept to a safe alphabet.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!("must be at most {MAX_NAME_LEN} characters"));
    }
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@')) {
        return Err("may contain only letters, digits, '-', '_', '.' and '@'".into());
    }
    Ok(())
}

fn check_api(v: &mut Violations, api: &Api, upstreams: &HashSet<&str>, specs: &HashSet<&str>) {
    let at = |field: &str| format!("/apis/{}/{field}", api.name);
    for (i, host) in api.hosts.iter().enumerate() {
        if let Err(message) = check_host(host) {
            v.push(format!("{}/{i}", at("hosts")), message);
        }
    }
    if let Err(message) = check_path(&api.path_prefix, false)
        .and_then(|()| check_route_path(&api.path_prefix))
        .and_then(|()| path::check_canonical(&api.path_prefix))
    {
        v.push(at("path_prefix"), message);
    }
    if api.forward_raw_path && api.strip_prefix {
        v.push(at("forward_raw_path"), "cannot be combined with strip_prefix, which rewrites the canonical path");
    }
    for (i, path) in api.paths.iter().enumerate() {
        if let Err(message) =
            check_path(path, true).and_then(|()| check_route_path(path)).and_then(|()| path::check_canonical(path))
        {
            v.push(format!("{}/{i}", at("paths")), message);
        } else if !path.starts_with(api.path_prefix.trim_end_matches('/')) {
            v.push(format!("{}/{i}", at("paths")), format!("must lie under path_prefix `{}`", api.path_prefix));
        }
    }
    for (i, method) in api.methods.iter().enumerate() {
        if !METHODS.contains(&method.as_str()) {
            v.push(format!("{}/{i}", at("methods")), format!("`{method}` is not an HTTP method (use upper case)"));
        }
    }
    if api.upstream.is_empty() {
        v.push(at("upstream"), "is required");
    } else if !upstreams.contains(api.upstream.as_str()) {
        v.push(at("upstream"), format!("upstream `{}` does not exist", api.upstream));
    }
    if let Some(binding) = &api.openapi
        && !specs.contains(binding.spec.as_str())
    {
        v.push(at("openapi/spec"), format!("spec `{}` does not exist", binding.spec));
    }
    let mut kinds = HashSet::default();
    for (i, policy) in api.policies.iter().enumerate() {
        let path = format!("{}/{i}", at("policies"));
        match &policy.kind {
            None => v.push(path, "names no policy"),
            Some(kind) => {
                let name = policy_name(kind);
                if !kinds.insert(name) {
                    v.push(path.clone(), format!("`{name}` appears twice; merge them into one"));
                }
                check_policy(v, &format!("{path}/{name}"), policy);
            }
        }
    }
}

/// The user-facing name of a policy, as written in the declarative config.
pub fn policy_name(kind: &Kind) -> &'static str {
    match kind {
        Kind::BasicAuth(_) => "basic_auth",
        Kind::ApiKey(_) => "api_key",
        Kind::Jwt(_) => "jwt",
        Kind::RateLimit(_) => "rate_limit",
        Kind::Cors(_) => "cors",
        Kind::Headers(_) => "headers",
        Kind::IpRestriction(_) => "ip_restriction",
        Kind::RequestSizeLimit(_) => "request_size_limit",
    }
}

fn check_policy(v: &mut Violations, at: &str, policy: &Policy) {
    match &policy.kind {
        Some(Kind::ApiKey(p)) if p.header.is_empty() && p.query_param.is_empty() => {
            v.push(at, "needs a header or a query_param to read the key from");
        }
        Some(Kind::Jwt(p)) => {
            for (i, alg) in p.algorithms.iter().enumerate() {
                if !JWT_ALGORITHMS.contains(&alg.as_str()) {
                    v.push(format!("{at}/algorithms/{i}"), format!("unsupported algorithm `{alg}`"));
                }
            }
            if !p.jwks_url.is_empty() {
                if !p.jwks.trim().is_empty() {
                    v.push(format!("{at}/jwks_url"), "cannot be combined with `jwks`: give the document or its URL");
                }
                if let Err(message) = check_jwks_url(&p.jwks_url) {
                    v.push(format!("{at}/jwks_url"), message);
                }
            }
        }
        Some(Kind::RateLimit(p)) => {
            if p.requests == 0 {
                v.push(format!("{at}/requests"), "must be at least 1");
            }
            if p.period_seconds == 0 {
                v.push(format!("{at}/per"), "must be at least one second");
            }
            if p.key() == RateLimitKey::Header && p.header.is_empty() {
                v.push(format!("{at}/header"), "is required when key is `header`");
            }
        }
        Some(Kind::Cors(p)) if p.allow_origins.is_empty() => {
            v.push(format!("{at}/allow_origins"), "must list at least one origin (or \"*\")");
        }
        // Any origin with credentials would let every site read the user's
        // authenticated responses (browsers refuse `*` with credentials, so the
        // origin would have to be reflected): name the origins instead.
        Some(Kind::Cors(p)) if p.allow_credentials && p.allow_origins.iter().any(|o| o.trim() == "*") => {
            v.push(
                format!("{at}/allow_credentials"),
                "cannot be true while allow_origins contains \"*\"; list the trusted origins instead",
            );
        }
        Some(Kind::IpRestriction(p)) => {
            if p.allow.is_empty() && p.deny.is_empty() {
                v.push(at, "needs an allow or a deny list");
            }
            for (list, entries) in [("allow", &p.allow), ("deny", &p.deny)] {
                for (i, cidr) in entries.iter().enumerate() {
                    if let Err(e) = cidr.parse::<Cidr>() {
                        v.push(format!("{at}/{list}/{i}"), e.to_string());
                    }
                }
            }
        }
        Some(Kind::RequestSizeLimit(p)) if p.max_bytes == 0 => {
            v.push(format!("{at}/max_bytes"), "must be at least 1");
        }
        Some(Kind::Headers(p)) => {
            for (side, rules) in [("request", &p.request), ("response", &p.response)] {
                if let Some(rules) = rules {
                    check_header_rules(v, &format!("{at}/{side}"), rules);
                }
            }
        }
        _ => {}
    }
    check_policy_text(v, at, policy);
}

/// The header names and values of a `headers` policy, each at its own path (`/set/x-a`, `/rename/x-old`).
fn check_header_rules(v: &mut Violations, at: &str, rules: &HeaderRules) {
    for (list, headers) in [("set", &rules.set), ("add", &rules.add)] {
        for h in headers {
            let at = format!("{at}/{list}/{}", pointer_token(&h.name));
            if let Err(message) = check_header_name(&h.name) {
                v.push(at.clone(), message);
            }
            if let Err(message) = check_header_value(&h.value) {
                v.push(at, message);
            }
        }
    }
    for (i, name) in rules.remove.iter().enumerate() {
        if let Err(message) = check_header_name(name) {
            v.push(format!("{at}/remove/{i}"), message);
        }
    }
    for rename in &rules.rename {
        let at = format!("{at}/rename/{}", pointer_token(&rename.from));
        for name in [&rename.from, &rename.to] {
            if let Err(message) = check_header_name(name) {
                v.push(at.clone(), message);
            }
        }
    }
}

/// Policy fields that the data plane puts into a header name or value (a key's header, the `WWW-Authenticate`
/// challenge's realm and query parameter, a rate-limit bucket's header) or compares with what a client sent (JWT
/// issuer, audiences and claim names): a value the data plane cannot use there is refused here, not NACKed later.
fn check_policy_text(v: &mut Violations, at: &str, policy: &Policy) {
    let mut header_name = |field: &str, name: &str| {
        if !name.is_empty()
            && let Err(message) = check_header_name(name)
        {
            v.0.push(Violation { path: format!("{at}/{field}"), message });
        }
    };
    match &policy.kind {
        Some(Kind::ApiKey(p)) => header_name("header", &p.header),
        // The data plane trims the header name of a rate limit before parsing it.
        Some(Kind::RateLimit(p)) => header_name("header", p.header.trim()),
        _ => {}
    }
    // Sent in the `WWW-Authenticate` challenge.
    let in_header = match &policy.kind {
        Some(Kind::BasicAuth(p)) => Some(("realm", p.realm.as_str())),
        Some(Kind::ApiKey(p)) => Some(("query_param", p.query_param.as_str())),
        _ => None,
    };
    if let Some((field, text)) = in_header
        && let Err(message) = check_header_value(text)
    {
        v.push(format!("{at}/{field}"), message);
    }
    if let Some(Kind::Jwt(p)) = &policy.kind {
        let texts = [("issuer".to_string(), &p.issuer), ("key_claim".into(), &p.key_claim)]
            .into_iter()
            .chain([("consumer_claim".to_string(), &p.consumer_claim)])
            .chain(p.audiences.iter().enumerate().map(|(i, a)| (format!("audiences/{i}"), a)));
        for (field, text) in texts {
            if let Err(message) = check_no_control(text) {
                v.push(format!("{at}/{field}"), message);
            }
        }
    }
}

/// A header name the data plane sets, reads or hashes on (also a cookie name, RFC 6265's `token`): parsed by the
/// same `http::HeaderName` the data plane compiles it with, so `x-ü😀` or a NUL is refused at write time.
pub fn check_header_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    http::HeaderName::from_bytes(name.as_bytes()).map(drop).map_err(|_| {
        format!(
            "`{}` is not a valid header name: only ASCII letters, digits and !#$%&'*+-.^_`|~ are allowed",
            name.escape_debug()
        )
    })
}

/// Text the data plane sends in a header value: what `http::HeaderValue::from_str` accepts (no control characters
/// such as NUL, a line break or DEL; tabs are allowed).
pub fn check_header_value(value: &str) -> Result<(), String> {
    http::HeaderValue::from_str(value).map(drop).map_err(|_| {
        format!(
            "`{}` cannot be sent in an HTTP header: control characters (NUL, line breaks) are not allowed",
            value.escape_debug()
        )
    })
}

/// Text that names something to match or log (a JWT key id, a claim): no control characters.
pub fn check_no_control(text: &str) -> Result<(), String> {
    if text.chars().any(char::is_control) {
        return Err(format!("`{}` must not contain control characters (NUL, tabs, line breaks)", text.escape_debug()));
    }
    Ok(())
}

/// A route's prefix or path: a request target never carries control characters or white space, so a route that
/// holds one could never match.
pub fn check_route_path(path: &str) -> Result<(), String> {
    if path.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!(
            "`{}` must not contain white space or control characters; percent-encode them",
            path.escape_debug()
        ));
    }
    Ok(())
}

/// The path (and query) of a request the data plane builds itself, such as a health probe: what `http`'s URI
/// parser accepts, as the data plane parses `scheme://authority` + this.
pub fn check_request_target(target: &str) -> Result<(), String> {
    if !target.starts_with('/') {
        return Err("must start with `/`".into());
    }
    if target.contains('#') {
        return Err(format!("`{}` must not contain a fragment", target.escape_debug()));
    }
    target.parse::<http::uri::PathAndQuery>().map(drop).map_err(|_| {
        format!("`{}` is not a valid request path: percent-encode spaces and control characters", target.escape_debug())
    })
}

/// `tls.sni`: what rustls accepts as the server name it sends and verifies, as the data plane parses it.
pub fn check_server_name(sni: &str) -> Result<(), String> {
    rustls_pki_types::ServerName::try_from(sni)
        .map(drop)
        .map_err(|_| format!("`{}` is not a valid DNS name or IP address", sni.escape_debug()))
}

/// JSON pointer escaping of one reference token (RFC 6901).
fn pointer_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

fn check_host(host: &str) -> Result<(), String> {
    let bare = host.strip_prefix("*.").unwrap_or(host);
    if bare.is_empty() || bare.contains('*') {
        return Err(format!("`{host}`: a wildcard is allowed only as a leading `*.`"));
    }
    if host.contains("://") || host.contains('/') {
        return Err(format!("`{host}` must be a host name, without scheme or path"));
    }
    if !bare.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':' | '[' | ']')) {
        return Err(format!("`{host}` is not a valid host name"));
    }
    if bare.ends_with('.') {
        // Requests are routed by the host without its trailing dot.
        return Err(format!("`{host}`: write the host without its trailing dot"));
    }
    Ok(())
}

fn check_path(path: &str, templates: bool) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!("`{path}` must start with `/`"));
    }
    if path.contains(['?', '#']) {
        return Err(format!("`{path}` must not contain a query or fragment"));
    }
    let mut depth = 0;
    for c in path.chars() {
        match c {
            '{' if templates && depth == 0 => depth = 1,
            '}' if templates && depth == 1 => depth = 0,
            '{' | '}' if templates => return Err(format!("`{path}` has unbalanced braces")),
            '{' | '}' => return Err(format!("`{path}`: templates are allowed only in `paths`")),
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("`{path}` has unbalanced braces"));
    }
    Ok(())
}

/// Two APIs that claim the same host, prefix and method with no narrower
/// `paths` would make routing depend on row order; reject that instead.
fn check_route_overlap(v: &mut Violations, apis: &[Api]) {
    let mut claimed: HashMap<(Cow<'_, str>, &str, &str), &str> =
        HashMap::with_capacity_and_hasher(apis.len(), Default::default());
    for api in apis.iter().filter(|a| a.paths.is_empty()) {
        let prefix = api.path_prefix.trim_end_matches('/');
        for h in 0..api.hosts.len().max(1) {
            let host = nth_or_any(&api.hosts, h);
            // Hosts arrive lowercase from the control plane: copy only one that is not.
            let host_key = if host.bytes().any(|b| b.is_ascii_uppercase()) {
                Cow::Owned(host.to_ascii_lowercase())
            } else {
                Cow::Borrowed(host)
            };
            for m in 0..api.methods.len().max(1) {
                let method = nth_or_any(&api.methods, m);
                if let Some(other) = claimed.insert((host_key.clone(), prefix, method), &api.name)
                    && other != api.name
                {
                    v.push(
                        format!("/apis/{}/path_prefix", api.name),
                        format!(
                            "API `{other}` already routes host `{host}`, prefix `{}`, method `{method}`",
                            api.path_prefix
                        ),
                    );
                }
            }
        }
    }
}

/// The `i`th host or method of a route; a route that lists none claims `*`, any.
fn nth_or_any(items: &[String], i: usize) -> &str {
    items.get(i).map_or("*", String::as_str)
}

fn check_upstream(v: &mut Violations, upstream: &Upstream, certificates: &HashSet<&str>) {
    let at = |field: &str| format!("/upstreams/{}/{field}", upstream.name);
    if upstream.targets.is_empty() {
        v.push(at("targets"), "needs at least one target");
    }
    for (i, target) in upstream.targets.iter().enumerate() {
        if let Err(message) = check_target_url(&target.url) {
            v.push(format!("{}/{i}/url", at("targets")), message);
        }
        if target.weight > 10_000 {
            v.push(format!("{}/{i}/weight", at("targets")), "must be at most 10000");
        }
    }
    if upstream.balance() == Balance::ConsistentHash {
        let hash_on = upstream.hash_on.clone().unwrap_or_default();
        if hash_on.source() != HashSource::ClientIp && hash_on.name.is_empty() {
            v.push(at("hash_on/name"), "is required when hashing on a header or cookie");
        }
    }
    if let Some(hash_on) = &upstream.hash_on
        && !hash_on.name.is_empty()
        && let Err(message) = check_header_name(&hash_on.name)
    {
        v.push(at("hash_on/name"), message);
    }
    if let Some(tls) = &upstream.tls
        && !tls.sni.is_empty()
        && let Err(message) = check_server_name(&tls.sni)
    {
        v.push(at("tls/sni"), message);
    }
    if let Some(check) = &upstream.health_check
        && !check.path.is_empty()
    {
        if let Err(message) = check_request_target(&check.path) {
            v.push(at("health_check/path"), message);
        }
        if check.interval_ms == 0 {
            v.push(at("health_check/interval"), "must be positive");
        }
        if check.timeout_ms == 0 {
            v.push(at("health_check/timeout"), "must be positive");
        }
        if check.healthy_threshold == 0 {
            v.push(at("health_check/healthy_threshold"), "must be at least 1");
        }
        if check.unhealthy_threshold == 0 {
            v.push(at("health_check/unhealthy_threshold"), "must be at least 1");
        }
    }
    if let Some(passive) = &upstream.passive_health_check {
        for (i, status) in passive.unhealthy_statuses.iter().enumerate() {
            if !(500..=599).contains(status) {
                v.push(at(&format!("passive_health_check/unhealthy_statuses/{i}")), "must be a 5xx status (500-599)");
            }
        }
    }
    if let Some(budget) = &upstream.retry_budget {
        if !(0.0..=1.0).contains(&budget.ratio) {
            v.push(at("retry_budget/ratio"), "must be between 0 and 1 (a share of the upstream's requests)");
        }
        if budget.min_retries_per_second > crate::MAX_MIN_RETRIES_PER_SECOND {
            v.push(
                at("retry_budget/min_retries_per_second"),
                format!("must be at most {}", crate::MAX_MIN_RETRIES_PER_SECOND),
            );
        }
    }
    if let Some(tls) = &upstream.tls
        && !tls.client_certificate.is_empty()
        && !certificates.contains(tls.client_certificate.as_str())
    {
        v.push(at("tls/client_certificate"), format!("certificate `{}` does not exist", tls.client_certificate));
    }
}

/// Where a data plane fetches an issuer's keys from: an absolute http(s) URL with a host and no credentials in it
/// (they would be logged and shown like any setting).
pub fn check_jwks_url(url: &str) -> Result<(), String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("`{}` is not a URL: {e}", url.escape_debug()))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(format!("`{url}` must start with https:// or http://"));
    }
    let authority = uri.authority().map(http::uri::Authority::as_str).unwrap_or_default();
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("`{url}` has no host"));
    }
    if authority.contains('@') {
        return Err(format!("`{url}` must not hold credentials"));
    }
    Ok(())
}

fn check_target_url(url: &str) -> Result<(), String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(format!("`{url}` must start with http:// or https://")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("`{url}` has no host"));
    }
    if uri.path_and_query().is_some_and(|p| p.as_str() != "/" && !p.as_str().is_empty()) {
        return Err(format!("`{url}` must be an origin (scheme, host, port) without a path"));
    }
    Ok(())
}

/// An API key as the snapshot carries it: its HMAC-SHA256 under the
/// snapshot's `api_key_hmac_key`, in hexadecimal (either case), never the key.
pub fn is_api_key_digest(digest: &str) -> bool {
    digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit())
}

fn check_consumers(v: &mut Violations, consumers: &[Consumer]) {
    // A key or JWT key id shared by two consumers would make the consumer
    // identity depend on lookup order, so each must be unique cluster-wide.
    let mut key_owner: HashMap<&str, &str> = HashMap::default();
    let mut jwt_owner: HashMap<&str, &str> = HashMap::default();
    for consumer in consumers {
        let at = |field: &str| format!("/consumers/{}/{field}", consumer.username);
        if !consumer.basic_auth_password_hash.is_empty()
            && let Err(message) = crate::password::check_password_hash(&consumer.basic_auth_password_hash)
        {
            v.push(at("basic_auth/password_hash"), message);
        }
        for (i, digest) in consumer.api_key_digests.iter().enumerate() {
            if !is_api_key_digest(digest) {
                v.push(format!("{}/{i}", at("api_keys")), "must be an HMAC-SHA256 digest: 64 hexadecimal digits");
            } else if let Some(other) = key_owner.insert(digest, &consumer.username) {
                v.push(
                    format!("{}/{i}", at("api_keys")),
                    format!("this API key is already used by consumer `{other}`"),
                );
            }
        }
        for (i, credential) in consumer.jwt_credentials.iter().enumerate() {
            let at = format!("{}/{i}", at("jwt"));
            if credential.key.is_empty() {
                v.push(format!("{at}/key"), "must not be empty");
            } else if let Err(message) = check_no_control(&credential.key) {
                v.push(format!("{at}/key"), message);
            } else if let Some(other) = jwt_owner.insert(&credential.key, &consumer.username) {
                v.push(
                    format!("{at}/key"),
                    format!("JWT key `{}` is already used by consumer `{other}`", credential.key),
                );
            }
            let alg = credential.algorithm.as_str();
            if !JWT_ALGORITHMS.contains(&alg) {
                v.push(format!("{at}/algorithm"), format!("unsupported algorithm `{alg}`"));
            } else if alg.starts_with("HS") && credential.secret.is_empty() {
                v.push(format!("{at}/secret"), format!("is required for {alg}"));
            } else if !alg.starts_with("HS") && credential.public_key_pem.is_empty() {
                v.push(format!("{at}/public_key"), format!("is required for {alg}"));
            }
        }
    }
}

fn check_certificates(v: &mut Violations, certificates: &[Certificate]) {
    let defaults: Vec<&str> = certificates.iter().filter(|c| c.default).map(|c| c.name.as_str()).collect();
    if defaults.len() > 1 {
        v.push("/certificates", format!("only one certificate may be the default, found {}", defaults.join(", ")));
    }
    for certificate in certificates {
        let at = |field: &str| format!("/certificates/{}/{field}", certificate.name);
        if certificate.chain_pem.is_empty() {
            v.push(at("chain"), "must not be empty");
        }
        if certificate.private_key_pem.is_empty() {
            v.push(at("key"), "must not be empty");
        }
        for (i, sni) in certificate.snis.iter().enumerate() {
            if let Err(message) = check_host(sni) {
                v.push(format!("{}/{i}", at("snis")), message);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{OpenApiBinding, RateLimit, Target};

    fn upstream(name: &str) -> Upstream {
        Upstream {
            name: name.into(),
            targets: vec![Target { url: "http://127.0.0.1:9001".into(), weight: 1 }],
            ..Default::default()
        }
    }

    fn api(name: &str, upstream: &str) -> Api {
        Api { name: name.into(), path_prefix: format!("/{name}"), upstream: upstream.into(), ..Default::default() }
    }

    fn paths(snapshot: &Snapshot) -> Vec<String> {
        validate(snapshot).err().unwrap_or_default().into_iter().map(|v| v.path).collect()
    }

    #[test]
    fn retry_budgets_are_bounded() {
        use crate::v1::RetryBudget;
        for (ratio, min, bad) in [
            (0.2, 10, &[][..]),
            (0.0, 0, &[]),
            (1.0, 1_000, &[]),
            (1.5, 10, &["/upstreams/backend/retry_budget/ratio"]),
            (-0.1, 10, &["/upstreams/backend/retry_budget/ratio"]),
            (
                f64::NAN,
                1_001,
                &["/upstreams/backend/retry_budget/ratio", "/upstreams/backend/retry_budget/min_retries_per_second"],
            ),
        ] {
            let mut backend = upstream("backend");
            backend.retry_budget = Some(RetryBudget { ratio, min_retries_per_second: min });
            let snapshot =
                Snapshot { apis: vec![api("shop", "backend")], upstreams: vec![backend], ..Default::default() };
            assert_eq!(paths(&snapshot), bad, "{ratio} {min}");
        }
    }

    #[test]
    fn api_keys_travel_as_their_digests_only() {
        let digest = "0123456789abcdef".repeat(4);
        for (given, bad) in [
            (digest.clone(), false),
            (digest.to_uppercase(), false),
            (digest[..63].to_owned(), true),
            (format!("{}g", &digest[..63]), true),
            ("the-key-itself".to_owned(), true),
        ] {
            let consumer =
                Consumer { username: "ann".into(), api_key_digests: vec![given.clone()], ..Default::default() };
            let snapshot = Snapshot { consumers: vec![consumer], ..Default::default() };
            let want: &[&str] = if bad { &["/consumers/ann/api_keys/0"] } else { &[] };
            assert_eq!(paths(&snapshot), want, "{given}");
        }
    }

    #[test]
    fn a_consistent_snapshot_passes() {
        let snapshot =
            Snapshot { apis: vec![api("shop", "backend")], upstreams: vec![upstream("backend")], ..Default::default() };
        assert_eq!(validate(&snapshot), Ok(()));
    }

    #[test]
    fn every_violation_is_reported_with_its_path() {
        let mut bad_api = api("shop", "missing");
        bad_api.methods = vec!["get".into()];
        bad_api.openapi = Some(OpenApiBinding { spec: "nope".into(), ..Default::default() });
        bad_api.policies = vec![Policy { kind: Some(Kind::RateLimit(RateLimit::default())) }];
        let mut bad_upstream = upstream("backend");
        bad_upstream.targets[0].url = "ftp://x".into();
        let snapshot =
            Snapshot { apis: vec![bad_api], upstreams: vec![bad_upstream, upstream("backend")], ..Default::default() };
        let found = paths(&snapshot);
        for expected in [
            "/upstreams/backend/name",
            "/apis/shop/upstream",
            "/apis/shop/methods/0",
            "/apis/shop/openapi/spec",
            "/apis/shop/policies/0/rate_limit/requests",
            "/apis/shop/policies/0/rate_limit/per",
            "/upstreams/backend/targets/0/url",
        ] {
            assert!(found.iter().any(|p| p == expected), "missing {expected} in {found:?}");
        }
    }

    #[test]
    fn overlapping_routes_are_rejected() {
        let mut b = api("b", "u");
        b.path_prefix = "/a".into();
        let snapshot = Snapshot { apis: vec![api("a", "u"), b], upstreams: vec![upstream("u")], ..Default::default() };
        assert_eq!(paths(&snapshot), vec!["/apis/b/path_prefix"]);
    }

    #[test]
    fn target_urls_must_be_origins() {
        for (url, ok) in [
            ("http://127.0.0.1:1", true),
            ("https://example.com", true),
            ("http://h/path", false),
            ("h:80", false),
            ("", false),
        ] {
            assert_eq!(check_target_url(url).is_ok(), ok, "{url}");
        }
    }

    #[test]
    fn a_jwks_url_is_an_http_url_without_credentials_and_never_beside_a_document() {
        for good in ["https://idp.example/.well-known/jwks.json", "http://127.0.0.1:8080/keys"] {
            assert_eq!(check_jwks_url(good), Ok(()), "{good}");
        }
        for bad in ["idp.example/jwks", "ftp://idp.example/jwks", "https://user:pw@idp.example/jwks", "https:///x"] {
            assert!(check_jwks_url(bad).is_err(), "{bad}");
        }
        let jwt = |jwks: &str, jwks_url: &str| Policy {
            kind: Some(Kind::Jwt(crate::v1::JwtAuth {
                jwks: jwks.into(),
                jwks_url: jwks_url.into(),
                ..Default::default()
            })),
        };
        let mut shop = api("shop", "backend");
        shop.policies = vec![jwt(r#"{"keys":[]}"#, "https://idp.example/jwks")];
        let mut other = api("other", "backend");
        other.policies = vec![jwt("", "file:///etc/keys")];
        let snapshot = Snapshot { apis: vec![shop, other], upstreams: vec![upstream("backend")], ..Default::default() };
        assert_eq!(paths(&snapshot), ["/apis/shop/policies/0/jwt/jwks_url", "/apis/other/policies/0/jwt/jwks_url"]);
    }

    #[test]
    fn what_the_data_plane_cannot_use_is_refused_at_its_path() {
        use crate::v1::{ActiveHealthCheck, ApiKeyAuth, HashOn, HeaderRules, Headers, JwtCredential, UpstreamTls};
        let mut backend = upstream("backend");
        backend.hash_on = Some(HashOn { source: HashSource::Header as i32, name: "x-ü😀".into() });
        backend.tls = Some(UpstreamTls { sni: "a\0b.example".into(), ..Default::default() });
        backend.health_check = Some(ActiveHealthCheck {
            path: "/health\0".into(),
            interval_ms: 1,
            timeout_ms: 1,
            healthy_threshold: 1,
            unhealthy_threshold: 1,
        });
        let mut shop = api("shop", "backend");
        shop.path_prefix = "/sh\0op".into();
        let rules = HeaderRules {
            set: vec![crate::v1::HeaderValue { name: "x-ü😀".into(), value: "a\nb".into() }],
            remove: vec!["x\0".into()],
            ..Default::default()
        };
        shop.policies = vec![
            Policy { kind: Some(Kind::ApiKey(ApiKeyAuth { header: "x key".into(), query_param: "k\0".into() })) },
            Policy { kind: Some(Kind::Headers(Headers { request: Some(rules), response: None })) },
        ];
        let consumer = Consumer {
            username: "alice".into(),
            jwt_credentials: vec![JwtCredential {
                key: "k\0".into(),
                algorithm: "HS256".into(),
                secret: "s".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let snapshot =
            Snapshot { apis: vec![shop], upstreams: vec![backend], consumers: vec![consumer], ..Default::default() };
        let mut found = paths(&snapshot);
        found.sort();
        assert_eq!(
            found,
            [
                "/apis/shop/path_prefix",
                "/apis/shop/policies/0/api_key/header",
                "/apis/shop/policies/0/api_key/query_param",
                "/apis/shop/policies/1/headers/request/remove/0",
                "/apis/shop/policies/1/headers/request/set/x-ü😀",
                "/apis/shop/policies/1/headers/request/set/x-ü😀",
                "/consumers/alice/jwt/0/key",
                "/upstreams/backend/hash_on/name",
                "/upstreams/backend/health_check/path",
                "/upstreams/backend/tls/sni",
            ]
        );
    }

    #[test]
    fn header_names_are_tokens_and_values_visible_ascii() {
        for (name, ok) in [("x-tenant", true), ("X-Tenant", true), ("x-ü😀", false), ("x a", false), ("", false)] {
            assert_eq!(check_header_name(name).is_ok(), ok, "{name:?}");
        }
        for (value, ok) in [("a b\tc", true), ("a\0b", false), ("a\r\nb", false), ("ü", true), ("a\u{7f}", false)] {
            assert_eq!(check_header_value(value).is_ok(), ok, "{value:?}");
        }
        for (sni, ok) in [("api.example.com", true), ("10.0.0.1", true), ("a\0b", false), ("bad name!", false)] {
            assert_eq!(check_server_name(sni).is_ok(), ok, "{sni:?}");
        }
        for (target, ok) in [("/health?full=1", true), ("health", false), ("/a b", false), ("/a#b", false)] {
            assert_eq!(check_request_target(target).is_ok(), ok, "{target:?}");
        }
    }

    #[test]
    fn credentialed_any_origin_and_costly_password_hashes_are_refused() {
        let mut shop = api("shop", "u");
        let cors = |origins: &[&str], credentials: bool| Policy {
            kind: Some(Kind::Cors(crate::v1::Cors {
                allow_origins: origins.iter().map(|o| o.to_string()).collect(),
                allow_credentials: credentials,
                ..Default::default()
            })),
        };
        let consumer = |name: &str, params: &str| crate::v1::Consumer {
            username: name.into(),
            basic_auth_password_hash: format!("$argon2id$v=19${params}$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA"),
            ..Default::default()
        };
        shop.policies = vec![cors(&["*"], true)];
        let snapshot = Snapshot {
            apis: vec![shop.clone()],
            upstreams: vec![upstream("u")],
            consumers: vec![consumer("ann", "m=19456,t=2,p=1"), consumer("bob", "m=4194304,t=1,p=1")],
            ..Default::default()
        };
        assert_eq!(
            paths(&snapshot),
            vec!["/apis/shop/policies/0/cors/allow_credentials", "/consumers/bob/basic_auth/password_hash"]
        );
        // Named origins with credentials, or any origin without: both fine.
        for policy in [cors(&["https://shop.example"], true), cors(&["*"], false)] {
            shop.policies = vec![policy];
            let fine = Snapshot { apis: vec![shop.clone()], upstreams: vec![upstream("u")], ..Default::default() };
            assert_eq!(validate(&fine), Ok(()));
        }
    }
}
