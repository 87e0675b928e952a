//! Named admin tokens under `/v1/tokens` (`admin` role only, see `auth.rs`):
//! create (the token is in the answer, once), list, revoke. The same
//! operations as `sluice-cp tokens`, for operators who hold an admin token
//! but not the database.

use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::body::{BodyWrite, decode_body};
use super::crud::Page;
use super::error::{AdminError, FieldError, Problem};
use super::{PROBLEM, Shared};
use crate::tokens::{AdminToken, Principal, Role, check_token_name};

pub fn routes() -> OpenApiRouter<Shared> {
    OpenApiRouter::new()
        .routes(routes!(list_tokens, create_token))
        .routes(routes!(revoke_token))
        .routes(routes!(whoami))
}

/// The token a request was made with, as the server sees it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Whoami {
    /// The token's name (`admin-token` for the startup token); the history shows it as the author of its writes.
    #[schema(example = "ci")]
    pub name: String,
    pub role: Role,
}

/// Any valid token may ask; the dashboard uses it to sign in and to offer write controls only to `admin` tokens
/// (the API refuses other tokens' writes regardless).
#[utoipa::path(
    get, path = "/v1/whoami", tag = "tokens",
    responses((status = 200, description = "The name and role of the token used (never the token itself)", body = Whoami)),
)]
async fn whoami(Extension(principal): Extension<Principal>) -> Json<Whoami> {
    Json(Whoami { name: principal.name, role: principal.role })
}

/// A token to create.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    /// Shown in the history as the author of every write made with the token.
    #[schema(example = "ci", pattern = "^[A-Za-z0-9._@-]{1,128}$")]
    pub name: String,
    pub role: Role,
}

/// A created token: `token` is shown this once; only its digest is kept.
#[derive(Debug, Serialize, ToSchema)]
pub struct CreatedToken {
    #[serde(flatten)]
    pub listed: AdminToken,
    pub token: String,
}

#[utoipa::path(
    get, path = "/v1/tokens", tag = "tokens",
    responses((status = 200, description = "Every named token, by name (never the tokens themselves); `next` is always null", body = Page<AdminToken>)),
)]
async fn list_tokens(State(admin): State<Shared>) -> Result<Json<Page<AdminToken>>, AdminError> {
    Ok(Json(Page { items: admin.store.list_admin_tokens().await?, next: None }))
}

#[utoipa::path(
    post, path = "/v1/tokens", tag = "tokens",
    request_body(content = TokenRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "Created; the token is in the answer, and only there", body = CreatedToken,
            headers(("Location" = String))),
        (status = 409, description = "The name is taken", body = Problem, content_type = PROBLEM),
    ),
)]
async fn create_token(State(admin): State<Shared>, write: BodyWrite) -> Result<Response, AdminError> {
    let request: TokenRequest = decode_body(&admin, &write.headers, write.body, "TokenRequest", |_| Ok(())).await?;
    if let Err(message) = check_token_name(&request.name) {
        return Err(AdminError::InvalidBody(vec![FieldError::new("/name", message)]));
    }
    let (token, listed) = admin
        .store
        .create_admin_token(&request.name, request.role, &write.author)
        .await?
        .ok_or_else(|| AdminError::TokenExists { name: request.name.clone() })?;
    tracing::info!(name = %listed.name, role = listed.role.as_str(), created_by = %write.author, "admin token created");
    let mut response = (StatusCode::CREATED, Json(CreatedToken { listed, token })).into_response();
    if let Ok(location) = HeaderValue::try_from(format!("/v1/tokens/{}", request.name)) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

#[utoipa::path(
    delete, path = "/v1/tokens/{name}", tag = "tokens",
    params(("name" = String, Path, description = "The token's name")),
    responses(
        (status = 204, description = "Revoked: the token is refused from now on, by every control plane"),
        (status = 404, description = "No such token", body = Problem, content_type = PROBLEM),
    ),
)]
async fn revoke_token(
    State(admin): State<Shared>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<StatusCode, AdminError> {
    if !admin.store.revoke_admin_token(&name).await? {
        return Err(AdminError::NotFound { what: format!("token `{name}`") });
    }
    tracing::info!(name, revoked_by = %principal.name, "admin token revoked");
    Ok(StatusCode::NO_CONTENT)
}
