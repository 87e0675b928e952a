//! Snapshot history under the admin API: list, show (summary plus the configuration committed at that version)
//! and rollback, which commits the old configuration as a new version so history only ever moves forward.

use axum::Json;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::crud::page_limit;
use super::error::{AdminError, Problem};
use super::{PROBLEM, Shared, VERSION_HEADER, write_error};
use crate::model::Config;
use crate::store::{Note, SnapshotLookup, SnapshotSummary};
use crate::tokens::Principal;

pub fn routes() -> OpenApiRouter<Shared> {
    OpenApiRouter::new()
        .routes(routes!(list_snapshots))
        .routes(routes!(get_snapshot))
        .routes(routes!(rollback_snapshot))
}

/// Newest first; page with `before`, the `next` of the previous page.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SnapshotQuery {
    /// Only versions below this one.
    pub before: Option<u64>,
    /// Items per page, default 100; values below 1 count as 1, above 1000 as 1000.
    pub limit: Option<u32>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SnapshotPage {
    pub items: Vec<SnapshotSummary>,
    /// Pass as `before` for the next (older) page; `null` on the last page.
    pub next: Option<u64>,
}

/// One version: its summary and the configuration it holds (secrets only in stored form).
#[derive(Debug, Serialize, ToSchema)]
pub struct SnapshotDetail {
    #[serde(flatten)]
    pub summary: SnapshotSummary,
    pub config: Config,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RollbackResult {
    /// The version now current: new when `changed`, else the one that already equalled the target.
    pub version: u64,
    /// The version whose configuration was restored.
    pub rolled_back_to: u64,
    /// False when the current configuration already equals the target; then no version was added.
    pub changed: bool,
}

#[utoipa::path(
    get, path = "/v1/snapshots", tag = "snapshots", params(SnapshotQuery),
    responses((status = 200, description = "Snapshot history, newest first", body = SnapshotPage)),
)]
async fn list_snapshots(
    State(admin): State<Shared>,
    Query(query): Query<SnapshotQuery>,
) -> Result<Json<SnapshotPage>, AdminError> {
    let limit = page_limit(query.limit);
    // One more than asked tells whether there is a next page.
    let fetch = u32::try_from(limit + 1).unwrap_or(u32::MAX);
    let mut items = admin.store.list_snapshots(query.before, fetch).await?;
    let next = if items.len() > limit { items.get(limit - 1).map(|s| s.version) } else { None };
    items.truncate(limit);
    Ok(Json(SnapshotPage { items, next }))
}

#[utoipa::path(
    get, path = "/v1/snapshots/{version}", tag = "snapshots",
    params(("version" = u64, Path, description = "Snapshot version")),
    responses(
        (status = 200, description = "The snapshot's summary and configuration", body = SnapshotDetail),
        (status = 400, description = "The version is not a number", body = Problem, content_type = PROBLEM),
        (status = 404, description = "No such version, or deleted by retention (`--keep-snapshots`; the detail says \
            which)", body = Problem, content_type = PROBLEM),
    ),
)]
async fn get_snapshot(
    State(admin): State<Shared>,
    Path(version): Path<u64>,
) -> Result<Json<SnapshotDetail>, AdminError> {
    let summary =
        admin.store.list_snapshots(version.checked_add(1), 1).await?.into_iter().find(|s| s.version == version);
    let config = admin.store.snapshot_config(version).await?;
    match summary.zip(config) {
        Some((summary, config)) => Ok(Json(SnapshotDetail { summary, config })),
        None => Err(not_in_history(&admin, version).await),
    }
}

/// 404 for a version the history does not hold, saying whether retention deleted it.
async fn not_in_history(admin: &Shared, version: u64) -> AdminError {
    match admin.store.lookup_snapshot(version).await {
        Ok(SnapshotLookup::Pruned { oldest_kept }) => AdminError::Gone {
            detail: format!(
                "snapshot version {version} was deleted by retention: the control plane keeps the newest {} \
                 versions (--keep-snapshots); the oldest kept is {oldest_kept}",
                admin.store.keep_snapshots()
            ),
        },
        Ok(_) => AdminError::NotFound { what: format!("snapshot version {version}") },
        Err(e) => AdminError::Store(e),
    }
}

#[utoipa::path(
    post, path = "/v1/snapshots/{version}/rollback", tag = "snapshots",
    params(("version" = u64, Path, description = "The version to restore")),
    responses(
        (status = 201, description = "A new version equal to the old one was committed; `Location` names it",
            body = RollbackResult, headers(("Location" = String), ("Sluice-Config-Version" = u64))),
        (status = 200, description = "The configuration already equals that version; nothing committed",
            body = RollbackResult),
        (status = 404, description = "No such version, or deleted by retention (`--keep-snapshots`; the detail says \
            which)", body = Problem, content_type = PROBLEM),
        (status = 422, description = "That version no longer builds a valid snapshot (e.g. its sealed secrets \
            cannot be opened with the current key); nothing committed", body = Problem, content_type = PROBLEM),
    ),
)]
async fn rollback_snapshot(
    State(admin): State<Shared>,
    Extension(principal): Extension<Principal>,
    Path(version): Path<u64>,
) -> Result<Response, AdminError> {
    let Some(old) = admin.store.snapshot_config(version).await? else {
        return Err(not_in_history(&admin, version).await);
    };
    // The stored configuration is already in stored form (hashes, sealed values): no prepare step, and the
    // snapshot built from it is validated again by the write like any other change.
    let committed = admin
        .store
        .write(Note { author: &principal.name, summary: &format!("rollback to version {version}") }, move |config| {
            *config = old;
            Ok::<_, AdminError>(())
        })
        .await
        .map_err(write_error)?;
    let result = RollbackResult { version: committed.version, rolled_back_to: version, changed: committed.changed };
    let status = if committed.changed { StatusCode::CREATED } else { StatusCode::OK };
    let mut response = (status, Json(result)).into_response();
    let headers = response.headers_mut();
    headers.insert(VERSION_HEADER, HeaderValue::from(committed.version));
    if committed.changed
        && let Ok(location) = HeaderValue::try_from(format!("/v1/snapshots/{}", committed.version))
    {
        headers.insert(header::LOCATION, location);
    }
    Ok(response)
}
