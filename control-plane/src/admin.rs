//! The control plane's admin REST API (axum), the operators' way into the `Store`: CRUD on the named
//! collections, snapshot history and rollback, the data planes' state and reports, whole-config export/import,
//! and the OpenAPI document generated from these handlers, and the web dashboard (`/ui`) that uses them. Everything but the health
//! probes, the docs and the dashboard's static files needs the admin token; every error is an RFC 9457 problem.

mod admin_tokens;
mod auth;
mod body;
mod collection;
mod collections;
mod config;
mod crud;
mod data_planes;
mod document;
mod error;
mod metrics;
mod snapshots;
mod telemetry;
mod ui;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi, Ref, ResponseBuilder};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use utoipa_swagger_ui::{Config as SwaggerConfig, SwaggerUi};

use crate::store::{Store, WriteError};
use crate::telemetry::Telemetry;
use crate::tokens::TokenDigest;

pub use body::{MAX_DEPTH, ParseHook};
pub use crud::{DEFAULT_PAGE, MAX_PAGE, Page};
pub use error::{AdminError, FieldError, PROBLEM_BASE, PROBLEM_JSON, Problem};

use body::Schemas;

/// Carried by every successful write: the configuration version it produced (or the current one when the write
/// changed nothing), so a client can wait for data planes to reach it.
pub const VERSION_HEADER: HeaderName = HeaderName::from_static("sluice-config-version");

/// Large enough for a whole-config import with a few big OpenAPI specs; axum's 2 MiB default is not.
pub const BODY_LIMIT: usize = 32 * 1024 * 1024;

/// Paths served without the admin token: probes must work for orchestrators that hold no secrets, and the API's
/// description is public by nature.
const PUBLIC_PATHS: &[&str] = &["/healthz", "/readyz", "/metrics", "/openapi.json", "/docs"];

const PROBLEM: &str = PROBLEM_JSON;
const BEARER_SCHEME: &str = "bearer";

/// What `router` needs from the application.
#[derive(Clone)]
pub struct AdminState {
    pub store: Store,
    pub admin_token: TokenDigest,
    /// A data plane not heard from for this long is shown as `stale`.
    pub stale_after: Duration,
    /// What the data planes' heartbeats report (target health, traffic): `SyncService::telemetry`.
    pub telemetry: Telemetry,
}

/// Shared by every handler: the application's state plus what is derived from the OpenAPI document at start-up.
pub(crate) struct Admin {
    store: Store,
    /// The startup token's digest (the token itself is not retained) and the failed-authentication counts.
    auth: auth::Authenticator,
    stale_after: Duration,
    telemetry: Telemetry,
    schemas: Schemas,
    openapi_json: Bytes,
    parse_hook: Option<body::ParseHook>,
}

type Shared = Arc<Admin>;

/// Request body types validated against their generated JSON Schema before serde sees them.
const BODY_SCHEMAS: &[&str] = &["Api", "Upstream", "Consumer", "Spec", "Certificate", "Config", "TokenRequest"];

/// Builds the admin API. The OpenAPI document is generated from the same routes that are mounted, so it cannot
/// drift from them; the JSON Schemas that check request bodies are taken from that document.
pub fn router(state: AdminState) -> Router {
    router_with_parse_hook(state, None)
}

/// `router` whose request bodies first run `hook` on the blocking pool, before they are parsed: tests hold a parse
/// there to show that the API keeps answering meanwhile.
#[doc(hidden)]
pub fn router_with_parse_hook(state: AdminState, parse_hook: Option<ParseHook>) -> Router {
    let (routes, openapi) = documented_routes().split_for_parts();
    let document = document(openapi);
    let schemas = Schemas::from_document(&document, BODY_SCHEMAS);
    let openapi_json = Bytes::from(serde_json::to_vec(&document).unwrap_or_default());
    let auth = auth::Authenticator::new(state.admin_token);
    let admin = Arc::new(Admin {
        store: state.store,
        auth,
        stale_after: state.stale_after,
        telemetry: state.telemetry,
        schemas,
        openapi_json,
        parse_hook,
    });

    // The UI fetches the document from our own documented route rather than registering a second copy.
    let docs = SwaggerUi::new("/docs").config(SwaggerConfig::new(["/openapi.json"]));
    routes
        .merge(Router::from(docs))
        .merge(ui::routes())
        .fallback(unknown_route)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn_with_state(admin.clone(), auth::authenticate))
        // Outermost, so that errors produced by axum itself (405, extractor rejections, body limit) and by the
        // layers above are problem details too.
        .layer(middleware::map_response(problem_for_bare_errors))
        .with_state(admin)
}

/// Every route that the OpenAPI document describes, i.e. every route but the Swagger UI's.
fn documented_routes() -> OpenApiRouter<Shared> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(openapi_document))
        .merge(metrics::routes())
        .merge(collections::routes())
        .merge(snapshots::routes())
        .merge(data_planes::routes())
        .merge(telemetry::routes())
        .merge(config::routes())
        .merge(admin_tokens::routes())
}

/// Title, bearer security for everything but the public paths, and the 401/500 answers every secured operation
/// can give (added here rather than repeated in each annotation).
fn finish_document(mut openapi: OpenApi) -> OpenApi {
    openapi.info.title = "Sluice admin API".into();
    openapi.info.version = env!("CARGO_PKG_VERSION").into();
    openapi.info.description = Some(
        "Manage the Sluice gateway's configuration. Every write commits a numbered snapshot that is pushed to the \
         data planes. Authenticate with `Authorization: Bearer <admin token>`. Errors are RFC 9457 problem details."
            .into(),
    );
    openapi.info.license = Some(utoipa::openapi::License::new("Apache-2.0"));
    let components = openapi.components.get_or_insert_with(Default::default);
    components.add_security_scheme(BEARER_SCHEME, SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
    openapi.security = Some(vec![SecurityRequirement::new(BEARER_SCHEME, Vec::<String>::new())]);

    let problem = |description: &str| {
        ResponseBuilder::new()
            .description(description)
            .content(PROBLEM, ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem"))).build())
            .build()
    };
    for (path, item) in openapi.paths.paths.iter_mut() {
        let public = PUBLIC_PATHS.contains(&path.as_str());
        let operations = [
            (Method::GET, &mut item.get),
            (Method::PUT, &mut item.put),
            (Method::POST, &mut item.post),
            (Method::DELETE, &mut item.delete),
            (Method::PATCH, &mut item.patch),
        ];
        for (method, operation) in operations.into_iter().filter_map(|(m, op)| op.as_mut().map(|op| (m, op))) {
            let responses = &mut operation.responses.responses;
            if public {
                operation.security = Some(vec![SecurityRequirement::default()]);
            } else {
                responses.entry("401".into()).or_insert_with(|| problem("Missing or wrong bearer token").into());
                if auth::needs_admin(&method, path) {
                    responses
                        .entry("403".into())
                        .or_insert_with(|| problem("The token's role (`read-only`) does not allow this").into());
                }
                responses.entry("429".into()).or_insert_with(|| {
                    problem("Too many failed authentications from this address; `Retry-After` says when to retry")
                        .into()
                });
                responses
                    .entry("503".into())
                    .or_insert_with(|| problem("The database is unreachable; `Retry-After` says when to retry").into());
            }
            responses.entry("500".into()).or_insert_with(|| problem("Internal error; quote `correlation_id`").into());
        }
    }
    openapi
}

/// The served document.
fn document(openapi: OpenApi) -> Value {
    let mut document = serde_json::to_value(finish_document(openapi)).unwrap_or(Value::Null);
    document::refine(&mut document);
    document
}

/// Liveness and readiness answer.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Health {
    #[schema(example = "ok")]
    pub status: String,
    /// The latest committed configuration version (readiness only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
}

#[utoipa::path(
    get, path = "/healthz", tag = "health",
    responses((status = 200, description = "The process is up", body = Health)),
)]
async fn healthz() -> Json<Health> {
    Json(Health { status: "ok".into(), version: None })
}

#[utoipa::path(
    get, path = "/readyz", tag = "health",
    responses(
        (status = 200, description = "The store answers", body = Health),
        (status = 503, description = "The store does not answer", body = Problem, content_type = PROBLEM),
    ),
)]
async fn readyz(State(admin): State<Shared>) -> Result<Json<Health>, AdminError> {
    let version = admin.store.refresh_latest().await.map_err(AdminError::Unavailable)?;
    Ok(Json(Health { status: "ready".into(), version: Some(version) }))
}

#[utoipa::path(
    get, path = "/openapi.json", tag = "health",
    responses((status = 200, description = "This OpenAPI 3.1 document", body = Object)),
)]
async fn openapi_document(State(admin): State<Shared>) -> Response {
    ([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], admin.openapi_json.clone()).into_response()
}

async fn unknown_route(request: Request) -> AdminError {
    AdminError::NotFound { what: format!("route {}", request.uri().path()) }
}

/// The documented public paths, the Swagger UI's files and the dashboard's files (which hold no data: the page
/// calls the API with the operator's token).
fn is_public(path: &str) -> bool {
    PUBLIC_PATHS.contains(&path) || path.starts_with("/docs/") || path == "/ui" || path.starts_with("/ui/")
}

/// Turns an error response that is not yet a problem (axum's 405, extractor rejections, the body limit's 413,
/// the Swagger UI's 404) into one, keeping headers such as `Allow`.
async fn problem_for_bare_errors(response: Response) -> Response {
    let status = response.status();
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(PROBLEM_JSON));
    if !(status.is_client_error() || status.is_server_error()) || is_problem {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let error = match status {
        StatusCode::METHOD_NOT_ALLOWED => AdminError::MethodNotAllowed {
            allowed: parts.headers.get(header::ALLOW).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string(),
        },
        StatusCode::NOT_FOUND => AdminError::NotFound { what: "the requested resource".into() },
        _ => AdminError::Passthrough {
            status,
            detail: if text.is_empty() { status.canonical_reason().unwrap_or("error").to_string() } else { text },
        },
    };
    let mut fresh = error.into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            fresh.headers_mut().insert(name.clone(), value.clone());
        }
    }
    fresh
}

/// Maps a failed `Store::write` whose closure fails with `AdminError`.
pub(crate) fn write_error(error: WriteError<AdminError>) -> AdminError {
    match error {
        WriteError::Rejected(error) => error,
        WriteError::Invalid(violations) => AdminError::invalid_config(violations),
        WriteError::Store(error) => AdminError::Store(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_body_schema_is_generated_and_compiles() {
        let (_, openapi) = documented_routes().split_for_parts();
        let document = document(openapi);
        let schemas = Schemas::from_document(&document, BODY_SCHEMAS);
        for name in BODY_SCHEMAS {
            assert!(schemas.compiled(name), "{name}");
        }
        for (schema, field) in [
            ("BasicAuthCredential", "password"),
            ("ApiKeyCredential", "key"),
            ("JwtCredential", "secret"),
            ("Certificate", "key"),
            ("Certificate", "pkcs12"),
            ("Certificate", "password"),
        ] {
            let property = document.pointer(&format!("/components/schemas/{schema}/properties/{field}"));
            assert_eq!(property.and_then(|p| p.get("writeOnly")), Some(&json!(true)), "{schema}.{field}");
        }
        let consumer =
            json!({ "username": "a", "basic_auth": { "password": "p" }, "api_keys": [{ "key": "k-123456" }] });
        assert!(schemas.check("Consumer", &consumer).is_ok());
        if std::env::var_os("SLUICE_DUMP_OPENAPI").is_some() {
            println!("{}", serde_json::to_string_pretty(&document).unwrap_or_default());
        }
    }
}
