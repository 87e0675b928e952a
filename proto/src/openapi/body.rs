//! Bodies for the `openapi` policy: the media types an operation (or one of
//! its responses) declares, matched against the message's `Content-Type`,
//! and JSON bodies validated against the media type's schema.

use std::borrow::Cow;
use std::sync::Arc;

use http::{HeaderMap, header};
use jsonschema::Validator;
use serde_json::Value;

use super::SpecError;
use super::document::escape;
use super::failure::Errors;
use super::schema::{SchemaCompiler, collect};

/// One message side: `REQUEST` or `RESPONSE` in error locations.
#[derive(Debug, Clone, Copy)]
pub(super) enum Side {
    Request,
    Response,
}

impl Side {
    fn prefix(self) -> &'static str {
        match self {
            Side::Request => "REQUEST",
            Side::Response => "RESPONSE",
        }
    }
}

/// A `content` map: media ranges and, for the ones a JSON body can match,
/// the compiled schema.
#[derive(Default)]
pub(super) struct Content {
    media: Vec<Media>,
}

struct Media {
    /// Lower-case `type/subtype` (parameters dropped), possibly a range (`application/*`).
    range: String,
    validator: Option<Arc<Validator>>,
}

impl Content {
    /// `value` is the `content` object found at `pointer`.
    pub(super) fn compile(
        doc: &Value,
        pointer: &str,
        value: &Value,
        schemas: &mut SchemaCompiler,
    ) -> Result<Content, SpecError> {
        let mut media = Vec::new();
        for (key, entry) in value.as_object().into_iter().flatten() {
            let range = essence(key).into_owned();
            let validator = if entry.get("schema").is_some() && covers_json(&range) {
                Some(schemas.compile(doc, &format!("{pointer}/{}/schema", escape(key)))?)
            } else {
                None
            };
            media.push(Media { range, validator });
        }
        Ok(Content { media })
    }

    pub(super) fn is_empty(&self) -> bool {
        self.media.is_empty()
    }

    pub(super) fn has_json_schema(&self) -> bool {
        self.media.iter().any(|m| m.validator.is_some())
    }

    /// The most specific declared range for `essence`: exact, then `type/*`, then `*/*`.
    fn find(&self, essence: &str) -> Option<&Media> {
        let major = essence.split('/').next().unwrap_or("");
        self.media
            .iter()
            .find(|m| m.range == essence)
            .or_else(|| self.media.iter().find(|m| m.range.strip_suffix("/*") == Some(major)))
            .or_else(|| self.media.iter().find(|m| m.range == "*/*"))
    }

    fn expected(&self) -> String {
        self.media.iter().map(|m| m.range.as_str()).collect::<Vec<_>>().join(", ")
    }

    /// Checks a message's body against this content map; `body` is `None`
    /// when the caller did not buffer it (no JSON schema to check it against).
    /// Returns true when the media type itself is unacceptable (415).
    pub(super) fn check(
        &self,
        side: Side,
        required: bool,
        headers: &HeaderMap,
        body: Option<&[u8]>,
        errors: &mut Errors,
    ) -> bool {
        let prefix = side.prefix();
        let present = match body {
            Some(bytes) => !bytes.is_empty(),
            None => declares_body(headers),
        };
        let Some(content_type) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
            if present {
                errors.add(
                    format!("{prefix}/HEADER/Content-Type"),
                    format!("missing; expected one of {}", self.expected()),
                );
                return true;
            }
            if required {
                errors.add(format!("{prefix}/BODY"), "a body is required");
            }
            return false;
        };
        let content_type = essence(content_type);
        let Some(media) = self.find(&content_type) else {
            errors.add(
                format!("{prefix}/HEADER/Content-Type"),
                format!("`{content_type}` is not allowed; expected one of {}", self.expected()),
            );
            return true;
        };
        if !present {
            if required {
                errors.add(format!("{prefix}/BODY"), "a body is required");
            }
            return false;
        }
        let (Some(validator), Some(bytes), true) = (&media.validator, body, is_json(&content_type)) else {
            return false;
        };
        match serde_json::from_slice::<Value>(bytes) {
            Ok(value) => collect(validator, &value, errors, |pointer| {
                if pointer.is_empty() { format!("{prefix}/BODY#/") } else { format!("{prefix}/BODY#{pointer}") }
            }),
            Err(e) => errors.add(format!("{prefix}/BODY"), format!("the body is not valid JSON: {e}")),
        }
        false
    }
}

/// A request body declared by the operation.
pub(super) struct RequestBody {
    pub(super) required: bool,
    pub(super) content: Content,
}

/// Lower-case `type/subtype` of a media type or `Content-Type` value;
/// borrowed when it is lower-case already, as clients almost always send it
/// (this runs for every validated message).
fn essence(media_type: &str) -> Cow<'_, str> {
    let essence = media_type.split_once(';').map_or(media_type, |(essence, _)| essence).trim();
    if essence.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(essence.to_ascii_lowercase())
    } else {
        Cow::Borrowed(essence)
    }
}

fn is_json(essence: &str) -> bool {
    essence == "application/json" || essence.ends_with("+json")
}

/// Ranges a JSON message can fall under, so their schema is compiled.
fn covers_json(range: &str) -> bool {
    is_json(range) || range == "*/*" || range == "application/*"
}

/// Whether an unbuffered message carries a body, by its framing headers.
fn declares_body(headers: &HeaderMap) -> bool {
    if headers.contains_key(header::TRANSFER_ENCODING) {
        return true;
    }
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .is_some_and(|n| n > 0)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn essence_drops_parameters_and_lower_cases() {
        for (value, expected) in [
            ("application/json", "application/json"),
            ("application/json; charset=utf-8", "application/json"),
            (" Application/JSON ;charset=UTF-8", "application/json"),
            ("text/*", "text/*"),
            ("", ""),
        ] {
            assert_eq!(essence(value), expected, "{value:?}");
        }
    }

    #[test]
    fn media_range_table() {
        let doc = json!({"c": {
            "application/json; charset=utf-8": {"schema": {"type": "object"}},
            "text/*": {},
            "image/png": {},
        }});
        let mut schemas = SchemaCompiler::new(&doc).unwrap();
        let content = Content::compile(&doc, "/c", &doc["c"], &mut schemas).unwrap();
        assert!(content.has_json_schema());
        let cases = [
            ("application/json", Some("application/json")),
            ("text/plain", Some("text/*")),
            ("image/png", Some("image/png")),
            ("image/gif", None),
            ("application/xml", None),
        ];
        for (content_type, expected) in cases {
            assert_eq!(content.find(content_type).map(|m| m.range.as_str()), expected, "{content_type}");
        }
    }
}
