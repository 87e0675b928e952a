//! OpenAPI spec intake: an uploaded document (`/v1/specs`, `sluice apply`) is parsed and checked here before the
//! store keeps it, so a spec that reaches a snapshot is already known to be well-formed and self-contained.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::nesting::{TooDeep, check_flow_depth};

/// How large a spec's text may be unless `--max-spec-bytes` says otherwise.
pub const DEFAULT_MAX_SPEC_BYTES: usize = 5 * 1024 * 1024;

/// Deepest flow nesting a spec's text may have: far beyond real documents (JSON schemas nest a few dozen levels),
/// low enough that libyaml's per-token cost, which grows with the depth, stays small.
pub const MAX_SPEC_DEPTH: usize = 128;

/// A spec that passed every upload check. `json` is the whole document as JSON, the form snapshots carry.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedSpec {
    pub openapi_version: String,
    pub title: String,
    pub api_version: String,
    pub path_count: usize,
    /// Path part of `servers[0].url` (server variables replaced by their defaults), without a trailing slash;
    /// `None` when there is no server or it sits at the root (`sluice_proto::openapi::base_path`, as a data
    /// plane reads it).
    pub base_path: Option<String>,
    /// `scheme://host:port` of `servers[0].url` when it is absolute: where an
    /// API created from the spec alone forwards to.
    pub server_origin: Option<String>,
    pub json: Value,
}

#[derive(Debug, Error, Clone, PartialEq)]
pub enum SpecError {
    #[error("the document is not valid YAML or JSON: {message}")]
    Syntax { message: String, line: Option<usize>, column: Option<usize> },
    #[error("the document must be a mapping (JSON object) at the top level, found {found}")]
    NotAMapping { found: &'static str },
    #[error("Swagger/OpenAPI 2.0 documents are not supported; convert it to OpenAPI 3.0 or 3.1")]
    Swagger2,
    #[error("missing required field `{0}`")]
    MissingField(&'static str),
    #[error("field `{field}` must be {expected}, found {found}")]
    WrongType { field: &'static str, expected: &'static str, found: &'static str },
    #[error("unsupported OpenAPI version {0:?}: only 3.0.x and 3.1.x are accepted")]
    UnsupportedVersion(String),
    /// The OpenAPI parser's own reason; with YAML input it names the field path and line/column.
    #[error("not a valid OpenAPI {version} document: {message}")]
    Invalid { version: String, message: String, line: Option<usize>, column: Option<usize> },
    #[error("{}", RefList(.0))]
    BadRefs(Vec<RefProblem>),
    #[error("the document is {0}")]
    TooDeep(TooDeep),
    #[error("the document is {size} bytes; specs are limited to {limit} bytes (--max-spec-bytes)")]
    TooLarge { size: usize, limit: usize },
    #[error(transparent)]
    Server(#[from] sluice_proto::openapi::ServerError),
}

impl SpecError {
    /// Where in the uploaded text the problem is, when the parser could tell.
    pub fn line_column(&self) -> Option<(usize, usize)> {
        match self {
            SpecError::Syntax { line: Some(l), column: Some(c), .. }
            | SpecError::Invalid { line: Some(l), column: Some(c), .. } => Some((*l, *c)),
            _ => None,
        }
    }
}

/// One `$ref` that cannot be used. `location` is the JSON pointer of the object holding the `$ref`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefProblem {
    pub location: String,
    pub reference: String,
    pub external: bool,
}

impl fmt::Display for RefProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.external {
            write!(
                f,
                "{:?} at {} is an external reference; a spec must be one self-contained document",
                self.reference, self.location
            )
        } else {
            write!(f, "{:?} at {} does not resolve to anything in the document", self.reference, self.location)
        }
    }
}

struct RefList<'a>(&'a [RefProblem]);

impl fmt::Display for RefList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} unusable $ref(s): ", self.0.len())?;
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Flavor {
    V30,
    V31,
}

/// What the control plane keeps of a parsed spec: the fields read from it and the JSON text snapshots carry.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecSummary {
    pub openapi_version: String,
    pub title: String,
    pub base_path: Option<String>,
    pub server_origin: Option<String>,
    pub json: String,
}

impl From<ParsedSpec> for SpecSummary {
    fn from(parsed: ParsedSpec) -> Self {
        Self {
            openapi_version: parsed.openapi_version,
            title: parsed.title,
            base_path: parsed.base_path,
            server_origin: parsed.server_origin,
            json: parsed.json.to_string(),
        }
    }
}

/// Parsed specs by the SHA-256 of their text, shared by the uploads and writes of one process: a spec is parsed
/// when its text is new, not again on every write, and one parsed copy is kept however many versions use it.
/// `sweep` (after each commit) forgets the texts no parse asked for since the previous sweep.
#[derive(Debug, Default)]
pub struct SpecCache {
    entries: Mutex<HashMap<[u8; 32], CacheEntry>>,
}

#[derive(Debug)]
struct CacheEntry {
    spec: Arc<SpecSummary>,
    used: bool,
}

impl SpecCache {
    /// The spec's summary: from the cache when this text was parsed before, else parsed now (outside the lock).
    pub fn parse(&self, content: &str) -> Result<Arc<SpecSummary>, SpecError> {
        let digest: [u8; 32] = Sha256::digest(content.as_bytes()).into();
        if let Some(entry) = self.lock().get_mut(&digest) {
            entry.used = true;
            return Ok(entry.spec.clone());
        }
        let spec = Arc::new(SpecSummary::from(parse_spec(content)?));
        self.lock().insert(digest, CacheEntry { spec: spec.clone(), used: true });
        Ok(spec)
    }

    /// Drops the specs no `parse` asked for since the last sweep.
    pub fn sweep(&self) {
        self.lock().retain(|_, entry| std::mem::replace(&mut entry.used, false));
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], CacheEntry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Refuses a spec text over `limit` bytes before anything parses it.
pub fn check_spec_size(content: &str, limit: usize) -> Result<(), SpecError> {
    if content.len() > limit {
        return Err(SpecError::TooLarge { size: content.len(), limit });
    }
    Ok(())
}

pub fn parse_spec(content: &str) -> Result<ParsedSpec, SpecError> {
    check_flow_depth(content.as_bytes(), MAX_SPEC_DEPTH).map_err(SpecError::TooDeep)?;
    // JSON is valid YAML, so one parser covers both upload formats and gives line/column for either.
    let json: Value = yaml_serde::from_str(content).map_err(|e| {
        let location = e.location();
        SpecError::Syntax {
            message: e.to_string(),
            line: location.as_ref().map(|l| l.line()),
            column: location.as_ref().map(|l| l.column()),
        }
    })?;
    let root = json.as_object().ok_or(SpecError::NotAMapping { found: kind(&json) })?;

    // The cheap field checks come first so the common mistakes get a plain message rather than a serde one.
    let openapi = match root.get("openapi") {
        Some(Value::String(v)) => v.clone(),
        Some(other) => {
            return Err(SpecError::WrongType {
                field: "openapi",
                expected: "a version string such as \"3.0.3\"",
                found: kind(other),
            });
        }
        None if root.contains_key("swagger") => return Err(SpecError::Swagger2),
        None => return Err(SpecError::MissingField("openapi")),
    };
    let flavor = version_flavor(&openapi).ok_or_else(|| SpecError::UnsupportedVersion(openapi.clone()))?;
    let info = match root.get("info") {
        Some(Value::Object(info)) => info,
        Some(other) => return Err(SpecError::WrongType { field: "info", expected: "a mapping", found: kind(other) }),
        None => return Err(SpecError::MissingField("info")),
    };
    let title = required_string(info.get("title"), "info.title")?;
    let api_version = required_string(info.get("version"), "info.version")?;
    // 3.1 allows a document without paths (webhooks only), but a gateway binds specs to routes, so both need them.
    let path_count = match root.get("paths") {
        Some(Value::Object(paths)) => paths.len(),
        Some(other) => return Err(SpecError::WrongType { field: "paths", expected: "a mapping", found: kind(other) }),
        None => return Err(SpecError::MissingField("paths")),
    };

    // Parsing the original text (not `json`) keeps the parser's line/column in its message.
    let typed = match flavor {
        Flavor::V30 => yaml_serde::from_str::<openapiv3::OpenAPI>(content).map(drop),
        // oas3 models 3.1 only: 3.0's boolean `exclusiveMinimum` and friends would be rejected by it.
        Flavor::V31 => oas3::from_yaml(content).map(drop),
    };
    typed.map_err(|e| {
        let location = e.location();
        SpecError::Invalid {
            version: openapi.clone(),
            message: e.to_string(),
            line: location.as_ref().map(|l| l.line()),
            column: location.as_ref().map(|l| l.column()),
        }
    })?;

    let mut problems = Vec::new();
    check_refs(&json, &json, &mut String::new(), &mut problems);
    if !problems.is_empty() {
        return Err(SpecError::BadRefs(problems));
    }

    let base_path = sluice_proto::openapi::base_path(&json)?;
    let server_origin = sluice_proto::openapi::server_origin(&json)?;
    Ok(ParsedSpec { openapi_version: openapi, title, api_version, path_count, base_path, server_origin, json })
}

fn version_flavor(version: &str) -> Option<Flavor> {
    let mut parts = version.split('.');
    let (major, minor, patch) = (parts.next()?, parts.next()?, parts.next()?);
    // A patch like "3-rc1" is not an OpenAPI release; demand digits so typos are caught at upload.
    if parts.next().is_some() || patch.is_empty() || !patch.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match (major, minor) {
        ("3", "0") => Some(Flavor::V30),
        ("3", "1") => Some(Flavor::V31),
        _ => None,
    }
}

fn required_string(value: Option<&Value>, field: &'static str) -> Result<String, SpecError> {
    match value {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(SpecError::WrongType { field, expected: "a string", found: kind(other) }),
        None => Err(SpecError::MissingField(field)),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a sequence",
        Value::Object(_) => "a mapping",
    }
}

/// Keys whose values are instance data, not spec structure: a `$ref` key inside an example is not a reference.
const LITERAL_KEYS: &[&str] = &["example", "default", "enum", "const"];

fn check_refs(root: &Value, node: &Value, pointer: &mut String, problems: &mut Vec<RefProblem>) {
    match node {
        Value::Object(map) => {
            if let Some(Value::String(reference)) = map.get("$ref") {
                if let Some(fragment) = reference.strip_prefix('#') {
                    if resolve_fragment(root, fragment).is_none() {
                        problems.push(RefProblem {
                            location: display_pointer(pointer),
                            reference: reference.clone(),
                            external: false,
                        });
                    }
                } else {
                    problems.push(RefProblem {
                        location: display_pointer(pointer),
                        reference: reference.clone(),
                        external: true,
                    });
                }
            }
            for (key, child) in map {
                if LITERAL_KEYS.contains(&key.as_str()) {
                    continue;
                }
                let len = pointer.len();
                pointer.push('/');
                pointer.push_str(&key.replace('~', "~0").replace('/', "~1"));
                check_refs(root, child, pointer, problems);
                pointer.truncate(len);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                let len = pointer.len();
                pointer.push('/');
                pointer.push_str(&i.to_string());
                check_refs(root, child, pointer, problems);
                pointer.truncate(len);
            }
        }
        _ => {}
    }
}

fn display_pointer(pointer: &str) -> String {
    if pointer.is_empty() { "/".to_owned() } else { pointer.to_owned() }
}

/// A `$ref` fragment is a JSON pointer that is also URI-encoded (`#/paths/~1items~1%7Bid%7D`).
fn resolve_fragment<'a>(root: &'a Value, fragment: &str) -> Option<&'a Value> {
    let decoded = sluice_proto::path::percent_decode_exact(fragment)?;
    if decoded.is_empty() {
        return Some(root);
    }
    // A `$ref` to `#/` with a trailing slash points at the empty key, which serde_json's pointer handles.
    root.pointer(&decoded)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fruitshop() -> String {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/fruitshop/fruitshop-v2-2-0.oas.yml");
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
    }

    #[test]
    fn fruitshop_parses_as_3_0_3() {
        let spec = parse_spec(&fruitshop()).unwrap();
        assert_eq!(spec.openapi_version, "3.0.3");
        assert_eq!(spec.title, "Fruit Shop API");
        assert_eq!(spec.api_version, "2.2.0");
        assert_eq!(spec.base_path.as_deref(), Some("/shop/v2"));
        assert_eq!(spec.server_origin.as_deref(), Some("https://api.predic8.de"));
        assert!(spec.path_count > 5, "path_count {}", spec.path_count);
        assert_eq!(spec.json["info"]["title"], "Fruit Shop API");
    }

    #[test]
    fn fruitshop_as_json_parses_the_same() {
        let yaml = parse_spec(&fruitshop()).unwrap();
        let json = parse_spec(&serde_json::to_string_pretty(&yaml.json).unwrap()).unwrap();
        assert_eq!(yaml, json);
    }

    #[test]
    fn minimal_3_1_json_with_refs_parses() {
        let doc = r##"{
          "openapi": "3.1.0",
          "info": {"title": "T", "version": "1"},
          "servers": [{"url": "{scheme}://example.com/{base}/", "variables": {
              "scheme": {"default": "https"}, "base": {"default": "api/v1"}}}],
          "paths": {"/items/{id}": {"get": {"responses": {"200": {"$ref": "#/components/responses/Ok"}}}}},
          "components": {
            "responses": {"Ok": {"description": "ok", "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/Item"}}}}},
            "schemas": {"Item": {"type": ["object", "null"], "exclusiveMinimum": 3,
                "properties": {"self": {"$ref": "#/paths/~1items~1%7Bid%7D"}},
                "example": {"$ref": "not a reference, just example data"}}}
          }
        }"##;
        let spec = parse_spec(doc).unwrap();
        assert_eq!(spec.openapi_version, "3.1.0");
        assert_eq!(spec.base_path.as_deref(), Some("/api/v1"));
        assert_eq!(spec.path_count, 1);
    }

    #[test]
    fn bad_specs_are_rejected_with_a_reason() {
        const OK_INFO: &str = "info: {title: T, version: '1'}\n";
        type Case = (&'static str, String, fn(&SpecError) -> bool, &'static str);
        let cases: Vec<Case> = vec![
            ("not yaml", "openapi: [3.0.3\n".into(), |e| matches!(e, SpecError::Syntax { line: Some(_), .. }), "line"),
            ("scalar document", "just a string".into(), |e| matches!(e, SpecError::NotAMapping { .. }), "mapping"),
            ("swagger 2.0", format!("swagger: '2.0'\n{OK_INFO}paths: {{}}\n"), |e| *e == SpecError::Swagger2, "2.0"),
            (
                "openapi 4",
                format!("openapi: 4.0.0\n{OK_INFO}paths: {{}}\n"),
                |e| matches!(e, SpecError::UnsupportedVersion(_)),
                "4.0.0",
            ),
            (
                "numeric version",
                format!("openapi: 3.1\n{OK_INFO}paths: {{}}\n"),
                |e| matches!(e, SpecError::WrongType { field: "openapi", .. }),
                "version string",
            ),
            (
                "missing openapi",
                format!("{OK_INFO}paths: {{}}\n"),
                |e| *e == SpecError::MissingField("openapi"),
                "openapi",
            ),
            (
                "missing paths",
                format!("openapi: 3.0.3\n{OK_INFO}"),
                |e| *e == SpecError::MissingField("paths"),
                "paths",
            ),
            (
                "missing title",
                "openapi: 3.0.3\ninfo: {version: '1'}\npaths: {}\n".into(),
                |e| *e == SpecError::MissingField("info.title"),
                "info.title",
            ),
            (
                "paths is a list",
                format!("openapi: 3.1.0\n{OK_INFO}paths: [a, b]\n"),
                |e| matches!(e, SpecError::WrongType { field: "paths", found: "a sequence", .. }),
                "paths",
            ),
            (
                "title is a number",
                "openapi: 3.0.3\ninfo: {title: 7, version: '1'}\npaths: {}\n".into(),
                |e| matches!(e, SpecError::WrongType { field: "info.title", .. }),
                "info.title",
            ),
            (
                "3.0 responses is a list",
                format!("openapi: 3.0.3\n{OK_INFO}paths:\n  /a:\n    get:\n      responses: [1, 2]\n"),
                |e| matches!(e, SpecError::Invalid { line: Some(_), .. }),
                "line",
            ),
            (
                "3.1 parameters is a string",
                format!("openapi: 3.1.0\n{OK_INFO}paths:\n  /a:\n    get:\n      parameters: nope\n"),
                |e| matches!(e, SpecError::Invalid { line: Some(_), .. }),
                "3.1.0",
            ),
            (
                "dangling $ref",
                format!(
                    "openapi: 3.0.3\n{OK_INFO}paths:\n  /a:\n    get:\n      responses:\n        '200':\n          \
                     $ref: '#/components/responses/Missing'\n"
                ),
                |e| matches!(e, SpecError::BadRefs(p) if p.len() == 1 && !p[0].external),
                "/paths/~1a/get/responses/200",
            ),
            (
                "external $ref",
                format!(
                    "openapi: 3.1.0\n{OK_INFO}paths:\n  /a:\n    $ref: 'other.yaml#/paths/~1a'\n  /b:\n    $ref: \
                     '#/nowhere'\n"
                ),
                |e| matches!(e, SpecError::BadRefs(p) if p.len() == 2 && p.iter().any(|p| p.external)),
                "external reference",
            ),
        ];
        for (name, doc, is_expected, needle) in cases {
            let err = parse_spec(&doc).expect_err(name);
            let message = err.to_string();
            eprintln!("{name}: {message}");
            assert!(is_expected(&err), "{name}: unexpected error {err:?}");
            assert!(message.contains(needle), "{name}: {message:?} should mention {needle:?}");
        }
    }
}
