//! The data planes as the sync server last recorded them, under `/v1/data-planes`, with the `stale` flag computed
//! here from `last_seen` so that it is always current, whatever the sync server's purge schedule.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::Shared;
use super::crud::Page;
use super::error::AdminError;
use crate::store::{DataPlaneRecord, now_ms};

pub fn routes() -> OpenApiRouter<Shared> {
    OpenApiRouter::new().routes(routes!(list_data_planes))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DataPlaneView {
    #[serde(flatten)]
    pub record: DataPlaneRecord,
    /// Not heard from (hello, ACK, NACK or heartbeat) within the control plane's stale interval.
    pub stale: bool,
}

#[utoipa::path(
    get, path = "/v1/data-planes", tag = "data-planes",
    responses((status = 200, description = "Every known data plane, by node id; `next` is always null", body = Page<DataPlaneView>)),
)]
async fn list_data_planes(State(admin): State<Shared>) -> Result<Json<Page<DataPlaneView>>, AdminError> {
    let mut records = admin.store.list_data_planes().await?;
    records.sort_by(|a, b| a.node_id.cmp(&b.node_id));
    let now = now_ms();
    let stale_ms = i64::try_from(admin.stale_after.as_millis()).unwrap_or(i64::MAX);
    let items = records
        .into_iter()
        .map(|record| {
            let stale = now.saturating_sub(record.last_seen) > stale_ms;
            DataPlaneView { record, stale }
        })
        .collect();
    Ok(Json(Page { items, next: None }))
}
