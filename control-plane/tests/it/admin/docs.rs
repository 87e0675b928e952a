//! The OpenAPI document covers every mounted route (and every documented route is mounted), and the Swagger UI
//! is served from the binary, with no network.

use reqwest::Method;
use serde_json::Value;

use super::support::{Server, both, reply};

both!(openapi_documents_every_route, openapi_documents_every_route);

/// Every route the admin router mounts, besides the Swagger UI under `/docs`.
const MOUNTED: &[(&str, &str)] = &[
    ("GET", "/healthz"),
    ("GET", "/metrics"),
    ("GET", "/readyz"),
    ("GET", "/openapi.json"),
    ("GET", "/v1/config"),
    ("PUT", "/v1/config"),
    ("GET", "/v1/data-planes"),
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
