//! Body types of the request path, at its bottom: what a request carries on
//! its way upstream and what a response carries back, the same type on every
//! layer so no layer converts.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};

use crate::upstream::ResponseBody;

/// Body type of a response on its way to the client, a stream, never
/// buffered: an HTTP/1.1 target's body as it reads from the target's
/// connection, or any other body, boxed. The first is not boxed: that saves
/// an allocation per response, and the client's writer can take the
/// target's header fields from it as they were sent (see
/// `ResponseBody::fields_as_sent`).
#[derive(Debug)]
pub enum ProxyBody {
    Target(ResponseBody),
    Boxed(BoxBody<Bytes, BodyError>),
}

impl ProxyBody {
    /// A target's header fields as it sent them, when they are not in the
    /// response's header map (see `ResponseBody::fields_as_sent`).
    pub fn fields_as_sent(&self) -> Option<impl Iterator<Item = (&[u8], &[u8])>> {
        match self {
            ProxyBody::Target(body) => body.fields_as_sent(),
            ProxyBody::Boxed(_) => None,
        }
    }
}

/// Any other body in the proxy's body type.
pub fn boxed_body<B>(body: B) -> ProxyBody
where
    B: Body<Data = Bytes, Error = BodyError> + Send + Sync + 'static,
{
    ProxyBody::Boxed(body.boxed())
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            ProxyBody::Target(body) => Pin::new(body).poll_frame(cx),
            ProxyBody::Boxed(body) => Pin::new(body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Target(body) => body.is_end_stream(),
            ProxyBody::Boxed(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Target(body) => body.size_hint(),
            ProxyBody::Boxed(body) => body.size_hint(),
        }
    }
}

/// Why a response body failed part-way. A target's body is read by hyper
/// (HTTP/2, upgrades) or by `upstream::http1`, each with errors of its own.
/// A type of its own, not a bare `BoxError`: hyper and `Limited` ask for
/// `Into<BoxError>`, which a concrete error meets for every lifetime and a
/// bare one does not (the request future would then not prove `Send`).
#[derive(Debug)]
pub struct BodyError(BoxError);

impl BodyError {
    pub fn new(cause: impl Into<BoxError>) -> Self {
        BodyError(cause.into())
    }
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for BodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Body of a request on its way upstream. Its error is boxed, not
/// `hyper::Error`, because the policy chain wraps the client's body (size
/// limit while streaming, buffered for validation) and must be able to fail it.
/// A body known whole (one that arrived with its head, an empty one) is
/// not boxed: a box per request with a body cost an allocation.
pub enum RequestBody {
    /// Its bytes, until they are taken: empty, it has ended.
    Whole(Bytes),
    Boxed(BoxBody<Bytes, BoxError>),
}

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl RequestBody {
    /// Any other body, boxed.
    pub fn boxed<B>(body: B) -> Self
    where
        B: Body<Data = Bytes, Error = BoxError> + Send + Sync + 'static,
    {
        RequestBody::Boxed(body.boxed())
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            RequestBody::Whole(bytes) if bytes.is_empty() => Poll::Ready(None),
            RequestBody::Whole(bytes) => Poll::Ready(Some(Ok(Frame::data(std::mem::take(bytes))))),
            RequestBody::Boxed(body) => Pin::new(body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Whole(bytes) => bytes.is_empty(),
            RequestBody::Boxed(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Whole(bytes) => SizeHint::with_exact(bytes.len() as u64),
            RequestBody::Boxed(body) => body.size_hint(),
        }
    }
}

/// A fully known response body in the proxy's body type.
pub fn full_body(bytes: Bytes) -> ProxyBody {
    boxed_body(Full::new(bytes).map_err(|never| match never {}))
}

/// A fully known request body (one that arrived with its head, or buffered for validation).
pub fn full_body_request(bytes: Bytes) -> RequestBody {
    RequestBody::Whole(bytes)
}

/// An empty request body.
pub fn empty_body_request() -> RequestBody {
    RequestBody::Whole(Bytes::new())
}

/// How the client's request body ended, shared by the layers that read it:
/// the proxy's reader marks it complete or failed by the client (an abort, a
/// malformed chunk, the body timeout), the size limit marks it too large,
/// and the forward reads it to tell a failure the client caused from one
/// the upstream caused (only the latter counts against the target's health).
/// Made by the proxy's reader, for requests with a body only, and handed
/// to each layer beside the request (not in its extensions, which would
/// cost the request two allocations).
/// It also counts the bytes read, for the access log.
#[derive(Debug, Clone)]
pub struct BodyStatus(Status);

#[derive(Debug, Clone)]
enum Status {
    /// Being read: the reader and the other layers share its progress.
    Reading(Arc<Progress>),
    /// Arrived whole with the request's head, this many bytes: nothing can
    /// change about it, so nothing is shared (or allocated).
    Arrived(u64),
}

impl Default for BodyStatus {
    /// A body still to be read.
    fn default() -> Self {
        BodyStatus(Status::Reading(Arc::default()))
    }
}

#[derive(Debug, Default)]
struct Progress {
    state: AtomicU8,
    received: AtomicU64,
}

/// Why the client's body did not arrive whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientFault {
    /// The connection failed or the framing was wrong (a bad chunk size, an
    /// upload shorter than its `Content-Length`).
    Broken,
    /// Not all of it arrived within the body timeout.
    TimedOut,
    /// It crossed the API's size limit.
    TooLarge,
}

const RECEIVING: u8 = 0;
const COMPLETE: u8 = 1;
const BROKEN: u8 = 2;
const TIMED_OUT: u8 = 3;
const TOO_LARGE: u8 = 4;

impl BodyStatus {
    /// A body of `received` bytes that arrived whole with its head.
    pub fn arrived(received: u64) -> Self {
        BodyStatus(Status::Arrived(received))
    }

    /// The progress of a body being read; `None` once it has all arrived,
    /// when nothing about it can change any more.
    fn progress(&self) -> Option<&Progress> {
        match &self.0 {
            Status::Reading(progress) => Some(progress),
            Status::Arrived(_) => None,
        }
    }

    pub fn complete(&self) {
        if let Some(progress) = self.progress() {
            let _ = progress.state.compare_exchange(RECEIVING, COMPLETE, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// The first fault wins: a body that timed out is not also "broken" when
    /// its reader is dropped.
    pub fn fail(&self, fault: ClientFault) {
        let code = match fault {
            ClientFault::Broken => BROKEN,
            ClientFault::TimedOut => TIMED_OUT,
            ClientFault::TooLarge => TOO_LARGE,
        };
        if let Some(progress) = self.progress() {
            let _ = progress.state.compare_exchange(RECEIVING, code, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// `n` more bytes of the body were read (of one being read).
    pub fn add_received(&self, n: usize) {
        if let Some(progress) = self.progress() {
            progress.received.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// The body's bytes read so far.
    pub fn received(&self) -> u64 {
        match &self.0 {
            Status::Reading(progress) => progress.received.load(Ordering::Relaxed),
            Status::Arrived(received) => *received,
        }
    }

    /// Whether the last byte has not arrived yet (and nothing failed).
    pub fn receiving(&self) -> bool {
        self.progress().is_some_and(|progress| progress.state.load(Ordering::Relaxed) == RECEIVING)
    }

    pub fn fault(&self) -> Option<ClientFault> {
        match self.progress()?.state.load(Ordering::Relaxed) {
            BROKEN => Some(ClientFault::Broken),
            TIMED_OUT => Some(ClientFault::TimedOut),
            TOO_LARGE => Some(ClientFault::TooLarge),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_whole_request_body_yields_its_bytes_once_and_an_empty_one_nothing() {
        let body = full_body_request(Bytes::from_static(b"hello"));
        assert_eq!(body.size_hint().exact(), Some(5));
        assert!(!body.is_end_stream());
        assert_eq!(body.collect().await.unwrap().to_bytes(), "hello");
        let empty = empty_body_request();
        assert_eq!(empty.size_hint().exact(), Some(0));
        assert!(empty.is_end_stream());
        assert!(empty.collect().await.unwrap().to_bytes().is_empty());
    }

    #[test]
    fn a_body_being_read_counts_its_bytes_and_keeps_its_first_ending() {
        let status = BodyStatus::default();
        let seen_elsewhere = status.clone();
        assert!(status.receiving());
        status.add_received(3);
        status.add_received(4);
        status.fail(ClientFault::TimedOut);
        status.fail(ClientFault::Broken);
        status.complete();
        assert_eq!(seen_elsewhere.received(), 7);
        assert!(!seen_elsewhere.receiving());
        assert_eq!(seen_elsewhere.fault(), Some(ClientFault::TimedOut));
    }

    #[test]
    fn a_body_that_arrived_whole_stays_complete() {
        let status = BodyStatus::arrived(5);
        status.fail(ClientFault::TooLarge);
        status.add_received(1);
        assert_eq!((status.received(), status.receiving(), status.fault()), (5, false, None));
    }
}
