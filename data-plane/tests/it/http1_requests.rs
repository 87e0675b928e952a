//! HTTP/1.1 conformance of the client side, and request smuggling: raw
//! requests against a real `sluice-dp` in front of a raw recording upstream
//! ([`RawEdge`]). Every case writes down what the client must get (a status,
//! or the connection closed, and whether the connection stays usable) and
//! what must reach the upstream (nothing, one request with exactly this
//! body, or no whole request), with the reason. The upstream frames what it
//! reads strictly and flags any request two parsers could frame differently;
//! none may ever reach it.
//!
//! The same table must pass before and after any change to how the gateway
//! parses or writes HTTP/1.1 (issue 26, item 4).

use std::time::Duration;

use anyhow::{Result, bail};
use sluice_testkit::raw_upstream::{Received, Reply};

use crate::raw_http::{Next, RawConnection, RawEdge, echo_reply};

/// What must reach the upstream.
#[derive(Debug, Clone, Copy)]
enum Sees {
    /// Not a byte of this request.
    Nothing,
    /// One request, framed unambiguously, whose path and body are these.
    Whole(&'static str, &'static str),
    /// No whole request with this path (the head and part of the body may
    /// have gone ahead before the body turned out bad).
    NoWhole(&'static str),
}

/// After the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// The connection serves another request (sent to check it).
    KeepsOpen,
    /// The gateway closes the connection.
    Closes,
}

struct Case {
    name: &'static str,
    request: String,
    /// The response status, or `None`: the connection closes without one.
    status: Option<u16>,
    then: Then,
    upstream: Sees,
    why: &'static str,
}

fn case(
    name: &'static str,
    request: impl Into<String>,
    status: Option<u16>,
    then: Then,
    upstream: Sees,
    why: &'static str,
) -> Case {
    Case { name, request: request.into(), status, then, upstream, why }
}

use Sees::{NoWhole, Nothing, Whole};
use Then::{Closes, KeepsOpen};

/// A POST of `path` with `Host: g`, the header lines `headers` (each ending
/// in CRLF) and `body` as given.
fn post(path: &str, headers: &str, body: &str) -> String {
    format!("POST {path} HTTP/1.1\r\nHost: g\r\n{headers}\r\n{body}")
}

const CHUNKED: &str = "Transfer-Encoding: chunked\r\n";

fn cases() -> Vec<Case> {
    vec![
        // Content-Length and Transfer-Encoding together.
        case(
            "CL then TE",
            post("/cl-te", &format!("Content-Length: 4\r\n{CHUNKED}"), "5\r\nhello\r\n0\r\n\r\n"),
            Some(200),
            Closes,
            Whole("/cl-te", "hello"),
            "RFC 9112 §6.3: Transfer-Encoding overrides Content-Length, and the connection must close after the \
             answer; the upstream gets one framing",
        ),
        case(
            "TE then CL",
            post("/te-cl", &format!("{CHUNKED}Content-Length: 40\r\n"), "5\r\nhello\r\n0\r\n\r\n"),
            Some(200),
            Closes,
            Whole("/te-cl", "hello"),
            "the order of the two lines changes nothing",
        ),
        case(
            "CL.TE smuggle",
            post(
                "/cl-te-smuggle",
                &format!("Content-Length: 39\r\n{CHUNKED}"),
                "0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: g\r\n\r\n",
            ),
            Some(200),
            Closes,
            Whole("/cl-te-smuggle", ""),
            "the bytes after the last chunk would be a second request to a Content-Length reader; the \
             connection closes before anything reads them",
        ),
        // Content-Length repeated or malformed.
        case(
            "duplicate equal CL",
            post("/cl-dup-equal", "Content-Length: 5\r\nContent-Length: 5\r\n", "hello"),
            Some(200),
            KeepsOpen,
            Whole("/cl-dup-equal", "hello"),
            "RFC 9110 §8.6 allows equal repeats; the upstream gets one Content-Length",
        ),
        case(
            "duplicate differing CL",
            post("/cl-dup-differ", "Content-Length: 5\r\nContent-Length: 6\r\n", "hello!"),
            Some(400),
            Closes,
            Nothing,
            "RFC 9112 §6.3: differing lengths leave the body's end unknown",
        ),
        case(
            "comma-joined equal CL",
            post("/cl-list-equal", "Content-Length: 5, 5\r\n", "hello"),
            Some(400),
            Closes,
            Nothing,
            "a list is refused rather than interpreted (RFC 9110 §8.6 allows either); no client needs it",
        ),
        case(
            "comma-joined differing CL",
            post("/cl-list-differ", "Content-Length: 5, 6\r\n", "hello!"),
            Some(400),
            Closes,
            Nothing,
            "no single length",
        ),
        case(
            "signed CL",
            post("/cl-plus", "Content-Length: +5\r\n", "hello"),
            Some(400),
            Closes,
            Nothing,
            "Content-Length is 1*DIGIT; a parser that reads a sign would agree with nobody",
        ),
        case(
            "negative CL",
            post("/cl-negative", "Content-Length: -1\r\n", ""),
            Some(400),
            Closes,
            Nothing,
            "not 1*DIGIT",
        ),
        case("hex CL", post("/cl-hex", "Content-Length: 0x5\r\n", "hello"), Some(400), Closes, Nothing, "not 1*DIGIT"),
        case(
            "overflowing CL",
            post("/cl-overflow", "Content-Length: 99999999999999999999\r\n", "hello"),
            Some(400),
            Closes,
            Nothing,
            "wider than 64 bits: a reader that wraps would see a small length",
        ),
        // Chunked bodies with bad sizes or extensions.
        case(
            "chunk size not hex",
            post("/chunk-zz", CHUNKED, "zz\r\nhello\r\n0\r\n\r\n"),
            Some(400),
            Closes,
            NoWhole("/chunk-zz"),
            "the body's end is unknown; the head may have gone ahead, the body never completes upstream",
        ),
        case(
            "bad size after a good chunk",
            post("/chunk-zz-late", CHUNKED, "5\r\nhello\r\nzz\r\nmore\r\n0\r\n\r\n"),
            Some(400),
            Closes,
            NoWhole("/chunk-zz-late"),
            "the first chunk went upstream, the request never completes there",
        ),
        case(
            "negative chunk size",
            post("/chunk-negative", CHUNKED, "-5\r\nhello\r\n0\r\n\r\n"),
            Some(400),
            Closes,
            NoWhole("/chunk-negative"),
            "not HEXDIG",
        ),
        case(
            "chunk size with 0x",
            post("/chunk-0x", CHUNKED, "0x5\r\nhello\r\n0\r\n\r\n"),
            Some(400),
            Closes,
            NoWhole("/chunk-0x"),
            "a reader stopping at the x would take it for the last chunk",
        ),
        case(
            "overflowing chunk size",
            post("/chunk-overflow", CHUNKED, "10000000000000005\r\nhello\r\n0\r\n\r\n"),
            Some(400),
            Closes,
            NoWhole("/chunk-overflow"),
            "wider than 64 bits: a reader that wraps would see 5",
        ),
        case(
            "chunk longer than its size",
            post("/chunk-long", CHUNKED, "3\r\nhello\r\n0\r\n\r\n"),
            Some(400),
            Closes,
            NoWhole("/chunk-long"),
            "the chunk must end in CRLF right after its size",
        ),
        case(
            "bare LF after chunk size",
            post("/chunk-lf", CHUNKED, "5\nhello\r\n0\r\n\r\n"),
            Some(400),
            Closes,
            NoWhole("/chunk-lf"),
            "chunk lines end in CRLF; readers differ on a bare LF there",
        ),
        case(
            "chunk extension",
            post("/chunk-ext", CHUNKED, "5;name=\"value\"\r\nhello\r\n0;last\r\n\r\n"),
            Some(200),
            KeepsOpen,
            Whole("/chunk-ext", "hello"),
            "RFC 9112 §7.1.1: unknown extensions are ignored; re-chunked upstream without them",
        ),
        case(
            "bare LF inside a chunk extension",
            post("/chunk-ext-lf", CHUNKED, "5;a\nhello\r\n0\r\n\r\n"),
            Some(400),
            Closes,
            NoWhole("/chunk-ext-lf"),
            "a reader ending the line at the LF would read another body",
        ),
        case(
            "over-long chunk extension",
            post("/chunk-ext-long", CHUNKED, &format!("5;{}\r\nhello\r\n0\r\n\r\n", "e".repeat(20 * 1024))),
            Some(400),
            Closes,
            NoWhole("/chunk-ext-long"),
            "extensions are bounded (16 KiB) so a client cannot stream an endless one",
        ),
        case(
            "chunked with a trailer",
            post("/chunk-trailer", CHUNKED, "5\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\n"),
            Some(200),
            KeepsOpen,
            Whole("/chunk-trailer", "hello"),
            "trailers end the body like the empty line",
        ),
        // Transfer-Encoding other than chunked, and smuggling through it.
        case(
            "TE chunked, identity",
            post("/te-chunked-identity", "Transfer-Encoding: chunked, identity\r\nContent-Length: 5\r\n", "hello"),
            Some(400),
            Closes,
            Nothing,
            "RFC 9112 §6.3: chunked is not the final coding, the length cannot be known",
        ),
        case(
            "TE xchunked",
            post("/te-xchunked", "Transfer-Encoding: xchunked\r\nContent-Length: 5\r\n", "hello"),
            Some(400),
            Closes,
            Nothing,
            "not chunked, whatever a substring match says",
        ),
        case(
            "TE identity",
            post("/te-identity", "Transfer-Encoding: identity\r\n", "hello"),
            Some(400),
            Closes,
            Nothing,
            "chunked must be the final coding of a request",
        ),
        case(
            "TE quoted chunked",
            post("/te-quoted", "Transfer-Encoding: \"chunked\"\r\n", "5\r\nhello\r\n0\r\n\r\n"),
            Some(400),
            Closes,
            Nothing,
            "a quoted string is not the coding",
        ),
        case(
            "TE chunked then identity on two lines",
            post(
                "/te-two-lines",
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
                "5\r\nhello\r\n0\r\n\r\n",
            ),
            Some(400),
            Closes,
            Nothing,
            "the lines form one list whose last coding is identity",
        ),
        case(
            "TE gzip, chunked",
            post("/te-gzip", "Transfer-Encoding: gzip, chunked\r\n", "5\r\nhello\r\n0\r\n\r\n"),
            Some(501),
            Closes,
            Nothing,
            "RFC 9112 §6.1: a coding the gateway does not implement; forwarding the de-chunked bytes without it \
             would hand the upstream gzip data it was never told about",
        ),
        case(
            "TE chunked, chunked",
            post("/te-chunked-twice", "Transfer-Encoding: chunked, chunked\r\n", "5\r\nhello\r\n0\r\n\r\n"),
            Some(501),
            Closes,
            Nothing,
            "RFC 9112 §7: chunked is applied at most once; one reader would de-chunk once, another twice. \
             Refused by the same rule as any coding but chunked alone",
        ),
        case(
            "TE in upper case",
            post("/te-upper", "Transfer-Encoding: CHUNKED\r\n", "5\r\nhello\r\n0\r\n\r\n"),
            Some(200),
            KeepsOpen,
            Whole("/te-upper", "hello"),
            "coding names are case-insensitive",
        ),
        case(
            "TE on HTTP/1.0",
            format!("POST /te-http10 HTTP/1.0\r\nHost: g\r\n{CHUNKED}\r\n5\r\nhello\r\n0\r\n\r\n"),
            Some(400),
            Closes,
            Nothing,
            "HTTP/1.0 has no chunked coding; a 1.0 reader would take the chunks for the body",
        ),
        case(
            "TE with a vertical tab",
            post("/te-vt", "Transfer-Encoding:\x0bchunked\r\n", "5\r\nhello\r\n0\r\n\r\n"),
            Some(400),
            Closes,
            Nothing,
            "a control character in a field value",
        ),
        // Header lines that parsers read differently.
        case(
            "leading space on a header name mid-head",
            post("/lead-space", " Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", "hello"),
            Some(400),
            Closes,
            Nothing,
            "a line folded onto Host to one reader, a Transfer-Encoding to another",
        ),
        case(
            "leading space on the first header line",
            "GET /lead-space-first HTTP/1.1\r\n Host: g\r\n\r\n",
            Some(400),
            Closes,
            Nothing,
            "RFC 9112 §2.2: whitespace between the start line and the first field must be refused",
        ),
        case(
            "space before the colon",
            post("/space-colon", "Transfer-Encoding : chunked\r\nContent-Length: 5\r\n", "hello"),
            Some(400),
            Closes,
            Nothing,
            "RFC 9112 §5.1: whitespace between name and colon must be refused with 400",
        ),
        case(
            "tab before the colon",
            post("/tab-colon", "Content-Length\t: 5\r\n", "hello"),
            Some(400),
            Closes,
            Nothing,
            "as for a space",
        ),
        case(
            "obs-fold",
            "GET /obs-fold HTTP/1.1\r\nHost: g\r\nX-Folded: a\r\n b\r\n\r\n",
            Some(400),
            Closes,
            Nothing,
            "RFC 9112 §5.2: a server must refuse obs-fold or replace it; the gateway refuses",
        ),
        case(
            "obs-fold with a tab",
            "GET /obs-fold-tab HTTP/1.1\r\nHost: g\r\nX-Folded: a\r\n\tb\r\n\r\n",
            Some(400),
            Closes,
            Nothing,
            "as for a space",
        ),
        case(
            "header line without a colon",
            "GET /no-colon HTTP/1.1\r\nHost: g\r\nX-Broken\r\n\r\n",
            Some(400),
            Closes,
            Nothing,
            "not a field line",
        ),
        case(
            "NUL in a header value",
            "GET /nul HTTP/1.1\r\nHost: g\r\nX-Nul: a\0b\r\n\r\n",
            Some(400),
            Closes,
            Nothing,
            "RFC 9110 §5.5: NUL must be refused",
        ),
        case(
            "bare CR in a header value",
            "GET /bare-cr HTTP/1.1\r\nHost: g\r\nX-Cr: a\rb\r\n\r\n",
            Some(400),
            Closes,
            Nothing,
            "RFC 9112 §2.2: a bare CR must be refused or replaced",
        ),
        // Line endings.
        case(
            "bare LF line endings",
            "GET /bare-lf HTTP/1.1\nHost: g\n\n",
            Some(200),
            KeepsOpen,
            Whole("/bare-lf", ""),
            "RFC 9112 §2.2 lets a recipient accept LF; the upstream gets the head re-written with CRLF",
        ),
        case(
            "mixed line endings with a body",
            "POST /mixed-lf HTTP/1.1\r\nHost: g\nContent-Length: 5\r\n\nhello",
            Some(200),
            KeepsOpen,
            Whole("/mixed-lf", "hello"),
            "as above; the body starts after the first empty line either way",
        ),
        // Request lines.
        case(
            "two spaces in the request line",
            "GET  /two-spaces HTTP/1.1\r\nHost: g\r\n\r\n",
            Some(400),
            Closes,
            Nothing,
            "RFC 9112 §3: single spaces; readers split the line differently",
        ),
        case(
            "lower-case version",
            "GET /lower-version http/1.1\r\nHost: g\r\n\r\n",
            Some(400),
            Closes,
            Nothing,
            "HTTP-name is case-sensitive",
        ),
        // Over-long heads.
        case(
            "URI over 64 KiB",
            format!("GET /{} HTTP/1.1\r\nHost: g\r\n\r\n", "u".repeat(66 * 1024)),
            Some(414),
            Closes,
            Nothing,
            "URI Too Long, before anything is routed",
        ),
        case(
            "101 header lines",
            format!("GET /many-headers HTTP/1.1\r\nHost: g\r\n{}\r\n", "X-H: 1\r\n".repeat(100)),
            Some(431),
            Closes,
            Nothing,
            "at most 100 header lines",
        ),
        case(
            "head longer than the read buffer",
            format!("GET /endless-head HTTP/1.1\r\nHost: g\r\nX-Long: {}", "l".repeat(80 * 1024)),
            Some(431),
            Closes,
            Nothing,
            "the head may not grow past the 64 KiB header limit plus 8 KiB, even before it ends",
        ),
    ]
}

/// What the client got for one case, compared with the table; `Err` describes the difference.
async fn run_case(edge: &RawEdge, case: &Case) -> Result<()> {
    let mut connection = RawConnection::open(edge.addr()).await?;
    connection.send(case.request.as_bytes()).await?;
    let method = case.request.split(' ').next().unwrap_or("");
    match (connection.next(method).await?, case.status) {
        (Next::Response(response), Some(status)) if response.status == status => {}
        (Next::Response(response), _) => {
            bail!("got {} {:?}, want {:?}", response.status, response.text(), case.status)
        }
        (Next::Closed, None) => {}
        (Next::Closed, Some(status)) => bail!("closed without a response, want {status}"),
    }
    match case.then {
        Then::Closes => connection.closes().await?,
        Then::KeepsOpen => {
            connection.send(b"GET /next HTTP/1.1\r\nHost: g\r\n\r\n").await?;
            let next = connection.response("GET").await?;
            if (next.status, next.text().as_str()) != (200, "GET /next ") {
                bail!("the next request on the connection got {} {:?}", next.status, next.text());
            }
        }
    }
    Ok(())
}

/// The whole requests (path, body) a case must deliver upstream, its follow-up included.
fn expected_whole(case: &Case) -> Vec<(String, String)> {
    let mut whole = Vec::new();
    if let Whole(path, body) = case.upstream {
        whole.push((path.to_owned(), body.to_owned()));
    }
    if case.then == KeepsOpen {
        whole.push(("/next".to_owned(), String::new()));
    }
    whole
}

fn whole_requests(requests: &[Received]) -> Vec<(String, String)> {
    requests
        .iter()
        .filter(|r| r.complete)
        .map(|r| (r.path().to_owned(), String::from_utf8_lossy(&r.body).into_owned()))
        .collect()
}

#[tokio::test]
async fn framing_and_smuggling_table() -> Result<()> {
    let edge = RawEdge::start(echo_reply).await?;
    let cases = cases();
    let mut failures = Vec::new();
    let mut want = Vec::new();
    for case in &cases {
        let before = edge.upstream.requests().len();
        if let Err(e) = run_case(&edge, case).await {
            failures.push(format!("{}: {e:#} (expected because {})", case.name, case.why));
        }
        // What reached the upstream for this case, once the table's share has
        // arrived (a request that should not have reached it shows here too).
        let expected = expected_whole(case);
        let _ = edge.wait_requests(before + expected.len()).await;
        let got = whole_requests(&edge.upstream.requests()[before..]);
        if got != expected {
            failures.push(format!("{}: the upstream's whole requests are {got:?}, want {expected:?}", case.name));
        }
        want.extend(expected);
    }
    // A last request through, so anything still on its way arrives before the final count.
    let mut last = RawConnection::open(edge.addr()).await?;
    last.send(b"GET /last HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n").await?;
    assert_eq!(last.response("GET").await?.status, 200);
    want.push(("/last".to_owned(), String::new()));
    let _ = edge.wait_requests(want.len()).await;
    let requests = edge.upstream.requests();
    for request in &requests {
        if request.ambiguous {
            failures.push(format!("an ambiguously framed request reached the upstream: {request:?}"));
        }
        if request.path() == "/smuggled" {
            failures.push("a smuggled request reached the upstream".to_owned());
        }
    }
    if whole_requests(&requests) != want {
        failures.push(format!("the upstream's whole requests are {:?}, want {want:?}", whole_requests(&requests)));
    }
    for case in &cases {
        match case.upstream {
            Nothing => {
                let path = case.request.split(' ').nth(1).unwrap_or("");
                if requests.iter().any(|r| r.target == path) {
                    failures.push(format!("{}: reached the upstream", case.name));
                }
            }
            NoWhole(path) => {
                if requests.iter().any(|r| r.path() == path && r.complete) {
                    failures.push(format!("{}: a whole request reached the upstream", case.name));
                }
            }
            Whole(..) => {}
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}\ngateway stderr:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n"),
        edge.edge.dp.process.stderr()
    );
    Ok(())
}

/// Pipelined requests (all written at once) are answered in order, each with
/// its own answer, though the first is the slowest upstream; a request
/// inside another's body stays body; after a bad request in the pipeline
/// the gateway answers 400 and closes, and what follows never reaches the
/// upstream.
#[tokio::test]
async fn pipelined_requests_are_answered_in_order_and_kept_apart() -> Result<()> {
    let edge = RawEdge::start(|request| match request.path() {
        // The first answer comes last upstream: order must still hold.
        "/slow" => match echo_reply(request) {
            Reply::Send(bytes) => Reply::SendAfter(Duration::from_millis(200), bytes),
            other => other,
        },
        _ => echo_reply(request),
    })
    .await?;
    let inner = "GET /inner HTTP/1.1\r\nHost: g\r\n\r\n";
    let batch = format!(
        "GET /slow HTTP/1.1\r\nHost: g\r\n\r\n\
         POST /carrier HTTP/1.1\r\nHost: g\r\nContent-Length: {}\r\n\r\n{inner}\
         HEAD /head HTTP/1.1\r\nHost: g\r\n\r\n\
         POST /chunked HTTP/1.1\r\nHost: g\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n\
         GET /third?x=1 HTTP/1.1\r\nHost: g\r\n\r\n",
        inner.len()
    );
    let mut connection = RawConnection::open(edge.addr()).await?;
    connection.send(batch.as_bytes()).await?;
    let mut answers = Vec::new();
    for method in ["GET", "POST", "HEAD", "POST", "GET"] {
        let response = connection.response(method).await?;
        answers.push((response.status, response.text()));
    }
    let want = [
        (200, "GET /slow ".to_owned()),
        (200, format!("POST /carrier {inner}")),
        (200, String::new()),
        (200, "POST /chunked abc".to_owned()),
        (200, "GET /third?x=1 ".to_owned()),
    ];
    assert_eq!(answers, want);
    let requests = edge.wait_requests(5).await?;
    let seen: Vec<(&str, &str, String)> = requests
        .iter()
        .map(|r| (r.method.as_str(), r.target.as_str(), String::from_utf8_lossy(&r.body).into_owned()))
        .collect();
    assert_eq!(
        seen,
        [
            ("GET", "/slow", String::new()),
            ("POST", "/carrier", inner.to_owned()),
            ("HEAD", "/head", String::new()),
            ("POST", "/chunked", "abc".to_owned()),
            ("GET", "/third?x=1", String::new()),
        ]
    );
    assert!(requests.iter().all(|r| r.complete && !r.ambiguous), "{requests:?}");

    // A malformed request in the middle of a pipeline ends it.
    let batch = "GET /before HTTP/1.1\r\nHost: g\r\n\r\n\
                 GET /bad HTTP/1.1\r\nHost: g\r\nX-Folded: a\r\n b\r\n\r\n\
                 GET /after HTTP/1.1\r\nHost: g\r\n\r\n";
    let mut connection = RawConnection::open(edge.addr()).await?;
    connection.send(batch.as_bytes()).await?;
    let before = connection.response("GET").await?;
    assert_eq!((before.status, before.text().as_str()), (200, "GET /before "));
    assert_eq!(connection.response("GET").await?.status, 400);
    connection.closes().await?;
    let paths = edge.upstream.paths();
    assert_eq!(paths.last().map(String::as_str), Some("/before"), "{paths:?}");
    assert!(!paths.iter().any(|p| p == "/bad" || p == "/after" || p == "/inner"), "{paths:?}");
    Ok(())
}

/// `Expect: 100-continue`: the gateway says 100 Continue, the client then
/// sends the body and the upstream gets it; a request the gateway refuses by
/// its head alone (over the size limit by its Content-Length) gets the final
/// answer instead of 100, and nothing reaches the upstream.
#[tokio::test]
async fn expect_100_continue() -> Result<()> {
    let edge = RawEdge::start(echo_reply).await?;
    let mut connection = RawConnection::open(edge.addr()).await?;
    connection.send(b"POST /expect HTTP/1.1\r\nHost: g\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n").await?;
    match connection.next("POST").await? {
        Next::Response(response) if response.status == 100 => {}
        other => bail!("want 100 Continue before the body is sent, got {other:?}"),
    }
    connection.send(b"hello").await?;
    let response = connection.response("POST").await?;
    assert_eq!((response.status, response.text().as_str()), (200, "POST /expect hello"));
    let requests = edge.wait_requests(1).await?;
    assert_eq!((requests[0].path(), requests[0].body.as_slice()), ("/expect", b"hello".as_slice()));

    let mut connection = RawConnection::open(edge.addr()).await?;
    connection
        .send(b"POST /limited/big HTTP/1.1\r\nHost: g\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n")
        .await?;
    match connection.next("POST").await? {
        Next::Response(response) if response.status == 413 => {}
        other => bail!("want 413 without 100 Continue, got {other:?}"),
    }
    // The same on the open route afterwards is served: the refusal left nothing behind.
    let mut connection = RawConnection::open(edge.addr()).await?;
    connection.send(b"POST /expect-again HTTP/1.1\r\nHost: g\r\nContent-Length: 2\r\n\r\nok").await?;
    assert_eq!(connection.response("POST").await?.text(), "POST /expect-again ok");
    assert_eq!(edge.upstream.paths(), ["/expect", "/expect-again"]);
    Ok(())
}

/// What every answer says of itself, whichever writer sends it (the
/// gateway's own for the usual request, hyper's once a connection carried
/// a chunked upload): a `Date`, exactly one framing, and, to a client that
/// asks to close, `Connection: close` and then the close.
#[tokio::test]
async fn answers_are_dated_framed_once_and_close_when_asked() -> Result<()> {
    let edge = RawEdge::start(echo_reply).await?;
    let mut connection = RawConnection::open(edge.addr()).await?;
    let sequence = [
        ("GET /one HTTP/1.1\r\nHost: g\r\n\r\n", "GET", 200),
        // The gateway's own answer: over the size limit by its Content-Length.
        ("POST /limited/big HTTP/1.1\r\nHost: g\r\nContent-Length: 20\r\n\r\n01234567890123456789", "POST", 413),
        ("POST /chunked HTTP/1.1\r\nHost: g\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", "POST", 200),
        ("GET /two HTTP/1.1\r\nHost: g\r\n\r\n", "GET", 200),
    ];
    for (request, method, status) in sequence {
        connection.send(request.as_bytes()).await?;
        let response = connection.response(method).await?;
        assert_eq!(response.status, status, "{request:?}: {response:?}");
        let date = response.header("date").unwrap_or_default();
        assert!(date.ends_with(" GMT") && date.len() == 29, "{request:?}: Date {date:?}");
        assert_eq!(response.header("content-length"), Some(response.body.len().to_string().as_str()), "{request:?}");
        assert_eq!(response.header("transfer-encoding"), None, "{request:?}");
    }
    let mut connection = RawConnection::open(edge.addr()).await?;
    connection.send(b"GET /last HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n").await?;
    let response = connection.response("GET").await?;
    assert_eq!((response.status, response.text().as_str()), (200, "GET /last "));
    assert_eq!(response.header("connection"), Some("close"));
    connection.closes().await?;
    assert_eq!(edge.upstream.paths(), ["/one", "/chunked", "/two", "/last"]);
    Ok(())
}

/// A body that arrives after its head, in pieces, reaches the upstream
/// whole, and the connection then carries the next request, even when it
/// came in the same segment as the body's last bytes; a body the client
/// cuts short by closing never reaches the upstream whole.
#[tokio::test]
async fn a_body_arriving_after_its_head_is_streamed_and_the_connection_goes_on() -> Result<()> {
    let edge = RawEdge::start(echo_reply).await?;
    let mut connection = RawConnection::open(edge.addr()).await?;
    connection.send(b"POST /pieces HTTP/1.1\r\nHost: g\r\nContent-Length: 11\r\n\r\nhel").await?;
    for piece in ["lo ", "wor"] {
        tokio::time::sleep(Duration::from_millis(50)).await;
        connection.send(piece.as_bytes()).await?;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    connection.send(b"ldGET /next HTTP/1.1\r\nHost: g\r\n\r\n").await?;
    let response = connection.response("POST").await?;
    assert_eq!((response.status, response.text().as_str()), (200, "POST /pieces hello world"));
    let response = connection.response("GET").await?;
    assert_eq!((response.status, response.text().as_str()), (200, "GET /next "));

    let mut cut = RawConnection::open(edge.addr()).await?;
    cut.send(b"POST /cut HTTP/1.1\r\nHost: g\r\nContent-Length: 10\r\n\r\nhalf").await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(cut);
    connection.send(b"GET /after HTTP/1.1\r\nHost: g\r\n\r\n").await?;
    assert_eq!(connection.response("GET").await?.text(), "GET /after ");
    let requests = edge.wait_requests(3).await?;
    let whole: Vec<(&str, &[u8])> =
        requests.iter().filter(|r| r.complete).map(|r| (r.path(), r.body.as_slice())).collect();
    assert_eq!(whole, [("/pieces", &b"hello world"[..]), ("/next", b""), ("/after", b"")], "{requests:?}");
    Ok(())
}

/// The forwarding fields reach the target alike whether the gateway's own
/// HTTP/1.1 writer writes them (a request in origin form) or they go
/// through the request's header map (one in absolute form, whose host the
/// map path takes from the URI): earlier proxies' `X-Forwarded-For` and
/// `Via` are appended to, the client's `X-Forwarded-Proto` and
/// `X-Forwarded-Host` are replaced, and `Host` is the target's.
#[tokio::test]
async fn forwarding_fields_reach_the_target_alike_from_the_writer_and_from_the_map() -> Result<()> {
    let edge = RawEdge::start(echo_reply).await?;
    let target_host = edge.upstream.url().trim_start_matches("http://").to_owned();
    let fields = "Host: shop.example\r\nX-Forwarded-For: 1.2.3.4\r\nX-Forwarded-For: 5.6.7.8\r\n\
                  X-Forwarded-Proto: https\r\nX-Forwarded-Host: evil.example\r\nVia: 1.0 edge\r\nAccept: */*\r\n";
    let mut connection = RawConnection::open(edge.addr()).await?;
    for target in ["/writer", "http://shop.example/map"] {
        connection.send(format!("GET {target} HTTP/1.1\r\n{fields}\r\n").as_bytes()).await?;
        assert_eq!(connection.response("GET").await?.status, 200, "{target}");
    }
    // Without a Host (HTTP/1.0): no host to name, and the client's claim of one is not kept.
    connection
        .send(b"GET /no-host HTTP/1.0\r\nX-Forwarded-Host: evil.example\r\nConnection: keep-alive\r\n\r\n")
        .await?;
    assert_eq!(connection.response("GET").await?.status, 200);
    let requests = edge.wait_requests(3).await?;
    let seen = |path: &str| {
        let request = requests.iter().find(|r| r.path() == path).expect("forwarded");
        // Each request's own ID, made by the gateway: present, and not compared.
        let mut fields: Vec<_> = request.headers.iter().filter(|(name, _)| name != "x-request-id").cloned().collect();
        assert_eq!(fields.len() + 1, request.headers.len(), "{path}: one request ID");
        fields.sort();
        fields
    };
    let want = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        let mut pairs: Vec<_> = pairs.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect();
        pairs.sort();
        pairs
    };
    let forwarded = want(&[
        ("accept", "*/*"),
        ("host", &target_host),
        ("via", "1.0 edge, 1.1 sluice"),
        ("x-forwarded-for", "1.2.3.4, 5.6.7.8, 127.0.0.1"),
        ("x-forwarded-host", "shop.example"),
        ("x-forwarded-proto", "http"),
    ]);
    assert_eq!(seen("/writer"), forwarded);
    assert_eq!(seen("/map"), forwarded);
    let no_host = want(&[
        ("host", &target_host),
        ("via", "1.0 sluice"),
        ("x-forwarded-for", "127.0.0.1"),
        ("x-forwarded-proto", "http"),
    ]);
    assert_eq!(seen("/no-host"), no_host);
    Ok(())
}

/// A request for an API without policies keeps its fields out of any header
/// map, as the client sent them, up to the target's writer; one in absolute
/// form goes through the map. So do those of an API whose policies name the
/// fields they read (`/limited`, which moves `Content-Length` into the map,
/// and `/counted`, which reads none), but not those of `/mapped`, whose
/// header rules may read any. All must reach the target alike, and a field
/// the gateway takes out or replaces must send the request the map's way.
#[tokio::test]
async fn fields_kept_as_sent_reach_the_target_as_those_through_the_map() -> Result<()> {
    let edge = RawEdge::start(echo_reply).await?;
    let target_host = edge.upstream.url().trim_start_matches("http://").to_owned();
    let fields = "Host: shop.example\r\nAccept: */*\r\nConnection: keep-alive\r\nUser-Agent: t/1\r\n\
                  Content-Type: text/plain\r\nX-Spaced:   a  b \t\r\nX-Twice: 1\r\nX-Twice: 2\r\nContent-Length: 5\r\n";
    let mut connection = RawConnection::open(edge.addr()).await?;
    let mut answered_ids = Vec::new();
    let paths = ["/as-sent", "/map", "/limited/as-sent", "/counted/as-sent", "/mapped/as-sent"];
    for target in ["/as-sent", "http://shop.example/map", "/limited/as-sent", "/counted/as-sent", "/mapped/as-sent"] {
        connection.send(format!("POST {target} HTTP/1.1\r\n{fields}\r\nhello").as_bytes()).await?;
        let response = connection.response("POST").await?;
        assert_eq!(response.status, 200, "{target}");
        let id = response.headers.iter().find(|(name, _)| name == "x-request-id").map(|(_, value)| value.clone());
        answered_ids.push(id.expect("a request ID in the response"));
    }
    // Each field below is taken out or replaced before the target: the request goes the map's way.
    let taken = [
        "Connection: keep-alive, X-Secret\r\nX-Secret: 1\r\n",
        "Keep-Alive: timeout=5\r\n",
        "Proxy-Authorization: Basic eDp5\r\n",
        "X-Consumer-Username: admin\r\n",
        "X_Consumer_Username: admin\r\n",
        "X-Forwarded-Proto: https\r\n",
    ];
    for (i, field) in taken.iter().enumerate() {
        connection.send(format!("GET /taken/{i} HTTP/1.1\r\nHost: shop.example\r\n{field}\r\n").as_bytes()).await?;
        assert_eq!(connection.response("GET").await?.status, 200, "{field}");
    }
    let requests = edge.wait_requests(paths.len() + taken.len()).await?;
    let seen = |path: &str| {
        let request = requests.iter().find(|r| r.path() == path).expect("forwarded");
        let fields: Vec<_> = request.headers.iter().filter(|(name, _)| name != "x-request-id").cloned().collect();
        (fields, String::from_utf8_lossy(&request.body).into_owned())
    };
    // One request ID each, the gateway's, which the client was answered with.
    for (path, answered) in paths.iter().zip(&answered_ids) {
        let request = requests.iter().find(|r| r.path() == *path).expect("forwarded");
        let ids: Vec<_> = request.headers.iter().filter(|(name, _)| name == "x-request-id").map(|(_, v)| v).collect();
        assert_eq!(ids, [answered], "{path}");
    }
    let (as_sent, body) = seen("/as-sent");
    assert_eq!(body, "hello");
    let mut sorted = as_sent.clone();
    sorted.sort();
    let mut want: Vec<(String, String)> = [
        ("accept", "*/*"),
        ("content-length", "5"),
        ("content-type", "text/plain"),
        ("host", target_host.as_str()),
        ("user-agent", "t/1"),
        ("via", "1.1 sluice"),
        ("x-forwarded-for", "127.0.0.1"),
        ("x-forwarded-host", "shop.example"),
        ("x-forwarded-proto", "http"),
        ("x-spaced", "a  b"),
        ("x-twice", "1"),
        ("x-twice", "2"),
    ]
    .iter()
    .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
    .collect();
    want.sort();
    assert_eq!(sorted, want);
    // Repeated fields keep their order.
    let twice: Vec<_> = as_sent.iter().filter(|(name, _)| name == "x-twice").map(|(_, v)| v.as_str()).collect();
    assert_eq!(twice, ["1", "2"]);
    for path in &paths[1..] {
        let (mut fields, body) = seen(path);
        fields.sort();
        assert_eq!((&fields, body.as_str()), (&want, "hello"), "{path}");
    }
    for (i, field) in taken.iter().enumerate() {
        let (fields, _) = seen(&format!("/taken/{i}"));
        let names: Vec<&str> = fields.iter().map(|(name, _)| name.as_str()).collect();
        for gone in [
            "connection",
            "x-secret",
            "keep-alive",
            "proxy-authorization",
            "x-consumer-username",
            "x_consumer_username",
        ] {
            assert!(!names.contains(&gone), "{field}: {names:?}");
        }
        let proto: Vec<_> =
            fields.iter().filter(|(name, _)| name == "x-forwarded-proto").map(|(_, v)| v.as_str()).collect();
        assert_eq!(proto, ["http"], "{field}");
    }
    Ok(())
}
