//! Values no data plane could use (control characters, header names that are not HTTP tokens, server names and
//! probe paths the data plane's own parsers refuse) are refused at write time: 422, every bad field at its
//! pointer in one answer, nothing committed.

use serde_json::json;

use super::errors::pointers;
use super::support::{Server, both};

both!(unusable_values_are_refused_with_every_pointer, unusable_values_are_refused_with_every_pointer);

async fn unusable_values_are_refused_with_every_pointer(server: &Server) {
    let before = server.version().await;

    let upstream = json!({
        "name": "backend",
        "targets": [{ "url": "http://127.0.0.1:9001" }],
        "balance": "consistent_hash",
        "hash_on": { "source": "header", "name": "x-\u{0}user" },
        "health_check": { "path": "/health\u{0}" },
        "tls": { "sni": "api\u{0}.example.com" },
    });
    let problem = server.post("/v1/upstreams", &upstream).await.problem(422, "invalid-config");
    assert_eq!(
        pointers(&problem),
        ["/upstreams/backend/hash_on/name", "/upstreams/backend/health_check/path", "/upstreams/backend/tls/sni"],
        "{problem}"
    );
    assert_eq!(server.version().await, before, "nothing committed");

    // The same upstream with usable values is accepted, so the refusal above was about the values alone.
    let mut usable = upstream.clone();
    usable["hash_on"]["name"] = json!("x-user");
    usable["health_check"]["path"] = json!("/health?full=1");
    usable["tls"]["sni"] = json!("api.example.com");
    server.post("/v1/upstreams", &usable).await.expect(201);

    let api = json!({
        "name": "shop",
        "path_prefix": "/sh\u{0}op",
        "upstream": "backend",
        "policies": [
            { "api_key": { "header": "x-ü😀", "query_param": "key\u{1}" } },
            { "rate_limit": { "requests": 5, "per": "1s", "key": "header", "header": "x tenant" } },
            { "headers": { "request": { "set": { "x-ü😀": "1", "x-ok": "line\nbreak" }, "remove": ["x-\u{0}"] } } },
            { "basic_auth": { "realm": "shop\r\n" } },
        ],
    });
    let problem = server.post("/v1/apis", &api).await.problem(422, "invalid-config");
    assert_eq!(
        pointers(&problem),
        [
            "/apis/shop/path_prefix",
            "/apis/shop/policies/0/api_key/header",
            "/apis/shop/policies/0/api_key/query_param",
            "/apis/shop/policies/1/rate_limit/header",
            "/apis/shop/policies/2/headers/request/remove/0",
            "/apis/shop/policies/2/headers/request/set/x-ok",
            "/apis/shop/policies/2/headers/request/set/x-ü😀",
            "/apis/shop/policies/3/basic_auth/realm",
        ],
        "{problem}"
    );
    let details = problem["errors"].as_array().cloned().unwrap_or_default();
    assert!(
        details.iter().any(|e| e["detail"].as_str().is_some_and(|d| d.contains("not a valid header name"))),
        "{problem}"
    );

    let consumer = json!({
        "username": "alice",
        "jwt": [{ "key": "issuer\u{0}", "algorithm": "HS256", "secret": "0123456789abcdef" }],
    });
    let problem = server.post("/v1/consumers", &consumer).await.problem(422, "invalid-config");
    assert_eq!(pointers(&problem), ["/consumers/alice/jwt/0/key"], "{problem}");

    // A whole-config import reports all of them at once.
    let config = json!({ "upstreams": [upstream], "apis": [api], "consumers": [consumer] });
    let problem = server.put("/v1/config", &config).await.problem(422, "invalid-config");
    assert_eq!(pointers(&problem).len(), 12, "{problem}");

    assert_eq!(server.version().await, before + 1, "only the usable upstream was committed");
    server.get("/v1/apis/shop").await.problem(404, "not-found");
    server.get("/v1/consumers/alice").await.problem(404, "not-found");
}
