//! The bottom of the request path: what every layer above shares (body
//! types, the HTTP/1.1 wire pieces both legs write and the write buffer
//! their connections share, the forwarding fields a target gets,
//! problem-details responses, the proxy error, the request ID, per-API
//! request metrics, the registry holding every metric series, the proxy
//! worker index). It imports nothing from the layers above it, so the path
//! reads top-down: proxy -> routing -> policy/openapi -> upstream -> tls,
//! each using only what stands below it.

mod body;
mod error;
pub mod forwarding;
pub mod http1_wire;
mod metric_registry;
pub mod problem;
mod request_id;
mod request_metrics;
pub mod worker;
mod write_buffer;

pub use body::{
    BodyError, BodyStatus, BoxError, ClientFault, ProxyBody, RequestBody, boxed_body, empty_body_request, full_body,
    full_body_request,
};
pub use error::{Origin, ProxyError, error_chain};
pub use http1_wire::BodyEncoder;
pub use metric_registry::MetricRegistry;
pub use request_id::RequestId;
pub use request_metrics::{RequestMetrics, UNROUTED};
pub use write_buffer::WriteBuffer;
