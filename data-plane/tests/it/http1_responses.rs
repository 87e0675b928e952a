//! HTTP/1.1 conformance of the upstream side: a raw upstream answers each
//! case's request with scripted bytes (responses without bodies, responses
//! that end early or carry more than they announce, ambiguous framing), and
//! the table writes down what the client must get through a real `sluice-dp`
//! and whether its connection stays usable. After every case a further
//! request must get its own answer: leftover bytes from a bad response must
//! never be read as the answer to someone else's request.

use anyhow::{Result, bail};
use sluice_testkit::raw_upstream::{Received, Reply};

use crate::raw_http::{RawConnection, RawEdge, echo_reply};

/// The upstream's answer to each case's path; anything else is echoed.
fn script(request: &Received) -> Reply {
    let send = |bytes: &str| Reply::Send(bytes.as_bytes().to_vec());
    let send_and_close = |bytes: &str| Reply::SendAndClose(bytes.as_bytes().to_vec());
    match request.path() {
        "/head" => send("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"),
        "/no-content" => send("HTTP/1.1 204 No Content\r\n\r\n"),
        "/no-content-with-body" => send("HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello"),
        "/not-modified" => send("HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nContent-Length: 1000\r\n\r\n"),
        "/close-before-head" => Reply::Close,
        "/close-mid-head" => send_and_close("HTTP/1.1 200 OK\r\nContent-Len"),
        "/close-mid-body" => send_and_close("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789"),
        "/close-mid-chunks" => {
            send_and_close("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\na\r\n0123456789\r\n")
        }
        "/close-delimited" => send_and_close("HTTP/1.1 200 OK\r\n\r\nuntil the close"),
        "/too-much" => {
            send("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled")
        }
        "/cl-and-te" => {
            send("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
        }
        "/two-lengths" => send("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok"),
        "/obs-fold" => send("HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\nContent-Length: 2\r\n\r\nok"),
        "/bare-lf" => send("HTTP/1.1 200 OK\nContent-Length: 2\n\nok"),
        "/interim" => send("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfinal"),
        "/fields" | "/limited/fields" | "/counted/fields" | "/mapped/fields" => send(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Request-Id: forged\r\nVia: 1.0 inner\r\n\
             X-Custom:  padded \t\r\nRateLimit-Limit: 1\r\nDate: Thu, 01 Jan 2026 00:00:00 GMT\r\n\
             Content-Length: 2\r\n\r\nok",
        ),
        "/hop" | "/limited/hop" | "/counted/hop" | "/mapped/hop" => send(
            "HTTP/1.1 200 OK\r\nConnection: X-Secret\r\nX-Secret: leak\r\nKeep-Alive: timeout=5\r\n\
             Proxy-Authenticate: Basic\r\nX-Kept: yes\r\nContent-Length: 2\r\n\r\nok",
        ),
        _ => echo_reply(request),
    }
}

/// What the client must get: the status; the body and whether it was cut
/// short, when the answer is the upstream's; and the connection after.
struct Case {
    method: &'static str,
    path: &'static str,
    status: u16,
    /// `None`: the gateway's own problem details.
    body: Option<&'static str>,
    truncated: bool,
    keeps_open: bool,
    why: &'static str,
}

const fn case(
    method: &'static str,
    path: &'static str,
    status: u16,
    body: Option<&'static str>,
    truncated: bool,
    keeps_open: bool,
    why: &'static str,
) -> Case {
    Case { method, path, status, body, truncated, keeps_open, why }
}

const CASES: &[Case] = &[
    case("HEAD", "/head", 200, Some(""), false, true, "a HEAD answer has no body, whatever its Content-Length says"),
    case("GET", "/no-content", 204, Some(""), false, true, "204 has no body"),
    case(
        "GET",
        "/no-content-with-body",
        204,
        Some(""),
        false,
        true,
        "the bytes a 204 should not carry are not passed on, nor read as the next answer",
    ),
    case(
        "GET",
        "/not-modified",
        304,
        Some(""),
        false,
        true,
        "304 has no body; its Content-Length describes the resource",
    ),
    case("POST", "/close-before-head", 502, None, false, true, "no answer: 502, and a POST is not retried"),
    case("POST", "/close-mid-head", 502, None, false, true, "an incomplete head is no answer"),
    case(
        "GET",
        "/close-mid-body",
        200,
        Some("0123456789"),
        true,
        false,
        "the head was already sent: the client learns of the loss by the close before the announced length",
    ),
    case("GET", "/close-mid-chunks", 200, Some("0123456789"), true, false, "as above, without the last chunk"),
    case(
        "GET",
        "/close-delimited",
        200,
        Some("until the close"),
        false,
        true,
        "a body delimited by the upstream's close is whole; the client gets it framed",
    ),
    case(
        "GET",
        "/too-much",
        200,
        Some("ok"),
        false,
        true,
        "the bytes past Content-Length are not passed on, and never answer another request",
    ),
    case(
        "GET",
        "/cl-and-te",
        200,
        Some("hello"),
        false,
        true,
        "RFC 9112 §6.3: Transfer-Encoding overrides Content-Length, which an intermediary must remove",
    ),
    case("GET", "/two-lengths", 502, None, false, true, "differing lengths: the body's end is unknown"),
    case("GET", "/obs-fold", 502, None, false, true, "RFC 9112 §5.2: a proxy must refuse or replace obs-fold"),
    case("GET", "/bare-lf", 200, Some("ok"), false, true, "RFC 9112 §2.2 lets a recipient accept LF"),
    case("GET", "/interim", 200, Some("final"), false, true, "an unasked-for 100 is skipped; the final answer counts"),
];

async fn run_case(edge: &RawEdge, case: &Case, n: usize) -> Result<()> {
    let mut connection = RawConnection::open(edge.addr()).await?;
    let request = format!("{} {} HTTP/1.1\r\nHost: g\r\nContent-Length: 0\r\n\r\n", case.method, case.path);
    connection.send(request.as_bytes()).await?;
    let response = connection.response(case.method).await?;
    if response.status != case.status {
        bail!("got {} {:?}, want {}", response.status, response.text(), case.status);
    }
    match case.body {
        Some(body) if response.text() != body || response.truncated != case.truncated => {
            bail!(
                "got body {:?} (truncated: {}), want {body:?} (truncated: {})",
                response.text(),
                response.truncated,
                case.truncated
            )
        }
        Some(_) => {}
        None if !response.is_problem() => bail!("want the gateway's problem details, got {:?}", response.text()),
        None => {}
    }
    let framings = ["content-length", "transfer-encoding"].iter().filter(|h| response.header(h).is_some()).count();
    if framings > 1 {
        bail!("the client got both Content-Length and Transfer-Encoding: {:?}", response.headers);
    }
    if case.method == "HEAD" && response.header("content-length") != Some("1000") {
        bail!("the HEAD answer's Content-Length was not passed on: {:?}", response.headers);
    }
    // The next request (on the same connection when it stays open) gets its own answer.
    if case.keeps_open {
        connection.send(format!("GET /after-{n} HTTP/1.1\r\nHost: g\r\n\r\n").as_bytes()).await?;
    } else {
        connection.closes().await?;
        connection = RawConnection::open(edge.addr()).await?;
        connection.send(format!("GET /after-{n} HTTP/1.1\r\nHost: g\r\n\r\n").as_bytes()).await?;
    }
    let next = connection.response("GET").await?;
    let want = format!("GET /after-{n} ");
    if (next.status, next.text()) != (200, want.clone()) {
        bail!("the next request got {} {:?}, want {want:?}", next.status, next.text());
    }
    Ok(())
}

#[tokio::test]
async fn upstream_response_table() -> Result<()> {
    let edge = RawEdge::start(script).await?;
    let mut failures = Vec::new();
    for (n, case) in CASES.iter().enumerate() {
        if let Err(e) = run_case(&edge, case, n).await {
            failures.push(format!("{} {}: {e:#} (expected because {})", case.method, case.path, case.why));
        }
    }
    // Every case's request reached the upstream once, and so did every follow-up.
    let mut paths = edge.upstream.paths();
    paths.sort();
    let mut want: Vec<String> =
        CASES.iter().enumerate().flat_map(|(n, case)| [case.path.to_owned(), format!("/after-{n}")]).collect();
    want.sort();
    if failures.is_empty() && paths != want {
        failures.push(format!("the upstream received {paths:?}, want {want:?}"));
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}\ngateway stderr:\n{}",
        failures.len(),
        CASES.len(),
        failures.join("\n"),
        edge.edge.dp.process.stderr()
    );
    Ok(())
}

/// A response's fields as a client reads them: names in lower case, a
/// repeated field's values joined (RFC 9110 §5.3), `Date` left out unless
/// the target sent it.
fn fields_seen(response: &crate::raw_http::RawResponse) -> Vec<(String, String)> {
    let mut fields: Vec<(String, String)> = Vec::new();
    for (name, value) in &response.headers {
        match fields.iter_mut().find(|(seen, _)| seen == name) {
            Some((_, values)) => *values = format!("{values}, {value}"),
            None => fields.push((name.clone(), value.clone())),
        }
    }
    fields.sort();
    fields
}

/// A target's header fields pass on as the target sent them, without a
/// header map (`ResponseBody::fields_as_sent`), for an API without
/// policies, one whose policies leave the answer alone (`/limited`) and one
/// whose policies only set fields of their own (`/counted`, `RateLimit-*`);
/// an API whose policies edit the answer (`/mapped`) goes through the map.
/// The client must not tell them apart: the gateway's request ID replaces
/// the target's, `Via` gets the gateway's hop after the target's, the
/// framing is the gateway's, and no hop-by-hop field, nor one that
/// `Connection` names, reaches it. Where the rate limit sets `RateLimit-*`,
/// its values replace the target's: one of each, the limit the client is held to.
#[tokio::test]
async fn a_targets_fields_reach_the_client_alike_with_and_without_a_header_map() -> Result<()> {
    let edge = RawEdge::start(script).await?;
    let mut connection = RawConnection::open(edge.addr()).await?;
    for (path, want) in [
        (
            "/fields",
            vec![
                ("content-length", "2"),
                ("content-type", "text/plain"),
                ("date", "Thu, 01 Jan 2026 00:00:00 GMT"),
                ("ratelimit-limit", "1"),
                ("via", "1.0 inner, 1.1 sluice"),
                ("x-custom", "padded"),
                ("x-request-id", "mine-1"),
            ],
        ),
        ("/hop", vec![("content-length", "2"), ("via", "1.1 sluice"), ("x-kept", "yes"), ("x-request-id", "mine-1")]),
    ] {
        for api in ["", "/limited", "/counted", "/mapped"] {
            let path = format!("{api}{path}");
            let request = format!("GET {path} HTTP/1.1\r\nHost: g\r\nX-Request-Id: mine-1\r\n\r\n");
            connection.send(request.as_bytes()).await?;
            let response = connection.response("GET").await?;
            assert_eq!((response.status, response.text().as_str()), (200, "ok"), "{path}");
            let mut seen = fields_seen(&response);
            if !want.iter().any(|(name, _)| *name == "date") {
                // The gateway dates an undated answer: there must be one, of its own.
                let dates = seen.iter().filter(|(name, _)| name == "date").count();
                assert_eq!(dates, 1, "{path}: {:?}", response.headers);
                seen.retain(|(name, _)| name != "date");
            }
            let mut want: Vec<(String, String)> =
                want.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect();
            if api == "/counted" {
                // The gateway's four, each once; the remaining count and reset move from request to request.
                let limits: Vec<(String, String)> =
                    seen.extract_if(.., |(name, _)| name.starts_with("ratelimit-")).collect();
                let names: Vec<&str> = limits.iter().map(|(name, _)| name.as_str()).collect();
                assert_eq!(
                    names,
                    ["ratelimit-limit", "ratelimit-policy", "ratelimit-remaining", "ratelimit-reset"],
                    "{path}: {:?}",
                    response.headers
                );
                assert_eq!(limits[0].1, "1000000", "{path}: the target's RateLimit-Limit reached the client");
                want.retain(|(name, _)| !name.starts_with("ratelimit-"));
            }
            assert_eq!(seen, want, "{path}: the client got {:?}", response.headers);
        }
    }
    Ok(())
}
