//! The policy chain through a real proxy: the in-process data plane of
//! `gateway` in front of an upstream that records every request it fully
//! received, so each test can check both what the client got and what (if
//! anything) reached the upstream.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use bytes::Bytes;
use hmac::{Hmac, Mac as _};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use sha2::Sha256;
use sluice_proto::v1;
use sluice_proto::v1::policy::Kind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::gateway::Gateway;
use crate::support::{DataPlane, client, send, serve_http1};

pub const HMAC_KEY: &[u8] = b"cluster-api-key-hmac-key";
const JWT_SECRET: &str = "ann-jwt-secret";

#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: HashMap<String, String>,
    body: Bytes,
}

/// Records a request only once its whole body arrived: a request whose body
/// was cut off by the gateway never counts as having reached the upstream.
struct Recorder {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
}

impl Recorder {
    async fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let log = seen.clone();
        let task = serve_http1(listener, move |req| record(req, log.clone()));
        Ok(Recorder { addr, seen, task })
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn count(&self) -> usize {
        self.seen().len()
    }

    fn last(&self) -> Result<Seen> {
        self.seen().pop().context("the upstream saw no request")
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn record(
    req: http::Request<Incoming>,
    log: Arc<Mutex<Vec<Seen>>>,
) -> Result<http::Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return Ok(http::Response::builder().status(400).body(Full::new(Bytes::new())).unwrap_or_default());
    };
    // Repeated headers are joined, so a test sees every value.
    let mut headers: HashMap<String, String> = HashMap::new();
    for (name, value) in &parts.headers {
        let value = String::from_utf8_lossy(value.as_bytes());
        headers
            .entry(name.to_string())
            .and_modify(|v| *v = format!("{v}, {value}"))
            .or_insert_with(|| value.into_owned());
    }
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    if let Ok(mut log) = log.lock() {
        log.push(Seen { path, headers, body });
    }
    let response = http::Response::builder()
        .header("content-type", "application/json")
        .header("x-upstream-secret", "internal")
        .header("x-upstream-old", "renamed-value")
        .header("x-upstream-set", "upstream")
        .body(Full::new(Bytes::from_static(br#"{"ok":true}"#)));
    Ok(response.unwrap_or_default())
}

pub fn hmac_hex(key: &str) -> Result<String> {
    let mut mac = Hmac::<Sha256>::new_from_slice(HMAC_KEY)?;
    mac.update(key.as_bytes());
    Ok(hex::encode(mac.finalize().into_bytes()))
}

fn argon2_phc(password: &str) -> Result<String> {
    use argon2::PasswordHasher as _;
    // Small cost keeps the test quick; the data plane reads the cost from the PHC string.
    let params = argon2::Params::new(4096, 1, 1, None).map_err(|e| anyhow::anyhow!("{e}"))?;
    let argon = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    Ok(argon.hash_password(password.as_bytes()).map_err(|e| anyhow::anyhow!("{e}"))?.to_string())
}

fn api(name: &str, prefix: &str, policies: Vec<Kind>) -> v1::Api {
    v1::Api {
        name: name.into(),
        path_prefix: prefix.into(),
        upstream: "backend".into(),
        policies: policies.into_iter().map(|kind| v1::Policy { kind: Some(kind) }).collect(),
        ..Default::default()
    }
}

fn snapshot(upstream: &Recorder, apis: Vec<v1::Api>) -> Result<v1::Snapshot> {
    let consumer = v1::Consumer {
        username: "ann".into(),
        basic_auth_password_hash: argon2_phc("open sesame")?,
        api_key_digests: vec![hmac_hex("ann-api-key")?],
        jwt_credentials: vec![v1::JwtCredential {
            key: "ann-issuer".into(),
            algorithm: "HS256".into(),
            secret: JWT_SECRET.into(),
            public_key_pem: String::new(),
        }],
    };
    Ok(v1::Snapshot {
        version: 1,
        apis,
        upstreams: vec![v1::Upstream {
            name: "backend".into(),
            targets: vec![v1::Target { url: format!("http://{}", upstream.addr), weight: 1 }],
            ..Default::default()
        }],
        consumers: vec![consumer],
        api_key_hmac_key: HMAC_KEY.to_vec(),
        ..Default::default()
    })
}

fn assert_problem(status: u16, headers: &reqwest::header::HeaderMap, body: &Value, want: u16, case: &str) {
    assert_eq!(status, want, "{case}: {body}");
    assert_eq!(headers.get("content-type").map(|v| v.as_bytes()), Some(&b"application/problem+json"[..]), "{case}");
    assert_eq!(body["status"], want, "{case}");
}

#[tokio::test]
async fn basic_auth_right_wrong_missing_malformed() -> Result<()> {
    let upstream = Recorder::start().await?;
    let gw = Gateway::start(&snapshot(
        &upstream,
        vec![api("basic", "/basic", vec![Kind::BasicAuth(v1::BasicAuth::default())])],
    )?)
    .await?;
    let c = client();
    let basic = |cred: &str| format!("Basic {}", STANDARD.encode(cred));

    let cases = [
        ("wrong password", Some(basic("ann:guess"))),
        ("unknown user", Some(basic("bob:open sesame"))),
        ("missing", None),
        ("malformed base64", Some("Basic %%%not-base64".to_string())),
        ("no colon", Some(basic("ann"))),
        ("other scheme", Some("Digest username=ann".to_string())),
    ];
    for (case, authorization) in cases {
        let mut req = c.get(gw.url("/basic/x"));
        if let Some(value) = authorization {
            req = req.header("authorization", value);
        }
        let (status, headers, body) = send(req).await?;
        assert_problem(status, &headers, &body, 401, case);
        let challenge = headers.get("www-authenticate").context("challenge")?.to_str()?;
        assert!(challenge.starts_with("Basic realm=\"basic\""), "{case}: {challenge}");
    }
    assert_eq!(upstream.count(), 0, "no rejected request reaches the upstream");

    // Twice each: the second goes through the verified-credential cache. With a
    // forged consumer (the request's fields go through a header map) and
    // without (they stay as sent but the credentials).
    for forged in [Some("admin"), None] {
        for _ in 0..2 {
            let mut req = c.get(gw.url("/basic/x")).header("authorization", basic("ann:open sesame"));
            req = req.header("x-kept", "yes");
            if let Some(forged) = forged {
                req = req.header("x-consumer-username", forged);
            }
            let (status, _, _) = send(req).await?;
            assert_eq!(status, 200);
            let seen = upstream.last()?;
            assert!(!seen.headers.contains_key("authorization"), "the upstream never sees the credentials");
            // Repeated fields are joined: one value is one field.
            assert_eq!(seen.headers.get("x-consumer-username").map(String::as_str), Some("ann"), "{forged:?}");
            assert_eq!(seen.headers.get("x-kept").map(String::as_str), Some("yes"), "{forged:?}");
        }
    }
    Ok(())
}

#[tokio::test]
async fn api_key_in_header_and_query() -> Result<()> {
    let upstream = Recorder::start().await?;
    let key = v1::ApiKeyAuth { header: "x-api-key".into(), query_param: "apikey".into() };
    let gw = Gateway::start(&snapshot(&upstream, vec![api("keys", "/keys", vec![Kind::ApiKey(key)])])?).await?;
    let c = client();

    let (status, _, _) =
        send(c.get(gw.url("/keys/a")).header("x-api-key", "ann-api-key").header("x-kept", "yes")).await?;
    assert_eq!(status, 200);
    let seen = upstream.last()?;
    assert!(!seen.headers.contains_key("x-api-key"));
    assert_eq!(seen.headers.get("x-consumer-username").map(String::as_str), Some("ann"));
    assert_eq!(seen.headers.get("x-kept").map(String::as_str), Some("yes"));

    let (status, _, _) = send(c.get(gw.url("/keys/a?page=2&apikey=ann-api-key&sort=name"))).await?;
    assert_eq!(status, 200);
    assert_eq!(upstream.last()?.path, "/keys/a?page=2&sort=name", "the key parameter is removed, the rest kept");

    for (case, req) in [
        ("wrong header key", c.get(gw.url("/keys/a")).header("x-api-key", "nope")),
        ("wrong query key", c.get(gw.url("/keys/a?apikey=nope"))),
        ("no key", c.get(gw.url("/keys/a"))),
    ] {
        let (status, headers, body) = send(req).await?;
        assert_problem(status, &headers, &body, 401, case);
        assert!(headers.get("www-authenticate").is_some(), "{case}");
    }
    assert_eq!(upstream.count(), 2);
    Ok(())
}

#[tokio::test]
async fn jwt_valid_expired_bad_signature_audience_and_alg_none() -> Result<()> {
    let upstream = Recorder::start().await?;
    let spec = v1::JwtAuth { audiences: vec!["shop".into()], leeway_seconds: 5, ..Default::default() };
    let gw = Gateway::start(&snapshot(&upstream, vec![api("jwt", "/jwt", vec![Kind::Jwt(spec)])])?).await?;
    let c = client();
    let now = jsonwebtoken::get_current_timestamp();
    let sign = |claims: Value, secret: &str| -> Result<String> {
        Ok(jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret.as_bytes())?,
        )?)
    };

    let valid = sign(json!({"iss": "ann-issuer", "aud": "shop", "exp": now + 300}), JWT_SECRET)?;
    let (status, _, _) = send(c.get(gw.url("/jwt/a")).bearer_auth(&valid)).await?;
    assert_eq!(status, 200);
    let seen = upstream.last()?;
    assert!(!seen.headers.contains_key("authorization"));
    assert_eq!(seen.headers.get("x-consumer-username").map(String::as_str), Some("ann"));

    let alg_none = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(json!({"iss": "ann-issuer", "aud": "shop", "exp": now + 300}).to_string())
    );
    let cases = [
        ("expired", sign(json!({"iss": "ann-issuer", "aud": "shop", "exp": now - 600}), JWT_SECRET)?, "expired"),
        (
            "wrong signature",
            sign(json!({"iss": "ann-issuer", "aud": "shop", "exp": now + 300}), "forged")?,
            "signature",
        ),
        (
            "wrong audience",
            sign(json!({"iss": "ann-issuer", "aud": "admin", "exp": now + 300}), JWT_SECRET)?,
            "audience",
        ),
        ("alg none", alg_none, "malformed"),
    ];
    for (case, token, detail) in cases {
        let (status, headers, body) = send(c.get(gw.url("/jwt/a")).bearer_auth(token)).await?;
        assert_problem(status, &headers, &body, 401, case);
        assert!(body["detail"].as_str().unwrap_or("").contains(detail), "{case}: {body}");
        let challenge = headers.get("www-authenticate").context("challenge")?.to_str()?;
        assert!(challenge.starts_with("Bearer"), "{case}: {challenge}");
    }
    assert_eq!(upstream.count(), 1);
    Ok(())
}

#[tokio::test]
async fn cors_preflight_is_answered_before_auth_and_headers_reach_responses() -> Result<()> {
    let upstream = Recorder::start().await?;
    let cors = v1::Cors {
        allow_origins: vec!["https://app.example".into()],
        allow_methods: vec!["GET".into(), "POST".into()],
        expose_headers: vec!["x-upstream-set".into()],
        max_age_seconds: 600,
        ..Default::default()
    };
    // The API does not route OPTIONS: the preflight still belongs to it.
    let mut cors_api = api("cors", "/cors", vec![Kind::BasicAuth(v1::BasicAuth::default()), Kind::Cors(cors)]);
    cors_api.methods = vec!["GET".into(), "POST".into()];
    let gw = Gateway::start(&snapshot(&upstream, vec![cors_api])?).await?;
    let c = client();

    let preflight = c
        .request(reqwest::Method::OPTIONS, gw.url("/cors/items"))
        .header("origin", "https://app.example")
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "content-type, authorization");
    let (status, headers, _) = send(preflight).await?;
    assert_eq!(status, 204);
    assert_eq!(headers["access-control-allow-origin"], "https://app.example");
    assert_eq!(headers["access-control-allow-methods"], "GET, POST");
    assert_eq!(headers["access-control-allow-headers"], "content-type, authorization");
    assert_eq!(headers["access-control-max-age"], "600");

    let evil = c
        .request(reqwest::Method::OPTIONS, gw.url("/cors/items"))
        .header("origin", "https://evil.example")
        .header("access-control-request-method", "POST");
    let (status, headers, body) = send(evil).await?;
    assert_problem(status, &headers, &body, 403, "preflight from another origin");
    assert_eq!(upstream.count(), 0, "preflights never reach the upstream");

    // An actual request: CORS headers on the 401 (so the page can read it) and on the 200.
    let (status, headers, _) = send(c.get(gw.url("/cors/items")).header("origin", "https://app.example")).await?;
    assert_eq!(status, 401);
    assert_eq!(headers["access-control-allow-origin"], "https://app.example");
    let authorized =
        c.get(gw.url("/cors/items")).header("origin", "https://app.example").basic_auth("ann", Some("open sesame"));
    let (status, headers, _) = send(authorized).await?;
    assert_eq!(status, 200);
    assert_eq!(headers["access-control-allow-origin"], "https://app.example");
    assert_eq!(headers["access-control-expose-headers"], "x-upstream-set");
    assert_eq!(headers["vary"], "Origin");
    assert_eq!(upstream.count(), 1);
    Ok(())
}

#[tokio::test]
async fn header_rules_both_directions() -> Result<()> {
    let upstream = Recorder::start().await?;
    let hv = |name: &str, value: &str| v1::HeaderValue { name: name.into(), value: value.into() };
    let rename = |from: &str, to: &str| v1::HeaderRename { from: from.into(), to: to.into() };
    let rules = v1::Headers {
        request: Some(v1::HeaderRules {
            set: vec![hv("x-env", "prod")],
            add: vec![hv("x-tag", "gateway")],
            remove: vec!["x-debug".into()],
            rename: vec![rename("x-client-id", "x-caller")],
        }),
        response: Some(v1::HeaderRules {
            set: vec![hv("x-upstream-set", "gateway")],
            add: vec![hv("x-served-by", "sluice")],
            remove: vec!["x-upstream-secret".into()],
            rename: vec![rename("x-upstream-old", "x-upstream-new")],
        }),
    };
    let gw = Gateway::start(&snapshot(&upstream, vec![api("hdr", "/hdr", vec![Kind::Headers(rules)])])?).await?;
    let req = client()
        .get(gw.url("/hdr/a"))
        .header("x-env", "dev")
        .header("x-tag", "client")
        .header("x-debug", "1")
        .header("x-client-id", "c-42");
    let (status, headers, _) = send(req).await?;
    assert_eq!(status, 200);
    let seen = upstream.last()?;
    assert_eq!(seen.headers.get("x-env").map(String::as_str), Some("prod"));
    assert_eq!(seen.headers.get("x-tag").map(String::as_str), Some("client, gateway"));
    assert!(!seen.headers.contains_key("x-debug"));
    assert!(!seen.headers.contains_key("x-client-id"));
    assert_eq!(seen.headers.get("x-caller").map(String::as_str), Some("c-42"));

    assert_eq!(headers["x-upstream-set"], "gateway");
    assert_eq!(headers["x-served-by"], "sluice");
    assert!(headers.get("x-upstream-secret").is_none());
    assert!(headers.get("x-upstream-old").is_none());
    assert_eq!(headers["x-upstream-new"], "renamed-value");
    Ok(())
}

#[tokio::test]
async fn ip_restriction_allow_and_deny() -> Result<()> {
    let upstream = Recorder::start().await?;
    let allow = v1::IpRestriction { allow: vec!["127.0.0.0/8".into()], deny: vec![] };
    let deny = v1::IpRestriction { allow: vec!["0.0.0.0/0".into()], deny: vec!["127.0.0.1/32".into()] };
    let elsewhere = v1::IpRestriction { allow: vec!["10.0.0.0/8".into()], deny: vec![] };
    let apis = vec![
        api("allow", "/allow", vec![Kind::IpRestriction(allow)]),
        api("deny", "/deny", vec![Kind::IpRestriction(deny)]),
        api("elsewhere", "/elsewhere", vec![Kind::IpRestriction(elsewhere)]),
    ];
    let gw = Gateway::start(&snapshot(&upstream, apis)?).await?;
    let c = client();
    let (status, _, _) = send(c.get(gw.url("/allow/a"))).await?;
    assert_eq!(status, 200);
    for path in ["/deny/a", "/elsewhere/a"] {
        // A forged X-Forwarded-For does not change the verdict: the peer address counts.
        let (status, headers, body) = send(c.get(gw.url(path)).header("x-forwarded-for", "10.1.1.1")).await?;
        assert_problem(status, &headers, &body, 403, path);
    }
    assert_eq!(upstream.count(), 1);
    Ok(())
}

#[tokio::test]
async fn request_size_limit_by_content_length_and_while_streaming() -> Result<()> {
    let upstream = Recorder::start().await?;
    let limit = v1::RequestSizeLimit { max_bytes: 16 };
    let gw = Gateway::start(&snapshot(&upstream, vec![api("small", "/small", vec![Kind::RequestSizeLimit(limit)])])?)
        .await?;
    let c = client();

    let (status, _, _) = send(c.post(gw.url("/small/a")).body("sixteen bytes!!!")).await?;
    assert_eq!(status, 200);
    assert_eq!(upstream.last()?.body, "sixteen bytes!!!");

    let (status, headers, body) = send(c.post(gw.url("/small/a")).body("seventeen bytes!!")).await?;
    assert_problem(status, &headers, &body, 413, "Content-Length over the limit");

    // Chunked, no Content-Length: the limit trips while the body streams.
    let chunks: &[&[u8]] = &[b"0123456789", b"0123456789", b"0123456789"];
    let (status, body) = post_chunked(gw.http, "/small/a", chunks).await?;
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("payload-too-large"), "{body}");

    // A chunked body within the limit goes through whole.
    let (status, _) = post_chunked(gw.http, "/small/a", &[b"01234", b"56789"]).await?;
    assert_eq!(status, 200);
    assert_eq!(upstream.last()?.body, "0123456789");
    assert_eq!(upstream.count(), 2, "no oversized body reached the upstream whole");
    Ok(())
}

/// A raw HTTP/1.1 chunked POST (clients add Content-Length when they can).
async fn post_chunked(addr: SocketAddr, path: &str, chunks: &[&[u8]]) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr).await?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ntransfer-encoding: chunked\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await?;
    // The gateway may answer 413 and close while chunks are still coming:
    // stop writing then, and read what it answered.
    for chunk in chunks {
        let mut frame = format!("{:x}\r\n", chunk.len()).into_bytes();
        frame.extend_from_slice(chunk);
        frame.extend_from_slice(b"\r\n");
        if stream.write_all(&frame).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let mut response = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await? {
            Ok(0) | Err(_) => break,
            Ok(n) => response.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).context("status line")?;
    Ok((status, text))
}

/// The order is fixed by the gateway, not by the API's list: here the list
/// puts the rate limit first, yet anonymous requests get 401 without spending
/// the consumer's quota, and header rules see the consumer auth named.
#[tokio::test]
async fn fixed_order_whatever_the_list_says() -> Result<()> {
    let upstream = Recorder::start().await?;
    let limit = v1::RateLimit { requests: 2, period_seconds: 60, ..Default::default() };
    let rules = v1::Headers {
        request: Some(v1::HeaderRules {
            rename: vec![v1::HeaderRename { from: "x-consumer-username".into(), to: "x-authenticated-user".into() }],
            ..Default::default()
        }),
        response: None,
    };
    let policies = vec![
        Kind::RateLimit(limit),
        Kind::Headers(rules),
        Kind::BasicAuth(v1::BasicAuth::default()),
        Kind::IpRestriction(v1::IpRestriction { allow: vec!["127.0.0.1".into()], deny: vec![] }),
    ];
    let gw = Gateway::start(&snapshot(&upstream, vec![api("ordered", "/ordered", policies)])?).await?;
    let c = client();

    for _ in 0..5 {
        let (status, headers, _) = send(c.get(gw.url("/ordered/a"))).await?;
        assert_eq!(status, 401, "auth runs before the rate limit");
        assert!(headers.get("ratelimit-limit").is_none());
    }
    // Header rules put the answer's fields in a map: the rate limit's go there too.
    for remaining in ["1", "0"] {
        let (status, headers, _) = send(c.get(gw.url("/ordered/a")).basic_auth("ann", Some("open sesame"))).await?;
        assert_eq!(status, 200, "anonymous requests spent none of ann's quota");
        assert_eq!(headers.get("ratelimit-limit").map(|v| v.as_bytes()), Some(&b"2"[..]));
        assert_eq!(headers.get("ratelimit-remaining").map(|v| v.as_bytes()), Some(remaining.as_bytes()));
        assert_eq!(headers.get("ratelimit-policy").map(|v| v.as_bytes()), Some(&b"2;w=60"[..]));
    }
    let seen = upstream.last()?;
    assert_eq!(seen.headers.get("x-authenticated-user").map(String::as_str), Some("ann"));
    assert!(!seen.headers.contains_key("x-consumer-username"));

    let (status, headers, body) = send(c.get(gw.url("/ordered/a")).basic_auth("ann", Some("open sesame"))).await?;
    assert_problem(status, &headers, &body, 429, "third request in the window");
    assert!(headers.get("retry-after").is_some());
    assert_eq!(upstream.count(), 2);
    Ok(())
}

/// Through the real binary: the access log names the consumer, and the
/// consumer and rejection metrics are exported.
#[tokio::test]
async fn access_log_and_metrics_name_the_consumer() -> Result<()> {
    let upstream = Recorder::start().await?;
    let mut s = snapshot(&upstream, vec![api("logged", "/", vec![Kind::BasicAuth(v1::BasicAuth::default())])])?;
    s.version = 7;
    let (_cp, dp) = DataPlane::running(s, &[]).await?;

    let c = client();
    // Twice: the first request registers the consumer's counter, the second reuses it.
    for _ in 0..2 {
        let (status, _, _) = send(c.get(dp.url("/ok")).basic_auth("ann", Some("open sesame"))).await?;
        assert_eq!(status, 200);
    }
    let (status, _, _) = send(c.get(dp.url("/denied"))).await?;
    assert_eq!(status, 401);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let lines = loop {
        let stdout = dp.process.stdout();
        let lines: Vec<Value> = stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
        if lines.iter().filter(|l| l.get("status").is_some()).count() >= 3 || tokio::time::Instant::now() > deadline {
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let line = |path: &str| lines.iter().find(|l| l["path"] == path).cloned().unwrap_or(Value::Null);
    assert_eq!(line("/ok")["consumer"], "ann", "{lines:?}");
    assert_eq!(line("/denied")["consumer"], Value::Null, "{lines:?}");

    let metrics = c.get(dp.ops_url("/metrics")).send().await?.text().await?;
    assert!(metrics.contains(r#"sluice_consumer_requests_total{consumer="ann"} 2"#), "{metrics}");
    assert!(
        metrics.lines().any(|l| l.starts_with("sluice_policy_rejections_total")
            && l.contains(r#"policy="authentication""#)
            && l.contains(r#"status="401""#)),
        "{metrics}"
    );
    Ok(())
}
