//! The policy chain, between route match and upstream pick: each API's
//! policies are compiled once per snapshot into a [`PolicyChain`] (all parsing,
//! key loading and schema compilation happen there), and
//! [`PolicyChain::apply`] runs them on every request in one fixed order,
//! around the forward to the upstream.

mod api_key;
mod auth;
pub mod auth_failures;
mod basic_auth;
mod cors;
mod headers;
mod ip_restriction;
mod jwt;
pub mod password;
pub mod rate_limit;
mod rejection;
pub mod remote_jwks;
mod size_limit;

use std::net::IpAddr;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, Method, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use sluice_proto::v1;
use sluice_proto::v1::policy::Kind;

pub use auth::{X_CONSUMER_USERNAME, X_CONSUMER_USERNAME_SPELLED};
pub use rejection::Rejection;

use crate::base::{BodyStatus, ProxyBody, ProxyError, RequestBody, RequestId, full_body};
use crate::openapi::{self, SpecValidator, ValidationFailure};
use auth::Authentication;
pub use auth::ConsumerTags;
use auth_failures::LoginGuard;
use cors::{Cors, CorsStep};
use headers::HeaderPolicy;
use ip_restriction::IpRestriction;
pub use rate_limit::RateCount;
use rate_limit::{RateDecision, RateKeyInput, RateLimitContext, RateLimiter};
use size_limit::{BodyLimit, SizeLimit};

/// Largest upstream response buffered for response validation; a bigger one
/// is refused (502) rather than held in memory.
const RESPONSE_BUFFER_LIMIT: usize = 10 * 1024 * 1024;

/// Process-wide inputs to policy compilation, built once by the app.
#[derive(Debug, Clone, Default)]
pub struct PolicyContext {
    pub rate_limits: RateLimitContext,
    /// Authentication failure limits and the password pool.
    pub logins: LoginGuard,
    /// The JWKS documents fetched from `jwt.jwks_url`s, kept across snapshots.
    pub jwks_sources: Arc<remote_jwks::RemoteJwksSources>,
}

impl PolicyContext {
    /// Node-local state only (no Redis): tests and single nodes.
    pub fn local() -> Self {
        Self::default()
    }
}

/// What the policy chain needs to know of a request beside the request itself.
#[derive(Clone, Copy)]
pub struct RequestContext<'a> {
    /// The request's path, for problem details and response validation: a
    /// copy, as the request's own URI shares the client connection's read buffer.
    pub instance: &'a str,
    /// Goes in every problem body and log line of the request; taken as
    /// text only on the policy path (a request without policies never needs it).
    pub request_id: &'a RequestId,
    pub client_ip: IpAddr,
    /// How the client's body is arriving (`proxy::client_body`); `None` for a request without one.
    pub body: Option<&'a BodyStatus>,
}

/// What the chain finds out about a request that is needed after it is done.
#[derive(Debug, Default)]
pub struct Findings {
    /// Set once authentication has named a consumer (for the access log),
    /// even if a later policy refuses the request.
    pub consumer: Option<Arc<str>>,
    /// Set when the request was forwarded under a rate limit: its answer
    /// then carries the `RateLimit-*` fields (`set_answer_fields`,
    /// `write_answer_fields`).
    pub rate_count: Option<RateCount>,
}

/// One API's compiled policies. One slot per kind: validation allows at most
/// one policy of each kind per API, and the order they run in is fixed by
/// [`PolicyChain::apply`], not by the order the API lists them in.
#[derive(Debug)]
pub struct PolicyChain {
    api: Arc<str>,
    // The larger policies are boxed: a chain is held per API, mostly with
    // few policies set, and inline every chain would be as large as all of
    // them together.
    cors: Option<Box<Cors>>,
    ip_restriction: Option<IpRestriction>,
    size_limit: Option<SizeLimit>,
    auth: Authentication,
    rate_limit: Option<Arc<RateLimiter>>,
    headers: Option<Box<HeaderPolicy>>,
    openapi: Option<Arc<SpecValidator>>,
    /// See `request_fields_read` and `answer_fields_set`; made once the
    /// policies are compiled, as both are asked on every request.
    request_fields: Option<Box<[HeaderName]>>,
    answer_fields: Option<&'static [HeaderName]>,
}

/// Why the chain stopped before (or after) forwarding.
enum Stop {
    /// A policy refused the request; answered with problem details.
    Reject(Rejection),
    /// A policy built the whole answer (rate limit 429, OpenAPI 4xx/502).
    Respond(&'static str, Response<ProxyBody>),
    /// Forwarding failed; the proxy maps it (and logs it with its origin).
    Fail(ProxyError),
}

impl From<Rejection> for Stop {
    fn from(rejection: Rejection) -> Self {
        Stop::Reject(rejection)
    }
}

/// Why an API's policies did not compile, naming the policy. Each policy's own `compile` states what in the
/// snapshot it could not use, as a sentence: that text is the leaf of the chain.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("policy `{policy}`: {reason}")]
    Policy { policy: &'static str, reason: String },
    #[error("openapi: spec `{spec}` is not in the snapshot")]
    MissingSpec { spec: String },
    #[error("openapi: {0}")]
    Spec(#[from] sluice_proto::openapi::CompileError),
}

impl PolicyChain {
    /// Compiles `api`'s policies against `snapshot` (consumers, specs, the
    /// API-key HMAC key). State worth keeping across swaps is taken from
    /// `previous` (the same API in the table being replaced): rate-limit
    /// buckets, compiled validators, the basic-auth cache. `consumers` is
    /// built once per snapshot and shared by all its APIs.
    pub fn compile(
        api: &v1::Api,
        snapshot: &v1::Snapshot,
        consumers: &Arc<ConsumerTags>,
        previous: Option<&PolicyChain>,
        ctx: &PolicyContext,
    ) -> Result<PolicyChain, PolicyError> {
        let mut chain = PolicyChain {
            api: api.name.as_str().into(),
            cors: None,
            ip_restriction: None,
            size_limit: None,
            // Every field named: a default guard would build a failure table per API.
            auth: Authentication {
                basic: None,
                api_key: None,
                jwt: None,
                consumers: consumers.clone(),
                guard: ctx.logins.clone(),
            },
            rate_limit: None,
            headers: None,
            openapi: None,
            request_fields: None,
            answer_fields: None,
        };
        for kind in api.policies.iter().filter_map(|p| p.kind.as_ref()) {
            let name = sluice_proto::policy_name(kind);
            let failed = |reason: String| PolicyError::Policy { policy: name, reason };
            // Exhaustive: a new policy kind in the proto does not compile until it has a slot here.
            match kind {
                Kind::BasicAuth(spec) => {
                    let old = previous.and_then(|p| p.auth.basic.as_deref());
                    chain.auth.basic = Some(Box::new(
                        basic_auth::BasicAuth::compile(spec, &api.name, &snapshot.consumers, old).map_err(failed)?,
                    ));
                }
                Kind::ApiKey(spec) => {
                    chain.auth.api_key =
                        Some(Box::new(api_key::ApiKeyAuth::compile(spec, &api.name, snapshot).map_err(failed)?));
                }
                Kind::Jwt(spec) => {
                    chain.auth.jwt = Some(Box::new(
                        jwt::JwtAuth::compile(spec, &api.name, &snapshot.consumers, &ctx.jwks_sources)
                            .map_err(failed)?,
                    ));
                }
                Kind::RateLimit(spec) => {
                    let old = previous.and_then(|p| p.rate_limit.as_ref());
                    chain.rate_limit =
                        Some(RateLimiter::compile(spec, &api.name, old, &ctx.rate_limits).map_err(failed)?);
                }
                Kind::Cors(spec) => chain.cors = Some(Box::new(Cors::compile(spec).map_err(failed)?)),
                Kind::Headers(spec) => chain.headers = Some(Box::new(HeaderPolicy::compile(spec).map_err(failed)?)),
                Kind::IpRestriction(spec) => chain.ip_restriction = Some(IpRestriction::compile(spec).map_err(failed)?),
                Kind::RequestSizeLimit(spec) => chain.size_limit = Some(SizeLimit::compile(spec).map_err(failed)?),
            }
        }
        if let Some(binding) = api.openapi.as_ref().filter(|b| b.validate_requests || b.validate_responses) {
            let spec = snapshot
                .specs
                .iter()
                .find(|s| s.name == binding.spec)
                .ok_or_else(|| PolicyError::MissingSpec { spec: binding.spec.clone() })?;
            let old = previous.and_then(|p| p.openapi.as_ref());
            chain.openapi = Some(SpecValidator::compile(spec, binding, api, old)?);
        }
        chain.request_fields = chain.fields_read();
        chain.answer_fields = chain.fields_set();
        Ok(chain)
    }

    /// An API without policies goes straight to the upstream (see `apply`).
    pub fn is_empty(&self) -> bool {
        let PolicyChain {
            api: _,
            cors,
            ip_restriction,
            size_limit,
            auth,
            rate_limit,
            headers,
            openapi,
            request_fields: _,
            answer_fields: _,
        } = self;
        cors.is_none()
            && ip_restriction.is_none()
            && size_limit.is_none()
            && !auth.is_configured()
            && rate_limit.is_none()
            && headers.is_none()
            && openapi.is_none()
    }

    /// The request fields the chain's policies read or edit, when they
    /// touch no others: only these need be in the request's map, the rest
    /// may stay as the client sent them (see `HeadFields::moving`). `None`
    /// when a policy reads fields it does not name: CORS, header rules,
    /// request validation.
    pub fn request_fields_read(&self) -> Option<&[HeaderName]> {
        self.request_fields.as_deref()
    }

    fn fields_read(&self) -> Option<Box<[HeaderName]>> {
        let validates_requests = self.openapi.as_ref().is_some_and(|spec| spec.validates_requests());
        if self.cors.is_some() || self.headers.is_some() || validates_requests {
            return None;
        }
        let declared_size = self.size_limit.as_ref().map(|_| header::CONTENT_LENGTH);
        let rate_key = self.rate_limit.as_ref().and_then(|limiter| limiter.field_read()).cloned();
        Some(declared_size.into_iter().chain(self.auth.fields_read()).chain(rate_key).collect())
    }

    /// The fields the chain sets on a forwarded answer, replacing any the
    /// target sent, when setting them is all it does to the answer's head:
    /// then the target's fields may stay as it sent them, out of a map (see
    /// `ResponseBody::fields_as_sent`), and the client's writer leaves these
    /// out of them. `None` when a policy reads the answer's fields or edits
    /// them otherwise: CORS (it looks into `Vary`), header rules, response
    /// validation.
    pub fn answer_fields_set(&self) -> Option<&'static [HeaderName]> {
        self.answer_fields
    }

    fn fields_set(&self) -> Option<&'static [HeaderName]> {
        let validates_answers = self.openapi.as_ref().is_some_and(|spec| spec.validates_responses());
        if self.cors.is_some() || self.headers.is_some() || validates_answers {
            return None;
        }
        Some(if self.rate_limit.is_some() { &rate_limit::RATELIMIT_FIELDS } else { &[] })
    }

    /// Sets the fields of `answer_fields_set` on a forwarded answer whose
    /// head is in its map, with the values `count` gives them.
    pub fn set_answer_fields(&self, count: RateCount, headers: &mut HeaderMap) {
        if let Some(limiter) = &self.rate_limit {
            limiter.set_fields(count, headers);
        }
    }

    /// The same fields as `set_answer_fields`, written as HTTP/1 lines: for
    /// an answer whose head goes out as the target sent it.
    pub fn write_answer_fields(&self, count: RateCount, out: &mut Vec<u8>) {
        if let Some(limiter) = &self.rate_limit {
            limiter.write_fields(count, out);
        }
    }

    /// Whether a CORS preflight to this API is answered by the gateway (the
    /// router lets such a preflight through even when OPTIONS is not routed).
    pub fn answers_preflights(&self) -> bool {
        self.cors.is_some()
    }

    /// The request path through the policies, in a fixed order whatever order
    /// the API lists them in; `forward` sends the request upstream. A policy
    /// that refuses answers with problem details, and the upstream sees
    /// nothing. What the chain finds out goes to `findings` (see `Findings`). An API
    /// without policies does not come here: `proxy::route_and_forward`
    /// forwards its requests itself.
    #[allow(clippy::manual_async_fn, reason = "an async fn holds its arguments twice (see proxy::answer)")]
    pub fn apply<F, Fut>(
        &self,
        mut request: Request<RequestBody>,
        context: RequestContext<'_>,
        findings: &mut Findings,
        forward: F,
    ) -> impl Future<Output = Result<Response<ProxyBody>, ProxyError>>
    where
        F: FnOnce(Request<RequestBody>) -> Fut,
        Fut: Future<Output = Result<Response<ProxyBody>, ProxyError>>,
    {
        let RequestContext { instance, request_id, client_ip, body } = context;
        async move {
            let request_id = request_id.as_str();
            let method = request.method().clone();
            // 1. CORS first: a preflight carries no credentials, so it is answered
            //    here before auth could 401 it; its headers go on every answer below.
            let cors = match self.cors.as_ref().map(|c| c.begin(&method, request.headers())) {
                None => HeaderMap::new(),
                Some(CorsStep::Continue(headers)) => headers,
                Some(CorsStep::Answer(response)) => return Ok(response),
                Some(CorsStep::Reject(rejection)) => return Ok(self.rejected(rejection, instance, request_id)),
            };
            let outcome = async {
                // 2. IP restriction: the cheapest refusal, it reads nothing of the request.
                self.check_ip(client_ip)?;
                // 3. Size limit: by Content-Length before a body byte is read; else counted while streaming.
                let body_limit = BodyLimit::apply(self.size_limit.as_ref(), &mut request, body)?;
                // 4. Authentication: names the consumer that the rate limit and the upstream need. A client
                //    that failed it too often is refused here, before any credential is checked.
                findings.consumer = self.auth.authenticate(&mut request, client_ip).await?;
                // 5. Rate limit after auth: anonymous floods get 401s without spending a consumer's quota.
                let rate_count =
                    self.rate_limit(findings.consumer.as_ref(), client_ip, request.headers(), request_id).await?;
                // 6. Request header rules: after auth (they may use X-Consumer-Username), before validation sees them.
                self.rewrite_request(request.headers_mut());
                // 7. OpenAPI validation last: it may buffer the body, which only requests past every cheaper check deserve.
                self.validate_request(&mut request, &body_limit, request_id).await?;
                // Forward; a failure caused by the streaming size limit is the client's 413, not a 502.
                let response = forward(request).await.map_err(|e| body_limit.explain(e))?;
                // Response: validated as the upstream sent it, before the gateway's own changes.
                let mut response = self.validate_response(&method, instance, request_id, response).await?;
                self.rewrite_response(response.headers_mut());
                // The gateway's RateLimit-* values replace any the upstream sent
                // (the client must see the limit it is actually held to), after
                // the chain: on the map, or by the writer of a head kept as sent.
                findings.rate_count = rate_count;
                Ok::<_, Stop>(response)
            }
            .await;
            let mut response = match outcome {
                Ok(response) => response,
                Err(Stop::Reject(rejection)) => self.rejected(rejection, instance, request_id),
                Err(Stop::Respond(policy, response)) => {
                    self.count_rejection(policy, response.status());
                    response
                }
                Err(Stop::Fail(error)) => return Err(error),
            };
            cors::add_headers(response.headers_mut(), cors);
            Ok(response)
        }
    }

    fn check_ip(&self, client_ip: IpAddr) -> Result<(), Rejection> {
        self.ip_restriction.as_ref().map_or(Ok(()), |p| p.check(client_ip))
    }

    async fn rate_limit(
        &self,
        consumer: Option<&Arc<str>>,
        client_ip: IpAddr,
        headers: &HeaderMap,
        request_id: &str,
    ) -> Result<Option<RateCount>, Stop> {
        let Some(limiter) = &self.rate_limit else { return Ok(None) };
        match limiter.check(&RateKeyInput { consumer, client_ip, headers }, request_id).await {
            RateDecision::Allowed { count } => Ok(Some(count)),
            RateDecision::Limited { response } => Err(Stop::Respond("rate_limit", response)),
        }
    }

    fn rewrite_request(&self, headers: &mut HeaderMap) {
        if let Some(policy) = &self.headers {
            policy.rewrite_request(headers);
        }
    }

    fn rewrite_response(&self, headers: &mut HeaderMap) {
        if let Some(policy) = &self.headers {
            policy.rewrite_response(headers);
        }
    }

    async fn validate_request(
        &self,
        request: &mut Request<RequestBody>,
        limit: &BodyLimit,
        request_id: &str,
    ) -> Result<(), Stop> {
        let Some(spec) = self.openapi.as_ref().filter(|s| s.validates_requests()) else { return Ok(()) };
        let refuse = |failure: ValidationFailure| Stop::Respond("openapi", openapi::respond(&failure, request_id));
        // Shared, not copied: the request is borrowed mutably while its body is buffered.
        let (method, uri) = (request.method().clone(), request.uri().clone());
        let matched = spec.match_request(&method, uri.path()).map_err(refuse)?;
        let body = match matched.needs_body() {
            true => Some(limit.buffer(request).await?),
            false => None,
        };
        matched.check(&method, uri.query(), request.headers(), body.as_deref()).map_err(refuse)
    }

    async fn validate_response(
        &self,
        method: &Method,
        path: &str,
        request_id: &str,
        response: Response<ProxyBody>,
    ) -> Result<Response<ProxyBody>, Stop> {
        let Some(spec) = self.openapi.as_ref().filter(|s| s.validates_responses()) else { return Ok(response) };
        if response.status() == StatusCode::SWITCHING_PROTOCOLS {
            return Ok(response);
        }
        let (parts, body) = response.into_parts();
        let bytes = match http_body_util::Limited::new(body, RESPONSE_BUFFER_LIMIT).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) => {
                tracing::warn!(api = %self.api, request_id, error = %e, "upstream response could not be read for validation");
                return Err(Stop::Reject(
                    Rejection::new("openapi", StatusCode::BAD_GATEWAY, "bad-gateway", "Bad gateway")
                        .detail("The upstream response could not be validated."),
                ));
            }
        };
        if let Err(failure) = spec.validate_response(method, path, parts.status, &parts.headers, &bytes) {
            tracing::warn!(api = %self.api, request_id, %failure, "upstream response violates the API's spec");
            return Err(Stop::Respond("openapi", openapi::respond(&failure, request_id)));
        }
        let mut response = Response::from_parts(parts, full_body(bytes));
        // The body is now whole: its length is known even if the upstream streamed it.
        response.headers_mut().remove(header::TRANSFER_ENCODING);
        Ok(response)
    }

    fn rejected(&self, rejection: Rejection, instance: &str, request_id: &str) -> Response<ProxyBody> {
        self.count_rejection(rejection.policy, rejection.status);
        tracing::debug!(api = %self.api, request_id, policy = rejection.policy, status = %rejection.status, detail = %rejection.detail, "request refused by policy");
        rejection.into_response(instance, request_id)
    }

    fn count_rejection(&self, policy: &'static str, status: StatusCode) {
        metrics::counter!(
            "sluice_policy_rejections_total",
            "api" => self.api.to_string(),
            "policy" => policy,
            "status" => status.as_str().to_string()
        )
        .increment(1);
    }
}

impl BodyLimit {
    fn explain(&self, error: ProxyError) -> Stop {
        if self.tripped() { Stop::Reject(self.rejection()) } else { Stop::Fail(error) }
    }
}

/// Compile-time guard: the request future must stay `Send` for hyper's
/// executor, and when it is not, the error surfaces far away in `proxy.rs` as
/// a missing `graceful_shutdown`. This fails right here instead.
#[allow(dead_code)]
fn apply_is_send(chain: &PolicyChain, request: Request<RequestBody>, findings: &mut Findings) {
    fn send<T: Send>(_: T) {}
    let forward = |_| async { Err::<Response<ProxyBody>, _>(ProxyError::NotReady) };
    let id = RequestId::make();
    let context =
        RequestContext { instance: "/", request_id: &id, client_ip: IpAddr::from([127, 0, 0, 1]), body: None };
    send(chain.apply(request, context, findings, forward));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(kinds: Vec<Kind>) -> PolicyChain {
        let policies = kinds.into_iter().map(|kind| v1::Policy { kind: Some(kind) }).collect();
        let api = v1::Api { name: "shop".into(), path_prefix: "/".into(), policies, ..Default::default() };
        let snapshot = v1::Snapshot { api_key_hmac_key: b"key".to_vec(), ..Default::default() };
        let consumers = Arc::new(ConsumerTags::new(&snapshot.consumers));
        PolicyChain::compile(&api, &snapshot, &consumers, None, &PolicyContext::local()).unwrap()
    }

    fn names(fields: Option<&[HeaderName]>) -> Option<Vec<&str>> {
        fields.map(|fields| fields.iter().map(HeaderName::as_str).collect())
    }

    /// What the request's writer and the client's writer leave out of the
    /// fields kept as sent, and what goes into the maps, follows from these:
    /// a policy that reads or sets a field this list does not name would
    /// read nothing there, or the client would get the target's value too.
    #[test]
    fn a_chain_names_the_fields_it_reads_and_sets_unless_one_of_its_policies_may_touch_any() {
        let rate_limit = |key: v1::RateLimitKey, header: &str| {
            let spec = v1::RateLimit {
                requests: 5,
                period_seconds: 60,
                key: key as i32,
                header: header.into(),
                ..Default::default()
            };
            Kind::RateLimit(spec)
        };
        let basic = Kind::BasicAuth(v1::BasicAuth { realm: "shop".into() });
        let api_key = Kind::ApiKey(v1::ApiKeyAuth { header: "X-Api-Key".into(), query_param: "key".into() });
        let size_limit = Kind::RequestSizeLimit(v1::RequestSizeLimit { max_bytes: 16 });
        let allow = Kind::IpRestriction(v1::IpRestriction { allow: vec!["127.0.0.1/32".into()], deny: Vec::new() });
        let cors = Kind::Cors(v1::Cors { allow_origins: vec!["https://a.example".into()], ..Default::default() });
        let rules = v1::HeaderRules { remove: vec!["x-secret".into()], ..Default::default() };
        let header_rules = Kind::Headers(v1::Headers { request: Some(rules), response: None });
        let limit_fields = Some(vec!["ratelimit-limit", "ratelimit-remaining", "ratelimit-reset", "ratelimit-policy"]);
        for (what, kinds, read, set) in [
            ("none", vec![], Some(vec![]), Some(vec![])),
            ("ip restriction", vec![allow], Some(vec![]), Some(vec![])),
            (
                "the secured scenario's",
                vec![basic.clone(), rate_limit(v1::RateLimitKey::Consumer, "")],
                Some(vec!["authorization"]),
                limit_fields.clone(),
            ),
            (
                "size, key and a limit by header",
                vec![size_limit, api_key, rate_limit(v1::RateLimitKey::Header, "X-Tenant")],
                Some(vec!["content-length", "x-api-key", "x-tenant"]),
                limit_fields,
            ),
            ("cors", vec![cors, basic.clone()], None, None),
            ("header rules", vec![header_rules, basic], None, None),
        ] {
            let chain = chain(kinds);
            assert_eq!(names(chain.request_fields_read()), read, "{what}");
            assert_eq!(names(chain.answer_fields_set()), set, "{what}");
        }
    }
}
