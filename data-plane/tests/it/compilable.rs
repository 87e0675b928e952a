//! The control plane refuses what a data plane would refuse: generated
//! configurations that pass the checks the control plane runs before it
//! commits (`sluice_proto::validate` and `sluice_proto::check_compilable`)
//! compile on a data plane (`routing::compile`). Each generated field takes
//! good and bad values of the kinds a data plane's compile looks at: route
//! templates and prefixes, CIDRs, CA bundles, SNI names, certificates and
//! keys, consumer JWT keys, JWKS documents, rate-limit and API-key settings,
//! and the OpenAPI spec an API validates with (schema regexes, `$ref`s,
//! path templates, in request or response schemas).

use std::sync::OnceLock;

use proptest::prelude::*;
use proptest::sample::{select, subsequence};
use proptest::strategy::ValueTree;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use serde_json::json;
use sluice_data_plane::policy::PolicyContext;
use sluice_data_plane::routing;
use sluice_proto::v1::{self, policy::Kind};

/// Key material made once: RSA key generation is slow.
struct Material {
    ca_pem: String,
    chain_pem: String,
    key_pem: String,
    other_key_pem: String,
    rsa_public_pem: String,
    ec_public_pem: String,
    jwks: String,
    jwks_with_enc: String,
}

fn material() -> &'static Material {
    static MATERIAL: OnceLock<Material> = OnceLock::new();
    MATERIAL.get_or_init(|| make_material().unwrap_or_else(|e| panic!("making test key material: {e}")))
}

fn make_material() -> anyhow::Result<Material> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, "test ca");
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
    let leaf_key = KeyPair::generate()?;
    let leaf = CertificateParams::new(vec!["shop.example".to_string()])?.signed_by(&leaf_key, &*ca)?;
    let rsa = KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256)?;
    let ec = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let n = "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw";
    let sig = format!(r#"{{"kty":"RSA","kid":"sig","use":"sig","n":"{n}","e":"AQAB"}}"#);
    Ok(Material {
        ca_pem: ca.pem(),
        chain_pem: leaf.pem(),
        key_pem: leaf_key.serialize_pem(),
        other_key_pem: KeyPair::generate()?.serialize_pem(),
        rsa_public_pem: rsa.public_key_pem(),
        ec_public_pem: ec.public_key_pem(),
        jwks: format!(r#"{{"keys":[{sig}]}}"#),
        jwks_with_enc: format!(r#"{{"keys":[{sig},{{"kty":"RSA","kid":"enc","use":"enc","n":"!!","e":"AQAB"}}]}}"#),
    })
}

/// A value from the list, by index, so strategies stay `Clone` and cheap.
fn one_of(values: &'static [&'static str]) -> impl Strategy<Value = String> {
    select(values).prop_map(str::to_string)
}

fn upstream(name: &'static str) -> impl Strategy<Value = v1::Upstream> {
    let tls = (0..4usize, one_of(&["", "api.internal", "bad name!"]), any::<bool>(), one_of(&["", "shop"]));
    (prop::option::weighted(0.25, tls), one_of(&["http://127.0.0.1:9", "https://127.0.0.1:9"])).prop_map(
        move |(tls, url)| {
            let m = material();
            v1::Upstream {
                name: name.into(),
                targets: vec![v1::Target { url, weight: 1 }],
                tls: tls.map(|(bundle, sni, insecure, client_certificate)| v1::UpstreamTls {
                    ca_bundle_pem: ["", "not a certificate", m.ca_pem.as_str(), m.chain_pem.as_str()][bundle].into(),
                    sni,
                    insecure_skip_verify: insecure,
                    client_certificate,
                }),
                ..Default::default()
            }
        },
    )
}

fn policy() -> impl Strategy<Value = Kind> {
    let cidrs =
        || subsequence(&["10.0.0.0/8", "::1", "::ffff:10.0.0.0/104", "::ffff:10.0.0.0/8", "10.0.0.0/33"][..], 0..3);
    let algorithms = subsequence(&["RS256", "HS256", "ES256", "none"][..], 0..2);
    prop_oneof![
        (cidrs(), cidrs()).prop_map(|(allow, deny)| Kind::IpRestriction(v1::IpRestriction {
            allow: allow.into_iter().map(str::to_string).collect(),
            deny: deny.into_iter().map(str::to_string).collect(),
        })),
        (0..6usize, algorithms).prop_map(|(jwks, algorithms)| {
            let m = material();
            let jwks = [
                "",
                m.jwks.as_str(),
                m.jwks_with_enc.as_str(),
                "not json",
                r#"{"keys":[]}"#,
                r#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#,
            ][jwks];
            Kind::Jwt(v1::JwtAuth {
                jwks: jwks.into(),
                algorithms: algorithms.into_iter().map(str::to_string).collect(),
                ..Default::default()
            })
        }),
        (one_of(&["", "x-key", "bad header"]), select(&[0u64, 1, 10, 5_000_000_000][..]), select(&[0u64, 1, 60][..]))
            .prop_map(|(header, requests, period_seconds)| Kind::RateLimit(v1::RateLimit {
                requests,
                period_seconds,
                key: if header.is_empty() { 0 } else { v1::RateLimitKey::Header as i32 },
                header,
                ..Default::default()
            })),
        (one_of(&["", "x-api-key", "bad header"]), one_of(&["", "key"]))
            .prop_map(|(header, query_param)| Kind::ApiKey(v1::ApiKeyAuth { header, query_param })),
    ]
}

fn api(name: &'static str) -> impl Strategy<Value = v1::Api> {
    // Mostly an API of its own; sometimes on routes the others may claim too.
    let shared = prop_oneof![3 => Just(Vec::new()), 1 => subsequence(&["/t/{id}", "/t/{sku}", "/t/{*rest}", "/t/x", "/a/{id}/b", "/a/b/{x}"][..], 1..3)];
    (
        prop_oneof![3 => Just(format!("/{name}")), 1 => one_of(&["/", "/t", "/t/", "/a", "/a/b"])],
        shared,
        subsequence(&["GET", "POST"][..], 0..3),
        subsequence(&["a.example", "*.example"][..], 0..2),
        prop::option::weighted(0.35, policy()),
        one_of(&["one", "two"]),
    )
        .prop_map(move |(path_prefix, paths, methods, hosts, policy, upstream)| v1::Api {
            name: name.into(),
            hosts: hosts.into_iter().map(str::to_string).collect(),
            // Shared templates lie under `/a` or `/t`: an own prefix cannot hold them.
            path_prefix: if paths.is_empty() || path_prefix.len() <= 2 { path_prefix } else { "/".into() },
            paths: paths.into_iter().map(str::to_string).collect(),
            methods: methods.into_iter().map(str::to_string).collect(),
            upstream,
            policies: policy.into_iter().map(|kind| v1::Policy { kind: Some(kind) }).collect(),
            ..Default::default()
        })
}

fn consumer() -> impl Strategy<Value = v1::Consumer> {
    let key = prop_oneof![3 => 2..4usize, 1 => 0..2usize];
    (one_of(&["HS256", "RS256", "ES256"]), key, prop_oneof![3 => Just("s3cret".to_string()), 1 => Just(String::new())])
        .prop_map(|(algorithm, key, secret)| {
            let m = material();
            v1::Consumer {
                username: "ann".into(),
                jwt_credentials: vec![v1::JwtCredential {
                    key: "ann-key".into(),
                    algorithm,
                    secret,
                    public_key_pem: ["", "not a PEM key", m.rsa_public_pem.as_str(), m.ec_public_pem.as_str()][key]
                        .into(),
                }],
                ..Default::default()
            }
        })
}

fn certificate() -> impl Strategy<Value = v1::Certificate> {
    let mostly_good = || prop_oneof![3 => Just(0usize), 1 => 1..3usize];
    (mostly_good(), mostly_good()).prop_map(|(chain, key)| {
        let m = material();
        v1::Certificate {
            name: "shop".into(),
            chain_pem: [m.chain_pem.as_str(), "not a certificate", m.ca_pem.as_str()][chain].into(),
            private_key_pem: [m.key_pem.as_str(), m.other_key_pem.as_str(), "not a key"][key].into(),
            snis: vec!["shop.example".into()],
            ..Default::default()
        }
    })
}

/// A spec whose one schema is good or not (its regex, its `$ref`), on a
/// path template that routes or not, in the request or in a response (only
/// compiled when the API validates responses).
fn spec() -> impl Strategy<Value = v1::Spec> {
    (
        one_of(&["^[a-z]+$", "^[a-z]+$", "(["]),
        one_of(&["#/components/schemas/Item", "#/components/schemas/Item", "#/components/schemas/Missing"]),
        one_of(&["/items/{id}", "/items/{id}", "/items/{id"]),
        any::<bool>(),
    )
        .prop_map(|(pattern, reference, template, in_response)| {
            let content = json!({ "application/json": { "schema": { "$ref": reference } } });
            let operation = if in_response {
                json!({ "responses": { "200": { "description": "ok", "content": content } } })
            } else {
                json!({ "requestBody": { "content": content }, "responses": { "200": { "description": "ok" } } })
            };
            let document = json!({
                "openapi": "3.1.0",
                "info": { "title": "t", "version": "1" },
                "components": { "schemas": { "Item": { "type": "string", "pattern": pattern } } },
                "paths": { template: { "post": operation } },
            });
            v1::Spec { name: "s".into(), json: document.to_string() }
        })
}

fn snapshot() -> impl Strategy<Value = v1::Snapshot> {
    (
        upstream("one"),
        upstream("two"),
        (api("a1"), api("a2"), api("a3")),
        prop::option::weighted(0.5, consumer()),
        prop::option::weighted(0.5, certificate()),
        prop::option::weighted(0.3, (spec(), any::<bool>(), any::<bool>())),
    )
        .prop_map(|(one, two, (mut a1, a2, a3), consumer, certificate, spec)| {
            let specs = match spec {
                Some((spec, validate_requests, validate_responses)) => {
                    a1.openapi =
                        Some(v1::OpenApiBinding { spec: spec.name.clone(), validate_requests, validate_responses });
                    vec![spec]
                }
                None => Vec::new(),
            };
            let mut snapshot = v1::Snapshot {
                version: 1,
                apis: vec![a1, a2, a3],
                upstreams: vec![one, two],
                consumers: consumer.into_iter().collect(),
                certificates: certificate.into_iter().collect(),
                specs,
                api_key_hmac_key: vec![7; 32],
                ..Default::default()
            };
            sluice_proto::canonicalize(&mut snapshot);
            snapshot
        })
}

fn accepted_by_the_control_plane(snapshot: &v1::Snapshot) -> bool {
    sluice_proto::validate(snapshot).is_ok() && sluice_proto::check_compilable(snapshot).is_ok()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn what_the_control_plane_accepts_compiles_on_a_data_plane(snapshot in snapshot()) {
        if accepted_by_the_control_plane(&snapshot) {
            let compiled = routing::compile(&snapshot, None, &PolicyContext::local());
            prop_assert!(compiled.is_ok(), "accepted but not compiled: {:?}\n{snapshot:#?}", compiled.err());
        }
    }
}

/// The generator is not vacuous: it makes snapshots of both kinds, and the
/// ones from the issue's findings are refused at the path of the bad field.
#[test]
fn the_findings_are_refused_where_they_are() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let generated: Vec<v1::Snapshot> = (0..200).map(|_| snapshot().new_tree(&mut runner).unwrap().current()).collect();
    let accepted = generated.iter().filter(|s| accepted_by_the_control_plane(s)).count();
    assert!(accepted > 20 && accepted < 180, "{accepted} of 200 accepted");

    let base = || v1::Snapshot {
        upstreams: vec![v1::Upstream {
            name: "u".into(),
            targets: vec![v1::Target { url: "http://127.0.0.1:9".into(), weight: 1 }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let route = |name: &str, path: &str| v1::Api {
        name: name.into(),
        path_prefix: "/t".into(),
        paths: vec![path.into()],
        upstream: "u".into(),
        ..Default::default()
    };
    let refused = |snapshot: &v1::Snapshot| -> Vec<String> {
        assert_eq!(sluice_proto::validate(snapshot), Ok(()));
        let found = sluice_proto::check_compilable(snapshot).err().unwrap_or_default();
        assert!(routing::compile(snapshot, None, &PolicyContext::local()).is_err(), "the data plane takes it");
        found.into_iter().map(|v| v.path).collect()
    };

    let mut templates = base();
    templates.apis = vec![route("by-id", "/t/{id}"), route("by-sku", "/t/{sku}")];
    assert_eq!(refused(&templates), ["/apis/by-sku/paths/0"]);

    let mut bundle = base();
    bundle.upstreams[0].tls = Some(v1::UpstreamTls { ca_bundle_pem: "not a certificate".into(), ..Default::default() });
    assert_eq!(refused(&bundle), ["/upstreams/u/tls/ca_bundle"]);

    let mut jwt = base();
    jwt.apis = vec![v1::Api {
        policies: vec![v1::Policy { kind: Some(Kind::Jwt(v1::JwtAuth::default())) }],
        ..route("a", "/t/x")
    }];
    jwt.consumers = vec![v1::Consumer {
        username: "ann".into(),
        jwt_credentials: vec![v1::JwtCredential {
            key: "k".into(),
            algorithm: "RS256".into(),
            public_key_pem: "not a PEM key".into(),
            ..Default::default()
        }],
        ..Default::default()
    }];
    assert_eq!(refused(&jwt), ["/consumers/ann/jwt/0/public_key"]);

    // A schema regex that does not compile, in the spec an API validates with.
    let mut spec = base();
    let document = json!({
        "openapi": "3.0.3",
        "info": { "title": "t", "version": "1" },
        "paths": { "/items": { "post": {
            "requestBody": { "content": { "application/json": { "schema": { "type": "string", "pattern": "([" } } } },
            "responses": { "200": { "description": "ok" } },
        } } },
    });
    spec.specs = vec![v1::Spec { name: "s".into(), json: document.to_string() }];
    spec.apis = vec![v1::Api {
        openapi: Some(v1::OpenApiBinding { spec: "s".into(), validate_requests: true, validate_responses: false }),
        ..route("a", "/t/x")
    }];
    assert_eq!(refused(&spec), ["/specs/s/content/paths/~1items/post/requestBody/content/application~1json/schema"]);
}
