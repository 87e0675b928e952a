//! What both planes read from an OpenAPI document's `servers[0]`: the base
//! path the spec's paths sit under (a data plane routes and validates by
//! it; the control plane gives an API created from the spec that prefix)
//! and the origin such an API forwards to. One reading, so a server variable
//! means the same to both.

use serde_json::Value;

/// A `servers[0]` that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServerError {
    #[error("servers[0].url must be a string")]
    Url,
    /// OpenAPI requires a default for every server variable; a `{name}`
    /// left in the URL would otherwise become part of every route.
    #[error("servers[0].url uses the variable `{0}`, which has no default in servers[0].variables")]
    Variable(String),
}

/// `servers[0].url` with each `{variable}` replaced by its default; `None`
/// when the document lists no server.
pub fn server_url(doc: &Value) -> Result<Option<String>, ServerError> {
    let Some(server) = doc.get("servers").and_then(|s| s.get(0)) else { return Ok(None) };
    let mut rest = server.get("url").and_then(Value::as_str).ok_or(ServerError::Url)?;
    let variables = server.get("variables").and_then(Value::as_object);
    let mut url = String::with_capacity(rest.len());
    while let Some(start) = rest.find('{') {
        url.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let (name, tail) = after.split_once('}').unwrap_or((after, ""));
        let default = variables
            .and_then(|v| v.get(name))
            .and_then(|v| v.get("default"))
            .and_then(Value::as_str)
            .ok_or_else(|| ServerError::Variable(name.to_owned()))?;
        url.push_str(default);
        rest = tail;
    }
    url.push_str(rest);
    Ok(Some(url))
}

/// The path part of `servers[0].url`, without a trailing slash; `None` when
/// there is no server or it sits at the root.
pub fn base_path(doc: &Value) -> Result<Option<String>, ServerError> {
    let Some(url) = server_url(doc)? else { return Ok(None) };
    let path = match url.find("://") {
        Some(scheme_end) => {
            let after_authority = &url[scheme_end + 3..];
            after_authority.find('/').map_or("", |slash| &after_authority[slash..])
        }
        // A relative server URL ("/shop/v2", or "v2" relative to the document) is already the path.
        None => url.as_str(),
    };
    let path = path.split(['?', '#']).next().unwrap_or_default().trim_end_matches('/');
    Ok(match path {
        "" => None,
        path if path.starts_with('/') => Some(path.to_owned()),
        path => Some(format!("/{path}")),
    })
}

/// `scheme://host:port` of `servers[0].url` when it is an absolute http(s) URL.
pub fn server_origin(doc: &Value) -> Result<Option<String>, ServerError> {
    let Some(url) = server_url(doc)? else { return Ok(None) };
    let Some((scheme, rest)) = url.split_once("://") else { return Ok(None) };
    let authority = rest.split(['/', '?', '#']).next().filter(|a| !a.is_empty());
    Ok(authority.filter(|_| matches!(scheme, "http" | "https")).map(|authority| format!("{scheme}://{authority}")))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn base_paths_and_origins() {
        let server = |server: Value| json!({ "servers": [server] });
        let cases = [
            (json!({}), Ok(None), Ok(None)),
            (server(json!({"url": "/"})), Ok(None), Ok(None)),
            (server(json!({"url": "/shop/v2/"})), Ok(Some("/shop/v2")), Ok(None)),
            (server(json!({"url": "v2"})), Ok(Some("/v2")), Ok(None)),
            (
                server(json!({"url": "https://api.example.com:8443/shop?x#y"})),
                Ok(Some("/shop")),
                Ok(Some("https://api.example.com:8443")),
            ),
            (
                server(
                    json!({"url": "{scheme}://h/{v}", "variables": {"scheme": {"default": "http"}, "v": {"default": "v1"}}}),
                ),
                Ok(Some("/v1")),
                Ok(Some("http://h")),
            ),
            (
                server(json!({"url": "/api/{version}", "variables": {"version": {"enum": ["v1"]}}})),
                Err(ServerError::Variable("version".into())),
                Err(ServerError::Variable("version".into())),
            ),
            (
                server(json!({"url": "/api/{version}"})),
                Err(ServerError::Variable("version".into())),
                Err(ServerError::Variable("version".into())),
            ),
            (server(json!({"url": 3})), Err(ServerError::Url), Err(ServerError::Url)),
        ];
        for (doc, path, origin) in cases {
            let path: Result<Option<&str>, ServerError> = path;
            assert_eq!(base_path(&doc).as_ref().map(Option::as_deref), path.as_ref().map(|p| *p), "{doc}");
            let origin: Result<Option<&str>, ServerError> = origin;
            assert_eq!(server_origin(&doc).as_ref().map(Option::as_deref), origin.as_ref().map(|p| *p), "{doc}");
        }
    }
}
