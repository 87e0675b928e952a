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
