//! The whole configuration at once, under `/v1/config`: export (JSON or YAML, secrets only in stored form) and
//! import, which replaces everything in one write and so one snapshot. An export re-imported as is changes
//! nothing, because `prepare_config` keeps stored hashes and sealed values that still match.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::body::{BodyWrite, decode_body, wants_yaml};
use super::error::{AdminError, FieldError};
use super::{Shared, VERSION_HEADER, write_error};
use crate::model::Config;
use crate::prepare::{ConfigDiff, diff_config, prepare_config};
use crate::snapshot::build_snapshot;
use crate::store::Note;

pub fn routes() -> OpenApiRouter<Shared> {
    OpenApiRouter::new().routes(routes!(export_config, import_config))
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExportFormat {
    Json,
    Yaml,
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ExportQuery {
    /// Overrides `Accept`: `yaml` or `json`.
    #[param(inline)]
    pub format: Option<ExportFormat>,
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ImportQuery {
    /// Validate everything (including building the snapshot) and return the diff, without committing.
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ImportResult {
    pub dry_run: bool,
    /// Whether the import changes (or, on a dry run, would change) the configuration.
    pub changed: bool,
    /// The version now current; on a dry run, the version the diff was computed against.
    pub version: u64,
    pub diff: ConfigDiff,
}

#[utoipa::path(
    get, path = "/v1/config", tag = "config", params(ExportQuery),
    responses(
        (status = 200, description = "The whole configuration. Credentials appear only as hashes or sealed \
            values, which an import accepts back unchanged.",
            content((Config = "application/json"), (Config = "application/yaml"))),
    ),
)]
async fn export_config(
    State(admin): State<Shared>,
    Query(query): Query<ExportQuery>,
    headers: HeaderMap,
) -> Result<Response, AdminError> {
    let version = admin.store.current_version();
    let config = admin.store.config().await?;
    let format = query.format.map(|f| match f {
        ExportFormat::Json => "json",
        ExportFormat::Yaml => "yaml",
    });
    let mut response = if wants_yaml(&headers, format) {
        // Through JSON, so enums come out as the config file writes them (`- basic_auth: {}`), not as YAML tags.
        let text = serde_json::to_value(&config)
            .map_err(|e| e.to_string())
            .and_then(|value| yaml_serde::to_string(&value).map_err(|e| e.to_string()))
            .map_err(|e| AdminError::Internal(format!("YAML export: {e}")))?;
        ([(header::CONTENT_TYPE, HeaderValue::from_static("application/yaml"))], text).into_response()
    } else {
        Json(config).into_response()
    };
    response.headers_mut().insert(VERSION_HEADER, HeaderValue::from(version));
    Ok(response)
}

#[utoipa::path(
    put, path = "/v1/config", tag = "config", params(ImportQuery),
    request_body(
        description = "The whole configuration, as `sluice apply -f` sends it. Credentials may be plain \
            (`password`, `key`, `secret`) or the exported hash/sealed forms.",
        content((Config = "application/json"), (Config = "application/yaml")),
    ),
    responses(
        (status = 200, description = "Committed as one snapshot (or validated only, with `dry_run`)",
            body = ImportResult, headers(("Sluice-Config-Version" = u64))),
    ),
)]
async fn import_config(
    State(admin): State<Shared>,
    Query(query): Query<ImportQuery>,
    write: BodyWrite,
) -> Result<Response, AdminError> {
    let config: Config = decode_body(&admin, &write.headers, write.body, "Config", |_| Ok(())).await?;
    let version = admin.store.current_version();
    let previous = admin.store.config().await?;
    let store = admin.store.clone();
    let (prepared, previous) = tokio::task::spawn_blocking(move || {
        let prepared = prepare_config(
            config,
            &previous,
            store.secrets(),
            store.api_key_hmac_key(),
            store.specs(),
            store.max_spec_bytes(),
        );
        (prepared, previous)
    })
    .await
    .map_err(|e| AdminError::Internal(format!("prepare task failed: {e}")))?;
    let prepared = prepared.map_err(|violations| AdminError::Unprocessable {
        detail: "the configuration was rejected; nothing was committed".into(),
        errors: violations.into_iter().map(FieldError::from).collect(),
    })?;

    if query.dry_run {
        // The same snapshot build the write would run, so a dry run that passes means the import will too
        // (unless someone writes in between).
        build_snapshot(&prepared, admin.store.secrets(), admin.store.api_key_hmac_key(), admin.store.specs())
            .map_err(AdminError::invalid_config)?;
        let diff = diff_config(&previous, &prepared);
        let result = ImportResult { dry_run: true, changed: !diff.is_empty(), version, diff };
        return Ok(with_version(Json(result).into_response(), version));
    }

    let summary = format!("import: {}", diff_config(&previous, &prepared).summary());
    let committed = admin
        .store
        .write(Note { author: &write.author, summary: &summary }, move |current| {
            let diff = diff_config(current, &prepared);
            *current = prepared;
            Ok::<_, AdminError>(diff)
        })
        .await
        .map_err(write_error)?;
    let result =
        ImportResult { dry_run: false, changed: committed.changed, version: committed.version, diff: committed.value };
    Ok(with_version(Json(result).into_response(), committed.version))
}

fn with_version(mut response: Response, version: u64) -> Response {
    response.headers_mut().insert(VERSION_HEADER, HeaderValue::from(version));
    response
}
