//! Parameters for the `openapi` policy: compiled from an operation's path,
//! query and header parameters (and a response's headers) at snapshot time;
//! at request time their text is decoded, turned into the value the schema
//! expects ("12" → 12, "a,b" → ["a","b"]) and validated.

use std::borrow::Cow;
use std::sync::Arc;

use crate::path::percent_decode;
use http::HeaderMap;
use http::header::HeaderName;
use jsonschema::Validator;
use serde_json::Value;

use super::SpecError;
use super::document::escape;
use super::failure::Errors;
use super::schema::{SchemaCompiler, Types, collect};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum In {
    Path,
    Query,
    Header,
    ResponseHeader,
}

pub(super) struct Parameter {
    pub(super) name: String,
    pub(super) location: In,
    /// The error location, built once: `REQUEST/QUERY_PARAMETER/start`.
    label: String,
    header: Option<HeaderName>,
    required: bool,
    shape: Shape,
    validator: Option<Arc<Validator>>,
}

enum Shape {
    Scalar(Types),
    /// An array: repeated query keys (`explode`) or one value split at `separator`.
    Array {
        items: Types,
        explode: bool,
        separator: char,
    },
    /// A parameter described by `content` (JSON text) instead of `schema`.
    Json,
    /// Object-valued parameters (`deepObject` and friends): presence is
    /// checked, the schema is not, rather than reject valid requests.
    Unchecked,
}

impl Parameter {
    /// `value` is the resolved Parameter object found at `pointer`. `None`
    /// for parameters the gateway does not check: cookies, and the headers
    /// OpenAPI says to ignore (`Accept`, `Content-Type`, `Authorization`;
    /// authentication policies have usually removed the latter already).
    pub(super) fn compile(
        doc: &Value,
        pointer: &str,
        value: &Value,
        schemas: &mut SchemaCompiler,
    ) -> Result<Option<Parameter>, SpecError> {
        let Some(name) = value.get("name").and_then(Value::as_str) else {
            return Err(SpecError::Invalid { pointer: pointer.to_owned(), reason: "parameter without a name".into() });
        };
        let location = match value.get("in").and_then(Value::as_str) {
            Some("path") => In::Path,
            Some("query") => In::Query,
            Some("header")
                if matches!(name.to_ascii_lowercase().as_str(), "accept" | "content-type" | "authorization") =>
            {
                return Ok(None);
            }
            Some("header") => In::Header,
            _ => return Ok(None),
        };
        Self::build(doc, pointer, value, name, location, schemas).map(Some)
    }

    /// A response's Header object (`responses/200/headers/<name>`).
    pub(super) fn compile_response_header(
        doc: &Value,
        pointer: &str,
        value: &Value,
        name: &str,
        schemas: &mut SchemaCompiler,
    ) -> Result<Option<Parameter>, SpecError> {
        if name.eq_ignore_ascii_case("content-type") {
            return Ok(None);
        }
        Self::build(doc, pointer, value, name, In::ResponseHeader, schemas).map(Some)
    }

    fn build(
        doc: &Value,
        pointer: &str,
        value: &Value,
        name: &str,
        location: In,
        schemas: &mut SchemaCompiler,
    ) -> Result<Parameter, SpecError> {
        let label = match location {
            In::Path => format!("REQUEST/PATH_PARAMETER/{name}"),
            In::Query => format!("REQUEST/QUERY_PARAMETER/{name}"),
            In::Header => format!("REQUEST/HEADER/{name}"),
            In::ResponseHeader => format!("RESPONSE/HEADER/{name}"),
        };
        let header = match location {
            In::Header | In::ResponseHeader => {
                Some(HeaderName::from_bytes(name.as_bytes()).map_err(|_| SpecError::Invalid {
                    pointer: pointer.to_owned(),
                    reason: format!("`{name}` is not a valid header name"),
                })?)
            }
            _ => None,
        };
        let required = location == In::Path || value.get("required").and_then(Value::as_bool).unwrap_or(false);
        let (shape, validator) = if let Some(schema) = value.get("schema") {
            let types = Types::of(doc, schema);
            let style = value.get("style").and_then(Value::as_str).unwrap_or(match location {
                In::Query => "form",
                _ => "simple",
            });
            let explode = value.get("explode").and_then(Value::as_bool).unwrap_or(style == "form");
            let shape = if types.array {
                let items = schema_items(doc, schema).map(|items| Types::of(doc, items)).unwrap_or_default();
                let separator = match style {
                    "spaceDelimited" => ' ',
                    "pipeDelimited" => '|',
                    _ => ',',
                };
                Shape::Array { items, explode, separator }
            } else if types.object {
                Shape::Unchecked
            } else {
                Shape::Scalar(types)
            };
            let validator = match shape {
                Shape::Unchecked => None,
                _ => Some(schemas.compile(doc, &format!("{pointer}/schema"))?),
            };
            (shape, validator)
        } else if let Some((media, _)) = value
            .get("content")
            .and_then(Value::as_object)
            .and_then(|c| c.iter().find(|(_, m)| m.get("schema").is_some()))
        {
            let schema_pointer = format!("{pointer}/content/{}/schema", escape(media));
            (Shape::Json, Some(schemas.compile(doc, &schema_pointer)?))
        } else {
            (Shape::Unchecked, None)
        };
        Ok(Parameter { name: name.to_owned(), location, label, header, required, shape, validator })
    }

    /// Checks the parameter's raw values (already percent-decoded; empty when absent).
    fn check(&self, raw: &[Cow<'_, str>], errors: &mut Errors) {
        if raw.is_empty() {
            if self.required {
                let what = match self.location {
                    In::Path => "path parameter",
                    In::Query => "query parameter",
                    In::Header | In::ResponseHeader => "header",
                };
                errors.add(self.label.clone(), format!("required {what} `{}` is missing", self.name));
            }
            return;
        }
        let Some(validator) = &self.validator else { return };
        let value = match &self.shape {
            Shape::Scalar(types) => types.coerce(&raw[0]),
            Shape::Array { items, explode, separator } => {
                let parts: Vec<Value> = if *explode && self.location == In::Query {
                    raw.iter().map(|text| items.coerce(text)).collect()
                } else {
                    raw[0].split(*separator).map(|text| items.coerce(text)).collect()
                };
                Value::Array(parts)
            }
            Shape::Json => serde_json::from_str(&raw[0]).unwrap_or_else(|_| Value::String(raw[0].to_string())),
            Shape::Unchecked => return,
        };
        collect(validator, &value, errors, |_| self.label.clone());
    }
}

fn schema_items<'a>(doc: &'a Value, schema: &'a Value) -> Option<&'a Value> {
    if let Some(items) = schema.get("items") {
        return Some(items);
    }
    let target = schema.get("$ref")?.as_str()?.strip_prefix('#')?;
    doc.pointer(target)?.get("items")
}

/// `params` are the path values matched for the template, by spec name.
pub(super) fn check_path(parameters: &[Parameter], params: &[(&str, &str)], errors: &mut Errors) {
    for parameter in parameters.iter().filter(|p| p.location == In::Path) {
        let raw: Vec<Cow<'_, str>> =
            params.iter().filter(|(name, _)| *name == parameter.name).map(|(_, v)| percent_decode(v, false)).collect();
        parameter.check(&raw, errors);
    }
}

pub(super) fn check_query(parameters: &[Parameter], query: Option<&str>, errors: &mut Errors) {
    if !parameters.iter().any(|p| p.location == In::Query) {
        return;
    }
    let pairs = parse_query(query.unwrap_or(""));
    for parameter in parameters.iter().filter(|p| p.location == In::Query) {
        let raw: Vec<Cow<'_, str>> =
            pairs.iter().filter(|(name, _)| *name == parameter.name).map(|(_, v)| Cow::Borrowed(v.as_ref())).collect();
        parameter.check(&raw, errors);
    }
}

/// Request headers (`In::Header`) or response headers (`In::ResponseHeader`).
pub(super) fn check_headers(parameters: &[Parameter], location: In, headers: &HeaderMap, errors: &mut Errors) {
    for parameter in parameters.iter().filter(|p| p.location == location) {
        let Some(name) = &parameter.header else { continue };
        let values: Vec<Cow<'_, str>> =
            headers.get_all(name).iter().map(|v| String::from_utf8_lossy(v.as_bytes())).collect();
        // Repeated headers are one comma-separated list (RFC 9110 §5.3).
        let raw = if values.len() > 1 { vec![Cow::Owned(values.join(","))] } else { values };
        parameter.check(&raw, errors);
    }
}

/// `application/x-www-form-urlencoded` pairs, decoded.
fn parse_query(query: &str) -> Vec<(Cow<'_, str>, Cow<'_, str>)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(name, true), percent_decode(value, true))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_query_table() {
        let pairs = parse_query("a=1&b&&c=x%26y&a=2");
        let flat: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_ref(), v.as_ref())).collect();
        assert_eq!(flat, vec![("a", "1"), ("b", ""), ("c", "x&y"), ("a", "2")]);
    }
}
