//! `/metrics`, Prometheus text for scrapers that hold no admin token (as the
//! probes): only the control plane's own state, nothing from the configuration.

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::Shared;
use crate::store::WatchMode;

pub fn routes() -> OpenApiRouter<Shared> {
    OpenApiRouter::new().routes(routes!(metrics))
}

#[utoipa::path(
    get, path = "/metrics", tag = "health",
    responses((status = 200, description = "Prometheus text exposition", body = String, content_type = "text/plain")),
)]
async fn metrics(State(admin): State<Shared>) -> Response {
    let watch = admin.store.watch_state();
    let mode = watch.mode();
    let mut text = String::from(
        "# HELP sluice_cp_config_watch_mode How this control plane learns of versions other control planes \
         commit (1 on the current mode): listen (PostgreSQL notifications) or poll.\n\
         # TYPE sluice_cp_config_watch_mode gauge\n",
    );
    for each in [WatchMode::Listen, WatchMode::Poll] {
        text.push_str(&format!(
            "sluice_cp_config_watch_mode{{mode=\"{}\"}} {}\n",
            each.as_str(),
            u8::from(each == mode)
        ));
    }
    text.push_str(&format!(
        "# HELP sluice_cp_config_watch_listens_total LISTEN connections opened (more than 1: reconnected after a loss).\n\
         # TYPE sluice_cp_config_watch_listens_total counter\n\
         sluice_cp_config_watch_listens_total {}\n\
         # HELP sluice_cp_config_version Newest configuration version this control plane knows of.\n\
         # TYPE sluice_cp_config_version gauge\n\
         sluice_cp_config_version {}\n",
        watch.listens(),
        *admin.store.subscribe().borrow(),
    ));
    ([(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"))], text).into_response()
}
