//! Request bodies, between the socket and the handlers: content-type negotiation, JSON/YAML parsing, validation
//! against the JSON Schema that utoipa generates for the model (so every bad field is reported at once, with its
//! pointer, before serde would stop at the first), and RFC 7396 merge patches.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use jsonschema::error::ValidationErrorKind;
use jsonschema::{ValidationError, Validator};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use super::Shared;
use super::error::{AdminError, FieldError};
use crate::nesting::check_flow_depth;
use crate::tokens::Principal;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Yaml,
}

const YAML_TYPES: &[&str] = &["application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml"];

/// The format of a request body. A missing `Content-Type` is read as JSON because that is what `curl -d` users
/// mean; form encodings and anything else are refused rather than guessed at.
pub fn request_format(headers: &HeaderMap) -> Result<Format, AdminError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Ok(Format::Json);
    };
    let essence = value.to_str().unwrap_or_default().split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    if essence == "application/json" || essence.ends_with("+json") {
        Ok(Format::Json)
    } else if YAML_TYPES.contains(&essence.as_str()) {
        Ok(Format::Yaml)
    } else {
        Err(AdminError::UnsupportedMediaType {
            content_type: if essence.is_empty() { "(unreadable)".into() } else { essence },
            expected: "application/json (or application/merge-patch+json for PATCH) or application/yaml",
        })
    }
}

/// Whether the client asked for YAML, by `?format=yaml` or an `Accept` header that names YAML before JSON.
pub fn wants_yaml(headers: &HeaderMap, format: Option<&str>) -> bool {
    if let Some(format) = format {
        return format.eq_ignore_ascii_case("yaml") || format.eq_ignore_ascii_case("yml");
    }
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or_default().to_ascii_lowercase();
    let yaml_at = YAML_TYPES.iter().filter_map(|t| accept.find(t)).min();
    let json_at = accept.find("application/json");
    match (yaml_at, json_at) {
        (Some(y), Some(j)) => y < j,
        (Some(_), None) => true,
        _ => false,
    }
}

/// What a write that carries a body takes from its request: the name of the token that sent it (the history
/// names it), the headers (the body's format) and the body. It takes the body, so it is a handler's last argument.
pub(crate) struct BodyWrite {
    pub author: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl<S: Send + Sync> FromRequest<S> for BodyWrite {
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Response> {
        // `auth::authenticate` puts the principal on every request it lets through to a write.
        let author =
            request.extensions().get::<Principal>().map(|principal| principal.name.clone()).ok_or_else(|| {
                AdminError::Internal("a write reached its handler without a principal".into()).into_response()
            })?;
        let headers = request.headers().clone();
        let body = Bytes::from_request(request, state).await.map_err(IntoResponse::into_response)?;
        Ok(Self { author, headers, body })
    }
}

/// Deepest nesting of collections a request body may have. The model nests about eight levels; the limit only has
/// to stop bodies built to make a parser slow (libyaml's cost grows with the depth on every token).
pub const MAX_DEPTH: usize = 64;

/// Runs first in every body's task on the blocking pool; tests use it to hold a parse in progress.
pub type ParseHook = Arc<dyn Fn() + Send + Sync>;

/// Parses the body, lets `shape` adjust the value (fill in a name, apply a merge patch), then checks it against
/// the schema `schema` and decodes it. All of it runs on the blocking pool: a large or hostile body then holds a
/// blocking thread, never one of the runtime's workers that serve every other request, health probes included.
pub(crate) async fn decode_body<T>(
    admin: &Shared,
    headers: &HeaderMap,
    body: Bytes,
    schema: &'static str,
    shape: impl FnOnce(&mut Value) -> Result<(), AdminError> + Send + 'static,
) -> Result<T, AdminError>
where
    T: DeserializeOwned + Send + 'static,
{
    let format = request_format(headers)?;
    let admin = admin.clone();
    tokio::task::spawn_blocking(move || {
        if let Some(hook) = &admin.parse_hook {
            hook();
        }
        let mut value = parse(&body, format)?;
        shape(&mut value)?;
        admin.schemas.decode(schema, value)
    })
    .await
    .map_err(|e| AdminError::Internal(format!("body task failed: {e}")))?
}

/// Parses the body into a JSON value. Parser messages name a line and column, never echo the input, so a secret in
/// a malformed body does not end up in the response. The nesting is measured before any parser runs.
pub fn parse(bytes: &[u8], format: Format) -> Result<Value, AdminError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(AdminError::MalformedBody { detail: "the request body is empty".into() });
    }
    check_flow_depth(bytes, MAX_DEPTH)
        .map_err(|e| AdminError::BodyLimit { detail: format!("the request body is {e}") })?;
    match format {
        Format::Json => serde_json::from_slice(bytes).map_err(|e| AdminError::MalformedBody { detail: e.to_string() }),
        Format::Yaml => {
            let mut value: yaml_serde::Value = yaml_serde::from_slice(bytes).map_err(yaml_error)?;
            value.apply_merge().map_err(yaml_error)?;
            yaml_to_json(value).map_err(|detail| AdminError::MalformedBody { detail })
        }
    }
}

/// YAML's nesting in block style (indentation) and its aliases are bounded by the parser itself; those refusals
/// are limits, not syntax errors.
fn yaml_error(error: yaml_serde::Error) -> AdminError {
    let detail = error.to_string();
    if detail.starts_with("recursion limit exceeded") {
        AdminError::BodyLimit { detail: format!("the request body is nested too deeply: {detail}") }
    } else if detail.starts_with("repetition limit exceeded") {
        AdminError::BodyLimit { detail: format!("the request body's aliases expand too far: {detail}") }
    } else {
        AdminError::MalformedBody { detail }
    }
}

/// YAML's data model is wider than JSON's. Tags are what serde YAML writers emit for enums (`!basic_auth {}`), so
/// a tagged value is read as the single-key mapping the config file uses (`basic_auth: {}`); scalar keys become
/// strings.
fn yaml_to_json(value: yaml_serde::Value) -> Result<Value, String> {
    use yaml_serde::Value as Yaml;
    Ok(match value {
        Yaml::Null => Value::Null,
        Yaml::Bool(b) => Value::Bool(b),
        Yaml::Number(n) => serde_json::to_value(&n).map_err(|e| e.to_string())?,
        Yaml::String(s) => Value::String(s),
        Yaml::Sequence(items) => Value::Array(items.into_iter().map(yaml_to_json).collect::<Result<_, _>>()?),
        Yaml::Mapping(mapping) => {
            let mut object = Map::new();
            for (key, value) in mapping {
                let key = match key {
                    Yaml::String(s) => s,
                    Yaml::Number(n) => n.to_string(),
                    Yaml::Bool(b) => b.to_string(),
                    Yaml::Null => "null".into(),
                    _ => return Err("mapping keys must be strings".into()),
                };
                object.insert(key, yaml_to_json(value)?);
            }
            Value::Object(object)
        }
        Yaml::Tagged(tagged) => {
            let tag = tagged.tag.to_string();
            let mut object = Map::new();
            object.insert(tag.trim_start_matches('!').to_string(), yaml_to_json(tagged.value)?);
            Value::Object(object)
        }
    })
}

/// Compiled validators for the request body types, built once from the generated OpenAPI components so the
/// schema served at `/openapi.json` and the one enforced are the same document.
pub struct Schemas {
    validators: HashMap<String, Validator>,
}

impl Schemas {
    /// `document` is the OpenAPI document as served.
    pub fn from_document(document: &Value, names: &[&str]) -> Self {
        let components = document.get("components");
        let mut validators = HashMap::new();
        for name in names {
            let Some(components) = components else { break };
            if components.pointer(&format!("/schemas/{name}")).is_none() {
                tracing::error!(schema = name, "no generated schema: request bodies fall back to serde checks only");
                continue;
            }
            let document = json!({ "$ref": format!("#/components/schemas/{name}"), "components": components });
            match jsonschema::draft202012::options().build(&document) {
                Ok(validator) => {
                    validators.insert((*name).to_string(), validator);
                }
                Err(e) => tracing::error!(schema = name, error = %e, "cannot compile the generated schema"),
            }
        }
        Self { validators }
    }

    #[cfg(test)]
    pub fn compiled(&self, name: &str) -> bool {
        self.validators.contains_key(name)
    }

    /// Checks `value` against the schema `name` and lists every problem.
    #[cfg(test)]
    pub fn check(&self, name: &str, value: &Value) -> Result<(), AdminError> {
        let errors = self.errors(name, value);
        if errors.is_empty() { Ok(()) } else { Err(AdminError::InvalidBody(errors)) }
    }

    fn errors(&self, name: &str, value: &Value) -> Vec<FieldError> {
        let Some(validator) = self.validators.get(name) else { return Vec::new() };
        let mut errors = Vec::new();
        for error in validator.iter_errors(value) {
            field_errors(&error, &mut errors);
        }
        errors.dedup();
        errors
    }

    /// Every problem the schema finds, and every number written with a fraction (`weight: 5.0`: JSON Schema
    /// counts it as an integer, serde does not, and no field of the model is a float), all at once, each at its
    /// pointer. Serde runs only on a body that passed both; what it can still refuse (a duration too long for the
    /// clock) is reported at the pointer where it stopped.
    pub fn decode<T: DeserializeOwned>(&self, name: &str, value: Value) -> Result<T, AdminError> {
        let mut errors = self.errors(name, &value);
        let mut fractions = Vec::new();
        fractional_numbers(&value, &mut String::new(), &mut fractions);
        fractions.retain(|f| !errors.iter().any(|e| e.pointer == f.pointer));
        errors.append(&mut fractions);
        if !errors.is_empty() {
            return Err(AdminError::InvalidBody(errors));
        }
        serde_path_to_error::deserialize(value).map_err(|e| {
            let mut pointer = String::new();
            for segment in e.path().iter() {
                use serde_path_to_error::Segment;
                match segment {
                    Segment::Seq { index } => pointer.push_str(&format!("/{index}")),
                    Segment::Map { key } | Segment::Enum { variant: key } => {
                        pointer.push('/');
                        pointer.push_str(&escape(key));
                    }
                    Segment::Unknown => {}
                }
            }
            AdminError::InvalidBody(vec![FieldError::new(pointer, e.into_inner().to_string())])
        })
    }
}

/// Numbers that carry a fraction or an exponent (`5.0`, `1e3`), by pointer.
fn fractional_numbers(value: &Value, pointer: &mut String, out: &mut Vec<FieldError>) {
    let len = pointer.len();
    match value {
        Value::Number(n) if n.is_f64() => {
            out.push(FieldError::new(
                pointer.clone(),
                "must be a whole number, written without a fraction or exponent",
            ));
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                pointer.push_str(&format!("/{i}"));
                fractional_numbers(item, pointer, out);
                pointer.truncate(len);
            }
        }
        Value::Object(object) => {
            for (key, item) in object {
                pointer.push('/');
                pointer.push_str(&escape(key));
                fractional_numbers(item, pointer, out);
                pointer.truncate(len);
            }
        }
        _ => {}
    }
}

/// Flattens one validation error into field errors. Messages are masked: they describe the value's shape, never
/// repeat it, because the value may be a password.
fn field_errors(error: &ValidationError<'_>, out: &mut Vec<FieldError>) {
    let at = error.instance_path().as_str().to_string();
    match error.kind() {
        ValidationErrorKind::AdditionalProperties { unexpected }
        | ValidationErrorKind::UnevaluatedProperties { unexpected } => {
            for field in unexpected {
                out.push(FieldError::new(format!("{at}/{}", escape(field)), "unknown field"));
            }
        }
        ValidationErrorKind::Required { property } => {
            let field = property.as_str().map(str::to_string).unwrap_or_else(|| property.to_string());
            out.push(FieldError::new(format!("{at}/{}", escape(&field)), "is required"));
        }
        ValidationErrorKind::OneOfNotValid { context } | ValidationErrorKind::AnyOf { context } => {
            // `Option<Struct>` and enums with data become `oneOf` in the schema; reporting "matches none of the
            // alternatives" would hide the real field. When exactly one alternative has the right shape at this
            // level, its errors are the ones that matter.
            let plausible: Vec<&Vec<ValidationError<'static>>> = context
                .iter()
                .filter(|branch| {
                    !branch.iter().any(|e| {
                        e.instance_path().as_str() == at
                            && matches!(
                                e.kind(),
                                ValidationErrorKind::Type { .. } | ValidationErrorKind::Required { .. }
                            )
                    })
                })
                .collect();
            if let [branch] = plausible.as_slice() {
                for e in branch.iter() {
                    field_errors(e, out);
                }
            } else {
                out.push(FieldError::new(at, "does not match any of the allowed forms"));
            }
        }
        _ => out.push(FieldError::new(at, error.masked().to_string())),
    }
}

/// JSON pointer escaping of one reference token.
fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// RFC 7396 JSON merge patch: objects merge key by key, `null` deletes, anything else (arrays too) replaces.
pub fn merge_patch(target: &mut Value, patch: Value) {
    let Value::Object(patch) = patch else {
        *target = patch;
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(target) = target {
        for (key, value) in patch {
            if value.is_null() {
                target.remove(&key);
            } else {
                merge_patch(target.entry(key).or_insert(Value::Null), value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_patch_follows_rfc_7396_examples() {
        let cases = [
            (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": "b"}), json!({"b": "c"}), json!({"a": "b", "b": "c"})),
            (json!({"a": "b"}), json!({"a": null}), json!({})),
            (json!({"a": ["b"]}), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": {"b": "c"}}), json!({"a": {"b": "d", "c": null}}), json!({"a": {"b": "d"}})),
            (json!({"a": [{"b": "c"}]}), json!({"a": [1]}), json!({"a": [1]})),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a": "foo"}), json!("bar"), json!("bar")),
            (json!({"e": null}), json!({"a": 1}), json!({"e": null, "a": 1})),
            (json!([1, 2]), json!({"a": "b", "c": null}), json!({"a": "b"})),
        ];
        for (mut target, patch, expected) in cases {
            merge_patch(&mut target, patch);
            assert_eq!(target, expected);
        }
    }

    #[test]
    fn yaml_enum_tags_read_as_single_key_mappings() {
        let yaml = "policies:\n  - !basic_auth {}\n  - rate_limit: { requests: 5 }\nbase: &b { x: 1 }\nmerged: { <<: *b, y: 2 }\n";
        let value = parse(yaml.as_bytes(), Format::Yaml).unwrap_or_default();
        assert_eq!(value["policies"], json!([{ "basic_auth": {} }, { "rate_limit": { "requests": 5 } }]));
        assert_eq!(value["merged"], json!({ "x": 1, "y": 2 }));
    }

    #[test]
    fn yaml_is_asked_for_by_query_or_accept() {
        let mut headers = HeaderMap::new();
        assert!(!wants_yaml(&headers, None));
        assert!(wants_yaml(&headers, Some("yaml")));
        headers.insert(header::ACCEPT, axum::http::HeaderValue::from_static("application/yaml"));
        assert!(wants_yaml(&headers, None));
        assert!(!wants_yaml(&headers, Some("json")));
    }
}
