//! `cors`, the first step of the policy chain: a browser's preflight is
//! answered here, before authentication (a preflight never carries
//! credentials) and without reaching the upstream; for other cross-origin
//! requests it decides the `Access-Control-*` headers added to the response.

use std::collections::HashSet;

use http::{HeaderMap, HeaderValue, Method, Response, StatusCode, header};
use sluice_proto::v1;

use super::rejection::Rejection;
use crate::base::{ProxyBody, full_body};

/// Used when the policy lists no methods: the methods browsers send cross-origin in practice.
const DEFAULT_METHODS: &str = "GET, HEAD, POST, PUT, PATCH, DELETE";

#[derive(Debug)]
pub struct Cors {
    any_origin: bool,
    origins: HashSet<String>,
    /// `https://*.example.com` entries, stored as (scheme + "://", ".example.com").
    wildcard_origins: Vec<(String, String)>,
    methods: Vec<Method>,
    methods_value: HeaderValue,
    /// Lower-case; `None` reflects whatever headers the preflight asks for.
    headers: Option<HashSet<String>>,
    expose_headers: Option<HeaderValue>,
    credentials: bool,
    max_age: Option<HeaderValue>,
}

/// What the chain does with a request after the CORS step.
#[derive(Debug)]
pub enum CorsStep {
    /// Not a preflight: continue, and add these headers to whatever response results.
    Continue(HeaderMap),
    /// A preflight, answered by the gateway.
    Answer(Response<ProxyBody>),
    /// A preflight for an origin, method or header this API does not allow.
    Reject(Rejection),
}

impl Cors {
    pub fn compile(spec: &v1::Cors) -> Result<Self, String> {
        if spec.allow_origins.is_empty() {
            return Err("allow_origins must list at least one origin (or \"*\")".into());
        }
        let mut cors = Cors {
            any_origin: false,
            origins: HashSet::new(),
            wildcard_origins: Vec::new(),
            methods: Vec::new(),
            methods_value: HeaderValue::from_static(DEFAULT_METHODS),
            headers: None,
            expose_headers: None,
            credentials: spec.allow_credentials,
            max_age: (spec.max_age_seconds > 0).then(|| HeaderValue::from(spec.max_age_seconds)),
        };
        for origin in &spec.allow_origins {
            let origin = origin.trim().trim_end_matches('/').to_ascii_lowercase();
            if origin == "*" {
                cors.any_origin = true;
            } else if let Some((scheme, rest)) = origin.split_once("://*.") {
                cors.wildcard_origins.push((format!("{scheme}://"), format!(".{rest}")));
            } else {
                cors.origins.insert(origin);
            }
        }
        if cors.any_origin && cors.credentials {
            // Validation refuses this pairing; should a snapshot carry it anyway,
            // any origin is answered with `*` and never with credentials, so no
            // site can read a user's authenticated responses.
            tracing::warn!("cors: allow_credentials is ignored while allow_origins contains \"*\"");
            cors.credentials = false;
        }
        let methods: Vec<&str> = if spec.allow_methods.is_empty() {
            DEFAULT_METHODS.split(", ").collect()
        } else {
            spec.allow_methods.iter().map(String::as_str).collect()
        };
        for method in &methods {
            cors.methods.push(
                Method::from_bytes(method.trim().to_ascii_uppercase().as_bytes())
                    .map_err(|_| format!("`{method}` is not an HTTP method"))?,
            );
        }
        let joined = cors.methods.iter().map(Method::as_str).collect::<Vec<_>>().join(", ");
        cors.methods_value = header_value(&joined)?;
        if !spec.allow_headers.is_empty() {
            cors.headers = Some(spec.allow_headers.iter().map(|h| h.trim().to_ascii_lowercase()).collect());
        }
        if !spec.expose_headers.is_empty() {
            cors.expose_headers = Some(header_value(&spec.expose_headers.join(", "))?);
        }
        Ok(cors)
    }

    pub fn begin(&self, method: &Method, headers: &HeaderMap) -> CorsStep {
        let Some(origin) = headers.get(header::ORIGIN) else {
            // Same-origin or non-browser: nothing to add but Vary, so a cache does
            // not hand this response to a cross-origin caller.
            let mut out = HeaderMap::new();
            self.vary(&mut out);
            return CorsStep::Continue(out);
        };
        let requested_method = headers.get(header::ACCESS_CONTROL_REQUEST_METHOD);
        let allowed = origin.to_str().is_ok_and(|o| self.allows_origin(o));
        let Some(requested_method) = requested_method.filter(|_| method == Method::OPTIONS) else {
            // An actual request: the upstream answers, and the browser reads the
            // response only if we add the headers. A disallowed origin gets none.
            let mut out = HeaderMap::new();
            if allowed {
                self.allow_origin(origin, &mut out);
                if let Some(expose) = &self.expose_headers {
                    out.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, expose.clone());
                }
            }
            self.vary(&mut out);
            return CorsStep::Continue(out);
        };
        if !allowed {
            return CorsStep::Reject(forbidden("The origin is not allowed to call this API."));
        }
        let method_ok = Method::from_bytes(requested_method.as_bytes()).is_ok_and(|m| self.methods.contains(&m));
        if !method_ok {
            return CorsStep::Reject(forbidden("The requested method is not allowed cross-origin on this API."));
        }
        let requested_headers = headers.get(header::ACCESS_CONTROL_REQUEST_HEADERS);
        if let (Some(allowed_headers), Some(requested)) = (&self.headers, requested_headers) {
            let all_allowed = requested.to_str().is_ok_and(|list| {
                list.split(',')
                    .map(|h| h.trim().to_ascii_lowercase())
                    .filter(|h| !h.is_empty())
                    .all(|h| allowed_headers.contains(&h))
            });
            if !all_allowed {
                return CorsStep::Reject(forbidden("A requested header is not allowed cross-origin on this API."));
            }
        }

        let mut response = Response::new(full_body(bytes::Bytes::new()));
        *response.status_mut() = StatusCode::NO_CONTENT;
        let out = response.headers_mut();
        self.allow_origin(origin, out);
        out.insert(header::ACCESS_CONTROL_ALLOW_METHODS, self.methods_value.clone());
        match (&self.headers, requested_headers) {
            // Reflecting is safe only because the list was not restricted.
            (None, Some(requested)) => {
                out.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, requested.clone());
            }
            (Some(list), _) if !list.is_empty() => {
                let mut names: Vec<&str> = list.iter().map(String::as_str).collect();
                names.sort_unstable();
                if let Ok(value) = HeaderValue::from_str(&names.join(", ")) {
                    out.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, value);
                }
            }
            _ => {}
        }
        if let Some(max_age) = &self.max_age {
            out.insert(header::ACCESS_CONTROL_MAX_AGE, max_age.clone());
        }
        self.vary(out);
        CorsStep::Answer(response)
    }

    fn allows_origin(&self, origin: &str) -> bool {
        let origin = origin.to_ascii_lowercase();
        self.any_origin
            || self.origins.contains(&origin)
            || self.wildcard_origins.iter().any(|(scheme, suffix)| {
                origin.strip_prefix(scheme.as_str()).is_some_and(|host| host.ends_with(suffix.as_str()))
            })
    }

    fn allow_origin(&self, origin: &HeaderValue, out: &mut HeaderMap) {
        // `*` cannot be combined with credentials (the Fetch standard), so a
        // credentialed API echoes the origin it has checked.
        let value = if self.any_origin && !self.credentials { HeaderValue::from_static("*") } else { origin.clone() };
        out.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
        if self.credentials {
            out.insert(header::ACCESS_CONTROL_ALLOW_CREDENTIALS, HeaderValue::from_static("true"));
        }
    }

    /// The answer depends on the Origin unless it is always `*`; caches must know.
    fn vary(&self, out: &mut HeaderMap) {
        if !self.any_origin || self.credentials {
            out.append(header::VARY, HeaderValue::from_static("Origin"));
        }
    }
}

/// Puts the CORS decision on a response. The gateway's `Access-Control-*`
/// values replace the upstream's (two Allow-Origin values make browsers
/// refuse the response); `Vary: Origin` is added unless already there.
pub fn add_headers(response: &mut HeaderMap, cors: HeaderMap) {
    for (name, value) in &cors {
        if name == header::VARY {
            let present = response
                .get_all(header::VARY)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .any(|v| v.trim().eq_ignore_ascii_case("origin") || v.trim() == "*");
            if !present {
                response.append(header::VARY, value.clone());
            }
        } else {
            response.insert(name, value.clone());
        }
    }
}

fn header_value(text: &str) -> Result<HeaderValue, String> {
    HeaderValue::from_str(text).map_err(|_| format!("`{text}` is not a valid header value"))
}

fn forbidden(detail: &str) -> Rejection {
    Rejection::new("cors", StatusCode::FORBIDDEN, "cors-forbidden", "CORS request not allowed").detail(detail)
}

#[cfg(test)]
#[allow(clippy::type_complexity)]
mod tests {
    use super::*;

    fn cors(origins: &[&str], methods: &[&str], headers: &[&str], credentials: bool) -> Cors {
        Cors::compile(&v1::Cors {
            allow_origins: origins.iter().map(ToString::to_string).collect(),
            allow_methods: methods.iter().map(ToString::to_string).collect(),
            allow_headers: headers.iter().map(ToString::to_string).collect(),
            expose_headers: vec!["X-Request-Id".into()],
            allow_credentials: credentials,
            max_age_seconds: 600,
        })
        .unwrap()
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(*k, HeaderValue::from_static(v));
        }
        map
    }

    #[test]
    fn preflight_table() {
        let shop = cors(&["https://shop.example", "https://*.cdn.example"], &["GET", "POST"], &["content-type"], false);
        let open = cors(&["*"], &[], &[], false);
        let credentialed = cors(&["*"], &[], &[], true);
        let listed_credentialed = cors(&["https://shop.example"], &[], &[], true);
        // (policy, request headers, want: Some(allow-origin) for 204, None for 403)
        let cases: Vec<(&str, &Cors, Vec<(&'static str, &'static str)>, Option<&str>)> = vec![
            (
                "listed origin",
                &shop,
                vec![("origin", "https://shop.example"), ("access-control-request-method", "POST")],
                Some("https://shop.example"),
            ),
            (
                "wildcard subdomain",
                &shop,
                vec![("origin", "https://a.cdn.example"), ("access-control-request-method", "GET")],
                Some("https://a.cdn.example"),
            ),
            (
                "unknown origin",
                &shop,
                vec![("origin", "https://evil.example"), ("access-control-request-method", "GET")],
                None,
            ),
            (
                "method not allowed",
                &shop,
                vec![("origin", "https://shop.example"), ("access-control-request-method", "DELETE")],
                None,
            ),
            (
                "header not allowed",
                &shop,
                vec![
                    ("origin", "https://shop.example"),
                    ("access-control-request-method", "GET"),
                    ("access-control-request-headers", "content-type, x-secret"),
                ],
                None,
            ),
            (
                "any origin",
                &open,
                vec![("origin", "https://x.example"), ("access-control-request-method", "PATCH")],
                Some("*"),
            ),
            (
                // Validation refuses the pairing; should it arrive anyway, no origin is reflected with credentials.
                "any origin never with credentials",
                &credentialed,
                vec![("origin", "https://evil.example"), ("access-control-request-method", "GET")],
                Some("*"),
            ),
            (
                "credentials echo a listed origin",
                &listed_credentialed,
                vec![("origin", "https://shop.example"), ("access-control-request-method", "GET")],
                Some("https://shop.example"),
            ),
        ];
        for (name, policy, request, want) in cases {
            match (policy.begin(&Method::OPTIONS, &headers(&request)), want) {
                (CorsStep::Answer(response), Some(origin)) => {
                    assert_eq!(response.status(), StatusCode::NO_CONTENT, "{name}");
                    assert_eq!(response.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN], origin, "{name}");
                    assert_eq!(response.headers()[header::ACCESS_CONTROL_MAX_AGE], "600", "{name}");
                    assert!(response.headers().contains_key(header::ACCESS_CONTROL_ALLOW_METHODS), "{name}");
                    let credentials = response.headers().get(header::ACCESS_CONTROL_ALLOW_CREDENTIALS);
                    assert_eq!(credentials.is_some(), name.starts_with("credentials echo"), "{name}");
                }
                (CorsStep::Reject(rejection), None) => assert_eq!(rejection.status, StatusCode::FORBIDDEN, "{name}"),
                (step, _) => panic!("{name}: unexpected {step:?}"),
            }
        }
    }

    #[test]
    fn reflects_requested_headers_only_when_unrestricted() {
        let open = cors(&["*"], &[], &[], false);
        let request = headers(&[
            ("origin", "https://x.example"),
            ("access-control-request-method", "GET"),
            ("access-control-request-headers", "authorization, x-api-key"),
        ]);
        let CorsStep::Answer(response) = open.begin(&Method::OPTIONS, &request) else { panic!("not answered") };
        assert_eq!(response.headers()[header::ACCESS_CONTROL_ALLOW_HEADERS], "authorization, x-api-key");
    }

    #[test]
    fn actual_requests_continue_with_headers() {
        let shop = cors(&["https://shop.example"], &[], &[], true);
        let cases: Vec<(Method, Vec<(&'static str, &'static str)>, Option<&str>)> = vec![
            (Method::GET, vec![("origin", "https://shop.example")], Some("https://shop.example")),
            (Method::GET, vec![("origin", "https://evil.example")], None),
            (Method::GET, vec![], None),
            // OPTIONS without Access-Control-Request-Method is not a preflight.
            (Method::OPTIONS, vec![("origin", "https://shop.example")], Some("https://shop.example")),
        ];
        for (method, request, want) in cases {
            let CorsStep::Continue(out) = shop.begin(&method, &headers(&request)) else {
                panic!("{method} {request:?} did not continue")
            };
            assert_eq!(out.get(header::ACCESS_CONTROL_ALLOW_ORIGIN).map(|v| v.to_str().unwrap()), want, "{request:?}");
            if want.is_some() {
                assert_eq!(out[header::ACCESS_CONTROL_ALLOW_CREDENTIALS], "true");
                assert_eq!(out[header::ACCESS_CONTROL_EXPOSE_HEADERS], "X-Request-Id");
            }
        }
    }
}
