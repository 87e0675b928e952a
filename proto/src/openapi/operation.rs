//! One OpenAPI operation, compiled for the `openapi` policy: its parameters,
//! request body and (when response validation is on) responses, each with its
//! validators built at snapshot time; `check_request`/`check_response` are the
//! per-message work once the router has found the operation.

use http::{HeaderMap, Method, StatusCode};
use serde_json::Value;

use super::SpecError;
use super::body::{Content, RequestBody, Side};
use super::document::{escape, resolve};
use super::failure::{Errors, ValidationFailure};
use super::params::{self, In, Parameter, check_headers};
use super::schema::SchemaCompiler;

pub(super) struct Operation {
    /// The path template relative to the base path, as written in the spec (`/products/{id}`).
    pub(super) template: String,
    parameters: Vec<Parameter>,
    body: Option<RequestBody>,
    responses: Vec<(StatusKey, ResponseSpec)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StatusKey {
    Exact(u16),
    /// `4XX`: the hundreds digit.
    Range(u16),
    Default,
}

struct ResponseSpec {
    headers: Vec<Parameter>,
    content: Content,
}

/// Where an operation sits in the document.
pub(super) struct Location<'a> {
    pub(super) template: &'a str,
    /// Pointer to and value of the (resolved) Path Item.
    pub(super) item_pointer: &'a str,
    pub(super) item: &'a Value,
    pub(super) method: &'a str,
}

impl Operation {
    pub(super) fn compile(
        doc: &Value,
        at: &Location<'_>,
        with_responses: bool,
        schemas: &mut SchemaCompiler,
    ) -> Result<Operation, SpecError> {
        let op_pointer = format!("{}/{}", at.item_pointer, at.method);
        let op = &at.item[at.method];

        // Path-level parameters apply unless the operation redefines the same (name, in).
        let mut parameters: Vec<Parameter> = Vec::new();
        for (base, list) in [(op_pointer.as_str(), op.get("parameters")), (at.item_pointer, at.item.get("parameters"))]
        {
            for (i, entry) in list.and_then(Value::as_array).into_iter().flatten().enumerate() {
                let (pointer, value) = resolve(doc, format!("{base}/parameters/{i}"), entry)?;
                if let Some(parameter) = Parameter::compile(doc, &pointer, value, schemas)?
                    && !parameters.iter().any(|p| p.name == parameter.name && p.location == parameter.location)
                {
                    parameters.push(parameter);
                }
            }
        }

        let body = match op.get("requestBody") {
            Some(entry) => {
                let (pointer, value) = resolve(doc, format!("{op_pointer}/requestBody"), entry)?;
                let content = match value.get("content") {
                    Some(content) => Content::compile(doc, &format!("{pointer}/content"), content, schemas)?,
                    None => Content::default(),
                };
                let required = value.get("required").and_then(Value::as_bool).unwrap_or(false);
                Some(RequestBody { required, content })
            }
            None => None,
        };

        let mut responses = Vec::new();
        if with_responses {
            for (code, entry) in op.get("responses").and_then(Value::as_object).into_iter().flatten() {
                let Some(key) = status_key(code) else { continue };
                let (pointer, value) = resolve(doc, format!("{op_pointer}/responses/{}", escape(code)), entry)?;
                let mut headers = Vec::new();
                for (name, header) in value.get("headers").and_then(Value::as_object).into_iter().flatten() {
                    let (header_pointer, header) = resolve(doc, format!("{pointer}/headers/{}", escape(name)), header)?;
                    headers.extend(Parameter::compile_response_header(doc, &header_pointer, header, name, schemas)?);
                }
                let content = match value.get("content") {
                    Some(content) => Content::compile(doc, &format!("{pointer}/content"), content, schemas)?,
                    None => Content::default(),
                };
                responses.push((key, ResponseSpec { headers, content }));
            }
        }

        Ok(Operation { template: at.template.to_owned(), parameters, body, responses })
    }

    /// Whether the body must be buffered for `check_request`.
    pub(super) fn needs_body(&self) -> bool {
        self.body.as_ref().is_some_and(|b| b.content.has_json_schema())
    }

    /// `path_params` are the matched template values by spec name.
    pub(super) fn check_request(
        &self,
        method: &Method,
        path_params: &[(&str, &str)],
        query: Option<&str>,
        headers: &HeaderMap,
        body: Option<&[u8]>,
    ) -> Result<(), ValidationFailure> {
        let mut errors = Errors::default();
        params::check_path(&self.parameters, path_params, &mut errors);
        params::check_query(&self.parameters, query, &mut errors);
        check_headers(&self.parameters, In::Header, headers, &mut errors);
        let unsupported = match &self.body {
            Some(spec) if !spec.content.is_empty() => {
                spec.content.check(Side::Request, spec.required, headers, body, &mut errors)
            }
            _ => false,
        };
        if errors.is_empty() {
            return Ok(());
        }
        let status = if unsupported { StatusCode::UNSUPPORTED_MEDIA_TYPE } else { StatusCode::BAD_REQUEST };
        Err(ValidationFailure::request(status, method, Some(&self.template), errors))
    }

    pub(super) fn check_response(
        &self,
        method: &Method,
        status: StatusCode,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<(), ValidationFailure> {
        let mut errors = Errors::default();
        let code = status.as_u16();
        let spec = [StatusKey::Exact(code), StatusKey::Range(code / 100), StatusKey::Default]
            .iter()
            .find_map(|key| self.responses.iter().find(|(k, _)| k == key).map(|(_, spec)| spec));
        match spec {
            Some(spec) => {
                check_headers(&spec.headers, In::ResponseHeader, headers, &mut errors);
                if !spec.content.is_empty() {
                    spec.content.check(Side::Response, false, headers, Some(body), &mut errors);
                }
            }
            None => errors.add("RESPONSE/STATUS", format!("status {code} is not declared for this operation")),
        }
        if errors.is_empty() { Ok(()) } else { Err(ValidationFailure::response(method, &self.template, errors)) }
    }
}

fn status_key(code: &str) -> Option<StatusKey> {
    if code == "default" {
        return Some(StatusKey::Default);
    }
    match code.as_bytes() {
        [d, b'X' | b'x', b'X' | b'x'] if d.is_ascii_digit() => Some(StatusKey::Range(u16::from(d - b'0'))),
        _ => code.parse().ok().map(StatusKey::Exact),
    }
}
