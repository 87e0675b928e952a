//! An API's OpenAPI spec as both planes read it. A data plane's `openapi`
//! policy checks each request (and optionally each upstream response)
//! against the spec's path templates, methods, parameters, content types and
//! JSON bodies; the control plane compiles the same spec with the same code
//! before it commits a snapshot ([`crate::check_compilable`]), so a spec a
//! data plane could not compile is refused at write time, not NACKed.
//! `SpecValidator::compile` does all the work that can be done once per
//! snapshot (parsing, `$ref`s, schema compilation, the path router);
//! `match_request` (then `RequestMatch::check`) and `validate_response` only
//! match and run validators. `server` is the reading of `servers[0]`.

mod body;
mod document;
mod failure;
mod operation;
mod params;
mod router;
mod schema;
mod server;

use std::fmt;
use std::sync::Arc;

use http::{HeaderMap, Method, StatusCode};
use serde_json::Value;

use crate::v1;
use document::{Version, escape, resolve};
use operation::{Location, Operation};
use router::{Found, Router};
use schema::SchemaCompiler;

pub use failure::ValidationFailure;
pub use server::{ServerError, base_path, server_origin, server_url};

/// Why a spec cannot be compiled: a 422 at the control plane, a NACK reason
/// on a data plane of another build.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("the document is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("unsupported OpenAPI version: {0}")]
    Version(String),
    #[error("cannot resolve `{reference}`: {reason}")]
    Ref { reference: String, reason: String },
    #[error("invalid object at #{pointer}: {reason}")]
    Invalid { pointer: String, reason: String },
    #[error("invalid schema at {pointer}: {reason}")]
    Schema { pointer: String, reason: String },
    #[error("path `{template}` cannot be routed: {reason}")]
    Route { template: String, reason: String },
}

impl SpecError {
    /// Where in the document the fault is, as a JSON pointer (RFC 6901)
    /// without the leading `#`; `None` when it is the whole document or
    /// the reference itself names the place.
    pub fn pointer(&self) -> Option<String> {
        match self {
            SpecError::Json(_) | SpecError::Ref { .. } => None,
            SpecError::Version(_) => Some("/openapi".into()),
            SpecError::Invalid { pointer, .. } | SpecError::Schema { pointer, .. } => {
                Some(pointer.strip_prefix('#').unwrap_or(pointer).to_owned())
            }
            SpecError::Route { template, .. } => Some(format!("/paths/{}", escape(template))),
        }
    }
}

/// A spec that does not compile, with its name.
#[derive(Debug, thiserror::Error)]
#[error("spec `{spec}`: {error}")]
pub struct CompileError {
    pub spec: String,
    pub error: SpecError,
}

/// HTTP methods OpenAPI path items can hold, by their key in the document.
const METHODS: [(&str, Method); 8] = [
    ("get", Method::GET),
    ("put", Method::PUT),
    ("post", Method::POST),
    ("delete", Method::DELETE),
    ("options", Method::OPTIONS),
    ("head", Method::HEAD),
    ("patch", Method::PATCH),
    ("trace", Method::TRACE),
];

/// What a compiled validator was built from: equal inputs give an equal
/// validator, so a snapshot that leaves them alone reuses the old one.
#[derive(PartialEq, Eq)]
struct Inputs {
    json: String,
    validate_requests: bool,
    validate_responses: bool,
    path_prefix: String,
}

/// An API's spec, compiled: immutable and shared by every request on the
/// routing table that holds it.
pub struct SpecValidator {
    inputs: Inputs,
    spec_name: String,
    router: Router,
}

impl fmt::Debug for SpecValidator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpecValidator")
            .field("spec", &self.spec_name)
            .field("validate_requests", &self.inputs.validate_requests)
            .field("validate_responses", &self.inputs.validate_responses)
            .finish_non_exhaustive()
    }
}

impl SpecValidator {
    /// Compiles `spec` for `api`. Returns `previous` itself when the spec
    /// text, the binding and the API prefix are unchanged. The error names
    /// the spec and what is wrong with it.
    pub fn compile(
        spec: &v1::Spec,
        binding: &v1::OpenApiBinding,
        api: &v1::Api,
        previous: Option<&Arc<SpecValidator>>,
    ) -> Result<Arc<SpecValidator>, CompileError> {
        let inputs = Inputs {
            json: spec.json.clone(),
            validate_requests: binding.validate_requests,
            validate_responses: binding.validate_responses,
            path_prefix: api.path_prefix.clone(),
        };
        if let Some(previous) = previous
            && previous.inputs == inputs
        {
            return Ok(previous.clone());
        }
        let router = build_router(&inputs).map_err(|error| CompileError { spec: spec.name.clone(), error })?;
        Ok(Arc::new(SpecValidator { inputs, spec_name: spec.name.clone(), router }))
    }

    pub fn validates_requests(&self) -> bool {
        self.inputs.validate_requests
    }

    pub fn validates_responses(&self) -> bool {
        self.inputs.validate_responses
    }

    /// Matches a request to its operation, once per request: the match says
    /// whether the body must be buffered, then checks the request. A request
    /// no operation serves fails here (404 or 405), before its body is read.
    /// Only for APIs that validate requests ([`Self::validates_requests`]).
    pub fn match_request<'a, 'p>(
        &'a self,
        method: &Method,
        path: &'p str,
    ) -> Result<RequestMatch<'a, 'p>, ValidationFailure> {
        self.router.find(method, path).map(|found| RequestMatch { found })
    }

    /// Checks an upstream response to `method path` (status, declared headers,
    /// content type, JSON body). A failure's status is 502. Always `Ok` when
    /// response validation is off, or when the request matches no operation
    /// (request validation, if on, has already refused such requests).
    pub fn validate_response(
        &self,
        method: &Method,
        path: &str,
        status: StatusCode,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<(), ValidationFailure> {
        if !self.inputs.validate_responses {
            return Ok(());
        }
        match self.router.find(method, path) {
            Ok(found) => found.operation.check_response(method, status, headers, body),
            Err(_) => Ok(()),
        }
    }
}

/// A request's operation with its path parameters, found by [`SpecValidator::match_request`].
pub struct RequestMatch<'a, 'p> {
    found: Found<'a, 'p>,
}

impl RequestMatch<'_, '_> {
    /// Whether [`Self::check`] wants the request body: only when the
    /// operation has a JSON body schema; everything else streams through unbuffered.
    pub fn needs_body(&self) -> bool {
        self.found.operation.needs_body()
    }

    /// Checks the request; `body` is the buffered body when [`Self::needs_body`]
    /// said so (`None` otherwise). Every violation found is in the failure.
    pub fn check(
        &self,
        method: &Method,
        query: Option<&str>,
        headers: &HeaderMap,
        body: Option<&[u8]>,
    ) -> Result<(), ValidationFailure> {
        self.found.operation.check_request(method, &self.found.params, query, headers, body)
    }
}

fn build_router(inputs: &Inputs) -> Result<Router, SpecError> {
    let mut doc: Value = serde_json::from_str(&inputs.json)?;
    let version = document::version(&doc)?;
    if version == Version::V30 {
        document::rewrite_30(&mut doc);
    }
    let api_prefix = inputs.path_prefix.trim_end_matches('/').to_owned();
    // The same reading of `servers[0]` as the control plane's (a variable without a default is refused).
    let base_path =
        base_path(&doc).map_err(|e| SpecError::Invalid { pointer: "/servers/0".into(), reason: e.to_string() })?;
    let mut router = Router::new(vec![base_path.unwrap_or_default(), api_prefix]);
    let mut schemas = SchemaCompiler::new(&doc)?;
    for (template, item) in doc.get("paths").and_then(Value::as_object).into_iter().flatten() {
        let (item_pointer, item) = resolve(&doc, format!("/paths/{}", escape(template)), item)?;
        let mut operations = Vec::new();
        for (key, method) in &METHODS {
            if item.get(*key).is_some_and(Value::is_object) {
                let at = Location { template, item_pointer: &item_pointer, item, method: key };
                operations
                    .push((method.clone(), Operation::compile(&doc, &at, inputs.validate_responses, &mut schemas)?));
            }
        }
        router.insert(template, operations)?;
    }
    Ok(router)
}
