//! Hostile hosts and headers against a real `sluice-dp` process and real echo
//! upstreams: Host tricks that used to fall through to an API for any host,
//! and what each upstream received (or that it received nothing).

use anyhow::Result;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice_proto::v1;
use sluice_proto::v1::policy::Kind;

use crate::raw_http::{Edge, RawResponse, exchange};

const SECURE: &str = "secure";
const OPEN: &str = "open";

/// `secure.example.com` behind an IP allow-list the test client is not on,
/// and an API for any host without policies (the catch-all of issue 22).
async fn hosts_edge() -> Result<Edge> {
    let allow_ten = Kind::IpRestriction(v1::IpRestriction { allow: vec!["10.0.0.0/8".into()], deny: vec![] });
    let secure = v1::Api {
        name: SECURE.into(),
        hosts: vec!["secure.example.com".into()],
        path_prefix: "/".into(),
        upstream: SECURE.into(),
        policies: vec![v1::Policy { kind: Some(allow_ten) }],
        ..Default::default()
    };
    let open = v1::Api { name: OPEN.into(), path_prefix: "/".into(), upstream: OPEN.into(), ..Default::default() };
    Edge::start(vec![secure, open], &[]).await
}

/// A raw request: `head` is the request line and header lines, without the blank line.
async fn send(edge: &Edge, head: &str) -> Result<RawResponse> {
    exchange(edge.addr(), format!("{head}\r\nConnection: close\r\n\r\n").into_bytes()).await
}

#[tokio::test]
async fn host_tricks_never_fall_through_to_the_catch_all() -> Result<()> {
    let edge = hosts_edge().await?;
    // (request head, status: 403 = the secure API's policy ran, 400 = refused, 200 = the open API)
    let cases: &[(&str, u16)] = &[
        ("GET /x HTTP/1.1\r\nHost: secure.example.com", 403),
        ("GET /x HTTP/1.1\r\nHost: SECURE.Example.COM", 403),
        ("GET /x HTTP/1.1\r\nHost: secure.example.com.", 403),
        ("GET /x HTTP/1.1\r\nHost: secure.example.com:8080", 403),
        ("GET /x HTTP/1.1\r\nHost: secure.example.com.:8080", 403),
        ("GET /x HTTP/1.1\r\nHost: secure.example.com:abc", 400),
        ("GET /x HTTP/1.1\r\nHost: secure.example.com:99999", 400),
        ("GET /x HTTP/1.1\r\nHost: secure.example.com..", 400),
        ("GET /x HTTP/1.1\r\nHost: user@secure.example.com", 400),
        ("GET /x HTTP/1.1\r\nHost: secure.example.com\r\nHost: other.example", 400),
        ("GET /x HTTP/1.1\r\nHost: other.example\r\nHost: secure.example.com", 400),
        ("GET http://other.example/x HTTP/1.1\r\nHost: secure.example.com", 400),
        ("GET http://secure.example.com/x HTTP/1.1\r\nHost: other.example", 400),
        ("GET http://secure.example.com/x HTTP/1.1\r\nHost: secure.example.com", 403),
        ("GET http://SECURE.example.com./x HTTP/1.1\r\nHost: secure.example.com:80", 403),
        ("GET /x HTTP/1.1", 400),
        ("GET /x HTTP/1.1\r\nHost: other.example", 200),
        ("GET /x HTTP/1.1\r\nHost: Other.Example.", 200),
        ("GET /x HTTP/1.0", 200),
    ];
    let mut failures = Vec::new();
    let mut forwarded = 0;
    for (head, want) in cases {
        let response = send(&edge, head).await?;
        let body = response.json();
        let ok = match want {
            200 => response.status == 200 && body["server"] == OPEN,
            status => response.status == *status && response.is_problem(),
        };
        if *want == 200 {
            forwarded += 1;
        }
        if !ok {
            failures.push(format!("{head:?}: want {want}, got {} {body}", response.status));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let received = edge.received().await?;
    assert_eq!((received[SECURE], received[OPEN]), (0, forwarded), "what the upstreams answered");
    Ok(())
}

/// HTTP/2 (h2c, prior knowledge): `:authority` and a `host` field that
/// disagree are refused like an absolute-form URI that disagrees with Host.
#[tokio::test]
async fn http2_authority_and_host_must_agree() -> Result<()> {
    let edge = hosts_edge().await?;
    let stream = tokio::net::TcpStream::connect(edge.addr()).await?;
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    // (authority, host field, status)
    let cases: &[(&str, Option<&str>, u16)] = &[
        ("secure.example.com", Some("other.example"), 400),
        ("other.example", Some("secure.example.com"), 400),
        ("secure.example.com", Some("SECURE.example.com."), 403),
        ("secure.example.com.", None, 403),
        ("other.example", None, 200),
    ];
    let mut failures = Vec::new();
    for (authority, host, want) in cases {
        let mut request = http::Request::builder().uri(format!("http://{authority}/x"));
        if let Some(host) = host {
            request = request.header(http::header::HOST, *host);
        }
        let request = request.body(Empty::<Bytes>::new())?;
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        if status != *want {
            failures
                .push(format!("{authority} / {host:?}: want {want}, got {status} {}", String::from_utf8_lossy(&body)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let received = edge.received().await?;
    assert_eq!((received[SECURE], received[OPEN]), (0, 1), "what the upstreams answered");
    Ok(())
}

const AUTH: &str = "auth";

/// An Argon2id PHC string at a small cost, as the control plane would send it.
fn password_hash(password: &str) -> Result<String> {
    use argon2::PasswordHasher as _;
    let params = argon2::Params::new(4096, 1, 1, None).map_err(|e| anyhow::anyhow!("{e}"))?;
    let argon = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    Ok(argon.hash_password(password.as_bytes()).map_err(|e| anyhow::anyhow!("{e}"))?.to_string())
}

/// `/auth` with basic auth (consumer bob) and a header rule that sets
/// `X-Internal-Auth` for the upstream; `/h2c` allows an h2c upgrade; `/` open.
async fn headers_edge(flags: &[&str]) -> Result<Edge> {
    let set_internal = v1::Headers {
        request: Some(v1::HeaderRules {
            set: vec![v1::HeaderValue { name: "X-Internal-Auth".into(), value: "gateway-secret".into() }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let auth = v1::Api {
        name: AUTH.into(),
        path_prefix: "/auth".into(),
        upstream: AUTH.into(),
        policies: vec![
            v1::Policy { kind: Some(Kind::BasicAuth(v1::BasicAuth::default())) },
            v1::Policy { kind: Some(Kind::Headers(set_internal)) },
        ],
        ..Default::default()
    };
    let h2c = v1::Api {
        name: "h2c".into(),
        path_prefix: "/h2c".into(),
        upstream: OPEN.into(),
        allow_h2c_upgrade: true,
        ..Default::default()
    };
    let open = v1::Api { name: OPEN.into(), path_prefix: "/".into(), upstream: OPEN.into(), ..Default::default() };
    let bob = v1::Consumer {
        username: "bob".into(),
        basic_auth_password_hash: password_hash("bob's secret")?,
        ..Default::default()
    };
    Edge::start_with(v1::Snapshot { apis: vec![auth, h2c, open], consumers: vec![bob], ..Default::default() }, flags)
        .await
}

/// `Authorization` for bob.
fn bob() -> String {
    use base64::Engine as _;
    format!("Authorization: Basic {}", base64::engine::general_purpose::STANDARD.encode("bob:bob's secret"))
}

/// What the echo upstream says it received: (status, the headers it saw).
async fn echo(edge: &Edge, head: &str) -> Result<(u16, serde_json::Value)> {
    let response = send(edge, head).await?;
    let body = response.json();
    Ok((response.status, body["headers"].clone()))
}

/// Issue 22 finding 2: the authenticated bob cannot make the upstream see
/// alice, nor delete a header the gateway's header rules set.
#[tokio::test]
async fn a_client_can_neither_forge_nor_delete_what_the_gateway_sets() -> Result<()> {
    let edge = headers_edge(&[]).await?;
    let bob = bob();
    let cases = [
        format!(
            "GET /auth/x HTTP/1.1\r\nHost: g\r\n{bob}\r\nConnection: X-Consumer-Username\r\nX_Consumer_Username: alice"
        ),
        format!("GET /auth/x HTTP/1.1\r\nHost: g\r\n{bob}\r\nX-Consumer-Username: alice\r\nX_Consumer_Username: alice"),
        format!(
            "GET /auth/x HTTP/1.1\r\nHost: g\r\n{bob}\r\nConnection: keep-alive, X-Internal-Auth\r\nX-Internal-Auth: forged"
        ),
    ];
    for head in &cases {
        let (status, seen) = echo(&edge, head).await?;
        assert_eq!(status, 200, "{head}");
        assert_eq!(seen["x-consumer-username"], "bob", "{head}: {seen}");
        assert_eq!(seen["x-internal-auth"], "gateway-secret", "{head}: {seen}");
        assert!(seen.get("x_consumer_username").is_none(), "{head}: {seen}");
        assert!(seen.get("authorization").is_none(), "{head}: {seen}");
    }
    // Without credentials: refused, and nothing a client sent names a consumer upstream.
    let (status, _) = echo(&edge, "GET /auth/x HTTP/1.1\r\nHost: g\r\nX_Consumer_Username: alice").await?;
    assert_eq!(status, 401);
    let (status, seen) =
        echo(&edge, "GET /open HTTP/1.1\r\nHost: g\r\nX-Consumer-Username: alice\r\nX_Consumer_Username: alice")
            .await?;
    assert_eq!(status, 200);
    assert!(seen.get("x-consumer-username").is_none() && seen.get("x_consumer_username").is_none(), "{seen}");
    assert_eq!(edge.received().await?[AUTH], cases.len() as u64);
    Ok(())
}

/// Header names with underscores are dropped unless `--underscores-in-headers on`.
#[tokio::test]
async fn underscored_header_names_pass_only_when_allowed() -> Result<()> {
    let head = "GET /open HTTP/1.1\r\nHost: g\r\nX_Custom: 1\r\nX-Custom: 2";
    let edge = headers_edge(&[]).await?;
    let (status, seen) = echo(&edge, head).await?;
    assert_eq!((status, seen.get("x_custom"), &seen["x-custom"]), (200, None, &"2".into()), "{seen}");
    drop(edge);
    let edge = headers_edge(&["--underscores-in-headers", "on"]).await?;
    let (status, seen) = echo(&edge, head).await?;
    assert_eq!((status, &seen["x_custom"], &seen["x-custom"]), (200, &"1".into(), &"2".into()), "{seen}");
    Ok(())
}

/// `Upgrade: h2c` from a client is dropped (the upstream sees a plain
/// request) unless the API allows it; a WebSocket-style upgrade still passes.
#[tokio::test]
async fn h2c_upgrades_are_dropped_unless_the_api_allows_them() -> Result<()> {
    let edge = headers_edge(&[]).await?;
    let h2c = "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__";
    let (status, seen) = echo(&edge, &format!("GET /open HTTP/1.1\r\nHost: g\r\n{h2c}")).await?;
    assert_eq!(status, 200);
    assert!(seen.get("upgrade").is_none() && seen.get("http2-settings").is_none(), "{seen}");
    let (status, seen) = echo(&edge, &format!("GET /h2c/x HTTP/1.1\r\nHost: g\r\n{h2c}")).await?;
    assert_eq!((status, &seen["upgrade"]), (200, &"h2c".into()), "{seen}");
    let (status, seen) =
        echo(&edge, "GET /open HTTP/1.1\r\nHost: g\r\nConnection: Upgrade\r\nUpgrade: websocket").await?;
    assert_eq!((status, &seen["upgrade"]), (200, &"websocket".into()), "{seen}");
    Ok(())
}

/// Request headers over 16 KiB each or 64 KiB together get 431 and reach no upstream.
#[tokio::test]
async fn oversized_request_headers_get_431() -> Result<()> {
    let edge = headers_edge(&[]).await?;
    let one_big = format!("GET /open HTTP/1.1\r\nHost: g\r\nX-Big: {}", "a".repeat(20 * 1024));
    let many: String = (0..8).map(|i| format!("\r\nX-Part-{i}: {}", "b".repeat(9 * 1024))).collect();
    let many = format!("GET /open HTTP/1.1\r\nHost: g{many}");
    let huge = format!("GET /open HTTP/1.1\r\nHost: g\r\nX-Huge: {}", "c".repeat(300 * 1024));
    for (what, head) in [("one 20 KiB header", &one_big), ("72 KiB in all", &many), ("one 300 KiB header", &huge)] {
        let response = send(&edge, head).await?;
        assert_eq!(response.status, 431, "{what}: {:?}", String::from_utf8_lossy(&response.body));
    }
    let fine = format!("GET /open HTTP/1.1\r\nHost: g\r\nX-Fine: {}", "d".repeat(10 * 1024));
    let response = send(&edge, &fine).await?;
    assert_eq!(response.status, 200);
    assert_eq!(edge.received().await?[OPEN], 1, "only the request within the limits arrived");
    Ok(())
}
