//! Authentication, the policy chain's step after the size limit and before
//! the rate limit: whichever of `api_key`, `jwt` and `basic_auth` an API has,
//! a request passes when it satisfies one it presents credentials for. On
//! success the credentials are removed before forwarding and the consumer is
//! named in `X-Consumer-Username`; otherwise 401 with one challenge per method.

use std::net::IpAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::header::AUTHORIZATION;
use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode, Uri, header};
use metrics::Counter;
use sluice_proto::v1;

use super::api_key::{ApiKeyAuth, remove_query_param};
use super::auth_failures::{LoginGuard, Subject};
use super::basic_auth::{BasicAuth, NotChecked, Presented};
use super::jwt::{JwtAuth, Verified};
use super::rate_limit::effective_client_ip;
use super::rejection::Rejection;
use crate::base::RequestBody;
use crate::fast_map::FastMap;

/// Set by the gateway for the upstream; a client-sent value is always dropped
/// so nobody can claim to be a consumer by sending the header.
pub const X_CONSUMER_USERNAME: HeaderName = HeaderName::from_static(X_CONSUMER_USERNAME_SPELLED);
/// Its name, for a check on the wire before any header map.
pub const X_CONSUMER_USERNAME_SPELLED: &str = "x-consumer-username";

/// The `policy` of every authentication refusal (basic, API key, JWT, or
/// several at once): one label value for the step, whatever methods an API
/// combines, so one query counts every API's auth refusals.
const AUTHENTICATION: &str = "authentication";

/// The schemes are boxed, like the other policies in [`PolicyChain`]: most
/// APIs configure few of them, and every API's chain is held in memory.
///
/// [`PolicyChain`]: super::PolicyChain
#[derive(Debug, Default)]
pub struct Authentication {
    pub basic: Option<Box<BasicAuth>>,
    pub api_key: Option<Box<ApiKeyAuth>>,
    pub jwt: Option<Box<JwtAuth>>,
    /// The snapshot's consumers, as each authenticated request names them.
    pub consumers: Arc<ConsumerTags>,
    /// Failure limits and the password pool, shared by the whole process.
    pub guard: LoginGuard,
}

/// What the gateway says about each configured consumer on every request it
/// passes, made once per snapshot and shared by its APIs: the
/// `X-Consumer-Username` value, and the request counter (registered on the
/// consumer's first request, so idle consumers add no series). Building
/// both per request cost a registry lookup and three allocations.
#[derive(Debug, Default)]
pub struct ConsumerTags(FastMap<Box<str>, ConsumerTag>);

#[derive(Debug)]
struct ConsumerTag {
    /// `None` for a name that is not a valid header value (it is logged instead).
    header: Option<HeaderValue>,
    requests: OnceLock<Counter>,
}

impl ConsumerTags {
    pub fn new(consumers: &[v1::Consumer]) -> Self {
        let tag = |name: &str| ConsumerTag { header: HeaderValue::from_str(name).ok(), requests: OnceLock::new() };
        ConsumerTags(consumers.iter().map(|c| (c.username.as_str().into(), tag(&c.username))).collect())
    }

    pub fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(|name| &**name)
    }
}

impl Authentication {
    pub fn is_configured(&self) -> bool {
        self.basic.is_some() || self.api_key.is_some() || self.jwt.is_some()
    }

    /// The request fields authentication reads or removes: the credentials.
    /// The others it reads never stay as the client sent them (see
    /// `proxy::inbound::fields_stay_as_sent`): `X-Forwarded-For` (the client
    /// behind trusted proxies) is the gateway's to replace, and a client's
    /// `X-Consumer-Username` is dropped before any policy runs.
    pub fn fields_read(&self) -> impl Iterator<Item = HeaderName> + '_ {
        let authorization = (self.basic.is_some() || self.jwt.is_some()).then_some(AUTHORIZATION);
        let api_key = self.api_key.as_ref().and_then(|api_key| api_key.header()).cloned();
        authorization.into_iter().chain(api_key)
    }

    /// The consumer, `None` when the API has no authentication. A client
    /// address that failed too often lately gets 429 before anything is
    /// checked. Methods are tried cheapest first (one HMAC, one signature
    /// check, then basic, whose first sight of a credential costs an argon2
    /// run). `peer` is the socket's address; behind trusted proxies the
    /// client is read from `X-Forwarded-For`, as for rate limits.
    pub async fn authenticate(
        &self,
        request: &mut Request<RequestBody>,
        peer: IpAddr,
    ) -> Result<Option<Arc<str>>, Rejection> {
        request.headers_mut().remove(X_CONSUMER_USERNAME);
        if !self.is_configured() {
            return Ok(None);
        }
        let client = effective_client_ip(peer, request.headers(), &self.guard.trusted_proxies);
        if let Some(retry) = self.guard.failures.retry_after(Subject::Address(client)) {
            return Err(self.too_many_failures(retry));
        }
        let mut presented = false;
        let mut failures: Vec<String> = Vec::new();
        let mut consumer = None;
        // False for a JWKS token's subject: a name no operator configured.
        let mut configured = true;

        if let Some(api_key) = &self.api_key
            && let Some(key) = api_key.presented(request.headers(), request.uri().query())
        {
            presented = true;
            consumer = api_key.verify(&key);
            if consumer.is_none() {
                failures.push("the API key is not valid".into());
            }
        }
        let authorization = request.headers().get(AUTHORIZATION);
        if consumer.is_none()
            && let Some(jwt) = &self.jwt
            && let Some(token) = authorization.and_then(JwtAuth::presented)
        {
            presented = true;
            match jwt.verify(token) {
                Ok(Verified::Consumer(found)) => consumer = Some(found),
                Ok(Verified::Subject(subject)) => {
                    consumer = Some(subject);
                    configured = false;
                }
                Err(why) => failures.push(why.to_string()),
            }
        }
        if consumer.is_none()
            && let Some(basic) = &self.basic
            && let Some(credentials) = authorization.and_then(BasicAuth::presented)
        {
            presented = true;
            match credentials {
                Presented::Credentials(credentials) => match basic.verify(&credentials, &self.guard).await {
                    Ok(found) => {
                        consumer = found;
                        if consumer.is_none() {
                            failures.push("the username or password is wrong".into());
                        }
                    }
                    Err(NotChecked::Limited(retry)) => return Err(self.too_many_failures(retry)),
                    Err(NotChecked::Busy) => return Err(self.busy()),
                },
                Presented::Malformed => failures.push("the Basic credentials are malformed".into()),
            }
        }

        let Some(consumer) = consumer else {
            if presented {
                self.guard.failures.record(Subject::Address(client));
            }
            return Err(self.unauthorized(presented, &failures));
        };
        self.strip_credentials(request)?;
        self.name_consumer(request.headers_mut(), &consumer, configured);
        Ok(Some(consumer))
    }

    /// Names the consumer to the upstream and counts its request. A JWKS
    /// token's subject (`configured` false) is named but not counted: no
    /// operator configured it, so it must not add metric series.
    fn name_consumer(&self, headers: &mut HeaderMap, consumer: &Arc<str>, configured: bool) {
        let tag = if configured { self.consumers.0.get(&**consumer) } else { None };
        let value = match tag {
            Some(tag) => tag.header.clone(),
            None => HeaderValue::from_str(consumer).ok(),
        };
        match value {
            Some(value) => {
                headers.insert(X_CONSUMER_USERNAME, value);
            }
            None => tracing::warn!(%consumer, "consumer name cannot be sent in X-Consumer-Username"),
        }
        if configured {
            // Labelled by consumer only (not API): consumers are few and set by
            // operators, so the series count stays bounded by configuration.
            // The label shares the name's allocation.
            let register = || metrics::counter!("sluice_consumer_requests_total", "consumer" => consumer.clone());
            match tag {
                Some(tag) => tag.requests.get_or_init(register).increment(1),
                None => register().increment(1),
            }
        }
    }

    /// Removes every credential this API reads, used or not: the upstream
    /// trusts the gateway's word (X-Consumer-Username), and a secret it never
    /// needs should not reach its logs.
    fn strip_credentials(&self, request: &mut Request<RequestBody>) -> Result<(), Rejection> {
        if self.basic.is_some() || self.jwt.is_some() {
            request.headers_mut().remove(AUTHORIZATION);
        }
        let Some(api_key) = &self.api_key else { return Ok(()) };
        if let Some(name) = api_key.header() {
            request.headers_mut().remove(name);
        }
        if let (Some(param), Some(query)) = (api_key.query_param(), request.uri().query()) {
            let path = request.uri().path();
            let rewritten = match remove_query_param(query, param) {
                Some(rest) => format!("{path}?{rest}"),
                None => path.to_string(),
            };
            let mut parts = request.uri().clone().into_parts();
            parts.path_and_query = PathAndQuery::try_from(rewritten).ok();
            // Fail closed: a request whose key cannot be removed is not forwarded.
            let uri = Uri::from_parts(parts).map_err(|_| {
                Rejection::new(AUTHENTICATION, StatusCode::BAD_REQUEST, "bad-request", "Bad request")
                    .detail("The request target cannot be rewritten.")
            })?;
            *request.uri_mut() = uri;
        }
        Ok(())
    }

    fn too_many_failures(&self, retry: Duration) -> Rejection {
        let seconds = retry.as_secs() + u64::from(retry.subsec_nanos() > 0);
        let mut rejection = Rejection::new(
            AUTHENTICATION,
            StatusCode::TOO_MANY_REQUESTS,
            "too-many-requests",
            "Too many failed logins",
        )
        .detail(format!("Too many failed authentications; retry in {seconds} s."));
        rejection.headers.push((header::RETRY_AFTER, HeaderValue::from(seconds)));
        rejection
    }

    fn busy(&self) -> Rejection {
        let mut rejection =
            Rejection::new(AUTHENTICATION, StatusCode::SERVICE_UNAVAILABLE, "busy", "Authentication busy")
                .detail("Too many logins are being checked; retry shortly.");
        rejection.headers.push((header::RETRY_AFTER, HeaderValue::from_static("1")));
        rejection
    }

    fn unauthorized(&self, presented: bool, failures: &[String]) -> Rejection {
        let policy = AUTHENTICATION;
        let detail = if presented {
            format!("Authentication failed: {}.", failures.join("; "))
        } else {
            "This API requires credentials; see WWW-Authenticate for the accepted methods.".to_string()
        };
        let mut rejection =
            Rejection::new(policy, StatusCode::UNAUTHORIZED, "unauthorized", "Unauthorized").detail(detail);
        let challenges = [
            self.api_key.as_deref().map(ApiKeyAuth::challenge),
            self.jwt.as_deref().map(JwtAuth::challenge),
            self.basic.as_deref().map(BasicAuth::challenge),
        ];
        for challenge in challenges.into_iter().flatten() {
            rejection.headers.push((header::WWW_AUTHENTICATE, challenge.clone()));
        }
        rejection
    }
}

#[cfg(test)]
#[allow(clippy::type_complexity)]
mod tests {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use hmac::{Hmac, Mac as _};
    use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
    use sha2::Sha256;
    use sluice_proto::v1;

    use super::*;
    use crate::base::full_body_request;

    fn snapshot() -> v1::Snapshot {
        let mut mac = Hmac::<Sha256>::new_from_slice(b"k").unwrap();
        mac.update(b"ann-key");
        let params = argon2::Params::new(1024, 1, 1, None).unwrap();
        let argon = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        let phc = argon2::PasswordHasher::hash_password(&argon, b"pw").unwrap().to_string();
        v1::Snapshot {
            api_key_hmac_key: b"k".to_vec(),
            consumers: vec![v1::Consumer {
                username: "ann".into(),
                basic_auth_password_hash: phc,
                api_key_digests: vec![hex::encode(mac.finalize().into_bytes())],
                jwt_credentials: vec![v1::JwtCredential {
                    key: "ann".into(),
                    algorithm: "HS256".into(),
                    secret: "jwt-secret".into(),
                    public_key_pem: String::new(),
                }],
            }],
            ..Default::default()
        }
    }

    fn all_methods() -> Authentication {
        let s = snapshot();
        let api_key = v1::ApiKeyAuth { header: "x-api-key".into(), query_param: "key".into() };
        Authentication {
            basic: Some(Box::new(BasicAuth::compile(&v1::BasicAuth::default(), "shop", &s.consumers, None).unwrap())),
            api_key: Some(Box::new(ApiKeyAuth::compile(&api_key, "shop", &s).unwrap())),
            jwt: Some(Box::new(
                JwtAuth::compile(&v1::JwtAuth::default(), "shop", &s.consumers, &Default::default()).unwrap(),
            )),
            consumers: Arc::new(ConsumerTags::new(&s.consumers)),
            guard: LoginGuard::default(),
        }
    }

    const PEER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    fn request(uri: &str, headers: &[(&str, &str)]) -> Request<RequestBody> {
        let mut request = Request::new(full_body_request(bytes::Bytes::new()));
        *request.uri_mut() = uri.parse().unwrap();
        for (k, v) in headers {
            request.headers_mut().append(HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        request
    }

    #[tokio::test]
    async fn any_presented_method_table() {
        let auth = all_methods();
        let basic = |cred: &str| format!("Basic {}", STANDARD.encode(cred));
        let exp = jsonwebtoken::get_current_timestamp() + 60;
        let token = encode(
            &Header::new(Algorithm::HS256),
            &serde_json::json!({"iss": "ann", "exp": exp}),
            &EncodingKey::from_secret(b"jwt-secret").unwrap(),
        )
        .unwrap();
        let bearer = format!("Bearer {token}");
        // (uri, headers, passes, upstream path)
        let cases: Vec<(&str, Vec<(&str, String)>, bool, &str)> = vec![
            ("/a", vec![("authorization", basic("ann:pw"))], true, "/a"),
            ("/a", vec![("authorization", bearer.clone())], true, "/a"),
            ("/a", vec![("x-api-key", "ann-key".into())], true, "/a"),
            ("/a?x=1&key=ann-key", vec![], true, "/a?x=1"),
            ("/a?key=ann-key", vec![], true, "/a"),
            // A bad key, but good basic credentials: one satisfied method is enough.
            ("/a", vec![("x-api-key", "bad".into()), ("authorization", basic("ann:pw"))], true, "/a"),
            ("/a", vec![("authorization", basic("ann:nope"))], false, ""),
            ("/a", vec![("authorization", "Basic %%%".into())], false, ""),
            ("/a", vec![("authorization", "Bearer x.y.z".into())], false, ""),
            ("/a", vec![("authorization", "Digest foo".into())], false, ""),
            ("/a", vec![], false, ""),
        ];
        for (uri, headers, passes, upstream_path) in cases {
            let mut headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            headers.push(("x-consumer-username", "admin"));
            let mut req = request(uri, &headers);
            match auth.authenticate(&mut req, PEER).await {
                Ok(consumer) => {
                    assert!(passes, "{uri} {headers:?} passed");
                    assert_eq!(consumer.as_deref(), Some("ann"));
                    assert_eq!(req.headers()[X_CONSUMER_USERNAME], "ann");
                    assert!(!req.headers().contains_key(AUTHORIZATION), "{headers:?}");
                    assert!(!req.headers().contains_key("x-api-key"), "{headers:?}");
                    assert_eq!(req.uri().path_and_query().unwrap().as_str(), upstream_path);
                }
                Err(rejection) => {
                    assert!(!passes, "{uri} {headers:?} rejected: {}", rejection.detail);
                    assert_eq!(rejection.status, StatusCode::UNAUTHORIZED);
                    assert_eq!(rejection.headers.iter().filter(|(n, _)| n == header::WWW_AUTHENTICATE).count(), 3);
                }
            }
        }
    }

    #[tokio::test]
    async fn no_auth_still_drops_spoofed_consumer() {
        let mut req = request("/a", &[("x-consumer-username", "admin"), ("authorization", "Bearer upstream-token")]);
        assert_eq!(Authentication::default().authenticate(&mut req, PEER).await.unwrap(), None);
        assert!(!req.headers().contains_key(X_CONSUMER_USERNAME));
        // Without an auth policy the Authorization header is the upstream's.
        assert!(req.headers().contains_key(AUTHORIZATION));
    }

    #[tokio::test]
    async fn missing_versus_invalid_detail() {
        let auth = all_methods();
        let missing = auth.authenticate(&mut request("/a", &[]), PEER).await.unwrap_err();
        assert!(missing.detail.contains("requires credentials"), "{}", missing.detail);
        let invalid = auth.authenticate(&mut request("/a", &[("x-api-key", "bad")]), PEER).await.unwrap_err();
        assert!(invalid.detail.contains("API key is not valid"), "{}", invalid.detail);
    }
}
