//! A raw HTTP/1.1 client for hostile-request and conformance tests: it sends
//! exactly the bytes it is given (paths as `curl --path-as-is` sends them,
//! repeated or malformed headers, ambiguous framing), which a well-behaved
//! client library would refuse or clean up first, and reads either the one
//! response of a `Connection: close` exchange or, on a kept-open
//! [`RawConnection`], one response at a time by its framing. And [`Edge`],
//! the real `sluice-dp` process these tests attack, with an echo upstream per
//! API or upstreams the test runs itself.

#![allow(dead_code)]

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::time::Duration;

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use sluice_proto::v1;

use sluice_testkit::raw_upstream::{RawUpstream, Received, Reply};

use crate::fake_cp::{FakeControlPlane, seal};
use crate::support::{DataPlane, Upstream, client, eventually};

/// A real `sluice-dp` process serving some APIs, each forwarding to an echo
/// upstream process named as the API's `upstream`, so the upstream that
/// answers tells which API routed the request.
pub struct Edge {
    pub dp: DataPlane,
    pub upstreams: BTreeMap<String, Upstream>,
    _cp: FakeControlPlane,
}

impl Edge {
    /// Starts the upstreams, then a data plane with `flags`, and applies a snapshot of `apis`.
    pub async fn start(apis: Vec<v1::Api>, flags: &[&str]) -> Result<Self> {
        Self::start_with(v1::Snapshot { apis, ..Default::default() }, flags).await
    }

    /// The same with a snapshot of APIs and consumers; the upstreams are added here.
    pub async fn start_with(snapshot: v1::Snapshot, flags: &[&str]) -> Result<Self> {
        Self::start_with_targets(snapshot, &[], flags).await
    }

    /// The same, but the upstreams named in `targets` are the given URLs
    /// (servers the test runs itself); only the others get an echo process.
    pub async fn start_with_targets(
        mut snapshot: v1::Snapshot,
        targets: &[(&str, String)],
        flags: &[&str],
    ) -> Result<Self> {
        let mut upstreams = BTreeMap::new();
        for api in &snapshot.apis {
            let given = targets.iter().any(|(name, _)| *name == api.upstream);
            if !given && !upstreams.contains_key(&api.upstream) {
                upstreams.insert(api.upstream.clone(), Upstream::start(&api.upstream).await?);
            }
        }
        let mut cp = FakeControlPlane::start().await?;
        let dp = DataPlane::start(&cp.url(), flags).await?;
        let mut conn = cp.accept().await?;
        snapshot.version = 1;
        let urls = upstreams.iter().map(|(name, upstream)| (name.clone(), upstream.url()));
        let given = targets.iter().map(|(name, url)| ((*name).to_owned(), url.clone()));
        snapshot.upstreams = urls
            .chain(given)
            .map(|(name, url)| v1::Upstream {
                name,
                targets: vec![v1::Target { url, weight: 1 }],
                ..Default::default()
            })
            .collect();
        conn.push(seal(snapshot)).await?;
        conn.ack().await?;
        Ok(Edge { dp, upstreams, _cp: cp })
    }

    pub fn addr(&self) -> SocketAddr {
        self.dp.http_addr
    }

    /// How many requests each upstream has answered so far.
    pub async fn received(&self) -> Result<BTreeMap<&str, u64>> {
        let mut counts = BTreeMap::new();
        for (name, upstream) in &self.upstreams {
            let report: Value = client().get(format!("{}/__received", upstream.url())).send().await?.json().await?;
            counts.insert(name.as_str(), report["count"].as_u64().context("count")?);
        }
        Ok(counts)
    }
}

/// How long one raw exchange may take before the test fails.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    /// Header names in lower case, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The connection ended before the body its framing announced.
    pub truncated: bool,
}

impl RawResponse {
    fn is_chunked(&self) -> bool {
        self.headers.iter().any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"))
    }

    /// The body as text (lossy), for comparisons and messages.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// The body as JSON (the echo upstream's report, or problem details), or Null.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// Whether the gateway answered itself with problem details.
    pub fn is_problem(&self) -> bool {
        self.header("content-type") == Some("application/problem+json")
    }
}

/// `GET {target}` with `Host: {host}` and `Connection: close`, plus `extra` header lines.
pub fn get_request(target: &str, host: &str, extra: &[&str]) -> Vec<u8> {
    let mut text = format!("GET {target} HTTP/1.1\r\nHost: {host}\r\n");
    for line in extra {
        text.push_str(line);
        text.push_str("\r\n");
    }
    text.push_str("Connection: close\r\n\r\n");
    text.into_bytes()
}

/// Sends `request` on a new connection (blocking) and reads the response to
/// the end of the connection.
pub fn exchange_blocking(addr: SocketAddr, request: &[u8]) -> Result<RawResponse> {
    let mut stream = std::net::TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(EXCHANGE_TIMEOUT))?;
    stream.set_write_timeout(Some(EXCHANGE_TIMEOUT))?;
    stream.write_all(request)?;
    let mut bytes = Vec::new();
    // A server that closes after its answer may reset a connection whose
    // request it did not read whole; what arrived before still counts.
    if let Err(e) = stream.read_to_end(&mut bytes)
        && bytes.is_empty()
    {
        return Err(e).context("reading the response");
    }
    parse(&bytes)
}

/// [`exchange_blocking`] off the async runtime's threads.
pub async fn exchange(addr: SocketAddr, request: Vec<u8>) -> Result<RawResponse> {
    tokio::task::spawn_blocking(move || exchange_blocking(addr, &request)).await?
}

/// A kept-open client connection: requests are written as given, responses
/// read one at a time by their framing, so pipelined and keep-alive
/// exchanges can be checked response by response.
pub struct RawConnection {
    stream: tokio::net::TcpStream,
    buffer: Vec<u8>,
    /// The gateway closed its side (read returned 0 or failed).
    closed: bool,
}

/// What a kept-open connection got next.
#[derive(Debug)]
pub enum Next {
    Response(RawResponse),
    /// The connection ended before another response began.
    Closed,
}

impl RawConnection {
    pub async fn open(addr: SocketAddr) -> Result<Self> {
        let stream = tokio::net::TcpStream::connect(addr).await.with_context(|| format!("connecting to {addr}"))?;
        Ok(RawConnection { stream, buffer: Vec::new(), closed: false })
    }

    pub async fn send(&mut self, bytes: &[u8]) -> Result<()> {
        use tokio::io::AsyncWriteExt as _;
        self.stream.write_all(bytes).await.context("writing to the gateway")
    }

    /// Reads more; false once the gateway has closed (or reset) the connection.
    async fn fill(&mut self) -> Result<bool> {
        use tokio::io::AsyncReadExt as _;
        if self.closed {
            return Ok(false);
        }
        let mut chunk = [0u8; 16 * 1024];
        let read = tokio::time::timeout(EXCHANGE_TIMEOUT, self.stream.read(&mut chunk)).await;
        match read.context("the gateway neither answered nor closed")? {
            Ok(0) | Err(_) => {
                self.closed = true;
                Ok(false)
            }
            Ok(n) => {
                self.buffer.extend_from_slice(&chunk[..n]);
                Ok(true)
            }
        }
    }

    /// The next response (an interim 1xx one included) to a request with
    /// method `method`, or [`Next::Closed`]. A body cut short by the close is
    /// returned as far as it came, with `truncated` set.
    pub async fn next(&mut self, method: &str) -> Result<Next> {
        let head_end = loop {
            if let Some(at) = self.buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at;
            }
            if !self.fill().await? {
                if self.buffer.is_empty() {
                    return Ok(Next::Closed);
                }
                bail!("connection closed inside a response head: {:?}", String::from_utf8_lossy(&self.buffer));
            }
        };
        let head: Vec<u8> = self.buffer.drain(..head_end + 4).collect();
        let (status, headers) = parse_head(&head[..head_end])?;
        let mut response = RawResponse { status, headers, body: Vec::new(), truncated: false };
        let bodiless = method == "HEAD" || status < 200 || status == 204 || status == 304;
        if bodiless {
            return Ok(Next::Response(response));
        }
        if response.is_chunked() {
            self.read_chunked(&mut response).await?;
        } else if let Some(length) = response.header("content-length") {
            let length: usize = length.parse().with_context(|| format!("content-length {length:?}"))?;
            while self.buffer.len() < length && self.fill().await? {}
            let available = length.min(self.buffer.len());
            response.body = self.buffer.drain(..available).collect();
            response.truncated = available < length;
        } else {
            // Delimited by the close.
            while self.fill().await? {}
            response.body = std::mem::take(&mut self.buffer);
        }
        Ok(Next::Response(response))
    }

    /// The next final response (interim 1xx ones skipped), failing if the connection closed instead.
    pub async fn response(&mut self, method: &str) -> Result<RawResponse> {
        loop {
            match self.next(method).await? {
                Next::Response(response) if response.status < 200 => continue,
                Next::Response(response) => return Ok(response),
                Next::Closed => bail!("the connection closed instead of a response to {method}"),
            }
        }
    }

    /// Whether the gateway closes the connection with nothing more sent (it
    /// fails if more arrives, or if the connection stays open for
    /// `EXCHANGE_TIMEOUT`).
    pub async fn closes(&mut self) -> Result<()> {
        while self.fill().await.context("the connection stayed open")? {}
        if !self.buffer.is_empty() {
            bail!("more after the last response: {:?}", String::from_utf8_lossy(&self.buffer));
        }
        Ok(())
    }

    async fn read_chunked(&mut self, response: &mut RawResponse) -> Result<()> {
        loop {
            let line_end = loop {
                if let Some(at) = self.buffer.windows(2).position(|w| w == b"\r\n") {
                    break at;
                }
                if !self.fill().await? {
                    response.truncated = true;
                    return Ok(());
                }
            };
            let line: Vec<u8> = self.buffer.drain(..line_end + 2).collect();
            let size_text = std::str::from_utf8(&line[..line_end])?.split(';').next().unwrap_or("").trim().to_owned();
            let size = usize::from_str_radix(&size_text, 16).with_context(|| format!("chunk size {size_text:?}"))?;
            if size == 0 {
                // Trailers, up to the empty line.
                loop {
                    match self.buffer.windows(2).position(|w| w == b"\r\n") {
                        Some(0) => {
                            self.buffer.drain(..2);
                            return Ok(());
                        }
                        Some(at) => {
                            self.buffer.drain(..at + 2);
                        }
                        None if !self.fill().await? => {
                            response.truncated = true;
                            return Ok(());
                        }
                        None => {}
                    }
                }
            }
            while self.buffer.len() < size + 2 {
                if !self.fill().await? {
                    response.body.append(&mut self.buffer);
                    response.truncated = true;
                    return Ok(());
                }
            }
            response.body.extend(self.buffer.drain(..size));
            if self.buffer.drain(..2).as_slice() != b"\r\n" {
                bail!("chunk not followed by CRLF");
            }
        }
    }
}

/// The status code and header lines of a response head (without the blank line).
fn parse_head(head: &[u8]) -> Result<(u16, Vec<(String, String)>)> {
    let head = std::str::from_utf8(head).context("response head is not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().context("empty response")?;
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .with_context(|| format!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    Ok((status, headers))
}

fn parse(bytes: &[u8]) -> Result<RawResponse> {
    let head_end = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .with_context(|| format!("no complete response head in {:?}", String::from_utf8_lossy(bytes)))?;
    let (status, headers) = parse_head(&bytes[..head_end])?;
    let mut response = RawResponse { status, headers, body: Vec::new(), truncated: false };
    let raw_body = &bytes[head_end + 4..];
    response.body = if response.is_chunked() { dechunk(raw_body)? } else { raw_body.to_vec() };
    Ok(response)
}

fn dechunk(mut bytes: &[u8]) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = bytes.windows(2).position(|w| w == b"\r\n").context("chunk size line")?;
        let size_text = std::str::from_utf8(&bytes[..line_end])?.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16).with_context(|| format!("chunk size {size_text:?}"))?;
        bytes = &bytes[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        if bytes.len() < size + 2 {
            bail!("truncated chunk");
        }
        body.extend_from_slice(&bytes[..size]);
        bytes = &bytes[size + 2..];
    }
}

/// A real `sluice-dp` in front of one [`RawUpstream`] (upstream `raw`): `/`
/// forwards anything, `/limited` has a 16-byte request size limit,
/// `/counted` a rate limit no test reaches (it sets `RateLimit-*` on every
/// answer), `/mapped` a response header rule (which edits the answer in a
/// header map). The conformance tests send raw requests to it and compare
/// what the client got with what the upstream received.
pub struct RawEdge {
    pub edge: Edge,
    pub upstream: RawUpstream,
}

impl RawEdge {
    /// `script` answers each request the upstream reads.
    pub async fn start(script: impl Fn(&Received) -> Reply + Send + Sync + 'static) -> Result<Self> {
        use sluice_proto::v1::policy::Kind;
        let upstream = RawUpstream::start(script).await?;
        let limit = Kind::RequestSizeLimit(v1::RequestSizeLimit { max_bytes: 16 });
        let rate_limit = Kind::RateLimit(v1::RateLimit {
            requests: 1_000_000,
            period_seconds: 60,
            key: v1::RateLimitKey::Ip as i32,
            ..Default::default()
        });
        let rules = v1::HeaderRules { remove: vec!["x-never-sent".into()], ..Default::default() };
        let header_rules = Kind::Headers(v1::Headers { request: None, response: Some(rules) });
        let api = |name: &str, prefix: &str, policy: Option<Kind>| v1::Api {
            name: name.into(),
            path_prefix: prefix.into(),
            upstream: "raw".into(),
            policies: policy.map(|kind| v1::Policy { kind: Some(kind) }).into_iter().collect(),
            ..Default::default()
        };
        let apis = vec![
            api("open", "/", None),
            api("limited", "/limited", Some(limit)),
            api("counted", "/counted", Some(rate_limit)),
            api("mapped", "/mapped", Some(header_rules)),
        ];
        let snapshot = v1::Snapshot { apis, ..Default::default() };
        let edge = Edge::start_with_targets(snapshot, &[("raw", upstream.url())], &[]).await?;
        Ok(RawEdge { edge, upstream })
    }

    pub fn addr(&self) -> SocketAddr {
        self.edge.addr()
    }

    /// Waits until the upstream has framed at least `n` requests in all, and returns them all.
    pub async fn wait_requests(&self, n: usize) -> Result<Vec<Received>> {
        let what = format!("{n} requests at the upstream");
        let arrived =
            eventually(&what, Duration::from_millis(10), || async { self.upstream.requests().len() >= n }).await;
        arrived.with_context(|| {
            format!("{:?}; gateway stderr:\n{}", self.upstream.requests(), self.edge.dp.process.stderr())
        })?;
        Ok(self.upstream.requests())
    }
}

/// The upstream's usual answer: `200` naming the request it answers
/// (`{method} {target} {body}`), so a client can tell whose answer it got;
/// to a HEAD, the same head without the body.
pub fn echo_reply(request: &Received) -> Reply {
    let text = format!("{} {} {}", request.method, request.target, String::from_utf8_lossy(&request.body));
    if request.method == "HEAD" {
        return Reply::Send(format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", text.len()).into_bytes());
    }
    Reply::ok(&text)
}
