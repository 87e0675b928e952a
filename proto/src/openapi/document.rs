//! The OpenAPI document as the `openapi` compile step reads it: version,
//! `$ref` following for non-schema objects (parameters,
//! request bodies, responses), and the 3.0 → JSON Schema 2020-12 rewrite that
//! lets one validator engine serve both OpenAPI versions.

use serde_json::{Map, Value};

use super::SpecError;

/// Longest `$ref` chain followed before calling the document circular.
const MAX_REF_HOPS: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Version {
    /// 3.0.x: schemas are an extended subset of draft 4 (`nullable`, boolean exclusive bounds).
    V30,
    /// 3.1 and later: schemas are JSON Schema 2020-12 already.
    V31,
}

pub(super) fn version(doc: &Value) -> Result<Version, SpecError> {
    match doc.get("openapi").and_then(Value::as_str) {
        Some(v) if v.starts_with("3.0") => Ok(Version::V30),
        Some(v) if v.starts_with("3.") => Ok(Version::V31),
        Some(v) => Err(SpecError::Version(v.to_owned())),
        None if doc.get("swagger").is_some() => Err(SpecError::Version("Swagger 2.0".into())),
        None => Err(SpecError::Version("missing `openapi` field".into())),
    }
}

/// Escapes one JSON-pointer reference token (RFC 6901).
pub(super) fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// Follows `$ref`s from `value` (found at `pointer`) to the object they name,
/// returning its pointer too: validators are cached by pointer, so two
/// operations sharing `#/components/requestBodies/Product` share one validator.
pub(super) fn resolve<'a>(
    doc: &'a Value,
    mut pointer: String,
    mut value: &'a Value,
) -> Result<(String, &'a Value), SpecError> {
    for _ in 0..MAX_REF_HOPS {
        let Some(reference) = value.get("$ref").and_then(Value::as_str) else { return Ok((pointer, value)) };
        let Some(target) = reference.strip_prefix('#') else {
            return Err(SpecError::Ref {
                reference: reference.to_owned(),
                reason: "only references inside the document are supported".into(),
            });
        };
        let target = crate::path::percent_decode(target, false).into_owned();
        value = doc.pointer(&target).ok_or_else(|| SpecError::Ref {
            reference: reference.to_owned(),
            reason: "nothing at that location".into(),
        })?;
        pointer = target;
    }
    Err(SpecError::Ref { reference: pointer, reason: "reference chain is circular or too long".into() })
}

/// Rewrites every 3.0 schema in the document into 2020-12 terms, in place:
/// `nullable: true` admits null, boolean `exclusiveMinimum`/`exclusiveMaximum`
/// become numeric bounds. Walking the whole document (not only known schema
/// positions) catches inline schemas everywhere; the keys checked only ever
/// hold booleans in schemas, and value-carrying keywords are skipped so example
/// data is never rewritten.
pub(super) fn rewrite_30(value: &mut Value) {
    rewrite_30_in(value, false);
}

/// Keys whose object maps names (properties, schemas, status codes, media
/// types) to schemas or objects holding schemas: a response keyed `default`
/// must not be mistaken for a schema's `default` value.
const NAME_MAPS: [&str; 12] = [
    "properties",
    "patternProperties",
    "schemas",
    "$defs",
    "definitions",
    "paths",
    "responses",
    "parameters",
    "requestBodies",
    "headers",
    "content",
    "callbacks",
];

/// `names`: the object's keys are names (of properties, schemas), not
/// keywords, so a property called `default` is still a schema to rewrite.
fn rewrite_30_in(value: &mut Value, names: bool) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                let data = matches!(key.as_str(), "example" | "examples" | "enum" | "const" | "default");
                if names || !(data || key.starts_with("x-")) {
                    let child_names = !names && NAME_MAPS.contains(&key.as_str());
                    rewrite_30_in(child, child_names);
                }
            }
            if !names {
                rewrite_schema_30(map);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| rewrite_30_in(item, false)),
        _ => {}
    }
}

fn rewrite_schema_30(schema: &mut Map<String, Value>) {
    for (flag, bound) in [("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")] {
        if let Some(Value::Bool(exclusive)) = schema.get(flag) {
            let exclusive = *exclusive;
            schema.remove(flag);
            if exclusive && let Some(limit) = schema.remove(bound) {
                schema.insert(flag.to_owned(), limit);
            }
        }
    }
    let Some(Value::Bool(nullable)) = schema.get("nullable") else { return };
    let nullable = *nullable;
    schema.remove("nullable");
    if !nullable || schema.is_empty() {
        return;
    }
    let composite = ["$ref", "allOf", "anyOf", "oneOf", "not"].iter().any(|k| schema.contains_key(*k));
    match schema.get("type").and_then(Value::as_str) {
        Some(ty) if !composite => {
            let ty = ty.to_owned();
            schema.insert("type".into(), Value::Array(vec![Value::String(ty), Value::String("null".into())]));
            if let Some(Value::Array(options)) = schema.get_mut("enum")
                && !options.contains(&Value::Null)
            {
                options.push(Value::Null);
            }
        }
        // Subschemas (a `$ref`, `allOf`) would reject null on their own, so
        // null becomes an alternative to the whole schema instead.
        _ => {
            let rest = std::mem::take(schema);
            let null = Value::Object(Map::from_iter([("type".to_owned(), Value::String("null".into()))]));
            schema.insert("anyOf".into(), Value::Array(vec![null, Value::Object(rest)]));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn rewrite_30_table() {
        let cases = [
            (json!({"type": "string", "nullable": true}), json!({"type": ["string", "null"]})),
            (json!({"type": "string", "nullable": false}), json!({"type": "string"})),
            (
                json!({"type": "string", "enum": ["a"], "nullable": true}),
                json!({"type": ["string", "null"], "enum": ["a", null]}),
            ),
            (json!({"$ref": "#/x", "nullable": true}), json!({"anyOf": [{"type": "null"}, {"$ref": "#/x"}]})),
            (
                json!({"type": "number", "minimum": 0, "exclusiveMinimum": true, "maximum": 9, "exclusiveMaximum": false}),
                json!({"type": "number", "exclusiveMinimum": 0, "maximum": 9}),
            ),
            // Example data and property names are left alone; a property named
            // like a data keyword is still a schema.
            (
                json!({"properties": {"nullable": {"type": "boolean"}}, "example": {"nullable": true}}),
                json!({"properties": {"nullable": {"type": "boolean"}}, "example": {"nullable": true}}),
            ),
            (
                json!({"properties": {"default": {"type": "string", "nullable": true}}}),
                json!({"properties": {"default": {"type": ["string", "null"]}}}),
            ),
            (
                json!({"responses": {"default": {"content": {"application/json": {"schema": {"type": "string", "nullable": true}}}}}}),
                json!({"responses": {"default": {"content": {"application/json": {"schema": {"type": ["string", "null"]}}}}}}),
            ),
        ];
        for (mut input, expected) in cases {
            rewrite_30(&mut input);
            assert_eq!(input, expected);
        }
    }

    #[test]
    fn resolve_follows_chains_and_rejects_loops() {
        let doc = json!({"a": {"$ref": "#/b"}, "b": {"$ref": "#/c"}, "c": {"ok": 1}, "x": {"$ref": "#/x"}, "e": {"$ref": "other.yaml#/c"}});
        let (pointer, value) = resolve(&doc, "/a".into(), &doc["a"]).unwrap();
        assert_eq!((pointer.as_str(), value), ("/c", &json!({"ok": 1})));
        assert!(resolve(&doc, "/x".into(), &doc["x"]).is_err());
        assert!(resolve(&doc, "/e".into(), &doc["e"]).is_err());
    }
}
