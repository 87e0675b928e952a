//! CRUD of every named collection, pagination, name conflicts and deletes of referenced resources.

use serde_json::{Value, json};

use super::support::{Server, both, certificate_pem, fruitshop};

both!(crud_of_every_collection, crud_of_every_collection);
both!(pagination_follows_next, pagination_follows_next);
both!(name_conflicts_and_referenced_deletes, name_conflicts_and_referenced_deletes);

fn upstream(name: &str) -> Value {
    json!({ "name": name, "targets": [{ "url": "http://127.0.0.1:9001" }] })
}

/// Creates, reads, lists, replaces, patches and deletes `body` in `collection`; `patch` must change `field`.
/// Fields are compared as stored: write-only input comes back in its hashed or sealed form, if at all.
async fn round_trip(server: &Server, collection: &str, name_field: &str, body: Value, patch: Value, field: &str) {
    let name = body[name_field].as_str().unwrap_or_default().to_string();
    let item = format!("/v1/{collection}/{name}");

    let created = server.post(&format!("/v1/{collection}"), &body).await;
    let created_body = created.expect(201);
    assert_eq!(created.header("location"), Some(item.as_str()), "{collection}");
    assert!(created.header("sluice-config-version").is_some());
    assert_eq!(created_body[name_field], name.as_str());

    assert_eq!(server.get(&item).await.expect(200), created_body, "{collection}: GET equals the POST answer");
    let listed = server.get(&format!("/v1/{collection}")).await.expect(200);
    assert!(listed["items"].as_array().is_some_and(|items| items.iter().any(|i| i[name_field] == name.as_str())));
    assert_eq!(listed["next"], Value::Null);

    // PUT with the name left out: taken from the URL.
    let mut replacement = body.clone();
    if let Some(object) = replacement.as_object_mut() {
        object.remove(name_field);
    }
    let replaced = server.put(&item, &replacement).await.expect(200);
    assert_eq!(replaced[name_field], name.as_str());

    let patched = server.patch(&item, &patch).await.expect(200);
    assert_ne!(patched[field], created_body[field], "{collection}: PATCH changed `{field}`");
    assert_eq!(patched[name_field], name.as_str());
    assert_eq!(server.get(&item).await.expect(200), patched);

    let deleted = server.delete(&item).await;
    deleted.expect(204);
    assert!(deleted.header("sluice-config-version").is_some());
    server.get(&item).await.problem(404, "not-found");
    server.delete(&item).await.problem(404, "not-found");
}

async fn crud_of_every_collection(server: &Server) {
    round_trip(server, "upstreams", "name", upstream("backend"), json!({ "balance": "least_connections" }), "balance")
        .await;

    server.post("/v1/upstreams", &upstream("shop-backend")).await.expect(201);
    round_trip(
        server,
        "apis",
        "name",
        json!({ "name": "shop", "path_prefix": "/shop", "upstream": "shop-backend" }),
        json!({ "methods": ["GET"] }),
        "methods",
    )
    .await;

    round_trip(
        server,
        "consumers",
        "username",
        json!({ "username": "alice", "basic_auth": { "password": "correct horse" } }),
        json!({ "api_keys": [{ "key": "0123456789abcdef" }] }),
        "api_keys",
    )
    .await;

    let spec = json!({ "name": "fruitshop", "content": fruitshop() });
    let spec_patch = json!({ "content": fruitshop().replace("Fruit Shop API", "Fruit Shop API (patched)") });
    round_trip(server, "specs", "name", spec, spec_patch, "content").await;

    let (chain, key) = certificate_pem("api.example.com");
    round_trip(
        server,
        "certificates",
        "name",
        json!({ "name": "api-cert", "chain": chain, "key": key }),
        json!({ "snis": ["www.example.com"] }),
        "snis",
    )
    .await;

    // PUT creates a missing name, and refuses a body naming another one.
    let created = server.put("/v1/upstreams/fresh", &upstream("fresh")).await;
    created.expect(201);
    assert_eq!(created.header("location"), Some("/v1/upstreams/fresh"));
    let mismatch = server.put("/v1/upstreams/fresh", &upstream("other")).await.problem(422, "invalid-body");
    assert_eq!(mismatch["errors"][0]["pointer"], "/name");
}

async fn pagination_follows_next(server: &Server) {
    for i in 0..5 {
        server.post("/v1/upstreams", &upstream(&format!("u{i}"))).await.expect(201);
    }
    let mut seen = Vec::new();
    let mut path = "/v1/upstreams?limit=2".to_string();
    let mut pages = 0;
    loop {
        let page = server.get(&path).await.expect(200);
        pages += 1;
        let items = page["items"].as_array().cloned().unwrap_or_default();
        assert!(items.len() <= 2);
        seen.extend(items.iter().filter_map(|i| i["name"].as_str().map(str::to_string)));
        match page["next"].as_str() {
            Some(next) => path = format!("/v1/upstreams?limit=2&after={next}"),
            None => break,
        }
    }
    assert_eq!(seen, ["u0", "u1", "u2", "u3", "u4"]);
    assert_eq!(pages, 3);

    // Out-of-range limits are capped, not refused; a non-number is a 400 problem.
    assert_eq!(server.get("/v1/upstreams?limit=0").await.expect(200)["items"].as_array().map(Vec::len), Some(1));
    assert_eq!(server.get("/v1/upstreams?limit=5000").await.expect(200)["items"].as_array().map(Vec::len), Some(5));
    server.get("/v1/upstreams?limit=many").await.problem(400, "http-error");
}

async fn name_conflicts_and_referenced_deletes(server: &Server) {
    let (chain, key) = certificate_pem("backend.internal");
    server.post("/v1/certificates", &json!({ "name": "client", "chain": chain, "key": key })).await.expect(201);
    let mut backend = upstream("backend");
    backend["tls"] = json!({ "client_certificate": "client" });
    server.post("/v1/upstreams", &backend).await.expect(201);
    server.post("/v1/specs", &json!({ "name": "fruitshop", "content": fruitshop() })).await.expect(201);
    for name in ["shop", "admin"] {
        let api = json!({
            "name": name,
            "path_prefix": format!("/{name}"),
            "upstream": "backend",
            "openapi": { "spec": "fruitshop" },
        });
        server.post("/v1/apis", &api).await.expect(201);
    }

    let conflict = server.post("/v1/upstreams", &upstream("backend")).await.problem(409, "conflict");
    assert!(conflict["detail"].as_str().is_some_and(|d| d.contains("backend")), "{conflict}");

    let referenced = server.delete("/v1/upstreams/backend").await.problem(409, "referenced");
    assert_eq!(referenced["referrers"], json!(["apis/admin", "apis/shop"]));
    let referenced = server.delete("/v1/specs/fruitshop").await.problem(409, "referenced");
    assert_eq!(referenced["referrers"], json!(["apis/admin", "apis/shop"]));
    let referenced = server.delete("/v1/certificates/client").await.problem(409, "referenced");
    assert_eq!(referenced["referrers"], json!(["upstreams/backend"]));

    // Once the referrers are gone, the deletes go through.
    for path in
        ["/v1/apis/shop", "/v1/apis/admin", "/v1/upstreams/backend", "/v1/specs/fruitshop", "/v1/certificates/client"]
    {
        server.delete(path).await.expect(204);
    }
}
