//! What utoipa's attributes cannot say about the generated OpenAPI document, added after generation so that the
//! document states what the server does: the name alphabet (from `sluice_proto`, the rule itself), unsigned
//! integers as `uint32`/`uint64` with their bounds, single-key policy items that refuse other keys, and the
//! answers every operation can give because of its parameters or body (400, 413, 415, 422). The body validator
//! is built from this same refined document, so what is published is what is enforced.

use serde_json::{Map, Value, json};
use sluice_proto::{MAX_NAME_LEN, NAME_PATTERN};

use super::PROBLEM_JSON;

/// The fields that hold a resource's name, by component.
const NAME_FIELDS: &[(&str, &str)] =
    &[("Api", "name"), ("Upstream", "name"), ("Consumer", "username"), ("Spec", "name"), ("Certificate", "name")];

pub fn refine(document: &mut Value) {
    optional_name_on_put(document);
    if let Some(schemas) = document.pointer_mut("/components/schemas").and_then(Value::as_object_mut) {
        for (component, field) in NAME_FIELDS {
            if let Some(property) =
                schemas.get_mut(*component).and_then(|s| s.pointer_mut(&format!("/properties/{field}")))
                && let Some(property) = property.as_object_mut()
            {
                property.insert("pattern".into(), json!(NAME_PATTERN));
                property.insert("minLength".into(), json!(1));
                property.insert("maxLength".into(), json!(MAX_NAME_LEN));
            }
        }
        for schema in schemas.values_mut() {
            walk(schema);
        }
    }
    if let Some(paths) = document.get_mut("paths").and_then(Value::as_object_mut) {
        for item in paths.values_mut().filter_map(Value::as_object_mut) {
            for (method, operation) in item.iter_mut() {
                if let Some(operation) = operation.as_object_mut() {
                    add_input_answers(method, operation);
                    if let Some(parameters) = operation.get_mut("parameters") {
                        walk(parameters);
                    }
                }
            }
        }
    }
}

/// `PUT /v1/<collection>/{name}` takes its name from the URL, so its body may leave the name out: it is validated
/// against `<Component>Replacement`, the component without the name among the required fields (and `null` read as
/// absent).
fn optional_name_on_put(document: &mut Value) {
    let mut replacements = Map::new();
    if let Some(paths) = document.get_mut("paths").and_then(Value::as_object_mut) {
        for item in paths.values_mut() {
            let Some(content) = item.pointer_mut("/put/requestBody/content").and_then(Value::as_object_mut) else {
                continue;
            };
            for media in content.values_mut() {
                let Some(reference) = media.pointer_mut("/schema/$ref") else { continue };
                let Some(component) = reference.as_str().and_then(|r| r.strip_prefix("#/components/schemas/")) else {
                    continue;
                };
                let Some((component, field)) = NAME_FIELDS.iter().find(|(c, _)| *c == component) else { continue };
                let name = format!("{component}Replacement");
                *reference = json!(format!("#/components/schemas/{name}"));
                replacements.insert(name, json!([component, field]));
            }
        }
    }
    let Some(schemas) = document.pointer_mut("/components/schemas").and_then(Value::as_object_mut) else { return };
    for (name, source) in replacements {
        let (Some(component), Some(field)) = (source[0].as_str(), source[1].as_str()) else { continue };
        let Some(mut schema) = schemas.get(component).cloned() else { continue };
        if let Some(required) = schema.get_mut("required").and_then(Value::as_array_mut) {
            required.retain(|r| r != field);
        }
        // `null` reads as absent.
        if let Some(property) = schema.pointer_mut(&format!("/properties/{field}")) {
            *property = json!({ "anyOf": [property.take(), { "type": "null" }] });
        }
        schemas.insert(name, schema);
    }
}

/// Unsigned integers and closed single-key objects, everywhere in a schema.
fn walk(schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            unsigned(object);
            close_single_key_variants(object);
            for child in object.values_mut() {
                walk(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(walk),
        _ => {}
    }
}

/// utoipa publishes `u32` and `u64` as `int32`/`int64` with `minimum: 0`; serde refuses anything above their range,
/// so say so.
fn unsigned(object: &mut Map<String, Value>) {
    let non_negative = object.get("minimum").and_then(Value::as_f64).is_some_and(|m| m >= 0.0);
    let (format, maximum) = match object.get("format").and_then(Value::as_str) {
        Some("int32") if non_negative => ("uint32", json!(u32::MAX)),
        Some("int64") if non_negative => ("uint64", json!(u64::MAX)),
        _ => return,
    };
    object.insert("format".into(), json!(format));
    object.entry("maximum").or_insert(maximum);
}

/// An externally tagged enum variant (`{"rate_limit": {...}}`) is an object with one required property; serde
/// refuses a second key, so the schema does too.
fn close_single_key_variants(object: &mut Map<String, Value>) {
    for key in ["oneOf", "anyOf"] {
        let Some(variants) = object.get_mut(key).and_then(Value::as_array_mut) else { continue };
        for variant in variants.iter_mut().filter_map(Value::as_object_mut) {
            let single = variant.get("properties").and_then(Value::as_object).is_some_and(|p| p.len() == 1)
                && variant.get("required").and_then(Value::as_array).is_some_and(|r| r.len() == 1);
            if single {
                variant.entry("additionalProperties").or_insert(json!(false));
            }
        }
    }
}

/// The answers that come from an operation's inputs rather than its logic, stated here once for every operation:
/// a query or path parameter that does not parse is 400; a body can be unparsable (400), larger than the limit
/// (413), of another media type (415), or nested too deeply, with fields that do not fit the schema, or with
/// content the data planes could not use (422, every bad field with its pointer). A write can also meet a secret
/// key rotated under this control plane (503).
fn add_input_answers(method: &str, operation: &mut Map<String, Value>) {
    let has_parameters = operation.get("parameters").and_then(Value::as_array).is_some_and(|p| !p.is_empty());
    let has_body = operation.contains_key("requestBody");
    let Some(responses) = operation.get_mut("responses").and_then(Value::as_object_mut) else { return };
    let problem = |description: &str| {
        json!({
            "description": description,
            "content": { PROBLEM_JSON: { "schema": { "$ref": "#/components/schemas/Problem" } } },
        })
    };
    if has_parameters || has_body {
        responses
            .entry("400")
            .or_insert_with(|| problem("A parameter does not parse, or the body is not JSON or YAML at all"));
    }
    // A write made while the secret key was rotated under this control plane (it must restart).
    if method != "get" {
        responses.entry("503").or_insert_with(|| problem("The secret key was rotated: restart this control plane"));
    }
    if has_body {
        responses.entry("413").or_insert_with(|| problem("The body is larger than the admin API accepts"));
        responses.entry("415").or_insert_with(|| problem("Not JSON or YAML"));
        responses.entry("422").or_insert_with(|| {
            problem(
                "Fields that do not fit the schema or that no data plane could use, or a body over a parsing limit \
                 (nesting): `errors` lists every bad field with its JSON pointer; nothing committed",
            )
        });
    }
}
