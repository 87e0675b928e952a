//! An upstream that speaks raw HTTP/1.1 over TCP, for the gateway's
//! conformance tests: it records every byte each connection delivered and
//! every request it framed from them, and answers with exactly the bytes a
//! test scripts, malformed ones included (a body longer than its
//! `Content-Length`, a 204 with a body, a close before or in the middle of a
//! response), which a well-behaved server library would never send.
//!
//! Its request parser frames bodies the strict way (RFC 9112 §6): it flags a
//! request that carries both `Content-Length` and `Transfer-Encoding`, or
//! more than one `Content-Length`, instead of picking one, so a test can
//! assert that the gateway never sent an ambiguous request upstream.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// One request as it reached the upstream.
#[derive(Debug, Clone, Default)]
pub struct Received {
    /// Which accepted connection it came on, counted from 0.
    pub connection: usize,
    pub method: String,
    /// The request target as sent.
    pub target: String,
    /// Header lines in order, names in lower case, values trimmed.
    pub headers: Vec<(String, String)>,
    /// The body after de-chunking.
    pub body: Vec<u8>,
    /// Both `Content-Length` and `Transfer-Encoding`, or several
    /// `Content-Length` lines, or a `Transfer-Encoding` other than `chunked`:
    /// a request whose length two parsers could read differently.
    pub ambiguous: bool,
    /// The body arrived whole (false: the connection ended or broke first).
    pub complete: bool,
}

impl Received {
    /// Every value of header `name` (lower case).
    pub fn header_values(&self, name: &str) -> Vec<&str> {
        self.headers.iter().filter(|(n, _)| n == name).map(|(_, v)| v.as_str()).collect()
    }

    /// The path of the request target (the part before any `?`).
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }
}

/// What the upstream does once it has read a request (head and body).
#[derive(Debug, Clone)]
pub enum Reply {
    /// Write these bytes and keep reading requests on the connection.
    Send(Vec<u8>),
    /// Wait, then write these bytes and keep the connection.
    SendAfter(Duration, Vec<u8>),
    /// Write these bytes, then close the connection.
    SendAndClose(Vec<u8>),
    /// Close the connection without writing anything.
    Close,
}

impl Reply {
    /// A complete `200 OK` whose body is `body`, framed by `Content-Length`.
    pub fn ok(body: &str) -> Reply {
        Reply::Send(format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len()).into_bytes())
    }
}

type Script = dyn Fn(&Received) -> Reply + Send + Sync;

#[derive(Default)]
struct Log {
    /// Every byte each connection delivered, by connection.
    bytes: Vec<Vec<u8>>,
    requests: Vec<Received>,
}

/// A raw upstream on `127.0.0.1`, port chosen by the system; it stops when dropped.
pub struct RawUpstream {
    pub addr: SocketAddr,
    log: Arc<Mutex<Log>>,
    accept: JoinHandle<()>,
}

impl RawUpstream {
    /// Starts the upstream; `script` decides the reply to each request.
    pub async fn start(script: impl Fn(&Received) -> Reply + Send + Sync + 'static) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let log = Arc::new(Mutex::new(Log::default()));
        let script: Arc<Script> = Arc::new(script);
        let accept = {
            let log = log.clone();
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let connection = match log.lock() {
                        Ok(mut log) => {
                            log.bytes.push(Vec::new());
                            log.bytes.len() - 1
                        }
                        Err(_) => return,
                    };
                    tokio::spawn(serve(stream, connection, log.clone(), script.clone()));
                }
            })
        };
        Ok(RawUpstream { addr, log, accept })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The requests framed so far, in the order they were read.
    pub fn requests(&self) -> Vec<Received> {
        self.log.lock().map(|log| log.requests.clone()).unwrap_or_default()
    }

    /// The paths of the requests framed so far.
    pub fn paths(&self) -> Vec<String> {
        self.requests().iter().map(|r| r.path().to_owned()).collect()
    }

    /// Every byte that reached the upstream on any connection.
    pub fn bytes_received(&self) -> usize {
        self.log.lock().map(|log| log.bytes.iter().map(Vec::len).sum()).unwrap_or(0)
    }

    /// How many connections the upstream accepted.
    pub fn connections(&self) -> usize {
        self.log.lock().map(|log| log.bytes.len()).unwrap_or(0)
    }

    /// What connection `n` delivered, as text (for failure messages).
    pub fn raw(&self, n: usize) -> String {
        self.log
            .lock()
            .ok()
            .and_then(|log| log.bytes.get(n).map(|b| String::from_utf8_lossy(b).into_owned()))
            .unwrap_or_default()
    }
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// A connection's bytes, read as needed and logged as they arrive.
struct Conn {
    stream: TcpStream,
    buffer: Vec<u8>,
    connection: usize,
    log: Arc<Mutex<Log>>,
}

impl Conn {
    /// Reads more; false at the end of the stream or on an error.
    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 16 * 1024];
        match self.stream.read(&mut chunk).await {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buffer.extend_from_slice(&chunk[..n]);
                if let Ok(mut log) = self.log.lock()
                    && let Some(bytes) = log.bytes.get_mut(self.connection)
                {
                    bytes.extend_from_slice(&chunk[..n]);
                }
                true
            }
        }
    }

    /// Takes bytes up to and including `delimiter`; None if the stream ends first.
    async fn take_through(&mut self, delimiter: &[u8]) -> Option<Vec<u8>> {
        loop {
            if let Some(at) = self.buffer.windows(delimiter.len()).position(|w| w == delimiter) {
                return Some(self.buffer.drain(..at + delimiter.len()).collect());
            }
            if !self.fill().await {
                return None;
            }
        }
    }

    /// Takes exactly `n` bytes; None if the stream ends first.
    async fn take(&mut self, n: usize) -> Option<Vec<u8>> {
        while self.buffer.len() < n {
            if !self.fill().await {
                return None;
            }
        }
        Some(self.buffer.drain(..n).collect())
    }
}

async fn serve(stream: TcpStream, connection: usize, log: Arc<Mutex<Log>>, script: Arc<Script>) {
    let mut conn = Conn { stream, buffer: Vec::new(), connection, log };
    loop {
        let Some(head) = conn.take_through(b"\r\n\r\n").await else { return };
        let mut request = match parse_head(&head) {
            Ok(request) => request,
            Err(_) => {
                let _ = conn.stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n").await;
                return;
            }
        };
        request.connection = connection;
        request.complete = read_body(&mut conn, &mut request).await;
        let complete = request.complete;
        if let Ok(mut log) = conn.log.lock() {
            log.requests.push(request.clone());
        }
        if !complete {
            return;
        }
        match script(&request) {
            Reply::Send(bytes) => {
                if conn.stream.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            Reply::SendAfter(delay, bytes) => {
                tokio::time::sleep(delay).await;
                if conn.stream.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            Reply::SendAndClose(bytes) => {
                let _ = conn.stream.write_all(&bytes).await;
                let _ = conn.stream.shutdown().await;
                return;
            }
            Reply::Close => return,
        }
    }
}

fn parse_head(head: &[u8]) -> Result<Received> {
    let text = std::str::from_utf8(head).context("request head is not UTF-8")?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().context("no request line")?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(_version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        bail!("bad request line {request_line:?}");
    };
    let mut headers = Vec::new();
    for line in lines.filter(|line| !line.is_empty()) {
        let (name, value) = line.split_once(':').with_context(|| format!("bad header line {line:?}"))?;
        if name.is_empty() || name.trim() != name {
            bail!("bad header name {name:?}");
        }
        headers.push((name.to_ascii_lowercase(), value.trim().to_owned()));
    }
    Ok(Received { method: method.to_owned(), target: target.to_owned(), headers, ..Default::default() })
}

/// Reads the request's body by its framing; whether it arrived whole.
async fn read_body(conn: &mut Conn, request: &mut Received) -> bool {
    let lengths = request.header_values("content-length").len();
    let codings: Vec<String> = request
        .header_values("transfer-encoding")
        .iter()
        .flat_map(|v| v.split(','))
        .map(|c| c.trim().to_ascii_lowercase())
        .collect();
    request.ambiguous = lengths > 1 || (lengths > 0 && !codings.is_empty()) || codings.iter().any(|c| c != "chunked");
    if !codings.is_empty() {
        return match read_chunked(conn).await {
            Some(body) => {
                request.body = body;
                true
            }
            None => false,
        };
    }
    let length = request.header_values("content-length").first().and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
    match conn.take(length).await {
        Some(body) => {
            request.body = body;
            true
        }
        None => false,
    }
}

async fn read_chunked(conn: &mut Conn) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line = conn.take_through(b"\r\n").await?;
        let line = std::str::from_utf8(&line[..line.len() - 2]).ok()?;
        let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            // Trailer lines, then the empty line.
            loop {
                let trailer = conn.take_through(b"\r\n").await?;
                if trailer == b"\r\n" {
                    return Some(body);
                }
            }
        }
        let data = conn.take(size + 2).await?;
        if !data.ends_with(b"\r\n") {
            return None;
        }
        body.extend_from_slice(&data[..size]);
    }
}
