//! RFC 9457 problem details: the one shape of every answer the gateway makes
//! itself (policy refusals, validation failures, proxy errors).
//!
//! Bodies are typed structs rather than `json!` maps. That keeps the members
//! in the order a reader expects (`type`, `title`, `status`, ...) whatever
//! map type serde_json is built with (a build's features decide that, for
//! every crate in it), and builds no map per answer.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use serde::{Serialize, Serializer};

use super::body::{ProxyBody, full_body};

/// Where the problem `type` URIs live: `{TYPE_BASE}{slug}`.
const TYPE_BASE: &str = "https://sluice.dev/problems/";

/// The members every problem the gateway sends may carry.
#[derive(Debug, Serialize)]
pub struct Problem<'a> {
    /// The last segment of the `type` URI.
    #[serde(rename = "type", serialize_with = "type_uri")]
    pub slug: &'a str,
    pub title: &'a str,
    #[serde(serialize_with = "status_code")]
    pub status: StatusCode,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<&'a str>,
    /// The request path the problem is about.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<&'a str>,
    /// The request's ID, as in its request-ID header, access log line and
    /// error log lines.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<&'a str>,
}

impl Problem<'_> {
    pub fn into_response(self) -> Response<ProxyBody> {
        respond(self.status, &self)
    }
}

/// A problem-details response with `body` (a [`Problem`], or a problem type
/// with members of its own) and `status`.
pub fn respond(status: StatusCode, body: &impl Serialize) -> Response<ProxyBody> {
    // Serializing plain structs of strings and numbers cannot fail.
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut response = Response::new(full_body(Bytes::from(bytes)));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    response
}

/// Serializes a problem slug as its full `type` URI, without building the string.
pub fn type_uri<S: Serializer>(slug: &&str, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(&format_args!("{TYPE_BASE}{slug}"))
}

/// Serializes a status as its number.
pub fn status_code<S: Serializer>(status: &StatusCode, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_u16(status.as_u16())
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    #[tokio::test]
    async fn members_come_in_the_documented_order() {
        let problem = Problem {
            slug: "gateway-timeout",
            title: "Gateway timeout",
            status: StatusCode::GATEWAY_TIMEOUT,
            detail: Some("The upstream did not answer in time."),
            instance: Some("/shop/a"),
            request_id: Some("00ff"),
        };
        let response = problem.into_response();
        assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/problem+json");
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            r#"{"type":"https://sluice.dev/problems/gateway-timeout","title":"Gateway timeout","status":504,"detail":"The upstream did not answer in time.","instance":"/shop/a","request_id":"00ff"}"#
        );

        // Members left unset are left out, not sent as null.
        let bare = Problem {
            slug: "too-many-requests",
            title: "Too many requests",
            status: StatusCode::TOO_MANY_REQUESTS,
            detail: None,
            instance: None,
            request_id: None,
        };
        let bytes = bare.into_response().into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            r#"{"type":"https://sluice.dev/problems/too-many-requests","title":"Too many requests","status":429}"#
        );
    }
}
