//! Builds the wire `Snapshot` from a stored `Config`: the one place where the
//! declarative model becomes the contract the data planes compile. Runs inside
//! every write transaction, so a change that cannot become a valid snapshot is
//! never committed.

use sluice_proto::v1;
use sluice_proto::{Violation, canonicalize, content_hash, validate};

use crate::model::{self, Balance, Config, HashSource, Policy, RateLimitKey};
use crate::secrets::SecretBox;
use crate::specs::parse_spec;

/// Converts, canonicalizes, validates and hashes. `version` is left at 0 for
/// the store to fill in. Secrets must already be in stored form (see
/// `prepare`); plaintext inputs are reported rather than hashed here, because
/// hashing with a fresh salt would change the snapshot hash on every build.
pub fn build_snapshot(
    config: &Config,
    secrets: &SecretBox,
    api_key_hmac_key: &[u8],
) -> Result<v1::Snapshot, Vec<Violation>> {
    let mut violations = Vec::new();
    let mut snapshot = v1::Snapshot {
        version: 0,
        hash: String::new(),
        apis: config.apis.iter().map(api).collect(),
        upstreams: config.upstreams.iter().map(upstream).collect(),
        consumers: config.consumers.iter().filter_map(|c| consumer(c, secrets, &mut violations)).collect(),
        specs: config.specs.iter().filter_map(|s| spec(s, &mut violations)).collect(),
        certificates: config.certificates.iter().filter_map(|c| certificate(c, secrets, &mut violations)).collect(),
        api_key_hmac_key: api_key_hmac_key.to_vec(),
    };
    canonicalize(&mut snapshot);
    if let Err(found) = validate(&snapshot) {
        violations.extend(found);
    }
    if !violations.is_empty() {
        return Err(violations);
    }
    snapshot.hash = content_hash(&snapshot);
    Ok(snapshot)
}

fn violation(path: String, message: impl Into<String>) -> Violation {
    Violation { path, message: message.into() }
}

fn api(api: &model::Api) -> v1::Api {
    v1::Api {
        name: api.name.clone(),
        hosts: api.hosts.iter().map(|h| h.to_ascii_lowercase()).collect(),
        path_prefix: api.path_prefix.clone(),
        paths: api.paths.clone(),
        methods: api.methods.clone(),
        strip_prefix: api.strip_prefix,
        preserve_host: api.preserve_host,
        upstream: api.upstream.clone(),
        policies: api.policies.iter().map(policy).collect(),
        openapi: api.openapi.as_ref().map(|o| v1::OpenApiBinding {
            spec: o.spec.clone(),
            validate_requests: o.validate_requests,
            validate_responses: o.validate_responses,
        }),
        connect_timeout_ms: api.connect_timeout.map_or(0, |d| d.as_millis_u64()),
        request_timeout_ms: api.request_timeout.map_or(0, |d| d.as_millis_u64()),
        retries: api.retries.unwrap_or(0),
    }
}

fn policy(policy: &Policy) -> v1::Policy {
    use v1::policy::Kind;
    let kind = match policy {
        Policy::BasicAuth(p) => Kind::BasicAuth(v1::BasicAuth { realm: p.realm.clone().unwrap_or_default() }),
        Policy::ApiKey(p) => Kind::ApiKey(v1::ApiKeyAuth {
            header: p.header.clone().unwrap_or_default(),
            query_param: p.query_param.clone().unwrap_or_default(),
        }),
        Policy::Jwt(p) => Kind::Jwt(v1::JwtAuth {
            algorithms: p.algorithms.clone(),
            issuer: p.issuer.clone().unwrap_or_default(),
            audiences: p.audiences.clone(),
            leeway_seconds: p.leeway.map_or(0, |d| d.0.as_secs()),
            key_claim: p.key_claim.clone().unwrap_or_default(),
        }),
        Policy::RateLimit(p) => {
            let key = match p.key {
                RateLimitKey::Consumer => v1::RateLimitKey::Consumer,
                RateLimitKey::Ip => v1::RateLimitKey::Ip,
                RateLimitKey::Api => v1::RateLimitKey::Api,
                RateLimitKey::Header => v1::RateLimitKey::Header,
            };
            Kind::RateLimit(v1::RateLimit {
                requests: p.requests,
                period_seconds: p.per.0.as_secs(),
                burst: p.burst.unwrap_or(0),
                key: key.into(),
                header: p.header.clone().unwrap_or_default(),
                cluster_wide: p.cluster_wide,
                fail_open: p.fail_open,
            })
        }
        Policy::Cors(p) => Kind::Cors(v1::Cors {
            allow_origins: p.allow_origins.clone(),
            allow_methods: p.allow_methods.clone(),
            allow_headers: p.allow_headers.clone(),
            expose_headers: p.expose_headers.clone(),
            allow_credentials: p.allow_credentials,
            max_age_seconds: p.max_age.map_or(0, |d| d.0.as_secs()),
        }),
        Policy::Headers(p) => Kind::Headers(v1::Headers {
            request: p.request.as_ref().map(header_rules),
            response: p.response.as_ref().map(header_rules),
        }),
        Policy::IpRestriction(p) => {
            Kind::IpRestriction(v1::IpRestriction { allow: p.allow.clone(), deny: p.deny.clone() })
        }
        Policy::RequestSizeLimit(p) => Kind::RequestSizeLimit(v1::RequestSizeLimit { max_bytes: p.max_bytes }),
    };
    v1::Policy { kind: Some(kind) }
}

fn header_rules(rules: &model::HeaderRules) -> v1::HeaderRules {
    let values = |map: &std::collections::BTreeMap<String, String>| {
        map.iter().map(|(name, value)| v1::HeaderValue { name: name.clone(), value: value.clone() }).collect()
    };
    v1::HeaderRules {
        set: values(&rules.set),
        add: values(&rules.add),
        remove: rules.remove.clone(),
        rename: rules.rename.iter().map(|(from, to)| v1::HeaderRename { from: from.clone(), to: to.clone() }).collect(),
    }
}

fn upstream(upstream: &model::Upstream) -> v1::Upstream {
    let balance = match upstream.balance {
        Balance::RoundRobin => v1::Balance::RoundRobin,
        Balance::WeightedRoundRobin => v1::Balance::WeightedRoundRobin,
        Balance::LeastConnections => v1::Balance::LeastConnections,
        Balance::RandomTwoChoices => v1::Balance::RandomTwoChoices,
        Balance::ConsistentHash => v1::Balance::ConsistentHash,
    };
    v1::Upstream {
        name: upstream.name.clone(),
        targets: upstream
            .targets
            .iter()
            .map(|t| v1::Target { url: t.url.trim_end_matches('/').to_string(), weight: t.weight })
            .collect(),
        balance: balance.into(),
        hash_on: upstream.hash_on.as_ref().map(|h| v1::HashOn {
            source: match h.source {
                HashSource::ClientIp => v1::HashSource::ClientIp,
                HashSource::Header => v1::HashSource::Header,
                HashSource::Cookie => v1::HashSource::Cookie,
            }
            .into(),
            name: h.name.clone(),
        }),
        health_check: upstream.health_check.as_ref().map(|h| v1::ActiveHealthCheck {
            path: h.path.clone(),
            interval_ms: h.interval.as_millis_u64(),
            timeout_ms: h.timeout.as_millis_u64(),
            healthy_threshold: h.healthy_threshold,
            unhealthy_threshold: h.unhealthy_threshold,
        }),
        passive_health_check: upstream.passive_health_check.as_ref().map(|p| v1::PassiveHealthCheck {
            consecutive_failures: p.consecutive_failures,
            ejection_ms: p.ejection.as_millis_u64(),
        }),
        tls: upstream.tls.as_ref().map(|t| v1::UpstreamTls {
            ca_bundle_pem: t.ca_bundle.clone().unwrap_or_default(),
            insecure_skip_verify: t.insecure_skip_verify,
            sni: t.sni.clone().unwrap_or_default(),
            client_certificate: t.client_certificate.clone().unwrap_or_default(),
        }),
        http2: upstream.http2,
    }
}

fn consumer(consumer: &model::Consumer, secrets: &SecretBox, violations: &mut Vec<Violation>) -> Option<v1::Consumer> {
    let at = |field: &str| format!("/consumers/{}/{field}", consumer.username);
    let before = violations.len();
    let basic_auth_password_hash = match &consumer.basic_auth {
        None => String::new(),
        Some(b) => match &b.password_hash {
            Some(hash) => hash.clone(),
            None => {
                violations.push(violation(at("basic_auth"), "password was not hashed before storing"));
                String::new()
            }
        },
    };
    let mut api_key_digests = Vec::new();
    for (i, key) in consumer.api_keys.iter().enumerate() {
        match &key.key_digest {
            Some(digest) => api_key_digests.push(digest.clone()),
            None => {
                violations.push(violation(format!("{}/{i}", at("api_keys")), "key was not digested before storing"))
            }
        }
    }
    let mut jwt_credentials = Vec::new();
    for (i, jwt) in consumer.jwt.iter().enumerate() {
        let secret = match &jwt.secret_sealed {
            None => String::new(),
            Some(sealed) => match secrets.open(sealed).map(String::from_utf8) {
                Ok(Ok(secret)) => secret,
                _ => {
                    violations.push(violation(
                        format!("{}/{i}/secret_sealed", at("jwt")),
                        "cannot be decrypted with this control plane's secret key",
                    ));
                    String::new()
                }
            },
        };
        jwt_credentials.push(v1::JwtCredential {
            key: jwt.key.clone(),
            algorithm: jwt.algorithm.clone(),
            secret,
            public_key_pem: jwt.public_key.clone().unwrap_or_default(),
        });
    }
    (violations.len() == before).then(|| v1::Consumer {
        username: consumer.username.clone(),
        basic_auth_password_hash,
        api_key_digests,
        jwt_credentials,
    })
}

fn spec(spec: &model::Spec, violations: &mut Vec<Violation>) -> Option<v1::Spec> {
    match parse_spec(&spec.content) {
        Ok(parsed) => Some(v1::Spec { name: spec.name.clone(), json: parsed.json.to_string() }),
        Err(e) => {
            violations.push(violation(format!("/specs/{}/content", spec.name), e.to_string()));
            None
        }
    }
}

fn certificate(
    cert: &model::Certificate,
    secrets: &SecretBox,
    violations: &mut Vec<Violation>,
) -> Option<v1::Certificate> {
    let at = |field: &str| format!("/certificates/{}/{field}", cert.name);
    let key = match cert.key_sealed.as_deref().map(|sealed| secrets.open(sealed).map(String::from_utf8)) {
        Some(Ok(Ok(key))) => key,
        Some(_) => {
            violations.push(violation(at("key_sealed"), "cannot be decrypted with this control plane's secret key"));
            return None;
        }
        None => {
            violations.push(violation(at("key"), "the private key was not sealed before storing"));
            return None;
        }
    };
    let not_after = cert
        .not_after
        .as_deref()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map_or(0, |t| t.timestamp());
    Some(v1::Certificate {
        name: cert.name.clone(),
        chain_pem: cert.chain.clone().unwrap_or_default(),
        private_key_pem: key,
        snis: cert.snis.iter().map(|s| s.to_ascii_lowercase()).collect(),
        default: cert.default,
        not_after,
    })
}
