//! Who may call the admin API, in front of every handler: the bearer token
//! names a [`Principal`] (the startup token, or a named token of the store)
//! whose role decides what it may do, and which handlers record as the
//! author of a write. Failed authentications are logged with the client's
//! address, and an address that keeps failing is refused for a while without
//! its tokens being looked at.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::AdminError;
use super::{Shared, is_public};
use crate::tls::ClientAddr;
use crate::tokens::{Principal, Role, STARTUP_TOKEN_NAME, TokenDigest};

/// Failed authentications an address may make per window before it is refused.
const MAX_FAILURES: u32 = 10;
const FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// Addresses tracked at once; beyond, the entries whose window ended are dropped first.
const MAX_TRACKED: usize = 10_000;

/// Paths only an `admin` token may use, whatever the method: token management.
const ADMIN_ONLY_PREFIX: &str = "/v1/tokens";

/// The startup token and the failure counts.
pub(crate) struct Authenticator {
    startup: TokenDigest,
    failures: Mutex<HashMap<Option<IpAddr>, Failures>>,
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    since: Instant,
}

impl Authenticator {
    pub fn new(startup: TokenDigest) -> Self {
        Self { startup, failures: Mutex::default() }
    }

    /// How long `client` must wait, if it used up its failures.
    fn refused_for(&self, client: Option<IpAddr>) -> Option<Duration> {
        let failures = self.failures.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let entry = failures.get(&client)?;
        let left = FAILURE_WINDOW.checked_sub(entry.since.elapsed())?;
        (entry.count >= MAX_FAILURES).then_some(left)
    }

    /// Counts a failure; returns whether this one used up the address's allowance.
    fn fail(&self, client: Option<IpAddr>) -> bool {
        let mut failures = self.failures.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if failures.len() >= MAX_TRACKED && !failures.contains_key(&client) {
            failures.retain(|_, entry| entry.since.elapsed() < FAILURE_WINDOW);
            if failures.len() >= MAX_TRACKED {
                // Still full of live entries: forget the oldest rather than grow without bound.
                if let Some(oldest) = failures.iter().min_by_key(|(_, e)| e.since).map(|(k, _)| *k) {
                    failures.remove(&oldest);
                }
            }
        }
        let entry = failures.entry(client).or_insert(Failures { count: 0, since: Instant::now() });
        if entry.since.elapsed() >= FAILURE_WINDOW {
            *entry = Failures { count: 0, since: Instant::now() };
        }
        entry.count += 1;
        entry.count == MAX_FAILURES
    }
}

/// Why a request was not authenticated, for the log (never the token itself).
#[derive(Debug, Clone, Copy)]
enum Failure {
    Missing,
    Malformed,
    Unknown,
}

impl Failure {
    fn reason(self) -> &'static str {
        match self {
            Failure::Missing => "no bearer token",
            Failure::Malformed => "malformed Authorization header",
            Failure::Unknown => "unknown or revoked token",
        }
    }
}

pub(crate) async fn authenticate(State(admin): State<Shared>, mut request: Request, next: Next) -> Response {
    if is_public(request.uri().path()) {
        return next.run(request).await;
    }
    let client = request.extensions().get::<ConnectInfo<ClientAddr>>().map(|info| info.0.0);
    let ip = client.map(|addr| addr.ip());
    let auth = &admin.auth;
    if let Some(wait) = auth.refused_for(ip) {
        return too_many_failures(wait);
    }
    let principal = match identify(&admin, request.headers().get(header::AUTHORIZATION)).await {
        Ok(principal) => principal,
        Err(Ok(failure)) => {
            let client = client.map_or_else(|| "unknown".to_owned(), |addr| addr.to_string());
            tracing::warn!(
                client,
                reason = failure.reason(),
                method = %request.method(),
                path = request.uri().path(),
                "admin API authentication failed"
            );
            if auth.fail(ip) {
                tracing::warn!(client, "too many failed admin authentications; refusing this address for a minute");
            }
            return AdminError::Unauthorized.into_response();
        }
        Err(Err(store_error)) => return AdminError::Unavailable(store_error).into_response(),
    };
    if let Err(refusal) = authorize(&principal, request.method(), request.uri().path()) {
        return refusal.into_response();
    }
    request.extensions_mut().insert(principal);
    next.run(request).await
}

/// The principal of `Authorization: Bearer <token>`: the startup token is
/// compared in memory; any other is looked up by digest in the store.
async fn identify(
    admin: &Shared,
    header: Option<&HeaderValue>,
) -> Result<Principal, Result<Failure, crate::store::StoreError>> {
    let header = header.ok_or(Ok(Failure::Missing))?;
    let presented = header
        .to_str()
        .ok()
        .and_then(|value| value.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|token| !token.is_empty())
        .ok_or(Ok(Failure::Malformed))?;
    if admin.auth.startup.matches(presented) {
        return Ok(Principal { name: STARTUP_TOKEN_NAME.to_owned(), role: Role::Admin });
    }
    match admin.store.find_admin_token(&TokenDigest::of(presented)).await {
        Ok(Some(principal)) => Ok(principal),
        Ok(None) => Err(Ok(Failure::Unknown)),
        Err(e) => Err(Err(e)),
    }
}

/// Whether only an `admin` token may make this request: every write, and token management.
pub(crate) fn needs_admin(method: &Method, path: &str) -> bool {
    !matches!(*method, Method::GET | Method::HEAD) || path.starts_with(ADMIN_ONLY_PREFIX)
}

/// What each role may do: `admin` everything; `read-only` reads, but not the token list.
fn authorize(principal: &Principal, method: &Method, path: &str) -> Result<(), AdminError> {
    if principal.role == Role::Admin || !needs_admin(method, path) {
        Ok(())
    } else {
        Err(AdminError::Forbidden { token: principal.name.clone(), role: principal.role })
    }
}

fn too_many_failures(wait: Duration) -> Response {
    let mut response = AdminError::TooManyFailures.into_response();
    let seconds = wait.as_secs().max(1);
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_allow_what_they_say() {
        let reader = Principal { name: "ci".into(), role: Role::ReadOnly };
        let admin = Principal { name: "ops".into(), role: Role::Admin };
        for (method, path, reader_may) in [
            (Method::GET, "/v1/apis", true),
            (Method::HEAD, "/v1/config", true),
            (Method::POST, "/v1/apis", false),
            (Method::PUT, "/v1/config", false),
            (Method::PATCH, "/v1/upstreams/u", false),
            (Method::DELETE, "/v1/consumers/c", false),
            (Method::POST, "/v1/snapshots/3/rollback", false),
            (Method::GET, "/v1/tokens", false),
            (Method::OPTIONS, "/v1/apis", false),
        ] {
            assert_eq!(authorize(&reader, &method, path).is_ok(), reader_may, "{method} {path}");
            assert!(authorize(&admin, &method, path).is_ok(), "{method} {path}");
        }
    }

    #[test]
    fn an_address_is_refused_after_its_failures_and_others_are_not() {
        let auth = Authenticator::new(TokenDigest::of("t"));
        let (noisy, quiet): (Option<IpAddr>, Option<IpAddr>) = (Some([10, 0, 0, 1].into()), Some([10, 0, 0, 2].into()));
        for i in 1..MAX_FAILURES {
            assert!(!auth.fail(noisy), "failure {i}");
            assert!(auth.refused_for(noisy).is_none());
        }
        assert!(auth.fail(noisy), "the last allowed failure is reported once");
        let wait = auth.refused_for(noisy).unwrap_or_default();
        assert!(wait > Duration::from_secs(50) && wait <= FAILURE_WINDOW, "{wait:?}");
        assert!(auth.refused_for(quiet).is_none());
    }
}
