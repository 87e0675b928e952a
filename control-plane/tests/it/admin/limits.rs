//! Bodies built to be expensive: nesting deep enough to make a parser slow is refused before any parser runs,
//! bodies are parsed on the blocking pool so the API keeps answering while they are, and a spec larger than the
//! limit is refused.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use sluice_control_plane::admin::ParseHook;

use super::support::{Server, both, reply};

both!(deep_bodies_are_refused_before_parsing, deep_bodies_are_refused_before_parsing);
both!(specs_over_the_size_limit_are_refused, specs_over_the_size_limit_are_refused);

async fn deep_bodies_are_refused_before_parsing(server: &Server) {
    let before = server.version().await;
    // 100,000 levels in a 200 KB body, in each shape a parser nests: YAML flow, YAML block, JSON.
    let flow = format!("upstreams: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
    let block = format!("upstreams:\n{}x\n", "- ".repeat(100_000));
    let json = format!("{{\"upstreams\": {}{}}}", "[".repeat(100_000), "]".repeat(100_000));
    for (content_type, body) in [("application/yaml", flow), ("application/yaml", block), ("application/json", json)] {
        let problem = server.raw(Method::PUT, "/v1/config", content_type, body).await.problem(422, "body-limit");
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(detail.contains("nested"), "{content_type}: {problem}");
    }
    // The same through a single resource.
    let deep = format!("name: a\ntargets: {}\n", "{x: ".repeat(10_000));
    server.raw(Method::POST, "/v1/upstreams", "application/yaml", deep).await.problem(422, "body-limit");
    assert_eq!(server.version().await, before, "nothing committed");

    // Ordinary nesting (a spec-bound API with policies, headers and flow collections) is well within the limit.
    let yaml = "name: shop\nupstream: backend\npolicies:\n  - headers: { request: { set: { x-a: \"[[[[\" } } }\n";
    server.backend().await;
    server.raw(Method::POST, "/v1/apis", "application/yaml", yaml).await.expect(201);
}

/// Holds every body's parse until opened, counting the parses that reached it.
#[derive(Default)]
struct Gate {
    entered: AtomicUsize,
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn hook(self: &Arc<Self>) -> ParseHook {
        let gate = self.clone();
        Arc::new(move || {
            gate.entered.fetch_add(1, Ordering::SeqCst);
            let mut open = gate.open.lock().unwrap_or_else(|e| e.into_inner());
            while !*open {
                open = gate.opened.wait(open).unwrap_or_else(|e| e.into_inner());
            }
        })
    }

    fn open(&self) {
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.opened.notify_all();
    }
}

#[tokio::test]
async fn health_answers_while_bodies_are_parsed_sqlite() {
    let gate = Arc::new(Gate::default());
    let server = Server::sqlite_with_parse_hook(Some(gate.hook())).await;
    health_answers_while_bodies_are_parsed(&server, &gate).await;
    server.finish().await;
}

#[tokio::test]
async fn health_answers_while_bodies_are_parsed_postgres() {
    let gate = Arc::new(Gate::default());
    let Some(server) = Server::postgres_with_parse_hook(Some(gate.hook())).await else { return };
    health_answers_while_bodies_are_parsed(&server, &gate).await;
    server.finish().await;
}

/// The test's runtime has a single thread, which also serves the API: if a body were parsed on it, the first held
/// parse would stop everything and the second would never start. Held on the blocking pool, all four are in
/// progress at once and the probes still answer.
async fn health_answers_while_bodies_are_parsed(server: &Server, gate: &Gate) {
    const BODIES: usize = 4;
    let mut requests = Vec::new();
    for i in 0..BODIES {
        // About 60 KB each.
        let targets: Vec<Value> =
            (0..1500).map(|port| json!({ "url": format!("http://127.0.0.1:{}", 10_000 + port) })).collect();
        let body = json!({ "name": format!("big-{i}"), "targets": targets });
        let post = server.http.post(format!("{}/v1/upstreams", server.base)).bearer_auth(super::support::TOKEN);
        requests.push(tokio::spawn(reply(post.json(&body))));
    }
    sluice_testkit::eventually("every body held in its parse", Duration::from_millis(10), || async {
        gate.entered.load(Ordering::SeqCst) == BODIES
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));

    for path in ["/healthz", "/readyz"] {
        let probe = reply(server.http.get(format!("{}{path}", server.base))).await;
        assert_eq!(probe.status.as_u16(), 200, "{path} answers while {BODIES} bodies are being parsed");
    }
    assert_eq!(server.get("/v1/upstreams").await.expect(200)["items"], json!([]), "reads answer too");
    assert!(requests.iter().all(|r| !r.is_finished()), "the parses were still held");

    gate.open();
    for request in requests {
        let created = request.await.unwrap_or_else(|e| panic!("request task: {e}"));
        assert_eq!(created.status.as_u16(), 201, "{}", created.text);
    }
    let listed = server.get("/v1/upstreams").await.expect(200);
    assert_eq!(listed["items"].as_array().map(Vec::len), Some(BODIES));
}

async fn specs_over_the_size_limit_are_refused(server: &Server) {
    let limit = sluice_control_plane::specs::DEFAULT_MAX_SPEC_BYTES;
    let before = server.version().await;
    // A valid document padded with a comment to one byte over the limit: refused for its size alone.
    let spec = super::support::fruitshop();
    let padded = format!("{spec}\n#{}\n", "x".repeat(limit - spec.len() - 2));
    assert_eq!(padded.len(), limit + 1);
    let problem = server.post("/v1/specs", &json!({ "name": "big", "content": padded })).await;
    let problem = problem.problem(422, "invalid-config");
    assert_eq!(super::errors::pointers(&problem), ["/content"], "{problem}");
    let detail = problem["errors"][0]["detail"].as_str().unwrap_or_default();
    assert!(detail.contains(&format!("{}", limit + 1)) && detail.contains("--max-spec-bytes"), "{problem}");

    let config = json!({ "specs": [{ "name": "big", "content": padded }] });
    let problem = server.put("/v1/config", &config).await.problem(422, "invalid-config");
    assert_eq!(super::errors::pointers(&problem), ["/specs/big/content"], "{problem}");
    assert_eq!(server.version().await, before, "nothing committed");

    // At the limit it is accepted.
    let at_limit = format!("{spec}\n#{}", "x".repeat(limit - spec.len() - 2));
    assert_eq!(at_limit.len(), limit);
    server.post("/v1/specs", &json!({ "name": "big", "content": at_limit })).await.expect(201);
}
