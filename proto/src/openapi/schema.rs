//! JSON Schema validators for the `openapi` policy: compiled once per snapshot
//! against the whole (2020-12-normalised) document registered as one resource,
//! so `$ref`s inside it, recursion included, resolve like any JSON Schema
//! reference; at request time only `iter_errors` runs.

use std::collections::HashMap;
use std::sync::Arc;

use jsonschema::{Draft, Registry, Validator};
use serde_json::Value;

use super::SpecError;
use super::failure::Errors;

/// The document's identity inside the registry; never fetched.
const DOC_URI: &str = "urn:sluice:openapi";

/// Longest message kept per violation: a `oneOf` failure prints the whole
/// instance, and a problem response should stay small.
const MAX_MESSAGE: usize = 300;

pub(super) struct SchemaCompiler {
    registry: Registry<'static>,
    /// By the pointer the schema ends at after `$ref`-only hops: the Fruitshop
    /// has a dozen `id` parameters that all are `#/components/schemas/Id`.
    cache: HashMap<String, Arc<Validator>>,
}

impl SchemaCompiler {
    /// `doc` must already be in 2020-12 terms (see `document::rewrite_30`).
    pub(super) fn new(doc: &Value) -> Result<Self, SpecError> {
        let resource = Draft::Draft202012.create_resource(doc.clone());
        // Nothing outside the document is ever fetched, here or in `compile`:
        // a data plane reads neither the network nor its disk for a snapshot.
        let registry = Registry::new()
            .add(DOC_URI, resource)
            .and_then(|builder| builder.prepare())
            .map_err(|e| SpecError::Schema { pointer: "#".into(), reason: e.to_string() })?;
        Ok(SchemaCompiler { registry, cache: HashMap::new() })
    }

    /// The validator for the schema at `pointer` in `doc`.
    pub(super) fn compile(&mut self, doc: &Value, pointer: &str) -> Result<Arc<Validator>, SpecError> {
        let key = canonical_pointer(doc, pointer);
        if let Some(validator) = self.cache.get(&key) {
            return Ok(validator.clone());
        }
        let root = serde_json::json!({ "$ref": format!("{DOC_URI}#{}", encode_fragment(&key)) });
        let validator = jsonschema::options()
            .with_draft(Draft::Draft202012)
            .with_registry(&self.registry)
            .offline()
            .should_validate_formats(true)
            .build(&root)
            .map_err(|e| SpecError::Schema { pointer: format!("#{pointer}"), reason: e.to_string() })?;
        let validator = Arc::new(validator);
        self.cache.insert(key, validator.clone());
        Ok(validator)
    }
}

/// Follows schemas that are nothing but a `$ref` to the pointer they end at.
fn canonical_pointer(doc: &Value, pointer: &str) -> String {
    let mut current = pointer.to_owned();
    for _ in 0..32 {
        let Some(Value::Object(schema)) = doc.pointer(&current) else { break };
        let target = match (schema.len(), schema.get("$ref").and_then(Value::as_str)) {
            (1, Some(r)) => r.strip_prefix('#').map(|t| crate::path::percent_decode(t, false).into_owned()),
            _ => None,
        };
        match target {
            Some(t) if doc.pointer(&t).is_some() => current = t,
            _ => break,
        }
    }
    current
}

/// Percent-encodes a JSON pointer for use as a URI fragment (`{id}` in a path
/// template is not a legal fragment character); the resolver decodes it.
fn encode_fragment(pointer: &str) -> String {
    let mut out = String::with_capacity(pointer.len());
    for byte in pointer.bytes() {
        let keep = byte.is_ascii_alphanumeric() || b"/~-._!$&'()*+,;=:@".contains(&byte);
        if keep {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Runs `validator` on `instance` and files every violation under a location:
/// `at(None)` for the whole value, `at(Some(pointer))` for a place inside it.
pub(super) fn collect(validator: &Validator, instance: &Value, errors: &mut Errors, at: impl Fn(&str) -> String) {
    // Most messages are valid: `is_valid` stops at the first violation and
    // builds no error values, so only invalid ones pay for the full report.
    if validator.is_valid(instance) {
        return;
    }
    for error in validator.iter_errors(instance) {
        let mut pointer = error.instance_path().as_str().to_owned();
        // A missing property is reported where it should have been, which is
        // what a client fixing its request (or a form marking a field) needs.
        if let jsonschema::error::ValidationErrorKind::Required { property } = error.kind()
            && let Some(name) = property.as_str()
        {
            pointer.push('/');
            pointer.push_str(&super::document::escape(name));
        }
        errors.add(at(&pointer), crate::text::truncate(error.to_string(), MAX_MESSAGE));
    }
}

/// The JSON types a schema admits, looked up through `$ref`s, for turning a
/// parameter's text into the value its schema expects ("12" → 12).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Types {
    pub integer: bool,
    pub number: bool,
    pub boolean: bool,
    pub array: bool,
    pub object: bool,
}

impl Types {
    pub(super) fn of(doc: &Value, schema: &Value) -> Types {
        let mut types = Types::default();
        types.add(doc, schema, 0);
        types
    }

    fn add(&mut self, doc: &Value, schema: &Value, depth: usize) {
        if depth > 16 {
            return;
        }
        if let Some(target) = schema.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix('#'))
            && let Some(resolved) = doc.pointer(&crate::path::percent_decode(target, false))
        {
            self.add(doc, resolved, depth + 1);
        }
        match schema.get("type") {
            Some(Value::String(ty)) => self.set(ty),
            Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).for_each(|ty| self.set(ty)),
            _ => {}
        }
        for key in ["allOf", "anyOf", "oneOf"] {
            if let Some(Value::Array(branches)) = schema.get(key) {
                for branch in branches {
                    self.add(doc, branch, depth + 1);
                }
            }
        }
    }

    fn set(&mut self, ty: &str) {
        match ty {
            "integer" => self.integer = true,
            "number" => self.number = true,
            "boolean" => self.boolean = true,
            "array" => self.array = true,
            "object" => self.object = true,
            _ => {}
        }
    }

    /// The value a text parameter stands for: the first reading the schema
    /// admits, else the text itself (so "abc" for an integer fails validation
    /// with a message naming "abc").
    pub(super) fn coerce(&self, text: &str) -> Value {
        if (self.integer || self.number)
            && let Ok(n) = text.parse::<i64>()
        {
            return Value::from(n);
        }
        if self.number
            && let Ok(x) = text.parse::<f64>()
            && let Some(n) = serde_json::Number::from_f64(x)
        {
            return Value::Number(n);
        }
        if self.boolean && (text == "true" || text == "false") {
            return Value::Bool(text == "true");
        }
        Value::String(text.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn coerce_table() {
        let doc = json!({"c": {"s": {"Id": {"type": "integer"}}}});
        let id = Types::of(&doc, &json!({"$ref": "#/c/s/Id"}));
        let cases = [
            (id, "12", json!(12)),
            (id, "abc", json!("abc")),
            (id, "1.5", json!("1.5")),
            (Types::of(&doc, &json!({"type": "number"})), "1.5", json!(1.5)),
            (Types::of(&doc, &json!({"type": ["boolean", "null"]})), "true", json!(true)),
            (Types::of(&doc, &json!({"type": "string"})), "12", json!("12")),
            (Types::of(&doc, &json!({"anyOf": [{"type": "integer"}, {"type": "string"}]})), "7", json!(7)),
        ];
        for (types, text, expected) in cases {
            assert_eq!(types.coerce(text), expected, "{text}");
        }
    }

    #[test]
    fn compiles_refs_inside_the_document_and_caches_by_target() {
        let doc = json!({
            "components": {"schemas": {
                "Node": {"type": "object", "properties": {"next": {"$ref": "#/components/schemas/Node"}, "v": {"type": "integer"}}},
            }},
            "paths": {"/n/{id}": {"a": {"$ref": "#/components/schemas/Node"}, "b": {"$ref": "#/components/schemas/Node"}}},
        });
        let mut compiler = SchemaCompiler::new(&doc).unwrap();
        let a = compiler.compile(&doc, "/paths/~1n~1{id}/a").unwrap();
        let b = compiler.compile(&doc, "/paths/~1n~1{id}/b").unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(a.is_valid(&json!({"next": {"next": {"v": 1}}})));
        let mut errors = Errors::default();
        collect(&a, &json!({"next": {"next": {"v": "x"}}}), &mut errors, |p| format!("B#{p}"));
        assert_eq!(errors.locations(), vec!["B#/next/next/v"]);
    }

    #[test]
    fn never_fetches_a_reference_from_outside_the_document() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let outside = format!("http://{}/schema.json", listener.local_addr().unwrap());
        // Also through a base URI: `#/x` under that `$id` is outside too.
        let doc = json!({
            "a": {"$ref": outside},
            "b": {"$id": outside, "properties": {"v": {"$ref": "#/x"}}},
        });
        let mut compiler = SchemaCompiler::new(&doc).unwrap();
        for pointer in ["/a", "/b"] {
            let error = compiler.compile(&doc, pointer).err().unwrap();
            assert!(matches!(&error, SpecError::Schema { pointer: p, .. } if p == &format!("#{pointer}")), "{error}");
        }
        let accepted = listener.accept();
        assert!(accepted.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock), "{accepted:?}");
    }
}
