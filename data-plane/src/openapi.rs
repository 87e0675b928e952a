//! The `openapi` policy, in the request path after authentication and rate
//! limiting (body validation last, because it buffers). The spec is compiled
//! and checked by `sluice_proto::openapi`, the code the control plane refuses
//! an uncompilable spec with; what is left here is the rejection a client
//! receives: DESIGN.md's validation problem.

use std::collections::BTreeMap;

use http::{HeaderValue, Method, Response, header};
use serde::Serialize;

use crate::base::{ProxyBody, problem};

pub use sluice_proto::openapi::{RequestMatch, SpecValidator, ValidationFailure};

#[cfg(test)]
mod tests;

const VALIDATION_SLUG: &str = "validation";

/// DESIGN.md's validation problem: the common members, then what failed where
/// (request failures only: a response failure's details stay in the log).
#[derive(Serialize)]
struct ValidationProblem<'a> {
    #[serde(rename = "type", serialize_with = "problem::type_uri")]
    slug: &'a str,
    title: &'a str,
    #[serde(serialize_with = "problem::status_code")]
    status: http::StatusCode,
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
    errors: BTreeMap<&'a str, Vec<Message<'a>>>,
}

#[derive(Serialize)]
struct Message<'a> {
    message: &'a str,
}

/// The problem-details response. A request failure names every violation
/// so the client can fix them all at once; a response failure does not
/// echo the upstream's data to the client (it is in the log instead).
pub fn respond(failure: &ValidationFailure, request_id: &str) -> Response<ProxyBody> {
    let validation = (!failure.is_response()).then(|| Validation {
        method: failure.method().as_str(),
        uri_template: failure.uri_template(),
        errors: failure
            .errors()
            .map(|(location, messages)| (location, messages.iter().map(|m| Message { message: m }).collect()))
            .collect(),
    });
    let (title, detail) = if failure.is_response() {
        ("Response validation failed", Some("The upstream's response does not match the API specification."))
    } else {
        ("Request validation failed", None)
    };
    let status = failure.status();
    let body = ValidationProblem { slug: VALIDATION_SLUG, title, status, detail, validation, request_id };
    let mut response = problem::respond(status, &body);
    if !failure.allow().is_empty() {
        let names: Vec<&str> = failure.allow().iter().map(Method::as_str).collect();
        if let Ok(value) = HeaderValue::from_str(&names.join(", ")) {
            response.headers_mut().insert(header::ALLOW, value);
        }
    }
    response
}
