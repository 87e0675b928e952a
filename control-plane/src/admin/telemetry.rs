//! What the data planes report in their heartbeats beside their version, read-only: each target's health as
//! the data planes see it (`/v1/upstream-health`), each API's traffic over the last 15 minutes added up over the
//! data planes (`/v1/traffic`), and one data plane's own reports (`/v1/data-planes/{node_id}/telemetry`). Only
//! this control plane's data planes are included: the reports live in its memory (see `crate::telemetry`).

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::Shared;
use super::crud::Page;
use super::error::{AdminError, PROBLEM_JSON as PROBLEM, Problem};
use crate::store::now_ms;
use crate::telemetry::{NodeView, TargetState, TrafficView};

pub fn routes() -> OpenApiRouter<Shared> {
    OpenApiRouter::new().routes(routes!(upstream_health)).routes(routes!(traffic)).routes(routes!(data_plane_telemetry))
}

/// One target as the data planes see it.
#[derive(Debug, Serialize, ToSchema)]
pub struct TargetHealthView {
    pub upstream: String,
    /// The target's URL as configured, without a trailing slash.
    pub url: String,
    /// Data planes that report it healthy.
    pub healthy: u32,
    /// Data planes that report it ejected or failing its active check.
    pub unhealthy: u32,
    /// Each data plane's view, by node id.
    pub data_planes: Vec<DataPlaneTargetState>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DataPlaneTargetState {
    pub node_id: String,
    pub state: TargetState,
    /// Unix milliseconds of the heartbeat that said so.
    pub reported_at: i64,
}

#[utoipa::path(
    get, path = "/v1/upstream-health", tag = "data-planes",
    responses((status = 200,
        description = "Every target that a data plane connected to this control plane reports, by upstream and URL, \
            with each data plane's view; reports older than the stale interval are left out. `next` is always null",
        body = Page<TargetHealthView>)),
)]
async fn upstream_health(State(admin): State<Shared>) -> Json<Page<TargetHealthView>> {
    let fresh_after = now_ms() - i64::try_from(admin.stale_after.as_millis()).unwrap_or(i64::MAX);
    let mut targets: BTreeMap<(String, String), TargetHealthView> = BTreeMap::new();
    for (node_id, report) in admin.telemetry.health() {
        if report.reported_at < fresh_after {
            continue;
        }
        for target in report.targets {
            let view =
                targets.entry((target.upstream.clone(), target.url.clone())).or_insert_with(|| TargetHealthView {
                    upstream: target.upstream,
                    url: target.url,
                    healthy: 0,
                    unhealthy: 0,
                    data_planes: Vec::new(),
                });
            if target.state == TargetState::Healthy {
                view.healthy += 1;
            } else {
                view.unhealthy += 1;
            }
            view.data_planes.push(DataPlaneTargetState {
                node_id: node_id.clone(),
                state: target.state,
                reported_at: report.reported_at,
            });
        }
    }
    Json(Page { items: targets.into_values().collect(), next: None })
}

#[utoipa::path(
    get, path = "/v1/traffic", tag = "data-planes",
    responses((status = 200,
        description = "Requests, 5xx errors, requests per second, error rate and p99 latency per API and 10-second \
            slot over the last 15 minutes, added up over the data planes connected to this control plane",
        body = TrafficView)),
)]
async fn traffic(State(admin): State<Shared>) -> Json<TrafficView> {
    Json(admin.telemetry.traffic(now_ms()))
}

#[utoipa::path(
    get, path = "/v1/data-planes/{node_id}/telemetry", tag = "data-planes",
    params(("node_id" = String, Path, description = "The data plane's node id")),
    responses(
        (status = 200, description = "The data plane's latest health report and its traffic over the last 15 minutes",
            body = NodeView),
        (status = 404, description = "The data plane sent this control plane no heartbeat in the last 15 minutes",
            body = Problem, content_type = PROBLEM),
    ),
)]
async fn data_plane_telemetry(
    State(admin): State<Shared>,
    Path(node_id): Path<String>,
) -> Result<Json<NodeView>, AdminError> {
    admin
        .telemetry
        .node(&node_id, now_ms())
        .map(Json)
        .ok_or_else(|| AdminError::NotFound { what: format!("reports of data plane `{node_id}`") })
}
