//! Credentials are write-only: no response body, export or log line ever holds a plaintext secret, and specs are
//! checked at upload with the parser's reason on failure.

use reqwest::Method;
use serde_json::json;

use super::support::{LogCapture, Server, both, certificate_pem, fruitshop};

both!(secrets_never_come_back, secrets_never_come_back);
both!(specs_are_parsed_at_upload, specs_are_parsed_at_upload);

const PASSWORD: &str = "hunter2-plaintext-password";
const API_KEY: &str = "ak-plaintext-0123456789";
const JWT_SECRET: &str = "jwt-plaintext-hmac-secret";
const NEW_PASSWORD: &str = "second-plaintext-password";

async fn secrets_never_come_back(server: &Server) {
    let logs = LogCapture::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .finish();
    // This thread runs the server's tasks too (current-thread runtime), so their events are captured.
    let _guard = tracing::subscriber::set_default(subscriber);

    let (chain, key) = certificate_pem("api.example.com");
    let consumer = json!({
        "username": "alice",
        "basic_auth": { "password": PASSWORD },
        "api_keys": [{ "key": API_KEY }],
        "jwt": [{ "key": "issuer-a", "algorithm": "HS256", "secret": JWT_SECRET }],
    });
    let mut bodies = Vec::new();
    let created = server.post("/v1/consumers", &consumer).await;
    let stored = created.expect(201);
    assert!(stored["basic_auth"]["password_hash"].as_str().is_some_and(|h| h.starts_with("$argon2")), "{stored}");
    assert_eq!(stored["api_keys"][0]["key_digest"].as_str().map(str::len), Some(64));
    assert!(stored["jwt"][0]["secret_sealed"].is_string());
    bodies.push(created.text);

    let cert = server.post("/v1/certificates", &json!({ "name": "api", "chain": chain, "key": key })).await;
    let cert_body = cert.expect(201);
    assert!(cert_body["key_sealed"].is_string() && cert_body.get("key").is_none(), "{cert_body}");
    assert_eq!(cert_body["snis"], json!(["api.example.com"]));
    assert!(cert_body["not_after"].is_string());
    bodies.push(cert.text);

    let patched = server.patch("/v1/consumers/alice", &json!({ "basic_auth": { "password": NEW_PASSWORD } })).await;
    let patched_body = patched.expect(200);
    assert_ne!(patched_body["basic_auth"]["password_hash"], stored["basic_auth"]["password_hash"]);
    assert_eq!(patched_body["api_keys"], stored["api_keys"], "other credentials untouched");
    bodies.push(patched.text);

    // Errors about a credential do not repeat it either.
    let short = server
        .put("/v1/consumers/bob", &json!({ "basic_auth": { "password": 12345 }, "api_keys": [{ "key": "sh0rtk" }] }))
        .await;
    short.problem(422, "invalid-body");
    bodies.push(short.text);
    // The minimum length is published in the schema, so a short key is refused with the other field errors.
    let short = server.put("/v1/consumers/bob", &json!({ "api_keys": [{ "key": "sh0rtk" }] })).await;
    let problem = short.problem(422, "invalid-body");
    assert_eq!(problem["errors"][0]["pointer"], "/api_keys/0/key", "{problem}");
    bodies.push(short.text);

    for path in ["/v1/consumers", "/v1/consumers/alice", "/v1/certificates/api", "/v1/config", "/v1/config?format=yaml"]
    {
        bodies.push(server.get(path).await.text);
    }
    let latest = server.version().await;
    bodies.push(server.get(&format!("/v1/snapshots/{latest}")).await.text);
    bodies.push(server.raw(Method::GET, "/v1/snapshots", "application/json", "").await.text);

    let logged = logs.text();
    assert!(logged.contains("configuration committed"), "the capture works: {logged}");
    // One line of the private key's base64 is enough to spot it, whatever escaping the body uses.
    let key_body = key.lines().find(|l| !l.starts_with("-----")).unwrap_or("-----").to_string();
    for secret in [PASSWORD, API_KEY, JWT_SECRET, NEW_PASSWORD, "sh0rtk", key_body.as_str()] {
        for body in &bodies {
            assert!(!body.contains(secret), "a response holds a secret: {body}");
        }
        assert!(!logged.contains(secret), "a log line holds a secret");
    }
}

async fn specs_are_parsed_at_upload(server: &Server) {
    let created = server.post("/v1/specs", &json!({ "name": "fruitshop", "content": fruitshop() })).await.expect(201);
    assert_eq!(created["title"], "Fruit Shop API");
    assert_eq!(created["openapi_version"], "3.0.3");

    // YAML body, JSON document inside: both are accepted.
    let json_doc = json!({ "openapi": "3.1.0", "info": { "title": "Tiny", "version": "1" }, "paths": {} }).to_string();
    let yaml_body = format!("name: tiny\ncontent: '{json_doc}'\n");
    let tiny = server.raw(Method::POST, "/v1/specs", "application/yaml", yaml_body).await.expect(201);
    assert_eq!(tiny["title"], "Tiny");

    let swagger = server
        .post("/v1/specs", &json!({ "name": "old", "content": "swagger: '2.0'\ninfo: {title: x, version: '1'}\n" }))
        .await
        .problem(422, "invalid-config");
    assert_eq!(swagger["errors"][0]["pointer"], "/content", "{swagger}");
    assert!(swagger["errors"][0]["detail"].as_str().is_some_and(|d| d.contains("2.0")), "{swagger}");

    let broken =
        "openapi: 3.0.3\ninfo:\n  title: Broken\n  version: '1'\npaths:\n  /a:\n    get:\n      responses: 5\n";
    let problem =
        server.post("/v1/specs", &json!({ "name": "broken", "content": broken })).await.problem(422, "invalid-config");
    let reason = problem["errors"][0]["detail"].as_str().unwrap_or_default();
    assert!(reason.contains("OpenAPI") || reason.contains("responses"), "the parser's reason: {problem}");

    let not_yaml = server
        .post("/v1/specs", &json!({ "name": "garbage", "content": "openapi: [unclosed" }))
        .await
        .problem(422, "invalid-config");
    assert!(not_yaml["errors"][0]["detail"].as_str().is_some_and(|d| d.contains("YAML")), "{not_yaml}");
    server.get("/v1/specs/broken").await.problem(404, "not-found");
}
