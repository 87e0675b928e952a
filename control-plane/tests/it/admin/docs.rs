//! The OpenAPI document covers every mounted route (and every documented route is mounted), the Swagger UI
//! and the dashboard are served from the binary, with no network, and `/v1/whoami` names a token's role.

use reqwest::Method;
use serde_json::Value;

use super::support::{Server, both, reply};

both!(openapi_documents_every_route, openapi_documents_every_route);

/// Every route the admin router mounts, besides the Swagger UI under `/docs` and the dashboard under `/ui`.
const MOUNTED: &[(&str, &str)] = &[
    ("GET", "/healthz"),
    ("GET", "/metrics"),
    ("GET", "/readyz"),
    ("GET", "/openapi.json"),
    ("GET", "/v1/config"),
    ("PUT", "/v1/config"),
    ("GET", "/v1/data-planes"),
    ("GET", "/v1/data-planes/{node_id}/telemetry"),
    ("GET", "/v1/upstream-health"),
    ("GET", "/v1/traffic"),
    ("GET", "/v1/snapshots"),
    ("GET", "/v1/snapshots/{version}"),
    ("POST", "/v1/snapshots/{version}/rollback"),
    ("GET", "/v1/apis"),
    ("POST", "/v1/apis"),
    ("GET", "/v1/apis/{name}"),
    ("PUT", "/v1/apis/{name}"),
    ("PATCH", "/v1/apis/{name}"),
    ("DELETE", "/v1/apis/{name}"),
    ("GET", "/v1/upstreams"),
    ("POST", "/v1/upstreams"),
    ("GET", "/v1/upstreams/{name}"),
    ("PUT", "/v1/upstreams/{name}"),
    ("PATCH", "/v1/upstreams/{name}"),
    ("DELETE", "/v1/upstreams/{name}"),
    ("GET", "/v1/consumers"),
    ("POST", "/v1/consumers"),
    ("GET", "/v1/consumers/{name}"),
    ("PUT", "/v1/consumers/{name}"),
    ("PATCH", "/v1/consumers/{name}"),
    ("DELETE", "/v1/consumers/{name}"),
    ("GET", "/v1/specs"),
    ("POST", "/v1/specs"),
    ("GET", "/v1/specs/{name}"),
    ("PUT", "/v1/specs/{name}"),
    ("PATCH", "/v1/specs/{name}"),
    ("DELETE", "/v1/specs/{name}"),
    ("GET", "/v1/certificates"),
    ("POST", "/v1/certificates"),
    ("GET", "/v1/certificates/{name}"),
    ("PUT", "/v1/certificates/{name}"),
    ("PATCH", "/v1/certificates/{name}"),
    ("DELETE", "/v1/certificates/{name}"),
    ("GET", "/v1/tokens"),
    ("POST", "/v1/tokens"),
    ("DELETE", "/v1/tokens/{name}"),
    ("GET", "/v1/whoami"),
];

async fn openapi_documents_every_route(server: &Server) {
    let document = reply(server.http.get(format!("{}/openapi.json", server.base))).await.json();
    assert_eq!(document["openapi"], "3.1.0");
    assert_eq!(document["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
    for schema in ["Api", "Upstream", "Consumer", "Spec", "Certificate", "Config", "Problem", "FieldError"] {
        assert!(document["components"]["schemas"][schema].is_object(), "schema {schema} is documented");
    }
    // deny_unknown_fields is part of the contract, and is what rejects unknown fields in bodies.
    assert_eq!(document["components"]["schemas"]["Upstream"]["additionalProperties"], false);

    let mut documented = Vec::new();
    for (path, item) in document["paths"].as_object().into_iter().flatten() {
        for (method, operation) in item.as_object().into_iter().flatten() {
            let method = method.to_uppercase();
            if !["GET", "PUT", "POST", "PATCH", "DELETE"].contains(&method.as_str()) {
                continue;
            }
            assert!(operation["responses"].as_object().is_some_and(|r| !r.is_empty()), "{method} {path}");
            assert!(operation["tags"].as_array().is_some_and(|t| !t.is_empty()), "{method} {path} has a tag");
            // Every write with a body documents the answers its body can get: 422 for bad fields (with their
            // pointers) whatever check finds them, 400 only for a body that does not parse.
            if operation.get("requestBody").is_some() {
                for status in ["400", "413", "415", "422"] {
                    assert!(operation["responses"][status].is_object(), "{method} {path} documents {status}");
                }
                let fields = operation["responses"]["422"]["description"].as_str().unwrap_or_default();
                assert!(fields.contains("pointer"), "{method} {path}: 422 is for fields: {fields}");
                let unparsable = operation["responses"]["400"]["description"].as_str().unwrap_or_default();
                assert!(!unparsable.contains("field"), "{method} {path}: 400 is not for fields: {unparsable}");
            }
            if path.starts_with("/v1/") {
                assert!(operation["responses"]["401"].is_object(), "{method} {path} documents 401");
            } else {
                assert_eq!(operation["security"], serde_json::json!([{}]), "{method} {path} is public");
            }
            documented.push((method, path.clone()));
        }
    }
    documented.sort();
    let mut mounted: Vec<(String, String)> = MOUNTED.iter().map(|(m, p)| (m.to_string(), p.to_string())).collect();
    mounted.sort();
    assert_eq!(documented, mounted, "the document and the mounted routes differ");

    // And each documented operation is really served: whatever it answers, it is not "no such route/method".
    for (method, path) in &documented {
        let concrete = path.replace("{name}", "no-such-name").replace("{version}", "1");
        let method = Method::from_bytes(method.as_bytes()).unwrap_or(Method::GET);
        let answer = server.call(method.clone(), &concrete, None).await;
        assert_ne!(answer.status.as_u16(), 405, "{method} {concrete}: {}", answer.text);
        if answer.status.as_u16() == 404 {
            let detail = answer.json()["detail"].as_str().unwrap_or_default().to_string();
            assert!(!detail.starts_with("route "), "{method} {concrete} is not mounted: {detail}");
        }
    }
}

#[tokio::test]
async fn swagger_ui_is_served_offline() {
    let server = Server::sqlite().await;
    // No token: the docs are public. `/docs` redirects to `/docs/`.
    let page = reply(server.http.get(format!("{}/docs", server.base))).await;
    assert_eq!(page.status.as_u16(), 200);
    assert!(page.header("content-type").is_some_and(|t| t.starts_with("text/html")));
    assert!(page.text.contains("swagger-ui"), "{}", page.text);
    // Everything the page loads comes from us, not a CDN.
    assert!(!page.text.contains("://cdn") && !page.text.contains("unpkg.com"), "{}", page.text);
    for asset in ["swagger-ui-bundle.js", "swagger-ui.css", "swagger-initializer.js"] {
        let served = reply(server.http.get(format!("{}/docs/{asset}", server.base))).await;
        assert_eq!(served.status.as_u16(), 200, "{asset}");
        assert!(!served.text.is_empty());
        if asset == "swagger-initializer.js" {
            assert!(served.text.contains("/openapi.json"), "the UI loads our document: {}", served.text);
        }
    }
    let _: Value = reply(server.http.get(format!("{}/openapi.json", server.base))).await.json();
    server.finish().await;
}

#[tokio::test]
async fn the_dashboard_is_served_offline_with_strict_headers() {
    let server = Server::sqlite().await;
    // No token: the files hold no data. `/ui` and `/ui/` are the same page.
    for path in ["/ui", "/ui/"] {
        let page = reply(server.http.get(format!("{}{path}", server.base))).await;
        assert_eq!(page.status.as_u16(), 200, "{path}");
        assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"));
        assert!(page.text.contains("/ui/app.js") && page.text.contains("/ui/style.css"), "{}", page.text);
        assert!(!page.text.contains("://"), "the page loads nothing from elsewhere: {}", page.text);
        let csp = page.header("content-security-policy").unwrap_or_default();
        for directive in ["default-src 'self'", "script-src 'self'", "frame-ancestors 'none'", "connect-src 'self'"] {
            assert!(csp.contains(directive), "{directive} in {csp}");
        }
        assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"), "{csp}");
        assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
        assert_eq!(page.header("x-frame-options"), Some("DENY"));
    }
    for (file, kind) in [
        ("app.js", "text/javascript"),
        ("api.js", "text/javascript"),
        ("dom.js", "text/javascript"),
        ("pages.js", "text/javascript"),
        ("snapshots.js", "text/javascript"),
        ("edit.js", "text/javascript"),
        ("style.css", "text/css"),
    ] {
        let served = reply(server.http.get(format!("{}/ui/{file}", server.base))).await;
        assert_eq!(served.status.as_u16(), 200, "{file}");
        assert!(served.header("content-type").is_some_and(|t| t.starts_with(kind)), "{file}");
        assert!(served.header("content-security-policy").is_some(), "{file}");
        assert!(!served.text.is_empty(), "{file}");
    }
    // Only the listed files: no other name, no way out of the list.
    for path in ["/ui/nope.js", "/ui/..%2fCargo.toml", "/ui/app.js/x"] {
        let missing = reply(server.http.get(format!("{}{path}", server.base))).await;
        missing.problem(404, "not-found");
    }
    // The dashboard's pages are not part of the API's description.
    let document = reply(server.http.get(format!("{}/openapi.json", server.base))).await.json();
    assert!(document["paths"].as_object().is_some_and(|paths| paths.keys().all(|p| !p.starts_with("/ui"))));
    server.finish().await;
}

#[tokio::test]
async fn whoami_names_the_token_and_its_role_never_the_token() {
    let server = Server::sqlite().await;
    let me = server.get("/v1/whoami").await.expect(200);
    assert_eq!(me, serde_json::json!({ "name": "admin-token", "role": "admin" }));
    let created =
        server.post("/v1/tokens", &serde_json::json!({ "name": "viewer", "role": "read-only" })).await.expect(201);
    let token = created["token"].as_str().unwrap_or_default().to_owned();
    let viewer = reply(server.http.get(format!("{}/v1/whoami", server.base)).bearer_auth(&token)).await;
    assert_eq!(viewer.json(), serde_json::json!({ "name": "viewer", "role": "read-only" }));
    assert!(!viewer.text.contains(&token));
    let nobody = reply(server.http.get(format!("{}/v1/whoami", server.base)).bearer_auth("wrong")).await;
    nobody.problem(401, "unauthorized");
    server.finish().await;
}
