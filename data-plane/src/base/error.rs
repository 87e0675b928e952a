//! Proxy errors, shared by the whole request path (the proxy raises them, the
//! policy chain passes the forward's through): every way a request can fail
//! before the upstream's answer reaches the client, tagged by where it came
//! from, and turned into one RFC 9457 problem-details response. And
//! [`error_chain`], which spells out any error's causes for a log line.

use http::{HeaderValue, Response, StatusCode, header};

use super::body::{ClientFault, ProxyBody};
use super::problem::Problem;

/// Who is to blame, as pingora tags its errors: decides log level and lets
/// dashboards tell client mistakes from upstream outages from our own bugs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Client,
    Upstream,
    Internal,
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("no routing table has been applied yet")]
    NotReady,
    #[error("no API serves {method} {path}")]
    NoRoute { method: String, path: String },
    #[error("{method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String, allow: Vec<String> },
    #[error("the request target is invalid: {0}")]
    BadRequest(String),
    #[error("the request path is refused: {0}")]
    InvalidPath(#[from] sluice_proto::path::PathError),
    #[error("the request's host is refused: {0}")]
    InvalidHost(#[from] sluice_proto::host::HostError),
    #[error("{what} exceed the limit of {limit} bytes")]
    HeadersTooLarge { limit: u32, what: &'static str },
    /// A `Transfer-Encoding` other than `chunked` alone (see `proxy::inbound`).
    #[error("the transfer coding `{0}` is not supported; send the body with Content-Length or chunked alone")]
    TransferCoding(String),
    /// The client's body failed on its way upstream (see [`ClientFault`]);
    /// the client's doing, so it never counts against the target.
    #[error("the client's request body failed: {0:?}")]
    ClientBody(ClientFault),
    #[error("upstream `{upstream}` has no healthy target")]
    NoHealthyTarget { upstream: String },
    #[error("cannot connect to upstream target {target}: {reason}")]
    Connect { target: String, reason: String },
    #[error("upstream target {target} did not answer within {timeout_ms} ms")]
    Timeout { target: String, timeout_ms: u128 },
    #[error("upstream target {target} failed: {reason}")]
    Upstream { target: String, reason: String },
    #[error("internal error: {0}")]
    Internal(String),
}

impl ProxyError {
    pub fn origin(&self) -> Origin {
        match self {
            ProxyError::NoRoute { .. }
            | ProxyError::MethodNotAllowed { .. }
            | ProxyError::BadRequest(_)
            | ProxyError::InvalidPath(_)
            | ProxyError::InvalidHost(_)
            | ProxyError::HeadersTooLarge { .. }
            | ProxyError::TransferCoding(_)
            | ProxyError::ClientBody(_) => Origin::Client,
            ProxyError::NoHealthyTarget { .. }
            | ProxyError::Connect { .. }
            | ProxyError::Timeout { .. }
            | ProxyError::Upstream { .. } => Origin::Upstream,
            ProxyError::NotReady | ProxyError::Internal(_) => Origin::Internal,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::NoRoute { .. } => StatusCode::NOT_FOUND,
            ProxyError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ProxyError::BadRequest(_)
            | ProxyError::InvalidPath(_)
            | ProxyError::InvalidHost(_)
            | ProxyError::ClientBody(ClientFault::Broken) => StatusCode::BAD_REQUEST,
            ProxyError::ClientBody(ClientFault::TimedOut) => StatusCode::REQUEST_TIMEOUT,
            ProxyError::ClientBody(ClientFault::TooLarge) => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::HeadersTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ProxyError::TransferCoding(_) => StatusCode::NOT_IMPLEMENTED,
            ProxyError::NotReady | ProxyError::NoHealthyTarget { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::Connect { .. } | ProxyError::Upstream { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// (type slug, title, detail for the client). Upstream and internal
    /// details stay in the log: target addresses are internals.
    fn describe(&self) -> (&'static str, &'static str, String) {
        match self {
            ProxyError::NotReady => {
                ("not-ready", "Gateway not ready", "No configuration has been applied yet; retry shortly.".into())
            }
            ProxyError::NoRoute { .. } => ("route-not-found", "No route matches the request", self.to_string()),
            ProxyError::MethodNotAllowed { allow, .. } => {
                ("method-not-allowed", "Method not allowed", format!("{self}; allowed: {}", allow.join(", ")))
            }
            ProxyError::BadRequest(_) => ("bad-request", "Bad request", self.to_string()),
            ProxyError::InvalidPath(_) => ("invalid-path", "Invalid request path", self.to_string()),
            ProxyError::InvalidHost(_) => ("invalid-host", "Invalid host", self.to_string()),
            ProxyError::HeadersTooLarge { .. } => {
                ("request-header-fields-too-large", "Request header fields too large", self.to_string())
            }
            ProxyError::TransferCoding(_) => ("transfer-coding", "Transfer coding not implemented", self.to_string()),
            ProxyError::ClientBody(ClientFault::Broken) => {
                ("bad-request", "Bad request", "The request body ended early or was malformed.".into())
            }
            ProxyError::ClientBody(ClientFault::TimedOut) => (
                "request-timeout",
                "Request timeout",
                "The request body did not arrive in time; send it faster or in smaller requests.".into(),
            ),
            ProxyError::ClientBody(ClientFault::TooLarge) => {
                ("payload-too-large", "Payload too large", "The request body exceeds this API's limit.".into())
            }
            ProxyError::NoHealthyTarget { .. } => (
                "upstream-unavailable",
                "Upstream unavailable",
                "No healthy upstream server is available; retry later.".into(),
            ),
            ProxyError::Connect { .. } | ProxyError::Upstream { .. } => {
                ("bad-gateway", "Bad gateway", "The upstream server could not be reached or failed to answer.".into())
            }
            ProxyError::Timeout { .. } => {
                ("gateway-timeout", "Gateway timeout", "The upstream server did not answer in time.".into())
            }
            ProxyError::Internal(_) => ("internal", "Internal error", "The gateway failed; retry later.".into()),
        }
    }

    /// The problem-details response, naming the request's ID (as its log lines do).
    pub fn to_response(&self, instance: &str, request_id: &str) -> Response<ProxyBody> {
        let status = self.status();
        let (slug, title, detail) = self.describe();
        let mut response = Problem {
            slug,
            title,
            status,
            detail: Some(&detail),
            instance: Some(instance),
            request_id: Some(request_id),
        }
        .into_response();
        if let ProxyError::MethodNotAllowed { allow, .. } = self
            && let Ok(value) = HeaderValue::from_str(&allow.join(", "))
        {
            response.headers_mut().insert(header::ALLOW, value);
        }
        if let ProxyError::TransferCoding(_) = self {
            // The body was framed by a list the client and the gateway may
            // not read alike: nothing more is read from this connection.
            response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if matches!(self, ProxyError::NotReady | ProxyError::NoHealthyTarget { .. }) {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// `error` with its causes, `top: cause: cause`. Transport errors (hyper's,
/// tonic's) say little at the top ("client error (Connect)", "transport
/// error"); what went wrong (refused, DNS, TLS) is further down. A cause
/// whose text the line already holds is left out.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn problem_details_table() {
        let cases = [
            (ProxyError::NoRoute { method: "GET".into(), path: "/x".into() }, 404, "route-not-found", None),
            (
                ProxyError::MethodNotAllowed {
                    method: "PUT".into(),
                    path: "/x".into(),
                    allow: vec!["GET".into(), "POST".into()],
                },
                405,
                "method-not-allowed",
                Some("GET, POST"),
            ),
            (ProxyError::NoHealthyTarget { upstream: "u".into() }, 503, "upstream-unavailable", None),
            (
                ProxyError::Connect { target: "http://10.0.0.1".into(), reason: "refused".into() },
                502,
                "bad-gateway",
                None,
            ),
            (ProxyError::Timeout { target: "http://10.0.0.1".into(), timeout_ms: 5 }, 504, "gateway-timeout", None),
            (ProxyError::ClientBody(ClientFault::TimedOut), 408, "request-timeout", None),
            (ProxyError::ClientBody(ClientFault::Broken), 400, "bad-request", None),
            (ProxyError::TransferCoding("gzip, chunked".into()), 501, "transfer-coding", None),
        ];
        for (error, status, slug, allow) in cases {
            let response = error.to_response("/x", "abc");
            assert_eq!(response.status().as_u16(), status);
            assert_eq!(response.headers()[header::CONTENT_TYPE], "application/problem+json");
            assert_eq!(response.headers().get(header::ALLOW).map(|v| v.to_str().unwrap()), allow);
            let bytes = response.into_body().collect().await.unwrap().to_bytes();
            let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(body["status"], status);
            assert!(body["type"].as_str().unwrap().ends_with(slug));
            // Internals (target addresses) never reach the client.
            assert!(!bytes.windows(8).any(|w| w == b"10.0.0.1"));
            assert_eq!(body["request_id"], "abc");
        }
    }
}
