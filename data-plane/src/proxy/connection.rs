//! One accepted client connection: which HTTP version it speaks, then its
//! requests served until it ends, sits idle too long, or shutdown asks it to
//! finish its in-flight requests and close. HTTP/1.1 is served by `http1`
//! until a request needs hyper, which then serves the rest of the
//! connection; HTTP/2 by hyper.
//!
//! The version is told before hyper starts: by ALPN over TLS, and on plain
//! TCP by peeking at the first bytes, which stay in the socket. hyper-util's
//! `auto` connection reads those bytes itself and hands them back to hyper
//! HTTP/1.1 as a 24-byte first read; the request head then never fits hyper's
//! first 8 KiB read buffer, which grew to 16 KiB on every open connection.
//! `auto` remains for the rare plain
//! connection whose first bytes are too few to tell.

use std::fmt::Display;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use futures_util::future::Either;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::server::TlsStream;
use tracing::debug;

use super::http1::Served;
use super::idle::ConnectionActivity;
use super::inbound::HeaderLimits;
use super::when_woken::WhenWoken;
use super::workers::stopped;
use super::{Peer, Shared, client_body, handle};

/// How long an idle connection asked to close may take before it is dropped.
const IDLE_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// What an HTTP/2 client with prior knowledge sends first (RFC 9113 §3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The HTTP version a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Protocol {
    Http1,
    Http2,
    /// The first bytes so far are the start of the HTTP/2 preface and too
    /// few to tell; hyper-util's `auto` reads on until they are.
    Unsure,
}

/// A client stream that can tell which HTTP version its client speaks.
pub(super) trait ClientStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    fn protocol(&self) -> impl Future<Output = Protocol> + Send;

    /// The TLS version agreed with the client, for the access log; `None` in plain text.
    fn tls_version(&self) -> Option<&'static str> {
        None
    }
}

impl ClientStream for TcpStream {
    async fn protocol(&self) -> Protocol {
        let mut first = [0; H2_PREFACE.len()];
        match self.peek(&mut first).await {
            // Nothing to read, or a failed read: hyper's HTTP/1.1 meets it too and ends the connection.
            Ok(0) | Err(_) => Protocol::Http1,
            Ok(n) if first[..n] != H2_PREFACE[..n] => Protocol::Http1,
            Ok(n) if n == H2_PREFACE.len() => Protocol::Http2,
            Ok(_) => Protocol::Unsure,
        }
    }
}

impl ClientStream for TlsStream<TcpStream> {
    /// ALPN decides; a client that offered none speaks HTTP/1.1 (RFC 9113 §3.3).
    async fn protocol(&self) -> Protocol {
        match self.get_ref().1.alpn_protocol() {
            Some(b"h2") => Protocol::Http2,
            _ => Protocol::Http1,
        }
    }

    fn tls_version(&self) -> Option<&'static str> {
        Some(match self.get_ref().1.protocol_version()? {
            rustls::ProtocolVersion::TLSv1_3 => "TLSv1.3",
            rustls::ProtocolVersion::TLSv1_2 => "TLSv1.2",
            _ => "other",
        })
    }
}

/// hyper's connection builders, configured once per listener.
pub(super) struct Protocols {
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
    auto: auto::Builder<TokioExecutor>,
}

impl Protocols {
    /// Idle connections and slow request heads are closed by `idle` with one
    /// timer per connection, instead of hyper's timer per request. Over TLS a
    /// response's head and body are written as one buffer, not a vectored
    /// write: rustls encrypts into its own buffer either way, and handing it
    /// several slices costs a list allocation per write.
    ///
    /// A request head larger than `limits.total` is answered 431 by hyper
    /// itself (HTTP/1.1: its read buffer may not grow past it; HTTP/2: the
    /// header list size announced to the client); `inbound` checks the same
    /// limits, and the one per header, on every request.
    pub(super) fn new(tls: bool, limits: &HeaderLimits) -> Self {
        let (buffer, list) = (limits.read_buffer(), limits.total);
        let mut http1 = http1::Builder::new();
        http1.timer(TokioTimer::new()).keep_alive(true).header_read_timeout(None).writev(!tls).max_buf_size(buffer);
        let mut http2 = http2::Builder::new(TokioExecutor::new());
        http2.timer(TokioTimer::new()).max_header_list_size(list);
        // The same settings again, for the connections `auto` serves (`Protocol::Unsure`).
        let mut auto = auto::Builder::new(TokioExecutor::new());
        auto.http1()
            .timer(TokioTimer::new())
            .keep_alive(true)
            .header_read_timeout(None)
            .writev(!tls)
            .max_buf_size(buffer);
        auto.http2().timer(TokioTimer::new()).max_header_list_size(list);
        Protocols { http1, http2, auto }
    }
}

/// Serves one accepted connection (plain or after its TLS handshake) until it
/// ends, or until shutdown asks it to finish its in-flight requests and close.
pub(super) async fn serve<S: ClientStream>(
    stream: S,
    peer: SocketAddr,
    shared: Arc<Shared>,
    protocols: &Protocols,
    stop_rx: watch::Receiver<bool>,
) {
    let activity = ConnectionActivity::new();
    let idle_timeout = shared.options.idle_timeout;
    // A client that connects and sends nothing is idle like any other.
    let protocol = tokio::select! {
        protocol = stream.protocol() => protocol,
        () = activity.idle_for(idle_timeout) => {
            debug!(%peer, "closing a client connection that sent nothing");
            return;
        }
        () = stopped(stop_rx.clone()) => return,
    };
    let client = Peer::new(peer.ip().to_canonical(), stream.tls_version());
    // The rarer kinds are boxed, so they do not make every connection's task larger.
    match protocol {
        Protocol::Http1 => {
            // The usual requests are served without hyper; it takes over at the first other one.
            let ending = pin!(ending(&activity, idle_timeout, stop_rx.clone()));
            let stream =
                match super::http1::serve(stream, &shared, &client, &activity, &mut WhenWoken::new(ending)).await {
                    Served::Closed => return,
                    Served::HandOff(stream) => TokioIo::new(stream),
                };
            let service = service(shared, client, activity.clone());
            let mut connection = Box::pin(protocols.http1.serve_connection(stream, service).with_upgrades());
            let graceful_shutdown = http1::UpgradeableConnection::graceful_shutdown;
            drive(connection.as_mut(), graceful_shutdown, peer, &activity, idle_timeout, stop_rx).await;
        }
        Protocol::Http2 => {
            let service = service(shared, client, activity.clone());
            let mut connection = Box::pin(protocols.http2.serve_connection(TokioIo::new(stream), service));
            let graceful_shutdown = http2::Connection::graceful_shutdown;
            drive(connection.as_mut(), graceful_shutdown, peer, &activity, idle_timeout, stop_rx).await;
        }
        Protocol::Unsure => {
            let service = service(shared, client, activity.clone());
            let io = TokioIo::new(stream);
            let mut connection = Box::pin(protocols.auto.serve_connection_with_upgrades(io, service));
            let graceful_shutdown = auto::UpgradeableConnection::graceful_shutdown;
            drive(connection.as_mut(), graceful_shutdown, peer, &activity, idle_timeout, stop_rx).await;
        }
    }
}

/// hyper's service: each request's body watched (see `client_body`), then `handle`.
fn service(
    shared: Arc<Shared>,
    client: Peer,
    activity: Arc<ConnectionActivity>,
) -> impl hyper::service::Service<
    http::Request<hyper::body::Incoming>,
    Response = http::Response<super::LoggedBody>,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<http::Response<super::LoggedBody>, std::convert::Infallible>> + Send,
> {
    service_fn(move |request| {
        let started = Instant::now();
        // From here the body may be wrapped by policies (size limit, buffering), which must be able to
        // fail it; its time is bounded and its end watched whoever reads it.
        let timeout = shared.options.client_body_timeout;
        let (request, body) = client_body::watch(request, timeout, started.into());
        handle(request, body, started, shared.clone(), client.clone(), activity.begin())
    })
}

/// Resolves when the connection should close: idle for `idle_timeout`, or shutdown.
async fn ending(activity: &ConnectionActivity, idle_timeout: Duration, stop_rx: watch::Receiver<bool>) -> Ending {
    tokio::select! {
        biased;
        () = stopped(stop_rx) => Ending::Stop,
        () = activity.idle_for(idle_timeout) => Ending::Idle,
    }
}

/// Why a connection is closed by the gateway rather than by its client.
enum Ending {
    /// No request in flight for the idle timeout.
    Idle,
    /// The data plane is shutting down.
    Stop,
}

/// Drives a hyper server connection of any version; `graceful_shutdown` is
/// its way to finish the requests in flight, take no more, then end.
async fn drive<C, E>(
    mut connection: Pin<&mut C>,
    graceful_shutdown: fn(Pin<&mut C>),
    peer: SocketAddr,
    activity: &ConnectionActivity,
    idle_timeout: Duration,
    stop_rx: watch::Receiver<bool>,
) where
    C: Future<Output = Result<(), E>>,
    E: Display,
{
    // The connection is polled on every wake of the task; the idle timer and
    // the shutdown signal only when one of them woke it (see `when_woken`).
    let ending = pin!(ending(activity, idle_timeout, stop_rx));
    let mut ending = WhenWoken::new(ending);
    let ended = std::future::poll_fn(|cx| match connection.as_mut().poll(cx) {
        Poll::Ready(result) => Poll::Ready(Either::Left(result)),
        Poll::Pending => Pin::new(&mut ending).poll(cx).map(Either::Right),
    })
    .await;
    match ended {
        Either::Left(result) => {
            if let Err(e) = result {
                debug!(%peer, error = %e, "client connection ended with an error");
            }
        }
        Either::Right(Ending::Idle) => {
            debug!(%peer, "closing an idle client connection");
            // An idle keep-alive connection closes at once (HTTP/2: after a
            // GOAWAY). One stuck in the middle of a request head would wait
            // for the rest; it has had its time, so it is dropped after a
            // short grace unless a request got in meanwhile, which is finished.
            graceful_shutdown(connection.as_mut());
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(e) = result {
                        debug!(%peer, error = %e, "idle client connection ended with an error while closing");
                    }
                }
                () = tokio::time::sleep(IDLE_CLOSE_GRACE) => {
                    if activity.in_flight() > 0 {
                        let _ = connection.await;
                    }
                }
            }
        }
        Either::Right(Ending::Stop) => {
            graceful_shutdown(connection.as_mut());
            if let Err(e) = connection.await {
                debug!(%peer, error = %e, "client connection ended with an error while draining");
            }
        }
    }
}
