//! The `ConfigSync` service's gRPC plumbing, written out instead of
//! generated: the generated server encodes each outbound message on each
//! stream, a copy of the whole snapshot per data plane held until that node
//! has read it. Here a snapshot is encoded once per version
//! ([`super::latest::Encoded`]) and every stream's body hands the
//! connection the same bytes; inbound messages are decoded by tonic's own
//! `Streaming`, with the message size limit.

use std::convert::Infallible;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{HeaderMap, HeaderValue, header};
use http_body::Frame;
use sluice_proto::v1::{ControlPlaneMessage, DataPlaneMessage};
use tokio::sync::mpsc;
use tonic::Status;
use tonic::body::Body;
use tonic::codec::{Codec, Streaming};
use tonic::server::NamedService;
use tonic_prost::ProstCodec;

use super::SyncService;

/// The one method of the service.
const SYNC_PATH: &str = "/sluice.v1.ConfigSync/Sync";

/// What a session sends: whole gRPC messages (length-prefixed), then at
/// most one status that ends the stream.
pub type Outbound = mpsc::Sender<Result<Bytes, Status>>;

/// The sync service as a tower service, for `tonic::transport::Server::add_service`.
#[derive(Clone)]
pub struct SyncServer {
    service: SyncService,
}

impl SyncServer {
    pub(super) fn new(service: SyncService) -> Self {
        Self { service }
    }
}

impl NamedService for SyncServer {
    const NAME: &'static str = "sluice.v1.ConfigSync";
}

impl tower::Service<http::Request<Body>> for SyncServer {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let service = self.service.clone();
        Box::pin(async move {
            if request.uri().path() != SYNC_PATH {
                return Ok(Status::unimplemented(format!("no method {}", request.uri().path())).into_http());
            }
            // Data planes never compress; a compressed message would not decode.
            if request.headers().get("grpc-encoding").is_some_and(|e| e != "identity") {
                return Ok(Status::unimplemented("compressed messages are not accepted").into_http());
            }
            let max = service.inner.options.max_message_size;
            let decoder = ProstCodec::<ControlPlaneMessage, DataPlaneMessage>::default().decoder();
            let request = request.map(|body| Streaming::new_request(decoder, body, None, Some(max)));
            match service.sync(tonic::Request::from_http(request)).await {
                Ok(outbound) => Ok(respond(outbound)),
                Err(status) => Ok(status.into_http()),
            }
        })
    }
}

/// The response: its body is each message as the session sent it, then
/// the trailers with the status that ended the stream (OK when the session
/// dropped its sender without one).
fn respond(outbound: mpsc::Receiver<Result<Bytes, Status>>) -> http::Response<Body> {
    let frames = futures_util::stream::unfold(Some(outbound), |outbound| async move {
        let mut outbound = outbound?;
        let frame = match outbound.recv().await {
            Some(Ok(message)) => return Some((Ok::<_, Infallible>(Frame::data(message)), Some(outbound))),
            Some(Err(status)) => trailers(&status),
            None => trailers(&Status::ok("")),
        };
        Some((Ok(Frame::trailers(frame)), None))
    });
    let mut response = http::Response::new(Body::new(http_body_util::StreamBody::new(frames)));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    response
}

fn trailers(status: &Status) -> HeaderMap {
    let mut trailers = HeaderMap::new();
    if status.add_header(&mut trailers).is_err() {
        // Only a message that cannot be a header value gets here.
        let _ = Status::new(status.code(), "").add_header(&mut trailers);
    }
    trailers
}
