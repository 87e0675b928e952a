//! Error shapes: 401 without the token, every bad field listed with its pointer (422, whichever check finds it),
//! unknown fields, malformed (400) and unsupported (415) bodies, 404/405 for unknown routes and methods, and
//! nothing committed on any refusal.

use reqwest::Method;
use serde_json::{Value, json};

use super::support::{Server, both, reply};

both!(auth_is_required_and_probes_are_open, auth_is_required_and_probes_are_open);
both!(bad_bodies_list_every_field, bad_bodies_list_every_field);
both!(invalid_changes_are_422_and_commit_nothing, invalid_changes_are_422_and_commit_nothing);
both!(decoding_errors_have_pointers_and_come_together, decoding_errors_have_pointers_and_come_together);

async fn auth_is_required_and_probes_are_open(server: &Server) {
    for path in ["/healthz", "/readyz", "/openapi.json"] {
        let open = reply(server.http.get(format!("{}{path}", server.base))).await;
        assert_eq!(open.status.as_u16(), 200, "{path} needs no token");
    }
    let ready = reply(server.http.get(format!("{}/readyz", server.base))).await.json();
    assert_eq!(ready["status"], "ready");

    for request in [
        server.http.get(format!("{}/v1/apis", server.base)),
        server.http.get(format!("{}/v1/config", server.base)).bearer_auth("wrong-token"),
        server.http.post(format!("{}/v1/upstreams", server.base)).header("authorization", "Basic dXNlcjpwYXNz"),
        // Unknown routes too: without the token nothing tells what exists.
        server.http.get(format!("{}/v1/nothing-here", server.base)),
    ] {
        let denied = reply(request).await;
        denied.problem(401, "unauthorized");
        assert_eq!(denied.header("www-authenticate"), Some("Bearer"));
    }

    let unknown = server.get("/v1/nothing-here").await.problem(404, "not-found");
    assert!(unknown["detail"].as_str().is_some_and(|d| d.contains("/v1/nothing-here")), "{unknown}");
    let wrong_method = server.call(Method::DELETE, "/v1/apis", None).await;
    wrong_method.problem(405, "method-not-allowed");
    assert!(wrong_method.header("allow").is_some_and(|allow| allow.contains("GET") && allow.contains("POST")));
}

pub(super) fn pointers(problem: &Value) -> Vec<String> {
    let mut pointers: Vec<String> = problem["errors"]
        .as_array()
        .map(|errors| errors.iter().filter_map(|e| e["pointer"].as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    pointers.sort();
    pointers
}

async fn bad_bodies_list_every_field(server: &Server) {
    // Three bad fields and an unknown one: all four are reported, each at its own pointer.
    let bad = json!({
        "name": "backend",
        "targets": [{ "url": 5, "weight": "heavy" }],
        "balance": "sideways",
        "colour": "blue",
    });
    let problem = server.post("/v1/upstreams", &bad).await.problem(422, "invalid-body");
    assert_eq!(pointers(&problem), ["/balance", "/colour", "/targets/0/url", "/targets/0/weight"], "{problem}");
    let errors = problem["errors"].as_array().cloned().unwrap_or_default();
    assert!(errors.iter().all(|e| e["detail"].as_str().is_some_and(|d| !d.is_empty())), "{problem}");
    assert!(!problem.to_string().contains("heavy"), "values are not echoed: {problem}");

    // Missing required fields, nested unknown fields and type errors inside optional objects and policies.
    // (`upstream` may be left out when a spec is bound: the API then forwards to the spec's server.)
    let api = json!({
        "path_prefix": "/shop",
        "policies": [{ "rate_limit": { "requests": "lots", "per": "1m" } }],
        "openapi": { "spec": "fruitshop", "strict": true },
    });
    let problem = server.post("/v1/apis", &api).await.problem(422, "invalid-body");
    assert_eq!(pointers(&problem), ["/name", "/openapi/strict", "/policies/0/rate_limit/requests"], "{problem}");

    // Whole-config imports list problems across resources.
    let config = json!({
        "upstreams": [{ "name": "a", "targets": "none" }],
        "consumers": [{ "username": "bob", "basic_auth": { "passwd": "x" } }],
        "extras": [],
    });
    let problem = server.put("/v1/config", &config).await.problem(422, "invalid-body");
    assert_eq!(pointers(&problem), ["/consumers/0/basic_auth/passwd", "/extras", "/upstreams/0/targets"], "{problem}");

    // Not JSON at all; empty; a YAML document sent as YAML is fine but broken YAML is not.
    let malformed = server.raw(Method::POST, "/v1/upstreams", "application/json", "{\"name\": ").await;
    malformed.problem(400, "malformed-body");
    server.raw(Method::POST, "/v1/upstreams", "application/json", "").await.problem(400, "malformed-body");
    let yaml = "name: from-yaml\ntargets:\n  - url: http://127.0.0.1:9001\n";
    server.raw(Method::POST, "/v1/upstreams", "application/yaml", yaml).await.expect(201);
    server
        .raw(Method::POST, "/v1/upstreams", "application/yaml", "name: [unclosed")
        .await
        .problem(400, "malformed-body");

    let unsupported = server.raw(Method::POST, "/v1/upstreams", "text/plain", "name=backend").await;
    unsupported.problem(415, "unsupported-media-type");
    server
        .raw(Method::PUT, "/v1/config", "application/x-www-form-urlencoded", "a=b")
        .await
        .problem(415, "unsupported-media-type");
}

async fn invalid_changes_are_422_and_commit_nothing(server: &Server) {
    let before = server.version().await;

    let broken = json!({ "name": "shop", "upstream": "missing" });
    let problem = server.post("/v1/apis", &broken).await.problem(422, "invalid-config");
    let pointers = pointers(&problem);
    assert!(pointers.iter().any(|p| p == "/apis/shop/upstream"), "{problem}");
    assert_eq!(server.version().await, before, "nothing committed");
    server.get("/v1/apis/shop").await.problem(404, "not-found");

    // Values only the snapshot validation knows are wrong: a bad target URL.
    let problem = server
        .post("/v1/upstreams", &json!({ "name": "bad-url", "targets": [{ "url": "not a url" }] }))
        .await
        .problem(422, "invalid-config");
    assert_eq!(super::errors::pointers(&problem), ["/upstreams/bad-url/targets/0/url"], "{problem}");
    // A name outside the alphabet is refused by the published pattern, at its pointer in the body.
    let problem = server
        .post("/v1/upstreams", &json!({ "name": "bad name!", "targets": [{ "url": "http://127.0.0.1:1" }] }))
        .await
        .problem(422, "invalid-body");
    assert_eq!(super::errors::pointers(&problem), ["/name"], "{problem}");
    // So is one given in the URL of a PUT: the same status and pointer, as the name lands in the body there.
    let upstream = json!({ "targets": [{ "url": "http://127.0.0.1:1" }] });
    let problem = server.put("/v1/upstreams/bad%20name!", &upstream).await.problem(422, "invalid-body");
    assert_eq!(super::errors::pointers(&problem), ["/name"], "{problem}");
    assert_eq!(server.version().await, before, "nothing committed");

    // A PATCH that breaks a reference is refused the same way.
    server.backend().await;
    server.post("/v1/apis", &json!({ "name": "shop", "upstream": "backend" })).await.expect(201);
    let committed = server.version().await;
    server.patch("/v1/apis/shop", &json!({ "upstream": "gone" })).await.problem(422, "invalid-config");
    assert_eq!(server.version().await, committed);
    assert_eq!(server.get("/v1/apis/shop").await.expect(200)["upstream"], "backend");
}

/// What serde alone used to catch (with an empty pointer, one at a time): durations, integers written as `5.0`,
/// a second key in a policy item, control characters in names. Each is reported at its pointer, all in one answer.
async fn decoding_errors_have_pointers_and_come_together(server: &Server) {
    let before = server.backend().await;
    let api = json!({
        "name": "shop\u{0}",
        "upstream": "backend",
        "connect_timeout": "5 parsecs",
        "request_timeout": "1h 30m",
        "retries": 2.0,
        "policies": [
            { "rate_limit": { "requests": 5, "per": "soon" }, "extra": true },
            { "request_size_limit": { "max_bytes": 1e3 } },
        ],
    });
    let problem = server.post("/v1/apis", &api).await.problem(422, "invalid-body");
    assert_eq!(
        pointers(&problem),
        [
            "/connect_timeout",
            "/name",
            "/policies/0/extra",
            "/policies/0/rate_limit/per",
            "/policies/1/request_size_limit/max_bytes",
            "/retries",
        ],
        "{problem}"
    );

    let upstream = json!({ "name": "other", "targets": [{ "url": "http://127.0.0.1:9002", "weight": 5.0 }] });
    let problem = server.post("/v1/upstreams", &upstream).await.problem(422, "invalid-body");
    assert_eq!(pointers(&problem), ["/targets/0/weight"], "{problem}");

    // A duration that fits the grammar but not the clock is refused by the parser, still at its pointer.
    let api = json!({ "name": "shop", "upstream": "backend", "connect_timeout": "99999999999999999999999s" });
    let problem = server.post("/v1/apis", &api).await.problem(422, "invalid-body");
    assert_eq!(pointers(&problem), ["/connect_timeout"], "{problem}");

    // u32 fields refuse what does not fit 32 bits at the schema, which publishes the bound.
    let upstream = json!({
        "name": "other",
        "targets": [{ "url": "http://127.0.0.1:9002" }],
        "passive_health_check": { "consecutive_failures": 4_294_967_296_u64 },
    });
    let problem = server.post("/v1/upstreams", &upstream).await.problem(422, "invalid-body");
    assert_eq!(pointers(&problem), ["/passive_health_check/consecutive_failures"], "{problem}");
    assert_eq!(server.version().await, before, "nothing committed");
}
