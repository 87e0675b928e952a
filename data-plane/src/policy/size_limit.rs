//! `request_size_limit`, early in the policy chain (before auth, before any
//! body byte is read): a declared `Content-Length` over the limit is refused
//! at once, and a body without one (chunked, h2 data frames) is counted while
//! it streams to the upstream and failed the moment it crosses the limit.
//! Also the bounded buffering used when OpenAPI validation needs the body.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Request, StatusCode, header};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use sluice_proto::v1;

use super::rejection::Rejection;
use crate::base::{BodyStatus, BoxError, ClientFault, RequestBody, empty_body_request, full_body_request};

/// Cap on a body buffered for validation when the API sets no size limit, so
/// that validation cannot be used to make the gateway hold unbounded memory.
pub const DEFAULT_BUFFER_LIMIT: u64 = 10 * 1024 * 1024;

#[derive(Debug)]
pub struct SizeLimit {
    max: u64,
}

impl SizeLimit {
    pub fn compile(spec: &v1::RequestSizeLimit) -> Result<Self, String> {
        if spec.max_bytes == 0 {
            return Err("max_bytes must be at least 1".into());
        }
        Ok(SizeLimit { max: spec.max_bytes })
    }
}

/// The limit applied to one request's body, kept by the chain so that a
/// forward failure caused by the limit is reported as 413, not 502.
#[derive(Debug, Default)]
pub struct BodyLimit {
    max: Option<u64>,
    /// How the client's body ended: marked too large by the counting
    /// wrapper, failed or timed out by the proxy's reader. `None` for a
    /// request without a body, which nothing can fail.
    status: Option<BodyStatus>,
}

impl BodyLimit {
    /// Refuses a declared length over the limit; otherwise, when the length
    /// is not declared, wraps the body so it fails once more than the limit
    /// has streamed. A declared length needs no counting: hyper and h2 fail a
    /// body that does not match its `Content-Length`. `status` is how the
    /// client's body is doing (`proxy::client_body`); `None` for a request
    /// without one.
    pub fn apply(
        policy: Option<&SizeLimit>,
        request: &mut Request<RequestBody>,
        status: Option<&BodyStatus>,
    ) -> Result<BodyLimit, Rejection> {
        let status = status.cloned();
        let Some(policy) = policy else { return Ok(BodyLimit { max: None, status }) };
        let max = Some(policy.max);
        match content_length(request.headers()) {
            Some(length) if length > policy.max => return Err(too_large(policy.max)),
            Some(_) => return Ok(BodyLimit { max, status }),
            None if request.body().is_end_stream() => return Ok(BodyLimit { max, status }),
            None => {}
        }
        // A body that was not watched (a request built in a test) gets a status of its own.
        let status = status.unwrap_or_default();
        let body = std::mem::replace(request.body_mut(), empty_body_request());
        *request.body_mut() = RequestBody::boxed(LimitedBody {
            inner: body,
            remaining: policy.max,
            max: policy.max,
            status: status.clone(),
        });
        Ok(BodyLimit { max, status: Some(status) })
    }

    /// Whether the streamed body crossed the limit (the forward failed because of it).
    pub fn tripped(&self) -> bool {
        self.fault() == Some(ClientFault::TooLarge)
    }

    fn fault(&self) -> Option<ClientFault> {
        self.status.as_ref().and_then(BodyStatus::fault)
    }

    pub fn rejection(&self) -> Rejection {
        too_large(self.max.unwrap_or(DEFAULT_BUFFER_LIMIT))
    }

    /// Reads the whole body into memory, up to the limit (or the default cap),
    /// for validators that need it; the request keeps the bytes as its body.
    pub async fn buffer(&self, request: &mut Request<RequestBody>) -> Result<Bytes, Rejection> {
        let cap = self.max.unwrap_or(DEFAULT_BUFFER_LIMIT);
        if let Some(length) = content_length(request.headers())
            && length > cap
        {
            return Err(too_large(cap));
        }
        let mut body = std::mem::replace(request.body_mut(), empty_body_request());
        // Read by hand rather than with `http_body_util::Limited`: its boxed
        // error type trips a rustc limitation that makes the request future !Send.
        let mut buffer = Buffered::default();
        while let Some(frame) = body.frame().await {
            let frame = match frame {
                Ok(frame) => frame,
                Err(_) if self.tripped() => return Err(too_large(cap)),
                Err(_) if self.fault() == Some(ClientFault::TimedOut) => return Err(body_timed_out()),
                Err(e) => {
                    return Err(Rejection::new("openapi", StatusCode::BAD_REQUEST, "bad-request", "Bad request")
                        .detail(format!("The request body could not be read: {e}")));
                }
            };
            if let Ok(data) = frame.into_data() {
                if (buffer.len() + data.len()) as u64 > cap {
                    return Err(too_large(cap));
                }
                buffer.push(data);
            }
        }
        let bytes = buffer.into_bytes();
        *request.body_mut() = full_body_request(bytes.clone());
        Ok(bytes)
    }
}

/// A body read whole. Most bodies arrive in one data frame, which is kept
/// as it came; only a second frame makes a copy.
#[derive(Default)]
enum Buffered {
    #[default]
    Empty,
    One(Bytes),
    Joined(BytesMut),
}

impl Buffered {
    fn len(&self) -> usize {
        match self {
            Buffered::Empty => 0,
            Buffered::One(bytes) => bytes.len(),
            Buffered::Joined(buffer) => buffer.len(),
        }
    }

    fn push(&mut self, data: Bytes) {
        *self = match std::mem::take(self) {
            Buffered::Empty => Buffered::One(data),
            Buffered::One(first) => {
                let mut joined = BytesMut::with_capacity(first.len() + data.len());
                joined.extend_from_slice(&first);
                joined.extend_from_slice(&data);
                Buffered::Joined(joined)
            }
            Buffered::Joined(mut joined) => {
                joined.extend_from_slice(&data);
                Buffered::Joined(joined)
            }
        }
    }

    fn into_bytes(self) -> Bytes {
        match self {
            Buffered::Empty => Bytes::new(),
            Buffered::One(bytes) => bytes,
            Buffered::Joined(joined) => joined.freeze(),
        }
    }
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()
}

fn too_large(max: u64) -> Rejection {
    Rejection::new("request_size_limit", StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large", "Payload too large")
        .detail(format!("The request body exceeds this API's limit of {max} bytes."))
}

fn body_timed_out() -> Rejection {
    Rejection::new("openapi", StatusCode::REQUEST_TIMEOUT, "request-timeout", "Request timeout")
        .detail("The request body did not arrive in time; send it faster or in smaller requests.")
}

#[derive(Debug, thiserror::Error)]
#[error("request body exceeds the limit of {max} bytes")]
pub struct BodyTooLarge {
    max: u64,
}

/// Counts data frames and fails the stream past the limit. Failing (rather
/// than ending early) matters: an early end would hand the upstream a
/// truncated body that looks complete; an error aborts the upstream request.
struct LimitedBody {
    inner: RequestBody,
    remaining: u64,
    max: u64,
    status: BodyStatus,
}

impl Body for LimitedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            let len = data.len() as u64;
            if len > self.remaining {
                self.status.fail(ClientFault::TooLarge);
                self.remaining = 0;
                return Poll::Ready(Some(Err(Box::new(BodyTooLarge { max: self.max }))));
            }
            self.remaining -= len;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
#[allow(clippy::type_complexity)]
mod tests {
    use super::*;
    use futures_util::stream;
    use http_body_util::StreamBody;

    fn chunked(chunks: &[&'static [u8]]) -> RequestBody {
        let frames = chunks.iter().map(|c| Ok::<_, BoxError>(Frame::data(Bytes::from_static(c)))).collect::<Vec<_>>();
        RequestBody::boxed(StreamBody::new(stream::iter(frames)))
    }

    fn request(content_length: Option<&str>, body: RequestBody) -> Request<RequestBody> {
        let mut request = Request::new(body);
        if let Some(length) = content_length {
            request.headers_mut().insert(header::CONTENT_LENGTH, length.parse().unwrap());
        }
        request
    }

    #[tokio::test]
    async fn limit_table() {
        let policy = SizeLimit::compile(&v1::RequestSizeLimit { max_bytes: 10 }).unwrap();
        // (declared length, chunks, rejected before reading, fails while streaming)
        let cases: &[(Option<&str>, &[&'static [u8]], bool, bool)] = &[
            (Some("11"), &[b"01234567890"], true, false),
            (Some("10"), &[b"0123456789"], false, false),
            (None, &[b"01234", b"56789"], false, false),
            (None, &[b"01234", b"56789", b"x"], false, true),
            (None, &[b"0123456789ab"], false, true),
            (None, &[], false, false),
        ];
        for (length, chunks, early, streaming) in cases {
            let mut req = request(*length, chunked(chunks));
            match BodyLimit::apply(Some(&policy), &mut req, None) {
                Err(rejection) => {
                    assert!(*early, "{length:?} {chunks:?} rejected early");
                    assert_eq!(rejection.status, StatusCode::PAYLOAD_TOO_LARGE);
                }
                Ok(limit) => {
                    assert!(!*early, "{length:?} {chunks:?} passed the header check");
                    let result = req.into_body().collect().await;
                    assert_eq!(result.is_err(), *streaming, "{chunks:?}");
                    assert_eq!(limit.tripped(), *streaming);
                }
            }
        }
    }

    #[tokio::test]
    async fn no_policy_passes_body_through() {
        let mut req = request(None, chunked(&[b"abc"]));
        let limit = BodyLimit::apply(None, &mut req, None).unwrap();
        assert!(!limit.tripped());
        assert_eq!(req.into_body().collect().await.unwrap().to_bytes(), "abc");
    }

    #[tokio::test]
    async fn buffer_respects_cap_and_keeps_body() {
        let policy = SizeLimit::compile(&v1::RequestSizeLimit { max_bytes: 5 }).unwrap();
        // One frame, two, three: the body is whole either way, and kept for the upstream.
        for chunks in [&[b"abcde" as &[u8]] as &[&'static [u8]], &[b"abc", b"de"], &[b"a", b"bc", b"de"]] {
            let mut req = request(None, chunked(chunks));
            let limit = BodyLimit::apply(Some(&policy), &mut req, None).unwrap();
            assert_eq!(limit.buffer(&mut req).await.unwrap(), "abcde", "{chunks:?}");
            assert_eq!(req.into_body().collect().await.unwrap().to_bytes(), "abcde", "{chunks:?}");
        }

        let mut req = request(None, chunked(&[b"abc", b"def"]));
        let limit = BodyLimit::apply(Some(&policy), &mut req, None).unwrap();
        assert_eq!(limit.buffer(&mut req).await.unwrap_err().status, StatusCode::PAYLOAD_TOO_LARGE);

        // Without a policy the default cap applies to a declared length.
        let mut req = request(Some("20000000"), chunked(&[]));
        let limit = BodyLimit::apply(None, &mut req, None).unwrap();
        assert_eq!(limit.buffer(&mut req).await.unwrap_err().status, StatusCode::PAYLOAD_TOO_LARGE);
    }
}
