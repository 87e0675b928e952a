//! `sluice-test-upstream`: the upstream service used by tests and benchmarks,
//! behind the data plane in the request flow. It answers every request with a
//! JSON echo of what arrived (so tests can see what the proxy forwarded), with
//! status and delay chosen by the request:
//!
//! * `?status=NNN` or `x-echo-status: NNN`: response status;
//! * `?delay_ms=N` or `x-echo-delay-ms: N`: wait before answering;
//! * `?discard_body=1` or `x-echo-discard-body: 1`: count the body instead of echoing it (large uploads);
//! * `GET /bytes/N`: stream N bytes back (large downloads);
//! * `GET /health`: 200, for health checks.
//! * `GET /__received`: `{"count": N}`, the number of requests answered so far
//!   (the two paths here excepted), so a test can tell that a request the
//!   gateway refused never arrived.
//!
//! HTTP/1.1 and h2c (prior knowledge) on one port. Prints `{"addr":"..."}` on stdout once bound.
//! With `--record` it also prints one JSON line per request head that arrives
//! (`{"received":{"method","path","query"}}`) and one when its body ends
//! (`{"body":{"path","complete","len"}}`), so tests can assert what reached it,
//! including requests the proxy should never have forwarded.
//! With `--tls-cert FILE --tls-key FILE` (PEM) it speaks HTTPS instead (HTTP/1.1 by ALPN), for
//! tests and benchmarks of TLS to the upstream.

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use http::{HeaderMap, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::{Map, Value, json};

#[derive(Debug, Parser)]
#[command(name = "sluice-test-upstream", about = "Echo server for Sluice tests and benchmarks")]
struct Args {
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:0")]
    addr: SocketAddr,
    /// Reported as `server` in every echo, so tests can tell upstreams apart.
    #[arg(long, default_value = "upstream")]
    name: String,
    /// PEM certificate chain: serve HTTPS (HTTP/1.1) instead of plain HTTP. Needs `--tls-key`.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// PEM private key for `--tls-cert`.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Print a JSON line on stdout for every request head and body that arrives.
    #[arg(long)]
    record: bool,
}

/// `--record`, set once at start.
static RECORD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

fn record(line: Value) {
    if RECORD.get().copied().unwrap_or(false) {
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "{line}");
        let _ = stdout.flush();
    }
}

type Body = BoxBody<Bytes, std::io::Error>;

/// Requests answered, `/health` and `/__received` left out.
static RECEIVED: AtomicU64 = AtomicU64::new(0);

const CHUNK: usize = 64 * 1024;
static ZEROES: [u8; CHUNK] = [0; CHUNK];

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = RECORD.set(args.record);
    // A gateway under test opens its upstream connections in bursts too.
    let listener = sluice_data_plane::listener::bind(args.addr)?;
    let addr = listener.local_addr()?;
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{}", json!({ "addr": addr.to_string(), "name": args.name }))?;
        stdout.flush()?;
    }

    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(tls_acceptor(cert, key)?),
        _ => None,
    };
    let name: Arc<str> = args.name.into();
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Out of file descriptors and the like: back off instead of spinning.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let name = name.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(req, name.clone()));
            // Errors here are clients hanging up mid-request; nothing to do.
            match tls {
                Some(acceptor) => {
                    let Ok(stream) = acceptor.accept(stream).await else { return };
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection_with_upgrades(TokioIo::new(stream), service)
                        .await;
                }
                None => {
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection_with_upgrades(TokioIo::new(stream), service)
                        .await;
                }
            }
        });
    }
}

/// A TLS acceptor from PEM files: TLS 1.3 and 1.2, ALPN http/1.1 only, so a
/// proxy in front speaks the same HTTP/1.1 to it whatever it offers.
fn tls_acceptor(cert: &std::path::Path, key: &std::path::Path) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    use anyhow::Context;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading {}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing {}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key).with_context(|| format!("reading {}", key.display()))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

async fn handle(req: Request<Incoming>, name: Arc<str>) -> Result<Response<Body>, Infallible> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();
    let query = parts.uri.query().unwrap_or("").to_owned();
    record(json!({ "received": { "method": parts.method.as_str(), "path": &path, "query": &query } }));

    if path == "/health" {
        return Ok(respond(StatusCode::OK, "text/plain", Bytes::from_static(b"ok\n")));
    }
    if path == "/__received" {
        let count = json!({ "count": RECEIVED.load(Ordering::Relaxed) });
        return Ok(respond(StatusCode::OK, "application/json", Bytes::from(count.to_string())));
    }
    RECEIVED.fetch_add(1, Ordering::Relaxed);

    let status = query_param(&query, "status")
        .or_else(|| header_str(&parts.headers, "x-echo-status"))
        .and_then(|s| s.parse::<u16>().ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::OK);
    let delay_ms = query_param(&query, "delay_ms")
        .or_else(|| header_str(&parts.headers, "x-echo-delay-ms"))
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0);
    let discard = query_param(&query, "discard_body")
        .or_else(|| header_str(&parts.headers, "x-echo-discard-body"))
        .is_some_and(|v| v == "1" || v == "true");

    if let Some(n) = path.strip_prefix("/bytes/").and_then(|n| n.parse::<u64>().ok()) {
        if delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        }
        return Ok(stream_bytes(status, n));
    }

    // The echo needs the whole body; a discarded body is only counted, frame
    // by frame, so a 100 MB upload costs no memory here.
    let (body_text, body_len) = if discard {
        let mut body = body;
        let mut len = 0u64;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => len += frame.data_ref().map_or(0, |d| d.len() as u64),
                Err(_) => {
                    record(json!({ "body": { "path": &path, "complete": false, "len": len } }));
                    return Ok(respond(StatusCode::BAD_REQUEST, "text/plain", Bytes::from_static(b"bad body\n")));
                }
            }
        }
        (Value::Null, len)
    } else {
        match body.collect().await {
            Ok(collected) => {
                let bytes = collected.to_bytes();
                (Value::String(String::from_utf8_lossy(&bytes).into_owned()), bytes.len() as u64)
            }
            Err(_) => {
                record(json!({ "body": { "path": &path, "complete": false } }));
                return Ok(respond(StatusCode::BAD_REQUEST, "text/plain", Bytes::from_static(b"bad body\n")));
            }
        }
    };
    record(json!({ "body": { "path": &path, "complete": true, "len": body_len } }));

    if delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    }

    let mut headers = Map::new();
    for (key, value) in &parts.headers {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        match headers.get_mut(key.as_str()) {
            // Repeated headers are joined the way HTTP allows folding them.
            Some(Value::String(existing)) => {
                existing.push_str(", ");
                existing.push_str(&value);
            }
            _ => {
                headers.insert(key.as_str().to_owned(), Value::String(value));
            }
        }
    }
    let echo = json!({
        "server": &*name,
        "method": parts.method.as_str(),
        "path": path,
        "query": query,
        "version": format!("{:?}", parts.version),
        "headers": headers,
        "body": body_text,
        "body_len": body_len,
    });
    let bytes = serde_json::to_vec(&echo).unwrap_or_default();
    Ok(respond(status, "application/json", Bytes::from(bytes)))
}

fn respond(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Body> {
    let mut response = Response::new(Full::new(body).map_err(|never| -> std::io::Error { match never {} }).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(content_type));
    response
}

/// Streams `n` zero bytes in fixed chunks without allocating them.
fn stream_bytes(status: StatusCode, n: u64) -> Response<Body> {
    let chunks = futures_util::stream::unfold(n, |left| async move {
        if left == 0 {
            return None;
        }
        let len = left.min(CHUNK as u64) as usize;
        Some((Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(&ZEROES[..len]))), left - len as u64))
    });
    let mut response = Response::new(StreamBody::new(chunks).boxed());
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/octet-stream"));
    headers.insert(header::CONTENT_LENGTH, header::HeaderValue::from(n));
    response
}

fn query_param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name).then_some(value)
    })
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}
