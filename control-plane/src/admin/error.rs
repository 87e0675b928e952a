//! Admin API errors, at the edge between handlers and the client: one enum for every way a request can fail and
//! one function (`AdminError::problem`) that turns it into an RFC 9457 problem-details response.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sluice_proto::Violation;
use thiserror::Error;
use utoipa::ToSchema;

use crate::model::Kind;
use crate::store::StoreError;
use crate::tokens::Role;

/// Every problem `type` starts with this; the slug after it is stable and documented.
pub const PROBLEM_BASE: &str = "https://sluice.dev/problems/";
pub const PROBLEM_JSON: &str = "application/problem+json";

/// RFC 9457 problem details, the body of every error response of the admin API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// `https://sluice.dev/problems/<slug>`; clients branch on this, not on `title`.
    #[serde(rename = "type")]
    #[schema(example = "https://sluice.dev/problems/invalid-body")]
    pub kind: String,
    #[schema(example = "The request body is invalid")]
    pub title: String,
    #[schema(example = 422)]
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// One entry per bad field, so a client can fix them all in one go.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
    /// For `referenced`: the resources (`apis/shop`) that still point at the one being deleted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub referrers: Vec<String>,
    /// For 5xx: quote it when reporting the problem; the server log carries the same id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
}

/// One bad field: a JSON pointer into the request body (or, for whole-config checks, a path whose list elements
/// are addressed by name, e.g. `/apis/shop/upstream`) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FieldError {
    #[schema(example = "/targets/0/url")]
    pub pointer: String,
    #[schema(example = "is required")]
    pub detail: String,
}

impl FieldError {
    pub fn new(pointer: impl Into<String>, detail: impl Into<String>) -> Self {
        Self { pointer: pointer.into(), detail: detail.into() }
    }
}

impl From<Violation> for FieldError {
    fn from(v: Violation) -> Self {
        Self { pointer: v.path, detail: v.message }
    }
}

#[derive(Debug, Error)]
pub enum AdminError {
    #[error("a valid bearer token is required")]
    Unauthorized,
    #[error("the token `{token}` has the role `{}`; this request needs an `admin` token", .role.as_str())]
    Forbidden { token: String, role: Role },
    #[error("too many failed authentications from this address; try again later")]
    TooManyFailures,
    #[error("{what} not found")]
    NotFound { what: String },
    /// A 404 whose reason is more than "no such thing" (a version deleted by retention).
    #[error("{detail}")]
    Gone { detail: String },
    #[error("the method is not allowed here; allowed: {allowed}")]
    MethodNotAllowed { allowed: String },
    #[error("{} `{name}` already exists", kind_label(*.kind))]
    AlreadyExists { kind: Kind, name: String },
    #[error("a token named `{name}` already exists")]
    TokenExists { name: String },
    #[error("{} `{name}` is still referenced by {}", kind_label(*.kind), .referrers.join(", "))]
    Referenced { kind: Kind, name: String, referrers: Vec<String> },
    /// The body is not JSON/YAML at all, or is empty.
    #[error("the request body cannot be parsed: {detail}")]
    MalformedBody { detail: String },
    /// The body exceeds a parsing limit: nested too deeply, or aliases that expand too far.
    #[error("{detail}")]
    BodyLimit { detail: String },
    /// The body parsed but does not fit the schema: wrong types, unknown or missing fields, names outside the
    /// alphabet, a name differing from the URL's. Every bad field at once, each at its pointer; 422 like any
    /// other field the control plane refuses, so a client has one status for "fix these fields".
    #[error("the request body has {} invalid field(s)", .0.len())]
    InvalidBody(Vec<FieldError>),
    /// The body fits the schema but the result is not acceptable: a secret that does not parse, a spec the OpenAPI
    /// parser rejects, a reference to nothing, a snapshot that would not validate. Nothing was committed.
    #[error("{detail}")]
    Unprocessable { detail: String, errors: Vec<FieldError> },
    #[error("unsupported content type {content_type}; send {expected}")]
    UnsupportedMediaType { content_type: String, expected: &'static str },
    #[error("{detail}")]
    BadRequest { detail: String },
    /// A 4xx produced below the handlers (axum extractors, body limits) whose text we pass on.
    #[error("{detail}")]
    Passthrough { status: StatusCode, detail: String },
    #[error("the store is not answering: {0}")]
    Unavailable(#[source] StoreError),
    #[error("store failure")]
    Store(#[from] StoreError),
    #[error("internal error: {0}")]
    Internal(String),
}

fn kind_label(kind: Kind) -> &'static str {
    match kind {
        Kind::Api => "API",
        Kind::Upstream => "upstream",
        Kind::Consumer => "consumer",
        Kind::Spec => "spec",
        Kind::Certificate => "certificate",
    }
}

impl AdminError {
    pub fn not_found(kind: Kind, name: &str) -> Self {
        Self::NotFound { what: format!("{} `{name}`", kind_label(kind)) }
    }

    pub fn invalid_config(violations: Vec<Violation>) -> Self {
        Self::Unprocessable {
            detail: "the change would make an invalid configuration; nothing was committed".into(),
            errors: violations.into_iter().map(FieldError::from).collect(),
        }
    }

    /// The one place that decides status, problem type and what the client may see. Internals (store errors) are
    /// logged here with a correlation id and never put in the body.
    pub fn problem(&self) -> (StatusCode, Problem) {
        let (status, slug, title) = match self {
            Self::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized", "Authentication required"),
            Self::Forbidden { .. } => (StatusCode::FORBIDDEN, "forbidden", "Not allowed for this token's role"),
            Self::TooManyFailures => {
                (StatusCode::TOO_MANY_REQUESTS, "too-many-failures", "Too many failed authentications")
            }
            Self::NotFound { .. } => (StatusCode::NOT_FOUND, "not-found", "Not found"),
            Self::Gone { .. } => (StatusCode::NOT_FOUND, "pruned", "Deleted by retention"),
            Self::Store(StoreError::SecretKeyRotated { .. }) => {
                (StatusCode::SERVICE_UNAVAILABLE, "secret-key-rotated", "The secret key was rotated")
            }
            Self::MethodNotAllowed { .. } => {
                (StatusCode::METHOD_NOT_ALLOWED, "method-not-allowed", "Method not allowed")
            }
            Self::AlreadyExists { .. } | Self::TokenExists { .. } => {
                (StatusCode::CONFLICT, "conflict", "The name is already taken")
            }
            Self::Referenced { .. } => (StatusCode::CONFLICT, "referenced", "The resource is still referenced"),
            Self::MalformedBody { .. } => {
                (StatusCode::BAD_REQUEST, "malformed-body", "The request body cannot be parsed")
            }
            Self::BodyLimit { .. } => {
                (StatusCode::UNPROCESSABLE_ENTITY, "body-limit", "The request body exceeds a parsing limit")
            }
            Self::InvalidBody(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid-body", "The request body is invalid"),
            Self::Unprocessable { .. } => {
                (StatusCode::UNPROCESSABLE_ENTITY, "invalid-config", "The change was rejected")
            }
            Self::UnsupportedMediaType { .. } => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-media-type", "Unsupported content type")
            }
            Self::BadRequest { .. } => (StatusCode::BAD_REQUEST, "bad-request", "Bad request"),
            Self::Passthrough { status, .. } => (*status, "http-error", status.canonical_reason().unwrap_or("Error")),
            Self::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable", "Service unavailable"),
            Self::Store(e) if e.is_unavailable() => {
                (StatusCode::SERVICE_UNAVAILABLE, "unavailable", "Service unavailable")
            }
            Self::Store(_) | Self::Internal(_) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "internal", "Internal server error")
            }
        };
        let mut problem = Problem {
            kind: format!("{PROBLEM_BASE}{slug}"),
            title: title.into(),
            status: status.as_u16(),
            detail: Some(self.to_string()),
            errors: Vec::new(),
            referrers: Vec::new(),
            correlation_id: None,
        };
        match self {
            Self::InvalidBody(errors) | Self::Unprocessable { errors, .. } => problem.errors = errors.clone(),
            Self::Referenced { referrers, .. } => problem.referrers = referrers.clone(),
            Self::Unavailable(source) => {
                tracing::warn!(error = %source, "admin readiness check failed");
            }
            // Says what to do, and holds nothing internal.
            Self::Store(rotated @ StoreError::SecretKeyRotated { .. }) => problem.detail = Some(rotated.to_string()),
            Self::Store(e) if e.is_unavailable() => {
                tracing::warn!(error = %e, "admin request failed: the database is unreachable");
                problem.detail = Some(format!(
                    "the control plane cannot reach its database ({e}); retry after {RETRY_AFTER_SECONDS} s"
                ));
            }
            Self::Store(_) | Self::Internal(_) => {
                let id = uuid::Uuid::new_v4().to_string();
                // Store errors carry SQL and driver text, never request bodies, so logging them leaks no secret.
                tracing::error!(correlation_id = %id, error = %self, source = ?std::error::Error::source(self), "admin request failed");
                problem.detail = Some("the request failed inside the control plane; the log has the details".into());
                problem.correlation_id = Some(id);
            }
            _ => {}
        }
        (status, problem)
    }
}

/// `Retry-After` of a 503: while the database is unreachable a client should
/// come back, and each attempt costs the acquire timeout.
pub const RETRY_AFTER_SECONDS: u64 = 5;

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let (status, problem) = self.problem();
        let mut response = problem_response(status, &problem);
        if matches!(self, Self::Unauthorized) {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        response
    }
}

pub fn problem_response(status: StatusCode, problem: &Problem) -> Response {
    let body = serde_json::to_vec(problem).unwrap_or_default();
    (status, [(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON))], body).into_response()
}
