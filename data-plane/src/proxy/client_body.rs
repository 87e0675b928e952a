//! The client's request body as the rest of the request path reads it, right
//! after route match: bounded in time (`--client-body-timeout-secs`, counted
//! from the request head, whatever reads it: the forward streaming it
//! upstream or OpenAPI validation buffering it) and watched, so that the
//! [`BodyStatus`] tells later steps whether a failure was the client's.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::base::{BodyStatus, BoxError, ClientFault, RequestBody, empty_body_request};

#[derive(Debug, thiserror::Error)]
pub enum ClientBodyError {
    #[error("the request body did not arrive within {0:?}")]
    TimedOut(Duration),
    #[error("reading the request body failed: {0}")]
    Read(#[source] BoxError),
}

/// Turns the client's request (as hyper or `proxy::http1` reads it) into
/// the request path's body type, with the status of its body. A request
/// without a body (most GETs) is passed through unwatched and without a
/// status: it cannot fail.
pub fn watch<B>(request: Request<B>, timeout: Duration, started: Instant) -> (Request<RequestBody>, Option<BodyStatus>)
where
    B: Body<Data = Bytes> + Unpin + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    let (parts, body) = request.into_parts();
    let (body, status) = watch_body(body, timeout, started);
    (Request::from_parts(parts, body), status)
}

/// [`watch`] for a request's body alone.
pub fn watch_body<B>(body: B, timeout: Duration, started: Instant) -> (RequestBody, Option<BodyStatus>)
where
    B: Body<Data = Bytes> + Unpin + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    if body.is_end_stream() {
        // Nothing more can come, not even trailers: an empty body stands in,
        // which boxes without allocating.
        return (empty_body_request(), None);
    }
    let status = BodyStatus::default();
    let body = ClientBody { inner: body, timeout, deadline: started + timeout, timer: None, status: status.clone() };
    (RequestBody::boxed(body), Some(status))
}

struct ClientBody<B> {
    inner: B,
    timeout: Duration,
    deadline: Instant,
    /// Made at the first wait for data: a body that is already buffered
    /// when read (most small ones) never needs a timer.
    timer: Option<Pin<Box<Sleep>>>,
    status: BodyStatus,
}

impl<B> Body for ClientBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.status.fault().is_some() {
            // Failed once: the reader has had its error.
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(None) => {
                this.status.complete();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.status.add_received(data.len());
                }
                if this.inner.is_end_stream() {
                    this.status.complete();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.status.fail(ClientFault::Broken);
                Poll::Ready(Some(Err(Box::new(ClientBodyError::Read(e.into())))))
            }
            Poll::Pending => {
                let deadline = this.deadline;
                let timer = this.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.status.fail(ClientFault::TimedOut);
                Poll::Ready(Some(Err(Box::new(ClientBodyError::TimedOut(this.timeout)))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
