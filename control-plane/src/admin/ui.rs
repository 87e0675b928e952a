//! The web dashboard under `/ui`: plain ES modules and CSS compiled into the binary, so it works offline and needs
//! no Node or build step. The files hold no data and are public like `/docs`; the page signs in with an admin
//! token and every call it makes to the admin API carries that token, so the API's own roles decide what it may
//! do. Strict headers keep the page from running anything but these files or being framed.

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::error::AdminError;

/// Only our own files, no inline script or style, no framing (clickjacking of the rollback button), no `<base>`
/// rewriting; `connect-src 'self'` keeps the token from being sent anywhere but this origin.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
    img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; \
    frame-ancestors 'none'";

struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const INDEX: Asset =
    Asset { name: "index.html", content_type: "text/html; charset=utf-8", body: include_str!("../../ui/index.html") };

/// Every file the page loads; a flat list, so a request path can only ever name one of these.
const ASSETS: &[Asset] = &[
    INDEX,
    Asset { name: "style.css", content_type: "text/css; charset=utf-8", body: include_str!("../../ui/style.css") },
    js("app.js", include_str!("../../ui/app.js")),
    js("api.js", include_str!("../../ui/api.js")),
    js("dom.js", include_str!("../../ui/dom.js")),
    js("pages.js", include_str!("../../ui/pages.js")),
    js("snapshots.js", include_str!("../../ui/snapshots.js")),
    js("edit.js", include_str!("../../ui/edit.js")),
    js("traffic.js", include_str!("../../ui/traffic.js")),
];

const fn js(name: &'static str, body: &'static str) -> Asset {
    Asset { name, content_type: "text/javascript; charset=utf-8", body }
}

/// `/ui` and `/ui/` serve the page; `/ui/<file>` its scripts and style. Not in the OpenAPI document: like the
/// Swagger UI they are not part of the API.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new().route("/ui", get(index)).route("/ui/", get(index)).route("/ui/{file}", get(file))
}

async fn index() -> Response {
    serve(&INDEX)
}

async fn file(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|asset| asset.name == name) {
        Some(asset) => serve(asset),
        None => AdminError::NotFound { what: format!("dashboard file `{name}`") }.into_response(),
    }
}

fn serve(asset: &Asset) -> Response {
    let headers = [
        (header::CONTENT_TYPE, HeaderValue::from_static(asset.content_type)),
        (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY)),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
        // Revalidated on every load, so a page never runs scripts of an older control plane after an upgrade.
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ];
    (StatusCode::OK, headers, asset.body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every module another imports is served, so a renamed file cannot leave the page half-loaded.
    #[test]
    fn every_imported_module_is_served() {
        for asset in ASSETS {
            for line in asset.body.lines().filter(|line| line.starts_with("import ")) {
                let Some(from) = line.split(" from ").nth(1) else { continue };
                let name = from.trim().trim_end_matches(';').trim_matches(|c| c == '\'' || c == '"');
                let name = name.trim_start_matches("./");
                assert!(ASSETS.iter().any(|a| a.name == name), "{} imports {name}, which is not served", asset.name);
            }
        }
    }

    /// The page stays within its policy: no inline script, no inline style attribute, no HTML built from strings.
    #[test]
    fn no_inline_script_style_or_html_strings() {
        assert!(!INDEX.body.contains("<script>") && !INDEX.body.contains("style="), "{}", INDEX.body);
        for asset in ASSETS.iter().filter(|a| a.name.ends_with(".js")) {
            for forbidden in ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"]
            {
                assert!(!asset.body.contains(forbidden), "{} uses {forbidden}", asset.name);
            }
        }
    }
}
