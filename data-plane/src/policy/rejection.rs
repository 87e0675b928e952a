//! Policy rejections, the short-circuit exit of the policy chain: each check
//! returns a [`Rejection`] naming status, problem type and what the client can
//! do, and the chain turns it into one RFC 9457 problem-details response.

use http::{HeaderName, HeaderValue, Response, StatusCode};

use crate::base::ProxyBody;
use crate::base::problem::Problem;

/// A request stopped by a policy. Nothing of it has reached the upstream.
#[derive(Debug)]
pub struct Rejection {
    /// The policy that said no, for the rejection metric's label.
    pub policy: &'static str,
    pub status: StatusCode,
    /// Last segment of the problem `type` URI.
    pub slug: &'static str,
    pub title: &'static str,
    pub detail: String,
    /// Extra response headers (`WWW-Authenticate`, ...); a list, not a
    /// `HeaderMap`, to keep this small on the hot path's `Result`s.
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

impl Rejection {
    pub fn new(policy: &'static str, status: StatusCode, slug: &'static str, title: &'static str) -> Self {
        Rejection { policy, status, slug, title, detail: String::new(), headers: Vec::new() }
    }

    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = detail.into();
        self
    }

    pub fn into_response(self, instance: &str, request_id: &str) -> Response<ProxyBody> {
        let problem = Problem {
            slug: self.slug,
            title: self.title,
            status: self.status,
            detail: Some(&self.detail),
            instance: Some(instance),
            request_id: Some(request_id),
        };
        let mut response = problem.into_response();
        let headers = response.headers_mut();
        for (name, value) in self.headers {
            headers.append(name, value);
        }
        response
    }
}

#[cfg(test)]
#[allow(clippy::type_complexity)]
mod tests {
    use super::*;
    use http::header;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn rejection_is_problem_details() {
        let mut rejection = Rejection::new("basic_auth", StatusCode::UNAUTHORIZED, "unauthorized", "Unauthorized")
            .detail("credentials are missing");
        rejection.headers.push((header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic realm=\"x\"")));
        let response = rejection.into_response("/shop/a", "r-1");
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/problem+json");
        assert_eq!(response.headers()[header::WWW_AUTHENTICATE], "Basic realm=\"x\"");
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(body["status"], 401);
        assert_eq!(body["type"], "https://sluice.dev/problems/unauthorized");
        assert_eq!(body["instance"], "/shop/a");
        assert_eq!(body["detail"], "credentials are missing");
        assert_eq!(body["request_id"], "r-1");
    }
}
