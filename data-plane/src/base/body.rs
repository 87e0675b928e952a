//! Body types of the request path, at its bottom: what a request carries on
//! its way upstream and what a response carries back, the same type on every
//! layer so no layer converts.

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};

/// Body type on both legs of the proxy: a boxed stream, never buffered.
pub type ProxyBody = BoxBody<Bytes, hyper::Error>;

/// Body of a request on its way upstream. Its error is boxed, not
/// `hyper::Error`, because the policy chain wraps the client's body (size
/// limit while streaming, buffered for validation) and must be able to fail it.
pub type RequestBody = BoxBody<Bytes, BoxError>;
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A fully known response body in the proxy's body type.
pub fn full_body(bytes: Bytes) -> ProxyBody {
    Full::new(bytes).map_err(|never| match never {}).boxed()
}

/// A fully known request body (one buffered for validation).
pub fn full_body_request(bytes: Bytes) -> RequestBody {
    Full::new(bytes).map_err(|never| match never {}).boxed()
}
