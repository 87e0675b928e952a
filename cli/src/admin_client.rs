//! A thin client of the admin REST API that turns problem-details errors into
//! messages a person can act on.

use std::fmt::Write as _;

use reqwest::{Method, StatusCode};
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the control plane at {url}: {source}")]
    Unreachable { url: String, source: reqwest::Error },
    #[error("{0}")]
    Api(String),
    #[error("cannot set up the HTTP client: {0}")]
    Setup(reqwest::Error),
    #[error("--admin-ca {}: {reason}", .path.display())]
    Ca { path: std::path::PathBuf, reason: String },
}

pub struct AdminClient {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl AdminClient {
    /// `ca`: a PEM bundle to trust for an `https://` admin URL, beside the system's CAs.
    pub fn new(base: &str, token: Option<&str>, ca: Option<&std::path::Path>) -> Result<Self, ClientError> {
        let mut http = reqwest::Client::builder();
        if let Some(path) = ca {
            let error = |reason: String| ClientError::Ca { path: path.to_owned(), reason };
            let pem = std::fs::read(path).map_err(|e| error(e.to_string()))?;
            for certificate in reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| error(e.to_string()))? {
                http = http.add_root_certificate(certificate);
            }
        }
        Ok(Self {
            base: base.trim_end_matches('/').to_string(),
            token: token.map(str::to_string),
            http: http.build().map_err(ClientError::Setup)?,
        })
    }

    /// Sends a request and returns the JSON body of a 2xx answer.
    pub async fn call(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Value, ClientError> {
        let url = format!("{}{path}", self.base);
        let mut request = self.http.request(method, &url);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|source| ClientError::Unreachable { url: url.clone(), source })?;
        let status = response.status();
        let text = response.text().await.map_err(|source| ClientError::Unreachable { url: url.clone(), source })?;
        let json: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status.is_success() { Ok(json) } else { Err(ClientError::Api(render_problem(status, &json))) }
    }
}

/// `title (status): detail` then one line per listed field error.
pub fn render_problem(status: StatusCode, body: &Value) -> String {
    let title = body.get("title").and_then(Value::as_str).unwrap_or_else(|| status.canonical_reason().unwrap_or(""));
    let mut text = format!("{title} ({})", status.as_u16());
    if let Some(detail) = body.get("detail").and_then(Value::as_str) {
        let _ = write!(text, ": {detail}");
    }
    if let Some(Value::String(plain)) = Some(body) {
        let _ = write!(text, ": {plain}");
    }
    for error in body.get("errors").and_then(Value::as_array).into_iter().flatten() {
        let pointer = error.get("pointer").and_then(Value::as_str).unwrap_or("");
        let detail = error.get("detail").and_then(Value::as_str).unwrap_or("");
        let _ = write!(text, "\n  {pointer}: {detail}");
    }
    if status == StatusCode::UNAUTHORIZED {
        text.push_str("\n  (pass the admin token with --admin-token or SLUICE_ADMIN_TOKEN)");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_render_every_field() {
        let body = serde_json::json!({
            "title": "Invalid request body", "status": 400, "detail": "2 problems",
            "errors": [{"pointer": "/targets/0/url", "detail": "not a URL"}, {"pointer": "/name", "detail": "missing"}]
        });
        let text = render_problem(StatusCode::BAD_REQUEST, &body);
        assert_eq!(text, "Invalid request body (400): 2 problems\n  /targets/0/url: not a URL\n  /name: missing");
    }
}
