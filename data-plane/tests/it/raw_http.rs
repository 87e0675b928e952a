//! A raw HTTP/1.1 client for hostile-request tests: it sends exactly the
//! bytes it is given (paths as `curl --path-as-is` sends them, repeated or
//! malformed headers), which a well-behaved client library would refuse or
//! clean up first, and reads the one response of a `Connection: close`
//! exchange. And [`Edge`], the real `sluice-dp` process these tests attack,
//! with an echo upstream per API.

#![allow(dead_code)]

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::time::Duration;

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use sluice_proto::v1;

use crate::fake_cp::{FakeControlPlane, seal};
use crate::support::{DataPlane, Upstream, client};

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
    pub async fn start_with(mut snapshot: v1::Snapshot, flags: &[&str]) -> Result<Self> {
        let mut upstreams = BTreeMap::new();
        for api in &snapshot.apis {
            if !upstreams.contains_key(&api.upstream) {
                upstreams.insert(api.upstream.clone(), Upstream::start(&api.upstream).await?);
            }
        }
        let mut cp = FakeControlPlane::start().await?;
        let dp = DataPlane::start(&cp.url(), flags).await?;
        let mut conn = cp.accept().await?;
        snapshot.version = 1;
        snapshot.upstreams = upstreams
            .iter()
            .map(|(name, upstream)| v1::Upstream {
                name: name.clone(),
                targets: vec![v1::Target { url: upstream.url(), weight: 1 }],
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
}

impl RawResponse {
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

fn parse(bytes: &[u8]) -> Result<RawResponse> {
    let head_end = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .with_context(|| format!("no complete response head in {:?}", String::from_utf8_lossy(bytes)))?;
    let head = std::str::from_utf8(&bytes[..head_end]).context("response head is not UTF-8")?;
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
    let raw_body = &bytes[head_end + 4..];
    let chunked = headers.iter().any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let body = if chunked { dechunk(raw_body)? } else { raw_body.to_vec() };
    Ok(RawResponse { status, headers, body })
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
