//! The `openapi` policy through a real proxy: the Fruitshop spec (Membrane's
//! benchmark) bound to an API, the in-process data plane of `gateway`, and
//! an upstream that records every request, so each case checks both the
//! client's answer and that a rejected request never reached the upstream.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::Value;
use sluice_proto::v1;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::gateway::Gateway;
use crate::support::serve_http1;

/// An upstream that plays the Fruitshop: records (method, path, body) and
/// answers with a product, or with a broken one for `/products/8`.
struct Shop {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<(String, String, Bytes)>>>,
    task: JoinHandle<()>,
}

impl Shop {
    async fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let seen: Arc<Mutex<Vec<(String, String, Bytes)>>> = Arc::default();
        let log = seen.clone();
        let task = serve_http1(listener, move |req| answer(req, log.clone()));
        Ok(Shop { addr, seen, task })
    }

    fn seen(&self) -> Vec<(String, String, Bytes)> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for Shop {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    req: http::Request<Incoming>,
    log: Arc<Mutex<Vec<(String, String, Bytes)>>>,
) -> Result<http::Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let (status, product): (u16, &'static [u8]) = match (parts.method.as_str(), path.ends_with("/products/8")) {
        (_, true) => (200, br#"{"name":"Mango","price":"cheap"}"#),
        ("POST", _) => (201, br#"{"id":9,"name":"Mangos","price":2.79}"#),
        _ => (200, br#"{"id":7,"name":"Mango","price":2.5}"#),
    };
    if let Ok(mut log) = log.lock() {
        log.push((parts.method.to_string(), path, body));
    }
    let response = http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(product)));
    Ok(response.unwrap_or_default())
}

fn fruitshop_json() -> Result<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/fruitshop/fruitshop-v2-2-0.oas.yml");
    let yaml = std::fs::read_to_string(path).context("reading the Fruitshop fixture")?;
    let doc: Value = yaml_serde::from_str(&yaml)?;
    Ok(doc.to_string())
}

fn snapshot(shop: &Shop, spec_json: String) -> v1::Snapshot {
    let api = v1::Api {
        name: "shop".into(),
        path_prefix: "/shop/v2".into(),
        upstream: "backend".into(),
        openapi: Some(v1::OpenApiBinding {
            spec: "fruitshop".into(),
            validate_requests: true,
            validate_responses: true,
        }),
        ..Default::default()
    };
    v1::Snapshot {
        version: 1,
        apis: vec![api],
        upstreams: vec![v1::Upstream {
            name: "backend".into(),
            targets: vec![v1::Target { url: format!("http://{}", shop.addr), weight: 1 }],
            ..Default::default()
        }],
        specs: vec![v1::Spec { name: "fruitshop".into(), json: spec_json }],
        ..Default::default()
    }
}

/// (case, method, path, content type, body, status, location named in the problem; None = forwarded)
type Case<'a> = (&'a str, &'a str, &'a str, Option<&'a str>, &'a str, u16, Option<&'a str>);

#[tokio::test]
async fn fruitshop_requests_through_the_proxy() -> Result<()> {
    let shop = Shop::start().await?;
    let gateway = Gateway::start(&snapshot(&shop, fruitshop_json()?)).await?;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
    let json = Some("application/json");
    let long_name = format!(r#"{{"name":"{}","price":1}}"#, "x".repeat(31));

    let cases: Vec<Case> = vec![
        ("benchmark request", "POST", "/shop/v2/products", json, r#"{"name":"Mangos","price":2.79}"#, 201, None),
        ("get by id", "GET", "/shop/v2/products/7", None, "", 200, None),
        ("missing name", "POST", "/shop/v2/products", json, r#"{"price":2.79}"#, 400, Some("REQUEST/BODY#/name")),
        (
            "price as a string",
            "POST",
            "/shop/v2/products",
            json,
            r#"{"name":"Mangos","price":"2.79"}"#,
            400,
            Some("REQUEST/BODY#/price"),
        ),
        (
            "price over 1000",
            "POST",
            "/shop/v2/products",
            json,
            r#"{"name":"Mangos","price":1001}"#,
            400,
            Some("REQUEST/BODY#/price"),
        ),
        ("name over 30 characters", "POST", "/shop/v2/products", json, &long_name, 400, Some("REQUEST/BODY#/name")),
        (
            "wrong content type",
            "POST",
            "/shop/v2/products",
            Some("text/plain"),
            r#"{"name":"Mangos","price":2.79}"#,
            415,
            Some("REQUEST/HEADER/Content-Type"),
        ),
        ("unknown path", "GET", "/shop/v2/bananas", None, "", 404, Some("REQUEST/PATH")),
        ("wrong method", "DELETE", "/shop/v2/products", None, "", 405, Some("REQUEST/METHOD")),
        ("bad path parameter type", "GET", "/shop/v2/products/abc", None, "", 400, Some("REQUEST/PATH_PARAMETER/id")),
        (
            "bad query parameter",
            "GET",
            "/shop/v2/products?limit=ten",
            None,
            "",
            400,
            Some("REQUEST/QUERY_PARAMETER/limit"),
        ),
        ("response breaks the spec", "GET", "/shop/v2/products/8", None, "", 502, None),
    ];
    for (case, method, path, content_type, body, status, location) in cases {
        let before = shop.seen().len();
        let mut request =
            client.request(reqwest::Method::from_bytes(method.as_bytes())?, gateway.url(path)).body(body.to_owned());
        if let Some(ct) = content_type {
            request = request.header("content-type", ct);
        }
        let response = request.send().await?;
        let got = response.status().as_u16();
        let content_type = response.headers().get("content-type").map(|v| v.as_bytes().to_vec());
        let problem: Value = serde_json::from_slice(&response.bytes().await?).unwrap_or(Value::Null);
        assert_eq!(got, status, "{case}: {problem}");
        let reached = shop.seen().len() > before;
        match location {
            None if status < 300 => {
                assert!(reached, "{case}: the upstream did not see the request");
                let (seen_method, seen_path, seen_body) = shop.seen().pop().context("recorded")?;
                assert_eq!((seen_method.as_str(), seen_path.as_str(), &seen_body[..]), (method, path, body.as_bytes()));
            }
            None => assert_eq!(problem["title"], "Response validation failed", "{case}"),
            Some(location) => {
                assert!(!reached, "{case}: a rejected request reached the upstream");
                assert_eq!(content_type.as_deref(), Some(&b"application/problem+json"[..]), "{case}");
                assert_eq!(problem["status"], status, "{case}");
                assert!(problem["validation"]["errors"].get(location).is_some(), "{case}: {location} not in {problem}");
            }
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_broken_spec_is_refused_and_the_old_table_keeps_serving() -> Result<()> {
    let shop = Shop::start().await?;
    let gateway = Gateway::start(&snapshot(&shop, fruitshop_json()?)).await?;
    let mut broken =
        snapshot(&shop, r##"{"openapi":"3.0.3","paths":{"/a":{"get":{"parameters":[{"$ref":"#/nowhere"}]}}}}"##.into());
    broken.version = 2;
    let error = gateway.refuse(&broken).await?;
    assert!(error.contains("#/nowhere"), "{error}");

    let response = reqwest::Client::new()
        .post(gateway.url("/shop/v2/products"))
        .header("content-type", "application/json")
        .body(r#"{"price":1}"#)
        .send()
        .await?;
    assert_eq!(response.status().as_u16(), 400, "the first spec still validates");
    Ok(())
}
