//! Open connections to one target, reused across requests.
//!
//! Why not hyper-util's pooled client: it keys its pool by scheme and
//! authority (hashing both on every request), races each checkout against a
//! new connect, and spawns a task per HTTP/1.1 request only to notice when the
//! connection is free again. A target already is the key, so each one keeps
//! its own stack of idle HTTP/1.1 connections, and a connection goes back on
//! it when the response body it carried ends. HTTP/2 multiplexes: one shared
//! connection per target.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::client::conn::{TrySendError, http1, http2};
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tower_service::Service as _;

use super::{ProxyBody, RequestBody, Target};

/// How long an idle connection is kept: below the common 60-120 s server
/// keep-alive limits would be safer, but upstreams here are our own.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

type Stream = MaybeHttpsStream<TokioIo<TcpStream>>;

/// Why a request did not get a response from the target.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No connection could be made; nothing was sent, so the request may go elsewhere.
    #[error("{0}")]
    Connect(String),
    /// The connection failed while the request or the response was on it.
    #[error("{}", error_chain(.0))]
    Exchange(hyper::Error),
}

/// The connections of one target.
#[derive(Debug, Default)]
pub struct Connections {
    /// Idle HTTP/1.1 connections, the most recently used at the back: taking
    /// from the back keeps a small set warm and lets the rest expire.
    idle: Mutex<VecDeque<IdleConnection>>,
    /// The HTTP/2 connection; an async lock, so concurrent first requests
    /// wait for one handshake instead of each opening a connection.
    shared_h2: tokio::sync::Mutex<Option<http2::SendRequest<RequestBody>>>,
}

#[derive(Debug)]
struct IdleConnection {
    sender: http1::SendRequest<RequestBody>,
    since: Instant,
}

impl Connections {
    fn take_idle(&self) -> Option<http1::SendRequest<RequestBody>> {
        let mut idle = self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        while let Some(connection) = idle.pop_back() {
            if !connection.sender.is_closed() && connection.since.elapsed() < IDLE_TIMEOUT {
                return Some(connection.sender);
            }
        }
        None
    }

    fn put_idle(&self, sender: http1::SendRequest<RequestBody>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        idle.push_back(IdleConnection { sender, since: Instant::now() });
        // The oldest sit at the front; trimming here bounds the stack without a timer.
        while idle.front().is_some_and(|c| c.since.elapsed() >= IDLE_TIMEOUT) {
            idle.pop_front();
        }
    }

    /// Closes connections idle for longer than [`IDLE_TIMEOUT`] (dropping the
    /// sender ends its connection task).
    fn close_expired(&self) {
        let mut idle = self.idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        idle.retain(|c| !c.sender.is_closed() && c.since.elapsed() < IDLE_TIMEOUT);
    }
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

    /// Sends `request` to `target`, on a reused connection when one is idle.
    /// A reused connection can turn out closed by the target before the
    /// request was written; then the request goes out again on the next (or a
    /// new) connection.
    ///
    /// HTTP/1.1 wants an origin-form URI (`/path?query`) and a `Host` header;
    /// HTTP/2 an absolute URI.
    pub async fn send(
        &self,
        target: &Arc<Target>,
        mut request: Request<RequestBody>,
        connect_timeout: Duration,
    ) -> Result<Response<ProxyBody>, SendError> {
        if self.http2 {
            return self.send_h2(target, request, connect_timeout).await;
        }
        loop {
            let (mut sender, reused) = match target.connections.take_idle() {
                Some(sender) => (sender, true),
                // Boxed: the rare connect path would otherwise make every
                // request's future kilobytes larger, copied at each move.
                None => (Box::pin(self.dial_h1(&target.origin, connect_timeout)).await?, false),
            };
            if let Err(e) = sender.ready().await {
                if reused {
                    continue;
                }
                return Err(SendError::Exchange(e));
            }
            match sender.try_send_request(request).await {
                Ok(response) => return Ok(release_when_done(response, sender, target)),
                Err(e) => request = resend_or_fail(e, reused)?,
            }
        }
    }

    async fn send_h2(
        &self,
        target: &Target,
        mut request: Request<RequestBody>,
        connect_timeout: Duration,
    ) -> Result<Response<ProxyBody>, SendError> {
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
                return Err(SendError::Exchange(e));
            }
            match sender.try_send_request(request).await {
                Ok(response) => return Ok(response.map(|body| body.boxed())),
                Err(e) => request = resend_or_fail(e, reused)?,
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

    async fn dial_h1(&self, origin: &Uri, timeout: Duration) -> Result<http1::SendRequest<RequestBody>, SendError> {
        let stream = self.connect(origin, timeout).await?;
        let (sender, connection) = http1::Builder::new().handshake(stream).await.map_err(SendError::Exchange)?;
        tokio::spawn(async move {
            // Upgrades: a 101 hands the connection over to the tunnel.
            if let Err(e) = connection.with_upgrades().await {
                tracing::debug!(error = %error_chain(&e), "upstream connection ended with an error");
            }
        });
        Ok(sender)
    }

    async fn dial_h2(&self, origin: &Uri, timeout: Duration) -> Result<http2::SendRequest<RequestBody>, SendError> {
        let stream = self.connect(origin, timeout).await?;
        let (sender, connection) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .handshake(stream)
            .await
            .map_err(SendError::Exchange)?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %error_chain(&e), "upstream connection ended with an error");
            }
        });
        Ok(sender)
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
        _ => Err(SendError::Exchange(error.into_error())),
    }
}

/// Wraps the response body so its HTTP/1.1 connection returns to the idle
/// stack once the body has been read to its end. A body dropped before its
/// end takes the connection with it (hyper cannot reuse it), and a 101 gives
/// it to the upgraded tunnel.
fn release_when_done(
    response: Response<Incoming>,
    sender: http1::SendRequest<RequestBody>,
    target: &Arc<Target>,
) -> Response<ProxyBody> {
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        return response.map(|body| body.boxed());
    }
    if response.body().is_end_stream() {
        target.connections.put_idle(sender);
        return response.map(|body| body.boxed());
    }
    let target = target.clone();
    response.map(|body| ReleaseAtEnd { body, held: Some((sender, target)) }.boxed())
}

/// A response body holding its connection until the last frame.
struct ReleaseAtEnd {
    body: Incoming,
    held: Option<(http1::SendRequest<RequestBody>, Arc<Target>)>,
}

impl ReleaseAtEnd {
    fn release(&mut self) {
        if let Some((sender, target)) = self.held.take() {
            target.connections.put_idle(sender);
        }
    }
}

impl Body for ReleaseAtEnd {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let frame = std::task::ready!(Pin::new(&mut this.body).poll_frame(cx));
        match &frame {
            None => this.release(),
            Some(Ok(_)) if this.body.is_end_stream() => this.release(),
            // A failed body leaves the connection unusable: drop it.
            Some(Err(_)) => this.held = None,
            Some(Ok(_)) => {}
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// hyper's top-level errors say little ("client error (Connect)"); the cause is in the chain.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
