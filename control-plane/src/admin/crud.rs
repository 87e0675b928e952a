//! The generic list/get/create/replace/patch/delete of a named collection, called by the thin per-resource
//! handlers in `collections.rs`. Each write parses and schema-checks the body, prepares secrets and specs outside
//! the store lock (Argon2 is slow), then re-checks names inside `Store::write`, where the configuration is current.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::body::{BodyWrite, decode_body, merge_patch};
use super::collection::Collection;
use super::error::{AdminError, FieldError};
use super::{Admin, Shared, VERSION_HEADER, write_error};
use crate::store::Note;

pub const DEFAULT_PAGE: u32 = 100;
pub const MAX_PAGE: u32 = 1000;

/// Cursor pagination by name: names are unique and stable, so a page boundary never skips or repeats an item
/// when others are added or removed meanwhile.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// Items per page, default 100; values below 1 count as 1, above 1000 as 1000.
    #[param(example = 100)]
    pub limit: Option<u32>,
    /// Return the items whose name sorts after this one: the `next` of the previous page.
    pub after: Option<String>,
}

/// One page of a collection, sorted by name.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Pass as `after` to get the next page; `null` on the last page.
    pub next: Option<String>,
}

pub fn page_limit(limit: Option<u32>) -> usize {
    limit.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE) as usize
}

pub async fn list<R: Collection>(admin: &Admin, query: PageQuery) -> Result<Page<R>, AdminError> {
    let config = admin.store.config().await?;
    let limit = page_limit(query.limit);
    let mut items: Vec<&R> = R::items(&config)
        .iter()
        .filter(|item| query.after.as_deref().is_none_or(|after| item.name() > after))
        .collect();
    items.sort_by(|a, b| a.name().cmp(b.name()));
    let next = if items.len() > limit { items.get(limit - 1).map(|item| item.name().to_string()) } else { None };
    Ok(Page { items: items.into_iter().take(limit).cloned().collect(), next })
}

pub async fn get<R: Collection>(admin: &Admin, name: &str) -> Result<R, AdminError> {
    let config = admin.store.config().await?;
    R::items(&config)
        .iter()
        .find(|item| item.name() == name)
        .cloned()
        .ok_or_else(|| AdminError::not_found(R::KIND, name))
}

/// What the history says a write did: `create api shop`.
fn summary<R: Collection>(verb: &str, name: &str) -> String {
    format!("{verb} {} {name}", R::KIND.collection().trim_end_matches('s'))
}

pub async fn create<R: Collection>(admin: &Shared, write: BodyWrite) -> Result<Response, AdminError> {
    let item: R = decode_body(admin, &write.headers, write.body, R::SCHEMA, |_| Ok(())).await?;
    let name = item.name().to_string();
    // Checked here too so a conflict is reported before the slow prepare; the check in the write is the one that
    // holds under concurrency.
    let config = admin.store.config().await?;
    if R::items(&config).iter().any(|existing| existing.name() == name) {
        return Err(AdminError::AlreadyExists { kind: R::KIND, name });
    }
    let prepared = prepare(admin, item, None).await?;
    let summary = summary::<R>("create", &name);
    let committed = admin
        .store
        .write(Note { author: &write.author, summary: &summary }, |config| {
            let items = R::items_mut(config);
            if items.iter().any(|existing| existing.name() == name) {
                return Err(AdminError::AlreadyExists { kind: R::KIND, name: name.clone() });
            }
            items.push(prepared.clone());
            Ok(prepared)
        })
        .await
        .map_err(write_error)?;
    Ok(written(StatusCode::CREATED, Some(location::<R>(&name)), committed.version, &committed.value))
}

/// `PUT`: replaces the item, or creates it when absent (so a declarative client can always PUT). The name comes
/// from the URL; a body may repeat it but not contradict it, since renaming through PUT would silently orphan the
/// references to the old name.
pub async fn replace<R: Collection>(admin: &Shared, name: &str, write: BodyWrite) -> Result<Response, AdminError> {
    let url_name = name.to_string();
    let item: R =
        decode_body(admin, &write.headers, write.body, R::SCHEMA, move |value| fill_name::<R>(value, &url_name))
            .await?;
    let config = admin.store.config().await?;
    let previous = R::items(&config).iter().find(|existing| existing.name() == name).cloned();
    let summary = summary::<R>(if previous.is_some() { "replace" } else { "create" }, name);
    let prepared = prepare(admin, item, previous).await?;
    let committed = admin
        .store
        .write(Note { author: &write.author, summary: &summary }, |config| {
            let items = R::items_mut(config);
            let created = match items.iter_mut().find(|existing| existing.name() == name) {
                Some(existing) => {
                    *existing = prepared.clone();
                    false
                }
                None => {
                    items.push(prepared.clone());
                    true
                }
            };
            Ok::<_, AdminError>((prepared, created))
        })
        .await
        .map_err(write_error)?;
    let (item, created) = committed.value;
    if created {
        Ok(written(StatusCode::CREATED, Some(location::<R>(name)), committed.version, &item))
    } else {
        Ok(written(StatusCode::OK, None, committed.version, &item))
    }
}

/// `PATCH` with an RFC 7396 merge patch over the stored form, then the same checks as `PUT`. Write-only fields
/// are absent from the stored form, so patching `{"basic_auth": {"password": "new"}}` sets a new password and
/// leaves the other credentials alone.
pub async fn patch<R: Collection>(admin: &Shared, name: &str, write: BodyWrite) -> Result<Response, AdminError> {
    let config = admin.store.config().await?;
    let current = R::items(&config)
        .iter()
        .find(|item| item.name() == name)
        .cloned()
        .ok_or_else(|| AdminError::not_found(R::KIND, name))?;
    let stored = serde_json::to_value(&current).map_err(|e| AdminError::Internal(e.to_string()))?;
    let url_name = name.to_string();
    let item: R = decode_body(admin, &write.headers, write.body, R::SCHEMA, move |value| {
        let patch = std::mem::replace(value, stored);
        merge_patch(value, patch);
        fill_name::<R>(value, &url_name)
    })
    .await?;
    let prepared = prepare(admin, item, Some(current)).await?;
    let summary = summary::<R>("patch", name);
    let committed = admin
        .store
        .write(Note { author: &write.author, summary: &summary }, |config| {
            // Deleted between our read and this write: patching nothing would resurrect it.
            let existing = R::items_mut(config)
                .iter_mut()
                .find(|existing| existing.name() == name)
                .ok_or_else(|| AdminError::not_found(R::KIND, name))?;
            *existing = prepared.clone();
            Ok(prepared)
        })
        .await
        .map_err(write_error)?;
    Ok(written(StatusCode::OK, None, committed.version, &committed.value))
}

pub async fn delete<R: Collection>(admin: &Admin, author: &str, name: &str) -> Result<Response, AdminError> {
    let summary = summary::<R>("delete", name);
    let committed = admin
        .store
        .write(Note { author, summary: &summary }, |config| {
            let referrers = R::referrers(config, name);
            if !referrers.is_empty() {
                return Err(AdminError::Referenced { kind: R::KIND, name: name.to_string(), referrers });
            }
            let items = R::items_mut(config);
            let at = items
                .iter()
                .position(|item| item.name() == name)
                .ok_or_else(|| AdminError::not_found(R::KIND, name))?;
            items.remove(at);
            Ok(())
        })
        .await
        .map_err(write_error)?;
    let mut response = StatusCode::NO_CONTENT.into_response();
    response.headers_mut().insert(VERSION_HEADER, HeaderValue::from(committed.version));
    Ok(response)
}

/// Puts the URL's name into the body when absent; refuses a different one.
fn fill_name<R: Collection>(value: &mut Value, name: &str) -> Result<(), AdminError> {
    let Value::Object(object) = value else { return Ok(()) }; // the schema check reports the wrong type
    match object.get(R::NAME_FIELD) {
        None | Some(Value::Null) => {
            object.insert(R::NAME_FIELD.to_string(), Value::String(name.to_string()));
            Ok(())
        }
        Some(Value::String(given)) if given == name => Ok(()),
        Some(_) => Err(AdminError::InvalidBody(vec![FieldError::new(
            format!("/{}", R::NAME_FIELD),
            format!("must be absent or equal to the name in the URL (`{name}`); renaming is not supported"),
        )])),
    }
}

async fn prepare<R: Collection>(admin: &Admin, item: R, previous: Option<R>) -> Result<R, AdminError> {
    let store = admin.store.clone();
    tokio::task::spawn_blocking(move || item.prepare(previous.as_ref(), &store))
        .await
        .map_err(|e| AdminError::Internal(format!("prepare task failed: {e}")))?
        .map_err(|violations| AdminError::Unprocessable {
            detail: format!("the {} was rejected; nothing was committed", R::KIND.collection().trim_end_matches('s')),
            errors: violations.into_iter().map(FieldError::from).collect(),
        })
}

fn location<R: Collection>(name: &str) -> String {
    format!("/v1/{}/{name}", R::KIND.collection())
}

/// A JSON response for a committed write, carrying the configuration version it produced.
fn written<T: Serialize>(status: StatusCode, location: Option<String>, version: u64, body: &T) -> Response {
    let mut response = (status, axum::Json(body)).into_response();
    let headers = response.headers_mut();
    headers.insert(VERSION_HEADER, HeaderValue::from(version));
    if let Some(location) = location.and_then(|l| HeaderValue::try_from(l).ok()) {
        headers.insert(header::LOCATION, location);
    }
    response
}
