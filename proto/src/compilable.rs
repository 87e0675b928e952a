//! The checks a data plane's compile makes that do not depend on the node,
//! run by the control plane on every snapshot it is about to commit, with
//! the functions the data plane compiles with: routes (the matcher itself),
//! certificates and keys, CA bundles, JWT keys and JWKS,
//! rate-limit quotas and header names, and every spec an API validates
//! with (its schemas, regexes, `$ref`s and path templates). What
//! passes here and [`crate::validate`] compiles on a data plane of the same
//! version; a NACK is left for version skew and for what only the node
//! knows (its Redis, its system roots).
//!
//! Kept apart from `validate`, which both planes run: a data plane gets
//! these checks from compiling itself, and running them twice would double
//! the cost of a swap.

use std::collections::HashSet;

use jsonwebtoken::Algorithm;

use crate::openapi::SpecValidator;
use crate::routes::Matcher;
use crate::tls::{self, MaterialError};
use crate::v1::{Api, Certificate, Consumer, RateLimitKey, Snapshot, Upstream, policy::Kind};
use crate::{Violation, jwt, policy};

/// Route conflicts reported for one snapshot at most; each costs a matcher build.
const MAX_ROUTE_CONFLICTS: usize = 16;

/// Checks a snapshot that passed [`crate::validate`]; returns every violation found.
pub fn check_compilable(snapshot: &Snapshot) -> Result<(), Vec<Violation>> {
    let mut violations = Vec::new();
    check_routes(&mut violations, &snapshot.apis);
    for certificate in &snapshot.certificates {
        check_certificate(&mut violations, certificate);
    }
    for upstream in &snapshot.upstreams {
        check_upstream_tls(&mut violations, upstream);
    }
    for consumer in &snapshot.consumers {
        check_consumer_keys(&mut violations, consumer);
    }
    for api in &snapshot.apis {
        check_policies(&mut violations, api);
    }
    check_specs(&mut violations, snapshot);
    if violations.is_empty() { Ok(()) } else { Err(violations) }
}

fn push(violations: &mut Vec<Violation>, path: String, message: impl Into<String>) {
    violations.push(Violation { path, message: message.into() });
}

/// Builds the data plane's route matcher. It stops at the first conflict, so
/// the API that could not be added is set aside and the rest built again,
/// to name every conflicting API in one answer.
fn check_routes(violations: &mut Vec<Violation>, apis: &[Api]) {
    let mut set_aside: Option<Vec<Api>> = None;
    for _ in 0..MAX_ROUTE_CONFLICTS {
        let current = set_aside.as_deref().unwrap_or(apis);
        let Err(conflict) = Matcher::from_apis(current) else { return };
        let Some(api) = current.get(conflict.api) else { return };
        let path = match api.paths.iter().position(|p| *p == conflict.route) {
            Some(i) => format!("/apis/{}/paths/{i}", api.name),
            None => format!("/apis/{}/path_prefix", api.name),
        };
        push(violations, path, conflict.detail);
        let rest = current.iter().filter(|a| a.name != api.name).cloned().collect();
        set_aside = Some(rest);
    }
}

fn check_certificate(violations: &mut Vec<Violation>, certificate: &Certificate) {
    if certificate.chain_pem.is_empty() || certificate.private_key_pem.is_empty() {
        return; // `validate` reports these.
    }
    if let Err(e) = tls::certified_key(&certificate.chain_pem, &certificate.private_key_pem) {
        let field = match e {
            MaterialError::Key(_) | MaterialError::KeyMismatch(_) => "key",
            _ => "chain",
        };
        push(violations, format!("/certificates/{}/{field}", certificate.name), e.to_string());
    }
}

/// As a data plane builds the upstream's TLS client: the CA bundle is read
/// unless verification is off.
fn check_upstream_tls(violations: &mut Vec<Violation>, upstream: &Upstream) {
    let Some(settings) = &upstream.tls else { return };
    let at = |field: &str| format!("/upstreams/{}/tls/{field}", upstream.name);
    if !settings.insecure_skip_verify
        && !settings.ca_bundle_pem.is_empty()
        && let Err(e) = tls::ca_bundle(&settings.ca_bundle_pem)
    {
        push(violations, at("ca_bundle"), e.to_string());
    }
}

/// Every consumer key, used by an API's `jwt` policy or not yet: a data plane
/// loads each one an accepting API could verify with.
fn check_consumer_keys(violations: &mut Vec<Violation>, consumer: &Consumer) {
    for (i, credential) in consumer.jwt_credentials.iter().enumerate() {
        let Ok(algorithm) = jwt::algorithm(&credential.algorithm) else { continue }; // `validate` reports it.
        if let Err(e) = jwt::decoding_key(algorithm, &credential.secret, &credential.public_key_pem) {
            let field = if credential.public_key_pem.is_empty() { "secret" } else { "public_key" };
            push(violations, format!("/consumers/{}/jwt/{i}/{field}", consumer.username), e.to_string());
        }
    }
}

fn check_policies(violations: &mut Vec<Violation>, api: &Api) {
    for (i, policy) in api.policies.iter().enumerate() {
        let at = |field: &str| format!("/apis/{}/policies/{i}/{field}", api.name);
        let settings = match &policy.kind {
            Some(Kind::RateLimit(settings)) => {
                if let Err(e) = policy::rate_quota(settings) {
                    push(violations, at("rate_limit"), e);
                }
                if settings.key() == RateLimitKey::Header
                    && let Err(e) = policy::rate_limit_header(settings)
                {
                    push(violations, at("rate_limit/header"), e);
                }
                continue;
            }
            Some(Kind::ApiKey(settings)) => {
                if let Err(e) = policy::api_key_header(settings) {
                    push(violations, at("api_key/header"), e);
                }
                continue;
            }
            Some(Kind::Jwt(settings)) if !settings.jwks.trim().is_empty() => settings,
            _ => continue,
        };
        let accepted: Result<Vec<Algorithm>, _> = settings.algorithms.iter().map(|a| jwt::algorithm(a)).collect();
        let Ok(accepted) = accepted else { continue }; // `validate` reports it.
        if let Err(e) = jwt::jwks_keys(&settings.jwks, &accepted) {
            // The field is a string, so the pointer stops at it; the message names the key.
            push(violations, at("jwt/jwks"), e.to_string());
        }
    }
}

/// Compiles every spec an API validates with, as a data plane's `openapi`
/// policy does. Only bound specs: a data plane never compiles a spec no API
/// validates with, so an unbound one is not refused (binding it is). A spec
/// is compiled once per snapshot for each way it is bound (with or without
/// responses; the API's prefix cannot make a compile fail), and reported
/// once, at the place in the document.
fn check_specs(violations: &mut Vec<Violation>, snapshot: &Snapshot) {
    let mut compiled = HashSet::new();
    for api in &snapshot.apis {
        let Some(binding) = api.openapi.as_ref().filter(|b| b.validate_requests || b.validate_responses) else {
            continue;
        };
        let Some(spec) = snapshot.specs.iter().find(|s| s.name == binding.spec) else { continue }; // `validate` reports it.
        if !compiled.insert((spec.name.as_str(), binding.validate_responses)) {
            continue;
        }
        if let Err(e) = SpecValidator::compile(spec, binding, api, None) {
            let path = format!("/specs/{}/content{}", spec.name, e.error.pointer().unwrap_or_default());
            if violations.iter().any(|v| v.path == path) {
                continue; // Bound twice and broken in a part both compile.
            }
            push(violations, path, format!("{} (API `{}` validates with it)", e.error, api.name));
        }
    }
}
