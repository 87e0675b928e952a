//! Open connections to one target, reused across requests.
//!
//! Why not hyper-util's pooled client: it keys its pool by scheme and
//! authority (hashing both on every request), races each checkout against a
//! new connect, and spawns a task per HTTP/1.1 request only to notice when the
//! connection is free again. A target already is the key, so each one keeps
//! its own stack of idle HTTP/1.1 connections (see `http1`), and a connection
//! goes back on it when the response body it carried ends. HTTP/2
//! multiplexes: one shared hyper connection per target. A request asking to
//! upgrade (WebSocket) gets a hyper HTTP/1.1 connection of its own, which
//! hands the socket to the tunnel on a 101.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures_util::FutureExt as _;
use http::{Request, Response, Uri};
use http_body_util::BodyExt as _;
use hyper::client::conn::{TrySendError, http1, http2};
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio_util::either::Either;
use tower_service::Service as _;

use super::Target;
use super::http1::{Connection, ExchangeError, OwnHeads, ResponseBody};
use crate::base::worker;
use crate::base::{BodyError, ProxyBody, RequestBody, boxed_body, error_chain};

/// How long an idle connection is kept unless the target says less (see
/// [`idle_limit`]).
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// An idle connection its worker has not used for this long is a spare:
/// another worker about to open a connection to the same target closes it
/// first (see [`Connections::retire_spare_elsewhere`]).
const SPARE_AFTER: Duration = Duration::from_secs(1);
/// Margin under a target's announced keep-alive timeout: a request must not
/// race the target closing the connection.
const KEEP_ALIVE_MARGIN: Duration = Duration::from_secs(1);

type Stream = MaybeHttpsStream<TokioIo<TcpStream>>;

/// Why a request did not get a response from the target.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No connection could be made; nothing was sent, so the request may go elsewhere.
    #[error("{0}")]
    Connect(String),
    /// The connection failed while the request or the response head was on it.
    #[error("{0}")]
    Exchange(ExchangeError),
    /// As `Exchange`, on a connection hyper drives (HTTP/2, upgrades).
    #[error("{}", error_chain(.0))]
    Hyper(hyper::Error),
    /// No response head by the request's deadline.
    #[error("no response before the request timeout")]
    TimedOut,
}

impl SendError {
    /// Whether a request that can be sent again may go again: nothing was
    /// sent, or the connection closed or reset before a response began (a
    /// kept-open connection the target dropped, a crash), as nginx's
    /// `proxy_next_upstream error` has it. A response that does not parse
    /// is an answer, not a failure to get one.
    pub fn may_resend(&self) -> bool {
        match self {
            SendError::Connect(_) => true,
            SendError::Exchange(e) => e.may_resend(),
            SendError::Hyper(e) => !e.is_parse(),
            // The target may be working on it still.
            SendError::TimedOut => false,
        }
    }
}

/// The connections of one target.
#[derive(Debug)]
pub struct Connections {
    /// Idle HTTP/1.1 connections, one stack per proxy worker (see
    /// `proxy::workers`): a connection's task runs on the worker that opened
    /// it, so a request reuses only its own worker's connections and never
    /// wakes another thread. In each stack the most recently used is at the
    /// back: taking from the back keeps a small set warm and lets the rest expire.
    idle: Box<[Mutex<VecDeque<IdleConnection>>]>,
    /// The HTTP/2 connection; an async lock, so concurrent first requests
    /// wait for one handshake instead of each opening a connection.
    shared_h2: tokio::sync::Mutex<Option<http2::SendRequest<RequestBody>>>,
}

#[derive(Debug)]
struct IdleConnection {
    connection: Box<Connection>,
    since: Instant,
    expires: Instant,
}

impl Default for Connections {
    fn default() -> Self {
        let stacks = worker::count();
        Connections { idle: (0..stacks).map(|_| Mutex::default()).collect(), shared_h2: Default::default() }
    }
}

impl Connections {
    /// This worker's idle stack. Should the stacks be fewer than the workers
    /// (pools built before the count was planned), workers share stacks: that
    /// costs locality, never correctness (see `proxy::workers::Stop`).
    fn local_idle(&self) -> std::sync::MutexGuard<'_, VecDeque<IdleConnection>> {
        lock(&self.idle[self.local_index()])
    }

    fn local_index(&self) -> usize {
        worker::current() % self.idle.len()
    }

    /// This worker's most recently used idle connection. `None` means the
    /// caller opens a new one, so another worker's spare is closed first
    /// (see [`Connections::retire_spare_elsewhere`]).
    pub(super) fn take_idle(&self) -> Option<Box<Connection>> {
        let here = self.local_index();
        let now = Instant::now();
        {
            let mut idle = lock(&self.idle[here]);
            while let Some(mut idle) = idle.pop_back() {
                if now < idle.expires && idle.connection.still_open() {
                    return Some(idle.connection);
                }
            }
        }
        // With this worker's stack unlocked: a worker never holds two.
        self.retire_spare_elsewhere(here, now);
        None
    }

    /// Keeps a connection for reuse for up to `keep_for`.
    pub(super) fn put_idle(&self, connection: Box<Connection>, keep_for: Duration) {
        if keep_for.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut idle = self.local_idle();
        idle.push_back(IdleConnection { connection, since: now, expires: now + keep_for });
        // The oldest sit at the front; trimming here bounds the stack without a timer.
        while idle.front().is_some_and(|c| c.expires <= now) {
            idle.pop_front();
        }
    }

    /// For a worker about to open a connection because its own stack is
    /// empty: closes one spare of another worker (the least recently used
    /// of a stack, when idle for [`SPARE_AFTER`]), so that the connections
    /// to a target follow the load as it moves between workers instead of
    /// adding up to every worker's peak. An idle HTTP/1.1 connection holds
    /// tens of kilobytes of buffers (hyper's read and write buffers, its
    /// request queue), so spares left behind as clients move between
    /// workers are memory held for nothing.
    fn retire_spare_elsewhere(&self, here: usize, now: Instant) {
        let others = self.idle.iter().enumerate().filter(|(index, _)| *index != here);
        for stack in others.map(|(_, stack)| stack) {
            let mut idle = lock(stack);
            if idle.front().is_some_and(|c| now.saturating_duration_since(c.since) >= SPARE_AFTER) {
                let spare = idle.pop_front();
                drop(idle);
                drop(spare);
                return;
            }
        }
    }

    /// Closes connections past their idle time, or closed by the target.
    fn close_expired(&self) {
        let now = Instant::now();
        for stack in &self.idle {
            lock(stack).retain_mut(|c| now < c.expires && c.connection.still_open());
        }
    }
}

fn lock(stack: &Mutex<VecDeque<IdleConnection>>) -> std::sync::MutexGuard<'_, VecDeque<IdleConnection>> {
    stack.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Closes the pool's expired idle connections now and then, for targets that
/// get no traffic (busy ones trim their own stacks). `None` outside a Tokio
/// runtime (unit tests build pools without one). Ends once the targets are gone.
pub(super) fn spawn_idle_sweep(targets: Vec<Weak<Target>>) -> Option<tokio::task::AbortHandle> {
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    let task = runtime.spawn(async move {
        let mut every = tokio::time::interval(IDLE_TIMEOUT / 3);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let mut any_left = false;
            for target in targets.iter().filter_map(Weak::upgrade) {
                target.connections.close_expired();
                any_left = true;
            }
            if !any_left {
                return;
            }
        }
    });
    Some(task.abort_handle())
}

/// Opens connections: TCP, TLS for `https://` targets, then the HTTP handshake.
#[derive(Debug, Clone)]
pub struct Dialer {
    connector: HttpsConnector<HttpConnector>,
    http2: bool,
}

impl Dialer {
    pub fn new(connector: HttpsConnector<HttpConnector>, http2: bool) -> Self {
        Dialer { connector, http2 }
    }

    /// Sends `request` to `target`, on a reused connection when one is idle
    /// (an idle connection the target has closed is passed over).
    ///
    /// HTTP/1.1 wants an origin-form URI (`/path?query`) and a `Host` header;
    /// HTTP/2 an absolute URI. A request that asks to switch protocols
    /// (`upgrade`) goes on a connection of its own. The response head must
    /// have come by `deadline` (connecting included). `own`: see `UpstreamPool::send`.
    ///
    /// The path is chosen before the future is made, and the future is only
    /// that path's: the usual one, a request on an idle HTTP/1.1
    /// connection, is then as small as its exchange (see `proxy::answer` for
    /// why the size matters). The others are boxed: a new connection is made
    /// once per many requests, and an HTTP/2 or upgraded request already
    /// allocates per request in hyper.
    pub fn send<'a>(
        &'a self,
        target: &'a Arc<Target>,
        request: Request<RequestBody>,
        connect_timeout: Duration,
        upgrade: bool,
        deadline: tokio::time::Instant,
        own: OwnHeads<'a>,
    ) -> impl Future<Output = Result<Response<ProxyBody>, SendError>> + 'a {
        use futures_util::future::Either::{Left, Right};
        // hyper writes these requests from their maps alone.
        debug_assert!(own.forwarding.is_none() || !(self.http2 || upgrade), "forwarding fields left out");
        if self.http2 {
            return Right(Right(Left(Box::pin(by(deadline, self.send_h2(target, request, connect_timeout))))));
        }
        if upgrade {
            return Right(Right(Right(Box::pin(by(deadline, self.send_upgrade(target, request, connect_timeout))))));
        }
        match target.connections.take_idle() {
            // The connection keeps the deadline itself (see `http1::Connection::deadline`).
            Some(connection) => Left(connection.exchange(request, target.clone(), deadline, own).map(exchanged)),
            None => Right(Left(Box::pin(async move {
                let connection = by(deadline, self.dial_h1(&target.origin, connect_timeout)).await?;
                exchanged(connection.exchange(request, target.clone(), deadline, own).await)
            }))),
        }
    }

    /// A request asking to switch protocols, on a hyper connection of its
    /// own that is never reused: a 101 hands its socket to the tunnel.
    async fn send_upgrade(
        &self,
        target: &Target,
        request: Request<RequestBody>,
        connect_timeout: Duration,
    ) -> Result<Response<ProxyBody>, SendError> {
        let stream = self.connect(&target.origin, connect_timeout).await?;
        let (mut sender, connection) = http1::Builder::new().handshake(stream).await.map_err(SendError::Hyper)?;
        // A combinator, not an async block, which would hold the connection twice.
        tokio::spawn(connection.with_upgrades().map(log_connection_end));
        let response = sender.send_request(request).await.map_err(SendError::Hyper)?;
        Ok(response.map(hyper_body))
    }

    #[allow(clippy::manual_async_fn, reason = "an async fn holds its arguments twice (see proxy::answer)")]
    fn send_h2(
        &self,
        target: &Target,
        mut request: Request<RequestBody>,
        connect_timeout: Duration,
    ) -> impl Future<Output = Result<Response<ProxyBody>, SendError>> {
        async move {
            let shared_h2 = &target.connections.shared_h2;
            loop {
                let (mut sender, reused) = {
                    let mut shared = shared_h2.lock().await;
                    match shared.as_ref().filter(|s| !s.is_closed()) {
                        Some(sender) => (sender.clone(), true),
                        None => {
                            let sender = Box::pin(self.dial_h2(&target.origin, connect_timeout)).await?;
                            *shared = Some(sender.clone());
                            (sender, false)
                        }
                    }
                };
                if let Err(e) = sender.ready().await {
                    if reused {
                        shared_h2.lock().await.take();
                        continue;
                    }
                    return Err(SendError::Hyper(e));
                }
                match sender.try_send_request(request).await {
                    Ok(response) => return Ok(response.map(hyper_body)),
                    Err(e) => request = resend_or_fail(e, reused)?,
                }
            }
        }
    }

    async fn connect(&self, origin: &Uri, timeout: Duration) -> Result<Stream, SendError> {
        let mut connector = self.connector.clone();
        match tokio::time::timeout(timeout, connector.call(origin.clone())).await {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(e)) => Err(SendError::Connect(error_chain(&*e))),
            Err(_) => Err(SendError::Connect(format!("connect timed out after {} ms", timeout.as_millis()))),
        }
    }

    async fn dial_h1(&self, origin: &Uri, timeout: Duration) -> Result<Box<Connection>, SendError> {
        // Unwrapped, so a plain target's connection does not carry room for
        // a TLS session (about a kilobyte per open connection).
        let io = match self.connect(origin, timeout).await? {
            MaybeHttpsStream::Http(tcp) => Either::Left(tcp.into_inner()),
            MaybeHttpsStream::Https(tls) => Either::Right(Box::new(tls.into_inner())),
        };
        Ok(Connection::new(io))
    }

    async fn dial_h2(&self, origin: &Uri, timeout: Duration) -> Result<http2::SendRequest<RequestBody>, SendError> {
        let stream = self.connect(origin, timeout).await?;
        let (sender, connection) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .handshake(stream)
            .await
            .map_err(SendError::Hyper)?;
        tokio::spawn(connection.map(log_connection_end));
        Ok(sender)
    }
}

/// An exchange's result as `send`'s.
fn exchanged(result: Result<Response<ResponseBody>, ExchangeError>) -> Result<Response<ProxyBody>, SendError> {
    match result {
        Ok(response) => Ok(response.map(ProxyBody::Target)),
        Err(ExchangeError::TimedOut) => Err(SendError::TimedOut),
        Err(e) => Err(SendError::Exchange(e)),
    }
}

/// `future`'s result, or `TimedOut` once `deadline` has passed. A
/// combinator, not an async fn, which would hold `future` twice.
fn by<T>(
    deadline: tokio::time::Instant,
    future: impl Future<Output = Result<T, SendError>>,
) -> impl Future<Output = Result<T, SendError>> {
    tokio::time::timeout_at(deadline, future).map(|result| result.unwrap_or(Err(SendError::TimedOut)))
}

/// A body hyper reads, in the proxy's body type.
fn hyper_body(body: hyper::body::Incoming) -> ProxyBody {
    boxed_body(body.map_err(BodyError::new))
}

fn log_connection_end(result: Result<(), hyper::Error>) {
    if let Err(e) = result {
        tracing::debug!(error = %error_chain(&e), "upstream connection ended with an error");
    }
}

/// A request hyper handed back unsent may go again, if the connection was a
/// reused one (the target closed it while idle); anything else is final.
fn resend_or_fail(
    mut error: TrySendError<Request<RequestBody>>,
    reused: bool,
) -> Result<Request<RequestBody>, SendError> {
    match error.take_message() {
        Some(request) if reused => Ok(request),
        _ => Err(SendError::Hyper(error.into_error())),
    }
}

/// How long the connection may stay idle: [`IDLE_TIMEOUT`], or less when the
/// target announces its own keep-alive timeout (`keep_alive`, the value of
/// its first `Keep-Alive` field: `timeout=5`, as
/// Node.js servers send) minus a margin, so a request never goes out on a
/// connection the target is about to close.
pub(super) fn idle_limit(keep_alive: Option<&[u8]>) -> Duration {
    let announced = keep_alive.and_then(|value| std::str::from_utf8(value).ok()).and_then(|value| {
        value.split(',').find_map(|param| {
            let (name, seconds) = param.split_once('=')?;
            name.trim().eq_ignore_ascii_case("timeout").then(|| seconds.trim().parse::<u64>().ok()).flatten()
        })
    });
    match announced {
        Some(seconds) => Duration::from_secs(seconds).saturating_sub(KEEP_ALIVE_MARGIN).min(IDLE_TIMEOUT),
        None => IDLE_TIMEOUT,
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt as _;

    use super::*;

    /// A connection over loopback TCP, and the far end of it, which reads
    /// end-of-stream once the connection is closed.
    async fn loopback_connection() -> (Box<Connection>, tokio::net::TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let near = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (far, _) = listener.accept().await.unwrap();
        (Connection::new(Either::Left(near)), far)
    }

    fn idle(connection: Box<Connection>, since: Instant) -> IdleConnection {
        IdleConnection { connection, since, expires: since + IDLE_TIMEOUT }
    }

    #[tokio::test]
    async fn a_worker_opening_a_connection_closes_another_workers_spare() {
        let connections =
            Connections { idle: (0..2).map(|_| Mutex::default()).collect(), shared_h2: Default::default() };
        let now = Instant::now();
        let long_ago = now - SPARE_AFTER * 2;
        let (own, _own_far) = loopback_connection().await;
        let (spare, mut spare_far) = loopback_connection().await;
        let (recent, _recent_far) = loopback_connection().await;
        lock(&connections.idle[0]).push_back(idle(own, long_ago));
        lock(&connections.idle[1]).extend([idle(spare, long_ago), idle(recent, now)]);

        connections.retire_spare_elsewhere(0, now);
        assert_eq!(lock(&connections.idle[0]).len(), 1, "the worker's own stack is left alone");
        let left: Vec<Instant> = lock(&connections.idle[1]).iter().map(|c| c.since).collect();
        assert_eq!(left, [now], "the other worker's least recently used connection is closed");
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), spare_far.read_to_end(&mut rest)).await;
        assert!(matches!(read, Ok(Ok(0))), "the spare's socket is closed: {read:?}");

        connections.retire_spare_elsewhere(0, now);
        assert_eq!(lock(&connections.idle[1]).len(), 1, "a connection idle for less than a second is no spare");
    }

    #[test]
    fn idle_limit_follows_the_targets_keep_alive_timeout() {
        let limit = |value: Option<&str>| idle_limit(value.map(str::as_bytes));
        assert_eq!(limit(None), IDLE_TIMEOUT);
        assert_eq!(limit(Some("timeout=5")), Duration::from_secs(4));
        assert_eq!(limit(Some("max=1000, Timeout = 30")), Duration::from_secs(29));
        assert_eq!(limit(Some("timeout=1")), Duration::ZERO, "too short to reuse safely");
        assert_eq!(limit(Some("timeout=600")), IDLE_TIMEOUT, "never longer than our own limit");
        assert_eq!(limit(Some("timeout=soon")), IDLE_TIMEOUT);
    }
}
