//! Builds the wire `Snapshot` from a stored `Config`: the one place where the
//! declarative model becomes the contract the data planes compile. Runs inside
//! every write transaction, so a change that cannot become a valid snapshot is
//! never committed.

use std::collections::BTreeMap;
use std::sync::Arc;

use sluice_proto::v1;
use sluice_proto::{Violation, canonicalize, check_compilable, content_hash, validate};

use crate::model::{self, Balance, Config, HashSource, Policy, RateLimitKey};
use crate::secrets::SecretBox;
use crate::specs::{SpecCache, SpecSummary};

/// Converts, canonicalizes, validates and hashes. `version` is left at 0 for
/// the store to fill in. Secrets must already be in stored form (see
/// `prepare`); plaintext inputs are reported rather than hashed here, because
/// hashing with a fresh salt would change the snapshot hash on every build.
/// Specs come from `specs`, which parses only texts it has not seen.
pub fn build_snapshot(
    config: &Config,
    secrets: &SecretBox,
    api_key_hmac_key: &[u8],
    specs: &SpecCache,
) -> Result<v1::Snapshot, Vec<Violation>> {
    let mut violations = Vec::new();
    let parsed_specs: BTreeMap<&str, Arc<SpecSummary>> =
        config.specs.iter().filter_map(|s| parse(s, specs, &mut violations).map(|p| (s.name.as_str(), p))).collect();
    let mut upstreams: Vec<v1::Upstream> = config.upstreams.iter().map(upstream).collect();
    let apis = config.apis.iter().map(|a| api(a, &parsed_specs, &mut upstreams)).collect();
    let mut snapshot = v1::Snapshot {
        version: 0,
        hash: String::new(),
        apis,
        upstreams,
        consumers: config.consumers.iter().filter_map(|c| consumer(c, secrets, &mut violations)).collect(),
        specs: parsed_specs
            .iter()
            .map(|(name, parsed)| v1::Spec { name: (*name).to_string(), json: parsed.json.clone() })
            .collect(),
        certificates: config.certificates.iter().filter_map(|c| certificate(c, secrets, &mut violations)).collect(),
        api_key_hmac_key: api_key_hmac_key.to_vec(),
    };
    canonicalize(&mut snapshot);
    match validate(&snapshot) {
        Err(found) => violations.extend(found),
        // What a data plane would refuse when it compiles the snapshot; on a
        // snapshot that failed `validate` these would repeat its findings.
        Ok(()) => violations.extend(check_compilable(&snapshot).err().unwrap_or_default()),
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

fn api(api: &model::Api, specs: &BTreeMap<&str, Arc<SpecSummary>>, upstreams: &mut Vec<v1::Upstream>) -> v1::Api {
    let mut path_prefix = api.path_prefix.clone();
    let mut upstream_name = api.upstream.clone();
    if let Some(spec) =
        api.openapi.as_ref().filter(|_| api.upstream.is_empty()).and_then(|o| specs.get(o.spec.as_str()))
    {
        if let Some(origin) = &spec.server_origin {
            upstream_name = spec_upstream(upstreams, api.openapi.as_ref().map_or("", |o| o.spec.as_str()), origin);
        }
        if path_prefix == "/"
            && let Some(base) = &spec.base_path
        {
            path_prefix = base.clone();
        }
    }
    v1::Api {
        name: api.name.clone(),
        hosts: api.hosts.iter().map(|h| h.to_ascii_lowercase()).collect(),
        path_prefix,
        paths: api.paths.clone(),
        methods: api.methods.clone(),
        strip_prefix: api.strip_prefix,
        preserve_host: api.preserve_host,
        forward_raw_path: api.forward_raw_path,
        allow_h2c_upgrade: api.allow_h2c_upgrade,
        upstream: upstream_name,
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

/// The upstream an API created from a spec alone forwards to, named after the
/// spec (`spec.<name>`, a name users cannot collide with by accident since
/// they pick their own) and shared by every API bound to that spec.
fn spec_upstream(upstreams: &mut Vec<v1::Upstream>, spec: &str, origin: &str) -> String {
    let name = format!("spec.{spec}");
    if !upstreams.iter().any(|u| u.name == name) {
        upstreams.push(v1::Upstream {
            name: name.clone(),
            targets: vec![v1::Target { url: origin.to_string(), weight: 1 }],
            ..Default::default()
        });
    }
    name
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
            jwks: p.jwks.clone().unwrap_or_default(),
            jwks_url: p.jwks_url.clone().unwrap_or_default(),
            consumer_claim: p.consumer_claim.clone().unwrap_or_default(),
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
            unhealthy_statuses: p.unhealthy_statuses.iter().map(|s| u32::from(s.0)).collect(),
        }),
        tls: upstream.tls.as_ref().map(|t| v1::UpstreamTls {
            ca_bundle_pem: t.ca_bundle.clone().unwrap_or_default(),
            insecure_skip_verify: t.insecure_skip_verify,
            sni: t.sni.clone().unwrap_or_default(),
            client_certificate: t.client_certificate.clone().unwrap_or_default(),
        }),
        http2: upstream.http2,
        retry_budget: upstream
            .retry_budget
            .as_ref()
            .map(|b| v1::RetryBudget { ratio: b.ratio, min_retries_per_second: b.min_retries_per_second }),
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

fn parse(spec: &model::Spec, specs: &SpecCache, violations: &mut Vec<Violation>) -> Option<Arc<SpecSummary>> {
    specs
        .parse(&spec.content)
        .map_err(|e| violations.push(violation(format!("/specs/{}/content", spec.name), e.to_string())))
        .ok()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Api, Spec};

    fn fruitshop() -> Spec {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/fruitshop/fruitshop-v2-2-0.oas.yml");
        Spec {
            name: "fruitshop".into(),
            content: std::fs::read_to_string(path).unwrap(),
            openapi_version: None,
            title: None,
        }
    }

    fn api_from_spec(name: &str, path_prefix: &str) -> Api {
        serde_json::from_value(serde_json::json!({
            "name": name, "path_prefix": path_prefix, "openapi": { "spec": "fruitshop" }
        }))
        .unwrap()
    }

    #[test]
    fn an_api_bound_to_a_spec_alone_forwards_to_its_first_server() {
        let secrets = SecretBox::from_key_material(&"00".repeat(32)).unwrap();
        let config = Config {
            specs: vec![fruitshop()],
            apis: vec![api_from_spec("shop", "/"), api_from_spec("shop-old", "/legacy")],
            ..Config::default()
        };
        let snapshot = build_snapshot(&config, &secrets, &[0; 32], &SpecCache::default()).unwrap();
        let shop = &snapshot.apis[0];
        assert_eq!((shop.path_prefix.as_str(), shop.upstream.as_str()), ("/shop/v2", "spec.fruitshop"));
        assert_eq!(snapshot.apis[1].path_prefix, "/legacy", "an explicit prefix is kept");
        assert_eq!(snapshot.upstreams.len(), 1, "one upstream shared by both APIs");
        assert_eq!(snapshot.upstreams[0].targets[0].url, "https://api.predic8.de");
        assert!(snapshot.apis.iter().all(|a| a.openapi.as_ref().is_some_and(|o| o.validate_requests)));
    }

    #[test]
    fn a_passive_check_without_statuses_counts_the_gateway_failures() {
        let secrets = SecretBox::from_key_material(&"00".repeat(32)).unwrap();
        let upstream = |check: serde_json::Value| -> model::Upstream {
            serde_json::from_value(serde_json::json!({
                "name": "backend", "targets": [{ "url": "http://127.0.0.1:9001" }], "passive_health_check": check,
            }))
            .unwrap()
        };
        let statuses = |check: serde_json::Value| {
            let config = Config { upstreams: vec![upstream(check)], ..Config::default() };
            let snapshot = build_snapshot(&config, &secrets, &[0; 32], &SpecCache::default()).unwrap();
            snapshot.upstreams[0].passive_health_check.as_ref().unwrap().unhealthy_statuses.clone()
        };
        assert_eq!(statuses(serde_json::json!({ "consecutive_failures": 3 })), [502, 503, 504]);
        assert_eq!(statuses(serde_json::json!({ "consecutive_failures": 3, "unhealthy_statuses": [] })), [0u32; 0]);
        assert_eq!(statuses(serde_json::json!({ "consecutive_failures": 3, "unhealthy_statuses": [500] })), [500]);
    }

    #[test]
    fn without_spec_or_upstream_the_api_is_refused() {
        let secrets = SecretBox::from_key_material(&"00".repeat(32)).unwrap();
        let api: Api = serde_json::from_value(serde_json::json!({ "name": "lost", "path_prefix": "/x" })).unwrap();
        let config = Config { apis: vec![api], ..Config::default() };
        let violations = build_snapshot(&config, &secrets, &[0; 32], &SpecCache::default()).unwrap_err();
        assert_eq!(violations[0].path, "/apis/lost/upstream");
    }

    #[test]
    fn a_malformed_jwks_is_a_violation_at_its_field() {
        let secrets = SecretBox::from_key_material(&"00".repeat(32)).unwrap();
        let ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let x = base64::Engine::encode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, ed.public_key_raw());
        let good = serde_json::json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "idp-1", "x": x}]}).to_string();
        let api = |name: &str, jwks: &str| -> Api {
            serde_json::from_value(serde_json::json!({
                "name": name, "path_prefix": format!("/{name}"), "upstream": "backend",
                "policies": [{ "cors": { "allow_origins": ["*"] } }, { "jwt": { "jwks": jwks, "consumer_claim": "email" } }],
            }))
            .unwrap()
        };
        let upstream: model::Upstream =
            serde_json::from_value(serde_json::json!({"name": "backend", "targets": [{"url": "http://127.0.0.1:1"}]}))
                .unwrap();
        let config = |apis| Config { upstreams: vec![upstream.clone()], apis, ..Config::default() };

        let snapshot =
            build_snapshot(&config(vec![api("ok", &good)]), &secrets, &[0; 32], &SpecCache::default()).unwrap();
        let Some(v1::policy::Kind::Jwt(jwt)) = &snapshot.apis[0].policies[1].kind else { panic!("jwt policy") };
        assert_eq!((jwt.jwks.as_str(), jwt.consumer_claim.as_str()), (good.as_str(), "email"));
        // A provider's document that also lists an encryption key is taken as
        // published, as the data planes take it.
        let with_enc = serde_json::json!({"keys": [
            {"kty": "OKP", "crv": "Ed25519", "kid": "idp-1", "x": x},
            {"kty": "RSA", "use": "enc", "kid": "enc-1", "n": "!!", "e": "AQAB"},
        ]})
        .to_string();
        build_snapshot(&config(vec![api("enc", &with_enc)]), &secrets, &[0; 32], &SpecCache::default()).unwrap();

        let mismatch =
            serde_json::json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "alg": "RS256", "x": x}]}).to_string();
        let bad = [
            ("notjson", "{\"keys\": "),
            ("nokeys", r#"{"keys": []}"#),
            ("badkey", r#"{"keys": [{"kty": "RSA", "n": "!!", "e": "AQAB"}]}"#),
            ("secret", r#"{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}"#),
            ("mismatch", &mismatch),
        ];
        let violations = build_snapshot(
            &config(bad.iter().map(|(n, j)| api(n, j)).collect()),
            &secrets,
            &[0; 32],
            &SpecCache::default(),
        )
        .unwrap_err();
        let mut paths: Vec<&str> = violations.iter().map(|v| v.path.as_str()).collect();
        paths.sort_unstable();
        assert_eq!(
            paths,
            [
                "/apis/badkey/policies/1/jwt/jwks",
                "/apis/mismatch/policies/1/jwt/jwks",
                "/apis/nokeys/policies/1/jwt/jwks",
                "/apis/notjson/policies/1/jwt/jwks",
                "/apis/secret/policies/1/jwt/jwks",
            ],
            "{violations:?}"
        );
    }
}
