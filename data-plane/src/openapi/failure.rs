//! The `openapi` policy's rejection: every violation found, by location, and
//! the problem-details response (DESIGN.md's validation shape) the pipeline
//! sends instead of forwarding.

use std::collections::BTreeMap;
use std::fmt;

use http::{HeaderValue, Method, Response, StatusCode, header};
use serde::Serialize;

use crate::base::{ProxyBody, problem};

const VALIDATION_SLUG: &str = "validation";

/// Violations by location (`REQUEST/BODY#/price`), in a stable order so the
/// same request always gets the same body.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Errors(BTreeMap<String, Vec<String>>);

impl Errors {
    pub(super) fn add(&mut self, location: impl Into<String>, message: impl Into<String>) {
        self.0.entry(location.into()).or_default().push(message.into());
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    #[cfg(test)]
    pub(super) fn locations(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

/// DESIGN.md's validation problem: the common members, then what failed where
/// (request failures only: a response failure's details stay in the log).
#[derive(Serialize)]
struct ValidationProblem<'a> {
    #[serde(rename = "type", serialize_with = "problem::type_uri")]
    slug: &'a str,
    title: &'a str,
    #[serde(serialize_with = "problem::status_code")]
    status: StatusCode,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    validation: Option<Validation<'a>>,
    request_id: &'a str,
}

#[derive(Serialize)]
struct Validation<'a> {
    method: &'a str,
    #[serde(rename = "uriTemplate")]
    uri_template: Option<&'a str>,
    errors: BTreeMap<&'a String, Vec<Message<'a>>>,
}

#[derive(Serialize)]
struct Message<'a> {
    message: &'a String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Request,
    Response,
}

/// A request (or upstream response) that does not match the API's spec.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{} validation failed for {method} {} ({status}): {errors}", side_name(.side), .uri_template.as_deref().unwrap_or("?"))]
pub struct ValidationFailure {
    side: Side,
    status: StatusCode,
    method: Method,
    /// The matched path template relative to the base path; `None` when no template matched.
    uri_template: Option<String>,
    errors: Errors,
    /// For 405: the methods the path does accept.
    allow: Vec<Method>,
}

fn side_name(side: &Side) -> &'static str {
    match side {
        Side::Request => "request",
        Side::Response => "response",
    }
}

impl fmt::Display for Errors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (location, messages) in &self.0 {
            for message in messages {
                if !first {
                    f.write_str("; ")?;
                }
                first = false;
                write!(f, "{location}: {message}")?;
            }
        }
        Ok(())
    }
}

impl ValidationFailure {
    pub(super) fn request(status: StatusCode, method: &Method, uri_template: Option<&str>, errors: Errors) -> Self {
        ValidationFailure {
            side: Side::Request,
            status,
            method: method.clone(),
            uri_template: uri_template.map(str::to_owned),
            errors,
            allow: Vec::new(),
        }
    }

    pub(super) fn method_not_allowed(method: &Method, uri_template: &str, allow: Vec<Method>) -> Self {
        let mut errors = Errors::default();
        let names: Vec<&str> = allow.iter().map(Method::as_str).collect();
        errors.add(
            "REQUEST/METHOD",
            format!("method {method} is not allowed on {uri_template}; allowed: {}", names.join(", ")),
        );
        let mut failure = Self::request(StatusCode::METHOD_NOT_ALLOWED, method, Some(uri_template), errors);
        failure.allow = allow;
        failure
    }

    /// An upstream response that breaks the spec: the gateway's fault towards
    /// the client, hence 502; the caller logs the details (`Display`).
    pub(super) fn response(method: &Method, uri_template: &str, errors: Errors) -> Self {
        ValidationFailure {
            side: Side::Response,
            status: StatusCode::BAD_GATEWAY,
            method: method.clone(),
            uri_template: Some(uri_template.to_owned()),
            errors,
            allow: Vec::new(),
        }
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    #[cfg(test)]
    pub(super) fn locations(&self) -> Vec<&str> {
        self.errors.locations()
    }

    /// True when an upstream response failed validation (log it as an upstream fault).
    pub fn is_response(&self) -> bool {
        self.side == Side::Response
    }

    /// The problem-details response. A request failure names every violation
    /// so the client can fix them all at once; a response failure does not
    /// echo the upstream's data to the client (it is in the log instead).
    pub fn into_response(self, request_id: &str) -> Response<ProxyBody> {
        let validation = (self.side == Side::Request).then(|| Validation {
            method: self.method.as_str(),
            uri_template: self.uri_template.as_deref(),
            errors: self
                .errors
                .0
                .iter()
                .map(|(location, messages)| (location, messages.iter().map(|message| Message { message }).collect()))
                .collect(),
        });
        let (title, detail) = match self.side {
            Side::Request => ("Request validation failed", None),
            Side::Response => {
                ("Response validation failed", Some("The upstream's response does not match the API specification."))
            }
        };
        let problem =
            ValidationProblem { slug: VALIDATION_SLUG, title, status: self.status, detail, validation, request_id };
        let mut response = problem::respond(self.status, &problem);
        if !self.allow.is_empty() {
            let names: Vec<&str> = self.allow.iter().map(Method::as_str).collect();
            if let Ok(value) = HeaderValue::from_str(&names.join(", ")) {
                response.headers_mut().insert(header::ALLOW, value);
            }
        }
        response
    }
}
