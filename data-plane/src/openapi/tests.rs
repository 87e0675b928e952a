//! Table tests for the `openapi` policy against real documents: the Fruitshop
//! 3.0 spec from Membrane's benchmark (read from examples/fruitshop at test
//! time), and small 3.0/3.1 documents for nullable, `$ref` chains, recursion.

use std::sync::Arc;

use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sluice_proto::v1;

use super::{SpecValidator, ValidationFailure, respond};

fn fruitshop_json() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/fruitshop/fruitshop-v2-2-0.oas.yml");
    let yaml = std::fs::read_to_string(path).expect("the Fruitshop fixture is readable");
    let doc: Value = yaml_serde::from_str(&yaml).expect("the Fruitshop fixture is YAML");
    doc.to_string()
}

fn compile(json: String, prefix: &str, responses: bool) -> Result<Arc<SpecValidator>, String> {
    let spec = v1::Spec { name: "fruitshop".into(), json };
    let binding =
        v1::OpenApiBinding { spec: "fruitshop".into(), validate_requests: true, validate_responses: responses };
    let api = v1::Api { name: "shop".into(), path_prefix: prefix.into(), ..Default::default() };
    SpecValidator::compile(&spec, &binding, &api, None).map_err(|e| e.to_string())
}

fn fruitshop() -> Arc<SpecValidator> {
    compile(fruitshop_json(), "/shop/v2", true).unwrap()
}

/// Sends a request the way the pipeline does: the body is handed over only
/// when `needs_body` asks for it; otherwise only its framing headers show.
fn send(
    v: &SpecValidator,
    method: &str,
    uri: &str,
    content_type: Option<&str>,
    body: &str,
) -> Result<(), ValidationFailure> {
    let method = Method::from_bytes(method.as_bytes()).unwrap();
    let (path, query) = match uri.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (uri, None),
    };
    let mut headers = HeaderMap::new();
    if let Some(ct) = content_type {
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
    }
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    let matched = v.match_request(&method, path)?;
    let buffered = matched.needs_body().then_some(body.as_bytes());
    matched.check(&method, query, &headers, buffered)
}

const JSON: Option<&str> = Some("application/json");

/// (case, method, uri, content type, body, expected status and error location; None = passes)
type RequestCase<'a> = (&'a str, &'a str, &'a str, Option<&'a str>, &'a str, Option<(u16, &'a str)>);
/// (case, method, path, status, headers, body, expected error location)
type ResponseCase<'a> = (&'a str, Method, &'a str, u16, HeaderMap, &'a str, Option<&'a str>);
/// (case, uri, X-Trace header, body, expected error location)
type PetCase<'a> = (&'a str, &'a str, Option<&'a str>, &'a str, Option<&'a str>);

#[test]
fn fruitshop_requests() {
    let v = fruitshop();
    let long_name = format!(r#"{{"name":"{}","price":1}}"#, "x".repeat(31));
    let cases: Vec<RequestCase> = vec![
        ("benchmark request", "POST", "/shop/v2/products", JSON, r#"{"name":"Mangos","price":2.79}"#, None),
        (
            "charset parameter",
            "POST",
            "/shop/v2/products",
            Some("application/json; charset=utf-8"),
            r#"{"name":"A","price":0}"#,
            None,
        ),
        ("missing name", "POST", "/shop/v2/products", JSON, r#"{"price":2.79}"#, Some((400, "REQUEST/BODY#/name"))),
        (
            "price as a string",
            "POST",
            "/shop/v2/products",
            JSON,
            r#"{"name":"Mangos","price":"2.79"}"#,
            Some((400, "REQUEST/BODY#/price")),
        ),
        (
            "price over 1000",
            "POST",
            "/shop/v2/products",
            JSON,
            r#"{"name":"Mangos","price":1000.01}"#,
            Some((400, "REQUEST/BODY#/price")),
        ),
        (
            "negative price",
            "POST",
            "/shop/v2/products",
            JSON,
            r#"{"name":"Mangos","price":-1}"#,
            Some((400, "REQUEST/BODY#/price")),
        ),
        ("name over 30 characters", "POST", "/shop/v2/products", JSON, &long_name, Some((400, "REQUEST/BODY#/name"))),
        ("body not an object", "POST", "/shop/v2/products", JSON, "[1]", Some((400, "REQUEST/BODY#/"))),
        ("invalid JSON", "POST", "/shop/v2/products", JSON, r#"{"name":"#, Some((400, "REQUEST/BODY"))),
        (
            "wrong content type",
            "POST",
            "/shop/v2/products",
            Some("text/plain"),
            r#"{"name":"Mangos","price":2.79}"#,
            Some((415, "REQUEST/HEADER/Content-Type")),
        ),
        (
            "missing content type",
            "POST",
            "/shop/v2/products",
            None,
            r#"{"name":"Mangos","price":2.79}"#,
            Some((415, "REQUEST/HEADER/Content-Type")),
        ),
        ("unknown path", "GET", "/shop/v2/bananas", None, "", Some((404, "REQUEST/PATH"))),
        ("outside the base path", "GET", "/shop/v3/products", None, "", Some((404, "REQUEST/PATH"))),
        ("prefix without boundary", "GET", "/shop/v2products", None, "", Some((404, "REQUEST/PATH"))),
        ("wrong method", "DELETE", "/shop/v2/products", None, "", Some((405, "REQUEST/METHOD"))),
        ("bad path parameter type", "GET", "/shop/v2/products/abc", None, "", Some((400, "REQUEST/PATH_PARAMETER/id"))),
        (
            "path parameter below minimum",
            "GET",
            "/shop/v2/products/0",
            None,
            "",
            Some((400, "REQUEST/PATH_PARAMETER/id")),
        ),
        ("good path parameter", "GET", "/shop/v2/products/7", None, "", None),
        ("nested template", "GET", "/shop/v2/products/7/image", None, "", None),
        ("HEAD falls back to GET", "HEAD", "/shop/v2/products/7", None, "", None),
        ("trailing slash", "GET", "/shop/v2/products/", None, "", None),
        ("base path alone", "GET", "/shop/v2", None, "", None),
        (
            "good query",
            "GET",
            "/shop/v2/products?start=2&limit=10&sort=name&order=desc&name=Apple+%26+Pear",
            None,
            "",
            None,
        ),
        (
            "query below minimum",
            "GET",
            "/shop/v2/products?start=0",
            None,
            "",
            Some((400, "REQUEST/QUERY_PARAMETER/start")),
        ),
        (
            "query not an integer",
            "GET",
            "/shop/v2/products?limit=ten",
            None,
            "",
            Some((400, "REQUEST/QUERY_PARAMETER/limit")),
        ),
        (
            "query outside enum",
            "GET",
            "/shop/v2/products?sort=color",
            None,
            "",
            Some((400, "REQUEST/QUERY_PARAMETER/sort")),
        ),
        (
            "query date-time format",
            "GET",
            "/shop/v2/products?modified_since=yesterday",
            None,
            "",
            Some((400, "REQUEST/QUERY_PARAMETER/modified_since")),
        ),
        (
            "query date-time encoded",
            "GET",
            "/shop/v2/products?modified_since=2024-05-16T16:17:00%2b02:00",
            None,
            "",
            None,
        ),
        ("patch with partial body", "PATCH", "/shop/v2/products/7", JSON, r#"{"price":3}"#, None),
        (
            "put with bad id and body",
            "PUT",
            "/shop/v2/products/x",
            JSON,
            r#"{"name":"A"}"#,
            Some((400, "REQUEST/BODY#/price")),
        ),
        (
            "multipart upload unbuffered",
            "PUT",
            "/shop/v2/products/7/image",
            Some("multipart/form-data; boundary=x"),
            "--x--",
            None,
        ),
        ("optional body absent", "POST", "/shop/v2/products", None, "", None),
    ];
    for (name, method, uri, content_type, body, expected) in cases {
        let result = send(&v, method, uri, content_type, body);
        match (result, expected) {
            (Ok(()), None) => {}
            (Err(failure), Some((status, location))) => {
                assert_eq!(failure.status().as_u16(), status, "{name}: {failure}");
                assert!(failure.locations().contains(&location), "{name}: {location} not in {:?}", failure.locations());
            }
            (result, expected) => panic!("{name}: got {result:?}, expected {expected:?}"),
        }
    }
}

#[tokio::test]
async fn every_violation_is_listed_in_the_problem_body() {
    let v = fruitshop();
    let body = format!(r#"{{"name":"{}","price":5000,"vendors":"none"}}"#, "x".repeat(40));
    let failure = send(&v, "PUT", "/shop/v2/products/abc", JSON, &body).unwrap_err();
    let response = respond(&failure, "r");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(response.headers()[header::CONTENT_TYPE], "application/problem+json");
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    // Members in DESIGN.md's order, whatever map type serde_json is built with.
    let text = std::str::from_utf8(&bytes).unwrap();
    assert!(
        text.starts_with(r#"{"type":"https://sluice.dev/problems/validation","title":"Request validation failed","status":400,"validation":{"method":"PUT","uriTemplate":"/products/{id}","errors":{"#),
        "{text}"
    );
    let problem: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(problem["type"], "https://sluice.dev/problems/validation");
    assert_eq!(problem["title"], "Request validation failed");
    assert_eq!(problem["status"], 400);
    assert_eq!(problem["validation"]["method"], "PUT");
    assert_eq!(problem["validation"]["uriTemplate"], "/products/{id}");
    assert_eq!(problem["request_id"], "r");
    let errors = problem["validation"]["errors"].as_object().unwrap();
    let mut locations: Vec<&str> = errors.keys().map(String::as_str).collect();
    locations.sort_unstable();
    assert_eq!(
        locations,
        ["REQUEST/BODY#/name", "REQUEST/BODY#/price", "REQUEST/BODY#/vendors", "REQUEST/PATH_PARAMETER/id"]
    );
    for messages in errors.values() {
        assert!(messages[0]["message"].as_str().is_some_and(|m| !m.is_empty()), "{messages}");
    }
}

#[tokio::test]
async fn method_not_allowed_names_the_allowed_methods() {
    let v = fruitshop();
    let response = respond(&send(&v, "DELETE", "/shop/v2/products", None, "").unwrap_err(), "r");
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(response.headers()[header::ALLOW], "GET, POST");
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let problem: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(problem["validation"]["uriTemplate"], "/products");
}

#[test]
fn needs_body_only_for_json_body_schemas() {
    let v = fruitshop();
    let cases = [
        (Method::POST, "/shop/v2/products", true),
        (Method::PUT, "/shop/v2/products/7", true),
        (Method::GET, "/shop/v2/products", false),
        (Method::PUT, "/shop/v2/products/7/image", false),
        (Method::POST, "/shop/v2/nowhere", false),
    ];
    for (method, path, expected) in cases {
        assert_eq!(v.match_request(&method, path).is_ok_and(|m| m.needs_body()), expected, "{method} {path}");
    }
}

#[test]
fn fruitshop_responses() {
    let v = fruitshop();
    let json_headers = || {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h
    };
    let cases: Vec<ResponseCase> = vec![
        (
            "good product",
            Method::GET,
            "/shop/v2/products/7",
            200,
            json_headers(),
            r#"{"id":7,"name":"Mango","price":2.5}"#,
            None,
        ),
        (
            "price as a string",
            Method::GET,
            "/shop/v2/products/7",
            200,
            json_headers(),
            r#"{"name":"Mango","price":"2.5"}"#,
            Some("RESPONSE/BODY#/price"),
        ),
        (
            "4XX range",
            Method::GET,
            "/shop/v2/products/7",
            404,
            json_headers(),
            r#"{"title":"Not Found","status":404}"#,
            None,
        ),
        (
            "4XX range violated",
            Method::GET,
            "/shop/v2/products/7",
            404,
            json_headers(),
            r#"{"status":"x"}"#,
            Some("RESPONSE/BODY#/status"),
        ),
        ("undeclared status", Method::GET, "/shop/v2/products/7", 302, HeaderMap::new(), "", Some("RESPONSE/STATUS")),
        (
            "wrong content type",
            Method::GET,
            "/shop/v2/products/7",
            200,
            HeaderMap::new(),
            "<p/>",
            Some("RESPONSE/HEADER/Content-Type"),
        ),
    ];
    for (name, method, path, status, headers, body, expected) in cases {
        let status = StatusCode::from_u16(status).unwrap();
        match (v.validate_response(&method, path, status, &headers, body.as_bytes()), expected) {
            (Ok(()), None) => {}
            (Err(failure), Some(location)) => {
                assert_eq!(failure.status(), StatusCode::BAD_GATEWAY, "{name}");
                assert!(failure.is_response());
                assert!(failure.locations().contains(&location), "{name}: {:?}", failure.locations());
            }
            (result, expected) => panic!("{name}: got {result:?}, expected {expected:?}"),
        }
    }
    // Off by default in the binding: nothing is checked.
    let quiet = compile(fruitshop_json(), "/shop/v2", false).unwrap();
    assert!(!quiet.validates_responses());
    assert!(
        quiet
            .validate_response(&Method::GET, "/shop/v2/products/7", StatusCode::IM_A_TEAPOT, &HeaderMap::new(), b"")
            .is_ok()
    );
}

#[test]
fn unchanged_inputs_reuse_the_compiled_validator() {
    let json = fruitshop_json();
    let spec = v1::Spec { name: "fruitshop".into(), json: json.clone() };
    let binding = v1::OpenApiBinding { spec: "fruitshop".into(), validate_requests: true, validate_responses: false };
    let api = v1::Api { path_prefix: "/shop/v2".into(), ..Default::default() };
    let first = SpecValidator::compile(&spec, &binding, &api, None).unwrap();
    let same = SpecValidator::compile(&spec, &binding, &api, Some(&first)).unwrap();
    assert!(Arc::ptr_eq(&first, &same));
    let other_binding = v1::OpenApiBinding { validate_responses: true, ..binding.clone() };
    let changed = SpecValidator::compile(&spec, &other_binding, &api, Some(&first)).unwrap();
    assert!(!Arc::ptr_eq(&first, &changed));
    let other_api = v1::Api { path_prefix: "/fruit".into(), ..Default::default() };
    let moved = SpecValidator::compile(&spec, &binding, &other_api, Some(&first)).unwrap();
    assert!(!Arc::ptr_eq(&first, &moved));
    // The API prefix is accepted next to the spec's base path.
    assert!(send(&moved, "GET", "/fruit/products/7", None, "").is_ok());
}

/// A 3.1 document: nullable through type arrays, a `$ref` chain, recursion,
/// `oneOf`, numeric `exclusiveMinimum`, server variables.
const PETS_31: &str = r##"{
  "openapi": "3.1.0",
  "info": {"title": "pets", "version": "1"},
  "servers": [{"url": "https://{host}/api/{version}", "variables": {"host": {"default": "x"}, "version": {"default": "v1"}}}],
  "paths": {"/pets/{petId}": {
    "parameters": [{"name": "petId", "in": "path", "required": true, "schema": {"type": "string", "format": "uuid"}}],
    "put": {
      "parameters": [{"name": "X-Trace", "in": "header", "required": true, "schema": {"type": "integer"}},
                     {"name": "tags", "in": "query", "schema": {"type": "array", "items": {"type": "integer"}}}],
      "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/PetAlias"}}}},
      "responses": {"200": {"description": "ok"}}
    }
  }},
  "components": {"schemas": {
    "PetAlias": {"$ref": "#/components/schemas/Pet"},
    "Pet": {"type": "object", "required": ["name", "tag"], "properties": {
      "name": {"type": "string"},
      "tag": {"type": ["string", "null"]},
      "age": {"type": "integer", "exclusiveMinimum": 0},
      "owner": {"oneOf": [{"type": "null"}, {"$ref": "#/components/schemas/Owner"}]},
      "children": {"type": "array", "items": {"$ref": "#/components/schemas/Pet"}}
    }},
    "Owner": {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}}
  }}
}"##;

#[test]
fn openapi_31_document() {
    let v = compile(PETS_31.into(), "/", false).unwrap();
    let uri = "/api/v1/pets/3fa85f64-5717-4562-b3fc-2c963f66afa6";
    let send31 = |uri: &str, trace: Option<&str>, body: &str| {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(t) = trace {
            headers.insert("x-trace", HeaderValue::from_str(t).unwrap());
        }
        let (path, query) = uri.split_once('?').map_or((uri, None), |(p, q)| (p, Some(q)));
        v.match_request(&Method::PUT, path).and_then(|m| m.check(&Method::PUT, query, &headers, Some(body.as_bytes())))
    };
    let with_tags = format!("{uri}?tags=1&tags=2");
    let bad_tags = format!("{uri}?tags=1&tags=x");
    let cases: Vec<PetCase> = vec![
        ("null through a type array", uri, Some("1"), r#"{"name":"a","tag":null}"#, None),
        ("wrong type for the array", uri, Some("1"), r#"{"name":"a","tag":1}"#, Some("REQUEST/BODY#/tag")),
        ("exclusive minimum", uri, Some("1"), r#"{"name":"a","tag":"t","age":0}"#, Some("REQUEST/BODY#/age")),
        ("oneOf null", uri, Some("1"), r#"{"name":"a","tag":"t","owner":null}"#, None),
        ("oneOf object", uri, Some("1"), r#"{"name":"a","tag":"t","owner":{"id":"x"}}"#, Some("REQUEST/BODY#/owner")),
        (
            "recursion",
            uri,
            Some("1"),
            r#"{"name":"a","tag":null,"children":[{"name":"b","tag":null,"children":[{"name":"c"}]}]}"#,
            Some("REQUEST/BODY#/children/0/children/0/tag"),
        ),
        ("required header missing", uri, None, r#"{"name":"a","tag":null}"#, Some("REQUEST/HEADER/X-Trace")),
        ("header coerced to integer", uri, Some("x"), r#"{"name":"a","tag":null}"#, Some("REQUEST/HEADER/X-Trace")),
        (
            "path-level uuid parameter",
            "/api/v1/pets/42",
            Some("1"),
            r#"{"name":"a","tag":null}"#,
            Some("REQUEST/PATH_PARAMETER/petId"),
        ),
        ("exploded array query", &with_tags, Some("1"), r#"{"name":"a","tag":null}"#, None),
        ("array item type", &bad_tags, Some("1"), r#"{"name":"a","tag":null}"#, Some("REQUEST/QUERY_PARAMETER/tags")),
        ("required body empty", uri, Some("1"), "", Some("REQUEST/BODY")),
    ];
    for (name, uri, trace, body, expected) in cases {
        match (send31(uri, trace, body), expected) {
            (Ok(()), None) => {}
            (Err(failure), Some(location)) => {
                assert_eq!(failure.status(), StatusCode::BAD_REQUEST, "{name}");
                assert!(failure.locations().contains(&location), "{name}: {:?}", failure.locations());
            }
            (result, expected) => panic!("{name}: got {result:?}, expected {expected:?}"),
        }
    }
}

#[test]
fn openapi_30_nullable_and_exclusive_bounds() {
    let doc = json!({
        "openapi": "3.0.3",
        "info": {"title": "n", "version": "1"},
        "paths": {"/things": {"post": {
            "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Thing"}}}},
            "responses": {"201": {"description": "ok"}}
        }}},
        "components": {"schemas": {
            "Thing": {"type": "object", "properties": {
                "note": {"type": "string", "nullable": true},
                "name": {"type": "string"},
                "color": {"type": "string", "enum": ["red"], "nullable": true},
                "parent": {"allOf": [{"$ref": "#/components/schemas/Ref"}], "nullable": true},
                "weight": {"type": "number", "minimum": 0, "exclusiveMinimum": true}
            }},
            "Ref": {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}}
        }}
    });
    let v = compile(doc.to_string(), "/", false).unwrap();
    let cases = [
        (r#"{"note":null}"#, None),
        (r#"{"name":null}"#, Some("REQUEST/BODY#/name")),
        (r#"{"color":null}"#, None),
        (r#"{"color":"blue"}"#, Some("REQUEST/BODY#/color")),
        (r#"{"parent":null}"#, None),
        (r#"{"parent":{"id":1}}"#, None),
        (r#"{"parent":{"id":"x"}}"#, Some("REQUEST/BODY#/parent")),
        (r#"{"weight":0}"#, Some("REQUEST/BODY#/weight")),
        (r#"{"weight":0.1}"#, None),
    ];
    for (body, expected) in cases {
        match (send(&v, "POST", "/things", JSON, body), expected) {
            (Ok(()), None) => {}
            (Err(failure), Some(location)) => {
                assert!(failure.locations().contains(&location), "{body}: {:?}", failure.locations());
            }
            (result, expected) => panic!("{body}: got {result:?}, expected {expected:?}"),
        }
    }
}

#[test]
fn broken_specs_are_refused_at_compile_time() {
    let paths = |p: Value| json!({"openapi": "3.0.0", "info": {"title": "t", "version": "1"}, "paths": p}).to_string();
    let cases = [
        ("not json".to_owned(), "not valid JSON"),
        (json!({"swagger": "2.0"}).to_string(), "version"),
        (paths(json!({"/a": {"get": {"parameters": [{"$ref": "other.yaml#/p"}]}}})), "other.yaml"),
        (paths(json!({"/a": {"get": {"parameters": [{"$ref": "#/nowhere"}]}}})), "#/nowhere"),
        (
            paths(
                json!({"/a": {"post": {"requestBody": {"content": {"application/json": {"schema": {"$ref": "#/missing"}}}}}}}),
            ),
            "invalid schema",
        ),
        (paths(json!({"/a/{x": {"get": {}}})), "/a/{x"),
        (paths(json!({"/a/{x}": {"get": {}}, "/a/{y}": {"get": {}}})), "cannot be routed"),
    ];
    for (json, needle) in cases {
        let error = compile(json.clone(), "/", false).unwrap_err();
        assert!(error.contains("fruitshop") && error.contains(needle), "{json}: {error}");
    }
}
