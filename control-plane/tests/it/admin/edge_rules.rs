//! Settings a data plane would refuse, or that would let a client harm others, are refused at write with the
//! pointer of the field: an Argon2 password hash above the cost bounds both planes share (one login attempt would
//! cost its memory), CORS that allows any origin with credentials, and passive health checks counting answers that
//! are not the target's failures.

use serde_json::json;

use super::errors::pointers;
use super::support::{Server, both};

both!(costly_password_hashes_are_refused, costly_password_hashes_are_refused);
both!(credentialed_any_origin_is_refused, credentialed_any_origin_is_refused);
both!(passive_checks_count_only_5xx_answers, passive_checks_count_only_5xx_answers);

/// A well-formed Argon2id PHC string with the given parameters.
fn hash(params: &str) -> String {
    format!("$argon2id$v=19${params}$c2FsdHNhbHRzYWx0$aGFzaGhhc2hoYXNoaGFzaGhhc2hoYXNoaGFzaA")
}

async fn costly_password_hashes_are_refused(server: &Server) {
    let before = server.version().await;
    for (params, too_high) in
        [("m=4194304,t=1,p=1", "m=4194304"), ("m=19456,t=11,p=1", "t=11"), ("m=19456,t=2,p=5", "p=5")]
    {
        let consumer = json!({ "username": "mallory", "basic_auth": { "password_hash": hash(params) } });
        let problem = server.post("/v1/consumers", &consumer).await.problem(422, "invalid-config");
        assert_eq!(pointers(&problem), ["/consumers/mallory/basic_auth/password_hash"], "{params}: {problem}");
        assert!(problem.to_string().contains(too_high), "{params}: {problem}");
    }
    // The same through a whole-config import.
    let config = json!({ "consumers": [{ "username": "mallory", "basic_auth": { "password_hash": hash("m=4194304,t=1,p=1") } }] });
    let problem = server.put("/v1/config", &config).await.problem(422, "invalid-config");
    assert_eq!(pointers(&problem), ["/consumers/mallory/basic_auth/password_hash"], "{problem}");
    assert_eq!(server.version().await, before, "nothing committed");

    // At the bounds it is accepted, as is a password the control plane hashes itself.
    let consumer = json!({ "username": "ann", "basic_auth": { "password_hash": hash("m=65536,t=10,p=4") } });
    server.post("/v1/consumers", &consumer).await.expect(201);
    server
        .post("/v1/consumers", &json!({ "username": "bob", "basic_auth": { "password": "s3cret" } }))
        .await
        .expect(201);
}

async fn credentialed_any_origin_is_refused(server: &Server) {
    let before = server.backend().await;
    let api = json!({
        "name": "shop",
        "upstream": "backend",
        "policies": [{ "cors": { "allow_origins": ["https://shop.example", "*"], "allow_credentials": true } }],
    });
    let problem = server.post("/v1/apis", &api).await.problem(422, "invalid-config");
    assert_eq!(pointers(&problem), ["/apis/shop/policies/0/cors/allow_credentials"], "{problem}");
    assert_eq!(server.version().await, before, "nothing committed");

    // Listed origins with credentials, or any origin without them, are fine.
    let listed = json!({
        "name": "shop",
        "upstream": "backend",
        "policies": [{ "cors": { "allow_origins": ["https://shop.example"], "allow_credentials": true } }],
    });
    server.post("/v1/apis", &listed).await.expect(201);
    let open = json!({
        "name": "open",
        "path_prefix": "/open",
        "upstream": "backend",
        "policies": [{ "cors": { "allow_origins": ["*"] } }],
    });
    server.post("/v1/apis", &open).await.expect(201);
}

async fn passive_checks_count_only_5xx_answers(server: &Server) {
    let upstream = |statuses: serde_json::Value| {
        json!({
            "name": "backend",
            "targets": [{ "url": "http://127.0.0.1:9001" }],
            "passive_health_check": { "consecutive_failures": 3, "unhealthy_statuses": statuses },
        })
    };
    let before = server.version().await;
    // A 4xx is the client's doing, and 600 is no status: counting either would let clients eject targets.
    let problem = server.post("/v1/upstreams", &upstream(json!([503, 429, 600]))).await.problem(422, "invalid-body");
    assert_eq!(
        pointers(&problem),
        ["/passive_health_check/unhealthy_statuses/1", "/passive_health_check/unhealthy_statuses/2"],
        "{problem}"
    );
    assert_eq!(server.version().await, before, "nothing committed");

    // Left out, it is the gateway failures (502, 503, 504) and reads back as left out; set, it reads back as set.
    let plain = json!({
        "name": "backend",
        "targets": [{ "url": "http://127.0.0.1:9001" }],
        "passive_health_check": { "consecutive_failures": 3 },
    });
    server.post("/v1/upstreams", &plain).await.expect(201);
    let stored = server.get("/v1/upstreams/backend").await.expect(200);
    assert_eq!(stored["passive_health_check"], json!({ "consecutive_failures": 3, "ejection": "30s" }), "{stored}");
    server.put("/v1/upstreams/backend", &upstream(json!([500, 503]))).await.expect(200);
    let stored = server.get("/v1/upstreams/backend").await.expect(200);
    assert_eq!(stored["passive_health_check"]["unhealthy_statuses"], json!([500, 503]), "{stored}");
}
