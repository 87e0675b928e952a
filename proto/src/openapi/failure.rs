//! The `openapi` policy's rejection: every violation found, by location.
//! A data plane renders it as the problem-details response it sends instead
//! of forwarding.

use std::collections::BTreeMap;
use std::fmt;

use http::{Method, StatusCode};

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

    pub(super) fn locations(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
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

    /// Every place that failed (`REQUEST/BODY#/price`), in order.
    pub fn locations(&self) -> Vec<&str> {
        self.errors.locations()
    }

    /// True when an upstream response failed validation (log it as an upstream fault).
    pub fn is_response(&self) -> bool {
        self.side == Side::Response
    }

    pub fn method(&self) -> &Method {
        &self.method
    }

    /// The matched path template relative to the base path; `None` when no template matched.
    pub fn uri_template(&self) -> Option<&str> {
        self.uri_template.as_deref()
    }

    /// Each place that failed with its messages, in a stable order.
    pub fn errors(&self) -> impl Iterator<Item = (&str, &[String])> {
        self.errors.0.iter().map(|(location, messages)| (location.as_str(), messages.as_slice()))
    }

    /// For 405: the methods the path does accept (empty otherwise).
    pub fn allow(&self) -> &[Method] {
        &self.allow
    }
}
